/* cpu_ops.c — the portable scalar ops: f32 arithmetic on dequantized
 * weights.  They are the reference every faster kernel, and every other
 * backend, is checked against (tests/unit/test_backend_ops.c).
 *
 * Threading splits output rows (matmul), token rows (the norms) or (token,
 * kv head, split) items (paged attention, kv_kernels.c) into contiguous
 * ranges; no reduction is ever split across threads, so results do not
 * depend on the thread count either. */
#include "backend/cpu/cpu_ops.h"
#include "core/core.h"

#include <math.h>
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
    struct cpu_ctx *cc;
    float *y;
    const struct tensor *w;
    const float *x;
    int n;
};

/* Row blocks per chunk of work (threadpool_run_chunks); CPU_MM_ROWS rows
 * are dequantized together so that they are reused across all tokens while
 * hot in cache. */
#define MM_CHUNK_BLOCKS 8

static void matmul_chunk(void *arg, long c, int ith) {
    struct matmul_job *j = arg;
    const struct tensor *w = j->w;
    const int64_t K = w->ne0, M = w->ne1, per = MM_CHUNK_BLOCKS * CPU_MM_ROWS;
    const long r0 = c * per, r1 = r0 + per > M ? M : r0 + per;
    float *buf = j->cc->scratch + (size_t)ith * (size_t)j->cc->scratch_cols;
    for (long r = r0; r < r1; r += CPU_MM_ROWS) {
        int nr = (int)(r1 - r < CPU_MM_ROWS ? r1 - r : CPU_MM_ROWS);
        const float *rows[CPU_MM_ROWS];
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

int cpu_matmul(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n) {
    struct cpu_ctx *cc = cpu_ctx_of(c);
    KV_ASSERT(w->ne0 * CPU_MM_ROWS <= cc->scratch_cols);
    struct matmul_job j = { cc, y, w, x, n };
    const long per = MM_CHUNK_BLOCKS * CPU_MM_ROWS;
    threadpool_run_chunks(cc->pool, (w->ne1 + per - 1) / per, matmul_chunk, &j);
    return 0;
}

/* ---- row-wise ops ---- */

int cpu_get_rows(struct backend_ctx *c, float *y, const struct tensor *w, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= w->ne1) {
            LOG_ERR("get_rows: row %d of a %lld-row tensor", ids[i], (long long)w->ne1);
            return KVLLM_ERANGE;
        }
        dtype_to_f32(w->type, tensor_row(w, ids[i]), y + (size_t)i * w->ne0, w->ne0);
    }
    return 0;
}

int cpu_gather_rows(struct backend_ctx *c, float *y, const float *x, const int32_t *ids, int n, int dim) {
    for (int i = 0; i < n; i++)
        memmove(y + (size_t)i * dim, x + (size_t)ids[i] * dim, (size_t)dim * sizeof *y);
    return 0;
}

int cpu_argmax(struct backend_ctx *c, int32_t *ids, const float *x, int n, int dim) {
    for (int i = 0; i < n; i++) {
        const float *r = x + (size_t)i * dim;
        int32_t best = -1;
        float bv = -INFINITY;
        for (int j = 0; j < dim; j++)
            if (r[j] > bv) { best = j; bv = r[j]; }  /* NaN never compares greater; ties keep the lowest */
        ids[i] = best;
    }
    return 0;
}

/* Floats per chunk of the row-wise norms (whole rows, at least one): about
 * a microsecond of work, which outweighs the claim of a chunk — 7 of
 * SmolLM2's 576-float rows, 64 of a q/k norm's 64-float heads; a decode
 * step's row runs inline. */
#define NORM_FLOATS 4096

/* rmsnorm of n rows of dim, after the residual add x += h when h is set
 * (add_rmsnorm), rows rows a chunk. */
struct norm_job {
    float *y, *x;
    const float *h, *w;
    int n, dim, rows;
    float eps;
};

