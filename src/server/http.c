/* http.c — libmicrohttpd glue: the daemon, connections and their limits,
 * routing, authentication, request bodies (with the size limit) and response
 * helpers.
 *
 * MHD runs a small pool of polling threads (epoll), so an idle or trickling
 * socket costs a file descriptor and a few hundred bytes, never a thread.  No
 * handler blocks: a completion request that waits on the engine suspends its
 * connection (handlers.c, job.c) and the engine thread resumes it.  MHD calls
 * the access handler first with the headers only, then once per chunk of
 * body, then once more with none; we decide routing and authentication at
 * the first call but answer errors only after the body was read, so the
 * client sees the response instead of a reset connection (closing a socket
 * with unread data sends RST).
 *
 * Every socket has a `struct peer` (MHD's socket context) on one list, which
 * a watcher thread walks every WATCH_MS: it enforces the header, body and
 * idle deadlines that MHD's inactivity timeout cannot (a client trickling a
 * byte a second is never inactive) by shutting the socket down, and it polls
 * the sockets of requests waiting on the engine for a peer that closed
 * (POLLRDHUP: probe; POLLHUP / POLLERR: gone), because MHD does not watch a
 * suspended connection.  Connections past --max-connections, or past
 * --max-connections-per-client from one address, are still accepted (up to
 * a margin) so that they can be answered 503 rather than reset; one that
 * sends its headers takes the slot of the oldest socket that has sent none
 * (evict_incomplete), so trickling sockets cannot hold every slot. */
#include "server/server_internal.h"
#include "server/job.h"
#include "core/strbuf.h"
#include "core/core.h"

#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>

/* Bodies above this are not even drained: the connection is closed. */
#define DRAIN_LIMIT ((uint64_t)64 << 20)
/* The watcher's period: the bound on noticing a vanished client and on
 * overrunning a deadline. */
#define WATCH_MS 50
/* A connection past a limit gets this long (at most) to send its headers
 * and be told 503. */
#define OVER_HEADER_S 2.0
/* MHD polling threads: handlers parse and tokenize (milliseconds), so a few
 * keep one slow request from delaying the rest. */
#define POLL_THREADS 4
/* Each connection's memory pool (headers, read buffer).  MHD takes pools of
 * up to 32 KiB from malloc, and those, freed at every close between the
 * requests' small allocations, fragmented the polling threads' arenas: RSS
 * grew ~300 B a request without end (docs/RELIABILITY.md).  Above 32 KiB
 * MHD maps each pool and unmaps it at the close. */
#define CONN_POOL_BYTES (64 * 1024)
/* File descriptors kept for everything but client sockets. */
#define FD_RESERVE 128

enum route {
    R_NONE, R_HEALTH, R_METRICS, R_MODELS, R_MODEL, R_COMPLETIONS, R_CHAT,
    R_LLAMA, R_TOKENIZE, R_DETOKENIZE, R_VERSION, R_PROPS, R_EMBEDDINGS, R_OPTIONS, R_FLEET,
};

static const struct {
    const char *path;
    bool prefix;            /* path + "{id}" */
    const char *method;
    enum route route;
} k_routes[] = {
    { "/health", false, "GET", R_HEALTH },
    { "/metrics", false, "GET", R_METRICS },
    { "/v1/models", false, "GET", R_MODELS },
    { "/v1/models/", true, "GET", R_MODEL },
    { "/v1/completions", false, "POST", R_COMPLETIONS },
    { "/v1/chat/completions", false, "POST", R_CHAT },
    /* llama-server's and vLLM's extras */
    { "/completion", false, "POST", R_LLAMA },
    { "/completions", false, "POST", R_LLAMA },
    { "/tokenize", false, "POST", R_TOKENIZE },
    { "/detokenize", false, "POST", R_DETOKENIZE },
    { "/version", false, "GET", R_VERSION },
    { "/props", false, "GET", R_PROPS },
    { "/v1/embeddings", false, "POST", R_EMBEDDINGS },
    { "/embeddings", false, "POST", R_EMBEDDINGS },
    { "/embedding", false, "POST", R_EMBEDDINGS },
    /* what routers probe (fleet.c) */
    { "/kv_event_sources", false, "GET", R_FLEET },
    { "/get_load", false, "GET", R_FLEET },
    { "/get_server_info", false, "GET", R_FLEET },
    { "/server_info", false, "GET", R_FLEET },
    { "/get_model_info", false, "GET", R_FLEET },
    { "/health_generate", false, "GET", R_FLEET },
    { "/debug/kv/blocks", false, "GET", R_FLEET },
};

