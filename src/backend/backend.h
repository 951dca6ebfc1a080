/* backend.h — the compute layer under the model: where weights, KV storage
 * and activations live, and the ops that compute with them.
 *
 * Model of the world (the shape of ggml-backend, kept small):
 *   struct backend      a device and its kernel set.  Created once per model,
 *                       immutable afterwards: any number of engines on any
 *                       threads share it.  It places the weights (keeps the
 *                       file mapping, repacks, or uploads) and allocates
 *                       buffers of its own memory.  Which backend, device,
 *                       kernel set and activation arithmetic: struct
 *                       backend_params, filled by the caller (the model's
 *                       kvllm_model_params); the library reads no
 *                       environment variable to choose.
 *   struct backend_buf  memory owned by the backend (host RAM for the CPU,
 *                       device memory for a GPU).  Host code holds the
 *                       pointers into it and passes them to ops, uploads and
 *                       downloads, but never reads or writes through them:
 *                       the strict backend (BACKEND_STRICT) makes every
 *                       such access outside an op crash.
 *   struct backend_ctx  an execution context, i.e. a stream: per-engine
 *                       mutable state (thread pool, scratch sized at
 *                       creation for the largest step).  Ops are issued in
 *                       order on a context; each returns 0 or a KVLLM_E*
 *                       code, and the first failure is also kept as the
 *                       context's status until backend_sync reads it.  One
 *                       thread uses a context at a time.
 *
 * Batch invariance: every kernel computes a row's result with arithmetic
 * that depends on that row alone (same reduction order for 1 token or 512,
 * no reduction split across threads), so a sequence's output never depends
 * on what else shares the batch or on the thread count.  Exception: the CUDA
 * backend's fast mode (its default, 8-bit activations) runs steps of >= 16
 * tokens on tensor cores (prefill attention, cuBLAS matmuls), whose rounding
 * differs from its small-step kernels; its exact mode (KVLLM_ACT=f32) keeps
 * the rule (docs/GPU.md, "Batch invariance on CUDA").
 *
 * Adding a backend: fill a struct backend_ops (every member is required
 * unless marked optional; supports_op answers for the optional ones),
 * return a struct backend from a constructor that backend_new calls, and
 * run the per-op harness (tests/unit/test_backend_ops.c) against the
 * scalar reference. */
#ifndef KVLLM_BACKEND_H
#define KVLLM_BACKEND_H

#include "sample/chain.h"
#include "tensor/tensor.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Element types of KV storage (quantized on write, dequantized inside
 * attention). */
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

/* One layer of the paged KV storage (backend memory): rows of head_dim
 * elements, laid out (block, kv head, offset in block) — see kv_row.  For
 * KV_INT8 and KV_FP8 row r's scale is k_scale / v_scale[r] (value = code *
 * scale; int8 symmetric, fp8 e4m3). */
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

/* One block of one layer: its (kv head, offset) rows, and the bytes of K
 * (or V) data they take; scales, for the 8-bit types, are one float a row.
 * Copy-on-write moves exactly these (copy_blocks). */
static inline size_t kv_block_rows(const struct kv_layer_view *kv) {
    return (size_t)kv->block_size * (size_t)kv->n_head_kv;
}
static inline size_t kv_block_bytes(const struct kv_layer_view *kv) {
    return kv_block_rows(kv) * (size_t)kv->head_dim * kv_elem_bytes(kv->type);
}

/* Positions at which long contexts are split for parallel attention
 * (flash-decoding); split points need not fall on block boundaries and
 * depend only on the context length (and a sliding window, whose positions
 * are split more finely), never on the batch. */
#define PAGED_ATTN_SPLIT 1024

/* Causal attention of n tokens from any number of sequences over paged K/V.
 * Every pointer is backend memory. */
