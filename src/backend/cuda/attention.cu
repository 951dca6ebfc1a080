/* attention.cu — paged attention on the GPU, correct first: the scalar
 * kernel's model of the world (kv_kernels.c) with a thread block per
 * (split, kv head, token).
 *
 * Token t attends positions lo .. L-1 (L = pos[t] + 1, lo > 0 only under a
 * sliding window), cut into splits at multiples of PAGED_ATTN_SPLIT as the
 * CPU cuts them (depending on L alone, never on the batch).  The block of
 * (s, hk, t) holds the g = n_head / n_head_kv query heads of kv head hk in
 * shared memory and walks its split in tiles of CUDA_ATTN_TILE positions:
 * the tile's K and V rows are gathered through the block table and widened
 * to f32 once for all g heads (GQA: one K/V read per group), then each warp
 * takes heads i = warp, warp + CUDA_ATTN_WARPS, ...: lane j scores position
 * j, the warp updates the head's running max m, sum l and accumulator acc
 * (online softmax, FlashAttention-style, rescaled once per tile), lanes
 * owning dimensions d = lane, lane + 32, ...  A single split writes the
 * normalized output; several write (m, l, acc) partials that a merge kernel
 * combines in ascending split order with a log-sum-exp (flash-decoding).
 *
 * That generic kernel serves any head_dim; head_dim 64, 128 and 256 go to
 * the head-size kernels below (compile-time sizes, 16-byte loads, the block
 * table read once per KV block, partitions of CUDA_ATTN_PART).
 *
 * Positions are read from device memory, so a bad one (outside [0,
 * max_ctx), or past the block table) is recorded in err for sync to report;
 * that token's output is left as it was. */
#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/cuda/cuda_plan.h"
}

#include <math.h>

#define TILE CUDA_ATTN_TILE
#define WARPS CUDA_ATTN_WARPS

