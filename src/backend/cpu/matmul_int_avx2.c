/* matmul_int_avx2.c — y (n, M) = x (n, K) · Wᵀ for block-quantized weights
 * with integer dot products: activations are quantized to 13-bit codes
 * (int16, |code| <= 4095) per block of 32, weight codes are widened to
 * int16, each 32-element block product is summed exactly in int32
 * (vpmaddwd), and scales are applied in f32 once per block.  Unpacking Q4
 * nibbles to int16 costs far less than converting them to f32, which makes
 * decode (one token, bound by this unpacking) about 1.6x faster than the
 * f32 path; prefill is slower (the per-block scaling, and FMA is the
 * cheaper multiplier on AVX2).  Rounding the activations costs about 1e-3
 * relative on logits (half a step of amax / 4095 per block); the scalar
 * path stays the oracle.  Compiled with -mavx2 -mfma -mf16c alone; entered
 * only when the CPU has them.
 *
 * Weight types: Q8_0 (signed codes), Q4_0 and Q4_1 (unsigned nibbles q, the
 * offset folded into a per-block correction: Q4_0 w = d (q - 8), Q4_1 w =
 * d q + m).  Per block b of a (row, token) pair:
 *     y += cvt(Σ q·xq) · (dw · dx) + cw · xs,    xs = dx · Σ xq,
 *     cw = -8 dw (Q4_0), m (Q4_1), 0 (Q8_0).
 *
 * Batch invariance: blocks are taken 4 at a time (a quad, see quad()); per
 * (row, token) one f32 accumulator adds each quad's terms lane-wise and the
 * lanes are summed in a fixed order at the end.  Every tile shape runs
 * exactly this sequence for each (row, token) it covers, so y[t][r]
 * depends on neither n nor the tiling or thread.
 *
 * Work: threads claim RB rows at a time and sweep them over the tokens, TB
 * tokens at a time: 4 rows x 1 token per micro-tile for a single token (the
 * next rows prefetched), else 1 row x 4 tokens. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "core/core.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backend/cpu/avx2_util.h"
#include <math.h>
#include <string.h>

#define GB 8        /* activation blocks are padded to a multiple of this */
#define TB 64       /* tokens per cache block */
/* Largest activation code: 13 bits, so that a block's products and their
 * partial sums are integers below 2^24 (|w| <= 128: 32 * 128 * 4095 <=
 * 2^24), exact in int32 and in f32 alike. */
#define QMAX 4095.0f

bool cpu_matmul_int_supports(uint32_t type, int64_t K) {
    return (type == DTYPE_Q8_0 || type == DTYPE_Q4_0 || type == DTYPE_Q4_1) && K % 32 == 0;
}

/* ---- activations: 13-bit codes per block of 32 ---- */

/* Row layout of the quantized activations of one token: K int8 codes, then
 * per block (padded to whole groups with zeros) dx and xs = dx * Σ codes. */
struct qrow_layout {
    int64_t nb, nbp;        /* blocks, blocks padded to a multiple of GB */
    size_t bytes;           /* per token, 32-byte aligned */
};

static struct qrow_layout qrow_layout(int64_t K) {
    struct qrow_layout l;
    l.nb = K / 32;
    l.nbp = (l.nb + GB - 1) / GB * GB;
    l.bytes = ((size_t)l.nbp * 32 * sizeof(int16_t) + (size_t)l.nbp * 2 * sizeof(float) + 31) & ~(size_t)31;
    return l;
}

ALWAYS_INLINE int16_t *qrow_codes(void *base, const struct qrow_layout *l, int t) {
    return (int16_t *)(void *)((uint8_t *)base + (size_t)t * l->bytes);
}
ALWAYS_INLINE float *qrow_dx(void *base, const struct qrow_layout *l, int t) {
    return (float *)(void *)(qrow_codes(base, l, t) + l->nbp * 32);
}
ALWAYS_INLINE float *qrow_xs(void *base, const struct qrow_layout *l, int t) {
    return qrow_dx(base, l, t) + l->nbp;
}

