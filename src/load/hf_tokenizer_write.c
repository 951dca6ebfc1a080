/* hf_tokenizer_write.c — GGUF tokenizer.ggml.* keys written back as
 * tokenizer.json + tokenizer_config.json (hf_tokenizer_write, see hf.h):
 * "llama" vocabularies in the Llama 2 form, with the merges rebuilt from the
 * scores as Transformers' converter builds them, "gpt2" ones with the
 * pre-tokenizer their tokenizer.ggml.pre names.  The reading side is
 * hf_tokenizer.c. */
#include "load/hf.h"
#include "load/hf_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tokenizer.ggml.pre names -> the hf_known_pre entry that writes them. */
static const struct { const char *name, *as; } k_pre_alias[] = {
    { "gpt-2", "gpt-2" }, { "mpt", "gpt-2" }, { "phi-2", "gpt-2" }, { "olmo", "gpt-2" },
    { "roberta-bpe", "gpt-2" }, { "jais", "gpt-2" },
    { "llama-bpe", "llama-bpe" }, { "llama3", "llama-bpe" }, { "llama-v3", "llama-bpe" },
    { "smaug-bpe", "smaug-bpe" }, { "dbrx", "smaug-bpe" },
    { "qwen2", "qwen2" }, { "deepseek-r1-qwen", "qwen2" },
    { "smollm", "smollm" }, { "starcoder", "smollm" }, { "refact", "smollm" }, { "command-r", "smollm" },
    { "codeshell", "smollm" },
};

struct wctx {
    const struct gguf *g;
    const struct gguf_str *tok;
    int n;
    const struct gguf_kv *types, *scores;
    struct piece_index idx;
};

static int wtype(const struct wctx *w, int id) {
    return w->types ? (int)gguf_arr_i64(w->types, (uint64_t)id) : T_NORMAL;
}

static int wlookup(const struct wctx *w, const char *s, size_t n) { return piece_index_find(&w->idx, s, n); }

static json_object *jstrn(const struct gguf_str s) { return json_object_new_string_len(s.ptr, (int)s.len); }

/* A merge (a, b) of SentencePiece-style pieces, sorted as Transformers'
 * converter sorts them: by the merged piece's score (best first), then its
 * id, then the ids of a and b. */
struct spm_merge { float score; int32_t id, a, b; };

static int cmp_merge(const void *x, const void *y) {
    const struct spm_merge *p = x, *q = y;
    if (p->score != q->score) return p->score > q->score ? -1 : 1;
    if (p->id != q->id) return p->id < q->id ? -1 : 1;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    return (p->b > q->b) - (p->b < q->b);
}

/* Every split of every NORMAL piece into two pieces of the vocabulary. */
static int spm_merges(const struct wctx *w, json_object *arr) {
    size_t n = 0, cap = 1024;
    struct spm_merge *m = xmalloc(cap * sizeof *m);
    if (!m) return KVLLM_ENOMEM;
    for (int id = 0; id < w->n; id++) {
        if (wtype(w, id) != T_NORMAL) continue;
        const char *s = w->tok[id].ptr;
        size_t len = w->tok[id].len;
        for (size_t k = 1; k < len; k++) {
            if (((uint8_t)s[k] & 0xc0) == 0x80) continue; /* inside a character */
            int a = wlookup(w, s, k), b = a >= 0 ? wlookup(w, s + k, len - k) : -1;
            if (a < 0 || b < 0) continue;
            if (n == cap) {
                struct spm_merge *bigger = realloc(m, 2 * cap * sizeof *m);
                if (!bigger) { free(m); LOG_ERR("out of memory"); return KVLLM_ENOMEM; }
                m = bigger;
                cap *= 2;
            }
            float sc = w->scores ? (float)gguf_arr_f64(w->scores, (uint64_t)id) : -(float)id;
            m[n++] = (struct spm_merge){ sc, id, a, b };
        }
    }
    qsort(m, n, sizeof *m, cmp_merge);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        json_object *pair = json_object_new_array_ext(2);
        rc = pair ? 0 : KVLLM_ENOMEM;
        if (!rc) json_object_array_add(pair, jstrn(w->tok[m[i].a]));
        if (!rc) json_object_array_add(pair, jstrn(w->tok[m[i].b]));
        if (!rc) json_object_array_add(arr, pair);
    }
    free(m);
    return rc;
}

static json_object *obj_type(const char *type) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "type", json_object_new_string(type));
    return o;
}

static json_object *str_pattern(const char *s) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "String", json_object_new_string(s));
    return o;
}

