/* test_kv_block_pool.c — the block allocator driven like a scheduler drives
 * it, with fake sequences and exact block ids: allocation and reuse order,
 * prefix-cache hits and LRU eviction, shared and copy-on-write blocks, the
 * hash chain, bad arguments, a corrupted pool caught by block_pool_check,
 * and a randomized run against a naive model of the pool. */
#include "kv/block_pool.h"
#include "core/core.h"
#include "check.h"
#include "io_util.h"
#include "kv_util.h"

#include <string.h>

#define BS 16 /* block_size of the fake sequences */

/* ---- helpers ---- */

/* Hash chain of n_full full blocks of tokens into h[]. */
static void chain(const int32_t *tokens, int n_full, uint64_t *h) {
    uint64_t parent = 0;
    for (int i = 0; i < n_full; i++) h[i] = parent = block_hash(parent, tokens + i * BS, BS);
}

static bool is_listed(const struct block_pool *p, int32_t id) {
    for (int32_t i = p->free_head; i >= 0; i = p->next[i]) if (i == id) return true;
    return false;
}

/* ---- fixed scenarios ---- */

static void test_fresh_pool(void) {
    struct block_pool p;
    CHECK(block_pool_init(&p, 8, BS) == 0);
    CHECK(p.n_blocks == 8 && p.block_size == BS && p.n_free == 8 && p.n_cached == 0);
    CHECK(p.ht_cap >= 16 && (p.ht_cap & (p.ht_cap - 1)) == 0);
    CHECK(block_pool_check(&p));
    for (int32_t i = 0; i < 8; i++) {
        for (int n = 0; n <= 9; n++)
            CHECK_MSG(block_pool_can_alloc(&p, n) == (n <= 8 - i), "i %d n %d", i, n);
        CHECK_MSG(block_pool_alloc(&p) == i, "alloc %d", i);
        CHECK(p.ref[i] == 1);
        CHECK(block_pool_n_held(&p) == i + 1);
        CHECK(block_pool_check(&p));
    }
    CHECK(!block_pool_can_alloc(&p, 1) && block_pool_can_alloc(&p, 0));
    CHECK(block_pool_alloc(&p) == -1);
    CHECK(block_pool_alloc(&p) == -1);
    CHECK(p.n_free == 0 && p.free_head == -1 && p.free_tail == -1);
    for (int i = 0; i < 8; i++) CHECK(p.ref[i] == 1);
    CHECK(block_pool_check(&p));
    block_pool_deinit(&p);
    CHECK(p.ref == NULL && p.hash == NULL && p.n_blocks == 0);
    block_pool_deinit(&p); /* twice is fine */
    block_pool_deinit(NULL);
}

static void test_reuse_order(void) {
    struct block_pool p;
    CHECK(block_pool_init(&p, 8, BS) == 0);
    CHECK(block_pool_alloc(&p) == 0);
    CHECK(block_pool_alloc(&p) == 1);
    CHECK(block_pool_alloc(&p) == 2);
    block_pool_release(&p, 2); /* list: 3 4 5 6 7 2 */
    block_pool_release(&p, 0); /* list: 3 4 5 6 7 2 0 */
    CHECK(p.n_free == 7 && p.free_head == 3 && p.free_tail == 0);
    CHECK(block_pool_check(&p));
    const int32_t want[] = { 3, 4, 5, 6, 7, 2, 0 };
    for (int i = 0; i < 7; i++) CHECK_MSG(block_pool_alloc(&p) == want[i], "alloc #%d", i);
    CHECK(block_pool_alloc(&p) == -1);
    /* Retain from the middle of the list unlinks it, keeping the others' order. */
    for (int32_t i = 0; i < 8; i++) block_pool_release(&p, (int32_t)((i * 3) % 8)); /* 0 3 6 1 4 7 2 5 */
    block_pool_retain(&p, 4);
    CHECK(p.ref[4] == 1 && p.n_free == 7 && !is_listed(&p, 4));
    CHECK(block_pool_check(&p));
    const int32_t want2[] = { 0, 3, 6, 1, 7, 2, 5 };
    for (int i = 0; i < 7; i++) CHECK_MSG(block_pool_alloc(&p) == want2[i], "alloc2 #%d", i);
    CHECK(block_pool_check(&p));
    block_pool_deinit(&p);
}

