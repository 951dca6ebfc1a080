/* bpe.c — byte-level BPE encoding, as llama.cpp's llm_tokenizer_bpe does it.
 *
 * Model of the world: the text is first cut at special-token text (always
 * for USER_DEFINED pieces, for CONTROL and UNKNOWN pieces only when asked),
 * then each plain fragment is cut into words by the pre-tokenizer's regexes
 * (pretok.c).  Each word is spelled in the byte-level alphabet (unicode.h:
 * one character per byte) and its characters are merged pairwise, always
 * the adjacent pair with the lowest merge rank (ties: leftmost), from a
 * binary heap.  Each resulting symbol is looked up in the vocabulary; one
 * that is not there falls back to the tokens of its single bytes (none for
 * a byte the vocabulary lacks), as llama.cpp does.  With ignore_merges
 * (llama3) a word that is itself a vocabulary piece is emitted whole.
 *
 * Merge ranks live in an open-addressing hash keyed by the merge's text
 * "left right" (as tokenizer.ggml.merges stores it). */
#include "tok/bpe.h"
#include "tok/pretok.h"
#include "tok/bigram_heap.h"
#include "tok/tok_internal.h"
#include "tok/unicode.h"

#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_MERGES "tokenizer.ggml.merges"
#define KEY_PRE    "tokenizer.ggml.pre"
/* kvllm's own keys: split regexes (PCRE2 syntax) that override .pre, and
 * whether a word that is a whole piece skips merging (HF ignore_merges) */
#define KEY_PRE_REGEX         "tokenizer.kvllm.pre_regex"
#define KEY_PRE_IGNORE_MERGES "tokenizer.kvllm.ignore_merges"
#define MAX_MERGES (1 << 24)
#define MAX_VOCAB_ID ((1 << 24) - 1) /* tokenizer.c's vocabulary limit */
#define MAX_ADDED_GAP (1 << 16)      /* added ids may lie this far past vocab.json's last */

struct bpe {
    struct pretok *pre;
    bool ignore_merges, add_bos;
    char *text;            /* every merge "a b", back to back */
    size_t *off;           /* (n_merges + 1): merge r is text[off[r], off[r+1]) */
    int n_merges;
    int32_t *slots;        /* hash merge text -> rank; -1 empty */
    uint32_t slot_mask;
};


/* Rank of merge key[0, n) ("left right"), or -1. */
static int merge_rank(const struct bpe *b, const char *key, size_t n) {
    for (uint32_t i = hash_bytes(key, n) & b->slot_mask;; i = (i + 1) & b->slot_mask) {
        int32_t r = b->slots[i];
        if (r < 0) return -1;
        size_t rn = b->off[r + 1] - b->off[r];
        if (rn == n && memcmp(b->text + b->off[r], key, n) == 0) return r;
    }
}

void bpe_free(struct bpe *b) {
    if (!b) return;
    pretok_free(b->pre);
    free(b->text);
    free(b->off);
    free(b->slots);
    free(b);
}

bool bpe_default_add_bos(const struct bpe *b) { return b->add_bos; }

