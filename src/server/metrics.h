/* metrics.h — the server's counters and latency histograms, rendered in
 * Prometheus text format for GET /metrics.
 *
 * Counters are bumped from two sides: HTTP threads (request outcomes, prompt
 * tokens at admission) and the engine thread (generated tokens, time to first
 * token, inter-token latency).  One mutex guards everything; each update is a
 * few additions, so contention is not a concern next to a forward pass. */
#ifndef KVLLM_SERVER_METRICS_H
#define KVLLM_SERVER_METRICS_H

#include "kvllm.h"

#include <pthread.h>
#include <stdint.h>

/* Why a completion request ended, for kvllm_requests_total{outcome=...}. */
enum metrics_outcome {
    OUTCOME_SUCCESS,       /* answered 200 (finished by stop or length) */
    OUTCOME_ABORTED,       /* the client went away, or the server shut down */
    OUTCOME_CLIENT_ERROR,  /* 4xx other than 429 */
    OUTCOME_BUSY,          /* 429: the engine queue was full */
    OUTCOME_SERVER_ERROR,  /* 5xx */
    OUTCOME_COUNT
};

#define METRICS_TTFT_BUCKETS 16
#define METRICS_ITL_BUCKETS 15

struct histogram {
    const double *le;          /* (n) upper bounds, ascending; +Inf implied */
    int n;
    uint64_t counts[20];       /* (n + 1): per bucket, not cumulative */
    double sum;
    uint64_t count;
};

struct metrics {
    pthread_mutex_t mu;
    uint64_t requests[OUTCOME_COUNT];
    uint64_t prompt_tokens, generated_tokens;
    struct histogram ttft, itl;
};

void metrics_init(struct metrics *m);
void metrics_deinit(struct metrics *m);
void metrics_request(struct metrics *m, enum metrics_outcome o);
void metrics_prompt_tokens(struct metrics *m, uint64_t n);
/* One generated token: ttft >= 0 when it is a request's first (seconds since
 * the request arrived), itl >= 0 the gap since the same sample's previous. */
void metrics_token(struct metrics *m, double ttft, double itl);

/* Render everything (plus the engine's gauges from st, NULL while loading,
 * and the open connections: within the limits, and over them) as Prometheus
 * text, under kvllm's names and again, where the meaning is the same, under
 * vLLM's (vllm:num_requests_running, vllm:kv_cache_usage_perc,
 * vllm:prefix_cache_queries_total, ...) labelled model_name as vLLM labels
 * them.  Returns a malloc'd string or NULL (out of memory). */
char *metrics_render(struct metrics *m, const struct kvllm_engine_stats *st, int conns_counted, int conns_over,
                     const char *model_name);

#endif