struct paged_attn_args {
    int n_tokens, n_head, n_head_kv, head_dim;
    const float *q;               /* (n_tokens, n_head * head_dim), RoPE applied */
    const int32_t *pos;           /* (n_tokens): token t attends positions 0 .. pos[t] of its sequence */
    const int32_t *seq;           /* (n_tokens): row of t's sequence in block_table */
    const int32_t *block_table;   /* (n_seqs, max_blocks) dense: position p of the sequence in row r is in
                                     block block_table[r * max_blocks + p / block_size] */
    int max_blocks;
    struct kv_layer_view kv;
    float scale;                  /* usually 1 / sqrt(head_dim) */
    float softcap;                /* > 0: a score s (scaled) becomes softcap * tanh(s / softcap) (Gemma 2) */
    int window;                   /* > 0: token t attends only positions > pos[t] - window (sliding window) */
    const float *sinks;           /* (n_head) or NULL: head h's learned logit sinks[h] joins its softmax's
                                     denominator, weighing no value (gpt-oss's attention sinks); not scaled
                                     nor soft-capped */
    float *out;                   /* (n_tokens, n_head * head_dim) */
    int ctx_hi;                   /* host: 1 + the largest pos[t], when the caller knows it: a backend may size
                                     its work for it (a GPU's grid) rather than for the longest context it
                                     allows; <= 0: unknown.  Never changes a token's arithmetic. */
};

/* The experts of a mixture-of-experts FFN (backend_ops.moe): for each token
 * t and each of its n_used experts e = ids[t, j] (in ascending e),
 *   g = gate_e · x[t] (+ gate_b[e]),  u = up_e · x[t] (+ up_b[e])
 *   out[t] += weights[t, j] * (down_e · glu(g, u) (+ down_b[e]))
 * with out zeroed first.  A backend groups the tokens by expert, so each
 * expert's weights are read once per call, and a token's result depends
 * on its own row alone (batch invariance). */
enum glu_kind {
    GLU_SILU,         /* silu(g) * u (SwiGLU) */
    GLU_GELU,         /* gelu(g) * u, tanh form (GeGLU) */
    GLU_SWIGLU_OAI,   /* g' sigmoid(GLU_OAI_ALPHA g') (u' + 1), g' = min(g, GLU_OAI_LIMIT), u' = u clamped to
                         +-GLU_OAI_LIMIT (gpt-oss; ggml's swiglu_oai) */
};
#define GLU_OAI_ALPHA 1.702f
#define GLU_OAI_LIMIT 7.0f

struct moe_args {
    int n_tokens, n_used, n_expert, n_embd, n_ff;   /* n_ff: one expert's hidden width */
    const float *x;               /* (n_tokens, n_embd) */
    const int32_t *ids;           /* (n_tokens, n_used) experts, each in [0, n_expert) */
    const float *weights;         /* (n_tokens, n_used) */
    const struct tensor *gate, *up, *down;   /* (n_expert) each: gate, up (n_ff, n_embd); down (n_embd, n_ff) */
    const struct tensor *gate_b, *up_b, *down_b;   /* NULL, or f32 (n_expert, n_ff | n_ff | n_embd): row e is
                                                      expert e's bias (gpt-oss) */
    enum glu_kind act;
    float *xs, *ys;               /* scratch (n_tokens, n_embd) each: a group's gathered rows and results */
    float *g, *u;                 /* scratch (n_tokens, n_ff) each */
    float *out;                   /* (n_tokens, n_embd); must not alias x or the scratch */
};

/* Rows of logits sampled in the backend (backend_ops.sample).  rows[i] is
 * row i's struct sample_chain, its u drawn on the host from the request's
 * seeded RNG where the host sampler would draw it, uploaded with the step's
 * inputs.  A GPU sums weights in another order than the CPU (in a tree,
 * not one by one), so a draw within about 1e-6 of a CDF boundary, or a
 * top-p / min-p cut as close to its threshold, may pick a neighbour of the
 * CPU's token; the per-op harness allows exactly that on a device. */
struct sample_args {
    int n, dim;
    const float *logits;          /* (n, dim) */
    const struct sample_chain *rows;   /* (n) */
    int32_t *ids;                 /* (n) */
    void *scratch;                /* SAMPLE_CHAIN_SCRATCH(dim) bytes, the rows taken one at a time (the CPU's
                                     candidates); a backend may leave it unused */
};

