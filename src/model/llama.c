/* llama.c — the decoder forward pass over a batch of tokens from any number
 * of sequences, for every family model.c loads, read from the family's
 * description (struct arch_desc) rather than its name:
 *   x = embed(tokens) [* embd_scale]         (+ position_embd[pos]: learned positions)
 *   per layer: h = attn(norm(x)):  q, k, v = Wq·, Wk·, Wv· (+ biases); [per-head norm of q, k];
 *                                  rope(q), rope(k) with the layer's base; softmax(q·k * scale
 *                                  [soft-capped], [sink]) over the layer's window of the paged cache; Wo· (+ bo)
 *              x += [post_norm](h)
 *              h = ffn(norm(x)):   Wdown · (silu(Wgate·) * Wup·)  |  Wdown · (gelu(Wgate·) * Wup·)
 *                                  |  Wdown · gelu(Wup· + bup) + bdown
 *                                  |  Σ over the token's top-k experts e of w_e · FFN_e (routed by
 *                                     softmax(Wrouter· [+ b]), grouped by expert; biases per expert)
 *              x += [post_norm](h)
 *   logits = Wout · norm(x) [soft-capped]    (only for the rows that need them)
 * norm is RMSNorm, or LayerNorm with bias; the bracketed steps are the
 * family's; absent biases are skipped.  Matrix products run over all rows
 * at once (prefill chunks and decode tokens alike); attention reads each
 * token's own sequence through its block table.  All arithmetic is ops
 * issued on the caller's execution context; this file never touches weight
 * or activation memory itself. */
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Width of the q buffer: the query heads, and at least n_embd, since the
 * rows that need logits are gathered there (a family may have fewer query
 * dims than n_embd: Gemma 2 2B). */
static uint64_t q_width(const struct model_hparams *hp) {
    uint64_t q = (uint64_t)hp->n_head * hp->head_dim;
    return q > (uint64_t)hp->n_embd ? q : (uint64_t)hp->n_embd;
}

/* Width of the gate and up buffers: the dense FFN's or one expert's. */
static uint64_t ff_width(const struct model_hparams *hp) {
    return hp->n_expert && hp->n_ff_exp > hp->n_ff ? (uint64_t)hp->n_ff_exp : (uint64_t)hp->n_ff;
}

/* Floats a token takes in the mixture-of-experts buffers (0 for a dense model). */
static uint64_t moe_floats(const struct model_hparams *hp) {
    return hp->n_expert ? (uint64_t)hp->n_expert + 2 * (uint64_t)hp->n_expert_used + 2 * (uint64_t)hp->n_embd : 0;
}

static uint64_t act_floats(const struct model_hparams *hp, int n, int n_logits) {
    uint64_t q = q_width(hp), kv = (uint64_t)hp->n_head_kv * hp->head_dim;
    return (uint64_t)n * (2 * (uint64_t)hp->n_embd + 2 * q + 2 * kv + 2 * ff_width(hp) + moe_floats(hp)) +
           (uint64_t)n_logits * (uint64_t)hp->n_vocab;
}

uint64_t forward_buf_bytes(const struct model_hparams *hp, int n_max, int n_logits_max) {
    return act_floats(hp, n_max, n_logits_max) * sizeof(float);
}

int forward_buf_init(struct forward_buf *b, struct backend *be, const struct model_hparams *hp, int n_max,
                     int n_logits_max) {
    memset(b, 0, sizeof *b);
    uint64_t bytes = forward_buf_bytes(hp, n_max, n_logits_max);
    if (bytes > SIZE_MAX / 2) return KVLLM_ERANGE;
    int rc = be->ops->buf_alloc(be, (size_t)bytes, &b->mem);
    if (rc) return rc;
    const size_t n = (size_t)n_max, q = (size_t)q_width(hp), kv = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t ff = (size_t)ff_width(hp), E = (size_t)hp->n_embd, ne = (size_t)hp->n_expert,
                 nu = (size_t)hp->n_expert_used;
    b->be = be;
    b->n_max = n_max;
    b->n_logits_max = n_logits_max;
    b->x = b->mem.data;                /* (n, n_embd) residual stream */
    b->xn = b->x + n * hp->n_embd;     /* (n, n_embd) normed / projected back */
    b->q = b->xn + n * hp->n_embd;     /* (n, q) */
    b->att = b->q + n * q;             /* (n, q) attention output */
    b->k = b->att + n * q;             /* (n, kv) */
    b->v = b->k + n * kv;              /* (n, kv) */
    b->gate = b->v + n * kv;           /* (n, ff) */
    b->up = b->gate + n * ff;          /* (n, ff) */
    b->logits = b->up + n * ff;        /* (n_logits_max, n_vocab) */
    if (ne) {                          /* mixture of experts */
        b->router = b->logits + (size_t)n_logits_max * hp->n_vocab;   /* (n, n_expert) */
        b->moe_w = b->router + n * ne;                                /* (n, n_expert_used) */
        b->moe_ids = (int32_t *)(b->moe_w + n * nu);                  /* (n, n_expert_used) */
        b->moe_x = (float *)(b->moe_ids + n * nu);                    /* (n, n_embd) */
        b->moe_y = b->moe_x + n * E;                                  /* (n, n_embd) */
    }
    return 0;
}

