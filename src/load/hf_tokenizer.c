/* hf_tokenizer.c — Hugging Face tokenizer.json (+ tokenizer_config.json)
 * read into GGUF tokenizer.ggml.* keys (see hf.h); the way back is
 * hf_tokenizer_write.c.
 *
 * Model of the world: kvllm's tokenizer (src/tok) is built from GGUF keys,
 * so a tokenizer.json is translated into those keys, as llama.cpp's
 * converter does, and a GGUF vocabulary is translated back when a folder
 * is written.  Two shapes of tokenizer.json are understood, the two that
 * the Llama-family models ship:
 *
 *   byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM): model BPE with merges,
 *   pre_tokenizer ByteLevel, alone or after Split regexes / Digits in a
 *   Sequence -> tokenizer.ggml.model "gpt2", .merges, and .pre named as
 *   llama.cpp names the pre-tokenizer whose regexes these are;
 *
 *   SentencePiece-style BPE (Llama 2, TinyLlama, Mistral): normalizer
 *   Sequence[Prepend("▁"), Replace(" ", "▁")] (or a Metaspace
 *   pre-tokenizer), model BPE with byte_fallback -> tokenizer.ggml.model
 *   "llama" with scores: a piece's score is minus the rank of the first
 *   merge that makes it, so SentencePiece's "best-scoring pair first" is
 *   HF's "lowest merge rank first".
 *
 * added_tokens: special -> CONTROL, others -> USER_DEFINED (always matched
 * before BPE).  post_processor TemplateProcessing with a leading special
 * token decides BOS (tokenizer_config.json's add_bos_token overrides).
 * Anything else (another model, normalizer or pre-tokenizer type) is
 * refused with the file and the JSON path of what is not understood. */
#include "load/hf.h"
#include "load/hf_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* How far past the vocabulary's entries an id may lie (holes, added tokens). */
#define MAX_ADDED_GAP (1 << 16)

/* ---- the byte-level pre-tokenizers kvllm knows, in tokenizer.json's spelling ---- */

#define HF_RE_LLAMA3 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define HF_RE_QWEN2 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

const struct known_pre hf_known_pre[N_KNOWN_PRE] = {
    { "gpt-2", false, { PRE_BYTELEVEL } },
    { "llama-bpe", true, { HF_RE_LLAMA3 } },
    { "smaug-bpe", false, { HF_RE_LLAMA3 } },
    { "qwen2", false, { HF_RE_QWEN2 } },
    { "smollm", false, { PRE_DIGIT, PRE_BYTELEVEL } },
};

/* ---- small JSON helpers ---- */

static json_object *jget(json_object *o, const char *key) {
    json_object *v;
    return o && json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, key, &v) && v ? v : NULL;
}

