/* cmd_quantize.c — `kvllm quantize IN.gguf OUT.gguf TYPE`: rewrite a GGUF
 * model's weight matrices in another type, keeping all metadata.
 *
 * Which tensors change: those with two or more dimensions (of size > 1)
 * whose name ends in "weight" (not ffn_gate_inp, pos_embd, token_types, as llama-quantize);
 * 1-D tensors (norms, biases) are copied unchanged.  A plain TYPE puts
 * every such matrix in TYPE (llama-quantize --pure); Q4_K_M and Q5_K_M are
 * llama-quantize's mixes for Llama-style models (llama_tensor_get_type):
 *   output.weight (token_embd.weight when there is no output.weight) Q6_K;
 *   attn_v.weight and ffn_down.weight Q6_K in the layers where
 *     use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2,
 *     i counting those tensors in file order, n how many there are;
 *   attn_qkv.weight Q5_K (Q4_K_M) or Q6_K (Q5_K_M); the rest Q4_K / Q5_K.
 * A row length (ne[0]) that is not a whole number of blocks of the chosen
 * type falls back, counted in one warning line on stderr (grouped by type
 * and row length, naming the first tensor of each group):
 *   Q2_K, Q3_K, IQ4_XS -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0
 *   (the output in a mix: Q8_0), as llama.cpp's convert_incompatible_tensor;
 *   a 32-element block type that does not fit either -> F16.
 * A tensor already in its target type is copied byte for byte.  Others are
 * dequantized row by row with dtype_to_f32 and quantized with the reference
 * quantizers (dtype_from_f32), rows in chunks handed to -t threads (the
 * result does not depend on the thread count).  As llama-quantize, a tensor
 * already in a block-quantized type that would change type (to another
 * quantized type or back to a float one) needs --allow-requantize; every
 * tensor's type is decided, and OUT checked to be creatable, before any work.  general.file_type is set in llama.cpp's
 * LLAMA_FTYPE numbering (a pure K type as its _S variant: Q3_K 11, Q4_K 14,
 * Q5_K 16, Q6_K 18; MXFP4 as MXFP4_MOE 38). */
#include "cli.h"
#include "core/core.h"
#include "core/threadpool.h"
#include "load/gguf.h"
#include "tensor/dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

static const char *k_usage =
    "usage: kvllm quantize IN.gguf OUT.gguf TYPE [N] [-t N] [--allow-requantize]\n"
    "  TYPE  F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4:\n"
    "        every weight matrix in TYPE\n"
    "        Q4_K_M Q5_K_M: llama-quantize's mixes (output, some attn_v and ffn_down in Q6_K)\n"
    "  -t, --threads N     threads (default: all CPUs); the output is the same for any N; a number\n"
    "                      after TYPE is the same (llama-quantize's nthreads)\n"
    "  --allow-requantize  convert tensors that are already quantized (Q8_0, Q4_K, ...); without it\n"
    "                      such a file is refused, as llama-quantize does (the error compounds: quantize\n"
    "                      the F16/F32 original instead).  Tensors already in their target type are\n"
    "                      copied as they are and need no flag.\n"
    "  1-D tensors (norms) are copied unchanged.  A matrix whose row length is not a whole\n"
    "  number of the type's blocks falls back (Q2_K/Q3_K/IQ4_XS -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1,\n"
    "  Q6_K -> Q8_0; 32-blocks -> F16); one warning line counts them.  OUT is checked to be writable\n"
    "  before any work.  Progress and a summary go to stderr.\n";

enum mix { MIX_NONE, MIX_Q4_K_M, MIX_Q5_K_M };