static void norm_chunk(void *arg, long c, int ith) {
    (void)ith;
    const struct norm_job *j = arg;
    const int t1 = (int)((c + 1) * j->rows < j->n ? (c + 1) * j->rows : j->n);
    for (int t = (int)c * j->rows; t < t1; t++) {
        float *xt = j->x + (size_t)t * j->dim, *yt = j->y + (size_t)t * j->dim;
        if (j->h)   /* the residual add first: y may be h, whose row is read before it is written */
            for (int i = 0; i < j->dim; i++) xt[i] += j->h[(size_t)t * j->dim + i];
        float ss = dot_f32(xt, xt, j->dim);
        float s = 1.0f / sqrtf(ss / (float)j->dim + j->eps);
        for (int i = 0; i < j->dim; i++) yt[i] = xt[i] * s * j->w[i];
    }
}

static int norm_run(struct backend_ctx *c, struct norm_job *j) {
    j->rows = j->dim < NORM_FLOATS ? NORM_FLOATS / j->dim : 1;
    threadpool_run_chunks(cpu_ctx_of(c)->pool, (j->n + j->rows - 1) / j->rows, norm_chunk, j);
    return 0;
}

int cpu_rmsnorm(struct backend_ctx *c, float *y, const float *x, const struct tensor *wt, int n, int dim,
                float eps) {
    struct norm_job j = { y, (float *)(uintptr_t)x, NULL, wt->data, n, dim, 0, eps };   /* x only read: no h */
    return norm_run(c, &j);
}

int cpu_layernorm(struct backend_ctx *c, float *y, const float *x, const struct tensor *wt,
                  const struct tensor *bt, int n, int dim, float eps) {
    const float *w = wt->data, *b = bt ? bt->data : NULL;
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
    return 0;
}

/* Rope of up to two tensors at the same positions (a step's q and k): each
 * (token, pair)'s cos and sin are computed once for both, in double, and the
 * tokens are split over the pool in chunks.  They are kept in the context
 * (cpu_ctx.rope_cs) for the next call with the same settings and positions:
 * a forward's layers all rope the same positions, and libm's sincos of each
 * layer was 1.2 % of SmolLM2's prefill. */
enum { ROPE_MAX_PAIRS = 256, ROPE_TOKENS = 8 };

struct rope_job {
    float *x[2];              /* x[1] may be NULL */
    int n_head[2], head_dim, n;
    const int32_t *pos;
    const struct rope_params *p;
    float *cs;                /* (n, cs_cols): each token's (cos, sin) per pair; NULL: not kept */
    int cs_cols;
    bool cs_held;             /* cs holds this call's: read, not computed */
    double fr[ROPE_MAX_PAIRS];   /* each pair's frequency once per call (pow was a third of a prefill's rope) */
};

/* Whether a and b turn every pair by the same angle and magnitude (neox
 * only places the pairs). */
static bool rope_same_angles(const struct rope_params *a, const struct rope_params *b) {
    return a->n_rot == b->n_rot && a->theta == b->theta && a->freq_scale == b->freq_scale &&
           a->freq_factors == b->freq_factors && a->attn_factor == b->attn_factor && a->yarn == b->yarn &&
           (!a->yarn || (a->yarn_lo == b->yarn_lo && a->yarn_hi == b->yarn_hi));
}

/* A token's pairs a block at a time: their cos and sin (kept or made),
 * then each head's pairs of the block in a row, which vectorizes (a
 * pair's two products and one difference or sum, as before: the same bits). */
enum { ROPE_BLOCK = 64 };

