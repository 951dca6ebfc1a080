/* step.c — a step as one transaction with the backend: the step's inputs
 * packed into host staging memory the backend owns (step_layout.h: laid
 * out as the backend buffer they go to) and uploaded in one copy; the
 * forward issued as a recorded op list (graph.h) replayed, or captured by
 * a backend that can (a CUDA graph); the outputs downloaded in one copy by
 * issue_batch (engine.c).
 *
 * Recorded forwards.  The ops model_forward issues depend on the step's
 * shape alone: its token count, its logits count and the width of its
 * block-table rows (which place the packed arrays).  The engine keeps
 * STEP_GRAPHS recorded lists keyed on that shape, least recently used
 * replaced; the step's longest context (paged attention's ctx_hi) is passed
 * at each replay, never taken from the recording.  A backend that runs the
 * list itself (graph_compute) bakes ctx_hi into what it makes, so for it
 * ctx_hi is rounded up to a power of two and made part of the key (ctx_hi
 * sizes a GPU's grid, never a token's arithmetic), and small batches are
 * padded to its captured sizes (cuda_plan.h: a padded token copies the
 * step's first token but has slot -1, so it stores nothing and reads only
 * what that token reads, and asks no logits); larger steps run eagerly.
 *
 * Eager: with enforce_eager, or under tensor parallelism (the forward's
 * all-reduce is a host collective between ops, which no recording holds),
 * the forward issues its ops directly, as it always did.  A recording that
 * fails (it cannot: the capacity is counted at creation) falls back to
 * eager, logged. */
#include "engine/engine_internal.h"
#include "backend/cuda/cuda_plan.h"
#include "backend/step_layout.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

void *engine_host_alloc(struct backend *be, size_t bytes) {
    if (be->ops->host_alloc) return be->ops->host_alloc(be, bytes);
    return aligned_alloc(64, bytes ? (bytes + 63) & ~(size_t)63 : 64);
}

void engine_host_free(struct backend *be, void *p) {
    if (!p) return;
    if (be->ops->host_free) be->ops->host_free(be, p);
    else free(p);
}

/* A batch of n tokens and nl logits rows whose arrays lie in backend buffer d as l places them. */
static struct batch batch_at(const char *d, const struct step_layout *l, int n, int nl, int ctx_hi) {
    return (struct batch){ .n_tokens = n, .tokens = (const int32_t *)(d + l->tok), .pos = (const int32_t *)(d + l->pos),
                           .slots = (const int32_t *)(d + l->slot), .seq = (const int32_t *)(d + l->seq),
                           .block_table = (const int32_t *)(d + l->table), .max_blocks = l->stride,
                           .win_slots = l->win ? (const int32_t *)(d + l->win_slot) : NULL,
                           .win_block_table = l->win ? (const int32_t *)(d + l->win_table) : NULL,
                           .n_logits = nl, .logit_rows = (const int32_t *)(d + l->rows), .ctx_hi = ctx_hi };
}

/* Record a forward of one token and one logits row to count the records a forward takes. */
static int count_records(struct kvllm_engine *e, const struct step_layout *l) {
    struct step_inputs *in = &e->in;
    struct graph probe;
    graph_init(&probe, 0);
    const struct batch bt = batch_at(in->buf.data, l, 1, 1, 0);
    graph_record_begin(&in->rec, &probe);
    int rc = graph_record_end(&in->rec, model_forward(e->km->m, &in->rec.base, e->kv_layers, &e->fb, &bt));
    const int n = probe.n;
    graph_deinit(&probe);
    return rc == 0 || rc == KVLLM_ERANGE ? n : rc;   /* ERANGE: a capacity of 0, as asked */
}

