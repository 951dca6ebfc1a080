/* block_pool.c — ids, reference counts and the prefix cache of KV blocks.
 *
 * Model of the world (as vLLM v1's BlockPool / FreeKVCacheBlockQueue, and
 * nano-vllm's block_manager): every block is held (ref > 0) or free
 * (ref == 0).  Free blocks form one doubly linked list threaded through the
 * prev/next index arrays, in eviction order: alloc pops the head, release at
 * ref 0 appends at the tail, retain of a free block unlinks it from the
 * middle — all O(1).  A block published under a prefix hash keeps that hash
 * while held and while free ("cached"); the map hash -> block holds exactly
 * the blocks whose hash != 0.  Only alloc forgets a hash: the head it takes
 * is about to be overwritten, so its hash leaves the map.
 *
 * The map is open addressing with linear probing, capacity a power of two
 * >= 2 * n_blocks (so at most half full), key 0 = empty slot; deletion
 * shifts later entries of the probe run back (no tombstones), so a probe
 * may always stop at the first empty slot.
 *
 * A hit is verified, never taken on the hash alone (block_pool_match): the
 * block's tokens, its parent and the parent's generation must agree.  The
 * generation of a block counts its allocations, so a parent evicted and
 * refilled since no longer vouches for the children published after it.
 *
 * Memory: one slab made in block_pool_init, all arrays point into it
 * (p->hash is its start); nothing is allocated afterwards. */
#include "kv/block_pool.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BP_MAX_BLOCKS (1 << 30) /* keeps ht_cap = 2^k <= 2^31 in uint32_t */

/* ---- the hash map ---- */

/* block_pool_set_hash_fn: the hash of pools initialized afterwards (tests). */
static uint64_t (*g_hash_fn)(uint64_t key, uint64_t parent, const int32_t *tokens, int n);

void block_pool_set_hash_fn(uint64_t (*fn)(uint64_t key, uint64_t parent, const int32_t *tokens, int n)) {
    g_hash_fn = fn;
}

/* Home slot of a key: multiply-shift, so that weak keys (1, 2, 3, ...) spread too. */
static uint32_t ht_home(const struct block_pool *p, uint64_t key) {
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & (p->ht_cap - 1);
}

/* Slot holding key, or -1. */
static int64_t ht_find(const struct block_pool *p, uint64_t key) {
    uint32_t mask = p->ht_cap - 1;
    for (uint32_t i = ht_home(p, key);; i = (i + 1) & mask) {
        if (p->ht_key[i] == key) return i;
        if (p->ht_key[i] == 0) return -1;
    }
}

/* Insert a key that is not in the map (the map is never full: load <= 1/2). */
static void ht_insert(struct block_pool *p, uint64_t key, int32_t val) {
    uint32_t mask = p->ht_cap - 1, i = ht_home(p, key);
    while (p->ht_key[i] != 0) i = (i + 1) & mask;
    p->ht_key[i] = key;
    p->ht_val[i] = val;
}

/* Remove slot i, then shift back every later entry of its probe run whose
 * home is not cyclically in (i, j]: such an entry would otherwise become
 * unreachable behind the new hole. */
static void ht_remove_slot(struct block_pool *p, uint32_t i) {
    uint32_t mask = p->ht_cap - 1;
    for (uint32_t j = (i + 1) & mask; p->ht_key[j] != 0; j = (j + 1) & mask) {
        uint32_t k = ht_home(p, p->ht_key[j]);
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        p->ht_key[i] = p->ht_key[j];
        p->ht_val[i] = p->ht_val[j];
        i = j;
    }
    p->ht_key[i] = 0;
    p->ht_val[i] = -1;
}

/* ---- the free list ---- */

static void list_unlink(struct block_pool *p, int32_t id) {
    int32_t a = p->prev[id], b = p->next[id];
    if (a >= 0) p->next[a] = b; else p->free_head = b;
    if (b >= 0) p->prev[b] = a; else p->free_tail = a;
    p->prev[id] = p->next[id] = -1;
}

