/* q8_codes.h — the 8-bit matmul's view of a weight row (matmul_q8.cu): the
 * packed codes of one unit of work unpacked into int8 lanes (4 codes to an
 * int, element order) and the integer dot products __dp4a makes of them.
 *
 * Plain C that nvcc compiles for the device and any C compiler for the host,
 * so tests/unit/test_cuda_plan.c checks every unpacking against the formats
 * of dtype.h on the CPU.  On the device the byte operations are the
 * intrinsics (__vsub4, __byte_perm, __dp4a); on the host the same
 * operations spelled out.  Nothing here reads a scale: the kernel converts
 * those (f16, e8m0) with cuda_common.cuh's exact conversions.
 *
 * Units:
 *   blocks of 32 (Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL MXFP4): q8_unit32, one
 *     block's 32 codes as 8 ints, int i = elements 4i .. 4i+3, offset as
 *     the CPU's qmm.h defines w (Q4_0 - 8, Q5_0 - 16, IQ4_NL and MXFP4 their
 *     table values, Q4_1 and Q5_1 unsigned);
 *   Q4_K, Q5_K super-blocks, 8 lanes each: q8_q4k_lane, lane li = 2 cc + hh
 *     takes bytes 32 cc + 16 hh .. + 15 of qs, whose low nibbles are
 *     elements 64 cc + 16 hh + 0..15 (sub-block 2 cc) and high ones those
 *     + 32 (sub-block 2 cc + 1), with those sub-blocks' scales and mins;
 *   Q6_K super-blocks, 8 lanes each: q8_q6k_lane, lane li takes elements
 *     32 li .. 32 li + 31 (sub-blocks 2 li, 2 li + 1) as q - 32;
 *   Q2_K, Q3_K super-blocks, 8 lanes each: q8_q2k_lane, the same elements
 *     (Q2_K's codes 0..3, Q3_K's as q - 4) with their sub-blocks' scales;
 *   IQ4_XS sub-blocks of 32: q8_iq4xs_unit, as a 32-block with its 6-bit
 *     scale. */
#ifndef KVLLM_Q8_CODES_H
#define KVLLM_Q8_CODES_H

#include "tensor/dtype.h"
#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define Q8_FN static __host__ __device__ __forceinline__
#else
#include <string.h>
#define Q8_FN static inline
#endif
#ifdef __CUDA_ARCH__
#define Q8_UNROLL _Pragma("unroll")   /* the device pass: the code arrays must stay in registers */
#else
#define Q8_UNROLL
#endif

/* ---- byte operations ---- */

/* Per-byte a - b, modulo 256 (no borrow between bytes). */
Q8_FN uint32_t q8_vsub4(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __vsub4(a, b);
#else
    uint32_t r = 0;
    for (int k = 0; k < 4; k++) r |= (uint32_t)(uint8_t)((a >> (8 * k)) - (b >> (8 * k))) << (8 * k);
    return r;
#endif
}

/* Byte k of the result is byte (sel >> 4k) & 7 of the 8 bytes (lo: 0-3, hi: 4-7); sel's bit 4k + 3
 * is never set here (PTX prmt's default mode would then replicate a sign). */
Q8_FN uint32_t q8_byte_perm(uint32_t lo, uint32_t hi, uint32_t sel) {
#ifdef __CUDA_ARCH__
    return __byte_perm(lo, hi, sel);
#else
    uint32_t r = 0;
    for (int k = 0; k < 4; k++) {
        const int i = (int)(sel >> (4 * k)) & 7;
        r |= ((i < 4 ? lo >> (8 * i) : hi >> (8 * (i - 4))) & 0xffu) << (8 * k);
    }
    return r;
#endif
}

/* c + the dot product of a's and b's 4 signed bytes. */
Q8_FN int q8_dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int k = 0; k < 4; k++) c += (int)(int8_t)(uint8_t)((uint32_t)a >> (8 * k)) *
                                     (int)(int8_t)(uint8_t)((uint32_t)b >> (8 * k));
    return c;
#endif
}

