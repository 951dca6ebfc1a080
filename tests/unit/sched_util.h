/* sched_util.h — the fake sequences and model-less steps the scheduler
 * tests drive it with. */
#ifndef KVLLM_SCHED_UTIL_H
#define KVLLM_SCHED_UTIL_H
#include "sched/scheduler.h"

/* A fake sequence: prompt first_token, first_token + 1, ... */
static inline struct seq *tu_seq(uint64_t id, int n_prompt, int max_len, int first_token, int block_size) {
    int32_t t[256];
    for (int i = 0; i < n_prompt && i < 256; i++) t[i] = first_token + i;
    return seq_new(id, t, n_prompt, max_len, block_size);
}

/* One engine step without a model: schedule, commit, and give every
 * sequence that reached its known tokens one more ("sampled") token. */
static inline void tu_step(struct sched *s, struct sched_batch *b) {
    sched_schedule(s, b);
    sched_commit(s, b);
    for (int i = 0; i < b->n_seqs; i++) {
        struct seq *q = b->seqs[i];
        if (q->status == SEQ_RUNNING && q->n_computed == q->n_tokens && q->n_tokens < q->max_len) {
            q->tokens[q->n_tokens] = 1000 + q->n_tokens;
            q->n_tokens++;
        }
    }
}
#endif