/* What a preflight may ask for, and what it is told. */
#define CORS_METHODS "GET, HEAD, POST, OPTIONS"
#define CORS_HEADERS "Authorization, Content-Type"
#define CORS_MAX_AGE "600"

/* Where a connection is in its current request, for the deadlines. */
enum phase {
    PH_HEADERS,   /* accepted, headers not complete: --header-timeout */
    PH_BODY,      /* headers read, body not complete: --body-timeout */
    PH_BUSY,      /* being answered (maybe waiting on the engine): no deadline */
    PH_IDLE,      /* keep-alive between requests: idle + header timeout */
    PH_CLOSING,   /* shut down by the watcher */
};

/* Per-socket state (MHD's socket context); every field under s->peers_mu. */
struct peer {
    struct peer *prev, *next;
    int fd;
    unsigned char ip[16];   /* the client's address (4 or 16 bytes), for the per-client cap */
    int ip_len;
    bool over;              /* past a limit: answered 503, not counted in n_peers (until promoted) */
    enum phase phase;
    double t_phase;         /* when the phase began */
    struct job *job;        /* waiting on the engine: watched for a vanished client (holds a reference) */
    const struct server *srv;   /* for the CORS headers of every response */
};

/* Per-request state, from the first call of the access handler to the
 * request-completed notification. */
struct conn {
    enum route route;
    unsigned status;        /* non-zero: answer this error once the body is read */
    const char *code, *hname, *hval;
    bool close;             /* answer with Connection: close */
    char message[256];
    struct strbuf body;
    uint64_t n_body;        /* bytes received, kept or not */
    void *pending;          /* handlers.c's state while the connection is suspended */
    bool own_timeout;       /* resume_first set this connection's timeout (restored at the end) */
};

/* ---- responses ---- */

static struct peer *peer_of(struct MHD_Connection *c);

/* CORS: a request from an allowed origin gets Access-Control-Allow-Origin
 * (and Vary: Origin when the answer depends on it); any other gets nothing. */
static void add_cors(struct MHD_Connection *c, struct MHD_Response *r) {
    struct peer *p = peer_of(c);
    if (!p || !p->srv || !p->srv->allowed_origins) return;
    const char *allow = server_cors_origin(p->srv, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"));
    if (p->srv->allowed_origins && strcmp(p->srv->allowed_origins, "*"))
        MHD_add_response_header(r, "Vary", "Origin");
    if (!allow) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", allow);
    MHD_add_response_header(r, "Access-Control-Expose-Headers", "Retry-After, WWW-Authenticate");
}

static int send_with(struct MHD_Connection *c, unsigned status, const char *ctype, char *body, const char *hname,
                     const char *hval, bool close) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(body); return MHD_NO; }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (hname) MHD_add_response_header(r, hname, hval);
    if (close) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    add_cors(c, r);
    int ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

int http_send(struct MHD_Connection *c, unsigned status, const char *content_type, char *body) {
    return send_with(c, status, content_type, body, NULL, NULL, false);
}

int http_send_hdr(struct MHD_Connection *c, unsigned status, const char *content_type, char *body,
                  const char *hname, const char *hval) {
    return send_with(c, status, content_type, body, hname, hval, false);
}

static int error_with(struct MHD_Connection *c, unsigned status, const char *code, const char *param,
                      const char *hname, const char *hval, bool close, const char *msg) {
    /* OpenAI's error shape by hand (handlers build theirs with json-c);
     * code and param are our own identifiers, the message is escaped */
    struct strbuf b = { 0 };
    sb_puts(&b, "{\"error\": {\"message\": \"");
    for (const char *p = msg; *p; p++) {
        if (*p == '"' || *p == '\\') { sb_put(&b, "\\", 1); sb_put(&b, p, 1); }
        else if ((unsigned char)*p < 0x20) sb_printf(&b, "\\u%04x", (unsigned char)*p);
        else sb_put(&b, p, 1);
    }
    const char *type = status == 401 ? "authentication_error" : status == 429 ? "rate_limit_error"
                     : status == 403 ? "permission_error" : status == 501 ? "not_implemented_error"
                     : status == 503 ? "service_unavailable" : status >= 500 ? "server_error" : "invalid_request_error";
    sb_printf(&b, "\", \"type\": \"%s\", \"param\": ", type);
    if (param) sb_printf(&b, "\"%s\"", param); else sb_puts(&b, "null");
    sb_puts(&b, ", \"code\": ");
    if (code) sb_printf(&b, "\"%s\"", code); else sb_puts(&b, "null");
    sb_puts(&b, "}}");
    char *body = sb_take(&b);
    if (!body) return MHD_NO;
    return send_with(c, status, "application/json", body, hname, hval, close);
}

