/* test_engine_spec.c — speculative decoding changes nothing but the speed.
 *
 * The reference is the same engine without speculation.  For 32 prompts
 * (stories260K), prompt lookup and a draft model (stories260K drafting for
 * itself) must give the same tokens, finish reasons and texts as plain
 * decoding: greedy and sampled (temperature 0.8, per-request seeds), with
 * stop strings and n = 2 samples, one request at a time and all 32 under
 * continuous batching, and in a pool so small that sequences are preempted
 * mid-speculation.  After every run no block is held.  Along the way every
 * step checks the pool's invariants and that a published block holds only
 * tokens its sequence kept (never a draft that was rejected).  Aborts in
 * the middle of speculation leave no block held.  The self-drafting model
 * accepts every draft at temperature 0. */
#include "check.h"
#include "stories_util.h"
#include "engine/engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_PROMPTS 32
#define MAX_TOK 48
#define MAX_OUT (2 * MAX_TOK)

struct out {
    int32_t ids[2][MAX_OUT];
    int n[2];
    enum kvllm_finish fin[2];
    char text[2][1024];
    size_t len[2];
};

static void on_event(const struct kvllm_event *ev, void *user) {
    struct out *o = user;
    const int i = ev->index;
    if (ev->token >= 0 && o->n[i] < MAX_OUT) o->ids[i][o->n[i]++] = ev->token;
    size_t l = strlen(ev->text);
    if (o->len[i] + l < sizeof o->text[i]) {
        memcpy(o->text[i] + o->len[i], ev->text, l);
        o->len[i] += l;
    }
    if (ev->finish) o->fin[i] = ev->finish;
}

static const char *k_words[] = { "Once upon a time", "Lily", "The cat", "Tom and his dog", "One day",
                                 "The little girl", "Ben saw a big", "Sue liked to play" };
static const char *k_stops[] = { "the park." };

static struct kvllm_request mk_request(int p, float temp, struct out *o, char *buf, size_t cap) {
    snprintf(buf, cap, "%s %s", k_words[p % 8], k_words[(p / 8) % 8]);
    struct kvllm_request q = { .prompt_text = buf, .max_tokens = MAX_TOK - (p % 5) * 7, .n = 1 + (p % 7 == 3),
                               .sampling = kvllm_sampling_default_params(), .ignore_eos = p % 3 != 0,
                               .stop = k_stops, .n_stop = p % 4 == 1, .on_event = on_event, .user = o };
    q.sampling.temperature = temp;
    q.sampling.seed = 1000u + (uint64_t)p;
    return q;
}

/* Published blocks hold their sequence's kept tokens: never a rejected draft. */
static void check_published(struct kvllm_engine *e) {
    const int bs = e->pool.block_size;
    for (int i = 0; i < e->sched.n_running; i++) {
        const struct seq *q = e->sched.running[i];
        CHECK(q->n_spec == 0);
        CHECK(q->n_computed <= q->n_tokens);
        for (int k = 0; k < q->n_published && k < q->n_blocks; k++) {
            int32_t id = q->blocks[k];
            if (e->pool.hash[id] == 0) continue;
            CHECK_MSG(!memcmp(e->pool.tokens + (size_t)id * bs, q->tokens + (size_t)k * bs, bs * sizeof(int32_t)),
                      "block %d of a sequence is published with other tokens than it kept", k);
            CHECK((k + 1) * bs <= q->n_computed);
        }
    }
    CHECK(block_pool_check(&e->pool));
}

struct run_cfg {
    enum kvllm_spec spec;
    struct kvllm_model *draft;
    float temp;
    bool together;      /* all prompts at once (continuous batching), else one by one */
    int kv_tokens;      /* 0: ample */
    int spec_tokens;
};

