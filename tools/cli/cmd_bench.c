/* cmd_bench.c — `kvllm bench model`: prompt-processing and generation
 * speed in the style of llama-bench.  Each row is the median (and standard
 * deviation) over --reps repetitions; generation at --depth D means D
 * tokens are already in the context (prefilled untimed) before the timed
 * decode steps, so the cost of attending over a long cache shows. */
#include "cli.h"
#include "kvllm.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_LIST 16

static const char *k_usage =
    "usage: kvllm bench model -m MODEL[,MODEL...] [options]\n"
    "  --pp N            prompt tokens per prefill test (default 512, 0 = skip)\n"
    "  --tg N            generated tokens per generation test (default 128, 0 = skip)\n"
    "  --threads LIST    thread counts, e.g. 1,2 (default: all CPUs)\n"
    "  --depth LIST      context already filled before each test (default 0)\n"
    "  --reps N          repetitions (default 5)\n"
    "  --batch LIST      sequences decoding together in generation tests, e.g. 1,4,16 (aggregate tokens/s)\n"
    "  --no-kv-cache     recompute the prefix at every step (baseline)\n"
    "  -o md|json        output format (default md)\n"
    "  generation rows report the share of the memory-bandwidth roofline: weight bytes read per\n"
    "  step x steps/s over the read bandwidth measured with the same thread count\n";

struct bench_opts {
    char models[1024];
    long pp, tg, reps;
    long threads[MAX_LIST], depth[MAX_LIST], batch[MAX_LIST];
    int n_threads, n_depth, n_batch;
    bool no_kv, json;
};

static long cpu_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n;
}

/* ---- memory read bandwidth: the decode roofline ---- */

struct bw_job { const uint64_t *p; size_t n; uint64_t sum; };

static void *bw_worker(void *arg) {
    struct bw_job *j = arg;
    uint64_t s[4] = { 0 };
    for (size_t i = 0; i + 4 <= j->n; i += 4) {
        s[0] += j->p[i];
        s[1] += j->p[i + 1];
        s[2] += j->p[i + 2];
        s[3] += j->p[i + 3];
    }
    j->sum = s[0] + s[1] + s[2] + s[3];
    return NULL;
}

/* Best of 5 passes over 512 MiB split across `threads` threads, in bytes/s. */
static double read_bandwidth(int threads) {
    const size_t bytes = 512u << 20, n = bytes / 8;
    uint64_t *buf = malloc(bytes);
    if (!buf || threads < 1 || threads > 256) { free(buf); return 0; }
    for (size_t i = 0; i < n; i++) buf[i] = i;
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[256];
        struct bw_job job[256];
        double t0 = cli_time();
        for (int t = 0; t < threads; t++) {
            job[t] = (struct bw_job){ buf + n / (size_t)threads * (size_t)t, n / (size_t)threads, 0 };
            pthread_create(&th[t], NULL, bw_worker, &job[t]);
        }
        uint64_t sink = 0;
        for (int t = 0; t < threads; t++) { pthread_join(th[t], NULL); sink += job[t].sum; }
        double bw = (double)(n / (size_t)threads * (size_t)threads * 8) / (cli_time() - t0);
        if (bw > best && sink != 1) best = bw;
    }
    free(buf);
    return best;
}

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

/* ---- batched decode through the engine ---- */

struct tg_probe { int n_first, n_tokens; double t_first; int n_seqs; };

static void tg_event(const struct kvllm_event *ev, void *user) {
    struct tg_probe *p = user;
    if (ev->token < 0) return;
    if (ev->n_generated == 1 && ++p->n_first == p->n_seqs) p->t_first = cli_time();
    else if (ev->n_generated > 1) p->n_tokens++;
}

/* B sequences with `depth` prompt tokens each decode n tokens together;
 * timed from the moment every sequence has its first token.  Returns
 * seconds for B * n tokens, or < 0. */
