/* server_internal.h — the server's shared state, seen by its own files only. */
#ifndef KVLLM_SERVER_INTERNAL_H
#define KVLLM_SERVER_INTERNAL_H

#include "server/server.h"
#include "server/metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

struct MHD_Daemon;
struct MHD_Connection;

/* LOADING -> READY -> DRAINING (no new completions, /health 503) -> STOPPING
 * (what still runs is ended: error event or 503) */
enum server_state { SRV_LOADING, SRV_READY, SRV_DRAINING, SRV_STOPPING, SRV_FAILED /* the engine computes no more */ };

struct peer;
struct job;
struct server;

/* Work for the engine thread between two steps (server_engine_call). */
struct engine_call {
    void (*fn)(struct server *s, void *arg);
    void *arg;
    bool done;   /* under s->mu */
    int rc;      /* 0: fn ran; KVLLM_EBUSY: the engine thread ended first */
};

struct server {
    char *host, *api_key, *model_id, *chat_template;
    size_t max_body;
    bool special_in_content;          /* kvllm_chat_tokenize's flag (--special-in-content) */
    int tool_format;                  /* enum toolcall_format: --tool-call-format, else detected at server_ready */
    bool tool_format_forced;
    bool metrics_public;
    double header_timeout, body_timeout, idle_timeout;   /* seconds */
    int max_conns, max_conns_per_client;
    char *allowed_origins;            /* CORS list ("a,b" or "*"); NULL: none */
    bool log_json;
    double log_interval;
    int max_seqs;
    char *version, *commit;
    struct MHD_Daemon *d;
    int port;
    time_t created;
    atomic_int state;
    atomic_bool failed;             /* the engine failed for good (server_failed) */
    atomic_uint_fast64_t next_id;     /* response ids and default seeds */

    struct kvllm_model *model;        /* set by server_ready */
    struct kvllm_engine *engine;
    int n_ctx, n_vocab, pool_tokens;

    pthread_t engine_thread;
    bool engine_started;
    pthread_mutex_t mu;               /* guards the fields below */
    pthread_cond_t cv;
    bool kick, idle, engine_stop;
    struct kvllm_engine_stats stats;  /* snapshot after each step (get_stats is engine-thread only) */
    struct engine_call *call;         /* waiting for the engine thread (NULL: none) */
    pthread_cond_t call_cv;           /* a call was done, or its slot freed */
    bool engine_exited;

    struct metrics metrics;
    struct kv_events *kv_events;      /* --kv-events (NULL: off); endpoints kept for /kv_event_sources */
    char *kv_endpoint, *kv_replay_endpoint, *kv_topic;

    /* connections (http.c): one peer per socket, for limits, deadlines and
     * noticing a client that left while its request waits on the engine */
    pthread_mutex_t peers_mu;         /* guards the list, every peer's fields and peer<->job links */
    struct peer *peers, *peers_tail;  /* doubly linked, newest first */
    int n_peers;                      /* within the limits (over-limit peers are not counted) */
    int n_over;                       /* past a limit, still open */
    pthread_t watch_thread;
    bool watch_started;
    atomic_bool watch_stop;
    atomic_int n_jobs;                /* completion requests not yet answered in full */
};

/* CORS: the Access-Control-Allow-Origin value for a request from `origin`
 * (NULL: none, the origin is not allowed or there is no CORS at all). */
const char *server_cors_origin(const struct server *s, const char *origin);
/* One line per finished request (--log-format): fields as given; why (NULL:
 * none) is the error message the client was told. */
void server_log_request(struct server *s, const char *id, unsigned status, int n_prompt, int n_cached, int n_gen,
                        double ttft, double gen_s, const char *finish, double total_s, const char *why);

/* Give the memory a large request freed back to the system.  glibc keeps
 * what a thread freed in that thread's arena (and, after a large block was
 * freed, serves blocks of that size from the heap instead of mapping them),
 * so the 300 KB body of one request, its JSON and its grammar would stay
 * resident for good on the polling thread that parsed them.  A few
 * milliseconds: called after requests that were large, never per token. */
#define SERVER_RELEASE_BYTES ((size_t)64 << 10)
void server_release_memory(void);

/* The chat template conversations are rendered with: --chat-template, else
 * the model's own or the built-in one of its family (kvllm_model_chat_template);
 * *len bytes, not NUL-terminated; NULL when there is none. */
const char *server_chat_template(const struct server *s, size_t *len);