/* Run every prompt; outputs into o[N_PROMPTS]; the stats of the (last) engine into st. */
static void run(struct kvllm_model *m, const struct run_cfg *c, struct out *o, struct kvllm_engine_stats *st_out) {
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.n_ctx = 256;
    ep.kv_tokens = c->kv_tokens ? c->kv_tokens : 4096;
    ep.max_seqs = 16;
    ep.spec = c->spec;
    ep.spec_tokens = c->spec_tokens;
    ep.draft_model = c->draft;
    struct kvllm_engine *e = NULL;
    CHECK(kvllm_engine_new(m, &ep, &e) == 0);
    if (!e) return;
    memset(o, 0, N_PROMPTS * sizeof *o);
    memset(st_out, 0, sizeof *st_out);
    char bufs[N_PROMPTS][128];
    for (int p = 0; p < N_PROMPTS; p++) {
        struct kvllm_request q = mk_request(p, c->temp, &o[p], bufs[p], sizeof bufs[p]);
        CHECK(kvllm_engine_add(e, &q, NULL) == 0);
        if (c->together && p + 1 < N_PROMPTS) continue;
        for (int steps = 0; !kvllm_engine_idle(e) && steps < 100000; steps++) {
            kvllm_engine_step(e);
            check_published(e);
        }
    }
    struct kvllm_engine_stats st;
    kvllm_engine_get_stats(e, &st);
    CHECK_MSG(st.blocks_held == 0, "%d blocks held after the run", st.blocks_held);
    if (e->draft) {
        struct kvllm_engine_stats ds;
        kvllm_engine_get_stats(e->draft, &ds);
        CHECK_MSG(ds.blocks_held == 0, "the draft engine holds %d blocks after the run", ds.blocks_held);
        CHECK(block_pool_check(&e->draft->pool));
    }
    *st_out = st;
    kvllm_engine_free(e);
}

static int same(const struct out *a, const struct out *b, const char *what) {
    int bad = 0;
    for (int p = 0; p < N_PROMPTS; p++)
        for (int i = 0; i < 2; i++) {
            bool ok = a[p].n[i] == b[p].n[i] && !memcmp(a[p].ids[i], b[p].ids[i], a[p].n[i] * sizeof(int32_t)) &&
                      a[p].fin[i] == b[p].fin[i] && a[p].len[i] == b[p].len[i] &&
                      !memcmp(a[p].text[i], b[p].text[i], a[p].len[i]);
            if (!ok && bad++ < 3)
                fprintf(stderr, "  %s: prompt %d sample %d differs (%d vs %d tokens, finish %d vs %d)\n", what, p, i,
                        a[p].n[i], b[p].n[i], (int)a[p].fin[i], (int)b[p].fin[i]);
        }
    return bad;
}

static struct out g_ref[N_PROMPTS], g_got[N_PROMPTS];

