/* test_backend_ops.c — every op of every backend on this machine against the
 * scalar reference, in the manner of llama.cpp's test-backend-ops.
 *
 * Backends: "scalar" (the reference), "avx2" (where the CPU has AVX2, FMA
 * and F16C; otherwise a SKIP line naming what is missing), the same two
 * kernel sets behind the strict wall ("strict/scalar", "strict/avx2"), the
 * SIMD sets with 8-bit activations ("avx2+act=q8", "avx512+act=q8",
 * "amx+act=q8" where the CPU has AMX-INT8, bit-identical to avx512's: kvllm's
 * default, activations q8; the others here are pinned to f32) and avx2 with
 * 13-bit ones ("avx2+act=int", activations int), and "cuda" (f32
 * activations) and "cuda+act=q8" (its default: matmul_q8.cu's 8-bit path,
 * held to the same bound as the CPU's q8 sets) where this build has the
 * CUDA backend and the machine a CUDA device (otherwise a SKIP line saying
 * which is missing).  A future backend joins
 * the list in main() and must pass the same table.  A device backend finds
 * some errors only on the device (a row id, a position: device memory), so
 * its op may return 0 and backend_sync KVLLM_ERANGE.
 * Shapes: row lengths not a multiple of 8 for float weights, 1-40 tokens,
 * GQA ratios 1/2/3/4/6/8, head_dim 8-128 (multiples of 8, odd ones among
 * them, and any size now and then; fixed cases at 64/128/256 for the CUDA
 * head-size kernels), block sizes 1/5/16/32, every KV type,
 * every weight type the loader accepts, contexts across the 1024-position
 * split, sliding windows, attention sinks, rope neox or not with freq factors, scales and YaRN.
 * Every case draws fresh random inputs of random shapes and goes through
 * each backend's own memory as the engine does: weights placed with
 * place_weights (from host data), buffers from buf_alloc, inputs put in with
 * upload, ops issued with BE_OP, results read with download and
 * backend_sync.  Host code that touched backend memory directly would crash
 * on the strict backends, so they prove the harness itself device-clean.
 *
 * Each case's output is compared, as ‖out − ref‖ / ‖ref‖ over the whole
 * output (absolute when ‖ref‖ = 0; a NaN or Inf is an infinite error), with
 *   1. the scalar backend's output: exact (0) for the same kernels (scalar,
 *      strict/scalar), the "SIMD" bound below for another kernel set;
 *   2. its twin without the wall (strict/X vs X): bit-identical, always;
 *   3. a double-precision reference written here from the math (the "ref"
 *      column; "-": none, the scalar backend is the oracle).
 *
 * op               SIMD   ref     notes
 * matmul           1e-5   -       FMA vs multiply-add; under 8 output values, where one dot
 *                                 product's cancellation can dominate the norm, the larger of
 *                                 5e-5 and the dot products' error bound 2 K 2^-24 ‖|W||x|‖/‖y‖;
 *                                 integer activations 1e-3 (5e-3), 13-bit codes per block, or
 *                                 that rounding's bound (half a step times Σ|w|) where larger;
 *                                 8-bit activations (q8) that rounding's bound alone (half a step
 *                                 of amax / 127 per block of 32, K-quants 256, times Σ|w|)
 * get_rows         0      0       ref: dtype.h's dequantizer (tested in test_tensor_dtype)
 * gather_rows      0      0       a copy
 * rmsnorm          2e-6   2e-6    f32 sum of squares over <= 300 values
 * layernorm        cond.  cond.   1e-6 + 8 sqrt(dim) 2^-24 (1 + max |mean| / sqrt(var + eps)):
 *                                 the f32 mean's rounding (~2^-24 |mean| sqrt(dim / 3)) shifts
 *                                 every value of a row alike, large for nearly constant rows;
 *                                 inputs are offset by up to 3 sigma
 * rope             1e-6   1e-6    angles in double, cos/sin rounded to f32; positions to 131072
 * add_bias, add    0      1e-7    one f32 rounding (< 2^-24 relative)
 * swiglu, gelu,    1e-6   1e-6    expf / tanhf, |x| up to 30; gelu's (and geglu's) denominator
 * geglu, softcap                  is max(‖ref‖, ‖x‖): the tanh form's 1 + tanh(u) cancels for
 *                                 x < 0, leaving an error ~|x| 2^-24 however small gelu(x) is;
 *                                 swiglu's (inputs now and then to |x| ~ 300) at least 2^-126 * 1e7:
 *                                 below x = -88.7 its 0 stands for a subnormal or less
 * scale            0      1e-7    one f32 rounding
 * moe_route        0      1e-6    ids exactly (ties: the lower expert); weights: expf over <= 8 logits
 * moe              1e-5   1e-5    f32 and f16 experts on f32 arithmetic (the matmul's bound); and each
 *                                 token alone bit-identical to the batch (batch invariance)
 * kv_store         0      bytes   stored bytes identical everywhere; against the math: f32 exact,
 *                                 f16 / bf16 the dtype.h rounding, int8 / fp8 scale = amax / 127
 *                                 (448) and every code within half a step; the dequantized rows
 *                                 within k_store_bound of the inputs
 * paged_attention  per KV type    k_pa_simd (SIMD vs scalar, both over the same stored values),
 *                                 k_pa_stored (vs double softmax over the stored values),
 *                                 k_pa_input (vs double softmax over the unquantized K/V:
 *                                 the quantization error, bounds from test_backend_paged_attn.c)
 *                  CUDA, steps of >= CUDA_PF_MIN_TOKENS tokens at head_dim 64 / 128 / 256 (the
 *                                 tensor-core kernel, 16-bit inputs): k_pa_prefill vs scalar and vs
 *                                 the references, k_pa_input + k_pa_prefill vs the inputs
 *                  matmul on CUDA by cuBLAS (cuda_gemm_pick: 8-bit activation mode, >= 32 / 64
 *                                 tokens): CUDA_GEMM_TOL_F16 / _BF16, or the q8 bound where larger
 * copy_blocks      0      bytes   every byte of K, V and scales: dst blocks = src blocks, the rest
 *                                 untouched
 * argmax           0      0       token ids exactly: ties (values on a coarse grid), NaN, +-inf,
 *                                 rows with no finite value (-1), vocabulary-sized rows
 * sample           0      0       token ids exactly (the CPU runs the host sampler's own chain), vs a
 *                                 reference written here (qsort in the total order, no heaps nor
 *                                 mass buckets, sums in the chain's order): ties, NaN, +-inf, rows
 *                                 with nothing valid (-1), greedy rows, top_k 1 / random / off,
 *                                 top_p tiny / off, min_p up to 1, temperatures 1e-30 to 100, u at 0
 *                                 and just under 1.  A device may differ only where the reference
 *                                 finds a decision within SAMPLE_NEAR_TIE of its threshold (the
 *                                 draw's r from a CDF boundary, a top-p cut from its target, both
 *                                 relative to the mass, or a min-p ratio from min_p): it sums the
 *                                 weights in another order and its expf is not glibc's
 * Also: the error returns (paged attention over more tokens than the
 * context's max_tokens or past its max_ctx, get_rows out of range:
 * KVLLM_ERANGE, kept as the context's status until backend_sync) and the
 * BE_OP fail hook (fail_after / fail_code).
 *
 * Prints one line per (backend, op): cases and worst errors; every failure
 * names the backend, op and shape.  Seeded from the clock unless
 * KVLLM_TEST_SEED is set; the seed is printed.  About 6-9 s in a release
 * build on 2 cores; a third of the cases in -O0 / sanitizer builds. */
#include "check.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/qmm.h"
#include "backend/backend_list.h"
#include "backend/cuda/cuda_plan.h"
#include "be_util.h"
#include "core/core.h"
#include "num_util.h"
#include "tensor/dtype.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tolerances ---- */

enum op {
    OP_MATMUL, OP_GET_ROWS, OP_GATHER_ROWS, OP_RMSNORM, OP_LAYERNORM, OP_ROPE, OP_ADD_BIAS, OP_ADD, OP_SWIGLU,
    OP_GELU, OP_GEGLU, OP_SCALE, OP_SOFTCAP, OP_MOE_ROUTE, OP_MOE, OP_KV_STORE, OP_PAGED_ATTN, OP_COPY_BLOCKS, OP_ARGMAX, OP_SAMPLE, OP_FUSED, OP_COUNT
};

static const struct {
    const char *name;
    double simd;   /* another kernel set vs scalar */
    double ref;    /* any backend vs the double reference; < 0: none */
} k_tol[OP_COUNT] = {
    [OP_MATMUL] = { "matmul", 1e-5, -1 },
    [OP_GET_ROWS] = { "get_rows", 0, 0 },
    [OP_GATHER_ROWS] = { "gather_rows", 0, 0 },
    [OP_RMSNORM] = { "rmsnorm", 2e-6, 2e-6 },
    [OP_LAYERNORM] = { "layernorm", 1e-6, 1e-6 },   /* plus the conditioning term (table) */
    [OP_ROPE] = { "rope", 1e-6, 1e-6 },
    [OP_ADD_BIAS] = { "add_bias", 0, 1e-7 },
    [OP_ADD] = { "add", 0, 1e-7 },
    [OP_SWIGLU] = { "swiglu", 1e-6, 1e-6 },
    [OP_GELU] = { "gelu", 1e-6, 1e-6 },
    [OP_GEGLU] = { "geglu", 1e-6, 1e-6 },
    [OP_SCALE] = { "scale", 0, 1e-7 },
    [OP_SOFTCAP] = { "softcap", 1e-6, 1e-6 },
    [OP_MOE_ROUTE] = { "moe_route", 0, 1e-6 },
    [OP_MOE] = { "moe", 1e-5, 1e-5 },
    [OP_KV_STORE] = { "kv_store", 0, 0 },          /* per type: k_store_bound */
    [OP_PAGED_ATTN] = { "paged_attention", 0, 0 }, /* per type: k_pa_* */
    [OP_COPY_BLOCKS] = { "copy_blocks", 0, 0 },
    [OP_ARGMAX] = { "argmax", 0, 0 },
    [OP_SAMPLE] = { "sample", 0, 0 },
    [OP_FUSED] = { "fused", 0, 0 },                /* vs the same backend's separate ops: exact */
};
/* sample on a device: how close to its threshold a decision must be for another token to pass
 * (the table) */
#define SAMPLE_NEAR_TIE 1e-5
#define MATMUL_SIMD_FEW 5e-5   /* outputs of fewer than 8 values */
/* matmul with integer activations (activations int, the types it takes):
 * each block of 32 rounded to 13-bit codes, ~2e-4 relative on Gaussian
 * activations (test_backend_matmul.c checks that this rounding is all);
 * or the rounding's own bound where larger (matmul_bounds) */
#define MATMUL_INT 1e-3
#define MATMUL_INT_FEW 5e-3

static const char *const k_kv_names[KV_TYPE_COUNT_] = { "f32", "f16", "bf16", "int8", "fp8" };
/* kv_store: ‖dequantized stored rows − inputs‖ / ‖inputs‖, provable: half an
 * ulp (f16 2^-11, bf16 2^-8 relative; f16 values below 2^-14 add at most
 * half a subnormal step, 2^-25, each: k_store_abs), int8 half a step of
 * amax / 127 per element (‖err‖ <= sqrt(head_dim) amax / 254, 0.045 for
 * 128), fp8 2^-4 relative plus subnormal steps of 2^-10 scale. */
static const double k_store_bound[KV_TYPE_COUNT_] = { 0, 0x1p-11, 0x1p-8, 0.045, 0.075 };
static const double k_store_abs[KV_TYPE_COUNT_] = { 0, 0x1p-25, 0, 0, 0 };
/* paged attention, SIMD vs scalar over the same stored values: f32 rounding
 * of the scores and sums in another order. */
static const double k_pa_simd[KV_TYPE_COUNT_] = { 2e-5, 2e-5, 2e-5, 2e-5, 2e-5 };
/* vs a double softmax over the stored values (and the query as the kernels
 * quantize it for int8 K): f32 arithmetic only; int8 also rounds each
 * step's weights to 16-bit codes (struct pa_q8, test_backend_paged_attn.c's
 * bound). */
static const double k_pa_stored[KV_TYPE_COUNT_] = { 2e-5, 2e-5, 2e-5, 3e-4, 2e-5 };
/* vs the unquantized inputs: the quantization error.  Gaussian K/V: the
 * maxima seen over 1,200 cases (random scales up to 1.5 / sqrt(head_dim),
 * contexts from 1) were f16 4.6e-4, bf16 3.5e-3, int8 1.5e-2, fp8 4.9e-2;
 * the bounds are about 3x that (test_backend_paged_attn.c's, widened for
 * int8 and fp8).  K with outlier channels: its bounds (seen: 1.3e-3, 7.3e-3,
 * 4.8e-2, 4.4e-2).  A wrong scale or row gives ~1. */
static const double k_pa_input[KV_TYPE_COUNT_] = { 1e-5, 1.5e-3, 1e-2, 4e-2, 0.15 };
/* The CUDA prefill kernel (attention_prefill.cu) rounds the scaled query, the softmax weights and,
 * for f32 / int8 / fp8 storage, K and V (times their scales) to 16 bits: f16 (u = 2^-11 relative)
 * except for bf16 storage (bf16, u = 2^-8).  Each score moves by about u / sqrt(3) times its
 * magnitude's sum of terms, each weight and value by u / sqrt(3): ~3e-4 norm-wise for f16 and
 * ~2.5e-3 for bf16 on Gaussian data, larger with outlier channels and scales to 1.5 / sqrt(hd);
 * the bounds are about 8x that.  A wrong row, mask or fragment gives ~1. */
static const double k_pa_prefill[KV_TYPE_COUNT_] = { 3e-3, 3e-3, 2e-2, 3e-3, 3e-3 };
/* The CUDA backend's cuBLAS matmuls (gemm.cu): activations (and dequantized weights) rounded to
 * f16 (bf16 for BF16 weights), f32 accumulation: norm-wise ~u / sqrt(3) (2.8e-4 f16, 2.3e-3 bf16,
 * sqrt(2) that with dequantized weights); bounds about 6x that. */
#define CUDA_GEMM_TOL_F16 2e-3
#define CUDA_GEMM_TOL_BF16 1.5e-2
static const double k_pa_input_outl[KV_TYPE_COUNT_] = { 3e-5, 1e-2, 6e-2, 0.4, 0.4 };

/* ---- backends ---- */

#define MAX_BE 12
#define MAX_TOKENS 40         /* tokens per step that the random cases draw */
#define CTX_TOKENS 72         /* tokens per step the contexts are sized for: the fixed matmul cases' 65 */
#define MAX_CTX 2200          /* longest attention context */
#define MAX_COLS 5120         /* longest weight row: the fixed matmul cases' 4,864 */
#define MAX_HEADS 32
#define MAX_HEAD_DIM 256       /* the fixed attention cases' largest */

struct tbe {
    const char *name;         /* the ops table's name, or a label ("avx2+act=int") */
    struct backend_ctx *c;    /* tb_new: the context on a backend of its own */
    struct backend *be;
    bool simd;                /* another kernel set than the scalar reference */
    const char *act;          /* activations: "f32", "int" (Q8_0 / Q4_0 / Q4_1 on 13-bit activations) or
                                 "q8" (qmm.h's types on 8-bit activations) */
    int twin;                 /* the same kernels without the wall, or -1 */
    bool device;              /* a GPU: errors seen only on the device come from backend_sync alone */
};

static struct tbe g_be[MAX_BE];
static int g_nbe;

/* Worst errors per (backend, op). */
static struct stat_ {
    long cases;
    double vs_scalar, vs_ref, vs_input;
} g_st[MAX_BE][OP_COUNT];
static double g_pa_worst[MAX_BE][KV_TYPE_COUNT_][3];   /* vs scalar, stored, input */
static double g_store_worst[KV_TYPE_COUNT_];

static struct rng g_rng;

/* Cases per op: a third in unoptimized or sanitizer builds (make test runs
 * the unit tests under ASan at -O0, about 10x slower). */
#if !defined(__OPTIMIZE__) || defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CASES(n) (((n) + 2) / 3)
#else
#define CASES(n) (n)
#endif

static int rnd(int n) { return tu_rnd(&g_rng, n); }
static int rnd_in(int lo, int hi) { return tu_rnd_in(&g_rng, lo, hi); }

/* Shapes: small random ones (the default), or with KVLLM_TEST_LARGE=1 the shapes of Llama-3-8B and
 * Qwen2.5-7B (hidden 4096 / 3584, FFN 14336 / 18944, vocabularies 128,256 / 152,064, head_dim 128,
 * 1, 65 or 130 tokens, contexts to 8k): scripts/gpu-check.sh runs them one op per process.  Large
 * mode runs only the ops that have large shapes; the contexts are sized for them. */
static bool g_large;
#define LARGE_TOKENS 130
#define LARGE_CTX 8300
#define LARGE_COLS 18944
static const int k_large_tokens[] = { 1, 65, LARGE_TOKENS };
static const int k_large_dims[] = { 3584, 4096 };
static const int k_large_ffn[] = { 14336, 18944 };
static const int k_large_vocab[] = { 128256, 152064 };
#define PICK(a) ((a)[rnd((int)(sizeof(a) / sizeof *(a)))])
static int draw_tokens(void) { return g_large ? PICK(k_large_tokens) : rnd_in(1, MAX_TOKENS); }

/* KVLLM_TEST_OPS, KVLLM_TEST_BACKENDS, KVLLM_TEST_WTYPES (dtype names: Q4_K): comma-separated names;
 * unset or empty: all.  The GPU check runs one op (and at large shapes one weight type) per process. */