/* Wake the engine thread: a request was added or aborted. */
void server_kick(struct server *s);
/* The engine's stats as of its last step; false while loading. */
bool server_stats(struct server *s, struct kvllm_engine_stats *st);
/* Run fn(s, arg) on the engine thread between two steps and wait for it:
 * for reading engine-thread state beyond the stats snapshot.  The caller
 * blocks until the step under way ends (one at a time: a second caller
 * waits for the first), so this is for debug endpoints, not the request
 * path.  0 once fn ran; KVLLM_EBUSY (fn not run) while loading or after the
 * engine thread ended. */
int server_engine_call(struct server *s, void (*fn)(struct server *s, void *arg), void *arg);


/* http.c: the MHD daemon. */
int http_start(struct server *s);
void http_stop(struct server *s);
/* End every request still waiting on the engine (drain's last step): their
 * jobs are cancelled as a shutdown, so streams end with an error event and
 * [DONE], whole responses with 503.  Waits up to `wait_s` for the answers to
 * go out, then wakes whatever is still suspended (MHD must not be stopped
 * with a suspended connection). */
void http_end_requests(struct server *s, double wait_s);
/* Watch c's socket while j waits on the engine: a client that closed is
 * noticed within a poll interval and j is cancelled.  Takes a job reference
 * (dropped by http_unwatch or when the connection closes). */
void http_watch(struct server *s, struct MHD_Connection *c, struct job *j);
void http_unwatch(struct server *s, struct job *j);
/* Open connections: within the limits, and accepted over them (to be
 * answered 503 unless a slot frees first). */
void http_connections(struct server *s, int *counted, int *over);
/* Suspend / resume a connection (resume is thread-safe; suspend only from
 * MHD's callbacks for that connection). */
void http_suspend(struct MHD_Connection *c);
void http_resume(struct MHD_Connection *c);

/* MHD_NO / MHD_YES, for files that do not include microhttpd.h: what an
 * access handler returns (NO closes the connection). */
enum { HTTP_NO = 0, HTTP_YES = 1 };

/* handlers.c: one function per endpoint; each queues a response and returns
 * MHD's result. body is NUL-terminated (len bytes).  handle_completion may
 * instead suspend the connection with its state in *pending: MHD calls the
 * access handler again once the engine resumed it, which hands *pending to
 * handle_pending (until that answers and clears it); pending_free drops the
 * state of a connection that closed meanwhile.  http11: the request was
 * HTTP/1.1 (an interim response may be sent to probe the client). */
enum api_kind { API_COMPLETION, API_CHAT, API_LLAMA };   /* /v1/completions, /v1/chat/completions, /completion */
int handle_completion(struct server *s, struct MHD_Connection *c, enum api_kind kind, const char *body, size_t len,
                      bool http11, void **pending);
int handle_tokenize(struct server *s, struct MHD_Connection *c, const char *body, size_t len);
int handle_detokenize(struct server *s, struct MHD_Connection *c, const char *body, size_t len);
int handle_version(struct server *s, struct MHD_Connection *c);
int handle_props(struct server *s, struct MHD_Connection *c);
int handle_pending(struct server *s, struct MHD_Connection *c, void **pending);
void pending_free(void *pending);
int handle_models(struct server *s, struct MHD_Connection *c, const char *id);
int handle_health(struct server *s, struct MHD_Connection *c);
int handle_metrics(struct server *s, struct MHD_Connection *c);
/* Answer o (taken) as JSON. */
struct json_object;
int send_json(struct MHD_Connection *c, unsigned status, struct json_object *o);
/* fleet.c: GET endpoints routers and gateways probe (/kv_event_sources, /get_load, /get_server_info,
 * /server_info, /get_model_info, /health_generate), answered for url. */
int handle_fleet(struct server *s, struct MHD_Connection *c, const char *url);

/* Responses (http.c).  http_send takes ownership of body (malloc'd). */
int http_send(struct MHD_Connection *c, unsigned status, const char *content_type, char *body);
/* The same with one extra header (hname NULL: none). */
int http_send_hdr(struct MHD_Connection *c, unsigned status, const char *content_type, char *body,
                  const char *hname, const char *hval);
/* An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}}. */
int http_error(struct MHD_Connection *c, unsigned status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Queue a streaming (SSE) response read from `reader` (returns bytes, or -1
 * at the end, -2 to drop the connection); takes ownership of cls: free_cb
 * runs when the response is done or the client left, even on error. */
int http_stream(struct MHD_Connection *c, ssize_t (*reader)(void *cls, uint64_t pos, char *buf, size_t max),
                void *cls, void (*free_cb)(void *cls));

#endif
