/* block_pool.h — ids and reference counts of the fixed-size KV blocks, with
 * a prefix cache: no tensors here, only bookkeeping.
 *
 * Model of the world: n_blocks blocks, each either held (ref > 0) or free
 * (ref == 0).  Free blocks sit in one list in eviction order: allocation
 * takes the head, release appends at the tail, so the least recently
 * released block is reused first.  A full block may be published under the
 * hash of its token prefix (a hash chain: the block's tokens and the hash of
 * the block before it); a free block that still holds a published hash is
 * "cached": a later request with the same prefix can take it back
 * (block_pool_retain) until allocation evicts it.
 *
 * A hash is never trusted alone (an unkeyed 64-bit chain can be run
 * backwards and a colliding block forged).  A published block keeps its
 * tokens and the block it followed (its parent, with the parent's
 * allocation generation), and block_pool_match returns it only when all
 * three agree with the asking sequence: the tokens compared id by id, the
 * parent being the block the asker itself matched (or holds) for the
 * previous block, still holding what it held at publish time.  By
 * induction a hit means the whole prefix is identical, whatever the hash
 * does.  The chain is also keyed per pool with 64 random bits
 * (getrandom), so a collision cannot be computed offline.  Tests replace
 * the hash (block_pool_set_hash_fn) to force collisions.
 *
 * A pool may be linked to another one (block_pool_link): the sliding-window
 * layers of a hybrid model keep their blocks in a pool of their own, and a
 * block published there names as its parent the block of the linked pool
 * (the global layers') that holds the same positions of the same prefix in
 * the publisher's table, with that block's generation.  A hit in the
 * sliding pool is then verified by the global pool's chain: the parent is
 * the global block the asker matched for the same index, unchanged since,
 * so both hold the K/V of the same prefix.
 *
 * "Ask, then do": block_pool_can_alloc says whether n allocations will
 * succeed, so a scheduler can decide before mutating anything.  Not
 * thread-safe: one engine thread owns the pool.
 *
 * A listener (block_pool_set_listener) hears what the prefix cache gains
 * and loses — a block published, a cached block evicted — so that the
 * layer above can tell routers what this pool holds (vLLM's KV events)
 * without the pool knowing who listens or how it is sent. */
#ifndef KVLLM_BLOCK_POOL_H
#define KVLLM_BLOCK_POOL_H

#include <stdbool.h>
#include <stdint.h>

/* What the prefix cache just gained or lost (block_pool_set_listener). */
enum block_pool_event_kind {
    BLOCK_POOL_STORED,   /* a block was published: a later prefix may reuse it */
    BLOCK_POOL_REMOVED,  /* a published block was evicted (its contents are about to be replaced) */
};
struct block_pool_event {
    enum block_pool_event_kind kind;
    int32_t id;             /* the block */
    int32_t parent;         /* STORED: the block before it in the publisher's table (a block of the linked
                               pool when linked), -1 for a first block; REMOVED: -1 */
    const int32_t *tokens;  /* STORED: its block_size token ids (valid during the call); REMOVED: NULL */
};
typedef void (*block_pool_listener_fn)(const struct block_pool_event *ev, void *user);

struct block_pool {
    int n_blocks, block_size;
    int32_t *ref;             /* (n_blocks) reference counts */
    uint64_t *hash;           /* (n_blocks) published prefix hash, 0 = none */
    int32_t *prev, *next;     /* (n_blocks) free-list links, -1 terminated */
    int32_t free_head, free_tail;
    int n_free;               /* ref == 0, cached ones included */
    int n_cached;             /* free and still published */
    uint64_t *ht_key;         /* open-addressing map hash -> block (ht_cap slots) */
    int32_t *ht_val;
    uint32_t ht_cap;
    int32_t *tokens;          /* (n_blocks, block_size) the token ids of each published block */
    int32_t *parent;          /* (n_blocks) block before a published one in its prefix, -1 for a first block */
    uint32_t *parent_gen;     /* (n_blocks) gen[parent] when published */
    uint32_t *gen;            /* (n_blocks) bumped by every alloc: the block's contents were replaced */
    uint64_t hash_key;        /* random per pool (process), mixed into every chain */
    uint64_t (*hash_fn)(uint64_t key, uint64_t parent, const int32_t *tokens, int n); /* NULL: block_hash_keyed */
    uint64_t n_lookups, n_hits; /* prefix-cache statistics, in blocks */
    uint64_t n_collisions;      /* lookups whose hash matched a block of other tokens or another prefix */
    const struct block_pool *link; /* the pool parents are blocks of (NULL: this one) */
    block_pool_listener_fn listener; /* NULL: nobody listens */
    void *listener_user;
};

