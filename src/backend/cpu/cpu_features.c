/* cpu_features.c — run-time CPU feature detection (see cpu_features.h).
 * AVX-class bits come from the compiler's __builtin_cpu_supports, which
 * also checks that the OS saves the wide registers; AMX from CPUID leaf 7. */
#include "backend/cpu/cpu_features.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

void cpu_features_get(struct cpu_features *f) {
    memset(f, 0, sizeof *f);
    __builtin_cpu_init();
    f->avx2 = __builtin_cpu_supports("avx2");
    f->fma = __builtin_cpu_supports("fma");
    f->f16c = __builtin_cpu_supports("f16c");
    f->avx512f = __builtin_cpu_supports("avx512f");
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) f->amx_tile = (d >> 24) & 1;
}
#else
void cpu_features_get(struct cpu_features *f) { memset(f, 0, sizeof *f); }
#endif
