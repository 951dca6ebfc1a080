/* matmul_avx2.c — y (n, M) = x (n, K) · Wᵀ with AVX2 + FMA + F16C.  This
 * file alone is compiled with -mavx2 -mfma -mf16c; cpu.c enters it only
 * when the CPU has all three.
 *
 * Model of the arithmetic (what makes results batch-invariant): each output
 * y[t][r] owns one 8-lane f32 accumulator.  Lane j adds w[r][k] * x[t][k]
 * for k ≡ j (mod 8) in increasing k, one FMA per step, the K % 8 tail as a
 * last zero-padded step; the lanes are then combined as
 * ((0+1)+(2+3))+((4+5)+(6+7)).  Every tile shape below runs exactly that
 * sequence for each (r, t) it covers, so y[t][r] depends on neither n, nor
 * the tile or thread that computes it.  Weights enter as the same f32 values
 * dtype_to_f32 gives (F16/BF16 widening and block dequantization are exact
 * or one rounding, done identically), so the only difference from the scalar
 * reference is FMA rounding and where the tail is added.
 *
 * Tiling: threads claim output rows in chunks of MM_CHUNK blocks of MR (4).
 * A row block is swept over all tokens NT (3) at a time by an MR x NT
 * register-blocked micro-kernel: per 8-element step it loads MR weight
 * vectors and NT activation vectors for MR * NT FMAs.  Weights reach it in
 * place (F32, and F16/BF16 widened in registers for any n: MR f16 rows are
 * half the bytes of f32 ones, so at K = 2048 they stay in L1 while the
 * tokens stream past, about 1.25x the GEMM rate of widened copies) or, for
 * block formats and more than FEW_N tokens (prefill), first dequantized to
 * f32 in the thread's scratch once per row block and reused by every
 * token.  n = 1 (decode) streams each weight row once: block
 * formats dequantized in registers, the next row block prefetched while
 * the current one is read.  2 <= n <= FEW_N (batched decode): block
 * formats dequantized in registers once per two tokens, MR rows at once.  All
 * these paths hand the FMAs the same f32 values in the same order.
 *
 * Block formats: Q8_0 / Q4_0 / Q4_1 are dequantized 32 elements (one block)
 * at a time (q * d is exact for 4- and 8-bit codes and an f16 d, so Q4_0's
 * (q - 8) d and Q4_1's q d + m take one FMA and round exactly as the
 * reference does; only a zero weight may differ in sign, which no sum
 * sees); the K-quants Q4_K / Q5_K / Q6_K (super-blocks of 256) one
 * 32-element sub-block at a time, with the reference's arithmetic (Q4_K,
 * Q5_K: (d * sc) * q - dmin * m, whose product is exact, as one FMA;
 * Q6_K: (d * sc) * (q - 32)), so the f32 weights are bit-identical to
 * dtype_to_f32's and the FMA order over k is the one described above. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "core/core.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backend/cpu/avx2_util.h"
#include <string.h>

bool cpu_avx2_built(void) { return true; }

#define MR CPU_AVX2_MM_ROWS   /* rows per micro-tile (4) */
#define NT 3                  /* tokens per micro-tile: 4 x 3 accumulators + 4 weights = 16 ymm */
#define FEW_N 4               /* up to this many tokens, weights are used in place (never via the scratch) */

/* How the micro-kernel reads weights: f32 in memory, or f16 / bf16 widened. */
enum wkind { WK_F32, WK_F16, WK_BF16 };

/* 8 weights at element k of row p, as f32. */
ALWAYS_INLINE __m256 load_w(enum wkind wk, const uint8_t *p, int64_t k) {
    switch (wk) {
    case WK_F16:  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * k)));
    case WK_BF16: return _mm256_castsi256_ps(_mm256_slli_epi32(
                      _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * k))), 16));
    default:      return _mm256_loadu_ps((const float *)p + k);
    }
}

