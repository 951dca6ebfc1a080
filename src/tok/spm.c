/* spm.c — SentencePiece BPE encoding, as llama.cpp's llm_tokenizer_spm does it.
 *
 * Model of the world: the text is first cut at special-token text (always
 * for USER_DEFINED pieces, for CONTROL and UNKNOWN pieces only when asked
 * to parse special text).  Each plain fragment has ' ' replaced by '▁' (and
 * a '▁' put in front when it starts the text or follows a special token and
 * the vocab adds a space prefix), is split into UTF-8 characters, and
 * adjacent symbols are merged greedily: always the pair whose concatenation
 * is the best-scoring vocabulary piece (ties: leftmost), kept in a binary
 * heap so the whole thing is O(n log n).  A merged symbol is by construction
 * a vocabulary piece; a single character that is not becomes its <0xNN>
 * byte tokens.  (llama.cpp's resegment also consults a merge history, but
 * only merged symbols could be found there and those are always pieces, so
 * the history is never needed.) */
#include "tok/bigram_heap.h"
#include "tok/tok_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Where ids go: at most n_max are stored, all are counted. */
struct id_sink {
    int32_t *ids;
    int n_max;
    int n;
};

static int sink_push(struct id_sink *o, int32_t id) {
    if (o->n == INT_MAX) return KVLLM_ERANGE;
    if (o->n < o->n_max) o->ids[o->n] = id;
    o->n++;
    return 0;
}

/* A run of text between special tokens, or one special token. */
struct fragment {
    int32_t id;      /* special token, or -1 for text */
    size_t off, len; /* text: bytes [off, off + len) of the input */
};

struct symbol {
    int prev, next;  /* neighbours in the current segmentation, -1 at the ends */
    uint32_t off, n; /* bytes of the escaped text; n == 0 once merged away */
};

/* Scratch for one encode call, grown as fragments need. */
struct work {
    char *text;          /* escaped fragment */
    size_t cap_text;
    struct symbol *sym;  /* (cap_sym) */
    struct bigram *heap; /* (2 * cap_sym) */
    int n_heap;
    size_t cap_sym;
};

/* Room for an escaped fragment of text_bytes bytes. */
static int work_reserve_text(struct work *w, size_t text_bytes) {
    if (text_bytes <= w->cap_text) return 0;
    if (text_bytes > (size_t)INT_MAX) {
        LOG_ERR("text of %zu bytes is too long to tokenize", text_bytes);
        return KVLLM_ERANGE;
    }
    free(w->text);
    w->text = xmalloc(text_bytes);
    w->cap_text = w->text ? text_bytes : 0;
    return w->text ? 0 : KVLLM_ENOMEM;
}

/* Room for n_sym symbols and their merge queue.  The queue never holds more
 * than 2 * n_sym entries: n_sym - 1 initial pairs, and each merge pops one
 * entry and pushes at most two. */
static int work_reserve_sym(struct work *w, size_t n_sym) {
    if (n_sym <= w->cap_sym) return 0;
    free(w->sym);
    free(w->heap);
    w->sym = xmalloc(n_sym * sizeof *w->sym);
    w->heap = xmalloc(2 * n_sym * sizeof *w->heap);
    w->cap_sym = w->sym && w->heap ? n_sym : 0;
    return w->cap_sym ? 0 : KVLLM_ENOMEM;
}

static void work_free(struct work *w) {
    free(w->text);
    free(w->sym);
    free(w->heap);
}

/* ---- the merge queue: a max-heap on (score, -left) ---- */

/* Queue left+right if together they spell a vocabulary piece. */
static void try_bigram(const struct tokenizer *t, struct work *w, int left, int right) {
    if (left < 0 || right < 0) return;
    uint32_t size = w->sym[left].n + w->sym[right].n;
    int id = tok_lookup(t, w->text + w->sym[left].off, size);
    if (id < 0) return;
    bigram_push(w->heap, &w->n_heap, (struct bigram){ -t->scores[id], left, right, size });
}

/* ---- one fragment ---- */

/* Bytes of the UTF-8 character led by c (1 for stray continuation bytes),
 * the same rule as llama.cpp's unicode_len_utf8. */
static uint32_t utf8_len(uint8_t c) {
    static const uint8_t len[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };
    return len[c >> 4];
}

/* Copy s[0, n) into w->text with ' ' -> '▁' (and a leading '▁'); returns the length. */
static size_t escape_spaces(struct work *w, const char *s, size_t n, bool prefix) {
    size_t o = 0;
    if (prefix) { memcpy(w->text, "\xe2\x96\x81", 3); o = 3; }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') { memcpy(w->text + o, "\xe2\x96\x81", 3); o += 3; }
        else w->text[o++] = s[i];
    }
    return o;
}

static size_t count_chars(const char *s, size_t n) {
    size_t count = 0;
    for (size_t off = 0; off < n; count++) off += utf8_len((uint8_t)s[off]);
    return count;
}

static int split_chars(struct work *w, size_t n) {
    int n_sym = 0;
    for (size_t off = 0; off < n;) {
        uint32_t len = utf8_len((uint8_t)w->text[off]);
        if (len > n - off) len = (uint32_t)(n - off);
        w->sym[n_sym] = (struct symbol){ n_sym - 1, -1, (uint32_t)off, len };
        if (n_sym > 0) w->sym[n_sym - 1].next = n_sym;
        n_sym++;
        off += len;
    }
    return n_sym;
}

