/* test_tok_vectors.c — the SentencePiece tokenizer against reference ids.
 *
 * Golden data (tests/data, or $KVLLM_SHARED: tests/data/README.md):
 *   - llama.cpp's vocab-only GGUFs (llama-spm, phi-3) with their .inp/.out
 *     test strings and ids (no BOS, no special parsing, space prefix);
 *   - llama2.c's Llama 2 encode vectors (BOS included) with the Llama 2
 *     vocab in llama2.c's tokenizer.bin format;
 *   - stories260K's 512-token tok512.bin.
 * Every case must match exactly and decode back to its input.  Missing
 * files are failures, never skips. */
#include "check.h"
#include "io_util.h"
#include "load/gguf.h"
#include "load/llama2c.h"
#include "tok/tokenizer.h"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* ---- small helpers ---- */

/* Parse space-separated ids; returns the count (at most cap). */
static bool valid_utf8(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t len = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                   : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (len == 0 || i + len > n) return false;
        for (size_t k = 1; k < len; k++) {
            unsigned lo = 0x80, hi = 0xbf;
            if (k == 1 && c == 0xe0) lo = 0xa0;
            if (k == 1 && c == 0xed) hi = 0x9f;
            if (k == 1 && c == 0xf0) lo = 0x90;
            if (k == 1 && c == 0xf4) hi = 0x8f;
            if (p[i + k] < lo || p[i + k] > hi) return false;
        }
        i += len;
    }
    return true;
}

static int find_piece(const struct tokenizer *t, const char *piece) {
    for (int id = 0; id < tokenizer_n_vocab(t); id++)
        if (strcmp(tokenizer_piece(t, id), piece) == 0) return id;
    return -1;
}

/* Does decode(ids) give back exactly text[0, len)? */
static bool roundtrips(const struct tokenizer *t, const int32_t *ids, int n, const char *text, size_t len) {
    char *buf = malloc(len + 64);
    int got = tokenizer_decode(t, ids, n, buf, len + 64);
    bool ok = got >= 0 && (size_t)got == len && memcmp(buf, text, len) == 0;
    free(buf);
    return ok;
}

/* Encode, compare with want (n_want ids), check the roundtrip; prints a
 * diagnosis on mismatch.  Returns whether the ids matched. */
static bool check_case(const struct tokenizer *t, const char *what, int i, const char *text, size_t len,
                       bool add_bos, const int32_t *want, int n_want) {
    int32_t got[4096];
    int n = tokenizer_encode(t, text, len, add_bos, false, got, 4096);
    bool match = n == n_want && memcmp(got, want, (size_t)n * sizeof *got) == 0;
    CHECK_MSG(match, "%s case %d (\"%.*s\"): got %d ids, want %d", what, i, (int)(len > 40 ? 40 : len),
              text, n, n_want);
    if (!match && n >= 0) {
        fprintf(stderr, "  got: ");
        for (int k = 0; k < n && k < 4096; k++) fprintf(stderr, " %d", got[k]);
        fprintf(stderr, "\n  want:");
        for (int k = 0; k < n_want; k++) fprintf(stderr, " %d", want[k]);
        fputc('\n', stderr);
    }
    CHECK_MSG(n >= 0 && roundtrips(t, got, n, text, len), "%s case %d does not decode back", what, i);
    return match;
}

/* ---- llama.cpp's .inp / .out vectors ---- */

