/* test_backend_matmul.c — the AVX2 matmul against the scalar reference, on
 * fresh random data for every weight type and awkward shapes, and its batch
 * invariance: a row's result is bit-identical whether computed alone, inside
 * a batch of 17 or 64, by 1 or 2 threads, or from a sub-range of weight
 * rows.  Q8_0 / Q4_0 / Q4_1 also go through the integer-activation path
 * (activations int), checked against the scalar reference loosely and
 * against an exact double-precision model of its own arithmetic tightly;
 * with 8-bit activations (q8, qmm.h) every kernel set (AVX2,
 * AVX-VNNI, AVX-512 VNNI, wherever the CPU has it) must equal the plain-C
 * reference qmm_ref_dot bit for bit.  Also the kernel set selection (cpu_kernels).  On a CPU without AVX2+FMA+F16C
 * the AVX2 part prints SKIP and passes. */
#include "check.h"

#include "backend/backend.h"
#include "backend/backend_list.h"
#include "be_util.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/qmm.h"
#include "core/core.h"
#include "num_util.h"

#include <math.h>
#include <string.h>

#define MAX_K (4096 + 32)
#define MAX_N 136   /* > 2 x QMM_TB (qmm.c): the placed q8 path sweeps tokens in blocks of 64 */

static struct rng g_rng;

static float urand(void) { return tu_urand(&g_rng); }

/* tb_weight's (be_util.h) with this test's generator. */
static struct tensor make_weight(uint32_t type, int64_t K, int64_t M) { return tb_weight(&g_rng, type, K, M, false); }

struct backends { struct backend_ctx *scalar, *avx2[2]; /* a SIMD set with 1 and 2 threads */ };

/* The 8-bit path's reference (qmm.h, qmm_k.c): rows quantized, then the definition. */
static void ref_q8(const struct tensor *w, const float *x, int n, float *y) {
    const int64_t K = w->ne0, M = w->ne1;
    uint8_t *row = malloc(qmm_act_row_bytes(K));
    KV_ASSERT(row);
    for (int t = 0; t < n; t++) {
        qmm_quantize_act(w->type, x + (size_t)t * K, K, row);
        for (int64_t r = 0; r < M; r++) y[(size_t)t * M + r] = qmm_ref_dot_act(w->type, tensor_row(w, r), row, K);
    }
    free(row);
}

/* The integer path's arithmetic in double: activations quantized per block
 * of 32 as matmul_int_avx2.c does (d = amax / 4095, codes rounded to nearest
 * even), times the dequantized weights (the reference dequantizer).  Its
 * only difference from the kernel is f32 rounding of the per-block terms. */
static void ref_int(const struct tensor *w, const float *x, int n, float *y) {
    const int64_t K = w->ne0, M = w->ne1;
    float *wr = malloc((size_t)K * sizeof *wr);
    double *xq = malloc((size_t)K * sizeof *xq);
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * K;
        for (int64_t b = 0; b < K / 32; b++) {
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xt[32 * b + i]));
            const float d = amax / 4095.0f, id = amax > 0 ? 4095.0f / amax : 0.0f;   /* QMAX */
            for (int i = 0; i < 32; i++) xq[32 * b + i] = (double)nearbyintf(xt[32 * b + i] * id) * d;
        }
        for (int64_t r = 0; r < M; r++) {
            dtype_to_f32(w->type, tensor_row(w, r), wr, K);
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (double)wr[k] * xq[k];
            y[(size_t)t * M + r] = (float)s;
        }
    }
    free(wr);
    free(xq);
}

