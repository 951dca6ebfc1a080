/* cpu.c — the CPU backend object: the kernel set chosen at run time (the
 * scalar table of cpu_ops.c, with faster ops overriding entries when the
 * CPU has them), host memory for buffers, weights left in the file mapping,
 * and execution contexts (a thread pool and scratch each, sized at
 * creation: nothing is allocated while a step runs). */
#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_ops.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

#define CPU_ALIGN 64

/* ---- memory ---- */

/* Buffers are calloc'd (large ones come as lazily zeroed pages) and
 * aligned by hand; the header just below data remembers the block. */
static int cpu_buf_alloc(struct backend *be, size_t bytes, struct backend_buf *out) {
    memset(out, 0, sizeof *out);
    if (bytes > SIZE_MAX - 2 * CPU_ALIGN) return KVLLM_ERANGE;
    uint8_t *raw = calloc(1, bytes + 2 * CPU_ALIGN);
    if (!raw) {
        LOG_ERR("out of memory allocating a backend buffer of %zu bytes", bytes);
        return KVLLM_ENOMEM;
    }
    uint8_t *p = raw + CPU_ALIGN + (CPU_ALIGN - (uintptr_t)(raw + CPU_ALIGN) % CPU_ALIGN) % CPU_ALIGN;
    memcpy(p - sizeof raw, &raw, sizeof raw);
    out->data = p;
    out->size = bytes;
    return 0;
}

static void cpu_buf_free(struct backend *be, struct backend_buf *b) {
    if (!b || !b->data) return;
    uint8_t *raw;
    memcpy(&raw, (uint8_t *)b->data - sizeof raw, sizeof raw);
    free(raw);
    memset(b, 0, sizeof *b);
}

/* The mapping is where the kernels read weights from: nothing to do. */
static int cpu_place_weights(struct backend *be, struct tensor *const *ts, int n, uint64_t *placed) {
    *placed = 0;
    for (int i = 0; i < n; i++)
        if (ts[i]->data) *placed += (uint64_t)ts[i]->ne1 * ts[i]->row_bytes;
    return 0;
}

/* ---- contexts ---- */

static void cpu_ctx_free(struct backend_ctx *c) {
    if (!c) return;
    struct cpu_ctx *cc = cpu_ctx_of(c);
    threadpool_free(cc->pool);
    free(cc->scratch);
    free(cc->act_buf);
    free(cc->partials);
    free(cc->pa_off);
    free(cc->pa_merge);
    free(cc);
}

static int cpu_ctx_new(struct backend *be, const struct backend_ctx_params *p, struct backend_ctx **out) {
    *out = NULL;
    struct cpu_backend *b = cpu_backend_of(be);
    int n_threads = p->n_threads > 0 ? p->n_threads : cpu_count();
    if (n_threads > cpu_count()) {
        /* workers spin between kernels: more of them than cores only makes
         * them wait for each other's time slices */
        LOG_WARN("%d threads requested but only %d CPUs are online: using %d", n_threads, cpu_count(), cpu_count());
        n_threads = cpu_count();
    }
    const int max_tokens = p->max_tokens > 0 ? p->max_tokens : 1, max_ctx = p->max_ctx > 0 ? p->max_ctx : 1;
    const uint64_t n_part = paged_attn_scratch_floats(max_tokens, p->n_head, p->head_dim, max_ctx);
    if (n_part > SIZE_MAX / 8 || p->max_cols <= 0 || (uint64_t)p->max_cols > (1u << 30)) return KVLLM_ERANGE;
    struct cpu_ctx *cc = xcalloc(1, sizeof *cc);
    if (!cc) return KVLLM_ENOMEM;
    cc->base = (struct backend_ctx){ .ops = be->ops, .be = be };
    cc->pool = threadpool_new(n_threads);
    const int nth = cc->pool ? threadpool_size(cc->pool) : 1;
    _Static_assert(CPU_AVX2_MM_ROWS <= CPU_MM_ROWS, "avx2 matmul scratch");
    cc->scratch_cols = (int64_t)CPU_MM_ROWS * p->max_cols;
    cc->scratch = xmalloc((size_t)nth * (size_t)cc->scratch_cols * sizeof(float));
    cc->act = b->act;
    cc->act_buf_bytes = b->act == ACT_INT ? (size_t)max_tokens * cpu_matmul_int_row_bytes(p->max_cols) : 0;
    cc->act_buf = cc->act_buf_bytes ? aligned_alloc(32, (cc->act_buf_bytes + 31) & ~(size_t)31) : NULL;
    cc->max_tokens = max_tokens;
    cc->max_ctx = max_ctx;
    cc->n_partials = (size_t)n_part;
    cc->partials = xmalloc(((size_t)n_part ? (size_t)n_part : 1) * sizeof(float));
    cc->pa_off = xmalloc(((size_t)max_tokens + 1) * sizeof *cc->pa_off);
    cc->pa_merge = xmalloc((size_t)max_tokens * sizeof *cc->pa_merge);
    if (!cc->pool || !cc->scratch || (cc->act_buf_bytes && !cc->act_buf) || !cc->partials || !cc->pa_off ||
        !cc->pa_merge) {
        cpu_ctx_free(&cc->base);
        return KVLLM_ENOMEM;
    }
    *out = &cc->base;
    return 0;
}

