/* engine.c — the step loop: requests in, one batched forward pass per step,
 * tokens out through callbacks.  The engine thread owns the model, the KV
 * pool and the scheduler; kvllm_engine_add/abort only touch the inbox under
 * its mutex, so a server can call them from any thread.
 *
 * Memory: the KV pool, activation buffers and per-step arrays are sized at
 * creation; a request's sequences, samplers and detokenizers are allocated
 * by kvllm_engine_add (on the caller's thread), never inside a step. */
#include "engine/engine_internal.h"
#include "core/core.h"
#include "kv/block_pool.h"
#include "kv/paged_kv.h"
#include "sched/scheduler.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- requests ---- */

struct seq_ctx {
    struct request *req;
    int index;
    struct kvllm_sampler *smp;
    struct detok detok;
    bool has_detok;
    char *held;             /* text withheld while it may begin a stop string */
    size_t n_held, cap_held;
    int n_generated;
    bool done;
};

struct request {
    uint64_t id;
    kvllm_event_fn on_event;
    void *user;
    int n, n_done, max_tokens;
    bool ignore_eos, aborted, forked, queued;
    char **stop;
    int n_stop;
    struct seq **seqs;      /* (n): seqs[0] runs the prompt, the others fork from it */
    struct seq_ctx *ctx;    /* (n) */
    int n_cached;
    struct request *next;   /* inbox or live list */
};

struct kvllm_engine {
    struct kvllm_model *km;
    struct kvllm_engine_params p;
    int n_ctx;
    struct block_pool pool;
    struct paged_kv kv;
    struct sched sched;
    struct sched_batch sb;
    struct forward_buf fb;
    int32_t *tok, *pos, *slot, *logit_rows;    /* (max_batch_tokens) */
    const int32_t **tables;                    /* (max_batch_tokens) */
    struct seq **logit_seqs;                   /* (max_seqs) */
    float *logits;                             /* (max_seqs, n_vocab) */
    char *text;                                /* event text scratch */
    const float *cur_logits;                   /* row being sampled, for events */
    size_t cap_text;

    pthread_mutex_t mu;                        /* guards the three fields below */
    struct request *inbox, **inbox_tail;
    uint64_t *aborts;
    int n_aborts, cap_aborts, n_queued;
    uint64_t next_id;

    struct request *live;                      /* engine thread only */
    struct kvllm_engine_stats st;
};

struct kvllm_engine_params kvllm_engine_default_params(void) {
    return (struct kvllm_engine_params){
        .n_ctx = 0, .kv_mem = 0, .kv_tokens = 0, .kv_type = "f16", .block_size = 16,
        .max_seqs = 32, .max_batch_tokens = 512, .max_queue = 1024, .prefix_caching = true,
    };
}

static void request_free(struct request *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) {
        if (r->ctx) {
            kvllm_sampler_free(r->ctx[i].smp);
            if (r->ctx[i].has_detok) detok_deinit(&r->ctx[i].detok);
            free(r->ctx[i].held);
        }
        if (r->seqs) seq_free(r->seqs[i]);
    }
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->seqs);
    free(r->ctx);
    free(r);
}

/* ---- creation: the memory plan ---- */

