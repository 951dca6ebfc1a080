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
#include <stddef.h>
#include <stdint.h>

/* Element types of KV storage (see docs: quantized on write, dequantized
 * inside attention). */
enum kv_type { KV_F32 = 0, KV_F16, KV_BF16, KV_INT8, KV_FP8, KV_TYPE_COUNT_ };

/* Bytes per stored element of type t (0 for an invalid type). */
static inline size_t kv_elem_bytes(enum kv_type t) {
    switch (t) {
    case KV_F32: return 4;
    case KV_F16: case KV_BF16: return 2;
    case KV_INT8: case KV_FP8: return 1;
    default: return 0;
    }
}

/* One layer of the paged KV storage: rows of head_dim elements, laid out
 * (block, kv head, offset in block) — see kv_row.  For KV_INT8 and KV_FP8
 * row r's scale is k_scale / v_scale[r] (value = code * scale; int8
 * symmetric, fp8 e4m3). */
struct kv_layer_view {
    enum kv_type type;
    int block_size, n_head_kv, head_dim;
    void *k, *v;                /* (n_blocks, n_head_kv, block_size, head_dim) of type */
    float *k_scale, *v_scale;   /* (n_blocks, n_head_kv, block_size) for INT8/FP8, else NULL */
};

/* The row of slot (block * block_size + offset) and kv head h.  Head-major
 * within a block: one head's positions in a block are a contiguous run
 * (block_size * head_dim elements), which attention streams through, and
 * the hardware prefetcher follows; position-major rows of all heads would
 * put n_head_kv - 1 other heads' rows between two of its reads. */
static inline size_t kv_row(const struct kv_layer_view *kv, size_t slot, int h) {
    const size_t bs = (size_t)kv->block_size;
    return (slot / bs * (size_t)kv->n_head_kv + (size_t)h) * bs + slot % bs;
}

/* Positions at which long contexts are split for parallel attention
 * (flash-decoding); split points need not fall on block boundaries and
 * depend only on the context length, never on the batch. */
#define PAGED_ATTN_SPLIT 1024

/* Causal attention of n tokens, each of its own sequence, over paged K/V. */
struct paged_attn_args {
    int n_tokens, n_head, n_head_kv, head_dim;
    const float *q;               /* (n_tokens, n_head * head_dim), RoPE applied */
    const int32_t *pos;           /* (n_tokens): token t attends positions 0 .. pos[t] of its sequence */
    const int32_t *const *tables; /* (n_tokens): block table of t's sequence (position p is in block tables[t][p / block_size]) */
    struct kv_layer_view kv;
    float scale;                  /* usually 1 / sqrt(head_dim) */
    int window;                   /* > 0: token t attends only positions > pos[t] - window (sliding window) */
    float *out;                   /* (n_tokens, n_head * head_dim) */
    float *partials;              /* scratch: paged_attn_scratch_floats() floats */
};

/* Scratch floats paged_attention needs for n_tokens tokens whose contexts
 * are at most max_ctx positions long. */
static inline uint64_t paged_attn_scratch_floats(int n_tokens, int n_head, int head_dim, int max_ctx) {
    uint64_t splits = ((uint64_t)max_ctx + PAGED_ATTN_SPLIT - 1) / PAGED_ATTN_SPLIT;
    return (uint64_t)n_tokens * (uint64_t)n_head * splits * ((uint64_t)head_dim + 2);
}

/* Rotary embedding settings (backend_ops.rope_ext). */
struct rope_params {
    int n_rot;                    /* rotated dims at the start of each head (even) */
    float theta;                  /* base: pair i turns by pos * freq_scale * theta^(-2i / n_rot) */
    float freq_scale;             /* linear position scaling; 0 is read as 1 */
    const float *freq_factors;    /* (n_rot / 2) or NULL: pair i's angle is divided by freq_factors[i] (Llama 3) */
    bool neox;                    /* false: adjacent pairs (x[2i], x[2i+1]) (GGUF llama);
                                     true: halves (x[i], x[i + n_rot/2]) (GGUF qwen2, "NEOX") */
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
    /* store n tokens' K and V rows (n, n_head_kv * head_dim) at slots
     * (block * block_size + offset; negative: skipped), converting to the
     * storage type */
    void (*kv_store)(struct backend *be, const struct kv_layer_view *kv, const int32_t *slots,
                     const float *k, const float *v, int n);
    void (*paged_attention)(struct backend *be, const struct paged_attn_args *a);
    /* g (n) = silu(g) * u */
    void (*swiglu)(struct backend *be, float *g, const float *u, long n);
    /* y (n) += x */
    void (*add)(struct backend *be, float *y, const float *x, long n);
    /* rope with the settings of p (rope is rope_ext with no factors, adjacent pairs), in place */
    void (*rope_ext)(struct backend *be, float *x, int n, int n_head, int head_dim, const int32_t *pos,
                     const struct rope_params *p);
    /* y (n, dim) = (x - mean(x)) / sqrt(var(x) + eps) * w + b, per row; b may be NULL */
    void (*layernorm)(struct backend *be, float *y, const float *x, const float *w, const float *b, int n, int dim,
                      float eps);
    /* y (n, dim) += b (dim), per row */
    void (*add_bias)(struct backend *be, float *y, const float *b, int n, int dim);
    /* x (n) = gelu(x), tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    void (*gelu)(struct backend *be, float *x, long n);
};

struct backend {
    const struct backend_ops *ops;
    struct threadpool *pool;
    float *scratch;       /* per-thread row buffers: n_threads * scratch_cols floats */
    int64_t scratch_cols;
    enum act_mode { ACT_F32 = 0, ACT_INT } act;   /* see backend_cpu_new */
    void *act_buf;        /* integer activations, grown on demand */
    size_t act_buf_bytes;
};

/* Create the CPU backend.  kind: NULL or "" picks the best the CPU offers;
 * otherwise "scalar" or "avx2".  Fails with KVLLM_ECPU (logged) for a kind
 * this build or CPU lacks.  max_cols: longest weight row.
 *
 * Activations (SIMD sets): f32 arithmetic on dequantized weights by
 * default.  KVLLM_ACT=int multiplies Q8_0 / Q4_0 / Q4_1 weights with
 * activations quantized to 13-bit integer codes per block of 32 (integer
 * dot products: single-stream decode of large Q4 models about 1.6x faster,
 * prefill and batched steps about 0.5-0.7x; docs/PERF.md).  The choice is
 * per process, never per batch, so results stay batch-invariant. */
int backend_cpu_new(const char *kind, int n_threads, int64_t max_cols, struct backend **out);
void backend_free(struct backend *be);

#endif