ALWAYS_INLINE int hsum_i32(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Token row x (K floats) into codes / dx / xs: d = amax / QMAX, code =
 * round-to-nearest-even(x * QMAX / amax); an all-zero block gets d = 0. */
static void quantize_row(const float *x, int64_t K, const struct qrow_layout *l, int16_t *q, float *dx, float *xs) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < l->nb; b++) {
        __m256 v[4], am = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 32 * b + 8 * j);
            am = _mm256_max_ps(am, _mm256_andnot_ps(sign, v[j]));
        }
        const float amax = avx2_hmax(am);
        const float d = amax / QMAX, id = amax > 0 ? QMAX / amax : 0.0f;
        __m256i c[4];
        for (int j = 0; j < 4; j++)
            c[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], _mm256_set1_ps(id)),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const int sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3])));
        /* pack keeps 128-bit lanes apart: fix the order with a qword permute */
        for (int h = 0; h < 2; h++)
            _mm256_storeu_si256((__m256i *)(void *)(q + 32 * b + 16 * h),
                                _mm256_permute4x64_epi64(_mm256_packs_epi32(c[2 * h], c[2 * h + 1]), 0xd8));
        dx[b] = d;
        xs[b] = d * (float)sum;
    }
    for (int64_t b = l->nb; b < l->nbp; b++) dx[b] = xs[b] = 0;
    memset(q + 32 * l->nb, 0, (size_t)(l->nbp - l->nb) * 32 * sizeof *q);   /* padding blocks: code 0 */
}

/* ---- weights ---- */

ALWAYS_INLINE size_t wblock_bytes(uint32_t type) {
    return type == DTYPE_Q8_0 ? sizeof(struct block_q8_0)
         : type == DTYPE_Q4_0 ? sizeof(struct block_q4_0) : sizeof(struct block_q4_1);
}

/* The 32 codes of a block in element order as int16: w[0] elements 0..15,
 * w[1] 16..31 (Q8_0 signed, Q4_x unsigned nibbles). */
ALWAYS_INLINE void wcodes(uint32_t type, const uint8_t *blk, __m256i w[2]) {
    if (type == DTYPE_Q8_0) {
        const int8_t *qs = ((const struct block_q8_0 *)(const void *)blk)->qs;
        w[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)qs));
        w[1] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16)));
        return;
    }
    const uint8_t *qs = type == DTYPE_Q4_0 ? ((const struct block_q4_0 *)(const void *)blk)->qs
                                           : ((const struct block_q4_1 *)(const void *)blk)->qs;
    const __m128i v = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0x0f);
    w[0] = _mm256_cvtepu8_epi16(_mm_and_si128(v, m));
    w[1] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), m));
}

/* Scales of the 4 blocks at blk (bb bytes apart) in both 128-bit halves:
 * ws = dw; wc = the correction coefficient (see the file comment) in the
 * low half, 0 in the high one (the correction is added once per block). */
ALWAYS_INLINE void wscales4(uint32_t type, const uint8_t *blk, __m256 *ws, __m256 *wc) {
    const size_t bb = wblock_bytes(type);
    uint16_t d[4], m[4];
    for (int i = 0; i < 4; i++) memcpy(&d[i], blk + (size_t)i * bb, 2);   /* d leads every block */
    __m128i dv = _mm_loadl_epi64((const __m128i *)d);
    const __m128 d4 = _mm_cvtph_ps(dv);
    *ws = _mm256_set_m128(d4, d4);
    if (type == DTYPE_Q4_0) *wc = _mm256_set_m128(_mm_setzero_ps(), _mm_mul_ps(d4, _mm_set1_ps(-8.0f)));
    else if (type == DTYPE_Q4_1) {
        for (int i = 0; i < 4; i++) memcpy(&m[i], blk + (size_t)i * bb + 2, 2);
        *wc = _mm256_set_m128(_mm_setzero_ps(), _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)m)));
    } else *wc = _mm256_setzero_ps();
}

/* ---- the micro-kernel ---- */

/* Σ over the 32 elements of w-codes x x-codes, as 8 int32 lanes (exact:
 * |w| <= 128, |x| <= QMAX, 4 products per lane). */
ALWAYS_INLINE __m256i block_dot(const __m256i w[2], const int16_t *x) {
    return _mm256_add_epi32(_mm256_madd_epi16(w[0], _mm256_loadu_si256((const __m256i *)(const void *)x)),
                            _mm256_madd_epi16(w[1], _mm256_loadu_si256((const __m256i *)(const void *)(x + 16))));
}

struct int_job {
    struct cpu_ctx *cc;
    float *y;               /* (n, M) */
    const struct tensor *w; /* (M, K) */
    const float *x;         /* (n, K) */
    int n;
    struct qrow_layout l;
    void *q;                /* n quantized rows */
};

