/* cmd_bench_serve.c — `kvllm bench serve`: a load generator for an
 * OpenAI-compatible server, in the style of vLLM's serving benchmark.
 *
 * Each request is a streaming /v1/completions call with a random prompt
 * (token ids when the server reports its vocab size: kvllm's vocab_size or
 * llama-server's meta.n_vocab; random words otherwise),
 * max_tokens from --gen-len, greedy, ignore_eos (so output lengths are what
 * was asked) and stream_options.include_usage (the final chunk carries the
 * exact token count).  Time to first token is measured to the first chunk
 * with text; inter-token latency is the gap between successive chunks with
 * text, as vLLM measures it.  Loopback HTTP/1.1 over plain sockets, one
 * connection per request.  With --concurrency C, C workers send back to back;
 * with --rate R, requests start at Poisson arrival times (R per second). */
#include "cli.h"
#include "cli_opts.h"
#include "core/strbuf.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum {
    BS_HELP = 1, BS_URL, BS_CONCURRENCY, BS_RATE, BS_REQUESTS, BS_PROMPT_LEN, BS_GEN_LEN, BS_MODEL, BS_API_KEY, BS_SEED,
    BS_OUTPUT,
};

/* bench serve's options: the parser, --help and docs/CLI.md's reference read this table */
static const struct cli_opt k_serve_opts[] = {
    { BS_URL, "--url", "URL", CLI_VALUE, "server base URL, e.g. http://127.0.0.1:8080" },
    { BS_CONCURRENCY, "--concurrency", "C", CLI_VALUE, "requests in flight at once (default 8)" },
    { BS_RATE, "--rate", "R", CLI_VALUE, "instead: Poisson arrivals, R requests per second" },
    { BS_REQUESTS, "--requests", "N", CLI_VALUE, "requests in all (default 100)" },
    { BS_PROMPT_LEN, "--prompt-len", "A:B", CLI_VALUE, "prompt tokens, uniform (default 32:128)" },
    { BS_GEN_LEN, "--gen-len", "A:B", CLI_VALUE, "generated tokens, uniform (default 16:64)" },
    { BS_MODEL, "--model", "NAME", CLI_VALUE, "model id (default: the server's first)" },
    { BS_API_KEY, "--api-key", "KEY", CLI_VALUE, "sent as 'Authorization: Bearer KEY'" },
    { BS_SEED, "--seed", "S", CLI_VALUE, "workload seed (default 1)" },
    { BS_OUTPUT, "-o", "md|json", CLI_VALUE, "output format (default md)" },
    { BS_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_serve_group = CLI_GROUP(NULL, k_serve_opts);
static const struct cli_opt_group *const k_serve_groups[] = { &k_serve_group };

const struct cli_cmd bench_serve_cli = {
    .name = "bench serve",
    .synopsis = "--url URL [options]",
    .groups = CLI_GROUPS(k_serve_groups),
    .n_own = 1,
};

struct target {
    char host[300], port[16], prefix[256], model[256], api_key[256];
    int vocab;              /* 0: unknown -> word prompts */
};

struct result {
    bool ok;
    int n_prompt, n_out;
    double t_start, ttft, e2e;
    double *itl;            /* (n_itl) */
    int n_itl, cap_itl;
    char err[160];
};

/* ---- a minimal HTTP/1.1 client ---- */

static int connect_to(const struct target *t) {
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai = NULL;
    if (getaddrinfo(t->host, t->port, &hints, &ai)) return -1;
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) { close(fd); fd = -1; }
    }
    freeaddrinfo(ai);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct timeval tv = { .tv_sec = 600 };
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    return fd;
}

static bool send_all(int fd, const char *s, size_t n) {
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        s += w;
        n -= (size_t)w;
    }
    return true;
}

