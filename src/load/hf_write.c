/* hf_write.c — a GGUF written as a Hugging Face folder (hf_write, see hf.h):
 * config.json and generation_config.json from the <arch>.* keys (and Phi-3's
 * LongRoPE factors), model.safetensors with HF's tensor names (Llama Q/K rows
 * permuted back to the halves layout, GPT-2 matrices back to Conv1D, Gemma's
 * norms less the 1 GGUF adds), and tokenizer.json through
 * hf_tokenizer_write.  The reading side is hf.c. */
#include "load/hf.h"
#include "load/hf_internal.h"
#include "load/safetensors.h"
#include "tensor/dtype.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* GGUF name -> HF name (the inverse of map_name / map_name_gpt2), before Gemma's norm offset. */
static bool hf_name_of(enum hf_arch arch, const char *gg, char *out, size_t cap, int *perm) {
    static const struct { const char *gguf, *hf; int perm; } layer[] = {
        { "attn_q.weight", "self_attn.q_proj.weight", PERM_Q },
        { "attn_k.weight", "self_attn.k_proj.weight", PERM_K },
        { "attn_v.weight", "self_attn.v_proj.weight", PERM_NONE },
        { "attn_output.weight", "self_attn.o_proj.weight", PERM_NONE },
        { "ffn_gate.weight", "mlp.gate_proj.weight", PERM_NONE },
        { "ffn_up.weight", "mlp.up_proj.weight", PERM_NONE },
        { "ffn_down.weight", "mlp.down_proj.weight", PERM_NONE },
        { "attn_norm.weight", "input_layernorm.weight", PERM_NONE },
        { "ffn_norm.weight", "post_attention_layernorm.weight", PERM_NONE },
        { "attn_q.bias", "self_attn.q_proj.bias", PERM_NONE },
        { "attn_k.bias", "self_attn.k_proj.bias", PERM_NONE },
        { "attn_v.bias", "self_attn.v_proj.bias", PERM_NONE },
    };
    static const struct { const char *gguf, *hf; int perm; } gpt2[] = {
        { "attn_norm.weight", "ln_1.weight", PERM_NONE },     { "attn_norm.bias", "ln_1.bias", PERM_NONE },
        { "attn_qkv.weight", "attn.c_attn.weight", PERM_T },  { "attn_qkv.bias", "attn.c_attn.bias", PERM_NONE },
        { "attn_output.weight", "attn.c_proj.weight", PERM_T }, { "attn_output.bias", "attn.c_proj.bias", PERM_NONE },
        { "ffn_norm.weight", "ln_2.weight", PERM_NONE },      { "ffn_norm.bias", "ln_2.bias", PERM_NONE },
        { "ffn_up.weight", "mlp.c_fc.weight", PERM_T },       { "ffn_up.bias", "mlp.c_fc.bias", PERM_NONE },
        { "ffn_down.weight", "mlp.c_proj.weight", PERM_T },   { "ffn_down.bias", "mlp.c_proj.bias", PERM_NONE },
    };
    *perm = PERM_NONE;
    if (!strcmp(gg, "output.weight")) { snprintf(out, cap, "lm_head.weight"); return true; }
    if (arch == HF_GPT2) {
        static const char *const top[][2] = { { "token_embd.weight", "wte.weight" },
                                              { "position_embd.weight", "wpe.weight" },
                                              { "output_norm.weight", "ln_f.weight" },
                                              { "output_norm.bias", "ln_f.bias" } };
        for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
            if (!strcmp(gg, top[i][0])) { snprintf(out, cap, "transformer.%s", top[i][1]); return true; }
    } else {
        if (!strcmp(gg, "token_embd.weight")) { snprintf(out, cap, "model.embed_tokens.weight"); return true; }
        if (!strcmp(gg, "output_norm.weight")) { snprintf(out, cap, "model.norm.weight"); return true; }
    }
    /* the families' own: per-head q/k norms, Gemma's norms around the sub-layers, Phi-3's fused projections */
    static const struct { const char *gguf, *hf; enum hf_arch arch; } own[] = {
        { "attn_q_norm.weight", "self_attn.q_norm.weight", HF_QWEN3 },
        { "attn_k_norm.weight", "self_attn.k_norm.weight", HF_QWEN3 },
        { "attn_q_norm.weight", "self_attn.q_norm.weight", HF_GEMMA3 },
        { "attn_k_norm.weight", "self_attn.k_norm.weight", HF_GEMMA3 },
        { "post_attention_norm.weight", "post_attention_layernorm.weight", HF_GEMMA3 },
        { "ffn_norm.weight", "pre_feedforward_layernorm.weight", HF_GEMMA3 },
        { "post_ffw_norm.weight", "post_feedforward_layernorm.weight", HF_GEMMA3 },
        { "post_attention_norm.weight", "post_attention_layernorm.weight", HF_GEMMA2 },
        { "ffn_norm.weight", "pre_feedforward_layernorm.weight", HF_GEMMA2 },
        { "post_ffw_norm.weight", "post_feedforward_layernorm.weight", HF_GEMMA2 },
        { "attn_qkv.weight", "self_attn.qkv_proj.weight", HF_PHI3 },
        { "ffn_up.weight", "mlp.gate_up_proj.weight", HF_PHI3 },
    };
    unsigned il;
    int k = 0;
    if (sscanf(gg, "blk.%u.%n", &il, &k) != 1 || k == 0) return false;
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (own[i].arch == arch && !strcmp(gg + k, own[i].gguf)) {
            snprintf(out, cap, "model.layers.%u.%s", il, own[i].hf);
            return true;
        }
    if (arch == HF_GPT2) {
        for (size_t i = 0; i < sizeof gpt2 / sizeof gpt2[0]; i++)
            if (!strcmp(gg + k, gpt2[i].gguf)) {
                snprintf(out, cap, "transformer.h.%u.%s", il, gpt2[i].hf);
                *perm = gpt2[i].perm;
                return true;
            }
        return false;
    }
    for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++)
        if (!strcmp(gg + k, layer[i].gguf)) {
            if (arch != HF_QWEN2 && i >= 9) return false; /* biases: Qwen2 only */
            snprintf(out, cap, "model.layers.%u.%s", il, layer[i].hf);
            /* the others keep the halves layout in GGUF */
            *perm = arch == HF_LLAMA || arch == HF_SMOLLM3 ? layer[i].perm : PERM_NONE;
            return true;
        }
    return false;
}

