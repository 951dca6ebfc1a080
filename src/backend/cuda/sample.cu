/* sample.cu — the sampling stage's draw on the device (backend_ops.sample):
 * the chain of sample/chain.h — top-k -> top-p -> min-p -> temperature ->
 * softmax -> draw with the row's u — one block per row, without sorting.
 *
 * Model: every candidate has an ordinal, (key << 32) | (2^32 - 1 - id), where
 * key is its logit's bits made order-preserving as an unsigned integer, so
 * that ordinals order candidates exactly as the chain's total order does
 * (higher logit, then lower id; -0 is made +0 first, as the float compare
 * sees them equal).  Every set the chain forms is then "ordinal >= a cut",
 * narrowed by min-p's ratio test:
 *   top-k  the k-th largest ordinal, by a radix select (8 passes of 8 bits,
 *          integer histograms in shared memory);
 *   top-p  the largest key whose mass (the weights of the set at or above
 *          it) reaches top_p of the total, by a bitwise search over the 32
 *          key bits, then the candidates of that key in id order;
 *   min-p  expf(l - lmax) >= min_p, tested per candidate, as the chain does;
 *   draw   r = u * z; after a top-k or top-p cut the chain walks its sorted
 *          survivors, so the token is found as top-p's cut is (the largest
 *          key whose mass exceeds r, then ids within it); otherwise the
 *          chain walks ids in order, so the token is found by a block scan
 *          over contiguous runs of ids.
 * Weights are expf in f32, summed in f64, as the chain sums them; but in a
 * tree and per subset rather than one by one, so a draw within ~1e-7 of a
 * CDF boundary (relative to the mass), or a top-p cut that close to its
 * target, may take a neighbour of the CPU's token, and CUDA's expf (2 ulp)
 * may flip a min-p ratio that equals min_p to the last bit.  The per-op
 * harness accepts another token only there (SAMPLE_NEAR_TIE).  Every sum is
 * in a fixed order, so a row's token never depends on the run or the batch.
 *
 * Cost per row: 2 passes (max, greedy), 8 for top-k, 33 plus a scan for
 * top-p, 33 plus a scan for the draw after a cut; each a read of the set
 * and a block reduction.  After a top-k of at most SMP_CAP the survivors
 * are compacted into shared memory, in id order (the walks need it), so the
 * later passes read k candidates, not the row.  Unverified on a GPU
 * (docs/GPU.md). */
#include "backend/cuda/cuda_common.cuh"

#include <float.h>
#include <limits.h>
#include <math.h>

#define SMP_THREADS 512
#define SMP_CAP 2048   /* top-k survivors compacted into shared memory (8 bytes each) */
#define SMP_WARPS (SMP_THREADS / 32)
#define FULL_MASK 0xffffffffu

/* ---- block reductions and scans: fixed order, every thread gets the result ---- */

struct op_add { template <class T> __device__ T operator()(T a, T b) const { return a + b; } };
struct op_min { template <class T> __device__ T operator()(T a, T b) const { return a < b ? a : b; } };
struct op_max { template <class T> __device__ T operator()(T a, T b) const { return a > b ? a : b; } };

template <class T, class Op> __device__ T blk_reduce(T v, T ident, T *red, Op op) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(FULL_MASK, v, o));
    __syncthreads();   /* red may still be read from a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < SMP_WARPS ? red[lane] : ident;
    for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

/* The sum of v over the threads before this one (thread order). */
__device__ double blk_exscan(double v, double *red) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double inc = v;
    for (int o = 1; o < 32; o *= 2) {
        const double t = __shfl_up_sync(FULL_MASK, inc, o);
        if (lane >= o) inc += t;
    }
    double ex = __shfl_up_sync(FULL_MASK, inc, 1);
    if (lane == 0) ex = 0;
    __syncthreads();
    if (lane == 31) red[warp] = inc;   /* warp totals */
    __syncthreads();
    if (warp == 0) {
        double t = lane < SMP_WARPS ? red[lane] : 0, ti = t;
        for (int o = 1; o < 32; o *= 2) {
            const double u = __shfl_up_sync(FULL_MASK, ti, o);
            if (lane >= o) ti += u;
        }
        double before = __shfl_up_sync(FULL_MASK, ti, 1);
        if (lane == 0) before = 0;
        __syncwarp();
        if (lane < SMP_WARPS) red[lane] = before;
    }
    __syncthreads();
    return red[warp] + ex;
}

/* ---- candidates ---- */

