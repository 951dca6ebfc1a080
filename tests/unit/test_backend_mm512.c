/* test_backend_mm512.c — the avx512 set's F32 / F16 / BF16 matmul
 * (matmul_avx512.c) against a double-precision reference on fresh random
 * data, on every shape edge (K not a multiple of 16, K over one block and
 * with a tail in the last one, M not a multiple of the 4-row tile, n = 1 ..
 * 40 across the in-place, single-block and blocked paths), and its batch
 * invariance: each token's row bit-identical whether computed alone, in any
 * sub-batch, by 1 or 2 threads, or from a weight view starting mid-tile.
 *
 * Error bound: the kernel's sum of K products in f32 (16 lanes of ceil(K /
 * 16) FMAs, then 4 additions) is a recursive sum of at most ceil(K / 16) + 4
 * rounded terms, so |y - ref| <= gamma * Σ|w_k x_k| with gamma = (ceil(K /
 * 16) + 4) * 2^-24 * 1.01 (Higham, 3.1), checked per output; and the
 * norm-wise error ‖y − ref‖ / ‖ref‖ is checked <= 1e-5.  SKIP where the CPU
 * or build lacks the avx512 set (AVX-512 F/BW/VL/VNNI). */
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

#define MAX_K 2100
#define MAX_N 40

static struct rng g_rng;

/* tb_weight's (be_util.h) with this test's generator. */
static struct tensor make_weight(uint32_t type, int64_t K, int64_t M) { return tb_weight(&g_rng, type, K, M, false); }

/* The reference: weights widened by dtype_to_f32, products summed in double;
 * mag[t * M + r] = Σ|w_k x_k|. */
static void ref_mm(const struct tensor *w, const float *x, int n, double *ref, double *mag) {
    const int64_t K = w->ne0, M = w->ne1;
    float *row = malloc((size_t)K * sizeof *row);
    KV_ASSERT(row);
    for (int64_t r = 0; r < M; r++) {
        dtype_to_f32(w->type, tensor_row(w, r), row, K);
        for (int t = 0; t < n; t++) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < K; k++) {
                const double p = (double)row[k] * x[(size_t)t * K + k];
                s += p;
                a += fabs(p);
            }
            ref[(size_t)t * M + r] = s;
            mag[(size_t)t * M + r] = a;
        }
    }
    free(row);
}

/* The kernel itself (the avx512 set's ops.matmul: checked in main). */
static int run(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n) {
    return cpu_matmul_avx512(c, y, w, x, n);
}

/* One (type, K, M) case over the given token counts: accuracy at each n,
 * then invariance against the n = MAX_N batch. */
static void check_case(struct backend_ctx *be[2], uint32_t type, int64_t K, int64_t M, const int *ns, int n_ns) {
    struct tensor w = make_weight(type, K, M);
    float *x = malloc((size_t)MAX_N * K * sizeof *x);
    float *y = malloc((size_t)MAX_N * M * sizeof *y), *yb = malloc((size_t)MAX_N * M * sizeof *yb);
    double *ref = malloc((size_t)MAX_N * M * sizeof *ref), *mag = malloc((size_t)MAX_N * M * sizeof *mag);
    KV_ASSERT(x && y && yb && ref && mag);
    for (int64_t i = 0; i < MAX_N * K; i++) x[i] = tu_urand(&g_rng);
    ref_mm(&w, x, MAX_N, ref, mag);
    const double gamma = (double)((K + 15) / 16 + 4) * 0x1p-24 * 1.01;

    /* the full batch, 2 threads: the invariance baseline, checked for accuracy */
    CHECK(run(be[1], yb, &w, x, MAX_N) == 0);
    int bad = 0;
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)MAX_N * M; i++) {
        const double e = fabs((double)yb[i] - ref[i]);
        if (!(e <= gamma * mag[i])) bad++;
        num += e * e;
        den += ref[i] * ref[i];
    }
    const double rel = sqrt(num / (den > 0 ? den : 1));
    if (bad || !(rel <= 1e-5))
        printf("type %u K %lld M %lld: %d outputs over the bound, relative error %.3g\n", type, (long long)K,
               (long long)M, bad, rel);
    CHECK(bad == 0);
    CHECK(rel <= 1e-5);

    /* every n: tokens [s, s + n) of the batch (s varies), 1 and 2 threads,
     * bit-identical to the full batch's rows */
    for (int in = 0; in < n_ns; in++) {
        const int n = ns[in], s = (int)((unsigned)(n * 7) % (unsigned)(MAX_N - n + 1));
        for (int th = 0; th < 2; th++) {
            memset(y, 0xff, (size_t)n * M * sizeof *y);
            CHECK(run(be[th], y, &w, x + (size_t)s * K, n) == 0);
            const bool same = memcmp(y, yb + (size_t)s * M, (size_t)n * M * sizeof *y) == 0;
            if (!same)
                printf("type %u K %lld M %lld: tokens [%d, %d) with %d thread(s) differ from the batch\n", type,
                       (long long)K, (long long)M, s, s + n, th + 1);
            CHECK(same);
        }
    }

    /* a view of rows [1, M) (tiles shifted by one row: other tile shapes per row) */
    if (M > 1) {
        struct tensor v = w;
        v.ne1 = M - 1;
        v.data = (uint8_t *)w.data + w.row_bytes;
        const int nv[] = { 1, 3, MAX_N };
        for (int in = 0; in < 3; in++) {
            const int n = nv[in];
            CHECK(run(be[in & 1], y, &v, x, n) == 0);
            bool same = true;
            for (int t = 0; t < n; t++)
                same &= memcmp(y + (size_t)t * (M - 1), yb + (size_t)t * M + 1, (size_t)(M - 1) * sizeof *y) == 0;
            if (!same)
                printf("type %u K %lld M %lld: rows [1, M) with n %d differ from the full matrix\n", type,
                       (long long)K, (long long)M, n);
            CHECK(same);
        }
    }
    free((void *)w.data);
    free(x);
    free(y);
    free(yb);
    free(ref);
    free(mag);
}