/* One (type, K, M) case: vs scalar for every n, then invariance. */
static void check_case(const struct backends *B, uint32_t type, int64_t K, int64_t M) {
    static const int ns[] = { 1, 3, 5, 11, 16, 17, 64, 136 };
    struct tensor w = make_weight(type, K, M);
    float *x = malloc((size_t)MAX_N * (size_t)K * sizeof *x);
    float *ref = malloc((size_t)MAX_N * (size_t)M * sizeof *ref);
    float *out = malloc((size_t)MAX_N * (size_t)M * sizeof *out);
    float *full[2] = { malloc((size_t)MAX_N * (size_t)M * sizeof(float)),
                       malloc((size_t)MAX_N * (size_t)M * sizeof(float)) };
    KV_ASSERT(x && ref && out && full[0] && full[1]);
    for (int64_t i = 0; i < (int64_t)MAX_N * K; i++) x[i] = urand();
    const size_t yrow = (size_t)M * sizeof(float);

    /* 1. against the scalar reference */
    for (size_t in = 0; in < sizeof ns / sizeof *ns; in++) {
        int n = ns[in];
        B->scalar->ops->matmul(B->scalar, ref, &w, x, n);
        for (int th = 0; th < 2; th++) {
            memset(out, 0xff, (size_t)n * yrow);
            B->avx2[th]->ops->matmul(B->avx2[th], out, &w, x, n);
            /* FMA (avx2) vs separate multiply and add (scalar): with M = 1 the norm is one
             * dot product, whose cancellation can lift the relative error past 1e-5 */
            double e = rel_err(out, ref, (size_t)n * (size_t)M), tol = M == 1 ? 5e-5 : 1e-5;
            /* integer activations: each block's rounding (half a step of amax /
             * 4095, uniform) gives about 1.3e-4 relative on these uniform inputs;
             * that it is only this rounding is checked exactly against ref_int */
            const enum act_mode am = cpu_ctx_of(B->avx2[th])->act;
            const bool ia = cpu_matmul_int_supports(type, K) &&
                            am == ACT_INT;
            const bool iq = am == ACT_Q8 && qmm_supports(type, K);
            if (ia) tol = M == 1 ? 5e-3 : 1e-3;   /* M = 1: one dot product, cancellation */
            /* 8-bit codes: half a step of amax / 127 per element, about 4e-3 relative here */
            if (iq) tol = M == 1 ? 0.2 : 1.5e-2;   /* M = 1: a single dot product of 32 .. 96, cancellation */
            if (iq) {
                float *rq = malloc((size_t)n * yrow);
                ref_q8(&w, x, n, rq);
                CHECK_MSG(memcmp(out, rq, (size_t)n * yrow) == 0, "%s K=%lld M=%lld n=%d threads=%d: q8 path "
                          "differs from qmm_ref_dot", dtype_name(type), (long long)K, (long long)M, n, th + 1);
                free(rq);
            }
            /* one output alone (M = n = 1) on integer activations: its relative error
             * is unbounded under cancellation; its exact model is checked instead */
            if ((ia || iq) && M * n == 1) tol = INFINITY;
            CHECK_MSG(e <= tol, "%s K=%lld M=%lld n=%d threads=%d%s: rel err %.3g", dtype_name(type),
                      (long long)K, (long long)M, n, th + 1, ia ? " (int)" : iq ? " (q8)" : "", e);
            if (ia) {
                float *ri = malloc((size_t)n * yrow);
                ref_int(&w, x, n, ri);
                double ei = rel_err(out, ri, (size_t)n * (size_t)M);
                CHECK_MSG(ei <= (M == 1 ? 5e-5 : 1e-5), "%s K=%lld M=%lld n=%d threads=%d: int path vs its exact "
                          "model: rel err %.3g", dtype_name(type), (long long)K, (long long)M, n, th + 1, ei);
                free(ri);
            }
        }
    }

    /* 2. batch invariance: the n = MAX_N result, by 1 and by 2 threads ... */
    for (int th = 0; th < 2; th++) B->avx2[th]->ops->matmul(B->avx2[th], full[th], &w, x, MAX_N);
    CHECK_MSG(memcmp(full[0], full[1], (size_t)MAX_N * yrow) == 0, "%s K=%lld M=%lld: 1 vs 2 threads differ",
              dtype_name(type), (long long)K, (long long)M);
    for (int th = 0; th < 2; th++) {
        struct backend_ctx *be = B->avx2[th];
        /* ... equals each token alone ... */
        int bad = 0;
        for (int t = 0; t < MAX_N; t++) {
            be->ops->matmul(be, out, &w, x + (size_t)t * K, 1);
            bad += memcmp(out, full[0] + (size_t)t * M, yrow) != 0;
        }
        CHECK_MSG(!bad, "%s K=%lld M=%lld threads=%d: %d tokens differ alone vs in n=136", dtype_name(type),
                  (long long)K, (long long)M, th + 1, bad);
        /* ... and inside batches of 17, 16, 11 and 5 (the prefill path, ending
         * on 2, 1, 2 and 2 tokens) and 3 (block formats: two tokens, then one)
         * starting anywhere ... */
        static const int starts[] = { 0, 1, 23, MAX_N - 17 }, sizes[] = { 17, 16, 11, 5, 3 };
        for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++)
            for (size_t s = 0; s < sizeof starts / sizeof *starts; s++) {
                be->ops->matmul(be, out, &w, x + (size_t)starts[s] * K, sizes[z]);
                CHECK_MSG(memcmp(out, full[0] + (size_t)starts[s] * M, (size_t)sizes[z] * yrow) == 0,
                          "%s K=%lld M=%lld threads=%d: n=%d batch at %d differs from n=64", dtype_name(type),
                          (long long)K, (long long)M, th + 1, sizes[z], starts[s]);
            }
        /* ... and computed from a sub-range of weight rows (other tiles) */
        if (M >= 7) {
            const int64_t r0 = 3, m = M - r0 < 4 ? M - r0 : 4;
            struct tensor sub = w;
            sub.ne1 = m;
            sub.data = tensor_row(&w, r0);
            be->ops->matmul(be, out, &sub, x, MAX_N);
            int diff = 0;
            for (int t = 0; t < MAX_N; t++)
                diff += memcmp(out + (size_t)t * m, full[0] + (size_t)t * M + r0, (size_t)m * sizeof(float)) != 0;
            CHECK_MSG(!diff, "%s K=%lld M=%lld threads=%d: rows %lld.. alone differ in %d tokens", dtype_name(type),
                      (long long)K, (long long)M, th + 1, (long long)r0, diff);
        }
    }
    free((void *)w.data);
    free(x);
    free(ref);
    free(out);
    free(full[0]);
    free(full[1]);
}

