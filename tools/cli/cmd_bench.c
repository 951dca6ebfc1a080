/* cmd_bench.c — `kvllm bench model`: prompt-processing and generation
 * speed in the style of llama-bench.  Each row is the median (and standard
 * deviation) over --reps repetitions; generation at --depth D means D
 * tokens are already in the context (prefilled untimed) before the timed
 * decode steps, so the cost of attending over a long cache shows. */
#include "bench_plot.h"
#include "cli.h"
#include "cli_opts.h"
#include "kvllm.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_LIST 16

enum {
    BM_HELP = 1, BM_MODEL, BM_PP, BM_TG, BM_THREADS, BM_DEPTH, BM_REPS, BM_UBATCH, BM_BATCH, BM_NO_KV, BM_KV_TYPE, BM_OUTPUT,
    BM_SVG, BM_COMPARE, BM_COMPARE_LABEL,
};

/* bench model's options: the parser, --help and docs/CLI.md's reference read this table */
static const struct cli_opt k_model_opts[] = {
    { BM_MODEL, "-m, --model", "LIST", CLI_VALUE, "model files, comma-separated (one table, a row group per model)" },
    { BM_PP, "-p, --pp, --n-prompt", "LIST", CLI_VALUE,
      "prompt tokens per prefill test, e.g. 128,512 (default 512, 0 = skip)" },
    { BM_TG, "-n, --tg, --n-gen", "LIST", CLI_VALUE,
      "generated tokens per generation test, e.g. 32,128 (default 128, 0 = skip)" },
    { BM_THREADS, "-t, --threads", "LIST", CLI_VALUE, "thread counts, e.g. 1,2 (default: all CPUs)" },
    { BM_DEPTH, "-d, --depth, --n-depth", "LIST", CLI_VALUE, "context already filled before each test (default 0)" },
    { BM_REPS, "-r, --reps, --repetitions", "N", CLI_VALUE, "repetitions (default 5)" },
    { BM_UBATCH, "-b, --batch-size", "LIST", CLI_VALUE,
      "tokens per forward pass in prefill (llama-bench's batch size; default 512)" },
    { BM_BATCH, "--batch", "LIST", CLI_VALUE,
      "sequences decoding together in generation tests, e.g. 1,4,16 (aggregate tokens/s)" },
    { BM_NO_KV, "--no-kv-cache", NULL, CLI_FLAG, "recompute the prefix at every step (baseline)" },
    { BM_KV_TYPE, "--kv-type", "T", CLI_VALUE, "KV cache type: f32, f16 (default), bf16, int8, fp8 (the kv column shows it)" },
    { BM_OUTPUT, "-o, --output", "md|json|jsonl|csv", CLI_VALUE,
      "output format (default md; json: one array, as llama-bench; json and jsonl rows\ncarry llama-bench's keys "
      "too: avg_ts, stddev_ts, samples_ts, n_prompt, n_gen, ...)" },
    { BM_SVG, "--svg", "DIR", CLI_VALUE,
      "also draw the rows as SVG charts in folder DIR: batch.svg (decode tokens/s against\n--batch), depth.svg "
      "(against --depth), compare.svg (kvllm beside --compare's engine)" },
    { BM_COMPARE, "--compare", "FILE", CLI_VALUE,
      "another engine's rows for the charts: llama-bench -o json|jsonl, bench/vs-llamacpp -o json" },
    { BM_COMPARE_LABEL, "--compare-label", "NAME", CLI_VALUE, "that engine's name in the charts (default llama.cpp)" },
    { BM_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_model_group = CLI_GROUP(NULL, k_model_opts);
static const struct cli_opt_group *const k_model_groups[] = { &k_model_group, &cli_gpu_group, &cli_tp_group };

static const struct cli_cmd k_model_cmd = {
    .name = "bench model",
    .synopsis = "-m MODEL[,MODEL...] [options]   (llama-bench's short options work)",
    .groups = CLI_GROUPS(k_model_groups),
    .n_own = 1,
    .notes =
        "  one row per combination of -t, -b, -d and the tests (each -p; each -n with each --batch), in that nesting\n"
        "  columns: model, size (weight bytes), params, backend (kernel set, e.g. strict/avx512), type, threads,\n"
        "  n_batch (md: only with -b), test, depth, batch, kv, tokens/s, ms/token, roofline\n"
        "  generation rows report the share of the memory-bandwidth roofline: weight bytes read per\n"
        "  step x steps/s over the read bandwidth measured with the same thread count (\"in LLC\" when\n"
        "  the weights fit in the last-level cache; \"> probe\" past 100 %: decode read faster than the\n"
        "  bandwidth probe); a run that preempts a sequence fails\n"
        "  under mpirun -np N (tensor parallelism), rows at batch 1 add what rank 0's collectives cost per\n"
        "  token: KiB received from the other ranks, all-reduce ms, and all-reduce us per layer\n",
};

enum bench_fmt { FMT_MD, FMT_JSON, FMT_JSONL, FMT_CSV };

struct bench_opts {
    char models[1024];
    long reps;
    enum bench_fmt fmt;
    int w_model;          /* width of the model column (md) */
    int n_rows;           /* rows printed so far (json separators) */
    long threads[MAX_LIST], depth[MAX_LIST], batch[MAX_LIST], pp[MAX_LIST], tg[MAX_LIST], ubatch[MAX_LIST];
    int n_threads, n_depth, n_batch, n_pp, n_tg, n_ubatch;
    bool no_kv, show_ubatch;   /* show_ubatch: -b given, the md table gets an n_batch column */
    const char *kv_type;       /* --kv-type; NULL: the session's default, f16 */
    const char *svg_dir, *compare, *compare_label;   /* --svg, --compare, --compare-label */
    struct plot_rows plot;     /* with --svg: every row measured, for the charts */
};

/* Tokens per forward pass a session gets for -b value ub (the session's default when 0). */
static long eff_ubatch(long ub) { return ub > 0 ? ub : 512; }

static long cpu_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n;
}

/* ---- memory read bandwidth: the decode roofline ---- */

struct bw_job { const uint64_t *p; size_t n; uint64_t sum; };

/* 32-byte vectors (the GCC / Clang vector extension), four accumulators and
 * a software prefetch 2 KiB ahead, as the matmul kernels read weights, built
 * for AVX2 where the CPU has it: a plain scalar loop keeps fewer loads in
 * flight and under-read this machine by a third, so decode passed "100 %". */
typedef uint64_t bw_vec __attribute__((vector_size(32)));

#define BW_BODY                                                     \
    const bw_vec *v = (const bw_vec *)(const void *)j->p;           \
    bw_vec s0 = { 0 }, s1 = { 0 }, s2 = { 0 }, s3 = { 0 };           \
    for (size_t i = 0; i + 8 <= j->n / 4; i += 8) {                 \
        __builtin_prefetch(v + i + 64);                             \
        s0 += v[i] ^ v[i + 4];                                      \
        s1 += v[i + 1] ^ v[i + 5];                                  \
        s2 += v[i + 2] ^ v[i + 6];                                  \
        s3 += v[i + 3] ^ v[i + 7];                                  \
    }                                                               \
    bw_vec s = s0 + s1 + s2 + s3;                                   \
    j->sum = s[0] + s[1] + s[2] + s[3];

static void bw_read(struct bw_job *j) { BW_BODY }
#if defined(__x86_64__)
__attribute__((target("avx2"))) static void bw_read_avx2(struct bw_job *j) { BW_BODY }
#endif

static void *bw_worker(void *arg) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) { bw_read_avx2(arg); return NULL; }
#endif
    bw_read(arg);
    return NULL;
}

