/* avx2_util.h — lane reductions shared by the AVX2 kernel files (include
 * only from files compiled with -mavx2 -mfma -mf16c).  Each reduces in a
 * fixed order, as batch invariance needs. */
#ifndef KVLLM_AVX2_UTIL_H
#define KVLLM_AVX2_UTIL_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Sum of the 8 lanes: halves added, then pairs. */
ALWAYS_INLINE float avx2_hsum(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* Sum of the 8 lanes in the order ((0+1)+(2+3))+((4+5)+(6+7)) (two hadds):
 * the order the matmul kernels' batch-invariance arguments use. */
ALWAYS_INLINE float avx2_hsum_pairs(__m256 a) {
    __m256 h = _mm256_hadd_ps(a, a);     /* 0+1, 2+3, ., . | 4+5, 6+7, ., . */
    h = _mm256_hadd_ps(h, h);            /* (0+1)+(2+3) ... | (4+5)+(6+7) ... */
    return _mm_cvtss_f32(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

/* Lane i of the result: avx2_hsum_pairs(a_i), bit for bit (hadd adds the
 * same pairs in the same order), four sums for the price of one. */
ALWAYS_INLINE __m128 avx2_hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* v, pinned in a register: GCC otherwise folds a load that several FMAs
 * share into each of them as a memory operand, which turns a register-
 * blocked micro-kernel back into one load per FMA. */
ALWAYS_INLINE __m256 avx2_reg(__m256 v) {
    __asm__("" : "+x"(v));
    return v;
}

/* Largest of the 8 lanes. */
ALWAYS_INLINE float avx2_hmax(__m256 a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* Lanes < n (0..8) of a mask (maskload / maskstore). */
ALWAYS_INLINE __m256i avx2_lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* exp(x) for x <= 0 (attention's scores minus their running max; GELU's -|2u|), about 1 ulp: Cody-Waite
 * reduction by ln 2 and Cephes' degree-6 polynomial; x < -87.3 (and -inf)
 * gives 0. */
ALWAYS_INLINE __m256 avx2_exp_neg(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* fx >= -126 here, so 2^fx is a normal float */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* expf(x) of 8 lanes, bit for bit glibc's (2.28 on: the algorithm of Arm's
 * optimized-routines) as its FMA build computes it, which is the one glibc
 * picks on every CPU with AVX2 and FMA: in double, x/ln2 scaled by 32 is
 * split into k + r (k rounded by the 1.5 2^52 shift), 2^(k/32) is a table
 * entry with k's upper bits added to its exponent, and 2^(r/32) a degree-3
 * polynomial; the fused multiply-adds are exactly where that build has
 * them.  Lanes with |x| >= 88 (overflow, underflow, inf, NaN) take libm's
 * expf itself, a vector at a time (rare in an activation).  Why: SwiGLU
 * needs the scalar op's bits (a ~1 ulp exp moved top-1 near-ties of the
 * KLD suite) at vector speed.  test_backend_ops holds it to libm's expf
 * (checked on all 2^32 inputs against Debian 12's glibc 2.36): a C library
 * whose expf rounds otherwise fails that check, which is the signal that
 * the SIMD sets' SwiGLU no longer equals the scalar op's. */
static const uint64_t avx2_expf_tab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};

/* Its constants: 32 / ln 2, the rounding shift 1.5 2^52, the polynomial's coefficients (r^3, r^2, r). */
#define EXPF_INV_LN2_N 0x1.71547652b82fep+5
#define EXPF_SHIFT 0x1.8p+52
#define EXPF_C0 0x1.c6af84b912394p-20
#define EXPF_C1 0x1.ebfce50fac4f3p-13
#define EXPF_C2 0x1.62e42ff0c52d6p-6

/* expf of 4 lanes (|x| < 88), in double. */
ALWAYS_INLINE __m128 avx2_expf4_core(__m128 x) {
    const __m256d inv_ln2_n = _mm256_set1_pd(EXPF_INV_LN2_N), shift = _mm256_set1_pd(EXPF_SHIFT);
    const __m256d xd = _mm256_cvtps_pd(x);
    const __m256d kd_shifted = _mm256_fmadd_pd(inv_ln2_n, xd, shift);
    const __m256i ki = _mm256_castpd_si256(kd_shifted);
    const __m256d kd = _mm256_sub_pd(kd_shifted, shift);
    const __m256d r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);
    __m256i t = _mm256_i64gather_epi64((const long long *)avx2_expf_tab, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
    const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(EXPF_C0), r, _mm256_set1_pd(EXPF_C1));
    const __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(EXPF_C2), _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(z, r2, y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(t)));
}

ALWAYS_INLINE __m256 avx2_expf(__m256 x) {
    /* |x| >= 88: the top 12 bits of |x| at least 88.0f's (0x42b) */
    const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), _mm256_set1_epi32(0x7ff));
    if (__builtin_expect(!_mm256_testz_si256(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a)), _mm256_set1_epi32(-1)), 0)) {
        float v[8];
        _mm256_storeu_ps(v, x);
        for (int i = 0; i < 8; i++) v[i] = expf(v[i]);
        return _mm256_loadu_ps(v);
    }
    return _mm256_set_m128(avx2_expf4_core(_mm256_extractf128_ps(x, 1)), avx2_expf4_core(_mm256_castps256_ps128(x)));
}

#endif
