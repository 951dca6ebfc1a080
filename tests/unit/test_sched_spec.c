/* test_sched_spec.c — the scheduler's side of speculative decoding, with
 * fake sequences and exact block ids (no model): drafts are computed as a
 * chunk with the last token; sched_spec_resolve keeps the accepted
 * positions, releases the blocks that held only rejected ones and publishes
 * a block in the prefix cache only once all its tokens are verified; drafts
 * give way to the token budget and to the free blocks before anyone is
 * preempted, and a preempted sequence loses them; sched_truncate brings a
 * draft shadow back to a prefix.  The pool's invariants hold after every
 * operation and no block is held at the end. */
#include "check.h"
#include "kvllm.h"
#include "sched/scheduler.h"

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

static struct seq *mk(int n_prompt, int max_len, int first) {
    int32_t t[64];
    for (int i = 0; i < n_prompt; i++) t[i] = first + i;
    struct seq *q = seq_new(1, t, n_prompt, max_len, BS);
    CHECK(q && sched_add(&sch, q) == 0);
    return q;
}

/* Run a prompt to decode: schedule, commit, append one sampled token. */
static void prefill(struct seq *q, int32_t sampled) {
    sched_schedule(&sch, &bat);
    sched_commit(&sch, &bat);
    CHECK(q->n_computed == q->n_tokens);
    q->tokens[q->n_tokens++] = sampled;
}

static void draft(struct seq *q, int k, int32_t first) {
    for (int i = 0; i < k; i++) q->tokens[q->n_tokens + i] = first + i;
    q->n_tokens += k;
    q->n_spec = k;
}

static int n_new_of(const struct seq *q) {
    for (int i = 0; i < bat.n_seqs; i++)
        if (bat.seqs[i] == q) return bat.n_new[i];
    return 0;
}

/* Resolve and rollback: blocks, counters and the prefix cache. */
static void test_resolve(void) {
    setup(16, 2, 64, true);
    struct seq *q = mk(6, 40, 100);           /* prompt in blocks 0, 1 (positions 0..5) */
    prefill(q, 500);                          /* n_tokens 7, n_computed 6 */
    draft(q, 5, 600);                         /* positions 7..11 are drafts: 12 tokens */
    sched_schedule(&sch, &bat);
    CHECK(bat.n_seqs == 1 && n_new_of(q) == 6 && bat.n_tokens == 6);
    CHECK(q->n_blocks == 3);                  /* 12 positions */
    const int32_t third = q->blocks[2];
    sched_commit(&sch, &bat);
    CHECK(q->n_computed == 12);
    /* block 1 (positions 4..7) holds a draft at 7: not published yet; block 0 is */
    CHECK(pool.hash[q->blocks[0]] != 0);
    CHECK(pool.hash[q->blocks[1]] == 0);
    CHECK(pool.hash[third] == 0);
    /* verification: draft 0 (position 7) accepted, draft 1 rejected; the token sampled at 8 is 777 */
    q->tokens[8] = 777;
    q->n_tokens = 9;
    sched_spec_resolve(&sch, q, 8);
    CHECK(q->n_spec == 0 && q->n_computed == 8 && q->n_tokens == 9);
    CHECK(q->n_blocks == 2);                  /* positions 0..7: the third block went back */
    CHECK(pool.ref[third] == 0 && pool.hash[third] == 0);
    CHECK(pool.hash[q->blocks[1]] != 0);      /* now fully verified: published, with the kept tokens */
    CHECK(!memcmp(pool.tokens + (size_t)q->blocks[1] * BS, q->tokens + BS, BS * sizeof(int32_t)));
    CHECK(block_pool_check(&pool));
    /* a second round rejected at once: nothing past the computed positions survives */
    draft(q, 3, 800);
    sched_schedule(&sch, &bat);
    CHECK(n_new_of(q) == 4 && q->n_blocks == 3);
    sched_commit(&sch, &bat);
    q->tokens[9] = 901;
    q->n_tokens = 10;
    sched_spec_resolve(&sch, q, 9);
    CHECK(q->n_computed == 9 && q->n_blocks == 3);   /* position 8 lives in the third block */
    CHECK(pool.hash[q->blocks[2]] == 0);
    sched_finish(&sch, q);
    CHECK(block_pool_n_held(&pool) == 0 && block_pool_check(&pool));
    seq_free(q);
}