static json_object *bytelevel(bool use_regex) {
    json_object *o = obj_type("ByteLevel");
    json_object_object_add(o, "add_prefix_space", json_object_new_boolean(0));
    json_object_object_add(o, "trim_offsets", json_object_new_boolean(0));
    json_object_object_add(o, "use_regex", json_object_new_boolean(use_regex));
    return o;
}

/* The pre_tokenizer object of a known pre-tokenizer. */
static json_object *pre_json(const struct known_pre *kp) {
    json_object *seq = json_object_new_array();
    bool bytelevel_regex = false;
    for (int i = 0; i < MAX_PRE && kp->steps[i]; i++) {
        const char *st = kp->steps[i];
        if (!strcmp(st, PRE_BYTELEVEL)) { bytelevel_regex = true; continue; }
        json_object *o;
        if (!strcmp(st, PRE_DIGIT) || !strcmp(st, PRE_DIGITS)) {
            o = obj_type("Digits");
            json_object_object_add(o, "individual_digits", json_object_new_boolean(!strcmp(st, PRE_DIGIT)));
        } else {
            o = obj_type("Split");
            json_object *pat = json_object_new_object();
            json_object_object_add(pat, "Regex", json_object_new_string(st));
            json_object_object_add(o, "pattern", pat);
            json_object_object_add(o, "behavior", json_object_new_string("Isolated"));
            json_object_object_add(o, "invert", json_object_new_boolean(0));
        }
        json_object_array_add(seq, o);
    }
    json_object_array_add(seq, bytelevel(bytelevel_regex));
    if (json_object_array_length(seq) == 1) {
        json_object *only = json_object_get(json_object_array_get_idx(seq, 0));
        json_object_put(seq);
        return only;
    }
    json_object *o = obj_type("Sequence");
    json_object_object_add(o, "pretokenizers", seq);
    return o;
}

static json_object *template_bos(const struct gguf_str bos, int bos_id) {
    json_object *o = obj_type("TemplateProcessing");
    const char *parts[2][3] = { { "A", NULL }, { "A", "B" } };
    for (int k = 0; k < 2; k++) {
        json_object *list = json_object_new_array();
        json_object *sp = json_object_new_object(), *spi = json_object_new_object();
        json_object_object_add(spi, "id", jstrn(bos));
        json_object_object_add(spi, "type_id", json_object_new_int(0));
        json_object_object_add(sp, "SpecialToken", spi);
        json_object_array_add(list, sp);
        for (int j = 0; j < 2 && parts[k][j]; j++) {
            json_object *seq = json_object_new_object(), *si = json_object_new_object();
            json_object_object_add(si, "id", json_object_new_string(parts[k][j]));
            json_object_object_add(si, "type_id", json_object_new_int(j));
            json_object_object_add(seq, "Sequence", si);
            json_object_array_add(list, seq);
        }
        json_object_object_add(o, k ? "pair" : "single", list);
    }
    json_object *sts = json_object_new_object(), *e = json_object_new_object();
    json_object *ids = json_object_new_array(), *toks = json_object_new_array();
    json_object_array_add(ids, json_object_new_int(bos_id));
    json_object_array_add(toks, jstrn(bos));
    json_object_object_add(e, "id", jstrn(bos));
    json_object_object_add(e, "ids", ids);
    json_object_object_add(e, "tokens", toks);
    char key[256];
    snprintf(key, sizeof key, "%.*s", (int)(bos.len < 255 ? bos.len : 255), bos.ptr);
    json_object_object_add(sts, key, e);
    json_object_object_add(o, "special_tokens", sts);
    return o;
}

static json_object *spm_decoder(bool strip) {
    json_object *list = json_object_new_array(), *o = obj_type("Replace");
    json_object_object_add(o, "pattern", str_pattern(SPM_SPACE));
    json_object_object_add(o, "content", json_object_new_string(" "));
    json_object_array_add(list, o);
    json_object_array_add(list, obj_type("ByteFallback"));
    json_object_array_add(list, obj_type("Fuse"));
    if (strip) {
        o = obj_type("Strip");
        json_object_object_add(o, "content", json_object_new_string(" "));
        json_object_object_add(o, "start", json_object_new_int(1));
        json_object_object_add(o, "stop", json_object_new_int(0));
        json_object_array_add(list, o);
    }
    o = obj_type("Sequence");
    json_object_object_add(o, "decoders", list);
    return o;
}

