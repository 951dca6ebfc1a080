/* model.c — loading: file format detection, hyper-parameters from GGUF
 * `<arch>.*` keys, and weight tensors checked for presence, shape and type
 * before any pointer is used. */
#include "model/model.h"
#include "load/hf.h"
#include "load/llama2c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct loader { struct model *m; const char *path; uint64_t type_bytes[DTYPE_COUNT_]; };

static int need_u32(struct loader *L, const char *key, int lo, int hi, int *out) {
    uint32_t v;
    int rc = gguf_get_u32(L->m->file, key, &v);
    if (rc == KVLLM_ENOTFOUND) { LOG_ERR("%s: missing required key '%s'", L->path, key); return KVLLM_EFORMAT; }
    if (rc) return rc;
    if ((int64_t)v < lo || (int64_t)v > hi) {
        LOG_ERR("%s: key '%s' = %u is out of range [%d, %d]", L->path, key, v, lo, hi);
        return KVLLM_EFORMAT;
    }
    *out = (int)v;
    return 0;
}

static int opt_u32(struct loader *L, const char *key, int lo, int hi, int def, int *out) {
    uint32_t v;
    int rc = gguf_get_u32(L->m->file, key, &v);
    if (rc == KVLLM_ENOTFOUND) { *out = def; return 0; }
    if (rc) return rc;
    if ((int64_t)v < lo || (int64_t)v > hi) {
        LOG_ERR("%s: key '%s' = %u is out of range [%d, %d]", L->path, key, v, lo, hi);
        return KVLLM_EFORMAT;
    }
    *out = (int)v;
    return 0;
}

static int opt_f32(struct loader *L, const char *key, float lo, float hi, float def, float *out) {
    int rc = gguf_get_f32(L->m->file, key, out);
    if (rc == KVLLM_ENOTFOUND) { *out = def; return 0; }
    if (rc) return rc;
    if (!(*out >= lo && *out <= hi)) {
        LOG_ERR("%s: key '%s' = %g is out of range [%g, %g]", L->path, key, *out, lo, hi);
        return KVLLM_EFORMAT;
    }
    return 0;
}

/* Find tensor `name` with shape (rows, cols) (rows 0 for 1-D); f32_only for norms. */
static int get_tensor(struct loader *L, const char *name, int64_t cols, int64_t rows, bool f32_only,
                      bool optional, struct tensor *t) {
    const struct gguf_tensor *g = gguf_find_tensor(L->m->file, name);
    memset(t, 0, sizeof *t);
    if (!g) {
        if (optional) return 0;
        LOG_ERR("%s: missing tensor '%s'", L->path, name);
        return KVLLM_EFORMAT;
    }
    bool shape_ok = g->ne[0] == cols && g->ne[2] == 1 && g->ne[3] == 1 &&
                    (rows ? g->n_dims == 2 && g->ne[1] == rows : g->ne[1] == 1);
    if (!shape_ok) {
        LOG_ERR("%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]", L->path, name,
                (long long)g->ne[0], (long long)g->ne[1], (long long)g->ne[2], (long long)g->ne[3],
                (long long)cols, (long long)(rows ? rows : 1));
        return KVLLM_EFORMAT;
    }
    if (!dtype_supported(g->type) || (f32_only && g->type != DTYPE_F32)) {
        LOG_ERR("%s: tensor '%s' has type %s, which kvllm cannot compute with here%s", L->path, name,
                dtype_name(g->type), f32_only ? " (norm weights must be F32)" : "");
        return KVLLM_EUNSUPPORTED;
    }
    t->type = g->type;
    t->ne0 = cols;
    t->ne1 = rows ? rows : 1;
    t->row_bytes = (size_t)(g->n_bytes / (uint64_t)t->ne1);
    t->data = g->data;
    L->m->n_params += g->n_elems;
    L->m->weight_bytes += g->n_bytes;
    if (g->type < DTYPE_COUNT_) L->type_bytes[g->type] += g->n_bytes;
    return 0;
}

static int load_hparams(struct loader *L) {
    struct model *m = L->m;
    struct model_hparams *hp = &m->hp;
    struct gguf_str arch;
    int rc = gguf_get_str(m->file, "general.architecture", &arch);
    if (rc == KVLLM_ENOTFOUND) { LOG_ERR("%s: missing required key 'general.architecture'", L->path); return KVLLM_EFORMAT; }
    if (rc) return rc;
    if (!gguf_str_eq(arch, "llama")) {
        LOG_ERR("%s: unknown architecture '%.*s' (supported: llama)", L->path, (int)(arch.len > 64 ? 64 : arch.len),
                arch.ptr);
        return KVLLM_EUNSUPPORTED;
    }
    snprintf(m->arch, sizeof m->arch, "llama");
    const int big = 1 << 20;
    if ((rc = need_u32(L, "llama.embedding_length", 1, big, &hp->n_embd)) ||
        (rc = need_u32(L, "llama.block_count", 1, 4096, &hp->n_layer)) ||
        (rc = need_u32(L, "llama.attention.head_count", 1, 4096, &hp->n_head)) ||
        (rc = need_u32(L, "llama.feed_forward_length", 1, 4 * big, &hp->n_ff)) ||
        (rc = need_u32(L, "llama.context_length", 1, 1 << 24, &hp->n_ctx_train)) ||
        (rc = opt_u32(L, "llama.attention.head_count_kv", 1, 4096, hp->n_head, &hp->n_head_kv)))
        return rc;
    if (hp->n_embd % hp->n_head || hp->n_head % hp->n_head_kv) {
        LOG_ERR("%s: n_embd %d, n_head %d, n_head_kv %d: heads must divide n_embd and kv heads must divide heads",
                L->path, hp->n_embd, hp->n_head, hp->n_head_kv);
        return KVLLM_EFORMAT;
    }
    hp->head_dim = hp->n_embd / hp->n_head;
    if ((rc = opt_u32(L, "llama.rope.dimension_count", 0, hp->head_dim, hp->head_dim, &hp->n_rot)) ||
        (rc = opt_f32(L, "llama.rope.freq_base", 1.0f, 1e12f, 10000.0f, &hp->rope_theta)) ||
        (rc = opt_f32(L, "llama.attention.layer_norm_rms_epsilon", 0.0f, 1.0f, 1e-5f, &hp->norm_eps)))
        return rc;
    if (hp->n_rot % 2) { LOG_ERR("%s: llama.rope.dimension_count %d must be even", L->path, hp->n_rot); return KVLLM_EFORMAT; }
    return 0;
}

