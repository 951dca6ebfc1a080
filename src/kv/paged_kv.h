/* paged_kv.h — the storage behind the block pool: for every layer, K and V
 * of n_blocks blocks of block_size positions in one of the kv_types, plus
 * per-(position, head) scales for the 8-bit types.  One allocation, sized
 * at creation. */
#ifndef KVLLM_PAGED_KV_H
#define KVLLM_PAGED_KV_H

#include "backend/backend.h"
#include <stdint.h>

struct paged_kv {
    enum kv_type type;
    int n_layer, n_blocks, block_size, n_head_kv, head_dim;
    uint8_t *mem;                 /* the one allocation */
    struct kv_layer_view *layers; /* (n_layer) views into mem */
};

/* Bytes one token position takes over all layers, K and V, scales included. */
uint64_t paged_kv_bytes_per_token(enum kv_type type, int n_layer, int n_head_kv, int head_dim);
/* Name ("f16") and parse ("f16" -> KV_F16; -1 if unknown). */
const char *kv_type_name(enum kv_type t);
int kv_type_parse(const char *name);

/* Allocate (KVLLM_ENOMEM logged with the size; KVLLM_ERANGE on overflow). */
int paged_kv_init(struct paged_kv *c, enum kv_type type, int n_layer, int n_blocks, int block_size,
                  int n_head_kv, int head_dim);
void paged_kv_deinit(struct paged_kv *c);

/* Copy block src to dst in every layer (copy-on-write). */
void paged_kv_copy_block(struct paged_kv *c, int32_t dst, int32_t src);

#endif
