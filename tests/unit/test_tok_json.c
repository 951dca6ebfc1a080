/* test_tok_json.c — Hugging Face tokenizer.json -> tokenizer.ggml.* keys ->
 * tokenizer, on two hand-made tokenizers small enough to work out by hand:
 *
 *   byte-level: vocab a b ab Ġ Ġab c, merges "a b", "Ġ ab", ByteLevel
 *     "ab ab c" -> words "ab" " ab" " c" -> ab, Ġab, Ġ c;
 *   SentencePiece-style: Prepend/Replace "▁", BPE with byte_fallback, merges
 *     [▁ a], [a b], [▁a b], BOS by TemplateProcessing
 *     "ab c" -> "▁ab▁c" -> <s> ▁ab ▁ <0x63>  (the first merge wins over [a b]).
 *
 * Also: the same ids after writing tokenizer.json back (hf_tokenizer_write)
 * and reading it again; every prefix of the files (truncated JSON) and a
 * few broken variants are refused with an error code, never a crash (the
 * ASan build runs this too). */
#include "check.h"
#include "kvllm.h"
#include "load/gguf.h"
#include "load/hf.h"
#include "tok/tokenizer.h"

#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char BYTE_LEVEL[] =
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":6,\"content\":\"<|end|>\",\"special\":true}],"
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
    "\"post_processor\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\xc4\xa0\":3,\"\xc4\xa0" "ab\":4,\"c\":5},"
    "\"merges\":[\"a b\",[\"\xc4\xa0\",\"ab\"]]}}";

static const char SPM[] =
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
    "{\"id\":1,\"content\":\"<s>\",\"special\":true},{\"id\":2,\"content\":\"</s>\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xe2\x96\x81\"}]},\"pre_tokenizer\":null,"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],"
    "\"tokens\":[\"<s>\"]}}},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"vocab\":{\"<unk>\":0,\"<s>\":1,"
    "\"</s>\":2,\"\xe2\x96\x81\":3,\"a\":4,\"b\":5,\"\xe2\x96\x81" "a\":6,\"ab\":7,\"\xe2\x96\x81" "ab\":8,"
    "\"<0x63>\":9},\"merges\":[[\"\xe2\x96\x81\",\"a\"],[\"a\",\"b\"],[\"\xe2\x96\x81" "a\",\"b\"]]}}";

static char g_dir[] = "/tmp/kvllm-test-tok-json-XXXXXX";

static void quiet(enum kvllm_log_level level, const char *msg, void *user) { (void)level, (void)msg, (void)user; }

static void write_file(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(data, 1, n, f) == n);
    fclose(f);
}

/* Read tokenizer.json bytes into a tokenizer; NULL (and the code) on error. */
static struct tokenizer *load_bytes(const char *data, size_t n, int *rc_out) {
    char path[256];
    snprintf(path, sizeof path, "%s/t.json", g_dir);
    write_file(path, data, n);
    struct gguf *g = gguf_new(path);
    int rc = g ? hf_tokenizer_read(path, NULL, g) : KVLLM_ENOMEM;
    struct tokenizer *t = NULL;
    if (rc == 0) rc = tokenizer_new(g, &t);
    gguf_free(g);
    if (rc_out) *rc_out = rc;
    return t;
}

static void check_encode(const struct tokenizer *t, const char *text, bool bos, const int32_t *want, int n_want) {
    int32_t ids[64];
    int n = tokenizer_encode(t, text, strlen(text), bos, false, ids, 64);
    CHECK_MSG(n == n_want, "'%s': %d ids, want %d", text, n, n_want);
    for (int i = 0; i < n && i < n_want; i++) CHECK_MSG(ids[i] == want[i], "'%s' [%d]: %d, want %d", text, i, ids[i], want[i]);
    char buf[256];
    int len = tokenizer_decode(t, ids, n, buf, sizeof buf);
    CHECK_MSG(len == (int)strlen(text) && !memcmp(buf, text, (size_t)len), "'%s' decodes to '%.*s'", text,
              len > 0 ? len : 0, buf);
}

static void test_byte_level(void) {
    int rc;
    struct tokenizer *t = load_bytes(BYTE_LEVEL, sizeof BYTE_LEVEL - 1, &rc);
    CHECK_MSG(t != NULL, "rc %d", rc);
    if (!t) return;
    check_encode(t, "ab ab c", true, (const int32_t[]){ 2, 4, 3, 5 }, 4);
    CHECK(tokenizer_type(t, 6) == TOK_CONTROL);
    CHECK(!tokenizer_add_bos(t));
    tokenizer_free(t);
}