/* Run every case of NAME.inp/.out with tokenizer t (loaded from wherever). */
static void run_llamacpp_cases(const struct tokenizer *t, const char *name, const char *label) {
    char inp_path[1024], out_path[1024], rel[512];
    snprintf(rel, sizeof rel, "tokenizers/llamacpp-vocab/%s.inp", name);
    tu_shared_path(inp_path, sizeof inp_path, rel);
    snprintf(rel, sizeof rel, "tokenizers/llamacpp-vocab/%s.out", name);
    tu_shared_path(out_path, sizeof out_path, rel);
    size_t inp_len, out_len;
    char *inp = tu_read_file(inp_path, &inp_len), *out = tu_read_file(out_path, &out_len);
    CHECK_MSG(inp && out, "missing %s or %s", inp_path, out_path);
    if (!inp || !out) { free(inp); free(out); return; }

    static const char SEP[] = "\n__ggml_vocab_test__\n";
    const size_t sep_len = sizeof SEP - 1;
    int n_cases = 0, n_match = 0;
    char *p = inp, *end = inp + inp_len, *line = out;
    for (char *hit; (hit = memmem(p, (size_t)(end - p), SEP, sep_len)) != NULL; p = hit + sep_len) {
        char *nl = strchr(line, '\n');
        CHECK_MSG(nl != NULL, "%s: fewer .out lines than .inp cases", name);
        if (!nl) break;
        *nl = 0;
        int32_t want[4096];
        int n_want = tu_parse_ids(line, want, 4096);
        n_match += check_case(t, label, n_cases, p, (size_t)(hit - p), false, want, n_want);
        n_cases++;
        line = nl + 1;
    }
    CHECK_MSG(p == end, "%s: .inp does not end with the separator", name);
    CHECK_MSG(*line == 0, "%s: more .out lines than .inp cases", name);
    CHECK(n_cases > 0);
    printf("%s: %d/%d cases match\n", label, n_match, n_cases);
    free(inp);
    free(out);
}

static struct tokenizer *load_gguf_vocab(const char *rel) {
    char path[1024];
    tu_shared_path(path, sizeof path, rel);
    struct gguf *g = NULL;
    struct tokenizer *t = NULL;
    int rc = gguf_open(path, &g);
    CHECK_MSG(rc == 0, "cannot open %s (%d)", path, rc);
    if (rc == 0) {
        rc = tokenizer_new(g, &t);
        CHECK_MSG(rc == 0, "tokenizer_new(%s) = %d", path, rc);
    }
    gguf_free(g);
    return t;
}

static struct tokenizer *load_llama2c_vocab(const char *rel, int n_vocab) {
    char path[1024];
    tu_shared_path(path, sizeof path, rel);
    struct gguf *g = gguf_new(path);
    struct tokenizer *t = NULL;
    int rc = llama2c_vocab_to_gguf(path, n_vocab, g);
    CHECK_MSG(rc == 0, "llama2c_vocab_to_gguf(%s) = %d", path, rc);
    if (rc == 0) {
        rc = tokenizer_new(g, &t);
        CHECK_MSG(rc == 0, "tokenizer_new(%s) = %d", path, rc);
    }
    gguf_free(g);
    return t;
}

static void test_llamacpp_vocab(const char *name) {
    char rel[512];
    snprintf(rel, sizeof rel, "tokenizers/llamacpp-vocab/%s", name);
    struct tokenizer *t = load_gguf_vocab(rel);
    if (!t) return;
    run_llamacpp_cases(t, name, name);
    tokenizer_free(t);
}

/* ---- llama2.c's Llama 2 vectors ---- */

static void put_utf8(char **o, uint32_t cp) {
    unsigned char *p = (unsigned char *)*o;
    if (cp < 0x80) { *p++ = (unsigned char)cp; }
    else if (cp < 0x800) { *p++ = (unsigned char)(0xc0 | cp >> 6); *p++ = (unsigned char)(0x80 | (cp & 0x3f)); }
    else if (cp < 0x10000) {
        *p++ = (unsigned char)(0xe0 | cp >> 12); *p++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        *p++ = (unsigned char)(0x80 | (cp & 0x3f));
    } else {
        *p++ = (unsigned char)(0xf0 | cp >> 18); *p++ = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
        *p++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)); *p++ = (unsigned char)(0x80 | (cp & 0x3f));
    }
    *o = (char *)p;
}