void forward_buf_deinit(struct forward_buf *b) {
    if (!b) return;
    if (b->be) b->be->ops->buf_free(b->be, &b->mem);
    memset(b, 0, sizeof *b);
}

/* Issue an op; return its error from the enclosing function. */
#define OP(op, ...) do { int rc_ = BE_OP(c, op, __VA_ARGS__); if (rc_) return rc_; } while (0)

/* y = norm(x) over n rows of n_embd: LayerNorm with bias or RMSNorm, as the family says. */
static int norm(const struct model *m, struct backend_ctx *c, float *y, const float *x, const struct tensor *w,
                const struct tensor *b, int n) {
    if (m->desc->norm == NORM_LAYER)
        return BE_OP(c, layernorm, y, x, w, b->data ? b : NULL, n, m->hp.n_embd, m->hp.norm_eps);
    return BE_OP(c, rmsnorm, y, x, w, n, m->hp.n_embd, m->hp.norm_eps);
}

/* y (n, b->ne0) += b, when the bias is present. */
static int bias(struct backend_ctx *c, float *y, const struct tensor *b, int n) {
    return b->data ? BE_OP(c, add_bias, y, b, n, (int)b->ne0) : 0;
}

/* a->y[i] = a->x · a->w[i]ᵀ: one op where the backend shares the work on x. */
static int matmuls(const struct model *m, struct backend_ctx *c, const struct matmuls_args *a) {
    if (backend_supports(m->be, BACKEND_OP_MATMULS, 0)) return BE_OP(c, matmuls, a);
    for (int i = 0; i < a->k; i++) OP(matmul, a->y[i], a->w[i], a->x, a->n);
    return 0;
}

/* b->xn = Wo · attention(b->xn) for layer il, this batch's K/V stored first. */
static int attention(const struct model *m, struct backend_ctx *c, const struct kv_layer_view *kv,
                     const struct forward_buf *b, const struct batch *bt, int il) {
    const struct model_hparams *hp = &m->hp;
    const struct llama_layer *l = &m->layers[il];
    const int n = bt->n_tokens;
    const struct matmuls_args qkv = { .k = 3, .n = n, .x = b->xn, .y = { b->q, b->k, b->v },
                                      .w = { &l->wq, &l->wk, &l->wv } };
    int rc;
    if ((rc = matmuls(m, c, &qkv)) || (rc = bias(c, b->q, &l->bq, n)) || (rc = bias(c, b->k, &l->bk, n)) ||
        (rc = bias(c, b->v, &l->bv, n)))
        return rc;
    if (m->desc->qk_norm) {   /* each head's row of head_dim normed on its own */
        OP(rmsnorm, b->q, b->q, &l->attn_q_norm, n * hp->n_head, hp->head_dim, hp->norm_eps);
        OP(rmsnorm, b->k, b->k, &l->attn_k_norm, n * hp->n_head_kv, hp->head_dim, hp->norm_eps);
    }
    /* then store this batch's K/V: a prefill chunk attends to itself */
    const bool own_pool = l->window > 0 && bt->win_slots;
    const int32_t *slots = own_pool ? bt->win_slots : bt->slots;
    if (l->rope.n_rot && backend_supports(m->be, BACKEND_OP_ROPE_KV_STORE, 0)) {
        const struct rope_kv_args ra = { .n = n, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv,
                                         .head_dim = hp->head_dim, .q = b->q, .k = b->k, .v = b->v, .pos = bt->pos,
                                         .slots = slots, .rope = l->rope, .kv = kv[il] };
        OP(rope_kv_store, &ra);
    } else {
        if (l->rope.n_rot) {   /* 0: learned positions, or a layer without them */
            OP(rope, b->q, n, hp->n_head, hp->head_dim, bt->pos, &l->rope);
            OP(rope, b->k, n, hp->n_head_kv, hp->head_dim, bt->pos, &l->rope);
        }
        OP(kv_store, &kv[il], slots, b->k, b->v, n);
    }
    struct paged_attn_args a = {
        .n_tokens = n, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim, .q = b->q,
        .pos = bt->pos, .seq = bt->seq, .block_table = own_pool ? bt->win_block_table : bt->block_table,
        .max_blocks = bt->max_blocks,
        .kv = kv[il], .scale = hp->attn_scale, .softcap = hp->attn_softcap, .window = l->window,
        .sinks = l->attn_sinks.data, .out = b->att, .ctx_hi = bt->ctx_hi,
    };
    OP(paged_attention, &a);
    OP(matmul, b->xn, &l->wo, b->att, n);
    /* this rank's heads give a partial sum of the projection: the ranks' sums added, then the bias once */
    if ((rc = comm_all_reduce(m->comm, c, b->xn, (size_t)n * hp->n_embd))) return rc;
    return bias(c, b->xn, &l->bo, n);
}

