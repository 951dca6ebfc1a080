/* test_engine_sample_stage.c — sampling as a stage of the backend: a plain
 * greedy request's token is picked by the backend's argmax op, a request
 * sampled with nothing but temperature, top-k, top-p, min-p and its seed is
 * drawn by the backend's sample op, and only their ids leave the backend;
 * every other request (logits wanted, penalties, n > 1) is sampled on the
 * host from downloaded logits.  Both routes must give the same tokens:
 *   1. greedy: plain requests, mixed in one engine with host-sampled ones,
 *      produce exactly the tokens of the same prompts run with want_logits
 *      (the host sampler), whose events carry the logits the token is the
 *      argmax of;
 *   2. sampled: for each chain (the default; top-p alone; top-k alone;
 *      min-p alone, whose draw walks ids in order; temperature alone; tiny
 *      and large temperatures; top-k 1; a tiny top-p) and seed, the backend
 *      route gives the host route's tokens, one request at a time and all
 *      at once beside greedy, host-sampled and n = 2 requests. */
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
 * with n = 2 (host); 3: temperature 0.9, else the defaults (backend sample
 * op); 4: the same with a repeat penalty (host) */
static void add(struct kvllm_engine *e, int k, int kind, struct out *o, int V) {
    int32_t prompt[10] = { 1 };
    for (int i = 1; i < 10; i++) prompt[i] = 3 + (k * 37 + i * 11) % 400;
    struct kvllm_request q = { .prompt = prompt, .n_prompt = 10, .max_tokens = N_GEN, .n = kind == 2 ? 2 : 1,
                               .sampling = kvllm_sampling_default_params(), .ignore_eos = true, .no_text = true,
                               .want_logits = kind == 1, .on_event = on_event, .user = o };
    q.sampling.temperature = kind >= 3 ? 0.9f : 0;
    if (kind == 4) q.sampling.repeat_penalty = 1.1f;
    q.sampling.seed = (uint64_t)k;
    memset(o, 0, sizeof *o);
    o->V = V;
    CHECK(kvllm_engine_add(e, &q, NULL) == 0);
}

/* A sampled request of chain ch and seed, on the host route (want_logits)
 * or wherever the engine puts it. */
static void add_sampled(struct kvllm_engine *e, int k, const struct kvllm_sampling_params *ch, bool host,
                        struct out *o, int V) {
    int32_t prompt[6] = { 1 };
    for (int i = 1; i < 6; i++) prompt[i] = 3 + (k * 53 + i * 7) % 450;
    struct kvllm_request q = { .prompt = prompt, .n_prompt = 6, .max_tokens = N_GEN, .n = 1, .sampling = *ch,
                               .ignore_eos = true, .no_text = true, .want_logits = host, .on_event = on_event,
                               .user = o };
    q.sampling.seed = 1000 + (uint64_t)k;
    memset(o, 0, sizeof *o);
    o->V = V;
    CHECK(kvllm_engine_add(e, &q, NULL) == 0);
}

static void drain(struct kvllm_engine *e) { while (!kvllm_engine_idle(e)) kvllm_engine_step(e); }

static void test_greedy(struct kvllm_engine *e, int V) {
    /* the host route alone: greedy with logits wanted, one prompt at a time */
    static struct out ref[N_REQ], o[N_REQ], smp[N_REQ];
    for (int k = 0; k < N_REQ; k++) { add(e, k, 1, &ref[k], V); drain(e); }
    for (int k = 0; k < N_REQ; k++)
        CHECK_MSG(ref[k].n[0] == N_GEN && ref[k].n_with_logits == N_GEN && ref[k].n_argmax_ok == N_GEN,
                  "host greedy %d: %d tokens, %d with logits, %d their argmax", k, ref[k].n[0],
                  ref[k].n_with_logits, ref[k].n_argmax_ok);
    CHECK(e->n_backend_picked == 0);

    /* all routes in one engine at once: plain greedy (backend), greedy with
     * logits, greedy n = 2, sampled (backend), sampled with a penalty */
    for (int k = 0; k < N_REQ; k++) {
        add(e, k, 0, &o[k], V);
        add(e, k + 100, (k % 4) + 1, &smp[k], V);
    }
    drain(e);
    int same = 0;
    for (int k = 0; k < N_REQ; k++) {
        CHECK_MSG(o[k].n[0] == N_GEN && o[k].n_with_logits == 0, "backend greedy %d: %d tokens, %d with logits", k,
                  o[k].n[0], o[k].n_with_logits);
        CHECK_MSG(smp[k].n[0] == N_GEN, "request %d beside: %d tokens", k, smp[k].n[0]);
        same += memcmp(o[k].ids[0], ref[k].ids[0], sizeof o[k].ids[0]) == 0;
        if ((k % 4) + 1 == 2)   /* greedy n = 2 on the host: both samples are the greedy sequence */
            CHECK(memcmp(smp[k].ids[0], smp[k].ids[1], sizeof smp[k].ids[0]) == 0);
    }
    CHECK_MSG(same == N_REQ, "%d of %d backend-greedy requests gave the host sampler's tokens", same, N_REQ);
    CHECK_MSG(e->n_backend_picked == (uint64_t)N_REQ * N_GEN, "%llu tokens picked in the backend, want %d",
              (unsigned long long)e->n_backend_picked, N_REQ * N_GEN);
    printf("  %d greedy requests picked in the backend (%llu tokens) = the host sampler's tokens; "
           "%d host-sampled and backend-sampled requests alongside\n", N_REQ,
           (unsigned long long)e->n_backend_picked, N_REQ);
}

