/* fuzz_tokenizer_json — a tokenizer.json (hf_vocab_open: json-c, then the
 * model / normalizer / pre-tokenizer / decoder checks into tokenizer.ggml.*
 * keys), the tokenizer built from it (vocabulary, merges, PCRE2 patterns),
 * and a text (after the separator line; a fixed one when there is none)
 * encoded with special tokens parsed and decoded back. */
#include "fuzz_util.h"
#include "load/hf.h"
#include "tok/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    size_t n1, n2;
    const uint8_t *p2;
    fuzz_split(data, size, &n1, &p2, &n2);
    char path[512];
    fuzz_write("tokenizer.json", data, n1, path, sizeof path);
    struct gguf *g = NULL;
    if (hf_vocab_open(path, &g) == 0) {
        struct tokenizer *t = NULL;
        if (tokenizer_new(g, &t) == 0) {
            static const char fixed[] = "Hello, world! <|im_start|>user\n  \xe4\xbd\xa0\xe5\xa5\xbd 12345 don't\t\xf0\x9f\x98\x80";
            const char *text = n2 ? (const char *)p2 : fixed;
            const size_t len = n2 ? n2 : sizeof fixed - 1;
            int32_t ids[256];
            const int n = tokenizer_encode(t, text, len, true, true, ids, 256);
            if (n > 0) {
                char buf[2048];
                (void)tokenizer_decode(t, ids, n < 256 ? n : 256, buf, sizeof buf);
                struct detok d;
                detok_init(&d, t);
                for (int i = 0; i < n && i < 256; i++) (void)detok_push(&d, i ? ids[i - 1] : -1, ids[i]);
                (void)detok_flush(&d);
                detok_deinit(&d);
            }
            tokenizer_free(t);
        }
        gguf_free(g);
    }
    fuzz_unlink("tokenizer.json");
    return 0;
}
