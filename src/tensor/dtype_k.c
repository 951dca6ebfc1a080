/* dtype_k.c — reference conversions of the K-quant super-block formats
 * Q2_K, Q3_K, Q4_K, Q5_K and Q6_K (layouts in dtype.h).
 *
 * Dequantizers do exactly the f32 operations ggml's dequantize_row_q*_K and
 * gguf-py's numpy decoders do, in the same order (Q4_K/Q5_K: d1 = d * sc,
 * m1 = dmin * m, y = d1 * q - m1; Q6_K: y = (d * sc) * q), so the values are
 * bit-identical to theirs.  This file is built without FMA flags and in ISO
 * C mode (no contraction), so each product and difference is rounded once.
 *
 * Quantizers follow ggml's reference quantizers (quantize_row_q*_K_ref):
 *  Q4_K / Q5_K: per sub-block of 32, a weighted least-squares fit of
 *    x ≈ scale * q - min over a small grid of candidate step sizes
 *    (fit_scale_min); then the eight scales and eight mins are themselves
 *    quantized to 6 bits against the super-block's largest, and every
 *    element is re-rounded with the scale and min it will really decode
 *    with.
 *  Q6_K: per sub-block of 16, a symmetric fit x ≈ scale * q, q in
 *    [-32, 31], trying 19 step sizes around amax/32 (fit_scale_sym); the 16
 *    scales become int8 against the largest, then elements are re-rounded.
 *  Q2_K: as Q4_K per sub-block of 16 (2-bit codes, weights |x|, absolute
 *    error), scales and mins 4-bit against their largest.
 *  Q3_K: per sub-block of 16, codes in [-4, 3] from amax, then up to five
 *    passes moving single codes while that raises the explained energy
 *    (fit_scale_q3); scales 6-bit against the largest, then re-rounded.
 * The float operations are ggml's, in its order, so on most inputs the
 * blocks come out identical to its reference quantizers (not guaranteed:
 * a build of ggml that contracts to FMA rounds differently).  Inputs must
 * be finite. */
#include "dtype.h"

#include <math.h>
#include <string.h>

_Static_assert(sizeof(struct block_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(struct block_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(struct block_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(struct block_q2_K) == 84, "q2_K layout");
_Static_assert(sizeof(struct block_q3_K) == 110, "q3_K layout");

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
/* Round to nearest, ties to even (the default rounding mode), as ggml's nearest_int. */
static inline int nearest(float v) { return (int)lrintf(v); }

/* ---- dequantization ---- */

void dequant_q4_K(const struct block_q4_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int c = 0; c < 4; c++) {            /* 64 elements: sub-blocks 2c (low nibbles), 2c+1 (high) */
            const uint8_t *q = b[i].qs + 32 * c;
            uint8_t sc, m;
            q4_K_scale_min(b[i].scales, 2 * c, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            q4_K_scale_min(b[i].scales, 2 * c + 1, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) y[l] = d1 * (float)(q[l] & 0xf) - m1;
            for (int l = 0; l < 32; l++) y[32 + l] = d2 * (float)(q[l] >> 4) - m2;
            y += 64;
        }
    }
}

void dequant_q5_K(const struct block_q5_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = b[i].qs + 32 * c, *qh = b[i].qh;
            uint8_t sc, m;
            q4_K_scale_min(b[i].scales, 2 * c, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            q4_K_scale_min(b[i].scales, 2 * c + 1, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) y[l] = d1 * (float)((q[l] & 0xf) | (((qh[l] >> (2 * c)) & 1) << 4)) - m1;
            for (int l = 0; l < 32; l++) y[32 + l] = d2 * (float)((q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) - m2;
            y += 64;
        }
    }
}

void dequant_q6_K(const struct block_q6_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = f16_to_f32(b[i].d);
        for (int h = 0; h < 2; h++) {            /* halves of 128 */
            const uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
            const int8_t *sc = b[i].scales + 8 * h;
            for (int s = 0; s < 4; s++)          /* runs of 32: 128h + 32s + l */
                for (int l = 0; l < 32; l++) {
                    int lo = (ql[32 * (s & 1) + l] >> (4 * (s >> 1))) & 0xf;
                    int hi = (qh[l] >> (2 * s)) & 3;
                    float dl = d * (float)sc[2 * s + l / 16];
                    y[32 * s + l] = dl * (float)((lo | (hi << 4)) - 32);
                }
            y += 128;
        }
    }
}

void dequant_q2_K(const struct block_q2_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int h = 0; h < 2; h++)              /* halves of 128 */
            for (int s = 0; s < 4; s++)          /* runs of 32, two scales each */
                for (int r = 0; r < 2; r++) {
                    const uint8_t sc = b[i].scales[8 * h + 2 * s + r];
                    const float dl = d * (float)(sc & 0xf), ml = dmin * (float)(sc >> 4);
                    const uint8_t *q = b[i].qs + 32 * h + 16 * r;
                    for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l] >> (2 * s)) & 3) - ml;
                }
    }
}

