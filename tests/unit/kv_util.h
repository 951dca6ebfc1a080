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
#endif
