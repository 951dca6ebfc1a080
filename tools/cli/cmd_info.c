/* cmd_info.c — `kvllm info MODEL`: what a model file holds and what its KV
 * cache costs, before anything is run. */
#include "cli.h"
#include "kvllm.h"
#include "load/gguf.h"
#include "load/hf.h"
#include "load/llama2c.h"
#include "tensor/dtype.h"

#include <stdio.h>
#include <string.h>

static const char *k_usage =
    "usage: kvllm info [-m] MODEL [--tokenizer PATH]\n"
    "  prints architecture, hyper-parameters, tensor types, parameter count, weight bytes,\n"
    "  and KV-cache bytes per token and at full context for f32, f16, bf16, int8 and fp8 storage\n";

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

int cmd_info(int argc, char **argv) {
    const char *path = NULL, *tok = NULL;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) { fputs(k_usage, stdout); return 0; }
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (!(path = cli_arg(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--tokenizer")) {
            if (!(tok = cli_arg(argc, argv, &i))) return 2;
        } else if (argv[i][0] != '-' && !path) {
            path = argv[i];
        } else {
            cli_error("info: unknown option '%s'", argv[i]);
            return 2;
        }
    }
    if (!path) { cli_error("info: a MODEL path is required (see kvllm info --help)"); return 2; }
    kvllm_log_set_level(KVLLM_LOG_WARN);
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = tok;
    mp.n_threads = 1;
    struct kvllm_model *m;
    if (kvllm_model_load(path, &mp, &m)) return 1;
    const struct kvllm_model_desc *d = kvllm_model_describe(m);
    char wb[32];
    human(wb, sizeof wb, (double)d->weight_bytes);
    printf("file              %s\n", path);
    printf("architecture      %s\n", d->arch);
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
    printf("bos / eos         %d / %d\n", d->token_bos, d->token_eos);
    print_tensor_types(path);
    printf("parameters        %llu (%.2f M)\n", (unsigned long long)d->n_params, (double)d->n_params / 1e6);
    printf("weight bytes      %llu (%s)\n", (unsigned long long)d->weight_bytes, wb);
    /* 2 (K and V) x n_layer x n_head_kv x head_dim elements per token; the
     * 8-bit types add an f32 scale per token, head, and K/V. */
    static const struct { const char *name; double bytes; int scale; } kv[] = {
        { "f32", 4, 0 }, { "f16", 2, 0 }, { "bf16", 2, 0 }, { "int8", 1, 4 }, { "fp8", 1, 4 },
    };
    printf("KV cache          per token        at full context (%d)\n", d->n_ctx_train);
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++) {
        double heads = 2.0 * d->n_layer * d->n_head_kv;
        double per_tok = heads * (d->head_dim * kv[i].bytes + kv[i].scale);
        char a[32], b[32];
        human(a, sizeof a, per_tok);
        human(b, sizeof b, per_tok * d->n_ctx_train);
        printf("  %-5s           %-16s %s\n", kv[i].name, a, b);
    }
    kvllm_model_free(m);
    return 0;
}
