/* test_engine_sample_stage.c — sampling as a stage of the backend: a plain
 * greedy request's token is picked by the backend's argmax op and only its
 * id leaves the backend; every other request (logits wanted, penalties,
 * n > 1, temperature) is sampled on the host from downloaded logits.  Both
 * routes must give the same tokens: plain greedy requests, mixed in one
 * engine with host-sampled ones, produce exactly the tokens of the same
 * prompts run greedily with want_logits (the host sampler), whose events
 * carry the logits the token is the argmax of. */
#include "check.h"
#include "stories_util.h"
#include "engine/engine_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define N_GEN 24
#define N_REQ 8

struct out {
    int32_t ids[2][N_GEN];
    int n[2];
    int n_with_logits, n_argmax_ok, n_finish;
    int V;
};

static void on_event(const struct kvllm_event *ev, void *user) {
    struct out *o = user;
    if (ev->token >= 0 && o->n[ev->index] < N_GEN) o->ids[ev->index][o->n[ev->index]++] = ev->token;
    if (ev->token >= 0 && ev->logits) {
        o->n_with_logits++;
        int best = 0;   /* the host sampler's greedy: largest logit, lowest id on ties */
        for (int v = 1; v < o->V; v++)
            if (ev->logits[v] > ev->logits[best]) best = v;
        if (best == ev->token) o->n_argmax_ok++;
    }
    if (ev->finish) o->n_finish++;
}

/* kind 0: plain greedy (backend); 1: greedy + want_logits (host); 2: greedy
 * with n = 2 (host); 3: temperature 0.9 (host) */
static void add(struct kvllm_engine *e, int k, int kind, struct out *o, int V) {
    int32_t prompt[10] = { 1 };
    for (int i = 1; i < 10; i++) prompt[i] = 3 + (k * 37 + i * 11) % 400;
    struct kvllm_request q = { .prompt = prompt, .n_prompt = 10, .max_tokens = N_GEN, .n = kind == 2 ? 2 : 1,
                               .sampling = kvllm_sampling_default_params(), .ignore_eos = true, .no_text = true,
                               .want_logits = kind == 1, .on_event = on_event, .user = o };
    q.sampling.temperature = kind == 3 ? 0.9f : 0;
    q.sampling.seed = (uint64_t)k;
    memset(o, 0, sizeof *o);
    o->V = V;
    CHECK(kvllm_engine_add(e, &q, NULL) == 0);
}

static void drain(struct kvllm_engine *e) { while (!kvllm_engine_idle(e)) kvllm_engine_step(e); }

int main(void) {
    struct kvllm_model *m = load_stories(2);
    if (!m) return check_report("test_engine_sample_stage");
    const int V = kvllm_model_describe(m)->n_vocab;
    struct kvllm_engine *e = NULL;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.kv_tokens = 1024;
    ep.n_ctx = 64;
    CHECK(kvllm_engine_new(m, &ep, &e) == 0);
    if (!e) { kvllm_model_free(m); return check_report("test_engine_sample_stage"); }

    /* the host route alone: greedy with logits wanted, one prompt at a time */
    static struct out ref[N_REQ], o[N_REQ], smp[N_REQ];
    for (int k = 0; k < N_REQ; k++) { add(e, k, 1, &ref[k], V); drain(e); }
    for (int k = 0; k < N_REQ; k++)
        CHECK_MSG(ref[k].n[0] == N_GEN && ref[k].n_with_logits == N_GEN && ref[k].n_argmax_ok == N_GEN,
                  "host greedy %d: %d tokens, %d with logits, %d their argmax", k, ref[k].n[0],
                  ref[k].n_with_logits, ref[k].n_argmax_ok);
    CHECK(e->n_backend_picked == 0);

    /* all routes in one engine at once: plain greedy (backend), greedy with
     * logits, greedy n = 2, sampled */
    for (int k = 0; k < N_REQ; k++) {
        add(e, k, 0, &o[k], V);
        add(e, k + 100, (k % 3) + 1, &smp[k], V);
    }
    drain(e);
    int same = 0;
    for (int k = 0; k < N_REQ; k++) {
        CHECK_MSG(o[k].n[0] == N_GEN && o[k].n_with_logits == 0, "backend greedy %d: %d tokens, %d with logits", k,
                  o[k].n[0], o[k].n_with_logits);
        same += memcmp(o[k].ids[0], ref[k].ids[0], sizeof o[k].ids[0]) == 0;
        if ((k % 3) + 1 == 2)   /* greedy n = 2 on the host: both samples are the greedy sequence */
            CHECK(memcmp(smp[k].ids[0], smp[k].ids[1], sizeof smp[k].ids[0]) == 0);
    }
    CHECK_MSG(same == N_REQ, "%d of %d backend-greedy requests gave the host sampler's tokens", same, N_REQ);
    CHECK_MSG(e->n_backend_picked == (uint64_t)N_REQ * N_GEN, "%llu tokens picked in the backend, want %d",
              (unsigned long long)e->n_backend_picked, N_REQ * N_GEN);
    struct kvllm_engine_stats st;
    kvllm_engine_get_stats(e, &st);
    CHECK(st.blocks_held == 0);
    printf("  %d greedy requests picked in the backend (%llu tokens) = the host sampler's tokens; "
           "%d host-sampled requests alongside\n", N_REQ, (unsigned long long)e->n_backend_picked, N_REQ);
    kvllm_engine_free(e);
    kvllm_model_free(m);
    return check_report("test_engine_sample_stage");
}