__global__ void __launch_bounds__(WARPS * 32) k_attn(struct paged_attn_args a, float *partials, int s_max,
                                                     int max_ctx, int *err) {
    extern __shared__ float sm[];
    const int s = blockIdx.x, hk = blockIdx.y, t = blockIdx.z;
    const int hd = a.head_dim, g = a.n_head / a.n_head_kv, bs = a.kv.block_size;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int pos = a.pos[t];
    if (pos < 0 || pos >= max_ctx) {
        if (s == 0 && hk == 0 && threadIdx.x == 0) cu_report(err, CUDA_DEV_ATTN_POS, pos);
        return;
    }
    const int L = pos + 1, ns = (L - 1) / PAGED_ATTN_SPLIT + 1;
    if (s >= ns) return;
    if ((L - 1) / bs >= a.max_blocks) {
        if (s == 0 && hk == 0 && threadIdx.x == 0) cu_report(err, CUDA_DEV_ATTN_BLOCK, pos);
        return;
    }
    const int lo = a.window > 0 && L > a.window ? L - a.window : 0;
    const int s0 = s * PAGED_ATTN_SPLIT;
    const int p1 = L - s0 < PAGED_ATTN_SPLIT ? L : s0 + PAGED_ATTN_SPLIT, p0 = s0 > lo ? s0 : lo;

    /* shared memory, as cuda_attn_smem_bytes counts it */
    const int kst = hd + 1;                       /* K/V tile row stride: lanes read rows, not banks */
    float *q_s = sm;                              /* (g, hd) */
    float *acc_s = q_s + g * hd;                  /* (g, hd) */
    float *m_s = acc_s + g * hd;                  /* (g) */
    float *l_s = m_s + g;                         /* (g) */
    float *k_s = l_s + g;                         /* (TILE, kst) */
    float *v_s = k_s + TILE * kst;                /* (TILE, kst) */
    float *ks_s = v_s + TILE * kst;               /* (TILE): K scale * softmax scale */
    float *vs_s = ks_s + TILE;                    /* (TILE): V scale */
    float *pw_s = vs_s + TILE;                    /* (WARPS, TILE): weights of the tile */

    const float *q = a.q + ((size_t)t * a.n_head + (size_t)hk * g) * hd;
    for (int i = threadIdx.x; i < g * hd; i += blockDim.x) {
        q_s[i] = q[i];
        acc_s[i] = 0.0f;
    }
    for (int i = threadIdx.x; i < g; i += blockDim.x) {
        m_s[i] = -INFINITY;
        l_s[i] = 0.0f;
    }
    const int32_t *table = a.block_table + (size_t)a.seq[t] * a.max_blocks;
    const int type = a.kv.type;
    const bool q8 = type == KV_INT8 || type == KV_FP8;
    __syncthreads();

    for (int c = p0; c < p1; c += TILE) {
        const int nt = p1 - c < TILE ? p1 - c : TILE;
        for (int idx = threadIdx.x; idx < nt * hd; idx += blockDim.x) {
            const int j = idx / hd, d = idx % hd, p = c + j;
            const size_t row = cu_kv_row(a.kv, (size_t)table[p / bs] * bs + p % bs, hk);
            k_s[j * kst + d] = cu_kv_load(type, a.kv.k, row * hd + d);
            v_s[j * kst + d] = cu_kv_load(type, a.kv.v, row * hd + d);
        }
        for (int j = threadIdx.x; j < nt; j += blockDim.x) {
            const int p = c + j;
            const size_t row = cu_kv_row(a.kv, (size_t)table[p / bs] * bs + p % bs, hk);
            ks_s[j] = q8 ? a.kv.k_scale[row] * a.scale : a.scale;
            vs_s[j] = q8 ? a.kv.v_scale[row] : 1.0f;
        }
        __syncthreads();
        for (int i = warp; i < g; i += WARPS) {
            float sc = -INFINITY;
            if (lane < nt) {
                const float *qi = q_s + i * hd, *kr = k_s + lane * kst;
                float dot = 0.0f;
                for (int e = 0; e < hd; e++) dot = fmaf(qi[e], kr[e], dot);
                sc = dot * ks_s[lane];
                if (a.softcap > 0) sc = a.softcap * tanhf(sc / a.softcap);
            }
            const float m_old = m_s[i];
            const float m_new = fmaxf(m_old, cu_warp_max(sc));
            const float corr = expf(m_old - m_new);           /* first tile: exp(-inf) = 0 */
            const float p = lane < nt ? expf(sc - m_new) : 0.0f;
            const float psum = cu_warp_sum(p);
            pw_s[warp * TILE + lane] = lane < nt ? p * vs_s[lane] : 0.0f;
            __syncwarp();
            for (int d = lane; d < hd; d += 32) {
                float av = acc_s[i * hd + d] * corr;
                for (int j = 0; j < nt; j++) av = fmaf(pw_s[warp * TILE + j], v_s[j * kst + d], av);
                acc_s[i * hd + d] = av;
            }
            __syncwarp();
            if (lane == 0) {
                m_s[i] = m_new;
                l_s[i] = l_s[i] * corr + psum;
            }
            __syncwarp();
        }
        __syncthreads();
    }

    for (int i = warp; i < g; i += WARPS) {
        const int h = hk * g + i;
        if (ns == 1) {   /* a sink joins as one more partial (m = sinks[h], l = 1, acc = 0) */
            const float m = a.sinks ? fmaxf(m_s[i], a.sinks[h]) : m_s[i], c = expf(m_s[i] - m);
            const float inv = c / (l_s[i] * c + (a.sinks ? expf(a.sinks[h] - m) : 0.0f));
            float *out = a.out + ((size_t)t * a.n_head + h) * hd;
            for (int d = lane; d < hd; d += 32) out[d] = acc_s[i * hd + d] * inv;
        } else {
            float *pp = partials + (((size_t)t * a.n_head + h) * s_max + s) * (size_t)(hd + 2);
            if (lane == 0) {
                pp[0] = m_s[i];
                pp[1] = l_s[i];
            }
            for (int d = lane; d < hd; d += 32) pp[2 + d] = acc_s[i * hd + d];
        }
    }
}

