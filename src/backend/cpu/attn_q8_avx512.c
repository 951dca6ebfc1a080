/* attn_q8_avx512.c — the scores of a paged-attention step with int8 K and
 * quantized queries (struct pa_q8, cpu_internal.h) on AVX-512 VNNI, for the
 * AVX-512 step (attn_avx512.c).  Compiled with the VNNI flags alone;
 * entered only when the CPU has AVX-512 F, BW, VL and VNNI.
 *
 * A score's integer is exact whatever the order of its sums, so this file
 * picks the cheapest: vpdpbusd multiplies unsigned by signed bytes, so K's
 * codes are offset by 128 (k ^ 0x80 = k + 128 as a byte) and the query's
 * sum times 128 taken off at the end:
 *   Σ (k + 128) c = Σ k c + 128 Σ c.
 * Tiles of 4 heads x 4 positions: per 64 dims, 4 K loads, 4 xors and 4
 * query loads feed 16 vpdpbusd (64 multiply-adds each, where the f32 step
 * spent an FMA on 16 and widened K first); the 16 accumulators reduce to
 * one register of 16 sums by a tree of unpacks and adds (45 operations per
 * 16 scores).  The float from the integer is struct pa_q8's, as the scalar
 * and AVX2 steps compute it. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "core/core.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#include <immintrin.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

bool cpu_attn_q8_avx512_built(void) { return true; }

/* pa_quant_fn: kv_kernels.c's pa_quant_q8 bit for bit, 16 elements at a
 * time (the max is exact in any order, NaN skipped as there; roundscale
 * rounds the one product to nearest even as pa_round_even does; NaN codes
 * 0).  The portable loop was a quarter of a sliding layer's step. */
void cpu_pa_quant_q8_avx512(const float *q, int g, int hd, int8_t *code, float *scale, int32_t *sum) {
    const __m512i sign = _mm512_set1_epi32(0x7fffffff);
    for (int i = 0; i < g; i++) {
        const float *x = q + (size_t)i * hd;
        int8_t *d = code + (size_t)i * hd;
        __m512 vm = _mm512_setzero_ps();
        for (int e = 0; e < hd; e += 16) {      /* hd: a multiple of 32 here */
            const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(x + e)), sign));
            vm = _mm512_max_ps(a, vm);          /* a NaN gives the second operand: skipped */
        }
        const float amax = _mm512_reduce_max_ps(vm);
        const __m512 inv = _mm512_set1_ps(amax != 0 ? 127.0f / amax : 0.0f);
        __m512i t = _mm512_setzero_si512();
        for (int e = 0; e < hd; e += 16) {
            __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + e), inv),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), r);
            r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
            const __m512i c = _mm512_cvtps_epi32(r);
            t = _mm512_add_epi32(t, c);
            _mm_storeu_si128((__m128i *)(d + e), _mm512_cvtepi32_epi8(c));
        }
        scale[i] = amax / 127.0f;
        sum[i] = _mm512_reduce_add_epi32(t);
    }
}

/* Lane i of the result: the sum of a[i]'s 16 lanes. */
ALWAYS_INLINE __m512i hsum16(const __m512i *a) {
    __m512i t[8], u[4], v[2];
    for (int i = 0; i < 8; i++)    /* per 128-bit lane: a0+a2, b0+b2, a1+a3, b1+b3 */
        t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]),
                                _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++)    /* per 128-bit lane: the lane's sums of a[4i .. 4i+3] */
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]),
                                _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
    for (int i = 0; i < 2; i++)    /* 128-bit lanes added in pairs */
        v[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2 * i], u[2 * i + 1], 0x88),
                                _mm512_shuffle_i32x4(u[2 * i], u[2 * i + 1], 0xdd));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(v[0], v[1], 0x88), _mm512_shuffle_i32x4(v[0], v[1], 0xdd));
}

/* Scores of RH (1..4) heads (codes c, hd apart) against the 4 rows kr
 * (rows past the step's end are any readable row: their lanes are not
 * stored): sc[h * cap + p] for p < np, with scale[h] * rs[p]. */
