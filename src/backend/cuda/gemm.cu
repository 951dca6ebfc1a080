/* gemm.cu — matmul of many tokens by cuBLAS on tensor cores.  Checked on an H200 (docs/GPU.md, "First run on hardware").
 *
 * y (n, M) f32 = x (n, K) · wᵀ with cublasGemmEx: 16-bit inputs, f32
 * accumulation (CUBLAS_COMPUTE_32F, never the 16-bit compute types).  Which
 * matmuls come here is cuda_plan.h's cuda_gemm_pick:
 *   - F16 / BF16 weights: used in place; the activations are rounded to the
 *     weight's type by k_to_16 into the context's scratch (n * K values);
 *   - quantized weights: dequantized (cu_dequant, dtype.h's values) into an
 *     f16 scratch a slab of rows at a time (CUDA_GEMM_SCRATCH_HALFS), one
 *     GEMM per slab, as llama.cpp does for large batches without its MMQ
 *     kernels: the weight's dequantization is paid once per n tokens.
 * Row-major y = x · wᵀ is, in cuBLAS's column-major terms, the (M x n)
 * matrix wᵀ(K x M)ᵀ · x(K x n): op(A) = T on w (lda K), op(B) = N on x
 * (ldb K), C = y (ldc M); a slab of rows r0 .. r0 + m is A = w + r0 K and
 * C = y + r0 with the same leading dimensions.
 *
 * Rounding: each product's inputs are 16-bit (f16 2^-11, bf16 2^-8
 * relative), within the 8-bit activations' bound for the quantized types;
 * test_backend_ops holds the CUDA backend to CUDA_GEMM tolerances for the
 * F16 / BF16 ones.  cuBLAS picks its kernel by shape, so a row's result
 * depends on n (docs/GPU.md, "Batch invariance on CUDA"). */
#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/cuda/cuda_plan.h"
}

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* A workspace of our own, set after the stream (cublasSetStream resets it to the default pool): no
 * allocation inside a GEMM, so the calls can be captured into a CUDA graph.  32 MiB: cuBLAS's
 * recommendation for Hopper (4 MiB before it). */
#define BLAS_WORKSPACE ((size_t)32 << 20)

struct cuk_blas {
    cublasHandle_t h;
    void *ws;
};

extern "C" void cuk_blas_free(struct cuk_blas *b) {
    if (!b) return;
    if (b->h) cublasDestroy(b->h);
    cudaFree(b->ws);
    free(b);
}

extern "C" int cuk_blas_new(cudaStream_t s, struct cuk_blas **out) {
    *out = NULL;
    struct cuk_blas *b = (struct cuk_blas *)calloc(1, sizeof *b);
    if (!b) return (int)CUBLAS_STATUS_ALLOC_FAILED;
    cublasStatus_t st = cublasCreate(&b->h);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(b->h, s);
    if (st == CUBLAS_STATUS_SUCCESS && cudaMalloc(&b->ws, BLAS_WORKSPACE) != cudaSuccess) {
        (void)cudaGetLastError();   /* reported as the status below; the runtime's error cleared */
        b->ws = NULL;
        st = CUBLAS_STATUS_ALLOC_FAILED;
    }
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetWorkspace(b->h, b->ws, BLAS_WORKSPACE);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cuk_blas_free(b);
        return (int)st;
    }
    *out = b;
    return 0;
}

extern "C" const char *cuk_blas_status_name(int status) {
    return cublasGetStatusName((cublasStatus_t)status);
}

/* dst (n) = x (n) rounded to f16 or bf16, nearest even */
template <bool BF> __global__ void k_to_16(uint16_t *dst, const float *x, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = BF ? __bfloat16_as_ushort(__float2bfloat16_rn(x[i])) : __half_as_ushort(__float2half_rn(x[i]));
}

