/* attn_avx2.c — the online-softmax step of paged attention (pa_chunk_fn,
 * see cpu_internal.h) with AVX2 + FMA + F16C.  Compiled with those -m flags
 * alone; cpu.c installs cpu_paged_attention_avx2 only when the CPU has them.
 *
 * Per step: the chunk's K rows are made f32 once (f16 / bf16 widened,
 * 8-bit codes converted) into an L1-sized buffer; the scores of the g query
 * heads sharing the kv head are a small matrix product computed in
 * register tiles of 4 heads x 2 rows; the softmax weights come from a
 * vectorized exp; the V rows are made f32 once and the heads' accumulators
 * sweep them in tiles of 4 heads x 16 dims.  Tiles keep loads to about
 * three per four FMAs (the untiled step loaded an operand per FMA and
 * spent 1.4x as long on the same context).
 *
 * Determinism: the arithmetic depends only on the step's arguments (fixed
 * lane layout and reduction order), so attention stays bit-identical for
 * any thread count and batch composition, as the scalar step is. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backend/cpu/avx2_util.h"
#include <math.h>

#define MAX_HD 256        /* larger heads take the scalar step */
#define MAX_N CPU_PA_CHUNK

/* Row `row` of K or V as f32: in place for f32, else converted into buf
 * (8-bit codes without their scale).  hd is a multiple of 8. */
static const float *row_f32(enum kv_type type, const void *base, size_t row, int hd, float *buf) {
    const size_t e0 = row * (size_t)hd;
    switch (type) {
    case KV_F32: return (const float *)base + e0;
    case KV_F16:
        for (int i = 0; i < hd; i += 8)
            _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + e0 + i))));
        return buf;
    case KV_BF16:
        for (int i = 0; i < hd; i += 8)
            _mm256_storeu_ps(buf + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
                _mm_loadu_si128((const __m128i *)((const uint16_t *)base + e0 + i))), 16)));
        return buf;
    case KV_INT8:
        for (int i = 0; i < hd; i += 8)
            _mm256_storeu_ps(buf + i, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i *)((const int8_t *)base + e0 + i)))));
        return buf;
    default: {
        const uint8_t *s = (const uint8_t *)base + e0;
        for (int i = 0; i < hd; i++) buf[i] = cpu_fp8_to_f32(s[i]);
        return buf;
    }
    }
}

/* ---- scores: S (g, n) = Q (g, hd) · Kᵀ, register-blocked ---- */

/* Scores of RH (1..4) heads q (RH, hd) against RP (1..2) rows kr:
 * sc[h * cap + p] = (q_h · kr[p]) * rs[p].  Each (head, row) has one
 * 8-lane accumulator over hd in ascending order, reduced by avx2_hsum4, so
 * a score does not depend on the tile that computes it.  Per 8 dims: RP
 * row loads and RH query loads feed RH * RP FMAs (a 4 x 2 tile: 6 loads,
 * 8 FMAs; 4 x 3 would need all 16 registers, and GCC spills one). */
ALWAYS_INLINE void score_tile(const int RH, const int RP, const float *q, int hd, const float *const *kr,
                              const float *rs, float *sc, int cap) {
    __m256 a[4][2];
    for (int h = 0; h < 4; h++)
        for (int p = 0; p < RP; p++) a[h][p] = _mm256_setzero_ps();
    for (int k = 0; k < hd; k += 8) {
        __m256 kv[2];
        for (int p = 0; p < RP; p++) kv[p] = avx2_reg(_mm256_loadu_ps(kr[p] + k));
        for (int h = 0; h < RH; h++) {
            const __m256 qv = avx2_reg(_mm256_loadu_ps(q + (size_t)h * hd + k));
            for (int p = 0; p < RP; p++) a[h][p] = _mm256_fmadd_ps(qv, kv[p], a[h][p]);
        }
    }
    for (int p = 0; p < RP; p++) {
        float t[4];
        _mm_storeu_ps(t, _mm_mul_ps(avx2_hsum4(a[0][p], a[1][p], a[2][p], a[3][p]), _mm_set1_ps(rs[p])));
        for (int h = 0; h < RH; h++) sc[(size_t)h * cap + p] = t[h];
    }
}

