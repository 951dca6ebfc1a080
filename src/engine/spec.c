/* spec.c — speculative decoding: drafts proposed before a step, verified
 * after it.
 *
 * Model of the world.  A sequence in decode (n_computed == n_tokens - 1)
 * gets up to k draft tokens appended to its tokens (seq.n_spec of them);
 * the scheduler computes its last token and the drafts in one chunk, and
 * every one of those rows yields logits.  Verification walks the rows in
 * order through the ordinary per-token output path (output_on_logits:
 * sample with the request's own sampler and RNG, append, detokenize, stops,
 * events): while the token sampled at position i equals draft i, draft i
 * was right and row i + 1 is valid too; the first mismatch (or the row
 * after the last draft) gives the token sampled there, and verification
 * stops.  Then sched_spec_resolve keeps the K/V of the accepted positions
 * and releases the blocks that held only rejected ones.
 *
 * Why this is exact.  Every kernel is batch-invariant, so row i's logits
 * are bit-identical to those a one-token decode step would compute for
 * that position with the same prefix; the sampler is called once per
 * emitted token, in the same order, with the same history, so it draws the
 * same random numbers.  The output is identical token for token to
 * decoding without speculation — greedy or sampled.  In the terms of
 * speculative sampling (Leviathan et al., Chen et al.) both drafters
 * propose a point mass q = δ(draft): the standard rule "accept with
 * min(1, p/q), on rejection sample from normalize(max(0, p - q))" becomes
 * "accept with probability p(draft), else sample from p without the
 * draft", which is exactly "sample from p and keep the draft when they
 * agree": the target distribution is untouched.
 *
 * Drafters.  Prompt lookup (KVLLM_SPEC_NGRAM): the sequence's last n
 * tokens (n from spec_ngram_max down to spec_ngram_min) are searched in its
 * own earlier context, latest occurrence first, and the tokens that
 * followed are the drafts — nearly free, and right whenever the output
 * copies its input.  A draft model (KVLLM_SPEC_DRAFT): a private engine
 * over the draft model with its own paged KV pool holds a shadow of every
 * sample; before each step a shadow is brought in line with its sequence
 * (truncated to their common prefix, which rolls back rejected drafts,
 * then extended), and k steps of the draft engine, batched over all
 * speculating shadows, each append the draft model's argmax.
 *
 * Not speculated: sessions (they sample nothing), no_kv_cache engines,
 * constrained requests (a grammar),
 * prompts still being computed, and requests too close to their token
 * limit.  Memory: the draft engine, the participant list and each
 * request's shadows are allocated at creation / kvllm_engine_add, never in
 * a step. */
#include "engine/engine_internal.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

#define SPEC_DEFAULT_TOKENS 5
#define SPEC_MAX_TOKENS 64

int spec_init(struct kvllm_engine *e) {
    struct kvllm_engine_params *p = &e->p;
    if (p->spec == KVLLM_SPEC_NONE) return 0;
    if (p->spec != KVLLM_SPEC_NGRAM && p->spec != KVLLM_SPEC_DRAFT) {
        LOG_ERR("unknown speculation method %d", (int)p->spec);
        return KVLLM_EINVAL;
    }
    if (p->spec_tokens <= 0) p->spec_tokens = SPEC_DEFAULT_TOKENS;
    if (p->spec_ngram_min <= 0) p->spec_ngram_min = 1;
    if (p->spec_ngram_max <= 0) p->spec_ngram_max = p->spec_ngram_min > 3 ? p->spec_ngram_min : 3;
    if (p->spec_tokens > SPEC_MAX_TOKENS || p->spec_ngram_max > SPEC_MAX_TOKENS ||
        p->spec_ngram_min > p->spec_ngram_max) {
        LOG_ERR("speculation: %d draft tokens (at most %d), n-grams %d..%d out of range", p->spec_tokens,
                SPEC_MAX_TOKENS, p->spec_ngram_min, p->spec_ngram_max);
        return KVLLM_EINVAL;
    }
    if (p->spec_tokens + 1 > p->max_batch_tokens) p->spec_tokens = p->max_batch_tokens - 1;
    if (p->no_kv_cache) {   /* the baseline recomputes everything anyway: nothing to gain */
        LOG_WARN("speculative decoding is off with --no-kv-cache");
        p->spec = KVLLM_SPEC_NONE;
        return 0;
    }
    if (p->spec == KVLLM_SPEC_DRAFT) {
        const struct kvllm_model *d = p->draft_model;
        if (!d) {
            LOG_ERR("speculation with a draft model needs one (--draft-model)");
            return KVLLM_EINVAL;
        }
        if (d->m->hp.n_vocab != e->km->m->hp.n_vocab ||
            (d->tok && e->km->tok && tokenizer_eos(d->tok) != tokenizer_eos(e->km->tok))) {
            LOG_ERR("draft model %s has a vocabulary of %d (eos %d), the model %s %d (eos %d): they must be the "
                    "same", d->path, d->m->hp.n_vocab, d->tok ? tokenizer_eos(d->tok) : -1, e->km->path,
                    e->km->m->hp.n_vocab, e->km->tok ? tokenizer_eos(e->km->tok) : -1);
            return KVLLM_EINVAL;
        }
    }
    /* every speculating sequence wants logits for its last token and each draft */
    const int rows = p->max_seqs * (1 + p->spec_tokens);
    if (e->n_logits_max < rows) e->n_logits_max = rows < p->max_batch_tokens ? rows : p->max_batch_tokens;
    if (e->n_logits_max < p->max_seqs) e->n_logits_max = p->max_seqs;
    return 0;
}

