/* mmbench.c — one matmul shape timed per kernel path, by CPU time of the
 * calling process (robust on a shared, loaded machine: time other
 * processes take is not counted, though their cache pressure is).
 * Build and run: bench/mm/run.sh BUILD_DIR (links BUILD_DIR's static libs).
 * Prints, per (type, n): GFLOP/s and ns per weight byte for
 * f32 activations on avx2, q8 on avx2 (plain AVX2 rows and AVX-VNNI rows),
 * q8 on avx512 and on amx (where the CPU has it), each the best of --reps. */
#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/qmm.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct backend_ctx *mk(const char *kind, const char *act, int64_t K, int n) {
    struct backend *be = NULL;
    enum backend_act a;
    if (backend_act_parse(act, &a) || backend_cpu_new(kind, false, a, &be)) return NULL;
    struct backend_ctx_params p = { .n_threads = 1, .max_tokens = n, .max_ctx = 1, .n_head = 1, .head_dim = 1,
                                    .max_cols = K };
    struct backend_ctx *c = NULL;
    if (backend_ctx_new(be, &p, &c)) return NULL;
    return c;
}

int main(int argc, char **argv) {
    const int64_t K = argc > 1 ? atol(argv[1]) : 2048, M = argc > 2 ? atol(argv[2]) : 2048;
    const int reps = argc > 3 ? atoi(argv[3]) : 5;
    /* argv[4]: the types, comma-separated (default Q4_0,Q8_0,Q4_1; any block type kvllm computes with) */
    uint32_t types[16] = { DTYPE_Q4_0, DTYPE_Q8_0, DTYPE_Q4_1 };
    size_t n_types = 3;
    if (argc > 4) {
        n_types = 0;
        char buf[256];
        snprintf(buf, sizeof buf, "%s", argv[4]);
        for (char *tok = strtok(buf, ","); tok && n_types < 16; tok = strtok(NULL, ","))
            for (uint32_t t = 0; t < DTYPE_COUNT_; t++)
                if (dtype_supported(t) && dtype_block_elems(t) > 1 && !strcmp(tok, dtype_name(t))) types[n_types++] = t;
    }
    static const int ns[] = { 1, 4, 8, 12, 16, 32, 128 };
    struct cpu_features f;
    cpu_features_get(&f);
    struct rng rg;
    rng_seed(&rg, 1);
    float *x = malloc((size_t)128 * K * sizeof *x), *y = malloc((size_t)128 * M * sizeof *y);
    float *row = malloc((size_t)K * sizeof *row);
    for (int64_t i = 0; i < 128 * K; i++) x[i] = rng_f32(&rg) * 2 - 1;
    printf("K=%lld M=%lld, 1 thread, best of %d, CPU time\n| type | n | path | GFLOP/s | ratio vs f32 |\n|---|---:|---|---:|---:|\n",
           (long long)K, (long long)M, reps);
    for (size_t it = 0; it < n_types; it++) {
        uint64_t rb;
        dtype_row_bytes(types[it], (uint64_t)K, &rb);
        uint8_t *data = malloc(rb * (size_t)M);
        for (int64_t r = 0; r < M; r++) {
            for (int64_t k = 0; k < K; k++) row[k] = rng_f32(&rg) * 2 - 1;
            dtype_from_f32(types[it], row, data + (size_t)r * rb, K);
        }
        struct tensor w = { .type = types[it], .ne0 = K, .ne1 = M, .row_bytes = rb, .data = data };
        for (size_t in = 0; in < sizeof ns / sizeof *ns; in++) {
            const int n = ns[in];
            struct { const char *name, *kind, *act; qmm_group_fn *rows; } paths[] = {
                { "f32 avx2", "avx2", "f32", NULL }, { "int13 avx2", "avx2", "int", NULL },
                { "q8 avx2", "avx2", "q8", qmm_group_avx2 }, { "q8 avxvnni", "avx2", "q8", qmm_group_avxvnni },
                { "q8 avx512", "avx512", "q8", qmm_group_avx512 },
                { "q8 amx", "amx", "q8", qmm_group_amx } };   /* where the CPU has AMX-INT8: else not created, skipped */
            double base = 0;
            for (size_t ip = 0; ip < sizeof paths / sizeof *paths; ip++) {
                if (paths[ip].rows == qmm_group_avxvnni && !(f.avxvnni && cpu_q8_avxvnni_built())) continue;
                if (paths[ip].act[0] == 'i' && !cpu_matmul_int_supports(types[it], K)) continue;
                struct backend_ctx *c = mk(paths[ip].kind, paths[ip].act, K, n);
                if (!c) continue;
                struct tensor pw = w, *pp = &pw;   /* placed: repacked for the q8 kernels */
                uint64_t placed;
                if (paths[ip].rows && c->be->ops->place_weights(c->be, &pp, 1, NULL, &placed)) continue;
                double best = 1e30;
                for (int r = 0; r < reps; r++) {
                    double t0 = cpu_now();
                    int iters = 0;
                    do {
                        if (paths[ip].rows) qmm_matmul(c, y, &pw, x, n, paths[ip].rows);
                        else c->ops->matmul(c, y, &pw, x, n);
                        iters++;
                    } while (cpu_now() - t0 < 0.2);
                    double dt = (cpu_now() - t0) / iters;
                    if (dt < best) best = dt;
                }
                double gf = 2.0 * (double)K * (double)M * n / best / 1e9;
                if (ip == 0) base = gf;
                printf("| %s | %d | %s | %.1f | %.2f |\n", dtype_name(types[it]), n, paths[ip].name, gf, gf / base);
                fflush(stdout);
                struct backend *be = c->be;
                backend_ctx_free(c);
                backend_free(be);
            }
        }
        free(data);
    }
    return 0;
}
