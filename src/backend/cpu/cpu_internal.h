/* cpu_internal.h — what the CPU backend's files share: the backend and
 * context objects, the paged KV kernels (kv_kernels.c) that cpu.c puts in
 * its ops tables, and the branch-free element converters those kernels
 * dequantize with. */
#ifndef KVLLM_CPU_INTERNAL_H
#define KVLLM_CPU_INTERNAL_H

#include "backend/backend.h"
#include "core/threadpool.h"
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* Activation arithmetic of the SIMD matmul (see backend_cpu_new): f32,
 * the older 13-bit integer codes (matmul_int_avx2.c), or 8-bit codes per
 * block of 32 (qmm.h). */
enum act_mode { ACT_F32 = 0, ACT_INT, ACT_Q8 };

struct qmm_job;

/* Rows of a weight matrix dequantized together into a thread's scratch
 * (the scalar and AVX2 matmuls use as many). */
#define CPU_MM_ROWS 4

/* The CPU backend: immutable after creation except for the strict wall,
 * whose region list is guarded by its mutex. */
struct cpu_backend {
    struct backend be;            /* first: the struct backend * handed out is this address */
    struct backend_ops ops;       /* the table be.ops points to */
    struct backend_ops kernels;   /* the kernel set itself (strict: what the wall wraps) */
    enum act_mode act;
    /* the integer matmul's group kernel for this set (qmm_group_fn), or NULL */
    void (*qrows)(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr);
    void *packed;                 /* weights repacked by place_weights (qmm.h), or NULL */
    bool q16;                     /* the logits' Q8_0 matrix takes the 16-bit path (qmm16_matmul) */
    bool act512;                  /* activation rows quantized by act_avx512.c */
    bool strict;
    char name[24];                /* "strict/avx2" */
    /* strict: every buffer and the placed weights, PROT_NONE outside ops */
    pthread_mutex_t wall_mu;
    struct cpu_region { void *p; size_t n; } *regions;
    int n_regions, cap_regions;
};

/* An execution context: everything a step mutates, sized at creation. */
struct cpu_ctx {
    struct backend_ctx base;      /* first */
    struct threadpool *pool;
    float *scratch;               /* per thread: scratch_cols floats (CPU_MM_ROWS dequantized rows) */
    int64_t scratch_cols;
    enum act_mode act;
    void *act_buf;                /* integer activations of max_tokens rows of max_cols */
    size_t act_buf_bytes;
    uint8_t *qpack;               /* per thread: qpack_bytes for a 16-row group repacked on the fly (qmm.h) */
    size_t qpack_bytes;
    int max_tokens, max_ctx;
    float *partials;              /* paged attention: paged_attn_scratch_floats() */
    size_t n_partials;
    float *pa_local;              /* per thread: pa_local_floats (an item's running partials, pa_local_stride) */
    size_t pa_local_floats;
    long *pa_off;                 /* (max_tokens + 1) */
    int *pa_unit;                 /* (max_tokens + 1) */
    int *pa_merge;                /* (max_tokens) */
    /* rope: each token's (cos, sin) per rotated pair for the settings and positions of the last call
     * (cpu_ops.c), which every layer with the same settings reuses; rope_n 0: none held */
    float *rope_cs;               /* (max_tokens, rope_cols) */
    int32_t *rope_pos;            /* (max_tokens) */
    struct rope_params rope_key;
    int rope_cols, rope_n;
};

static inline struct cpu_ctx *cpu_ctx_of(struct backend_ctx *c) { return (struct cpu_ctx *)(void *)c; }
static inline struct cpu_backend *cpu_backend_of(struct backend *be) { return (struct cpu_backend *)(void *)be; }

/* Paged attention's running partials: an item keeps its heads' [m, l,
 * acc[head_dim]] in its thread's own lines (cpu_ctx.pa_local), this many
 * floats apart, and writes them to the shared partials once, at its end.
 * Rescaled and accumulated in the shared buffer every step instead, they
 * cost the step ~35 % more per position with two threads on one call than
 * one thread spent alone (Gemma 3's shape at depth 8k, int8; perf put it on
 * the partials' loads): a split's lines go to whichever thread claims it,
 * and the merge reads them all.  Padding the shared partials to whole lines
 * did not help; this did.  Each head starts PA_LOCAL_LEAD floats into a
 * 64-byte line, so acc is aligned. */