ALWAYS_INLINE void tile(const int RH, const int8_t *const *kr, const int8_t *c, const float *qs,
                        const int32_t *qsum, int hd, const float *rs, int np, float *sc, int cap) {
    __m512i a[16];
    for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_si512();
    const __m512i off = _mm512_set1_epi8((char)0x80);
    for (int d = 0; d < hd; d += 64) {
        const __mmask64 m = hd - d >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (hd - d)) - 1;
        __m512i kx[4];
        for (int p = 0; p < 4; p++) kx[p] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, kr[p] + d), off);
        for (int h = 0; h < RH; h++) {
            const __m512i cv = _mm512_maskz_loadu_epi8(m, c + (size_t)h * hd + d);   /* 0 past hd: adds 0 */
            for (int p = 0; p < 4; p++) a[4 * h + p] = _mm512_dpbusd_epi32(a[4 * h + p], kx[p], cv);
        }
    }
    /* lane 4h + p: head h, position p */
    const __m512i sums = hsum16(a);
    const __m512i hi = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i pi = _mm512_set_epi32(3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0);
    const __mmask8 hm = (__mmask8)((1u << RH) - 1);
    const __m512i qsv = _mm512_permutexvar_epi32(hi, _mm512_castsi128_si512(_mm_maskz_loadu_epi32(hm, qsum)));
    const __m512i dot = _mm512_sub_epi32(sums, _mm512_slli_epi32(qsv, 7));
    const __m512 fac = _mm512_mul_ps(_mm512_permutexvar_ps(hi, _mm512_castps128_ps512(_mm_maskz_loadu_ps(hm, qs))),
                                     _mm512_permutexvar_ps(pi, _mm512_castps128_ps512(_mm_loadu_ps(rs))));
    const __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), fac);
    const __mmask16 pm = (__mmask16)((1u << np) - 1);
    for (int h = 0; h < RH; h++)    /* lanes 4h .. 4h+np-1 to sc[h * cap + p] */
        _mm512_mask_storeu_ps(sc + (size_t)h * cap - 4 * h, (__mmask16)(pm << (4 * h)), s);
}

void cpu_pa_scores_q8_avx512(const int8_t *k, const size_t *rows, int n, int g, const struct pa_q8 *qq, int hd,
                             const float *rs, float *sc, int cap, const size_t *pf, int npf) {
    for (int p = 0; p < n; p += 4) {
        const int np = n - p < 4 ? n - p : 4;
        const int8_t *kr[4];
        for (int i = 0; i < 4; i++) kr[i] = k + rows[p + (i < np ? i : 0)] * (size_t)hd;
        /* the next step's K rows of these positions, a few lines per tile (a burst of them
         * stalls), into L2 (see pf_lines) */
        for (int i = p; i < p + 4 && i < npf; i++)
            for (int o = 0; o < hd; o += 64) _mm_prefetch((const char *)(k + pf[i] * (size_t)hd) + o, _MM_HINT_T1);
        for (int h = 0; h < g; h += 4) {
            const int8_t *c = qq->code + (size_t)h * hd;
            float *s = sc + (size_t)h * cap + p;
            switch (g - h < 4 ? g - h : 4) {
            case 4: tile(4, kr, c, qq->scale + h, qq->sum + h, hd, rs + p, np, s, cap); break;
            case 3: tile(3, kr, c, qq->scale + h, qq->sum + h, hd, rs + p, np, s, cap); break;
            case 2: tile(2, kr, c, qq->scale + h, qq->sum + h, hd, rs + p, np, s, cap); break;
            default: tile(1, kr, c, qq->scale + h, qq->sum + h, hd, rs + p, np, s, cap); break;
            }
        }
    }
}

/* ---- values: int32 sums of 16-bit weight codes times V codes ---- */

/* Prefetch requests for the next step's rows pf[0 .. n), k lines per
 * call spread over the tiles (a burst of them stalls on the line-fill
 * buffers): the cursor keeps the next line's address.  Into L2 (T1): an L1
 * prefetch holds one of L1's few fill buffers until its line arrives, and
 * the KV of a decode at depth comes from DRAM once the weights have
 * streamed through the cache; L2's miss queue is deeper.  Measured with
 * bench/attn over 352 MiB of int8 KV (22 layers at 32k): 38.2-38.7 against
 * 54.5-54.7 ms with L1 prefetches (6.8 -> 9.7 GB/s of KV); in L3 no
 * difference.  The f16 step's cursor (attn_avx512.c) and the AVX2 step's
 * rows do the same: 6 % over 352 MiB of f16. */
struct pf_lines {
    const char *p, *end;      /* next line, end of its row; p NULL when all are issued */
    const char *base;
    const size_t *rows;
    size_t rb;
    int row, n, k;
};