/* The integer group kernels one by one (the "avx2" set takes AVX-VNNI's
 * when the CPU has it, so plain AVX2's is called directly here too): each
 * equals qmm_group_scalar bit for bit, for any n and any row count, on
 * weights in rows (packed on the fly) and repacked by place_weights
 * (TENSOR_Q8X16), whose get_rows must give the rows' exact values. */
static void test_q8_rows(struct backend_ctx *ctx, const struct cpu_features *f) {
    struct { const char *name; qmm_group_fn *fn; bool ok; } sets[] = {
        { "avx2", qmm_group_avx2, cpu_q8_avx2_built() && f->avx2 && f->fma && f->f16c },
        { "avxvnni", qmm_group_avxvnni, cpu_q8_avxvnni_built() && f->avxvnni && f->fma && f->f16c },
        { "avx512", qmm_group_avx512, cpu_q8_avx512_built() && f->avx512f && f->avx512bw && f->avx512vl &&
                                     f->avx512vnni && f->avx2 && f->fma && f->f16c },
        /* the AMX kernel on emulated tiles (its float step is AVX-512), and on real ones (test_backend_amx.c) */
        { "amx-emulated", qmm_group_amx_emu, cpu_q8_amx_emu_built() && cpu_q8_avx512_built() && f->avx512f &&
                                             f->avx512bw && f->avx512vl && f->avx512vnni && f->avx2 && f->fma && f->f16c },
        { "amx", qmm_group_amx, cpu_q8_amx_built() && cpu_q8_avx512_built() && f->avx512f && f->avx512bw &&
                               f->avx512vl && f->avx512vnni && f->avx2 && f->fma && f->f16c && f->amx_tile &&
                               f->amx_int8 && f->amx_os && cpu_amx_permit() == 0 },
    };
    static const uint32_t types[] = { DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_Q4_1, DTYPE_Q5_0, DTYPE_Q5_1, DTYPE_IQ4_NL, DTYPE_MXFP4 };
    static const int64_t Ks[] = { 32, 64, 96, 2048, MAX_K };
    static const int64_t Ms[] = { 1, 2, 3, 9, 17, 40 };
    static const int ns[] = { 1, 2, 3, 4, 6, 7, 64, 130 };
    for (size_t s = 0; s < sizeof sets / sizeof *sets; s++) {
        if (!sets[s].ok) { printf("SKIP: q8 group %s (this CPU or build lacks it)\n", sets[s].name); continue; }
        int cases = 0;
        for (size_t it = 0; it < sizeof types / sizeof *types; it++)
            for (size_t ik = 0; ik < sizeof Ks / sizeof *Ks; ik++)
                for (size_t im = 0; im < sizeof Ms / sizeof *Ms; im++) {
                    const int64_t K = Ks[ik], M = Ms[im];
                    struct tensor w = make_weight(types[it], K, M);
                    float *x = malloc((size_t)MAX_N * (size_t)K * sizeof *x);
                    float *ref = malloc((size_t)MAX_N * (size_t)M * sizeof *ref);
                    float *out = malloc((size_t)MAX_N * (size_t)M * sizeof *out);
                    KV_ASSERT(x && ref && out);
                    for (int64_t i = 0; i < (int64_t)MAX_N * K; i++) x[i] = urand() * (i % 7 == 0 ? 10.0f : 1.0f);
                    for (int64_t k = 0; k < 32; k++) x[k] = 0;   /* an all-zero block: d = 0 */
                    struct tensor pw = w;   /* repacked by the backend's placement */
                    pw.data = NULL;
                    {
                        struct tensor tmp = w;
                        struct tensor *tp = &tmp;
                        struct backend *pb = NULL;
                        CHECK(backend_cpu_new("avx2", false, BACKEND_ACT_Q8, &pb) == 0);
                        uint64_t placed = 0;
                        CHECK(pb->ops->place_weights(pb, &tp, 1, NULL, &placed) == 0);
                        CHECK(tmp.layout == TENSOR_Q8X16 && placed >= qmm_packed_bytes(&w) && placed < qmm_packed_bytes(&w) + 64);
                        uint8_t *copy = malloc(qmm_packed_bytes(&w));
                        KV_ASSERT(copy);
                        memcpy(copy, tmp.data, qmm_packed_bytes(&w));
                        pw = tmp;
                        pw.data = copy;
                        backend_free(pb);
                    }
                    for (size_t in = 0; in < sizeof ns / sizeof *ns; in++) {
                        const int n = ns[in];
                        CHECK(qmm_matmul(ctx, ref, &w, x, n, qmm_group_scalar) == 0);
                        for (int packed = 0; packed < 2; packed++) {
                            memset(out, 0xff, (size_t)n * (size_t)M * sizeof *out);
                            CHECK(qmm_matmul(ctx, out, packed ? &pw : &w, x, n, sets[s].fn) == 0);
                            CHECK_MSG(memcmp(out, ref, (size_t)n * (size_t)M * sizeof *out) == 0,
                                      "q8 group %s %s K=%lld M=%lld n=%d%s: differs from the reference",
                                      sets[s].name, dtype_name(types[it]), (long long)K, (long long)M, n,
                                      packed ? " (repacked)" : "");
                            cases++;
                        }
                    }
                    /* get_rows of the repacked tensor: the rows' own values */
                    int32_t ids[3] = { 0, (int32_t)(M - 1), (int32_t)(M / 2) };
                    float *g1 = malloc(3 * (size_t)K * sizeof *g1), *g2 = malloc(3 * (size_t)K * sizeof *g2);
                    KV_ASSERT(g1 && g2);
                    CHECK(ctx->ops->get_rows(ctx, g1, &pw, ids, 3) == 0);
                    for (int i = 0; i < 3; i++) dtype_to_f32(w.type, tensor_row(&w, ids[i]), g2 + (size_t)i * K, K);
                    CHECK_MSG(memcmp(g1, g2, 3 * (size_t)K * sizeof *g1) == 0, "get_rows of repacked %s K=%lld M=%lld",
                              dtype_name(types[it]), (long long)K, (long long)M);
                    free(g1);
                    free(g2);
                    free((void *)pw.data);
                    free((void *)w.data);
                    free(x);
                    free(ref);
                    free(out);
                }
        printf("q8 group %s: %d cases bit-identical to qmm_ref_dot\n", sets[s].name, cases);
    }
}

