/* cuda_kernels.h — the launchers of the CUDA kernels (kernels.cu, matmul.cu,
 * attention.cu), callable from C (cuda.c).  Each issues its kernels on
 * stream s and returns cudaSuccess or the launch error (cudaGetLastError);
 * none synchronizes, none allocates.  Every pointer is device memory except
 * the structs passed by address (host memory, read before returning).
 * n <= 0 launches nothing.
 *
 * Errors a kernel can only find on the device (a row id or position out of
 * range, read from device memory) are recorded in err: err[0] = one of enum
 * cuda_dev_err (the first one wins), err[1] = the offending value.  cuda.c
 * reads it at sync and turns it into KVLLM_ERANGE. */
#ifndef KVLLM_CUDA_KERNELS_H
#define KVLLM_CUDA_KERNELS_H

#include "backend/backend.h"
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

enum cuda_dev_err {
    CUDA_DEV_OK = 0,
    CUDA_DEV_GET_ROWS_ID,         /* get_rows: an id outside [0, rows) */
    CUDA_DEV_ATTN_POS,            /* paged_attention: a position outside [0, max_ctx) */
    CUDA_DEV_ATTN_BLOCK,          /* paged_attention: a position past the block table's max_blocks */
};

/* Threads and positions per block of the attention kernel. */
#define CUDA_ATTN_WARPS 4
#define CUDA_ATTN_TILE 32

cudaError_t cuk_matmul(cudaStream_t s, float *y, const struct tensor *w, const float *x, int n);
/* The 8-bit path (matmul_q8.cu): whether it has weights of type with rows of K, and the matmul:
 * x quantized into xq (n * K codes) and xd (n * K / 32 scales), then y (n, M) by __dp4a.
 * Arithmetic, batch invariance: matmul_q8.cu's opening comment. */
bool cuk_matmul_q8_takes(uint32_t type, int64_t K);
cudaError_t cuk_matmul_q8(cudaStream_t s, float *y, const struct tensor *w, const float *x, int n, int8_t *xq,
                          float *xd);
cudaError_t cuk_get_rows(cudaStream_t s, int *err, float *y, const struct tensor *w, const int32_t *ids, int n);
cudaError_t cuk_gather_rows(cudaStream_t s, float *y, const float *x, const int32_t *ids, int n, int dim);
cudaError_t cuk_argmax(cudaStream_t s, int32_t *ids, const float *x, int n, int dim);
/* sample.cu: ids (n) drawn from x (n, dim) by chain.h's chain with rows (n) (device memory) */
cudaError_t cuk_sample(cudaStream_t s, int32_t *ids, const float *x, const struct sample_chain *rows, int n,
                       int dim);
cudaError_t cuk_rmsnorm(cudaStream_t s, float *y, const float *x, const float *w, int n, int dim, float eps);
cudaError_t cuk_add_rmsnorm(cudaStream_t s, float *y, float *x, const float *h, const float *w, int n, int dim,
                            float eps);
cudaError_t cuk_rope_kv_store(cudaStream_t s, const struct rope_kv_args *a);
cudaError_t cuk_layernorm(cudaStream_t s, float *y, const float *x, const float *w, const float *b, int n, int dim,
                          float eps);
cudaError_t cuk_rope(cudaStream_t s, float *x, int n, int n_head, int head_dim, const int32_t *pos,
                     const struct rope_params *p);
cudaError_t cuk_add_bias(cudaStream_t s, float *y, const float *b, int n, int dim);
cudaError_t cuk_add(cudaStream_t s, float *y, const float *x, long n);
cudaError_t cuk_swiglu(cudaStream_t s, float *g, const float *u, long n);
cudaError_t cuk_gelu(cudaStream_t s, float *x, long n);
cudaError_t cuk_geglu(cudaStream_t s, float *g, const float *u, long n);
cudaError_t cuk_scale(cudaStream_t s, float *x, long n, float sc);
cudaError_t cuk_softcap(cudaStream_t s, float *x, long n, float cap);
cudaError_t cuk_kv_store(cudaStream_t s, const struct kv_layer_view *kv, const int32_t *slots, const float *k,
                         const float *v, int n);
/* partials: cuda_attn_partial_floats(n_tokens, n_head, head_dim, max_ctx) floats; max_ctx bounds
 * every pos[t] + 1.  smem_max: the device's opt-in shared memory per block (the caller checks that
 * cuda_attn_smem_bytes fits). */
cudaError_t cuk_paged_attention(cudaStream_t s, int *err, const struct paged_attn_args *a, float *partials,
                                int max_ctx);
/* Whether paged attention of a takes a head-size kernel (head_dim 64, 128, 256 on 16-byte aligned
 * storage: cuda_attn_hd_smem_bytes of shared memory) rather than the generic one
 * (cuda_attn_smem_bytes); a property of the model and its KV storage, never of the batch. */
bool cuk_attention_hd_takes(const struct paged_attn_args *a);
/* Allow the attention kernels smem_bytes of dynamic shared memory (once per backend). */
cudaError_t cuk_attention_setup(size_t smem_bytes);

/* Paged attention of a step of many query tokens on tensor cores (attention_prefill.cu): whether a
 * takes it in the fast mode (cuda_plan.h's cuda_pf_takes, a KV type it has, 16-byte aligned K, V and q, 8-byte
 * aligned out; cuda_pf_smem_bytes of shared memory, which the caller checks), the launch, and the
 * shared-memory allowance (once per backend).  Errors as cuk_paged_attention's. */
bool cuk_attention_prefill_takes(const struct paged_attn_args *a);
cudaError_t cuk_attention_prefill(cudaStream_t s, int *err, const struct paged_attn_args *a, int max_ctx);
cudaError_t cuk_attention_prefill_setup(size_t smem_bytes);

/* cuBLAS (gemm.cu), one handle per execution context, bound to its stream.  cuk_blas_new returns 0
 * or a cublasStatus_t (cuk_blas_status_name names it); cuk_blas_free is NULL-safe. */
struct cuk_blas;
int cuk_blas_new(cudaStream_t s, struct cuk_blas **out);
void cuk_blas_free(struct cuk_blas *b);
const char *cuk_blas_status_name(int status);
/* y (n, M) = x (n, K) · wᵀ by cublasGemmEx, kind an enum cuda_gemm other than NONE (cuda_plan.h).
 * xh: n * K 16-bit values of scratch (the rounded activations); wh: wh_halfs of scratch for the
 * dequantized slabs (CUDA_GEMM_DEQUANT_F16 only).  F16 / BF16 weights must be rows of exactly K
 * values.  A cuBLAS failure returns cudaErrorUnknown with its status in *blas_status. */
cudaError_t cuk_gemm(struct cuk_blas *b, cudaStream_t s, int kind, float *y, const struct tensor *w, const float *x,
                     int n, uint16_t *xh, uint16_t *wh, size_t wh_halfs, int *blas_status);

#ifdef __cplusplus
}
#endif
#endif
