/* llama.c — the Llama forward pass over a batch of tokens from any number
 * of sequences:
 *   x = embed(tokens)
 *   per layer: x += Wo · attn(rope(Wq·norm(x)), rope(Wk·norm(x)), Wv·norm(x))
 *              x += Wdown · (silu(Wgate·norm(x)) * Wup·norm(x))
 *   logits = Wout · norm(x)   (only for the rows that need them)
 * Matrix products run over all rows at once (prefill chunks and decode
 * tokens alike); attention reads each token's own sequence through its
 * block table.  All arithmetic goes through m->be. */
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t act_floats(const struct model_hparams *hp, int n) {
    uint64_t q = (uint64_t)hp->n_head * hp->head_dim, kv = (uint64_t)hp->n_head_kv * hp->head_dim;
    return (uint64_t)n * (2 * (uint64_t)hp->n_embd + 2 * q + 2 * kv + 2 * (uint64_t)hp->n_ff);
}

uint64_t forward_buf_bytes(const struct model_hparams *hp, int n_max, int max_ctx) {
    return (act_floats(hp, n_max) + paged_attn_scratch_floats(n_max, hp->n_head, hp->head_dim, max_ctx)) *
           sizeof(float);
}

int forward_buf_init(struct forward_buf *b, const struct model_hparams *hp, int n_max, int max_ctx) {
    memset(b, 0, sizeof *b);
    uint64_t bytes = forward_buf_bytes(hp, n_max, max_ctx);
    if (bytes > SIZE_MAX / 2) return KVLLM_ERANGE;
    float *slab = xmalloc((size_t)bytes);
    if (!slab) return KVLLM_ENOMEM;
    const size_t n = (size_t)n_max, q = (size_t)hp->n_head * hp->head_dim, kv = (size_t)hp->n_head_kv * hp->head_dim;
    b->n_max = n_max;
    b->max_ctx = max_ctx;
    b->x = slab;                       /* (n, n_embd) residual stream */
    b->xn = b->x + n * hp->n_embd;     /* (n, n_embd) normed / projected back */
    b->q = b->xn + n * hp->n_embd;     /* (n, q) */
    b->att = b->q + n * q;             /* (n, q) attention output */
    b->k = b->att + n * q;             /* (n, kv) */
    b->v = b->k + n * kv;              /* (n, kv) */
    b->gate = b->v + n * kv;           /* (n, n_ff) */
    b->up = b->gate + n * hp->n_ff;    /* (n, n_ff) */
    b->partials = b->up + n * hp->n_ff;
    return 0;
}

void forward_buf_deinit(struct forward_buf *b) {
    if (!b) return;
    free(b->x);
    memset(b, 0, sizeof *b);
}

void model_forward(struct model *m, const struct kv_layer_view *kv, struct forward_buf *b, const struct batch *bt,
                   float *logits) {
    const struct model_hparams *hp = &m->hp;
    const struct backend_ops *op = m->be->ops;
    struct backend *be = m->be;
    const int n = bt->n_tokens, E = hp->n_embd;
    KV_ASSERT(n >= 1 && n <= b->n_max);

    op->get_rows(be, b->x, &m->tok_embd, bt->tokens, n);
    for (int il = 0; il < hp->n_layer; il++) {
        const struct llama_layer *l = &m->layers[il];
        op->rmsnorm(be, b->xn, b->x, l->attn_norm.data, n, E, hp->norm_eps);
        op->matmul(be, b->q, &l->wq, b->xn, n);
        op->matmul(be, b->k, &l->wk, b->xn, n);
        op->matmul(be, b->v, &l->wv, b->xn, n);
        op->rope(be, b->q, n, hp->n_head, hp->head_dim, hp->n_rot, bt->pos, hp->rope_theta);
        op->rope(be, b->k, n, hp->n_head_kv, hp->head_dim, hp->n_rot, bt->pos, hp->rope_theta);
        /* store this batch's K/V first: a prefill chunk attends to itself */
        op->kv_store(be, &kv[il], bt->slots, b->k, b->v, n);
        struct paged_attn_args a = {
            .n_tokens = n, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
            .q = b->q, .pos = bt->pos, .tables = bt->tables, .kv = kv[il],
            .scale = 1.0f / sqrtf((float)hp->head_dim), .out = b->att, .partials = b->partials,
        };
        op->paged_attention(be, &a);
        op->matmul(be, b->xn, &l->wo, b->att, n);
        op->add(be, b->x, b->xn, (long)n * E);

        op->rmsnorm(be, b->xn, b->x, l->ffn_norm.data, n, E, hp->norm_eps);
        op->matmul(be, b->gate, &l->ffn_gate, b->xn, n);
        op->matmul(be, b->up, &l->ffn_up, b->xn, n);
        op->swiglu(be, b->gate, b->up, (long)n * hp->n_ff);
        op->matmul(be, b->xn, &l->ffn_down, b->gate, n);
        op->add(be, b->x, b->xn, (long)n * E);
    }
    if (!bt->n_logits) return;
    /* gather the rows that need logits, then norm and head only for them */
    for (int i = 0; i < bt->n_logits; i++) {
        KV_ASSERT(bt->logit_rows[i] >= 0 && bt->logit_rows[i] < n);
        memmove(b->q + (size_t)i * E, b->x + (size_t)bt->logit_rows[i] * E, (size_t)E * sizeof(float));
    }
    op->rmsnorm(be, b->xn, b->q, m->output_norm.data, bt->n_logits, E, hp->norm_eps);
    op->matmul(be, logits, &m->output, b->xn, bt->n_logits);
}