static void list_append(struct block_pool *p, int32_t id) {
    p->prev[id] = p->free_tail;
    p->next[id] = -1;
    if (p->free_tail >= 0) p->next[p->free_tail] = id; else p->free_head = id;
    p->free_tail = id;
}

/* ---- life cycle ---- */

int block_pool_init(struct block_pool *p, int n_blocks, int block_size) {
    memset(p, 0, sizeof *p);
    if (n_blocks < 1 || n_blocks > BP_MAX_BLOCKS || block_size < 1) {
        LOG_ERR("%s: invalid n_blocks %d or block_size %d", __func__, n_blocks, block_size);
        return KVLLM_EINVAL;
    }
    uint32_t cap = 1;
    while (cap < 2u * (uint32_t)n_blocks) cap <<= 1;
    /* 8-byte arrays first, then the 4-byte ones: every array stays aligned. */
    size_t n = (size_t)n_blocks;
    uint64_t n_tok, bytes;
    if (!ckd_mul_u64(&n_tok, n, (uint64_t)block_size) || !ckd_mul_u64(&bytes, n_tok + 6 * n + cap, 4) ||
        !ckd_add_u64(&bytes, bytes, (uint64_t)(n + cap) * sizeof(uint64_t)) || bytes > SIZE_MAX / 2) {
        LOG_ERR("%s: %d blocks of %d tokens do not fit in memory", __func__, n_blocks, block_size);
        return KVLLM_ENOMEM;
    }
    uint8_t *slab = xmalloc((size_t)bytes);
    if (!slab) return KVLLM_ENOMEM;
    p->hash = (uint64_t *)slab;
    p->ht_key = p->hash + n;
    p->ref = (int32_t *)(p->ht_key + cap);
    p->prev = p->ref + n;
    p->next = p->prev + n;
    p->ht_val = p->next + n;
    p->parent = p->ht_val + cap;
    p->parent_gen = (uint32_t *)(p->parent + n);
    p->gen = p->parent_gen + n;
    p->tokens = (int32_t *)(p->gen + n);
    memset(p->parent, 0xff, n * sizeof(int32_t));
    memset(p->parent_gen, 0, n * sizeof(uint32_t));
    memset(p->gen, 0, n * sizeof(uint32_t));
    memset(p->tokens, 0, (size_t)n_tok * sizeof(int32_t));
    if (os_random_bytes(&p->hash_key, sizeof p->hash_key) != 0) {
        LOG_WARN("%s: no random key for the prefix-cache hash; using one from the clock (hits are still "
                 "verified token by token)", __func__);
        p->hash_key = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() ^ (uint64_t)(uintptr_t)slab;
    }
    p->hash_fn = g_hash_fn;

    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->ht_cap = cap;
    memset(p->hash, 0, n * sizeof(uint64_t));
    memset(p->ht_key, 0, (size_t)cap * sizeof(uint64_t));
    memset(p->ref, 0, n * sizeof(int32_t));
    for (uint32_t i = 0; i < cap; i++) p->ht_val[i] = -1;
    p->free_head = p->free_tail = -1;
    for (int32_t i = 0; i < n_blocks; i++) list_append(p, i);
    p->n_free = n_blocks;
    return 0;
}

void block_pool_deinit(struct block_pool *p) {
    if (!p) return;
    free(p->hash); /* the slab */
    memset(p, 0, sizeof *p);
}

/* ---- operations ---- */

int32_t block_pool_alloc(struct block_pool *p) {
    int32_t id = p->free_head;
    if (id < 0) return -1;
    KV_ASSERT(p->ref[id] == 0);
    list_unlink(p, id);
    p->n_free--;
    if (p->hash[id] != 0) { /* evict: its contents are about to be overwritten */
        int64_t slot = ht_find(p, p->hash[id]);
        KV_ASSERT(slot >= 0 && p->ht_val[slot] == id);
        ht_remove_slot(p, (uint32_t)slot);
        p->hash[id] = 0;
        p->n_cached--;
        if (p->listener) p->listener(&(struct block_pool_event){ BLOCK_POOL_REMOVED, id, -1, NULL }, p->listener_user);
    }
    p->gen[id]++; /* new contents: children published under the old ones no longer match */
    p->parent[id] = -1;
    p->ref[id] = 1;
    return id;
}

