/* attn_avx512.c — the online-softmax step of paged attention (pa_chunk_fn,
 * see cpu_internal.h) with AVX-512F (+ F16C, FMA): the AVX2 step's
 * arithmetic (attn_avx2.c), bit for bit, in 16-lane registers.  Compiled
 * with those -m flags alone; cpu.c installs cpu_paged_attention_avx512 only
 * when the CPU has them.  Head sizes that are not a multiple of 16 (or
 * above 256) take the AVX2 step itself.
 *
 * Why bit for bit: a step with its own rounding (an earlier version summed
 * each score in one 16-position FMA chain over a transposed K) is as
 * accurate, but flips near-ties that fixed-output checks of the whole model
 * see (test_kld's top-1 agreement, seeded generations); with the AVX2
 * step's results the avx512 set answers exactly as the avx2 set does, and
 * test_backend_paged_attn holds the two equal.
 *
 * Per step (n <= 64 positions, g query heads sharing one kv head):
 *  - K is made f32 (f16 by vcvtph2ps, bf16 by a shift, int8 / fp8 codes
 *    converted without their scale) two rows to a register: lanes 0..7 are
 *    row 2p's dims 8k .. 8k+7 (the AVX2 step's vector), 8..15 row 2p+1's.
 *    f16, bf16 and int8 K with at most 4 heads per kv head are converted
 *    inside the score tile, read in place; otherwise 4 pairs at a time are
 *    widened into an L1-sized buffer that every head tile reads.
 *  - scores: tiles of 4 heads x 4 pairs (16 accumulators; per 8 dims 4 K
 *    loads and 4 query broadcasts feed 16 FMAs, where the AVX2 step's 4 x 2
 *    tile spends 6 loads on 8 FMAs of half the width); each 8-lane half is
 *    the AVX2 step's accumulator, reduced by the same hadds.
 *  - softmax: exp and max on 16 lanes (the AVX2 step's polynomial lane for
 *    lane), the sum l in the AVX2 step's 8-lane order.
 *  - the heads' accumulators sweep the V rows in tiles of 8 heads x 32 dims
 *    (5..8 heads) or 4 heads x 64 dims (1..4): 16 accumulators, per position
 *    2 (4) row loads and 8 (4) weight broadcasts feed 16 FMAs; each element
 *    is one FMA chain over the positions in order, as in the AVX2 step.  f32
 *    V is read in place, f16, bf16 and int8 widened inside the tile for at
 *    most 8 heads per kv head, fp8 (and the others with more heads) widened
 *    into a buffer first.
 *  - the next step's K and V rows (pf) are prefetched a cache line at a time
 *    between the tiles' FMAs: issued in one burst at the start, 256 requests
 *    stalled on the line-fill buffers for a third of the step.
 *
 * Arithmetic of each output (the AVX2 step's, whatever tile computes it, so
 * results depend only on the step's arguments and attention stays
 * bit-identical for any thread count and batch composition):
 *  - score[h][p] = fl(dot * rs[p]): dot sums 8 FMA chains (lane j over dims
 *    j, j+8, ... ascending, from 0) as ((c0+c1)+(c2+c3))+((c4+c5)+(c6+c7));
 *    rs[p] = scale (times k_scale[row] for 8-bit types, rounded first);
 *  - m: max of the step's scores (exact, any order) against the partial's m;
 *    corr = expf(m_old - m) (libm) multiplies l and acc when m grows;
 *  - w[h][p] = exp(score - m) (lane-wise polynomial); l += avx2_hsum of the
 *    8-lane sum of the w in blocks of 8 ascending; 8-bit V: w *= v_scale[row]
 *    after that;
 *  - acc[h][d] = one FMA chain over p = 0 .. n-1 ascending, w[h][p] *
 *    V[p][d], onto the previous acc[h][d].
 * int8 K and V with quantized queries (struct pa_q8, cpu_internal.h) take
 * integer scores and value sums instead (attn_q8_avx512.c, VNNI): exact
 * integers, so any order gives the AVX2 step's; the floats made from them
 * are struct pa_q8's, the softmax as above. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backend/cpu/avx2_util.h"
#include "core/core.h"
#include <math.h>
#include <string.h>
#include <pthread.h>

bool cpu_attn_avx512_built(void) { return true; }

#define MAX_HD 256             /* larger heads take the AVX2 (then scalar) step */
#define MAX_N CPU_PA_CHUNK     /* 64 positions: 32 pairs */

