/* test_engine_share.c — one model shared by several engines and sessions on
 * several threads at once: every one of them must give bit-identical
 * logits to the same evaluation run alone.  (Before the execution state
 * moved out of the model, two sessions on two threads over one model read
 * each other's scratch and raced on one thread pool.)  The model is a
 * stories260K checkpoint and the llama-2-tiny-random GGUF (GQA), two
 * threads per context so that the thread pools really run in parallel. */
#include "check.h"
#include "kvllm.h"
#include "stories_util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_ENGINES 4
#define N_SESSIONS 2
#define N_PROMPT 40
#define N_GEN 24
#define REPS 3

static struct kvllm_model *g_m;
static int g_vocab;

/* ---- engines: greedy generations with their logits ---- */

struct gen {
    int32_t ids[N_GEN];
    float *logits;          /* (N_GEN, vocab) */
    int n;
    bool error;
};

static void on_event(const struct kvllm_event *ev, void *user) {
    struct gen *g = user;
    if (ev->token >= 0 && g->n < N_GEN) {
        g->ids[g->n] = ev->token;
        if (ev->logits) memcpy(g->logits + (size_t)g->n * g_vocab, ev->logits, (size_t)g_vocab * sizeof(float));
        g->n++;
    }
    if (ev->finish == KVLLM_FINISH_ERROR) g->error = true;
}

/* Two requests with different prompts (seed k) through a fresh engine. */
static void run_engine(int k, struct gen out[2]) {
    struct kvllm_engine *e = NULL;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.kv_tokens = 512;
    ep.n_ctx = 128;
    if (kvllm_engine_new(g_m, &ep, &e)) { out[0].error = true; return; }
    for (int r = 0; r < 2; r++) {
        int32_t prompt[N_PROMPT];
        prompt[0] = 1;
        for (int i = 1; i < N_PROMPT; i++) prompt[i] = 3 + (k * 37 + r * 11 + i * 7) % (g_vocab - 3);
        struct kvllm_request q = { .prompt = prompt, .n_prompt = N_PROMPT, .max_tokens = N_GEN, .n = 1,
                                   .sampling = kvllm_sampling_default_params(), .ignore_eos = true, .no_text = true,
                                   .want_logits = true, .on_event = on_event, .user = &out[r] };
        q.sampling.temperature = 0;
        if (kvllm_engine_add(e, &q, NULL)) out[r].error = true;
    }
    while (!kvllm_engine_idle(e)) kvllm_engine_step(e);
    kvllm_engine_free(e);
}

struct engine_job { int k; struct gen out[REPS][2]; };

static void *engine_thread(void *arg) {
    struct engine_job *j = arg;
    for (int rep = 0; rep < REPS; rep++) run_engine(j->k, j->out[rep]);
    return NULL;
}

static void gen_alloc(struct gen *g) { memset(g, 0, sizeof *g); g->logits = calloc((size_t)N_GEN * g_vocab, sizeof(float)); }

static int gen_diff(const struct gen *a, const struct gen *b) {
    if (a->error || b->error || a->n != b->n) return 1;
    return memcmp(a->ids, b->ids, sizeof a->ids) != 0 ||
           memcmp(a->logits, b->logits, (size_t)a->n * g_vocab * sizeof(float)) != 0;
}

/* ---- sessions: the logits of every prompt position ---- */

struct sess_job { int k; float *alone, *got[REPS]; int rc; };

static int run_session(int k, float *logits) {
    struct kvllm_session *s = NULL;
    struct kvllm_session_params sp = { .n_ctx = 128, .max_batch = 16 };
    int rc = kvllm_session_new(g_m, &sp, &s);
    if (rc) return rc;
    int32_t ids[N_PROMPT];
    ids[0] = 1;
    for (int i = 1; i < N_PROMPT; i++) ids[i] = 3 + (k * 53 + i * 13) % (g_vocab - 3);
    rc = kvllm_session_eval(s, ids, N_PROMPT, true, logits);   /* chunks of 16: three steps */
    kvllm_session_free(s);
    return rc;
}

static void *session_thread(void *arg) {
    struct sess_job *j = arg;
    for (int rep = 0; rep < REPS && !j->rc; rep++) j->rc = run_session(j->k, j->got[rep]);
    return NULL;
}

