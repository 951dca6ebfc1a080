/* cmd_run.c — `kvllm run`: prompt in, generated text (or ids) out.
 * stdout carries only the prompt echo and the generated text (or the ids);
 * logs, the memory plan and the timing line go to stderr. */
#include "cli.h"
#include "cli_opts.h"
#include "kvllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
    R_HELP = 1, R_VERSION, R_MODEL, R_TOKENIZER, R_PROMPT, R_FILE, R_SYSTEM, R_PARSE_SPECIAL, R_NO_PARSE_SPECIAL,
    R_N_PREDICT, R_CTX, R_THREADS, R_NO_KV, R_IGNORE_EOS, R_GRAMMAR, R_GRAMMAR_FILE, R_SCHEMA, R_SCHEMA_FILE,
    R_SCHEMA_STRICT, R_MIN_TOKENS, R_STOP_ID, R_NO_ECHO, R_IDS, R_COLOR, R_VERBOSE_PROMPT, R_NO_CNV, R_CNV, R_QUIET,
};

/* run's options: the parser, --help and docs/CLI.md's reference (kvllm help --markdown) read this table */
static const struct cli_opt k_run_opts[] = {
    { R_MODEL, "-m, --model", "PATH", CLI_VALUE, "GGUF file, Hugging Face folder or llama2.c checkpoint" },
    { R_TOKENIZER, "--tokenizer", "PATH", CLI_VALUE,
      "vocabulary (llama2.c tokenizer.bin or GGUF) for models without one" },
    { R_PROMPT, "-p, --prompt", "TEXT", CLI_VALUE, "prompt (default: BOS alone); '-' reads it from stdin" },
    { R_FILE, "-f, --file", "FILE", CLI_VALUE, "read the prompt from FILE ('-': stdin)" },
    { R_SYSTEM, "-sys, --system-prompt", "TEXT", CLI_VALUE,
      "answer the prompt as a chat turn under this system message\n(the model's chat template; the answer ends at "
      "end of turn)" },
    { R_PARSE_SPECIAL, "--parse-special", NULL, CLI_FLAG,
      "read special-token text in the prompt (\"<|im_start|>\") as control tokens\n(default: on when the prompt "
      "holds such text, as llama-cli)" },
    { R_NO_PARSE_SPECIAL, "--no-parse-special", NULL, CLI_FLAG, "read it as plain text" },
    { R_N_PREDICT, "-n, --n-predict", "N", CLI_VALUE,
      "new tokens to generate (default 128; -1: until end of text or context)" },
    { R_CTX, "-c, --ctx-size", "N", CLI_VALUE, "context length (default: the model's; above it warns)" },
    { R_THREADS, "-t, --threads", "N", CLI_VALUE, "threads (default: all CPUs)" },
    { R_NO_KV, "--no-kv-cache", NULL, CLI_FLAG, "recompute the whole prefix every step (baseline)" },
    { R_IGNORE_EOS, "--ignore-eos", NULL, CLI_FLAG, "do not stop at end-of-sequence" },
    { R_GRAMMAR, "--grammar", "TEXT", CLI_VALUE,
      "constrain the output to a GBNF grammar (llama.cpp's format; start rule root)" },
    { R_GRAMMAR_FILE, "--grammar-file", "FILE", CLI_VALUE, "the GBNF grammar in a file" },
    { R_SCHEMA, "-j, --json-schema", "TEXT", CLI_VALUE,
      "constrain the output to JSON valid under a JSON Schema ('{...}')" },
    { R_SCHEMA_FILE, "-jf, --json-schema-file", "FILE", CLI_VALUE, "the JSON Schema in a file" },
    { R_SCHEMA_STRICT, "--json-schema-strict", NULL, CLI_FLAG,
      "with a JSON Schema: no properties beyond those listed (OpenAI's strict)" },
    { R_MIN_TOKENS, "--min-tokens", "N", CLI_VALUE, "end-of-sequence and --stop-token-id held back until N tokens" },
    { R_STOP_ID, "--stop-token-id", "ID", CLI_VALUE, "stop when this token id is sampled (not printed); repeatable" },
    { R_NO_ECHO, "--no-echo", NULL, CLI_FLAG, "do not print the prompt" },
    { R_IDS, "--ids", NULL, CLI_FLAG, "print the generated token ids instead of text" },
    { R_COLOR, "--color, -co", "[on|off|auto]", CLI_OPTIONAL,
      "prompt echo in yellow, generated text plain (alone: on; auto: on a terminal)" },
    { R_VERBOSE_PROMPT, "--verbose-prompt", NULL, CLI_FLAG,
      "print the prompt's token ids (and pieces) on stderr before generating" },
    { R_NO_CNV, "-no-cnv, --no-conversation", NULL, CLI_FLAG, "accepted (run is one completion)" },
    { R_CNV, "-cnv, --conversation, -i, --interactive", NULL, CLI_FLAG, "refused: `kvllm chat` converses" },
    { R_QUIET, "-q, --quiet", NULL, CLI_FLAG, "only errors on stderr" },
    { R_VERSION, "--version", NULL, CLI_FLAG, "print the version, commit and kernel sets" },
    { R_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_run_group = CLI_GROUP(NULL, k_run_opts);
static const struct cli_opt_group *const k_run_groups[] = {
    &k_run_group, &cli_sampling_group, &cli_hf_group, &cli_engine_group, &cli_spec_group, &cli_gpu_group,
    &cli_tp_group,
};

struct run_opts {
    const char *model, *tokenizer, *prompt, *file, *system;
    char *prompt_buf;       /* -f FILE or -p -: malloc'd */
    long n_predict, n_ctx, n_threads;
    int parse_special;      /* -1: when the prompt holds special-token text; 0 / 1: as told */
    bool no_kv, ignore_eos, no_echo, ids, quiet, seed_set, color, verbose_prompt;
    const char *grammar, *schema;     /* the text, or a file's path when *_is_file */
    bool grammar_is_file, schema_is_file, schema_strict;
    long min_tokens;
    int32_t stop_ids[16];
    int n_stop_ids;
    struct kvllm_sampling_params sp;
    struct kvllm_engine_params ep;
    struct cli_hf hf;       /* -hf REPO[:QUANT]: downloaded, then model points at it */
};

static const struct cli_cmd k_run_cmd = {
    .name = "run",
    .synopsis = "-m MODEL [options]   (or -hf REPO[:QUANT])",
    .groups = CLI_GROUPS(k_run_groups),
    .n_own = 1,
};

void cmd_run_markdown(FILE *f) { cli_cmd_markdown(&k_run_cmd, f); }

/* run's own options (the shared groups are handled before): 0 ok, -1 done (help, version), 2 error */
static int run_opt(const struct cli_opt *op, const char *v, int argc, char **argv, int *i, struct run_opts *o) {
    long l;
    switch (op->id) {
    case R_HELP: cli_cmd_usage(&k_run_cmd, stdout); return -1;
    case R_VERSION: cli_print_version(stdout); return -1;
    case R_MODEL: o->model = v; break;
    case R_TOKENIZER: o->tokenizer = v; break;
    case R_PROMPT: o->prompt = v; break;
    case R_FILE: o->file = v; break;
    case R_SYSTEM: o->system = v; break;
    case R_PARSE_SPECIAL: o->parse_special = 1; break;
    case R_NO_PARSE_SPECIAL: o->parse_special = 0; break;
    case R_VERBOSE_PROMPT: o->verbose_prompt = true; break;
    case R_NO_CNV: break;
    case R_CNV:
        cli_error("run: %s: run answers one prompt and exits; converse with `kvllm chat -m MODEL` (interactive "
                  "when no -p is given)", argv[*i]);
        return 2;
    case R_COLOR:
        /* a separate value only when it is one of the three (a prompt may follow --color) */
        if (!v && *i + 1 < argc && (!strcmp(argv[*i + 1], "on") || !strcmp(argv[*i + 1], "off") ||
                                    !strcmp(argv[*i + 1], "auto")))
            v = argv[++*i];
        if (v && strcmp(v, "on") && strcmp(v, "off") && strcmp(v, "auto")) {
            cli_error("--color: '%s' is not on, off or auto", v);
            return 2;
        }
        o->color = !v || !strcmp(v, "on") || (!strcmp(v, "auto") && isatty(STDOUT_FILENO));
        break;
    case R_N_PREDICT:
        if (!cli_int("-n", v, -2, 1 << 24, &o->n_predict)) return 2;
        if (o->n_predict < 0) o->n_predict = -1;   /* llama-cli: -1 infinity, -2 until the context is full */
        break;
    case R_CTX: if (!cli_int("-c", v, 1, 1 << 24, &o->n_ctx)) return 2; break;
    case R_THREADS: if (!cli_int("-t", v, 1, 1024, &o->n_threads)) return 2; break;
    case R_NO_KV: o->no_kv = true; break;
    case R_IGNORE_EOS: o->ignore_eos = true; break;
    case R_GRAMMAR: case R_GRAMMAR_FILE: o->grammar = v; o->grammar_is_file = op->id == R_GRAMMAR_FILE; break;
    case R_SCHEMA: case R_SCHEMA_FILE: o->schema = v; o->schema_is_file = op->id == R_SCHEMA_FILE; break;
    case R_SCHEMA_STRICT: o->schema_strict = true; break;
    case R_MIN_TOKENS: if (!cli_int("--min-tokens", v, 0, 1 << 24, &o->min_tokens)) return 2; break;
    case R_STOP_ID:
        if (!cli_int("--stop-token-id", v, 0, INT32_MAX, &l)) return 2;
        if (o->n_stop_ids == (int)(sizeof o->stop_ids / sizeof *o->stop_ids)) {
            cli_error("--stop-token-id: at most %d", (int)(sizeof o->stop_ids / sizeof *o->stop_ids));
            return 2;
        }
        o->stop_ids[o->n_stop_ids++] = (int32_t)l;
        break;
    case R_NO_ECHO: o->no_echo = true; break;
    case R_IDS: o->ids = true; break;
    case R_QUIET: o->quiet = true; break;
    }
    return 0;
}

static int parse(int argc, char **argv, struct run_opts *o) {
    o->n_predict = 128;
    o->parse_special = -1;
    o->sp = kvllm_sampling_default_params();
    o->ep = kvllm_engine_default_params();
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        int m = cli_engine_opt(argc, argv, &i, &o->ep);
        if (m == 0) m = cli_sampling_opt(argc, argv, &i, &o->sp, &o->seed_set);
        if (m == 0) m = cli_gpu_opt(argc, argv, &i);
        if (m == 0) m = cli_hf_opt(argc, argv, &i, &o->hf);
        if (m < 0) return 2;
        if (m > 0) continue;
        const struct cli_opt *op;
        const char *v;
        if (cli_cmd_next(&k_run_cmd, argc, argv, &i, &op, &v) < 0) return 2;
        int rc = run_opt(op, v, argc, argv, &i, o);
        if (rc) return rc;
    }
    if (!cli_opt_end()) return 2;
    if (!o->model && !o->hf.repo) { cli_error("run: -m MODEL (or -hf REPO) is required (see kvllm run --help)"); return 2; }
    if (o->file && o->prompt) { cli_error("run: give the prompt with -p or -f, not both"); return 2; }
    if (o->file || (o->prompt && !strcmp(o->prompt, "-"))) {
        size_t len;
        const char *path = o->file ? o->file : "-";
        if (!(o->prompt_buf = cli_read_file(path, &len))) return 1;
        if (strlen(o->prompt_buf) != len) { cli_error("%s: the prompt contains a NUL byte", path); return 1; }
        o->prompt = o->prompt_buf;
    }
    if (o->system && !o->prompt) { cli_error("run: -sys needs a prompt (-p or -f) to answer"); return 2; }
    if (o->grammar && o->schema) { cli_error("run: give --grammar or --json-schema, not both"); return 2; }
    if (o->schema_strict && !o->schema) { cli_error("run: --json-schema-strict needs --json-schema"); return 2; }
    if (!o->seed_set) o->sp.seed = (uint64_t)time(NULL);
    return 0;
}

/* What the event callback needs to print. */
struct printer {
    bool ids;
    int n_gen;
    double t_first;   /* when the first token arrived */
    enum kvllm_finish finish;
};

static void on_event(const struct kvllm_event *ev, void *user) {
    struct printer *p = user;
    if (ev->token >= 0) {
        if (!p->n_gen++) p->t_first = cli_time();
        if (p->ids) printf(p->n_gen > 1 ? " %d" : "%d", ev->token);
    }
    if (!p->ids) fputs(ev->text, stdout);
    fflush(stdout);
    if (ev->finish) p->finish = ev->finish;
}

/* Whether text holds special-token text that parse_special would turn
 * into control tokens (it tokenizes differently with and without). */
static bool holds_special(struct kvllm_model *m, const char *text, size_t len) {
    int a = kvllm_tokenize(m, text, len, false, false, NULL, 0), b = kvllm_tokenize(m, text, len, false, true, NULL, 0);
    if (a < 0 || b < 0) return false;
    if (a != b) return true;
    int32_t *x = malloc((size_t)(a + 1) * 2 * sizeof *x);
    if (!x) return false;
    kvllm_tokenize(m, text, len, false, false, x, a);
    kvllm_tokenize(m, text, len, false, true, x + a, a);
    bool differ = memcmp(x, x + a, (size_t)a * sizeof *x) != 0;
    free(x);
    return differ;
}

/* Tokenize the prompt (BOS alone when there is none; a chat turn under
 * -sys).  Returns the count or < 0 (error printed); *out is malloc'd. */
static int tokenize_prompt(struct kvllm_model *m, const struct run_opts *o, int32_t **out) {
    const struct kvllm_model_desc *d = kvllm_model_describe(m);
    const char *prompt = o->prompt;
    size_t len = prompt ? strlen(prompt) : 0;
    bool special = o->parse_special > 0;
    if (o->parse_special < 0 && len && holds_special(m, prompt, len)) {
        special = true;
        if (!o->quiet)
            fprintf(stderr, "kvllm: the prompt holds special-token text: read as control tokens "
                            "(--no-parse-special reads it as text)\n");
    }
    if (o->system) {
        struct kvllm_chat_message msgs[2] = { { .role = "system", .content = o->system },
                                              { .role = "user", .content = prompt } };
        int n = 0;
        int rc = kvllm_chat_tokenize(m, NULL, msgs, 2, true, special, out, &n);
        if (rc == KVLLM_ENOTFOUND) cli_error("run: -sys needs a chat template, and the model has none");
        return rc ? rc : n;
    }
    int n = len ? kvllm_tokenize(m, prompt, len, true, special, NULL, 0) : 1;
    if (n < 0) return n;
    if (!len && d->token_bos < 0) { cli_error("the model has no BOS token: give a prompt with -p"); return KVLLM_EINVAL; }
    if (n == 0) { cli_error("the prompt tokenizes to nothing"); return KVLLM_EINVAL; }
    if (!(*out = malloc((size_t)n * sizeof **out))) return KVLLM_ENOMEM;
    if (len) kvllm_tokenize(m, prompt, len, true, special, *out, n);
    else (*out)[0] = d->token_bos;
    return n;
}

static int run(struct run_opts *op);

/* The grammar of --grammar / --json-schema (NULL without either); < 0 with
 * the error printed (the option or file, and the compiler's line:col or
 * schema path). */
static int load_grammar(const struct run_opts *o, struct kvllm_grammar **g) {
    *g = NULL;
    const char *arg = o->grammar ? o->grammar : o->schema;
    if (!arg) return 0;
    const char *opt = o->grammar ? "--grammar" : "--json-schema";
    char *text = cli_text_arg(opt, arg, o->grammar ? o->grammar_is_file : o->schema_is_file);
    if (!text) return KVLLM_EIO;
    const bool inline_text = strcmp(text, arg) == 0;
    char err[512] = "";
    int rc = o->grammar ? kvllm_grammar_from_gbnf(text, g, err, sizeof err)
                        : kvllm_grammar_from_json_schema(text, o->schema_strict, g, err, sizeof err);
    free(text);
    if (rc) cli_error("%s: %s", inline_text ? opt : arg, *err ? err : kvllm_strerror(rc));
    return rc;
}

int cmd_run(int argc, char **argv) {
    struct run_opts o = { 0 };
    int rc = parse(argc, argv, &o);
    if (!rc) rc = cli_hf_model(&o.hf, &o.model, false, false);
    if (!rc) rc = run(&o);
    free(o.prompt_buf);
    cli_hf_free(&o.hf);
    return rc < 0 ? 0 : rc;
}

static int run(struct run_opts *op) {
    struct run_opts o = *op;
    if (o.quiet) kvllm_log_set_level(KVLLM_LOG_ERROR);

    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = o.tokenizer;
    mp.n_threads = (int)o.n_threads;
    struct kvllm_model *model;
    if (cli_model_load(o.model, &mp, &model)) return 1;
    const struct kvllm_model_desc *d = kvllm_model_describe(model);

    int32_t *ids = NULL;
    struct kvllm_engine *eng = NULL;
    struct kvllm_grammar *gram = NULL;
    if (load_grammar(&o, &gram)) goto fail;
    int n_prompt = tokenize_prompt(model, &o, &ids);
    if (n_prompt < 0) goto fail;
    if (o.verbose_prompt) {
        fprintf(stderr, "kvllm: prompt ids (%d):", n_prompt);
        for (int k = 0; k < n_prompt; k++) fprintf(stderr, " %d", ids[k]);
        fputc('\n', stderr);
        for (int k = 0; k < n_prompt; k++) {
            char piece[64];
            int nb = kvllm_token_to_bytes(model, ids[k], piece, sizeof piece - 1);
            piece[nb < 0 ? 0 : nb < (int)sizeof piece - 1 ? nb : (int)sizeof piece - 1] = 0;
            fprintf(stderr, "%6d -> '%s'\n", ids[k], piece);
        }
    }

    /* Context: the model's, lowered or raised by -c; must hold prompt + n. */
    long n_ctx = o.n_ctx ? o.n_ctx : d->n_ctx_train;
    if (o.n_ctx > d->n_ctx_train && !o.quiet)
        fprintf(stderr, "kvllm: warning: context %ld exceeds the model's trained context length %d; "
                        "quality may degrade past it\n", o.n_ctx, d->n_ctx_train);
    if (o.n_predict < 0) {   /* until end of text or the context is full */
        if (n_prompt >= n_ctx) {
            cli_error("prompt (%d tokens) fills the context of %ld positions", n_prompt, n_ctx);
            goto fail;
        }
        o.n_predict = n_ctx - n_prompt;
    }
    if (n_prompt + o.n_predict > n_ctx) {
        cli_error("prompt (%d tokens) + -n %ld = %ld tokens exceed the context of %ld positions", n_prompt,
                  o.n_predict, n_prompt + o.n_predict, n_ctx);
        goto fail;
    }
    o.ep.n_ctx = (int)n_ctx;
    o.ep.no_kv_cache = o.no_kv;
    /* one sequence: a pool for more than it can use would only cost memory */
    if (!o.ep.kv_mem && !o.ep.kv_tokens) o.ep.kv_tokens = (int)(n_prompt + o.n_predict);
    if (cli_spec_setup(&o.ep, mp.n_threads) || kvllm_engine_new(model, &o.ep, &eng)) goto fail;
    if (!o.quiet)
        fprintf(stderr, "kvllm: %s, %d layers, n_embd %d, vocab %d, kernels %s; prompt %d tokens, generating %ld\n",
                d->arch, d->n_layer, d->n_embd, d->n_vocab, kvllm_model_backend(model), n_prompt, o.n_predict);

    struct printer pr = { .ids = o.ids };
    struct kvllm_request req = {
        .prompt = ids, .n_prompt = n_prompt, .max_tokens = (int)o.n_predict, .sampling = o.sp, .n = 1,
        .ignore_eos = o.ignore_eos, .no_text = o.ids, .on_event = on_event, .user = &pr,
        .grammar = gram, .min_tokens = (int)o.min_tokens, .stop_token_ids = o.stop_ids,
        .n_stop_token_ids = o.n_stop_ids,
    };
    if (o.n_predict > 0 && kvllm_engine_add(eng, &req, NULL)) goto fail;
    if (!o.ids && !o.no_echo && o.prompt && !o.system)
        fprintf(stdout, o.color ? "\033[33m%s\033[0m" : "%s", o.prompt);
    fflush(stdout);
    double t0 = cli_time();
    while (!kvllm_engine_idle(eng))
        if (kvllm_engine_step(eng) < 0) goto fail;
    double t2 = cli_time(), t1 = pr.n_gen ? pr.t_first : t2;
    fputc('\n', stdout);
    fflush(stdout);
    if (!o.quiet)
        fprintf(stderr, "kvllm: prompt %d tokens in %.1f ms (%.1f tok/s); generation %d tokens in %.1f ms "
                        "(%.1f tok/s, %.2f ms/token)%s\n",
                n_prompt, 1e3 * (t1 - t0), n_prompt / (t1 - t0 + 1e-12), pr.n_gen, 1e3 * (t2 - t1),
                pr.n_gen > 1 ? (pr.n_gen - 1) / (t2 - t1 + 1e-12) : 0.0,
                pr.n_gen > 1 ? 1e3 * (t2 - t1) / (pr.n_gen - 1) : 0.0, o.no_kv ? " [no KV cache]" : "");
    if (!o.quiet) cli_spec_report(eng, &o.ep);
    /* the engine ended the sequence with an error (logged where it happened: the sampler found no
     * token, the grammar allows none...): the text is cut short, and the exit status says so */
    if (pr.finish == KVLLM_FINISH_ERROR) goto fail;
    kvllm_engine_free(eng);
    kvllm_model_free(o.ep.draft_model);
    kvllm_grammar_free(gram);
    kvllm_model_free(model);
    free(ids);
    return 0;
fail:
    kvllm_engine_free(eng);
    kvllm_model_free(o.ep.draft_model);
    kvllm_grammar_free(gram);
    kvllm_model_free(model);
    free(ids);
    return 1;
}