static void test_prefix_cache(void) {
    struct block_pool p;
    CHECK(block_pool_init(&p, 8, BS) == 0);
    int32_t ta[3 * BS], tb[3 * BS];
    for (int i = 0; i < 3 * BS; i++) ta[i] = tb[i] = 1000 + 7 * i;
    tb[2 * BS + 5] = 42; /* the third block differs */
    uint64_t ha[3], hb[3];
    chain(ta, 3, ha);
    chain(tb, 3, hb);
    CHECK(ha[0] == hb[0] && ha[1] == hb[1] && ha[2] != hb[2]);

    /* Sequence A: nothing cached, three fresh blocks, published as they fill. */
    for (int i = 0; i < 3; i++) CHECK(block_pool_lookup(&p, ha[i]) == -1);
    CHECK(p.n_lookups == 3 && p.n_hits == 0);
    int32_t a[3];
    for (int i = 0; i < 3; i++) {
        a[i] = block_pool_alloc(&p);
        CHECK(a[i] == i);
        block_pool_publish(&p, a[i], ha[i], i ? a[i - 1] : -1, ta + i * BS);
        CHECK(p.hash[a[i]] == ha[i]);
    }
    CHECK(p.n_cached == 0); /* held, not cached */
    CHECK(block_pool_lookup(&p, ha[1]) == 1); /* held blocks are found too */
    CHECK(p.n_lookups == 4 && p.n_hits == 1);
    CHECK(block_pool_check(&p));
    /* A finishes; blocks released last-first, so its tail is evicted first. */
    for (int i = 2; i >= 0; i--) block_pool_release(&p, a[i]); /* list: 3 4 5 6 7 2 1 0 */
    CHECK(p.n_free == 8 && p.n_cached == 3 && block_pool_n_held(&p) == 0);
    CHECK(block_pool_check(&p));

    /* Sequence B: hits h1, h2, misses its own third hash. */
    int32_t b[3];
    int n_hit = 0;
    for (; n_hit < 3; n_hit++) {
        int32_t id = block_pool_lookup(&p, hb[n_hit]);
        if (id < 0) break;
        block_pool_retain(&p, id);
        b[n_hit] = id;
    }
    CHECK(n_hit == 2 && b[0] == 0 && b[1] == 1);
    CHECK(p.n_lookups == 7 && p.n_hits == 3);
    CHECK(p.ref[0] == 1 && p.ref[1] == 1 && !is_listed(&p, 0) && !is_listed(&p, 1));
    CHECK(p.n_free == 6 && p.n_cached == 1); /* block 2 (ha[2]) still cached */
    b[2] = block_pool_alloc(&p);
    CHECK(b[2] == 3); /* an empty block goes before the cached one */
    block_pool_publish(&p, b[2], hb[2], b[1], tb + 2 * BS);
    CHECK(block_pool_lookup(&p, ha[2]) == 2 && block_pool_lookup(&p, hb[2]) == 3);
    CHECK(p.n_lookups == 9 && p.n_hits == 5);
    CHECK(block_pool_check(&p));
    for (int i = 2; i >= 0; i--) block_pool_release(&p, b[i]); /* list: 4 5 6 7 2 3 1 0 */
    CHECK(p.n_free == 8 && p.n_cached == 4);

    /* Sequence C (unrelated) takes the empty blocks, then evicts in LRU order. */
    for (int32_t want = 4; want <= 7; want++) CHECK(block_pool_alloc(&p) == want);
    CHECK(p.n_cached == 4);
    CHECK(block_pool_alloc(&p) == 2);
    CHECK(p.hash[2] == 0 && p.n_cached == 3);
    CHECK(block_pool_lookup(&p, ha[2]) == -1);
    CHECK(block_pool_lookup(&p, hb[2]) == 3);
    CHECK(block_pool_alloc(&p) == 3);
    CHECK(block_pool_lookup(&p, hb[2]) == -1);
    CHECK(block_pool_lookup(&p, ha[1]) == 1);
    CHECK(block_pool_alloc(&p) == 1);
    CHECK(block_pool_lookup(&p, ha[1]) == -1);
    CHECK(block_pool_lookup(&p, ha[0]) == 0); /* the shared root survives longest */
    CHECK(p.n_cached == 1 && p.n_free == 1);
    CHECK(p.n_lookups == 15 && p.n_hits == 8);
    CHECK(block_pool_lookup(&p, 0) == -1);
    CHECK(p.n_lookups == 16 && p.n_hits == 8);
    CHECK(block_pool_check(&p));
    block_pool_deinit(&p);
}

