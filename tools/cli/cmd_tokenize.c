/* cmd_tokenize.c — `kvllm tokenize`: the token ids of a text, each with the text it stands for
 * (or, with --raw-pieces, its vocabulary entry as stored).
 *
 * The vocabulary comes from a GGUF (a full model or a vocab-only file), a
 * Hugging Face tokenizer.json (or a model folder holding one) or a
 * llama2.c tokenizer.bin; a llama2.c checkpoint has none of its own, so it
 * needs --tokenizer.  A byte-level BPE vocabulary may also come as a Hugging
 * Face vocab.json + merges.txt pair (--vocab/--merges), with its
 * pre-tokenizer named by --pre and added tokens by --special.  Library
 * errors are logged by the library itself (one "kvllm: error: ..." line);
 * this file only reports its own. */
#include "cli.h"
#include "cli_opts.h"
#include "load/gguf.h"
#include "load/hf.h"
#include "load/llama2c.h"
#include "tok/bpe.h"
#include "tok/tokenizer.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    T_HELP = 1, T_MODEL, T_TOKENIZER, T_VOCAB, T_MERGES, T_PRE, T_SPECIAL, T_FILE, T_NO_BOS, T_PARSE_SPECIAL, T_IDS,
    T_RAW_PIECES, T_DECODE,
};