static void rope_chunk(void *arg, long c, int ith) {
    (void)ith;
    const struct rope_job *j = arg;
    const struct rope_params *p = j->p;
    const int n_rot = p->n_rot, half = n_rot / 2, hd = j->head_dim;
    const float *ff = p->freq_factors ? p->freq_factors->data : NULL;
    const double ms = p->attn_factor != 0 ? (double)p->attn_factor : 1.0;
    const int t1 = (int)((c + 1) * ROPE_TOKENS < j->n ? (c + 1) * ROPE_TOKENS : j->n);
    for (int t = (int)(c * ROPE_TOKENS); t < t1; t++)
        for (int i0 = 0; i0 < half; i0 += ROPE_BLOCK) {
            const int m = half - i0 < ROPE_BLOCK ? half - i0 : ROPE_BLOCK;
            float cs[ROPE_BLOCK], sn[ROPE_BLOCK];
            for (int e = 0; e < m; e++) {
                const int i = i0 + e;
                float *held = j->cs ? j->cs + (size_t)t * (size_t)j->cs_cols + 2 * (size_t)i : NULL;
                if (j->cs_held) {
                    cs[e] = held[0];
                    sn[e] = held[1];
                    continue;
                }
                /* angle in double: positions reach 10^5 and f32 would lose the phase */
                double ang = (double)j->pos[t] *
                             (i < ROPE_MAX_PAIRS ? j->fr[i] : pow((double)p->theta, -2.0 * i / (double)n_rot)) *
                             rope_pair_scale(p, i);
                if (ff) ang /= (double)ff[i];
                cs[e] = (float)(cos(ang) * ms);
                sn[e] = (float)(sin(ang) * ms);
                if (held) held[0] = cs[e], held[1] = sn[e];
            }
            for (int k = 0; k < 2 && j->x[k]; k++)
                for (int h = 0; h < j->n_head[k]; h++) {
                    float *x = j->x[k] + ((size_t)t * j->n_head[k] + (size_t)h) * hd;
                    if (p->neox) {   /* pair i: (x[i], x[i + half]) */
                        float *lo = x + i0, *hi = x + half + i0;
                        for (int e = 0; e < m; e++) {
                            const float a = lo[e], b = hi[e];
                            lo[e] = a * cs[e] - b * sn[e];
                            hi[e] = a * sn[e] + b * cs[e];
                        }
                    } else {         /* pair i: (x[2i], x[2i + 1]) */
                        float *q = x + 2 * (size_t)i0;
                        for (int e = 0; e < m; e++) {
                            const float a = q[2 * e], b = q[2 * e + 1];
                            q[2 * e] = a * cs[e] - b * sn[e];
                            q[2 * e + 1] = a * sn[e] + b * cs[e];
                        }
                    }
                }
        }
}

static int rope_run(struct backend_ctx *c, float *x, int n_head, float *x2, int n_head2, int n, int head_dim,
                    const int32_t *pos, const struct rope_params *p) {
    struct cpu_ctx *cc = cpu_ctx_of(c);
    struct rope_job j = { { x, x2 }, { n_head, n_head2 }, head_dim, n, pos, p, NULL, cc->rope_cols, false, { 0 } };
    if (n <= cc->max_tokens && p->n_rot <= cc->rope_cols) {
        j.cs = cc->rope_cs;
        j.cs_held = cc->rope_n == n && rope_same_angles(&cc->rope_key, p) &&
                    !memcmp(cc->rope_pos, pos, (size_t)n * sizeof *pos);
    }
    if (!j.cs_held)
        for (int i = 0; i < p->n_rot / 2 && i < ROPE_MAX_PAIRS; i++) j.fr[i] = pow((double)p->theta, -2.0 * i / (double)p->n_rot);
    cc->rope_n = 0;              /* rewritten below: held only once the call has filled it */
    threadpool_run_chunks(cc->pool, (n + ROPE_TOKENS - 1) / ROPE_TOKENS, rope_chunk, &j);
    if (j.cs) {
        if (!j.cs_held) memcpy(cc->rope_pos, pos, (size_t)n * sizeof *pos);
        cc->rope_key = *p;
        cc->rope_n = n;
    }
    return 0;
}

int cpu_rope(struct backend_ctx *c, float *x, int n, int n_head, int head_dim, const int32_t *pos,
             const struct rope_params *p) {
    return rope_run(c, x, n_head, NULL, 0, n, head_dim, pos, p);
}