int step_init(struct kvllm_engine *e) {
    struct step_inputs *in = &e->in;
    struct backend *be = e->km->m->be;
    const size_t nb = (size_t)e->p.max_batch_tokens, nl = (size_t)e->n_logits_max;
    in->max_blocks = (e->n_ctx + e->p.block_size - 1) / e->p.block_size;
    in->has_win = e->win_pool.n_blocks > 0;
    const size_t n_win = in->has_win;
    struct step_layout l;
    int rc = step_layout(e->p.max_batch_tokens, e->n_logits_max, e->p.max_seqs, in->max_blocks, in->has_win, &l);
    if (rc) return rc;
    /* after the packed inputs, in both: the chains of the rows the backend samples (their own upload) */
    const size_t smp_at = (l.bytes + STEP_ALIGN - 1) / STEP_ALIGN * STEP_ALIGN;
    const size_t bytes = smp_at + nl * sizeof(struct sample_chain);
    if ((rc = be->ops->buf_alloc(be, bytes, &in->buf))) return rc;
    if (!(in->stage = engine_host_alloc(be, bytes))) return KVLLM_ENOMEM;
    in->cap = l.bytes;
    in->d_smp = (struct sample_chain *)((char *)in->buf.data + smp_at);
    in->h_smp = (struct sample_chain *)((char *)in->stage + smp_at);
    /* the sample op's scratch: one row's candidates at a time */
    if (backend_supports(be, BACKEND_OP_SAMPLE, 0) &&
        (rc = be->ops->buf_alloc(be, SAMPLE_CHAIN_SCRATCH(e->km->m->hp.n_vocab), &in->smp_scratch)))
        return rc;
    /* issue_batch's arrays, from which the step message is packed */
    if (!(in->h = xmalloc(((5 + n_win) * nb) * sizeof *in->h))) return KVLLM_ENOMEM;
    in->h_tok = in->h;
    in->h_pos = in->h_tok + nb;
    in->h_slot = in->h_pos + nb;
    in->h_seq = in->h_slot + nb;
    in->h_rows = in->h_seq + nb;
    in->h_win_slot = n_win ? in->h_rows + nb : NULL;
    /* the step message (engine_run_step): 6 counts, 5 (6) arrays of a token each, the logits rows, the
     * block copies of both pools, and per sequence its block count and table row(s) */
    e->cap_msg = 6 + (5 + n_win) * nb + nl + 4 * (size_t)e->p.max_seqs +
                 (size_t)e->p.max_seqs * (1 + (1 + n_win) * (size_t)in->max_blocks);
    if (!(e->step_msg = xmalloc(e->cap_msg * sizeof *e->step_msg))) return KVLLM_ENOMEM;

    const struct comm *cm = e->km->m->comm;
    in->use_graphs = !e->p.enforce_eager && !(cm && cm->size > 1);
    if (!in->use_graphs) return 0;
    in->pad = e->ctx->ops->graph_compute != NULL;
    graph_recorder_init(&in->rec, e->ctx);
    const int cap = count_records(e, &l);
    if (cap <= 0) {
        LOG_WARN("the forward cannot be recorded (%s): every step runs its ops eagerly",
                 cap < 0 ? kvllm_strerror(cap) : "no ops");
        in->use_graphs = false;
        return 0;
    }
    for (int i = 0; i < STEP_GRAPHS; i++)
        if ((rc = graph_init(&in->graphs[i].g, cap))) return rc;
    LOG_INFO("steps: the forward recorded once per step shape (%d ops, %d shapes kept) and %s", cap, STEP_GRAPHS,
             in->pad ? "captured by the backend (small steps padded to its sizes; larger ones eager)"
                     : "replayed op by op");
    return 0;
}

void step_deinit(struct kvllm_engine *e) {
    struct step_inputs *in = &e->in;
    struct backend *be = e->km->m->be;
    for (int i = 0; i < STEP_GRAPHS; i++) graph_deinit(&in->graphs[i].g);
    free(in->h);
    free(e->step_msg);
    engine_host_free(be, in->stage);
    be->ops->buf_free(be, &in->buf);
    be->ops->buf_free(be, &in->smp_scratch);
}

/* The smallest power of two >= v (>= 1), capped at hi. */
static int pow2_at_least(int v, int hi) {
    int p = 1;
    while (p < v && p <= hi / 2) p *= 2;
    return p < v || p > hi ? hi : p;
}

/* The recorded forward of the step's shape (recorded now when the cache has none), run on the
 * engine's context.  A recording that fails runs the forward eagerly. */
static int forward_graph(struct kvllm_engine *e, const struct batch *bt, int ctx_key, int ctx_hi) {
    struct step_inputs *in = &e->in;
    struct step_graph *hit = NULL, *lru = &in->graphs[0];
    for (int i = 0; i < STEP_GRAPHS && !hit; i++) {
        struct step_graph *s = &in->graphs[i];
        if (s->valid && s->n_tokens == bt->n_tokens && s->n_logits == bt->n_logits &&
            s->stride == bt->max_blocks && s->ctx_key == ctx_key)
            hit = s;
        else if (s->tick < lru->tick)
            lru = s;
    }
    if (!hit) {
        hit = lru;
        graph_record_begin(&in->rec, &hit->g);
        int rc = graph_record_end(&in->rec, model_forward(e->km->m, &in->rec.base, e->kv_layers, &e->fb, bt));
        hit->valid = rc == 0;
        if (rc) {
            LOG_WARN("a step of %d tokens could not be recorded (%s): it runs eagerly", bt->n_tokens,
                     kvllm_strerror(rc));
            return model_forward(e->km->m, e->ctx, e->kv_layers, &e->fb, bt);
        }
        hit->n_tokens = bt->n_tokens;
        hit->n_logits = bt->n_logits;
        hit->stride = bt->max_blocks;
        hit->ctx_key = ctx_key;
        in->n_recorded++;
    }
    hit->tick = ++in->tick;
    in->n_replayed++;
    return graph_compute(e->ctx, &hit->g, ctx_hi);
}