static const char *jstr(json_object *o, const char *key) {
    json_object *v = jget(o, key);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

/* A field's type, for messages. */
static const char *jtype(json_object *v) {
    return v ? json_type_to_name(json_object_get_type(v)) : "missing";
}

/* ---- piece -> id: an open-addressing hash over an array of pieces ---- */

int piece_index_find(const struct piece_index *x, const char *s, size_t n) {
    for (uint32_t i = hash_bytes(s, n) & x->mask;; i = (i + 1) & x->mask) {
        int32_t id = x->slots[i];
        if (id < 0) return -1;
        if (x->tok[id].len == n && memcmp(x->tok[id].ptr, s, n) == 0) return id;
    }
}

int piece_index_build(struct piece_index *x, const struct gguf_str *tok, int n) {
    uint32_t n_slots = 1024;
    while (n_slots < 2u * (uint32_t)n) n_slots *= 2;
    x->tok = tok;
    x->slots = xmalloc(n_slots * sizeof *x->slots);
    if (!x->slots) return KVLLM_ENOMEM;
    memset(x->slots, 0xff, n_slots * sizeof *x->slots);
    x->mask = n_slots - 1;
    for (int id = 0; id < n; id++) {
        uint32_t i = hash_bytes(tok[id].ptr, tok[id].len) & x->mask;
        while (x->slots[i] >= 0 && !(tok[x->slots[i]].len == tok[id].len &&
                                     !memcmp(tok[x->slots[i]].ptr, tok[id].ptr, tok[id].len)))
            i = (i + 1) & x->mask;
        if (x->slots[i] < 0) x->slots[i] = id;
    }
    return 0;
}

/* ---- reading state ---- */

struct reader {
    const char *path;       /* tokenizer.json, for messages */
    int n;                  /* token count (max id + 1) */
    struct gguf_str *tok;   /* (n) pieces; NULL ptr until set */
    int32_t *type;          /* (n) */
    float *score;           /* (n) SentencePiece style only */
    char *pad;              /* "[PADn]" texts for ids nobody names */
    struct piece_index idx; /* piece -> id */
    bool spm, byte_fallback, ignore_merges;
    const char *pre_steps[MAX_PRE];
    int n_pre;
    bool has_bytelevel, prepend, replace, metaspace;
    struct gguf_str *merges; /* byte-level: "a b" strings */
    char *merge_text;
    uint64_t n_merges;
    int bos, eos, unk;
    int add_bos;            /* -1 unknown */
};

static int lookup(const struct reader *r, const char *s, size_t n) { return piece_index_find(&r->idx, s, n); }

static void reader_free(struct reader *r) {
    free(r->tok);
    free(r->type);
    free(r->score);
    free(r->pad);
    free(r->idx.slots);
    free(r->merges);
    free(r->merge_text);
}

/* ---- model: vocab, added_tokens ---- */

static int check_id(const struct reader *r, const char *where, json_object *v, int64_t *id) {
    *id = v && json_object_is_type(v, json_type_int) ? json_object_get_int64(v) : -1;
    if (*id < 0 || *id >= MAX_VOCAB) {
        LOG_ERR("%s: %s: token id must be an integer in [0, %d), got %.40s", r->path, where, MAX_VOCAB,
                v ? json_object_to_json_string(v) : "nothing");
        return KVLLM_EFORMAT;
    }
    return 0;
}

static int read_vocab(struct reader *r, json_object *model, json_object *added) {
    json_object *vocab = jget(model, "vocab");
    if (!vocab || !json_object_is_type(vocab, json_type_object)) {
        LOG_ERR("%s: model.vocab: expected an object (piece -> id), got %s", r->path, jtype(vocab));
        return KVLLM_EFORMAT;
    }
    if (added && !json_object_is_type(added, json_type_array)) {
        LOG_ERR("%s: added_tokens: expected an array, got %s", r->path, jtype(added));
        return KVLLM_EFORMAT;
    }
    int64_t max_vocab = -1, max_id = -1, id;
    int rc;
    json_object_object_foreach(vocab, key, val) {
        char where[96];
        snprintf(where, sizeof where, "model.vocab[\"%.40s\"]", key);
        if ((rc = check_id(r, where, val, &id))) return rc;
        if (id > max_vocab) max_vocab = id;
    }
    /* The tables below are sized by the largest id: a few entries with ids in
     * the millions would cost gigabytes for nothing.  Real vocabularies number
     * their pieces 0..n-1, at most with a few holes. */
    const int64_t n_vocab = json_object_object_length(vocab);
    if (max_vocab > n_vocab + MAX_ADDED_GAP) {
        LOG_ERR("%s: model.vocab: id %lld lies far past the vocabulary's %lld entries", r->path,
                (long long)max_vocab, (long long)n_vocab);
        return KVLLM_EFORMAT;
    }
    max_id = max_vocab;
    size_t n_added = added ? json_object_array_length(added) : 0;
    for (size_t i = 0; i < n_added; i++) {
        json_object *a = json_object_array_get_idx(added, i);
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu].id", i);
        if ((rc = check_id(r, where, jget(a, "id"), &id))) return rc;
        if (!jstr(a, "content")) {
            LOG_ERR("%s: added_tokens[%zu].content: expected a string, got %s", r->path, i, jtype(jget(a, "content")));
            return KVLLM_EFORMAT;
        }
        if (id > max_vocab + MAX_ADDED_GAP) {
            LOG_ERR("%s: added_tokens[%zu].id %lld lies far past the vocabulary (%lld entries)", r->path, i,
                    (long long)id, (long long)max_vocab + 1);
            return KVLLM_EFORMAT;
        }
        if (id > max_id) max_id = id;
    }
    if (max_id < 0) {
        LOG_ERR("%s: model.vocab: the vocabulary is empty", r->path);
        return KVLLM_EFORMAT;
    }
    r->n = (int)max_id + 1;
    r->tok = xcalloc((size_t)r->n, sizeof *r->tok);
    r->type = xcalloc((size_t)r->n, sizeof *r->type);
    r->score = xcalloc((size_t)r->n, sizeof *r->score);
    r->pad = xmalloc((size_t)r->n * 16);
    if (!r->tok || !r->type || !r->score || !r->pad) return KVLLM_ENOMEM;
    json_object_object_foreach(vocab, key2, val2) {
        id = json_object_get_int64(val2);
        size_t len = strlen(key2);
        if (r->tok[id].ptr && !(r->tok[id].len == len && !memcmp(r->tok[id].ptr, key2, len))) {
            LOG_ERR("%s: model.vocab: id %lld is given to both \"%.40s\" and \"%.40s\"", r->path, (long long)id,
                    r->tok[id].ptr, key2);
            return KVLLM_EFORMAT;
        }
        r->tok[id] = (struct gguf_str){ key2, len };
        r->type[id] = T_NORMAL;
    }
    for (size_t i = 0; i < n_added; i++) {
        json_object *a = json_object_array_get_idx(added, i), *sp = jget(a, "special");
        id = json_object_get_int64(jget(a, "id"));
        json_object *c = jget(a, "content");
        r->tok[id] = (struct gguf_str){ json_object_get_string(c), (uint64_t)json_object_get_string_len(c) };
        if (sp && !json_object_is_type(sp, json_type_boolean)) {
            LOG_ERR("%s: added_tokens[%zu].special: expected true or false, got %s", r->path, i, jtype(sp));
            return KVLLM_EFORMAT;
        }
        r->type[id] = sp && json_object_get_boolean(sp) ? T_CONTROL : T_USER;
    }
    for (int k = 0; k < r->n; k++)
        if (!r->tok[k].ptr) {
            char *p = r->pad + (size_t)k * 16;
            snprintf(p, 16, "[PAD%d]", k);
            r->tok[k] = (struct gguf_str){ p, strlen(p) };
            r->type[k] = T_UNUSED;
        }
    return piece_index_build(&r->idx, r->tok, r->n);
}

