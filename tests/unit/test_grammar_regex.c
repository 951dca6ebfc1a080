/* test_grammar_regex.c — regular expressions and choice lists as grammars
 * (kvllm_grammar_from_regex / _from_choices) against PCRE2:
 *   - hand-written patterns and strings, each judged by PCRE2 in full
 *     (anchored at both ends) and by the grammar's matcher;
 *   - random patterns over a small alphabet (classes, shorthands, groups,
 *     alternation, every quantifier) and random strings, most of them built
 *     to be near the pattern's language, judged by both;
 *   - what is refused, with the offset in the message;
 *   - choices, including ones that are prefixes of each other;
 *   - the same random patterns read over JSON string text (a JSON Schema's
 *     "pattern"): the grammar on a string's JSON spelling against PCRE2 on
 *     the string, and hand-written cases of what JSON escapes. */
#include "check.h"
#include "grammar_util.h"
#include "grammar/grammar_internal.h"
#include "core/core.h"
#include "core/strbuf.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

static struct gvocab *g_vocab;   /* token b is byte b */

static int matcher_accepts(const struct kvllm_grammar *g, const char *s, size_t len) {
    return gu_matcher_accepts(g, g_vocab, s, len);
}

/* PCRE2's verdict on the whole of s (1 match, 0 none, -1 the pattern does not compile). */
static int pcre_full(const char *pat, const char *s, size_t len) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_ALT_BSUX, &ec, &eo, NULL);
    if (!re) return -1;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, len, 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

static struct kvllm_grammar *compile_ok(const char *pat) {
    struct kvllm_grammar *g = NULL;
    char err[256] = "";
    int rc = kvllm_grammar_from_regex(pat, &g, err, sizeof err);
    CHECK_MSG(rc == 0, "regex /%s/ refused: %s", pat, err);
    return g;
}

/* Both judges on one string; true when they agree. */
static bool agree(const char *pat, const struct kvllm_grammar *g, const char *s, size_t len) {
    int want = pcre_full(pat, s, len), got = matcher_accepts(g, s, len);
    CHECK_MSG(want == got, "/%s/ on \"%.*s\": PCRE2 %d, grammar %d\n%s", pat, (int)len, s, want, got,
              grammar_gbnf_text(g));
    return want == got;
}

static void test_handwritten(void) {
    static const struct { const char *pat; const char *strs[8]; } cases[] = {
        { "abc", { "abc", "ab", "abcd", "" } },
        { "^a|b$", { "a", "b", "ab", "" } },
        { "\\w+@\\w+\\.com\\n", { "alan@enigma.com\n", "alan@enigma.com", "a@b.com\n", "@b.com\n", "a@b_c.com\n" } },
        { "\\d{3}-\\d{4}", { "555-1234", "55-1234", "5551234", "555-12345" } },
        { "(?:ab|cd)*e?", { "", "ab", "abcd", "abcde", "e", "abc", "ee" } },
        { "[^a-c\\d]+", { "xyz", "xa", "", "9", "\xc3\xa9t\xc3\xa9", "\n" } },
        { "[\\D]", { "a", "1", "\xe2\x82\xac", "\n" } },
        { "[\\S\\d]{2}", { "ab", "1 ", "  ", "\t1" } },
        { "a.c", { "abc", "a\nc", "a\xc3\xa9" "c", "ac" } },
        { "colou?r", { "color", "colour", "colouur" } },
        { "x{2,}y{0,1}z{1}", { "xxz", "xxxyz", "xz", "xxyyz" } },
        { "(?P<year>\\d{4})-(?<m>0[1-9]|1[0-2])", { "2024-01", "2024-12", "2024-13", "24-01" } },
        { "[]a]+", { "]a]", "a", "b" } },
        { "[a-]+\\-", { "a--", "-", "a-" } },
        { "\\x41\\u00e9\\u20ac", { "A\xc3\xa9\xe2\x82\xac", "A\xc3\xa9" } },
        { "a{x", { "a{x", "ax" } },
        { "a*?b+?c??", { "b", "aabbc", "c", "" } },
        { "\\s*\\S+\\s*", { " x ", "x", "\t\n", "x y" } },
        { "(a|)(b|)", { "", "a", "b", "ab", "ba" } },
        { "(a?){0,3}b{0}", { "", "a", "aaa", "aaaa", "b" } },
        { "[.*+?]\\.\\*", { "..*", "*.*", "a.*" } },
        { "\"[^\"]*\"", { "\"hi\"", "\"\"", "\"a\"b\"" } },
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        CHECK_MSG(pcre_full(cases[k].pat, "", 0) >= 0, "PCRE2 refuses /%s/", cases[k].pat);
        struct kvllm_grammar *g = compile_ok(cases[k].pat);
        if (!g) continue;
        for (int i = 0; i < 8 && cases[k].strs[i]; i++) agree(cases[k].pat, g, cases[k].strs[i], strlen(cases[k].strs[i]));
        kvllm_grammar_free(g);
    }
}