/* Best of 5 passes over 512 MiB split across `threads` threads, in bytes/s. */
static double read_bandwidth(int threads) {
    const size_t bytes = 512u << 20, n = bytes / 8;
    uint64_t *buf = aligned_alloc(64, bytes);
    if (!buf || threads < 1 || threads > 256) { free(buf); return 0; }
    for (size_t i = 0; i < n; i++) buf[i] = i;
    /* whole 256-byte steps per thread, each share 32-byte aligned for the vectors */
    const size_t share = n / (size_t)threads / 32 * 32;
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[256];
        struct bw_job job[256];
        double t0 = cli_time();
        for (int t = 0; t < threads; t++) {
            job[t] = (struct bw_job){ buf + share * (size_t)t, share, 0 };
            pthread_create(&th[t], NULL, bw_worker, &job[t]);
        }
        uint64_t sink = 0;
        for (int t = 0; t < threads; t++) { pthread_join(th[t], NULL); sink += job[t].sum; }
        double bw = (double)(share * (size_t)threads * 8) / (cli_time() - t0);
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
/* What a timed part's collectives cost under tensor parallelism (kvllm_tp_stats), as bench shows it. */
struct comm_cost { double bytes, all_reduce_s; };

static struct comm_cost comm_now(void) {
    struct kvllm_tp_stats t;
    kvllm_tp_stats(&t);
    return (struct comm_cost){ (double)(t.all_reduce_bytes + t.gather_bytes + t.broadcast_bytes), t.all_reduce_s };
}

/* *comm: what the timed part's collectives cost. */
static double run_once(struct kvllm_model *m, const struct bench_opts *o, long ubatch, long depth, long n, bool gen,
                       unsigned *seed, struct comm_cost *comm) {
    const struct kvllm_model_desc *d = kvllm_model_describe(m);
    struct kvllm_session_params sp = { .n_ctx = (int)(depth + n + 1), .no_kv_cache = o->no_kv,
                                       .kv_type = o->kv_type, .max_batch = (int)ubatch };
    struct kvllm_session *s;
    if (kvllm_session_new(m, &sp, &s)) return -1;
    long total = depth + n;
    int32_t *ids = malloc((size_t)(total > 0 ? total : 1) * sizeof *ids);
    /* every timed evaluation computes its last token's logits, as llama-bench's decode does and as a
     * generating user needs: the output matrix is part of a token's cost (Gemma 3 270M's is 168 M of its
     * 268 M parameters) */
    float *logits = malloc((size_t)d->n_vocab * sizeof *logits);
    if (!ids || !logits) { free(ids); free(logits); kvllm_session_free(s); return -1; }
    for (long i = 0; i < total; i++) {
        *seed = *seed * 1103515245u + 12345u;
        ids[i] = (int32_t)((*seed >> 8) % (unsigned)d->n_vocab);
    }
    int rc = depth ? kvllm_session_eval(s, ids, (int)depth, false, NULL) : 0;
    const struct comm_cost c0 = comm_now();
    double t0 = cli_time();
    if (!gen) {
        rc = rc ? rc : kvllm_session_eval(s, ids + depth, (int)n, false, logits);
    } else {
        for (long i = 0; !rc && i < n; i++) rc = kvllm_session_eval(s, ids + depth + i, 1, false, logits);
    }
    double dt = cli_time() - t0;
    const struct comm_cost c1 = comm_now();
    *comm = (struct comm_cost){ c1.bytes - c0.bytes, c1.all_reduce_s - c0.all_reduce_s };
    free(ids);
    free(logits);
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
    /* whole blocks per sequence: a pool of B * (np + n + 2) positions
     * rounds each sequence up and runs short, preempting inside the timing */
    const long bs = ep.block_size > 0 ? ep.block_size : 16;
    ep.kv_tokens = (int)(B * ((np + n + 2 + bs - 1) / bs) * bs);
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
    struct kvllm_engine_stats st;
    kvllm_engine_get_stats(e, &st);
    free(ids);
    kvllm_engine_free(e);
    if (!rc && st.preemptions) {   /* a preempted sequence recomputes its context: the figure would lie */
        cli_error("bench: %llu preemption(s) during a batch-%ld run (pool of %d blocks): not a valid measurement",
                  (unsigned long long)st.preemptions, B, st.blocks_total);
        return -1;
    }
    return rc || p.n_tokens != B * n ? -1 : dt;
}

/* roofline: decode reads every weight once per step (a step serves `batch`
 * tokens), so its bound is bandwidth / weight bytes steps per second */
/* Bytes of the last-level cache (0: unknown).  Weights that fit there are
 * not read from memory, so a bandwidth roofline does not bound them. */
static double llc_bytes(void) {
    for (int i = 4; i >= 0; i--) {
        char path[96], buf[32];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        char *ok = fgets(buf, sizeof buf, f);
        fclose(f);
        if (!ok) continue;
        char *end;
        double v = strtod(buf, &end);
        return v * (*end == 'K' ? 1024.0 : *end == 'M' ? 1048576.0 : *end == 'G' ? 1073741824.0 : 1.0);
    }
    return 0;
}

/* What every row of one model says about it. */
struct model_cols {
    const char *name, *path, *arch, *type, *backend;
    double size_gib, params_b;
};

static void fmt_size(char *buf, size_t cap, double gib) {
    if (gib >= 1) snprintf(buf, cap, "%.2f GiB", gib);
    else snprintf(buf, cap, "%.1f MiB", gib * 1024);
}

static void fmt_params(char *buf, size_t cap, double b) {
    if (b >= 1) snprintf(buf, cap, "%.2f B", b);
    else if (b * 1e3 >= 1) snprintf(buf, cap, "%.1f M", b * 1e3);
    else snprintf(buf, cap, "%.1f K", b * 1e6);
}

/* A string as JSON (the names come from file names: quote and escape). */
static void json_str(const char *s) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    putchar('"');
}

