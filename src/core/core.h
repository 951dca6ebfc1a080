/* core.h — small always-available helpers: asserts, checked arithmetic,
 * logging, file mapping, timing.  Depends on libc only. */
#ifndef KVLLM_CORE_H
#define KVLLM_CORE_H

#include "kvllm.h"
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* Always-on invariant check (never compiled out): prints and aborts. */
#define KV_ASSERT(cond)                                                      \
    do { if (!(cond)) core_assert_fail(#cond, __FILE__, __LINE__); } while (0)
_Noreturn void core_assert_fail(const char *expr, const char *file, int line);

/* Overflow-checked arithmetic: return false on overflow. */
static inline bool ckd_add_u64(uint64_t *r, uint64_t a, uint64_t b) { return !__builtin_add_overflow(a, b, r); }
static inline bool ckd_mul_u64(uint64_t *r, uint64_t a, uint64_t b) { return !__builtin_mul_overflow(a, b, r); }

/* Logging: one line, printf-style, routed to the kvllm_log_set() sink. */
void log_msg(enum kvllm_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
#define LOG_ERR(...)  log_msg(KVLLM_LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(...) log_msg(KVLLM_LOG_WARN, __VA_ARGS__)
#define LOG_INFO(...) log_msg(KVLLM_LOG_INFO, __VA_ARGS__)
#define LOG_DBG(...)  log_msg(KVLLM_LOG_DEBUG, __VA_ARGS__)

/* A read-only file mapping.  file_map_open logs and returns KVLLM_EIO on
 * failure, leaving *m zeroed.  An empty file maps to data == NULL, size 0. */
struct file_map {
    const uint8_t *data;
    size_t size;
};
int file_map_open(struct file_map *m, const char *path);
void file_map_close(struct file_map *m);

/* Monotonic seconds. */
double time_now(void);

/* Bytes of memory the machine can give us now (MemAvailable), 0 if unknown. */
uint64_t mem_available_bytes(void);

/* Online CPUs (>= 1). */
int cpu_count(void);

/* Small deterministic RNG (xorshift64*). */
struct rng { uint64_t s; };
void rng_seed(struct rng *r, uint64_t seed);
uint64_t rng_u64(struct rng *r);
float rng_f32(struct rng *r); /* uniform in [0, 1) */

/* 32-bit hash of n bytes (FNV-1a 64, folded) for in-memory hash tables. */
static inline uint32_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return (uint32_t)(h ^ (h >> 32));
}

/* malloc/calloc that log on failure. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);

#endif