static long hex4(const char *s) {
    char buf[5] = { 0 };
    memcpy(buf, s, 4);
    char *end;
    long v = strtol(buf, &end, 16);
    return end == buf + 4 ? v : -1;
}

/* Unescape the JSON string starting at s (at its opening quote) into out
 * (as large as s); returns the byte length, or -1 if malformed. */
static long json_unescape(const char *s, char *out) {
    if (*s++ != '"') return -1;
    char *o = out;
    while (*s && *s != '"') {
        if (*s != '\\') { *o++ = *s++; continue; }
        s++;
        char c = *s++;
        switch (c) {
        case 'n': *o++ = '\n'; break;
        case 't': *o++ = '\t'; break;
        case 'r': *o++ = '\r'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case '"': case '\\': case '/': *o++ = c; break;
        case 'u': {
            long cp = strlen(s) >= 4 ? hex4(s) : -1;
            if (cp < 0) return -1;
            s += 4;
            if (cp >= 0xd800 && cp < 0xdc00) { /* high surrogate: a low one must follow */
                long lo = s[0] == '\\' && s[1] == 'u' && strlen(s) >= 6 ? hex4(s + 2) : -1;
                if (lo < 0xdc00 || lo > 0xdfff) return -1;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                s += 6;
            }
            put_utf8(&o, (uint32_t)cp);
            break;
        }
        default: return -1;
        }
    }
    return *s == '"' ? (long)(o - out) : -1;
}

static void test_json_unescape(void) {
    char out[64];
    long n = json_unescape("\"a\\n\\\"\\\\\\t\\u00e9\\ud83e\\udd99\"", out);
    CHECK(n == 1 + 1 + 1 + 1 + 1 + 2 + 4 && memcmp(out, "a\n\"\\\t\xc3\xa9\xf0\x9f\xa6\x99", (size_t)n) == 0);
}

static void test_llama2_vectors(const struct tokenizer *t) {
    char path[1024];
    tu_shared_path(path, sizeof path, "tokenizers/llama2_spm_encode_vectors.txt");
    size_t len;
    char *data = tu_read_file(path, &len);
    CHECK_MSG(data != NULL, "missing %s", path);
    if (!data || !t) { free(data); return; }
    char *text = malloc(len + 1);
    long text_len = -1;
    int n_cases = 0, n_match = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "PROMPT ", 7) == 0) {
            text_len = json_unescape(line + 7, text);
            CHECK_MSG(text_len >= 0, "bad PROMPT line: %s", line);
        } else if (strncmp(line, "IDS ", 4) == 0 && text_len >= 0) {
            int32_t want[4096];
            int n_want = tu_parse_ids(line + 4, want, 4096);
            n_match += check_case(t, "llama2_spm_encode_vectors", n_cases, text, (size_t)text_len, true,
                                  want, n_want);
            n_cases++;
            text_len = -1;
        }
    }
    CHECK(n_cases > 0);
    printf("llama2_spm_encode_vectors (llama2c-tokenizer.bin): %d/%d cases match\n", n_match, n_cases);
    free(text);
    free(data);
}

/* ---- stories260K's 512-token vocabulary ---- */