static double run_batch_tg(struct kvllm_model *m, long depth, long n, long B, unsigned *seed) {
    const int V = kvllm_model_describe(m)->n_vocab;
    long np = depth > 0 ? depth : 1;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.max_seqs = (int)B;
    ep.kv_tokens = (int)(B * (np + n + 2));
    ep.prefix_caching = false;
    if (np + n + 1 > kvllm_model_describe(m)->n_ctx_train) ep.n_ctx = (int)(np + n + 1);
    struct kvllm_engine *e;
    if (kvllm_engine_new(m, &ep, &e)) return -1;
    struct tg_probe p = { .n_seqs = (int)B };
    int32_t *ids = malloc((size_t)np * sizeof *ids);
    int rc = ids ? 0 : KVLLM_ENOMEM;
    for (long b = 0; !rc && b < B; b++) {
        for (long i = 0; i < np; i++) {
            *seed = *seed * 1103515245u + 12345u;
            ids[i] = (int32_t)((*seed >> 8) % (unsigned)V);
        }
        struct kvllm_sampling_params sp = kvllm_sampling_default_params();
        sp.temperature = 0;
        struct kvllm_request q = { .prompt = ids, .n_prompt = (int)np, .max_tokens = (int)n + 1, .sampling = sp,
                                   .n = 1, .ignore_eos = true, .no_text = true, .on_event = tg_event, .user = &p };
        rc = kvllm_engine_add(e, &q, NULL);
    }
    while (!rc && !kvllm_engine_idle(e)) rc = kvllm_engine_step(e) < 0;
    double dt = cli_time() - p.t_first;
    free(ids);
    kvllm_engine_free(e);
    return rc || p.n_tokens != B * n ? -1 : dt;
}

/* roofline: decode reads every weight once per step (a step serves `batch`
 * tokens), so its bound is bandwidth / weight bytes steps per second */
static void print_row(const struct bench_opts *o, const char *model, const char *type, long threads, long pp,
                      long tg, long depth, long batch, double med, double sd, double roofline) {
    long n = pp ? pp : tg;
    if (o->json) {
        printf("{\"model\": \"%s\", \"type\": \"%s\", \"threads\": %ld, \"pp\": %ld, \"tg\": %ld, \"depth\": %ld, "
               "\"batch\": %ld, \"kv_cache\": %s, \"tokens_per_s_median\": %.3f, \"tokens_per_s_sd\": %.3f, "
               "\"ms_per_token_median\": %.4f, \"roofline_pct\": %.1f}\n",
               model, type, threads, pp, tg, depth, batch, o->no_kv ? "false" : "true", med, sd, 1e3 / med,
               tg ? roofline : 0.0);
    } else {
        char test[32], roof[16] = "";
        snprintf(test, sizeof test, "%s%ld", pp ? "pp" : "tg", n);
        if (tg && roofline > 0) snprintf(roof, sizeof roof, "%.0f %%", roofline);
        printf("| %-28s | %-5s | %7ld | %-6s | %5ld | %5ld | %4s | %12.2f ± %-8.2f | %10.3f | %8s |\n", model, type,
               threads, test, depth, batch, o->no_kv ? "off" : "on", med, sd, 1e3 / med, roof);
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
        const double wbytes = (double)kvllm_model_describe(m)->weight_bytes;
        const double bw = o->tg > 0 ? read_bandwidth(mp.n_threads) : 0;
        for (int di = 0; di < o->n_depth; di++) {
            for (int test = 0; test < 1 + o->n_batch; test++) {
                /* test 0: prefill; 1..n_batch: decode with batch[test - 1] sequences */
                long n = test == 0 ? o->pp : o->tg, B = test == 0 ? 1 : o->batch[test - 1];
                if (n <= 0) continue;
                double tps[64];
                unsigned seed = 1234;
                for (long r = 0; r < o->reps; r++) {
                    double dt = B > 1 ? run_batch_tg(m, o->depth[di], n, B, &seed)
                                      : run_once(m, o, o->depth[di], n, test > 0, &seed);
                    if (dt < 0) { kvllm_model_free(m); return 1; }
                    tps[r] = (double)(n * B) / dt;
                }
                double mean = 0, var = 0;
                for (long r = 0; r < o->reps; r++) mean += tps[r] / (double)o->reps;
                for (long r = 0; r < o->reps; r++) var += (tps[r] - mean) * (tps[r] - mean);
                double sd = o->reps > 1 ? sqrt(var / (double)(o->reps - 1)) : 0;
                qsort(tps, (size_t)o->reps, sizeof *tps, cmp_double);
                double med = o->reps % 2 ? tps[o->reps / 2] : 0.5 * (tps[o->reps / 2 - 1] + tps[o->reps / 2]);
                double roof = bw > 0 && !o->no_kv ? 100.0 * med / (double)B * wbytes / bw : 0;
                print_row(o, base, type, mp.n_threads, test == 0 ? n : 0, test > 0 ? n : 0, o->depth[di], B, med, sd,
                          roof);
            }
        }
        kvllm_model_free(m);
    }
    return 0;
}

