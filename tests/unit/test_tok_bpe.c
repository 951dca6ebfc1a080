/* test_tok_bpe.c — byte-level BPE against reference ids.
 *
 * Golden data (tests/data, or $KVLLM_SHARED: tests/data/README.md):
 *   - llama.cpp's vocab-only GGUFs gpt-2, falcon, deepseek-coder and
 *     starcoder with their .inp/.out strings and ids (no BOS, no special
 *     parsing);
 *   - llama-bpe .inp/.out and llama3_encode_vectors.txt with the Llama 3
 *     vocab.json + merges (llama3-bpe/), pre-tokenizer llama-bpe, plus
 *     <|begin_of_text|>=128000 and <|end_of_text|>=128001;
 *   - gpt2_encode_vectors.txt with GPT-2's vocab.json + merges (gpt2/).
 * Every case must match exactly and decode back to its input; the GPT-2
 * vocabulary from its GGUF and from its files must give the same ids.
 * Missing files are failures, never skips. */
#include "check.h"
#include "io_util.h"
#include "kvllm.h"
#include "load/gguf.h"
#include "tok/bpe.h"
#include "tok/tokenizer.h"
#include "tok/unicode.h"

#include <stdint.h>
#include <string.h>

#define MAX_IDS 65536

static int32_t ids_buf[MAX_IDS], want_buf[MAX_IDS];
static char dec_buf[1 << 20];

/* Encode text, compare with want, check the round trip.  true when all match. */
static bool check_case(const struct tokenizer *t, const char *what, const char *text, size_t len,
                       const int32_t *want, int n_want, bool parse_special, bool roundtrip) {
    int n = tokenizer_encode(t, text, len, false, parse_special, ids_buf, MAX_IDS);
    bool ok = n == n_want && memcmp(ids_buf, want, (size_t)n * sizeof *want) == 0;
    CHECK_MSG(ok, "%s: '%.*s': got %d ids, want %d", what, len > 60 ? 60 : (int)len, text, n, n_want);
    if (!ok) {
        fprintf(stderr, "  got: ");
        for (int i = 0; i < n && i < 40; i++) fprintf(stderr, "%d ", ids_buf[i]);
        fprintf(stderr, "\n  want:");
        for (int i = 0; i < n_want && i < 40; i++) fprintf(stderr, " %d", want[i]);
        fputc('\n', stderr);
    }
    if (roundtrip && n >= 0) {
        int d = tokenizer_decode(t, ids_buf, n, dec_buf, sizeof dec_buf);
        bool rt = d == (int)len && memcmp(dec_buf, text, len) == 0;
        CHECK_MSG(rt, "%s: decode(encode('%.*s')) differs", what, len > 60 ? 60 : (int)len, text);
        ok = ok && rt;
    }
    return ok;
}

/* ---- .inp / .out ---- */

static const char SEP[] = "\n__ggml_vocab_test__\n";

static void run_inp_out(const struct tokenizer *t, const char *name, const char *inp_rel,
                        const char *out_rel, const struct tokenizer *t2) {
    char p1[1024], p2[1024];
    tu_shared_path(p1, sizeof p1, inp_rel);
    tu_shared_path(p2, sizeof p2, out_rel);
    size_t ni, no;
    char *inp = tu_read_file(p1, &ni), *out = tu_read_file(p2, &no);
    CHECK_MSG(inp && out, "%s: cannot read %s / %s", name, p1, p2);
    if (!inp || !out) { free(inp); free(out); return; }
    int n_case = 0, n_ok = 0, n_same = 0;
    char *pos = inp, *line = out;
    char *hit;
    while ((hit = strstr(pos, SEP)) != NULL) {
        size_t len = (size_t)(hit - pos);
        char *nl = strchr(line, '\n');
        if (!nl) { CHECK_MSG(0, "%s: .out has fewer lines than .inp has cases", name); break; }
        *nl = 0;
        int n_want = tu_parse_ids(line, want_buf, MAX_IDS);
        n_case++;
        if (check_case(t, name, pos, len, want_buf, n_want, false, true)) n_ok++;
        if (t2) {
            int n1 = tokenizer_encode(t, pos, len, false, false, ids_buf, MAX_IDS);
            static int32_t other[MAX_IDS];
            int n2 = tokenizer_encode(t2, pos, len, false, false, other, MAX_IDS);
            bool same = n1 == n2 && n1 >= 0 && memcmp(ids_buf, other, (size_t)n1 * sizeof *other) == 0;
            CHECK_MSG(same, "%s: GGUF and vocab.json/merges.txt differ on '%.*s'", name,
                      len > 60 ? 60 : (int)len, pos);
            n_same += same;
        }
        pos = hit + strlen(SEP);
        line = nl + 1;
    }
    printf("%s: %d/%d cases match", name, n_ok, n_case);
    if (t2) printf(", %d/%d identical from vocab.json + merges.txt", n_same, n_case);
    putchar('\n');
    CHECK(n_case > 0);
    free(inp);
    free(out);
}

