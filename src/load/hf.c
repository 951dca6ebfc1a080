/* hf.c — Hugging Face Llama/Mistral/Qwen2/GPT-2/Qwen3/Gemma 2/Gemma 3/Phi-3/
 * SmolLM3/Mixtral/Qwen3-MoE folders read as an in-memory GGUF (see hf.h); writing one is
 * hf_write.c.
 *
 * config.json -> <arch>.* keys, as llama.cpp's converter writes them; the shards are mapped back to back
 * into one reservation (each at a page boundary) so that the gguf's single
 * file_map owns them all; each shard's header is validated by st_parse and
 * its tensors are renamed to GGUF names.  Every error is logged once, where
 * it is found, with the file (and tensor) it concerns. */
#include "load/hf.h"
#include "load/hf_internal.h"
#include "load/safetensors.h"
#include "tensor/dtype.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HF_MAX_SHARDS 4096
#define HF_JSON_DEPTH 32

bool hf_is_folder(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* ---- JSON files ---- */

/* Parse a whole JSON file; logs "<path>: ..." on failure. */
int hf_read_json(const char *path, json_object **out) {
    *out = NULL;
    struct file_map fm;
    int rc = file_map_open(&fm, path);
    if (rc) return rc;
    if (fm.size > (size_t)INT_MAX) {
        LOG_ERR("%s: JSON file too large (%zu bytes)", path, fm.size);
        file_map_close(&fm);
        return KVLLM_EFORMAT;
    }
    json_tokener *tok = json_tokener_new_ex(HF_JSON_DEPTH);
    if (!tok) { file_map_close(&fm); LOG_ERR("%s: out of memory", path); return KVLLM_ENOMEM; }
    json_object *root = fm.size ? json_tokener_parse_ex(tok, (const char *)fm.data, (int)fm.size) : NULL;
    enum json_tokener_error jerr = fm.size ? json_tokener_get_error(tok) : json_tokener_continue;
    size_t used = fm.size ? json_tokener_get_parse_end(tok) : 0;
    json_tokener_free(tok);
    bool trailing_ok = true;
    for (size_t i = used; root && i < fm.size; i++)
        if (!strchr(" \t\r\n", fm.data[i]) || !fm.data[i]) trailing_ok = false;
    file_map_close(&fm);
    if (!root || jerr != json_tokener_success || !trailing_ok) {
        LOG_ERR("%s: malformed JSON: %s (byte %zu)", path,
                root ? "trailing data after the value"
                     : jerr == json_tokener_continue || jerr == json_tokener_success ? "the JSON ends early"
                                                                                     : json_tokener_error_desc(jerr),
                used);
        json_object_put(root);
        return KVLLM_EFORMAT;
    }
    if (!json_object_is_type(root, json_type_object)) {
        LOG_ERR("%s: malformed JSON: the top level is not an object", path);
        json_object_put(root);
        return KVLLM_EFORMAT;
    }
    *out = root;
    return 0;
}

/* config.json fields: absent or null -> default (or an error when required). */
static json_object *cfg_get(json_object *o, const char *key) {
    json_object *v;
    return json_object_object_get_ex(o, key, &v) && v ? v : NULL;
}

static int cfg_int(const char *path, json_object *cfg, const char *key, bool required, int64_t lo, int64_t hi,
                   int64_t def, int64_t *out) {
    json_object *v = cfg_get(cfg, key);
    if (!v) {
        if (!required) { *out = def; return 0; }
        LOG_ERR("%s: missing required field \"%s\"", path, key);
        return KVLLM_EFORMAT;
    }
    int64_t x = json_object_is_type(v, json_type_int) ? json_object_get_int64(v) : INT64_MIN;
    if (x < lo || x > hi) {
        LOG_ERR("%s: \"%s\" must be an integer in [%lld, %lld], got %.40s", path, key, (long long)lo, (long long)hi,
                json_object_to_json_string(v));
        return KVLLM_EFORMAT;
    }
    *out = x;
    return 0;
}

static int cfg_float(const char *path, json_object *cfg, const char *key, double lo, double hi, double def,
                     double *out) {
    json_object *v = cfg_get(cfg, key);
    if (!v) { *out = def; return 0; }
    double x = json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)
                   ? json_object_get_double(v) : NAN;
    if (!(x >= lo && x <= hi)) {
        LOG_ERR("%s: \"%s\" must be a number in [%g, %g], got %.40s", path, key, lo, hi,
                json_object_to_json_string(v));
        return KVLLM_EFORMAT;
    }
    *out = x;
    return 0;
}

static int cfg_bool(const char *path, json_object *cfg, const char *key, bool def, bool *out) {
    json_object *v = cfg_get(cfg, key);
    if (!v) { *out = def; return 0; }
    if (!json_object_is_type(v, json_type_boolean)) {
        LOG_ERR("%s: \"%s\" must be true or false, got %.40s", path, key, json_object_to_json_string(v));
        return KVLLM_EFORMAT;
    }
    *out = json_object_get_boolean(v);
    return 0;
}

struct hf_hparams {
    enum hf_arch arch;
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    int64_t head_dim;   /* n_embd / n_head, but Qwen3's and Gemma 3's own (GGUF: key_length) */
    int64_t n_rot;      /* rotated dims: head_dim, or Phi-3's partial_rotary_factor of it */
    int64_t n_ctx_orig; /* Phi-3's original_max_position_embeddings */
    int64_t n_swa;      /* Mistral, Gemma 3 sliding_window, 0 when absent/null */
    double eps, theta;
    double attn_softcap, final_softcap; /* Gemma 3: 0 when null */
    bool tied;
    /* mixture of experts (Mixtral, Qwen3-MoE; 0: a dense FFN): experts per layer, per token, and one
     * expert's width (Qwen3-MoE's moe_intermediate_size, Mixtral's intermediate_size) */
    int64_t n_expert, n_expert_used, n_ff_exp;
    /* rope_scaling: 0 none, 1 linear (factor), 2 llama3 (factor, low/high_freq_factor, original context),
     * 3 LongRoPE (Phi-3: per-pair factors, attention factor) */
    int rope_scaling;
    double rs_factor, rs_low, rs_high, rs_orig, rs_attn;
    json_object *rs_long, *rs_short;   /* LongRoPE's factor arrays, in the config (not owned) */
};

const char *const hf_gguf_arch[HF_ARCH_COUNT_] = { "llama", "qwen2", "gpt2", "qwen3", "gemma3", "phi3", "gemma2",
                                                    "smollm3" };

/* rope_scaling (object or null): none, linear, llama3, or Phi-3's longrope; anything else is refused. */
static int read_rope_scaling(const char *path, json_object *cfg, struct hf_hparams *hp) {
    json_object *rs = cfg_get(cfg, "rope_scaling");
    hp->rope_scaling = 0;
    if (!rs) return 0;
    json_object *ty = json_object_is_type(rs, json_type_object) ? cfg_get(rs, "rope_type") : NULL;
    if (!ty && json_object_is_type(rs, json_type_object)) ty = cfg_get(rs, "type");
    const char *t = ty && json_object_is_type(ty, json_type_string) ? json_object_get_string(ty) : NULL;
    int rc;
    if (t && !strcmp(t, "default")) return 0;
    if (t && !strcmp(t, "linear")) {
        hp->rope_scaling = 1;
        return cfg_float(path, rs, "factor", 1e-3, 1e6, 1.0, &hp->rs_factor);
    }
    if (t && !strcmp(t, "llama3")) {
        hp->rope_scaling = 2;
        if ((rc = cfg_float(path, rs, "factor", 1e-3, 1e6, 8.0, &hp->rs_factor)) ||
            (rc = cfg_float(path, rs, "low_freq_factor", 1e-6, 1e6, 1.0, &hp->rs_low)) ||
            (rc = cfg_float(path, rs, "high_freq_factor", 1e-6, 1e6, 4.0, &hp->rs_high)) ||
            (rc = cfg_float(path, rs, "original_max_position_embeddings", 1, 1 << 30, 8192, &hp->rs_orig)))
            return rc;
        if (!(hp->rs_high > hp->rs_low)) {
            LOG_ERR("%s: rope_scaling high_freq_factor %g must exceed low_freq_factor %g", path, hp->rs_high,
                    hp->rs_low);
            return KVLLM_EFORMAT;
        }
        return 0;
    }
    if (t && (!strcmp(t, "longrope") || !strcmp(t, "su")) && hp->arch == HF_PHI3) {
        hp->rope_scaling = 3;
        hp->rs_long = cfg_get(rs, "long_factor");
        hp->rs_short = cfg_get(rs, "short_factor");
        return cfg_float(path, rs, "attention_factor", 1e-3, 1e3, 0.0, &hp->rs_attn);   /* 0: from the contexts */
    }
    LOG_ERR("%s: rope_scaling %.80s is not supported (supported: linear, llama3, longrope for Phi-3)", path,
            json_object_to_json_string(rs));
    return KVLLM_EUNSUPPORTED;
}

