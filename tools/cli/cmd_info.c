/* cmd_info.c — `kvllm info MODEL`: what a model file holds and what its KV
 * cache costs, before anything is run. */
#include "cli.h"
#include "cli_opts.h"
#include "kvllm.h"
#include "load/gguf.h"
#include "load/hf.h"
#include "load/llama2c.h"
#include "tensor/dtype.h"

#include <stdio.h>
#include <string.h>

enum { I_HELP = 1, I_MODEL, I_TOKENIZER, I_JSON };

/* info's options: the parser, --help and docs/CLI.md's reference read this table */
static const struct cli_opt k_info_opts[] = {
    { I_MODEL, "-m, --model", "MODEL", CLI_VALUE, "GGUF file, Hugging Face folder or llama2.c checkpoint (or MODEL alone)" },
    { I_TOKENIZER, "--tokenizer", "PATH", CLI_VALUE, "vocabulary for models without one" },
    { I_JSON, "--json", NULL, CLI_FLAG, "the same as one JSON object" },
    { I_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_info_group = CLI_GROUP(NULL, k_info_opts);
static const struct cli_opt_group *const k_info_groups[] = { &k_info_group };

static const struct cli_cmd k_info_cmd = {
    .name = "info",
    .synopsis = "[-m] MODEL [--tokenizer PATH] [--json]",
    .groups = CLI_GROUPS(k_info_groups),
    .n_own = 1,
    .positional = true,
    .notes =
        "  prints the name, architecture, file type and bits per weight, hyper-parameters, the tokenizer\n"
        "  (model, pre-tokenizer, bos / eos, add_bos / add_eos, chat template), tensor types, parameter\n"
        "  count, weight bytes in the file and as placed, and KV-cache bytes per token and at full context\n"
        "  for f32, f16, bf16, int8 and fp8 storage\n",
};

void cmd_info_markdown(FILE *f) { cli_cmd_markdown(&k_info_cmd, f); }

/* llama.cpp's general.file_type names (LLAMA_FTYPE_*). */
static const char *ftype_name(uint32_t t) {
    static const char *const names[] = {
        [0] = "ALL_F32", [1] = "MOSTLY_F16", [2] = "MOSTLY_Q4_0", [3] = "MOSTLY_Q4_1", [7] = "MOSTLY_Q8_0",
        [8] = "MOSTLY_Q5_0", [9] = "MOSTLY_Q5_1", [10] = "MOSTLY_Q2_K", [11] = "MOSTLY_Q3_K_S",
        [12] = "MOSTLY_Q3_K_M", [13] = "MOSTLY_Q3_K_L", [14] = "MOSTLY_Q4_K_S", [15] = "MOSTLY_Q4_K_M",
        [16] = "MOSTLY_Q5_K_S", [17] = "MOSTLY_Q5_K_M", [18] = "MOSTLY_Q6_K", [32] = "MOSTLY_BF16",
    };
    return t < sizeof names / sizeof *names && names[t] ? names[t] : "unknown";
}

/* A metadata string as a C string (bounded), "" when absent. */
static void meta(const struct kvllm_model *m, const char *key, char *buf, size_t cap) {
    size_t n = 0;
    const char *v = kvllm_model_meta_str(m, key, &n);
    if (!v) n = 0;
    if (n >= cap) n = cap - 1;
    memcpy(buf, v ? v : "", n);
    buf[n] = 0;
}

/* A string from the file: control characters (C0, DEL and the C1 set, which
 * some terminals obey) as \uXXXX escapes, so that a model's name cannot
 * move the cursor, retitle the window or clear the screen; for JSON, quotes
 * and backslashes escaped too. */
static void put_escaped(const char *v, bool json) {
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        if (json && (*p == '"' || *p == '\\')) printf("\\%c", *p);
        else if (*p < 0x20 || *p == 0x7F) printf("\\u%04x", *p);
        else if (*p == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F) printf("\\u%04x", *++p);
        else putchar(*p);
    }
}

static void json_str(const char *k, const char *v, bool comma) {
    printf("  \"%s\": \"", k);
    put_escaped(v, true);
    printf("\"%s\n", comma ? "," : "");
}

static void human(char *buf, size_t n, double bytes) {
    const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    int i = 0;
    while (bytes >= 1024 && i < 4) { bytes /= 1024; i++; }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", bytes, u[i]);
}

/* Count tensors and bytes per type (the model load already validated them). */
static void print_tensor_types(const char *path) {
    struct gguf *g = NULL;
    int rc = hf_is_folder(path) ? hf_open(path, &g) : gguf_is_gguf(path) ? gguf_open(path, &g) : llama2c_open(path, &g);
    if (rc) return;
    uint64_t count[DTYPE_COUNT_] = { 0 }, bytes[DTYPE_COUNT_] = { 0 };
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        uint32_t t = g->tensors[i].type;
        if (t < DTYPE_COUNT_) { count[t]++; bytes[t] += g->tensors[i].n_bytes; }
    }
    printf("tensors           %llu:", (unsigned long long)g->n_tensors);
    for (int t = 0; t < DTYPE_COUNT_; t++) {
        if (!count[t]) continue;
        char b[32];
        human(b, sizeof b, (double)bytes[t]);
        printf(" %s x%llu (%s)", dtype_name((uint32_t)t), (unsigned long long)count[t], b);
    }
    printf("\n");
    gguf_free(g);
}

