/* cmd_serve.c — `kvllm serve`: the OpenAI-compatible HTTP server.
 *
 * HTTP comes up before the model loads so that /health can say 503 while it
 * does.  SIGINT / SIGTERM / SIGUSR1 are blocked in every thread and taken by
 * sigwaitinfo() here, so shutdown runs in plain code (no async-signal-safety
 * puzzles): drain (no new completions, /health says "draining") while running
 * requests finish, for up to --shutdown-timeout seconds or until a second
 * signal; then end what remains (streams get an error event and [DONE],
 * whole responses 503), stop HTTP, join the engine thread, free everything.
 *
 * Under mpirun (tensor parallelism) rank 0 drains the same way and then lets
 * the other ranks go; which signals drain there is job_killed's story. */
#include "cli.h"
#include "cli_opts.h"
#include "kvllm.h"
#include "server/server.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

enum {
    V_HELP = 1, V_VERSION, V_MODEL, V_TOKENIZER, V_ALIAS, V_HOST, V_PORT, V_API_KEY, V_METRICS_PUBLIC, V_MAX_QUEUE,
    V_MAX_BODY, V_MAX_CONNS, V_MAX_CONNS_CLIENT, V_HEADER_TIMEOUT, V_BODY_TIMEOUT, V_IDLE_TIMEOUT, V_SHUTDOWN_TIMEOUT,
    V_TEMPLATE, V_TEMPLATE_FILE, V_SPECIAL_IN_CONTENT, V_TOOL_FORMAT, V_TOOL_PARSER, V_AUTO_TOOL, V_ORIGINS,
    V_LOG_FORMAT, V_LOG_INTERVAL, V_JINJA, V_PREFIX_CACHING, V_NO_PREFIX_CACHING, V_CTX, V_PARALLEL, V_BATCHED_TOKENS,
    V_THREADS, V_VERBOSE, V_KV_EVENTS, V_KV_REPLAY, V_KV_TOPIC, V_KV_LAYOUT, V_KV_MAX_QUEUED,
};