int http_error(struct MHD_Connection *c, unsigned status, const char *code, const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* the message may quote a client's path or model name */
    struct strbuf clean = { 0 };
    utf8_sanitize(&clean, msg, strlen(msg));
    int ret = error_with(c, status, code, param, NULL, NULL, false, clean.s ? clean.s : "");
    sb_free(&clean);
    return ret;
}

int http_stream(struct MHD_Connection *c, ssize_t (*reader)(void *cls, uint64_t pos, char *buf, size_t max), void *cls,
                void (*free_cb)(void *cls)) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, reader, cls, free_cb);
    if (!r) { free_cb(cls); return MHD_NO; }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    add_cors(c, r);
    int ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);   /* free_cb runs when MHD is done with it */
    return ret;
}

/* ---- routing ---- */

static enum route find_route(const char *url, const char *method, const char **allow) {
    *allow = NULL;
    if (!strcmp(method, "OPTIONS")) return R_OPTIONS;   /* the same answer on every path (see preflight) */
    for (size_t i = 0; i < sizeof k_routes / sizeof *k_routes; i++) {
        size_t n = strlen(k_routes[i].path);
        bool match = k_routes[i].prefix ? !strncmp(url, k_routes[i].path, n) && url[n] && !strchr(url + n, '/')
                                        : !strcmp(url, k_routes[i].path);
        if (!match) continue;
        bool get = !strcmp(k_routes[i].method, "GET");
        if (!strcmp(method, k_routes[i].method) || (get && !strcmp(method, "HEAD"))) return k_routes[i].route;
        *allow = get ? "GET, HEAD, OPTIONS" : "POST, OPTIONS";
        return R_NONE;
    }
    return R_NONE;
}

/* Constant time in the key's content and length: every byte the client sent
 * is compared against the key or, past its end, against 0, and differences
 * accumulate without a branch, so the time depends on the client's input
 * alone. */
static bool authorized(struct server *s, struct MHD_Connection *c) {
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    const volatile unsigned char *key = (const unsigned char *)s->api_key;
    size_t n = strlen(h), k = strlen(s->api_key);
    volatile unsigned diff = n != k;
    for (size_t i = 0; i < n; i++) {
        size_t in = (size_t)0 - (size_t)(i < k);        /* all ones while inside the key */
        unsigned char kb = key[i & in] & (unsigned char)in; /* key[0] exists: its NUL if k == 0 */
        diff |= (unsigned char)h[i] ^ kb;
    }
    return !diff;
}

/* ---- connections: limits, deadlines, vanished clients ---- */

static struct peer *peer_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void set_phase(struct server *s, struct peer *p, enum phase ph) {
    if (!p) return;
    pthread_mutex_lock(&s->peers_mu);
    if (p->phase != PH_CLOSING) { p->phase = ph; p->t_phase = time_now(); }
    pthread_mutex_unlock(&s->peers_mu);
}

