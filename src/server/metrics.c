/* metrics.c — counters, histograms and their Prometheus text rendering. */
#include "server/metrics.h"
#include "core/strbuf.h"

#include <stdlib.h>
#include <string.h>

/* Buckets as vLLM exports them, so dashboards built for it read ours. */
static const double k_ttft_le[METRICS_TTFT_BUCKETS] = { 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                                        0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0 };
static const double k_itl_le[METRICS_ITL_BUCKETS] = { 0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                                      0.2,   0.3,   0.4,  0.5,   0.75, 1.0,   2.5 };

static const char *const k_outcome[OUTCOME_COUNT] = { "success", "aborted", "client_error", "busy", "server_error" };

void metrics_init(struct metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->ttft = (struct histogram){ .le = k_ttft_le, .n = METRICS_TTFT_BUCKETS };
    m->itl = (struct histogram){ .le = k_itl_le, .n = METRICS_ITL_BUCKETS };
}

void metrics_deinit(struct metrics *m) { pthread_mutex_destroy(&m->mu); }

static void hist_observe(struct histogram *h, double v) {
    int b = 0;
    while (b < h->n && v > h->le[b]) b++;
    h->counts[b]++;
    h->sum += v;
    h->count++;
}

void metrics_request(struct metrics *m, enum metrics_outcome o) {
    pthread_mutex_lock(&m->mu);
    m->requests[o]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_prompt_tokens(struct metrics *m, uint64_t n) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += n;
    pthread_mutex_unlock(&m->mu);
}

void metrics_token(struct metrics *m, double ttft, double itl) {
    pthread_mutex_lock(&m->mu);
    m->generated_tokens++;
    if (ttft >= 0) hist_observe(&m->ttft, ttft);
    if (itl >= 0) hist_observe(&m->itl, itl);
    pthread_mutex_unlock(&m->mu);
}

/* labels: "" or `k="v"` pairs with a trailing comma, put before le. */
static void render_hist(struct strbuf *b, const char *name, const char *help, const char *labels,
                        const struct histogram *h) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->counts[i];
        sb_printf(b, "%s_bucket{%sle=\"%g\"} %llu\n", name, labels, h->le[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n];
    size_t nl = strlen(labels);
    /* the sum and count take the same labels, without le: drop the trailing comma */
    sb_printf(b, "%s_bucket{%sle=\"+Inf\"} %llu\n%s_sum%s%.*s%s %.6f\n%s_count%s%.*s%s %llu\n", name, labels,
              (unsigned long long)cum, name, nl ? "{" : "", (int)(nl ? nl - 1 : 0), labels, nl ? "}" : "", h->sum,
              name, nl ? "{" : "", (int)(nl ? nl - 1 : 0), labels, nl ? "}" : "", (unsigned long long)h->count);
}

/* The model name as a Prometheus label value (backslash, quote and newline escaped). */
static void label_value(struct strbuf *b, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"') { sb_put(b, "\\", 1); sb_put(b, v, 1); }
        else if (*v == '\n') sb_puts(b, "\\n");
        else sb_put(b, v, 1);
    }
}

/* The same quantities under vLLM's names and its model_name label, for the dashboards and gateways
 * (the Gateway API Inference Extension's endpoint picker) that read a vLLM server; counters are
 * rendered as prometheus_client renders them (TYPE without _total, the sample with it).  Caller
 * holds m->mu. */