static int plan_pool(struct kvllm_engine *e, enum kv_type kt) {
    const struct model_hparams *hp = &e->km->m->hp;
    const uint64_t bpt = paged_kv_bytes_per_token(kt, hp->n_layer, hp->n_head_kv, hp->head_dim);
    const uint64_t avail = mem_available_bytes();
    uint64_t tokens;
    if (e->p.kv_mem) tokens = e->p.kv_mem / bpt;
    else if (e->p.kv_tokens > 0) tokens = (uint64_t)e->p.kv_tokens;
    else {
        tokens = (uint64_t)e->p.max_seqs * (uint64_t)e->n_ctx;
        if (avail && tokens * bpt > avail / 2) tokens = avail / 2 / bpt;
    }
    /* a byte budget rounds down; a token count rounds up to whole blocks */
    uint64_t n_blocks = e->p.kv_mem ? tokens / (uint64_t)e->p.block_size
                                    : (tokens + (uint64_t)e->p.block_size - 1) / (uint64_t)e->p.block_size;
    uint64_t bytes = n_blocks * (uint64_t)e->p.block_size * bpt;
    if (n_blocks < 1 || n_blocks > (1u << 30)) {
        LOG_ERR("a KV pool of %llu tokens (%llu blocks of %d) is not usable", (unsigned long long)tokens,
                (unsigned long long)n_blocks, e->p.block_size);
        return KVLLM_ERANGE;
    }
    if (avail && bytes > avail) {
        LOG_ERR("the KV pool needs %.1f MiB (%llu tokens x %llu bytes, %s) but the machine has %.1f MiB available; "
                "lower --kv-mem / --kv-tokens / -c", (double)bytes / 1048576.0, (unsigned long long)tokens,
                (unsigned long long)bpt, kv_type_name(kt), (double)avail / 1048576.0);
        return KVLLM_ERANGE;
    }
    int rc = paged_kv_init(&e->kv, kt, hp->n_layer, (int)n_blocks, e->p.block_size, hp->n_head_kv, hp->head_dim);
    if (!rc) rc = block_pool_init(&e->pool, (int)n_blocks, e->p.block_size);
    if (rc) return rc;
    uint64_t act = forward_buf_bytes(hp, e->p.max_batch_tokens, e->n_ctx) +
                   (uint64_t)e->p.max_seqs * (uint64_t)hp->n_vocab * sizeof(float);
    LOG_INFO("memory plan: weights %.1f MiB (mapped), activations %.1f MiB, KV pool %.1f MiB: %llu blocks x %d "
             "tokens = %llu tokens of %s (%llu bytes each), %.1f sequences of full context (%d)",
             (double)e->km->m->weight_bytes / 1048576.0, (double)act / 1048576.0, (double)bytes / 1048576.0,
             (unsigned long long)n_blocks, e->p.block_size, (unsigned long long)(n_blocks * e->p.block_size),
             kv_type_name(kt), (unsigned long long)bpt, (double)(n_blocks * e->p.block_size) / e->n_ctx, e->n_ctx);
    return 0;
}

int kvllm_engine_new(struct kvllm_model *km, const struct kvllm_engine_params *params, struct kvllm_engine **out) {
    *out = NULL;
    struct kvllm_engine_params p = params ? *params : kvllm_engine_default_params();
    struct kvllm_engine_params d = kvllm_engine_default_params();
    if (!p.kv_type) p.kv_type = d.kv_type;
    if (p.block_size <= 0) p.block_size = d.block_size;
    if (p.max_seqs <= 0) p.max_seqs = d.max_seqs;
    if (p.max_batch_tokens <= 0) p.max_batch_tokens = d.max_batch_tokens;
    if (p.max_queue <= 0) p.max_queue = d.max_queue;
    int kt = kv_type_parse(p.kv_type);
    if (kt < 0) {
        LOG_ERR("unknown KV type '%s' (f32, f16, bf16, int8, fp8)", p.kv_type);
        return KVLLM_EINVAL;
    }
    if (p.block_size > 4096 || p.max_seqs > 65536 || p.max_batch_tokens > (1 << 20)) {
        LOG_ERR("block size %d, max seqs %d or max batch tokens %d out of range", p.block_size, p.max_seqs,
                p.max_batch_tokens);
        return KVLLM_EINVAL;
    }
    const struct model_hparams *hp = &km->m->hp;
    const int n_ctx = p.n_ctx > 0 ? p.n_ctx : hp->n_ctx_train;
    int rc = model_check_ctx(km->m, n_ctx);  /* e.g. learned positions end at n_ctx_train */
    if (rc) return rc;
    struct kvllm_engine *e = xcalloc(1, sizeof *e);
    if (!e) return KVLLM_ENOMEM;
    e->km = km;
    e->p = p;
    e->n_ctx = n_ctx;
    pthread_mutex_init(&e->mu, NULL);
    e->inbox_tail = &e->inbox;
    e->next_id = 1;
    struct sched_config sc = { .max_seqs = p.max_seqs, .max_batch_tokens = p.max_batch_tokens,
                               .max_waiting = p.max_queue, .prefix_caching = p.prefix_caching && !p.no_kv_cache,
                               .no_kv_cache = p.no_kv_cache };
    const size_t nb = (size_t)p.max_batch_tokens;
    rc = plan_pool(e, (enum kv_type)kt);
    if (!rc) rc = sched_init(&e->sched, &e->pool, &sc);
    if (!rc) rc = sched_batch_init(&e->sb, p.max_seqs);
    if (!rc) rc = forward_buf_init(&e->fb, hp, p.max_batch_tokens, e->n_ctx);
    if (!rc) {
        e->tok = xmalloc(nb * sizeof *e->tok);
        e->pos = xmalloc(nb * sizeof *e->pos);
        e->slot = xmalloc(nb * sizeof *e->slot);
        e->logit_rows = xmalloc(nb * sizeof *e->logit_rows);
        e->tables = xmalloc(nb * sizeof *e->tables);
        e->logit_seqs = xmalloc((size_t)p.max_seqs * sizeof *e->logit_seqs);
        e->logits = xmalloc((size_t)p.max_seqs * (size_t)hp->n_vocab * sizeof *e->logits);
        e->cap_text = 4096;
        e->text = xmalloc(e->cap_text);
        if (!e->tok || !e->pos || !e->slot || !e->logit_rows || !e->tables || !e->logit_seqs || !e->logits ||
            !e->text)
            rc = KVLLM_ENOMEM;
    }
    if (rc) { kvllm_engine_free(e); return rc; }
    *out = e;
    return 0;
}

