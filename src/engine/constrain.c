/* constrain.c — grammars in the engine: a request's grammar reference, a
 * matcher and allow-mask for each sample while it runs (from the engine's
 * pool, below), and the engine's vocabulary index, built once at the first
 * constrained add from every token's bytes (never in a step).
 *
 * The index marks control tokens (and tokens that spell no bytes) special:
 * a grammar never allows them, except the end tokens (EOS and the chat
 * end-of-turn tokens the engine found at creation), which it allows once
 * its string is complete. */
#include "engine/engine_internal.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

struct kvllm_grammar *constrain_ref(const struct kvllm_grammar *g) {
    /* a grammar is immutable; only its reference count changes */
    return g ? kvllm_grammar_ref((struct kvllm_grammar *)g) : NULL;
}

void constrain_unref(struct kvllm_grammar *g) { kvllm_grammar_free(g); }

/* Every token's bytes as the tokenizer spells them mid-text. */
static int build_vocab(struct kvllm_engine *e) {
    const struct tokenizer *t = e->km->tok;
    const int V = e->km->m->hp.n_vocab, nt = tokenizer_n_vocab(t);
    size_t *len = xcalloc((size_t)V, sizeof *len);
    const char **bytes = xcalloc((size_t)V, sizeof *bytes);
    bool *special = xcalloc((size_t)V, sizeof *special);
    char *slab = NULL;
    int rc = len && bytes && special ? 0 : KVLLM_ENOMEM;
    size_t total = 0;
    for (int i = 0; !rc && i < V; i++) {
        char probe[1];   /* the length alone (memcpy of 0 bytes still wants a real pointer) */
        int n = i < nt ? tokenizer_token_bytes(t, -2, i, probe, 0) : 0;
        enum tok_type ty = i < nt ? tokenizer_type(t, i) : TOK_UNUSED;
        special[i] = n <= 0 || ty == TOK_CONTROL || ty == TOK_UNKNOWN || ty == TOK_UNUSED;
        len[i] = special[i] ? 0 : (size_t)n;
        total += len[i];
    }
    if (!rc && !(slab = xmalloc(total + 1))) rc = KVLLM_ENOMEM;
    for (size_t i = 0, off = 0; !rc && i < (size_t)V; i++) {
        bytes[i] = slab + off;
        if (len[i]) tokenizer_token_bytes(t, -2, (int)i, slab + off, len[i]);
        off += len[i];
    }
    if (!rc) {
        double t0 = time_now();
        rc = gvocab_new(V, bytes, len, special, e->end_ids, e->n_end, &e->gv);
        if (!rc)
            LOG_INFO("grammar vocabulary index: %d tokens, %d end tokens, %.1f ms", V, e->n_end,
                     1e3 * (time_now() - t0));
    }
    free(slab);
    free(len);
    free(bytes);
    free(special);
    return rc;
}

/* ---- the matcher pool ----
 *
 * A sample takes a matcher when it first samples (it has been admitted, and
 * at most --max-seqs run at once) and gives it back when it finishes; the
 * pool keeps min(--max-seqs, constrained samples alive) of them, made at
 * add (never in a step) and reset to each sample's grammar.  A step finds
 * the pool empty only when preempted samples keep theirs: it then makes one
 * more.  Every matcher works in one shared scratch (only the engine thread
 * runs them), so each costs its own state alone.  When the last constrained
 * sample is freed, the pool and the scratch go. */
struct gslot {
    struct gmatcher *m;
    uint32_t *allow;   /* (mask_words) */
};

struct gpool {
    pthread_mutex_t mu;        /* guards everything below (adds run on any thread) */
    const struct gvocab *gv;
    int mask_words, max_keep;
    struct gscratch *scratch;  /* NULL while no constrained sample is alive */
    struct gslot *idle;        /* (cap_idle) matchers no sample holds */
    int n_idle, cap_idle;
    int n_made;                /* matchers in existence: idle + held */
    int n_samples;             /* constrained samples alive (added, not yet freed) */
};

static void slot_free(struct gslot *s) {
    gmatcher_free(s->m);
    free(s->allow);
}

