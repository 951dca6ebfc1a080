/* seq.h — one sequence as the scheduler sees it: token ids and two
 * counters.  n_tokens is what is known (prompt + generated), n_computed is
 * what has K/V in the cache; every step moves n_computed towards n_tokens,
 * so prefill, chunked prefill, prefix-cache hits, decode and recompute after
 * preemption are one mechanism.  No tensors, no model. */
#ifndef KVLLM_SEQ_H
#define KVLLM_SEQ_H

#include <stdbool.h>
#include <stdint.h>

enum seq_status { SEQ_WAITING = 0, SEQ_RUNNING, SEQ_FINISHED };

struct seq {
    uint64_t id;
    enum seq_status status;
    int32_t *tokens;       /* (max_len) prompt, then generated */
    int n_tokens;          /* known */
    int n_prompt;
    int max_len;           /* prompt + max new tokens: the most this sequence can ever hold */
    int n_computed;        /* leading tokens whose K/V are in blocks */
    int n_spec;            /* the last n_spec of tokens[0, n_tokens) are unverified drafts (speculative
                              decoding): computed like any token, never hashed or published, dropped
                              on preemption, and resolved by sched_spec_resolve after the step */
    int n_pending;         /* asynchronous scheduling: the last n_pending of tokens[0, n_tokens) are
                              placeholders (-1) for the token the step in flight samples, counted as
                              known while the next step is planned, never hashed or published, and
                              dropped (sched_drop_placeholder) before the real token is appended */
    int32_t *blocks;       /* (max_blocks) block table, append-only while running */
    int n_blocks, max_blocks;
    int32_t *win_blocks;   /* (max_blocks) the sliding-window layers' table when they have a pool of their
                              own (sched.win_pool): indexed like blocks, n_blocks long; the entries before
                              win_lo are -1 (released once every window had passed them, or never held) */
    int win_lo;
    uint64_t *hashes;      /* (max_blocks) hash chain of the leading full blocks */
    int n_hashed;          /* hashes[0 .. n_hashed) are valid */
    int n_published;       /* leading blocks already offered to the prefix cache */
    uint64_t admitted;     /* admission stamp: the most recent is preempted first */
    int n_reserved;        /* running slots this sequence reserves (n samples forked later) */
    int n_preemptions;
    void *owner;           /* the engine's request */
};

/* Allocate a sequence for max_len tokens with block_size-token blocks;
 * tokens copied in.  NULL on OOM (logged). */
struct seq *seq_new(uint64_t id, const int32_t *prompt, int n_prompt, int max_len, int block_size);
void seq_free(struct seq *s);

#endif
