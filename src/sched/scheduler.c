/* scheduler.c — see scheduler.h for the policy.  Invariants: a WAITING
 * sequence holds no blocks; a RUNNING one holds exactly the blocks covering
 * its n_computed positions (plus those allocated for the current step) —
 * in the sliding pool only from win_lo on, which never passes the first
 * block the window of its committed position reads (sched_check). */
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
    b->win_copies = xcalloc((size_t)max_seqs, sizeof *b->win_copies);
    if (!b->seqs || !b->n_new || !b->copies || !b->win_copies) { sched_batch_deinit(b); return KVLLM_ENOMEM; }
    return 0;
}

void sched_batch_deinit(struct sched_batch *b) {
    if (!b) return;
    free(b->seqs);
    free(b->n_new);
    free(b->copies);
    free(b->win_copies);
    memset(b, 0, sizeof *b);
}

int sched_blocks_for(const struct sched *s, int n_tokens) {
    return (n_tokens + s->pool->block_size - 1) / s->pool->block_size;
}

void sched_set_window(struct sched *s, struct block_pool *win_pool, int window, int rollback) {
    KV_ASSERT(window > 0 && rollback >= 0 && s->n_running == 0 && s->n_waiting == 0);
    block_pool_link(win_pool, s->pool);
    s->win_pool = win_pool;
    s->window = window;
    s->rollback = rollback;
}

/* A token at position p reads p - window + 1 .. p, which (with a rollback)
 * start no earlier than committed - rollback - window + 1; the blocks of the
 * step's n_new tokens follow, and a range straddles one block more. */
int sched_win_blocks_per_seq(int window, int rollback, int n_new, int block_size) {
    return (window - 1 + rollback + n_new + block_size - 1) / block_size + 1;
}

