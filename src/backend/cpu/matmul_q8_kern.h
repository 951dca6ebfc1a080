/* matmul_q8_kern.h — the integer matmul's group kernel (qmm.h), written
 * once and compiled three times: matmul_q8_avx2.c (QMM_ISA 1: vpmaddubsw +
 * vpmaddwd), matmul_q8_avxvnni.c (2: 256-bit vpdpbusd) and
 * matmul_q8_avx512.c (3: 512-bit vpdpbusd).  Include only from those
 * files, after defining QMM_ISA and QMM_GROUP_FN.
 *
 * One vector lane per output row: a group of 16 interleaved rows is one
 * zmm (ISA 3) or two ymm halves of 8 rows (ISA 1, 2).  Per block, run j of
 * the group's codes (4 bytes of each row) meets the token's 4 codes of the
 * same run broadcast to every lane, so after all runs lane i holds row i's
 * whole-block integer dot product P — then one conversion and one FMA per
 * (row, token, block), as qmm.h defines; results equal qmm_ref_dot bit for
 * bit in any tile shape.
 *
 * Integer dot products (all exact):
 *   Q4_x  nibbles q (unsigned) against x: ISA 1 sums the eight vpmaddubsw
 *         results of a block in int16 (each lane <= 2 * 15 * 127, eight of
 *         them <= 30480 < 2^15), then one vpmaddwd; ISA 2, 3 vpdpbusd.
 *         Q4_0's - 8 is - 8 xs (the token's code sum, which the
 *         activation row holds so: qmm_act_sum_factor), added (ISA 1) or
 *         the accumulator's start (ISA 2, 3);
 *   Q5_x  as Q4_x with the fifth bit or'ed in from the group's spread qh
 *         (qmm.h); ISA 1 sums only four runs in int16 (<= 4 * 2 * 31 * 127
 *         = 31496); Q5_0's - 16 as Q4_0's - 8;
 *   IQ4_NL, MXFP4  the nibbles looked up (vpshufb) in the type's table of
 *         16 int8 values, then as Q8_0 (|value| <= 127), runs ordered as
 *         Q4_x's; MXFP4's e8m0 scales widened to f32 exactly (IQ4_XS in
 *         tile_k likewise, per sub-block of 32);
 *   Q8_0  ISA 1: vpmaddubsw(|w|, sign(x, w)) (<= 2 * 128 * 127 per int16),
 *         vpmaddwd per run; ISA 2, 3: vpdpbusd(w ^ 0x80, x) from - 128 xs. */
#include "backend/cpu/avx2_util.h"
#include "backend/cpu/qmm.h"
#include <string.h>

#if QMM_ISA == 3
typedef __m512i vi;
typedef __m512 vf;
#define LANES 16
#else
typedef __m256i vi;
typedef __m256 vf;
#define LANES 8
#endif
/* Tokens per tile: each block's weight codes, decoded once, meet TT tokens.
 * 32 zmm registers hold 8 tokens' accumulators beside the 8 code vectors;
 * 16 ymm registers hold 4.  The K-quants' tiles keep 4 (two int32 sums per
 * token besides the accumulator). */
#if QMM_ISA == 3
#define TT 8
#else
#define TT 4
#endif
#define TTK 4
/* Software prefetch distance into a group's bytes (the first pass over a
 * group, lanes 0.., first token tile: the one that reads it from memory).
 * With few tokens (batched decode) each block's arithmetic is short and the
 * hardware prefetcher alone leaves the weights' loads exposed. */
#ifndef QMM_PF
#define QMM_PF 4096
#endif

/* Prefetch the bytes [p + QMM_PF, p + QMM_PF + n) (a hint: never faults). */
ALWAYS_INLINE void prefetch_ahead(const uint8_t *p, size_t n) {
    for (size_t o = 0; o < n; o += 64) _mm_prefetch((const char *)p + QMM_PF + o, _MM_HINT_T0);
}

