/* cli_util.c — option parsing helpers shared by the subcommands. */
#include "cli.h"
#include "kvllm.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("kvllm: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

bool cli_is_help(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help"); }

const char *cli_arg(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) { cli_error("option %s needs a value", argv[*i]); return NULL; }
    return argv[++*i];
}

bool cli_int(const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        cli_error("%s: '%s' is not an integer in [%ld, %ld]", opt, s, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool cli_float(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || isnan(v) || v < lo || v > hi) {
        cli_error("%s: '%s' is not a number in [%g, %g]", opt, s, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

double cli_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cli_int_list(const char *opt, const char *s, long lo, long hi, long *out, int max) {
    int n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == max) { cli_error("%s: at most %d values", opt, max); return -1; }
        if (!cli_int(opt, tok, lo, hi, &out[n++])) return -1;
    }
    if (!n) { cli_error("%s: empty list", opt); return -1; }
    return n;
}

const char *const cli_engine_usage =
    "engine (KV cache and batching):\n"
    "  --kv-mem SIZE          KV pool size in bytes (K/M/G suffixes)\n"
    "  --kv-tokens N          KV pool size in token positions\n"
    "                         (default: --max-seqs full contexts, capped at half the free RAM)\n"
    "  --kv-type T            f32, f16 (default), bf16, int8, fp8\n"
    "  --block-size N         positions per KV block (default 16)\n"
    "  --max-seqs N           sequences running at once (default 32)\n"
    "  --max-batch-tokens N   tokens computed per step (default 512)\n"
    "  --no-prefix-cache      do not reuse cached blocks of identical prompt prefixes\n";

static bool parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return false;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    default: break;
    }
    if (*end == 'i' && end[1] == 'B') end += 2;
    else if (*end == 'B') end++;
    if (*end || v * mul > 1e15) return false;
    *out = (uint64_t)(v * mul);
    return true;
}

int cli_engine_opt(int argc, char **argv, int *i, struct kvllm_engine_params *p) {
    const char *a = argv[*i], *v;
    long l;
    if (!strcmp(a, "--no-prefix-cache")) { p->prefix_caching = false; return 1; }
    if (strcmp(a, "--kv-mem") && strcmp(a, "--kv-tokens") && strcmp(a, "--kv-type") && strcmp(a, "--block-size") &&
        strcmp(a, "--max-seqs") && strcmp(a, "--max-batch-tokens"))
        return 0;
    if (!(v = cli_arg(argc, argv, i))) return -1;
    if (!strcmp(a, "--kv-mem")) {
        if (!parse_size(v, &p->kv_mem) || !p->kv_mem) { cli_error("--kv-mem: '%s' is not a size (e.g. 512M, 2G)", v); return -1; }
    } else if (!strcmp(a, "--kv-type")) {
        p->kv_type = v;
    } else {
        long hi = !strcmp(a, "--kv-tokens") ? 1L << 30 : !strcmp(a, "--block-size") ? 4096 : 1 << 20;
        if (!cli_int(a, v, 1, hi, &l)) return -1;
        if (!strcmp(a, "--kv-tokens")) p->kv_tokens = (int)l;
        else if (!strcmp(a, "--block-size")) p->block_size = (int)l;
        else if (!strcmp(a, "--max-seqs")) p->max_seqs = (int)l;
        else p->max_batch_tokens = (int)l;
    }
    return 1;
}

bool cli_range(const char *opt, const char *s, long lo, long hi, long *a, long *b) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", s);
    char *colon = strchr(buf, ':');
    if (colon) *colon = 0;
    if (!cli_int(opt, buf, lo, hi, a)) return false;
    if (!colon) { *b = *a; return true; }
    if (!cli_int(opt, colon + 1, *a, hi, b)) return false;
    return true;
}

int cli_sampling_opt(int argc, char **argv, int *i, struct kvllm_sampling_params *sp, bool *seed_set) {
    const char *a = argv[*i], *v;
    if (strcmp(a, "--temp") && strcmp(a, "--top-k") && strcmp(a, "--top-p") && strcmp(a, "--min-p") &&
        strcmp(a, "--repeat-penalty") && strcmp(a, "--seed"))
        return 0;
    if (!(v = cli_arg(argc, argv, i))) return -1;
    long l;
    double d;
    if (!strcmp(a, "--temp")) { if (!cli_float(a, v, 0, 100, &d)) return -1; sp->temperature = (float)d; }
    else if (!strcmp(a, "--top-k")) { if (!cli_int(a, v, 0, 1 << 30, &l)) return -1; sp->top_k = (int)l; }
    else if (!strcmp(a, "--top-p")) { if (!cli_float(a, v, 0, 1, &d)) return -1; sp->top_p = (float)d; }
    else if (!strcmp(a, "--min-p")) { if (!cli_float(a, v, 0, 1, &d)) return -1; sp->min_p = (float)d; }
    else if (!strcmp(a, "--repeat-penalty")) { if (!cli_float(a, v, 0.01, 100, &d)) return -1; sp->repeat_penalty = (float)d; }
    else {
        char *e;
        errno = 0;
        sp->seed = strtoull(v, &e, 10);
        if (errno || *e || e == v || *v == '-') { cli_error("--seed: '%s' is not an unsigned integer", v); return -1; }
        if (seed_set) *seed_set = true;
    }
    return 1;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) { cli_error("%s: cannot open: %s", path, strerror(errno)); return NULL; }
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1) break;
        char *bigger = realloc(buf, cap *= 2);
        if (!bigger) free(buf);
        buf = bigger;
    }
    bool bad = !buf || ferror(f);
    if (f != stdin) fclose(f);
    if (bad) { cli_error("%s: %s", path, buf ? "read error" : "out of memory"); free(buf); return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}
