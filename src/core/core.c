/* core.c — errors table, logging, file mapping, clocks, RNG. */
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *kvllm_strerror(int err) {
    switch (err) {
#define KVLLM_X_(name, code, msg) case code: return msg;
        KVLLM_ERRORS(KVLLM_X_)
#undef KVLLM_X_
    }
    return "unknown error";
}

void core_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "kvllm: internal error: assertion '%s' failed at %s:%d\n", expr, file, line);
    abort();
}

/* ---- logging ---- */

static kvllm_log_fn g_log_fn;
static void *g_log_user;
static enum kvllm_log_level g_log_level = KVLLM_LOG_INFO;

void kvllm_log_set(kvllm_log_fn fn, void *user) { g_log_fn = fn; g_log_user = user; }
void kvllm_log_set_level(enum kvllm_log_level lvl) { g_log_level = lvl; }

void log_msg(enum kvllm_log_level level, const char *fmt, ...) {
    if (level > g_log_level) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (g_log_fn) { g_log_fn(level, buf, g_log_user); return; }
    static const char *tag[] = { "error: ", "warning: ", "", "debug: " };
    fprintf(stderr, "kvllm: %s%s\n", tag[level], buf);
}

/* ---- files ---- */

int file_map_open(struct file_map *m, const char *path) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { LOG_ERR("%s: cannot open: %s", path, strerror(errno)); return KVLLM_EIO; }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        LOG_ERR("%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return KVLLM_EIO;
    }
    if (!S_ISREG(st.st_mode)) {
        LOG_ERR("%s: not a regular file", path);
        close(fd);
        return KVLLM_EIO;
    }
    if (st.st_size == 0) { close(fd); return 0; }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) { LOG_ERR("%s: mmap failed: %s", path, strerror(errno)); return KVLLM_EIO; }
    m->data = p;
    m->size = (size_t)st.st_size;
    return 0;
}

void file_map_close(struct file_map *m) {
    if (m && m->data) munmap((void *)m->data, m->size);
    if (m) memset(m, 0, sizeof *m);
}

/* ---- machine ---- */

double time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t mem_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024u;
}

int cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

/* ---- rng ---- */

void rng_seed(struct rng *r, uint64_t seed) {
    /* splitmix64 so that nearby seeds give unrelated streams */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    r->s = (z ^ (z >> 31)) | 1u;
}

uint64_t rng_u64(struct rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

float rng_f32(struct rng *r) { return (float)(rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) LOG_ERR("out of memory allocating %zu bytes", n);
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) LOG_ERR("out of memory allocating %zu x %zu bytes", n, size);
    return p;
}
