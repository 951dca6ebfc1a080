/* fuzz_http — the HTTP layer: libmicrohttpd and kvllm's routing,
 * authentication, body limits, CORS, handlers and job lifecycle, fed raw
 * bytes over a loopback connection.
 *
 * One server for the whole process (server_start on 127.0.0.1, a free port,
 * API key "k", CORS for two origins, the soak's chat template) serving
 * stories260K (tests/data, or $KVLLM_SHARED) with a 64-position context, so that a
 * completion is milliseconds even under ASan.  Each input is one connection:
 * every byte is sent as it is (pipelined requests, chunked bodies, partial
 * headers), then the harness reads what comes back.  Once the server has
 * been silent for a moment after a complete response, or for longer with
 * none (a partial request: the slowloris case), the harness half-closes its
 * side, which ends the request or makes the watcher probe a waiting job,
 * and reads until the server closes.
 *
 * Checks (abort, i.e. a finding, on failure):
 *  - every response that comes back begins with "HTTP/1.x NNN" and its
 *    framing (Content-Length or chunked) parses;
 *  - no 500 other than "out of memory" (the parser, tokenizer and engine must
 *    refuse bad input with a 4xx, never fail on it);
 *  - the server closes the connection within 60 s of the half-close (a hang
 *    catcher: generation is capped by the 64-position context);
 *  - server_running() is back to 0 within 10 s (no request left behind), and
 *    every 16th input /metrics reports 0 KV blocks held. */
#include "fuzz_util.h"
#include "server/server.h"
#include "core/core.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#ifndef FUZZ_SHARED_DIR
#define FUZZ_SHARED_DIR "tests/data"
#endif

#define KEY "k"
/* Silence after a complete response before the half-close, and with no
 * complete response yet (a partial request, or one the engine is working on). */
#define QUIET_AFTER_MS 2
#define QUIET_NONE_MS 25
#define CLOSE_DEADLINE_S 60.0

static struct server *g_srv;
static struct kvllm_model *g_model;
static struct kvllm_engine *g_engine;
static int g_port;
static unsigned long g_inputs;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "fuzz_http: %s\n", what);
    abort();
}

static const char k_template[] = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                                 "{% if add_generation_prompt %}assistant:{% endif %}";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fuzz_quiet();
    signal(SIGPIPE, SIG_IGN);
    const char *sh = getenv("KVLLM_SHARED");
    char model[1024], tok[1024];
    snprintf(model, sizeof model, "%s/models/stories260K/stories260K.bin", sh && *sh ? sh : FUZZ_SHARED_DIR);
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh && *sh ? sh : FUZZ_SHARED_DIR);
    struct server_params sp = {
        .host = "127.0.0.1", .port = 0, .api_key = KEY, .model_id = "stories260K", .chat_template = k_template,
        .max_body = 256 << 10, .allowed_origins = "http://a.example,https://b.example",
        .header_timeout = 5, .body_timeout = 5, .idle_timeout = 5, .max_seqs = 8,
        .log_json = true,   /* the JSON log lines (each request writes one to stderr) */
    };
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = tok;
    mp.n_threads = 1;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    /* caps every generation (a request without max_tokens runs to the end of the context): a few
     * hundred milliseconds under ASan on a loaded machine, so no input can keep a request running */
    ep.n_ctx = 64;
    ep.max_seqs = 8;
    ep.max_queue = 64;
    ep.kv_tokens = 8 * 64;
    if (server_start(&sp, &g_srv)) die("server_start failed");
    if (kvllm_model_load(model, &mp, &g_model)) die("cannot load stories260K (set KVLLM_SHARED to the test data folder)");
    if (kvllm_engine_new(g_model, &ep, &g_engine)) die("kvllm_engine_new failed");
    if (server_ready(g_srv, g_model, g_engine, ep.n_ctx)) die("server_ready failed");
    g_port = server_port(g_srv);
    /* the server outlives every input; libFuzzer exits the process at the end */
    return 0;
}

/* ---- reading responses ---- */

struct rbuf { char *p; size_t n, cap; };

