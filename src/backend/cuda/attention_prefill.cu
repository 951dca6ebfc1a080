/* attention_prefill.cu — paged attention for steps of many query tokens,
 * FlashAttention-2 style on tensor cores.  Checked on an H200 (docs/GPU.md).
 *
 * Model of the world.  The step's query rows are the pairs (token t, query
 * head i of kv head hk), flattened as R = t * g + i (g = n_head / n_head_kv:
 * the GQA group shares every K/V tile).  A block of CUDA_PF_WARPS warps takes
 * CUDA_PF_ROWS consecutive rows of one kv head (grid: row tiles x kv heads);
 * warp w owns rows 16w .. 16w + 15, the M of its mma.sync.m16n8k16 tiles.
 *
 * The rows of a tile may belong to several sequences (tokens in any order):
 * the block takes its sequences one after another, ascending by id, and for
 * each walks the K/V positions its rows of that sequence attend, in tiles of
 * BN = CUDA_PF_KV_TILE(HD) positions aligned to multiples of BN.  Per tile:
 *   1. the block table is read once per KV block the tile touches (the lane
 *      at a block's first position, or the tile's first lane: cuda_plan.h's
 *      walk, tested on the host), the others take the id from shared memory;
 *   2. K rows and V rows (transposed, so that P·V's B fragments are two
 *      adjacent 16-bit values) go to shared memory as the MMA's 16-bit type:
 *      f16 and bf16 storage as it is, f32 / int8 / fp8 converted to f16 with
 *      the row's scale applied; positions outside the sequence's span zeros;
 *   3. each warp: S = Q Kᵀ (Q pre-scaled by the softmax scale, in f16 or
 *      bf16, K tile), soft-cap, the row's causal / window / sequence mask,
 *      online softmax in registers (running max m, per-thread sum l, the
 *      output accumulators rescaled), then O += P V with P rounded to the
 *      16-bit type straight from the score registers (FA2's register reuse).
 * A row's arithmetic depends on its own query, span and K/V alone: tiles it
 * does not attend leave its state exactly as it was (corr = 1, p = 0), so it
 * does not matter which rows share its block.  At the end a sink joins the
 * softmax as attention.cu's kernels add it; the row is normalized and stored.
 *
 * Against the f32 kernels the inputs of both products are rounded to 16
 * bits (f16: 2^-11, bf16: 2^-8 relative): test_backend_ops holds the CUDA
 * backend to k_pa_prefill there.  Bad positions are recorded in err as the
 * decode kernels record them; such a row's output is left as it was. */
#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/cuda/cuda_plan.h"
}

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>

#define ROWS CUDA_PF_ROWS
#define WARPS CUDA_PF_WARPS
#define PAD CUDA_PF_PAD

template <bool BF> __device__ __forceinline__ uint16_t pf_16(float x) {
    return BF ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
}
/* Two values as one register of the MMA: the lower column in the low half. */
template <bool BF> __device__ __forceinline__ uint32_t pf_pack(float lo, float hi) {
    return (uint32_t)pf_16<BF>(lo) | (uint32_t)pf_16<BF>(hi) << 16;
}

/* d (16 x 8, f32) += a (16 x 16) · b (16 x 8), 16-bit inputs (PTX ISA: mma.m16n8k16 fragments). */
template <bool BF>
__device__ __forceinline__ void pf_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if (BF)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int KVT> struct pf_kv {
    static constexpr int bytes = KVT == KV_F32 ? 4 : KVT == KV_F16 || KVT == KV_BF16 ? 2 : 1;
    static constexpr int vec = 16 / bytes;          /* values per 16-byte load */
    static constexpr bool raw = KVT == KV_F16 || KVT == KV_BF16;   /* already the MMA's type */
};

/* Values e .. e + vec - 1 of K or V storage (16-byte aligned) as the MMA's 16-bit type: the 16-bit
 * types' bits as they are, the others' values times sc (the row's scale for int8 / fp8, else 1). */
template <int KVT, bool BF>
__device__ __forceinline__ void pf_load(const void *base, size_t e, float sc, uint16_t *dst) {
    const uint4 u = *(const uint4 *)(const void *)((const uint8_t *)base + e * pf_kv<KVT>::bytes);
    const uint32_t w[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (pf_kv<KVT>::raw) {
            dst[2 * i] = (uint16_t)w[i];
            dst[2 * i + 1] = (uint16_t)(w[i] >> 16);
        } else if (KVT == KV_F32) {
            dst[i] = pf_16<BF>(cu_bits_f32(w[i]));
        } else {
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const uint8_t x = (uint8_t)(w[i] >> (8 * b));
                dst[4 * i + b] = pf_16<BF>((KVT == KV_INT8 ? (float)(int8_t)x : cu_fp8_to_f32(x)) * sc);
            }
        }
    }
}

