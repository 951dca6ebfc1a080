/* output.c — the stage after the forward pass: a sequence's logits are
 * sampled (or, for a session, left where they were downloaded), the token
 * is appended, detokenized into complete UTF-8 text, stop strings are
 * matched and withheld while they may still begin, and events go to the
 * request's callback.  Failures here (memory for withheld text, a sampler
 * that finds no valid token) end the sequence with KVLLM_FINISH_ERROR: an
 * error always reaches the caller, never a silent stop or a cut text.
 *
 * Per token (output_sample_accept): the allow-mask is made (the grammar's
 * matcher fills it; before min_tokens the end tokens are cleared from it),
 * the sampler applies the logit bias and the mask before everything else,
 * the token is accepted (the matcher advances), and a grammar that admits
 * nothing but its end finishes the sample with STOP at once.  Greedy first
 * offers the matcher the unconstrained argmax and fills the mask only when
 * the grammar refuses it (the same token either way).  A constrained sample
 * takes its matcher from the engine's pool at its first token and gives it
 * back when it finishes.  Everything it touches was sized at add: nothing
 * allocates here but the rare growth of withheld text past its reserve (and
 * a matcher when preempted samples hold the pool's). */
#include "engine/engine_internal.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

static void emit(struct kvllm_engine *e, struct seq *q, int32_t token, const char *text, size_t len,
                 enum kvllm_finish fin) {
    struct seq_ctx *c = q->owner;
    struct request *r = c->req;
    const float *logits = token >= 0 && r->want_logits ? e->cur_logits : NULL;
    if (len + 1 > e->cap_text) {
        char *t = realloc(e->text, len + 1);
        if (t) {
            e->text = t;
            e->cap_text = len + 1;
        } else {   /* never deliver a cut text: the sequence ends with an error instead */
            LOG_ERR("request %llu: no memory for %zu bytes of event text", (unsigned long long)r->id, len);
            if (!c->done) { output_finish_seq(e, q, -1, "", 0, KVLLM_FINISH_ERROR); return; }
            r->failed = true;   /* already finishing: this last event says error */
            len = 0;
            token = -1;
            logits = NULL;
            fin = KVLLM_FINISH_ERROR;
        }
    }
    if (len) memcpy(e->text, text, len);
    e->text[len] = 0;
    struct kvllm_event ev = { .request = r->id, .index = c->index, .token = token, .text = e->text, .finish = fin,
                              .n_prompt = q->n_prompt, .n_generated = c->n_generated, .n_cached = r->n_cached,
                              .logits = logits };
    if (r->on_event) r->on_event(&ev, r->user);
}

void output_finish_seq(struct kvllm_engine *e, struct seq *q, int32_t token, const char *text, size_t len,
                       enum kvllm_finish fin) {
    struct seq_ctx *c = q->owner;
    if (c->done) return;
    if (q->status != SEQ_FINISHED) sched_finish(&e->sched, q);
    c->done = true;
    c->req->n_done++;
    if (fin == KVLLM_FINISH_ERROR) c->req->failed = true;
    constrain_release(c);   /* the matcher serves the next admitted sample */
    emit(e, q, token, text, len, fin);
}

/* Append s to the withheld text of c; false when memory runs out. */
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

/* Longest suffix of the held text that is a proper prefix of a stop string
 * (an empty stop string, which never matches, has none). */
static size_t stop_prefix_tail(const struct request *r, const char *s, size_t n) {
    size_t best = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t ls = strlen(r->stop[i]);
        if (!ls) continue;
        for (size_t k = ls > n ? n : ls - 1; k > best; k--)
            if (!memcmp(s + n - k, r->stop[i], k)) { best = k; break; }
    }
    return best;
}

static void fail_seq(struct kvllm_engine *e, struct seq *q, const char *what) {
    LOG_ERR("request %llu: %s", (unsigned long long)((struct seq_ctx *)q->owner)->req->id, what);
    output_finish_seq(e, q, -1, "", 0, KVLLM_FINISH_ERROR);
}

/* EOS and the vocabulary's end-of-turn tokens (e->end_ids) end a sample
 * alike, as llama.cpp's end-of-generation set does: a chat model ends its
 * answer with its turn's end, which need not be the file's EOS (Gemma's
 * EOS is <eos>, its turns end with <end_of_turn>).  ignore_eos ignores
 * them all, except under a grammar, whose string may end only so. */
bool output_is_end(const struct kvllm_engine *e, const struct request *r, int32_t tok) {
    const int eos = e->km->tok ? tokenizer_eos(e->km->tok) : -1;
    if (tok == eos && (!r->ignore_eos || r->grammar)) return true;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == tok) return true;
    if (!r->ignore_eos || r->grammar)
        for (int i = 0; i < e->n_end; i++)
            if (e->end_ids[i] == tok) return true;
    return false;
}

/* A sampled token: append, advance the grammar, detokenize, check stops
 * and limits, emit. */