void dequant_q3_K(const struct block_q3_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = f16_to_f32(b[i].d);
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int r = 0; r < 2; r++) {
                    const float dl = d * (float)(q3_K_scale(b[i].scales, 8 * h + 2 * s + r) - 32);
                    const uint8_t *q = b[i].qs + 32 * h + 16 * r, *hm = b[i].hmask + 16 * r;
                    for (int l = 0; l < 16; l++) {
                        const int v = ((q[l] >> (2 * s)) & 3) - ((hm[l] >> (4 * h + s)) & 1 ? 0 : 4);
                        *y++ = dl * (float)v;
                    }
                }
    }
}

/* ---- quantization ---- */

/* Fit x[0..n) ≈ scale * L[i] - min, L in [0, nmax], min >= 0 (the offset
 * only ever lowers the range), minimizing sum w[i] * err^2.  Starts from
 * the plain min/max grid, then tries steps (nmax + rmin + rdelta * k) /
 * (max - min) for k = 0..nstep, each with the closed-form weighted least-
 * squares scale and offset for the codes it gives, and keeps the best.
 * The error is squared, or absolute when mad (Q2_K).  Returns scale (>= 0
 * unless all x are equal), min in *min_out, codes in L. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *min_out,
                           float rmin, float rdelta, int nstep, bool mad) {
    uint8_t Laux[32];
    float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {                              /* all zero (or all the same value <= 0) */
        memset(L, 0, (size_t)n);
        *min_out = -lo;
        return 0.0f;
    }
    float iscale = (float)nmax / (hi - lo), scale = 1 / iscale, best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(nearest(iscale * (x[i] - lo)), 0, nmax);
        float diff = scale * L[i] + lo - x[i];
        diff = mad ? fabsf(diff) : diff * diff;
        best += w[i] * diff;
    }
    for (int k = 0; k <= nstep; k++) {
        iscale = (rmin + rdelta * (float)k + (float)nmax) / (hi - lo);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest(iscale * (x[i] - lo)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D <= 0) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {                      /* an offset above zero is not representable: refit without */
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float diff = this_scale * Laux[i] + this_min - x[i];
            diff = mad ? fabsf(diff) : diff * diff;
            err += w[i] * diff;
        }
        if (err < best) {
            memcpy(L, Laux, (size_t)n);
            best = err;
            scale = this_scale;
            lo = this_min;
        }
    }
    *min_out = -lo;
    return scale;
}

/* Q4_K / Q5_K share everything but the code width (nmax 15 or 31), the
 * fit's grid and how codes are packed: sub-block scales and mins of one
 * super-block x[0..256) into b->d, b->dmin, b->scales, codes into L. */
