/* io_util.h — the file and log helpers of the C unit tests: reading a whole
 * file, paths under the test data dir, id lists, and a log sink that keeps
 * what the library said.  One definition of each, like num_util.h. */
#ifndef KVLLM_IO_UTIL_H
#define KVLLM_IO_UTIL_H
#include "check.h"
#include "kvllm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The whole file, NUL-terminated (malloc'd; NULL when it cannot be read or
 * memory runs out); *len is its size when len is not NULL. */
static inline char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap + 1);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n < cap) continue;
        char *b = realloc(buf, (cap *= 2) + 1);
        if (!b) free(buf);
        buf = b;
    }
    const int bad = ferror(f);
    fclose(f);
    if (buf && bad) { free(buf); buf = NULL; }
    if (buf) buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* out = <test data dir>/rel (tests/data, or KVLLM_SHARED: check.h). */
static inline void tu_shared_path(char *out, size_t cap, const char *rel) {
    snprintf(out, cap, "%s/%s", check_shared_dir(), rel);
}

/* Space-separated ids; returns the count (at most cap). */
static inline int tu_parse_ids(const char *s, int32_t *ids, int cap) {
    int n = 0;
    char *end;
    for (;;) {
        long v = strtol(s, &end, 10);
        if (end == s || n == cap) return n;
        ids[n++] = (int32_t)v;
        s = end;
    }
}

/* What the library logged since the last tu_log_reset(), through the sink
 * tu_log_capture (kvllm_log_set(tu_log_capture, NULL)): the last line of any
 * level, the last error line, and their counts.  Not thread-safe: the tests
 * that use it log from one thread. */
static struct tu_log {
    char last[1024], last_error[1024];
    int n, n_errors;
} tu_log __attribute__((unused));

static inline void tu_log_capture(enum kvllm_log_level level, const char *msg, void *user) {
    (void)user;
    tu_log.n++;
    snprintf(tu_log.last, sizeof tu_log.last, "%s", msg);
    if (level != KVLLM_LOG_ERROR) return;
    tu_log.n_errors++;
    snprintf(tu_log.last_error, sizeof tu_log.last_error, "%s", msg);
}

static inline void tu_log_reset(void) {
    tu_log.n = tu_log.n_errors = 0;
    tu_log.last[0] = tu_log.last_error[0] = 0;
}
#endif
