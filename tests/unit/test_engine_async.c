/* test_engine_async.c — asynchronous scheduling (each step planned while
 * the previous one runs) gives every sequence exactly the events of the
 * synchronous order: the same tokens, text and finish reasons for many
 * concurrent requests mixing greedy and seeded sampling, stop strings,
 * stop ids, max_tokens, min_tokens, EOS, grammars, n > 1 samples, aborts
 * from the event callback,
 * prefix-cache hits, chunked prefill and preemption under a small KV pool.
 * What may differ is only which step admits or preempts whom.  The step
 * loop's trace shows the overlap itself: with the switch on, step t+1 is
 * scheduled after step t's ops are issued and before they are waited for;
 * with it off, never.  Every block is back in the pool at the end.  Run on
 * the normal and the strict backend (KVLLM_BACKEND=strict, ctest's twin). */
#include "check.h"
#include "stories_util.h"
#include "engine/engine_internal.h"

#include <stdio.h>
#include <string.h>

#define N_REQ 14
#define N_SAMPLES 3     /* the n > 1 requests' */
#define MAX_GEN 40
#define MAX_TEXT 2048

struct stream {
    int32_t ids[MAX_GEN + 1];
    int n, n_finish;
    enum kvllm_finish fin;
    char text[MAX_TEXT];
    size_t n_text;
};

struct req_out {
    struct kvllm_engine *e;
    uint64_t id;
    int abort_after;            /* > 0: kvllm_engine_abort from the callback at this many tokens of sample 0 */
    struct stream s[N_SAMPLES];
};

static void on_event(const struct kvllm_event *ev, void *user) {
    struct req_out *o = user;
    CHECK(ev->index >= 0 && ev->index < N_SAMPLES);
    struct stream *s = &o->s[ev->index];
    CHECK_MSG(s->n_finish == 0, "request %llu sample %d: an event after its finish", (unsigned long long)ev->request,
              ev->index);
    if (ev->token >= 0 && s->n <= MAX_GEN) s->ids[s->n++] = ev->token;
    size_t len = strlen(ev->text);
    if (s->n_text + len < MAX_TEXT) {
        memcpy(s->text + s->n_text, ev->text, len);
        s->n_text += len;
    }
    if (ev->finish) { s->fin = ev->finish; s->n_finish++; }
    if (o->abort_after && ev->index == 0 && s->n == o->abort_after && !ev->finish)
        CHECK(kvllm_engine_abort(o->e, o->id) == 0);
}

static struct kvllm_grammar *g_grammar;   /* [a-z ]{3,30}\. */

/* Request k of the mix: its prompt shares a 40-token prefix with every other even one. */
static void add(struct kvllm_engine *e, int k, struct req_out *o) {
    int32_t prompt[72] = { 1 };
    int n_prompt = 8 + (k * 13) % 60;
    for (int i = 1; i < n_prompt; i++) prompt[i] = 3 + ((k % 2 && i < 40 ? 0 : k) * 31 + i * 7) % 500;
    static const char *const stops[] = { "the", "." };
    static const int32_t stop_ids[] = { 13 };
    struct kvllm_request q = { .prompt = prompt, .n_prompt = n_prompt, .max_tokens = 8 + (k * 5) % (MAX_GEN - 8),
                               .n = 1, .sampling = kvllm_sampling_default_params(), .ignore_eos = k % 3 != 0,
                               .on_event = on_event, .user = o };
    q.sampling.seed = 1000 + (uint64_t)k;
    if (k % 2 == 0) q.sampling.temperature = 0;   /* greedy: picked by the backend (n == 1) */
    if (k % 4 == 1) { q.stop = stops + k / 4 % 2; q.n_stop = 1; }
    if (k % 5 == 2) { q.stop_token_ids = stop_ids; q.n_stop_token_ids = 1; }
    if (k % 7 == 3) q.n = N_SAMPLES;
    if (k % 6 == 5) q.sampling.repeat_penalty = 1.3f;   /* greedy or not, sampled on the host */
    if (k % 6 == 0 || k % 6 == 3) q.grammar = g_grammar;   /* its mask depends on the last token */
    if (k % 8 == 7) q.min_tokens = 4;
    memset(o, 0, sizeof *o);
    o->e = e;
    o->abort_after = k % 5 == 4 ? 3 + k % 4 : 0;
    CHECK(kvllm_engine_add(e, &q, &o->id) == 0);
}

