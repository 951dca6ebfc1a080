/* matmul_q8.cu — y (n, M) = x (n, K) · wᵀ on 8-bit activations with
 * __dp4a over the weights' packed codes: the CPU's integer path (qmm.h,
 * qmm_k.c) on the GPU, for Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL MXFP4 (blocks of
 * 32) and Q4_K Q5_K Q6_K (super-blocks of 256).
 *
 * Model of the arithmetic.  k_quant_act quantizes each token row as
 * qmm_quantize_row / qmm_quantize_row_k do: per block of QB (32, or 256 for
 * the K-quants) dx = amax / 127 and code = round-half-even(x · (127 /
 * amax)), so the codes and scales are the CPU's.  Per (weight row, token)
 * each unit of work yields the CPU's exact integers:
 *   32-block types, one block:   P = Σ_32 w · x, (Q4_1, Q5_1: xs = Σ_32 x)
 *   Q4_K, Q5_K, one super-block: I = Σ_s sc[s] Σ_32 q · x, M = Σ_s m[s] xs32[s]
 *   Q6_K, one super-block:       I = Σ_s sc[s] Σ_16 (q - 32) · x
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
 * orders the final cross-warp sum. */
#include "backend/cuda/cuda_common.cuh"

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
    const float id = amax > 0 ? 127.0f / amax : 0.0f;
    q[t * K + e] = (int8_t)__float2int_rn(__fmul_rn(v, id));
    if (QB == 32 ? lane == 0 : threadIdx.x == 0) d[t * (K / 32) + e / QB] = amax / 127.0f;
}

/* ---- weights: one unit's codes as int8 lanes ---- */

/* 4 bytes at p, 2-byte aligned (the 18-, 22- and 34-byte blocks). */
__device__ __forceinline__ int ld_u32_a2(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)(const void *)p;
    return (int)((uint32_t)h[0] | (uint32_t)h[1] << 16);
}

/* Four nibbles (one per byte, 0..15) to their int8 values in a 16-entry table held as 4 ints. */
__device__ __forceinline__ int nl_lookup(int v, const int tbl[4]) {
    const uint32_t b = (uint32_t)v & 0x07070707u;
    const uint32_t s2 = b | b >> 4;
    const uint32_t sel = (s2 & 0xffu) | ((s2 >> 8) & 0xff00u);   /* byte k's low 3 bits at bits 4k */
    const uint32_t lo = __byte_perm((uint32_t)tbl[0], (uint32_t)tbl[1], sel);
    const uint32_t hi = __byte_perm((uint32_t)tbl[2], (uint32_t)tbl[3], sel);
    const uint32_t m = (((uint32_t)v & 0x08080808u) >> 3) * 0xffu;   /* 0xff where bit 3 is set */
    return (int)((lo & ~m) | (hi & m));
}

/* Block b of a 32-block row: its 32 codes as 8 ints of int8 lanes, in element order (int i: elements
 * 4i .. 4i+3), already offset (Q4_0 - 8, Q5_0 - 16; IQ4_NL, MXFP4 their table values); *dw its scale;
 * *mw the offset m (Q4_1, Q5_1; 0 otherwise).  tbl: nl_table<T>. */
