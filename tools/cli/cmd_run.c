/* cmd_run.c — `kvllm run`: prompt in, generated text (or ids) out.
 * stdout carries only the prompt echo and the generated text (or the ids);
 * logs, the memory plan and the timing line go to stderr. */
#include "cli.h"
#include "kvllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *k_usage =
    "usage: kvllm run -m MODEL [options]\n"
    "  -m, --model PATH       GGUF file, Hugging Face folder or llama2.c checkpoint\n"
    "  --tokenizer PATH       vocabulary (llama2.c tokenizer.bin or GGUF) for models without one\n"
    "  -p, --prompt TEXT      prompt (default: BOS alone)\n"
    "  -n, --n-predict N      new tokens to generate (default 128)\n"
    "  --temp T               temperature, 0 = greedy (default 0.8)\n"
    "  --top-k K              (default 40, 0 = off)\n"
    "  --top-p P              (default 0.95, 1 = off)\n"
    "  --min-p P              (default 0.05, 0 = off)\n"
    "  --repeat-penalty R     (default 1.0 = off)\n"
    "  --seed S               RNG seed (default: from the clock)\n"
    "  -c, --ctx-size N       context length (default: the model's; above it warns)\n"
    "  -t, --threads N        threads (default: all CPUs)\n"
    "  --no-kv-cache          recompute the whole prefix every step (baseline)\n"
    "  --ignore-eos           do not stop at end-of-sequence\n"
    "  --no-echo              do not print the prompt\n"
    "  --ids                  print the generated token ids instead of text\n"
    "  -q, --quiet            only errors on stderr\n";


struct run_opts {
    const char *model, *tokenizer, *prompt;
    long n_predict, n_ctx, n_threads;
    bool no_kv, ignore_eos, no_echo, ids, quiet, seed_set;
    struct kvllm_sampling_params sp;
    struct kvllm_engine_params ep;
};

static int parse(int argc, char **argv, struct run_opts *o) {
    o->n_predict = 128;
    o->sp = kvllm_sampling_default_params();
    o->ep = kvllm_engine_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int eo = cli_engine_opt(argc, argv, &i, &o->ep);
        if (eo < 0) return 2;
        if (eo > 0) continue;
        int so = cli_sampling_opt(argc, argv, &i, &o->sp, &o->seed_set);
        if (so < 0) return 2;
        if (so > 0) continue;
#define ARG() do { if (!(v = cli_arg(argc, argv, &i))) return 2; } while (0)
        if (cli_is_help(a)) { fputs(k_usage, stdout); fputs(cli_engine_usage, stdout); return -1; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { ARG(); o->model = v; }
        else if (!strcmp(a, "--tokenizer")) { ARG(); o->tokenizer = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { ARG(); o->prompt = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { ARG(); if (!cli_int(a, v, 0, 1 << 24, &o->n_predict)) return 2; }
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) { ARG(); if (!cli_int(a, v, 1, 1 << 24, &o->n_ctx)) return 2; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { ARG(); if (!cli_int(a, v, 1, 1024, &o->n_threads)) return 2; }
        else if (!strcmp(a, "--no-kv-cache")) o->no_kv = true;
        else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = true;
        else if (!strcmp(a, "--no-echo")) o->no_echo = true;
        else if (!strcmp(a, "--ids")) o->ids = true;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->quiet = true;
        else { cli_error("run: unknown option '%s' (see kvllm run --help)", a); return 2; }
#undef ARG
    }
    if (!o->model) { cli_error("run: -m MODEL is required (see kvllm run --help)"); return 2; }
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

/* Tokenize the prompt (BOS alone when there is none).  Returns the count or
 * < 0 (error printed); *out is malloc'd. */
static int tokenize_prompt(struct kvllm_model *m, const char *prompt, int32_t **out) {
    const struct kvllm_model_desc *d = kvllm_model_describe(m);
    size_t len = prompt ? strlen(prompt) : 0;
    int n = len ? kvllm_tokenize(m, prompt, len, true, false, NULL, 0) : 1;
    if (n < 0) return n;
    if (!len && d->token_bos < 0) { cli_error("the model has no BOS token: give a prompt with -p"); return KVLLM_EINVAL; }
    if (n == 0) { cli_error("the prompt tokenizes to nothing"); return KVLLM_EINVAL; }
    if (!(*out = malloc((size_t)n * sizeof **out))) return KVLLM_ENOMEM;
    if (len) kvllm_tokenize(m, prompt, len, true, false, *out, n);
    else (*out)[0] = d->token_bos;
    return n;
}

int cmd_run(int argc, char **argv) {
    struct run_opts o = { 0 };
    int rc = parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (o.quiet) kvllm_log_set_level(KVLLM_LOG_ERROR);

    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = o.tokenizer;
    mp.n_threads = (int)o.n_threads;
    struct kvllm_model *model;
    if (kvllm_model_load(o.model, &mp, &model)) return 1;
    const struct kvllm_model_desc *d = kvllm_model_describe(model);

    int32_t *ids = NULL;
    struct kvllm_engine *eng = NULL;
    int n_prompt = tokenize_prompt(model, o.prompt, &ids);
    if (n_prompt < 0) goto fail;

    /* Context: the model's, lowered or raised by -c; must hold prompt + n. */
    long n_ctx = o.n_ctx ? o.n_ctx : d->n_ctx_train;
    if (o.n_ctx > d->n_ctx_train && !o.quiet)
        fprintf(stderr, "kvllm: warning: context %ld exceeds the model's trained context length %d; "
                        "quality may degrade past it\n", o.n_ctx, d->n_ctx_train);
    if (n_prompt + o.n_predict > n_ctx) {
        cli_error("prompt (%d tokens) + -n %ld = %ld tokens exceed the context of %ld positions", n_prompt,
                  o.n_predict, n_prompt + o.n_predict, n_ctx);
        goto fail;
    }
    o.ep.n_ctx = (int)n_ctx;
    o.ep.no_kv_cache = o.no_kv;
    /* one sequence: a pool for more than it can use would only cost memory */
    if (!o.ep.kv_mem && !o.ep.kv_tokens) o.ep.kv_tokens = (int)(n_prompt + o.n_predict);
    if (kvllm_engine_new(model, &o.ep, &eng)) goto fail;
    if (!o.quiet)
        fprintf(stderr, "kvllm: %s, %d layers, n_embd %d, vocab %d, kernels %s; prompt %d tokens, generating %ld\n",
                d->arch, d->n_layer, d->n_embd, d->n_vocab, kvllm_model_backend(model), n_prompt, o.n_predict);

    struct printer pr = { .ids = o.ids };
    struct kvllm_request req = {
        .prompt = ids, .n_prompt = n_prompt, .max_tokens = (int)o.n_predict, .sampling = o.sp, .n = 1,
        .ignore_eos = o.ignore_eos, .no_text = o.ids, .on_event = on_event, .user = &pr,
    };
    if (o.n_predict > 0 && kvllm_engine_add(eng, &req, NULL)) goto fail;
    if (!o.ids && !o.no_echo && o.prompt) fputs(o.prompt, stdout);
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
    kvllm_engine_free(eng);
    kvllm_model_free(model);
    free(ids);
    return 0;
fail:
    kvllm_engine_free(eng);
    kvllm_model_free(model);
    free(ids);
    return 1;
}
