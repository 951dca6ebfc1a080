/* matcher.c — the vocabulary trie and the per-sequence matcher.
 *
 * Model of the world.  A matcher's state is a set of stacks of a pushdown
 * automaton over code points (llama.cpp's grammar stacks): each stack is the
 * list of grammar positions still to match, its top a character class; the
 * empty stack means "the grammar may end here".  Tokens are bytes, so the
 * state also holds a partial UTF-8 character (a token may end inside one).
 *
 * Stacks live as nodes (position, parent) in a scratch pool that is reset at
 * the start of every call and hash-consed, so equal stacks are equal node
 * ids: sets dedup by id and a push is one table probe.  Between calls the
 * state is kept flat (positions) in a ring of GM_HISTORY + 1 slots, which
 * is what rollback steps back through.
 *
 * The mask.  All tokens' bytes form a trie (gvocab, nodes in DFS preorder, so
 * a subtree is an index range and its tokens a range of the DFS token order).
 * A walk descends the trie carrying the stack set after the prefix and
 * prunes a subtree as soon as the set is empty.  Walking the whole trie per
 * step would be slow inside a string (nearly every token fits), so, as
 * XGrammar does, the matcher caches per "local context" — the top
 * GM_CACHE_K frames of a stack — the tokens that context accepts no matter
 * what lies below it (accepted without ever popping below the key), and the
 * tokens that do pop below it ("uncertain").  A mask is then, per stack,
 * the cached accepted set OR-ed in, plus a walk with the full stack that
 * visits only subtrees holding uncertain tokens.  The cache is filled lazily
 * into storage sized by gmatcher_new; nothing is allocated after that.
 * Computed contexts are also published to the grammar's shared store (one
 * per grammar, for the first vocabulary it is used with, GM_SHARED entries),
 * so the next matcher of the same grammar copies them instead of walking. */
#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"
#include "core/core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define GM_HISTORY GMATCHER_HISTORY /* tokens gmatcher_rollback can undo */
#define GM_MAX_STACKS GRAMMAR_MAX_WIDTH /* stacks in one set (the compilers refuse a rule wider) */
#define GM_STATE_CAP 4096           /* positions (plus one depth per stack) in one kept state */
#define GM_NODES (1u << 16)         /* scratch stack nodes per call */
#define GM_SETS (1u << 15)          /* interned stack sets per call */
#define GM_SET_WORDS (1u << 18)     /* their stack ids */
#define GM_MEMO (1u << 16)          /* remembered transitions (set, partial char, byte) -> set; direct-mapped */
#define GM_SHARED 512               /* contexts kept in a grammar's shared store */
#define GM_ROWS 512                 /* sets with a 256-entry transition row (at a character boundary) */
#define GM_CACHE_K 3                /* frames in a cache key: enough for a string's content loop, shared by every
                                       string property (a fourth frame would name the property) */
#define GM_CACHE_ENTRIES 128        /* cached contexts per matcher (cleared when full) */

/* ---- vocabulary ---- */

struct gtnode {
    uint32_t next;     /* index just past this node's subtree (its next sibling) */
    uint32_t tok_lo;   /* the subtree's tokens are DFS-order indices tok_lo .. tok_hi-1, */
    uint32_t tok_here; /* of which tok_lo .. tok_here-1 end exactly at this node */
    uint32_t tok_hi;
    uint8_t byte;      /* the byte leading here from the parent (root: 0) */
};

struct gvocab {
    uint64_t id;             /* unique per gvocab_new (a freed vocabulary's address may come back) */
    int n_vocab, n_words;
    char *blob;              /* every token's bytes */
    uint64_t *off;           /* (n_vocab + 1) token i is blob[off[i] .. off[i+1]) */
    bool *special;           /* (n_vocab) never allowed (except end tokens) */
    bool *is_end;            /* (n_vocab) */
    int32_t *end_ids;
    int n_end;
    struct gtnode *nodes;    /* (n_nodes) node 0 is the root */
    uint32_t n_nodes;
    int32_t *dfs_tok;        /* (n_trie_tok) token id at each DFS position */
    uint32_t n_trie_tok;
    int max_len;             /* longest token in the trie */
};

/* qsort has no context argument: the vocabulary being sorted, under sort_lock_ */
static const struct gvocab *sort_vocab_;