/* The last nt (1..7) weights from element k, zero-padded to 8. */
ALWAYS_INLINE __m256 load_w_tail(enum wkind wk, const uint8_t *p, int64_t k, int nt, __m256i mask) {
    if (wk == WK_F32) return _mm256_maskload_ps((const float *)p + k, mask);
    uint16_t h[8] = { 0 };
    memcpy(h, p + 2 * k, (size_t)nt * 2);
    __m128i v = _mm_loadu_si128((const __m128i *)h);
    if (wk == WK_F16) return _mm256_cvtph_ps(v);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

/* y[t * ys + r] = row r (at w + r * ws bytes) · x[t * xs ..] for r < R,
 * t < T.  R is MR or 1, T is 1 .. NT; both constant after inlining, so acc
 * stays in registers.  pf: the next MR rows (contiguous after these), to
 * prefetch while streaming these ones (decode), or NULL. */
ALWAYS_INLINE void micro(const int R, const int T, enum wkind wk, const uint8_t *w, size_t ws,
                         const float *x, size_t xs, int64_t K, float *y, size_t ys, const uint8_t *pf) {
    const int eb = wk == WK_F32 ? 4 : 2;   /* bytes per weight */
    __m256 acc[MR][NT], wv[MR];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        if (pf) /* the next rows at the pace these are read: MR * 8 weights per step */
            for (int b = 0; b < MR * 8 * eb; b += 64) _mm_prefetch((const char *)pf + k * MR * eb + b, _MM_HINT_T0);
        /* T activations, then one weight vector at a time: 12 accumulators
         * + 3 + 1 registers, so widened f16 weights need no spill. */
        __m256 xv[NT];
        for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(x + (size_t)t * xs + k);
        for (int r = 0; r < R; r++) {
            __m256 wr = load_w(wk, w + (size_t)r * ws, k);
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wr, xv[t], acc[r][t]);
        }
    }
    if (k < K) {
        int nt = (int)(K - k);
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(nt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int r = 0; r < R; r++) wv[r] = load_w_tail(wk, w + (size_t)r * ws, k, nt, mask);
        for (int t = 0; t < T; t++) {
            __m256 xv = _mm256_maskload_ps(x + (size_t)t * xs + k, mask);
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
    for (int t = 0; t < T; t++) {
        if (R == MR) _mm_storeu_ps(y + (size_t)t * ys, avx2_hsum4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
        else for (int r = 0; r < R; r++) y[(size_t)t * ys + r] = avx2_hsum_pairs(acc[r][t]);
    }
}

/* nr (1 .. MR) rows starting at w, all n tokens: y (n, ys) from column 0.
 * pf: see micro (used when n = 1). */
ALWAYS_INLINE void rows_all_tokens(enum wkind wk, const uint8_t *w, size_t ws, int nr,
                                   const float *x, int n, int64_t K, float *y, size_t ys, const uint8_t *pf) {
    int t = 0;
    if (nr == MR) {
        if (n == 1) { micro(MR, 1, wk, w, ws, x, (size_t)K, K, y, ys, pf); return; }
        for (; t + NT <= n; t += NT) micro(MR, NT, wk, w, ws, x + (size_t)t * K, (size_t)K, K, y + (size_t)t * ys, ys, NULL);
        if (n - t == 2) micro(MR, 2, wk, w, ws, x + (size_t)t * K, (size_t)K, K, y + (size_t)t * ys, ys, NULL);
        if (n - t == 1) micro(MR, 1, wk, w, ws, x + (size_t)t * K, (size_t)K, K, y + (size_t)t * ys, ys, NULL);
        return;
    }
    for (int r = 0; r < nr; r++) {
        const uint8_t *wr = w + (size_t)r * ws;
        for (t = 0; t + NT <= n; t += NT) micro(1, NT, wk, wr, ws, x + (size_t)t * K, (size_t)K, K, y + (size_t)t * ys + r, ys, NULL);
        if (n - t == 2) micro(1, 2, wk, wr, ws, x + (size_t)t * K, (size_t)K, K, y + (size_t)t * ys + r, ys, NULL);
        if (n - t == 1) micro(1, 1, wk, wr, ws, x + (size_t)t * K, (size_t)K, K, y + (size_t)t * ys + r, ys, NULL);
    }
}

/* One copy per weight kind or block type, so it is a constant in the hot loop. */
typedef void rows_fn(const uint8_t *w, size_t ws, int nr, const float *x, int n, int64_t K, float *y, size_t ys,
                     const uint8_t *pf);
#define ROWS_FN(name, fn, kind)                                                                               \
    static void name(const uint8_t *w, size_t ws, int nr, const float *x, int n, int64_t K, float *y, size_t ys, \
                     const uint8_t *pf) {                                                                     \
        fn(kind, w, ws, nr, x, n, K, y, ys, pf);                                                              \
    }
ROWS_FN(rows_f32, rows_all_tokens, WK_F32)
ROWS_FN(rows_f16, rows_all_tokens, WK_F16)
ROWS_FN(rows_bf16, rows_all_tokens, WK_BF16)

/* ---- block formats: 32 weights dequantized as dtype_to_f32 does ---- */

/* An f16 scale broadcast to 8 lanes (widened after the broadcast: fewer
 * instructions than widening one lane and broadcasting it). */
static inline __m256 half_scale(uint16_t h) { return _mm256_cvtph_ps(_mm_set1_epi16((short)h)); }

/* The 32 nibbles of a block, element order (low nibbles 0..15, high 16..31),
 * as four vectors of 8 int32: bytes 0-7 and 8-15 widened straight from
 * memory, each giving its low nibbles (and 15) and its high ones (>> 4). */
ALWAYS_INLINE void nibbles(const uint8_t *qs, __m256i q[4]) {
    const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
    const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8)));
    const __m256i m = _mm256_set1_epi32(0x0f);
    q[0] = _mm256_and_si256(lo, m);
    q[1] = _mm256_and_si256(hi, m);
    q[2] = _mm256_srli_epi32(lo, 4);
    q[3] = _mm256_srli_epi32(hi, 4);
}