#define PA_LOCAL_LEAD 14
/* Query rows (tokens x heads of a kv head) of one prefill group of paged
 * attention (kv_kernels.c): pa_local holds at least this many partials. */
#define PA_GROUP_ROWS 24
static inline size_t pa_local_stride(int head_dim) { return ((size_t)head_dim + 2 + 15) / 16 * 16; }

/* Scratch floats paged attention needs for n_tokens tokens whose contexts
 * are at most max_ctx positions long. */
static inline uint64_t paged_attn_scratch_floats(int n_tokens, int n_head, int head_dim, int max_ctx) {
    uint64_t splits = ((uint64_t)max_ctx + PAGED_ATTN_SPLIT - 1) / PAGED_ATTN_SPLIT;
    return (uint64_t)n_tokens * (uint64_t)n_head * splits * ((uint64_t)head_dim + 2);
}

/* The strict backend's ops table wrapping b->kernels (strict.c). */
void cpu_strict_ops(struct cpu_backend *b);
/* Register a region with the wall (strict only); it is protected at once. */
int cpu_wall_add(struct cpu_backend *b, void *p, size_t n);
void cpu_wall_remove(struct cpu_backend *b, void *p);

/* backend_ops.kv_store: quantize n tokens' K and V rows (n, n_head_kv *
 * head_dim) into slots[i] (block * block_size + offset); a negative slot is
 * skipped (padding).  int8: scale = amax / 127 per (position, head), codes
 * round(x / scale); fp8: scale = amax / 448, codes f32_to_fp8_e4m3(x / scale);
 * an all-zero row gets scale 0 and codes 0. */
int cpu_kv_store(struct backend_ctx *c, const struct kv_layer_view *kv, const int32_t *slots,
                 const float *k, const float *v, int n);
/* cpu_kv_store with f16 rows converted by to_f16 (n values; the same bits as
 * f32_to_f16 for every non-NaN input): the SIMD sets pass F16C's. */
typedef void kv_f16_row_fn(const float *x, uint16_t *d, int n);
int cpu_kv_store_with(struct backend_ctx *c, const struct kv_layer_view *kv, const int32_t *slots, const float *k,
                      const float *v, int n, kv_f16_row_fn *to_f16);
/* backend_ops.kv_shift (backend.h): moves rows layer by layer (a thread a
 * layer), K through f32 rotated by delta positions and stored again as
 * kv_store stores it.  KVLLM_EINVAL (logged) for a negative slot or an
 * n_rot the context's scratch cannot hold. */
int cpu_kv_shift(struct backend_ctx *c, const struct kv_layer_view *layers, int n_layer, const int32_t *src,
                 const int32_t *dst, int n, int delta, const struct rope_params *p);

/* backend_ops.paged_attention (see struct paged_attn_args).  head_dim is at
 * most CPU_PAGED_ATTN_MAX_HEAD_DIM; n_tokens at most the context's
 * max_tokens and every pos[t] below its max_ctx (KVLLM_ERANGE otherwise).
 * Results are bit-identical for any thread count and any batch composition. */
#define CPU_PAGED_ATTN_MAX_HEAD_DIM 1024
int cpu_paged_attention(struct backend_ctx *c, const struct paged_attn_args *a);

/* Most positions per online-softmax step. */
#define CPU_PA_CHUNK 64

/* x rounded to the nearest integer, ties to even, for |x| < 2^22 (adding
 * and taking off 1.5 * 2^23 leaves no fraction bits): a libm call per
 * element, roundf, cost as much as the scores of its query. */
static inline float pa_round_even(float x) {
    const float big = 12582912.0f;       /* without -ffast-math the compiler keeps both operations */
    return (x + big) - big;
}

/* The queries of an item quantized to int8 as K rows are: per head, scale
 * = amax / 127 and codes pa_round_even(q * (127 / amax)) in [-127, 127].
 * With int8 K a score is then an exact integer dot product of codes, so
 * every kernel set (scalar, AVX2, AVX-512 VNNI) gets the same integer and
 * the same float from it:
 *   score[h][p] = (float)Σ_d code[h][d] * k[p][d] * (scale[h] * rs[p]),
 *   rs[p] = k_scale[row p] * the attention scale (each product rounded).
 * Widening int8 K to f32 for FMAs cost more than the rest of the step; an
 * integer dot takes a quarter of the instructions and adds the queries'
 * rounding (about amax / 254 per element) to K's own.  Used when K is int8,
 * head_dim a multiple of 32, g <= PA_Q8_MAX_G and g * head_dim <=
 * PA_Q8_MAX_BYTES (the item keeps the codes on its stack); otherwise the
 * step works in f32 as for the other types. */