ALWAYS_INLINE int32_t ld32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if QMM_ISA == 3
ALWAYS_INLINE vi ldw(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
ALWAYS_INLINE vi bc32(int32_t v) { return _mm512_set1_epi32(v); }
ALWAYS_INLINE vi and_(vi a, vi b) { return _mm512_and_si512(a, b); }
ALWAYS_INLINE vi srl4(vi a) { return _mm512_srli_epi16(a, 4); }
ALWAYS_INLINE vi xor_(vi a, vi b) { return _mm512_xor_si512(a, b); }
ALWAYS_INLINE vi set1_i8(char v) { return _mm512_set1_epi8(v); }
ALWAYS_INLINE vi izero(void) { return _mm512_setzero_si512(); }
ALWAYS_INLINE vi dot(vi acc, vi u, vi s) { return _mm512_dpbusd_epi32(acc, u, s); }
ALWAYS_INLINE vf cvt(vi a) { return _mm512_cvtepi32_ps(a); }
ALWAYS_INLINE vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
ALWAYS_INLINE vf fma_(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
ALWAYS_INLINE vf fzero(void) { return _mm512_setzero_ps(); }
ALWAYS_INLINE vf set1f(float v) { return _mm512_set1_ps(v); }
/* the 16 f16 scales at p */
ALWAYS_INLINE vf ldh(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p)); }
ALWAYS_INLINE void store(float *y, vf a, int nr) {
    if (nr >= LANES) _mm512_storeu_ps(y, a);
    else _mm512_mask_storeu_ps(y, (__mmask16)((1u << nr) - 1), a);
}
ALWAYS_INLINE vi or_(vi a, vi b) { return _mm512_or_si512(a, b); }
ALWAYS_INLINE vi add32(vi a, vi b) { return _mm512_add_epi32(a, b); }
ALWAYS_INLINE vi mullo32(vi a, vi b) { return _mm512_mullo_epi32(a, b); }
ALWAYS_INLINE vi madd16(vi a, vi b) { return _mm512_madd_epi16(a, b); }
ALWAYS_INLINE vi sll16_4(vi a) { return _mm512_slli_epi16(a, 4); }
ALWAYS_INLINE vi sll16_3(vi a) { return _mm512_slli_epi16(a, 3); }
ALWAYS_INLINE vi sll16_2(vi a) { return _mm512_slli_epi16(a, 2); }
ALWAYS_INLINE vi srl16_2(vi a) { return _mm512_srli_epi16(a, 2); }
ALWAYS_INLINE vi srl16(vi a, int n) { return _mm512_srl_epi16(a, _mm_cvtsi32_si128(n)); }
ALWAYS_INLINE vi sll16(vi a, int n) { return _mm512_sll_epi16(a, _mm_cvtsi32_si128(n)); }
/* bytes of idx (each < 16) looked up in the 16 bytes at tbl */
ALWAYS_INLINE vi lut16(const int8_t *tbl, vi idx) {
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)tbl)), idx);
}
/* the LANES e8m0 bytes at p as e8m0_half_to_f32 gives them: 2^(e - 128), subnormal for e < 2 */
ALWAYS_INLINE vf lde8(const uint8_t *p) {
    const vi e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    const vi sub = _mm512_sllv_epi32(_mm512_set1_epi32(1), _mm512_add_epi32(e, _mm512_set1_epi32(21)));
    const vi nrm = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(1)), sub, nrm));
}
ALWAYS_INLINE vi sll32_16(vi a) { return _mm512_slli_epi32(a, 16); }
ALWAYS_INLINE vi srl32_4(vi a) { return _mm512_srli_epi32(a, 4); }
/* LANES bytes at p, zero- or sign-extended to the int32 lanes */
ALWAYS_INLINE vi ldu8(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)); }
ALWAYS_INLINE vi ldi8(const uint8_t *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)); }
ALWAYS_INLINE vf fnma_(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
#else
ALWAYS_INLINE vi ldw(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)(const void *)p); }
ALWAYS_INLINE vi bc32(int32_t v) { return _mm256_set1_epi32(v); }
ALWAYS_INLINE vi and_(vi a, vi b) { return _mm256_and_si256(a, b); }
ALWAYS_INLINE vi srl4(vi a) { return _mm256_srli_epi16(a, 4); }
ALWAYS_INLINE vi xor_(vi a, vi b) { return _mm256_xor_si256(a, b); }
ALWAYS_INLINE vi set1_i8(char v) { return _mm256_set1_epi8(v); }
ALWAYS_INLINE vi izero(void) { return _mm256_setzero_si256(); }
#if QMM_ISA == 2
ALWAYS_INLINE vi dot(vi acc, vi u, vi s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#endif
ALWAYS_INLINE vf cvt(vi a) { return _mm256_cvtepi32_ps(a); }
ALWAYS_INLINE vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
ALWAYS_INLINE vf fma_(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
ALWAYS_INLINE vf fzero(void) { return _mm256_setzero_ps(); }
ALWAYS_INLINE vf set1f(float v) { return _mm256_set1_ps(v); }
ALWAYS_INLINE vf ldh(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p)); }
ALWAYS_INLINE void store(float *y, vf a, int nr) {
    if (nr >= LANES) { _mm256_storeu_ps(y, a); return; }
    float tmp[LANES];
    _mm256_storeu_ps(tmp, a);
    memcpy(y, tmp, (size_t)nr * sizeof *y);
}
#if QMM_ISA == 1
/* vpdpbusd's sum, exact where no int16 pair saturates: the K-quants' codes
 * are <= 63, so each pair is <= 2 * 63 * 127 */
