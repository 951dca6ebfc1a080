/* shard.c — this rank's share of a model under tensor parallelism
 * (comm.h), as views of the tensors model.c found:
 *   query, key and value rows of its heads (n_head / N and n_head_kv / N:
 *   the KV pool of a rank holds only its heads), with their biases;
 *   the gate and up rows of its slice of the FFN (n_ff / N);
 *   the columns of the attention output and FFN down projections that
 *   meet those rows (each rank's product is a partial sum, which the
 *   forward all-reduces, biases added once after it);
 *   for a mixture of experts, the same cut inside every expert (its gate
 *   and up rows n_ff_exp / N, with their biases, and the down columns that
 *   meet them), the router whole: every rank has the whole residual stream
 *   after the all-reduce, so every rank routes each token to the same
 *   experts, runs its slice of each, and one all-reduce after the experts
 *   sums the slices as after a dense FFN.  An expert's down bias sits
 *   inside its routing weight's product, so rank 0 alone keeps it;
 *   the output head's rows of its vocabulary slice (the logits are
 *   gathered on rank 0);
 *   embeddings, positions and norms whole, on every rank.
 * Row slices point into the file's mapping; column slices are copied out
 * of it on block boundaries (a quantized block never straddles two ranks),
 * and the mapped pages read for them are given back, so each rank keeps
 * about 1/N of the weights resident.  The hyper-parameters become this
 * rank's (n_head, n_head_kv, n_ff, n_ff_exp); n_vocab and n_expert stay the
 * model's. */
#include "model/model.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct sharder {
    struct model *m;
    const char *path;
    int rank, n;
};

static void rows(struct tensor *t, int64_t r0, int64_t nr) {
    if (!t->data) return;
    t->data = tensor_row(t, r0);
    t->ne1 = nr;
}

static void elems(struct tensor *t, int64_t e0, int64_t ne) {
    if (!t->data) return;
    t->data = (const float *)t->data + e0;
    t->ne0 = ne;
    t->row_bytes = (size_t)ne * sizeof(float);
}

/* Whether columns c0 .. c0 + nc of t fall on quantization-block
 * boundaries; the reason when not. */
static int check_cut(const struct sharder *S, const struct tensor *t, const char *what, int il, int64_t c0,
                     int64_t nc) {
    const int bs = dtype_block_elems(t->type);
    if (c0 % bs == 0 && nc % bs == 0) return 0;
    LOG_ERR("%s: layer %d's %s (%s, blocks of %d) cannot be split over %d ranks: a rank's %lld columns would "
            "cut a quantized block", S->path, il, what, dtype_name(t->type), bs, S->n, (long long)nc);
    return KVLLM_EUNSUPPORTED;
}

/* n bytes the model owns until model_free (or model_shard_release); NULL
 * when out of memory. */
static uint8_t *own(struct model *m, size_t n) {
    void **list = realloc(m->shard_copies, (size_t)(m->n_shard_copies + 1) * sizeof *list);
    if (!list) return NULL;
    m->shard_copies = list;
    uint8_t *p = xmalloc(n ? n : 1);
    if (p) m->shard_copies[m->n_shard_copies++] = p;
    return p;
}

/* Bytes the columns c0 .. c0 + nc of t take (whole blocks: check_cut first). */
static size_t cut_bytes(const struct tensor *t, int64_t nc) {
    return (size_t)t->ne1 * (size_t)(nc / dtype_block_elems(t->type)) * dtype_block_bytes(t->type);
}

/* Columns c0 .. c0 + nc of every row of t copied to dst (cut_bytes of
 * them), t becoming that copy; the mapped pages read are given back. */
static void copy_cols(const struct model *m, struct tensor *t, int64_t c0, int64_t nc, uint8_t *dst) {
    const int bs = dtype_block_elems(t->type);
    const size_t bb = dtype_block_bytes(t->type), off = (size_t)(c0 / bs) * bb, nb = (size_t)(nc / bs) * bb;
    for (int64_t r = 0; r < t->ne1; r++) memcpy(dst + (size_t)r * nb, (const uint8_t *)tensor_row(t, r) + off, nb);
    model_release_mapped(m, t->data, (size_t)t->ne1 * t->row_bytes);
    t->data = dst;
    t->ne0 = nc;
    t->row_bytes = nb;
}

/* Columns c0 .. c0 + nc of every row, copied into memory the model owns
 * (nothing when t is absent). */
static int cols(struct sharder *S, struct tensor *t, const char *what, int il, int64_t c0, int64_t nc) {
    if (!t->data) return 0;
    int rc = check_cut(S, t, what, il, c0, nc);
    if (rc) return rc;
    uint8_t *p = own(S->m, cut_bytes(t, nc));
    if (!p) return KVLLM_ENOMEM;
    copy_cols(S->m, t, c0, nc, p);
    return 0;
}

/* Layer il's experts cut to this rank's f0 .. f0 + F of each one's hidden
 * width: gate and up rows (views), their biases' columns, and the down
 * projections' columns, copied into one allocation per layer (expert 0's
 * first: model_shard_release looks for it there). */
