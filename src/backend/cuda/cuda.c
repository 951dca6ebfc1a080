/* cuda.c — the CUDA backend object (built with -DKVLLM_CUDA=ON): device
 * memory for buffers and placed weights, an execution context per engine
 * (a CUDA stream, the device error record, attention partials), transfers,
 * and the ops, each a check of its arguments on the host and a launcher of
 * kernels.cu / matmul.cu / matmul_q8.cu / attention.cu, and for large steps
 * in the fast mode (8-bit activations) of gemm.cu (cuBLAS) and
 * attention_prefill.cu (tensor cores): cuda_plan.h says which.
 *
 * Model of the world.  One device (backend_params.device, default 0).  Buffers
 * and weights are cudaMalloc'd (zeroed once with cudaMemset on the legacy
 * stream, which the contexts' blocking streams wait for) and freed by
 * buf_free / backend_free.  Every op, upload and download is issued on the
 * context's stream and returns at once; backend_sync waits for the stream.
 * Host memory handed to upload / download is used as is, so the contract
 * of backend.h holds: it must stay valid until sync.  The engine stages a
 * step's inputs and receives its outputs in pinned memory (host_alloc), so
 * those two copies are one DMA each; other host memory is pageable (the
 * driver stages it).
 *
 * CUDA graphs.  graph_compute captures a recorded op list (graph.h) on the
 * context's stream once, instantiates it, and launches it at every replay:
 * one launch instead of hundreds.  The capture bakes in every argument,
 * ctx_hi included (the engine keys its lists on a rounded ctx_hi for that
 * reason), and the context's scratch (attention partials, 8-bit
 * activations): a graph is launched only on the context that captured it.
 * A list that cannot be captured runs op by op, logged once per list.
 *
 * Errors.  Every CUDA call is checked: a failure is logged once with the
 * call, the function and CUDA's message, and returned as KVLLM_ENOMEM (out
 * of device memory) or KVLLM_EBACKEND (anything else); nothing aborts.
 * Errors only the device can see (a row id or a position read from device
 * memory) are recorded by the kernel and reported by sync as KVLLM_ERANGE.
 * A kernel fault (an illegal address) poisons the CUDA context: every later
 * call then fails with KVLLM_EBACKEND. */
#include "backend/backend.h"
#include "backend/backend_list.h"
#include "backend/graph.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_plan.h"
#include "core/core.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cuda_backend {
    struct backend be;
    int device;
    size_t smem_attn;             /* dynamic shared memory the attention kernel may use */
    bool act_q8;                  /* 8-bit activations for the types matmul_q8.cu takes (backend_params.act) */
    pthread_mutex_t mu;           /* guards the weight allocations */
    void **weights;               /* cudaMalloc'd by place_weights, freed by cuda_free */
    int n_weights, cap_weights;
};

struct cuda_ctx {
    struct backend_ctx base;
    cudaStream_t stream;
    int *d_err;                   /* device error record: (what, value), cuda_kernels.h */
    int *h_err;                   /* pinned host copy, read at sync */
    float *partials;              /* attention partials: n_partials floats (NULL when no context splits) */
    uint64_t n_partials;
    int8_t *act_q;                /* 8-bit activations: act_cap codes (max_tokens rows of max_cols) ... */
    float *act_d;                 /* ... and act_cap / 32 block scales; NULL without act_q8 */
    uint64_t act_cap;
    struct cuk_blas *blas;        /* cuBLAS for the prefill GEMMs (gemm.cu); NULL when no step can take them */
    uint16_t *gemm_x;             /* gemm_x_cap 16-bit activations (max_tokens rows of max_cols) */
    uint16_t *gemm_w;             /* CUDA_GEMM_SCRATCH_HALFS: a dequantized slab of weight rows */
    uint64_t gemm_x_cap;
    int max_tokens, max_ctx;
};

static const struct backend_ops k_cuda_ops;

static struct cuda_backend *cb_of(struct backend *be) { return (struct cuda_backend *)(void *)be; }
static struct cuda_ctx *cc_of(struct backend_ctx *c) { return (struct cuda_ctx *)(void *)c; }

/* Log a failed CUDA call and map it to a KVLLM_E* code.  The runtime also keeps the failure as its
 * "last error"; it is read (and so cleared) here, because every kernel launch is checked with
 * cudaGetLastError and would otherwise report this failure again, later, under another op. */
