/* matmul_q16_avx512.c — the 16-bit activation path's group kernel (qmm.h:
 * the logits' Q8_0 matrix on the avx512 and amx sets), compiled with
 * -mavx512f -mavx512bw -mavx512vl -mavx512vnni.  Entered only when
 * cpu_features_get() reports what it needs.
 *
 * A group of 16 interleaved rows, block by block: run j (4 codes of each
 * row, 64 bytes) is sign-extended to int16 in two halves of 8 rows, lane
 * 2i holding row i's codes 4j, 4j + 1 and lane 2i + 1 its codes 4j + 2, 4j
 * + 3; the token's 4 codes of the run, broadcast as one 64-bit pattern, meet
 * them in vpdpwssd.  After the 8 runs the even and odd lanes of the two
 * halves are added (vpermt2d): lane i is row i's P, exact in int32 — then
 * one conversion and one FMA per (row, token, block), as qmm.h defines.
 * Each block's widened codes stay in registers while the tokens of a tile
 * (up to TT) pass over them.  Results equal qmm16_ref_dot bit for bit. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/qmm.h"
#include "core/core.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__F16C__)
#include "backend/cpu/avx2_util.h"
#include <string.h>

bool cpu_q16_avx512_built(void) { return true; }

#define TT 4                /* tokens per tile */
#define PF 4096             /* software prefetch distance into the group (as matmul_q8_kern.h) */

ALWAYS_INLINE __m512i bc64(const int16_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return _mm512_set1_epi64(v);
}

/* Tokens [0, T) of the tile at act (rows astride bytes apart) against the
 * group's block at blk: acc[t] += P · (dw · dx). */
ALWAYS_INLINE void block(const int T, const uint8_t *blk, const uint8_t *act, size_t astride, int64_t K, int64_t b,
                         __m512 *acc) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512i lo[8], hi[8];   /* rows 0..7 and 8..15 of run j, as int16 */
    for (int j = 0; j < 8; j++) {
        lo[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(blk + 32 + 64 * j)));
        hi[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 + 64 * j)));
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)blk));
    for (int t = 0; t < T; t++) {
        const uint8_t *row = act + (size_t)t * astride;
        const int16_t *c = (const int16_t *)(const void *)row + b * QMM_BLK;
        float dx;
        memcpy(&dx, row + 2 * K + 4 * b, 4);
        /* two chains per half (runs 0-3, 4-7): integer sums, so the order is free */
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, b0 = a0, b1 = a0;
        for (int j = 0; j < 4; j++) {
            const __m512i x0 = bc64(c + 4 * j), x1 = bc64(c + 16 + 4 * j);
            a0 = _mm512_dpwssd_epi32(a0, lo[j], x0);
            b0 = _mm512_dpwssd_epi32(b0, hi[j], x0);
            a1 = _mm512_dpwssd_epi32(a1, lo[4 + j], x1);
            b1 = _mm512_dpwssd_epi32(b1, hi[4 + j], x1);
        }
        const __m512i a = _mm512_add_epi32(a0, a1), h = _mm512_add_epi32(b0, b1);
        const __m512i p = _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, h), _mm512_permutex2var_epi32(a, odd, h));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[t]);
    }
}

ALWAYS_INLINE void tile(const int T, const struct qmm_job *j, const uint8_t *g, const uint8_t *act, float *y,
                        int nr, bool first) {
    const size_t gb = qmm_gblock_bytes(DTYPE_Q8_0);
    __m512 acc[TT];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < j->K / QMM_BLK; b++) {
        const uint8_t *blk = g + (size_t)b * gb;
        if (first)   /* the pass that reads the group from memory */
            for (size_t o = 0; o < gb; o += 64) _mm_prefetch((const char *)blk + PF + o, _MM_HINT_T0);
        block(T, blk, act, j->astride, j->K, b, acc);
    }
    const __mmask16 m = (__mmask16)((1u << nr) - 1);
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + (size_t)t * j->ys, m, acc[t]);
}

void qmm16_group_avx512(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) {
    for (int t0 = 0; t0 < j->n; t0 += TT) {
        const uint8_t *act = j->act + (size_t)t0 * j->astride;
        float *y = j->y + (size_t)t0 * j->ys + (size_t)r0;
        switch (j->n - t0 < TT ? j->n - t0 : TT) {
        case 1: tile(1, j, g, act, y, nr, t0 == 0); break;
        case 2: tile(2, j, g, act, y, nr, t0 == 0); break;
        case 3: tile(3, j, g, act, y, nr, t0 == 0); break;
        default: tile(TT, j, g, act, y, nr, t0 == 0); break;
        }
    }
}

#else
bool cpu_q16_avx512_built(void) { return false; }
void qmm16_group_avx512(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) {
    KV_ASSERT(!"qmm16_group_avx512: not built");
}
#endif