static int shard_experts(struct sharder *S, struct llama_layer *l, int il, int64_t f0, int64_t F) {
    const int ne = S->m->hp.n_expert;
    size_t total = 0;
    int rc;
    for (int e = 0; e < ne; e++) {   /* one by one: a file of per-expert tensors may mix types */
        if ((rc = check_cut(S, &l->exp_down[e], "ffn_down_exps", il, f0, F))) return rc;
        total += cut_bytes(&l->exp_down[e], F);
    }
    uint8_t *p = own(S->m, total);
    if (!p) return KVLLM_ENOMEM;
    for (int e = 0; e < ne; e++) {
        rows(&l->exp_gate[e], f0, F);
        rows(&l->exp_up[e], f0, F);
        const size_t nb = cut_bytes(&l->exp_down[e], F);
        copy_cols(S->m, &l->exp_down[e], f0, F, p);
        p += nb;
    }
    if ((rc = cols(S, &l->exp_gate_b, "ffn_gate_exps.bias", il, f0, F)) ||
        (rc = cols(S, &l->exp_up_b, "ffn_up_exps.bias", il, f0, F)))
        return rc;
    /* out += w * (down · act + down_b): the bias rides in rank 0's partial sum, so it is added once */
    if (S->rank) l->exp_down_b.data = NULL;
    return 0;
}

/* Whether the model's shape splits evenly over n ranks; the reason when not. */
static int check_shape(struct sharder *S) {
    const struct model_hparams *hp = &S->m->hp;
    const char *a = S->m->arch;
    if (hp->n_head_kv % S->n) {
        LOG_ERR("%s: %s.attention.head_count_kv %d is not divisible by %d ranks: each rank holds whole KV heads "
                "(run with a number of ranks that divides %d)", S->path, a, hp->n_head_kv, S->n, hp->n_head_kv);
        return KVLLM_EUNSUPPORTED;
    }
    if (hp->n_expert && hp->n_ff_exp % S->n) {
        LOG_ERR("%s: an expert's FFN width %d (%s.expert_feed_forward_length, or feed_forward_length) is not "
                "divisible by %d ranks: each rank holds the same slice of every expert", S->path, hp->n_ff_exp, a,
                S->n);
        return KVLLM_EUNSUPPORTED;
    }
    if (!hp->n_expert && hp->n_ff % S->n) {   /* a mixture's feed_forward_length sizes no tensor */
        LOG_ERR("%s: %s.feed_forward_length %d is not divisible by %d ranks", S->path, a, hp->n_ff, S->n);
        return KVLLM_EUNSUPPORTED;
    }
    if (hp->n_vocab < S->n) {
        LOG_ERR("%s: a vocabulary of %d cannot be split over %d ranks", S->path, hp->n_vocab, S->n);
        return KVLLM_EUNSUPPORTED;
    }
    return 0;
}

int model_shard(struct model *m, const char *path, int rank, int n) {
    if (n <= 1) return 0;
    struct sharder S = { .m = m, .path = path, .rank = rank, .n = n };
    int rc = check_shape(&S);
    if (rc) return rc;
    struct model_hparams *hp = &m->hp;
    const int64_t D = hp->head_dim, H = hp->n_head / n, HK = hp->n_head_kv / n;
    const int64_t F = hp->n_expert ? hp->n_ff_exp / n : hp->n_ff / n;   /* the dense FFN's or each expert's */
    const int64_t q0 = rank * H * D, k0 = rank * HK * D, f0 = rank * F;
    for (int il = 0; il < hp->n_layer; il++) {
        struct llama_layer *l = &m->layers[il];
        rows(&l->wq, q0, H * D);
        rows(&l->wk, k0, HK * D);
        rows(&l->wv, k0, HK * D);
        elems(&l->bq, q0, H * D);
        elems(&l->bk, k0, HK * D);
        elems(&l->bv, k0, HK * D);
        elems(&l->attn_sinks, rank * H, H);   /* one per query head */
        rows(&l->ffn_gate, f0, F);
        rows(&l->ffn_up, f0, F);
        elems(&l->ffn_up_b, f0, F);
        if ((rc = cols(&S, &l->wo, "attn_output", il, q0, H * D)) ||
            (rc = cols(&S, &l->ffn_down, "ffn_down", il, f0, F)) ||
            (l->exp_gate && (rc = shard_experts(&S, l, il, f0, F))))
            return rc;
    }
    int64_t v0, nv;
    comm_split(hp->n_vocab, n, rank, &v0, &nv);
    if (m->tied_output) {   /* the head is now a slice; the embedding stays whole for every token's lookup */
        m->output = m->tok_embd;
        m->tied_output = false;
    }
    rows(&m->output, v0, nv);
    hp->n_head = (int)H;
    hp->n_head_kv = (int)HK;
    if (hp->n_expert) hp->n_ff_exp = (int)F;
    else hp->n_ff = (int)F;
    m->tp_rank = rank;
    m->tp_size = n;
    LOG_INFO("%s: tensor-parallel rank %d of %d: %lld of the query heads, %lld of the KV heads, %lld of the %s "
             "width, vocabulary rows %lld .. %lld", path, rank, n, (long long)H, (long long)HK, (long long)F,
             hp->n_expert ? "experts'" : "FFN",
             (long long)v0, (long long)(v0 + nv));
    return 0;
}

/* Whether a placed tensor still reads the copy p (a backend that repacked
 * or copied the weights no longer does). */
static bool copy_in_use(const struct model *m, const void *p) {
    for (int il = 0; il < m->hp.n_layer; il++) {
        const struct llama_layer *l = &m->layers[il];
        if (l->wo.data == p || l->ffn_down.data == p || l->exp_gate_b.data == p || l->exp_up_b.data == p ||
            (l->exp_down && l->exp_down[0].data == p))   /* placed together: all the layer's experts or none */
            return true;
    }
    return false;
}

void model_shard_release(struct model *m) {
    for (int i = 0; i < m->n_shard_copies; i++)
        if (!copy_in_use(m, m->shard_copies[i])) { free(m->shard_copies[i]); m->shard_copies[i] = NULL; }
}
