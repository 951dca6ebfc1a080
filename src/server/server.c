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
#include "server/toolcall.h"
#include "core/core.h"

#include <json-c/json.h>
#ifdef __GLIBC__
#include <malloc.h>
#include <signal.h>
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* ---- logging ---- */

/* "2025-01-31T12:00:00.123Z" */
static void iso_time(char *buf, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, cap - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

static const char *const k_level[] = { "error", "warning", "info", "debug" };

/* One JSON object per line: {"ts", "level", then o's fields}; takes o. */
static void emit_json(enum kvllm_log_level level, json_object *o) {
    char ts[40];
    iso_time(ts, sizeof ts);
    json_object *line = json_object_new_object();
    json_object_object_add(line, "ts", json_object_new_string(ts));
    json_object_object_add(line, "level", json_object_new_string(k_level[level]));
    json_object_object_foreach(o, k, v) json_object_object_add(line, k, json_object_get(v));
    json_object_put(o);
    const char *str = json_object_to_json_string_ext(line, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    if (str) fprintf(stderr, "%s\n", str);
    json_object_put(line);
}

static void log_sink(enum kvllm_log_level level, const char *msg, void *user) {
    static const char *tag[] = { "error: ", "warning: ", "", "debug: " };
    const struct server *s = user;
    if (s && s->log_json) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "msg", json_object_new_string(msg));
        emit_json(level, o);
        return;
    }
    fprintf(stderr, "kvllm: %s%s\n", tag[level], msg);
}

void server_log(struct server *s, enum kvllm_log_level level, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_sink(level, msg, s);
}

void server_log_request(struct server *s, const char *id, unsigned status, int n_prompt, int n_cached, int n_gen,
                        double ttft, double gen_s, const char *finish, double total_s, const char *why) {
    double tps = n_gen > 1 && gen_s > 0 ? (n_gen - 1) / gen_s : 0;
    if (s->log_json) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "event", json_object_new_string("request"));
        json_object_object_add(o, "id", json_object_new_string(id));
        json_object_object_add(o, "status", json_object_new_int((int)status));
        json_object_object_add(o, "prompt_tokens", json_object_new_int(n_prompt));
        json_object_object_add(o, "cached_tokens", json_object_new_int(n_cached));
        json_object_object_add(o, "output_tokens", json_object_new_int(n_gen));
        json_object_object_add(o, "ttft_ms", ttft >= 0 ? json_object_new_double(ttft * 1e3) : NULL);
        json_object_object_add(o, "tokens_per_s", json_object_new_double(tps));
        json_object_object_add(o, "finish_reason", finish ? json_object_new_string(finish) : NULL);
        json_object_object_add(o, "duration_ms", json_object_new_double(total_s * 1e3));
        if (why) json_object_object_add(o, "error", json_object_new_string(why));
        emit_json(status >= 500 ? KVLLM_LOG_WARN : KVLLM_LOG_INFO, o);
        return;
    }
    char t[32] = "-";
    if (ttft >= 0) snprintf(t, sizeof t, "%.1f ms", ttft * 1e3);
    fprintf(stderr, "kvllm: request %s: %u, prompt %d tokens (%d cached), output %d tokens, ttft %s, %.1f tok/s, "
                    "finish %s, %.3f s%s%s\n", id, status, n_prompt, n_cached, n_gen, t, tps, finish ? finish : "-", total_s,
            why ? ": " : "", why ? why : "");
}

/* The engine line: what runs and waits, the KV pool, throughput since the last line. */
static void log_engine(struct server *s, const struct kvllm_engine_stats *st, double prompt_tps, double gen_tps) {
    double kv = st->blocks_total ? 100.0 * st->blocks_held / st->blocks_total : 0;
    if (s->log_json) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "event", json_object_new_string("engine"));
        json_object_object_add(o, "running", json_object_new_int(st->n_running));
        json_object_object_add(o, "waiting", json_object_new_int(st->n_waiting));
        json_object_object_add(o, "kv_used_pct", json_object_new_double(kv));
        json_object_object_add(o, "prompt_tokens_per_s", json_object_new_double(prompt_tps));
        json_object_object_add(o, "generation_tokens_per_s", json_object_new_double(gen_tps));
        json_object_object_add(o, "preemptions", json_object_new_int64((int64_t)st->preemptions));
        emit_json(KVLLM_LOG_INFO, o);
        return;
    }
    fprintf(stderr, "kvllm: engine: running %d, waiting %d, KV %.1f%% used (%d of %d blocks), prompt %.1f tok/s, "
                    "generation %.1f tok/s, %llu preemptions\n", st->n_running, st->n_waiting, kv, st->blocks_held,
            st->blocks_total, prompt_tps, gen_tps, (unsigned long long)st->preemptions);
}

const char *server_cors_origin(const struct server *s, const char *origin) {
    if (!s->allowed_origins || !origin || !*origin) return NULL;
    const char *p = s->allowed_origins;
    size_t n = strlen(origin);
    while (*p) {
        while (*p == ',' || *p == ' ') p++;
        size_t k = strcspn(p, ", ");
        if (k == 1 && *p == '*') return "*";
        if (k == n && !strncasecmp(p, origin, n)) return origin;
        p += k;
    }
    return NULL;
}

