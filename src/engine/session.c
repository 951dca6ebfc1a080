/* session.c — one sequence driven by hand (eval, chat, bench model) over a
 * private engine.  It takes the same path into the model as every request:
 * the sequence is queued with the scheduler, which allocates its blocks
 * and schedules its chunks, and the engine's step computes them; only the
 * output stage differs (logits are downloaded where the caller asked,
 * never sampled).  The pool holds one whole context, so the session's
 * sequence is never preempted. */
#include "engine/engine_internal.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

/* Rows of logits a session downloads per step at most (all_logits splits
 * its chunks to fit; batch invariance makes the chunking invisible). */
#define SESSION_LOGIT_ROWS 128

/* Positions a session may be truncated back (chat re-renders its last turn,
 * whose tokens may differ from those generated) without recomputing from
 * the start when a model's sliding-window layers keep only their window. */
#define SESSION_ROLLBACK 256

struct kvllm_session {
    struct kvllm_engine *e;
    struct request *r;      /* one sequence, never sampled */
    struct session_eval ev;
    bool no_kv_cache, queued;
    int32_t *shift_src, *shift_dst;   /* (n_ctx) each: kvllm_session_discard's moves (host) */
};

int kvllm_session_new(struct kvllm_model *km, const struct kvllm_session_params *p, struct kvllm_session **out) {
    *out = NULL;
    const struct model_hparams *hp = &km->m->hp;
    int n_ctx = p && p->n_ctx > 0 ? p->n_ctx : hp->n_ctx_train;
    if (n_ctx > (1 << 24)) {
        LOG_ERR("context of %d positions is beyond what kvllm supports (%d)", n_ctx, 1 << 24);
        return KVLLM_ERANGE;
    }
    struct kvllm_engine_params ep = p && p->engine ? *p->engine : kvllm_engine_default_params();
    if (ep.block_size <= 0) ep.block_size = kvllm_engine_default_params().block_size;
    if (ep.max_batch_tokens <= 0) ep.max_batch_tokens = 512;
    ep.n_ctx = n_ctx;
    if (p && p->kv_type) ep.kv_type = p->kv_type;
    /* the pool must hold the whole context of the one sequence */
    int min_tokens = (n_ctx + ep.block_size - 1) / ep.block_size * ep.block_size;
    uint64_t bpt = paged_kv_bytes_per_token(ep.kv_type && kv_type_parse(ep.kv_type) >= 0 ? kv_type_parse(ep.kv_type)
                                                                                            : KV_F16,
                                            hp->n_layer, hp->n_head_kv, hp->head_dim);
    if (ep.kv_mem && ep.kv_mem / bpt < (uint64_t)min_tokens) ep.kv_mem = 0;
    if (!ep.kv_mem && ep.kv_tokens < min_tokens) ep.kv_tokens = min_tokens;
    ep.max_seqs = 1;
    ep.max_queue = 1;
    if (p && p->max_batch > 0) ep.max_batch_tokens = p->max_batch;
    ep.prefix_caching = false;
    ep.no_kv_cache = false;
    ep.spec = KVLLM_SPEC_NONE;   /* a session samples nothing: there is nothing to draft */
    ep.draft_model = NULL;
    struct kvllm_session *s = xcalloc(1, sizeof *s);
    if (!s) return KVLLM_ENOMEM;
    s->no_kv_cache = p && p->no_kv_cache;
    int rows = ep.max_batch_tokens < SESSION_LOGIT_ROWS ? ep.max_batch_tokens : SESSION_LOGIT_ROWS;
    int rc = engine_new(km, &ep, rows, SESSION_ROLLBACK, &s->e);
    if (!rc && !(s->r = xcalloc(1, sizeof *s->r))) rc = KVLLM_ENOMEM;
    if (!rc && (!(s->shift_src = xmalloc((size_t)n_ctx * sizeof *s->shift_src)) ||
                !(s->shift_dst = xmalloc((size_t)n_ctx * sizeof *s->shift_dst))))
        rc = KVLLM_ENOMEM;
    if (!rc) {
        struct request *r = s->r;
        r->n = 1;
        r->eval = &s->ev;
        r->seqs = xcalloc(1, sizeof *r->seqs);
        r->ctx = xcalloc(1, sizeof *r->ctx);
        if (!r->seqs || !r->ctx || !(r->seqs[0] = seq_new(0, NULL, 0, n_ctx, ep.block_size))) rc = KVLLM_ENOMEM;
        else {
            r->ctx[0].req = r;
            r->seqs[0]->owner = &r->ctx[0];
            r->seqs[0]->n_reserved = 1;
        }
    }
    if (rc) { kvllm_session_free(s); return rc; }
    *out = s;
    return 0;
}

void kvllm_session_free(struct kvllm_session *s) {
    if (!s) return;
    if (s->queued) sched_finish(&s->e->sched, s->r->seqs[0]);
    engine_request_free(s->r);
    kvllm_engine_free(s->e);
    free(s->shift_src);
    free(s->shift_dst);
    free(s);
}

struct kvllm_engine *session_engine(struct kvllm_session *s) { return s->e; }

int kvllm_session_n_past(const struct kvllm_session *s) { return s->r->seqs[0]->n_tokens; }

