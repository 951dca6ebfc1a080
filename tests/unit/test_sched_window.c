/* test_sched_window.c — the scheduler with a sliding-window pool (a model
 * with both sliding and global layers), driven with fake sequences: blocks
 * released as the window passes and reused by another sequence, a prefix
 * hit cut back when the window's blocks were evicted, preemption, forks,
 * speculative rollback and rewinds; exact block ids throughout.  A random
 * workload then runs a fake KV store per pool (each slot holds the
 * fingerprint of the prefix its position was computed for) and checks at
 * every step that what attention would read — every position in the global
 * pool, the window in the sliding one — is the sequence's own, that the
 * sliding pool never holds more than the windows need, and that nothing is
 * left held at the end; again with every block hash forced to collide. */
#include "check.h"
#include "kvllm.h"
#include "sched/scheduler.h"
#include "sched_util.h"
#include "kv_util.h"

#include <string.h>

#define BS 4

static struct block_pool pool, wpool;
static struct sched sch;
static struct sched_batch bat;

static void setup(int n_blocks, int n_win_blocks, int window, int rollback, int max_seqs, int max_batch,
                  bool prefix) {
    block_pool_deinit(&pool);
    block_pool_deinit(&wpool);
    sched_deinit(&sch);
    sched_batch_deinit(&bat);
    CHECK(block_pool_init(&pool, n_blocks, BS) == 0);
    CHECK(block_pool_init(&wpool, n_win_blocks, BS) == 0);
    struct sched_config c = { .max_seqs = max_seqs, .max_batch_tokens = max_batch, .max_waiting = 64,
                              .prefix_caching = prefix };
    CHECK(sched_init(&sch, &pool, &c) == 0);
    sched_set_window(&sch, &wpool, window, rollback);
    CHECK(sched_batch_init(&bat, max_seqs) == 0);
}

static struct seq *mk(uint64_t id, int n_prompt, int max_len, int first_token) {
    return tu_seq(id, n_prompt, max_len, first_token, BS);
}

static void step(void) {
    tu_step(&sch, &bat);
    CHECK(sched_check(&sch));
}

/* q's window table is exactly ids (-1: released). */
static bool win_is(const struct seq *q, int n, const int32_t *ids) {
    if (q->n_blocks != n) return false;
    for (int i = 0; i < n; i++) if (q->win_blocks[i] != ids[i]) return false;
    return true;
}

static bool blocks_are(const struct seq *q, int n, const int32_t *ids) {
    if (q->n_blocks != n) return false;
    for (int i = 0; i < n; i++) if (q->blocks[i] != ids[i]) return false;
    return true;
}

static void test_slide_and_reuse(void) {
    /* window 6: a token at position p reads p - 5 .. p.  After a prefill of
     * 10 (positions 0-9), position 10 reads 5 .. 10: block 0 (0-3) is gone */
    setup(16, 5, 6, 0, 2, 10, false);
    struct seq *a = mk(1, 10, 32, 0), *b = mk(2, 3, 8, 100);
    CHECK(sched_add(&sch, a) == 0);
    step();
    CHECK(blocks_are(a, 3, (int32_t[]){ 0, 1, 2 }));
    CHECK(win_is(a, 3, (int32_t[]){ -1, 1, 2 }) && a->win_lo == 1);
    CHECK(wpool.ref[0] == 0 && wpool.n_free == 3);
    /* decode to 13 computed: position 13 reads 8 .. 13, so block 1 (4-7) goes too */
    for (int i = 0; i < 3; i++) step();
    CHECK(a->n_computed == 13 && blocks_are(a, 4, (int32_t[]){ 0, 1, 2, 3 }));
    CHECK(win_is(a, 4, (int32_t[]){ -1, -1, 2, 3 }) && wpool.n_free == 3);
    /* b reuses what a left behind, least recently released first: 4, then 0 */
    CHECK(sched_add(&sch, b) == 0);
    step();
    CHECK(blocks_are(b, 1, (int32_t[]){ 4 }) && win_is(b, 1, (int32_t[]){ 4 }));
    for (int i = 0; i < 2; i++) step();   /* b: 5 computed, position 5 reads 0 .. 5: blocks 0, 1 */
    CHECK(b->n_computed == 5 && win_is(b, 2, (int32_t[]){ 4, 0 }));
    /* a's sliding blocks never exceed ceil((window - 1) / BS) + 1 = 3, however long it runs */
    for (int i = 0; i < 12; i++) {
        step();
        CHECK(a->n_blocks - a->win_lo <= 3);
    }
    CHECK(a->n_computed == 28 && a->win_lo == 5);
    sched_finish(&sch, a);
    sched_finish(&sch, b);
    CHECK(pool.n_free == 16 && wpool.n_free == 5 && sched_check(&sch));
    seq_free(a);
    seq_free(b);
}

