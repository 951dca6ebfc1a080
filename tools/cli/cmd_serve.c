/* cmd_serve.c — `kvllm serve`: the OpenAI-compatible HTTP server.
 *
 * HTTP comes up before the model loads so that /health can say 503 while it
 * does.  SIGINT / SIGTERM are blocked in every thread and taken by sigwait()
 * here, so shutdown runs in plain code (no async-signal-safety puzzles):
 * drain (no new completions, /health says "draining") while running
 * requests finish, for up to --shutdown-timeout seconds or until a second
 * signal; then end what remains (streams get an error event and [DONE],
 * whole responses 503), stop HTTP, join the engine thread, free everything. */
#include "cli.h"
#include "kvllm.h"
#include "server/server.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static const char *k_usage =
    "usage: kvllm serve -m MODEL [options] [engine options]\n"
    "  -m, --model PATH       GGUF file, Hugging Face folder or llama2.c checkpoint\n"
    "  --tokenizer PATH       vocabulary for models without one\n"
    "  --alias NAME           model id clients use (default: the file name without .gguf / .bin, or the folder name)\n"
    "  --host ADDR            address to listen on (default 127.0.0.1)\n"
    "  --port N               port (default 8080; 0 = any free port, printed on stderr)\n"
    "  --api-key KEY          require 'Authorization: Bearer KEY' everywhere but /health\n"
    "  --metrics-public       serve /metrics without the API key\n"
    "  --max-queue N          requests waiting before 429 (default 1024)\n"
    "  --max-body SIZE        largest request body in bytes (default 1M; more gets 413)\n"
    "  --max-connections N    open connections; more are answered 503 (default 4096)\n"
    "  --max-connections-per-client N  from one address; more are answered 503 (default 1024)\n"
    "  --header-timeout S     seconds to send the request headers (default 10)\n"
    "  --body-timeout S       seconds to send the request body (default 30)\n"
    "  --idle-timeout S       seconds a connection may stay silent (default 30)\n"
    "  --shutdown-timeout S   on SIGTERM / SIGINT, seconds running requests get to finish (default 10)\n"
    "  --chat-template FILE   Jinja chat template (default: the model's own)\n"
    "  --special-in-content   control-token text in chat messages (\"<|im_end|>\" typed by a user) becomes\n"
    "                         control tokens, as Transformers does (default: it is read as text)\n"
    "  -c, --ctx-size N       context length (default: the model's)\n"
    "  -t, --threads N        threads (default: all CPUs)\n"
    "  -v, --verbose          debug logging\n";

/* The model id: --alias, else the file (or folder) name without .gguf / .bin. */
static void model_id(const char *path, const char *alias, char *out, size_t cap) {
    if (alias) { snprintf(out, cap, "%s", alias); return; }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
    const char *base = strrchr(buf, '/');
    base = base ? base + 1 : buf;
    snprintf(out, cap, "%s", base);
    n = strlen(out);
    if (n > 5 && !strcmp(out + n - 5, ".gguf")) out[n - 5] = 0;
    else if (n > 4 && !strcmp(out + n - 4, ".bin")) out[n - 4] = 0;
}

static bool parse_bytes(const char *opt, const char *v, uint64_t *out) {
    char *end;
    double d = strtod(v, &end);
    double mul = *end == 'k' || *end == 'K' ? 1024.0 : *end == 'm' || *end == 'M' ? 1048576.0
               : *end == 'g' || *end == 'G' ? 1073741824.0 : 1.0;
    if (mul > 1) end++;
    if (end == v || *end || !(d >= 1) || d * mul > 1e12) {
        cli_error("%s: '%s' is not a size in bytes (e.g. 65536, 512K, 4M)", opt, v);
        return false;
    }
    *out = (uint64_t)(d * mul);
    return true;
}

/* Many clients need many sockets: take the hard limit (server.c fits its
 * connection limit under whatever this leaves). */
static void raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= rl.rlim_max) return;
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
}

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* After the first signal: let running requests finish for up to grace
 * seconds; a second signal cuts it short. */
static void drain(struct server *srv, const sigset_t *sigs, double grace) {
    server_drain(srv);
    const double until = mono_now() + grace;
    while (server_running(srv) > 0) {
        double left = until - mono_now();
        if (left <= 0) break;
        if (left > 0.02) left = 0.02;
        struct timespec ts = { 0, (long)(left * 1e9) };
        if (sigtimedwait(sigs, NULL, &ts) > 0) break;
    }
    int n = server_running(srv);
    if (n) fprintf(stderr, "kvllm: ending %d request%s still running\n", n, n == 1 ? "" : "s");
}