/* \x{...} is PCRE2's spelling without PCRE2_ALT_BSUX (which the comparison uses for \uHHHH). */
static void test_braced_hex(void) {
    struct kvllm_grammar *g = compile_ok("\\x{20AC}\\x{1F600}?");
    if (!g) return;
    CHECK(matcher_accepts(g, "\xe2\x82\xac", 3) == 1 && matcher_accepts(g, "\xe2\x82\xac\xf0\x9f\x98\x80", 7) == 1);
    CHECK(matcher_accepts(g, "x", 1) == 0);
    kvllm_grammar_free(g);
}

static void test_refused(void) {
    static const struct { const char *pat, *want; int rc; } bad[] = {
        { "(a)\\1", "offset 3: '\\1'", KVLLM_EUNSUPPORTED },
        { "a(?=b)", "offset 1: '(?='", KVLLM_EUNSUPPORTED },
        { "\\bword", "offset 0: '\\b'", KVLLM_EUNSUPPORTED },
        { "a^b", "offset 1: an anchor", KVLLM_EUNSUPPORTED },
        { "a*+", "possessive", KVLLM_EUNSUPPORTED },
        { "(?i)abc", "offset 0: '(?i'", KVLLM_EUNSUPPORTED },
        { "(ab", "offset 0: an unclosed '('", KVLLM_EINVAL },
        { "ab)", "offset 2: an unmatched ')'", KVLLM_EINVAL },
        { "[ab", "offset 0: an unterminated class", KVLLM_EINVAL },
        { "*a", "nothing before it", KVLLM_EINVAL },
        { "a**", "a quantifier after a quantifier", KVLLM_EINVAL },
        { "[z-a]", "out of order", KVLLM_EINVAL },
        { "a{3,2}", "out of order", KVLLM_EINVAL },
        { "a{20000}", "above", KVLLM_ERANGE },
        { "\\p{L}", "'\\p'", KVLLM_EUNSUPPORTED },
        { "abc\\", "a trailing", KVLLM_EINVAL },
        { "(a?)*", "offset 4: an unbounded repetition", KVLLM_EUNSUPPORTED },
        { "(|b)+", "an unbounded repetition", KVLLM_EUNSUPPORTED },
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        struct kvllm_grammar *g = NULL;
        char err[256] = "";
        int rc = kvllm_grammar_from_regex(bad[k].pat, &g, err, sizeof err);
        CHECK_MSG(rc == bad[k].rc && !g && strstr(err, bad[k].want), "/%s/: rc %d (want %d), '%s' (want '%s')",
                  bad[k].pat, rc, bad[k].rc, err, bad[k].want);
        kvllm_grammar_free(g);
    }
    /* groups nested past the bound are refused, never recursed into */
    char deep[400];
    size_t n = 0;
    for (int i = 0; i < 100; i++) deep[n++] = '(';
    deep[n++] = 'a';
    for (int i = 0; i < 100; i++) deep[n++] = ')';
    deep[n] = 0;
    struct kvllm_grammar *g = NULL;
    char err[256] = "";
    CHECK(kvllm_grammar_from_regex(deep, &g, err, sizeof err) == KVLLM_ERANGE && strstr(err, "nested"));
}