/* Under tensor parallelism (mpirun -np N ... bench model) each md row ends with what the ranks' collectives
 * cost per token, as rank 0 counts them: the bytes it received, and its time in all-reduces (per token, and
 * per layer: a layer makes two). */
static bool tp_cols(void) { return cli_tp_size() > 1; }

static void print_header(struct bench_opts *o) {
    if (o->fmt == FMT_JSON) { puts("["); return; }
    if (o->fmt == FMT_CSV) {
        puts("model,size_bytes,params,backend,type,threads,n_batch,test,pp,tg,depth,batch,kv_cache,tokens_per_s_median,"
             "tokens_per_s_sd,ms_per_token_median,roofline_pct,weights_in_llc");
        return;
    }
    if (o->fmt != FMT_MD) return;
    char dash[256];
    int w = o->w_model < (int)sizeof dash - 3 ? o->w_model : (int)sizeof dash - 3;
    memset(dash, '-', (size_t)w + 2);
    dash[w + 2] = 0;
    printf("| %-*s | %10s | %9s | %-16s | %-5s | %7s |%s %-6s | %5s | %5s | %4s | %24s | %10s | %8s |", w, "model",
           "size", "params", "backend", "type", "threads", o->show_ubatch ? " n_batch |" : "", "test", "depth", "batch",
           "kv", "tokens/s (median ± sd)", "ms/token", "roofline");
    if (tp_cols()) printf(" %14s | %19s | %19s |", "comm KiB/token", "all-reduce ms/token", "all-reduce µs/layer");
    printf("\n|%s|-----------:|----------:|------------------|-------|--------:|%s--------|------:|------:|------|"
           "------------------------:|-----------:|---------:|%s\n", dash, o->show_ubatch ? "--------:|" : "",
           tp_cols() ? "---------------:|--------------------:|--------------------:|" : "");
}

static void print_footer(const struct bench_opts *o) {
    if (o->fmt == FMT_JSON) puts("]");
}

/* One measured row: the test and its --reps samples. */
struct row {
    long threads, ubatch, pp, tg, depth, batch;
    int n;                      /* samples */
    double tps[64], ns[64];     /* tokens/s and nanoseconds of each sample */
    double med, sd, mean;       /* of tps: median and sample sd (kvllm's), mean (llama-bench's avg_ts) */
    double roofline;            /* percent; < 0: the weights fit in the last-level cache (no roofline) */
    double comm_kib, ar_ms, ar_us_layer;   /* per token, under tensor parallelism (tp_cols) */
    char time[32];              /* when the test started, ISO 8601 UTC */
};

/* The CPU's name (/proc/cpuinfo's "model name"), for llama-bench's cpu_info. */
static void cpu_name(char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        colon += 1 + (colon[1] == ' ');
        colon[strcspn(colon, "\n")] = 0;
        snprintf(out, cap, "%s", colon);
        break;
    }
    if (f) fclose(f);
}

/* llama-bench's keys (tools/llama-bench: build, machine, model, parameters, test, timings), so its readers
 * (scripts/compare-llama-bench.py and the like) read kvllm's rows; the GPU ones say "no GPU".  Its n_batch
 * is kvllm's own key of the same meaning, written once. */
/* The KV type a row ran with (llama-bench's type_k / type_v keys). */
static const char *kv_type_name(const struct bench_opts *o) { return o->kv_type ? o->kv_type : "f16"; }

static bool kv_type_known(const char *t) {
    static const char *const k_types[] = { "f32", "f16", "bf16", "int8", "fp8" };
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (!strcmp(t, k_types[i])) return true;
    return false;
}

