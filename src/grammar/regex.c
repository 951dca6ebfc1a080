/* regex.c — regular expressions and lists of choices as grammars: vLLM's
 * guided_regex / guided_choice (structured_outputs.regex / .choice), where
 * the whole output must match (as outlines and xgrammar read them).
 *
 * Model of the world: a regular expression is already almost GBNF.  Both
 * have literals, character classes, groups, alternation and the
 * quantifiers ?, *, + and {m,n}; what differs is spelling (escapes, the
 * class shorthands \d \w \s, "." without newline).  So a pattern is
 * translated, token by token, into one GBNF rule and handed to the GBNF
 * compiler, which builds the repetitions and enforces the grammar budgets.
 * Only the regular subset is taken: backreferences, lookaround, word
 * boundaries, anchors inside the pattern and possessive quantifiers change
 * the language in ways a context-free grammar over the output cannot follow
 * (or would follow wrongly), so they are refused with their offset, never
 * ignored.  The shorthands mean what PCRE2 gives them without UCP (\d is
 * [0-9], \w is [A-Za-z0-9_], \s is [\t\n\v\f\r ]), so tests can compare
 * against PCRE2 itself.
 *
 * The same translator serves a JSON Schema's "pattern" (schema_string.c),
 * whose text is the inside of a JSON string: there a character of the
 * pattern matches the way JSON spells it (a newline is the two characters
 * \n, a quote \"), and "." and negated classes match only what a JSON
 * string holds unescaped (REGEX_JSON_STRING). */
#include "grammar/grammar_internal.h"
#include "core/strbuf.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RX_MAX_DEPTH 64        /* groups nested (the translator recurses into each) */
#define RX_MAX_REPEAT 10000    /* {m,n} bounds; the GBNF compiler has its own budget on what they expand to */
#define RX_MAX_CP 0x10FFFFu

struct rx {
    const char *s;        /* the pattern, n bytes */
    size_t i, n;
    struct strbuf *o;     /* the GBNF text being written */
    bool json;            /* REGEX_JSON_STRING: characters as a JSON string spells them */
    bool end_anchor;      /* the closing '$' was read */
    int depth;
    char *err;
    size_t err_cap;
    int rc;               /* first error (0: none) */
};

