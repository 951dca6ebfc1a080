/* test_backend_qmm16.c — the logits' Q8_0 matrix on the avx512 set (qmm.h's
 * 16-bit activation path) on fresh random data: every output bit-identical
 * to qmm16_ref_dot on the token's own activation row (so batch-invariant),
 * for weights in rows (packed on the fly) and placed, at 1 and 2 threads,
 * every token count 1 .. 40 on some shapes and rows not a multiple of 16;
 * and the definition itself against a double-precision dot product of the
 * f32 activations: |ref - exact| <= Σ_b (Σ|w|) dx_b / 2 (the codes'
 * rounding, half a step each) + gamma Σ|w x|, gamma = (K / 32 + 2) * 2^-23.
 * Also that a matrix not marked as the logits' stays on the 8-bit path
 * (differs), that the avx2 set keeps f32 activations for it, and that the
 * AVX-512 activation quantizers (act_avx512.c) give the scalar ones' bytes.
 * SKIP where the CPU or build lacks the avx512 set (AVX-512 F/BW/VL/VNNI). */
#include "check.h"

#include "backend/backend.h"
#include "be_util.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/qmm.h"
#include "core/core.h"
#include "num_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_K 2048
#define MAX_N 40

static struct rng g_rng;

/* x: uniform, one token's second block all zero, one block with a value 1e4x its neighbours */
static void fill_x(float *x, int n, int64_t K) {
    for (int64_t i = 0; i < (int64_t)n * K; i++) x[i] = tu_urand(&g_rng);
    if (n >= 2 && K >= 64) memset(x + K + 32, 0, 32 * sizeof *x);
    x[7] *= 1e4f;
}

/* y_ref (n, M) by the definition; err: the bound's violations against double */
static int reference(const struct tensor *w, const float *x, int n, float *ref) {
    const int64_t K = w->ne0, M = w->ne1;
    uint8_t *row = malloc(qmm16_act_row_bytes(K));
    KV_ASSERT(row);
    int bad = 0;
    const double gamma = (double)(K / 32 + 2) * 0x1p-23;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * K;
        qmm16_quantize_row(xt, K, row);
        const float *dx = (const float *)(const void *)(row + 2 * K);
        for (int64_t r = 0; r < M; r++) {
            const uint8_t *wr = tensor_row(w, r);
            const float y = qmm16_ref_dot(wr, row, K);
            ref[(size_t)t * M + r] = y;
            double exact = 0, mag = 0, round = 0;
            for (int64_t b = 0; b < K / 32; b++) {
                const struct block_q8_0 *blk = (const struct block_q8_0 *)(const void *)(wr + (size_t)b * 34);
                const double d = f16_to_f32(blk->d);
                double sw = 0;
                for (int i = 0; i < 32; i++) {
                    const double p = d * blk->qs[i] * xt[b * 32 + i];
                    exact += p;
                    mag += fabs(p);
                    sw += fabs(d * blk->qs[i]);
                }
                round += sw * dx[b] / 2;
            }
            if (!(fabs(y - exact) <= round * 1.001 + gamma * mag)) bad++;
        }
    }
    free(row);
    return bad;
}

static void check_case(struct backend_ctx *be[2], int64_t K, int64_t M, const int *ns, int n_ns) {
    struct tensor w = tb_weight(&g_rng, DTYPE_Q8_0, K, M, true);
    w.flags |= TENSOR_F_F32_ACT;
    float *x = malloc((size_t)MAX_N * K * sizeof *x), *y = malloc((size_t)MAX_N * M * sizeof *y);
    float *ref = malloc((size_t)MAX_N * M * sizeof *ref);
    KV_ASSERT(x && y && ref);
    fill_x(x, MAX_N, K);
    const int bad = reference(&w, x, MAX_N, ref);
    if (bad) printf("K %lld M %lld: %d reference outputs over the bound\n", (long long)K, (long long)M, bad);
    CHECK(bad == 0);
    /* placed: repacked by a backend of the set as a model's would be (a
     * backend places once: a fresh one per case) */
    struct tensor pw = w, *pp = &pw;
    uint64_t placed = 0;
    struct backend *pb = NULL;
    CHECK(backend_cpu_new("avx512", false, BACKEND_ACT_Q8, &pb) == 0);
    CHECK(pb->ops->place_weights(pb, &pp, 1, NULL, &placed) == 0);
    CHECK(pw.layout == TENSOR_Q8X16);
    for (int in = 0; in < n_ns; in++) {
        const int n = ns[in], s = (int)((unsigned)(n * 7) % (unsigned)(MAX_N - n + 1));
        for (int th = 0; th < 2; th++)
            for (int lay = 0; lay < 2; lay++) {
                memset(y, 0xff, (size_t)n * M * sizeof *y);
                CHECK(be[th]->ops->matmul(be[th], y, lay ? &pw : &w, x + (size_t)s * K, n) == 0);
                const bool same = memcmp(y, ref + (size_t)s * M, (size_t)n * M * sizeof *y) == 0;
                if (!same)
                    printf("K %lld M %lld: tokens [%d, %d), %d thread(s), %s: not the definition's bits\n", (long long)K,
                           (long long)M, s, s + n, th + 1, lay ? "placed" : "rows");
                CHECK(same);
            }
    }
    backend_free(pb);
    free((void *)w.data);
    free(x);
    free(y);
    free(ref);
}

