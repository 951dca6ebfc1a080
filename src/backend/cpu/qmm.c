/* qmm.c — the 8-bit integer matmul's plain-C parts (see qmm.h): activation
 * quantization (shared by every kernel set, so all see the same codes), the
 * reference arithmetic, the 16-row interleaved layout (pack, unpack, the
 * placement), and the driver that quantizes, then hands groups of rows to
 * a kernel set over the thread pool. */
#include "backend/cpu/qmm.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_ops.h"
#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

bool qmm_supports(uint32_t type, int64_t K) {
    if (qmm_is_k(type)) return K > 0 && K % QMM_QK == 0;
    return (type == DTYPE_Q8_0 || type == DTYPE_Q4_0 || type == DTYPE_Q4_1 || qmm_is_q5(type) || qmm_is_nl(type)) &&
           K > 0 && K % QMM_BLK == 0;
}

/* The K-quant row (K + K / 64 + K / 8 + K / 16 bytes) fits in this too. */
/* Whether the 8-bit path takes tensor t: its type and row length, and not
 * the matrices tensor.h's TENSOR_F_F32_ACT marks stay with f32 activations,
 * nor those TENSOR_F_FINE_ACT marks whose activation rows would be scaled
 * per 256 (the K-quants'). */
static bool q8_takes(const struct tensor *t) {
    if (t->flags & TENSOR_F_F32_ACT) return false;
    if ((t->flags & TENSOR_F_FINE_ACT) && qmm_act_k(t->type)) return false;
    return qmm_supports(t->type, t->ne0);
}

size_t qmm_act_row_bytes(int64_t K) {
    return ((size_t)K + (size_t)(K / QMM_BLK) * 8 + 63) & ~(size_t)63;
}

/* Round to nearest, ties to even, for |v| < 2^22 (the default rounding
 * mode; adding and removing 1.5 * 2^23 is exact apart from that rounding,
 * and vectorizes, where nearbyintf is a call). */
static inline float rne(float v) { return (v + 12582912.0f) - 12582912.0f; }