static void test_publish_rules(void) {
    struct block_pool p;
    CHECK(block_pool_init(&p, 4, BS) == 0);
    int32_t x = block_pool_alloc(&p), y = block_pool_alloc(&p);
    uint64_t h = block_hash(0, NULL, 0);
    static const int32_t zt[BS];
    block_pool_publish(&p, x, h, -1, zt);
    block_pool_publish(&p, y, h, -1, zt); /* a second copy of the same prefix: ignored */
    CHECK(p.hash[x] == h && p.hash[y] == 0);
    block_pool_publish(&p, x, h, -1, zt); /* republish: no-op */
    CHECK(block_pool_lookup(&p, h) == x);
    block_pool_release(&p, y); /* unpublished: free but not cached */
    CHECK(p.n_cached == 0 && p.n_free == 3);
    block_pool_release(&p, x);
    CHECK(p.n_cached == 1 && p.n_free == 4);
    /* Retaining the cached block back, then releasing: cached again, same hash. */
    block_pool_retain(&p, x);
    CHECK(p.n_cached == 0 && p.ref[x] == 1 && p.hash[x] == h);
    block_pool_release(&p, x);
    CHECK(p.n_cached == 1 && block_pool_lookup(&p, h) == x);
    CHECK(block_pool_check(&p));
    block_pool_deinit(&p);
}

static void test_shared_and_cow(void) {
    struct block_pool p;
    CHECK(block_pool_init(&p, 4, BS) == 0);
    /* Two samples of one prompt share its blocks: release needs both. */
    int32_t s = block_pool_alloc(&p);
    CHECK(s == 0);
    block_pool_retain(&p, s);
    CHECK(p.ref[s] == 2 && p.n_free == 3);
    block_pool_release(&p, s);
    CHECK(p.ref[s] == 1 && p.n_free == 3 && !is_listed(&p, s));
    block_pool_release(&p, s);
    CHECK(p.ref[s] == 0 && p.n_free == 4 && p.free_tail == s);
    CHECK(block_pool_check(&p));
    const int32_t want[] = { 1, 2, 3, 0 };
    int32_t got[4];
    for (int i = 0; i < 4; i++) CHECK((got[i] = block_pool_alloc(&p)) == want[i]);
    for (int i = 0; i < 4; i++) block_pool_release(&p, got[i]); /* list: 1 2 3 0 */

    /* Copy-on-write: a forked partial block (ref 2); the writer copies. */
    int32_t part = block_pool_alloc(&p);
    CHECK(part == 1);
    block_pool_retain(&p, part); /* fork */
    CHECK(p.ref[part] == 2);
    int32_t copy = -1;
    if (p.ref[part] > 1) {            /* writer 2: shared, so copy before writing */
        CHECK(block_pool_can_alloc(&p, 1));
        copy = block_pool_alloc(&p);
        block_pool_release(&p, part);
    }
    CHECK(copy == 2 && p.ref[copy] == 1 && p.ref[part] == 1);
    CHECK(p.n_free == 2 && block_pool_n_held(&p) == 2);
    CHECK(p.ref[part] == 1); /* writer 1 now owns it alone: writes in place */
    CHECK(block_pool_check(&p));
    block_pool_release(&p, part);
    block_pool_release(&p, copy);
    CHECK(p.n_free == 4 && p.free_head == 3 && p.free_tail == 2); /* list: 3 0 1 2 */
    CHECK(block_pool_check(&p));
    block_pool_deinit(&p);
}