/* The draft engine: the target's context, sequences, batch and KV type,
 * a pool of as many positions as the target's (so it never runs dry
 * first), no prefix cache (shadows are truncated in place). */
int spec_start(struct kvllm_engine *e) {
    if (e->p.spec != KVLLM_SPEC_DRAFT) return 0;
    struct kvllm_engine_params dp = e->p;
    dp.spec = KVLLM_SPEC_NONE;
    dp.draft_model = NULL;
    dp.prefix_caching = false;
    dp.no_kv_cache = false;
    dp.kv_mem = 0;
    dp.kv_tokens = e->pool.n_blocks * e->pool.block_size;
    dp.max_queue = 2 * dp.max_seqs;   /* shadows of running and of preempted sequences */
    /* a shadow goes back over the drafts it proposed and one more position (shadow_sync) */
    int rc = engine_new(e->p.draft_model, &dp, 0, e->p.spec_tokens + 1, &e->draft);
    if (rc) {
        LOG_ERR("the draft model's engine could not be made (%s)", kvllm_strerror(rc));
        return rc;
    }
    e->spec_part = xmalloc((size_t)e->p.max_seqs * sizeof *e->spec_part);
    e->spec_room = xmalloc((size_t)e->p.max_seqs * sizeof *e->spec_room);
    return e->spec_part && e->spec_room ? 0 : KVLLM_ENOMEM;
}

void spec_deinit(struct kvllm_engine *e) {
    kvllm_engine_free(e->draft);
    e->draft = NULL;
    free(e->spec_part);
    free(e->spec_room);
    e->spec_part = NULL;
    e->spec_room = NULL;
}

/* A shadow: one sequence, never sampled; its last row's logits land in eval->dst. */
static int shadow_new(struct kvllm_engine *de, int max_len, struct request **out) {
    const size_t V = (size_t)de->km->m->hp.n_vocab;
    struct request *r = xcalloc(1, sizeof *r);
    if (!r) return KVLLM_ENOMEM;
    r->n = 1;
    r->seqs = xcalloc(1, sizeof *r->seqs);
    r->ctx = xcalloc(1, sizeof *r->ctx);
    /* the eval record and its logits row in one allocation, owned by the request (own_eval) */
    struct session_eval *ev = xcalloc(1, sizeof *ev + V * sizeof(float));
    if (!r->seqs || !r->ctx || !ev || !(r->seqs[0] = seq_new(0, NULL, 0, max_len, de->p.block_size))) {
        free(ev);
        engine_request_free(r);
        return KVLLM_ENOMEM;
    }
    ev->dst = (float *)(ev + 1);
    r->eval = ev;
    r->own_eval = true;
    r->ctx[0].req = r;
    r->seqs[0]->owner = &r->ctx[0];
    r->seqs[0]->n_reserved = 1;
    *out = r;
    return 0;
}

int spec_request_init(struct kvllm_engine *e, struct request *r) {
    if (e->p.spec != KVLLM_SPEC_DRAFT || !e->draft) return 0;
    for (int i = 0; i < r->n; i++) {
        int rc = shadow_new(e->draft, r->seqs[i]->max_len, &r->ctx[i].shadow);
        if (rc) return rc;
    }
    return 0;
}

/* Drafts q may take: the generated tokens left after the one always
 * sampled, the room in its token array, and k. */
static int draft_room(const struct kvllm_engine *e, const struct seq *q) {
    const struct seq_ctx *c = q->owner;
    const struct request *r = c->req;
    if (r->eval || c->done || r->aborted || q->status != SEQ_RUNNING) return 0;
    /* a constrained request does not speculate: verification would be exact (it goes through the
     * grammar's mask and matcher token by token), but drafts rarely survive a grammar and it is untested */
    if (r->grammar) return 0;
    if (q->n_spec || q->n_computed != q->n_tokens - 1) return 0;   /* only in decode */
    int k = e->p.spec_tokens;
    int left = r->max_tokens - c->n_generated - 1;
    if (left < k) k = left;
    if (q->max_len - q->n_tokens - 1 < k) k = q->max_len - q->n_tokens - 1;
    return k > 0 ? k : 0;
}

/* Prompt lookup: the tokens after the latest earlier occurrence of the last
 * n-gram of t[0, n), the longest n-gram tried first; at most k to out.
 * Returns how many. */
