/* act_avx512.c — the integer paths' activation rows (qmm.h) quantized with
 * AVX-512: qmm_quantize_row's 8-bit codes and qmm16_quantize_row's 16-bit
 * ones, 16 lanes at a time with the same arithmetic (the block's largest
 * |x|, the same two IEEE divisions, x times the inverse rounded half-even by
 * the conversion's default rounding, where the scalar code adds and removes
 * 1.5 * 2^23: both exact for |x * id| <= 32767).  For finite x the codes,
 * scales and sums are the scalar functions' bit for bit (test_backend_qmm16
 * checks); the scalar ones stay the definition.  The 8-bit row was 9 % of a
 * small model's prefill (`perf`, qwen3 160 M, pp512) when done a value at a
 * time.  Compiled with the AVX-512 F/BW/VL flags alone; entered only on the
 * avx512 and amx sets. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/qmm.h"
#include "core/core.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

bool cpu_act_avx512_built(void) { return true; }

/* The block's 32 values at x times its inverse scale, as int32 codes; *scale = its largest |x| / qmax. */
static inline void codes32(const float *x, float qmax, float *scale, __m512i *c0, __m512i *c1) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const __m512 id = _mm512_set1_ps(qmm_inv_scale(qmax, amax));
    *scale = amax / qmax;
    *c0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id));
    *c1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
}

void qmm_quantize_row_avx512(const float *x, int64_t K, int8_t *q, float *d, int32_t *xs) {
    for (int64_t b = 0; b < K / QMM_BLK; b++) {
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
    for (int64_t b = 0; b < K / QMM_BLK; b++) {
        __m512i c0, c1;
        codes32(x + b * QMM_BLK, QMM16_MAX, &d[b], &c0, &c1);
        _mm256_storeu_si256((__m256i *)(void *)(q + b * QMM_BLK), _mm512_cvtepi32_epi16(c0));
        _mm256_storeu_si256((__m256i *)(void *)(q + b * QMM_BLK + 16), _mm512_cvtepi32_epi16(c1));
    }
}

#else
bool cpu_act_avx512_built(void) { return false; }
void qmm_quantize_row_avx512(const float *x, int64_t K, int8_t *q, float *d, int32_t *xs) {
    KV_ASSERT(!"qmm_quantize_row_avx512: not built");
}
void qmm16_quantize_row_avx512(const float *x, int64_t K, uint8_t *row) {
    KV_ASSERT(!"qmm16_quantize_row_avx512: not built");
}
#endif
