/* matmul_q8_kern.h — the integer matmul's micro-kernels (qmm.h), written
 * once and compiled three times: matmul_q8_avx2.c (QMM_ISA 1: vpmaddubsw +
 * vpmaddwd), matmul_q8_avxvnni.c (2: 256-bit vpdpbusd) and
 * matmul_q8_avx512.c (3: 512-bit vpdpbusd, two weight rows per register).
 * Include only from those files, after defining QMM_ISA and QMM_ROWS_FN.
 *
 * A "group" is the rows one vector covers: 1 row (8 int32 / f32 lanes) for
 * ISA 1 and 2, 2 rows (lanes 0-7 row r, 8-15 row r + 1) for ISA 3.  Each
 * (row, token) owns 8 lanes and gets qmm.h's sequence of integer dot
 * products, conversions, multiplies and FMAs in block order, lane by lane,
 * in every tile shape; so results equal qmm_ref_dot bit for bit.
 *
 * Integer dot products (all exact, see qmm.h):
 *   Q4_1  P = dot(q, x) on unsigned nibbles q, and X = dot(1, x);
 *   Q4_0  P = dot(q, x) - dot(8, x)   (the second per token and block);
 *   Q8_0  ISA 1: dot(|w|, sign(x, w)) (vpmaddubsw multiplies u8 by s8);
 *         ISA 2, 3: dot(w ^ 0x80, x) - dot(128, x)  (w + 128 is unsigned;
 *         vpdpbusd has no int16 step that w + 128 could saturate). */
#include "backend/cpu/avx2_util.h"
#include "backend/cpu/qmm.h"
#include <string.h>

#if QMM_ISA == 3
typedef __m512i vi;
typedef __m512 vf;
#define G 2                 /* rows per vector */
#define RG 4                /* groups per tile: 8 rows */
#define TT 3                /* tokens per tile (prefill) */
#else
typedef __m256i vi;
typedef __m256 vf;
#define G 1
#define RG 4
#define TT 2
#endif
#define TB 64               /* tokens per cache block */

ALWAYS_INLINE float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* acc + Σ4 u8 · s8 per int32 lane */
ALWAYS_INLINE vi dot_us(vi acc, vi u, vi s) {
#if QMM_ISA == 1
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#elif QMM_ISA == 2
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm512_dpbusd_epi32(acc, u, s);
#endif
}

#if QMM_ISA == 3
ALWAYS_INLINE vi vzero(void) { return _mm512_setzero_si512(); }
ALWAYS_INLINE vi set1_i8(char v) { return _mm512_set1_epi8(v); }
ALWAYS_INLINE vi sub32(vi a, vi b) { return _mm512_sub_epi32(a, b); }
ALWAYS_INLINE vi xor_i(vi a, vi b) { return _mm512_xor_si512(a, b); }
ALWAYS_INLINE vf cvt(vi a) { return _mm512_cvtepi32_ps(a); }
ALWAYS_INLINE vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
ALWAYS_INLINE vf fma_(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
ALWAYS_INLINE vf fzero(void) { return _mm512_setzero_ps(); }
ALWAYS_INLINE vf set1f(float v) { return _mm512_set1_ps(v); }
ALWAYS_INLINE vf set2f(float a, float b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(a))),
                                               _mm256_castps_pd(_mm256_set1_ps(b)), 1));
}
/* activation codes of a block, in both halves */
ALWAYS_INLINE vi ld_x(const int8_t *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)p)); }
/* Q4 nibbles of two rows: [r0 elements 0..31 | r1 elements 0..31] */
ALWAYS_INLINE vi ld_w4(const uint8_t *q0, const uint8_t *q1) {
    const __m256i v = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(const void *)q1),
                                       _mm_loadu_si128((const __m128i *)(const void *)q0));
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
    /* 128-bit lanes r0 lo, r1 lo, r0 hi, r1 hi -> r0 lo, r0 hi, r1 lo, r1 hi */
    return _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(0x0f));
}
ALWAYS_INLINE vi ld_w8(const uint8_t *q0, const uint8_t *q1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)q0)),
                              _mm256_loadu_si256((const __m256i *)(const void *)q1), 1);
}
/* the group's rows' sums: lanes 0-7 to y0, 8-15 to y1 (if y1) */
ALWAYS_INLINE void store(vf a, float *y0, float *y1) {
    *y0 = avx2_hsum_pairs(_mm512_castps512_ps256(a));
    if (y1) *y1 = avx2_hsum_pairs(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}
#else
ALWAYS_INLINE vi vzero(void) { return _mm256_setzero_si256(); }
ALWAYS_INLINE vi set1_i8(char v) { return _mm256_set1_epi8(v); }
ALWAYS_INLINE vi sub32(vi a, vi b) { return _mm256_sub_epi32(a, b); }
ALWAYS_INLINE vi xor_i(vi a, vi b) { return _mm256_xor_si256(a, b); }
ALWAYS_INLINE vf cvt(vi a) { return _mm256_cvtepi32_ps(a); }
ALWAYS_INLINE vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
ALWAYS_INLINE vf fma_(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
ALWAYS_INLINE vf fzero(void) { return _mm256_setzero_ps(); }
ALWAYS_INLINE vf set1f(float v) { return _mm256_set1_ps(v); }
ALWAYS_INLINE vf set2f(float a, float b) { (void)b; return _mm256_set1_ps(a); }
ALWAYS_INLINE vi ld_x(const int8_t *p) { return _mm256_loadu_si256((const __m256i *)(const void *)p); }
ALWAYS_INLINE vi ld_w4(const uint8_t *q0, const uint8_t *q1) {
    (void)q1;
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)q0);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0f));
}
ALWAYS_INLINE vi ld_w8(const uint8_t *q0, const uint8_t *q1) {
    (void)q1;
    return _mm256_loadu_si256((const __m256i *)(const void *)q0);
}
ALWAYS_INLINE void store(vf a, float *y0, float *y1) { (void)y1; *y0 = avx2_hsum_pairs(a); }
#endif

