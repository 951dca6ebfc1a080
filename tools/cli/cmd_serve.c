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
    "usage: kvllm serve [-m] MODEL [options] [engine options]\n"
    "  -m, --model PATH       GGUF file, Hugging Face folder or llama2.c checkpoint (or first positional argument,\n"
    "                         as `vllm serve MODEL`)\n"
    "  --tokenizer PATH       vocabulary for models without one\n"
    "  --alias NAME           model id clients use (default: the file name without .gguf / .bin, or the folder name);\n"
    "                         also --served-model-name NAME (vLLM)\n"
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
    "  --chat-template NAME   chat template (default: the model's own): a llama.cpp built-in name kvllm has\n"
    "                         (chatml, llama3, gemma, phi3, zephyr) or Jinja text\n"
    "  --chat-template-file FILE  the Jinja chat template in a file\n"
    "  --special-in-content   control-token text in chat messages (\"<|im_end|>\" typed by a user) becomes\n"
    "                         control tokens, as Transformers does (default: it is read as text)\n"
    "  --tool-call-format F   how tool calls are read from answers: auto (default: from the chat template's\n"
    "                         text), hermes, llama3, mistral, or none (tool calling off); also vLLM's\n"
    "                         --tool-call-parser hermes|llama3_json|mistral\n"
    "  --enable-auto-tool-choice  accepted (vLLM): tool calling is on whenever the format is known\n"
    "  --allowed-origins LIST CORS: origins (comma-separated, or '*') whose pages may call the server from a\n"
    "                         browser: OPTIONS preflight answered, Access-Control-Allow-* headers (default: none)\n"
    "  --log-format text|json one line per finished request and a periodic engine line, as text (default) or JSON\n"
    "  --log-interval S       seconds between engine lines while busy (default 10; 0 = none)\n"
    "  --jinja                accepted (llama-server): the chat template is always used\n"
    "  -c, --ctx-size N       context length (default: the model's); also --max-model-len N (vLLM)\n"
    "  -np, --parallel N      sequences running at once (= --max-seqs; also --max-num-seqs, vLLM)\n"
    "  --max-num-batched-tokens N  tokens computed per step (= --max-batch-tokens, vLLM)\n"
    "  -t, --threads N        threads (default: all CPUs)\n"
    "  -v, --verbose          debug logging\n"
    "  --version              print the version, commit and kernel sets\n";

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
    if (n) server_log(srv, KVLLM_LOG_INFO, "ending %d request%s still running", n, n == 1 ? "" : "s");
}