static int load_merges(struct bpe *b, const struct gguf *g) {
    const struct gguf_kv *kv;
    int rc = gguf_get_arr(g, KEY_MERGES, GGUF_T_STRING, &kv);
    if (rc == KVLLM_ENOTFOUND) {
        /* without merges there is no byte-level BPE to run */
        LOG_ERR("%s: tokenizer model 'gpt2' (byte-level BPE) needs %s, which is missing", g->path, KEY_MERGES);
        return KVLLM_EUNSUPPORTED;
    }
    if (rc < 0) return rc;
    if (kv->v.arr.n > MAX_MERGES) {
        LOG_ERR("%s: %llu merges is more than kvllm supports (%d)", g->path,
                (unsigned long long)kv->v.arr.n, MAX_MERGES);
        return KVLLM_EFORMAT;
    }
    int n = (int)kv->v.arr.n;
    const struct gguf_str *m = kv->v.arr.strs;
    size_t total = 0;
    for (int r = 0; r < n; r++) {
        if (!memchr(m[r].ptr, ' ', (size_t)m[r].len)) {
            LOG_ERR("%s: %s[%d] '%.*s' is not two pieces separated by a space", g->path, KEY_MERGES,
                    r, m[r].len > 32 ? 32 : (int)m[r].len, m[r].ptr);
            return KVLLM_EFORMAT;
        }
        if (m[r].len > ((size_t)1 << 30) - total) {
            LOG_ERR("%s: %s is too long", g->path, KEY_MERGES);
            return KVLLM_EFORMAT;
        }
        total += (size_t)m[r].len;
    }
    uint32_t n_slots = 1024;
    while (n_slots < 2u * (uint32_t)n) n_slots *= 2;
    b->text = xmalloc(total ? total : 1);
    b->off = xmalloc(((size_t)n + 1) * sizeof *b->off);
    b->slots = xmalloc(n_slots * sizeof *b->slots);
    if (!b->text || !b->off || !b->slots) return KVLLM_ENOMEM;
    memset(b->slots, 0xff, n_slots * sizeof *b->slots);
    b->slot_mask = n_slots - 1;
    b->n_merges = n;
    size_t off = 0;
    for (int r = 0; r < n; r++) {
        b->off[r] = off;
        memcpy(b->text + off, m[r].ptr, (size_t)m[r].len);
        off += (size_t)m[r].len;
    }
    b->off[n] = off;
    for (int r = 0; r < n; r++) {
        const char *s = b->text + b->off[r];
        size_t len = b->off[r + 1] - b->off[r];
        uint32_t i = hash_bytes(s, len) & b->slot_mask;
        bool dup = false;
        for (; b->slots[i] >= 0; i = (i + 1) & b->slot_mask) {
            int32_t o = b->slots[i];
            if (b->off[o + 1] - b->off[o] == len && memcmp(b->text + b->off[o], s, len) == 0) { dup = true; break; }
        }
        if (!dup) b->slots[i] = r; /* the first rank of a repeated pair wins */
    }
    return 0;
}

/* A tokenizer.json's own split regexes (hf_tokenizer.c writes them when
 * they are none of the named pre-tokenizers'). */
static int custom_pretok(const struct gguf *g, struct pretok **out) {
    const struct gguf_kv *kv;
    int rc = gguf_get_arr(g, KEY_PRE_REGEX, GGUF_T_STRING, &kv);
    if (rc) return rc;
    struct pretok_info info = { false, false };
    if ((rc = gguf_get_bool(g, KEY_PRE_IGNORE_MERGES, &info.ignore_merges)) == KVLLM_ENOTFOUND) rc = 0;
    if (rc) return rc;
    const char *pat[8];
    char *buf = NULL;
    size_t total = 0;
    uint64_t n = kv->v.arr.n;
    if (n == 0 || n > 8) {
        LOG_ERR("%s: %s has %llu patterns (1 to 8 are supported)", g->path, KEY_PRE_REGEX, (unsigned long long)n);
        return KVLLM_EFORMAT; /* not EUNSUPPORTED: bpe_new reports that as an unknown name */
    }
    for (uint64_t i = 0; i < n; i++) total += (size_t)kv->v.arr.strs[i].len + 1;
    if (!(buf = xmalloc(total))) return KVLLM_ENOMEM;
    size_t off = 0;
    for (uint64_t i = 0; i < n; i++) { /* NUL-terminated copies */
        const struct gguf_str s = kv->v.arr.strs[i];
        memcpy(buf + off, s.ptr, (size_t)s.len);
        buf[off + s.len] = 0;
        pat[i] = buf + off;
        off += (size_t)s.len + 1;
    }
    char what[512];
    snprintf(what, sizeof what, "%s: split regexes (%s)", g->path, KEY_PRE_REGEX);
    rc = pretok_new_patterns(what, pat, (int)n, info, out);
    free(buf);
    return rc;
}