/* The chains: each with its own truncations' paths through the chain. */
static struct kvllm_sampling_params chain(int i) {
    struct kvllm_sampling_params p = kvllm_sampling_default_params();   /* T 0.8, k 40, p 0.95, min-p 0.05 */
    switch (i) {
    case 1: p.top_k = 0; p.min_p = 0; p.top_p = 0.9f; p.temperature = 1.2f; break;   /* top-p over all */
    case 2: p.top_k = 7; p.top_p = 1; p.min_p = 0; p.temperature = 1; break;
    case 3: p.top_k = 0; p.top_p = 1; p.min_p = 0.1f; p.temperature = 1; break;       /* unsorted: id order */
    case 4: p.top_k = 0; p.top_p = 1; p.min_p = 0; p.temperature = 1.5f; break;       /* temperature alone */
    case 5: p.temperature = 1e-3f; break;
    case 6: p.top_k = 0; p.top_p = 1; p.min_p = 0; p.temperature = 100; break;
    case 7: p.top_k = 1; p.temperature = 1; break;
    case 8: p.top_k = 0; p.top_p = 1e-6f; p.min_p = 0; p.temperature = 2; break;
    }
    return p;
}
#define N_CHAIN 9
#define N_SEED 3

static void test_sampled(struct kvllm_engine *e, int V) {
    static struct out host[N_CHAIN][N_SEED], one[N_CHAIN][N_SEED], all[N_CHAIN][N_SEED], beside[N_REQ];
    for (int c = 0; c < N_CHAIN; c++) {
        const struct kvllm_sampling_params p = chain(c);
        for (int s = 0; s < N_SEED; s++) {
            add_sampled(e, c * N_SEED + s, &p, true, &host[c][s], V);
            drain(e);
            const uint64_t before = e->n_backend_sampled;
            add_sampled(e, c * N_SEED + s, &p, false, &one[c][s], V);
            drain(e);
            CHECK_MSG(e->n_backend_sampled - before == N_GEN, "chain %d seed %d: %llu tokens drawn in the backend",
                      c, s, (unsigned long long)(e->n_backend_sampled - before));
        }
    }
    /* all at once, beside greedy (argmax), greedy with logits, n = 2 and penalized requests */
    for (int c = 0; c < N_CHAIN; c++) {
        const struct kvllm_sampling_params p = chain(c);
        for (int s = 0; s < N_SEED; s++) add_sampled(e, c * N_SEED + s, &p, false, &all[c][s], V);
        if (c < N_REQ) add(e, c + 200, c % 5, &beside[c], V);
    }
    drain(e);
    int same_one = 0, same_all = 0, n_varied = 0;
    for (int c = 0; c < N_CHAIN; c++)
        for (int s = 0; s < N_SEED; s++) {
            CHECK_MSG(host[c][s].n[0] == N_GEN && one[c][s].n[0] == N_GEN && all[c][s].n[0] == N_GEN,
                      "chain %d seed %d: %d / %d / %d tokens", c, s, host[c][s].n[0], one[c][s].n[0],
                      all[c][s].n[0]);
            const bool a = memcmp(one[c][s].ids[0], host[c][s].ids[0], sizeof one[c][s].ids[0]) == 0;
            const bool b = memcmp(all[c][s].ids[0], host[c][s].ids[0], sizeof all[c][s].ids[0]) == 0;
            CHECK_MSG(a && b, "chain %d seed %d: the backend's tokens differ from the host sampler's (%s)", c, s,
                      a ? "in a batch" : "alone");
            same_one += a;
            same_all += b;
            n_varied += s > 0 && memcmp(host[c][s].ids[0], host[c][0].ids[0], sizeof host[c][s].ids[0]) != 0;
        }
    /* the seeds matter (a draw is really taken), except where the chain leaves one candidate */
    CHECK_MSG(n_varied >= 8, "only %d seeded runs differ from their chain's first seed", n_varied);
    for (int k = 0; k < N_REQ && k < N_CHAIN; k++) CHECK(beside[k].n[0] == N_GEN);
    printf("  %d chains x %d seeds sampled in the backend = the host sampler's tokens: %d alone, %d in one "
           "batch with greedy and host-sampled requests (%llu tokens drawn in the backend)\n", N_CHAIN, N_SEED,
           same_one, same_all, (unsigned long long)e->n_backend_sampled);
}

int main(void) {
    struct kvllm_model *m = load_stories(2);
    if (!m) return check_report("test_engine_sample_stage");
    const int V = kvllm_model_describe(m)->n_vocab;
    struct kvllm_engine *e = NULL;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.kv_tokens = 2048;
    ep.n_ctx = 64;
    CHECK(kvllm_engine_new(m, &ep, &e) == 0);
    if (!e) { kvllm_model_free(m); return check_report("test_engine_sample_stage"); }
    CHECK_MSG(backend_supports(e->ctx->be, BACKEND_OP_SAMPLE, 0), "backend %s has no sample op", e->ctx->ops->name);
    test_greedy(e, V);
    test_sampled(e, V);
    struct kvllm_engine_stats st;
    kvllm_engine_get_stats(e, &st);
    CHECK(st.blocks_held == 0);
    kvllm_engine_free(e);
    kvllm_model_free(m);
    return check_report("test_engine_sample_stage");
}