/* Block blk (of type, a constant after inlining) as f32 in w[0..3]: the
 * reference's arithmetic exactly (int -> float exact, then its roundings). */
ALWAYS_INLINE void deq_block(uint32_t type, const uint8_t *blk, __m256 w[4]) {
    __m256i q[4];
    if (type == DTYPE_Q8_0) {
        const struct block_q8_0 *b = (const void *)blk;
        __m256 d = half_scale(b->d);
        for (int j = 0; j < 4; j++)   /* q * d */
            w[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                       _mm_loadl_epi64((const __m128i *)(b->qs + 8 * j)))), d);
    } else if (type == DTYPE_Q4_0) {
        const struct block_q4_0 *b = (const void *)blk;
        const __m256 d = half_scale(b->d), m8d = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
        nibbles(b->qs, q);
        for (int j = 0; j < 4; j++)   /* (q - 8) * d, as q * d - 8 d: both products exact, so is the sum */
            w[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[j]), d, m8d);
    } else {
        const struct block_q4_1 *b = (const void *)blk;
        const __m256 d = half_scale(b->d), m = half_scale(b->m);
        nibbles(b->qs, q);
        for (int j = 0; j < 4; j++)   /* q * d + m: q * d is exact (4 x 11 bits), so one FMA rounds as mul + add */
            w[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[j]), d, m);
    }
}

ALWAYS_INLINE size_t block_bytes(uint32_t type) {
    return type == DTYPE_Q8_0 ? sizeof(struct block_q8_0)
         : type == DTYPE_Q4_0 ? sizeof(struct block_q4_0) : sizeof(struct block_q4_1);
}

/* ---- K-quants: sub-block s (0..7, 32 elements) of a super-block ---- */

static inline bool is_k_type(uint32_t type) {
    return type == DTYPE_Q4_K || type == DTYPE_Q5_K || type == DTYPE_Q6_K;
}

ALWAYS_INLINE size_t k_block_bytes(uint32_t type) {
    return type == DTYPE_Q4_K ? sizeof(struct block_q4_K)
         : type == DTYPE_Q5_K ? sizeof(struct block_q5_K) : sizeof(struct block_q6_K);
}

/* 32 bytes (unsigned, or signed when sign) as four vectors of 8 int32
 * (bytes 0-7, 8-15, 16-23, 24-31). */