/* ---- random patterns ---- */

static struct rng g_rng;
static int rnd(int n) { return (int)(rng_u64(&g_rng) % (uint64_t)n); }

struct pbuf { char s[512]; size_t n; };
static void pput(struct pbuf *b, const char *t) {
    size_t k = strlen(t);
    if (b->n + k < sizeof b->s) { memcpy(b->s + b->n, t, k); b->n += k; b->s[b->n] = 0; }
}

static void gen_alt(struct pbuf *b, int depth);

static void gen_atom(struct pbuf *b, int depth) {
    static const char *const atoms[] = { "a", "b", "c", "\\.", "[ab]", "[^a]", "[a-c]", "\\d", "\\w", "\\s", "\\D",
                                         "[\\dx]", "[^\\sb]", ".", "\\x61", "-", "1", " " };
    if (depth < 3 && rnd(5) == 0) {
        pput(b, rnd(2) ? "(" : "(?:");
        gen_alt(b, depth + 1);
        pput(b, ")");
    } else {
        pput(b, atoms[rnd((int)(sizeof atoms / sizeof *atoms))]);
    }
    static const char *const quants[] = { "", "", "", "?", "*", "+", "{2}", "{0,2}", "{1,}", "*?", "{1,3}?" };
    pput(b, quants[rnd((int)(sizeof quants / sizeof *quants))]);
}

static void gen_alt(struct pbuf *b, int depth) {
    int n_alt = rnd(4) == 0 ? 2 + rnd(2) : 1;
    for (int a = 0; a < n_alt; a++) {
        if (a) pput(b, "|");
        int n = rnd(4);
        for (int i = 0; i < n; i++) gen_atom(b, depth);
    }
}

/* A string over the pattern's alphabet (and a few others), of 0..8 characters. */
static size_t gen_string(char *s) {
    static const char *const chars[] = { "a", "b", "c", ".", "1", "7", " ", "\n", "-", "x", "_", "\xc3\xa9" };
    size_t n = 0;
    int len = rnd(9);
    for (int i = 0; i < len; i++) {
        const char *c = chars[rnd((int)(sizeof chars / sizeof *chars))];
        memcpy(s + n, c, strlen(c));
        n += strlen(c);
    }
    s[n] = 0;
    return n;
}

/* Strings PCRE2 accepts are rare among random ones: keep drawing until some
 * of each verdict were compared. */
static void test_random(void) {
    rng_seed(&g_rng, 20261203);
    int n_pat = 0, n_yes = 0, n_no = 0, n_refused = 0;
    for (int t = 0; t < 400; t++) {
        struct pbuf b = { .n = 0 };
        b.s[0] = 0;
        gen_alt(&b, 0);
        if (pcre_full(b.s, "", 0) < 0) continue;
        struct kvllm_grammar *g = NULL;
        char err[256] = "";
        int rc = kvllm_grammar_from_regex(b.s, &g, err, sizeof err);
        if (rc == KVLLM_EUNSUPPORTED && strstr(err, "can match the empty string")) { n_refused++; continue; }
        CHECK_MSG(rc == 0, "regex /%s/ refused: %s", b.s, err);
        if (!g) continue;
        n_pat++;
        char s[64];
        bool all = true;
        for (int k = 0; k < 300 && all; k++) {
            size_t n = gen_string(s);
            all = agree(b.s, g, s, n);
            if (pcre_full(b.s, s, n)) n_yes++;
            else n_no++;
        }
        kvllm_grammar_free(g);
    }
    printf("random: %d patterns (and %d refused: an unbounded repetition of what can be empty), %d matching and "
           "%d other strings compared\n", n_pat, n_refused, n_yes, n_no);
    CHECK(n_pat > 300 && n_yes > 1000 && n_no > 1000);
}