static int cu_fail(cudaError_t e, const char *call, const char *func) {
    (void)cudaGetLastError();
    LOG_ERR("cuda: %s: %s failed: %s (%s)", func, call, cudaGetErrorName(e), cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? KVLLM_ENOMEM : KVLLM_EBACKEND;
}
/* For the calls whose failure is not reported (a free, a query with a fallback): true on success;
 * on failure the runtime's last error is cleared, as cu_fail does. */
static bool cu_ok(cudaError_t e) {
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e == cudaSuccess;
}
#define CU(call)                                                              \
    do {                                                                      \
        cudaError_t e_ = (call);                                              \
        if (e_ != cudaSuccess) return cu_fail(e_, #call, __func__);          \
    } while (0)

/* Bind this thread to the backend's device (cheap; threads start on device 0). */
#define CU_ENTER(be) CU(cudaSetDevice(cb_of(be)->device))

/* ---- memory ---- */

static int cuda_buf_alloc(struct backend *be, size_t bytes, struct backend_buf *out) {
    memset(out, 0, sizeof *out);
    CU_ENTER(be);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        LOG_ERR("cuda: out of device memory allocating a buffer of %zu bytes (%s)", bytes, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return e == cudaErrorMemoryAllocation ? KVLLM_ENOMEM : KVLLM_EBACKEND;
    }
    e = cudaMemset(p, 0, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaFree(p);
        return cu_fail(e, "cudaMemset", __func__);
    }
    out->data = p;
    out->size = bytes;
    return 0;
}

static void cuda_buf_free(struct backend *be, struct backend_buf *b) {
    if (!b || !b->data) return;
    if (cu_ok(cudaSetDevice(cb_of(be)->device))) {
        cudaError_t e = cudaFree(b->data);
        if (e != cudaSuccess) cu_fail(e, "cudaFree", __func__);
    }
    memset(b, 0, sizeof *b);
}

static int keep_weight(struct cuda_backend *b, void *p) {
    pthread_mutex_lock(&b->mu);
    if (b->n_weights == b->cap_weights) {
        int cap = b->cap_weights ? 2 * b->cap_weights : 64;
        void **w = realloc(b->weights, (size_t)cap * sizeof *w);
        if (!w) {
            pthread_mutex_unlock(&b->mu);
            LOG_ERR("cuda: out of host memory recording a weight allocation");
            return KVLLM_ENOMEM;
        }
        b->weights = w;
        b->cap_weights = cap;
    }
    b->weights[b->n_weights++] = p;
    pthread_mutex_unlock(&b->mu);
    return 0;
}

/* Each tensor gets its own allocation and a synchronous copy; data is rewritten to it.  On
 * failure the tensors placed so far keep their device copies (freed with the backend). */
static int cuda_place_weights(struct backend *be, struct tensor *const *ts, int n, const struct place_copied *copied,
                              uint64_t *placed) {
    struct cuda_backend *b = cb_of(be);
    *placed = 0;
    CU_ENTER(be);
    for (int i = 0; i < n; i++) {
        struct tensor *t = ts[i];
        if (!t->data) continue;
        if (!dtype_supported(t->type) || t->ne0 <= 0 || t->ne1 <= 0) {
            LOG_ERR("cuda: cannot place a %s tensor of %lld x %lld", dtype_name(t->type), (long long)t->ne1,
                    (long long)t->ne0);
            return KVLLM_EUNSUPPORTED;
        }
        const size_t bytes = (size_t)t->ne1 * t->row_bytes;
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, bytes);
        if (e != cudaSuccess) {
            LOG_ERR("cuda: out of device memory placing %zu bytes of weights (%llu placed so far): %s", bytes,
                    (unsigned long long)*placed, cudaGetErrorString(e));
            (void)cudaGetLastError();
            return KVLLM_ENOMEM;
        }
        e = cudaMemcpy(p, t->data, bytes, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            cudaFree(p);
            return cu_fail(e, "cudaMemcpy (weights)", __func__);
        }
        int rc = keep_weight(b, p);
        if (rc) {
            cudaFree(p);
            return rc;
        }
        place_copied_tell(copied, t->data, bytes);
        t->data = p;
        *placed += bytes;
    }
    return 0;
}

/* ---- contexts ---- */

static void cuda_ctx_free(struct backend_ctx *c) {
    if (!c) return;
    struct cuda_ctx *cc = cc_of(c);
    if (cu_ok(cudaSetDevice(cb_of(c->be)->device))) {
        if (cc->stream) cudaStreamSynchronize(cc->stream);
        cudaFree(cc->partials);
        cudaFree(cc->act_q);
        cudaFree(cc->act_d);
        cuk_blas_free(cc->blas);
        cudaFree(cc->gemm_x);
        cudaFree(cc->gemm_w);
        cudaFree(cc->d_err);
        cudaFreeHost(cc->h_err);
        if (cc->stream) cudaStreamDestroy(cc->stream);
    }
    free(cc);
}

static int cuda_ctx_new(struct backend *be, const struct backend_ctx_params *p, struct backend_ctx **out) {
    *out = NULL;
    CU_ENTER(be);
    const int max_tokens = p->max_tokens > 0 ? p->max_tokens : 1, max_ctx = p->max_ctx > 0 ? p->max_ctx : 1;
    const uint64_t n_part = cuda_attn_slots(max_ctx) > 1
                                ? cuda_attn_partial_floats(max_tokens, p->n_head, p->head_dim, max_ctx) : 0;
    const uint64_t act_cap = cb_of(be)->act_q8 && p->max_cols > 0 ? (uint64_t)max_tokens * (uint64_t)p->max_cols : 0;
    /* the GEMM scratch, where a step can be large enough for cuda_gemm_pick */
    const uint64_t gemm_cap = max_tokens >= CUDA_GEMM_MIN_TOKENS ? act_cap : 0;
    if ((cuda_attn_slots(max_ctx) > 1 && n_part == 0) || n_part > SIZE_MAX / 8 || act_cap > SIZE_MAX / 8) {
        LOG_ERR("cuda: an execution context for %d tokens of up to %d positions (%d heads of %d) does not fit",
                max_tokens, max_ctx, p->n_head, p->head_dim);
        return KVLLM_ERANGE;
    }
    struct cuda_ctx *cc = xcalloc(1, sizeof *cc);
    if (!cc) return KVLLM_ENOMEM;
    cc->base = (struct backend_ctx){ .ops = be->ops, .be = be };
    cc->max_tokens = max_tokens;
    cc->max_ctx = max_ctx;
    cc->n_partials = n_part;
    cc->act_cap = act_cap;
    cudaError_t e = cudaStreamCreate(&cc->stream);   /* blocking: ordered after cudaMemset of new buffers */
    const char *what = "cudaStreamCreate";
    if (e == cudaSuccess) {
        what = "cudaMalloc (error record)";
        e = cudaMalloc((void **)&cc->d_err, 2 * sizeof(int));
    }
    if (e == cudaSuccess) {
        what = "cudaMemset (error record)";
        e = cudaMemset(cc->d_err, 0, 2 * sizeof(int));
    }
    if (e == cudaSuccess) {
        what = "cudaMallocHost (error record)";
        e = cudaMallocHost((void **)&cc->h_err, 2 * sizeof(int));
    }
    if (e == cudaSuccess && n_part) {
        what = "cudaMalloc (attention partials)";
        e = cudaMalloc((void **)&cc->partials, (size_t)n_part * sizeof(float));
    }
    if (e == cudaSuccess && act_cap) {
        what = "cudaMalloc (8-bit activations)";
        e = cudaMalloc((void **)&cc->act_q, (size_t)act_cap);
        if (e == cudaSuccess) e = cudaMalloc((void **)&cc->act_d, (size_t)(act_cap / 32 + 1) * sizeof(float));
    }
    if (e == cudaSuccess && gemm_cap) {
        what = "cudaMalloc (GEMM scratch)";
        e = cudaMalloc((void **)&cc->gemm_x, (size_t)gemm_cap * sizeof(uint16_t));
        if (e == cudaSuccess && max_tokens >= CUDA_GEMM_MIN_TOKENS_Q)
            e = cudaMalloc((void **)&cc->gemm_w, CUDA_GEMM_SCRATCH_HALFS * sizeof(uint16_t));
        cc->gemm_x_cap = gemm_cap;
    }
    if (e != cudaSuccess) {
        int rc = cu_fail(e, what, __func__);
        cuda_ctx_free(&cc->base);
        return rc;
    }
    if (gemm_cap) {
        const int st = cuk_blas_new(cc->stream, &cc->blas);
        if (st) {
            LOG_ERR("cuda: %s: cublasCreate failed: %s", __func__, cuk_blas_status_name(st));
            cuda_ctx_free(&cc->base);
            return KVLLM_EBACKEND;
        }
    }
    *out = &cc->base;
    return 0;
}

static int cuda_upload(struct backend_ctx *c, void *dst, const void *src, size_t bytes) {
    if (!bytes) return 0;
    CU_ENTER(c->be);
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cc_of(c)->stream));
    return 0;
}

