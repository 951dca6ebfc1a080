/* qmm_k.c — the K-quants (Q2_K .. Q6_K) and IQ4_XS on the 8-bit integer path
 * (qmm.h): their activation rows, the reference arithmetic and the 16-row
 * interleaved layout.
 *
 * Activations (Q8_K-style, as llama.cpp pairs with K-quants): a token row
 * is quantized per super-block of 256: dx = amax / 127, code =
 * round-half-even(x * (127 / amax)) in -127 .. 127 (all zero: dx = 0, codes
 * 0), with the code sums xs16 per 16 and xs32 per 32 (int16: |sum| <= 32 *
 * 127).  Row layout: codes (K), dx (K / 256 f32), xs16 (K / 16 int16), xs32
 * (K / 32 int16), within qmm_act_row_bytes(K).  As for the other types the
 * row's result depends on that row alone.
 *
 * Arithmetic, per (weight row, token), acc = 0 and per super-block b in
 * order, with q the weight's unsigned codes (Q4_K 0..15, Q5_K 0..31, Q6_K
 * 0..63) and x the token's codes:
 *   Q4_K, Q5_K (8 sub-blocks of 32, 6-bit sc[s] and m[s]):
 *     I = Σ_s sc[s] · Σ_32 q·x,   M = Σ_s m[s] · xs32[s]   (exact int32)
 *     acc = fma((float)I, f16(d) · dx, acc)
 *     acc = fma((float)M, -(f16(dmin) · dx), acc)
 *   Q6_K (16 sub-blocks of 16, int8 sc[s]):
 *     I = Σ_s sc[s] · (Σ_16 q·x - 32 · xs16[s])             (exact int32)
 *     acc = fma((float)I, f16(d) · dx, acc)
 *   Q2_K (16 sub-blocks of 16, 4-bit sc[s] and m[s], codes 0..3):
 *     I = Σ_s sc[s] · Σ_16 q·x,   M = Σ_s m[s] · xs16[s], then as Q4_K
 *   Q3_K (16 sub-blocks of 16, 6-bit sc[s], codes 0..7 meaning q - 4):
 *     I = Σ_s (sc[s] - 32) · (Σ_16 q·x - 4 · xs16[s]), then as Q6_K
 *   IQ4_XS (8 sub-blocks of 32, 6-bit sc[s], q the table value
 *     kvalues_iq4nl[code], -127 .. 113) takes the 32-block activation rows
 *     (qmm.h: dx and xs per 32) and, per sub-block s in order,
 *     acc = fma((float)Σ_32 q·x, (f16(d) · (sc[s] - 32)) · dx[s], acc)
 *     (d · (sc - 32) is exact: 11 by 6 bits)
 * y = acc.  I and M are integers, exact whatever order a kernel sums them
 * in (|I| <= 8 · 63 · 32 · 31 · 127 < 2^26 for Q5_K, 16 · 128 · 16 · 32 ·
 * 127 < 2^28 for Q6_K; |M| < 2^21), so each kernel set's result equals
 * qmm_ref_dot_k's bit for bit once it does the two float steps as written.
 *
 * Layout (TENSOR_Q8X16 for K-quants), per 16-row group and super-block:
 *   Q4_K, Q5_K: [0, 32) d of rows 0..15 (f16); [32, 64) dmin; [64, 192)
 *     sc[s] of rows 0..15 at 64 + 16 s (u8); [192, 320) m[s] at 192 + 16 s;
 *     Q5_K: [320, 832) the high bits, run k (k < 8) at 320 + 64 k: bytes
 *     4k .. 4k+3 of each row's qh (row i at + 4 i); then the nibbles (Q4_K
 *     at 320, Q5_K at 832), run r (r < 32) at + 64 r: bytes 4r .. 4r+3 of
 *     each row's qs.  Run r = 8c + k holds in byte j the codes of elements
 *     64c + 4k + j (low nibble) and 64c + 32 + 4k + j (high), the file's
 *     own order.  2,368 / 2,880 bytes for 16 rows' 2,304 / 2,816 (+2.8 %,
 *     +2.3 %: the scales unpacked to bytes).
 *   Q6_K: [0, 32) d; [32, 288) sc[s] at 32 + 16 s (int8); [288, 1312) the
 *     high 2 bits, run u = 4c + k (k < 4) at 288 + 64 u, byte j: bits 0-1
 *     of element 64c + 4k + j, 2-3 of 64c + 32 + 4k + j, 4-5 of 64c + 16 +
 *     4k + j, 6-7 of 64c + 48 + 4k + j; [1312, 3360) the low 4 bits, run r
 *     = 8c + k as Q4_K's (element 64c + 4k + j low, 64c + 32 + 4k + j
 *     high).  3,360 bytes, exactly 16 rows' (the file's order is
 *     regrouped so that one nibble run and one high-bit run give whole
 *     codes of four consecutive elements).
 *   Q2_K: [0, 32) d; [32, 64) dmin; [64, 320) the file's scale|min byte
 *     of sub-block s at 64 + 16 s; [320, 1344) qs, run r (r < 16) at 320 +
 *     64 r: bytes 4r .. 4r+3, whose bits 2s hold elements 128 (r / 8) + 32 s
 *     + 4 (r % 8) + j.  1,344 bytes, exactly 16 rows'.
 *   Q3_K: [0, 32) d; [32, 288) sc[s] - 32 (int8) at 32 + 16 s; [288, 800)
 *     hmask, run u (u < 8) at 288 + 64 u; [800, 1824) qs as Q2_K's.  1,824
 *     bytes for 1,760 (+3.6 %).
 *   IQ4_XS: [0, 32) d; [32, 160) sc[s] - 32 (int8) at 32 + 16 s; [160,
 *     2208) qs, run r (r < 32) at 160 + 64 r: bytes 4r .. 4r+3, low nibbles
 *     elements 32 (r / 4) + 4 (r % 4) + j, high ones 16 further.  2,208
 *     bytes for 2,176 (+1.5 %). */