/* Token t, head h: combine its splits' partials in ascending order (pa_merge in kv_kernels.c). */
__global__ void k_attn_merge(struct paged_attn_args a, const float *partials, int s_max, int max_ctx) {
    const int t = blockIdx.x, h = blockIdx.y, hd = a.head_dim;
    const int pos = a.pos[t];
    if (pos < 0 || pos >= max_ctx || (pos / a.kv.block_size) >= a.max_blocks) return;
    const int ns = pos / PAGED_ATTN_SPLIT + 1;
    if (ns == 1) return;
    const size_t ps = (size_t)hd + 2;
    const float *p0 = partials + ((size_t)t * a.n_head + h) * s_max * ps;
    float m = a.sinks ? a.sinks[h] : -INFINITY, l = 0.0f;   /* a sink: one more partial (sinks[h], 1, 0) */
    for (int s = 0; s < ns; s++) m = fmaxf(m, p0[s * ps]);
    if (a.sinks) l = expf(a.sinks[h] - m);
    for (int s = 0; s < ns; s++) l += p0[s * ps + 1] * expf(p0[s * ps] - m);
    const float inv = 1.0f / l;
    float *out = a.out + ((size_t)t * a.n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < ns; s++) o = fmaf(expf(p0[s * ps] - m), p0[s * ps + 2 + d], o);
        out[d] = o * inv;
    }
}

/* ---- the head-size kernels: head_dim and KV type at compile time ----
 *
 * k_attn_hd<HD, KVT> is k_attn's algorithm (a block per (partition, kv head,
 * token), the g query heads of the kv head sharing each K/V tile, online
 * softmax per tile, a warp per head) with what costs k_attn its bandwidth
 * taken out of the loop:
 *   - the partitions are cuda_plan.h's (CUDA_ATTN_PART positions from the
 *     start of the token's own span), so a short context has few blocks
 *     with work and a long one many, whatever the batch;
 *   - a tile's rows are found once per KV block: warp 0's lane j follows
 *     position c + j as (block, offset), advanced by a constant per tile (no
 *     division in the loop), the lane that starts a KV block (or lane 0)
 *     reads the block table, and the others take the id by a shuffle;
 *   - K and V rows are read as 16-byte vectors (4 f32, 8 f16/bf16, 16
 *     int8/fp8 values) and widened with the type known at compile time;
 *   - head_dim is a constant: the dot products and each lane's HD / 32
 *     output dimensions unroll.
 * The combine (k_attn_merge_hd) adds a token's partials in ascending
 * partition order, so the result depends on the token's span alone. */

template <int KVT> struct kv_t {
    static constexpr int bytes = KVT == KV_F32 ? 4 : KVT == KV_F16 || KVT == KV_BF16 ? 2 : 1;
    static constexpr int vec = 16 / bytes;          /* values per 16-byte load */
    static constexpr bool scaled = KVT == KV_INT8 || KVT == KV_FP8;
};

/* Values e .. e + vec - 1 of K or V storage (e a multiple of vec; 16-byte aligned) as f32 into dst
 * (8-bit types: the codes, unscaled), each as cu_kv_load converts it. */
template <int KVT>
__device__ __forceinline__ void kv_load_vec(const void *base, size_t e, float *dst) {
    const uint4 u = *(const uint4 *)(const void *)((const uint8_t *)base + e * kv_t<KVT>::bytes);
    const uint32_t w[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (KVT == KV_F32) {
            dst[i] = cu_bits_f32(w[i]);
        } else if (KVT == KV_F16 || KVT == KV_BF16) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint16_t x = (uint16_t)(w[i] >> (16 * h));
                dst[2 * i + h] = KVT == KV_F16 ? cu_f16_to_f32(x) : cu_bf16_to_f32(x);
            }
        } else {
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const uint8_t x = (uint8_t)(w[i] >> (8 * b));
                dst[4 * i + b] = KVT == KV_INT8 ? (float)(int8_t)x : cu_fp8_to_f32(x);
            }
        }
    }
}