/* GPT-2's config.json (n_embd, n_layer, n_head, n_inner, n_positions, layer_norm_epsilon). */
static int read_config_gpt2(const char *path, json_object *cfg, struct hf_hparams *hp) {
    const int64_t big = 1 << 20;
    int rc;
    if ((rc = cfg_int(path, cfg, "n_embd", true, 1, big, 0, &hp->n_embd)) ||
        (rc = cfg_int(path, cfg, "n_layer", true, 1, 4096, 0, &hp->n_layer)) ||
        (rc = cfg_int(path, cfg, "n_head", true, 1, 4096, 0, &hp->n_head)) ||
        (rc = cfg_int(path, cfg, "n_inner", false, 1, 4 * big, 4 * hp->n_embd, &hp->n_ff)) ||
        (rc = cfg_int(path, cfg, "vocab_size", true, 1, 1 << 24, 0, &hp->n_vocab)) ||
        (rc = cfg_int(path, cfg, "n_positions", false, 1, 1 << 24, 1024, &hp->n_ctx)) ||
        (rc = cfg_float(path, cfg, "layer_norm_epsilon", 0.0, 1.0, 1e-5, &hp->eps)) ||
        (rc = cfg_bool(path, cfg, "tie_word_embeddings", true, &hp->tied)))
        return rc;
    hp->n_head_kv = hp->n_head;
    hp->theta = 10000.0;
    hp->n_swa = 0;
    hp->rope_scaling = 0;
    if (hp->n_embd % hp->n_head) {
        LOG_ERR("%s: n_embd %lld is not a multiple of n_head %lld", path, (long long)hp->n_embd, (long long)hp->n_head);
        return KVLLM_EFORMAT;
    }
    hp->head_dim = hp->n_embd / hp->n_head;
    json_object *act = cfg_get(cfg, "activation_function");
    const char *as = act && json_object_is_type(act, json_type_string) ? json_object_get_string(act) : NULL;
    if (act && (!as || (strcmp(as, "gelu_new") && strcmp(as, "gelu_pytorch_tanh")))) {
        LOG_ERR("%s: activation_function %.40s is not supported (only the tanh GELU, \"gelu_new\")", path,
                json_object_to_json_string(act));
        return KVLLM_EUNSUPPORTED;
    }
    return 0;
}

/* What Gemma 2 and 3 add: sliding layers (every other one; five in six
 * for Gemma 3, with their own RoPE base), an attention scale and
 * soft-caps.  GGUF has keys for the window and the soft-caps only; the
 * pattern, the sliding layers' base and the scale are the family's
 * (src/model/model.c, as in llama.cpp), so a config that differs from them
 * is refused rather than run differently. */
static int read_config_gemma(const char *path, json_object *cfg, struct hf_hparams *hp) {
    const bool g2 = hp->arch == HF_GEMMA2;
    const int64_t want = g2 ? 2 : 6;
    int64_t period;
    double local_base, scalar;
    bool bidir;
    json_object *v;
    /* Gemma 2's soft-caps are 50 and 30 unless null turns them off; Gemma 3 has none */
    const bool attn_cap = json_object_object_get_ex(cfg, "attn_logit_softcapping", &v),
               final_cap = json_object_object_get_ex(cfg, "final_logit_softcapping", &v);
    int rc;
    if ((rc = cfg_int(path, cfg, "sliding_window_pattern", false, 1, 4096, want, &period)) ||
        (rc = cfg_float(path, cfg, "rope_local_base_freq", 1.0, 1e12, 10000.0, &local_base)) ||
        (rc = cfg_float(path, cfg, "query_pre_attn_scalar", 1.0, 1e9, 256.0, &scalar)) ||
        (rc = cfg_float(path, cfg, "attn_logit_softcapping", 0.0, 1e6, g2 && !attn_cap ? 50.0 : 0.0,
                        &hp->attn_softcap)) ||
        (rc = cfg_float(path, cfg, "final_logit_softcapping", 0.0, 1e6, g2 && !final_cap ? 30.0 : 0.0,
                        &hp->final_softcap)) ||
        (rc = cfg_bool(path, cfg, "use_bidirectional_attention", false, &bidir)))
        return rc;
    if (g2) local_base = 10000.0;   /* one base for every layer: the file's */
    /* layer il slides unless (il + 1) % want == 0; layer_types, when given, spells that out */
    json_object *lt = cfg_get(cfg, "layer_types");
    if (lt && (!json_object_is_type(lt, json_type_array) || (int64_t)json_object_array_length(lt) != hp->n_layer)) {
        LOG_ERR("%s: \"layer_types\" must be an array of num_hidden_layers (%lld) strings", path,
                (long long)hp->n_layer);
        return KVLLM_EFORMAT;
    }
    for (int64_t il = 0; il < hp->n_layer && (lt || period != want); il++) {
        const char *kind = (il + 1) % want ? "sliding_attention" : "full_attention";
        json_object *e = lt ? json_object_array_get_idx(lt, (size_t)il) : NULL;
        const char *got = e && json_object_is_type(e, json_type_string) ? json_object_get_string(e) : "?";
        if (!lt || strcmp(got, kind)) {
            LOG_ERR("%s: %s%lld%s: Gemma %c in GGUF has every %s layer global and the others sliding", path,
                    lt ? "layer_types[" : "sliding_window_pattern ", lt ? (long long)il : (long long)period,
                    lt ? "] differs" : "", g2 ? '2' : '3', g2 ? "second" : "sixth");
            return KVLLM_EUNSUPPORTED;
        }
    }
    /* the 27Bs' (46 layers for Gemma 2, 62 for Gemma 3) scale by n_embd / n_head */
    const int64_t scale_dim = hp->n_layer == (g2 ? 46 : 62) ? hp->n_embd / hp->n_head : hp->head_dim;
    if (local_base != 10000.0 || scalar != (double)scale_dim || bidir) {
        LOG_ERR("%s: %s is not what GGUF's %s runs (rope_local_base_freq 10000, query_pre_attn_scalar "
                "%lld, causal attention)", path, local_base != 10000.0 ? "rope_local_base_freq"
                : scalar != (double)scale_dim ? "query_pre_attn_scalar" : "use_bidirectional_attention",
                hf_gguf_arch[hp->arch], (long long)scale_dim);
        return KVLLM_EUNSUPPORTED;
    }
    return 0;
}

/* Phi-3's partial rotary, original context and LongRoPE factors.  Its
 * sliding_window is dropped: kvllm's phi3, as llama.cpp, does not run it
 * (the configs carry windows the models were not run with). */