template <int HD, int KVT>
__global__ void __launch_bounds__(WARPS * 32) k_attn_prefill(struct paged_attn_args a, int max_ctx, int *err) {
    constexpr bool BF = KVT == KV_BF16;             /* bf16 storage: bf16 MMA (its range); else f16 */
    constexpr int BN = CUDA_PF_KV_TILE(HD), VEC = pf_kv<KVT>::vec, CH = HD / VEC;
    constexpr int QST = HD + PAD, VST = BN + PAD;   /* row strides, 16-bit values */
    constexpr bool SCALED = KVT == KV_INT8 || KVT == KV_FP8;
    extern __shared__ int64_t pf_sm[];
    /* shared memory, as cuda_pf_smem_bytes counts it */
    int64_t *row_s = pf_sm;                                     /* (BN): storage row of each position, -1 none */
    int *blk_s = (int *)(row_s + BN);                           /* (BN): block-table reads */
    uint16_t *q_s = (uint16_t *)(blk_s + BN);                   /* (ROWS, QST) */
    uint16_t *k_s = q_s + ROWS * QST;                           /* (BN, QST) */
    uint16_t *vt_s = k_s + BN * QST;                            /* (HD, VST): V transposed */
    float *ks_s = (float *)(vt_s + HD * VST);                   /* (BN): K scale */
    float *vs_s = ks_s + BN;                                    /* (BN): V scale */
    int *rpos_s = (int *)(vs_s + BN), *rlo_s = rpos_s + ROWS, *rseq_s = rlo_s + ROWS;   /* (ROWS) each */

    const int hk = blockIdx.y, g = a.n_head / a.n_head_kv, nkv = a.n_head_kv, bs = a.kv.block_size;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, gq = lane / 4, cq = lane % 4;
    const int64_t R0 = (int64_t)blockIdx.x * ROWS, n_rows = (int64_t)a.n_tokens * g;

    /* the tile's rows: position, window start, sequence (-1: no row, or a bad position) */
    for (int r = tid; r < ROWS; r += blockDim.x) {
        int p = -1, lo = 0, sq = -1;
        if (R0 + r < n_rows) {
            const int t = (int)((R0 + r) / g);
            p = a.pos[t];
            if (p < 0 || p >= max_ctx) {
                if (hk == 0) cu_report(err, CUDA_DEV_ATTN_POS, p);
                p = -1;
            } else if (p / bs >= a.max_blocks) {
                if (hk == 0) cu_report(err, CUDA_DEV_ATTN_BLOCK, p);
                p = -1;
            } else {
                lo = a.window > 0 && p + 1 > a.window ? p + 1 - a.window : 0;
                sq = a.seq[t];
            }
        }
        rpos_s[r] = p;
        rlo_s[r] = lo;
        rseq_s[r] = p < 0 ? -1 : sq;
    }
    /* Q rows, scaled, as the MMA's type (zeros for no row): float4 loads */
    for (int idx = tid; idx < ROWS * (HD / 4); idx += blockDim.x) {
        const int r = idx / (HD / 4), d = 4 * (idx % (HD / 4));
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (R0 + r < n_rows) {
            const int64_t t = (R0 + r) / g, i = (R0 + r) % g;
            v = *(const float4 *)(const void *)(a.q + ((size_t)t * a.n_head + (size_t)hk * g + (size_t)i) * HD + d);
        }
        uint16_t *dst = q_s + r * QST + d;
        dst[0] = pf_16<BF>(v.x * a.scale);
        dst[1] = pf_16<BF>(v.y * a.scale);
        dst[2] = pf_16<BF>(v.z * a.scale);
        dst[3] = pf_16<BF>(v.w * a.scale);
    }
    __syncthreads();

    /* this thread's two rows of its warp's 16: r0 (fragment rows gq) and r1 (gq + 8) */
    const int r0 = warp * 16 + gq, r1 = r0 + 8;
    float o[HD / 8][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };
#pragma unroll
    for (int dt = 0; dt < HD / 8; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

    for (int prev = -1;;) {
        /* the next sequence of the tile, and the positions its rows attend */
        int cur = INT_MAX, kv_lo = INT_MAX, kv_hi = 0;
        for (int r = 0; r < ROWS; r++) cur = rseq_s[r] > prev && rseq_s[r] < cur ? rseq_s[r] : cur;
        if (cur == INT_MAX) break;
        for (int r = 0; r < ROWS; r++)
            if (rseq_s[r] == cur) {
                kv_lo = min(kv_lo, rlo_s[r]);
                kv_hi = max(kv_hi, rpos_s[r] + 1);
            }
        prev = cur;
        const int32_t *table = a.block_table + (size_t)cur * a.max_blocks;
        const bool in0 = rseq_s[r0] == cur, in1 = rseq_s[r1] == cur;
        const int lo0 = rlo_s[r0], hi0 = rpos_s[r0], lo1 = rlo_s[r1], hi1 = rpos_s[r1];

        for (int c0 = kv_lo / BN * BN; c0 < kv_hi; c0 += BN) {
            /* 1. one block-table read per KV block (every position read is < kv_hi: in the table) */
            struct cuda_attn_walk wk = cuda_attn_walk_start(c0, tid, bs);
            if (tid < BN && c0 + tid < kv_hi && cuda_attn_walk_reads(wk, tid)) blk_s[tid] = table[wk.blk];
            __syncthreads();
            if (tid < BN) {
                const int p = c0 + tid;
                int64_t row = -1;
                if (p >= kv_lo && p < kv_hi)
                    row = ((int64_t)blk_s[cuda_attn_walk_src(wk, tid)] * nkv + hk) * bs + wk.off;
                row_s[tid] = row;
                ks_s[tid] = SCALED && row >= 0 ? a.kv.k_scale[row] : 1.0f;
                vs_s[tid] = SCALED && row >= 0 ? a.kv.v_scale[row] : 1.0f;
            }
            __syncthreads();
            /* 2. K rows and V columns of the tile, 16-bit */
            for (int idx = tid; idx < BN * CH; idx += blockDim.x) {
                const int j = idx / CH, v = idx % CH;
                const int64_t row = row_s[j];
                uint16_t kh[VEC], vh[VEC];
                if (row >= 0) {
                    const size_t e = (size_t)row * HD + (size_t)v * VEC;
                    pf_load<KVT, BF>(a.kv.k, e, ks_s[j], kh);
                    pf_load<KVT, BF>(a.kv.v, e, vs_s[j], vh);
                } else {
#pragma unroll
                    for (int i = 0; i < VEC; i++) kh[i] = vh[i] = 0;
                }
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    k_s[j * QST + v * VEC + i] = kh[i];
                    vt_s[(v * VEC + i) * VST + j] = vh[i];
                }
            }
            __syncthreads();
            /* 3. the warp's rows; a warp none of whose rows attends the tile would change nothing */
            const bool any0 = in0 && lo0 < c0 + BN && hi0 >= c0, any1 = in1 && lo1 < c0 + BN && hi1 >= c0;
            if (__any_sync(0xffffffffu, any0 || any1)) {
                float s[BN / 8][4];
#pragma unroll
                for (int nt = 0; nt < BN / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++) {
                    const int k0 = kk * 16 + 2 * cq;
                    const uint32_t qa[4] = { *(const uint32_t *)(q_s + r0 * QST + k0),
                                             *(const uint32_t *)(q_s + r1 * QST + k0),
                                             *(const uint32_t *)(q_s + r0 * QST + k0 + 8),
                                             *(const uint32_t *)(q_s + r1 * QST + k0 + 8) };
#pragma unroll
                    for (int nt = 0; nt < BN / 8; nt++) {
                        const uint16_t *kr = k_s + (nt * 8 + gq) * QST + k0;
                        pf_mma<BF>(s[nt], qa, *(const uint32_t *)kr, *(const uint32_t *)(kr + 8));
                    }
                }
                /* soft-cap, mask, the rows' maxima (a row's 4 lanes hold its BN scores) */
                float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
                for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int p = c0 + nt * 8 + 2 * cq + (e & 1), h = e / 2;
                        const bool ok = h ? in1 && p >= lo1 && p <= hi1 : in0 && p >= lo0 && p <= hi0;
                        float v = s[nt][e];
                        if (a.softcap > 0) v = a.softcap * tanhf(v / a.softcap);
                        s[nt][e] = ok ? v : -INFINITY;
                        mx[h] = fmaxf(mx[h], s[nt][e]);
                    }
                float corr[2], mu[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                    const float m_new = fmaxf(m[h], mx[h]);
                    mu[h] = m_new == -INFINITY ? 0.0f : m_new;   /* nothing attended yet: exp(-inf) = 0 */
                    corr[h] = expf(m[h] - mu[h]);
                    m[h] = m_new;
                    l[h] *= corr[h];
                }
#pragma unroll
                for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        s[nt][e] = expf(s[nt][e] - mu[e / 2]);
                        l[e / 2] += s[nt][e];
                    }
#pragma unroll
                for (int dt = 0; dt < HD / 8; dt++) {
                    o[dt][0] *= corr[0];
                    o[dt][1] *= corr[0];
                    o[dt][2] *= corr[1];
                    o[dt][3] *= corr[1];
                }
                /* O += P V: the score fragments of n-tiles 2kk, 2kk + 1 are the A fragment of k-step kk */
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++) {
                    const uint32_t pa[4] = { pf_pack<BF>(s[2 * kk][0], s[2 * kk][1]),
                                             pf_pack<BF>(s[2 * kk][2], s[2 * kk][3]),
                                             pf_pack<BF>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                             pf_pack<BF>(s[2 * kk + 1][2], s[2 * kk + 1][3]) };
#pragma unroll
                    for (int dt = 0; dt < HD / 8; dt++) {
                        const uint16_t *vr = vt_s + (dt * 8 + gq) * VST + kk * 16 + 2 * cq;
                        pf_mma<BF>(o[dt], pa, *(const uint32_t *)vr, *(const uint32_t *)(vr + 8));
                    }
                }
            }
            __syncthreads();   /* the next tile overwrites the shared tiles */
        }
    }

    /* a row's sum from its 4 lanes, the sink, the normalized output */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = h ? r1 : r0;
        if (rpos_s[r] < 0) continue;
        const int64_t t = (R0 + r) / g, i = (R0 + r) % g, head = (int64_t)hk * g + i;
        const float sk = a.sinks ? a.sinks[head] : -INFINITY;
        const float mm = a.sinks ? fmaxf(m[h], sk) : m[h], c = expf(m[h] - mm);
        const float inv = c / (l[h] * c + (a.sinks ? expf(sk - mm) : 0.0f));
        float *out = a.out + ((size_t)t * a.n_head + (size_t)head) * HD + 2 * cq;
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++)
            *(float2 *)(void *)(out + dt * 8) = make_float2(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
    }
}

