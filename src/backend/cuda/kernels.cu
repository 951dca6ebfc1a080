/* kernels.cu — the CUDA row-wise and elementwise ops, correct first: one
 * thread block per row for the norms, get_rows and kv_store (a warp per
 * head row), grid-stride loops for the elementwise ops.  Each mirrors the
 * scalar op in cpu_ops.c / kv_kernels.c; get_rows, gather_rows, add,
 * add_bias and kv_store give the same bits. */
#include "backend/cuda/cuda_common.cuh"

#include <math.h>

#define ROW_THREADS 256

static unsigned grid_for(long n, int threads) {
    long b = (n + threads - 1) / threads;
    return (unsigned)(b < 65536 ? b : 65536);   /* grid-stride loops cover the rest */
}

/* ---- get_rows / gather_rows ---- */

template <int T>
__global__ void k_get_rows(float *y, const uint8_t *w, size_t row_bytes, int64_t K, int64_t M, const int32_t *ids,
                           int *err) {
    const int i = blockIdx.x;
    const int32_t id = ids[i];
    if (id < 0 || id >= M) {
        if (threadIdx.x == 0) cu_report(err, CUDA_DEV_GET_ROWS_ID, id);
        return;
    }
    const uint8_t *row = w + (size_t)id * row_bytes;
    for (int64_t e = threadIdx.x; e < K; e += blockDim.x) y[(size_t)i * K + e] = cu_dequant<T>(row, e);
}

extern "C" cudaError_t cuk_get_rows(cudaStream_t s, int *err, float *y, const struct tensor *w, const int32_t *ids,
                                    int n) {
    if (n <= 0) return cudaSuccess;
    const uint8_t *d = (const uint8_t *)w->data;
#define GR(T) case T: k_get_rows<T><<<n, ROW_THREADS, 0, s>>>(y, d, w->row_bytes, w->ne0, w->ne1, ids, err); break
    switch (w->type) {
    GR(DTYPE_F32); GR(DTYPE_F16); GR(DTYPE_BF16); GR(DTYPE_Q8_0); GR(DTYPE_Q4_0); GR(DTYPE_Q4_1);
    GR(DTYPE_Q5_0); GR(DTYPE_Q5_1); GR(DTYPE_Q2_K); GR(DTYPE_Q3_K); GR(DTYPE_Q4_K); GR(DTYPE_Q5_K); GR(DTYPE_Q6_K);
    GR(DTYPE_IQ4_NL); GR(DTYPE_IQ4_XS); GR(DTYPE_MXFP4);
    default: return cudaErrorInvalidValue;
    }
#undef GR
    return CU_LAUNCH_CHECK();
}

__global__ void k_gather_rows(float *y, const float *x, const int32_t *ids, int dim) {
    const int i = blockIdx.x;
    const float *src = x + (size_t)ids[i] * dim;
    for (int e = threadIdx.x; e < dim; e += blockDim.x) y[(size_t)i * dim + e] = src[e];
}

extern "C" cudaError_t cuk_gather_rows(cudaStream_t s, float *y, const float *x, const int32_t *ids, int n, int dim) {
    if (n <= 0 || dim <= 0) return cudaSuccess;
    k_gather_rows<<<n, ROW_THREADS, 0, s>>>(y, x, ids, dim);
    return CU_LAUNCH_CHECK();
}

/* ---- argmax: a block per row (the sampling stage's greedy token) ---- */

/* (value, index) ordered as cpu_argmax orders them: larger value first,
 * lower index on equal values; NaN is -inf; index -1 loses to everything. */
__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi) {
    if (bi < 0) return i >= 0 && v > -INFINITY;
    if (i < 0) return false;
    return v > bv || (v == bv && i < bi);
}

__global__ void k_argmax(int32_t *ids, const float *x, int dim) {
    __shared__ float sv[ROW_THREADS];
    __shared__ int si[ROW_THREADS];
    const float *r = x + (size_t)blockIdx.x * dim;
    float bv = -INFINITY;
    int bi = -1;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = r[j];
        if (v != v) continue;   /* NaN */
        if (am_better(v, j, bv, bi)) { bv = v; bi = j; }
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && am_better(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + s];
            si[threadIdx.x] = si[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) ids[blockIdx.x] = si[0];
}