void block_pool_retain(struct block_pool *p, int32_t id) {
    KV_ASSERT(id >= 0 && id < p->n_blocks);
    if (p->ref[id] == 0) {
        list_unlink(p, id);
        p->n_free--;
        if (p->hash[id] != 0) p->n_cached--;
    }
    KV_ASSERT(p->ref[id] < INT32_MAX);
    p->ref[id]++;
}

void block_pool_release(struct block_pool *p, int32_t id) {
    KV_ASSERT(id >= 0 && id < p->n_blocks);
    KV_ASSERT(p->ref[id] > 0);
    if (--p->ref[id] > 0) return;
    list_append(p, id);
    p->n_free++;
    if (p->hash[id] != 0) p->n_cached++;
}

int32_t block_pool_lookup(struct block_pool *p, uint64_t hash) {
    p->n_lookups++;
    if (hash == 0) return -1;
    int64_t slot = ht_find(p, hash);
    if (slot < 0) return -1;
    p->n_hits++;
    return p->ht_val[slot];
}

/* The pool parents are blocks of. */
static const struct block_pool *parents(const struct block_pool *p) { return p->link ? p->link : p; }

void block_pool_link(struct block_pool *p, const struct block_pool *link) {
    KV_ASSERT(link != p && link->block_size == p->block_size && p->n_cached == 0 && block_pool_n_held(p) == 0);
    p->link = link;
}

int32_t block_pool_match(struct block_pool *p, uint64_t hash, int32_t parent, const int32_t *tokens) {
    const struct block_pool *pp = parents(p);
    KV_ASSERT(parent >= -1 && parent < pp->n_blocks && tokens);
    int32_t id = block_pool_lookup(p, hash);
    if (id < 0) return -1;
    const size_t bs = (size_t)p->block_size;
    if (p->parent[id] != parent || (parent >= 0 && p->parent_gen[id] != pp->gen[parent]) ||
        memcmp(p->tokens + (size_t)id * bs, tokens, bs * sizeof *tokens) != 0) {
        p->n_hits--; /* the hash matched; the block does not */
        p->n_collisions++;
        return -1;
    }
    return id;
}

void block_pool_publish(struct block_pool *p, int32_t id, uint64_t hash, int32_t parent, const int32_t *tokens) {
    KV_ASSERT(id >= 0 && id < p->n_blocks);
    const struct block_pool *pp = parents(p);
    KV_ASSERT(p->ref[id] > 0 && hash != 0 && tokens);
    KV_ASSERT(parent >= -1 && parent < pp->n_blocks && (parent != id || p->link));
    if (p->hash[id] == hash) return;  /* already published under it */
    KV_ASSERT(p->hash[id] == 0);      /* a block has one prefix */
    if (ht_find(p, hash) >= 0) return; /* another block holds it: keep that one */
    ht_insert(p, hash, id);
    p->hash[id] = hash;
    memcpy(p->tokens + (size_t)id * (size_t)p->block_size, tokens, (size_t)p->block_size * sizeof *tokens);
    p->parent[id] = parent;
    p->parent_gen[id] = parent >= 0 ? pp->gen[parent] : 0;
    if (p->listener)
        p->listener(&(struct block_pool_event){ BLOCK_POOL_STORED, id, parent, p->tokens + (size_t)id * (size_t)p->block_size },
                    p->listener_user);
}

void block_pool_set_listener(struct block_pool *p, block_pool_listener_fn fn, void *user) {
    p->listener = fn;
    p->listener_user = user;
}

/* ---- hashing ---- */

/* splitmix64's finalizer: a bijection with full avalanche. */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27; x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The key enters first and last: without it neither end of the chain can be
 * computed, so a colliding block cannot be searched for offline. */
uint64_t block_hash_keyed(uint64_t key, uint64_t parent, const int32_t *tokens, int n) {
    KV_ASSERT(n >= 0 && (tokens || n == 0));
    uint64_t h = mix64(parent ^ key ^ 0x6A09E667F3BCC909ull);
    for (int i = 0; i < n; i++)
        h = mix64(h ^ ((uint64_t)(uint32_t)tokens[i] + 0x9E3779B97F4A7C15ull));
    h = mix64(h ^ ((uint64_t)(uint32_t)n * 0xC2B2AE3D27D4EB4Full) ^ (key << 32 | key >> 32));
    return h ? h : 0x243F6A8885A308D3ull; /* 0 means "unpublished" */
}