/* Host memory: a copy is all a transfer is, and ops finish before they return. */
static int cpu_upload(struct backend_ctx *c, void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}
static int cpu_download(struct backend_ctx *c, void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}
static int cpu_sync(struct backend_ctx *c) { return 0; }

static const struct backend_ops k_scalar_ops = {
    .name = "scalar",
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .place_weights = cpu_place_weights,
    .ctx_new = cpu_ctx_new,
    .ctx_free = cpu_ctx_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .sync = cpu_sync,
    .matmul = cpu_matmul,
    .get_rows = cpu_get_rows,
    .gather_rows = cpu_gather_rows,
    .rmsnorm = cpu_rmsnorm,
    .layernorm = cpu_layernorm,
    .rope = cpu_rope,
    .add_bias = cpu_add_bias,
    .add = cpu_add,
    .swiglu = cpu_swiglu,
    .gelu = cpu_gelu,
    .kv_store = cpu_kv_store,
    .paged_attention = cpu_paged_attention,
    .copy_blocks = cpu_copy_blocks,
};

/* ---- kernel sets ---- */

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

int backend_cpu_new(const char *kind, bool strict, struct backend **out) {
    *out = NULL;
    struct backend_ops ops;
    int rc = cpu_ops_for(kind, &ops);
    if (rc) return rc;
    struct cpu_backend *b = xcalloc(1, sizeof *b);
    if (!b) return KVLLM_ENOMEM;
    b->kernels = ops;
    b->ops = ops;
    b->be.ops = &b->ops;
    const char *act = getenv("KVLLM_ACT");
    b->act = act && strcmp(act, "int") == 0 ? ACT_INT : ACT_F32;
    if (act && *act && strcmp(act, "int") != 0 && strcmp(act, "f32") != 0)
        LOG_WARN("KVLLM_ACT=%s: unknown (valid: f32, int); using f32", act);
    pthread_mutex_init(&b->wall_mu, NULL);
    if (strict) {
        b->strict = true;
        cpu_strict_ops(b);
    }
    *out = &b->be;
    return 0;
}

int backend_new_from_env(const char *kind, struct backend **out) {
    const char *name = getenv("KVLLM_BACKEND");
    if (!name || !*name || strcmp(name, "cpu") == 0) return backend_cpu_new(kind, false, out);
    if (strcmp(name, "strict") == 0) return backend_cpu_new(kind, true, out);
    *out = NULL;
    LOG_ERR("KVLLM_BACKEND=%s: unknown backend (valid: cpu, strict)", name);
    return KVLLM_EINVAL;
}

void backend_free(struct backend *be) {
    if (!be) return;
    struct cpu_backend *b = cpu_backend_of(be);
    if (b->strict) cpu_wall_remove(b, NULL);   /* the placed weights */
    free(b->regions);
    pthread_mutex_destroy(&b->wall_mu);
    free(b);
}