static bool listed(const char *env, const char *name) {
    const char *l = getenv(env);
    if (!l || !*l) return true;
    const size_t n = strlen(name);
    for (const char *p = l; (p = strstr(p, name)) != NULL; p += n)
        if ((p == l || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return true;
    return false;
}

/* Adds a backend; its index in g_be, or -1 when it was left out or could not be made. */

/* The weight types KVLLM_TEST_WTYPES selects, into out (N_WTYPES); their count. */
static int selected_wtypes(uint32_t *out);
static float urand(void) { return tu_urand(&g_rng); }
static float gauss(void) { return tu_gauss(&g_rng); }

static double dmax(double a, double b) { return a > b ? a : b; }   /* errors are never NaN (INFINITY) */

/* The floor of rel_err_floor (num_util.h): > 0 only for gelu (see the table). */
static double g_den_floor;

/* ---- backend memory: the only way in and out ---- */

/* A buffer of bytes on b holding a copy of src (NULL: as allocated, zeroed). */
static struct backend_buf buf_up(struct tbe *b, const void *src, size_t bytes) {
    struct backend_buf buf;
    int rc = b->be->ops->buf_alloc(b->be, bytes ? bytes : 1, &buf);
    KV_ASSERT(rc == 0 && buf.data && buf.size >= bytes);
    if (src && bytes) CHECK(b->c->ops->upload(b->c, buf.data, src, bytes) == 0);
    return buf;
}

static void buf_down(struct tbe *b, void *dst, const struct backend_buf *buf, size_t bytes) {
    if (bytes) CHECK(b->c->ops->download(b->c, dst, buf->data, bytes) == 0);
}

static void buf_drop(struct tbe *b, struct backend_buf *buf) {
    b->be->ops->buf_free(b->be, buf);
    CHECK(buf->data == NULL);
}

/* Wait for b's context: the ops' return rc_op and the sync must both be 0. */
static void sync_ok(struct tbe *b, int rc_op, const char *desc) {
    int rc = backend_sync(b->c);
    CHECK_MSG(rc_op == 0 && rc == 0, "%s: %s: op returned %d, sync %d", b->name, desc, rc_op, rc);
}

/* Copies of n host tensors placed by b (one place_weights call, as at model
 * load); the caller frees the array.  Host data stays owned by the caller
 * and must outlive b (the CPU backend may keep pointing at it). */
static struct tensor *place(struct tbe *b, const struct tensor *host, int n) {
    struct tensor *ts = tu_xnew((size_t)n * sizeof *ts), **pp = tu_xnew((size_t)n * sizeof *pp);
    uint64_t want = 0, placed = 0;
    for (int i = 0; i < n; i++) {
        ts[i] = host[i];
        pp[i] = &ts[i];
        want += host[i].data ? (uint64_t)host[i].ne1 * host[i].row_bytes : 0;
    }
    CHECK_MSG(b->be->ops->place_weights(b->be, pp, n, NULL, &placed) == 0, "%s: place_weights", b->name);
    CHECK_MSG(placed >= want, "%s: %llu bytes placed for %llu", b->name, (unsigned long long)placed,
              (unsigned long long)want);
    free(pp);
    return ts;
}

/* An f32 vector tensor (1, n) with host data (owned by the caller). */
static struct tensor vec_tensor(const float *data, int n) {
    return (struct tensor){ .type = DTYPE_F32, .ne0 = n, .ne1 = 1, .row_bytes = (size_t)n * 4, .data = data };
}

/* The SIMD bounds of the integer-activation backends (< 0: tol_simd), set
 * around judge() for the matmuls they compute on integer activations. */
static double g_tol_act_int = -1, g_tol_act_q8 = -1;
/* The bound of a device's tensor-core arithmetic for the case being judged (< 0: none): the CUDA
 * backend's fast mode (8-bit activations) takes cuBLAS and the prefill attention kernel at large
 * steps (cuda_plan.h) and is held to it vs scalar and vs the references alike. */
static double g_tol_dev_q8 = -1;
static bool fast_device(int i) { return g_be[i].device && !strcmp(g_be[i].act, "q8"); }
static double dev_tol(int i) { return fast_device(i) ? g_tol_dev_q8 : -1; }

/* Record case outputs outs[b] (n floats each) of op: each against the scalar
 * backend's (outs[0]), its twin's, and ref (double, NULL: none) within
 * tol_ref. */
/* judge, where a device backend computes in arithmetic of its own (ref_dev
 * non-NULL): it is held to ref_dev with tol_ref, not to the scalar set. */
static void judge_dev(enum op op, float *const *outs, size_t n, const double *ref, const double *ref_dev,
                      double tol_simd, double tol_ref, const char *desc) {
    for (int i = 0; i < g_nbe; i++) {
        struct stat_ *s = &g_st[i][op];
        s->cases++;
        const double td = dev_tol(i);
        if (td >= 0) {   /* a device's tensor-core path: its own bound against everything */
            /* against the scalar set only where both compute the same thing: with ref_dev the CPU
             * sets round an input the device takes as it is (the query of int8 K), and the
             * scalar output carries that rounding (~7e-3), not the device's */
            const double e = rel_err_floor(outs[i], outs[0], n, g_den_floor);
            CHECK_MSG(ref_dev || e <= td, "%s %s (tensor cores) vs scalar: rel err %.3g > %.3g", g_be[i].name, desc,
                      e, td);
            s->vs_scalar = dmax(s->vs_scalar, e);
            const double *r = ref_dev ? ref_dev : ref;
            if (r) {
                const double er = rel_err_floor(outs[i], r, n, g_den_floor);
                CHECK_MSG(er <= td, "%s %s (tensor cores) vs double reference: rel err %.3g > %.3g", g_be[i].name,
                          desc, er, td);
                s->vs_ref = dmax(s->vs_ref, er);
            }
            continue;
        }
        if (g_be[i].device && ref_dev) {
            const double er = rel_err_floor(outs[i], ref_dev, n, g_den_floor);
            CHECK_MSG(er <= tol_ref, "%s %s vs its double reference: rel err %.3g > %.3g", g_be[i].name, desc, er,
                      tol_ref);
            s->vs_ref = dmax(s->vs_ref, er);
            continue;
        }
        const double e = rel_err_floor(outs[i], outs[0], n, g_den_floor);
        const double tol = !g_be[i].simd                                          ? 0
                           : !strcmp(g_be[i].act, "int") && g_tol_act_int >= 0 ? g_tol_act_int
                           : !strcmp(g_be[i].act, "q8") && g_tol_act_q8 >= 0   ? g_tol_act_q8
                                                                               : tol_simd;
        CHECK_MSG(e <= tol, "%s %s vs scalar: rel err %.3g > %.3g", g_be[i].name, desc, e, tol);
        s->vs_scalar = dmax(s->vs_scalar, e);
        if (g_be[i].twin >= 0)
            CHECK_MSG(memcmp(outs[i], outs[g_be[i].twin], n * sizeof(float)) == 0, "%s %s: differs from %s",
                      g_be[i].name, desc, g_be[g_be[i].twin].name);
        if (ref) {
            const double er = rel_err_floor(outs[i], ref, n, g_den_floor);
            CHECK_MSG(er <= tol_ref, "%s %s vs double reference: rel err %.3g > %.3g", g_be[i].name, desc, er,
                      tol_ref);
            s->vs_ref = dmax(s->vs_ref, er);
        }
    }
}

static void judge(enum op op, float *const *outs, size_t n, const double *ref, double tol_simd, double tol_ref,
                  const char *desc) {
    judge_dev(op, outs, n, ref, NULL, tol_simd, tol_ref, desc);
}

/* ---- matmul and get_rows: every weight type the loader accepts ---- */

static const uint32_t k_wtypes[] = { DTYPE_F32,  DTYPE_F16,  DTYPE_BF16, DTYPE_Q8_0,   DTYPE_Q4_0,   DTYPE_Q4_1,
                                     DTYPE_Q5_0, DTYPE_Q5_1, DTYPE_Q2_K, DTYPE_Q3_K,   DTYPE_Q4_K,   DTYPE_Q5_K,
                                     DTYPE_Q6_K, DTYPE_IQ4_NL, DTYPE_IQ4_XS, DTYPE_MXFP4 };
#define N_WTYPES ((int)(sizeof k_wtypes / sizeof *k_wtypes))

static int selected_wtypes(uint32_t *out) {
    int n = 0;
    for (int i = 0; i < N_WTYPES; i++)
        if (listed("KVLLM_TEST_WTYPES", dtype_name(k_wtypes[i]))) out[n++] = k_wtypes[i];
    return n;
}

/* A row length for type: float types any (mostly not a multiple of 8),
 * blocks 1..12 of 32, super-blocks 1..3 of 256. */
static int64_t rand_K(uint32_t type) {
    const int be = dtype_block_elems(type);
    if (be == 1) {
        int64_t K = rnd_in(1, 300);
        return K % 8 == 0 && rnd(4) ? K + 1 + rnd(7) : K;
    }
    return (int64_t)be * (be == 32 ? rnd_in(1, 12) : rnd_in(1, 3));
}

/* A random (M, K) weight of type; data malloc'd (the caller frees it). */
static struct tensor rand_weight(uint32_t type, int64_t K, int64_t M) {
    uint64_t rb = 0;
    KV_ASSERT(dtype_row_bytes(type, (uint64_t)K, &rb));
    float *row = tu_xnew((size_t)K * sizeof *row);
    uint8_t *data = tu_xnew((size_t)rb * (size_t)M);
    const float amp = ldexpf(1, rnd_in(-4, 3));
    for (int64_t r = 0; r < M; r++) {
        for (int64_t k = 0; k < K; k++) row[k] = urand() * amp;
        dtype_from_f32(type, row, data + (size_t)r * rb, K);
    }
    free(row);
    return (struct tensor){ .type = type, .ne0 = K, .ne1 = M, .row_bytes = (size_t)rb, .data = data };
}

#define N_MM_PER_TYPE 24

/* Error bounds of y = x · wᵀ (n tokens) relative to ‖y‖ (y: the scalar
 * result), from each dot product's own: *r_abs = ‖e‖ / ‖y‖ with e = 2 K
 * 2^-24 |W||x| (f32 sums in any order, two kernels); *r_int = the same plus
 * the integer path's activation rounding, half a step of amax / 4095 per
 * block of 32 times Σ|w| over the block; *r_q8 = the same for 8-bit codes,
 * half a step of amax / 127 per block of 32 (K-quants: 256, qmm_k.c). */
static void matmul_bounds(const struct tensor *w, const float *x, int n, const float *y, double *r_abs,
                          double *r_int, double *r_q8) {
    const int64_t K = w->ne0, M = w->ne1;
    float *wr = tu_xnew((size_t)K * sizeof *wr);
    double e_abs = 0, e_int = 0, e_q8 = 0, y2 = 0;
    const int64_t qb = qmm_act_k(w->type) ? QMM_QK : QMM_BLK;
    for (int64_t r = 0; r < M; r++) {
        dtype_to_f32(w->type, tensor_row(w, r), wr, K);
        for (int t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * K;
            double a = 0, q = 0, q8 = 0;
            for (int64_t k0 = 0; k0 < K; k0 += 32) {
                double amax = 0, sw = 0;
                for (int64_t k = k0; k < k0 + 32 && k < K; k++) {
                    a += fabs((double)wr[k] * xt[k]);
                    amax = dmax(amax, fabs(xt[k]));
                    sw += fabs(wr[k]);
                }
                q += sw * amax / 4095 / 2;
            }
            for (int64_t k0 = 0; k0 < K; k0 += qb) {
                double amax = 0, sw = 0;
                for (int64_t k = k0; k < k0 + qb && k < K; k++) {
                    amax = dmax(amax, fabs(xt[k]));
                    sw += fabs(wr[k]);
                }
                q8 += sw * amax / 127 / 2;
            }
            const double yv = y[(size_t)t * M + r], ea = 2 * (double)K * 0x1p-24 * a;
            e_abs += ea * ea;
            e_int += (ea + q) * (ea + q);
            e_q8 += (ea + q8) * (ea + q8);
            y2 += yv * yv;
        }
    }
    free(wr);
    *r_abs = y2 > 0 ? sqrt(e_abs / y2) : INFINITY;
    *r_int = y2 > 0 ? sqrt(e_int / y2) : INFINITY;
    *r_q8 = y2 > 0 ? sqrt(e_q8 / y2) : INFINITY;
}

/* The large matmuls (K, M, tokens): each weight type gets one, in turn from a random start. */
static const struct { int64_t K, M; int n; } k_large_mm[] = {
    { 4096, 14336, 1 }, { 4096, 14336, 65 }, { 14336, 4096, 130 }, { 3584, 18944, 1 }, { 4096, 128256, 1 },
};
#define N_LARGE_MM ((int)(sizeof k_large_mm / sizeof *k_large_mm))

/* Fixed cases for the CUDA 8-bit path's types (every quantized type; matmul_q8.cu: a block per row and tile of 8 tokens,
 * 128 threads each taking blocks of 32 or super-blocks of 256 in turn): 1, 2, 9 and 65 tokens (one
 * token, a part tile, a full tile and one more, 8 full tiles and one more), each at a short row (fewer
 * blocks than threads) and a long one whose blocks are no multiple of what the 128 threads take per
 * step (4,256 = 133 blocks of 32; 4,864 = 19 super-blocks, 16 per step, or IQ4_XS's 152 sub-blocks).
 * On every backend, tokens 0, n / 2 and n - 1 computed alone must give the batch's bytes (batch
 * invariance: the hard rule the tile of 8 must keep). */
static bool q8_gpu_type(uint32_t t) { return t != DTYPE_F32 && t != DTYPE_F16 && t != DTYPE_BF16; }
static const int k_fixed_mm_tokens[] = { 1, 2, 9, 65 };
#define N_FIXED_MM (2 * (int)(sizeof k_fixed_mm_tokens / sizeof *k_fixed_mm_tokens))

static void test_matmul(void) {
    uint32_t types[N_WTYPES];
    const int nt = selected_wtypes(types), first = rnd(N_LARGE_MM);
    int n_q8 = 0;
    for (int i = 0; i < nt; i++) n_q8 += q8_gpu_type(types[i]);
    const int n_rand = g_large ? nt : nt * CASES(N_MM_PER_TYPE), nc = n_rand + (g_large ? 0 : n_q8 * N_FIXED_MM);
    if (nc == 0) return;
    struct tensor *w = tu_xnew((size_t)nc * sizeof *w), *placed[MAX_BE];
    int *ns = tu_xnew((size_t)nc * sizeof *ns);
    for (int i = n_rand, ti = 0; i < nc; ti++) {
        if (!q8_gpu_type(types[ti])) continue;
        const int be = dtype_block_elems(types[ti]);
        for (int f = 0; f < N_FIXED_MM; f++, i++) {
            const int64_t K = f % 2 == 0 ? be * rnd_in(1, 3) : be == 32 ? 4256 : 4864;
            w[i] = rand_weight(types[ti], K, f % 2 == 0 ? rnd_in(1, 37) : rnd_in(2, 9));   /* long rows: few */
            ns[i] = k_fixed_mm_tokens[f / 2];
        }
    }
    for (int i = 0; i < n_rand; i++) {
        const uint32_t type = types[i % nt];
        if (g_large) {
            const int k = (first + i) % N_LARGE_MM;
            w[i] = rand_weight(type, k_large_mm[k].K, k_large_mm[k].M);
            ns[i] = k_large_mm[k].n;
            continue;
        }
        w[i] = rand_weight(type, rand_K(type), rnd(8) ? rnd_in(1, 67) : rnd_in(1, 4));
        ns[i] = rnd(4) ? rnd_in(1, MAX_TOKENS) : rnd_in(1, 3);
    }
    for (int b = 0; b < g_nbe; b++) placed[b] = place(&g_be[b], w, nc);
    for (int i = 0; i < nc; i++) {
        const int64_t K = w[i].ne0, M = w[i].ne1;
        const int n = ns[i];
        float *x = tu_xnew((size_t)n * (size_t)K * sizeof *x), *outs[MAX_BE];
        for (int64_t e = 0; e < n * K; e++) x[e] = gauss();
        char desc[128];
        snprintf(desc, sizeof desc, "matmul %s K=%lld M=%lld n=%d", dtype_name(w[i].type), (long long)K,
                 (long long)M, n);
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            outs[b] = tu_xnew((size_t)n * (size_t)M * sizeof(float));
            struct backend_buf bx = buf_up(t, x, (size_t)n * (size_t)K * 4), by = buf_up(t, NULL, (size_t)n * (size_t)M * 4);
            int rc = BE_OP(t->c, matmul, by.data, &placed[b][i], bx.data, n);
            buf_down(t, outs[b], &by, (size_t)n * (size_t)M * 4);
            sync_ok(t, rc, desc);
            /* batch invariance (the fixed cases): tokens 0, n / 2 and n - 1 alone give the batch's bytes;
             * not where a device takes cuBLAS for n tokens and its mat-vec path alone (docs/GPU.md) */
            const bool gemm =
                fast_device(b) && cuda_gemm_pick(w[i].type, w[i].flags, true, true, n) != CUDA_GEMM_NONE;
            for (int k = 0; i >= n_rand && n > 1 && !gemm && k < 3; k++) {
                const int tk = k == 0 ? 0 : k == 1 ? n / 2 : n - 1;
                float *one = tu_xnew((size_t)M * sizeof *one);
                struct backend_buf b1 = buf_up(t, NULL, (size_t)M * 4);
                rc = BE_OP(t->c, matmul, b1.data, &placed[b][i], (const float *)bx.data + (size_t)tk * (size_t)K, 1);
                buf_down(t, one, &b1, (size_t)M * 4);
                sync_ok(t, rc, desc);
                CHECK_MSG(memcmp(one, outs[b] + (size_t)tk * (size_t)M, (size_t)M * 4) == 0,
                          "%s %s: token %d alone differs from the batch", t->name, desc, tk);
                buf_drop(t, &b1);
                free(one);
            }
            buf_drop(t, &bx);
            buf_drop(t, &by);
        }
        /* a few outputs: one near-zero dot product can dominate the norm, so
         * the bounds also admit the dot products' own error bounds */
        const bool few = n * M < 8, ia = cpu_matmul_int_supports(w[i].type, K), iq = qmm_supports(w[i].type, K);
        double r_abs, r_int, r_q8;
        matmul_bounds(&w[i], x, n, outs[0], &r_abs, &r_int, &r_q8);
        double tol = few ? dmax(MATMUL_SIMD_FEW, r_abs) : k_tol[OP_MATMUL].simd;
        if (ia) g_tol_act_int = dmax(few ? MATMUL_INT_FEW : MATMUL_INT, r_int);   /* never flaky: a bound */
        if (iq) g_tol_act_q8 = r_q8;   /* the bound itself: a wrong scale or code exceeds it by far */
        const enum cuda_gemm gk = cuda_gemm_pick(w[i].type, w[i].flags, true, true, n);
        if (gk != CUDA_GEMM_NONE)
            g_tol_dev_q8 = dmax(gk == CUDA_GEMM_BF16 ? CUDA_GEMM_TOL_BF16 : CUDA_GEMM_TOL_F16, iq ? r_q8 : 0);
        judge(OP_MATMUL, outs, (size_t)n * (size_t)M, NULL, tol, 0, desc);
        g_tol_act_int = g_tol_act_q8 = g_tol_dev_q8 = -1;
        for (int b = 0; b < g_nbe; b++) free(outs[b]);
        free(x);
    }
    for (int b = 0; b < g_nbe; b++) free(placed[b]);
    for (int i = 0; i < nc; i++) free((void *)w[i].data);
    free(w);
    free(ns);
}

#define N_GR_PER_TYPE 10

static void test_get_rows(void) {
    uint32_t types[N_WTYPES];
    const int nt = selected_wtypes(types), nc = g_large ? nt : nt * CASES(N_GR_PER_TYPE);
    if (nc == 0) return;
    struct tensor *w = tu_xnew((size_t)nc * sizeof *w), *placed[MAX_BE];
    for (int i = 0; i < nc; i++) {
        const uint32_t type = types[i % nt];
        /* large: 8,192 rows, not a whole vocabulary, to keep every table in memory at once and make
         * them quickly (the vocabulary-sized matmul reaches rows past 2 GiB) */
        w[i] = g_large ? rand_weight(type, PICK(k_large_dims), 8192) : rand_weight(type, rand_K(type), rnd_in(1, 50));
    }
    for (int b = 0; b < g_nbe; b++) placed[b] = place(&g_be[b], w, nc);
    for (int i = 0; i < nc; i++) {
        const int64_t K = w[i].ne0, M = w[i].ne1;
        const int n = draw_tokens();
        int32_t *ids = tu_xnew((size_t)n * sizeof *ids);
        for (int t = 0; t < n; t++) ids[t] = rnd((int)M);
        float *row = tu_xnew((size_t)K * sizeof *row), *outs[MAX_BE];
        double *ref = tu_xnew((size_t)n * (size_t)K * sizeof *ref);
        for (int t = 0; t < n; t++) {
            dtype_to_f32(w[i].type, tensor_row(&w[i], ids[t]), row, K);
            for (int64_t e = 0; e < K; e++) ref[(size_t)t * K + e] = row[e];
        }
        char desc[128];
        snprintf(desc, sizeof desc, "get_rows %s K=%lld M=%lld n=%d", dtype_name(w[i].type), (long long)K,
                 (long long)M, n);
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            outs[b] = tu_xnew((size_t)n * (size_t)K * sizeof(float));
            struct backend_buf bi = buf_up(t, ids, (size_t)n * 4), by = buf_up(t, NULL, (size_t)n * (size_t)K * 4);
            int rc = BE_OP(t->c, get_rows, by.data, &placed[b][i], bi.data, n);
            buf_down(t, outs[b], &by, (size_t)n * (size_t)K * 4);
            sync_ok(t, rc, desc);
            buf_drop(t, &bi);
            buf_drop(t, &by);
        }
        judge(OP_GET_ROWS, outs, (size_t)n * (size_t)K, ref, k_tol[OP_GET_ROWS].simd, k_tol[OP_GET_ROWS].ref, desc);
        for (int b = 0; b < g_nbe; b++) free(outs[b]);
        free(ids);
        free(row);
        free(ref);
    }
    /* a row out of range: KVLLM_ERANGE, kept until backend_sync */
    fprintf(stderr, "(the next get_rows errors are expected)\n");
    for (int b = 0; b < g_nbe; b++) {
        struct tbe *t = &g_be[b];
        const int32_t bad[2][2] = { { 0, (int32_t)w[0].ne1 }, { -1, 0 } };
        for (int k = 0; k < 2; k++) {
            struct backend_buf bi = buf_up(t, bad[k], sizeof bad[k]), by = buf_up(t, NULL, 2 * (size_t)w[0].ne0 * 4);
            int rc = BE_OP(t->c, get_rows, by.data, &placed[b][0], bi.data, 2);
            int rs = backend_sync(t->c);
            CHECK_MSG((rc == KVLLM_ERANGE || (t->device && rc == 0)) && rs == KVLLM_ERANGE, "%s get_rows of row %d of %lld: returned %d, sync %d",
                      t->name, bad[k][1 - k], (long long)w[0].ne1, rc, rs);
            CHECK(t->c->status == 0);
            buf_drop(t, &bi);
            buf_drop(t, &by);
        }
    }
    for (int b = 0; b < g_nbe; b++) free(placed[b]);
    for (int i = 0; i < nc; i++) free((void *)w[i].data);
    free(w);
}

/* ---- row-wise and elementwise ops ---- */

static void test_gather_rows(int nc) {
    for (int i = 0; i < nc; i++) {
        const int dim = rnd_in(1, 300), m = rnd_in(1, 50), n = rnd_in(1, MAX_TOKENS);
        float *x = tu_xnew((size_t)m * dim * sizeof *x), *outs[MAX_BE];
        int32_t *ids = tu_xnew((size_t)n * sizeof *ids);
        double *ref = tu_xnew((size_t)n * dim * sizeof *ref);
        for (long e = 0; e < (long)m * dim; e++) x[e] = gauss();
        for (int t = 0; t < n; t++) {
            ids[t] = rnd(m);
            for (int e = 0; e < dim; e++) ref[(size_t)t * dim + e] = x[(size_t)ids[t] * dim + e];
        }
        char desc[96];
        snprintf(desc, sizeof desc, "gather_rows dim=%d rows=%d n=%d", dim, m, n);
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            outs[b] = tu_xnew((size_t)n * dim * sizeof(float));
            struct backend_buf bx = buf_up(t, x, (size_t)m * dim * 4), bi = buf_up(t, ids, (size_t)n * 4),
                               by = buf_up(t, NULL, (size_t)n * dim * 4);
            int rc = BE_OP(t->c, gather_rows, by.data, bx.data, bi.data, n, dim);
            buf_down(t, outs[b], &by, (size_t)n * dim * 4);
            sync_ok(t, rc, desc);
            buf_drop(t, &bx);
            buf_drop(t, &bi);
            buf_drop(t, &by);
        }
        judge(OP_GATHER_ROWS, outs, (size_t)n * dim, ref, k_tol[OP_GATHER_ROWS].simd, k_tol[OP_GATHER_ROWS].ref, desc);
        for (int b = 0; b < g_nbe; b++) free(outs[b]);
        free(x);
        free(ids);
        free(ref);
    }
}

