/* matmul_q8.cu — y (n, M) = x (n, K) · wᵀ on 8-bit activations with
 * __dp4a over the weights' packed codes: the CPU's integer path (qmm.h,
 * qmm_k.c) on the GPU, for every type that path has: Q8_0 Q4_0 Q4_1 Q5_0
 * Q5_1 IQ4_NL MXFP4 (blocks of 32), IQ4_XS (its sub-blocks of 32) and Q2_K
 * Q3_K Q4_K Q5_K Q6_K (super-blocks of 256).
 *
 * Model of the arithmetic.  k_quant_act quantizes each token row as
 * qmm_quantize_row / qmm_quantize_row_k do: per block of QB (32, or 256 for
 * the K-quants) dx = amax / 127 and code = round-half-even(x · (127 /
 * amax)), so the codes and scales are the CPU's.  Per (weight row, token)
 * each unit of work yields the CPU's exact integers:
 *   32-block types, one block:   P = Σ_32 w · x, (Q4_1, Q5_1: xs = Σ_32 x)
 *   Q4_K, Q5_K, one super-block: I = Σ_s sc[s] Σ_32 q · x, M = Σ_s m[s] xs32[s]
 *   IQ4_XS, one sub-block of 32: P = Σ_32 w · x, scale (d · (sc - 32)) · dx
 *   Q6_K, one super-block:       I = Σ_s sc[s] Σ_16 (q - 32) · x
 *   Q2_K, one super-block:       I = Σ_s sc[s] Σ_16 q · x, M = Σ_s m[s] xs16[s]
 *   Q3_K, one super-block:       I = Σ_s (sc[s] - 32) Σ_16 (q - 4) · x
 * and folds them into a float accumulator with the CPU's two float steps
 * (acc = fma(P, dw · dx, acc), the offset / min term likewise).  The CPU
 * adds those terms in block order; here thread i of the row's 128 adds
 * those of units i, i + 128, ... (units: blocks of 32, or super-blocks split
 * over 8 lanes whose integer parts are summed exactly by shuffles), and the
 * 128 partial sums are combined by a fixed butterfly and a fixed-order sum
 * over the 4 warps.  So the integers are the CPU's bit for bit and only the
 * order of the final float additions differs (‖error‖ within the harness's
 * bound 2 K 2^-24 |W||x| on top of the activations' rounding).
 *
 * Batch invariance: which unit a thread takes and the order it adds them
 * depend on K alone; tokens are tiled MQ_TOK to a block (grid.y), each
 * token's partials kept apart, so y[t][r] is the same whatever n is and
 * whichever tile t falls in.  cuda.c takes this path for a type at every n
 * (or at none).
 *
 * Memory.  A block handles one weight row for a tile of up to MQ_TOK
 * tokens: 4 warps read the row once, 16 bytes per thread per unit where the
 * layout is 16-byte aligned (the K-quants' codes; Q4_0 / Q8_0's 18 / 34-byte
 * blocks only allow 16-bit loads), unpack each unit's codes to int8 lanes
 * once, and reuse them for every token of the tile (two 16-byte loads of the
 * token's 32 codes per unit).  No barrier in the main loop: the only one
 * orders the final cross-warp sum.  The unpacking is q8_codes.h's, plain C
 * that test_cuda_plan checks against dtype.h's formats on the CPU. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/q8_codes.h"

#define MQ_THREADS 128
#define MQ_WARPS (MQ_THREADS / 32)
#define MQ_TOK 8                      /* tokens per block (tile) */
#define MQ_KL 8                       /* lanes per K-quant super-block: one 32-slice each */

/* ---- activations ---- */

/* x (n, K) -> codes q (n, K) and scales d (n, K / 32: the scale of block e / QB at e / QB; the K-quants
 * use the first K / 256 of each row).  Grid (ceil(K / 256), n), 256 threads: thread e of a chunk of
 * 256 quantizes element e; K is a multiple of QB (QB = 256: whole chunks, so every warp reaches the
 * barrier). */