int bpe_new(const struct gguf *g, struct bpe **out) {
    *out = NULL;
    struct bpe *b = xcalloc(1, sizeof *b);
    if (!b) return KVLLM_ENOMEM;
    struct gguf_str pre = { NULL, 0 };
    int rc = gguf_get_str(g, KEY_PRE, &pre);
    if (rc == KVLLM_ENOTFOUND) rc = 0;
    if (rc == 0 && gguf_find(g, KEY_PRE_REGEX)) rc = custom_pretok(g, &b->pre);
    else if (rc == 0) rc = pretok_new(pre.ptr, (size_t)pre.len, &b->pre);
    if (rc == KVLLM_EUNSUPPORTED)
        LOG_ERR("%s: unknown pre-tokenizer '%.*s' (%s); known are llama.cpp's names: gpt-2, llama-bpe, "
                "qwen2, smollm, deepseek-llm, deepseek-coder, falcon, starcoder, refact, mpt, command-r, ...",
                g->path, pre.len > 64 ? 64 : (int)pre.len, pre.ptr, KEY_PRE);
    if (rc == 0) rc = load_merges(b, g);
    if (rc < 0) { bpe_free(b); return rc; }
    struct pretok_info info = pretok_info(b->pre);
    b->ignore_merges = info.ignore_merges;
    b->add_bos = info.add_bos;
    *out = b;
    return 0;
}

/* ---- encoding ---- */

struct id_sink { int32_t *ids; int n_max, n; };

static int sink_push(struct id_sink *o, int32_t id) {
    if (o->n == INT_MAX) return KVLLM_ERANGE;
    if (o->n < o->n_max) o->ids[o->n] = id;
    o->n++;
    return 0;
}

struct symbol {
    int prev, next;  /* neighbours, -1 at the ends */
    uint32_t off, n; /* bytes of the encoded word; n == 0 once merged away */
};

/* Scratch for one encode call, grown as words need. */
struct work {
    char *word;            /* the word in the byte-level alphabet (2 bytes per byte at most) */
    size_t cap_word;
    char *key;             /* "left right" for rank lookups */
    size_t cap_key;
    struct symbol *sym;    /* (cap_sym) */
    struct bigram *heap;   /* (2 * cap_sym) */
    size_t cap_sym;
    int n_heap;
    struct pretok_spans words;
};

static void work_free(struct work *w) {
    free(w->word);
    free(w->key);
    free(w->sym);
    free(w->heap);
    free(w->words.v);
}

static int grow(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *q = realloc(*p, c);
    if (!q) { LOG_ERR("out of memory"); return KVLLM_ENOMEM; }
    *p = q;
    *cap = c;
    return 0;
}

static int work_reserve_sym(struct work *w, size_t n) {
    if (n <= w->cap_sym) return 0;
    free(w->sym);
    free(w->heap);
    w->sym = xmalloc(n * sizeof *w->sym);
    w->heap = xmalloc(2 * n * sizeof *w->heap);
    w->cap_sym = w->sym && w->heap ? n : 0;
    return w->cap_sym ? 0 : KVLLM_ENOMEM;
}

/* Queue left+right if they form a merge.  The key buffer holds a whole word
 * plus a space, reserved by the caller. */
static void try_bigram(const struct bpe *b, struct work *w, int left, int right) {
    if (left < 0 || right < 0) return;
    const struct symbol *l = &w->sym[left], *r = &w->sym[right];
    memcpy(w->key, w->word + l->off, l->n);
    w->key[l->n] = ' ';
    memcpy(w->key + l->n + 1, w->word + r->off, r->n);
    int rank = merge_rank(b, w->key, (size_t)l->n + 1 + r->n);
    if (rank < 0) return;
    bigram_push(w->heap, &w->n_heap, (struct bigram){ (float)rank, left, right, l->n + r->n });
}

/* A symbol that is no piece: the tokens of its single bytes, skipping
 * bytes without one (llama.cpp's fallback). */
static int emit_bytes(const struct tokenizer *t, const char *s, uint32_t n, struct id_sink *o) {
    int rc = 0;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        int id = tok_lookup(t, s + i, 1);
        if (id >= 0) rc = sink_push(o, id);
    }
    return rc;
}

