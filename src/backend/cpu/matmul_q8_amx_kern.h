/* matmul_q8_amx_kern.h — the integer matmul's group kernel (qmm.h) on AMX
 * tiles, written once against the tile operations T_* and compiled twice:
 * matmul_q8_amx.c (the instructions, inline asm) and matmul_q8_amx_emu.c
 * (amx_emu.c's emulator, so the logic is tested on any AVX-512 CPU).
 * Include only from those, after defining QMM_AMX_EMU (0 or 1),
 * QMM_AMX_FN, QMM_AMX_MIN_N, QMM_AMX_TAIL_VNNI and the T_* macros (below).
 *
 * Per block of 32 codes (K-quants: per sub-block of 32, Q6_K of 16) one
 * tile product gives the integer dot products P of 16 tokens × the group's
 * 16 rows at once:
 *   B (tile TB): K / 4 rows of 64 bytes, row k = bytes 4k .. 4k+3 of each
 *     weight row — TENSOR_Q8X16's runs, so Q8_0's block is the group's
 *     bytes (copied to wbuf: chunk); the 4- and 5-bit and K-quant codes are unpacked to bytes
 *     (AVX-512) into wbuf first, once per group and block, and the tile is
 *     used by every token tile of the chunk;
 *   A (TA; TAT for the last n % 16 tokens): one row per token, loaded
 *     straight from the activation rows (stride astride);
 *   C (TC; TCT) = A · B: tdpbssd for Q8_0 (signed × signed), tdpbsud for
 *     the K-quants (signed activations × unsigned codes), stored to cbuf;
 *     the other 4- and 5-bit types unpack to w - zero and use tdpbssd.
 * Then AVX-512 does exactly what matmul_q8_kern.h does per (token, block)
 * with one lane per weight row: Q6_K's - 32 xs16 added in int32, the
 * K-quants' sc · P summed in int32 (vpmulld) and their mins by vpmaddwd, then the same conversions and FMAs in the same order.  The
 * integer values are the same exact sums (no overflow: qmm.h, qmm_k.c), so
 * the result equals qmm_group_scalar's bit for bit.
 *
 * Accumulators: a chunk of up to QMM_AMX_CH tokens at a time keeps its
 * rows' f32 accumulators in acc (4 KiB on the stack), so the weights'
 * unpacking is shared by 4 token tiles and acc stays in L1.  The simple
 * types (chunk) go a span of blocks at a time instead, each token tile
 * with its accumulators in registers through the span and its products
 * issued a few blocks ahead of the rescale, in four C tiles (the K-quants,
 * chunk_k, still use the one TC).  Fewer than
 * QMM_AMX_MIN_N tokens (decode) go to the AVX-512 VNNI kernel instead —
 * same bits, and a tile product would be mostly empty — and so do IQ4_NL,
 * MXFP4, IQ4_XS, Q2_K and Q3_K for now; with QMM_AMX_TAIL_VNNI so do the
 * last n % 16 tokens of a job (the emulated build keeps them on tiles, so
 * the tail tiles stay tested). */
#include "backend/cpu/avx2_util.h"
#include "backend/cpu/qmm.h"
#include "core/core.h"
#include <string.h>

/* tiles */
#define TB 0    /* weights: K / 4 rows of 64 bytes */
#define TA 1    /* activations of 16 tokens: 16 rows of K bytes */
#define TC 2    /* C: 16 tokens × 16 int32 */
#define TAT 3   /* the last n % 16 tokens */
#define TCT 4
#define TB2 5   /* Q6_K: the second sub-block of a pair */

#define QMM_AMX_CH 64   /* tokens per chunk: 4 tiles */

typedef __m512i vi;
typedef __m512 vf;

ALWAYS_INLINE vi ldw(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
ALWAYS_INLINE vi m8(char v) { return _mm512_set1_epi8(v); }
ALWAYS_INLINE vi and_(vi a, vi b) { return _mm512_and_si512(a, b); }
ALWAYS_INLINE vi or_(vi a, vi b) { return _mm512_or_si512(a, b); }
ALWAYS_INLINE vi srl4(vi a) { return _mm512_srli_epi16(a, 4); }
ALWAYS_INLINE vf ldh(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p)); }
ALWAYS_INLINE vi ldu8(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)); }
ALWAYS_INLINE vi ldi8(const uint8_t *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)); }
ALWAYS_INLINE vi ld32x16(const int32_t *p) { return _mm512_loadu_si512((const void *)p); }

