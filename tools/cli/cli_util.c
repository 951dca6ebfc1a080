/* cli_util.c — option parsing helpers shared by the subcommands. */
#include "cli.h"
#include "cli_opts.h"
#include "hub.h"
#include "kvllm.h"

#include <errno.h>
#include <math.h>
#include <sys/stat.h>
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

static const char *file_kind(mode_t m) {
    return S_ISDIR(m) ? "a folder" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : S_ISREG(m) ? "a regular file" : "not a regular file";
}

int cli_out_kind_check(const char *cmd, const char *out, bool folder) {
    struct stat st;
    if (stat(out, &st) != 0) return 0;   /* absent: made; unreadable: the writer says why */
    if (folder ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode)) return 0;
    cli_error("%s: the output %s is %s; write to a %s or to a path that does not exist yet", cmd, out,
              file_kind(st.st_mode), folder ? "folder" : "regular file");
    return 1;
}

bool cli_is_help(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help"); }

/* "--name=value" being parsed: argv's entry cut at '=' (g_eq_name) and the value, until taken */
static const char *g_eq_name, *g_eq_value;

const char *cli_opt_value(void) {
    const char *v = g_eq_value;
    g_eq_value = NULL;
    return v;
}

const char *cli_arg(int argc, char **argv, int *i) {
    if (g_eq_value) return cli_opt_value();
    if (*i + 1 >= argc) { cli_error("option %s needs a value", argv[*i]); return NULL; }
    return argv[++*i];
}

bool cli_opt_end(void) {
    if (!g_eq_value) return true;
    cli_error("option %s takes no value (given '%s')", g_eq_name, cli_opt_value());
    return false;
}

bool cli_opt_split(char **argv, int i) {
    if (!cli_opt_end()) return false;
    char *a = argv[i], *eq;
    /* only long options: a short one's value never holds '=' glued on, and values are never split */
    if (a[0] != '-' || a[1] != '-' || !(eq = strchr(a, '='))) return true;
    *eq = 0;
    g_eq_name = a;
    g_eq_value = eq + 1;
    return true;
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

enum {
    E_KV_MEM = 1, E_KV_TOKENS, E_KV_TYPE, E_BLOCK_SIZE, E_MAX_SEQS, E_MAX_BATCH_TOKENS, E_NO_PREFIX_CACHE, E_KV_FULL, E_ASYNC, E_NO_ASYNC,
    E_ENFORCE_EAGER, E_SPEC_NGRAM, E_DRAFT_MODEL, E_SPEC_TOKENS, E_SPEC_NGRAM_MAX,
};

static const struct cli_opt k_engine_opts[] = {
    { E_KV_MEM, "--kv-mem", "SIZE", CLI_VALUE, "KV pool size in bytes (K/M/G suffixes)" },
    { E_KV_TOKENS, "--kv-tokens", "N", CLI_VALUE,
      "KV pool size in token positions\n(default: --max-seqs full contexts, capped at half the free RAM)" },
    { E_KV_TYPE, "--kv-type", "T", CLI_VALUE, "f32, f16 (default), bf16, int8, fp8" },
    { E_BLOCK_SIZE, "--block-size", "N", CLI_VALUE, "positions per KV block (default 16)" },
    { E_MAX_SEQS, "--max-seqs", "N", CLI_VALUE, "sequences running at once (default 32)" },
    { E_MAX_BATCH_TOKENS, "--max-batch-tokens", "N", CLI_VALUE, "tokens computed per step (default 512)" },
    { E_NO_PREFIX_CACHE, "--no-prefix-cache", NULL, CLI_FLAG, "do not reuse cached blocks of identical prompt prefixes" },
    { E_KV_FULL, "--kv-full", NULL, CLI_FLAG,
      "sliding-window layers keep whole contexts too (a full cache, for comparisons)" },
    { E_ASYNC, "--async-scheduling", NULL, CLI_FLAG,
      "plan each step while the previous one runs (same tokens; default: on CUDA only)" },
    { E_NO_ASYNC, "--no-async-scheduling", NULL, CLI_FLAG, "plan each step after the previous one finished" },
    { E_ENFORCE_EAGER, "--enforce-eager", NULL, CLI_FLAG,
      "issue every op of a step directly instead of replaying the step's recorded\nop list (a CUDA graph on the GPU); same output (vLLM's flag)" },
};

static const struct cli_opt k_spec_opts[] = {
    { E_SPEC_NGRAM, "--spec-ngram, --prompt-lookup", NULL, CLI_FLAG,
      "prompt lookup: drafts copied from the sequence's own context" },
    { E_DRAFT_MODEL, "--draft-model, -md, --model-draft", "FILE", CLI_VALUE, "a draft model of the same vocabulary" },
    { E_SPEC_TOKENS, "--spec-tokens, --draft-max", "N", CLI_VALUE,
      "drafts per step and sequence (default 5); alone: prompt lookup" },
    { E_SPEC_NGRAM_MAX, "--spec-ngram-max", "N", CLI_VALUE, "longest n-gram prompt lookup matches (default 3)" },
};

const struct cli_opt_group cli_engine_group = CLI_GROUP("engine (KV cache and batching)", k_engine_opts);
const struct cli_opt_group cli_spec_group =
    CLI_GROUP("speculative decoding (output identical token for token; only the speed changes)", k_spec_opts);
const struct cli_opt_group *const cli_engine_groups[2] = { &cli_engine_group, &cli_spec_group };

const char *cli_engine_usage_text(void) {
    static char *text;   /* made once, kept for the process's life (reachable: no leak) */
    if (!text) text = cli_opts_usage_text(cli_engine_groups, 2);
    return text ? text : "";
}

/* --draft-model's path, loaded by cli_spec_setup */
static const char *g_draft_path;

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
    const struct cli_opt *o;
    const char *v;
    long l;
    int m = cli_opts_match(argc, argv, i, cli_engine_groups, 2, &o, &v);
    if (m <= 0) return m;
    switch (o->id) {
    case E_NO_PREFIX_CACHE: p->prefix_caching = false; break;
    case E_KV_FULL: p->kv_full = true; break;
    case E_ASYNC: p->async_scheduling = KVLLM_ASYNC_ON; break;
    case E_NO_ASYNC: p->async_scheduling = KVLLM_ASYNC_OFF; break;
    case E_ENFORCE_EAGER: p->enforce_eager = true; break;
    case E_SPEC_NGRAM: p->spec = KVLLM_SPEC_NGRAM; break;
    case E_DRAFT_MODEL: g_draft_path = v; p->spec = KVLLM_SPEC_DRAFT; break;
    case E_SPEC_TOKENS: if (!cli_int("--spec-tokens", v, 1, 64, &l)) return -1; p->spec_tokens = (int)l; break;
    case E_SPEC_NGRAM_MAX: if (!cli_int("--spec-ngram-max", v, 1, 64, &l)) return -1; p->spec_ngram_max = (int)l; break;
    case E_KV_MEM:
        if (!parse_size(v, &p->kv_mem) || !p->kv_mem) { cli_error("--kv-mem: '%s' is not a size (e.g. 512M, 2G)", v); return -1; }
        break;
    case E_KV_TYPE: p->kv_type = v; break;
    case E_KV_TOKENS: if (!cli_int("--kv-tokens", v, 1, 1L << 30, &l)) return -1; p->kv_tokens = (int)l; break;
    case E_BLOCK_SIZE: if (!cli_int("--block-size", v, 1, 4096, &l)) return -1; p->block_size = (int)l; break;
    case E_MAX_SEQS: if (!cli_int("--max-seqs", v, 1, 1 << 20, &l)) return -1; p->max_seqs = (int)l; break;
    case E_MAX_BATCH_TOKENS: if (!cli_int("--max-batch-tokens", v, 1, 1 << 20, &l)) return -1; p->max_batch_tokens = (int)l; break;
    }
    return 1;
}

int cli_spec_setup(struct kvllm_engine_params *p, int n_threads) {
    if (p->spec == KVLLM_SPEC_NONE && p->spec_tokens > 0) p->spec = KVLLM_SPEC_NGRAM;
    if (p->spec != KVLLM_SPEC_DRAFT || p->draft_model) return 0;
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.n_threads = n_threads;
    return cli_model_open(g_draft_path, &mp, &p->draft_model) ? 1 : 0;
}

void cli_spec_report(struct kvllm_engine *e, const struct kvllm_engine_params *p) {
    if (p->spec == KVLLM_SPEC_NONE) return;
    struct kvllm_engine_stats st;
    kvllm_engine_get_stats(e, &st);
    fprintf(stderr, "kvllm: speculation (%s): %llu of %llu drafts accepted (%.1f %%) in %llu verifications, "
                    "%.2f tokens per sequence-step\n",
            p->spec == KVLLM_SPEC_DRAFT ? "draft model" : "prompt lookup", (unsigned long long)st.spec_accepted,
            (unsigned long long)st.spec_drafted, st.spec_drafted ? 100.0 * st.spec_accepted / st.spec_drafted : 0.0,
            (unsigned long long)st.spec_verifies,
            st.spec_verifies ? 1.0 + (double)st.spec_accepted / st.spec_verifies : 1.0);
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

enum { S_TEMP = 1, S_TOP_K, S_TOP_P, S_MIN_P, S_REPEAT_PENALTY, S_SEED };

static const struct cli_opt k_sampling_opts[] = {
    { S_TEMP, "--temp", "T", CLI_VALUE, "temperature, 0 = greedy (default 0.8)" },
    { S_TOP_K, "--top-k", "K", CLI_VALUE, "(default 40, 0 = off)" },
    { S_TOP_P, "--top-p", "P", CLI_VALUE, "(default 0.95, 1 = off)" },
    { S_MIN_P, "--min-p", "P", CLI_VALUE, "(default 0.05, 0 = off)" },
    { S_REPEAT_PENALTY, "--repeat-penalty", "R", CLI_VALUE, "(default 1.0 = off)" },
    { S_SEED, "--seed", "S", CLI_VALUE, "RNG seed (default: from the clock)" },
};

const struct cli_opt_group cli_sampling_group = CLI_GROUP("sampling", k_sampling_opts);

int cli_sampling_opt(int argc, char **argv, int *i, struct kvllm_sampling_params *sp, bool *seed_set) {
    const struct cli_opt *o;
    const char *v;
    int m = cli_opts_match(argc, argv, i, (const struct cli_opt_group *const[]){ &cli_sampling_group }, 1, &o, &v);
    if (m <= 0) return m;
    long l;
    double d;
    switch (o->id) {
    case S_TEMP: if (!cli_float("--temp", v, 0, 100, &d)) return -1; sp->temperature = (float)d; break;
    case S_TOP_K: if (!cli_int("--top-k", v, 0, 1 << 30, &l)) return -1; sp->top_k = (int)l; break;
    case S_TOP_P: if (!cli_float("--top-p", v, 0, 1, &d)) return -1; sp->top_p = (float)d; break;
    case S_MIN_P: if (!cli_float("--min-p", v, 0, 1, &d)) return -1; sp->min_p = (float)d; break;
    case S_REPEAT_PENALTY: if (!cli_float("--repeat-penalty", v, 0.01, 100, &d)) return -1; sp->repeat_penalty = (float)d; break;
    case S_SEED: {
        char *e;
        errno = 0;
        sp->seed = strtoull(v, &e, 10);
        if (errno || *e || e == v || *v == '-') { cli_error("--seed: '%s' is not an unsigned integer", v); return -1; }
        if (seed_set) *seed_set = true;
        break;
    }
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

/* ---- what llama.cpp and vLLM users type ---- */

/* Levenshtein distance of a and b (both short option names). */
static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63) return 99;
    int row[64];
    for (size_t j = 0; j <= m; j++) row[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[m];
}

/* The closest option named in `text` (a usage text: options are the words
 * that start with '-' after a space, a comma or a line start). */
static void closest_in(const char *text, const char *arg, int *best, char *out, size_t cap) {
    for (const char *p = text; p && *p; p++) {
        if (*p != '-' || (p > text && p[-1] != ' ' && p[-1] != '\n' && p[-1] != ',' && p[-1] != '[')) continue;
        size_t n = strspn(p, "-abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789");
        if (n < 2 || p[1] == ' ' || n >= 64) { p += n ? n - 1 : 0; continue; }
        char name[64];
        memcpy(name, p, n);
        name[n] = 0;
        int d = edit_distance(arg, name);
        if (d < *best) { *best = d; snprintf(out, cap, "%s", name); }
        p += n - 1;
    }
}

void cli_unknown(const char *cmd, const char *arg, const char *usage, const char *more) {
    char name[64] = "", opt[64];
    snprintf(opt, sizeof opt, "%s", arg);
    char *eq = strchr(opt, '=');
    if (eq) *eq = 0;
    int best = 99;
    closest_in(usage, opt, &best, name, sizeof name);
    closest_in(more, opt, &best, name, sizeof name);
    /* close enough to be a typo: a third of the name, at least 2 edits */
    int limit = (int)strlen(opt) / 3 > 2 ? (int)strlen(opt) / 3 : 2;
    if (opt[0] == '-' && best <= limit)
        cli_error("%s: unknown option '%s' (did you mean %s? see kvllm %s --help)", cmd, arg, name, cmd);
    else if (opt[0] == '-')
        cli_error("%s: unknown option '%s' (see kvllm %s --help)", cmd, arg, cmd);
    else
        cli_error("%s: unexpected argument '%s' (see kvllm %s --help)", cmd, arg, cmd);
}

/* Options of llama.cpp and vLLM that only matter with a GPU: taken with a one-line note. */
enum {
    G_NGL = 1, G_MAIN_GPU, G_SPLIT_MODE, G_TENSOR_SPLIT, G_FLASH_ATTN, G_NO_KV_OFFLOAD, G_DEVICE, G_GPU_MEM, G_TP,
    G_EAGER, G_MLOCK, G_NO_MMAP,
};

static const struct cli_opt k_gpu_opts[] = {
    { G_NGL, "-ngl, --n-gpu-layers, --gpu-layers", "N", CLI_VALUE, "layers placed on the GPU (llama.cpp)" },
    { G_MAIN_GPU, "-mg, --main-gpu", "N", CLI_VALUE,
      "the GPU for the whole model (llama.cpp): CUDA device N\n(KVLLM_CUDA_DEVICE; with -dev cuda or KVLLM_BACKEND=cuda)" },
    { G_SPLIT_MODE, "-sm, --split-mode", "MODE", CLI_VALUE, "how layers split across GPUs (llama.cpp)" },
    { G_TENSOR_SPLIT, "-ts, --tensor-split", "LIST", CLI_VALUE, "each GPU's share (llama.cpp)" },
    { G_FLASH_ATTN, "-fa, --flash-attn", "[on|off|auto|1|0]", CLI_OPTIONAL,
      "flash attention (llama.cpp; llama-bench's lists such as 0,1 too):\nattention is always fused here" },
    { G_NO_KV_OFFLOAD, "--no-kv-offload, -nkvo", NULL, CLI_FLAG, "keep the KV cache off the GPU (llama.cpp)" },
    { G_DEVICE, "-dev, --device", "DEV", CLI_VALUE,
      "the device the model runs on (llama.cpp's CUDA0, none; vLLM's cuda, cpu):\n"
      "none or cpu, cuda, CUDA<N> or cuda:<N>; one device (KVLLM_BACKEND=cuda\nand KVLLM_CUDA_DEVICE)" },
    { G_GPU_MEM, "--gpu-memory-utilization", "F", CLI_VALUE,
      "share of GPU memory to take (vLLM); the KV pool is sized by --kv-mem / --kv-tokens" },
    { G_TP, "-tp, --tensor-parallel-size", "N", CLI_VALUE, "GPUs to split the model over (vLLM)" },
    { G_EAGER, "--enforce-eager", NULL, CLI_FLAG, "no CUDA graphs (vLLM)" },
    { G_MLOCK, "--mlock", NULL, CLI_FLAG, "keep the weights in RAM (llama.cpp): the CPU backend always maps them" },
    { G_NO_MMAP, "--no-mmap", NULL, CLI_FLAG, "read the weights instead of mapping them (llama.cpp): always mapped" },
};

const struct cli_opt_group cli_gpu_group = CLI_GROUP(
    "accepted for llama.cpp / vLLM habits: -dev and -mg choose the device (the CUDA backend only in a\n"
    "-DKVLLM_CUDA=ON build; kvllm --version says which); the others change nothing and say so in a one-line note",
    k_gpu_opts);

/* Why a GPU placement option changes nothing, for this build. */
static const char *gpu_why(void) {
    struct kvllm_build_info b;
    kvllm_build_info(&b);
    return b.cuda_built ? "this build has the CUDA backend, which -dev cuda (KVLLM_BACKEND=cuda) selects for the whole "
                          "model (no per-layer or multi-device placement)"
                        : "this build has no GPU backend (CPU only; configure with -DKVLLM_CUDA=ON for CUDA)";
}

int cli_gpu_opt(int argc, char **argv, int *i) {
    const struct cli_opt_group *const g[] = { &cli_gpu_group };
    const char *a = argv[*i], *eq = strchr(a, '='), *v;
    const struct cli_opt *o;
    int n = (int)strlen(a);
    /* a short spelling with its value glued on, "-ngl=99" (cli_opt_split cuts only long ones) */
    if (a[0] == '-' && a[1] != '-' && eq && (o = cli_opts_find(g, 1, a, (size_t)(eq - a)))) {
        n = (int)(eq - a);
        v = eq + 1;
    } else {
        int m = cli_opts_match(argc, argv, i, g, 1, &o, &v);
        if (m <= 0) return m;
    }
    /* -fa's separate value: llama-cli's on|off|auto, llama-bench's 0|1 (or a list of them: 0,1) */
    if (!v && o->kind == CLI_OPTIONAL && *i + 1 < argc &&
        (!strcmp(argv[*i + 1], "on") || !strcmp(argv[*i + 1], "off") || !strcmp(argv[*i + 1], "auto") ||
         (argv[*i + 1][0] && strspn(argv[*i + 1], "01,") == strlen(argv[*i + 1]))))
        v = argv[++*i];
    if (o->id == G_DEVICE || o->id == G_MAIN_GPU) {
        char opt[64];
        snprintf(opt, sizeof opt, "%.*s", n, a);
        return (o->id == G_DEVICE ? cli_device_flag(opt, v) : cli_main_gpu_flag(opt, v)) ? -1 : 1;
    }
    const char *why = o->id == G_MLOCK || o->id == G_NO_MMAP ? "the CPU backend always maps the weights"
                    : o->id == G_FLASH_ATTN ? "attention is always fused (paged, online softmax)"
                    : gpu_why();
    fprintf(stderr, "kvllm: note: %.*s%s%s ignored: %s\n", n, a, v ? " " : "", v ? v : "", why);
    return 1;
}

#ifndef KVLLM_VERSION
#define KVLLM_VERSION "0.0.0"
#endif
#ifndef KVLLM_COMMIT
#define KVLLM_COMMIT "unknown"
#endif

const char *cli_version_string(void) { return KVLLM_VERSION; }
const char *cli_commit_string(void) { return KVLLM_COMMIT; }

void cli_print_version(FILE *f) {
    struct kvllm_build_info b;
    kvllm_build_info(&b);
    fprintf(f, "kvllm %s (commit %s)\n", KVLLM_VERSION, KVLLM_COMMIT);
    fprintf(f, "kernels: %s (this CPU: %s; default %s)\n", b.cpu_kernels_built, b.cpu_kernels_here,
            b.cpu_kernels_default);
    fprintf(f, "GPU: %s\n", b.cuda_built ? "CUDA backend built (-dev cuda or KVLLM_BACKEND=cuda)"
                                         : "none (CPU-only build; -DKVLLM_CUDA=ON adds the CUDA backend)");
    fprintf(f, "tensor parallelism: %s\n", kvllm_tp_mpi_built() ? "MPI (mpirun -np N kvllm ...; docs/TP.md)"
                                                                : "none (built without MPI: apt-get install libopenmpi-dev)");
}

/* ---- text given inline or by file; chat templates by name ---- */

static char *read_nul_free(const char *opt, const char *path) {
    size_t n;
    char *buf = cli_read_file(path, &n);
    if (buf && strlen(buf) != n) { cli_error("%s %s: contains a NUL byte", opt, path); free(buf); return NULL; }
    return buf;
}

static bool is_file(const char *path) {
    struct stat st;
    return !stat(path, &st) && S_ISREG(st.st_mode);
}

char *cli_text_arg(const char *opt, const char *value, bool file) {
    if (file || is_file(value)) return read_nul_free(opt, value);
    char *s = strdup(value);
    if (!s) cli_error("%s: out of memory", opt);
    return s;
}

/* llama.cpp's built-in templates that kvllm has, written as Jinja that renders what llama.cpp's
 * llm_chat_apply_template writes for them (no BOS: the vocabulary's add_bos adds it, as there). */
static const struct { const char *name, *jinja; } k_chat_templates[] = {
    { "chatml",
      "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}" },
    { "llama3",
      "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + (m['content'] | trim)"
      " + '<|eot_id|>' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}" },
    { "gemma",   /* system text goes before the next user turn's */
      "{% set ns = namespace(sys='') %}{% for m in messages %}{% if m['role'] == 'system' %}"
      "{% set ns.sys = ns.sys + (m['content'] | trim) %}{% else %}"
      "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}{{ '<start_of_turn>' + role + '\\n' }}"
      "{% if ns.sys and role != 'model' %}{{ ns.sys + '\\n\\n' }}{% set ns.sys = '' %}{% endif %}"
      "{{ (m['content'] | trim) + '<end_of_turn>\\n' }}{% endif %}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}" },
    { "phi3",
      "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}" },
    { "zephyr",
      "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|endoftext|>\\n' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}" },
};

const char *const cli_chat_template_names = "chatml, llama3, gemma, phi3, zephyr";

/* llama.cpp's other built-in names (llama-chat.cpp), refused by name rather than read as a file */
static const char *const k_llamacpp_templates[] = {
    "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1", "mistral-v3", "mistral-v3-tekken",
    "mistral-v7", "mistral-v7-tekken", "phi4", "falcon3", "monarch", "orion", "openchat", "vicuna", "vicuna-orca",
    "deepseek", "deepseek2", "deepseek3", "command-r", "chatglm3", "chatglm4", "glmedge", "minicpm", "exaone3",
    "exaone4", "rwkv-world", "granite", "gigachat", "megrez", "yandex", "bailing", "bailing-think", "bailing2",
    "llama4", "smolvlm", "hunyuan-moe", "hunyuan-dense", "gpt-oss", "kimi-k2", "seed_oss", "grok-2",
    "pangu-embedded",
};

char *cli_chat_template(const char *opt, const char *value, bool file) {
    if (file) return read_nul_free(opt, value);
    for (size_t k = 0; k < sizeof k_chat_templates / sizeof *k_chat_templates; k++)
        if (!strcmp(value, k_chat_templates[k].name)) return cli_text_arg(opt, k_chat_templates[k].jinja, false);
    for (size_t k = 0; k < sizeof k_llamacpp_templates / sizeof *k_llamacpp_templates; k++)
        if (!strcmp(value, k_llamacpp_templates[k])) {
            cli_error("%s %s: llama.cpp's built-in '%s' is not one kvllm has (it has %s); give the model's Jinja "
                      "template with --chat-template-file FILE", opt, value, value, cli_chat_template_names);
            return NULL;
        }
    if (strstr(value, "{{") || strstr(value, "{%")) return cli_text_arg(opt, value, false);
    if (is_file(value)) return read_nul_free(opt, value);   /* kvllm's older habit: a path */
    cli_error("%s '%s': not a built-in template name (%s), Jinja text, or a file; --chat-template-file FILE "
              "reads a file", opt, value, cli_chat_template_names);
    return NULL;
}

/* ---- models by name ---- */

enum { H_REPO = 1, H_FILE, H_TOKEN };

static const struct cli_opt k_hf_opts[] = {
    { H_REPO, "-hf, -hfr, --hf-repo", "REPO[:QUANT]", CLI_VALUE,
      "a Hugging Face repository (owner/name); QUANT picks its .gguf (default\nQ4_K_M, else Q8_0, else the first); "
      "a repository without .gguf gives its folder" },
    { H_FILE, "-hff, --hf-file", "FILE", CLI_VALUE, "the repository's file to use (instead of QUANT)" },
    { H_TOKEN, "-hft, --hf-token", "TOKEN", CLI_VALUE, "the hub's token (default: $HF_TOKEN)" },
};

const struct cli_opt_group cli_hf_group =
    CLI_GROUP("models by name (downloaded into the Hugging Face cache: $HF_HOME/hub; HF_ENDPOINT, HF_TOKEN honoured)",
              k_hf_opts);

int cli_hf_opt(int argc, char **argv, int *i, struct cli_hf *hf) {
    const struct cli_opt *o;
    const char *v;
    int m = cli_opts_match(argc, argv, i, (const struct cli_opt_group *const[]){ &cli_hf_group }, 1, &o, &v);
    if (m <= 0) return m;
    *(o->id == H_REPO ? &hf->repo : o->id == H_FILE ? &hf->file : &hf->token) = v;
    return 1;
}

int cli_hf_model(struct cli_hf *hf, const char **model, bool allow_name, bool prefer_folder) {
    const char *repo = hf->repo;
    if (!repo && allow_name && *model && hub_is_repo_name(*model)) repo = *model;
    if (!repo) {
        if (hf->file) { cli_error("--hf-file needs the repository: -hf REPO"); return 1; }
        return 0;
    }
    if (hf->repo && *model) { cli_error("give the model with -m or -hf, not both"); return 1; }
    if (hub_model_path(repo, hf->file, hf->token, prefer_folder ? HUB_PREFER_FOLDER : HUB_PREFER_GGUF, &hf->path))
        return 1;
    *model = hf->path;
    return 0;
}

void cli_hf_free(struct cli_hf *hf) {
    free(hf->path);
    hf->path = NULL;
}
