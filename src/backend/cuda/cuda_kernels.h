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

#ifdef __cplusplus
}
#endif
#endif