static void test_tok512(void) {
    struct tokenizer *t = load_llama2c_vocab("models/stories260K/tok512.bin", -1);
    if (!t) return;
    CHECK(tokenizer_n_vocab(t) == 512);
    CHECK(tokenizer_bos(t) == 1 && tokenizer_eos(t) == 2 && tokenizer_add_bos(t));
    CHECK(strcmp(tokenizer_piece(t, 1), "<s>") == 0 && strcmp(tokenizer_piece(t, 2), "</s>") == 0);
    CHECK(tokenizer_type(t, 0) == TOK_UNKNOWN && tokenizer_type(t, 1) == TOK_CONTROL);
    CHECK(tokenizer_type(t, 3) == TOK_BYTE && tokenizer_type(t, 300) == TOK_NORMAL);
    static const char *texts[] = {
        "Once upon a time, there was a little girl named Lily.",
        "  two leading spaces, trailing space ",
        "Tabs\tand\nnewlines\n\n",
        "Unicode: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80!",
        "",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        int32_t ids[1024];
        size_t len = strlen(texts[i]);
        int n = tokenizer_encode(t, texts[i], len, true, false, ids, 1024);
        CHECK(n >= 1 && ids[0] == 1);
        for (int k = 0; k < n; k++) CHECK(ids[k] >= 0 && ids[k] < 512);
        CHECK_MSG(n >= 0 && roundtrips(t, ids, n, texts[i], len), "tok512 roundtrip of \"%s\"", texts[i]);
    }
    /* a short buffer gets the first ids and the full count */
    int32_t all[64], few[3];
    const char *s = "Once upon a time";
    int n = tokenizer_encode(t, s, strlen(s), true, false, all, 64);
    CHECK(n > 3 && tokenizer_encode(t, s, strlen(s), true, false, few, 3) == n);
    CHECK(n > 3 && memcmp(all, few, sizeof few) == 0);
    CHECK(tokenizer_encode(t, s, strlen(s), true, false, NULL, 0) == n);
    tokenizer_free(t);
}

/* ---- parse_special ---- */

static void test_parse_special(const struct tokenizer *t) {
    int32_t ids[64], tail[64];
    const char *s = "<s>Hello</s> world";
    int n = tokenizer_encode(t, s, strlen(s), false, true, ids, 64);
    int n_tail = tokenizer_encode(t, " world", 6, false, false, tail, 64);
    /* "Hello" after <s> gets the space prefix, like llama.cpp: ▁Hello = 15043 */
    CHECK(n == 3 + n_tail && ids[0] == 1 && ids[1] == 15043 && ids[2] == 2);
    CHECK(n == 3 + n_tail && memcmp(ids + 3, tail, (size_t)n_tail * sizeof *ids) == 0);
    n = tokenizer_encode(t, s, strlen(s), false, false, ids, 64);
    for (int i = 0; i < n; i++) CHECK(ids[i] != 1 && ids[i] != 2);
    CHECK(n > 0 && roundtrips(t, ids, n, s, strlen(s)));
}

/* ---- streaming decode ---- */

static void test_detok(const struct tokenizer *t) {
    /* the emoji and CJK are not all in the vocabulary: byte tokens appear */
    const char *text = "Hi \xf0\x9f\xa6\x99 caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
                       "\xf0\x9f\x98\x80\xf0\x9f\x98\xb6\xe2\x80\x8d\xf0\x9f\x8c\xab\xef\xb8\x8f end";
    int32_t ids[256];
    int n = tokenizer_encode(t, text, strlen(text), true, false, ids, 256);
    CHECK(n > 0 && n < 256);
    int n_byte_tokens = 0;
    for (int i = 0; i < n; i++) n_byte_tokens += tokenizer_type(t, ids[i]) == TOK_BYTE;
    CHECK(n_byte_tokens >= 4);

    struct detok d;
    detok_init(&d, t);
    char joined[1024] = "";
    size_t jn = 0;
    bool chunks_valid = true;
    for (int i = 0; i < n; i++) {
        const char *chunk = detok_push(&d, i ? ids[i - 1] : -1, ids[i]);
        CHECK(chunk != NULL);
        if (!chunk) break;
        size_t cn = strlen(chunk);
        chunks_valid = chunks_valid && valid_utf8(chunk, cn);
        if (jn + cn < sizeof joined) { memcpy(joined + jn, chunk, cn); jn += cn; }
    }
    const char *rest = detok_flush(&d);
    CHECK(rest && *rest == 0);
    CHECK(chunks_valid);
    CHECK_MSG(jn == strlen(text) && memcmp(joined, text, jn) == 0, "detok gave \"%.*s\"", (int)jn, joined);

    /* a dangling lead byte comes out as U+FFFD on flush */
    int f0 = find_piece(t, "<0xF0>"), b80 = find_piece(t, "<0x80>"), e6 = find_piece(t, "<0xE6>");
    int a = find_piece(t, "a");
    CHECK(f0 >= 0 && b80 >= 0 && e6 >= 0 && a >= 0);
    const char *out = detok_push(&d, 5, f0);
    CHECK(out && *out == 0);
    out = detok_flush(&d);
    CHECK(out && strcmp(out, "\xef\xbf\xbd") == 0);
    /* a stray continuation byte is replaced, not passed through */
    out = detok_push(&d, 5, b80);
    CHECK(out && strcmp(out, "\xef\xbf\xbd") == 0);
    /* a lead byte cut short by ASCII: one U+FFFD, then the ASCII */
    out = detok_push(&d, 5, e6);
    CHECK(out && *out == 0);
    out = detok_push(&d, e6, a);
    CHECK(out && strcmp(out, "\xef\xbf\xbd" "a") == 0);
    out = detok_flush(&d);
    CHECK(out && *out == 0);
    detok_deinit(&d);
}

