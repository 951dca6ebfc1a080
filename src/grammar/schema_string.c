/* schema_string.c — string schemas: minLength / maxLength as a repetition
 * of JSON string characters, a format as a shared primitive, and a pattern
 * (a regex subset) compiled to character-level rules over JSON string text.
 *
 * The pattern compiler is a recursive-descent parser (alternation, sequence,
 * atom + quantifier) that writes GBNF as it reads: groups, classes, ".",
 * the escapes \d \w \s (and negations) and literal code points; anchors are
 * honoured only at the ends, lookarounds, backreferences and named groups
 * are refused with their offset.  A character of the pattern matches that
 * character as the JSON text spells it (a newline is the two bytes "\n"). */
#include "grammar/schema_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- regex (pattern) to GBNF ---- */

struct rx {
    const char *s;
    size_t i, n;
    struct schema_ctx *c;
    const char *path;
    struct strbuf *o;
    int depth;   /* groups open (the parser recurses into each) */
};

static bool rx_fail(struct rx *r, const char *what) {
    schema_fail(r->c, KVLLM_EUNSUPPORTED, r->path, "pattern: %s at offset %zu", what, r->i);
    return false;
}

/* A literal code point of the pattern as it appears in JSON text. */
static void rx_lit(struct rx *r, uint32_t cp) {
    char buf[8];
    size_t n = 0;
    if (cp < 0x80) buf[n++] = (char)cp;
    else if (cp < 0x800) { buf[n++] = (char)(0xC0 | cp >> 6); buf[n++] = (char)(0x80 | (cp & 63)); }
    else if (cp < 0x10000) { buf[n++] = (char)(0xE0 | cp >> 12); buf[n++] = (char)(0x80 | (cp >> 6 & 63)); buf[n++] = (char)(0x80 | (cp & 63)); }
    else { buf[n++] = (char)(0xF0 | cp >> 18); buf[n++] = (char)(0x80 | (cp >> 12 & 63)); buf[n++] = (char)(0x80 | (cp >> 6 & 63)); buf[n++] = (char)(0x80 | (cp & 63)); }
    struct strbuf esc = { 0 };
    schema_put_json_escaped(&esc, buf, n);
    schema_put_literal(r->o, esc.s ? esc.s : "", esc.len);
    sb_free(&esc);
}

static const char k_strchar_plain[] = "[^\"\\\\\\x7F\\x00-\\x1F]";

/* Class escapes \d \w \s as class members, or false. */
static bool rx_class_escape(struct strbuf *o, char e) {
    switch (e) {
    case 'd': sb_puts(o, "0-9"); return true;
    case 'w': sb_puts(o, "a-zA-Z0-9_"); return true;
    case 's': sb_puts(o, " \\t\\n\\r"); return true;
    default: return false;
    }
}

static bool rx_alt(struct rx *r);

static bool rx_escape_cp(char e, uint32_t *cp) {
    switch (e) {
    case 'n': *cp = '\n'; return true;
    case 't': *cp = '\t'; return true;
    case 'r': *cp = '\r'; return true;
    case 'f': *cp = '\f'; return true;
    case 'v': *cp = '\v'; return true;
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) return false;
        *cp = (unsigned char)e;   /* an escaped punctuation character stands for itself */
        return true;
    }
}

/* "(" already read: a (non-capturing) group. */
static bool rx_group(struct rx *r) {
    if (r->s[r->i] == '?') {
        if (r->s[r->i + 1] == ':') r->i += 2;
        else return rx_fail(r, "lookaround or named group");
    }
    if (++r->depth > JS_MAX_DEPTH) return rx_fail(r, "groups nested too deep");
    sb_puts(r->o, "(");
    if (!rx_alt(r)) return false;
    if (r->i >= r->n || r->s[r->i] != ')') return rx_fail(r, "expecting ')'");
    r->depth--;
    r->i++;
    sb_puts(r->o, ")");
    return true;
}