/* ---- *_encode_vectors.txt: PROMPT "escaped" / IDS a b c ---- */

/* Unescape a C-style quoted string starting after the opening quote. */
static size_t unescape(const char *s, char *out) {
    size_t n = 0;
    for (; *s && *s != '"'; s++) {
        if (*s != '\\') { out[n++] = *s; continue; }
        s++;
        switch (*s) {
        case 'n': out[n++] = '\n'; break;
        case 't': out[n++] = '\t'; break;
        case 'r': out[n++] = '\r'; break;
        case '0': out[n++] = 0; break;
        case 'x': {
            unsigned v = 0;
            for (int k = 0; k < 2 && s[1]; k++) { s++; v = v * 16 + (unsigned)(*s <= '9' ? *s - '0' : (*s | 32) - 'a' + 10); }
            out[n++] = (char)v;
            break;
        }
        default: out[n++] = *s; break;
        }
    }
    return n;
}

static void run_vectors(const struct tokenizer *t, const char *name, const char *rel, bool parse_special) {
    char p[1024];
    tu_shared_path(p, sizeof p, rel);
    size_t n;
    char *buf = tu_read_file(p, &n);
    CHECK_MSG(buf, "%s: cannot read %s", name, p);
    if (!buf) return;
    static char text[1 << 16];
    size_t text_len = 0;
    bool have = false;
    int n_case = 0, n_ok = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "PROMPT \"", 8) == 0) {
            text_len = unescape(line + 8, text);
            have = true;
        } else if (strncmp(line, "IDS", 3) == 0 && have) {
            int n_want = tu_parse_ids(line + 3, want_buf, MAX_IDS);
            n_case++;
            /* special-token text decodes to nothing: no round trip then */
            bool rt = !parse_special || !memchr(text, '<', text_len);
            n_ok += check_case(t, name, text, text_len, want_buf, n_want, parse_special, rt);
            have = false;
        }
    }
    printf("%s: %d/%d cases match\n", name, n_ok, n_case);
    CHECK(n_case > 0);
    free(buf);
}

/* ---- loading ---- */

static struct tokenizer *from_gguf(const char *rel) {
    char p[1024];
    tu_shared_path(p, sizeof p, rel);
    struct gguf *g = NULL;
    struct tokenizer *t = NULL;
    int rc = gguf_open(p, &g);
    if (rc == 0) rc = tokenizer_new(g, &t);
    gguf_free(g);
    CHECK_MSG(rc == 0, "cannot load %s (%d)", p, rc);
    return t;
}