/* ---- bad input ---- */

static int write_temp(const void *data, size_t n, char *path, size_t cap) {
    snprintf(path, cap, "/tmp/kvllm_tok_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    bool ok = write(fd, data, n) == (ssize_t)n;
    close(fd);
    return ok ? 0 : -1;
}

static int convert_bytes(const void *data, size_t n, int n_vocab) {
    char path[64];
    if (write_temp(data, n, path, sizeof path) < 0) return 1;
    struct gguf *g = gguf_new(path);
    int rc = llama2c_vocab_to_gguf(path, n_vocab, g);
    struct tokenizer *t = NULL;
    if (rc == 0) rc = tokenizer_new(g, &t);
    tokenizer_free(t);
    gguf_free(g);
    unlink(path);
    return rc;
}

static void test_bad_llama2c(void) {
    char path[1024];
    tu_shared_path(path, sizeof path, "models/stories260K/tok512.bin");
    size_t len;
    char *data = tu_read_file(path, &len);
    CHECK_MSG(data != NULL, "missing %s", path);
    if (!data) return;
    kvllm_log_set(tu_log_capture, NULL);
    CHECK(convert_bytes(data, len, 512) == 0);
    CHECK(convert_bytes(data, len, 513) == KVLLM_EFORMAT);
    CHECK(strstr(tu_log.last, "/tmp/kvllm_tok_") && strstr(tu_log.last, "token 512"));
    size_t cuts[] = { 0, 2, 4, 7, 10, 13, len / 2, len - 1 };
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        tu_log_reset();
        CHECK_MSG(convert_bytes(data, cuts[i], 512) == KVLLM_EFORMAT, "cut at %zu with n_vocab 512", cuts[i]);
        CHECK_MSG(strstr(tu_log.last, "/tmp/kvllm_tok_") != NULL, "message names the file: %s", tu_log.last);
        CHECK_MSG(convert_bytes(data, cuts[i], -1) == KVLLM_EFORMAT, "cut at %zu with n_vocab -1", cuts[i]);
    }
    /* a negative length */
    unsigned char bad[16] = { 7, 0, 0, 0, 0, 0, 0, 0, 0xfb, 0xff, 0xff, 0xff, 'a', 'b', 'c', 'd' };
    CHECK(convert_bytes(bad, sizeof bad, -1) == KVLLM_EFORMAT);
    kvllm_log_set(NULL, NULL);
    free(data);
}

static int new_from(struct gguf *g) {
    struct tokenizer *t = NULL;
    int rc = tokenizer_new(g, &t);
    CHECK((rc == 0) == (t != NULL));
    tokenizer_free(t);
    return rc;
}