void kvllm_engine_free(struct kvllm_engine *e) {
    if (!e) return;
    for (struct request *r = e->live, *n; r; r = n) { n = r->next; request_free(r); }
    for (struct request *r = e->inbox, *n; r; r = n) { n = r->next; request_free(r); }
    free(e->aborts);
    free(e->tok);
    free(e->pos);
    free(e->slot);
    free(e->logit_rows);
    free(e->tables);
    free(e->logit_seqs);
    free(e->logits);
    free(e->text);
    forward_buf_deinit(&e->fb);
    sched_batch_deinit(&e->sb);
    sched_deinit(&e->sched);
    block_pool_deinit(&e->pool);
    paged_kv_deinit(&e->kv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* ---- submission (any thread) ---- */

static int build_request(struct kvllm_engine *e, const struct kvllm_request *q, struct request **out) {
    const struct kvllm_model *km = e->km;
    const int V = km->m->hp.n_vocab;
    if (q->n_prompt < 1 || !q->prompt || q->n < 1 || q->n_stop < 0 || (q->n_stop && !q->stop)) {
        LOG_ERR("invalid request: %d prompt tokens, n = %d", q->n_prompt, q->n);
        return KVLLM_EINVAL;
    }
    for (int i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= V) {
            LOG_ERR("prompt token %d at index %d is out of range (vocabulary of %d)", q->prompt[i], i, V);
            return KVLLM_EINVAL;
        }
    if (q->n_stop && !km->tok) {
        LOG_ERR("stop strings need a vocabulary; the model has none");
        return KVLLM_EINVAL;
    }
    if (q->n_prompt >= e->n_ctx || (q->max_tokens > 0 && (int64_t)q->n_prompt + q->max_tokens > e->n_ctx)) {
        LOG_ERR("prompt (%d tokens) + max_tokens %d exceed the context of %d positions", q->n_prompt,
                q->max_tokens > 0 ? q->max_tokens : 1, e->n_ctx);
        return KVLLM_ERANGE;
    }
    int max_len = q->max_tokens > 0 ? q->n_prompt + q->max_tokens : e->n_ctx;
    int rc = sched_check_fits(&e->sched, max_len, q->n);
    if (rc) return rc;
    struct request *r = xcalloc(1, sizeof *r);
    if (!r) return KVLLM_ENOMEM;
    r->on_event = q->on_event;
    r->user = q->user;
    r->n = q->n;
    r->max_tokens = max_len - q->n_prompt;
    r->ignore_eos = q->ignore_eos;
    r->seqs = xcalloc((size_t)q->n, sizeof *r->seqs);
    r->ctx = xcalloc((size_t)q->n, sizeof *r->ctx);
    r->stop = q->n_stop ? xcalloc((size_t)q->n_stop, sizeof *r->stop) : NULL;
    rc = r->seqs && r->ctx && (r->stop || !q->n_stop) ? 0 : KVLLM_ENOMEM;
    for (int i = 0; !rc && i < q->n_stop; i++) {
        r->stop[i] = strdup(q->stop[i] ? q->stop[i] : "");
        if (!r->stop[i]) rc = KVLLM_ENOMEM;
        else r->n_stop++;
    }
    for (int i = 0; !rc && i < q->n; i++) {
        struct seq_ctx *c = &r->ctx[i];
        c->req = r;
        c->index = i;
        struct kvllm_sampling_params sp = q->sampling;
        sp.seed += (uint64_t)i;
        rc = kvllm_sampler_new(&sp, V, &c->smp);
        if (!rc && !(r->seqs[i] = seq_new(0, q->prompt, q->n_prompt, max_len, e->p.block_size))) rc = KVLLM_ENOMEM;
        if (!rc && !q->no_text && km->tok) {
            detok_init(&c->detok, km->tok);
            c->has_detok = true;
        }
        if (!rc) {
            r->seqs[i]->owner = c;
            r->seqs[i]->n_reserved = i == 0 ? q->n : 1;
        }
    }
    if (rc) { request_free(r); return rc; }
    *out = r;
    return 0;
}

/* A text prompt becomes ids (malloc'd into *ids). */
static int tokenize_prompt(struct kvllm_engine *e, const struct kvllm_request *q, struct kvllm_request *out,
                           int32_t **ids) {
    *out = *q;
    *ids = NULL;
    if (!q->prompt_text) return 0;
    size_t len = strlen(q->prompt_text);
    int n = kvllm_tokenize(e->km, q->prompt_text, len, true, false, NULL, 0);
    if (n < 0) return n;
    if (!(*ids = xmalloc((size_t)(n > 0 ? n : 1) * sizeof **ids))) return KVLLM_ENOMEM;
    kvllm_tokenize(e->km, q->prompt_text, len, true, false, *ids, n);
    out->prompt = *ids;
    out->n_prompt = n;
    return 0;
}

int kvllm_engine_add(struct kvllm_engine *e, const struct kvllm_request *q0, uint64_t *id) {
    struct request *r;
    struct kvllm_request q1;
    int32_t *ids;
    int rc = tokenize_prompt(e, q0, &q1, &ids);
    if (!rc) rc = build_request(e, &q1, &r);
    free(ids);
    if (rc) return rc;
    pthread_mutex_lock(&e->mu);
    if (e->n_queued >= e->p.max_queue) {
        pthread_mutex_unlock(&e->mu);
        request_free(r);
        return KVLLM_EBUSY;
    }
    r->id = e->next_id++;
    for (int i = 0; i < r->n; i++) r->seqs[i]->id = r->id;
    r->queued = true;
    e->n_queued++;
    *e->inbox_tail = r;
    e->inbox_tail = &r->next;
    pthread_mutex_unlock(&e->mu);
    if (id) *id = r->id;
    return 0;
}

void kvllm_engine_abort(struct kvllm_engine *e, uint64_t id) {
    pthread_mutex_lock(&e->mu);
    if (e->n_aborts == e->cap_aborts) {
        int cap = e->cap_aborts ? 2 * e->cap_aborts : 16;
        uint64_t *a = realloc(e->aborts, (size_t)cap * sizeof *a);
        if (a) { e->aborts = a; e->cap_aborts = cap; }
    }
    if (e->n_aborts < e->cap_aborts) e->aborts[e->n_aborts++] = id;
    pthread_mutex_unlock(&e->mu);
}

/* ---- events ---- */

static void emit(struct kvllm_engine *e, struct seq *q, int32_t token, const char *text, size_t len,
                 enum kvllm_finish fin) {
    const float *logits = token >= 0 ? e->cur_logits : NULL;
    struct seq_ctx *c = q->owner;
    struct request *r = c->req;
    if (len + 1 > e->cap_text) {
        char *t = realloc(e->text, len + 1);
        if (t) { e->text = t; e->cap_text = len + 1; } else len = e->cap_text - 1;
    }
    if (len) memcpy(e->text, text, len);
    e->text[len] = 0;
    struct kvllm_event ev = { .request = r->id, .index = c->index, .token = token, .text = e->text, .finish = fin,
                              .n_prompt = q->n_prompt, .n_generated = c->n_generated, .n_cached = r->n_cached,
                              .logits = logits };
    if (r->on_event) r->on_event(&ev, r->user);
}

static void finish_seq(struct kvllm_engine *e, struct seq *q, int32_t token, const char *text, size_t len,
                       enum kvllm_finish fin) {
    struct seq_ctx *c = q->owner;
    if (c->done) return;
    if (q->status != SEQ_FINISHED) sched_finish(&e->sched, q);
    c->done = true;
    c->req->n_done++;
    emit(e, q, token, text, len, fin);
}

/* Append s to the withheld text of c. */
static bool hold(struct seq_ctx *c, const char *s, size_t n) {
    if (c->n_held + n + 1 > c->cap_held) {
        size_t cap = (c->n_held + n + 1) * 2;
        char *h = realloc(c->held, cap);
        if (!h) return false;
        c->held = h;
        c->cap_held = cap;
    }
    memcpy(c->held + c->n_held, s, n);
    c->n_held += n;
    return true;
}

/* Longest suffix of the held text that is a proper prefix of a stop string. */
static size_t stop_prefix_tail(const struct request *r, const char *s, size_t n) {
    size_t best = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t ls = strlen(r->stop[i]);
        for (size_t k = ls > n ? n : ls - 1; k > best; k--)
            if (!memcmp(s + n - k, r->stop[i], k)) { best = k; break; }
    }
    return best;
}

/* A sampled token: append, detokenize, check stops and limits, emit. */
static void accept_token(struct kvllm_engine *e, struct seq *q, int32_t tok) {
    struct seq_ctx *c = q->owner;
    struct request *r = c->req;
    const int eos = e->km->tok ? tokenizer_eos(e->km->tok) : -1;
    if (tok < 0 || (tok == eos && !r->ignore_eos)) {
        const char *rest = c->has_detok ? detok_flush(&c->detok) : "";
        if (rest) hold(c, rest, strlen(rest));
        finish_seq(e, q, -1, c->held, c->n_held, KVLLM_FINISH_STOP);
        return;
    }
    int32_t prev = q->tokens[q->n_tokens - 1];
    q->tokens[q->n_tokens++] = tok;
    c->n_generated++;
    bool at_limit = c->n_generated >= r->max_tokens || q->n_tokens >= q->max_len;
    if (!c->has_detok) {
        if (at_limit) finish_seq(e, q, tok, "", 0, KVLLM_FINISH_LENGTH);
        else emit(e, q, tok, "", 0, KVLLM_FINISH_NONE);
        return;
    }
    const char *piece = detok_push(&c->detok, prev, tok);
    if (piece) hold(c, piece, strlen(piece));
    if (at_limit) {
        const char *rest = detok_flush(&c->detok);
        if (rest) hold(c, rest, strlen(rest));
    }
    for (int i = 0; i < r->n_stop; i++) {
        if (!*r->stop[i] || !c->n_held) continue;
        c->held[c->n_held] = 0;
        char *hit = strstr(c->held, r->stop[i]);
        if (hit) { finish_seq(e, q, tok, c->held, (size_t)(hit - c->held), KVLLM_FINISH_STOP); return; }
    }
    size_t keep = at_limit ? 0 : stop_prefix_tail(r, c->held, c->n_held);
    size_t out = c->n_held - keep;
    if (at_limit) finish_seq(e, q, tok, c->held, out, KVLLM_FINISH_LENGTH);
    else emit(e, q, tok, c->held, out, KVLLM_FINISH_NONE);
    memmove(c->held, c->held + out, keep);
    c->n_held = keep;
}

/* The logits of a sequence whose known tokens are all computed. */
static void on_logits(struct kvllm_engine *e, struct seq *q, const float *logits) {
    struct seq_ctx *c = q->owner;
    struct request *r = c->req;
    if (c->done || r->aborted) return;
    e->cur_logits = logits;
    /* the first sample of a request with n > 1: fork the others off the
     * prompt's blocks; each draws its own first token from these logits */
    if (c->index == 0 && r->n > 1 && !r->forked) {
        r->forked = true;
        for (int i = 1; i < r->n; i++) {
            sched_fork(&e->sched, q, r->seqs[i]);
            accept_token(e, r->seqs[i], kvllm_sampler_sample(r->ctx[i].smp, logits, q->tokens, q->n_tokens));
        }
    }
    accept_token(e, q, kvllm_sampler_sample(c->smp, logits, q->tokens, q->n_tokens));
}

/* ---- the step ---- */

static void drain_inbox(struct kvllm_engine *e) {
    pthread_mutex_lock(&e->mu);
    struct request *in = e->inbox;
    e->inbox = NULL;
    e->inbox_tail = &e->inbox;
    int n_ab = e->n_aborts;
    uint64_t ab[64];
    if (n_ab > 64) n_ab = 64;
    if (n_ab) {
        memcpy(ab, e->aborts, (size_t)n_ab * sizeof *ab);
        memmove(e->aborts, e->aborts + n_ab, (size_t)(e->n_aborts - n_ab) * sizeof *ab);
        e->n_aborts -= n_ab;
    }
    pthread_mutex_unlock(&e->mu);

    while (in) {
        struct request *r = in;
        in = in->next;
        r->next = e->live;
        e->live = r;
        if (sched_add(&e->sched, r->seqs[0]) != 0) { /* cannot happen: checked in build_request */
            r->aborted = true;
        }
    }
    for (int i = 0; i < n_ab; i++)
        for (struct request *r = e->live; r; r = r->next)
            if (r->id == ab[i]) r->aborted = true;
    for (struct request *r = e->live; r; r = r->next) {
        if (!r->aborted) continue;
        for (int k = 0; k < r->n; k++) finish_seq(e, r->seqs[k], -1, "", 0, KVLLM_FINISH_ABORT);
    }
}

/* Requests whose sequences are all done leave; queued ones count down. */
static void reap(struct kvllm_engine *e) {
    int admitted = 0;
    for (struct request **pr = &e->live; *pr;) {
        struct request *r = *pr;
        if (r->queued && (r->seqs[0]->status != SEQ_WAITING || r->n_done == r->n)) {
            r->queued = false;
            admitted++;
        }
        if (r->n_done == r->n) { *pr = r->next; request_free(r); }
        else pr = &r->next;
    }
    if (admitted) {
        pthread_mutex_lock(&e->mu);
        e->n_queued -= admitted;
        pthread_mutex_unlock(&e->mu);
    }
}

/* Flatten the scheduled chunks into one batch and run it. */
static void run_batch(struct kvllm_engine *e) {
    const struct sched_batch *b = &e->sb;
    const int bs = e->p.block_size, V = e->km->m->hp.n_vocab;
    for (int i = 0; i < b->n_copies; i++) paged_kv_copy_block(&e->kv, b->copies[i][0], b->copies[i][1]);
    int k = 0, nl = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        struct seq *q = b->seqs[i];
        for (int j = 0; j < b->n_new[i]; j++, k++) {
            int t = q->n_computed + j;
            e->tok[k] = q->tokens[t];
            e->pos[k] = t;
            e->slot[k] = q->blocks[t / bs] * bs + t % bs;
            e->tables[k] = q->blocks;
        }
        if (q->n_computed + b->n_new[i] == q->n_tokens) {
            e->logit_rows[nl] = k - 1;
            e->logit_seqs[nl++] = q;
        }
    }
    struct batch bt = { .n_tokens = k, .tokens = e->tok, .pos = e->pos, .slots = e->slot,
                        .tables = e->tables, .n_logits = nl, .logit_rows = e->logit_rows };
    model_forward(e->km->m, e->kv.layers, &e->fb, &bt, e->logits);
    sched_commit(&e->sched, b);

    /* statistics sampled at every step */
    uint64_t alloc = 0, used = 0, ideal = 0;
    for (int i = 0; i < e->sched.n_running; i++) {
        const struct seq *q = e->sched.running[i];
        alloc += (uint64_t)q->n_blocks * bs;
        used += (uint64_t)q->n_computed;
        ideal += (uint64_t)sched_blocks_for(&e->sched, q->n_computed) * bs;
    }
    e->st.steps++;
    e->st.tokens_computed += (uint64_t)k;
    e->st.batch_seqs_sum += (uint64_t)b->n_seqs;
    e->st.kv_util_sum += (double)block_pool_n_held(&e->pool) / e->pool.n_blocks;
    e->st.kv_waste_sum += alloc ? (double)(alloc - used) / (double)alloc : 0.0;
    e->st.kv_waste_ideal_sum += ideal ? (double)(ideal - used) / (double)ideal : 0.0;

    for (int i = 0; i < nl; i++) on_logits(e, e->logit_seqs[i], e->logits + (size_t)i * V);
}