static void test_block_hash(void) {
    enum { N = 512 };
    static uint64_t hs[N];
    int n = 0;
    int32_t t[BS];
    for (int i = 0; i < BS; i++) t[i] = i;
    uint64_t parents[] = { 0, 1, block_hash(0, t, BS) };
    for (int ip = 0; ip < 3; ip++) {
        for (int len = 0; len <= BS; len++) hs[n++] = block_hash(parents[ip], t, len); /* prefixes */
        for (int pos = 0; pos < BS; pos++) {  /* one token changed */
            int32_t u[BS];
            memcpy(u, t, sizeof u);
            u[pos] = 100000 + pos;
            hs[n++] = block_hash(parents[ip], u, BS);
            u[pos] = -1;
            hs[n++] = block_hash(parents[ip], u, BS);
        }
        int32_t sw[BS]; /* two tokens swapped */
        memcpy(sw, t, sizeof sw);
        sw[0] = 1; sw[1] = 0;
        hs[n++] = block_hash(parents[ip], sw, BS);
    }
    int32_t zeros[BS] = { 0 };
    for (int len = 2; len <= BS; len++) hs[n++] = block_hash(0, zeros, len); /* (len 1 = t[0..1)) */
    for (uint64_t par = 2; par < 40; par++) hs[n++] = block_hash(par, zeros, BS);
    CHECK(n <= N);
    int dup = 0, zero = 0;
    for (int i = 0; i < n; i++) {
        zero += hs[i] == 0;
        for (int j = 0; j < i; j++) dup += hs[i] == hs[j];
    }
    CHECK_MSG(dup == 0 && zero == 0, "%d hashes: %d equal pairs, %d zero", n, dup, zero);
    CHECK(block_hash(7, t, BS) == block_hash(7, t, BS)); /* deterministic */
    CHECK(block_hash(0, NULL, 0) != 0);
}

static void test_init_errors(void) {
    struct block_pool p;
    int bad[][2] = { { 0, 16 }, { -1, 16 }, { 8, 0 }, { 8, -4 }, { (1 << 30) + 1, 16 } };
    kvllm_log_set(tu_log_capture, NULL);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&p, 0xab, sizeof p);
        tu_log_reset();
        CHECK_MSG(block_pool_init(&p, bad[i][0], bad[i][1]) == KVLLM_EINVAL, "case %zu", i);
        CHECK(tu_log.n == 1);
        CHECK(p.ref == NULL && p.hash == NULL && p.n_blocks == 0);
        block_pool_deinit(&p);
    }
    kvllm_log_set(NULL, NULL);
    CHECK(block_pool_init(&p, 1, 1) == 0);
    CHECK(block_pool_alloc(&p) == 0 && block_pool_alloc(&p) == -1);
    block_pool_release(&p, 0);
    CHECK(block_pool_check(&p));
    block_pool_deinit(&p);
}