static int cuda_download(struct backend_ctx *c, void *dst, const void *src, size_t bytes) {
    if (!bytes) return 0;
    CU_ENTER(c->be);
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cc_of(c)->stream));
    return 0;
}

static const char *dev_err_what(int what) {
    switch (what) {
    case CUDA_DEV_GET_ROWS_ID: return "get_rows: row id out of range";
    case CUDA_DEV_ATTN_POS: return "paged attention: position outside the context's max_ctx";
    case CUDA_DEV_ATTN_BLOCK: return "paged attention: position past the block table";
    default: return "unknown device error";
    }
}

static int cuda_sync(struct backend_ctx *c) {
    struct cuda_ctx *cc = cc_of(c);
    CU_ENTER(c->be);
    CU(cudaMemcpyAsync(cc->h_err, cc->d_err, 2 * sizeof(int), cudaMemcpyDeviceToHost, cc->stream));
    CU(cudaStreamSynchronize(cc->stream));
    if (cc->h_err[0]) {
        LOG_ERR("cuda: %s (%d)", dev_err_what(cc->h_err[0]), cc->h_err[1]);
        cc->h_err[0] = cc->h_err[1] = 0;
        CU(cudaMemsetAsync(cc->d_err, 0, 2 * sizeof(int), cc->stream));
        return KVLLM_ERANGE;
    }
    return 0;
}