/* The sampling stage's greedy token: ids compared exactly (as floats, so
 * judge reports them with the other ops). */
static void test_argmax(int nc) {
    for (int i = 0; i < nc; i++) {
        const int dim = g_large ? PICK(k_large_vocab) : rnd(8) ? rnd_in(1, 300) : rnd_in(1000, 50000);
        const int n = draw_tokens();
        const int mode = rnd(4);   /* 0 plain, 1 ties, 2 specials sprinkled, 3 some rows without a finite value */
        float *x = tu_xnew((size_t)n * dim * sizeof *x), *outs[MAX_BE];
        double *ref = tu_xnew((size_t)n * sizeof *ref);
        for (int t = 0; t < n; t++) {
            float *r = x + (size_t)t * dim;
            const bool empty = mode == 3 && rnd(2);
            for (int e = 0; e < dim; e++) {
                float v = mode == 1 ? (float)(int)(gauss() * 2) : gauss() * 5;
                if (mode >= 2 && !rnd(7)) v = rnd(3) == 0 ? NAN : rnd(2) ? -INFINITY : (mode == 2 && !rnd(4) ? INFINITY : -INFINITY);
                r[e] = empty ? (rnd(2) ? NAN : -INFINITY) : v;
            }
            int best = -1;   /* the math: largest non-NaN value, lowest index; -inf never wins */
            for (int e = 0; e < dim; e++)
                if (!isnan(r[e]) && r[e] != -INFINITY && (best < 0 || r[e] > r[best])) best = e;
            ref[t] = best;
        }
        char desc[96];
        snprintf(desc, sizeof desc, "argmax dim=%d n=%d mode=%d", dim, n, mode);
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            int32_t *ids = tu_xnew((size_t)n * sizeof *ids);
            outs[b] = tu_xnew((size_t)n * sizeof(float));
            struct backend_buf bx = buf_up(t, x, (size_t)n * dim * 4), bi = buf_up(t, NULL, (size_t)n * 4);
            int rc = BE_OP(t->c, argmax, bi.data, bx.data, n, dim);
            buf_down(t, ids, &bi, (size_t)n * 4);
            sync_ok(t, rc, desc);
            for (int r = 0; r < n; r++) outs[b][r] = (float)ids[r];
            free(ids);
            buf_drop(t, &bx);
            buf_drop(t, &bi);
        }
        judge(OP_ARGMAX, outs, (size_t)n, ref, 0, 0, desc);
        for (int b = 0; b < g_nbe; b++) free(outs[b]);
        free(x);
        free(ref);
    }
}

/* ---- sample: the chain from the math ---- */

struct ref_cand {
    float l;
    int32_t id;
};

/* the total order: higher logit, then lower id */
static int ref_cand_cmp(const void *pa, const void *pb) {
    const struct ref_cand *a = pa, *b = pb;
    if (a->l != b->l) return a->l > b->l ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static double dmin(double a, double b) { return a < b ? a : b; }

/* The token chain.h's chain picks from row x (dim) under p, by the book:
 * sort everything with qsort where the chain would have sorted.  *near:
 * how close the closest decision came to its threshold (the table). */
static int32_t ref_sample(const float *x, int dim, const struct sample_chain *p, double *near) {
    struct ref_cand *c = tu_xnew((size_t)dim * sizeof *c);
    float *w = tu_xnew((size_t)dim * sizeof *w);
    int n = 0, pick = -1;
    *near = INFINITY;
    for (int i = 0; i < dim; i++)
        if (!isnan(x[i]) && x[i] != -INFINITY) c[n++] = (struct ref_cand){ x[i] == INFINITY ? FLT_MAX : x[i], i };
    float lmax = -INFINITY;
    for (int i = 0; i < n; i++) lmax = c[i].l > lmax ? c[i].l : lmax;
    if (n && !(p->temperature > 0)) {   /* greedy: the first of the largest, in id order */
        pick = 0;
        for (int i = 1; i < n; i++) pick = c[i].l > c[pick].l ? i : pick;
    } else if (n) {
        bool sorted = false;   /* else c is in id order, and so is the draw's walk */
        if (p->top_k > 0 && p->top_k < n) {
            qsort(c, (size_t)n, sizeof *c, ref_cand_cmp);
            n = p->top_k;
            sorted = true;
        }
        if (p->top_p < 1 && n > 1) {   /* the shortest sorted prefix holding top_p of the mass */
            double z = 0, cum = 0;
            for (int i = 0; i < n; i++) z += expf(c[i].l - lmax);
            if (!sorted) qsort(c, (size_t)n, sizeof *c, ref_cand_cmp);
            sorted = true;
            const double target = (double)p->top_p * z;
            for (int i = 0; i < n; i++) {
                const double prev = cum;
                cum += expf(c[i].l - lmax);
                if (cum >= target) {
                    *near = dmin(*near, dmin(cum - target, target - prev) / z);
                    n = i + 1;
                    break;
                }
            }
        }
        if (p->min_p > 0 && n > 1) {   /* p_i >= min_p p_max */
            int m = 0;
            for (int i = 0; i < n; i++) {
                const float r = expf(c[i].l - lmax);
                *near = dmin(*near, fabs((double)r - p->min_p));
                if (r >= p->min_p) c[m++] = c[i];
            }
            n = m;
        }
        double z = 0, cum = 0;
        for (int i = 0; i < n; i++) z += w[i] = expf((c[i].l - lmax) / p->temperature);
        const double r = (double)p->u * z;
        for (int i = 0; i < n && pick < 0; i++) {
            if (w[i] <= 0) continue;
            const double prev = cum;
            cum += w[i];
            if (cum > r) {
                pick = i;
                *near = dmin(*near, dmin(r - prev, cum - r) / z);
            }
        }
        for (int i = n - 1; pick < 0 && i >= 0; i--) pick = w[i] > 0 ? i : -1;   /* rounding: the last weighed */
    }
    const int32_t id = pick >= 0 ? c[pick].id : -1;
    free(c);
    free(w);
    return id;
}

/* A random chain: greedy now and then, every truncation on or off, the extremes. */
static struct sample_chain rand_chain(int dim) {
    static const float temps[] = { 0, 1e-30f, 1e-3f, 0.3f, 0.8f, 1, 1.5f, 100 };
    static const float tops[] = { 1, 1e-6f, 0.5f, 0.9f, 0.95f };
    static const float mins[] = { 0, 0.05f, 0.2f, 1 };
    struct sample_chain p = { .temperature = PICK(temps), .top_p = PICK(tops), .min_p = PICK(mins) };
    const int k = rnd(4);
    p.top_k = k == 0 ? 0 : k == 1 ? 1 : k == 2 ? rnd_in(1, dim) : dim + rnd_in(0, 5);
    const int u = rnd(8);
    p.u = u == 0 ? 0 : u == 1 ? 0x1.fffffep-1f : (urand() + 1) / 2 * 0x1.fffffep-1f;
    if (rnd(3) == 0) p.top_k = 0, p.top_p = 1;   /* min-p alone or nothing: the draw walks ids in order */
    return p;
}

/* The sampling stage's draw: ids against the reference, exactly on the CPU. */
static void test_sample(int nc) {
    for (int i = 0; i < nc; i++) {
        const int dim = g_large ? PICK(k_large_vocab) : rnd(8) ? rnd_in(1, 300) : rnd_in(1000, 50000);
        const int n = draw_tokens();
        const int mode = rnd(4);   /* 0 plain, 1 ties, 2 specials sprinkled, 3 some rows without a valid value */
        float *x = tu_xnew((size_t)n * dim * sizeof *x), *outs[MAX_BE];
        struct sample_chain *rows = tu_xnew((size_t)n * sizeof *rows);
        double *ref = tu_xnew((size_t)n * sizeof *ref), *near = tu_xnew((size_t)n * sizeof *near);
        const float amp = ldexpf(1, rnd_in(-3, 3));
        for (int t = 0; t < n; t++) {
            float *r = x + (size_t)t * dim;
            const bool empty = mode == 3 && rnd(2);
            for (int e = 0; e < dim; e++) {
                float v = mode == 1 ? (float)(int)(gauss() * 2) : gauss() * amp;
                if (mode >= 2 && !rnd(7)) v = rnd(3) == 0 ? NAN : rnd(2) ? -INFINITY : (mode == 2 && !rnd(4) ? INFINITY : -INFINITY);
                r[e] = empty ? (rnd(2) ? NAN : -INFINITY) : v;
            }
            rows[t] = rand_chain(dim);
            ref[t] = ref_sample(r, dim, &rows[t], &near[t]);
        }
        char desc[96];
        snprintf(desc, sizeof desc, "sample dim=%d n=%d mode=%d", dim, n, mode);
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            outs[b] = NULL;
            if (!backend_supports(t->be, BACKEND_OP_SAMPLE, 0)) continue;   /* optional: sampled on the host */
            int32_t *ids = tu_xnew((size_t)n * sizeof *ids);
            outs[b] = tu_xnew((size_t)n * sizeof(float));
            struct backend_buf bx = buf_up(t, x, (size_t)n * dim * 4), bi = buf_up(t, NULL, (size_t)n * 4),
                               br = buf_up(t, rows, (size_t)n * sizeof *rows),
                               bs = buf_up(t, NULL, SAMPLE_CHAIN_SCRATCH(dim));
            const struct sample_args a = { .n = n, .dim = dim, .logits = bx.data, .rows = br.data, .ids = bi.data,
                                           .scratch = bs.data };
            int rc = BE_OP(t->c, sample, &a);
            buf_down(t, ids, &bi, (size_t)n * 4);
            sync_ok(t, rc, desc);
            struct stat_ *s = &g_st[b][OP_SAMPLE];
            s->cases++;
            int off = 0;
            for (int r = 0; r < n; r++) {
                outs[b][r] = (float)ids[r];
                if (ids[r] == (int32_t)ref[r]) continue;
                off++;
                CHECK_MSG(t->device && near[r] <= SAMPLE_NEAR_TIE,
                          "%s %s row %d (T %g, top_k %d, top_p %g, min_p %g, u %.9g): token %d, the reference's "
                          "%d (closest decision %.3g from its threshold)", t->name, desc, r,
                          (double)rows[r].temperature, rows[r].top_k, (double)rows[r].top_p,
                          (double)rows[r].min_p, (double)rows[r].u, ids[r], (int)ref[r], near[r]);
            }
            s->vs_ref = dmax(s->vs_ref, (double)off / n);   /* the share of rows that differ */
            if (t->twin >= 0 && outs[t->twin])
                CHECK_MSG(memcmp(outs[b], outs[t->twin], (size_t)n * sizeof(float)) == 0, "%s %s: differs from %s",
                          t->name, desc, g_be[t->twin].name);
            free(ids);
            buf_drop(t, &bx);
            buf_drop(t, &bi);
            buf_drop(t, &br);
            buf_drop(t, &bs);
        }
        for (int b = 0; b < g_nbe; b++) free(outs[b]);
        free(x);
        free(rows);
        free(ref);
        free(near);
    }
}

/* rmsnorm (layer = false) or layernorm (with or without a bias) of nc cases. */
static void test_norm(bool layer, int nc) {
    const enum op op = layer ? OP_LAYERNORM : OP_RMSNORM;
    struct { int n, dim; float eps; bool bias; float *x, *w, *bv; } *cs = tu_xnew((size_t)nc * sizeof *cs);
    struct tensor *host = tu_xnew((size_t)nc * 2 * sizeof *host), *placed[MAX_BE];
    for (int i = 0; i < nc; i++) {
        cs[i].n = draw_tokens();
        cs[i].dim = g_large ? PICK(k_large_dims) : rnd(6) ? rnd_in(1, 300) : rnd_in(1, 8);
        cs[i].eps = rnd(2) ? 1e-5f : 1e-6f;
        cs[i].bias = layer && rnd(3);
        const int n = cs[i].n, dim = cs[i].dim;
        cs[i].x = tu_xnew((size_t)n * dim * sizeof(float));
        cs[i].w = tu_xnew((size_t)dim * sizeof(float));
        cs[i].bv = tu_xnew((size_t)dim * sizeof(float));
        const float amp = ldexpf(1, rnd_in(-6, 6)), off = layer ? urand() * 3 * amp : 0;
        for (long e = 0; e < (long)n * dim; e++) cs[i].x[e] = gauss() * amp + off;
        for (int e = 0; e < dim; e++) { cs[i].w[e] = 1 + 0.2f * gauss(); cs[i].bv[e] = 0.1f * gauss(); }
        host[2 * i] = vec_tensor(cs[i].w, dim);
        host[2 * i + 1] = vec_tensor(cs[i].bias ? cs[i].bv : NULL, dim);   /* data NULL: skipped */
    }
    for (int b = 0; b < g_nbe; b++) placed[b] = place(&g_be[b], host, 2 * nc);
    for (int i = 0; i < nc; i++) {
        const int n = cs[i].n, dim = cs[i].dim;
        double *ref = tu_xnew((size_t)n * dim * sizeof *ref), cond = 0;   /* max |mean| / sqrt(var + eps) */
        for (int t = 0; t < n; t++) {
            const float *x = cs[i].x + (size_t)t * dim;
            double mean = 0, ss = 0;
            if (layer) {
                for (int e = 0; e < dim; e++) mean += x[e];
                mean /= dim;
            }
            for (int e = 0; e < dim; e++) ss += ((double)x[e] - mean) * ((double)x[e] - mean);
            const double s = 1 / sqrt(ss / dim + (double)cs[i].eps);
            cond = dmax(cond, fabs(mean) * s);
            for (int e = 0; e < dim; e++)
                ref[(size_t)t * dim + e] = ((double)x[e] - mean) * s * cs[i].w[e] + (cs[i].bias ? cs[i].bv[e] : 0.0);
        }
        char desc[128];
        snprintf(desc, sizeof desc, "%s n=%d dim=%d eps=%g%s", k_tol[op].name, n, dim, cs[i].eps,
                 layer ? (cs[i].bias ? " bias" : " no bias") : "");
        if (layer) snprintf(desc + strlen(desc), sizeof desc - strlen(desc), " max|mean|/std=%.3g", cond);
        float *outs[MAX_BE];
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            outs[b] = tu_xnew((size_t)n * dim * sizeof(float));
            struct backend_buf bx = buf_up(t, cs[i].x, (size_t)n * dim * 4), by = buf_up(t, NULL, (size_t)n * dim * 4);
            const struct tensor *w = &placed[b][2 * i], *bt = cs[i].bias ? &placed[b][2 * i + 1] : NULL;
            int rc = layer ? BE_OP(t->c, layernorm, by.data, bx.data, w, bt, n, dim, cs[i].eps)
                           : BE_OP(t->c, rmsnorm, by.data, bx.data, w, n, dim, cs[i].eps);
            buf_down(t, outs[b], &by, (size_t)n * dim * 4);
            sync_ok(t, rc, desc);
            buf_drop(t, &bx);
            buf_drop(t, &by);
        }
        const double c = layer ? 8 * sqrt((double)dim) * 0x1p-24 * (1 + cond) : 0;
        judge(op, outs, (size_t)n * dim, ref, k_tol[op].simd + c, k_tol[op].ref + c, desc);
        for (int b = 0; b < g_nbe; b++) free(outs[b]);
        free(ref);
    }
    for (int b = 0; b < g_nbe; b++) free(placed[b]);
    for (int i = 0; i < nc; i++) { free(cs[i].x); free(cs[i].w); free(cs[i].bv); }
    free(cs);
    free(host);
}

static void test_rope(int nc) {
    static const float thetas[] = { 10000.0f, 500000.0f, 1000000.0f };
    static const float fscales[] = { 0.0f, 1.0f, 0.25f, 0.5f, 0.125f };
    struct { int n, n_head, hd, n_rot; struct rope_params p; float *x, *ff; int32_t *pos; } *cs =
        tu_xnew((size_t)nc * sizeof *cs);
    struct tensor *host = tu_xnew((size_t)nc * sizeof *host), *placed[MAX_BE];
    for (int i = 0; i < nc; i++) {
        cs[i].n = draw_tokens();
        cs[i].n_head = g_large ? 28 + 4 * rnd(2) : rnd_in(1, 8);
        cs[i].hd = g_large ? 128 : rnd(4) ? 2 * rnd_in(4, 64) : rnd_in(3, 128);          /* sometimes odd */
        cs[i].n_rot = rnd(3) ? cs[i].hd / 2 * 2 : 2 * rnd_in(1, cs[i].hd / 2);   /* partial rotation */
        const int n = cs[i].n, w = cs[i].n_head * cs[i].hd, half = cs[i].n_rot / 2;
        cs[i].x = tu_xnew((size_t)n * w * sizeof(float));
        cs[i].pos = tu_xnew((size_t)n * sizeof(int32_t));
        cs[i].ff = tu_xnew((size_t)half * sizeof(float));
        for (long e = 0; e < (long)n * w; e++) cs[i].x[e] = gauss();
        const int maxpos = rnd(4) ? 4096 : 131072;
        for (int t = 0; t < n; t++) cs[i].pos[t] = rnd(maxpos);
        const bool has_ff = rnd(3) == 0;
        for (int e = 0; e < half; e++) cs[i].ff[e] = 1 + 31 * rng_f32(&g_rng);
        host[i] = vec_tensor(has_ff ? cs[i].ff : NULL, half);
        cs[i].p = (struct rope_params){ .n_rot = cs[i].n_rot, .theta = thetas[rnd(3)], .freq_scale = fscales[rnd(5)],
                                        .neox = rnd(2), .attn_factor = rnd(3) ? 0.0f : 0.5f + 1.5f * rng_f32(&g_rng) };
        if (rnd(3) == 0) {   /* YaRN: a ramp anywhere over the pairs, now and then empty (lo == hi) */
            cs[i].p.yarn = true;
            cs[i].p.yarn_lo = (float)rnd(half + 1);
            cs[i].p.yarn_hi = cs[i].p.yarn_lo + (float)(rnd(4) ? rnd(half + 1) : 0);
        }
    }
    for (int b = 0; b < g_nbe; b++) placed[b] = place(&g_be[b], host, nc);
    for (int i = 0; i < nc; i++) {
        const int n = cs[i].n, nh = cs[i].n_head, hd = cs[i].hd, n_rot = cs[i].n_rot, half = n_rot / 2;
        const size_t len = (size_t)n * nh * hd;
        const struct rope_params *p = &cs[i].p;
        const bool has_ff = host[i].data != NULL;
        /* the math: pair i of each head, (x[i], x[i + n_rot/2]) for neox and
         * (x[2i], x[2i+1]) otherwise, turns by pos * freq_scale * theta^(-2i/n_rot) / ff[i];
         * with YaRN the angle is the interpolated one (with freq_scale) and the
         * extrapolated one (without) mixed: by 1 below the ramp, 0 above it */
        double *ref = tu_xnew(len * sizeof *ref);
        for (size_t e = 0; e < len; e++) ref[e] = cs[i].x[e];
        for (int t = 0; t < n; t++)
            for (int h = 0; h < nh; h++)
                for (int k = 0; k < half; k++) {
                    const double extrap = (double)cs[i].pos[t] * pow((double)p->theta, -2.0 * k / n_rot),
                                 interp = extrap * (p->freq_scale != 0 ? (double)p->freq_scale : 1.0);
                    double ang = interp;
                    if (p->yarn) {
                        const double r = (k - (double)p->yarn_lo) / fmax(0.001, (double)p->yarn_hi - p->yarn_lo);
                        const double mix = 1 - fmin(1, fmax(0, r));
                        ang = interp * (1 - mix) + extrap * mix;
                    }
                    if (has_ff) ang /= (double)cs[i].ff[k];
                    const size_t a = (size_t)t * nh * hd + (size_t)h * hd + (size_t)(p->neox ? k : 2 * k);
                    const size_t o = a + (size_t)(p->neox ? half : 1);
                    const double xa = cs[i].x[a], xo = cs[i].x[o], ms = p->attn_factor != 0 ? p->attn_factor : 1.0;
                    ref[a] = (xa * cos(ang) - xo * sin(ang)) * ms;
                    ref[o] = (xa * sin(ang) + xo * cos(ang)) * ms;
                }
        char desc[160];
        snprintf(desc, sizeof desc, "rope n=%d heads=%d head_dim=%d n_rot=%d %s theta=%g freq_scale=%g attn_factor=%g%s "
                 "yarn=%d [%g, %g]", n, nh, hd, n_rot, p->neox ? "neox" : "normal", p->theta, p->freq_scale,
                 p->attn_factor, has_ff ? " freq_factors" : "", p->yarn, p->yarn_lo, p->yarn_hi);
        float *outs[MAX_BE];
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            struct rope_params pb = *p;
            pb.freq_factors = has_ff ? &placed[b][i] : NULL;
            outs[b] = tu_xnew(len * sizeof(float));
            struct backend_buf bx = buf_up(t, cs[i].x, len * 4), bp = buf_up(t, cs[i].pos, (size_t)n * 4);
            int rc = BE_OP(t->c, rope, bx.data, n, nh, hd, bp.data, &pb);
            buf_down(t, outs[b], &bx, len * 4);
            sync_ok(t, rc, desc);
            /* a context may keep a call's cos and sin for the next at the same positions (the CPU's
             * does): the same call again, and again after one at these positions with other angles
             * (itself after one at other positions, so that it computes its own), gives the same bits */
            int32_t *pos2 = tu_xnew((size_t)n * sizeof *pos2);
            for (int e = 0; e < n; e++) pos2[e] = cs[i].pos[e] + 1;
            struct backend_buf bp2 = buf_up(t, pos2, (size_t)n * 4);
            for (int again = 0; again < 2; again++) {
                float *twice = tu_xnew(len * sizeof(float));
                struct backend_buf bd = buf_up(t, cs[i].x, len * 4);
                rc = 0;
                if (again) {
                    struct rope_params pd = pb;
                    switch (i % 5) {
                    case 0: pd.theta *= 2; break;
                    case 1: pd.freq_scale = (pd.freq_scale != 0 ? pd.freq_scale : 1.0f) * 0.5f; break;
                    case 2: pd.attn_factor = (pd.attn_factor != 0 ? pd.attn_factor : 1.0f) * 1.5f; break;
                    case 3:   /* fewer pairs, or more where the head has room */
                        if (pd.n_rot > 2) pd.n_rot -= 2;
                        else if (pd.n_rot + 2 <= hd) pd.n_rot += 2;
                        else pd.theta *= 2;
                        break;
                    default: pd.yarn = !pd.yarn, pd.yarn_lo = 1, pd.yarn_hi = 4; break;
                    }
                    rc = BE_OP(t->c, rope, bd.data, n, nh, hd, bp2.data, &pd);
                    if (!rc) rc = BE_OP(t->c, rope, bd.data, n, nh, hd, bp.data, &pd);
                    buf_drop(t, &bd);
                    bd = buf_up(t, cs[i].x, len * 4);
                }
                if (!rc) rc = BE_OP(t->c, rope, bd.data, n, nh, hd, bp.data, &pb);
                buf_down(t, twice, &bd, len * 4);
                sync_ok(t, rc, desc);
                CHECK_MSG(!memcmp(twice, outs[b], len * sizeof(float)), "%s: %s differs when run %s", t->name, desc,
                          again ? "after another rope at the same positions" : "again");
                buf_drop(t, &bd);
                free(twice);
            }
            buf_drop(t, &bp2);
            free(pos2);
            buf_drop(t, &bx);
            buf_drop(t, &bp);
        }
        judge(OP_ROPE, outs, len, ref, k_tol[OP_ROPE].simd, k_tol[OP_ROPE].ref, desc);
        for (int b = 0; b < g_nbe; b++) free(outs[b]);
        free(ref);
    }
    for (int b = 0; b < g_nbe; b++) free(placed[b]);
    for (int i = 0; i < nc; i++) { free(cs[i].x); free(cs[i].ff); free(cs[i].pos); }
    free(cs);
    free(host);
}

