/* test_engine_grammar.c — constrained requests through the engine, on
 * stories260K, each output checked by a plain recognizer written here (not
 * the matcher under test):
 *   - a bounded grammar ([a-z ]{3,30} "."): every sample, greedy and at
 *     temperature 1 with n = 3 (a matcher each), finishes with STOP on a
 *     string of it; greedy (which skips the mask when the grammar accepts
 *     the argmax) equals top-k 1 through the full mask;
 *   - greedy identity: the unconstrained greedy text as a literal grammar,
 *     and as a star of the characters it uses, gives the same text
 *     (STOP at its end for the literal, LENGTH for the star);
 *   - abort mid-constraint: every block released, an ABORT event each;
 *   - the engine without a vocabulary index yet builds it at add, and a
 *     second engine over the same model works the same.
 * Every run must leave 0 blocks held. */
#include "check.h"
#include "stories_util.h"
#include "kvllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NS 4

struct run {
    char text[NS][2048];
    int n_tok[NS];
    enum kvllm_finish fin[NS];
};

static void on_event(const struct kvllm_event *ev, void *user) {
    struct run *r = user;
    int i = ev->index;
    if (ev->token >= 0) r->n_tok[i]++;
    strncat(r->text[i], ev->text, sizeof r->text[i] - strlen(r->text[i]) - 1);
    if (ev->finish) r->fin[i] = ev->finish;
}

static const int32_t k_prompt[] = { 1, 403, 407, 261, 378, 284 };

static void blocks_free(struct kvllm_engine *e) {
    struct kvllm_engine_stats st;
    kvllm_engine_get_stats(e, &st);
    CHECK_MSG(st.blocks_held == 0, "%d blocks held", st.blocks_held);
}

static int g_top_k;   /* top-k of the next runs (0: off) */

static int run(struct kvllm_engine *e, struct kvllm_grammar *g, float temp, int n, int max_tokens, struct run *out) {
    memset(out, 0, sizeof *out);
    struct kvllm_request q = { .prompt = k_prompt, .n_prompt = (int)(sizeof k_prompt / sizeof *k_prompt),
                               .max_tokens = max_tokens, .n = n, .ignore_eos = true, .grammar = g,
                               .on_event = on_event, .user = out };
    q.sampling = kvllm_sampling_default_params();
    q.sampling.temperature = temp;
    q.sampling.seed = 42;
    q.sampling.top_k = g_top_k;
    int rc = kvllm_engine_add(e, &q, NULL);
    while (!kvllm_engine_idle(e)) kvllm_engine_step(e);
    blocks_free(e);
    return rc;
}

/* The recognizer of [a-z ]{3,30} "." */
static int is_words_dot(const char *s) {
    size_t n = strlen(s);
    if (n < 4 || n > 31 || s[n - 1] != '.') return 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || s[i] == ' ')) return 0;
    return 1;
}

static struct kvllm_grammar *gbnf(const char *text) {
    struct kvllm_grammar *g = NULL;
    char err[256] = "";
    int rc = kvllm_grammar_from_gbnf(text, &g, err, sizeof err);
    CHECK_MSG(rc == 0 && g, "grammar %s: %s", text, err);
    return g;
}

/* GBNF string literal for s (quotes, backslashes, control characters escaped). */
static void literal(const char *s, char *out, size_t cap) {
    size_t k = 0;
    out[k++] = '"';
    for (; *s && k + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { out[k++] = '\\'; out[k++] = (char)c; }
        else if (c == '\n') { out[k++] = '\\'; out[k++] = 'n'; }
        else if (c < 0x20) k += (size_t)snprintf(out + k, cap - k, "\\x%02X", c);
        else out[k++] = (char)c;
    }
    out[k++] = '"';
    out[k] = 0;
}