/* Rotary embedding settings (backend_ops.rope). */
struct rope_params {
    int n_rot;                    /* rotated dims at the start of each head (even) */
    float theta;                  /* base: pair i turns by pos * freq_scale * theta^(-2i / n_rot) */
    float freq_scale;             /* linear position scaling; 0 is read as 1 */
    const struct tensor *freq_factors;  /* (n_rot / 2) f32 or NULL: pair i's angle is divided by
                                           freq_factors[i] (Llama 3) */
    bool neox;                    /* false: adjacent pairs (x[2i], x[2i+1]) (GGUF llama);
                                     true: halves (x[i], x[i + n_rot/2]) (GGUF qwen2, "NEOX") */
    float attn_factor;            /* cos and sin are multiplied by this (LongRoPE's and YaRN's magnitude
                                     scaling); 0 is read as 1.  kv_shift takes only settings where it is 1
                                     (a shift would scale a cached row twice) */
    bool yarn;                    /* YaRN: pair i's angle is scaled by freq_scale * (1 - mix) + mix instead of
                                     freq_scale, mix = 1 - clamp((i - yarn_lo) / max(yarn_hi - yarn_lo,
                                     0.001), 0, 1): fast pairs keep their frequency, slow ones are
                                     interpolated (ggml's rope_yarn with ext_factor 1) */
    float yarn_lo, yarn_hi;       /* the ramp's ends, in pairs */
};

/* The factor pair i's angle pos * theta^(-2i / n_rot) is multiplied by, before
 * frequency factors: linear scaling, mixed by YaRN's ramp (struct rope_params). */
#ifdef __CUDACC__
#define ROPE_HD_ __host__ __device__   /* the CUDA kernels compute it the same way */
#else
#define ROPE_HD_
#endif
static inline ROPE_HD_ double rope_pair_scale(const struct rope_params *p, int i) {
    const double fs = p->freq_scale != 0 ? (double)p->freq_scale : 1.0;
    if (!p->yarn) return fs;
    const double span = p->yarn_hi - p->yarn_lo > 0.001f ? (double)(p->yarn_hi - p->yarn_lo) : 0.001;
    double y = ((double)i - (double)p->yarn_lo) / span;
    y = y < 0 ? 0 : y > 1 ? 1 : y;
    return fs * y + (1 - y);   /* mix = 1 - y */
}

/* The arguments of backend_ops.rope_kv_store: a layer's queries and keys
 * rotated, then its K and V rows stored (values, not pointers, so a
 * recorded op list holds its own copy). */
struct rope_kv_args {
    int n, n_head, n_head_kv, head_dim;
    float *q;                     /* (n, n_head * head_dim), rotated in place */
    float *k;                     /* (n, n_head_kv * head_dim), rotated in place, then stored */
    const float *v;               /* (n, n_head_kv * head_dim) */
    const int32_t *pos, *slots;   /* (n) each, as rope's and kv_store's */
    struct rope_params rope;
    struct kv_layer_view kv;
};

/* The arguments of backend_ops.matmuls: y[i] (n, w[i]->ne1) = x (n, K) ·
 * w[i]ᵀ for i < k, every w[i] a matrix of rows of K (values, so a recorded
 * op list holds its own copy). */
#define BACKEND_MATMULS_MAX 3     /* Q, K and V */
struct matmuls_args {
    int k, n;
    const float *x;
    float *y[BACKEND_MATMULS_MAX];
    const struct tensor *w[BACKEND_MATMULS_MAX];
};

/* The largest step a context must run without allocating. */
struct backend_ctx_params {
    int n_threads;                /* >= 1 */
    int max_tokens;               /* tokens per step */
    int max_ctx;                  /* longest context attention reads */
    int n_head, head_dim;         /* attention shape (scratch for split contexts) */
    int64_t max_cols;             /* longest weight row */
};

struct backend_buf {
    void *data;                   /* backend memory: never dereferenced by host code */
    size_t size;
};

/* Who place_weights tells of each tensor it copied, as soon as the copy is
 * made: the caller gives back the memory it was read from (the file's
 * pages) while later tensors are placed, so a load never holds every
 * weight twice. */
struct place_copied {
    void (*fn)(void *user, const void *src, size_t bytes);
    void *user;
};
static inline void place_copied_tell(const struct place_copied *pc, const void *src, size_t bytes) {
    if (pc && pc->fn) pc->fn(pc->user, src, bytes);
}

