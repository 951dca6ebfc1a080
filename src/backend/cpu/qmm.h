/* qmm.h — the 8-bit integer matmul (activations q8, the default): y (n, M) = x (n, K) · Wᵀ
 * for Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4 weights (K-quants and
 * IQ4_XS: qmm_k.c), the activations quantized per row.
 *
 * Model of the arithmetic.  Each token row x is quantized in blocks of 32
 * (qmm_quantize_row): dx = amax / 127, code = round-half-even(x * (127 /
 * amax)) in -127 .. 127 (an all-zero block: dx = 0, codes 0; codes 0 too
 * where 127 / amax overflows: qmm_inv_scale), and xs = Σ
 * codes.  The row's result depends on that row alone, so batching never
 * changes it.  A row made for a weight type holds xs in the form that
 * type's kernels use it (qmm_act_sum_factor), so each 16-row group loads it where
 * it converted or multiplied it again.
 *
 * Per (weight row, token), one f32 accumulator acc = 0; in block order,
 * P = Σ_{32} w · x exactly in int32 (w: Q8_0's signed code, Q4_0's nibble
 * - 8, Q5_0's 5-bit code - 16, Q4_1's and Q5_1's code, IQ4_NL's and
 * MXFP4's table value of the code) and acc = fma((float)P, dw * dx, acc)
 * with dw the block's f16 d (MXFP4: its power of two e8m0_half(e)); Q4_1
 * and Q5_1 then add their offset as acc = fma((float)xs, f16(m) * dx, acc).
 * y = acc.
 *
 * That sequence is the definition: qmm_ref_dot computes it in plain C, and
 * every kernel set (vpmaddubsw + vpmaddwd on AVX2, vpdpbusd on AVX-VNNI and
 * AVX-512 VNNI, whatever the tile shape or thread) computes exactly it, so
 * each set's output equals qmm_ref_dot's bit for bit (the unit test checks
 * with memcmp), and is therefore batch-invariant.  No integer step can
 * overflow or saturate (|w| <= 128, |x| <= 127; see matmul_q8_kern.h).
 *
 * Weight layout.  The kernels keep one output row per vector lane: they
 * read weights 16 rows at a time, interleaved (TENSOR_Q8X16): per group of
 * 16 rows (the last padded with zero rows) and block b, the 16 f16 scales
 * d (MXFP4: 16 e8m0 bytes; Q4_1, Q5_1: then the 16 f16 m; Q5_x: then the 16 rows' fifth bits,
 * 4 bytes each, spread by qmm_q5_spread), then the codes in 4-byte runs,
 * run j of rows 0..15 at j * 64 — Q4_x, Q5_x, IQ4_NL, MXFP4: run j (0..3) is bytes 4j ..
 * 4j+3 of the block's qs (low nibbles: codes 4j.., high: codes 16 + 4j..);
 * Q8_0: run j (0..7) is codes 4j .. 4j+3.  A group of 16 rows takes
 * exactly 16 rows' bytes.  place_weights repacks to it (when the activations are q8); a
 * tensor still in rows is repacked group by group into the thread's
 * scratch as the matmul goes (tests, the strict backend's copies). */
#ifndef KVLLM_QMM_H
#define KVLLM_QMM_H

#include "backend/cpu/cpu_internal.h"
#include <float.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QMM_BLK 32
#define QMM_IL 16           /* rows interleaved */
#define QMM_QK 256          /* K-quant super-block (qmm_k.c) */

/* K-quants (Q2_K .. Q6_K) and IQ4_XS on the integer path: see qmm_k.c for
 * their activation rows (Q8_K-style, one scale per 256), arithmetic and
 * layout. */
static inline bool qmm_is_k(uint32_t type) {
    return type == DTYPE_Q4_K || type == DTYPE_Q5_K || type == DTYPE_Q6_K || type == DTYPE_Q2_K ||
           type == DTYPE_Q3_K || type == DTYPE_IQ4_XS;
}
/* Whether type's activation rows are the K-quants' (qmm_k.c: one scale per
 * 256) rather than the 32-block ones: IQ4_XS, a super-block type, takes
 * activations per 32 (its sub-block), which keeps the activations' rounding
 * as fine as IQ4_NL's. */
static inline bool qmm_act_k(uint32_t type) { return qmm_is_k(type) && type != DTYPE_IQ4_XS; }
/* Bytes of one super-block of a 16-row group (qmm_k.c's layouts). */
static inline size_t qmm_gblock_bytes_k(uint32_t type) {
    switch (type) {
    case DTYPE_Q2_K: return 1344;
    case DTYPE_Q3_K: return 1824;
    case DTYPE_Q4_K: return 2368;
    case DTYPE_Q5_K: return 2880;
    case DTYPE_IQ4_XS: return 2208;
    default: return 3360;   /* Q6_K */
    }
}