ALWAYS_INLINE void widen32(__m256i v, bool sign, __m256i q[4]) {
    __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    __m128i p[4] = { lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8) };
    for (int j = 0; j < 4; j++) q[j] = sign ? _mm256_cvtepi8_epi32(p[j]) : _mm256_cvtepu8_epi32(p[j]);
}

/* The f32 scales of super-block sb, as dtype_k.c forms them: Q4_K / Q5_K
 * dl[j] = d * sc[j], ml[j] = dmin * m[j] for its 8 sub-blocks of 32; Q6_K
 * dl[j] = d * scales[j] for its 16 runs of 16 (ml unused). */
ALWAYS_INLINE void k_scales(uint32_t type, const uint8_t *sb, float dl[16], float ml[8]) {
    if (type == DTYPE_Q6_K) {
        const struct block_q6_K *b = (const void *)sb;
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
        __m128i sc = _mm_loadu_si128((const __m128i *)b->scales);
        _mm256_storeu_ps(dl, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d));
        _mm256_storeu_ps(dl + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))), d));
        return;
    }
    /* the 6-bit scales and mins of q4_K_scale_min, eight at a time: u[0] = bytes 0-3, u[1] 4-7, u[2] 8-11 */
    const struct block_q4_K *b = (const void *)sb;   /* Q5_K starts with the same fields */
    uint32_t u[3];
    memcpy(u, b->scales, 12);
    const uint64_t sc = (u[0] & 0x3f3f3f3fu) |
                        (uint64_t)((u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4)) << 32;
    const uint64_t m = (u[1] & 0x3f3f3f3fu) |
                       (uint64_t)(((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4)) << 32;
    _mm256_storeu_ps(dl, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc))),
                                       _mm256_set1_ps(_cvtsh_ss(b->d))));
    _mm256_storeu_ps(ml, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m))),
                                       _mm256_set1_ps(_cvtsh_ss(b->dmin))));
}

/* Elements 32s .. 32s+31 of super-block sb (of type, a constant after
 * inlining) as f32 in w[0..3], exactly as dtype_k.c computes them, with
 * the scales k_scales gave for it. */
ALWAYS_INLINE void deq_ksub(uint32_t type, const uint8_t *sb, int s, const float *dl, const float *ml, __m256 w[4]) {
    __m256i q[4];
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    if (type == DTYPE_Q6_K) {
        const struct block_q6_K *b = (const void *)sb;
        const int h = s / 4, r = s % 4;          /* half, run of 32 in it */
        __m256i ql = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32 * (r & 1)));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
        ql = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (r >> 1)), low4);
        qh = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * r), _mm256_set1_epi8(3));
        /* q = low | high << 4 (0..63, no carry across bytes), then q - 32 as int8 */
        widen32(_mm256_sub_epi8(_mm256_or_si256(ql, _mm256_slli_epi16(qh, 4)), _mm256_set1_epi8(32)), true, q);
        const __m256 d0 = _mm256_set1_ps(dl[2 * s]), d1 = _mm256_set1_ps(dl[2 * s + 1]);
        for (int j = 0; j < 4; j++)   /* (d * sc) * (q - 32) */
            w[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(q[j]), j < 2 ? d0 : d1);
        return;
    }
    /* Q4_K, Q5_K: the codes of sub-block s are nibble s & 1 of qs[32 (s / 2) ..] */
    const uint8_t *qs = type == DTYPE_Q4_K ? ((const struct block_q4_K *)(const void *)sb)->qs
                                           : ((const struct block_q5_K *)(const void *)sb)->qs;
    /* bytes widened straight from memory (cheaper than widening in registers), then the nibble */
    for (int j = 0; j < 4; j++) {
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 32 * (s / 2) + 8 * j)));
        q[j] = s & 1 ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(0x0f));
    }
    if (type == DTYPE_Q5_K) {                    /* bit 4: bit s of qh[l] */
        const struct block_q5_K *b = (const void *)sb;
        for (int j = 0; j < 4; j++) {
            const __m256i h = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->qh + 8 * j)));
            q[j] = _mm256_or_si256(q[j], _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, s),
                                                                            _mm256_set1_epi32(1)), 4));
        }
    }
    const __m256 d1 = _mm256_set1_ps(dl[s]), m1 = _mm256_set1_ps(ml[s]);
    for (int j = 0; j < 4; j++)       /* (d * sc) * q - dmin * m: d * sc is exact (11 x 6 bits), so is its
                                       * product with a 4- or 5-bit q; one FMA rounds as the reference */
        w[j] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(q[j]), d1, m1);
}

