/* graph.c — see graph.h. */
#include "backend/graph.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

int graph_init(struct graph *g, int cap) {
    memset(g, 0, sizeof *g);
    if (cap > 0 && !(g->recs = xmalloc((size_t)cap * sizeof *g->recs))) return KVLLM_ENOMEM;
    g->cap = cap;
    return 0;
}

void graph_exec_drop(struct graph *g) {
    if (g->exec && g->exec_free) g->exec_free(g->exec);
    g->exec = NULL;
    g->exec_free = NULL;
    g->exec_ctx_hi = 0;
    g->no_exec = false;
}

void graph_deinit(struct graph *g) {
    if (!g) return;
    graph_exec_drop(g);
    free(g->recs);
    memset(g, 0, sizeof *g);
}

/* ---- recording ---- */

static struct graph_recorder *rec_of(struct backend_ctx *c) { return (struct graph_recorder *)(void *)c; }

/* The next record of the recording, or NULL past the capacity (counted all the same). */
static struct graph_rec *next(struct backend_ctx *c, enum graph_op op) {
    struct graph *g = rec_of(c)->g;
    if (g->n++ >= g->cap) return NULL;
    struct graph_rec *r = &g->recs[g->n - 1];
    r->op = op;
    return r;
}

/* Record op into the union member m from the fields listed; 0 (a count past the capacity is
 * reported by graph_record_end). */
#define REC(op, m, ...)                                      \
    do {                                                     \
        struct graph_rec *r_ = next(c, op);                  \
        if (r_) r_->u.m = (__typeof__(r_->u.m)){ __VA_ARGS__ }; \
        return 0;                                            \
    } while (0)

static int r_matmul(struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n) {
    REC(GOP_MATMUL, matmul, y, w, x, n);
}
static int r_get_rows(struct backend_ctx *c, float *y, const struct tensor *w, const int32_t *ids, int n) {
    REC(GOP_GET_ROWS, get_rows, y, w, ids, n);
}
static int r_gather_rows(struct backend_ctx *c, float *y, const float *x, const int32_t *ids, int n, int dim) {
    REC(GOP_GATHER_ROWS, gather_rows, y, x, ids, n, dim);
}
static int r_rmsnorm(struct backend_ctx *c, float *y, const float *x, const struct tensor *w, int n, int dim,
                     float eps) {
    REC(GOP_RMSNORM, norm, y, x, w, NULL, n, dim, eps);
}
static int r_layernorm(struct backend_ctx *c, float *y, const float *x, const struct tensor *w,
                       const struct tensor *b, int n, int dim, float eps) {
    REC(GOP_LAYERNORM, norm, y, x, w, b, n, dim, eps);
}
static int r_rope(struct backend_ctx *c, float *x, int n, int n_head, int head_dim, const int32_t *pos,
                  const struct rope_params *p) {
    REC(GOP_ROPE, rope, x, n, n_head, head_dim, pos, *p);
}
static int r_add_bias(struct backend_ctx *c, float *y, const struct tensor *b, int n, int dim) {
    REC(GOP_ADD_BIAS, add_bias, y, b, n, dim);
}
static int r_add(struct backend_ctx *c, float *y, const float *x, long n) { REC(GOP_ADD, ew, y, x, n, 0); }
static int r_swiglu(struct backend_ctx *c, float *g, const float *u, long n) { REC(GOP_SWIGLU, ew, g, u, n, 0); }
static int r_gelu(struct backend_ctx *c, float *x, long n) { REC(GOP_GELU, ew, x, NULL, n, 0); }
static int r_geglu(struct backend_ctx *c, float *g, const float *u, long n) { REC(GOP_GEGLU, ew, g, u, n, 0); }
static int r_scale(struct backend_ctx *c, float *x, long n, float s) { REC(GOP_SCALE, ew, x, NULL, n, s); }
static int r_softcap(struct backend_ctx *c, float *x, long n, float cap) { REC(GOP_SOFTCAP, ew, x, NULL, n, cap); }
static int r_moe_route(struct backend_ctx *c, int32_t *ids, float *weights, const float *logits, int n,
                       int n_expert, int n_used, bool norm) {
    REC(GOP_MOE_ROUTE, moe_route, ids, weights, logits, n, n_expert, n_used, norm);
}
static int r_moe(struct backend_ctx *c, const struct moe_args *a) {
    struct graph_rec *r = next(c, GOP_MOE);
    if (r) r->u.moe = *a;
    return 0;
}
static int r_kv_store(struct backend_ctx *c, const struct kv_layer_view *kv, const int32_t *slots, const float *k,
                      const float *v, int n) {
    REC(GOP_KV_STORE, kv_store, *kv, slots, k, v, n);
}
static int r_paged_attention(struct backend_ctx *c, const struct paged_attn_args *a) {
    struct graph_rec *r = next(c, GOP_PAGED_ATTN);
    if (r) r->u.attn = *a;
    return 0;
}
static int r_argmax(struct backend_ctx *c, int32_t *ids, const float *x, int n, int dim) {
    REC(GOP_ARGMAX, argmax, ids, x, n, dim);
}
static int r_add_rmsnorm(struct backend_ctx *c, float *y, float *x, const float *h, const struct tensor *w, int n,
                         int dim, float eps) {
    REC(GOP_ADD_RMSNORM, add_rmsnorm, y, x, h, w, n, dim, eps);
}
static int r_rope_kv_store(struct backend_ctx *c, const struct rope_kv_args *a) {
    struct graph_rec *r = next(c, GOP_ROPE_KV_STORE);
    if (r) r->u.rope_kv = *a;
    return 0;
}
static int r_matmuls(struct backend_ctx *c, const struct matmuls_args *a) {
    struct graph_rec *r = next(c, GOP_MATMULS);
    if (r) r->u.matmuls = *a;
    return 0;
}