int main(void) {
    rng_seed(&g_rng, 20261201);
    struct cpu_features f;
    cpu_features_get(&f);
    const bool have = cpu_avx2_built() && f.avx2 && f.fma && f.f16c && cpu_q8_avx512_built() && cpu_mm_avx512_built() &&
                      f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
    if (!have) {
        printf("SKIP: avx512 float matmul (this CPU or build lacks AVX-512 F/BW/VL/VNNI)\n");
        return check_report("test_backend_mm512");
    }
    struct backend_ctx *be[2] = { tb_new("avx512", false, BACKEND_ACT_Q8, 1, MAX_K, MAX_N, 1, 1, 1),
                                  tb_new("avx512", false, BACKEND_ACT_Q8, 2, MAX_K, MAX_N, 1, 1, 1) };
    CHECK(be[0] && be[1]);
    if (!be[0] || !be[1]) return check_report("test_backend_mm512");
    CHECK(strcmp(be[0]->ops->name, "avx512") == 0);
    CHECK(be[0]->ops->matmul == cpu_matmul_avx512);   /* the set uses this kernel */
    if (threadpool_size(cpu_ctx_of(be[1])->pool) < 2) printf("note: one CPU online, the 2-thread runs use 1\n");

    static const uint32_t types[] = { DTYPE_F32, DTYPE_F16, DTYPE_BF16 };
    int all_n[MAX_N];
    for (int i = 0; i < MAX_N; i++) all_n[i] = i + 1;
    static const int some_n[] = { 1, 2, 4, 5, 6, 7, 13, 31, 40 };
    /* K: under one vector, one vector, a tail, one block, the largest single
     * block, two blocks (the second short), several with a tail */
    static const int64_t Ks[] = { 1, 15, 16, 17, 100, 512, 1024, 1040, MAX_K };
    static const int64_t Ms[] = { 1, 5, 67 };
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
            for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++)
                check_case(be, types[ti], Ks[ki], Ms[mi], some_n, (int)(sizeof some_n / sizeof *some_n));
        check_case(be, types[ti], 77, 9, all_n, MAX_N);      /* every n, single block */
        check_case(be, types[ti], 1090, 6, all_n, MAX_N);    /* every n, blocked with a tail */
    }
    /* contexts sized exactly for K: the panel and parked accumulators must
     * fit the scratch (an overrun shows under KVLLM_SANITIZE / strict) */
    static const int64_t Kx[] = { 100, 1025, 1040, 2048 };
    for (size_t ki = 0; ki < sizeof Kx / sizeof *Kx; ki++) {
        struct backend_ctx *bx[2] = { tb_new("avx512", false, BACKEND_ACT_Q8, 1, Kx[ki], MAX_N, 1, 1, 1),
                                      tb_new("avx512", false, BACKEND_ACT_Q8, 2, Kx[ki], MAX_N, 1, 1, 1) };
        CHECK(bx[0] && bx[1]);
        if (bx[0] && bx[1]) check_case(bx, DTYPE_F16, Kx[ki], 67, some_n, (int)(sizeof some_n / sizeof *some_n));
        tb_free(bx[0]);
        tb_free(bx[1]);
    }
    tb_free(be[0]);
    tb_free(be[1]);
    return check_report("test_backend_mm512");
}
