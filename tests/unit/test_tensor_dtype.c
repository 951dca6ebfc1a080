/* test_tensor_dtype.c — the reference conversions against first principles:
 * exhaustive f16/bf16 round trips, rounding of f32 -> f16, quantize /
 * dequantize error bounds for the block types on fresh random data, and for
 * the K-quants hand-built blocks that pin the bit layout, error bounds on
 * normal data and awkward inputs.  (Bit-exactness against gguf-py's decoder
 * is tests/python/test_quantize.py.) */
#include "check.h"
#include "num_util.h"
#include "tensor/dtype.h"

#include <math.h>
#include <string.h>

static float rnd(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return ((float)(*s >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

static void test_half_exhaustive(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = f16_to_f32((uint16_t)h);
        if (isnan(f)) { bad += !isnan(f16_to_f32(f32_to_f16(f))); continue; }
        bad += f32_to_f16(f) != h;
    }
    CHECK_MSG(bad == 0, "%d f16 values do not round-trip", bad);
    /* known values */
    CHECK(f16_to_f32(0x3c00) == 1.0f);
    CHECK(f16_to_f32(0xc000) == -2.0f);
    CHECK(f16_to_f32(0x7bff) == 65504.0f);
    CHECK(f16_to_f32(0x0001) == ldexpf(1, -24));
    CHECK(isinf(f16_to_f32(0x7c00)));
    CHECK(f32_to_f16(65520.0f) == 0x7c00);          /* rounds to inf */
    CHECK(f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00); /* tie -> even */
    CHECK(f32_to_f16(1.0f + 3 * ldexpf(1, -11)) == 0x3c02);
    /* f32 -> f16 is the nearest representable value on random inputs */
    unsigned s = 7;
    int worse = 0;
    for (int i = 0; i < 100000; i++) {
        float x = rnd(&s) * ldexpf(1, (int)(rnd(&s) * 15)); /* stays below 65504 */
        uint16_t h = f32_to_f16(x);
        float y = f16_to_f32(h), up = f16_to_f32((uint16_t)(h + 1)), dn = f16_to_f32((uint16_t)(h - 1));
        if (fabsf(up - x) < fabsf(y - x) || fabsf(dn - x) < fabsf(y - x)) worse++;
    }
    CHECK_MSG(worse == 0, "%d conversions not nearest", worse);
}

static void test_bf16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_f32((uint16_t)h);
        if (!isnan(f)) bad += f32_to_bf16(f) != h;
    }
    CHECK_MSG(bad == 0, "%d bf16 values do not round-trip", bad);
    CHECK(f32_to_bf16(1.0f) == 0x3f80);
    CHECK(isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

/* Quantize random rows; every element's error is bounded by the block's step. */
static void test_quant(uint32_t type, float step_frac) {
    enum { N = 32 * 64 };
    float x[N], y[N];
    uint8_t q[N * 2];
    unsigned s = 99 + type;
    for (int i = 0; i < N; i++) x[i] = rnd(&s) * (1 + (i / 32) % 7);
    dtype_from_f32(type, x, q, N);
    dtype_to_f32(type, q, y, N);
    double err = 0, ref = 0;
    int over = 0;
    for (int b = 0; b < N / 32; b++) {
        float amax = 0, mn = x[b * 32], mx = x[b * 32];
        for (int j = 0; j < 32; j++) {
            float v = x[b * 32 + j];
            amax = fmaxf(amax, fabsf(v));
            mn = fminf(mn, v);
            mx = fmaxf(mx, v);
        }
        float bound = (type == DTYPE_Q4_1 || type == DTYPE_Q5_1 ? (mx - mn) : amax) * step_frac * 1.01f + 1e-3f * amax;
        for (int j = 0; j < 32; j++) {
            float e = fabsf(x[b * 32 + j] - y[b * 32 + j]);
            over += e > bound;
            err += e * e;
            ref += x[b * 32 + j] * x[b * 32 + j];
        }
    }
    CHECK_MSG(over == 0, "%s: %d elements beyond the block step bound", dtype_name(type), over);
    printf("%s: relative error %.3g\n", dtype_name(type), sqrt(err / ref));
    uint64_t bytes;
    CHECK(dtype_row_bytes(type, N, &bytes) && bytes == (uint64_t)(N / 32) * dtype_block_bytes(type));
    CHECK(!dtype_row_bytes(type, 33, &bytes));
}

/* Hand-built Q5 blocks: the fifth bit of element e is bit e of qh. */
static void test_q5_layout(void) {
    float y[32];
    struct block_q5_0 b0;
    memset(&b0, 0, sizeof b0);
    b0.d = f32_to_f16(0.5f);
    b0.qs[3] = 0x72;                             /* element 3: low nibble 2; element 19: high nibble 7 */
    b0.qh[0] = 1 << 3;                           /* element 3: + 16 */
    b0.qh[2] = 1 << 3;                           /* element 19 */
    b0.qh[3] = 1 << 7;                           /* element 31 (nibble 0): 16 */
    dtype_to_f32(DTYPE_Q5_0, &b0, y, 32);
    CHECK_MSG(y[3] == 0.5f * (18 - 16) && y[19] == 0.5f * (23 - 16) && y[31] == 0.0f && y[0] == -8.0f,
              "q5_0: y[3] %g y[19] %g y[31] %g y[0] %g", y[3], y[19], y[31], y[0]);
    struct block_q5_1 b1;
    memset(&b1, 0, sizeof b1);
    b1.d = f32_to_f16(0.25f);
    b1.m = f32_to_f16(-1.0f);
    b1.qs[15] = 0xf0;                            /* element 31: high nibble 15 */
    b1.qh[3] = 1 << 7;
    dtype_to_f32(DTYPE_Q5_1, &b1, y, 32);
    CHECK_MSG(y[31] == 0.25f * 31 - 1.0f && y[15] == -1.0f, "q5_1: y[31] %g y[15] %g", y[31], y[15]);
}

/* ---- K-quants ---- */

/* Hand-built blocks: one element each, decoded from first principles. */
static void test_k_layout(void) {
    float y[QK_K];
    /* Q4_K: d = 1, dmin = 0.5; sub-block 5 (elements 160..191, the high
     * nibbles of qs[64..95]) has scale 37 = 0b100101 and min 50 = 0b110010:
     * low 4 bits in byte 9, top 2 bits in the top of bytes 1 (scale) and 5 (min). */
    struct block_q4_K b4;
    memset(&b4, 0, sizeof b4);
    b4.d = f32_to_f16(1.0f);
    b4.dmin = f32_to_f16(0.5f);
    b4.scales[9] = (uint8_t)((37 & 0xf) | ((50 & 0xf) << 4));
    b4.scales[1] = (uint8_t)((37 >> 4) << 6);
    b4.scales[5] = (uint8_t)((50 >> 4) << 6);
    b4.scales[2] = 7;                            /* sub-block 2: scale 7, min 0 (bytes 2, 6) */
    b4.qs[64 + 3] = (uint8_t)(11 << 4 | 6);      /* element 160+3: q 11; element 128+3 (sub-block 4): q 6 */
    b4.qs[32 * 1 + 4] = 9;                       /* element 64+4, sub-block 2: q 9 */
    dtype_to_f32(DTYPE_Q4_K, &b4, y, QK_K);
    CHECK_MSG(y[163] == 37.0f * 11 - 25.0f, "q4_K y[163] = %g", y[163]);
    CHECK_MSG(y[68] == 63.0f, "q4_K y[68] = %g", y[68]);
    CHECK_MSG(y[164] == -25.0f, "q4_K y[164] = %g (q 0: -dmin * m)", y[164]);
    uint8_t sc, m;
    q4_K_scale_min(b4.scales, 4, &sc, &m);       /* sub-block 4: low nibble of byte 8 is 0, top bits of bytes 0, 4 too */
    CHECK(sc == 0 && m == 0 && y[131] == 0.0f);
    /* Q5_K: element 64*3 + 32 + 7 = 231 (sub-block 7, high nibble of qs[96+7], bit 7 of qh[7]) */
    struct block_q5_K b5;
    memset(&b5, 0, sizeof b5);
    b5.d = f32_to_f16(0.25f);
    b5.scales[11] = 3;                           /* sub-block 7: scale 3 (low nibble of byte 11), min 0 */
    b5.qs[96 + 7] = 0x50;                        /* high nibble 5 */
    b5.qh[7] = 0x80;                             /* + 16 */
    dtype_to_f32(DTYPE_Q5_K, &b5, y, QK_K);
    CHECK_MSG(y[231] == 0.25f * 3 * 21, "q5_K y[231] = %g", y[231]);
    CHECK_MSG(y[199] == 0.0f, "q5_K y[199] = %g", y[199]);
    /* Q6_K: element 128 + 64 + 5 = 197 (half 1, run 2): low bits = high nibble of
     * ql[64 + 5], high bits = bits 4-5 of qh[32 + 5]; scale 197 / 16 = 12 */
    struct block_q6_K b6;
    memset(&b6, 0, sizeof b6);
    b6.d = f32_to_f16(0.5f);
    b6.scales[12] = -3;
    b6.ql[64 + 5] = 0x9 << 4;                    /* low 4 bits 9 */
    b6.qh[32 + 5] = 2 << 4;                      /* high 2 bits 2: q = 41, q - 32 = 9 */
    dtype_to_f32(DTYPE_Q6_K, &b6, y, QK_K);
    CHECK_MSG(y[197] == 0.5f * -3 * 9, "q6_K y[197] = %g", y[197]);
    CHECK_MSG(y[5] == 0.5f * 0 * -32, "q6_K y[5] = %g", y[5]);
    CHECK_MSG(y[192 + 16] == 0.0f, "q6_K y[208] = %g (scale 13 is 0)", y[208]);
}

/* Normal data: relative RMS error below `rel`, and every element within
 * `steps` quantization steps of the super-block's range (range / nmax). */
static void test_k_quant(uint32_t type, double rel, float steps) {
    enum { NB = 256, N = QK_K * NB };
    static float x[N], y[N];
    static uint8_t q[N];
    struct rng s;
    rng_seed(&s, 1234 + type);
    /* the scale varies by super-block */
    for (int i = 0; i < N; i++) x[i] = tu_gauss(&s) * (0.01f + (float)((i / QK_K) % 5));
    dtype_from_f32(type, x, q, N);
    dtype_to_f32(type, q, y, N);
    /* levels - 1 (IQ4_XS: 16 values, non-uniform) */
    const int nmax = type == DTYPE_Q2_K ? 3 : type == DTYPE_Q3_K ? 7 : type == DTYPE_Q4_K || type == DTYPE_IQ4_XS ? 15
                   : type == DTYPE_Q5_K ? 31 : 63;
    double err = 0, ref = 0, worst = 0;
    int over = 0;
    for (int b = 0; b < NB; b++) {
        float mn = 0, mx = 0;
        for (int j = 0; j < QK_K; j++) { mn = fminf(mn, x[b * QK_K + j]); mx = fmaxf(mx, x[b * QK_K + j]); }
        const float step = (mx - mn) / (float)nmax;
        for (int j = 0; j < QK_K; j++) {
            float e = fabsf(x[b * QK_K + j] - y[b * QK_K + j]);
            over += e > steps * step;
            worst = e / step > worst ? e / step : worst;
            err += (double)e * e;
            ref += (double)x[b * QK_K + j] * x[b * QK_K + j];
        }
    }
    const double r = sqrt(err / ref);
    printf("%s: relative RMS error %.4f on normal data (bound %.3f), worst element %.2f steps\n", dtype_name(type), r,
           rel, worst);
    CHECK_MSG(r <= rel, "%s: relative RMS error %.4f > %.4f", dtype_name(type), r, rel);
    CHECK_MSG(over == 0, "%s: %d elements beyond %.1f steps of their super-block's range", dtype_name(type), over, steps);
    /* sizes */
    uint64_t bytes;
    CHECK(dtype_block_elems(type) == QK_K && dtype_supported(type));
    CHECK(dtype_row_bytes(type, 3 * QK_K, &bytes) && bytes == 3 * dtype_block_bytes(type));
    CHECK(!dtype_row_bytes(type, QK_K / 2, &bytes) && !dtype_row_bytes(type, QK_K + 32, &bytes));
}

/* Inputs a quantizer can trip on: zeros, a constant, one outlier, a block
 * that is all negative, small values, a zero sub-block: every result
 * decodes finite and close.  Values near 1e-6 decode finite but coarse: the
 * f16 super-block scales underflow there (as in ggml). */
static void test_k_edges(uint32_t type) {
    float x[QK_K], y[QK_K];
    uint8_t q[256];
    int bad = 0;
    for (int c = 0; c < 7; c++) {
        struct rng s;
        rng_seed(&s, 77 + (uint64_t)c);
        for (int i = 0; i < QK_K; i++) {
            switch (c) {
            case 0: x[i] = 0; break;
            case 1: x[i] = 0.75f; break;
            case 2: x[i] = i == 100 ? 1000.0f : tu_gauss(&s) * 0.01f; break;
            case 3: x[i] = -1.0f - fabsf(tu_gauss(&s)); break;
            case 4: x[i] = tu_gauss(&s) * 1e-3f; break;
            case 5: x[i] = i < 32 ? 0 : tu_gauss(&s); break;     /* a zero sub-block */
            default: x[i] = tu_gauss(&s) * 1e-6f; break;         /* scales below f16's normal range */
            }
        }
        memset(q, 0xaa, sizeof q);
        dtype_from_f32(type, x, q, QK_K);
        dtype_to_f32(type, q, y, QK_K);
        float amax = 0, emax = 0;
        for (int i = 0; i < QK_K; i++) {
            if (!isfinite(y[i])) bad++;
            amax = fmaxf(amax, fabsf(x[i]));
            emax = fmaxf(emax, fabsf(x[i] - y[i]));
        }
        if (c == 0) CHECK_MSG(emax == 0, "%s: zeros decode to %g", dtype_name(type), emax);
        /* K-quant steps are at least range / 63 apart; allow a few and f16 scale rounding */
        /* Q2_K: 4 levels per 16 elements, the low one pinned at -min */
        if (c < 6)
            CHECK_MSG(emax <= (type == DTYPE_Q2_K ? 0.3f : 0.25f) * amax, "%s case %d: max error %g for amax %g", dtype_name(type), c, emax, amax);
    }
    CHECK_MSG(bad == 0, "%s: %d non-finite decoded values", dtype_name(type), bad);
}

int main(void) {
    test_half_exhaustive();
    test_bf16();
    test_quant(DTYPE_Q8_0, 0.5f / 127);  /* half a step of amax/127 */
    test_quant(DTYPE_Q4_0, 1.0f / 8);    /* step amax/8 (one half step, plus clamping at +8) */
    test_quant(DTYPE_Q4_1, 0.5f / 15);   /* half a step of (max-min)/15 */
    test_quant(DTYPE_Q5_0, 1.0f / 16);   /* step amax/16 (one half step, plus clamping at +16) */
    test_quant(DTYPE_Q5_1, 0.5f / 31);   /* half a step of (max-min)/31 */
    test_q5_layout();
    test_quant(DTYPE_IQ4_NL, 0.15f);     /* half the widest gap of kvalues_iq4nl (89 .. 113) is 12 / 127 of amax,
                                            widened by the weighted fit of the scale */
    test_quant(DTYPE_MXFP4, 0.25f);      /* amax in [8, 16) e-steps, the top value 12: clipping up to 4 steps */
    test_k_layout();
    /* measured 0.0713 / 0.0361 / 0.0177 (bit-identical to a transcription of ggml's reference quantizers) */
    test_k_quant(DTYPE_Q4_K, 0.080, 1.0f);
    test_k_quant(DTYPE_Q5_K, 0.040, 1.0f);
    test_k_quant(DTYPE_Q6_K, 0.020, 1.0f);
    test_k_quant(DTYPE_Q2_K, 0.31, 1.0f);   /* measured 0.297, as ggml's (byte-identical blocks) */
    test_k_quant(DTYPE_Q3_K, 0.20, 1.0f);
    test_k_quant(DTYPE_IQ4_XS, 0.12, 1.0f);
    static const uint32_t k_types[] = { DTYPE_Q2_K, DTYPE_Q3_K, DTYPE_Q4_K, DTYPE_Q5_K, DTYPE_Q6_K, DTYPE_IQ4_XS };
    for (size_t i = 0; i < sizeof k_types / sizeof *k_types; i++) test_k_edges(k_types[i]);
    CHECK(dtype_block_bytes(DTYPE_Q4_K) == 144 && dtype_block_bytes(DTYPE_Q5_K) == 176 &&
          dtype_block_bytes(DTYPE_Q6_K) == 210);
    CHECK(!strcmp(dtype_name(DTYPE_Q4_K), "Q4_K") && !strcmp(dtype_name(DTYPE_Q6_K), "Q6_K"));
    CHECK(dtype_supported(DTYPE_F16) && dtype_supported(DTYPE_Q5_K) && !dtype_supported(9) &&
          !dtype_supported(15) && !dtype_supported(200));
    CHECK(!strcmp(dtype_name(DTYPE_BF16), "BF16") && !strcmp(dtype_name(999), "?"));
    return check_report("test_tensor_dtype");
}
