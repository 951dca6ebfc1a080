/* test_sched_async.c — the scheduler driven as the engine drives it with
 * asynchronous scheduling (no model): step t issued, sched_advance, a
 * placeholder for every sequence about to sample, step t+1 planned, then
 * the placeholders dropped, sched_publish(t), the tokens "sampled" (some
 * sequences end, some are aborted while t runs), and t+1 pruned before it
 * is issued.  A fake KV store (each slot: the fingerprint of the exact
 * prefix its position was computed for) shows that no sequence ever reads
 * K/V computed for another prefix nor computes a position whose token is
 * unknown, through prefix hits over a two-token alphabet (many equal
 * blocks), preemption and recompute, and hash collisions forced; that no
 * published block ever covers a placeholder; and that every block is back
 * at the end (sched_check after every step).  With a sliding-window pool
 * too, whose blocks slide only once a step is published. */
#include "check.h"
#include "kv_util.h"
#include "kvllm.h"
#include "sched/scheduler.h"
#include "sched_util.h"

#include <string.h>

#define BS 4
#define N_BLOCKS 12
#define WINDOW 6

static struct block_pool pool, win_pool;
static struct sched sch;
static struct sched_batch cur, next;
static uint64_t kv_fp[N_BLOCKS * BS];   /* (n_blocks * BS) the prefix each slot was computed with */
static unsigned rng = 7;

static unsigned rnd(void) {
    rng = rng * 1103515245u + 12345u;
    return rng >> 16;
}

static void setup(bool window, uint64_t (*hash_fn)(uint64_t, uint64_t, const int32_t *, int)) {
    block_pool_set_hash_fn(hash_fn);
    CHECK(block_pool_init(&pool, N_BLOCKS, BS) == 0);
    block_pool_set_hash_fn(NULL);
    struct sched_config c = { .max_seqs = 4, .max_batch_tokens = 9, .max_waiting = 8, .prefix_caching = true };
    CHECK(sched_init(&sch, &pool, &c) == 0);
    if (window) {
        CHECK(block_pool_init(&win_pool, N_BLOCKS, BS) == 0);
        sched_set_window(&sch, &win_pool, WINDOW, 0);
    }
    CHECK(sched_batch_init(&cur, 4) == 0 && sched_batch_init(&next, 4) == 0);
}

static void teardown(void) {
    sched_batch_deinit(&cur);
    sched_batch_deinit(&next);
    sched_deinit(&sch);
    block_pool_deinit(&pool);
    block_pool_deinit(&win_pool);
}

/* "Run" the issued batch on the fake store: copies, then every read checked and every write made.
 * Returns the positions read holding another prefix's K/V or computed from an unknown token, and the
 * sequences issued that no longer run. */
static int issue(void) {
    int bad = 0;
    for (int k = 0; k < cur.n_copies; k++)
        memcpy(&kv_fp[cur.copies[k][0] * BS], &kv_fp[cur.copies[k][1] * BS], BS * sizeof *kv_fp);
    for (int i = 0; i < cur.n_seqs; i++) {
        const struct seq *q = cur.seqs[i];
        bad += q->status != SEQ_RUNNING;   /* a finished (or preempted) sequence computes nothing */
        for (int t = 0; t < q->n_computed; t++)   /* the global pool holds every position */
            bad += kv_fp[q->blocks[t / BS] * BS + t % BS] != tu_prefix_fp(q->tokens, t + 1);
        for (int t = q->n_computed; t < q->n_computed + cur.n_new[i]; t++) {
            bad += q->tokens[t] < 0;
            kv_fp[q->blocks[t / BS] * BS + t % BS] = tu_prefix_fp(q->tokens, t + 1);
        }
    }
    return bad;
}

/* Published blocks never cover a placeholder (or any token not yet known). */
static bool published_known(const struct seq *q) {
    for (int t = 0; t < q->n_published * BS; t++)
        if (q->tokens[t] < 0) return false;
    return true;
}