int main(void) {
    kvllm_log_set_level(KVLLM_LOG_ERROR);
    struct kvllm_model *m = load_stories(1);
    if (!m) return check_report("test_engine_grammar");
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.n_ctx = 256;
    struct kvllm_engine *e = NULL;
    CHECK(kvllm_engine_new(m, &ep, &e) == 0);
    if (!e) return check_report("test_engine_grammar");
    struct run *r = calloc(1, sizeof *r), *base = calloc(1, sizeof *base);

    /* a bounded grammar: greedy, then n = 3 at temperature 1 */
    struct kvllm_grammar *words = gbnf("root ::= [a-z ]{3,30} \".\"\n");
    CHECK(run(e, words, 0, 1, 64, r) == 0);
    CHECK_MSG(r->fin[0] == KVLLM_FINISH_STOP && is_words_dot(r->text[0]), "greedy: finish %d, '%s'", r->fin[0],
              r->text[0]);
    /* greedy takes a shortcut (the argmax, if the grammar accepts it, without filling the mask); top-k 1
     * at temperature 1 fills the mask at every token and must pick the same tokens */
    struct run *full = calloc(1, sizeof *full);
    g_top_k = 1;
    CHECK(run(e, words, 1.0f, 1, 64, full) == 0);
    g_top_k = 0;
    CHECK_MSG(!strcmp(full->text[0], r->text[0]), "greedy '%s', top-k 1 '%s'", r->text[0], full->text[0]);
    free(full);
    CHECK(run(e, words, 1.0f, 3, 64, r) == 0);
    int distinct = 0;
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(r->fin[i] == KVLLM_FINISH_STOP && is_words_dot(r->text[i]), "sample %d: finish %d, '%s'", i,
                  r->fin[i], r->text[i]);
        distinct += i > 0 && strcmp(r->text[i], r->text[0]);
    }
    printf("  samples: '%s' '%s' '%s'\n", r->text[0], r->text[1], r->text[2]);
    CHECK_MSG(distinct > 0, "three samples at temperature 1 all gave '%s'", r->text[0]);

    /* greedy identity: the unconstrained greedy text as a literal, and as a star of its characters */
    CHECK(run(e, NULL, 0, 1, 40, base) == 0);
    CHECK(base->fin[0] == KVLLM_FINISH_LENGTH && base->n_tok[0] == 40);
    printf("  greedy: '%s'\n", base->text[0]);
    char lit[4096], star[1024] = "root ::= [";
    literal(base->text[0], lit, sizeof lit - 16);
    char g1[4200];
    snprintf(g1, sizeof g1, "root ::= %s\n", lit);
    struct kvllm_grammar *exact = gbnf(g1);
    CHECK(run(e, exact, 0, 1, 60, r) == 0);
    CHECK_MSG(r->fin[0] == KVLLM_FINISH_STOP && !strcmp(r->text[0], base->text[0]) && r->n_tok[0] == 40,
              "literal: finish %d, %d tokens, '%s' vs '%s'", r->fin[0], r->n_tok[0], r->text[0], base->text[0]);
    bool seen[256] = { 0 };
    size_t k = strlen(star);
    for (const unsigned char *p = (const unsigned char *)base->text[0]; *p; p++) {
        if (seen[*p]) continue;
        seen[*p] = true;
        if (*p < 0x20 || *p == ']' || *p == '\\' || *p == '-' || *p == '^' || *p >= 0x80)
            k += (size_t)snprintf(star + k, sizeof star - k, "\\x%02X", *p);
        else star[k++] = (char)*p;
    }
    snprintf(star + k, sizeof star - k, "]*\n");
    struct kvllm_grammar *chars = gbnf(star);
    CHECK(run(e, chars, 0, 1, 40, r) == 0);
    CHECK_MSG(r->fin[0] == KVLLM_FINISH_LENGTH && !strcmp(r->text[0], base->text[0]),
              "star %s: finish %d, '%s' vs '%s'", star, r->fin[0], r->text[0], base->text[0]);

    /* abort mid-constraint */
    struct kvllm_grammar *longg = gbnf("root ::= [a-z ]{150,200}\n");
    memset(r, 0, sizeof *r);
    struct kvllm_request q = { .prompt = k_prompt, .n_prompt = 6, .max_tokens = 200, .n = 2, .grammar = longg,
                               .on_event = on_event, .user = r, .sampling = kvllm_sampling_default_params() };
    uint64_t id = 0;
    CHECK(kvllm_engine_add(e, &q, &id) == 0);
    kvllm_grammar_free(longg);   /* the engine holds its own reference */
    for (int s = 0; s < 8; s++) kvllm_engine_step(e);
    CHECK(r->n_tok[0] > 0 && r->fin[0] == KVLLM_FINISH_NONE);
    CHECK(kvllm_engine_abort(e, id) == 0);
    while (!kvllm_engine_idle(e)) kvllm_engine_step(e);
    CHECK(r->fin[0] == KVLLM_FINISH_ABORT && r->fin[1] == KVLLM_FINISH_ABORT);
    blocks_free(e);

    /* a second engine over the same model builds its own index and gives the same greedy text */
    struct kvllm_engine *e2 = NULL;
    CHECK(kvllm_engine_new(m, &ep, &e2) == 0);
    if (e2) {
        struct run *r2 = calloc(1, sizeof *r2);
        CHECK(run(e, words, 0, 1, 64, r) == 0);
        CHECK(run(e2, words, 0, 1, 64, r2) == 0);
        CHECK(!strcmp(r->text[0], r2->text[0]));
        free(r2);
        kvllm_engine_free(e2);
    }

    kvllm_grammar_free(words);
    kvllm_grammar_free(exact);
    kvllm_grammar_free(chars);
    free(r);
    free(base);
    kvllm_engine_free(e);
    kvllm_model_free(m);
    return check_report("test_engine_grammar");
}
