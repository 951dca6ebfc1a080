/* scheduler.c — see scheduler.h for the policy.  Invariants: a WAITING
 * sequence holds no blocks; a RUNNING one holds exactly the blocks covering
 * its n_computed positions (plus those allocated for the current step). */
#include "sched/scheduler.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

int sched_init(struct sched *s, struct block_pool *pool, const struct sched_config *cfg) {
    memset(s, 0, sizeof *s);
    if (cfg->max_seqs < 1 || cfg->max_batch_tokens < 1 || cfg->max_waiting < 1) return KVLLM_EINVAL;
    s->pool = pool;
    s->cfg = *cfg;
    s->running = xcalloc((size_t)cfg->max_seqs, sizeof *s->running);
    /* preempted sequences come back to the queue on top of max_waiting */
    s->waiting = xcalloc((size_t)(cfg->max_waiting + cfg->max_seqs), sizeof *s->waiting);
    if (!s->running || !s->waiting) { sched_deinit(s); return KVLLM_ENOMEM; }
    return 0;
}

void sched_deinit(struct sched *s) {
    if (!s) return;
    free(s->running);
    free(s->waiting);
    memset(s, 0, sizeof *s);
}

int sched_batch_init(struct sched_batch *b, int max_seqs) {
    memset(b, 0, sizeof *b);
    b->seqs = xcalloc((size_t)max_seqs, sizeof *b->seqs);
    b->n_new = xcalloc((size_t)max_seqs, sizeof *b->n_new);
    b->copies = xcalloc((size_t)max_seqs, sizeof *b->copies);
    if (!b->seqs || !b->n_new || !b->copies) { sched_batch_deinit(b); return KVLLM_ENOMEM; }
    return 0;
}

void sched_batch_deinit(struct sched_batch *b) {
    if (!b) return;
    free(b->seqs);
    free(b->n_new);
    free(b->copies);
    memset(b, 0, sizeof *b);
}

int sched_blocks_for(const struct sched *s, int n_tokens) {
    return (n_tokens + s->pool->block_size - 1) / s->pool->block_size;
}

/* ---- the waiting ring ---- */

static int ring_cap(const struct sched *s) { return s->cfg.max_waiting + s->cfg.max_seqs; }
static struct seq **ring_at(struct sched *s, int i) { return &s->waiting[(s->wait_head + i) % ring_cap(s)]; }

static void push_front(struct sched *s, struct seq *q) {
    KV_ASSERT(s->n_waiting < ring_cap(s));
    s->wait_head = (s->wait_head + ring_cap(s) - 1) % ring_cap(s);
    s->waiting[s->wait_head] = q;
    s->n_waiting++;
}

static struct seq *pop_front(struct sched *s) {
    struct seq *q = s->waiting[s->wait_head];
    s->wait_head = (s->wait_head + 1) % ring_cap(s);
    s->n_waiting--;
    return q;
}

int sched_check_fits(const struct sched *s, int max_len, int n_parallel) {
    int need = sched_blocks_for(s, max_len);
    if (need > s->pool->n_blocks) {
        LOG_ERR("request of up to %d tokens needs %d KV blocks of %d tokens but the pool only has %d "
                "(%d tokens): it can never fit", max_len, need, s->pool->block_size, s->pool->n_blocks,
                s->pool->n_blocks * s->pool->block_size);
        return KVLLM_ERANGE;
    }
    if (n_parallel > s->cfg.max_seqs) {
        LOG_ERR("request asks for %d parallel sequences but --max-seqs is %d", n_parallel, s->cfg.max_seqs);
        return KVLLM_ERANGE;
    }
    return 0;
}

int sched_add(struct sched *s, struct seq *q) {
    int rc = sched_check_fits(s, q->max_len, q->n_reserved);
    if (rc) return rc;
    if (s->n_waiting >= s->cfg.max_waiting) return KVLLM_ENOMEM;
    q->status = SEQ_WAITING;
    *ring_at(s, s->n_waiting) = q;
    s->n_waiting++;
    return 0;
}

/* ---- blocks ---- */

static void release_blocks(struct sched *s, struct seq *q) {
    for (int i = q->n_blocks - 1; i >= 0; i--) block_pool_release(s->pool, q->blocks[i]); /* tail evicted first */
    q->n_blocks = 0;
    q->n_computed = 0;
    q->n_published = 0;
}

/* Does the block that position n_computed falls in need a private copy? */
static bool needs_cow(const struct sched *s, const struct seq *q) {
    int bi = q->n_computed / s->pool->block_size;
    return q->n_computed % s->pool->block_size && bi < q->n_blocks && s->pool->ref[q->blocks[bi]] > 1;
}

/* New blocks needed so that q covers positions [0, upto), copy included. */
static int blocks_needed(const struct sched *s, const struct seq *q, int upto) {
    int need = sched_blocks_for(s, upto) - q->n_blocks;
    return (need > 0 ? need : 0) + (needs_cow(s, q) ? 1 : 0);
}