/* One merge: "a b" or ["a", "b"]; a, b and a+b must all be pieces. */
static int read_merge(struct reader *r, json_object *m, uint64_t i, const char **a, size_t *na, const char **b,
                      size_t *nb) {
    if (json_object_is_type(m, json_type_string)) {
        const char *s = json_object_get_string(m), *sp = strchr(s, ' ');
        if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' ')) {
            LOG_ERR("%s: model.merges[%llu]: \"%.40s\" is not two pieces separated by one space", r->path,
                    (unsigned long long)i, s);
            return KVLLM_EFORMAT;
        }
        *a = s, *na = (size_t)(sp - s), *b = sp + 1, *nb = strlen(sp + 1);
    } else if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2 &&
               json_object_is_type(json_object_array_get_idx(m, 0), json_type_string) &&
               json_object_is_type(json_object_array_get_idx(m, 1), json_type_string)) {
        json_object *x = json_object_array_get_idx(m, 0), *y = json_object_array_get_idx(m, 1);
        *a = json_object_get_string(x), *na = (size_t)json_object_get_string_len(x);
        *b = json_object_get_string(y), *nb = (size_t)json_object_get_string_len(y);
    } else {
        LOG_ERR("%s: model.merges[%llu]: expected \"a b\" or [\"a\", \"b\"], got %.60s", r->path,
                (unsigned long long)i, json_object_to_json_string(m));
        return KVLLM_EFORMAT;
    }
    if (lookup(r, *a, *na) < 0 || lookup(r, *b, *nb) < 0) {
        bool left = lookup(r, *a, *na) < 0;
        LOG_ERR("%s: model.merges[%llu]: \"%.*s\" is not in the vocabulary", r->path, (unsigned long long)i,
                (int)(left ? (*na > 40 ? 40 : *na) : (*nb > 40 ? 40 : *nb)), left ? *a : *b);
        return KVLLM_EFORMAT;
    }
    return 0;
}

