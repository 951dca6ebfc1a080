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
    DTYPE_Q8_0 = 8,
    DTYPE_BF16 = 30,
    DTYPE_COUNT_ = 40, /* bound for GGUF type ids we know by name */
};

#define QK4_0 32
#define QK4_1 32
#define QK8_0 32

/* Block layouts, byte for byte as in GGUF files. */
struct block_q4_0 { uint16_t d; uint8_t qs[QK4_0 / 2]; };            /* 18 bytes */
struct block_q4_1 { uint16_t d, m; uint8_t qs[QK4_1 / 2]; };         /* 20 bytes */
struct block_q8_0 { uint16_t d; int8_t qs[QK8_0]; };                  /* 34 bytes */

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
/* Quantize n floats into `type` (reference quantizers). */
void dtype_from_f32(uint32_t type, const float *src, void *dst, int64_t n);

#endif