struct backend;
struct backend_ctx;
struct graph;

/* What a model may need that a backend may lack (backend_ops.supports_op):
 * the optional ops, and the weight types an op reads.  The loader asks
 * before placing anything, so a model a backend cannot run is refused at
 * load with the op named, never halfway through a step. */
enum backend_op {
    BACKEND_OP_MATMUL,            /* matmul over weights of the given type (enum dtype) */
    BACKEND_OP_GET_ROWS,          /* get_rows from weights of the given type */
    BACKEND_OP_MOE,               /* moe_route and moe over experts of the given type */
    BACKEND_OP_KV_SHIFT,          /* kv_shift (type unused: 0) */
    BACKEND_OP_SAMPLE,            /* sample (type unused: 0) */
    BACKEND_OP_ADD_RMSNORM,       /* the fused add_rmsnorm (type unused: 0) */
    BACKEND_OP_ROPE_KV_STORE,     /* the fused rope_kv_store (type unused: 0) */
    BACKEND_OP_MATMULS,           /* the fused matmuls (type unused: 0) */
    BACKEND_OP_COUNT_
};

/* "matmul", "get_rows", ... for messages ("?" out of range). */
const char *backend_op_name(enum backend_op op);

/* All members are required unless marked optional.  Ops, uploads and
 * downloads on one context run in issue order; a backend may run them
 * asynchronously, so host memory
 * handed to an upload or download must stay valid (and unread, for a
 * download) until backend_sync returns.  Every pointer argument named y, x,
 * g, u, ids, pos, slots or inside an args struct is backend memory. */
struct backend_ops {
    const char *name;             /* "scalar", "avx2", "strict/avx2", ... */
    /* Free the backend, after every buffer and context it made is freed
     * (backend_free calls it; be is never NULL here). */
    void (*free)(struct backend *be);
    /* Whether the backend runs op on tensors of type (enum dtype; ignored
     * where enum backend_op says so).  Cheap, any thread; true for an
     * optional op means its member is set. */
    bool (*supports_op)(const struct backend *be, enum backend_op op, uint32_t type);

    /* ---- memory (any thread) ---- */
    /* A buffer of at least bytes (64-byte aligned, zeroed).  KVLLM_ENOMEM logged. */
    int (*buf_alloc)(struct backend *be, size_t bytes, struct backend_buf *out);
    void (*buf_free)(struct backend *be, struct backend_buf *b);   /* NULL-safe, zeroes *b */
    /* Place n weight tensors (data in host memory, e.g. the file mapping)
     * where the kernels want them: each ts[i]->data is rewritten to the
     * placed copy (or left as the mapping).  Tensors with data == NULL are
     * skipped.  A tensor copied is told to `copied` (may be NULL) as soon
     * as its copy is made, with the host bytes it was read from.
     * *placed_bytes: the bytes they take where they live. */
    int (*place_weights)(struct backend *be, struct tensor *const *ts, int n, const struct place_copied *copied,
                         uint64_t *placed_bytes);
    /* Bytes of its memory the backend can still give (device memory for a
     * GPU); the engine's memory plan sizes the KV pool from it.  Optional:
     * NULL means host RAM (MemAvailable). */
    uint64_t (*mem_available)(struct backend *be);

    /* ---- execution contexts ---- */
    int (*ctx_new)(struct backend *be, const struct backend_ctx_params *p, struct backend_ctx **out);
    void (*ctx_free)(struct backend_ctx *c);
    /* host -> backend and backend -> host copies of bytes */
    int (*upload)(struct backend_ctx *c, void *dst, const void *src, size_t bytes);
    int (*download)(struct backend_ctx *c, void *dst, const void *src, size_t bytes);
    /* Wait for everything issued; the context's first error since the last sync. */
    int (*sync)(struct backend_ctx *c);

