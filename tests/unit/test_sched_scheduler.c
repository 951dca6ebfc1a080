/* test_sched_scheduler.c — the scheduler driven with fake sequences (no
 * model): admission, chunked prefill, decode, preemption order, prefix-cache
 * hits, copy-on-write forks, rejection; exact block ids throughout, and no
 * block left held at the end.  Prefix-cache poisoning: with the hash forced
 * to collide, a fake KV store shows no sequence ever reads K/V computed for
 * another prefix. */
#include "check.h"
#include "kv_util.h"
#include "kvllm.h"
#include "sched/scheduler.h"
#include "sched_util.h"

#include <string.h>

#define BS 4

static struct block_pool pool;
static struct sched sch;
static struct sched_batch bat;

static void setup(int n_blocks, int max_seqs, int max_batch, bool prefix) {
    block_pool_deinit(&pool);
    sched_deinit(&sch);
    sched_batch_deinit(&bat);
    CHECK(block_pool_init(&pool, n_blocks, BS) == 0);
    struct sched_config c = { .max_seqs = max_seqs, .max_batch_tokens = max_batch, .max_waiting = 8,
                              .prefix_caching = prefix };
    CHECK(sched_init(&sch, &pool, &c) == 0);
    CHECK(sched_batch_init(&bat, max_seqs) == 0);
}

static struct seq *mk(uint64_t id, int n_prompt, int max_len, int first_token) {
    return tu_seq(id, n_prompt, max_len, first_token, BS);
}

static void step(void) {
    tu_step(&sch, &bat);
    CHECK(block_pool_check(&pool));
}

static bool blocks_are(const struct seq *q, int n, const int32_t *ids) {
    if (q->n_blocks != n) return false;
    for (int i = 0; i < n; i++) if (q->blocks[i] != ids[i]) return false;
    return true;
}

static void test_admit_decode_chunk(void) {
    setup(8, 4, 64, false);
    struct seq *a = mk(1, 6, 12, 0), *b = mk(2, 9, 12, 100);
    CHECK(sched_add(&sch, a) == 0 && sched_add(&sch, b) == 0);
    sched_schedule(&sch, &bat);
    CHECK(bat.n_seqs == 2 && bat.n_new[0] == 6 && bat.n_new[1] == 9 && bat.n_tokens == 15);
    CHECK(blocks_are(a, 2, (int32_t[]){ 0, 1 }));
    CHECK(blocks_are(b, 3, (int32_t[]){ 2, 3, 4 }));
    sched_commit(&sch, &bat);
    CHECK(a->n_computed == 6 && b->n_computed == 9);
    a->tokens[a->n_tokens++] = 7;
    b->tokens[b->n_tokens++] = 7;
    sched_schedule(&sch, &bat);  /* decode: a writes position 6 (block 1), b position 9 (block 4) */
    CHECK(bat.n_seqs == 2 && bat.n_new[0] == 1 && bat.n_new[1] == 1 && bat.n_copies == 0);
    CHECK(a->n_blocks == 2 && b->n_blocks == 3 && pool.n_free == 3);
    sched_commit(&sch, &bat);
    sched_finish(&sch, a);
    sched_finish(&sch, b);
    CHECK(pool.n_free == 8 && sch.n_running == 0);
    seq_free(a);
    seq_free(b);

    /* chunked prefill: a 10-token prompt under a 4-token budget takes 4, 4, 2 */
    setup(8, 4, 4, false);
    struct seq *c = mk(3, 10, 16, 0);
    CHECK(sched_add(&sch, c) == 0);
    int chunks[3];
    for (int i = 0; i < 3; i++) { step(); chunks[i] = bat.n_new[0]; }
    CHECK(chunks[0] == 4 && chunks[1] == 4 && chunks[2] == 2);
    CHECK(c->n_computed == 10 && c->n_tokens == 11 && blocks_are(c, 3, (int32_t[]){ 0, 1, 2 }));
    sched_finish(&sch, c);
    CHECK(pool.n_free == 8);
    seq_free(c);
}