/* A minimal valid vocabulary: <unk> <s> </s>. */
static struct gguf *small_vocab(const char *path) {
    static const struct gguf_str toks[3] = { { "<unk>", 5 }, { "<s>", 3 }, { "</s>", 4 } };
    struct gguf *g = gguf_new(path);
    gguf_set_str(g, "tokenizer.ggml.model", "llama");
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", toks, 3);
    return g;
}

static void test_bad_gguf(void) {
    kvllm_log_set(tu_log_capture, NULL);
    float scores[2] = { 0, 0 };
    int32_t types[3] = { 2, 3, 9 };

    struct gguf *g = gguf_new("empty.gguf");
    CHECK(new_from(g) == KVLLM_ENOTFOUND);
    gguf_set_str(g, "tokenizer.ggml.model", "llama");
    CHECK(new_from(g) == KVLLM_ENOTFOUND);
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", NULL, 0);
    CHECK(new_from(g) == KVLLM_EFORMAT);
    CHECK_MSG(strstr(tu_log.last, "empty.gguf") && strstr(tu_log.last, "no tokens"), "got: %s", tu_log.last);
    gguf_free(g);

    g = small_vocab("ok.gguf");
    CHECK(new_from(g) == 0);
    gguf_free(g);

    g = small_vocab("scores.gguf");
    gguf_set_arr(g, "tokenizer.ggml.scores", GGUF_T_FLOAT32, scores, 2);
    CHECK(new_from(g) == KVLLM_EFORMAT);
    gguf_free(g);

    g = small_vocab("types.gguf");
    gguf_set_arr(g, "tokenizer.ggml.token_type", GGUF_T_INT32, types, 3);
    CHECK(new_from(g) == KVLLM_EFORMAT);
    gguf_free(g);

    g = small_vocab("bos.gguf");
    gguf_set_u32(g, "tokenizer.ggml.bos_token_id", 3);
    CHECK(new_from(g) == KVLLM_EFORMAT);
    CHECK_MSG(strstr(tu_log.last, "bos.gguf") != NULL, "got: %s", tu_log.last);
    gguf_free(g);

    g = small_vocab("gpt2.gguf");
    gguf_set_str(g, "tokenizer.ggml.model", "gpt2");
    CHECK(new_from(g) == KVLLM_EUNSUPPORTED);
    CHECK_MSG(strstr(tu_log.last, "'gpt2'") != NULL, "got: %s", tu_log.last);
    gguf_free(g);
    kvllm_log_set(NULL, NULL);
}

/* ---- random text: never crashes, always roundtrips, detok stays valid ---- */

static void test_random_text(const struct tokenizer *t) {
    /* even iterations: valid UTF-8 from these pieces; odd: arbitrary bytes */
    static const char *chars[] = { " ", " ", "a", "b", "<s>", "\n", "\t", "\\", "\xc3\xa9", "\xe6\x97\xa5",
                                   "\xf0\x9f\xa6\x99", "\xe2\x80\x8d", "\xef\xbf\xbd" };
    struct rng r;
    rng_seed(&r, 1234);
    char text[1024];
    int32_t ids[4096];
    int n_bad = 0;
    for (int iter = 0; iter < 500; iter++) {
        size_t len = 0, want = rng_u64(&r) % 200;
        while (len < want) {
            if (iter % 2) { text[len++] = (char)rng_u64(&r); continue; }
            const char *c = chars[rng_u64(&r) % (sizeof chars / sizeof *chars)];
            memcpy(text + len, c, strlen(c));
            len += strlen(c);
        }
        bool special = iter % 3 == 0;
        int n = tokenizer_encode(t, text, len, iter % 4 == 0, special, ids, 4096);
        CHECK(n >= 0 && n <= 4096);
        if (n < 0 || n > 4096) continue;
        for (int i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < tokenizer_n_vocab(t));
        /* Only valid UTF-8 roundtrips: like llama.cpp, a stray lead byte
         * swallows the next bytes, even an escaped space, into one symbol.
         * A parsed "<s>" decodes to nothing. */
        if (!special && valid_utf8(text, len)) n_bad += !roundtrips(t, ids, n, text, len);
        struct detok d;
        detok_init(&d, t);
        for (int i = 0; i < n; i++) {
            const char *c = detok_push(&d, i ? ids[i - 1] : -1, ids[i]);
            CHECK(c && valid_utf8(c, strlen(c)));
        }
        const char *c = detok_flush(&d);
        CHECK(c && valid_utf8(c, strlen(c)));
        detok_deinit(&d);
    }
    CHECK_MSG(n_bad == 0, "%d random texts do not decode back", n_bad);
}