int cpu_add_bias(struct backend_ctx *c, float *y, const struct tensor *bt, int n, int dim) {
    const float *b = bt->data;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < dim; i++) y[(size_t)t * dim + i] += b[i];
    return 0;
}

static inline float gelu1(float v) {
    const float k = 0.7978845608028654f;   /* sqrt(2 / pi) */
    return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
}

int cpu_gelu(struct backend_ctx *c, float *x, long n) {
    for (long i = 0; i < n; i++) x[i] = gelu1(x[i]);
    return 0;
}

int cpu_geglu(struct backend_ctx *c, float *g, const float *u, long n) {
    for (long i = 0; i < n; i++) g[i] = gelu1(g[i]) * u[i];
    return 0;
}

int cpu_scale(struct backend_ctx *c, float *x, long n, float s) {
    for (long i = 0; i < n; i++) x[i] *= s;
    return 0;
}

int cpu_softcap(struct backend_ctx *c, float *x, long n, float cap) {
    for (long i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
    return 0;
}

int cpu_swiglu(struct backend_ctx *c, float *g, const float *u, long n) {
    for (long i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    return 0;
}

int cpu_add(struct backend_ctx *c, float *y, const float *x, long n) {
    for (long i = 0; i < n; i++) y[i] += x[i];
    return 0;
}

/* ---- fused ops: one launch on a device; here add_rmsnorm's parts a row
 * at a time (norm_chunk: every set's add and rmsnorm are the ops above), and
 * rope_kv_store's in turn through the kernel set's table (so a set's own
 * kernels, inside the strict wall when the strict backend wraps it) ---- */

int cpu_add_rmsnorm(struct backend_ctx *c, float *y, float *x, const float *h, const struct tensor *w, int n, int dim,
                    float eps) {
    struct norm_job j = { y, x, h, w->data, n, dim, 0, eps };   /* add's and rmsnorm's arithmetic, a row at a time */
    return norm_run(c, &j);
}

int cpu_rope_kv_store(struct backend_ctx *c, const struct rope_kv_args *a) {
    const struct backend_ops *k = &cpu_backend_of(c->be)->kernels;
    int rc;
    if (k->rope == cpu_rope)   /* q and k in one pass: the same bits as two ropes */
        rc = rope_run(c, a->q, a->n_head, a->k, a->n_head_kv, a->n, a->head_dim, a->pos, &a->rope);
    else if (!(rc = k->rope(c, a->q, a->n, a->n_head, a->head_dim, a->pos, &a->rope)))
        rc = k->rope(c, a->k, a->n, a->n_head_kv, a->head_dim, a->pos, &a->rope);
    return rc ? rc : k->kv_store(c, &a->kv, a->slots, a->k, a->v, a->n);
}

int cpu_copy_blocks(struct backend_ctx *c, const struct kv_layer_view *layers, int n_layer,
                    const int32_t (*pairs)[2], int n) {
    for (int i = 0; i < n; i++) {
        const int32_t dst = pairs[i][0], src = pairs[i][1];
        if (dst == src) continue;
        for (int il = 0; il < n_layer; il++) {
            const struct kv_layer_view *l = &layers[il];
            const size_t rows = kv_block_rows(l), bytes = kv_block_bytes(l);
            uint8_t *k = l->k, *v = l->v;
            memcpy(k + (size_t)dst * bytes, k + (size_t)src * bytes, bytes);
            memcpy(v + (size_t)dst * bytes, v + (size_t)src * bytes, bytes);
            if (l->k_scale) {
                memcpy(l->k_scale + (size_t)dst * rows, l->k_scale + (size_t)src * rows, rows * sizeof(float));
                memcpy(l->v_scale + (size_t)dst * rows, l->v_scale + (size_t)src * rows, rows * sizeof(float));
            }
        }
    }
    return 0;
}