static int bench_model_cmd(int argc, char **argv) {
    struct bench_opts o = { .pp = 512, .tg = 128, .reps = 5, .n_threads = 1, .n_depth = 1, .n_batch = 1 };
    o.threads[0] = cpu_threads();
    o.depth[0] = 0;
    o.batch[0] = 1;
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
        else if (!strcmp(a, "--batch")) { if ((o.n_batch = cli_int_list(a, v, 1, 4096, o.batch, MAX_LIST)) < 0) return 2; }
        else if (!strcmp(a, "-o")) {
            if (!strcmp(v, "json")) o.json = true;
            else if (strcmp(v, "md")) { cli_error("-o: expected md or json, got '%s'", v); return 2; }
        } else { cli_error("bench model: unknown option '%s'", a); return 2; }
    }
    if (!*o.models) { cli_error("bench model: -m MODEL is required"); return 2; }
    kvllm_log_set_level(KVLLM_LOG_WARN);
    if (!o.json) {
        printf("| %-28s | %-5s | %7s | %-6s | %5s | %5s | %4s | %23s | %10s | %8s |\n", "model", "type", "threads",
               "test", "depth", "batch", "kv", "tokens/s (median ± sd)", "ms/token", "roofline");
        printf("|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", "------------------------------", "-------", "---------",
               "--------", "-------", "-------", "------", "-------------------------", "------------", "----------");
    }
    char list[1024];
    snprintf(list, sizeof list, "%s", o.models);
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save))
        if (bench_model(&o, p)) return 1;
    return 0;
}

/* ---- bench throughput: the engine on an offline workload ---- */

static const char *k_usage_tp =
    "usage: kvllm bench throughput -m MODEL [options] [engine options]\n"
    "  --requests M        requests (default 100)\n"
    "  --prompt-len A:B    prompt lengths, uniform (default 32:256)\n"
    "  --gen-len A:B       output lengths, uniform (default 16:128; EOS ignored)\n"
    "  --shared-prefix L   every prompt starts with the same L tokens (default 0)\n"
    "  --seed S            workload seed (default 1)\n"
    "  --static            static batching: a batch starts when the previous one has finished\n"
    "  -t N                threads\n"
    "  -o md|json          output format (default md)\n";

struct tp_count { uint64_t n_out; int n_done; };

static void tp_event(const struct kvllm_event *ev, void *user) {
    struct tp_count *c = user;
    if (ev->token >= 0) c->n_out++;
    if (ev->finish) c->n_done++;
}

static unsigned tp_rand(unsigned *s) { *s = *s * 1103515245u + 12345u; return *s >> 8; }

