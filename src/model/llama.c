/* llama.c — the Llama forward pass over a batch of tokens of one sequence:
 *   x = embed(tokens)
 *   per layer: x += Wo · attn(rope(Wq·norm(x)), rope(Wk·norm(x)), Wv·norm(x))
 *              x += Wdown · (silu(Wgate·norm(x)) * Wup·norm(x))
 *   logits = Wout · norm(x)
 * All kernels go through m->be; no arithmetic lives here. */
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t buf_floats(const struct model_hparams *hp, int n) {
    uint64_t q = (uint64_t)hp->n_head * hp->head_dim, kv = (uint64_t)hp->n_head_kv * hp->head_dim;
    return (uint64_t)n * (2 * (uint64_t)hp->n_embd + 2 * q + 2 * kv + 2 * (uint64_t)hp->n_ff);
}

uint64_t forward_buf_bytes(const struct model_hparams *hp, int n_max) {
    return buf_floats(hp, n_max) * sizeof(float) + (uint64_t)n_max * sizeof(int32_t);
}

int forward_buf_init(struct forward_buf *b, const struct model_hparams *hp, int n_max) {
    memset(b, 0, sizeof *b);
    float *slab = xmalloc((size_t)buf_floats(hp, n_max) * sizeof(float));
    b->pos = xmalloc((size_t)n_max * sizeof(int32_t));
    if (!slab || !b->pos) { free(slab); free(b->pos); b->pos = NULL; return KVLLM_ENOMEM; }
    const size_t n = (size_t)n_max, q = (size_t)hp->n_head * hp->head_dim, kv = (size_t)hp->n_head_kv * hp->head_dim;
    b->n_max = n_max;
    b->x = slab;                       /* (n, n_embd) residual stream */
    b->xn = b->x + n * hp->n_embd;     /* (n, n_embd) normed */
    b->q = b->xn + n * hp->n_embd;     /* (n, q) */
    b->att = b->q + n * q;             /* (n, q) attention output */
    b->k = b->att + n * q;             /* (n, kv) */
    b->v = b->k + n * kv;              /* (n, kv) */
    b->gate = b->v + n * kv;           /* (n, n_ff) */
    b->up = b->gate + n * hp->n_ff;    /* (n, n_ff) */
    return 0;
}

void forward_buf_deinit(struct forward_buf *b) {
    if (!b) return;
    free(b->x);
    free(b->pos);
    memset(b, 0, sizeof *b);
}

void model_forward(struct model *m, struct kv_cache *kv, struct forward_buf *b, const int32_t *tokens, int n,
                   int pos0, bool all_logits, float *logits) {
    const struct model_hparams *hp = &m->hp;
    const struct backend_ops *op = m->be->ops;
    struct backend *be = m->be;
    const int E = hp->n_embd, kvd = hp->n_head_kv * hp->head_dim;
    KV_ASSERT(n >= 1 && n <= b->n_max && pos0 >= 0 && pos0 + n <= kv->n_ctx);

    for (int i = 0; i < n; i++) b->pos[i] = pos0 + i;
    op->get_rows(be, b->x, &m->tok_embd, tokens, n);

    for (int il = 0; il < hp->n_layer; il++) {
        const struct llama_layer *l = &m->layers[il];
        op->rmsnorm(be, b->xn, b->x, l->attn_norm.data, n, E, hp->norm_eps);
        op->matmul(be, b->q, &l->wq, b->xn, n);
        op->matmul(be, b->k, &l->wk, b->xn, n);
        op->matmul(be, b->v, &l->wv, b->xn, n);
        op->rope(be, b->q, n, hp->n_head, hp->head_dim, hp->n_rot, b->pos, hp->rope_theta);
        op->rope(be, b->k, n, hp->n_head_kv, hp->head_dim, hp->n_rot, b->pos, hp->rope_theta);
        /* append this batch's K/V, then attend causally over the whole cache */
        memcpy(kv_cache_k(kv, il) + (size_t)pos0 * kvd, b->k, (size_t)n * kvd * sizeof(float));
        memcpy(kv_cache_v(kv, il) + (size_t)pos0 * kvd, b->v, (size_t)n * kvd * sizeof(float));
        struct attn_args a = {
            .n_tokens = n, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
            .q = b->q, .k = kv_cache_k(kv, il), .v = kv_cache_v(kv, il), .pos = b->pos,
            .scale = 1.0f / sqrtf((float)hp->head_dim), .out = b->att,
        };
        op->attention(be, &a);
        op->matmul(be, b->xn, &l->wo, b->att, n);
        op->add(be, b->x, b->xn, (long)n * E);

        op->rmsnorm(be, b->xn, b->x, l->ffn_norm.data, n, E, hp->norm_eps);
        op->matmul(be, b->gate, &l->ffn_gate, b->xn, n);
        op->matmul(be, b->up, &l->ffn_up, b->xn, n);
        op->swiglu(be, b->gate, b->up, (long)n * hp->n_ff);
        op->matmul(be, b->xn, &l->ffn_down, b->gate, n);
        op->add(be, b->x, b->xn, (long)n * E);
    }
    if (!logits) return;
    /* only the rows whose logits are wanted go through the head */
    const int first = all_logits ? 0 : n - 1;
    op->rmsnorm(be, b->xn, b->x + (size_t)first * E, m->output_norm.data, n - first, E, hp->norm_eps);
    op->matmul(be, logits, &m->output, b->xn, n - first);
}
