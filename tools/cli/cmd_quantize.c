/* cmd_quantize.c — `kvllm quantize IN.gguf OUT.gguf TYPE`: rewrite a GGUF model's weight matrices in
 * another type, keeping all metadata.  Which tensor gets which type, and the conversion, are the
 * library's (src/quant/quant.h: llama-quantize's rules and mixes, the row fallbacks); this file reads
 * the arguments, checks IN and OUT before any work, and prints the progress and the summary.  As
 * llama-quantize, a tensor already in a block-quantized type that would change type needs
 * --allow-requantize; every tensor's type is decided, and OUT checked to be creatable, before any work. */
#include "cli.h"
#include "cli_opts.h"
#include "core/core.h"
#include "core/threadpool.h"
#include "load/gguf.h"
#include "quant/quant.h"
#include "tensor/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { Q_HELP = 1, Q_THREADS, Q_REQUANTIZE };

/* quantize's options: the parser, --help and docs/CLI.md's reference read this table */
static const struct cli_opt k_quantize_opts[] = {
    { Q_THREADS, "-t, --threads", "N", CLI_VALUE,
      "threads (default: all CPUs); the output is the same for any N; a number\nafter TYPE is the same "
      "(llama-quantize's nthreads)" },
    { Q_REQUANTIZE, "--allow-requantize", NULL, CLI_FLAG,
      "convert tensors that are already quantized (Q8_0, Q4_K, ...); without it\nsuch a file is refused, as "
      "llama-quantize does (the error compounds: quantize\nthe F16/F32 original instead).  Tensors already in their "
      "target type are\ncopied as they are and need no flag." },
    { Q_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_quantize_group = CLI_GROUP(NULL, k_quantize_opts);
static const struct cli_opt_group *const k_quantize_groups[] = { &k_quantize_group };

static const struct cli_cmd k_quantize_cmd = {
    .name = "quantize",
    .synopsis = "IN.gguf OUT.gguf TYPE [N] [-t N] [--allow-requantize]",
    .groups = CLI_GROUPS(k_quantize_groups),
    .n_own = 1,
    .positional = true,
    .notes =
        "  TYPE  F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4:\n"
        "        every weight matrix in TYPE\n"
        "        Q4_K_M Q5_K_M: llama-quantize's mixes (output, some attn_v and ffn_down in Q6_K)\n"
        "  1-D tensors (norms) are copied unchanged.  A matrix whose row length is not a whole\n"
        "  number of the type's blocks falls back (Q2_K/Q3_K/IQ4_XS -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1,\n"
        "  Q6_K -> Q8_0; 32-blocks -> F16); one warning line counts them.  OUT is checked to be writable\n"
        "  before any work.  Progress and a summary go to stderr.\n",
};

void cmd_quantize_markdown(FILE *f) { cli_cmd_markdown(&k_quantize_cmd, f); }

/* The fallbacks in one line on stderr (nothing when there are none). */
static void print_fallbacks(const struct quant_plan *p, uint64_t n_tensors) {
    if (!p->n_fb) return;
    fprintf(stderr, "kvllm: warning: %d of %llu tensors have rows that are not a whole number of their type's "
            "blocks and use another type:", p->n_fb, (unsigned long long)n_tensors);
    for (int g = 0; g < p->n_fb_groups; g++) {
        const struct quant_fallback *f = &p->fb[g];
        fprintf(stderr, "%s %d %s -> %s (row length %lld, block %d: %s%s)", g ? ";" : "", f->n, dtype_name(f->want),
                dtype_name(f->to), (long long)f->ne0, dtype_block_elems(f->want), f->first, f->n > 1 ? ", ..." : "");
    }
    if (p->n_fb_other) fprintf(stderr, "; %d more", p->n_fb_other);
    fputc('\n', stderr);
}

/* Can OUT be written?  The writer's temporary file is created beside it and
 * removed at once, so a missing or read-only folder fails now, not after the
 * work; nothing is left behind.  0 or 1 (reported). */
static int out_writable(const char *out) {
    struct stat st;
    if (stat(out, &st) == 0 && S_ISDIR(st.st_mode)) { cli_error("%s: is a directory", out); return 1; }
    struct out_file of;
    if (out_file_open(&of, out)) return 1;   /* logged with the path and errno */
    out_file_abort(&of);
    return 0;
}

static void human(char *b, size_t n, double bytes) {
    snprintf(b, n, bytes >= 1048576 ? "%.2f MiB" : "%.1f KiB", bytes >= 1048576 ? bytes / 1048576 : bytes / 1024);
}

/* Per output type: tensors and bytes before and after, for the summary. */
struct summary {
    uint64_t n_tensors;
    uint64_t cnt[DTYPE_COUNT_], b_in[DTYPE_COUNT_], b_out[DTYPE_COUNT_], total_in, total_out;
};

static void on_tensor(uint64_t i, const char *name, uint32_t from, uint32_t to, uint64_t in_bytes, uint64_t out_bytes,
                      void *user) {
    struct summary *s = user;
    char a[32], b[32];
    human(a, sizeof a, (double)in_bytes);
    human(b, sizeof b, (double)out_bytes);
    fprintf(stderr, "[%4llu/%4llu] %-28s %-6s -> %-6s %10s -> %10s\n", (unsigned long long)i + 1,
            (unsigned long long)s->n_tensors, name, dtype_name(from), dtype_name(to), a, b);
    if (to < DTYPE_COUNT_) { s->cnt[to]++; s->b_in[to] += in_bytes; s->b_out[to] += out_bytes; }
    s->total_in += in_bytes;
    s->total_out += out_bytes;
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[3] = { NULL };
    int n_pos = 0;
    long threads = 0;
    bool allow_requantize = false;
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const struct cli_opt *op;
        const char *v;
        int m = cli_cmd_next(&k_quantize_cmd, argc, argv, &i, &op, &v);
        if (m < 0) return 2;
        if (m == 0 && n_pos < 3) {
            pos[n_pos++] = argv[i];
        } else if (m == 0 && n_pos == 3 && !threads) {   /* llama-quantize's trailing [nthreads] */
            if (!cli_int("nthreads", argv[i], 1, 1024, &threads)) return 2;
            n_pos++;
        } else if (m == 0) {
            cli_cmd_unknown(&k_quantize_cmd, argv[i]);
            return 2;
        } else if (op->id == Q_HELP) {
            cli_cmd_usage(&k_quantize_cmd, stdout);
            return 0;
        } else if (op->id == Q_THREADS) {
            if (!cli_int("-t", v, 1, 1024, &threads)) return 2;
        } else {
            allow_requantize = true;
        }
    }
    if (!cli_opt_end()) return 2;
    if (n_pos < 3) { cli_error("quantize: IN, OUT and TYPE are required (see kvllm quantize --help)"); return 2; }
    const char *in = pos[0], *out = pos[1];
    const struct quant_target *target = quant_target_find(pos[2]);
    if (!target) {
        char valid[256];
        quant_target_names(valid, sizeof valid);
        cli_error("quantize: unknown TYPE '%s' (valid: %s)", pos[2], valid);
        return 2;
    }
    if (out_path_check("quantize", out, in)) return 1; /* OUT is written whole (gguf_write), but never over IN */
    if (cli_out_kind_check("quantize", out, false)) return 1;
    if (!gguf_is_gguf(in)) { cli_error("%s: not a GGUF file", in); return 1; }

    struct gguf *src = NULL, *dst = NULL;
    struct threadpool *pool = NULL;
    struct quant_plan plan = { 0 };
    struct summary sum = { 0 };
    int rc = gguf_open(in, &src);
    if (rc) return 1;
    const double t0 = cli_time();
    if ((rc = quant_plan_make(src, target, &plan))) goto done;
    if (plan.n_requant && !allow_requantize) {
        cli_error("%s: %d tensor%s already quantized, e.g. %s; quantizing them again compounds the error "
                  "(quantize the F16/F32 original instead, or pass --allow-requantize)", in, plan.n_requant,
                  plan.n_requant == 1 ? " is" : "s are", plan.first_requant);
        rc = KVLLM_EINVAL;
        goto done;
    }
    if (out_writable(out)) { rc = KVLLM_EIO; goto done; }
    dst = gguf_new(out);
    pool = threadpool_new(threads > 0 ? (int)threads : cpu_count());
    if (!dst || !pool) { cli_error("out of memory"); rc = KVLLM_ENOMEM; goto done; }
    sum.n_tensors = src->n_tensors;
    if ((rc = quant_model(src, target, &plan, pool, dst, on_tensor, &sum))) goto done;
    if ((rc = gguf_write(dst, out))) goto done;

    fprintf(stderr, "kvllm: quantized %s -> %s as %s in %.1f s (%d threads)\n", in, out, target->name,
            cli_time() - t0, threadpool_size(pool));
    for (int t = 0; t < DTYPE_COUNT_; t++) {
        if (!sum.cnt[t]) continue;
        char a[32], b[32];
        human(a, sizeof a, (double)sum.b_in[t]);
        human(b, sizeof b, (double)sum.b_out[t]);
        fprintf(stderr, "  %-6s %4llu tensors  %10s -> %10s\n", dtype_name((uint32_t)t), (unsigned long long)sum.cnt[t],
                a, b);
    }
    char a[32], b[32];
    human(a, sizeof a, (double)sum.total_in);
    human(b, sizeof b, (double)sum.total_out);
    fprintf(stderr, "  total  %4llu tensors  %10s -> %10s (%.1f%%)\n", (unsigned long long)src->n_tensors, a, b,
            sum.total_in ? 100.0 * (double)sum.total_out / (double)sum.total_in : 100.0);
    print_fallbacks(&plan, src->n_tensors);

done:
    quant_plan_free(&plan);
    threadpool_free(pool);
    gguf_free(dst);
    gguf_free(src);
    return rc ? 1 : 0;
}