static void test_prefix_cut_back(void) {
    /* window 6; a computes 16 tokens (blocks 0-3 full and published in both pools) */
    setup(16, 8, 6, 0, 2, 16, true);
    struct seq *a = mk(1, 16, 24, 0);
    CHECK(sched_add(&sch, a) == 0);
    sched_schedule(&sch, &bat);
    sched_commit(&sch, &bat);
    /* published before sliding: block 0 and 1 leave the window cached (position 16 reads 11 .. 16) */
    CHECK(win_is(a, 4, (int32_t[]){ -1, -1, 2, 3 }) && wpool.hash[0] && wpool.hash[1] && wpool.n_cached == 2);
    CHECK(wpool.parent[2] == 2 && wpool.parent[3] == 3);   /* each names its global twin */
    sched_finish(&sch, a);
    /* b: the same 16 and 3 more.  A hit of 16 needs the window of position 16: blocks 2, 3 */
    struct seq *b = mk(2, 19, 24, 0);
    CHECK(sched_add(&sch, b) == 0);
    sched_schedule(&sch, &bat);
    CHECK(b->n_computed == 16 && bat.n_new[0] == 3 && blocks_are(b, 5, (int32_t[]){ 0, 1, 2, 3, 4 }));
    CHECK(win_is(b, 5, (int32_t[]){ -1, -1, 2, 3, 4 }));
    CHECK(sched_check(&sch));
    sched_commit(&sch, &bat);
    sched_finish(&sch, b);
    /* evict sliding block 3 (the hit's last) from the cache: fresh allocations take the free
     * blocks up to it, 1 and 2 set aside (held) meanwhile */
    block_pool_retain(&wpool, 1);
    block_pool_retain(&wpool, 2);
    int32_t taken[8];
    int n_taken = 0;
    while ((taken[n_taken] = block_pool_alloc(&wpool)) != 3) n_taken++;
    n_taken++;
    for (int i = 0; i < n_taken; i++) block_pool_release(&wpool, taken[i]);
    block_pool_release(&wpool, 1);
    block_pool_release(&wpool, 2);
    CHECK(wpool.hash[3] == 0 && n_taken == 6);
    /* c: the same 16 and 1 more.  16 would need block 3; 12 needs the window of position 12
     * (7 .. 12: blocks 1, 2) — block 1 is still cached: the hit is cut back to 12 */
    struct seq *c = mk(3, 17, 24, 0);
    CHECK(sched_add(&sch, c) == 0);
    CHECK(wpool.hash[1] != 0 && wpool.hash[2] != 0);
    sched_schedule(&sch, &bat);
    CHECK_MSG(c->n_computed == 12 && bat.n_new[0] == 5, "computed %d, new %d", c->n_computed, bat.n_new[0]);
    CHECK(c->blocks[0] == 0 && c->blocks[1] == 1 && c->blocks[2] == 2 && c->win_blocks[0] == -1);
    CHECK(c->win_blocks[1] == 1 && c->win_blocks[2] == 2 && c->win_lo == 1);
    CHECK(sch.n_cached_tokens == 16 + 12);
    CHECK(sched_check(&sch));
    sched_commit(&sch, &bat);
    sched_finish(&sch, c);
    CHECK(block_pool_n_held(&pool) == 0 && block_pool_n_held(&wpool) == 0 && sched_check(&sch));
    seq_free(a);
    seq_free(b);
    seq_free(c);
}

