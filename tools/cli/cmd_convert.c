/* cmd_convert.c — `kvllm convert IN [--to gguf|hf] -o OUT [--tokenizer PATH]`:
 * a llama2.c checkpoint, a GGUF or a Hugging Face folder written as GGUF
 * (tensors in their source type, with the vocabulary's tokenizer.ggml.*
 * keys when one is given) or as a Hugging Face folder (config.json,
 * generation_config.json, model.safetensors, and tokenizer.json +
 * tokenizer_config.json when there is a vocabulary: the folder then loads
 * with -m DIR alone).  Architectures: llama, mistral, qwen2, gpt2.  A
 * folder's experts (Mixtral, Qwen3-MoE) are written stacked, as GGUF files
 * have them (hf_stack_experts). */
#include "cli.h"
#include "cli_opts.h"
#include "core/core.h"
#include "kvllm.h"
#include "load/gguf.h"
#include "load/hf.h"
#include "load/llama2c.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CV_HELP = 1, CV_OUT, CV_TO, CV_TOKENIZER };

/* convert's options: the parser, --help and docs/CLI.md's reference read this table */
static const struct cli_opt k_convert_opts[] = {
    { CV_OUT, "-o", "OUT", CLI_VALUE, "the output: a GGUF file, or with --to hf a folder" },
    { CV_TO, "--to", "gguf|hf", CLI_VALUE,
      "gguf (default): OUT is a GGUF file; hf: OUT is a folder that gets config.json,\ngeneration_config.json, "
      "model.safetensors (F32/F16/BF16 tensors only; llama,\nmistral, qwen2 or gpt2) and, with a vocabulary, "
      "tokenizer.json + tokenizer_config.json" },
    { CV_TOKENIZER, "--tokenizer", "PATH", CLI_VALUE,
      "tokenizer.json, llama2.c tokenizer.bin or GGUF whose tokenizer.* keys are copied in" },
    { CV_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_convert_group = CLI_GROUP(NULL, k_convert_opts);
static const struct cli_opt_group *const k_convert_groups[] = { &k_convert_group };

static const struct cli_cmd k_convert_cmd = {
    .name = "convert",
    .synopsis = "IN [--to gguf|hf] -o OUT [--tokenizer PATH]",
    .groups = CLI_GROUPS(k_convert_groups),
    .n_own = 1,
    .positional = true,
    .notes = "  IN: a llama2.c checkpoint (legacy version-0 .bin), GGUF file or Hugging Face folder\n",
};

void cmd_convert_markdown(FILE *f) { cli_cmd_markdown(&k_convert_cmd, f); }

/* Copy the tokenizer.* keys of a vocabulary file (GGUF, tokenizer.json or tokenizer.bin) into g. */
static int copy_vocab(struct gguf *g, const char *path) {
    const struct gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    struct gguf *v;
    int rc = vocab_file_open(path, emb ? (int)emb->ne[1] : -1, &v);
    for (uint64_t i = 0; !rc && i < v->n_kv; i++)
        if (v->kv[i].key.len > 10 && !memcmp(v->kv[i].key.ptr, "tokenizer.", 10)) rc = gguf_set_kv(g, &v->kv[i]);
    gguf_free(v);
    return rc;
}

int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *tok = NULL, *to = "gguf";
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const struct cli_opt *op;
        const char *v;
        int m = cli_cmd_next(&k_convert_cmd, argc, argv, &i, &op, &v);
        if (m < 0) return 2;
        /* IN, once ("-" is no model) */
        if (m == 0 && (in || !strcmp(argv[i], "-"))) { cli_cmd_unknown(&k_convert_cmd, argv[i]); return 2; }
        if (m == 0) { in = argv[i]; continue; }
        switch (op->id) {
        case CV_HELP: cli_cmd_usage(&k_convert_cmd, stdout); return 0;
        case CV_OUT: out = v; break;
        case CV_TO: to = v; break;
        case CV_TOKENIZER: tok = v; break;
        }
    }
    if (!cli_opt_end()) return 2;
    if (!in || !out) { cli_error("convert: IN and -o OUT are required (see kvllm convert --help)"); return 2; }
    if (strcmp(to, "gguf") && strcmp(to, "hf")) { cli_error("convert: --to must be gguf or hf, not '%s'", to); return 2; }
    /* the output replaces its target only when complete (a temporary file
     * renamed into place), but an output that is the input is refused anyway */
    if (out_path_check("convert", out, in) || (tok && out_path_check("convert", out, tok))) return 1;
    const bool folder = !strcmp(to, "hf");
    if (cli_out_kind_check("convert", out, folder)) return 1;
    struct stat st;
    const bool existed = stat(out, &st) == 0;
    struct gguf *g = NULL;
    int rc;
    if (gguf_is_gguf(in)) rc = gguf_open(in, &g);
    else if (llama2c_is_checkpoint(in)) rc = llama2c_open(in, &g);
    else if (hf_is_folder(in)) rc = hf_open(in, &g);
    else { cli_error("%s: not a GGUF file, a llama2.c checkpoint nor a Hugging Face folder", in); return 1; }
    if (!rc && tok) rc = copy_vocab(g, tok);
    if (!rc && !folder) rc = hf_stack_experts(g);   /* a folder's experts as GGUF files stack them */
    if (!rc) rc = folder ? hf_write(g, out) : gguf_write(g, out);
    /* hf_write renames its files into the folder only once all are written:
     * a folder it made for a conversion that failed (a full disk) is empty */
    if (rc && folder && !existed) rmdir(out);
    if (!rc) fprintf(stderr, "kvllm: wrote %s (%llu tensors, %llu metadata keys)\n", out,
                     (unsigned long long)g->n_tensors, (unsigned long long)g->n_kv);
    gguf_free(g);
    return rc ? 1 : 0;
}
