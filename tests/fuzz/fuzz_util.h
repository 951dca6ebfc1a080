/* fuzz_util.h — what the libFuzzer targets share: silence the library's
 * log (every rejected input logs a line), write an input to a file in a
 * per-process temporary folder (the readers take paths), and split one
 * input into parts at a separator line so one byte string can carry a
 * template and its messages, or a config.json and a safetensors file. */
#ifndef KVLLM_FUZZ_UTIL_H
#define KVLLM_FUZZ_UTIL_H

#include "kvllm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The line that separates the parts of an input (seed files use it too). */
#define FUZZ_SEP "\n--8<--\n"

static inline void fuzz_log_quiet(enum kvllm_log_level level, const char *msg, void *user) {
    (void)level; (void)msg; (void)user;
}

/* A folder of our own under TMPDIR (or /tmp), made once per process;
 * removed at exit only when empty, which the targets keep it. */
static inline const char *fuzz_dir(void) {
    static char dir[256];
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/kvllm-fuzz-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(dir)) { perror("mkdtemp"); abort(); }
    }
    return dir;
}

/* Write data to fuzz_dir()/name; the full path goes into path (cap bytes). */
static inline void fuzz_write(const char *name, const uint8_t *data, size_t size, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); abort(); }
    if (size && fwrite(data, 1, size, f) != size) { perror(path); abort(); }
    if (fclose(f) != 0) { perror(path); abort(); }
}

static inline void fuzz_unlink(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    unlink(path);
}

/* Split data at the first FUZZ_SEP: part one [data, *n1), part two after
 * the separator (*p2, *n2); without a separator part two is empty. */
static inline void fuzz_split(const uint8_t *data, size_t size, size_t *n1, const uint8_t **p2, size_t *n2) {
    const size_t ls = sizeof FUZZ_SEP - 1;
    const uint8_t *s = size >= ls ? memmem(data, size, FUZZ_SEP, ls) : NULL;
    if (!s) { *n1 = size; *p2 = data + size; *n2 = 0; return; }
    *n1 = (size_t)(s - data);
    *p2 = s + ls;
    *n2 = size - *n1 - ls;
}

/* A NUL-terminated malloc'd copy (the parsers want C strings). */
static inline char *fuzz_strndup(const uint8_t *p, size_t n) {
    char *s = malloc(n + 1);
    if (!s) abort();
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

static inline void fuzz_quiet(void) {
    if (!getenv("KVLLM_FUZZ_LOG")) kvllm_log_set(fuzz_log_quiet, NULL);
}
#endif