static void merge_all(const struct tokenizer *t, struct work *w, int n_sym) {
    w->n_heap = 0;
    for (int i = 1; i < n_sym; i++) try_bigram(t, w, i - 1, i);
    while (w->n_heap > 0) {
        struct bigram b = bigram_pop(w->heap, &w->n_heap);
        struct symbol *l = &w->sym[b.left], *r = &w->sym[b.right];
        /* skip entries made stale by an earlier merge of either side */
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = b.left;
        try_bigram(t, w, l->prev, b.left);
        try_bigram(t, w, b.left, l->next);
    }
}

/* A character that is no piece: its byte tokens.  A vocabulary without byte
 * fallback gives <unk> for the character instead. */
static int emit_bytes(const struct tokenizer *t, const char *s, uint32_t n, struct id_sink *o) {
    bool all = true;
    for (uint32_t i = 0; i < n; i++) all = all && t->byte_id[(uint8_t)s[i]] >= 0;
    if (!all) {
        if (t->unk >= 0) return sink_push(o, t->unk);
        LOG_ERR("the vocabulary has neither a token for byte 0x%02X nor an unknown token",
                (unsigned)(uint8_t)s[0]);
        return KVLLM_EUNSUPPORTED;
    }
    for (uint32_t i = 0; i < n; i++) {
        int rc = sink_push(o, t->byte_id[(uint8_t)s[i]]);
        if (rc < 0) return rc;
    }
    return 0;
}

static int encode_fragment(const struct tokenizer *t, struct work *w, const char *s, size_t n,
                           bool prefix, struct id_sink *o) {
    if (n > ((size_t)INT_MAX - 3) / 3) {
        LOG_ERR("text of %zu bytes is too long to tokenize", n);
        return KVLLM_ERANGE;
    }
    int rc = work_reserve_text(w, 3 * n + 3);
    if (rc < 0) return rc;
    size_t len = escape_spaces(w, s, n, prefix);
    if ((rc = work_reserve_sym(w, count_chars(w->text, len))) < 0) return rc;
    int n_sym = split_chars(w, len);
    merge_all(t, w, n_sym);
    for (int i = n_sym > 0 ? 0 : -1; i >= 0 && rc == 0; i = w->sym[i].next) {
        const char *p = w->text + w->sym[i].off;
        int id = tok_lookup(t, p, w->sym[i].n);
        rc = id >= 0 ? sink_push(o, id) : emit_bytes(t, p, w->sym[i].n, o);
    }
    return rc;
}

/* ---- special-token partition ---- */

struct frag_list {
    struct fragment *v;
    int n, cap;
};

static int frag_add(struct frag_list *l, int32_t id, size_t off, size_t len) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        struct fragment *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) { LOG_ERR("out of memory"); return KVLLM_ENOMEM; }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (struct fragment){ id, off, len };
    return 0;
}

/* Cut every text fragment of *l at each occurrence of special token id. */
static int split_on(const struct tokenizer *t, const char *text, int32_t id, struct frag_list *l) {
    size_t plen;
    const char *piece = tok_piece(t, id, &plen);
    struct frag_list out = { 0 };
    int rc = 0;
    for (int i = 0; i < l->n && rc == 0; i++) {
        struct fragment f = l->v[i];
        if (f.id >= 0) { rc = frag_add(&out, f.id, 0, 0); continue; }
        size_t pos = f.off, end = f.off + f.len;
        const char *hit;
        while (rc == 0 && (hit = memmem(text + pos, end - pos, piece, plen)) != NULL) {
            size_t at = (size_t)(hit - text);
            if (at > pos) rc = frag_add(&out, -1, pos, at - pos);
            if (rc == 0) rc = frag_add(&out, id, 0, 0);
            pos = at + plen;
        }
        if (rc == 0 && pos < end) rc = frag_add(&out, -1, pos, end - pos);
    }
    free(l->v);
    *l = out;
    return rc;
}

static int partition(const struct tokenizer *t, const char *text, size_t len, bool parse_special,
                     struct frag_list *l) {
    if (len == 0) return 0;
    int rc = frag_add(l, -1, 0, len);
    for (int i = 0; i < t->n_special && rc == 0; i++) {
        int32_t id = t->special[i];
        /* user-defined pieces are always matched, like llama.cpp (and HF) do */
        if (!parse_special && t->types[id] != TOK_USER_DEFINED) continue;
        size_t plen;
        const char *piece = tok_piece(t, id, &plen);
        if (memmem(text, len, piece, plen)) rc = split_on(t, text, id, l);
    }
    return rc;
}

int tok_spm_encode(const struct tokenizer *t, const char *text, size_t len,
                   bool add_bos, bool parse_special, int32_t *ids, int n_max) {
    struct id_sink o = { ids, ids ? n_max : 0, 0 };
    struct frag_list frags = { 0 };
    struct work w = { 0 };
    int rc = 0;
    if (add_bos && t->add_bos && t->bos >= 0) rc = sink_push(&o, t->bos);
    if (rc == 0) rc = partition(t, text, len, parse_special, &frags);
    /* llama.cpp puts the space prefix before the first text and before text
     * that follows a special token */
    bool after_special = true;
    for (int i = 0; i < frags.n && rc == 0; i++) {
        const struct fragment *f = &frags.v[i];
        if (f->id >= 0) {
            rc = sink_push(&o, f->id);
            after_special = true;
        } else {
            rc = encode_fragment(t, &w, text + f->off, f->len,
                                 t->add_space_prefix && after_special, &o);
            after_special = false;
        }
    }
    free(frags.v);
    work_free(&w);
    return rc < 0 ? rc : o.n;
}