/* The instances: head sizes x KV types, one table for the setup and the launcher. */
typedef void (*pf_fn)(struct paged_attn_args, int, int *);
#define PF_ROW(HD) { k_attn_prefill<HD, KV_F32>, k_attn_prefill<HD, KV_F16>, k_attn_prefill<HD, KV_BF16>, \
                     k_attn_prefill<HD, KV_INT8>, k_attn_prefill<HD, KV_FP8> }
static const pf_fn k_pf_fns[3][KV_TYPE_COUNT_] = { PF_ROW(64), PF_ROW(128), PF_ROW(256) };
#undef PF_ROW

static pf_fn pf_fn_for(int head_dim, int type) {
    const int i = cu_head_size_row(head_dim);
    return i < 0 || type < 0 || type >= KV_TYPE_COUNT_ ? NULL : k_pf_fns[i][type];
}

extern "C" bool cuk_attention_prefill_takes(const struct paged_attn_args *a) {
    /* 16-byte K/V loads and float4 query loads, float2 output stores (the fast mode: the caller's) */
    return cuda_pf_takes(a->n_tokens, a->head_dim, true) && pf_fn_for(a->head_dim, a->kv.type) &&
           (uintptr_t)a->kv.k % 16 == 0 && (uintptr_t)a->kv.v % 16 == 0 && (uintptr_t)a->q % 16 == 0 &&
           (uintptr_t)a->out % 8 == 0;
}

extern "C" cudaError_t cuk_attention_prefill_setup(size_t smem_bytes) {
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 3 && e == cudaSuccess; i++)
        for (int k = 0; k < KV_TYPE_COUNT_ && e == cudaSuccess; k++)
            e = cudaFuncSetAttribute(k_pf_fns[i][k], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes);
    return e;
}

extern "C" cudaError_t cuk_attention_prefill(cudaStream_t s, int *err, const struct paged_attn_args *a,
                                             int max_ctx) {
    if (a->n_tokens <= 0) return cudaSuccess;
    const int64_t rows = (int64_t)a->n_tokens * (a->n_head / a->n_head_kv);
    const dim3 grid((unsigned)((rows + ROWS - 1) / ROWS), (unsigned)a->n_head_kv);
    pf_fn_for(a->head_dim, a->kv.type)<<<grid, WARPS * 32, cuda_pf_smem_bytes(a->head_dim), s>>>(*a, max_ctx, err);
    return CU_LAUNCH_CHECK();
}