/* ---- ops ---- */

/* A launcher's result as an op's. */
static int launched(cudaError_t e, const char *op) {
    if (e == cudaSuccess) return 0;
    return cu_fail(e, op, "cuda op");
}

/* Whether matmul takes w on 8-bit activations: the types matmul_q8.cu has, never the matrices the
 * model keeps on f32 activations, nor those whose activations it wants finer than per 256 when
 * the type's would be per 256 (the CPU's q8_takes, so both backends round the same activations).
 * A property of w and the backend alone, never of n: a token's row is the same at every batch. */
static bool q8_takes(const struct cuda_backend *b, const struct tensor *w) {
    if (!b->act_q8 || (w->flags & TENSOR_F_F32_ACT)) return false;
    const bool act_256 = w->type == DTYPE_Q2_K || w->type == DTYPE_Q3_K || w->type == DTYPE_Q4_K ||
                         w->type == DTYPE_Q5_K || w->type == DTYPE_Q6_K;
    if ((w->flags & TENSOR_F_FINE_ACT) && act_256) return false;
    return cuk_matmul_q8_takes(w->type, w->ne0);
}

/* Many tokens: cuBLAS on tensor cores where cuda_gemm_pick says (gemm.cu). */
static int matmul_gemm(struct cuda_ctx *cc, enum cuda_gemm kind, float *y, const struct tensor *w, const float *x,
                       int n) {
    const bool rows16 = kind == CUDA_GEMM_F16 || kind == CUDA_GEMM_BF16;
    const bool no_slab = kind == CUDA_GEMM_DEQUANT_F16 && !cc->gemm_w;
    if ((uint64_t)n * (uint64_t)w->ne0 > cc->gemm_x_cap || !cc->blas || no_slab) {
        LOG_ERR("cuda: matmul of %d rows of %lld by cuBLAS: the context was sized for %llu values", n,
                (long long)w->ne0, (unsigned long long)cc->gemm_x_cap);
        return KVLLM_ERANGE;
    }
    if (rows16 && w->row_bytes != (size_t)w->ne0 * 2) {
        LOG_ERR("cuda: a %s weight with rows of %zu bytes for %lld values: not a dense matrix for cuBLAS",
                dtype_name(w->type), w->row_bytes, (long long)w->ne0);
        return KVLLM_EINVAL;
    }
    int st = 0;
    const cudaError_t e = cuk_gemm(cc->blas, cc->stream, (int)kind, y, w, x, n, cc->gemm_x, cc->gemm_w,
                                   CUDA_GEMM_SCRATCH_HALFS, &st);
    if (st) {
        (void)cudaGetLastError();
        LOG_ERR("cuda: matmul (cuBLAS): cublasGemmEx failed: %s", cuk_blas_status_name(st));
        return KVLLM_EBACKEND;
    }
    return launched(e, "matmul (cuBLAS)");
}

static int cuda_matmul(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n) {
    struct cuda_ctx *cc = cc_of(c);
    struct cuda_backend *b = cb_of(c->be);
    CU_ENTER(c->be);
    const bool q8 = q8_takes(b, w);
    const enum cuda_gemm kind = cuda_gemm_pick(w->type, w->flags, b->act_q8, q8, n);
    if (kind != CUDA_GEMM_NONE) return matmul_gemm(cc, kind, y, w, x, n);
    if (!q8) return launched(cuk_matmul(cc->stream, y, w, x, n), "matmul");
    if (n > 0 && ((uint64_t)n * (uint64_t)w->ne0 > cc->act_cap || n > 65535)) {   /* 65535: a grid's y */
        LOG_ERR("cuda: matmul of %d rows of %lld on 8-bit activations: the context was sized for %llu values",
                n, (long long)w->ne0, (unsigned long long)cc->act_cap);
        return KVLLM_ERANGE;
    }
    return launched(cuk_matmul_q8(cc->stream, y, w, x, n, cc->act_q, cc->act_d), "matmul (8-bit activations)");
}