static int read_config_phi3(const char *path, json_object *cfg, struct hf_hparams *hp) {
    double part;
    int rc;
    hp->n_swa = 0;
    if ((rc = cfg_float(path, cfg, "partial_rotary_factor", 0.0, 1.0, 1.0, &part)) ||
        (rc = cfg_int(path, cfg, "original_max_position_embeddings", false, 2, 1 << 24, hp->n_ctx, &hp->n_ctx_orig)))
        return rc;
    hp->n_rot = (int64_t)(part * (double)hp->head_dim);
    if (hp->n_rot % 2) {
        LOG_ERR("%s: partial_rotary_factor %g of head_dim %lld: %lld rotated dimensions, which must be even", path,
                part, (long long)hp->head_dim, (long long)hp->n_rot);
        return KVLLM_EFORMAT;
    }
    if (hp->rope_scaling != 3) return 0;
    if (hp->n_rot < 2) {
        LOG_ERR("%s: rope_scaling longrope with partial_rotary_factor %g: no dimensions rotate", path, part);
        return KVLLM_EFORMAT;
    }
    json_object *f[2] = { hp->rs_long, hp->rs_short };
    for (int i = 0; i < 2; i++) {
        bool ok = f[i] && json_object_is_type(f[i], json_type_array) &&
                  (int64_t)json_object_array_length(f[i]) == hp->n_rot / 2;
        for (size_t j = 0; ok && j < json_object_array_length(f[i]); j++) {
            json_object *v = json_object_array_get_idx(f[i], j);
            double x = json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)
                           ? json_object_get_double(v) : NAN;
            ok = x > 0 && x < 1e30;
        }
        if (!ok) {
            LOG_ERR("%s: rope_scaling.%s must be an array of %lld positive numbers (half the rotated dimensions)",
                    path, i ? "short_factor" : "long_factor", (long long)(hp->n_rot / 2));
            return KVLLM_EFORMAT;
        }
    }
    if (hp->rs_attn == 0.0) {   /* Transformers' and llama.cpp's converter's default */
        const double scale = (double)hp->n_ctx / (double)hp->n_ctx_orig;
        hp->rs_attn = scale > 1.0 ? sqrt(1 + log(scale) / log((double)hp->n_ctx_orig)) : 1.0;
    }
    return 0;
}

/* SmolLM3's layers without RoPE: GGUF's smollm3 has every fourth one so
 * (no key for it, as in llama.cpp), which no_rope_layers (1: rotated) and
 * no_rope_layer_interval must say. */
static int read_config_smollm3(const char *path, json_object *cfg, const struct hf_hparams *hp) {
    int64_t interval;
    int rc;
    if ((rc = cfg_int(path, cfg, "no_rope_layer_interval", false, 1, 4096, 4, &interval))) return rc;
    json_object *nr = cfg_get(cfg, "no_rope_layers");
    if (nr && (!json_object_is_type(nr, json_type_array) || (int64_t)json_object_array_length(nr) != hp->n_layer)) {
        LOG_ERR("%s: \"no_rope_layers\" must be an array of num_hidden_layers (%lld) integers", path,
                (long long)hp->n_layer);
        return KVLLM_EFORMAT;
    }
    for (int64_t il = 0; il < hp->n_layer && (nr || interval != 4); il++) {
        json_object *e = nr ? json_object_array_get_idx(nr, (size_t)il) : NULL;
        const int64_t got = e && json_object_is_type(e, json_type_int) ? json_object_get_int64(e) : -1;
        if (!nr || got != ((il + 1) % 4 != 0)) {
            LOG_ERR("%s: %s%lld%s: SmolLM3 in GGUF has every fourth layer without RoPE and the others with it", path,
                    nr ? "no_rope_layers[" : "no_rope_layer_interval ", nr ? (long long)il : (long long)interval,
                    nr ? "] differs" : "");
            return KVLLM_EUNSUPPORTED;
        }
    }
    return 0;
}

/* The experts of Mixtral (num_local_experts) and Qwen3-MoE (num_experts,
 * moe_intermediate_size): every layer's FFN is n_expert experts of which
 * each token uses the num_experts_per_tok best, their router weights
 * renormalized to sum 1 (GGUF's llama and qwen3moe, as llama.cpp runs them),
 * so a Qwen3-MoE config that does not renormalize (norm_topk_prob false, the
 * Transformers default) or keeps dense layers (decoder_sparse_step,
 * mlp_only_layers) is refused rather than run differently. */
static int read_config_moe(const char *path, json_object *cfg, bool qwen, struct hf_hparams *hp) {
    int64_t step;
    bool norm;
    int rc;
    if ((rc = cfg_int(path, cfg, qwen ? "num_experts" : "num_local_experts", true, 1, 4096, 0, &hp->n_expert)) ||
        (rc = cfg_int(path, cfg, "num_experts_per_tok", true, 1, 4096, 0, &hp->n_expert_used)))
        return rc;
    if (hp->n_expert_used > hp->n_expert) {
        LOG_ERR("%s: num_experts_per_tok %lld is more than the %lld experts (%s)", path, (long long)hp->n_expert_used,
                (long long)hp->n_expert, qwen ? "num_experts" : "num_local_experts");
        return KVLLM_EFORMAT;
    }
    hp->n_ff_exp = hp->n_ff;
    if (!qwen) return 0;
    if ((rc = cfg_int(path, cfg, "moe_intermediate_size", true, 1, 1 << 22, 0, &hp->n_ff_exp)) ||
        (rc = cfg_int(path, cfg, "decoder_sparse_step", false, 1, 4096, 1, &step)) ||
        (rc = cfg_bool(path, cfg, "norm_topk_prob", false, &norm)))
        return rc;
    json_object *dense = cfg_get(cfg, "mlp_only_layers");
    if (dense && (!json_object_is_type(dense, json_type_array) || json_object_array_length(dense))) {
        LOG_ERR("%s: mlp_only_layers %.60s: layers without experts are not supported (GGUF's qwen3moe has experts "
                "in every layer)", path, json_object_to_json_string(dense));
        return KVLLM_EUNSUPPORTED;
    }
    if (step != 1) {
        LOG_ERR("%s: decoder_sparse_step %lld: layers without experts are not supported (GGUF's qwen3moe has "
                "experts in every layer)", path, (long long)step);
        return KVLLM_EUNSUPPORTED;
    }
    if (!norm) {
        LOG_ERR("%s: norm_topk_prob %s: kvllm, as llama.cpp's qwen3moe, renormalizes the chosen experts' weights; "
                "unnormalized routing is not supported", path, cfg_get(cfg, "norm_topk_prob") ? "false"
                : "absent (Transformers' default is false)");
        return KVLLM_EUNSUPPORTED;
    }
    return 0;
}

