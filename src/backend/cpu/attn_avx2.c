/* attn_avx2.c — the online-softmax step of paged attention (pa_chunk_fn,
 * see cpu_internal.h) with AVX2 + FMA + F16C.  Compiled with those -m flags
 * alone; cpu.c installs cpu_paged_attention_avx2 only when the CPU has them.
 *
 * Per step: the chunk's K rows are made f32 once (f16 / bf16 widened,
 * 8-bit codes converted) into an L1-sized buffer and dotted with each of the
 * g query heads sharing the kv head; the softmax weights come from a
 * vectorized exp; the V rows are made f32 once and each head's accumulator
 * (head_dim floats, kept in registers 64 at a time) sweeps them.  The
 * scalar step spends most of its time in expf and in per-element
 * conversion; this one reads each K/V byte once per step for all g heads.
 *
 * Determinism: the arithmetic depends only on the step's arguments (fixed
 * lane layout and reduction order), so attention stays bit-identical for
 * any thread count and batch composition, as the scalar step is. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backend/cpu/avx2_util.h"
#include <math.h>

#define MAX_HD 256        /* larger heads take the scalar step */
#define MAX_N CPU_PA_CHUNK

/* exp(x) for x <= 0 (scores minus their running max), about 1 ulp: Cody-Waite
 * reduction by ln 2 and Cephes' degree-6 polynomial; x < -87.3 (and -inf)
 * gives 0. */
ALWAYS_INLINE __m256 exp_neg(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* fx >= -126 here, so 2^fx is a normal float */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* Lanes < n (0..7) of a mask. */
ALWAYS_INLINE __m256i lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Row `row` of K or V as f32: in place for f32, else converted into buf
 * (8-bit codes without their scale).  hd is a multiple of 8. */
static const float *row_f32(enum kv_type type, const void *base, size_t row, int hd, float *buf) {
    const size_t e0 = row * (size_t)hd;
    switch (type) {
    case KV_F32: return (const float *)base + e0;
    case KV_F16:
        for (int i = 0; i < hd; i += 8)
            _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + e0 + i))));
        return buf;
    case KV_BF16:
        for (int i = 0; i < hd; i += 8)
            _mm256_storeu_ps(buf + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
                _mm_loadu_si128((const __m128i *)((const uint16_t *)base + e0 + i))), 16)));
        return buf;
    case KV_INT8:
        for (int i = 0; i < hd; i += 8)
            _mm256_storeu_ps(buf + i, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                _mm_loadl_epi64((const __m128i *)((const int8_t *)base + e0 + i)))));
        return buf;
    default: {
        const uint8_t *s = (const uint8_t *)base + e0;
        for (int i = 0; i < hd; i++) buf[i] = cpu_fp8_to_f32(s[i]);
        return buf;
    }
    }
}

/* acc[0 .. 8 NV) += Σ_jj w[jj] * rows[jj][k0 ..]: NV accumulators kept in
 * registers (NV a constant after inlining). */
ALWAYS_INLINE void v_acc(const int NV, float *acc, const float *const *rows, int k0, const float *w, int n) {
    __m256 a[8];
    for (int u = 0; u < NV; u++) a[u] = _mm256_loadu_ps(acc + 8 * u);
    for (int jj = 0; jj < n; jj++) {
        const __m256 wv = _mm256_broadcast_ss(&w[jj]);
        const float *vr = rows[jj] + k0;
        for (int u = 0; u < NV; u++) a[u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(vr + 8 * u), a[u]);
    }
    for (int u = 0; u < NV; u++) _mm256_storeu_ps(acc + 8 * u, a[u]);
}

/* The last nv (1..7) vectors of a head whose size is not a multiple of 64. */
static void v_acc_tail(int nv, float *acc, const float *const *rows, int k0, const float *w, int n) {
    switch (nv) {
    case 1: v_acc(1, acc, rows, k0, w, n); break;
    case 2: v_acc(2, acc, rows, k0, w, n); break;
    case 3: v_acc(3, acc, rows, k0, w, n); break;
    case 4: v_acc(4, acc, rows, k0, w, n); break;
    case 5: v_acc(5, acc, rows, k0, w, n); break;
    case 6: v_acc(6, acc, rows, k0, w, n); break;
    default: v_acc(7, acc, rows, k0, w, n); break;
    }
}