/* One code point of a class (escaped or not) into *cp; `what` names the place for the error. */
static bool rx_class_cp(struct rx *r, uint32_t *cp, const char *what) {
    if (r->s[r->i] == '\\' && r->i + 1 < r->n) {
        char e = r->s[r->i + 1];
        r->i += 2;
        if (!rx_escape_cp(e, cp)) return rx_fail(r, what);
    } else {
        *cp = schema_utf8_next(r->s, &r->i, r->n);
    }
    if (*cp == '"' || *cp == '\\') return rx_fail(r, "'\"' or '\\' in a class");
    return true;
}

/* The members of a class (after "[" or "[^") up to its "]", into cls. */
static bool rx_class_members(struct rx *r, struct strbuf *cls) {
    bool first = true;
    while (r->i < r->n && (r->s[r->i] != ']' || first)) {
        first = false;
        uint32_t cp;
        if (r->s[r->i] == '\\' && r->i + 1 < r->n && rx_class_escape(cls, r->s[r->i + 1])) {
            r->i += 2;
            continue;
        }
        if (!rx_class_cp(r, &cp, "unsupported escape in a class")) return false;
        schema_put_class_cp(cls, cp);
        if (r->s[r->i] == '-' && r->i + 1 < r->n && r->s[r->i + 1] != ']') {
            r->i++;
            uint32_t hi;
            if (!rx_class_cp(r, &hi, "unsupported escape in a range")) return false;
            sb_puts(cls, "-");
            schema_put_class_cp(cls, hi);
        }
    }
    if (r->i >= r->n) return rx_fail(r, "unterminated class");
    r->i++;
    return true;
}

/* "[" already read: a character class. */
static bool rx_class(struct rx *r) {
    bool neg = false;
    if (r->s[r->i] == '^') { neg = true; r->i++; }
    struct strbuf cls = { 0 };
    bool ok = rx_class_members(r, &cls);
    /* inside JSON text a class member is the plain character; a negated class also excludes what a JSON
     * string cannot hold raw */
    if (ok && neg) sb_printf(r->o, "[^%s\"\\\\\\x7F\\x00-\\x1F]", cls.s ? cls.s : "");
    else if (ok) sb_printf(r->o, "[%s]", cls.s ? cls.s : "");
    sb_free(&cls);
    return ok;
}

/* "\" already read (something follows it): an escape outside a class. */
static bool rx_escape(struct rx *r) {
    char e = r->s[r->i++];
    switch (e) {
    case 'd': sb_puts(r->o, "[0-9]"); return true;
    case 'D': sb_puts(r->o, "[^0-9\"\\\\\\x7F\\x00-\\x1F]"); return true;
    case 'w': sb_puts(r->o, "[a-zA-Z0-9_]"); return true;
    case 'W': sb_puts(r->o, "[^a-zA-Z0-9_\"\\\\\\x7F\\x00-\\x1F]"); return true;
    case 's': sb_puts(r->o, "(\" \" | \"\\\\t\" | \"\\\\n\" | \"\\\\r\")"); return true;
    case 'S': sb_puts(r->o, "[^ \"\\\\\\x7F\\x00-\\x1F]"); return true;
    default: {
        uint32_t cp;
        if (!rx_escape_cp(e, &cp)) return rx_fail(r, "unsupported escape");
        rx_lit(r, cp);
        return true;
    }
    }
}

/* One atom into r->o; returns false on error. */
static bool rx_atom(struct rx *r) {
    char ch = r->s[r->i];
    switch (ch) {
    case '(': r->i++; return rx_group(r);
    case '[': r->i++; return rx_class(r);
    case '.': r->i++; sb_puts(r->o, k_strchar_plain); return true;
    case '\\':
        if (r->i + 1 >= r->n) return rx_fail(r, "trailing '\\'");
        r->i++;
        return rx_escape(r);
    case '^': case '$': return rx_fail(r, "an anchor inside the pattern");
    case '*': case '+': case '?': case '{': return rx_fail(r, "a quantifier with nothing before it");
    default: rx_lit(r, schema_utf8_next(r->s, &r->i, r->n)); return true;
    }
}

