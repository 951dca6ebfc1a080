/* attn_avx512.c — the online-softmax step of paged attention (pa_chunk_fn,
 * see cpu_internal.h) with AVX-512F (+ F16C, FMA).  Compiled with those -m
 * flags alone; cpu.c installs cpu_paged_attention_avx512 only when the CPU
 * has them.  Head sizes that are not a multiple of 16 (or above 256) take
 * the AVX2 step.
 *
 * Per step (n <= 64 positions, g query heads sharing one kv head):
 *  - K is widened to f32 (f16 by vcvtph2ps, bf16 by a shift, int8 / fp8
 *    codes converted without their scale) 16 rows x 16 dims at a time,
 *    transposed in registers and stored dims-major, Kt[d][p] (stride 64),
 *    in an L1-sized buffer; positions n .. 63 of the last block are 0.
 *  - scores: 16 positions per vector, S[h][p0 .. p0+15] = Σ_d q[h][d]
 *    (broadcast) * Kt[d][p0 ..], in register tiles of 4 heads x 4 blocks
 *    (16 accumulators; per dim 4 loads and 4 broadcasts feed 16 FMAs).  No
 *    horizontal sums: the AVX2 step spent them once per (head, row).
 *  - softmax on those 16-lane vectors (16-lane exp, the AVX2 step's
 *    polynomial), rescaling acc once per step as every step does.
 *  - the heads' accumulators sweep the V rows in tiles of 8 heads x 32 dims
 *    (5..8 heads) or 4 heads x 64 dims (1..4): 16 accumulators, per position
 *    2 (4) row loads and 8 (4) weight broadcasts feed 16 FMAs.  f16 V is
 *    widened inside the tile (with 8 heads each element once), f32 read in
 *    place, bf16 / 8-bit rows widened into the buffer first.
 *  - the next step's K and V rows (pf) are prefetched a cache line at a time
 *    between the tiles' FMAs: issued in one burst at the start, 256 requests
 *    stalled on the line-fill buffers for a third of the step.
 *
 * Arithmetic of each output (fixed, whatever tile computes it, so results
 * depend only on the step's arguments and attention stays bit-identical for
 * any thread count and batch composition):
 *  - score[h][p] = fl(dot * rs[p]) where dot is one FMA chain over d = 0 ..
 *    hd-1 ascending starting from 0, rs[p] = scale (times k_scale[row] for
 *    8-bit types, that product rounded first);
 *  - m: max of the step's scores (exact, any order) against the partial's m;
 *    corr = expf(m_old - m) (libm) multiplies l and acc when m grows;
 *  - w[h][p] = exp16(score - m) (lane-wise polynomial); l += sum of the 16
 *    lanes of Σ_blocks w (blocks ascending, then _mm512_reduce_add_ps's
 *    fixed tree); 8-bit V: w *= v_scale[row] after that;
 *  - acc[h][d] = one FMA chain over p = 0 .. n-1 ascending, w[h][p] *
 *    V[p][d], onto the previous acc[h][d]. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

bool cpu_attn_avx512_built(void) { return true; }

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define MAX_HD 256             /* larger heads take the AVX2 (then scalar) step */
#define MAX_N CPU_PA_CHUNK     /* 64 positions: 4 blocks of 16 */
#define KT_STRIDE MAX_N

/* v, pinned in a register: GCC otherwise folds a load that several FMAs
 * share into each of them as a memory operand (see avx2_reg). */
ALWAYS_INLINE __m512 reg512(__m512 v) {
    __asm__("" : "+v"(v));
    return v;
}

/* exp(x) for x <= 0, the AVX2 step's exp_neg in 16 lanes: Cody-Waite
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

/* In-register transpose of a 16 x 16 block: r[i] lane j becomes r[j] lane i. */
ALWAYS_INLINE void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4i + j], 128-bit lane k: column 4k + j of rows 4i .. 4i+3 */
    for (int i = 0; i < 4; i++) {
        u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int j = 0; j < 4; j++) {
        const __m512 a = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88), b = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
        const __m512 c = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xdd), d = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xdd);
        r[j] = _mm512_shuffle_f32x4(a, b, 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(a, b, 0xdd);
        r[4 + j] = _mm512_shuffle_f32x4(c, d, 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(c, d, 0xdd);
    }
}