static void peer_address(struct MHD_Connection *c, struct peer *p) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    if (sa && sa->sa_family == AF_INET) {
        memcpy(p->ip, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
        p->ip_len = 4;
    } else if (sa && sa->sa_family == AF_INET6) {
        memcpy(p->ip, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
        p->ip_len = 16;
    }
}

/* Counted connections from p's address (under peers_mu).  A linear walk:
 * once per accepted socket, over at most a few thousand peers. */
static int same_client(const struct server *s, const struct peer *p) {
    int n = 0;
    for (const struct peer *q = s->peers; q; q = q->next)
        n += !q->over && q->ip_len == p->ip_len && !memcmp(q->ip, p->ip, (size_t)p->ip_len);
    return n;
}

/* A counted connection closed: the oldest over-limit socket that has sent
 * no request yet takes its slot (under peers_mu).  Whether a socket is over
 * is decided when a polling thread accepts it, and sockets that arrive
 * together are accepted in any order: without this, a slot freed by a short
 * request would stay free while a later idle socket stayed over. */
static void promote_one(struct server *s) {
    if (!s->n_over || s->n_peers >= s->max_conns) return;
    /* the list is newest first: walk back from its tail, over a few
     * candidates at most (under a flood this runs once per close) */
    int tries = 0;
    for (struct peer *q = s->peers_tail; q && tries < 8; q = q->prev) {
        if (!q->over || q->phase != PH_HEADERS) continue;
        tries++;
        if (same_client(s, q) < s->max_conns_per_client) {
            q->over = false;
            s->n_over--;
            s->n_peers++;
            return;
        }
    }
}

/* Slowloris from many addresses: sockets that trickle their headers could
 * fill every slot, and each under --max-connections-per-client, so that a
 * real client (and /health) was answered 503.  A slot is for a request: a
 * socket over the global limit that completes its headers takes the slot of
 * the oldest counted socket that has sent none for EVICT_AFTER_S (or idled
 * that long between requests), which is shut down (under peers_mu); a socket
 * just accepted may only not have been read yet.  Only a server whose slots
 * all hold requests (or fresh sockets) answers 503. */
#define EVICT_AFTER_S 1.0

static bool evict_incomplete(struct server *s) {
    const double now = time_now();
    for (struct peer *q = s->peers_tail; q; q = q->prev) {
        if (q->over || (q->phase != PH_HEADERS && q->phase != PH_IDLE) || q->fd < 0) continue;
        if (now - q->t_phase < EVICT_AFTER_S) continue;
        shutdown(q->fd, SHUT_RDWR);   /* MHD reads end-of-file and closes it; the socket stays MHD's */
        q->phase = PH_CLOSING;
        q->over = true;               /* uncounted now: its close counts it off the over-limit sockets */
        s->n_peers--;
        s->n_over++;
        return true;
    }
    return false;
}

/* p, over a limit, has sent its headers: counted if its own address is
 * within its limit and a slot is free or can be freed (under peers_mu). */
static void claim_slot(struct server *s, struct peer *p) {
    if (!p->over || same_client(s, p) >= s->max_conns_per_client) return;
    if (s->n_peers >= s->max_conns && !evict_incomplete(s)) return;
    p->over = false;
    s->n_over--;
    s->n_peers++;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    struct server *s = cls;
    struct peer *p = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        /* out of memory: the connection runs without limits or watching */
        if (!(p = calloc(1, sizeof *p))) return;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        p->fd = ci ? ci->connect_fd : -1;
        peer_address(c, p);
        p->phase = PH_HEADERS;
        p->t_phase = time_now();
        p->srv = s;
        pthread_mutex_lock(&s->peers_mu);
        p->over = s->n_peers >= s->max_conns || same_client(s, p) >= s->max_conns_per_client;
        if (p->over) s->n_over++;
        else s->n_peers++;
        p->next = s->peers;
        if (s->peers) s->peers->prev = p;
        else s->peers_tail = p;
        s->peers = p;
        pthread_mutex_unlock(&s->peers_mu);
        *socket_context = p;
        return;
    }
    if (!p) return;
    /* MHD closes the socket after this returns: the watcher, which holds
     * peers_mu while it polls, never sees a stale descriptor */
    pthread_mutex_lock(&s->peers_mu);
    if (p->prev) p->prev->next = p->next; else s->peers = p->next;
    if (p->next) p->next->prev = p->prev; else s->peers_tail = p->prev;
    if (p->over) s->n_over--;
    else { s->n_peers--; promote_one(s); }
    struct job *j = p->job;
    if (j) j->peer = NULL;
    pthread_mutex_unlock(&s->peers_mu);
    if (j) job_unref(j);
    free(p);
    *socket_context = NULL;
}

void http_watch(struct server *s, struct MHD_Connection *c, struct job *j) {
    struct peer *p = peer_of(c);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    if (!p) return;
    job_ref(j);
    pthread_mutex_lock(&s->peers_mu);
    bool took = !p->job && !j->peer;
    if (took) { p->job = j; j->peer = p; }
    pthread_mutex_unlock(&s->peers_mu);
    if (!took) job_unref(j);
}

void http_unwatch(struct server *s, struct job *j) {
    pthread_mutex_lock(&s->peers_mu);
    struct peer *p = j->peer;
    if (p) { p->job = NULL; j->peer = NULL; }
    pthread_mutex_unlock(&s->peers_mu);
    if (p) job_unref(j);
}

void http_connections(struct server *s, int *counted, int *over) {
    pthread_mutex_lock(&s->peers_mu);
    *counted = s->n_peers;
    *over = s->n_over;
    pthread_mutex_unlock(&s->peers_mu);
}

void http_suspend(struct MHD_Connection *c) { MHD_suspend_connection(c); }
void http_resume(struct MHD_Connection *c) { MHD_resume_connection(c); }