/* All blocks free, ids 0..n_blocks-1 in the free list in order.  All arrays
 * live in one allocation made here (nothing is allocated later).  The hash
 * key comes from the kernel's CSPRNG (a warning and a clock-derived key if
 * it cannot answer); hash_fn is the one set by block_pool_set_hash_fn.
 * KVLLM_EINVAL for n_blocks < 1, n_blocks > 2^30 or block_size < 1;
 * KVLLM_ENOMEM.  Both logged; *p is left zeroed. */
int block_pool_init(struct block_pool *p, int n_blocks, int block_size);
void block_pool_deinit(struct block_pool *p); /* NULL-safe; leaves *p zeroed */

static inline bool block_pool_can_alloc(const struct block_pool *p, int n) { return n <= p->n_free; }

/* Take the head of the free list (evicting its published hash, if any),
 * ref = 1.  Returns the id, or -1 when no block is free (nothing changes). */
int32_t block_pool_alloc(struct block_pool *p);

/* One more reference; a free (cached) block leaves the free list.
 * An id outside [0, n_blocks) is a programming error (KV_ASSERT). */
void block_pool_retain(struct block_pool *p, int32_t id);

/* One reference less; at 0 the block goes to the tail of the free list
 * (keeping its published hash: it is now cached).  Releasing a block with
 * ref 0, or an invalid id, is a programming error (KV_ASSERT). */
void block_pool_release(struct block_pool *p, int32_t id);

/* A prefix-cache hit: the block published under hash whose block_size
 * tokens equal tokens and whose parent is parent (-1: a first block; else
 * the block matched or held for the previous block of the same prefix,
 * unchanged since; in a linked pool, the linked pool's block for the same
 * index).  Returns its id (held or cached), or -1: no block
 * under hash (always for hash 0), or one that differs (a collision:
 * counted in n_collisions).  Counts a lookup and, on success, a hit.
 * Changes nothing else: the caller retains the block it wants to keep. */
int32_t block_pool_match(struct block_pool *p, uint64_t hash, int32_t parent, const int32_t *tokens);

/* The block published under hash, or -1, without any check of its tokens:
 * for tests and reports only, never for reuse (see block_pool_match).
 * Counts a lookup and, when found, a hit. */
int32_t block_pool_lookup(struct block_pool *p, uint64_t hash);

/* Publish a full, held block under hash (!= 0), keeping a copy of its
 * block_size tokens and its parent (-1 for a first block, else the block
 * before it in the publisher's table).  If another block already holds that
 * hash, nothing changes (the first one stays the cached copy);
 * republishing a block under its own hash is a no-op.  Publishing a free
 * block, hash 0, a parent out of range or (unlinked) equal to id, or a second,
 * different hash for one block is a programming error (KV_ASSERT). */
void block_pool_publish(struct block_pool *p, int32_t id, uint64_t hash, int32_t parent, const int32_t *tokens);

/* Hash chain of a full block under the pool's key: parent hash (0 for the
 * first block) and its block_size tokens.  Never returns 0. */
uint64_t block_pool_hash(const struct block_pool *p, uint64_t parent, const int32_t *tokens);

/* The default chain: key, parent hash and n tokens.  block_hash is
 * block_hash_keyed with key 0 (unkeyed: for tests).  Never return 0. */
uint64_t block_hash_keyed(uint64_t key, uint64_t parent, const int32_t *tokens, int n);
uint64_t block_hash(uint64_t parent, const int32_t *tokens, int n);

/* Tests only: pools initialized from now on hash with fn (NULL: the keyed
 * default), e.g. one that maps every block to the same value to force
 * collisions.  Process-wide; not thread-safe against block_pool_init. */
void block_pool_set_hash_fn(uint64_t (*fn)(uint64_t key, uint64_t parent, const int32_t *tokens, int n));

/* From now on the parents of p's published blocks are blocks of link (a
 * different pool that outlives p), their generations link's: see the
 * model of the world above.  Call before publishing anything. */
void block_pool_link(struct block_pool *p, const struct block_pool *link);

/* From now on fn(ev, user) is called, on the thread that owns the pool,
 * inside block_pool_publish for every block that enters the map (not for
 * the no-op cases) and inside block_pool_alloc for every published block it
 * evicts.  fn must not call back into the pool.  NULL: off. */
void block_pool_set_listener(struct block_pool *p, block_pool_listener_fn fn, void *user);

/* Counts for reports: held (ref > 0), cached (free, published), empty (free, unpublished). */
static inline int block_pool_n_held(const struct block_pool *p) { return p->n_blocks - p->n_free; }
static inline int block_pool_n_cached(const struct block_pool *p) { return p->n_cached; }

/* Check every invariant (lists, counts, map); false + logged reason if broken. For tests. */
bool block_pool_check(const struct block_pool *p);

#endif
