/* test_grammar_match.c — the GBNF parser and the matcher against
 * independent references:
 *   - parse errors with line:col, undefined rules, left recursion;
 *   - hand-labelled accept/reject tables;
 *   - random strings (derivations of the grammar and their mutations) judged
 *     by the matcher and by a backtracking recognizer written here over the
 *     compiled rules (depth-first, no stack sets, no trie, no cache);
 *   - every mask against the brute force (for each token: accept it, then
 *     roll back) on a synthetic vocabulary with tokens split inside UTF-8
 *     characters, GPT-2's byte-level BPE and llama2's SentencePiece. */
#include "check.h"
#include "grammar_util.h"
#include "grammar/grammar_internal.h"
#include "core/core.h"

#include <stdint.h>

/* ---- the reference recognizer ---- */

struct cont {
    uint32_t pos;
    const struct cont *next;
};

static bool ref_class(const struct gelem *e, uint32_t cp) {
    if (e->type == G_CHAR_ANY) return true;
    bool in = false;
    const struct gelem *x = e;
    for (;;) {
        uint32_t lo = x->value, hi = x->value;
        if (x[1].type == G_CHAR_RNG_UPPER) { hi = x[1].value; x += 2; }
        else x += 1;
        if (lo <= cp && cp <= hi) in = true;
        if (x->type != G_CHAR_ALT) break;
    }
    return e->type == G_CHAR_NOT ? !in : in;
}

static long ref_budget;

/* Does cps[i..n) match from element pos, then the continuations k? */
static bool ref_match(const struct kvllm_grammar *g, const uint32_t *cps, int n, int i, uint32_t pos,
                      const struct cont *k) {
    if (--ref_budget < 0) return false;
    const struct gelem *e = &g->elems[pos];
    if (e->type == G_END || e->type == G_ALT) return k ? ref_match(g, cps, n, i, k->pos, k->next) : i == n;
    if (e->type == G_RULE_REF) {
        struct cont c = { pos + 1, k };
        uint32_t a = g->rule_start[e->value];
        for (;;) {
            if (ref_match(g, cps, n, i, a, &c)) return true;
            while (g->elems[a].type != G_END && g->elems[a].type != G_ALT) a++;
            if (g->elems[a].type == G_END) return false;
            a++;
        }
    }
    if (i >= n || !ref_class(e, cps[i])) return false;
    uint32_t nx = pos + 1;
    while (g->elems[nx].type == G_CHAR_ALT || g->elems[nx].type == G_CHAR_RNG_UPPER) nx++;
    return ref_match(g, cps, n, i + 1, nx, k);
}

/* Strict UTF-8 (a byte sequence that is not UTF-8 matches nothing): the count, or -1. */
static int utf8_decode_all(const char *s, size_t len, uint32_t *cps) {
    int n = 0;
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i++];
        int extra = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
        if (extra < 0) return -1;
        uint32_t cp = extra ? c & (0x3Fu >> extra) : c;
        for (int k = 0; k < extra; k++) {
            if (i >= len || ((unsigned char)s[i] & 0xC0) != 0x80) return -1;
            cp = (cp << 6) | ((unsigned char)s[i++] & 0x3Fu);
        }
        if (extra == 1 && cp < 0x80) return -1;   /* overlong 2-byte form (the matcher refuses C0/C1) */
        cps[n++] = cp;
    }
    return n;
}

/* 1 match, 0 no, -1 undecided (budget) */
static int ref_accepts(const struct kvllm_grammar *g, const char *s, size_t len) {
    uint32_t cps[512];
    if (len > 500) return -1;
    int n = utf8_decode_all(s, len, cps);
    if (n < 0) return 0;
    ref_budget = 2000000;
    struct cont root = { 0, NULL };
    (void)root;
    /* the root rule as a reference with no continuation */
    uint32_t a = g->rule_start[g->root];
    for (;;) {
        if (ref_match(g, cps, n, 0, a, NULL)) return 1;
        while (g->elems[a].type != G_END && g->elems[a].type != G_ALT) a++;
        if (g->elems[a].type == G_END) break;
        a++;
    }
    return ref_budget < 0 ? -1 : 0;
}

/* ---- the matcher over single-byte tokens (synthetic vocab: token b is byte b) ---- */


static struct kvllm_grammar *parse_ok(const char *text) {
    struct kvllm_grammar *g = NULL;
    char err[256];
    int rc = kvllm_grammar_from_gbnf(text, &g, err, sizeof err);
    CHECK_MSG(rc == 0, "parse failed: %s\n%s", err, text);
    return g;
}