/* What a recording cannot hold: host transfers, waits and host-array ops mark it unusable. */
static int r_refuse(struct graph_recorder *r) {
    if (!r->rc) r->rc = KVLLM_EUNSUPPORTED;
    return KVLLM_EUNSUPPORTED;
}
static int r_xfer(struct backend_ctx *c, void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return r_refuse(rec_of(c));
}
static int r_sync(struct backend_ctx *c) { return r_refuse(rec_of(c)); }
static int r_copy_blocks(struct backend_ctx *c, const struct kv_layer_view *layers, int n_layer,
                         const int32_t (*pairs)[2], int n) {
    (void)layers, (void)n_layer, (void)pairs, (void)n;
    return r_refuse(rec_of(c));
}
static int r_kv_shift(struct backend_ctx *c, const struct kv_layer_view *layers, int n_layer, const int32_t *src,
                      const int32_t *dst, int n, int delta, const struct rope_params *p) {
    (void)layers, (void)n_layer, (void)src, (void)dst, (void)n, (void)delta, (void)p;
    return r_refuse(rec_of(c));
}

static int r_sample(struct backend_ctx *c, const struct sample_args *a) {   /* a stage after the forward */
    (void)a;
    return r_refuse(rec_of(c));
}

/* m's recording twin where real has the op, NULL where it has none. */
#define TWIN(m, f) r->ops.m = real->ops->m ? f : NULL

void graph_recorder_init(struct graph_recorder *r, const struct backend_ctx *real) {
    memset(r, 0, sizeof *r);
    r->ops.name = real->ops->name;
    r->ops.free = real->ops->free;                 /* the backend's own answers: the same backend */
    r->ops.supports_op = real->ops->supports_op;
    TWIN(upload, r_xfer);
    TWIN(download, r_xfer);
    TWIN(sync, r_sync);
    TWIN(matmul, r_matmul);
    TWIN(get_rows, r_get_rows);
    TWIN(gather_rows, r_gather_rows);
    TWIN(rmsnorm, r_rmsnorm);
    TWIN(layernorm, r_layernorm);
    TWIN(rope, r_rope);
    TWIN(add_bias, r_add_bias);
    TWIN(add, r_add);
    TWIN(swiglu, r_swiglu);
    TWIN(gelu, r_gelu);
    TWIN(geglu, r_geglu);
    TWIN(scale, r_scale);
    TWIN(softcap, r_softcap);
    TWIN(moe_route, r_moe_route);
    TWIN(moe, r_moe);
    TWIN(kv_store, r_kv_store);
    TWIN(paged_attention, r_paged_attention);
    TWIN(add_rmsnorm, r_add_rmsnorm);
    TWIN(rope_kv_store, r_rope_kv_store);
    TWIN(matmuls, r_matmuls);
    TWIN(copy_blocks, r_copy_blocks);
    TWIN(kv_shift, r_kv_shift);
    TWIN(argmax, r_argmax);
    TWIN(sample, r_sample);
    r->base = (struct backend_ctx){ .ops = &r->ops, .be = real->be };
}
#undef TWIN

void graph_record_begin(struct graph_recorder *r, struct graph *g) {
    graph_exec_drop(g);
    g->n = 0;
    r->g = g;
    r->rc = 0;
    r->base.status = 0;
}

int graph_record_end(struct graph_recorder *r, int rc_forward) {
    r->base.status = 0;
    if (r->rc) return r->rc;
    if (rc_forward) return rc_forward;
    return r->g->n > r->g->cap ? KVLLM_ERANGE : 0;
}

int graph_recorded(const struct graph_recorder *r) { return r->g->n; }

/* ---- replay ---- */

