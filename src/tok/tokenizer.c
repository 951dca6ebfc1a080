/* tokenizer.c — vocabulary loading from GGUF metadata, lookups, decoding.
 *
 * Model of the world: the vocabulary is copied out of the gguf into a few
 * flat arrays (pieces, decoded text, scores, types) plus an open-addressing
 * hash from piece to id.  Everything a token decodes to is computed once
 * here, so decoding is a copy; encoding (spm.c, or bpe.c for byte-level
 * "gpt2" vocabularies) only needs lookups, scores and merge ranks.  The struct is immutable after tokenizer_new: any number of
 * threads may encode and decode with it at once. */
#include "tok/tok_internal.h"
#include "tok/bpe.h"
#include "tok/unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_MODEL     "tokenizer.ggml.model"
#define KEY_TOKENS    "tokenizer.ggml.tokens"
#define KEY_SCORES    "tokenizer.ggml.scores"
#define KEY_TYPES     "tokenizer.ggml.token_type"
#define KEY_BOS       "tokenizer.ggml.bos_token_id"
#define KEY_EOS       "tokenizer.ggml.eos_token_id"
#define KEY_UNK       "tokenizer.ggml.unknown_token_id"
#define KEY_ADD_BOS   "tokenizer.ggml.add_bos_token"
#define KEY_ADD_SPACE "tokenizer.ggml.add_space_prefix"

/* Far beyond any real vocabulary; keeps ids and offsets comfortably in int. */
#define MAX_VOCAB (1 << 24)
#define MAX_PIECE_BYTES ((size_t)1 << 30)

static const char SPM_SPACE[] = "\xe2\x96\x81"; /* U+2581 '▁', SentencePiece's space */

/* ---- piece -> id (hash_bytes: core.h) ---- */

int tok_lookup(const struct tokenizer *t, const char *s, size_t n) {
    for (uint32_t i = hash_bytes(s, n) & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        int32_t id = t->slots[i];
        if (id < 0) return -1;
        size_t pn;
        const char *p = tok_piece(t, id, &pn);
        if (pn == n && memcmp(p, s, n) == 0) return id;
    }
}

/* Insert every piece; a repeated piece maps to its last id, as in llama.cpp. */
static int build_hash(struct tokenizer *t) {
    uint32_t n_slots = 1024;
    while (n_slots < 2u * (uint32_t)t->n_vocab) n_slots *= 2;
    t->slots = xmalloc(n_slots * sizeof *t->slots);
    if (!t->slots) return KVLLM_ENOMEM;
    memset(t->slots, 0xff, n_slots * sizeof *t->slots);
    t->slot_mask = n_slots - 1;
    for (int id = 0; id < t->n_vocab; id++) {
        size_t n;
        const char *s = tok_piece(t, id, &n);
        uint32_t i = hash_bytes(s, n) & t->slot_mask;
        for (;; i = (i + 1) & t->slot_mask) {
            int32_t other = t->slots[i];
            if (other < 0) break;
            size_t on;
            const char *o = tok_piece(t, other, &on);
            if (on == n && memcmp(o, s, n) == 0) break;
        }
        t->slots[i] = id;
    }
    return 0;
}

/* ---- decoded text of each token ---- */

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The byte of a "<0xNN>" piece, or -1 if the piece has another form. */
static int byte_piece_value(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Bytes token id decodes to, written at dst (NULL: only count).  NORMAL and
 * UNDEFINED pieces get '▁' back as ' ' (UNDEFINED is treated as NORMAL so
 * that whatever encode emits decodes); USER_DEFINED text is literal, as
 * llama.cpp prints it; CONTROL, UNKNOWN and UNUSED print nothing. */
static size_t decode_piece(const struct tokenizer *t, int id, char *dst) {
    size_t n;
    const char *s = tok_piece(t, id, &n);
    switch ((enum tok_type)t->types[id]) {
    case TOK_CONTROL: case TOK_UNKNOWN: case TOK_UNUSED:
        return 0;
    case TOK_BYTE:
        if (dst) dst[0] = (char)byte_piece_value(s, n);
        return 1;
    case TOK_USER_DEFINED:
        if (dst) memcpy(dst, s, n);
        return n;
    case TOK_NORMAL: case TOK_UNDEFINED:
        break;
    }
    size_t out = 0;
    if (t->bpe) { /* byte-level: each character stands for one byte */
        for (size_t i = 0; i < n;) {
            size_t len;
            int b = unicode_utf8_to_byte(s + i, n - i, &len);
            if (b >= 0) {
                if (dst) dst[out] = (char)b;
                out++;
            } else { /* not of the alphabet: kept as it is */
                if (dst) memcpy(dst + out, s + i, len);
                out += len;
            }
            i += len;
        }
        return out;
    }
    for (size_t i = 0; i < n;) {
        if (n - i >= 3 && memcmp(s + i, SPM_SPACE, 3) == 0) {
            if (dst) dst[out] = ' ';
            out++;
            i += 3;
        } else {
            if (dst) dst[out] = s[i];
            out++;
            i++;
        }
    }
    return out;
}

static int build_text(struct tokenizer *t) {
    t->text_off = xmalloc(((size_t)t->n_vocab + 1) * sizeof *t->text_off);
    if (!t->text_off) return KVLLM_ENOMEM;
    size_t total = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        t->text_off[id] = total;
        total += decode_piece(t, id, NULL);
    }
    t->text_off[t->n_vocab] = total;
    t->text = xmalloc(total ? total : 1);
    if (!t->text) return KVLLM_ENOMEM;
    for (int id = 0; id < t->n_vocab; id++) decode_piece(t, id, t->text + t->text_off[id]);
    return 0;
}