static int read_merges(struct reader *r, json_object *model) {
    json_object *ms = jget(model, "merges");
    if (!ms || !json_object_is_type(ms, json_type_array)) {
        LOG_ERR("%s: model.merges: expected an array, got %s", r->path, jtype(ms));
        return KVLLM_EFORMAT;
    }
    uint64_t n = json_object_array_length(ms);
    size_t total = 0;
    char *cat = NULL;
    size_t cap_cat = 0;
    int rc = 0;
    if (!r->spm) {
        r->merges = xmalloc((n ? n : 1) * sizeof *r->merges);
        if (!r->merges) return KVLLM_ENOMEM;
    } else {
        for (int id = 0; id < r->n; id++) r->score[id] = -1e9f;
    }
    /* pass 1: check, measure; SentencePiece style: scores */
    for (uint64_t i = 0; i < n && !rc; i++) {
        const char *a, *b;
        size_t na, nb;
        if ((rc = read_merge(r, json_object_array_get_idx(ms, i), i, &a, &na, &b, &nb))) break;
        if (na + nb + 1 > cap_cat) {
            free(cat);
            cap_cat = 2 * (na + nb + 1);
            if (!(cat = xmalloc(cap_cat))) { rc = KVLLM_ENOMEM; break; }
        }
        memcpy(cat, a, na);
        memcpy(cat + na, b, nb);
        int id = lookup(r, cat, na + nb);
        if (id < 0) {
            LOG_ERR("%s: model.merges[%llu]: the merged piece \"%.*s\" is not in the vocabulary", r->path,
                    (unsigned long long)i, (int)(na + nb > 40 ? 40 : na + nb), cat);
            rc = KVLLM_EFORMAT;
        } else if (r->spm) {
            if (r->score[id] < -(float)i) r->score[id] = -(float)i; /* the first merge making it */
        } else if (memchr(a, ' ', na) || memchr(b, ' ', nb)) {
            LOG_ERR("%s: model.merges[%llu]: a byte-level piece holds a space", r->path, (unsigned long long)i);
            rc = KVLLM_EFORMAT;
        } else {
            total += na + nb + 1;
        }
    }
    free(cat);
    if (rc || r->spm) return rc;
    r->merge_text = xmalloc(total ? total : 1);
    if (!r->merge_text) return KVLLM_ENOMEM;
    size_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        const char *a, *b;
        size_t na, nb;
        read_merge(r, json_object_array_get_idx(ms, i), i, &a, &na, &b, &nb);
        char *p = r->merge_text + off;
        memcpy(p, a, na);
        p[na] = ' ';
        memcpy(p + na + 1, b, nb);
        r->merges[i] = (struct gguf_str){ p, na + 1 + nb };
        off += na + 1 + nb;
    }
    r->n_merges = n;
    return 0;
}

/* ---- normalizer and pre-tokenizer ---- */

static bool is_str_pattern(json_object *pat, const char *s) {
    const char *v = jstr(pat, "String");
    return v && !strcmp(v, s);
}