static void print_llama_bench_keys(const struct bench_opts *o, const struct model_cols *mc, uint64_t size,
                                   uint64_t params, const struct row *r) {
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    printf(", \"build_commit\": ");
    json_str(cli_commit_string());
    printf(", \"build_number\": 0, \"cpu_info\": ");
    json_str(cpu);
    printf(", \"gpu_info\": \"\", \"backends\": \"CPU\", \"model_filename\": ");
    json_str(mc->path);
    char type[160];
    snprintf(type, sizeof type, "%s %s", mc->arch, mc->type);
    printf(", \"model_type\": ");
    json_str(type);
    printf(", \"model_size\": %llu, \"model_n_params\": %llu, \"n_ubatch\": %ld, "
           "\"n_threads\": %ld, \"type_k\": \"%s\", \"type_v\": \"%s\", \"n_gpu_layers\": 0, "
           "\"flash_attn\": true, \"use_mmap\": true, \"embeddings\": false, \"n_prompt\": %ld, \"n_gen\": %ld, "
           "\"n_depth\": %ld, \"test_time\": \"%s\"",
           (unsigned long long)size, (unsigned long long)params, r->ubatch, r->threads, kv_type_name(o),
           kv_type_name(o), r->pp, r->tg, r->depth, r->time);
    double avg_ns = 0, sd_ns = 0, sd_ts = 0;
    for (int i = 0; i < r->n; i++) avg_ns += r->ns[i] / r->n;
    for (int i = 0; i < r->n; i++) {
        sd_ns += (r->ns[i] - avg_ns) * (r->ns[i] - avg_ns);
        sd_ts += (r->tps[i] - r->mean) * (r->tps[i] - r->mean);
    }
    sd_ns = r->n > 1 ? sqrt(sd_ns / (r->n - 1)) : 0;
    sd_ts = r->n > 1 ? sqrt(sd_ts / (r->n - 1)) : 0;
    printf(", \"avg_ns\": %.0f, \"stddev_ns\": %.0f, \"avg_ts\": %.6f, \"stddev_ts\": %.6f, \"samples_ns\": [",
           avg_ns, sd_ns, r->mean, sd_ts);
    for (int i = 0; i < r->n; i++) printf(i ? ", %.0f" : "%.0f", r->ns[i]);
    printf("], \"samples_ts\": [");
    for (int i = 0; i < r->n; i++) printf(i ? ", %.6g" : "%.6g", r->tps[i]);
    printf("]");
    (void)o;
}

static void print_row(struct bench_opts *o, const struct model_cols *mc, uint64_t size, uint64_t params,
                      const struct row *r) {
    const long pp = r->pp, tg = r->tg, n = pp ? pp : tg;
    const double med = r->med, sd = r->sd, roofline = r->roofline;
    char test[32];
    snprintf(test, sizeof test, "%s%ld", pp ? "pp" : "tg", n);
    if (o->fmt == FMT_JSON || o->fmt == FMT_JSONL) {
        /* json: one object per line with "," lines between, so line readers still work */
        if (o->fmt == FMT_JSON && o->n_rows) puts(",");
        printf("{\"model\": ");
        json_str(mc->name);
        printf(", \"size_bytes\": %llu, \"params\": %llu, \"backend\": ", (unsigned long long)size,
               (unsigned long long)params);
        json_str(mc->backend);
        printf(", \"type\": \"%s\", \"threads\": %ld, \"n_batch\": %ld, \"test\": \"%s\", \"pp\": %ld, \"tg\": %ld, "
               "\"depth\": %ld, \"batch\": %ld, \"kv_cache\": %s, \"tokens_per_s_median\": %.3f, "
               "\"tokens_per_s_sd\": %.3f, \"ms_per_token_median\": %.4f, \"roofline_pct\": %.1f, "
               "\"weights_in_llc\": %s",
               mc->type, r->threads, r->ubatch, test, pp, tg, r->depth, r->batch, o->no_kv ? "false" : "true", med, sd,
               1e3 / med, tg && roofline > 0 ? roofline : 0.0, roofline < 0 ? "true" : "false");
        if (tp_cols() && !isnan(r->ar_ms))
            printf(", \"tp_ranks\": %d, \"comm_kib_per_token\": %.3f, \"all_reduce_ms_per_token\": %.4f, "
                   "\"all_reduce_us_per_layer\": %.2f", cli_tp_size(), r->comm_kib, r->ar_ms, r->ar_us_layer);
        print_llama_bench_keys(o, mc, size, params, r);
        printf("}\n");
    } else if (o->fmt == FMT_CSV) {
        printf("\"");
        for (const char *p = mc->name; *p; p++) printf(*p == '"' ? "\"\"" : "%c", *p);
        printf("\",%llu,%llu,%s,%s,%ld,%ld,%s,%ld,%ld,%ld,%ld,%d,%.3f,%.3f,%.4f,%.1f,%d\n", (unsigned long long)size,
               (unsigned long long)params, mc->backend, mc->type, r->threads, r->ubatch, test, pp, tg, r->depth, r->batch,
               !o->no_kv, med, sd, 1e3 / med, tg && roofline > 0 ? roofline : 0.0, roofline < 0);
    } else {
        char roof[16] = "", sz[32], pr[32];
        /* past 100 %: decode read faster than the membw probe does (its plain loop
         * under-reads a machine whose kernels prefetch): marked, not a fraction */
        if (tg && roofline > 0) snprintf(roof, sizeof roof, roofline > 100 ? "%.0f %% > probe" : "%.0f %%", roofline);
        if (tg && roofline < 0) snprintf(roof, sizeof roof, "in LLC");
        fmt_size(sz, sizeof sz, mc->size_gib);
        fmt_params(pr, sizeof pr, mc->params_b);
        char nb[32] = "";
        if (o->show_ubatch) snprintf(nb, sizeof nb, " %7ld |", r->ubatch);
        printf("| %-*s | %10s | %9s | %-16s | %-5s | %7ld |%s %-6s | %5ld | %5ld | %4s | %12.2f ± %-8.2f | %10.3f | %8s |",
               o->w_model, mc->name, sz, pr, mc->backend, mc->type, r->threads, nb, test, r->depth, r->batch,
               o->no_kv ? "off" : o->kv_type ? o->kv_type : "on", med, sd, 1e3 / med, roof);
        if (tp_cols() && isnan(r->ar_ms)) printf(" %14s | %19s | %19s |", "-", "-", "-");
        else if (tp_cols()) printf(" %14.1f | %19.3f | %19.1f |", r->comm_kib, r->ar_ms, r->ar_us_layer);
        putchar('\n');
    }
    o->n_rows++;
    fflush(stdout);
}

/* One row: --reps runs of a test (prefill of n tokens, or n decode steps of
 * B sequences), median and standard deviation of tokens/s.  1 on failure. */
