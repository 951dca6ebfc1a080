/* cpu_ops.h — the scalar CPU ops (cpu_ops.c, kv_kernels.c): the reference
 * kernel set, with the contracts of struct backend_ops.  A faster set is a
 * copy of this table with some entries replaced (cpu.c). */
#ifndef KVLLM_CPU_OPS_H
#define KVLLM_CPU_OPS_H

#include "backend/cpu/cpu_internal.h"

int cpu_matmul(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n);
int cpu_get_rows(struct backend_ctx *c, float *y, const struct tensor *w, const int32_t *ids, int n);
int cpu_gather_rows(struct backend_ctx *c, float *y, const float *x, const int32_t *ids, int n, int dim);
int cpu_argmax(struct backend_ctx *c, int32_t *ids, const float *x, int n, int dim);
int cpu_sample(struct backend_ctx *c, const struct sample_args *a);   /* sample.c */
int cpu_rmsnorm(struct backend_ctx *c, float *y, const float *x, const struct tensor *w, int n, int dim, float eps);
/* The fused ops: the set's own add and rmsnorm (rope and kv_store) in turn. */
int cpu_add_rmsnorm(struct backend_ctx *c, float *y, float *x, const float *h, const struct tensor *w, int n, int dim,
                    float eps);
int cpu_rope_kv_store(struct backend_ctx *c, const struct rope_kv_args *a);
int cpu_layernorm(struct backend_ctx *c, float *y, const float *x, const struct tensor *w, const struct tensor *b,
                  int n, int dim, float eps);
int cpu_rope(struct backend_ctx *c, float *x, int n, int n_head, int head_dim, const int32_t *pos,
             const struct rope_params *p);
int cpu_add_bias(struct backend_ctx *c, float *y, const struct tensor *b, int n, int dim);
int cpu_gelu(struct backend_ctx *c, float *x, long n);
int cpu_geglu(struct backend_ctx *c, float *g, const float *u, long n);
int cpu_scale(struct backend_ctx *c, float *x, long n, float s);
int cpu_softcap(struct backend_ctx *c, float *x, long n, float cap);
/* moe.c */
int cpu_moe_route(struct backend_ctx *c, int32_t *ids, float *weights, const float *logits, int n, int n_expert,
                  int n_used, bool norm);
int cpu_moe(struct backend_ctx *c, const struct moe_args *a);
int cpu_swiglu(struct backend_ctx *c, float *g, const float *u, long n);
int cpu_add(struct backend_ctx *c, float *y, const float *x, long n);
int cpu_copy_blocks(struct backend_ctx *c, const struct kv_layer_view *layers, int n_layer,
                    const int32_t (*pairs)[2], int n);
/* act_avx2.c: gelu, geglu, swiglu and kv_store of the avx2 and avx512 sets (AVX2 +
 * FMA, over the thread pool; their own rounding, stated there); call only
 * when cpu_features_get() reports avx2, fma and f16c. */
int cpu_gelu_avx2(struct backend_ctx *c, float *x, long n);
int cpu_geglu_avx2(struct backend_ctx *c, float *g, const float *u, long n);
int cpu_swiglu_avx2(struct backend_ctx *c, float *g, const float *u, long n);
int cpu_kv_store_avx2(struct backend_ctx *c, const struct kv_layer_view *kv, const int32_t *slots, const float *k,
                      const float *v, int n);
/* y = expf(x) over n values, libm's bits by avx2_expf (avx2_util.h): test_backend_ops's check of it. */
void cpu_expf_avx2(const float *x, float *y, long n);
/* act_avx512.c (call only where cpu_act_avx512_built() and the CPU has AVX-512 F/BW/VL): the same 16
 * lanes at a time; SwiGLU's rows with it, and the avx512 set's swiglu op over the pool (act_avx2.c). */
void cpu_expf_avx512(const float *x, float *y, long n);
void cpu_swiglu_rows_avx512(float *g, const float *u, long n);
int cpu_swiglu_avx512(struct backend_ctx *c, float *g, const float *u, long n);

#endif
