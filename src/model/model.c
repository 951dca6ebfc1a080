/* model.c — loading: file format detection, hyper-parameters from GGUF
 * `<arch>.*` keys, and weight tensors checked for presence, shape and type
 * before any pointer is used. */
#include "model/model.h"
#include "load/hf.h"
#include "load/llama2c.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct loader {
    struct model *m;
    const char *path;
    uint64_t type_bytes[DTYPE_COUNT_];
    char key[96];           /* scratch for "<arch>.<suffix>" */
};

/* "<arch>.<suffix>" in L->key (valid until the next call). */
static const char *akey(struct loader *L, const char *suffix) {
    snprintf(L->key, sizeof L->key, "%s.%s", L->m->arch, suffix);
    return L->key;
}

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

/* The families kvllm computes.  A new family is an entry here (plus any
 * genuinely new op); the loader resolves per-layer windows and RoPE from it
 * and model_forward reads nothing else. */
static const struct arch_desc k_archs[] = {
    /* a zeroed field is Llama's choice: RMSNorm, adjacent-pair RoPE, SwiGLU, nothing else */
    { .name = "llama", .expert_norm = true },
    { .name = "mistral", .expert_norm = true },
    { .name = "qwen2", .pos = POS_ROPE_NEOX, .qkv_bias = true },
    { .name = "qwen3", .pos = POS_ROPE_NEOX, .qk_norm = true },
    { .name = "qwen3moe", .pos = POS_ROPE_NEOX, .qk_norm = true, .expert_norm = true },
    { .name = "smollm3", .nope_period = 4 },
    { .name = "phi3", .pos = POS_ROPE_NEOX, .no_window = true },
    { .name = "gemma2", .pos = POS_ROPE_NEOX, .ffn = FFN_GEGLU, .post_norms = true, .embd_scale = true,
      .fine_down = true, .swa_period = 2, .scalar_embd_layers = 46 },
    { .name = "gemma3", .pos = POS_ROPE_NEOX, .ffn = FFN_GEGLU, .qk_norm = true, .post_norms = true,
      .embd_scale = true, .fine_down = true, .swa_period = 6, .swa_rope_base = 10000, .scalar_embd_layers = 62 },
    { .name = "gpt2", .norm = NORM_LAYER, .pos = POS_LEARNED, .ffn = FFN_GELU },
    { .name = "gpt-oss", .pos = POS_ROPE_NEOX, .ffn = FFN_SWIGLU_OAI, .qkv_bias = true, .expert_norm = true,
      .swa_period = 2, .sinks = true, .moe_biases = true, .ffn_norm = "post_attention_norm" },
};

static const struct arch_desc *find_arch(struct gguf_str name) {
    for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
        if (gguf_str_eq(name, k_archs[i].name)) return &k_archs[i];
    return NULL;
}

/* The names of k_archs into buf, for the unknown-architecture message
 * (built per call: a static cache would race between threads loading models). */