ALWAYS_INLINE vi dot(vi acc, vi u, vi s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#endif
ALWAYS_INLINE vi or_(vi a, vi b) { return _mm256_or_si256(a, b); }
ALWAYS_INLINE vi add32(vi a, vi b) { return _mm256_add_epi32(a, b); }
ALWAYS_INLINE vi mullo32(vi a, vi b) { return _mm256_mullo_epi32(a, b); }
ALWAYS_INLINE vi madd16(vi a, vi b) { return _mm256_madd_epi16(a, b); }
ALWAYS_INLINE vi sll16_4(vi a) { return _mm256_slli_epi16(a, 4); }
ALWAYS_INLINE vi sll16_3(vi a) { return _mm256_slli_epi16(a, 3); }
ALWAYS_INLINE vi sll16_2(vi a) { return _mm256_slli_epi16(a, 2); }
ALWAYS_INLINE vi srl16_2(vi a) { return _mm256_srli_epi16(a, 2); }
ALWAYS_INLINE vi srl16(vi a, int n) { return _mm256_srl_epi16(a, _mm_cvtsi32_si128(n)); }
ALWAYS_INLINE vi sll16(vi a, int n) { return _mm256_sll_epi16(a, _mm_cvtsi32_si128(n)); }
ALWAYS_INLINE vi lut16(const int8_t *tbl, vi idx) {
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)tbl)), idx);
}
ALWAYS_INLINE vf lde8(const uint8_t *p) {
    const vi e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
    const vi sub = _mm256_sllv_epi32(_mm256_set1_epi32(1), _mm256_add_epi32(e, _mm256_set1_epi32(21)));
    const vi nrm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(sub, nrm, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1))));
}
ALWAYS_INLINE vi sll32_16(vi a) { return _mm256_slli_epi32(a, 16); }
ALWAYS_INLINE vi srl32_4(vi a) { return _mm256_srli_epi32(a, 4); }
ALWAYS_INLINE vi ldu8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p)); }
ALWAYS_INLINE vi ldi8(const uint8_t *p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p)); }
ALWAYS_INLINE vf fnma_(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
#endif

/* Lanes [h * LANES, h * LANES + LANES) of the group g, T tokens from t0. */
ALWAYS_INLINE void tile(const int T, uint32_t type, const struct qmm_job *j, const uint8_t *g, int h, int64_t r0,
                        int nr, int t0) {
    const int64_t nb = j->K / QMM_BLK;
    const size_t gb = QMM_IL * qmm_blk_bytes(type), sb = qmm_gcode_off(type);
    const bool has_m = qmm_has_m(type), q5 = qmm_is_q5(type), nl = qmm_is_nl(type);
    /* signed weight bytes: Q8_0's codes and the table values */
    const bool sgn = type == DTYPE_Q8_0 || nl;
    const int8_t *xq[TT];
    const float *xd[TT];
    const int32_t *xs[TT];     /* the code sums as type takes them (qmm_act_sum_factor) */
    const float *xsf[TT];
    vf acc[TT];
    for (int t = 0; t < T; t++) {
        xq[t] = (const int8_t *)(const void *)(j->act + (size_t)(t0 + t) * j->astride);
        xd[t] = (const float *)(const void *)(xq[t] + j->K);
        xs[t] = (const int32_t *)(const void *)(xd[t] + nb);
        xsf[t] = xd[t] + nb;
        acc[t] = fzero();
    }
    const bool pf = h == 0 && t0 == 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gp = g + (size_t)b * gb;
        if (pf) prefetch_ahead(gp, gb);
        const vf dv = qmm_e8m0(type) ? lde8(gp + LANES * h) : ldh(gp + 2 * LANES * h);
        vf mv = fzero();
        if (has_m) mv = ldh(gp + 32 + 2 * LANES * h);
        const uint8_t *cp = gp + sb + (size_t)(4 * LANES * h);
        vi w[8];
        if (type == DTYPE_Q8_0) {
            for (int r = 0; r < 8; r++) {
                w[r] = ldw(cp + 64 * r);
#if QMM_ISA != 1
                w[r] = xor_(w[r], set1_i8((char)0x80));
#endif
            }
        } else {
            /* Q5: run r's fifth bits are bits r (low nibbles) and 4 + r (high) of
             * each byte of the spread qh (qmm_q5_spread), moved to bit 4 */
            const vi qh = q5 ? ldw(gp + qmm_gqh_off(type) + 4 * LANES * h) : izero();
            for (int r = 0; r < 4; r++) {
                const vi v = ldw(cp + 64 * r);
                w[r] = and_(v, set1_i8(0x0f));            /* codes 4r .. 4r + 3 */
                w[4 + r] = and_(srl4(v), set1_i8(0x0f));  /* codes 16 + 4r .. */
                if (q5) {
                    w[r] = or_(w[r], and_(sll16(qh, 4 - r), set1_i8(0x10)));
                    w[4 + r] = or_(w[4 + r], and_(srl16(qh, r), set1_i8(0x10)));
                }
                if (nl) {
                    w[r] = lut16(qmm_nl_values(type), w[r]);
                    w[4 + r] = lut16(qmm_nl_values(type), w[4 + r]);
#if QMM_ISA != 1
                    w[r] = xor_(w[r], set1_i8((char)0x80));
                    w[4 + r] = xor_(w[4 + r], set1_i8((char)0x80));
#endif
                }
            }
        }
        for (int t = 0; t < T; t++) {
            const int8_t *x = xq[t] + 32 * b;
            vi p;
#if QMM_ISA == 1
            if (sgn) {
                p = izero();
                for (int r = 0; r < 8; r++) {
                    const vi xb = bc32(ld32(x + (type == DTYPE_Q8_0 || r < 4 ? 4 * r : 16 + 4 * (r - 4))));
                    p = _mm256_add_epi32(p, _mm256_madd_epi16(
                            _mm256_maddubs_epi16(_mm256_abs_epi8(w[r]), _mm256_sign_epi8(xb, w[r])),
                            _mm256_set1_epi16(1)));
                }
            } else {
                /* int16 sums of 8 runs (4-bit codes) or of 4 (5-bit): at most 30480 or 31496 */
                const int per = q5 ? 4 : 8;
                p = izero();
                for (int rs = 0; rs < 8; rs += per) {
                    vi s16 = _mm256_setzero_si256();
                    for (int r = rs; r < rs + per; r++) {
                        const int off = r < 4 ? 4 * r : 16 + 4 * (r - 4);
                        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[r], bc32(ld32(x + off))));
                    }
                    p = _mm256_add_epi32(p, _mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
                }
                if (qmm_zero(type)) p = _mm256_add_epi32(p, bc32(xs[t][b]));   /* - zero xs */
            }
#else
            /* two chains of 4 dependent products rather than one of 8 (vpdpbusd's latency is 5 cycles,
             * its rate 1 or 2 a cycle; one chain was slower even with 8 tokens per tile, measured): the
             * int32 sums are exact, so their order does not change p */
            vi pa = sgn || qmm_zero(type) ? bc32(xs[t][b]) : izero();   /* - 128 xs, - zero xs */
            vi pb = izero();
            for (int r = 0; r < 4; r++) {
                pa = dot(pa, w[r], bc32(ld32(x + 4 * r)));
                pb = dot(pb, w[4 + r], bc32(ld32(x + 16 + 4 * r)));
            }
            p = add32(pa, pb);
#endif
            const vf dx = set1f(xd[t][b]);
            acc[t] = fma_(cvt(p), mul(dv, dx), acc[t]);
            if (has_m) acc[t] = fma_(set1f(xsf[t][b]), mul(mv, dx), acc[t]);
        }
    }
    const int n_here = nr - LANES * h;
    for (int t = 0; t < T; t++)
        store(j->y + (size_t)(t0 + t) * j->ys + (size_t)r0 + (size_t)(LANES * h), acc[t], n_here);
}