int kvllm_engine_step(struct kvllm_engine *e) {
    drain_inbox(e);
    sched_schedule(&e->sched, &e->sb);
    int n = e->sb.n_tokens;
    /* a request's prefix-cache hit is known once its prompt was admitted */
    for (int i = 0; i < e->sb.n_seqs; i++) {
        struct seq *q = e->sb.seqs[i];
        struct seq_ctx *c = q->owner;
        if (c->index == 0 && c->n_generated == 0 && q->n_preemptions == 0 && c->req->n_cached == 0)
            c->req->n_cached = q->n_computed;
    }
    if (n) run_batch(e);
    reap(e);
    return n;
}

bool kvllm_engine_idle(struct kvllm_engine *e) {
    pthread_mutex_lock(&e->mu);
    bool pending = e->inbox != NULL || e->n_aborts > 0;
    pthread_mutex_unlock(&e->mu);
    return !pending && e->live == NULL;
}

void kvllm_engine_get_stats(struct kvllm_engine *e, struct kvllm_engine_stats *st) {
    *st = e->st;
    st->n_running = e->sched.n_running;
    st->n_waiting = e->sched.n_waiting;
    st->block_size = e->pool.block_size;
    st->blocks_total = e->pool.n_blocks;
    st->blocks_held = block_pool_n_held(&e->pool);
    st->blocks_cached = block_pool_n_cached(&e->pool);
    st->blocks_free = e->pool.n_free - st->blocks_cached;
    st->preemptions = e->sched.n_preemptions;
    st->prompt_tokens = e->sched.n_prompt_tokens;
    st->cached_tokens = e->sched.n_cached_tokens;
}

