/* gpu_timing.c — the CUDA backend's two bandwidth-bound kernels timed with CUDA events, against the
 * device's memory-bandwidth roofline (scripts/gpu-check.sh).
 *
 *   gpu_timing [REPS]
 *
 * One batch-1 mat-vec of a 4096 x 14336 weight (Llama-3-8B's gate projection) per weight type, on
 * the backend's default path (8-bit activations and __dp4a for the types matmul_q8.cu has: "q8") and
 * with f32 activations (BACKEND_ACT_F32: the dequantizing f32 kernel: "f32"), and
 * decode attention (one token, 32 query heads, 8 KV heads, head_dim 128, f16 KV in blocks of 16,
 * scattered) at contexts of 1k and 8k.  Each line: microseconds per call (median of REPS timed calls
 * after a warm-up), the bytes the call must read, and those bytes per second as a share of the
 * roofline (memory clock x bus width x 2, from the device's attributes).
 *
 * Then the prefill paths: a 512-token matmul by cuBLAS (F16 and Q4_0
 * 4096 x 14336, gemm.cu) and the tensor-core attention (attention_prefill.cu) over a 512-token
 * prompt and a 512-token chunk ending at 8k, each as TFLOP/s (2 flops per multiply-add; attention
 * counts the positions each query attends, QKᵀ and PV).  Exit 0, 1 on an error. */
#include "backend/backend.h"
#include "backend/backend_list.h"
#include "core/core.h"
#include "tensor/dtype.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static double g_roof;   /* bytes per second */

/* Median of reps timed calls of what(), in microseconds; events on the legacy default stream, which
 * orders itself against the context's (blocking) stream. */
#define TIME_CALLS(reps, call, out_us)                                                \
    do {                                                                              \
        float ms_[256];                                                               \
        cudaEvent_t e0_, e1_;                                                         \
        cudaEventCreate(&e0_);                                                        \
        cudaEventCreate(&e1_);                                                        \
        if ((call) || backend_sync(c)) return 1;                                      \
        for (int r_ = 0; r_ < (reps); r_++) {                                         \
            cudaEventRecord(e0_, 0);                                                  \
            if (call) return 1;                                                       \
            cudaEventRecord(e1_, 0);                                                  \
            cudaEventSynchronize(e1_);                                                \
            cudaEventElapsedTime(&ms_[r_], e0_, e1_);                                 \
        }                                                                             \
        if (backend_sync(c)) return 1;                                                \
        qsort(ms_, (size_t)(reps), sizeof *ms_, cmp_f);                               \
        (out_us) = ms_[(reps) / 2] * 1e3;                                             \
        cudaEventDestroy(e0_);                                                        \
        cudaEventDestroy(e1_);                                                        \
    } while (0)

static void report(const char *what, double us, double bytes) {
    const double bw = bytes / (us * 1e-6);
    printf("%-34s %9.1f us  %8.1f MB  %7.1f GB/s  %5.1f %% of roofline\n", what, us, bytes / 1e6, bw / 1e9,
           100 * bw / g_roof);
}

static void report_flops(const char *what, double us, double flops) {
    printf("%-34s %9.1f us  %8.1f GFLOP  %7.1f TFLOP/s\n", what, us, flops / 1e9, flops / (us * 1e-6) / 1e12);
}

/* Time the matmul of (host) weight w0 by n tokens (rows of x, the first K values repeated) on backend
 * be with context c; label: its activations. */
static int time_matmul_on(struct backend *be, struct backend_ctx *c, const struct tensor *w0, const float *x,
                          const char *label, int n, int reps) {
    struct tensor t = *w0;
    struct tensor *ts[] = { &t };
    uint64_t placed = 0;
    struct backend_buf bx, by;
    const int64_t K = t.ne0, M = t.ne1;
    if (be->ops->place_weights(be, ts, 1, NULL, &placed) || be->ops->buf_alloc(be, (size_t)n * K * 4, &bx) ||
        be->ops->buf_alloc(be, (size_t)n * M * 4, &by))
        return 1;
    for (int i = 0; i < n; i++)
        if (c->ops->upload(c, (float *)bx.data + (size_t)i * K, x, (size_t)K * 4)) return 1;
    double us = 0;
    TIME_CALLS(reps, BE_OP(c, matmul, by.data, &t, bx.data, n), us);
    char what[64];
    snprintf(what, sizeof what, "matmul %s %s 4096x14336, %d token%s", dtype_name(t.type), label, n, n > 1 ? "s" : "");
    if (n == 1) report(what, us, (double)t.row_bytes * M);
    else report_flops(what, us, 2.0 * (double)n * (double)K * (double)M);
    be->ops->buf_free(be, &bx);
    be->ops->buf_free(be, &by);
    return 0;
}

