/* cmd_eval.c — `kvllm eval`: the logits of every position of a token
 * sequence, as raw little-endian f32 (n_tokens rows of n_vocab), so tests
 * can compare kvllm with an independent reference.  The first K tokens go
 * in one batch (prefill), the rest one per call (decode over the cache);
 * with --no-kv-cache every row is computed from an empty cache. */
#include "cli.h"
#include "cli_opts.h"
#include "kvllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { EV_HELP = 1, EV_MODEL, EV_TOKENS, EV_OUT, EV_TOKENIZER, EV_KV_TYPE, EV_BATCH, EV_PREFILL, EV_THREADS, EV_NO_KV,
       EV_EAGER };

/* eval's options: the parser, --help and docs/CLI.md's reference read this table */
static const struct cli_opt k_eval_opts[] = {
    { EV_MODEL, "-m", "MODEL", CLI_VALUE, "GGUF file, Hugging Face folder or llama2.c checkpoint" },
    { EV_TOKENS, "--tokens", "\"ID ID ...\"", CLI_VALUE, "the token sequence (spaces or commas between ids)" },
    { EV_OUT, "-o", "OUT.bin", CLI_VALUE, "where the logits are written" },
    { EV_TOKENIZER, "--tokenizer", "PATH", CLI_VALUE, "vocabulary for models without one" },
    { EV_PREFILL, "--prefill", "K", CLI_VALUE, "the first K tokens in one batch, the rest one per step (default: all)" },
    { EV_NO_KV, "--no-kv-cache", NULL, CLI_FLAG, "every row computed from an empty cache" },
    { EV_THREADS, "-t", "N", CLI_VALUE, "threads" },
    { EV_KV_TYPE, "--kv-type", "f32|f16|bf16|int8|fp8", CLI_VALUE,
      "KV storage; defaults to f32 here: eval exists to compare against references" },
    { EV_BATCH, "--batch", "N", CLI_VALUE, "caps the tokens per forward pass (prefill chunk size, default 512)" },
    { EV_EAGER, "--enforce-eager", NULL, CLI_FLAG, "issue every op directly instead of replaying recorded op lists" },
    { EV_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_eval_group = CLI_GROUP(NULL, k_eval_opts);
static const struct cli_opt_group *const k_eval_groups[] = { &k_eval_group, &cli_tp_group };

static const struct cli_cmd k_eval_cmd = {
    .name = "eval",
    .synopsis = "-m MODEL --tokens \"ID ID ...\" -o OUT.bin [--prefill K] [--no-kv-cache] [-t N]\n"
                "                  [--kv-type f32|f16|bf16|int8|fp8] [--batch N] [--enforce-eager]",
    .groups = CLI_GROUPS(k_eval_groups),
    .n_own = 1,
    .notes = "  writes n_tokens x n_vocab float32 logits; row i follows tokens[0..i]\n",
};

void cmd_eval_markdown(FILE *f) { cli_cmd_markdown(&k_eval_cmd, f); }

static int parse_ids(const char *s, int32_t **out) {
    int cap = 64, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    char *end;
    while (ids) {
        while (*s == ' ' || *s == ',') s++;
        if (!*s) break;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX) { cli_error("--tokens: bad id near '%.16s'", s); free(ids); return -1; }
        if (n == cap) {
            int32_t *g = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!g) { free(ids); ids = NULL; break; }
            ids = g;
        }
        ids[n++] = (int32_t)v;
        s = end;
    }
    if (!ids) { cli_error("out of memory"); return -1; }
    *out = ids;
    return n;
}

int cmd_eval(int argc, char **argv) {
    const char *model = NULL, *toks = NULL, *outp = NULL, *tokz = NULL, *kv_type = "f32";
    long prefill = -1, threads = 0, batch = 0;
    bool no_kv = false, eager = false;
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const struct cli_opt *op;
        const char *a = argv[i], *v;
        if (cli_cmd_next(&k_eval_cmd, argc, argv, &i, &op, &v) < 0) return 2;
        switch (op->id) {
        case EV_HELP: cli_cmd_usage(&k_eval_cmd, stdout); return 0;
        case EV_NO_KV: no_kv = true; break;
        case EV_EAGER: eager = true; break;
        case EV_MODEL: model = v; break;
        case EV_TOKENS: toks = v; break;
        case EV_OUT: outp = v; break;
        case EV_TOKENIZER: tokz = v; break;
        case EV_KV_TYPE: kv_type = v; break;
        case EV_BATCH: if (!cli_int(a, v, 1, 1 << 20, &batch)) return 2; break;
        case EV_PREFILL: if (!cli_int(a, v, 1, 1 << 24, &prefill)) return 2; break;
        case EV_THREADS: if (!cli_int(a, v, 1, 1024, &threads)) return 2; break;
        }
    }
    if (!cli_opt_end()) return 2;
    if (!model || !toks || !outp) { cli_error("eval: -m, --tokens and -o are required"); return 2; }
    int32_t *ids;
    int n = parse_ids(toks, &ids);
    if (n < 0) return 2;
    if (n == 0) { cli_error("eval: --tokens is empty"); free(ids); return 2; }
    if (prefill < 0 || prefill > n) prefill = n;

    kvllm_log_set_level(KVLLM_LOG_WARN);
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.n_threads = (int)threads;
    mp.tokenizer_path = tokz;
    struct kvllm_model *m = NULL;
    struct kvllm_session *s = NULL;
    float *logits = NULL;
    FILE *f = NULL;
    int rc = cli_model_load(model, &mp, &m);
    if (!rc) {
        struct kvllm_engine_params ep = kvllm_engine_default_params();   /* the session's defaults */
        ep.enforce_eager = eager;
        struct kvllm_session_params sp = { .n_ctx = n, .no_kv_cache = no_kv, .kv_type = kv_type,
                                           .max_batch = (int)batch, .engine = &ep };
        rc = kvllm_session_new(m, &sp, &s);
    }
    const size_t V = m ? (size_t)kvllm_model_describe(m)->n_vocab : 0;
    if (!rc && !(logits = malloc((size_t)n * V * sizeof *logits))) rc = KVLLM_ENOMEM;
    if (!rc && no_kv) {
        for (int i = 0; !rc && i < n; i++) rc = kvllm_session_eval(s, ids + i, 1, false, logits + (size_t)i * V);
    } else if (!rc) {
        rc = kvllm_session_eval(s, ids, (int)prefill, true, logits);
        for (int i = (int)prefill; !rc && i < n; i++) rc = kvllm_session_eval(s, ids + i, 1, false, logits + (size_t)i * V);
    }
    if (!rc && (!(f = fopen(outp, "wb")) || fwrite(logits, sizeof *logits, (size_t)n * V, f) != (size_t)n * V)) {
        cli_error("%s: cannot write", outp);
        rc = KVLLM_EIO;
    }
    if (f && fclose(f) && !rc) { cli_error("%s: cannot write", outp); rc = KVLLM_EIO; }
    free(logits);
    free(ids);
    kvllm_session_free(s);
    kvllm_model_free(m);
    return rc ? 1 : 0;
}