static int bench_throughput_cmd(int argc, char **argv) {
    const char *model = NULL;
    long n_req = 100, p_lo = 32, p_hi = 256, g_lo = 16, g_hi = 128, shared = 0, seed = 1, threads = 0;
    bool is_static = false, json = false;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (cli_is_help(a)) { fputs(k_usage_tp, stdout); fputs(cli_engine_usage, stdout); return 0; }
        int eo = cli_engine_opt(argc, argv, &i, &ep);
        if (eo < 0) return 2;
        if (eo > 0) continue;
        if (!strcmp(a, "--static")) { is_static = true; continue; }
        if (!(v = cli_arg(argc, argv, &i))) return 2;
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "--requests")) { if (!cli_int(a, v, 1, 1 << 20, &n_req)) return 2; }
        else if (!strcmp(a, "--prompt-len")) { if (!cli_range(a, v, 1, 1 << 20, &p_lo, &p_hi)) return 2; }
        else if (!strcmp(a, "--gen-len")) { if (!cli_range(a, v, 1, 1 << 20, &g_lo, &g_hi)) return 2; }
        else if (!strcmp(a, "--shared-prefix")) { if (!cli_int(a, v, 0, 1 << 20, &shared)) return 2; }
        else if (!strcmp(a, "--seed")) { if (!cli_int(a, v, 0, 1L << 31, &seed)) return 2; }
        else if (!strcmp(a, "-t")) { if (!cli_int(a, v, 1, 1024, &threads)) return 2; }
        else if (!strcmp(a, "-o")) {
            if (!strcmp(v, "json")) json = true;
            else if (strcmp(v, "md")) { cli_error("-o: expected md or json, got '%s'", v); return 2; }
        } else { cli_error("bench throughput: unknown option '%s'", a); return 2; }
    }
    if (!model) { cli_error("bench throughput: -m MODEL is required"); return 2; }
    if (shared > p_lo) { cli_error("--shared-prefix %ld is longer than the shortest prompt (%ld)", shared, p_lo); return 2; }
    kvllm_log_set_level(KVLLM_LOG_WARN);
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.n_threads = (int)threads;
    struct kvllm_model *m;
    if (kvllm_model_load(model, &mp, &m)) return 1;
    const int V = kvllm_model_describe(m)->n_vocab;
    if (ep.n_ctx <= 0 && p_hi + g_hi > kvllm_model_describe(m)->n_ctx_train) ep.n_ctx = (int)(p_hi + g_hi);
    struct kvllm_engine *e = NULL;
    int32_t *toks = malloc((size_t)p_hi * sizeof *toks), *prefix = malloc((size_t)(shared + 1) * sizeof *prefix);
    unsigned rs = (unsigned)seed;
    for (long i = 0; i < shared; i++) prefix[i] = (int32_t)(3 + tp_rand(&rs) % (unsigned)(V - 3));
    struct tp_count cnt = { 0 };
    int rc = toks && prefix ? kvllm_engine_new(m, &ep, &e) : KVLLM_ENOMEM;
    double t0 = cli_time();
    uint64_t n_prompt_total = 0;
    for (long r = 0; !rc && r < n_req;) {
        /* static batching: fill one batch, run it to the end, then the next */
        long batch_end = is_static ? r + ep.max_seqs : n_req;
        if (batch_end > n_req) batch_end = n_req;
        for (; !rc && r < batch_end; r++) {
            int np = (int)(p_lo + tp_rand(&rs) % (unsigned)(p_hi - p_lo + 1));
            int ng = (int)(g_lo + tp_rand(&rs) % (unsigned)(g_hi - g_lo + 1));
            memcpy(toks, prefix, (size_t)shared * sizeof *toks);
            for (int i = (int)shared; i < np; i++) toks[i] = (int32_t)(3 + tp_rand(&rs) % (unsigned)(V - 3));
            struct kvllm_sampling_params sp = kvllm_sampling_default_params();
            sp.temperature = 0;
            struct kvllm_request q = { .prompt = toks, .n_prompt = np, .max_tokens = ng, .sampling = sp, .n = 1,
                                       .ignore_eos = true, .no_text = true, .on_event = tp_event, .user = &cnt };
            rc = kvllm_engine_add(e, &q, NULL);
            n_prompt_total += (uint64_t)np;
        }
        while (!rc && !kvllm_engine_idle(e)) rc = kvllm_engine_step(e) < 0;
    }
    double dt = cli_time() - t0;
    if (!rc) {
        struct kvllm_engine_stats st;
        kvllm_engine_get_stats(e, &st);
        double steps = st.steps ? (double)st.steps : 1;
        double rps = (double)n_req / dt, tps = (double)(n_prompt_total + cnt.n_out) / dt, ops = (double)cnt.n_out / dt;
        double mb = (double)st.batch_seqs_sum / steps, util = 100 * st.kv_util_sum / steps;
        double waste = 100 * st.kv_waste_sum / steps, ideal = 100 * st.kv_waste_ideal_sum / steps;
        double hit = st.prompt_tokens ? 100.0 * (double)st.cached_tokens / (double)st.prompt_tokens : 0;
        if (json)
            printf("{\"requests_per_s\": %.4f, \"tokens_per_s\": %.2f, \"output_tokens_per_s\": %.2f, "
                   "\"mean_batch\": %.3f, \"kv_utilization_pct\": %.3f, \"kv_waste_pct\": %.3f, "
                   "\"kv_waste_ideal_pct\": %.3f, "
                   "\"prefix_hit_pct\": %.3f, \"preemptions\": %llu, \"requests\": %ld, \"seconds\": %.3f, "
                   "\"static\": %s, \"steps\": %llu, \"blocks_total\": %d, \"block_size\": %d}\n",
                   rps, tps, ops, mb, util, waste, ideal, hit, (unsigned long long)st.preemptions, n_req, dt,
                   is_static ? "true" : "false", (unsigned long long)st.steps, st.blocks_total, st.block_size);
        else
            printf("| batching | requests/s | tokens/s | output tok/s | mean batch | KV util %% | KV waste %% "
                   "(ideal) | prefix hit %% | preemptions |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
                   "| %s | %.3f | %.1f | %.1f | %.2f | %.1f | %.2f (%.2f) | %.1f | %llu |\n",
                   is_static ? "static" : "continuous", rps, tps, ops, mb, util, waste, ideal, hit,
                   (unsigned long long)st.preemptions);
    }
    free(toks);
    free(prefix);
    kvllm_engine_free(e);
    kvllm_model_free(m);
    return rc ? 1 : 0;
}