/* Drafts give way to the budget and the free blocks; preemption drops them. */
static void test_give_way(void) {
    setup(6, 2, 4, false);                    /* 4 tokens a step, 6 blocks of 4 */
    struct seq *a = mk(3, 24, 10);
    prefill(a, 50);                           /* a: 4 tokens, 3 computed, 1 block */
    draft(a, 5, 60);                          /* 1 + 5 wanted, budget 4: two drafts dropped */
    sched_schedule(&sch, &bat);
    CHECK(n_new_of(a) == 4 && a->n_spec == 3 && a->n_tokens == 7);
    sched_commit(&sch, &bat);
    a->n_tokens = 5;                          /* nothing accepted: the sampled token replaces draft 0 */
    sched_spec_resolve(&sch, a, 4);
    CHECK(a->n_blocks == 1 && a->n_computed == 4);
    /* a second sequence takes 4 of the free blocks; a's drafts then fit only partly */
    struct seq *b = mk(16, 24, 200);
    sched_schedule(&sch, &bat);               /* a: its one token; b: a chunk of 3 */
    sched_commit(&sch, &bat);
    a->tokens[a->n_tokens++] = 51;
    while (b->n_computed < b->n_tokens) { sched_schedule(&sch, &bat); sched_commit(&sch, &bat); }
    CHECK(b->n_blocks == 4 && pool.n_free == 0);
    /* a holds 2 blocks, 6 tokens computed; it samples its 7th */
    CHECK(a->n_blocks == 2 && a->n_computed == 6 && a->n_tokens == 6);
    a->tokens[a->n_tokens++] = 52;
    /* drafts at positions 7..9: 8 and 9 would need a third block, none is free: they are dropped,
     * nobody is preempted */
    const uint64_t pre = sch.n_preemptions;
    draft(a, 3, 70);
    sched_schedule(&sch, &bat);
    CHECK(sch.n_preemptions == pre);
    CHECK(a->n_spec == 1 && a->n_tokens == 8 && n_new_of(a) == 2);   /* position 6 and the draft at 7 */
    sched_commit(&sch, &bat);
    a->tokens[8] = 53;                        /* the draft accepted, then a token sampled at 8 */
    a->n_tokens = 9;
    sched_spec_resolve(&sch, a, 8);
    CHECK(a->n_computed == 8 && a->n_blocks == 2 && a->n_spec == 0);
    sched_finish(&sch, a);
    sched_finish(&sch, b);
    CHECK(block_pool_n_held(&pool) == 0 && block_pool_check(&pool));
    seq_free(a);
    seq_free(b);

}

/* A preempted speculating sequence loses its drafts. */
static void test_preempt(void) {
    setup(4, 2, 64, false);
    struct seq *a = mk(8, 16, 10), *b = mk(8, 16, 40);
    sched_schedule(&sch, &bat);
    sched_commit(&sch, &bat);
    CHECK(a->n_blocks == 2 && b->n_blocks == 2 && pool.n_free == 0);
    a->tokens[a->n_tokens++] = 1;             /* position 8: a needs a third block */
    b->tokens[b->n_tokens++] = 2;
    draft(b, 2, 70);                          /* b, admitted last, speculates */
    sched_schedule(&sch, &bat);
    CHECK(sch.n_preemptions == 1);
    CHECK(b->status == SEQ_WAITING && b->n_spec == 0 && b->n_tokens == 9 && b->n_blocks == 0 && b->n_computed == 0);
    CHECK(bat.n_seqs == 1 && n_new_of(a) == 1 && a->n_blocks == 3);
    sched_commit(&sch, &bat);
    sched_finish(&sch, a);
    sched_finish(&sch, b);
    CHECK(block_pool_n_held(&pool) == 0 && block_pool_check(&pool));
    seq_free(a);
    seq_free(b);
}

/* sched_truncate: a shadow back to a prefix (no prefix cache). */
static void test_truncate(void) {
    setup(8, 1, 64, false);
    struct seq *q = mk(10, 30, 1);
    sched_schedule(&sch, &bat);
    sched_commit(&sch, &bat);
    CHECK(q->n_blocks == 3 && q->n_computed == 10);
    sched_truncate(&sch, q, 5);
    CHECK(q->n_tokens == 5 && q->n_computed == 5 && q->n_blocks == 2 && pool.n_free == 6);
    sched_truncate(&sch, q, 5);               /* idempotent */
    CHECK(q->n_blocks == 2);
    q->tokens[q->n_tokens++] = 99;
    sched_schedule(&sch, &bat);
    CHECK(n_new_of(q) == 1);
    sched_commit(&sch, &bat);
    sched_finish(&sch, q);
    CHECK(block_pool_n_held(&pool) == 0 && block_pool_check(&pool));
    seq_free(q);
}

int main(void) {
    test_resolve();
    test_give_way();
    test_preempt();
    test_truncate();
    block_pool_deinit(&pool);
    sched_deinit(&sch);
    sched_batch_deinit(&bat);
    return check_report("test_sched_spec");
}
