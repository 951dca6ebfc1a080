/* test_engine_graph.c — the engine's recorded forwards against eager steps:
 * the same requests on stories260K (prefill in chunks of 12 tokens, decode,
 * prefill and decode mixed in one step; greedy picked by the backend,
 * greedy with logits, sampled, n = 2 forks) through an engine that records
 * and replays its forwards (the default) and one with enforce_eager give
 * the same tokens and the same logits bytes; a session's logits (a prefill
 * chunk, then one token per call: rows copied out of the one download)
 * too; and with the steps padded as for a capturing backend (CUDA: small
 * steps padded to its graph sizes with copies of the first token that
 * store nothing, ctx_hi rounded up).  The replaying engine really replays,
 * and keeps few recordings for many steps; the eager one records nothing.  Runs on the strict backend
 * too (KVLLM_BACKEND=strict). */
#include "check.h"
#include "stories_util.h"
#include "engine/engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_REQ 6
#define N_GEN 20
#define V_MAX 512

struct out {
    int32_t ids[2][N_GEN];
    int n[2];
    float logits[N_GEN][V_MAX];   /* want_logits requests: each token's row */
    int n_logits, V;
};

static void on_event(const struct kvllm_event *ev, void *user) {
    struct out *o = user;
    if (ev->token < 0 || o->n[ev->index] >= N_GEN) return;
    if (ev->logits && o->n_logits < N_GEN) memcpy(o->logits[o->n_logits++], ev->logits, (size_t)o->V * sizeof(float));
    o->ids[ev->index][o->n[ev->index]++] = ev->token;
}

/* Request k: its own prompt (some share a prefix), its own kind of sampling. */
static void add(struct kvllm_engine *e, int k, struct out *o, int V) {
    int32_t prompt[30] = { 1 };
    const int n_prompt = 6 + 4 * k;
    for (int i = 1; i < n_prompt; i++) prompt[i] = 3 + (i < 8 ? i * 13 : (k * 37 + i * 11)) % 400;
    struct kvllm_request q = { .prompt = prompt, .n_prompt = n_prompt, .max_tokens = N_GEN,
                               .n = k == 4 ? 2 : 1, .sampling = kvllm_sampling_default_params(),
                               .ignore_eos = true, .no_text = true, .want_logits = k == 1 || k == 5,
                               .on_event = on_event, .user = o };
    q.sampling.temperature = k >= 3 ? 0.9f : 0;
    q.sampling.seed = (uint64_t)k;
    memset(o, 0, sizeof *o);
    o->V = V;
    CHECK(kvllm_engine_add(e, &q, NULL) == 0);
}

static struct engine_run { struct out o[N_REQ]; uint64_t steps, recorded, replayed; } g_run[3];

/* pad: as for a backend that captures its lists (CUDA), small steps padded to the captured sizes and
 * ctx_hi rounded up: the padded tokens must change nothing */
static void run_engine(struct kvllm_model *m, bool eager, bool pad, struct engine_run *r) {
    const int V = kvllm_model_describe(m)->n_vocab;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.kv_tokens = 2048;
    ep.n_ctx = 96;
    ep.max_batch_tokens = 12;   /* prompts in chunks, mixed with others' decodes */
    ep.enforce_eager = eager;
    struct kvllm_engine *e = NULL;
    CHECK(kvllm_engine_new(m, &ep, &e) == 0);
    if (!e) return;
    CHECK(e->in.use_graphs == !eager);
    e->in.pad = pad;
    for (int k = 0; k < N_REQ; k++) {
        add(e, k, &r->o[k], V);
        kvllm_engine_step(e);   /* staggered: later prompts arrive while earlier ones decode */
    }
    while (!kvllm_engine_idle(e)) kvllm_engine_step(e);
    r->steps = e->st.steps;
    r->recorded = e->in.n_recorded;
    r->replayed = e->in.n_replayed;
    kvllm_engine_free(e);
}

/* A session's logits: 10 tokens in chunks of 4 (all rows), then 6 one at a time (the last row). */
static void run_session(struct kvllm_model *m, bool eager, float *out, int V) {
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.enforce_eager = eager;
    struct kvllm_session_params sp = { .n_ctx = 64, .kv_type = "f32", .max_batch = 4, .engine = &ep };
    struct kvllm_session *s = NULL;
    CHECK(kvllm_session_new(m, &sp, &s) == 0);
    if (!s) return;
    int32_t toks[16];
    for (int i = 0; i < 16; i++) toks[i] = 1 + (i * 29) % 500;
    CHECK(kvllm_session_eval(s, toks, 10, true, out) == 0);
    for (int i = 10; i < 16; i++) CHECK(kvllm_session_eval(s, toks + i, 1, false, out + (size_t)i * V) == 0);
    struct kvllm_engine *e = session_engine(s);
    CHECK(eager ? e->in.n_replayed == 0 : e->in.n_replayed > 0);
    kvllm_session_free(s);
}

int main(void) {
    struct kvllm_model *m = load_stories(2);
    if (!m) return check_report("test_engine_graph");
    const int V = kvllm_model_describe(m)->n_vocab;
    CHECK(V <= V_MAX);
    run_engine(m, true, false, &g_run[0]);
    run_engine(m, false, false, &g_run[1]);
    run_engine(m, false, true, &g_run[2]);
    for (int k = 0; k < 2 * N_REQ; k++) {
        const struct out *a = &g_run[0].o[k % N_REQ], *b = &g_run[1 + k / N_REQ].o[k % N_REQ];
        CHECK_MSG(a->n[0] == N_GEN && memcmp(a->n, b->n, sizeof a->n) == 0, "request %d: %d / %d tokens", k,
                  a->n[0], b->n[0]);
        CHECK_MSG(memcmp(a->ids, b->ids, sizeof a->ids) == 0, "request %d: replayed tokens differ from eager", k);
        CHECK(a->n_logits == b->n_logits && a->n_logits == ((k % N_REQ == 1 || k % N_REQ == 5) ? N_GEN : 0));
        CHECK_MSG(memcmp(a->logits, b->logits, sizeof a->logits) == 0, "request %d: logits bytes differ", k);
    }
    printf("  eager: %llu steps; replayed: %llu steps, %llu recordings for %llu replays\n",
           (unsigned long long)g_run[0].steps, (unsigned long long)g_run[1].steps,
           (unsigned long long)g_run[1].recorded, (unsigned long long)g_run[1].replayed);
    CHECK(g_run[0].recorded == 0 && g_run[0].replayed == 0);
    CHECK(g_run[1].replayed == g_run[1].steps && g_run[1].recorded < g_run[1].replayed / 2);
    CHECK(g_run[2].replayed == g_run[2].steps && g_run[2].recorded <= g_run[1].recorded);

    float *s0 = calloc(16 * (size_t)V, sizeof *s0), *s1 = calloc(16 * (size_t)V, sizeof *s1);
    CHECK(s0 && s1);
    if (s0 && s1) {
        run_session(m, true, s0, V);
        run_session(m, false, s1, V);
        CHECK_MSG(memcmp(s0, s1, 16 * (size_t)V * sizeof *s0) == 0, "session logits differ");
    }
    free(s0);
    free(s1);
    kvllm_model_free(m);
    return check_report("test_engine_graph");
}