template <int T>
__device__ __forceinline__ void unit32(const uint8_t *row, int64_t b, const int tbl[4], int c[8], float *dw,
                                       float *mw) {
    *mw = 0.0f;
    if (T == DTYPE_Q8_0) {
        const uint8_t *p = row + b * 34;
        *dw = cu_f16_to_f32(cu_u16(p));
#pragma unroll
        for (int i = 0; i < 8; i++) c[i] = ld_u32_a2(p + 2 + 4 * i);
        return;
    }
    const bool q41 = T == DTYPE_Q4_1, q50 = T == DTYPE_Q5_0, q51 = T == DTYPE_Q5_1;
    const bool mx = T == DTYPE_MXFP4, nl = T == DTYPE_IQ4_NL;
    const int bb = T == DTYPE_Q4_0 || nl ? 18 : q41 ? 20 : q50 ? 22 : q51 ? 24 : 17;
    const int qs_off = bb - 16;                   /* the 16 nibble bytes end every block */
    const uint8_t *p = row + b * bb;
    if (mx) {
        const uint32_t x = p[0], bits = x < 2 ? 0x00200000u << x : (x - 1) << 23;   /* e8m0_half_to_f32 */
        *dw = cu_bits_f32(bits);
    } else {
        *dw = cu_f16_to_f32(cu_u16(p));
    }
    if (q41 || q51) *mw = cu_f16_to_f32(cu_u16(p + 2));
    uint32_t qh = 0;
    if (q50 || q51) qh = (uint32_t)ld_u32_a2(p + (q51 ? 4 : 2));
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int v = mx ? (int)((uint32_t)p[qs_off + 4 * i] | (uint32_t)p[qs_off + 4 * i + 1] << 8 |
                                 (uint32_t)p[qs_off + 4 * i + 2] << 16 | (uint32_t)p[qs_off + 4 * i + 3] << 24)
                         : ld_u32_a2(p + qs_off + 4 * i);   /* MXFP4's 17-byte blocks: bytes */
        int lo = v & 0x0f0f0f0f, hi = (v >> 4) & 0x0f0f0f0f;
        if (q50 || q51) {   /* fifth bit of element j is bit j of qh: spread bits 4i.. and 16 + 4i.. to bit 4 */
            const uint32_t a = qh >> (4 * i), h = qh >> (16 + 4 * i);
            lo |= (int)(((a << 4) & 0x10u) | ((a << 11) & 0x1000u) | ((a << 18) & 0x100000u) | ((a << 25) & 0x10000000u));
            hi |= (int)(((h << 4) & 0x10u) | ((h << 11) & 0x1000u) | ((h << 18) & 0x100000u) | ((h << 25) & 0x10000000u));
        }
        if (nl || mx) {
            lo = nl_lookup(lo, tbl);
            hi = nl_lookup(hi, tbl);
        } else if (T == DTYPE_Q4_0) {
            lo = (int)__vsub4((uint32_t)lo, 0x08080808u);
            hi = (int)__vsub4((uint32_t)hi, 0x08080808u);
        } else if (q50) {
            lo = (int)__vsub4((uint32_t)lo, 0x10101010u);
            hi = (int)__vsub4((uint32_t)hi, 0x10101010u);
        }
        c[i] = lo;          /* elements 4i .. 4i+3 */
        c[4 + i] = hi;      /* elements 16 + 4i .. */
    }
}

/* IQ4_NL's and MXFP4's 16 values as 4 ints (nl_lookup), read once per thread; zeros for other types. */
template <int T>
__device__ __forceinline__ void nl_table(int tbl[4]) {
    const int8_t *v = T == DTYPE_MXFP4 ? cu_kvalues_mxfp4 : cu_kvalues_iq4nl;
    const bool used = T == DTYPE_MXFP4 || T == DTYPE_IQ4_NL;
#pragma unroll
    for (int i = 0; i < 4; i++)
        tbl[i] = !used ? 0
                       : (int)((uint32_t)(uint8_t)v[4 * i] | (uint32_t)(uint8_t)v[4 * i + 1] << 8 |
                               (uint32_t)(uint8_t)v[4 * i + 2] << 16 | (uint32_t)(uint8_t)v[4 * i + 3] << 24);
}

/* ---- the kernel ---- */

