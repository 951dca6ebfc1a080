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
 * block table.  All arithmetic is ops issued on the caller's execution
 * context; this file never touches weight or activation memory itself. */
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t act_floats(const struct model_hparams *hp, int n, int n_logits) {
    uint64_t q = (uint64_t)hp->n_head * hp->head_dim, kv = (uint64_t)hp->n_head_kv * hp->head_dim;
    return (uint64_t)n * (2 * (uint64_t)hp->n_embd + 2 * q + 2 * kv + 2 * (uint64_t)hp->n_ff) +
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
    const size_t n = (size_t)n_max, q = (size_t)hp->n_head * hp->head_dim, kv = (size_t)hp->n_head_kv * hp->head_dim;
    b->be = be;
    b->n_max = n_max;
    b->n_logits_max = n_logits_max;
    b->x = b->mem.data;                /* (n, n_embd) residual stream */
    b->xn = b->x + n * hp->n_embd;     /* (n, n_embd) normed / projected back */
    b->q = b->xn + n * hp->n_embd;     /* (n, q) */
    b->att = b->q + n * q;             /* (n, q) attention output */
    b->k = b->att + n * q;             /* (n, kv) */
    b->v = b->k + n * kv;              /* (n, kv) */
    b->gate = b->v + n * kv;           /* (n, n_ff) */
    b->up = b->gate + n * hp->n_ff;    /* (n, n_ff) */
    b->logits = b->up + n * hp->n_ff;  /* (n_logits_max, n_vocab) */
    return 0;
}

void forward_buf_deinit(struct forward_buf *b) {
    if (!b) return;
    if (b->be) b->be->ops->buf_free(b->be, &b->mem);
    memset(b, 0, sizeof *b);
}

/* Issue an op; return its error from the enclosing function. */
#define OP(op, ...) do { int rc_ = BE_OP(c, op, __VA_ARGS__); if (rc_) return rc_; } while (0)

/* y = norm(x) over n rows: LayerNorm with bias or RMSNorm, as the architecture says. */
static int norm(const struct model *m, struct backend_ctx *c, float *y, const float *x, const struct tensor *w,
                const struct tensor *b, int n) {
    if (m->layer_norm)
        return BE_OP(c, layernorm, y, x, w, b->data ? b : NULL, n, m->hp.n_embd, m->hp.norm_eps);
    return BE_OP(c, rmsnorm, y, x, w, n, m->hp.n_embd, m->hp.norm_eps);
}

/* y (n, b->ne0) += b, when the bias is present. */
static int bias(struct backend_ctx *c, float *y, const struct tensor *b, int n) {
    return b->data ? BE_OP(c, add_bias, y, b, n, (int)b->ne0) : 0;
}

int model_forward(const struct model *m, struct backend_ctx *c, const struct kv_layer_view *kv,
                  const struct forward_buf *b, const struct batch *bt) {
    const struct model_hparams *hp = &m->hp;
    const int n = bt->n_tokens, E = hp->n_embd;
    KV_ASSERT(n >= 1 && n <= b->n_max && bt->n_logits >= 0 && bt->n_logits <= b->n_logits_max);
    struct rope_params rp;
    model_rope_params(m, &rp);   /* unused for learned positions */

    OP(get_rows, b->x, &m->tok_embd, bt->tokens, n);
    if (m->learned_pos) {   /* positions were checked against n_ctx_train by the engine; get_rows checks again */
        OP(get_rows, b->xn, &m->pos_embd, bt->pos, n);
        OP(add, b->x, b->xn, (long)n * E);
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const struct llama_layer *l = &m->layers[il];
        int rc;
        if ((rc = norm(m, c, b->xn, b->x, &l->attn_norm, &l->attn_norm_b, n))) return rc;
        OP(matmul, b->q, &l->wq, b->xn, n);
        OP(matmul, b->k, &l->wk, b->xn, n);
        OP(matmul, b->v, &l->wv, b->xn, n);
        if ((rc = bias(c, b->q, &l->bq, n)) || (rc = bias(c, b->k, &l->bk, n)) || (rc = bias(c, b->v, &l->bv, n)))
            return rc;
        if (!m->learned_pos) {
            OP(rope, b->q, n, hp->n_head, hp->head_dim, bt->pos, &rp);
            OP(rope, b->k, n, hp->n_head_kv, hp->head_dim, bt->pos, &rp);
        }
        /* store this batch's K/V first: a prefill chunk attends to itself */
        OP(kv_store, &kv[il], bt->slots, b->k, b->v, n);
        struct paged_attn_args a = {
            .n_tokens = n, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
            .q = b->q, .pos = bt->pos, .seq = bt->seq, .block_table = bt->block_table, .max_blocks = bt->max_blocks,
            .kv = kv[il], .scale = 1.0f / sqrtf((float)hp->head_dim), .window = hp->n_swa, .out = b->att,
        };
        OP(paged_attention, &a);
        OP(matmul, b->xn, &l->wo, b->att, n);
        if ((rc = bias(c, b->xn, &l->bo, n))) return rc;
        OP(add, b->x, b->xn, (long)n * E);

        if ((rc = norm(m, c, b->xn, b->x, &l->ffn_norm, &l->ffn_norm_b, n))) return rc;
        OP(matmul, b->up, &l->ffn_up, b->xn, n);
        if ((rc = bias(c, b->up, &l->ffn_up_b, n))) return rc;
        if (m->gated_ffn) {
            OP(matmul, b->gate, &l->ffn_gate, b->xn, n);
            OP(swiglu, b->gate, b->up, (long)n * hp->n_ff);
        } else {
            OP(gelu, b->up, (long)n * hp->n_ff);
        }
        OP(matmul, b->xn, &l->ffn_down, m->gated_ffn ? b->gate : b->up, n);
        if ((rc = bias(c, b->xn, &l->ffn_down_b, n))) return rc;
        OP(add, b->x, b->xn, (long)n * E);
    }
    if (!bt->n_logits) return 0;
    /* gather the rows that need logits, then norm and head only for them */
    OP(gather_rows, b->q, b->x, bt->logit_rows, bt->n_logits, E);
    int rc = norm(m, c, b->xn, b->q, &m->output_norm, &m->output_norm_b, bt->n_logits);
    if (rc) return rc;
    OP(matmul, b->logits, &m->output, b->xn, bt->n_logits);
    return 0;
}
