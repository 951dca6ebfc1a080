/* act_avx512.c — the integer paths' activation rows (qmm.h) quantized with
 * AVX-512: qmm_quantize_row's 8-bit codes and qmm16_quantize_row's 16-bit
 * ones, 16 lanes at a time with the same arithmetic (the block's largest
 * |x|, the same two IEEE divisions, x times the inverse rounded half-even by
 * the conversion's default rounding, where the scalar code adds and removes
 * 1.5 * 2^23: both exact for |x * id| <= 32767).  For finite x the codes,
 * scales and sums are the scalar functions' bit for bit (test_backend_qmm16
 * checks); the scalar ones stay the definition.  The 8-bit row was 9 % of a
 * small model's prefill (`perf`, qwen3 160 M, pp512) when done a value at a
 * time.  And SwiGLU's rows for those sets: avx2_expf's arithmetic (libm's
 * expf bit for bit) 16 lanes at a time, the table read by permutes rather
 * than gathers.  Compiled with the AVX2 and AVX-512 F/BW/VL flags;
 * entered only on the avx512 and amx sets. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/qmm.h"
#include "core/core.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <float.h>
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/avx2_util.h"

bool cpu_act_avx512_built(void) { return true; }

/* The 32 values at x times id, as int32 codes. */
static inline void codes32_at(const float *x, float id, __m512i *c0, __m512i *c1) {
    const __m512 v = _mm512_set1_ps(id);
    *c0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), v));
    *c1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16), v));
}

/* The block's 32 values at x times its inverse scale, as int32 codes; *scale = its largest |x| / qmax. */
static inline void codes32(const float *x, float qmax, float *scale, __m512i *c0, __m512i *c1) {
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x)),
                                                          _mm512_abs_ps(_mm512_loadu_ps(x + 16))));
    *scale = amax / qmax;
    codes32_at(x, qmm_inv_scale(qmax, amax), c0, c1);
}

/* Lane b of the result: v[b]'s 16 lanes reduced, by 32-bit integer max (add: false) or add (true), in one
 * transposing tree for all 16 (both reductions are exact, so their order is free).  The tree leaves lane
 * 4k + j holding v[4j + k]; the last permutation puts v[b] in lane b. */
static inline __m512i reduce16(const __m512i v[16], bool add) {
#define OP(a, b) (add ? _mm512_add_epi32((a), (b)) : _mm512_max_epi32((a), (b)))
    __m512i h[8], f[4], e[2];
    for (int i = 0; i < 8; i++)   /* halves: v[2i]'s 8 partial lanes, then v[2i+1]'s */
        h[i] = OP(_mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], 0xee));
    for (int i = 0; i < 4; i++)   /* quarters: 128-bit lane k holds v[4i + k]'s 4 partial lanes */
        f[i] = OP(_mm512_shuffle_i32x4(h[2 * i], h[2 * i + 1], 0x88), _mm512_shuffle_i32x4(h[2 * i], h[2 * i + 1], 0xdd));
    for (int i = 0; i < 2; i++)   /* lane k: v[8i + k]'s 2 partials, then v[8i + 4 + k]'s */
        e[i] = OP(_mm512_unpacklo_epi64(f[2 * i], f[2 * i + 1]), _mm512_unpackhi_epi64(f[2 * i], f[2 * i + 1]));
    const __m512 e0 = _mm512_castsi512_ps(e[0]), e1 = _mm512_castsi512_ps(e[1]);
    const __m512i r = OP(_mm512_castps_si512(_mm512_shuffle_ps(e0, e1, 0x88)),
                         _mm512_castps_si512(_mm512_shuffle_ps(e0, e1, 0xdd)));
#undef OP
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

/* 16 blocks of 32 at x: d[b] = amax_b / qmax and id[b] = qmm_inv_scale(qmax, amax_b), the divisions 16
 * lanes at a time (IEEE division: the scalar one's bits).  |x| >= 0, so the largest |x| is the largest
 * bit pattern: the integer max tree gives it for finite x. */
static inline void scales16(const float *x, float qmax, float *d, float *id) {
    __m512i m[16];
    for (int b = 0; b < 16; b++)
        m[b] = _mm512_castps_si512(_mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + b * QMM_BLK)),
                                                 _mm512_abs_ps(_mm512_loadu_ps(x + b * QMM_BLK + 16))));
    const __m512 amax = _mm512_castsi512_ps(reduce16(m, false)), q = _mm512_set1_ps(qmax);
    const __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ), q, amax);
    _mm512_storeu_ps(id, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(inv, _mm512_set1_ps(FLT_MAX), _CMP_LE_OQ), inv));
    _mm512_storeu_ps(d, _mm512_div_ps(amax, q));
}

/* Rows of 16 blocks or more take them 16 at a time (the per-block horizontal max, sum and two scalar
 * divisions were most of this function's time); the rest a block at a time. */
