/* dtype_nl.c — reference conversions of the non-linear 4-bit formats: a
 * code is an index into a table of 16 values, not a level of a uniform
 * grid (layouts in dtype.h).
 *  IQ4_NL  blocks of 32, f16 scale, values kvalues_iq4nl (denser near 0);
 *  IQ4_XS  super-blocks of 256: IQ4_NL's codes with a 6-bit scale per 32
 *          under one f16 scale;
 *  MXFP4   blocks of 32 (OCP microscaling FP4, gpt-oss's expert weights):
 *          E2M1 values, doubled to integers, with a shared e8m0 power of two.
 *
 * Dequantizers do ggml's f32 operations in its order (IQ4_NL: d * v;
 * IQ4_XS: (d * (sc - 32)) * v; MXFP4: v * 2^(e - 128)), so they are bit-
 * identical to its dequantize_row_*.  Quantizers follow what llama-quantize
 * writes without an importance matrix (ggml_quantize_chunk): IQ4_NL and
 * IQ4_XS ggml's quantize_row_iq4_nl_impl with weights x^2 and 7 tries each
 * side, MXFP4 quantize_row_mxfp4_ref.  As dtype_k.c: ISO C, no contraction
 * to FMA; inputs must be finite. */
#include "dtype.h"

#include <math.h>
#include <string.h>

_Static_assert(sizeof(struct block_iq4_nl) == 18, "iq4_nl layout");
_Static_assert(sizeof(struct block_iq4_xs) == 136, "iq4_xs layout");
_Static_assert(sizeof(struct block_mxfp4) == 17, "mxfp4 layout");

const int8_t kvalues_iq4nl[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };
const int8_t kvalues_mxfp4[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

float e8m0_half_to_f32(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline int nearest(float v) { return (int)lrintf(v); }

/* ---- dequantization ---- */

/* 32 nibble codes (Q4_0's layout) through table v, times d. */
static void deq_nl32(const uint8_t qs[16], const int8_t v[16], float d, float *y) {
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)v[qs[j] & 0xf];
        y[j + 16] = d * (float)v[qs[j] >> 4];
    }
}

void dequant_iq4_nl(const struct block_iq4_nl *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK4_NL) deq_nl32(b[i].qs, kvalues_iq4nl, f16_to_f32(b[i].d), y);
}

/* The 6-bit scale (stored + 32) of run j (< 8) of an IQ4_XS block. */
static int iq4_xs_scale(const struct block_iq4_xs *b, int j) {
    return ((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xf) | ((b->scales_h >> (2 * j)) & 3) << 4;
}

void dequant_iq4_xs(const struct block_iq4_xs *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK_K / 32; j++, y += 32)
            deq_nl32(b[i].qs + 16 * j, kvalues_iq4nl, d * (float)(iq4_xs_scale(&b[i], j) - 32), y);
    }
}

void dequant_mxfp4(const struct block_mxfp4 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += QK_MXFP4) deq_nl32(b[i].qs, kvalues_mxfp4, e8m0_half_to_f32(b[i].e), y);
}

/* ---- quantization ---- */

/* The index of the value of v[0..16) (ascending) nearest x; ties to the
 * upper one (ggml's best_index_int8). */
static int nearest_nl(const int8_t v[16], float x) {
    if (x <= v[0]) return 0;
    if (x >= v[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < v[mid]) hi = mid;
        else lo = mid;
    }
    return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

/* The best scale for x[0..32) ≈ d * kvalues_iq4nl[L] with weights x^2:
 * from d = max / 127 (max the element of largest magnitude: it maps to
 * -127), the least-squares d of its codes, then steps (t - 127) / max for t
 * in -7..7, keeping the d that explains the most energy.  0 for an
 * all-zero (below 1e-15) block.  Codes in L. */
static float fit_iq4(const float *x, uint8_t L[32]) {
    const int8_t *v = kvalues_iq4nl;
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
    if (amax < 1e-15f) return 0.0f;
    float id = 1 / (-max / (float)v[0]), sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; j++) {
        L[j] = (uint8_t)nearest_nl(v, id * x[j]);
        const float q = v[L[j]], w = x[j] * x[j];
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
    }
    float d = sumq2 > 0 ? sumqx / sumq2 : 0.0f, best = d * sumqx;
    for (int t = -7; t <= 7; t++) {
        id = (float)(t + v[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const float q = v[nearest_nl(v, id * x[j])], w = x[j] * x[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

static void pack_nl32(const uint8_t L[32], uint8_t qs[16]) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | L[16 + j] << 4);
}

void quant_iq4_nl(const float *x, struct block_iq4_nl *b, int64_t nb) {
    uint8_t L[32];
    for (int64_t i = 0; i < nb; i++, x += QK4_NL) {
        const float d = fit_iq4(x, L);
        b[i].d = f32_to_f16(d);
        /* every code again against the fitted (not yet f16) scale, as ggml */
        const float id = d != 0 ? 1 / d : 0.0f;
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)nearest_nl(kvalues_iq4nl, id * x[j]);
        pack_nl32(L, b[i].qs);
    }
}

void quant_iq4_xs(const float *x, struct block_iq4_xs *b, int64_t nb) {
    uint8_t L[32];
    float sc[QK_K / 32];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_sc = 0, amax_sc = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            sc[j] = fit_iq4(x + 32 * j, L);
            if (fabsf(sc[j]) > amax_sc) { amax_sc = fabsf(sc[j]); max_sc = sc[j]; }
        }
        /* 6-bit run scales (stored + 32) against the largest, which becomes -32;
         * codes again against d * l with the f32 d, as ggml */
        const float d = -max_sc / 32, id = d != 0 ? 1 / d : 0.0f;
        b[i].d = f32_to_f16(d);
        b[i].scales_h = 0;
        memset(b[i].scales_l, 0, sizeof b[i].scales_l);
        for (int j = 0; j < QK_K / 32; j++) {
            int l = nearest(id * sc[j]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            const float dl = d * (float)l, idl = dl != 0 ? 1 / dl : 0.0f;
            for (int k = 0; k < 32; k++) L[k] = (uint8_t)nearest_nl(kvalues_iq4nl, idl * x[32 * j + k]);
            pack_nl32(L, b[i].qs + 16 * j);
            l += 32;
            b[i].scales_l[j / 2] |= (uint8_t)((l & 0xf) << (4 * (j % 2)));
            b[i].scales_h |= (uint16_t)((l >> 4) << (2 * j));
        }
    }
}

/* The first index of kvalues_mxfp4 whose value times e is nearest x. */
static int nearest_mxfp4(float x, float e) {
    int best = 0;
    float best_err = fabsf((float)kvalues_mxfp4[0] * e - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf((float)kvalues_mxfp4[i] * e - x);
        if (err < best_err) { best = i; best_err = err; }
    }
    return best;
}

/* e = floor(log2(amax)) - 2 + 127: the largest magnitude lands in [4, 8)
 * times 2^(e - 127), so at most the top value 12 = 6 doubled; an all-zero
 * block (or one below 2^-125, where ggml's conversion is undefined) e 0. */
void quant_mxfp4(const float *x, struct block_mxfp4 *b, int64_t nb) {
    uint8_t L[32];
    for (int64_t i = 0; i < nb; i++, x += QK_MXFP4) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float ef = amax > 0 ? floorf(log2f(amax)) - 2 + 127 : 0;
        b[i].e = (uint8_t)(ef < 0 ? 0 : ef);
        const float d = e8m0_half_to_f32(b[i].e);
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)nearest_mxfp4(x[j], d);
        pack_nl32(L, b[i].qs);
    }
}
