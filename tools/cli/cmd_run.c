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
    "  -m, --model PATH       GGUF file or llama2.c checkpoint\n"
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
};

static int parse(int argc, char **argv, struct run_opts *o) {
    o->n_predict = 128;
    o->sp = kvllm_sampling_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long l;
        double d;
#define ARG() do { if (!(v = cli_arg(argc, argv, &i))) return 2; } while (0)
        if (cli_is_help(a)) { fputs(k_usage, stdout); return -1; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { ARG(); o->model = v; }
        else if (!strcmp(a, "--tokenizer")) { ARG(); o->tokenizer = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { ARG(); o->prompt = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { ARG(); if (!cli_int(a, v, 0, 1 << 24, &o->n_predict)) return 2; }
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) { ARG(); if (!cli_int(a, v, 1, 1 << 24, &o->n_ctx)) return 2; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { ARG(); if (!cli_int(a, v, 1, 1024, &o->n_threads)) return 2; }
        else if (!strcmp(a, "--temp")) { ARG(); if (!cli_float(a, v, 0, 100, &d)) return 2; o->sp.temperature = (float)d; }
        else if (!strcmp(a, "--top-k")) { ARG(); if (!cli_int(a, v, 0, 1 << 30, &l)) return 2; o->sp.top_k = (int)l; }
        else if (!strcmp(a, "--top-p")) { ARG(); if (!cli_float(a, v, 0, 1, &d)) return 2; o->sp.top_p = (float)d; }
        else if (!strcmp(a, "--min-p")) { ARG(); if (!cli_float(a, v, 0, 1, &d)) return 2; o->sp.min_p = (float)d; }
        else if (!strcmp(a, "--repeat-penalty")) { ARG(); if (!cli_float(a, v, 0.01, 100, &d)) return 2; o->sp.repeat_penalty = (float)d; }
        else if (!strcmp(a, "--seed")) { ARG(); char *e; o->sp.seed = strtoull(v, &e, 10); o->seed_set = true;
            if (*e || e == v) { cli_error("--seed: '%s' is not an unsigned integer", v); return 2; } }
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

struct gen_state {
    struct kvllm_model *model;
    struct kvllm_session *sess;
    struct kvllm_sampler *smp;
    struct kvllm_detok *dt;
    int32_t *toks;     /* (n_prompt + n_predict) */
    float *logits;     /* (n_vocab) */
};

static void gen_free(struct gen_state *g) {
    kvllm_detok_free(g->dt);
    kvllm_sampler_free(g->smp);
    kvllm_session_free(g->sess);
    kvllm_model_free(g->model);
    free(g->toks);
    free(g->logits);
}

/* Tokenize the prompt (BOS alone when there is none). Returns the count or < 0. */
static int tokenize_prompt(struct gen_state *g, const char *prompt, int32_t **out) {
    const struct kvllm_model_desc *d = kvllm_model_describe(g->model);
    if (!prompt || !*prompt) {
        *out = malloc(sizeof **out);
        if (!*out) return KVLLM_ENOMEM;
        if (d->token_bos < 0) { cli_error("the model has no BOS token: give a prompt with -p"); return KVLLM_EINVAL; }
        (*out)[0] = d->token_bos;
        return 1;
    }
    size_t len = strlen(prompt);
    int n = kvllm_tokenize(g->model, prompt, len, true, false, NULL, 0);
    if (n < 0) return n;
    *out = malloc((size_t)(n > 0 ? n : 1) * sizeof **out);
    if (!*out) return KVLLM_ENOMEM;
    kvllm_tokenize(g->model, prompt, len, true, false, *out, n);
    return n;
}

int cmd_run(int argc, char **argv) {
    struct run_opts o = { 0 };
    int rc = parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (o.quiet) kvllm_log_set_level(KVLLM_LOG_ERROR);

    struct gen_state g = { 0 };
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = o.tokenizer;
    mp.n_threads = (int)o.n_threads;
    if (kvllm_model_load(o.model, &mp, &g.model)) return 1;
    const struct kvllm_model_desc *d = kvllm_model_describe(g.model);

    int32_t *prompt_ids = NULL;
    int n_prompt = tokenize_prompt(&g, o.prompt, &prompt_ids);
    if (n_prompt < 0) { free(prompt_ids); gen_free(&g); return 1; }

    /* Context: the model's, lowered or raised by -c; must hold prompt + n. */
    long n_ctx = o.n_ctx ? o.n_ctx : d->n_ctx_train;
    if (o.n_ctx > d->n_ctx_train && !o.quiet)
        fprintf(stderr, "kvllm: warning: context %ld exceeds the model's trained context length %d; "
                        "quality may degrade past it\n", o.n_ctx, d->n_ctx_train);
    if (n_prompt + o.n_predict > n_ctx) {
        cli_error("prompt (%d tokens) + -n %ld = %ld tokens exceed the context of %ld positions", n_prompt,
                  o.n_predict, n_prompt + o.n_predict, n_ctx);
        free(prompt_ids);
        gen_free(&g);
        return 1;
    }
    struct kvllm_session_params spar = { .n_ctx = (int)(n_prompt + o.n_predict), .no_kv_cache = o.no_kv };
    g.toks = malloc((size_t)(n_prompt + o.n_predict) * sizeof *g.toks);
    g.logits = malloc((size_t)d->n_vocab * sizeof *g.logits);
    if (!g.toks || !g.logits || kvllm_session_new(g.model, &spar, &g.sess) ||
        kvllm_sampler_new(&o.sp, d->n_vocab, &g.smp) || (!o.ids && kvllm_detok_new(g.model, &g.dt))) {
        free(prompt_ids);
        gen_free(&g);
        return 1;
    }
    memcpy(g.toks, prompt_ids, (size_t)n_prompt * sizeof *g.toks);
    free(prompt_ids);
    if (!o.quiet)
        fprintf(stderr, "kvllm: %s, %d layers, n_embd %d, vocab %d, kernels %s; prompt %d tokens, generating %ld\n",
                d->arch, d->n_layer, d->n_embd, d->n_vocab, kvllm_model_backend(g.model), n_prompt, o.n_predict);

    if (!o.ids && !o.no_echo && o.prompt) fputs(o.prompt, stdout);
    fflush(stdout);

    double t0 = cli_time();
    rc = kvllm_session_eval(g.sess, g.toks, n_prompt, false, g.logits);
    double t1 = cli_time();
    int n_gen = 0;
    for (; !rc && n_gen < o.n_predict; n_gen++) {
        int n_hist = n_prompt + n_gen;
        int32_t tok = kvllm_sampler_sample(g.smp, g.logits, g.toks, n_hist);
        if (tok == d->token_eos && !o.ignore_eos) break;
        g.toks[n_hist] = tok;
        if (o.ids) {
            printf(n_gen ? " %d" : "%d", tok);
        } else {
            fputs(kvllm_detok_push(g.dt, g.toks[n_hist - 1], tok), stdout);
        }
        fflush(stdout);
        if (n_gen + 1 < o.n_predict) rc = kvllm_session_eval(g.sess, &tok, 1, false, g.logits);
    }
    if (!o.ids) fputs(kvllm_detok_flush(g.dt), stdout);
    fputc('\n', stdout);
    fflush(stdout);
    double t2 = cli_time();
    if (!o.quiet && !rc)
        fprintf(stderr, "kvllm: prompt %d tokens in %.1f ms (%.1f tok/s); generation %d tokens in %.1f ms "
                        "(%.1f tok/s, %.2f ms/token)%s\n",
                n_prompt, 1e3 * (t1 - t0), n_prompt / (t1 - t0 + 1e-12), n_gen, 1e3 * (t2 - t1),
                n_gen / (t2 - t1 + 1e-12), n_gen ? 1e3 * (t2 - t1) / n_gen : 0.0, o.no_kv ? " [no KV cache]" : "");
    gen_free(&g);
    return rc ? 1 : 0;
}