static void test_add_bias(int nc) {
    struct { int n, dim; float *y, *bias; } *cs = tu_xnew((size_t)nc * sizeof *cs);
    struct tensor *host = tu_xnew((size_t)nc * sizeof *host), *placed[MAX_BE];
    for (int i = 0; i < nc; i++) {
        cs[i].n = rnd_in(1, MAX_TOKENS);
        cs[i].dim = rnd_in(1, 300);
        cs[i].y = tu_xnew((size_t)cs[i].n * cs[i].dim * sizeof(float));
        cs[i].bias = tu_xnew((size_t)cs[i].dim * sizeof(float));
        for (long e = 0; e < (long)cs[i].n * cs[i].dim; e++) cs[i].y[e] = gauss();
        for (int e = 0; e < cs[i].dim; e++) cs[i].bias[e] = gauss();
        host[i] = vec_tensor(cs[i].bias, cs[i].dim);
    }
    for (int b = 0; b < g_nbe; b++) placed[b] = place(&g_be[b], host, nc);
    for (int i = 0; i < nc; i++) {
        const int n = cs[i].n, dim = cs[i].dim;
        double *ref = tu_xnew((size_t)n * dim * sizeof *ref);
        for (int t = 0; t < n; t++)
            for (int e = 0; e < dim; e++)
                ref[(size_t)t * dim + e] = (double)cs[i].y[(size_t)t * dim + e] + (double)cs[i].bias[e];
        char desc[96];
        snprintf(desc, sizeof desc, "add_bias n=%d dim=%d", n, dim);
        float *outs[MAX_BE];
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            outs[b] = tu_xnew((size_t)n * dim * sizeof(float));
            struct backend_buf by = buf_up(t, cs[i].y, (size_t)n * dim * 4);
            int rc = BE_OP(t->c, add_bias, by.data, &placed[b][i], n, dim);
            buf_down(t, outs[b], &by, (size_t)n * dim * 4);
            sync_ok(t, rc, desc);
            buf_drop(t, &by);
        }
        judge(OP_ADD_BIAS, outs, (size_t)n * dim, ref, k_tol[OP_ADD_BIAS].simd, k_tol[OP_ADD_BIAS].ref, desc);
        for (int b = 0; b < g_nbe; b++) free(outs[b]);
        free(ref);
    }
    for (int b = 0; b < g_nbe; b++) free(placed[b]);
    for (int i = 0; i < nc; i++) { free(cs[i].y); free(cs[i].bias); }
    free(cs);
    free(host);
}

/* add (y += x), swiglu (g = silu(g) * u), gelu (x = gelu(x)), geglu
 * (g = gelu(g) * u), scale (x *= s) and softcap (x = cap tanh(x / cap)) on
 * n values, some of them large (|x| up to 30: saturation). */
static void test_elementwise(enum op op, int nc) {
    for (int i = 0; i < nc; i++) {
        const long n = g_large ? (long)draw_tokens() * PICK(k_large_ffn) : rnd(3) ? rnd_in(1, 5000) : rnd_in(1, 9);
        float *a = tu_xnew((size_t)n * sizeof *a), *bv = tu_xnew((size_t)n * sizeof *bv), *outs[MAX_BE];
        double *ref = tu_xnew((size_t)n * sizeof *ref);
        const float amp = op == OP_ADD ? ldexpf(1, rnd_in(-8, 8)) : 3.0f;
        const float s = op == OP_SCALE ? gauss() * 8 : urand() * 20 + 0.5f;   /* scale's factor, softcap's cap */
        for (long e = 0; e < n; e++) {
            a[e] = gauss() * amp;
            bv[e] = gauss() * amp;
            if (op != OP_ADD && rnd(50) == 0) a[e] = urand() * 30;
            if (op == OP_SWIGLU && rnd(200) == 0) a[e] = gauss() * 100;   /* expf's |x| >= 88 lanes */
        }
        for (long e = 0; e < n; e++) {
            const double x = a[e], y = bv[e];
            switch (op) {
            case OP_ADD: ref[e] = x + y; break;
            case OP_SWIGLU: ref[e] = x / (1 + exp(-x)) * y; break;
            case OP_SCALE: ref[e] = x * (double)s; break;
            case OP_SOFTCAP: ref[e] = (double)s * tanh(x / (double)s); break;
            default: ref[e] = 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
                     if (op == OP_GEGLU) ref[e] *= y;
                     break;
            }
        }
        char desc[64];
        snprintf(desc, sizeof desc, "%s n=%ld", k_tol[op].name, n);
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            outs[b] = tu_xnew((size_t)n * sizeof(float));
            struct backend_buf ba = buf_up(t, a, (size_t)n * 4), bb = buf_up(t, bv, (size_t)n * 4);
            int rc = op == OP_ADD       ? BE_OP(t->c, add, ba.data, bb.data, n)
                     : op == OP_SWIGLU  ? BE_OP(t->c, swiglu, ba.data, bb.data, n)
                     : op == OP_GEGLU   ? BE_OP(t->c, geglu, ba.data, bb.data, n)
                     : op == OP_SCALE   ? BE_OP(t->c, scale, ba.data, n, s)
                     : op == OP_SOFTCAP ? BE_OP(t->c, softcap, ba.data, n, s)
                                        : BE_OP(t->c, gelu, ba.data, n);
            buf_down(t, outs[b], &ba, (size_t)n * 4);
            sync_ok(t, rc, desc);
            buf_drop(t, &ba);
            buf_drop(t, &bb);
        }
        /* gelu's tanh form cancels in 1 + tanh(..) for x < 0: its error is
         * ~|x| 2^-24 however small gelu(x) is, so it is measured against ‖x‖ too */
        double xx = 0;
        for (long e = 0; (op == OP_GELU || op == OP_GEGLU) && e < n; e++)
            xx += (double)a[e] * a[e] * (op == OP_GEGLU ? (double)bv[e] * bv[e] : 1.0);
        g_den_floor = sqrt(xx);
        /* SwiGLU at x < -88.7: expf(-x) overflows and the f32 op gives 0 where the exact value is
         * subnormal or less, an error under 2^-126 that relative to a few such values alone is 1 */
        if (op == OP_SWIGLU) g_den_floor = FLT_MIN * 1e7;
        judge(op, outs, (size_t)n, ref, k_tol[op].simd, k_tol[op].ref, desc);
        g_den_floor = 0;
        /* the CPU sets' SwiGLU takes libm's expf bits (avx2_expf): the scalar op's output exactly */
        for (int b = 1; op == OP_SWIGLU && b < g_nbe; b++)
            CHECK_MSG(g_be[b].device || memcmp(outs[b], outs[0], (size_t)n * sizeof(float)) == 0,
                      "%s %s: differs from the scalar op's bits", g_be[b].name, desc);
        for (int b = 0; b < g_nbe; b++) free(outs[b]);
        free(a);
        free(bv);
        free(ref);
    }
}

/* avx2_expf (cpu_expf_avx2, or its 16-lane form cpu_expf_avx512) against libm's expf bit for bit (NaN:
 * any NaN), on every 4099th float bit pattern from a random start (~1M values: every exponent, both
 * signs, inf, NaN) and 1M random patterns; KVLLM_TEST_EXPF_ALL=1: all 2^32 (about a minute). */
static void test_expf(const char *name, void (*fn)(const float *x, float *y, long n)) {
    const char *all_env = getenv("KVLLM_TEST_EXPF_ALL");
    const bool all = all_env && !strcmp(all_env, "1");
    const uint64_t stride = all ? 1 : 4099, end = (uint64_t)1 << 32;
    const long cap = 1 << 16;
    float *x = tu_xnew((size_t)cap * sizeof *x), *y = tu_xnew((size_t)cap * sizeof *y);
    uint64_t b = all ? 0 : (uint64_t)rnd((int)stride), checked = 0, bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (long round = 0; pass == 0 ? b < end : round < 16; round++) {
            long m = 0;
            for (; m < cap && (pass == 1 || b < end); m++) {
                const uint32_t u = pass == 0 ? (uint32_t)b : (uint32_t)rng_u64(&g_rng);
                memcpy(&x[m], &u, sizeof u);
                b += stride;
            }
            fn(x, y, m);
            for (long i = 0; i < m; i++) {
                const float r = expf(x[i]);
                if (memcmp(&r, &y[i], sizeof r) && !(isnan(r) && isnan(y[i])) && bad++ < 5)
                    printf("  expf(%a): libm %a, %s %a\n", (double)x[i], (double)r, name, (double)y[i]);
            }
            checked += (uint64_t)m;
        }
    }
    CHECK_MSG(bad == 0, "%s: %llu of %llu values differ from libm's expf", name, (unsigned long long)bad,
              (unsigned long long)checked);
    printf("  expf: %s = libm's expf on %llu values%s\n", name, (unsigned long long)checked,
           all ? " (every float)" : "");
    free(x);
    free(y);
}

/* ---- mixture of experts ---- */

/* The experts' FFN in double for token row x: Σ_j w[j] (down_e glu(gate_e x + gb_e, up_e x + ub_e) + db_e),
 * glu as act says (enum glu_kind, written here from its definition), the biases (n_expert, F | F | E)
 * zero when bias is NULL (else gb, ub, db one after another). */
static void ref_moe_token(const float *x, const int32_t *ids, const float *w, int n_used, const struct tensor *gate,
                          const struct tensor *up, const struct tensor *down, enum glu_kind act, const float *bias,
                          int n_expert, double *out) {
    const int E = (int)gate[0].ne0, F = (int)gate[0].ne1;
    float *row = tu_xnew((size_t)(E > F ? E : F) * sizeof *row);
    double *h = tu_xnew((size_t)F * sizeof *h);
    for (int i = 0; i < E; i++) out[i] = 0;
    const float *gb = bias, *ub = bias ? bias + (size_t)n_expert * F : NULL,
                *db = bias ? bias + 2 * (size_t)n_expert * F : NULL;
    for (int j = 0; j < n_used; j++) {
        const int e = ids[j];
        for (int f = 0; f < F; f++) {
            double g = gb ? gb[(size_t)e * F + f] : 0, u = ub ? ub[(size_t)e * F + f] : 0;
            dtype_to_f32(gate[e].type, tensor_row(&gate[e], f), row, E);
            for (int i = 0; i < E; i++) g += (double)row[i] * x[i];
            dtype_to_f32(up[e].type, tensor_row(&up[e], f), row, E);
            for (int i = 0; i < E; i++) u += (double)row[i] * x[i];
            switch (act) {
            case GLU_GELU: h[f] = 0.5 * g * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (g + 0.044715 * g * g * g))) * u; break;
            case GLU_SILU: h[f] = g / (1 + exp(-g)) * u; break;
            case GLU_SWIGLU_OAI:   /* gate clamped above at 7, up to [-7, 7]; alpha 1.702 */
                g = fmin(g, 7.0);
                h[f] = g / (1 + exp(-1.702 * g)) * (fmax(-7.0, fmin(u, 7.0)) + 1);
                break;
            }
        }
        for (int i = 0; i < E; i++) {
            double d = db ? db[(size_t)e * E + i] : 0;
            dtype_to_f32(down[e].type, tensor_row(&down[e], i), row, F);
            for (int f = 0; f < F; f++) d += (double)row[f] * h[f];
            out[i] += (double)w[j] * d;
        }
    }
    free(row);
    free(h);
}

/* moe_route against a host top-k, then moe against the double reference,
 * and each token computed alone against the batch (bit for bit). */
static void test_moe(int nc) {
    const int nbe_all = g_nbe;
    while (g_nbe > 1 && !backend_supports(g_be[g_nbe - 1].be, BACKEND_OP_MOE, DTYPE_F32)) {   /* devices come last */
        printf("SKIP moe on %s: the backend has no mixture-of-experts ops\n", g_be[g_nbe - 1].name);
        g_nbe--;
    }
    for (int ci = 0; ci < nc; ci++) {
        const int ne = rnd_in(1, 8), nu = rnd_in(1, ne), E = 32 * rnd_in(1, 3), F = 32 * rnd_in(1, 3);
        const int n = rnd(4) ? rnd_in(1, MAX_TOKENS) : rnd_in(1, 3);
        const uint32_t type = rnd(2) ? DTYPE_F32 : DTYPE_F16;
        const enum glu_kind act = (enum glu_kind)rnd(3);
        const bool norm = rnd(2);
        /* biases (gpt-oss): wide, so that swiglu_oai's clamps bite */
        float *bias = rnd(2) ? tu_xnew((size_t)ne * (2 * F + E) * sizeof *bias) : NULL;
        for (size_t i = 0; bias && i < (size_t)ne * (2 * F + E); i++) bias[i] = (urand() * 2 - 1) * 9;
        struct tensor bt[3], *placed_b[MAX_BE];
        for (int k = 0; k < 3; k++) {
            const int w0 = k < 2 ? F : E;
            bt[k] = (struct tensor){ .type = DTYPE_F32, .ne0 = w0, .ne1 = ne, .row_bytes = (size_t)w0 * 4,
                                     .data = bias ? bias + (size_t)k * ne * F : NULL };
        }
        struct tensor *w = tu_xnew(3 * (size_t)ne * sizeof *w), *placed[MAX_BE];
        for (int e = 0; e < ne; e++) {
            w[e] = rand_weight(type, E, F);
            w[ne + e] = rand_weight(type, E, F);
            w[2 * ne + e] = rand_weight(type, F, E);
        }
        float *x = tu_xnew((size_t)n * E * sizeof *x), *lg = tu_xnew((size_t)n * ne * sizeof *lg);
        for (int i = 0; i < n * E; i++) x[i] = gauss();
        for (int i = 0; i < n * ne; i++) lg[i] = rnd(3) ? gauss() : (float)rnd_in(-2, 2);   /* ties too */
        /* the host's routing: softmax, the n_used largest (the lower expert first on ties) */
        int32_t *ids = tu_xnew((size_t)n * nu * sizeof *ids);
        double *wr = tu_xnew((size_t)n * nu * sizeof *wr), *ref = tu_xnew((size_t)n * E * sizeof *ref);
        float *wf = tu_xnew((size_t)n * nu * sizeof *wf);
        for (int t = 0; t < n; t++) {
            const float *l = lg + (size_t)t * ne;
            double mx = -INFINITY, sum = 0, ws = 0;
            for (int e = 0; e < ne; e++) mx = l[e] > mx ? l[e] : mx;
            for (int e = 0; e < ne; e++) sum += exp(l[e] - mx);
            for (int j = 0; j < nu; j++) {
                int best = -1;
                for (int e = 0; e < ne; e++) {
                    bool used = false;
                    for (int k = 0; k < j; k++) used |= ids[t * nu + k] == e;
                    if (!used && (best < 0 || l[e] > l[best])) best = e;
                }
                ids[t * nu + j] = best;
                ws += wr[t * nu + j] = exp(l[best] - mx) / sum;
            }
            for (int j = 0; j < nu; j++) wf[t * nu + j] = (float)(wr[t * nu + j] /= norm ? ws : 1.0);
            ref_moe_token(x + (size_t)t * E, ids + t * nu, wf + t * nu, nu, w, w + ne, w + 2 * ne, act, bias, ne,
                          ref + (size_t)t * E);
        }
        static const char *const act_name[] = { "silu", "gelu", "swiglu_oai" };
        char desc[128];
        snprintf(desc, sizeof desc, "moe %s experts=%d used=%d E=%d F=%d n=%d %s%s%s", dtype_name(type), ne, nu, E,
                 F, n, act_name[act], norm ? " norm" : "", bias ? " biases" : "");
        float *outs[MAX_BE], *wouts[MAX_BE];
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            placed[b] = place(t, w, 3 * ne);
            placed_b[b] = bias ? place(t, bt, 3) : NULL;
            const size_t xb = (size_t)n * E * 4, fb = (size_t)n * F * 4, kb = (size_t)n * nu * 4;
            struct backend_buf bx = buf_up(t, x, xb), bl = buf_up(t, lg, (size_t)n * ne * 4), bi = buf_up(t, NULL, kb),
                               bw = buf_up(t, NULL, kb), bxs = buf_up(t, NULL, xb), bys = buf_up(t, NULL, xb),
                               bg = buf_up(t, NULL, fb), bu = buf_up(t, NULL, fb), bo = buf_up(t, NULL, xb);
            int32_t *got_ids = tu_xnew(kb);
            wouts[b] = tu_xnew(kb);
            outs[b] = tu_xnew(xb);
            int rc = BE_OP(t->c, moe_route, bi.data, bw.data, bl.data, n, ne, nu, norm);
            buf_down(t, got_ids, &bi, kb);
            buf_down(t, wouts[b], &bw, kb);
            sync_ok(t, rc, desc);
            CHECK_MSG(memcmp(got_ids, ids, kb) == 0, "%s %s: moe_route chose other experts", t->name, desc);
            struct moe_args a = { .n_tokens = n, .n_used = nu, .n_expert = ne, .n_embd = E, .n_ff = F, .x = bx.data,
                                  .ids = bi.data, .weights = bw.data, .gate = placed[b], .up = placed[b] + ne,
                                  .down = placed[b] + 2 * ne, .act = act, .xs = bxs.data,
                                  .ys = bys.data, .g = bg.data, .u = bu.data, .out = bo.data };
            if (bias) {
                a.gate_b = &placed_b[b][0];
                a.up_b = &placed_b[b][1];
                a.down_b = &placed_b[b][2];
            }
            rc = BE_OP(t->c, moe, &a);
            buf_down(t, outs[b], &bo, xb);
            sync_ok(t, rc, desc);
            /* batch invariance: one token at a time gives the batch's bytes */
            for (int tk = 0; tk < n; tk++) {
                float one[96];
                struct moe_args a1 = a;
                a1.n_tokens = 1;
                a1.x = (const float *)bx.data + (size_t)tk * E;
                a1.ids = (const int32_t *)bi.data + (size_t)tk * nu;
                a1.weights = (const float *)bw.data + (size_t)tk * nu;
                rc = BE_OP(t->c, moe, &a1);
                buf_down(t, one, &bo, (size_t)E * 4);
                sync_ok(t, rc, desc);
                CHECK_MSG(memcmp(one, outs[b] + (size_t)tk * E, (size_t)E * 4) == 0,
                          "%s %s: token %d alone differs from the batch", t->name, desc, tk);
            }
            struct backend_buf *bufs[] = { &bx, &bl, &bi, &bw, &bxs, &bys, &bg, &bu, &bo };
            for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) buf_drop(t, bufs[i]);
            free(got_ids);
        }
        judge(OP_MOE_ROUTE, wouts, (size_t)n * nu, wr, k_tol[OP_MOE_ROUTE].simd, k_tol[OP_MOE_ROUTE].ref, desc);
        judge(OP_MOE, outs, (size_t)n * E, ref, k_tol[OP_MOE].simd, k_tol[OP_MOE].ref, desc);
        for (int b = 0; b < g_nbe; b++) { free(outs[b]); free(wouts[b]); free(placed[b]); free(placed_b[b]); }
        for (int i = 0; i < 3 * ne; i++) free((void *)w[i].data);
        free(w); free(x); free(lg); free(ids); free(wr); free(ref); free(wf); free(bias);
    }
    g_nbe = nbe_all;
}