/* v, pinned in a register: GCC otherwise folds a load that several FMAs
 * share into each of them as a memory operand (see avx2_reg). */
ALWAYS_INLINE __m512 reg512(__m512 v) {
    __asm__("" : "+v"(v));
    return v;
}

/* exp(x) for x <= 0, avx2_exp_neg (avx2_util.h) in 16 lanes: Cody-Waite
 * reduction by ln 2, Cephes' degree-6 polynomial; x < -87.3 (and -inf)
 * gives 0. */
ALWAYS_INLINE __m512 exp_neg16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f);
    const __mmask16 ok = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_max_ps(x, lo);
    const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    /* fx >= -126 here, so 2^fx is a normal float */
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(ok, p, _mm512_castsi512_ps(e));
}

/* fp8 e4m3 codes (16, zero-extended) to f32: cpu_fp8_to_f32 lane-wise. */
ALWAYS_INLINE __m512 fp8_16(__m512i c) {
    const __m512i em = _mm512_and_si512(c, _mm512_set1_epi32(0x7f));
    const __m512i nrm = _mm512_add_epi32(_mm512_slli_epi32(em, 20), _mm512_set1_epi32(120 << 23));
    const __m512i sub = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(em), _mm512_set1_ps(0.001953125f)));
    __m512i r = _mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(em, _mm512_set1_epi32(8)), nrm, sub);
    r = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(em, _mm512_set1_epi32(0x7f)), r,
                                _mm512_set1_epi32(0x7fc00000));
    r = _mm512_or_si512(r, _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24));
    return _mm512_castsi512_ps(r);
}

/* Elements e0 .. e0+15 of K or V as f32 (8-bit types: codes, no scale). */
ALWAYS_INLINE __m512 load16(enum kv_type type, const void *base, size_t e0) {
    switch (type) {
    case KV_F32: return _mm512_loadu_ps((const float *)base + e0);
    case KV_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + e0)));
    case KV_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + e0))), 16));
    case KV_INT8:
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)base + e0))));
    default:
        return fp8_16(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((const uint8_t *)base + e0))));
    }
}

/* The next step's K then V rows, one request at a time: the step issues
 * them spread over its own work (a burst of 256 requests stalls on the
 * line-fill buffers: measured, the burst took a third of the step), and
 * flushes the rest at its end.  The cursor keeps the next line's address,
 * so a request costs an add and a compare (recomputing the address from
 * the row index each time cost a quarter of an L2-resident step at
 * head_dim 256; requesting every other line only, for the adjacent-line
 * prefetch to bring the rest, was slower from DRAM: measured). */
struct pf_cursor {
    const char *p, *end;      /* next request, end of its row; p NULL when all are issued */
    const char *base, *v;     /* K until its rows are done, then V */
    const size_t *rows;
    size_t rb;                /* bytes per row */
    int n, row;
};

/* Move to the next row (K's, then V's), or finish. */
static void pf_next_row(struct pf_cursor *c) {
    if (++c->row >= c->n) {
        if (c->base == c->v || c->n == 0) {
            c->p = NULL;
            return;
        }
        c->base = c->v;
        c->row = 0;
    }
    c->p = c->base + c->rows[c->row] * c->rb;
    c->end = c->p + c->rb;
}

static void pf_init(struct pf_cursor *c, const void *k, const void *v, const size_t *rows, int n, size_t rb) {
    *c = (struct pf_cursor){ .base = (const char *)k, .v = (const char *)v, .rows = rows, .rb = rb, .n = n,
                             .row = -1 };
    pf_next_row(c);
}

/* The next k lines, into L2 (as attn_q8_avx512.c's, which says why). */
ALWAYS_INLINE void pf_issue(struct pf_cursor *c, int k) {
    for (; k > 0 && c->p; k--) {
        _mm_prefetch(c->p, _MM_HINT_T1);
        c->p += 64;
        if (c->p >= c->end) pf_next_row(c);
    }
}

/* Dims k .. k+7 of K row r0 (8-bit types: codes, no scale) in lanes 0..7
 * and of row r1 in lanes 8..15. */