/* Check the architecture and read the hyper-parameters. */
static int read_config(const char *path, json_object *cfg, struct hf_hparams *hp) {
    static const char *archs[] = { "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "GPT2LMHeadModel",
                                   "Qwen3ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "Gemma2ForCausalLM",
                                   "SmolLM3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM" };
    static const char *types[] = { "llama", "mistral", "qwen2", "gpt2", "qwen3", "gemma3_text", "phi3", "gemma2",
                                   "smollm3", "mixtral", "qwen3_moe" };
    static const enum hf_arch ids[] = { HF_LLAMA, HF_LLAMA, HF_QWEN2, HF_GPT2, HF_QWEN3, HF_GEMMA3, HF_PHI3,
                                        HF_GEMMA2, HF_SMOLLM3, HF_LLAMA, HF_QWEN3 };
    static const bool experts[] = { [9] = true, [10] = true };   /* Mixtral, Qwen3-MoE */
    size_t which = 0;
    const size_t n_archs = sizeof archs / sizeof *archs;
    json_object *a = cfg_get(cfg, "architectures"), *t = cfg_get(cfg, "model_type");
    const char *name = NULL;
    bool known = false;
    if (a) {
        json_object *a0 = json_object_is_type(a, json_type_array) && json_object_array_length(a) > 0
                              ? json_object_array_get_idx(a, 0) : NULL;
        if (!a0 || !json_object_is_type(a0, json_type_string)) {
            LOG_ERR("%s: \"architectures\" must be an array of strings", path);
            return KVLLM_EFORMAT;
        }
        name = json_object_get_string(a0);
        for (size_t i = 0; i < n_archs; i++)
            if (!strcmp(name, archs[i])) { known = true; hp->arch = ids[i]; which = i; }
    } else if (t) {
        if (!json_object_is_type(t, json_type_string)) {
            LOG_ERR("%s: \"model_type\" must be a string", path);
            return KVLLM_EFORMAT;
        }
        name = json_object_get_string(t);
        for (size_t i = 0; i < n_archs; i++)
            if (!strcmp(name, types[i])) { known = true; hp->arch = ids[i]; which = i; }
    } else {
        LOG_ERR("%s: neither \"architectures\" nor \"model_type\" is given", path);
        return KVLLM_EFORMAT;
    }
    if (!known) {
        LOG_ERR("%s: unknown architecture '%.64s' (supported: LlamaForCausalLM, MistralForCausalLM, "
                "Qwen2ForCausalLM, GPT2LMHeadModel, Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, "
                "Phi3ForCausalLM, SmolLM3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM)", path, name);
        return KVLLM_EUNSUPPORTED;
    }
    hp->attn_softcap = hp->final_softcap = 0.0;
    if (hp->arch == HF_GPT2) return read_config_gpt2(path, cfg, hp);
    const bool gemma = hp->arch == HF_GEMMA2 || hp->arch == HF_GEMMA3;
    const bool own_hd = hp->arch == HF_QWEN3 || gemma;   /* head_dim need not be hidden_size / heads */
    const int64_t big = 1 << 20;
    int rc;
    if ((rc = cfg_int(path, cfg, "hidden_size", true, 1, big, 0, &hp->n_embd)) ||
        (rc = cfg_int(path, cfg, "num_hidden_layers", true, 1, 4096, 0, &hp->n_layer)) ||
        (rc = cfg_int(path, cfg, "num_attention_heads", true, 1, 4096, 0, &hp->n_head)) ||
        (rc = cfg_int(path, cfg, "num_key_value_heads", false, 1, 4096, hp->n_head, &hp->n_head_kv)) ||
        (rc = cfg_int(path, cfg, "intermediate_size", true, 1, 4 * big, 0, &hp->n_ff)) ||
        (rc = cfg_int(path, cfg, "vocab_size", true, 1, 1 << 24, 0, &hp->n_vocab)) ||
        (rc = cfg_int(path, cfg, "max_position_embeddings", false, 1, 1 << 24, 2048, &hp->n_ctx)) ||
        (rc = cfg_float(path, cfg, "rms_norm_eps", 0.0, 1.0, 1e-6, &hp->eps)) ||
        (rc = cfg_float(path, cfg, "rope_theta", 1.0, 1e12, 10000.0, &hp->theta)) ||
        (rc = cfg_bool(path, cfg, "tie_word_embeddings", gemma, &hp->tied)) ||
        (rc = cfg_int(path, cfg, "sliding_window", false, 1, INT32_MAX, gemma ? 4096 : 0, &hp->n_swa)))
        return rc;
    if (hp->n_head % hp->n_head_kv || (!own_hd && (hp->n_embd % hp->n_head || (hp->n_embd / hp->n_head) % 2))) {
        LOG_ERR("%s: hidden_size %lld, num_attention_heads %lld, num_key_value_heads %lld: heads must divide "
                "hidden_size into an even head size and kv heads must divide heads", path, (long long)hp->n_embd,
                (long long)hp->n_head, (long long)hp->n_head_kv);
        return KVLLM_EFORMAT;
    }
    /* Transformers' defaults: Qwen3 128, Gemma 256 */
    const int64_t hd_def = hp->arch == HF_QWEN3 ? 128 : gemma ? 256 : hp->n_embd / hp->n_head;
    if ((rc = cfg_int(path, cfg, "head_dim", false, 1, big, hd_def, &hp->head_dim))) return rc;
    if (hp->head_dim % 2) {
        LOG_ERR("%s: head_dim %lld must be even", path, (long long)hp->head_dim);
        return KVLLM_EFORMAT;
    }
    if (!own_hd && hp->head_dim != hp->n_embd / hp->n_head) {
        LOG_ERR("%s: head_dim %lld differs from hidden_size / num_attention_heads (not supported)", path,
                (long long)hp->head_dim);
        return KVLLM_EUNSUPPORTED;
    }
    hp->n_rot = hp->head_dim;
    /* Gemma names it hidden_activation (tanh GELU, its GeGLU); the others hidden_act (SwiGLU) */
    const char *act_key = gemma && cfg_get(cfg, "hidden_activation") ? "hidden_activation" : "hidden_act";
    const char *act_want = gemma ? "gelu_pytorch_tanh" : "silu";
    json_object *act = cfg_get(cfg, act_key);
    if (act && (!json_object_is_type(act, json_type_string) || strcmp(json_object_get_string(act), act_want))) {
        LOG_ERR("%s: %s %.40s is not supported (only \"%s\")", path, act_key, json_object_to_json_string(act),
                act_want);
        return KVLLM_EUNSUPPORTED;
    }
    if ((rc = read_rope_scaling(path, cfg, hp))) return rc;
    if (hp->arch == HF_QWEN2 || hp->arch == HF_QWEN3 || hp->arch == HF_SMOLLM3) {
        /* Qwen (and SmolLM3) carry sliding_window even when it is off; on, it applies to some layers only */
        bool swa;
        if ((rc = cfg_bool(path, cfg, "use_sliding_window", false, &swa))) return rc;
        if (swa) {
            LOG_ERR("%s: \"use_sliding_window\": true is not supported for %s", path, hf_gguf_arch[hp->arch]);
            return KVLLM_EUNSUPPORTED;
        }
        hp->n_swa = 0;
    }
    if (hp->arch == HF_PHI3 && (rc = read_config_phi3(path, cfg, hp))) return rc;
    if (experts[which] && (rc = read_config_moe(path, cfg, hp->arch == HF_QWEN3, hp))) return rc;
    if (hp->arch == HF_SMOLLM3 && (rc = read_config_smollm3(path, cfg, hp))) return rc;
    if (hp->n_swa > hp->n_ctx) {
        LOG_ERR("%s: sliding_window %lld is longer than max_position_embeddings %lld", path, (long long)hp->n_swa,
                (long long)hp->n_ctx);
        return KVLLM_EFORMAT;
    }
    if (gemma && (rc = read_config_gemma(path, cfg, hp))) return rc;
    bool bias;
    static const char *bias_keys[] = { "attention_bias", "mlp_bias" };
    for (size_t i = 0; i < 2; i++) {
        if ((rc = cfg_bool(path, cfg, bias_keys[i], false, &bias))) return rc;
        if (bias) { LOG_ERR("%s: \"%s\": true is not supported", path, bias_keys[i]); return KVLLM_EUNSUPPORTED; }
    }
    return 0;
}

static int set_keys(struct gguf *g, const char *dir, const struct hf_hparams *hp) {
    char name[256];
    snprintf(name, sizeof name, "%s", dir);
    size_t n = strlen(name);
    while (n > 1 && name[n - 1] == '/') name[--n] = 0;
    const char *base = strrchr(name, '/');
    base = base && base[1] ? base + 1 : name;
    const char *a = hp->n_expert && hp->arch == HF_QWEN3 ? "qwen3moe" : hf_gguf_arch[hp->arch];
    char key[96];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
    int rc = gguf_set_str(g, "general.architecture", a);
    if (!rc) rc = gguf_set_str(g, "general.name", base);
    if (!rc) rc = gguf_set_u32(g, KEY("context_length"), (uint32_t)hp->n_ctx);
    if (!rc) rc = gguf_set_u32(g, KEY("embedding_length"), (uint32_t)hp->n_embd);
    if (!rc) rc = gguf_set_u32(g, KEY("block_count"), (uint32_t)hp->n_layer);
    if (!rc) rc = gguf_set_u32(g, KEY("feed_forward_length"), (uint32_t)hp->n_ff);
    if (!rc) rc = gguf_set_u32(g, KEY("attention.head_count"), (uint32_t)hp->n_head);
    if (!rc) rc = gguf_set_u32(g, KEY("attention.head_count_kv"), (uint32_t)hp->n_head_kv);
    if (hp->arch == HF_GPT2) {
        if (!rc) rc = gguf_set_f32(g, KEY("attention.layer_norm_epsilon"), (float)hp->eps);
    } else {
        if (hp->arch == HF_QWEN3 || hp->arch == HF_GEMMA2 || hp->arch == HF_GEMMA3) {   /* its width given */
            if (!rc) rc = gguf_set_u32(g, KEY("attention.key_length"), (uint32_t)hp->head_dim);
            if (!rc) rc = gguf_set_u32(g, KEY("attention.value_length"), (uint32_t)hp->head_dim);
        } else if (!rc) {
            rc = gguf_set_u32(g, KEY("rope.dimension_count"), (uint32_t)hp->n_rot);
        }
        if (!rc && hp->arch == HF_PHI3)
            rc = gguf_set_u32(g, KEY("rope.scaling.original_context_length"), (uint32_t)hp->n_ctx_orig);
        if (!rc && hp->rope_scaling == 3) rc = gguf_set_f32(g, KEY("rope.scaling.attn_factor"), (float)hp->rs_attn);
        if (!rc) rc = gguf_set_f32(g, KEY("rope.freq_base"), (float)hp->theta);
        if (!rc) rc = gguf_set_f32(g, KEY("attention.layer_norm_rms_epsilon"), (float)hp->eps);
        if (!rc && hp->rope_scaling == 1) rc = gguf_set_str(g, KEY("rope.scaling.type"), "linear");
        if (!rc && hp->rope_scaling == 1) rc = gguf_set_f32(g, KEY("rope.scaling.factor"), (float)hp->rs_factor);
    }
    if (!rc) rc = gguf_set_u32(g, KEY("vocab_size"), (uint32_t)hp->n_vocab);
    if (!rc && hp->n_swa) rc = gguf_set_u32(g, KEY("attention.sliding_window"), (uint32_t)hp->n_swa);
    if (!rc && hp->n_expert) rc = gguf_set_u32(g, KEY("expert_count"), (uint32_t)hp->n_expert);
    if (!rc && hp->n_expert) rc = gguf_set_u32(g, KEY("expert_used_count"), (uint32_t)hp->n_expert_used);
    if (!rc && hp->n_expert && hp->arch == HF_QWEN3)
        rc = gguf_set_u32(g, KEY("expert_feed_forward_length"), (uint32_t)hp->n_ff_exp);
    if (!rc && hp->attn_softcap > 0) rc = gguf_set_f32(g, KEY("attn_logit_softcapping"), (float)hp->attn_softcap);
    if (!rc && hp->final_softcap > 0) rc = gguf_set_f32(g, KEY("final_logit_softcapping"), (float)hp->final_softcap);
#undef KEY
    return rc;
}