template <int HD, int KVT>
__global__ void __launch_bounds__(WARPS * 32) k_attn_hd(struct paged_attn_args a, float *partials, int s_grid,
                                                        int max_ctx, int *err) {
    constexpr int VEC = kv_t<KVT>::vec, CH = HD / VEC, KST = HD + 1;
    extern __shared__ float sm[];
    const int s = blockIdx.x, hk = blockIdx.y, t = blockIdx.z;
    const int g = a.n_head / a.n_head_kv, bs = a.kv.block_size, nkv = a.n_head_kv;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int pos = a.pos[t];
    if (pos < 0 || pos >= max_ctx) {
        if (s == 0 && hk == 0 && threadIdx.x == 0) cu_report(err, CUDA_DEV_ATTN_POS, pos);
        return;
    }
    const int L = pos + 1;
    if ((L - 1) / bs >= a.max_blocks) {
        if (s == 0 && hk == 0 && threadIdx.x == 0) cu_report(err, CUDA_DEV_ATTN_BLOCK, pos);
        return;
    }
    const int lo = a.window > 0 && L > a.window ? L - a.window : 0, span = L - lo;
    const int part = cuda_attn_part(span), ns = cuda_attn_nsplit(span);
    if (s >= ns) return;
    const int p0 = lo + s * part, p1 = L - p0 < part ? L : p0 + part;

    /* shared memory, as cuda_attn_hd_smem_bytes counts it (rows first: 8-byte aligned) */
    int64_t *rows_s = (int64_t *)(void *)sm;          /* (TILE): storage row of the tile's positions */
    float *q_s = sm + 2 * TILE;                       /* (g, HD) */
    float *acc_s = q_s + g * HD;                      /* (g, HD) */
    float *m_s = acc_s + g * HD;                      /* (g) */
    float *l_s = m_s + g;                             /* (g) */
    float *k_s = l_s + g;                             /* (TILE, KST) */
    float *v_s = k_s + TILE * KST;                    /* (TILE, KST) */
    float *ks_s = v_s + TILE * KST;                   /* (TILE): K scale * softmax scale */
    float *vs_s = ks_s + TILE;                        /* (TILE): V scale */
    float *pw_s = vs_s + TILE;                        /* (WARPS, TILE): weights of the tile */

    const float *q = a.q + ((size_t)t * a.n_head + (size_t)hk * g) * HD;
    for (int i = threadIdx.x; i < g * HD; i += blockDim.x) {
        q_s[i] = q[i];
        acc_s[i] = 0.0f;
    }
    for (int i = threadIdx.x; i < g; i += blockDim.x) {
        m_s[i] = -INFINITY;
        l_s[i] = 0.0f;
    }
    const int32_t *table = a.block_table + (size_t)a.seq[t] * a.max_blocks;
    /* warp 0, lane j: position c + j of the current tile as (KV block, offset) (cuda_plan.h) */
    struct cuda_attn_walk wk = cuda_attn_walk_start(p0, lane, bs);
    __syncthreads();

    for (int c = p0; c < p1; c += TILE) {
        const int nt = p1 - c < TILE ? p1 - c : TILE;
        if (warp == 0) {
            int phys = 0;
            if (lane < nt && cuda_attn_walk_reads(wk, lane)) phys = table[wk.blk];
            phys = __shfl_sync(0xffffffffu, phys, cuda_attn_walk_src(wk, lane));
            if (lane < nt) {
                const int64_t row = ((int64_t)phys * nkv + hk) * bs + wk.off;
                rows_s[lane] = row;
                ks_s[lane] = kv_t<KVT>::scaled ? a.kv.k_scale[row] * a.scale : a.scale;
                vs_s[lane] = kv_t<KVT>::scaled ? a.kv.v_scale[row] : 1.0f;
            }
            cuda_attn_walk_next(&wk, TILE, bs);
        }
        __syncthreads();
#pragma unroll 4
        for (int idx = threadIdx.x; idx < nt * CH; idx += blockDim.x) {   /* 4 rows' loads in flight per thread */
            const int j = idx / CH, v = idx % CH;     /* CH a power of two: shifts */
            const size_t e = (size_t)rows_s[j] * HD + (size_t)v * VEC;
            float kf[VEC], vf[VEC];
            kv_load_vec<KVT>(a.kv.k, e, kf);
            kv_load_vec<KVT>(a.kv.v, e, vf);
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                k_s[j * KST + v * VEC + i] = kf[i];
                v_s[j * KST + v * VEC + i] = vf[i];
            }
        }
        __syncthreads();
        for (int i = warp; i < g; i += WARPS) {
            float sc = -INFINITY;
            if (lane < nt) {
                const float *qi = q_s + i * HD, *kr = k_s + lane * KST;
                float dot = 0.0f;
#pragma unroll 16
                for (int e = 0; e < HD; e++) dot = fmaf(qi[e], kr[e], dot);
                sc = dot * ks_s[lane];
                if (a.softcap > 0) sc = a.softcap * tanhf(sc / a.softcap);
            }
            const float m_old = m_s[i];
            const float m_new = fmaxf(m_old, cu_warp_max(sc));
            const float corr = expf(m_old - m_new);           /* first tile: exp(-inf) = 0 */
            const float p = lane < nt ? expf(sc - m_new) : 0.0f;
            const float psum = cu_warp_sum(p);
            pw_s[warp * TILE + lane] = lane < nt ? p * vs_s[lane] : 0.0f;
            __syncwarp();
#pragma unroll
            for (int k = 0; k < HD / 32; k++) {
                const int d = lane + 32 * k;
                float av = acc_s[i * HD + d] * corr;
                for (int j = 0; j < nt; j++) av = fmaf(pw_s[warp * TILE + j], v_s[j * KST + d], av);
                acc_s[i * HD + d] = av;
            }
            __syncwarp();
            if (lane == 0) {
                m_s[i] = m_new;
                l_s[i] = l_s[i] * corr + psum;
            }
            __syncwarp();
        }
        __syncthreads();
    }

    for (int i = warp; i < g; i += WARPS) {
        const int h = hk * g + i;
        if (ns == 1) {   /* a sink joins as one more partial (m = sinks[h], l = 1, acc = 0) */
            const float m = a.sinks ? fmaxf(m_s[i], a.sinks[h]) : m_s[i], c = expf(m_s[i] - m);
            const float inv = c / (l_s[i] * c + (a.sinks ? expf(a.sinks[h] - m) : 0.0f));
            float *out = a.out + ((size_t)t * a.n_head + h) * HD;
#pragma unroll
            for (int k = 0; k < HD / 32; k++) out[lane + 32 * k] = acc_s[i * HD + lane + 32 * k] * inv;
        } else {
            float *pp = partials + (((size_t)t * a.n_head + h) * s_grid + s) * (size_t)(HD + 2);
            if (lane == 0) {
                pp[0] = m_s[i];
                pp[1] = l_s[i];
            }
#pragma unroll
            for (int k = 0; k < HD / 32; k++) pp[2 + lane + 32 * k] = acc_s[i * HD + lane + 32 * k];
        }
    }
}

