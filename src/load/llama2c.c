/* llama2c.c — llama2.c checkpoints (legacy version 0: a 7-int32 header, then
 * f32 arrays in a fixed order) described as an in-memory GGUF with llama
 * keys and GGUF tensor names.  llama2.c rotates adjacent pairs, the layout
 * GGUF llama uses, so Q/K rows are taken as they are. */
#include "load/llama2c.h"
#include "load/hf.h"
#include "tensor/dtype.h"

#include <stdio.h>
#include <string.h>

struct l2c_header { int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; };

/* Validate the header against the file size; returns the f32 count of the
 * weights (incl. the unshared classifier) or 0 when implausible. */
static uint64_t expected_floats(const struct l2c_header *h, bool *shared) {
    if (h->dim <= 0 || h->hidden_dim <= 0 || h->n_layers <= 0 || h->n_heads <= 0 || h->n_kv_heads <= 0 ||
        h->seq_len <= 0 || h->vocab_size == 0 || h->vocab_size == INT32_MIN)
        return 0;
    if (h->dim % h->n_heads || h->n_heads % h->n_kv_heads || (h->dim / h->n_heads) % 2) return 0;
    *shared = h->vocab_size > 0;
    uint64_t V = (uint64_t)(h->vocab_size > 0 ? h->vocab_size : -(int64_t)h->vocab_size);
    uint64_t D = (uint64_t)h->dim, F = (uint64_t)h->hidden_dim, L = (uint64_t)h->n_layers;
    uint64_t hs = D / (uint64_t)h->n_heads, KV = hs * (uint64_t)h->n_kv_heads, S = (uint64_t)h->seq_len;
    /* every product below is < 2^31 * 2^31 * 2^31 at worst: guard with checked math */
    uint64_t per_layer = 0, t, total = 0;
    bool ok = ckd_mul_u64(&t, D, 2) && ckd_add_u64(&per_layer, per_layer, t);            /* rms_att, rms_ffn */
    ok = ok && ckd_mul_u64(&t, D, D) && ckd_mul_u64(&t, t, 2) && ckd_add_u64(&per_layer, per_layer, t); /* wq, wo */
    ok = ok && ckd_mul_u64(&t, D, KV) && ckd_mul_u64(&t, t, 2) && ckd_add_u64(&per_layer, per_layer, t); /* wk, wv */
    ok = ok && ckd_mul_u64(&t, D, F) && ckd_mul_u64(&t, t, 3) && ckd_add_u64(&per_layer, per_layer, t); /* w1-3 */
    ok = ok && ckd_mul_u64(&total, per_layer, L);
    ok = ok && ckd_mul_u64(&t, V, D) && ckd_add_u64(&total, total, t);                     /* embedding */
    ok = ok && ckd_add_u64(&total, total, D);                                               /* rms_final */
    ok = ok && ckd_mul_u64(&t, S, hs) && ckd_add_u64(&total, total, t);                    /* freq_cis re+im */
    if (!*shared) ok = ok && ckd_mul_u64(&t, V, D) && ckd_add_u64(&total, total, t);       /* wcls */
    return ok ? total : 0;
}

static bool read_header(const uint8_t *p, size_t size, struct l2c_header *h, uint64_t *n_floats, bool *shared) {
    if (size < sizeof *h) return false;
    memcpy(h, p, sizeof *h);
    *n_floats = expected_floats(h, shared);
    return *n_floats != 0;
}

/* Bytes a checkpoint with this header must have; false on overflow. */
static bool expected_bytes(uint64_t n_floats, uint64_t *bytes) {
    return ckd_mul_u64(bytes, n_floats, 4) && ckd_add_u64(bytes, *bytes, sizeof(struct l2c_header));
}

bool llama2c_is_checkpoint(const char *path) {
    /* a silent probe: the caller reports unreadable files itself */
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    uint8_t buf[sizeof(struct l2c_header)];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    struct l2c_header h;
    uint64_t n_floats;
    bool shared;
    return read_header(buf, n, &h, &n_floats, &shared);
}

