/* attnbench.c — the paged-attention step kernels alone on the TinyLlama-1.1B
 * decode shape (22 layers, 32 query heads, 4 KV heads, head_dim 64, blocks
 * of 16 shuffled in the pool): one token at position L-1 per layer, every
 * layer's own K/V (22 layers at L = 2048 are 46 MB in f16, past L2 as in a
 * real decode).  Reports the best of R rounds of process CPU time per token
 * (all 22 layers) for the AVX2 and AVX-512 steps, alternating, which the
 * other load on a shared machine disturbs less than wall time (the best
 * wall time per token is printed beside it: a step that leaves a thread
 * idle shows there).  Other shapes: NH query heads, NKV kv heads, HD head
 * size, WINDOW > 0 a sliding window (Gemma 3 270M: 4 1 256, its sliding
 * layers 512).  BS=N in the environment sets the block size (default 16);
 * PREFILL=1 times a prefill instead: L tokens of one sequence at positions
 * 0 .. L-1 per layer (SmolLM2-135M: 9 3 64).
 *   attnbench [L [THREADS [REPS [KV_TYPE 0..4 [ROUNDS [LAYERS [NH NKV HD [WINDOW]]]]]]]]] */
#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "tensor/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double clock_s(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int L = argc > 1 ? atoi(argv[1]) : 2048, nth = argc > 2 ? atoi(argv[2]) : 1;
    const int reps = argc > 3 ? atoi(argv[3]) : 5, rounds = argc > 5 ? atoi(argv[5]) : 6;
    const enum kv_type type = argc > 4 ? (enum kv_type)atoi(argv[4]) : KV_F16;
    const int NL = argc > 6 ? atoi(argv[6]) : 22, nh = argc > 9 ? atoi(argv[7]) : 32,
              nkv = argc > 9 ? atoi(argv[8]) : 4, hd = argc > 9 ? atoi(argv[9]) : 64,
              window = argc > 10 ? atoi(argv[10]) : 0, bs = getenv("BS") ? atoi(getenv("BS")) : 16, nb = (L + bs - 1) / bs;
    if (L < 1 || nth < 1 || reps < 1 || rounds < 1 || NL < 1 || (int)type < 0 || type >= KV_TYPE_COUNT_ ||
        nkv < 1 || nh % nkv != 0 || hd < 1 || hd > CPU_PAGED_ATTN_MAX_HEAD_DIM || window < 0) {
        fprintf(stderr, "usage: attnbench [L [THREADS [REPS [KV_TYPE 0..4 [ROUNDS [LAYERS [NH NKV HD [WINDOW]]]]]]]]]\n");
        return 2;
    }
    struct cpu_features f;
    cpu_features_get(&f);
    if (!cpu_attn_avx512_built() || !f.avx512f || !f.avx2 || !f.fma || !f.f16c) {
        printf("SKIP: this build or CPU lacks the AVX-512 attention step\n");
        return 0;
    }
    const size_t es = kv_elem_bytes(type), rows = (size_t)nb * bs * nkv;
    struct kv_layer_view *v = calloc((size_t)NL, sizeof *v);
    srand(1);
    for (int l = 0; l < NL; l++) {
        v[l] = (struct kv_layer_view){ .type = type, .block_size = bs, .n_head_kv = nkv, .head_dim = hd };
        v[l].k = malloc(rows * hd * es);
        v[l].v = malloc(rows * hd * es);
        v[l].k_scale = malloc(rows * sizeof(float));
        v[l].v_scale = malloc(rows * sizeof(float));
        for (size_t i = 0; i < rows; i++) v[l].k_scale[i] = v[l].v_scale[i] = 0.01f;
        for (size_t i = 0; i < rows * hd; i++) {
            const float x = (float)rand() / (float)RAND_MAX - 0.5f;
            switch (type) {
            case KV_F32: ((float *)v[l].k)[i] = x; ((float *)v[l].v)[i] = x; break;
            case KV_F16: ((uint16_t *)v[l].k)[i] = f32_to_f16(x); ((uint16_t *)v[l].v)[i] = f32_to_f16(x); break;
            case KV_BF16: ((uint16_t *)v[l].k)[i] = f32_to_bf16(x); ((uint16_t *)v[l].v)[i] = f32_to_bf16(x); break;
            case KV_INT8: ((int8_t *)v[l].k)[i] = (int8_t)(x * 250); ((int8_t *)v[l].v)[i] = (int8_t)(x * 250); break;
            default: ((uint8_t *)v[l].k)[i] = f32_to_fp8_e4m3(x); ((uint8_t *)v[l].v)[i] = f32_to_fp8_e4m3(x); break;
            }
        }
    }
    int32_t *table = malloc((size_t)nb * sizeof *table);
    for (int i = 0; i < nb; i++) table[i] = (int32_t)(((long)i * 7919) % nb);   /* scattered blocks */
    const bool prefill = getenv("PREFILL") && atoi(getenv("PREFILL")) > 0;
    const int nt = prefill ? L : 1;
    float *q = malloc((size_t)nt * nh * hd * sizeof *q), *out = malloc((size_t)nt * nh * hd * sizeof *out);
    int32_t *pos = malloc((size_t)nt * sizeof *pos), *seq = calloc((size_t)nt, sizeof *seq);
    for (size_t i = 0; i < (size_t)nt * nh * hd; i++) q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int t = 0; t < nt; t++) pos[t] = L - nt + t;

    struct backend *be = NULL;
    struct backend_ctx *c = NULL;
    const struct backend_ctx_params p = { .n_threads = nth, .max_tokens = nt, .max_ctx = L, .n_head = nh,
                                          .head_dim = hd, .max_cols = 64 };
    if (backend_cpu_new("scalar", false, BACKEND_ACT_F32, &be) || backend_ctx_new(be, &p, &c)) {
        fprintf(stderr, "attnbench: no backend context\n");
        return 1;
    }
    int (*const fn[2])(struct backend_ctx *, const struct paged_attn_args *) = { cpu_paged_attention_avx2,
                                                                                cpu_paged_attention_avx512 };
    double best[2] = { 1e30, 1e30 }, wall[2] = { 1e30, 1e30 };
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
            const double t0 = clock_s(CLOCK_PROCESS_CPUTIME_ID), w0 = clock_s(CLOCK_MONOTONIC);
            for (int i = 0; i < reps; i++)
                for (int l = 0; l < 22; l++) {
                    const struct paged_attn_args a = { .n_tokens = nt, .n_head = nh, .n_head_kv = nkv, .head_dim = hd,
                                                       .q = q, .pos = pos, .seq = seq, .block_table = table,
                                                       .max_blocks = nb, .kv = v[l % NL], .scale = 0.125f,
                                                       .window = window, .out = out };
                    if (fn[k](c, &a)) return 1;
                }
            const double t = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - t0) / reps * 1e3;
            const double w = (clock_s(CLOCK_MONOTONIC) - w0) / reps * 1e3;
            best[k] = t < best[k] ? t : best[k];
            wall[k] = w < wall[k] ? w : wall[k];
        }
    printf("L %d, %d thread(s), kv type %d, %d distinct layers, heads %d/%d x %d, window %d: ms per %s "
           "(22 layers), best of %d, CPU (wall): avx2 %.3f (%.3f), avx512 %.3f (%.3f) (%.2fx)\n", L, nth, (int)type,
           NL, nh, nkv, hd, window, prefill ? "prefill" : "token", rounds, best[0], wall[0], best[1], wall[1], best[0] / best[1]);
    backend_ctx_free(c);
    backend_free(be);
    return 0;
}