/* "{m}", "{m,}" or "{m,n}" at r->i ('{') into *mn, *mx (-1: unbounded); r->i moved past it. */
static bool rx_braces(struct rx *r, long *mn, long *mx) {
    size_t j = r->i + 1;
    char *end;
    *mx = -1;
    *mn = strtol(r->s + j, &end, 10);
    if (end == r->s + j) return rx_fail(r, "bad {m,n}");
    j = (size_t)(end - r->s);
    if (r->s[j] == '}') *mx = *mn;
    else if (r->s[j] == ',') {
        j++;
        if (r->s[j] != '}') {
            *mx = strtol(r->s + j, &end, 10);
            if (end == r->s + j) return rx_fail(r, "bad {m,n}");
            j = (size_t)(end - r->s);
        }
        if (r->s[j] != '}') return rx_fail(r, "bad {m,n}");
    } else {
        return rx_fail(r, "bad {m,n}");
    }
    if (*mn > JS_MAX_REPEAT || *mx > JS_MAX_REPEAT || (*mx >= 0 && *mx < *mn)) return rx_fail(r, "bad {m,n}");
    r->i = j + 1;
    return true;
}

/* The quantifier q at r->i applied to the atom written at r->o->s[start..]. */
static bool rx_quantifier(struct rx *r, char q, size_t start) {
    char *atom = strdup(r->o->s + start);
    if (!atom) return rx_fail(r, "out of memory");
    r->o->len = start;
    r->o->s[start] = 0;
    sb_printf(r->o, "(%s)", atom);
    free(atom);
    if (q == '{') {
        long mn, mx;
        if (!rx_braces(r, &mn, &mx)) return false;
        if (mx < 0) sb_printf(r->o, "{%ld,}", mn);
        else sb_printf(r->o, "{%ld,%ld}", mn, mx);
    } else {
        sb_printf(r->o, "%c", q);
        r->i++;
    }
    if (r->i < r->n && (r->s[r->i] == '?' || r->s[r->i] == '+')) r->i++;   /* lazy/possessive: same language */
    if (r->i < r->n && (r->s[r->i] == '*' || r->s[r->i] == '+' || r->s[r->i] == '{'))
        return rx_fail(r, "a quantifier after a quantifier");
    return true;
}

static bool rx_seq(struct rx *r) {
    bool any = false;
    while (r->i < r->n && r->s[r->i] != '|' && r->s[r->i] != ')') {
        if (r->s[r->i] == '$' && r->i + 1 == r->n) break;   /* the end anchor, handled by the caller */
        size_t start = r->o->len;
        if (!rx_atom(r)) return false;
        any = true;
        char q = r->i < r->n ? r->s[r->i] : 0;
        if ((q == '*' || q == '+' || q == '?' || q == '{') && !rx_quantifier(r, q, start)) return false;
        sb_puts(r->o, " ");
    }
    if (!any) sb_puts(r->o, "\"\"");
    return true;
}

static bool rx_alt(struct rx *r) {
    if (!rx_seq(r)) return false;
    while (r->i < r->n && r->s[r->i] == '|') {
        r->i++;
        sb_puts(r->o, " | ");
        if (!rx_seq(r)) return false;
    }
    return true;
}

/* A string matching pattern (a JSON Schema pattern is a search, so an
 * unanchored side is padded with any string characters). */
