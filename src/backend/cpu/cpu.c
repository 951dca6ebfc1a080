/* cpu.c — the CPU backend object: the kernel set chosen at run time (the
 * scalar table of cpu_ops.c, with faster ops overriding entries when the
 * CPU has them), host memory for buffers, weights left in the file mapping,
 * and execution contexts (a thread pool and scratch each, sized at
 * creation: nothing is allocated while a step runs). */
#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/qmm.h"
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
static int cpu_place_weights(struct backend *be, struct tensor *const *ts, int n, const struct place_copied *copied,
                             uint64_t *placed) {
    (void)be, (void)copied;
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
    free(cc->qpack);
    free(cc->partials);
    free(cc->pa_local);
    free(cc->pa_off);
    free(cc->pa_merge);
    free(cc->pa_unit);
    free(cc->rope_cs);
    free(cc->rope_pos);
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
    if (n_part > SIZE_MAX / 8 || p->max_cols <= 0 || (uint64_t)p->max_cols > (1u << 30)) {
        LOG_ERR("an execution context for %d tokens of up to %d positions (%d heads of %d, rows of %lld) "
                "does not fit", max_tokens, max_ctx, p->n_head, p->head_dim, (long long)p->max_cols);
        return KVLLM_ERANGE;
    }
    struct cpu_ctx *cc = xcalloc(1, sizeof *cc);
    if (!cc) return KVLLM_ENOMEM;
    cc->base = (struct backend_ctx){ .ops = be->ops, .be = be };
    cc->pool = threadpool_new(n_threads);
    const int nth = cc->pool ? threadpool_size(cc->pool) : 1;
    _Static_assert(CPU_AVX2_MM_ROWS <= CPU_MM_ROWS, "avx2 matmul scratch");
    cc->scratch_cols = (int64_t)CPU_MM_ROWS * p->max_cols;
    cc->scratch = xmalloc((size_t)nth * (size_t)cc->scratch_cols * sizeof(float));
    cc->act = b->act;
    const size_t q8_row = qmm_act_row_bytes(p->max_cols), q16_row = b->q16 ? qmm16_act_row_bytes(p->max_cols) : 0;
    cc->act_buf_bytes = b->act == ACT_INT ? (size_t)max_tokens * cpu_matmul_int_row_bytes(p->max_cols)
                      : b->act == ACT_Q8 ? (size_t)max_tokens * (q8_row > q16_row ? q8_row : q16_row) : 0;
    cc->act_buf = cc->act_buf_bytes ? aligned_alloc(64, (cc->act_buf_bytes + 63) & ~(size_t)63) : NULL;
    /* a 16-row group of the widest 8-bit type (Q8_0: 34 bytes per 32) per thread */
    cc->qpack_bytes = b->act == ACT_Q8 ? ((size_t)QMM_IL * (size_t)((p->max_cols + 31) / 32) * 34 + 63) & ~(size_t)63 : 0;
    cc->qpack = cc->qpack_bytes ? aligned_alloc(64, (size_t)nth * cc->qpack_bytes) : NULL;
    cc->max_tokens = max_tokens;
    cc->max_ctx = max_ctx;
    cc->n_partials = (size_t)n_part;
    cc->partials = xmalloc(((size_t)n_part ? (size_t)n_part : 1) * sizeof(float));
    const size_t heads = (size_t)(p->n_head > 0 ? p->n_head : 1), hd = (size_t)(p->head_dim > 0 ? p->head_dim : 1);
    const size_t rows = heads > PA_GROUP_ROWS ? heads : PA_GROUP_ROWS;   /* a prefill group's partials */
    cc->pa_local_floats = (rows * pa_local_stride((int)hd) + PA_LOCAL_LEAD + 15) / 16 * 16;
    cc->pa_local = aligned_alloc(64, (size_t)nth * cc->pa_local_floats * sizeof(float));
    cc->pa_off = xmalloc(((size_t)max_tokens + 1) * sizeof *cc->pa_off);
    cc->pa_merge = xmalloc((size_t)max_tokens * sizeof *cc->pa_merge);
    cc->pa_unit = xmalloc(((size_t)max_tokens + 1) * sizeof *cc->pa_unit);
    cc->rope_cols = (int)hd;     /* n_rot <= head_dim: a token's pairs' cos and sin */
    cc->rope_cs = xmalloc((size_t)max_tokens * hd * sizeof *cc->rope_cs);
    cc->rope_pos = xmalloc((size_t)max_tokens * sizeof *cc->rope_pos);
    if (!cc->pool || !cc->scratch || (cc->act_buf_bytes && !cc->act_buf) || (cc->qpack_bytes && !cc->qpack) ||
        !cc->partials || !cc->pa_local || !cc->pa_off ||
        !cc->pa_merge || !cc->pa_unit || !cc->rope_cs || !cc->rope_pos) {
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

static void cpu_free(struct backend *be);

/* The kernel table answers: the optional ops are those it has, and the
 * matmul dequantizes every type kvllm reads. */
static bool cpu_supports_op(const struct backend *be, enum backend_op op, uint32_t type) {
    const struct backend_ops *k = &((const struct cpu_backend *)(const void *)be)->kernels;
    switch (op) {
    case BACKEND_OP_MATMUL: case BACKEND_OP_GET_ROWS: return dtype_supported(type);
    case BACKEND_OP_MOE: return k->moe && k->moe_route && dtype_supported(type);
    case BACKEND_OP_KV_SHIFT: return k->kv_shift != NULL;
    case BACKEND_OP_SAMPLE: return k->sample != NULL;
    case BACKEND_OP_ADD_RMSNORM: return k->add_rmsnorm != NULL;
    case BACKEND_OP_ROPE_KV_STORE: return k->rope_kv_store != NULL;
    case BACKEND_OP_MATMULS: return k->matmuls != NULL;
    default: return false;
    }
}

/* Staging is plain host memory here (no transfer to speed up); aligned as the packed step wants. */
static void *cpu_host_alloc(struct backend *be, size_t bytes) {
    return aligned_alloc(64, bytes ? (bytes + 63) & ~(size_t)63 : 64);
}
static void cpu_host_free(struct backend *be, void *p) { free(p); }

static const struct backend_ops k_scalar_ops = {
    .name = "scalar",
    .free = cpu_free,
    .supports_op = cpu_supports_op,
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
    .geglu = cpu_geglu,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .moe_route = cpu_moe_route,
    .moe = cpu_moe,
    .kv_store = cpu_kv_store,
    .paged_attention = cpu_paged_attention,
    .add_rmsnorm = cpu_add_rmsnorm,
    .rope_kv_store = cpu_rope_kv_store,
    .matmuls = cpu_matmuls,
    .copy_blocks = cpu_copy_blocks,
    .argmax = cpu_argmax,
    .sample = cpu_sample,
    .kv_shift = cpu_kv_shift,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
};

/* ---- kernel sets ---- */

static const char *const k_kinds = "scalar, avx2, avx512, amx";

static bool has_avx2(const struct cpu_features *f) { return cpu_avx2_built() && f->avx2 && f->fma && f->f16c; }
static bool has_avx512(const struct cpu_features *f) {
    return has_avx2(f) && cpu_q8_avx512_built() && f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni;
}

/* AMX-INT8 tiles with their OS state (Linux's per-process permission is
 * asked for only when the set is chosen: cpu_amx_permit). */
static bool has_amx(const struct cpu_features *f) {
    return has_avx512(f) && cpu_q8_amx_built() && f->amx_tile && f->amx_int8 && f->amx_os;
}

/* Kernel sets this binary can run on this CPU, for error messages. */
static const char *kinds_here(const struct cpu_features *f) {
    return has_amx(f) && cpu_amx_permit() == 0 ? "scalar, avx2, avx512, amx"
         : has_avx512(f) ? "scalar, avx2, avx512" : has_avx2(f) ? "scalar, avx2" : "scalar";
}

/* Fill *ops and *qrows (the integer matmul's rows kernel, NULL for scalar)
 * for kernel set `kind` (NULL or "": the best available).  Returns 0, or
 * KVLLM_ECPU (logged) when this build or CPU lacks it. */
static int cpu_ops_for(const char *kind, struct backend_ops *ops, qmm_group_fn **qrows) {
    struct cpu_features f;
    cpu_features_get(&f);
    const bool avx2 = has_avx2(&f);
    /* the default: the best set here, amx > avx512 > avx2 > scalar.  amx is the avx512 set with
     * the integer matmul of 16 tokens or more on AMX-INT8 tiles, bit-identical to avx512's (qmm.h;
     * test_backend_amx on real tiles), and never slower (docs/PERF.md); where Linux refuses the
     * tile state the default is avx512, silently (asking for amx by name says why) */
    if (!kind || !*kind)
        kind = has_amx(&f) && cpu_amx_permit() == 0 ? "amx" : has_avx512(&f) ? "avx512" : avx2 ? "avx2" : "scalar";
    *ops = k_scalar_ops;
    *qrows = NULL;
    if (strcmp(kind, "scalar") == 0) return 0;
    if (strcmp(kind, "avx2") == 0) {
        if (!cpu_avx2_built()) {
            LOG_ERR("cpu_kernels=avx2: the AVX2 kernels are not built into this binary (not x86-64; available: scalar)");
            return KVLLM_ECPU;
        }
        if (!avx2) {
            LOG_ERR("cpu_kernels=avx2: this CPU lacks%s%s%s (available here: scalar)",
                    f.avx2 ? "" : " AVX2", f.fma ? "" : " FMA", f.f16c ? "" : " F16C");
            return KVLLM_ECPU;
        }
        ops->name = "avx2";
        ops->matmul = cpu_matmul_simd;
        ops->paged_attention = cpu_paged_attention_avx2;
        ops->gelu = cpu_gelu_avx2;
        ops->geglu = cpu_geglu_avx2;
        ops->swiglu = cpu_swiglu_avx2;
        ops->kv_store = cpu_kv_store_avx2;
        *qrows = f.avxvnni && cpu_q8_avxvnni_built() ? qmm_group_avxvnni : qmm_group_avx2;
        return 0;
    }
    if (strcmp(kind, "avx512") == 0) {
        if (!has_avx512(&f)) {
            if (!cpu_q8_avx512_built() || !cpu_avx2_built())
                LOG_ERR("cpu_kernels=avx512: the AVX-512 kernels are not built into this binary (available here: %s)",
                        kinds_here(&f));
            else
                LOG_ERR("cpu_kernels=avx512: this CPU lacks%s%s%s%s%s (available here: %s)", avx2 ? "" : " AVX2/FMA/F16C",
                        f.avx512f ? "" : " AVX-512F", f.avx512bw ? "" : " AVX-512BW", f.avx512vl ? "" : " AVX-512VL",
                        f.avx512vnni ? "" : " AVX-512-VNNI", kinds_here(&f));
            return KVLLM_ECPU;
        }
        ops->name = "avx512";
        ops->matmul = cpu_matmul_avx512;
        /* the AVX2 step's arithmetic bit for bit (test_backend_paged_attn), so the
         * avx512 set answers exactly as the avx2 set does */
        ops->paged_attention = cpu_paged_attention_avx512;
        ops->gelu = cpu_gelu_avx2;
        ops->geglu = cpu_geglu_avx2;
        ops->swiglu = cpu_act_avx512_built() ? cpu_swiglu_avx512 : cpu_swiglu_avx2;
        ops->kv_store = cpu_kv_store_avx2;
        *qrows = qmm_group_avx512;
        return 0;
    }
    if (strcmp(kind, "amx") == 0) {
        /* the avx512 set with the integer matmul on AMX-INT8 tiles (matmul_q8_amx.c) */
        if (!has_avx512(&f) || !cpu_q8_amx_built()) {
            LOG_ERR("cpu_kernels=amx: %s (available here: %s)",
                    !cpu_q8_amx_built() ? "the AMX kernels are not built into this binary (its compiler lacked "
                                          "-mamx-tile -mamx-int8, or not x86-64)"
                                        : "it needs the avx512 set too, which this CPU or build lacks",
                    kinds_here(&f));
            return KVLLM_ECPU;
        }
        if (!has_amx(&f)) {
            LOG_ERR("cpu_kernels=amx: %s (available here: %s)",
                    !f.amx_tile || !f.amx_int8 ? (!f.amx_tile ? "this CPU lacks AMX-TILE and AMX-INT8"
                                                              : "this CPU lacks AMX-INT8")
                    : "the OS does not enable AMX tile state (XCR0 bits 17-18; Linux 5.16 or later does)",
                    kinds_here(&f));
            return KVLLM_ECPU;
        }
        const int e = cpu_amx_permit();
        if (e) {
            LOG_ERR("cpu_kernels=amx: Linux refused this process AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM: %s; "
                    "available here: %s)", strerror(e), kinds_here(&f));
            return KVLLM_ECPU;
        }
        const int rc = cpu_ops_for("avx512", ops, qrows);
        if (rc) return rc;
        ops->name = "amx";
        *qrows = qmm_group_amx;
        return 0;
    }
    LOG_ERR("cpu_kernels=%s: unknown kernel set (valid: %s; available here: %s)", kind, k_kinds, kinds_here(&f));
    return KVLLM_ECPU;
}

/* The activation arithmetic of a kernel set: the scalar set, the oracle,
 * stays f32 whatever is asked. */
static enum act_mode cpu_act_of(enum backend_act act, bool has_qrows) {
    if (!has_qrows) return ACT_F32;
    return act == BACKEND_ACT_F32 ? ACT_F32 : act == BACKEND_ACT_INT ? ACT_INT : ACT_Q8;
}

int backend_cpu_new(const char *kind, bool strict, enum backend_act act, struct backend **out) {
    *out = NULL;
    struct backend_ops ops;
    qmm_group_fn *qrows;
    int rc = cpu_ops_for(kind, &ops, &qrows);
    if (rc) return rc;
    struct cpu_backend *b = xcalloc(1, sizeof *b);
    if (!b) return KVLLM_ENOMEM;
    b->kernels = ops;
    b->ops = ops;
    b->be.ops = &b->ops;
    b->qrows = qrows;
    /* The default is q8: 8-bit activations for the weight types with integer
     * kernels (qmm.h; f32 for the rest and for the logits' matrix, which the
     * avx512 and amx sets take with 16-bit codes when it is Q8_0), the
     * arithmetic llama.cpp uses, held by test_kld.py to llama.cpp's own KL
     * divergence and top-1 agreement against the scalar f32 path on every
     * SmolLM2 file (docs/PERF.md).  f32 keeps every weight in f32
     * arithmetic (the tests whose goldens come from an f32 reference pin
     * it). */
    b->act = cpu_act_of(act, qrows != NULL);
    b->q16 = b->act == ACT_Q8 && b->kernels.matmul == cpu_matmul_avx512 && cpu_q16_avx512_built();
    b->act512 = b->act == ACT_Q8 && b->kernels.matmul == cpu_matmul_avx512 && cpu_act_avx512_built();
    if (b->act == ACT_Q8) {   /* weights repacked for the integer kernels, which get_rows then reads too */
        b->kernels.place_weights = b->ops.place_weights = cpu_place_weights_q8;
        b->kernels.get_rows = b->ops.get_rows = cpu_get_rows_simd;
    }
    pthread_mutex_init(&b->wall_mu, NULL);
    if (strict) {
        b->strict = true;
        cpu_strict_ops(b);
    }
    *out = &b->be;
    return 0;
}

/* backend_free dispatches here (ops->free). */
static void cpu_free(struct backend *be) {
    struct cpu_backend *b = cpu_backend_of(be);
    if (b->strict) cpu_wall_remove(b, NULL);   /* the placed weights */
    free(b->regions);
    free(b->packed);
    pthread_mutex_destroy(&b->wall_mu);
    free(b);
}