/* The last step of a super-block with mins (Q2_K, Q4_K, Q5_K): M = Σ_k
 * mm[k] · (xs[2k], xs[2k+1]) by vpmaddwd, mm[k] holding the int16 pair
 * (m[2k], m[2k+1]) per lane and xs the token's code sums from xs[off]
 * (per 16 or per 32), then acc = fma(I, d · dx, acc), acc = fma(-M, dmin ·
 * dx, acc) as qmm_k.c defines. */
ALWAYS_INLINE void mins_step(const int T, const vi *mm, int np, const int16_t *const *xs, int64_t off, const vi *isum,
                             vf dv, vf mv, const float *const *xd, int64_t b, vf *acc) {
    for (int t = 0; t < T; t++) {
        vi msum = izero();
        for (int k = 0; k < np; k++) {
            int32_t pair;
            memcpy(&pair, xs[t] + off + 2 * k, 4);
            msum = add32(msum, madd16(mm[k], bc32(pair)));
        }
        const vf dx = set1f(xd[t][b]);
        acc[t] = fma_(cvt(isum[t]), mul(dv, dx), acc[t]);
        acc[t] = fnma_(cvt(msum), mul(mv, dx), acc[t]);
    }
}

/* The K-quants (qmm_k.c): lanes [h * LANES, h * LANES + LANES) of group g,
 * T tokens from t0.  Per super-block and token, the sub-blocks' integer dot
 * products P (vpdpbusd, or its exact AVX2 equivalent) are scaled by the
 * rows' sc in int32 (vpmulld) and summed into I; Q4_K / Q5_K's mins meet
 * the token's 32-sums in vpmaddwd (pairs of int16: m[2k], m[2k+1] against
 * xs32[2k], xs32[2k+1]).  All integer, all exact (bounds in qmm_k.c), so
 * only the two float steps per super-block matter, done as qmm_k.c writes
 * them.  The weights' codes are decoded once per 4 runs and used by every
 * token of the tile. */
