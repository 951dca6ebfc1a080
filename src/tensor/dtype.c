/* dtype.c — reference (scalar, obviously-correct) conversions; the
 * K-quant formats live in dtype_k.c. */
#include "dtype.h"

#include <math.h>
#include <string.h>

static const struct { const char *name; int blk; size_t bytes; bool ok; } k_types[DTYPE_COUNT_] = {
    [0]  = { "F32",  1, 4, true },
    [1]  = { "F16",  1, 2, true },
    [2]  = { "Q4_0", QK4_0, sizeof(struct block_q4_0), true },
    [3]  = { "Q4_1", QK4_1, sizeof(struct block_q4_1), true },
    [6]  = { "Q5_0", QK5_0, sizeof(struct block_q5_0), true },
    [7]  = { "Q5_1", QK5_1, sizeof(struct block_q5_1), true },
    [8]  = { "Q8_0", QK8_0, sizeof(struct block_q8_0), true },
    [9]  = { "Q8_1", 32, 36, false },
    [10] = { "Q2_K", QK_K, sizeof(struct block_q2_K), true },
    [11] = { "Q3_K", QK_K, sizeof(struct block_q3_K), true },
    [12] = { "Q4_K", QK_K, sizeof(struct block_q4_K), true },
    [13] = { "Q5_K", QK_K, sizeof(struct block_q5_K), true },
    [14] = { "Q6_K", QK_K, sizeof(struct block_q6_K), true },
    [15] = { "Q8_K", 256, 292, false },
    [16] = { "IQ2_XXS", 256, 66, false },
    [17] = { "IQ2_XS", 256, 74, false },
    [18] = { "IQ3_XXS", 256, 98, false },
    [19] = { "IQ1_S", 256, 50, false },
    [20] = { "IQ4_NL", QK4_NL, sizeof(struct block_iq4_nl), true },
    [21] = { "IQ3_S", 256, 110, false },
    [22] = { "IQ2_S", 256, 82, false },
    [23] = { "IQ4_XS", QK_K, sizeof(struct block_iq4_xs), true },
    [24] = { "I8",   1, 1, false },
    [25] = { "I16",  1, 2, false },
    [26] = { "I32",  1, 4, false },
    [27] = { "I64",  1, 8, false },
    [28] = { "F64",  1, 8, false },
    [29] = { "IQ1_M", 256, 56, false },
    [30] = { "BF16", 1, 2, true },
    [34] = { "TQ1_0", 256, 54, false },
    [35] = { "TQ2_0", 256, 66, false },
    [39] = { "MXFP4", QK_MXFP4, sizeof(struct block_mxfp4), true },
};

_Static_assert(sizeof(struct block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(struct block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(struct block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(struct block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(struct block_q5_1) == 24, "q5_1 layout");

bool dtype_supported(uint32_t t) { return t < DTYPE_COUNT_ && k_types[t].ok; }
const char *dtype_name(uint32_t t) { return t < DTYPE_COUNT_ && k_types[t].name ? k_types[t].name : "?"; }
int dtype_block_elems(uint32_t t) { return t < DTYPE_COUNT_ ? k_types[t].blk : 0; }
size_t dtype_block_bytes(uint32_t t) { return t < DTYPE_COUNT_ ? k_types[t].bytes : 0; }

bool dtype_row_bytes(uint32_t t, uint64_t n, uint64_t *bytes) {
    int blk = dtype_block_elems(t);
    if (blk <= 0 || n % (uint64_t)blk) return false;
    return !__builtin_mul_overflow(n / (uint64_t)blk, (uint64_t)dtype_block_bytes(t), bytes);
}

/* ---- half precision ---- */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));   /* inf / nan */
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);           /* rounds to inf */
    if (ax < 0x38800000u) {                                             /* subnormal or zero */
        float v = bits_f32(ax) * 16777216.0f;                           /* * 2^24 */
        uint32_t m = (uint32_t)lrintf(v);                               /* nearest even */
        return (uint16_t)(sign | m);
    }
    uint32_t e = (ax >> 23) - 112, m = ax & 0x7fffffu;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;           /* may carry into exp: fine */
    return (uint16_t)(sign | h);
}

float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* ---- fp8 e4m3 ---- */

float fp8_e4m3_to_f32(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80) << 24;
    uint32_t exp = (c >> 3) & 0xf, man = c & 7;
    if (exp == 0xf && man == 7) return bits_f32(sign | 0x7fc00000u);       /* NaN */
    if (exp == 0) {
        float v = (float)man * 0.001953125f;                                /* man * 2^-9 */
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 120) << 23) | (man << 20));
}

