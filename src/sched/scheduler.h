/* scheduler.h — continuous batching over a block pool.
 *
 * Each step builds one batch: first every running sequence in admission
 * order gets what it needs (one decode token, or the next chunk of its
 * prompt), then waiting sequences are admitted in arrival order while
 * --max-seqs and --max-batch-tokens allow.  Blocks are allocated for exactly
 * the positions computed this step.  When the pool runs dry for a running
 * sequence, the most recently admitted running sequence is preempted: its
 * blocks are released and it goes back to the front of the waiting queue to
 * be recomputed later.  Waiting sequences never preempt, and a sequence is
 * only accepted if it could fit the whole pool alone, so some sequence always
 * makes progress (no livelock).
 *
 * With prefix caching, full blocks are published under the hash chain of
 * their tokens once computed, and an admitted sequence starts from the
 * longest chain of cached blocks (at least its last token is always
 * computed, to give logits) whose tokens and parents match its own, block
 * by block (block_pool_match): a hash collision is a miss, never a hit.  A block shared with another sequence is copied
 * before it is written (copy-on-write): the copies to make are part of the
 * step's output.  Single-threaded: the engine thread owns it. */
#ifndef KVLLM_SCHEDULER_H
#define KVLLM_SCHEDULER_H

#include "kv/block_pool.h"
#include "sched/seq.h"

struct sched_config {
    int max_seqs;          /* running sequences at once */
    int max_batch_tokens;  /* tokens computed per step */
    int max_waiting;       /* queue capacity */
    bool prefix_caching;
    bool no_kv_cache;      /* baseline: a sequence's blocks are dropped after every step */
};

struct sched {
    struct block_pool *pool;
    struct sched_config cfg;
    struct seq **running;  /* (max_seqs) in admission order */
    int n_running, n_running_reserved;
    struct seq **waiting;  /* (max_waiting) ring: next to admit at head */
    int wait_head, n_waiting;
    uint64_t stamp;
    /* statistics */
    uint64_t n_preemptions, n_prompt_tokens, n_cached_tokens;
};

/* What one step computes: for each scheduled sequence, n_new tokens from
 * its n_computed on; block copies (dst, src) to make before the forward. */
struct sched_batch {
    int n_seqs, n_tokens;
    struct seq **seqs;     /* (max_seqs) */
    int *n_new;            /* (max_seqs) */
    int n_copies;
    int32_t (*copies)[2];  /* (max_seqs) */
};

int sched_init(struct sched *s, struct block_pool *pool, const struct sched_config *cfg);
void sched_deinit(struct sched *s);
int sched_batch_init(struct sched_batch *b, int max_seqs);
void sched_batch_deinit(struct sched_batch *b);

/* Blocks a sequence of n tokens needs. */
int sched_blocks_for(const struct sched *s, int n_tokens);

/* Could a sequence of up to max_len tokens with n_parallel samples ever
 * run?  0, or KVLLM_ERANGE logged with the numbers.  Reads only the pool
 * size and the configuration, which never change: safe from any thread. */
int sched_check_fits(const struct sched *s, int max_len, int n_parallel);

/* Queue a sequence (status WAITING, no blocks).  KVLLM_ERANGE (logged, with
 * the numbers) if its max_len can never fit the pool or a context, or if
 * n_reserved exceeds max_seqs; KVLLM_ENOMEM if the queue is full (the caller
 * reports back-pressure). */
int sched_add(struct sched *s, struct seq *q);

/* Build the next batch.  Mutates block tables, admits and preempts. */
void sched_schedule(struct sched *s, struct sched_batch *b);

/* After the batch was computed: n_computed += n_new, publish full blocks
 * (only blocks whose tokens are all verified: never one holding a draft). */
void sched_commit(struct sched *s, const struct sched_batch *b);

/* Speculative decoding.  A running sequence in decode (n_computed ==
 * n_tokens - 1) may carry drafts: the caller appends them to tokens[] and
 * sets n_spec before sched_schedule, which computes them with the last
 * token like a small prefill chunk.  Drafts are opportunistic: when the
 * step's token budget or the free blocks fall short, the scheduler drops
 * drafts (from the end) before it preempts anyone, and a preempted
 * sequence loses its drafts.
 *
 * After the step the caller verifies the drafts, sets n_tokens to what it
 * kept (accepted drafts and the token sampled after them) and calls
 * sched_spec_resolve with n_valid, the leading positions whose K/V are
 * right (those computed from tokens that were kept): n_computed becomes
 * n_valid, the blocks past the ones covering n_valid positions go back to
 * the pool, and full blocks now verified are published.  n_spec becomes 0.
 * A sequence that finished meanwhile (its blocks already released) only
 * has n_spec cleared. */
void sched_spec_resolve(struct sched *s, struct seq *q, int n_valid);

/* Forget q's tokens from position n_tokens on (a draft model's shadow of a
 * sequence brought back to the tokens its sequence kept): n_computed is
 * capped at n_tokens, drafts dropped, and a running sequence releases the
 * blocks past those covering n_computed.  Only for a scheduler without prefix caching (a
 * published block must never be written again). */
void sched_truncate(struct sched *s, struct seq *q, int n_tokens);

/* A running sequence that shares the parent's blocks (n > 1 samples): the
 * child must have the same first n_computed tokens; it takes one of the
 * parent's reserved slots. */
void sched_fork(struct sched *s, struct seq *parent, struct seq *child);

/* Remove a sequence (finished or aborted) from whichever queue holds it
 * and release its blocks; status becomes SEQ_FINISHED. */
void sched_finish(struct sched *s, struct seq *q);

#endif