/* Without the mark the matrix is the 8-bit path's; the avx2 set keeps f32
 * activations for the marked one: neither gives the 16-bit path's bits. */
static void check_routes(struct backend_ctx *be) {
    const int64_t K = 256, M = 32;
    struct tensor w = tb_weight(&g_rng, DTYPE_Q8_0, K, M, true);
    float *x = malloc(K * sizeof *x), y[32], ref[32];
    KV_ASSERT(x);
    fill_x(x, 1, K);
    w.flags = TENSOR_F_F32_ACT;
    CHECK(reference(&w, x, 1, ref) == 0);
    w.flags = 0;
    CHECK(be->ops->matmul(be, y, &w, x, 1) == 0);
    CHECK(memcmp(y, ref, sizeof y) != 0);
    struct backend_ctx *a = tb_new("avx2", false, BACKEND_ACT_Q8, 1, K, 1, 1, 1, 1);
    CHECK(a != NULL);
    if (a) {
        w.flags = TENSOR_F_F32_ACT;
        CHECK(a->ops->matmul(a, y, &w, x, 1) == 0);
        CHECK(memcmp(y, ref, sizeof y) != 0);
        tb_free(a);
    }
    free((void *)w.data);
    free(x);
}

/* qmm_quantize_row / qmm16_quantize_row against their AVX-512 versions on
 * rows with zero blocks, ties (x * id exactly half-way), wide ranges and
 * subnormals, of 1024 values (two groups of 16 blocks) or of 1..32 blocks
 * (a group and a tail, or a tail alone): identical bytes. */
static void check_quantizers(void) {
    enum { K = 1024 };
    static float x[K];
    static uint8_t a[2 * K + K / 8 + 64], b[sizeof a];
    int bad = 0;
    for (int rep = 0; rep < 200; rep++) {
        const int k = rep % 3 ? 32 * tu_rnd_in(&g_rng, 1, 32) : K;
        for (int i = 0; i < k; i++) {
            const int kind = (i / 32 + rep) % 5;
            const float u = tu_urand(&g_rng);
            /* kind 4: quarters under a block maximum of 63.5, so x * id = x * 2 is often half-way */
            x[i] = kind == 0 ? 0.0f : kind == 1 ? u * 1e-3f : kind == 2 ? u * 3e4f : kind == 3 ? u * 1e-40f
                 : i % 32 == 0 ? 63.5f : (float)((int)(u * 254) - 127) / 4.0f;
        }
        for (int w = 0; w < 2; w++) {
            memset(a, 0x55, sizeof a);
            memset(b, 0xaa, sizeof b);
            if (w) {
                qmm16_quantize_row(x, k, a);
                qmm16_quantize_row_avx512(x, k, b);
                bad += memcmp(a, b, 2 * (size_t)k + k / 8) != 0;
            } else {
                qmm_quantize_row(x, k, (int8_t *)a, (float *)(void *)(a + k), (int32_t *)(void *)(a + k + k / 8));
                qmm_quantize_row_avx512(x, k, (int8_t *)b, (float *)(void *)(b + k), (int32_t *)(void *)(b + k + k / 8));
                bad += memcmp(a, b, (size_t)k + k / 4) != 0;
            }
        }
    }
    if (bad) printf("activation quantizers: %d rows differ from the scalar ones\n", bad);
    CHECK(bad == 0);
}

int main(void) {
    rng_seed(&g_rng, 20261204);
    struct cpu_features f;
    cpu_features_get(&f);
    const bool have = cpu_avx2_built() && f.avx2 && f.fma && f.f16c && cpu_q8_avx512_built() && cpu_q16_avx512_built() &&
                      f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
    if (!have) {
        printf("SKIP: the 16-bit logits path (this CPU or build lacks AVX-512 F/BW/VL/VNNI)\n");
        return check_report("test_backend_qmm16");
    }
    struct backend_ctx *be[2] = { tb_new("avx512", false, BACKEND_ACT_Q8, 1, MAX_K, MAX_N, 1, 1, 1),
                                  tb_new("avx512", false, BACKEND_ACT_Q8, 2, MAX_K, MAX_N, 1, 1, 1) };
    CHECK(be[0] && be[1]);
    if (!be[0] || !be[1]) return check_report("test_backend_qmm16");
    int all_n[MAX_N];
    for (int i = 0; i < MAX_N; i++) all_n[i] = i + 1;
    static const int some_n[] = { 1, 2, 3, 4, 5, 9, 17, 40 };
    static const int64_t Ks[] = { 32, 64, 640, 1088, MAX_K };
    static const int64_t Ms[] = { 1, 5, 16, 17, 67 };
    for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
        for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++)
            check_case(be, Ks[ki], Ms[mi], some_n, (int)(sizeof some_n / sizeof *some_n));
    check_case(be, 96, 37, all_n, MAX_N);
    check_routes(be[0]);
    check_quantizers();
    tb_free(be[0]);
    tb_free(be[1]);
    return check_report("test_backend_qmm16");
}