static void test_parse_errors(void) {
    static const struct { const char *text, *want; } bad[] = {
        { "root ::= foo\n", "1:10: undefined rule 'foo'" },
        { "root ::= \"a\"\nx ::= [a-\n", "3:1: unexpected end of input" },
        { "root ::= \"a\" | \n  ( \"b\" \n", "3:1: expecting ')'" },
        { "root ::= \"\\q\"\n", "1:11: unknown escape" },
        { "root ::= x\nx ::= x \"a\" | \"b\"\n", "left recursion" },
        { "root ::= a\na ::= b? a \"x\"\nb ::= \"y\"\n", "left recursion" },
        { "root := \"a\"\n", "1:6: expecting ::=" },
        { "foo ::= \"a\"\n", "does not contain a root" },
        { "root ::= * \"a\"\n", "1:10: expecting preceding item" },
        { "root ::= \"a\"{3,1}\n", "max below min" },
        { "root ::= \"a\"{x}\n", "1:14: expecting an int" },
        { "root ::= \"a\" \"b\" ]\n", "1:18: expecting newline or end" },
        { "root ::= [\\x4]\n", "expecting 2 hex chars" },
        { "root ::= \"abc\n", "unexpected end of input" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct kvllm_grammar *g = NULL;
        char err[256] = "";
        int rc = kvllm_grammar_from_gbnf(bad[i].text, &g, err, sizeof err);
        CHECK_MSG(rc == KVLLM_EINVAL && !g, "case %zu: rc %d", i, rc);
        CHECK_MSG(strstr(err, bad[i].want) != NULL, "case %zu: got '%s', want '%s'", i, err, bad[i].want);
        kvllm_grammar_free(g);
    }
    /* things that parse: comments, newlines in groups, escapes, empty alternatives, redefinition */
    static const char *const good[] = {
        "root ::= \"a\" # comment\n# another\n\n",
        "root ::= (\n  \"a\" |\n  \"b\"\n)\n",
        "root ::= [\\x41-\\x5A\\u00e9\\U0001F600] \"\\t\\r\\n\\\\\\\"\" [\\]\\[]\n",
        "root ::= | \"a\"\n",
        "root ::= \"\"\n",
        "root ::= x{2} x{0,} x{1,3} x{0} x*\nx ::= \"x\"\n",
        "root ::= \"a\"\nroot ::= \"b\"\n",
        "root ::= a-b\na-b ::= [^\\n]*\n",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) kvllm_grammar_free(parse_ok(good[i]));
}

struct acase {
    const char *s;
    int want;
};

static void check_table(const char *gtext, const struct acase *cases, size_t n, const struct gvocab *v) {
    struct kvllm_grammar *g = parse_ok(gtext);
    if (!g) return;
    for (size_t i = 0; i < n; i++) {
        int got = gu_matcher_accepts(g, v, cases[i].s, strlen(cases[i].s));
        CHECK_MSG(got == cases[i].want, "grammar %.30s...: '%s' got %d want %d", gtext, cases[i].s, got,
                  cases[i].want);
        int ref = ref_accepts(g, cases[i].s, strlen(cases[i].s));
        CHECK_MSG(ref == cases[i].want, "reference: '%s' got %d want %d", cases[i].s, ref, cases[i].want);
    }
    kvllm_grammar_free(g);
}

static const char k_arith[] =
    "root  ::= (expr \"=\" ws term \"\\n\")+\n"
    "expr  ::= term ([-+*/] term)*\n"
    "term  ::= ident | num | \"(\" ws expr \")\" ws\n"
    "ident ::= [a-z] [a-z0-9_]* ws\n"
    "num   ::= [0-9]+ ws\n"
    "ws    ::= [ \\t\\n]*\n";

static const char k_rep[] =
    "root ::= \"<\" [a-c]{2,4} \">\" x{3} y?\n"
    "x ::= [^<>\\n]\n"
    "y ::= \"é\"+ | \"€\" | [\\U0001F600-\\U0001F64F]\n";

static void test_tables(const struct gvocab *v) {
    static const struct acase arith[] = {
        { "1+2=3\n", 1 }, { "(a + b)*c= x\n", 0 }, { "(a+b)*c=x\n", 1 }, { "1+2=3", 0 }, { "1+=3\n", 0 },
        { "a=1\nb=2\n", 1 }, { "", 0 }, { "((1))=2\n", 1 }, { "(1=2\n", 0 },
    };
    check_table(k_arith, arith, sizeof arith / sizeof *arith, v);
    static const struct acase rep[] = {
        { "<ab>xyz", 1 }, { "<a>xyz", 0 }, { "<abcab>xyz", 0 }, { "<abc>x y", 1 }, { "<abc>x<y", 0 },
        { "<ab>xyzé", 1 }, { "<ab>xyzéé", 1 }, { "<ab>xyz€", 1 }, { "<ab>xyz€€", 0 }, { "<ab>xyz\xf0\x9f\x98\x80", 1 },
        { "<ab>xyz\xf0\x9f\x99\x90", 0 }, { "<ab>xyz\xc3", 0 }, { "<ab>ééé", 1 }, { "<ab>x\n", 0 },
    };
    check_table(k_rep, rep, sizeof rep / sizeof *rep, v);
}

/* ---- random strings: derivations and mutations ---- */

static void derive(const struct kvllm_grammar *g, uint32_t rule, struct rng *r, char *out, size_t *len, size_t cap,
                   int depth) {
    /* pick an alternative; deep down, prefer the shortest (fewest rule refs) */
    uint32_t alts[64];
    int n = 0;
    uint32_t a = g->rule_start[rule];
    for (;;) {
        if (n < 64) alts[n++] = a;
        while (g->elems[a].type != G_END && g->elems[a].type != G_ALT) a++;
        if (g->elems[a].type == G_END) break;
        a++;
    }
    uint32_t pick = alts[rng_u64(r) % (uint64_t)n];
    if (depth > 12) {
        int best = 1 << 30;
        for (int i = 0; i < n; i++) {
            int refs = 0;
            for (uint32_t p = alts[i]; g->elems[p].type != G_END && g->elems[p].type != G_ALT; p++)
                refs += g->elems[p].type == G_RULE_REF;
            if (refs < best) { best = refs; pick = alts[i]; }
        }
    }
    for (uint32_t p = pick; g->elems[p].type != G_END && g->elems[p].type != G_ALT;) {
        const struct gelem *e = &g->elems[p];
        if (e->type == G_RULE_REF) {
            derive(g, e->value, r, out, len, cap, depth + 1);
            p++;
            continue;
        }
        /* a code point of the class: try a few candidates */
        uint32_t cp = 'a';
        for (int t = 0; t < 200; t++) {
            uint32_t c;
            if (e->type == G_CHAR && t < 100) {
                /* one of the listed chars or ranges */
                const struct gelem *x = e;
                int k = 0, want = (int)(rng_u64(r) % 4);
                for (;;) {
                    uint32_t lo = x->value, hi = x->value;
                    const struct gelem *nx = x + 1;
                    if (nx->type == G_CHAR_RNG_UPPER) { hi = nx->value; nx++; }
                    c = lo + (uint32_t)(rng_u64(r) % (hi - lo + 1));
                    if (k++ == want || nx->type != G_CHAR_ALT) break;
                    x = nx;
                }
            } else {
                static const uint32_t pool[] = { 'a', 'z', '0', '9', ' ', '"', '\\', '{', '}', 0xE9, 0x20AC, 0x1F600, '\n', 'x', '-' };
                c = pool[rng_u64(r) % (sizeof pool / sizeof *pool)];
            }
            if (ref_class(e, c) && c) { cp = c; break; }
        }
        char buf[4];
        int nb;
        if (cp < 0x80) { buf[0] = (char)cp; nb = 1; }
        else if (cp < 0x800) { buf[0] = (char)(0xC0 | cp >> 6); buf[1] = (char)(0x80 | (cp & 63)); nb = 2; }
        else if (cp < 0x10000) { buf[0] = (char)(0xE0 | cp >> 12); buf[1] = (char)(0x80 | (cp >> 6 & 63)); buf[2] = (char)(0x80 | (cp & 63)); nb = 3; }
        else { buf[0] = (char)(0xF0 | cp >> 18); buf[1] = (char)(0x80 | (cp >> 12 & 63)); buf[2] = (char)(0x80 | (cp >> 6 & 63)); buf[3] = (char)(0x80 | (cp & 63)); nb = 4; }
        if (*len + (size_t)nb < cap) { memcpy(out + *len, buf, (size_t)nb); *len += (size_t)nb; }
        p++;
        while (g->elems[p].type == G_CHAR_ALT || g->elems[p].type == G_CHAR_RNG_UPPER) p++;
    }
}

static void test_random_strings(const char *gtext, const struct gvocab *v, uint64_t seed, int n_strings) {
    struct kvllm_grammar *g = parse_ok(gtext);
    if (!g) return;
    struct rng r;
    rng_seed(&r, seed);
    int n_acc = 0, n_rej = 0, n_cmp = 0;
    for (int i = 0; i < n_strings; i++) {
        char s[400];
        size_t len = 0;
        derive(g, g->root, &r, s, &len, 300, 0);
        int mut = (int)(rng_u64(&r) % 3);   /* 0: as derived; 1-2: that many edits */
        for (int k = 0; k < mut && len > 0; k++) {
            size_t at = rng_u64(&r) % len;
            int op = (int)(rng_u64(&r) % 3);
            static const char ins[] = "a1 \"(){}[],:+-=\n\\x";
            if (op == 0) memmove(s + at, s + at + 1, len - at - 1), len--;
            else if (op == 1) s[at] = ins[rng_u64(&r) % (sizeof ins - 1)];
            else if (len < 390) memmove(s + at + 1, s + at, len - at), s[at] = ins[rng_u64(&r) % (sizeof ins - 1)], len++;
        }
        int ref = ref_accepts(g, s, len);
        if (ref < 0) continue;
        int got = gu_matcher_accepts(g, v, s, len);
        n_cmp++;
        ref ? n_acc++ : n_rej++;
        CHECK_MSG(got == ref, "'%.*s': matcher %d, reference %d", (int)len, s, got, ref);
    }
    /* the comparison must have seen both kinds */
    CHECK_MSG(n_acc > n_strings / 10 && n_rej > n_strings / 10, "accepted %d rejected %d of %d", n_acc, n_rej, n_cmp);
    kvllm_grammar_free(g);
}

/* ---- masks against the brute force ---- */

static int brute_mask(struct gmatcher *m, int n_vocab, uint32_t *allow) {
    memset(allow, 0, (size_t)(n_vocab + 31) / 32 * 4);
    int n = 0;
    for (int t = 0; t < n_vocab; t++) {
        if (gmatcher_accept(m, t) == 0) {
            allow[t >> 5] |= 1u << (t & 31);
            n++;
            CHECK(gmatcher_rollback(m, 1) == 0);
        }
    }
    return n;
}

/* Walk n_steps random allowed tokens (a fixed text's tokens first, when given),
 * comparing every mask with the brute force. */
static void test_masks(const char *gtext, const struct tvocab *tv, const struct gvocab *v, uint64_t seed, int n_steps,
                       const char *name) {
    struct kvllm_grammar *g = parse_ok(gtext);
    if (!g) return;
    /* round 1 computes every context; round 2, a new matcher of the same grammar, copies them from the
     * grammar's shared store */
    for (int round = 0; round < 2; round++) {
        struct gmatcher *m;
        CHECK(gmatcher_new(g, v, &m) == 0);
        int words = (tv->n + 31) / 32;
        uint32_t *a = calloc((size_t)words, 4), *b = calloc((size_t)words, 4);
        struct rng r;
        rng_seed(&r, seed);
        int steps = 0;
        for (; steps < n_steps; steps++) {
            int n_fast = gmatcher_fill_mask(m, a);
            int n_brute = brute_mask(m, tv->n, b);
            int diff = 0, first = -1;
            for (int t = 0; t < tv->n; t++)
                if ((a[t >> 5] ^ b[t >> 5]) >> (t & 31) & 1) { diff++; if (first < 0) first = t; }
            CHECK_MSG(n_fast == n_brute && diff == 0, "%s step %d: fast %d brute %d, %d differ (first: token %d '%.*s' fast %d)",
                      name, steps, n_fast, n_brute, diff, first, first >= 0 ? (int)tv->len[first] : 0,
                      first >= 0 ? tv->bytes[first] : "", first >= 0 ? (int)(a[first >> 5] >> (first & 31) & 1) : -1);
            CHECK(!(a[tv->end_id >> 5] >> (tv->end_id & 31) & 1) == !gmatcher_can_end(m));
            for (int t = 0; t < tv->n; t++)
                if (tv->special[t] && t != tv->end_id) CHECK(!(a[t >> 5] >> (t & 31) & 1));
            if (n_brute == 0) break;
            /* pick: mostly a random allowed non-end token, a multi-byte one when possible */
            int pick = -1;
            for (int tries = 0; tries < 64 && pick < 0; tries++) {
                int t = (int)(rng_u64(&r) % (uint64_t)tv->n);
                for (int k = 0; k < tv->n; k++) {
                    int u = (t + k) % tv->n;
                    if ((b[u >> 5] >> (u & 31) & 1) && u != tv->end_id && (tries > 32 || tv->len[u] > 1)) { pick = u; break; }
                }
            }
            if (pick < 0) break;
            CHECK(gmatcher_accept(m, pick) == 0);
        }
        CHECK_MSG(steps >= 3, "%s: only %d steps", name, steps);
        free(a);
        free(b);
        gmatcher_free(m);
        n_steps = n_steps / 2 > 3 ? n_steps / 2 : 3;
    }
    kvllm_grammar_free(g);
}

static const char k_json[] =
    "root ::= object\n"
    "value ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char k_unicode[] =
    "root ::= (word \" \")* word \".\"?\n"
    "word ::= [a-zé€中文\\U0001F600]+ | [^ .a-z\\x00-\\x7F]{1,3}\n";

/* rollback, end tokens, must_end, specials */
static void test_rollback(const struct tvocab *tv, const struct gvocab *v) {
    struct kvllm_grammar *g = parse_ok("root ::= \"ab\" \"c\"?\n");
    struct gmatcher *m;
    CHECK(gmatcher_new(g, v, &m) == 0);
    CHECK(!gmatcher_can_end(m));
    CHECK(gmatcher_accept(m, 'b') == KVLLM_EINVAL);
    CHECK(gmatcher_accept(m, 'a') == 0);
    CHECK(gmatcher_accept(m, tv->end_id) == KVLLM_EINVAL);
    CHECK(gmatcher_accept(m, 'b') == 0);
    CHECK(gmatcher_can_end(m) && !gmatcher_must_end(m));
    CHECK(gmatcher_accept(m, 'c') == 0);
    CHECK(gmatcher_can_end(m) && gmatcher_must_end(m));
    uint32_t *mask = calloc((size_t)(tv->n + 31) / 32, 4);
    CHECK(gmatcher_fill_mask(m, mask) == 1 && (mask[tv->end_id >> 5] >> (tv->end_id & 31) & 1));
    CHECK(gmatcher_accept(m, tv->end_id) == 0);
    CHECK(gmatcher_fill_mask(m, mask) == 0);
    CHECK(gmatcher_rollback(m, 5) == KVLLM_EINVAL);
    CHECK(gmatcher_rollback(m, 3) == 0);
    CHECK(!gmatcher_can_end(m));
    CHECK(gmatcher_accept(m, 'b') == 0 && gmatcher_can_end(m));
    CHECK(gmatcher_rollback(m, 2) == 0);
    CHECK(gmatcher_accept(m, 'a') == 0);   /* back at the start */
    gmatcher_free(m);
    kvllm_grammar_free(g);
    /* a long history: rollback is bounded but covers >= 16 tokens */
    g = parse_ok("root ::= \"x\"*\n");
    CHECK(gmatcher_new(g, v, &m) == 0);
    for (int i = 0; i < 100; i++) CHECK(gmatcher_accept(m, 'x') == 0);
    CHECK(gmatcher_rollback(m, 16) == 0);
    CHECK(gmatcher_rollback(m, 16) == 0);
    CHECK(gmatcher_accept(m, 'y') == KVLLM_EINVAL);
    /* a token ending inside a character: "\xc3" then "\xa9x" */
    gmatcher_free(m);
    kvllm_grammar_free(g);
    g = parse_ok("root ::= \"é\" \"x\"\n");
    CHECK(gmatcher_new(g, v, &m) == 0);
    CHECK(gmatcher_accept(m, 0xE2) == KVLLM_EINVAL);   /* lead byte of a 3-byte char: no é can start so */
    CHECK(gmatcher_accept(m, 0xC3) == 0);
    CHECK(!gmatcher_can_end(m));
    CHECK(gmatcher_accept(m, 0xA8) == KVLLM_EINVAL);   /* è */
    CHECK(gmatcher_accept(m, 0xA9) == 0);
    CHECK(gmatcher_accept(m, 'x') == 0 && gmatcher_must_end(m));
    free(mask);
    gmatcher_free(m);
    kvllm_grammar_free(g);
}

/* Classes admit UTF-8 alone: no overlong form, no surrogate, nothing past U+10FFFF.  A negated class
 * admitted ED A0 80 (a surrogate) and F4 90 80 80, and [^\x00-\U0010FFFF] (nothing) the latter. */
static void test_invalid_utf8(const struct gvocab *v) {
    struct kvllm_grammar *neg = parse_ok("root ::= [^a]"), *any = parse_ok("root ::= ."),
                         *none = parse_ok("root ::= [^\\x00-\\U0010FFFF]");
    static const char *const valid[] = { "b", "\xc2\x80", "\xc3\xa9", "\xe0\xa0\x80", "\xe2\x82\xac", "\xed\x9f\xbf",
                                         "\xee\x80\x80", "\xf0\x90\x80\x80", "\xf4\x8f\xbf\xbf" };
    static const char *const invalid[] = { "\xc0\x80", "\xc1\xbf", "\xe0\x80\x80", "\xe0\x9f\xbf", "\xed\xa0\x80",
                                           "\xed\xbf\xbf", "\xf0\x80\x80\x80", "\xf0\x8f\xbf\xbf", "\xf4\x90\x80\x80",
                                           "\xf5\x80\x80\x80", "\xf7\xbf\xbf\xbf" };
    for (size_t i = 0; neg && any && none && i < sizeof valid / sizeof *valid; i++) {
        const size_t n = strlen(valid[i]);
        CHECK_MSG(gu_matcher_accepts(neg, v, valid[i], n) == 1 && gu_matcher_accepts(any, v, valid[i], n) == 1,
                  "valid UTF-8 #%zu refused", i);
        CHECK_MSG(gu_matcher_accepts(none, v, valid[i], n) == 0, "valid UTF-8 #%zu in the empty class", i);
    }
    for (size_t i = 0; neg && any && none && i < sizeof invalid / sizeof *invalid; i++) {
        const size_t n = strlen(invalid[i]);
        CHECK_MSG(gu_matcher_accepts(neg, v, invalid[i], n) == 0 && gu_matcher_accepts(any, v, invalid[i], n) == 0 &&
                  gu_matcher_accepts(none, v, invalid[i], n) == 0, "invalid UTF-8 #%zu accepted", i);
    }
    kvllm_grammar_free(neg);
    kvllm_grammar_free(any);
    kvllm_grammar_free(none);
}

int main(void) {
    test_parse_errors();
    struct tvocab syn;
    tvocab_synthetic(&syn);
    struct gvocab *vs;
    CHECK(tvocab_index(&syn, &vs) == 0);
    test_tables(vs);
    test_invalid_utf8(vs);
    test_rollback(&syn, vs);
    test_random_strings(k_arith, vs, 1, 400);
    test_random_strings(k_json, vs, 2, 400);
    test_random_strings(k_rep, vs, 3, 400);
    test_random_strings(k_unicode, vs, 4, 400);
    test_masks(k_json, &syn, vs, 10, 60, "synthetic/json");
    test_masks(k_arith, &syn, vs, 11, 40, "synthetic/arith");
    test_masks(k_unicode, &syn, vs, 12, 40, "synthetic/unicode");
    test_masks(k_rep, &syn, vs, 13, 12, "synthetic/rep");

    char path[1024];
    struct tvocab gpt2;
    snprintf(path, sizeof path, "%s/tokenizers/gpt2/encoder.json", check_shared_dir());
    if (tvocab_gpt2(&gpt2, path)) {
        struct gvocab *vg;
        CHECK(tvocab_index(&gpt2, &vg) == 0);
        test_masks(k_json, &gpt2, vg, 20, 25, "gpt2/json");
        test_masks(k_unicode, &gpt2, vg, 21, 12, "gpt2/unicode");
        test_masks(k_arith, &gpt2, vg, 22, 12, "gpt2/arith");
        gvocab_free(vg);
        tvocab_free(&gpt2);
    } else {
        CHECK_MSG(0, "missing %s (the test data tokenizers)", path);
    }
    struct tvocab spm;
    snprintf(path, sizeof path, "%s/tokenizers/llama2/llama2c-tokenizer.bin", check_shared_dir());
    if (tvocab_llama2c(&spm, path, 32000)) {
        struct gvocab *vl;
        CHECK(tvocab_index(&spm, &vl) == 0);
        test_masks(k_json, &spm, vl, 30, 20, "llama2/json");
        test_masks(k_unicode, &spm, vl, 31, 12, "llama2/unicode");
        gvocab_free(vl);
        tvocab_free(&spm);
    } else {
        CHECK_MSG(0, "missing %s (the test data tokenizers)", path);
    }
    gvocab_free(vs);
    tvocab_free(&syn);
    return check_report("test_grammar_match");
}