static int cmp_tok(const void *a, const void *b) {
    const struct gvocab *v = sort_vocab_;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = (size_t)(v->off[x + 1] - v->off[x]), ly = (size_t)(v->off[y + 1] - v->off[y]);
    int c = memcmp(v->blob + v->off[x], v->blob + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static size_t tok_len(const struct gvocab *v, int32_t t) { return (size_t)(v->off[t + 1] - v->off[t]); }
static const uint8_t *tok_bytes(const struct gvocab *v, int32_t t) { return (const uint8_t *)v->blob + v->off[t]; }

/* Build the subtree of the tokens dfs_tok[lo..hi), all sharing their first
 * `depth` bytes, at node *n (preorder).  Iterative over siblings, recursive
 * over depth (bounded by the longest token). */
static void build_trie(struct gvocab *v, uint32_t lo, uint32_t hi, int depth, uint8_t byte) {
    uint32_t me = v->n_nodes++;
    struct gtnode *nd = &v->nodes[me];
    nd->byte = byte;
    nd->tok_lo = lo;
    nd->tok_hi = hi;
    uint32_t i = lo;
    while (i < hi && tok_len(v, v->dfs_tok[i]) == (size_t)depth) i++;
    nd->tok_here = i;
    while (i < hi) {
        uint8_t b = tok_bytes(v, v->dfs_tok[i])[depth];
        uint32_t j = i + 1;
        while (j < hi && tok_bytes(v, v->dfs_tok[j])[depth] == b) j++;
        build_trie(v, i, j, depth + 1, b);
        i = j;
    }
    v->nodes[me].next = v->n_nodes;
}

static pthread_mutex_t sort_lock_ = PTHREAD_MUTEX_INITIALIZER;

void gvocab_free(struct gvocab *v) {
    if (!v) return;
    free(v->blob);
    free(v->off);
    free(v->special);
    free(v->is_end);
    free(v->end_ids);
    free(v->nodes);
    free(v->dfs_tok);
    free(v);
}

int gvocab_n_vocab(const struct gvocab *v) { return v ? v->n_vocab : 0; }

int gvocab_new(int n_vocab, const char *const *tok_bytes_in, const size_t *tok_len_in, const bool *is_special,
               const int32_t *end_ids, int n_end, struct gvocab **out) {
    *out = NULL;
    if (n_vocab <= 0 || !tok_bytes_in || !tok_len_in || n_end < 0 || (n_end > 0 && !end_ids)) {
        LOG_ERR("gvocab_new: bad arguments (n_vocab %d, n_end %d)", n_vocab, n_end);
        return KVLLM_EINVAL;
    }
    struct gvocab *v = calloc(1, sizeof *v);
    if (!v) return KVLLM_ENOMEM;
    static atomic_uint_fast64_t next_id = 1;
    v->id = atomic_fetch_add(&next_id, 1);
    v->n_vocab = n_vocab;
    v->n_words = (n_vocab + 31) / 32;
    uint64_t total = 0;
    for (int i = 0; i < n_vocab; i++) total += tok_len_in[i];
    v->blob = malloc(total ? total : 1);
    v->off = malloc(((size_t)n_vocab + 1) * sizeof *v->off);
    v->special = calloc((size_t)n_vocab, sizeof *v->special);
    v->is_end = calloc((size_t)n_vocab, sizeof *v->is_end);
    v->end_ids = malloc(((size_t)n_end + 1) * sizeof *v->end_ids);
    v->dfs_tok = malloc((size_t)n_vocab * sizeof *v->dfs_tok);
    /* a trie has at most one node per token byte, plus the root */
    v->nodes = malloc((total + 1) * sizeof *v->nodes);
    if (!v->blob || !v->off || !v->special || !v->is_end || !v->end_ids || !v->dfs_tok || !v->nodes) {
        LOG_ERR("gvocab_new: out of memory (%d tokens, %llu bytes)", n_vocab, (unsigned long long)total);
        gvocab_free(v);
        return KVLLM_ENOMEM;
    }
    uint64_t o = 0;
    for (int i = 0; i < n_vocab; i++) {
        v->off[i] = o;
        if (tok_len_in[i]) memcpy(v->blob + o, tok_bytes_in[i], tok_len_in[i]);
        o += tok_len_in[i];
        v->special[i] = is_special && is_special[i];
    }
    v->off[n_vocab] = o;
    for (int i = 0; i < n_end; i++) {
        if (end_ids[i] < 0 || end_ids[i] >= n_vocab) {
            LOG_ERR("gvocab_new: end token %d outside the vocabulary (%d)", end_ids[i], n_vocab);
            gvocab_free(v);
            return KVLLM_EINVAL;
        }
        if (!v->is_end[end_ids[i]]) v->end_ids[v->n_end++] = end_ids[i];
        v->is_end[end_ids[i]] = true;
    }
    /* the trie holds every token that can stand for text: not special, not an end token, not empty */
    uint32_t n = 0;
    for (int i = 0; i < n_vocab; i++) {
        if (v->special[i] || v->is_end[i] || tok_len_in[i] == 0) continue;
        v->dfs_tok[n++] = i;
        if ((int)tok_len_in[i] > v->max_len) v->max_len = (int)tok_len_in[i];
    }
    v->n_trie_tok = n;
    pthread_mutex_lock(&sort_lock_);
    sort_vocab_ = v;
    qsort(v->dfs_tok, n, sizeof *v->dfs_tok, cmp_tok);
    sort_vocab_ = NULL;
    pthread_mutex_unlock(&sort_lock_);
    build_trie(v, 0, n, 0, 0);
    *out = v;
    return 0;
}

/* ---- bitsets ---- */

static inline void bit_set(uint32_t *b, uint32_t i) { b[i >> 5] |= 1u << (i & 31); }

static void bit_set_range(uint32_t *b, uint32_t lo, uint32_t hi) {
    uint32_t i = lo;
    for (; i < hi && (i & 31); i++) bit_set(b, i);
    for (; i + 32 <= hi; i += 32) b[i >> 5] = ~0u;
    for (; i < hi; i++) bit_set(b, i);
}

/* Any bit set in [lo, hi)? */
static bool bit_any(const uint32_t *b, uint32_t lo, uint32_t hi) {
    uint32_t i = lo;
    while (i < hi && (i & 31)) {
        if (b[i >> 5] >> (i & 31) & 1) return true;
        i++;
    }
    for (; i + 32 <= hi; i += 32)
        if (b[i >> 5]) return true;
    for (; i < hi; i++)
        if (b[i >> 5] >> (i & 31) & 1) return true;
    return false;
}

/* ---- the matcher ---- */

struct gnode {
    uint32_t pos;     /* grammar position on top */
    uint32_t parent;  /* the rest of the stack; node 0 is the empty stack */
};

struct gslot {        /* one hash-cons table slot */
    uint32_t epoch;
    uint32_t idx;
};

struct gkept {        /* a state between calls (one history slot) */
    uint32_t n_stacks;
    uint32_t n_used;  /* positions used in buf */
    struct gutf8 partial;
    bool ended;       /* an end token was accepted */
    bool can_end, must_end;
    uint32_t *buf;    /* (GM_STATE_CAP) per stack: depth, then positions bottom to top */
};

struct gsetrec {      /* an interned set: set_data[off .. off + n) */
    uint32_t off, n, hash;
    uint32_t row;     /* its transitions at a character boundary: rows[row * 256 + byte], or NO_ROW */
    bool has_empty;
};

struct gmemo {        /* a transition: set, partial character, byte -> set, partial character */
    uint32_t epoch, set, key, out, q_value;
    int32_t q_remain;
};

struct gcache_entry {
    uint32_t key[GM_CACHE_K];
    uint8_t klen;
    bool full;        /* the key is the whole stack */
    bool has_unc;
    uint32_t *acc;    /* (n_words) token ids accepted whatever lies below the key */
    uint32_t *unc;    /* (trie words) DFS-order tokens that pop below the key */
};

/* A grammar's shared context store: entries are appended under g->lock and never change after. */
struct gshared {
    uint64_t vocab_id;
    int n, n_words, trie_words;
    struct gcache_entry e[GM_SHARED];
    uint32_t *slab;
};

void gshared_free(struct gshared *s) {
    if (!s) return;
    free(s->slab);
    free(s);
}

/* The working stores of one matcher call: reset at the start of every call,
 * so matchers that one thread runs in turn can share them (the engine keeps
 * one for all its sequences).  The epochs and stamps live here with the
 * tables they validate. */
struct gscratch {
    struct gnode *nodes;      /* (GM_NODES) */
    uint32_t n_nodes;
    uint32_t *mark;           /* (GM_NODES) set membership / expansion stamps */
    uint32_t stamp;
    struct gslot *table;      /* (2 * GM_NODES) */
    uint32_t epoch;
    bool overflow;            /* a fixed capacity was exceeded during this call */
    /* interned sets: a walk carries one set id per trie depth; equal sets reached by different
     * prefixes share their transitions through the memo */
    uint32_t *set_data;       /* (GM_SET_WORDS) */
    uint32_t set_used;
    struct gsetrec *set_rec;  /* (GM_SETS) */
    uint32_t n_sets;
    struct gslot *set_tab;    /* (2 * GM_SETS) */
    struct gmemo *memo;       /* (GM_MEMO) */
    uint32_t *rows;           /* (GM_ROWS, 256) the hot sets' transitions, L1-resident: a string's content
                               * set steps to itself on most bytes */
    uint32_t n_rows;
    uint32_t *tmp_w;          /* (GM_MAX_STACKS) a step's output before interning */
    uint32_t *cur_set, cur_n; /* (GM_MAX_STACKS) the loaded state */
    uint32_t *tmp_a, *tmp_b;  /* (GM_MAX_STACKS) accept's ping-pong */
};

struct gmatcher {
    const struct kvllm_grammar *g;   /* NULL until gmatcher_reset */
    struct kvllm_grammar *gm;   /* the same grammar, for its lock and shared store */
    struct gshared *shared;     /* NULL: the store belongs to another vocabulary */
    const struct gvocab *v;
    struct gscratch *s;         /* the working stores (own or shared) */
    bool own_scratch;
    /* kept states */
    struct gkept hist[GM_HISTORY + 1];
    int cur, n_hist;
    /* cache */
    struct gcache_entry cache[GM_CACHE_ENTRIES];
    int n_cache;
    int16_t *cache_tab;       /* (2 * GM_CACHE_ENTRIES) entry index or -1 */
    int trie_words;
    void *slab;               /* the cache bitsets */
};

static inline bool end_of_seq(const struct kvllm_grammar *g, uint32_t pos) {
    return g->elems[pos].type == G_END || g->elems[pos].type == G_ALT;
}

static void scratch_reset(struct gmatcher *m) {
    m->s->n_nodes = 1;   /* node 0: the empty stack */
    m->s->nodes[0] = (struct gnode){ UINT32_MAX, 0 };
    m->s->n_sets = 0;
    m->s->set_used = 0;
    m->s->n_rows = 0;
    if (++m->s->epoch == 0) {   /* wrapped: stale slots could look current */
        memset(m->s->table, 0, 2 * (size_t)GM_NODES * sizeof *m->s->table);
        memset(m->s->set_tab, 0, 2 * (size_t)GM_SETS * sizeof *m->s->set_tab);
        memset(m->s->memo, 0, GM_MEMO * sizeof *m->s->memo);
        m->s->epoch = 1;
    }
    m->s->overflow = false;
}

static inline uint32_t new_stamp(struct gmatcher *m) {
    if (++m->s->stamp == 0) {
        memset(m->s->mark, 0, GM_NODES * sizeof *m->s->mark);
        m->s->stamp = 1;
    }
    return m->s->stamp;
}

/* The stack `pos` on top of `parent` (hash-consed). */
static uint32_t push(struct gmatcher *m, uint32_t parent, uint32_t pos) {
    uint32_t h = (pos * 0x9E3779B1u) ^ (parent * 0x85EBCA77u);
    h ^= h >> 15;
    const uint32_t mask = 2 * GM_NODES - 1;
    for (uint32_t i = h & mask;; i = (i + 1) & mask) {
        struct gslot *s = &m->s->table[i];
        if (s->epoch != m->s->epoch) {
            if (m->s->n_nodes >= GM_NODES) {
                m->s->overflow = true;
                return 0;
            }
            uint32_t id = m->s->n_nodes++;
            m->s->nodes[id] = (struct gnode){ pos, parent };
            m->s->mark[id] = 0;
            *s = (struct gslot){ m->s->epoch, id };
            return id;
        }
        const struct gnode *n = &m->s->nodes[s->idx];
        if (n->pos == pos && n->parent == parent) return s->idx;
    }
}

struct gset {
    uint32_t *ids;
    uint32_t n;
    bool has_empty;
};

static inline void set_add(struct gmatcher *m, struct gset *out, uint32_t s) {
    if (m->s->mark[s] == m->s->stamp) return;
    m->s->mark[s] = m->s->stamp;
    if (out->n >= GM_MAX_STACKS) {
        m->s->overflow = true;
        return;
    }
    out->ids[out->n++] = s;
    if (s == 0) out->has_empty = true;
}

/* Expand stack s until every resulting stack has a character class on top
 * (or is empty), adding them to out (llama.cpp's advance_stack).  Terminates
 * because the parser refused left recursion; the mark stops re-expanding a
 * stack already expanded into this set. */
static void advance(struct gmatcher *m, uint32_t s, struct gset *out) {
    const struct kvllm_grammar *g = m->g;
    if (s == 0) { set_add(m, out, 0); return; }
    uint32_t pos = m->s->nodes[s].pos;
    const struct gelem *e = &g->elems[pos];
    if (e->type != G_RULE_REF) { set_add(m, out, s); return; }
    if (m->s->mark[s] == m->s->stamp) return;
    m->s->mark[s] = m->s->stamp;
    uint32_t base = m->s->nodes[s].parent;
    if (!end_of_seq(g, pos + 1)) base = push(m, base, pos + 1);
    uint32_t sub = g->rule_start[e->value];
    for (;;) {
        uint32_t ns = end_of_seq(g, sub) ? base : push(m, base, sub);
        if (m->s->overflow) return;
        advance(m, ns, out);
        while (!end_of_seq(g, sub)) sub++;
        if (g->elems[sub].type == G_ALT) sub++;
        else break;
    }
}

static bool match_char(const struct gelem *e, uint32_t cp) {
    if (e->type == G_CHAR_ANY) return true;
    bool positive = e->type == G_CHAR;
    do {
        if (e[1].type == G_CHAR_RNG_UPPER) {
            if (e->value <= cp && cp <= e[1].value) return positive;
            e += 2;
        } else {
            if (e->value == cp) return positive;
            e += 1;
        }
    } while (e->type == G_CHAR_ALT);
    return !positive;
}

/* Can some code point that starts with the partial UTF-8 p match the class at e? */
static bool match_partial(const struct gelem *e, struct gutf8 p) {
    if (p.n_remain < 0 || (p.n_remain == 1 && p.value < 2)) return false;   /* invalid, or overlong */
    uint32_t low = p.value << (p.n_remain * 6);
    uint32_t high = low | ((1u << (p.n_remain * 6)) - 1);
    if (low == 0) {
        if (p.n_remain == 2) low = 1u << 11;
        else if (p.n_remain == 3) low = 1u << 16;
    }
    if (e->type == G_CHAR_ANY) return true;
    if (e->type == G_CHAR) {
        do {
            if (e[1].type == G_CHAR_RNG_UPPER) {
                if (e->value <= high && low <= e[1].value) return true;
                e += 2;
            } else {
                if (low <= e->value && e->value <= high) return true;
                e += 1;
            }
        } while (e->type == G_CHAR_ALT);
        return false;
    }
    /* negated class: some code point of [low, high] is outside every excluded range */
    uint32_t c = low;
    for (;;) {
        bool moved = false;
        const struct gelem *x = e;
        do {
            uint32_t lo = x->value, hi = x->value;
            if (x[1].type == G_CHAR_RNG_UPPER) { hi = x[1].value; x += 2; }
            else x += 1;
            if (lo <= c && c <= hi) {
                if (hi >= high) return false;
                c = hi + 1;
                moved = true;
            }
        } while (x->type == G_CHAR_ALT);
        if (!moved) return true;
    }
}

static uint32_t after_class(const struct kvllm_grammar *g, uint32_t pos) {
    pos++;
    while (g->elems[pos].type == G_CHAR_ALT || g->elems[pos].type == G_CHAR_RNG_UPPER) pos++;
    return pos;
}

/* Is q, a character just extended by one byte (lead: the byte began it),
 * still the start of a valid UTF-8 scalar value (RFC 3629): no overlong
 * form, no surrogate, nothing above U+10FFFF?  Checked at the byte that
 * decides, so a later state is known valid by its size: a 3-byte
 * character's state after two bytes is below 0x400, a 4-byte one's after
 * three is not. */
static bool utf8_ok(struct gutf8 q, bool lead) {
    if (lead) return q.n_remain != 1 ? q.n_remain != 3 || q.value <= 4 : q.value >= 2;   /* C0 C1, F5..F7 */
    if (q.n_remain == 2) return q.value >= 0x10 && q.value <= 0x10F;   /* F0 80..8F, F4 90..BF */
    if (q.n_remain == 1 && q.value < 0x400) return q.value >= 0x20 && (q.value < 0x360 || q.value > 0x37F);   /* E0 80..9F, ED A0..BF */
    return true;
}

/* One byte through a set: in (at the start of the pending character) and
 * partial *p -> out and the new *p.  out empty: the byte cannot follow. */
static void step_byte(struct gmatcher *m, const uint32_t *in, uint32_t n_in, struct gutf8 *p, uint8_t b,
                      struct gset *out) {
    const struct kvllm_grammar *g = m->g;
    out->n = 0;
    out->has_empty = false;
    struct gutf8 q = *p;
    const bool lead = q.n_remain == 0;
    if (lead) {
        if (b < 0x80) q = (struct gutf8){ b, 0 };
        else if ((b & 0xE0) == 0xC0) q = (struct gutf8){ b & 0x1Fu, 1 };
        else if ((b & 0xF0) == 0xE0) q = (struct gutf8){ b & 0x0Fu, 2 };
        else if ((b & 0xF8) == 0xF0) q = (struct gutf8){ b & 0x07u, 3 };
        else return;
    } else {
        if ((b & 0xC0) != 0x80) return;
        q.value = (q.value << 6) | (b & 0x3Fu);
        q.n_remain--;
    }
    if (!utf8_ok(q, lead)) return;
    *p = q;
    new_stamp(m);
    if (q.n_remain > 0) {   /* mid-character: keep the stacks that some completion could satisfy */
        for (uint32_t i = 0; i < n_in; i++) {
            uint32_t s = in[i];
            if (s && match_partial(&g->elems[m->s->nodes[s].pos], q)) set_add(m, out, s);
        }
        return;
    }
    for (uint32_t i = 0; i < n_in && !m->s->overflow; i++) {
        uint32_t s = in[i];
        if (!s) continue;
        uint32_t pos = m->s->nodes[s].pos;
        if (!match_char(&g->elems[pos], q.value)) continue;
        uint32_t base = m->s->nodes[s].parent;
        uint32_t nxt = after_class(g, pos);
        if (!end_of_seq(g, nxt)) base = push(m, base, nxt);
        advance(m, base, out);
    }
}

/* ---- trie walk ---- */

struct walk {
    const uint32_t *filter;  /* DFS-order tokens worth visiting, or NULL for all */
    uint32_t *acc;           /* token ids accepted */
    uint32_t *unc;           /* local walks: DFS-order tokens that popped below the local stack */
    bool local;
};

#define SET_DEAD UINT32_MAX
#define SET_UNKNOWN (UINT32_MAX - 1)
#define NO_ROW UINT32_MAX

static uint32_t intern_set(struct gmatcher *m, const uint32_t *ids, uint32_t n, bool has_empty) {
    uint32_t h = 0x811C9DC5u ^ n;
    for (uint32_t i = 0; i < n; i++) h = (h ^ ids[i]) * 0x01000193u;
    const uint32_t mask = 2 * GM_SETS - 1;
    for (uint32_t i = (h ^ (h >> 16)) & mask;; i = (i + 1) & mask) {
        struct gslot *slot = &m->s->set_tab[i];
        if (slot->epoch != m->s->epoch) {
            if (m->s->n_sets >= GM_SETS || m->s->set_used + n > GM_SET_WORDS) {
                m->s->overflow = true;
                return SET_DEAD;
            }
            uint32_t id = m->s->n_sets++;
            m->s->set_rec[id] = (struct gsetrec){ m->s->set_used, n, h, NO_ROW, has_empty };
            memcpy(m->s->set_data + m->s->set_used, ids, n * sizeof *ids);
            m->s->set_used += n;
            *slot = (struct gslot){ m->s->epoch, id };
            return id;
        }
        const struct gsetrec *r = &m->s->set_rec[slot->idx];
        if (r->hash == h && r->n == n && !memcmp(m->s->set_data + r->off, ids, n * sizeof *ids)) return slot->idx;
    }
}

/* Visit trie node k (depth d) whose prefix leaves the interned set sid and
 * partial character p; popped: some byte of the prefix was read after the
 * local stack had emptied (local walks). */
static void walk_node(struct gmatcher *m, const struct walk *w, uint32_t k, uint32_t sid, struct gutf8 p,
                      bool popped) {
    const struct gvocab *v = m->v;
    const struct gtnode *nd = &v->nodes[k];
    const struct gsetrec *rec = &m->s->set_rec[sid];
    for (uint32_t i = nd->tok_lo; i < nd->tok_here; i++) bit_set(w->acc, (uint32_t)v->dfs_tok[i]);
    bool popped2 = popped || rec->has_empty;
    for (uint32_t c = k + 1; c < nd->next; c = v->nodes[c].next) {
        const struct gtnode *cn = &v->nodes[c];
        if (w->filter && !bit_any(w->filter, cn->tok_lo, cn->tok_hi)) continue;
        uint32_t out;
        struct gutf8 q;
        uint32_t *cell = NULL;
        struct gmemo *mm = NULL;
        if (p.n_remain == 0) {
            /* at a character boundary the byte alone gives the new partial state */
            if (rec->row == NO_ROW && m->s->n_rows < GM_ROWS) {
                uint32_t *row = m->s->rows + (size_t)m->s->n_rows * 256;
                for (int b = 0; b < 256; b++) row[b] = SET_UNKNOWN;
                m->s->set_rec[sid].row = m->s->n_rows++;
            }
            if (rec->row != NO_ROW) cell = m->s->rows + (size_t)rec->row * 256 + cn->byte;
        }
        if (cell && *cell != SET_UNKNOWN) {
            out = *cell;
            uint8_t b = cn->byte;
            q = b < 0x80 ? (struct gutf8){ b, 0 } : (b & 0xE0) == 0xC0 ? (struct gutf8){ b & 0x1Fu, 1 }
              : (b & 0xF0) == 0xE0 ? (struct gutf8){ b & 0x0Fu, 2 } : (struct gutf8){ b & 0x07u, 3 };
            goto have;
        }
        uint32_t key = p.value << 10 | (uint32_t)p.n_remain << 8 | cn->byte;
        uint32_t h = (sid * 0x9E3779B1u) ^ (key * 0x85EBCA77u);
        mm = &m->s->memo[(h ^ (h >> 16)) & (GM_MEMO - 1)];
        if (!cell && mm->epoch == m->s->epoch && mm->set == sid && mm->key == key) {
            out = mm->out;
            q = (struct gutf8){ mm->q_value, mm->q_remain };
        } else {
            q = p;
            struct gset o = { m->s->tmp_w, 0, false };
            step_byte(m, m->s->set_data + rec->off, rec->n, &q, cn->byte, &o);
            out = o.n && !m->s->overflow ? intern_set(m, o.ids, o.n, o.has_empty) : SET_DEAD;
            if (m->s->overflow) return;
            if (cell) *cell = out;
            else *mm = (struct gmemo){ m->s->epoch, sid, key, out, q.value, q.n_remain };
        }
    have:
        if (out == SET_DEAD) {
            if (w->local && popped2) bit_set_range(w->unc, cn->tok_lo, cn->tok_hi);
            continue;
        }
        walk_node(m, w, c, out, q, popped2);
        if (m->s->overflow) return;
    }
}

/* ---- kept states ---- */

static int keep_state(struct gmatcher *m, struct gkept *k, const uint32_t *set, uint32_t n, struct gutf8 p,
                      bool ended) {
    uint32_t used = 0;
    bool can_end = false;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t depth = 0;
        for (uint32_t s = set[i]; s; s = m->s->nodes[s].parent) depth++;
        if (used + 1 + depth > GM_STATE_CAP) {
            LOG_ERR("grammar: matcher state exceeds %d positions (stacks too deep or too many)", GM_STATE_CAP);
            return KVLLM_ERANGE;
        }
        k->buf[used] = depth;
        uint32_t j = used + depth;
        for (uint32_t s = set[i]; s; s = m->s->nodes[s].parent) k->buf[j--] = m->s->nodes[s].pos;
        used += 1 + depth;
        if (depth == 0) can_end = true;
    }
    k->n_stacks = n;
    k->n_used = used;
    k->partial = p;
    k->ended = ended;
    k->can_end = (can_end && p.n_remain == 0) || ended;
    k->must_end = ended || (k->can_end && n == 1);
    return 0;
}

/* Rebuild a kept state's stacks as scratch nodes into m->s->cur_set. */
static void load_state(struct gmatcher *m, const struct gkept *k) {
    new_stamp(m);
    struct gset out = { m->s->cur_set, 0, false };
    uint32_t i = 0;
    for (uint32_t s = 0; s < k->n_stacks; s++) {
        uint32_t depth = k->buf[i++], node = 0;
        for (uint32_t j = 0; j < depth; j++) node = push(m, node, k->buf[i++]);
        set_add(m, &out, node);
    }
    m->s->cur_n = out.n;
}

/* ---- the context cache ---- */

static struct gcache_entry *cache_get(struct gmatcher *m, uint32_t s) {
    uint32_t key[GM_CACHE_K];
    uint8_t klen = 0;
    uint32_t t = s;
    while (t && klen < GM_CACHE_K) {
        key[klen++] = m->s->nodes[t].pos;
        t = m->s->nodes[t].parent;
    }
    bool full = t == 0;
    uint32_t h = full ? 0x51ED27u : 0;
    for (int i = 0; i < klen; i++) h = (h ^ key[i]) * 0x01000193u;
    h ^= h >> 13;
    const uint32_t mask = 2 * GM_CACHE_ENTRIES - 1;
    uint32_t i = h & mask;
    for (;; i = (i + 1) & mask) {
        int16_t e = m->cache_tab[i];
        if (e < 0) break;
        struct gcache_entry *c = &m->cache[e];
        if (c->klen == klen && c->full == full && !memcmp(c->key, key, klen * sizeof *key)) return c;
    }
    if (m->n_cache == GM_CACHE_ENTRIES) {   /* full: start over (contexts of a long generation drift) */
        m->n_cache = 0;
        memset(m->cache_tab, 0xff, 2 * GM_CACHE_ENTRIES * sizeof *m->cache_tab);
        for (i = h & mask; m->cache_tab[i] >= 0; i = (i + 1) & mask) {}
    }
    struct gcache_entry *c = &m->cache[m->n_cache];
    memcpy(c->key, key, klen * sizeof *key);
    c->klen = klen;
    c->full = full;
    memset(c->acc, 0, (size_t)m->v->n_words * sizeof *c->acc);
    memset(c->unc, 0, (size_t)m->trie_words * sizeof *c->unc);
    if (m->shared) {
        pthread_mutex_lock(&m->gm->lock);
        const struct gshared *sh = m->shared;
        for (int j = 0; j < sh->n; j++) {
            const struct gcache_entry *e = &sh->e[j];
            if (e->klen == klen && e->full == full && !memcmp(e->key, key, klen * sizeof *key)) {
                memcpy(c->acc, e->acc, (size_t)m->v->n_words * sizeof *c->acc);
                memcpy(c->unc, e->unc, (size_t)m->trie_words * sizeof *c->unc);
                c->has_unc = e->has_unc;
                pthread_mutex_unlock(&m->gm->lock);
                m->cache_tab[i] = (int16_t)m->n_cache++;
                return c;
            }
        }
        pthread_mutex_unlock(&m->gm->lock);
    }
    /* the local stack: the key's frames alone */
    uint32_t local = 0;
    for (int j = klen - 1; j >= 0; j--) local = push(m, local, key[j]);
    uint32_t sid = intern_set(m, &local, 1, local == 0);
    if (m->s->overflow) return NULL;
    struct walk w = { NULL, c->acc, c->unc, !full };
    walk_node(m, &w, 0, sid, (struct gutf8){ 0, 0 }, false);
    if (m->s->overflow) return NULL;
    c->has_unc = bit_any(c->unc, 0, m->v->n_trie_tok);
    m->cache_tab[i] = (int16_t)m->n_cache++;
    if (m->shared) {   /* publish (another matcher may have published the same key meanwhile: harmless) */
        pthread_mutex_lock(&m->gm->lock);
        struct gshared *sh = m->shared;
        if (sh->n < GM_SHARED) {
            struct gcache_entry *e = &sh->e[sh->n];
            memcpy(e->key, key, klen * sizeof *key);
            e->klen = klen;
            e->full = full;
            e->has_unc = c->has_unc;
            memcpy(e->acc, c->acc, (size_t)m->v->n_words * sizeof *c->acc);
            memcpy(e->unc, c->unc, (size_t)m->trie_words * sizeof *c->unc);
            sh->n++;
        }
        pthread_mutex_unlock(&m->gm->lock);
    }
    return c;
}

/* ---- public ---- */

void gscratch_free(struct gscratch *s) {
    if (!s) return;
    free(s->nodes);
    free(s->mark);
    free(s->table);
    free(s->set_data);
    free(s->set_rec);
    free(s->set_tab);
    free(s->memo);
    free(s->rows);
    free(s->tmp_w);
    free(s->cur_set);
    free(s->tmp_a);
    free(s->tmp_b);
    free(s);
}

int gscratch_new(struct gscratch **out) {
    struct gscratch *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!s) return KVLLM_ENOMEM;
    s->nodes = malloc(GM_NODES * sizeof *s->nodes);
    s->mark = calloc(GM_NODES, sizeof *s->mark);
    s->table = calloc(2 * (size_t)GM_NODES, sizeof *s->table);
    s->set_data = malloc(GM_SET_WORDS * sizeof *s->set_data);
    s->set_rec = malloc(GM_SETS * sizeof *s->set_rec);
    s->set_tab = calloc(2 * (size_t)GM_SETS, sizeof *s->set_tab);
    s->memo = calloc(GM_MEMO, sizeof *s->memo);
    s->rows = malloc((size_t)GM_ROWS * 256 * sizeof *s->rows);
    s->tmp_w = malloc(GM_MAX_STACKS * sizeof *s->tmp_w);
    s->cur_set = malloc(GM_MAX_STACKS * sizeof *s->cur_set);
    s->tmp_a = malloc(GM_MAX_STACKS * sizeof *s->tmp_a);
    s->tmp_b = malloc(GM_MAX_STACKS * sizeof *s->tmp_b);
    if (!s->nodes || !s->mark || !s->table || !s->set_data || !s->set_rec || !s->set_tab || !s->memo || !s->rows ||
        !s->tmp_w || !s->cur_set || !s->tmp_a || !s->tmp_b) {
        LOG_ERR("gscratch_new: out of memory");
        gscratch_free(s);
        return KVLLM_ENOMEM;
    }
    *out = s;
    return 0;
}

