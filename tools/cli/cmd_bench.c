/* cmd_bench.c — `kvllm bench model`: prompt-processing and generation
 * speed in the style of llama-bench.  Each row is the median (and standard
 * deviation) over --reps repetitions; generation at --depth D means D
 * tokens are already in the context (prefilled untimed) before the timed
 * decode steps, so the cost of attending over a long cache shows. */
#include "cli.h"
#include "kvllm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LIST 16

static const char *k_usage =
    "usage: kvllm bench model -m MODEL[,MODEL...] [options]\n"
    "  --pp N            prompt tokens per prefill test (default 512, 0 = skip)\n"
    "  --tg N            generated tokens per generation test (default 128, 0 = skip)\n"
    "  --threads LIST    thread counts, e.g. 1,2 (default: all CPUs)\n"
    "  --depth LIST      context already filled before each test (default 0)\n"
    "  --reps N          repetitions (default 5)\n"
    "  --no-kv-cache     recompute the prefix at every step (baseline)\n"
    "  -o md|json        output format (default md)\n";

struct bench_opts {
    char models[1024];
    long pp, tg, reps;
    long threads[MAX_LIST], depth[MAX_LIST];
    int n_threads, n_depth;
    bool no_kv, json;
};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Time one test: fill `depth` positions untimed, then either one prefill of
 * n tokens (pp) or n single-token decode steps (tg).  Returns seconds or < 0. */
static double run_once(struct kvllm_model *m, const struct bench_opts *o, long depth, long n, bool gen,
                       unsigned *seed) {
    const struct kvllm_model_desc *d = kvllm_model_describe(m);
    struct kvllm_session_params sp = { .n_ctx = (int)(depth + n + 1), .no_kv_cache = o->no_kv };
    struct kvllm_session *s;
    if (kvllm_session_new(m, &sp, &s)) return -1;
    long total = depth + n;
    int32_t *ids = malloc((size_t)(total > 0 ? total : 1) * sizeof *ids);
    if (!ids) { kvllm_session_free(s); return -1; }
    for (long i = 0; i < total; i++) {
        *seed = *seed * 1103515245u + 12345u;
        ids[i] = (int32_t)((*seed >> 8) % (unsigned)d->n_vocab);
    }
    int rc = depth ? kvllm_session_eval(s, ids, (int)depth, false, NULL) : 0;
    double t0 = cli_time();
    if (!gen) {
        rc = rc ? rc : kvllm_session_eval(s, ids + depth, (int)n, false, NULL);
    } else {
        for (long i = 0; !rc && i < n; i++) rc = kvllm_session_eval(s, ids + depth + i, 1, false, NULL);
    }
    double dt = cli_time() - t0;
    free(ids);
    kvllm_session_free(s);
    return rc ? -1 : dt;
}

static void print_row(const struct bench_opts *o, const char *model, const char *type, long threads, long pp,
                      long tg, long depth, double med, double sd) {
    long n = pp ? pp : tg;
    if (o->json) {
        printf("{\"model\": \"%s\", \"type\": \"%s\", \"threads\": %ld, \"pp\": %ld, \"tg\": %ld, \"depth\": %ld, "
               "\"batch\": 1, \"kv_cache\": %s, \"tokens_per_s_median\": %.3f, \"tokens_per_s_sd\": %.3f, "
               "\"ms_per_token_median\": %.4f}\n",
               model, type, threads, pp, tg, depth, o->no_kv ? "false" : "true", med, sd, 1e3 / med);
    } else {
        char test[32];
        snprintf(test, sizeof test, "%s%ld", pp ? "pp" : "tg", n);
        printf("| %-28s | %-5s | %7ld | %-6s | %5ld | %4s | %12.2f ± %-8.2f | %10.3f |\n", model, type, threads, test,
               depth, o->no_kv ? "off" : "on", med, sd, 1e3 / med);
    }
    fflush(stdout);
}