static const char *arch_names(char *buf, size_t cap) {
    buf[0] = 0;
    for (size_t i = 0, o = 0; i < sizeof k_archs / sizeof k_archs[0] && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", k_archs[i].name);
    return buf;
}

/* RoPE keys: rotated dims, base, linear scaling. */
static int load_rope(struct loader *L) {
    struct model *m = L->m;
    struct model_hparams *hp = &m->hp;
    int rc;
    if ((rc = opt_u32(L, akey(L, "rope.dimension_count"), 0, hp->head_dim, hp->head_dim, &hp->n_rot)) ||
        (rc = opt_f32(L, akey(L, "rope.freq_base"), 1.0f, 1e12f, 10000.0f, &hp->rope_theta)))
        return rc;
    if (hp->n_rot % 2) {   /* without rope.dimension_count, the head width set it */
        const char *from = gguf_find(m->file, akey(L, "rope.dimension_count")) ? "rope.dimension_count"
                           : gguf_find(m->file, akey(L, "attention.key_length")) ? "attention.key_length"
                                                                                   : "attention.head_count";
        LOG_ERR("%s: %d rotated dimensions (from %s.%s) must be even", L->path, hp->n_rot, m->arch, from);
        return KVLLM_EFORMAT;
    }
    hp->rope_attn_factor = 1.0f;
    if ((rc = opt_f32(L, akey(L, "rope.scaling.attn_factor"), 1e-3f, 1e3f, 1.0f, &hp->rope_attn_factor)) ||
        (rc = opt_u32(L, akey(L, "rope.scaling.original_context_length"), 1, 1 << 24, hp->n_ctx_train,
                      &hp->n_ctx_orig)))
        return rc;
    struct gguf_str st;
    rc = gguf_get_str(m->file, akey(L, "rope.scaling.type"), &st);
    if (rc && rc != KVLLM_ENOTFOUND) return rc;
    const bool linear = !rc && gguf_str_eq(st, "linear");
    hp->rope_yarn = !rc && gguf_str_eq(st, "yarn");
    if (!rc && !linear && !hp->rope_yarn && !gguf_str_eq(st, "none")) {
        LOG_ERR("%s: %s.rope.scaling.type '%.*s' is not supported (supported: none, linear, yarn; Llama 3 "
                "scaling comes as rope_freqs.weight)", L->path, m->arch, (int)(st.len > 32 ? 32 : st.len), st.ptr);
        return KVLLM_EUNSUPPORTED;
    }
    if (!linear && !hp->rope_yarn) return 0;
    float factor, log_mul;
    if ((rc = opt_f32(L, akey(L, "rope.scaling.factor"), 1e-3f, 1e6f, 1.0f, &factor))) return rc;
    hp->rope_freq_scale = 1.0f / factor;
    if (linear) return 0;
    /* YaRN as llama.cpp computes it: cos and sin scaled by 1 + 0.1 ln(factor) (factor > 1) */
    if ((rc = opt_f32(L, akey(L, "rope.scaling.yarn_beta_fast"), 1e-3f, 1e6f, 32.0f, &hp->yarn_beta_fast)) ||
        (rc = opt_f32(L, akey(L, "rope.scaling.yarn_beta_slow"), 1e-3f, 1e6f, 1.0f, &hp->yarn_beta_slow)) ||
        (rc = opt_f32(L, akey(L, "rope.scaling.yarn_log_multiplier"), -1e6f, 1e6f, 0.0f, &log_mul)))
        return rc;
    if (log_mul != 0) {
        LOG_ERR("%s: %s.rope.scaling.yarn_log_multiplier %g: YaRN with a magnitude multiplier (DeepSeek's) is not "
                "supported", L->path, m->arch, log_mul);
        return KVLLM_EUNSUPPORTED;
    }
    if (factor > 1) hp->rope_attn_factor *= 1.0f + 0.1f * logf(factor);
    return 0;
}

/* YaRN's ramp over the pairs of n_rot dims rotated with base theta: from the
 * pair turning beta_fast times over the original context (floored) to the
 * one turning beta_slow times (ceiled), as ggml_rope_yarn_corr_dims. */
static void yarn_ramp(const struct model_hparams *hp, float theta, struct rope_params *r) {
    const float n = (float)hp->n_rot, c = (float)hp->n_ctx_orig, pi2 = 2 * 3.14159265358979f;
    const float lo = floorf(n * logf(c / (hp->yarn_beta_fast * pi2)) / (2 * logf(theta)));
    const float hi = ceilf(n * logf(c / (hp->yarn_beta_slow * pi2)) / (2 * logf(theta)));
    r->yarn = true;
    r->yarn_lo = lo > 0 ? lo : 0;
    r->yarn_hi = hi < n - 1 ? hi : n - 1;
}

/* Attention shape: heads, and a head width that may differ from n_embd / n_head (key_length). */
static int load_heads(struct loader *L) {
    struct model_hparams *hp = &L->m->hp;
    int rc, v_len;
    if ((rc = opt_u32(L, akey(L, "attention.key_length"), 1, 1 << 16, 0, &hp->head_dim)) ||
        (rc = opt_u32(L, akey(L, "attention.value_length"), 1, 1 << 16, 0, &v_len)))
        return rc;
    const char *a = L->m->arch;
    if (hp->n_head % hp->n_head_kv) {
        LOG_ERR("%s: %s.attention.head_count_kv %d must divide %s.attention.head_count %d", L->path, a,
                hp->n_head_kv, a, hp->n_head);
        return KVLLM_EFORMAT;
    }
    if (!hp->head_dim && hp->n_embd % hp->n_head) {
        LOG_ERR("%s: %s.attention.head_count %d does not divide %s.embedding_length %d (and the file gives no "
                "%s.attention.key_length)", L->path, a, hp->n_head, a, hp->n_embd, a);
        return KVLLM_EFORMAT;
    }
    if (!hp->head_dim) hp->head_dim = hp->n_embd / hp->n_head;
    if (v_len && v_len != hp->head_dim) {
        LOG_ERR("%s: %s.attention.value_length %d differs from the key length %d, which kvllm does not run",
                L->path, L->m->arch, v_len, hp->head_dim);
        return KVLLM_EUNSUPPORTED;
    }
    return 0;
}

/* What the family and the file say about scaling: embeddings, scores, soft-caps, the window. */
static int load_scales(struct loader *L) {
    const struct arch_desc *d = L->m->desc;
    struct model_hparams *hp = &L->m->hp;
    int rc;
    const bool scalar_embd = d->scalar_embd_layers && hp->n_layer == d->scalar_embd_layers;
    if (scalar_embd && hp->n_embd % hp->n_head) {
        LOG_ERR("%s: a %d-layer %s scales attention by %s.embedding_length / %s.attention.head_count, which %d / %d "
                "does not give", L->path, hp->n_layer, L->m->arch, L->m->arch, L->m->arch, hp->n_embd, hp->n_head);
        return KVLLM_EFORMAT;
    }
    hp->attn_scale = 1.0f / sqrtf((float)(scalar_embd ? hp->n_embd / hp->n_head : hp->head_dim));
    hp->embd_scale = d->embd_scale ? sqrtf((float)hp->n_embd) : 0.0f;
    if ((rc = opt_f32(L, akey(L, "attn_logit_softcapping"), 0.0f, 1e6f, 0.0f, &hp->attn_softcap)) ||
        (rc = opt_f32(L, akey(L, "final_logit_softcapping"), 0.0f, 1e6f, 0.0f, &hp->final_softcap)))
        return rc;
    if (d->pos == POS_LEARNED || d->no_window) return 0;
    if ((rc = opt_u32(L, akey(L, "attention.sliding_window"), 0, 1 << 30, 0, &hp->n_swa))) return rc;
    if (hp->n_swa > hp->n_ctx_train) {
        LOG_ERR("%s: %s.attention.sliding_window %d is longer than the context (%s.context_length %d)", L->path,
                L->m->arch, hp->n_swa, L->m->arch, hp->n_ctx_train);
        return KVLLM_EFORMAT;
    }
    return 0;
}

/* Mixture of experts: experts per layer, per token, and an expert's width. */
static int load_expert_counts(struct loader *L) {
    struct model_hparams *hp = &L->m->hp;
    int rc;
    if ((rc = opt_u32(L, akey(L, "expert_count"), 0, 4096, 0, &hp->n_expert)) ||
        (rc = opt_u32(L, akey(L, "expert_used_count"), 0, 4096, 0, &hp->n_expert_used)) ||
        (rc = opt_u32(L, akey(L, "expert_feed_forward_length"), 1, 1 << 22, hp->n_ff, &hp->n_ff_exp)))
        return rc;
    if (hp->n_expert && (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert)) {
        LOG_ERR("%s: %s.expert_used_count %d: a token must use 1 to %s.expert_count = %d experts", L->path,
                L->m->arch, hp->n_expert_used, L->m->arch, hp->n_expert);
        return KVLLM_EFORMAT;
    }
    if (!hp->n_expert) hp->n_expert_used = 0;
    return 0;
}

static int load_hparams(struct loader *L) {
    struct model *m = L->m;
    struct model_hparams *hp = &m->hp;
    struct gguf_str arch;
    int rc = gguf_get_str(m->file, "general.architecture", &arch);
    if (rc == KVLLM_ENOTFOUND) { LOG_ERR("%s: missing required key 'general.architecture'", L->path); return KVLLM_EFORMAT; }
    if (rc) return rc;
    m->desc = find_arch(arch);
    if (!m->desc) {
        char names[256];
        LOG_ERR("%s: unknown architecture '%.*s' (supported: %s)", L->path, (int)(arch.len > 64 ? 64 : arch.len),
                arch.ptr, arch_names(names, sizeof names));
        return KVLLM_EUNSUPPORTED;
    }
    snprintf(m->arch, sizeof m->arch, "%s", m->desc->name);
    const int big = 1 << 20;
    if ((rc = need_u32(L, akey(L, "embedding_length"), 1, big, &hp->n_embd)) ||
        (rc = need_u32(L, akey(L, "block_count"), 1, 4096, &hp->n_layer)) ||
        (rc = need_u32(L, akey(L, "attention.head_count"), 1, 4096, &hp->n_head)) ||
        (rc = need_u32(L, akey(L, "feed_forward_length"), 1, 4 * big, &hp->n_ff)) ||
        (rc = need_u32(L, akey(L, "context_length"), 1, 1 << 24, &hp->n_ctx_train)) ||
        (rc = opt_u32(L, akey(L, "attention.head_count_kv"), 1, 4096, hp->n_head, &hp->n_head_kv)) ||
        (rc = load_heads(L)))
        return rc;
    hp->rope_freq_scale = 1.0f;
    if (m->desc->norm == NORM_LAYER) {
        if ((rc = opt_f32(L, akey(L, "attention.layer_norm_epsilon"), 0.0f, 1.0f, 1e-5f, &hp->norm_eps))) return rc;
    } else if ((rc = opt_f32(L, akey(L, "attention.layer_norm_rms_epsilon"), 0.0f, 1.0f, 1e-5f, &hp->norm_eps))) {
        return rc;
    }
    if (m->desc->pos != POS_LEARNED && (rc = load_rope(L))) return rc;
    if ((rc = load_scales(L))) return rc;
    return load_expert_counts(L);
}

/* Layer il's window and RoPE, from the family's pattern. */
static void resolve_layer(const struct model *m, int il, struct llama_layer *l) {
    const struct arch_desc *d = m->desc;
    const struct model_hparams *hp = &m->hp;
    const bool slides = hp->n_swa > 0 && (!d->swa_period || il % d->swa_period < d->swa_period - 1);
    l->window = slides ? hp->n_swa : 0;
    l->rope = (struct rope_params){
        .n_rot = hp->n_rot, .theta = hp->rope_theta, .freq_scale = hp->rope_freq_scale,
        .freq_factors = m->rope_freqs.data ? &m->rope_freqs : NULL, .neox = d->pos == POS_ROPE_NEOX,
        .attn_factor = hp->rope_attn_factor,
    };
    if (slides && d->swa_rope_base > 0) {   /* the file's base and scaling are the global layers' */
        l->rope.theta = d->swa_rope_base;
        l->rope.freq_scale = 1.0f;
    }
    if (d->nope_period && (il + 1) % d->nope_period == 0) l->rope.n_rot = 0;   /* this layer has no positions */
    if (hp->rope_yarn && l->rope.n_rot && l->rope.freq_scale != 1.0f) yarn_ramp(hp, l->rope.theta, &l->rope);
}

/* View of rows r0 .. r0 + nr of a 2-D tensor (a slice of a fused QKV matrix). */
static struct tensor row_view(const struct tensor *t, int64_t r0, int64_t nr) {
    struct tensor v = *t;
    v.data = tensor_row(t, r0);
    v.ne1 = nr;
    return v;
}

/* View of elements e0 .. e0 + n of a 1-D f32 tensor (a slice of a fused QKV bias). */
static struct tensor vec_view(const struct tensor *t, int64_t e0, int64_t n) {
    struct tensor v = *t;
    v.data = (const float *)t->data + e0;
    v.ne0 = n;
    v.row_bytes = (size_t)n * sizeof(float);
    return v;
}

/* Q, K, V weights (and biases) of layer il: separate attn_q/k/v or one fused attn_qkv. */
static int load_qkv(struct loader *L, int il, struct llama_layer *l) {
    const struct model_hparams *hp = &L->m->hp;
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim, KV = (int64_t)hp->n_head_kv * hp->head_dim;
    char n[6][64];
    snprintf(n[0], sizeof n[0], "blk.%d.attn_qkv.weight", il);
    int rc;
    if (gguf_find_tensor(L->m->file, n[0])) {
        struct tensor w, b;
        snprintf(n[1], sizeof n[1], "blk.%d.attn_qkv.bias", il);
        if ((rc = get_tensor(L, n[0], E, Q + 2 * KV, false, false, &w)) ||
            (rc = get_tensor(L, n[1], Q + 2 * KV, 0, true, true, &b)))
            return rc;
        l->wq = row_view(&w, 0, Q);
        l->wk = row_view(&w, Q, KV);
        l->wv = row_view(&w, Q + KV, KV);
        if (b.data) {
            l->bq = vec_view(&b, 0, Q);
            l->bk = vec_view(&b, Q, KV);
            l->bv = vec_view(&b, Q + KV, KV);
        }
        return 0;
    }
    static const char *nm[6] = { "attn_q.weight", "attn_k.weight", "attn_v.weight",
                                 "attn_q.bias", "attn_k.bias", "attn_v.bias" };
    for (int i = 0; i < 6; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s", il, nm[i]);
    const bool need_b = L->m->desc->qkv_bias;
    if ((rc = get_tensor(L, n[0], E, Q, false, false, &l->wq)) ||
        (rc = get_tensor(L, n[1], E, KV, false, false, &l->wk)) ||
        (rc = get_tensor(L, n[2], E, KV, false, false, &l->wv)) ||
        (rc = get_tensor(L, n[3], Q, 0, true, !need_b, &l->bq)) ||
        (rc = get_tensor(L, n[4], KV, 0, true, !need_b, &l->bk)) ||
        (rc = get_tensor(L, n[5], KV, 0, true, !need_b, &l->bv)))
        return rc;
    return 0;
}

/* Frequency factors: Llama 3's rope_freqs, or LongRoPE's pair of which the
 * context picks one: the long factors when the model's context is longer
 * than the original one (what llama.cpp picks at its default context).
 * Every factor the file holds is checked, the unused half of the pair too:
 * a file with one of them missing or malformed was not written by a
 * converter, and its other factors cannot be trusted either. */
static int load_rope_factors(struct loader *L) {
    struct model *m = L->m;
    const struct model_hparams *hp = &m->hp;
    static const char *name[3] = { "rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight" };
    struct tensor t[3];
    int rc;
    for (int i = 0; i < 3; i++) {
        if ((rc = get_tensor(L, name[i], hp->n_rot / 2, 0, true, true, &t[i]))) return rc;
        for (int j = 0; t[i].data && j < hp->n_rot / 2; j++) {
            float f = ((const float *)t[i].data)[j];
            if (!(f > 0 && f < 1e30f)) {
                LOG_ERR("%s: %s[%d] = %g: frequency factors must be positive and finite", L->path, name[i], j, f);
                return KVLLM_EFORMAT;
            }
        }
    }
    if (t[0].data && (t[1].data || t[2].data)) {
        LOG_ERR("%s: both %s and %s: which frequency factors apply is ambiguous", L->path, name[0],
                name[t[1].data ? 1 : 2]);
        return KVLLM_EFORMAT;
    }
    if (!t[1].data != !t[2].data) {
        LOG_ERR("%s: %s without %s: LongRoPE factors come in pairs", L->path, name[t[1].data ? 1 : 2],
                name[t[1].data ? 2 : 1]);
        return KVLLM_EFORMAT;
    }
    m->rope_freqs = t[0].data ? t[0] : hp->n_ctx_train > hp->n_ctx_orig ? t[1] : t[2];
    return 0;
}

/* The dense FFN of layer il: gate (unless GELU), up, down and their
 * optional biases; a file may fuse gate and up into one ffn_up of 2 n_ff
 * rows, gate first (Phi-3). */
static int load_ffn(struct loader *L, int il, struct llama_layer *l) {
    const int64_t E = L->m->hp.n_embd, F = L->m->hp.n_ff;
    const bool gated = L->m->desc->ffn != FFN_GELU;
    static const char *name[5] = { "ffn_gate.weight", "ffn_up.weight", "ffn_up.bias", "ffn_down.weight",
                                   "ffn_down.bias" };
    char n[6][64];
    for (int i = 0; i < 5; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s", il, name[i]);
    snprintf(n[5], sizeof n[5], "blk.%d.ffn_gate_exps.weight", il);
    if (gguf_find_tensor(L->m->file, n[5])) {
        LOG_ERR("%s: tensor '%s' holds experts, but the file has no %s.expert_count", L->path, n[5], L->m->arch);
        return KVLLM_EFORMAT;
    }
    if (L->m->desc->ffn == FFN_SWIGLU_OAI) {
        LOG_ERR("%s: %s.expert_count is 0 or missing: a %s model's FFN is its experts", L->path, L->m->arch,
                L->m->arch);
        return KVLLM_EFORMAT;
    }
    int rc;
    if (gated && !gguf_find_tensor(L->m->file, n[0])) {   /* gate and up fused */
        struct tensor gu;
        if ((rc = get_tensor(L, n[1], E, 2 * F, false, false, &gu)) ||
            (rc = get_tensor(L, n[3], F, E, false, false, &l->ffn_down)))
            return rc;
        l->ffn_gate = row_view(&gu, 0, F);
        l->ffn_up = row_view(&gu, F, F);
        return 0;
    }
    if ((rc = get_tensor(L, n[0], E, F, false, !gated, &l->ffn_gate)) ||
        (rc = get_tensor(L, n[1], E, F, false, false, &l->ffn_up)) ||
        (rc = get_tensor(L, n[2], F, 0, true, true, &l->ffn_up_b)) ||
        (rc = get_tensor(L, n[3], F, E, false, false, &l->ffn_down)) ||
        (rc = get_tensor(L, n[4], E, 0, true, true, &l->ffn_down_b)))
        return rc;
    if (!gated && l->ffn_gate.data) {
        LOG_ERR("%s: tensor '%s' in a %s model, whose FFN is ungated", L->path, n[0], L->m->arch);
        return KVLLM_EFORMAT;
    }
    return 0;
}

/* Expert e of each kind ("gate", "up", "down") of layer il, as a 2-D
 * matrix of (rows, cols): a view into the 3-D tensor blk.il.ffn_<kind>_exps
 * (cols, rows, n_expert) at e * rows rows, or, where the file has no such
 * tensor, its own 2-D tensor blk.il.ffn_<kind>.e (the per-expert names of
 * llama.cpp's first Mixtral files, and what a Hugging Face folder's experts
 * are read as: no copy, the mapping stays the weights).  Either way placed by
 * the backend like any other tensor. */
static int get_expert_views(struct loader *L, int il, const char *kind, int64_t cols, int64_t rows,
                            struct tensor *out) {
    const int ne = L->m->hp.n_expert;
    char name[64];
    snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", il, kind);
    const struct gguf_tensor *g = gguf_find_tensor(L->m->file, name);
    if (!g) {
        char one[64];
        snprintf(one, sizeof one, "blk.%d.ffn_%s.0.weight", il, kind);
        if (!gguf_find_tensor(L->m->file, one)) {
            LOG_ERR("%s: missing tensor '%s' (nor are its experts there one by one, as '%s')", L->path, name, one);
            return KVLLM_EFORMAT;
        }
        int rc = 0;
        for (int e = 0; !rc && e < ne; e++) {
            snprintf(one, sizeof one, "blk.%d.ffn_%s.%d.weight", il, kind, e);
            rc = get_tensor(L, one, cols, rows, false, false, &out[e]);
        }
        return rc;
    }
    if (g->n_dims != 3 || g->ne[0] != cols || g->ne[1] != rows || g->ne[2] != ne || g->ne[3] != 1) {
        LOG_ERR("%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %d] (%s.expert_count)",
                L->path, name, (long long)g->ne[0], (long long)g->ne[1], (long long)g->ne[2], (long long)g->ne[3],
                (long long)cols, (long long)rows, ne, L->m->arch);
        return KVLLM_EFORMAT;
    }
    if (!dtype_supported(g->type)) {
        LOG_ERR("%s: tensor '%s' has type %s, which kvllm cannot compute with here", L->path, name,
                dtype_name(g->type));
        return KVLLM_EUNSUPPORTED;
    }
    const size_t row_bytes = (size_t)(g->n_bytes / (uint64_t)(rows * ne));
    for (int e = 0; e < ne; e++)
        out[e] = (struct tensor){ .type = g->type, .ne0 = cols, .ne1 = rows, .row_bytes = row_bytes,
                                  .data = (const uint8_t *)g->data + (size_t)e * (size_t)rows * row_bytes };
    L->m->n_params += g->n_elems;
    L->m->weight_bytes += g->n_bytes;
    if (g->type < DTYPE_COUNT_) L->type_bytes[g->type] += g->n_bytes;
    return 0;
}

/* The experts of layer il: the router and ffn_{gate,up,down}_exps, gated by the family's activation. */
static int load_experts(struct loader *L, int il, struct llama_layer *l) {
    const struct model_hparams *hp = &L->m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff_exp;
    if (L->m->desc->ffn == FFN_GELU) {
        LOG_ERR("%s: %s.expert_count %d: experts with an ungated FFN are not supported", L->path, L->m->arch,
                hp->n_expert);
        return KVLLM_EUNSUPPORTED;
    }
    l->exp_gate = xcalloc(3 * (size_t)hp->n_expert, sizeof *l->exp_gate);   /* freed by model_free */
    if (!l->exp_gate) return KVLLM_ENOMEM;
    l->exp_up = l->exp_gate + hp->n_expert;
    l->exp_down = l->exp_up + hp->n_expert;
    static const char *name[5] = { "ffn_gate_inp.weight", "ffn_gate_inp.bias", "ffn_gate_exps.bias",
                                   "ffn_up_exps.bias", "ffn_down_exps.bias" };
    char n[5][64];
    for (int i = 0; i < 5; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s", il, name[i]);
    const bool opt_b = !L->m->desc->moe_biases;
    const int ne = hp->n_expert;
    int rc;
    if ((rc = get_tensor(L, n[0], E, ne, false, false, &l->ffn_gate_inp)) ||
        (rc = get_expert_views(L, il, "gate", E, F, l->exp_gate)) ||
        (rc = get_expert_views(L, il, "up", E, F, l->exp_up)) ||
        (rc = get_expert_views(L, il, "down", F, E, l->exp_down)) ||
        (rc = get_tensor(L, n[1], ne, 0, true, opt_b, &l->ffn_gate_inp_b)) ||
        (rc = get_tensor(L, n[2], F, ne, true, opt_b, &l->exp_gate_b)) ||
        (rc = get_tensor(L, n[3], F, ne, true, opt_b, &l->exp_up_b)) ||
        (rc = get_tensor(L, n[4], E, ne, true, opt_b, &l->exp_down_b)))
        return rc;
    return 0;
}

/* The norms some families add: per-head q/k norms, post-attention and post-FFN norms. */
static int load_extra_norms(struct loader *L, int il, struct llama_layer *l) {
    const struct arch_desc *d = L->m->desc;
    const int64_t E = L->m->hp.n_embd, D = L->m->hp.head_dim;
    static const char *name[4] = { "attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight",
                                   "post_ffw_norm.weight" };
    char n[4][64];
    for (int i = 0; i < 4; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s", il, name[i]);
    int rc;
    if (d->qk_norm && ((rc = get_tensor(L, n[0], D, 0, true, false, &l->attn_q_norm)) ||
                       (rc = get_tensor(L, n[1], D, 0, true, false, &l->attn_k_norm))))
        return rc;
    if (d->post_norms && ((rc = get_tensor(L, n[2], E, 0, true, false, &l->attn_post_norm)) ||
                          (rc = get_tensor(L, n[3], E, 0, true, false, &l->ffn_post_norm))))
        return rc;
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
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim;
    const bool ln = m->desc->norm == NORM_LAYER, learned_pos = m->desc->pos == POS_LEARNED;
    int rc;
    if ((rc = get_tensor(L, "token_embd.weight", E, hp->n_vocab, false, false, &m->tok_embd)) ||
        (rc = get_tensor(L, "position_embd.weight", E, hp->n_ctx_train, false, !learned_pos, &m->pos_embd)) ||
        (rc = load_rope_factors(L)) ||
        (rc = get_tensor(L, "output_norm.weight", E, 0, true, false, &m->output_norm)) ||
        (rc = get_tensor(L, "output_norm.bias", E, 0, true, !ln, &m->output_norm_b)) ||
        (rc = get_tensor(L, "output.weight", E, hp->n_vocab, false, true, &m->output)))
        return rc;
    if (learned_pos && m->rope_freqs.data) {
        LOG_ERR("%s: rope_freqs.weight in a %s model, which has no RoPE", L->path, m->arch);
        return KVLLM_EFORMAT;
    }
    m->tied_output = m->output.data == NULL;
    if (m->tied_output) m->output = m->tok_embd;
    m->layers = xcalloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return KVLLM_ENOMEM;
    for (int il = 0; il < hp->n_layer; il++) {
        struct llama_layer *l = &m->layers[il];
        enum { N_ = 7 };
        char n[N_][64];
        static const char *name[N_] = { "attn_norm.weight", "attn_norm.bias", "attn_output.weight", "attn_output.bias",
                                        "weight", "bias", "attn_sinks.weight" };
        const char *fn = m->desc->ffn_norm ? m->desc->ffn_norm : "ffn_norm";
        for (int i = 0; i < N_; i++)
            if (i == 4 || i == 5) snprintf(n[i], sizeof n[i], "blk.%d.%s.%s", il, fn, name[i]);
            else snprintf(n[i], sizeof n[i], "blk.%d.%s", il, name[i]);
        /* biases: optional for every architecture, but LayerNorm models carry their norm biases */
        if ((rc = get_tensor(L, n[0], E, 0, true, false, &l->attn_norm)) ||
            (rc = get_tensor(L, n[1], E, 0, true, !ln, &l->attn_norm_b)) ||
            (rc = load_qkv(L, il, l)) ||
            (rc = get_tensor(L, n[2], Q, E, false, false, &l->wo)) ||
            (rc = get_tensor(L, n[3], E, 0, true, !m->desc->moe_biases, &l->bo)) ||
            (rc = get_tensor(L, n[6], hp->n_head, 0, true, !m->desc->sinks, &l->attn_sinks)) ||
            (rc = get_tensor(L, n[4], E, 0, true, false, &l->ffn_norm)) ||
            (rc = get_tensor(L, n[5], E, 0, true, !ln, &l->ffn_norm_b)) ||
            (rc = hp->n_expert ? load_experts(L, il, l) : load_ffn(L, il, l)) ||
            (rc = load_extra_norms(L, il, l)))
            return rc;
        resolve_layer(m, il, l);
    }
    return 0;
}

void model_release_mapped(const struct model *m, const void *p, size_t n) {
    const uint8_t *lo = m->file->map.data, *a = p;
    if (!lo || a < lo || a + n > lo + m->file->map.size) return;   /* not the file's mapping: owned memory */
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t b = ((uintptr_t)a + pg - 1) & ~(pg - 1), e = ((uintptr_t)a + n) & ~(pg - 1);
    if (e > b) madvise((void *)b, e - b, MADV_DONTNEED);
}

/* A tensor the backend copied (repacked for its integer kernels, uploaded)
 * is read from the copy only: the file pages it was copied from are given
 * back at once, so the load never holds both copies of every weight. */
static void release_copied(void *m, const void *src, size_t bytes) { model_release_mapped(m, src, bytes); }

/* Every tensor of the model, for the backend to place in one call; the
 * tied output is the embedding itself and is re-pointed afterwards. */
static int place_weights(struct model *m) {
    const int per_layer = 28 + 3 * m->hp.n_expert, n_max = 6 + per_layer * m->hp.n_layer;
    struct tensor **ts = xmalloc((size_t)n_max * sizeof *ts);
    if (!ts) return KVLLM_ENOMEM;
    int n = 0;
    struct tensor *top[] = { &m->tok_embd, &m->pos_embd, &m->rope_freqs, &m->output_norm, &m->output_norm_b,
                             m->tied_output ? NULL : &m->output };
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (top[i]) ts[n++] = top[i];
    for (int il = 0; il < m->hp.n_layer; il++) {
        struct llama_layer *l = &m->layers[il];
        struct tensor *lt[] = { &l->attn_norm, &l->attn_norm_b, &l->wq, &l->wk, &l->wv, &l->bq, &l->bk, &l->bv,
                                &l->wo, &l->bo, &l->ffn_norm, &l->ffn_norm_b, &l->ffn_gate, &l->ffn_up,
                                &l->ffn_up_b, &l->ffn_down, &l->ffn_down_b, &l->attn_q_norm, &l->attn_k_norm,
                                &l->attn_post_norm, &l->ffn_post_norm, &l->ffn_gate_inp, &l->attn_sinks,
                                &l->ffn_gate_inp_b, &l->exp_gate_b, &l->exp_up_b, &l->exp_down_b };
        _Static_assert(sizeof lt / sizeof lt[0] <= 28, "per_layer");
        for (size_t i = 0; i < sizeof lt / sizeof lt[0]; i++) ts[n++] = lt[i];
        for (int e = 0; l->exp_gate && e < 3 * m->hp.n_expert; e++) ts[n++] = &l->exp_gate[e];   /* gate, up, down */
    }
    (m->tied_output ? &m->tok_embd : &m->output)->flags |= TENSOR_F_F32_ACT;   /* hints (tensor.h) */
    for (int il = 0; m->desc->fine_down && il < m->hp.n_layer; il++) m->layers[il].ffn_down.flags |= TENSOR_F_FINE_ACT;
    const struct place_copied copied = { release_copied, m };
    int rc = m->be->ops->place_weights(m->be, ts, n, &copied, &m->placed_bytes);
    free(ts);
    if (!rc && m->tied_output) m->output = m->tok_embd;
    return rc;
}

/* Whether the backend runs op on each of the n tensors (absent ones
 * pass); on the first it does not, logs the op, its weights' type and the
 * backend, and returns false. */
static bool backend_runs(const struct model *m, const char *path, enum backend_op op, const struct tensor *const *ts,
                         int n) {
    for (int i = 0; i < n; i++) {
        if (!ts[i]->data || backend_supports(m->be, op, ts[i]->type)) continue;
        LOG_ERR("%s: the %s backend cannot run %s on %s weights%s", path, m->be->ops->name, backend_op_name(op),
                dtype_name(ts[i]->type), op == BACKEND_OP_MOE ? " (a mixture-of-experts model)" : "");
        return false;
    }
    return true;
}

/* Refuse, before anything is placed, a model that needs an op (or a
 * weight type of one) the backend does not run: KVLLM_EUNSUPPORTED, with
 * the op, the type and the backend named. */
static int check_backend_ops(const struct model *m, const char *path) {
    const struct tensor *const rows[] = { &m->tok_embd, &m->pos_embd };
    const struct tensor *const head[] = { m->tied_output ? &m->tok_embd : &m->output };
    bool ok = backend_runs(m, path, BACKEND_OP_GET_ROWS, rows, 2) && backend_runs(m, path, BACKEND_OP_MATMUL, head, 1);
    for (int il = 0; ok && il < m->hp.n_layer; il++) {
        const struct llama_layer *l = &m->layers[il];
        const struct tensor *const mm[] = { &l->wq, &l->wk, &l->wv, &l->wo, &l->ffn_gate, &l->ffn_up, &l->ffn_down,
                                            &l->ffn_gate_inp };
        ok = backend_runs(m, path, BACKEND_OP_MATMUL, mm, (int)(sizeof mm / sizeof mm[0]));
        for (int e = 0; ok && l->exp_gate && e < 3 * m->hp.n_expert; e++) {   /* gate, up, down */
            const struct tensor *const ex[] = { &l->exp_gate[e] };
            ok = backend_runs(m, path, BACKEND_OP_MOE, ex, 1);
        }
    }
    return ok ? 0 : KVLLM_EUNSUPPORTED;
}

int model_load(const char *path, const struct backend_params *bp, int n_threads, struct model **out) {
    return model_load_tp(path, bp, n_threads, NULL, out);
}

int model_load_tp(const char *path, const struct backend_params *bp, int n_threads, struct comm *cm,
                  struct model **out) {
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
    m->n_threads = n_threads > 0 ? n_threads : cpu_count();
    if (!rc) rc = backend_new(bp, &m->be);
    if (!rc) rc = check_backend_ops(m, path);
    m->tp_size = 1;
    m->comm = cm && cm->size > 1 ? cm : NULL;
    if (!rc && m->comm) rc = model_shard(m, path, cm->rank, cm->size);
    if (!rc) rc = place_weights(m);
    if (!rc) model_shard_release(m);
    if (rc) { model_free(m); return rc; }
    *out = m;
    return 0;
}

int model_check_ctx(const struct model *m, int n_ctx) {
    if (m->desc->pos == POS_LEARNED && n_ctx > m->pos_embd.ne1) {
        LOG_ERR("a context of %d positions is longer than the %lld learned positions of this %s model", n_ctx,
                (long long)m->pos_embd.ne1, m->arch);
        return KVLLM_ERANGE;
    }
    return 0;
}

int model_rope_params(const struct model *m, struct rope_params *out) {
    const struct rope_params *r = &m->layers[0].rope;
    *out = *r;
    if (m->desc->pos == POS_LEARNED || r->n_rot == 0) return KVLLM_EUNSUPPORTED;
    for (int il = 1; il < m->hp.n_layer; il++) {
        const struct rope_params *o = &m->layers[il].rope;
        if (o->n_rot != r->n_rot || o->theta != r->theta || o->freq_scale != r->freq_scale || o->yarn != r->yarn)
            return KVLLM_EUNSUPPORTED;
    }
    if (r->attn_factor != 1.0f) return KVLLM_EUNSUPPORTED;   /* a shift would scale cached K twice */
    return 0;
}

void model_free(struct model *m) {
    if (!m) return;
    backend_free(m->be);   /* the placed weights with it */
    for (int il = 0; m->layers && il < m->hp.n_layer; il++) free(m->layers[il].exp_gate);   /* with up, down */
    free(m->layers);
    for (int i = 0; i < m->n_shard_copies; i++) free(m->shard_copies[i]);
    free(m->shard_copies);
    gguf_free(m->file);
    free(m);
}