ALWAYS_INLINE __m512 load8x2(enum kv_type type, const void *r0, const void *r1, int k) {
    switch (type) {
    case KV_F32: {
        const __m256 hi = _mm256_loadu_ps((const float *)r1 + k);
        return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps((const float *)r0 + k))),
                                                   _mm256_castps_pd(hi), 1));
    }
    case KV_F16:
    case KV_BF16: {
        const __m256i x = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)((const uint16_t *)r0 + k))),
                                                  _mm_loadu_si128((const __m128i *)((const uint16_t *)r1 + k)), 1);
        return type == KV_F16 ? _mm512_cvtph_ps(x) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
    }
    case KV_INT8: {
        const __m128i x = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)((const int8_t *)r0 + k)),
                                             _mm_loadl_epi64((const __m128i *)((const int8_t *)r1 + k)));
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x));
    }
    default: {
        const __m128i x = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)((const uint8_t *)r0 + k)),
                                             _mm_loadl_epi64((const __m128i *)((const uint8_t *)r1 + k)));
        return fp8_16(_mm512_cvtepu8_epi32(x));
    }
    }
}

/* Zero bits of every type: the missing second row of an odd step's last
 * pair (its lanes are 0, as the AVX2 step's). */
static const float k_zero_row[MAX_HD];

/* K rows rows[0 .. n) into kp as pairs: for pair P and dims 8k .. 8k+7,
 * the 16 floats at kp + (P * hd / 8 + k) * 16 are row 2P's eight, then
 * row 2P+1's (0 past n) — the AVX2 step's 8-lane K vectors, two to a
 * register. */
ALWAYS_INLINE void widen_kp(enum kv_type type, const void *base, const size_t *rows, int n, int hd, float *kp,
                            struct pf_cursor *pf) {
    const size_t rb = (size_t)hd * kv_elem_bytes(type);
    for (int p = 0; p < n; p += 2) {
        const void *r0 = (const char *)base + rows[p] * rb;
        const void *r1 = p + 1 < n ? (const char *)base + rows[p + 1] * rb : (const void *)k_zero_row;
        float *dst = kp + (size_t)(p / 2) * (size_t)hd * 2;
        for (int k = 0; k < hd; k += 8) _mm512_store_ps(dst + 2 * k, load8x2(type, r0, r1, k));
        pf_issue(pf, 1);
    }
}

static void widen_kp_any(enum kv_type type, const void *base, const size_t *rows, int n, int hd, float *kp,
                         struct pf_cursor *pf) {
    switch (type) {
    case KV_F32: widen_kp(KV_F32, base, rows, n, hd, kp, pf); break;
    case KV_F16: widen_kp(KV_F16, base, rows, n, hd, kp, pf); break;
    case KV_BF16: widen_kp(KV_BF16, base, rows, n, hd, kp, pf); break;
    case KV_INT8: widen_kp(KV_INT8, base, rows, n, hd, kp, pf); break;
    default: widen_kp(KV_FP8, base, rows, n, hd, kp, pf); break;
    }
}

/* ---- scores: S (g, n) = Q (g, hd) · Kᵀ, two positions per register ---- */

/* _mm256_hadd_ps in each 256-bit half, bit for bit: [a0+a1, a2+a3, b0+b1,
 * b2+b3] per 128-bit lane. */
ALWAYS_INLINE __m512 hadd512(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xdd));
}

/* Scores of RH (1..4) heads q (RH, hd) against RP (1..4) pairs of rows:
 * from kp (widened pairs; KT KV_TYPE_COUNT_) or the rows kr[2p], kr[2p + 1]
 * of type KT read in place: sc[h * cap + p] = (q_h · k_p) * rs[p] for
 * p < n.  The AVX2
 * step's arithmetic, two positions per register: each (head, position) has
 * an 8-lane accumulator over hd in ascending order (lanes 0..7 of a
 * register for the pair's first row, 8..15 for its second), reduced in
 * avx2_hsum4's order by the same hadds per 256-bit half. */