static int bench_model(const struct bench_opts *o, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (int ti = 0; ti < o->n_threads; ti++) {
        struct kvllm_model_params mp = kvllm_model_default_params();
        mp.n_threads = (int)o->threads[ti];
        struct kvllm_model *m;
        if (kvllm_model_load(path, &mp, &m)) return 1;
        const char *type = kvllm_model_describe(m)->weight_type;
        for (int di = 0; di < o->n_depth; di++) {
            for (int test = 0; test < 2; test++) {
                long n = test == 0 ? o->pp : o->tg;
                if (n <= 0) continue;
                double tps[64];
                unsigned seed = 1234;
                for (long r = 0; r < o->reps; r++) {
                    double dt = run_once(m, o, o->depth[di], n, test == 1, &seed);
                    if (dt < 0) { kvllm_model_free(m); return 1; }
                    tps[r] = (double)n / dt;
                }
                double mean = 0, var = 0;
                for (long r = 0; r < o->reps; r++) mean += tps[r] / (double)o->reps;
                for (long r = 0; r < o->reps; r++) var += (tps[r] - mean) * (tps[r] - mean);
                double sd = o->reps > 1 ? sqrt(var / (double)(o->reps - 1)) : 0;
                qsort(tps, (size_t)o->reps, sizeof *tps, cmp_double);
                double med = o->reps % 2 ? tps[o->reps / 2] : 0.5 * (tps[o->reps / 2 - 1] + tps[o->reps / 2]);
                print_row(o, base, type, mp.n_threads, test == 0 ? n : 0, test == 1 ? n : 0, o->depth[di], med, sd);
            }
        }
        kvllm_model_free(m);
    }
    return 0;
}

static int bench_model_cmd(int argc, char **argv) {
    struct bench_opts o = { .pp = 512, .tg = 128, .reps = 5, .n_threads = 1, .n_depth = 1 };
    o.threads[0] = 0;
    o.depth[0] = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (cli_is_help(a)) { fputs(k_usage, stdout); return 0; }
        if (!strcmp(a, "--no-kv-cache")) { o.no_kv = true; continue; }
        if (!(v = cli_arg(argc, argv, &i))) return 2;
        if (!strcmp(a, "-m")) snprintf(o.models, sizeof o.models, "%s", v);
        else if (!strcmp(a, "--pp")) { if (!cli_int(a, v, 0, 1 << 20, &o.pp)) return 2; }
        else if (!strcmp(a, "--tg")) { if (!cli_int(a, v, 0, 1 << 20, &o.tg)) return 2; }
        else if (!strcmp(a, "--reps")) { if (!cli_int(a, v, 1, 64, &o.reps)) return 2; }
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) { if ((o.n_threads = cli_int_list(a, v, 1, 1024, o.threads, MAX_LIST)) < 0) return 2; }
        else if (!strcmp(a, "--depth")) { if ((o.n_depth = cli_int_list(a, v, 0, 1 << 20, o.depth, MAX_LIST)) < 0) return 2; }
        else if (!strcmp(a, "-o")) {
            if (!strcmp(v, "json")) o.json = true;
            else if (strcmp(v, "md")) { cli_error("-o: expected md or json, got '%s'", v); return 2; }
        } else { cli_error("bench model: unknown option '%s'", a); return 2; }
    }
    if (!*o.models) { cli_error("bench model: -m MODEL is required"); return 2; }
    kvllm_log_set_level(KVLLM_LOG_WARN);
    if (!o.json) {
        printf("| %-28s | %-5s | %7s | %-6s | %5s | %4s | %23s | %10s |\n", "model", "type", "threads", "test", "depth",
               "kv", "tokens/s (median ± sd)", "ms/token");
        printf("|%s|%s|%s|%s|%s|%s|%s|%s|\n", "------------------------------", "-------", "---------", "--------",
               "-------", "------", "-------------------------", "------------");
    }
    char list[1024];
    snprintf(list, sizeof list, "%s", o.models);
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save))
        if (bench_model(&o, p)) return 1;
    return 0;
}

int cmd_bench(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "model")) return bench_model_cmd(argc - 1, argv + 1);
    if (argc >= 2 && cli_is_help(argv[1])) { fputs(k_usage, stdout); return 0; }
    cli_error("bench: expected a benchmark kind: model (see kvllm bench --help)");
    return 2;
}
