/* matmul_q8_amx_kern.h — the integer matmul's group kernel (qmm.h) on AMX
 * tiles, written once against the tile operations T_* and compiled twice:
 * matmul_q8_amx.c (the instructions, inline asm) and matmul_q8_amx_emu.c
 * (amx_emu.c's emulator, so the logic is tested on any AVX-512 CPU).
 * Include only from those, after defining QMM_AMX_EMU (0 or 1),
 * QMM_AMX_FN, QMM_AMX_MIN_N and the T_* macros (below).
 *
 * Per block of 32 codes (K-quants: per sub-block of 32, Q6_K of 16) one
 * tile product gives the integer dot products P of 16 tokens × the group's
 * 16 rows at once:
 *   B (tile TB): K / 4 rows of 64 bytes, row k = bytes 4k .. 4k+3 of each
 *     weight row — TENSOR_Q8X16's runs, so Q8_0 loads its block straight
 *     from the group; the 4- and 5-bit and K-quant codes are unpacked to bytes
 *     (AVX-512) into wbuf first, once per group and block, and the tile is
 *     used by every token tile of the chunk;
 *   A (TA; TAT for the last n % 16 tokens): one row per token, loaded
 *     straight from the activation rows (stride astride);
 *   C (TC; TCT) = A · B: tdpbssd for Q8_0 (signed × signed), tdpbsud for
 *     the rest (signed activations × unsigned codes), stored to cbuf.
 * Then AVX-512 does exactly what matmul_q8_kern.h does per (token, block)
 * with one lane per weight row: Q4_0's - 8 xs (Q5_0's - 16 xs) and Q6_K's - 32 xs16 added
 * in int32, the K-quants' sc · P summed in int32 (vpmulld) and their mins
 * by vpmaddwd, then the same conversions and FMAs in the same order.  The
 * integer values are the same exact sums (no overflow: qmm.h, qmm_k.c), so
 * the result equals qmm_group_scalar's bit for bit.
 *
 * Accumulators: a chunk of up to QMM_AMX_CH tokens at a time keeps its
 * rows' f32 accumulators in acc (4 KiB on the stack), so the weights'
 * unpacking is shared by 4 token tiles and acc stays in L1.  Fewer than
 * QMM_AMX_MIN_N tokens (decode) go to the AVX-512 VNNI kernel instead —
 * same bits, and a tile product would be mostly empty — and so do IQ4_NL,
 * MXFP4, IQ4_XS, Q2_K and Q3_K for now. */
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

/* Q8_0, Q4_0, Q4_1: tokens [t0, t0 + nt) of the group. */
ALWAYS_INLINE void chunk(T_STATE_PARAM, uint32_t type, const struct qmm_job *j, const uint8_t *g, int64_t r0,
                         int nr, int t0, int nt) {
    const int64_t nb = j->K / QMM_BLK;
    const size_t gb = qmm_gblock_bytes(type), sb = qmm_gcode_off(type);
    const bool has_m = qmm_has_m(type), q5 = qmm_is_q5(type);
    _Alignas(64) float acc[QMM_AMX_CH][16];
    _Alignas(64) int32_t cbuf[16][16];
    _Alignas(64) uint8_t wbuf[8][64];
    (void)ts_;
    memset(acc, 0, (size_t)nt * sizeof acc[0]);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gp = g + (size_t)b * gb, *cp = gp + sb;
        const vf dv = ldh(gp);
        const vf mv = has_m ? ldh(gp + 32) : _mm512_setzero_ps();
        if (type == DTYPE_Q8_0) {
            T_LOAD(TB, cp, 64);   /* the 8 runs are the B tile */
        } else {
            /* Q5: the fifth bits from the spread qh (qmm.h), as matmul_q8_kern.h */
            const vi qh = q5 ? ldw(gp + qmm_gqh_off(type)) : _mm512_setzero_si512();
            for (int r = 0; r < 4; r++) {   /* row r: codes 4r.. (low nibbles of run r); row 4 + r: 16 + 4r.. */
                const vi v = ldw(cp + 64 * r);
                vi lo = and_(v, m8(0x0f)), hi = and_(srl4(v), m8(0x0f));
                if (q5) {
                    lo = or_(lo, and_(_mm512_sll_epi16(qh, _mm_cvtsi32_si128(4 - r)), m8(0x10)));
                    hi = or_(hi, and_(_mm512_srl_epi16(qh, _mm_cvtsi32_si128(r)), m8(0x10)));
                }
                _mm512_store_si512((void *)wbuf[r], lo);
                _mm512_store_si512((void *)wbuf[4 + r], hi);
            }
            T_LOAD(TB, wbuf, 64);
        }
        for (int tt = 0; tt < nt; tt += 16) {
            const int m = nt - tt < 16 ? nt - tt : 16;
            const uint8_t *a = j->act + (size_t)(t0 + tt) * j->astride + (size_t)(QMM_BLK * b);
            TILE_PRODUCT(m, a, j->astride, cbuf, 0, type == DTYPE_Q8_0);
            for (int i = 0; i < m; i++) {
                const int8_t *xq = (const int8_t *)(const void *)(j->act + (size_t)(t0 + tt + i) * j->astride);
                const float *xd = (const float *)(const void *)(xq + j->K);
                const int32_t *xs = (const int32_t *)(const void *)(xd + nb);
                vi p = ld32x16(cbuf[i]);
                if (qmm_zero(type)) p = _mm512_add_epi32(p, _mm512_set1_epi32(-qmm_zero(type) * xs[b]));
                const vf dx = _mm512_set1_ps(xd[b]);
                vf a_ = _mm512_load_ps(acc[tt + i]);
                a_ = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dv, dx), a_);
                if (has_m) a_ = _mm512_fmadd_ps(_mm512_set1_ps((float)xs[b]), _mm512_mul_ps(mv, dx), a_);
                _mm512_store_ps(acc[tt + i], a_);
            }
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
    amx_config(&cfg, type == DTYPE_Q6_K ? 16 : 32, j->n % 16);
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