static void chunk_avx2(const struct kv_layer_view *kv, size_t row0, size_t rstride, int n, int g,
                       const float *q, float scale, float *part0, size_t pstride, float *sc, int cap) {
    const int hd = kv->head_dim;
    const bool q8 = kv->type == KV_INT8 || kv->type == KV_FP8;
    float buf[MAX_N * MAX_HD];
    const float *rows[MAX_N];
    float rs[MAX_N];             /* per-position factor: score scale, then V scale */

    /* scores (g, n) */
    for (int jj = 0; jj < n; jj++) {
        const size_t row = row0 + (size_t)jj * rstride;
        rows[jj] = row_f32(kv->type, kv->k, row, hd, buf + (size_t)jj * hd);
        rs[jj] = q8 ? kv->k_scale[row] * scale : scale;
    }
    /* eight heads at a time: one accumulator each per position, the eight
     * reduced together (hadd tree) into one vector of scores */
    for (int i0 = 0; i0 < g; i0 += 8) {
        const int nh = g - i0 < 8 ? g - i0 : 8;
        for (int jj = 0; jj < n; jj++) {
            __m256 a[8];
            for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
            for (int k = 0; k < hd; k += 8) {
                const __m256 kv8 = _mm256_loadu_ps(rows[jj] + k);
                for (int i = 0; i < nh; i++)
                    a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)(i0 + i) * hd + k), kv8, a[i]);
            }
            const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
            const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
            const __m256 sv = _mm256_mul_ps(_mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20),
                                                          _mm256_permute2f128_ps(h0, h1, 0x31)),
                                            _mm256_set1_ps(rs[jj]));
            float tmp[8];
            _mm256_storeu_ps(tmp, sv);
            for (int i = 0; i < nh; i++) sc[(size_t)(i0 + i) * cap + jj] = tmp[i];
        }
    }
    /* per head: new max, rescale once, weights exp(s - m) */
    for (int i = 0; i < g; i++) {
        float *p = part0 + (size_t)i * pstride, *si = sc + (size_t)i * cap;
        __m256 vm = _mm256_set1_ps(-INFINITY);
        int jj = 0;
        for (; jj + 8 <= n; jj += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(si + jj));
        float bm = avx2_hmax(vm);
        for (; jj < n; jj++) bm = si[jj] > bm ? si[jj] : bm;
        if (bm > p[0]) {
            if (p[0] != -INFINITY) {          /* first step: acc and l are 0 */
                const __m256 corr = _mm256_set1_ps(expf(p[0] - bm));
                p[1] *= _mm256_cvtss_f32(corr);
                for (int k = 0; k < hd; k += 8)
                    _mm256_storeu_ps(p + 2 + k, _mm256_mul_ps(_mm256_loadu_ps(p + 2 + k), corr));
            }
            p[0] = bm;
        }
        const __m256 m = _mm256_set1_ps(p[0]);
        __m256 vl = _mm256_setzero_ps();
        for (jj = 0; jj + 8 <= n; jj += 8) {
            __m256 w = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(si + jj), m));
            _mm256_storeu_ps(si + jj, w);
            vl = _mm256_add_ps(vl, w);
        }
        if (jj < n) {
            const __m256i mk = lanes(n - jj);
            __m256 x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(si + jj, mk),
                                        _mm256_castsi256_ps(mk));
            __m256 w = exp_neg(_mm256_sub_ps(x, m));
            _mm256_maskstore_ps(si + jj, mk, w);
            vl = _mm256_add_ps(vl, w);
        }
        p[1] += avx2_hsum(vl);
    }
    /* accumulate V: each head's acc, 64 floats at a time in registers */
    for (int jj = 0; jj < n; jj++) {
        const size_t row = row0 + (size_t)jj * rstride;
        rows[jj] = row_f32(kv->type, kv->v, row, hd, buf + (size_t)jj * hd);
        rs[jj] = q8 ? kv->v_scale[row] : 1.0f;
    }
    for (int i = 0; i < g; i++) {
        float *acc = part0 + (size_t)i * pstride + 2;
        const float *wi = sc + (size_t)i * cap;
        float wr[MAX_N];
        for (int jj = 0; jj < n; jj++) wr[jj] = wi[jj] * rs[jj];
        int k0 = 0;
        for (; k0 + 64 <= hd; k0 += 64) v_acc(8, acc + k0, rows, k0, wr, n);
        if (k0 < hd) v_acc_tail((hd - k0) / 8, acc + k0, rows, k0, wr, n);
    }
}

void cpu_paged_attention_avx2(struct backend *be, const struct paged_attn_args *a) {
    if (a->head_dim % 8 != 0 || a->head_dim > MAX_HD) {
        cpu_paged_attention(be, a);
        return;
    }
    cpu_paged_attention_with(be, a, chunk_avx2);
}

#else /* not an x86-64 build with the AVX2 flags */

void cpu_paged_attention_avx2(struct backend *be, const struct paged_attn_args *a) {
    cpu_paged_attention(be, a);
}

#endif