ALWAYS_INLINE void score_tile(const int RH, const int RP, const enum kv_type KT, const float *q, int hd,
                              const float *kp, const void *const *kr, const float *rs, int n, float *sc,
                              int cap, struct pf_cursor *pf) {
    const bool in_place = KT != KV_TYPE_COUNT_;
    const void *r[8];          /* kr in locals: the stores of pf_issue may alias kr[], which was reloaded per 8 dims */
    for (int i = 0; i < 2 * RP; i++) r[i] = in_place ? kr[i] : NULL;
    __m512 a[4][4];
    for (int h = 0; h < RH; h++)
        for (int p = 0; p < RP; p++) a[h][p] = _mm512_setzero_ps();
    const size_t pstride = (size_t)hd * 2;
    for (int k = 0; k < hd; k += 8) {
        __m512 kv[4];
        for (int p = 0; p < RP; p++)
            kv[p] = in_place ? load8x2(KT, r[2 * p], r[2 * p + 1], k)
                             : reg512(_mm512_load_ps(kp + (size_t)p * pstride + 2 * (size_t)k));
        for (int h = 0; h < RH; h++) {
            const __m512 qv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)(q + (size_t)h * hd + k))));
            for (int p = 0; p < RP; p++) a[h][p] = _mm512_fmadd_ps(qv, kv[p], a[h][p]);
        }
        /* in place, the step has no widening pass to issue its share: two
         * lines here leave the fewest to the flush at the end */
        pf_issue(pf, in_place ? 2 : 1);
    }
    /* Per pair, 128-bit lanes after two hadds: row 2p's sums of lanes 0..3
     * and of 4..7 of the four heads, then row 2p+1's; avx2_hsum4 adds the
     * first to the second.  Two pairs' low and high lanes gathered and
     * added give 4 positions x 4 heads (lane 4 pos + head), times their
     * rs; then 8 positions of two heads to a register for the stores. */
    const __m512 z = _mm512_setzero_ps();
    __m512 y[2];
    for (int i = 0; i < 2; i++) {
        if (2 * i >= RP) {
            y[i] = z;
            continue;
        }
        __m512 x[2];
        for (int j = 0; j < 2; j++) {
            const int p = 2 * i + j;
            x[j] = p >= RP ? z
                           : hadd512(hadd512(a[0][p], RH > 1 ? a[1][p] : z),
                                     RH > 2 ? hadd512(a[2][p], RH > 3 ? a[3][p] : z) : z);
        }
        const __m512 lo = _mm512_shuffle_f32x4(x[0], x[1], 0x88), hi = _mm512_shuffle_f32x4(x[0], x[1], 0xdd);
        const __m512 r4 = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                                _mm512_castps128_ps512(_mm_loadu_ps(rs + 4 * i)));
        y[i] = _mm512_mul_ps(_mm512_add_ps(lo, hi), r4);
    }
    const int nv = n < 8 ? n : 8;
    const __mmask16 m = (__mmask16)((1u << nv) - 1);
    const __m512i i01 = _mm512_set_epi32(29, 25, 21, 17, 13, 9, 5, 1, 28, 24, 20, 16, 12, 8, 4, 0);
    const __m512 h01 = _mm512_permutex2var_ps(y[0], i01, y[1]);
    _mm512_mask_storeu_ps(sc, m, h01);
    if (RH > 1) _mm512_mask_storeu_ps(sc + cap - 8, (__mmask16)(m << 8), h01);
    if (RH > 2) {
        const __m512 h23 = _mm512_permutex2var_ps(y[0], _mm512_add_epi32(i01, _mm512_set1_epi32(2)), y[1]);
        _mm512_mask_storeu_ps(sc + 2 * (size_t)cap, m, h23);
        if (RH > 3) _mm512_mask_storeu_ps(sc + 3 * (size_t)cap - 8, (__mmask16)(m << 8), h23);
    }
}

#define ST_CASES(T) ST(4, 4, T) ST(4, 3, T) ST(4, 2, T) ST(4, 1, T) ST(3, 4, T) ST(3, 3, T) ST(3, 2, T) ST(3, 1, T) \
                    ST(2, 4, T) ST(2, 3, T) ST(2, 2, T) ST(2, 1, T) ST(1, 4, T) ST(1, 3, T) ST(1, 2, T)
