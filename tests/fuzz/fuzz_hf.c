/* fuzz_hf — a Hugging Face folder: the input is config.json, the
 * separator line, then model.safetensors; both are written into the
 * target's temporary folder and read by hf_open (which builds the
 * in-memory GGUF, permuting Q/K rows).  The safetensors part alone also
 * goes through st_parse, the header parser, so its checks are reached even
 * when config.json is rejected. */
#include "fuzz_util.h"
#include "load/hf.h"
#include "load/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    size_t n1, n2;
    const uint8_t *p2;
    fuzz_split(data, size, &n1, &p2, &n2);

    struct st_file f;
    memset(&f, 0, sizeof f);
    if (st_parse("model.safetensors", p2, n2, &f) == 0) st_file_deinit(&f);

    char cfg[512], st[512];
    fuzz_write("config.json", data, n1, cfg, sizeof cfg);
    fuzz_write("model.safetensors", p2, n2, st, sizeof st);
    struct gguf *g = NULL;
    if (hf_open(fuzz_dir(), &g) == 0) gguf_free(g);
    fuzz_unlink("config.json");
    fuzz_unlink("model.safetensors");
    return 0;
}