static void test_preemption(void) {
    /* 5 blocks: a (prompt 8 = blocks 0,1) and b (prompt 8 = blocks 2,3) fit;
     * when a needs a third block and b a third too, only one is free: b, the
     * most recently admitted, is preempted and a gets its blocks' space. */
    setup(5, 4, 64, false);
    struct seq *a = mk(1, 8, 16, 0), *b = mk(2, 8, 16, 50);
    CHECK(sched_add(&sch, a) == 0 && sched_add(&sch, b) == 0);
    step();
    CHECK(blocks_are(a, 2, (int32_t[]){ 0, 1 }) && blocks_are(b, 2, (int32_t[]){ 2, 3 }));
    step(); /* a: position 8 -> block 4; b: position 8 needs a block: none -> b preempted */
    CHECK(blocks_are(a, 3, (int32_t[]){ 0, 1, 4 }));
    CHECK(b->status == SEQ_WAITING && b->n_blocks == 0 && b->n_computed == 0 && sch.n_preemptions == 1);
    CHECK(bat.n_seqs == 1 && bat.seqs[0] == a);
    CHECK(sch.n_waiting == 1 && pool.n_free == 2);
    /* b is recomputed once a is done: its prompt + the token it had sampled */
    sched_finish(&sch, a);
    step();
    CHECK(b->status == SEQ_RUNNING && bat.n_new[0] == 9 && b->n_computed == 9);
    /* released in reverse order (4, 1, 0 after 3, 2): the free list decides the ids */
    CHECK(blocks_are(b, 3, (int32_t[]){ 3, 2, 4 }));
    sched_finish(&sch, b);
    CHECK(pool.n_free == 5 && block_pool_check(&pool));
    seq_free(a);
    seq_free(b);
}

static void test_prefix_cache(void) {
    setup(8, 4, 64, true);
    struct seq *a = mk(1, 10, 16, 0);
    CHECK(sched_add(&sch, a) == 0);
    step(); /* computes 10: blocks 0,1 full and published, block 2 partial */
    CHECK(blocks_are(a, 3, (int32_t[]){ 0, 1, 2 }) && pool.hash[0] && pool.hash[1] && !pool.hash[2]);
    sched_finish(&sch, a);
    CHECK(pool.n_cached == 2);
    /* same first 8 tokens, different rest: starts at position 8 on blocks 0, 1 */
    struct seq *b = mk(2, 12, 16, 0);
    b->tokens[9] = 999;
    CHECK(sched_add(&sch, b) == 0);
    sched_schedule(&sch, &bat);
    CHECK(bat.n_new[0] == 4 && b->n_computed == 8 && b->blocks[0] == 0 && b->blocks[1] == 1);
    CHECK(sch.n_cached_tokens == 8 && sch.n_prompt_tokens == 22);
    sched_commit(&sch, &bat);
    sched_finish(&sch, b);
    /* a prompt of exactly 8 matching tokens still computes its last token:
     * only the first block is reused */
    struct seq *c = mk(3, 8, 16, 0);
    CHECK(sched_add(&sch, c) == 0);
    sched_schedule(&sch, &bat);
    CHECK(c->n_computed == 4 && bat.n_new[0] == 4 && c->blocks[0] == 0);
    sched_commit(&sch, &bat);
    sched_finish(&sch, c);
    CHECK(pool.n_free == 8 && block_pool_check(&pool));
    seq_free(a);
    seq_free(b);
    seq_free(c);
}

static void test_fork_cow(void) {
    setup(8, 4, 64, false);
    struct seq *p = mk(1, 6, 12, 0), *ch = mk(1, 6, 12, 0);
    p->n_reserved = 2;
    CHECK(sched_add(&sch, p) == 0);
    sched_schedule(&sch, &bat);
    sched_commit(&sch, &bat);
    CHECK(blocks_are(p, 2, (int32_t[]){ 0, 1 }));
    sched_fork(&sch, p, ch);
    CHECK(blocks_are(ch, 2, (int32_t[]){ 0, 1 }) && pool.ref[0] == 2 && pool.ref[1] == 2);
    CHECK(sch.n_running == 2 && sch.n_running_reserved == 2);
    p->tokens[p->n_tokens++] = 500;
    ch->tokens[ch->n_tokens++] = 501;
    /* both write position 6 in shared block 1: the parent (first) copies it to
     * block 2; then block 1 is the child's alone and needs no copy */
    sched_schedule(&sch, &bat);
    CHECK(bat.n_copies == 1 && bat.copies[0][0] == 2 && bat.copies[0][1] == 1);
    CHECK(blocks_are(p, 2, (int32_t[]){ 0, 2 }) && blocks_are(ch, 2, (int32_t[]){ 0, 1 }));
    CHECK(pool.ref[0] == 2 && pool.ref[1] == 1 && pool.ref[2] == 1);
    sched_commit(&sch, &bat);
    sched_finish(&sch, p);
    sched_finish(&sch, ch);
    CHECK(pool.n_free == 8 && block_pool_check(&pool));
    seq_free(p);
    seq_free(ch);
}