/* be[0], c[0]: the default backend (8-bit activations); be[1], c[1]: f32 activations; n > 1: the
 * default backend alone, n tokens on context c2[2] (cuBLAS). */
static int time_matmul(struct backend *const *be, struct backend_ctx *const *c2, uint32_t type, int n, int reps) {
    const int64_t K = 4096, M = 14336;
    uint64_t rb = 0;
    if (!dtype_row_bytes(type, (uint64_t)K, &rb)) return 1;
    uint8_t *w = malloc((size_t)rb * M);
    float *row = malloc((size_t)K * sizeof *row);
    if (!w || !row) return 1;
    srand(1);
    for (int64_t r = 0; r < M; r++) {
        for (int64_t k = 0; k < K; k++) row[k] = (float)rand() / (float)RAND_MAX - 0.5f;
        dtype_from_f32(type, row, w + (size_t)r * rb, K);
    }
    const struct tensor t = { .type = type, .ne0 = K, .ne1 = M, .row_bytes = (size_t)rb, .data = w };
    const bool q8 = type != DTYPE_F16;   /* the types timed here that matmul_q8.cu has */
    int rc = 0;
    if (n > 1) rc = time_matmul_on(be[0], c2[2], &t, row, "cuBLAS", n, reps);
    else rc = time_matmul_on(be[0], c2[0], &t, row, q8 ? "q8" : "f32", 1, reps);
    if (!rc && q8 && n == 1) rc = time_matmul_on(be[1], c2[1], &t, row, "f32", 1, reps);
    free(w);
    free(row);
    return rc;
}

/* n tokens of one sequence at positions L - n .. L - 1 (n = 1: decode, bytes against the roofline;
 * n >= 16: the prefill kernel, flops). */
