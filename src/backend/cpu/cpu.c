/* cpu.c — the portable scalar CPU backend: f32 arithmetic on dequantized
 * weights.  It is the reference every faster kernel is checked against.
 * backend_cpu_new also picks the kernel set at run time: a faster set is a
 * copy of the scalar table with some ops overridden (cpu_features.h).
 *
 * Threading splits output rows (matmul) or (token, kv head, split) items
 * (paged attention, kv_kernels.c) into contiguous ranges; no reduction is ever split
 * across threads, so results do not depend on the thread count either. */
#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Fixed-order dot product: 8 lanes, combined pairwise, then the tail. */
static float dot_f32(const float *a, const float *b, int64_t n) {
    float s[8] = { 0 };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    float t = 0;
    for (; i < n; i++) t += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + t;
}

/* ---- matmul ---- */

struct matmul_job {
    struct backend *be;
    float *y;
    const struct tensor *w;
    const float *x;
    int n;
};

/* Rows processed together so that a block of dequantized rows is reused
 * across all tokens while it is hot in cache. */
#define MM_ROWS 4

/* Row blocks per chunk of work (threadpool_run_chunks). */
#define MM_CHUNK_BLOCKS 8

static void matmul_chunk(void *arg, long c, int ith) {
    struct matmul_job *j = arg;
    const struct tensor *w = j->w;
    const int64_t K = w->ne0, M = w->ne1;
    const long r0 = c * MM_CHUNK_BLOCKS * MM_ROWS, r1 = r0 + MM_CHUNK_BLOCKS * MM_ROWS > M ? M
                                                                                       : r0 + MM_CHUNK_BLOCKS * MM_ROWS;
    float *buf = j->be->scratch + (size_t)ith * (size_t)j->be->scratch_cols;
    for (long r = r0; r < r1; r += MM_ROWS) {
        int nr = (int)(r1 - r < MM_ROWS ? r1 - r : MM_ROWS);
        const float *rows[MM_ROWS];
        for (int k = 0; k < nr; k++) {
            if (w->type == DTYPE_F32) {
                rows[k] = tensor_row(w, r + k);
            } else {
                dtype_to_f32(w->type, tensor_row(w, r + k), buf + (size_t)k * K, K);
                rows[k] = buf + (size_t)k * K;
            }
        }
        for (int t = 0; t < j->n; t++) {
            const float *xt = j->x + (size_t)t * K;
            float *yt = j->y + (size_t)t * M;
            for (int k = 0; k < nr; k++) yt[r + k] = dot_f32(rows[k], xt, K);
        }
    }
}

static void cpu_matmul(struct backend *be, float *y, const struct tensor *w, const float *x, int n) {
    KV_ASSERT(w->ne0 * MM_ROWS <= be->scratch_cols);
    struct matmul_job j = { be, y, w, x, n };
    const long per = MM_CHUNK_BLOCKS * MM_ROWS;
    threadpool_run_chunks(be->pool, (w->ne1 + per - 1) / per, matmul_chunk, &j);
}

static void cpu_get_rows(struct backend *be, float *y, const struct tensor *w, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        dtype_to_f32(w->type, tensor_row(w, ids[i]), y + (size_t)i * w->ne0, w->ne0);
}

static void cpu_rmsnorm(struct backend *be, float *y, const float *x, const float *w, int n, int dim, float eps) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * dim;
        float *yt = y + (size_t)t * dim;
        float ss = dot_f32(xt, xt, dim);
        float s = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++) yt[i] = xt[i] * s * w[i];
    }
}

static void cpu_rope_ext(struct backend *be, float *x, int n, int n_head, int head_dim, const int32_t *pos,
                         const struct rope_params *p) {
    const int n_rot = p->n_rot, half = n_rot / 2;
    const int step = p->neox ? 1 : 2, other = p->neox ? half : 1;   /* pair i: (x[i*step], x[i*step + other]) */
    for (int t = 0; t < n; t++) {
        float *xt = x + (size_t)t * n_head * head_dim;
        for (int i = 0; i < half; i++) {
            /* angle in double: positions reach 10^5 and f32 would lose the phase */
            double ang = (double)pos[t] * pow((double)p->theta, -2.0 * i / (double)n_rot);
            if (p->freq_scale != 0 && p->freq_scale != 1) ang *= (double)p->freq_scale;
            if (p->freq_factors) ang /= (double)p->freq_factors[i];
            float c = (float)cos(ang), s = (float)sin(ang);
            for (int h = 0; h < n_head; h++) {
                float *q = xt + (size_t)h * head_dim + (size_t)i * step;
                float a = q[0], b = q[other];
                q[0] = a * c - b * s;
                q[other] = a * s + b * c;
            }
        }
    }
}

static void cpu_rope(struct backend *be, float *x, int n, int n_head, int head_dim, int n_rot,
                     const int32_t *pos, float theta) {
    const struct rope_params p = { .n_rot = n_rot, .theta = theta };
    cpu_rope_ext(be, x, n, n_head, head_dim, pos, &p);
}

static void cpu_layernorm(struct backend *be, float *y, const float *x, const float *w, const float *b, int n,
                          int dim, float eps) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * dim;
        float *yt = y + (size_t)t * dim;
        float sum = 0;
        for (int i = 0; i < dim; i++) sum += xt[i];
        const float mean = sum / (float)dim;
        float var = 0;
        for (int i = 0; i < dim; i++) var += (xt[i] - mean) * (xt[i] - mean);
        const float s = 1.0f / sqrtf(var / (float)dim + eps);
        for (int i = 0; i < dim; i++) yt[i] = (xt[i] - mean) * s * w[i] + (b ? b[i] : 0.0f);
    }
}