static void test_rejection_and_limits(void) {
    setup(4, 2, 64, false);
    struct seq *big = mk(1, 4, 17, 0); /* 17 tokens need 5 blocks of 4: never fits 4 */
    CHECK(sched_add(&sch, big) == KVLLM_ERANGE);
    struct seq *wide = mk(2, 4, 8, 0);
    wide->n_reserved = 3; /* n = 3 samples > max_seqs 2 */
    CHECK(sched_add(&sch, wide) == KVLLM_ERANGE);
    /* max_seqs: three small requests, two run, one waits */
    struct seq *s[3];
    for (int i = 0; i < 3; i++) { s[i] = mk(10 + i, 2, 4, 0); CHECK(sched_add(&sch, s[i]) == 0); }
    step();
    CHECK(sch.n_running == 2 && sch.n_waiting == 1 && bat.n_seqs == 2);
    for (int i = 0; i < 3; i++) sched_finish(&sch, s[i]);
    CHECK(pool.n_free == 4 && sch.n_waiting == 0 && sch.n_running == 0);
    for (int i = 0; i < 3; i++) seq_free(s[i]);
    seq_free(big);
    seq_free(wide);
}

/* Random workload: many sequences through a small pool; everything finishes,
 * nothing leaks, preemptions happen and never livelock. */
static void test_random_workload(void) {
    setup(12, 4, 9, true);
    struct seq *q[40];
    unsigned r = 5;
    int added = 0, done = 0, steps = 0;
    for (int i = 0; i < 40; i++) {
        r = r * 1103515245u + 12345u;
        int np = 1 + (int)(r >> 8) % 20, max_len = np + 1 + (int)(r >> 16) % 20;
        q[i] = mk((uint64_t)i, np, max_len, (int)(r >> 20) % 3 * 7);
    }
    while (done < 40 && steps < 100000) {
        while (added < 40 && sched_add(&sch, q[added]) == 0) added++;
        step();
        steps++;
        for (int i = 0; i < added; i++)
            if (q[i]->status == SEQ_RUNNING && q[i]->n_tokens == q[i]->max_len && q[i]->n_computed == q[i]->n_tokens - 1) {
                sched_finish(&sch, q[i]);
                done++;
            }
    }
    CHECK_MSG(done == 40, "%d of 40 finished in %d steps", done, steps);
    CHECK(sch.n_preemptions > 0);
    CHECK(pool.n_free == 12 && block_pool_check(&pool));
    printf("random workload: %d steps, %llu preemptions\n", steps, (unsigned long long)sch.n_preemptions);
    for (int i = 0; i < 40; i++) seq_free(q[i]);
}

/* ---- prefix-cache poisoning: forced hash collisions never give a sequence
 * K/V computed for other tokens.  A fake KV store: each slot holds the
 * fingerprint of the exact prefix its position was computed for (FNV-1a,
 * independent of the pool's hash); after every schedule, each sequence's
 * computed positions must hold its own prefix's fingerprints. ---- */

static uint64_t kv_fp[64 * BS]; /* (n_blocks * BS) fingerprint of the prefix each slot was computed with */

/* One step with the fake KV store; returns the positions found holding another prefix's K/V. */
static int step_kv(void) {
    int bad = 0;
    sched_schedule(&sch, &bat);
    for (int k = 0; k < bat.n_copies; k++)
        memcpy(&kv_fp[bat.copies[k][0] * BS], &kv_fp[bat.copies[k][1] * BS], BS * sizeof *kv_fp);
    for (int i = 0; i < bat.n_seqs; i++) {
        struct seq *q = bat.seqs[i];
        for (int t = 0; t < q->n_computed; t++) /* what attention would read */
            bad += kv_fp[q->blocks[t / BS] * BS + t % BS] != tu_prefix_fp(q->tokens, t + 1);
        for (int t = q->n_computed; t < q->n_computed + bat.n_new[i]; t++)
            kv_fp[q->blocks[t / BS] * BS + t % BS] = tu_prefix_fp(q->tokens, t + 1);
    }
    sched_commit(&sch, &bat);
    for (int i = 0; i < bat.n_seqs; i++) {
        struct seq *q = bat.seqs[i];
        if (q->status == SEQ_RUNNING && q->n_computed == q->n_tokens && q->n_tokens < q->max_len)
        {
            q->tokens[q->n_tokens] = (int32_t)(q->n_tokens % 2); /* tiny alphabet: blocks repeat */
            q->n_tokens++;
        }
    }
    CHECK(block_pool_check(&pool));
    return bad;
}