static void accept_token(struct kvllm_engine *e, struct seq *q, int32_t tok, bool advanced) {
    struct seq_ctx *c = q->owner;
    struct request *r = c->req;
    if (tok < 0) { fail_seq(e, q, "the sampler found no valid token (every allowed logit NaN or -inf)"); return; }
    if (output_is_end(e, r, tok)) {
        const char *rest = c->has_detok ? detok_flush(&c->detok) : "";
        if (rest && !hold(c, rest, strlen(rest))) { fail_seq(e, q, "out of memory holding text"); return; }
        output_finish_seq(e, q, -1, c->held ? c->held : "", c->n_held, KVLLM_FINISH_STOP);
        return;
    }
    /* the grammar's end: nothing but an end token may follow this one */
    bool gram_end = false;
    if (c->gm) {
        if (!advanced && constrain_accept(c, tok) < 0) { fail_seq(e, q, "the grammar refused a token its own mask allowed"); return; }
        gram_end = constrain_must_end(c);
    }
    int32_t prev = q->tokens[q->n_tokens - 1];
    q->tokens[q->n_tokens++] = tok;
    c->n_generated++;
    bool at_limit = c->n_generated >= r->max_tokens || q->n_tokens >= q->max_len;
    /* the grammar's end is a STOP even at the length limit: the string is whole */
    enum kvllm_finish fin = gram_end ? KVLLM_FINISH_STOP : at_limit ? KVLLM_FINISH_LENGTH : KVLLM_FINISH_NONE;
    if (!c->has_detok) {
        if (fin) output_finish_seq(e, q, tok, "", 0, fin);
        else emit(e, q, tok, "", 0, KVLLM_FINISH_NONE);
        return;
    }
    const char *piece = detok_push(&c->detok, prev, tok);
    bool ok = !piece || hold(c, piece, strlen(piece));
    if (ok && fin) {
        const char *rest = detok_flush(&c->detok);
        ok = !rest || hold(c, rest, strlen(rest));
    }
    if (!ok) { fail_seq(e, q, "out of memory holding text"); return; }
    /* vLLM: no stop check of any kind before min_tokens */
    for (int i = 0; c->n_generated >= r->min_tokens && i < r->n_stop; i++) {
        if (!*r->stop[i] || !c->n_held) continue;
        c->held[c->n_held] = 0;
        char *hit = strstr(c->held, r->stop[i]);
        if (!hit) continue;
        size_t upto = (size_t)(hit - c->held) + (r->include_stop ? strlen(r->stop[i]) : 0);
        output_finish_seq(e, q, tok, c->held, upto, KVLLM_FINISH_STOP);
        return;
    }
    size_t keep = fin ? 0 : stop_prefix_tail(r, c->held, c->n_held);
    size_t out = c->n_held - keep;
    if (fin) output_finish_seq(e, q, tok, c->held, out, fin);
    else emit(e, q, tok, c->held, out, KVLLM_FINISH_NONE);
    memmove(c->held, c->held + out, keep);
    c->n_held = keep;
}

/* Clear the bits of r's banned tokens in mask; returns how many were set. */
static int clear_banned(const struct request *r, uint32_t *mask) {
    int n = 0;
    for (int i = 0; i < r->n_ban; i++) {
        const int32_t t = r->ban[i];
        const uint32_t bit = 1u << (t & 31);
        if (mask[t >> 5] & bit) { mask[t >> 5] &= ~bit; n++; }
    }
    return n;
}

/* The allow-mask for c's next token (NULL: every token); *why names the
 * reason when no token at all may follow (the mask is then unusable). */
static const uint32_t *next_mask(struct kvllm_engine *e, struct seq_ctx *c, const char **why) {
    const struct request *r = c->req;
    const bool before_min = c->n_generated < r->min_tokens;
    *why = NULL;
    if (!c->gm) return before_min ? r->min_mask : NULL;
    int n = constrain_fill(c);
    if (n < 0) { *why = "the grammar's matcher failed"; return NULL; }
    if (n == 0) { *why = "the grammar allows no token here (no token of the vocabulary continues it)"; return NULL; }
    /* before min_tokens the ends are out, unless the grammar is complete and
     * admits nothing else: then the grammar wins and the sample ends */
    if (before_min && clear_banned(r, c->allow) == n) n = constrain_fill(c);
    (void)e;
    return c->allow;
}

/* c's matcher at its first token (the sample has been admitted); false
 * (the sample failed) when none can be had. */
static bool have_matcher(struct kvllm_engine *e, struct seq *q) {
    int rc = constrain_attach(q->owner);
    if (rc) fail_seq(e, q, rc == KVLLM_ERANGE ? "the grammar's start exceeds the matcher's capacity"
                                              : "no memory for the grammar's matcher");
    return rc == 0;
}

int32_t output_sample_accept(struct kvllm_engine *e, struct seq *q, const float *logits) {
    struct seq_ctx *c = q->owner;
    const struct request *r = c->req;
    if (!have_matcher(e, q)) return KVLLM_EINVAL;
    if (c->gm && r->greedy) {
        /* Greedy under a grammar: when the unconstrained argmax is a token the
         * grammar accepts, it is also the argmax among the allowed tokens (same
         * ties, lowest id), so the mask need not be filled.  End tokens, which
         * min_tokens may hold back, always take the full path. */
        int32_t tok = kvllm_sampler_sample_masked(c->smp, logits, q->tokens, q->n_tokens, NULL);
        if (tok >= 0 && !output_is_end(e, r, tok) && constrain_accept(c, tok) == 0) {
            accept_token(e, q, tok, true);
            return tok;
        }
    }
    const char *why;
    const uint32_t *mask = next_mask(e, c, &why);
    if (why) { fail_seq(e, q, why); return KVLLM_EINVAL; }
    int32_t tok = kvllm_sampler_sample_masked(c->smp, logits, q->tokens, q->n_tokens, mask);
    accept_token(e, q, tok, false);
    return tok;
}

void output_on_token(struct kvllm_engine *e, struct seq *q, int32_t token) {
    struct seq_ctx *c = q->owner;
    if (c->done || c->req->aborted || !have_matcher(e, q)) return;
    e->cur_logits = NULL;
    accept_token(e, q, token, false);
}

void output_on_logits(struct kvllm_engine *e, struct seq *q, const float *logits) {
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
            output_sample_accept(e, r->seqs[i], logits);
        }
    }
    output_sample_accept(e, q, logits);
}