void gmatcher_free(struct gmatcher *m) {
    if (!m) return;
    for (int i = 0; i <= GM_HISTORY; i++) free(m->hist[i].buf);
    if (m->own_scratch) gscratch_free(m->s);
    free(m->cache_tab);
    free(m->slab);
    free(m);
}

int gmatcher_new_shared(const struct gvocab *v, struct gscratch *s, struct gmatcher **out) {
    *out = NULL;
    if (!v || !s) return KVLLM_EINVAL;
    struct gmatcher *m = calloc(1, sizeof *m);
    if (!m) return KVLLM_ENOMEM;
    m->v = v;
    m->s = s;
    bool ok = true;
    for (int i = 0; i <= GM_HISTORY; i++) ok &= (m->hist[i].buf = malloc(GM_STATE_CAP * sizeof(uint32_t))) != NULL;
    m->cache_tab = malloc(2 * GM_CACHE_ENTRIES * sizeof *m->cache_tab);
    m->trie_words = (int)((v->n_trie_tok + 31) / 32);
    size_t per = (size_t)v->n_words + (size_t)m->trie_words;
    m->slab = malloc(GM_CACHE_ENTRIES * per * sizeof(uint32_t));
    if (!ok || !m->cache_tab || !m->slab) {
        LOG_ERR("gmatcher_new: out of memory");
        gmatcher_free(m);
        return KVLLM_ENOMEM;
    }
    for (int i = 0; i < GM_CACHE_ENTRIES; i++) {
        m->cache[i].acc = (uint32_t *)m->slab + (size_t)i * per;
        m->cache[i].unc = m->cache[i].acc + v->n_words;
    }
    *out = m;
    return 0;
}