/* The tile shapes of one call: kb activation bytes per product (32, Q6_K
 * 16), tail = n % 16 rows in TAT / TCT (unconfigured when 0). */
ALWAYS_INLINE void amx_config(struct amx_cfg *cfg, int kb, int tail) {
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    cfg->rows[TB] = (uint8_t)(kb / 4);
    cfg->colsb[TB] = 64;
    cfg->rows[TB2] = (uint8_t)(kb / 4);
    cfg->colsb[TB2] = 64;
    cfg->rows[TA] = 16;
    cfg->colsb[TA] = (uint16_t)kb;
    cfg->rows[TC] = 16;
    cfg->colsb[TC] = 64;
    if (tail) {
        cfg->rows[TAT] = (uint8_t)tail;
        cfg->colsb[TAT] = (uint16_t)kb;
        cfg->rows[TCT] = (uint8_t)tail;
        cfg->colsb[TCT] = 64;
    }
}

/* C = A · B for one token tile: m tokens (16, or the tail) whose codes for
 * this product start at a, astride apart; C to cbuf (16 int32 per token).
 * b2: the weights in TB2 rather than TB.  Signed weights: tdpbssd. */
#define TILE_PRODUCT(m, a, astride, cbuf, b2, ssd)                             \
    do {                                                                       \
        if ((m) == 16) {                                                       \
            T_LOAD(TA, (a), (astride));                                        \
            T_ZERO(TC);                                                        \
            if (ssd) T_DPBSSD(TC, TA, TB);                                     \
            else if (b2) T_DPBSUD(TC, TA, TB2);                                \
            else T_DPBSUD(TC, TA, TB);                                         \
            T_STORE(TC, (cbuf), 64);                                           \
        } else {                                                               \
            T_LOAD(TAT, (a), (astride));                                       \
            T_ZERO(TCT);                                                       \
            if (ssd) T_DPBSSD(TCT, TAT, TB);                                   \
            else if (b2) T_DPBSUD(TCT, TAT, TB2);                              \
            else T_DPBSUD(TCT, TAT, TB);                                       \
            T_STORE(TCT, (cbuf), 64);                                          \
        }                                                                      \
    } while (0)

/* The simple types' tiles: A and B alternate by block, C cycles through
 * four, so consecutive products share no tile (a tilezero waits on no
 * tilestored before it) and QMM_AMX_AHEAD products are in flight while
 * AVX-512 rescales an earlier one from its own cbuf. */
#define SA0 0   /* activations: 16 tokens × 32 codes */
#define SA1 1
#define SB0 2   /* weights: 8 rows of 64 (32 codes of 16 rows) */
#define SB1 3
#define SC0 4   /* 16 tokens × 16 int32, to cbuf[s % QMM_AMX_NCB] */
#define SC1 5
#define SC2 6
#define SC3 7
#define QMM_AMX_SPAN 8    /* blocks whose B tiles are made at once (dxs: one ymm per token) */
#define QMM_AMX_NCB 8     /* C buffers */
#define QMM_AMX_AHEAD 3   /* products issued ahead of the rescale; < QMM_AMX_NCB, <= 4 (C tiles) - 1 */

ALWAYS_INLINE void amx_config_s(struct amx_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int t = SA0; t <= SA1; t++) cfg->rows[t] = 16, cfg->colsb[t] = 32;
    for (int t = SB0; t <= SB1; t++) cfg->rows[t] = 8, cfg->colsb[t] = 64;
    for (int t = SC0; t <= SC3; t++) cfg->rows[t] = 16, cfg->colsb[t] = 64;
}

#define S_PRODUCT(ta, tb, tc, a, astride, w, cb)                              \
    do {                                                                       \
        T_LOAD(ta, (a), (astride));                                            \
        T_LOAD(tb, (w), 64);                                                   \
        T_ZERO(tc);                                                            \
        T_DPBSSD(tc, ta, tb);                                                  \
        T_STORE(tc, (cb), 64);                                                 \
    } while (0)

/* Block s of the span: 16 token rows of 32 codes at a (astride apart)
 * times the weights' B tile at w, to cbuf[s % QMM_AMX_NCB]. */