static void test_preempt_fork_rollback(void) {
    /* preemption frees both tables; the sliding pool alone can force it */
    setup(16, 5, 6, 0, 4, 10, false);
    struct seq *a = mk(1, 4, 32, 0), *b = mk(2, 4, 32, 50);
    CHECK(sched_add(&sch, a) == 0 && sched_add(&sch, b) == 0);
    for (int i = 0; i < 5; i++) step();   /* 8 computed each: blocks 0, 2 and 1, 3; 4 left */
    CHECK(win_is(a, 2, (int32_t[]){ 0, 2 }) && win_is(b, 2, (int32_t[]){ 1, 3 }) && wpool.n_free == 1);
    step();   /* position 8: a takes block 4, none is left for b: b is preempted */
    CHECK(b->status == SEQ_WAITING && b->n_blocks == 0 && b->win_lo == 0 && sch.n_preemptions == 1);
    /* b released 3, then 1; a, at 9, slid block 0 out */
    CHECK(win_is(a, 3, (int32_t[]){ -1, 2, 4 }) && wpool.n_free == 3 && pool.n_free == 13);
    step();   /* b comes back on 3, 1, 0 and slides 3 out */
    CHECK(b->status == SEQ_RUNNING && b->n_computed == 9 && win_is(b, 3, (int32_t[]){ -1, 1, 0 }));
    sched_finish(&sch, a);
    sched_finish(&sch, b);
    CHECK(pool.n_free == 16 && wpool.n_free == 5);

    /* fork and copy-on-write in both pools */
    setup(16, 8, 6, 0, 4, 16, false);
    struct seq *p = mk(3, 6, 16, 0), *ch = mk(3, 6, 16, 0);
    p->n_reserved = 2;
    CHECK(sched_add(&sch, p) == 0);
    sched_schedule(&sch, &bat);
    sched_commit(&sch, &bat);
    CHECK(blocks_are(p, 2, (int32_t[]){ 0, 1 }) && win_is(p, 2, (int32_t[]){ 0, 1 }));
    sched_fork(&sch, p, ch);
    CHECK(win_is(ch, 2, (int32_t[]){ 0, 1 }) && wpool.ref[1] == 2);
    p->tokens[p->n_tokens++] = 500;
    ch->tokens[ch->n_tokens++] = 501;
    sched_schedule(&sch, &bat);   /* the parent copies the shared partial block in both pools */
    CHECK(bat.n_copies == 1 && bat.copies[0][0] == 2 && bat.copies[0][1] == 1);
    CHECK(bat.n_win_copies == 1 && bat.win_copies[0][0] == 2 && bat.win_copies[0][1] == 1);
    CHECK(win_is(p, 2, (int32_t[]){ 0, 2 }) && win_is(ch, 2, (int32_t[]){ 0, 1 }) && sched_check(&sch));
    sched_commit(&sch, &bat);
    sched_finish(&sch, p);
    sched_finish(&sch, ch);
    CHECK(pool.n_free == 16 && wpool.n_free == 8);
    seq_free(a);
    seq_free(b);
    seq_free(p);
    seq_free(ch);
}