/* When p's current phase runs out (0: never). */
static double peer_deadline(const struct server *s, const struct peer *p) {
    double hdr = p->over && s->header_timeout > OVER_HEADER_S ? OVER_HEADER_S : s->header_timeout;
    switch (p->phase) {
    case PH_HEADERS: return p->t_phase + hdr;
    case PH_BODY: return p->t_phase + s->body_timeout;
    case PH_IDLE: return p->t_phase + s->idle_timeout + hdr;
    default: return 0;
    }
}

/* What one watcher round found for jobs[i] (a reference each). */
enum watch_act { WATCH_GONE, WATCH_PROBE, WATCH_DRAIN };
struct watch_buf {
    struct pollfd *fds;
    struct job **jobs;
    enum watch_act *act;   /* closed; only half-closed (probe it); bytes pipelined (job_drain) */
    size_t cap;
};

static bool watch_grow(struct watch_buf *w) {
    size_t cap = w->cap ? 2 * w->cap : 256;
    struct pollfd *f = realloc(w->fds, cap * sizeof *f);
    if (f) w->fds = f;
    struct job **jb = f ? realloc(w->jobs, cap * sizeof *jb) : NULL;
    if (jb) w->jobs = jb;
    enum watch_act *g = jb ? realloc(w->act, cap * sizeof *g) : NULL;
    if (g) w->act = g;
    if (!g) return false;
    w->cap = cap;
    return true;
}

/* One round over the list (under peers_mu): deadlines enforced, the sockets
 * of waiting requests polled.  Returns how many jobs need telling. */
static size_t watch_round(struct server *s, struct watch_buf *w) {
    double now = time_now();
    size_t n = 0;
    for (struct peer *p = s->peers; p; p = p->next) {
        double dl = peer_deadline(s, p);
        if (dl > 0 && now > dl && p->fd >= 0) {
            /* MHD sees end-of-file on its next read and closes: the socket
             * stays MHD's to close */
            shutdown(p->fd, SHUT_RDWR);
            p->phase = PH_CLOSING;
        }
        if (!p->job || p->fd < 0) continue;
        if (n == w->cap && !watch_grow(w)) break;   /* out of memory: the rest waits a round */
        w->fds[n] = (struct pollfd){ .fd = p->fd, .events = POLLRDHUP | POLLIN };
        w->jobs[n++] = p->job;
    }
    if (!n || poll(w->fds, (nfds_t)n, 0) <= 0) return 0;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        short r = w->fds[i].revents;
        if (!(r & (POLLHUP | POLLERR | POLLRDHUP | POLLIN))) continue;
        /* a closed peer answers our next bytes with a reset (POLLHUP |
         * POLLERR); a half-closed one only sent FIN (POLLRDHUP), as does a
         * client that closed before anything was written to it: probe it;
         * bytes alone are pipelined requests, which may hide a close */
        w->act[m] = r & (POLLHUP | POLLERR) ? WATCH_GONE : r & POLLRDHUP ? WATCH_PROBE : WATCH_DRAIN;
        job_ref(w->jobs[i]);
        w->jobs[m++] = w->jobs[i];
    }
    return m;
}

static void *watch_main(void *arg) {
    struct server *s = arg;
    struct watch_buf w = { 0 };
    while (!atomic_load(&s->watch_stop)) {
        nanosleep(&(struct timespec){ .tv_nsec = WATCH_MS * 1000000L }, NULL);
        pthread_mutex_lock(&s->peers_mu);
        size_t m = watch_round(s, &w);
        pthread_mutex_unlock(&s->peers_mu);
        /* outside peers_mu: telling a job takes its lock and MHD's */
        for (size_t i = 0; i < m; i++) {
            if (w.act[i] == WATCH_GONE) job_client_gone(w.jobs[i]);
            else if (w.act[i] == WATCH_PROBE) job_probe(w.jobs[i]);
            else job_drain(w.jobs[i]);
            job_unref(w.jobs[i]);
        }
    }
    free(w.fds);
    free(w.jobs);
    free(w.act);
    return NULL;
}

/* Every watched job, with a reference each (*n of them; NULL when none or
 * out of memory). */
static struct job **watched_jobs(struct server *s, size_t *n) {
    pthread_mutex_lock(&s->peers_mu);
    size_t k = 0;
    for (struct peer *p = s->peers; p; p = p->next) k += p->job != NULL;
    struct job **v = k ? malloc(k * sizeof *v) : NULL;
    *n = 0;
    for (struct peer *p = s->peers; v && p; p = p->next)
        if (p->job) { job_ref(p->job); v[(*n)++] = p->job; }
    pthread_mutex_unlock(&s->peers_mu);
    return v;
}

