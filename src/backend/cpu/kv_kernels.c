/* kv_kernels.c — the scalar kernels over paged KV storage: kv_store
 * (quantize K/V rows into their slots) and paged_attention.
 *
 * Model of the world.  Token t attends positions 0 .. L-1 (L = pos[t] + 1)
 * of its own sequence (with a sliding window W > 0: only L-W .. L-1),
 * whose position p lives in block block_table[seq[t]][p / block_size], slot
 * p % block_size.  The context is cut into splits at
 * multiples of PAGED_ATTN_SPLIT (under a window, the window into equal
 * parts: pa_n_split); one work item is (token, kv head, split):
 * it walks the split's positions in chunks that end at multiples of
 * cap = min(PA_CHUNK, PA_SCORES / g), wherever blocks end (a chunk gathers
 * its rows from the blocks it spans), and, for all g = n_head / n_head_kv
 * query heads sharing that kv head at once, keeps a running max m, sum l
 * and accumulator acc (online softmax, rescaled once per chunk), each K/V
 * row dequantized once for the g heads.  Items leave (m, l, acc) in the context's partials; a merge step combines a
 * token's splits in ascending order (log-sum-exp) and normalizes.
 *
 * Prefill groups.  Consecutive tokens of one sequence (positions P, P+1, ...,
 * the same splits) attend the same positions but for the last few, so one
 * item takes up to PA_GROUP_ROWS / g of them: each chunk runs once for all
 * their g * nt query rows (each K/V row converted once for them all: the
 * SIMD steps' tiles then span heads of several tokens), the last ones with
 * each row's own count of positions (pa_chunk_fn's row_n: an earlier
 * token's row stops where its context ends).  A row's arithmetic does not depend on the rows beside it in a
 * step, and its chunk boundaries are the single token's, so a grouped
 * token's output is the bits it has alone.
 *
 * Determinism.  Chunk and split boundaries depend only on L, the window and
 * g; each item and each merge is computed entirely by one thread in a fixed
 * order.  Threads only decide who computes what, so the output is
 * bit-identical for any thread count and any batch around the token. */
#include "backend/cpu/cpu_internal.h"
#include "core/core.h"
#include "tensor/dtype.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- kv_store ---- */

struct store_job {
    const struct kv_layer_view *kv;
    const int32_t *slots;
    const float *k, *v;
    int n;
    kv_f16_row_fn *to_f16;
};

static void f16_row(const float *x, uint16_t *d, int n) {
    for (int i = 0; i < n; i++) d[i] = f32_to_f16(x[i]);
}

