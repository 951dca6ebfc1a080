/* ggml-mm.c — llama.cpp's CPU matmul (ggml_mul_mat through ggml_graph_compute, 1 thread) timed
 * as mmbench.c times kvllm's: per (type, n), GFLOP/s by process CPU time, best of REPS.  Weights are
 * quantized by ggml itself from uniform [-1, 1) rows; activations f32 (ggml quantizes them to its
 * vec_dot type, as in a model).  Build: bench/mm/ggml-run.sh (needs llama-cpp-python's libggml and
 * ggml's headers). */
#include "ggml.h"
#include "ggml-cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const int64_t K = argc > 1 ? atol(argv[1]) : 2048, M = argc > 2 ? atol(argv[2]) : 2048;
    const int reps = argc > 3 ? atoi(argv[3]) : 5;
    const char *types = argc > 4 ? argv[4] : "Q4_0,Q8_0";
    static const int ns[] = { 1, 4, 16, 128 };
    ggml_cpu_init();
    printf("ggml (llama.cpp) K=%lld M=%lld, 1 thread, best of %d, CPU time\n| type | n | GFLOP/s |\n|---|---:|---:|\n",
           (long long)K, (long long)M, reps);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", types);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int t = -1;
        for (int i = 0; i < GGML_TYPE_COUNT; i++) {
            const char *nm = ggml_type_name((enum ggml_type)i);
            if (nm && !strcasecmp(nm, tok)) t = i;
        }
        if (t < 0) { fprintf(stderr, "unknown type %s\n", tok); continue; }
        for (size_t in = 0; in < sizeof ns / sizeof *ns; in++) {
            const int n = ns[in];
            struct ggml_init_params ip = { .mem_size = (size_t)K * M * 8 + (size_t)K * n * 8 + (size_t)M * n * 8 + (256 << 20),
                                           .mem_buffer = NULL, .no_alloc = false };
            struct ggml_context *ctx = ggml_init(ip);
            struct ggml_tensor *w = ggml_new_tensor_2d(ctx, (enum ggml_type)t, K, M);
            struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, n);
            float *src = malloc((size_t)K * M * sizeof *src);
            srand(1);
            for (int64_t i = 0; i < K * M; i++) src[i] = (float)rand() / RAND_MAX * 2 - 1;
            ggml_quantize_chunk((enum ggml_type)t, src, w->data, 0, M, K, NULL);
            for (int64_t i = 0; i < K * n; i++) ((float *)x->data)[i] = (float)rand() / RAND_MAX * 2 - 1;
            free(src);
            struct ggml_tensor *y = ggml_mul_mat(ctx, w, x);
            struct ggml_cgraph *gf = ggml_new_graph(ctx);
            ggml_build_forward_expand(gf, y);
            /* one plan and work buffer (ggml_graph_compute_with_ctx would take a new one from ctx per call) */
            struct ggml_cplan cp = ggml_graph_plan(gf, 1, NULL);
            void *work = malloc(cp.work_size ? cp.work_size : 1);
            cp.work_data = work;
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                const double t0 = cpu_now();
                int iters = 0;
                do {
                    ggml_graph_compute(gf, &cp);
                    iters++;
                } while (cpu_now() - t0 < 0.2);
                const double dt = (cpu_now() - t0) / iters;
                best = dt < best ? dt : best;
            }
            printf("| %s | %d | %.1f |\n", ggml_type_name((enum ggml_type)t), n, 2.0 * (double)K * M * n / best / 1e9);
            fflush(stdout);
            free(work);
            ggml_free(ctx);
        }
    }
    return 0;
}
