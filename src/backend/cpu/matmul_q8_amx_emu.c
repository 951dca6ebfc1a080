/* matmul_q8_amx_emu.c — the AMX kernel (matmul_q8_amx_kern.h) on the tile
 * emulator (amx_emu.c), compiled with the avx512 set's flags: the same
 * source as matmul_q8_amx.c, every tile instruction a call that checks its
 * operands as the processor would (an assert where it would fault).  For
 * tests (test_backend_amx.c) only: no kernel set uses it. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/qmm.h"
#include "core/core.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#include "backend/cpu/amx_tile.h"
bool cpu_q8_amx_emu_built(void) { return true; }

#define QMM_AMX_EMU 1
#define QMM_AMX_FN qmm_group_amx_emu
#define QMM_AMX_MIN_N 0   /* every token count through the tiles */
#define QMM_AMX_TAIL_VNNI 0
#define T_STATE_PARAM struct amx_emu *ts_
#define T_STATE_ARG ts_
#define T_STATE_DECL struct amx_emu ts_regs_, *ts_ = &ts_regs_
#define T_CONFIG(c) KV_ASSERT(amx_emu_config(ts_, (c)) == 0)
#define T_RELEASE() amx_emu_release(ts_)
#define T_ZERO(t) KV_ASSERT(amx_emu_zero(ts_, (t)) == 0)
#define T_LOAD(t, p, s) KV_ASSERT(amx_emu_load(ts_, (t), (p), (size_t)(s)) == 0)
#define T_STORE(t, p, s) KV_ASSERT(amx_emu_store(ts_, (t), (p), (size_t)(s)) == 0)
#define T_DPBSSD(c, a, b) KV_ASSERT(amx_emu_dpbssd(ts_, (c), (a), (b)) == 0)
#define T_DPBSUD(c, a, b) KV_ASSERT(amx_emu_dpbsud(ts_, (c), (a), (b)) == 0)
#include "backend/cpu/matmul_q8_amx_kern.h"
#else
bool cpu_q8_amx_emu_built(void) { return false; }
void qmm_group_amx_emu(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) {
    KV_ASSERT(!"qmm_group_amx_emu: not built");
}
#endif