static int time_attention(struct backend *be, struct backend_ctx *c, int L, int n, int reps) {
    const int nh = 32, nkv = 8, hd = 128, bs = 16, nb = (L + bs - 1) / bs;
    const size_t kv_bytes = (size_t)nb * bs * nkv * hd * 2, qn = (size_t)n * nh * hd;
    uint16_t *kv = malloc(kv_bytes);
    int32_t *table = malloc((size_t)nb * sizeof *table), *pos = malloc((size_t)n * 4), *seq = calloc((size_t)n, 4);
    float *q = malloc(qn * sizeof *q);
    if (!kv || !table || !q || !pos || !seq) return 1;
    for (size_t i = 0; i < kv_bytes / 2; i++) kv[i] = f32_to_f16((float)rand() / (float)RAND_MAX - 0.5f);
    for (int i = 0; i < nb; i++) table[i] = (int32_t)(((long)i * 7919) % nb);   /* scattered blocks */
    for (size_t i = 0; i < qn; i++) q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    double attended = 0;   /* query positions times the positions each attends */
    for (int i = 0; i < n; i++) {
        pos[i] = L - n + i;
        attended += pos[i] + 1;
    }
    struct backend_buf bk, bv, bt, bq, bo, bp, bs_;
    if (be->ops->buf_alloc(be, kv_bytes, &bk) || be->ops->buf_alloc(be, kv_bytes, &bv) ||
        be->ops->buf_alloc(be, (size_t)nb * 4, &bt) || be->ops->buf_alloc(be, qn * 4, &bq) ||
        be->ops->buf_alloc(be, qn * 4, &bo) || be->ops->buf_alloc(be, (size_t)n * 4, &bp) ||
        be->ops->buf_alloc(be, (size_t)n * 4, &bs_) || c->ops->upload(c, bk.data, kv, kv_bytes) ||
        c->ops->upload(c, bv.data, kv, kv_bytes) || c->ops->upload(c, bt.data, table, (size_t)nb * 4) ||
        c->ops->upload(c, bq.data, q, qn * 4) || c->ops->upload(c, bp.data, pos, (size_t)n * 4) ||
        c->ops->upload(c, bs_.data, seq, (size_t)n * 4))
        return 1;
    const struct paged_attn_args a = {
        .n_tokens = n, .n_head = nh, .n_head_kv = nkv, .head_dim = hd, .q = bq.data, .pos = bp.data,
        .seq = bs_.data, .block_table = bt.data, .max_blocks = nb,
        .kv = { .type = KV_F16, .block_size = bs, .n_head_kv = nkv, .head_dim = hd, .k = bk.data, .v = bv.data },
        .scale = 0.088f, .out = bo.data, .ctx_hi = L,
    };
    double us = 0;
    TIME_CALLS(reps, BE_OP(c, paged_attention, &a), us);
    char what[64];
    if (n == 1) {
        snprintf(what, sizeof what, "paged attention f16, context %d", L);
        report(what, us, 2.0 * (double)L * nkv * hd * 2);
    } else {
        snprintf(what, sizeof what, "prefill attention f16, %d at %d", n, L);
        report_flops(what, us, 4.0 * attended * nh * hd);
    }
    free(pos);
    free(seq);
    struct backend_buf *bufs[] = { &bk, &bv, &bt, &bq, &bo, &bp, &bs_ };
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->ops->buf_free(be, bufs[i]);
    free(kv);
    free(table);
    free(q);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);   /* each line reaches timing.txt as it is measured: a killed run keeps them */
    const int reps = argc > 1 ? atoi(argv[1]) : 50;
    if (reps < 1 || reps > 256) {
        fprintf(stderr, "usage: gpu_timing [REPS 1..256]\n");
        return 2;
    }
    struct backend *bes[2] = { NULL, NULL };
    struct backend_ctx *cs[3] = { NULL, NULL, NULL };   /* the third: 512-token steps (the prefill paths) */
    const struct backend_ctx_params p = { .n_threads = 1, .max_tokens = 1, .max_ctx = 8192, .n_head = 32,
                                          .head_dim = 128, .max_cols = 14336 };
    struct backend_ctx_params pp = p;
    pp.max_tokens = 512;
    int rc = backend_cuda_new(0, BACKEND_ACT_Q8, &bes[0]);
    if (!rc) rc = backend_ctx_new(bes[0], &p, &cs[0]);
    if (!rc) rc = backend_ctx_new(bes[0], &pp, &cs[2]);
    if (!rc) rc = backend_cuda_new(0, BACKEND_ACT_F32, &bes[1]);
    if (!rc) rc = backend_ctx_new(bes[1], &p, &cs[1]);
    if (rc) {
        fprintf(stderr, "gpu_timing: no CUDA backend\n");
        return 1;
    }
    struct backend *be = bes[0];
    struct backend_ctx *c = cs[0];
    int clock_khz = 0, bus_bits = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
    g_roof = 2.0 * clock_khz * 1e3 * bus_bits / 8;
    printf("roofline: memory clock %d MHz x %d bits x 2 = %.0f GB/s; median of %d calls each\n", clock_khz / 1000,
           bus_bits, g_roof / 1e9, reps);
    if (g_roof <= 0) g_roof = 1;
    static const uint32_t types[] = { DTYPE_F16, DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_Q4_K, DTYPE_Q6_K };
    for (size_t i = 0; i < sizeof types / sizeof *types && !rc; i++) rc = time_matmul(bes, cs, types[i], 1, reps);
    if (!rc) rc = time_attention(be, c, 1024, 1, reps);
    if (!rc) rc = time_attention(be, c, 8192, 1, reps);
    /* the prefill paths, fewer repetitions (each call is 10-100x a decode call) */
    const int preps = reps < 20 ? reps : 20;
    if (!rc) rc = time_matmul(bes, cs, DTYPE_F16, 512, preps);
    if (!rc) rc = time_matmul(bes, cs, DTYPE_Q4_0, 512, preps);
    if (!rc) rc = time_attention(be, cs[2], 512, 512, preps);
    if (!rc) rc = time_attention(be, cs[2], 8192, 512, preps);
    if (rc) fprintf(stderr, "gpu_timing: a call failed\n");
    backend_ctx_free(cs[2]);
    for (int i = 0; i < 2; i++) {
        backend_ctx_free(cs[i]);
        backend_free(bes[i]);
    }
    return rc;
}