static void pf_lines_init(struct pf_lines *c, const void *base, const size_t *rows, int n, size_t rb, int k) {
    *c = (struct pf_lines){ .base = (const char *)base, .rows = rows, .rb = rb, .n = n, .k = k };
    c->p = n > 0 ? c->base + rows[0] * rb : NULL;
    c->end = c->p ? c->p + rb : NULL;
}

ALWAYS_INLINE void pf_lines_issue(struct pf_lines *c, int k) {
    for (; k > 0 && c->p; k--) {
        _mm_prefetch(c->p, _MM_HINT_T1);
        c->p += 64;
        if (c->p >= c->end) {
            if (++c->row >= c->n) {
                c->p = NULL;
                return;
            }
            c->p = c->base + c->rows[c->row] * c->rb;
            c->end = c->p + c->rb;
        }
    }
}

/* The 16-bit weight codes of pa_quant_w16 (cpu_internal.h), bit for bit,
 * 16 at a time: the max is exact in any order and roundscale rounds the
 * product to nearest even as pa_round_even does. */
static void quant_w16(const float *w, int g, int n, int cap, int16_t *u, int us, float *ws) {
    for (int h = 0; h < g; h++) {
        const float *x = w + (size_t)h * cap;
        int16_t *c = u + (size_t)h * us;
        __m512 vm = _mm512_setzero_ps();
        for (int p = 0; p < n; p += 16) {
            const __mmask16 m = n - p >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - p)) - 1);
            vm = _mm512_max_ps(vm, _mm512_maskz_loadu_ps(m, x + p));
        }
        const float mw = _mm512_reduce_max_ps(vm);
        const bool on = mw >= 0x1p-100f;
        const __m512 inv = _mm512_set1_ps(on ? 32767.0f / mw : 0.0f);
        ws[h] = on ? mw / 32767.0f : 0.0f;
        for (int p = 0; p < n + 1; p += 16) {     /* n + 1: an odd step's last partner gets 0 */
            const int left = n - p < 0 ? 0 : n - p;
            const __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + p), inv),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            r = _mm512_min_ps(_mm512_max_ps(r, _mm512_setzero_ps()), _mm512_set1_ps(32767.0f));
            const int cnt = n + 1 - p < 16 ? n + 1 - p : 16;
            _mm256_mask_storeu_epi16(c + p, (__mmask16)((1u << cnt) - 1), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(r)));
        }
    }
}

static const int8_t zero_row[CPU_PAGED_ATTN_MAX_HEAD_DIM];

/* RH (1..4) heads' int32 sums over dims d0 .. d0 + 32 RD (RD 1..2) of the
 * position pairs: per pair, the two rows' codes widened to 16 bits and
 * interleaved (unpack lo / hi: dword lane j of each 128-bit lane L is dim
 * 8L + j, resp. 8L + 4 + j), each head's (u[p], u[p+1]) broadcast as a
 * dword, vpdpwssd; then back to dim order and onto acc by one FMA with ws. */
ALWAYS_INLINE void vtile(const int RH, const int RD, const int8_t *const *vr, int np2, const int16_t *u, int us,
                         const float *ws, float *const *acc, int d0, struct pf_lines *pf) {
    __m512i a[4][4];
    for (int h = 0; h < RH; h++)
        for (int j = 0; j < 2 * RD; j++) a[h][j] = _mm512_setzero_si512();
    for (int p = 0; p < np2; p += 2) {
        __m512i x[4];
        for (int r = 0; r < RD; r++) {
            const __m512i A = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(vr[p] + d0 + 32 * r)));
            const __m512i B = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(vr[p + 1] + d0 + 32 * r)));
            x[2 * r] = _mm512_unpacklo_epi16(A, B);
            x[2 * r + 1] = _mm512_unpackhi_epi16(A, B);
        }
        for (int h = 0; h < RH; h++) {
            int32_t pair;
            __builtin_memcpy(&pair, u + (size_t)h * us + p, sizeof pair);
            const __m512i wv = _mm512_set1_epi32(pair);
            for (int j = 0; j < 2 * RD; j++) a[h][j] = _mm512_dpwssd_epi32(a[h][j], x[j], wv);
        }
        pf_lines_issue(pf, pf->k);
    }
    /* dims 32r .. 32r+15 and 32r+16 .. 32r+31 from the lo / hi pair a[2r], a[2r+1] */
    const __m512i i0 = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(8));
    for (int h = 0; h < RH; h++) {
        const __m512 w = _mm512_set1_ps(ws[h]);
        for (int r = 0; r < RD; r++) {
            float *o = acc[h] + d0 + 32 * r;
            const __m512 s0 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(a[h][2 * r], i0, a[h][2 * r + 1]));
            const __m512 s1 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(a[h][2 * r], i1, a[h][2 * r + 1]));
            _mm512_storeu_ps(o, _mm512_fmadd_ps(w, s0, _mm512_loadu_ps(o)));
            _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(w, s1, _mm512_loadu_ps(o + 16)));
        }
    }
}