/* K/V bytes of one layer and one position: 2 (K and V) x n_head_kv x head_dim
 * elements; the 8-bit types add an f32 scale per head, and K/V. */
static double kv_head_bytes(const struct kvllm_model_desc *d, double elem, double scale) {
    return 2.0 * d->n_head_kv * (d->head_dim * elem + scale);
}

/* K/V bytes of one sequence at the trained context: the global layers hold
 * every position, the sliding ones (unless full) the blocks their window
 * spans in decode at the default block size (the engine's plan). */
static double kv_seq_bytes(const struct kvllm_model_desc *d, double elem, double scale, bool full) {
    const int bs = kvllm_engine_default_params().block_size, n_ctx = d->n_ctx_train;
    int win = (d->n_swa + bs - 1) / bs * bs + bs;
    if (full || win > n_ctx) win = n_ctx;
    return kv_head_bytes(d, elem, scale) *
           ((double)(d->n_layer - d->n_layer_swa) * n_ctx + (double)d->n_layer_swa * win);
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL, *tok = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const struct cli_opt *op;
        const char *v;
        int m = cli_cmd_next(&k_info_cmd, argc, argv, &i, &op, &v);
        if (m < 0) return 2;
        /* MODEL alone, once ("-" is no model) */
        if (m == 0 && (path || !strcmp(argv[i], "-"))) { cli_cmd_unknown(&k_info_cmd, argv[i]); return 2; }
        if (m == 0) { path = argv[i]; continue; }
        switch (op->id) {
        case I_HELP: cli_cmd_usage(&k_info_cmd, stdout); return 0;
        case I_MODEL: path = v; break;
        case I_TOKENIZER: tok = v; break;
        case I_JSON: json = true; break;
        }
    }
    if (!cli_opt_end()) return 2;
    if (!path) { cli_error("info: a MODEL path is required (see kvllm info --help)"); return 2; }
    kvllm_log_set_level(KVLLM_LOG_WARN);
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = tok;
    mp.n_threads = 1;
    struct kvllm_model *m;
    if (cli_model_open(path, &mp, &m)) return 1;
    const struct kvllm_model_desc *d = kvllm_model_describe(m);

    /* what only the file's metadata says */
    struct gguf *g = NULL;
    int grc = hf_is_folder(path) ? hf_open(path, &g) : gguf_is_gguf(path) ? gguf_open(path, &g) : llama2c_open(path, &g);
    uint32_t ftype = 0;
    bool has_ftype = !grc && !gguf_get_u32(g, "general.file_type", &ftype);
    bool add_eos = false;
    if (!grc) gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &add_eos);
    gguf_free(g);
    char name[256], tmodel[64], pre[64];
    meta(m, "general.name", name, sizeof name);
    meta(m, "tokenizer.ggml.model", tmodel, sizeof tmodel);
    meta(m, "tokenizer.ggml.pre", pre, sizeof pre);
    size_t tmpl_len = 0;
    bool tmpl_builtin = false;
    bool tmpl = kvllm_model_chat_template(m, &tmpl_len, &tmpl_builtin) != NULL;
    const double bpw = d->n_params ? 8.0 * (double)d->weight_bytes / (double)d->n_params : 0;
    const char *ft = has_ftype ? ftype_name(ftype) : d->weight_type;
    static const struct { const char *name; double bytes; double scale; } kv[] = {
        { "f32", 4, 0 }, { "f16", 2, 0 }, { "bf16", 2, 0 }, { "int8", 1, 4 }, { "fp8", 1, 4 },
    };
    if (json) {
        printf("{\n");
        json_str("file", path, true);
        json_str("name", name, true);
        json_str("architecture", d->arch, true);
        json_str("file_type", ft, true);
        json_str("weight_type", d->weight_type, true);
        printf("  \"bits_per_weight\": %.3f,\n  \"n_params\": %llu,\n  \"weight_bytes\": %llu,\n  \"placed_bytes\": %llu,\n",
               bpw, (unsigned long long)d->n_params, (unsigned long long)d->weight_bytes,
               (unsigned long long)d->placed_bytes);
        printf("  \"n_vocab\": %d,\n  \"n_ctx_train\": %d,\n  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n"
               "  \"n_head_kv\": %d,\n  \"head_dim\": %d,\n  \"n_rot\": %d,\n  \"n_ff\": %d,\n  \"rope_theta\": %g,\n"
               "  \"norm_eps\": %g,\n", d->n_vocab, d->n_ctx_train, d->n_embd, d->n_layer, d->n_head, d->n_head_kv,
               d->head_dim, d->n_rot, d->n_ff, d->rope_theta, d->norm_eps);
        json_str("tokenizer_model", tmodel, true);
        json_str("tokenizer_pre", pre, true);
        printf("  \"bos\": %d,\n  \"eos\": %d,\n  \"add_bos\": %s,\n  \"add_eos\": %s,\n  \"chat_template\": %s,\n"
               "  \"chat_template_builtin\": %s,\n", d->token_bos, d->token_eos, d->add_bos ? "true" : "false",
               add_eos ? "true" : "false", tmpl ? "true" : "false", tmpl_builtin ? "true" : "false");
        /* per token: what each more position of context costs (the global layers' K/V when the
         * sliding ones keep only their window); per sequence: a whole context, windows included */
        printf("  \"n_layer_swa\": %d,\n  \"n_swa\": %d,\n", d->n_layer_swa, d->n_swa);
        printf("  \"kv_bytes_per_token\": {");
        for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
            printf("%s\"%s\": %.0f", i ? ", " : "", kv[i].name, kv_head_bytes(d, kv[i].bytes, kv[i].scale) *
                                                               (d->n_layer - d->n_layer_swa));
        printf("},\n  \"kv_bytes_per_sequence\": {");
        for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
            printf("%s\"%s\": %.0f", i ? ", " : "", kv[i].name, kv_seq_bytes(d, kv[i].bytes, kv[i].scale, false));
        printf("},\n  \"kv_bytes_per_sequence_full_cache\": {");
        for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
            printf("%s\"%s\": %.0f", i ? ", " : "", kv[i].name, kv_seq_bytes(d, kv[i].bytes, kv[i].scale, true));
        printf("}\n}\n");
        kvllm_model_free(m);
        return 0;
    }
    char wb[32], pb[32];
    human(wb, sizeof wb, (double)d->weight_bytes);
    human(pb, sizeof pb, (double)d->placed_bytes);
    printf("file              %s\n", path);
    fputs("name              ", stdout);
    put_escaped(*name ? name : "(none)", false);
    putchar('\n');
    printf("architecture      %s\n", d->arch);
    printf("file type         %s, %.2f bits per weight\n", ft, bpw);
    printf("n_vocab           %d\n", d->n_vocab);
    printf("n_ctx_train       %d\n", d->n_ctx_train);
    printf("n_embd            %d\n", d->n_embd);
    printf("n_layer           %d\n", d->n_layer);
    printf("n_head            %d\n", d->n_head);
    printf("n_head_kv         %d  (%s)\n", d->n_head_kv,
           d->n_head_kv == d->n_head ? "multi-head" : d->n_head_kv == 1 ? "multi-query" : "grouped-query");
    printf("head_dim          %d\n", d->head_dim);
    printf("n_rot             %d\n", d->n_rot);
    printf("n_ff              %d\n", d->n_ff);
    printf("rope_theta        %g\n", d->rope_theta);
    printf("norm_eps          %g\n", d->norm_eps);
    fputs("tokenizer         ", stdout);
    put_escaped(*tmodel ? tmodel : "(none)", false);
    fputs(*pre ? ", pre-tokenizer " : "", stdout);
    put_escaped(pre, false);
    putchar('\n');
    printf("bos / eos         %d / %d\n", d->token_bos, d->token_eos);
    printf("add_bos / add_eos %s / %s\n", d->add_bos ? "yes" : "no", add_eos ? "yes" : "no");
    if (tmpl && tmpl_builtin)
        printf("chat template     yes, kvllm's for %s (%zu bytes; the file has none)\n", d->arch, tmpl_len);
    else if (tmpl) printf("chat template     yes (%zu bytes)\n", tmpl_len);
    else printf("chat template     no\n");
    print_tensor_types(path);
    printf("parameters        %llu (%.2f M)\n", (unsigned long long)d->n_params, (double)d->n_params / 1e6);
    printf("weight bytes      %llu (%s)\n", (unsigned long long)d->weight_bytes, wb);
    printf("placed bytes      %llu (%s, as the %s backend keeps them)\n", (unsigned long long)d->placed_bytes, pb,
           kvllm_model_backend(m));
    if (d->n_layer_swa)
        printf("sliding window    %d of %d layers attend the last %d positions: their K/V are kept for the "
               "window only\n", d->n_layer_swa, d->n_layer, d->n_swa);
    printf("KV cache          per token        at full context (%d)%s\n", d->n_ctx_train,
           d->n_layer_swa ? "   a full cache (--kv-full)" : "");
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++) {
        double per_tok = kv_head_bytes(d, kv[i].bytes, kv[i].scale) * (d->n_layer - d->n_layer_swa);
        char a[32], b[32], c[32];
        human(a, sizeof a, per_tok);
        human(b, sizeof b, kv_seq_bytes(d, kv[i].bytes, kv[i].scale, false));
        human(c, sizeof c, kv_seq_bytes(d, kv[i].bytes, kv[i].scale, true));
        if (d->n_layer_swa) printf("  %-5s           %-16s %-22s %s\n", kv[i].name, a, b, c);
        else printf("  %-5s           %-16s %s\n", kv[i].name, a, b);
    }
    kvllm_model_free(m);
    return 0;
}