/* Copy n int32 from src to dst, then fill the next n_pad with v. */
static void put(int32_t *dst, const int32_t *src, int n, int n_pad, int32_t v) {
    if (n > 0) memcpy(dst, src, (size_t)n * sizeof *dst);
    for (int i = 0; i < n_pad; i++) dst[n + i] = v;
}

int engine_run_step(struct kvllm_engine *e, const int32_t *msg, int n_words) {
    struct step_inputs *in = &e->in;
    struct backend_ctx *c = e->ctx;
    const int32_t *w = msg;
    const int k = w[0], nl = w[1], ns = w[2], nc = w[3], nwc = w[4], has_win = w[5];
    KV_ASSERT(k >= 1 && k <= e->p.max_batch_tokens && nl >= 0 && nl <= e->n_logits_max && ns >= 1 &&
              ns <= e->p.max_seqs && ns <= k && nc <= e->p.max_seqs && nwc <= e->p.max_seqs &&
              has_win == in->has_win);
    w += 6;
    const int32_t *tok = w, *pos = tok + k, *slot = pos + k, *seq = slot + k;
    const int32_t *win_slot = has_win ? seq + k : NULL, *rows = seq + k + (has_win ? k : 0);
    const int32_t *copies = rows + nl, *win_copies = copies + 2 * nc;
    const int32_t *tables = win_copies + 2 * nwc;
    int max_nb = 1;
    w = tables;
    for (int i = 0; i < ns; i++) {
        const int nb = *w++;
        KV_ASSERT(nb >= 0 && nb <= in->max_blocks);
        max_nb = nb > max_nb ? nb : max_nb;
        w += (1 + has_win) * nb;
    }
    KV_ASSERT(w - msg == n_words);
    int rc = 0;
    if (nc) rc = BE_OP(c, copy_blocks, e->kv.layers, e->kv.n_layer, (const int32_t(*)[2])copies, nc);
    if (!rc && nwc) rc = BE_OP(c, copy_blocks, e->kv_win.layers, e->kv_win.n_layer, (const int32_t(*)[2])win_copies, nwc);

    /* the step's shape: a backend that captures pads small batches to its captured sizes */
    const int pad_hi = e->p.max_seqs < e->p.max_batch_tokens ? e->p.max_seqs : e->p.max_batch_tokens;
    const bool graph = in->use_graphs && (!in->pad || k <= pad_hi);
    const int kp = graph && in->pad ? cuda_graph_batch(k, pad_hi) : k;
    const int stride = pow2_at_least(max_nb, in->max_blocks);
    struct step_layout l;
    rc = rc ? rc : step_layout(kp, nl, kp < e->p.max_seqs ? kp : e->p.max_seqs, stride, has_win, &l);
    if (rc) return rc;
    KV_ASSERT(l.bytes <= in->cap);

    /* pack: a padded token is a copy of the first, storing nothing (slot -1): it reads only what the
     * first token reads (never a block a window already released) */
    char *h = in->stage;
    put((int32_t *)(h + l.tok), tok, k, kp - k, tok[0]);
    put((int32_t *)(h + l.pos), pos, k, kp - k, pos[0]);
    put((int32_t *)(h + l.slot), slot, k, kp - k, -1);
    put((int32_t *)(h + l.seq), seq, k, kp - k, seq[0]);
    if (has_win) put((int32_t *)(h + l.win_slot), win_slot, k, kp - k, -1);
    put((int32_t *)(h + l.rows), rows, nl, 0, 0);
    w = tables;
    for (int i = 0; i < ns; i++) {   /* the rest of a row is never read: -1, so the upload is deterministic */
        const int nb = *w++;
        put((int32_t *)(h + l.table) + (size_t)i * stride, w, nb, stride - nb, -1);
        w += nb;
        if (!has_win) continue;
        put((int32_t *)(h + l.win_table) + (size_t)i * stride, w, nb, stride - nb, -1);
        w += nb;
    }
    if (!rc) rc = c->ops->upload(c, in->buf.data, in->stage, step_layout_used(&l, ns));   /* the one upload */

    int ctx_hi = 0;
    for (int i = 0; i < k; i++) ctx_hi = pos[i] + 1 > ctx_hi ? pos[i] + 1 : ctx_hi;
    const struct batch bt = batch_at(in->buf.data, &l, kp, nl, ctx_hi);
    if (!rc && !graph) rc = model_forward(e->km->m, c, e->kv_layers, &e->fb, &bt);
    if (!rc && graph) {
        /* what the backend bakes into its capture is part of the key; a replay takes the exact value */
        const int ctx_key = in->pad ? pow2_at_least(ctx_hi > CUDA_ATTN_PART ? ctx_hi : CUDA_ATTN_PART, e->n_ctx) : 0;
        rc = forward_graph(e, &bt, ctx_key, in->pad ? ctx_key : ctx_hi);
    }
    /* a rank that leaves the step early leaves the others waiting in a collective: the job is over */
    if (rc && e->km->m->comm) comm_fail(e->km->m->comm, "a step's ops failed");
    return rc;
}