/* The 32-element block types' layout, as constants once type is (the
 * kernels inline them): whether a block has an offset m (f16 after d) or a
 * fifth code bit (qh, 4 bytes after d and m); whether its nibbles index a
 * table of values (IQ4_NL, MXFP4: qmm_nl_values) and its scale is MXFP4's
 * one e8m0 byte rather than an f16; its bytes; the code offset its w
 * subtracts; in a 16-row group's block (above), the bytes of the 16 scales,
 * where the spread fifth bits and where the code runs begin. */
static inline bool qmm_has_m(uint32_t t) { return t == DTYPE_Q4_1 || t == DTYPE_Q5_1; }
static inline bool qmm_is_q5(uint32_t t) { return t == DTYPE_Q5_0 || t == DTYPE_Q5_1; }
static inline bool qmm_is_nl(uint32_t t) { return t == DTYPE_IQ4_NL || t == DTYPE_MXFP4; }
static inline bool qmm_e8m0(uint32_t t) { return t == DTYPE_MXFP4; }
static inline size_t qmm_blk_bytes(uint32_t t) {
    return t == DTYPE_Q8_0 ? 34 : t == DTYPE_MXFP4 ? 17 : 18 + 2 * (size_t)qmm_has_m(t) + 4 * (size_t)qmm_is_q5(t);
}
static inline const int8_t *qmm_nl_values(uint32_t t) { return t == DTYPE_MXFP4 ? kvalues_mxfp4 : kvalues_iq4nl; }
static inline int qmm_zero(uint32_t t) { return t == DTYPE_Q4_0 ? 8 : t == DTYPE_Q5_0 ? 16 : 0; }
static inline size_t qmm_gscale_bytes(uint32_t t) { return qmm_e8m0(t) ? 16 : 32; }
static inline size_t qmm_gqh_off(uint32_t t) { return qmm_gscale_bytes(t) + 32 * (size_t)qmm_has_m(t); }
static inline size_t qmm_gcode_off(uint32_t t) { return qmm_gqh_off(t) + 64 * (size_t)qmm_is_q5(t); }

/* A Q5 block's qh (bit e: fifth bit of code e) rearranged so that each
 * code run's bits sit in its own byte: byte k, bit r holds code 4r + k's
 * (run r, low nibble k) and bit 4 + r code 16 + 4r + k's (run r, high
 * nibble k).  A kernel then moves run r's bits to bit 4 of each code byte
 * with one shift and mask (left 4 - r, right r).  qmm_q5_gather undoes it. */
static inline uint32_t qmm_q5_spread(uint32_t qh) {
    uint32_t s = 0;
    for (int k = 0; k < 4; k++)
        for (int r = 0; r < 4; r++)
            s |= ((qh >> (4 * r + k)) & 1) << (8 * k + r) | ((qh >> (16 + 4 * r + k)) & 1) << (8 * k + 4 + r);
    return s;
}
static inline uint32_t qmm_q5_gather(uint32_t s) {
    uint32_t qh = 0;
    for (int k = 0; k < 4; k++)
        for (int r = 0; r < 4; r++)
            qh |= ((s >> (8 * k + r)) & 1) << (4 * r + k) | ((s >> (8 * k + 4 + r)) & 1) << (16 + 4 * r + k);
    return qh;
}

/* Whether the integer path takes weights of type with rows of K. */
bool qmm_supports(uint32_t type, int64_t K);

/* The code sum xs of a block as the 32-block kernels of weights of type t
 * take it: Q4_1 and Q5_1 add their offset's term with it as an f32 (exact:
 * |xs| <= 32 * 127); vpdpbusd's products of unsigned weights start from
 * -128 xs for the signed ones (Q8_0, IQ4_NL, MXFP4, IQ4_XS: w ^ 0x80 = w +
 * 128) and from -zero xs for Q4_0's and Q5_0's codes (int32). */
static inline int32_t qmm_act_sum_factor(uint32_t t) {
    return t == DTYPE_Q8_0 || qmm_is_nl(t) || t == DTYPE_IQ4_XS ? -128 : -qmm_zero(t);
}

/* Bytes of one quantized activation row of K (K codes, K / 32 f32 dx, K /
 * 32 xs in the weight type's form, qmm_act_sum_factor; 64-byte multiple).
 * The context sizes its act_buf with it. */
