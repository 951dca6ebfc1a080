/* kv_cache.h — K and V of every layer for the positions of one sequence,
 * f32, one allocation sized at creation (dense for now; the paged block
 * pool replaces the layout, not the idea).  Position p of layer il lives at
 * row p of kv_cache_k(c, il) / kv_cache_v(c, il). */
#ifndef KVLLM_KV_CACHE_H
#define KVLLM_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kv_cache {
    int n_layer, n_ctx, kv_dim;   /* kv_dim = n_head_kv * head_dim */
    float *k, *v;                 /* (n_layer, n_ctx, kv_dim) each */
};

/* Bytes kv_cache_init would allocate; false on overflow. */
bool kv_cache_bytes(int n_layer, int n_ctx, int kv_dim, uint64_t *bytes);
/* Allocates; KVLLM_ENOMEM (logged, with the size) on failure. */
int kv_cache_init(struct kv_cache *c, int n_layer, int n_ctx, int kv_dim);
void kv_cache_deinit(struct kv_cache *c);

static inline float *kv_cache_k(const struct kv_cache *c, int il) {
    return c->k + (size_t)il * c->n_ctx * c->kv_dim;
}
static inline float *kv_cache_v(const struct kv_cache *c, int il) {
    return c->v + (size_t)il * c->n_ctx * c->kv_dim;
}

#endif