/* *h = the experts' FFN of b->xn for layer il: route each token to its
 * n_expert_used experts, then run them grouped by expert (backend_ops.moe).
 * Under tensor parallelism every rank routes alike (the router is whole and
 * b->xn the same on every rank) and runs its slice of each expert. */
static int experts(const struct model *m, struct backend_ctx *c, const struct forward_buf *b, int il, int n,
                   float **h) {
    const struct model_hparams *hp = &m->hp;
    const struct llama_layer *l = &m->layers[il];
    static const enum glu_kind act[] = { [FFN_SWIGLU] = GLU_SILU, [FFN_GEGLU] = GLU_GELU,
                                         [FFN_SWIGLU_OAI] = GLU_SWIGLU_OAI };   /* the loader refuses FFN_GELU */
    OP(matmul, b->router, &l->ffn_gate_inp, b->xn, n);
    int rc = bias(c, b->router, &l->ffn_gate_inp_b, n);
    if (rc) return rc;
    OP(moe_route, b->moe_ids, b->moe_w, b->router, n, hp->n_expert, hp->n_expert_used, m->desc->expert_norm);
    struct moe_args a = {
        .n_tokens = n, .n_used = hp->n_expert_used, .n_expert = hp->n_expert, .n_embd = hp->n_embd,
        .n_ff = hp->n_ff_exp, .x = b->xn, .ids = b->moe_ids, .weights = b->moe_w, .gate = l->exp_gate,
        .up = l->exp_up, .down = l->exp_down, .gate_b = l->exp_gate_b.data ? &l->exp_gate_b : NULL,
        .up_b = l->exp_up_b.data ? &l->exp_up_b : NULL, .down_b = l->exp_down_b.data ? &l->exp_down_b : NULL,
        .act = act[m->desc->ffn], .xs = b->moe_x, .ys = b->moe_y, .g = b->gate, .u = b->up,
        .out = b->att,   /* att: free after attention */
    };
    OP(moe, &a);
    *h = b->att;
    /* this rank's slice of every expert gives a partial sum, as a dense FFN's does (shard.c) */
    return comm_all_reduce(m->comm, c, b->att, (size_t)n * hp->n_embd);
}