/* g's shared context store, made for the first vocabulary the grammar meets (NULL: another's, or no memory). */
static struct gshared *shared_store(struct kvllm_grammar *g, const struct gvocab *v, int trie_words) {
    pthread_mutex_lock(&g->lock);
    if (!g->shared) {
        struct gshared *sh = calloc(1, sizeof *sh);
        size_t per_sh = (size_t)v->n_words + (size_t)trie_words;
        if (sh) sh->slab = malloc(GM_SHARED * per_sh * sizeof(uint32_t));
        if (sh && sh->slab) {
            sh->vocab_id = v->id;
            for (int i = 0; i < GM_SHARED; i++) {
                sh->e[i].acc = sh->slab + (size_t)i * per_sh;
                sh->e[i].unc = sh->e[i].acc + v->n_words;
            }
            g->shared = sh;
        } else {
            gshared_free(sh);   /* no store: this matcher works alone */
        }
    }
    struct gshared *sh = g->shared && g->shared->vocab_id == v->id ? g->shared : NULL;
    pthread_mutex_unlock(&g->lock);
    return sh;
}

void gmatcher_prepare(const struct kvllm_grammar *g, const struct gvocab *v) {
    if (g && v) shared_store((struct kvllm_grammar *)g, v, (int)((v->n_trie_tok + 31) / 32));
}

