/* fuzz_gguf — the GGUF reader over arbitrary bytes: gguf_open (every
 * offset, count and shape product checked), every key read back through
 * the typed getters, and a tokenizer built from whatever vocabulary keys
 * it holds. */
#include "fuzz_util.h"
#include "load/gguf.h"
#include "tok/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    char path[512];
    fuzz_write("in.gguf", data, size, path, sizeof path);
    struct gguf *g = NULL;
    if (gguf_open(path, &g) == 0) {
        for (uint64_t i = 0; i < g->n_kv; i++) {
            const struct gguf_kv *kv = &g->kv[i];
            if (kv->type == GGUF_T_ARRAY && kv->v.arr.type != GGUF_T_STRING && kv->v.arr.type != GGUF_T_ARRAY)
                for (uint64_t j = 0; j < kv->v.arr.n && j < 16; j++) {
                    (void)gguf_arr_i64(kv, j);
                    (void)gguf_arr_f64(kv, j);
                }
        }
        struct tokenizer *t = NULL;
        if (tokenizer_new(g, &t) == 0) {
            int32_t ids[64];
            const char *text = "Hello world! <s> 123 \xe4\xbd\xa0\xe5\xa5\xbd";
            int n = tokenizer_encode(t, text, strlen(text), true, true, ids, 64);
            char buf[512];
            if (n > 0) (void)tokenizer_decode(t, ids, n < 64 ? n : 64, buf, sizeof buf);
            tokenizer_free(t);
        }
        gguf_free(g);
    }
    fuzz_unlink("in.gguf");
    return 0;
}