static int cuda_get_rows(struct backend_ctx *c, float *y, const struct tensor *w, const int32_t *ids, int n) {
    CU_ENTER(c->be);
    return launched(cuk_get_rows(cc_of(c)->stream, cc_of(c)->d_err, y, w, ids, n), "get_rows");
}

static int cuda_gather_rows(struct backend_ctx *c, float *y, const float *x, const int32_t *ids, int n, int dim) {
    CU_ENTER(c->be);
    return launched(cuk_gather_rows(cc_of(c)->stream, y, x, ids, n, dim), "gather_rows");
}

static int cuda_argmax(struct backend_ctx *c, int32_t *ids, const float *x, int n, int dim) {
    CU_ENTER(c->be);
    return launched(cuk_argmax(cc_of(c)->stream, ids, x, n, dim), "argmax");
}

static int cuda_sample(struct backend_ctx *c, const struct sample_args *a) {
    CU_ENTER(c->be);
    return launched(cuk_sample(cc_of(c)->stream, a->ids, a->logits, a->rows, a->n, a->dim), "sample");
}

static int cuda_rmsnorm(struct backend_ctx *c, float *y, const float *x, const struct tensor *w, int n, int dim,
                        float eps) {
    CU_ENTER(c->be);
    return launched(cuk_rmsnorm(cc_of(c)->stream, y, x, w->data, n, dim, eps), "rmsnorm");
}

static int cuda_add_rmsnorm(struct backend_ctx *c, float *y, float *x, const float *h, const struct tensor *w, int n,
                            int dim, float eps) {
    CU_ENTER(c->be);
    return launched(cuk_add_rmsnorm(cc_of(c)->stream, y, x, h, w->data, n, dim, eps), "add_rmsnorm");
}

static int cuda_rope_kv_store(struct backend_ctx *c, const struct rope_kv_args *a) {
    CU_ENTER(c->be);
    return launched(cuk_rope_kv_store(cc_of(c)->stream, a), "rope_kv_store");
}

static int cuda_layernorm(struct backend_ctx *c, float *y, const float *x, const struct tensor *w,
                          const struct tensor *b, int n, int dim, float eps) {
    CU_ENTER(c->be);
    return launched(cuk_layernorm(cc_of(c)->stream, y, x, w->data, b ? b->data : NULL, n, dim, eps), "layernorm");
}

static int cuda_rope(struct backend_ctx *c, float *x, int n, int n_head, int head_dim, const int32_t *pos,
                     const struct rope_params *p) {
    CU_ENTER(c->be);
    return launched(cuk_rope(cc_of(c)->stream, x, n, n_head, head_dim, pos, p), "rope");
}

static int cuda_add_bias(struct backend_ctx *c, float *y, const struct tensor *b, int n, int dim) {
    CU_ENTER(c->be);
    return launched(cuk_add_bias(cc_of(c)->stream, y, b->data, n, dim), "add_bias");
}

static int cuda_add(struct backend_ctx *c, float *y, const float *x, long n) {
    CU_ENTER(c->be);
    return launched(cuk_add(cc_of(c)->stream, y, x, n), "add");
}

static int cuda_swiglu(struct backend_ctx *c, float *g, const float *u, long n) {
    CU_ENTER(c->be);
    return launched(cuk_swiglu(cc_of(c)->stream, g, u, n), "swiglu");
}

static int cuda_gelu(struct backend_ctx *c, float *x, long n) {
    CU_ENTER(c->be);
    return launched(cuk_gelu(cc_of(c)->stream, x, n), "gelu");
}

static int cuda_geglu(struct backend_ctx *c, float *g, const float *u, long n) {
    CU_ENTER(c->be);
    return launched(cuk_geglu(cc_of(c)->stream, g, u, n), "geglu");
}

static int cuda_scale(struct backend_ctx *c, float *x, long n, float s) {
    CU_ENTER(c->be);
    return launched(cuk_scale(cc_of(c)->stream, x, n, s), "scale");
}