/* Flipped bytes in a tokenizer.bin give EFORMAT or a vocabulary, never a crash. */
static void test_mutated_llama2c(void) {
    char path[1024];
    tu_shared_path(path, sizeof path, "models/stories260K/tok512.bin");
    size_t len;
    char *data = tu_read_file(path, &len);
    if (!data) return; /* reported by test_bad_llama2c */
    kvllm_log_set(tu_log_capture, NULL);
    struct rng r;
    rng_seed(&r, 99);
    for (int iter = 0; iter < 100; iter++) {
        char *copy = malloc(len);
        memcpy(copy, data, len);
        for (int k = 0; k < 3; k++) copy[rng_u64(&r) % len] = (char)rng_u64(&r);
        int rc = convert_bytes(copy, len, iter % 2 ? -1 : 512);
        CHECK_MSG(rc == 0 || rc == KVLLM_EFORMAT, "mutation %d: rc %d", iter, rc);
        free(copy);
    }
    kvllm_log_set(NULL, NULL);
    free(data);
}

/* ---- speed: merges go through a heap, so this stays linear-ish ---- */

static void test_speed(const struct tokenizer *t) {
    static const char para[] = "The quick brown fox jumps over the lazy dog, and then it naps; "
                               "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac 12345 !? ";
    size_t unit = sizeof para - 1, len = 0;
    char *text = malloc(64 * unit);
    while (len + unit <= 64 * unit) { memcpy(text + len, para, unit); len += unit; }
    int32_t *ids = malloc(len * sizeof *ids);
    double t0 = time_now();
    int reps = 50, n = 0;
    for (int r = 0; r < reps; r++) n = tokenizer_encode(t, text, len, true, false, ids, (int)len);
    double us_per_kb = (time_now() - t0) / reps / ((double)len / 1024) * 1e6;
    printf("encode speed: %zu bytes -> %d ids, %.1f us per KB\n", len, n, us_per_kb);
    CHECK(n > 0 && roundtrips(t, ids, n, text, len));
    /* loose: only an accidental O(n^2) rescan (~100 ms per KB here) should trip it */
    CHECK_MSG(us_per_kb < 10000, "encode takes %.0f us per KB", us_per_kb);
    free(ids);
    free(text);
}

int main(void) {
    test_json_unescape();
    test_llamacpp_vocab("ggml-vocab-llama-spm.gguf");
    test_llamacpp_vocab("ggml-vocab-phi-3.gguf");

    struct tokenizer *l2 = load_llama2c_vocab("tokenizers/llama2/llama2c-tokenizer.bin", 32000);
    if (l2) {
        CHECK(tokenizer_n_vocab(l2) == 32000);
        test_llama2_vectors(l2);
        /* the same Llama 2 vocabulary, so llama.cpp's llama-spm ids must come out too */
        run_llamacpp_cases(l2, "ggml-vocab-llama-spm.gguf", "llama-spm cases with llama2c-tokenizer.bin");
        test_parse_special(l2);
        test_detok(l2);
        test_random_text(l2);
        test_speed(l2);
        tokenizer_free(l2);
    }
    test_tok512();
    test_bad_llama2c();
    test_mutated_llama2c();
    test_bad_gguf();
    return check_report("test_tok_vectors");
}
