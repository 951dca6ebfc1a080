/* qmm.c — the 8-bit integer matmul's plain-C parts (see qmm.h): activation
 * quantization (shared by every kernel set, so all see the same codes), the
 * reference arithmetic, and the driver that quantizes, then hands row
 * chunks to a kernel set over the thread pool. */
#include "backend/cpu/qmm.h"
#include "backend/cpu/cpu_features.h"
#include "core/core.h"

#include <math.h>
#include <string.h>

bool qmm_supports(uint32_t type, int64_t K) {
    return (type == DTYPE_Q8_0 || type == DTYPE_Q4_0 || type == DTYPE_Q4_1) && K > 0 && K % QMM_BLK == 0;
}

size_t qmm_act_row_bytes(int64_t K) {
    return ((size_t)K + (size_t)(K / QMM_BLK) * sizeof(float) + 63) & ~(size_t)63;
}

/* Round to nearest, ties to even, for |v| < 2^22 (the default rounding
 * mode; adding and removing 1.5 * 2^23 is exact apart from that rounding,
 * and vectorizes, where nearbyintf is a call). */
static inline float rne(float v) { return (v + 12582912.0f) - 12582912.0f; }

void qmm_quantize_row(const float *x, int64_t K, int8_t *q, float *d) {
    for (int64_t b = 0; b < K / QMM_BLK; b++) {
        const float *xb = x + b * QMM_BLK;
        float amax = 0;
        for (int i = 0; i < QMM_BLK; i++) {
            const float a = fabsf(xb[i]);
            amax = a > amax ? a : amax;
        }
        const float id = amax > 0 ? 127.0f / amax : 0.0f;
        d[b] = amax / 127.0f;
        for (int i = 0; i < QMM_BLK; i++) q[b * QMM_BLK + i] = (int8_t)(int)rne(xb[i] * id);
    }
}

/* ---- the reference ---- */

/* Weight code i (0..31) of block blk, as qmm.h defines w. */
static int wcode(uint32_t type, const uint8_t *blk, int i) {
    if (type == DTYPE_Q8_0) return ((const struct block_q8_0 *)(const void *)blk)->qs[i];
    const uint8_t *qs = type == DTYPE_Q4_0 ? ((const struct block_q4_0 *)(const void *)blk)->qs
                                           : ((const struct block_q4_1 *)(const void *)blk)->qs;
    const int nib = i < 16 ? qs[i] & 0xf : qs[i - 16] >> 4;
    return type == DTYPE_Q4_0 ? nib - 8 : nib;
}

static size_t wblock_bytes(uint32_t type) {
    return type == DTYPE_Q8_0 ? sizeof(struct block_q8_0)
         : type == DTYPE_Q4_0 ? sizeof(struct block_q4_0) : sizeof(struct block_q4_1);
}

float qmm_ref_dot(uint32_t type, const uint8_t *w, const int8_t *xq, const float *xd, int64_t K) {
    float acc[8] = { 0 };
    const size_t bb = wblock_bytes(type);
    for (int64_t b = 0; b < K / QMM_BLK; b++) {
        const uint8_t *blk = w + (size_t)b * bb;
        const int8_t *xb = xq + b * QMM_BLK;
        uint16_t dh, mh;
        memcpy(&dh, blk, 2);                    /* d leads every block */
        const float s = f16_to_f32(dh) * xd[b];
        for (int l = 0; l < 8; l++) {
            int p = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++) p += wcode(type, blk, i) * xb[i];
            acc[l] = fmaf((float)p, s, acc[l]);
        }
        if (type == DTYPE_Q4_1) {
            memcpy(&mh, blk + 2, 2);
            const float c = f16_to_f32(mh) * xd[b];
            for (int l = 0; l < 8; l++) {
                const int xs = xb[4 * l] + xb[4 * l + 1] + xb[4 * l + 2] + xb[4 * l + 3];
                acc[l] = fmaf((float)xs, c, acc[l]);
            }
        }
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void qmm_rows_scalar(const struct qmm_job *j, int64_t r0, int nr) {
    for (int t = 0; t < j->n; t++) {
        const int8_t *xq = (const int8_t *)(const void *)(j->act + (size_t)t * j->astride);
        const float *xd = (const float *)(const void *)(xq + j->K);
        for (int r = 0; r < nr; r++)
            j->y[(size_t)t * j->ys + (size_t)(r0 + r)] =
                qmm_ref_dot(j->type, j->w + (size_t)(r0 + r) * j->wstride, xq, xd, j->K);
    }
}

/* ---- the driver ---- */

struct qmm_run {
    struct qmm_job j;
    const float *x;           /* (n, K) */
    qmm_rows_fn *rows;
};

static void quant_chunk(void *arg, long t, int ith) {
    (void)ith;
    const struct qmm_run *q = arg;
    int8_t *codes = (int8_t *)(void *)((uint8_t *)(uintptr_t)q->j.act + (size_t)t * q->j.astride);
    qmm_quantize_row(q->x + (size_t)t * (size_t)q->j.K, q->j.K, codes, (float *)(void *)(codes + q->j.K));
}

#define QMM_RB 16   /* rows per chunk of work (even: the AVX-512 kernels pair rows) */

static void rows_chunk(void *arg, long u, int ith) {
    (void)ith;
    const struct qmm_run *q = arg;
    const int64_t M = (int64_t)q->j.ys, r0 = (int64_t)u * QMM_RB;
    q->rows(&q->j, r0, (int)(M - r0 < QMM_RB ? M - r0 : QMM_RB));
}

int qmm_matmul(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n, qmm_rows_fn *rows) {
    struct cpu_ctx *cc = cpu_ctx_of(c);
    const size_t astride = qmm_act_row_bytes(w->ne0);
    if (n < 0 || (size_t)n * astride > cc->act_buf_bytes) {   /* sized at creation for the largest step */
        LOG_ERR("integer matmul of %d rows of %lld: the context was sized for fewer", n, (long long)w->ne0);
        return KVLLM_ERANGE;
    }
    struct qmm_run q = { { y, (size_t)w->ne1, w->data, w->row_bytes, w->type, w->ne0, cc->act_buf, astride, n },
                         x, rows };
    if (n <= 4) for (int t = 0; t < n; t++) quant_chunk(&q, t, 0);   /* cheaper than waking the threads */
    else threadpool_run_chunks(cc->pool, n, quant_chunk, &q);
    threadpool_run_chunks(cc->pool, (w->ne1 + QMM_RB - 1) / QMM_RB, rows_chunk, &q);
    return 0;
}

int cpu_matmul_simd(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n) {
    struct cpu_ctx *cc = cpu_ctx_of(c);
    const struct cpu_backend *b = cpu_backend_of(c->be);
    if (cc->act == ACT_Q8 && b->qrows && qmm_supports(w->type, w->ne0)) return qmm_matmul(c, y, w, x, n, b->qrows);
    return cpu_matmul_avx2(c, y, w, x, n);
}