/* ---- sessions: one sequence driven by hand over a private engine ---- */

struct kvllm_session {
    struct kvllm_engine *e;
    struct seq *q;
    bool no_kv_cache;
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
    struct kvllm_session *s = xcalloc(1, sizeof *s);
    if (!s) return KVLLM_ENOMEM;
    s->no_kv_cache = p && p->no_kv_cache;
    int rc = kvllm_engine_new(km, &ep, &s->e);
    if (!rc && !(s->q = seq_new(0, NULL, 0, n_ctx, ep.block_size))) rc = KVLLM_ENOMEM;
    if (rc) { kvllm_session_free(s); return rc; }
    *out = s;
    return 0;
}

void kvllm_session_free(struct kvllm_session *s) {
    if (!s) return;
    seq_free(s->q);
    kvllm_engine_free(s->e);
    free(s);
}

int kvllm_session_n_past(const struct kvllm_session *s) { return s->q->n_tokens; }

static void session_release(struct kvllm_session *s, int keep_blocks) {
    struct seq *q = s->q;
    while (q->n_blocks > keep_blocks) block_pool_release(&s->e->pool, q->blocks[--q->n_blocks]);
}

void kvllm_session_truncate(struct kvllm_session *s, int pos) {
    struct seq *q = s->q;
    if (pos < 0 || pos >= q->n_tokens) return;
    q->n_tokens = pos;
    if (q->n_computed > pos) q->n_computed = pos;
    session_release(s, sched_blocks_for(&s->e->sched, pos));
}