/* The next step's K then V rows, one cache line at a time: the step
 * requests them spread over its own work (a burst of 256 requests stalls
 * on the line-fill buffers: measured, the burst took a third of the step),
 * and flushes the rest at its end. */
struct pf_cursor {
    const char *base, *v;     /* K until its rows are done, then V */
    const size_t *rows;
    size_t rb, off;           /* bytes per row; next line's offset in its row */
    int n, row;
};

/* The next k lines. */
ALWAYS_INLINE void pf_issue(struct pf_cursor *c, int k) {
    for (; k > 0 && c->row < c->n; k--) {
        _mm_prefetch(c->base + c->rows[c->row] * c->rb + c->off, _MM_HINT_T0);
        c->off += 64;
        if (c->off >= c->rb) {
            c->off = 0;
            if (++c->row == c->n && c->base != c->v) {
                c->base = c->v;
                c->row = 0;
            }
        }
    }
}

/* K rows rows[0 .. n) into kt (hd x 64, dims-major); rows n .. 63 of the
 * last 16-row block are 0. */
ALWAYS_INLINE void widen_kt(enum kv_type type, const void *base, const size_t *rows, int n, int hd, float *kt,
                            struct pf_cursor *pf) {
    for (int p0 = 0; p0 < n; p0 += 16) {
        const int np = n - p0 < 16 ? n - p0 : 16;
        for (int d0 = 0; d0 < hd; d0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < np ? load16(type, base, rows[p0 + i] * (size_t)hd + (size_t)d0) : _mm512_setzero_ps();
            transpose16(r);
            for (int i = 0; i < 16; i++) _mm512_store_ps(kt + (size_t)(d0 + i) * KT_STRIDE + p0, r[i]);
            pf_issue(pf, 2);
        }
    }
}

static void widen_kt_any(enum kv_type type, const void *base, const size_t *rows, int n, int hd, float *kt,
                         struct pf_cursor *pf) {
    switch (type) {
    case KV_F32: widen_kt(KV_F32, base, rows, n, hd, kt, pf); break;
    case KV_F16: widen_kt(KV_F16, base, rows, n, hd, kt, pf); break;
    case KV_BF16: widen_kt(KV_BF16, base, rows, n, hd, kt, pf); break;
    case KV_INT8: widen_kt(KV_INT8, base, rows, n, hd, kt, pf); break;
    default: widen_kt(KV_FP8, base, rows, n, hd, kt, pf); break;
    }
}

/* ---- scores: S (g, n) = Q (g, hd) · Kᵀ, 16 positions per vector ---- */

/* RH (1..4) heads q (RH, hd) x RB (1..4) blocks of 16 positions from kt:
 * sc[h * cap + 16 b + i] = dot * rs[16 b + i] for lanes 16 b + i < n. */
ALWAYS_INLINE void score_tile(const int RH, const int RB, const float *q, int hd, const float *kt,
                              const float *rs, int n, float *sc, int cap, struct pf_cursor *pf) {
    __m512 a[4][4];
    for (int h = 0; h < RH; h++)
        for (int b = 0; b < RB; b++) a[h][b] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        __m512 kv[4];
        for (int b = 0; b < RB; b++) kv[b] = reg512(_mm512_load_ps(kt + (size_t)d * KT_STRIDE + 16 * b));
        for (int h = 0; h < RH; h++) {
            const __m512 qv = _mm512_set1_ps(q[(size_t)h * hd + d]);
            for (int b = 0; b < RB; b++) a[h][b] = _mm512_fmadd_ps(qv, kv[b], a[h][b]);
        }
        pf_issue(pf, 1);
    }
    for (int b = 0; b < RB; b++) {
        const int left = n - 16 * b;
        const __mmask16 mk = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        const __m512 s = _mm512_load_ps(rs + 16 * b);
        for (int h = 0; h < RH; h++) _mm512_mask_storeu_ps(sc + (size_t)h * cap + 16 * b, mk, _mm512_mul_ps(a[h][b], s));
    }
}

static void score_tile_any(int rh, int rb, const float *q, int hd, const float *kt, const float *rs, int n,
                           float *sc, int cap, struct pf_cursor *pf) {
    switch (rh * 4 + rb) {
#define ST(H, B) case H * 4 + B: score_tile(H, B, q, hd, kt, rs, n, sc, cap, pf); break;
    ST(4, 4) ST(4, 3) ST(4, 2) ST(4, 1)
    ST(3, 4) ST(3, 3) ST(3, 2) ST(3, 1)
    ST(2, 4) ST(2, 3) ST(2, 2) ST(2, 1)
    ST(1, 4) ST(1, 3) ST(1, 2)
#undef ST
    default: score_tile(1, 1, q, hd, kt, rs, n, sc, cap, pf); break;
    }
}