/* Quantize one head row x (head_dim) into element `row` of dst (and scales). */
static void store_row(const struct kv_layer_view *kv, void *dst, float *scales, size_t row, const float *x,
                      kv_f16_row_fn *to_f16) {
    const int hd = kv->head_dim;
    const size_t e0 = row * (size_t)hd;
    switch (kv->type) {
    case KV_F32: memcpy((float *)dst + e0, x, (size_t)hd * sizeof *x); break;
    case KV_F16: to_f16(x, (uint16_t *)dst + e0, hd); break;
    case KV_BF16: {
        uint16_t *d = (uint16_t *)dst + e0;
        for (int i = 0; i < hd; i++) d[i] = f32_to_bf16(x[i]);
        break;
    }
    case KV_INT8: case KV_FP8: {
        const bool i8 = kv->type == KV_INT8;
        float amax = 0;
        for (int i = 0; i < hd; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        float scale = amax / (i8 ? 127.0f : 448.0f);
        scales[row] = scale;
        if (i8) {
            int8_t *d = (int8_t *)dst + e0;
            for (int i = 0; i < hd; i++) {
                float r = scale != 0 ? roundf(x[i] / scale) : 0.0f;
                r = r > 127 ? 127 : r < -127 ? -127 : r;
                d[i] = (int8_t)(r == r ? r : 0);     /* NaN input: 0 */
            }
        } else {
            uint8_t *d = (uint8_t *)dst + e0;
            for (int i = 0; i < hd; i++) d[i] = scale != 0 ? f32_to_fp8_e4m3(x[i] / scale) : 0;
        }
        break;
    }
    default: KV_ASSERT(!"kv type");
    }
}

/* One token's rows, all kv heads. */
static void store_token(const struct store_job *j, int i) {
    const struct kv_layer_view *kv = j->kv;
    const int nkv = kv->n_head_kv, hd = kv->head_dim;
    if (j->slots[i] < 0) return;
    for (int h = 0; h < nkv; h++) {
        size_t row = kv_row(kv, (size_t)j->slots[i], h);
        size_t src = (size_t)i * (size_t)nkv * (size_t)hd + (size_t)h * (size_t)hd;
        store_row(kv, kv->k, kv->k_scale, row, j->k + src, j->to_f16);
        store_row(kv, kv->v, kv->v_scale, row, j->v + src, j->to_f16);
    }
}

/* Tokens per chunk of work: a token's rows are little work against claiming a chunk */
#define STORE_TOKENS 8

static void store_chunk(void *arg, long c, int ith) {
    (void)ith;
    const struct store_job *j = arg;
    const int t1 = (int)((c + 1) * STORE_TOKENS < j->n ? (c + 1) * STORE_TOKENS : j->n);
    for (int i = (int)(c * STORE_TOKENS); i < t1; i++) store_token(j, i);
}

int cpu_kv_store_with(struct backend_ctx *c, const struct kv_layer_view *kv, const int32_t *slots, const float *k,
                      const float *v, int n, kv_f16_row_fn *to_f16) {
    if (n <= 0) return 0;
    struct store_job j = { kv, slots, k, v, n, to_f16 };
    threadpool_run_chunks(cpu_ctx_of(c)->pool, (n + STORE_TOKENS - 1) / STORE_TOKENS, store_chunk, &j);
    return 0;
}

int cpu_kv_store(struct backend_ctx *c, const struct kv_layer_view *kv, const int32_t *slots,
                 const float *k, const float *v, int n) {
    return cpu_kv_store_with(c, kv, slots, k, v, n, f16_row);
}

/* ---- paged attention ---- */

#define PA_CHUNK CPU_PA_CHUNK
#define PA_SCORES 4096        /* score floats per item: g * chunk */
#define PA_GROUP_HD 256       /* a prefill group's head size at most (its queries are gathered on the stack) */

/* Fixed-order dot product: 8 lanes, combined pairwise, then the tail (as cpu.c). */
static inline float pa_dot(const float *restrict a, const float *restrict b, int n) {
    float s[8] = { 0 };
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    float t = 0;
    for (; i < n; i++) t += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + t;
}

static inline void pa_axpy(float *restrict y, float w, const float *restrict x, int n) {
    for (int i = 0; i < n; i++) y[i] += w * x[i];
}

static inline void pa_scale(float *y, float w, int n) {
    for (int i = 0; i < n; i++) y[i] *= w;
}

/* Row `row` of K or V as f32: f32 storage is returned in place, the others
 * converted into buf.  8-bit types give the codes as floats (scale applied
 * by the caller). */
static inline const float *pa_row(enum kv_type type, const void *base, size_t row, int hd, float *restrict buf) {
    const size_t e0 = row * (size_t)hd;
    switch (type) {
    case KV_F32: return (const float *)base + e0;
    case KV_F16: {
        const uint16_t *s = (const uint16_t *)base + e0;
        for (int i = 0; i < hd; i++) buf[i] = cpu_f16_to_f32(s[i]);
        return buf;
    }
    case KV_BF16: {
        const uint16_t *s = (const uint16_t *)base + e0;
        for (int i = 0; i < hd; i++) {
            uint32_t u = (uint32_t)s[i] << 16;
            memcpy(&buf[i], &u, 4);
        }
        return buf;
    }
    case KV_INT8: {
        const int8_t *s = (const int8_t *)base + e0;
        for (int i = 0; i < hd; i++) buf[i] = (float)s[i];
        return buf;
    }
    case KV_FP8: {
        const uint8_t *s = (const uint8_t *)base + e0;
        for (int i = 0; i < hd; i++) buf[i] = cpu_fp8_to_f32(s[i]);
        return buf;
    }
    default: KV_ASSERT(!"kv type"); return NULL;
    }
}

/* First position a context of L positions attends (> 0 only under a sliding window). */
static inline int pa_lo(const struct paged_attn_args *a, int L) {
    return a->window > 0 && L > a->window ? L - a->window : 0;
}

/* Splits of a context of L positions.  Full attention: at multiples of
 * PAGED_ATTN_SPLIT.  Under a sliding window the attended positions [lo, L)
 * are cut into equal parts of at least PA_WIN_SPLIT, no more parts than
 * full attention would make (the partials scratch is sized for those): a
 * window of 512 lay in one split, so one thread did a sliding layer's
 * whole decode attention while the others waited. */
#define PA_WIN_SPLIT 128
static inline int pa_n_split(const struct paged_attn_args *a, int L) {
    const int ns = (L + PAGED_ATTN_SPLIT - 1) / PAGED_ATTN_SPLIT;
    if (a->window <= 0) return ns;
    const int nw = (L - pa_lo(a, L) + PA_WIN_SPLIT - 1) / PA_WIN_SPLIT;
    return nw < ns ? nw : ns;
}

/* Positions split s of a context of L positions attends: [p0, p1), possibly empty. */
static inline void pa_split_range(const struct paged_attn_args *a, int L, int s, int *p0, int *p1) {
    if (a->window <= 0) {
        const int s0 = s * PAGED_ATTN_SPLIT;
        *p1 = L - s0 < PAGED_ATTN_SPLIT ? L : s0 + PAGED_ATTN_SPLIT;
        *p0 = s0;
        return;
    }
    const int lo = pa_lo(a, L), ns = pa_n_split(a, L), per = (L - lo + ns - 1) / ns;
    *p0 = lo + s * per < L ? lo + s * per : L;
    *p1 = *p0 + per < L ? *p0 + per : L;
}

struct pa_job {
    const struct paged_attn_args *a;
    int s_max;                /* splits of the longest context: partials stride */
    pa_chunk_fn *chunk;       /* one online-softmax step (scalar or SIMD) */
    pa_quant_fn *quant;       /* an item's queries for int8 K (struct pa_q8) */
    const long *item_off;     /* (n_units + 1): first item of each unit */
    const int *unit_tok;      /* (n_units + 1): first token of each unit (a token or a prefill group) */
    int n_units;
    const int *merge_tok;     /* the tokens with more than one split, in order */
    float *partials;          /* the context's scratch */
    float *local;             /* per thread: local_floats, the running partials of its item */
    size_t local_floats;
};

/* Partial (m, l, acc[head_dim]) of token t, query head h, split s. */
static inline float *pa_partial(const struct pa_job *j, int t, int h, int s) {
    const struct paged_attn_args *a = j->a;
    return j->partials + (((size_t)t * (size_t)a->n_head + (size_t)h) * (size_t)j->s_max + (size_t)s) *
                         ((size_t)a->head_dim + 2);
}

/* Combine token t / head h's ns partials part(s) = p0 + s * stride in
 * ascending split order into its output; a sink is one more partial of (m =
 * sinks[h], l = 1, acc = 0). */
static void pa_merge_from(const struct paged_attn_args *a, int t, int h, const float *p0, size_t stride, int ns) {
    const int hd = a->head_dim;
    float *out = a->out + ((size_t)t * (size_t)a->n_head + (size_t)h) * (size_t)hd;
    float m = a->sinks ? a->sinks[h] : -INFINITY, l = 0;
    for (int s = 0; s < ns; s++) {
        float ms = p0[(size_t)s * stride];
        m = ms > m ? ms : m;
    }
    if (a->sinks) l = expf(a->sinks[h] - m);
    memset(out, 0, (size_t)hd * sizeof *out);
    for (int s = 0; s < ns; s++) {
        const float *p = p0 + (size_t)s * stride;
        float w = expf(p[0] - m);
        l += p[1] * w;
        pa_axpy(out, w, p + 2, hd);
    }
    pa_scale(out, 1.0f / l, hd);
}

/* The same from the context's partials (pa_partial). */
static void pa_merge(const struct pa_job *j, int t, int h, int ns) {
    pa_merge_from(j->a, t, h, pa_partial(j, t, h, 0), (size_t)j->a->head_dim + 2, ns);
}

/* Rows of positions c .. c + n - 1 (kv head hk) into rows[]: kv_row of
 * each position's slot, walked block by block (two divisions per position
 * took ~10 % of a decode step's attention). */
static void pa_rows(const struct kv_layer_view *kv, const int32_t *table, int hk, int c, int n, size_t *rows) {
    const size_t bs = (size_t)kv->block_size, nkv = (size_t)kv->n_head_kv;
    int b = c / kv->block_size;
    size_t o = (size_t)(c % kv->block_size), base = ((size_t)table[b] * nkv + (size_t)hk) * bs;
    for (int jj = 0; jj < n; jj++) {
        rows[jj] = base + o;
        if (++o == bs && jj + 1 < n) {          /* next block (read only when a position lies in it) */
            o = 0;
            base = ((size_t)table[++b] * nkv + (size_t)hk) * bs;
        }
    }
}

/* pa_quant_fn, portable: item queries q (g, hd) as struct pa_q8 codes
 * (cpu_internal.h), per head. */
static void pa_quant_q8(const float *q, int g, int hd, int8_t *code, float *scale, int32_t *sum) {
    for (int i = 0; i < g; i++) {
        const float *x = q + (size_t)i * hd;
        int8_t *d = code + (size_t)i * hd;
        float m8[8] = { 0 };             /* 8 chains: one max after another waited on each */
        int e = 0;
        for (; e + 8 <= hd; e += 8)
            for (int k = 0; k < 8; k++) m8[k] = fabsf(x[e + k]) > m8[k] ? fabsf(x[e + k]) : m8[k];
        for (; e < hd; e++) m8[0] = fabsf(x[e]) > m8[0] ? fabsf(x[e]) : m8[0];
        float amax = 0;
        for (int k = 0; k < 8; k++) amax = m8[k] > amax ? m8[k] : amax;
        const float inv = amax != 0 ? 127.0f / amax : 0.0f;
        int32_t t = 0;
        for (e = 0; e < hd; e++) {
            float r = pa_round_even(x[e] * inv);
            r = r > 127 ? 127 : r < -127 ? -127 : r;
            d[e] = (int8_t)(r == r ? r : 0);     /* NaN input: 0 */
            t += d[e];
        }
        scale[i] = amax / 127.0f;
        sum[i] = t;
    }
}

/* pa_chunk_fn, scalar: see cpu_internal.h. */
static void pa_chunk_scalar(const struct kv_layer_view *kv, const size_t *rows, int n, int g, const int *row_n,
                            const float *q, const struct pa_q8 *qq, float scale, float softcap, float *part0,
                            size_t pstride, float *sc, int cap, const size_t *pf, int npf) {
    (void)pf;
    (void)npf;
    KV_ASSERT(!qq || !row_n);
    const int hd = kv->head_dim;
    const bool q8 = kv->type == KV_INT8 || kv->type == KV_FP8;
    float kbuf[CPU_PAGED_ATTN_MAX_HEAD_DIM], vbuf[CPU_PAGED_ATTN_MAX_HEAD_DIM];
    /* scores (g, n) */
    for (int jj = 0; jj < n; jj++) {
        const size_t row = rows[jj];
        const float ks = q8 ? kv->k_scale[row] * scale : scale;
        if (qq) {
            const int8_t *kr = (const int8_t *)kv->k + row * (size_t)hd;
            for (int i = 0; i < g; i++) {
                const int8_t *c = qq->code + (size_t)i * hd;
                int32_t t = 0;
                for (int e = 0; e < hd; e++) t += (int32_t)c[e] * kr[e];
                sc[i * cap + jj] = (float)t * (qq->scale[i] * ks);
            }
            continue;
        }
        const float *kr = pa_row(kv->type, kv->k, row, hd, kbuf);
        for (int i = 0; i < g; i++) sc[i * cap + jj] = pa_dot(q + (size_t)i * hd, kr, hd) * ks;
    }
    pa_softcap(sc, g, n, cap, softcap);
    /* per head: new max, rescale once, weights (0 past the row's own positions) */
    for (int i = 0; i < g; i++) {
        float *p = part0 + (size_t)i * pstride, *si = sc + i * cap;
        const int ni = row_n ? row_n[i] : n;
        float bm = -INFINITY;
        for (int jj = 0; jj < ni; jj++) bm = si[jj] > bm ? si[jj] : bm;
        if (bm > p[0]) {
            if (p[0] != -INFINITY) {          /* first chunk: acc and l are 0 */
                float corr = expf(p[0] - bm);
                p[1] *= corr;
                pa_scale(p + 2, corr, hd);
            }
            p[0] = bm;
        }
        float l = p[1];
        for (int jj = 0; jj < ni; jj++) {
            si[jj] = expf(si[jj] - p[0]);
            l += si[jj];
        }
        p[1] = l;
        for (int jj = ni; jj < n; jj++) si[jj] = 0;
    }
    if (qq) {                            /* integer V: struct pa_q8 */
        int16_t u[PA_Q8_MAX_G * (PA_CHUNK + 1)];
        float ws[PA_Q8_MAX_G];
        for (int i = 0; i < g; i++)
            for (int jj = 0; jj < n; jj++) sc[i * cap + jj] *= kv->v_scale[rows[jj]];
        pa_quant_w16(sc, g, n, cap, u, PA_CHUNK + 1, ws);
        for (int i = 0; i < g; i++) {
            float *acc = part0 + (size_t)i * pstride + 2;
            for (int e = 0; e < hd; e++) {
                int32_t t = 0;
                for (int jj = 0; jj < n; jj++)
                    t += (int32_t)u[i * (PA_CHUNK + 1) + jj] * ((const int8_t *)kv->v)[rows[jj] * (size_t)hd + e];
                acc[e] = fmaf(ws[i], (float)t, acc[e]);
            }
        }
        return;
    }
    /* accumulate V */
    for (int jj = 0; jj < n; jj++) {
        const size_t row = rows[jj];
        const float *vr = pa_row(kv->type, kv->v, row, hd, vbuf);
        const float vs = q8 ? kv->v_scale[row] : 1.0f;
        for (int i = 0; i < g; i++)
            if (!row_n || jj < row_n[i]) pa_axpy(part0 + (size_t)i * pstride + 2, sc[i * cap + jj] * vs, vr, hd);
    }
}

/* Whether int8 K's scores are integer products (struct pa_q8): the queries quantized per item. */
static bool pa_uses_q8(const struct paged_attn_args *a) {
    const int g = a->n_head / a->n_head_kv, hd = a->head_dim;
    return a->kv.type == KV_INT8 && hd % 32 == 0 && g <= PA_Q8_MAX_G && g * hd <= PA_Q8_MAX_BYTES;
}

/* The steps of positions [c0, p1) for the rows q (g, hd) and their running
 * partials part0 (pstride apart): steps end at multiples of cap and at p1,
 * wherever blocks end, as a single token's walk from its split's start.
 * row_end (NULL: p1 for every row): where each row's positions end, <= p1;
 * a step gives each row those of its positions before that. */
static void pa_steps(const struct pa_job *j, const int32_t *table, int hk, int c0, int p1, int g, const int *row_end,
                     const float *q, const struct pa_q8 *qq, float *part0, size_t pstride, float *sc, int cap) {
    const struct paged_attn_args *a = j->a;
    const struct kv_layer_view *kv = &a->kv;
    size_t rows[2][PA_CHUNK];
    int cur = 0, n = c0 < p1 ? (c0 / cap + 1) * cap - c0 : 0;
    n = n < p1 - c0 ? n : p1 - c0;
    if (n > 0) pa_rows(kv, table, hk, c0, n, rows[cur]);
    while (n > 0) {
        const int c1 = c0 + n, nn = p1 - c1 < cap ? p1 - c1 : cap;
        /* the next step's rows, for the step to prefetch while it computes: blocks lie
         * anywhere in the pool, so the hardware prefetcher cannot guess them */
        if (nn > 0) pa_rows(kv, table, hk, c1, nn, rows[cur ^ 1]);
        int row_n[PA_GROUP_ROWS];
        bool short_rows = false;
        for (int i = 0; row_end && i < g; i++) {
            row_n[i] = row_end[i] <= c0 ? 0 : row_end[i] < c1 ? row_end[i] - c0 : n;
            short_rows = short_rows || row_n[i] < n;
        }
        j->chunk(kv, rows[cur], n, g, short_rows ? row_n : NULL, q, qq, a->scale, a->softcap, part0, pstride, sc,
                 cap, rows[cur ^ 1], nn > 0 ? nn : 0);
        cur ^= 1;
        c0 = c1;
        n = nn;
    }
}

/* One work item: tokens t0 .. t0 + nt - 1 (one token, or a prefill group),
 * kv head hk, split s of ns. */
static void pa_item(const struct pa_job *j, int t0, int nt, int hk, int s, int ns, int ith) {
    const struct paged_attn_args *a = j->a;
    const int hd = a->head_dim, nkv = a->n_head_kv, g = a->n_head / nkv, rows_g = nt * g;
    /* sliding window: the splits cover only positions > pos - window (pa_split_range); an empty
     * split stays (m = -inf, l = 0) and weighs nothing in the merge */
    int p0, p1;
    pa_split_range(a, a->pos[t0] + 1, s, &p0, &p1);   /* a group's tokens start alike; p1: the last one's (below) */
    const int cap = PA_SCORES / g < PA_CHUNK ? PA_SCORES / g : PA_CHUNK;
    const int32_t *table = a->block_table + (size_t)a->seq[t0] * (size_t)a->max_blocks;
    const size_t tstride = (size_t)a->n_head * (size_t)hd;                  /* next token's queries */
    const float *q = a->q + (size_t)t0 * tstride + (size_t)hk * (size_t)g * (size_t)hd;   /* (g, hd) */
    const size_t pstride = pa_local_stride(hd);                     /* the same, while the item runs */
    float *const part0 = j->local + (size_t)ith * j->local_floats + PA_LOCAL_LEAD;   /* (nt * g) partials */
    float sc[PA_SCORES];                                            /* (nt * g, cap): scores, then weights */
    _Alignas(64) int8_t q8[PA_Q8_MAX_BYTES];                        /* int8 K: the queries' codes */
    float q8s[PA_Q8_MAX_G];
    int32_t q8sum[PA_Q8_MAX_G];
    const struct pa_q8 qq = { q8, q8s, q8sum };
    const bool use_q8 = pa_uses_q8(a);   /* never grouped (cpu_paged_attention_with) */
    if (use_q8) j->quant(q, g, hd, q8, q8s, q8sum);
    _Alignas(64) float qg[PA_GROUP_ROWS * PA_GROUP_HD];             /* a group's queries, (nt * g, hd) */
    if (nt > 1) {
        for (int i = 0; i < nt; i++) memcpy(qg + (size_t)i * g * hd, q + (size_t)i * tstride, (size_t)g * hd * sizeof *q);
        q = qg;
    }

    for (int i = 0; i < rows_g; i++) {
        float *p = part0 + (size_t)i * pstride;
        p[0] = -INFINITY;
        p[1] = 0;
        memset(p + 2, 0, (size_t)hd * sizeof *p);
    }
    /* all the group's rows in each step, a row stopping where its token's positions end (the
     * group's splits start alike and end alike but for the last: pa_joins) */
    int row_end[PA_GROUP_ROWS];
    for (int i = 0; nt > 1 && i < nt; i++) {
        int q0, q1;
        pa_split_range(a, a->pos[t0 + i] + 1, s, &q0, &q1);
        KV_ASSERT(q0 == p0 && rows_g <= PA_GROUP_ROWS);
        for (int h = 0; h < g; h++) row_end[i * g + h] = q1;
        p1 = q1;   /* the last token's */
    }
    pa_steps(j, table, hk, p0, p1, rows_g, nt > 1 ? row_end : NULL, q, use_q8 ? &qq : NULL, part0, pstride, sc, cap);
    for (int i = 0; i < nt; i++)   /* one split: the output at once; several: the partials, for the merge */
        for (int h = 0; h < g; h++) {
            const float *p = part0 + ((size_t)i * g + (size_t)h) * pstride;
            if (ns == 1) pa_merge_from(a, t0 + i, hk * g + h, p, 0, 1);
            else memcpy(pa_partial(j, t0 + i, hk * g + h, s), p, ((size_t)hd + 2) * sizeof *p);
        }
}

/* Chunk c of the item list (unit, hk, s) in that order: item_off[u] is the
 * index of unit u's first item (nkv * its splits each); unit u is tokens
 * unit_tok[u] .. unit_tok[u + 1] - 1. */
static void pa_items_chunk(void *arg, long c, int ith) {
    const struct pa_job *j = arg;
    const struct paged_attn_args *a = j->a;
    c = j->item_off[j->n_units] - 1 - c;       /* the last units first: a prefill's longest contexts, so
                                                  the short ones even the threads out at the end */
    int lo = 0, hi = j->n_units - 1;            /* the unit whose items contain c */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (j->item_off[mid] <= c) lo = mid; else hi = mid - 1;
    }
    const int t = j->unit_tok[lo], ns = pa_n_split(a, a->pos[t] + 1);
    const long k = c - j->item_off[lo];
    pa_item(j, t, j->unit_tok[lo + 1] - t, (int)(k / ns), (int)(k % ns), ns, ith);
}