static void test_kinds(bool have_avx2, bool have_avx512, bool have_amx) {
    /* the default: the best set here (amx where the CPU, build and OS give tiles) */
    const char *best = have_amx ? "amx" : have_avx512 ? "avx512" : have_avx2 ? "avx2" : "scalar";
    struct backend *be = (struct backend *)1;
    CHECK(backend_cpu_new("scalar", false, BACKEND_ACT_Q8, &be) == 0 && be && strcmp(be->ops->name, "scalar") == 0);
    backend_free(be);
    be = (struct backend *)1;
    CHECK(backend_cpu_new(NULL, false, BACKEND_ACT_Q8, &be) == 0 && be);
    if (be) CHECK(strcmp(be->ops->name, best) == 0);
    backend_free(be);
    CHECK(backend_cpu_new("", false, BACKEND_ACT_Q8, &be) == 0 && be);
    if (be) CHECK(strcmp(be->ops->name, best) == 0);
    backend_free(be);
    /* the avx2 table overrides matmul, attention, the GLU activations and
     * kv_store and inherits the rest; with 8-bit activations (the default)
     * also get_rows, which reads the weights repacked for the integer kernels */
    for (int q8 = 0; q8 < 2 && have_avx2; q8++) {
        const int rc = backend_cpu_new("avx2", false, q8 ? BACKEND_ACT_Q8 : BACKEND_ACT_F32, &be);
        CHECK(rc == 0);
        if (rc) break;
        struct backend *sc = NULL;
        CHECK(backend_cpu_new("scalar", false, BACKEND_ACT_Q8, &sc) == 0);
        CHECK(be->ops->matmul != sc->ops->matmul && be->ops->paged_attention != sc->ops->paged_attention &&
              be->ops->swiglu != sc->ops->swiglu && be->ops->kv_store != sc->ops->kv_store);
        CHECK(be->ops->rope == sc->ops->rope);
        CHECK((be->ops->get_rows == sc->ops->get_rows) == !q8);
        backend_free(sc);
        backend_free(be);
    }
    if (have_avx512) {
        CHECK(backend_cpu_new("avx512", false, BACKEND_ACT_Q8, &be) == 0 && be && strcmp(be->ops->name, "avx512") == 0);
        backend_free(be);
    }
    if (have_amx) {
        CHECK(backend_cpu_new("amx", false, BACKEND_ACT_Q8, &be) == 0 && be && strcmp(be->ops->name, "amx") == 0);
        backend_free(be);
    }
    fprintf(stderr, "(the next errors are expected)\n");
    /* a set the CPU (or build, or OS) lacks is refused */
    be = (struct backend *)1;
    if (!have_avx512) CHECK(backend_cpu_new("avx512", false, BACKEND_ACT_Q8, &be) == KVLLM_ECPU && be == NULL);
    if (!have_amx) CHECK(backend_cpu_new("amx", false, BACKEND_ACT_Q8, &be) == KVLLM_ECPU && be == NULL);
    CHECK(backend_cpu_new("bogus", false, BACKEND_ACT_Q8, &be) == KVLLM_ECPU && be == NULL);
    if (!have_avx2) CHECK(backend_cpu_new("avx2", false, BACKEND_ACT_Q8, &be) == KVLLM_ECPU && be == NULL);
    backend_free(NULL);
}

