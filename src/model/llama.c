/* llama.c — the decoder forward pass over a batch of tokens from any number
 * of sequences, for every architecture model.c loads (Llama, Mistral, Qwen2,
 * GPT-2), with per-architecture switches rather than one copy per model:
 *   x = embed(tokens)                       (+ position_embd[pos]: GPT-2)
 *   per layer: x += Wo · attn(rope(Wq·norm(x) + bq), rope(Wk·norm(x) + bk), Wv·norm(x) + bv) + bo
 *              x += Wdown · (silu(Wgate·norm(x)) * Wup·norm(x))          (Llama, Qwen2)
 *                or Wdown · gelu(Wup·norm(x) + bup) + bdown              (GPT-2)
 *   logits = Wout · norm(x)   (only for the rows that need them)
 * norm is RMSNorm, or LayerNorm with bias (GPT-2); rope rotates adjacent
 * pairs (GGUF llama) or halves (Qwen2), optionally with Llama 3 frequency
 * factors; no RoPE with learned positions; absent biases are skipped;
 * attention may be limited to a sliding window (Mistral).
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

/* y = norm(x) over n rows: LayerNorm with bias or RMSNorm, as the architecture says. */
static void norm(const struct model *m, float *y, const float *x, const struct tensor *w, const struct tensor *b,
                 int n) {
    if (m->layer_norm)
        m->be->ops->layernorm(m->be, y, x, w->data, b->data, n, m->hp.n_embd, m->hp.norm_eps);
    else
        m->be->ops->rmsnorm(m->be, y, x, w->data, n, m->hp.n_embd, m->hp.norm_eps);
}

/* y (n, b->ne0) += b, when the bias is present. */
static void bias(const struct model *m, float *y, const struct tensor *b, int n) {
    if (b->data) m->be->ops->add_bias(m->be, y, b->data, n, (int)b->ne0);
}

void model_forward(struct model *m, const struct kv_layer_view *kv, struct forward_buf *b, const struct batch *bt,
                   float *logits) {
    const struct model_hparams *hp = &m->hp;
    const struct backend_ops *op = m->be->ops;
    struct backend *be = m->be;
    const int n = bt->n_tokens, E = hp->n_embd;
    KV_ASSERT(n >= 1 && n <= b->n_max);
    const struct rope_params rp = {
        .n_rot = hp->n_rot, .theta = hp->rope_theta, .freq_scale = hp->rope_freq_scale,
        .freq_factors = m->rope_freqs.data, .neox = m->rope_neox,
    };

    op->get_rows(be, b->x, &m->tok_embd, bt->tokens, n);
    if (m->learned_pos) {
        for (int i = 0; i < n; i++) KV_ASSERT(bt->pos[i] >= 0 && bt->pos[i] < m->pos_embd.ne1);
        op->get_rows(be, b->xn, &m->pos_embd, bt->pos, n);
        op->add(be, b->x, b->xn, (long)n * E);
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const struct llama_layer *l = &m->layers[il];
        norm(m, b->xn, b->x, &l->attn_norm, &l->attn_norm_b, n);
        op->matmul(be, b->q, &l->wq, b->xn, n);
        op->matmul(be, b->k, &l->wk, b->xn, n);
        op->matmul(be, b->v, &l->wv, b->xn, n);
        bias(m, b->q, &l->bq, n);
        bias(m, b->k, &l->bk, n);
        bias(m, b->v, &l->bv, n);
        if (!m->learned_pos) {
            op->rope_ext(be, b->q, n, hp->n_head, hp->head_dim, bt->pos, &rp);
            op->rope_ext(be, b->k, n, hp->n_head_kv, hp->head_dim, bt->pos, &rp);
        }
        /* store this batch's K/V first: a prefill chunk attends to itself */
        op->kv_store(be, &kv[il], bt->slots, b->k, b->v, n);
        struct paged_attn_args a = {
            .n_tokens = n, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
            .q = b->q, .pos = bt->pos, .tables = bt->tables, .kv = kv[il],
            .scale = 1.0f / sqrtf((float)hp->head_dim), .window = hp->n_swa, .out = b->att, .partials = b->partials,
        };
        op->paged_attention(be, &a);
        op->matmul(be, b->xn, &l->wo, b->att, n);
        bias(m, b->xn, &l->bo, n);
        op->add(be, b->x, b->xn, (long)n * E);

        norm(m, b->xn, b->x, &l->ffn_norm, &l->ffn_norm_b, n);
        op->matmul(be, b->up, &l->ffn_up, b->xn, n);
        bias(m, b->up, &l->ffn_up_b, n);
        if (m->gated_ffn) {
            op->matmul(be, b->gate, &l->ffn_gate, b->xn, n);
            op->swiglu(be, b->gate, b->up, (long)n * hp->n_ff);
        } else {
            op->gelu(be, b->up, (long)n * hp->n_ff);
        }
        op->matmul(be, b->xn, &l->ffn_down, m->gated_ffn ? b->gate : b->up, n);
        bias(m, b->xn, &l->ffn_down_b, n);
        op->add(be, b->x, b->xn, (long)n * E);
    }
    if (!bt->n_logits) return;
    /* gather the rows that need logits, then norm and head only for them */
    for (int i = 0; i < bt->n_logits; i++) {
        KV_ASSERT(bt->logit_rows[i] >= 0 && bt->logit_rows[i] < n);
        memmove(b->q + (size_t)i * E, b->x + (size_t)bt->logit_rows[i] * E, (size_t)E * sizeof(float));
    }
    norm(m, b->xn, b->q, &m->output_norm, &m->output_norm_b, bt->n_logits);
    op->matmul(be, logits, &m->output, b->xn, bt->n_logits);
}