__device__ __forceinline__ bool smp_valid(float v) { return !(v != v) && v != -INFINITY; }
/* a valid logit as the chain sees it: +inf is FLT_MAX; -0 is +0 (equal to the compare) */
__device__ __forceinline__ float smp_clamp(float v) { return v == INFINITY ? FLT_MAX : v == 0.0f ? 0.0f : v; }
__device__ __forceinline__ uint32_t smp_key(float l) {
    const uint32_t u = __float_as_uint(l);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ uint64_t smp_ord(uint32_t key, int id) {
    return ((uint64_t)key << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}

/* The set the chain holds so far: valid, ordinal >= cut, and (min-p) a ratio to the max >= min_p;
 * its candidates are the row's, or after a small top-k its survivors compacted in id order. */
struct smp_set {
    const float *x;      /* (len) the row, when cl is NULL */
    const float *cl;     /* (len) the compacted survivors' logits (valid, clamped), in id order */
    const int *cid;      /* (len) their ids */
    int len;
    float lmax;
    uint64_t cut;
    bool minp;
    float min_p;
};

/* Whether candidate j is in s; its logit, key and id when it is. */
__device__ __forceinline__ bool smp_in(const smp_set &s, int j, float *l, uint32_t *key, int *id) {
    if (s.cl) {
        *l = s.cl[j];
        *id = s.cid[j];
    } else {
        const float v = s.x[j];
        if (!smp_valid(v)) return false;
        *l = smp_clamp(v);
        *id = j;
    }
    *key = smp_key(*l);
    if (smp_ord(*key, *id) < s.cut) return false;
    return !s.minp || expf(*l - s.lmax) >= s.min_p;
}

/* The weight the chain gives l at temperature t (1 for top-p): a division, as the chain divides. */
__device__ __forceinline__ float smp_w(const smp_set &s, float l, float t) { return expf((l - s.lmax) / t); }

__device__ int smp_count(const smp_set &s, int *ired) {
    int n = 0, id;
    float l;
    uint32_t key;
    for (int j = threadIdx.x; j < s.len; j += SMP_THREADS) n += smp_in(s, j, &l, &key, &id);
    return blk_reduce(n, 0, ired, op_add());
}

/* The mass of the set's candidates with key >= kmin at temperature t. */
__device__ double smp_mass(const smp_set &s, uint32_t kmin, float t, double *dred) {
    double m = 0;
    float l;
    uint32_t key;
    int id;
    for (int j = threadIdx.x; j < s.len; j += SMP_THREADS)
        if (smp_in(s, j, &l, &key, &id) && key >= kmin) m += smp_w(s, l, t);
    return blk_reduce(m, 0.0, dred, op_add());
}

/* The largest key whose mass reaches thr (strict: exceeds it); 0 when none does. */
__device__ uint32_t smp_key_at(const smp_set &s, float t, double thr, bool strict, double *dred) {
    uint32_t k = 0;
    for (int b = 31; b >= 0; b--) {
        const uint32_t c = k | (1u << b);
        const double m = smp_mass(s, c, t, dred);
        if (strict ? m > thr : m >= thr) k = c;
    }
    return k;
}

/* Walking the set in id order (only key `only` unless any_key), from mass base: the id of the first
 * candidate where the running mass reaches thr (strict: exceeds it, and weighs something); when
 * rounding leaves it short, of the last candidate walked that weighs something (any, for top-p).
 * Each thread walks a contiguous run, so thread order is id order. */
__device__ int smp_walk(const smp_set &s, bool any_key, uint32_t only, float t, double base, double thr,
                        bool strict, double *dred, int *ired) {
    const int chunk = (s.len + SMP_THREADS - 1) / SMP_THREADS;
    const int lo = threadIdx.x * chunk, hi = min(s.len, lo + chunk);
    float l;
    uint32_t key;
    int id;
    double part = 0;
    for (int j = lo; j < hi; j++)
        if (smp_in(s, j, &l, &key, &id) && (any_key || key == only)) part += smp_w(s, l, t);
    double cum = base + blk_exscan(part, dred);
    int found = INT_MAX, last = -1;
    for (int j = lo; j < hi && found == INT_MAX; j++) {
        if (!smp_in(s, j, &l, &key, &id) || !(any_key || key == only)) continue;
        const float w = smp_w(s, l, t);
        if (strict && w <= 0.0f) continue;
        cum += w;
        last = id;
        if (strict ? cum > thr : cum >= thr) found = id;
    }
    found = blk_reduce(found, INT_MAX, ired, op_min());
    last = blk_reduce(last, -1, ired, op_max());
    return found != INT_MAX ? found : last;
}

/* The k-th largest ordinal of the row's valid candidates (1 <= k <= their count). */
__device__ uint64_t smp_kth(const smp_set &s, int k, unsigned *hist, uint64_t *bc, int *bk) {
    uint64_t prefix = 0;
    int rem = k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        const uint64_t hi = shift == 56 ? 0 : ~((1ull << (shift + 8)) - 1);   /* the digits decided */
        for (int b = threadIdx.x; b < 256; b += SMP_THREADS) hist[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < s.len; i += SMP_THREADS) {
            const float v = s.x[i];
            if (!smp_valid(v)) continue;
            const uint64_t o = smp_ord(smp_key(smp_clamp(v)), i);
            if ((o & hi) == (prefix & hi)) atomicAdd(&hist[(o >> shift) & 255], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int b = 255; b >= 0; b--) {
                if ((int)hist[b] >= rem) { prefix |= (uint64_t)b << shift; break; }
                rem -= (int)hist[b];
            }
            *bc = prefix;
            *bk = rem;
        }
        __syncthreads();
        prefix = *bc;
        rem = *bk;
    }
    return prefix;
}

/* The set's members (n of them, at most SMP_CAP), from the row into cl / cid in id order. */
__device__ void smp_compact(smp_set &s, int n, float *cl, int *cid, double *dred) {
    const int chunk = (s.len + SMP_THREADS - 1) / SMP_THREADS;
    const int lo = threadIdx.x * chunk, hi = min(s.len, lo + chunk);
    float l;
    uint32_t key;
    int id, cnt = 0;
    for (int j = lo; j < hi; j++) cnt += smp_in(s, j, &l, &key, &id);
    int at = (int)blk_exscan((double)cnt, dred);   /* exact: counts far below 2^53 */
    for (int j = lo; j < hi; j++)
        if (smp_in(s, j, &l, &key, &id)) {
            cl[at] = l;
            cid[at] = id;
            at++;
        }
    __syncthreads();
    s.cl = cl;
    s.cid = cid;
    s.len = n;
}

__global__ void __launch_bounds__(SMP_THREADS) k_sample(int32_t *ids, const float *x,
                                                        const struct sample_chain *rows, int dim) {
    __shared__ double dred[SMP_WARPS];
    __shared__ float fred[SMP_WARPS];
    __shared__ int ired[SMP_WARPS];
    __shared__ unsigned hist[256];
    __shared__ uint64_t bc;
    __shared__ int bk;
    __shared__ float cl[SMP_CAP];
    __shared__ int cid[SMP_CAP];
    const struct sample_chain p = rows[blockIdx.x];
    smp_set s = { x + (size_t)blockIdx.x * dim, NULL, NULL, dim, -INFINITY, 0, false, p.min_p };

    float m = -INFINITY;
    int n = 0;
    for (int i = threadIdx.x; i < dim; i += SMP_THREADS) {
        const float v = s.x[i];
        if (smp_valid(v)) { m = fmaxf(m, smp_clamp(v)); n++; }
    }
    s.lmax = blk_reduce(m, -INFINITY, fred, op_max());
    n = blk_reduce(n, 0, ired, op_add());
    if (n == 0) {   /* nothing valid */
        if (threadIdx.x == 0) ids[blockIdx.x] = -1;
        return;
    }
    if (!(p.temperature > 0.0f)) {   /* greedy: the lowest id holding the max */
        int best = INT_MAX;
        for (int i = threadIdx.x; i < dim && best == INT_MAX; i += SMP_THREADS)
            if (smp_valid(s.x[i]) && smp_clamp(s.x[i]) == s.lmax) best = i;
        best = blk_reduce(best, INT_MAX, ired, op_min());
        if (threadIdx.x == 0) ids[blockIdx.x] = best;
        return;
    }

    bool sorted = false;   /* the chain walks its survivors in order (else in id order) */
    if (p.top_k > 0 && p.top_k < n) {
        s.cut = smp_kth(s, p.top_k, hist, &bc, &bk);
        n = p.top_k;
        sorted = true;
        if (n <= SMP_CAP) smp_compact(s, n, cl, cid, dred);
    }
    if (p.top_p < 1.0f && n > 1) {
        const double target = (double)p.top_p * smp_mass(s, 0, 1.0f, dred);
        const uint32_t k = smp_key_at(s, 1.0f, target, false, dred);
        if (k) {   /* else rounding left the whole set short of the target: the chain keeps all */
            const double above = smp_mass(s, k + 1, 1.0f, dred);
            s.cut = smp_ord(k, smp_walk(s, false, k, 1.0f, above, target, false, dred, ired));
        }
        n = smp_count(s, ired);
        sorted = true;
    }
    s.minp = p.min_p > 0.0f && n > 1;

    const float t = p.temperature;
    const double r = (double)p.u * smp_mass(s, 0, t, dred);
    int id;
    if (sorted) {
        const uint32_t k = smp_key_at(s, t, r, true, dred);   /* >= 1: the max weighs 1 and r < z */
        id = smp_walk(s, false, k, t, smp_mass(s, k + 1, t, dred), r, true, dred, ired);
    } else {
        id = smp_walk(s, true, 0, t, 0.0, r, true, dred, ired);
    }
    if (threadIdx.x == 0) ids[blockIdx.x] = id;
}

extern "C" cudaError_t cuk_sample(cudaStream_t s, int32_t *ids, const float *x, const struct sample_chain *rows,
                                  int n, int dim) {
    if (n <= 0 || dim <= 0) return cudaSuccess;
    k_sample<<<n, SMP_THREADS, 0, s>>>(ids, x, rows, dim);
    return CU_LAUNCH_CHECK();
}