struct trace {
    char ev[8192];
    int n;
    struct kvllm_engine *e;
    int fail_issue, n_issue;   /* > 0: the fail_issue-th step issued fails when waited for (a device error) */
};

static void on_trace(void *user, char what) {
    struct trace *t = user;
    if (t->n + 1 < (int)sizeof t->ev) t->ev[t->n++] = what;
    if (what == 'I' && ++t->n_issue == t->fail_issue) t->e->ctx->status = KVLLM_EBACKEND;   /* backend_sync reports it */
}

/* All requests through a fresh engine; a few are added only after some steps ran. */
static void run(struct kvllm_model *m, const struct kvllm_engine_params *ep, struct req_out *out, struct trace *t,
                struct kvllm_engine_stats *st) {
    struct kvllm_engine *e = NULL;
    CHECK(kvllm_engine_new(m, ep, &e) == 0);
    if (!e) return;
    const int fail_issue = t->fail_issue;
    memset(t, 0, sizeof *t);
    t->e = e;
    t->fail_issue = fail_issue;
    engine_test_trace(e, on_trace, t);
    for (int k = 0; k < N_REQ - 4; k++) add(e, k, &out[k]);
    for (int step = 0; !kvllm_engine_idle(e) || step < 4; step++) {
        if (step == 3)
            for (int k = N_REQ - 4; k < N_REQ; k++) add(e, k, &out[k]);
        CHECK(kvllm_engine_step(e) >= 0);
        CHECK(step < 10000);
        if (step >= 10000) break;
    }
    kvllm_engine_get_stats(e, st);
    CHECK_MSG(st->blocks_held == 0, "%d blocks still held when idle", st->blocks_held);
    CHECK(sched_check(&e->sched));
    kvllm_engine_free(e);
}

/* Does the trace show step t+1 scheduled between step t's issue and its wait ("ISW")? */
static bool overlapped(const struct trace *t) { return t->ev[0] && strstr(t->ev, "ISW") != NULL; }

static void compare(const struct req_out *a, const struct req_out *b, const char *what) {
    for (int k = 0; k < N_REQ; k++)
        for (int i = 0; i < N_SAMPLES; i++) {
            const struct stream *x = &a[k].s[i], *y = &b[k].s[i];
            CHECK_MSG(x->n == y->n && !memcmp(x->ids, y->ids, (size_t)x->n * sizeof *x->ids),
                      "%s: request %d sample %d: %d tokens synchronously, %d asynchronously (or other ids)", what, k,
                      i, x->n, y->n);
            CHECK_MSG(x->fin == y->fin && x->n_finish == y->n_finish, "%s: request %d sample %d: finish %d vs %d", what,
                      k, i, x->fin, y->fin);
            CHECK_MSG(x->n_text == y->n_text && !memcmp(x->text, y->text, x->n_text), "%s: request %d sample %d: text "
                      "'%.*s' vs '%.*s'", what, k, i, (int)x->n_text, x->text, (int)y->n_text, y->text);
        }
}

/* The mix must exercise what it claims: stops, aborts, EOS or stop ids, limits. */
static void check_mix(const struct req_out *o) {
    int fin[5] = { 0 }, sampled_n = 0;
    for (int k = 0; k < N_REQ; k++)
        for (int i = 0; i < N_SAMPLES; i++) {
            if (o[k].s[i].n_finish) fin[o[k].s[i].fin]++;
            sampled_n += i > 0 && o[k].s[i].n > 0;
        }
    CHECK_MSG(fin[KVLLM_FINISH_STOP] > 0 && fin[KVLLM_FINISH_LENGTH] > 0 && fin[KVLLM_FINISH_ABORT] > 0,
              "finishes: %d stop, %d length, %d abort", fin[KVLLM_FINISH_STOP], fin[KVLLM_FINISH_LENGTH],
              fin[KVLLM_FINISH_ABORT]);
    CHECK(fin[KVLLM_FINISH_ERROR] == 0);
    CHECK(sampled_n > 0);
}

static struct req_out g_sync[N_REQ], g_async[N_REQ];

