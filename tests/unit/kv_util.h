/* kv_util.h — hooks the prefix-cache tests install in the KV block pool. */
#ifndef KVLLM_KV_UTIL_H
#define KVLLM_KV_UTIL_H
#include <stdint.h>

/* A block hash (block_pool_set_hash_fn) that maps every block of every
 * prefix to one value: each lookup collides, so a hit must be earned by
 * identical tokens and an identical prefix, never by the hash alone. */
static inline uint64_t tu_collide_all(uint64_t key, uint64_t parent, const int32_t *tokens, int n) {
    (void)key; (void)parent; (void)tokens; (void)n;
    return 42;
}

/* Fingerprint of the exact prefix t[0, n) (FNV-1a, independent of the
 * pool's hash): what a fake KV slot holds for the position it was computed at. */
static inline uint64_t tu_prefix_fp(const int32_t *t, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)t[i]) * 0x100000001b3ull;
    return (h ^ (uint64_t)n) * 0x100000001b3ull;
}

/* Ignores the parent: equal blocks anywhere in any prompt collide. */
static inline uint64_t tu_collide_tokens_only(uint64_t key, uint64_t parent, const int32_t *tokens, int n) {
    (void)key; (void)parent;
    return tu_prefix_fp(tokens, n) | 1;
}
#endif