static void check_model(const char *path, const char *tok) {
    struct kvllm_model_params mp = test_model_params();
    mp.tokenizer_path = tok;
    mp.n_threads = 2;
    CHECK(kvllm_model_load(path, &mp, &g_m) == 0);
    if (!g_m) return;
    CHECK_MSG(test_model_on_backend(g_m, &mp), "model on %s", kvllm_model_backend(g_m));
    g_vocab = kvllm_model_describe(g_m)->n_vocab;

    /* engines: each alone first, then all at once on their own threads */
    static struct engine_job jobs[N_ENGINES];
    struct gen alone[N_ENGINES][2];
    for (int k = 0; k < N_ENGINES; k++) {
        jobs[k].k = k;
        for (int r = 0; r < 2; r++) {
            gen_alloc(&alone[k][r]);
            for (int rep = 0; rep < REPS; rep++) gen_alloc(&jobs[k].out[rep][r]);
        }
        run_engine(k, alone[k]);
        CHECK(alone[k][0].n == N_GEN && !alone[k][0].error);
    }
    pthread_t th[N_ENGINES + N_SESSIONS];
    struct sess_job sj[N_SESSIONS];
    const size_t sl = (size_t)N_PROMPT * g_vocab;
    for (int k = 0; k < N_SESSIONS; k++) {
        sj[k] = (struct sess_job){ .k = k, .alone = calloc(sl, sizeof(float)) };
        for (int rep = 0; rep < REPS; rep++) sj[k].got[rep] = calloc(sl, sizeof(float));
        CHECK(run_session(k, sj[k].alone) == 0);
    }
    for (int k = 0; k < N_ENGINES; k++) pthread_create(&th[k], NULL, engine_thread, &jobs[k]);
    for (int k = 0; k < N_SESSIONS; k++) pthread_create(&th[N_ENGINES + k], NULL, session_thread, &sj[k]);
    for (int k = 0; k < N_ENGINES + N_SESSIONS; k++) pthread_join(th[k], NULL);
    int bad = 0;
    for (int k = 0; k < N_ENGINES; k++)
        for (int rep = 0; rep < REPS; rep++)
            for (int r = 0; r < 2; r++) bad += gen_diff(&alone[k][r], &jobs[k].out[rep][r]);
    CHECK_MSG(bad == 0, "%s: %d of %d engine generations differ from the same generation alone", path, bad,
              N_ENGINES * REPS * 2);
    int sbad = 0;
    for (int k = 0; k < N_SESSIONS; k++) {
        CHECK(sj[k].rc == 0);
        for (int rep = 0; rep < REPS; rep++) {
            int rows = 0;
            for (int p = 0; p < N_PROMPT; p++)
                rows += memcmp(sj[k].alone + (size_t)p * g_vocab, sj[k].got[rep] + (size_t)p * g_vocab,
                               (size_t)g_vocab * sizeof(float)) != 0;
            sbad += rows;
        }
    }
    CHECK_MSG(sbad == 0, "%s: %d of %d session logit rows differ from the same evaluation alone", path, sbad,
              N_SESSIONS * REPS * N_PROMPT);
    printf("  %s: %d engine generations and %d session rows compared, %d + %d differ\n", path,
           N_ENGINES * REPS * 2, N_SESSIONS * REPS * N_PROMPT, bad, sbad);
    for (int k = 0; k < N_ENGINES; k++)
        for (int r = 0; r < 2; r++) {
            free(alone[k][r].logits);
            for (int rep = 0; rep < REPS; rep++) free(jobs[k].out[rep][r].logits);
        }
    for (int k = 0; k < N_SESSIONS; k++) {
        free(sj[k].alone);
        for (int rep = 0; rep < REPS; rep++) free(sj[k].got[rep]);
    }
    kvllm_model_free(g_m);
    g_m = NULL;
}

int main(void) {
    char path[512], tok[512], tiny[512];
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.bin", check_shared_dir());
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", check_shared_dir());
    snprintf(tiny, sizeof tiny, "%s/models/llama-2-tiny-random/llama-2-tiny-random.gguf", check_shared_dir());
    check_model(path, tok);
    check_model(tiny, NULL);
    return check_report("test_engine_share");
}