/* The blocks past position pos are released (with a sliding-window pool,
 * all of them when pos is before the window still held: the next
 * evaluation recomputes from the start). */
void kvllm_session_truncate(struct kvllm_session *s, int pos) {
    struct seq *q = s->r->seqs[0];
    if (pos < 0 || pos >= q->n_tokens) return;
    sched_truncate(&s->e->sched, q, pos);
}

/* Context shift, in the manner of llama.cpp's: position p >= p1 moves to
 * p - (p1 - p0) within the sequence's own blocks (row by row, in order of
 * position, so a move never overwrites a row still to be read), its K rotated back by the
 * RoPE angle of the distance; then the blocks past the new end go back to
 * the pool.  Rows below p0 are never written, so a failed op leaves the
 * first p0 positions intact. */
int kvllm_session_discard(struct kvllm_session *s, int p0, int p1) {
    struct kvllm_engine *e = s->e;
    struct seq *q = s->r->seqs[0];
    const int n = q->n_tokens;
    if (p0 < 0 || p1 < p0 || p1 > n) {
        LOG_ERR("cannot discard positions %d .. %d of a session holding %d", p0, p1 - 1, n);
        return KVLLM_EINVAL;
    }
    if (p0 == p1) return 0;
    if (p1 == n) {   /* nothing after the range: a truncation, for any model */
        kvllm_session_truncate(s, p0);
        return 0;
    }
    struct rope_params rp;
    /* sliding layers hold their window only: the positions to move may be gone (the caller recomputes) */
    if (s->no_kv_cache || e->win_pool.n_blocks || e->km->m->comm || model_rope_params(e->km->m, &rp) ||
        !backend_supports(e->km->m->be, BACKEND_OP_KV_SHIFT, 0))
        return KVLLM_EUNSUPPORTED;
    KV_ASSERT(q->n_computed == n);   /* a session is idle between evaluations */
    const int delta = p1 - p0, bs = e->kv.block_size, n_move = n - p1;
    for (int i = 0; i < n_move; i++) {
        const int from = p1 + i, to = p0 + i;
        s->shift_src[i] = q->blocks[from / bs] * bs + from % bs;
        s->shift_dst[i] = q->blocks[to / bs] * bs + to % bs;
    }
    /* in position order, a move writes the slot of position p0 + i, which
     * no later move reads (they read positions p1 + j > p0 + i) */
    BE_OP(e->ctx, kv_shift, e->kv.layers, e->kv.n_layer, s->shift_src, s->shift_dst, n_move, -delta, &rp);
    int rc = backend_sync(e->ctx);
    if (rc) {
        kvllm_session_truncate(s, p0);
        return KVLLM_EBACKEND;
    }
    memmove(q->tokens + p0, q->tokens + p1, (size_t)n_move * sizeof *q->tokens);
    q->n_tokens = q->n_computed = n - delta;
    const int full = p0 / bs;   /* blocks before p0 are untouched: their hashes stand */
    if (q->n_hashed > full) q->n_hashed = full;
    if (q->n_published > full) q->n_published = full;
    sched_rewind(&e->sched, q, q->n_tokens);
    return 0;
}

int kvllm_session_eval(struct kvllm_session *s, const int32_t *tokens, int n, bool all_logits, float *logits) {
    struct kvllm_engine *e = s->e;
    struct seq *q = s->r->seqs[0];
    const int V = e->km->m->hp.n_vocab;
    if (n <= 0) return KVLLM_EINVAL;
    if (n > q->max_len - q->n_tokens) {
        LOG_ERR("%d more tokens do not fit: %d of %d context positions are used", n, q->n_tokens, q->max_len);
        return KVLLM_ERANGE;
    }
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V) {
            LOG_ERR("token id %d is out of range (vocabulary of %d)", tokens[i], V);
            return KVLLM_EINVAL;
        }
    const int first_new = q->n_tokens;
    memcpy(q->tokens + q->n_tokens, tokens, (size_t)n * sizeof *tokens);
    q->n_tokens += n;
    if (s->no_kv_cache) { /* nothing survives between calls: recompute the whole prefix */
        sched_rewind(&e->sched, q, 0);
    }
    if (!s->queued) {   /* queued once; it then stays running, idle between evaluations */
        int rc = sched_add(&e->sched, q);
        if (rc) { q->n_tokens = first_new; return rc; }
        s->queued = true;
    }
    s->ev = (struct session_eval){ .first = first_new, .all = all_logits, .dst = logits };
    /* all_logits: chunks no longer than the rows of logits a step downloads */
    const int budget = e->sched.cfg.max_batch_tokens;
    if (all_logits && logits && budget > e->n_logits_max) e->sched.cfg.max_batch_tokens = e->n_logits_max;
    while (q->n_computed < q->n_tokens && !s->r->failed) engine_step(e);
    e->sched.cfg.max_batch_tokens = budget;
    s->ev.dst = NULL;
    if (s->r->failed) {   /* the step's ops failed: the sequence was finished, its blocks released;
                             the session starts again empty */
        s->queued = false;
        s->r->failed = false;
        s->r->ctx[0].done = false;
        s->r->n_done = 0;
        q->n_tokens = 0;
        return KVLLM_EBACKEND;
    }
    return 0;
}
