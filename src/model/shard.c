/* shard.c — this rank's share of a model under tensor parallelism
 * (comm.h), as views of the tensors model.c found:
 *   query, key and value rows of its heads (n_head / N and n_head_kv / N:
 *   the KV pool of a rank holds only its heads), with their biases;
 *   the gate and up rows of its slice of the FFN (n_ff / N);
 *   the columns of the attention output and FFN down projections that
 *   meet those rows (each rank's product is a partial sum, which the
 *   forward all-reduces, biases added once after it);
 *   the output head's rows of its vocabulary slice (the logits are
 *   gathered on rank 0);
 *   embeddings, positions and norms whole, on every rank.
 * Row slices point into the file's mapping; column slices are copied out
 * of it on block boundaries (a quantized block never straddles two ranks),
 * and the mapped pages read for them are given back, so each rank keeps
 * about 1/N of the weights resident.  The hyper-parameters become this
 * rank's (n_head, n_head_kv, n_ff); n_vocab stays the model's. */
#include "model/model.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/* Give back the mapped pages of [p, p + n) that were read to copy a slice
 * out: a private read-only file mapping refaults them from the page cache
 * if anything reads them again, so this never loses data. */
static void release_mapped(const struct model *m, const void *p, size_t n) {
    const uint8_t *lo = m->file->map.data, *a = p;
    if (!lo || a < lo || a + n > lo + m->file->map.size) return;   /* not the file's mapping: owned memory */
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t b = ((uintptr_t)a + pg - 1) & ~(pg - 1), e = ((uintptr_t)a + n) & ~(pg - 1);
    if (e > b) madvise((void *)b, e - b, MADV_DONTNEED);
}

/* Columns c0 .. c0 + nc of every row, copied into memory the model owns. */
static int cols(struct sharder *S, struct tensor *t, const char *what, int il, int64_t c0, int64_t nc) {
    const int bs = dtype_block_elems(t->type);
    if (c0 % bs || nc % bs) {
        LOG_ERR("%s: layer %d's %s (%s, blocks of %d) cannot be split over %d ranks: a rank's %lld columns would "
                "cut a quantized block", S->path, il, what, dtype_name(t->type), bs, S->n, (long long)nc);
        return KVLLM_EUNSUPPORTED;
    }
    const size_t bb = dtype_block_bytes(t->type), off = (size_t)(c0 / bs) * bb, nb = (size_t)(nc / bs) * bb;
    struct model *m = S->m;
    uint8_t *p = xmalloc((size_t)t->ne1 * nb);
    void **list = realloc(m->shard_copies, (size_t)(m->n_shard_copies + 1) * sizeof *list);
    if (list) m->shard_copies = list;
    if (!p || !list) { free(p); return KVLLM_ENOMEM; }
    m->shard_copies[m->n_shard_copies++] = p;
    for (int64_t r = 0; r < t->ne1; r++) memcpy(p + (size_t)r * nb, (const uint8_t *)tensor_row(t, r) + off, nb);
    release_mapped(m, t->data, (size_t)t->ne1 * t->row_bytes);
    t->data = p;
    t->ne0 = nc;
    t->row_bytes = nb;
    return 0;
}

/* Whether the model's shape splits evenly over n ranks; the reason when not. */
static int check_shape(struct sharder *S) {
    const struct model_hparams *hp = &S->m->hp;
    const char *a = S->m->arch;
    if (hp->n_expert) {
        LOG_ERR("%s: a mixture-of-experts model (%s.expert_count %d) is not split over ranks yet: run it with one "
                "rank", S->path, a, hp->n_expert);
        return KVLLM_EUNSUPPORTED;
    }
    if (hp->n_head_kv % S->n) {
        LOG_ERR("%s: %s.attention.head_count_kv %d is not divisible by %d ranks: each rank holds whole KV heads "
                "(run with a number of ranks that divides %d)", S->path, a, hp->n_head_kv, S->n, hp->n_head_kv);
        return KVLLM_EUNSUPPORTED;
    }
    if (hp->n_ff % S->n) {
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
    const int64_t D = hp->head_dim, H = hp->n_head / n, HK = hp->n_head_kv / n, F = hp->n_ff / n;
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
            (rc = cols(&S, &l->ffn_down, "ffn_down", il, f0, F)))
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
    hp->n_ff = (int)F;
    m->tp_rank = rank;
    m->tp_size = n;
    LOG_INFO("%s: tensor-parallel rank %d of %d: %lld of the query heads, %lld of the KV heads, %lld of the FFN "
             "width, vocabulary rows %lld .. %lld", path, rank, n, (long long)H, (long long)HK, (long long)F,
             (long long)v0, (long long)(v0 + nv));
    return 0;
}

void model_shard_release(struct model *m) {
    /* a backend that repacked a copied slice no longer reads the copy */
    for (int i = 0; i < m->n_shard_copies; i++) {
        bool used = false;
        for (int il = 0; il < m->hp.n_layer && !used; il++)
            used = m->layers[il].wo.data == m->shard_copies[i] || m->layers[il].ffn_down.data == m->shard_copies[i];
        if (!used) { free(m->shard_copies[i]); m->shard_copies[i] = NULL; }
    }
}