__device__ __forceinline__ int dot8(const int c[8], int4 x0, int4 x1) {
    int s = __dp4a(c[0], x0.x, 0);
    s = __dp4a(c[1], x0.y, s);
    s = __dp4a(c[2], x0.z, s);
    s = __dp4a(c[3], x0.w, s);
    s = __dp4a(c[4], x1.x, s);
    s = __dp4a(c[5], x1.y, s);
    s = __dp4a(c[6], x1.z, s);
    return __dp4a(c[7], x1.w, s);
}
__device__ __forceinline__ int sum4(int4 x) {
    int s = __dp4a(0x01010101, x.x, 0);
    s = __dp4a(0x01010101, x.y, s);
    s = __dp4a(0x01010101, x.z, s);
    return __dp4a(0x01010101, x.w, s);
}
__device__ __forceinline__ int dot4(int c0, int c1, int c2, int c3, int4 x) {
    return __dp4a(c3, x.w, __dp4a(c2, x.z, __dp4a(c1, x.y, __dp4a(c0, x.x, 0))));
}
/* Sum of v over the 8 lanes of this lane's group (lanes 8g .. 8g+7): exact for integers. */
__device__ __forceinline__ int group8_sum(int v) {
    const unsigned mask = 0xffu << (threadIdx.x % 32 / MQ_KL * MQ_KL);
    v += __shfl_xor_sync(mask, v, 1);
    v += __shfl_xor_sync(mask, v, 2);
    return v + __shfl_xor_sync(mask, v, 4);
}