/* The largest |x| of a block of 32 (a NaN is passed over). */
static float block_amax(const float *xb) {
    float amax = 0;
    for (int i = 0; i < QMM_BLK; i++) {
        const float a = fabsf(xb[i]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

void qmm_quantize_row(const float *x, int64_t K, int8_t *q, float *d, int32_t *xs) {
    for (int64_t b = 0; b < K / QMM_BLK; b++) {
        const float *xb = x + b * QMM_BLK;
        const float amax = block_amax(xb);
        const float id = qmm_inv_scale(127.0f, amax);
        d[b] = amax / 127.0f;
        int32_t s = 0;
        for (int i = 0; i < QMM_BLK; i++) {
            const int8_t c = (int8_t)(int)rne(xb[i] * id);
            q[b * QMM_BLK + i] = c;
            s += c;
        }
        xs[b] = s;
    }
}

/* The pointers into one activation row of K (qmm.h, qmm_k.c): xs and xsf
 * are the same K / 32 sums, int32 or (Q4_1, Q5_1) f32 (qmm_act_sum_factor). */
struct act_row { int8_t *q; float *d; int32_t *xs; float *xsf; int16_t *xs16, *xs32; };

static struct act_row act_row_at(uint32_t type, uint8_t *row, int64_t K) {
    struct act_row a = { .q = (int8_t *)row, .d = (float *)(void *)(row + K) };
    if (qmm_act_k(type)) {
        a.xs16 = (int16_t *)(void *)(a.d + K / QMM_QK);
        a.xs32 = a.xs16 + K / 16;
    } else {
        a.xs = (int32_t *)(void *)(a.d + K / QMM_BLK);
        a.xsf = a.d + K / QMM_BLK;
    }
    return a;
}

/* The code sums a quantizer wrote, in the form type's kernels take them (qmm_act_sum_factor). */
static void sums_for(uint32_t type, const struct act_row *a, int64_t K) {
    const int32_t f = qmm_act_sum_factor(type);
    for (int64_t b = 0; b < K / QMM_BLK; b++) {
        int32_t s;
        memcpy(&s, a->xs + b, sizeof s);
        if (qmm_has_m(type)) a->xsf[b] = (float)s;
        else a->xs[b] = f * s;
    }
}

void qmm_quantize_act(uint32_t type, const float *x, int64_t K, uint8_t *row) {
    const struct act_row a = act_row_at(type, row, K);
    if (qmm_act_k(type)) {
        qmm_quantize_row_k(x, K, a.q, a.d, a.xs16, a.xs32);
        return;
    }
    qmm_quantize_row(x, K, a.q, a.d, a.xs);
    sums_for(type, &a, K);
}

/* ---- the reference ---- */

static size_t wblock_bytes(uint32_t type) { return qmm_blk_bytes(type); }

/* Weight code i (0..31) of block blk, as qmm.h defines w. */
static int wcode(uint32_t type, const uint8_t *blk, int i) {
    if (type == DTYPE_Q8_0) return ((const struct block_q8_0 *)(const void *)blk)->qs[i];
    const uint8_t *qs = blk + qmm_blk_bytes(type) - 16;   /* the nibbles end every block */
    int q = i < 16 ? qs[i] & 0xf : qs[i - 16] >> 4;
    if (qmm_is_nl(type)) return qmm_nl_values(type)[q];
    if (qmm_is_q5(type)) q |= (blk[(qmm_has_m(type) ? 4 : 2) + i / 8] >> (i % 8) & 1) << 4;
    return q - qmm_zero(type);
}

/* qmm_ref_dot: one weight row (type, K elements, in rows layout) times one
 * quantized activation row, with exactly the arithmetic of qmm.h. */
static float ref_dot(uint32_t type, const uint8_t *w, const struct act_row *a, int64_t K) {
    const int8_t *xq = a->q;
    const float *xd = a->d;
    float acc = 0;
    const size_t bb = wblock_bytes(type);
    for (int64_t b = 0; b < K / QMM_BLK; b++) {
        const uint8_t *blk = w + (size_t)b * bb;
        uint16_t dh, mh;
        memcpy(&dh, blk, 2);                    /* d leads every block (MXFP4: e) */
        int32_t p = 0;
        for (int i = 0; i < QMM_BLK; i++) p += wcode(type, blk, i) * xq[b * QMM_BLK + i];
        acc = fmaf((float)p, (qmm_e8m0(type) ? e8m0_half_to_f32(blk[0]) : f16_to_f32(dh)) * xd[b], acc);
        if (qmm_has_m(type)) {
            memcpy(&mh, blk + 2, 2);
            acc = fmaf(a->xsf[b], f16_to_f32(mh) * xd[b], acc);
        }
    }
    return acc;
}

float qmm_ref_dot_act(uint32_t type, const uint8_t *w, const uint8_t *row, int64_t K) {
    const struct act_row a = act_row_at(type, (uint8_t *)(uintptr_t)row, K);
    if (type == DTYPE_IQ4_XS) return qmm_ref_dot_iq4_xs(w, a.q, a.d, K);
    if (qmm_is_k(type)) return qmm_ref_dot_k(type, w, a.q, a.d, a.xs16, a.xs32, K);
    return ref_dot(type, w, &a, K);
}

/* ---- 16-bit activations (qmm.h: the logits' matrix) ---- */

size_t qmm16_act_row_bytes(int64_t K) {
    return ((size_t)K * 2 + (size_t)(K / QMM_BLK) * 4 + 63) & ~(size_t)63;
}

void qmm16_quantize_row(const float *x, int64_t K, uint8_t *row) {
    int16_t *q = (int16_t *)(void *)row;
    float *d = (float *)(void *)(row + 2 * K);
    for (int64_t b = 0; b < K / QMM_BLK; b++) {
        const float *xb = x + b * QMM_BLK;
        const float amax = block_amax(xb);
        const float id = qmm_inv_scale(QMM16_MAX, amax);
        d[b] = amax / QMM16_MAX;
        for (int i = 0; i < QMM_BLK; i++) q[b * QMM_BLK + i] = (int16_t)rne(xb[i] * id);
    }
}

float qmm16_ref_dot(const uint8_t *w, const uint8_t *row, int64_t K) {
    const int16_t *q = (const int16_t *)(const void *)row;
    const float *d = (const float *)(const void *)(row + 2 * K);
    float acc = 0;
    for (int64_t b = 0; b < K / QMM_BLK; b++) {
        const struct block_q8_0 *blk = (const struct block_q8_0 *)(const void *)(w + (size_t)b * sizeof *blk);
        int32_t p = 0;
        for (int i = 0; i < QMM_BLK; i++) p += blk->qs[i] * q[b * QMM_BLK + i];
        acc = fmaf((float)p, f16_to_f32(blk->d) * d[b], acc);
    }
    return acc;
}

bool qmm16_takes(const struct tensor *t) {
    return t->type == DTYPE_Q8_0 && (t->flags & TENSOR_F_F32_ACT) && t->ne0 % QMM_BLK == 0;
}

/* ---- the interleaved layout ---- */

/* Bytes of one block of a 16-row group: the scales, then the codes (the
 * K-quants' super-blocks: qmm_k.c). */
size_t qmm_gblock_bytes(uint32_t type) {
    return qmm_is_k(type) ? qmm_gblock_bytes_k(type) : QMM_IL * wblock_bytes(type);
}
static size_t gblock_bytes(uint32_t type) { return qmm_gblock_bytes(type); }

size_t qmm_group_bytes(uint32_t type, int64_t K) {
    return (size_t)(K / (qmm_is_k(type) ? QMM_QK : QMM_BLK)) * qmm_gblock_bytes(type);
}

size_t qmm_packed_bytes(const struct tensor *t) {
    return (size_t)((t->ne1 + QMM_IL - 1) / QMM_IL) * qmm_group_bytes(t->type, t->ne0);
}

/* Pack rows [r0, r0 + nr) (nr <= 16; the rest zero) of rows-layout weights
 * w (row_bytes rb) into one group at dst. */
static void pack_group(uint32_t type, const uint8_t *w, size_t rb, int64_t K, int nr, uint8_t *dst) {
    if (qmm_is_k(type)) {
        qmm_pack_group_k(type, w, rb, K, nr, dst);
        return;
    }
    const size_t bb = wblock_bytes(type), gb = gblock_bytes(type), sb = qmm_gcode_off(type);
    const size_t qoff = type == DTYPE_Q8_0 ? 2 : bb - 16;   /* the codes end every block */
    const int runs = type == DTYPE_Q8_0 ? 8 : 4;
    memset(dst, 0, (size_t)(K / QMM_BLK) * gb);
    for (int64_t b = 0; b < K / QMM_BLK; b++) {
        uint8_t *g = dst + (size_t)b * gb;
        for (int i = 0; i < nr; i++) {
            const uint8_t *blk = w + (size_t)i * rb + (size_t)b * bb;
            memcpy(g + (qmm_gscale_bytes(type) / 16) * i, blk, qmm_gscale_bytes(type) / 16);
            if (qmm_has_m(type)) memcpy(g + 32 + 2 * i, blk + 2, 2);
            if (qmm_is_q5(type)) {
                uint32_t qh;
                memcpy(&qh, blk + qoff - 4, 4);
                qh = qmm_q5_spread(qh);
                memcpy(g + qmm_gqh_off(type) + 4 * (size_t)i, &qh, 4);
            }
            for (int j = 0; j < runs; j++) memcpy(g + sb + (size_t)j * 64 + 4 * (size_t)i, blk + qoff + 4 * j, 4);
        }
    }
}

void qmm_pack(const struct tensor *t, uint8_t *dst) {
    const size_t grp = qmm_group_bytes(t->type, t->ne0);
    for (int64_t r0 = 0; r0 < t->ne1; r0 += QMM_IL)
        pack_group(t->type, (const uint8_t *)t->data + (size_t)r0 * t->row_bytes, t->row_bytes, t->ne0,
                   (int)(t->ne1 - r0 < QMM_IL ? t->ne1 - r0 : QMM_IL), dst + (size_t)(r0 / QMM_IL) * grp);
}

void qmm_unpack_row(const struct tensor *t, int64_t r, uint8_t *dst) {
    const uint32_t type = t->type;
    if (qmm_is_k(type)) {
        qmm_unpack_row_k(type, (const uint8_t *)t->data + (size_t)(r / QMM_IL) * qmm_group_bytes(type, t->ne0),
                         (int)(r % QMM_IL), t->ne0, dst);
        return;
    }
    const size_t bb = wblock_bytes(type), gb = gblock_bytes(type), sb = qmm_gcode_off(type);
    const size_t qoff = type == DTYPE_Q8_0 ? 2 : bb - 16;
    const int runs = type == DTYPE_Q8_0 ? 8 : 4, i = (int)(r % QMM_IL);
    const uint8_t *grp = (const uint8_t *)t->data + (size_t)(r / QMM_IL) * QMM_IL * t->row_bytes;
    for (int64_t b = 0; b < t->ne0 / QMM_BLK; b++) {
        const uint8_t *g = grp + (size_t)b * gb;
        uint8_t *blk = dst + (size_t)b * bb;
        memcpy(blk, g + (qmm_gscale_bytes(type) / 16) * i, qmm_gscale_bytes(type) / 16);
        if (qmm_has_m(type)) memcpy(blk + 2, g + 32 + 2 * i, 2);
        if (qmm_is_q5(type)) {
            uint32_t qh;
            memcpy(&qh, g + qmm_gqh_off(type) + 4 * (size_t)i, 4);
            qh = qmm_q5_gather(qh);
            memcpy(blk + qoff - 4, &qh, 4);
        }
        for (int j = 0; j < runs; j++) memcpy(blk + qoff + 4 * j, g + sb + (size_t)j * 64 + 4 * (size_t)i, 4);
    }
}

void qmm_group_scalar(const struct qmm_job *j, const uint8_t *g, int64_t r0, int nr) {
    const size_t rb = qmm_is_k(j->type) ? (size_t)(j->K / QMM_QK) * dtype_block_bytes(j->type)
                                        : (size_t)(j->K / QMM_BLK) * wblock_bytes(j->type);
    const struct tensor t = { .type = j->type, .ne0 = j->K, .ne1 = QMM_IL, .row_bytes = rb, .data = g,
                              .layout = TENSOR_Q8X16 };
    uint8_t row[(4096 + 1024) / 32 * sizeof(struct block_q8_0)];
    KV_ASSERT(rb <= sizeof row);   /* the test shapes */
    for (int i = 0; i < nr; i++) {
        qmm_unpack_row(&t, i, row);
        for (int tk = 0; tk < j->n; tk++)
            j->y[(size_t)tk * j->ys + (size_t)(r0 + i)] =
                qmm_ref_dot_act(j->type, row, j->act + (size_t)tk * j->astride, j->K);
    }
}

/* ---- the driver ---- */

/* One call's work: k matrices of one type and K, read by the same n
 * activation rows; their groups of 16 rows are numbered one after another
 * (matrix i's end at g_end[i]) and cut into chunks for the pool. */
struct qmm_run {
    struct qmm_job j;         /* y and ys: the first matrix's (group_chunk sets each matrix's) */
    const struct tensor *const *w;
    float *const *y;
    int k;
    int64_t g_end[BACKEND_MATMULS_MAX];
    const float *x;           /* (n, K) */
    qmm_group_fn *fn;
    struct cpu_ctx *cc;
    int64_t groups, chunks;   /* groups of 16 rows in all; chunks of work, each about groups / chunks of them */
    bool q16;                 /* 16-bit activation rows (qmm16_matmul) */
};

static void quant_row(const struct qmm_run *q, long t) {
    const int64_t K = q->j.K;
    const float *x = q->x + (size_t)t * (size_t)K;
    uint8_t *row = (uint8_t *)(uintptr_t)q->j.act + (size_t)t * q->j.astride;
    const bool simd = cpu_backend_of(q->cc->base.be)->act512;
    if (q->q16) {
        if (simd) qmm16_quantize_row_avx512(x, K, row);
        else qmm16_quantize_row(x, K, row);
    } else if (simd && !qmm_act_k(q->j.type)) {
        const struct act_row a = act_row_at(q->j.type, row, K);
        qmm_quantize_row_avx512(x, K, a.q, a.d, a.xs);
        sums_for(q->j.type, &a, K);
    } else {
        qmm_quantize_act(q->j.type, x, K, row);
    }
}

/* Tokens per chunk of the quantization: a row is a few hundred nanoseconds of work, about what
 * claiming a chunk costs when two cores take turns at the counter's cache line */
#define QMM_QUANT_ROWS 8

static void quant_chunk(void *arg, long c, int ith) {
    (void)ith;
    const struct qmm_run *q = arg;
    const long t1 = (c + 1) * QMM_QUANT_ROWS < q->j.n ? (c + 1) * QMM_QUANT_ROWS : q->j.n;
    for (long t = c * QMM_QUANT_ROWS; t < t1; t++) quant_row(q, t);
}

/* Cache blocking of the placed (TENSOR_Q8X16) case: a thread's chunk is
 * several groups whose packed weights fit in about QMM_CHUNK_W bytes, swept
 * QMM_TB tokens at a time (a token block's activation rows, at most ~6 KB
 * each, stay in L2 while every group of the chunk passes over them).  Without
 * it each 16-row group streamed all n activation rows from L3 (ffn_down of a
 * 1.1B model at 512 tokens: 3 MB per group).  Only the order of work
 * changes: every output is still one group kernel call's, with the
 * arithmetic qmm.h defines, so the results are bit-identical. */
#define QMM_CHUNK_W (192u << 10)
#define QMM_TB 64

/* Groups [g0, g1) of matrix i. */
static void matrix_groups(const struct qmm_run *q, int i, int64_t g0, int64_t g1, int ith) {
    const struct tensor *w = q->w[i];
    const size_t grp = qmm_group_bytes(w->type, w->ne0);
    struct qmm_job j = q->j;
    j.y = q->y[i];
    j.ys = (size_t)w->ne1;
    if (w->layout != TENSOR_Q8X16) {   /* rows: each group packed once into the thread's scratch, all tokens */
        uint8_t *buf = q->cc->qpack + (size_t)ith * q->cc->qpack_bytes;
        KV_ASSERT(grp <= q->cc->qpack_bytes);
        for (int64_t gi = g0; gi < g1; gi++) {
            const int64_t r0 = gi * QMM_IL;
            const int nr = (int)(w->ne1 - r0 < QMM_IL ? w->ne1 - r0 : QMM_IL);
            pack_group(w->type, tensor_row(w, r0), w->row_bytes, w->ne0, nr, buf);
            q->fn(&j, buf, r0, nr);
        }
        return;
    }
    for (int t0 = 0; t0 < j.n; t0 += QMM_TB) {
        struct qmm_job jb = j;
        jb.n = j.n - t0 < QMM_TB ? j.n - t0 : QMM_TB;
        jb.act += (size_t)t0 * jb.astride;
        jb.y += (size_t)t0 * jb.ys;
        for (int64_t gi = g0; gi < g1; gi++) {
            const int64_t r0 = gi * QMM_IL;
            const int nr = (int)(w->ne1 - r0 < QMM_IL ? w->ne1 - r0 : QMM_IL);
            q->fn(&jb, (const uint8_t *)w->data + (size_t)gi * grp, r0, nr);
        }
    }
}

/* Chunk u: its share of the numbered groups, matrix by matrix. */
static void group_chunk(void *arg, long u, int ith) {
    const struct qmm_run *q = arg;
    const int64_t g0 = (int64_t)u * q->groups / q->chunks, g1 = ((int64_t)u + 1) * q->groups / q->chunks;
    int64_t base = 0;
    for (int i = 0; i < q->k; base = q->g_end[i++]) {
        const int64_t lo = g0 > base ? g0 : base, hi = g1 < q->g_end[i] ? g1 : q->g_end[i];
        if (lo < hi) matrix_groups(q, i, lo - base, hi - base, ith);
    }
}

/* y[i] = x · w[i]ᵀ for i < k: matrices of one type and K (the callers see
 * to it), x quantized once. */
static int run(struct backend_ctx *c, int k, float *const *y, const struct tensor *const *w, const float *x, int n,
               qmm_group_fn *fn, bool q16) {
    struct cpu_ctx *cc = cpu_ctx_of(c);
    const int64_t K = w[0]->ne0;
    const size_t astride = q16 ? qmm16_act_row_bytes(K) : qmm_act_row_bytes(K);
    if (n < 0 || (size_t)n * astride > cc->act_buf_bytes || qmm_group_bytes(w[0]->type, K) > cc->qpack_bytes) {
        LOG_ERR("integer matmul of %d rows of %lld: the context was sized for fewer", n, (long long)K);
        return KVLLM_ERANGE;
    }
    struct qmm_run q = { { y[0], (size_t)w[0]->ne1, w[0]->type, K, cc->act_buf, astride, n }, w, y, k, { 0 }, x, fn,
                         cc, 0, 0, q16 };
    for (int i = 0; i < k; i++) q.g_end[i] = (q.groups += (w[i]->ne1 + QMM_IL - 1) / QMM_IL);
    /* a decode step's rows are one chunk: threadpool_run_chunks runs it inline, waking no thread */
    threadpool_run_chunks(cc->pool, (n + QMM_QUANT_ROWS - 1) / QMM_QUANT_ROWS, quant_chunk, &q);
    /* chunks of about QMM_CHUNK_W bytes of weights, but at least 4 per thread
     * (load balance); when n is small (decode) just those 4 per thread.  A
     * chunk is claimed by an atomic on a line every thread writes, a trip
     * between cores each time: decode claiming 2 groups at a time ran 10-20 %
     * slower at two threads (Gemma 3 270M, SmolLM2, TinyLlama; docs/PERF.md).
     * A whole number of chunks per thread, the groups spread evenly over them:
     * chunks of a fixed 4 groups left SmolLM2's 36-group matrices in 9, one
     * thread doing a chunk more than the other. */
    const int64_t grp = (int64_t)qmm_group_bytes(w[0]->type, K), nth = threadpool_size(cc->pool);
    int64_t per = n <= QMM_TB / 4 ? 4 : (q.groups * grp + nth * QMM_CHUNK_W - 1) / (nth * QMM_CHUNK_W);
    per = per < 4 ? 4 : per;
    q.chunks = nth * per < q.groups ? nth * per : q.groups;
    threadpool_run_chunks(cc->pool, (long)q.chunks, group_chunk, &q);
    return 0;
}

int qmm_matmul(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n, qmm_group_fn *fn) {
    return run(c, 1, &y, &w, x, n, fn, false);
}

int qmm16_matmul(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n, qmm_group_fn *fn) {
    KV_ASSERT(qmm16_takes(w));
    return run(c, 1, &y, &w, x, n, fn, true);
}

/* Whether cpu_matmul_simd gives matrix w to qmm_matmul (with b->qrows). */
static bool takes_qrows(struct backend_ctx *c, const struct tensor *w) {
    const struct cpu_backend *b = cpu_backend_of(c->be);
    return b->qrows && !(b->q16 && qmm16_takes(w)) &&
           (w->layout == TENSOR_Q8X16 || (cpu_ctx_of(c)->act == ACT_Q8 && q8_takes(w)));
}

int cpu_matmul_simd(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n) {
    const struct cpu_backend *b = cpu_backend_of(c->be);
    if (b->q16 && qmm16_takes(w)) return qmm16_matmul(c, y, w, x, n, qmm16_group_avx512);   /* q16: ACT_Q8 only */
    KV_ASSERT(w->layout != TENSOR_Q8X16 || b->qrows);
    return takes_qrows(c, w) ? qmm_matmul(c, y, w, x, n, b->qrows) : cpu_matmul_avx2(c, y, w, x, n);
}

int cpu_matmuls(struct backend_ctx *c, const struct matmuls_args *a) {
    const struct cpu_backend *b = cpu_backend_of(c->be);
    bool done[BACKEND_MATMULS_MAX] = { false };
    for (int i = 0; i < a->k; i++) {
        if (done[i]) continue;
        int rc;
        if (!takes_qrows(c, a->w[i])) {
            rc = b->kernels.matmul(c, a->y[i], a->w[i], a->x, a->n);
        } else {   /* with every later matrix of its type and K */
            float *y[BACKEND_MATMULS_MAX];
            const struct tensor *w[BACKEND_MATMULS_MAX];
            int k = 0;
            for (int j = i; j < a->k; j++)
                if (!done[j] && takes_qrows(c, a->w[j]) && a->w[j]->type == a->w[i]->type &&
                    a->w[j]->ne0 == a->w[i]->ne0)
                    y[k] = a->y[j], w[k++] = a->w[j], done[j] = true;
            rc = run(c, k, y, w, a->x, a->n, b->qrows, false);
        }
        if (rc) return rc;
    }
    return 0;
}

int cpu_get_rows_simd(struct backend_ctx *c, float *y, const struct tensor *w, const int32_t *ids, int n) {
    if (w->layout != TENSOR_Q8X16) return cpu_get_rows(c, y, w, ids, n);
    struct cpu_ctx *cc = cpu_ctx_of(c);
    KV_ASSERT(w->row_bytes <= cc->qpack_bytes);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= w->ne1) {
            LOG_ERR("get_rows: row %d of %lld", (int)ids[i], (long long)w->ne1);
            return KVLLM_ERANGE;
        }
        qmm_unpack_row(w, ids[i], cc->qpack);
        dtype_to_f32(w->type, cc->qpack, y + (size_t)i * (size_t)w->ne0, w->ne0);
    }
    return 0;
}

/* Placement packs groups of 16 rows in chunks over a pool of its own (a
 * 1.1B Q4_K_M model is 650 MB to regroup). */
struct pack_run { const struct tensor *t; uint8_t *dst; };
#define PACK_GROUPS 64

static void pack_chunk(void *arg, long u, int ith) {
    (void)ith;
    const struct pack_run *pr = arg;
    const struct tensor *t = pr->t;
    const size_t grp = qmm_group_bytes(t->type, t->ne0);
    for (int64_t r0 = (int64_t)u * PACK_GROUPS * QMM_IL; r0 < t->ne1 && r0 < (int64_t)(u + 1) * PACK_GROUPS * QMM_IL;
         r0 += QMM_IL)
        pack_group(t->type, tensor_row(t, r0), t->row_bytes, t->ne0,
                   (int)(t->ne1 - r0 < QMM_IL ? t->ne1 - r0 : QMM_IL), pr->dst + (size_t)(r0 / QMM_IL) * grp);
}

/* Whether placement repacks t: the integer path's matrices, and the logits'
 * Q8_0 one where the set has the 16-bit path. */
static bool packs(const struct cpu_backend *b, const struct tensor *t) {
    return t->layout == TENSOR_ROWS && (q8_takes(t) || (b->q16 && qmm16_takes(t)));
}

int cpu_place_weights_q8(struct backend *be, struct tensor *const *ts, int n, const struct place_copied *copied,
                         uint64_t *placed) {
    struct cpu_backend *b = cpu_backend_of(be);
    *placed = 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (!ts[i]->data) continue;
        if (packs(b, ts[i])) total += (qmm_packed_bytes(ts[i]) + 63) & ~(size_t)63;
        else *placed += (uint64_t)ts[i]->ne1 * ts[i]->row_bytes;
    }
    if (b->packed) total = 0;   /* placed once per backend: later tensors stay in rows (packed on the fly) */
    if (!total) {
        for (int i = 0; i < n; i++)
            if (ts[i]->data && packs(b, ts[i]))
                *placed += (uint64_t)ts[i]->ne1 * ts[i]->row_bytes;
        return 0;
    }
    uint8_t *p = aligned_alloc(64, total);
    if (!p) {
        LOG_ERR("out of memory repacking %zu bytes of weights", total);
        return KVLLM_ENOMEM;
    }
    uint8_t *at = p;
    const int nth = cpu_count() < 8 ? cpu_count() : 8;
    struct threadpool *pool = nth > 1 ? threadpool_new(nth) : NULL;   /* NULL: packed by this thread alone */
    for (int i = 0; i < n; i++) {
        struct tensor *t = ts[i];
        if (!t->data || !packs(b, t)) continue;
        struct pack_run pr = { t, at };
        const long chunks = (long)((t->ne1 + PACK_GROUPS * QMM_IL - 1) / (PACK_GROUPS * QMM_IL));
        if (pool) threadpool_run_chunks(pool, chunks, pack_chunk, &pr);
        else for (long u = 0; u < chunks; u++) pack_chunk(&pr, u, 0);
        place_copied_tell(copied, t->data, (size_t)t->ne1 * t->row_bytes);
        t->data = at;
        t->layout = TENSOR_Q8X16;
        at += (qmm_packed_bytes(t) + 63) & ~(size_t)63;
    }
    threadpool_free(pool);
    b->packed = p;
    *placed += total;
    return 0;
}