static void test_spec_rollback(void) {
    /* a sequence in decode at 11 computed carries 6 drafts; all are rejected.  The window of
     * position 12 (7 .. 12) was kept although 17 positions were computed */
    setup(16, 8, 6, 0, 2, 16, false);
    struct seq *a = mk(1, 11, 40, 0);
    CHECK(sched_add(&sch, a) == 0);
    step();   /* 11 computed, 12 known */
    CHECK(a->n_computed == 11 && a->n_tokens == 12 && win_is(a, 3, (int32_t[]){ -1, 1, 2 }));
    for (int i = 0; i < 6; i++) a->tokens[a->n_tokens++] = 7;
    a->n_spec = 6;
    sched_schedule(&sch, &bat);
    CHECK(bat.n_new[0] == 7 && a->n_blocks == 5);
    sched_commit(&sch, &bat);
    CHECK(a->n_computed == 18 && win_is(a, 5, (int32_t[]){ -1, 1, 2, 3, 4 }));   /* drafts: nothing slid */
    a->n_tokens = 13;   /* the token sampled at 12, no draft kept */
    sched_spec_resolve(&sch, a, 12);
    CHECK(a->n_computed == 12 && win_is(a, 3, (int32_t[]){ -1, 1, 2 }) && sched_check(&sch));
    CHECK(wpool.ref[3] == 0 && wpool.ref[4] == 0 && pool.n_free == 13);
    sched_finish(&sch, a);

    /* a shadow's rewind: within the rollback it keeps its blocks, beyond it starts over */
    setup(16, 8, 6, 3, 2, 16, false);
    struct seq *s = mk(2, 16, 40, 0);
    CHECK(sched_add(&sch, s) == 0);
    step();   /* 16 computed; rollback 3: the window of 13 (8 ..) is kept */
    CHECK(win_is(s, 4, (int32_t[]){ -1, -1, 2, 3 }));
    sched_truncate(&sch, s, 13);
    CHECK(s->n_computed == 13 && win_is(s, 4, (int32_t[]){ -1, -1, 2, 3 }) && sched_check(&sch));
    sched_truncate(&sch, s, 9);   /* the window of 9 (4 ..) starts in block 1: gone */
    CHECK(s->n_computed == 0 && s->n_blocks == 0 && s->win_lo == 0 && s->status == SEQ_RUNNING);
    CHECK(pool.n_free == 16 && wpool.n_free == 8 && sched_check(&sch));
    step();   /* recomputed from the start */
    CHECK(s->n_computed == 9 && sched_check(&sch));
    sched_finish(&sch, s);
    seq_free(a);
    seq_free(s);
}

/* ---- random workload over a fake KV store per pool ---- */

#define N_SEQ 48
#define W_RAND 7

static uint64_t g_fp[64 * BS], w_fp[64 * BS];

/* Positions of the batch that read another prefix's K/V: every earlier one
 * in the global pool, the window's in the sliding one (as attention reads). */
static int step_kv(unsigned *r) {
    int bad = 0;
    /* a few running sequences in decode carry drafts (tokens that may be rejected) */
    for (int i = 0; i < sch.n_running; i++) {
        struct seq *q = sch.running[i];
        *r = *r * 1103515245u + 12345u;
        int k = (int)(*r >> 16) % 4;
        if (q->n_spec || q->n_computed != q->n_tokens - 1 || q->n_tokens + k > q->max_len - 1) continue;
        for (int j = 0; j < k; j++) q->tokens[q->n_tokens + j] = (int32_t)(*r >> (j + 3)) % 3;
        q->n_tokens += k;
        q->n_spec = k;
    }
    sched_schedule(&sch, &bat);
    for (int k = 0; k < bat.n_copies; k++)
        memcpy(&g_fp[bat.copies[k][0] * BS], &g_fp[bat.copies[k][1] * BS], BS * sizeof *g_fp);
    for (int k = 0; k < bat.n_win_copies; k++)
        memcpy(&w_fp[bat.win_copies[k][0] * BS], &w_fp[bat.win_copies[k][1] * BS], BS * sizeof *w_fp);
    for (int i = 0; i < bat.n_seqs; i++) {
        struct seq *q = bat.seqs[i];
        for (int t = q->n_computed; t < q->n_computed + bat.n_new[i]; t++) {
            const uint64_t fp = tu_prefix_fp(q->tokens, t + 1);
            g_fp[q->blocks[t / BS] * BS + t % BS] = fp;
            w_fp[q->win_blocks[t / BS] * BS + t % BS] = fp;
        }
        for (int t = q->n_computed; t < q->n_computed + bat.n_new[i]; t++)
            for (int u = 0; u <= t; u++) {
                const uint64_t want = tu_prefix_fp(q->tokens, u + 1);
                bad += g_fp[q->blocks[u / BS] * BS + u % BS] != want;
                if (u > t - W_RAND) bad += w_fp[q->win_blocks[u / BS] * BS + u % BS] != want;
            }
    }
    sched_commit(&sch, &bat);
    for (int i = 0; i < bat.n_seqs; i++) {
        struct seq *q = bat.seqs[i];
        if (q->status != SEQ_RUNNING) continue;
        if (q->n_spec) {   /* keep a random number of drafts, then one sampled token */
            *r = *r * 1103515245u + 12345u;
            int keep = (int)(*r >> 16) % (q->n_spec + 1), base = q->n_tokens - q->n_spec;
            q->n_tokens = base + keep;
            q->tokens[q->n_tokens] = 2000 + q->n_tokens;
            q->n_tokens++;
            sched_spec_resolve(&sch, q, base + keep);
        } else if (q->n_computed == q->n_tokens && q->n_tokens < q->max_len) {
            q->tokens[q->n_tokens] = (int32_t)(q->n_tokens % 5);
            q->n_tokens++;
        }
    }
    return bad;
}