static json_object *spm_normalizer(bool prepend) {
    json_object *list = json_object_new_array(), *o;
    if (prepend) {
        o = obj_type("Prepend");
        json_object_object_add(o, "prepend", json_object_new_string(SPM_SPACE));
        json_object_array_add(list, o);
    }
    o = obj_type("Replace");
    json_object_object_add(o, "pattern", str_pattern(" "));
    json_object_object_add(o, "content", json_object_new_string(SPM_SPACE));
    json_object_array_add(list, o);
    o = obj_type("Sequence");
    json_object_object_add(o, "normalizers", list);
    return o;
}

static int opt_id(const struct gguf *g, const char *key, int n) {
    uint32_t v;
    return gguf_get_u32(g, key, &v) == 0 && v < (uint32_t)n ? (int)v : -1;
}

/* o as JSON in a temporary file beside path, complete but not yet in place
 * (the caller commits or aborts *f).  Errors logged, *f zeroed. */
static int write_json(struct out_file *f, const char *path, json_object *o) {
    size_t n = 0;
    const char *text = json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE,
                                                         &n);
    memset(f, 0, sizeof *f);
    if (!text) { LOG_ERR("%s: out of memory", path); return KVLLM_ENOMEM; }
    int rc = out_file_open(f, path);
    if (rc) return rc;
    if (fwrite(text, 1, n, f->f) != n) {
        LOG_ERR("%s: write failed: %s", path, strerror(errno));
        out_file_abort(f);
        return KVLLM_EIO;
    }
    return out_file_finish(f);
}

