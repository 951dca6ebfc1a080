/* cpu_features.c — run-time CPU feature detection (see cpu_features.h).
 * AVX-class bits come from the compiler's __builtin_cpu_supports, which
 * also checks that the OS saves the wide registers; F16C and AMX straight
 * from CPUID, as not every compiler's builtin knows their names (F16C is
 * only used together with AVX2, whose check covers the OS side). */
#include "backend/cpu/cpu_features.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

void cpu_features_get(struct cpu_features *f) {
    memset(f, 0, sizeof *f);
    __builtin_cpu_init();
    f->avx2 = __builtin_cpu_supports("avx2");
    f->fma = __builtin_cpu_supports("fma");
    f->avx512f = __builtin_cpu_supports("avx512f");
    f->avx512bw = __builtin_cpu_supports("avx512bw");
    f->avx512vl = __builtin_cpu_supports("avx512vl");
    f->avx512vnni = __builtin_cpu_supports("avx512vnni");
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) f->f16c = (c >> 29) & 1;   /* CPUID.1:ECX.F16C */
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) f->amx_tile = (d >> 24) & 1;  /* CPUID.7.0:EDX.AMX-TILE */
    /* CPUID.7.1:EAX.AVX-VNNI; VEX-encoded ymm, so AVX2's OS check covers it */
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f->avxvnni = f->avx2 && ((a >> 4) & 1);
}
#else
void cpu_features_get(struct cpu_features *f) { memset(f, 0, sizeof *f); }
#endif