extern "C" cudaError_t cuk_argmax(cudaStream_t s, int32_t *ids, const float *x, int n, int dim) {
    if (n <= 0) return cudaSuccess;
    k_argmax<<<n, ROW_THREADS, 0, s>>>(ids, x, dim);
    return CU_LAUNCH_CHECK();
}

/* ---- norms: a block per row ---- */

/* One row of rmsnorm, the block's threads striding over it (rmsnorm and
 * the fused add_rmsnorm share it, so both give the same bits). */
__device__ void rmsnorm_row(float *yt, const float *xt, const float *w, int dim, float eps) {
    __shared__ float red[32];
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xt[i] * xt[i];
    ss = cu_block_sum(ss, red);
    const float sc = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yt[i] = xt[i] * sc * w[i];
}

__global__ void k_rmsnorm(float *y, const float *x, const float *w, int dim, float eps) {
    rmsnorm_row(y + (size_t)blockIdx.x * dim, x + (size_t)blockIdx.x * dim, w, dim, eps);
}

/* x += h, then y = rmsnorm(x), a block per row: each thread adds the
 * elements it later reads (same stride), and reads its h before the
 * norm's reduction, so y may be h. */
__global__ void k_add_rmsnorm(float *y, float *x, const float *h, const float *w, int dim, float eps) {
    const size_t r = (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) x[r + i] = __fadd_rn(x[r + i], h[r + i]);
    rmsnorm_row(y + r, x + r, w, dim, eps);
}

extern "C" cudaError_t cuk_add_rmsnorm(cudaStream_t s, float *y, float *x, const float *h, const float *w, int n,
                                       int dim, float eps) {
    if (n <= 0 || dim <= 0) return cudaSuccess;
    k_add_rmsnorm<<<n, ROW_THREADS, 0, s>>>(y, x, h, w, dim, eps);
    return CU_LAUNCH_CHECK();
}

extern "C" cudaError_t cuk_rmsnorm(cudaStream_t s, float *y, const float *x, const float *w, int n, int dim,
                                   float eps) {
    if (n <= 0 || dim <= 0) return cudaSuccess;
    k_rmsnorm<<<n, ROW_THREADS, 0, s>>>(y, x, w, dim, eps);
    return CU_LAUNCH_CHECK();
}

__global__ void k_layernorm(float *y, const float *x, const float *w, const float *b, int dim, float eps) {
    __shared__ float red[32];
    const float *xt = x + (size_t)blockIdx.x * dim;
    float *yt = y + (size_t)blockIdx.x * dim;
    float sum = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) sum += xt[i];
    const float mean = cu_block_sum(sum, red) / (float)dim;
    float var = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) var += (xt[i] - mean) * (xt[i] - mean);
    var = cu_block_sum(var, red);
    const float sc = 1.0f / sqrtf(var / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yt[i] = (xt[i] - mean) * sc * w[i] + (b ? b[i] : 0.0f);
}

extern "C" cudaError_t cuk_layernorm(cudaStream_t s, float *y, const float *x, const float *w, const float *b, int n,
                                     int dim, float eps) {
    if (n <= 0 || dim <= 0) return cudaSuccess;
    k_layernorm<<<n, ROW_THREADS, 0, s>>>(y, x, w, b, dim, eps);
    return CU_LAUNCH_CHECK();
}

/* ---- rope: a block per token; angles in double, as cpu_rope ---- */

/* Token t's heads of x (n_head * head_dim) rotated, the block's threads
 * striding over (head, pair) (rope and the fused rope_kv_store share it). */
__device__ void rope_token(float *x, int t, int n_head, int head_dim, int32_t pos, const struct rope_params &p,
                           const float *ff) {
    const int n_rot = p.n_rot, half = n_rot / 2;
    const int step = p.neox ? 1 : 2, other = p.neox ? half : 1;
    float *xt = x + (size_t)t * n_head * head_dim;
    for (int k = threadIdx.x; k < half * n_head; k += blockDim.x) {
        const int i = k % half, h = k / half;
        double ang = (double)pos * pow((double)p.theta, -2.0 * i / (double)n_rot) * rope_pair_scale(&p, i);
        if (ff) ang /= (double)ff[i];
        const double ms = p.attn_factor != 0 ? (double)p.attn_factor : 1.0;
        const float cs = (float)(cos(ang) * ms), sn = (float)(sin(ang) * ms);
        float *q = xt + (size_t)h * head_dim + (size_t)i * step;
        const float a = q[0], b = q[other];
        q[0] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
        q[other] = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
    }
}

