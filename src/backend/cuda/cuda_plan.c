/* cuda_plan.c — see cuda_plan.h.  Pure arithmetic: built into every build,
 * tested on the CPU. */
#include "backend/cuda/cuda_plan.h"
#include "backend/step_layout.h"
#include "core/core.h"

#include <string.h>

/* ---- CUDA graphs ---- */

int cuda_graph_sizes(int max_batch, int *out, int cap) {
    if (max_batch < 1) return KVLLM_EINVAL;
    int n = 0;
    for (long long s = 1; s < max_batch; s *= 2) {
        if (n == cap) return KVLLM_EINVAL;
        out[n++] = (int)s;
    }
    if (n == cap) return KVLLM_EINVAL;
    out[n++] = max_batch;
    return n;
}

int cuda_graph_batch(int n, int max_batch) {
    if (max_batch < 1 || n < 1 || n > max_batch) return KVLLM_EINVAL;
    int s = 1;
    while (s < n && s <= INT32_MAX / 2) s *= 2;
    return s >= n && s < max_batch ? s : max_batch;
}

/* ---- attention ---- */

int cuda_attn_splits(int ctx_len) {
    return ctx_len <= 0 ? 0 : (ctx_len - 1) / PAGED_ATTN_SPLIT + 1;
}

/* Spans up to PART * MAX_SPLITS take partitions of PART, ceil(span / PART) of them, growing
 * with the span; longer ones never more than MAX_SPLITS, which the span PART * MAX_SPLITS has. */
int cuda_attn_grid_splits(int ctx_hi) {
    if (ctx_hi <= 0) return 0;
    return ctx_hi >= CUDA_ATTN_PART * CUDA_ATTN_MAX_SPLITS ? CUDA_ATTN_MAX_SPLITS : cuda_attn_nsplit(ctx_hi);
}

int cuda_attn_slots(int max_ctx) {
    const int a = cuda_attn_splits(max_ctx), b = cuda_attn_grid_splits(max_ctx);
    return a > b ? a : b;
}

uint64_t cuda_attn_partial_floats(int max_tokens, int n_head, int head_dim, int max_ctx) {
    if (max_tokens <= 0 || n_head <= 0 || head_dim <= 0 || max_ctx <= 0) return 0;
    uint64_t r;
    if (!ckd_mul_u64(&r, (uint64_t)max_tokens, (uint64_t)n_head) ||
        !ckd_mul_u64(&r, r, (uint64_t)cuda_attn_slots(max_ctx)) || !ckd_mul_u64(&r, r, (uint64_t)head_dim + 2))
        return 0;
    return r;
}

size_t cuda_attn_smem_bytes(int g, int head_dim, int tile, int n_warps) {
    /* q (g, hd), acc (g, hd), m and l (g), K and V tiles (tile, hd + 1), scales (2, tile),
     * weights (n_warps, tile) */
    return sizeof(float) * ((size_t)2 * g * head_dim + (size_t)2 * g + (size_t)2 * tile * (head_dim + 1) +
                            (size_t)2 * tile + (size_t)n_warps * tile);
}

size_t cuda_attn_hd_smem_bytes(int g, int head_dim, int tile, int n_warps) {
    return cuda_attn_smem_bytes(g, head_dim, tile, n_warps) + sizeof(int64_t) * (size_t)tile;
}

/* ---- prefill ---- */

bool cuda_pf_takes(int n_tokens, int head_dim, bool act_q8) {
    return act_q8 && n_tokens >= CUDA_PF_MIN_TOKENS && cuda_attn_hd_kernel(head_dim);
}

size_t cuda_pf_smem_bytes(int head_dim) {
    if (!cuda_attn_hd_kernel(head_dim)) return 0;
    const size_t hd = (size_t)head_dim, bn = (size_t)CUDA_PF_KV_TILE(head_dim), rows = CUDA_PF_ROWS;
    const size_t qst = hd + CUDA_PF_PAD, vst = bn + CUDA_PF_PAD;
    return sizeof(int64_t) * bn + sizeof(int32_t) * bn                 /* tile rows, table reads */
           + sizeof(uint16_t) * (rows * qst + bn * qst + hd * vst)      /* Q, K, V transposed */
           + sizeof(float) * 2 * bn + sizeof(int32_t) * 3 * rows;       /* scales; row pos, lo, seq */
}

enum cuda_gemm cuda_gemm_pick(uint32_t wtype, uint32_t wflags, bool act_q8, bool q8, int n) {
    if (!act_q8 || (wflags & TENSOR_F_F32_ACT)) return CUDA_GEMM_NONE;
    if (wtype == DTYPE_F16) return n >= CUDA_GEMM_MIN_TOKENS ? CUDA_GEMM_F16 : CUDA_GEMM_NONE;
    if (wtype == DTYPE_BF16) return n >= CUDA_GEMM_MIN_TOKENS ? CUDA_GEMM_BF16 : CUDA_GEMM_NONE;
    return q8 && n >= CUDA_GEMM_MIN_TOKENS_Q ? CUDA_GEMM_DEQUANT_F16 : CUDA_GEMM_NONE;
}

int64_t cuda_gemm_slab_rows(int64_t K, size_t scratch_halfs) {
    if (K <= 0 || (uint64_t)K > scratch_halfs) return 0;
    return (int64_t)(scratch_halfs / (uint64_t)K);
}