/* Super-block sb of type into 256 floats at dst. */
ALWAYS_INLINE void deq_ksuper(uint32_t type, const uint8_t *sb, float *dst) {
    float dl[16], ml[8];
    __m256 w[4];
    k_scales(type, sb, dl, ml);
    for (int s = 0; s < 8; s++) {
        deq_ksub(type, sb, s, dl, ml, w);
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(dst + 32 * s + 8 * j, w[j]);
    }
}

/* A row of K block-format weights (K a multiple of the block) into f32 (prefill). */
static void dequant_row(uint32_t type, const uint8_t *src, float *dst, int64_t K) {
    __m256 w[4];
    if (is_k_type(type)) {
        const size_t bb = k_block_bytes(type);
        for (int64_t i = 0; i < K / QK_K; i++, dst += QK_K) {
            switch (type) {
            case DTYPE_Q4_K: deq_ksuper(DTYPE_Q4_K, src + (size_t)i * bb, dst); break;
            case DTYPE_Q5_K: deq_ksuper(DTYPE_Q5_K, src + (size_t)i * bb, dst); break;
            default:         deq_ksuper(DTYPE_Q6_K, src + (size_t)i * bb, dst); break;
            }
        }
        return;
    }
    for (int64_t i = 0; i < K / 32; i++, dst += 32) {
        switch (type) {
        case DTYPE_Q8_0: deq_block(DTYPE_Q8_0, src + (size_t)i * sizeof(struct block_q8_0), w); break;
        case DTYPE_Q4_0: deq_block(DTYPE_Q4_0, src + (size_t)i * sizeof(struct block_q4_0), w); break;
        default:         deq_block(DTYPE_Q4_1, src + (size_t)i * sizeof(struct block_q4_1), w); break;
        }
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(dst + 8 * j, w[j]);
    }
}

/* T (1 or 2) tokens x (token stride xs) against R (MR or 1) block-format
 * rows, dequantized in registers once for the T tokens: per accumulator the
 * same FMAs, in the same order, on the same values as micro() on the
 * dequant_row() output.  pf as in micro. */