static int read_normalizer(struct reader *r, json_object *n, const char *where) {
    if (!n) return 0;
    const char *ty = jstr(n, "type");
    if (!ty) {
        LOG_ERR("%s: %s.type: expected a string, got %s", r->path, where, jtype(jget(n, "type")));
        return KVLLM_EFORMAT;
    }
    if (!strcmp(ty, "Sequence")) {
        json_object *list = jget(n, "normalizers");
        if (!list || !json_object_is_type(list, json_type_array)) {
            LOG_ERR("%s: %s.normalizers: expected an array, got %s", r->path, where, jtype(list));
            return KVLLM_EFORMAT;
        }
        for (size_t i = 0; i < json_object_array_length(list); i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", where, i);
            int rc = read_normalizer(r, json_object_array_get_idx(list, i), sub);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(ty, "Prepend") && jstr(n, "prepend") && !strcmp(jstr(n, "prepend"), SPM_SPACE)) {
        r->prepend = true;
        return 0;
    }
    if (!strcmp(ty, "Replace") && is_str_pattern(jget(n, "pattern"), " ") && jstr(n, "content") &&
        !strcmp(jstr(n, "content"), SPM_SPACE)) {
        r->replace = true;
        return 0;
    }
    if (!strcmp(ty, "NFC")) return 0; /* not applied, as in llama.cpp: text is expected in NFC */
    LOG_ERR("%s: %s: normalizer %s is not supported (supported: Sequence of Prepend(\"\xe2\x96\x81\") and "
            "Replace(\" \", \"\xe2\x96\x81\"), NFC)", r->path, where, json_object_to_json_string(n));
    return KVLLM_EUNSUPPORTED;
}

static int add_step(struct reader *r, const char *step, const char *where) {
    if (r->n_pre == MAX_PRE) {
        LOG_ERR("%s: %s: more than %d pre-tokenizer steps", r->path, where, MAX_PRE);
        return KVLLM_EUNSUPPORTED;
    }
    r->pre_steps[r->n_pre++] = step;
    return 0;
}

static int read_pretok(struct reader *r, json_object *p, const char *where) {
    if (!p) return 0;
    const char *ty = jstr(p, "type");
    if (!ty) {
        LOG_ERR("%s: %s.type: expected a string, got %s", r->path, where, jtype(jget(p, "type")));
        return KVLLM_EFORMAT;
    }
    json_object *v;
    if (!strcmp(ty, "Sequence")) {
        json_object *list = jget(p, "pretokenizers");
        if (!list || !json_object_is_type(list, json_type_array)) {
            LOG_ERR("%s: %s.pretokenizers: expected an array, got %s", r->path, where, jtype(list));
            return KVLLM_EFORMAT;
        }
        for (size_t i = 0; i < json_object_array_length(list); i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", where, i);
            int rc = read_pretok(r, json_object_array_get_idx(list, i), sub);
            if (rc) return rc;
        }
        return 0;
    }
    if (r->has_bytelevel) {
        LOG_ERR("%s: %s: a pre-tokenizer after ByteLevel is not supported", r->path, where);
        return KVLLM_EUNSUPPORTED;
    }
    if (!strcmp(ty, "ByteLevel")) {
        if ((v = jget(p, "add_prefix_space")) && json_object_get_boolean(v)) {
            LOG_ERR("%s: %s.add_prefix_space: true is not supported", r->path, where);
            return KVLLM_EUNSUPPORTED;
        }
        r->has_bytelevel = true;
        v = jget(p, "use_regex");
        return v && !json_object_get_boolean(v) ? 0 : add_step(r, PRE_BYTELEVEL, where);
    }
    if (!strcmp(ty, "Split")) {
        const char *re = jstr(jget(p, "pattern"), "Regex");
        const char *behavior = jstr(p, "behavior");
        v = jget(p, "invert");
        if (!re) {
            LOG_ERR("%s: %s.pattern: only {\"Regex\": ...} split patterns are supported, got %.60s", r->path, where,
                    jget(p, "pattern") ? json_object_to_json_string(jget(p, "pattern")) : "nothing");
            return KVLLM_EUNSUPPORTED;
        }
        if (!behavior || strcmp(behavior, "Isolated") || (v && json_object_get_boolean(v))) {
            LOG_ERR("%s: %s: only Split with behavior \"Isolated\" and invert false is supported", r->path, where);
            return KVLLM_EUNSUPPORTED;
        }
        return add_step(r, re, where);
    }
    if (!strcmp(ty, "Digits")) {
        v = jget(p, "individual_digits");
        return add_step(r, v && json_object_get_boolean(v) ? PRE_DIGIT : PRE_DIGITS, where);
    }
    if (!strcmp(ty, "Metaspace")) {
        const char *rep = jstr(p, "replacement"), *scheme = jstr(p, "prepend_scheme");
        v = jget(p, "split");
        json_object *aps = jget(p, "add_prefix_space");
        bool prefix = scheme ? strcmp(scheme, "never") != 0 : !aps || json_object_get_boolean(aps);
        if (!rep || strcmp(rep, SPM_SPACE) || (v && json_object_get_boolean(v)) || !prefix) {
            LOG_ERR("%s: %s: only Metaspace(\"\xe2\x96\x81\", prepend, split false) is supported", r->path, where);
            return KVLLM_EUNSUPPORTED;
        }
        r->metaspace = true;
        return 0;
    }
    LOG_ERR("%s: %s.type: pre-tokenizer '%.40s' is not supported (supported: ByteLevel, Split, Digits, "
            "Metaspace, Sequence)", r->path, where, ty);
    return KVLLM_EUNSUPPORTED;
}

/* The tokenizer.ggml.pre name of the byte-level pre-tokenizer read, or
 * NULL when it is none of the known ones (its regexes are then stored). */
static const char *pre_name(const struct reader *r) {
    for (size_t k = 0; k < N_KNOWN_PRE; k++) {
        const struct known_pre *kp = &hf_known_pre[k];
        int n = 0;
        while (n < MAX_PRE && kp->steps[n]) n++;
        if (n != r->n_pre || kp->ignore_merges != r->ignore_merges) continue;
        bool same = true;
        for (int i = 0; i < n && same; i++) same = !strcmp(kp->steps[i], r->pre_steps[i]);
        if (same) return kp->name;
    }
    return NULL;
}

/* The byte-level pre-tokenizer as explicit regexes (tokenizer.kvllm.pre_regex,
 * which overrides tokenizer.ggml.pre in bpe.c): HF's Oniguruma syntax of
 * these patterns is also PCRE2's. */
#define HF_RE_BYTELEVEL "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

static int set_custom_pre(const struct reader *r, struct gguf *g) {
    struct gguf_str pat[MAX_PRE];
    for (int i = 0; i < r->n_pre; i++) {
        const char *st = r->pre_steps[i];
        const char *re = !strcmp(st, PRE_BYTELEVEL) ? HF_RE_BYTELEVEL : !strcmp(st, PRE_DIGIT) ? "\\p{N}"
                         : !strcmp(st, PRE_DIGITS) ? "\\p{N}+" : st;
        pat[i] = (struct gguf_str){ re, strlen(re) };
    }
    if (r->n_pre == 0) {
        LOG_ERR("%s: pre_tokenizer: ByteLevel with use_regex false and no Split before it is not supported", r->path);
        return KVLLM_EUNSUPPORTED;
    }
    int rc = gguf_set_str(g, "tokenizer.ggml.pre", "kvllm-regex");
    if (!rc) rc = gguf_set_arr_str(g, "tokenizer.kvllm.pre_regex", pat, (uint64_t)r->n_pre);
    if (!rc) rc = gguf_set_bool(g, "tokenizer.kvllm.ignore_merges", r->ignore_merges);
    return rc;
}

/* ---- post_processor: BOS ---- */

static int special_id(const struct reader *r, const char *text) {
    return text ? lookup(r, text, strlen(text)) : -1;
}

static int read_post(struct reader *r, json_object *p, const char *where) {
    if (!p) return 0;
    const char *ty = jstr(p, "type");
    if (!ty) {
        LOG_ERR("%s: %s.type: expected a string, got %s", r->path, where, jtype(jget(p, "type")));
        return KVLLM_EFORMAT;
    }
    if (!strcmp(ty, "ByteLevel")) return 0;
    if (!strcmp(ty, "Sequence")) {
        json_object *list = jget(p, "processors");
        if (!list || !json_object_is_type(list, json_type_array)) {
            LOG_ERR("%s: %s.processors: expected an array, got %s", r->path, where, jtype(list));
            return KVLLM_EFORMAT;
        }
        for (size_t i = 0; i < json_object_array_length(list); i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", where, i);
            int rc = read_post(r, json_object_array_get_idx(list, i), sub);
            if (rc) return rc;
        }
        return 0;
    }
    if (strcmp(ty, "TemplateProcessing")) {
        LOG_ERR("%s: %s.type: post-processor '%.40s' is not supported (supported: TemplateProcessing, "
                "ByteLevel, Sequence)", r->path, where, ty);
        return KVLLM_EUNSUPPORTED;
    }
    json_object *single = jget(p, "single");
    if (!single || !json_object_is_type(single, json_type_array)) {
        LOG_ERR("%s: %s.single: expected an array, got %s", r->path, where, jtype(single));
        return KVLLM_EFORMAT;
    }
    size_t n = json_object_array_length(single);
    bool seen_text = false;
    r->add_bos = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *item = json_object_array_get_idx(single, i), *st = jget(item, "SpecialToken");
        if (jget(item, "Sequence")) { seen_text = true; continue; }
        const char *text = jstr(st, "id");
        if (!text) {
            LOG_ERR("%s: %s.single[%zu]: expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}",
                    r->path, where, i);
            return KVLLM_EFORMAT;
        }
        if (seen_text || r->add_bos == 1) {
            LOG_ERR("%s: %s.single[%zu]: only one special token before the text is supported (BOS)", r->path,
                    where, i);
            return KVLLM_EUNSUPPORTED;
        }
        /* its id: special_tokens[text].ids[0], else the piece */
        json_object *ids = jget(jget(jget(p, "special_tokens"), text), "ids");
        int id = ids && json_object_is_type(ids, json_type_array) && json_object_array_length(ids) == 1
                     ? json_object_get_int(json_object_array_get_idx(ids, 0)) : special_id(r, text);
        if (id < 0 || id >= r->n) {
            LOG_ERR("%s: %s.single[%zu]: special token \"%.40s\" is not in the vocabulary", r->path, where, i, text);
            return KVLLM_EFORMAT;
        }
        r->bos = id;
        r->add_bos = 1;
    }
    return 0;
}

