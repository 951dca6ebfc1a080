/* cuda_plan.h — the CUDA backend's host-side arithmetic, in plain C so that
 * the CPU-only build compiles it and tests/unit/test_cuda_plan.c checks it
 * without a GPU: the batch sizes decode steps are padded to (one CUDA graph
 * each; the step's inputs are packed as backend/step_layout.h says), the attention
 * split plan and its scratch, and the device memory plan.
 *
 * Nothing here allocates or touches a device; every function is pure.  Sizes
 * are checked for overflow: a plan that does not fit in 64 bits, or a
 * request outside the documented ranges, is KVLLM_ERANGE / KVLLM_EINVAL. */
#ifndef KVLLM_CUDA_PLAN_H
#define KVLLM_CUDA_PLAN_H

#include "backend/backend.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- CUDA graphs: padded decode batch sizes ---- */

/* The captured batch sizes are 1, 2, 4, 8, ... (powers of two) below
 * max_batch, then max_batch itself.  A step of n sequences runs the
 * smallest captured size >= n, its extra rows as padding (slot -1, logits
 * never read).  cuda_graph_sizes writes them ascending into out (capacity
 * cap) and returns how many, or KVLLM_EINVAL for max_batch < 1 or a
 * capacity too small (at most CUDA_GRAPH_MAX_SIZES are ever needed). */
#define CUDA_GRAPH_MAX_SIZES 32
int cuda_graph_sizes(int max_batch, int *out, int cap);
/* The padded size for n (1 <= n <= max_batch); KVLLM_EINVAL otherwise. */
int cuda_graph_batch(int n, int max_batch);

/* ---- paged attention: splits and scratch ---- */

/* Two kernels (attention.cu).  The generic one (any head_dim) cuts a
 * context at multiples of PAGED_ATTN_SPLIT, as the CPU backend does:
 * cuda_attn_splits(ctx_len) splits, 0 for ctx_len <= 0.
 *
 * The head-size kernels (head_dim 64, 128, 256: cuda_attn_hd_kernel) cut
 * the span of positions a token attends (span = its context, or its window)
 * into partitions of cuda_attn_part(span) positions from the span's start:
 * CUDA_ATTN_PART, widened by whole multiples of it for spans past
 * CUDA_ATTN_PART * CUDA_ATTN_MAX_SPLITS so that a token never has more than
 * CUDA_ATTN_MAX_SPLITS partials.  A token's partitions depend on its own
 * span alone, never on the batch (batch invariance); the launch sizes its
 * grid for the longest span it may meet (cuda_attn_grid_splits), and the
 * blocks past a token's own cuda_attn_nsplit(span) return at once.  The
 * same inline functions run on the host and on the device. */
