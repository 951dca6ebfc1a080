/* paged_kv.h — the storage behind the block pool: for every layer, K and V
 * of n_blocks blocks of block_size positions in one of the kv_types, plus
 * per-(position, head) scales for the 8-bit types.  One backend buffer
 * (host RAM for the CPU, device memory for a GPU), sized at creation; the
 * views point into it and only ops read or write through them
 * (copy-on-write is the backend's copy_blocks op). */
#ifndef KVLLM_PAGED_KV_H
#define KVLLM_PAGED_KV_H

#include "backend/backend.h"
#include <stdint.h>

struct paged_kv {
    enum kv_type type;
    int n_layer, n_blocks, block_size, n_head_kv, head_dim;
    struct backend *be;
    struct backend_buf mem;       /* the one allocation (backend memory) */
    struct kv_layer_view *layers; /* (n_layer) views into mem (host structs) */
};

/* Bytes one token position takes over all layers, K and V, scales included. */
uint64_t paged_kv_bytes_per_token(enum kv_type type, int n_layer, int n_head_kv, int head_dim);
/* Name ("f16") and parse ("f16" -> KV_F16; -1 if unknown). */
const char *kv_type_name(enum kv_type t);
int kv_type_parse(const char *name);

/* Bytes paged_kv_init allocates from the backend for this shape (0 when it
 * overflows). */
uint64_t paged_kv_bytes(enum kv_type type, int n_layer, int n_blocks, int block_size, int n_head_kv, int head_dim);

/* Allocate from be (KVLLM_ENOMEM logged with the size; KVLLM_ERANGE on overflow). */
int paged_kv_init(struct paged_kv *c, struct backend *be, enum kv_type type, int n_layer, int n_blocks,
                  int block_size, int n_head_kv, int head_dim);
void paged_kv_deinit(struct paged_kv *c);

#endif