/* ---- tokenizer_config.json ---- */

/* bos_token etc.: a string, {"content": ...} or null. */
static const char *config_token(json_object *cfg, const char *key) {
    json_object *v = jget(cfg, key);
    if (v && json_object_is_type(v, json_type_object)) return jstr(v, "content");
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static int read_config(struct reader *r, const char *cfg_path, json_object *cfg, struct gguf *g) {
    static const char *const keys[] = { "bos_token", "eos_token", "unk_token" };
    int *dst[] = { &r->bos, &r->eos, &r->unk };
    for (int k = 0; k < 3; k++) {
        const char *text = config_token(cfg, keys[k]);
        if (!text) continue;
        int id = special_id(r, text);
        if (id < 0) {
            LOG_ERR("%s: %s \"%.40s\" is not in the vocabulary of %s", cfg_path, keys[k], text, r->path);
            return KVLLM_EFORMAT;
        }
        *dst[k] = id;
    }
    json_object *v = jget(cfg, "add_bos_token");
    if (v) {
        if (!json_object_is_type(v, json_type_boolean)) {
            LOG_ERR("%s: add_bos_token: expected true or false, got %s", cfg_path, jtype(v));
            return KVLLM_EFORMAT;
        }
        r->add_bos = json_object_get_boolean(v);
    }
    json_object *tpl = jget(cfg, "chat_template");
    if (tpl && json_object_is_type(tpl, json_type_array)) { /* [{"name": ..., "template": ...}]: the default */
        json_object *pick = NULL;
        for (size_t i = 0; i < json_object_array_length(tpl); i++) {
            json_object *e = json_object_array_get_idx(tpl, i);
            const char *name = jstr(e, "name");
            if (!pick || (name && !strcmp(name, "default"))) pick = e;
        }
        tpl = jget(pick, "template");
    }
    if (tpl && !json_object_is_type(tpl, json_type_string)) {
        LOG_ERR("%s: chat_template: expected a string, got %s", cfg_path, jtype(tpl));
        return KVLLM_EFORMAT;
    }
    return tpl ? gguf_set_str(g, "tokenizer.chat_template", json_object_get_string(tpl)) : 0;
}

/* ---- putting it together ---- */

static int first_piece(const struct reader *r, const char *const *names) {
    for (; *names; names++) {
        int id = special_id(r, *names);
        if (id >= 0) return id;
    }
    return -1;
}

static int set_keys(struct reader *r, struct gguf *g) {
    static const char *const bos_names[] = { "<s>", "<|begin_of_text|>", "<|endoftext|>", NULL };
    static const char *const eos_names[] = { "</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", NULL };
    if (r->bos < 0) r->bos = first_piece(r, bos_names);
    if (r->eos < 0) r->eos = first_piece(r, eos_names);
    if (r->add_bos < 0) r->add_bos = 0;
    const char *pre = r->spm ? NULL : pre_name(r);
    int rc = gguf_set_str(g, "tokenizer.ggml.model", r->spm ? "llama" : "gpt2");
    if (!rc && pre) rc = gguf_set_str(g, "tokenizer.ggml.pre", pre);
    if (!rc && !r->spm && !pre) rc = set_custom_pre(r, g);
    if (!rc) rc = gguf_set_arr_str(g, "tokenizer.ggml.tokens", r->tok, (uint64_t)r->n);
    if (!rc) rc = gguf_set_arr(g, "tokenizer.ggml.token_type", GGUF_T_INT32, r->type, (uint64_t)r->n);
    if (!rc && r->spm) rc = gguf_set_arr(g, "tokenizer.ggml.scores", GGUF_T_FLOAT32, r->score, (uint64_t)r->n);
    if (!rc && !r->spm) rc = gguf_set_arr_str(g, "tokenizer.ggml.merges", r->merges, r->n_merges);
    if (!rc && r->bos >= 0) rc = gguf_set_u32(g, "tokenizer.ggml.bos_token_id", (uint32_t)r->bos);
    if (!rc && r->eos >= 0) rc = gguf_set_u32(g, "tokenizer.ggml.eos_token_id", (uint32_t)r->eos);
    if (!rc && r->unk >= 0) rc = gguf_set_u32(g, "tokenizer.ggml.unknown_token_id", (uint32_t)r->unk);
    if (!rc) rc = gguf_set_bool(g, "tokenizer.ggml.add_bos_token", r->add_bos == 1);
    if (!rc) rc = gguf_set_bool(g, "tokenizer.ggml.add_space_prefix", r->spm && (r->prepend || r->metaspace));
    return rc;
}

static int read_tokenizer(struct reader *r, json_object *root, const char *cfg_path, json_object *cfg,
                          struct gguf *g) {
    json_object *model = jget(root, "model");
    if (!model || !json_object_is_type(model, json_type_object)) {
        LOG_ERR("%s: model: expected an object, got %s", r->path, jtype(model));
        return KVLLM_EFORMAT;
    }
    const char *ty = jstr(model, "type");
    if (jget(model, "type") && !ty) {
        LOG_ERR("%s: model.type: expected a string, got %s", r->path, jtype(jget(model, "type")));
        return KVLLM_EFORMAT;
    }
    if (ty ? strcmp(ty, "BPE") != 0 : !jget(model, "merges")) {
        LOG_ERR("%s: model.type: tokenizer model '%.40s' is not supported (only BPE)", r->path, ty ? ty : "(none)");
        return KVLLM_EUNSUPPORTED;
    }
    json_object *v;
    if ((v = jget(model, "byte_fallback"))) r->byte_fallback = json_object_get_boolean(v);
    if ((v = jget(model, "ignore_merges"))) r->ignore_merges = json_object_get_boolean(v);
    int rc = read_normalizer(r, jget(root, "normalizer"), "normalizer");
    if (!rc) rc = read_pretok(r, jget(root, "pre_tokenizer"), "pre_tokenizer");
    if (rc) return rc;
    bool spm_norm = r->replace;
    if (r->has_bytelevel == (spm_norm || r->metaspace)) {
        LOG_ERR("%s: pre_tokenizer: %s", r->path,
                r->has_bytelevel ? "ByteLevel together with SentencePiece-style '\xe2\x96\x81' handling is not supported"
                                 : "neither ByteLevel nor SentencePiece-style normalizer (Prepend + Replace "
                                   "\"\xe2\x96\x81\") or Metaspace: not a tokenizer kvllm supports");
        return KVLLM_EUNSUPPORTED;
    }
    r->spm = !r->has_bytelevel;
    if ((rc = read_vocab(r, model, jget(root, "added_tokens")))) return rc;
    const char *unk = jstr(model, "unk_token");
    if (unk) {
        r->unk = special_id(r, unk);
        if (r->unk < 0) {
            LOG_ERR("%s: model.unk_token \"%.40s\" is not in the vocabulary", r->path, unk);
            return KVLLM_EFORMAT;
        }
        r->type[r->unk] = T_UNKNOWN;
    }
    if (r->spm && r->byte_fallback)
        for (int id = 0; id < r->n; id++) {
            const char *s = r->tok[id].ptr;
            if (r->type[id] == T_NORMAL && r->tok[id].len == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' &&
                strchr("0123456789ABCDEF", s[3]) && strchr("0123456789ABCDEF", s[4]))
                r->type[id] = T_BYTE;
        }
    if ((rc = read_merges(r, model))) return rc;
    if ((rc = read_post(r, jget(root, "post_processor"), "post_processor"))) return rc;
    if (cfg && (rc = read_config(r, cfg_path, cfg, g))) return rc;
    return set_keys(r, g);
}

int hf_tokenizer_read(const char *json_path, const char *config_path, struct gguf *g) {
    json_object *root = NULL, *cfg = NULL;
    struct stat st;
    int rc = hf_read_json(json_path, &root);
    if (!rc && config_path && stat(config_path, &st) == 0) rc = hf_read_json(config_path, &cfg);
    if (!rc) {
        struct reader r = { .path = json_path, .bos = -1, .eos = -1, .unk = -1, .add_bos = -1 };
        rc = read_tokenizer(&r, root, config_path, cfg, g);
        if (rc == KVLLM_ENOMEM) LOG_ERR("%s: out of memory", json_path);
        reader_free(&r);
    }
    json_object_put(cfg);
    json_object_put(root);
    return rc;
}

/* The folder of a file path ("." when none), malloc'd. */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 1;
    char *d = xmalloc(n + 1);
    if (!d) return NULL;
    if (slash) memcpy(d, path, n); else d[0] = '.';
    d[n] = 0;
    if (slash && n == 0) d[0] = '/', d[1] = 0; /* "/tokenizer.json" */
    return d;
}

bool hf_is_tokenizer_json(const char *path) {
    size_t n = path ? strlen(path) : 0;
    struct stat st;
    return n >= 5 && !strcmp(path + n - 5, ".json") && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int hf_vocab_open(const char *path, struct gguf **out) {
    *out = NULL;
    bool folder = hf_is_folder(path);
    char *dir = folder ? NULL : dir_of(path);
    char *json = folder ? hf_path_join(path, "tokenizer.json") : NULL;
    char *cfg = hf_path_join(folder ? path : dir ? dir : ".", "tokenizer_config.json");
    struct gguf *g = gguf_new(path);
    int rc = g && cfg && (dir || folder) && (json || !folder) ? 0 : KVLLM_ENOMEM;
    struct stat st;
    if (!rc && folder && stat(json, &st) != 0) {
        LOG_ERR("%s: the folder has no tokenizer.json", path);
        rc = KVLLM_ENOTFOUND;
    }
    if (!rc) rc = hf_tokenizer_read(folder ? json : path, cfg, g);
    free(dir);
    free(json);
    free(cfg);
    if (rc) { gguf_free(g); return rc; }
    *out = g;
    return 0;
}
