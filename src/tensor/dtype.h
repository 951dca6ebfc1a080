/* dtype.h — element types of weights and activations, numbered as GGML/GGUF
 * numbers them, with block layouts and the scalar reference conversions.
 * These reference routines are the oracle every fast kernel is tested
 * against. */
#ifndef KVLLM_DTYPE_H
#define KVLLM_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum dtype {
    DTYPE_F32  = 0,
    DTYPE_F16  = 1,
    DTYPE_Q4_0 = 2,
    DTYPE_Q4_1 = 3,
    DTYPE_Q5_0 = 6,
    DTYPE_Q5_1 = 7,
    DTYPE_Q8_0 = 8,
    DTYPE_Q2_K = 10,
    DTYPE_Q3_K = 11,
    DTYPE_Q4_K = 12,
    DTYPE_Q5_K = 13,
    DTYPE_Q6_K = 14,
    DTYPE_IQ4_NL = 20,
    DTYPE_IQ4_XS = 23,
    DTYPE_BF16 = 30,
    DTYPE_MXFP4 = 39,
    DTYPE_COUNT_ = 40, /* bound for GGUF type ids we know by name */
};

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32

/* Block layouts, byte for byte as in GGUF files. */
struct block_q4_0 { uint16_t d; uint8_t qs[QK4_0 / 2]; };            /* 18 bytes */
struct block_q4_1 { uint16_t d, m; uint8_t qs[QK4_1 / 2]; };         /* 20 bytes */
struct block_q8_0 { uint16_t d; int8_t qs[QK8_0]; };                  /* 34 bytes */
/* Q5_0 y = d * (q - 16), Q5_1 y = d * q + m, q 5-bit: element j (< 16)
 * takes its low 4 bits from the low nibble of qs[j], element 16 + j from
 * the high one; bit 4 of element e is bit e of qh (little-endian uint32). */
struct block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };      /* 22 bytes */
struct block_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };   /* 24 bytes */

/* K-quants (dtype_k.c): super-blocks of QK_K elements, scales themselves
 * quantized.  Element order within a super-block, for the dequantizers:
 *  Q4_K  y = d * sc[j] * q - dmin * m[j] for sub-block j (32 elements),
 *        with 6-bit sc[j], m[j] packed in scales[12] (q4_K_scale_min);
 *        elements 64c + l and 64c + 32 + l (c < 4, l < 32) are the low and
 *        high nibbles of qs[32c + l].
 *  Q5_K  as Q4_K, q 5-bit: bit 4 of element 64c + l is bit 2c of qh[l],
 *        of element 64c + 32 + l bit 2c + 1.
 *  Q6_K  y = d * scales[i / 16] * (q - 32), q 6-bit: in half h (128
 *        elements), element 128h + 32s + l (s < 4, l < 32) takes its low 4
 *        bits from nibble s / 2 of ql[64h + 32(s % 2) + l] and its high 2
 *        bits from bits 2s, 2s + 1 of qh[32h + l].
 *  Q2_K  y = d * (sc & 15) * q - dmin * (sc >> 4), sc = scales[i / 16], q
 *        2-bit: in half h (128 elements), element 128h + 32s + l (s < 4,
 *        l < 32) is bits 2s, 2s + 1 of qs[32h + l].
 *  Q3_K  y = d * (sc - 32) * (q - 4), sc 6-bit for each run of 16
 *        (q3_K_scale), q 3-bit: low 2 bits as Q2_K's codes, bit 2 set when
 *        bit 4h + s of hmask[l] is (element 128h + 32s + l).
 *  IQ4_XS y = d * (sc - 32) * kvalues_iq4nl[q], sc 6-bit per 32 (low 4
 *        bits: nibble j % 2 of scales_l[j / 2]; high 2: bits 2j, 2j + 1 of
 *        scales_h), q a nibble laid out as Q4_0's per run of 32. */
#define QK_K 256
struct block_q4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; };                     /* 144 */
struct block_q5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; }; /* 176 */
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; }; /* 210 */
struct block_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; };                    /* 84 */
struct block_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };       /* 110 */
struct block_iq4_xs { uint16_t d, scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; };          /* 136 */

/* Non-linear 32-element blocks (dtype_nl.c), codes laid out as Q4_0's:
 *  IQ4_NL y = f16 d * kvalues_iq4nl[q];
 *  MXFP4  y = e8m0_half(e) * kvalues_mxfp4[q]: OCP MX FP4 (E2M1) values,
 *         doubled, with the shared power-of-two scale 2^(e - 128). */
