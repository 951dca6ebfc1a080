/* matmul_q8_amx.c — the integer matmul's AMX-INT8 kernel (qmm.h,
 * matmul_q8_amx_kern.h) on the real tiles, compiled with the avx512 set's
 * flags plus -mamx-tile -mamx-int8.  Entered only when cpu_features_get()
 * reports AMX-TILE, AMX-INT8 and the OS's tile state, and cpu_amx_permit()
 * has obtained Linux's permission (cpu.c).
 *
 * Every tile instruction is inline asm naming the memory it touches
 * (amx_tile.h says why not GCC's intrinsics): ldtilecfg takes the whole
 * 64-byte config as its "m" operand; tileloadd and tilestored clobber
 * "memory", so the stores filling wbuf happen before the load and cbuf is
 * read after the store.  Volatile asm statements keep their order. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/qmm.h"
#include "core/core.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__F16C__) && defined(__FMA__) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include <immintrin.h>
#include "backend/cpu/amx_tile.h"
bool cpu_q8_amx_built(void) { return true; }

#define AMX_STR_(x) #x
#define AMX_STR(x) AMX_STR_(x)

static inline void amx_ldtilecfg(const struct amx_cfg *c) {
    __asm__ volatile("ldtilecfg %0" : : "m"(*c));   /* the operand is all 64 bytes (the GCC 12 bug: 8) */
}

#define QMM_AMX_EMU 0
#define QMM_AMX_FN qmm_group_amx
/* Fewer than 16 tokens, and the last n % 16 of a job, take the AVX-512 VNNI kernel (same bits):
 * a tile costs the same whatever its rows, and bench/mm measured a 12-token tile slower than VNNI
 * (Q8_0 K 576: 281 vs 303 GFLOP/s; 4 tokens: 109 vs 300), 16 faster (415 vs 303). */
#define QMM_AMX_MIN_N 16
#define QMM_AMX_TAIL_VNNI 1
#define T_STATE_PARAM const void *ts_
#define T_STATE_ARG ts_
#define T_STATE_DECL const void *ts_ = NULL
#define T_CONFIG(c) amx_ldtilecfg(c)
#define T_RELEASE() __asm__ volatile("tilerelease" ::: "memory")
#define T_ZERO(t) __asm__ volatile("tilezero %%tmm" AMX_STR(t) ::)
#define T_LOAD(t, p, s) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" AMX_STR(t) : : "r"((const void *)(p)), "r"((long)(s)) : "memory")
#define T_STORE(t, p, s) \
    __asm__ volatile("tilestored %%tmm" AMX_STR(t) ", (%0,%1,1)" : : "r"((void *)(p)), "r"((long)(s)) : "memory")
/* AT&T order: tdpbssd %tmm<b>, %tmm<a>, %tmm<c> is Intel's tdpbssd tmm<c>, tmm<a>, tmm<b> */
#define T_DPBSSD(c, a, b) __asm__ volatile("tdpbssd %%tmm" AMX_STR(b) ", %%tmm" AMX_STR(a) ", %%tmm" AMX_STR(c) ::)
#define T_DPBSUD(c, a, b) __asm__ volatile("tdpbsud %%tmm" AMX_STR(b) ", %%tmm" AMX_STR(a) ", %%tmm" AMX_STR(c) ::)
#include "backend/cpu/matmul_q8_amx_kern.h"

void amx_hw_product(const struct amx_cfg *cfg, int b_unsigned, const void *a, size_t as, const void *b, size_t bs,
                    void *c, size_t cs) {
    amx_ldtilecfg(cfg);
    T_LOAD(0, c, cs);
    T_LOAD(1, a, as);
    T_LOAD(2, b, bs);
    if (b_unsigned) T_DPBSUD(0, 1, 2);
    else T_DPBSSD(0, 1, 2);
    T_STORE(0, c, cs);
    T_RELEASE();
}
#else
bool cpu_q8_amx_built(void) { return false; }
void qmm_group_amx(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { KV_ASSERT(!"qmm_group_amx: not built"); }
#include "backend/cpu/amx_tile.h"
void amx_hw_product(const struct amx_cfg *cfg, int b_unsigned, const void *a, size_t as, const void *b, size_t bs,
                    void *c, size_t cs) {
    KV_ASSERT(!"amx_hw_product: not built");
}
#endif