static struct tokenizer *from_files(const char *dir, const char *pre, const struct bpe_special *sp, int n_sp) {
    char pv[1024], pm[1024], rel[512];
    snprintf(rel, sizeof rel, "%s/encoder.json", dir);
    tu_shared_path(pv, sizeof pv, rel);
    snprintf(rel, sizeof rel, "%s/vocab.bpe", dir);
    tu_shared_path(pm, sizeof pm, rel);
    struct gguf *g = NULL;
    struct tokenizer *t = NULL;
    int rc = bpe_files_to_gguf(pv, pm, pre, sp, n_sp, &g);
    if (rc == 0) rc = tokenizer_new(g, &t);
    gguf_free(g);
    CHECK_MSG(rc == 0, "cannot load %s + %s (%d)", pv, pm, rc);
    return t;
}

/* ---- small facts ---- */

static void test_byte_map(void) {
    char u[2];
    CHECK(unicode_byte_to_utf8(' ', u) == 2 && (uint8_t)u[0] == 0xc4 && (uint8_t)u[1] == 0xa0); /* Ġ */
    CHECK(unicode_byte_to_utf8('\n', u) == 2 && (uint8_t)u[0] == 0xc4 && (uint8_t)u[1] == 0x8a); /* Ċ */
    CHECK(unicode_byte_to_utf8('a', u) == 1 && u[0] == 'a');
    for (int b = 0; b < 256; b++) {
        int n = unicode_byte_to_utf8((uint8_t)b, u);
        size_t len;
        CHECK(unicode_utf8_to_byte(u, (size_t)n, &len) == b && len == (size_t)n);
    }
    size_t len;
    CHECK(unicode_utf8_to_byte("\xe2\x96\x81", 3, &len) == -1 && len == 3);
}

static void test_unknown_pre(void) {
    kvllm_log_set(tu_log_capture, NULL);
    struct gguf *g = gguf_new("unknown-pre");
    struct gguf_str tok[2] = { { "a", 1 }, { "b", 1 } }, merges[1] = { { "a b", 3 } };
    CHECK(g && gguf_set_str(g, "tokenizer.ggml.model", "gpt2") == 0);
    CHECK(gguf_set_str(g, "tokenizer.ggml.pre", "no-such-pre") == 0);
    CHECK(gguf_set_arr_str(g, "tokenizer.ggml.tokens", tok, 2) == 0);
    CHECK(gguf_set_arr_str(g, "tokenizer.ggml.merges", merges, 1) == 0);
    struct tokenizer *t = NULL;
    CHECK(tokenizer_new(g, &t) == KVLLM_EUNSUPPORTED && t == NULL);
    CHECK_MSG(strstr(tu_log.last, "'no-such-pre'") && strstr(tu_log.last, "unknown-pre"), "got: %s", tu_log.last);
    gguf_free(g);
    kvllm_log_set(NULL, NULL);
}

/* Streaming decode hands out whole characters even when an emoji is split
 * across tokens; random text round-trips (arbitrary bytes, invalid UTF-8
 * too, when the vocabulary has a token for every byte). */