/* GGUF name -> HF name and how the tensor changes on the way out. */
static bool hf_name(enum hf_arch arch, const char *gg, char *out, size_t cap, int *perm) {
    if (!hf_name_of(arch, gg, out, cap, perm)) return false;
    const size_t n = strlen(gg);
    if ((arch == HF_GEMMA2 || arch == HF_GEMMA3) && n >= 11 && !strcmp(gg + n - 11, "norm.weight"))
        *perm = PERM_SHIFT;   /* 1 + w -> w */
    return true;
}

/* A float as short as it can be while reading back to the same float. */
static void fmt_float(char *buf, size_t cap, float v) {
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, cap, "%.*g", prec, (double)v);
        if ((float)strtod(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", cap - strlen(buf) - 1);
}

/* text written to a temporary file beside path, complete (fsynced) but not
 * yet in place: the caller commits or aborts *o.  Errors logged, *o zeroed. */
static int write_text(struct out_file *o, const char *path, const char *text) {
    int rc = out_file_open(o, path);
    if (rc) return rc;
    if (fputs(text, o->f) < 0) {
        LOG_ERR("%s: write failed: %s", path, strerror(errno));
        out_file_abort(o);
        return KVLLM_EIO;
    }
    return out_file_finish(o);
}

/* Hyper-parameters of a GGUF to write, read with its <arch>. prefix. */
struct w_hparams {
    enum hf_arch arch;
    bool mistral;          /* written as MistralForCausalLM */
    uint32_t E, L, H, HKV, FF, CTX, bos, eos, swa;
    uint32_t HD, rot, ctx_orig;    /* head width (Qwen3, Gemma 3: key_length); rotated dims (Phi-3: a part of
                                      it); Phi-3's original context */
    float eps, theta, rope_linear; /* rope_linear 0: none */
    float attn_softcap, final_softcap, rope_attn; /* Gemma's soft-caps (0: none); LongRoPE's attn_factor */
    const struct gguf_tensor *rope_long, *rope_short; /* Phi-3's LongRoPE factors: to config.json */
};

/* Phi-3's LongRoPE factors, when the file has them: both, F32, rot / 2 each. */
static int read_w_longrope(const struct gguf *g, struct w_hparams *w) {
    w->rope_long = gguf_find_tensor(g, "rope_factors_long.weight");
    w->rope_short = gguf_find_tensor(g, "rope_factors_short.weight");
    const struct gguf_tensor *f[2] = { w->rope_long, w->rope_short };
    if (!f[0] && !f[1]) return 0;
    for (int i = 0; i < 2; i++)
        if (!f[i] || f[i]->type != DTYPE_F32 || f[i]->n_dims != 1 || f[i]->ne[0] != w->rot / 2) {
            LOG_ERR("%s: %s must be F32 of %u values beside %s", g->path,
                    i ? "rope_factors_short.weight" : "rope_factors_long.weight", w->rot / 2,
                    i ? "rope_factors_long.weight" : "rope_factors_short.weight");
            return KVLLM_EFORMAT;
        }
    return 0;
}

static int read_w_hparams(const struct gguf *g, struct w_hparams *w) {
    struct gguf_str arch;
    static const char *const names[] = { "llama", "mistral", "qwen2", "gpt2", "qwen3", "gemma2", "gemma3", "phi3",
                                         "smollm3" };
    static const enum hf_arch ids[] = { HF_LLAMA, HF_LLAMA, HF_QWEN2, HF_GPT2, HF_QWEN3, HF_GEMMA2, HF_GEMMA3,
                                        HF_PHI3, HF_SMOLLM3 };
    int ai = -1;
    if (gguf_get_str(g, "general.architecture", &arch) == 0)
        for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++) if (gguf_str_eq(arch, names[i])) ai = i;
    if (ai < 0) {
        LOG_ERR("%s: only llama, mistral, qwen2, gpt2, qwen3, gemma2, gemma3, phi3 and smollm3 models can be "
                "written as a Hugging Face folder", g->path);
        return KVLLM_EUNSUPPORTED;
    }
    *w = (struct w_hparams){ .arch = ids[ai], .mistral = ai == 1, .CTX = 2048, .bos = 1, .eos = 2,
                             .eps = 1e-5f, .theta = 10000.0f, .rope_attn = 1.0f };
    const char *a = names[ai];
    const bool gemma = w->arch == HF_GEMMA2 || w->arch == HF_GEMMA3;
    const bool own_hd = w->arch == HF_QWEN3 || gemma;   /* head width of its own: key_length */
    char key[96];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
    int rc;
    if ((rc = gguf_get_u32(g, KEY("embedding_length"), &w->E)) || (rc = gguf_get_u32(g, KEY("block_count"), &w->L)) ||
        (rc = gguf_get_u32(g, KEY("attention.head_count"), &w->H)) ||
        (rc = gguf_get_u32(g, KEY("feed_forward_length"), &w->FF))) {
        if (rc == KVLLM_ENOTFOUND) LOG_ERR("%s: missing %s.* hyper-parameters", g->path, a);
        return KVLLM_EFORMAT;
    }
    if (gguf_get_u32(g, KEY("attention.head_count_kv"), &w->HKV)) w->HKV = w->H;
    gguf_get_u32(g, KEY("context_length"), &w->CTX);
    gguf_get_f32(g, KEY(w->arch == HF_GPT2 ? "attention.layer_norm_epsilon" : "attention.layer_norm_rms_epsilon"),
                 &w->eps);
    gguf_get_f32(g, KEY("rope.freq_base"), &w->theta);
    gguf_get_u32(g, KEY("attention.sliding_window"), &w->swa);
    gguf_get_f32(g, KEY("attn_logit_softcapping"), &w->attn_softcap);
    gguf_get_f32(g, KEY("final_logit_softcapping"), &w->final_softcap);
    w->ctx_orig = w->CTX;
    gguf_get_u32(g, KEY("rope.scaling.original_context_length"), &w->ctx_orig);
    gguf_get_f32(g, KEY("rope.scaling.attn_factor"), &w->rope_attn);
    struct gguf_str st;
    if (gguf_get_str(g, KEY("rope.scaling.type"), &st) == 0 && !gguf_str_eq(st, "none")) {
        float f = 1.0f;
        gguf_get_f32(g, KEY("rope.scaling.factor"), &f);
        if (!gguf_str_eq(st, "linear") || w->arch == HF_GPT2) {
            LOG_ERR("%s: %s.rope.scaling.type '%.*s' cannot be written to config.json (only linear)", g->path, a,
                    (int)(st.len > 32 ? 32 : st.len), st.ptr);
            return KVLLM_EUNSUPPORTED;
        }
        if (f != 1.0f) w->rope_linear = f;
    }
    w->HD = w->H ? w->E / w->H : 0;
    if (own_hd) gguf_get_u32(g, KEY("attention.key_length"), &w->HD);
    w->rot = w->HD;
    if (w->arch != HF_GPT2) gguf_get_u32(g, KEY("rope.dimension_count"), &w->rot);
    /* Phi-3's partial_rotary_factor, read back as int(factor * head_dim) */
    const bool partial_ok = w->arch == HF_PHI3 && w->HD && (uint32_t)((double)w->rot / w->HD * w->HD) == w->rot;
    if (w->arch != HF_GPT2 && w->rot != w->HD && !partial_ok) {
        LOG_ERR("%s: partial rotary (%s.rope.dimension_count %u) cannot be written as a Hugging Face model", g->path,
                a, w->rot);
        return KVLLM_EUNSUPPORTED;
    }
#undef KEY
    if (w->swa && w->arch == HF_LLAMA) w->mistral = true; /* sliding window: Mistral's config carries it */
    if (w->swa && w->arch != HF_LLAMA && !gemma && w->arch != HF_PHI3) {
        LOG_ERR("%s: a sliding window in a %s model cannot be written to config.json", g->path, a);
        return KVLLM_EUNSUPPORTED;
    }
    if (gguf_find_tensor(g, "rope_freqs.weight")) {
        LOG_ERR("%s: rope_freqs.weight (Llama 3 rope scaling) cannot be turned back into config.json's "
                "rope_scaling; not written", g->path);
        return KVLLM_EUNSUPPORTED;
    }
    if (w->arch == HF_PHI3 && (rc = read_w_longrope(g, w))) return rc;
    gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &w->bos);
    gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &w->eos);
    if (!w->H || !w->HKV || w->H % w->HKV || (!own_hd && w->E % w->H) ||
        (w->arch != HF_GPT2 && (!w->HD || w->HD % 2))) {
        LOG_ERR("%s: inconsistent head counts", g->path);
        return KVLLM_EFORMAT;
    }
    return 0;
}