    /* ---- ops ---- */
    /* y (n, w->ne1) = x (n, w->ne0) · wᵀ */
    int (*matmul)(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n);
    /* y (n, w->ne0) = rows ids[0 .. n) of w, as f32 */
    int (*get_rows)(struct backend_ctx *c, float *y, const struct tensor *w, const int32_t *ids, int n);
    /* y (n, dim) = rows ids[0 .. n) of x (f32 rows of dim) */
    int (*gather_rows)(struct backend_ctx *c, float *y, const float *x, const int32_t *ids, int n, int dim);
    /* y (n, dim) = x / rms(x) * w, per row; w (dim) f32 */
    int (*rmsnorm)(struct backend_ctx *c, float *y, const float *x, const struct tensor *w, int n, int dim,
                   float eps);
    /* y (n, dim) = (x - mean(x)) / sqrt(var(x) + eps) * w + b, per row; b may be NULL */
    int (*layernorm)(struct backend_ctx *c, float *y, const float *x, const struct tensor *w,
                     const struct tensor *b, int n, int dim, float eps);
    /* rotate the first n_rot dims of each head of x (n, n_head * head_dim) in place, as p says */
    int (*rope)(struct backend_ctx *c, float *x, int n, int n_head, int head_dim, const int32_t *pos,
                const struct rope_params *p);
    /* y (n, dim) += b (dim) f32, per row */
    int (*add_bias)(struct backend_ctx *c, float *y, const struct tensor *b, int n, int dim);
    /* y (n) += x */
    int (*add)(struct backend_ctx *c, float *y, const float *x, long n);
    /* g (n) = silu(g) * u */
    int (*swiglu)(struct backend_ctx *c, float *g, const float *u, long n);
    /* x (n) = gelu(x), tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    int (*gelu)(struct backend_ctx *c, float *x, long n);
    /* g (n) = gelu(g) * u, gelu as above (GeGLU) */
    int (*geglu)(struct backend_ctx *c, float *g, const float *u, long n);
    /* x (n) *= s */
    int (*scale)(struct backend_ctx *c, float *x, long n, float s);
    /* x (n) = cap * tanh(x / cap) (logit soft-capping) */
    int (*softcap)(struct backend_ctx *c, float *x, long n, float cap);
    /* Mixture-of-experts routing (optional, with moe: NULL when the backend
     * cannot run such models, as supports_op(BACKEND_OP_MOE) says, and
     * model_load then refuses them): for each of n rows of logits (n,
     * n_expert), p = softmax(row); ids (n, n_used) = the n_used largest p
     * (lowest index first on ties), weights (n, n_used) = their p, divided by
     * their sum when norm. */
    int (*moe_route)(struct backend_ctx *c, int32_t *ids, float *weights, const float *logits, int n,
                     int n_expert, int n_used, bool norm);
    /* the experts' FFN (struct moe_args); optional, with moe_route */
    int (*moe)(struct backend_ctx *c, const struct moe_args *a);
    /* store n tokens' K and V rows (n, n_head_kv * head_dim) at slots
     * (block * block_size + offset; negative: skipped), converting to the
     * storage type */
    int (*kv_store)(struct backend_ctx *c, const struct kv_layer_view *kv, const int32_t *slots,
                    const float *k, const float *v, int n);
    int (*paged_attention)(struct backend_ctx *c, const struct paged_attn_args *a);
    /* Fused ops, each exactly the ops it stands for in their order, bit for
     * bit, as one launch where launches cost (a GPU).  Optional (NULL;
     * supports_op says): the model issues the separate ops without them. */
    /* x (n, dim) += h, then y = rmsnorm(x) * w as rmsnorm; y may be h */
    int (*add_rmsnorm)(struct backend_ctx *c, float *y, float *x, const float *h, const struct tensor *w, int n,
                       int dim, float eps);
    /* rope(q), rope(k) with a->rope, then kv_store(&a->kv, slots, k, v) */
    int (*rope_kv_store)(struct backend_ctx *c, const struct rope_kv_args *a);
    /* matmul(a->y[i], a->w[i], a->x, a->n) for i < a->k, in one pass where
     * the matrices can share the work on their input (its quantization) */
    int (*matmuls)(struct backend_ctx *c, const struct matmuls_args *a);
    /* copy-on-write: for each of n pairs (dst, src) (host memory), block src
     * to block dst in every one of the n_layer layers */
    int (*copy_blocks)(struct backend_ctx *c, const struct kv_layer_view *layers, int n_layer,
                       const int32_t (*pairs)[2], int n);
    /* Context shift (chat dropping old turns): in every one of the n_layer
     * layers, move the K and V rows of slot src[i] to slot dst[i] (host
     * memory; slots >= 0), every kv head, for i = 0 .. n-1 in that order
     * (the caller orders them so that no move writes a slot a later move
     * reads), K rotated by the RoPE angle of delta positions (p as in rope;
     * delta < 0 moves positions back).  A K row goes through f32 and is
     * stored again (quantized anew for the 8-bit types); V rows and their
     * scales are copied as they are.  Optional: NULL when the backend cannot
     * (supports_op(BACKEND_OP_KV_SHIFT) is false; the caller recomputes the
     * positions instead). */
    int (*kv_shift)(struct backend_ctx *c, const struct kv_layer_view *layers, int n_layer, const int32_t *src,
                    const int32_t *dst, int n, int delta, const struct rope_params *p);

