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
 * int8 K and V with quantized queries (struct pa_q8, cpu_internal.h):
 * integer scores (vpmaddubsw on |q| and k with q's sign) and value sums
 * (vpmaddwd on pairs of positions), then struct pa_q8's floats.
 *
 * Determinism: the arithmetic depends only on the step's arguments (fixed
 * lane layout and reduction order), so attention stays bit-identical for
 * any thread count and batch composition, as the scalar step is. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backend/cpu/avx2_util.h"
#include "core/core.h"
#include <math.h>
#include <string.h>

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

/* ---- scores with int8 K and quantized queries (struct pa_q8) ---- */

/* Σ_d c[d] * k[d] over hd (a multiple of 8) int8s, exactly: |c| times k
 * with c's sign (both within ±127, so vpmaddubsw's pairs stay below 2^15),
 * pairs of pairs in 32 bits. */
static int32_t dot_q8(const int8_t *c, const int8_t *k, int hd) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    int d = 0;
    for (; d + 32 <= hd; d += 32) {
        const __m256i cv = _mm256_loadu_si256((const __m256i *)(c + d));
        const __m256i kv = _mm256_loadu_si256((const __m256i *)(k + d));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(cv), _mm256_sign_epi8(kv, cv)),
                                                      ones));
    }
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    for (; d < hd; d += 8) {
        const __m128i cv = _mm_loadl_epi64((const __m128i *)(c + d)), kv = _mm_loadl_epi64((const __m128i *)(k + d));
        s = _mm_add_epi32(s, _mm_madd_epi16(_mm_maddubs_epi16(_mm_abs_epi8(cv), _mm_sign_epi8(kv, cv)),
                                            _mm_set1_epi16(1)));
    }
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static void scores_q8(const struct kv_layer_view *kv, const size_t *rows, int n, int g, const struct pa_q8 *qq,
                      const float *rs, float *sc, int cap) {
    const int hd = kv->head_dim;
    for (int p = 0; p < n; p++) {
        const int8_t *kr = (const int8_t *)kv->k + rows[p] * (size_t)hd;
        for (int h = 0; h < g; h++)
            sc[(size_t)h * cap + p] = (float)dot_q8(qq->code + (size_t)h * hd, kr, hd) * (qq->scale[h] * rs[p]);
    }
}

/* ---- values with int8 V: struct pa_q8's integer sums ---- */

/* RH (1..4) heads' int32 sums over dims d0 .. d0+15 of the position
 * pairs: per pair, the two rows' codes widened to 16 bits and interleaved
 * (unpack lo: dims 0..3 and 8..11, hi: 4..7 and 12..15), each head's
 * (u[p], u[p+1]) broadcast as a dword, vpmaddwd; then onto acc in dim
 * order by one FMA with ws. */
ALWAYS_INLINE void vtile_q8(const int RH, const int8_t *const *vr, int n, const int16_t *u, const float *ws,
                            float *const *acc, int d0) {
    static const int8_t zero[16];
    __m256i lo[4], hi[4];
    for (int h = 0; h < RH; h++) lo[h] = hi[h] = _mm256_setzero_si256();
    for (int p = 0; p < n; p += 2) {
        const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(vr[p] + d0)));
        const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 1 < n ? vr[p + 1] + d0 : zero)));
        const __m256i xl = _mm256_unpacklo_epi16(a, b), xh = _mm256_unpackhi_epi16(a, b);
        for (int h = 0; h < RH; h++) {
            int32_t pair;
            memcpy(&pair, u + (size_t)h * (MAX_N + 1) + p, sizeof pair);
            const __m256i wv = _mm256_set1_epi32(pair);
            lo[h] = _mm256_add_epi32(lo[h], _mm256_madd_epi16(xl, wv));
            hi[h] = _mm256_add_epi32(hi[h], _mm256_madd_epi16(xh, wv));
        }
    }
    for (int h = 0; h < RH; h++) {
        const __m256 w = _mm256_set1_ps(ws[h]);
        float *o = acc[h] + d0;
        const __m256 s0 = _mm256_cvtepi32_ps(_mm256_permute2x128_si256(lo[h], hi[h], 0x20));
        const __m256 s1 = _mm256_cvtepi32_ps(_mm256_permute2x128_si256(lo[h], hi[h], 0x31));
        _mm256_storeu_ps(o, _mm256_fmadd_ps(w, s0, _mm256_loadu_ps(o)));
        _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(w, s1, _mm256_loadu_ps(o + 8)));
    }
}

/* acc of the g partials from the 16-bit weight codes u (rows MAX_N + 1
 * apart) and factors ws (struct pa_q8); hd a multiple of 32. */
