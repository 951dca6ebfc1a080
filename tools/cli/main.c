/* main.c — `kvllm COMMAND ...`: dispatch to the subcommands. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const struct { const char *name; int (*fn)(int, char **); const char *help; } k_cmds[] = {
    { "run",      cmd_run,      "generate text from a prompt" },
    { "info",     cmd_info,     "describe a model file: shapes, types, sizes, KV-cache bytes" },
    { "convert",  cmd_convert,  "write a llama2.c checkpoint (or GGUF) as GGUF" },
    { "quantize", cmd_quantize, "rewrite a GGUF's weights as F16, Q8_0, Q4_0, Q4_K, Q4_K_M, ..." },
    { "tokenize", cmd_tokenize, "print the token ids of a text" },
    { "eval",     cmd_eval,     "write the logits of a token sequence (for tests)" },
    { "bench",    cmd_bench,    "measure speed: bench model (prompt, generation), bench throughput (engine)" },
    { "batch",    cmd_batch,    "run many prompts through the engine at once (for tests)" },
    { "template", cmd_template, "render a chat template for a conversation (prints the prompt exactly)" },
    { "chat",     cmd_chat,     "converse with an instruct model via its chat template (KV cache kept across turns)" },
    { "grammar",  cmd_grammar,  "compile a GBNF / JSON Schema grammar, print it, check a text, time its masks" },
    { "serve",    cmd_serve,    "OpenAI-compatible HTTP server (completions, chat, streaming, metrics)" },
};

static void usage(FILE *f) {
    fprintf(f, "usage: kvllm COMMAND [options]   (kvllm COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
        fprintf(f, "  %-9s %s\n", k_cmds[i].name, k_cmds[i].help);
    fprintf(f, "  --version print the version, commit and compiled kernel sets\n");
    fprintf(f, "\nenvironment: KVLLM_CPU=scalar|avx2|avx512 forces a kernel set; KVLLM_ACT=q8|int integer "
               "activations;\n  KVLLM_BACKEND=cpu|cuda chooses the backend (cuda in a -DKVLLM_CUDA=ON build)\n");
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    if (cli_is_help(argv[1])) { usage(stdout); return 0; }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) { cli_print_version(stdout); return 0; }
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
        if (!strcmp(argv[1], k_cmds[i].name)) return k_cmds[i].fn(argc - 1, argv + 1);
    cli_error("unknown command '%s' (see kvllm --help)", argv[1]);
    return 2;
}
