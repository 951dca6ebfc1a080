/* readbw.c — read bandwidth at one working-set size: THREADS threads each
 * XOR their slice of an S MiB buffer with 512-bit loads (4 chains), enough
 * passes for 256 MiB read in all; prints the best of R runs in GB/s (the
 * slowest thread's time).  `kvllm bench membw` measures 512 MiB only; the
 * decode roofline at depth needs the sizes in between too: the KV cache of
 * Gemma 3 at 8k (33 MB f16) sits in L3 or DRAM depending on what else ran.
 *   cc -O2 -mavx512f -pthread readbw.c -o readbw && ./readbw S_MIB THREADS [R] */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

struct job {
    const char *p;              /* slice, 64-byte aligned, n bytes (a multiple of 256) */
    size_t n;
    int passes;
    pthread_barrier_t *go;
    double t;                   /* seconds for all passes */
    __m512i sink;
};

static void *reader(void *arg) {
    struct job *j = arg;
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    pthread_barrier_wait(j->go);
    const double t0 = now();
    for (int ps = 0; ps < j->passes; ps++)
        for (size_t i = 0; i < j->n; i += 256) {
            const __m512i *q = (const __m512i *)(j->p + i);
            s0 = _mm512_xor_si512(s0, _mm512_load_si512(q));
            s1 = _mm512_xor_si512(s1, _mm512_load_si512(q + 1));
            s2 = _mm512_xor_si512(s2, _mm512_load_si512(q + 2));
            s3 = _mm512_xor_si512(s3, _mm512_load_si512(q + 3));
        }
    j->t = now() - t0;
    j->sink = _mm512_xor_si512(_mm512_xor_si512(s0, s1), _mm512_xor_si512(s2, s3));
    return NULL;
}

int main(int argc, char **argv) {
    const double mib = argc > 1 ? atof(argv[1]) : 0;
    const int nth = argc > 2 ? atoi(argv[2]) : 1, reps = argc > 3 ? atoi(argv[3]) : 15;
    if (mib < 1 || nth < 1 || nth > 64 || reps < 1) {
        fprintf(stderr, "usage: readbw S_MIB THREADS [REPS]\n");
        return 2;
    }
    const size_t slice = (size_t)(mib * 1048576) / (size_t)nth / 256 * 256, size = slice * (size_t)nth;
    char *buf = aligned_alloc(2 << 20, (size + (2 << 20) - 1) / (2 << 20) * (2 << 20));
    if (!buf) return 1;
    memset(buf, 1, size);
    const int passes = size >= (256u << 20) ? 1 : (int)((256u << 20) / size);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        pthread_t th[64];
        struct job j[64];
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, (unsigned)nth);
        for (int i = 0; i < nth; i++) {
            j[i] = (struct job){ .p = buf + slice * (size_t)i, .n = slice, .passes = passes, .go = &go };
            pthread_create(&th[i], NULL, reader, &j[i]);
        }
        double slowest = 0;
        for (int i = 0; i < nth; i++) {
            pthread_join(th[i], NULL);
            slowest = j[i].t > slowest ? j[i].t : slowest;
        }
        pthread_barrier_destroy(&go);
        const double gbs = (double)size * passes / slowest / 1e9;
        best = gbs > best ? gbs : best;
    }
    printf("%8.1f MiB, %d thread(s): %.1f GB/s (best of %d)\n", (double)size / 1048576, nth, best, reps);
    free(buf);
    return 0;
}