#define ST(H, P, T) case H * 4 + P: score_tile(H, P, T, q, hd, kp, kr, rs, n, sc, cap, pf); break;
#define ST_FN(NAME, T)                                                                                            \
    ALWAYS_INLINE void NAME(int rh, int rp, const float *q, int hd, const float *kp, const void *const *kr,    \
                     const float *rs, int n, float *sc, int cap, struct pf_cursor *pf) {                        \
        switch (rh * 4 + rp) {                                                                                     \
        ST_CASES(T)                                                                                                \
        default: score_tile(1, 1, T, q, hd, kp, kr, rs, n, sc, cap, pf); break;                                    \
        }                                                                                                          \
    }
ST_FN(score_tile_kp, KV_TYPE_COUNT_)
ST_FN(score_tile_f16, KV_F16)
ST_FN(score_tile_bf16, KV_BF16)
ST_FN(score_tile_int8, KV_INT8)
#undef ST_FN
#undef ST
#undef ST_CASES

/* All heads' scores, 4 pairs (8 positions) at a time.  f16, bf16 and int8
 * K with at most 4 heads (one head tile: each element is converted once
 * either way) are read in place; otherwise the 4 pairs are widened into kp
 * (4 * 2 * hd floats, which stays in L1: a whole step's pairs at head_dim
 * 256 were 64 KiB, past L1, and writing them out cost a quarter of the step)
 * and every head tile reads them. */
static void scores(enum kv_type type, const void *kbase, const size_t *rows, int g, const float *q, int hd,
                   float *kp, const float *rs, int n, float *sc, int cap, struct pf_cursor *pf) {
    const size_t rb = (size_t)hd * kv_elem_bytes(type);
    const int np = (n + 1) / 2;
    const bool in_place = (type == KV_F16 || type == KV_BF16 || type == KV_INT8) && g <= 4;
    for (int p = 0; p < np; p += 4) {
        const int rp = np - p < 4 ? np - p : 4, left = n - 2 * p;
        if (in_place) {
            const void *kr[8];
            for (int i = 0; i < 2 * rp; i++)
                kr[i] = i < left ? (const char *)kbase + rows[2 * p + i] * rb : (const void *)k_zero_row;
            (type == KV_F16 ? score_tile_f16 : type == KV_BF16 ? score_tile_bf16 : score_tile_int8)(
                g, rp, q, hd, NULL, kr, rs + 2 * p, left, sc + 2 * p, cap, pf);
            continue;
        }
        widen_kp_any(type, kbase, rows + 2 * p, left < 8 ? left : 8, hd, kp, pf);
        for (int h = 0; h < g; h += 4)
            score_tile_kp(g - h < 4 ? g - h : 4, rp, q + (size_t)h * hd, hd, kp, NULL, rs + 2 * p, left,
                          sc + (size_t)h * cap + 2 * p, cap, pf);
    }
}

/* ---- values: acc_h += Σ_p w[h][p] V[p], 16 accumulators ---- */

/* RH heads' accumulators acc[h] (16 RD floats from dim d0; RH * RD <= 16)
 * += Σ_p w[h * MAX_N + p] * V[p][d0 ..], p ascending, one FMA chain per
 * element.  V rows vr[p] of type VT: f32 read as they are, f16, bf16 and
 * int8 (codes) widened here (each element once when the tile spans all
 * heads).  Per position RD row loads and RH weight broadcasts feed RH * RD
 * FMAs.  rn (NULL: n for all): head h's positions end at rn[h], the later
 * ones' FMAs masked off (a 0 weight times an infinite V would not leave acc). */
ALWAYS_INLINE void value_pos(const enum kv_type VT, const int RH, const int RD, __m512 (*a)[4], int d0,
                             const void *vrow, const float *w, int p, const int *rn) {
    __m512 vv[4];
    for (int d = 0; d < RD; d++)
        vv[d] = VT == KV_F32 ? reg512(_mm512_loadu_ps((const float *)vrow + d0 + 16 * d))
                             : load16(VT, vrow, (size_t)(d0 + 16 * d));
    for (int h = 0; h < RH; h++) {
        const __m512 wv = _mm512_set1_ps(w[h * MAX_N + p]);
        const __mmask16 k = rn && p >= rn[h] ? 0 : 0xffff;
        for (int d = 0; d < RD; d++)
            a[h][d] = rn ? _mm512_mask3_fmadd_ps(wv, vv[d], a[h][d], k) : _mm512_fmadd_ps(wv, vv[d], a[h][d]);
    }
}