template <int QB>
__global__ void __launch_bounds__(256) k_quant_act(int8_t *q, float *d, const float *x, int64_t K) {
    __shared__ float wmax[8];
    const int64_t t = blockIdx.y, e = (int64_t)blockIdx.x * 256 + threadIdx.x;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (QB == 32 && e - lane >= K) return;   /* a whole warp past K (K is a multiple of 32) */
    const float v = x[t * K + e];
    float amax = cu_warp_max(fabsf(v));
    if (QB == 256) {
        if (lane == 0) wmax[warp] = amax;
        __syncthreads();
        amax = wmax[0];
        for (int w = 1; w < 8; w++) amax = fmaxf(amax, wmax[w]);
    }
    /* qmm_quantize_row's arithmetic: IEEE divisions (--prec-div), one rounded product, nearest even */
    float id = amax > 0 ? 127.0f / amax : 0.0f;
    id = id <= 3.402823466e38f ? id : 0.0f;   /* qmm_inv_scale: an overflowing inverse gives codes 0 */
    q[t * K + e] = (int8_t)__float2int_rn(__fmul_rn(v, id));
    if (QB == 32 ? lane == 0 : threadIdx.x == 0) d[t * (K / 32) + e / QB] = amax / 127.0f;
}

/* ---- weights: q8_codes.h unpacks the codes; the scales here ---- */

/* The scale of a 32-block (MXFP4: e8m0_half_to_f32 of its first byte; the others their f16 d). */
template <int T>
__device__ __forceinline__ float scale32(const uint8_t *blk) {
    if (T == DTYPE_MXFP4) {
        const uint32_t x = blk[0];
        return cu_bits_f32(x < 2 ? 0x00200000u << x : (x - 1) << 23);
    }
    return cu_f16_to_f32(cu_u16(blk));
}