/* Llama 3 rope scaling as GGUF carries it: rope_freqs.weight (head_dim / 2) f32,
 * the divisor of each pair's frequency, computed as llama.cpp's converter does. */
static int add_rope_freqs(struct gguf *g, const struct hf_hparams *hp) {
    const int64_t hd = hp->head_dim, n = hd / 2;
    float *f = gguf_alloc(g, (size_t)n * sizeof *f);
    if (!f) return KVLLM_ENOMEM;
    const double low_wl = hp->rs_orig / hp->rs_low, high_wl = hp->rs_orig / hp->rs_high;
    for (int64_t i = 0; i < n; i++) {
        double freq = pow(hp->theta, -2.0 * (double)i / (double)hd), wl = 2 * M_PI / freq;
        if (wl < high_wl) f[i] = 1.0f;
        else if (wl > low_wl) f[i] = (float)hp->rs_factor;
        else {
            double smooth = (hp->rs_orig / wl - hp->rs_low) / (hp->rs_high - hp->rs_low);
            f[i] = (float)(1.0 / ((1 - smooth) / hp->rs_factor + smooth));
        }
    }
    int64_t ne[2] = { n, 1 };
    return gguf_add_tensor(g, "rope_freqs.weight", DTYPE_F32, 1, ne, f);
}

/* LongRoPE as GGUF carries it: rope_factors_long.weight and
 * rope_factors_short.weight (n_rot / 2) f32, the arrays read_config_phi3
 * checked. */
static int add_longrope(struct gguf *g, const struct hf_hparams *hp) {
    static const char *name[2] = { "rope_factors_long.weight", "rope_factors_short.weight" };
    json_object *src[2] = { hp->rs_long, hp->rs_short };
    const int64_t n = hp->n_rot / 2;
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++) {
        float *f = gguf_alloc(g, (size_t)(n ? n : 1) * sizeof *f);
        if (!f) return KVLLM_ENOMEM;
        for (int64_t j = 0; j < n; j++) f[j] = (float)json_object_get_double(json_object_array_get_idx(src[i], (size_t)j));
        int64_t ne[2] = { n, 1 };
        rc = gguf_add_tensor(g, name[i], DTYPE_F32, 1, ne, f);
    }
    return rc;
}

/* ---- shards ---- */