/* ---- over JSON string text ---- */

/* The pattern's grammar over the inside of a JSON string (NULL, err set, when refused). */
static struct kvllm_grammar *compile_json(const char *pat, struct regex_anchors *an, char *err, size_t cap) {
    struct strbuf o = { 0 };
    struct kvllm_grammar *g = NULL;
    sb_puts(&o, "root ::= ");
    int rc = regex_gbnf_expr(pat, strlen(pat), REGEX_JSON_STRING, &o, an, err, cap);
    sb_puts(&o, "\n");
    if (!rc) rc = o.oom ? KVLLM_ENOMEM : gbnf_parse(o.s, &g, err, cap);
    sb_free(&o);
    return rc ? NULL : g;
}

/* s as JSON spells it inside a string (of the random alphabet, only the newline is escaped). */
static size_t json_spell(const char *s, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n') { out[k++] = '\\'; out[k++] = 'n'; }
        else out[k++] = s[i];
    }
    return k;
}

/* The pattern as PCRE2 must read it to judge JSON text: a negated class
 * also leaves out what a JSON string escapes ("." already leaves out the
 * alphabet's newline). */
static void json_negated(const char *pat, char *out, size_t cap) {
    size_t k = 0;
    for (const char *p = pat; *p && k + 24 < cap; p++) {
        out[k++] = *p;
        if (p[0] == '[' && p[1] == '^' && (p == pat || p[-1] != '\\')) {
            out[k++] = *++p;
            const char *x = "\\x00-\\x1f\"\\\\\\x7f";
            memcpy(out + k, x, strlen(x));
            k += strlen(x);
        }
    }
    out[k] = 0;
}

static void test_random_json(void) {
    rng_seed(&g_rng, 20261204);
    int n_pat = 0, n_yes = 0, n_no = 0;
    for (int t = 0; t < 300; t++) {
        struct pbuf b = { .n = 0 };
        b.s[0] = 0;
        gen_alt(&b, 0);
        char pcre_pat[1024];
        json_negated(b.s, pcre_pat, sizeof pcre_pat);
        if (pcre_full(pcre_pat, "", 0) < 0) continue;
        struct regex_anchors an;
        char err[256] = "";
        struct kvllm_grammar *g = compile_json(b.s, &an, err, sizeof err);
        if (!g) {
            CHECK_MSG(strstr(err, "can match the empty string"), "regex /%s/ refused over JSON: %s", b.s, err);
            continue;
        }
        n_pat++;
        char s[64], spelled[128];
        for (int k = 0; k < 300; k++) {
            size_t n = gen_string(s), m = json_spell(s, n, spelled);
            int want = pcre_full(pcre_pat, s, n), got = matcher_accepts(g, spelled, m);
            want ? n_yes++ : n_no++;
            if (want != got) {
                CHECK_MSG(0, "/%s/ over JSON on \"%.*s\": PCRE2 (as /%s/) %d, grammar %d\n%s", b.s, (int)m, spelled,
                          pcre_pat, want, got, grammar_gbnf_text(g));
                break;
            }
        }
        kvllm_grammar_free(g);
    }
    printf("random over JSON text: %d patterns, %d matching and %d other strings compared\n", n_pat, n_yes, n_no);
    CHECK(n_pat > 200 && n_yes > 1000 && n_no > 1000);
}