/* First logical block the window of a token at position pos reads. */
static int win_first(const struct sched *s, int pos) {
    const int p = pos - s->window + 1;
    return p > 0 ? p / s->pool->block_size : 0;
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
    if (s->win_pool) {
        int w = sched_win_blocks_per_seq(s->window, s->rollback, s->cfg.max_batch_tokens, s->pool->block_size);
        if (w < need) need = w;
        if (need > s->win_pool->n_blocks) {
            LOG_ERR("request of up to %d tokens needs %d sliding-window KV blocks but that pool only has %d: "
                    "it can never fit", max_len, need, s->win_pool->n_blocks);
            return KVLLM_ERANGE;
        }
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

/* Release q's blocks from logical block keep on, in both tables (tail
 * first: it is evicted first). */
static void release_tail(struct sched *s, struct seq *q, int keep) {
    for (int i = q->n_blocks - 1; i >= keep; i--) {
        block_pool_release(s->pool, q->blocks[i]);
        if (s->win_pool && i >= q->win_lo) block_pool_release(s->win_pool, q->win_blocks[i]);
    }
    if (q->n_blocks > keep) q->n_blocks = keep;
    if (q->win_lo > q->n_blocks) q->win_lo = q->n_blocks;
}

static void release_blocks(struct sched *s, struct seq *q) {
    release_tail(s, q, 0);
    q->win_lo = 0;
    q->n_computed = 0;
    q->n_published = 0;
}

/* Release the sliding blocks no future window reads: those wholly before
 * the window of q's committed position, less the rollback allowed. */
static void slide(struct sched *s, struct seq *q) {
    if (!s->win_pool || q->status != SEQ_RUNNING) return;
    const int verified = q->n_tokens - q->n_spec;
    const int lo = win_first(s, (q->n_computed < verified ? q->n_computed : verified) - s->rollback);
    for (; q->win_lo < lo && q->win_lo < q->n_blocks; q->win_lo++) {  /* oldest first: evicted first */
        block_pool_release(s->win_pool, q->win_blocks[q->win_lo]);
        q->win_blocks[q->win_lo] = -1;
    }
}

/* Does block bi of table (in pool p) need a private copy before position
 * n_computed is written into it? */
static bool needs_cow(const struct block_pool *p, const int32_t *table, const struct seq *q) {
    int bi = q->n_computed / p->block_size;
    return q->n_computed % p->block_size && bi < q->n_blocks && p->ref[table[bi]] > 1;
}

/* Can q be grown to cover positions [0, upto), copies included, in both pools? */
static bool fits(const struct sched *s, const struct seq *q, int upto) {
    int grow_by = sched_blocks_for(s, upto) - q->n_blocks;
    if (grow_by < 0) grow_by = 0;
    if (grow_by + needs_cow(s->pool, q->blocks, q) > s->pool->n_free) return false;
    return !s->win_pool || grow_by + needs_cow(s->win_pool, q->win_blocks, q) <= s->win_pool->n_free;
}

/* Copy-on-write of the shared block position n_computed falls in. */
static void cow(struct block_pool *p, int32_t *table, const struct seq *q, int32_t (*copies)[2], int *n_copies) {
    if (!needs_cow(p, table, q)) return;
    int bi = q->n_computed / p->block_size;
    int32_t fresh = block_pool_alloc(p);
    KV_ASSERT(fresh >= 0);
    copies[*n_copies][0] = fresh;
    copies[*n_copies][1] = table[bi];
    (*n_copies)++;
    block_pool_release(p, table[bi]);
    table[bi] = fresh;
}

/* Allocate what fits checked. */
static void grow(struct sched *s, struct seq *q, int upto, struct sched_batch *b) {
    cow(s->pool, q->blocks, q, b->copies, &b->n_copies);
    if (s->win_pool) cow(s->win_pool, q->win_blocks, q, b->win_copies, &b->n_win_copies);
    while (q->n_blocks < sched_blocks_for(s, upto)) {
        int32_t id = block_pool_alloc(s->pool);
        KV_ASSERT(id >= 0 && q->n_blocks < q->max_blocks);
        if (s->win_pool) {
            q->win_blocks[q->n_blocks] = block_pool_alloc(s->win_pool);
            KV_ASSERT(q->win_blocks[q->n_blocks] >= 0);
        }
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

/* The longest prefix of q's first h matched blocks whose sliding window
 * (the blocks the token after it reads) win_pool still holds, each block
 * verified against the global block matched for its index; the hits are
 * noted in q->win_blocks.  A window block found missing cuts the prefix
 * back to end before it: no shorter window skips it. */
static int win_hit(struct sched *s, struct seq *q, int h) {
    const int bs = s->pool->block_size;
    while (h > 0) {
        const int lo = win_first(s, h * bs);
        int k = h - 1;
        for (; k >= lo; k--) {
            int32_t id = block_pool_match(s->win_pool, q->hashes[k], q->blocks[k], q->tokens + (size_t)k * bs);
            if (id < 0) break;
            q->win_blocks[k] = id;
        }
        if (k < lo) return h;
        h = k;
    }
    return 0;
}

/* Admit the head of the waiting queue if it fits; false changes nothing. */
static bool admit(struct sched *s, struct sched_batch *b, int budget) {
    struct seq *q = *ring_at(s, 0);
    const int bs = s->pool->block_size;
    if (s->n_running_reserved + q->n_reserved > s->cfg.max_seqs) return false;
    /* cached prefix: full blocks only, and never the last token (it gives the logits) */
    /* hits are noted in q->blocks (unused while waiting), retained only on success;
     * a hit is verified: its tokens, and its parent being the previous hit */
    int n_hit = 0, n_hit_free = 0, n_win_free = 0;
    if (s->cfg.prefix_caching) {
        int n_full = (q->n_tokens - 1) / bs;
        hash_blocks(s, q, n_full);
        for (; n_hit < n_full; n_hit++) {
            int32_t id = block_pool_match(s->pool, q->hashes[n_hit], n_hit ? q->blocks[n_hit - 1] : -1,
                                          q->tokens + (size_t)n_hit * bs);
            if (id < 0) break;
            q->blocks[n_hit] = id;
        }
        if (s->win_pool) n_hit = win_hit(s, q, n_hit);
        for (int i = 0; i < n_hit; i++) n_hit_free += s->pool->ref[q->blocks[i]] == 0;
    }
    int start = n_hit * bs, win_lo = s->win_pool ? win_first(s, start) : 0;
    for (int i = win_lo; s->win_pool && i < n_hit; i++) n_win_free += s->win_pool->ref[q->win_blocks[i]] == 0;
    int c = q->n_tokens - start < budget ? q->n_tokens - start : budget;
    int need = sched_blocks_for(s, start + c) - n_hit;
    if (need > s->pool->n_free - n_hit_free) return false;
    if (s->win_pool && need > s->win_pool->n_free - n_win_free) return false;

    pop_front(s);
    for (int i = 0; i < n_hit; i++) block_pool_retain(s->pool, q->blocks[i]);
    for (int i = 0; i < win_lo; i++) q->win_blocks[i] = -1;
    for (int i = win_lo; s->win_pool && i < n_hit; i++) block_pool_retain(s->win_pool, q->win_blocks[i]);
    q->win_lo = win_lo;
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
    b->n_seqs = b->n_tokens = b->n_copies = b->n_win_copies = 0;
    int budget = s->cfg.max_batch_tokens;
    bool preempted = false;
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        struct seq *q = s->running[i];
        int c = q->n_tokens - q->n_computed;
        if (c <= 0) continue;
        /* drafts give way first: to the budget, then to the free blocks (never preempt for them) */
        int drop = c > budget ? c - budget : 0;
        if (drop > q->n_spec) drop = q->n_spec;
        while (drop < q->n_spec && !fits(s, q, q->n_computed + c - drop)) drop++;
        q->n_spec -= drop;
        q->n_tokens -= drop;
        c -= drop;
        if (c > budget) c = budget;
        while (!fits(s, q, q->n_computed + c)) {
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

/* Publish q's sliding block k (full and verified) under the hash of the
 * global block k, its parent in the linked pool; only when that global
 * block is the cached copy of its prefix, the one a later asker matches. */
static void publish_win(struct sched *s, struct seq *q, int k) {
    const int32_t id = k >= q->win_lo ? q->win_blocks[k] : -1, twin = q->blocks[k];
    if (id < 0 || s->win_pool->hash[id] != 0 || s->pool->hash[twin] != q->hashes[k]) return;
    block_pool_publish(s->win_pool, id, q->hashes[k], twin, q->tokens + (size_t)k * s->pool->block_size);
}

/* Publish q's full blocks whose tokens are computed and verified (no draft). */
static void publish_full(struct sched *s, struct seq *q) {
    const int bs = s->pool->block_size;
    const int n_verified = q->n_tokens - q->n_spec - q->n_pending;
    int n_full = (q->n_computed < n_verified ? q->n_computed : n_verified) / bs;
    hash_blocks(s, q, n_full);
    for (; q->n_published < n_full; q->n_published++) {
        const int k = q->n_published;
        int32_t id = q->blocks[k], parent = k ? q->blocks[k - 1] : -1;
        /* skipped when a hit, or shared: published already; and when the parent is not the cached
         * copy of its prefix (another block won that hash): it could never be matched as the
         * parent, so its children stay unpublished */
        if (s->pool->hash[id] == 0 && (parent < 0 || s->pool->hash[parent] == q->hashes[k - 1]))
            block_pool_publish(s->pool, id, q->hashes[k], parent, q->tokens + (size_t)k * bs);
        if (s->win_pool) publish_win(s, q, k);
    }
}

void sched_advance(struct sched *s, const struct sched_batch *b) {
    (void)s;
    for (int i = 0; i < b->n_seqs; i++)
        if (b->seqs[i]->status == SEQ_RUNNING) b->seqs[i]->n_computed += b->n_new[i];
}

void sched_publish(struct sched *s, const struct sched_batch *b) {
    for (int i = 0; i < b->n_seqs; i++) {
        struct seq *q = b->seqs[i];
        if (q->status != SEQ_RUNNING) continue;
        KV_ASSERT(q->n_pending == 0);
        if (s->cfg.no_kv_cache && q->n_computed == q->n_tokens) { release_blocks(s, q); continue; }
        if (s->cfg.prefix_caching) publish_full(s, q);   /* first: a slid-out block stays cached */
        slide(s, q);
    }
}

void sched_commit(struct sched *s, const struct sched_batch *b) {
    sched_advance(s, b);
    sched_publish(s, b);
}

void sched_add_placeholder(struct seq *q) {
    KV_ASSERT(q->status == SEQ_RUNNING && q->n_tokens < q->max_len && q->n_spec == 0);
    q->tokens[q->n_tokens++] = -1;
    q->n_pending++;
}

void sched_drop_placeholder(struct seq *q) {
    q->n_tokens -= q->n_pending;
    q->n_pending = 0;
}

void sched_batch_prune(struct sched *s, struct sched_batch *b) {
    int n = 0;
    b->n_tokens = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        struct seq *q = b->seqs[i];
        if (q->status != SEQ_RUNNING) continue;
        /* a running sequence got the token its placeholder stood for (else it finished) */
        KV_ASSERT(q->n_pending == 0 && q->n_computed + b->n_new[i] <= q->n_tokens);
        b->seqs[n] = q;
        b->n_new[n] = b->n_new[i];
        b->n_tokens += b->n_new[n++];
    }
    b->n_seqs = n;
    n = 0;
    for (int i = 0; i < b->n_copies; i++)
        if (s->pool->ref[b->copies[i][0]] > 0) memcpy(b->copies[n++], b->copies[i], sizeof *b->copies);
    b->n_copies = n;
    n = 0;
    for (int i = 0; i < b->n_win_copies; i++)
        if (s->win_pool->ref[b->win_copies[i][0]] > 0) memcpy(b->win_copies[n++], b->win_copies[i], sizeof *b->win_copies);
    b->n_win_copies = n;
}

void sched_spec_resolve(struct sched *s, struct seq *q, int n_valid) {
    q->n_spec = 0;
    if (q->status != SEQ_RUNNING) return;
    KV_ASSERT(n_valid >= 0 && n_valid <= q->n_computed && n_valid <= q->n_tokens);
    const int bs = s->pool->block_size;
    /* blocks past those covering n_valid hold only rejected positions: allocated this step, never
     * published; the sliding window of n_valid is held (slide kept what drafts could roll back) */
    sched_rewind(s, q, n_valid);
    /* hashes and publications never covered a draft (publish_full), so none is undone here */
    KV_ASSERT(q->n_hashed <= n_valid / bs);
    if (s->cfg.prefix_caching) publish_full(s, q);
    slide(s, q);
}

void sched_fork(struct sched *s, struct seq *parent, struct seq *child) {
    KV_ASSERT(parent->status == SEQ_RUNNING && parent->n_reserved > 1 && child->max_blocks >= parent->n_blocks);
    for (int i = 0; i < parent->n_blocks; i++) {
        block_pool_retain(s->pool, parent->blocks[i]);
        child->blocks[i] = parent->blocks[i];
        child->win_blocks[i] = i >= parent->win_lo ? parent->win_blocks[i] : -1;
        if (s->win_pool && i >= parent->win_lo) block_pool_retain(s->win_pool, parent->win_blocks[i]);
    }
    child->n_blocks = parent->n_blocks;
    child->win_lo = parent->win_lo;
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
    sched_rewind(s, q, n_tokens);
}

void sched_rewind(struct sched *s, struct seq *q, int n) {
    KV_ASSERT(n >= 0);
    if (q->n_computed > n) q->n_computed = n;
    if (q->status != SEQ_RUNNING) return;
    if (s->win_pool && win_first(s, q->n_computed) < q->win_lo) {
        release_blocks(s, q);   /* the window was released: recompute from the start */
        return;
    }
    release_tail(s, q, sched_blocks_for(s, q->n_computed));
}

/* ---- invariants ---- */

static bool check_seq(const struct sched *s, const struct seq *q, int32_t *refs, int32_t *win_refs) {
#define SC_FAIL(...) do { LOG_ERR("sched_check: " __VA_ARGS__); return false; } while (0)
    if (q->status == SEQ_WAITING && (q->n_blocks || q->win_lo))
        SC_FAIL("waiting sequence %llu holds %d blocks", (unsigned long long)q->id, q->n_blocks);
    if (q->n_blocks < 0 || q->n_blocks > q->max_blocks || q->n_blocks < sched_blocks_for(s, q->n_computed))
        SC_FAIL("sequence %llu: %d blocks for %d computed positions", (unsigned long long)q->id, q->n_blocks,
                q->n_computed);
    for (int i = 0; i < q->n_blocks; i++) {
        if (q->blocks[i] < 0 || q->blocks[i] >= s->pool->n_blocks)
            SC_FAIL("sequence %llu: block %d is %d", (unsigned long long)q->id, i, q->blocks[i]);
        refs[q->blocks[i]]++;
    }
    if (!s->win_pool) return true;
    /* the window of the next position to compute is held (slide keeps rollback positions more) */
    const int verified = q->n_tokens - q->n_spec;
    const int next = q->n_computed < verified ? q->n_computed : verified;
    if (q->win_lo < 0 || q->win_lo > q->n_blocks || (q->n_computed > 0 && q->win_lo > win_first(s, next)))
        SC_FAIL("sequence %llu: sliding blocks from %d of %d, its window from %d", (unsigned long long)q->id,
                q->win_lo, q->n_blocks, win_first(s, next));
    for (int i = 0; i < q->n_blocks; i++) {
        const int32_t id = q->win_blocks[i];
        if (i < q->win_lo ? id != -1 : id < 0 || id >= s->win_pool->n_blocks)
            SC_FAIL("sequence %llu: sliding block %d is %d (held from %d)", (unsigned long long)q->id, i, id,
                    q->win_lo);
        if (id >= 0) win_refs[id]++;
    }
    return true;
}

static bool check_refs(const struct block_pool *p, const int32_t *refs, const char *name) {
    for (int id = 0; id < p->n_blocks; id++)
        if (p->ref[id] != refs[id]) SC_FAIL("%s block %d: ref %d, named by %d tables", name, id, p->ref[id], refs[id]);
    return block_pool_check(p);
#undef SC_FAIL
}

bool sched_check(const struct sched *s) {
    const int nw = s->win_pool ? s->win_pool->n_blocks : 0;
    int32_t *refs = xcalloc((size_t)(s->pool->n_blocks + nw), sizeof *refs);
    if (!refs) return false;
    bool ok = true;
    for (int i = 0; ok && i < s->n_running; i++)
        ok = s->running[i]->status == SEQ_RUNNING && check_seq(s, s->running[i], refs, refs + s->pool->n_blocks);
    for (int i = 0; ok && i < s->n_waiting; i++)
        ok = check_seq(s, s->waiting[(s->wait_head + i) % (s->cfg.max_waiting + s->cfg.max_seqs)], refs,
                       refs + s->pool->n_blocks);
    ok = ok && check_refs(s->pool, refs, "pool") && (!s->win_pool || check_refs(s->win_pool, refs + s->pool->n_blocks,
                                                                                    "sliding pool"));
    free(refs);
    return ok;
}
