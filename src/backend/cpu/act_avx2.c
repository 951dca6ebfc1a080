/* act_avx2.c — for the avx2 and avx512 sets, over the thread pool: the GELU
 * activations (backend_ops.gelu and geglu, tanh form) with AVX2 + FMA,
 * SwiGLU (backend_ops.swiglu) as the scalar op computes it, and kv_store
 * with its f16 rows converted by F16C (f32_to_f16 a value at a time was 4 %
 * of a small model's pp512).
 * Compiled with those -m flags alone; cpu.c installs them only when the CPU
 * has them.
 *
 * Why: the scalar op (cpu_ops.c) calls libm's tanhf per element on one
 * thread; on Gemma 3's prefill (n_ff 2048 per token) that was a fifth of
 * pp512's time.  SwiGLU's scalar loop, on one thread, was 6 % of a 160 M
 * Qwen3's.
 *
 * Arithmetic, per element x (with u = sqrt(2/pi) x (1 + 0.044715 x^2), the
 * tanh form's argument, and the identity 0.5 (1 + tanh u) = 1 / (1 + e^-2u)):
 *   e = exp(-|2u|) (avx2_exp_neg, about 1 ulp)
 *   gelu(x) = x / (1 + e) when u >= 0, x * e / (1 + e) when u < 0
 * so exp never overflows, and 1 + tanh u never cancels (the scalar op's
 * 1 + tanhf(u) keeps only absolute accuracy where tanh u is near -1, i.e.
 * x below about -3: this form is the more accurate there).  Elsewhere both
 * are within a few ulp of the exact function (test_backend_ops holds this
 * one to the scalar op and to a double-precision reference on fresh random
 * inputs, 1e-6 of the norm).  SwiGLU is the scalar op's expression with
 * avx2_expf, libm's expf bit for bit, so its bits are the scalar op's: a
 * ~1 ulp exp moved top-1 near-ties of the KLD suite's Q2_K file below
 * llama.cpp's.  Each element depends only on its own input, so the result
 * is the same for any thread count, chunking and batch. */
#include <math.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops.h"
#include "core/threadpool.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backend/cpu/avx2_util.h"

#define ACT_CHUNK 2048   /* elements per thread-pool chunk (a multiple of 8): a decode step's n_ff runs inline */

/* gelu of 8 lanes, as the header defines it. */
ALWAYS_INLINE __m256 gelu8(__m256 x) {
    const __m256 x2 = _mm256_mul_ps(x, x);
    const __m256 u = _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.7978845608028654f)),
                                   _mm256_fmadd_ps(x2, _mm256_set1_ps(0.044715f), _mm256_set1_ps(1.0f)));
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 z = _mm256_add_ps(u, u);                           /* 2u */
    const __m256 e = avx2_exp_neg(_mm256_or_ps(z, sign));           /* exp(-|2u|) */
    const __m256 num = _mm256_blendv_ps(x, _mm256_mul_ps(x, e), z); /* sign bit of 2u picks x e */
    return _mm256_div_ps(num, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

struct act_job {
    float *g;           /* (n) in: the activation's input; out: the result */
    const float *u;     /* (n) the GLU's other half, or NULL (plain gelu) */
    long n;
    void (*silu)(float *g, const float *u, long n);   /* SwiGLU's rows, or NULL: GELU */
};

/* SwiGLU over n values with avx2_expf. */
static void swiglu_rows(float *g, const float *u, long n) {
    for (long i = 0; i < n; i += 8) {
        const __m256i m = avx2_lanes(n - i < 8 ? (int)(n - i) : 8);
        const __m256 x = _mm256_maskload_ps(g + i, m);
        const __m256 e = avx2_expf(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)));
        const __m256 y = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_maskstore_ps(g + i, m, _mm256_mul_ps(y, _mm256_maskload_ps(u + i, m)));
    }
}

static void act_chunk(void *arg, long c, int ith) {
    (void)ith;
    const struct act_job *j = arg;
    const long i0 = c * ACT_CHUNK, i1 = i0 + ACT_CHUNK < j->n ? i0 + ACT_CHUNK : j->n;
    if (j->silu) {
        j->silu(j->g + i0, j->u + i0, i1 - i0);
        return;
    }
    for (long i = i0; i < i1; i += 8) {
        const __m256i m = avx2_lanes(i1 - i < 8 ? (int)(i1 - i) : 8);
        __m256 y = gelu8(_mm256_maskload_ps(j->g + i, m));
        if (j->u) y = _mm256_mul_ps(y, _mm256_maskload_ps(j->u + i, m));
        _mm256_maskstore_ps(j->g + i, m, y);
    }
}

static int act_run(struct backend_ctx *c, float *g, const float *u, long n,
                   void (*silu)(float *g, const float *u, long n)) {
    struct act_job j = { g, u, n, silu };
    threadpool_run_chunks(cpu_ctx_of(c)->pool, (n + ACT_CHUNK - 1) / ACT_CHUNK, act_chunk, &j);
    return 0;
}

int cpu_gelu_avx2(struct backend_ctx *c, float *x, long n) { return act_run(c, x, NULL, n, NULL); }
int cpu_geglu_avx2(struct backend_ctx *c, float *g, const float *u, long n) { return act_run(c, g, u, n, NULL); }
int cpu_swiglu_avx2(struct backend_ctx *c, float *g, const float *u, long n) { return act_run(c, g, u, n, swiglu_rows); }
int cpu_swiglu_avx512(struct backend_ctx *c, float *g, const float *u, long n) {
    return act_run(c, g, u, n, cpu_swiglu_rows_avx512);
}

void cpu_expf_avx2(const float *x, float *y, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, avx2_expf(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = expf(x[i]);
}

/* f16 KV rows by vcvtps2ph, round to nearest even: f32_to_f16's bits for
 * every non-NaN value (a NaN keeps its payload's top bits there). */
static void f16_row_f16c(const float *x, uint16_t *d, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = f32_to_f16(x[i]);
}

int cpu_kv_store_avx2(struct backend_ctx *c, const struct kv_layer_view *kv, const int32_t *slots, const float *k,
                      const float *v, int n) {
    return cpu_kv_store_with(c, kv, slots, k, v, n, f16_row_f16c);
}

#else /* not an x86-64 build with the AVX2 flags: the scalar ops */

int cpu_gelu_avx2(struct backend_ctx *c, float *x, long n) { return cpu_gelu(c, x, n); }
int cpu_geglu_avx2(struct backend_ctx *c, float *g, const float *u, long n) { return cpu_geglu(c, g, u, n); }
int cpu_swiglu_avx2(struct backend_ctx *c, float *g, const float *u, long n) { return cpu_swiglu(c, g, u, n); }
int cpu_swiglu_avx512(struct backend_ctx *c, float *g, const float *u, long n) { return cpu_swiglu(c, g, u, n); }
void cpu_expf_avx2(const float *x, float *y, long n) {
    for (long i = 0; i < n; i++) y[i] = expf(x[i]);
}
int cpu_kv_store_avx2(struct backend_ctx *c, const struct kv_layer_view *kv, const int32_t *slots, const float *k,
                      const float *v, int n) {
    return cpu_kv_store(c, kv, slots, k, v, n);
}

#endif