static void score_tile_any(int rh, int rp, const float *q, int hd, const float *const *kr, const float *rs,
                           float *sc, int cap) {
    switch (rh * 4 + rp) {
    case 4 * 4 + 2: score_tile(4, 2, q, hd, kr, rs, sc, cap); break;
    case 4 * 4 + 1: score_tile(4, 1, q, hd, kr, rs, sc, cap); break;
    case 3 * 4 + 2: score_tile(3, 2, q, hd, kr, rs, sc, cap); break;
    case 3 * 4 + 1: score_tile(3, 1, q, hd, kr, rs, sc, cap); break;
    case 2 * 4 + 2: score_tile(2, 2, q, hd, kr, rs, sc, cap); break;
    case 2 * 4 + 1: score_tile(2, 1, q, hd, kr, rs, sc, cap); break;
    case 1 * 4 + 2: score_tile(1, 2, q, hd, kr, rs, sc, cap); break;
    default:        score_tile(1, 1, q, hd, kr, rs, sc, cap); break;
    }
}

static void scores(int g, const float *q, int hd, const float *const *kr, const float *rs, int n, float *sc,
                   int cap) {
    for (int h = 0; h < g; h += 4) {
        const int rh = g - h < 4 ? g - h : 4;
        for (int p = 0; p < n; p += 2)
            score_tile_any(rh, n - p < 2 ? n - p : 2, q + (size_t)h * hd, hd, kr + p, rs + p,
                           sc + (size_t)h * cap + p, cap);
    }
}

/* ---- values: acc_h += Σ_p w[h][p] V[p], register-blocked ---- */

/* RH (1..4) heads' accumulators acc[h] (8 RD floats from dim d0, RD 1..2)
 * += Σ_p w[h * cap + p] * vr[p][d0 ..], p ascending, one FMA per element
 * per row.  Per row: RD row loads and RH weight broadcasts feed RH * RD
 * FMAs. */
ALWAYS_INLINE void value_tile(const int RH, const int RD, float *const *acc, int d0, const float *const *vr,
                              const float *w, int cap, int n) {
    __m256 a[4][2];
    for (int h = 0; h < RH; h++)
        for (int d = 0; d < RD; d++) a[h][d] = _mm256_loadu_ps(acc[h] + d0 + 8 * d);
    for (int p = 0; p < n; p++) {
        __m256 vv[2];
        for (int d = 0; d < RD; d++) vv[d] = avx2_reg(_mm256_loadu_ps(vr[p] + d0 + 8 * d));
        for (int h = 0; h < RH; h++) {
            const __m256 wv = _mm256_broadcast_ss(&w[(size_t)h * cap + p]);
            for (int d = 0; d < RD; d++) a[h][d] = _mm256_fmadd_ps(wv, vv[d], a[h][d]);
        }
    }
    for (int h = 0; h < RH; h++)
        for (int d = 0; d < RD; d++) _mm256_storeu_ps(acc[h] + d0 + 8 * d, a[h][d]);
}

static void value_tile_any(int rh, int rd, float *const *acc, int d0, const float *const *vr, const float *w,
                           int cap, int n) {
    switch (rh * 2 + rd) {
    case 4 * 2 + 2: value_tile(4, 2, acc, d0, vr, w, cap, n); break;
    case 4 * 2 + 1: value_tile(4, 1, acc, d0, vr, w, cap, n); break;
    case 3 * 2 + 2: value_tile(3, 2, acc, d0, vr, w, cap, n); break;
    case 3 * 2 + 1: value_tile(3, 1, acc, d0, vr, w, cap, n); break;
    case 2 * 2 + 2: value_tile(2, 2, acc, d0, vr, w, cap, n); break;
    case 2 * 2 + 1: value_tile(2, 1, acc, d0, vr, w, cap, n); break;
    case 1 * 2 + 2: value_tile(1, 2, acc, d0, vr, w, cap, n); break;
    default:        value_tile(1, 1, acc, d0, vr, w, cap, n); break;
    }
}

static void values(int g, float *part0, size_t pstride, int hd, const float *const *vr, const float *w, int n,
                   int cap) {
    for (int h = 0; h < g; h += 4) {
        const int rh = g - h < 4 ? g - h : 4;
        float *acc[4];
        for (int i = 0; i < rh; i++) acc[i] = part0 + (size_t)(h + i) * pstride + 2;
        for (int d0 = 0; d0 < hd; d0 += 16)
            value_tile_any(rh, (hd - d0) / 8 < 2 ? 1 : 2, acc, d0, vr, w + (size_t)h * cap, cap, n);
    }
}

/* Per head: the step's max, the partial rescaled once if it grew, and the
 * scores turned into weights exp(s - m) (in place), summed into l. */
