/* be_util.h — backend set-up shared by the backend unit tests: a CPU
 * backend of a kernel set with one execution context sized for the test's
 * largest op. */
#ifndef KVLLM_BE_UTIL_H
#define KVLLM_BE_UTIL_H
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "core/core.h"

/* A context of kernel set kind (strict: behind the wall) on a backend of its
 * own (backend_of() finds it; tb_free frees both); NULL on failure. */
static inline struct backend_ctx *tb_new(const char *kind, bool strict, int n_threads, int64_t max_cols,
                                         int max_tokens, int max_ctx, int n_head, int head_dim) {
    struct backend *be = NULL;
    if (backend_cpu_new(kind, strict, &be)) return NULL;
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
#endif