static int encode_word(const struct tokenizer *t, struct work *w, const char *s, size_t n,
                       struct id_sink *o) {
    const struct bpe *b = t->bpe;
    if (n > (size_t)INT_MAX / 4) {
        LOG_ERR("a word of %zu bytes is too long to tokenize", n);
        return KVLLM_ERANGE;
    }
    int rc = grow(&w->word, &w->cap_word, 2 * n);
    if (rc == 0) rc = grow(&w->key, &w->cap_key, 2 * n + 1);
    if (rc == 0) rc = work_reserve_sym(w, n);
    if (rc < 0) return rc;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) len += (size_t)unicode_byte_to_utf8((uint8_t)s[i], w->word + len);
    if (b->ignore_merges) {
        int id = tok_lookup(t, w->word, len);
        if (id >= 0) return sink_push(o, id);
    }
    /* one symbol per input byte: every byte became one character */
    int n_sym = 0;
    for (size_t off = 0; off < len; n_sym++) {
        uint32_t cl = (uint8_t)w->word[off] < 0x80 ? 1 : 2;
        w->sym[n_sym] = (struct symbol){ n_sym - 1, -1, (uint32_t)off, cl };
        if (n_sym > 0) w->sym[n_sym - 1].next = n_sym;
        off += cl;
    }
    w->n_heap = 0;
    for (int i = 1; i < n_sym; i++) try_bigram(b, w, i - 1, i);
    while (w->n_heap > 0) {
        struct bigram g = bigram_pop(w->heap, &w->n_heap);
        struct symbol *l = &w->sym[g.left], *r = &w->sym[g.right];
        if (l->n == 0 || r->n == 0 || l->next != g.right || l->n + r->n != g.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = g.left;
        try_bigram(b, w, l->prev, g.left);
        try_bigram(b, w, g.left, l->next);
    }
    for (int i = n_sym > 0 ? 0 : -1; i >= 0 && rc == 0; i = w->sym[i].next) {
        const char *p = w->word + w->sym[i].off;
        int id = tok_lookup(t, p, w->sym[i].n);
        rc = id >= 0 ? sink_push(o, id) : emit_bytes(t, p, w->sym[i].n, o);
    }
    return rc;
}

static int encode_text(const struct tokenizer *t, struct work *w, const char *s, size_t n,
                       struct id_sink *o) {
    int rc = pretok_split(t->bpe->pre, s, n, &w->words);
    for (size_t i = 0; i < w->words.n && rc == 0; i++)
        rc = encode_word(t, w, s + w->words.v[i].off, w->words.v[i].len, o);
    return rc;
}

/* ---- special-token partition: text runs between special pieces ---- */

/* Encode text[0, len), cutting at the special pieces from index k of
 * t->special on (longest first, so a longer piece wins over its prefix). */
static int encode_specials(const struct tokenizer *t, struct work *w, const char *text, size_t len,
                           int k, bool parse_special, struct id_sink *o) {
    for (; k < t->n_special; k++) {
        int32_t id = t->special[k];
        /* user-defined pieces are always matched, like llama.cpp (and HF) do */
        if (!parse_special && t->types[id] != TOK_USER_DEFINED) continue;
        size_t plen;
        const char *piece = tok_piece(t, id, &plen);
        const char *hit = memmem(text, len, piece, plen);
        if (!hit) continue;
        int rc = 0;
        size_t pos = 0;
        while (rc == 0 && (hit = memmem(text + pos, len - pos, piece, plen)) != NULL) {
            size_t at = (size_t)(hit - text);
            if (at > pos) rc = encode_specials(t, w, text + pos, at - pos, k + 1, parse_special, o);
            if (rc == 0) rc = sink_push(o, id);
            pos = at + plen;
        }
        if (rc == 0 && pos < len) rc = encode_specials(t, w, text + pos, len - pos, k + 1, parse_special, o);
        return rc;
    }
    return len ? encode_text(t, w, text, len, o) : 0;
}