static void test_spm_and_rewrite(void) {
    int rc;
    struct tokenizer *t = load_bytes(SPM, sizeof SPM - 1, &rc);
    CHECK_MSG(t != NULL, "rc %d", rc);
    if (!t) return;
    static const int32_t want[] = { 1, 8, 3, 9 };
    check_encode(t, "ab c", false, want + 1, 3);
    int32_t ids[8];
    CHECK(tokenizer_encode(t, "ab c", 4, true, false, ids, 8) == 4 && !memcmp(ids, want, sizeof want));
    CHECK(tokenizer_type(t, 9) == TOK_BYTE && tokenizer_type(t, 0) == TOK_UNKNOWN && tokenizer_bos(t) == 1);
    tokenizer_free(t);

    /* write it back from the keys and read that again: same ids */
    char path[256];
    snprintf(path, sizeof path, "%s/t.json", g_dir);
    write_file(path, SPM, sizeof SPM - 1);
    struct gguf *g = gguf_new(path), *g2 = NULL;
    CHECK(g && hf_tokenizer_read(path, NULL, g) == 0);
    char out[256];
    snprintf(out, sizeof out, "%s/out", g_dir);
    CHECK(mkdir(out, 0777) == 0);
    CHECK(g && hf_tokenizer_write(g, out) == 0);
    CHECK(hf_vocab_open(out, &g2) == 0);
    struct tokenizer *t2 = NULL;
    CHECK(g2 && tokenizer_new(g2, &t2) == 0);
    if (t2) {
        CHECK(tokenizer_encode(t2, "ab c", 4, true, false, ids, 8) == 4 && !memcmp(ids, want, sizeof want));
        check_encode(t2, "ab c", false, want + 1, 3);
    }
    tokenizer_free(t2);
    gguf_free(g2);
    gguf_free(g);
    char f[300];
    snprintf(f, sizeof f, "%s/tokenizer.json", out), unlink(f);
    snprintf(f, sizeof f, "%s/tokenizer_config.json", out), unlink(f);
    rmdir(out);
}

/* Every proper prefix is malformed JSON: an error, never a crash. */
static void test_truncated(const char *data, size_t n) {
    int refused = 0;
    for (size_t k = 0; k < n; k++) {
        int rc = 0;
        struct tokenizer *t = load_bytes(data, k, &rc);
        refused += t == NULL && rc < 0;
        tokenizer_free(t);
    }
    CHECK_MSG(refused == (int)n, "%d of %zu prefixes refused", refused, n);
}

/* Replace the first occurrence of from by to; each variant must be refused. */
static void test_variant(const char *base, const char *from, const char *to) {
    char buf[4096];
    const char *at = strstr(base, from);
    CHECK_MSG(at != NULL, "'%s' not in the base file", from);
    if (!at) return;
    size_t pre = (size_t)(at - base);
    int n = snprintf(buf, sizeof buf, "%.*s%s%s", (int)pre, base, to, at + strlen(from));
    int rc = 0;
    struct tokenizer *t = load_bytes(buf, (size_t)n, &rc);
    CHECK_MSG(t == NULL && rc < 0, "'%s' -> '%s' was accepted", from, to);
    tokenizer_free(t);
}

int main(void) {
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    test_byte_level();
    test_spm_and_rewrite();
    kvllm_log_set(quiet, NULL); /* the refusals below each log one line */
    test_truncated(BYTE_LEVEL, sizeof BYTE_LEVEL - 1);
    test_truncated(SPM, sizeof SPM - 1);
    test_variant(BYTE_LEVEL, "\"a b\"", "\"a c d\"");            /* not two pieces */
    test_variant(BYTE_LEVEL, "\"a b\"", "\"a x\"");              /* x not in the vocabulary */
    test_variant(BYTE_LEVEL, "\"a b\"", "[\"a\"]");              /* a pair of one */
    test_variant(BYTE_LEVEL, "\"ByteLevel\",\"add_prefix_space\"", "\"BertPreTokenizer\",\"x\"");
    test_variant(BYTE_LEVEL, "\"c\":5", "\"c\":-5");
    test_variant(BYTE_LEVEL, "\"c\":5", "\"c\":1e3");
    test_variant(BYTE_LEVEL, "\"c\":5", "\"c\":4");              /* two pieces, one id */
    test_variant(BYTE_LEVEL, "\"BPE\"", "\"WordPiece\"");
    test_variant(BYTE_LEVEL, "\"vocab\":{", "\"vocab\":{\"zz\":999999999,");
    test_variant(BYTE_LEVEL, "\"model\":{", "\"model\":7,\"x\":{");
    test_variant(SPM, "\"ids\":[1]", "\"ids\":[77]");            /* BOS out of range */
    test_variant(SPM, "\"unk_token\":\"<unk>\"", "\"unk_token\":\"<nope>\"");
    test_variant(SPM, "{\"type\":\"Prepend\"", "{\"type\":\"Lowercase\"");
    test_variant(SPM, "\"content\":\"<s>\"", "\"content\":5");
    kvllm_log_set(NULL, NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/t.json", g_dir);
    unlink(path);
    rmdir(g_dir);
    return check_report("test_tok_json");
}