static bool wait_jobs(struct server *s, double wait_s) {
    double until = time_now() + wait_s;
    while (atomic_load(&s->n_jobs) > 0 && time_now() < until)
        nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000000L }, NULL);
    return atomic_load(&s->n_jobs) == 0;
}

void http_end_requests(struct server *s, double wait_s) {
    size_t n;
    struct job **v = watched_jobs(s, &n);
    for (size_t i = 0; i < n; i++) { job_shutdown(v[i]); job_unref(v[i]); }
    free(v);
    if (wait_jobs(s, wait_s)) return;
    /* answers that could not go out in time (a client not reading, an
     * engine that does not step): drop them, so nothing stays suspended */
    v = watched_jobs(s, &n);
    for (size_t i = 0; i < n; i++) { job_client_gone(v[i]); job_unref(v[i]); }
    free(v);
    wait_jobs(s, 1.0);
}

/* ---- requests ---- */

struct header_count { const char *name; int n; };

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind, (void)value;
    struct header_count *h = cls;
    h->n += !strcasecmp(key, h->name);
    return MHD_YES;
}

/* MHD_lookup_connection_value sees only the first of repeated headers. */
static int header_count(struct MHD_Connection *c, const char *name) {
    struct header_count h = { name, 0 };
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &h);
    return h.n;
}

static void set_error(struct conn *cn, unsigned status, const char *code, bool close, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void set_error(struct conn *cn, unsigned status, const char *code, bool close, const char *fmt, ...) {
    cn->status = status;
    cn->code = code;
    cn->close = close;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cn->message, sizeof cn->message, fmt, ap);
    va_end(ap);
}

/* /health always, /metrics when --metrics-public: everything else needs
 * the key, unknown paths included, so that a client without it cannot map
 * the routes by their 404 and 405. */
static bool public_path(const struct server *s, const char *url) {
    return !strcmp(url, "/health") || !strcmp(url, "/health_generate") ||
           (s->metrics_public && !strcmp(url, "/metrics"));
}

/* MHD's inactivity timeout, in seconds (a client that reads nothing of its
 * answer); the watcher bounds headers and bodies however slowly they trickle. */
static unsigned daemon_timeout(const struct server *s) { return (unsigned)(s->idle_timeout + 0.5); }

/* The first call: headers only.  Decide the route, or the error to answer
 * (framing errors close the connection: what follows cannot be trusted). */
static void classify(struct server *s, struct MHD_Connection *c, const char *url, const char *method,
                     const char *version, bool over, struct conn *cn) {
    const char *allow;
    cn->route = find_route(url, method, &allow);
    if (!strcmp(version, MHD_HTTP_VERSION_1_1) && !MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST)) {
        set_error(cn, 400, "missing_host", true, "an HTTP/1.1 request must carry a Host header");
    } else if (header_count(c, MHD_HTTP_HEADER_CONTENT_LENGTH) > 1) {
        set_error(cn, 400, "bad_content_length", true, "more than one Content-Length header");
    } else if (header_count(c, MHD_HTTP_HEADER_CONTENT_LENGTH) && header_count(c, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
        set_error(cn, 400, "bad_content_length", true, "both Content-Length and Transfer-Encoding");
    } else if (over) {
        set_error(cn, 503, "too_many_connections", true,
                  "too many connections (--max-connections %d, --max-connections-per-client %d); try again later",
                  s->max_conns, s->max_conns_per_client);
    } else if (cn->route != R_OPTIONS && !public_path(s, url) && !authorized(s, c)) {
        set_error(cn, 401, "invalid_api_key", false, "missing or wrong API key (send 'Authorization: Bearer KEY')");
        cn->hname = MHD_HTTP_HEADER_WWW_AUTHENTICATE;
        cn->hval = "Bearer";
    } else if (cn->route == R_NONE && allow) {
        set_error(cn, 405, "method_not_allowed", false, "method %.16s is not allowed here (allowed: %s)", method, allow);
        cn->hname = MHD_HTTP_HEADER_ALLOW;
        cn->hval = allow;
    } else if (cn->route == R_NONE) {
        set_error(cn, 404, "unknown_endpoint", false, "unknown endpoint %.16s %.160s", method, url);
    }
    if (cn->status == 503) {
        cn->hname = MHD_HTTP_HEADER_RETRY_AFTER;
        cn->hval = "1";
    }
}

/* OPTIONS: a CORS preflight from an allowed origin is answered 204 with what
 * it may send; one from any other origin 403 without CORS headers; one
 * without an Origin 204 with Allow.  Browsers send no credentials on a
 * preflight, so it is answered before authentication; the answer is the
 * same for every path, so it tells nothing about the routes. */