ALWAYS_INLINE void tile_k(const int T, uint32_t type, const struct qmm_job *j, const uint8_t *g, int h, int64_t r0,
                          int nr, int t0) {
    const int64_t nb = j->K / QMM_QK;
    const size_t gb = qmm_gblock_bytes_k(type);
    const int8_t *xq[TTK];
    const float *xd[TTK];
    const int16_t *xs16[TTK], *xs32[TTK];
    vf acc[TTK];
    for (int t = 0; t < T; t++) {
        xq[t] = (const int8_t *)(const void *)(j->act + (size_t)(t0 + t) * j->astride);
        xd[t] = (const float *)(const void *)(xq[t] + j->K);
        xs16[t] = (const int16_t *)(const void *)(xd[t] + nb);
        xs32[t] = xs16[t] + j->K / 16;
        acc[t] = fzero();
    }
    const vi m0f = set1_i8(0x0f);
    const bool pf = h == 0 && t0 == 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gp = g + (size_t)b * gb;
        if (pf) prefetch_ahead(gp, gb);
        const vf dv = ldh(gp + 2 * LANES * h);
        vi isum[TTK];
        for (int t = 0; t < T; t++) isum[t] = izero();
        if (type == DTYPE_Q6_K) {
            const uint8_t *scp = gp + 32 + LANES * h, *qhp = gp + 288 + 4 * LANES * h, *qlp = gp + 1312 + 4 * LANES * h;
            const vi m30 = set1_i8(0x30);
            for (int c = 0; c < 4; c++)
                for (int q = 0; q < 2; q++) {     /* runs 4q .. 4q+3: sub-blocks 4c + q (low), 4c + 2 + q (high) */
                    vi w[8];
                    for (int k = 0; k < 4; k++) {
                        const vi v = ldw(qlp + 64 * (8 * c + 4 * q + k)), hb = ldw(qhp + 64 * (4 * c + k));
                        const vi lo = and_(v, m0f), hi = and_(srl4(v), m0f);
                        if (q == 0) {
                            w[k] = or_(lo, and_(sll16_4(hb), m30));
                            w[4 + k] = or_(hi, and_(sll16_2(hb), m30));
                        } else {
                            w[k] = or_(lo, and_(hb, m30));
                            w[4 + k] = or_(hi, and_(srl16_2(hb), m30));
                        }
                    }
                    const vi slo = ldi8(scp + 16 * (4 * c + q)), shi = ldi8(scp + 16 * (4 * c + 2 + q));
                    for (int t = 0; t < T; t++) {
                        const int8_t *x = xq[t] + QMM_QK * b + 64 * c + 16 * q;
                        const int16_t *s16 = xs16[t] + 16 * b + 4 * c + q;
                        vi plo = bc32(-32 * s16[0]), phi = bc32(-32 * s16[2]);
                        for (int k = 0; k < 4; k++) {
                            plo = dot(plo, w[k], bc32(ld32(x + 4 * k)));
                            phi = dot(phi, w[4 + k], bc32(ld32(x + 32 + 4 * k)));
                        }
                        isum[t] = add32(isum[t], add32(mullo32(plo, slo), mullo32(phi, shi)));
                    }
                }
            for (int t = 0; t < T; t++) acc[t] = fma_(cvt(isum[t]), mul(dv, set1f(xd[t][b])), acc[t]);
            continue;
        }
        if (type == DTYPE_IQ4_XS) {
            const uint8_t *scp = gp + 32 + LANES * h, *qsp = gp + 160 + 4 * LANES * h;
            for (int s = 0; s < 8; s++) {        /* sub-blocks of 32: runs 4s .. 4s + 3 */
                vi w[8];
                for (int k = 0; k < 4; k++) {
                    const vi v = ldw(qsp + 64 * (4 * s + k));
                    w[k] = lut16(kvalues_iq4nl, and_(v, m0f));
                    w[4 + k] = lut16(kvalues_iq4nl, and_(srl4(v), m0f));
                }
#if QMM_ISA != 1
                for (int r = 0; r < 8; r++) w[r] = xor_(w[r], set1_i8((char)0x80));
#endif
                const vf dsc = mul(dv, cvt(ldi8(scp + 16 * s)));   /* d (sc - 32): exact */
                for (int t = 0; t < T; t++) {
                    const int8_t *x = xq[t] + QMM_QK * b + 32 * s;
#if QMM_ISA == 1
                    vi p = izero();
                    for (int r = 0; r < 8; r++) {
                        const vi xb = bc32(ld32(x + (r < 4 ? 4 * r : 16 + 4 * (r - 4))));
                        p = add32(p, madd16(_mm256_maddubs_epi16(_mm256_abs_epi8(w[r]), _mm256_sign_epi8(xb, w[r])),
                                            _mm256_set1_epi16(1)));
                    }
#else
                    /* 32-block activation rows (qmm.h): dx and the code sums (as - 128 xs) per 32 */
                    const int32_t *xs = (const int32_t *)(const void *)(xd[t] + j->K / 32);
                    vi pa = bc32(xs[8 * b + s]), pb = izero();   /* - 128 xs; two chains, as tile()'s */
                    for (int r = 0; r < 4; r++) {
                        pa = dot(pa, w[r], bc32(ld32(x + 4 * r)));
                        pb = dot(pb, w[4 + r], bc32(ld32(x + 16 + 4 * r)));
                    }
                    const vi p = add32(pa, pb);
#endif
                    acc[t] = fma_(cvt(p), mul(dsc, set1f(xd[t][8 * b + s])), acc[t]);
                }
            }
            continue;
        }
        if (type == DTYPE_Q2_K || type == DTYPE_Q3_K) {
            const bool q3 = type == DTYPE_Q3_K;
            const uint8_t *scp = gp + (q3 ? 32 : 64) + LANES * h, *hmp = gp + 288 + 4 * LANES * h;
            const uint8_t *qsp = gp + (q3 ? 800 : 320) + 4 * LANES * h;
            const vi m03 = set1_i8(3), m04 = set1_i8(4);
            for (int hh = 0; hh < 2; hh++)       /* halves of 128 */
                for (int gg = 0; gg < 2; gg++) { /* bytes 16 gg .. of the half's 32: runs 8 hh + 4 gg + k */
                    vi v[4], hm[4];
                    for (int k = 0; k < 4; k++) {
                        v[k] = ldw(qsp + 64 * (8 * hh + 4 * gg + k));
                        hm[k] = q3 ? ldw(hmp + 64 * (4 * gg + k)) : izero();
                    }
                    for (int s = 0; s < 4; s++) {    /* bits 2s: sub-block 8 hh + 2 s + gg */
                        const int S = 8 * hh + 2 * s + gg, hb = 4 * hh + s;   /* Q3_K: its hmask bit */
                        vi w[4];
                        for (int k = 0; k < 4; k++) {
                            w[k] = and_(srl16(v[k], 2 * s), m03);
                            if (q3) w[k] = or_(w[k], and_(hb >= 2 ? srl16(hm[k], hb - 2) : sll16(hm[k], 2 - hb), m04));
                        }
                        const vi sc = q3 ? ldi8(scp + 16 * S) : and_(ldu8(scp + 16 * S), bc32(15));
                        for (int t = 0; t < T; t++) {
                            const int8_t *x = xq[t] + QMM_QK * b + 128 * hh + 32 * s + 16 * gg;
                            vi p = q3 ? bc32(-4 * xs16[t][16 * b + S]) : izero();
                            for (int k = 0; k < 4; k++) p = dot(p, w[k], bc32(ld32(x + 4 * k)));
                            isum[t] = add32(isum[t], mullo32(p, sc));
                        }
                    }
                }
            if (q3) {
                for (int t = 0; t < T; t++) acc[t] = fma_(cvt(isum[t]), mul(dv, set1f(xd[t][b])), acc[t]);
                continue;
            }
            /* Q2_K's mins (the high nibbles) against the 16-sums */
            vi mm[8];
            for (int k = 0; k < 8; k++)
                mm[k] = or_(srl32_4(ldu8(scp + 16 * (2 * k))), sll32_16(srl32_4(ldu8(scp + 16 * (2 * k + 1)))));
            mins_step(T, mm, 8, xs16, 16 * b, isum, dv, ldh(gp + 32 + 2 * LANES * h), xd, b, acc);
            continue;
        }
        /* Q4_K, Q5_K */
        const vf mv = ldh(gp + 32 + 2 * LANES * h);
        const uint8_t *scp = gp + 64 + LANES * h, *mp = gp + 192 + LANES * h, *qhp = gp + 320 + 4 * LANES * h;
        const uint8_t *qsp = gp + (type == DTYPE_Q4_K ? 320 : 832) + 4 * LANES * h;
        const vi m10 = set1_i8(0x10);
        for (int c = 0; c < 4; c++) {            /* sub-blocks 2c (low nibbles), 2c + 1 (high) */
            vi plo[TTK], phi[TTK];
            for (int t = 0; t < T; t++) plo[t] = phi[t] = izero();
            for (int q = 0; q < 2; q++) {
                vi w[8];
                for (int k = 0; k < 4; k++) {
                    const vi v = ldw(qsp + 64 * (8 * c + 4 * q + k));
                    w[k] = and_(v, m0f);
                    w[4 + k] = and_(srl4(v), m0f);
                    if (type == DTYPE_Q5_K) {    /* bit 2c of the run's qh bytes for low, 2c + 1 for high */
                        const vi hb = srl16(ldw(qhp + 64 * (4 * q + k)), 2 * c);
                        w[k] = or_(w[k], and_(sll16_4(hb), m10));
                        w[4 + k] = or_(w[4 + k], and_(sll16_3(hb), m10));
                    }
                }
                for (int t = 0; t < T; t++) {
                    const int8_t *x = xq[t] + QMM_QK * b + 64 * c + 16 * q;
                    for (int k = 0; k < 4; k++) {
                        plo[t] = dot(plo[t], w[k], bc32(ld32(x + 4 * k)));
                        phi[t] = dot(phi[t], w[4 + k], bc32(ld32(x + 32 + 4 * k)));
                    }
                }
            }
            const vi slo = ldu8(scp + 16 * (2 * c)), shi = ldu8(scp + 16 * (2 * c + 1));
            for (int t = 0; t < T; t++) isum[t] = add32(isum[t], add32(mullo32(plo[t], slo), mullo32(phi[t], shi)));
        }
        vi mm[4];
        for (int k = 0; k < 4; k++) mm[k] = or_(ldu8(mp + 16 * (2 * k)), sll32_16(ldu8(mp + 16 * (2 * k + 1))));
        mins_step(T, mm, 4, xs32, 8 * b, isum, dv, mv, xd, b, acc);
    }
    const int n_here = nr - LANES * h;
    for (int t = 0; t < T; t++)
        store(j->y + (size_t)(t0 + t) * j->ys + (size_t)r0 + (size_t)(LANES * h), acc[t], n_here);
}