/* block_pool_check catches corruption, one kind at a time, and logs it. */
static void test_check_catches(void) {
    struct block_pool p;
    CHECK(block_pool_init(&p, 8, BS) == 0);
    int32_t a = block_pool_alloc(&p), b = block_pool_alloc(&p);
    static const int32_t zt[BS];
    block_pool_publish(&p, a, 111, -1, zt);
    block_pool_publish(&p, b, 222, -1, zt);
    block_pool_release(&p, a);
    CHECK(block_pool_check(&p));
    kvllm_log_set(tu_log_capture, NULL);
#define CORRUPT(stmt, undo) do { tu_log_reset(); stmt; CHECK_MSG(!block_pool_check(&p) && tu_log.n == 1, \
        "not caught: %s", #stmt); undo; CHECK(block_pool_check(&p)); } while (0)
    CORRUPT(p.n_free++, p.n_free--);
    CORRUPT(p.n_cached--, p.n_cached++);
    CORRUPT(p.ref[a] = 1, p.ref[a] = 0);                       /* listed but held */
    CORRUPT(p.ref[b] = 0, p.ref[b] = 1);                       /* free but unlisted */
    CORRUPT(p.hash[b] = 333, p.hash[b] = 222);                 /* map and block disagree */
    CORRUPT(p.hash[5] = 444, p.hash[5] = 0);                   /* published, not in the map */
    int32_t tail = p.free_tail, saved = p.prev[tail];
    CORRUPT(p.prev[tail] = 3, p.prev[tail] = saved);           /* broken back link */
    CORRUPT(p.free_tail = 4, p.free_tail = tail);
#undef CORRUPT
    kvllm_log_set(NULL, NULL);
    CHECK(strstr(tu_log.last, "block_pool_check") != NULL);
    block_pool_deinit(&p);
}

/* ---- randomized run against a naive model ---- */

struct model {
    int n;
    int32_t ref[64];
    uint64_t hash[64];
    int32_t list[64]; /* free list in order */
    int n_list;
    uint64_t n_lookups, n_hits;
};

static int32_t model_find(const struct model *m, uint64_t h) {
    for (int i = 0; i < m->n; i++) if (h && m->hash[i] == h) return i;
    return -1;
}

static void model_unlist(struct model *m, int32_t id) {
    int k = 0;
    while (m->list[k] != id) k++;
    memmove(m->list + k, m->list + k + 1, (size_t)(m->n_list - k - 1) * sizeof(int32_t));
    m->n_list--;
}

static bool same(const struct block_pool *p, const struct model *m) {
    int cached = 0;
    for (int i = 0; i < m->n_list; i++) cached += m->hash[m->list[i]] != 0;
    if (p->n_free != m->n_list || p->n_cached != cached) return false;
    if (p->n_lookups != m->n_lookups || p->n_hits != m->n_hits) return false;
    for (int i = 0; i < m->n; i++) if (p->ref[i] != m->ref[i] || p->hash[i] != m->hash[i]) return false;
    int32_t id = p->free_head;
    for (int i = 0; i < m->n_list; i++, id = p->next[id]) if (id != m->list[i]) return false;
    return id == -1;
}