/* Many sequences over a two-token alphabet (BS 4: 16 distinct blocks, each
 * seen under many prefixes and positions), through admission, prefix hits,
 * preemption and recompute.  Returns the mismatched positions; *cached the
 * prompt tokens served from the cache. */
static int poison_workload(uint64_t (*fn)(uint64_t, uint64_t, const int32_t *, int), uint64_t *cached) {
    block_pool_set_hash_fn(fn);
    setup(12, 4, 9, true);
    block_pool_set_hash_fn(NULL);
    enum { N = 60 };
    struct seq *q[N];
    unsigned r = 11;
    int added = 0, done = 0, steps = 0, bad = 0;
    for (int i = 0; i < N; i++) {
        int32_t t[32];
        r = r * 1103515245u + 12345u;
        int np = 1 + (int)(r >> 8) % 16, max_len = np + 1 + (int)(r >> 16) % 12;
        for (int k = 0; k < np; k++) {
            r = r * 1103515245u + 12345u;
            t[k] = (int32_t)((r >> 16) % 2);
        }
        q[i] = seq_new((uint64_t)i, t, np, max_len, BS);
    }
    while (done < N && steps < 100000) {
        while (added < N && sched_add(&sch, q[added]) == 0) added++;
        bad += step_kv();
        steps++;
        for (int i = 0; i < added; i++)
            if (q[i]->status == SEQ_RUNNING && q[i]->n_tokens == q[i]->max_len && q[i]->n_computed == q[i]->n_tokens - 1) {
                sched_finish(&sch, q[i]);
                done++;
            }
    }
    CHECK_MSG(done == N, "%d of %d finished in %d steps", done, N, steps);
    CHECK(pool.n_free == 12 && block_pool_check(&pool));
    *cached = sch.n_cached_tokens;
    printf("poison workload: %d steps, %llu preemptions, %llu cached prompt tokens, %llu hash collisions "
           "refused, %d positions with another prefix's K/V\n", steps, (unsigned long long)sch.n_preemptions,
           (unsigned long long)sch.n_cached_tokens, (unsigned long long)pool.n_collisions, bad);
    for (int i = 0; i < N; i++) seq_free(q[i]);
    return bad;
}

static void test_prefix_poisoning(void) {
    uint64_t cached;
    /* the keyed hash: hits happen, all of them right */
    CHECK(poison_workload(NULL, &cached) == 0);
    CHECK(cached > 0);
    /* every block under one hash: the only hits left are identical prefixes */
    CHECK(poison_workload(tu_collide_all, &cached) == 0);
    CHECK(pool.n_collisions > 0);
    /* the hash of a block's tokens alone: same tokens under another prefix collide */
    CHECK(poison_workload(tu_collide_tokens_only, &cached) == 0);
    CHECK(pool.n_collisions > 0 && cached > 0);

    /* the attack, at scheduler level: a forged block under the victim's
     * first hash; the victim's prompt is served from its own tokens only */
    block_pool_set_hash_fn(tu_collide_all);
    setup(8, 4, 64, true);
    block_pool_set_hash_fn(NULL);
    struct seq *atk = mk(1, 9, 12, 500), *vic = mk(2, 9, 12, 0), *again = mk(3, 9, 12, 0);
    CHECK(sched_add(&sch, atk) == 0);
    CHECK(step_kv() == 0);
    sched_finish(&sch, atk);
    CHECK(pool.n_cached == 1); /* the attacker's first block holds hash 42 */
    CHECK(sched_add(&sch, vic) == 0);
    CHECK(step_kv() == 0);
    CHECK(sch.n_cached_tokens == 0 && vic->n_computed == 9);
    sched_finish(&sch, vic);
    CHECK(sched_add(&sch, again) == 0); /* the attacker's block still holds 42: no hit, no harm */
    CHECK(step_kv() == 0 && sch.n_cached_tokens == 0);
    sched_finish(&sch, again);
    CHECK(pool.n_free == 8 && block_pool_check(&pool));
    seq_free(atk);
    seq_free(vic);
    seq_free(again);
}

int main(void) {
    test_admit_decode_chunk();
    test_preemption();
    test_prefix_cache();
    test_fork_cow();
    test_rejection_and_limits();
    test_random_workload();
    test_prefix_poisoning();
    block_pool_deinit(&pool);
    sched_deinit(&sch);
    sched_batch_deinit(&bat);
    return check_report("test_sched_scheduler");
}