/* *h = ffn(b->xn) for layer il: the dense FFN (in place, in b->xn) or the experts. */
static int ffn(const struct model *m, struct backend_ctx *c, const struct forward_buf *b, int il, int n, float **h) {
    const struct llama_layer *l = &m->layers[il];
    if (l->exp_gate) return experts(m, c, b, il, n, h);
    const long nf = (long)n * m->hp.n_ff;
    const bool glu = m->desc->ffn != FFN_GELU;
    const struct matmuls_args up = { .k = glu ? 2 : 1, .n = n, .x = b->xn, .y = { b->up, b->gate },
                                     .w = { &l->ffn_up, &l->ffn_gate } };
    int rc;
    if ((rc = matmuls(m, c, &up)) || (rc = bias(c, b->up, &l->ffn_up_b, n))) return rc;
    const float *act = b->gate;
    switch (m->desc->ffn) {
    case FFN_SWIGLU: OP(swiglu, b->gate, b->up, nf); break;
    case FFN_GEGLU:  OP(geglu, b->gate, b->up, nf); break;
    case FFN_GELU:   OP(gelu, b->up, nf); act = b->up; break;
    case FFN_SWIGLU_OAI: return KVLLM_EUNSUPPORTED;   /* experts only: the loader refuses a dense one */
    }
    OP(matmul, b->xn, &l->ffn_down, act, n);
    *h = b->xn;
    if ((rc = comm_all_reduce(m->comm, c, b->xn, (size_t)n * m->hp.n_embd))) return rc;   /* as attention's */
    return bias(c, b->xn, &l->ffn_down_b, n);
}

/* x += [post_norm](h), the residual add of a sub-layer's output h (n,
 * n_embd); then, when w is given, b->xn = norm(x) with (w, wb): the next
 * sub-layer's input, one op where the backend fuses the two. */
static int residual_norm(const struct model *m, struct backend_ctx *c, const struct forward_buf *b, float *h,
                         const struct tensor *post_norm, const struct tensor *w, const struct tensor *wb, int n) {
    const int E = m->hp.n_embd;
    int rc;
    if (m->desc->post_norms && (rc = norm(m, c, h, h, post_norm, &(struct tensor){ 0 }, n))) return rc;
    if (w && m->desc->norm == NORM_RMS && backend_supports(m->be, BACKEND_OP_ADD_RMSNORM, 0))
        return BE_OP(c, add_rmsnorm, b->xn, b->x, h, w, n, E, m->hp.norm_eps);
    if ((rc = BE_OP(c, add, b->x, h, (long)n * E))) return rc;
    return w ? norm(m, c, b->xn, b->x, w, wb, n) : 0;
}

int model_forward(const struct model *m, struct backend_ctx *c, const struct kv_layer_view *kv,
                  const struct forward_buf *b, const struct batch *bt) {
    const struct model_hparams *hp = &m->hp;
    const int n = bt->n_tokens, E = hp->n_embd;
    KV_ASSERT(n >= 1 && n <= b->n_max && bt->n_logits >= 0 && bt->n_logits <= b->n_logits_max);

    OP(get_rows, b->x, &m->tok_embd, bt->tokens, n);
    if (hp->embd_scale > 0) OP(scale, b->x, (long)n * E, hp->embd_scale);
    if (m->desc->pos == POS_LEARNED) {   /* positions were checked against n_ctx_train by the engine */
        OP(get_rows, b->xn, &m->pos_embd, bt->pos, n);
        OP(add, b->x, b->xn, (long)n * E);
    }
    /* each sub-layer's input norm is issued with the residual add before it (residual_norm) */
    int rc = norm(m, c, b->xn, b->x, &m->layers[0].attn_norm, &m->layers[0].attn_norm_b, n);
    for (int il = 0; !rc && il < hp->n_layer; il++) {
        const struct llama_layer *l = &m->layers[il], *next = il + 1 < hp->n_layer ? l + 1 : NULL;
        float *h = b->xn;
        if ((rc = attention(m, c, kv, b, bt, il)) ||
            (rc = residual_norm(m, c, b, b->xn, &l->attn_post_norm, &l->ffn_norm, &l->ffn_norm_b, n)) ||
            (rc = ffn(m, c, b, il, n, &h)))
            break;
        rc = residual_norm(m, c, b, h, &l->ffn_post_norm, next ? &next->attn_norm : NULL,
                           next ? &next->attn_norm_b : NULL, n);
    }
    if (rc || !bt->n_logits) return rc;
    /* gather the rows that need logits, then norm and head only for them */
    OP(gather_rows, b->q, b->x, bt->logit_rows, bt->n_logits, E);
    if ((rc = norm(m, c, b->xn, b->q, &m->output_norm, &m->output_norm_b, bt->n_logits))) return rc;
    OP(matmul, b->logits, &m->output, b->xn, bt->n_logits);   /* this rank's slice of the vocabulary */
    if (hp->final_softcap > 0) OP(softcap, b->logits, (long)bt->n_logits * m->output.ne1, hp->final_softcap);
    return comm_gather_cols(m->comm, c, b->logits, bt->n_logits, hp->n_vocab);
}