static void stress(int n_blocks, int n_ops, uint64_t seed) {
    enum { MAX_HANDLES = 1024, N_KEYS = 96 };
    static int32_t handles[MAX_HANDLES]; /* one entry per reference held by fake sequences */
    int n_handles = 0;
    uint64_t keys[N_KEYS]; /* a small key space, so publishes collide and lookups hit */
    struct rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < N_KEYS; i++) {
        int32_t tok = (int32_t)(rng_u64(&r) % 50000);
        keys[i] = block_hash(i % 3 ? keys[i - 1] : 0, &tok, 1);
    }
    struct model m = { .n = n_blocks };
    for (int i = 0; i < n_blocks; i++) m.list[m.n_list++] = i;
    struct block_pool p;
    CHECK(block_pool_init(&p, n_blocks, BS) == 0);
    int bad = 0;
    for (int op = 0; op < n_ops && !bad; op++) {
        unsigned kind = (unsigned)(rng_u64(&r) % 10);
        if (kind < 3) { /* alloc */
            int32_t want = m.n_list ? m.list[0] : -1;
            if (n_handles == MAX_HANDLES) continue;
            int32_t got = block_pool_alloc(&p);
            if (got != want) { CHECK_MSG(0, "op %d: alloc %d, model %d", op, got, want); bad = 1; break; }
            if (got >= 0) {
                model_unlist(&m, got);
                m.hash[got] = 0;
                m.ref[got] = 1;
                handles[n_handles++] = got;
            }
        } else if (kind < 6) { /* release a random reference */
            if (!n_handles) continue;
            int k = (int)(rng_u64(&r) % (uint64_t)n_handles);
            int32_t id = handles[k];
            handles[k] = handles[--n_handles];
            block_pool_release(&p, id);
            if (--m.ref[id] == 0) m.list[m.n_list++] = id;
        } else if (kind < 8) { /* lookup a key, retain on a hit (a prefix hit) or any block */
            if (n_handles == MAX_HANDLES) continue;
            int32_t id;
            if (kind == 6) {
                uint64_t h = keys[rng_u64(&r) % N_KEYS];
                id = block_pool_lookup(&p, h);
                int32_t want = model_find(&m, h);
                m.n_lookups++;
                m.n_hits += want >= 0;
                if (id != want) { CHECK_MSG(0, "op %d: lookup %d, model %d", op, id, want); bad = 1; break; }
                if (id < 0) continue;
            } else {
                id = (int32_t)(rng_u64(&r) % (uint64_t)n_blocks);
            }
            block_pool_retain(&p, id);
            if (m.ref[id]++ == 0) model_unlist(&m, id);
            handles[n_handles++] = id;
        } else { /* publish a held block under a key */
            if (!n_handles) continue;
            int32_t id = handles[rng_u64(&r) % (uint64_t)n_handles];
            uint64_t h = keys[rng_u64(&r) % N_KEYS];
            if (m.hash[id] != 0 && m.hash[id] != h) continue; /* would be a programming error */
            static const int32_t zt[BS];
            block_pool_publish(&p, id, h, -1, zt);
            if (m.hash[id] == 0 && model_find(&m, h) < 0) m.hash[id] = h;
        }
        if (!block_pool_check(&p) || !same(&p, &m)) {
            CHECK_MSG(0, "op %d (kind %u): pool and model disagree", op, kind);
            bad = 1;
        }
    }
    while (n_handles) block_pool_release(&p, handles[--n_handles]);
    CHECK(p.n_free == n_blocks && block_pool_n_held(&p) == 0);
    CHECK(block_pool_check(&p));
    CHECK(p.n_hits > 0 && p.n_hits < p.n_lookups);
    block_pool_deinit(&p);
}

/* ---- forced collisions: a hit needs identical tokens and an identical prefix ---- */

