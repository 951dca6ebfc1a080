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

#endif