static void quant_k_scales(const float *x, int nmax, float rmin, float rdelta, int nstep, uint16_t *d_out,
                           uint16_t *dmin_out, uint8_t scales[12], uint8_t L[QK_K]) {
    float sc[QK_K / 32], mn[QK_K / 32], w[32];
    float max_sc = 0, max_mn = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        const float *xj = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xj[l] * xj[l];
        float av = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av + fabsf(xj[l]);   /* favour the large elements */
        sc[j] = fit_scale_min(32, nmax, xj, w, L + 32 * j, &mn[j], rmin, rdelta, nstep, false);
        max_sc = sc[j] > max_sc ? sc[j] : max_sc;
        max_mn = mn[j] > max_mn ? mn[j] : max_mn;
    }
    const float inv_sc = max_sc > 0 ? 63 / max_sc : 0, inv_mn = max_mn > 0 ? 63 / max_mn : 0;
    memset(scales, 0, 12);
    for (int j = 0; j < QK_K / 32; j++) {
        int ls = clampi(nearest(inv_sc * sc[j]), 0, 63), lm = clampi(nearest(inv_mn * mn[j]), 0, 63);
        if (j < 4) {
            scales[j] |= (uint8_t)ls;
            scales[j + 4] |= (uint8_t)lm;
        } else {
            scales[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
            scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = f32_to_f16(max_sc / 63);
    *dmin_out = f32_to_f16(max_mn / 63);
    /* re-round every element with the scale and min it decodes with */
    const float d = f16_to_f32(*d_out), dmin = f16_to_f32(*dmin_out);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t s, m;
        q4_K_scale_min(scales, j, &s, &m);
        const float dj = d * s, mj = dmin * m;
        if (dj == 0) continue;                   /* codes irrelevant: keep the fit's */
        for (int l = 0; l < 32; l++) L[32 * j + l] = (uint8_t)clampi(nearest((x[32 * j + l] + mj) / dj), 0, nmax);
    }
}

void quant_q4_K(const float *x, struct block_q4_K *b, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        quant_k_scales(x, 15, -1.0f, 0.1f, 20, &b[i].d, &b[i].dmin, b[i].scales, L);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) b[i].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

void quant_q5_K(const float *x, struct block_q5_K *b, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        quant_k_scales(x, 31, -0.5f, 0.1f, 15, &b[i].d, &b[i].dmin, b[i].scales, L);
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int q0 = L[64 * c + l], q1 = L[64 * c + 32 + l];
                b[i].qs[32 * c + l] = (uint8_t)((q0 & 0xf) | ((q1 & 0xf) << 4));
                b[i].qh[l] |= (uint8_t)(((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1)));
            }
    }
}

/* Fit x[0..n) ≈ scale * L[i], L in [-nmax, nmax - 1], minimizing
 * sum x[i]^2 * err^2 (large elements matter most): the step through the
 * largest-magnitude element, then 18 nearby steps, each with its least-
 * squares scale.  Returns the (signed) scale, 0 and L = 0 for an all-zero
 * (below 1e-15) input. */
static float fit_scale_sym(int n, int nmax, const float *x, int8_t *L) {
    float amax = 0, vmax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); vmax = x[i]; }
    if (amax < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -(float)nmax / vmax, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 > 0 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int k = -9; k <= 9; k++) {
        if (k == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)k) / vmax;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {   /* larger explained energy sumlx^2 / suml2 */
            for (int i = 0; i < n; i++) L[i] = (int8_t)clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

void quant_q6_K(const float *x, struct block_q6_K *b, int64_t nb) {
    int8_t L[QK_K];
    float sc[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_sc = 0, amax_sc = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            sc[j] = fit_scale_sym(16, 32, x + 16 * j, L + 16 * j);
            if (fabsf(sc[j]) > amax_sc) { amax_sc = fabsf(sc[j]); max_sc = sc[j]; }
        }
        memset(&b[i], 0, sizeof b[i]);
        if (amax_sc < 1e-15f) continue;          /* all (nearly) zero: d = 0 decodes zeros */
        /* int8 sub-block scales: the largest-magnitude one becomes -128 */
        const float iscale = -128.0f / max_sc;
        b[i].d = f32_to_f16(1 / iscale);
        for (int j = 0; j < QK_K / 16; j++) b[i].scales[j] = (int8_t)clampi(nearest(iscale * sc[j]), -128, 127);
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK_K / 16; j++) {
            const float dj = d * (float)b[i].scales[j];
            for (int l = 0; l < 16; l++) {
                int q = dj != 0 ? clampi(nearest(x[16 * j + l] / dj), -32, 31) : 0;
                L[16 * j + l] = (int8_t)q;
            }
        }
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                int q[4];
                for (int s = 0; s < 4; s++) q[s] = L[128 * h + 32 * s + l] + 32;   /* 0 .. 63 */
                b[i].ql[64 * h + l] = (uint8_t)((q[0] & 0xf) | ((q[2] & 0xf) << 4));
                b[i].ql[64 * h + 32 + l] = (uint8_t)((q[1] & 0xf) | ((q[3] & 0xf) << 4));
                b[i].qh[32 * h + l] = (uint8_t)((q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6));
            }
    }
}

/* 256 2-bit codes into qs: element 128h + 32s + l is bits 2s of qs[32h + l]
 * (Q2_K's layout, and Q3_K's low bits). */
static void pack_2bit(const uint8_t L[QK_K], uint8_t qs[QK_K / 4]) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *q = L + 128 * h + l;
            qs[32 * h + l] = (uint8_t)(q[0] | q[32] << 2 | q[64] << 4 | q[96] << 6);
        }
}