uint8_t f32_to_fp8_e4m3(float f) {
    uint32_t x = f32_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7f);                   /* NaN */
    if (ax >= 0x43e00000u) return (uint8_t)(sign | 0x7e);                  /* >= 448 (inf too): saturate */
    if (ax < 0x3c800000u) {                                                 /* below 2^-6: subnormal or zero */
        uint32_t m = (uint32_t)lrintf(bits_f32(ax) * 512.0f);               /* nearest even; 8 carries to 2^-6 */
        return (uint8_t)(sign | m);
    }
    uint32_t e = (ax >> 23) - 120, m = ax & 0x7fffffu;                      /* e in 1 .. 15 */
    uint32_t h = (e << 3) | (m >> 20);
    uint32_t rest = m & 0xfffffu;
    if (rest > 0x80000u || (rest == 0x80000u && (h & 1))) h++;             /* < 448 here: at most 0x7e */
    return (uint8_t)(sign | h);
}

/* ---- blocks ---- */

static void dequant_q4_0(const struct block_q4_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j]             = (float)((b[i].qs[j] & 0xf) - 8) * d;
            y[j + QK4_0 / 2] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const struct block_q4_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j]             = (float)(b[i].qs[j] & 0xf) * d + m;
            y[j + QK4_1 / 2] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

/* The 5-bit code of element j (< 32) of a Q5_0 / Q5_1 block (dtype.h). */
static inline int q5_code(const uint8_t qh[4], const uint8_t qs[16], int j) {
    const uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    return (j < 16 ? qs[j] & 0xf : qs[j - 16] >> 4) | (int)((h >> j) & 1) << 4;
}

static void dequant_q5_0(const struct block_q5_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK5_0; j++) y[j] = (float)(q5_code(b[i].qh, b[i].qs, j) - 16) * d;
    }
}

static void dequant_q5_1(const struct block_q5_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK5_1) {
        float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
        for (int j = 0; j < QK5_1; j++) y[j] = (float)q5_code(b[i].qh, b[i].qs, j) * d + m;
    }
}

static void dequant_q8_0(const struct block_q8_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

void dtype_to_f32(uint32_t t, const void *src, float *dst, int64_t n) {
    switch (t) {
    case DTYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case DTYPE_F16: {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, s + 2 * i, 2); dst[i] = f16_to_f32(h); }
        break;
    }
    case DTYPE_BF16: {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, s + 2 * i, 2); dst[i] = bf16_to_f32(h); }
        break;
    }
    case DTYPE_Q4_0: dequant_q4_0(src, dst, n / QK4_0); break;
    case DTYPE_Q4_1: dequant_q4_1(src, dst, n / QK4_1); break;
    case DTYPE_Q5_0: dequant_q5_0(src, dst, n / QK5_0); break;
    case DTYPE_Q5_1: dequant_q5_1(src, dst, n / QK5_1); break;
    case DTYPE_Q8_0: dequant_q8_0(src, dst, n / QK8_0); break;
    case DTYPE_Q4_K: dequant_q4_K(src, dst, n / QK_K); break;
    case DTYPE_Q5_K: dequant_q5_K(src, dst, n / QK_K); break;
    case DTYPE_Q6_K: dequant_q6_K(src, dst, n / QK_K); break;
    case DTYPE_Q2_K: dequant_q2_K(src, dst, n / QK_K); break;
    case DTYPE_Q3_K: dequant_q3_K(src, dst, n / QK_K); break;
    case DTYPE_IQ4_NL: dequant_iq4_nl(src, dst, n / QK4_NL); break;
    case DTYPE_IQ4_XS: dequant_iq4_xs(src, dst, n / QK_K); break;
    case DTYPE_MXFP4: dequant_mxfp4(src, dst, n / QK_MXFP4); break;
    default: break;
    }
}

/* The two fits of ggml's 32-element reference quantizers, on one block.
 * Symmetric (quantize_row_q4_0_ref, q5_0_ref): d = max / -half, max the
 * element of largest magnitude (it maps to code 0), codes min(2 half - 1,
 * (int)(x / d + half + 0.5)).  Min-max (q4_1_ref, q5_1_ref): d = (max -
 * min) / top, codes min(top, (int)((x - min) / d + 0.5)), the offset min in
 * *mn.  Both return d. */
static float fit_sym(const float *x, int half, int q[32]) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
    const float d = max / (float)-half, id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) {
        q[j] = (int)(x[j] * id + ((float)half + 0.5f));
        q[j] = q[j] > 2 * half - 1 ? 2 * half - 1 : q[j];
    }
    return d;
}