static int cuda_softcap(struct backend_ctx *c, float *x, long n, float cap) {
    CU_ENTER(c->be);
    return launched(cuk_softcap(cc_of(c)->stream, x, n, cap), "softcap");
}

static int cuda_kv_store(struct backend_ctx *c, const struct kv_layer_view *kv, const int32_t *slots,
                         const float *k, const float *v, int n) {
    if ((unsigned)kv->type >= KV_TYPE_COUNT_ || kv->block_size <= 0 || kv->n_head_kv <= 0 || kv->head_dim <= 0) {
        LOG_ERR("cuda: kv_store into a bad KV view (type %d, block %d, %d heads of %d)", kv->type, kv->block_size,
                kv->n_head_kv, kv->head_dim);
        return KVLLM_EINVAL;
    }
    CU_ENTER(c->be);
    return launched(cuk_kv_store(cc_of(c)->stream, kv, slots, k, v, n), "kv_store");
}

static int cuda_paged_attention(struct backend_ctx *c, const struct paged_attn_args *a) {
    struct cuda_ctx *cc = cc_of(c);
    struct cuda_backend *b = cb_of(c->be);
    if (a->n_tokens <= 0) return 0;
    if (a->n_head_kv <= 0 || a->n_head % a->n_head_kv || a->head_dim <= 0 || a->head_dim != a->kv.head_dim ||
        a->n_head_kv != a->kv.n_head_kv || a->kv.block_size <= 0 || (unsigned)a->kv.type >= KV_TYPE_COUNT_) {
        LOG_ERR("cuda: paged attention with %d heads over %d kv heads of %d (KV view: %d heads of %d)", a->n_head,
                a->n_head_kv, a->head_dim, a->kv.n_head_kv, a->kv.head_dim);
        return KVLLM_EINVAL;
    }
    if (a->n_tokens > cc->max_tokens || a->n_tokens > 65535) {
        LOG_ERR("paged attention over %d tokens: the context was sized for %d", a->n_tokens, cc->max_tokens);
        return KVLLM_ERANGE;
    }
    /* many query tokens: the tensor-core kernel (no partials: a block walks its rows' whole spans) */
    if (b->act_q8 && cuk_attention_prefill_takes(a) && cuda_pf_smem_bytes(a->head_dim) <= b->smem_attn) {
        CU_ENTER(c->be);
        return launched(cuk_attention_prefill(cc->stream, cc->d_err, a, cc->max_ctx), "paged_attention (prefill)");
    }
    const int splits = cuda_attn_slots(cc->max_ctx);
    const uint64_t need = splits > 1 ? cuda_attn_partial_floats(a->n_tokens, a->n_head, a->head_dim, cc->max_ctx) : 0;
    if (need > cc->n_partials) {
        LOG_ERR("cuda: paged attention of %d heads of %d: the context was sized for fewer (%llu partial floats, "
                "%llu needed)", a->n_head, a->head_dim, (unsigned long long)cc->n_partials, (unsigned long long)need);
        return KVLLM_ERANGE;
    }
    const int g = a->n_head / a->n_head_kv;
    const size_t smem = cuk_attention_hd_takes(a) ? cuda_attn_hd_smem_bytes(g, a->head_dim, CUDA_ATTN_TILE, CUDA_ATTN_WARPS)
                                                  : cuda_attn_smem_bytes(g, a->head_dim, CUDA_ATTN_TILE, CUDA_ATTN_WARPS);
    if (smem > b->smem_attn) {
        LOG_ERR("cuda: paged attention of %d query heads per kv head of %d needs %zu bytes of shared memory; "
                "the device gives %zu", a->n_head / a->n_head_kv, a->head_dim, smem, b->smem_attn);
        return KVLLM_EUNSUPPORTED;
    }
    CU_ENTER(c->be);
    return launched(cuk_paged_attention(cc->stream, cc->d_err, a, cc->partials, cc->max_ctx), "paged_attention");
}

static int cuda_copy_blocks(struct backend_ctx *c, const struct kv_layer_view *layers, int n_layer,
                            const int32_t (*pairs)[2], int n) {
    CU_ENTER(c->be);
    cudaStream_t s = cc_of(c)->stream;
    for (int i = 0; i < n; i++) {
        const int32_t dst = pairs[i][0], src = pairs[i][1];
        if (dst == src) continue;
        for (int il = 0; il < n_layer; il++) {
            const struct kv_layer_view *l = &layers[il];
            const size_t rows = kv_block_rows(l), bytes = kv_block_bytes(l);
            uint8_t *k = l->k, *v = l->v;
            CU(cudaMemcpyAsync(k + (size_t)dst * bytes, k + (size_t)src * bytes, bytes, cudaMemcpyDeviceToDevice, s));
            CU(cudaMemcpyAsync(v + (size_t)dst * bytes, v + (size_t)src * bytes, bytes, cudaMemcpyDeviceToDevice, s));
            if (l->k_scale) {
                const size_t sb = rows * sizeof(float);
                CU(cudaMemcpyAsync(l->k_scale + (size_t)dst * rows, l->k_scale + (size_t)src * rows, sb,
                                   cudaMemcpyDeviceToDevice, s));
                CU(cudaMemcpyAsync(l->v_scale + (size_t)dst * rows, l->v_scale + (size_t)src * rows, sb,
                                   cudaMemcpyDeviceToDevice, s));
            }
        }
    }
    return 0;
}