ALWAYS_INLINE void value_tile(const enum kv_type VT, const int RH, const int RD, float *const *acc, int d0,
                              const void *const *vr, const float *w, int n, const int *rn, struct pf_cursor *pf) {
    __m512 a[8][4];
    int lo = n, hi = rn ? 0 : n;   /* every head takes [0, lo); some of them [lo, hi) */
    for (int h = 0; rn && h < RH; h++) {
        lo = rn[h] < lo ? rn[h] : lo;
        hi = rn[h] > hi ? rn[h] : hi;
    }
    for (int h = 0; h < RH; h++)
        for (int d = 0; d < RD; d++) a[h][d] = _mm512_loadu_ps(acc[h] + d0 + 16 * d);
    int p = 0;
    for (; p < lo; p++) {
        value_pos(VT, RH, RD, a, d0, vr[p], w, p, NULL);
        pf_issue(pf, 1);
    }
    for (; p < hi; p++) value_pos(VT, RH, RD, a, d0, vr[p], w, p, rn);
    for (int h = 0; h < RH; h++)
        for (int d = 0; d < RD; d++) _mm512_storeu_ps(acc[h] + d0 + 16 * d, a[h][d]);
}

#define VT(H, D, T) case H * 8 + D: value_tile(T, H, D, acc, d0, vr, w, n, rn, pf); break;
#define VT_FN(NAME, T)                                                                                            \
    static void NAME(int rh, int rd, float *const *acc, int d0, const void *const *vr, const float *w, int n,   \
                     const int *rn, struct pf_cursor *pf) {                                                     \
        switch (rh * 8 + rd) {                                                                                     \
        VT(8, 2, T) VT(7, 2, T) VT(6, 2, T) VT(5, 2, T) VT(4, 2, T) VT(3, 2, T) VT(2, 2, T) VT(1, 2, T)            \
        VT(8, 1, T) VT(7, 1, T) VT(6, 1, T) VT(5, 1, T) VT(4, 1, T) VT(3, 1, T) VT(2, 1, T)                        \
        VT(4, 4, T) VT(3, 4, T) VT(2, 4, T) VT(1, 4, T) VT(4, 3, T) VT(3, 3, T) VT(2, 3, T) VT(1, 3, T)            \
        default: value_tile(T, 1, 1, acc, d0, vr, w, n, rn, pf); break;                                            \
        }                                                                                                          \
    }
VT_FN(value_tile_f32, KV_F32)
VT_FN(value_tile_f16, KV_F16)
VT_FN(value_tile_bf16, KV_BF16)
VT_FN(value_tile_int8, KV_INT8)
#undef VT_FN
#undef VT

/* Heads in groups of 8 x 32 dims (5..8 heads) or 4 x 64 dims (1..4).  The
 * tiles read weights MAX_N floats apart (one base register for 8 heads:
 * with a row pointer per head GCC ran out of registers and reloaded them
 * from xmm spills every position), so a scratch stride cap < MAX_N (g >
 * 64) is copied first. */
static void values(enum kv_type vt, int g, float *part0, size_t pstride, int hd, const void *const *vr,
                   const float *w, int n, int cap, const int *row_n, struct pf_cursor *pf) {
    void (*const tile)(int, int, float *const *, int, const void *const *, const float *, int, const int *,
                       struct pf_cursor *) =
        vt == KV_F16 ? value_tile_f16 : vt == KV_BF16 ? value_tile_bf16 : vt == KV_INT8 ? value_tile_int8
                                                                                         : value_tile_f32;
    _Alignas(64) float w8[8 * MAX_N];
    for (int h = 0; h < g;) {
        const int rh = g - h < 8 ? g - h : 8, dmax = rh > 4 ? 2 : 4;
        float *acc[8];
        for (int i = 0; i < rh; i++) acc[i] = part0 + (size_t)(h + i) * pstride + 2;
        const float *wh = w + (size_t)h * cap;
        if (cap != MAX_N) {
            for (int i = 0; i < rh; i++) memcpy(w8 + i * MAX_N, w + (size_t)(h + i) * cap, (size_t)n * sizeof *w);
            wh = w8;
        }
        for (int d0 = 0; d0 < hd; d0 += 16 * dmax) {
            const int rd = (hd - d0) / 16 < dmax ? (hd - d0) / 16 : dmax;
            tile(rh, rd, acc, d0, vr, wh, n, row_n ? row_n + h : NULL, pf);
        }
        h += rh;
    }
}

