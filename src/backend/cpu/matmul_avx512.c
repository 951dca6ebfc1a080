/* matmul_avx512.c — y (n, M) = x (n, K) · Wᵀ for F32, F16 and BF16 weights
 * with AVX-512 (16-lane FMAs): the avx512 kernel set's matmul for those
 * types (cpu.c); every other weight type, the repacked 8-bit layout and the
 * integer-activation modes go to cpu_matmul_simd unchanged.  This file alone
 * is compiled with the AVX-512 flags; cpu.c enters it only when the CPU has
 * the avx512 set.
 *
 * Model of the arithmetic (what makes results batch-invariant): each output
 * y[t][r] owns one 16-lane f32 accumulator, starting at +0.  Lane j adds
 * w[r][k] * x[t][k] for k ≡ j (mod 16) in increasing k, one FMA per step;
 * the K % 16 tail is a last step with both operands zero-padded (fma(0, 0,
 * acc) in the padded lanes).  The lanes are then combined as s_j = l_j +
 * l_{j+8} (j < 8), then ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)).  Weights enter
 * as the exact f32 values dtype_to_f32 gives (F16 widened by vcvtph2ps, BF16
 * by a 16-bit shift: both exact), so FMA rounding and that order are the
 * only difference from a real-number dot product.  Every path below runs
 * exactly that sequence for each (r, t) it covers (an accumulator parked in
 * memory between K blocks is stored and reloaded as the same 16 floats), so
 * y[t][r] depends on neither n, nor the tile, chunk or thread computing it.
 *
 * Few tokens (n <= FEW_N: decode, batched decode): weights read in place,
 * widened in registers, MR rows x up to FEW_N tokens per micro-tile, the
 * next rows prefetched (n = 1 streams each weight row once: bandwidth
 * bound).  Prefill: work items are (token chunk, row chunk) pairs, token
 * chunk major so the threads share one chunk of activations (sized to stay
 * in L2).  Within an item each block of MR rows is widened to f32 KC
 * columns at a time into a 64-byte aligned panel on the stack (so it sits in
 * L1 while the chunk's tokens stream past, NT at a time), the MR x NT
 * accumulators parked in the thread's scratch between K blocks.  Full
 * 16-element steps use plain loads; only the tail step is masked (masked
 * loads throughout cost about a quarter of the rate).  The micro-tile is MR
 * (4) rows x NT (6)
 * tokens: 24 accumulators + 4 weights + 1 activation of the 32 zmm. */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/qmm.h"
#include "core/core.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "backend/cpu/avx2_util.h"

bool cpu_mm_avx512_built(void) { return true; }

#define MR 4                 /* rows per micro-tile (6 x 4 measured no faster in cache) */
#define NT 6                 /* tokens per micro-tile */
#define FEW_N 4              /* up to this many tokens, weights are read in place */
#define KC 256               /* K block of the packed path when K > KC_ONE (256 measured best of 256 / 512 / 1024) */
#define KC_ONE 1024          /* up to this K, one block (no parked accumulators); the panel's stack bytes / 16 */
#define X_CHUNK_BYTES (768 * 1024)   /* activations of one token chunk: within L2 (2 MB here) */
#define ROW_CHUNK (16 * MR)  /* rows per work item (prefill) */
#define FEW_ROW_CHUNK (8 * MR)   /* rows per work item (n <= FEW_N): balances two threads on 576 rows */

_Static_assert(KC <= KC_ONE && FEW_N <= NT, "avx512 matmul panel, few-token tiles");
_Static_assert(MR == 4 && NT == 6, "micro() names its accumulators for 4 x 6");

enum wkind { WK_F32, WK_F16, WK_BF16 };

/* 16 weights at element k of row p (m: the lanes to load, the rest zero), as f32. */
ALWAYS_INLINE __m512 load_w(enum wkind wk, const uint8_t *p, int64_t k, __mmask16 m) {
    switch (wk) {
    case WK_F16:  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p + 2 * k));
    case WK_BF16: return _mm512_castsi512_ps(_mm512_slli_epi32(
                      _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p + 2 * k)), 16));
    default:      return _mm512_maskz_loadu_ps(m, (const float *)(const void *)p + k);
    }
}

/* v, pinned in a register (see avx2_reg): one load shared by several FMAs. */
ALWAYS_INLINE __m512 reg512(__m512 v) {
    __asm__("" : "+v"(v));
    return v;
}

