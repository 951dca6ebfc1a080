/* matmul_q8_avx512.c — the integer matmul's kernels (qmm.h,
 * matmul_q8_kern.h) compiled with -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni: 512-bit vpdpbusd, two rows per register.
 * Entered only when cpu_features_get() reports what they need. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/qmm.h"
#include "core/core.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
bool cpu_q8_avx512_built(void) { return true; }
#define QMM_ISA 3
#define QMM_GROUP_FN qmm_group_avx512
#include "backend/cpu/matmul_q8_kern.h"
#else
bool cpu_q8_avx512_built(void) { return false; }
void qmm_group_avx512(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { KV_ASSERT(!"qmm_group_avx512: not built"); }
#endif