/* A JSON number for f, as short as reads back to the same float. */
static json_object *jfloat(float f) {
    char buf[32];
    fmt_float(buf, sizeof buf, f);
    return json_object_new_double_s((double)f, buf);
}

/* config.json of a Qwen3, Gemma 2, Gemma 3 text, Phi-3 or SmolLM3 model, as Transformers
 * writes it (through json-c: Phi-3's factor lists are as long as the
 * rotated dims). */
static int write_config_family(struct out_file *o, const char *path, const struct w_hparams *w, int64_t n_vocab,
                               bool tied, const char *dt) {
    static const char *const arch_name[HF_ARCH_COUNT_] = {
        [HF_QWEN3] = "Qwen3ForCausalLM", [HF_GEMMA2] = "Gemma2ForCausalLM", [HF_GEMMA3] = "Gemma3ForCausalLM",
        [HF_PHI3] = "Phi3ForCausalLM", [HF_SMOLLM3] = "SmolLM3ForCausalLM" };
    static const char *const type_name[HF_ARCH_COUNT_] = {
        [HF_QWEN3] = "qwen3", [HF_GEMMA2] = "gemma2", [HF_GEMMA3] = "gemma3_text", [HF_PHI3] = "phi3",
        [HF_SMOLLM3] = "smollm3" };
    const bool gemma = w->arch == HF_GEMMA2 || w->arch == HF_GEMMA3;
    json_object *c = json_object_new_object(), *arr = json_object_new_array(), *rs = NULL;
    if (!c || !arr) { json_object_put(c); json_object_put(arr); return KVLLM_ENOMEM; }
#define ADD(k, v) json_object_object_add(c, k, v)
    json_object_array_add(arr, json_object_new_string(arch_name[w->arch]));
    ADD("architectures", arr);
    ADD("model_type", json_object_new_string(type_name[w->arch]));
    ADD("hidden_size", json_object_new_int64(w->E));
    ADD("intermediate_size", json_object_new_int64(w->FF));
    ADD("num_hidden_layers", json_object_new_int64(w->L));
    ADD("num_attention_heads", json_object_new_int64(w->H));
    ADD("num_key_value_heads", json_object_new_int64(w->HKV));
    ADD("head_dim", json_object_new_int64(w->HD));
    ADD("max_position_embeddings", json_object_new_int64(w->CTX));
    ADD("vocab_size", json_object_new_int64(n_vocab));
    ADD("rms_norm_eps", jfloat(w->eps));
    ADD("rope_theta", jfloat(w->theta));
    if (w->rope_linear) {
        rs = json_object_new_object();
        json_object_object_add(rs, "rope_type", json_object_new_string("linear"));
        json_object_object_add(rs, "factor", jfloat(w->rope_linear));
    } else if (w->rope_long) {   /* Phi-3 */
        rs = json_object_new_object();
        json_object_object_add(rs, "type", json_object_new_string("longrope"));
        const struct gguf_tensor *f[2] = { w->rope_long, w->rope_short };
        for (int i = 0; i < 2; i++) {
            json_object *l = json_object_new_array();
            for (int64_t j = 0; j < f[i]->ne[0]; j++) json_object_array_add(l, jfloat(((const float *)f[i]->data)[j]));
            json_object_object_add(rs, i ? "short_factor" : "long_factor", l);
        }
        json_object_object_add(rs, "attention_factor", jfloat(w->rope_attn));
    }
    ADD("rope_scaling", rs);
    ADD("attention_bias", json_object_new_boolean(0));
    if (gemma) {   /* the pattern, local base and scale GGUF's gemma2 / gemma3 imply (hf.c) */
        const bool g2 = w->arch == HF_GEMMA2;
        ADD("hidden_activation", json_object_new_string("gelu_pytorch_tanh"));
        ADD("sliding_window", json_object_new_int64(w->swa ? w->swa : w->CTX));   /* CTX: no window */
        if (!g2) {
            ADD("sliding_window_pattern", json_object_new_int(6));
            ADD("rope_local_base_freq", json_object_new_double_s(10000.0, "10000.0"));
        }
        ADD("query_pre_attn_scalar", json_object_new_int64(w->L == (g2 ? 46u : 62u) ? w->E / w->H : w->HD));
        ADD("attn_logit_softcapping", w->attn_softcap > 0 ? jfloat(w->attn_softcap) : NULL);
        ADD("final_logit_softcapping", w->final_softcap > 0 ? jfloat(w->final_softcap) : NULL);
    } else {
        ADD("hidden_act", json_object_new_string("silu"));
        ADD("sliding_window", w->swa ? json_object_new_int64(w->swa) : NULL);
    }
    if (w->arch == HF_QWEN3 || w->arch == HF_SMOLLM3) {
        ADD("use_sliding_window", json_object_new_boolean(0));
        ADD("max_window_layers", json_object_new_int64(w->L));
    }
    if (w->arch == HF_SMOLLM3) {   /* every fourth layer without RoPE, as GGUF's smollm3 runs it */
        json_object *nr = json_object_new_array();
        for (uint32_t il = 0; il < w->L; il++) json_object_array_add(nr, json_object_new_int((il + 1) % 4 != 0));
        ADD("no_rope_layers", nr);
        ADD("no_rope_layer_interval", json_object_new_int(4));
    }
    if (w->arch == HF_PHI3) {
        ADD("original_max_position_embeddings", json_object_new_int64(w->ctx_orig));
        char part[32];
        snprintf(part, sizeof part, "%.17g", (double)w->rot / w->HD);
        ADD("partial_rotary_factor", json_object_new_double_s((double)w->rot / w->HD, part));
    }
    ADD("tie_word_embeddings", json_object_new_boolean(tied));
    ADD("bos_token_id", json_object_new_int64(w->bos));
    ADD("eos_token_id", json_object_new_int64(w->eos));
    ADD("torch_dtype", json_object_new_string(dt));
#undef ADD
    const char *text = json_object_to_json_string_ext(c, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
    int rc = text ? write_text(o, path, text) : KVLLM_ENOMEM;
    json_object_put(c);
    return rc;
}

static int write_config(struct out_file *o, const char *path, const struct w_hparams *w, int64_t n_vocab, bool tied, const char *dt) {
    if (w->arch == HF_QWEN3 || w->arch == HF_GEMMA2 || w->arch == HF_GEMMA3 || w->arch == HF_PHI3 ||
        w->arch == HF_SMOLLM3)
        return write_config_family(o, path, w, n_vocab, tied, dt);
    char eps_s[32], theta_s[32], rope_s[96], text[4096];
    fmt_float(eps_s, sizeof eps_s, w->eps);
    fmt_float(theta_s, sizeof theta_s, w->theta);
    if (w->arch == HF_GPT2) {
        snprintf(text, sizeof text,
                 "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
                 "  \"n_embd\": %u,\n  \"n_layer\": %u,\n  \"n_head\": %u,\n  \"n_inner\": %u,\n"
                 "  \"n_positions\": %u,\n  \"n_ctx\": %u,\n  \"vocab_size\": %lld,\n  \"layer_norm_epsilon\": %s,\n"
                 "  \"activation_function\": \"gelu_new\",\n  \"tie_word_embeddings\": %s,\n"
                 "  \"bos_token_id\": %u,\n  \"eos_token_id\": %u,\n  \"torch_dtype\": \"%s\"\n}\n",
                 w->E, w->L, w->H, w->FF, w->CTX, w->CTX, (long long)n_vocab, eps_s, tied ? "true" : "false", w->bos,
                 w->eos, dt);
        return write_text(o, path, text);
    }
    const char *archs = w->arch == HF_QWEN2 ? "Qwen2ForCausalLM" : w->mistral ? "MistralForCausalLM" : "LlamaForCausalLM";
    const char *type = w->arch == HF_QWEN2 ? "qwen2" : w->mistral ? "mistral" : "llama";
    if (w->rope_linear) {
        char f[32];
        fmt_float(f, sizeof f, w->rope_linear);
        snprintf(rope_s, sizeof rope_s, "{\"rope_type\": \"linear\", \"type\": \"linear\", \"factor\": %s}", f);
    } else {
        snprintf(rope_s, sizeof rope_s, "null");
    }
    char extra[128] = "";
    if (w->arch == HF_QWEN2) snprintf(extra, sizeof extra, "  \"use_sliding_window\": false,\n");
    else if (w->mistral && w->swa) snprintf(extra, sizeof extra, "  \"sliding_window\": %u,\n", w->swa);
    else if (w->mistral) snprintf(extra, sizeof extra, "  \"sliding_window\": null,\n");
    snprintf(text, sizeof text,
             "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
             "  \"hidden_size\": %u,\n  \"intermediate_size\": %u,\n  \"num_hidden_layers\": %u,\n"
             "  \"num_attention_heads\": %u,\n  \"num_key_value_heads\": %u,\n  \"head_dim\": %u,\n"
             "  \"max_position_embeddings\": %u,\n  \"vocab_size\": %lld,\n  \"rms_norm_eps\": %s,\n"
             "  \"rope_theta\": %s,\n  \"rope_scaling\": %s,\n  \"hidden_act\": \"silu\",\n%s"
             "%s  \"tie_word_embeddings\": %s,\n"
             "  \"bos_token_id\": %u,\n  \"eos_token_id\": %u,\n  \"torch_dtype\": \"%s\"\n}\n",
             archs, type, w->E, w->FF, w->L, w->H, w->HKV, w->E / w->H, w->CTX, (long long)n_vocab, eps_s, theta_s,
             rope_s, extra, w->arch == HF_QWEN2 ? "" : "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n",
             tied ? "true" : "false", w->bos, w->eos, dt);
    return write_text(o, path, text);
}

/* Conv1D layout: GGUF rows of out (ne0 = in) -> HF (in, out) row-major. */
static void transpose(uint8_t *dst, const uint8_t *src, int64_t n_in, int64_t n_out, size_t esize) {
    for (int64_t o = 0; o < n_out; o++)
        for (int64_t i = 0; i < n_in; i++)
            memcpy(dst + ((size_t)i * (size_t)n_out + (size_t)o) * esize,
                   src + ((size_t)o * (size_t)n_in + (size_t)i) * esize, esize);
}

int hf_write(const struct gguf *g, const char *dir) {
    struct w_hparams w;
    int rc = read_w_hparams(g, &w);
    if (rc) return rc;
    const uint32_t HD = w.HD, H = w.H, HKV = w.HKV;
    const struct gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    if (!emb) {
        LOG_ERR("%s: no token_embd.weight", g->path);
        return KVLLM_EFORMAT;
    }
    const bool tied = !gguf_find_tensor(g, "output.weight");
    const char *torch_dtype = emb->type == DTYPE_F16 ? "float16" : emb->type == DTYPE_BF16 ? "bfloat16" : "float32";

    /* entry k of the safetensors file is tensor idx[k] of g (Phi-3's LongRoPE factors go to config.json) */
    struct st_write_entry *e = xcalloc(g->n_tensors ? g->n_tensors : 1, sizeof *e);
    char (*names)[96] = xcalloc(g->n_tensors ? g->n_tensors : 1, sizeof *names);
    int *perms = xcalloc(g->n_tensors ? g->n_tensors : 1, sizeof *perms);
    uint64_t *idx = xcalloc(g->n_tensors ? g->n_tensors : 1, sizeof *idx), n_e = 0;
    char *st_path = hf_path_join(dir, "model.safetensors"), *cfg_path = hf_path_join(dir, "config.json"),
         *gen_path = hf_path_join(dir, "generation_config.json");
    rc = e && names && perms && idx && st_path && cfg_path && gen_path ? 0 : KVLLM_ENOMEM;
    for (uint64_t i = 0; !rc && i < g->n_tensors; i++) {
        const struct gguf_tensor *t = &g->tensors[i];
        if (t == w.rope_long || t == w.rope_short) continue;
        const uint64_t k = n_e++;
        idx[k] = i;
        char gn[96];
        snprintf(gn, sizeof gn, "%.*s", (int)(t->name.len < 95 ? t->name.len : 95), t->name.ptr);
        if (!hf_name(w.arch, gn, names[k], sizeof names[k], &perms[k])) {
            LOG_ERR("%s: tensor '%s' has no Hugging Face %s name", g->path, gn, hf_gguf_arch[w.arch]);
            rc = KVLLM_EUNSUPPORTED;
        } else if (!st_dtype_name(t->type)) {
            LOG_ERR("%s: tensor '%s' has type %s; only F32, F16 and BF16 can be written to safetensors", g->path,
                    gn, dtype_name(t->type));
            rc = KVLLM_EUNSUPPORTED;
        } else if (t->n_dims < 1 || t->n_dims > 2 || (perms[k] == PERM_T && t->n_dims != 2)) {
            LOG_ERR("%s: tensor '%s' has %u dimensions", g->path, gn, t->n_dims);
            rc = KVLLM_EFORMAT;
        } else if (perms[k] == PERM_SHIFT && t->type != DTYPE_F32) {
            LOG_ERR("%s: tensor '%s' has type %s; Gemma's norms are F32", g->path, gn, dtype_name(t->type));
            rc = KVLLM_EFORMAT;
        } else {
            e[k].name = names[k];
            e[k].dtype = t->type;
            e[k].n_dims = t->n_dims;
            for (uint32_t d = 0; d < t->n_dims; d++)
                e[k].shape[d] = perms[k] == PERM_T ? t->ne[d] : t->ne[t->n_dims - 1 - d];
            int64_t nh = perms[k] == PERM_Q ? H : HKV;
            if ((perms[k] == PERM_Q || perms[k] == PERM_K) && (t->n_dims != 2 || t->ne[1] != nh * (int64_t)HD)) {
                LOG_ERR("%s: tensor '%s' does not have %lld rows", g->path, gn, (long long)nh * HD);
                rc = KVLLM_EFORMAT;
            }
        }
    }
    if (!rc && mkdir(dir, 0777) != 0 && errno != EEXIST) {
        LOG_ERR("%s: cannot create directory: %s", dir, strerror(errno));
        rc = KVLLM_EIO;
    }
    /* every file is staged (complete, fsynced) beside its target and renamed
     * into place only once all of them, the tokenizer included, are written */
    struct out_file f_st = { 0 }, f_cfg = { 0 }, f_gen = { 0 };
    if (!rc) rc = out_file_open(&f_st, st_path);
    FILE *f = f_st.f;
    if (!rc) rc = st_write_header(f, st_path, e, n_e);
    uint8_t *tmp = NULL;
    for (uint64_t k = 0; !rc && k < n_e; k++) {
        const struct gguf_tensor *t = &g->tensors[idx[k]];
        const void *src = t->data;
        if (perms[k] != PERM_NONE) {
            free(tmp);
            if (!(tmp = xmalloc((size_t)t->n_bytes))) { rc = KVLLM_ENOMEM; break; }
            if (perms[k] == PERM_T) {
                transpose(tmp, t->data, t->ne[0], t->ne[1], (size_t)(t->n_bytes / t->n_elems));
            } else if (perms[k] == PERM_SHIFT) {
                const float *in = t->data;
                float *out = (float *)tmp;
                for (uint64_t j = 0; j < t->n_elems; j++) out[j] = in[j] - 1.0f;
            } else {
                int64_t nh = perms[k] == PERM_Q ? H : HKV;
                hf_permute_rows(tmp, t->data, nh, HD, (size_t)(t->n_bytes / (uint64_t)t->ne[1]), false);
            }
            src = tmp;
        }
        if (fwrite(src, 1, (size_t)t->n_bytes, f) != (size_t)t->n_bytes) {
            LOG_ERR("%s: write failed", st_path);
            rc = KVLLM_EIO;
        }
    }
    free(tmp);
    if (!rc) rc = out_file_finish(&f_st);
    if (!rc) rc = write_config(&f_cfg, cfg_path, &w, emb->ne[1], tied, torch_dtype);
    if (!rc) {
        char text[256];
        snprintf(text, sizeof text, "{\n  \"bos_token_id\": %u,\n  \"eos_token_id\": %u\n}\n", w.bos, w.eos);
        rc = write_text(&f_gen, gen_path, text);
    }
    if (!rc) rc = hf_tokenizer_write(g, dir);
    if (!rc) rc = out_file_commit(&f_st);
    if (!rc) rc = out_file_commit(&f_cfg);
    if (!rc) rc = out_file_commit(&f_gen);
    out_file_abort(&f_gen); /* no-ops once committed */
    out_file_abort(&f_cfg);
    out_file_abort(&f_st);
    free(gen_path);
    free(cfg_path);
    free(st_path);
    free(idx);
    free(perms);
    free(names);
    free(e);
    return rc;
}
