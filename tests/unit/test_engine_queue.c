/* test_engine_queue.c — the queue has one owner: a request kvllm_engine_add
 * accepted runs to completion, however full the waiting ring gets with
 * preempted sequences; a request that does not fit the queue is refused
 * at add (KVLLM_EBUSY, the server's 429).  Before, with max_queue = 1 and a
 * small pool, preempted sequences filled the scheduler's ring and accepted
 * requests were finished with KVLLM_FINISH_ABORT though nobody aborted
 * them (390 accepted, 390 aborted). */
#include "check.h"
#include "stories_util.h"
#include "kvllm.h"

#include <stdio.h>
#include <string.h>

static int g_fin[8], g_tokens;

static void on_event(const struct kvllm_event *ev, void *user) {
    (void)user;
    if (ev->token >= 0) g_tokens++;
    if (ev->finish) g_fin[ev->finish]++;
}

int main(void) {
    struct kvllm_model *m = load_stories(1);
    if (!m) return check_report("test_engine_queue");
    struct kvllm_engine *e = NULL;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.max_queue = 1;
    ep.max_seqs = 6;
    ep.kv_tokens = 112;   /* 7 blocks: six growing sequences keep preempting each other */
    ep.block_size = 16;
    ep.n_ctx = 112;
    CHECK(kvllm_engine_new(m, &ep, &e) == 0);
    if (!e) return check_report("test_engine_queue");
    int accepted = 0, refused = 0;
    for (int i = 0; i < 120; i++) {
        int32_t prompt[10] = { 1 };
        for (int k = 1; k < 10; k++) prompt[k] = 3 + (i * 17 + k * 5) % 400;
        struct kvllm_request q = { .prompt = prompt, .n_prompt = 10, .max_tokens = 30 + i % 40, .n = 1 + (i % 5 == 0),
                                   .sampling = kvllm_sampling_default_params(), .ignore_eos = true, .no_text = true,
                                   .on_event = on_event };
        q.sampling.seed = (uint64_t)i;
        int rc = kvllm_engine_add(e, &q, NULL);
        CHECK(rc == 0 || rc == KVLLM_EBUSY);
        if (rc == 0) accepted += q.n; else refused++;
        kvllm_engine_step(e);
    }
    while (!kvllm_engine_idle(e)) kvllm_engine_step(e);
    struct kvllm_engine_stats st;
    kvllm_engine_get_stats(e, &st);
    printf("  %d sequences accepted, %d requests refused (EBUSY), %llu preemptions: %d finished by length, "
           "%d aborted, %d errors; %d blocks held\n", accepted, refused, (unsigned long long)st.preemptions,
           g_fin[KVLLM_FINISH_LENGTH], g_fin[KVLLM_FINISH_ABORT], g_fin[KVLLM_FINISH_ERROR], st.blocks_held);
    CHECK_MSG(st.preemptions > 0, "the workload must preempt to test anything");
    CHECK_MSG(refused > 0, "the queue of 1 must refuse some requests");
    CHECK_MSG(g_fin[KVLLM_FINISH_ABORT] == 0, "%d accepted sequences were aborted", g_fin[KVLLM_FINISH_ABORT]);
    CHECK(g_fin[KVLLM_FINISH_LENGTH] == accepted && g_fin[KVLLM_FINISH_ERROR] == 0);
    CHECK(st.blocks_held == 0);
    kvllm_engine_free(e);
    kvllm_model_free(m);
    return check_report("test_engine_queue");
}
