/* test_engine_spec_noalloc.c — test_engine_noalloc with speculative
 * decoding on: prompt lookup, then a draft model (stories260K drafting for
 * itself, with its own engine and KV pool).  Drafting, verification and
 * rollback allocate nothing inside a step: the draft engine, its shadows of
 * every sample and the per-step arrays are made at creation and by
 * kvllm_engine_add.  The test counts calls to malloc, calloc, realloc and
 * aligned allocations made by any thread while an engine decodes in steady
 * state (4 requests with stop strings and text, after their prompts) and
 * requires 0, and that drafts were verified meanwhile (counted as
 * alloc_count.h says). */
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

static void run(struct kvllm_model *m, enum kvllm_spec spec) {
    struct kvllm_engine *e = NULL;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.n_ctx = 256;
    ep.kv_tokens = 1024;
    ep.spec = spec;
    ep.spec_tokens = 4;
    ep.draft_model = spec == KVLLM_SPEC_DRAFT ? m : NULL;
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
        q.sampling.temperature = k == 1 ? 0.0f : 0.8f;
        CHECK(kvllm_engine_add(e, &q, NULL) == 0);
    }
    atomic_store(&g_allocs, 0);
    for (int i = 0; i < 8; i++) kvllm_engine_step(e);   /* prompts, forks, first tokens */
    struct kvllm_engine_stats st0, st1;
    kvllm_engine_get_stats(e, &st0);
    const int before = g_tokens;
    atomic_store(&g_counting, 1);
    int steps = 0;
    for (; steps < 100 && !kvllm_engine_idle(e); steps++) kvllm_engine_step(e);
    atomic_store(&g_counting, 0);
    kvllm_engine_get_stats(e, &st1);
    const int n_alloc = atomic_load(&g_allocs);
    CHECK_MSG(n_alloc == 0, "%s: %d allocations in %d steady-state decode steps",
              spec == KVLLM_SPEC_DRAFT ? "draft model" : "prompt lookup", n_alloc, steps);
    CHECK(g_tokens - before >= 4 * steps);
    CHECK_MSG(st1.spec_drafted > st0.spec_drafted, "no draft was verified in the steps counted");
    printf("  %s: %d decode steps, %d tokens, %llu drafts verified: %d allocations\n",
           spec == KVLLM_SPEC_DRAFT ? "draft model" : "prompt lookup", steps, g_tokens - before,
           (unsigned long long)(st1.spec_drafted - st0.spec_drafted), n_alloc);
    kvllm_engine_free(e);
}

int main(void) {
    alloc_count_install();
    struct kvllm_model *m = load_stories(2);
    if (!m) return check_report("test_engine_spec_noalloc");
    /* the counter sees allocations: loading a model makes some */
    atomic_store(&g_counting, 1);
    struct kvllm_model *m2 = load_stories(1);
    atomic_store(&g_counting, 0);
    CHECK_MSG(atomic_load(&g_allocs) > 0, "the allocation counter saw nothing while a model was loaded");
    kvllm_model_free(m2);
    run(m, KVLLM_SPEC_NGRAM);
    run(m, KVLLM_SPEC_DRAFT);
    kvllm_model_free(m);
    return check_report("test_engine_spec_noalloc");
}
