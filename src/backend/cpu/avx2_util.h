/* avx2_util.h — lane reductions shared by the AVX2 kernel files (include
 * only from files compiled with -mavx2 -mfma -mf16c).  Each reduces in a
 * fixed order, as batch invariance needs. */
#ifndef KVLLM_AVX2_UTIL_H
#define KVLLM_AVX2_UTIL_H

#include <immintrin.h>

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

#endif