static int load_tensors(struct loader *L) {
    struct model *m = L->m;
    const struct model_hparams *hp = &m->hp;
    const struct gguf_tensor *emb = gguf_find_tensor(m->file, "token_embd.weight");
    if (!emb) { LOG_ERR("%s: missing tensor 'token_embd.weight'", L->path); return KVLLM_EFORMAT; }
    if (emb->ne[1] < 1 || emb->ne[1] > (1 << 24)) {
        LOG_ERR("%s: token_embd.weight has an absurd vocabulary of %lld rows", L->path, (long long)emb->ne[1]);
        return KVLLM_EFORMAT;
    }
    m->hp.n_vocab = (int)emb->ne[1];
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim, KV = (int64_t)hp->n_head_kv * hp->head_dim;
    int rc;
    if ((rc = get_tensor(L, "token_embd.weight", E, hp->n_vocab, false, false, &m->tok_embd)) ||
        (rc = get_tensor(L, "output_norm.weight", E, 0, true, false, &m->output_norm)) ||
        (rc = get_tensor(L, "output.weight", E, hp->n_vocab, false, true, &m->output)))
        return rc;
    m->tied_output = m->output.data == NULL;
    if (m->tied_output) m->output = m->tok_embd;
    m->layers = xcalloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return KVLLM_ENOMEM;
    for (int il = 0; il < hp->n_layer; il++) {
        struct llama_layer *l = &m->layers[il];
        char n[9][64];
        static const char *suffix[9] = { "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                         "ffn_norm", "ffn_gate", "ffn_up", "ffn_down" };
        for (int i = 0; i < 9; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s.weight", il, suffix[i]);
        if ((rc = get_tensor(L, n[0], E, 0, true, false, &l->attn_norm)) ||
            (rc = get_tensor(L, n[1], E, Q, false, false, &l->wq)) ||
            (rc = get_tensor(L, n[2], E, KV, false, false, &l->wk)) ||
            (rc = get_tensor(L, n[3], E, KV, false, false, &l->wv)) ||
            (rc = get_tensor(L, n[4], Q, E, false, false, &l->wo)) ||
            (rc = get_tensor(L, n[5], E, 0, true, false, &l->ffn_norm)) ||
            (rc = get_tensor(L, n[6], E, hp->n_ff, false, false, &l->ffn_gate)) ||
            (rc = get_tensor(L, n[7], E, hp->n_ff, false, false, &l->ffn_up)) ||
            (rc = get_tensor(L, n[8], hp->n_ff, E, false, false, &l->ffn_down)))
            return rc;
    }
    return 0;
}

int model_load(const char *path, const char *cpu_kind, int n_threads, struct model **out) {
    *out = NULL;
    struct model *m = xcalloc(1, sizeof *m);
    if (!m) return KVLLM_ENOMEM;
    int rc;
    if (gguf_is_gguf(path)) {
        rc = gguf_open(path, &m->file);
    } else if (llama2c_is_checkpoint(path)) {
        rc = llama2c_open(path, &m->file);
    } else if (hf_is_folder(path)) {
        rc = hf_open(path, &m->file);
    } else {
        struct file_map fm;
        rc = file_map_open(&fm, path); /* logs a precise I/O error if unreadable */
        if (rc == 0) {
            file_map_close(&fm);
            LOG_ERR("%s: not a GGUF file (bad magic) nor a llama2.c checkpoint", path);
            rc = KVLLM_EFORMAT;
        }
    }
    struct loader L = { .m = m, .path = path };
    if (!rc) rc = load_hparams(&L);
    if (!rc) rc = load_tensors(&L);
    for (uint32_t t = 0; t < DTYPE_COUNT_; t++)
        if (L.type_bytes[t] > L.type_bytes[m->main_type]) m->main_type = t;
    if (!rc) {
        int64_t max_cols = m->hp.n_ff > m->hp.n_embd ? m->hp.n_ff : m->hp.n_embd;
        rc = backend_cpu_new(cpu_kind, n_threads > 0 ? n_threads : cpu_count(), max_cols, &m->be);
    }
    if (rc) { model_free(m); return rc; }
    *out = m;
    return 0;
}

void model_free(struct model *m) {
    if (!m) return;
    backend_free(m->be);
    free(m->layers);
    gguf_free(m->file);
    free(m);
}