ALWAYS_INLINE void s_product(T_STATE_PARAM, int s, const uint8_t *a, size_t astride, const uint8_t *w,
                             int32_t (*cbuf)[16][16]) {
    (void)ts_;
    int32_t(*cb)[16] = cbuf[s % QMM_AMX_NCB];
    switch (s & 3) {
    case 0: S_PRODUCT(SA0, SB0, SC0, a, astride, w, cb); break;
    case 1: S_PRODUCT(SA1, SB1, SC1, a, astride, w, cb); break;
    case 2: S_PRODUCT(SA0, SB0, SC2, a, astride, w, cb); break;
    default: S_PRODUCT(SA1, SB1, SC3, a, astride, w, cb); break;
    }
}

/* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: tokens [t0, t0 + nt) of the group, a span
 * of QMM_AMX_SPAN blocks at a time.  The span's B tiles are made once into
 * wbuf: the codes as signed bytes w - zero, so tdpbssd gives qmm.h's p =
 * Σ (w - zero) x itself (Q4_0, Q5_0 need no - zero · xs); Q8_0's runs are
 * copied, as every other block's straddle cache lines and a tile load of
 * them is slow.  Then each token tile runs the span with its 16
 * accumulators in registers (acc between spans), the products issued
 * QMM_AMX_AHEAD blocks ahead of the rescale.  The tail tile (nt % 16
 * tokens) reads its codes from abuf, whose missing rows are 0 (and their
 * dx 0: those sums are never stored). */
ALWAYS_INLINE void chunk(T_STATE_PARAM, uint32_t type, const struct qmm_job *j, const uint8_t *g, int64_t r0,
                         int nr, int t0, int nt) {
    const int64_t nb = j->K / QMM_BLK;
    const size_t gb = qmm_gblock_bytes(type), sb = qmm_gcode_off(type);
    const bool has_m = qmm_has_m(type), q5 = qmm_is_q5(type);
    const char zero = (char)qmm_zero(type);
    _Alignas(64) float acc[QMM_AMX_CH][16];
    _Alignas(64) int32_t cbuf[QMM_AMX_NCB][16][16];
    _Alignas(64) uint8_t wbuf[QMM_AMX_SPAN][8][64];
    _Alignas(64) float dxs[16][QMM_AMX_SPAN], xsf[16][QMM_AMX_SPAN];   /* dx, xs (f32) of the tile's tokens */
    _Alignas(64) uint8_t abuf[16][QMM_AMX_SPAN * QMM_BLK];
    if (nt % 16) {
        memset(abuf, 0, sizeof abuf);
        memset(dxs, 0, sizeof dxs);
        memset(xsf, 0, sizeof xsf);
    }
    for (int64_t b0 = 0; b0 < nb; b0 += QMM_AMX_SPAN) {
        const int ns = nb - b0 < QMM_AMX_SPAN ? (int)(nb - b0) : QMM_AMX_SPAN;
        for (int s = 0; s < ns; s++) {
            const uint8_t *gp = g + (size_t)(b0 + s) * gb, *cp = gp + sb;
            if (type == DTYPE_Q8_0) {
                for (int r = 0; r < 8; r++) _mm512_store_si512((void *)wbuf[s][r], ldw(cp + 64 * r));
                continue;
            }
            /* Q5: the fifth bits from the spread qh (qmm.h), as matmul_q8_kern.h */
            const vi qh = q5 ? ldw(gp + qmm_gqh_off(type)) : _mm512_setzero_si512();
            for (int r = 0; r < 4; r++) {   /* row r: codes 4r.. (low nibbles of run r); row 4 + r: 16 + 4r.. */
                const vi v = ldw(cp + 64 * r);
                vi lo = and_(v, m8(0x0f)), hi = and_(srl4(v), m8(0x0f));
                if (q5) {
                    lo = or_(lo, and_(_mm512_sll_epi16(qh, _mm_cvtsi32_si128(4 - r)), m8(0x10)));
                    hi = or_(hi, and_(_mm512_srl_epi16(qh, _mm_cvtsi32_si128(r)), m8(0x10)));
                }
                if (zero) lo = _mm512_sub_epi8(lo, m8(zero)), hi = _mm512_sub_epi8(hi, m8(zero));
                _mm512_store_si512((void *)wbuf[s][r], lo);
                _mm512_store_si512((void *)wbuf[s][4 + r], hi);
            }
        }
        const __mmask8 smask = (__mmask8)((1u << ns) - 1);
        for (int tt = 0; tt < nt; tt += 16) {
            const int m = nt - tt < 16 ? nt - tt : 16;
            const uint8_t *act = j->act + (size_t)(t0 + tt) * j->astride;
            for (int i = 0; i < m; i++) {
                const float *xd = (const float *)(const void *)(act + (size_t)i * j->astride + j->K) + b0;
                _mm256_store_ps(dxs[i], _mm256_maskz_loadu_ps(smask, xd));
                if (has_m) _mm256_store_ps(xsf[i], _mm256_maskz_loadu_ps(smask, xd + nb));
            }
            const uint8_t *a = act + (size_t)(QMM_BLK * b0);
            size_t as = j->astride;
            if (m < 16) {
                for (int i = 0; i < m; i++) memcpy(abuf[i], a + (size_t)i * j->astride, (size_t)ns * QMM_BLK);
                a = abuf[0], as = sizeof abuf[0];
            }
            vf y[16];
            for (int i = 0; i < 16; i++) y[i] = b0 ? _mm512_load_ps(acc[tt + i]) : _mm512_setzero_ps();
            for (int s = 0; s < QMM_AMX_AHEAD && s < ns; s++)
                s_product(T_STATE_ARG, s, a + QMM_BLK * s, as, wbuf[s][0], cbuf);
            for (int s = 0; s < ns; s++) {
                const int sn = s + QMM_AMX_AHEAD;
                if (sn < ns) s_product(T_STATE_ARG, sn, a + QMM_BLK * sn, as, wbuf[sn][0], cbuf);
                const uint8_t *gp = g + (size_t)(b0 + s) * gb;
                const vf dv = ldh(gp), mv = has_m ? ldh(gp + 32) : _mm512_setzero_ps();
                const int32_t(*cb)[16] = cbuf[s % QMM_AMX_NCB];
                for (int i = 0; i < 16; i++) {
                    const vf dx = _mm512_set1_ps(dxs[i][s]);
                    y[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ld32x16(cb[i])), _mm512_mul_ps(dv, dx), y[i]);
                    if (has_m) y[i] = _mm512_fmadd_ps(_mm512_set1_ps(xsf[i][s]), _mm512_mul_ps(mv, dx), y[i]);
                }
            }
            for (int i = 0; i < 16; i++) _mm512_store_ps(acc[tt + i], y[i]);
        }
    }
    const __mmask16 mask = (__mmask16)((1u << nr) - 1);
    for (int i = 0; i < nt; i++)
        _mm512_mask_storeu_ps(j->y + (size_t)(t0 + i) * j->ys + (size_t)r0, mask, _mm512_load_ps(acc[i]));
}