/* The 16 lanes folded to 8 (s_j = l_j + l_{j+8}): the model's first level. */
ALWAYS_INLINE __m256 fold16(__m512 a) {
    return _mm256_add_ps(_mm512_castps512_ps256(a),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* R (MR or 1) rows x T (1 .. NT) tokens over klen elements: rows at w (row
 * stride ws bytes, kind wk), tokens at x (stride xs floats).  part: the
 * parked accumulators ([t][MR][16] floats, this tile's), read unless first,
 * written unless last; when last, the lanes are combined into y[t * ys + r].
 * pf: the next rows (contiguous after these) to prefetch, or NULL. */
ALWAYS_INLINE void micro(const int R, const int T, enum wkind wk, const uint8_t *w, size_t ws, const float *x,
                         size_t xs, int64_t klen, float *part, bool first, bool last, float *y, size_t ys,
                         const uint8_t *pf) {
    const int eb = wk == WK_F32 ? 4 : 2;
    /* The accumulators are named variables, not an array: with 24 of them
     * GCC keeps an array in memory through the loop (a store per FMA).
     * a<r><t> for r < R, t < T; the others are dead and vanish. */
#define ACC_T(X, t) X(0, t) X(1, t) X(2, t) X(3, t)
#define ACC_ALL(X) ACC_T(X, 0) ACC_T(X, 1) ACC_T(X, 2) ACC_T(X, 3) ACC_T(X, 4) ACC_T(X, 5)
#define TOK_STEPS(m) TOK_STEP(0, m) TOK_STEP(1, m) TOK_STEP(2, m) TOK_STEP(3, m) TOK_STEP(4, m) TOK_STEP(5, m)
#define ACC_INIT(r, t) \
    __m512 a##r##t = first || r >= R || t >= T ? _mm512_setzero_ps() : _mm512_loadu_ps(part + ((size_t)t * MR + r) * 16);
    ACC_ALL(ACC_INIT)
#define ACC_FMA(r, t) if (r < R) a##r##t = _mm512_fmadd_ps(w##r, xv, a##r##t);
#define TOK_STEP(t, m)                                                                \
        if (t < T) {                                                                  \
            const __m512 xv = reg512(_mm512_maskz_loadu_ps(m, x + (size_t)t * xs + k)); \
            ACC_T(ACC_FMA, t)                                                         \
        }
#define K_STEP(m)                                                                                           \
    {                                                                                                       \
        const __m512 w0 = reg512(load_w(wk, w, k, m));                                                      \
        const __m512 w1 = R > 1 ? reg512(load_w(wk, w + ws, k, m)) : w0;                                   \
        const __m512 w2 = R > 2 ? reg512(load_w(wk, w + 2 * ws, k, m)) : w0;                               \
        const __m512 w3 = R > 3 ? reg512(load_w(wk, w + 3 * ws, k, m)) : w0;                               \
        TOK_STEPS(m)                                                                                        \
    }
    int64_t k = 0;
    for (; k + 16 <= klen; k += 16) {
        if (pf)   /* the next rows at the pace these are read */
            for (int b = 0; b < MR * 16 * eb; b += 64) _mm_prefetch((const char *)pf + k * MR * eb + b, _MM_HINT_T0);
        K_STEP((__mmask16)0xffff)   /* an all-ones constant mask: plain loads */
    }
    if (k < klen) {   /* the tail: both operands zero-padded */
        const __mmask16 m = (__mmask16)((1u << (klen - k)) - 1);
        K_STEP(m)
    }
    /* The accumulators leave through memory: the parked slots, or a local
     * copy the lanes are combined from. */
    float tmp[NT * MR * 16] __attribute__((aligned(64)));
    float *out = part ? part : tmp;
#define ACC_STORE(r, t) if (r < R && t < T) _mm512_storeu_ps(out + ((size_t)t * MR + r) * 16, a##r##t);
    ACC_ALL(ACC_STORE)
#undef ACC_T
#undef ACC_ALL
#undef ACC_INIT
#undef ACC_FMA
#undef TOK_STEP
#undef TOK_STEPS
#undef K_STEP
#undef ACC_STORE
    if (!last) return;
    for (int t = 0; t < T; t++) {
        const float *o = out + (size_t)t * MR * 16;
        int r = 0;
        for (; r + 4 <= R; r += 4)   /* lane i of avx2_hsum4 is avx2_hsum_pairs of its input, bit for bit */
            _mm_storeu_ps(y + (size_t)t * ys + r,
                          avx2_hsum4(fold16(_mm512_loadu_ps(o + 16 * r)), fold16(_mm512_loadu_ps(o + 16 * r + 16)),
                                     fold16(_mm512_loadu_ps(o + 16 * r + 32)), fold16(_mm512_loadu_ps(o + 16 * r + 48))));
        for (; r < R; r++) y[(size_t)t * ys + r] = avx2_hsum_pairs(fold16(_mm512_loadu_ps(o + 16 * r)));
    }
}

/* Rows [0, nr) x tokens [0, n) (n <= NT) with T = n a constant per case. */
#define TOKENS_SWITCH(R, n, wk, ...)                                      \
    switch (n) {                                                          \
    case 1: micro(R, 1, wk, __VA_ARGS__); break;                          \
    case 2: micro(R, 2, wk, __VA_ARGS__); break;                          \
    case 3: micro(R, 3, wk, __VA_ARGS__); break;                          \
    case 4: micro(R, 4, wk, __VA_ARGS__); break;                          \
    case 5: micro(R, 5, wk, __VA_ARGS__); break;                          \
    default: micro(R, NT, wk, __VA_ARGS__); break;                        \
    }

/* nr (1 .. MR) rows at w x nt (1 .. NT) tokens: see micro. */
ALWAYS_INLINE void tile(enum wkind wk, const uint8_t *w, size_t ws, int nr, const float *x, size_t xs, int nt,
                        int64_t klen, float *part, bool first, bool last, float *y, size_t ys, const uint8_t *pf) {
    if (nr == MR) {
        TOKENS_SWITCH(MR, nt, wk, w, ws, x, xs, klen, part, first, last, y, ys, pf)
        return;
    }
    for (int r = 0; r < nr; r++)
        TOKENS_SWITCH(1, nt, wk, w + (size_t)r * ws, ws, x, xs, klen, part ? part + (size_t)r * 16 : NULL, first,
                      last, y + r, ys, NULL)
}

/* One copy per weight kind (a constant in the hot loop). */
typedef void tile_fn(const uint8_t *w, size_t ws, int nr, const float *x, size_t xs, int nt, int64_t klen,
                     float *part, bool first, bool last, float *y, size_t ys, const uint8_t *pf);
#define TILE_FN(name, kind)                                                                                     \
    static void name(const uint8_t *w, size_t ws, int nr, const float *x, size_t xs, int nt, int64_t klen,      \
                     float *part, bool first, bool last, float *y, size_t ys, const uint8_t *pf) {              \
        tile(kind, w, ws, nr, x, xs, nt, klen, part, first, last, y, ys, pf);                                   \
    }
TILE_FN(tile_f32, WK_F32)
TILE_FN(tile_f16, WK_F16)
TILE_FN(tile_bf16, WK_BF16)

static enum wkind wkind_of(uint32_t type) {
    return type == DTYPE_F16 ? WK_F16 : type == DTYPE_BF16 ? WK_BF16 : WK_F32;
}

/* Elements [k0, k0 + kl) of nr rows at w (stride ws bytes, kind wk) as f32
 * into dst (stride ds floats): the exact widening load_w does. */
static void pack_rows(enum wkind wk, const uint8_t *w, size_t ws, int nr, int64_t k0, int64_t kl, float *dst,
                      size_t ds) {
    for (int r = 0; r < nr; r++) {
        const uint8_t *p = w + (size_t)r * ws;
        float *d = dst + (size_t)r * ds;
        int64_t k = 0;
        for (; k + 16 <= kl; k += 16) _mm512_storeu_ps(d + k, load_w(wk, p, k0 + k, 0xffff));
        if (k < kl) {
            const __mmask16 m = (__mmask16)((1u << (kl - k)) - 1);
            _mm512_mask_storeu_ps(d + k, m, load_w(wk, p, k0 + k, m));
        }
    }
}

/* ---- threads ---- */

struct mm_job {
    struct cpu_ctx *cc;
    float *y;               /* (n, M) */
    const struct tensor *w; /* (M, K) */
    const float *x;         /* (n, K) */
    int n;
    int nc;                 /* tokens per chunk (prefill), a multiple of NT */
    int64_t kc;             /* K block (prefill) */
    long n_row_chunks;
};

/* n <= FEW_N: rows [c * FEW_ROW_CHUNK, ...) for every token, weights in place. */
static void few_chunk(void *arg, long c, int ith) {
    (void)ith;
    const struct mm_job *j = arg;
    const struct tensor *w = j->w;
    const int64_t K = w->ne0, M = w->ne1;
    tile_fn *fn = w->type == DTYPE_F16 ? tile_f16 : w->type == DTYPE_BF16 ? tile_bf16 : tile_f32;
    const int64_t r1 = (c + 1) * FEW_ROW_CHUNK < M ? (c + 1) * FEW_ROW_CHUNK : M;
    for (int64_t r = c * FEW_ROW_CHUNK; r < r1; r += MR) {
        const int nr = (int)(M - r < MR ? M - r : MR);
        const uint8_t *pf = j->n == 1 && r + MR < M ? tensor_row(w, r + MR) : NULL;
        fn(tensor_row(w, r), w->row_bytes, nr, j->x, (size_t)K, j->n, K, NULL, true, true, j->y + r, (size_t)M, pf);
    }
}

/* Prefill: item c is token chunk c / n_row_chunks, row chunk c % n_row_chunks. */
static void pack_chunk(void *arg, long c, int ith) {
    const struct mm_job *j = arg;
    const struct tensor *w = j->w;
    const int64_t K = w->ne0, M = w->ne1, kc = j->kc;
    const int t0 = (int)(c / j->n_row_chunks) * j->nc, t1 = t0 + j->nc < j->n ? t0 + j->nc : j->n;
    const int64_t r0 = (c % j->n_row_chunks) * ROW_CHUNK, r1 = r0 + ROW_CHUNK < M ? r0 + ROW_CHUNK : M;
    /* the panel on the stack, 64-byte aligned (no load splits a cache line);
     * the parked accumulators in the thread's scratch, aligned too */
    float pk[MR * KC_ONE] __attribute__((aligned(64)));
    float *part = j->cc->scratch + (size_t)ith * (size_t)j->cc->scratch_cols;   /* (nc, MR, 16) */
    part += (64 - (uintptr_t)part % 64) % 64 / sizeof(float);
    const enum wkind wk = wkind_of(w->type);
    for (int64_t r = r0; r < r1; r += MR) {
        const int nr = (int)(M - r < MR ? M - r : MR);
        for (int64_t k0 = 0; k0 < K; k0 += kc) {
            const int64_t kl = K - k0 < kc ? K - k0 : kc;
            const bool first = k0 == 0, last = k0 + kl == K;
            pack_rows(wk, tensor_row(w, r), w->row_bytes, nr, k0, kl, pk, (size_t)kc);
            /* The next panel (next K block of these rows, or the next rows'
             * first) into L2 while this one's tiles run: otherwise packing
             * waits on memory (12% of a prefill's time without this). */
            const int64_t nk0 = k0 + kc < K ? k0 + kc : 0, nr0 = k0 + kc < K ? r : r + MR;
            if (nr0 < r1) {
                const int64_t nkl = K - nk0 < kc ? K - nk0 : kc;
                const size_t eb = wk == WK_F32 ? 4 : 2;
                for (int64_t i = nr0; i < nr0 + MR && i < M; i++)
                    for (size_t b = 0; b < (size_t)nkl * eb; b += 64)
                        _mm_prefetch((const char *)tensor_row(w, i) + (size_t)nk0 * eb + b, _MM_HINT_T1);
            }
            for (int t = t0; t < t1; t += NT) {
                const int nt = t1 - t < NT ? t1 - t : NT;
                tile_f32((const uint8_t *)pk, (size_t)kc * sizeof(float), nr, j->x + (size_t)t * K + k0, (size_t)K,
                         nt, kl, first && last ? NULL : part + (size_t)(t - t0) * MR * 16, first, last, j->y + (size_t)t * M + r,
                         (size_t)M, NULL);
            }
        }
    }
}

int cpu_matmul_avx512(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n) {
    struct cpu_ctx *cc = cpu_ctx_of(c);
    const bool mine = w->type == DTYPE_F32 || w->type == DTYPE_F16 || w->type == DTYPE_BF16;
    if (!mine || w->layout != TENSOR_ROWS) return cpu_matmul_simd(c, y, w, x, n);
    const int64_t K = w->ne0, M = w->ne1;
    KV_ASSERT(K * CPU_MM_ROWS <= cc->scratch_cols);   /* the context was made for rows of K */
    struct mm_job j = { cc, y, w, x, n, 0, 0, 0 };
    if (n <= FEW_N) {
        threadpool_run_chunks(cc->pool, (long)((M + FEW_ROW_CHUNK - 1) / FEW_ROW_CHUNK), few_chunk, &j);
        return 0;
    }
    /* Parked accumulators (when K takes several blocks): nc x MR x 16 floats
     * of the thread's scratch (CPU_MM_ROWS rows of K floats), less 16 for
     * alignment. */
    int64_t nc = X_CHUNK_BYTES / (K * (int64_t)sizeof(float));
    if (K <= KC_ONE) j.kc = K;
    else {
        j.kc = KC;
        if (nc > (cc->scratch_cols - 16) / (MR * 16)) nc = (cc->scratch_cols - 16) / (MR * 16);
    }
    nc -= nc % NT;
    if (nc < NT) nc = NT;   /* K > KC_ONE gives room for 40 */
    j.nc = (int)(nc < n ? nc : n);
    j.n_row_chunks = (long)((M + ROW_CHUNK - 1) / ROW_CHUNK);
    const long t_chunks = (n + j.nc - 1) / j.nc;
    threadpool_run_chunks(cc->pool, t_chunks * j.n_row_chunks, pack_chunk, &j);
    return 0;
}

#else /* not an x86-64 build with the AVX-512 flags: the avx512 set falls back to the AVX2 matmul */

bool cpu_mm_avx512_built(void) { return false; }

int cpu_matmul_avx512(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n) {
    return cpu_matmul_simd(c, y, w, x, n);
}

#endif