static int bench_row(struct bench_opts *o, struct kvllm_model *m, const struct model_cols *mc, int threads, double bw,
                     long ubatch, long depth, long n, long B, bool gen) {
    const struct kvllm_model_desc *md = kvllm_model_describe(m);
    const double wbytes = (double)md->weight_bytes;
    struct row r = { .threads = threads, .ubatch = eff_ubatch(ubatch), .pp = gen ? 0 : n, .tg = gen ? n : 0,
                     .depth = depth, .batch = B, .n = (int)o->reps };
    time_t now = time(NULL);
    struct tm tm;
    strftime(r.time, sizeof r.time, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    unsigned seed = 1234;
    struct comm_cost one, comm = { 0, 0 };
    for (long i = 0; i < o->reps; i++) {
        double dt = B > 1 ? run_batch_tg(m, depth, n, B, &seed) : run_once(m, o, ubatch, depth, n, gen, &seed, &one);
        if (dt < 0) return 1;
        r.ns[i] = dt * 1e9;
        r.tps[i] = (double)(n * B) / dt;
        if (B > 1) continue;
        comm.bytes += one.bytes;
        comm.all_reduce_s += one.all_reduce_s;
    }
    /* per token over every run (a batched row times part of the engine's work only: no figures there) */
    const double toks = (double)(n * o->reps);
    r.comm_kib = B == 1 ? comm.bytes / 1024.0 / toks : NAN;
    r.ar_ms = B == 1 ? comm.all_reduce_s * 1e3 / toks : NAN;
    r.ar_us_layer = B == 1 ? r.ar_ms * 1e3 / (md->n_layer > 0 ? md->n_layer : 1) : NAN;
    double var = 0, sorted[64];
    for (int i = 0; i < r.n; i++) r.mean += r.tps[i] / (double)r.n;
    for (int i = 0; i < r.n; i++) var += (r.tps[i] - r.mean) * (r.tps[i] - r.mean);
    r.sd = r.n > 1 ? sqrt(var / (double)(r.n - 1)) : 0;
    memcpy(sorted, r.tps, sizeof sorted);
    qsort(sorted, (size_t)r.n, sizeof *sorted, cmp_double);
    r.med = r.n % 2 ? sorted[r.n / 2] : 0.5 * (sorted[r.n / 2 - 1] + sorted[r.n / 2]);
    r.roofline = bw > 0 && !o->no_kv ? 100.0 * r.med / (double)B * wbytes / bw : 0;
    if (r.roofline > 0 && wbytes <= llc_bytes()) r.roofline = -1;   /* cache-resident: no memory roofline */
    print_row(o, mc, md->weight_bytes, md->n_params, &r);
    if (!o->svg_dir) return 0;
    struct plot_row pr = { .engine = "kvllm", .threads = threads, .pp = r.pp, .tg = r.tg, .depth = depth, .batch = B,
                           .tps = r.med };
    snprintf(pr.model, sizeof pr.model, "%s", mc->name);
    return plot_rows_add(&o->plot, &pr);
}

/* Rows nest as llama-bench's: threads, batch size, depth, then the tests
 * (every -p, then every -n with every --batch). */
static int bench_model(struct bench_opts *o, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    bool any_tg = false;
    for (int i = 0; i < o->n_tg; i++) any_tg |= o->tg[i] > 0;
    for (int ti = 0; ti < o->n_threads; ti++) {
        struct kvllm_model_params mp = kvllm_model_default_params();
        mp.n_threads = (int)o->threads[ti];
        struct kvllm_model *m;
        if (cli_model_load(path, &mp, &m)) return 1;
        const struct kvllm_model_desc *md = kvllm_model_describe(m);
        const struct model_cols mc = { .name = base, .path = path, .arch = md->arch, .type = md->weight_type, .backend = kvllm_model_backend(m),
                                       .size_gib = (double)md->weight_bytes / 1073741824.0,
                                       .params_b = (double)md->n_params / 1e9 };
        const double bw = any_tg ? read_bandwidth(mp.n_threads) : 0;
        int rc = 0;
        for (int ui = 0; ui < o->n_ubatch && !rc; ui++)
            for (int di = 0; di < o->n_depth && !rc; di++) {
                for (int pi = 0; pi < o->n_pp && !rc; pi++)
                    if (o->pp[pi] > 0)
                        rc = bench_row(o, m, &mc, mp.n_threads, bw, o->ubatch[ui], o->depth[di], o->pp[pi], 1, false);
                for (int gi = 0; gi < o->n_tg && !rc; gi++)
                    for (int bi = 0; bi < o->n_batch && !rc && o->tg[gi] > 0; bi++)
                        rc = bench_row(o, m, &mc, mp.n_threads, bw, o->ubatch[ui], o->depth[di], o->tg[gi],
                                       o->batch[bi], true);
            }
        kvllm_model_free(m);
        if (rc) return 1;
    }
    return 0;
}

/* One of bench model's options (a: its spelling as given, v: its value): 0 taken, -1 done (help printed),
 * 2 a bad value (printed). */
static int model_opt(struct bench_opts *o, int id, const char *a, const char *v) {
    switch (id) {
    case BM_HELP: cli_cmd_usage(&k_model_cmd, stdout); return -1;
    case BM_MODEL: snprintf(o->models, sizeof o->models, "%s", v); break;
    case BM_PP: if ((o->n_pp = cli_int_list(a, v, 0, 1 << 20, o->pp, MAX_LIST)) < 0) return 2; break;
    case BM_TG: if ((o->n_tg = cli_int_list(a, v, 0, 1 << 20, o->tg, MAX_LIST)) < 0) return 2; break;
    case BM_REPS: if (!cli_int(a, v, 1, 64, &o->reps)) return 2; break;
    case BM_THREADS: if ((o->n_threads = cli_int_list(a, v, 1, 1024, o->threads, MAX_LIST)) < 0) return 2; break;
    case BM_DEPTH: if ((o->n_depth = cli_int_list(a, v, 0, 1 << 20, o->depth, MAX_LIST)) < 0) return 2; break;
    case BM_BATCH: if ((o->n_batch = cli_int_list(a, v, 1, 4096, o->batch, MAX_LIST)) < 0) return 2; break;
    case BM_UBATCH:
        if ((o->n_ubatch = cli_int_list(a, v, 1, 1 << 16, o->ubatch, MAX_LIST)) < 0) return 2;
        o->show_ubatch = true;
        break;
    case BM_NO_KV: o->no_kv = true; break;
    case BM_KV_TYPE:
        if (!kv_type_known(v)) { cli_error("%s: expected f32, f16, bf16, int8 or fp8, got '%s'", a, v); return 2; }
        o->kv_type = v;
        break;
    case BM_SVG: o->svg_dir = v; break;
    case BM_COMPARE: o->compare = v; break;
    case BM_COMPARE_LABEL: o->compare_label = v; break;
    case BM_OUTPUT:
        if (!strcmp(v, "json")) o->fmt = FMT_JSON;
        else if (!strcmp(v, "jsonl")) o->fmt = FMT_JSONL;
        else if (!strcmp(v, "csv")) o->fmt = FMT_CSV;
        else if (!strcmp(v, "md")) o->fmt = FMT_MD;
        else { cli_error("-o: expected md, json, jsonl or csv, got '%s'", v); return 2; }
        break;
    }
    return 0;
}

static int bench_model_cmd(int argc, char **argv) {
    struct bench_opts o = { .reps = 5, .n_threads = 1, .n_depth = 1, .n_batch = 1, .n_pp = 1, .n_tg = 1, .n_ubatch = 1 };
    o.threads[0] = cpu_threads();
    o.depth[0] = 0;
    o.batch[0] = 1;
    o.pp[0] = 512;
    o.tg[0] = 128;
    o.ubatch[0] = 0;
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const struct cli_opt *op;
        const char *a = argv[i], *v;
        int m = cli_gpu_opt(argc, argv, &i);
        if (m < 0) return 2;
        if (m > 0) continue;
        if (cli_cmd_next(&k_model_cmd, argc, argv, &i, &op, &v) < 0) return 2;
        int rc = model_opt(&o, op->id, a, v);
        if (rc) return rc < 0 ? 0 : rc;
    }
    if (!cli_opt_end()) return 2;
    if (!*o.models) { cli_error("bench model: -m MODEL is required"); return 2; }
    if ((o.compare || o.compare_label) && !o.svg_dir) { cli_error("bench model: --compare draws charts: give --svg DIR"); return 2; }
    /* the compared rows are read first: a bad file fails before minutes of measuring */
    struct plot_rows other = { 0 };
    if (o.compare && plot_rows_read(&other, o.compare, o.compare_label)) return 1;
    kvllm_log_set_level(KVLLM_LOG_WARN);
    char list[1024];
    /* the model column as wide as the longest name */
    o.w_model = 5;
    snprintf(list, sizeof list, "%s", o.models);
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        const char *base = strrchr(p, '/');
        int w = (int)strlen(base ? base + 1 : p);
        if (w > o.w_model) o.w_model = w;
    }
    if (cli_tp_rank() == 0) print_header(&o);
    snprintf(list, sizeof list, "%s", o.models);
    int rc = 0;
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p && !rc; p = strtok_r(NULL, ",", &save))
        rc = bench_model(&o, p);
    print_footer(&o);
    for (int i = 0; !rc && i < other.n; i++) rc = plot_rows_add(&o.plot, &other.v[i]);
    if (!rc && o.svg_dir) rc = plot_write(&o.plot, o.svg_dir);
    plot_rows_free(&other);
    plot_rows_free(&o.plot);
    return rc;
}