/* Send one request; returns the socket (response unread) or -1. */
static int request(const struct target *t, const char *method, const char *path, const char *body) {
    int fd = connect_to(t);
    if (fd < 0) return -1;
    char head[1024];
    size_t blen = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head,
                     "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nAccept: */*\r\nConnection: close\r\n%s%s%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, t->prefix, path, t->host, t->port, *t->api_key ? "Authorization: Bearer " : "",
                     t->api_key, *t->api_key ? "\r\n" : "", blen);
    if (n < 0 || (size_t)n >= sizeof head || !send_all(fd, head, (size_t)n) || (blen && !send_all(fd, body, blen))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Response reader: the status and headers, then the body de-chunked. */
struct reader {
    int fd;
    char buf[16384];
    size_t len, off;
    bool chunked, eof;
    long long chunk_left;   /* bytes left in the current chunk; -1: a size line comes next */
    int status;
};

static bool fill(struct reader *r) {
    if (r->off > 0) { memmove(r->buf, r->buf + r->off, r->len - r->off); r->len -= r->off; r->off = 0; }
    if (r->len == sizeof r->buf) return false;
    ssize_t n;
    do n = recv(r->fd, r->buf + r->len, sizeof r->buf - r->len, 0); while (n < 0 && errno == EINTR);
    if (n <= 0) { r->eof = true; return false; }
    r->len += (size_t)n;
    return true;
}

/* A CRLF-terminated line (CRLF stripped, NUL-terminated in place), or NULL. */
static char *read_line(struct reader *r) {
    for (;;) {
        char *s = r->buf + r->off, *e = memchr(s, '\n', r->len - r->off);
        if (e) {
            *e = 0;
            if (e > s && e[-1] == '\r') e[-1] = 0;
            r->off = (size_t)(e + 1 - r->buf);
            return s;
        }
        if (!fill(r)) return NULL;
    }
}

static bool read_head(struct reader *r) {
    char *l = read_line(r);
    if (!l || sscanf(l, "HTTP/%*d.%*d %d", &r->status) != 1) return false;
    while ((l = read_line(r)) && *l)
        if (!strncasecmp(l, "Transfer-Encoding:", 18) && strstr(l + 18, "chunked")) r->chunked = true;
    r->chunk_left = -1;
    return l != NULL;
}

/* Up to cap body bytes into out; 0 at the end, -1 on error. */
static ssize_t read_body(struct reader *r, char *out, size_t cap) {
    if (r->chunked && r->chunk_left <= 0) {
        if (r->chunk_left == 0 && !read_line(r)) return -1;   /* CRLF after the previous chunk */
        char *l = read_line(r);
        if (!l) return -1;
        r->chunk_left = strtoll(l, NULL, 16);
        if (r->chunk_left <= 0) return 0;
    }
    if (r->off == r->len && !fill(r)) return r->chunked ? -1 : 0;
    size_t n = r->len - r->off;
    if (n > cap) n = cap;
    if (r->chunked && (long long)n > r->chunk_left) n = (size_t)r->chunk_left;
    memcpy(out, r->buf + r->off, n);
    r->off += n;
    if (r->chunked) r->chunk_left -= (long long)n;
    return (ssize_t)n;
}

/* ---- one streaming completion ---- */

static void add_itl(struct result *res, double v) {
    if (res->n_itl == res->cap_itl) {
        int cap = res->cap_itl ? 2 * res->cap_itl : 64;
        double *p = realloc(res->itl, (size_t)cap * sizeof *p);
        if (!p) return;
        res->itl = p;
        res->cap_itl = cap;
    }
    res->itl[res->n_itl++] = v;
}

/* One SSE event's data; returns false at [DONE]. */
static bool on_data(struct result *res, const char *data, double now, double *t_last) {
    if (!strcmp(data, "[DONE]")) return false;
    json_object *o = json_tokener_parse(data), *v, *c0, *u;
    if (!o) return true;
    if (json_object_object_get_ex(o, "choices", &v) && json_object_array_length(v) > 0 &&
        (c0 = json_object_array_get_idx(v, 0)) && json_object_object_get_ex(c0, "text", &v) &&
        json_object_get_string_len(v) > 0) {
        if (res->ttft < 0) res->ttft = now - res->t_start;
        else add_itl(res, now - *t_last);
        *t_last = now;
    }
    if (json_object_object_get_ex(o, "usage", &u) && json_object_object_get_ex(u, "completion_tokens", &v))
        res->n_out = json_object_get_int(v);
    json_object_put(o);
    return true;
}

static void run_one(const struct target *t, const char *body, struct result *res) {
    res->ttft = -1;
    res->t_start = cli_time();
    int fd = request(t, "POST", "/v1/completions", body);
    if (fd < 0) { snprintf(res->err, sizeof res->err, "cannot connect or send"); return; }
    struct reader *r = calloc(1, sizeof *r);
    struct strbuf ev = { 0 };   /* the events not yet read whole */
    bool done = false;
    double t_last = 0;
    if (!r) goto out;
    r->fd = fd;
    if (!read_head(r)) { snprintf(res->err, sizeof res->err, "no HTTP response"); goto out; }
    char chunk[8192];
    ssize_t n;
    while (!done && (n = read_body(r, chunk, sizeof chunk)) > 0) {
        double now = cli_time();
        sb_put(&ev, chunk, (size_t)n);
        if (ev.oom) break;
        if (r->status != 200) continue;
        /* events end with a blank line */
        char *start = ev.s, *end;
        while (!done && (end = strstr(start, "\n\n"))) {
            *end = 0;
            if (!strncmp(start, "data: ", 6)) done = !on_data(res, start + 6, now, &t_last);
            start = end + 2;
        }
        ev.len -= (size_t)(start - ev.s);   /* keep the unfinished event */
        memmove(ev.s, start, ev.len + 1);
    }
    if (r->status != 200) {
        snprintf(res->err, sizeof res->err, "HTTP %d: %.120s", r->status, ev.s ? ev.s : "");
    } else if (!done) {
        snprintf(res->err, sizeof res->err, "stream ended before [DONE]");
    } else {
        res->ok = true;
        res->e2e = cli_time() - res->t_start;
    }
out:
    sb_free(&ev);
    free(r);
    close(fd);
}

/* ---- the workload ---- */

struct bench {
    struct target t;
    long n_req, p_lo, p_hi, g_lo, g_hi, seed, concurrency;
    double rate;
    double *arrival;        /* (n_req) seconds after start */
    struct result *res;     /* (n_req) */
    atomic_long next;
    double t0;
};

static uint64_t rnd(uint64_t *s) {   /* xorshift64* */
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static const char *const k_words[] = { "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to",
                                       "big", "red", "ball", "in", "park", "with", "sun", "tree", "bird", "sky" };

/* The request body for request i (deterministic in the seed). */
static char *make_body(const struct bench *b, long i, int *n_prompt) {
    uint64_t s = (uint64_t)(b->seed * 1000003 + i) * 0x9E3779B97F4A7C15ull | 1;
    for (int k = 0; k < 4; k++) rnd(&s);
    int np = (int)(b->p_lo + (long)(rnd(&s) % (uint64_t)(b->p_hi - b->p_lo + 1)));
    int ng = (int)(b->g_lo + (long)(rnd(&s) % (uint64_t)(b->g_hi - b->g_lo + 1)));
    size_t cap = 512 + (size_t)np * 12;
    char *body = malloc(cap);
    if (!body) return NULL;
    size_t n = (size_t)snprintf(body, cap, "{\"model\": \"%s\", \"prompt\": %s", b->t.model, b->t.vocab ? "[" : "\"");
    for (int k = 0; k < np; k++) {
        if (b->t.vocab) /* skip the first ids: control and byte tokens in most vocabularies */
            n += (size_t)snprintf(body + n, cap - n, "%s%d", k ? ", " : "",
                                  (int)(b->t.vocab > 300 ? 259 + rnd(&s) % (uint64_t)(b->t.vocab - 259)
                                                         : 3 + rnd(&s) % (uint64_t)(b->t.vocab - 3)));
        else
            n += (size_t)snprintf(body + n, cap - n, "%s%s", k ? " " : "", k_words[rnd(&s) % 20]);
    }
    snprintf(body + n, cap - n,
             "%s, \"max_tokens\": %d, \"temperature\": 0, \"stream\": true, \"ignore_eos\": true, "
             "\"stream_options\": {\"include_usage\": true}}", b->t.vocab ? "]" : "\"", ng);
    *n_prompt = np;
    return body;
}

static void *worker(void *arg) {
    struct bench *b = arg;
    for (;;) {
        long i = atomic_fetch_add(&b->next, 1);
        if (i >= b->n_req) break;
        double wait = b->t0 + b->arrival[i] - cli_time();
        if (wait > 0) nanosleep(&(struct timespec){ .tv_sec = (time_t)wait, .tv_nsec = (long)(fmod(wait, 1.0) * 1e9) }, NULL);
        int np = 0;
        char *body = make_body(b, i, &np);
        b->res[i].n_prompt = np;
        if (body) run_one(&b->t, body, &b->res[i]);
        else snprintf(b->res[i].err, sizeof b->res[i].err, "out of memory");
        free(body);
    }
    return NULL;
}

/* GET /v1/models: the model id (unless given) and vocab_size (a kvllm extension). */
static bool discover(struct target *t) {
    int fd = request(t, "GET", "/v1/models", NULL);
    if (fd < 0) { cli_error("bench serve: cannot connect to %s:%s", t->host, t->port); return false; }
    struct reader *r = calloc(1, sizeof *r);
    struct strbuf body = { 0 };
    bool ok = false;
    if (r) {
        r->fd = fd;
        if (read_head(r) && r->status == 200) {
            char chunk[4096];
            ssize_t n;
            while (!body.oom && (n = read_body(r, chunk, sizeof chunk)) > 0) sb_put(&body, chunk, (size_t)n);
        }
    }
    json_object *o = body.s && !body.oom ? json_tokener_parse(body.s) : NULL, *d, *m, *v;
    if (o && json_object_object_get_ex(o, "data", &d) && json_object_array_length(d) > 0) {
        m = json_object_array_get_idx(d, 0);
        if (!*t->model && json_object_object_get_ex(m, "id", &v))
            snprintf(t->model, sizeof t->model, "%s", json_object_get_string(v));
        json_object *meta;
        if (json_object_object_get_ex(m, "vocab_size", &v)) t->vocab = json_object_get_int(v);
        else if (json_object_object_get_ex(m, "meta", &meta) && json_object_object_get_ex(meta, "n_vocab", &v))
            t->vocab = json_object_get_int(v);   /* llama-server's field: the same id prompts reach both servers */
        ok = *t->model != 0;
    }
    if (!ok) cli_error("bench serve: GET /v1/models did not name a model (status %d)", r ? r->status : 0);
    json_object_put(o);
    sb_free(&body);
    free(r);
    close(fd);
    return ok;
}

static bool parse_url(const char *url, struct target *t) {
    if (strncmp(url, "http://", 7)) { cli_error("--url: only http:// URLs are supported, got '%s'", url); return false; }
    const char *h = url + 7, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    char hostport[300];
    if (hl == 0 || hl >= sizeof hostport) { cli_error("--url: no host in '%s'", url); return false; }
    memcpy(hostport, h, hl);
    hostport[hl] = 0;
    char *colon = strrchr(hostport, ':');
    snprintf(t->port, sizeof t->port, "%s", colon ? colon + 1 : "80");
    if (colon) *colon = 0;
    snprintf(t->host, sizeof t->host, "%s", hostport);
    snprintf(t->prefix, sizeof t->prefix, "%s", slash ? slash : "");
    size_t pl = strlen(t->prefix);
    while (pl && t->prefix[pl - 1] == '/') t->prefix[--pl] = 0;
    /* a base URL ending in /v1 (as OpenAI clients take it) */
    if (pl >= 3 && !strcmp(t->prefix + pl - 3, "/v1")) t->prefix[pl - 3] = 0;
    return true;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *v, int n, double p) {
    if (n == 0) return 0;
    double k = p / 100.0 * (n - 1);
    int lo = (int)k;
    return lo + 1 < n ? v[lo] + (k - lo) * (v[lo + 1] - v[lo]) : v[lo];
}

int bench_serve_cmd(int argc, char **argv) {
    struct bench b = { .n_req = 100, .p_lo = 32, .p_hi = 128, .g_lo = 16, .g_hi = 64, .seed = 1, .concurrency = 8 };
    const char *url = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const struct cli_opt *op;
        const char *a = argv[i], *v;
        double d;
        if (cli_cmd_next(&bench_serve_cli, argc, argv, &i, &op, &v) < 0) return 2;
        switch (op->id) {
        case BS_HELP: cli_cmd_usage(&bench_serve_cli, stdout); return 0;
        case BS_URL: url = v; break;
        case BS_CONCURRENCY: if (!cli_int(a, v, 1, 4096, &b.concurrency)) return 2; break;
        case BS_RATE: if (!cli_float(a, v, 1e-3, 1e6, &d)) return 2; b.rate = d; break;
        case BS_REQUESTS: if (!cli_int(a, v, 1, 1 << 24, &b.n_req)) return 2; break;
        case BS_PROMPT_LEN: if (!cli_range(a, v, 1, 1 << 20, &b.p_lo, &b.p_hi)) return 2; break;
        case BS_GEN_LEN: if (!cli_range(a, v, 1, 1 << 20, &b.g_lo, &b.g_hi)) return 2; break;
        case BS_MODEL: snprintf(b.t.model, sizeof b.t.model, "%s", v); break;
        case BS_API_KEY: snprintf(b.t.api_key, sizeof b.t.api_key, "%s", v); break;
        case BS_SEED: if (!cli_int(a, v, 0, 1L << 31, &b.seed)) return 2; break;
        case BS_OUTPUT:
            if (!strcmp(v, "json")) json = true;
            else if (strcmp(v, "md")) { cli_error("-o: expected md or json, got '%s'", v); return 2; }
            break;
        }
    }
    if (!cli_opt_end()) return 2;
    if (!url) { cli_error("bench serve: --url URL is required"); return 2; }
    if (!parse_url(url, &b.t) || !discover(&b.t)) return 1;

    b.arrival = calloc((size_t)b.n_req, sizeof *b.arrival);
    b.res = calloc((size_t)b.n_req, sizeof *b.res);
    if (!b.arrival || !b.res) { free(b.arrival); free(b.res); cli_error("out of memory"); return 1; }
    long n_workers = b.concurrency;
    if (b.rate > 0) {
        uint64_t s = (uint64_t)b.seed * 7919 + 17;
        double t = 0;
        for (long i = 0; i < b.n_req; i++) {
            b.arrival[i] = t;
            double u = (double)(rnd(&s) >> 11) / 9007199254740992.0;
            t += -log(1.0 - u) / b.rate;
        }
        n_workers = b.n_req < 256 ? b.n_req : 256;   /* enough to start requests on time */
    }
    if (n_workers > b.n_req) n_workers = b.n_req;
    pthread_t *th = calloc((size_t)n_workers, sizeof *th);
    if (!th) { free(b.arrival); free(b.res); return 1; }
    atomic_init(&b.next, 0);
    b.t0 = cli_time();
    long started = 0;
    for (; started < n_workers; started++)
        if (pthread_create(&th[started], NULL, worker, &b)) break;
    for (long i = 0; i < started; i++) pthread_join(th[i], NULL);
    double dur = cli_time() - b.t0;
    free(th);

    /* aggregate */
    long n_ok = 0, out_tok = 0, in_tok = 0, n_itl = 0;
    for (long i = 0; i < b.n_req; i++) if (b.res[i].ok) n_itl += b.res[i].n_itl;
    double *ttft = calloc((size_t)b.n_req + 1, sizeof *ttft), *itl = calloc((size_t)n_itl + 1, sizeof *itl);
    double ttft_sum = 0, itl_sum = 0;
    n_itl = 0;
    const char *first_err = NULL;
    for (long i = 0; i < b.n_req; i++) {
        struct result *r = &b.res[i];
        if (!r->ok) { if (!first_err) first_err = r->err; continue; }
        if (ttft) ttft[n_ok] = r->ttft < 0 ? r->e2e : r->ttft;
        ttft_sum += r->ttft < 0 ? r->e2e : r->ttft;
        n_ok++;
        out_tok += r->n_out;
        in_tok += r->n_prompt;
        for (int k = 0; itl && k < r->n_itl; k++) { itl[n_itl++] = r->itl[k]; itl_sum += r->itl[k]; }
    }
    if (ttft) qsort(ttft, (size_t)n_ok, sizeof *ttft, cmp_double);
    if (itl) qsort(itl, (size_t)n_itl, sizeof *itl, cmp_double);
    double tm = n_ok ? 1e3 * ttft_sum / (double)n_ok : 0, im = n_itl ? 1e3 * itl_sum / (double)n_itl : 0;
    long n_fail = b.n_req - n_ok;
    char mode[64];
    if (b.rate > 0) snprintf(mode, sizeof mode, "rate %.3g/s", b.rate);
    else snprintf(mode, sizeof mode, "concurrency %ld", b.concurrency);
    if (json)
        printf("{\"model\": \"%s\", \"requests\": %ld, \"failed\": %ld, \"concurrency\": %ld, \"rate\": %g, "
               "\"duration_s\": %.3f, \"requests_per_s\": %.4f, \"output_tokens_per_s\": %.2f, "
               "\"total_tokens_per_s\": %.2f, \"prompt_tokens\": %ld, \"output_tokens\": %ld, "
               "\"ttft_ms\": {\"mean\": %.3f, \"p50\": %.3f, \"p90\": %.3f, \"p99\": %.3f}, "
               "\"itl_ms\": {\"mean\": %.3f, \"p50\": %.3f, \"p90\": %.3f, \"p99\": %.3f}}\n",
               b.t.model, b.n_req, n_fail, b.rate > 0 ? 0 : b.concurrency, b.rate, dur, (double)n_ok / dur,
               (double)out_tok / dur, (double)(in_tok + out_tok) / dur, in_tok, out_tok, tm,
               1e3 * pct(ttft, (int)n_ok, 50), 1e3 * pct(ttft, (int)n_ok, 90), 1e3 * pct(ttft, (int)n_ok, 99), im,
               1e3 * pct(itl, (int)n_itl, 50), 1e3 * pct(itl, (int)n_itl, 90), 1e3 * pct(itl, (int)n_itl, 99));
    else
        printf("| model | load | requests | failed | duration s | requests/s | output tok/s | total tok/s |\n"
               "|---|---|---:|---:|---:|---:|---:|---:|\n"
               "| %s | %s | %ld | %ld | %.2f | %.3f | %.1f | %.1f |\n\n"
               "| latency (ms) | mean | p50 | p90 | p99 |\n|---|---:|---:|---:|---:|\n"
               "| time to first token | %.2f | %.2f | %.2f | %.2f |\n"
               "| inter-token latency | %.2f | %.2f | %.2f | %.2f |\n",
               b.t.model, mode, b.n_req, n_fail, dur, (double)n_ok / dur, (double)out_tok / dur,
               (double)(in_tok + out_tok) / dur, tm, 1e3 * pct(ttft, (int)n_ok, 50), 1e3 * pct(ttft, (int)n_ok, 90),
               1e3 * pct(ttft, (int)n_ok, 99), im, 1e3 * pct(itl, (int)n_itl, 50), 1e3 * pct(itl, (int)n_itl, 90),
               1e3 * pct(itl, (int)n_itl, 99));
    if (first_err) fprintf(stderr, "kvllm: %ld request(s) failed; first error: %s\n", n_fail, first_err);
    for (long i = 0; i < b.n_req; i++) free(b.res[i].itl);
    free(ttft);
    free(itl);
    free(b.arrival);
    free(b.res);
    return n_fail ? 1 : 0;
}
