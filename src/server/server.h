/* server.h — `kvllm serve`: an OpenAI-compatible HTTP server over the
 * continuous-batching engine (POST /v1/completions, /v1/chat/completions,
 * GET /v1/models, /health, /metrics), with llama-server's and vLLM's extras
 * (POST /completion, /tokenize, /detokenize; GET /props, /version) and CORS.
 *
 * Lifecycle: server_start brings HTTP up at once, so /health answers 503
 * while the caller loads the model; server_ready hands over the model and
 * engine and starts the engine thread; server_drain (on SIGTERM) refuses new
 * completions with 503 and makes /health say "draining" while the running
 * ones finish (server_running counts them); server_stop ends what still runs
 * (streams with an error event and [DONE], whole responses with 503), stops
 * HTTP and joins every thread; then the caller frees the engine and model,
 * and finally the server. */
#ifndef KVLLM_SERVER_H
#define KVLLM_SERVER_H

#include "kvllm.h"
#include "server/kv_events.h"

#include <stddef.h>

struct server_params {
    const char *host;           /* address to bind ("127.0.0.1") */
    int port;                   /* 0: any free port (see server_port) */
    const char *api_key;        /* NULL: no authentication */
    const char *model_id;       /* what /v1/models lists and requests may name */
    const char *chat_template;  /* template text; NULL: the model's own */
    size_t max_body;            /* request bodies above this get 413 (0: 1 MiB) */
    bool special_in_content;    /* control-token text in chat messages becomes control tokens (the
                                 * reference behaviour); default: read as text (kvllm_chat_tokenize) */
    bool metrics_public;        /* /metrics without the API key */
    double header_timeout;      /* seconds from accept (or the previous answer) to complete headers (0: 10) */
    double body_timeout;        /* seconds from the headers to a complete body (0: 30) */
    double idle_timeout;        /* seconds a keep-alive or stalled connection may stay silent (0: 30) */
    int max_conns;              /* connections; more are answered 503 (0: 4096, fewer if file descriptors are short) */
    int max_conns_per_client;   /* connections from one address; more are answered 503 (0: 1024) */
    const char *allowed_origins;  /* CORS: comma-separated origins, or "*"; NULL: none (no CORS headers) */
    bool log_json;              /* log lines as JSON objects (one per line) instead of text */
    double log_interval;        /* seconds between engine lines while busy (0: none) */
    int max_seqs;               /* the engine's sequences at once, for /props (0: unknown) */
    const char *version, *commit;   /* for /version and /props (NULL: "unknown") */
    /* How tool calls are read out of answers: "hermes", "llama3", "mistral", "none" (no tool
     * calling); NULL or "auto": detected from the chat template's text (toolcall_detect). */
    const char *tool_call_format;
    /* KV-cache events for routers (kv_events.h); endpoint NULL: off */
    struct kv_events_params kv_events;
};

struct server;

/* Copies p's strings.  Returns 0, KVLLM_EIO (cannot bind, logged),
 * KVLLM_EINVAL (an unknown tool_call_format, logged) or KVLLM_ENOMEM; on
 * error *out is NULL. */
int server_start(const struct server_params *p, struct server **out);
/* The port actually bound. */
int server_port(const struct server *s);
/* Serve `engine` over `model` (both stay the caller's and must outlive
 * server_stop); n_ctx is the engine's context length.  Starts the engine
 * thread.  Returns 0 or KVLLM_ENOMEM. */
int server_ready(struct server *s, struct kvllm_model *model, struct kvllm_engine *engine, int n_ctx);
/* Refuse new completions (503) and report "draining" on /health; running
 * requests go on.  Connections are still accepted, so clients and load
 * balancers can see that. */
void server_drain(struct server *s);
/* Completion requests not yet answered in full (running, queued or still
 * sending). */
int server_running(struct server *s);
/* End running requests (an error event and [DONE] for streams, 503 for
 * whole responses; up to a few seconds for those answers to go out), stop
 * HTTP, join the engine thread.  Idempotent. */
void server_stop(struct server *s);
/* Whether the engine failed for good (a tensor-parallel rank lost): the
 * server then answers 503 and /health "failed", and has sent its process
 * SIGTERM so that it stops and exits non-zero. */
bool server_failed(struct server *s);
/* A log line through the server's sink (text or JSON, as --log-format). */
void server_log(struct server *s, enum kvllm_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* NULL-safe; stops first if needed. */
void server_free(struct server *s);

#endif
