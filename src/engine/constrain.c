/* constrain.c — grammars in the engine: a request's grammar reference, one
 * matcher and allow-mask per sample (made at add, freed with the request),
 * and the engine's vocabulary index, built once at the first constrained
 * add from every token's bytes (never in a step).
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

int constrain_seq_new(struct kvllm_engine *e, const struct request *r, struct seq_ctx *c) {
    if (!r->grammar) return 0;
    if (!e->km->tok) {
        LOG_ERR("a grammar needs a vocabulary; the model has none");
        return KVLLM_EINVAL;
    }
    pthread_mutex_lock(&e->gv_mu);
    int rc = e->gv ? 0 : build_vocab(e);
    pthread_mutex_unlock(&e->gv_mu);
    if (!rc) rc = gmatcher_new(r->grammar, e->gv, &c->gm);
    if (!rc && !(c->allow = xmalloc((size_t)e->mask_words * sizeof *c->allow))) rc = KVLLM_ENOMEM;
    return rc;
}

void constrain_seq_free(struct seq_ctx *c) {
    gmatcher_free(c->gm);
    free(c->allow);
    c->gm = NULL;
    c->allow = NULL;
}

void constrain_engine_free(struct kvllm_engine *e) { gvocab_free(e->gv); }

int constrain_fill(struct seq_ctx *c) { return gmatcher_fill_mask(c->gm, c->allow); }
int constrain_accept(struct seq_ctx *c, int32_t tok) { return gmatcher_accept(c->gm, tok); }
bool constrain_must_end(const struct seq_ctx *c) { return gmatcher_must_end(c->gm); }