#define PA_Q8_MAX_G 64
#define PA_Q8_MAX_BYTES 16384
/* With those queries the V side is integer too: per head h, the step's weights times the
 * rows' V scales, w[h][p], become 16-bit codes u = pa_round_even(w * (32767
 * / mw)) with mw = max_p w[h][p] (a step whose mw < 2^-100, nothing against
 * l >= 1, adds nothing), and
 *   acc[h][d] = fma(mw / 32767, (float)Σ_p u[h][p] * v[p][d], acc[h][d]),
 * the sum an exact int32 (64 * 32767 * 127 < 2^31).  The codes' rounding,
 * 2^-16 of the step's largest weight, is far below int8 V's own. */
struct pa_q8 {
    const int8_t *code;       /* (g, head_dim) */
    const float *scale;       /* (g) */
    const int32_t *sum;       /* (g): Σ_d code[h][d] (an unsigned-times-signed product's offset) */
};

/* The 16-bit weight codes of a step (see struct pa_q8): u (g rows ustride
 * apart, zero from n to the next even count) and the heads' factors ws =
 * mw / 32767 (0: the head adds nothing this step).  w: (g, n), rows cap
 * apart. */
static inline void pa_quant_w16(const float *w, int g, int n, int cap, int16_t *u, int ustride, float *ws) {
    for (int h = 0; h < g; h++) {
        const float *x = w + (size_t)h * cap;
        int16_t *c = u + (size_t)h * ustride;
        float mw = 0;
        for (int p = 0; p < n; p++) mw = x[p] > mw ? x[p] : mw;
        const bool on = mw >= 0x1p-100f;
        const float inv = on ? 32767.0f / mw : 0.0f;
        ws[h] = on ? mw / 32767.0f : 0.0f;
        for (int p = 0; p < n; p++) {
            float r = pa_round_even(x[p] * inv);
            r = r > 32767 ? 32767 : r > 0 ? r : 0;     /* NaN: 0 */
            c[p] = (int16_t)r;
        }
        if (n % 2) c[n] = 0;
    }
}

/* One online-softmax step of paged attention (the part SIMD kernels
 * replace): n <= cap positions whose K/V rows (indices into kv's (slot,
 * head) rows) are rows[0 .. n), for the g query heads q (g, head_dim) that
 * share one kv head.  A step may span several blocks: its positions are
 * consecutive in the context, wherever their blocks lie.  part holds g
 * partials [m, l, acc[head_dim]] pstride floats apart (m = -inf and l = 0
 * before the first step), updated in place: scores q·k * scale (times the
 * row's scale for 8-bit types; qq non-NULL: K is int8 and the scores are
 * struct pa_q8's integer products), new max, acc and l rescaled, weights
 * exp(score - m) added to l and, times V, to acc.  row_n (NULL: n for
 * every row; never with qq): row i takes only the first row_n[i] positions,
 * its partial updated exactly as by a step of those positions alone (0: left
 * as it is), whatever the others' K and V hold.  sc: g * cap floats of
 * scratch.  pf[0 .. npf): the next step's rows, to prefetch (a hint: a
 * step may ignore it) spread over this step's own reads.  Must depend only
 * on its arguments (no thread or batch state), which keeps attention
 * batch-invariant. */
typedef void pa_chunk_fn(const struct kv_layer_view *kv, const size_t *rows, int n, int g, const int *row_n,
                         const float *q, const struct pa_q8 *qq, float scale, float softcap, float *part,
                         size_t pstride, float *sc, int cap, const size_t *pf, int npf);

/* Soft-capping of a step's scores sc (g, n; rows cap apart), when softcap
 * > 0: s -> softcap * tanh(s / softcap), after scaling and before the max,
 * in every kernel set alike (scalar tanhf: the capped families are few and
 * the step's cost is the K and V reads). */
static inline void pa_softcap(float *sc, int g, int n, int cap, float softcap) {
    if (softcap <= 0) return;
    for (int i = 0; i < g; i++)
        for (int jj = 0; jj < n; jj++) sc[(size_t)i * cap + jj] = softcap * tanhf(sc[(size_t)i * cap + jj] / softcap);
}

