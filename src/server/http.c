/* http.c — libmicrohttpd glue: the daemon, routing, authentication, request
 * bodies (with the size limit) and response helpers.
 *
 * MHD runs one thread per connection: a completion request may block its
 * thread for as long as the generation runs (waiting on its job, or inside
 * the SSE content reader), which the other modes would turn into busy waits
 * or stalls for other clients.  MHD calls the access handler first with the
 * headers only, then once per chunk of body, then once more with none; we
 * decide routing and authentication at the first call but answer errors only
 * after the body was read, so the client sees the response instead of a reset
 * connection (closing a socket with unread data sends RST). */
#include "server/server_internal.h"
#include "server/strbuf.h"
#include "core/core.h"

#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Bodies above this are not even drained: the connection is closed. */
#define DRAIN_LIMIT ((uint64_t)64 << 20)

enum route { R_NONE, R_HEALTH, R_METRICS, R_MODELS, R_MODEL, R_COMPLETIONS, R_CHAT };

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
};

/* Per-request state, from the first call of the access handler to the
 * request-completed notification. */
struct conn {
    enum route route;
    unsigned status;        /* non-zero: answer this error once the body is read */
    const char *code, *hname, *hval;
    char message[256];
    struct strbuf body;
    uint64_t n_body;        /* bytes received, kept or not */
};

/* ---- responses ---- */

static int send_with(struct MHD_Connection *c, unsigned status, const char *ctype, char *body, const char *hname,
                     const char *hval) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(body); return MHD_NO; }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (hname) MHD_add_response_header(r, hname, hval);
    int ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

int http_send(struct MHD_Connection *c, unsigned status, const char *content_type, char *body) {
    return send_with(c, status, content_type, body, NULL, NULL);
}

static int error_with(struct MHD_Connection *c, unsigned status, const char *code, const char *param,
                      const char *hname, const char *hval, const char *msg) {
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
                     : status == 503 ? "service_unavailable" : status >= 500 ? "server_error" : "invalid_request_error";
    sb_printf(&b, "\", \"type\": \"%s\", \"param\": ", type);
    if (param) sb_printf(&b, "\"%s\"", param); else sb_puts(&b, "null");
    sb_puts(&b, ", \"code\": ");
    if (code) sb_printf(&b, "\"%s\"", code); else sb_puts(&b, "null");
    sb_puts(&b, "}}");
    char *body = sb_take(&b);
    if (!body) return MHD_NO;
    return send_with(c, status, "application/json", body, hname, hval);
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
    int ret = error_with(c, status, code, param, NULL, NULL, clean.s ? clean.s : "");
    sb_free(&clean);
    return ret;
}

int http_conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

int http_stream(struct MHD_Connection *c, ssize_t (*reader)(void *cls, uint64_t pos, char *buf, size_t max), void *cls,
                void (*free_cb)(void *cls)) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, reader, cls, free_cb);
    if (!r) { free_cb(cls); return MHD_NO; }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    int ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);   /* free_cb runs when MHD is done with it */
    return ret;
}

/* ---- routing ---- */

static enum route find_route(const char *url, const char *method, const char **allow) {
    *allow = NULL;
    for (size_t i = 0; i < sizeof k_routes / sizeof *k_routes; i++) {
        size_t n = strlen(k_routes[i].path);
        bool match = k_routes[i].prefix ? !strncmp(url, k_routes[i].path, n) && url[n] && !strchr(url + n, '/')
                                        : !strcmp(url, k_routes[i].path);
        if (!match) continue;
        bool get = !strcmp(k_routes[i].method, "GET");
        if (!strcmp(method, k_routes[i].method) || (get && !strcmp(method, "HEAD"))) return k_routes[i].route;
        *allow = get ? "GET, HEAD" : k_routes[i].method;
        return R_NONE;
    }
    return R_NONE;
}

static bool authorized(struct server *s, struct MHD_Connection *c) {
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    /* length-independent comparison, so timing does not reveal a prefix */
    size_t n = strlen(h), k = strlen(s->api_key);
    unsigned diff = n != k;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)h[i] ^ (unsigned char)s->api_key[i % (k ? k : 1)];
    return !diff;
}