int cmd_serve(int argc, char **argv) {
    const char *model = NULL, *tokenizer = NULL, *alias = NULL, *template_arg = NULL;
    bool template_is_file = false;
    struct server_params sp = { .host = "127.0.0.1", .port = 8080 };
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    long threads = 0, n_ctx = 0, l;
    uint64_t max_body = 1 << 20;
    double grace = 10;
    bool verbose = false;
    sp.log_interval = 10;
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const char *a = argv[i], *v;
        if (cli_is_help(a)) {
            fputs(k_usage, stdout);
            fputs(cli_engine_usage, stdout);
            fputs(cli_gpu_usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--version")) { cli_print_version(stdout); return 0; }
        if (a[0] != '-' && !model) { model = a; continue; }   /* vllm serve MODEL */
        int eo = cli_engine_opt(argc, argv, &i, &ep);
        if (eo == 0) eo = cli_gpu_opt(argc, argv, &i);
        if (eo < 0) return 2;
        if (eo > 0) continue;
        if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { verbose = true; continue; }
        if (!strcmp(a, "--jinja") || !strcmp(a, "--no-webui") || !strcmp(a, "--enable-prefix-caching") ||
            !strcmp(a, "--enable-auto-tool-choice"))
            continue;
        if (!strcmp(a, "--no-enable-prefix-caching")) { ep.prefix_caching = false; continue; }
        if (!strcmp(a, "--special-in-content")) { sp.special_in_content = true; continue; }
        if (!strcmp(a, "--metrics-public")) { sp.metrics_public = true; continue; }
        if (!strstr(k_usage, a) || a[0] != '-') { cli_unknown("serve", a, k_usage, cli_engine_usage); return 2; }
        if (!(v = cli_arg(argc, argv, &i))) return 2;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tokenizer")) tokenizer = v;
        else if (!strcmp(a, "--alias") || !strcmp(a, "--served-model-name")) alias = v;
        else if (!strcmp(a, "--allowed-origins")) sp.allowed_origins = v;
        else if (!strcmp(a, "--tool-call-format")) sp.tool_call_format = v;
        else if (!strcmp(a, "--tool-call-parser")) {
            /* vLLM's parser names for the formats kvllm reads */
            if (!strcmp(v, "hermes") || !strcmp(v, "mistral")) sp.tool_call_format = v;
            else if (!strcmp(v, "llama3_json")) sp.tool_call_format = "llama3";
            else {
                cli_error("--tool-call-parser %s: kvllm reads hermes, llama3_json and mistral calls "
                          "(or --tool-call-format none)", v);
                return 2;
            }
        }
        else if (!strcmp(a, "--log-format")) {
            if (strcmp(v, "text") && strcmp(v, "json")) { cli_error("--log-format: '%s' is not text or json", v); return 2; }
            sp.log_json = !strcmp(v, "json");
        }
        else if (!strcmp(a, "--log-interval")) { if (!cli_float(a, v, 0, 86400, &sp.log_interval)) return 2; }
        else if (!strcmp(a, "-np") || !strcmp(a, "--parallel") || !strcmp(a, "--max-num-seqs")) {
            if (!cli_int(a, v, 1, 1 << 20, &l)) return 2;
            ep.max_seqs = (int)l;
        }
        else if (!strcmp(a, "--max-num-batched-tokens")) { if (!cli_int(a, v, 1, 1 << 20, &l)) return 2; ep.max_batch_tokens = (int)l; }
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
        else if (!strcmp(a, "--chat-template") || !strcmp(a, "--chat-template-file")) {
            template_arg = v;
            template_is_file = !strcmp(a, "--chat-template-file");
        }
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size") || !strcmp(a, "--max-model-len")) {
            if (!cli_int(a, v, 2, 1 << 24, &n_ctx)) return 2;
        }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (!cli_int(a, v, 1, 1024, &threads)) return 2; }
        else { cli_unknown("serve", a, k_usage, cli_engine_usage); return 2; }
    }
    if (!cli_opt_end()) return 2;
    if (!model) { cli_error("serve: -m MODEL is required (see kvllm serve --help)"); return 2; }
    if (verbose) kvllm_log_set_level(KVLLM_LOG_DEBUG);
    char id[256];
    model_id(model, alias, id, sizeof id);
    char *tmpl = template_arg ? cli_chat_template(template_is_file ? "--chat-template-file" : "--chat-template",
                                                  template_arg, template_is_file) : NULL;
    if (template_arg && !tmpl) return 1;
    sp.model_id = id;
    sp.max_seqs = ep.max_seqs;
    sp.version = cli_version_string();
    sp.commit = cli_commit_string();
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
    server_log(srv, KVLLM_LOG_INFO, "listening on http://%s:%d (model '%s' loading)", sp.host, server_port(srv), id);

    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = tokenizer;
    mp.n_threads = (int)threads;
    rc = kvllm_model_load(model, &mp, &m);
    if (!rc) {
        const struct kvllm_model_desc *d = kvllm_model_describe(m);
        ep.n_ctx = n_ctx > 0 ? (int)n_ctx : d->n_ctx_train;
        rc = cli_spec_setup(&ep, mp.n_threads) ? KVLLM_EINVAL : kvllm_engine_new(m, &ep, &e);
    }
    if (!rc && !template_arg && !kvllm_model_chat_template(m, NULL, NULL))
        server_log(srv, KVLLM_LOG_WARN, "%s has no chat template (a base model?): /v1/chat/completions will answer 400; "
                   "give one with --chat-template NAME or --chat-template-file FILE, or use /v1/completions", id);
    if (!rc) rc = server_ready(srv, m, e, ep.n_ctx);
    if (!rc) {
        server_log(srv, KVLLM_LOG_INFO, "ready: %s on http://%s:%d (context %d, max %d sequences)", id, sp.host,
                server_port(srv), ep.n_ctx, ep.max_seqs);
        int sig = 0;
        sigwait(&sigs, &sig);
        server_log(srv, KVLLM_LOG_INFO, "%s: draining (up to %g s; signal again to stop now)",
                sig == SIGINT ? "SIGINT" : "SIGTERM", grace);
        drain(srv, &sigs, grace);
    }
    server_stop(srv);
    kvllm_engine_free(e);
    kvllm_model_free(ep.draft_model);
    kvllm_model_free(m);
    server_free(srv);
    return rc ? 1 : 0;
}