/* One quad (4 blocks) of R rows x T tokens into acc: per pair,
 * hadd(hadd(p0, p1), hadd(p2, p3)) puts block i's first-half sum in lane i
 * and its second-half sum in lane 4 + i; one multiply by [s0..s3, s0..s3]
 * (s = dw * dx) and one FMA add the quad (and, for Q4_x, one more FMA the
 * corrections).  w[r]: row r's first block of the quad; xq[t]: token t's
 * codes there, dx / xs its scales.  Straight-line code after inlining. */
ALWAYS_INLINE void quad(const int R, const int T, uint32_t type, const uint8_t *const *w, const int16_t *const *xq,
                        const float *const *dx, const float *const *xs, __m256 acc[4][4]) {
    const size_t bb = wblock_bytes(type);
    __m256i h[4][4], h2[4][4];
    for (int e = 0; e < 4; e++) {
        __m256i wv[4][2];
        for (int r = 0; r < R; r++) wcodes(type, w[r] + (size_t)e * bb, wv[r]);
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) {
                const __m256i p = block_dot(wv[r], xq[t] + 32 * e);
                if (e == 0 || e == 2) h2[r][t] = p;
                else if (e == 1) h[r][t] = _mm256_hadd_epi32(h2[r][t], p);
                else h[r][t] = _mm256_hadd_epi32(h[r][t], _mm256_hadd_epi32(h2[r][t], p));
            }
    }
    __m256 ws[4], wc[4];
    for (int r = 0; r < R; r++) wscales4(type, w[r], &ws[r], &wc[r]);
    for (int t = 0; t < T; t++) {
        const __m128 d4 = _mm_loadu_ps(dx[t]);
        const __m256 dxv = _mm256_set_m128(d4, d4);
        const __m256 xsv = _mm256_set_m128(_mm_setzero_ps(), _mm_loadu_ps(xs[t]));
        for (int r = 0; r < R; r++) {
            acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h[r][t]), _mm256_mul_ps(ws[r], dxv), acc[r][t]);
            if (type != DTYPE_Q8_0) acc[r][t] = _mm256_fmadd_ps(wc[r], xsv, acc[r][t]);
        }
    }
}

/* R rows (at w, wstride bytes apart) x T tokens (from token t0) over all
 * K: y[t][r] for the tile.  R, T and type are constants after inlining.
 * A last partial quad runs on a copy of its blocks padded with zero blocks
 * (codes and scales 0; the activation codes there are 0 too), so it adds
 * exact zeros. */
ALWAYS_INLINE void micro(const int R, const int T, uint32_t type, const struct int_job *j, const uint8_t *w,
                         size_t wstride, int t0, float *y, size_t ys, const uint8_t *pf) {
    const struct qrow_layout *l = &j->l;
    const size_t bb = wblock_bytes(type);
    __m256 acc[4][4];
    const int16_t *xq[4];
    const float *dx[4], *xs[4];
    const uint8_t *wr[4];
    for (int t = 0; t < T; t++) {
        xq[t] = qrow_codes(j->q, l, t0 + t);
        dx[t] = qrow_dx(j->q, l, t0 + t);
        xs[t] = qrow_xs(j->q, l, t0 + t);
        for (int r = 0; r < R; r++) acc[r][t] = _mm256_setzero_ps();
    }
    for (int r = 0; r < R; r++) wr[r] = w + (size_t)r * wstride;
    int64_t b0 = 0;
    for (; b0 + 4 <= l->nb; b0 += 4) {
        if (pf) /* decode: the next R rows (contiguous after these) at the pace these are read */
            for (size_t o = 0; o < (size_t)R * 4 * bb; o += 64)
                _mm_prefetch((const char *)pf + (size_t)b0 * R * bb + o, _MM_HINT_T0);
        quad(R, T, type, wr, xq, dx, xs, acc);
        for (int r = 0; r < R; r++) wr[r] += 4 * bb;
        for (int t = 0; t < T; t++) { xq[t] += 128; dx[t] += 4; xs[t] += 4; }
    }
    if (b0 < l->nb) {
        uint8_t pad[4][4 * sizeof(struct block_q8_0)];
        const uint8_t *pr[4];
        for (int r = 0; r < R; r++) {
            memset(pad[r], 0, sizeof pad[r]);
            memcpy(pad[r], wr[r], (size_t)(l->nb - b0) * bb);
            pr[r] = pad[r];
        }
        quad(R, T, type, pr, xq, dx, xs, acc);
    }
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++) y[(size_t)t * ys + r] = avx2_hsum_pairs(acc[r][t]);
}

/* Rows [r0, r0 + nr) x tokens [t0, t1): tiles of 2 rows x 2 tokens (4 rows
 * x 1 token for a single token), edges with fewer; the per-pair arithmetic
 * is the same in every tile. */