/* ---- paged KV: storage made through the backend ---- */

/* Host image of one layer's pool: n_blocks blocks of (n_head_kv,
 * block_size, head_dim) elements of type, scales for int8 / fp8. */
struct pool_img {
    enum kv_type type;
    int n_blocks, bs, nkv, hd;
    size_t rows, data_bytes, scale_bytes;   /* per K (and per V) */
    uint8_t *k, *v;
    float *ks, *vs;                         /* NULL for float types */
};

static void pool_init(struct pool_img *p, enum kv_type type, int n_blocks, int bs, int nkv, int hd) {
    *p = (struct pool_img){ .type = type, .n_blocks = n_blocks, .bs = bs, .nkv = nkv, .hd = hd };
    p->rows = (size_t)n_blocks * (size_t)bs * (size_t)nkv;
    p->data_bytes = p->rows * (size_t)hd * kv_elem_bytes(type);
    p->scale_bytes = type == KV_INT8 || type == KV_FP8 ? p->rows * sizeof(float) : 0;
    p->k = tu_xnew(p->data_bytes);
    p->v = tu_xnew(p->data_bytes);
    p->ks = p->scale_bytes ? tu_xnew(p->scale_bytes) : NULL;
    p->vs = p->scale_bytes ? tu_xnew(p->scale_bytes) : NULL;
}

static void pool_fill(struct pool_img *p, int byte) {
    memset(p->k, byte, p->data_bytes);
    memset(p->v, byte, p->data_bytes);
    if (p->ks) { memset(p->ks, byte, p->scale_bytes); memset(p->vs, byte, p->scale_bytes); }
}

static void pool_deinit(struct pool_img *p) { free(p->k); free(p->v); free(p->ks); free(p->vs); }

/* The pool on backend t: buffers holding img's bytes, and the view of them. */
struct pool_dev { struct backend_buf k, v, ks, vs; struct kv_layer_view view; };

static void pool_up(struct tbe *t, const struct pool_img *img, struct pool_dev *d) {
    d->k = buf_up(t, img->k, img->data_bytes);
    d->v = buf_up(t, img->v, img->data_bytes);
    memset(&d->ks, 0, sizeof d->ks);
    memset(&d->vs, 0, sizeof d->vs);
    if (img->scale_bytes) {
        d->ks = buf_up(t, img->ks, img->scale_bytes);
        d->vs = buf_up(t, img->vs, img->scale_bytes);
    }
    d->view = (struct kv_layer_view){ .type = img->type, .block_size = img->bs, .n_head_kv = img->nkv,
                                      .head_dim = img->hd, .k = d->k.data, .v = d->v.data,
                                      .k_scale = d->ks.data, .v_scale = d->vs.data };
}

/* Download into img (read after the next sync). */
static void pool_down(struct tbe *t, const struct pool_dev *d, struct pool_img *img) {
    buf_down(t, img->k, &d->k, img->data_bytes);
    buf_down(t, img->v, &d->v, img->data_bytes);
    if (img->scale_bytes) {
        buf_down(t, img->ks, &d->ks, img->scale_bytes);
        buf_down(t, img->vs, &d->vs, img->scale_bytes);
    }
}

static void pool_drop(struct tbe *t, struct pool_dev *d) {
    buf_drop(t, &d->k);
    buf_drop(t, &d->v);
    if (d->ks.data) buf_drop(t, &d->ks);
    if (d->vs.data) buf_drop(t, &d->vs);
}

static bool pool_equal(const struct pool_img *a, const struct pool_img *b) {
    return memcmp(a->k, b->k, a->data_bytes) == 0 && memcmp(a->v, b->v, a->data_bytes) == 0 &&
           (!a->scale_bytes || (memcmp(a->ks, b->ks, a->scale_bytes) == 0 && memcmp(a->vs, b->vs, a->scale_bytes) == 0));
}

/* Element i of stored row `row` of K (is_v false) or V, dequantized with dtype.h. */
static double pool_elem(const struct pool_img *p, bool is_v, size_t row, int i) {
    const uint8_t *base = is_v ? p->v : p->k;
    const size_t e = row * (size_t)p->hd + (size_t)i;
    uint16_t h;
    switch (p->type) {
    case KV_F32: { float f; memcpy(&f, base + 4 * e, 4); return f; }
    case KV_F16: memcpy(&h, base + 2 * e, 2); return f16_to_f32(h);
    case KV_BF16: memcpy(&h, base + 2 * e, 2); return bf16_to_f32(h);
    case KV_INT8: return (double)(int8_t)base[e] * (is_v ? p->vs : p->ks)[row];
    case KV_FP8: return (double)fp8_e4m3_to_f32(base[e]) * (is_v ? p->vs : p->ks)[row];
    default: return NAN;
    }
}

static size_t pool_row(const struct pool_img *p, size_t slot, int h) {
    const struct kv_layer_view v = { .block_size = p->bs, .n_head_kv = p->nkv };
    return kv_row(&v, slot, h);
}


/* Stored row (slot, head h) of K (is_v false) or V in p against its input x
 * (head_dim values), by each type's math; adds the squared error and the
 * input's squared norm to *num and *den.  Returns the number of values off. */
static int store_check_row(const struct pool_img *p, bool is_v, size_t slot, int h, const float *x, double *num,
                           double *den) {
    const size_t row = pool_row(p, slot, h);
    const uint8_t *codes = (is_v ? p->v : p->k) + row * (size_t)p->hd;
    float amax = 0, sc = 0;
    int bad = 0;
    for (int i = 0; i < p->hd; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    if (p->type == KV_INT8 || p->type == KV_FP8) {
        sc = amax / (p->type == KV_INT8 ? 127.0f : 448.0f);
        bad += (is_v ? p->vs : p->ks)[row] != sc;
    }
    for (int i = 0; i < p->hd; i++) {
        const double y = pool_elem(p, is_v, row, i), d = y - (double)x[i];
        *num += d * d;
        *den += (double)x[i] * (double)x[i];
        switch (p->type) {
        case KV_F32: bad += y != x[i]; break;
        case KV_F16: bad += y != f16_to_f32(f32_to_f16(x[i])); break;
        case KV_BF16: bad += y != bf16_to_f32(f32_to_bf16(x[i])); break;
        /* half a step, plus the f32 rounding of x / scale (127 * 2^-24 steps) */
        case KV_INT8: bad += sc != 0 ? fabs(d) > (0.5 + 1e-5) * sc : y != 0; break;
        case KV_FP8: bad += sc != 0 ? codes[i] != f32_to_fp8_e4m3(x[i] / sc) : codes[i] != 0; break;
        default: bad++;
        }
    }
    return bad;
}

/* Whether the bytes of row (slot, h) of K and V (and scales) still hold the fill byte. */
static bool pool_row_untouched(const struct pool_img *p, size_t slot, int h, int byte) {
    const size_t row = pool_row(p, slot, h), rb = (size_t)p->hd * kv_elem_bytes(p->type);
    for (size_t i = 0; i < rb; i++)
        if (p->k[row * rb + i] != (uint8_t)byte || p->v[row * rb + i] != (uint8_t)byte) return false;
    if (p->scale_bytes) {
        uint32_t a, b, f = 0x01010101u * (uint8_t)byte;
        memcpy(&a, &p->ks[row], 4);
        memcpy(&b, &p->vs[row], 4);
        if (a != f || b != f) return false;
    }
    return true;
}

static const int k_block_sizes[4] = { 1, 5, 16, 32 };

/* kv_store on its own: scattered slots, padding (-1) skipped, rows of
 * widely different magnitude (and all-zero ones), every slot not named
 * left as it was. */
static void test_kv_store(int nc) {
    for (int i = 0; i < nc; i++) {
        const enum kv_type type = (enum kv_type)(i % KV_TYPE_COUNT_);
        const int nkv = rnd_in(1, 4), hd = rnd(3) ? rnd_in(1, 128) : 8 * rnd_in(1, 16), bs = k_block_sizes[rnd(4)];
        const int n = rnd_in(1, MAX_TOKENS), w = nkv * hd, n_blocks = (n + bs - 1) / bs + rnd_in(0, 2);
        const int n_slots = n_blocks * bs;
        int32_t *perm = tu_xnew((size_t)n_slots * sizeof *perm), *slots = tu_xnew((size_t)n * sizeof *slots);
        for (int s = 0; s < n_slots; s++) perm[s] = s;
        for (int s = n_slots - 1; s > 0; s--) { int j = rnd(s + 1), x = perm[s]; perm[s] = perm[j]; perm[j] = x; }
        for (int t = 0; t < n; t++) slots[t] = rnd(8) ? perm[t] : -1;
        float *k = tu_xnew((size_t)n * w * sizeof *k), *v = tu_xnew((size_t)n * w * sizeof *v);
        for (int t = 0; t < n; t++)
            for (int h = 0; h < nkv; h++) {
                const float ak = rnd(8) ? ldexpf(1, rnd_in(-12, 12)) : 0, av = ldexpf(1, rnd_in(-12, 12));
                for (int e = 0; e < hd; e++) {
                    k[(size_t)t * w + (size_t)h * hd + e] = gauss() * ak;
                    v[(size_t)t * w + (size_t)h * hd + e] = gauss() * av;
                }
            }
        struct pool_img img0, out[MAX_BE];
        pool_init(&img0, type, n_blocks, bs, nkv, hd);
        pool_fill(&img0, 0xff);
        char desc[128];
        snprintf(desc, sizeof desc, "kv_store %s kv_heads=%d head_dim=%d block_size=%d n=%d", k_kv_names[type], nkv,
                 hd, bs, n);
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            struct pool_dev d;
            pool_init(&out[b], type, n_blocks, bs, nkv, hd);
            pool_up(t, &img0, &d);
            struct backend_buf bs_ = buf_up(t, slots, (size_t)n * 4), bk = buf_up(t, k, (size_t)n * w * 4),
                               bv = buf_up(t, v, (size_t)n * w * 4);
            int rc = BE_OP(t->c, kv_store, &d.view, bs_.data, bk.data, bv.data, n);
            pool_down(t, &d, &out[b]);
            sync_ok(t, rc, desc);
            pool_drop(t, &d);
            buf_drop(t, &bs_);
            buf_drop(t, &bk);
            buf_drop(t, &bv);
        }
        for (int b = 0; b < g_nbe; b++) {
            struct stat_ *s = &g_st[b][OP_KV_STORE];
            s->cases++;
            const bool same = pool_equal(&out[b], &out[0]);
            CHECK_MSG(same, "%s %s: stored bytes differ from scalar's", g_be[b].name, desc);
            s->vs_scalar = dmax(s->vs_scalar, same ? 0 : INFINITY);
            if (g_be[b].twin >= 0)
                CHECK_MSG(pool_equal(&out[b], &out[g_be[b].twin]), "%s %s: stored bytes differ from %s's", g_be[b].name,
                          desc, g_be[g_be[b].twin].name);
            double num = 0, den = 0;
            int bad = 0, touched = 0, count = 0;
            bool *used = tu_xnew((size_t)n_slots * sizeof *used);
            memset(used, 0, (size_t)n_slots * sizeof *used);
            for (int tk = 0; tk < n; tk++) {
                if (slots[tk] < 0) continue;
                used[slots[tk]] = true;
                count += 2 * w;
                for (int h = 0; h < nkv; h++) {
                    bad += store_check_row(&out[b], false, (size_t)slots[tk], h, k + (size_t)tk * w + (size_t)h * hd,
                                           &num, &den);
                    bad += store_check_row(&out[b], true, (size_t)slots[tk], h, v + (size_t)tk * w + (size_t)h * hd,
                                           &num, &den);
                }
            }
            for (int sl = 0; sl < n_slots; sl++)
                for (int h = 0; h < nkv && !used[sl]; h++) touched += !pool_row_untouched(&out[b], (size_t)sl, h, 0xff);
            free(used);
            const double e = den > 0 ? sqrt(num / den) : sqrt(num);
            CHECK_MSG(bad == 0, "%s %s: %d stored values or scales off their type's rounding", g_be[b].name, desc, bad);
            CHECK_MSG(touched == 0, "%s %s: %d rows of slots not stored to were written", g_be[b].name, desc, touched);
            const double bound = k_store_bound[type] + (den > 0 ? k_store_abs[type] * sqrt(count / den) : 0);
            CHECK_MSG(e <= bound, "%s %s: stored rows vs inputs: rel err %.3g > %.3g", g_be[b].name, desc, e, bound);
            s->vs_ref = dmax(s->vs_ref, e);
            g_store_worst[type] = dmax(g_store_worst[type], e);
        }
        for (int b = 0; b < g_nbe; b++) pool_deinit(&out[b]);
        pool_deinit(&img0);
        free(perm);
        free(slots);
        free(k);
        free(v);
    }
}

/* ---- fused ops: the same backend's separate ops, byte for byte ---- */

/* A fused op's outcome against its parts' on backend b: counted, and a
 * difference is a failure (the contract is exact, not a tolerance). */
static void fused_judge(int b, bool same, const char *desc) {
    struct stat_ *s = &g_st[b][OP_FUSED];
    s->cases++;
    s->vs_ref = dmax(s->vs_ref, same ? 0 : INFINITY);
    CHECK_MSG(same, "%s %s: the fused op's bytes differ from its separate ops'", g_be[b].name, desc);
}

/* add_rmsnorm (y apart from h, or y = h) against add then rmsnorm. */
static void test_add_rmsnorm(int nc) {
    for (int i = 0; i < nc; i++) {
        const int n = draw_tokens(), dim = g_large ? PICK(k_large_dims) : rnd(6) ? rnd_in(1, 300) : rnd_in(1, 8);
        const bool alias = rnd(2);
        const size_t len = (size_t)n * dim;
        float *x = tu_xnew(len * 4), *h = tu_xnew(len * 4), *w = tu_xnew((size_t)dim * 4);
        for (size_t e = 0; e < len; e++) { x[e] = gauss(); h[e] = gauss() * 0.5f; }
        for (int e = 0; e < dim; e++) w[e] = 1 + 0.2f * gauss();
        const struct tensor host = vec_tensor(w, dim);
        char desc[96];
        snprintf(desc, sizeof desc, "add_rmsnorm n=%d dim=%d%s", n, dim, alias ? " y=h" : "");
        float *got[2][2];   /* [parts, fused][x, y] */
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            if (!backend_supports(t->be, BACKEND_OP_ADD_RMSNORM, 0)) continue;
            struct tensor *pw = place(t, &host, 1);
            for (int f = 0; f < 2; f++) {
                struct backend_buf bx = buf_up(t, x, len * 4), bh = buf_up(t, h, len * 4), by = { 0 };
                if (!alias) by = buf_up(t, NULL, len * 4);
                float *y = alias ? bh.data : by.data;
                int rc = f ? BE_OP(t->c, add_rmsnorm, y, bx.data, bh.data, pw, n, dim, 1e-6f)
                           : BE_OP(t->c, add, bx.data, bh.data, (long)len);
                if (!f && !rc) rc = BE_OP(t->c, rmsnorm, y, bx.data, pw, n, dim, 1e-6f);
                got[f][0] = tu_xnew(len * 4);
                got[f][1] = tu_xnew(len * 4);
                buf_down(t, got[f][0], &bx, len * 4);
                buf_down(t, got[f][1], alias ? &bh : &by, len * 4);
                sync_ok(t, rc, desc);
                buf_drop(t, &bx);
                buf_drop(t, &bh);
                if (!alias) buf_drop(t, &by);
            }
            fused_judge(b, !memcmp(got[0][0], got[1][0], len * 4) && !memcmp(got[0][1], got[1][1], len * 4), desc);
            for (int f = 0; f < 2; f++) { free(got[f][0]); free(got[f][1]); }
            free(pw);
        }
        free(x);
        free(h);
        free(w);
    }
}

/* matmuls against each matrix's matmul: k = 1..3 matrices of one K (a
 * multiple of 256, so every type takes it), each of the first's type or
 * another, rows not a multiple of 16; some steps past the driver's token
 * block of 64. */
static void test_matmuls(int nc) {
    uint32_t types[N_WTYPES];
    const int nt = selected_wtypes(types);
    if (!nt) return;
    for (int i = 0; i < nc; i++) {
        const int k = rnd_in(1, BACKEND_MATMULS_MAX), n = !g_large && !rnd(4) ? rnd_in(65, CTX_TOKENS) : draw_tokens();
        const int64_t K = 256 * (int64_t)rnd_in(1, 3);
        const bool pack = rnd(2);
        struct tensor host[BACKEND_MATMULS_MAX];
        char desc[160];
        int at = snprintf(desc, sizeof desc, "matmuls n=%d K=%lld%s:", n, (long long)K, pack ? " packed" : "");
        for (int m = 0; m < k; m++) {
            const uint32_t ty = m && rnd(2) ? host[0].type : types[rnd(nt)];
            host[m] = rand_weight(ty, K, rnd_in(1, 70));
            at += snprintf(desc + at, sizeof desc - (size_t)at, " %s x %lld", dtype_name(ty), (long long)host[m].ne1);
        }
        float *x = tu_xnew((size_t)n * (size_t)K * 4);
        for (size_t e = 0; e < (size_t)n * (size_t)K; e++) x[e] = gauss();
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            if (!backend_supports(t->be, BACKEND_OP_MATMULS, 0)) continue;
            struct tensor *pw = place(t, host, k);
            /* half the cases in the interleaved layout: place() packs only a backend's first tensors */
            void *packed[BACKEND_MATMULS_MAX] = { NULL };
            for (int m = 0; m < k && pack && !strcmp(t->act, "q8") && !t->device; m++)
                if (pw[m].layout == TENSOR_ROWS && qmm_supports(pw[m].type, K)) {
                    packed[m] = tu_xnew(qmm_packed_bytes(&pw[m]) + 64);
                    uint8_t *p64 = (uint8_t *)(((uintptr_t)packed[m] + 63) & ~(uintptr_t)63);
                    qmm_pack(&host[m], p64);   /* from the host rows: the strict backend walls its own off */
                    pw[m].data = p64;
                    pw[m].layout = TENSOR_Q8X16;
                }
            struct backend_buf bx = buf_up(t, x, (size_t)n * (size_t)K * 4), by[2][BACKEND_MATMULS_MAX];
            struct matmuls_args a = { .k = k, .n = n, .x = bx.data };
            int rc = 0;
            for (int f = 0; f < 2; f++) {   /* the separate matmuls, then the fused op */
                for (int m = 0; m < k; m++) {
                    by[f][m] = buf_up(t, NULL, (size_t)n * (size_t)host[m].ne1 * 4);
                    a.y[m] = by[f][m].data;
                    a.w[m] = &pw[m];
                    if (!f && !rc) rc = BE_OP(t->c, matmul, a.y[m], a.w[m], a.x, n);
                }
                if (f && !rc) rc = BE_OP(t->c, matmuls, &a);
            }
            bool same = true;
            for (int m = 0; m < k; m++) {
                const size_t bytes = (size_t)n * (size_t)host[m].ne1 * 4;
                float *got[2] = { tu_xnew(bytes), tu_xnew(bytes) };
                for (int f = 0; f < 2; f++) buf_down(t, got[f], &by[f][m], bytes);
                sync_ok(t, rc, desc);
                same = same && !memcmp(got[0], got[1], bytes);
                for (int f = 0; f < 2; f++) free(got[f]), buf_drop(t, &by[f][m]);
            }
            fused_judge(b, same, desc);
            buf_drop(t, &bx);
            for (int m = 0; m < k; m++) free(packed[m]);
            free(pw);
        }
        for (int m = 0; m < k; m++) free((void *)host[m].data);
        free(x);
    }
}