uint64_t block_hash(uint64_t parent, const int32_t *tokens, int n) { return block_hash_keyed(0, parent, tokens, n); }

uint64_t block_pool_hash(const struct block_pool *p, uint64_t parent, const int32_t *tokens) {
    uint64_t h = p->hash_fn ? p->hash_fn(p->hash_key, parent, tokens, p->block_size)
                            : block_hash_keyed(p->hash_key, parent, tokens, p->block_size);
    return h ? h : 0x243F6A8885A308D3ull;
}

/* ---- invariants ---- */

bool block_pool_check(const struct block_pool *p) {
#define BP_FAIL(...) do { LOG_ERR("block_pool_check: " __VA_ARGS__); return false; } while (0)
    int n = p->n_blocks, listed = 0, cached = 0;
    int32_t last = -1;
    /* Walk the list: back links agree, every member free, no cycle. */
    for (int32_t id = p->free_head; id >= 0; last = id, id = p->next[id]) {
        if (id >= n) BP_FAIL("list holds id %d of %d", id, n);
        if (p->prev[id] != last) BP_FAIL("block %d: prev %d, expected %d", id, p->prev[id], last);
        if (p->ref[id] != 0) BP_FAIL("listed block %d has ref %d", id, p->ref[id]);
        if (++listed > n) BP_FAIL("free list longer than the pool (cycle)");
        if (p->hash[id] != 0) cached++;
    }
    if (p->free_tail != last) BP_FAIL("free_tail %d, list ends at %d", p->free_tail, last);
    if (listed != p->n_free) BP_FAIL("%d blocks listed, n_free %d", listed, p->n_free);
    if (cached != p->n_cached) BP_FAIL("%d listed published blocks, n_cached %d", cached, p->n_cached);
    /* Every block: free ones were all listed (counts agree), held ones unlinked;
     * a published block is found in the map under its hash. */
    int n_ref0 = 0, n_published = 0;
    for (int32_t id = 0; id < n; id++) {
        if (p->ref[id] < 0) BP_FAIL("block %d has ref %d", id, p->ref[id]);
        if (p->ref[id] == 0) n_ref0++;
        else if (p->prev[id] != -1 || p->next[id] != -1 || p->free_head == id)
            BP_FAIL("held block %d (ref %d) is linked", id, p->ref[id]);
        if (p->hash[id] == 0) continue;
        n_published++;
        if (p->parent[id] < -1 || p->parent[id] >= parents(p)->n_blocks || (p->parent[id] == id && !p->link))
            BP_FAIL("published block %d has parent %d", id, p->parent[id]);
        int64_t slot = ht_find(p, p->hash[id]);
        if (slot < 0 || p->ht_val[slot] != id)
            BP_FAIL("block %d: hash %016llx maps to %d", id, (unsigned long long)p->hash[id],
                    slot < 0 ? -1 : p->ht_val[slot]);
    }
    if (n_ref0 != listed) BP_FAIL("%d blocks with ref 0, %d listed", n_ref0, listed);
    /* Every map entry: points to a block with that hash, reachable by probing. */
    int n_entries = 0;
    for (uint32_t s = 0; s < p->ht_cap; s++) {
        uint64_t key = p->ht_key[s];
        if (key == 0) continue;
        n_entries++;
        int32_t id = p->ht_val[s];
        if (id < 0 || id >= n || p->hash[id] != key)
            BP_FAIL("slot %u: hash %016llx -> block %d of other hash", s, (unsigned long long)key, id);
        if (ht_find(p, key) != (int64_t)s) BP_FAIL("slot %u: hash %016llx unreachable", s, (unsigned long long)key);
    }
    if (n_entries != n_published) BP_FAIL("%d map entries, %d published blocks", n_entries, n_published);
    return true;
#undef BP_FAIL
}