ALWAYS_INLINE void micro_q1(const int R, const int T, uint32_t type, const uint8_t *w, size_t ws, const float *x,
                            size_t xs, int64_t K, float *y, size_t ys, const uint8_t *pf) {
    const size_t bb = block_bytes(type);
    __m256 acc[MR][2], wv[4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < K / 32; i++) {
        if (pf)
            for (size_t o = 0; o < MR * bb; o += 64) _mm_prefetch((const char *)pf + (size_t)i * MR * bb + o, _MM_HINT_T0);
        for (int r = 0; r < R; r++) {
            deq_block(type, w + (size_t)r * ws + (size_t)i * bb, wv);
            for (int t = 0; t < T; t++)
                for (int j = 0; j < 4; j++)
                    acc[r][t] = _mm256_fmadd_ps(wv[j], _mm256_loadu_ps(x + (size_t)t * xs + 32 * i + 8 * j), acc[r][t]);
        }
    }
    for (int t = 0; t < T; t++) {
        if (R == MR) _mm_storeu_ps(y + (size_t)t * ys, avx2_hsum4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
        else for (int r = 0; r < R; r++) y[(size_t)t * ys + r] = avx2_hsum_pairs(acc[r][t]);
    }
}

/* T (1 or 2) tokens against R (MR or 1) K-quant rows, dequantized in
 * registers one sub-block at a time: the same FMAs on the same values as
 * micro() on the dequant_row() output.  pf as in micro. */
ALWAYS_INLINE void micro_k1(const int R, const int T, uint32_t type, const uint8_t *w, size_t ws, const float *x,
                            size_t xs, int64_t K, float *y, size_t ys, const uint8_t *pf) {
    const size_t bb = k_block_bytes(type);
    __m256 acc[MR][2], wv[4], xv[4];
    float dl[MR][16], ml[MR][8];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < K / QK_K; i++) {
        if (pf)
            for (size_t o = 0; o < MR * bb; o += 64) _mm_prefetch((const char *)pf + (size_t)i * MR * bb + o, _MM_HINT_T0);
        for (int r = 0; r < R; r++) k_scales(type, w + (size_t)r * ws + (size_t)i * bb, dl[r], ml[r]);
        /* unrolled, so each sub-block's shifts and offsets are constants */
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            if (T == 1)                          /* x read once per sub-block, shared by the R rows */
                for (int j = 0; j < 4; j++) xv[j] = _mm256_loadu_ps(x + QK_K * i + 32 * s + 8 * j);
            for (int r = 0; r < R; r++) {
                deq_ksub(type, w + (size_t)r * ws + (size_t)i * bb, s, dl[r], ml[r], wv);
                for (int t = 0; t < T; t++)
                    for (int j = 0; j < 4; j++) {
                        const float *xk = x + (size_t)t * xs + QK_K * i + 32 * s + 8 * j;
                        acc[r][t] = _mm256_fmadd_ps(wv[j], T == 1 ? xv[j] : _mm256_loadu_ps(xk), acc[r][t]);
                    }
            }
        }
    }
    for (int t = 0; t < T; t++) {
        if (R == MR) _mm_storeu_ps(y + (size_t)t * ys, avx2_hsum4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
        else for (int r = 0; r < R; r++) y[(size_t)t * ys + r] = avx2_hsum_pairs(acc[r][t]);
    }
}

/* R rows x T tokens of a block format or K-quant (type: a constant after inlining). */
ALWAYS_INLINE void micro_blk(const int R, const int T, uint32_t type, const uint8_t *w, size_t ws, const float *x,
                             size_t xs, int64_t K, float *y, size_t ys, const uint8_t *pf) {
    if (is_k_type(type)) micro_k1(R, T, type, w, ws, x, xs, K, y, ys, pf);
    else micro_q1(R, T, type, w, ws, x, xs, K, y, ys, pf);
}

/* nr rows of block format or K-quant `type`, n <= FEW_N tokens: MR rows at
 * a time (the next rows prefetched), the tokens two at a time: 8
 * accumulators keep enough FMA chains in flight, and two tokens'
 * activations stay in L1. */
ALWAYS_INLINE void rows_blk(uint32_t type, const uint8_t *w, size_t ws, int nr, const float *x, int n, int64_t K,
                            float *y, size_t ys, const uint8_t *pf) {
    for (int t = 0; t < n; t += 2) {
        const float *xt = x + (size_t)t * (size_t)K;
        float *yt = y + (size_t)t * ys;
        const bool two = n - t >= 2;
        if (nr == MR) {
            if (two) micro_blk(MR, 2, type, w, ws, xt, (size_t)K, K, yt, ys, pf);
            else micro_blk(MR, 1, type, w, ws, xt, (size_t)K, K, yt, ys, pf);
            continue;
        }
        for (int r = 0; r < nr; r++) {
            if (two) micro_blk(1, 2, type, w + (size_t)r * ws, ws, xt, (size_t)K, K, yt + r, ys, NULL);
            else micro_blk(1, 1, type, w + (size_t)r * ws, ws, xt, (size_t)K, K, yt + r, ys, NULL);
        }
    }
}

ROWS_FN(rows_q8_0, rows_blk, DTYPE_Q8_0)
ROWS_FN(rows_q4_0, rows_blk, DTYPE_Q4_0)
ROWS_FN(rows_q4_1, rows_blk, DTYPE_Q4_1)
ROWS_FN(rows_q4_K, rows_blk, DTYPE_Q4_K)
ROWS_FN(rows_q5_K, rows_blk, DTYPE_Q5_K)
ROWS_FN(rows_q6_K, rows_blk, DTYPE_Q6_K)