/* Token t, head h: its partitions' partials combined in ascending order, as k_attn_merge. */
__global__ void k_attn_merge_hd(struct paged_attn_args a, const float *partials, int s_grid, int max_ctx) {
    const int t = blockIdx.x, h = blockIdx.y, hd = a.head_dim;
    const int pos = a.pos[t];
    if (pos < 0 || pos >= max_ctx || (pos / a.kv.block_size) >= a.max_blocks) return;
    const int L = pos + 1, lo = a.window > 0 && L > a.window ? L - a.window : 0;
    const int ns = cuda_attn_nsplit(L - lo);
    if (ns == 1) return;
    const size_t ps = (size_t)hd + 2;
    const float *p0 = partials + ((size_t)t * a.n_head + h) * s_grid * ps;
    float m = a.sinks ? a.sinks[h] : -INFINITY, l = 0.0f;   /* a sink: one more partial (sinks[h], 1, 0) */
    for (int s = 0; s < ns; s++) m = fmaxf(m, p0[s * ps]);
    if (a.sinks) l = expf(a.sinks[h] - m);
    for (int s = 0; s < ns; s++) l += p0[s * ps + 1] * expf(p0[s * ps] - m);
    const float inv = 1.0f / l;
    float *out = a.out + ((size_t)t * a.n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < ns; s++) o = fmaf(expf(p0[s * ps] - m), p0[s * ps + 2 + d], o);
        out[d] = o * inv;
    }
}

