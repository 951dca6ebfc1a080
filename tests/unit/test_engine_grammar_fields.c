/* test_engine_grammar_fields.c — the request fields that shape sampling
 * without a grammar, on stories260K, each against the unconstrained greedy
 * run as reference:
 *   logit_bias      a -100 bias moves greedy off its first choice; +100 on
 *                   EOS ends the sample at once (STOP, 0 tokens);
 *   min_tokens      with EOS forced as above, a sample still gets exactly
 *                   min_tokens tokens (EOS is masked until then), n > 1 too;
 *   stop_token_ids  the sample stops with STOP at the first occurrence of
 *                   the id, which is not part of the tokens or the text;
 *                   before min_tokens it is masked instead;
 *   stop            an empty stop string never matches: the text is the
 *                   reference's;
 *   validation      ids out of range, min_tokens > max_tokens: KVLLM_EINVAL.
 * Every run must leave 0 blocks held. */
#include "check.h"
#include "stories_util.h"
#include "kvllm.h"

#include <stdio.h>
#include <string.h>

#define MAXT 64

struct run {
    int32_t tok[2][MAXT];
    int n_tok[2];
    char text[2][1024];
    enum kvllm_finish fin[2];
    int n_generated[2];
};

static void on_event(const struct kvllm_event *ev, void *user) {
    struct run *r = user;
    int i = ev->index;
    if (ev->token >= 0 && r->n_tok[i] < MAXT) r->tok[i][r->n_tok[i]++] = ev->token;
    strncat(r->text[i], ev->text, sizeof r->text[i] - strlen(r->text[i]) - 1);
    if (ev->finish) { r->fin[i] = ev->finish; r->n_generated[i] = ev->n_generated; }
}

static const int32_t k_prompt[] = { 1, 403, 407, 261, 378, 284 };   /* BOS + a few story tokens */

/* Run one request to the end; returns kvllm_engine_add's code. */
static int run(struct kvllm_engine *e, struct kvllm_request q, struct run *out) {
    memset(out, 0, sizeof *out);
    q.prompt = k_prompt;
    q.n_prompt = (int)(sizeof k_prompt / sizeof *k_prompt);
    if (!q.n) q.n = 1;
    if (!q.max_tokens) q.max_tokens = 40;
    q.sampling = kvllm_sampling_default_params();
    q.sampling.temperature = 0;
    q.on_event = on_event;
    q.user = out;
    int rc = kvllm_engine_add(e, &q, NULL);
    while (!kvllm_engine_idle(e)) kvllm_engine_step(e);
    struct kvllm_engine_stats st;
    kvllm_engine_get_stats(e, &st);
    CHECK_MSG(st.blocks_held == 0, "%d blocks held after a run", st.blocks_held);
    return rc;
}