size_t qmm_act_row_bytes(int64_t K);

/* The inverse scale of a block whose largest |x| is amax, for codes up to
 * qmax: 0 for an all-zero block, and for one so small (amax < qmax /
 * FLT_MAX, subnormal values) that the division overflows — its codes are
 * then 0, where an infinite inverse would make them undefined. */
static inline float qmm_inv_scale(float qmax, float amax) {
    const float id = amax > 0 ? qmax / amax : 0.0f;
    return id <= FLT_MAX ? id : 0.0f;
}

/* Quantize x (K, a multiple of 32) into codes q (K), scales d and code sums
 * xs (K / 32 each). */
void qmm_quantize_row(const float *x, int64_t K, int8_t *q, float *d, int32_t *xs);

/* The K-quant counterparts (qmm_k.c; K a multiple of 256): activations
 * quantized per 256 with the code sums per 16 and per 32, and the reference
 * dot product defined there; IQ4_XS's, on 32-block activation rows. */
void qmm_quantize_row_k(const float *x, int64_t K, int8_t *q, float *d, int16_t *xs16, int16_t *xs32);
float qmm_ref_dot_k(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, const int16_t *xs16,
                    const int16_t *xs32, int64_t K);
float qmm_ref_dot_iq4_xs(const uint8_t *w, const int8_t *xq, const float *xd, int64_t K);

/* Any type the path takes, on one activation row as the driver lays it out
 * (qmm_act_row_bytes(K) bytes; the K-quant form for K-quant weights). */
void qmm_quantize_act(uint32_t type, const float *x, int64_t K, uint8_t *row);
float qmm_ref_dot_act(uint32_t type, const uint8_t *w, const uint8_t *row, int64_t K);

/* Bytes of one 16-row group per block (32 elements; K-quants: 256) and of a
 * whole group of rows of K. */
size_t qmm_gblock_bytes(uint32_t type);
size_t qmm_group_bytes(uint32_t type, int64_t K);
/* qmm_k.c's halves of pack and unpack for one group (rows-layout rows at w,
 * rb apart, nr <= 16 of them; the rest zero) and one row i of a group g. */
void qmm_pack_group_k(uint32_t type, const uint8_t *w, size_t rb, int64_t K, int nr, uint8_t *dst);
void qmm_unpack_row_k(uint32_t type, const uint8_t *g, int i, int64_t K, uint8_t *dst);

/* Bytes of t in TENSOR_Q8X16 (whole groups); pack t's rows there.  Unpack
 * row r of a packed tensor back to its rows-layout bytes (row_bytes). */
size_t qmm_packed_bytes(const struct tensor *t);
void qmm_pack(const struct tensor *t, uint8_t *dst);
void qmm_unpack_row(const struct tensor *t, int64_t r, uint8_t *dst);

/* A matmul's operands as the kernels see them. */
struct qmm_job {
    float *y;                 /* (n, M) */
    size_t ys;                /* M */
    uint32_t type;
    int64_t K;
    const uint8_t *act;       /* n quantized rows, astride bytes apart: codes (K), dx, xs (K / 32 each);
                                 K-quants: codes (K), dx (K / 256), xs16 (K / 16), xs32 (K / 32) */
    size_t astride;
    int n;
};

/* One group of 16 interleaved rows (g: its packed bytes, K / 32 blocks),
 * for all the job's tokens: rows r0 .. r0 + nr - 1 of y (nr <= 16; the
 * group's other rows are padding, not stored).  One per kernel set. */
typedef void qmm_group_fn(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr);
qmm_group_fn qmm_group_scalar;   /* qmm.h's arithmetic, plainly (tests) */
qmm_group_fn qmm_group_avx2;     /* matmul_q8_avx2.c: -mavx2 -mfma -mf16c */
qmm_group_fn qmm_group_avxvnni;  /* matmul_q8_avxvnni.c: + -mavxvnni (256-bit vpdpbusd) */
qmm_group_fn qmm_group_avx512;   /* matmul_q8_avx512.c: AVX-512 F/BW/VL + VNNI (512-bit vpdpbusd) */
qmm_group_fn qmm_group_amx;      /* matmul_q8_amx.c: AMX-INT8 tiles (+ the avx512 set's flags); call only
                                    after cpu_amx_permit() returned 0 (cpu_features.h) */
qmm_group_fn qmm_group_amx_emu;  /* matmul_q8_amx_emu.c: the same kernel on amx_emu.c's emulated tiles (tests) */