int gmatcher_reset(struct gmatcher *m, const struct kvllm_grammar *g) {
    if (!g) return KVLLM_EINVAL;
    m->g = g;
    m->gm = (struct kvllm_grammar *)g;   /* its lock and shared store are the grammar's only mutable state */
    m->shared = shared_store(m->gm, m->v, m->trie_words);
    m->cur = 0;
    m->n_hist = 0;
    m->n_cache = 0;
    memset(m->cache_tab, 0xff, 2 * GM_CACHE_ENTRIES * sizeof *m->cache_tab);
    /* the initial state: the root rule's alternatives, expanded */
    scratch_reset(m);
    new_stamp(m);
    struct gset set = { m->s->cur_set, 0, false };
    uint32_t sub = g->rule_start[g->root];
    for (;;) {
        uint32_t ns = end_of_seq(g, sub) ? 0 : push(m, 0, sub);
        advance(m, ns, &set);
        while (!end_of_seq(g, sub)) sub++;
        if (g->elems[sub].type == G_ALT) sub++;
        else break;
    }
    if (m->s->overflow) {
        LOG_ERR("gmatcher_new: the grammar's initial state exceeds the matcher's capacity");
        return KVLLM_ERANGE;
    }
    return keep_state(m, &m->hist[0], set.ids, set.n, (struct gutf8){ 0, 0 }, false);
}