static void test_random_workload(bool collide) {
    block_pool_set_hash_fn(collide ? tu_collide_tokens_only : NULL);
    /* 24 global blocks, 9 sliding: sequences of up to 60 tokens under a window of 7 */
    setup(24, 9, W_RAND, 0, 3, 10, true);
    struct seq *q[N_SEQ];
    unsigned r = 11;
    for (int i = 0; i < N_SEQ; i++) {
        r = r * 1103515245u + 12345u;
        int np = 1 + (int)(r >> 8) % 30, max_len = np + 2 + (int)(r >> 16) % 28;
        q[i] = mk((uint64_t)i, np, max_len, (int)(r >> 20) % 2);   /* shared prefixes: first token 0 or 1 */
    }
    int added = 0, done = 0, steps = 0, bad = 0, most = 0;
    while (done < N_SEQ && steps < 100000) {
        while (added < N_SEQ && sched_add(&sch, q[added]) == 0) added++;
        bad += step_kv(&r);
        steps++;
        CHECK(sched_check(&sch));
        int held = block_pool_n_held(&wpool);
        most = held > most ? held : most;
        for (int i = 0; i < added; i++)
            if (q[i]->status == SEQ_RUNNING && q[i]->n_tokens == q[i]->max_len &&
                q[i]->n_computed == q[i]->n_tokens - 1) {
                sched_finish(&sch, q[i]);
                done++;
            }
    }
    CHECK_MSG(done == N_SEQ, "%d of %d finished in %d steps", done, N_SEQ, steps);
    CHECK_MSG(bad == 0, "%d positions read K/V of another prefix", bad);
    /* 3 sequences x (ceil(6 / 4) + 1) + a step's 10 tokens over at most 3 + 3 blocks: never more */
    CHECK_MSG(most <= 3 * 3 + 6, "%d sliding blocks held at once", most);
    CHECK(sch.n_preemptions > 0 && sch.n_cached_tokens > 0);
    CHECK(block_pool_n_held(&pool) == 0 && block_pool_n_held(&wpool) == 0 && sched_check(&sch));
    block_pool_set_hash_fn(NULL);
    printf("random workload%s: %d steps, %llu preemptions, %llu cached tokens, at most %d sliding blocks held\n",
           collide ? " (hashes forced to collide)" : "", steps, (unsigned long long)sch.n_preemptions, (unsigned long long)sch.n_cached_tokens, most);
    for (int i = 0; i < N_SEQ; i++) seq_free(q[i]);
}

int main(void) {
    test_slide_and_reuse();
    test_prefix_cut_back();
    test_preempt_fork_rollback();
    test_spec_rollback();
    test_random_workload(false);
    test_random_workload(true);
    sched_batch_deinit(&bat);
    sched_deinit(&sch);
    block_pool_deinit(&pool);
    block_pool_deinit(&wpool);
    return check_report("test_sched_window");
}