/* ---- bench prefix: time to first token with a cached prefix vs cold ---- */

struct ttft_probe { double t_first; bool got; };

static void ttft_event(const struct kvllm_event *ev, void *user) {
    struct ttft_probe *p = user;
    if (!p->got && ev->token >= 0) { p->t_first = cli_time(); p->got = true; }
}

/* Submit one prompt, run to completion, return its time to first token (s). */
static double ttft_once(struct kvllm_engine *e, const int32_t *toks, int n, int *n_cached) {
    struct ttft_probe p = { 0 };
    struct kvllm_sampling_params sp = kvllm_sampling_default_params();
    sp.temperature = 0;
    struct kvllm_request q = { .prompt = toks, .n_prompt = n, .max_tokens = 1, .sampling = sp, .n = 1,
                               .ignore_eos = true, .no_text = true, .on_event = ttft_event, .user = &p };
    struct kvllm_engine_stats a, b;
    kvllm_engine_get_stats(e, &a);
    double t0 = cli_time();
    if (kvllm_engine_add(e, &q, NULL)) return -1;
    while (!kvllm_engine_idle(e))
        if (kvllm_engine_step(e) < 0) return -1;
    kvllm_engine_get_stats(e, &b);
    *n_cached = (int)(b.cached_tokens - a.cached_tokens);
    return p.got ? p.t_first - t0 : -1;
}

static const char *k_usage_prefix =
    "usage: kvllm bench prefix -m MODEL [--prompt-len N] [--cached-pct P] [--reps R] [-t N] [engine options]\n"
    "  time to first token of an N-token prompt (default 1024) whose first P %% (default 90) is\n"
    "  already in the prefix cache, against the same prompt cold\n";

