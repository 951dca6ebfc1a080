/* cmd_grammar.c — `kvllm grammar`: compile a grammar (GBNF, JSON Schema,
 * any JSON object), print its GBNF, check a text against it, and measure
 * the cost of its token masks over a model's vocabulary.
 *
 * A check runs the matcher over a vocabulary of single bytes (token b is
 * byte b), so it judges the string itself, not one tokenization of it.
 * Exit status: 0 accepted (or nothing to check), 1 rejected, 2 error. */
#include "cli.h"
#include "cli_opts.h"
#include "grammar/grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    G_HELP = 1, G_GBNF, G_SCHEMA, G_STRICT, G_JSON_OBJECT, G_PRINT, G_CHECK, G_CHECK_FILE, G_BENCH, G_TEXT, G_TEXT_FILE,
    G_REPS,
};

/* grammar's options: the parser, --help and docs/CLI.md's reference read this table */
static const struct cli_opt k_grammar_opts[] = {
    { G_GBNF, "--gbnf", "FILE", CLI_VALUE, "llama.cpp GBNF grammar ('-': standard input); the start rule is root" },
    { G_SCHEMA, "--json-schema", "FILE", CLI_VALUE, "JSON Schema" },
    { G_STRICT, "--strict", NULL, CLI_FLAG,
      "with --json-schema: objects admit no properties beyond 'properties' unless\nadditionalProperties says so "
      "(OpenAI's strict mode)" },
    { G_JSON_OBJECT, "--json-object", NULL, CLI_FLAG, "any JSON object (response_format json_object)" },
    { G_PRINT, "--print-gbnf", NULL, CLI_FLAG, "print the grammar's GBNF text (a JSON Schema's compiled rules)" },
    { G_CHECK, "--check", "TEXT", CLI_VALUE, "is TEXT a complete string of the grammar?  exit 0 yes, 1 no (and where)" },
    { G_CHECK_FILE, "--check-file", "FILE", CLI_VALUE, "the same for the bytes of FILE (exactly, no newline stripped)" },
    { G_BENCH, "--bench-mask", "MODEL", CLI_VALUE,
      "time fill_mask + accept per token of TEXT tokenized by MODEL's vocabulary\n(a fresh matcher per pass, as a "
      "request gets); median / p99 / max microseconds" },
    { G_TEXT, "--text", "TEXT", CLI_VALUE, "the text --bench-mask tokenizes" },
    { G_TEXT_FILE, "--text-file", "FILE", CLI_VALUE, "that text from a file" },
    { G_REPS, "--reps", "N", CLI_VALUE, "passes over the text (default 20)" },
    { G_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_grammar_group = CLI_GROUP(NULL, k_grammar_opts);
static const struct cli_opt_group *const k_grammar_groups[] = { &k_grammar_group };

static const struct cli_cmd k_grammar_cmd = {
    .name = "grammar",
    .synopsis = "(--gbnf FILE | --json-schema FILE [--strict] | --json-object)\n"
                "                     [--print-gbnf] [--check TEXT | --check-file FILE]\n"
                "                     [--bench-mask MODEL [--text TEXT | --text-file FILE] [--reps N]]",
    .groups = CLI_GROUPS(k_grammar_groups),
    .n_own = 1,
    .notes = "  exit status: 0 accepted, 1 rejected, 2 error\n",
};

void cmd_grammar_markdown(FILE *f) { cli_cmd_markdown(&k_grammar_cmd, f); }

static int check_text(const struct kvllm_grammar *g, const char *text, size_t len) {
    /* tokens 0..255: one byte each; 256: the end token */
    static char bytes[256];
    const char *ptr[257];
    size_t lens[257];
    bool special[257];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        ptr[i] = &bytes[i];
        lens[i] = 1;
        special[i] = false;
    }
    ptr[256] = "";
    lens[256] = 0;
    special[256] = true;
    int32_t end = 256;
    struct gvocab *v = NULL;
    struct gmatcher *m = NULL;
    if (gvocab_new(257, ptr, lens, special, &end, 1, &v) || gmatcher_new(g, v, &m)) {
        gvocab_free(v);
        return 2;
    }
    int rc = 0;
    size_t i = 0;
    for (; i < len; i++) {
        int r = gmatcher_accept(m, (unsigned char)text[i]);
        if (r == KVLLM_EINVAL) { rc = 1; break; }
        if (r) { rc = 2; break; }
    }
    if (rc == 1) printf("rejected at byte %zu\n", i);
    else if (rc == 0 && !gmatcher_can_end(m)) { printf("rejected: incomplete at the end (byte %zu)\n", len); rc = 1; }
    else if (rc == 0) printf("accepted\n");
    gmatcher_free(m);
    gvocab_free(v);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts t. */
static void report(const char *what, double *t, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += t[i];
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    printf("%s: mask+accept per token: median %.1f us, p90 %.1f us, p99 %.1f us, max %.1f us, mean %.1f us, "
           "total %.2f ms\n", what, t[n / 2], t[(int)(n * 0.9)], t[(int)(n * 0.99)], t[n - 1], sum / n, sum / 1e3);
}

static int bench_mask(const struct kvllm_grammar *g, const char *model_path, const char *text, long reps) {
    struct kvllm_model *model = NULL;
    struct kvllm_model_params mp = { 0 };
    if (cli_model_open(model_path, &mp, &model)) return 2;
    const struct kvllm_model_desc *d = kvllm_model_describe(model);
    int n = d->n_vocab, rc = 2;
    char **tb = calloc((size_t)n, sizeof *tb);
    size_t *tl = calloc((size_t)n, sizeof *tl);
    bool *sp = calloc((size_t)n, sizeof *sp);
    uint32_t *mask = calloc((size_t)(n + 31) / 32, sizeof *mask);
    int32_t *ids = NULL;
    double *t = NULL;
    struct gvocab *v = NULL;
    if (!tb || !tl || !sp || !mask) goto out;
    for (int i = 0; i < n; i++) {
        char buf[1024];
        int k = kvllm_token_to_bytes(model, i, buf, sizeof buf);
        if (k < 0) goto out;
        if (k > (int)sizeof buf) k = (int)sizeof buf;
        tb[i] = malloc((size_t)k + 1);
        if (!tb[i]) goto out;
        memcpy(tb[i], buf, (size_t)k);
        tl[i] = (size_t)k;
        sp[i] = k == 0;   /* control tokens read as "" */
    }
    int32_t end = d->token_eos;
    double t0 = cli_time();
    if (gvocab_new(n, (const char *const *)tb, tl, sp, &end, end >= 0 ? 1 : 0, &v)) goto out;
    double t_vocab = cli_time() - t0;
    int n_ids = kvllm_tokenize(model, text, strlen(text), false, false, NULL, 0);
    if (n_ids <= 0) { cli_error("--text: nothing to tokenize"); goto out; }
    ids = malloc((size_t)n_ids * sizeof *ids);
    t = malloc((size_t)n_ids * (size_t)reps * sizeof *t);
    if (!ids || !t) goto out;
    kvllm_tokenize(model, text, strlen(text), false, false, ids, n_ids);
    int n_t = 0;
    for (long r = 0; r < reps; r++) {
        struct gmatcher *m;
        if (gmatcher_new(g, v, &m)) goto out;
        for (int i = 0; i < n_ids; i++) {
            double a = cli_time();
            int allowed = gmatcher_fill_mask(m, mask);
            int acc = allowed > 0 && (mask[ids[i] >> 5] >> (ids[i] & 31) & 1) ? gmatcher_accept(m, ids[i]) : -1;
            double b = cli_time();
            if (allowed < 0 || acc) {
                cli_error("token %d (id %d) of the text is not allowed by the grammar (is the text valid?)", i, ids[i]);
                gmatcher_free(m);
                goto out;
            }
            t[n_t++] = (b - a) * 1e6;
        }
        if (!gmatcher_can_end(m)) {
            cli_error("the text is an incomplete string of the grammar");
            gmatcher_free(m);
            goto out;
        }
        gmatcher_free(m);
    }
    printf("vocab %d tokens (trie built in %.1f ms), text %d tokens, %ld passes (a fresh matcher each)\n", n,
           t_vocab * 1e3, n_ids, reps);
    report("pass 1 (a new grammar: every context computed)", t, n_ids);
    if (reps > 1) report("passes 2.. (the grammar's shared contexts)", t + n_ids, n_t - n_ids);
    report("all passes", t, n_t);
    rc = 0;
out:
    if (rc) cli_error("--bench-mask failed");
    free(t);
    free(ids);
    gvocab_free(v);
    if (tb)
        for (int i = 0; i < n; i++) free(tb[i]);
    free(tb);
    free(tl);
    free(sp);
    free(mask);
    kvllm_model_free(model);
    return rc;
}

int cmd_grammar(int argc, char **argv) {
    const char *gbnf = NULL, *schema = NULL, *check = NULL, *check_file = NULL, *bench = NULL, *text = NULL,
               *text_file = NULL;
    bool strict = false, json_object = false, print = false;
    long reps = 20;
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const struct cli_opt *op;
        const char *v;
        if (cli_cmd_next(&k_grammar_cmd, argc, argv, &i, &op, &v) < 0) return 2;
        switch (op->id) {
        case G_HELP: cli_cmd_usage(&k_grammar_cmd, stdout); return 0;
        case G_GBNF: gbnf = v; break;
        case G_SCHEMA: schema = v; break;
        case G_JSON_OBJECT: json_object = true; break;
        case G_STRICT: strict = true; break;
        case G_PRINT: print = true; break;
        case G_CHECK: check = v; break;
        case G_CHECK_FILE: check_file = v; break;
        case G_BENCH: bench = v; break;
        case G_TEXT: text = v; break;
        case G_TEXT_FILE: text_file = v; break;
        case G_REPS: if (!cli_int("--reps", v, 1, 100000, &reps)) return 2; break;
        }
    }
    if (!cli_opt_end()) return 2;
    if ((gbnf != NULL) + (schema != NULL) + json_object != 1) {
        cli_error("give one of --gbnf, --json-schema, --json-object (see kvllm grammar --help)");
        return 2;
    }
    if (check && check_file) { cli_error("--check and --check-file: one of them"); return 2; }
    if (bench && !text && !text_file) { cli_error("--bench-mask needs --text or --text-file"); return 2; }
    struct kvllm_grammar *g = NULL;
    char err[512] = "";
    int rc;
    if (json_object) {
        rc = kvllm_grammar_json_object(&g);
    } else {
        char *src = cli_read_file(gbnf ? gbnf : schema, NULL);
        if (!src) return 2;
        rc = gbnf ? kvllm_grammar_from_gbnf(src, &g, err, sizeof err)
                  : kvllm_grammar_from_json_schema(src, strict, &g, err, sizeof err);
        free(src);
    }
    if (rc) return 2;   /* the library logged "line:col: ..." or the JSON path */
    int status = 0;
    if (print) fputs(grammar_gbnf_text(g), stdout);
    if (check) status = check_text(g, check, strlen(check));
    if (check_file) {
        size_t len;
        char *s = cli_read_file(check_file, &len);
        if (!s) { kvllm_grammar_free(g); return 2; }
        status = check_text(g, s, len);
        free(s);
    }
    if (bench && status == 0) {
        char *s = text ? NULL : cli_read_file(text_file, NULL);
        if (text_file && !s) { kvllm_grammar_free(g); return 2; }
        status = bench_mask(g, bench, text ? text : s, reps);
        free(s);
    }
    kvllm_grammar_free(g);
    return status;
}
