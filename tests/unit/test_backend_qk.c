/* test_backend_qk.c — the K-quants (Q4_K, Q5_K, Q6_K) on the 8-bit integer
 * path (qmm_k.c):
 *  1. the definition itself (qmm_ref_dot_k) against the dequantized weights
 *     (dtype_to_f32, the format's reference) times the dequantized codes, in
 *     double: the only differences are the f32 rounding of I, M and the two
 *     fmas, so the error is tiny;
 *  2. every kernel set this CPU has (AVX2, AVX-VNNI, AVX-512 VNNI, AMX-INT8; AMX on
 *     emulated tiles wherever AVX-512 is), called
 *     directly, against the definition bit for bit (memcmp), with weights
 *     in rows (packed on the fly) and repacked by place_weights, odd row
 *     counts, several K (multiples of 256), n = 1, 3, 16, 33, and 1 or 2
 *     threads;
 *  3. the layout: unpacking each row of a packed tensor gives the file's
 *     bytes back, get_rows gives the rows' exact values, and the placed
 *     bytes stay within 1.1x (Q6_K exactly 1x);
 *  4. batch invariance: a token's row is bit-identical alone and in a batch.
 * A set the CPU lacks prints SKIP with its name. */
#include "check.h"
#include "num_util.h"

#include "backend/backend.h"
#include "be_util.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/qmm.h"
#include "core/core.h"

#include <math.h>
#include <string.h>

#define MAX_K 5632
#define MAX_N 33

static struct rng g_rng;

static float urand(void) { return tu_urand(&g_rng); }

/* tb_weight's (be_util.h) with this test's generator. */
static struct tensor make_weight(uint32_t type, int64_t K, int64_t M) { return tb_weight(&g_rng, type, K, M, true); }

/* The definition on rows-layout weights: each token row quantized, then qmm_ref_dot_act. */
static void ref_def(const struct tensor *w, const float *x, int n, float *y) {
    uint8_t *row = malloc(qmm_act_row_bytes(w->ne0));
    KV_ASSERT(row);
    for (int t = 0; t < n; t++) {
        qmm_quantize_act(w->type, x + (size_t)t * (size_t)w->ne0, w->ne0, row);
        for (int64_t r = 0; r < w->ne1; r++)
            y[(size_t)t * (size_t)w->ne1 + (size_t)r] = qmm_ref_dot_act(w->type, tensor_row(w, r), row, w->ne0);
    }
    free(row);
}

/* 1. the definition against the formats' own dequantizers, in double */
static void test_definition(void) {
    static const uint32_t types[] = { DTYPE_Q4_K, DTYPE_Q5_K, DTYPE_Q6_K, DTYPE_Q2_K, DTYPE_Q3_K };   /* K-quant rows */
    const int64_t K = 1024, M = 9;
    for (size_t it = 0; it < sizeof types / sizeof *types; it++) {
        struct tensor w = make_weight(types[it], K, M);
        float *x = malloc(K * sizeof *x), *wf = malloc(K * sizeof *wf), *dx = malloc(K / 256 * sizeof *dx);
        int8_t *q = malloc(K);
        int16_t *s16 = malloc(K / 16 * sizeof *s16), *s32 = malloc(K / 32 * sizeof *s32);
        KV_ASSERT(x && wf && dx && q && s16 && s32);
        for (int64_t k = 0; k < K; k++) x[k] = urand() * (k % 13 == 0 ? 8.0f : 1.0f);
        for (int64_t k = 0; k < 256; k++) x[k] = 0;   /* an all-zero super-block: dx = 0 */
        qmm_quantize_row_k(x, K, q, dx, s16, s32);
        CHECK(dx[0] == 0.0f);
        /* the sums are the codes' */
        int bad = 0;
        for (int64_t s = 0; s < K / 16; s++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += q[16 * s + i];
            bad += sum != s16[s];
            if (s % 2) bad += s32[s / 2] != s16[s] + s16[s - 1];
        }
        CHECK_MSG(!bad, "%s: %d code sums wrong", dtype_name(types[it]), bad);
        double maxrel = 0;
        for (int64_t r = 0; r < M; r++) {
            dtype_to_f32(w.type, tensor_row(&w, r), wf, K);
            double s = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                const double xv = (double)q[k] * dx[k / 256];
                s += (double)wf[k] * xv;
                mag += fabs((double)wf[k] * xv);
            }
            const float y = qmm_ref_dot_k(w.type, tensor_row(&w, r), q, dx, s16, s32, K);
            const double rel = fabs((double)y - s) / (mag > 0 ? mag : 1);
            maxrel = rel > maxrel ? rel : maxrel;
        }
        /* f32 dequantization rounds each d * sc, dmin * m and product; the
         * definition rounds I, M and two fmas per super-block: both ~1e-7 of
         * the magnitude */
        CHECK_MSG(maxrel < 2e-6, "%s: the definition vs the dequantized dot: %.3g of the magnitude",
                  dtype_name(types[it]), maxrel);
        free(x);
        free(wf);
        free(dx);
        free(q);
        free(s16);
        free(s32);
        free((void *)w.data);
    }
}

