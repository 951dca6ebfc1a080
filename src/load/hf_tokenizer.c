/* hf_tokenizer.c — Hugging Face tokenizer.json (+ tokenizer_config.json)
 * <-> GGUF tokenizer.ggml.* keys (see hf.h).
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

#define MAX_VOCAB (1 << 24)
#define MAX_ADDED_GAP (1 << 16)

/* Token types as GGUF stores them (tok/tokenizer.h's enum tok_type). */
enum { T_NORMAL = 1, T_UNKNOWN = 2, T_CONTROL = 3, T_USER = 4, T_UNUSED = 5, T_BYTE = 6 };

static const char SPM_SPACE[] = "\xe2\x96\x81"; /* '▁' */

/* ---- the byte-level pre-tokenizers kvllm knows, in tokenizer.json's spelling ---- */

/* Entries of a pre-tokenizer description: a Split regex as written, or one
 * of these markers for the built-in steps. */
#define PRE_BYTELEVEL "\x01" "ByteLevel"
#define PRE_DIGIT     "\x01" "Digits1"
#define PRE_DIGITS    "\x01" "Digits+"

#define HF_RE_LLAMA3 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define HF_RE_QWEN2 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

#define MAX_PRE 8

static const struct known_pre {
    const char *name;            /* tokenizer.ggml.pre */
    bool ignore_merges;          /* as llama.cpp attaches it to the name */
    const char *steps[MAX_PRE];  /* NULL-terminated */
} k_known_pre[] = {
    { "gpt-2", false, { PRE_BYTELEVEL } },
    { "llama-bpe", true, { HF_RE_LLAMA3 } },
    { "smaug-bpe", false, { HF_RE_LLAMA3 } },
    { "qwen2", false, { HF_RE_QWEN2 } },
    { "smollm", false, { PRE_DIGIT, PRE_BYTELEVEL } },
};
#define N_KNOWN_PRE (sizeof k_known_pre / sizeof k_known_pre[0])

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

struct piece_index {
    const struct gguf_str *tok;   /* the pieces, not owned */
    int32_t *slots;               /* -1: empty */
    uint32_t mask;
};


/* The id of piece s (n bytes), or -1. */
static int index_find(const struct piece_index *x, const char *s, size_t n) {
    for (uint32_t i = hash_bytes(s, n) & x->mask;; i = (i + 1) & x->mask) {
        int32_t id = x->slots[i];
        if (id < 0) return -1;
        if (x->tok[id].len == n && memcmp(x->tok[id].ptr, s, n) == 0) return id;
    }
}

/* Index tok[0 .. n); a repeated piece keeps its first id. */
static int index_build(struct piece_index *x, const struct gguf_str *tok, int n) {
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

static int lookup(const struct reader *r, const char *s, size_t n) { return index_find(&r->idx, s, n); }

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
    return index_build(&r->idx, r->tok, r->n);
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
        const struct known_pre *kp = &k_known_pre[k];
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

/* ---- writing ---- */

/* tokenizer.ggml.pre names -> the k_known_pre entry that writes them. */
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

static int wlookup(const struct wctx *w, const char *s, size_t n) { return index_find(&w->idx, s, n); }

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
                    if (!strcmp(k_known_pre[k].name, k_pre_alias[i].as)) kp = &k_known_pre[k];
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
    if (!rc) rc = index_build(&w.idx, w.tok, w.n);
    if (!rc) rc = write_tokenizer(&w, dir, spm, kp);
    free(w.idx.slots);
    return rc;
}
