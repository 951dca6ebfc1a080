/* cmd_batch.c — `kvllm batch`: many prompts through the engine at once, for
 * tests of batch invariance and of the scheduler.  Prompts are lines of
 * token ids; every prompt is submitted before the first step, and the
 * output is one line of generated ids per (prompt, sample), in input order.
 * --logits writes the logits each generated token was sampled from. */
#include "cli.h"
#include "cli_opts.h"
#include "kvllm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BA_HELP = 1, BA_MODEL, BA_PROMPTS, BA_LOGITS, BA_MAX_TOKENS, BA_N, BA_THREADS };

/* batch's options: the parser, --help and docs/CLI.md's reference read this table */
static const struct cli_opt k_batch_opts[] = {
    { BA_MODEL, "-m", "MODEL", CLI_VALUE, "GGUF file, Hugging Face folder or llama2.c checkpoint" },
    { BA_PROMPTS, "--prompts", "FILE", CLI_VALUE, "one prompt per line, as space-separated token ids" },
    { BA_MAX_TOKENS, "--max-tokens", "N", CLI_VALUE, "tokens to generate per sample (default 16; EOS ignored)" },
    { BA_N, "--n", "N", CLI_VALUE, "samples per prompt (default 1)" },
    { BA_LOGITS, "--logits", "OUT.bin", CLI_VALUE, "f32 logits of every generated token, per sample in output order" },
    { BA_THREADS, "-t", "N", CLI_VALUE, "threads" },
    { BA_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_batch_group = CLI_GROUP(NULL, k_batch_opts);
static const struct cli_opt_group *const k_batch_groups[] = {
    &k_batch_group, &cli_sampling_group, &cli_engine_group, &cli_spec_group, &cli_tp_group,
};

static const struct cli_cmd k_batch_cmd = {
    .name = "batch",
    .synopsis = "-m MODEL --prompts FILE [options]",
    .groups = CLI_GROUPS(k_batch_groups),
    .n_own = 1,
    .notes = "  batch's own sampling defaults, for repeatable tests: greedy (--temp 0) and --seed 0\n",
};

void cmd_batch_markdown(FILE *f) { cli_cmd_markdown(&k_batch_cmd, f); }

struct out_seq { int32_t *ids; int n; float *logits; bool done; };

struct batch_ctx { struct out_seq *seqs; int n_per_req, max_tokens, n_vocab; bool want_logits; };

struct req_tag { struct batch_ctx *b; int req; };

static void on_event(const struct kvllm_event *ev, void *user) {
    struct req_tag *t = user;
    struct out_seq *o = &t->b->seqs[t->req * t->b->n_per_req + ev->index];
    if (ev->token >= 0 && o->n < t->b->max_tokens) {
        if (t->b->want_logits)
            memcpy(o->logits + (size_t)o->n * t->b->n_vocab, ev->logits, (size_t)t->b->n_vocab * sizeof(float));
        o->ids[o->n++] = ev->token;
    }
    if (ev->finish) o->done = true;
}

/* Read prompts: returns the count, fills *ids (all tokens) and *off (n+1 offsets). */
static int read_prompts(const char *path, int32_t **ids, int **off) {
    FILE *f = fopen(path, "r");
    if (!f) { cli_error("%s: cannot open: %s", path, strerror(errno)); return -1; }
    int n = 0, cap_ids = 1024, cap_off = 64, n_ids = 0;
    *ids = malloc((size_t)cap_ids * sizeof **ids);
    *off = malloc((size_t)cap_off * sizeof **off);
    char line[1 << 16];
    while (*ids && *off && fgets(line, sizeof line, f)) {
        char *p = line, *end;
        int start = n_ids;
        for (long v; (v = strtol(p, &end, 10)), end != p; p = end) {
            if (n_ids == cap_ids) *ids = realloc(*ids, (size_t)(cap_ids *= 2) * sizeof **ids);
            if (!*ids) break;
            (*ids)[n_ids++] = (int32_t)v;
        }
        if (n_ids == start) continue;
        if (n + 2 > cap_off) *off = realloc(*off, (size_t)(cap_off *= 2) * sizeof **off);
        if (!*off) break;
        (*off)[n++] = start;
    }
    fclose(f);
    if (!*ids || !*off) { cli_error("out of memory"); return -1; }
    (*off)[n] = n_ids;
    return n;
}

int cmd_batch(int argc, char **argv) {
    const char *model = NULL, *prompts = NULL, *logits_path = NULL;
    long max_tokens = 16, n_per = 1, threads = 0;
    struct kvllm_sampling_params sp = kvllm_sampling_default_params();
    sp.temperature = 0;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const struct cli_opt *op;
        const char *a = argv[i], *v;
        int eo = cli_engine_opt(argc, argv, &i, &ep);
        if (eo == 0) eo = cli_sampling_opt(argc, argv, &i, &sp, NULL);
        if (eo < 0) return 2;
        if (eo > 0) continue;
        if (cli_cmd_next(&k_batch_cmd, argc, argv, &i, &op, &v) < 0) return 2;
        switch (op->id) {
        case BA_HELP: cli_cmd_usage(&k_batch_cmd, stdout); return 0;
        case BA_MODEL: model = v; break;
        case BA_PROMPTS: prompts = v; break;
        case BA_LOGITS: logits_path = v; break;
        case BA_MAX_TOKENS: if (!cli_int(a, v, 1, 1 << 20, &max_tokens)) return 2; break;
        case BA_N: if (!cli_int(a, v, 1, 1024, &n_per)) return 2; break;
        case BA_THREADS: if (!cli_int(a, v, 1, 1024, &threads)) return 2; break;
        }
    }
    if (!cli_opt_end()) return 2;
    if (!model || !prompts) { cli_error("batch: -m and --prompts are required"); return 2; }
    int32_t *ids = NULL;
    int *off = NULL;
    int n_req = read_prompts(prompts, &ids, &off);
    if (n_req <= 0) { if (!n_req) cli_error("%s: no prompts", prompts); free(ids); free(off); return 1; }

    kvllm_log_set_level(KVLLM_LOG_WARN);
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.n_threads = (int)threads;
    struct kvllm_model *m = NULL;
    struct kvllm_engine *e = NULL;
    struct batch_ctx b = { .n_per_req = (int)n_per, .max_tokens = (int)max_tokens, .want_logits = logits_path != NULL };
    struct req_tag *tags = calloc((size_t)n_req, sizeof *tags);
    b.seqs = calloc((size_t)n_req * (size_t)n_per, sizeof *b.seqs);
    int rc = tags && b.seqs ? cli_model_load(model, &mp, &m) : KVLLM_ENOMEM;
    if (!rc) rc = cli_spec_setup(&ep, mp.n_threads) ? KVLLM_EINVAL : kvllm_engine_new(m, &ep, &e);
    if (!rc) b.n_vocab = kvllm_model_describe(m)->n_vocab;
    for (int i = 0; !rc && i < n_req * n_per; i++) {
        b.seqs[i].ids = malloc((size_t)max_tokens * sizeof(int32_t));
        if (logits_path) b.seqs[i].logits = malloc((size_t)max_tokens * (size_t)b.n_vocab * sizeof(float));
        if (!b.seqs[i].ids || (logits_path && !b.seqs[i].logits)) rc = KVLLM_ENOMEM;
    }
    for (int r = 0; !rc && r < n_req; r++) {
        tags[r] = (struct req_tag){ &b, r };
        struct kvllm_request q = { .prompt = ids + off[r], .n_prompt = off[r + 1] - off[r], .max_tokens = (int)max_tokens,
                                   .sampling = sp, .n = (int)n_per, .ignore_eos = true, .no_text = true,
                                   .want_logits = logits_path != NULL, .on_event = on_event, .user = &tags[r] };
        rc = kvllm_engine_add(e, &q, NULL);
    }
    while (!rc && !kvllm_engine_idle(e)) rc = kvllm_engine_step(e) < 0;
    if (!rc) {
        for (int i = 0; i < n_req * n_per; i++) {
            for (int k = 0; k < b.seqs[i].n; k++) printf(k ? " %d" : "%d", b.seqs[i].ids[k]);
            printf("\n");
        }
        struct kvllm_engine_stats st;
        kvllm_engine_get_stats(e, &st);
        fprintf(stderr, "kvllm: stats: steps %llu, preemptions %llu, prompt tokens %llu, cached %llu, "
                        "blocks held %d, cached %d, free %d of %d; sliding-window blocks held %d of %d; "
                        "planned ahead %llu\n",
                (unsigned long long)st.steps, (unsigned long long)st.preemptions,
                (unsigned long long)st.prompt_tokens, (unsigned long long)st.cached_tokens, st.blocks_held,
                st.blocks_cached, st.blocks_free, st.blocks_total, st.win_blocks_held, st.win_blocks_total,
                (unsigned long long)st.steps_planned_ahead);
        cli_spec_report(e, &ep);
    }
    if (!rc && logits_path) {
        FILE *f = fopen(logits_path, "wb");
        for (int i = 0; f && i < n_req * n_per; i++)
            fwrite(b.seqs[i].logits, sizeof(float), (size_t)b.seqs[i].n * (size_t)b.n_vocab, f);
        if (!f || fclose(f)) { cli_error("%s: cannot write", logits_path); rc = 1; }
    }
    for (int i = 0; b.seqs && i < n_req * n_per; i++) { free(b.seqs[i].ids); free(b.seqs[i].logits); }
    free(b.seqs);
    free(tags);
    free(ids);
    free(off);
    kvllm_engine_free(e);
    kvllm_model_free(ep.draft_model);
    kvllm_model_free(m);
    return rc ? 1 : 0;
}