    /* ---- sampling stage ---- */
    /* ids (n) = the greedy token of each row of x (n, dim): the index of the
     * largest value, the lowest index on ties; NaN counts as -inf and +inf
     * as the largest (the host sampler's order, so a greedy request gets the
     * same token either way); -1 when every value is NaN or -inf.  The
     * engine samples greedy rows that nothing else transforms here, so only
     * the token id leaves the backend, not the row of logits. */
    int (*argmax)(struct backend_ctx *c, int32_t *ids, const float *x, int n, int dim);
    /* ids (n) = the token the host sampler's chain (sample/chain.h: top-k ->
     * top-p -> min-p -> temperature -> softmax -> draw with the row's u)
     * picks from each row of logits, so a row that needs nothing else (no
     * penalties, bias, masks, logits on the host) is sampled here and only
     * its id leaves the backend; -1 for a row of only NaN and -inf.  The CPU
     * runs the host's own code (exactly its token); a GPU may differ where
     * float sums in another order move a near-tie (struct sample_args).
     * Optional: NULL where the backend lacks it, as supports_op
     * (BACKEND_OP_SAMPLE) says (those rows are sampled on the host). */
    int (*sample)(struct backend_ctx *c, const struct sample_args *a);

    /* ---- a step as one transaction (optional; graph.h) ---- */
    /* Host memory for staging a step's inputs and receiving its outputs:
     * at least bytes, 64-byte aligned, read and written by host code (pinned
     * on a GPU, so a transfer from or to it is one DMA).  NULL: the engine
     * takes aligned host memory of its own.  host_free is NULL-safe. */
    void *(*host_alloc)(struct backend *be, size_t bytes);
    void (*host_free)(struct backend *be, void *p);
    /* Run the recorded op list g on c, as graph_replay would (each record in
     * order, every paged attention with ctx_hi), but the backend's way: a
     * GPU captures the list once and launches the capture (a CUDA graph);
     * the backend may keep what it made in g's exec.  NULL: the engine
     * replays the records one by one (graph_replay). */
    int (*graph_compute)(struct backend_ctx *c, struct graph *g, int ctx_hi);
};

struct backend {
    const struct backend_ops *ops;
};

/* The common head of every context. */
struct backend_ctx {
    const struct backend_ops *ops;
    struct backend *be;
    int status;                   /* first error since the last sync (0: none) */
    /* test hook: when fail_after reaches 0 counting down one per op, that op
     * fails with fail_code (an injected device or kernel error) */
    long fail_after;
    int fail_code;
};

/* Which backend a model runs on (kvllm_model_params names them; the
 * CLI fills those from its flags and environment). */
enum backend_kind {
    BACKEND_CPU = 0,              /* the CPU kernels */
    BACKEND_STRICT,               /* the same kernels behind the wall described above (tests) */
    BACKEND_CUDA,                 /* the CUDA backend where built (-DKVLLM_CUDA=ON) */
};