/* Per head: the step's max, the partial rescaled once if it grew, the
 * scores turned into weights exp(s - m) (in place), summed into l, then
 * (8-bit V) times the rows' V scales vs; each head over its own row_n[i]
 * positions (NULL: n), the rest weighing 0. */
static void softmax_step(int g, float *part0, size_t pstride, int hd, float *sc, int cap, int n_step,
                         const int *row_n, const float *vs) {
    for (int i = 0; i < g; i++) {
        float *p = part0 + (size_t)i * pstride, *si = sc + (size_t)i * cap;
        const int n = row_n ? row_n[i] : n_step, nb = (n + 15) / 16;
        for (int jj = n; jj < n_step; jj++) si[jj] = 0;
        __m512 x[4];
        __m512 vm = _mm512_set1_ps(-INFINITY);
        for (int b = 0; b < nb; b++) {
            const int left = n - 16 * b;
            const __mmask16 mk = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            x[b] = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), mk, si + 16 * b);
            vm = _mm512_max_ps(vm, x[b]);
        }
        const float bm = _mm512_reduce_max_ps(vm);
        if (bm > p[0]) {
            if (p[0] != -INFINITY) {          /* first step: acc and l are 0 */
                const float corr = expf(p[0] - bm);
                const __m512 vc = _mm512_set1_ps(corr);
                p[1] *= corr;
                for (int k = 0; k < hd; k += 16)
                    _mm512_storeu_ps(p + 2 + k, _mm512_mul_ps(_mm512_loadu_ps(p + 2 + k), vc));
            }
            p[0] = bm;
        }
        const __m512 m = _mm512_set1_ps(p[0]);
        __m256 vl = _mm256_setzero_ps();    /* the AVX2 step's sum: 8 lanes, blocks of 8 ascending */
        for (int b = 0; b < nb; b++) {
            const int left = n - 16 * b;
            const __mmask16 mk = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            __m512 w = exp_neg16(_mm512_sub_ps(x[b], m));
            vl = _mm256_add_ps(vl, _mm512_castps512_ps256(w));
            if (left > 8) vl = _mm256_add_ps(vl, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1)));
            if (vs) w = _mm512_mul_ps(w, _mm512_load_ps(vs + 16 * b));
            _mm512_mask_storeu_ps(si + 16 * b, mk, w);
        }
        p[1] += avx2_hsum(vl);
    }
}

/* V rows r[0 .. n): f32 in place, f16, bf16 and int8 too for at most 8
 * heads per kv head (one head group: the value tiles widen each element
 * once), the others widened into buf (row stride hd; a whole step's rows
 * at head_dim 256 are 64 KiB, past L1): a prefill group's 24 rows widened
 * each f16 element 6 times in its tiles (SmolLM2: 2.5 % of its attention).
 * Returns the rows' type (KV_F32 when widened). */
static enum kv_type widen_v(enum kv_type type, int g, const void *base, const size_t *rows, int n, int hd,
                            float *buf, const void **r) {
    const bool in_place = type == KV_F32 || ((type == KV_F16 || type == KV_BF16 || type == KV_INT8) && g <= 8);
    const size_t rb = (size_t)hd * kv_elem_bytes(type);
    for (int jj = 0; jj < n; jj++) {
        if (in_place) {
            r[jj] = (const char *)base + rows[jj] * rb;
            continue;
        }
        const size_t e0 = rows[jj] * (size_t)hd;
        float *d = buf + (size_t)jj * hd;
        switch (type) {
        case KV_F16: for (int i = 0; i < hd; i += 16) _mm512_store_ps(d + i, load16(KV_F16, base, e0 + (size_t)i)); break;
        case KV_BF16: for (int i = 0; i < hd; i += 16) _mm512_store_ps(d + i, load16(KV_BF16, base, e0 + (size_t)i)); break;
        case KV_INT8: for (int i = 0; i < hd; i += 16) _mm512_store_ps(d + i, load16(KV_INT8, base, e0 + (size_t)i)); break;
        default: for (int i = 0; i < hd; i += 16) _mm512_store_ps(d + i, load16(KV_FP8, base, e0 + (size_t)i)); break;
        }
        r[jj] = d;
    }
    return in_place ? type : KV_F32;
}