int gmatcher_new(const struct kvllm_grammar *g, const struct gvocab *v, struct gmatcher **out) {
    *out = NULL;
    if (!g || !v) return KVLLM_EINVAL;
    struct gscratch *s;
    int rc = gscratch_new(&s);
    if (rc) return rc;
    struct gmatcher *m;
    if ((rc = gmatcher_new_shared(v, s, &m))) { gscratch_free(s); return rc; }
    m->own_scratch = true;
    if ((rc = gmatcher_reset(m, g))) { gmatcher_free(m); return rc; }
    *out = m;
    return 0;
}

int gmatcher_fill_mask(struct gmatcher *m, uint32_t *allow) {
    const struct gvocab *v = m->v;
    memset(allow, 0, (size_t)v->n_words * sizeof *allow);
    const struct gkept *k = &m->hist[m->cur];
    if (k->ended) return 0;
    scratch_reset(m);
    load_state(m, k);
    if (k->partial.n_remain != 0) {
        /* mid-character: the cache assumes a character boundary; walk everything with the whole set */
        bool has_empty = false;
        for (uint32_t i = 0; i < m->s->cur_n; i++) has_empty |= m->s->cur_set[i] == 0;
        uint32_t sid = intern_set(m, m->s->cur_set, m->s->cur_n, has_empty);
        struct walk w = { NULL, allow, NULL, false };
        if (!m->s->overflow) walk_node(m, &w, 0, sid, k->partial, false);
    } else {
        for (uint32_t i = 0; i < m->s->cur_n && !m->s->overflow; i++) {
            uint32_t s = m->s->cur_set[i];
            if (!s) continue;
            const struct gcache_entry *c = cache_get(m, s);
            if (!c) break;
            for (int j = 0; j < v->n_words; j++) allow[j] |= c->acc[j];
            if (!c->has_unc) continue;
            uint32_t sid = intern_set(m, &s, 1, false);
            struct walk w = { c->unc, allow, NULL, false };
            if (!m->s->overflow) walk_node(m, &w, 0, sid, (struct gutf8){ 0, 0 }, false);
        }
    }
    if (m->s->overflow) {
        LOG_ERR("grammar: the mask exceeds the matcher's capacity (%u stack nodes, %d stacks per set)", GM_NODES,
                GM_MAX_STACKS);
        return KVLLM_ERANGE;
    }
    if (k->can_end)
        for (int i = 0; i < v->n_end; i++) bit_set(allow, (uint32_t)v->end_ids[i]);
    int count = 0;
    for (int j = 0; j < v->n_words; j++) count += __builtin_popcount(allow[j]);
    return count;
}

