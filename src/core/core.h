/* core.h — small always-available helpers: asserts, checked arithmetic,
 * logging, file mapping, timing.  Depends on libc only. */
#ifndef KVLLM_CORE_H
#define KVLLM_CORE_H

#include "kvllm.h"
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>

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

/* The message of one public call's failure, for its caller (the `err`
 * buffers of kvllm_engine_add_ex, kvllm_chat_opts): between
 * log_capture_begin and log_capture_end on this thread, the first error
 * logged is also copied into buf (cap bytes, NUL-terminated).  Errors are
 * logged once where they are found, deep in the library; this carries that
 * message back up with the status the call returns, as an exception would.
 * Scopes nest (the innermost captures); buf NULL or cap 0: nothing kept. */
struct log_capture {
    char *buf;
    size_t cap;
    bool got;
    struct log_capture *prev;
};
void log_capture_begin(struct log_capture *c, char *buf, size_t cap);
void log_capture_end(struct log_capture *c);

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

/* ---- output files written whole or not at all ---- */

/* An output file that replaces its target only when complete.  The bytes go
 * to a temporary file beside the target (".NAME.tmp-XXXXXX" in the same
 * directory, so the rename is atomic); out_file_commit flushes, fsyncs and
 * renames it over the target, then fsyncs the directory.  Until then the
 * target is untouched: a full disk, an error or a process killed midway
 * leaves the old file as it was (a killed process cannot remove its
 * temporary file; every error path here does).  A target that already
 * exists keeps its permission bits; a new one gets 0666 & ~umask, as fopen
 * would give it; a target that is a symbolic link stays one (the file it
 * points to is replaced).  Not for paths that are not regular files
 * (devices, "-"). */
struct out_file {
    FILE *f;     /* write here; NULL once finished or aborted */
    char *path;  /* the target (owned copy) */
    char *tmp;   /* the temporary file (owned); NULL once renamed or removed */
};

/* Create the temporary file for path.  KVLLM_EIO (logged with the path and
 * errno) or KVLLM_ENOMEM; *o is then zeroed and nothing was created. */
int out_file_open(struct out_file *o, const char *path);

/* Flush, fsync and close the temporary file: complete, not yet in place.
 * KVLLM_EIO (logged) if any write failed (ferror), or flush/fsync/close
 * failed (ENOSPC, EFBIG, EIO); the temporary file is then removed. */
int out_file_finish(struct out_file *o);

/* out_file_finish (if not done), then rename over the target and fsync its
 * directory.  0: the target holds the new bytes.  KVLLM_EIO (logged): the
 * target is unchanged and the temporary file removed.  Either way *o is
 * released (out_file_abort after it is a no-op). */
int out_file_commit(struct out_file *o);

/* Drop the output: close and remove the temporary file, free, zero *o.
 * NULL-safe and idempotent (also on a zeroed struct). */
void out_file_abort(struct out_file *o);

/* out_file_open + one write of n bytes + out_file_commit. */
int out_file_write_all(const char *path, const void *data, size_t n);

/* May out be written while in is being read?  KVLLM_EINVAL, logged as
 * "<what>: OUT is the input", when out names the same file as in (same
 * st_dev and st_ino, links followed) or is a directory that holds in
 * (a writer filling a folder would replace files beside the input).  0 when
 * either does not exist.  what prefixes the message (the command). */
int out_path_check(const char *what, const char *out, const char *in);

/* Fill buf with n bytes from the kernel's CSPRNG (getrandom, or
 * /dev/urandom).  KVLLM_EIO (logged) if neither answers. */
int os_random_bytes(void *buf, size_t n);

#endif
