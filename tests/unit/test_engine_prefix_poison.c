/* test_engine_prefix_poison.c — prefix-cache poisoning end to end (issue
 * 15, defect 3), on stories260K with greedy decoding.  The attack was a
 * forged 16-token block whose hash equals the first block of a victim's
 * prompt: the victim was then served the attacker's K/V.  Here the block
 * hash is forced to collide for every block of every prompt
 * (block_pool_set_hash_fn, a test-only hook), which is the attacker's best
 * case; the victim must still get exactly the tokens it gets alone, and
 * its own earlier identical prompt must still be a cache hit. */
#include "check.h"
#include "kv_util.h"
#include "stories_util.h"
#include "kv/block_pool.h"
#include "kvllm.h"

#include <stdio.h>
#include <string.h>

#define N_GEN 24

struct out {
    int32_t ids[N_GEN];
    int n, n_cached;
    bool done;
};

static void on_event(const struct kvllm_event *ev, void *user) {
    struct out *o = user;
    if (ev->token >= 0 && o->n < N_GEN) o->ids[o->n++] = ev->token;
    o->n_cached = ev->n_cached;
    if (ev->finish) o->done = true;
}

/* Greedy generation of N_GEN tokens for a prompt on engine e. */
static struct out generate(struct kvllm_engine *e, const int32_t *prompt, int n_prompt) {
    struct out o = { .n = 0 };
    struct kvllm_request q = { .prompt = prompt, .n_prompt = n_prompt, .max_tokens = N_GEN, .n = 1,
                               .sampling = kvllm_sampling_default_params(), .ignore_eos = true, .no_text = true,
                               .on_event = on_event, .user = &o };
    q.sampling.temperature = 0;
    uint64_t id;
    CHECK(kvllm_engine_add(e, &q, &id) == 0);
    for (int steps = 0; !o.done && steps < 1000; steps++) CHECK(kvllm_engine_step(e) >= 0);
    CHECK(o.done && o.n == N_GEN);
    return o;
}

static struct kvllm_engine *engine(struct kvllm_model *m, bool collide) {
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.max_seqs = 4;
    ep.kv_tokens = 1024;
    ep.block_size = 16;
    ep.prefix_caching = true;
    block_pool_set_hash_fn(collide ? tu_collide_all : NULL);
    struct kvllm_engine *e = NULL;
    CHECK(kvllm_engine_new(m, &ep, &e) == 0);
    block_pool_set_hash_fn(NULL);
    return e;
}

static int tokenize(struct kvllm_model *m, const char *text, int32_t *ids, int cap) {
    int n = kvllm_tokenize(m, text, strlen(text), true, false, ids, cap);
    CHECK_MSG(n > 33 && n <= cap, "%d tokens", n); /* two full blocks and more */
    return n > cap ? cap : n;
}

static int n_diff(const struct out *a, const struct out *b) {
    int d = 0;
    for (int i = 0; i < N_GEN; i++) d += a->ids[i] != b->ids[i];
    return d;
}

int main(void) {
    struct kvllm_model *m = load_stories(1);
    if (!m) return check_report("test_engine_prefix_poison");

    int32_t victim[128], attacker[128];
    int nv = tokenize(m, "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
                         "park with her friends and her dog.", victim, 128);
    int na = tokenize(m, "The big brown dog ran to the tree and barked at the cat, who sat on the high wall all "
                         "day long and did not care.", attacker, 128);

    /* the victim alone */
    struct kvllm_engine *e = engine(m, false);
    struct out alone = generate(e, victim, nv);
    CHECK(alone.n_cached == 0);
    kvllm_engine_free(e);

    /* its prompt in chunks of 16: the cache served nothing (not the second chunk's start) */
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.max_batch_tokens = 16;
    ep.kv_tokens = 1024;
    CHECK(kvllm_engine_new(m, &ep, &e) == 0);
    struct out chunked = generate(e, victim, nv);
    CHECK_MSG(chunked.n_cached == 0 && n_diff(&chunked, &alone) == 0, "chunked: %d cached", chunked.n_cached);
    kvllm_engine_free(e);

    /* every block hashes to 42: the attacker's first block is published first */
    e = engine(m, true);
    struct out atk = generate(e, attacker, na);
    struct out v1 = generate(e, victim, nv);
    struct out v2 = generate(e, victim, nv);
    CHECK_MSG(n_diff(&v1, &alone) == 0 && v1.n_cached == 0, "after the attacker: %d of %d tokens differ, %d cached",
              n_diff(&v1, &alone), N_GEN, v1.n_cached);
    CHECK_MSG(n_diff(&v2, &alone) == 0 && v2.n_cached == 0, "again: %d of %d tokens differ, %d cached",
              n_diff(&v2, &alone), N_GEN, v2.n_cached);
    printf("forced collisions: attacker then victim: %d of %d greedy tokens differ from alone, %d cached "
           "(attacker %d cached)\n", n_diff(&v1, &alone), N_GEN, v1.n_cached, atk.n_cached);
    kvllm_engine_free(e);

    /* the victim's own prefix still hits (one block: the map holds one block per hash) */
    e = engine(m, true);
    struct out w1 = generate(e, victim, nv);
    struct out w2 = generate(e, victim, nv);
    CHECK(n_diff(&w1, &alone) == 0 && w1.n_cached == 0);
    CHECK_MSG(n_diff(&w2, &alone) == 0 && w2.n_cached == 16, "own prefix: %d differ, %d cached",
              n_diff(&w2, &alone), w2.n_cached);
    kvllm_engine_free(e);

    /* the keyed hash: the attacker changes nothing, the victim's repeat hits whole blocks */
    e = engine(m, false);
    generate(e, attacker, na);
    struct out k1 = generate(e, victim, nv), k2 = generate(e, victim, nv);
    CHECK(n_diff(&k1, &alone) == 0 && k1.n_cached == 0);
    CHECK(n_diff(&k2, &alone) == 0 && k2.n_cached == (nv - 1) / 16 * 16);
    kvllm_engine_free(e);

    kvllm_model_free(m);
    return check_report("test_engine_prefix_poison");
}