static int preflight(struct server *s, struct MHD_Connection *c) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const char *allow = server_cors_origin(s, origin);
    if (origin && !allow)
        return http_error(c, 403, "origin_not_allowed", NULL, "origin %.200s is not allowed (--allowed-origins)", origin);
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, CORS_METHODS);
    if (allow) {
        const char *want = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        bool plain = true;   /* echo only a header list made of token characters */
        for (const char *p = want; p && *p; p++)
            plain &= (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                     *p == '-' || *p == '_' || *p == ',' || *p == ' ';
        MHD_add_response_header(r, "Access-Control-Allow-Origin", allow);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", CORS_METHODS);
        MHD_add_response_header(r, "Access-Control-Allow-Headers", want && *want && plain && strlen(want) < 512 ? want : CORS_HEADERS);
        MHD_add_response_header(r, "Access-Control-Max-Age", CORS_MAX_AGE);
        if (strcmp(allow, "*")) MHD_add_response_header(r, "Vary", "Origin");
    }
    int ret = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    return ret;
}

/* A whole response that waits on the engine is suspended where MHD has
 * read the full request.  When it is resumed, MHD first reads the socket if
 * it was reading before the suspension, and a client that half-closed
 * (shutdown(SHUT_WR) after its body, as `nc -N`) then gives end-of-file,
 * on which libmicrohttpd 0.9.75 closes the connection around the answer
 * waiting to be queued.  MHD visits every connection with a timeout of its
 * own (its "manual" timeout list) before it reads the ready sockets, and
 * that visit runs the access handler, which queues the answer; from then
 * on MHD only writes.  A connection whose request waits is therefore given
 * a timeout of its own, one second above the daemon's, restored when the
 * request completes.  (A single connection was served only because the
 * resumed one happened to be the tail of the default list, which MHD also
 * visits first.) */