const char *tok_text(const struct tokenizer *t, int prev, int id, size_t *n) {
    if (id < 0 || id >= t->n_vocab) {
        LOG_ERR("token id %d is out of range (vocabulary of %d)", id, t->n_vocab);
        *n = 0;
        return NULL;
    }
    const char *s = t->text + t->text_off[id];
    *n = t->text_off[id + 1] - t->text_off[id];
    /* encode added a '▁' in front of the text; the first token gives it back */
    /* prev -1: the start of the text; other negatives: a token mid-text */
    bool at_start = prev == -1 || (t->bos >= 0 && prev == t->bos);
    if (t->add_space_prefix && at_start && *n > 0 && s[0] == ' ') { s++; (*n)--; }
    return s;
}

/* ---- byte fallback and special tokens ---- */

static void build_byte_ids(struct tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char hex[8], raw = (char)b;
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int id = tok_lookup(t, hex, 6);
        t->byte_id[b] = id >= 0 ? id : tok_lookup(t, &raw, 1);
    }
}

/* qsort has no context argument: sort (length, id) pairs instead. */
struct special_key { size_t len; int32_t id; };

static int cmp_special(const void *a, const void *b) {
    const struct special_key *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int build_special(struct tokenizer *t) {
    int n = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        enum tok_type ty = t->types[id];
        size_t len;
        tok_piece(t, id, &len);
        if ((ty == TOK_CONTROL || ty == TOK_USER_DEFINED || ty == TOK_UNKNOWN) && len > 0) n++;
    }
    t->n_special = n;
    if (n == 0) return 0;
    struct special_key *keys = xmalloc((size_t)n * sizeof *keys);
    t->special = xmalloc((size_t)n * sizeof *t->special);
    if (!keys || !t->special) { free(keys); return KVLLM_ENOMEM; }
    n = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        enum tok_type ty = t->types[id];
        size_t len;
        tok_piece(t, id, &len);
        if ((ty == TOK_CONTROL || ty == TOK_USER_DEFINED || ty == TOK_UNKNOWN) && len > 0)
            keys[n++] = (struct special_key){ len, id };
    }
    /* longest first, so that "<|im_start|>" wins over a prefix of it */
    qsort(keys, (size_t)n, sizeof *keys, cmp_special);
    for (int i = 0; i < n; i++) t->special[i] = keys[i].id;
    free(keys);
    return 0;
}

/* ---- loading ---- */

/* Is this the (optional) array of the right type and length?  0 and *out =
 * NULL when absent. */
static int optional_array(const struct gguf *g, const char *key, enum gguf_vtype type,
                          uint64_t n_want, const struct gguf_kv **out) {
    *out = NULL;
    int rc = gguf_get_arr(g, key, type, out);
    if (rc == KVLLM_ENOTFOUND) return 0;
    if (rc < 0) return rc;
    if ((*out)->v.arr.n != n_want) {
        LOG_ERR("%s: %s has %llu entries but there are %llu tokens", g->path, key,
                (unsigned long long)(*out)->v.arr.n, (unsigned long long)n_want);
        return KVLLM_EFORMAT;
    }
    return 0;
}