/* ---- values: acc_h += Σ_p w[h][p] V[p], 16 accumulators ---- */

/* RH heads' accumulators acc[h] (16 RD floats from dim d0; RH * RD <= 16)
 * += Σ_p w[h * MAX_N + p] * V[p][d0 ..], p ascending, one FMA chain per
 * element.  V rows vr[p]: f16 (VF16, widened here: each element once when
 * the tile spans all heads) or f32.  Per position RD row loads and RH
 * weight broadcasts feed RH * RD FMAs. */
ALWAYS_INLINE void value_tile(const bool VF16, const int RH, const int RD, float *const *acc, int d0,
                              const void *const *vr, const float *w, int n, struct pf_cursor *pf) {
    __m512 a[8][4];
    for (int h = 0; h < RH; h++)
        for (int d = 0; d < RD; d++) a[h][d] = _mm512_loadu_ps(acc[h] + d0 + 16 * d);
    for (int p = 0; p < n; p++) {
        __m512 vv[4];
        for (int d = 0; d < RD; d++)
            vv[d] = VF16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)vr[p] + d0 + 16 * d)))
                         : reg512(_mm512_loadu_ps((const float *)vr[p] + d0 + 16 * d));
        for (int h = 0; h < RH; h++) {
            const __m512 wv = _mm512_set1_ps(w[h * MAX_N + p]);
            for (int d = 0; d < RD; d++) a[h][d] = _mm512_fmadd_ps(wv, vv[d], a[h][d]);
        }
        pf_issue(pf, 1);
    }
    for (int h = 0; h < RH; h++)
        for (int d = 0; d < RD; d++) _mm512_storeu_ps(acc[h] + d0 + 16 * d, a[h][d]);
}

#define VT(H, D) case H * 8 + D: value_tile(VF16, H, D, acc, d0, vr, w, n, pf); break;
#define VT_CASES VT(8, 2) VT(7, 2) VT(6, 2) VT(5, 2) VT(4, 2) VT(3, 2) VT(2, 2) VT(1, 2) \
                 VT(8, 1) VT(7, 1) VT(6, 1) VT(5, 1) VT(4, 1) VT(3, 1) VT(2, 1)         \
                 VT(4, 4) VT(3, 4) VT(2, 4) VT(1, 4) VT(4, 3) VT(3, 3) VT(2, 3) VT(1, 3)
static void value_tile_f32(int rh, int rd, float *const *acc, int d0, const void *const *vr, const float *w,
                           int n, struct pf_cursor *pf) {
    const bool VF16 = false;
    switch (rh * 8 + rd) {
    VT_CASES
    default: value_tile(VF16, 1, 1, acc, d0, vr, w, n, pf); break;
    }
}

static void value_tile_f16(int rh, int rd, float *const *acc, int d0, const void *const *vr, const float *w,
                           int n, struct pf_cursor *pf) {
    const bool VF16 = true;
    switch (rh * 8 + rd) {
    VT_CASES
    default: value_tile(VF16, 1, 1, acc, d0, vr, w, n, pf); break;
    }
}
#undef VT_CASES
#undef VT

/* Heads in groups of 8 x 32 dims (5..8 heads) or 4 x 64 dims (1..4).  The
 * tiles read weights MAX_N floats apart (one base register for 8 heads:
 * with a row pointer per head GCC ran out of registers and reloaded them
 * from xmm spills every position), so a scratch stride cap < MAX_N (g >
 * 64) is copied first. */
static void values(bool vf16, int g, float *part0, size_t pstride, int hd, const void *const *vr, const float *w,
                   int n, int cap, struct pf_cursor *pf) {
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
            (vf16 ? value_tile_f16 : value_tile_f32)(rh, rd, acc, d0, vr, wh, n, pf);
        }
        h += rh;
    }
}

/* Per head: the step's max, the partial rescaled once if it grew, the
 * scores turned into weights exp(s - m) (in place), summed into l, then
 * (8-bit V) times the rows' V scales vs. */