void cpu_pa_values_q8_avx512(const int8_t *v, const size_t *rows, int n, int g, int hd, const float *w, int cap,
                             float *part0, size_t pstride, const size_t *pf, int npf) {
    enum { US = CPU_PA_CHUNK + 1 };
    int16_t u[PA_Q8_MAX_G * US];
    float ws[PA_Q8_MAX_G];
    quant_w16(w, g, n, cap, u, US, ws);
    const int8_t *vr[CPU_PA_CHUNK + 1];
    for (int p = 0; p < n; p++) vr[p] = v + rows[p] * (size_t)hd;
    vr[n] = zero_row;                     /* an odd step's last partner (its code is 0) */
    const int np2 = (n + 1) / 2 * 2;
    /* the lines over the tiles' pair steps, evenly */
    const int steps = (g + 3) / 4 * ((hd + 63) / 64) * (np2 / 2), lines = npf * ((hd + 63) / 64);
    struct pf_lines pfl;
    pf_lines_init(&pfl, v, pf, npf, (size_t)hd, steps > 0 ? (lines + steps - 1) / steps : 1);
    for (int h = 0; h < g; h += 4) {
        const int rh = g - h < 4 ? g - h : 4;
        float *acc[4];
        for (int i = 0; i < rh; i++) acc[i] = part0 + (size_t)(h + i) * pstride + 2;
        const int16_t *uh = u + (size_t)h * US;
        for (int d0 = 0; d0 < hd; d0 += 64) {
            const int rd = hd - d0 >= 64 ? 2 : 1;
            switch (rh * 2 + rd) {
            case 4 * 2 + 2: vtile(4, 2, vr, np2, uh, US, ws + h, acc, d0, &pfl); break;
            case 4 * 2 + 1: vtile(4, 1, vr, np2, uh, US, ws + h, acc, d0, &pfl); break;
            case 3 * 2 + 2: vtile(3, 2, vr, np2, uh, US, ws + h, acc, d0, &pfl); break;
            case 3 * 2 + 1: vtile(3, 1, vr, np2, uh, US, ws + h, acc, d0, &pfl); break;
            case 2 * 2 + 2: vtile(2, 2, vr, np2, uh, US, ws + h, acc, d0, &pfl); break;
            case 2 * 2 + 1: vtile(2, 1, vr, np2, uh, US, ws + h, acc, d0, &pfl); break;
            case 1 * 2 + 2: vtile(1, 2, vr, np2, uh, US, ws + h, acc, d0, &pfl); break;
            default: vtile(1, 1, vr, np2, uh, US, ws + h, acc, d0, &pfl); break;
            }
        }
    }
    pf_lines_issue(&pfl, 1 << 30);
}

#else /* not built with the VNNI flags */

bool cpu_attn_q8_avx512_built(void) { return false; }

void cpu_pa_scores_q8_avx512(const int8_t *k, const size_t *rows, int n, int g, const struct pa_q8 *qq, int hd,
                             const float *rs, float *sc, int cap, const size_t *pf, int npf) {
    (void)k, (void)rows, (void)n, (void)g, (void)qq, (void)hd, (void)rs, (void)sc, (void)cap, (void)pf, (void)npf;
    KV_ASSERT(!"cpu_pa_scores_q8_avx512 without VNNI");
}

void cpu_pa_quant_q8_avx512(const float *q, int g, int hd, int8_t *code, float *scale, int32_t *sum) {
    (void)q, (void)g, (void)hd, (void)code, (void)scale, (void)sum;
    KV_ASSERT(!"cpu_pa_quant_q8_avx512 without VNNI");
}

void cpu_pa_values_q8_avx512(const int8_t *v, const size_t *rows, int n, int g, int hd, const float *w, int cap,
                             float *part0, size_t pstride, const size_t *pf, int npf) {
    (void)v, (void)rows, (void)n, (void)g, (void)hd, (void)w, (void)cap, (void)part0, (void)pstride, (void)pf,
        (void)npf;
    KV_ASSERT(!"cpu_pa_values_q8_avx512 without VNNI");
}

#endif