/* Merge chunk c: the heads of the c-th token with more than one split. */
static void pa_merge_chunk(void *arg, long c, int ith) {
    (void)ith;
    const struct pa_job *j = arg;
    const int t = j->merge_tok[c], ns = pa_n_split(j->a, j->a->pos[t] + 1);
    for (int h = 0; h < j->a->n_head; h++) pa_merge(j, t, h, ns);
}

/* Whether token t can join the prefill group that starts at token t0: the
 * same sequence, the next position, the same splits over the same ranges
 * (under a window: one split and no position yet outside the window). */
static bool pa_joins(const struct paged_attn_args *a, int t0, int t) {
    const int L = a->pos[t] + 1;
    return a->seq[t] == a->seq[t0] && a->pos[t] == a->pos[t0] + (t - t0) &&
           pa_n_split(a, L) == pa_n_split(a, a->pos[t0] + 1) &&
           (a->window <= 0 || (pa_n_split(a, L) == 1 && L <= a->window));
}

int cpu_paged_attention_with(struct backend_ctx *c, const struct paged_attn_args *a, pa_chunk_fn *chunk,
                             pa_quant_fn *quant) {
    struct cpu_ctx *cc = cpu_ctx_of(c);
    KV_ASSERT(a->n_head_kv > 0 && a->n_head % a->n_head_kv == 0 && a->n_head / a->n_head_kv <= PA_SCORES);
    KV_ASSERT(a->head_dim > 0 && a->head_dim <= CPU_PAGED_ATTN_MAX_HEAD_DIM && a->head_dim == a->kv.head_dim);
    KV_ASSERT(a->n_head_kv == a->kv.n_head_kv && a->kv.block_size > 0);
    if (a->n_tokens <= 0) return 0;
    if (a->n_tokens > cc->max_tokens) {
        LOG_ERR("paged attention over %d tokens: the context was sized for %d", a->n_tokens, cc->max_tokens);
        return KVLLM_ERANGE;
    }
    struct pa_job j = { .a = a, .s_max = 1, .chunk = chunk, .quant = quant ? quant : pa_quant_q8,
                        .partials = cc->partials, .local = cc->pa_local, .local_floats = cc->pa_local_floats };
    const int g = a->n_head / a->n_head_kv;
    /* tokens per prefill group: up to PA_GROUP_ROWS query rows (not with int8 K's integer scores) */
    const int group = !pa_uses_q8(a) && a->head_dim <= PA_GROUP_HD && g <= PA_GROUP_ROWS ? PA_GROUP_ROWS / g : 1;
    KV_ASSERT((size_t)(group * g > a->n_head ? group * g : a->n_head) * pa_local_stride(a->head_dim) +
              PA_LOCAL_LEAD <= cc->pa_local_floats);
    long *off = cc->pa_off;
    int *merge = cc->pa_merge, *unit = cc->pa_unit;
    long n_merge = 0;
    for (int t = 0; t < a->n_tokens; t++) {
        if (a->pos[t] < 0 || a->pos[t] >= cc->max_ctx) {
            LOG_ERR("paged attention at position %d: the context was sized for %d", a->pos[t], cc->max_ctx);
            return KVLLM_ERANGE;
        }
        const int ns = pa_n_split(a, a->pos[t] + 1);
        j.s_max = ns > j.s_max ? ns : j.s_max;
        if (ns > 1) merge[n_merge++] = t;
    }
    off[0] = 0;
    for (int t = 0; t < a->n_tokens;) {
        int nt = 1;
        while (nt < group && t + nt < a->n_tokens && pa_joins(a, t, t + nt)) nt++;
        unit[j.n_units] = t;
        off[j.n_units + 1] = off[j.n_units] + (long)a->n_head_kv * pa_n_split(a, a->pos[t] + 1);
        j.n_units++;
        t += nt;
    }
    unit[j.n_units] = a->n_tokens;
    KV_ASSERT(paged_attn_scratch_floats(a->n_tokens, a->n_head, a->head_dim, j.s_max * PAGED_ATTN_SPLIT) <=
              cc->n_partials);
    j.item_off = off;
    j.unit_tok = unit;
    j.merge_tok = merge;
    threadpool_run_chunks(cc->pool, off[j.n_units], pa_items_chunk, &j);
    if (n_merge) threadpool_run_chunks(cc->pool, n_merge, pa_merge_chunk, &j);
    return 0;
}