/* ---- memory plan ---- */

int cuda_mem_plan(const struct cuda_mem_in *in, struct cuda_mem_plan *p) {
    memset(p, 0, sizeof *p);
    if (in->n_layer <= 0 || in->n_head <= 0 || in->n_head_kv <= 0 || in->n_head % in->n_head_kv ||
        in->head_dim <= 0 || in->n_embd <= 0 || in->n_ff < 0 || in->n_vocab <= 0 || in->block_size <= 0 ||
        in->max_tokens <= 0 || in->max_seqs <= 0 || in->max_ctx <= 0 || in->kv_tokens < 0 ||
        (unsigned)in->kv_type >= KV_TYPE_COUNT_ || in->mem_fraction < 0 || in->mem_fraction > 1)
        return KVLLM_EINVAL;
    const uint64_t hd = (uint64_t)in->head_dim, nkv = (uint64_t)in->n_head_kv, nl = (uint64_t)in->n_layer;
    const bool scaled = in->kv_type == KV_INT8 || in->kv_type == KV_FP8;
    /* per layer and position: K and V rows of every kv head, plus a float scale per row for 8-bit types */
    uint64_t per_tok = 2 * nkv * (hd * kv_elem_bytes(in->kv_type) + (scaled ? 4 : 0));
    if (!ckd_mul_u64(&per_tok, per_tok, nl)) return KVLLM_ERANGE;
    p->weights = in->weight_bytes;
    p->kv_bytes_per_token = per_tok;

    /* activations: the forward's per-token buffers (x, two norms' outputs, q and attention output,
     * k and v, gate and up), logits rows for every sequence, step inputs, attention partials */
    const uint64_t mt = (uint64_t)in->max_tokens, nh = (uint64_t)in->n_head;
    uint64_t cols = (uint64_t)in->n_embd > (uint64_t)in->n_ff ? (uint64_t)in->n_embd : (uint64_t)in->n_ff;
    if (nh * hd > cols) cols = nh * hd;
    /* + the 8-bit activations of the widest matmul input: a code and 1/32 of a float scale per value */
    const uint64_t per_act = 4 * (3 * (uint64_t)in->n_embd + 2 * nh * hd + 2 * nkv * hd + 2 * (uint64_t)in->n_ff) +
                             cols + cols / 8;
    const uint64_t parts = cuda_attn_partial_floats(in->max_tokens, in->n_head, in->head_dim, in->max_ctx);
    const uint64_t max_blocks = ((uint64_t)in->max_ctx + (uint64_t)in->block_size - 1) / (uint64_t)in->block_size;
    uint64_t act, t1, t2, t3;
    if (!ckd_mul_u64(&t1, mt, per_act) || !ckd_mul_u64(&t2, (uint64_t)in->max_seqs, 4 * (uint64_t)in->n_vocab) ||
        !ckd_mul_u64(&t3, parts, 4) || !ckd_add_u64(&act, t1, t2) || !ckd_add_u64(&act, act, t3))
        return KVLLM_ERANGE;
    struct step_layout sl;   /* the engine's staging, with a window pool's arrays: the most it takes */
    if (max_blocks > INT32_MAX || (uint64_t)in->max_seqs * max_blocks > INT32_MAX ||
        step_layout(in->max_tokens, in->max_seqs, in->max_seqs, (int)max_blocks, true, &sl) ||
        !ckd_add_u64(&act, act, (uint64_t)sl.bytes))
        return KVLLM_ERANGE;
    p->activations = act;

    int sizes[CUDA_GRAPH_MAX_SIZES];
    p->n_graphs = cuda_graph_sizes(in->max_seqs, sizes, CUDA_GRAPH_MAX_SIZES);
    if (p->n_graphs < 0) return KVLLM_ERANGE;
    const uint64_t each = in->graph_bytes_each ? in->graph_bytes_each : (uint64_t)8 << 20;
    if (!ckd_mul_u64(&p->graphs, (uint64_t)p->n_graphs, each)) return KVLLM_ERANGE;

    const double frac = in->mem_fraction > 0 ? in->mem_fraction : 0.90;
    p->budget = (uint64_t)((double)in->free_bytes * frac);
    uint64_t fixed;
    if (!ckd_add_u64(&fixed, p->weights, p->activations) || !ckd_add_u64(&fixed, fixed, p->graphs))
        return KVLLM_ERANGE;
    uint64_t block_bytes;
    if (!ckd_mul_u64(&block_bytes, per_tok, (uint64_t)in->block_size)) return KVLLM_ERANGE;
    if (in->kv_tokens > 0) {
        p->kv_blocks = ((uint64_t)in->kv_tokens + (uint64_t)in->block_size - 1) / (uint64_t)in->block_size;
    } else {
        p->kv_blocks = fixed < p->budget ? (p->budget - fixed) / block_bytes : 0;
    }
    if (!ckd_mul_u64(&p->kv_bytes, p->kv_blocks, block_bytes) || !ckd_add_u64(&p->total, fixed, p->kv_bytes))
        return KVLLM_ERANGE;
    p->fits = p->total <= p->budget && p->kv_blocks >= (uint64_t)in->max_seqs;
    return 0;
}