int llama2c_open(const char *path, struct gguf **out) {
    *out = NULL;
    struct gguf *g = gguf_new(path);
    if (!g) return KVLLM_ENOMEM;
    int rc = file_map_open(&g->map, path);
    if (rc) { gguf_free(g); return rc; }
    struct l2c_header h;
    uint64_t n_floats;
    bool shared;
    uint64_t want;
    if (!read_header(g->map.data, g->map.size, &h, &n_floats, &shared) || !expected_bytes(n_floats, &want)) {
        LOG_ERR("%s: not a valid llama2.c checkpoint (implausible header)", path);
        gguf_free(g);
        return KVLLM_EFORMAT;
    }
    if (want != g->map.size) {
        LOG_ERR("%s: llama2.c checkpoint (dim %d, %d layers, vocab %d) should be %llu bytes but the file has %zu%s",
                path, h.dim, h.n_layers, h.vocab_size, (unsigned long long)want, g->map.size,
                want > g->map.size ? " (truncated)" : "");
        gguf_free(g);
        return KVLLM_EFORMAT;
    }
    const int64_t D = h.dim, F = h.hidden_dim, V = h.vocab_size > 0 ? h.vocab_size : -(int64_t)h.vocab_size;
    const int64_t hs = D / h.n_heads, KV = hs * h.n_kv_heads;
    const char *base = strrchr(path, '/');
    rc = gguf_set_str(g, "general.architecture", "llama");
    if (!rc) rc = gguf_set_str(g, "general.name", base ? base + 1 : path);
    if (!rc) rc = gguf_set_u32(g, "general.file_type", 0); /* all F32 */
    if (!rc) rc = gguf_set_u32(g, "llama.context_length", (uint32_t)h.seq_len);
    if (!rc) rc = gguf_set_u32(g, "llama.embedding_length", (uint32_t)D);
    if (!rc) rc = gguf_set_u32(g, "llama.block_count", (uint32_t)h.n_layers);
    if (!rc) rc = gguf_set_u32(g, "llama.feed_forward_length", (uint32_t)F);
    if (!rc) rc = gguf_set_u32(g, "llama.attention.head_count", (uint32_t)h.n_heads);
    if (!rc) rc = gguf_set_u32(g, "llama.attention.head_count_kv", (uint32_t)h.n_kv_heads);
    if (!rc) rc = gguf_set_u32(g, "llama.rope.dimension_count", (uint32_t)hs);
    if (!rc) rc = gguf_set_f32(g, "llama.rope.freq_base", 10000.0f);
    if (!rc) rc = gguf_set_f32(g, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (!rc) rc = gguf_set_u32(g, "llama.vocab_size", (uint32_t)V);

    /* Walk the arrays in file order; per-layer arrays are (L, rows, cols). */
    const float *p = (const float *)(g->map.data + sizeof h);
    const float *emb = p; p += V * D;
    const float *rms_att = p; p += h.n_layers * D;
    const float *wq = p; p += h.n_layers * D * D;
    const float *wk = p; p += h.n_layers * KV * D;
    const float *wv = p; p += h.n_layers * KV * D;
    const float *wo = p; p += h.n_layers * D * D;
    const float *rms_ffn = p; p += h.n_layers * D;
    const float *w1 = p; p += h.n_layers * F * D;
    const float *w2 = p; p += h.n_layers * D * F;
    const float *w3 = p; p += h.n_layers * F * D;
    const float *rms_final = p; p += D;
    p += (int64_t)h.seq_len * hs; /* freq_cis_real, freq_cis_imag: recomputed, not stored */
    const float *wcls = shared ? NULL : p;

    int64_t ne[2];
#define ADD(name, cols, rows, data) do { ne[0] = (cols); ne[1] = (rows); \
        if (!rc) rc = gguf_add_tensor(g, (name), DTYPE_F32, (rows) ? 2 : 1, ne, (data)); } while (0)
    ADD("token_embd.weight", D, V, emb);
    for (int il = 0; il < h.n_layers; il++) {
        char n[64];
#define LAYER(suffix, cols, rows, base_ptr) do { snprintf(n, sizeof n, "blk.%d." suffix ".weight", il); \
        ADD(n, cols, rows, (base_ptr) + (int64_t)il * (cols) * ((rows) ? (rows) : 1)); } while (0)
        LAYER("attn_norm", D, 0, rms_att);
        LAYER("attn_q", D, D, wq);
        LAYER("attn_k", D, KV, wk);
        LAYER("attn_v", D, KV, wv);
        LAYER("attn_output", D, D, wo);
        LAYER("ffn_norm", D, 0, rms_ffn);
        LAYER("ffn_gate", D, F, w1);
        LAYER("ffn_down", F, D, w2);
        LAYER("ffn_up", D, F, w3);
#undef LAYER
    }
    ADD("output_norm.weight", D, 0, rms_final);
    if (wcls) ADD("output.weight", D, V, wcls);
#undef ADD
    if (rc) { gguf_free(g); return rc; }
    *out = g;
    return 0;
}

int vocab_file_open(const char *path, int n_vocab, struct gguf **out) {
    *out = NULL;
    if (gguf_is_gguf(path)) return gguf_open(path, out);
    if (hf_is_folder(path) || hf_is_tokenizer_json(path)) return hf_vocab_open(path, out);
    struct gguf *g = gguf_new(path);
    if (!g) return KVLLM_ENOMEM;
    int rc = llama2c_vocab_to_gguf(path, n_vocab, g);
    if (rc) { gguf_free(g); return rc; }
    *out = g;
    return 0;
}