__global__ void k_rope(float *x, int n_head, int head_dim, const int32_t *pos, struct rope_params p,
                       const float *ff) {   /* p.freq_factors is host memory: ff is its data */
    rope_token(x, blockIdx.x, n_head, head_dim, pos[blockIdx.x], p, ff);
}

extern "C" cudaError_t cuk_rope(cudaStream_t s, float *x, int n, int n_head, int head_dim, const int32_t *pos,
                                const struct rope_params *p) {
    if (n <= 0 || p->n_rot < 2) return cudaSuccess;
    const float *ff = p->freq_factors ? (const float *)p->freq_factors->data : NULL;
    k_rope<<<n, ROW_THREADS, 0, s>>>(x, n_head, head_dim, pos, *p, ff);
    return CU_LAUNCH_CHECK();
}

/* ---- elementwise ---- */

__global__ void k_add_bias(float *y, const float *b, long total, int dim) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x)
        y[i] += b[i % dim];
}

extern "C" cudaError_t cuk_add_bias(cudaStream_t s, float *y, const float *b, int n, int dim) {
    const long total = (long)n * dim;
    if (total <= 0) return cudaSuccess;
    k_add_bias<<<grid_for(total, ROW_THREADS), ROW_THREADS, 0, s>>>(y, b, total, dim);
    return CU_LAUNCH_CHECK();
}

__global__ void k_add(float *y, const float *x, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) y[i] += x[i];
}

extern "C" cudaError_t cuk_add(cudaStream_t s, float *y, const float *x, long n) {
    if (n <= 0) return cudaSuccess;
    k_add<<<grid_for(n, ROW_THREADS), ROW_THREADS, 0, s>>>(y, x, n);
    return CU_LAUNCH_CHECK();
}

__global__ void k_swiglu(float *g, const float *u, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

extern "C" cudaError_t cuk_swiglu(cudaStream_t s, float *g, const float *u, long n) {
    if (n <= 0) return cudaSuccess;
    k_swiglu<<<grid_for(n, ROW_THREADS), ROW_THREADS, 0, s>>>(g, u, n);
    return CU_LAUNCH_CHECK();
}

__global__ void k_gelu(float *x, long n) {
    const float k = 0.7978845608028654f;   /* sqrt(2 / pi) */
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
}

extern "C" cudaError_t cuk_gelu(cudaStream_t s, float *x, long n) {
    if (n <= 0) return cudaSuccess;
    k_gelu<<<grid_for(n, ROW_THREADS), ROW_THREADS, 0, s>>>(x, n);
    return CU_LAUNCH_CHECK();
}

__global__ void k_geglu(float *g, const float *u, long n) {
    const float k = 0.7978845608028654f;   /* sqrt(2 / pi) */
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const float v = g[i];
        g[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v))) * u[i];
    }
}

extern "C" cudaError_t cuk_geglu(cudaStream_t s, float *g, const float *u, long n) {
    if (n <= 0) return cudaSuccess;
    k_geglu<<<grid_for(n, ROW_THREADS), ROW_THREADS, 0, s>>>(g, u, n);
    return CU_LAUNCH_CHECK();
}

__global__ void k_scale(float *x, long n, float sc) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) x[i] *= sc;
}

extern "C" cudaError_t cuk_scale(cudaStream_t s, float *x, long n, float sc) {
    if (n <= 0) return cudaSuccess;
    k_scale<<<grid_for(n, ROW_THREADS), ROW_THREADS, 0, s>>>(x, n, sc);
    return CU_LAUNCH_CHECK();
}

__global__ void k_softcap(float *x, long n, float cap) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

extern "C" cudaError_t cuk_softcap(cudaStream_t s, float *x, long n, float cap) {
    if (n <= 0) return cudaSuccess;
    k_softcap<<<grid_for(n, ROW_THREADS), ROW_THREADS, 0, s>>>(x, n, cap);
    return CU_LAUNCH_CHECK();
}