/* Token j's 32 codes at p (16-byte aligned) as 8 ints. */
__device__ __forceinline__ void ld_act32(const int8_t *p, int x[8]) {
    const int4 a = *(const int4 *)(const void *)p, b = *(const int4 *)(const void *)(p + 16);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
/* Two runs of 16 codes (16-byte aligned each) as 4 ints each. */
__device__ __forceinline__ void ld_act16x2(const int8_t *p0, const int8_t *p1, int x[8]) {
    const int4 a = *(const int4 *)(const void *)p0, b = *(const int4 *)(const void *)p1;
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

/* Sum of v over the 8 lanes of this lane's group (lanes 8g .. 8g+7): exact for integers. */
__device__ __forceinline__ int group8_sum(int v) {
    const unsigned mask = 0xffu << (threadIdx.x % 32 / MQ_KL * MQ_KL);
    v += __shfl_xor_sync(mask, v, 1);
    v += __shfl_xor_sync(mask, v, 2);
    return v + __shfl_xor_sync(mask, v, 4);
}

/* ---- the kernel ---- */

template <int T>
__global__ void __launch_bounds__(MQ_THREADS) k_matmul_q8(float *y, const uint8_t *w, size_t row_bytes, int64_t K,
                                                          int64_t M, const int8_t *xq, const float *xd, int n) {
    constexpr bool kq = T == DTYPE_Q2_K || T == DTYPE_Q3_K || T == DTYPE_Q4_K || T == DTYPE_Q5_K || T == DTYPE_Q6_K;
    constexpr int lanes = kq ? MQ_KL : 1;              /* threads per unit */
    constexpr int groups = MQ_THREADS / lanes;         /* units in flight per row */
    __shared__ float part[MQ_WARPS][MQ_TOK];
    const int64_t r = blockIdx.x;
    const int t0 = blockIdx.y * MQ_TOK, nt = n - t0 < MQ_TOK ? n - t0 : MQ_TOK;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = threadIdx.x / lanes, li = threadIdx.x % lanes;
    const int64_t n_units = K / (kq ? 256 : 32), xds = K / 32;
    const uint8_t *row = w + (size_t)r * row_bytes;
    float acc[MQ_TOK];
#pragma unroll
    for (int j = 0; j < MQ_TOK; j++) acc[j] = 0.0f;
    uint32_t tbl[4];
    q8_nl_table(T == DTYPE_IQ4_XS ? DTYPE_IQ4_NL : T, tbl);

    for (int64_t u = g; u < n_units; u += groups) {   /* uniform over a unit's lanes: shuffles are safe */
        if (T == DTYPE_IQ4_XS) {   /* sub-block u % 8 of super-block u / 8 */
            const uint8_t *p = row + (u / 8) * 136;
            int c[8], sc;
            q8_iq4xs_unit(p, (int)(u % 8), tbl, c, &sc);
            const float ds = __fmul_rn(cu_f16_to_f32(cu_u16(p)), (float)sc);   /* exact: 11 by 6 bits */
#pragma unroll
            for (int j = 0; j < MQ_TOK; j++) {
                if (j < nt) {
                    int x[8];
                    ld_act32(xq + (size_t)(t0 + j) * K + 32 * u, x);
                    const float dx = xd[(size_t)(t0 + j) * xds + u];
                    acc[j] = fmaf((float)(q8_dot4(c, x) + q8_dot4(c + 4, x + 4)), __fmul_rn(ds, dx), acc[j]);
                }
            }
        } else if (!kq) {
            const uint8_t *p = row + u * q8_blk_bytes(T);
            int c[8];
            q8_unit32(T, p, tbl, c);
            const float dw = scale32<T>(p);
            const float mw = T == DTYPE_Q4_1 || T == DTYPE_Q5_1 ? cu_f16_to_f32(cu_u16(p + 2)) : 0.0f;
#pragma unroll
            for (int j = 0; j < MQ_TOK; j++) {
                if (j < nt) {
                    int x[8];
                    ld_act32(xq + (size_t)(t0 + j) * K + 32 * u, x);
                    const float dx = xd[(size_t)(t0 + j) * xds + u];
                    acc[j] = fmaf((float)(q8_dot4(c, x) + q8_dot4(c + 4, x + 4)), __fmul_rn(dw, dx), acc[j]);
                    if (T == DTYPE_Q4_1 || T == DTYPE_Q5_1)
                        acc[j] = fmaf((float)(q8_sum4(x) + q8_sum4(x + 4)), __fmul_rn(mw, dx), acc[j]);
                }
            }
        } else if (T == DTYPE_Q2_K || T == DTYPE_Q3_K || T == DTYPE_Q6_K) {   /* codes times sub-block scales */
            constexpr bool q2 = T == DTYPE_Q2_K;
            constexpr int ub = q2 ? 84 : T == DTYPE_Q3_K ? 110 : 210;   /* unit bytes: d (then Q2_K's dmin) last */
            const uint8_t *p = row + u * ub;
            int c[8], sc[2], m[2] = { 0, 0 };
            if (T == DTYPE_Q6_K) q8_q6k_lane(p, li, c, sc);
            else q8_q2k_lane(T, p, li, c, sc, m);
            const float d = cu_f16_to_f32(cu_u16(p + ub - (q2 ? 4 : 2)));
            const float dmin = q2 ? cu_f16_to_f32(cu_u16(p + ub - 2)) : 0.0f;
#pragma unroll
            for (int j = 0; j < MQ_TOK; j++) {
                if (j < nt) {
                    int x[8];
                    ld_act32(xq + (size_t)(t0 + j) * K + 256 * u + 32 * li, x);
                    const int I = group8_sum(sc[0] * q8_dot4(c, x) + sc[1] * q8_dot4(c + 4, x + 4));
                    const float dx = xd[(size_t)(t0 + j) * xds + u];
                    acc[j] = fmaf((float)I, __fmul_rn(d, dx), acc[j]);
                    if (q2) {
                        const int Mn = group8_sum(m[0] * q8_sum4(x) + m[1] * q8_sum4(x + 4));
                        acc[j] = fmaf((float)Mn, -__fmul_rn(dmin, dx), acc[j]);
                    }
                }
            }
        } else {   /* Q4_K, Q5_K */
            const uint8_t *p = row + u * (T == DTYPE_Q5_K ? 176 : 144);
            int lo[4], hi[4], sc[2], m[2];
            q8_q4k_lane(T, p, li, lo, hi, sc, m);
            const float d = cu_f16_to_f32(cu_u16(p)), dmin = cu_f16_to_f32(cu_u16(p + 2));
            const int cc = li / 2, hh = li % 2;
#pragma unroll
            for (int j = 0; j < MQ_TOK; j++) {
                if (j < nt) {
                    const int8_t *xt = xq + (size_t)(t0 + j) * K + 256 * u + 64 * cc + 16 * hh;
                    int x[8];   /* sub-block 2 cc's 16 codes, then 2 cc + 1's */
                    ld_act16x2(xt, xt + 32, x);
                    const int I = group8_sum(sc[0] * q8_dot4(lo, x) + sc[1] * q8_dot4(hi, x + 4));
                    const int Mn = group8_sum(m[0] * q8_sum4(x) + m[1] * q8_sum4(x + 4));
                    const float dx = xd[(size_t)(t0 + j) * xds + u];
                    acc[j] = fmaf((float)I, __fmul_rn(d, dx), acc[j]);
                    acc[j] = fmaf((float)Mn, -__fmul_rn(dmin, dx), acc[j]);
                }
            }
        }
    }
    /* one accumulator per unit: the K-quants' 8 lanes hold the same sums, lane 0 of each group counts */
#pragma unroll
    for (int j = 0; j < MQ_TOK; j++) {
        const float v = cu_warp_sum(li == 0 ? acc[j] : 0.0f);
        if (lane == 0) part[warp][j] = v;
    }
    __syncthreads();
    if (threadIdx.x < nt) {
        float s = part[0][threadIdx.x];
        for (int wi = 1; wi < MQ_WARPS; wi++) s += part[wi][threadIdx.x];
        y[(size_t)(t0 + threadIdx.x) * M + r] = s;
    }
}

/* ---- launchers ---- */

extern "C" bool cuk_matmul_q8_takes(uint32_t type, int64_t K) {
    switch (type) {
    case DTYPE_Q8_0: case DTYPE_Q4_0: case DTYPE_Q4_1: case DTYPE_Q5_0: case DTYPE_Q5_1: case DTYPE_IQ4_NL:
    case DTYPE_MXFP4: return K > 0 && K % 32 == 0;
    case DTYPE_Q2_K: case DTYPE_Q3_K: case DTYPE_Q4_K: case DTYPE_Q5_K: case DTYPE_Q6_K: case DTYPE_IQ4_XS:
        return K > 0 && K % 256 == 0;
    default: return false;
    }
}

extern "C" cudaError_t cuk_matmul_q8(cudaStream_t s, float *y, const struct tensor *w, const float *x, int n,
                                     int8_t *xq, float *xd) {
    if (n <= 0 || w->ne1 <= 0) return cudaSuccess;
    const int64_t K = w->ne0;
    if (w->ne1 > 0x7fffffff || !cuk_matmul_q8_takes(w->type, K) || (K + 255) / 256 > 0x7fffffff || n > 65535)
        return cudaErrorInvalidValue;
    /* activations per 256 for the K-quants, per 32 for the rest and IQ4_XS (qmm.h's qmm_act_k) */
    const bool kq = w->type == DTYPE_Q2_K || w->type == DTYPE_Q3_K || w->type == DTYPE_Q4_K ||
                    w->type == DTYPE_Q5_K || w->type == DTYPE_Q6_K;
    const dim3 qgrid((unsigned)((K + 255) / 256), (unsigned)n);   /* grid.y: at most 65535 tokens */
    if (kq) k_quant_act<256><<<qgrid, 256, 0, s>>>(xq, xd, x, K);
    else k_quant_act<32><<<qgrid, 256, 0, s>>>(xq, xd, x, K);
    cudaError_t e = CU_LAUNCH_CHECK();
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)w->ne1, (unsigned)((n + MQ_TOK - 1) / MQ_TOK));
    const uint8_t *d = (const uint8_t *)w->data;
#define MQ(T) case T: k_matmul_q8<T><<<grid, MQ_THREADS, 0, s>>>(y, d, w->row_bytes, K, w->ne1, xq, xd, n); break
    switch (w->type) {
    MQ(DTYPE_Q8_0); MQ(DTYPE_Q4_0); MQ(DTYPE_Q4_1); MQ(DTYPE_Q5_0); MQ(DTYPE_Q5_1); MQ(DTYPE_IQ4_NL);
    MQ(DTYPE_MXFP4); MQ(DTYPE_IQ4_XS); MQ(DTYPE_Q2_K); MQ(DTYPE_Q3_K); MQ(DTYPE_Q4_K); MQ(DTYPE_Q5_K);
    MQ(DTYPE_Q6_K);
    default: return cudaErrorInvalidValue;
    }
#undef MQ
    return CU_LAUNCH_CHECK();
}