int bpe_encode(const struct tokenizer *t, const char *text, size_t len,
               bool add_bos, bool parse_special, int32_t *ids, int n_max) {
    struct id_sink o = { ids, ids ? n_max : 0, 0 };
    struct work w = { 0 };
    int rc = 0;
    if (add_bos && t->add_bos && t->bos >= 0) rc = sink_push(&o, t->bos);
    if (rc == 0) rc = encode_specials(t, &w, text, len, 0, parse_special, &o);
    work_free(&w);
    return rc < 0 ? rc : o.n;
}

/* ---- vocab.json + merges.txt ---- */

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { LOG_ERR("%s: cannot open", path); return NULL; }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *bigger = realloc(buf, cap *= 2);
        if (!bigger) free(buf);
        buf = bigger;
    }
    bool err = buf && ferror(f);
    fclose(f);
    if (!buf) { LOG_ERR("%s: out of memory", path); return NULL; }
    if (err) { LOG_ERR("%s: read error", path); free(buf); return NULL; }
    *len = n;
    return buf;
}

/* The lines of merges.txt as "a b" strings (pointing into buf). */
static int parse_merges(const char *path, char *buf, size_t len, struct gguf_str **out, uint64_t *n_out) {
    size_t n_lines = 1;
    for (size_t i = 0; i < len; i++) n_lines += buf[i] == '\n';
    struct gguf_str *m = xmalloc(n_lines * sizeof *m);
    if (!m) return KVLLM_ENOMEM;
    uint64_t n = 0;
    size_t line_no = 0;
    for (size_t pos = 0; pos < len; line_no++) {
        const char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len, l = end - pos;
        if (l > 0 && buf[pos + l - 1] == '\r') l--;
        const char *s = buf + pos;
        pos = nl ? end + 1 : len;
        if (l == 0 || (line_no == 0 && l >= 8 && memcmp(s, "#version", 8) == 0)) continue;
        const char *sp = memchr(s, ' ', l);
        if (!sp || sp == s || sp == s + l - 1) {
            LOG_ERR("%s: line %zu is not two pieces separated by a space", path, line_no + 1);
            free(m);
            return KVLLM_EFORMAT;
        }
        m[n++] = (struct gguf_str){ s, l };
    }
    *out = m;
    *n_out = n;
    return 0;
}

/* Fill tokens/types from the vocab.json object; n_vocab covers every id. */
static int vocab_from_json(const char *path, json_object *vocab, const struct bpe_special *sp, int n_sp,
                           struct gguf_str **tokens_out, int32_t **types_out, int *n_out) {
    int64_t max_id = -1;
    json_object_object_foreach(vocab, key, val) {
        (void)key;
        if (!json_object_is_type(val, json_type_int)) {
            LOG_ERR("%s: the id of '%.32s' is not an integer", path, key);
            return KVLLM_EFORMAT;
        }
        int64_t id = json_object_get_int64(val);
        if (id < 0 || id > MAX_VOCAB_ID) {
            LOG_ERR("%s: the id %lld of '%.32s' is out of range", path, (long long)id, key);
            return KVLLM_EFORMAT;
        }
        if (id > max_id) max_id = id;
    }
    /* added tokens extend the vocabulary, within reason (each missing id costs a placeholder) */
    int64_t max_sp = max_id + MAX_ADDED_GAP < MAX_VOCAB_ID ? max_id + MAX_ADDED_GAP : MAX_VOCAB_ID;
    for (int i = 0; i < n_sp; i++) {
        if (sp[i].id < 0 || sp[i].id > max_sp) {
            LOG_ERR("special token '%s' has id %d, out of range (the vocabulary ends at %lld; at most %lld)",
                    sp[i].text, (int)sp[i].id, (long long)max_id, (long long)max_sp);
            return KVLLM_EINVAL;
        }
    }
    for (int i = 0; i < n_sp; i++)
        if (sp[i].id > max_id) max_id = sp[i].id;
    if (max_id < 0) { LOG_ERR("%s: the vocabulary is empty", path); return KVLLM_EFORMAT; }
    int n = (int)max_id + 1;
    struct gguf_str *tokens = xcalloc((size_t)n, sizeof *tokens);
    int32_t *types = xmalloc((size_t)n * sizeof *types);
    if (!tokens || !types) { free(tokens); free(types); return KVLLM_ENOMEM; }
    for (int i = 0; i < n; i++) types[i] = TOK_UNUSED;
    json_object_object_foreach(vocab, key2, val2) {
        int id = (int)json_object_get_int64(val2);
        tokens[id] = (struct gguf_str){ key2, strlen(key2) };
        types[id] = TOK_NORMAL;
    }
    for (int i = 0; i < n_sp; i++) {
        tokens[sp[i].id] = (struct gguf_str){ sp[i].text, strlen(sp[i].text) };
        types[sp[i].id] = TOK_CONTROL;
    }
    *tokens_out = tokens;
    *types_out = types;
    *n_out = n;
    return 0;
}

