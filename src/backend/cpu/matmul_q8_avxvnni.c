/* matmul_q8_avxvnni.c — the integer matmul's kernels (qmm.h,
 * matmul_q8_kern.h) compiled with -mavx2 -mfma -mf16c -mavxvnni: 256-bit vpdpbusd (VEX).
 * Entered only when cpu_features_get() reports what they need. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/qmm.h"
#include "core/core.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVXVNNI__)
#include <immintrin.h>
bool cpu_q8_avxvnni_built(void) { return true; }
#define QMM_ISA 2
#define QMM_GROUP_FN qmm_group_avxvnni
#include "backend/cpu/matmul_q8_kern.h"
#else
bool cpu_q8_avxvnni_built(void) { return false; }
void qmm_group_avxvnni(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { KV_ASSERT(!"qmm_group_avxvnni: not built"); }
#endif