static int write_tokenizer(struct wctx *w, const char *dir, bool spm, const struct known_pre *kp) {
    const struct gguf *g = w->g;
    int bos = opt_id(g, "tokenizer.ggml.bos_token_id", w->n), eos = opt_id(g, "tokenizer.ggml.eos_token_id", w->n);
    int unk = opt_id(g, "tokenizer.ggml.unknown_token_id", w->n);
    bool add_bos = spm, prefix = spm, b;
    if (!gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b)) add_bos = b;
    if (!gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b)) prefix = b;
    if (!spm && !strcmp(kp->name, "llama-bpe") && gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b)) add_bos = true;
    if (spm && unk >= 0 && wtype(w, unk) != T_UNKNOWN) unk = -1;
    if (spm && unk < 0)
        for (int id = 0; id < w->n && unk < 0; id++) if (wtype(w, id) == T_UNKNOWN) unk = id;
    if (add_bos && bos < 0) add_bos = false;

    json_object *root = json_object_new_object(), *added = json_object_new_array();
    json_object *model = obj_type("BPE"), *vocab = json_object_new_object(), *merges = json_object_new_array();
    int rc = root && added && model && vocab && merges ? 0 : KVLLM_ENOMEM;
    char key[1024];
    for (int id = 0; id < w->n && !rc; id++) {
        const struct gguf_str t = w->tok[id];
        int ty = wtype(w, id);
        if (t.len >= sizeof key || memchr(t.ptr, 0, t.len)) {
            LOG_ERR("%s: token %d cannot be written to tokenizer.json (too long or holds a NUL)", g->path, id);
            rc = KVLLM_EUNSUPPORTED;
            break;
        }
        memcpy(key, t.ptr, t.len);
        key[t.len] = 0;
        if (!json_object_object_get_ex(vocab, key, NULL))
            json_object_object_add(vocab, key, json_object_new_int(id));
        if (ty == T_CONTROL || ty == T_USER || ty == T_UNKNOWN) {
            json_object *a = json_object_new_object();
            json_object_object_add(a, "id", json_object_new_int(id));
            json_object_object_add(a, "content", jstrn(t));
            json_object_object_add(a, "single_word", json_object_new_boolean(0));
            json_object_object_add(a, "lstrip", json_object_new_boolean(0));
            json_object_object_add(a, "rstrip", json_object_new_boolean(0));
            json_object_object_add(a, "normalized", json_object_new_boolean(ty == T_USER && !spm));
            json_object_object_add(a, "special", json_object_new_boolean(ty != T_USER));
            json_object_array_add(added, a);
        }
    }
    if (!rc && spm) {
        rc = spm_merges(w, merges);
    } else if (!rc) {
        const struct gguf_kv *m;
        rc = gguf_get_arr(g, "tokenizer.ggml.merges", GGUF_T_STRING, &m);
        if (rc == KVLLM_ENOTFOUND) LOG_ERR("%s: byte-level vocabulary without tokenizer.ggml.merges", g->path);
        for (uint64_t i = 0; !rc && i < m->v.arr.n; i++) json_object_array_add(merges, jstrn(m->v.arr.strs[i]));
    }
    if (rc) {
        json_object_put(root), json_object_put(added), json_object_put(model), json_object_put(vocab);
        json_object_put(merges);
        return rc == KVLLM_ENOMEM ? (LOG_ERR("out of memory"), rc) : rc;
    }
    json_object_object_add(root, "version", json_object_new_string("1.0"));
    json_object_object_add(root, "truncation", NULL);
    json_object_object_add(root, "padding", NULL);
    json_object_object_add(root, "added_tokens", added);
    json_object_object_add(root, "normalizer", spm ? spm_normalizer(prefix) : NULL);
    json_object_object_add(root, "pre_tokenizer", spm ? NULL : pre_json(kp));
    json_object *post = NULL;
    if (add_bos) post = template_bos(w->tok[bos], bos);
    if (!spm) {
        json_object *bl = bytelevel(true);
        if (post) {
            json_object *list = json_object_new_array();
            json_object_array_add(list, bl);
            json_object_array_add(list, post);
            post = obj_type("Sequence");
            json_object_object_add(post, "processors", list);
        } else {
            post = bl;
        }
    }
    json_object_object_add(root, "post_processor", post);
    json_object_object_add(root, "decoder", spm ? spm_decoder(prefix) : bytelevel(true));
    json_object_object_add(model, "dropout", NULL);
    json_object_object_add(model, "unk_token", spm && unk >= 0 ? jstrn(w->tok[unk]) : NULL);
    json_object_object_add(model, "continuing_subword_prefix", NULL);
    json_object_object_add(model, "end_of_word_suffix", NULL);
    json_object_object_add(model, "fuse_unk", json_object_new_boolean(spm));
    json_object_object_add(model, "byte_fallback", json_object_new_boolean(spm));
    json_object_object_add(model, "ignore_merges", json_object_new_boolean(!spm && kp->ignore_merges));
    json_object_object_add(model, "vocab", vocab);
    json_object_object_add(model, "merges", merges);
    json_object_object_add(root, "model", model);
    char *tj = hf_path_join(dir, "tokenizer.json"), *tc = hf_path_join(dir, "tokenizer_config.json");
    struct out_file f_tj = { 0 }, f_tc = { 0 };
    rc = tj && tc ? write_json(&f_tj, tj, root) : KVLLM_ENOMEM;
    json_object_put(root);

    json_object *cfg = json_object_new_object();
    json_object_object_add(cfg, "add_bos_token", json_object_new_boolean(add_bos));
    json_object_object_add(cfg, "add_eos_token", json_object_new_boolean(0));
    json_object_object_add(cfg, "bos_token", bos >= 0 ? jstrn(w->tok[bos]) : NULL);
    json_object_object_add(cfg, "eos_token", eos >= 0 ? jstrn(w->tok[eos]) : NULL);
    if (spm) json_object_object_add(cfg, "unk_token", unk >= 0 ? jstrn(w->tok[unk]) : NULL);
    json_object_object_add(cfg, "clean_up_tokenization_spaces", json_object_new_boolean(0));
    if (spm) json_object_object_add(cfg, "legacy", json_object_new_boolean(0));
    json_object_object_add(cfg, "tokenizer_class", json_object_new_string("PreTrainedTokenizerFast"));
    struct gguf_str tpl;
    if (gguf_get_str(g, "tokenizer.chat_template", &tpl) == 0)
        json_object_object_add(cfg, "chat_template", jstrn(tpl));
    if (!rc) rc = write_json(&f_tc, tc, cfg);
    json_object_put(cfg);
    if (!rc) rc = out_file_commit(&f_tj);
    if (!rc) rc = out_file_commit(&f_tc);
    out_file_abort(&f_tc); /* no-ops once committed */
    out_file_abort(&f_tj);
    free(tj);
    free(tc);
    return rc;
}

static int write_with(const struct gguf *g, const char *dir, bool spm, const struct known_pre *kp);