/* The choice as kvllm_model_params names it: the names each field takes
 * (NULL and "" the default), others refused; backend_new makes the kind
 * asked for, and backend_free frees it through its table. */
static void test_backend_new(void) {
    enum backend_kind k = BACKEND_CUDA;
    CHECK(backend_kind_parse(NULL, &k) == 0 && k == BACKEND_CPU);
    CHECK(backend_kind_parse("strict", &k) == 0 && k == BACKEND_STRICT);
    CHECK(backend_kind_parse("", &k) == 0 && k == BACKEND_CPU);
    CHECK(backend_kind_parse("cuda", &k) == 0 && k == BACKEND_CUDA);
    enum backend_act a = BACKEND_ACT_INT;
    CHECK(backend_act_parse(NULL, &a) == 0 && a == BACKEND_ACT_Q8);
    CHECK(backend_act_parse("f32", &a) == 0 && a == BACKEND_ACT_F32);
    CHECK(backend_act_parse("int", &a) == 0 && a == BACKEND_ACT_INT);
    CHECK(backend_act_parse("q8", &a) == 0 && a == BACKEND_ACT_Q8);
    fprintf(stderr, "(the next errors are expected)\n");
    CHECK(backend_kind_parse("gpu", &k) == KVLLM_EINVAL && k == BACKEND_CUDA);   /* left as it was */
    CHECK(backend_act_parse("q4", &a) == KVLLM_EINVAL && a == BACKEND_ACT_Q8);
    struct backend *be = (struct backend *)1;
    CHECK(backend_new(&(struct backend_params){ .kind = BACKEND_STRICT, .cpu_kernels = "scalar" }, &be) == 0 && be);
    if (be) CHECK(strcmp(be->ops->name, "strict/scalar") == 0 && backend_supports(be, BACKEND_OP_KV_SHIFT, 0));
    backend_free(be);
    CHECK(backend_new(&(struct backend_params){ .kind = BACKEND_CPU, .cpu_kernels = "scalar" }, &be) == 0 && be);
    if (be) CHECK(strcmp(be->ops->name, "scalar") == 0 && backend_supports(be, BACKEND_OP_MOE, DTYPE_Q4_K));
    backend_free(be);
    be = (struct backend *)1;
    CHECK(backend_new(&(struct backend_params){ .cpu_kernels = "bogus" }, &be) == KVLLM_ECPU && be == NULL);
    if (!backend_cuda_built()) {
        be = (struct backend *)1;
        CHECK(backend_new(&(struct backend_params){ .kind = BACKEND_CUDA }, &be) == KVLLM_EUNSUPPORTED && be == NULL);
    }
}