/* Whether cpu_pa_scores_q8_avx512 runs here, asked once (CPUID traps to
 * the hypervisor in a VM: microseconds a call). */
static bool g_q8_here;
static pthread_once_t g_q8_once = PTHREAD_ONCE_INIT;

static void q8_probe(void) {
    struct cpu_features f;
    cpu_features_get(&f);
    g_q8_here = cpu_attn_q8_avx512_built() && f.avx512bw && f.avx512vl && f.avx512vnni;
}

static bool q8_scores_here(void) {
    pthread_once(&g_q8_once, q8_probe);
    return g_q8_here;
}

static void chunk_avx512(const struct kv_layer_view *kv, const size_t *rows, int n, int g, const int *row_n,
                         const float *q, const struct pa_q8 *qq, float scale, float softcap, float *part0,
                         size_t pstride, float *sc, int cap, const size_t *pf, int npf) {
    const int hd = kv->head_dim;
    const bool q8 = kv->type == KV_INT8 || kv->type == KV_FP8;
    _Alignas(64) float buf[MAX_N * MAX_HD];       /* 4 K pairs at a time, then the V rows */
    _Alignas(64) float rs[MAX_N];                 /* per position: score factor */
    _Alignas(64) float vs[MAX_N];                 /* per position: V scale (8-bit) */
    const void *r[MAX_N];

    const size_t rb = (size_t)hd * kv_elem_bytes(kv->type);
    struct pf_cursor pfc;
    for (int jj = 0; jj < MAX_N; jj++) rs[jj] = jj < n ? (q8 ? kv->k_scale[rows[jj]] * scale : scale) : 0.0f;
    if (qq) {                    /* int8 with integer scores and values (struct pa_q8) */
        cpu_pa_scores_q8_avx512((const int8_t *)kv->k, rows, n, g, qq, hd, rs, sc, cap, pf, npf);
        pa_softcap(sc, g, n, cap, softcap);
        for (int jj = 0; jj < MAX_N; jj++) vs[jj] = jj < n ? kv->v_scale[rows[jj]] : 0.0f;
        KV_ASSERT(!row_n);
        softmax_step(g, part0, pstride, hd, sc, cap, n, NULL, vs);
        cpu_pa_values_q8_avx512((const int8_t *)kv->v, rows, n, g, hd, sc, cap, part0, pstride, pf, npf);
        return;
    }
    pf_init(&pfc, kv->k, kv->v, pf, npf, rb);
    scores(kv->type, kv->k, rows, g, q, hd, buf, rs, n, sc, cap, &pfc);
    pa_softcap(sc, g, n, cap, softcap);
    if (q8)
        for (int jj = 0; jj < MAX_N; jj++) vs[jj] = jj < n ? kv->v_scale[rows[jj]] : 0.0f;
    softmax_step(g, part0, pstride, hd, sc, cap, n, row_n, q8 ? vs : NULL);
    const enum kv_type vt = widen_v(kv->type, g, kv->v, rows, n, hd, buf, r);
    values(vt, g, part0, pstride, hd, r, sc, n, cap, row_n, &pfc);
    pf_issue(&pfc, 1 << 30);
}

int cpu_paged_attention_avx512(struct backend_ctx *c, const struct paged_attn_args *a) {
    if (a->head_dim % 16 != 0 || a->head_dim > MAX_HD) return cpu_paged_attention_avx2(c, a);
    /* int8 K's integer scores need VNNI; the AVX2 step's are the same */
    if (a->kv.type == KV_INT8 && !q8_scores_here()) return cpu_paged_attention_avx2(c, a);
    return cpu_paged_attention_with(c, a, chunk_avx512, q8_scores_here() ? cpu_pa_quant_q8_avx512 : NULL);
}

#else /* not an x86-64 build with the AVX-512 flags */

bool cpu_attn_avx512_built(void) { return false; }

int cpu_paged_attention_avx512(struct backend_ctx *c, const struct paged_attn_args *a) {
    return cpu_paged_attention_avx2(c, a);
}

#endif