const char *server_chat_template(const struct server *s, size_t *len) {
    if (s->chat_template) {
        *len = strlen(s->chat_template);
        return s->chat_template;
    }
    *len = 0;
    return kvllm_model_chat_template(s->model, len, NULL);
}

/* ---- the engine thread ---- */

void server_release_memory(void) {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

/* Blocks of 256 KiB and more (a grammar matcher's tables, a large response)
 * are mapped and unmapped on their own.  glibc's default threshold rises to
 * the size of any mapped block freed, after which such blocks come from the
 * arenas, and what the engine thread freed there stayed resident. */
static void map_large_blocks(void) {
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
#endif
}

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

int server_engine_call(struct server *s, void (*fn)(struct server *s, void *arg), void *arg) {
    if (atomic_load(&s->state) == SRV_LOADING) return KVLLM_EBUSY;
    struct engine_call c = { fn, arg, false, 0 };
    pthread_mutex_lock(&s->mu);
    while (s->call && !s->engine_exited) pthread_cond_wait(&s->call_cv, &s->mu);
    if (s->engine_exited) {
        pthread_mutex_unlock(&s->mu);
        return KVLLM_EBUSY;
    }
    s->call = &c;
    s->kick = true;
    pthread_cond_signal(&s->cv);
    while (!c.done) pthread_cond_wait(&s->call_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return c.rc;
}

/* The engine thread's side: run the waiting call (taken from s->call under s->mu) and say so. */
static void engine_run_call(struct server *s, struct engine_call *c) {
    if (!c) return;
    c->fn(s, c->arg);
    pthread_mutex_lock(&s->mu);
    c->done = true;
    s->call = NULL;
    pthread_cond_broadcast(&s->call_cv);
    pthread_mutex_unlock(&s->mu);
}

/* The engine thread ends: a call still waiting is told so, and none is taken from now on. */
static void engine_exit_calls(struct server *s) {
    pthread_mutex_lock(&s->mu);
    s->engine_exited = true;
    if (s->call) {
        s->call->rc = KVLLM_EBUSY;
        s->call->done = true;
        s->call = NULL;
    }
    pthread_cond_broadcast(&s->call_cv);
    pthread_mutex_unlock(&s->mu);
}

static void *engine_main(void *arg) {
    struct server *s = arg;
    /* the engine line: throughput over the interval, printed while busy */
    double t_line = time_now();
    uint64_t prompt0 = s->stats.prompt_tokens - s->stats.cached_tokens, gen0 = 0;
    bool busy = false;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->kick && s->idle && !s->engine_stop) pthread_cond_wait(&s->cv, &s->mu);
        bool done = s->engine_stop && s->idle && !s->kick, woke = s->idle;
        uint64_t prompt_now = s->stats.prompt_tokens - s->stats.cached_tokens;
        struct engine_call *call = s->call;
        s->kick = false;
        pthread_mutex_unlock(&s->mu);
        if (done) break;
        engine_run_call(s, call);
        if (woke) {   /* busy again after idling: the interval starts now */
            t_line = time_now();
            prompt0 = prompt_now;
            pthread_mutex_lock(&s->metrics.mu);
            gen0 = s->metrics.generated_tokens;
            pthread_mutex_unlock(&s->metrics.mu);
        }

        int n = kvllm_engine_step(s->engine);
        kv_events_step_done(s->kv_events); /* the step's KV events go out as one batch */
        if (n < 0 && !kvllm_engine_failed(s->engine)) LOG_ERR("engine step failed: %s", kvllm_strerror(n));
        if (kvllm_engine_failed(s->engine) && !atomic_exchange(&s->failed, true)) {
            atomic_store(&s->state, SRV_FAILED);
            /* its requests were ended with errors; /health says "failed", and the process is told to
             * stop (the main thread waits for signals) and exits non-zero (server_failed) */
            LOG_ERR("the engine cannot compute any more: stopping");
            kill(getpid(), SIGTERM);
        }
        struct kvllm_engine_stats st;
        kvllm_engine_get_stats(s->engine, &st);
        bool idle = kvllm_engine_idle(s->engine);
        pthread_mutex_lock(&s->mu);
        s->stats = st;
        s->idle = idle;
        pthread_mutex_unlock(&s->mu);
        /* what the finished requests left in this thread's arena (matchers' history, a grammar's
         * tables), given back once per busy period rather than kept until the next large request */
        if (idle) server_release_memory();
        busy |= n > 0;
        double now = time_now();
        if (s->log_interval > 0 && now - t_line >= s->log_interval) {
            pthread_mutex_lock(&s->metrics.mu);
            uint64_t gen = s->metrics.generated_tokens;
            pthread_mutex_unlock(&s->metrics.mu);
            uint64_t prompt = st.prompt_tokens - st.cached_tokens;
            if (busy) log_engine(s, &st, (double)(prompt - prompt0) / (now - t_line), (double)(gen - gen0) / (now - t_line));
            t_line = now;
            prompt0 = prompt;
            gen0 = gen;
            busy = !idle;
        }
        /* a step that computed nothing with requests pending (all waiting on
         * something) must not spin */
        if ((n <= 0) && !idle) nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
    }
    engine_exit_calls(s);
    return NULL;
}