int main(void) {
    rng_seed(&g_rng, 20240611);
    struct cpu_features f;
    cpu_features_get(&f);
    const bool have_avx2 = cpu_avx2_built() && f.avx2 && f.fma && f.f16c;
    const bool have_avx512 = have_avx2 && cpu_q8_avx512_built() && f.avx512f && f.avx512bw && f.avx512vl &&
                             f.avx512vnni;
    const bool have_amx = have_avx512 && cpu_q8_amx_built() && f.amx_tile && f.amx_int8 && f.amx_os &&
                          cpu_amx_permit() == 0;
    test_kinds(have_avx2, have_avx512, have_amx);
    test_backend_new();
    if (!have_avx2) {
        printf("SKIP: avx2 matmul (this CPU or build lacks AVX2+FMA+F16C)\n");
        return check_report("test_backend_matmul");
    }
    struct backends B = { 0 };
    CHECK((B.scalar = tb_new("scalar", false, BACKEND_ACT_Q8, 1, MAX_K, MAX_N, 1, 1, 1)) != NULL);
    /* first the f32 path; q8 (the default) and int below */
    CHECK((B.avx2[0] = tb_new("avx2", false, BACKEND_ACT_F32, 1, MAX_K, MAX_N, 1, 1, 1)) != NULL);
    CHECK((B.avx2[1] = tb_new("avx2", false, BACKEND_ACT_F32, 2, MAX_K, MAX_N, 1, 1, 1)) != NULL);
    if (!B.scalar || !B.avx2[0] || !B.avx2[1]) return check_report("test_backend_matmul");
    if (threadpool_size(cpu_ctx_of(B.avx2[1])->pool) < 2) printf("note: one CPU online, the 2-thread runs use 1\n");

    static const uint32_t types[] = { DTYPE_F32,  DTYPE_F16,  DTYPE_BF16, DTYPE_Q8_0,   DTYPE_Q4_0,   DTYPE_Q4_1,
                                      DTYPE_Q5_0, DTYPE_Q5_1, DTYPE_Q2_K, DTYPE_Q3_K,   DTYPE_Q4_K,   DTYPE_Q5_K,
                                      DTYPE_Q6_K, DTYPE_IQ4_NL, DTYPE_IQ4_XS, DTYPE_MXFP4 };
    /* 13 and 100: not whole blocks (float types only); 256 and 768: K-quant super-blocks */
    static const int64_t Ks[] = { 32, 96, MAX_K, 13, 100, 256, 768 };
    static const int64_t Ms[] = { 1, 7, 33 };
    for (size_t it = 0; it < sizeof types / sizeof *types; it++)
        for (size_t ik = 0; ik < sizeof Ks / sizeof *Ks; ik++) {
            if (Ks[ik] % dtype_block_elems(types[it])) continue;
            for (size_t im = 0; im < sizeof Ms / sizeof *Ms; im++) check_case(&B, types[it], Ks[ik], Ms[im]);
        }
    /* the block types again with integer activations: int (13-bit, avx2)
     * and q8 (8-bit, avx2 and avx512); the activations' buffer is sized at
     * creation: new contexts */
    static const struct { enum backend_act act; const char *kind; enum act_mode mode; } runs[] = {
        { BACKEND_ACT_INT, "avx2", ACT_INT }, { BACKEND_ACT_Q8, "avx2", ACT_Q8 }, { BACKEND_ACT_Q8, "avx512", ACT_Q8 } };
    for (size_t ir = 0; ir < sizeof runs / sizeof *runs; ir++) {
        if (!strcmp(runs[ir].kind, "avx512") && !have_avx512) { printf("SKIP: avx512 q8 matmul\n"); continue; }
        tb_free(B.avx2[0]);
        tb_free(B.avx2[1]);
        CHECK((B.avx2[0] = tb_new(runs[ir].kind, false, runs[ir].act, 1, MAX_K, MAX_N, 1, 1, 1)) != NULL);
        CHECK((B.avx2[1] = tb_new(runs[ir].kind, false, runs[ir].act, 2, MAX_K, MAX_N, 1, 1, 1)) != NULL);
        if (!B.avx2[0] || !B.avx2[1]) return check_report("test_backend_matmul");
        CHECK(cpu_ctx_of(B.avx2[0])->act == runs[ir].mode && cpu_ctx_of(B.avx2[1])->act == runs[ir].mode);
        for (size_t it = 0; it < sizeof types / sizeof *types; it++)
            for (size_t ik = 0; ik < sizeof Ks / sizeof *Ks; ik++) {
                const bool takes = runs[ir].mode == ACT_INT ? cpu_matmul_int_supports(types[it], Ks[ik])
                                                            : qmm_supports(types[it], Ks[ik]);
                if (Ks[ik] % dtype_block_elems(types[it]) || !takes) continue;
                for (size_t im = 0; im < sizeof Ms / sizeof *Ms; im++) check_case(&B, types[it], Ks[ik], Ms[im]);
            }
        if (runs[ir].mode == ACT_Q8 && !strcmp(runs[ir].kind, "avx2")) test_q8_rows(B.avx2[1], &f);
    }
    tb_free(B.scalar);
    tb_free(B.avx2[0]);
    tb_free(B.avx2[1]);
    return check_report("test_backend_matmul");
}