/* A special token id: absent -> def (or -1 if def is out of range). */
static int read_token_id(const struct gguf *g, const char *key, int def, int n_vocab, int *out) {
    uint32_t v;
    int rc = gguf_get_u32(g, key, &v);
    if (rc == KVLLM_ENOTFOUND) { *out = def < n_vocab ? def : -1; return 0; }
    if (rc < 0) return rc;
    if (v >= (uint32_t)n_vocab) {
        LOG_ERR("%s: %s = %u is out of range (vocabulary of %d tokens)", g->path, key, v, n_vocab);
        return KVLLM_EFORMAT;
    }
    *out = (int)v;
    return 0;
}

static int read_bool(const struct gguf *g, const char *key, bool def, bool *out) {
    int rc = gguf_get_bool(g, key, out);
    if (rc == KVLLM_ENOTFOUND) { *out = def; return 0; }
    return rc;
}

/* SentencePiece ("llama") and byte-level BPE ("gpt2") vocabularies;
 * *is_bpe tells which. */
static int check_model(const struct gguf *g, bool *is_bpe) {
    struct gguf_str model;
    int rc = gguf_get_str(g, KEY_MODEL, &model);
    if (rc == KVLLM_ENOTFOUND) {
        LOG_ERR("%s: no vocabulary (%s is missing)", g->path, KEY_MODEL);
        return KVLLM_ENOTFOUND;
    }
    if (rc < 0) return rc;
    if (gguf_str_eq(model, "no_vocab") || gguf_str_eq(model, "none")) {
        LOG_ERR("%s: the file has no vocabulary (%s = '%.*s')", g->path, KEY_MODEL,
                (int)model.len, model.ptr);
        return KVLLM_ENOTFOUND;
    }
    *is_bpe = gguf_str_eq(model, "gpt2");
    if (!gguf_str_eq(model, "llama") && !*is_bpe) {
        int n = model.len > 64 ? 64 : (int)model.len;
        LOG_ERR("%s: tokenizer model '%.*s' is not supported (only 'llama', SentencePiece BPE, "
                "and 'gpt2', byte-level BPE)", g->path, n, model.ptr);
        return KVLLM_EUNSUPPORTED;
    }
    return 0;
}

static int copy_pieces(struct tokenizer *t, const struct gguf *g, const struct gguf_kv *tokens) {
    const struct gguf_str *strs = tokens->v.arr.strs;
    size_t total = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        if (strs[id].len > MAX_PIECE_BYTES - total) {
            LOG_ERR("%s: token pieces are too long (token %d)", g->path, id);
            return KVLLM_EFORMAT;
        }
        total += (size_t)strs[id].len + 1;
    }
    t->piece_off = xmalloc(((size_t)t->n_vocab + 1) * sizeof *t->piece_off);
    t->pieces = xmalloc(total);
    if (!t->piece_off || !t->pieces) return KVLLM_ENOMEM;
    size_t off = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        t->piece_off[id] = off;
        memcpy(t->pieces + off, strs[id].ptr, (size_t)strs[id].len);
        off += (size_t)strs[id].len;
        t->pieces[off++] = 0;
    }
    t->piece_off[t->n_vocab] = off;
    return 0;
}

static int copy_scores_types(struct tokenizer *t, const struct gguf *g) {
    const struct gguf_kv *scores, *types;
    int rc = optional_array(g, KEY_SCORES, GGUF_T_FLOAT32, (uint64_t)t->n_vocab, &scores);
    if (rc == 0) rc = optional_array(g, KEY_TYPES, GGUF_T_INT32, (uint64_t)t->n_vocab, &types);
    if (rc < 0) return rc;
    t->scores = xmalloc((size_t)t->n_vocab * sizeof *t->scores);
    t->types = xmalloc((size_t)t->n_vocab);
    if (!t->scores || !t->types) return KVLLM_ENOMEM;
    for (int id = 0; id < t->n_vocab; id++) {
        t->scores[id] = scores ? (float)gguf_arr_f64(scores, (uint64_t)id) : 0.0f;
        int64_t ty = types ? gguf_arr_i64(types, (uint64_t)id) : TOK_NORMAL;
        if (ty < TOK_UNDEFINED || ty > TOK_BYTE) {
            LOG_ERR("%s: token %d has unknown type %lld", g->path, id, (long long)ty);
            return KVLLM_EFORMAT;
        }
        size_t n;
        const char *s = tok_piece(t, id, &n);
        if (ty == TOK_BYTE && byte_piece_value(s, n) < 0) {
            LOG_ERR("%s: token %d is a byte token but its piece '%.*s' is not <0xNN>",
                    g->path, id, n > 32 ? 32 : (int)n, s);
            return KVLLM_EFORMAT;
        }
        t->types[id] = (uint8_t)ty;
    }
    return 0;
}