/* serve's options: the parser, --help and docs/CLI.md's reference (kvllm help --markdown) read this table */
static const struct cli_opt k_serve_opts[] = {
    { V_MODEL, "-m, --model", "PATH", CLI_VALUE,
      "GGUF file, Hugging Face folder or llama2.c checkpoint (or first positional argument,\nas `vllm serve MODEL`); "
      "a name owner/name that is no path is a Hugging Face\nrepository, downloaded (its folder, else a .gguf: -hf "
      "below)" },
    { V_TOKENIZER, "--tokenizer", "PATH", CLI_VALUE, "vocabulary for models without one" },
    { V_ALIAS, "--alias, --served-model-name", "NAME", CLI_VALUE,
      "model id clients use (default: the file name without .gguf / .bin, the folder\nname, or the repository's name)" },
    { V_HOST, "--host", "ADDR", CLI_VALUE, "address to listen on (default 127.0.0.1)" },
    { V_PORT, "--port", "N", CLI_VALUE, "port (default 8080; 0 = any free port, printed on stderr)" },
    { V_API_KEY, "--api-key", "KEY", CLI_VALUE, "require 'Authorization: Bearer KEY' everywhere but /health" },
    { V_METRICS_PUBLIC, "--metrics-public", NULL, CLI_FLAG, "serve /metrics without the API key" },
    { V_MAX_QUEUE, "--max-queue", "N", CLI_VALUE, "requests waiting before 429 (default 1024)" },
    { V_MAX_BODY, "--max-body", "SIZE", CLI_VALUE, "largest request body in bytes (default 1M; more gets 413)" },
    { V_MAX_CONNS, "--max-connections", "N", CLI_VALUE, "open connections; more are answered 503 (default 4096)" },
    { V_MAX_CONNS_CLIENT, "--max-connections-per-client", "N", CLI_VALUE,
      "from one address; more are answered 503 (default 1024)" },
    { V_HEADER_TIMEOUT, "--header-timeout", "S", CLI_VALUE, "seconds to send the request headers (default 10)" },
    { V_BODY_TIMEOUT, "--body-timeout", "S", CLI_VALUE, "seconds to send the request body (default 30)" },
    { V_IDLE_TIMEOUT, "--idle-timeout", "S", CLI_VALUE, "seconds a connection may stay silent (default 30)" },
    { V_SHUTDOWN_TIMEOUT, "--shutdown-timeout", "S", CLI_VALUE,
      "on SIGTERM / SIGINT / SIGUSR1, seconds running requests get to finish (default\n10); under mpirun signal "
      "mpirun with SIGUSR1 (docs/TP.md)" },
    { V_TEMPLATE, "--chat-template", "NAME", CLI_VALUE,
      "chat template (default: the model's own): a llama.cpp built-in name kvllm has\n(chatml, llama3, gemma, phi3, "
      "zephyr) or Jinja text" },
    { V_TEMPLATE_FILE, "--chat-template-file", "FILE", CLI_VALUE, "the Jinja chat template in a file" },
    { V_SPECIAL_IN_CONTENT, "--special-in-content", NULL, CLI_FLAG,
      "control-token text in chat messages (\"<|im_end|>\" typed by a user) becomes\ncontrol tokens, as Transformers "
      "does (default: it is read as text)" },
    { V_TOOL_FORMAT, "--tool-call-format", "F", CLI_VALUE,
      "how tool calls are read from answers: auto (default: from the chat template's\ntext), hermes, llama3, mistral, "
      "or none (tool calling off)" },
    { V_TOOL_PARSER, "--tool-call-parser", "P", CLI_VALUE, "vLLM's names: hermes, llama3_json, mistral" },
    { V_AUTO_TOOL, "--enable-auto-tool-choice", NULL, CLI_FLAG,
      "accepted (vLLM): tool calling is on whenever the format is known" },
    { V_ORIGINS, "--allowed-origins", "LIST", CLI_VALUE,
      "CORS: origins (comma-separated, or '*') whose pages may call the server from a\nbrowser: OPTIONS preflight "
      "answered, Access-Control-Allow-* headers (default: none)" },
    { V_KV_EVENTS, "--kv-events", "ENDPOINT", CLI_VALUE,
      "publish what the prefix cache stores and evicts on a ZMQ PUB socket bound there\n(tcp://HOST:PORT), as "
      "vLLM's KV events, for KV-aware routers (docs/SCALE.md)" },
    { V_KV_REPLAY, "--kv-events-replay", "ENDPOINT", CLI_VALUE,
      "ROUTER socket where a late subscriber asks for the event batches it missed" },
    { V_KV_TOPIC, "--kv-events-topic", "T", CLI_VALUE, "topic frame of every event message (default: empty)" },
    { V_KV_LAYOUT, "--kv-events-layout", "map|array", CLI_VALUE,
      "events as tagged maps (default: vLLM today, vllm-router) or positional arrays\n(vLLM <= 0.11)" },
    { V_KV_MAX_QUEUED, "--kv-events-max-queued", "N", CLI_VALUE,
      "tokens of events waiting for the publisher before it counts as fallen behind:\nthey are dropped and "
      "subscribers told AllBlocksCleared (default 16777216)" },
    { V_LOG_FORMAT, "--log-format", "text|json", CLI_VALUE,
      "one line per finished request and a periodic engine line, as text (default) or JSON" },
    { V_LOG_INTERVAL, "--log-interval", "S", CLI_VALUE, "seconds between engine lines while busy (default 10; 0 = none)" },
    { V_JINJA, "--jinja, --no-webui", NULL, CLI_FLAG, "accepted (llama-server): the chat template is always used" },
    { V_PREFIX_CACHING, "--enable-prefix-caching", NULL, CLI_FLAG, "accepted (vLLM): prefix caching is on by default" },
    { V_NO_PREFIX_CACHING, "--no-enable-prefix-caching", NULL, CLI_FLAG, "= --no-prefix-cache (vLLM)" },
    { V_CTX, "-c, --ctx-size, --max-model-len", "N", CLI_VALUE, "context length (default: the model's)" },
    { V_PARALLEL, "-np, --parallel, --max-num-seqs", "N", CLI_VALUE, "sequences running at once (= --max-seqs)" },
    { V_BATCHED_TOKENS, "--max-num-batched-tokens", "N", CLI_VALUE, "tokens computed per step (= --max-batch-tokens, vLLM)" },
    { V_THREADS, "-t, --threads", "N", CLI_VALUE, "threads (default: all CPUs)" },
    { V_VERBOSE, "-v, --verbose", NULL, CLI_FLAG, "debug logging" },
    { V_VERSION, "--version", NULL, CLI_FLAG, "print the version, commit and kernel sets" },
    { V_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_serve_group = CLI_GROUP(NULL, k_serve_opts);
static const struct cli_opt_group *const k_serve_groups[] = {
    &k_serve_group, &cli_hf_group, &cli_engine_group, &cli_spec_group, &cli_gpu_group,
    &cli_tp_group,
};

static const struct cli_cmd k_serve_cmd = {
    .name = "serve",
    .synopsis = "[-m] MODEL [options]",
    .groups = CLI_GROUPS(k_serve_groups),
    .n_own = 1,
};

void cmd_serve_markdown(FILE *f) { cli_cmd_markdown(&k_serve_cmd, f); }
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

/* How long a failed server (a tensor-parallel rank lost) keeps answering before it exits. */
#define FAILED_LINGER_S 2.0

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *sig_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

/* Whether a stop signal says the tensor-parallel job is being killed rather than asked to drain.  Under
 * mpirun the launcher (mpirun, or its daemon on another machine: this process's parent) sends SIGTERM
 * when it ends the job, because it was signalled itself or because a rank died, and SIGKILLs every rank a
 * second later (Open MPI's odls_base_sigkill_timeout; raising it only delays the SIGTERM as much): no
 * drain can finish, and the other ranks may be gone, so the job fails at once.  SIGUSR1, which mpirun
 * forwards to every rank without ending the job, and SIGTERM or SIGINT sent to rank 0 by any other
 * process, drain as in one process; the other ranks ignore SIGUSR1 and follow rank 0 to the end. */
static bool job_killed(const siginfo_t *si) {
    return cli_tp_size() > 1 && si->si_signo != SIGUSR1 && si->si_pid == getppid();
}

/* After the first signal: let running requests finish for up to grace
 * seconds; a second SIGINT or SIGTERM cuts it short (a SIGUSR1 does not: the
 * drain signal may come twice, from mpirun and from whoever signalled both
 * it and its ranks).  Returns that signal's number (its sender in *si), or 0
 * when the drain ended by itself. */
static int drain(struct server *srv, const sigset_t *sigs, double grace, siginfo_t *si) {
    server_drain(srv);
    const double until = mono_now() + grace;
    int sig = 0;
    while (server_running(srv) > 0 || server_failed(srv)) {
        double left = until - mono_now();
        if (left <= 0) break;
        if (left > 0.02) left = 0.02;
        struct timespec ts = { 0, (long)(left * 1e9) };
        if ((sig = sigtimedwait(sigs, si, &ts)) > 0 && sig != SIGUSR1) break;
        sig = 0;
    }
    int n = server_running(srv);
    if (n) server_log(srv, KVLLM_LOG_INFO, "ending %d request%s still running", n, n == 1 ? "" : "s");
    return sig;
}

/* The tensor-parallel job is being killed (job_killed): the running requests cannot finish and end with
 * an error now, while the process still can tell their clients. */
static void fail_job(const siginfo_t *si) {
    kvllm_tp_fail(si->si_signo == SIGINT ? "SIGINT from mpirun: the job is being stopped"
                                         : "SIGTERM from mpirun: the job is being stopped");
}

/* From the first stop signal to the end: drain, or fail at once when the job is being killed or the
 * engine failed.  0, or KVLLM_ECOMM when the engine failed (the process then exits non-zero). */
static int serve_until_stopped(struct server *srv, struct kvllm_engine *e, const sigset_t *sigs, double grace) {
    siginfo_t si;
    while (sigwaitinfo(sigs, &si) < 0) {}   /* EINTR: a stray handler's signal */
    if (job_killed(&si) && !server_failed(srv)) fail_job(&si);
    if (!kvllm_engine_failed(e)) {
        server_log(srv, KVLLM_LOG_INFO, "%s: draining (up to %g s; SIGINT or SIGTERM to stop now)",
                   sig_name(si.si_signo), grace);
        if (!drain(srv, sigs, grace, &si) || !job_killed(&si)) return 0;
        /* killed while draining (a rank died, or mpirun was told to stop): a step may wait on a rank
         * that is gone, so the job fails rather than stopping */
        fail_job(&si);
    }
    /* the running requests were ended with errors; /health answers "failed" a moment (for whoever polls
     * it), then the process exits non-zero */
    server_log(srv, KVLLM_LOG_ERROR, "the engine failed: stopping in %g s", FAILED_LINGER_S);
    drain(srv, sigs, FAILED_LINGER_S, &si);
    return KVLLM_ECOMM;
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
    struct cli_hf hf = { 0 };
    sp.log_interval = 10;
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const char *a = argv[i], *v;
        if (a[0] != '-' && !model) { model = a; continue; }   /* vllm serve MODEL */
        int m = cli_engine_opt(argc, argv, &i, &ep);
        if (m == 0) m = cli_gpu_opt(argc, argv, &i);
        if (m == 0) m = cli_hf_opt(argc, argv, &i, &hf);
        if (m < 0) return 2;
        if (m > 0) continue;
        const struct cli_opt *op;
        if (cli_cmd_next(&k_serve_cmd, argc, argv, &i, &op, &v) < 0) return 2;
        switch (op->id) {
        case V_HELP: cli_cmd_usage(&k_serve_cmd, stdout); return 0;
        case V_VERSION: cli_print_version(stdout); return 0;
        case V_VERBOSE: verbose = true; break;
        case V_JINJA: case V_PREFIX_CACHING: case V_AUTO_TOOL: break;
        case V_NO_PREFIX_CACHING: ep.prefix_caching = false; break;
        case V_SPECIAL_IN_CONTENT: sp.special_in_content = true; break;
        case V_METRICS_PUBLIC: sp.metrics_public = true; break;
        case V_MODEL: model = v; break;
        case V_TOKENIZER: tokenizer = v; break;
        case V_ALIAS: alias = v; break;
        case V_ORIGINS: sp.allowed_origins = v; break;
        case V_KV_EVENTS: sp.kv_events.endpoint = v; break;
        case V_KV_REPLAY: sp.kv_events.replay_endpoint = v; break;
        case V_KV_TOPIC: sp.kv_events.topic = v; break;
        case V_KV_MAX_QUEUED:
            if (!cli_int(a, v, 1, 1 << 30, &l)) return 2;
            sp.kv_events.max_queued_tokens = (size_t)l;
            break;
        case V_KV_LAYOUT:
            if (strcmp(v, "map") && strcmp(v, "array")) { cli_error("--kv-events-layout: '%s' is not map or array", v); return 2; }
            sp.kv_events.array_layout = !strcmp(v, "array");
            break;
        case V_TOOL_FORMAT: sp.tool_call_format = v; break;
        case V_TOOL_PARSER:
            /* vLLM's parser names for the formats kvllm reads */
            if (!strcmp(v, "hermes") || !strcmp(v, "mistral")) sp.tool_call_format = v;
            else if (!strcmp(v, "llama3_json")) sp.tool_call_format = "llama3";
            else {
                cli_error("--tool-call-parser %s: kvllm reads hermes, llama3_json and mistral calls "
                          "(or --tool-call-format none)", v);
                return 2;
            }
            break;
        case V_LOG_FORMAT:
            if (strcmp(v, "text") && strcmp(v, "json")) { cli_error("--log-format: '%s' is not text or json", v); return 2; }
            sp.log_json = !strcmp(v, "json");
            break;
        case V_LOG_INTERVAL: if (!cli_float(a, v, 0, 86400, &sp.log_interval)) return 2; break;
        case V_PARALLEL: if (!cli_int(a, v, 1, 1 << 20, &l)) return 2; ep.max_seqs = (int)l; break;
        case V_BATCHED_TOKENS: if (!cli_int(a, v, 1, 1 << 20, &l)) return 2; ep.max_batch_tokens = (int)l; break;
        case V_HOST: sp.host = v; break;
        case V_PORT: if (!cli_int(a, v, 0, 65535, &l)) return 2; sp.port = (int)l; break;
        case V_API_KEY: sp.api_key = v; break;
        case V_MAX_QUEUE: if (!cli_int(a, v, 1, 1 << 24, &l)) return 2; ep.max_queue = (int)l; break;
        case V_MAX_BODY: if (!parse_bytes(a, v, &max_body)) return 2; break;
        case V_MAX_CONNS: if (!cli_int(a, v, 1, 1 << 20, &l)) return 2; sp.max_conns = (int)l; break;
        case V_MAX_CONNS_CLIENT: if (!cli_int(a, v, 1, 1 << 20, &l)) return 2; sp.max_conns_per_client = (int)l; break;
        case V_HEADER_TIMEOUT: if (!cli_float(a, v, 0.1, 3600, &sp.header_timeout)) return 2; break;
        case V_BODY_TIMEOUT: if (!cli_float(a, v, 0.1, 3600, &sp.body_timeout)) return 2; break;
        case V_IDLE_TIMEOUT: if (!cli_float(a, v, 1, 3600, &sp.idle_timeout)) return 2; break;
        case V_SHUTDOWN_TIMEOUT: if (!cli_float(a, v, 0, 3600, &grace)) return 2; break;
        case V_TEMPLATE: case V_TEMPLATE_FILE: template_arg = v; template_is_file = op->id == V_TEMPLATE_FILE; break;
        case V_CTX: if (!cli_int(a, v, 2, 1 << 24, &n_ctx)) return 2; break;
        case V_THREADS: if (!cli_int(a, v, 1, 1024, &threads)) return 2; break;
        }
    }
    if (!cli_opt_end()) return 2;
    if (!sp.kv_events.endpoint && (sp.kv_events.replay_endpoint || sp.kv_events.topic || sp.kv_events.max_queued_tokens)) {
        cli_error("serve: --kv-events-replay, --kv-events-topic and --kv-events-max-queued need --kv-events ENDPOINT");
        return 2;
    }
    if (!model && !hf.repo) { cli_error("serve: -m MODEL (or -hf REPO) is required (see kvllm serve --help)"); return 2; }
    /* vllm serve owner/name: a name that is no path is a repository, its Hugging Face folder preferred */
    const char *named = hf.repo ? hf.repo : model;
    if (cli_hf_model(&hf, &model, true, true)) return 1;
    char local[4096];
    if (hf.path) {
        snprintf(local, sizeof local, "%s", hf.path);
        cli_hf_free(&hf);
        model = local;
        if (!alias) alias = named;   /* clients ask for the repository's name, as of vLLM */
    }
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

    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = tokenizer;
    mp.n_threads = (int)threads;
    struct kvllm_model *m = NULL;
    /* a tensor-parallel rank > 0 serves no HTTP: it follows rank 0's engine (and exits there) */
    if (cli_tp_rank() > 0) {
        signal(SIGUSR1, SIG_IGN);   /* mpirun forwards the drain signal to every rank: rank 0 drains */
        return cli_model_load(model, &mp, &m) ? 1 : 0;
    }

    /* every thread created from here on inherits the blocked set */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit();

    struct server *srv = NULL;
    struct kvllm_engine *e = NULL;
    int rc = server_start(&sp, &srv);
    free(tmpl);
    if (rc) return 1;
    server_log(srv, KVLLM_LOG_INFO, "listening on http://%s:%d (model '%s' loading)", sp.host, server_port(srv), id);

    rc = cli_model_load(model, &mp, &m);
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
        rc = serve_until_stopped(srv, e, &sigs, grace);
    }
    server_stop(srv);
    kvllm_engine_free(e);
    kvllm_model_free(ep.draft_model);
    kvllm_model_free(m);
    server_free(srv);
    return rc ? 1 : 0;
}
