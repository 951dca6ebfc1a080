/* test_engine_faults.c — a step that fails: an injected backend error (an
 * allocation the device could not make, a kernel that failed) inside the
 * forward pass ends the requests of that step with KVLLM_FINISH_ERROR; the
 * engine goes on, the requests that were not in that step complete with
 * exactly the tokens they get alone, and no block stays held.  Sessions
 * report the failure as KVLLM_EBACKEND and start again empty. */
#include "check.h"
#include "stories_util.h"
#include "engine/engine_internal.h"

#include <stdio.h>
#include <string.h>

#define N_GEN 16

struct out { int32_t ids[N_GEN]; int n; enum kvllm_finish fin; int n_finish; };

static void on_event(const struct kvllm_event *ev, void *user) {
    struct out *o = user;
    if (ev->token >= 0 && o->n < N_GEN) o->ids[o->n++] = ev->token;
    if (ev->finish) { o->fin = ev->finish; o->n_finish++; }
}

static void add(struct kvllm_engine *e, int k, struct out *o) {
    int32_t prompt[12] = { 1 };
    for (int i = 1; i < 12; i++) prompt[i] = 3 + (k * 31 + i * 7) % 400;
    struct kvllm_request q = { .prompt = prompt, .n_prompt = 12, .max_tokens = N_GEN, .n = 1 + k % 2,
                               .sampling = kvllm_sampling_default_params(), .ignore_eos = true, .no_text = true,
                               .on_event = on_event, .user = o };
    q.sampling.temperature = 0;
    memset(o, 0, sizeof *o);
    CHECK(kvllm_engine_add(e, &q, NULL) == 0);
}

static void drain(struct kvllm_engine *e) { while (!kvllm_engine_idle(e)) kvllm_engine_step(e); }

/* async: the failing step was planned while the one before it ran (asynchronous scheduling) */
static void check_fault(struct kvllm_model *m, int code, long after, enum kvllm_async async) {
    struct kvllm_engine *e = NULL;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.kv_tokens = 256;
    ep.n_ctx = 64;
    ep.async_scheduling = async;
    CHECK(kvllm_engine_new(m, &ep, &e) == 0);
    if (!e) return;
    struct out alone[3], o[3];
    for (int k = 0; k < 3; k++) { add(e, k, &alone[k]); drain(e); }
    /* requests 0 and 1 run together; a step of theirs fails after `after` ops */
    add(e, 0, &o[0]);
    add(e, 1, &o[1]);
    kvllm_engine_step(e);
    kvllm_engine_step(e);
    engine_test_fail_op(e, after, code);
    kvllm_engine_step(e);
    /* request 2 arrives after the failure */
    add(e, 2, &o[2]);
    drain(e);
    struct kvllm_engine_stats st;
    kvllm_engine_get_stats(e, &st);
    for (int k = 0; k < 2; k++)
        CHECK_MSG(o[k].fin == KVLLM_FINISH_ERROR && o[k].n_finish == 1 + k % 2, "request %d: finish %d (%d events)",
                  k, (int)o[k].fin, o[k].n_finish);
    CHECK(o[2].fin == KVLLM_FINISH_LENGTH && o[2].n == N_GEN && memcmp(o[2].ids, alone[2].ids, sizeof o[2].ids) == 0);
    CHECK(st.failed_steps == 1);
    CHECK_MSG(st.blocks_held == 0, "%d blocks held", st.blocks_held);
    /* the engine is whole again: the failed requests run again as alone */
    add(e, 0, &o[0]);
    drain(e);
    CHECK(o[0].fin == KVLLM_FINISH_LENGTH && memcmp(o[0].ids, alone[0].ids, sizeof o[0].ids) == 0);
    kvllm_engine_get_stats(e, &st);
    CHECK(st.blocks_held == 0);
    if (async == KVLLM_ASYNC_ON) CHECK(st.steps_planned_ahead > 0);
    printf("  %s injected at op %ld%s: 2 requests ended with an error, the next one matched its solo run, "
           "%d blocks held\n", kvllm_strerror(code), after, async == KVLLM_ASYNC_ON ? " (async)" : "", st.blocks_held);
    kvllm_engine_free(e);
}

static void check_session(struct kvllm_model *m) {
    struct kvllm_session *s = NULL;
    struct kvllm_session_params sp = { .n_ctx = 64 };
    CHECK(kvllm_session_new(m, &sp, &s) == 0);
    if (!s) return;
    const int V = kvllm_model_describe(m)->n_vocab;
    float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
    int32_t ids[8] = { 1, 30, 40, 50, 60, 70, 80, 90 };
    CHECK(kvllm_session_eval(s, ids, 8, false, a) == 0);
    kvllm_session_truncate(s, 0);
    engine_test_fail_op(session_engine(s), 5, KVLLM_ENOMEM);
    CHECK(kvllm_session_eval(s, ids, 8, false, b) == KVLLM_EBACKEND);
    CHECK(kvllm_session_n_past(s) == 0);
    CHECK(kvllm_session_eval(s, ids, 8, false, b) == 0);
    CHECK(memcmp(a, b, (size_t)V * sizeof *a) == 0);
    free(a);
    free(b);
    kvllm_session_free(s);
}

int main(void) {
    struct kvllm_model *m = load_stories(1);
    if (!m) return check_report("test_engine_faults");
    fprintf(stderr, "(the step errors below are injected)\n");
    for (int a = 0; a < 2; a++) {
        const enum kvllm_async async = a ? KVLLM_ASYNC_ON : KVLLM_ASYNC_OFF;
        check_fault(m, KVLLM_ENOMEM, 1, async);       /* the first op of the step: its uploads went, nothing ran */
        check_fault(m, KVLLM_EBACKEND, 23, async);    /* a kernel error in the middle of the layers */
    }
    check_session(m);
    kvllm_model_free(m);
    return check_report("test_engine_faults");
}
