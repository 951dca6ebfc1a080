/* server.c — the server's lifecycle and its engine thread.
 *
 * One engine thread owns the engine: it runs kvllm_engine_step while there is
 * work and sleeps on a condition variable otherwise; HTTP threads only call
 * the engine's thread-safe kvllm_engine_add / kvllm_engine_abort and then
 * kick it.  kvllm_engine_get_stats is not thread-safe, so the engine thread
 * snapshots the stats after every step for /metrics.
 *
 * Shutdown order matters: requests still running are cancelled first and
 * answered (the engine thread must still run to deliver their finishing
 * events, and no connection may stay suspended when MHD stops), then HTTP
 * stops, then the engine thread exits when idle, so no job is left waiting
 * for an event that will never come. */
#include "server/server_internal.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- logging: errors are also remembered per thread for the client ---- */

static _Thread_local char t_last_error[512];

const char *server_last_error(void) { return t_last_error; }
void server_clear_error(void) { t_last_error[0] = 0; }

static void log_sink(enum kvllm_log_level level, const char *msg, void *user) {
    static const char *tag[] = { "error: ", "warning: ", "", "debug: " };
    if (level == KVLLM_LOG_ERROR) snprintf(t_last_error, sizeof t_last_error, "%s", msg);
    fprintf(stderr, "kvllm: %s%s\n", tag[level], msg);
}

/* ---- the engine thread ---- */

void server_kick(struct server *s) {
    pthread_mutex_lock(&s->mu);
    s->kick = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

bool server_stats(struct server *s, struct kvllm_engine_stats *st) {
    if (atomic_load(&s->state) == SRV_LOADING) return false;
    pthread_mutex_lock(&s->mu);
    *st = s->stats;
    pthread_mutex_unlock(&s->mu);
    return true;
}

static void *engine_main(void *arg) {
    struct server *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->kick && s->idle && !s->engine_stop) pthread_cond_wait(&s->cv, &s->mu);
        bool done = s->engine_stop && s->idle && !s->kick;
        s->kick = false;
        pthread_mutex_unlock(&s->mu);
        if (done) break;

        int n = kvllm_engine_step(s->engine);
        if (n < 0) LOG_ERR("engine step failed: %s", kvllm_strerror(n));
        struct kvllm_engine_stats st;
        kvllm_engine_get_stats(s->engine, &st);
        bool idle = kvllm_engine_idle(s->engine);
        pthread_mutex_lock(&s->mu);
        s->stats = st;
        s->idle = idle;
        pthread_mutex_unlock(&s->mu);
        /* a step that computed nothing with requests pending (all waiting on
         * something) must not spin */
        if ((n <= 0) && !idle) nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
    }
    return NULL;
}

/* ---- lifecycle ---- */

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

int server_start(const struct server_params *p, struct server **out) {
    *out = NULL;
    struct server *s = calloc(1, sizeof *s);
    if (!s) return KVLLM_ENOMEM;
    s->host = strdup(p->host ? p->host : "127.0.0.1");
    s->api_key = dup_or_null(p->api_key && *p->api_key ? p->api_key : NULL);
    s->model_id = strdup(p->model_id ? p->model_id : "default");
    s->chat_template = dup_or_null(p->chat_template);
    s->special_in_content = p->special_in_content;
    s->max_body = p->max_body ? p->max_body : (size_t)1 << 20;
    s->metrics_public = p->metrics_public;
    s->header_timeout = p->header_timeout > 0 ? p->header_timeout : 10;
    s->body_timeout = p->body_timeout > 0 ? p->body_timeout : 30;
    s->idle_timeout = p->idle_timeout > 0 ? p->idle_timeout : 30;
    s->max_conns = p->max_conns > 0 ? p->max_conns : 4096;
    s->max_conns_per_client = p->max_conns_per_client > 0 ? p->max_conns_per_client : 1024;
    s->port = p->port;
    s->created = time(NULL);
    s->idle = true;
    atomic_init(&s->state, SRV_LOADING);
    atomic_init(&s->next_id, 1);
    atomic_init(&s->n_jobs, 0);
    atomic_init(&s->watch_stop, false);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->peers_mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    metrics_init(&s->metrics);
    if (!s->host || !s->model_id || (p->api_key && *p->api_key && !s->api_key) || (p->chat_template && !s->chat_template)) {
        server_free(s);
        return KVLLM_ENOMEM;
    }
    kvllm_log_set(log_sink, NULL);
    int rc = http_start(s);
    if (rc) { server_free(s); return rc; }
    *out = s;
    return 0;
}

int server_port(const struct server *s) { return s->port; }

int server_ready(struct server *s, struct kvllm_model *model, struct kvllm_engine *engine, int n_ctx) {
    s->model = model;
    s->engine = engine;
    s->n_ctx = n_ctx;
    s->n_vocab = kvllm_model_describe(model)->n_vocab;
    /* the engine thread does not run yet: reading the stats here is safe */
    kvllm_engine_get_stats(engine, &s->stats);
    s->pool_tokens = s->stats.blocks_total * s->stats.block_size;
    if (pthread_create(&s->engine_thread, NULL, engine_main, s)) return KVLLM_ENOMEM;
    s->engine_started = true;
    atomic_store(&s->state, SRV_READY);
    return 0;
}

void server_drain(struct server *s) {
    int ready = SRV_READY;
    atomic_compare_exchange_strong(&s->state, &ready, SRV_DRAINING);
}

int server_running(struct server *s) { return atomic_load(&s->n_jobs); }

/* How long server_stop waits for the answers of the requests it ends. */
#define END_WAIT_S 5.0

void server_stop(struct server *s) {
    if (!s) return;
    atomic_store(&s->state, SRV_STOPPING);
    if (s->d && s->engine_started) http_end_requests(s, END_WAIT_S);
    http_stop(s);
    if (s->engine_started) {
        pthread_mutex_lock(&s->mu);
        s->engine_stop = true;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->engine_thread, NULL);
        s->engine_started = false;
    }
}

void server_free(struct server *s) {
    if (!s) return;
    server_stop(s);
    kvllm_log_set(NULL, NULL);
    metrics_deinit(&s->metrics);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->peers_mu);
    free(s->host);
    free(s->api_key);
    free(s->model_id);
    free(s->chat_template);
    free(s);
}