static void test_detok_and_bytes(const struct tokenizer *t, const char *name, bool all_bytes) {
    static const char text[] = "hello \xf0\x9f\x91\x8b world \xf0\x9f\x8c\x8d caf\xc3\xa9";
    int n = tokenizer_encode(t, text, strlen(text), false, false, ids_buf, MAX_IDS);
    CHECK(n > 0);
    struct detok d;
    detok_init(&d, t);
    char got[256] = "";
    for (int i = 0; i < n; i++) {
        const char *s = detok_push(&d, i ? ids_buf[i - 1] : -1, ids_buf[i]);
        CHECK(s != NULL);
        if (s) strncat(got, s, sizeof got - strlen(got) - 1);
    }
    const char *rest = detok_flush(&d);
    if (rest) strncat(got, rest, sizeof got - strlen(got) - 1);
    CHECK_MSG(strcmp(got, text) == 0, "%s: streamed '%s'", name, got);
    detok_deinit(&d);

    static char bytes[4096];
    uint32_t x = 12345;
    int bad = 0;
    for (int round = 0; round < 50; round++) {
        size_t len = 0, want = 1 + (size_t)round * 40;
        while (len < want) {
            x = x * 1103515245u + 12345u;
            uint32_t r = x >> 8;
            if (round % 3 == 0) { bytes[len++] = " aZ9'\n\t.,\xc3\xa9"[r % 12]; continue; }
            if (round % 3 == 1 && all_bytes) { bytes[len++] = (char)r; continue; }
            /* any valid code point (vocabularies may lack bytes no UTF-8 has) */
            uint32_t cp = r % (all_bytes ? 0x110000u : 0x40000u); /* some lack lead byte 0xF1 */
            if ((cp >= 0xd800 && cp < 0xe000) || (!all_bytes && cp < 0x20)) continue; /* falcon lacks some controls */
            if (cp < 0x80) bytes[len++] = (char)cp;
            else if (cp < 0x800) { bytes[len++] = (char)(0xc0 | cp >> 6); bytes[len++] = (char)(0x80 | (cp & 63)); }
            else if (cp < 0x10000) {
                bytes[len++] = (char)(0xe0 | cp >> 12);
                bytes[len++] = (char)(0x80 | ((cp >> 6) & 63));
                bytes[len++] = (char)(0x80 | (cp & 63));
            } else {
                bytes[len++] = (char)(0xf0 | cp >> 18);
                bytes[len++] = (char)(0x80 | ((cp >> 12) & 63));
                bytes[len++] = (char)(0x80 | ((cp >> 6) & 63));
                bytes[len++] = (char)(0x80 | (cp & 63));
            }
        }
        int k = tokenizer_encode(t, bytes, len, false, false, ids_buf, MAX_IDS);
        int dl = k >= 0 ? tokenizer_decode(t, ids_buf, k, dec_buf, sizeof dec_buf) : -1;
        bad += !(dl == (int)len && memcmp(dec_buf, bytes, len) == 0);
    }
    CHECK_MSG(bad == 0, "%s: %d random byte strings do not round-trip", name, bad);
}

int main(void) {
    test_byte_map();
    test_unknown_pre();

    struct tokenizer *gpt2_files = from_files("tokenizers/gpt2", "gpt-2", NULL, 0);
    static const char *vocabs[] = { "gpt-2", "falcon", "deepseek-coder", "starcoder" };
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) {
        char g[256], inp[300], out[300];
        snprintf(g, sizeof g, "tokenizers/llamacpp-vocab/ggml-vocab-%s.gguf", vocabs[i]);
        snprintf(inp, sizeof inp, "%s.inp", g);
        snprintf(out, sizeof out, "%s.out", g);
        struct tokenizer *t = from_gguf(g);
        if (!t) continue;
        if (i == 0) CHECK(!tokenizer_add_bos(t)); /* GPT-2 adds no BOS */
        run_inp_out(t, vocabs[i], inp, out, i == 0 ? gpt2_files : NULL);
        test_detok_and_bytes(t, vocabs[i], i == 0);
        tokenizer_free(t);
    }
    if (gpt2_files) run_vectors(gpt2_files, "gpt2_encode_vectors", "tokenizers/gpt2_encode_vectors.txt", false);
    tokenizer_free(gpt2_files);

    static const struct bpe_special l3[] = { { "<|begin_of_text|>", 128000 }, { "<|end_of_text|>", 128001 } };
    struct tokenizer *llama3 = from_files("tokenizers/llama3-bpe", "llama-bpe", l3, 2);
    if (llama3) {
        CHECK(tokenizer_bos(llama3) == 128000 && tokenizer_eos(llama3) == 128001);
        run_inp_out(llama3, "llama-bpe", "tokenizers/llamacpp-vocab/ggml-vocab-llama-bpe.gguf.inp",
                    "tokenizers/llamacpp-vocab/ggml-vocab-llama-bpe.gguf.out", NULL);
        run_vectors(llama3, "llama3_encode_vectors", "tokenizers/llama3_encode_vectors.txt", true);
        test_detok_and_bytes(llama3, "llama-bpe", true);
    }
    tokenizer_free(llama3);
    return check_report("test_tok_bpe");
}