static void render_vllm(struct strbuf *b, const struct metrics *m, const struct kvllm_engine_stats *st,
                        const char *model_name) {
    struct strbuf lb = { 0 };
    sb_puts(&lb, "model_name=\"");
    label_value(&lb, model_name ? model_name : "");
    sb_puts(&lb, "\",");
    if (lb.oom) { b->oom = true; sb_free(&lb); return; }
    const char *L = lb.s;
    const int nl = (int)lb.len - 1; /* without the trailing comma */
    const double usage = st->blocks_total ? (double)st->blocks_held / (double)st->blocks_total : 0.0;
    static const struct { const char *name, *type, *help; } k[] = {
        { "vllm:num_requests_running", "gauge", "Number of requests in model execution batches." },
        { "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed." },
        { "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage." },
        { "vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage (vLLM's older name of kv_cache_usage_perc)." },
        { "vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens." },
        { "vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens." },
        { "vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine." },
        { "vllm:prompt_tokens", "counter", "Number of prefill tokens processed." },
        { "vllm:generation_tokens", "counter", "Number of generation tokens processed." },
        { "vllm:request_success", "counter", "Count of successfully processed requests." },
    };
    const double v[] = { st->n_running, st->n_waiting, usage, usage, (double)st->prompt_tokens,
                         (double)st->cached_tokens, (double)st->preemptions, (double)m->prompt_tokens,
                         (double)m->generated_tokens, (double)m->requests[OUTCOME_SUCCESS] };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        bool counter = k[i].type[0] == 'c';
        sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s%s{%.*s} %.17g\n", k[i].name, k[i].help, k[i].name, k[i].type,
                  k[i].name, counter ? "_total" : "", nl, L, v[i]);
    }
    sb_printf(b, "# HELP vllm:cache_config_info Information of the KV cache.\n# TYPE vllm:cache_config_info gauge\n"
                 "vllm:cache_config_info{%sblock_size=\"%d\",num_gpu_blocks=\"%d\",enable_prefix_caching=\"True\"} 1\n",
              L, st->block_size, st->blocks_total);
    render_hist(b, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", L, &m->ttft);
    render_hist(b, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", L, &m->itl);
    sb_free(&lb);
}

char *metrics_render(struct metrics *m, const struct kvllm_engine_stats *st, int conns_counted, int conns_over,
                     const char *model_name) {
    struct strbuf b = { 0 };
    struct kvllm_engine_stats z = { 0 };
    if (!st) st = &z; /* the engine's gauges: zero while the model is still loading */
    pthread_mutex_lock(&m->mu);
    sb_puts(&b, "# HELP kvllm_requests_total Completion requests by how they ended.\n"
                "# TYPE kvllm_requests_total counter\n");
    for (int o = 0; o < OUTCOME_COUNT; o++)
        sb_printf(&b, "kvllm_requests_total{outcome=\"%s\"} %llu\n", k_outcome[o],
                  (unsigned long long)m->requests[o]);
    sb_printf(&b,
              "# HELP kvllm_prompt_tokens_total Prompt tokens of admitted requests.\n"
              "# TYPE kvllm_prompt_tokens_total counter\nkvllm_prompt_tokens_total %llu\n"
              "# HELP kvllm_generated_tokens_total Tokens generated.\n"
              "# TYPE kvllm_generated_tokens_total counter\nkvllm_generated_tokens_total %llu\n",
              (unsigned long long)m->prompt_tokens, (unsigned long long)m->generated_tokens);
    render_hist(&b, "kvllm_time_to_first_token_seconds", "Time from a request's arrival to its first token.", "",
                &m->ttft);
    render_hist(&b, "kvllm_inter_token_latency_seconds", "Time between successive tokens of one sample.", "", &m->itl);
    render_vllm(&b, m, st, model_name);
    pthread_mutex_unlock(&m->mu);

    double hit = st->prompt_tokens ? (double)st->cached_tokens / (double)st->prompt_tokens : 0.0;
    sb_printf(&b,
              "# HELP kvllm_requests_running Sequences in the running batch.\n"
              "# TYPE kvllm_requests_running gauge\nkvllm_requests_running %d\n"
              "# HELP kvllm_requests_waiting Sequences waiting for admission.\n"
              "# TYPE kvllm_requests_waiting gauge\nkvllm_requests_waiting %d\n"
              "# HELP kvllm_kv_blocks KV cache blocks: held by live sequences, cached for prefix reuse, free.\n"
              "# TYPE kvllm_kv_blocks gauge\n"
              "kvllm_kv_blocks{state=\"held\"} %d\nkvllm_kv_blocks{state=\"cached\"} %d\n"
              "kvllm_kv_blocks{state=\"free\"} %d\n"
              "# HELP kvllm_prefix_cache_hit_ratio Prompt tokens served by the prefix cache / prompt tokens.\n"
              "# TYPE kvllm_prefix_cache_hit_ratio gauge\nkvllm_prefix_cache_hit_ratio %.6f\n"
              "# HELP kvllm_preemptions_total Sequences preempted to free KV blocks.\n"
              "# TYPE kvllm_preemptions_total counter\nkvllm_preemptions_total %llu\n"
              "# HELP kvllm_steps_planned_ahead_total Steps planned while the previous one ran (asynchronous "
              "scheduling).\n"
              "# TYPE kvllm_steps_planned_ahead_total counter\nkvllm_steps_planned_ahead_total %llu\n",
              st->n_running, st->n_waiting, st->blocks_held, st->blocks_cached, st->blocks_free, hit,
              (unsigned long long)st->preemptions, (unsigned long long)st->steps_planned_ahead);
    /* KV bytes, and the sliding-window layers' own pool when the model has one */
    sb_printf(&b,
              "# HELP kvllm_kv_bytes KV storage of every layer: allocated, and held by live sequences.\n"
              "# TYPE kvllm_kv_bytes gauge\nkvllm_kv_bytes{state=\"allocated\"} %llu\n"
              "kvllm_kv_bytes{state=\"held\"} %llu\n",
              (unsigned long long)st->kv_bytes, (unsigned long long)st->kv_bytes_held);
    if (st->win_blocks_total)
        sb_printf(&b,
                  "# HELP kvllm_kv_window_blocks Sliding-window layers' KV blocks (their window only; kvllm_kv_blocks "
                  "counts the global layers'): held, cached, free.\n"
                  "# TYPE kvllm_kv_window_blocks gauge\n"
                  "kvllm_kv_window_blocks{state=\"held\"} %d\nkvllm_kv_window_blocks{state=\"cached\"} %d\n"
                  "kvllm_kv_window_blocks{state=\"free\"} %d\n",
                  st->win_blocks_held, st->win_blocks_cached,
                  st->win_blocks_total - st->win_blocks_held - st->win_blocks_cached);
    /* speculative decoding (vLLM names its counters spec_decode_num_draft_tokens / _accepted_tokens) */
    double acc = st->spec_drafted ? (double)st->spec_accepted / (double)st->spec_drafted : 0.0;
    sb_printf(&b,
              "# HELP kvllm_spec_draft_tokens_total Draft tokens verified (speculative decoding).\n"
              "# TYPE kvllm_spec_draft_tokens_total counter\nkvllm_spec_draft_tokens_total %llu\n"
              "# HELP kvllm_spec_accepted_tokens_total Draft tokens accepted.\n"
              "# TYPE kvllm_spec_accepted_tokens_total counter\nkvllm_spec_accepted_tokens_total %llu\n"
              "# HELP kvllm_spec_acceptance_rate Draft tokens accepted / verified (0 without speculation).\n"
              "# TYPE kvllm_spec_acceptance_rate gauge\nkvllm_spec_acceptance_rate %.6f\n",
              (unsigned long long)st->spec_drafted, (unsigned long long)st->spec_accepted, acc);
    sb_printf(&b,
              "# HELP kvllm_http_connections Open connections: within the limits, and accepted over one.\n"
              "# TYPE kvllm_http_connections gauge\n"
              "kvllm_http_connections{state=\"counted\"} %d\nkvllm_http_connections{state=\"over_limit\"} %d\n",
              conns_counted, conns_over);
    if (b.oom) { free(b.s); return NULL; }
    return sb_take(&b);
}
