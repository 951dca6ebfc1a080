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
 * step's output.  Single-threaded: the engine thread owns it.
 *
 * Sliding windows.  A model whose layers attend either the whole context
 * or only the last `window` positions keeps the sliding layers' K/V in a
 * pool of their own (sched_set_window), and each sequence a second table,
 * seq.win_blocks, indexed by logical block like the first and grown with
 * it.  Once committed, a block wholly before every window a future token
 * could read (positions < n_committed - rollback - window + 1, where
 * n_committed is what is computed and verified) is released there while
 * the global layers keep theirs, so a sequence holds about window /
 * block_size sliding blocks whatever its length.  A prefix-cache hit of P
 * tokens needs the global chain up to P and the sliding blocks covering the
 * window before P; when those were evicted the hit is cut back to the
 * longest prefix both pools can serve.  Copy-on-write, preemption, forks
 * and rollbacks treat both tables alike; a rollback past the sliding blocks
 * still held (sched_rewind) recomputes the sequence from its start. */
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
    struct block_pool *pool;     /* every layer's blocks; with win_pool, the global layers' */
    struct block_pool *win_pool; /* the sliding-window layers' blocks (NULL: one pool) */
    int window;                  /* with win_pool: the positions a token attends (> 0) */
    int rollback;                /* with win_pool: positions a caller may rewind behind what it committed */
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
    int n_win_copies;
    int32_t (*win_copies)[2]; /* (max_seqs) the same in win_pool */
};

int sched_init(struct sched *s, struct block_pool *pool, const struct sched_config *cfg);
void sched_deinit(struct sched *s);
/* Give the sliding-window layers win_pool (block_size as the main pool's,
 * linked to it here: block_pool_link), for a window of window positions;
 * rollback: how far behind its committed tokens a caller may rewind a
 * sequence cheaply (sched_truncate of a draft model's shadow), 0 for the
 * target's own speculation (its drafts are never committed).  Before any
 * sequence is added. */
void sched_set_window(struct sched *s, struct block_pool *win_pool, int window, int rollback);
/* Sliding blocks one sequence may hold at once, at most: its window, the
 * rollback, a step of up to n_new tokens and the blocks they straddle. */
int sched_win_blocks_per_seq(int window, int rollback, int n_new, int block_size);
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
 * (only blocks whose tokens are all verified: never one holding a draft).
 * sched_advance then sched_publish. */
void sched_commit(struct sched *s, const struct sched_batch *b);
/* The two halves of sched_commit.  sched_advance (n_computed += n_new) is
 * bookkeeping only, so it may run as soon as the batch's ops are issued:
 * ops run in issue order, so whatever a later step reads is written by
 * then.  sched_publish (prefix-cache publication, sliding-window release)
 * waits until the batch is known to have succeeded (a failed step's blocks
 * must never be offered to the cache) and its placeholders are dropped. */
void sched_advance(struct sched *s, const struct sched_batch *b);
void sched_publish(struct sched *s, const struct sched_batch *b);

/* Asynchronous scheduling: the engine plans step t+1 while step t runs.
 * After issuing t it calls sched_advance(t), gives every sequence of t
 * that will sample a token a placeholder (sched_add_placeholder: one more
 * known token, value unknown), and calls sched_schedule for t+1, which
 * treats a placeholder as any known token (t+1 computes it; its block is
 * allocated now).  Once t's results are in, it drops the placeholders
 * (sched_drop_placeholder), sched_publish(t), appends the sampled tokens,
 * and sched_batch_prune(t+1) before issuing it.  A placeholder is never
 * hashed (publish_full stops before it) and never admitted (only a running
 * sequence holds one, and a preempted one loses it before any step could
 * admit it again). */
void sched_add_placeholder(struct seq *q);
void sched_drop_placeholder(struct seq *q);
/* Drop from b the sequences that finished (or were aborted, or failed)
 * since it was planned: their blocks, those allocated for b included, were
 * released by sched_finish.  Block copies into blocks nobody holds any more
 * go with them.  Every sequence left must have its planned tokens known
 * (asserted): a placeholder's sequence either got its token or finished. */
void sched_batch_prune(struct sched *s, struct sched_batch *b);

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
 * sequence brought back to the tokens its sequence kept, a session's
 * truncation): n_tokens set, drafts dropped, then sched_rewind(q, n_tokens).
 * Only for a scheduler without prefix caching (a published block must never
 * be written again). */
void sched_truncate(struct sched *s, struct seq *q, int n_tokens);

/* Forget q's K/V from position n on: n_computed becomes min(n_computed, n)
 * and a running sequence releases the blocks past those covering it.  When
 * the sliding pool no longer holds the window position n_computed reads
 * (it went further back than rollback allows), every block is released and
 * n_computed becomes 0: the sequence is recomputed from its start.  Only
 * for a scheduler without prefix caching, or blocks never published. */
void sched_rewind(struct sched *s, struct seq *q, int n);

/* Check every running and waiting sequence against the pools: tables
 * within bounds, sliding entries released exactly before win_lo, and each
 * block's reference count equal to the table entries naming it (nothing
 * else may hold blocks); false + logged reason if broken.  For tests. */
bool sched_check(const struct sched *s);

/* A running sequence that shares the parent's blocks (n > 1 samples): the
 * child must have the same first n_computed tokens; it takes one of the
 * parent's reserved slots. */
void sched_fork(struct sched *s, struct seq *parent, struct seq *child);

/* Remove a sequence (finished or aborted) from whichever queue holds it
 * and release its blocks; status becomes SEQ_FINISHED. */
void sched_finish(struct sched *s, struct seq *q);

#endif