static void check_setting(struct kvllm_model *m, const char *what, int kv_tokens, int max_batch_tokens, int max_seqs,
                          bool prefix_caching) {
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.n_ctx = 128;
    ep.kv_tokens = kv_tokens;
    ep.max_batch_tokens = max_batch_tokens;
    ep.max_seqs = max_seqs;
    ep.prefix_caching = prefix_caching;
    struct trace t_sync = { 0 }, t_async = { 0 };
    struct kvllm_engine_stats st_sync, st_async;
    ep.async_scheduling = KVLLM_ASYNC_OFF;
    run(m, &ep, g_sync, &t_sync, &st_sync);
    ep.async_scheduling = KVLLM_ASYNC_ON;
    run(m, &ep, g_async, &t_async, &st_async);
    printf("%s: %llu/%llu steps, %llu/%llu preemptions, %llu/%llu cached prompt tokens (sync/async)\n", what,
           (unsigned long long)st_sync.steps, (unsigned long long)st_async.steps,
           (unsigned long long)st_sync.preemptions, (unsigned long long)st_async.preemptions,
           (unsigned long long)st_sync.cached_tokens, (unsigned long long)st_async.cached_tokens);
    if (kv_tokens) CHECK_MSG(st_sync.preemptions > 0 && st_async.preemptions > 0, "%s: no preemption", what);
    if (prefix_caching) CHECK_MSG(st_sync.cached_tokens > 0 && st_async.cached_tokens > 0, "%s: no prefix hit", what);
    compare(g_sync, g_async, what);
    check_mix(g_sync);
    CHECK_MSG(!overlapped(&t_sync), "%s: synchronous, yet a step was scheduled before the previous one's wait", what);
    CHECK_MSG(overlapped(&t_async), "%s: asynchronous, yet no step was scheduled before the previous one's wait: %.60s",
              what, t_async.ev);
    /* the default (AUTO) is the synchronous order on the CPU */
    ep.async_scheduling = KVLLM_ASYNC_AUTO;
    run(m, &ep, g_async, &t_async, &st_async);
    compare(g_sync, g_async, what);
    CHECK(!overlapped(&t_async));
}

/* A step that fails when waited for (as a device error shows on CUDA), after the next one was planned:
 * its requests end with one ERROR event each, after a prefix of their tokens; every other request gets
 * exactly its tokens; nothing stays held (run checks). */
static void check_failed_step(struct kvllm_model *m) {
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.n_ctx = 128;
    ep.max_batch_tokens = 24;
    struct trace t = { 0 };
    struct kvllm_engine_stats st;
    ep.async_scheduling = KVLLM_ASYNC_OFF;
    run(m, &ep, g_sync, &t, &st);
    ep.async_scheduling = KVLLM_ASYNC_ON;
    t.fail_issue = 12;
    run(m, &ep, g_async, &t, &st);
    CHECK(st.failed_steps == 1 && strstr(t.ev, "ISW") != NULL);
    int n_failed = 0;
    for (int k = 0; k < N_REQ; k++)
        for (int i = 0; i < N_SAMPLES; i++) {
            const struct stream *x = &g_sync[k].s[i], *y = &g_async[k].s[i];
            if (y->fin == KVLLM_FINISH_ERROR) {
                n_failed++;
                CHECK(y->n_finish == 1 && y->n <= x->n && !memcmp(x->ids, y->ids, (size_t)y->n * sizeof *y->ids));
                continue;
            }
            CHECK_MSG(x->n == y->n && !memcmp(x->ids, y->ids, (size_t)x->n * sizeof *x->ids) && x->fin == y->fin,
                      "failed step: request %d sample %d not in it, yet its tokens differ", k, i);
        }
    CHECK(n_failed > 0);
    printf("a step failing at its wait after the next was planned: %d samples ended with an error, the others "
           "unchanged\n", n_failed);
}

int main(void) {
    struct kvllm_model *m = load_stories(1);
    if (!m) return check_report("test_engine_async");
    char err[256];
    CHECK(kvllm_grammar_from_regex("[a-z ]{3,30}\\.", &g_grammar, err, sizeof err) == 0);
    check_setting(m, "default", 0, 512, 32, true);
    check_setting(m, "chunked prefill", 0, 24, 32, true);
    check_setting(m, "few sequences", 0, 512, 3, true);
    check_setting(m, "preemption", 192, 64, 16, true);
    check_setting(m, "preemption, no prefix cache", 192, 64, 16, false);
    check_failed_step(m);
    kvllm_grammar_free(g_grammar);
    kvllm_model_free(m);
    return check_report("test_engine_async");
}
