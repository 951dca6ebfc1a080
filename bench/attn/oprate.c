/* oprate.c — throughput of the instructions an attention step could be built
 * from, in ns per instruction on one core: 24 independent accumulators
 * (registers zmm0..23, so no dependency chain or spill limits the rate),
 * each instruction in a hand-written block, as the kernels would issue them.
 * It answers which arithmetic is cheap on this CPU: e.g. whether bf16 dot
 * products (vdpbf16ps, 32 multiply-adds) beat f32 FMAs (16) here.
 *   cc -O2 -march=native oprate.c -o oprate && ./oprate */
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define OP8(op, a, b, c, d, e, f, g, h) \
    op " %%zmm30,%%zmm31,%%zmm" #a "\n\t" op " %%zmm30,%%zmm31,%%zmm" #b "\n\t" \
    op " %%zmm30,%%zmm31,%%zmm" #c "\n\t" op " %%zmm30,%%zmm31,%%zmm" #d "\n\t" \
    op " %%zmm30,%%zmm31,%%zmm" #e "\n\t" op " %%zmm30,%%zmm31,%%zmm" #f "\n\t" \
    op " %%zmm30,%%zmm31,%%zmm" #g "\n\t" op " %%zmm30,%%zmm31,%%zmm" #h "\n\t"
#define OP24(op) OP8(op, 0, 1, 2, 3, 4, 5, 6, 7) OP8(op, 8, 9, 10, 11, 12, 13, 14, 15) \
                 OP8(op, 16, 17, 18, 19, 20, 21, 22, 23)
#define CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
                 "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", \
                 "xmm21", "xmm22", "xmm23"
#define TIME(name, macs, block)                                                                  \
    do {                                                                                         \
        double best = 1e9;                                                                       \
        for (int r = 0; r < 3; r++) {                                                            \
            double t = now();                                                                    \
            for (long i = 0; i < N; i++) __asm__ volatile(block ::: CLOBBERS);                   \
            t = (now() - t) / ((double)N * 24) * 1e9;                                            \
            best = t < best ? t : best;                                                          \
        }                                                                                        \
        printf("%-34s %6.3f ns  (%2d multiply-adds: %5.1f per ns)\n", name, best, macs, macs / best); \
    } while (0)

int main(void) {
#ifndef __AVX512F__
    printf("SKIP: built without AVX-512 (cc -march=native on a CPU that has it)\n");
    return 0;
#endif
    const long N = 20000000;
    __asm__ volatile("vpxord %%zmm30,%%zmm30,%%zmm30\n\tvpxord %%zmm31,%%zmm31,%%zmm31" ::: "xmm30", "xmm31");
    TIME("vfmadd231ps zmm (f32)", 16, OP24("vfmadd231ps"));
#ifdef __AVX512BF16__
    TIME("vdpbf16ps zmm (bf16 pairs)", 32, OP24("vdpbf16ps"));
#endif
#ifdef __AVX512VNNI__
    TIME("vpdpbusd zmm (u8 x s8 quads)", 64, OP24("vpdpbusd"));
    TIME("vpdpwssd zmm (s16 pairs)", 32, OP24("vpdpwssd"));
#endif
#ifdef __AVX512FP16__
    TIME("vfmadd231ph zmm (f16, f16 sums)", 32, OP24("vfmadd231ph"));
#endif
    return 0;
}