/* A copy of w repacked by a q8 backend's place_weights; *placed its report. */
static struct tensor placed_copy(const struct tensor *w, uint64_t *placed) {
    struct tensor tmp = *w, *tp = &tmp, out = *w;
    struct backend *pb = NULL;
    KV_ASSERT(backend_cpu_new("avx2", false, BACKEND_ACT_Q8, &pb) == 0);
    *placed = 0;
    CHECK(pb->ops->place_weights(pb, &tp, 1, NULL, placed) == 0);
    CHECK(tmp.layout == TENSOR_Q8X16);
    uint8_t *copy = malloc(qmm_packed_bytes(w));
    KV_ASSERT(copy);
    memcpy(copy, tmp.data, qmm_packed_bytes(w));
    out = tmp;
    out.data = copy;
    backend_free(pb);
    return out;
}

static void test_sets(struct backend_ctx *ctx[2], const struct cpu_features *f) {
    struct { const char *name; qmm_group_fn *fn; bool ok; } sets[] = {
        { "scalar", qmm_group_scalar, true },
        { "avx2", qmm_group_avx2, cpu_q8_avx2_built() && f->avx2 && f->fma && f->f16c },
        { "avxvnni", qmm_group_avxvnni, cpu_q8_avxvnni_built() && f->avxvnni && f->avx2 && f->fma && f->f16c },
        { "avx512", qmm_group_avx512, cpu_q8_avx512_built() && f->avx512f && f->avx512bw && f->avx512vl &&
                                     f->avx512vnni && f->avx2 && f->fma && f->f16c },
        /* the AMX kernel on emulated tiles (its float step is AVX-512), and on real ones (test_backend_amx.c) */
        { "amx-emulated", qmm_group_amx_emu, cpu_q8_amx_emu_built() && cpu_q8_avx512_built() && f->avx512f &&
                                             f->avx512bw && f->avx512vl && f->avx512vnni && f->avx2 && f->fma && f->f16c },
        { "amx", qmm_group_amx, cpu_q8_amx_built() && cpu_q8_avx512_built() && f->avx512f && f->avx512bw &&
                               f->avx512vl && f->avx512vnni && f->avx2 && f->fma && f->f16c && f->amx_tile &&
                               f->amx_int8 && f->amx_os && cpu_amx_permit() == 0 },
    };
    static const uint32_t types[] = { DTYPE_Q4_K, DTYPE_Q5_K, DTYPE_Q6_K, DTYPE_Q2_K, DTYPE_Q3_K, DTYPE_IQ4_XS };
    static const int64_t Ks[] = { 256, 768, 2048, MAX_K };
    static const int64_t Ms[] = { 1, 3, 17, 33 };
    static const int ns[] = { 1, 3, 16, 33 };
    for (size_t s = 0; s < sizeof sets / sizeof *sets; s++)
        if (!sets[s].ok) printf("SKIP: K-quant group kernel %s (this CPU or build lacks it)\n", sets[s].name);
    int cases[sizeof sets / sizeof *sets] = { 0 };
    for (size_t it = 0; it < sizeof types / sizeof *types; it++)
        for (size_t ik = 0; ik < sizeof Ks / sizeof *Ks; ik++)
            for (size_t im = 0; im < sizeof Ms / sizeof *Ms; im++) {
                const int64_t K = Ks[ik], M = Ms[im];
                const char *tn = dtype_name(types[it]);
                struct tensor w = make_weight(types[it], K, M);
                uint64_t placed = 0;
                struct tensor pw = placed_copy(&w, &placed);
                /* 3. the layout: bytes, the round trip, get_rows */
                const size_t file = (size_t)M * w.row_bytes, groups = (size_t)(M + 15) / 16;
                CHECK(placed >= qmm_packed_bytes(&w) && placed < qmm_packed_bytes(&w) + 64);
                /* unpacked scales: Q4_K +2.8 %, Q5_K +2.3 %, Q3_K +3.6 %, IQ4_XS +1.5 % */
                CHECK_MSG(qmm_packed_bytes(&w) * 100 <= groups * 16 * w.row_bytes *
                                                            (types[it] == DTYPE_Q6_K || types[it] == DTYPE_Q2_K ? 100 : 104),
                          "%s: packed %zu bytes for groups of %zu", tn, qmm_packed_bytes(&w), groups * 16 * w.row_bytes);
                uint8_t *back = malloc(w.row_bytes);
                KV_ASSERT(back);
                int bad = 0;
                for (int64_t r = 0; r < M; r++) {
                    qmm_unpack_row(&pw, r, back);
                    bad += memcmp(back, tensor_row(&w, r), w.row_bytes) != 0;
                }
                CHECK_MSG(!bad, "%s K=%lld M=%lld: %d rows unpack to other bytes", tn, (long long)K, (long long)M, bad);
                free(back);
                (void)file;
                int32_t ids[3] = { (int32_t)(M - 1), 0, (int32_t)(M / 2) };
                float *g1 = malloc(3 * (size_t)K * sizeof *g1), *g2 = malloc(3 * (size_t)K * sizeof *g2);
                KV_ASSERT(g1 && g2);
                CHECK(ctx[0]->ops->get_rows(ctx[0], g1, &pw, ids, 3) == 0);
                for (int i = 0; i < 3; i++) dtype_to_f32(w.type, tensor_row(&w, ids[i]), g2 + (size_t)i * K, K);
                CHECK_MSG(memcmp(g1, g2, 3 * (size_t)K * sizeof *g1) == 0, "get_rows of repacked %s K=%lld M=%lld", tn,
                          (long long)K, (long long)M);
                free(g1);
                free(g2);

                /* 2. every set against the definition */
                float *x = malloc((size_t)MAX_N * (size_t)K * sizeof *x);
                float *ref = malloc((size_t)MAX_N * (size_t)M * sizeof *ref);
                float *out = malloc((size_t)MAX_N * (size_t)M * sizeof *out);
                KV_ASSERT(x && ref && out);
                for (int64_t i = 0; i < (int64_t)MAX_N * K; i++) x[i] = urand() * (i % 7 == 0 ? 10.0f : 1.0f);
                for (int64_t k = 0; k < 256; k++) x[k] = 0;   /* an all-zero super-block */
                ref_def(&w, x, MAX_N, ref);
                for (size_t in = 0; in < sizeof ns / sizeof *ns; in++) {
                    const int n = ns[in];
                    for (size_t s = 0; s < sizeof sets / sizeof *sets; s++) {
                        if (!sets[s].ok) continue;
                        for (int packed = 0; packed < 2; packed++) {
                            const int th = (int)(in + s + (size_t)packed) % 2;
                            memset(out, 0xff, (size_t)n * (size_t)M * sizeof *out);
                            CHECK(qmm_matmul(ctx[th], out, packed ? &pw : &w, x, n, sets[s].fn) == 0);
                            CHECK_MSG(memcmp(out, ref, (size_t)n * (size_t)M * sizeof *out) == 0,
                                      "K-quant group %s %s K=%lld M=%lld n=%d threads=%d%s: differs from the definition",
                                      sets[s].name, tn, (long long)K, (long long)M, n, th + 1,
                                      packed ? " (repacked)" : "");
                            cases[s]++;
                        }
                    }
                }
                /* 4. batch invariance through the backend's matmul: token 5 alone */
                if (M >= 3) {
                    ctx[1]->ops->matmul(ctx[1], out, &pw, x + 5 * (size_t)K, 1);
                    CHECK_MSG(memcmp(out, ref + 5 * (size_t)M, (size_t)M * sizeof *out) == 0,
                              "%s K=%lld M=%lld: token 5 alone differs", tn, (long long)K, (long long)M);
                }
                free(x);
                free(ref);
                free(out);
                free((void *)pw.data);
                free((void *)w.data);
            }
    for (size_t s = 0; s < sizeof sets / sizeof *sets; s++)
        if (sets[s].ok) printf("K-quant group %s: %d cases bit-identical to qmm_ref_dot_k\n", sets[s].name, cases[s]);
}

int main(void) {
    rng_seed(&g_rng, 20261201);
    test_definition();
    struct cpu_features f;
    cpu_features_get(&f);
    const bool have_avx2 = cpu_avx2_built() && f.avx2 && f.fma && f.f16c;
    if (!have_avx2) {
        /* the q8 backends (and their placement) need a SIMD set; the definition was checked above */
        printf("SKIP: K-quant integer kernels (this CPU or build lacks AVX2+FMA+F16C)\n");
        return check_report("test_backend_qk");
    }
    struct backend_ctx *ctx[2] = { tb_new("avx2", false, BACKEND_ACT_Q8, 1, MAX_K, MAX_N, 1, 1, 1),
                                   tb_new("avx2", false, BACKEND_ACT_Q8, 2, MAX_K, MAX_N, 1, 1, 1) };
    CHECK(ctx[0] && ctx[1]);
    if (ctx[0] && ctx[1]) {
        CHECK(cpu_ctx_of(ctx[0])->act == ACT_Q8);
        test_sets(ctx, &f);
    }
    tb_free(ctx[0]);
    tb_free(ctx[1]);
    return check_report("test_backend_qk");
}