int cpu_paged_attention(struct backend_ctx *c, const struct paged_attn_args *a) {
    return cpu_paged_attention_with(c, a, pa_chunk_scalar, NULL);
}

/* ---- kv_shift ---- */

struct shift_job {
    struct cpu_ctx *cc;
    const struct kv_layer_view *layers;
    const int32_t *src, *dst;
    int n, delta;
    const struct rope_params *p;
};

/* Chunk: one layer, its moves in order (a layer's moves may depend on one
 * another; layers never do).  The rotation is cpu_rope's arithmetic with
 * the position delta: angles in double, cos/sin rounded to f32, one f32
 * rotation per pair. */
static void shift_layer(void *arg, long il, int ith) {
    const struct shift_job *j = arg;
    const struct kv_layer_view *kv = &j->layers[il];
    const struct rope_params *p = j->p;
    const int hd = kv->head_dim, half = p->n_rot / 2;
    const int step = p->neox ? 1 : 2, other = p->neox ? half : 1;
    const float *ff = p->freq_factors ? p->freq_factors->data : NULL;
    float *buf = j->cc->scratch + (size_t)ith * (size_t)j->cc->scratch_cols;   /* (head_dim) */
    float *cs = buf + hd, *sn = cs + half;                                       /* (half) each */
    for (int i = 0; i < half; i++) {
        double ang = (double)j->delta * pow((double)p->theta, -2.0 * i / (double)p->n_rot) * rope_pair_scale(p, i);
        if (ff) ang /= (double)ff[i];
        cs[i] = (float)cos(ang);
        sn[i] = (float)sin(ang);
    }
    const size_t eb = kv_elem_bytes(kv->type), row_bytes = (size_t)hd * eb;
    for (int m = 0; m < j->n; m++) {
        for (int h = 0; h < kv->n_head_kv; h++) {
            const size_t rs = kv_row(kv, (size_t)j->src[m], h), rd = kv_row(kv, (size_t)j->dst[m], h);
            const float *x = pa_row(kv->type, kv->k, rs, hd, buf);
            if (x != buf) memcpy(buf, x, (size_t)hd * sizeof *buf);
            if (kv->k_scale)
                for (int e = 0; e < hd; e++) buf[e] *= kv->k_scale[rs];
            for (int i = 0; i < half; i++) {
                float *q = buf + (size_t)i * step;
                float a = q[0], b = q[other];
                q[0] = a * cs[i] - b * sn[i];
                q[other] = a * sn[i] + b * cs[i];
            }
            store_row(kv, kv->k, kv->k_scale, rd, buf, f16_row);
            if (rd == rs) continue;
            memcpy((uint8_t *)kv->v + rd * row_bytes, (const uint8_t *)kv->v + rs * row_bytes, row_bytes);
            if (kv->v_scale) kv->v_scale[rd] = kv->v_scale[rs];
        }
    }
}

int cpu_kv_shift(struct backend_ctx *c, const struct kv_layer_view *layers, int n_layer, const int32_t *src,
                 const int32_t *dst, int n, int delta, const struct rope_params *p) {
    struct cpu_ctx *cc = cpu_ctx_of(c);
    if (n <= 0 || n_layer <= 0) return 0;
    const int hd = layers[0].head_dim;
    if (p->n_rot < 0 || p->n_rot % 2 || p->n_rot > hd || (int64_t)hd + p->n_rot > cc->scratch_cols) {
        LOG_ERR("kv_shift: n_rot %d with head_dim %d (scratch of %lld floats)", p->n_rot, hd,
                (long long)cc->scratch_cols);
        return KVLLM_EINVAL;
    }
    for (int m = 0; m < n; m++)
        if (src[m] < 0 || dst[m] < 0) {
            LOG_ERR("kv_shift: move %d from slot %d to slot %d", m, src[m], dst[m]);
            return KVLLM_EINVAL;
        }
    struct shift_job j = { cc, layers, src, dst, n, delta, p };
    threadpool_run_chunks(cc->pool, n_layer, shift_layer, &j);
    return 0;
}