static int ngram_lookup(const int32_t *t, int n, int g_min, int g_max, int k, int32_t *out) {
    for (int g = g_max; g >= g_min; g--) {
        if (n < g + 1) continue;
        const int32_t *suf = t + n - g;
        for (int j = n - g - 1; j >= 0; j--) {
            if (t[j] != suf[0] || memcmp(t + j, suf, (size_t)g * sizeof *t) != 0) continue;
            int m = n - (j + g);   /* >= 1: the occurrence ends before the suffix does */
            if (m > k) m = k;
            memcpy(out, t + j + g, (size_t)m * sizeof *t);
            return m;
        }
    }
    return 0;
}

static void propose_ngram(struct kvllm_engine *e) {
    for (int i = 0; i < e->sched.n_running; i++) {
        struct seq *q = e->sched.running[i];
        int k = draft_room(e, q);
        if (!k) continue;
        int m = ngram_lookup(q->tokens, q->n_tokens, e->p.spec_ngram_min, e->p.spec_ngram_max, k,
                             q->tokens + q->n_tokens);
        q->n_tokens += m;
        q->n_spec = m;
    }
}

/* Greedy pick: highest logit, lowest id on ties (the sampler's greedy rule). */
static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Bring shadow sh in line with q: keep their common prefix, append the rest. */
static bool shadow_sync(struct kvllm_engine *de, struct request *sh, const struct seq *q) {
    struct seq *ds = sh->seqs[0];
    if (ds->status == SEQ_FINISHED && sh->shadow_of) return false;   /* a failed draft step ended it */
    int L = 0;
    while (L < ds->n_tokens && L < q->n_tokens && ds->tokens[L] == q->tokens[L]) L++;
    if (sh->shadow_of) sched_truncate(&de->sched, ds, L);
    else ds->n_tokens = L;
    memcpy(ds->tokens + L, q->tokens + L, (size_t)(q->n_tokens - L) * sizeof *q->tokens);
    ds->n_tokens = q->n_tokens;
    /* all of it computed already (its last token was a draft of ours): compute that again for its logits */
    if (ds->n_computed == ds->n_tokens) sched_rewind(&de->sched, ds, ds->n_computed - 1);
    if (!sh->shadow_of) {
        if (sched_add(&de->sched, ds) != 0) return false;   /* the draft queue is full: try next step */
        sh->shadow_of = de;
    }
    return true;
}

static void propose_draft(struct kvllm_engine *e) {
    struct kvllm_engine *de = e->draft;
    const int V = de->km->m->hp.n_vocab;
    int n_part = 0, k_most = 0;
    struct seq **part = e->spec_part;   /* the sequences drafting this step, spec_room[i] drafts each at most */
    for (int i = 0; i < e->sched.n_running; i++) {
        struct seq *q = e->sched.running[i];
        int k = draft_room(e, q);
        if (!k || !shadow_sync(de, ((struct seq_ctx *)q->owner)->shadow, q)) continue;
        e->spec_room[n_part] = k;
        part[n_part++] = q;
        if (k > k_most) k_most = k;
    }
    for (int step = 0; step < k_most && n_part; step++) {
        engine_step(de);
        int live = 0;
        for (int i = 0; i < n_part; i++) {
            struct seq *q = part[i];
            struct request *sh = ((struct seq_ctx *)q->owner)->shadow;
            struct seq *ds = sh->seqs[0];
            if (q->n_spec >= e->spec_room[i]) continue;
            if (ds->status != SEQ_RUNNING || ds->n_computed != ds->n_tokens) {   /* not caught up: stop here */
                e->spec_room[i] = q->n_spec;
                continue;
            }
            int32_t d = argmax(sh->eval->dst, V);
            ds->tokens[ds->n_tokens++] = d;
            q->tokens[q->n_tokens++] = d;
            q->n_spec++;
            live += q->n_spec < e->spec_room[i];
        }
        if (!live) break;
    }
}

void spec_propose(struct kvllm_engine *e) {
    if (e->p.spec == KVLLM_SPEC_NGRAM) propose_ngram(e);
    else if (e->p.spec == KVLLM_SPEC_DRAFT) propose_draft(e);
}

int spec_verify(struct kvllm_engine *e, struct seq *q, float *const *rows, const int32_t *ids) {
    struct seq_ctx *c = q->owner;
    const int k = q->n_spec;
    const int base = q->n_tokens - k;   /* tokens[base, base + k) are the drafts */
    int j = 0;                          /* drafts accepted */
    int judged = k;                     /* drafts compared: those after the sequence's end are moot */
    q->n_tokens = base;
    for (int i = 0; i <= k; i++) {
        const int32_t d = i < k ? q->tokens[base + i] : -1;
        /* samples position base + i (or takes the backend's greedy pick), appends it, emits */
        if (ids) output_on_token(e, q, ids[i]);
        else output_on_logits(e, q, rows[i]);
        if (c->done || c->req->aborted) { judged = i; break; }
        if (i == k || q->tokens[q->n_tokens - 1] != d) break;
        j++;
    }
    e->st.spec_drafted += (uint64_t)judged;
    e->st.spec_accepted += (uint64_t)j;
    e->st.spec_verifies++;
    e->st.spec_accept_hist[j < 16 ? j : 16]++;
    /* positions up to base + j - 1 were computed from kept tokens; the rest are rolled back */
    sched_spec_resolve(&e->sched, q, base + j);
    return k + 1;
}