static int replay_one(struct backend_ctx *c, const struct graph_rec *r, int ctx_hi) {
    switch (r->op) {
    case GOP_MATMUL: return BE_OP(c, matmul, r->u.matmul.y, r->u.matmul.w, r->u.matmul.x, r->u.matmul.n);
    case GOP_GET_ROWS: return BE_OP(c, get_rows, r->u.get_rows.y, r->u.get_rows.w, r->u.get_rows.ids, r->u.get_rows.n);
    case GOP_GATHER_ROWS:
        return BE_OP(c, gather_rows, r->u.gather_rows.y, r->u.gather_rows.x, r->u.gather_rows.ids,
                     r->u.gather_rows.n, r->u.gather_rows.dim);
    case GOP_RMSNORM:
        return BE_OP(c, rmsnorm, r->u.norm.y, r->u.norm.x, r->u.norm.w, r->u.norm.n, r->u.norm.dim, r->u.norm.eps);
    case GOP_LAYERNORM:
        return BE_OP(c, layernorm, r->u.norm.y, r->u.norm.x, r->u.norm.w, r->u.norm.b, r->u.norm.n, r->u.norm.dim,
                     r->u.norm.eps);
    case GOP_ROPE:
        return BE_OP(c, rope, r->u.rope.x, r->u.rope.n, r->u.rope.n_head, r->u.rope.head_dim, r->u.rope.pos,
                     &r->u.rope.p);
    case GOP_ADD_BIAS: return BE_OP(c, add_bias, r->u.add_bias.y, r->u.add_bias.b, r->u.add_bias.n, r->u.add_bias.dim);
    case GOP_ADD: return BE_OP(c, add, r->u.ew.y, r->u.ew.x, r->u.ew.n);
    case GOP_SWIGLU: return BE_OP(c, swiglu, r->u.ew.y, r->u.ew.x, r->u.ew.n);
    case GOP_GELU: return BE_OP(c, gelu, r->u.ew.y, r->u.ew.n);
    case GOP_GEGLU: return BE_OP(c, geglu, r->u.ew.y, r->u.ew.x, r->u.ew.n);
    case GOP_SCALE: return BE_OP(c, scale, r->u.ew.y, r->u.ew.n, r->u.ew.s);
    case GOP_SOFTCAP: return BE_OP(c, softcap, r->u.ew.y, r->u.ew.n, r->u.ew.s);
    case GOP_MOE_ROUTE:
        return BE_OP(c, moe_route, r->u.moe_route.ids, r->u.moe_route.weights, r->u.moe_route.logits,
                     r->u.moe_route.n, r->u.moe_route.n_expert, r->u.moe_route.n_used, r->u.moe_route.norm);
    case GOP_MOE: return BE_OP(c, moe, &r->u.moe);
    case GOP_KV_STORE:
        return BE_OP(c, kv_store, &r->u.kv_store.kv, r->u.kv_store.slots, r->u.kv_store.k, r->u.kv_store.v,
                     r->u.kv_store.n);
    case GOP_PAGED_ATTN: {
        struct paged_attn_args a = r->u.attn;   /* the step's own longest context, never the recording's */
        a.ctx_hi = ctx_hi;
        return BE_OP(c, paged_attention, &a);
    }
    case GOP_ARGMAX: return BE_OP(c, argmax, r->u.argmax.ids, r->u.argmax.x, r->u.argmax.n, r->u.argmax.dim);
    case GOP_ADD_RMSNORM:
        return BE_OP(c, add_rmsnorm, r->u.add_rmsnorm.y, r->u.add_rmsnorm.x, r->u.add_rmsnorm.h, r->u.add_rmsnorm.w,
                     r->u.add_rmsnorm.n, r->u.add_rmsnorm.dim, r->u.add_rmsnorm.eps);
    case GOP_ROPE_KV_STORE: return BE_OP(c, rope_kv_store, &r->u.rope_kv);
    case GOP_MATMULS: return BE_OP(c, matmuls, &r->u.matmuls);
    }
    KV_ASSERT(!"unknown graph op");
    return KVLLM_EINVAL;
}

int graph_replay(struct backend_ctx *c, const struct graph *g, int ctx_hi) {
    KV_ASSERT(g->n <= g->cap);
    for (int i = 0; i < g->n; i++) {
        int rc = replay_one(c, &g->recs[i], ctx_hi);
        if (rc) return rc;
    }
    return 0;
}

int graph_compute(struct backend_ctx *c, struct graph *g, int ctx_hi) {
    if (!c->ops->graph_compute) return graph_replay(c, g, ctx_hi);
    if (c->status) return c->status;
    int rc = c->ops->graph_compute(c, g, ctx_hi);
    if (rc && !c->status) c->status = rc;
    return rc;
}
