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

enum server_state { SRV_LOADING, SRV_READY, SRV_STOPPING };

struct server {
    char *host, *api_key, *model_id, *chat_template;
    size_t max_body;
    struct MHD_Daemon *d;
    int port;
    time_t created;
    atomic_int state;
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

    struct metrics metrics;
};

/* Wake the engine thread: a request was added or aborted. */
void server_kick(struct server *s);
/* The engine's stats as of its last step; false while loading. */
bool server_stats(struct server *s, struct kvllm_engine_stats *st);

/* The last error the library logged on this thread (cleared by reading):
 * engine and tokenizer errors carry the numbers a client should see. */
const char *server_last_error(void);
void server_clear_error(void);

/* http.c: the MHD daemon. */
int http_start(struct server *s);
void http_stop(struct server *s);

/* handlers.c: one function per endpoint; each queues a response and returns
 * MHD's result. body is NUL-terminated (len bytes). */
int handle_completion(struct server *s, struct MHD_Connection *c, bool chat, const char *body, size_t len);
int handle_models(struct server *s, struct MHD_Connection *c, const char *id);
int handle_health(struct server *s, struct MHD_Connection *c);
int handle_metrics(struct server *s, struct MHD_Connection *c);

/* Responses (http.c).  http_send takes ownership of body (malloc'd). */
int http_send(struct MHD_Connection *c, unsigned status, const char *content_type, char *body);
/* An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}}. */
int http_error(struct MHD_Connection *c, unsigned status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The connection's socket (for noticing a disconnect while waiting). */
int http_conn_fd(struct MHD_Connection *c);
/* Queue a streaming (SSE) response read from `reader` (returns bytes, or -1
 * at the end, -2 to drop the connection); takes ownership of cls: free_cb
 * runs when the response is done or the client left, even on error. */
int http_stream(struct MHD_Connection *c, ssize_t (*reader)(void *cls, uint64_t pos, char *buf, size_t max),
                void *cls, void (*free_cb)(void *cls));

#endif