ALWAYS_INLINE void group_k(uint32_t type, const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) {
    for (int h = 0; h * LANES < nr; h++) {
        int t = 0;
        for (; t + TTK <= j->n; t += TTK) tile_k(TTK, type, j, g, h, r0, nr, t);
        switch (j->n - t) {
        case 3: tile_k(3, type, j, g, h, r0, nr, t); break;
        case 2: tile_k(2, type, j, g, h, r0, nr, t); break;
        case 1: tile_k(1, type, j, g, h, r0, nr, t); break;
        default: break;
        }
    }
}

ALWAYS_INLINE void group(uint32_t type, const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) {
    for (int h = 0; h * LANES < nr; h++) {
        int t = 0;
        for (; t + TT <= j->n; t += TT) tile(TT, type, j, g, h, r0, nr, t);
        switch (j->n - t) {
#if TT > 4
        case 7: tile(7, type, j, g, h, r0, nr, t); break;
        case 6: tile(6, type, j, g, h, r0, nr, t); break;
        case 5: tile(5, type, j, g, h, r0, nr, t); break;
        case 4: tile(4, type, j, g, h, r0, nr, t); break;
#endif
        case 3: tile(3, type, j, g, h, r0, nr, t); break;
        case 2: tile(2, type, j, g, h, r0, nr, t); break;
        case 1: tile(1, type, j, g, h, r0, nr, t); break;
        default: break;
        }
    }
}