static void rbuf_add(struct rbuf *b, const char *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        if (!(b->p = realloc(b->p, b->cap))) die("out of memory");
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* The length of one complete response at p (n bytes), 0 when it is not
 * complete yet, -1 when it is malformed.  *status gets its code.  A body
 * whose length is known only from the close (neither Content-Length nor
 * chunked) is complete at n. */
static long one_response(const char *p, size_t n, int *status, bool closed) {
    const char *end = memmem(p, n, "\r\n\r\n", 4);
    if (!end) return closed ? -1 : 0;
    const size_t hlen = (size_t)(end - p) + 4;
    if (hlen < 12 || memcmp(p, "HTTP/1.", 7) || p[8] != ' ') return -1;
    if (p[9] < '1' || p[9] > '5' || p[10] < '0' || p[10] > '9' || p[11] < '0' || p[11] > '9') return -1;
    *status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    if (*status < 200 || *status == 204 || *status == 304) return (long)hlen;
    /* A head followed at once by another status line has no body: the answer to a HEAD request
     * (which carries the Content-Length of the body it leaves out), or libmicrohttpd 0.9.75's
     * (Debian 12) error page, whose head it sends twice when it refuses a request itself (a
     * Content-Length that is not a number: found by this target, docs/RELIABILITY.md; kvllm never
     * sees such a request).  kvllm's bodies (JSON, SSE) never begin with "HTTP/1.". */
    if (n - hlen >= 7 && !memcmp(p + hlen, "HTTP/1.", 7)) return (long)hlen;
    if (!closed && n - hlen < 7 && !memcmp(p + hlen, "HTTP/1.", n - hlen)) return 0;
    long clen = -1;
    bool chunked = false;
    for (const char *l = memchr(p, '\n', hlen) + 1; l < end;) {
        const char *eol = memmem(l, (size_t)(end + 2 - l), "\r\n", 2);   /* found: the head ends in \r\n\r\n */
        const size_t ll = (size_t)(eol - l);
        if (ll > 15 && !strncasecmp(l, "Content-Length:", 15)) clen = strtol(l + 15, NULL, 10);
        if (ll > 18 && !strncasecmp(l, "Transfer-Encoding:", 18) && memmem(l, ll, "chunked", 7)) chunked = true;
        l = eol + 2;
    }
    if (chunked) {
        size_t i = hlen;
        for (;;) {
            const char *e = i < n ? memmem(p + i, n - i, "\r\n", 2) : NULL;
            if (!e) return closed ? -1 : 0;
            char *x;
            const unsigned long sz = strtoul(p + i, &x, 16);
            if (x == p + i) return -1;
            i = (size_t)(e - p) + 2;
            if (sz == 0) return i + 2 <= n ? (long)(i + 2) : closed ? -1 : 0;   /* no trailers from MHD */
            if (i + sz + 2 > n) return closed ? -1 : 0;
            i += sz + 2;
        }
    }
    if (clen < 0) return closed ? (long)n : 0;
    /* a HEAD answer carries Content-Length without a body: accept it at the close */
    if (hlen + (size_t)clen > n) return closed ? (long)n : 0;
    return (long)(hlen + (size_t)clen);
}

/* Check every complete response in b from *at on; returns whether the
 * stream ends exactly at a response boundary. */
static bool check_responses(struct rbuf *b, size_t *at, bool closed) {
    while (*at < b->n) {
        int status = 0;
        const long len = one_response(b->p + *at, b->n - *at, &status, closed);
        if (len < 0) {
            const size_t show = b->n > 3000 ? 3000 : b->n;
            fprintf(stderr, "fuzz_http: malformed response at byte %zu of:\n%.*s\n", *at, (int)show, b->p);
            die("malformed response");
        }
        if (len == 0) return false;
        if (status == 500 && !memmem(b->p + *at, (size_t)len, "out of memory", 13)) {
            fprintf(stderr, "fuzz_http: 500:\n%.*s\n", (int)(len > 1500 ? 1500 : len), b->p + *at);
            die("500 on a request that should be refused with a 4xx or answered");
        }
        *at += (size_t)len;
    }
    return true;
}

/* ---- one exchange ---- */

static int connect_server(void) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket");
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)g_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 && errno != EINPROGRESS) die("connect");
    return fd;
}

/* Send data and read the answers as described at the top; returns what came back. */
static void exchange(const uint8_t *data, size_t size, struct rbuf *got) {
    const int fd = connect_server();
    size_t sent = 0, checked = 0;
    bool wr_closed = false, at_boundary = false;
    double t_last = now_s(), t_close = 0;
    char buf[65536];
    for (;;) {
        struct pollfd pf = { .fd = fd, .events = POLLIN | (sent < size ? POLLOUT : 0) };
        const int pr = poll(&pf, 1, 1);
        if (pr < 0 && errno != EINTR) die("poll");
        const double t = now_s();
        if (pf.revents & POLLOUT) {
            const ssize_t w = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
            if (w > 0) { sent += (size_t)w; t_last = t; }
            else if (w < 0 && errno != EAGAIN && errno != EINTR) sent = size;   /* reset by the server: stop sending */
        }
        if (pf.revents & (POLLIN | POLLHUP | POLLERR)) {
            const ssize_t r = recv(fd, buf, sizeof buf, 0);
            if (r > 0) {
                rbuf_add(got, buf, (size_t)r);
                at_boundary = check_responses(got, &checked, false);
                t_last = t;
            } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                break;   /* the server closed (or reset) the connection */
            }
        }
        const double quiet = (at_boundary && got->n ? QUIET_AFTER_MS : QUIET_NONE_MS) * 1e-3;
        if (!wr_closed && sent == size && t - t_last > quiet) {
            shutdown(fd, SHUT_WR);
            wr_closed = true;
            t_close = t;
        }
        if (wr_closed && t - t_close > CLOSE_DEADLINE_S)
            die("the server did not close the connection 60 s after the client's FIN");
    }
    check_responses(got, &checked, true);
    close(fd);
}

static void wait_idle(void) {
    const double t0 = now_s();
    while (server_running(g_srv) > 0) {
        if (now_s() - t0 > 10) die("a request is still running 10 s after its connection closed");
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
}

static void check_blocks(void) {
    static const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " KEY "\r\n"
                              "Connection: close\r\n\r\n";
    const double t0 = now_s();
    for (;;) {
        struct rbuf got = { 0 };
        exchange((const uint8_t *)req, sizeof req - 1, &got);
        static const char key[] = "kvllm_kv_blocks{state=\"held\"} ";
        const char *h = got.p ? strstr(got.p, key) : NULL;
        if (!h) die("/metrics has no kvllm_kv_blocks{state=\"held\"}");
        const long held = strtol(h + sizeof key - 1, NULL, 10);
        free(got.p);
        if (held == 0) return;
        if (now_s() - t0 > 10) die("KV blocks still held 10 s after every request ended");
        struct timespec ts = { 0, 5000000 };
        nanosleep(&ts, NULL);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct rbuf got = { 0 };
    exchange(data, size, &got);
    free(got.p);
    wait_idle();
    if (++g_inputs % 16 == 0) check_blocks();
    return 0;
}