void qmm_quantize_row_avx512(const float *x, int64_t K, int8_t *q, float *d, int32_t *xs) {
    const int64_t nb = K / QMM_BLK;
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        const float *xb = x + b * QMM_BLK;
        float id[16];
        scales16(xb, 127.0f, d + b, id);
        __m512i s[16];
        for (int i = 0; i < 16; i++) {
            __m512i c0, c1;
            codes32_at(xb + i * QMM_BLK, id[i], &c0, &c1);
            _mm_storeu_si128((__m128i *)(void *)(q + (b + i) * QMM_BLK), _mm512_cvtepi32_epi8(c0));
            _mm_storeu_si128((__m128i *)(void *)(q + (b + i) * QMM_BLK + 16), _mm512_cvtepi32_epi8(c1));
            s[i] = _mm512_add_epi32(c0, c1);
        }
        _mm512_storeu_si512(xs + b, reduce16(s, true));
    }
    for (; b < nb; b++) {
        __m512i c0, c1;
        codes32(x + b * QMM_BLK, 127.0f, &d[b], &c0, &c1);
        _mm_storeu_si128((__m128i *)(void *)(q + b * QMM_BLK), _mm512_cvtepi32_epi8(c0));
        _mm_storeu_si128((__m128i *)(void *)(q + b * QMM_BLK + 16), _mm512_cvtepi32_epi8(c1));
        xs[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(c0, c1));
    }
}

void qmm16_quantize_row_avx512(const float *x, int64_t K, uint8_t *row) {
    int16_t *q = (int16_t *)(void *)row;
    float *d = (float *)(void *)(row + 2 * K);
    const int64_t nb = K / QMM_BLK;
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        float id[16];
        scales16(x + b * QMM_BLK, QMM16_MAX, d + b, id);
        for (int i = 0; i < 16; i++) {
            __m512i c0, c1;
            codes32_at(x + (b + i) * QMM_BLK, id[i], &c0, &c1);
            _mm256_storeu_si256((__m256i *)(void *)(q + (b + i) * QMM_BLK), _mm512_cvtepi32_epi16(c0));
            _mm256_storeu_si256((__m256i *)(void *)(q + (b + i) * QMM_BLK + 16), _mm512_cvtepi32_epi16(c1));
        }
    }
    for (; b < nb; b++) {
        __m512i c0, c1;
        codes32(x + b * QMM_BLK, QMM16_MAX, &d[b], &c0, &c1);
        _mm256_storeu_si256((__m256i *)(void *)(q + b * QMM_BLK), _mm512_cvtepi32_epi16(c0));
        _mm256_storeu_si256((__m256i *)(void *)(q + b * QMM_BLK + 16), _mm512_cvtepi32_epi16(c1));
    }
}

/* avx2_expf4_core's operations in 8 double lanes; tab: avx2_expf_tab in 4 registers. */
static inline __m256 expf8_core(__m256 x, const __m512i tab[4]) {
    const __m512d inv_ln2_n = _mm512_set1_pd(EXPF_INV_LN2_N), shift = _mm512_set1_pd(EXPF_SHIFT);
    const __m512d xd = _mm512_cvtps_pd(x);
    const __m512d kd_shifted = _mm512_fmadd_pd(inv_ln2_n, xd, shift);
    const __m512i ki = _mm512_castpd_si512(kd_shifted);
    const __m512d kd = _mm512_sub_pd(kd_shifted, shift);
    const __m512d r = _mm512_fmsub_pd(inv_ln2_n, xd, kd);
    /* entry ki % 32: bits 0-3 pick within a pair of registers, bit 4 the pair */
    const __m512i lo = _mm512_permutex2var_epi64(tab[0], ki, tab[1]), hi = _mm512_permutex2var_epi64(tab[2], ki, tab[3]);
    __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
    t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
    const __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(EXPF_C0), r, _mm512_set1_pd(EXPF_C1));
    const __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(EXPF_C2), _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z, r2, y);
    return _mm512_cvtpd_ps(_mm512_mul_pd(y, _mm512_castsi512_pd(t)));
}

/* expf of 16 lanes, avx2_expf's bits: |x| >= 88 anywhere takes libm's expf for the vector. */
static inline __m512 expf16(__m512 x, const __m512i tab[4]) {
    const __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 20), _mm512_set1_epi32(0x7ff));
    if (__builtin_expect(_mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(0x42a)) != 0, 0)) {
        float v[16];
        _mm512_storeu_ps(v, x);
        for (int i = 0; i < 16; i++) v[i] = expf(v[i]);
        return _mm512_loadu_ps(v);
    }
    const __m256 lo = expf8_core(_mm512_castps512_ps256(x), tab);
    const __m256 hi = expf8_core(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)), tab);
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}

static inline void expf_tab(__m512i tab[4]) {
    for (int i = 0; i < 4; i++) tab[i] = _mm512_loadu_si512(avx2_expf_tab + 8 * i);
}

void cpu_swiglu_rows_avx512(float *g, const float *u, long n) {
    __m512i tab[4];
    expf_tab(tab);
    for (long i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        const __m512 e = expf16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))), tab);
        const __m512 y = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(y, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

void cpu_expf_avx512(const float *x, float *y, long n) {
    __m512i tab[4];
    expf_tab(tab);
    long i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, expf16(_mm512_loadu_ps(x + i), tab));
    for (; i < n; i++) y[i] = expf(x[i]);
}

#else
bool cpu_act_avx512_built(void) { return false; }
void cpu_swiglu_rows_avx512(float *g, const float *u, long n) {
    KV_ASSERT(!"cpu_swiglu_rows_avx512: not built");
}
void cpu_expf_avx512(const float *x, float *y, long n) {
    KV_ASSERT(!"cpu_expf_avx512: not built");
}
void qmm_quantize_row_avx512(const float *x, int64_t K, int8_t *q, float *d, int32_t *xs) {
    KV_ASSERT(!"qmm_quantize_row_avx512: not built");
}
void qmm16_quantize_row_avx512(const float *x, int64_t K, uint8_t *row) {
    KV_ASSERT(!"qmm16_quantize_row_avx512: not built");
}
#endif