static void cpu_add_bias(struct backend *be, float *y, const float *b, int n, int dim) {
    for (int t = 0; t < n; t++)
        for (int i = 0; i < dim; i++) y[(size_t)t * dim + i] += b[i];
}

static void cpu_gelu(struct backend *be, float *x, long n) {
    const float c = 0.7978845608028654f;   /* sqrt(2 / pi) */
    for (long i = 0; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
}

static void cpu_swiglu(struct backend *be, float *g, const float *u, long n) {
    for (long i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void cpu_add(struct backend *be, float *y, const float *x, long n) {
    for (long i = 0; i < n; i++) y[i] += x[i];
}

static const struct backend_ops k_scalar_ops = {
    .name = "scalar",
    .matmul = cpu_matmul,
    .get_rows = cpu_get_rows,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .rope_ext = cpu_rope_ext,
    .layernorm = cpu_layernorm,
    .add_bias = cpu_add_bias,
    .gelu = cpu_gelu,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .kv_store = cpu_kv_store,
    .paged_attention = cpu_paged_attention,
};

/* ---- kernel sets ---- */

/* A backend and its own ops table (the scalar table, then overrides). */
struct cpu_backend {
    struct backend be;   /* first: backend_free frees this address */
    struct backend_ops ops;
};

static const char *const k_kinds = "scalar, avx2, avx512, amx";

/* Kernel sets this binary can run on this CPU, for error messages. */
static const char *kinds_here(const struct cpu_features *f) {
    return cpu_avx2_built() && f->avx2 && f->fma && f->f16c ? "scalar, avx2" : "scalar";
}

/* Fill *ops for kernel set `kind` (NULL or "": the best available).
 * Returns 0, or KVLLM_ECPU (logged) when this build or CPU lacks it. */
static int cpu_ops_for(const char *kind, struct backend_ops *ops) {
    struct cpu_features f;
    cpu_features_get(&f);
    const bool avx2 = cpu_avx2_built() && f.avx2 && f.fma && f.f16c;
    if (!kind || !*kind) kind = avx2 ? "avx2" : "scalar";
    *ops = k_scalar_ops;
    if (strcmp(kind, "scalar") == 0) return 0;
    if (strcmp(kind, "avx2") == 0) {
        if (!cpu_avx2_built()) {
            LOG_ERR("KVLLM_CPU=avx2: the AVX2 kernels are not built into this binary (not x86-64; available: scalar)");
            return KVLLM_ECPU;
        }
        if (!avx2) {
            LOG_ERR("KVLLM_CPU=avx2: this CPU lacks%s%s%s (available here: scalar)",
                    f.avx2 ? "" : " AVX2", f.fma ? "" : " FMA", f.f16c ? "" : " F16C");
            return KVLLM_ECPU;
        }
        ops->name = "avx2";
        ops->matmul = cpu_matmul_avx2;
        ops->paged_attention = cpu_paged_attention_avx2;
        return 0;
    }
    if (strcmp(kind, "avx512") == 0 || strcmp(kind, "amx") == 0) {
        const bool has = kind[1] == 'v' ? f.avx512f : f.amx_tile;
        const char *feat = kind[1] == 'v' ? "AVX-512F" : "AMX-TILE";
        if (!has)
            LOG_ERR("KVLLM_CPU=%s: this CPU lacks %s (and the %s kernels are not implemented in this build; "
                    "available here: %s)", kind, feat, kind, kinds_here(&f));
        else
            LOG_ERR("KVLLM_CPU=%s: the %s kernels are not implemented in this build (available here: %s)",
                    kind, kind, kinds_here(&f));
        return KVLLM_ECPU;
    }
    LOG_ERR("KVLLM_CPU=%s: unknown kernel set (valid: %s; available here: %s)", kind, k_kinds, kinds_here(&f));
    return KVLLM_ECPU;
}

int backend_cpu_new(const char *kind, int n_threads, int64_t max_cols, struct backend **out) {
    *out = NULL;
    struct backend_ops ops;
    int rc = cpu_ops_for(kind, &ops);
    if (rc) return rc;
    if (n_threads > cpu_count()) {
        /* workers spin between kernels: more of them than cores only makes
         * them wait for each other's time slices */
        LOG_WARN("%d threads requested but only %d CPUs are online: using %d", n_threads, cpu_count(), cpu_count());
        n_threads = cpu_count();
    }
    struct cpu_backend *cb = xcalloc(1, sizeof *cb);
    if (!cb) return KVLLM_ENOMEM;
    struct backend *be = &cb->be;
    cb->ops = ops;
    be->ops = &cb->ops;
    be->pool = threadpool_new(n_threads);
    be->scratch_cols = max_cols;
    int nth = threadpool_size(be->pool);
    /* per thread: MM_ROWS dequantized rows (the AVX2 matmul uses as many) */
    _Static_assert(CPU_AVX2_MM_ROWS <= MM_ROWS, "avx2 matmul scratch");
    be->scratch = be->pool ? xmalloc((size_t)nth * MM_ROWS * (size_t)max_cols * sizeof(float)) : NULL;
    if (!be->pool || !be->scratch) { backend_free(be); return KVLLM_ENOMEM; }
    be->scratch_cols = (int64_t)MM_ROWS * max_cols;
    const char *act = getenv("KVLLM_ACT");
    be->act = act && strcmp(act, "int") == 0 ? ACT_INT : ACT_F32;
    if (act && *act && strcmp(act, "int") != 0 && strcmp(act, "f32") != 0)
        LOG_WARN("KVLLM_ACT=%s: unknown (valid: f32, int); using f32", act);
    *out = be;
    return 0;
}

void backend_free(struct backend *be) {
    if (!be) return;
    threadpool_free(be->pool);
    free(be->scratch);
    free(be->act_buf);
    free(be);
}
