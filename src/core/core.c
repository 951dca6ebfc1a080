/* core.c — errors table, logging, file mapping, clocks, RNG, output files. */
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
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

static _Thread_local struct log_capture *t_capture;

void log_capture_begin(struct log_capture *c, char *buf, size_t cap) {
    *c = (struct log_capture){ .buf = buf, .cap = buf ? cap : 0, .prev = t_capture };
    if (c->cap) buf[0] = 0;
    t_capture = c;
}

void log_capture_end(struct log_capture *c) { t_capture = c->prev; }

void log_msg(enum kvllm_log_level level, const char *fmt, ...) {
    struct log_capture *c = level == KVLLM_LOG_ERROR ? t_capture : NULL;
    if (level > g_log_level && !c) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (c && !c->got && c->cap) {
        snprintf(c->buf, c->cap, "%s", buf);
        c->got = true;
    }
    if (level > g_log_level) return;
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

/* ---- output files written whole or not at all ---- */

int os_random_bytes(void *buf, size_t n) {
    uint8_t *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom(p + got, n - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
    if (got == n) return 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        got = 0;
        while (got < n) {
            ssize_t k = read(fd, p + got, n - got);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break;
            got += (size_t)k;
        }
        close(fd);
        if (got == n) return 0;
    }
    LOG_ERR("%s: neither getrandom nor /dev/urandom gave %zu random bytes", __func__, n);
    return KVLLM_EIO;
}

static char *str_dup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = xmalloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* The directory part of path ("." when there is none), as a new string. */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return str_dup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *d = xmalloc(n + 1);
    if (d) { memcpy(d, path, n); d[n] = 0; }
    return d;
}

int out_file_open(struct out_file *o, const char *path) {
    memset(o, 0, sizeof *o);
    /* a symbolic link stays one: the file it points to is what gets replaced */
    struct stat lst;
    char *real = lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode) ? realpath(path, NULL) : NULL;
    o->path = real ? real : str_dup(path);
    if (!o->path) return KVLLM_ENOMEM;
    path = o->path;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base) { LOG_ERR("%s: not a file name", path); out_file_abort(o); return KVLLM_EIO; }
    size_t dn = (size_t)(base - path), cap = strlen(path) + 32;
    o->tmp = xmalloc(cap);
    if (!o->tmp) { out_file_abort(o); return KVLLM_ENOMEM; }
    /* the existing target's permission bits, or those fopen would give (umask applies) */
    struct stat st;
    bool keep_mode = stat(path, &st) == 0 && S_ISREG(st.st_mode);
    uint64_t r = 0;
    int fd = -1;
    for (int attempt = 0; fd < 0 && attempt < 16; attempt++) {
        if (os_random_bytes(&r, sizeof r)) r = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull + (uint64_t)attempt;
        snprintf(o->tmp, cap, "%.*s.%s.tmp-%06llx", (int)dn, path, base, (unsigned long long)(r & 0xffffff));
        fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        LOG_ERR("%s: cannot create a temporary file beside it (%s): %s", path, o->tmp, strerror(errno));
        free(o->tmp);
        o->tmp = NULL;
        out_file_abort(o);
        return KVLLM_EIO;
    }
    if (keep_mode) (void)fchmod(fd, st.st_mode & 07777);
    if (!(o->f = fdopen(fd, "wb"))) {
        LOG_ERR("%s: cannot open: %s", o->tmp, strerror(errno));
        close(fd);
        out_file_abort(o);
        return KVLLM_EIO;
    }
    return 0;
}

int out_file_finish(struct out_file *o) {
    if (!o->f) return o->tmp ? 0 : KVLLM_EIO;
    FILE *f = o->f;
    o->f = NULL;
    int err = 0;
    if (ferror(f)) err = EIO;
    if (fflush(f) != 0 && !err) err = errno;
    if (fsync(fileno(f)) != 0 && !err) err = errno;
    if (fclose(f) != 0 && !err) err = errno;
    if (!err) return 0;
    LOG_ERR("%s: write failed: %s", o->path, strerror(err));
    out_file_abort(o);
    return KVLLM_EIO;
}

int out_file_commit(struct out_file *o) {
    int rc = out_file_finish(o);
    if (rc) { out_file_abort(o); return rc; }
    if (rename(o->tmp, o->path) != 0) {
        LOG_ERR("%s: cannot rename %s into place: %s", o->path, o->tmp, strerror(errno));
        out_file_abort(o);
        return KVLLM_EIO;
    }
    free(o->tmp);
    o->tmp = NULL; /* in place: nothing left to remove */
    char *dir = dir_of(o->path);
    int dfd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) { (void)fsync(dfd); close(dfd); } /* durable rename; best effort */
    free(dir);
    out_file_abort(o);
    return 0;
}

void out_file_abort(struct out_file *o) {
    if (!o) return;
    if (o->f) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->path);
    memset(o, 0, sizeof *o);
}

int out_file_write_all(const char *path, const void *data, size_t n) {
    struct out_file o;
    int rc = out_file_open(&o, path);
    if (rc) return rc;
    if (n && fwrite(data, 1, n, o.f) != n) {
        LOG_ERR("%s: write failed: %s", path, strerror(errno));
        out_file_abort(&o);
        return KVLLM_EIO;
    }
    return out_file_commit(&o);
}

int out_path_check(const char *what, const char *out, const char *in) {
    struct stat so, si;
    if (!out || !in || stat(out, &so) != 0 || stat(in, &si) != 0) return 0;
    if (so.st_dev == si.st_dev && so.st_ino == si.st_ino) {
        LOG_ERR("%s: the output %s is the input %s; write to another path", what, out, in);
        return KVLLM_EINVAL;
    }
    if (!S_ISDIR(so.st_mode)) return 0;
    char *dir = dir_of(in);
    struct stat sd;
    bool inside = dir && stat(dir, &sd) == 0 && sd.st_dev == so.st_dev && sd.st_ino == so.st_ino;
    free(dir);
    if (inside) {
        LOG_ERR("%s: the output folder %s holds the input %s; write to another folder", what, out, in);
        return KVLLM_EINVAL;
    }
    return 0;
}