#define CUDA_ATTN_PART 256
#define CUDA_ATTN_MAX_SPLITS 128
#ifdef __CUDACC__
#define CUDA_PLAN_HD __host__ __device__
#else
#define CUDA_PLAN_HD
#endif
/* Positions per partition of a span (span >= 1). */
static inline CUDA_PLAN_HD int cuda_attn_part(int span) {
    return CUDA_ATTN_PART * ((span - 1) / (CUDA_ATTN_PART * CUDA_ATTN_MAX_SPLITS) + 1);
}
/* Partitions of a span (span >= 1): 1 .. CUDA_ATTN_MAX_SPLITS. */
static inline CUDA_PLAN_HD int cuda_attn_nsplit(int span) { return (span - 1) / cuda_attn_part(span) + 1; }
/* Whether the head-size kernels take head_dim. */
static inline CUDA_PLAN_HD bool cuda_attn_hd_kernel(int head_dim) {
    return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

/* The head-size kernels' walk over a partition's KV blocks.  Warp 0's lane
 * j follows position c + j of each tile of `tile` positions (c = p0, p0 +
 * tile, ...) as (blk, off): KV block blk of the sequence, offset off in it,
 * found by one division at the start and advanced by constants after; the
 * lane that begins a KV block, or lane 0, reads the block table (reads),
 * and lane j takes the id read by lane src (the shuffle's source). */
struct cuda_attn_walk { int blk, off; };
static inline CUDA_PLAN_HD struct cuda_attn_walk cuda_attn_walk_start(int p0, int lane, int bs) {
    struct cuda_attn_walk w = { (p0 + lane) / bs, (p0 + lane) % bs };
    return w;
}
static inline CUDA_PLAN_HD void cuda_attn_walk_next(struct cuda_attn_walk *w, int tile, int bs) {
    w->blk += tile / bs;   /* constants of the kernel: the compiler hoists them */
    w->off += tile % bs;
    if (w->off >= bs) {    /* off + tile % bs < 2 bs: one carry at most */
        w->off -= bs;
        w->blk++;
    }
}
static inline CUDA_PLAN_HD bool cuda_attn_walk_reads(struct cuda_attn_walk w, int lane) {
    return lane == 0 || w.off == 0;
}
/* The lane whose table read lane j takes: the one at its KV block's first position, or lane 0 when
 * that block began before the tile. */
static inline CUDA_PLAN_HD int cuda_attn_walk_src(struct cuda_attn_walk w, int lane) {
    return lane > w.off ? lane - w.off : 0;
}

int cuda_attn_splits(int ctx_len);
/* The head-size kernels' grid: the most partitions of any span of 1 ..
 * ctx_hi positions; 0 for ctx_hi <= 0. */
int cuda_attn_grid_splits(int ctx_hi);
/* Partial slots per (token, head) that both kernels fit in for contexts up
 * to max_ctx: the larger of cuda_attn_splits and cuda_attn_grid_splits. */
int cuda_attn_slots(int max_ctx);
/* Floats of the partials (m, l, acc[head_dim]) for max_tokens tokens of
 * n_head heads over contexts up to max_ctx: (max_tokens, n_head,
 * cuda_attn_slots(max_ctx), head_dim + 2).  0 on overflow or a
 * non-positive argument. */
uint64_t cuda_attn_partial_floats(int max_tokens, int n_head, int head_dim, int max_ctx);
/* Shared memory (bytes) of one attention block: g = n_head / n_head_kv query
 * heads of head_dim (queries and accumulators), a tile of tile K and V rows
 * (rows padded by one float), per-position scales and per-warp weights. */
size_t cuda_attn_smem_bytes(int g, int head_dim, int tile, int n_warps);
/* The head-size kernels': the same plus the tile's row indices (tile int64). */
size_t cuda_attn_hd_smem_bytes(int g, int head_dim, int tile, int n_warps);

/* ---- prefill: tensor-core attention and cuBLAS GEMMs (which steps take them) ----
 *
 * Both are the backend's fast mode, 8-bit activations (act_q8, its default); with KVLLM_ACT=f32 it
 * keeps f32 arithmetic and the same kernels for every step size (batch-invariant, docs/GPU.md).
 *
 * Paged attention of a step with at least CUDA_PF_MIN_TOKENS query tokens, head_dim 64 / 128 / 256,
 * takes attention_prefill.cu's kernel: CUDA_PF_ROWS query rows (token, query head of the kv head)
 * per block, K/V tiles of CUDA_PF_KV_TILE(head_dim) positions aligned to multiples of it, scores and
 * P·V on tensor cores (16-bit inputs, f32 accumulation).  Below it, the decode kernels of
 * attention.cu.  A row's arithmetic in either kernel depends on its own inputs alone; which kernel
 * runs depends on the step's token count, so on CUDA a token computed in a step of >= 16 tokens
 * differs by rounding from the same token computed in a smaller step (docs/GPU.md). */
#define CUDA_PF_MIN_TOKENS 16
#define CUDA_PF_ROWS 64
#define CUDA_PF_WARPS 4
#define CUDA_PF_PAD 8                 /* 16-bit values added to each shared-memory row: no bank conflicts */
#define CUDA_PF_KV_TILE(hd) ((hd) == 256 ? 32 : 64)   /* 256: fewer score registers next to 128 of output */
/* Whether a step of n_tokens with head_dim takes the prefill kernel (storage alignment aside). */
bool cuda_pf_takes(int n_tokens, int head_dim, bool act_q8);
/* Shared memory (bytes) of one prefill block: tile row indices, table reads, Q (CUDA_PF_ROWS rows),
 * K (tile rows), V transposed (head_dim rows of tile positions), all 16-bit with CUDA_PF_PAD more
 * per row, per-position scales and per-row position, window start and sequence. */
size_t cuda_pf_smem_bytes(int head_dim);

/* Matmul of n tokens by cuBLAS (cublasGemmEx, f32 accumulation) rather than the mat-vec kernels:
 * only with 8-bit activations (the backend's default; KVLLM_ACT=f32 keeps f32 arithmetic
 * everywhere), never for a matrix the model keeps on f32 activations (TENSOR_F_F32_ACT), and
 *   - F16 / BF16 weights at n >= CUDA_GEMM_MIN_TOKENS: the activations rounded to the weight's type;
 *   - the quantized types the 8-bit path takes (q8 true) at n >= CUDA_GEMM_MIN_TOKENS_Q: each slab
 *     of rows dequantized into an f16 scratch, activations rounded to f16 (finer than 8-bit codes);
 *   - nothing else (F32 weights, the types kept on f32 activations).
 * The GEMM changes a row's rounding against the mat-vec path, so, as for attention, a token's
 * result depends on whether its step reaches the threshold (docs/GPU.md). */
#define CUDA_GEMM_MIN_TOKENS 32
#define CUDA_GEMM_MIN_TOKENS_Q 64
#define CUDA_GEMM_SCRATCH_HALFS ((size_t)16 << 20)   /* dequantized weights: 32 MiB a context */
enum cuda_gemm { CUDA_GEMM_NONE = 0, CUDA_GEMM_F16, CUDA_GEMM_BF16, CUDA_GEMM_DEQUANT_F16 };
enum cuda_gemm cuda_gemm_pick(uint32_t wtype, uint32_t wflags, bool act_q8, bool q8, int n);
/* Rows of a K-long weight that one dequantized slab of scratch_halfs holds (>= 1; 0 for K <= 0 or
 * K > scratch_halfs). */
int64_t cuda_gemm_slab_rows(int64_t K, size_t scratch_halfs);

/* ---- device memory plan ---- */

struct cuda_mem_in {
    uint64_t weight_bytes;        /* placed weights (place_weights' total) */
    uint64_t free_bytes;          /* cudaMemGetInfo's free, before any of it */
    double mem_fraction;          /* of free_bytes kvllm may take (0: 0.90) */
    int n_layer, n_head, n_head_kv, head_dim, n_embd, n_ff, n_vocab;
    enum kv_type kv_type;
    int block_size;
    int max_tokens;               /* tokens per step */
    int max_seqs;                 /* sequences per step (CUDA graph sizes up to it) */
    int max_ctx;
    int64_t kv_tokens;            /* KV pool positions wanted; 0: as many as fit */
    uint64_t graph_bytes_each;    /* memory per captured graph (0: 8 MiB) */
};

struct cuda_mem_plan {
    uint64_t weights;
    uint64_t kv_bytes_per_token;  /* all layers, K and V, scales included */
    uint64_t kv_blocks, kv_bytes; /* the pool */
    uint64_t activations;         /* forward buffers, logits, attention partials */
    uint64_t graphs;              /* CUDA graph pools: sizes * graph_bytes_each */
    int n_graphs;
    uint64_t total;               /* weights + kv + activations + graphs */
    uint64_t budget;              /* free_bytes * mem_fraction */
    bool fits;                    /* total <= budget and at least one block per sequence fits */
};
/* Fill *p.  KVLLM_EINVAL for a shape that makes no sense (non-positive
 * counts, n_head not a multiple of n_head_kv, a bad KV type), KVLLM_ERANGE
 * on overflow.  With kv_tokens = 0 the pool takes what the budget leaves
 * (fits is false when that is not one block per sequence); otherwise
 * kv_tokens rounded up to whole blocks, and fits says whether it all fits. */
int cuda_mem_plan(const struct cuda_mem_in *in, struct cuda_mem_plan *p);

#endif
