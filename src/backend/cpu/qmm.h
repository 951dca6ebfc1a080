/* qmm.h — the 8-bit integer matmul (KVLLM_ACT=q8): y (n, M) = x (n, K) · Wᵀ
 * for Q8_0 / Q4_0 / Q4_1 weights, the activations quantized per row.
 *
 * Model of the arithmetic.  Each token row x is quantized in blocks of 32
 * (qmm_quantize_row): d = amax / 127, code = round-half-even(x * (127 /
 * amax)) in -127 .. 127 (an all-zero block: d = 0, codes 0).  The row's
 * result depends on that row alone, so batching never changes it.
 *
 * Per (weight row, token), one 8-lane f32 accumulator acc; lane l of block
 * b takes the exact integer P = Σ_{i<4} w[32b + 4l + i] · x[32b + 4l + i]
 * (w: Q8_0's signed code, Q4_0's nibble - 8, Q4_1's nibble) and, in block
 * order, acc[l] = fma((float)P, f16(dw) * dx, acc[l]); Q4_1 then adds its
 * offset as acc[l] = fma((float)X, f16(m) * dx, acc[l]) with X = Σ_{i<4}
 * x[32b + 4l + i].  y = ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)).
 *
 * That sequence is the definition: qmm_ref_dot computes it in plain C, and
 * every kernel set (vpmaddubsw + vpmaddwd on AVX2, vpdpbusd on AVX-VNNI and
 * AVX-512 VNNI, whatever the tile shape, row pairing or thread) computes
 * exactly it, so each set's output equals qmm_ref_dot's bit for bit (the
 * unit test checks that with memcmp), and is therefore batch-invariant.
 * The integer products are exact: no int16 intermediate can saturate
 * (|w| <= 128, |x| <= 127, two products per int16: <= 32512). */
#ifndef KVLLM_QMM_H
#define KVLLM_QMM_H

#include "backend/cpu/cpu_internal.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QMM_BLK 32

/* Whether the integer path takes weights of type with rows of K. */
bool qmm_supports(uint32_t type, int64_t K);

/* Bytes of one quantized activation row of K (K codes, then K / 32 f32
 * scales; 64-byte multiple).  The context sizes its act_buf with it. */
size_t qmm_act_row_bytes(int64_t K);

/* Quantize x (K, a multiple of 32) into codes q (K) and scales d (K / 32). */
void qmm_quantize_row(const float *x, int64_t K, int8_t *q, float *d);

/* The reference: one weight row (type, K elements) times one quantized
 * activation row, with exactly the arithmetic above. */
float qmm_ref_dot(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, int64_t K);

/* A matmul's operands as the kernels see them. */
struct qmm_job {
    float *y;                 /* (n, M) */
    size_t ys;                /* M */
    const uint8_t *w;         /* (M, row_bytes) */
    size_t wstride;
    uint32_t type;
    int64_t K;
    const uint8_t *act;       /* n quantized rows, astride bytes apart: codes (K), then d (K / 32) */
    size_t astride;
    int n;
};

/* Rows [r0, r0 + nr) of the job for all its tokens.  One per kernel set. */
typedef void qmm_rows_fn(const struct qmm_job *j, int64_t r0, int nr);
qmm_rows_fn qmm_rows_scalar;   /* qmm_ref_dot per (row, token) */
qmm_rows_fn qmm_rows_avx2;     /* matmul_q8_avx2.c: -mavx2 -mfma -mf16c */
qmm_rows_fn qmm_rows_avxvnni;  /* matmul_q8_avxvnni.c: + -mavxvnni (256-bit vpdpbusd) */
qmm_rows_fn qmm_rows_avx512;   /* matmul_q8_avx512.c: AVX-512 F/BW/VL + VNNI (512-bit vpdpbusd) */

/* Run the matmul with kernel rows: quantize x into the context's act_buf
 * (KVLLM_ERANGE, logged, if n rows of w->ne0 do not fit: the context was
 * sized for fewer), then rows over the thread pool. */
int qmm_matmul(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n, qmm_rows_fn *rows);

/* backend_ops.matmul of the SIMD kernel sets: the integer path, with the
 * backend's rows kernel (struct cpu_backend.qrows, chosen at creation), for
 * the types it takes when the context's act is ACT_Q8; otherwise the AVX2
 * f32 matmul. */
int cpu_matmul_simd(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n);

#endif