/* ---- the step as a transaction: pinned staging, CUDA graphs ---- */

static void *cuda_host_alloc(struct backend *be, size_t bytes) {
    if (!cu_ok(cudaSetDevice(cb_of(be)->device))) return NULL;
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cu_fail(e, "cudaMallocHost (staging)", __func__);
        return NULL;
    }
    return p;
}

static void cuda_host_free(struct backend *be, void *p) {
    if (p && cu_ok(cudaSetDevice(cb_of(be)->device))) (void)cu_ok(cudaFreeHost(p));
}

static void cuda_graph_exec_free(void *exec) {
    if (exec) (void)cu_ok(cudaGraphExecDestroy((cudaGraphExec_t)exec));
}

/* Capture g's ops, as graph_replay issues them, into an instantiated CUDA
 * graph.  On failure the capture is ended and dropped, and the error
 * returned (logged); the stream is usable again. */
static int capture(struct backend_ctx *c, struct graph *g, int ctx_hi, cudaGraphExec_t *out) {
    struct cuda_ctx *cc = cc_of(c);
    *out = NULL;
    /* thread-local: another engine's thread may allocate meanwhile */
    CU(cudaStreamBeginCapture(cc->stream, cudaStreamCaptureModeThreadLocal));
    int rc = graph_replay(c, g, ctx_hi);
    cudaGraph_t cg = NULL;
    cudaError_t e = cudaStreamEndCapture(cc->stream, &cg);
    if (!rc && e != cudaSuccess) rc = cu_fail(e, "cudaStreamEndCapture", __func__);
    if (!rc) {
        e = cudaGraphInstantiateWithFlags(out, cg, 0);
        if (e != cudaSuccess) rc = cu_fail(e, "cudaGraphInstantiateWithFlags", __func__);
    }
    if (cg) (void)cu_ok(cudaGraphDestroy(cg));
    if (rc) (void)cudaGetLastError();   /* a refused call inside the capture: not the next op's error */
    return rc;
}

static int cuda_graph_compute(struct backend_ctx *c, struct graph *g, int ctx_hi) {
    struct cuda_ctx *cc = cc_of(c);
    CU_ENTER(c->be);
    if (g->exec && g->exec_ctx_hi != ctx_hi) graph_exec_drop(g);
    if (!g->exec && !g->no_exec) {
        cudaGraphExec_t ex = NULL;
        const int rc = capture(c, g, ctx_hi, &ex);
        if (rc) {
            LOG_WARN("cuda: a step's %d ops could not be captured as a CUDA graph (%s): they run one by one",
                     g->n, kvllm_strerror(rc));
            c->status = 0;   /* the capture's failure; a real one shows again below */
            g->no_exec = true;
        } else {
            g->exec = ex;
            g->exec_free = cuda_graph_exec_free;
            g->exec_ctx_hi = ctx_hi;
        }
    }
    if (g->no_exec) return graph_replay(c, g, ctx_hi);
    CU(cudaGraphLaunch((cudaGraphExec_t)g->exec, cc->stream));
    return 0;
}

/* Free device memory: the engine's memory plan sizes the KV pool from it.
 * 0 (unknown) when the device cannot be asked. */
static uint64_t cuda_mem_available(struct backend *be) {
    size_t free_b = 0, total_b = 0;
    if (!cu_ok(cudaSetDevice(cb_of(be)->device)) || !cu_ok(cudaMemGetInfo(&free_b, &total_b))) return 0;
    return (uint64_t)free_b;
}

static void cuda_free(struct backend *be);

/* Every weight type kvllm reads has a matmul (dequantizing where
 * matmul_q8.cu lacks the type) and get_rows; the table says which optional
 * ops are written (moe and kv_shift are not yet). */