static float fit_minmax(const float *x, int top, int q[32], float *mn_out) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; j++) { mn = x[j] < mn ? x[j] : mn; mx = x[j] > mx ? x[j] : mx; }
    const float d = (mx - mn) / (float)top, id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) {
        q[j] = (int)((x[j] - mn) * id + 0.5f);
        q[j] = q[j] > top ? top : q[j];
    }
    *mn_out = mn;
    return d;
}

/* Codes 0..31 into qs (low 4 bits: element j < 16 the low nibble of qs[j],
 * 16 + j the high one) and, for 5-bit types, qh (bit e: bit 4 of code e). */
static void pack_nibbles(const int q[32], uint8_t qs[16]) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 0xf) | (q[j + 16] & 0xf) << 4);
}
static void pack_q5(const int q[32], uint8_t qh[4], uint8_t qs[16]) {
    uint32_t h = 0;
    for (int j = 0; j < 32; j++) h |= (uint32_t)(q[j] >> 4 & 1) << j;
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> 8 * k);
    pack_nibbles(q, qs);
}

static void quant_q4_0(const float *x, struct block_q4_0 *b, int64_t nb) {
    int q[32];
    for (int64_t i = 0; i < nb; i++, x += QK4_0) {
        b[i].d = f32_to_f16(fit_sym(x, 8, q));
        pack_nibbles(q, b[i].qs);
    }
}

static void quant_q4_1(const float *x, struct block_q4_1 *b, int64_t nb) {
    int q[32];
    float mn;
    for (int64_t i = 0; i < nb; i++, x += QK4_1) {
        b[i].d = f32_to_f16(fit_minmax(x, 15, q, &mn));
        b[i].m = f32_to_f16(mn);
        pack_nibbles(q, b[i].qs);
    }
}

static void quant_q5_0(const float *x, struct block_q5_0 *b, int64_t nb) {
    int q[32];
    for (int64_t i = 0; i < nb; i++, x += QK5_0) {
        b[i].d = f32_to_f16(fit_sym(x, 16, q));
        pack_q5(q, b[i].qh, b[i].qs);
    }
}

static void quant_q5_1(const float *x, struct block_q5_1 *b, int64_t nb) {
    int q[32];
    float mn;
    for (int64_t i = 0; i < nb; i++, x += QK5_1) {
        b[i].d = f32_to_f16(fit_minmax(x, 31, q, &mn));
        b[i].m = f32_to_f16(mn);
        pack_q5(q, b[i].qh, b[i].qs);
    }
}

static void quant_q8_0(const float *x, struct block_q8_0 *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK8_0) {
        float amax = 0;
        for (int j = 0; j < QK8_0; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        float d = amax / 127, id = d ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) b[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

void dtype_from_f32(uint32_t t, const float *src, void *dst, int64_t n) {
    switch (t) {
    case DTYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case DTYPE_F16: {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) { uint16_t h = f32_to_f16(src[i]); memcpy(d + 2 * i, &h, 2); }
        break;
    }
    case DTYPE_BF16: {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) { uint16_t h = f32_to_bf16(src[i]); memcpy(d + 2 * i, &h, 2); }
        break;
    }
    case DTYPE_Q4_0: quant_q4_0(src, dst, n / QK4_0); break;
    case DTYPE_Q4_1: quant_q4_1(src, dst, n / QK4_1); break;
    case DTYPE_Q5_0: quant_q5_0(src, dst, n / QK5_0); break;
    case DTYPE_Q5_1: quant_q5_1(src, dst, n / QK5_1); break;
    case DTYPE_Q8_0: quant_q8_0(src, dst, n / QK8_0); break;
    case DTYPE_Q4_K: quant_q4_K(src, dst, n / QK_K); break;
    case DTYPE_Q5_K: quant_q5_K(src, dst, n / QK_K); break;
    case DTYPE_Q6_K: quant_q6_K(src, dst, n / QK_K); break;
    case DTYPE_Q2_K: quant_q2_K(src, dst, n / QK_K); break;
    case DTYPE_Q3_K: quant_q3_K(src, dst, n / QK_K); break;
    case DTYPE_IQ4_NL: quant_iq4_nl(src, dst, n / QK4_NL); break;
    case DTYPE_IQ4_XS: quant_iq4_xs(src, dst, n / QK_K); break;
    case DTYPE_MXFP4: quant_mxfp4(src, dst, n / QK_MXFP4); break;
    default: break;
    }
}