static void softmax_step(int g, float *part0, size_t pstride, int hd, float *sc, int cap, int n, const float *vs) {
    const int nb = (n + 15) / 16;
    for (int i = 0; i < g; i++) {
        float *p = part0 + (size_t)i * pstride, *si = sc + (size_t)i * cap;
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
        __m512 vl = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const int left = n - 16 * b;
            const __mmask16 mk = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            __m512 w = exp_neg16(_mm512_sub_ps(x[b], m));
            vl = _mm512_add_ps(vl, w);
            if (vs) w = _mm512_mul_ps(w, _mm512_load_ps(vs + 16 * b));
            _mm512_mask_storeu_ps(si + 16 * b, mk, w);
        }
        p[1] += _mm512_reduce_add_ps(vl);
    }
}

/* V rows: f32 and f16 in place (the value tiles read f16 themselves),
 * the others widened into buf (row stride hd). */
static void widen_v(enum kv_type type, const void *base, const size_t *rows, int n, int hd, float *buf,
                    const void **r) {
    for (int jj = 0; jj < n; jj++) {
        const size_t e0 = rows[jj] * (size_t)hd;
        if (type == KV_F32 || type == KV_F16) {
            r[jj] = (const char *)base + e0 * kv_elem_bytes(type);
            continue;
        }
        float *d = buf + (size_t)jj * hd;
        switch (type) {
        case KV_BF16: for (int i = 0; i < hd; i += 16) _mm512_store_ps(d + i, load16(KV_BF16, base, e0 + (size_t)i)); break;
        case KV_INT8: for (int i = 0; i < hd; i += 16) _mm512_store_ps(d + i, load16(KV_INT8, base, e0 + (size_t)i)); break;
        default: for (int i = 0; i < hd; i += 16) _mm512_store_ps(d + i, load16(KV_FP8, base, e0 + (size_t)i)); break;
        }
        r[jj] = d;
    }
}

static void chunk_avx512(const struct kv_layer_view *kv, const size_t *rows, int n, int g, const float *q,
                         float scale, float *part0, size_t pstride, float *sc, int cap, const size_t *pf, int npf) {
    const int hd = kv->head_dim;
    const bool q8 = kv->type == KV_INT8 || kv->type == KV_FP8;
    _Alignas(64) float buf[MAX_N * MAX_HD];       /* Kt, then the V rows */
    _Alignas(64) float rs[MAX_N];                 /* per position: score factor */
    _Alignas(64) float vs[MAX_N];                 /* per position: V scale (8-bit) */
    const void *r[MAX_N];

    const size_t rb = (size_t)hd * kv_elem_bytes(kv->type);
    struct pf_cursor pfc = { (const char *)kv->k, (const char *)kv->v, pf, rb, 0, npf, 0 };
    for (int jj = 0; jj < MAX_N; jj++) rs[jj] = jj < n ? (q8 ? kv->k_scale[rows[jj]] * scale : scale) : 0.0f;
    widen_kt_any(kv->type, kv->k, rows, n, hd, buf, &pfc);
    for (int h = 0; h < g; h += 4) {
        const int rh = g - h < 4 ? g - h : 4;
        score_tile_any(rh, (n + 15) / 16, q + (size_t)h * hd, hd, buf, rs, n, sc + (size_t)h * cap, cap, &pfc);
    }
    if (q8)
        for (int jj = 0; jj < MAX_N; jj++) vs[jj] = jj < n ? kv->v_scale[rows[jj]] : 0.0f;
    softmax_step(g, part0, pstride, hd, sc, cap, n, q8 ? vs : NULL);
    widen_v(kv->type, kv->v, rows, n, hd, buf, r);
    values(kv->type == KV_F16, g, part0, pstride, hd, r, sc, n, cap, &pfc);
    pf_issue(&pfc, 1 << 30);
}

int cpu_paged_attention_avx512(struct backend_ctx *c, const struct paged_attn_args *a) {
    if (a->head_dim % 16 != 0 || a->head_dim > MAX_HD) return cpu_paged_attention_avx2(c, a);
    return cpu_paged_attention_with(c, a, chunk_avx512);
}

#else /* not an x86-64 build with the AVX-512 flags */

bool cpu_attn_avx512_built(void) { return false; }

int cpu_paged_attention_avx512(struct backend_ctx *c, const struct paged_attn_args *a) {
    return cpu_paged_attention_avx2(c, a);
}

#endif