static bool cuda_supports_op(const struct backend *be, enum backend_op op, uint32_t type) {
    switch (op) {
    case BACKEND_OP_MATMUL: case BACKEND_OP_GET_ROWS: return dtype_supported(type);
    case BACKEND_OP_MOE: return k_cuda_ops.moe && k_cuda_ops.moe_route;
    case BACKEND_OP_KV_SHIFT: return k_cuda_ops.kv_shift != NULL;
    case BACKEND_OP_SAMPLE: return k_cuda_ops.sample != NULL;
    case BACKEND_OP_ADD_RMSNORM: case BACKEND_OP_ROPE_KV_STORE: return true;
    default: return false;
    }
}

static const struct backend_ops k_cuda_ops = {
    .name = "cuda",
    .free = cuda_free,
    .supports_op = cuda_supports_op,
    .mem_available = cuda_mem_available,
    .buf_alloc = cuda_buf_alloc,
    .buf_free = cuda_buf_free,
    .place_weights = cuda_place_weights,
    .ctx_new = cuda_ctx_new,
    .ctx_free = cuda_ctx_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .sync = cuda_sync,
    .matmul = cuda_matmul,
    .get_rows = cuda_get_rows,
    .gather_rows = cuda_gather_rows,
    .rmsnorm = cuda_rmsnorm,
    .layernorm = cuda_layernorm,
    .rope = cuda_rope,
    .add_bias = cuda_add_bias,
    .add = cuda_add,
    .swiglu = cuda_swiglu,
    .gelu = cuda_gelu,
    .geglu = cuda_geglu,
    .scale = cuda_scale,
    .softcap = cuda_softcap,
    .kv_store = cuda_kv_store,
    .paged_attention = cuda_paged_attention,
    .add_rmsnorm = cuda_add_rmsnorm,
    .rope_kv_store = cuda_rope_kv_store,
    .copy_blocks = cuda_copy_blocks,
    .argmax = cuda_argmax,
    .sample = cuda_sample,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .graph_compute = cuda_graph_compute,
};

/* ---- the backend ---- */

bool backend_cuda_built(void) { return true; }

int backend_cuda_probe(char *why, size_t why_size) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, why_size, "no CUDA device (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
        (void)cudaGetLastError();
        return 0;
    }
    if (n <= 0) snprintf(why, why_size, "no CUDA device (cudaGetDeviceCount found none)");
    return n > 0 ? n : 0;
}

int backend_cuda_new(int device, enum backend_act act, struct backend **out) {
    *out = NULL;
    char why[256];
    const int n_dev = backend_cuda_probe(why, sizeof why);
    if (n_dev == 0) {
        LOG_ERR("backend=cuda: %s", why);
        return KVLLM_EUNSUPPORTED;
    }
    const long dev = device;
    if (dev < 0 || dev >= n_dev) {
        LOG_ERR("device=%ld: not a CUDA device of this machine (valid: 0 .. %d)", dev, n_dev - 1);
        return KVLLM_EINVAL;
    }
    CU(cudaSetDevice((int)dev));
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, (int)dev));
    if (prop.major < 8) {
        LOG_ERR("backend=cuda: device %ld (%s) has compute capability %d.%d; this build targets 8.0 and newer",
                dev, prop.name, prop.major, prop.minor);
        return KVLLM_EUNSUPPORTED;
    }
    int smem = 0;
    CU(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, (int)dev));
    CU(cuk_attention_setup((size_t)smem));
    CU(cuk_attention_prefill_setup((size_t)smem));
    struct cuda_backend *b = xcalloc(1, sizeof *b);
    if (!b) return KVLLM_ENOMEM;
    b->be.ops = &k_cuda_ops;
    b->device = (int)dev;
    b->smem_attn = (size_t)smem;
    /* the CPU's default and choice (backend_cpu_new); this backend has no 13-bit codes, so int is q8 */
    b->act_q8 = act != BACKEND_ACT_F32;
    if (act == BACKEND_ACT_INT) LOG_WARN("activations=int: the CUDA backend has q8 and f32; using q8");
    pthread_mutex_init(&b->mu, NULL);
    LOG_INFO("cuda: device %ld: %s, compute capability %d.%d, %.1f GiB, %d SMs", dev, prop.name, prop.major, prop.minor,
             (double)prop.totalGlobalMem / (1 << 30), prop.multiProcessorCount);
    *out = &b->be;
    return 0;
}

/* backend_free dispatches here (ops->free). */
static void cuda_free(struct backend *be) {
    struct cuda_backend *b = cb_of(be);
    if (cu_ok(cudaSetDevice(b->device)))
        for (int i = 0; i < b->n_weights; i++) cudaFree(b->weights[i]);
    free(b->weights);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