static void group_q8_0(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { group(DTYPE_Q8_0, j, g, r0, nr); }
static void group_q4_0(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { group(DTYPE_Q4_0, j, g, r0, nr); }
static void group_q4_1(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { group(DTYPE_Q4_1, j, g, r0, nr); }
static void group_q5_0(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { group(DTYPE_Q5_0, j, g, r0, nr); }
static void group_q5_1(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { group(DTYPE_Q5_1, j, g, r0, nr); }
static void group_iq4_nl(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { group(DTYPE_IQ4_NL, j, g, r0, nr); }
static void group_mxfp4(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { group(DTYPE_MXFP4, j, g, r0, nr); }

static void group_q4_k(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { group_k(DTYPE_Q4_K, j, g, r0, nr); }
static void group_q5_k(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { group_k(DTYPE_Q5_K, j, g, r0, nr); }
static void group_q6_k(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { group_k(DTYPE_Q6_K, j, g, r0, nr); }
static void group_q2_k(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { group_k(DTYPE_Q2_K, j, g, r0, nr); }
static void group_q3_k(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { group_k(DTYPE_Q3_K, j, g, r0, nr); }
static void group_iq4_xs(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { group_k(DTYPE_IQ4_XS, j, g, r0, nr); }

void QMM_GROUP_FN(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) {
    switch (j->type) {
    case DTYPE_Q8_0: group_q8_0(j, g, r0, nr); break;
    case DTYPE_Q4_0: group_q4_0(j, g, r0, nr); break;
    case DTYPE_Q4_1: group_q4_1(j, g, r0, nr); break;
    case DTYPE_Q5_0: group_q5_0(j, g, r0, nr); break;
    case DTYPE_Q5_1: group_q5_1(j, g, r0, nr); break;
    case DTYPE_IQ4_NL: group_iq4_nl(j, g, r0, nr); break;
    case DTYPE_MXFP4: group_mxfp4(j, g, r0, nr); break;
    case DTYPE_Q4_K: group_q4_k(j, g, r0, nr); break;
    case DTYPE_Q5_K: group_q5_k(j, g, r0, nr); break;
    case DTYPE_Q2_K: group_q2_k(j, g, r0, nr); break;
    case DTYPE_Q3_K: group_q3_k(j, g, r0, nr); break;
    case DTYPE_IQ4_XS: group_iq4_xs(j, g, r0, nr); break;
    default: group_q6_k(j, g, r0, nr); break;
    }
}