/* A pipelined workload of n sequences; returns the bad positions; *cached: prompt tokens the cache served. */
static int workload(bool window, uint64_t (*hash_fn)(uint64_t, uint64_t, const int32_t *, int), uint64_t *cached) {
    setup(window, hash_fn);
    enum { N = 60 };
    struct seq *q[N];
    for (int i = 0; i < N; i++) {
        int32_t t[32];
        const int np = 1 + (int)(rnd() % 16), max_len = np + 1 + (int)(rnd() % 12);
        for (int k = 0; k < np; k++) t[k] = (int32_t)(rnd() % 2);
        q[i] = seq_new((uint64_t)i, t, np, max_len, BS);
    }
    int added = 0, done = 0, steps = 0, bad = 0, aborted = 0, planned_steps = 0;
    bool planned = false;
    while (done < N && steps < 100000) {
        while (added < N && sched_add(&sch, q[added]) == 0) added++;
        if (planned) sched_batch_prune(&sch, &cur);
        if (!planned || !cur.n_tokens) sched_schedule(&sch, &cur);
        planned = false;
        steps++;
        if (!cur.n_tokens) continue;
        bad += issue();
        /* while it "runs": an abort now and then, the plan of the next step */
        if (rnd() % 11 == 0) {
            struct seq *v = cur.seqs[rnd() % (unsigned)cur.n_seqs];
            if (v->status == SEQ_RUNNING) { sched_finish(&sch, v); done++; aborted++; }
        }
        sched_advance(&sch, &cur);
        bool samples[4];   /* a last row of logits: a token comes (the last one allowed gets no placeholder) */
        for (int i = 0; i < cur.n_seqs; i++) {
            const struct seq *s = cur.seqs[i];
            samples[i] = s->status == SEQ_RUNNING && s->n_computed == s->n_tokens;
            if (samples[i] && s->n_tokens + 1 < s->max_len) sched_add_placeholder(cur.seqs[i]);
        }
        while (added < N && sched_add(&sch, q[added]) == 0) added++;
        sched_schedule(&sch, &next);
        planned_steps += next.n_seqs > 0;
        CHECK(sched_check(&sch));
        /* the results are in */
        for (int i = 0; i < cur.n_seqs; i++) sched_drop_placeholder(cur.seqs[i]);
        sched_publish(&sch, &cur);
        for (int i = 0; i < cur.n_seqs; i++) {
            struct seq *s = cur.seqs[i];
            CHECK(published_known(s));
            /* preempted while its token was computed (waiting now), it still gets it */
            if (!samples[i] || s->status == SEQ_FINISHED) continue;
            s->tokens[s->n_tokens] = (int32_t)(s->n_tokens % 2);   /* tiny alphabet: blocks repeat */
            s->n_tokens++;
            /* an end token now and then, the length limit always (the last token is never computed) */
            if (rnd() % 9 == 0 || s->n_tokens == s->max_len) { sched_finish(&sch, s); done++; }
        }
        struct sched_batch t = cur;
        cur = next;
        next = t;
        planned = true;
        CHECK(sched_check(&sch));
    }
    /* sequences preempted while they held a placeholder got their token as waiting ones: none is lost */
    CHECK_MSG(done == N, "%d of %d finished in %d steps", done, N, steps);
    CHECK(pool.n_free == N_BLOCKS && block_pool_check(&pool));
    CHECK(!window || (win_pool.n_free == N_BLOCKS && block_pool_check(&win_pool)));
    CHECK(planned_steps > 0 && aborted > 0);
    *cached = sch.n_cached_tokens;
    printf("async workload%s: %d steps (%d planned ahead), %llu preemptions, %d aborted, %llu cached prompt tokens, "
           "%llu hash collisions refused, %d bad positions\n", window ? " (sliding window)" : "", steps,
           planned_steps, (unsigned long long)sch.n_preemptions, aborted, (unsigned long long)sch.n_cached_tokens,
           (unsigned long long)pool.n_collisions, bad);
    CHECK(sch.n_preemptions > 0);
    for (int i = 0; i < N; i++) seq_free(q[i]);
    teardown();
    return bad;
}

/* A placeholder's block: planned and computed a step later, published only once its token is known,
 * and hit by the next sequence with the same tokens. */
static void test_placeholder_block(void) {
    setup(false, NULL);
    struct seq *a = tu_seq(1, 7, 16, 0, BS), *b = tu_seq(2, 10, 16, 0, BS);
    CHECK(sched_add(&sch, a) == 0);
    sched_schedule(&sch, &cur);
    CHECK(cur.n_seqs == 1 && cur.n_new[0] == 7 && a->n_blocks == 2);
    sched_advance(&sch, &cur);
    sched_add_placeholder(a);                 /* position 7 completes block 1 */
    sched_schedule(&sch, &next);
    CHECK(next.n_seqs == 1 && next.n_new[0] == 1 && a->n_blocks == 2 && a->n_tokens == 8 && a->n_pending == 1);
    sched_drop_placeholder(a);
    sched_publish(&sch, &cur);
    CHECK(a->n_published == 1 && pool.hash[a->blocks[0]] && !pool.hash[a->blocks[1]]);
    a->tokens[a->n_tokens++] = 7;             /* the token sampled: the prompt's pattern goes on */
    sched_batch_prune(&sch, &next);
    CHECK(next.n_seqs == 1);
    sched_advance(&sch, &next);
    sched_publish(&sch, &next);
    CHECK(a->n_published == 2 && pool.hash[a->blocks[1]]);
    sched_finish(&sch, a);
    CHECK(sched_add(&sch, b) == 0);           /* tokens 0..9: both of a's blocks are its prefix */
    sched_schedule(&sch, &cur);
    CHECK(b->n_computed == 8 && sch.n_cached_tokens == 8);
    sched_finish(&sch, b);
    /* a sequence that finished while its next step was planned leaves that step, blocks released */
    struct seq *c = tu_seq(3, 3, 16, 50, BS);
    CHECK(sched_add(&sch, c) == 0);
    sched_schedule(&sch, &cur);
    sched_advance(&sch, &cur);
    sched_add_placeholder(c);
    sched_schedule(&sch, &next);
    CHECK(next.n_seqs == 1 && next.n_tokens == 1);
    sched_drop_placeholder(c);
    sched_publish(&sch, &cur);
    sched_finish(&sch, c);                    /* its end token */
    sched_batch_prune(&sch, &next);
    CHECK(next.n_seqs == 0 && next.n_tokens == 0 && pool.n_free == N_BLOCKS && sched_check(&sch));
    seq_free(a);
    seq_free(b);
    seq_free(c);
    teardown();
}

int main(void) {
    uint64_t cached;
    test_placeholder_block();
    CHECK(workload(false, NULL, &cached) == 0);
    CHECK(cached > 0);
    CHECK(workload(false, tu_collide_tokens_only, &cached) == 0);
    CHECK(workload(true, NULL, &cached) == 0);
    return check_report("test_sched_async");
}