/* One more idle matcher (under p->mu). */
static int pool_make(struct gpool *p) {
    if (p->n_made + 1 > p->cap_idle) {
        int cap = 2 * p->cap_idle > p->n_made + 1 ? 2 * p->cap_idle : p->n_made + 8;
        struct gslot *v = realloc(p->idle, (size_t)cap * sizeof *v);
        if (!v) return KVLLM_ENOMEM;
        p->idle = v;
        p->cap_idle = cap;
    }
    struct gslot s = { NULL, xmalloc((size_t)p->mask_words * sizeof(uint32_t)) };
    int rc = s.allow ? gmatcher_new_shared(p->gv, p->scratch, &s.m) : KVLLM_ENOMEM;
    if (rc) { free(s.allow); return rc; }
    p->idle[p->n_idle++] = s;
    p->n_made++;
    return 0;
}

/* Idle matchers beyond what the live samples may hold are freed; with no
 * sample left, the scratch too (under p->mu). */
static void pool_shrink(struct gpool *p) {
    const int want = p->n_samples < p->max_keep ? p->n_samples : p->max_keep;
    while (p->n_made > want && p->n_idle > 0) {
        slot_free(&p->idle[--p->n_idle]);
        p->n_made--;
    }
    if (!p->n_samples && !p->n_made) {
        gscratch_free(p->scratch);
        p->scratch = NULL;
    }
}

static struct gpool *pool_new(struct kvllm_engine *e) {
    struct gpool *p = xcalloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    p->gv = e->gv;
    p->mask_words = e->mask_words;
    p->max_keep = e->p.max_seqs > 0 ? e->p.max_seqs : 1;
    return p;
}

/* Count c in the pool and make the matchers the live samples may need. */
static int pool_join(struct gpool *p, const struct request *r, struct seq_ctx *c) {
    pthread_mutex_lock(&p->mu);
    int rc = p->scratch ? 0 : gscratch_new(&p->scratch);
    if (!rc) {
        gmatcher_prepare(r->grammar, p->gv);
        p->n_samples++;
        c->pool = p;
    }
    const int want = p->n_samples < p->max_keep ? p->n_samples : p->max_keep;
    while (!rc && p->n_made < want) rc = pool_make(p);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int constrain_seq_new(struct kvllm_engine *e, const struct request *r, struct seq_ctx *c) {
    if (!r->grammar) return 0;
    if (!e->km->tok) {
        LOG_ERR("a grammar needs a vocabulary; the model has none");
        return KVLLM_EINVAL;
    }
    pthread_mutex_lock(&e->gv_mu);
    int rc = e->gv ? 0 : build_vocab(e);
    if (!rc && !e->gpool && !(e->gpool = pool_new(e))) rc = KVLLM_ENOMEM;
    pthread_mutex_unlock(&e->gv_mu);
    return rc ? rc : pool_join(e->gpool, r, c);
}

int constrain_attach(struct seq_ctx *c) {
    if (c->gm || !c->pool) return 0;
    struct gpool *p = c->pool;
    pthread_mutex_lock(&p->mu);
    int rc = p->n_idle ? 0 : pool_make(p);
    struct gslot s = rc ? (struct gslot){ 0 } : p->idle[--p->n_idle];
    pthread_mutex_unlock(&p->mu);
    if (rc) return rc;
    c->gm = s.m;
    c->allow = s.allow;
    rc = gmatcher_reset(c->gm, c->req->grammar);
    if (rc) constrain_release(c);
    return rc;
}

void constrain_release(struct seq_ctx *c) {
    if (!c->gm) return;
    struct gpool *p = c->pool;
    pthread_mutex_lock(&p->mu);
    p->idle[p->n_idle++] = (struct gslot){ c->gm, c->allow };
    pthread_mutex_unlock(&p->mu);
    c->gm = NULL;
    c->allow = NULL;
}

void constrain_seq_free(struct seq_ctx *c) {
    struct gpool *p = c->pool;
    if (!p) return;
    constrain_release(c);
    pthread_mutex_lock(&p->mu);
    p->n_samples--;
    pool_shrink(p);
    pthread_mutex_unlock(&p->mu);
    c->pool = NULL;
}

void constrain_engine_free(struct kvllm_engine *e) {
    struct gpool *p = e->gpool;
    if (p) {
        for (int i = 0; i < p->n_idle; i++) slot_free(&p->idle[i]);
        free(p->idle);
        gscratch_free(p->scratch);
        pthread_mutex_destroy(&p->mu);
        free(p);
    }
    gvocab_free(e->gv);
}

int constrain_fill(struct seq_ctx *c) { return gmatcher_fill_mask(c->gm, c->allow); }
int constrain_accept(struct seq_ctx *c, int32_t tok) { return gmatcher_accept(c->gm, tok); }
bool constrain_must_end(const struct seq_ctx *c) { return gmatcher_must_end(c->gm); }