int main(void) {
    kvllm_log_set_level(KVLLM_LOG_ERROR);
    struct kvllm_model *m = load_stories(1);
    if (!m) return check_report("test_engine_grammar_fields");
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.n_ctx = 256;
    ep.prefix_caching = false;
    struct kvllm_engine *e = NULL;
    CHECK(kvllm_engine_new(m, &ep, &e) == 0);
    if (!e) return check_report("test_engine_grammar_fields");
    const int eos = kvllm_model_describe(m)->token_eos, V = kvllm_model_describe(m)->n_vocab;
    CHECK(eos >= 0);
    struct run *base = calloc(1, sizeof *base), *r = calloc(1, sizeof *r);

    /* the reference: greedy, run past EOS so there are tokens to work with */
    CHECK(run(e, (struct kvllm_request){ .ignore_eos = true }, base) == 0);
    CHECK(base->n_tok[0] == 40 && base->fin[0] == KVLLM_FINISH_LENGTH);

    /* logit_bias: -100 on greedy's first token moves the first choice */
    struct kvllm_logit_bias ban = { base->tok[0][0], -100 };
    CHECK(run(e, (struct kvllm_request){ .ignore_eos = true, .logit_bias = &ban, .n_logit_bias = 1 }, r) == 0);
    CHECK(r->n_tok[0] > 0 && r->tok[0][0] != base->tok[0][0]);
    /* +100 on EOS: the sample ends at once, without a token */
    struct kvllm_logit_bias force_eos = { eos, 100 };
    CHECK(run(e, (struct kvllm_request){ .logit_bias = &force_eos, .n_logit_bias = 1 }, r) == 0);
    CHECK_MSG(r->n_tok[0] == 0 && r->fin[0] == KVLLM_FINISH_STOP, "%d tokens, finish %d", r->n_tok[0], r->fin[0]);

    /* min_tokens: EOS masked until 10 tokens, then the bias takes it at once; both samples of n = 2 */
    CHECK(run(e, (struct kvllm_request){ .logit_bias = &force_eos, .n_logit_bias = 1, .min_tokens = 10, .n = 2 },
              r) == 0);
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(r->n_tok[i] == 10 && r->fin[i] == KVLLM_FINISH_STOP && r->n_generated[i] == 10,
                  "sample %d: %d tokens, finish %d", i, r->n_tok[i], r->fin[i]);
        for (int k = 0; k < r->n_tok[i]; k++) CHECK(r->tok[i][k] != eos);
    }

    /* stop_token_ids: the first occurrence of the 6th greedy token stops the sample before it */
    int32_t stop = base->tok[0][5];
    int first = 0;
    while (base->tok[0][first] != stop) first++;
    CHECK(run(e, (struct kvllm_request){ .ignore_eos = true, .stop_token_ids = &stop, .n_stop_token_ids = 1 }, r) == 0);
    CHECK_MSG(r->n_tok[0] == first && r->fin[0] == KVLLM_FINISH_STOP, "stopped after %d tokens (expected %d), "
              "finish %d", r->n_tok[0], first, r->fin[0]);
    CHECK(!memcmp(r->tok[0], base->tok[0], (size_t)first * sizeof(int32_t)));
    struct run *cut = calloc(1, sizeof *cut);   /* the text is that of the tokens before the stop id */
    CHECK(run(e, (struct kvllm_request){ .ignore_eos = true, .max_tokens = first > 0 ? first : 1 }, cut) == 0);
    if (first > 0) CHECK_MSG(!strcmp(r->text[0], cut->text[0]), "'%s' vs '%s'", r->text[0], cut->text[0]);
    free(cut);
    /* before min_tokens the stop id is masked instead */
    CHECK(run(e, (struct kvllm_request){ .ignore_eos = true, .stop_token_ids = &stop, .n_stop_token_ids = 1,
                                         .min_tokens = first + 1 }, r) == 0);
    CHECK(r->n_tok[0] > first);
    for (int k = 0; k < first + 1 && k < r->n_tok[0]; k++) CHECK(r->tok[0][k] != stop);

    /* stop strings: an empty one never matches (nor holds text back), so the sample is the reference's */
    const char *stops[] = { "", "\x01\x02" };
    CHECK(run(e, (struct kvllm_request){ .ignore_eos = true, .stop = stops, .n_stop = 2 }, r) == 0);
    CHECK_MSG(r->n_tok[0] == 40 && r->fin[0] == KVLLM_FINISH_LENGTH && !strcmp(r->text[0], base->text[0]),
              "%d tokens, finish %d, '%s' vs '%s'", r->n_tok[0], r->fin[0], r->text[0], base->text[0]);

    /* include_stop_str: the stop string (a word of the reference text) stays at the end of the text */
    const char *word = strchr(base->text[0] + 1, ' ');
    if (word && strlen(word) > 3) {
        char stop_word[4] = { word[0], word[1], word[2], 0 };
        const char *sw[] = { stop_word };
        size_t at = (size_t)(strstr(base->text[0], stop_word) - base->text[0]);
        CHECK(run(e, (struct kvllm_request){ .ignore_eos = true, .stop = sw, .n_stop = 1 }, r) == 0);
        CHECK_MSG(strlen(r->text[0]) == at && !strncmp(r->text[0], base->text[0], at), "cut: '%s'", r->text[0]);
        CHECK(run(e, (struct kvllm_request){ .ignore_eos = true, .stop = sw, .n_stop = 1, .include_stop_str = true }, r) == 0);
        CHECK_MSG(strlen(r->text[0]) == at + 3 && !strncmp(r->text[0], base->text[0], at + 3) &&
                  r->fin[0] == KVLLM_FINISH_STOP, "kept: '%s' (stop '%s')", r->text[0], stop_word);
    }

    /* kvllm_engine_add_ex: the failure's message comes back with its status, not only in the log */
    char why[256] = "x";
    struct kvllm_request q = { .prompt = k_prompt, .n_prompt = 6, .max_tokens = 5, .n = 1, .min_tokens = 9,
                               .sampling = kvllm_sampling_default_params(), .on_event = on_event, .user = r };
    CHECK(kvllm_engine_add_ex(e, &q, NULL, why, sizeof why) == KVLLM_EINVAL);
    CHECK_MSG(strstr(why, "min_tokens 9") != NULL, "message: '%s'", why);
    q.min_tokens = 0;
    q.max_tokens = 1000;
    CHECK(kvllm_engine_add_ex(e, &q, NULL, why, sizeof why) == KVLLM_ERANGE && strstr(why, "context"));
    q.max_tokens = 2;
    CHECK(kvllm_engine_add_ex(e, &q, NULL, why, sizeof why) == 0 && !why[0]);
    while (!kvllm_engine_idle(e)) kvllm_engine_step(e);

    /* validation */
    int32_t bad_id = V;
    struct kvllm_logit_bias bad_bias = { -1, 1 };
    CHECK(run(e, (struct kvllm_request){ .stop_token_ids = &bad_id, .n_stop_token_ids = 1 }, r) == KVLLM_EINVAL);
    CHECK(run(e, (struct kvllm_request){ .logit_bias = &bad_bias, .n_logit_bias = 1 }, r) == KVLLM_EINVAL);
    CHECK(run(e, (struct kvllm_request){ .min_tokens = 41 }, r) == KVLLM_EINVAL);
    CHECK(run(e, (struct kvllm_request){ .min_tokens = -1 }, r) == KVLLM_EINVAL);
    CHECK(run(e, (struct kvllm_request){ .n_stop_token_ids = 2 }, r) == KVLLM_EINVAL);

    free(base);
    free(r);
    kvllm_engine_free(e);
    kvllm_model_free(m);
    return check_report("test_engine_grammar_fields");
}