/* A byte-level vocabulary whose split regexes are stored (tokenizer.kvllm.pre_regex). */
static int write_custom(const struct gguf *g, const char *dir) {
    const struct gguf_kv *kv;
    int rc = gguf_get_arr(g, "tokenizer.kvllm.pre_regex", GGUF_T_STRING, &kv);
    if (rc == KVLLM_ENOTFOUND) LOG_ERR("%s: tokenizer.ggml.pre is kvllm-regex but tokenizer.kvllm.pre_regex is missing",
                                       g->path);
    if (rc) return rc == KVLLM_ENOTFOUND ? KVLLM_EFORMAT : rc;
    if (kv->v.arr.n == 0 || kv->v.arr.n >= MAX_PRE) {
        LOG_ERR("%s: tokenizer.kvllm.pre_regex has %llu patterns", g->path, (unsigned long long)kv->v.arr.n);
        return KVLLM_EFORMAT;
    }
    struct known_pre kp = { "kvllm-regex", false, { NULL } };
    bool b;
    if (!gguf_get_bool(g, "tokenizer.kvllm.ignore_merges", &b)) kp.ignore_merges = b;
    size_t total = 0;
    for (uint64_t i = 0; i < kv->v.arr.n; i++) total += (size_t)kv->v.arr.strs[i].len + 1;
    char *buf = xmalloc(total);
    if (!buf) return KVLLM_ENOMEM;
    size_t off = 0;
    for (uint64_t i = 0; i < kv->v.arr.n; i++) {
        memcpy(buf + off, kv->v.arr.strs[i].ptr, (size_t)kv->v.arr.strs[i].len);
        buf[off + kv->v.arr.strs[i].len] = 0;
        kp.steps[i] = buf + off;
        off += (size_t)kv->v.arr.strs[i].len + 1;
    }
    rc = write_with(g, dir, false, &kp);
    free(buf);
    return rc;
}

int hf_tokenizer_write(const struct gguf *g, const char *dir) {
    struct gguf_str model;
    if (gguf_get_str(g, "tokenizer.ggml.model", &model) != 0 || !gguf_find(g, "tokenizer.ggml.tokens")) return 0;
    bool spm = gguf_str_eq(model, "llama");
    const struct known_pre *kp = NULL;
    if (!spm && !gguf_str_eq(model, "gpt2")) {
        LOG_ERR("%s: tokenizer model '%.*s' cannot be written as tokenizer.json (only 'llama' and 'gpt2')", g->path,
                (int)(model.len > 40 ? 40 : model.len), model.ptr);
        return KVLLM_EUNSUPPORTED;
    }
    if (!spm) {
        struct gguf_str pre = { "", 0 };
        gguf_get_str(g, "tokenizer.ggml.pre", &pre);
        for (size_t i = 0; i < sizeof k_pre_alias / sizeof k_pre_alias[0] && !kp; i++)
            if (gguf_str_eq(pre, k_pre_alias[i].name))
                for (size_t k = 0; k < N_KNOWN_PRE; k++)
                    if (!strcmp(hf_known_pre[k].name, k_pre_alias[i].as)) kp = &hf_known_pre[k];
        if (!kp && gguf_str_eq(pre, "kvllm-regex")) return write_custom(g, dir);
        if (!kp) {
            LOG_ERR("%s: pre-tokenizer '%.*s' (tokenizer.ggml.pre) cannot be written as tokenizer.json (known: gpt-2, "
                    "llama-bpe, smaug-bpe, qwen2, smollm, starcoder and their aliases)", g->path,
                    (int)(pre.len > 40 ? 40 : pre.len), pre.ptr);
            return KVLLM_EUNSUPPORTED;
        }
    }
    return write_with(g, dir, spm, kp);
}

static int write_with(const struct gguf *g, const char *dir, bool spm, const struct known_pre *kp) {
    struct wctx w = { .g = g };
    const struct gguf_kv *tokens;
    int rc = gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_T_STRING, &tokens);
    if (rc) return rc;
    if (tokens->v.arr.n == 0 || tokens->v.arr.n > MAX_VOCAB) {
        LOG_ERR("%s: tokenizer.ggml.tokens has %llu entries", g->path, (unsigned long long)tokens->v.arr.n);
        return KVLLM_EFORMAT;
    }
    w.tok = tokens->v.arr.strs;
    w.n = (int)tokens->v.arr.n;
    rc = gguf_get_arr(g, "tokenizer.ggml.token_type", GGUF_T_INT32, &w.types);
    if (rc == KVLLM_ENOTFOUND) w.types = NULL, rc = 0;
    if (!rc && spm) {
        rc = gguf_get_arr(g, "tokenizer.ggml.scores", GGUF_T_FLOAT32, &w.scores);
        if (rc == KVLLM_ENOTFOUND) w.scores = NULL, rc = 0;
    }
    if (!rc && ((w.types && w.types->v.arr.n != (uint64_t)w.n) || (w.scores && w.scores->v.arr.n != (uint64_t)w.n))) {
        LOG_ERR("%s: tokenizer.ggml.token_type / scores do not have one entry per token", g->path);
        rc = KVLLM_EFORMAT;
    }
    if (!rc) rc = piece_index_build(&w.idx, w.tok, w.n);
    if (!rc) rc = write_tokenizer(&w, dir, spm, kp);
    free(w.idx.slots);
    return rc;
}