static const struct { const char *name; uint32_t type; uint32_t ftype; enum mix mix; } k_targets[] = {
    { "F32",    DTYPE_F32,  0,  MIX_NONE },
    { "F16",    DTYPE_F16,  1,  MIX_NONE },
    { "BF16",   DTYPE_BF16, 32, MIX_NONE },
    { "Q8_0",   DTYPE_Q8_0, 7,  MIX_NONE },
    { "Q4_0",   DTYPE_Q4_0, 2,  MIX_NONE },
    { "Q4_1",   DTYPE_Q4_1, 3,  MIX_NONE },
    { "Q5_0",   DTYPE_Q5_0, 8,  MIX_NONE },
    { "Q5_1",   DTYPE_Q5_1, 9,  MIX_NONE },
    { "Q2_K",   DTYPE_Q2_K, 10, MIX_NONE },
    { "Q3_K",   DTYPE_Q3_K, 11, MIX_NONE },
    { "Q4_K",   DTYPE_Q4_K, 14, MIX_NONE },
    { "Q5_K",   DTYPE_Q5_K, 16, MIX_NONE },
    { "Q6_K",   DTYPE_Q6_K, 18, MIX_NONE },
    { "IQ4_NL", DTYPE_IQ4_NL, 25, MIX_NONE },
    { "IQ4_XS", DTYPE_IQ4_XS, 30, MIX_NONE },
    { "MXFP4",  DTYPE_MXFP4, 38, MIX_NONE },
    { "Q4_K_M", DTYPE_Q4_K, 15, MIX_Q4_K_M },
    { "Q5_K_M", DTYPE_Q5_K, 17, MIX_Q5_K_M },
};

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Would llama-quantize quantize this tensor at all?  Dimensions count as
 * ggml_n_dims does: trailing sizes of 1 do not make a matrix. */
static bool quantizable(const char *name, const struct gguf_tensor *t) {
    uint32_t n_dims = 1;
    for (uint32_t d = 1; d < t->n_dims; d++)
        if (t->ne[d] > 1) n_dims = d + 1;
    return n_dims >= 2 && ends_with(name, "weight") && !strstr(name, "ffn_gate_inp.weight") &&
           !strstr(name, "pos_embd") && !strstr(name, "token_types");
}

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* State of the mix rules while walking the tensors in file order. */
struct mix_state {
    bool has_output;
    int n_attn_v, i_attn_v, n_ffn_down, i_ffn_down;
};

/* llama_tensor_get_type for the Q4_K_M / Q5_K_M mixes (Llama-style, no experts). */
static uint32_t mix_type(enum mix mix, uint32_t base, const char *name, struct mix_state *ms) {
    if (mix == MIX_NONE) return base;
    if (!strcmp(name, "output.weight") || (!ms->has_output && !strcmp(name, "token_embd.weight")))
        return DTYPE_Q6_K;   /* Q8_0 when the row does not fit: fallback_type */
    if (strstr(name, "attn_v.weight")) {
        bool more = use_more_bits(ms->i_attn_v++, ms->n_attn_v);
        return more ? DTYPE_Q6_K : base;
    }
    if (strstr(name, "ffn_down")) {
        bool more = use_more_bits(ms->i_ffn_down++, ms->n_ffn_down);
        return more ? DTYPE_Q6_K : base;
    }
    if (strstr(name, "attn_qkv.weight")) return mix == MIX_Q4_K_M ? DTYPE_Q5_K : DTYPE_Q6_K;
    return base;
}

/* The type a row of ne0 elements can really take when `want` does not fit. */
static uint32_t fallback_type(uint32_t want, int64_t ne0) {
    uint32_t t = want == DTYPE_Q4_K ? DTYPE_Q5_0 : want == DTYPE_Q5_K ? DTYPE_Q5_1 : want == DTYPE_Q6_K ? DTYPE_Q8_0
               : want == DTYPE_Q2_K || want == DTYPE_Q3_K || want == DTYPE_IQ4_XS ? DTYPE_IQ4_NL : DTYPE_F16;
    return ne0 % dtype_block_elems(t) ? DTYPE_F16 : t;
}

/* ---- the plan: every tensor's output type, decided before any work ---- */