static enum MHD_Result answer_or_wait(struct server *s, struct MHD_Connection *c, struct conn *cn, int ret) {
    if (cn->pending && !cn->own_timeout) {
        cn->own_timeout = true;
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, daemon_timeout(s) + 1);
    }
    return (enum MHD_Result)ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    struct server *s = cls;
    struct conn *cn = *con_cls;
    if (!cn) {
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        struct peer *p = peer_of(c);
        set_phase(s, p, PH_BODY);
        pthread_mutex_lock(&s->peers_mu);
        if (p) claim_slot(s, p);
        bool over = p && p->over;
        pthread_mutex_unlock(&s->peers_mu);
        classify(s, c, url, method, version, over, cn);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > DRAIN_LIMIT) {
            /* too large to drain: answer now; MHD closes the connection */
            if (cn->route == R_COMPLETIONS || cn->route == R_CHAT || cn->route == R_LLAMA) metrics_request(&s->metrics, OUTCOME_CLIENT_ERROR);
            return (enum MHD_Result)http_error(c, 413, "request_too_large", NULL,
                                               "request body of %s bytes exceeds the limit of %zu", cl, s->max_body);
        }
        return MHD_YES;
    }
    /* resumed by the engine thread: the request waiting on it goes on */
    if (cn->pending) return answer_or_wait(s, c, cn, handle_pending(s, c, &cn->pending));
    if (*upload_size) {
        cn->n_body += *upload_size;
        if (cn->n_body > DRAIN_LIMIT) return MHD_NO;
        if (!cn->status && cn->n_body <= s->max_body) sb_put(&cn->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    /* the whole request is here */
    set_phase(s, peer_of(c), PH_BUSY);
    bool completion = cn->route == R_COMPLETIONS || cn->route == R_CHAT || cn->route == R_LLAMA;
    if (completion && (cn->status || cn->n_body > s->max_body)) metrics_request(&s->metrics, OUTCOME_CLIENT_ERROR);
    if (cn->status)
        return (enum MHD_Result)error_with(c, cn->status, cn->code, NULL, cn->hname, cn->hval, cn->close, cn->message);
    if (cn->n_body > s->max_body)
        return (enum MHD_Result)http_error(c, 413, "request_too_large", NULL,
                                           "request body of %llu bytes exceeds the limit of %zu (--max-body)",
                                           (unsigned long long)cn->n_body, s->max_body);
    if (cn->body.oom) return (enum MHD_Result)http_error(c, 500, NULL, NULL, "out of memory");
    const char *body = cn->body.s ? cn->body.s : "";
    bool http11 = !strcmp(version, MHD_HTTP_VERSION_1_1);
    switch (cn->route) {
    case R_HEALTH: return (enum MHD_Result)handle_health(s, c);
    case R_METRICS: return (enum MHD_Result)handle_metrics(s, c);
    case R_MODELS: return (enum MHD_Result)handle_models(s, c, NULL);
    case R_MODEL: return (enum MHD_Result)handle_models(s, c, url + strlen("/v1/models/"));
    case R_COMPLETIONS:
        return answer_or_wait(s, c, cn, handle_completion(s, c, API_COMPLETION, body, cn->body.len, http11, &cn->pending));
    case R_CHAT:
        return answer_or_wait(s, c, cn, handle_completion(s, c, API_CHAT, body, cn->body.len, http11, &cn->pending));
    case R_LLAMA:
        return answer_or_wait(s, c, cn, handle_completion(s, c, API_LLAMA, body, cn->body.len, http11, &cn->pending));
    case R_TOKENIZE: return (enum MHD_Result)handle_tokenize(s, c, body, cn->body.len);
    case R_DETOKENIZE: return (enum MHD_Result)handle_detokenize(s, c, body, cn->body.len);
    case R_VERSION: return (enum MHD_Result)handle_version(s, c);
    case R_PROPS: return (enum MHD_Result)handle_props(s, c);
    case R_OPTIONS: return (enum MHD_Result)preflight(s, c);
    case R_FLEET: return (enum MHD_Result)handle_fleet(s, c, url);
    case R_EMBEDDINGS:
        return (enum MHD_Result)http_error(c, 501, "not_implemented", NULL,
                                           "embeddings are not supported: kvllm serves text generation only (POST "
                                           "/v1/completions, /v1/chat/completions, /completion, /tokenize, "
                                           "/detokenize; GET /v1/models, /health, /metrics, /props, /version)");
    default: return MHD_NO;
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    struct server *s = cls;
    struct conn *cn = *con_cls;
    /* keep-alive: the next request's headers are due from now */
    set_phase(s, peer_of(c), PH_IDLE);
    if (!cn) return;
    if (cn->pending) pending_free(cn->pending);   /* the connection died while suspended */
    if (cn->own_timeout) MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, daemon_timeout(s));
    sb_free(&cn->body);
    if (cn->n_body >= SERVER_RELEASE_BYTES) server_release_memory();
    free(cn);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
    LOG_DBG("http: %s", buf);
}

/* MHD's own cap: room past --max-connections for sockets that are told 503
 * (past it, MHD stops accepting and the kernel's backlog holds them). */
static unsigned hard_limit(const struct server *s) { return (unsigned)s->max_conns + (unsigned)s->max_conns / 4 + 16; }

/* Fit the connection limits under the file-descriptor limit (the caller may
 * have raised it; see cmd_serve.c). */
static void fit_fd_limit(struct server *s) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY) return;
    if ((rlim_t)hard_limit(s) + FD_RESERVE <= rl.rlim_cur) return;
    int fit = rl.rlim_cur > FD_RESERVE + 80 ? (int)((rl.rlim_cur - FD_RESERVE - 16) * 4 / 5) : 64;
    LOG_WARN("--max-connections %d does not fit %llu file descriptors (ulimit -n): using %d", s->max_conns,
             (unsigned long long)rl.rlim_cur, fit);
    s->max_conns = fit;
    if (s->max_conns_per_client > fit) s->max_conns_per_client = fit;
}

int http_start(struct server *s) {
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(s->host, port, &hints, &ai);
    if (gai) { LOG_ERR("--host %s: %s", s->host, gai_strerror(gai)); return KVLLM_EIO; }
    fit_fd_limit(s);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)s->port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)POLL_THREADS,
                            MHD_OPTION_CONNECTION_LIMIT, hard_limit(s),
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONN_POOL_BYTES,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                            /* inactivity (a client that reads nothing of its answer); the
                             * watcher bounds headers and bodies however slowly they trickle */
                            MHD_OPTION_CONNECTION_TIMEOUT, daemon_timeout(s),
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) { LOG_ERR("cannot listen on %s:%d (address in use?)", s->host, s->port); return KVLLM_EIO; }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    if (di) s->port = di->port;
    atomic_store(&s->watch_stop, false);
    if (pthread_create(&s->watch_thread, NULL, watch_main, s)) { http_stop(s); return KVLLM_ENOMEM; }
    s->watch_started = true;
    return 0;
}

void http_stop(struct server *s) {
    if (s->watch_started) {
        atomic_store(&s->watch_stop, true);
        pthread_join(s->watch_thread, NULL);
        s->watch_started = false;
    }
    if (s->d) MHD_stop_daemon(s->d);
    s->d = NULL;
}