static void softmax_step(int g, float *part0, size_t pstride, int hd, float *sc, int cap, int n) {
    for (int i = 0; i < g; i++) {
        float *p = part0 + (size_t)i * pstride, *si = sc + (size_t)i * cap;
        __m256 vm = _mm256_set1_ps(-INFINITY);
        int jj = 0;
        for (; jj + 8 <= n; jj += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(si + jj));
        float bm = avx2_hmax(vm);
        for (; jj < n; jj++) bm = si[jj] > bm ? si[jj] : bm;
        if (bm > p[0]) {
            if (p[0] != -INFINITY) {          /* first step: acc and l are 0 */
                const __m256 corr = _mm256_set1_ps(expf(p[0] - bm));
                p[1] *= _mm256_cvtss_f32(corr);
                for (int k = 0; k < hd; k += 8)
                    _mm256_storeu_ps(p + 2 + k, _mm256_mul_ps(_mm256_loadu_ps(p + 2 + k), corr));
            }
            p[0] = bm;
        }
        const __m256 m = _mm256_set1_ps(p[0]);
        __m256 vl = _mm256_setzero_ps();
        for (jj = 0; jj + 8 <= n; jj += 8) {
            __m256 w = avx2_exp_neg(_mm256_sub_ps(_mm256_loadu_ps(si + jj), m));
            _mm256_storeu_ps(si + jj, w);
            vl = _mm256_add_ps(vl, w);
        }
        if (jj < n) {
            const __m256i mk = avx2_lanes(n - jj);
            __m256 x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(si + jj, mk),
                                        _mm256_castsi256_ps(mk));
            __m256 w = avx2_exp_neg(_mm256_sub_ps(x, m));
            _mm256_maskstore_ps(si + jj, mk, w);
            vl = _mm256_add_ps(vl, w);
        }
        p[1] += avx2_hsum(vl);
    }
}

/* The cache lines of K or V row `row` (rb bytes). */
ALWAYS_INLINE void prefetch_row(const void *base, size_t row, size_t rb) {
    const char *p = (const char *)base + row * rb;
    for (size_t o = 0; o < rb; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

static void chunk_avx2(const struct kv_layer_view *kv, const size_t *rows, int n, int g, const float *q,
                       float scale, float softcap, float *part0, size_t pstride, float *sc, int cap,
                       const size_t *pf, int npf) {
    const int hd = kv->head_dim;
    const bool q8 = kv->type == KV_INT8 || kv->type == KV_FP8;
    float buf[MAX_N * MAX_HD];
    const float *r[MAX_N];
    float rs[MAX_N];             /* per-position factor: score scale, then V scale */

    const size_t rb = (size_t)hd * kv_elem_bytes(kv->type);
    /* the next step's K and V, one row per row read here: spread out, the
     * requests fit in the miss queues; a step of lead hides the latency */
    for (int jj = 0; jj < n; jj++) {
        if (jj < npf) prefetch_row(kv->k, pf[jj], rb);
        r[jj] = row_f32(kv->type, kv->k, rows[jj], hd, buf + (size_t)jj * hd);
        rs[jj] = q8 ? kv->k_scale[rows[jj]] * scale : scale;
    }
    for (int jj = n; jj < npf; jj++) prefetch_row(kv->k, pf[jj], rb);
    scores(g, q, hd, r, rs, n, sc, cap);
    pa_softcap(sc, g, n, cap, softcap);
    softmax_step(g, part0, pstride, hd, sc, cap, n);
    for (int jj = 0; jj < n; jj++) {
        if (jj < npf) prefetch_row(kv->v, pf[jj], rb);
        r[jj] = row_f32(kv->type, kv->v, rows[jj], hd, buf + (size_t)jj * hd);
    }
    for (int jj = n; jj < npf; jj++) prefetch_row(kv->v, pf[jj], rb);
    if (q8)                      /* 8-bit V: the row's scale joins its weight */
        for (int i = 0; i < g; i++)
            for (int jj = 0; jj < n; jj++) sc[(size_t)i * cap + jj] *= kv->v_scale[rows[jj]];
    values(g, part0, pstride, hd, r, sc, n, cap);
}

int cpu_paged_attention_avx2(struct backend_ctx *c, const struct paged_attn_args *a) {
    if (a->head_dim % 8 != 0 || a->head_dim > MAX_HD) return cpu_paged_attention(c, a);
    return cpu_paged_attention_with(c, a, chunk_avx2);
}

#else /* not an x86-64 build with the AVX2 flags */

int cpu_paged_attention_avx2(struct backend_ctx *c, const struct paged_attn_args *a) {
    return cpu_paged_attention(c, a);
}

#endif