/* ---- kv_store: a block per token, a warp per kv head row (K, then V) ---- */

/* Quantize row x (head_dim) into element row of dst (and scales), as store_row in kv_kernels.c:
 * the same conversions, amax by a warp max (exact in any order). */
__device__ void store_row(const struct kv_layer_view &kv, void *dst, float *scales, size_t row, const float *x) {
    const int hd = kv.head_dim, lane = threadIdx.x % 32;
    const size_t e0 = row * (size_t)hd;
    switch (kv.type) {
    case KV_F32:
        for (int i = lane; i < hd; i += 32) ((float *)dst)[e0 + i] = x[i];
        break;
    case KV_F16:
        for (int i = lane; i < hd; i += 32) ((uint16_t *)dst)[e0 + i] = cu_f32_to_f16(x[i]);
        break;
    case KV_BF16:
        for (int i = lane; i < hd; i += 32) ((uint16_t *)dst)[e0 + i] = cu_f32_to_bf16(x[i]);
        break;
    case KV_INT8: case KV_FP8: {
        const bool i8 = kv.type == KV_INT8;
        float amax = 0;
        for (int i = lane; i < hd; i += 32) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        amax = cu_warp_max(amax);
        const float scale = amax / (i8 ? 127.0f : 448.0f);
        if (lane == 0) scales[row] = scale;
        for (int i = lane; i < hd; i += 32) {
            if (i8) {
                float r = scale != 0 ? roundf(x[i] / scale) : 0.0f;
                r = r > 127 ? 127 : r < -127 ? -127 : r;
                ((int8_t *)dst)[e0 + i] = (int8_t)(r == r ? r : 0);
            } else {
                ((uint8_t *)dst)[e0 + i] = scale != 0 ? cu_f32_to_fp8(x[i] / scale) : 0;
            }
        }
        break;
    }
    default: break;
    }
}

/* Token i's K and V rows into the cache at its slot (none when negative),
 * a warp per kv head (kv_store and the fused rope_kv_store share it). */
__device__ void store_token(const struct kv_layer_view &kv, const int32_t *slots, const float *k, const float *v,
                            int i) {
    const int nkv = kv.n_head_kv, hd = kv.head_dim;
    const int32_t slot = slots[i];
    if (slot < 0) return;
    for (int h = threadIdx.x / 32; h < nkv; h += blockDim.x / 32) {
        const size_t row = cu_kv_row(kv, (size_t)slot, h);
        const size_t src = (size_t)i * nkv * hd + (size_t)h * hd;
        store_row(kv, kv.k, kv.k_scale, row, k + src);
        store_row(kv, kv.v, kv.v_scale, row, v + src);
    }
}

__global__ void k_kv_store(struct kv_layer_view kv, const int32_t *slots, const float *k, const float *v) {
    store_token(kv, slots, k, v, blockIdx.x);
}

/* rope of token blockIdx.x's q and k, then its K/V stored: the stores read
 * k rows other threads rotated, hence the barrier. */
__global__ void k_rope_kv_store(struct rope_kv_args a, const float *ff) {
    const int t = blockIdx.x;
    const int32_t pos = a.pos[t];
    rope_token(a.q, t, a.n_head, a.head_dim, pos, a.rope, ff);
    rope_token(a.k, t, a.n_head_kv, a.head_dim, pos, a.rope, ff);
    __syncthreads();
    store_token(a.kv, a.slots, a.k, a.v, t);
}

extern "C" cudaError_t cuk_rope_kv_store(cudaStream_t s, const struct rope_kv_args *a) {
    if (a->n <= 0) return cudaSuccess;
    const float *ff = a->rope.freq_factors ? (const float *)a->rope.freq_factors->data : NULL;
    k_rope_kv_store<<<a->n, ROW_THREADS, 0, s>>>(*a, ff);
    return CU_LAUNCH_CHECK();
}

extern "C" cudaError_t cuk_kv_store(cudaStream_t s, const struct kv_layer_view *kv, const int32_t *slots,
                                    const float *k, const float *v, int n) {
    if (n <= 0) return cudaSuccess;
    k_kv_store<<<n, 128, 0, s>>>(*kv, slots, k, v);
    return CU_LAUNCH_CHECK();
}