/* ---- lifecycle ---- */

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

int server_start(const struct server_params *p, struct server **out) {
    *out = NULL;
    int tf = p->tool_call_format && strcmp(p->tool_call_format, "auto") ? toolcall_format_from_name(p->tool_call_format)
                                                                         : TOOLCALL_NONE;
    if (tf < 0) {
        LOG_ERR("--tool-call-format: '%s' is not auto, hermes, llama3, mistral or none", p->tool_call_format);
        return KVLLM_EINVAL;
    }
    map_large_blocks();
    struct server *s = calloc(1, sizeof *s);
    if (!s) return KVLLM_ENOMEM;
    s->host = strdup(p->host ? p->host : "127.0.0.1");
    s->api_key = dup_or_null(p->api_key && *p->api_key ? p->api_key : NULL);
    s->model_id = strdup(p->model_id ? p->model_id : "default");
    s->chat_template = dup_or_null(p->chat_template);
    s->special_in_content = p->special_in_content;
    s->tool_format = tf;
    s->tool_format_forced = p->tool_call_format && strcmp(p->tool_call_format, "auto");
    s->max_body = p->max_body ? p->max_body : (size_t)1 << 20;
    s->metrics_public = p->metrics_public;
    s->header_timeout = p->header_timeout > 0 ? p->header_timeout : 10;
    s->body_timeout = p->body_timeout > 0 ? p->body_timeout : 30;
    s->idle_timeout = p->idle_timeout > 0 ? p->idle_timeout : 30;
    s->max_conns = p->max_conns > 0 ? p->max_conns : 4096;
    s->max_conns_per_client = p->max_conns_per_client > 0 ? p->max_conns_per_client : 1024;
    s->allowed_origins = dup_or_null(p->allowed_origins && *p->allowed_origins ? p->allowed_origins : NULL);
    s->log_json = p->log_json;
    s->log_interval = p->log_interval;
    s->max_seqs = p->max_seqs;
    s->version = strdup(p->version ? p->version : "unknown");
    s->commit = strdup(p->commit ? p->commit : "unknown");
    s->port = p->port;
    s->created = time(NULL);
    s->idle = true;
    atomic_init(&s->state, SRV_LOADING);
    atomic_init(&s->failed, false);
    atomic_init(&s->next_id, 1);
    atomic_init(&s->n_jobs, 0);
    atomic_init(&s->watch_stop, false);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->peers_mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->call_cv, NULL);
    metrics_init(&s->metrics);
    if (!s->host || !s->model_id || !s->version || !s->commit || (p->api_key && *p->api_key && !s->api_key) || (p->chat_template && !s->chat_template)) {
        server_free(s);
        return KVLLM_ENOMEM;
    }
    kvllm_log_set(log_sink, s);
    if (p->kv_events.endpoint) {
        const struct kv_events_params *kp = &p->kv_events;
        s->kv_endpoint = strdup(kp->endpoint);
        s->kv_replay_endpoint = dup_or_null(kp->replay_endpoint);
        s->kv_topic = strdup(kp->topic ? kp->topic : "");
        int krc = !s->kv_endpoint || !s->kv_topic || (kp->replay_endpoint && !s->kv_replay_endpoint)
                  ? KVLLM_ENOMEM : kv_events_new(kp, &s->kv_events);
        if (krc) { server_free(s); return krc; }
    }
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
    if (!s->tool_format_forced) {   /* the template's text says how its model calls tools */
        size_t len = 0;
        const char *t = server_chat_template(s, &len);
        char *z = t && !s->chat_template ? strndup(t, len) : NULL;
        if (t && !s->chat_template && !z) return KVLLM_ENOMEM;
        s->tool_format = toolcall_detect(z ? z : t);
        free(z);
    }
    if (s->kv_events) {
        int rc = kv_events_attach(s->kv_events, engine);
        if (rc) return rc;
    }
    if (pthread_create(&s->engine_thread, NULL, engine_main, s)) return KVLLM_ENOMEM;
    s->engine_started = true;
    atomic_store(&s->state, SRV_READY);
    return 0;
}

bool server_failed(struct server *s) { return atomic_load(&s->failed); }

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
    kv_events_free(s->kv_events); /* after the engine's last step: what it told is sent */
    s->kv_events = NULL;
}

void server_free(struct server *s) {
    if (!s) return;
    server_stop(s);
    kvllm_log_set(NULL, NULL);
    metrics_deinit(&s->metrics);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->call_cv);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->peers_mu);
    free(s->host);
    free(s->api_key);
    free(s->model_id);
    free(s->chat_template);
    free(s->allowed_origins);
    free(s->kv_endpoint);
    free(s->kv_replay_endpoint);
    free(s->kv_topic);
    free(s->version);
    free(s->commit);
    free(s);
}
