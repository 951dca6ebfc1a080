/* cpu_features.h — what the running CPU offers, and the kernel sets built on
 * it.  The release binary targets any x86-64: SIMD kernels live in files
 * compiled with their own -m flags and are entered only after
 * cpu_features_get() says the CPU (and OS) support them. */
#ifndef KVLLM_CPU_FEATURES_H
#define KVLLM_CPU_FEATURES_H

#include "backend/backend.h"
#include <stdbool.h>

struct cpu_features {
    bool avx2, fma, f16c;   /* the "avx2" kernel set needs all three */
    bool avx512f;           /* AVX-512 Foundation */
    bool avx512bw, avx512vl, avx512vnni;   /* the "avx512" kernel set needs these, avx512f and the avx2 trio */
    bool avxvnni;           /* AVX-VNNI (VEX vpdpbusd): the avx2 set's integer kernels use it when present */
    bool amx_tile, amx_int8;   /* CPUID.7.0:EDX bits 24, 25 */
    bool amx_os;            /* XCR0 bits 17-18: the OS saves tile state (Linux still asks each process to
                               request it: cpu_amx_permit) */
};

/* Fill *f for the running CPU (all false off x86).  Cheap; thread-safe. */
void cpu_features_get(struct cpu_features *f);

/* Whether this build contains the AVX2 kernels (x86-64 builds only). */
bool cpu_avx2_built(void);
/* Whether it contains the integer matmul's kernels per instruction set
 * (matmul_q8_*.c; qmm.h). */
bool cpu_q8_avx2_built(void);
bool cpu_q8_avxvnni_built(void);
bool cpu_q8_avx512_built(void);
bool cpu_q8_amx_built(void);        /* the compiler took -mamx-tile -mamx-int8 */
bool cpu_q8_amx_emu_built(void);    /* the AMX kernel on emulated tiles (tests; needs the avx512 flags) */

/* Linux keeps AMX tile data off until a process asks (arch_prctl
 * ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); the first tile instruction
 * before that dies with SIGILL.  Asks once per process (thread-safe; the
 * answer is remembered) and returns 0 when granted, else the errno of the
 * refusal (ENOSYS off Linux x86-64).  The permission covers every thread. */
int cpu_amx_permit(void);

/* AVX2 + FMA + F16C kernels (matmul_avx2.c).  Same contract as the scalar
 * ops in backend.h; call only when cpu_features_get() reports avx2, fma and
 * f16c.  cpu_matmul_avx2 needs scratch_cols >= CPU_AVX2_MM_ROWS * ne0. */
#define CPU_AVX2_MM_ROWS 4
int cpu_matmul_avx2(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n);

/* The integer path (matmul_int_avx2.c): whether it takes weights of type
 * with rows of K, the bytes one quantized activation row of K takes (the
 * context sizes its buffer with it), and the matmul itself (same contract
 * as ops.matmul; n at most the context's max_tokens). */
bool cpu_matmul_int_supports(uint32_t type, int64_t K);
size_t cpu_matmul_int_row_bytes(int64_t K);
int cpu_matmul_int_avx2(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n);

#endif