static void test_collisions(void) {
    block_pool_set_hash_fn(tu_collide_all);
    struct block_pool p;
    CHECK(block_pool_init(&p, 8, BS) == 0);
    block_pool_set_hash_fn(NULL);
    int32_t ta[3 * BS], tv[3 * BS];
    for (int i = 0; i < 3 * BS; i++) ta[i] = 500 + i % BS; /* the attacker: one block, three times */
    for (int i = 0; i < 3 * BS; i++) tv[i] = 700 + i;      /* the victim */
    uint64_t h0 = block_pool_hash(&p, 0, ta);
    CHECK(h0 == 42 && block_pool_hash(&p, h0, ta + BS) == 42 && block_pool_hash(&p, 0, tv) == 42);

    /* the attacker's first block wins hash 42; its later blocks are duplicates */
    int32_t a[3];
    for (int i = 0; i < 3; i++) {
        a[i] = block_pool_alloc(&p);
        block_pool_publish(&p, a[i], 42, i ? a[i - 1] : -1, ta + i * BS);
    }
    CHECK(p.hash[a[0]] == 42 && p.hash[a[1]] == 0 && p.hash[a[2]] == 0);
    for (int i = 2; i >= 0; i--) block_pool_release(&p, a[i]);
    CHECK(block_pool_lookup(&p, 42) == a[0]); /* the bare hash would hand it to anyone */
    uint64_t l0 = p.n_lookups, h0_hits = p.n_hits;

    /* the victim's first block: same hash, other tokens: a miss */
    CHECK(block_pool_match(&p, 42, -1, tv) == -1);
    CHECK(p.n_collisions == 1);
    /* one token off, in the last position: still a miss */
    int32_t near[BS];
    memcpy(near, ta, sizeof near);
    near[BS - 1]++;
    CHECK(block_pool_match(&p, 42, -1, near) == -1 && p.n_collisions == 2);
    /* the attacker's own prefix: a hit */
    CHECK(block_pool_match(&p, 42, -1, ta) == a[0]);
    /* the same tokens as a second block (after a[0]): a[0] is a first block, so a miss */
    CHECK(block_pool_match(&p, 42, a[0], ta + BS) == -1 && p.n_collisions == 3);
    CHECK(p.n_lookups == l0 + 4 && p.n_hits == h0_hits + 1);
    CHECK(block_pool_check(&p));
    block_pool_deinit(&p);

    /* a parent evicted and refilled no longer vouches for its children */
    CHECK(block_pool_init(&p, 3, BS) == 0);
    CHECK(p.hash_fn == NULL);
    int32_t x = block_pool_alloc(&p), y = block_pool_alloc(&p);
    block_pool_publish(&p, x, 100, -1, ta);
    block_pool_publish(&p, y, 200, x, ta + BS);
    CHECK(block_pool_match(&p, 200, x, ta + BS) == y);
    CHECK(block_pool_match(&p, 200, -1, ta + BS) == -1); /* not a first block */
    CHECK(block_pool_match(&p, 200, 2, ta + BS) == -1);  /* another parent */
    block_pool_release(&p, x);                           /* list: 2 x */
    CHECK(block_pool_alloc(&p) == 2 && block_pool_alloc(&p) == x); /* x evicted: new contents */
    block_pool_publish(&p, x, 100, -1, ta);              /* ... even if the same tokens again */
    CHECK(block_pool_match(&p, 100, -1, ta) == x);
    CHECK(block_pool_match(&p, 200, x, ta + BS) == -1);
    CHECK(block_pool_check(&p));
    block_pool_deinit(&p);
}

/* The default hash is keyed per pool: the same tokens hash differently in two pools. */
static void test_keyed_hash(void) {
    struct block_pool p, q;
    CHECK(block_pool_init(&p, 2, BS) == 0 && block_pool_init(&q, 2, BS) == 0);
    int32_t t[BS] = { 1, 2, 3, 4 };
    CHECK(p.hash_key != q.hash_key && p.hash_key != 0);
    CHECK(block_pool_hash(&p, 0, t) == block_pool_hash(&p, 0, t));
    CHECK(block_pool_hash(&p, 0, t) != block_pool_hash(&q, 0, t));
    CHECK(block_pool_hash(&p, 0, t) != block_hash(0, t, BS));
    CHECK(block_hash_keyed(0, 5, t, BS) == block_hash(5, t, BS));
    CHECK(block_hash_keyed(p.hash_key, 5, t, BS) == block_pool_hash(&p, 5, t));
    block_pool_deinit(&p);
    block_pool_deinit(&q);
}

/* A linked pool (a model's sliding-window layers): its published blocks name
 * a block of the other pool as parent, and a hit needs that block unchanged. */