/* Q4_K, Q5_K, Q6_K: tokens [t0, t0 + nt) of the group (qmm_k.c's
 * arithmetic; matmul_q8_kern.h's tile_k does the same per token). */
ALWAYS_INLINE void chunk_k(T_STATE_PARAM, uint32_t type, const struct qmm_job *j, const uint8_t *g, int64_t r0,
                           int nr, int t0, int nt) {
    const int64_t nb = j->K / QMM_QK;
    const size_t gb = qmm_gblock_bytes(type);
    _Alignas(64) float acc[QMM_AMX_CH][16];
    _Alignas(64) int32_t isum[QMM_AMX_CH][16];
    _Alignas(64) int32_t cbuf[16][16], cbuf2[16][16];
    _Alignas(64) uint8_t wbuf[8][64];
    const vi m0f = m8(0x0f), m10 = m8(0x10), m30 = m8(0x30);
    (void)ts_;
    memset(acc, 0, (size_t)nt * sizeof acc[0]);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gp = g + (size_t)b * gb;
        const vf dv = ldh(gp);
        memset(isum, 0, (size_t)nt * sizeof isum[0]);
        if (type == DTYPE_Q6_K) {
            const uint8_t *scp = gp + 32, *qhp = gp + 288, *qlp = gp + 1312;
            for (int c = 0; c < 4; c++)
                for (int q = 0; q < 2; q++) {   /* sub-blocks 4c + q (wbuf rows 0..3), 4c + 2 + q (rows 4..7) */
                    for (int k = 0; k < 4; k++) {
                        const vi v = ldw(qlp + 64 * (8 * c + 4 * q + k)), hb = ldw(qhp + 64 * (4 * c + k));
                        const vi lo = and_(v, m0f), hi = and_(srl4(v), m0f);
                        vi wl, wh;
                        if (q == 0) {
                            wl = or_(lo, and_(_mm512_slli_epi16(hb, 4), m30));
                            wh = or_(hi, and_(_mm512_slli_epi16(hb, 2), m30));
                        } else {
                            wl = or_(lo, and_(hb, m30));
                            wh = or_(hi, and_(_mm512_srli_epi16(hb, 2), m30));
                        }
                        _mm512_store_si512((void *)wbuf[k], wl);
                        _mm512_store_si512((void *)wbuf[4 + k], wh);
                    }
                    T_LOAD(TB, wbuf[0], 64);
                    T_LOAD(TB2, wbuf[4], 64);
                    const vi slo = ldi8(scp + 16 * (4 * c + q)), shi = ldi8(scp + 16 * (4 * c + 2 + q));
                    for (int tt = 0; tt < nt; tt += 16) {
                        const int m = nt - tt < 16 ? nt - tt : 16;
                        const uint8_t *a = j->act + (size_t)(t0 + tt) * j->astride + (size_t)(QMM_QK * b + 64 * c + 16 * q);
                        TILE_PRODUCT(m, a, j->astride, cbuf, 0, 0);
                        TILE_PRODUCT(m, a + 32, j->astride, cbuf2, 1, 0);
                        for (int i = 0; i < m; i++) {
                            const int8_t *xq = (const int8_t *)(const void *)(j->act + (size_t)(t0 + tt + i) * j->astride);
                            const int16_t *s16 = (const int16_t *)(const void *)((const float *)(const void *)(xq + j->K) + nb) +
                                                 16 * b + 4 * c + q;
                            const vi plo = _mm512_add_epi32(ld32x16(cbuf[i]), _mm512_set1_epi32(-32 * s16[0]));
                            const vi phi = _mm512_add_epi32(ld32x16(cbuf2[i]), _mm512_set1_epi32(-32 * s16[2]));
                            const vi s = _mm512_add_epi32(_mm512_mullo_epi32(plo, slo), _mm512_mullo_epi32(phi, shi));
                            _mm512_store_si512((void *)isum[tt + i], _mm512_add_epi32(ld32x16(isum[tt + i]), s));
                        }
                    }
                }
            for (int i = 0; i < nt; i++) {
                const float *xd = (const float *)(const void *)(j->act + (size_t)(t0 + i) * j->astride + j->K);
                const vf a_ = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ld32x16(isum[i])), _mm512_mul_ps(dv, _mm512_set1_ps(xd[b])),
                                              _mm512_load_ps(acc[i]));
                _mm512_store_ps(acc[i], a_);
            }
            continue;
        }
        /* Q4_K, Q5_K: sub-block s = 2c + h: runs 8c .. 8c + 7, low nibbles (h 0) or high (h 1) */
        const vf mv = ldh(gp + 32);
        const uint8_t *scp = gp + 64, *mp = gp + 192, *qhp = gp + 320;
        const uint8_t *qsp = gp + (type == DTYPE_Q4_K ? 320 : 832);
        for (int s = 0; s < 8; s++) {
            const int c = s / 2, h = s % 2;
            for (int k = 0; k < 8; k++) {
                const vi v = ldw(qsp + 64 * (8 * c + k));
                vi w = h ? and_(srl4(v), m0f) : and_(v, m0f);
                if (type == DTYPE_Q5_K) {   /* bit 2c (low) or 2c + 1 (high) of the run's qh bytes, to bit 4 */
                    const vi hb = _mm512_srl_epi16(ldw(qhp + 64 * k), _mm_cvtsi32_si128(2 * c));
                    w = or_(w, and_(h ? _mm512_slli_epi16(hb, 3) : _mm512_slli_epi16(hb, 4), m10));
                }
                _mm512_store_si512((void *)wbuf[k], w);
            }
            T_LOAD(TB, wbuf, 64);
            const vi sc = ldu8(scp + 16 * s);
            for (int tt = 0; tt < nt; tt += 16) {
                const int m = nt - tt < 16 ? nt - tt : 16;
                const uint8_t *a = j->act + (size_t)(t0 + tt) * j->astride + (size_t)(QMM_QK * b + 32 * s);
                TILE_PRODUCT(m, a, j->astride, cbuf, 0, 0);
                for (int i = 0; i < m; i++)
                    _mm512_store_si512((void *)isum[tt + i],
                                       _mm512_add_epi32(ld32x16(isum[tt + i]), _mm512_mullo_epi32(ld32x16(cbuf[i]), sc)));
            }
        }
        vi mm[4];   /* int16 pairs (m[2k], m[2k+1]) per lane */
        for (int k = 0; k < 4; k++)
            mm[k] = or_(ldu8(mp + 16 * (2 * k)), _mm512_slli_epi32(ldu8(mp + 16 * (2 * k + 1)), 16));
        for (int i = 0; i < nt; i++) {
            const int8_t *xq = (const int8_t *)(const void *)(j->act + (size_t)(t0 + i) * j->astride);
            const float *xd = (const float *)(const void *)(xq + j->K);
            const int16_t *xs32 = (const int16_t *)(const void *)(xd + nb) + j->K / 16;
            vi msum = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++) {
                int32_t pair;
                memcpy(&pair, xs32 + 8 * b + 2 * k, 4);
                msum = _mm512_add_epi32(msum, _mm512_madd_epi16(mm[k], _mm512_set1_epi32(pair)));
            }
            const vf dx = _mm512_set1_ps(xd[b]);
            vf a_ = _mm512_load_ps(acc[i]);
            a_ = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ld32x16(isum[i])), _mm512_mul_ps(dv, dx), a_);
            a_ = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(mv, dx), a_);
            _mm512_store_ps(acc[i], a_);
        }
    }
    const __mmask16 mask = (__mmask16)((1u << nr) - 1);
    for (int i = 0; i < nt; i++)
        _mm512_mask_storeu_ps(j->y + (size_t)(t0 + i) * j->ys + (size_t)r0, mask, _mm512_load_ps(acc[i]));
}

