/* server.h — `kvllm serve`: an OpenAI-compatible HTTP server over the
 * continuous-batching engine (POST /v1/completions, /v1/chat/completions,
 * GET /v1/models, /health, /metrics).
 *
 * Lifecycle: server_start brings HTTP up at once, so /health answers 503
 * while the caller loads the model; server_ready hands over the model and
 * engine and starts the engine thread; server_stop stops accepting, aborts
 * whatever runs and joins every thread; then the caller frees the engine and
 * model, and finally the server. */
#ifndef KVLLM_SERVER_H
#define KVLLM_SERVER_H

#include "kvllm.h"

#include <stddef.h>

struct server_params {
    const char *host;           /* address to bind ("127.0.0.1") */
    int port;                   /* 0: any free port (see server_port) */
    const char *api_key;        /* NULL: no authentication */
    const char *model_id;       /* what /v1/models lists and requests may name */
    const char *chat_template;  /* template text; NULL: the model's own */
    size_t max_body;            /* request bodies above this get 413 (0: 1 MiB) */
};

struct server;

/* Copies p's strings.  Returns 0, KVLLM_EIO (cannot bind, logged) or
 * KVLLM_ENOMEM; on error *out is NULL. */
int server_start(const struct server_params *p, struct server **out);
/* The port actually bound. */
int server_port(const struct server *s);
/* Serve `engine` over `model` (both stay the caller's and must outlive
 * server_stop); n_ctx is the engine's context length.  Starts the engine
 * thread.  Returns 0 or KVLLM_ENOMEM. */
int server_ready(struct server *s, struct kvllm_model *model, struct kvllm_engine *engine, int n_ctx);
/* Stop accepting, abort running requests, join the HTTP and engine threads.
 * Idempotent. */
void server_stop(struct server *s);
/* NULL-safe; stops first if needed. */
void server_free(struct server *s);

#endif