/* An item's queries q (g, head_dim) as struct pa_q8 codes, scales and
 * sums, called only where struct pa_q8 applies (head_dim a multiple of
 * 32); every version gives the same bits (kv_kernels.c's pa_quant_q8 is
 * the definition). */
typedef void pa_quant_fn(const float *q, int g, int hd, int8_t *code, float *scale, int32_t *sum);

/* paged_attention with a given step kernel and query quantizer (NULL: the
 * portable one), inside the item, split and merge structure of
 * kv_kernels.c. */
int cpu_paged_attention_with(struct backend_ctx *c, const struct paged_attn_args *a, pa_chunk_fn *chunk,
                             pa_quant_fn *quant);

/* paged_attention with the AVX2 step (attn_avx2.c); call only when
 * cpu_features_get() reports avx2, fma and f16c. */
int cpu_paged_attention_avx2(struct backend_ctx *c, const struct paged_attn_args *a);

/* paged_attention with the AVX-512 step (attn_avx512.c; head sizes that are
 * not a multiple of 16 take the AVX2 step); call only when this build has it
 * (cpu_attn_avx512_built) and cpu_features_get() reports avx512f and the
 * AVX2 trio. */
bool cpu_attn_avx512_built(void);
int cpu_paged_attention_avx512(struct backend_ctx *c, const struct paged_attn_args *a);

/* A step's scores with int8 K and quantized queries on AVX-512 VNNI
 * (attn_q8_avx512.c): sc[h * cap + p] for h < g, p < n as struct pa_q8
 * defines them, k the layer's K codes (rows of hd), rs[0 .. 64) the
 * positions' factors; the next step's K rows pf[0 .. npf) are prefetched
 * meanwhile.  Call only when cpu_attn_q8_avx512_built() and the CPU has
 * AVX-512 F, BW, VL and VNNI. */
bool cpu_attn_q8_avx512_built(void);
pa_quant_fn cpu_pa_quant_q8_avx512;
void cpu_pa_scores_q8_avx512(const int8_t *k, const size_t *rows, int n, int g, const struct pa_q8 *qq, int hd,
                             const float *rs, float *sc, int cap, const size_t *pf, int npf);
/* A step's values with int8 V (struct pa_q8): acc of the g partials
 * (part0, pstride apart) from the weights w (g, n; rows cap apart, times
 * the rows' V scales), V the layer's codes (rows of hd, a multiple of 32);
 * the next step's V rows pf[0 .. npf) are prefetched meanwhile.  Same
 * conditions as cpu_pa_scores_q8_avx512. */
void cpu_pa_values_q8_avx512(const int8_t *v, const size_t *rows, int n, int g, int hd, const float *w, int cap,
                             float *part0, size_t pstride, const size_t *pf, int npf);

/* Exact, branch-free (vectorizable) equivalents of f16_to_f32 and
 * fp8_e4m3_to_f32: no subnormal floating-point operands, so neither DAZ nor
 * denormal stalls matter.  NaN inputs give a NaN (payload may differ). */
static inline float cpu_f16_to_f32(uint16_t h) {
    uint32_t em = h & 0x7fffu, r, n = (em << 13) + (112u << 23);
    float sub = (float)(int32_t)em * 5.9604644775390625e-8f;      /* em * 2^-24, exact for em < 0x400 */
    memcpy(&r, &sub, 4);
    uint32_t is_sub = 0u - (uint32_t)(em < 0x400u), is_inf = 0u - (uint32_t)(em >= 0x7c00u);   /* masks */
    r = (r & is_sub) | (n & ~(is_sub | is_inf)) | (((em << 13) | 0x7f800000u) & is_inf);
    r |= (uint32_t)(h & 0x8000u) << 16;
    float f;
    memcpy(&f, &r, 4);
    return f;
}

static inline float cpu_fp8_to_f32(uint8_t c) {
    uint32_t em = c & 0x7fu, r, n = (em << 20) + (120u << 23);
    float sub = (float)(int32_t)em * 0.001953125f;                 /* em * 2^-9, exact for em < 8 */
    memcpy(&r, &sub, 4);
    uint32_t is_sub = 0u - (uint32_t)(em < 8u), is_nan = 0u - (uint32_t)(em == 0x7fu);          /* masks */
    r = (r & is_sub) | (n & ~(is_sub | is_nan)) | (0x7fc00000u & is_nan);
    r |= (uint32_t)(c & 0x80u) << 24;
    float f;
    memcpy(&f, &r, 4);
    return f;
}

#endif