ALWAYS_INLINE size_t wblock(uint32_t type) {
    return type == DTYPE_Q8_0 ? sizeof(struct block_q8_0)
         : type == DTYPE_Q4_0 ? sizeof(struct block_q4_0) : sizeof(struct block_q4_1);
}

/* R groups x T tokens over all blocks.  w[g][0..1]: the group's rows (the
 * same row twice for a lone last row on ISA 3); xq / xd: token t's codes
 * and scales; y[g][t][0..1]: where the rows' results go (y[g][t][1] NULL:
 * not stored).  R, T and type are constants after inlining. */
ALWAYS_INLINE void micro(const int R, const int T, uint32_t type, int64_t nb, const uint8_t *const w[RG][2],
                         const int8_t *const xq[TT], const float *const xd[TT], float *const y[RG][TT][2]) {
    const size_t bb = wblock(type);
    const size_t qoff = type == DTYPE_Q4_1 ? 4 : 2;   /* codes follow d (and m) */
    vf acc[RG][TT];
    for (int g = 0; g < R; g++)
        for (int t = 0; t < T; t++) acc[g][t] = fzero();
    for (int64_t b = 0; b < nb; b++) {
        vi xv[TT], corr[TT];
        vf dx[TT], xf[TT];
        for (int t = 0; t < T; t++) {
            xv[t] = ld_x(xq[t] + 32 * b);
            dx[t] = set1f(xd[t][b]);
            if (type == DTYPE_Q4_0) corr[t] = dot_us(vzero(), set1_i8(8), xv[t]);
            if (type == DTYPE_Q4_1) xf[t] = cvt(dot_us(vzero(), set1_i8(1), xv[t]));
#if QMM_ISA != 1
            if (type == DTYPE_Q8_0) corr[t] = dot_us(vzero(), set1_i8((char)0x80), xv[t]);
#endif
        }
        for (int g = 0; g < R; g++) {
            const uint8_t *b0 = w[g][0] + (size_t)b * bb, *b1 = w[g][1] + (size_t)b * bb;
            const vf dw = set2f(h2f(b0), h2f(b1));
            vf mw = fzero();
            if (type == DTYPE_Q4_1) mw = set2f(h2f(b0 + 2), h2f(b1 + 2));
            vi wv = type == DTYPE_Q8_0 ? ld_w8(b0 + qoff, b1 + qoff) : ld_w4(b0 + qoff, b1 + qoff);
#if QMM_ISA == 1
            vi wa = wv;
            if (type == DTYPE_Q8_0) wa = _mm256_abs_epi8(wv);
#else
            if (type == DTYPE_Q8_0) wv = xor_i(wv, set1_i8((char)0x80));
#endif
            for (int t = 0; t < T; t++) {
                vi p;
#if QMM_ISA == 1
                if (type == DTYPE_Q8_0) p = dot_us(vzero(), wa, _mm256_sign_epi8(xv[t], wv));
                else p = dot_us(vzero(), wv, xv[t]);
#else
                p = dot_us(vzero(), wv, xv[t]);
#endif
                if (type != DTYPE_Q4_1 && (type == DTYPE_Q4_0 || QMM_ISA != 1)) p = sub32(p, corr[t]);
                acc[g][t] = fma_(cvt(p), mul(dw, dx[t]), acc[g][t]);
                if (type == DTYPE_Q4_1) acc[g][t] = fma_(xf[t], mul(mw, dx[t]), acc[g][t]);
            }
        }
    }
    for (int g = 0; g < R; g++)
        for (int t = 0; t < T; t++) store(acc[g][t], y[g][t][0], y[g][t][1]);
}