/* tokenize's options: the parser, --help and docs/CLI.md's reference read this table */
static const struct cli_opt k_tokenize_opts[] = {
    { T_MODEL, "-m, --model", "MODEL", CLI_VALUE,
      "GGUF model, vocab-only GGUF or Hugging Face folder (its tokenizer.json);\na llama2.c checkpoint needs "
      "--tokenizer" },
    { T_TOKENIZER, "--tokenizer", "PATH", CLI_VALUE,
      "tokenizer.json, llama2.c tokenizer.bin or GGUF vocabulary (overrides the model's)" },
    { T_VOCAB, "--vocab", "FILE", CLI_VALUE, "byte-level BPE vocabulary: Hugging Face vocab.json (piece -> id)" },
    { T_MERGES, "--merges", "FILE", CLI_VALUE, "its merges.txt (one \"a b\" merge per line, optional #version line)" },
    { T_PRE, "--pre", "NAME", CLI_VALUE, "pre-tokenizer, as GGUF tokenizer.ggml.pre names it (default gpt-2)" },
    { T_SPECIAL, "--special", "TEXT=ID", CLI_VALUE,
      "an added control token (repeatable), e.g. '<|begin_of_text|>=128000'" },
    { T_FILE, "-f, --file", "FILE", CLI_VALUE, "tokenize the bytes of FILE exactly ('-': standard input)" },
    { T_NO_BOS, "--no-bos", NULL, CLI_FLAG, "do not prepend BOS even if the vocabulary asks for it" },
    { T_PARSE_SPECIAL, "--parse-special", NULL, CLI_FLAG, "text of control tokens (\"<s>\") becomes those tokens" },
    { T_IDS, "--ids", NULL, CLI_FLAG, "print only the ids, space-separated on one line" },
    { T_RAW_PIECES, "--raw-pieces", NULL, CLI_FLAG,
      "print each token's vocabulary entry as stored (\"\u0120world\", \"\u2581the\",\n\"<0x0A>\"), unquoted, instead "
      "of the text it stands for" },
    { T_DECODE, "--decode", NULL, CLI_FLAG,
      "the other way: TEXT (or FILE) is space-separated ids; print the bytes they\ndecode to, exactly (nothing "
      "added)" },
    { T_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_tokenize_group = CLI_GROUP(NULL, k_tokenize_opts);
static const struct cli_opt_group *const k_tokenize_groups[] = { &k_tokenize_group };

static const struct cli_cmd k_tokenize_cmd = {
    .name = "tokenize",
    .synopsis =
        "(-m MODEL [--tokenizer PATH] | --vocab vocab.json --merges merges.txt [--pre NAME]\n"
        "                       [--special TEXT=ID]...) [-f FILE|-] [--no-bos] [--parse-special] [--ids | --raw-pieces]\n"
        "                      [--] [TEXT]",
    .groups = CLI_GROUPS(k_tokenize_groups),
    .n_own = 1,
    .positional = true,
    .notes =
        "  output: one line per token, ID<TAB>'TEXT', TEXT the bytes the token decodes to (byte-level BPE's\n"
        "  \u0120 as a space and \u010a as a newline, SentencePiece's \u2581 as a space, <0xNN> as its byte,\n"
        "  a control token as its text), with \\n \\t \\\\ \\' and \\xNN escapes (bytes that are not valid\n"
        "  UTF-8 on their own, e.g. one byte of a character split over tokens); --raw-pieces: ID<TAB>PIECE\n",
};

void cmd_tokenize_markdown(FILE *f) { cli_cmd_markdown(&k_tokenize_cmd, f); }

#define MAX_SPECIALS 256

struct opts {
    const char *model, *tokenizer, *file, *text;
    const char *vocab, *merges, *pre;
    struct bpe_special specials[MAX_SPECIALS];
    int n_specials;
    bool no_bos, parse_special, ids_only, decode, raw_pieces;
};

/* TEXT=ID, split at the last '=' (the text may contain '='); the text is
 * cut in place.  false (reported) when malformed. */
static bool parse_special_arg(char *a, struct opts *o) {
    char *eq = strrchr(a, '=');
    char *end = NULL;
    long id = eq ? strtol(eq + 1, &end, 10) : -1;
    if (!eq || eq == a || !end || end == eq + 1 || *end || id < 0 || id > INT32_MAX) {
        cli_error("tokenize: --special takes TEXT=ID with a non-negative id, not '%s'", a);
        return false;
    }
    if (o->n_specials == MAX_SPECIALS) {
        cli_error("tokenize: more than %d --special tokens", MAX_SPECIALS);
        return false;
    }
    *eq = 0;
    o->specials[o->n_specials++] = (struct bpe_special){ a, (int32_t)id };
    return true;
}

/* One of tokenize's options (v: its value): 0 taken, 1 help printed, 2 a bad value (reported). */
static int tokenize_opt(const struct cli_opt *op, const char *v, struct opts *o) {
    switch (op->id) {
    case T_HELP: cli_cmd_usage(&k_tokenize_cmd, stdout); return 1;
    case T_MODEL: o->model = v; break;
    case T_TOKENIZER: o->tokenizer = v; break;
    case T_FILE: o->file = v; break;
    case T_VOCAB: o->vocab = v; break;
    case T_MERGES: o->merges = v; break;
    case T_PRE: o->pre = v; break;
    case T_SPECIAL: if (!parse_special_arg((char *)v, o)) return 2; break;   /* v lies in argv: writable */
    case T_NO_BOS: o->no_bos = true; break;
    case T_PARSE_SPECIAL: o->parse_special = true; break;
    case T_IDS: o->ids_only = true; break;
    case T_DECODE: o->decode = true; break;
    case T_RAW_PIECES: o->raw_pieces = true; break;
    }
    return 0;
}

/* 0 ok, 1 help printed, 2 usage error (reported). */
static int parse_args(int argc, char **argv, struct opts *o) {
    bool only_text = false; /* after "--" */
    for (int i = 1; i < argc; i++) {
        const struct cli_opt *op;
        const char *v;
        int m = 0;
        if (!only_text && !strcmp(argv[i], "--")) { only_text = true; continue; }
        if (!only_text && (!cli_opt_split(argv, i) || (m = cli_cmd_next(&k_tokenize_cmd, argc, argv, &i, &op, &v)) < 0))
            return 2;
        if (m > 0) {
            int rc = tokenize_opt(op, v, o);
            if (rc) return rc;
            continue;
        }
        if (o->text) { cli_error("tokenize: more than one TEXT argument ('%s'); quote the text", argv[i]); return 2; }
        o->text = argv[i];
    }
    if (!cli_opt_end()) return 2;
    bool files = o->vocab || o->merges;
    if (files && (o->model || o->tokenizer)) {
        cli_error("tokenize: give either -m MODEL/--tokenizer PATH or --vocab/--merges, not both");
        return 2;
    }
    if (files && (!o->vocab || !o->merges)) { cli_error("tokenize: --vocab and --merges go together"); return 2; }
    if (!files && (o->pre || o->n_specials)) {
        cli_error("tokenize: --pre and --special apply to --vocab/--merges vocabularies");
        return 2;
    }
    if (!files && !o->model && !o->tokenizer) {
        cli_error("tokenize: give -m MODEL, --tokenizer PATH, or --vocab FILE --merges FILE");
        return 2;
    }
    if (o->raw_pieces && (o->ids_only || o->decode)) {
        cli_error("tokenize: --raw-pieces changes the ID<TAB>PIECE lines; not with --ids or --decode");
        return 2;
    }
    if (o->file && o->text) { cli_error("tokenize: give either TEXT or -f FILE, not both"); return 2; }
    if (!o->file && !o->text) { cli_error("tokenize: no text: give TEXT or -f FILE (- for stdin)"); return 2; }
    return 0;
}

/* ---- input ---- */

static char *read_text(const struct opts *o, size_t *len) {
    if (o->text) {
        *len = strlen(o->text);
        char *copy = malloc(*len + 1);
        if (copy) memcpy(copy, o->text, *len + 1);
        else cli_error("out of memory");
        return copy;
    }
    return cli_read_file(o->file, len); /* the bytes exactly: nothing stripped */
}

/* ---- vocabulary ---- */

static bool readable(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { cli_error("%s: cannot open: %s", path, strerror(errno)); return false; }
    fclose(f);
    return true;
}

static int load_tokenizer(const struct opts *o, struct tokenizer **t) {
    if (o->vocab) {
        if (!readable(o->vocab) || !readable(o->merges)) return 1;
        struct gguf *g = NULL;
        int rc = bpe_files_to_gguf(o->vocab, o->merges, o->pre, o->specials, o->n_specials, &g);
        if (rc == 0) rc = tokenizer_new(g, t);
        gguf_free(g);
        return rc < 0 ? 1 : 0;
    }
    const char *path = o->tokenizer;
    if (o->model && !readable(o->model)) return 1;
    if (!path) {
        if (!gguf_is_gguf(o->model) && !hf_is_folder(o->model) && !hf_is_tokenizer_json(o->model)) {
            if (llama2c_is_checkpoint(o->model))
                cli_error("%s: llama2.c checkpoints carry no vocabulary; pass --tokenizer tokenizer.bin", o->model);
            else
                cli_error("%s: neither a GGUF file, a Hugging Face folder or tokenizer.json, nor a llama2.c checkpoint",
                          o->model);
            return 1;
        }
        path = o->model;
    } else if (!readable(path)) {
        return 1;
    }
    struct gguf *g = NULL;
    int rc = vocab_file_open(path, -1, &g);
    if (rc == 0) rc = tokenizer_new(g, t);
    gguf_free(g);
    return rc < 0 ? 1 : 0;
}

/* ---- output ---- */

/* Length of the valid UTF-8 character at s (n bytes left), 0 if invalid. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
    unsigned hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < len; k++)
        if (s[k] < 0x80 || s[k] > 0xbf) return 0;
    return len;
}

/* n bytes with control characters, backslashes, invalid UTF-8 and (when
 * quoted) single quotes escaped; quoted: inside '...'. */
static void print_bytes(const char *bytes, size_t n, bool quoted, FILE *out) {
    const unsigned char *s = (const unsigned char *)bytes;
    if (quoted) putc('\'', out);
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c >= 0x80 ? utf8_char(s + i, n - i) : 1;
        if (c == '\n') fputs("\\n", out);
        else if (c == '\t') fputs("\\t", out);
        else if (c == '\\') fputs("\\\\", out);
        else if (c == '\'' && quoted) fputs("\\'", out);
        else if (c < 0x20 || c == 0x7f || len == 0) fprintf(out, "\\x%02X", c);
        else { fwrite(s + i, 1, len, out); i += len; continue; }
        i++;
    }
    if (quoted) putc('\'', out);
}

/* The text token id stands for: its decoded bytes (the space of a
 * SentencePiece piece kept, as mid-text), or for a control / unknown token
 * (which decodes to nothing) its piece as written.  false when out of memory. */
static bool print_token_text(const struct tokenizer *t, int32_t id, FILE *out) {
    enum tok_type ty = tokenizer_type(t, id);
    if (ty == TOK_CONTROL || ty == TOK_UNKNOWN) {
        const char *piece = tokenizer_piece(t, id);
        print_bytes(piece, strlen(piece), true, out);
        return true;
    }
    char small[64];
    int n = tokenizer_token_bytes(t, -2, id, small, sizeof small);
    if (n < 0) return false;
    char *buf = (size_t)n <= sizeof small ? small : malloc((size_t)n);
    if (!buf) { cli_error("out of memory"); return false; }
    if (buf != small && tokenizer_token_bytes(t, -2, id, buf, (size_t)n) != n) { free(buf); return false; }
    print_bytes(buf, (size_t)n, true, out);
    if (buf != small) free(buf);
    return true;
}

/* false when a token's text could not be formed (reported). */
static bool print_ids(const struct tokenizer *t, const int32_t *ids, int n, const struct opts *o) {
    for (int i = 0; i < n; i++) {
        if (o->ids_only) {
            printf(i ? " %d" : "%d", (int)ids[i]);
            continue;
        }
        printf("%d\t", (int)ids[i]);
        if (o->raw_pieces) {
            const char *piece = tokenizer_piece(t, ids[i]);
            print_bytes(piece, strlen(piece), false, stdout);
        } else if (!print_token_text(t, ids[i], stdout)) {
            return false;
        }
        putchar('\n');
    }
    if (o->ids_only) putchar('\n');
    return true;
}

/* --decode: ids (whitespace-separated decimal) -> the bytes they decode to, on stdout. */
static int decode_ids(const struct tokenizer *t, const char *text, size_t len) {
    int32_t *ids = malloc((len / 2 + 1) * sizeof *ids);
    if (!ids) { cli_error("out of memory"); return 1; }
    int n = 0;
    for (size_t i = 0; i < len;) {
        if (strchr(" \t\r\n", text[i])) { i++; continue; }
        long v = 0;
        size_t start = i;
        while (i < len && text[i] >= '0' && text[i] <= '9' && v <= INT32_MAX) v = v * 10 + (text[i++] - '0');
        if (i == start || v > INT32_MAX || (i < len && !strchr(" \t\r\n", text[i]))) {
            cli_error("tokenize --decode: expected token ids, found '%.20s'", text + start);
            free(ids);
            return 1;
        }
        ids[n++] = (int32_t)v;
    }
    int status = 0;
    int need = tokenizer_decode(t, ids, n, NULL, 0);
    char *buf = need >= 0 ? malloc((size_t)need + 1) : NULL;
    if (need >= 0 && !buf) cli_error("out of memory");
    if (!buf || tokenizer_decode(t, ids, n, buf, (size_t)need + 1) != need) status = 1;
    if (!status && (fwrite(buf, 1, (size_t)need, stdout) != (size_t)need || fflush(stdout) != 0)) {
        cli_error("writing the output: %s", strerror(errno));
        status = 1;
    }
    free(buf);
    free(ids);
    return status;
}

int cmd_tokenize(int argc, char **argv) {
    struct opts o = { 0 };
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    size_t len;
    char *text = read_text(&o, &len);
    if (!text) return 1;
    struct tokenizer *t = NULL;
    if (load_tokenizer(&o, &t)) { free(text); return 1; }

    if (o.decode) {
        int status = decode_ids(t, text, len);
        free(text);
        tokenizer_free(t);
        return status;
    }
    bool bos = !o.no_bos;
    int n = tokenizer_encode(t, text, len, bos, o.parse_special, NULL, 0);
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    if (n > 0 && !ids) cli_error("out of memory for %d token ids", n);
    else if (n > 0) n = tokenizer_encode(t, text, len, bos, o.parse_special, ids, n);
    int status = n < 0 || (n > 0 && !ids) ? 1 : 0;
    if (status == 0 && !print_ids(t, ids, n, &o)) status = 1;
    if (status == 0 && fflush(stdout) != 0) {
        cli_error("writing the output: %s", strerror(errno));
        status = 1;
    }
    free(ids);
    free(text);
    tokenizer_free(t);
    return status;
}