/* Run the matmul with kernel fn: quantize x into the context's act_buf
 * (KVLLM_ERANGE, logged, if n rows of w->ne0 do not fit: the context was
 * sized for fewer), then groups of rows over the thread pool. */
int qmm_matmul(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n, qmm_group_fn *fn);

/* The logits' matrix (TENSOR_F_F32_ACT: 8-bit activation codes decide
 * near-ties of the top token) in Q8_0 on the avx512 and amx sets: the same
 * model as above with 16-bit codes.  Per block of 32, dx = amax / 32767,
 * code = round-half-even(x * (32767 / amax)) (all-zero block, or 32767 /
 * amax overflowing: codes 0, qmm_inv_scale); per (row, token) acc = 0 and
 * in block order P = Σ w · code exactly in int32 (|P| <= 32 * 128 * 32767 <
 * 2^31), acc = fma((float)P, dw * dx, acc).
 * A code's rounding is half a step of amax / 32767: the logits come out as
 * near the f32 path's as the f32 activations left them, while the weights
 * are read in the interleaved layout at the integer path's pace (the f32
 * path turns each weight into a float, 4x the work: a decode step of Gemma 3
 * 270M spent 60 % of its time there).  qmm16_ref_dot is the definition;
 * the kernel equals it bit for bit.  An activation row: K int16 codes, then
 * K / 32 f32 dx (qmm16_act_row_bytes). */
#define QMM16_MAX 32767.0f
size_t qmm16_act_row_bytes(int64_t K);
void qmm16_quantize_row(const float *x, int64_t K, uint8_t *row);
float qmm16_ref_dot(const uint8_t *w, const uint8_t *row, int64_t K);   /* w: one Q8_0 row in rows layout */
/* qmm_quantize_row and qmm16_quantize_row with AVX-512 (act_avx512.c): the
 * same bits for finite x, used by the avx512 and amx sets. */
void qmm_quantize_row_avx512(const float *x, int64_t K, int8_t *q, float *d, int32_t *xs);
void qmm16_quantize_row_avx512(const float *x, int64_t K, uint8_t *row);
bool cpu_act_avx512_built(void);
/* Whether the 16-bit path is the one for t (Q8_0 marked TENSOR_F_F32_ACT). */
bool qmm16_takes(const struct tensor *t);
qmm_group_fn qmm16_group_avx512;   /* matmul_q16_avx512.c: AVX-512 VNNI (512-bit vpdpwssd) */
bool cpu_q16_avx512_built(void);
/* qmm_matmul with the 16-bit activation rows (fn: a qmm16 group kernel). */
int qmm16_matmul(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n, qmm_group_fn *fn);

/* backend_ops.matmul of the SIMD kernel sets: the integer path, with the
 * backend's group kernel (struct cpu_backend.qrows, chosen at creation), for
 * the types it takes (not the logits' matrix, tensor.h) when the context's act is ACT_Q8 (and always for a
 * TENSOR_Q8X16 tensor); otherwise the AVX2 f32 matmul. */
int cpu_matmul_simd(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n);
/* backend_ops.matmuls of every CPU set: the matrices of one type and K that
 * cpu_matmul_simd gives to qmm_matmul share one quantization of x and one
 * dispatch of their groups (each output is still one group kernel call's on
 * the same activation row: the separate matmuls' bits); any other matrix
 * takes the set's matmul alone. */
int cpu_matmuls(struct backend_ctx *c, const struct matmuls_args *a);
/* backend_ops.matmul of the avx512 set (matmul_avx512.c): F32 / F16 / BF16
 * weights in rows layout by its 16-lane f32 kernel (arithmetic stated
 * there; batch-invariant), everything else by cpu_matmul_simd.  Needs
 * scratch_cols >= CPU_MM_ROWS * ne0.  cpu_mm_avx512_built: whether this
 * build has that kernel (otherwise it is cpu_matmul_simd). */
int cpu_matmul_avx512(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n);
bool cpu_mm_avx512_built(void);
/* backend_ops.get_rows of the SIMD sets: TENSOR_Q8X16 rows unpacked, others
 * as the scalar op. */
int cpu_get_rows_simd(struct backend_ctx *c, float *y, const struct tensor *w, const int32_t *ids, int n);
/* backend_ops.place_weights with ACT_Q8: the integer path's types repacked
 * to TENSOR_Q8X16 in one allocation the backend owns (freed with it). */
int cpu_place_weights_q8(struct backend *be, struct tensor *const *ts, int n, const struct place_copied *copied,
                         uint64_t *placed);

#endif