#define QK4_NL 32
#define QK_MXFP4 32
struct block_iq4_nl { uint16_t d; uint8_t qs[QK4_NL / 2]; };   /* 18 bytes */
struct block_mxfp4 { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; };   /* 17 bytes */
extern const int8_t kvalues_iq4nl[16];
extern const int8_t kvalues_mxfp4[16];
/* 2^(e - 128) (e8m0 / 2), exactly: e 0 and 1 are f32 subnormals. */
float e8m0_half_to_f32(uint8_t e);

/* The 6-bit scale (0 .. 63, stored + 32) of run j (< 16) of a Q3_K block. */
static inline int q3_K_scale(const uint8_t *scales, int j) {
    const int lo = j < 8 ? scales[j] & 0xf : scales[j - 8] >> 4;
    return lo | ((scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
}

/* The 6-bit scale and min of sub-block j (< 8) of a Q4_K / Q5_K super-block:
 * bytes 0-3 hold sc[0..3] (low 6 bits), 4-7 m[0..3]; sub-blocks 4-7 keep
 * their low 4 bits in bytes 8-11 (scale low nibble, min high nibble) and
 * their top 2 bits in the top bits of bytes 0-3 (scale) and 4-7 (min). */
static inline void q4_K_scale_min(const uint8_t *scales, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4));
        *m = (uint8_t)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
    }
}

/* Whether kvllm can compute with this type (known and implemented). */
bool dtype_supported(uint32_t type);
/* Name ("F32", "Q8_0", ...) of any GGUF type id, "?" when unknown. */
const char *dtype_name(uint32_t type);
/* Elements per block and bytes per block (0 for unsupported types). */
int dtype_block_elems(uint32_t type);
size_t dtype_block_bytes(uint32_t type);
/* Bytes of n elements; false if n is not a whole number of blocks or on overflow. */
bool dtype_row_bytes(uint32_t type, uint64_t n, uint64_t *bytes);

/* Scalar conversions. */
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);   /* round to nearest even */
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  /* round to nearest even, NaN kept */
/* OCP FP8 E4M3 ("fn": bias 7, no infinities, 0x7f / 0xff are NaN, largest
 * finite 448).  f32 -> fp8 rounds to nearest even, saturates to +-448
 * (infinities included), keeps subnormals (multiples of 2^-9) and maps NaN
 * to 0x7f with the sign kept. */
uint8_t f32_to_fp8_e4m3(float f);
float fp8_e4m3_to_f32(uint8_t c);

/* Dequantize n elements (a multiple of the block size) of type `type`. */
void dtype_to_f32(uint32_t type, const void *src, float *dst, int64_t n);
/* Quantize n finite floats into `type` (reference quantizers).  K-quants
 * follow ggml's quantize_row_q*_K_ref search (not guaranteed bit-identical
 * to it); every block they write is valid for any finite input. */
void dtype_from_f32(uint32_t type, const float *src, void *dst, int64_t n);

/* The K-quant reference routines behind those two (dtype_k.c), nb super-blocks. */
void dequant_q4_K(const struct block_q4_K *b, float *y, int64_t nb);
void dequant_q5_K(const struct block_q5_K *b, float *y, int64_t nb);
void dequant_q6_K(const struct block_q6_K *b, float *y, int64_t nb);
void dequant_q2_K(const struct block_q2_K *b, float *y, int64_t nb);
void dequant_q3_K(const struct block_q3_K *b, float *y, int64_t nb);
void quant_q4_K(const float *x, struct block_q4_K *b, int64_t nb);
void quant_q5_K(const float *x, struct block_q5_K *b, int64_t nb);
void quant_q6_K(const float *x, struct block_q6_K *b, int64_t nb);
void quant_q2_K(const float *x, struct block_q2_K *b, int64_t nb);
void quant_q3_K(const float *x, struct block_q3_K *b, int64_t nb);
/* The non-linear types (dtype_nl.c), nb blocks of theirs. */
void dequant_iq4_nl(const struct block_iq4_nl *b, float *y, int64_t nb);
void dequant_iq4_xs(const struct block_iq4_xs *b, float *y, int64_t nb);
void dequant_mxfp4(const struct block_mxfp4 *b, float *y, int64_t nb);
void quant_iq4_nl(const float *x, struct block_iq4_nl *b, int64_t nb);
void quant_iq4_xs(const float *x, struct block_iq4_xs *b, int64_t nb);
void quant_mxfp4(const float *x, struct block_mxfp4 *b, int64_t nb);

#endif