/* rope_kv_store against rope(q), rope(k), kv_store: the rotated q and k and
 * the pool's bytes, every KV type, slots skipped now and then. */
static void test_rope_kv_store(int nc) {
    for (int i = 0; i < nc; i++) {
        const enum kv_type type = (enum kv_type)(i % KV_TYPE_COUNT_);
        const int nkv = rnd_in(1, 4), g = rnd_in(1, 4), hd = g_large ? 128 : 2 * rnd_in(1, 64);
        const int nh = nkv * g, bs = k_block_sizes[rnd(4)], n = draw_tokens();
        const int n_blocks = (n + bs - 1) / bs + rnd_in(0, 2), n_slots = n_blocks * bs;
        const size_t lq = (size_t)n * nh * hd, lk = (size_t)n * nkv * hd;
        float *q = tu_xnew(lq * 4), *k = tu_xnew(lk * 4), *v = tu_xnew(lk * 4);
        int32_t *pos = tu_xnew((size_t)n * 4), *slots = tu_xnew((size_t)n * 4), *perm = tu_xnew((size_t)n_slots * 4);
        for (size_t e = 0; e < lq; e++) q[e] = gauss();
        for (size_t e = 0; e < lk; e++) { k[e] = gauss(); v[e] = gauss(); }
        for (int s = 0; s < n_slots; s++) perm[s] = s;
        for (int s = n_slots - 1; s > 0; s--) { int j = rnd(s + 1), x = perm[s]; perm[s] = perm[j]; perm[j] = x; }
        for (int t = 0; t < n; t++) {
            pos[t] = rnd(8192);
            slots[t] = rnd(8) ? perm[t] : -1;
        }
        free(perm);
        const struct rope_params rp = { .n_rot = rnd(3) ? hd : 2 * rnd_in(1, hd / 2), .theta = 10000.0f,
                                        .neox = rnd(2), .attn_factor = rnd(3) ? 0.0f : 1.25f };
        struct pool_img img0, got[2];
        pool_init(&img0, type, n_blocks, bs, nkv, hd);
        pool_fill(&img0, 0xff);
        char desc[128];
        snprintf(desc, sizeof desc, "rope_kv_store %s heads=%d/%d head_dim=%d n_rot=%d block_size=%d n=%d",
                 k_kv_names[type], nh, nkv, hd, rp.n_rot, bs, n);
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            if (!backend_supports(t->be, BACKEND_OP_ROPE_KV_STORE, 0)) continue;
            float *qk[2][2];
            for (int f = 0; f < 2; f++) {
                struct pool_dev d;
                pool_init(&got[f], type, n_blocks, bs, nkv, hd);
                pool_up(t, &img0, &d);
                struct backend_buf bq = buf_up(t, q, lq * 4), bk = buf_up(t, k, lk * 4), bv = buf_up(t, v, lk * 4),
                                   bp = buf_up(t, pos, (size_t)n * 4), bsl = buf_up(t, slots, (size_t)n * 4);
                const struct rope_kv_args a = { .n = n, .n_head = nh, .n_head_kv = nkv, .head_dim = hd, .q = bq.data,
                                                .k = bk.data, .v = bv.data, .pos = bp.data, .slots = bsl.data,
                                                .rope = rp, .kv = d.view };
                int rc = 0;
                if (f) rc = BE_OP(t->c, rope_kv_store, &a);
                else {
                    rc = BE_OP(t->c, rope, a.q, n, nh, hd, a.pos, &rp);
                    if (!rc) rc = BE_OP(t->c, rope, a.k, n, nkv, hd, a.pos, &rp);
                    if (!rc) rc = BE_OP(t->c, kv_store, &d.view, a.slots, a.k, a.v, n);
                }
                qk[f][0] = tu_xnew(lq * 4);
                qk[f][1] = tu_xnew(lk * 4);
                buf_down(t, qk[f][0], &bq, lq * 4);
                buf_down(t, qk[f][1], &bk, lk * 4);
                pool_down(t, &d, &got[f]);
                sync_ok(t, rc, desc);
                pool_drop(t, &d);
                buf_drop(t, &bq);
                buf_drop(t, &bk);
                buf_drop(t, &bv);
                buf_drop(t, &bp);
                buf_drop(t, &bsl);
            }
            fused_judge(b, !memcmp(qk[0][0], qk[1][0], lq * 4) && !memcmp(qk[0][1], qk[1][1], lk * 4) &&
                               pool_equal(&got[0], &got[1]), desc);
            for (int f = 0; f < 2; f++) { free(qk[f][0]); free(qk[f][1]); pool_deinit(&got[f]); }
        }
        pool_deinit(&img0);
        free(q);
        free(k);
        free(v);
        free(pos);
        free(slots);
    }
}

/* Plain softmax attention in double of token query qrow (n_head * hd) at
 * position pos over K/V rows (positions, nkv * hd) of its sequence, with
 * positions before lo masked (sliding window), scores soft-capped when
 * softcap > 0, and head h's sink logit sinks[h] (when sinks is not NULL)
 * one more term of the softmax's sum, with no value. */
static void ref_attention(const double *K, const double *V, int nkv, int hd, int n_head, const float *qrow, int lo,
                          int pos, double scale, double softcap, const float *sinks, double *out) {
    const int g = n_head / nkv, w = nkv * hd;
    double *sc = tu_xnew((size_t)(pos + 1) * sizeof *sc);
    for (int h = 0; h < n_head; h++) {
        const int hk = h / g;
        double mx = sinks ? sinks[h] : -INFINITY, sum = sinks ? 1.0 : 0.0;   /* sum: exp(sink - mx) once mx is known */
        for (int p = lo; p <= pos; p++) {
            const double *kr = K + (size_t)p * w + (size_t)hk * hd;
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)qrow[h * hd + i] * kr[i];
            sc[p] = d * scale;
            if (softcap > 0) sc[p] = softcap * tanh(sc[p] / softcap);
            mx = sc[p] > mx ? sc[p] : mx;
        }
        if (sinks) sum = exp(sinks[h] - mx);
        for (int p = lo; p <= pos; p++) { sc[p] = exp(sc[p] - mx); sum += sc[p]; }
        for (int i = 0; i < hd; i++) out[h * hd + i] = 0;
        for (int p = lo; p <= pos; p++) {
            const double *vr = V + (size_t)p * w + (size_t)hk * hd;
            for (int i = 0; i < hd; i++) out[h * hd + i] += sc[p] / sum * vr[i];
        }
    }
    free(sc);
}

/* Whether the CPU kernel sets quantize the queries (struct pa_q8 in
 * cpu_internal.h): int8 K with head sizes that are a multiple of 32, up to
 * 64 query heads per kv head and 16384 of their elements. */
static bool pa_q8_applies(enum kv_type type, int hd, int g) {
    return type == KV_INT8 && hd % 32 == 0 && g <= 64 && g * hd <= 16384;
}

/* Query row x (hd) as the CPU kernels see it against the stored K: where
 * pa_q8_applies, int8 codes (nearest, ties to even) times amax / 127; the
 * rest x itself. */
static void pa_query_as_kernels(const float *x, int hd, int g, enum kv_type type, float *out) {
    if (!pa_q8_applies(type, hd, g)) {
        memcpy(out, x, (size_t)hd * sizeof *out);
        return;
    }
    float amax = 0;
    for (int i = 0; i < hd; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float inv = amax != 0 ? 127.0f / amax : 0.0f, sc = amax / 127.0f;
    for (int i = 0; i < hd; i++) out[i] = nearbyintf(x[i] * inv) * sc;
}

#define PA_MAX_SEQS 4

/* Fixed cases for the CUDA head-size kernels (attention.cu: head_dim 64, 128, 256, partitions of
 * 256 positions from the start of a token's span): every KV type at each head size, blocks of 16
 * and of 5 (KV blocks across the 32-position tiles), 1, 2 or 9 tokens (a decode token each of two
 * sequences, a 7-token chunk of a third), a first context of 256 (one partition), 257 and 512 (two:
 * one position over, and exactly), 1,025 and 2,100 (five and nine), every fourth case a window of
 * 300 (two partitions not aligned to 256), sinks and soft-caps now and then; on every backend each
 * token computed alone must give the batch's bytes (batch invariance). */
static const int k_pa_fixed_hd[] = { 64, 128, 256 };
static const int k_pa_fixed_L[] = { 257, 512, 1025, 2100, 256 };
#define N_PA_FIXED ((int)(sizeof k_pa_fixed_hd / sizeof *k_pa_fixed_hd) * KV_TYPE_COUNT_)
/* Fixed prefill cases for the CUDA tensor-core kernel (attention_prefill.cu: steps of >= 16 tokens,
 * tiles of 64 query rows, K/V tiles of 64 or 32 positions): every KV type at each head size, a
 * 65-token chunk of one sequence at a context of 65 (the whole prompt), 300 or 1,100, every other
 * case with a 20-token chunk of a second sequence in the same step (query tiles of two sequences,
 * tokens shuffled), g = 4, 7 or 1 query heads per kv head (tiles across tokens), blocks of 16 or 5,
 * a window of 40 (inside the chunk) every fourth case, sinks and soft-caps now and then.  On the CPU
 * sets and on CUDA's exact mode ("cuda", KVLLM_ACT=f32) tokens 0, n / 2 and n - 1 alone give the
 * batch's bytes; CUDA's fast mode computes a token alone with the decode kernel: only the bounds. */
static const int k_pa_prefill_L[] = { 65, 300, 1100 };
static const int k_pa_prefill_g[] = { 4, 7, 1 };
#define N_PA_PREFILL N_PA_FIXED

/* kv_store then paged attention: 1-4 sequences, each with a decode token
 * or a prefill chunk ending at its last position, tokens in random order;
 * shuffled blocks, a dense block table padded with a block never stored
 * (NaN bytes: reading it, or any slot not stored, poisons the output).
 * Then (not at large shapes) the N_PA_FIXED fixed cases above. */
static void test_paged_attention(int nc) {
    static const int gs[6] = { 1, 2, 3, 4, 6, 8 };
    const int n_all = nc + (g_large ? 0 : N_PA_FIXED + N_PA_PREFILL);
    for (int ci = 0; ci < n_all; ci++) {
        const bool fixed = ci >= nc && ci < nc + N_PA_FIXED, pf = ci >= nc + N_PA_FIXED;
        const int fi = ci - nc, pi = ci - nc - N_PA_FIXED;
        const enum kv_type type = (enum kv_type)((pf ? pi : fixed ? fi : ci) % KV_TYPE_COUNT_);
        /* large: Llama-3-8B's 32 heads on 8 KV heads or Qwen2.5-7B's 28 on 4, head_dim 128, blocks of 16,
         * a first sequence of 1k-8k positions, chunks of 1 or 65 tokens */
        const int g = pf ? k_pa_prefill_g[pi % 3] : fixed ? 4 : g_large ? (rnd(2) ? 4 : 7) : gs[rnd(6)];
        const int nkv = fixed || pf ? 2 : g_large ? (g == 4 ? 8 : 4) : rnd_in(1, g >= 6 ? 2 : 4), n_head = g * nkv;
        const int hd = pf ? k_pa_fixed_hd[pi / KV_TYPE_COUNT_] : fixed ? k_pa_fixed_hd[fi / KV_TYPE_COUNT_]
                       : g_large ? 128 : rnd(4) ? 8 * rnd_in(1, 16) : rnd_in(8, 128);
        const int bs = pf ? (pi % 2 ? 5 : 16) : fixed ? (fi % 2 ? 5 : 16) : g_large ? 16 : k_block_sizes[rnd(4)];
        const int w = nkv * hd;
        const bool long_ctx = g_large || rnd(6) == 0, outliers = rnd(4) == 0;
        const int n_seqs = pf ? 1 + pi % 2 : fixed ? 1 + fi % 3 : rnd_in(1, g_large ? 2 : PA_MAX_SEQS);
        const int max_tokens = g_large ? LARGE_TOKENS : MAX_TOKENS;
        int L[PA_MAX_SEQS], chunk[PA_MAX_SEQS], n = 0, max_L = 0;
        for (int s = 0; s < n_seqs; s++) {
            L[s] = long_ctx && s == 0 ? (g_large ? rnd_in(1024, LARGE_CTX - 100) : rnd_in(1000, MAX_CTX - 100))
                                      : rnd_in(1, rnd(3) ? 64 : 300);
            const int left = max_tokens - n - (n_seqs - s - 1), cap = long_ctx && s == 0 && !g_large ? 4 : left;
            /* large: 1, 65 or 130 tokens (the prefill kernel's shapes), as many as the step has room for */
            chunk[s] = g_large ? k_large_tokens[rnd(3)] : rnd(2) ? 1 : rnd_in(1, L[s] < cap ? L[s] : cap);
            chunk[s] = chunk[s] < left ? chunk[s] : left;
            if (fixed) {
                if (s == 0) L[s] = k_pa_fixed_L[fi % (int)(sizeof k_pa_fixed_L / sizeof *k_pa_fixed_L)];
                else L[s] = rnd_in(7, 300);
                chunk[s] = s < 2 ? 1 : 7;
            }
            if (pf) {
                L[s] = s == 0 ? k_pa_prefill_L[pi % 3] : rnd_in(20, 300);
                chunk[s] = s == 0 ? 65 - 20 * (n_seqs - 1) : 20;
            }
            chunk[s] = chunk[s] < L[s] ? chunk[s] : L[s];
            n += chunk[s];
            max_L = L[s] > max_L ? L[s] : max_L;
        }
        const int window = pf      ? (pi % 4 == 1 ? 40 : 0)
                           : fixed ? (fi % 4 == 1 ? 300 : 0)
                                   : rnd(3) == 0 ? rnd_in(1, max_L) : 0;
        const float scale = 1.0f / sqrtf((float)hd) * (rnd(4) ? 1.0f : 0.5f + rng_f32(&g_rng));
        const float softcap = pf ? (pi % 5 == 3 ? 2.0f : 0.0f) : fixed ? (fi % 5 == 3 ? 2.0f : 0.0f)
                                    : rnd(4) == 0 ? 0.5f + rng_f32(&g_rng) * 4 : 0.0f;   /* small: it must bite */
        /* sinks: from well below to well above the scores, so that they weigh from nothing to nearly all */
        const bool with_sinks = pf ? pi % 3 == 2 : fixed ? fi % 3 == 2 : rnd(3) == 0;
        float *sinks = with_sinks ? tu_xnew((size_t)n_head * sizeof *sinks) : NULL;
        for (int h = 0; sinks && h < n_head; h++) sinks[h] = gauss() * 4;

        /* blocks: shuffled; the last one is the poison block */
        int nb[PA_MAX_SEQS], nb_total = 1, max_blocks = 0;
        for (int s = 0; s < n_seqs; s++) {
            nb[s] = (L[s] + bs - 1) / bs;
            nb_total += nb[s];
            max_blocks = nb[s] > max_blocks ? nb[s] : max_blocks;
        }
        nb_total += rnd_in(0, 2);
        max_blocks += rnd_in(0, 2);
        int32_t *perm = tu_xnew((size_t)nb_total * sizeof *perm);
        for (int b = 0; b < nb_total; b++) perm[b] = b;
        for (int b = nb_total - 1; b > 0; b--) { int j = rnd(b + 1), x = perm[b]; perm[b] = perm[j]; perm[j] = x; }
        const int32_t poison = perm[nb_total - 1];
        int32_t *table = tu_xnew((size_t)n_seqs * max_blocks * sizeof *table);
        for (int s = 0, next = 0; s < n_seqs; s++)
            for (int b = 0; b < max_blocks; b++) table[(size_t)s * max_blocks + b] = b < nb[s] ? perm[next++] : poison;

        /* K/V of each sequence (unquantized), and the rows to store in random order with padding rows */
        float *kin[PA_MAX_SEQS], *vin[PA_MAX_SEQS];
        int n_store = 0;
        for (int s = 0; s < n_seqs; s++) {
            kin[s] = tu_xnew((size_t)L[s] * w * sizeof(float));
            vin[s] = tu_xnew((size_t)L[s] * w * sizeof(float));
            for (long e = 0; e < (long)L[s] * w; e++) { kin[s][e] = gauss(); vin[s][e] = gauss(); }
            for (int p = 0; p < L[s] && outliers; p++)
                for (int h = 0; h < nkv; h++) {
                    kin[s][(size_t)p * w + (size_t)h * hd + (size_t)(h * 5 % hd)] *= 8;
                    if (p % 13 == 0) kin[s][(size_t)p * w + (size_t)h * hd + (size_t)((h * 5 + 1 + p % 7) % hd)] *= 8;
                }
            n_store += L[s];
        }
        const int n_pad = rnd_in(0, 3);
        n_store += n_pad;
        int32_t *slots = tu_xnew((size_t)n_store * sizeof *slots);
        float *ks = tu_xnew((size_t)n_store * w * sizeof *ks), *vs = tu_xnew((size_t)n_store * w * sizeof *vs);
        int32_t *order = tu_xnew((size_t)n_store * sizeof *order);
        for (int r = 0; r < n_store; r++) order[r] = r;
        for (int r = n_store - 1; r > 0; r--) { int j = rnd(r + 1), x = order[r]; order[r] = order[j]; order[j] = x; }
        for (int r = 0, s = 0, p = 0; r < n_store; r++) {
            const int dst = order[r];
            if (s < n_seqs) {
                slots[dst] = table[(size_t)s * max_blocks + p / bs] * bs + p % bs;
                memcpy(ks + (size_t)dst * w, kin[s] + (size_t)p * w, (size_t)w * sizeof *ks);
                memcpy(vs + (size_t)dst * w, vin[s] + (size_t)p * w, (size_t)w * sizeof *vs);
                if (++p == L[s]) { s++; p = 0; }
            } else {
                slots[dst] = -1;
                for (int e = 0; e < w; e++) ks[(size_t)dst * w + e] = vs[(size_t)dst * w + e] = NAN;
            }
        }

        /* tokens: each sequence's chunk, shuffled */
        float *q = tu_xnew((size_t)n * n_head * hd * sizeof *q);
        int32_t *pos = tu_xnew((size_t)n * sizeof *pos), *seq = tu_xnew((size_t)n * sizeof *seq);
        for (int s = 0, t = 0; s < n_seqs; s++)
            for (int c = 0; c < chunk[s]; c++, t++) { seq[t] = s; pos[t] = L[s] - chunk[s] + c; }
        for (int t = n - 1; t > 0; t--) {
            int j = rnd(t + 1), x = pos[t];
            pos[t] = pos[j]; pos[j] = x;
            x = seq[t]; seq[t] = seq[j]; seq[j] = x;
        }
        for (long e = 0; e < (long)n * n_head * hd; e++) q[e] = gauss();

        char desc[200];
        snprintf(desc, sizeof desc,
                 "paged_attention %s heads=%d/%d head_dim=%d block_size=%d seqs=%d ctx=%d..%d tokens=%d window=%d softcap=%g%s%s",
                 k_kv_names[type], n_head, nkv, hd, bs, n_seqs, L[0], max_L, n, window, softcap,
                 outliers ? " outliers" : "", sinks ? " sinks" : "");
        struct pool_img img0, img[MAX_BE];
        pool_init(&img0, type, nb_total, bs, nkv, hd);
        pool_fill(&img0, 0xff);
        const size_t len = (size_t)n * n_head * hd;
        float *outs[MAX_BE];
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            struct pool_dev d;
            pool_init(&img[b], type, nb_total, bs, nkv, hd);
            pool_up(t, &img0, &d);
            struct backend_buf bsl = buf_up(t, slots, (size_t)n_store * 4), bk = buf_up(t, ks, (size_t)n_store * w * 4),
                               bv = buf_up(t, vs, (size_t)n_store * w * 4);
            /* stored in pieces, as prefill chunks and decode steps store them */
            int rc = 0;
            for (int r = 0; r < n_store;) {
                const int want = rnd_in(1, MAX_TOKENS), m = want < n_store - r ? want : n_store - r;
                int rc1 = BE_OP(t->c, kv_store, &d.view, (int32_t *)bsl.data + r, (float *)bk.data + (size_t)r * w,
                                (float *)bv.data + (size_t)r * w, m);
                rc = rc ? rc : rc1;
                r += m;
            }
            struct backend_buf bq = buf_up(t, q, len * 4), bp = buf_up(t, pos, (size_t)n * 4),
                               bsq = buf_up(t, seq, (size_t)n * 4),
                               bt = buf_up(t, table, (size_t)n_seqs * max_blocks * 4), bo = buf_up(t, NULL, len * 4),
                               bsk = buf_up(t, sinks, sinks ? (size_t)n_head * 4 : 4);
            int hi = 0;   /* the batch's longest context: a GPU sizes its grid for it */
            for (int tk = 0; tk < n; tk++) hi = pos[tk] + 1 > hi ? pos[tk] + 1 : hi;
            struct paged_attn_args a = {
                .n_tokens = n, .n_head = n_head, .n_head_kv = nkv, .head_dim = hd, .q = bq.data, .pos = bp.data,
                .seq = bsq.data, .block_table = bt.data, .max_blocks = max_blocks, .kv = d.view, .scale = scale,
                .softcap = softcap, .window = window, .sinks = sinks ? bsk.data : NULL, .out = bo.data,
                .ctx_hi = hi,
            };
            int rc2 = BE_OP(t->c, paged_attention, &a);
            outs[b] = tu_xnew(len * sizeof(float));
            buf_down(t, outs[b], &bo, len * 4);
            pool_down(t, &d, &img[b]);
            sync_ok(t, rc ? rc : rc2, desc);
            /* batch invariance (the fixed cases): each token alone gives the batch's bytes */
            for (int tk = 0; (fixed || (pf && !fast_device(b))) && n > 1 && tk < n; tk++) {
                if (pf && tk != 0 && tk != n / 2 && tk != n - 1) continue;   /* the prefill cases: three tokens */
                const size_t row = (size_t)n_head * hd;
                float *one = tu_xnew(row * sizeof *one);
                struct backend_buf b1 = buf_up(t, NULL, row * 4);
                struct paged_attn_args a1 = a;
                a1.n_tokens = 1;
                a1.q = (const float *)bq.data + (size_t)tk * row;
                a1.pos = (const int32_t *)bp.data + tk;
                a1.seq = (const int32_t *)bsq.data + tk;
                a1.out = b1.data;
                a1.ctx_hi = pos[tk] + 1;   /* a smaller grid alone than in the batch: the same bytes */
                rc2 = BE_OP(t->c, paged_attention, &a1);
                buf_down(t, one, &b1, row * 4);
                sync_ok(t, rc2, desc);
                CHECK_MSG(memcmp(one, outs[b] + (size_t)tk * row, row * 4) == 0,
                          "%s %s: token %d alone differs from the batch", t->name, desc, tk);
                buf_drop(t, &b1);
                free(one);
            }
            pool_drop(t, &d);
            struct backend_buf *all[] = { &bsl, &bk, &bv, &bq, &bp, &bsq, &bt, &bo, &bsk };
            for (size_t k = 0; k < sizeof all / sizeof *all; k++) buf_drop(t, all[k]);
        }

        /* the store: identical bytes everywhere */
        for (int b = 0; b < g_nbe; b++) {
            struct stat_ *s = &g_st[b][OP_KV_STORE];
            s->cases++;
            const bool same = pool_equal(&img[b], &img[0]);
            CHECK_MSG(same, "%s %s: stored bytes differ from scalar's", g_be[b].name, desc);
            s->vs_scalar = dmax(s->vs_scalar, same ? 0 : INFINITY);
        }
        /* references: over the stored values (the scalar backend's storage) and over the inputs */
        double *ref_st = tu_xnew(len * sizeof *ref_st), *ref_in = tu_xnew(len * sizeof *ref_in);
        /* the CPU sets quantize an int8-K item's queries (struct pa_q8); the CUDA kernels use them as they
         * are, so a device is held to the reference over the stored values with the query unquantized */
        double *ref_dev = pa_q8_applies(type, hd, g) ? tu_xnew(len * sizeof *ref_dev) : NULL;
        double *Ks[PA_MAX_SEQS], *Vs[PA_MAX_SEQS], *Ki[PA_MAX_SEQS], *Vi[PA_MAX_SEQS];
        for (int s = 0; s < n_seqs; s++) {
            const size_t m = (size_t)L[s] * w;
            Ks[s] = tu_xnew(m * sizeof(double)); Vs[s] = tu_xnew(m * sizeof(double));
            Ki[s] = tu_xnew(m * sizeof(double)); Vi[s] = tu_xnew(m * sizeof(double));
            for (int p = 0; p < L[s]; p++)
                for (int h = 0; h < nkv; h++) {
                    const size_t slot = (size_t)table[(size_t)s * max_blocks + p / bs] * bs + (size_t)(p % bs);
                    const size_t row = pool_row(&img[0], slot, h);
                    for (int e = 0; e < hd; e++) {
                        const size_t o = (size_t)p * w + (size_t)h * hd + (size_t)e;
                        Ks[s][o] = pool_elem(&img[0], false, row, e);
                        Vs[s][o] = pool_elem(&img[0], true, row, e);
                        Ki[s][o] = kin[s][o];
                        Vi[s][o] = vin[s][o];
                    }
                }
        }
        float *qst = tu_xnew((size_t)n_head * hd * sizeof *qst);
        for (int t = 0; t < n; t++) {
            const int s = seq[t], lo = window > 0 && pos[t] + 1 > window ? pos[t] + 1 - window : 0;
            const float *qr = q + (size_t)t * n_head * hd;
            for (int h = 0; h < n_head; h++) pa_query_as_kernels(qr + (size_t)h * hd, hd, g, type, qst + (size_t)h * hd);
            ref_attention(Ks[s], Vs[s], nkv, hd, n_head, qst, lo, pos[t], scale, softcap, sinks,
                          ref_st + (size_t)t * n_head * hd);
            ref_attention(Ki[s], Vi[s], nkv, hd, n_head, qr, lo, pos[t], scale, softcap, sinks,
                          ref_in + (size_t)t * n_head * hd);
            if (ref_dev)
                ref_attention(Ks[s], Vs[s], nkv, hd, n_head, qr, lo, pos[t], scale, softcap, sinks,
                              ref_dev + (size_t)t * n_head * hd);
        }
        free(qst);
        /* a GPU's tensor-core kernel, where it takes the step (cuda_plan.h) */
        const double tol_pf = cuda_pf_takes(n, hd, true) ? k_pa_prefill[type] : 0;
        g_tol_dev_q8 = tol_pf > 0 ? tol_pf : -1;
        judge_dev(OP_PAGED_ATTN, outs, len, ref_st, ref_dev, k_pa_simd[type], k_pa_stored[type], desc);
        g_tol_dev_q8 = -1;
        const double tol_in0 = outliers ? k_pa_input_outl[type] : k_pa_input[type];
        for (int b = 0; b < g_nbe; b++) {
            const double e0 = rel_err_floor(outs[b], outs[0], len, g_den_floor);
            const double e1 = rel_err_floor(outs[b], g_be[b].device && ref_dev ? ref_dev : ref_st, len, g_den_floor);
            const double e2 = rel_err_floor(outs[b], ref_in, len, g_den_floor);
            const double tol_in = tol_in0 + (fast_device(b) ? tol_pf : 0);
            CHECK_MSG(e2 <= tol_in, "%s %s vs the unquantized inputs: rel err %.3g > %.3g", g_be[b].name, desc, e2,
                      tol_in);
            g_st[b][OP_PAGED_ATTN].vs_input = dmax(g_st[b][OP_PAGED_ATTN].vs_input, e2);
            double *wst = g_pa_worst[b][type];
            wst[0] = dmax(wst[0], e0);
            wst[1] = dmax(wst[1], e1);
            if (!outliers) wst[2] = dmax(wst[2], e2);
        }
        for (int s = 0; s < n_seqs; s++) {
            free(Ks[s]); free(Vs[s]); free(Ki[s]); free(Vi[s]); free(kin[s]); free(vin[s]);
        }
        for (int b = 0; b < g_nbe; b++) { free(outs[b]); pool_deinit(&img[b]); }
        pool_deinit(&img0);
        free(ref_st); free(ref_in); free(ref_dev); free(perm); free(table); free(slots); free(ks); free(vs); free(order);
        free(q); free(pos); free(seq); free(sinks);
    }
}

