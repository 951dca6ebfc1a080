/* be_util.h — backend set-up shared by the backend unit tests: a CPU
 * backend of a kernel set with one execution context sized for the test's
 * largest op, and random weights of any type. */
#ifndef KVLLM_BE_UTIL_H
#define KVLLM_BE_UTIL_H
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "core/core.h"
#include "tensor/dtype.h"
#include <stdlib.h>

/* Zeroed memory the test cannot run without: aborts (KV_ASSERT) when it runs out. */
static inline void *tu_xnew(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    KV_ASSERT(p);
    return p;
}

/* A context of kernel set kind (strict: behind the wall) with activation
 * arithmetic act on a backend of its own (backend_of() finds it; tb_free
 * frees both); NULL on failure. */
static inline struct backend_ctx *tb_new(const char *kind, bool strict, enum backend_act act, int n_threads,
                                         int64_t max_cols, int max_tokens, int max_ctx, int n_head, int head_dim) {
    struct backend *be = NULL;
    if (backend_cpu_new(kind, strict, act, &be)) return NULL;
    struct backend_ctx_params p = { .n_threads = n_threads, .max_tokens = max_tokens, .max_ctx = max_ctx,
                                    .n_head = n_head, .head_dim = head_dim, .max_cols = max_cols };
    struct backend_ctx *c = NULL;
    if (backend_ctx_new(be, &p, &c)) { backend_free(be); return NULL; }
    return c;
}

static inline void tb_free(struct backend_ctx *c) {
    if (!c) return;
    struct backend *be = c->be;
    backend_ctx_free(c);
    backend_free(be);
}

/* A random (M, K) weight of type in rows, owned by the caller (free t.data):
 * values uniform in [-1, 1) from r; varied: each row scaled by 0.01 + r % 5
 * and offset by (r % 3) * 0.3, every 97th value 4x, so block scales and the
 * K-quants' mins differ from row to row. */
static inline struct tensor tb_weight(struct rng *r, uint32_t type, int64_t K, int64_t M, bool varied) {
    uint64_t rb = 0;
    KV_ASSERT(dtype_row_bytes(type, (uint64_t)K, &rb));
    float *row = malloc((size_t)K * sizeof *row);
    uint8_t *data = malloc((size_t)rb * (size_t)M);
    KV_ASSERT(row && data);
    for (int64_t i = 0; i < M; i++) {
        const float scale = varied ? 0.01f + (float)(i % 5) : 1.0f, off = varied ? (float)(i % 3) * 0.3f : 0.0f;
        for (int64_t k = 0; k < K; k++)
            row[k] = (rng_f32(r) * 2.0f - 1.0f) * (varied ? scale * (k % 97 == 0 ? 4.0f : 1.0f) : 1.0f) + off;
        dtype_from_f32(type, row, data + (size_t)i * rb, K);
    }
    free(row);
    return (struct tensor){ .type = type, .ne0 = K, .ne1 = M, .row_bytes = (size_t)rb, .data = data };
}
#endif