static int bench_prefix_cmd(int argc, char **argv) {
    const char *model = NULL;
    long n = 1024, pct = 90, reps = 5, threads = 0;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (cli_is_help(a)) { fputs(k_usage_prefix, stdout); fputs(cli_engine_usage, stdout); return 0; }
        int eo = cli_engine_opt(argc, argv, &i, &ep);
        if (eo < 0) return 2;
        if (eo > 0) continue;
        if (!(v = cli_arg(argc, argv, &i))) return 2;
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "--prompt-len")) { if (!cli_int(a, v, 2, 1 << 20, &n)) return 2; }
        else if (!strcmp(a, "--cached-pct")) { if (!cli_int(a, v, 0, 99, &pct)) return 2; }
        else if (!strcmp(a, "--reps")) { if (!cli_int(a, v, 1, 64, &reps)) return 2; }
        else if (!strcmp(a, "-t")) { if (!cli_int(a, v, 1, 1024, &threads)) return 2; }
        else { cli_error("bench prefix: unknown option '%s'", a); return 2; }
    }
    if (!model) { cli_error("bench prefix: -m MODEL is required"); return 2; }
    kvllm_log_set_level(KVLLM_LOG_WARN);
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.n_threads = (int)threads;
    struct kvllm_model *m;
    if (kvllm_model_load(model, &mp, &m)) return 1;
    const int V = kvllm_model_describe(m)->n_vocab;
    if (ep.n_ctx <= 0 && n + 1 > kvllm_model_describe(m)->n_ctx_train) ep.n_ctx = (int)n + 1;
    if (!ep.kv_mem && !ep.kv_tokens) ep.kv_tokens = (int)(4 * (n + 1));
    struct kvllm_engine *e = NULL;
    int32_t *p = malloc((size_t)n * sizeof *p);
    double cold[64], warm[64];
    int hit = 0, rc = p ? kvllm_engine_new(m, &ep, &e) : KVLLM_ENOMEM;
    unsigned rs = 7;
    for (long r = 0; !rc && r < reps; r++) {
        for (long i = 0; i < n; i++) p[i] = (int32_t)(3 + tp_rand(&rs) % (unsigned)(V - 3));
        int c0;
        cold[r] = ttft_once(e, p, (int)n, &c0);
        for (long i = n * pct / 100; i < n; i++) p[i] = (int32_t)(3 + tp_rand(&rs) % (unsigned)(V - 3));
        warm[r] = ttft_once(e, p, (int)n, &hit);
        if (cold[r] < 0 || warm[r] < 0) rc = 1;
    }
    if (!rc) {
        qsort(cold, (size_t)reps, sizeof *cold, cmp_double);
        qsort(warm, (size_t)reps, sizeof *warm, cmp_double);
        double mc = reps % 2 ? cold[reps / 2] : 0.5 * (cold[reps / 2 - 1] + cold[reps / 2]);
        double mw = reps % 2 ? warm[reps / 2] : 0.5 * (warm[reps / 2 - 1] + warm[reps / 2]);
        printf("| prompt | cached | TTFT cold (ms, median of %ld) | TTFT cached (ms) | speed-up |\n"
               "|---:|---:|---:|---:|---:|\n| %ld | %d (%ld %% asked) | %.1f | %.1f | %.1fx |\n",
               reps, n, hit, pct, 1e3 * mc, 1e3 * mw, mc / mw);
    }
    free(p);
    kvllm_engine_free(e);
    kvllm_model_free(m);
    return rc ? 1 : 0;
}

static int bench_membw_cmd(int argc, char **argv) {
    long list[MAX_LIST] = { 1, cpu_threads() };
    int n = cpu_threads() > 1 ? 2 : 1;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            fputs("usage: kvllm bench membw [--threads LIST]\n  read bandwidth (GB/s) over 512 MiB, best of 5\n", stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--threads") || !strcmp(argv[i], "-t")) {
            const char *v = cli_arg(argc, argv, &i);
            if (!v || (n = cli_int_list(argv[i - 1], v, 1, 256, list, MAX_LIST)) < 0) return 2;
        } else { cli_error("bench membw: unknown option '%s'", argv[i]); return 2; }
    }
    printf("| threads | read GB/s |\n|---:|---:|\n");
    for (int i = 0; i < n; i++) printf("| %ld | %.1f |\n", list[i], read_bandwidth((int)list[i]) / 1e9);
    return 0;
}

int cmd_bench(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "membw")) return bench_membw_cmd(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "prefix")) return bench_prefix_cmd(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "serve")) return bench_serve_cmd(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "model")) return bench_model_cmd(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "throughput")) return bench_throughput_cmd(argc - 1, argv + 1);
    if (argc >= 2 && cli_is_help(argv[1])) { fputs(k_usage, stdout); fputs(k_usage_tp, stdout); fputs(k_usage_prefix, stdout); return 0; }
    cli_error("bench: expected a benchmark kind: model, throughput, prefix, serve or membw (see kvllm bench --help)");
    return 2;
}