/* A prefill chunk whose last position's K and V rows are infinite (f16:
 * too large to store; f32: inf itself): the chunk's earlier tokens never
 * attend that position, so each gives alone the batch's bytes and stays
 * finite (a step that groups tokens must not let a row see past its own
 * end, even at weight 0: 0 times inf is NaN).  Every backend, f32 and f16
 * K/V; SmolLM2's heads (9 / 3 x 64: groups of 8 tokens), Gemma 3 270M's
 * (4 / 1 x 256: 6) and 8 query heads on one kv head (64: 3). */
static void test_pa_future_inf(void) {
    static const struct { int n_head, nkv, hd; } shapes[] = { { 9, 3, 64 }, { 4, 1, 256 }, { 8, 1, 64 } };
    for (int si = 0; si < 3; si++)
        for (int ti = 0; ti < 2; ti++) {
            const enum kv_type type = ti ? KV_F16 : KV_F32;
            const int n_head = shapes[si].n_head, nkv = shapes[si].nkv, hd = shapes[si].hd, bs = 16;
            const int L = rnd_in(70, 200), n = 8, w = nkv * hd, nb = (L + bs - 1) / bs;
            const size_t row = (size_t)n_head * hd;
            float *kv = tu_xnew((size_t)L * w * sizeof *kv), *vv = tu_xnew((size_t)L * w * sizeof *vv);
            for (size_t e = 0; e < (size_t)L * w; e++) kv[e] = gauss(), vv[e] = gauss();
            for (int e = 0; e < w; e++)
                kv[(size_t)(L - 1) * w + e] = vv[(size_t)(L - 1) * w + e] = type == KV_F32 ? INFINITY : 1e6f;
            int32_t *slots = tu_xnew((size_t)L * sizeof *slots), table[16], pos[8], seq[8] = { 0 };
            for (int p = 0; p < L; p++) slots[p] = p;
            for (int b = 0; b < nb; b++) table[b] = b;
            for (int t = 0; t < n; t++) pos[t] = L - n + t;
            float *q = tu_xnew((size_t)n * row * sizeof *q);
            for (size_t e = 0; e < (size_t)n * row; e++) q[e] = gauss();
            char desc[96];
            snprintf(desc, sizeof desc, "paged_attention %s heads=%d/%d head_dim=%d ctx=%d, the last K/V infinite",
                     k_kv_names[type], n_head, nkv, hd, L);
            for (int b = 0; b < g_nbe; b++) {
                struct tbe *t = &g_be[b];
                struct pool_img img;
                struct pool_dev d;
                pool_init(&img, type, nb, bs, nkv, hd);
                pool_fill(&img, 0);
                pool_up(t, &img, &d);
                struct backend_buf bsl = buf_up(t, slots, (size_t)L * 4), bk = buf_up(t, kv, (size_t)L * w * 4),
                                   bv = buf_up(t, vv, (size_t)L * w * 4), bq = buf_up(t, q, (size_t)n * row * 4),
                                   bp = buf_up(t, pos, sizeof pos), bs_ = buf_up(t, seq, sizeof seq),
                                   bt = buf_up(t, table, (size_t)nb * 4), bo = buf_up(t, NULL, (size_t)n * row * 4),
                                   b1 = buf_up(t, NULL, row * 4);
                int rc = BE_OP(t->c, kv_store, &d.view, bsl.data, bk.data, bv.data, L);
                struct paged_attn_args a = { .n_tokens = n, .n_head = n_head, .n_head_kv = nkv, .head_dim = hd,
                                             .q = bq.data, .pos = bp.data, .seq = bs_.data, .block_table = bt.data,
                                             .max_blocks = nb, .kv = d.view, .scale = 0.125f, .out = bo.data,
                                             .ctx_hi = L };
                if (!rc) rc = BE_OP(t->c, paged_attention, &a);
                float *all = tu_xnew((size_t)n * row * sizeof *all), *one = tu_xnew(row * sizeof *one);
                buf_down(t, all, &bo, (size_t)n * row * 4);
                sync_ok(t, rc, desc);
                for (int tk = 0; tk < n - 1 && !fast_device(b); tk++) {
                    struct paged_attn_args a1 = a;
                    a1.n_tokens = 1;
                    a1.q = (const float *)bq.data + (size_t)tk * row;
                    a1.pos = (const int32_t *)bp.data + tk;
                    a1.seq = (const int32_t *)bs_.data;
                    a1.out = b1.data;
                    a1.ctx_hi = pos[tk] + 1;
                    rc = BE_OP(t->c, paged_attention, &a1);
                    buf_down(t, one, &b1, row * 4);
                    sync_ok(t, rc, desc);
                    bool finite = true;
                    for (size_t e = 0; e < row; e++) finite = finite && isfinite(one[e]);
                    CHECK_MSG(finite && memcmp(one, all + (size_t)tk * row, row * 4) == 0,
                              "%s %s: token %d (not attending the infinite row) %s", t->name, desc, tk,
                              finite ? "differs from the batch" : "alone is not finite");
                }
                free(all);
                free(one);
                struct backend_buf *bufs[] = { &bsl, &bk, &bv, &bq, &bp, &bs_, &bt, &bo, &b1 };
                for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++) buf_drop(t, bufs[k]);
                pool_drop(t, &d);
                pool_deinit(&img);
            }
            free(kv);
            free(vv);
            free(slots);
            free(q);
        }
}

/* ---- copy_blocks ---- */

static void test_copy_blocks(int nc) {
    for (int ci = 0; ci < nc; ci++) {
        const int n_layer = rnd_in(1, 3), n_blocks = rnd_in(2, 24);
        struct pool_img want[3], got[MAX_BE][3];
        for (int l = 0; l < n_layer; l++) {
            pool_init(&want[l], (enum kv_type)rnd(KV_TYPE_COUNT_), n_blocks, k_block_sizes[rnd(4)], rnd_in(1, 4),
                      rnd_in(1, 64));
            uint8_t *parts[4] = { want[l].k, want[l].v, (uint8_t *)want[l].ks, (uint8_t *)want[l].vs };
            for (int k = 0; k < 4; k++)
                for (size_t e = 0; parts[k] && e < (k < 2 ? want[l].data_bytes : want[l].scale_bytes); e++)
                    parts[k][e] = (uint8_t)rng_u64(&g_rng);
        }
        /* pairs (dst, src): distinct destinations, sources among the other
         * blocks (one may feed several), sometimes a no-op pair (b, b) */
        int32_t *perm = tu_xnew((size_t)n_blocks * sizeof *perm);
        int32_t (*pairs)[2] = tu_xnew((size_t)n_blocks * sizeof *pairs);
        for (int b = 0; b < n_blocks; b++) perm[b] = b;
        for (int b = n_blocks - 1; b > 0; b--) { int j = rnd(b + 1), x = perm[b]; perm[b] = perm[j]; perm[j] = x; }
        const int np = rnd_in(1, n_blocks / 2);
        int n_pairs = 0;
        for (int p = 0; p < np; p++) { pairs[n_pairs][0] = perm[p]; pairs[n_pairs++][1] = perm[np + rnd(np)]; }
        if (2 * np < n_blocks && rnd(3) == 0) { pairs[n_pairs][0] = pairs[n_pairs][1] = perm[2 * np]; n_pairs++; }
        for (int l = 0; l < n_layer; l++)
            for (int b = 0; b < MAX_BE; b++) pool_init(&got[b][l], want[l].type, n_blocks, want[l].bs, want[l].nkv, want[l].hd);
        char desc[160];
        int off = snprintf(desc, sizeof desc, "copy_blocks blocks=%d pairs=%d layers=%d:", n_blocks, n_pairs, n_layer);
        for (int l = 0; l < n_layer && off < (int)sizeof desc; l++)
            off += snprintf(desc + off, sizeof desc - (size_t)off, " %s/%d/%d/%d", k_kv_names[want[l].type], want[l].nkv,
                            want[l].hd, want[l].bs);
        for (int b = 0; b < g_nbe; b++) {
            struct tbe *t = &g_be[b];
            struct pool_dev d[3];
            struct kv_layer_view views[3];
            for (int l = 0; l < n_layer; l++) {
                pool_up(t, &want[l], &d[l]);
                views[l] = d[l].view;
            }
            int rc = BE_OP(t->c, copy_blocks, views, n_layer, (const int32_t(*)[2])pairs, n_pairs);
            for (int l = 0; l < n_layer; l++) pool_down(t, &d[l], &got[b][l]);
            sync_ok(t, rc, desc);
            for (int l = 0; l < n_layer; l++) pool_drop(t, &d[l]);
        }
        /* the expectation, from the layout: block b is rows [b * rows, (b + 1) * rows) */
        for (int l = 0; l < n_layer; l++) {
            struct pool_img *p = &want[l];
            const size_t rows = (size_t)p->bs * p->nkv, bb = rows * (size_t)p->hd * kv_elem_bytes(p->type);
            uint8_t *k0 = tu_xnew(p->data_bytes), *v0 = tu_xnew(p->data_bytes);
            float *ks0 = p->ks ? tu_xnew(p->scale_bytes) : NULL, *vs0 = p->vs ? tu_xnew(p->scale_bytes) : NULL;
            memcpy(k0, p->k, p->data_bytes);
            memcpy(v0, p->v, p->data_bytes);
            if (ks0) { memcpy(ks0, p->ks, p->scale_bytes); memcpy(vs0, p->vs, p->scale_bytes); }
            for (int i = 0; i < n_pairs; i++) {
                const size_t dst = (size_t)pairs[i][0], src = (size_t)pairs[i][1];
                memcpy(p->k + dst * bb, k0 + src * bb, bb);
                memcpy(p->v + dst * bb, v0 + src * bb, bb);
                if (ks0) {
                    memcpy(p->ks + dst * rows, ks0 + src * rows, rows * sizeof(float));
                    memcpy(p->vs + dst * rows, vs0 + src * rows, rows * sizeof(float));
                }
            }
            free(k0); free(v0); free(ks0); free(vs0);
        }
        for (int b = 0; b < g_nbe; b++) {
            struct stat_ *s = &g_st[b][OP_COPY_BLOCKS];
            s->cases++;
            int bad_ref = 0, bad_sc = 0, bad_twin = 0;
            for (int l = 0; l < n_layer; l++) {
                bad_ref += !pool_equal(&got[b][l], &want[l]);
                bad_sc += !pool_equal(&got[b][l], &got[0][l]);
                if (g_be[b].twin >= 0) bad_twin += !pool_equal(&got[b][l], &got[g_be[b].twin][l]);
            }
            CHECK_MSG(bad_ref == 0, "%s %s: %d layers differ from blocks moved by hand", g_be[b].name, desc, bad_ref);
            CHECK_MSG(bad_sc == 0, "%s %s: %d layers differ from scalar's", g_be[b].name, desc, bad_sc);
            CHECK_MSG(bad_twin == 0, "%s %s: %d layers differ from its twin's", g_be[b].name, desc, bad_twin);
            s->vs_ref = dmax(s->vs_ref, bad_ref ? INFINITY : 0);
            s->vs_scalar = dmax(s->vs_scalar, bad_sc ? INFINITY : 0);
        }
        for (int l = 0; l < n_layer; l++) {
            pool_deinit(&want[l]);
            for (int b = 0; b < MAX_BE; b++) pool_deinit(&got[b][l]);
        }
        free(perm);
        free(pairs);
    }
}

/* ---- error returns and the fail hook ---- */