/* What JSON escapes: a pattern's character matches its JSON spelling, never the raw byte. */
static void test_json_escapes(void) {
    static const struct { const char *pat; const char *yes[6]; const char *no[6]; } cases[] = {
        { "a\\nb", { "a\\nb" }, { "a\nb", "anb" } },
        { "say \"hi\"", { "say \\\"hi\\\"" }, { "say \"hi\"" } },
        { "[\\n\"x]+", { "\\n\\\"x", "x", "\\n" }, { "\"", "\n", "\\" } },
        { "\\\\d", { "\\\\d" }, { "\\d", "\\\\", "5" } },
        { ".", { "x", "\xc3\xa9", " " }, { "\"", "\\\"", "\n", "\\n", "\\" } },
        { "[^a]", { "b", "\xc3\xa9" }, { "a", "\"", "\\n", "\x7f" } },
        { "\\D", { "x", "\\\"", "\\u0001", "\\n" }, { "5", "\"", "\x01" } },
        { "\\s", { " ", "\\t", "\\n", "\\u000b", "\\f", "\\r" }, { "\t", "\n", "x" } },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct regex_anchors an;
        char err[256] = "";
        struct kvllm_grammar *g = compile_json(cases[i].pat, &an, err, sizeof err);
        CHECK_MSG(g, "/%s/ over JSON refused: %s", cases[i].pat, err);
        if (!g) continue;
        for (int k = 0; k < 6 && cases[i].yes[k]; k++)
            CHECK_MSG(matcher_accepts(g, cases[i].yes[k], strlen(cases[i].yes[k])) == 1, "/%s/ over JSON: '%s'",
                      cases[i].pat, cases[i].yes[k]);
        for (int k = 0; k < 6 && cases[i].no[k]; k++)
            CHECK_MSG(matcher_accepts(g, cases[i].no[k], strlen(cases[i].no[k])) == 0, "/%s/ over JSON: not '%s'",
                      cases[i].pat, cases[i].no[k]);
        kvllm_grammar_free(g);
    }
    static const struct { const char *pat; bool start, end; } anchors[] = {
        { "^ab$", true, true }, { "ab", false, false }, { "a\\$", false, false }, { "^(a|b$)", true, false },
    };
    for (size_t i = 0; i < sizeof anchors / sizeof *anchors; i++) {
        struct regex_anchors an = { !anchors[i].start, !anchors[i].end };
        char err[256] = "";
        struct kvllm_grammar *g = compile_json(anchors[i].pat, &an, err, sizeof err);
        if (!g) {   /* '$' inside a group is refused: an anchor inside the pattern */
            CHECK_MSG(strstr(err, "anchor") && i == 3, "/%s/: %s", anchors[i].pat, err);
            continue;
        }
        CHECK_MSG(an.start == anchors[i].start && an.end == anchors[i].end, "/%s/: anchors %d %d", anchors[i].pat,
                  an.start, an.end);
        kvllm_grammar_free(g);
    }
}

static void test_choices(void) {
    const char *const ch[] = { "yes", "no", "yes!", "", "\"quoted\"\n", "\xc3\xa9t\xc3\xa9" };
    struct kvllm_grammar *g = NULL;
    char err[256] = "";
    CHECK(kvllm_grammar_from_choices(ch, 6, &g, err, sizeof err) == 0);
    if (!g) return;
    for (int i = 0; i < 6; i++) CHECK_MSG(matcher_accepts(g, ch[i], strlen(ch[i])) == 1, "choice %d", i);
    static const char *const not[] = { "ye", "yes!!", "noo", "\"quoted\"", "\xc3\xa9t" };
    for (int i = 0; i < 5; i++) CHECK_MSG(matcher_accepts(g, not[i], strlen(not[i])) == 0, "'%s'", not[i]);
    kvllm_grammar_free(g);
    g = NULL;
    CHECK(kvllm_grammar_from_choices(ch, 0, &g, err, sizeof err) == KVLLM_EINVAL && !g && strstr(err, "no choices"));
}

int main(void) {
    struct tvocab tv;
    tvocab_synthetic(&tv);
    int32_t end = tv.end_id;
    if (gvocab_new(tv.n, (const char *const *)tv.bytes, tv.len, tv.special, &end, 1, &g_vocab)) return 1;
    test_handwritten();
    test_braced_hex();
    test_refused();
    test_random();
    test_random_json();
    test_json_escapes();
    test_choices();
    gvocab_free(g_vocab);
    tvocab_free(&tv);
    return check_report("grammar_regex");
}