void quant_q2_K(const float *x, struct block_q2_K *b, int64_t nb) {
    uint8_t L[QK_K];
    float sc[QK_K / 16], mn[QK_K / 16], w[16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_sc = 0, max_mn = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
            sc[j] = fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mn[j], -0.5f, 0.1f, 15, true);
            max_sc = sc[j] > max_sc ? sc[j] : max_sc;
            max_mn = mn[j] > max_mn ? mn[j] : max_mn;
        }
        /* 4-bit scales and mins against the largest of each (as ggml: no clamp, the largest maps to 15) */
        memset(b[i].scales, 0, sizeof b[i].scales);
        b[i].d = b[i].dmin = 0;
        if (max_sc > 0) {
            const float iscale = 15.0f / max_sc;
            for (int j = 0; j < QK_K / 16; j++) b[i].scales[j] = (uint8_t)nearest(iscale * sc[j]);
            b[i].d = f32_to_f16(max_sc / 15.0f);
        }
        if (max_mn > 0) {
            const float iscale = 15.0f / max_mn;
            for (int j = 0; j < QK_K / 16; j++) b[i].scales[j] |= (uint8_t)(nearest(iscale * mn[j]) << 4);
            b[i].dmin = f32_to_f16(max_mn / 15.0f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = f16_to_f32(b[i].d) * (float)(b[i].scales[j] & 0xf);
            if (d == 0) continue;                /* codes irrelevant: keep the fit's */
            const float dm = f16_to_f32(b[i].dmin) * (float)(b[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++) L[16 * j + l] = (uint8_t)clampi(nearest((x[16 * j + l] + dm) / d), 0, 3);
        }
        pack_2bit(L, b[i].qs);
    }
}

/* ggml's make_q3_quants with rmse: x[0..n) ≈ scale * L, L in [-nmax,
 * nmax - 1], weights x^2: codes from the step through the largest element,
 * then up to five passes that move one code at a time to its least-squares
 * value while that raises the explained energy sumlx^2 / suml2.  Returns
 * the least-squares scale; an all-zero (below 1e-15) input gives 0 and
 * L = 0 (not -nmax: as ggml, whose caller never reads them). */
static float fit_scale_q3(int n, int nmax, const float *x, int8_t *L) {
    float amax = 0, vmax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); vmax = x[i]; }
    if (amax < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = (float)-nmax / vmax;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx <= 0) continue;
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            const int nl = clampi(nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (nl == L[i]) continue;
            slx += w * x[i] * (float)nl;
            sl2 += w * (float)nl * (float)nl;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)nl;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0 ? sumlx / suml2 : 0.0f;
}

void quant_q3_K(const float *x, struct block_q3_K *b, int64_t nb) {
    int8_t L[QK_K];
    float sc[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_sc = 0, amax_sc = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            sc[j] = fit_scale_q3(16, 4, x + 16 * j, L + 16 * j);
            if (fabsf(sc[j]) > amax_sc) { amax_sc = fabsf(sc[j]); max_sc = sc[j]; }
        }
        memset(b[i].scales, 0, sizeof b[i].scales);
        b[i].d = 0;
        if (max_sc != 0) {                       /* 6-bit scales (stored + 32): the largest becomes -32 */
            const float iscale = -32.0f / max_sc;
            for (int j = 0; j < QK_K / 16; j++) {
                const int l = clampi(nearest(iscale * sc[j]), -32, 31) + 32;
                if (j < 8) b[i].scales[j] = (uint8_t)(l & 0xf);
                else b[i].scales[j - 8] |= (uint8_t)((l & 0xf) << 4);
                b[i].scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            b[i].d = f32_to_f16(1 / iscale);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = f16_to_f32(b[i].d) * (float)(q3_K_scale(b[i].scales, j) - 32);
            if (d == 0) continue;
            for (int l = 0; l < 16; l++) L[16 * j + l] = (int8_t)(clampi(nearest(x[16 * j + l] / d), -4, 3) + 4);
        }
        /* bit 2 of element e to bit e / 32 of hmask[e % 32], the low 2 bits as Q2_K's */
        uint8_t lo[QK_K];
        memset(b[i].hmask, 0, sizeof b[i].hmask);
        for (int e = 0; e < QK_K; e++) {
            if (L[e] > 3) b[i].hmask[e % 32] |= (uint8_t)(1 << (e / 32));
            lo[e] = (uint8_t)(L[e] & 3);
        }
        pack_2bit(lo, b[i].qs);
    }
}