int cmd_serve(int argc, char **argv) {
    const char *model = NULL, *tokenizer = NULL, *alias = NULL, *template_path = NULL;
    struct server_params sp = { .host = "127.0.0.1", .port = 8080 };
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    long threads = 0, n_ctx = 0, l;
    uint64_t max_body = 1 << 20;
    double grace = 10;
    bool verbose = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (cli_is_help(a)) { fputs(k_usage, stdout); fputs(cli_engine_usage, stdout); return 0; }
        int eo = cli_engine_opt(argc, argv, &i, &ep);
        if (eo < 0) return 2;
        if (eo > 0) continue;
        if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { verbose = true; continue; }
        if (!strcmp(a, "--special-in-content")) { sp.special_in_content = true; continue; }
        if (!strcmp(a, "--metrics-public")) { sp.metrics_public = true; continue; }
        if (!(v = cli_arg(argc, argv, &i))) return 2;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tokenizer")) tokenizer = v;
        else if (!strcmp(a, "--alias")) alias = v;
        else if (!strcmp(a, "--host")) sp.host = v;
        else if (!strcmp(a, "--port")) { if (!cli_int(a, v, 0, 65535, &l)) return 2; sp.port = (int)l; }
        else if (!strcmp(a, "--api-key")) sp.api_key = v;
        else if (!strcmp(a, "--max-queue")) { if (!cli_int(a, v, 1, 1 << 24, &l)) return 2; ep.max_queue = (int)l; }
        else if (!strcmp(a, "--max-body")) { if (!parse_bytes(a, v, &max_body)) return 2; }
        else if (!strcmp(a, "--max-connections")) { if (!cli_int(a, v, 1, 1 << 20, &l)) return 2; sp.max_conns = (int)l; }
        else if (!strcmp(a, "--max-connections-per-client")) {
            if (!cli_int(a, v, 1, 1 << 20, &l)) return 2;
            sp.max_conns_per_client = (int)l;
        }
        else if (!strcmp(a, "--header-timeout")) { if (!cli_float(a, v, 0.1, 3600, &sp.header_timeout)) return 2; }
        else if (!strcmp(a, "--body-timeout")) { if (!cli_float(a, v, 0.1, 3600, &sp.body_timeout)) return 2; }
        else if (!strcmp(a, "--idle-timeout")) { if (!cli_float(a, v, 1, 3600, &sp.idle_timeout)) return 2; }
        else if (!strcmp(a, "--shutdown-timeout")) { if (!cli_float(a, v, 0, 3600, &grace)) return 2; }
        else if (!strcmp(a, "--chat-template")) template_path = v;
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) { if (!cli_int(a, v, 2, 1 << 24, &n_ctx)) return 2; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (!cli_int(a, v, 1, 1024, &threads)) return 2; }
        else { cli_error("serve: unknown option '%s' (see kvllm serve --help)", a); return 2; }
    }
    if (!model) { cli_error("serve: -m MODEL is required (see kvllm serve --help)"); return 2; }
    if (verbose) kvllm_log_set_level(KVLLM_LOG_DEBUG);
    char id[256];
    model_id(model, alias, id, sizeof id);
    char *tmpl = template_path ? cli_read_file(template_path, NULL) : NULL;
    if (template_path && !tmpl) return 1;
    sp.model_id = id;
    sp.chat_template = tmpl;
    sp.max_body = (size_t)max_body;

    /* every thread created from here on inherits the blocked set */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit();

    struct server *srv = NULL;
    struct kvllm_model *m = NULL;
    struct kvllm_engine *e = NULL;
    int rc = server_start(&sp, &srv);
    free(tmpl);
    if (rc) return 1;
    fprintf(stderr, "kvllm: listening on http://%s:%d (model '%s' loading)\n", sp.host, server_port(srv), id);

    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = tokenizer;
    mp.n_threads = (int)threads;
    rc = kvllm_model_load(model, &mp, &m);
    if (!rc) {
        const struct kvllm_model_desc *d = kvllm_model_describe(m);
        ep.n_ctx = n_ctx > 0 ? (int)n_ctx : d->n_ctx_train;
        rc = kvllm_engine_new(m, &ep, &e);
    }
    if (!rc) rc = server_ready(srv, m, e, ep.n_ctx);
    if (!rc) {
        fprintf(stderr, "kvllm: ready: %s on http://%s:%d (context %d, max %d sequences)\n", id, sp.host,
                server_port(srv), ep.n_ctx, ep.max_seqs);
        int sig = 0;
        sigwait(&sigs, &sig);
        fprintf(stderr, "kvllm: %s: draining (up to %g s; signal again to stop now)\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM", grace);
        drain(srv, &sigs, grace);
    }
    server_stop(srv);
    kvllm_engine_free(e);
    kvllm_model_free(m);
    server_free(srv);
    return rc ? 1 : 0;
}
