/* cpu_features.c — run-time CPU feature detection (see cpu_features.h).
 * AVX-class bits come from the compiler's __builtin_cpu_supports, which
 * also checks that the OS saves the wide registers; F16C and AMX straight
 * from CPUID, as not every compiler's builtin knows their names (F16C is
 * only used together with AVX2, whose check covers the OS side; AMX's OS
 * side is XCR0, read here, plus Linux's per-process permission). */
#include "backend/cpu/cpu_features.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* XCR0 (xgetbv ecx = 0), valid only where CPUID.1:ECX.OSXSAVE is set */
static unsigned long long xcr0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (unsigned long long)hi << 32 | lo;
}

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
    bool osxsave = false;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        f->f16c = (c >> 29) & 1;    /* CPUID.1:ECX.F16C */
        osxsave = (c >> 27) & 1;    /* CPUID.1:ECX.OSXSAVE: xgetbv is there */
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f->amx_tile = (d >> 24) & 1;   /* CPUID.7.0:EDX.AMX-TILE */
        f->amx_int8 = (d >> 25) & 1;   /* CPUID.7.0:EDX.AMX-INT8 */
    }
    f->amx_os = f->amx_tile && osxsave && (xcr0() & (3ull << 17)) == (3ull << 17);   /* XTILECFG, XTILEDATA */
    /* CPUID.7.1:EAX.AVX-VNNI; VEX-encoded ymm, so AVX2's OS check covers it */
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f->avxvnni = f->avx2 && ((a >> 4) & 1);
}
#else
void cpu_features_get(struct cpu_features *f) { memset(f, 0, sizeof *f); }
#endif

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023   /* <asm/prctl.h>, Linux 5.16+ */
#define XFEATURE_XTILEDATA 18

static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;
static int g_amx_err;

static void amx_request(void) {
    g_amx_err = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : errno;
}

int cpu_amx_permit(void) {
    pthread_once(&g_amx_once, amx_request);
    return g_amx_err;
}
#else
int cpu_amx_permit(void) { return ENOSYS; }
#endif