/* Allocate what blocks_needed counted (the caller checked it fits). */
static void grow(struct sched *s, struct seq *q, int upto, struct sched_batch *b) {
    if (needs_cow(s, q)) {
        int bi = q->n_computed / s->pool->block_size;
        int32_t fresh = block_pool_alloc(s->pool);
        KV_ASSERT(fresh >= 0);
        b->copies[b->n_copies][0] = fresh;
        b->copies[b->n_copies][1] = q->blocks[bi];
        b->n_copies++;
        block_pool_release(s->pool, q->blocks[bi]);
        q->blocks[bi] = fresh;
    }
    while (q->n_blocks < sched_blocks_for(s, upto)) {
        int32_t id = block_pool_alloc(s->pool);
        KV_ASSERT(id >= 0 && q->n_blocks < q->max_blocks);
        q->blocks[q->n_blocks++] = id;
    }
}

static void remove_running(struct sched *s, int i) {
    s->n_running_reserved -= s->running[i]->n_reserved;
    memmove(&s->running[i], &s->running[i + 1], (size_t)(s->n_running - i - 1) * sizeof *s->running);
    s->n_running--;
}

static void preempt_last(struct sched *s) {
    struct seq *v = s->running[s->n_running - 1];
    remove_running(s, s->n_running - 1);
    release_blocks(s, v);
    v->n_tokens -= v->n_spec;   /* drafts are not worth recomputing: the recompute proposes afresh */
    v->n_spec = 0;
    v->status = SEQ_WAITING;
    v->n_preemptions++;
    s->n_preemptions++;
    push_front(s, v);
}

static void add_to_batch(struct sched_batch *b, struct seq *q, int c) {
    b->seqs[b->n_seqs] = q;
    b->n_new[b->n_seqs] = c;
    b->n_seqs++;
    b->n_tokens += c;
}

/* Extend q's hash chain over its first n_full full blocks. */
static void hash_blocks(const struct sched *s, struct seq *q, int n_full) {
    const int bs = s->pool->block_size;
    for (; q->n_hashed < n_full; q->n_hashed++) {
        uint64_t parent = q->n_hashed ? q->hashes[q->n_hashed - 1] : 0;
        q->hashes[q->n_hashed] = block_pool_hash(s->pool, parent, q->tokens + (size_t)q->n_hashed * bs);
    }
}

/* Admit the head of the waiting queue if it fits; false changes nothing. */
static bool admit(struct sched *s, struct sched_batch *b, int budget) {
    struct seq *q = *ring_at(s, 0);
    const int bs = s->pool->block_size;
    if (s->n_running_reserved + q->n_reserved > s->cfg.max_seqs) return false;
    /* cached prefix: full blocks only, and never the last token (it gives the logits) */
    /* hits are noted in q->blocks (unused while waiting), retained only on success;
     * a hit is verified: its tokens, and its parent being the previous hit */
    int n_hit = 0, n_hit_free = 0;
    if (s->cfg.prefix_caching) {
        int n_full = (q->n_tokens - 1) / bs;
        hash_blocks(s, q, n_full);
        for (; n_hit < n_full; n_hit++) {
            int32_t id = block_pool_match(s->pool, q->hashes[n_hit], n_hit ? q->blocks[n_hit - 1] : -1,
                                          q->tokens + (size_t)n_hit * bs);
            if (id < 0) break;
            q->blocks[n_hit] = id;
            n_hit_free += s->pool->ref[id] == 0;
        }
    }
    int start = n_hit * bs;
    int c = q->n_tokens - start < budget ? q->n_tokens - start : budget;
    int need = sched_blocks_for(s, start + c) - n_hit;
    if (need > s->pool->n_free - n_hit_free) return false;

    pop_front(s);
    for (int i = 0; i < n_hit; i++) block_pool_retain(s->pool, q->blocks[i]);
    q->n_blocks = q->n_published = n_hit;
    q->n_computed = start;
    grow(s, q, start + c, b);
    q->status = SEQ_RUNNING;
    q->admitted = ++s->stamp;
    s->running[s->n_running++] = q;
    s->n_running_reserved += q->n_reserved;
    s->n_prompt_tokens += (uint64_t)q->n_tokens;
    s->n_cached_tokens += (uint64_t)start;
    add_to_batch(b, q, c);
    return true;
}

void sched_schedule(struct sched *s, struct sched_batch *b) {
    b->n_seqs = b->n_tokens = b->n_copies = 0;
    int budget = s->cfg.max_batch_tokens;
    bool preempted = false;
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        struct seq *q = s->running[i];
        int c = q->n_tokens - q->n_computed;
        if (c <= 0) continue;
        /* drafts give way first: to the budget, then to the free blocks (never preempt for them) */
        int drop = c > budget ? c - budget : 0;
        if (drop > q->n_spec) drop = q->n_spec;
        while (drop < q->n_spec && blocks_needed(s, q, q->n_computed + c - drop) > s->pool->n_free) drop++;
        q->n_spec -= drop;
        q->n_tokens -= drop;
        c -= drop;
        if (c > budget) c = budget;
        while (blocks_needed(s, q, q->n_computed + c) > s->pool->n_free) {
            struct seq *victim = s->running[s->n_running - 1];
            preempt_last(s);
            preempted = true;
            if (victim == q) break;
        }
        if (q->status != SEQ_RUNNING) break; /* q itself was preempted: nothing after it is left */
        grow(s, q, q->n_computed + c, b);
        add_to_batch(b, q, c);
        budget -= c;
    }
    /* a step that had to preempt admits nobody: the pool is under pressure */
    while (!preempted && s->n_waiting > 0 && budget > 0 && admit(s, b, budget))
        budget -= b->n_new[b->n_seqs - 1];
}