/* ---- threads ---- */

struct mm_job {
    struct cpu_ctx *cc;
    float *y;               /* (n, M) */
    const struct tensor *w; /* (M, K) */
    const float *x;         /* (n, K) */
    int n;
};

/* Row blocks (of MR rows) per chunk of work: 32 rows, small enough to
 * balance two threads on a 576-row matrix, large enough that claiming a
 * chunk costs nothing next to it. */
#define MM_CHUNK 8

static void mm_chunk(void *arg, long c, int ith) {
    const struct mm_job *j = arg;
    const struct tensor *w = j->w;
    const int64_t K = w->ne0, M = w->ne1;
    const int64_t nblk = (M + MR - 1) / MR;
    const long b0 = c * MM_CHUNK, b1 = b0 + MM_CHUNK < nblk ? b0 + MM_CHUNK : (long)nblk;
    float *buf = j->cc->scratch + (size_t)ith * (size_t)j->cc->scratch_cols; /* (MR, K) */
    const bool f16 = w->type == DTYPE_F16, bf16 = w->type == DTYPE_BF16;
    const bool blocks = w->type == DTYPE_Q8_0 || w->type == DTYPE_Q4_0 || w->type == DTYPE_Q4_1 || is_k_type(w->type);
    /* In place (F32; F16/BF16 widened in registers; block formats
     * dequantized in registers for up to FEW_N tokens: decode and batched
     * decode), or rows first made f32 in the scratch and reused by every
     * token (block-format prefill).  Either way the FMAs see the same f32
     * values. */
    const bool inplace = w->type == DTYPE_F32 || f16 || bf16 || (blocks && j->n <= FEW_N);
    rows_fn *rows = !inplace ? rows_f32 : f16 ? rows_f16 : bf16 ? rows_bf16 : w->type == DTYPE_Q8_0 ? rows_q8_0
                  : w->type == DTYPE_Q4_0 ? rows_q4_0 : w->type == DTYPE_Q4_1 ? rows_q4_1
                  : w->type == DTYPE_Q4_K ? rows_q4_K : w->type == DTYPE_Q5_K ? rows_q5_K
                  : w->type == DTYPE_Q6_K ? rows_q6_K : rows_f32;
    for (int64_t r = b0 * MR; r < b1 * MR && r < M; r += MR) {
        int nr = (int)(M - r < MR ? M - r : MR);
        if (inplace) {
            const uint8_t *pf = (blocks || j->n == 1) && r + MR < M ? tensor_row(w, r + MR) : NULL;
            rows(tensor_row(w, r), w->row_bytes, nr, j->x, j->n, K, j->y + r, (size_t)M, pf);
            continue;
        }
        for (int k = 0; k < nr; k++) {
            float *dst = buf + (size_t)k * K;
            if (blocks) dequant_row(w->type, tensor_row(w, r + k), dst, K);
            else dtype_to_f32(w->type, tensor_row(w, r + k), dst, K);
        }
        rows((const uint8_t *)buf, (size_t)K * sizeof(float), nr, j->x, j->n, K, j->y + r, (size_t)M, NULL);
    }
}

int cpu_matmul_avx2(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n) {
    struct cpu_ctx *cc = cpu_ctx_of(c);
    if (cc->act == ACT_INT && cpu_matmul_int_supports(w->type, w->ne0)) return cpu_matmul_int_avx2(c, y, w, x, n);
    KV_ASSERT(w->ne0 * MR <= cc->scratch_cols);
    struct mm_job j = { cc, y, w, x, n };
    threadpool_run_chunks(cc->pool, ((w->ne1 + MR - 1) / MR + MM_CHUNK - 1) / MM_CHUNK, mm_chunk, &j);
    return 0;
}

#else /* not an x86-64 build with the AVX2 flags: the kernel set is absent */

bool cpu_avx2_built(void) { return false; }

int cpu_matmul_avx2(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n) {
    KV_ASSERT(!"cpu_matmul_avx2: not built");
}

#endif
