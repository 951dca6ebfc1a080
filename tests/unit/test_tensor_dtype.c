/* test_tensor_dtype.c — the reference conversions against first principles:
 * exhaustive f16/bf16 round trips, rounding of f32 -> f16, and quantize /
 * dequantize error bounds for the block types on fresh random data. */
#include "check.h"
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
        float bound = (type == DTYPE_Q4_1 ? (mx - mn) : amax) * step_frac * 1.01f + 1e-3f * amax;
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

int main(void) {
    test_half_exhaustive();
    test_bf16();
    test_quant(DTYPE_Q8_0, 0.5f / 127);  /* half a step of amax/127 */
    test_quant(DTYPE_Q4_0, 1.0f / 8);    /* step amax/8 (one half step, plus clamping at +8) */
    test_quant(DTYPE_Q4_1, 0.5f / 15);   /* half a step of (max-min)/15 */
    CHECK(dtype_supported(DTYPE_F16) && !dtype_supported(12) && !dtype_supported(200));
    CHECK(!strcmp(dtype_name(DTYPE_BF16), "BF16") && !strcmp(dtype_name(999), "?"));
    return check_report("test_tensor_dtype");
}