static int read_specials(struct tokenizer *t, const struct gguf *g) {
    /* SentencePiece: its usual ids, as llama.cpp assumes for "llama".
     * Byte-level BPE: none unless given; BOS and no space prefix by the
     * pre-tokenizer's defaults (llama.cpp's: BOS for llama3) */
    bool bpe = t->bpe != NULL;
    int rc = read_token_id(g, KEY_BOS, bpe ? -1 : 1, t->n_vocab, &t->bos);
    if (rc == 0) rc = read_token_id(g, KEY_EOS, bpe ? -1 : 2, t->n_vocab, &t->eos);
    if (rc == 0) rc = read_token_id(g, KEY_UNK, bpe ? -1 : 0, t->n_vocab, &t->unk);
    if (rc == 0) rc = read_bool(g, KEY_ADD_BOS, bpe ? bpe_default_add_bos(t->bpe) : true, &t->add_bos);
    if (rc == 0) rc = read_bool(g, KEY_ADD_SPACE, !bpe, &t->add_space_prefix);
    return rc;
}

static int load(struct tokenizer *t, const struct gguf *g) {
    bool is_bpe = false;
    int rc = check_model(g, &is_bpe);
    if (rc < 0) return rc;
    if (is_bpe && (rc = bpe_new(g, &t->bpe)) < 0) return rc;
    const struct gguf_kv *tokens;
    rc = gguf_get_arr(g, KEY_TOKENS, GGUF_T_STRING, &tokens);
    if (rc == KVLLM_ENOTFOUND) LOG_ERR("%s: no vocabulary (%s is missing)", g->path, KEY_TOKENS);
    if (rc < 0) return rc;
    if (tokens->v.arr.n == 0) {
        LOG_ERR("%s: tokenizer has no tokens", g->path);
        return KVLLM_EFORMAT;
    }
    if (tokens->v.arr.n > MAX_VOCAB) {
        LOG_ERR("%s: %llu tokens is more than kvllm supports (%d)", g->path,
                (unsigned long long)tokens->v.arr.n, MAX_VOCAB);
        return KVLLM_EFORMAT;
    }
    t->n_vocab = (int)tokens->v.arr.n;
    if ((rc = copy_pieces(t, g, tokens)) < 0) return rc;
    if ((rc = copy_scores_types(t, g)) < 0) return rc;
    if ((rc = read_specials(t, g)) < 0) return rc;
    if ((rc = build_hash(t)) < 0) return rc;
    if ((rc = build_text(t)) < 0) return rc;
    build_byte_ids(t);
    return build_special(t);
}

int tokenizer_new(const struct gguf *g, struct tokenizer **out) {
    *out = NULL;
    struct tokenizer *t = xcalloc(1, sizeof *t);
    if (!t) return KVLLM_ENOMEM;
    int rc = load(t, g);
    if (rc < 0) { tokenizer_free(t); return rc; }
    *out = t;
    return 0;
}

void tokenizer_free(struct tokenizer *t) {
    if (!t) return;
    free(t->pieces);
    free(t->piece_off);
    free(t->text);
    free(t->text_off);
    free(t->scores);
    free(t->types);
    free(t->slots);
    free(t->special);
    bpe_free(t->bpe);
    free(t);
}

/* ---- encoding: by the vocabulary's model ---- */

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len,
                     bool add_bos, bool parse_special, int32_t *ids, int n_max) {
    if (t->bpe) return bpe_encode(t, text, len, add_bos, parse_special, ids, n_max);
    return tok_spm_encode(t, text, len, add_bos, parse_special, ids, n_max);
}

/* ---- encoding with plain spans: control-token text read as text there ---- */

struct span_enc {
    const struct tokenizer *t;
    const char *base;              /* the whole text: spans are offsets into it */
    const struct tok_span *plain;  /* (n_plain) sorted, disjoint */
    size_t n_plain;
    int32_t *ids;                  /* (n_max), may be NULL when n_max is 0 */
    int n_max, n;                  /* n: ids produced so far (may exceed n_max) */
};

/* Does [off, off + n) overlap a plain span? */
static bool overlaps_plain(const struct span_enc *e, size_t off, size_t n) {
    size_t lo = 0, hi = e->n_plain;   /* first span ending after off */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (e->plain[mid].off + e->plain[mid].len <= off) lo = mid + 1;
        else hi = mid;
    }
    return lo < e->n_plain && e->plain[lo].off < off + n;
}

static int emit_id(struct span_enc *e, int32_t id) {
    if (e->n == INT32_MAX) return KVLLM_ERANGE;
    if (e->ids && e->n < e->n_max) e->ids[e->n] = id;
    e->n++;
    return 0;
}