/* Publish q's full blocks whose tokens are computed and verified (no draft). */
static void publish_full(struct sched *s, struct seq *q) {
    const int bs = s->pool->block_size;
    const int n_verified = q->n_tokens - q->n_spec;
    int n_full = (q->n_computed < n_verified ? q->n_computed : n_verified) / bs;
    hash_blocks(s, q, n_full);
    for (; q->n_published < n_full; q->n_published++) {
        const int k = q->n_published;
        int32_t id = q->blocks[k], parent = k ? q->blocks[k - 1] : -1;
        if (s->pool->hash[id] != 0) continue; /* a hit, or shared: published already */
        /* a parent that is not the cached copy of its prefix (another block won that
         * hash) could never be matched as the parent: its children stay unpublished */
        if (parent >= 0 && s->pool->hash[parent] != q->hashes[k - 1]) continue;
        block_pool_publish(s->pool, id, q->hashes[k], parent, q->tokens + (size_t)k * bs);
    }
}

void sched_commit(struct sched *s, const struct sched_batch *b) {
    for (int i = 0; i < b->n_seqs; i++) {
        struct seq *q = b->seqs[i];
        if (q->status != SEQ_RUNNING) continue;
        q->n_computed += b->n_new[i];
        if (s->cfg.no_kv_cache && q->n_computed == q->n_tokens) { release_blocks(s, q); continue; }
        if (s->cfg.prefix_caching) publish_full(s, q);
    }
}

void sched_spec_resolve(struct sched *s, struct seq *q, int n_valid) {
    q->n_spec = 0;
    if (q->status != SEQ_RUNNING) return;
    KV_ASSERT(n_valid >= 0 && n_valid <= q->n_computed && n_valid <= q->n_tokens);
    const int bs = s->pool->block_size;
    const int keep = sched_blocks_for(s, n_valid);
    /* blocks past keep hold only rejected positions: allocated this step, never published */
    for (int i = q->n_blocks - 1; i >= keep; i--) block_pool_release(s->pool, q->blocks[i]);
    if (q->n_blocks > keep) q->n_blocks = keep;
    q->n_computed = n_valid;
    /* hashes and publications never covered a draft (publish_full), so none is undone here */
    KV_ASSERT(q->n_hashed <= n_valid / bs);
    if (s->cfg.prefix_caching) publish_full(s, q);
}

void sched_fork(struct sched *s, struct seq *parent, struct seq *child) {
    KV_ASSERT(parent->status == SEQ_RUNNING && parent->n_reserved > 1 && child->max_blocks >= parent->n_blocks);
    for (int i = 0; i < parent->n_blocks; i++) {
        block_pool_retain(s->pool, parent->blocks[i]);
        child->blocks[i] = parent->blocks[i];
    }
    child->n_blocks = parent->n_blocks;
    child->n_computed = parent->n_computed;
    memcpy(child->hashes, parent->hashes, (size_t)parent->n_hashed * sizeof *child->hashes);
    child->n_hashed = parent->n_hashed;
    child->n_published = parent->n_published;
    parent->n_reserved--;
    child->n_reserved = 1;
    child->status = SEQ_RUNNING;
    child->admitted = ++s->stamp;
    KV_ASSERT(s->n_running < s->cfg.max_seqs);
    s->running[s->n_running++] = child;
}

void sched_finish(struct sched *s, struct seq *q) {
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i] == q) { remove_running(s, i); break; }
    for (int i = 0; i < s->n_waiting; i++) {
        if (*ring_at(s, i) != q) continue;
        for (int j = i; j + 1 < s->n_waiting; j++) *ring_at(s, j) = *ring_at(s, j + 1);
        s->n_waiting--;
        break;
    }
    release_blocks(s, q);
    q->status = SEQ_FINISHED;
}

void sched_truncate(struct sched *s, struct seq *q, int n_tokens) {
    KV_ASSERT(!s->cfg.prefix_caching && n_tokens >= 0 && n_tokens <= q->n_tokens);
    q->n_tokens = n_tokens;
    q->n_spec = 0;
    if (q->n_computed > n_tokens) q->n_computed = n_tokens;
    if (q->status != SEQ_RUNNING) return;
    const int keep = sched_blocks_for(s, q->n_computed);
    for (int i = q->n_blocks - 1; i >= keep; i--) block_pool_release(s->pool, q->blocks[i]);
    if (q->n_blocks > keep) q->n_blocks = keep;
}