#include "backend/cpu/qmm.h"
#include "core/core.h"

#include <math.h>
#include <string.h>

/* Round to nearest, ties to even, for |v| < 2^22 (as qmm.c's rne). */
static inline float rne(float v) { return (v + 12582912.0f) - 12582912.0f; }

void qmm_quantize_row_k(const float *x, int64_t K, int8_t *q, float *d, int16_t *xs16, int16_t *xs32) {
    for (int64_t b = 0; b < K / QMM_QK; b++) {
        const float *xb = x + b * QMM_QK;
        float amax = 0;
        for (int i = 0; i < QMM_QK; i++) {
            const float a = fabsf(xb[i]);
            amax = a > amax ? a : amax;
        }
        const float id = qmm_inv_scale(127.0f, amax);
        d[b] = amax / 127.0f;
        for (int s = 0; s < QMM_QK / 16; s++) {
            int32_t sum = 0;
            for (int i = 0; i < 16; i++) {
                const int8_t c = (int8_t)(int)rne(xb[16 * s + i] * id);
                q[b * QMM_QK + 16 * s + i] = c;
                sum += c;
            }
            xs16[b * 16 + s] = (int16_t)sum;
        }
        for (int s = 0; s < QMM_QK / 32; s++)
            xs32[b * 8 + s] = (int16_t)(xs16[b * 16 + 2 * s] + xs16[b * 16 + 2 * s + 1]);
    }
}

/* One super-block of a rows-layout row as plain numbers (decoded without
 * codes when the caller copies the bits itself): codes q (256, unsigned), scales sc (Q4_K/Q5_K: 8 of 0..63; Q6_K: 16 int8), mins m (8;
 * Q6_K: none) and the f16 d, dmin. */
struct kblock { uint8_t q[QMM_QK]; int sc[16]; int m[8]; uint16_t d, dmin; };

static void kblock_decode(uint32_t type, const uint8_t *blk, struct kblock *k, bool codes) {
    if (type == DTYPE_Q6_K) {
        const struct block_q6_K *b = (const struct block_q6_K *)(const void *)blk;
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int l = 0; l < 32; l++)
                    k->q[128 * h + 32 * s + l] =
                        (uint8_t)(((b->ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0xf) |
                                  (((b->qh[32 * h + l] >> (2 * s)) & 3) << 4));
        for (int s = 0; s < 16; s++) k->sc[s] = b->scales[s];
        memcpy(&k->d, &b->d, 2);
        k->dmin = 0;
        return;
    }
    /* Q4_K and Q5_K share the leading d, dmin, scales[12] */
    const struct block_q4_K *b4 = (const struct block_q4_K *)(const void *)blk;
    const uint8_t *qs = type == DTYPE_Q4_K ? b4->qs : ((const struct block_q5_K *)(const void *)blk)->qs;
    const uint8_t *qh = type == DTYPE_Q5_K ? ((const struct block_q5_K *)(const void *)blk)->qh : NULL;
    for (int c = 0; c < 4 && codes; c++)
        for (int l = 0; l < 32; l++) {
            k->q[64 * c + l] = (uint8_t)((qs[32 * c + l] & 0xf) | (qh ? ((qh[l] >> (2 * c)) & 1) << 4 : 0));
            k->q[64 * c + 32 + l] = (uint8_t)((qs[32 * c + l] >> 4) | (qh ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0));
        }
    for (int s = 0; s < 8; s++) {
        uint8_t sc, m;
        q4_K_scale_min(b4->scales, s, &sc, &m);
        k->sc[s] = sc;
        k->m[s] = m;
    }
    memcpy(&k->d, &b4->d, 2);
    memcpy(&k->dmin, &b4->dmin, 2);
}

