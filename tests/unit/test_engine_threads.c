/* test_engine_threads.c — the engine's thread-safe surface: requests added
 * and aborted from several threads while the engine thread steps; every
 * sequence gets exactly one finishing event, aborted ones release their
 * blocks within one step, and the pool ends with nothing held. */
#include "check.h"
#include "kvllm.h"
#include "stories_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define N_THREADS 4
#define PER_THREAD 6

static struct kvllm_engine *g_e;
static atomic_int g_finished, g_aborted, g_tokens;

static void on_event(const struct kvllm_event *ev, void *user) {
    (void)user;
    if (ev->token >= 0) atomic_fetch_add(&g_tokens, 1);
    if (ev->finish) atomic_fetch_add(&g_finished, 1);
    if (ev->finish == KVLLM_FINISH_ABORT) atomic_fetch_add(&g_aborted, 1);
}

static void *client(void *arg) {
    int t = (int)(long)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        int32_t prompt[8] = { 1 };
        for (int k = 1; k < 8; k++) prompt[k] = 3 + (t * 31 + i * 7 + k) % 400;
        struct kvllm_request q = { .prompt = prompt, .n_prompt = 8, .max_tokens = 20 + i, .n = 1 + i % 2,
                                   .sampling = kvllm_sampling_default_params(), .ignore_eos = true,
                                   .on_event = on_event };
        q.sampling.seed = (uint64_t)(t * 100 + i);
        uint64_t id;
        int rc = kvllm_engine_add(g_e, &q, &id);
        CHECK_MSG(rc == 0, "add failed: %d", rc);
        if (rc == 0 && i % 3 == 2) kvllm_engine_abort(g_e, id); /* some are aborted right away */
    }
    return NULL;
}

int main(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.bin", check_shared_dir());
    char tok[512];
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", check_shared_dir());
    struct kvllm_model_params mp = test_model_params();
    mp.tokenizer_path = tok;
    mp.n_threads = 1;
    struct kvllm_model *m = NULL;
    CHECK(kvllm_model_load(path, &mp, &m) == 0);
    if (!m) return check_report("test_engine_threads");
    CHECK_MSG(test_model_on_backend(m, &mp), "model on %s", kvllm_model_backend(m));
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.max_seqs = 8;
    ep.kv_tokens = 256; /* small: admission waits, preemption happens */
    CHECK(kvllm_engine_new(m, &ep, &g_e) == 0);

    pthread_t th[N_THREADS];
    for (long t = 0; t < N_THREADS; t++) pthread_create(&th[t], NULL, client, (void *)t);
    int expected = 0;
    for (int t = 0; t < N_THREADS; t++)
        for (int i = 0; i < PER_THREAD; i++) expected += 1 + i % 2;
    int steps = 0;
    bool joined = false;
    while (steps < 100000) {
        if (kvllm_engine_step(g_e) < 0) break;
        steps++;
        if (!joined && steps > 5) {
            for (int t = 0; t < N_THREADS; t++) pthread_join(th[t], NULL);
            joined = true;
        }
        if (joined && kvllm_engine_idle(g_e)) break;
    }
    if (!joined) for (int t = 0; t < N_THREADS; t++) pthread_join(th[t], NULL);
    CHECK_MSG(atomic_load(&g_finished) == expected, "%d of %d sequences finished", atomic_load(&g_finished), expected);
    CHECK(atomic_load(&g_aborted) > 0);
    struct kvllm_engine_stats st;
    kvllm_engine_get_stats(g_e, &st);
    CHECK_MSG(st.blocks_held == 0, "%d blocks still held", st.blocks_held);
    CHECK(st.n_running == 0 && st.n_waiting == 0);
    printf("%d steps, %d tokens, %d aborted, %llu preemptions\n", steps, atomic_load(&g_tokens),
           atomic_load(&g_aborted), (unsigned long long)st.preemptions);

    /* abort mid-generation: the blocks are released in the next step */
    int32_t prompt[4] = { 1, 40, 50, 60 };
    struct kvllm_request q = { .prompt = prompt, .n_prompt = 4, .max_tokens = 200, .n = 1,
                               .sampling = kvllm_sampling_default_params(), .ignore_eos = true, .on_event = on_event };
    uint64_t id;
    CHECK(kvllm_engine_add(g_e, &q, &id) == 0);
    for (int i = 0; i < 10; i++) kvllm_engine_step(g_e);
    kvllm_engine_get_stats(g_e, &st);
    CHECK(st.blocks_held > 0);
    kvllm_engine_abort(g_e, id);
    kvllm_engine_step(g_e);
    kvllm_engine_get_stats(g_e, &st);
    CHECK_MSG(st.blocks_held == 0 && kvllm_engine_idle(g_e), "after abort: %d blocks held", st.blocks_held);

    /* bad requests are refused with the reason */
    q.max_tokens = 100000;
    CHECK(kvllm_engine_add(g_e, &q, &id) == KVLLM_ERANGE);
    prompt[1] = 99999;
    q.max_tokens = 4;
    CHECK(kvllm_engine_add(g_e, &q, &id) == KVLLM_EINVAL);
    kvllm_engine_free(g_e);
    kvllm_model_free(m);
    return check_report("test_engine_threads");
}