static int find_token(const struct gguf_str *tokens, int n, const char *s) {
    for (int i = n - 1; i >= 0; i--)
        if (tokens[i].ptr && gguf_str_eq(tokens[i], s)) return i;
    return -1;
}

int bpe_files_to_gguf(const char *vocab_json, const char *merges_txt, const char *pre,
                      const struct bpe_special *specials, int n_specials, struct gguf **out) {
    *out = NULL;
    json_object *vocab = json_object_from_file(vocab_json);
    if (!vocab || !json_object_is_type(vocab, json_type_object)) {
        LOG_ERR("%s: not a JSON object of piece -> id (%s)", vocab_json, json_util_get_last_err());
        json_object_put(vocab);
        return KVLLM_EFORMAT;
    }
    size_t mlen = 0;
    char *mbuf = read_file(merges_txt, &mlen);
    struct gguf_str *tokens = NULL, *merges = NULL;
    int32_t *types = NULL;
    int n = 0;
    uint64_t n_merges = 0;
    int rc = mbuf ? 0 : KVLLM_EIO;
    if (rc == 0) rc = parse_merges(merges_txt, mbuf, mlen, &merges, &n_merges);
    if (rc == 0) rc = vocab_from_json(vocab_json, vocab, specials, n_specials, &tokens, &types, &n);
    /* ids no entry names: placeholders, as llama.cpp's converter writes them */
    char (*pad)[24] = NULL;
    if (rc == 0) {
        pad = xmalloc((size_t)n * sizeof *pad);
        if (!pad) rc = KVLLM_ENOMEM;
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        if (tokens[i].ptr) continue;
        int l = snprintf(pad[i], sizeof pad[i], "[PAD%d]", i);
        tokens[i] = (struct gguf_str){ pad[i], (uint64_t)l };
    }
    struct gguf *g = rc == 0 ? gguf_new(vocab_json) : NULL;
    if (rc == 0 && !g) rc = KVLLM_ENOMEM;
    if (rc == 0) {
        int bos = find_token(tokens, n, "<|begin_of_text|>");
        int eos = find_token(tokens, n, "<|end_of_text|>");
        int eot = find_token(tokens, n, "<|endoftext|>");
        if (eot >= 0) {
            types[eot] = TOK_CONTROL;
            if (bos < 0) bos = eot;
            if (eos < 0) eos = eot;
        }
        rc = gguf_set_str(g, "tokenizer.ggml.model", "gpt2");
        if (rc == 0) rc = gguf_set_str(g, KEY_PRE, pre ? pre : "gpt-2");
        if (rc == 0) rc = gguf_set_arr_str(g, "tokenizer.ggml.tokens", tokens, (uint64_t)n);
        if (rc == 0) rc = gguf_set_arr(g, "tokenizer.ggml.token_type", GGUF_T_INT32, types, (uint64_t)n);
        if (rc == 0) rc = gguf_set_arr_str(g, KEY_MERGES, merges, n_merges);
        if (rc == 0 && bos >= 0) rc = gguf_set_u32(g, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
        if (rc == 0 && eos >= 0) rc = gguf_set_u32(g, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
        if (rc == KVLLM_ENOMEM) LOG_ERR("out of memory");
    }
    free(pad);
    free(tokens);
    free(types);
    free(merges);
    free(mbuf);
    json_object_put(vocab);
    if (rc < 0) { gguf_free(g); return rc; }
    *out = g;
    return 0;
}