int kvllm_session_eval(struct kvllm_session *s, const int32_t *tokens, int n, bool all_logits, float *logits) {
    struct kvllm_engine *e = s->e;
    struct seq *q = s->q;
    const int V = e->km->m->hp.n_vocab, bs = e->p.block_size;
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
        q->n_computed = 0;
        session_release(s, 0);
    }
    while (q->n_computed < q->n_tokens) {
        int c = q->n_tokens - q->n_computed < e->p.max_batch_tokens ? q->n_tokens - q->n_computed
                                                                     : e->p.max_batch_tokens;
        while (q->n_blocks < sched_blocks_for(&e->sched, q->n_computed + c)) {
            int32_t id = block_pool_alloc(&e->pool);
            KV_ASSERT(id >= 0); /* the pool holds n_ctx positions */
            q->blocks[q->n_blocks++] = id;
        }
        int nl = 0;
        for (int j = 0; j < c; j++) {
            int t = q->n_computed + j;
            e->tok[j] = q->tokens[t];
            e->pos[j] = t;
            e->slot[j] = q->blocks[t / bs] * bs + t % bs;
            e->tables[j] = q->blocks;
            if ((all_logits && t >= first_new) || t == q->n_tokens - 1) e->logit_rows[nl++] = j;
        }
        float *dst = NULL;
        if (logits && nl) dst = all_logits ? logits + (size_t)(q->n_computed + e->logit_rows[0] - first_new) * V : logits;
        struct batch bt = { .n_tokens = c, .tokens = e->tok, .pos = e->pos, .slots = e->slot,
                            .tables = e->tables, .n_logits = dst ? nl : 0, .logit_rows = e->logit_rows };
        model_forward(e->km->m, e->kv.layers, &e->fb, &bt, dst);
        q->n_computed += c;
    }
    return 0;
}
