/* test_engine_noalloc.c — nothing is allocated inside a step: every
 * buffer is sized when the engine and its requests are created.  The test
 * counts calls to malloc, calloc, realloc and aligned allocations made by
 * any thread while an engine decodes in steady state (4 requests with stop
 * strings and text, after their prompts) and requires 0
 * (counted as alloc_count.h says), in the synchronous order and with
 * asynchronous scheduling (the next step planned while one runs). */
#include "check.h"
#include "stories_util.h"
#include "kvllm.h"
#include "alloc_count.h"

#include <stdio.h>
#include <string.h>

static int g_tokens;
static void on_event(const struct kvllm_event *ev, void *user) {
    (void)user;
    if (ev->token >= 0) g_tokens++;   /* no allocation here either */
}

static void check_steady_state(struct kvllm_model *m, enum kvllm_async async) {
    struct kvllm_engine *e = NULL;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.n_ctx = 256;
    ep.kv_tokens = 1024;
    ep.async_scheduling = async;
    CHECK(kvllm_engine_new(m, &ep, &e) == 0);
    if (!e) return;
    static const char *stops[] = { "zebra-never", "Once upon a time in a galaxy" };
    for (int k = 0; k < 4; k++) {
        char prompt[64];
        snprintf(prompt, sizeof prompt, "Once upon a time %d", k);
        struct kvllm_request q = { .prompt_text = prompt, .max_tokens = 200, .n = 1 + (k == 3),
                                   .sampling = kvllm_sampling_default_params(), .ignore_eos = true,
                                   .stop = stops, .n_stop = 2, .want_logits = k == 0, .on_event = on_event };
        q.sampling.seed = (uint64_t)k;
        CHECK(kvllm_engine_add(e, &q, NULL) == 0);
    }
    /* the counter sees allocations: adding a request makes some */
    atomic_store(&g_counting, 1);
    struct kvllm_request q0 = { .prompt_text = "Lily", .max_tokens = 150, .n = 1,
                                .sampling = kvllm_sampling_default_params(), .on_event = on_event };
    CHECK(kvllm_engine_add(e, &q0, NULL) == 0);
    atomic_store(&g_counting, 0);
    CHECK_MSG(atomic_load(&g_allocs) > 0, "the allocation counter saw nothing while a request was added");
    atomic_store(&g_allocs, 0);
    for (int i = 0; i < 8; i++) kvllm_engine_step(e);   /* prompts, forks, first tokens */
    const int before = g_tokens;
    atomic_store(&g_counting, 1);
    int steps = 0;
    for (; steps < 100 && !kvllm_engine_idle(e); steps++) kvllm_engine_step(e);
    atomic_store(&g_counting, 0);
    const int n_alloc = atomic_load(&g_allocs);
    CHECK_MSG(n_alloc == 0, "%d allocations in %d steady-state decode steps", n_alloc, steps);
    CHECK(g_tokens - before >= 4 * steps);
    printf("  %s: %d decode steps, %d tokens: %d allocations\n", async == KVLLM_ASYNC_ON ? "async" : "sync", steps,
           g_tokens - before, n_alloc);
    kvllm_engine_free(e);
}

int main(void) {
    alloc_count_install();
    struct kvllm_model *m = load_stories(2);
    if (!m) return check_report("test_engine_noalloc");
    check_steady_state(m, KVLLM_ASYNC_OFF);
    check_steady_state(m, KVLLM_ASYNC_ON);
    kvllm_model_free(m);
    return check_report("test_engine_noalloc");
}