ALWAYS_INLINE void amx_group(uint32_t type, const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) {
    T_STATE_DECL;
    struct amx_cfg cfg;
    if (qmm_is_k(type)) amx_config(&cfg, type == DTYPE_Q6_K ? 16 : 32, j->n % 16);
    else amx_config_s(&cfg);
    T_CONFIG(&cfg);
    for (int t0 = 0; t0 < j->n; t0 += QMM_AMX_CH) {
        const int nt = j->n - t0 < QMM_AMX_CH ? j->n - t0 : QMM_AMX_CH;
        if (qmm_is_k(type)) chunk_k(T_STATE_ARG, type, j, g, r0, nr, t0, nt);
        else chunk(T_STATE_ARG, type, j, g, r0, nr, t0, nt);
    }
    T_RELEASE();
}

static void amx_q8_0(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { amx_group(DTYPE_Q8_0, j, g, r0, nr); }
static void amx_q4_0(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { amx_group(DTYPE_Q4_0, j, g, r0, nr); }
static void amx_q4_1(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { amx_group(DTYPE_Q4_1, j, g, r0, nr); }
static void amx_q5_0(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { amx_group(DTYPE_Q5_0, j, g, r0, nr); }
static void amx_q5_1(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { amx_group(DTYPE_Q5_1, j, g, r0, nr); }
static void amx_q4_k(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { amx_group(DTYPE_Q4_K, j, g, r0, nr); }
static void amx_q5_k(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { amx_group(DTYPE_Q5_K, j, g, r0, nr); }
static void amx_q6_k(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) { amx_group(DTYPE_Q6_K, j, g, r0, nr); }

void QMM_AMX_FN(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) {
    /* the table types and the 16-element K-quants Q2_K / Q3_K: not on tiles yet */
    if (j->n < QMM_AMX_MIN_N || qmm_is_nl(j->type) || j->type == DTYPE_IQ4_XS || j->type == DTYPE_Q2_K ||
        j->type == DTYPE_Q3_K) {
        qmm_group_avx512(j, g, r0, nr);
        return;
    }
    struct qmm_job head = *j;
    if (QMM_AMX_TAIL_VNNI && j->n % 16) {   /* the last n % 16 tokens: VNNI, the rest on tiles */
        struct qmm_job tail = *j;
        head.n = j->n - j->n % 16;
        tail.n = j->n % 16;
        tail.act = j->act + (size_t)head.n * j->astride;
        tail.y = j->y + (size_t)head.n * j->ys;
        qmm_group_avx512(&tail, g, r0, nr);
        j = &head;
    }
    switch (j->type) {
    case DTYPE_Q8_0: amx_q8_0(j, g, r0, nr); break;
    case DTYPE_Q4_0: amx_q4_0(j, g, r0, nr); break;
    case DTYPE_Q4_1: amx_q4_1(j, g, r0, nr); break;
    case DTYPE_Q5_0: amx_q5_0(j, g, r0, nr); break;
    case DTYPE_Q5_1: amx_q5_1(j, g, r0, nr); break;
    case DTYPE_Q4_K: amx_q4_k(j, g, r0, nr); break;
    case DTYPE_Q5_K: amx_q5_k(j, g, r0, nr); break;
    default: amx_q6_k(j, g, r0, nr); break;
    }
}