static void values_q8(const struct kv_layer_view *kv, const size_t *rows, int n, int g, const int16_t *u,
                      const float *ws, float *part0, size_t pstride) {
    const int hd = kv->head_dim;
    const int8_t *vr[MAX_N];
    for (int p = 0; p < n; p++) vr[p] = (const int8_t *)kv->v + rows[p] * (size_t)hd;
    for (int h = 0; h < g; h += 4) {
        const int rh = g - h < 4 ? g - h : 4;
        float *acc[4];
        for (int i = 0; i < rh; i++) acc[i] = part0 + (size_t)(h + i) * pstride + 2;
        const int16_t *uh = u + (size_t)h * (MAX_N + 1);
        for (int d0 = 0; d0 < hd; d0 += 16) {
            switch (rh) {
            case 4: vtile_q8(4, vr, n, uh, ws + h, acc, d0); break;
            case 3: vtile_q8(3, vr, n, uh, ws + h, acc, d0); break;
            case 2: vtile_q8(2, vr, n, uh, ws + h, acc, d0); break;
            default: vtile_q8(1, vr, n, uh, ws + h, acc, d0); break;
            }
        }
    }
}

/* ---- values: acc_h += Σ_p w[h][p] V[p], register-blocked ---- */

/* RH (1..4) heads' accumulators acc[h] (8 RD floats from dim d0, RD 1..2)
 * += Σ_p w[h * cap + p] * vr[p][d0 ..], p ascending, one FMA per element
 * per row.  Per row: RD row loads and RH weight broadcasts feed RH * RD
 * FMAs.  rn (NULL: n for all): head h's positions end at rn[h], the later
 * ones' FMAs skipped (a 0 weight times an infinite V would not leave acc). */
ALWAYS_INLINE void value_pos(const int RH, const int RD, __m256 (*a)[2], int d0, const float *vrow,
                             const float *w, int cap, int p, const int *rn) {
    __m256 vv[2];
    for (int d = 0; d < RD; d++) vv[d] = avx2_reg(_mm256_loadu_ps(vrow + d0 + 8 * d));
    for (int h = 0; h < RH; h++) {
        if (rn && p >= rn[h]) continue;
        const __m256 wv = _mm256_broadcast_ss(&w[(size_t)h * cap + p]);
        for (int d = 0; d < RD; d++) a[h][d] = _mm256_fmadd_ps(wv, vv[d], a[h][d]);
    }
}

ALWAYS_INLINE void value_tile(const int RH, const int RD, float *const *acc, int d0, const float *const *vr,
                              const float *w, int cap, int n, const int *rn) {
    __m256 a[4][2];
    int lo = n, hi = rn ? 0 : n;   /* every head takes [0, lo); some of them [lo, hi) */
    for (int h = 0; rn && h < RH; h++) {
        lo = rn[h] < lo ? rn[h] : lo;
        hi = rn[h] > hi ? rn[h] : hi;
    }
    for (int h = 0; h < RH; h++)
        for (int d = 0; d < RD; d++) a[h][d] = _mm256_loadu_ps(acc[h] + d0 + 8 * d);
    int p = 0;
    for (; p < lo; p++) value_pos(RH, RD, a, d0, vr[p], w, cap, p, NULL);
    for (; p < hi; p++) value_pos(RH, RD, a, d0, vr[p], w, cap, p, rn);
    for (int h = 0; h < RH; h++)
        for (int d = 0; d < RD; d++) _mm256_storeu_ps(acc[h] + d0 + 8 * d, a[h][d]);
}

static void value_tile_any(int rh, int rd, float *const *acc, int d0, const float *const *vr, const float *w,
                           int cap, int n, const int *rn) {
    switch (rh * 2 + rd) {
    case 4 * 2 + 2: value_tile(4, 2, acc, d0, vr, w, cap, n, rn); break;
    case 4 * 2 + 1: value_tile(4, 1, acc, d0, vr, w, cap, n, rn); break;
    case 3 * 2 + 2: value_tile(3, 2, acc, d0, vr, w, cap, n, rn); break;
    case 3 * 2 + 1: value_tile(3, 1, acc, d0, vr, w, cap, n, rn); break;
    case 2 * 2 + 2: value_tile(2, 2, acc, d0, vr, w, cap, n, rn); break;
    case 2 * 2 + 1: value_tile(2, 1, acc, d0, vr, w, cap, n, rn); break;
    case 1 * 2 + 2: value_tile(1, 2, acc, d0, vr, w, cap, n, rn); break;
    default:        value_tile(1, 1, acc, d0, vr, w, cap, n, rn); break;
    }
}