/* Activation arithmetic of the matmul on quantized weights (SIMD CPU sets
 * and CUDA; the scalar set, the oracle, is always f32).  BACKEND_ACT_Q8,
 * the default: activations are quantized per row to 8-bit codes (blocks of
 * 32 for Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4, of 256 for the
 * K-quants and IQ4_XS) and multiplied with integer dot products
 * (vpmaddubsw on AVX2, vpdpbusd where the CPU has AVX-VNNI or AVX-512
 * VNNI), bit-identical across kernel sets, on weights repacked at
 * placement into 16-row interleaved blocks (src/backend/cpu/qmm.h); F32 /
 * F16 / BF16 weights, the matrices the model marks TENSOR_F_F32_ACT (the
 * logits'), and those it marks TENSOR_F_FINE_ACT (the FFN down projection
 * of families whose arch_desc asks) where their rows would be scaled per
 * 256, keep f32 arithmetic.  BACKEND_ACT_F32 keeps every weight in f32
 * arithmetic on dequantized weights; BACKEND_ACT_INT takes the older
 * 13-bit codes for Q8_0 / Q4_0 / Q4_1 (CPU only; CUDA takes q8 for it).
 * The choice is per backend, never per batch, so results stay
 * batch-invariant. */
enum backend_act { BACKEND_ACT_Q8 = 0, BACKEND_ACT_F32, BACKEND_ACT_INT };

/* A backend's choice; zeroed, it is the CPU's best kernel set on 8-bit
 * activations. */
struct backend_params {
    enum backend_kind kind;
    const char *cpu_kernels;      /* CPU and strict: NULL or "" picks the best the CPU offers (amx, avx512,
                                     avx2, then scalar); otherwise "scalar", "avx2", "avx512"
                                     (AVX-512 F/BW/VL + VNNI; its other ops are avx2's) or "amx" (the
                                     avx512 set with the integer matmul on AMX-INT8 tiles) */
    enum backend_act act;
    int device;                   /* CUDA: the device's index (0 .. count - 1); others ignore it */
};

/* Names as kvllm_model_params spells them, to the enums above: backend
 * NULL, "" or "cpu", "strict", "cuda"; activations NULL, "" or "q8", "f32",
 * "int".  KVLLM_EINVAL (logged, naming the field and the valid names) for
 * another name; *out is left as it was then. */
int backend_kind_parse(const char *name, enum backend_kind *out);
int backend_act_parse(const char *name, enum backend_act *out);

/* Create the backend p chooses.  Fails with KVLLM_ECPU (logged) for a
 * kernel set this build or CPU lacks, KVLLM_EUNSUPPORTED where the build
 * lacks CUDA or the machine a usable device, KVLLM_EINVAL for a device
 * out of range, KVLLM_EBACKEND for other device failures; *out is NULL
 * then (backend.c). */
int backend_new(const struct backend_params *p, struct backend **out);
/* The CPU backend alone (cpu.c): kernel set kind as backend_params'
 * cpu_kernels, behind the strict wall when strict. */
int backend_cpu_new(const char *kind, bool strict, enum backend_act act, struct backend **out);
void backend_free(struct backend *be);   /* NULL-safe; after every buffer and context it made is freed */

/* Whether be runs op on type (enum backend_op). */
static inline bool backend_supports(const struct backend *be, enum backend_op op, uint32_t type) {
    return be->ops->supports_op(be, op, type);
}

static inline int backend_ctx_new(struct backend *be, const struct backend_ctx_params *p, struct backend_ctx **out) {
    return be->ops->ctx_new(be, p, out);
}
static inline void backend_ctx_free(struct backend_ctx *c) { if (c) c->ops->ctx_free(c); }

/* Issue an op: the test hook, then the op; a failure is kept as the
 * context's status.  Use as BE_OP(c, matmul, y, w, x, n). */
static inline int backend_op_enter_(struct backend_ctx *c) {
    if (c->status) return c->status;
    if (c->fail_after > 0 && --c->fail_after == 0) return c->status = c->fail_code;
    return 0;
}
#define BE_OP(c, op, ...) \
    (backend_op_enter_(c) ? (c)->status : ((c)->status = (c)->ops->op((c), __VA_ARGS__)))

/* Wait for the context and return (and clear) its status. */
static inline int backend_sync(struct backend_ctx *c) {
    int rc = c->ops->sync(c);
    if (!rc) rc = c->status;
    c->status = 0;
    return rc;
}

#endif