int gmatcher_accept(struct gmatcher *m, int32_t token) {
    const struct gvocab *v = m->v;
    const struct gkept *k = &m->hist[m->cur];
    if (token < 0 || token >= v->n_vocab || k->ended) return KVLLM_EINVAL;
    int next = (m->cur + 1) % (GM_HISTORY + 1);
    struct gkept *nk = &m->hist[next];
    int rc;
    scratch_reset(m);
    load_state(m, k);
    if (v->is_end[token]) {
        if (!k->can_end) return KVLLM_EINVAL;
        rc = keep_state(m, nk, m->s->cur_set, m->s->cur_n, k->partial, true);
    } else {
        size_t len = tok_len(v, token);
        if (v->special[token] || len == 0) return KVLLM_EINVAL;
        const uint8_t *b = tok_bytes(v, token);
        struct gutf8 p = k->partial;
        uint32_t *in = m->s->cur_set, n = m->s->cur_n;
        uint32_t *bufs[2] = { m->s->tmp_a, m->s->tmp_b };
        for (size_t i = 0; i < len; i++) {
            struct gset out = { bufs[i & 1], 0, false };
            step_byte(m, in, n, &p, b[i], &out);
            if (m->s->overflow) {
                LOG_ERR("grammar: accepting token %d exceeds the matcher's capacity", token);
                return KVLLM_ERANGE;
            }
            if (out.n == 0) return KVLLM_EINVAL;
            in = out.ids;
            n = out.n;
        }
        rc = keep_state(m, nk, in, n, p, false);
    }
    if (rc) return rc;
    m->cur = next;
    if (m->n_hist < GM_HISTORY) m->n_hist++;
    return 0;
}

bool gmatcher_can_end(const struct gmatcher *m) { return m->hist[m->cur].can_end; }

bool gmatcher_must_end(const struct gmatcher *m) { return m->hist[m->cur].must_end; }

int gmatcher_rollback(struct gmatcher *m, int n) {
    if (n < 0 || n > m->n_hist) {
        LOG_ERR("gmatcher_rollback: %d tokens asked, %d can be undone", n, m->n_hist);
        return KVLLM_EINVAL;
    }
    m->cur = (m->cur - n + GM_HISTORY + 1) % (GM_HISTORY + 1);
    m->n_hist -= n;
    return 0;
}