/* dst (m, K) f16 = rows r0 .. r0 + m of w, each value as dtype.h dequantizes it */
template <int T>
__global__ void k_dequant_16(uint16_t *dst, const uint8_t *w, size_t row_bytes, int64_t K, int64_t r0, int64_t m) {
    const size_t total = (size_t)m * (size_t)K;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int64_t r = (int64_t)(i / (size_t)K), k = (int64_t)(i % (size_t)K);
        dst[i] = __half_as_ushort(__float2half_rn(cu_dequant<T>(w + (size_t)(r0 + r) * row_bytes, k)));
    }
}

static unsigned grid_for(size_t n) {
    const size_t b = (n + 255) / 256;
    return (unsigned)(b < 4096 ? (b ? b : 1) : 4096);
}

static cudaError_t dequant(cudaStream_t s, uint16_t *dst, const struct tensor *w, int64_t r0, int64_t m) {
    const uint8_t *d = (const uint8_t *)w->data;
    const unsigned grid = grid_for((size_t)m * (size_t)w->ne0);
#define DQ(T) case T: k_dequant_16<T><<<grid, 256, 0, s>>>(dst, d, w->row_bytes, w->ne0, r0, m); break
    switch (w->type) {
    DQ(DTYPE_Q8_0); DQ(DTYPE_Q4_0); DQ(DTYPE_Q4_1); DQ(DTYPE_Q5_0); DQ(DTYPE_Q5_1); DQ(DTYPE_Q2_K); DQ(DTYPE_Q3_K);
    DQ(DTYPE_Q4_K); DQ(DTYPE_Q5_K); DQ(DTYPE_Q6_K); DQ(DTYPE_IQ4_NL); DQ(DTYPE_IQ4_XS); DQ(DTYPE_MXFP4);
    default: return cudaErrorInvalidValue;
    }
#undef DQ
    return CU_LAUNCH_CHECK();
}

extern "C" cudaError_t cuk_gemm(struct cuk_blas *b, cudaStream_t s, int kind, float *y, const struct tensor *w,
                                const float *x, int n, uint16_t *xh, uint16_t *wh, size_t wh_halfs, int *blas_status) {
    *blas_status = 0;
    const int64_t K = w->ne0, M = w->ne1;
    if (n <= 0 || M <= 0) return cudaSuccess;
    if (K > 0x7fffffff || M > 0x7fffffff) return cudaErrorInvalidValue;
    const bool bf = kind == CUDA_GEMM_BF16;
    const size_t nx = (size_t)n * (size_t)K;
    if (bf) k_to_16<true><<<grid_for(nx), 256, 0, s>>>(xh, x, nx);
    else k_to_16<false><<<grid_for(nx), 256, 0, s>>>(xh, x, nx);
    cudaError_t e = CU_LAUNCH_CHECK();
    if (e != cudaSuccess) return e;
    const cudaDataType_t t16 = bf ? CUDA_R_16BF : CUDA_R_16F;
    const float one = 1.0f, zero = 0.0f;
    if (kind != CUDA_GEMM_DEQUANT_F16) {   /* the weights as they are: rows of K 16-bit values */
        const cublasStatus_t st = cublasGemmEx(b->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, n, (int)K, &one, w->data, t16,
                                               (int)K, xh, t16, (int)K, &zero, y, CUDA_R_32F, (int)M,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        *blas_status = (int)st;
        return st == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
    }
    const int64_t slab = cuda_gemm_slab_rows(K, wh_halfs);
    if (slab <= 0) return cudaErrorInvalidValue;
    for (int64_t r0 = 0; r0 < M; r0 += slab) {
        const int64_t m = M - r0 < slab ? M - r0 : slab;
        e = dequant(s, wh, w, r0, m);
        if (e != cudaSuccess) return e;
        const cublasStatus_t st = cublasGemmEx(b->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, n, (int)K, &one, wh, CUDA_R_16F,
                                               (int)K, xh, CUDA_R_16F, (int)K, &zero, y + r0, CUDA_R_32F, (int)M,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        *blas_status = (int)st;
        if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
    }
    return cudaSuccess;
}