static void test_errors(struct tbe *t) {
    /* a pool of one sequence: 4 positions of f32, one kv head of 8 */
    const int hd = 8, bs = 4, n = CTX_TOKENS + 1;
    struct pool_img img;
    pool_init(&img, KV_F32, 1, bs, 1, hd);
    pool_fill(&img, 0);
    float kv[4 * 8], *q = tu_xnew((size_t)n * hd * sizeof *q), out[CTX_TOKENS * 8];
    int32_t slots[4] = { 0, 1, 2, 3 }, table[1] = { 0 };
    int32_t *pos = tu_xnew((size_t)n * sizeof *pos), *seq = tu_xnew((size_t)n * 4);
    for (int e = 0; e < 4 * hd; e++) kv[e] = gauss();
    for (int e = 0; e < n * hd; e++) q[e] = gauss();
    for (int i = 0; i < n; i++) { pos[i] = i % 4; seq[i] = 0; }
    struct pool_dev d;
    pool_up(t, &img, &d);
    struct backend_buf bsl = buf_up(t, slots, sizeof slots), bk = buf_up(t, kv, sizeof kv), bq = buf_up(t, q, (size_t)n * hd * 4),
                       bp = buf_up(t, pos, (size_t)n * 4), bsq = buf_up(t, seq, (size_t)n * 4),
                       bt = buf_up(t, table, sizeof table), bo = buf_up(t, NULL, (size_t)n * hd * 4);
    CHECK(BE_OP(t->c, kv_store, &d.view, bsl.data, bk.data, bk.data, 4) == 0);
    struct paged_attn_args a = { .n_tokens = n, .n_head = 1, .n_head_kv = 1, .head_dim = hd, .q = bq.data,
                                 .pos = bp.data, .seq = bsq.data, .block_table = bt.data, .max_blocks = 1,
                                 .kv = d.view, .scale = 0.35f, .out = bo.data };
    float y0[16], x0[16], y[16];
    for (int i = 0; i < 16; i++) { y0[i] = gauss(); x0[i] = gauss(); }
    struct backend_buf by = buf_up(t, y0, sizeof y0), bx = buf_up(t, x0, sizeof x0);
    CHECK_MSG(backend_sync(t->c) == 0, "%s: set-up of the error cases", t->name);

    /* more tokens than the context's max_tokens: KVLLM_ERANGE; the status
     * holds until backend_sync, and ops issued meanwhile do not run */
    int rc = BE_OP(t->c, paged_attention, &a);
    CHECK_MSG(rc == KVLLM_ERANGE, "%s paged_attention over %d tokens (max_tokens %d): returned %d", t->name, n,
              CTX_TOKENS, rc);
    CHECK(t->c->status == KVLLM_ERANGE);
    CHECK_MSG(BE_OP(t->c, add, by.data, bx.data, 16) == KVLLM_ERANGE, "%s: an op after a failure ran", t->name);
    rc = backend_sync(t->c);
    CHECK_MSG(rc == KVLLM_ERANGE, "%s: backend_sync after paged_attention's ERANGE returned %d", t->name, rc);
    CHECK(t->c->status == 0 && backend_sync(t->c) == 0);
    buf_down(t, y, &by, sizeof y);
    CHECK(backend_sync(t->c) == 0);
    CHECK_MSG(memcmp(y, y0, sizeof y) == 0, "%s: add issued after a failed op changed its output", t->name);

    /* a position past the context's max_ctx: KVLLM_ERANGE */
    int32_t far = MAX_CTX;
    a.n_tokens = 1;
    CHECK(t->c->ops->upload(t->c, bp.data, &far, 4) == 0);
    rc = BE_OP(t->c, paged_attention, &a);
    int rs = backend_sync(t->c);
    CHECK_MSG((rc == KVLLM_ERANGE || (t->device && rc == 0)) && rs == KVLLM_ERANGE, "%s paged_attention at position %d (max_ctx %d): %d, sync %d",
              t->name, far, MAX_CTX, rc, rs);

    /* then a valid call succeeds: max_tokens tokens */
    CHECK(t->c->ops->upload(t->c, bp.data, pos, (size_t)n * 4) == 0);
    a.n_tokens = CTX_TOKENS;
    rc = BE_OP(t->c, paged_attention, &a);
    buf_down(t, out, &bo, sizeof out);
    sync_ok(t, rc, "paged_attention after the errors");
    int finite = 0;
    for (int i = 0; i < CTX_TOKENS * hd; i++) finite += isfinite(out[i]) != 0;
    CHECK_MSG(finite == CTX_TOKENS * hd, "%s: %d of %d outputs finite", t->name, finite, CTX_TOKENS * hd);

    /* the fail hook: the third op fails with fail_code, later ones are not
     * run, backend_sync reports it once; exactly two adds reached y */
    t->c->fail_after = 3;
    t->c->fail_code = KVLLM_EBACKEND;
    CHECK(BE_OP(t->c, add, by.data, bx.data, 16) == 0);
    CHECK(BE_OP(t->c, add, by.data, bx.data, 16) == 0);
    CHECK_MSG(BE_OP(t->c, add, by.data, bx.data, 16) == KVLLM_EBACKEND, "%s: the fail hook's op did not fail", t->name);
    CHECK(BE_OP(t->c, gelu, by.data, 16) == KVLLM_EBACKEND);
    rc = backend_sync(t->c);
    CHECK_MSG(rc == KVLLM_EBACKEND, "%s: backend_sync after the fail hook returned %d", t->name, rc);
    CHECK(t->c->status == 0 && t->c->fail_after == 0);
    buf_down(t, y, &by, sizeof y);
    CHECK(backend_sync(t->c) == 0);
    int off = 0;
    for (int i = 0; i < 16; i++) off += y[i] != (y0[i] + x0[i]) + x0[i];
    CHECK_MSG(off == 0, "%s: fail hook: %d of 16 values are not y + x + x", t->name, off);
    /* the first op failing, another code: attention's output stays as it was */
    float before[CTX_TOKENS * 8];
    memcpy(before, out, sizeof out);
    t->c->fail_after = 1;
    t->c->fail_code = KVLLM_ENOMEM;
    CHECK(t->c->ops->upload(t->c, bq.data, q + hd, (size_t)CTX_TOKENS * hd * 4) == 0);
    rc = BE_OP(t->c, paged_attention, &a);
    rs = backend_sync(t->c);
    CHECK_MSG(rc == KVLLM_ENOMEM && rs == KVLLM_ENOMEM, "%s: fail hook on paged_attention: %d, sync %d", t->name, rc, rs);
    buf_down(t, out, &bo, sizeof out);
    CHECK(backend_sync(t->c) == 0);
    CHECK_MSG(memcmp(out, before, sizeof out) == 0, "%s: the op the fail hook failed ran", t->name);
    /* and the context works again */
    CHECK(BE_OP(t->c, gelu, by.data, 16) == 0 && backend_sync(t->c) == 0);

    pool_drop(t, &d);
    struct backend_buf *all[] = { &bsl, &bk, &bq, &bp, &bsq, &bt, &bo, &by, &bx };
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) buf_drop(t, all[k]);
    pool_deinit(&img);
    free(q);
    free(pos);
    free(seq);
}

/* supports_op answers for the table: an optional op is supported exactly
 * when its member is set, and every weight type kvllm reads has a matmul
 * and get_rows (both backends dequantize what they lack a kernel for). */
static void check_supports_op(const struct tbe *t) {
    const struct backend_ops *o = t->be->ops;
    CHECK_MSG(o->free && o->supports_op, "%s: free and supports_op are required", t->name);
    if (!o->supports_op) return;
    CHECK_MSG(backend_supports(t->be, BACKEND_OP_MOE, DTYPE_F32) == (o->moe && o->moe_route),
              "%s: supports_op(moe) disagrees with its table", t->name);
    CHECK_MSG(backend_supports(t->be, BACKEND_OP_KV_SHIFT, 0) == (o->kv_shift != NULL),
              "%s: supports_op(kv_shift) disagrees with its table", t->name);
    CHECK_MSG(backend_supports(t->be, BACKEND_OP_SAMPLE, 0) == (o->sample != NULL),
              "%s: supports_op(sample) disagrees with its table", t->name);
    CHECK_MSG(backend_supports(t->be, BACKEND_OP_ADD_RMSNORM, 0) == (o->add_rmsnorm != NULL),
              "%s: supports_op(add_rmsnorm) disagrees with its table", t->name);
    CHECK_MSG(backend_supports(t->be, BACKEND_OP_ROPE_KV_STORE, 0) == (o->rope_kv_store != NULL),
              "%s: supports_op(rope_kv_store) disagrees with its table", t->name);
    CHECK_MSG(backend_supports(t->be, BACKEND_OP_MATMULS, 0) == (o->matmuls != NULL),
              "%s: supports_op(matmuls) disagrees with its table", t->name);
    for (uint32_t ty = 0; ty < DTYPE_COUNT_; ty++) {
        CHECK_MSG(backend_supports(t->be, BACKEND_OP_MATMUL, ty) == dtype_supported(ty), "%s: matmul on %s",
                  t->name, dtype_name(ty));
        CHECK_MSG(backend_supports(t->be, BACKEND_OP_GET_ROWS, ty) == dtype_supported(ty), "%s: get_rows on %s",
                  t->name, dtype_name(ty));
    }
    CHECK(!backend_supports(t->be, BACKEND_OP_COUNT_, DTYPE_F32));
}

/* ---- main ---- */

static int add_backend(const char *kind, bool strict, bool simd, const char *act, int twin, int n_threads) {
    struct tbe *t = &g_be[g_nbe];
    char label[48];
    snprintf(label, sizeof label, "%s%s%s%s", strict ? "strict/" : "", kind, strcmp(act, "f32") ? "+act=" : "",
             strcmp(act, "f32") ? act : "");
    /* the first backend is the reference and always runs; a filtered-out one is not made at all */
    if (g_nbe > 0 && !listed("KVLLM_TEST_BACKENDS", label)) {
        printf("  %s: left out (KVLLM_TEST_BACKENDS)\n", label);
        return -1;
    }
    /* the 8-bit path, q8, is also checked bit for bit against its definition
     * by test_backend_matmul.c and test_backend_qk.c */
    enum backend_act a = BACKEND_ACT_F32;
    CHECK(backend_act_parse(act, &a) == 0);
    t->c = tb_new(kind, strict, a, n_threads, g_large ? LARGE_COLS : MAX_COLS, g_large ? LARGE_TOKENS : CTX_TOKENS,
                  g_large ? LARGE_CTX : MAX_CTX, MAX_HEADS, MAX_HEAD_DIM);
    CHECK_MSG(t->c != NULL, "backend %s%s could not be created", strict ? "strict/" : "", kind);
    if (!t->c) return -1;
    t->be = t->c->be;
    t->name = t->c->ops->name;
    t->simd = simd;
    t->act = act;
    t->twin = twin;
    char want[32];
    snprintf(want, sizeof want, "%s%s", strict ? "strict/" : "", kind);
    CHECK_MSG(strcmp(t->name, want) == 0, "backend named %s, expected %s", t->name, want);
    if (strcmp(act, "f32") != 0) {
        static char labels[MAX_BE][32];
        CHECK(cpu_ctx_of(t->c)->act == (strcmp(act, "int") == 0 ? ACT_INT : ACT_Q8));
        snprintf(labels[g_nbe], sizeof labels[g_nbe], "%s+act=%s", t->name, act);
        t->name = labels[g_nbe];
    }
    return g_nbe++;
}

/* The CUDA backend, where there is one, with activations act ("f32": "cuda"; "q8", its default:
 * "cuda+act=q8", the 8-bit path of matmul_q8.cu): a context sized as tb_new sizes the CPU ones. */
static void add_cuda_backend(const char *act) {
    struct tbe *t = &g_be[g_nbe];
    struct backend *be = NULL;
    const struct backend_ctx_params p = { .n_threads = 1, .max_tokens = g_large ? LARGE_TOKENS : CTX_TOKENS,
                                          .max_ctx = g_large ? LARGE_CTX : MAX_CTX, .n_head = MAX_HEADS,
                                          .head_dim = MAX_HEAD_DIM, .max_cols = g_large ? LARGE_COLS : MAX_COLS };
    int rc = backend_cuda_new(0, strcmp(act, "q8") == 0 ? BACKEND_ACT_Q8 : BACKEND_ACT_F32, &be);
    if (!rc) rc = backend_ctx_new(be, &p, &t->c);
    CHECK_MSG(rc == 0, "backend cuda could not be created: %s", kvllm_strerror(rc));
    if (rc) {
        backend_free(be);
        t->c = NULL;
        return;
    }
    const bool q8 = strcmp(act, "q8") == 0;
    *t = (struct tbe){ .name = q8 ? "cuda+act=q8" : "cuda", .c = t->c, .be = be, .simd = true, .act = act,
                       .twin = -1, .device = true };
    g_nbe++;
}

int main(void) {
    const char *env = getenv("KVLLM_TEST_SEED");
    const uint64_t seed = env && *env ? strtoull(env, NULL, 0) : (uint64_t)(time_now() * 1e6);
    printf("  seed %llu (KVLLM_TEST_SEED to repeat)\n", (unsigned long long)seed);
    rng_seed(&g_rng, seed);
    const double t0 = time_now();
    const char *large = getenv("KVLLM_TEST_LARGE");
    g_large = large && !strcmp(large, "1");
    if (g_large)
        printf("  large shapes (KVLLM_TEST_LARGE=1): matmul get_rows rmsnorm rope elementwise argmax sample "
               "paged_attention\n");

    struct cpu_features f;
    cpu_features_get(&f);
    const bool avx2 = f.avx2 && f.fma && f.f16c;
    add_backend("scalar", false, false, "f32", -1, 1);
    if (g_nbe != 1) return check_report("test_backend_ops");
    int i_avx2 = -1;
    if (!cpu_avx2_built()) {
        printf("SKIP avx2: this build has no AVX2 kernels (not an x86-64 target)\n");
    } else if (!avx2) {
        printf("SKIP avx2: CPU lacks%s%s%s\n", f.avx2 ? "" : " AVX2", f.fma ? "" : " FMA", f.f16c ? "" : " F16C");
    } else {
        i_avx2 = add_backend("avx2", false, true, "f32", -1, 2);
    }
    add_backend("scalar", true, false, "f32", 0, 2);
    if (cpu_avx2_built() && avx2) {
        add_backend("avx2", true, true, "f32", i_avx2, 1);
        add_backend("avx2", false, true, "int", -1, 2);
        const int i_q8 = add_backend("avx2", false, true, "q8", -1, 2);
        add_backend("avx2", true, true, "q8", i_q8, 1);
    }
    const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
    if (!cpu_q8_avx512_built()) printf("SKIP avx512+act=q8: this build has no AVX-512 kernels\n");
    else if (!avx512)
        printf("SKIP avx512+act=q8: CPU lacks%s%s%s%s%s\n", avx2 ? "" : " AVX2/FMA/F16C", f.avx512f ? "" : " AVX-512F",
               f.avx512bw ? "" : " AVX-512BW", f.avx512vl ? "" : " AVX-512VL", f.avx512vnni ? "" : " AVX-512-VNNI");
    else {
        const int i_512 = add_backend("avx512", false, true, "q8", -1, 2);
        /* amx: the avx512 set with the integer matmul on AMX-INT8 tiles, so bit-identical to it (its twin) */
        if (!cpu_q8_amx_built())
            printf("SKIP amx+act=q8: this build has no AMX kernels (its compiler lacked -mamx-tile -mamx-int8)\n");
        else if (!f.amx_tile || !f.amx_int8 || !f.amx_os)
            printf("SKIP amx+act=q8: no AMX-INT8 on this CPU (AMX-TILE %s, AMX-INT8 %s, OS tile state %s)\n",
                   f.amx_tile ? "yes" : "no", f.amx_int8 ? "yes" : "no", f.amx_os ? "yes" : "no");
        else if (cpu_amx_permit() != 0)
            printf("SKIP amx+act=q8: Linux refused this process AMX tile data\n");
        else add_backend("amx", false, true, "q8", i_512, 2);
    }
    char why[256];
    if (!listed("KVLLM_TEST_BACKENDS", "cuda")) printf("  cuda: left out (KVLLM_TEST_BACKENDS)\n");
    else if (backend_cuda_probe(why, sizeof why) == 0) printf("SKIP cuda: %s\n", why);
    else {
        add_cuda_backend("f32");
        add_cuda_backend("q8");
    }
    printf("  backends:");
    for (int b = 0; b < g_nbe; b++) printf(" %s", g_be[b].name);
    printf("\n");
    for (int b = 0; b < g_nbe; b++) check_supports_op(&g_be[b]);

    /* the ops (KVLLM_TEST_OPS selects; "elementwise" stands for add..softcap, "errors" for the error paths);
     * large mode runs those with large shapes, a few cases each */
    const int big = 4;
    if (listed("KVLLM_TEST_OPS", "matmul")) test_matmul();
    if (listed("KVLLM_TEST_OPS", "get_rows")) test_get_rows();
    if (!g_large && listed("KVLLM_TEST_OPS", "gather_rows")) test_gather_rows(CASES(60));
    if (listed("KVLLM_TEST_OPS", "rmsnorm")) test_norm(false, g_large ? big : CASES(100));
    if (!g_large && listed("KVLLM_TEST_OPS", "layernorm")) test_norm(true, CASES(100));
    if (listed("KVLLM_TEST_OPS", "rope")) test_rope(g_large ? big : CASES(150));
    if (!g_large && listed("KVLLM_TEST_OPS", "add_bias")) test_add_bias(CASES(60));
    static const enum op k_elementwise[] = { OP_ADD, OP_SWIGLU, OP_GELU, OP_GEGLU, OP_SCALE, OP_SOFTCAP };
    for (size_t e = 0; e < sizeof k_elementwise / sizeof *k_elementwise; e++)
        if (listed("KVLLM_TEST_OPS", "elementwise") || listed("KVLLM_TEST_OPS", k_tol[k_elementwise[e]].name))
            test_elementwise(k_elementwise[e], g_large ? 2 : CASES(80));
    if (!g_large && i_avx2 >= 0 && listed("KVLLM_TEST_OPS", "expf")) {
        test_expf("cpu_expf_avx2", cpu_expf_avx2);
        if (avx512 && cpu_act_avx512_built()) test_expf("cpu_expf_avx512", cpu_expf_avx512);
    }
    if (!g_large && (listed("KVLLM_TEST_OPS", "moe") || listed("KVLLM_TEST_OPS", "moe_route"))) test_moe(CASES(40));
    if (!g_large && listed("KVLLM_TEST_OPS", "kv_store")) test_kv_store(CASES(100));
    if (listed("KVLLM_TEST_OPS", "paged_attention")) test_paged_attention(g_large ? KV_TYPE_COUNT_ : CASES(150));
    if (!g_large && listed("KVLLM_TEST_OPS", "paged_attention")) test_pa_future_inf();
    if (!g_large && listed("KVLLM_TEST_OPS", "copy_blocks")) test_copy_blocks(CASES(60));
    if (listed("KVLLM_TEST_OPS", "argmax")) test_argmax(g_large ? big : CASES(60));
    if (listed("KVLLM_TEST_OPS", "sample")) test_sample(g_large ? big : CASES(60));
    if (listed("KVLLM_TEST_OPS", "add_rmsnorm")) test_add_rmsnorm(g_large ? big : CASES(40));
    if (listed("KVLLM_TEST_OPS", "rope_kv_store")) test_rope_kv_store(g_large ? big : CASES(40));
    if (!g_large && listed("KVLLM_TEST_OPS", "matmuls")) test_matmuls(CASES(40));
    if (!g_large && listed("KVLLM_TEST_OPS", "errors")) {
        fprintf(stderr, "(the next paged attention errors are expected)\n");
        for (int b = 0; b < g_nbe; b++) test_errors(&g_be[b]);
    }

    printf("  %-18s %-16s %6s  %-22s %-22s %s\n", "backend", "op", "cases", "worst vs scalar (tol)",
           "worst vs ref (tol)", "");
    for (int b = 0; b < g_nbe; b++)
        for (int op = 0; op < OP_COUNT; op++) {
            const struct stat_ *s = &g_st[b][op];
            char ts[32], tr[32];
            const double tol_s = !g_be[b].simd              ? 0
                                 : op == OP_PAGED_ATTN          ? k_pa_simd[0]
                                 : op == OP_MATMUL && !strcmp(g_be[b].act, "int") ? MATMUL_INT
                                                                : k_tol[op].simd;
            snprintf(ts, sizeof ts, "%.3g (%.2g)", s->vs_scalar, tol_s);
            if (op == OP_LAYERNORM && g_be[b].simd) snprintf(ts, sizeof ts, "%.3g (cond.)", s->vs_scalar);
            if (op == OP_MATMUL) snprintf(tr, sizeof tr, "-");
            else if (op == OP_KV_STORE) snprintf(tr, sizeof tr, "%.3g (per type)", s->vs_ref);
            else if (op == OP_PAGED_ATTN) snprintf(tr, sizeof tr, "%.3g (%.2g)", s->vs_ref, k_pa_stored[0]);
            else if (op == OP_COPY_BLOCKS) snprintf(tr, sizeof tr, "%.3g (exact)", s->vs_ref);
            else if (op == OP_FUSED) snprintf(tr, sizeof tr, "%.3g (own ops, exact)", s->vs_ref);
            else if (op == OP_LAYERNORM) snprintf(tr, sizeof tr, "%.3g (cond.)", s->vs_ref);
            else if (op == OP_SAMPLE) snprintf(tr, sizeof tr, "%.3g rows (%s)", s->vs_ref,
                                               g_be[b].device ? "near-ties" : "exact");
            else snprintf(tr, sizeof tr, "%.3g (%.2g)", s->vs_ref, k_tol[op].ref);
            printf("  %-18s %-16s %6ld  %-22s %-22s", g_be[b].name, k_tol[op].name, s->cases, ts, tr);
            if (op == OP_PAGED_ATTN) printf(" vs inputs %.3g", s->vs_input);
            if (op == OP_MATMUL && !strcmp(g_be[b].act, "int"))
                printf(" (Q8_0, Q4_0, Q4_1; other types %.2g)", k_tol[op].simd);
            if (op == OP_MATMUL && !strcmp(g_be[b].act, "q8"))
                printf(" (tol: the rounding's bound for qmm.h's types; other types %.2g)", k_tol[op].simd);
            printf("\n");
        }
    printf("  paged_attention by kv type (worst vs scalar / vs double over stored values / vs f32 inputs, "
           "Gaussian K):\n");
    for (int b = 0; b < g_nbe; b++) {
        printf("    %-18s", g_be[b].name);
        for (int ty = 0; ty < KV_TYPE_COUNT_; ty++)
            printf(" %s %.2g/%.2g/%.2g", k_kv_names[ty], g_pa_worst[b][ty][0], g_pa_worst[b][ty][1],
                   g_pa_worst[b][ty][2]);
        printf("\n");
    }
    printf("  kv_store by type (worst stored vs inputs, bound):");
    for (int ty = 0; ty < KV_TYPE_COUNT_; ty++) printf(" %s %.3g (%.3g)", k_kv_names[ty], g_store_worst[ty], k_store_bound[ty]);
    printf("\n  %.1f s\n", time_now() - t0);
    for (int b = 0; b < g_nbe; b++) tb_free(g_be[b].c);
    return check_report("test_backend_ops");
}