/* The first call: headers only.  Decide the route, or the error to answer. */
static void classify(struct server *s, struct MHD_Connection *c, const char *url, const char *method, struct conn *cn) {
    const char *allow;
    cn->route = find_route(url, method, &allow);
    if (cn->route == R_NONE && allow) {
        cn->status = 405;
        cn->code = "method_not_allowed";
        cn->hname = MHD_HTTP_HEADER_ALLOW;
        cn->hval = allow;
        snprintf(cn->message, sizeof cn->message, "method %.16s is not allowed here (allowed: %s)", method, allow);
    } else if (cn->route == R_NONE) {
        cn->status = 404;
        cn->code = "unknown_endpoint";
        snprintf(cn->message, sizeof cn->message, "unknown endpoint %.16s %.160s", method, url);
    } else if (!strncmp(url, "/v1/", 4) && !authorized(s, c)) {
        cn->status = 401;
        cn->code = "invalid_api_key";
        cn->hname = MHD_HTTP_HEADER_WWW_AUTHENTICATE;
        cn->hval = "Bearer";
        snprintf(cn->message, sizeof cn->message, "missing or wrong API key (send 'Authorization: Bearer KEY')");
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    struct server *s = cls;
    struct conn *cn = *con_cls;
    if (!cn) {
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        classify(s, c, url, method, cn);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > DRAIN_LIMIT) {
            /* too large to drain: answer now; MHD closes the connection */
            if (cn->route == R_COMPLETIONS || cn->route == R_CHAT) metrics_request(&s->metrics, OUTCOME_CLIENT_ERROR);
            return (enum MHD_Result)http_error(c, 413, "request_too_large", NULL,
                                               "request body of %s bytes exceeds the limit of %zu", cl, s->max_body);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        cn->n_body += *upload_size;
        if (cn->n_body > DRAIN_LIMIT) return MHD_NO;
        if (!cn->status && cn->n_body <= s->max_body) sb_put(&cn->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    /* the whole request is here */
    bool completion = cn->route == R_COMPLETIONS || cn->route == R_CHAT;
    if (completion && (cn->status || cn->n_body > s->max_body)) metrics_request(&s->metrics, OUTCOME_CLIENT_ERROR);
    if (cn->status)
        return (enum MHD_Result)error_with(c, cn->status, cn->code, NULL, cn->hname, cn->hval, cn->message);
    if (cn->n_body > s->max_body)
        return (enum MHD_Result)http_error(c, 413, "request_too_large", NULL,
                                           "request body of %llu bytes exceeds the limit of %zu (--max-body)",
                                           (unsigned long long)cn->n_body, s->max_body);
    if (cn->body.oom) return (enum MHD_Result)http_error(c, 500, NULL, NULL, "out of memory");
    const char *body = cn->body.s ? cn->body.s : "";
    switch (cn->route) {
    case R_HEALTH: return (enum MHD_Result)handle_health(s, c);
    case R_METRICS: return (enum MHD_Result)handle_metrics(s, c);
    case R_MODELS: return (enum MHD_Result)handle_models(s, c, NULL);
    case R_MODEL: return (enum MHD_Result)handle_models(s, c, url + strlen("/v1/models/"));
    case R_COMPLETIONS: return (enum MHD_Result)handle_completion(s, c, false, body, cn->body.len);
    case R_CHAT: return (enum MHD_Result)handle_completion(s, c, true, body, cn->body.len);
    default: return MHD_NO;
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    struct conn *cn = *con_cls;
    if (!cn) return;
    sb_free(&cn->body);
    free(cn);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
    LOG_DBG("http: %s", buf);
}

int http_start(struct server *s) {
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(s->host, port, &hints, &ai);
    if (gai) { LOG_ERR("--host %s: %s", s->host, gai_strerror(gai)); return KVLLM_EIO; }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)s->port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,   /* idle keep-alive connections */
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) { LOG_ERR("cannot listen on %s:%d (address in use?)", s->host, s->port); return KVLLM_EIO; }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    if (di) s->port = di->port;
    return 0;
}

void http_stop(struct server *s) {
    if (s->d) MHD_stop_daemon(s->d);
    s->d = NULL;
}