static void test_linked_pool(void) {
    struct block_pool g, w;
    CHECK(block_pool_init(&g, 4, BS) == 0 && block_pool_init(&w, 4, BS) == 0);
    block_pool_link(&w, &g);
    const int32_t t[BS] = { 1, 2, 3, 4 };
    const uint64_t h = block_pool_hash(&g, 0, t);
    int32_t gid = block_pool_alloc(&g), wid = block_pool_alloc(&w);
    CHECK(gid == 0 && wid == 0);
    block_pool_publish(&g, gid, h, -1, t);
    block_pool_publish(&w, wid, h, gid, t);   /* parent 0 of the other pool: its own id is allowed */
    CHECK(w.parent[0] == 0 && block_pool_check(&w));
    block_pool_release(&w, wid);
    CHECK(block_pool_match(&w, h, gid, t) == 0);   /* the twin the asker matched: a hit */
    CHECK(block_pool_match(&w, h, 1, t) == -1);    /* another global block: a miss */
    /* the global block evicted and refilled: the sliding block no longer vouched for */
    block_pool_release(&g, gid);
    for (int i = 0; i < 4; i++) CHECK(block_pool_alloc(&g) >= 0);
    CHECK(g.gen[0] == 2 && block_pool_match(&w, h, 0, t) == -1 && w.n_collisions == 2);
    CHECK(block_pool_check(&g) && block_pool_check(&w));
    block_pool_deinit(&w);
    block_pool_deinit(&g);
}

/* ---- the listener: what routers are told ---- */

struct heard { int n; struct block_pool_event ev[8]; int32_t tok0[8]; };

static void hear(const struct block_pool_event *ev, void *user) {
    struct heard *h = user;
    if (h->n < 8) { h->ev[h->n] = *ev; h->tok0[h->n] = ev->tokens ? ev->tokens[0] : -1; }
    h->n++;
}

/* Publishing tells STORED with the parent and tokens once (not the no-op
 * republish, nor a second block under a hash already held); an eviction
 * tells REMOVED; a plain alloc of an unpublished block tells nothing. */
static void test_listener(void) {
    struct block_pool p;
    struct heard h = { 0 };
    CHECK(block_pool_init(&p, 2, BS) == 0);
    block_pool_set_listener(&p, hear, &h);
    int32_t t[2 * BS];
    for (int i = 0; i < 2 * BS; i++) t[i] = 100 + i;
    uint64_t hh[2];
    chain(t, 2, hh);
    int32_t a = block_pool_alloc(&p), b = block_pool_alloc(&p);
    CHECK(h.n == 0);
    block_pool_publish(&p, a, hh[0], -1, t);
    block_pool_publish(&p, a, hh[0], -1, t); /* no-op: told once */
    block_pool_publish(&p, b, hh[1], a, t + BS);
    CHECK(h.n == 2);
    CHECK(h.ev[0].kind == BLOCK_POOL_STORED && h.ev[0].id == a && h.ev[0].parent == -1 && h.tok0[0] == 100);
    CHECK(h.ev[1].kind == BLOCK_POOL_STORED && h.ev[1].id == b && h.ev[1].parent == a && h.tok0[1] == 100 + BS);
    block_pool_release(&p, a);
    block_pool_release(&p, b);
    CHECK(block_pool_alloc(&p) == a); /* evicts a */
    CHECK(h.n == 3 && h.ev[2].kind == BLOCK_POOL_REMOVED && h.ev[2].id == a && h.ev[2].tokens == NULL);
    block_pool_set_listener(&p, NULL, NULL);
    CHECK(block_pool_alloc(&p) == b); /* evicts b, nobody listening */
    CHECK(h.n == 3 && block_pool_check(&p));
    block_pool_deinit(&p);
}

int main(void) {
    test_listener();
    test_fresh_pool();
    test_reuse_order();
    test_prefix_cache();
    test_publish_rules();
    test_shared_and_cow();
    test_block_hash();
    test_init_errors();
    test_check_catches();
    test_collisions();
    test_keyed_hash();
    test_linked_pool();
    stress(64, 100000, 1);
    stress(7, 100000, 2);   /* ht_cap 16: long probe runs, many evictions */
    stress(33, 20000, 3);   /* ht_cap 128 */
    return check_report("test_kv_block_pool");
}