/* kblock_decode's inverse: the file's bytes (the encodings are canonical,
 * so a decode then encode gives back the same bytes). */
static void kblock_encode(uint32_t type, const struct kblock *k, uint8_t *blk) {
    if (type == DTYPE_Q6_K) {
        struct block_q6_K b;
        memset(&b, 0, sizeof b);
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int l = 0; l < 32; l++) {
                    const uint8_t c = k->q[128 * h + 32 * s + l];
                    b.ql[64 * h + 32 * (s % 2) + l] |= (uint8_t)((c & 0xf) << (4 * (s / 2)));
                    b.qh[32 * h + l] |= (uint8_t)((c >> 4) << (2 * s));
                }
        for (int s = 0; s < 16; s++) b.scales[s] = (int8_t)k->sc[s];
        b.d = k->d;
        memcpy(blk, &b, sizeof b);
        return;
    }
    uint8_t scales[12], qs[128], qh[32];
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)((k->sc[j] & 63) | ((k->sc[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)((k->m[j] & 63) | ((k->m[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((k->sc[j + 4] & 0xf) | ((k->m[j + 4] & 0xf) << 4));
    }
    memset(qh, 0, sizeof qh);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const uint8_t lo = k->q[64 * c + l], hi = k->q[64 * c + 32 + l];
            qs[32 * c + l] = (uint8_t)((lo & 0xf) | ((hi & 0xf) << 4));
            qh[l] |= (uint8_t)(((lo >> 4) & 1) << (2 * c) | ((hi >> 4) & 1) << (2 * c + 1));
        }
    memcpy(blk, &k->d, 2);
    memcpy(blk + 2, &k->dmin, 2);
    memcpy(blk + 4, scales, 12);
    if (type == DTYPE_Q5_K) {
        memcpy(blk + 16, qh, 32);
        memcpy(blk + 48, qs, 128);
    } else {
        memcpy(blk + 16, qs, 128);
    }
}

/* Q2_K, Q3_K, IQ4_XS: one super-block's codes (Q2_K 0..3, Q3_K 0..7) or
 * table values (IQ4_XS), scales (Q2_K 16 of 0..15, Q3_K 16 of 0..63,
 * IQ4_XS 8 of 0..63) and mins (Q2_K), and the f16 d, dmin, as dtype.h
 * lays them out. */
struct kblock2 { int q[QMM_QK]; int sc[16]; int m[16]; uint16_t d, dmin; };

static void kblock2_decode(uint32_t type, const uint8_t *blk, struct kblock2 *k) {
    memset(k, 0, sizeof *k);
    if (type == DTYPE_IQ4_XS) {
        const struct block_iq4_xs *b = (const struct block_iq4_xs *)(const void *)blk;
        for (int j = 0; j < 8; j++) {
            k->sc[j] = ((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xf) | ((b->scales_h >> (2 * j)) & 3) << 4;
            for (int i = 0; i < 16; i++) {
                k->q[32 * j + i] = kvalues_iq4nl[b->qs[16 * j + i] & 0xf];
                k->q[32 * j + 16 + i] = kvalues_iq4nl[b->qs[16 * j + i] >> 4];
            }
        }
        k->d = b->d;
        return;
    }
    const uint8_t *qs = type == DTYPE_Q2_K ? ((const struct block_q2_K *)(const void *)blk)->qs
                                           : ((const struct block_q3_K *)(const void *)blk)->qs;
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++) k->q[128 * h + 32 * s + l] = (qs[32 * h + l] >> (2 * s)) & 3;
    if (type == DTYPE_Q2_K) {
        const struct block_q2_K *b = (const struct block_q2_K *)(const void *)blk;
        for (int s = 0; s < 16; s++) {
            k->sc[s] = b->scales[s] & 0xf;
            k->m[s] = b->scales[s] >> 4;
        }
        k->d = b->d;
        k->dmin = b->dmin;
        return;
    }
    const struct block_q3_K *b = (const struct block_q3_K *)(const void *)blk;
    for (int e = 0; e < QMM_QK; e++) k->q[e] |= ((b->hmask[e % 32] >> (e / 32)) & 1) << 2;
    for (int s = 0; s < 16; s++) k->sc[s] = q3_K_scale(b->scales, s);
    k->d = b->d;
}

float qmm_ref_dot_iq4_xs(const uint8_t *w, const int8_t *xq, const float *xd, int64_t K) {
    float acc = 0;
    struct kblock2 k;
    for (int64_t b = 0; b < K / QMM_QK; b++) {
        kblock2_decode(DTYPE_IQ4_XS, w + (size_t)b * sizeof(struct block_iq4_xs), &k);
        const float d = f16_to_f32(k.d);
        for (int s = 0; s < 8; s++) {
            int32_t p = 0;
            for (int i = 0; i < 32; i++) p += k.q[32 * s + i] * xq[QMM_QK * b + 32 * s + i];
            acc = fmaf((float)p, (d * (float)(k.sc[s] - 32)) * xd[8 * b + s], acc);
        }
    }
    return acc;
}

/* The arithmetic of qmm_ref_dot_k for Q2_K and Q3_K. */
static float ref_dot_k2(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *xs16,
                        const int16_t *xs32, int64_t K) {
    const size_t bb = dtype_block_bytes(type);
    float acc = 0;
    struct kblock2 k;
    for (int64_t b = 0; b < K / QMM_QK; b++) {
        kblock2_decode(type, w + (size_t)b * bb, &k);
        const int8_t *x = xq + b * QMM_QK;
        int32_t I = 0, M = 0;
        for (int s = 0; s < 16; s++) {
            int32_t p = 0;
            for (int i = 0; i < 16; i++) p += k.q[16 * s + i] * x[16 * s + i];
            if (type == DTYPE_Q2_K) {
                I += k.sc[s] * p;
                M += k.m[s] * xs16[b * 16 + s];
            } else {
                I += (k.sc[s] - 32) * (p - 4 * xs16[b * 16 + s]);
            }
        }
        (void)xs32;
        acc = fmaf((float)I, f16_to_f32(k.d) * xd[b], acc);
        if (type == DTYPE_Q2_K) acc = fmaf((float)M, -(f16_to_f32(k.dmin) * xd[b]), acc);
    }
    return acc;
}

float qmm_ref_dot_k(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *xs16,
                    const int16_t *xs32, int64_t K) {
    if (type == DTYPE_Q2_K || type == DTYPE_Q3_K) return ref_dot_k2(type, w, xq, xd, xs16, xs32, K);
    const size_t bb = dtype_block_bytes(type);
    float acc = 0;
    struct kblock k;
    for (int64_t b = 0; b < K / QMM_QK; b++) {
        kblock_decode(type, w + (size_t)b * bb, &k, true);
        const int8_t *x = xq + b * QMM_QK;
        const float dd = f16_to_f32(k.d) * xd[b];
        int32_t I = 0;
        if (type == DTYPE_Q6_K) {
            for (int s = 0; s < 16; s++) {
                int32_t p = 0;
                for (int i = 0; i < 16; i++) p += k.q[16 * s + i] * x[16 * s + i];
                I += k.sc[s] * (p - 32 * xs16[b * 16 + s]);
            }
            acc = fmaf((float)I, dd, acc);
        } else {
            int32_t M = 0;
            for (int s = 0; s < 8; s++) {
                int32_t p = 0;
                for (int i = 0; i < 32; i++) p += k.q[32 * s + i] * x[32 * s + i];
                I += k.sc[s] * p;
                M += k.m[s] * xs32[b * 8 + s];
            }
            acc = fmaf((float)I, dd, acc);
            acc = fmaf((float)M, -(f16_to_f32(k.dmin) * xd[b]), acc);
        }
    }
    return acc;
}

/* ---- the interleaved layout ---- */

/* Q2_K, Q3_K, IQ4_XS: one row's super-block blk to (pack) or from
 * (unpack) row i of group block g.  Runs of 4 bytes are the file's bytes
 * (qs; Q3_K's hmask); the scales are what the kernels read: Q2_K the file's
 * scale|min byte, Q3_K and IQ4_XS sc - 32 as int8. */
static void move_k2(uint32_t type, uint8_t *g, int i, uint8_t *blk, bool pack) {
#define MOVE(goff, boff, n) (pack ? memcpy(g + (goff), blk + (boff), (n)) : memcpy(blk + (boff), g + (goff), (n)))
    if (type == DTYPE_IQ4_XS) {
        MOVE(2 * i, 0, 2);
        uint16_t sh = 0;
        if (pack) memcpy(&sh, blk + 2, 2);
        else memset(blk + 2, 0, 6);
        for (int j = 0; j < 8; j++) {
            if (pack) {
                const int sc = ((blk[4 + j / 2] >> (4 * (j % 2))) & 0xf) | ((sh >> (2 * j)) & 3) << 4;
                g[32 + 16 * j + i] = (uint8_t)(int8_t)(sc - 32);
            } else {
                const int sc = (int8_t)g[32 + 16 * j + i] + 32;
                blk[4 + j / 2] |= (uint8_t)((sc & 0xf) << (4 * (j % 2)));
                sh |= (uint16_t)((sc >> 4) << (2 * j));
            }
        }
        if (!pack) memcpy(blk + 2, &sh, 2);
        for (int r = 0; r < 32; r++) MOVE(160 + 64 * r + 4 * i, 8 + 4 * r, 4);
        return;
    }
    if (type == DTYPE_Q2_K) {
        MOVE(2 * i, 80, 2);
        MOVE(32 + 2 * i, 82, 2);
        for (int s = 0; s < 16; s++) MOVE(64 + 16 * s + i, s, 1);
        for (int r = 0; r < 16; r++) MOVE(320 + 64 * r + 4 * i, 16 + 4 * r, 4);
        return;
    }
    MOVE(2 * i, 108, 2);   /* Q3_K */
    if (!pack) memset(blk + 96, 0, 12);
    for (int s = 0; s < 16; s++) {
        if (pack) {
            g[32 + 16 * s + i] = (uint8_t)(int8_t)(q3_K_scale(blk + 96, s) - 32);
        } else {
            const int l = (int8_t)g[32 + 16 * s + i] + 32;
            blk[96 + (s < 8 ? s : s - 8)] |= (uint8_t)((l & 0xf) << (s < 8 ? 0 : 4));
            blk[96 + 8 + s % 4] |= (uint8_t)((l >> 4) << (2 * (s / 4)));
        }
    }
    for (int u = 0; u < 8; u++) MOVE(288 + 64 * u + 4 * i, 4 * u, 4);
    for (int r = 0; r < 16; r++) MOVE(800 + 64 * r + 4 * i, 32 + 4 * r, 4);
#undef MOVE
}

static bool is_k2(uint32_t type) { return type == DTYPE_Q2_K || type == DTYPE_Q3_K || type == DTYPE_IQ4_XS; }

void qmm_pack_group_k(uint32_t type, const uint8_t *w, size_t rb, int64_t K, int nr, uint8_t *dst) {
    const size_t gb = qmm_gblock_bytes(type), bb = dtype_block_bytes(type);
    memset(dst, 0, (size_t)(K / QMM_QK) * gb);
    if (is_k2(type)) {
        for (int64_t b = 0; b < K / QMM_QK; b++)
            for (int i = 0; i < nr; i++)
                move_k2(type, dst + (size_t)b * gb, i, (uint8_t *)(uintptr_t)(w + (size_t)i * rb + (size_t)b * bb), true);
        return;
    }
    struct kblock k;
    for (int64_t b = 0; b < K / QMM_QK; b++) {
        uint8_t *g = dst + (size_t)b * gb;
        for (int i = 0; i < nr; i++) {
            const uint8_t *blk = w + (size_t)i * rb + (size_t)b * bb;
            kblock_decode(type, blk, &k, type == DTYPE_Q6_K);   /* Q4_K / Q5_K: bits copied as they are */
            memcpy(g + 2 * i, &k.d, 2);
            if (type == DTYPE_Q6_K) {
                for (int s = 0; s < 16; s++) g[32 + 16 * s + i] = (uint8_t)(int8_t)k.sc[s];
                for (int c = 0; c < 4; c++)
                    for (int kk = 0; kk < 4; kk++)
                        for (int j = 0; j < 4; j++) {
                            const int e = 64 * c + 4 * kk + j;
                            g[288 + 64 * (4 * c + kk) + 4 * i + j] =
                                (uint8_t)((k.q[e] >> 4) | (k.q[e + 32] >> 4) << 2 | (k.q[e + 16] >> 4) << 4 |
                                          (k.q[e + 48] >> 4) << 6);
                        }
                for (int c = 0; c < 4; c++)
                    for (int kk = 0; kk < 8; kk++)
                        for (int j = 0; j < 4; j++) {
                            const int e = 64 * c + 4 * kk + j;
                            g[1312 + 64 * (8 * c + kk) + 4 * i + j] = (uint8_t)((k.q[e] & 0xf) | (k.q[e + 32] & 0xf) << 4);
                        }
                continue;
            }
            memcpy(g + 32 + 2 * i, &k.dmin, 2);
            for (int s = 0; s < 8; s++) {
                g[64 + 16 * s + i] = (uint8_t)k.sc[s];
                g[192 + 16 * s + i] = (uint8_t)k.m[s];
            }
            /* the bit runs are the file's bytes, regrouped */
            const uint8_t *qs = blk + (type == DTYPE_Q4_K ? 16 : 48);
            if (type == DTYPE_Q5_K)
                for (int r = 0; r < 8; r++) memcpy(g + 320 + 64 * r + 4 * i, blk + 16 + 4 * r, 4);
            uint8_t *gq = g + (type == DTYPE_Q4_K ? 320 : 832);
            for (int r = 0; r < 32; r++) memcpy(gq + 64 * r + 4 * i, qs + 4 * r, 4);
        }
    }
}

void qmm_unpack_row_k(uint32_t type, const uint8_t *grp, int i, int64_t K, uint8_t *dst) {
    const size_t gb = qmm_gblock_bytes(type), bb = dtype_block_bytes(type);
    if (is_k2(type)) {
        for (int64_t b = 0; b < K / QMM_QK; b++)
            move_k2(type, (uint8_t *)(uintptr_t)(grp + (size_t)b * gb), i, dst + (size_t)b * bb, false);
        return;
    }
    struct kblock k;
    memset(&k, 0, sizeof k);
    for (int64_t b = 0; b < K / QMM_QK; b++) {
        const uint8_t *g = grp + (size_t)b * gb;
        uint8_t *blk = dst + (size_t)b * bb;
        memcpy(&k.d, g + 2 * i, 2);
        if (type == DTYPE_Q6_K) {
            k.dmin = 0;
            for (int s = 0; s < 16; s++) k.sc[s] = (int8_t)g[32 + 16 * s + i];
            for (int c = 0; c < 4; c++)
                for (int kk = 0; kk < 8; kk++)
                    for (int j = 0; j < 4; j++) {
                        const int e = 64 * c + 4 * kk + j;
                        const uint8_t v = g[1312 + 64 * (8 * c + kk) + 4 * i + j];
                        /* high bits: run 4c + kk % 4, the pair for this element */
                        const uint8_t h = g[288 + 64 * (4 * c + kk % 4) + 4 * i + j];
                        const int sh = kk < 4 ? 0 : 4;
                        k.q[e] = (uint8_t)((v & 0xf) | ((h >> sh) & 3) << 4);
                        k.q[e + 32] = (uint8_t)((v >> 4) | ((h >> (sh + 2)) & 3) << 4);
                    }
            kblock_encode(type, &k, blk);
            continue;
        }
        memcpy(&k.dmin, g + 32 + 2 * i, 2);
        for (int s = 0; s < 8; s++) {
            k.sc[s] = g[64 + 16 * s + i];
            k.m[s] = g[192 + 16 * s + i];
        }
        kblock_encode(type, &k, blk);   /* d, dmin, scales (and zeroed bits, filled next) */
        if (type == DTYPE_Q5_K)
            for (int r = 0; r < 8; r++) memcpy(blk + 16 + 4 * r, g + 320 + 64 * r + 4 * i, 4);
        const uint8_t *gq = g + (type == DTYPE_Q4_K ? 320 : 832);
        uint8_t *qs = blk + (type == DTYPE_Q4_K ? 16 : 48);
        for (int r = 0; r < 32; r++) memcpy(qs + 4 * r, gq + 64 * r + 4 * i, 4);
    }
}