ALWAYS_INLINE void sweep(uint32_t type, const struct int_job *j, int64_t r0, int nr, int t0, int t1) {
    const struct tensor *w = j->w;
    const size_t M = (size_t)w->ne1, wst = w->row_bytes;
    float *y = j->y + (size_t)t0 * M + (size_t)r0;
    int r = 0;
    if (t1 - t0 == 1)
        for (; r + 4 <= nr; r += 4)
            micro(4, 1, type, j, tensor_row(w, r0 + r), wst, t0, y + r, M,
                  r0 + r + 8 <= (int64_t)M ? tensor_row(w, r0 + r + 4) : NULL);
    for (; r < nr; r++) {
        const uint8_t *wr = tensor_row(w, r0 + r);
        int t = t0;
        for (; t + 4 <= t1; t += 4) micro(1, 4, type, j, wr, wst, t, y + (size_t)(t - t0) * M + r, M, NULL);
        for (; t < t1; t++) micro(1, 1, type, j, wr, wst, t, y + (size_t)(t - t0) * M + r, M, NULL);
    }
    for (; r < nr; r++)
        for (int t = t0; t < t1; t++) micro(1, 1, type, j, tensor_row(w, r0 + r), wst, t, y + (size_t)(t - t0) * M + r, M, NULL);
}

typedef void sweep_fn(const struct int_job *j, int64_t r0, int nr, int t0, int t1);
static void sweep_q8_0(const struct int_job *j, int64_t r0, int nr, int t0, int t1) { sweep(DTYPE_Q8_0, j, r0, nr, t0, t1); }
static void sweep_q4_0(const struct int_job *j, int64_t r0, int nr, int t0, int t1) { sweep(DTYPE_Q4_0, j, r0, nr, t0, t1); }
static void sweep_q4_1(const struct int_job *j, int64_t r0, int nr, int t0, int t1) { sweep(DTYPE_Q4_1, j, r0, nr, t0, t1); }

/* ---- threads ---- */

static void quant_chunk(void *arg, long t, int ith) {
    (void)ith;
    const struct int_job *j = arg;
    const int64_t K = j->w->ne0;
    quantize_row(j->x + (size_t)t * (size_t)K, K, &j->l, qrow_codes(j->q, &j->l, (int)t),
                 qrow_dx(j->q, &j->l, (int)t), qrow_xs(j->q, &j->l, (int)t));
}

#define RB 16       /* rows per chunk of work (a multiple of the tiles' 4 and 2) */

static void mm_chunk(void *arg, long u, int ith) {
    (void)ith;
    const struct int_job *j = arg;
    const int64_t M = j->w->ne1;
    sweep_fn *sw = j->w->type == DTYPE_Q8_0 ? sweep_q8_0 : j->w->type == DTYPE_Q4_0 ? sweep_q4_0 : sweep_q4_1;
    const int64_t r0 = (int64_t)u * RB;
    const int nr = (int)(M - r0 < RB ? M - r0 : RB);
    for (int t0 = 0; t0 < j->n; t0 += TB) sw(j, r0, nr, t0, j->n - t0 < TB ? j->n : t0 + TB);
}

size_t cpu_matmul_int_row_bytes(int64_t K) { return qrow_layout(K).bytes; }

int cpu_matmul_int_avx2(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n) {
    struct cpu_ctx *cc = cpu_ctx_of(c);
    struct int_job j = { cc, y, w, x, n, qrow_layout(w->ne0), NULL };
    if ((size_t)n * j.l.bytes > cc->act_buf_bytes) {   /* sized at creation for the largest step */
        LOG_ERR("integer matmul of %d rows of %lld: the context was sized for fewer", n, (long long)w->ne0);
        return KVLLM_ERANGE;
    }
    j.q = cc->act_buf;
    if (n <= 4) for (int t = 0; t < n; t++) quant_chunk(&j, t, 0);   /* cheaper than waking the threads */
    else threadpool_run_chunks(cc->pool, n, quant_chunk, &j);
    threadpool_run_chunks(cc->pool, (w->ne1 + RB - 1) / RB, mm_chunk, &j);
    return 0;
}

#else

bool cpu_matmul_int_supports(uint32_t type, int64_t K) { return false; }
size_t cpu_matmul_int_row_bytes(int64_t K) { return 0; }

int cpu_matmul_int_avx2(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n) {
    KV_ASSERT(!"cpu_matmul_int_avx2: not built");
}

#endif