/* A run with no special piece left to cut: encoded as text (user-defined
 * pieces would still be matched, but none remain). */
static int emit_text(struct span_enc *e, const char *s, size_t n) {
    if (!n) return 0;
    int room = e->ids && e->n < e->n_max ? e->n_max - e->n : 0;
    int k = tokenizer_encode(e->t, s, n, false, false, room ? e->ids + e->n : NULL, room);
    if (k < 0) return k;
    if (k > INT32_MAX - e->n) return KVLLM_ERANGE;
    e->n += k;
    return 0;
}

/* text[0, len) (at offset text - e->base), cut at the special pieces from
 * index k of t->special on, longest first, as spm.c and bpe.c cut: a
 * user-defined piece anywhere, a control or unknown piece only where it
 * overlaps no plain span. */
static int encode_cut(struct span_enc *e, const char *text, size_t len, int k) {
    const struct tokenizer *t = e->t;
    for (; k < t->n_special; k++) {
        int32_t id = t->special[k];
        size_t plen;
        const char *piece = tok_piece(t, id, &plen);
        bool anywhere = t->types[id] == TOK_USER_DEFINED;
        int rc = 0;
        size_t pos = 0, from = 0;
        bool cut = false;
        const char *hit;
        while (rc == 0 && from < len && (hit = memmem(text + from, len - from, piece, plen)) != NULL) {
            size_t at = (size_t)(hit - text);
            if (!anywhere && overlaps_plain(e, (size_t)(text - e->base) + at, plen)) {
                from = at + 1;   /* message text: not a control token */
                continue;
            }
            cut = true;
            if (at > pos) rc = encode_cut(e, text + pos, at - pos, k + 1);
            if (rc == 0) rc = emit_id(e, id);
            pos = from = at + plen;
        }
        if (!cut) continue;
        if (rc == 0 && pos < len) rc = encode_cut(e, text + pos, len - pos, k + 1);
        return rc;
    }
    return emit_text(e, text, len);
}

int tokenizer_encode_spans(const struct tokenizer *t, const char *text, size_t len, bool add_bos,
                           const struct tok_span *plain, size_t n_plain, int32_t *ids, int n_max) {
    struct span_enc e = { t, text, plain, n_plain, ids, ids ? n_max : 0, 0 };
    for (size_t i = 0; i < n_plain; i++)
        if (plain[i].off > len || plain[i].len > len - plain[i].off ||
            (i > 0 && plain[i].off < plain[i - 1].off + plain[i - 1].len)) {
            LOG_ERR("plain span %zu [%zu, +%zu) is out of order or past the %zu-byte text", i, plain[i].off,
                    plain[i].len, len);
            return KVLLM_EINVAL;
        }
    int rc = 0;
    if (add_bos && t->add_bos && t->bos >= 0) rc = emit_id(&e, t->bos);
    if (rc == 0) rc = encode_cut(&e, text, len, 0);
    return rc < 0 ? rc : e.n;
}

/* ---- queries ---- */

int tokenizer_n_vocab(const struct tokenizer *t) { return t->n_vocab; }
int tokenizer_bos(const struct tokenizer *t) { return t->bos; }
int tokenizer_eos(const struct tokenizer *t) { return t->eos; }
bool tokenizer_add_bos(const struct tokenizer *t) { return t->add_bos && t->bos >= 0; }

enum tok_type tokenizer_type(const struct tokenizer *t, int id) {
    return id >= 0 && id < t->n_vocab ? (enum tok_type)t->types[id] : TOK_UNDEFINED;
}

const char *tokenizer_piece(const struct tokenizer *t, int id) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    size_t n;
    return tok_piece(t, id, &n);
}

/* ---- decoding ---- */

int tokenizer_token_bytes(const struct tokenizer *t, int prev, int id, char *buf, size_t cap) {
    size_t n;
    const char *s = tok_text(t, prev, id, &n);
    if (!s) return KVLLM_EINVAL;
    memcpy(buf, s, n < cap ? n : cap);
    return (int)n;
}

int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int n, char *buf, size_t cap) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t len;
        const char *s = tok_text(t, i > 0 ? ids[i - 1] : -1, ids[i], &len);
        if (!s) return KVLLM_EINVAL;
        if (total < cap) memcpy(buf + total, s, len < cap - total ? len : cap - total);
        total += len;
        if (total > INT32_MAX) return KVLLM_ERANGE;
    }
    if (total < cap) buf[total] = 0;
    return (int)total;
}