/* ---- bench plot: the charts of rows measured before ---- */

enum { BP_HELP = 1, BP_SVG, BP_LABEL };

static const struct cli_opt k_plot_opts[] = {
    { BP_SVG, "--svg", "DIR", CLI_VALUE, "the folder the charts are written to" },
    { BP_LABEL, "--label", "NAME", CLI_VALUE, "the engine's name for llama-bench's rows (default llama.cpp)" },
    { BP_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_plot_group = CLI_GROUP(NULL, k_plot_opts);
static const struct cli_opt_group *const k_plot_groups[] = { &k_plot_group };

static const struct cli_cmd k_plot_cmd = {
    .name = "bench plot",
    .synopsis = "--svg DIR [--label NAME] FILE [FILE...]",
    .groups = CLI_GROUPS(k_plot_groups),
    .n_own = 1,
    .positional = true,
    .notes =
        "  draws bench rows read from JSON files as SVG charts in folder DIR (batch.svg, depth.svg, compare.svg):\n"
        "  kvllm bench model -o json|jsonl, llama-bench -o json|jsonl (engine NAME, default llama.cpp), and\n"
        "  bench/vs-llamacpp -o json (both engines)\n",
};

static int bench_plot_cmd(int argc, char **argv) {
    const char *dir = NULL, *label = NULL, *files[64];
    int n_files = 0;
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const struct cli_opt *op;
        const char *v;
        int m = cli_cmd_next(&k_plot_cmd, argc, argv, &i, &op, &v);
        if (m < 0) return 2;
        if (m == 0 && n_files == 64) { cli_error("bench plot: at most 64 files"); return 2; }
        if (m == 0) files[n_files++] = argv[i];
        else if (op->id == BP_HELP) { cli_cmd_usage(&k_plot_cmd, stdout); return 0; }
        else *(op->id == BP_SVG ? &dir : &label) = v;
    }
    if (!cli_opt_end()) return 2;
    if (!dir || !n_files) { cli_error("bench plot: --svg DIR and a FILE are required (see kvllm bench plot --help)"); return 2; }
    struct plot_rows rows = { 0 };
    int rc = 0;
    for (int i = 0; i < n_files && !rc; i++) rc = plot_rows_read(&rows, files[i], label);
    if (!rc) rc = plot_write(&rows, dir);
    plot_rows_free(&rows);
    return rc;
}

/* ---- bench throughput: the engine on an offline workload ---- */

enum { BT_HELP = 1, BT_MODEL, BT_REQUESTS, BT_PROMPT_LEN, BT_GEN_LEN, BT_SHARED, BT_SEED, BT_STATIC, BT_THREADS, BT_OUTPUT };

static const struct cli_opt k_tp_opts[] = {
    { BT_MODEL, "-m", "MODEL", CLI_VALUE, "GGUF file, Hugging Face folder or llama2.c checkpoint" },
    { BT_REQUESTS, "--requests", "M", CLI_VALUE, "requests (default 100)" },
    { BT_PROMPT_LEN, "--prompt-len", "A:B", CLI_VALUE, "prompt lengths, uniform (default 32:256)" },
    { BT_GEN_LEN, "--gen-len", "A:B", CLI_VALUE, "output lengths, uniform (default 16:128; EOS ignored)" },
    { BT_SHARED, "--shared-prefix", "L", CLI_VALUE, "every prompt starts with the same L tokens (default 0)" },
    { BT_SEED, "--seed", "S", CLI_VALUE, "workload seed (default 1)" },
    { BT_STATIC, "--static", NULL, CLI_FLAG, "static batching: a batch starts when the previous one has finished" },
    { BT_THREADS, "-t", "N", CLI_VALUE, "threads" },
    { BT_OUTPUT, "-o", "md|json", CLI_VALUE, "output format (default md)" },
    { BT_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_tp_group = CLI_GROUP(NULL, k_tp_opts);
static const struct cli_opt_group *const k_tp_groups[] = {
    &k_tp_group, &cli_engine_group, &cli_spec_group, &cli_tp_group,
};

static const struct cli_cmd k_tp_cmd = {
    .name = "bench throughput",
    .synopsis = "-m MODEL [options] [engine options]",
    .groups = CLI_GROUPS(k_tp_groups),
    .n_own = 1,
};

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
        if (!cli_opt_split(argv, i)) return 2;
        const struct cli_opt *op;
        const char *a = argv[i], *v;
        int eo = cli_engine_opt(argc, argv, &i, &ep);
        if (eo < 0) return 2;
        if (eo > 0) continue;
        if (cli_cmd_next(&k_tp_cmd, argc, argv, &i, &op, &v) < 0) return 2;
        switch (op->id) {
        case BT_HELP: cli_cmd_usage(&k_tp_cmd, stdout); return 0;
        case BT_STATIC: is_static = true; break;
        case BT_MODEL: model = v; break;
        case BT_REQUESTS: if (!cli_int(a, v, 1, 1 << 20, &n_req)) return 2; break;
        case BT_PROMPT_LEN: if (!cli_range(a, v, 1, 1 << 20, &p_lo, &p_hi)) return 2; break;
        case BT_GEN_LEN: if (!cli_range(a, v, 1, 1 << 20, &g_lo, &g_hi)) return 2; break;
        case BT_SHARED: if (!cli_int(a, v, 0, 1 << 20, &shared)) return 2; break;
        case BT_SEED: if (!cli_int(a, v, 0, 1L << 31, &seed)) return 2; break;
        case BT_THREADS: if (!cli_int(a, v, 1, 1024, &threads)) return 2; break;
        case BT_OUTPUT:
            if (!strcmp(v, "json")) json = true;
            else if (strcmp(v, "md")) { cli_error("-o: expected md or json, got '%s'", v); return 2; }
            break;
        }
    }
    if (!cli_opt_end()) return 2;
    if (!model) { cli_error("bench throughput: -m MODEL is required"); return 2; }
    if (shared > p_lo) { cli_error("--shared-prefix %ld is longer than the shortest prompt (%ld)", shared, p_lo); return 2; }
    kvllm_log_set_level(KVLLM_LOG_WARN);
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.n_threads = (int)threads;
    struct kvllm_model *m;
    if (cli_model_load(model, &mp, &m)) return 1;
    const int V = kvllm_model_describe(m)->n_vocab;
    if (ep.n_ctx <= 0 && p_hi + g_hi > kvllm_model_describe(m)->n_ctx_train) ep.n_ctx = (int)(p_hi + g_hi);
    struct kvllm_engine *e = NULL;
    int32_t *toks = malloc((size_t)p_hi * sizeof *toks), *prefix = malloc((size_t)(shared + 1) * sizeof *prefix);
    unsigned rs = (unsigned)seed;
    for (long i = 0; i < shared; i++) prefix[i] = (int32_t)(3 + tp_rand(&rs) % (unsigned)(V - 3));
    struct tp_count cnt = { 0 };
    int rc = !toks || !prefix ? KVLLM_ENOMEM : cli_spec_setup(&ep, mp.n_threads) ? KVLLM_EINVAL
           : kvllm_engine_new(m, &ep, &e);
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
                   "\"static\": %s, \"steps\": %llu, \"blocks_total\": %d, \"block_size\": %d, "
                   "\"spec_drafted\": %llu, \"spec_accepted\": %llu, \"spec_acceptance_pct\": %.3f}\n",
                   rps, tps, ops, mb, util, waste, ideal, hit, (unsigned long long)st.preemptions, n_req, dt,
                   is_static ? "true" : "false", (unsigned long long)st.steps, st.blocks_total, st.block_size,
                   (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_accepted,
                   st.spec_drafted ? 100.0 * (double)st.spec_accepted / (double)st.spec_drafted : 0.0);
        else
            printf("| batching | requests/s | tokens/s | output tok/s | mean batch | KV util %% | KV waste %% "
                   "(ideal) | prefix hit %% | preemptions |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
                   "| %s | %.3f | %.1f | %.1f | %.2f | %.1f | %.2f (%.2f) | %.1f | %llu |\n",
                   is_static ? "static" : "continuous", rps, tps, ops, mb, util, waste, ideal, hit,
                   (unsigned long long)st.preemptions);
        cli_spec_report(e, &ep);
    }
    free(toks);
    free(prefix);
    kvllm_engine_free(e);
    kvllm_model_free(ep.draft_model);
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

enum { BX_HELP = 1, BX_MODEL, BX_PROMPT_LEN, BX_CACHED_PCT, BX_REPS, BX_THREADS };

static const struct cli_opt k_prefix_opts[] = {
    { BX_MODEL, "-m", "MODEL", CLI_VALUE, "GGUF file, Hugging Face folder or llama2.c checkpoint" },
    { BX_PROMPT_LEN, "--prompt-len", "N", CLI_VALUE, "prompt tokens (default 1024)" },
    { BX_CACHED_PCT, "--cached-pct", "P", CLI_VALUE, "share of the prompt already cached, in % (default 90)" },
    { BX_REPS, "--reps", "R", CLI_VALUE, "repetitions; the median is shown (default 5)" },
    { BX_THREADS, "-t", "N", CLI_VALUE, "threads" },
    { BX_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_prefix_group = CLI_GROUP(NULL, k_prefix_opts);
static const struct cli_opt_group *const k_prefix_groups[] = {
    &k_prefix_group, &cli_engine_group, &cli_spec_group, &cli_tp_group,
};

static const struct cli_cmd k_prefix_cmd = {
    .name = "bench prefix",
    .synopsis = "-m MODEL [--prompt-len N] [--cached-pct P] [--reps R] [-t N] [engine options]",
    .groups = CLI_GROUPS(k_prefix_groups),
    .n_own = 1,
    .notes = "  time to first token of an N-token prompt (default 1024) whose first P % (default 90) is\n"
             "  already in the prefix cache, against the same prompt cold\n",
};

static int bench_prefix_cmd(int argc, char **argv) {
    const char *model = NULL;
    long n = 1024, pct = 90, reps = 5, threads = 0;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const struct cli_opt *op;
        const char *a = argv[i], *v;
        int eo = cli_engine_opt(argc, argv, &i, &ep);
        if (eo < 0) return 2;
        if (eo > 0) continue;
        if (cli_cmd_next(&k_prefix_cmd, argc, argv, &i, &op, &v) < 0) return 2;
        switch (op->id) {
        case BX_HELP: cli_cmd_usage(&k_prefix_cmd, stdout); return 0;
        case BX_MODEL: model = v; break;
        case BX_PROMPT_LEN: if (!cli_int(a, v, 2, 1 << 20, &n)) return 2; break;
        case BX_CACHED_PCT: if (!cli_int(a, v, 0, 99, &pct)) return 2; break;
        case BX_REPS: if (!cli_int(a, v, 1, 64, &reps)) return 2; break;
        case BX_THREADS: if (!cli_int(a, v, 1, 1024, &threads)) return 2; break;
        }
    }
    if (!cli_opt_end()) return 2;
    if (!model) { cli_error("bench prefix: -m MODEL is required"); return 2; }
    kvllm_log_set_level(KVLLM_LOG_WARN);
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.n_threads = (int)threads;
    struct kvllm_model *m;
    if (cli_model_load(model, &mp, &m)) return 1;
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

enum { BW_HELP = 1, BW_THREADS };

static const struct cli_opt k_membw_opts[] = {
    { BW_THREADS, "-t, --threads", "LIST", CLI_VALUE, "thread counts, e.g. 1,4 (default: 1 and all CPUs)" },
    { BW_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_membw_group = CLI_GROUP(NULL, k_membw_opts);
static const struct cli_opt_group *const k_membw_groups[] = { &k_membw_group };

static const struct cli_cmd k_membw_cmd = {
    .name = "bench membw",
    .synopsis = "[--threads LIST]",
    .groups = CLI_GROUPS(k_membw_groups),
    .n_own = 1,
    .notes = "  read bandwidth (GB/s) over 512 MiB, best of 5\n",
};

static int bench_membw_cmd(int argc, char **argv) {
    long list[MAX_LIST] = { 1, cpu_threads() };
    int n = cpu_threads() > 1 ? 2 : 1;
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const struct cli_opt *op;
        const char *a = argv[i], *v;
        if (cli_cmd_next(&k_membw_cmd, argc, argv, &i, &op, &v) < 0) return 2;
        if (op->id == BW_HELP) { cli_cmd_usage(&k_membw_cmd, stdout); return 0; }
        if ((n = cli_int_list(a, v, 1, 256, list, MAX_LIST)) < 0) return 2;
    }
    if (!cli_opt_end()) return 2;
    printf("| threads | read GB/s |\n|---:|---:|\n");
    for (int i = 0; i < n; i++) printf("| %ld | %.1f |\n", list[i], read_bandwidth((int)list[i]) / 1e9);
    return 0;
}

/* The benchmarks, in the order `kvllm bench --help` and the reference list them. */
static const struct cli_cmd *const k_bench_cmds[] = {
    &k_model_cmd, &k_tp_cmd, &k_prefix_cmd, &bench_serve_cli, &k_membw_cmd, &k_plot_cmd,
};

void cmd_bench_markdown(FILE *f) {
    for (size_t k = 0; k < sizeof k_bench_cmds / sizeof *k_bench_cmds; k++) cli_cmd_markdown(k_bench_cmds[k], f);
}

int cmd_bench(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "membw")) return bench_membw_cmd(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "prefix")) return bench_prefix_cmd(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "serve")) return bench_serve_cmd(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "model")) return bench_model_cmd(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "throughput")) return bench_throughput_cmd(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "plot")) return bench_plot_cmd(argc - 1, argv + 1);
    if (argc < 2 || cli_is_help(argv[1])) {
        FILE *f = argc < 2 ? stderr : stdout;
        fputs("usage: kvllm bench KIND [options]   (kvllm bench KIND --help for each)\n"
              "  model       prompt processing and generation speed, as llama-bench\n"
              "  throughput  the engine on an offline workload (continuous or static batching)\n"
              "  prefix      time to first token with a cached prefix against cold\n"
              "  serve       load generator against a running server (kvllm serve, llama-server, vLLM)\n"
              "  membw       memory read bandwidth (the decode roofline)\n"
              "  plot        SVG charts of rows measured before (kvllm's, llama-bench's, bench/vs-llamacpp's JSON)\n\n", f);
        if (argc < 2) return 2;
        /* each benchmark's usage line and own options (the engine's: kvllm bench throughput --help) */
        for (size_t k = 0; k < sizeof k_bench_cmds / sizeof *k_bench_cmds; k++) {
            const struct cli_cmd *c = k_bench_cmds[k];
            printf("%susage: kvllm %s %s\n", k ? "\n" : "", c->name, c->synopsis);
            cli_opts_usage(stdout, c->groups, c->n_own);
            if (c->notes) fputs(c->notes, stdout);
        }
        return 0;
    }
    cli_error("bench: expected a benchmark kind: model, throughput, prefix, serve, membw or plot (see kvllm bench --help)");
    return 2;
}