static void values(int g, float *part0, size_t pstride, int hd, const float *const *vr, const float *w, int n,
                   int cap, const int *row_n) {
    for (int h = 0; h < g; h += 4) {
        const int rh = g - h < 4 ? g - h : 4;
        float *acc[4];
        for (int i = 0; i < rh; i++) acc[i] = part0 + (size_t)(h + i) * pstride + 2;
        for (int d0 = 0; d0 < hd; d0 += 16)
            value_tile_any(rh, (hd - d0) / 8 < 2 ? 1 : 2, acc, d0, vr, w + (size_t)h * cap, cap, n,
                           row_n ? row_n + h : NULL);
    }
}

/* Per head: the step's max, the partial rescaled once if it grew, and the
 * scores turned into weights exp(s - m) (in place), summed into l; each
 * head over its own row_n[i] positions (NULL: n), the rest weighing 0. */
static void softmax_step(int g, float *part0, size_t pstride, int hd, float *sc, int cap, int n_step,
                         const int *row_n) {
    for (int i = 0; i < g; i++) {
        float *p = part0 + (size_t)i * pstride, *si = sc + (size_t)i * cap;
        const int n = row_n ? row_n[i] : n_step;
        for (int jj = n; jj < n_step; jj++) si[jj] = 0;
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

/* The cache lines of K or V row `row` (rb bytes), into L2 (as
 * attn_q8_avx512.c's, which says why). */
ALWAYS_INLINE void prefetch_row(const void *base, size_t row, size_t rb) {
    const char *p = (const char *)base + row * rb;
    for (size_t o = 0; o < rb; o += 64) _mm_prefetch(p + o, _MM_HINT_T1);
}

static void chunk_avx2(const struct kv_layer_view *kv, const size_t *rows, int n, int g, const int *row_n,
                       const float *q, const struct pa_q8 *qq, float scale, float softcap, float *part0,
                       size_t pstride, float *sc, int cap, const size_t *pf, int npf) {
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
        if (!qq) r[jj] = row_f32(kv->type, kv->k, rows[jj], hd, buf + (size_t)jj * hd);
        rs[jj] = q8 ? kv->k_scale[rows[jj]] * scale : scale;
    }
    for (int jj = n; jj < npf; jj++) prefetch_row(kv->k, pf[jj], rb);
    if (qq)
        scores_q8(kv, rows, n, g, qq, rs, sc, cap);
    else
        scores(g, q, hd, r, rs, n, sc, cap);
    pa_softcap(sc, g, n, cap, softcap);
    KV_ASSERT(!qq || !row_n);
    softmax_step(g, part0, pstride, hd, sc, cap, n, row_n);
    if (qq) {
        for (int jj = 0; jj < npf; jj++) prefetch_row(kv->v, pf[jj], rb);
        for (int i = 0; i < g; i++)
            for (int jj = 0; jj < n; jj++) sc[(size_t)i * cap + jj] *= kv->v_scale[rows[jj]];
        int16_t u[PA_Q8_MAX_G * (MAX_N + 1)];
        float ws[PA_Q8_MAX_G];
        pa_quant_w16(sc, g, n, cap, u, MAX_N + 1, ws);
        values_q8(kv, rows, n, g, u, ws, part0, pstride);
        return;
    }
    for (int jj = 0; jj < n; jj++) {
        if (jj < npf) prefetch_row(kv->v, pf[jj], rb);
        r[jj] = row_f32(kv->type, kv->v, rows[jj], hd, buf + (size_t)jj * hd);
    }
    for (int jj = n; jj < npf; jj++) prefetch_row(kv->v, pf[jj], rb);
    if (q8)                      /* 8-bit V: the row's scale joins its weight */
        for (int i = 0; i < g; i++)
            for (int jj = 0; jj < n; jj++) sc[(size_t)i * cap + jj] *= kv->v_scale[rows[jj]];
    values(g, part0, pstride, hd, r, sc, n, cap, row_n);
}

int cpu_paged_attention_avx2(struct backend_ctx *c, const struct paged_attn_args *a) {
    if (a->head_dim % 8 != 0 || a->head_dim > MAX_HD) return cpu_paged_attention(c, a);
    return cpu_paged_attention_with(c, a, chunk_avx2, NULL);
}

#else /* not an x86-64 build with the AVX2 flags */

int cpu_paged_attention_avx2(struct backend_ctx *c, const struct paged_attn_args *a) {
    return cpu_paged_attention(c, a);
}

#endif
