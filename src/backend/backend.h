/* backend.h — the kernels the model is computed with, as a struct of
 * function pointers chosen once at start-up (scalar reference now; SIMD and
 * CUDA backends plug in here without touching model code).
 *
 * Batch invariance: every kernel computes a row's result with arithmetic
 * that depends on that row alone (same reduction order for 1 token or 512),
 * so a sequence's output never depends on what else shares the batch. */
#ifndef KVLLM_BACKEND_H
#define KVLLM_BACKEND_H

#include "core/threadpool.h"
#include "tensor/tensor.h"
#include <stdbool.h>
#include <stdint.h>

/* Causal attention of n tokens over a dense K/V cache of one layer. */
struct attn_args {
    int n_tokens, n_head, n_head_kv, head_dim;
    const float *q;       /* (n_tokens, n_head * head_dim) */
    const float *k, *v;   /* (n_ctx, n_head_kv * head_dim): positions 0 .. max(pos) filled */
    const int32_t *pos;   /* (n_tokens): token i attends cache positions 0 .. pos[i] */
    float scale;          /* usually 1 / sqrt(head_dim) */
    float *out;           /* (n_tokens, n_head * head_dim) */
};

struct backend;

struct backend_ops {
    const char *name;
    /* y (n, w->ne1) = x (n, w->ne0) · wᵀ */
    void (*matmul)(struct backend *be, float *y, const struct tensor *w, const float *x, int n);
    /* y (n, w->ne0) = rows ids of w, as f32 */
    void (*get_rows)(struct backend *be, float *y, const struct tensor *w, const int32_t *ids, int n);
    /* y (n, dim) = x / rms(x) * w, per row */
    void (*rmsnorm)(struct backend *be, float *y, const float *x, const float *w, int n, int dim, float eps);
    /* rotate adjacent pairs (GGUF llama layout) of the first n_rot dims of each head, in place */
    void (*rope)(struct backend *be, float *x, int n, int n_head, int head_dim, int n_rot,
                 const int32_t *pos, float theta);
    void (*attention)(struct backend *be, const struct attn_args *a);
    /* g (n) = silu(g) * u */
    void (*swiglu)(struct backend *be, float *g, const float *u, long n);
    /* y (n) += x */
    void (*add)(struct backend *be, float *y, const float *x, long n);
};

struct backend {
    const struct backend_ops *ops;
    struct threadpool *pool;
    float *scratch;       /* per-thread row buffers: n_threads * scratch_cols floats */
    int64_t scratch_cols;
};

/* Create the CPU backend.  kind: NULL or "" picks the best the CPU offers;
 * otherwise "scalar" (the only one so far).  Fails with KVLLM_ECPU (logged)
 * for a kind this build or CPU lacks.  max_cols: longest weight row. */
int backend_cpu_new(const char *kind, int n_threads, int64_t max_cols, struct backend **out);
void backend_free(struct backend *be);

#endif