/* Tensors whose rows fell back, grouped by (wanted, used, row length) for one summary line. */
#define MAX_FALLBACK_GROUPS 8

struct fallback_group {
    uint32_t want, to;
    int64_t ne0;
    int n;
    char first[64];   /* the first tensor's name (cut) */
};

struct plan {
    uint32_t *to;                 /* (n_tensors) output type of each tensor */
    int n_quantized;              /* tensors whose type changes to or from a block type */
    int n_requant;                /* of those, converted from an already block-quantized type */
    char first_requant[160];      /* "NAME (Q8_0 -> Q4_0)" of the first */
    struct fallback_group fb[MAX_FALLBACK_GROUPS];
    int n_fb_groups, n_fb, n_fb_other;   /* groups, tensors that fell back, those in no group */
};

static bool is_block_type(uint32_t type) { return dtype_supported(type) && dtype_block_elems(type) > 1; }

/* Walk the tensors in file order as llama-quantize does.  0, or a KVLLM_E*
 * code after reporting a tensor kvllm cannot convert. */
static int make_plan(const struct gguf *src, const char *in, int ti, struct plan *p) {
    /* the mix rules count attn_v / ffn_down tensors first, as llama-quantize does */
    struct mix_state ms = { 0 };
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const struct gguf_tensor *t = &src->tensors[i];
        if (gguf_str_eq(t->name, "output.weight")) ms.has_output = true;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(t->name.len < 255 ? t->name.len : 255), t->name.ptr);
        if (strstr(name, "attn_v.weight") || strstr(name, "attn_qkv.weight")) ms.n_attn_v++;
        if (strstr(name, "ffn_down")) ms.n_ffn_down++;
    }
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const struct gguf_tensor *t = &src->tensors[i];
        if (t->name.len >= 256) { cli_error("%s: tensor name too long", in); return KVLLM_EFORMAT; }
        char name[256];
        memcpy(name, t->name.ptr, t->name.len);
        name[t->name.len] = 0;
        const int64_t ne0 = t->ne[0];
        uint32_t to = t->type;
        if (quantizable(name, t)) {
            uint32_t want = mix_type(k_targets[ti].mix, k_targets[ti].type, name, &ms);
            to = ne0 % dtype_block_elems(want) ? fallback_type(want, ne0) : want;
            if (to != want) {
                p->n_fb++;
                int g = 0;
                while (g < p->n_fb_groups && !(p->fb[g].want == want && p->fb[g].to == to && p->fb[g].ne0 == ne0)) g++;
                if (g == p->n_fb_groups && g < MAX_FALLBACK_GROUPS) {
                    p->fb[g] = (struct fallback_group){ .want = want, .to = to, .ne0 = ne0 };
                    snprintf(p->fb[g].first, sizeof p->fb[g].first, "%s", name);
                    p->n_fb_groups++;
                }
                if (g < p->n_fb_groups) p->fb[g].n++;
                else p->n_fb_other++;
            }
        }
        p->to[i] = to;
        if (to == t->type) continue;
        if (!dtype_supported(t->type)) {
            cli_error("%s: tensor '%s' has type %s, which kvllm cannot read", in, name, dtype_name(t->type));
            return KVLLM_EUNSUPPORTED;
        }
        if (is_block_type(t->type) || is_block_type(to)) p->n_quantized++;
        if (is_block_type(t->type) && p->n_requant++ == 0)
            snprintf(p->first_requant, sizeof p->first_requant, "%s (%s -> %s)", name, dtype_name(t->type),
                     dtype_name(to));
    }
    return 0;
}