/* 4 bytes at p, little-endian: p 2-byte aligned (the 18-, 20-, 22-, 24- and 34-byte blocks), or any
 * address (MXFP4's 17-byte blocks). */
Q8_FN uint32_t q8_ld_a2(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)(const void *)p;
    return (uint32_t)h[0] | (uint32_t)h[1] << 16;
}
Q8_FN uint32_t q8_ld_a1(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
/* 16 bytes at p (16-byte aligned) as 4 little-endian ints: one 16-byte load on the device. */
Q8_FN void q8_ld16(const uint8_t *p, uint32_t w[4]) {
#ifdef __CUDA_ARCH__
    const uint4 v = *(const uint4 *)(const void *)p;
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
#else
    memcpy(w, p, 16);   /* the host is little-endian like the device (x86-64, arm64) */
#endif
}

/* ---- dot products (exact int32: |code| <= 128, |x| <= 127) ---- */

Q8_FN int q8_dot4(const int *c, const int *x) {   /* c, x: 4 ints each */
    return q8_dp4a(c[3], x[3], q8_dp4a(c[2], x[2], q8_dp4a(c[1], x[1], q8_dp4a(c[0], x[0], 0))));
}
Q8_FN int q8_sum4(const int *x) {
    return q8_dp4a(0x01010101, x[3], q8_dp4a(0x01010101, x[2], q8_dp4a(0x01010101, x[1],
                                                                         q8_dp4a(0x01010101, x[0], 0))));
}

/* ---- blocks of 32 ---- */

/* Bytes of a block (Q8_0 34, Q4_0 and IQ4_NL 18, Q4_1 20, Q5_0 22, Q5_1 24, MXFP4 17); the 16 nibble
 * bytes end every block but Q8_0's. */
Q8_FN int q8_blk_bytes(uint32_t type) {
    return type == DTYPE_Q8_0 ? 34 : type == DTYPE_Q4_1 ? 20 : type == DTYPE_Q5_0 ? 22 : type == DTYPE_Q5_1 ? 24
         : type == DTYPE_MXFP4 ? 17 : 18;
}

/* IQ4_NL's and MXFP4's 16 values (dtype.h's kvalues_*) as 4 ints of 4 bytes: constants, so the
 * device reads no table. */
Q8_FN void q8_nl_table(uint32_t type, uint32_t tbl[4]) {
    const bool mx = type == DTYPE_MXFP4;
    tbl[0] = mx ? 0x03020100u : 0xbfad9881u;
    tbl[1] = mx ? 0x0c080604u : 0xf6eaddcfu;
    tbl[2] = mx ? 0xfdfeff00u : 0x26190d01u;
    tbl[3] = mx ? 0xf4f8fafcu : 0x71594535u;
}

/* Four nibbles (one a byte, 0..15) to their table values. */
Q8_FN uint32_t q8_nl_lookup(uint32_t v, const uint32_t tbl[4]) {
    const uint32_t b = v & 0x07070707u, s2 = b | b >> 4;
    const uint32_t sel = (s2 & 0xffu) | ((s2 >> 8) & 0xff00u);   /* byte k's low 3 bits at bits 4k */
    const uint32_t lo = q8_byte_perm(tbl[0], tbl[1], sel), hi = q8_byte_perm(tbl[2], tbl[3], sel);
    const uint32_t m = ((v & 0x08080808u) >> 3) * 0xffu;          /* 0xff where bit 3 is set */
    return (lo & ~m) | (hi & m);
}

/* Bit 4 of byte k = bit k of a (k < 4): a unit's fifth bits spread onto its 4 codes. */
Q8_FN uint32_t q8_bit4(uint32_t a) {
    return ((a << 4) & 0x10u) | ((a << 11) & 0x1000u) | ((a << 18) & 0x100000u) | ((a << 25) & 0x10000000u);
}

/* The 32 codes of the block at blk (type: a 32-block type; tbl: q8_nl_table's for IQ4_NL, MXFP4). */
Q8_FN void q8_unit32(uint32_t type, const uint8_t *blk, const uint32_t tbl[4], int c[8]) {
    if (type == DTYPE_Q8_0) {
        Q8_UNROLL
        for (int i = 0; i < 8; i++) c[i] = (int)q8_ld_a2(blk + 2 + 4 * i);
        return;
    }
    const bool q5 = type == DTYPE_Q5_0 || type == DTYPE_Q5_1, nl = type == DTYPE_IQ4_NL || type == DTYPE_MXFP4;
    const uint8_t *qs = blk + q8_blk_bytes(type) - 16;
    const uint32_t qh = q5 ? q8_ld_a2(blk + (type == DTYPE_Q5_1 ? 4 : 2)) : 0;
    const uint32_t off = type == DTYPE_Q4_0 ? 0x08080808u : type == DTYPE_Q5_0 ? 0x10101010u : 0;
    Q8_UNROLL
    for (int i = 0; i < 4; i++) {
        const uint32_t v = type == DTYPE_MXFP4 ? q8_ld_a1(qs + 4 * i) : q8_ld_a2(qs + 4 * i);
        uint32_t lo = v & 0x0f0f0f0fu, hi = (v >> 4) & 0x0f0f0f0fu;   /* elements 4i.., 16 + 4i.. */
        if (q5) {   /* element j's fifth bit is bit j of qh */
            lo |= q8_bit4(qh >> (4 * i));
            hi |= q8_bit4(qh >> (16 + 4 * i));
        }
        if (nl) {
            lo = q8_nl_lookup(lo, tbl);
            hi = q8_nl_lookup(hi, tbl);
        } else if (off) {
            lo = q8_vsub4(lo, off);
            hi = q8_vsub4(hi, off);
        }
        c[i] = (int)lo;
        c[4 + i] = (int)hi;
    }
}

/* ---- K-quant super-blocks, 8 lanes each ---- */

/* Sub-block j's 6-bit scale and min of a Q4_K / Q5_K block's scales[12] (dtype.h's q4_K_scale_min). */
Q8_FN void q8_k_scale_min(const uint8_t *scales, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = (scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4);
        *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
}

/* Q4_K / Q5_K super-block at blk (16-byte aligned), lane li: lo[4] the codes of sub-block 2 cc's
 * elements 16 hh .. 16 hh + 15, hi[4] sub-block 2 cc + 1's, sc[2], m[2] the two sub-blocks' scales and
 * mins. */
Q8_FN void q8_q4k_lane(uint32_t type, const uint8_t *blk, int li, int lo[4], int hi[4], int sc[2], int m[2]) {
    const bool q5 = type == DTYPE_Q5_K;
    const int cc = li / 2, hh = li % 2;
    uint32_t qs[4], qh[4] = { 0, 0, 0, 0 };
    q8_ld16(blk + (q5 ? 48 : 16) + 32 * cc + 16 * hh, qs);
    if (q5) q8_ld16(blk + 16 + 16 * hh, qh);
    Q8_UNROLL
    for (int i = 0; i < 4; i++) {
        uint32_t l = qs[i] & 0x0f0f0f0fu, h = (qs[i] >> 4) & 0x0f0f0f0fu;
        if (q5) {   /* qh[e] bit 2 cc: element 64 cc + e's fifth bit; bit 2 cc + 1: element 64 cc + 32 + e's */
            l |= ((qh[i] >> (2 * cc)) & 0x01010101u) << 4;
            h |= ((qh[i] >> (2 * cc + 1)) & 0x01010101u) << 4;
        }
        lo[i] = (int)l;
        hi[i] = (int)h;
    }
    q8_k_scale_min(blk + 4, 2 * cc, &sc[0], &m[0]);
    q8_k_scale_min(blk + 4, 2 * cc + 1, &sc[1], &m[1]);
}

/* Q6_K super-block at blk (2-byte aligned), lane li: c[8] the codes - 32 of elements 32 li .. 32 li +
 * 31 (h = li / 4, s = li % 4: low 4 bits in ql[64 h + 32 (s & 1) + l] >> 4 (s >> 1), high 2 in qh[32 h +
 * l] >> 2 s), sc[2] the int8 scales of sub-blocks 2 li, 2 li + 1. */
Q8_FN void q8_q6k_lane(const uint8_t *blk, int li, int c[8], int sc[2]) {
    const int h = li / 4, s = li % 4;
    Q8_UNROLL
    for (int i = 0; i < 8; i++) {
        const uint32_t lo = (q8_ld_a2(blk + 64 * h + 32 * (s & 1) + 4 * i) >> (4 * (s >> 1))) & 0x0f0f0f0fu;
        const uint32_t hi = (q8_ld_a2(blk + 128 + 32 * h + 4 * i) >> (2 * s)) & 0x03030303u;
        c[i] = (int)q8_vsub4(lo | hi << 4, 0x20202020u);
    }
    sc[0] = (int8_t)blk[192 + 2 * li];
    sc[1] = (int8_t)blk[192 + 2 * li + 1];
}

/* Q2_K / Q3_K super-block at blk (2-byte aligned), lane li (h = li / 4, s = li % 4): c[8] the codes of
 * elements 32 li .. 32 li + 31, bits 2s, 2s + 1 of qs[32 h + l] (Q3_K: with bit 2 set where bit 4h + s
 * of hmask[l] is, minus 4); sc[2], m[2] sub-blocks 2 li and 2 li + 1's scales and mins (Q2_K: the
 * low and high nibbles of scales[j]; Q3_K: its 6-bit scale - 32, no min). */
Q8_FN void q8_q2k_lane(uint32_t type, const uint8_t *blk, int li, int c[8], int sc[2], int m[2]) {
    const bool q3 = type == DTYPE_Q3_K;
    const int h = li / 4, s = li % 4;
    const uint8_t *qs = blk + (q3 ? 32 : 16) + 32 * h;
    Q8_UNROLL
    for (int i = 0; i < 8; i++) {
        uint32_t q = (q8_ld_a2(qs + 4 * i) >> (2 * s)) & 0x03030303u;
        if (q3) q = q8_vsub4(q | ((q8_ld_a2(blk + 4 * i) >> (4 * h + s)) & 0x01010101u) << 2, 0x04040404u);
        c[i] = (int)q;
    }
    Q8_UNROLL
    for (int k = 0; k < 2; k++) {
        const int j = 2 * li + k;
        if (q3) {
            const uint8_t *scales = blk + 96;
            const int lo = j < 8 ? scales[j] & 0xf : scales[j - 8] >> 4;
            sc[k] = (lo | ((scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
            m[k] = 0;
        } else {
            sc[k] = blk[j] & 0xf;
            m[k] = blk[j] >> 4;
        }
    }
}

/* IQ4_XS super-block at blk (2-byte aligned), sub-block j (< 8): c[8] its 32 codes' table values (as
 * IQ4_NL's: tbl is q8_nl_table(DTYPE_IQ4_NL)), *sc its 6-bit scale - 32 (low 4 bits: nibble j % 2 of
 * scales_l[j / 2]; high 2: bits 2j, 2j + 1 of scales_h). */
Q8_FN void q8_iq4xs_unit(const uint8_t *blk, int j, const uint32_t tbl[4], int c[8], int *sc) {
    const uint8_t *qs = blk + 8 + 16 * j;
    Q8_UNROLL
    for (int i = 0; i < 4; i++) {
        const uint32_t v = q8_ld_a2(qs + 4 * i);
        c[i] = (int)q8_nl_lookup(v & 0x0f0f0f0fu, tbl);
        c[4 + i] = (int)q8_nl_lookup((v >> 4) & 0x0f0f0f0fu, tbl);
    }
    const uint32_t sh = (uint32_t)blk[2] | (uint32_t)blk[3] << 8;
    *sc = (int)(((blk[4 + j / 2] >> (4 * (j % 2))) & 0xf) | ((sh >> (2 * j)) & 3) << 4) - 32;
}

#endif