static bool rx_fail(struct rx *r, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static bool rx_fail(struct rx *r, int rc, const char *fmt, ...) {
    if (r->rc) return false;
    r->rc = rc;
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (r->err && r->err_cap) snprintf(r->err, r->err_cap, "regex offset %zu: %s", r->i, what);
    return false;
}

static void sb_putc(struct strbuf *o, int c) {
    char ch = (char)c;
    sb_put(o, &ch, 1);
}

static bool at_end(const struct rx *r) { return r->i >= r->n; }
static char peek(const struct rx *r, size_t k) { return r->i + k < r->n ? r->s[r->i + k] : 0; }

/* ---- code points and classes ---- */

/* One UTF-8 code point of the pattern (the caller validated the text). */
static uint32_t next_cp(struct rx *r) {
    unsigned char c0 = (unsigned char)r->s[r->i++];
    if (c0 < 0x80) return c0;
    int extra = c0 >= 0xF0 ? 3 : c0 >= 0xE0 ? 2 : 1;
    uint32_t cp = c0 & (0x3Fu >> extra);
    for (int k = 0; k < extra && !at_end(r); k++) cp = (cp << 6) | ((unsigned char)r->s[r->i++] & 0x3Fu);
    return cp;
}

/* A code point as GBNF writes it inside a class or a literal: escaped
 * unless it is printable ASCII without meaning there. */
static void put_cp(struct strbuf *o, uint32_t cp) {
    if (cp >= 0x20 && cp < 0x7F && !strchr("\\\"[]^-", (int)cp)) sb_putc(o, (int)cp);
    else if (cp < 0x100) sb_printf(o, "\\x%02X", cp);
    else if (cp < 0x10000) sb_printf(o, "\\u%04X", cp);
    else sb_printf(o, "\\U%08X", cp);
}

/* A set of code points as sorted, disjoint ranges (a class under
 * construction: shorthands and negated shorthands add ranges; the class is
 * written from the union, negated as the pattern says). */
struct cpset {
    uint32_t lo[64], hi[64];
    int n;
};

static bool set_add(struct rx *r, struct cpset *s, uint32_t lo, uint32_t hi) {
    if (s->n == (int)(sizeof s->lo / sizeof *s->lo))
        return rx_fail(r, KVLLM_EUNSUPPORTED, "a class of more than %d ranges", (int)(sizeof s->lo / sizeof *s->lo));
    s->lo[s->n] = lo;
    s->hi[s->n] = hi;
    s->n++;
    return true;
}

/* The ranges of a shorthand (d, w, s) or of its complement (D, W, S). */
static bool set_shorthand(struct rx *r, struct cpset *s, char e) {
    static const uint32_t d[][2] = { { '0', '9' } };
    static const uint32_t w[][2] = { { '0', '9' }, { 'A', 'Z' }, { '_', '_' }, { 'a', 'z' } };
    static const uint32_t sp[][2] = { { '\t', '\r' }, { ' ', ' ' } };
    const uint32_t(*t)[2] = e == 'd' || e == 'D' ? d : e == 'w' || e == 'W' ? w : sp;
    int nt = e == 'd' || e == 'D' ? 1 : e == 'w' || e == 'W' ? 4 : 2;
    if (e >= 'a') {
        for (int k = 0; k < nt; k++)
            if (!set_add(r, s, t[k][0], t[k][1])) return false;
        return true;
    }
    uint32_t from = 0;   /* the complement: the gaps between the ranges */
    for (int k = 0; k < nt; k++) {
        if (t[k][0] > from && !set_add(r, s, from, t[k][0] - 1)) return false;
        from = t[k][1] + 1;
    }
    return set_add(r, s, from, RX_MAX_CP);
}

static void put_set(struct strbuf *o, const struct cpset *s, bool neg) {
    sb_puts(o, neg ? "[^" : "[");
    for (int k = 0; k < s->n; k++) {
        put_cp(o, s->lo[k]);
        if (s->hi[k] != s->lo[k]) { sb_putc(o, '-'); put_cp(o, s->hi[k]); }
    }
    sb_putc(o, ']');
}

/* ---- inside a JSON string ---- */

/* What a JSON string cannot hold as itself, ascending; DEL may appear raw,
 * but the schemas' "char" rule (llama.cpp's) takes it only escaped, so "."
 * and negated classes leave it out too. */
static const uint32_t k_json_escaped[][2] = { { 0, 0x1F }, { '"', '"' }, { '\\', '\\' } };
#define N_JSON_ESCAPED 3

static bool json_escaped(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

/* cp as a GBNF literal of its spelling in the output. */
static void put_lit(struct rx *r, uint32_t cp) {
    sb_putc(r->o, '"');
    if (r->json && json_escaped(cp)) {
        static const char short_esc[] = { ['\b'] = 'b', ['\t'] = 't', ['\n'] = 'n', ['\f'] = 'f', ['\r'] = 'r' };
        char esc[8];
        if (cp == '"' || cp == '\\') snprintf(esc, sizeof esc, "\\%c", (char)cp);
        else if (cp < sizeof short_esc && short_esc[cp]) snprintf(esc, sizeof esc, "\\%c", short_esc[cp]);
        else snprintf(esc, sizeof esc, "\\u%04x", cp);
        for (const char *e = esc; *e; e++) put_cp(r->o, (unsigned char)*e);
    } else {
        put_cp(r->o, cp);
    }
    sb_putc(r->o, '"');
}

static bool set_has(const struct cpset *s, uint32_t cp) {
    for (int k = 0; k < s->n; k++)
        if (cp >= s->lo[k] && cp <= s->hi[k]) return true;
    return false;
}

/* s's ranges less the code points JSON escapes, into *plain. */
static bool set_unescaped(struct rx *r, const struct cpset *s, struct cpset *plain) {
    for (int k = 0; k < s->n; k++) {
        uint32_t lo = s->lo[k];
        for (int j = 0; j < N_JSON_ESCAPED && lo <= s->hi[k]; j++) {
            const uint32_t a = k_json_escaped[j][0], b = k_json_escaped[j][1];
            if (b < lo) continue;
            if (a > s->hi[k]) break;
            if (a > lo && !set_add(r, plain, lo, a - 1)) return false;
            lo = b + 1;
        }
        if (lo <= s->hi[k] && !set_add(r, plain, lo, s->hi[k])) return false;
    }
    return true;
}

/* A class as the output spells its members: in plain text the class
 * itself; in a JSON string a positive class is its unescaped members or
 * the escapes of the others, a negated one leaves out everything JSON
 * escapes (it then matches only characters held as themselves). */
static bool write_set(struct rx *r, const struct cpset *s, bool neg) {
    if (!r->json) {
        put_set(r->o, s, neg);
        return true;
    }
    if (neg) {
        struct cpset x = *s;
        for (int j = 0; j < N_JSON_ESCAPED; j++)
            if (!set_add(r, &x, k_json_escaped[j][0], k_json_escaped[j][1])) return false;
        if (!set_add(r, &x, 0x7F, 0x7F)) return false;
        put_set(r->o, &x, true);
        return true;
    }
    struct cpset plain = { .n = 0 };
    if (!set_unescaped(r, s, &plain)) return false;
    int alts = 0;
    sb_putc(r->o, '(');
    if (plain.n) { put_set(r->o, &plain, false); alts++; }
    for (int j = 0; j < N_JSON_ESCAPED; j++)
        for (uint32_t cp = k_json_escaped[j][0]; cp <= k_json_escaped[j][1]; cp++) {
            if (!set_has(s, cp)) continue;
            if (alts++) sb_puts(r->o, " | ");
            put_lit(r, cp);
        }
    sb_putc(r->o, ')');
    return true;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* \xHH, \x{H...}, \uHHHH after the backslash and the letter; r->i is past
 * the letter. */
static bool hex_escape(struct rx *r, char e, uint32_t *cp) {
    uint32_t v = 0;
    if (e == 'x' && peek(r, 0) == '{') {
        r->i++;
        int nd = 0;
        for (int h; (h = hexval(peek(r, 0))) >= 0 && nd < 8; nd++, r->i++) v = v << 4 | (uint32_t)h;
        if (!nd || peek(r, 0) != '}') return rx_fail(r, KVLLM_EINVAL, "\\x{...} needs hex digits and '}'");
        r->i++;
    } else {
        int want = e == 'x' ? 2 : 4;
        for (int k = 0; k < want; k++, r->i++) {
            int h = hexval(peek(r, 0));
            if (h < 0) return rx_fail(r, KVLLM_EINVAL, "\\%c needs %d hex digits", e, want);
            v = v << 4 | (uint32_t)h;
        }
    }
    if (v > RX_MAX_CP || (v >= 0xD800 && v <= 0xDFFF)) return rx_fail(r, KVLLM_EINVAL, "\\%c: not a code point", e);
    *cp = v;
    return true;
}

/* An escape that stands for one code point (r->i at the backslash); a
 * shorthand is the caller's.  Letters and digits without a meaning here
 * are refused: in PCRE2 they are errors or features (\b, \1, \p{...}). */
static bool escape_cp(struct rx *r, uint32_t *cp) {
    char e = peek(r, 1);
    if (!e && r->i + 1 >= r->n) return rx_fail(r, KVLLM_EINVAL, "a trailing '\\'");
    r->i += 2;
    switch (e) {
    case 'n': *cp = '\n'; return true;
    case 't': *cp = '\t'; return true;
    case 'r': *cp = '\r'; return true;
    case 'f': *cp = '\f'; return true;
    case 'v': *cp = '\v'; return true;
    case 'a': *cp = 7; return true;
    case 'e': *cp = 27; return true;
    case 'x': case 'u': return hex_escape(r, e, cp);
    default: break;
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
        r->i -= 2;
        return rx_fail(r, KVLLM_EUNSUPPORTED, "'\\%c' (backreferences, word boundaries, anchors and properties "
                       "are not supported)", e);
    }
    r->i--;
    *cp = next_cp(r);   /* escaped punctuation (or any non-alphanumeric) stands for itself */
    return true;
}

static bool is_shorthand(char e) { return e && strchr("dDwWsS", e); }

/* [...] (r->i at '['). */
static bool rx_class(struct rx *r) {
    size_t open = r->i++;
    bool neg = peek(r, 0) == '^';
    if (neg) r->i++;
    struct cpset s = { .n = 0 };
    bool first = true;
    while (!at_end(r) && (peek(r, 0) != ']' || first)) {
        first = false;
        uint32_t lo;
        if (peek(r, 0) == '[' && (peek(r, 1) == ':' || peek(r, 1) == '=' || peek(r, 1) == '.'))
            return rx_fail(r, KVLLM_EUNSUPPORTED, "POSIX classes ([:alpha:]) inside a class");
        if (peek(r, 0) == '\\' && is_shorthand(peek(r, 1))) {
            if (!set_shorthand(r, &s, peek(r, 1))) return false;
            r->i += 2;
            continue;
        }
        if (peek(r, 0) == '\\') {
            if (peek(r, 1) == 'b') { lo = 8; r->i += 2; }   /* backspace, inside a class */
            else if (!escape_cp(r, &lo)) return false;
        } else {
            lo = next_cp(r);
        }
        uint32_t hi = lo;
        if (peek(r, 0) == '-' && r->i + 1 < r->n && peek(r, 1) != ']') {
            r->i++;
            if (peek(r, 0) == '\\' && is_shorthand(peek(r, 1)))
                return rx_fail(r, KVLLM_EINVAL, "a range that ends in a shorthand class");
            if (peek(r, 0) == '\\') {
                if (!escape_cp(r, &hi)) return false;
            } else {
                hi = next_cp(r);
            }
            if (hi < lo) return rx_fail(r, KVLLM_EINVAL, "a range out of order");
        }
        if (!set_add(r, &s, lo, hi)) return false;
    }
    if (at_end(r)) {
        r->i = open;
        return rx_fail(r, KVLLM_EINVAL, "an unterminated class");
    }
    r->i++;
    if (!s.n) {   /* [^] would be PCRE2's "anything"; [] cannot be written: refuse both */
        r->i = open;
        return rx_fail(r, KVLLM_EINVAL, "an empty class");
    }
    return write_set(r, &s, neg);
}

/* ---- atoms, sequences, alternatives ---- */

static bool rx_alt(struct rx *r, bool *nullable);

/* A group (r->i at '('): (...), (?:...), named (?P<n>...) / (?<n>...). */
static bool rx_group(struct rx *r, bool *nullable) {
    size_t open = r->i++;
    if (peek(r, 0) == '?') {
        if (peek(r, 1) == ':') {
            r->i += 2;
        } else if ((peek(r, 1) == 'P' && peek(r, 2) == '<') || (peek(r, 1) == '<' && peek(r, 2) != '=' && peek(r, 2) != '!')) {
            r->i += peek(r, 1) == 'P' ? 3 : 2;
            while (!at_end(r) && peek(r, 0) != '>') r->i++;
            if (at_end(r)) return rx_fail(r, KVLLM_EINVAL, "an unterminated group name");
            r->i++;
        } else {
            r->i = open;
            return rx_fail(r, KVLLM_EUNSUPPORTED, "'(?%c' (lookaround, flags, atomic groups and conditionals are "
                           "not supported)", peek(r, 2) ? peek(r, 2) : ' ');
        }
    }
    if (++r->depth > RX_MAX_DEPTH) return rx_fail(r, KVLLM_ERANGE, "groups nested deeper than %d", RX_MAX_DEPTH);
    sb_putc(r->o, '(');
    if (!rx_alt(r, nullable)) return false;
    if (peek(r, 0) != ')') {
        r->i = open;
        return rx_fail(r, KVLLM_EINVAL, "an unclosed '('");
    }
    r->i++;
    r->depth--;
    sb_putc(r->o, ')');
    return true;
}

/* One atom; false on error.  *nullable: it can match the empty string. */
static bool rx_atom(struct rx *r, bool *nullable) {
    char ch = peek(r, 0);
    *nullable = false;
    switch (ch) {
    case '(': return rx_group(r, nullable);
    case '[': return rx_class(r);
    case '.': {
        r->i++;
        const struct cpset nl = { .lo = { '\n' }, .hi = { '\n' }, .n = 1 };
        return write_set(r, &nl, true);
    }
    case '^': case '$': return rx_fail(r, KVLLM_EUNSUPPORTED, "an anchor inside the pattern (the whole output "
                                       "matches: '^' may only open it and '$' close it)");
    case '*': case '+': case '?': return rx_fail(r, KVLLM_EINVAL, "a quantifier with nothing before it");
    case '\\':
        if (is_shorthand(peek(r, 1))) {
            struct cpset s = { .n = 0 };
            if (!set_shorthand(r, &s, peek(r, 1))) return false;
            r->i += 2;
            return write_set(r, &s, false);
        }
        break;
    default: break;
    }
    uint32_t cp;
    if (ch == '\\') {
        if (!escape_cp(r, &cp)) return false;
    } else {
        cp = next_cp(r);
    }
    put_lit(r, cp);
    return true;
}

/* {m}, {m,}, {m,n} at r->i: true with the bounds (mx -1: unbounded) and
 * r->i past it; false (r->i unchanged) when the brace is not a quantifier,
 * which PCRE2 then reads as a literal '{'. */
static bool brace_quantifier(struct rx *r, long *mn, long *mx) {
    size_t j = r->i + 1;
    long a = 0, b = -1;
    int da = 0, db = 0;
    for (; j < r->n && r->s[j] >= '0' && r->s[j] <= '9' && da < 9; j++, da++) a = a * 10 + (r->s[j] - '0');
    if (!da) return false;
    if (j < r->n && r->s[j] == ',') {
        j++;
        long v = 0;
        for (; j < r->n && r->s[j] >= '0' && r->s[j] <= '9' && db < 9; j++, db++) v = v * 10 + (r->s[j] - '0');
        if (db) b = v;
    } else {
        b = a;
    }
    if (j >= r->n || r->s[j] != '}') return false;
    *mn = a;
    *mx = b;
    r->i = j + 1;
    return true;
}

static bool is_quantifier(struct rx *r) {
    char q = peek(r, 0);
    if (q == '*' || q == '+' || q == '?') return true;
    long a, b;
    size_t save = r->i;
    bool brace = q == '{' && brace_quantifier(r, &a, &b);
    r->i = save;
    return brace;
}

/* The quantifier after an atom (already written in a group of its own):
 * the GBNF quantifier appended.  *nullable: the atom can be empty, and
 * becomes so when the quantifier allows no repetition.  An unbounded
 * repetition of what can be empty is refused: GBNF's X* is the rule
 * R ::= X R | "", left-recursive when X can be empty (and no rewriting of X
 * into its non-empty part is attempted). */
static bool rx_quantifier(struct rx *r, bool *nullable) {
    char q = peek(r, 0);
    size_t at = r->i;
    long mn = q == '+', mx = q == '?' ? 1 : -1;
    if (q == '{') brace_quantifier(r, &mn, &mx);
    if (*nullable && mx < 0) {
        r->i = at;
        return rx_fail(r, KVLLM_EUNSUPPORTED, "an unbounded repetition of a part that can match the empty string "
                       "(as (a?)*): write the repeated part so that it cannot be empty");
    }
    *nullable = *nullable || mn == 0;
    if (q == '{') {
        if (mn > RX_MAX_REPEAT || mx > RX_MAX_REPEAT)
            return rx_fail(r, KVLLM_ERANGE, "a repetition bound above %d", RX_MAX_REPEAT);
        if (mx >= 0 && mx < mn) return rx_fail(r, KVLLM_EINVAL, "a repetition {%ld,%ld} out of order", mn, mx);
        if (mx < 0) sb_printf(r->o, "{%ld,}", mn);
        else sb_printf(r->o, "{%ld,%ld}", mn, mx);
    } else {
        sb_putc(r->o, q);
        r->i++;
    }
    if (peek(r, 0) == '?') r->i++;   /* lazy: the same strings match in full */
    else if (peek(r, 0) == '+') return rx_fail(r, KVLLM_EUNSUPPORTED, "a possessive quantifier");
    if (is_quantifier(r)) return rx_fail(r, KVLLM_EINVAL, "a quantifier after a quantifier");
    return true;
}

static bool rx_seq(struct rx *r, bool *nullable) {
    sb_putc(r->o, '(');
    bool any = false;
    *nullable = true;
    while (!at_end(r) && peek(r, 0) != '|' && peek(r, 0) != ')') {
        if (peek(r, 0) == '$' && r->i + 1 == r->n && r->depth == 0) {   /* the closing anchor */
            r->i++;
            r->end_anchor = true;
            break;
        }
        sb_puts(r->o, any ? " (" : "(");
        bool na;
        if (!rx_atom(r, &na)) return false;
        sb_putc(r->o, ')');
        if (is_quantifier(r) && !rx_quantifier(r, &na)) return false;
        *nullable = *nullable && na;
        any = true;
    }
    if (!any) sb_puts(r->o, "\"\"");
    sb_putc(r->o, ')');
    return true;
}

static bool rx_alt(struct rx *r, bool *nullable) {
    if (!rx_seq(r, nullable)) return false;
    while (peek(r, 0) == '|') {
        r->i++;
        sb_puts(r->o, " | ");
        bool ns;
        if (!rx_seq(r, &ns)) return false;
        *nullable = *nullable || ns;
    }
    return true;
}

int regex_gbnf_expr(const char *pattern, size_t n, enum regex_target target, struct strbuf *out,
                    struct regex_anchors *anchors, char *err, size_t err_cap) {
    if (err && err_cap) *err = 0;
    struct rx r = { .s = pattern, .n = n, .o = out, .json = target == REGEX_JSON_STRING, .err = err,
                    .err_cap = err_cap };
    anchors->start = anchors->end = false;
    if (!utf8_valid(pattern, n)) {
        rx_fail(&r, KVLLM_EINVAL, "the pattern is not valid UTF-8");
        return r.rc;
    }
    anchors->start = peek(&r, 0) == '^';
    if (anchors->start) r.i++;
    bool nullable;
    bool ok = rx_alt(&r, &nullable);
    if (ok && !at_end(&r)) ok = rx_fail(&r, KVLLM_EINVAL, "an unmatched ')'");
    if (ok && out->oom) ok = rx_fail(&r, KVLLM_ENOMEM, "out of memory");
    anchors->end = r.end_anchor;
    return ok ? 0 : r.rc;
}

static int compile(char *text, struct kvllm_grammar **out, char *err, size_t err_cap) {
    int rc = gbnf_parse(text, out, err, err_cap);
    free(text);
    return rc;
}

int kvllm_grammar_from_regex(const char *pattern, struct kvllm_grammar **out, char *err, size_t err_cap) {
    *out = NULL;
    struct strbuf o = { 0 };
    struct regex_anchors an;   /* the whole output matches either way */
    sb_puts(&o, "root ::= ");
    int rc = regex_gbnf_expr(pattern, strlen(pattern), REGEX_TEXT, &o, &an, err, err_cap);
    sb_putc(&o, '\n');
    if (!rc && o.oom) rc = KVLLM_ENOMEM;
    if (rc) { sb_free(&o); return rc; }
    return compile(sb_take(&o), out, err, err_cap);
}

int kvllm_grammar_from_choices(const char *const *choices, int n, struct kvllm_grammar **out, char *err,
                               size_t err_cap) {
    *out = NULL;
    if (err && err_cap) *err = 0;
    struct rx r = { .err = err, .err_cap = err_cap };
    if (n < 1 || !choices) { rx_fail(&r, KVLLM_EINVAL, "no choices"); return r.rc; }
    struct strbuf o = { 0 };
    sb_puts(&o, "root ::= ");
    for (int k = 0; k < n; k++) {
        struct rx c = { .s = choices[k], .n = strlen(choices[k]) };
        if (!utf8_valid(c.s, c.n)) {
            if (err && err_cap) snprintf(err, err_cap, "choice %d is not valid UTF-8", k);
            sb_free(&o);
            return KVLLM_EINVAL;
        }
        sb_puts(&o, k ? " | \"" : "\"");
        while (!at_end(&c)) put_cp(&o, next_cp(&c));
        sb_putc(&o, '"');
    }
    sb_putc(&o, '\n');
    if (o.oom) { sb_free(&o); return KVLLM_ENOMEM; }
    return compile(sb_take(&o), out, err, err_cap);
}