/* The fallbacks in one line on stderr (nothing when there are none). */
static void print_fallbacks(const struct plan *p, uint64_t n_tensors) {
    if (!p->n_fb) return;
    fprintf(stderr, "kvllm: warning: %d of %llu tensors have rows that are not a whole number of their type's "
            "blocks and use another type:", p->n_fb, (unsigned long long)n_tensors);
    for (int g = 0; g < p->n_fb_groups; g++) {
        const struct fallback_group *f = &p->fb[g];
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

/* ---- converting one tensor, rows in chunks over the pool ---- */

/* Rows per chunk: about 64K elements, so that a chunk is a few milliseconds
 * of work and threads the OS delays do not hold the others up.  A row's
 * bytes depend on that row alone, so the output does not depend on which
 * thread did which chunk, or on the thread count. */
#define CHUNK_ELEMS 65536

struct conv_job {
    const uint8_t *src;   /* (n_rows, in_rb) of in_type */
    uint8_t *dst;         /* (n_rows, out_rb) of out_type */
    uint32_t in_type, out_type;
    int64_t ne0, n_rows, rows_per_chunk;
    size_t in_rb, out_rb;
    float *buf;           /* (nth, ne0) */
    int64_t *bad_row;     /* (nth): smallest row with a non-finite value seen by that thread, or -1 */
};

static void conv_chunk(void *arg, long c, int ith) {
    struct conv_job *j = arg;
    const int64_t r0 = (int64_t)c * j->rows_per_chunk;
    const int64_t r1 = r0 + j->rows_per_chunk < j->n_rows ? r0 + j->rows_per_chunk : j->n_rows;
    float *buf = j->buf + (size_t)ith * (size_t)j->ne0;
    for (int64_t r = r0; r < r1; r++) {
        dtype_to_f32(j->in_type, j->src + (size_t)r * j->in_rb, buf, j->ne0);
        bool finite = true;
        for (int64_t k = 0; k < j->ne0; k++) finite &= isfinite(buf[k]) != 0;
        if (!finite) {   /* every chunk runs to its end, so the smallest row is always found */
            if (j->bad_row[ith] < 0 || r < j->bad_row[ith]) j->bad_row[ith] = r;
            continue;
        }
        dtype_from_f32(j->out_type, buf, j->dst + (size_t)r * j->out_rb, j->ne0);
    }
}

static void human(char *b, size_t n, double bytes) {
    snprintf(b, n, bytes >= 1048576 ? "%.2f MiB" : "%.1f KiB", bytes >= 1048576 ? bytes / 1048576 : bytes / 1024);
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[3] = { NULL };
    int n_pos = 0;
    long threads = 0;
    bool allow_requantize = false;
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        if (cli_is_help(argv[i])) { fputs(k_usage, stdout); return 0; }
        if (!strcmp(argv[i], "-t") || !strcmp(argv[i], "--threads")) {
            const char *v = cli_arg(argc, argv, &i);
            if (!v || !cli_int("-t", v, 1, 1024, &threads)) return 2;
        } else if (!strcmp(argv[i], "--allow-requantize")) {
            allow_requantize = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            cli_error("quantize: unknown option '%s' (see kvllm quantize --help)", argv[i]);
            return 2;
        } else if (n_pos < 3) {
            pos[n_pos++] = argv[i];
        } else if (n_pos == 3 && !threads) {   /* llama-quantize's trailing [nthreads] */
            if (!cli_int("nthreads", argv[i], 1, 1024, &threads)) return 2;
            n_pos++;
        } else {
            cli_error("quantize: unexpected argument '%s'", argv[i]);
            return 2;
        }
    }
    if (!cli_opt_end()) return 2;
    if (n_pos < 3) { cli_error("quantize: IN, OUT and TYPE are required (see kvllm quantize --help)"); return 2; }
    const char *in = pos[0], *out = pos[1];
    int ti = -1;
    for (size_t i = 0; i < sizeof k_targets / sizeof *k_targets; i++)
        if (!strcasecmp(pos[2], k_targets[i].name)) ti = (int)i;
    if (ti < 0) {
        char valid[256] = "";
        for (size_t i = 0; i < sizeof k_targets / sizeof *k_targets; i++)
            snprintf(valid + strlen(valid), sizeof valid - strlen(valid), "%s%s", i ? " " : "", k_targets[i].name);
        cli_error("quantize: unknown TYPE '%s' (valid: %s)", pos[2], valid);
        return 2;
    }
    if (out_path_check("quantize", out, in)) return 1; /* OUT is written whole (gguf_write), but never over IN */
    if (cli_out_kind_check("quantize", out, false)) return 1;
    if (!gguf_is_gguf(in)) { cli_error("%s: not a GGUF file", in); return 1; }

    struct gguf *src = NULL, *dst = NULL;
    struct threadpool *pool = NULL;
    uint8_t **bufs = NULL;
    float *rowbuf = NULL;
    int64_t *bad = NULL;
    struct plan plan = { 0 };
    int rc = gguf_open(in, &src);
    if (rc) return 1;
    const double t0 = cli_time();
    if (!(plan.to = xcalloc(src->n_tensors ? src->n_tensors : 1, sizeof *plan.to))) { rc = KVLLM_ENOMEM; goto done; }
    if ((rc = make_plan(src, in, ti, &plan))) goto done;
    if (plan.n_requant && !allow_requantize) {
        cli_error("%s: %d tensor%s already quantized, e.g. %s; quantizing them again compounds the error "
                  "(quantize the F16/F32 original instead, or pass --allow-requantize)", in, plan.n_requant,
                  plan.n_requant == 1 ? " is" : "s are", plan.first_requant);
        rc = KVLLM_EINVAL;
        goto done;
    }
    if (out_writable(out)) { rc = KVLLM_EIO; goto done; }

    dst = gguf_new(out);
    bufs = calloc(src->n_tensors ? src->n_tensors : 1, sizeof *bufs);
    pool = threadpool_new(threads > 0 ? (int)threads : cpu_count());
    const int nth = pool ? threadpool_size(pool) : 1;
    bad = calloc((size_t)nth, sizeof *bad);
    if (!dst || !bufs || !pool || !bad) { cli_error("out of memory"); rc = KVLLM_ENOMEM; goto done; }

    for (uint64_t i = 0; !rc && i < src->n_kv; i++) {
        if ((rc = gguf_set_kv(dst, &src->kv[i])))
            cli_error("%s: cannot copy metadata key '%.*s' (%s)", in, (int)src->kv[i].key.len, src->kv[i].key.ptr,
                      kvllm_strerror(rc));
    }
    if (!rc) rc = gguf_set_u32(dst, "general.file_type", k_targets[ti].ftype);
    if (!rc) rc = gguf_set_u32(dst, "general.quantization_version", 2);
    if (rc) goto done;

    int64_t max_ne0 = 1;
    for (uint64_t i = 0; i < src->n_tensors; i++)
        if (src->tensors[i].ne[0] > max_ne0) max_ne0 = src->tensors[i].ne[0];
    if (!(rowbuf = xmalloc((size_t)nth * (size_t)max_ne0 * sizeof *rowbuf))) { rc = KVLLM_ENOMEM; goto done; }

    uint64_t cnt[DTYPE_COUNT_] = { 0 }, b_in[DTYPE_COUNT_] = { 0 }, b_out[DTYPE_COUNT_] = { 0 };
    uint64_t total_in = 0, total_out = 0;
    for (uint64_t i = 0; !rc && i < src->n_tensors; i++) {
        const struct gguf_tensor *t = &src->tensors[i];
        char name[256];   /* make_plan checked the length */
        memcpy(name, t->name.ptr, t->name.len);
        name[t->name.len] = 0;
        const int64_t ne0 = t->ne[0];
        const uint32_t to = plan.to[i];
        const void *data = t->data;
        uint64_t n_bytes = t->n_bytes;
        if (to != t->type) {
            uint64_t in_rb, out_rb;
            const int64_t n_rows = (int64_t)(t->n_elems / (uint64_t)ne0);
            if (!dtype_row_bytes(t->type, (uint64_t)ne0, &in_rb) || !dtype_row_bytes(to, (uint64_t)ne0, &out_rb) ||
                !ckd_mul_u64(&n_bytes, out_rb, (uint64_t)n_rows) || n_bytes > SIZE_MAX / 2) {
                cli_error("%s: tensor '%s' does not fit in memory as %s", in, name, dtype_name(to));
                rc = KVLLM_ERANGE;
                break;
            }
            if (!(bufs[i] = xmalloc(n_bytes ? (size_t)n_bytes : 1))) { rc = KVLLM_ENOMEM; break; }
            int64_t rpc = CHUNK_ELEMS / ne0 > 0 ? CHUNK_ELEMS / ne0 : 1;
            struct conv_job j = { t->data, bufs[i], t->type, to, ne0, n_rows, rpc, (size_t)in_rb, (size_t)out_rb,
                                  rowbuf, bad };
            for (int k = 0; k < nth; k++) bad[k] = -1;
            threadpool_run_chunks(pool, (long)((n_rows + rpc - 1) / rpc), conv_chunk, &j);
            int64_t first_bad = -1;
            for (int k = 0; k < nth; k++)
                if (bad[k] >= 0 && (first_bad < 0 || bad[k] < first_bad)) first_bad = bad[k];
            if (first_bad >= 0) {
                cli_error("%s: tensor '%s' row %lld holds a NaN or infinity", in, name, (long long)first_bad);
                rc = KVLLM_EFORMAT;
                break;
            }
            data = bufs[i];
        }
        if ((rc = gguf_add_tensor(dst, name, to, t->n_dims, t->ne, data))) {
            cli_error("%s: cannot add tensor '%s' (%s)", out, name, kvllm_strerror(rc));
            break;
        }
        char a[32], b[32];
        human(a, sizeof a, (double)t->n_bytes);
        human(b, sizeof b, (double)n_bytes);
        fprintf(stderr, "[%4llu/%4llu] %-28s %-6s -> %-6s %10s -> %10s\n", (unsigned long long)i + 1,
                (unsigned long long)src->n_tensors, name, dtype_name(t->type), dtype_name(to), a, b);
        if (to < DTYPE_COUNT_) { cnt[to]++; b_in[to] += t->n_bytes; b_out[to] += n_bytes; }
        total_in += t->n_bytes;
        total_out += n_bytes;
    }
    if (rc) goto done;
    if ((rc = gguf_write(dst, out))) goto done;

    fprintf(stderr, "kvllm: quantized %s -> %s as %s in %.1f s (%d threads)\n", in, out, k_targets[ti].name,
            cli_time() - t0, nth);
    for (int t = 0; t < DTYPE_COUNT_; t++) {
        if (!cnt[t]) continue;
        char a[32], b[32];
        human(a, sizeof a, (double)b_in[t]);
        human(b, sizeof b, (double)b_out[t]);
        fprintf(stderr, "  %-6s %4llu tensors  %10s -> %10s\n", dtype_name((uint32_t)t), (unsigned long long)cnt[t],
                a, b);
    }
    char a[32], b[32];
    human(a, sizeof a, (double)total_in);
    human(b, sizeof b, (double)total_out);
    fprintf(stderr, "  total  %4llu tensors  %10s -> %10s (%.1f%%)\n", (unsigned long long)src->n_tensors, a, b,
            total_in ? 100.0 * (double)total_out / (double)total_in : 100.0);
    print_fallbacks(&plan, src->n_tensors);

done:
    if (bufs)
        for (uint64_t i = 0; i < src->n_tensors; i++) free(bufs[i]);
    free(bufs);
    free(plan.to);
    free(rowbuf);
    free(bad);
    threadpool_free(pool);
    gguf_free(dst);
    gguf_free(src);
    return rc ? 1 : 0;
}