/* Rows [r0, r0 + nr) x tokens [t0, t0 + T) with groups of R (the rows'
 * count a multiple of R * G, except that the last group may hold one row). */
ALWAYS_INLINE void tile(const int R, const int T, uint32_t type, const struct qmm_job *j, int64_t r0, int nrows,
                        int t0) {
    const uint8_t *w[RG][2];
    const int8_t *xq[TT];
    const float *xd[TT];
    float *y[RG][TT][2];
    for (int t = 0; t < T; t++) {
        xq[t] = (const int8_t *)(const void *)(j->act + (size_t)(t0 + t) * j->astride);
        xd[t] = (const float *)(const void *)(xq[t] + j->K);
    }
    for (int g = 0; g < R; g++) {
        const int64_t ra = r0 + (int64_t)g * G, rb = G == 2 && g * G + 1 < nrows ? ra + 1 : ra;
        w[g][0] = j->w + (size_t)ra * j->wstride;
        w[g][1] = j->w + (size_t)rb * j->wstride;
        for (int t = 0; t < T; t++) {
            y[g][t][0] = j->y + (size_t)(t0 + t) * j->ys + (size_t)ra;
            y[g][t][1] = rb != ra ? j->y + (size_t)(t0 + t) * j->ys + (size_t)rb : NULL;
        }
    }
    micro(R, T, type, j->K / 32, w, xq, xd, y);
}

/* Rows [r0, r0 + nr), tokens [t0, t1): full tiles, then the edges. */
ALWAYS_INLINE void sweep(uint32_t type, const struct qmm_job *j, int64_t r0, int nr, int t0, int t1) {
    int r = 0;
    for (; r + RG * G <= nr; r += RG * G) {
        int t = t0;
        if (t1 - t0 == 1) { tile(RG, 1, type, j, r0 + r, RG * G, t); continue; }
        for (; t + TT <= t1; t += TT) tile(RG, TT, type, j, r0 + r, RG * G, t);
        for (; t < t1; t++) tile(RG, 1, type, j, r0 + r, RG * G, t);
    }
    for (; r < nr; r += G) {
        const int left = nr - r < G ? nr - r : G;
        int t = t0;
        for (; t + TT <= t1; t += TT) tile(1, TT, type, j, r0 + r, left, t);
        for (; t < t1; t++) tile(1, 1, type, j, r0 + r, left, t);
    }
}

static void sweep_q8_0(const struct qmm_job *j, int64_t r0, int nr, int t0, int t1) { sweep(DTYPE_Q8_0, j, r0, nr, t0, t1); }
static void sweep_q4_0(const struct qmm_job *j, int64_t r0, int nr, int t0, int t1) { sweep(DTYPE_Q4_0, j, r0, nr, t0, t1); }
static void sweep_q4_1(const struct qmm_job *j, int64_t r0, int nr, int t0, int t1) { sweep(DTYPE_Q4_1, j, r0, nr, t0, t1); }

void QMM_ROWS_FN(const struct qmm_job *j, int64_t r0, int nr) {
    void (*sw)(const struct qmm_job *, int64_t, int, int, int) =
        j->type == DTYPE_Q8_0 ? sweep_q8_0 : j->type == DTYPE_Q4_0 ? sweep_q4_0 : sweep_q4_1;
    for (int t0 = 0; t0 < j->n; t0 += TB) sw(j, r0, nr, t0, j->n - t0 < TB ? j->n : t0 + TB);
}