static void compare(struct kvllm_model *m, const struct run_cfg *c, const char *what, double min_accept) {
    struct kvllm_engine_stats st;
    run(m, c, g_got, &st);
    int bad = same(g_ref, g_got, what);
    CHECK_MSG(bad == 0, "%s: %d of %d sequences differ from decoding without speculation", what, bad, 2 * N_PROMPTS);
    double rate = st.spec_drafted ? (double)st.spec_accepted / (double)st.spec_drafted : 0.0;
    CHECK_MSG(st.spec_drafted > 0, "%s: nothing was drafted", what);
    CHECK_MSG(rate >= min_accept, "%s: acceptance %.3f below %.3f", what, rate, min_accept);
    uint64_t hist = 0, acc = 0;
    for (int i = 0; i < 17; i++) { hist += st.spec_accept_hist[i]; acc += (uint64_t)i * st.spec_accept_hist[i]; }
    CHECK(hist == st.spec_verifies);
    CHECK(acc == st.spec_accepted);   /* no verification accepts 16 or more here (k <= 8) */
    printf("  %-44s %5llu drafted, %5llu accepted (%.1f %%), %llu preemptions, %llu steps\n", what,
           (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_accepted, 100.0 * rate,
           (unsigned long long)st.preemptions, (unsigned long long)st.steps);
}

/* Aborts while sequences are speculating: every block comes back. */
static void test_abort(struct kvllm_model *m, enum kvllm_spec spec) {
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.n_ctx = 256;
    ep.kv_tokens = 4096;
    ep.spec = spec;
    ep.spec_tokens = 6;
    ep.draft_model = spec == KVLLM_SPEC_DRAFT ? m : NULL;
    struct kvllm_engine *e = NULL;
    CHECK(kvllm_engine_new(m, &ep, &e) == 0);
    if (!e) return;
    static struct out o[8];
    memset(o, 0, sizeof o);
    uint64_t ids[8];
    char bufs[8][128];
    for (int p = 0; p < 8; p++) {
        struct kvllm_request q = mk_request(p, 0.0f, &o[p], bufs[p], sizeof bufs[p]);
        q.max_tokens = 200;
        q.ignore_eos = true;
        q.n_stop = 0;
        CHECK(kvllm_engine_add(e, &q, &ids[p]) == 0);
    }
    for (int s = 0; s < 12; s++) kvllm_engine_step(e);
    struct kvllm_engine_stats st;
    kvllm_engine_get_stats(e, &st);
    /* drafts are proposed and resolved within one step, and aborts are drained before the proposal:
     * an abort finds sequences that are speculating step after step, and their draft shadows */
    CHECK(st.spec_drafted > 0);
    for (int p = 0; p < 8; p += 2) CHECK(kvllm_engine_abort(e, ids[p]) == 0);
    for (int s = 0; s < 3; s++) kvllm_engine_step(e);
    for (int p = 1; p < 8; p += 2) CHECK(kvllm_engine_abort(e, ids[p]) == 0);
    for (int s = 0; s < 1000 && !kvllm_engine_idle(e); s++) kvllm_engine_step(e);
    kvllm_engine_get_stats(e, &st);
    CHECK(kvllm_engine_idle(e));
    CHECK_MSG(st.blocks_held == 0, "%d blocks held after aborts mid-speculation", st.blocks_held);
    for (int p = 0; p < 8; p++) CHECK(o[p].fin[0] == KVLLM_FINISH_ABORT);
    if (e->draft) {
        struct kvllm_engine_stats ds;
        kvllm_engine_get_stats(e->draft, &ds);
        CHECK_MSG(ds.blocks_held == 0, "the draft engine holds %d blocks after aborts", ds.blocks_held);
    }
    kvllm_engine_free(e);
}

/* A step that fails while sequences speculate ends their requests with an
 * error and returns every block; a failed draft-engine step only ends the
 * drafting (its shadows), never the requests, whose output is unchanged. */
static void test_faults(struct kvllm_model *m) {
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.n_ctx = 256;
    ep.kv_tokens = 4096;
    ep.max_seqs = 16;
    ep.spec = KVLLM_SPEC_DRAFT;
    ep.spec_tokens = 4;
    ep.draft_model = m;
    for (int target = 0; target < 2; target++) {
        struct kvllm_engine *e = NULL;
        CHECK(kvllm_engine_new(m, &ep, &e) == 0);
        if (!e) return;
        memset(g_got, 0, sizeof g_got);
        char bufs[N_PROMPTS][128];
        for (int p = 0; p < N_PROMPTS; p++) {
            struct kvllm_request q = mk_request(p, 0.0f, &g_got[p], bufs[p], sizeof bufs[p]);
            CHECK(kvllm_engine_add(e, &q, NULL) == 0);
        }
        for (int s = 0; s < 6; s++) kvllm_engine_step(e);
        engine_test_fail_op(target ? e : e->draft, 3, KVLLM_EBACKEND);
        for (int s = 0; s < 100000 && !kvllm_engine_idle(e); s++) {
            kvllm_engine_step(e);
            check_published(e);
        }
        struct kvllm_engine_stats st, ds;
        kvllm_engine_get_stats(e, &st);
        kvllm_engine_get_stats(e->draft, &ds);
        CHECK_MSG(st.blocks_held == 0 && ds.blocks_held == 0, "%d and %d blocks held after a failed %s step",
                  st.blocks_held, ds.blocks_held, target ? "target" : "draft");
        if (target) CHECK(st.failed_steps == 1);
        else {
            CHECK(ds.failed_steps == 1 && st.failed_steps == 0);
            CHECK_MSG(same(g_ref, g_got, "after a failed draft step") == 0,
                      "a failed draft step changed the output");
        }
        kvllm_engine_free(e);
    }
}

/* Parameters the engine refuses. */
static void test_params(struct kvllm_model *m) {
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.n_ctx = 128;
    ep.kv_tokens = 512;
    struct kvllm_engine *e = NULL;
    ep.spec = KVLLM_SPEC_DRAFT;   /* no draft model */
    CHECK(kvllm_engine_new(m, &ep, &e) == KVLLM_EINVAL && !e);
    ep.spec = KVLLM_SPEC_NGRAM;
    ep.spec_tokens = 1000;
    CHECK(kvllm_engine_new(m, &ep, &e) == KVLLM_EINVAL && !e);
    ep.spec_tokens = 0;           /* the default k */
    CHECK(kvllm_engine_new(m, &ep, &e) == 0 && e);
    if (e) CHECK(e->p.spec_tokens == 5);
    kvllm_engine_free(e);
}

int main(void) {
    struct kvllm_model *m = load_stories(1);
    if (!m) return check_report("test_engine_spec");
    test_params(m);
    struct kvllm_engine_stats st;
    for (int t = 0; t < 2; t++) {
        const float temp = t ? 0.8f : 0.0f;
        for (int together = 0; together < 2; together++) {
            struct run_cfg ref = { .temp = temp, .together = together };
            run(m, &ref, g_ref, &st);
            char what[96];
            snprintf(what, sizeof what, "prompt lookup, T=%.1f, %s", temp, together ? "batched" : "alone");
            compare(m, &(struct run_cfg){ .spec = KVLLM_SPEC_NGRAM, .temp = temp, .together = together }, what, 0.0);
            snprintf(what, sizeof what, "self-draft, T=%.1f, %s", temp, together ? "batched" : "alone");
            /* drafting for itself greedily: every draft is the argmax, so at T = 0 every one is kept */
            compare(m, &(struct run_cfg){ .spec = KVLLM_SPEC_DRAFT, .draft = m, .temp = temp, .together = together,
                                          .spec_tokens = 4 },
                    what, t ? 0.0 : 1.0);
        }
    }
    /* a pool of 24 blocks of 16 for 16 requests of up to ~60 tokens (some n = 2): preemption mid-speculation */
    struct run_cfg ref = { .temp = 0.8f, .together = true, .kv_tokens = 384 };
    run(m, &ref, g_ref, &st);
    CHECK_MSG(st.preemptions > 0, "the small pool preempted nobody (%llu)", (unsigned long long)st.preemptions);
    compare(m, &(struct run_cfg){ .spec = KVLLM_SPEC_NGRAM, .temp = 0.8f, .together = true, .kv_tokens = 384,
                                  .spec_tokens = 8 },
            "prompt lookup, T=0.8, small pool", 0.0);
    compare(m, &(struct run_cfg){ .spec = KVLLM_SPEC_DRAFT, .draft = m, .temp = 0.8f, .together = true,
                                  .kv_tokens = 384, .spec_tokens = 3 },
            "self-draft, T=0.8, small pool", 0.0);
    test_abort(m, KVLLM_SPEC_NGRAM);
    test_abort(m, KVLLM_SPEC_DRAFT);
    run(m, &(struct run_cfg){ .temp = 0.0f, .together = true }, g_ref, &st);
    test_faults(m);
    kvllm_model_free(m);
    return check_report("test_engine_spec");
}