static const char *pattern_rule(struct schema_ctx *c, const char *pat, const char *hint, const char *path) {
    schema_prim(c, "char");
    schema_prim(c, "space");
    struct strbuf body = { 0 };
    size_t n = strlen(pat), i = 0;
    bool a0 = n > 0 && pat[0] == '^';
    if (a0) i = 1;
    bool a1 = n > i && pat[n - 1] == '$' && (n < 2 || pat[n - 2] != '\\');
    sb_puts(&body, "\"\\\"\" ");
    if (!a0) sb_puts(&body, "char* ");
    sb_puts(&body, "(");
    struct rx r = { pat, i, a1 ? n - 1 : n, c, path, &body, 0 };
    bool ok = rx_alt(&r);
    if (ok && r.i != r.n) ok = rx_fail(&r, "unbalanced ')'");
    sb_puts(&body, ")");
    if (!a1) sb_puts(&body, " char*");
    sb_puts(&body, " \"\\\"\" space");
    const char *name = NULL;
    if (ok && !body.oom) name = schema_rule_add(c, hint, body.s);
    else if (body.oom) schema_fail(c, KVLLM_ENOMEM, path, "out of memory");
    sb_free(&body);
    return name;
}

/* ---- formats and lengths ---- */

static const char *format_rule(struct schema_ctx *c, const char *f, const char *hint, char *path, size_t plen) {
    static const char *const ok[] = { "date", "time", "date-time", "uuid", "email" };
    size_t k = 0;
    while (k < sizeof ok / sizeof *ok && strcmp(f, ok[k])) k++;
    if (k == sizeof ok / sizeof *ok) {
        size_t pl = plen;
        schema_path_push(path, &pl, "%s", ".format");
        schema_fail(c, KVLLM_EUNSUPPORTED, path, "format '%s' (supported: date, time, date-time, uuid, email)", f);
        path[plen] = 0;
        return NULL;
    }
    schema_prim(c, f);
    struct strbuf b = { 0 };
    sb_printf(&b, "\"\\\"\" %s \"\\\"\" space", f);
    const char *name = b.oom ? NULL : schema_rule_add(c, hint, b.s);
    sb_free(&b);
    return name;
}

static const char *length_rule(struct schema_ctx *c, long mn, long mx, const char *hint, const char *path) {
    if (mn > JS_MAX_REPEAT || mx > JS_MAX_REPEAT) {
        schema_fail(c, KVLLM_EUNSUPPORTED, path, "minLength/maxLength above %d", JS_MAX_REPEAT);
        return NULL;
    }
    if (mx >= 0 && mx < mn) { schema_fail(c, KVLLM_EINVAL, path, "maxLength below minLength"); return NULL; }
    schema_prim(c, "char");
    struct strbuf b = { 0 };
    sb_puts(&b, "\"\\\"\" ");
    schema_put_repeat(&b, "char", mn, mx);
    sb_puts(&b, " \"\\\"\" space");
    const char *name = b.oom ? NULL : schema_rule_add(c, hint, b.s);
    sb_free(&b);
    return name;
}

const char *schema_string_rule(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen) {
    json_object *pat = NULL, *fmt = NULL;
    json_object_object_get_ex(s, "pattern", &pat);
    json_object_object_get_ex(s, "format", &fmt);
    long mn = 0, mx = -1;
    bool has_len = schema_get_count(c, s, "minLength", &mn, path);
    has_len |= schema_get_count(c, s, "maxLength", &mx, path);
    if (c->rc) return NULL;
    if ((pat || fmt) && has_len) {
        schema_fail(c, KVLLM_EUNSUPPORTED, path, "minLength/maxLength together with pattern or format");
        return NULL;
    }
    if (pat && fmt) { schema_fail(c, KVLLM_EUNSUPPORTED, path, "pattern together with format"); return NULL; }
    if (pat) {
        if (!json_object_is_type(pat, json_type_string)) {
            schema_fail(c, KVLLM_EINVAL, path, "'pattern' must be a string");
            return NULL;
        }
        size_t pl = plen;
        schema_path_push(path, &pl, "%s", ".pattern");
        const char *r = pattern_rule(c, json_object_get_string(pat), hint, path);
        path[plen] = 0;
        return r;
    }
    schema_prim(c, "space");
    if (fmt) return format_rule(c, json_object_get_string(fmt), hint, path, plen);
    if (!has_len) return schema_prim(c, "string");
    return length_rule(c, mn, mx, hint, path);
}