/* A shard file name from the index: a plain name inside the folder. */
static bool plain_name(const char *s) {
    size_t n = strlen(s);
    return n > 0 && n < 256 && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

/* The shard names: from the index's weight_map (unique, in order of first
 * appearance) or the single model.safetensors.  *names points into idx. */
static int list_shards(const char *idx_path, json_object *idx, const char ***names, size_t *n) {
    *names = NULL;
    *n = 0;
    json_object *wm = cfg_get(idx, "weight_map");
    if (!wm || !json_object_is_type(wm, json_type_object) || json_object_object_length(wm) == 0) {
        LOG_ERR("%s: missing or empty \"weight_map\" object", idx_path);
        return KVLLM_EFORMAT;
    }
    const char **v = xcalloc((size_t)json_object_object_length(wm), sizeof *v);
    if (!v) return KVLLM_ENOMEM;
    json_object_object_foreach(wm, key, val) {
        if (!json_object_is_type(val, json_type_string) || !plain_name(json_object_get_string(val))) {
            LOG_ERR("%s: weight_map entry '%.100s' is not a file name in the folder", idx_path, key);
            free(v);
            return KVLLM_EFORMAT;
        }
        const char *s = json_object_get_string(val);
        size_t i = 0;
        while (i < *n && strcmp(v[i], s)) i++;
        if (i == *n) {
            if (*n == HF_MAX_SHARDS) { LOG_ERR("%s: more than %d shards", idx_path, HF_MAX_SHARDS); free(v); return KVLLM_EFORMAT; }
            v[(*n)++] = s;
        }
    }
    *names = v;
    return 0;
}

/* Map the shards back to back into one reservation stored in g->map;
 * base[i], size[i] receive each shard's image. */
static int map_shards(struct gguf *g, char **paths, size_t n, const uint8_t **base, uint64_t *size) {
    int *fds = xcalloc(n, sizeof *fds);
    if (!fds) return KVLLM_ENOMEM;
    for (size_t i = 0; i < n; i++) fds[i] = -1;
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t total = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        struct stat st;
        fds[i] = open(paths[i], O_RDONLY | O_CLOEXEC);
        if (fds[i] < 0) {
            LOG_ERR("%s: cannot open%s: %s", paths[i], n > 1 ? " shard" : "", strerror(errno));
            rc = KVLLM_EIO;
        } else if (fstat(fds[i], &st) != 0 || !S_ISREG(st.st_mode)) {
            LOG_ERR("%s: not a regular file", paths[i]);
            rc = KVLLM_EIO;
        } else {
            size[i] = (uint64_t)st.st_size;
            uint64_t r = (size[i] + page - 1) / page * page;
            if (!ckd_add_u64(&total, total, r) || total > (uint64_t)SIZE_MAX / 2) {
                LOG_ERR("%s: shards too large to map", paths[i]);
                rc = KVLLM_ERANGE;
            }
        }
    }
    uint8_t *region = NULL;
    if (!rc && total) {
        void *p = mmap(NULL, (size_t)total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) { LOG_ERR("%s: mmap failed: %s", paths[0], strerror(errno)); rc = KVLLM_EIO; }
        else { region = p; g->map.data = region; g->map.size = (size_t)total; }
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        base[i] = region ? region + off : NULL;   /* every shard empty: no region (st_parse refuses them) */
        if (!size[i]) continue;
        void *p = mmap(region + off, (size_t)size[i], PROT_READ, MAP_PRIVATE | MAP_FIXED, fds[i], 0);
        if (p == MAP_FAILED) { LOG_ERR("%s: mmap failed: %s", paths[i], strerror(errno)); rc = KVLLM_EIO; }
        off += (size[i] + page - 1) / page * page;
    }
    for (size_t i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(fds);
    return rc; /* on error g->map (if set) is released by gguf_free */
}

/* ---- names ---- */

/* GPT-2 HF name (with or without "transformer.") -> GGUF name; 1 mapped, 0 ignore, -1 unknown. */
static int map_name_gpt2(const char *hf, int64_t n_layer, char *out, size_t cap, int *perm) {
    static const struct { const char *hf, *gguf; int perm; } layer[] = {
        { "ln_1.weight", "attn_norm.weight", PERM_NONE },     { "ln_1.bias", "attn_norm.bias", PERM_NONE },
        { "attn.c_attn.weight", "attn_qkv.weight", PERM_T },  { "attn.c_attn.bias", "attn_qkv.bias", PERM_NONE },
        { "attn.c_proj.weight", "attn_output.weight", PERM_T }, { "attn.c_proj.bias", "attn_output.bias", PERM_NONE },
        { "ln_2.weight", "ffn_norm.weight", PERM_NONE },      { "ln_2.bias", "ffn_norm.bias", PERM_NONE },
        { "mlp.c_fc.weight", "ffn_up.weight", PERM_T },       { "mlp.c_fc.bias", "ffn_up.bias", PERM_NONE },
        { "mlp.c_proj.weight", "ffn_down.weight", PERM_T },   { "mlp.c_proj.bias", "ffn_down.bias", PERM_NONE },
    };
    *perm = PERM_NONE;
    if (!strcmp(hf, "lm_head.weight")) { snprintf(out, cap, "output.weight"); return 1; }
    if (!strncmp(hf, "transformer.", 12)) hf += 12;
    if (!strcmp(hf, "wte.weight")) { snprintf(out, cap, "token_embd.weight"); return 1; }
    if (!strcmp(hf, "wpe.weight")) { snprintf(out, cap, "position_embd.weight"); return 1; }
    if (!strcmp(hf, "ln_f.weight")) { snprintf(out, cap, "output_norm.weight"); return 1; }
    if (!strcmp(hf, "ln_f.bias")) { snprintf(out, cap, "output_norm.bias"); return 1; }
    if (strncmp(hf, "h.", 2)) return -1;
    const char *p = hf + 2;
    int64_t il = 0;
    if (*p < '0' || *p > '9') return -1;
    while (*p >= '0' && *p <= '9' && il <= n_layer) il = il * 10 + (*p++ - '0');
    if (*p++ != '.' || il >= n_layer) return -1;
    if (!strcmp(p, "attn.bias") || !strcmp(p, "attn.masked_bias")) return 0; /* causal-mask buffers */
    for (size_t i = 0; i < sizeof layer / sizeof *layer; i++)
        if (!strcmp(p, layer[i].hf)) {
            snprintf(out, cap, "blk.%lld.%s", (long long)il, layer[i].gguf);
            *perm = layer[i].perm;
            return 1;
        }
    return -1;
}

/* The experts' HF names (Mixtral's, Qwen3-MoE's: model.layers.N.<block>.gate
 * is the router, model.layers.N.<block>.experts.E.<proj> expert E) and the
 * GGUF kinds they become, one 2-D tensor per expert: blk.N.ffn_<kind>.E
 * (model.c takes them as views, so they stay in the mapping, no copy). */
static const char *const moe_block[2] = { "block_sparse_moe", "mlp" };
static const char *const moe_proj[2][3] = { { "w1", "w3", "w2" }, { "gate_proj", "up_proj", "down_proj" } };
static const char *const moe_kind[3] = { "gate", "up", "down" };

/* An expert tensor's or the router's GGUF name (p: the HF name after "model.layers.il."); 1 mapped, -1 not one. */
static int map_name_moe(const char *p, const struct hf_hparams *hp, int64_t il, char *out, size_t cap) {
    const int q = hp->arch == HF_QWEN3;
    const size_t nb = strlen(moe_block[q]);
    if (strncmp(p, moe_block[q], nb) || p[nb] != '.') return -1;
    p += nb + 1;
    if (!strcmp(p, "gate.weight")) { snprintf(out, cap, "blk.%lld.ffn_gate_inp.weight", (long long)il); return 1; }
    if (strncmp(p, "experts.", 8)) return -1;
    p += 8;
    int64_t e = 0;
    if (*p < '0' || *p > '9') return -1;
    while (*p >= '0' && *p <= '9' && e <= hp->n_expert) e = e * 10 + (*p++ - '0');
    if (*p++ != '.' || e >= hp->n_expert) return -1;
    for (int k = 0; k < 3; k++) {
        const size_t n = strlen(moe_proj[q][k]);
        if (!strncmp(p, moe_proj[q][k], n) && !strcmp(p + n, ".weight")) {
            snprintf(out, cap, "blk.%lld.ffn_%s.%lld.weight", (long long)il, moe_kind[k], (long long)e);
            return 1;
        }
    }
    return -1;
}

/* Every layer of a mixture of experts has its router and all its experts; the first one missing is named. */
static int check_experts(const struct gguf *g, const char *where, const struct hf_hparams *hp) {
    const int q = hp->arch == HF_QWEN3;
    char name[96];
    for (int64_t il = 0; il < hp->n_layer; il++) {
        snprintf(name, sizeof name, "blk.%lld.ffn_gate_inp.weight", (long long)il);
        if (!gguf_find_tensor(g, name)) {
            LOG_ERR("%s: no tensor 'model.layers.%lld.%s.gate.weight' (the router of a mixture of experts)", where,
                    (long long)il, moe_block[q]);
            return KVLLM_EFORMAT;
        }
        for (int64_t e = 0; e < hp->n_expert; e++)
            for (int k = 0; k < 3; k++) {
                snprintf(name, sizeof name, "blk.%lld.ffn_%s.%lld.weight", (long long)il, moe_kind[k], (long long)e);
                if (!gguf_find_tensor(g, name)) {
                    LOG_ERR("%s: no tensor 'model.layers.%lld.%s.experts.%lld.%s.weight' (config.json: %lld experts)",
                            where, (long long)il, moe_block[q], (long long)e, moe_proj[q][k],
                            (long long)hp->n_expert);
                    return KVLLM_EFORMAT;
                }
            }
    }
    return 0;
}

/* HF name -> GGUF name; returns 1 mapped, 0 to ignore, -1 unknown. */
static int map_name(const char *hf, const struct hf_hparams *hp, char *out, size_t cap, int *perm) {
    if (hp->arch == HF_GPT2) return map_name_gpt2(hf, hp->n_layer, out, cap, perm);
    const int64_t n_layer = hp->n_layer;
    /* GGUF Qwen2, Qwen3, Gemma and Phi-3 keep HF's halves layout (llama.cpp runs them with NEOX rope): no
     * permutation; SmolLM3 is converted as Llama is */
    const bool pairs = hp->arch == HF_LLAMA || hp->arch == HF_SMOLLM3;
    const int pq = pairs ? PERM_Q : PERM_NONE, pk = pairs ? PERM_K : PERM_NONE;
    const bool qk_norm = hp->arch == HF_QWEN3 || hp->arch == HF_GEMMA3;
    static const struct { const char *hf, *gguf; int perm; } layer[] = {
        { "self_attn.q_proj.weight", "attn_q.weight", PERM_Q },
        { "self_attn.k_proj.weight", "attn_k.weight", PERM_K },
        { "self_attn.v_proj.weight", "attn_v.weight", PERM_NONE },
        { "self_attn.o_proj.weight", "attn_output.weight", PERM_NONE },
        { "mlp.gate_proj.weight", "ffn_gate.weight", PERM_NONE },
        { "mlp.up_proj.weight", "ffn_up.weight", PERM_NONE },
        { "mlp.down_proj.weight", "ffn_down.weight", PERM_NONE },
        { "input_layernorm.weight", "attn_norm.weight", PERM_NONE },
        { "post_attention_layernorm.weight", "ffn_norm.weight", PERM_NONE },
        { "self_attn.q_proj.bias", "attn_q.bias", PERM_NONE },   /* Qwen2 */
        { "self_attn.k_proj.bias", "attn_k.bias", PERM_NONE },
        { "self_attn.v_proj.bias", "attn_v.bias", PERM_NONE },
        { "self_attn.q_norm.weight", "attn_q_norm.weight", PERM_NONE },   /* Qwen3, Gemma 3 */
        { "self_attn.k_norm.weight", "attn_k_norm.weight", PERM_NONE },
    };
    /* Phi-3's fused projections: q, k, v rows in one; gate rows then up rows in one */
    static const char *const phi3[][2] = { { "self_attn.qkv_proj.weight", "attn_qkv.weight" },
                                           { "mlp.gate_up_proj.weight", "ffn_up.weight" } };
    /* Gemma's norms around the sub-layers: after attention, before and after the FFN */
    static const char *const gemma[][2] = { { "post_attention_layernorm.weight", "post_attention_norm.weight" },
                                            { "pre_feedforward_layernorm.weight", "ffn_norm.weight" },
                                            { "post_feedforward_layernorm.weight", "post_ffw_norm.weight" } };
    *perm = PERM_NONE;
    if (!strcmp(hf, "model.embed_tokens.weight")) { snprintf(out, cap, "token_embd.weight"); return 1; }
    if (!strcmp(hf, "model.norm.weight")) { snprintf(out, cap, "output_norm.weight"); return 1; }
    if (!strcmp(hf, "lm_head.weight")) { snprintf(out, cap, "output.weight"); return 1; }
    static const char pre[] = "model.layers.";
    if (strncmp(hf, pre, sizeof pre - 1)) return -1;
    const char *p = hf + sizeof pre - 1;
    int64_t il = 0;
    if (*p < '0' || *p > '9') return -1;
    while (*p >= '0' && *p <= '9' && il <= n_layer) il = il * 10 + (*p++ - '0');
    if (*p++ != '.' || il >= n_layer) return -1;
    if (!strcmp(p, "self_attn.rotary_emb.inv_freq")) return 0; /* recomputed */
    if (hp->n_expert && map_name_moe(p, hp, il, out, cap) == 1) return 1;
    for (size_t i = 0; (hp->arch == HF_GEMMA2 || hp->arch == HF_GEMMA3) && i < sizeof gemma / sizeof *gemma; i++)
        if (!strcmp(p, gemma[i][0])) {
            snprintf(out, cap, "blk.%lld.%s", (long long)il, gemma[i][1]);
            return 1;
        }
    for (size_t i = 0; hp->arch == HF_PHI3 && i < sizeof phi3 / sizeof *phi3; i++)
        if (!strcmp(p, phi3[i][0])) {
            snprintf(out, cap, "blk.%lld.%s", (long long)il, phi3[i][1]);
            return 1;
        }
    for (size_t i = 0; i < sizeof layer / sizeof *layer; i++)
        if (!strcmp(p, layer[i].hf)) {
            if (!qk_norm && (!strcmp(layer[i].gguf, "attn_q_norm.weight") || !strcmp(layer[i].gguf, "attn_k_norm.weight")))
                return -1;
            snprintf(out, cap, "blk.%lld.%s", (long long)il, layer[i].gguf);
            *perm = layer[i].perm == PERM_Q ? pq : layer[i].perm == PERM_K ? pk : layer[i].perm;
            return 1;
        }
    return -1;
}

void hf_permute_rows(uint8_t *dst, const uint8_t *src, int64_t n_head, int64_t hd, size_t row_bytes,
                         bool to_gguf) {
    for (int64_t h = 0; h < n_head; h++)
        for (int64_t i = 0; i < hd / 2; i++)
            for (int64_t j = 0; j < 2; j++) {
                int64_t pairs = h * hd + 2 * i + j, halves = h * hd + j * (hd / 2) + i;
                int64_t d = to_gguf ? pairs : halves, s = to_gguf ? halves : pairs;
                memcpy(dst + (size_t)d * row_bytes, src + (size_t)s * row_bytes, row_bytes);
            }
}

static float elem_f32(uint32_t dtype, const uint8_t *p, uint64_t i) {
    uint16_t h;
    float f;
    switch (dtype) {
    case DTYPE_F16: memcpy(&h, p + 2 * i, 2); return f16_to_f32(h);
    case DTYPE_BF16: memcpy(&h, p + 2 * i, 2); return bf16_to_f32(h);
    default: memcpy(&f, p + 4 * i, 4); return f;
    }
}

/* Add one safetensors tensor to g under its GGUF name. */
static int add_tensor(struct gguf *g, const struct st_file *sf, const struct st_tensor *t,
                      const struct hf_hparams *hp) {
    char name[96];
    int perm;
    int m = map_name(t->name, hp, name, sizeof name, &perm);
    if (m == 0) return 0;
    if (m < 0) {
        LOG_WARN("%s: ignoring tensor '%s' (not part of a Llama model)", sf->path, t->name);
        return 0;
    }
    if (gguf_find_tensor(g, name)) {
        LOG_ERR("%s: tensor '%s' appears twice in the folder", sf->path, t->name);
        return KVLLM_EFORMAT;
    }
    if (t->n_dims < 1 || t->n_dims > 2 || t->n_elems == 0) {
        LOG_ERR("%s: tensor '%s' has %u dimensions and %llu elements; a Llama weight has 1 or 2 and some",
                sf->path, t->name, t->n_dims, (unsigned long long)t->n_elems);
        return KVLLM_EFORMAT;
    }
    int64_t ne[2] = { t->shape[t->n_dims - 1], t->n_dims == 2 ? t->shape[0] : 1 };
    if (perm == PERM_T && t->n_dims == 2) { ne[0] = t->shape[0]; ne[1] = t->shape[1]; }
    uint32_t type = t->dtype;
    const void *data = t->data;
    const size_t esize = t->dtype == DTYPE_F32 ? 4 : 2;
    /* Gemma's RMSNorm multiplies by 1 + w; GGUF stores 1 + w, added in f32 as Transformers computes it */
    const size_t nl = strlen(name);
    const bool gemma = hp->arch == HF_GEMMA2 || hp->arch == HF_GEMMA3;
    const float shift = gemma && nl >= 11 && !strcmp(name + nl - 11, "norm.weight") ? 1.0f : 0.0f;
    if (t->n_dims == 1 && (t->dtype != DTYPE_F32 || shift != 0.0f)) { /* norms: F32, as in GGUF files */
        float *f = gguf_alloc(g, (size_t)t->n_elems * 4);
        if (!f) return KVLLM_ENOMEM;
        for (uint64_t i = 0; i < t->n_elems; i++) f[i] = elem_f32(t->dtype, t->data, i) + shift;
        type = DTYPE_F32;
        data = f;
    } else if (perm == PERM_T) {  /* Conv1D (in, out) -> rows of out: element (o, i) = src (i, o) */
        if (t->n_dims != 2) { LOG_ERR("%s: tensor '%s' must be 2-D", sf->path, t->name); return KVLLM_EFORMAT; }
        uint8_t *p = gguf_alloc(g, (size_t)t->n_bytes);
        if (!p) return KVLLM_ENOMEM;
        const uint8_t *src = t->data;
        for (int64_t o = 0; o < ne[1]; o++)
            for (int64_t i = 0; i < ne[0]; i++)
                memcpy(p + ((size_t)o * (size_t)ne[0] + (size_t)i) * esize,
                       src + ((size_t)i * (size_t)ne[1] + (size_t)o) * esize, esize);
        data = p;
    } else if (perm != PERM_NONE) {
        int64_t nh = perm == PERM_Q ? hp->n_head : hp->n_head_kv, hd = hp->head_dim;
        if (ne[1] != nh * hd) {
            LOG_ERR("%s: tensor '%s' has %lld rows, expected %lld heads x %lld", sf->path, t->name,
                    (long long)ne[1], (long long)nh, (long long)hd);
            return KVLLM_EFORMAT;
        }
        uint8_t *p = gguf_alloc(g, (size_t)t->n_bytes);
        if (!p) return KVLLM_ENOMEM;
        hf_permute_rows(p, t->data, nh, hd, (size_t)ne[0] * esize, true);
        data = p;
    } else if ((uintptr_t)t->data % esize) { /* misaligned in the file: copy */
        void *p = gguf_alloc(g, (size_t)t->n_bytes);
        if (!p) return KVLLM_ENOMEM;
        memcpy(p, t->data, (size_t)t->n_bytes);
        data = p;
    }
    return gguf_add_tensor(g, name, type, (uint32_t)t->n_dims, ne, data);
}

/* The tensors of one kind of layer il's experts (blk.il.ffn_<kind>.E) stacked into blk.il.ffn_<kind>_exps. */
static int stack_kind(struct gguf *g, uint32_t il, const char *kind, uint32_t n_expert) {
    char name[96];
    snprintf(name, sizeof name, "blk.%u.ffn_%s.0.weight", il, kind);
    const struct gguf_tensor *t0 = gguf_find_tensor(g, name);
    if (!t0) return 0;   /* stacked already, or missing: the model's loader says which */
    const int64_t ne[3] = { t0->ne[0], t0->ne[1], n_expert };
    const uint32_t type = t0->type;
    const uint64_t bytes = t0->n_bytes;
    if (t0->n_dims != 2 || bytes > SIZE_MAX / n_expert) {
        LOG_ERR("%s: tensor '%s' is not a 2-D expert matrix", g->path, name);
        return KVLLM_EFORMAT;
    }
    uint8_t *p = gguf_alloc(g, (size_t)(bytes * n_expert));
    if (!p) return KVLLM_ENOMEM;
    for (uint32_t e = 0; e < n_expert; e++) {
        snprintf(name, sizeof name, "blk.%u.ffn_%s.%u.weight", il, kind, e);
        const struct gguf_tensor *t = gguf_find_tensor(g, name);
        if (!t || t->n_dims != 2 || t->type != type || t->ne[0] != ne[0] || t->ne[1] != ne[1]) {
            LOG_ERR("%s: tensor '%s' %s expert 0's", g->path, name, t ? "has another shape or type than" : "is missing beside");
            return KVLLM_EFORMAT;
        }
        memcpy(p + (size_t)(e * bytes), t->data, (size_t)bytes);
    }
    snprintf(name, sizeof name, "blk.%u.ffn_%s_exps.weight", il, kind);
    return gguf_add_tensor(g, name, type, 3, ne, p);
}

int hf_stack_experts(struct gguf *g) {
    struct gguf_str arch;
    uint32_t n_layer, n_expert;
    char key[96];
    if (gguf_get_str(g, "general.architecture", &arch)) return 0;
    snprintf(key, sizeof key, "%.*s.expert_count", (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    if (gguf_get_u32(g, key, &n_expert) || !n_expert) return 0;
    snprintf(key, sizeof key, "%.*s.block_count", (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    if (gguf_get_u32(g, key, &n_layer)) return 0;
    int rc = 0;
    for (uint32_t il = 0; !rc && il < n_layer; il++)
        for (int k = 0; !rc && k < 3; k++) rc = stack_kind(g, il, moe_kind[k], n_expert);
    if (rc) return rc;
    uint64_t kept = 0;   /* drop the per-expert tensors: blk.N.ffn_<kind>.E.weight */
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        char name[96], kind[8];
        unsigned il, e;
        int end = 0;
        snprintf(name, sizeof name, "%.*s", (int)(g->tensors[i].name.len > 95 ? 95 : g->tensors[i].name.len),
                 g->tensors[i].name.ptr);
        const bool expert = sscanf(name, "blk.%u.ffn_%7[a-z].%u.weight%n", &il, kind, &e, &end) == 3 &&
                            end == (int)strlen(name);
        if (!expert) g->tensors[kept++] = g->tensors[i];
    }
    g->n_tensors = kept;
    return 0;
}

char *hf_path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int hf_open(const char *dir, struct gguf **out) {
    *out = NULL;
    struct gguf *g = gguf_new(dir);
    char *cfg_path = hf_path_join(dir, "config.json"), *idx_path = hf_path_join(dir, "model.safetensors.index.json");
    json_object *cfg = NULL, *idx = NULL;
    const char **names = NULL;
    char **paths = NULL;
    const uint8_t **base = NULL;
    uint64_t *size = NULL;
    struct st_file *sf = NULL;
    size_t n = 0;
    struct hf_hparams hp = { 0 };
    struct stat st;
    int rc = g && cfg_path && idx_path ? 0 : KVLLM_ENOMEM;
    if (!rc && stat(cfg_path, &st) != 0) {
        LOG_ERR("%s: not a Hugging Face model folder (no config.json)", dir);
        rc = KVLLM_EFORMAT;
    }
    if (!rc) rc = hf_read_json(cfg_path, &cfg);
    if (!rc) rc = read_config(cfg_path, cfg, &hp);
    if (!rc) rc = set_keys(g, dir, &hp);
    static const char *single = "model.safetensors";
    if (!rc) {
        if (stat(idx_path, &st) == 0) {
            rc = hf_read_json(idx_path, &idx);
            if (!rc) rc = list_shards(idx_path, idx, &names, &n);
        } else {
            names = xcalloc(1, sizeof *names);
            if (names) { names[0] = single; n = 1; }
            else rc = KVLLM_ENOMEM;
        }
    }
    if (!rc) {
        paths = xcalloc(n, sizeof *paths);
        base = xcalloc(n, sizeof *base);
        size = xcalloc(n, sizeof *size);
        sf = xcalloc(n, sizeof *sf);
        if (!paths || !base || !size || !sf) rc = KVLLM_ENOMEM;
        for (size_t i = 0; !rc && i < n; i++)
            if (!(paths[i] = hf_path_join(dir, names[i]))) rc = KVLLM_ENOMEM;
    }
    if (!rc) rc = map_shards(g, paths, n, base, size);
    for (size_t i = 0; !rc && i < n; i++) rc = st_parse(paths[i], base[i], size[i], &sf[i]);
    /* every tensor the index names must be in the shard it names */
    if (!rc && idx) {
        json_object_object_foreach(cfg_get(idx, "weight_map"), key, val) {
            size_t i = 0;
            while (strcmp(names[i], json_object_get_string(val))) i++;
            uint64_t k = 0;
            while (k < sf[i].n_tensors && strcmp(sf[i].tensors[k].name, key)) k++;
            if (k == sf[i].n_tensors) {
                LOG_ERR("%s: tensor '%.100s' is listed in %s but that shard does not hold it", idx_path, key,
                        names[i]);
                rc = KVLLM_EFORMAT;
                break;
            }
        }
    }
    for (size_t i = 0; !rc && i < n; i++)
        for (uint64_t k = 0; !rc && k < sf[i].n_tensors; k++) rc = add_tensor(g, &sf[i], &sf[i].tensors[k], &hp);
    if (!rc) {
        const struct gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
        if (!emb) {
            LOG_ERR("%s: no tensor 'model.embed_tokens.weight' in the folder", n == 1 ? paths[0] : idx_path);
            rc = KVLLM_EFORMAT;
        } else if (emb->ne[1] != hp.n_vocab || emb->ne[0] != hp.n_embd) {
            LOG_ERR("%s: model.embed_tokens.weight is [%lld, %lld] but config.json says vocab_size %lld, "
                    "hidden_size %lld", paths[0], (long long)emb->ne[1], (long long)emb->ne[0],
                    (long long)hp.n_vocab, (long long)hp.n_embd);
            rc = KVLLM_EFORMAT;
        } else if (!hp.tied && !gguf_find_tensor(g, "output.weight")) {
            LOG_ERR("%s: no tensor 'lm_head.weight' while tie_word_embeddings is false", n == 1 ? paths[0] : idx_path);
            rc = KVLLM_EFORMAT;
        } else if (hp.n_expert && (rc = check_experts(g, n == 1 ? paths[0] : idx_path, &hp))) {
            /* logged */
        } else if (hp.rope_scaling == 2) {
            rc = add_rope_freqs(g, &hp);
        } else if (hp.rope_scaling == 3) {
            rc = add_longrope(g, &hp);
        }
    }
    if (!rc) { /* the vocabulary, when the folder has one */
        char *tj = hf_path_join(dir, "tokenizer.json"), *tc = hf_path_join(dir, "tokenizer_config.json");
        if (!tj || !tc) rc = KVLLM_ENOMEM;
        else if (stat(tj, &st) == 0) rc = hf_tokenizer_read(tj, tc, g);
        free(tj);
        free(tc);
    }
    for (size_t i = 0; i < n; i++) {
        if (sf) st_file_deinit(&sf[i]);
        if (paths) free(paths[i]);
    }
    free(sf);
    free(size);
    free(base);
    free(paths);
    free(names);
    json_object_put(idx);
    json_object_put(cfg);
    free(idx_path);
    free(cfg_path);
    if (rc) { gguf_free(g); return rc; }
    *out = g;
    return 0;
}