template <int T>
__global__ void __launch_bounds__(MQ_THREADS) k_matmul_q8(float *y, const uint8_t *w, size_t row_bytes, int64_t K,
                                                          int64_t M, const int8_t *xq, const float *xd, int n) {
    constexpr bool kq = T == DTYPE_Q4_K || T == DTYPE_Q5_K || T == DTYPE_Q6_K;
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
    int tbl[4];
    nl_table<T>(tbl);

    for (int64_t u = g; u < n_units; u += groups) {   /* uniform over a unit's lanes: shuffles are safe */
        if (!kq) {
            int c[8];
            float dw, mw;
            unit32<T>(row, u, tbl, c, &dw, &mw);
#pragma unroll
            for (int j = 0; j < MQ_TOK; j++) {
                if (j < nt) {
                    const int4 *xp = (const int4 *)(const void *)(xq + (size_t)(t0 + j) * K + 32 * u);
                    const int4 x0 = xp[0], x1 = xp[1];
                    const float dx = xd[(size_t)(t0 + j) * xds + u];
                    acc[j] = fmaf((float)dot8(c, x0, x1), __fmul_rn(dw, dx), acc[j]);
                    if (T == DTYPE_Q4_1 || T == DTYPE_Q5_1)
                        acc[j] = fmaf((float)(sum4(x0) + sum4(x1)), __fmul_rn(mw, dx), acc[j]);
                }
            }
        } else if (T == DTYPE_Q6_K) {
            /* ql[128] qh[64] scales[16] d: lane li takes elements 32 li .. 32 li + 31 (h = li / 4, s = li % 4):
             * low 4 bits in ql[64h + 32(s & 1) + l] >> 4(s >> 1), high 2 in qh[32h + l] >> 2s; sub-blocks 2li, 2li+1 */
            const uint8_t *p = row + u * 210;
            const int h = li / 4, s = li % 4;
            int c[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int lo = (ld_u32_a2(p + 64 * h + 32 * (s & 1) + 4 * i) >> (4 * (s >> 1))) & 0x0f0f0f0f;
                const int hi = (ld_u32_a2(p + 128 + 32 * h + 4 * i) >> (2 * s)) & 0x03030303;
                c[i] = (int)__vsub4((uint32_t)(lo | hi << 4), 0x20202020u);   /* q - 32 */
            }
            const int sc0 = (int8_t)p[192 + 2 * li], sc1 = (int8_t)p[192 + 2 * li + 1];
            const float d = cu_f16_to_f32(cu_u16(p + 208));
#pragma unroll
            for (int j = 0; j < MQ_TOK; j++) {
                if (j < nt) {
                    const int4 *xp = (const int4 *)(const void *)(xq + (size_t)(t0 + j) * K + 256 * u + 32 * li);
                    const int4 x0 = xp[0], x1 = xp[1];
                    const int I = group8_sum(sc0 * dot4(c[0], c[1], c[2], c[3], x0) +
                                             sc1 * dot4(c[4], c[5], c[6], c[7], x1));
                    const float dx = xd[(size_t)(t0 + j) * xds + u];
                    acc[j] = fmaf((float)I, __fmul_rn(d, dx), acc[j]);
                }
            }
        } else {
            /* Q4_K / Q5_K: d dmin scales[12] (qh[32]) qs[128]; lane li = 2 cc + hh takes bytes 32 cc + 16 hh ..
             * + 15 of qs: low nibbles elements 64 cc + 16 hh + 0..15 (sub-block 2 cc), high ones 32 further
             * (sub-block 2 cc + 1); Q5_K's fifth bits: qh[16 hh + l] bits 2 cc, 2 cc + 1 */
            constexpr bool q5 = T == DTYPE_Q5_K;
            const uint8_t *p = row + u * (q5 ? 176 : 144);
            const int cc = li / 2, hh = li % 2;
            const int4 qv = *(const int4 *)(const void *)(p + (q5 ? 48 : 16) + 32 * cc + 16 * hh);
            const int q4[4] = { qv.x, qv.y, qv.z, qv.w };
            int lo[4], hi[4];
            int4 hv = make_int4(0, 0, 0, 0);
            if (q5) hv = *(const int4 *)(const void *)(p + 16 + 16 * hh);
            const int h4[4] = { hv.x, hv.y, hv.z, hv.w };
#pragma unroll
            for (int i = 0; i < 4; i++) {
                lo[i] = q4[i] & 0x0f0f0f0f;
                hi[i] = (q4[i] >> 4) & 0x0f0f0f0f;
                if (q5) {
                    lo[i] |= ((h4[i] >> (2 * cc)) & 0x01010101) << 4;
                    hi[i] |= ((h4[i] >> (2 * cc + 1)) & 0x01010101) << 4;
                }
            }
            int sc0, m0, sc1, m1;
            cu_q4_K_scale_min(p + 4, 2 * cc, &sc0, &m0);
            cu_q4_K_scale_min(p + 4, 2 * cc + 1, &sc1, &m1);
            const float d = cu_f16_to_f32(cu_u16(p)), dmin = cu_f16_to_f32(cu_u16(p + 2));
#pragma unroll
            for (int j = 0; j < MQ_TOK; j++) {
                if (j < nt) {
                    const int8_t *xt = xq + (size_t)(t0 + j) * K + 256 * u + 64 * cc + 16 * hh;
                    const int4 x0 = *(const int4 *)(const void *)xt, x1 = *(const int4 *)(const void *)(xt + 32);
                    const int I = group8_sum(sc0 * dot4(lo[0], lo[1], lo[2], lo[3], x0) +
                                             sc1 * dot4(hi[0], hi[1], hi[2], hi[3], x1));
                    const int Mn = group8_sum(m0 * sum4(x0) + m1 * sum4(x1));
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
    case DTYPE_Q4_K: case DTYPE_Q5_K: case DTYPE_Q6_K: return K > 0 && K % 256 == 0;
    default: return false;
    }
}

extern "C" cudaError_t cuk_matmul_q8(cudaStream_t s, float *y, const struct tensor *w, const float *x, int n,
                                     int8_t *xq, float *xd) {
    if (n <= 0 || w->ne1 <= 0) return cudaSuccess;
    const int64_t K = w->ne0;
    if (w->ne1 > 0x7fffffff || !cuk_matmul_q8_takes(w->type, K) || (K + 255) / 256 > 0x7fffffff || n > 65535)
        return cudaErrorInvalidValue;
    const bool kq = w->type == DTYPE_Q4_K || w->type == DTYPE_Q5_K || w->type == DTYPE_Q6_K;
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
    MQ(DTYPE_MXFP4); MQ(DTYPE_Q4_K); MQ(DTYPE_Q5_K); MQ(DTYPE_Q6_K);
    default: return cudaErrorInvalidValue;
    }
#undef MQ
    return CU_LAUNCH_CHECK();
}
