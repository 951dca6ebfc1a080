/* matmul.cu — y (n, M) = x (n, K) · wᵀ for every weight type, correct first
 * and batch-invariant.
 *
 * One thread block per weight row r and tile of MM_TOK_TILE tokens: the
 * block dequantizes the row, MM_KC elements at a time, into shared memory
 * (exactly as dtype.h's dequantizers: cu_dequant), then each warp takes
 * MM_TOK_PER_WARP tokens and, per token, lane l accumulates x[k] * w[k] for
 * k = l, l + 32, ... (FMA), and the 32 lane sums are combined by a fixed
 * butterfly.  The arithmetic of y[t][r] depends on K alone — never on n,
 * on which warp or block computed it, or on the batch around t — so a
 * sequence's logits are the same whatever shares its step.
 *
 * For decode (n = 1) this is a dequantizing GEMV reading each weight byte
 * once; for prefill every block rereads its token tile's activations from
 * L2; in the fast mode large n goes to cuBLAS instead (gemm.cu, cuda_plan.h's
 * cuda_gemm_pick), KVLLM_ACT=f32 keeps this kernel for every n. */
#include "backend/cuda/cuda_common.cuh"

#define MM_THREADS 256
#define MM_WARPS (MM_THREADS / 32)
#define MM_KC 1024                    /* elements per chunk: a multiple of every block size (32, 256) */
#define MM_TOK_PER_WARP 8
#define MM_TOK_TILE (MM_WARPS * MM_TOK_PER_WARP)

template <int T>
__global__ void __launch_bounds__(MM_THREADS) k_matmul(float *y, const uint8_t *w, size_t row_bytes, int64_t K,
                                                       int64_t M, const float *x, int n) {
    __shared__ float ws[MM_KC];
    const int64_t r = blockIdx.x;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int t0 = blockIdx.y * MM_TOK_TILE + warp * MM_TOK_PER_WARP;
    const uint8_t *row = w + (size_t)r * row_bytes;
    float acc[MM_TOK_PER_WARP];
#pragma unroll
    for (int j = 0; j < MM_TOK_PER_WARP; j++) acc[j] = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += MM_KC) {
        const int kc = (int)(K - k0 < MM_KC ? K - k0 : MM_KC);
        for (int e = threadIdx.x; e < kc; e += MM_THREADS) ws[e] = cu_dequant<T>(row, k0 + e);
        __syncthreads();
#pragma unroll
        for (int j = 0; j < MM_TOK_PER_WARP; j++) {
            if (t0 + j < n) {
                const float *xt = x + (size_t)(t0 + j) * K + k0;
                float a = acc[j];
                for (int e = lane; e < kc; e += 32) a = fmaf(xt[e], ws[e], a);
                acc[j] = a;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < MM_TOK_PER_WARP; j++) {
        const float v = cu_warp_sum(acc[j]);
        if (lane == 0 && t0 + j < n) y[(size_t)(t0 + j) * M + r] = v;
    }
}

extern "C" cudaError_t cuk_matmul(cudaStream_t s, float *y, const struct tensor *w, const float *x, int n) {
    if (n <= 0 || w->ne1 <= 0) return cudaSuccess;
    if (w->ne1 > 0x7fffffff) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)w->ne1, (unsigned)((n + MM_TOK_TILE - 1) / MM_TOK_TILE));
    const uint8_t *d = (const uint8_t *)w->data;
#define MM(T) case T: k_matmul<T><<<grid, MM_THREADS, 0, s>>>(y, d, w->row_bytes, w->ne0, w->ne1, x, n); break
    switch (w->type) {
    MM(DTYPE_F32); MM(DTYPE_F16); MM(DTYPE_BF16); MM(DTYPE_Q8_0); MM(DTYPE_Q4_0); MM(DTYPE_Q4_1);
    MM(DTYPE_Q5_0); MM(DTYPE_Q5_1); MM(DTYPE_Q2_K); MM(DTYPE_Q3_K); MM(DTYPE_Q4_K); MM(DTYPE_Q5_K); MM(DTYPE_Q6_K);
    MM(DTYPE_IQ4_NL); MM(DTYPE_IQ4_XS); MM(DTYPE_MXFP4);
    default: return cudaErrorInvalidValue;
    }
#undef MM
    return CU_LAUNCH_CHECK();
}
