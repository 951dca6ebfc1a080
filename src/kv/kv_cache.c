#include "kv/kv_cache.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

bool kv_cache_bytes(int n_layer, int n_ctx, int kv_dim, uint64_t *bytes) {
    uint64_t b;
    return ckd_mul_u64(&b, (uint64_t)n_layer, (uint64_t)n_ctx) && ckd_mul_u64(&b, b, (uint64_t)kv_dim) &&
           ckd_mul_u64(&b, b, 2 * sizeof(float)) && (*bytes = b, true);
}

int kv_cache_init(struct kv_cache *c, int n_layer, int n_ctx, int kv_dim) {
    memset(c, 0, sizeof *c);
    uint64_t bytes;
    if (!kv_cache_bytes(n_layer, n_ctx, kv_dim, &bytes) || bytes / 2 > SIZE_MAX) return KVLLM_ERANGE;
    c->k = malloc((size_t)(bytes / 2));
    c->v = malloc((size_t)(bytes / 2));
    if (!c->k || !c->v) {
        LOG_ERR("cannot allocate the KV cache (%llu bytes)", (unsigned long long)bytes);
        kv_cache_deinit(c);
        return KVLLM_ENOMEM;
    }
    c->n_layer = n_layer;
    c->n_ctx = n_ctx;
    c->kv_dim = kv_dim;
    return 0;
}

void kv_cache_deinit(struct kv_cache *c) {
    if (!c) return;
    free(c->k);
    free(c->v);
    memset(c, 0, sizeof *c);
}