/* The instances: KV types x head sizes, as a table the setup and the launcher share. */
typedef void (*attn_hd_fn)(struct paged_attn_args, float *, int, int, int *);
#define HD_ROW(HD) { k_attn_hd<HD, KV_F32>, k_attn_hd<HD, KV_F16>, k_attn_hd<HD, KV_BF16>, k_attn_hd<HD, KV_INT8>, \
                     k_attn_hd<HD, KV_FP8> }
static const attn_hd_fn k_attn_hd_fns[3][KV_TYPE_COUNT_] = { HD_ROW(64), HD_ROW(128), HD_ROW(256) };
#undef HD_ROW

static attn_hd_fn attn_hd_fn_for(int head_dim, int type) {
    const int i = cu_head_size_row(head_dim);
    return i < 0 || type < 0 || type >= KV_TYPE_COUNT_ ? NULL : k_attn_hd_fns[i][type];
}

extern "C" bool cuk_attention_hd_takes(const struct paged_attn_args *a) {
    /* 16-byte loads: every row starts at a multiple of head_dim values, 16-byte aligned for these
     * head sizes whenever the storage is */
    return cuda_attn_hd_kernel(a->head_dim) && attn_hd_fn_for(a->head_dim, a->kv.type) &&
           (uintptr_t)a->kv.k % 16 == 0 && (uintptr_t)a->kv.v % 16 == 0;
}

extern "C" cudaError_t cuk_attention_setup(size_t smem_bytes) {
    cudaError_t e = cudaFuncSetAttribute(k_attn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes);
    for (int i = 0; i < 3 && e == cudaSuccess; i++)
        for (int k = 0; k < KV_TYPE_COUNT_ && e == cudaSuccess; k++)
            e = cudaFuncSetAttribute(k_attn_hd_fns[i][k], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem_bytes);
    return e;
}

extern "C" cudaError_t cuk_paged_attention(cudaStream_t s, int *err, const struct paged_attn_args *a,
                                           float *partials, int max_ctx) {
    if (a->n_tokens <= 0) return cudaSuccess;
    const int g = a->n_head / a->n_head_kv;
    /* the grid is sized for the step's longest context when the caller says it (every token's partitions
     * depend on its own span alone, so a smaller grid changes no result); positions past max_ctx are
     * still reported by the kernels */
    const int hi = a->ctx_hi > 0 && a->ctx_hi < max_ctx ? a->ctx_hi : max_ctx;
    if (cuk_attention_hd_takes(a)) {
        const int s_grid = cuda_attn_grid_splits(hi);
        const size_t smem = cuda_attn_hd_smem_bytes(g, a->head_dim, TILE, WARPS);
        const dim3 grid((unsigned)s_grid, (unsigned)a->n_head_kv, (unsigned)a->n_tokens);
        attn_hd_fn_for(a->head_dim, a->kv.type)<<<grid, WARPS * 32, smem, s>>>(*a, partials, s_grid, max_ctx, err);
        cudaError_t e = CU_LAUNCH_CHECK();
        if (e != cudaSuccess || s_grid == 1) return e;
        k_attn_merge_hd<<<dim3((unsigned)a->n_tokens, (unsigned)a->n_head), 128, 0, s>>>(*a, partials, s_grid,
                                                                                          max_ctx);
        return CU_LAUNCH_CHECK();
    }
    const int s_max = cuda_attn_splits(hi);
    const size_t smem = cuda_attn_smem_bytes(g, a->head_dim, TILE, WARPS);
    const dim3 grid((unsigned)s_max, (unsigned)a->n_head_kv, (unsigned)a->n_tokens);
    k_attn<<<grid, WARPS * 32, smem, s>>>(*a, partials, s_max, max_ctx, err);
    cudaError_t e = CU_LAUNCH_CHECK();
    if (e != cudaSuccess || s_max == 1) return e;
    k_attn_merge<<<dim3((unsigned)a->n_tokens, (unsigned)a->n_head), 128, 0, s>>>(*a, partials, s_max, max_ctx);
    return CU_LAUNCH_CHECK();
}
