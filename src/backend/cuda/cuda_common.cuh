/* cuda_common.cuh — device helpers shared by the kernels: the number
 * conversions and block dequantizers of dtype.c / dtype_k.c ported line for
 * line (so that get_rows and kv_store are bit-identical to the scalar
 * reference: every multiply and add that the reference keeps separate is
 * written with __fmul_rn / __fadd_rn, which nvcc never contracts into an
 * FMA), KV element loads, and the device error record. */
#ifndef KVLLM_CUDA_COMMON_CUH
#define KVLLM_CUDA_COMMON_CUH

#include "backend/cuda/cuda_kernels.h"
#include <cuda_runtime.h>
#include <stdint.h>

/* ---- bits ---- */

/* The head sizes compiled into the templated attention kernels (64, 128, 256) as a row of their
 * instance tables (0, 1, 2); -1 for any other size. */
static inline int cu_head_size_row(int head_dim) {
    return head_dim == 64 ? 0 : head_dim == 128 ? 1 : head_dim == 256 ? 2 : -1;
}

__device__ __forceinline__ uint32_t cu_f32_bits(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float cu_bits_f32(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint16_t cu_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

__device__ __forceinline__ float cu_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return cu_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return cu_bits_f32(sign);
        float v = __fmul_rn((float)man, 5.9604644775390625e-8f);
        return sign ? -v : v;
    }
    return cu_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

__device__ __forceinline__ uint16_t cu_f32_to_f16(float f) {
    uint32_t x = cu_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) {
        float v = __fmul_rn(cu_bits_f32(ax), 16777216.0f);
        uint32_t m = (uint32_t)__float2int_rn(v);   /* nearest even, as lrintf */
        return (uint16_t)(sign | m);
    }
    uint32_t e = (ax >> 23) - 112, m = ax & 0x7fffffu;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

__device__ __forceinline__ float cu_bf16_to_f32(uint16_t h) { return cu_bits_f32((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t cu_f32_to_bf16(float f) {
    uint32_t x = cu_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

__device__ __forceinline__ float cu_fp8_to_f32(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80) << 24;
    uint32_t exp = (c >> 3) & 0xf, man = c & 7;
    if (exp == 0xf && man == 7) return cu_bits_f32(sign | 0x7fc00000u);
    if (exp == 0) {
        float v = __fmul_rn((float)man, 0.001953125f);
        return sign ? -v : v;
    }
    return cu_bits_f32(sign | ((exp + 120) << 23) | (man << 20));
}

__device__ __forceinline__ uint8_t cu_f32_to_fp8(float f) {
    uint32_t x = cu_f32_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7f);
    if (ax >= 0x43e00000u) return (uint8_t)(sign | 0x7e);
    if (ax < 0x3c800000u) {
        uint32_t m = (uint32_t)__float2int_rn(__fmul_rn(cu_bits_f32(ax), 512.0f));
        return (uint8_t)(sign | m);
    }
    uint32_t e = (ax >> 23) - 120, m = ax & 0x7fffffu;
    uint32_t h = (e << 3) | (m >> 20);
    uint32_t rest = m & 0xfffffu;
    if (rest > 0x80000u || (rest == 0x80000u && (h & 1))) h++;
    return (uint8_t)(sign | h);
}

/* ---- weights: element e of a row of type T (dtype.h's layouts, byte offsets spelled out) ---- */

__device__ __forceinline__ void cu_q4_K_scale_min(const uint8_t *scales, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = (scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4);
        *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
}

/* dtype_nl.c's tables */
__device__ static const int8_t cu_kvalues_iq4nl[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
                                                        1, 13, 25, 38, 53, 69, 89, 113 };
__device__ static const int8_t cu_kvalues_mxfp4[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

template <int T>
__device__ __forceinline__ float cu_dequant(const uint8_t *row, int64_t e) {
    if (T == DTYPE_F32) return ((const float *)row)[e];
    if (T == DTYPE_F16) return cu_f16_to_f32(cu_u16(row + 2 * e));
    if (T == DTYPE_BF16) return cu_bf16_to_f32(cu_u16(row + 2 * e));
    if (T == DTYPE_Q4_0) {                       /* d, qs[16]: 18 bytes */
        const uint8_t *b = row + (e / 32) * 18;
        const int j = (int)(e % 32);
        const int q = j < 16 ? (b[2 + j] & 0xf) : (b[2 + j - 16] >> 4);
        return __fmul_rn((float)(q - 8), cu_f16_to_f32(cu_u16(b)));
    }
    if (T == DTYPE_Q4_1) {                       /* d, m, qs[16]: 20 bytes */
        const uint8_t *b = row + (e / 32) * 20;
        const int j = (int)(e % 32);
        const int q = j < 16 ? (b[4 + j] & 0xf) : (b[4 + j - 16] >> 4);
        return __fadd_rn(__fmul_rn((float)q, cu_f16_to_f32(cu_u16(b))), cu_f16_to_f32(cu_u16(b + 2)));
    }
    if (T == DTYPE_Q5_0 || T == DTYPE_Q5_1) {    /* d, (m,) qh[4], qs[16]: 22 / 24 bytes */
        const bool q51 = T == DTYPE_Q5_1;
        const uint8_t *b = row + (e / 32) * (q51 ? 24 : 22), *qh = b + (q51 ? 4 : 2);
        const int j = (int)(e % 32);
        const int q = (j < 16 ? (qh[4 + j] & 0xf) : (qh[4 + j - 16] >> 4)) | ((qh[j / 8] >> (j % 8)) & 1) << 4;
        if (q51) return __fadd_rn(__fmul_rn((float)q, cu_f16_to_f32(cu_u16(b))), cu_f16_to_f32(cu_u16(b + 2)));
        return __fmul_rn((float)(q - 16), cu_f16_to_f32(cu_u16(b)));
    }
    if (T == DTYPE_Q8_0) {                       /* d, qs[32]: 34 bytes */
        const uint8_t *b = row + (e / 32) * 34;
        return __fmul_rn((float)(int8_t)b[2 + e % 32], cu_f16_to_f32(cu_u16(b)));
    }
    if (T == DTYPE_Q4_K || T == DTYPE_Q5_K) {    /* d, dmin, scales[12], (qh[32],) qs[128] */
        const bool q5 = T == DTYPE_Q5_K;
        const uint8_t *b = row + (e / 256) * (q5 ? 176 : 144);
        const int j = (int)(e % 256), c = j / 64, hi = (j % 64) / 32, l = j % 32;
        int sc, m;
        cu_q4_K_scale_min(b + 4, 2 * c + hi, &sc, &m);
        const float d1 = __fmul_rn(cu_f16_to_f32(cu_u16(b)), (float)sc);
        const float m1 = __fmul_rn(cu_f16_to_f32(cu_u16(b + 2)), (float)m);
        const uint8_t qs = b[(q5 ? 48 : 16) + 32 * c + l];
        int q = hi ? qs >> 4 : qs & 0xf;
        if (q5) q |= ((b[16 + l] >> (2 * c + hi)) & 1) << 4;
        return __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
    if (T == DTYPE_Q6_K) {                       /* ql[128], qh[64], scales[16], d: 210 bytes */
        const uint8_t *b = row + (e / 256) * 210;
        const int j = (int)(e % 256), h = j / 128, s = (j % 128) / 32, l = j % 32;
        const int lo = (b[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 0xf;
        const int hi2 = (b[128 + 32 * h + l] >> (2 * s)) & 3;
        const float dl = __fmul_rn(cu_f16_to_f32(cu_u16(b + 208)), (float)(int8_t)b[192 + 8 * h + 2 * s + l / 16]);
        return __fmul_rn(dl, (float)((lo | (hi2 << 4)) - 32));
    }
    if (T == DTYPE_Q2_K) {                       /* scales[16], qs[64], d, dmin: 84 bytes */
        const uint8_t *b = row + (e / 256) * 84;
        const int j = (int)(e % 256), h = j / 128, s = (j % 128) / 32, l = j % 32, sc = b[j / 16];
        const float dl = __fmul_rn(cu_f16_to_f32(cu_u16(b + 80)), (float)(sc & 0xf));
        const float ml = __fmul_rn(cu_f16_to_f32(cu_u16(b + 82)), (float)(sc >> 4));
        return __fsub_rn(__fmul_rn(dl, (float)((b[16 + 32 * h + l] >> (2 * s)) & 3)), ml);
    }
    if (T == DTYPE_Q3_K) {                       /* hmask[32], qs[64], scales[12], d: 110 bytes */
        const uint8_t *b = row + (e / 256) * 110;
        const int j = (int)(e % 256), h = j / 128, s = (j % 128) / 32, l = j % 32, r = j / 16;
        const uint8_t *scales = b + 96;
        const int sc = (r < 8 ? scales[r] & 0xf : scales[r - 8] >> 4) | ((scales[8 + r % 4] >> (2 * (r / 4))) & 3) << 4;
        const int q = ((b[32 + 32 * h + l] >> (2 * s)) & 3) - ((b[l] >> (4 * h + s)) & 1 ? 0 : 4);
        return __fmul_rn(__fmul_rn(cu_f16_to_f32(cu_u16(b + 108)), (float)(sc - 32)), (float)q);
    }
    if (T == DTYPE_IQ4_NL || T == DTYPE_MXFP4) {  /* d (f16) or e (e8m0), qs[16]: 18 / 17 bytes */
        const bool mx = T == DTYPE_MXFP4;
        const uint8_t *b = row + (e / 32) * (mx ? 17 : 18), *qs = b + (mx ? 1 : 2);
        const int j = (int)(e % 32), q = j < 16 ? qs[j] & 0xf : qs[j - 16] >> 4;
        if (mx) {
            const uint32_t x = b[0], bits = x < 2 ? 0x00200000u << x : (x - 1) << 23;
            return __fmul_rn((float)cu_kvalues_mxfp4[q], cu_bits_f32(bits));
        }
        return __fmul_rn(cu_f16_to_f32(cu_u16(b)), (float)cu_kvalues_iq4nl[q]);
    }
    if (T == DTYPE_IQ4_XS) {                     /* d, scales_h, scales_l[4], qs[128]: 136 bytes */
        const uint8_t *b = row + (e / 256) * 136;
        const int j = (int)(e % 256), r = j / 32, l = j % 32;
        const int sc = ((b[4 + r / 2] >> (4 * (r % 2))) & 0xf) | ((cu_u16(b + 2) >> (2 * r)) & 3) << 4;
        const uint8_t *qs = b + 8 + 16 * r;
        const int q = l < 16 ? qs[l] & 0xf : qs[l - 16] >> 4;
        return __fmul_rn(__fmul_rn(cu_f16_to_f32(cu_u16(b)), (float)(sc - 32)), (float)cu_kvalues_iq4nl[q]);
    }
    return 0.0f;
}

/* ---- KV storage ---- */

__device__ __forceinline__ size_t cu_kv_row(const struct kv_layer_view &kv, size_t slot, int h) {
    const size_t bs = (size_t)kv.block_size;
    return (slot / bs * (size_t)kv.n_head_kv + (size_t)h) * bs + slot % bs;
}

/* Element i of K or V storage as f32 (8-bit types: the code, unscaled). */
__device__ __forceinline__ float cu_kv_load(int type, const void *base, size_t i) {
    switch (type) {
    case KV_F32: return ((const float *)base)[i];
    case KV_F16: return cu_f16_to_f32(((const uint16_t *)base)[i]);
    case KV_BF16: return cu_bf16_to_f32(((const uint16_t *)base)[i]);
    case KV_INT8: return (float)((const int8_t *)base)[i];
    case KV_FP8: return cu_fp8_to_f32(((const uint8_t *)base)[i]);
    default: return 0.0f;
    }
}

/* ---- the device error record (cuda_kernels.h) ---- */

__device__ __forceinline__ void cu_report(int *err, int what, int value) {
    if (atomicCAS(err, 0, what) == 0) err[1] = value;
}

/* ---- reductions ---- */

__device__ __forceinline__ float cu_warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float cu_warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024), in a
 * fixed order; every thread gets it.  red: 32 floats of shared memory. */
__device__ __forceinline__ float cu_block_sum(float v, float *red) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = cu_warp_sum(v);
    __syncthreads();                 /* red may still be read from a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return cu_warp_sum(v);
}

#define CU_LAUNCH_CHECK() cudaGetLastError()

#endif
