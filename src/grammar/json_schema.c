/* json_schema.c — a JSON Schema compiled to GBNF, then parsed like any
 * GBNF grammar (kvllm grammar --print-gbnf shows the text).
 *
 * Model of the world: every (sub)schema becomes one rule, named after its
 * JSON path; primitives (string, number, space, ...) are shared rules.  The
 * shapes follow llama.cpp's json-schema-to-grammar, with its bounded
 * whitespace (`space` is nothing, one space, or a newline and up to 20
 * spaces/tabs) and bounded number digits, so a model cannot spin forever:
 *   object   "{" space kv ("," space kv)* "}" space, properties in the order
 *            the schema lists them, each optional one skippable; extra
 *            properties (additionalProperties true / a schema, or absent
 *            outside strict mode) after them, with keys other than the
 *            declared ones;
 *   array    "[" space (item ("," space item){min-1,max-1})? "]" space;
 *   string   minLength / maxLength as a repetition of JSON string chars,
 *            pattern (a regex subset) and format as character-level rules;
 *   numbers  integer bounds exactly (digit-range rules); number bounds when
 *            the bounds are integers (an exponent is then not allowed).
 * Keywords the compiler does not honour are refused with their JSON path
 * (KVLLM_EUNSUPPORTED), never ignored; annotations (title, description,
 * default, examples, ...) are accepted. */
#include "grammar/grammar_internal.h"
#include "core/core.h"

#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JS_MAX_DEPTH 64
#define JS_MAX_REPEAT 1000   /* largest minItems/maxItems/minLength/maxLength expanded */
#define JS_INT_DIGITS 16     /* an unbounded integer part has at most this many digits (as llama.cpp) */
#define JS_MAX_GBNF (16 << 20)   /* GBNF text one schema may compile to (the compile's budget) */
#define JS_MAX_KEY 1024      /* bytes of a property name beside additional properties (a rule per byte) */

/* ---- text ---- */

struct sb {
    char *s;
    size_t n, cap;
    bool oom;
};

static void sb_addn(struct sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) { b->oom = true; return; }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_add(struct sb *b, const char *s) { sb_addn(b, s, strlen(s)); }

__attribute__((format(printf, 2, 3)))
static void sb_addf(struct sb *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) { sb_addn(b, tmp, (size_t)n); return; }
    char *big = malloc((size_t)n + 1);
    if (!big) { b->oom = true; return; }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_addn(b, big, (size_t)n);
    free(big);
}

/* A GBNF string literal of the bytes s[0..n). */
static void sb_literal(struct sb *b, const char *s, size_t n) {
    sb_add(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') sb_add(b, "\\\"");
        else if (c == '\\') sb_add(b, "\\\\");
        else if (c == '\n') sb_add(b, "\\n");
        else if (c == '\t') sb_add(b, "\\t");
        else if (c == '\r') sb_add(b, "\\r");
        else if (c < 0x20 || c == 0x7F) sb_addf(b, "\\x%02X", c);
        else sb_addn(b, (const char *)&c, 1);
    }
    sb_add(b, "\"");
}

/* s as it reads inside a JSON string (escaped), into out. */
static void json_escape(struct sb *out, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': sb_add(out, "\\\""); break;
        case '\\': sb_add(out, "\\\\"); break;
        case '\n': sb_add(out, "\\n"); break;
        case '\t': sb_add(out, "\\t"); break;
        case '\r': sb_add(out, "\\r"); break;
        case '\b': sb_add(out, "\\b"); break;
        case '\f': sb_add(out, "\\f"); break;
        default:
            if (c < 0x20) sb_addf(out, "\\u%04x", c);
            else sb_addn(out, (const char *)&c, 1);
        }
    }
}

/* ---- the compiler ---- */

struct jrule {
    char *name, *body;
    int next_suffix;   /* the next "-N" to try for another rule of this name */
};

struct jref {
    char *ref, *rule;
};

struct jctx {
    struct jrule *rules;
    int n_rules, cap_rules;
    struct gnames names;   /* rule name -> index */
    size_t n_text;         /* GBNF bytes made so far (the budget: JS_MAX_GBNF) */
    struct jref *refs;
    int n_refs, cap_refs;
    struct gnames ref_names;   /* $ref -> index in refs */
    json_object *root;
    bool strict;
    int rc;
    char *err;
    size_t err_cap;
    int depth;
};

__attribute__((format(printf, 4, 5)))
static void jfail(struct jctx *c, int rc, const char *path, const char *fmt, ...) {
    if (c->rc) return;
    c->rc = rc;
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->err && c->err_cap) snprintf(c->err, c->err_cap, "%s: %s", path, msg);
    LOG_ERR("json schema: %s: %s", path, msg);
}

static struct jrule *rule_get(struct jctx *c, const char *name) {
    int64_t i = name ? gnames_get(&c->names, name, strlen(name)) : -1;
    return i < 0 ? NULL : &c->rules[i];
}

static const char *rule_find(struct jctx *c, const char *name) {
    const struct jrule *r = rule_get(c, name);
    return r ? r->body : NULL;
}

/* The table's copy of a rule name (names handed out stay valid while the table lives). */
static const char *rule_find_name(struct jctx *c, const char *name) {
    const struct jrule *r = rule_get(c, name);
    return r ? r->name : NULL;
}

/* A name not yet taken: base, or base-N with N counted on from the last
 * rule of that base (so many rules of one base cost no search each). */
static void unique_name(struct jctx *c, const char *base, char *name, size_t cap) {
    struct jrule *first = rule_get(c, base);
    snprintf(name, cap, "%s", base);
    if (!first) return;
    int i = first->next_suffix ? first->next_suffix : 1;
    do snprintf(name, cap, "%s-%d", base, i++);
    while (rule_get(c, name));
    first->next_suffix = i;
}

/* Add a rule; its name is `hint` made GBNF-safe and unique.  Returns the
 * name (owned by the table) or NULL (c->rc set). */
static const char *rule_add(struct jctx *c, const char *hint, const char *body) {
    if (c->rc) return NULL;
    char base[120];
    size_t k = 0;
    for (const char *p = hint; *p && k < sizeof base - 12; p++) {
        char ch = *p;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        base[k++] = ok ? ch : '-';
    }
    if (!k) base[k++] = 'r';
    base[k] = 0;
    char name[140];
    unique_name(c, base, name, sizeof name);
    c->n_text += strlen(name) + (body ? strlen(body) : 0) + 6;
    if (c->n_text > JS_MAX_GBNF || (uint32_t)c->n_rules >= GRAMMAR_MAX_RULES) {
        jfail(c, KVLLM_ERANGE, "$", "the schema is too large: its grammar would pass %u rules or %d MiB",
              GRAMMAR_MAX_RULES, JS_MAX_GBNF >> 20);
        return NULL;
    }
    if (c->n_rules == c->cap_rules) {
        int cap = c->cap_rules ? c->cap_rules * 2 : 32;
        struct jrule *r = realloc(c->rules, (size_t)cap * sizeof *r);
        if (!r) { jfail(c, KVLLM_ENOMEM, "$", "out of memory"); return NULL; }
        c->rules = r;
        c->cap_rules = cap;
    }
    struct jrule *r = &c->rules[c->n_rules];
    r->name = strdup(name);
    r->body = strdup(body ? body : "");
    r->next_suffix = 0;
    if (!r->name || !r->body || !gnames_put(&c->names, r->name, strlen(r->name), (uint32_t)c->n_rules)) {
        free(r->name);
        free(r->body);
        jfail(c, KVLLM_ENOMEM, "$", "out of memory");
        return NULL;
    }
    c->n_rules++;
    return r->name;
}

static void rule_set_body(struct jctx *c, const char *name, const char *body) {
    struct jrule *r = rule_get(c, name);
    if (!r) return;
    char *d = strdup(body);
    if (!d) { jfail(c, KVLLM_ENOMEM, "$", "out of memory"); return; }
    free(r->body);
    r->body = d;
}

/* Shared primitives, added on first use. */
static const struct { const char *name, *body, *deps; } k_prims[] = {
    { "space", "| \" \" | \"\\n\" [ \\t]{0,20}", "" },
    { "char", "[^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})", "" },
    { "string", "\"\\\"\" char* \"\\\"\" space", "char space" },
    { "integral-part", "[0] | [1-9] [0-9]{0,15}", "" },
    { "decimal-part", "[0-9]{1,16}", "" },
    { "number", "(\"-\"? integral-part) (\".\" decimal-part)? ([eE] [-+]? integral-part)? space",
      "integral-part decimal-part space" },
    { "integer", "(\"-\"? integral-part) space", "integral-part space" },
    { "boolean", "(\"true\" | \"false\") space", "space" },
    { "null", "\"null\" space", "space" },
    { "value", "object | array | string | number | boolean | null", "object array string number boolean null" },
    { "object", "\"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? \"}\" space",
      "string space value" },
    { "array", "\"[\" space ( value (\",\" space value)* )? \"]\" space", "space value" },
    { "hex", "[0-9a-fA-F]", "" },
    { "date", "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1] )", "" },
    { "time", "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? "
              "( [zZ] | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )", "" },
    { "date-time", "date [Tt] time", "date time" },
    { "uuid", "hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}", "hex" },
    { "email", "[a-zA-Z0-9._%+-]+ \"@\" [a-zA-Z0-9-]+ ( \".\" [a-zA-Z0-9-]+ )+", "" },
};

static const char *prim(struct jctx *c, const char *name) {
    for (size_t i = 0; i < sizeof k_prims / sizeof *k_prims; i++) {
        if (strcmp(k_prims[i].name, name)) continue;
        if (rule_find(c, name)) return name;
        rule_add(c, name, k_prims[i].body);
        /* dependencies */
        char deps[160];
        snprintf(deps, sizeof deps, "%s", k_prims[i].deps);
        for (char *save = NULL, *d = strtok_r(deps, " ", &save); d; d = strtok_r(NULL, " ", &save)) prim(c, d);
        return name;
    }
    KV_ASSERT(!"unknown primitive");
    return NULL;
}

/* ---- integer ranges ---- */

/* Decimal strings (no leading zeros) of [a, b], a and b with the same number
 * of digits, as a GBNF expression. */
static void range_same_len(struct sb *o, const char *a, const char *b, size_t n) {
    if (n == 0) return;
    if (n == 1) {
        if (a[0] == b[0]) sb_addf(o, "[%c]", a[0]);
        else sb_addf(o, "[%c-%c]", a[0], b[0]);
        return;
    }
    if (a[0] == b[0]) {
        sb_addf(o, "[%c] (", a[0]);
        range_same_len(o, a + 1, b + 1, n - 1);
        sb_add(o, ")");
        return;
    }
    bool a_zeros = true, b_nines = true;
    for (size_t i = 1; i < n; i++) {
        a_zeros &= a[i] == '0';
        b_nines &= b[i] == '9';
    }
    char lo = a[0], hi = b[0];
    bool first = true;
    if (!a_zeros) {
        char nines[32];
        memset(nines, '9', n - 1);
        sb_addf(o, "[%c] (", a[0]);
        range_same_len(o, a + 1, nines, n - 1);
        sb_add(o, ")");
        lo++;
        first = false;
    }
    char mid_hi = b_nines ? hi : (char)(hi - 1);
    if (lo <= mid_hi) {
        sb_addf(o, "%s[%c-%c] [0-9]{%zu}", first ? "" : " | ", lo, mid_hi, n - 1);
        first = false;
    }
    if (!b_nines) {
        char zeros[32];
        memset(zeros, '0', n - 1);
        sb_addf(o, "%s[%c] (", first ? "" : " | ", hi);
        range_same_len(o, zeros, b + 1, n - 1);
        sb_add(o, ")");
    }
}

/* Non-negative integers lo..hi (hi < 0: up to JS_INT_DIGITS digits), canonical decimal. */
static void range_nonneg(struct sb *o, long long lo, long long hi) {
    long long cap = 9999999999999999LL;   /* JS_INT_DIGITS nines */
    if (hi < 0 || hi > cap) hi = cap;
    bool first = true;
    long long p10 = 1;
    for (int d = 1; d <= JS_INT_DIGITS; d++, p10 *= 10) {
        long long dlo = d == 1 ? 0 : p10, dhi = p10 * 10 - 1;
        if (dlo < lo) dlo = lo;
        if (dhi > hi) dhi = hi;
        if (dlo > dhi) continue;
        char a[32], b[32];
        snprintf(a, sizeof a, "%lld", dlo);
        snprintf(b, sizeof b, "%lld", dhi);
        sb_add(o, first ? "(" : " | (");
        range_same_len(o, a, b, strlen(a));
        sb_add(o, ")");
        first = false;
    }
    if (first) sb_add(o, "[^\\x00-\\U0010FFFF]");   /* empty range: matches nothing */
}

/* Integers in [lo, hi]; has_lo / has_hi false: unbounded on that side. */
static void range_int(struct sb *o, bool has_lo, long long lo, bool has_hi, long long hi) {
    bool first = true;
    if (!has_lo || lo < 0) {   /* negative part: "-" magnitude in [max(1, -hi), -lo] */
        long long mlo = has_hi ? (hi < 0 ? -hi : 1) : 1, mhi = has_lo ? -lo : -1;
        if (!(has_hi && hi >= 0 && mlo > 1)) {
            sb_add(o, "\"-\" (");
            range_nonneg(o, mlo < 1 ? 1 : mlo, mhi);
            sb_add(o, ")");
            first = false;
        } else {
            sb_add(o, "\"-\" (");
            range_nonneg(o, mlo, mhi);
            sb_add(o, ")");
            first = false;
        }
    }
    if (!has_hi || hi >= 0) {
        sb_add(o, first ? "(" : " | (");
        range_nonneg(o, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
        sb_add(o, ")");
    }
}

/* ---- schema walking ---- */

static const char *visit(struct jctx *c, json_object *s, const char *hint, char *path, size_t path_len);

static void path_push(char *path, size_t *len, const char *fmt, const char *arg) {
    int n = snprintf(path + *len, 512 - *len, fmt, arg);
    if (n > 0) *len += (size_t)n < 512 - *len ? (size_t)n : 512 - *len - 1;
}

static bool is_annotation(const char *k) {
    static const char *const ann[] = { "title", "description", "$schema", "$id", "$comment", "examples", "default",
                                       "deprecated", "readOnly", "writeOnly", "$defs", "definitions" };
    for (size_t i = 0; i < sizeof ann / sizeof *ann; i++)
        if (!strcmp(k, ann[i])) return true;
    return false;
}

static bool get_count(struct jctx *c, json_object *s, const char *key, long *out, const char *path) {
    json_object *v;
    if (!json_object_object_get_ex(s, key, &v)) return false;
    if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0) {
        jfail(c, KVLLM_EINVAL, path, "'%s' must be a non-negative integer", key);
        return false;
    }
    int64_t x = json_object_get_int64(v);
    *out = x > 1000000 ? 1000000 : (long)x;
    return true;
}

/* "X{m,n}" of an expression (n < 0: unbounded). */
static void rep_expr(struct sb *o, const char *x, long mn, long mx) {
    if (mx < 0) sb_addf(o, "%s{%ld,}", x, mn);
    else if (mn == mx) sb_addf(o, "%s{%ld}", x, mn);
    else sb_addf(o, "%s{%ld,%ld}", x, mn, mx);
}

/* ---- regex (pattern) to GBNF, over JSON string text ---- */

struct rx {
    const char *s;
    size_t i, n;
    struct jctx *c;
    const char *path;
    struct sb *o;
    int depth;   /* groups open (the parser recurses into each) */
};

static bool rx_fail(struct rx *r, const char *what) {
    jfail(r->c, KVLLM_EUNSUPPORTED, r->path, "pattern: %s at offset %zu", what, r->i);
    return false;
}

/* A code point as a GBNF class member (escaped). */
static void class_cp(struct sb *o, uint32_t cp) {
    if (cp == '\\' || cp == ']' || cp == '[' || cp == '^' || cp == '-' || cp == '"' || cp < 0x20 || cp == 0x7F)
        sb_addf(o, cp < 0x100 ? "\\x%02X" : "\\u%04X", cp);
    else if (cp < 0x80) sb_addf(o, "%c", (char)cp);
    else sb_addf(o, cp < 0x10000 ? "\\u%04X" : "\\U%08X", cp);
}

static uint32_t rx_utf8(struct rx *r) {
    unsigned char c0 = (unsigned char)r->s[r->i++];
    if (c0 < 0x80) return c0;
    int extra = c0 >= 0xF0 ? 3 : c0 >= 0xE0 ? 2 : 1;
    uint32_t cp = c0 & (0x3Fu >> extra);
    for (int k = 0; k < extra && r->i < r->n; k++) cp = (cp << 6) | ((unsigned char)r->s[r->i++] & 0x3Fu);
    return cp;
}

/* A literal code point of the pattern as it appears in JSON text. */
static void rx_lit(struct rx *r, uint32_t cp) {
    char buf[8];
    size_t n = 0;
    if (cp < 0x80) buf[n++] = (char)cp;
    else if (cp < 0x800) { buf[n++] = (char)(0xC0 | cp >> 6); buf[n++] = (char)(0x80 | (cp & 63)); }
    else if (cp < 0x10000) { buf[n++] = (char)(0xE0 | cp >> 12); buf[n++] = (char)(0x80 | (cp >> 6 & 63)); buf[n++] = (char)(0x80 | (cp & 63)); }
    else { buf[n++] = (char)(0xF0 | cp >> 18); buf[n++] = (char)(0x80 | (cp >> 12 & 63)); buf[n++] = (char)(0x80 | (cp >> 6 & 63)); buf[n++] = (char)(0x80 | (cp & 63)); }
    struct sb esc = { 0 };
    json_escape(&esc, buf, n);
    sb_literal(r->o, esc.s ? esc.s : "", esc.n);
    free(esc.s);
}

static const char k_strchar_plain[] = "[^\"\\\\\\x7F\\x00-\\x1F]";

/* Class escapes \d \w \s (and negations) as class members, or false. */
static bool rx_class_escape(struct sb *o, char e, bool *negated_only) {
    *negated_only = false;
    switch (e) {
    case 'd': sb_add(o, "0-9"); return true;
    case 'w': sb_add(o, "a-zA-Z0-9_"); return true;
    case 's': sb_add(o, " \\t\\n\\r"); return true;
    default: return false;
    }
}

static bool rx_alt(struct rx *r);

static bool rx_escape_cp(struct rx *r, char e, uint32_t *cp) {
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

/* One atom into r->o; returns false on error. */
static bool rx_atom(struct rx *r) {
    char ch = r->s[r->i];
    if (ch == '(') {
        r->i++;
        if (r->s[r->i] == '?') {
            if (r->s[r->i + 1] == ':') r->i += 2;
            else return rx_fail(r, "lookaround or named group");
        }
        if (++r->depth > JS_MAX_DEPTH) return rx_fail(r, "groups nested too deep");
        sb_add(r->o, "(");
        if (!rx_alt(r)) return false;
        if (r->i >= r->n || r->s[r->i] != ')') return rx_fail(r, "expecting ')'");
        r->depth--;
        r->i++;
        sb_add(r->o, ")");
        return true;
    }
    if (ch == '[') {
        r->i++;
        bool neg = false;
        if (r->s[r->i] == '^') { neg = true; r->i++; }
        struct sb cls = { 0 };
        bool first = true;
        while (r->i < r->n && (r->s[r->i] != ']' || first)) {
            first = false;
            uint32_t cp;
            if (r->s[r->i] == '\\' && r->i + 1 < r->n) {
                char e = r->s[r->i + 1];
                bool nonly;
                r->i += 2;
                if (rx_class_escape(&cls, e, &nonly)) continue;
                if (!rx_escape_cp(r, e, &cp)) { free(cls.s); return rx_fail(r, "unsupported escape in a class"); }
            } else {
                cp = rx_utf8(r);
            }
            if (cp == '"' || cp == '\\') { free(cls.s); return rx_fail(r, "'\"' or '\\' in a class"); }
            class_cp(&cls, cp);
            if (r->s[r->i] == '-' && r->i + 1 < r->n && r->s[r->i + 1] != ']') {
                r->i++;
                uint32_t hi;
                if (r->s[r->i] == '\\' && r->i + 1 < r->n) {
                    char e = r->s[r->i + 1];
                    r->i += 2;
                    if (!rx_escape_cp(r, e, &hi)) { free(cls.s); return rx_fail(r, "unsupported escape in a range"); }
                } else {
                    hi = rx_utf8(r);
                }
                if (hi == '"' || hi == '\\') { free(cls.s); return rx_fail(r, "'\"' or '\\' in a class"); }
                sb_add(&cls, "-");
                class_cp(&cls, hi);
            }
        }
        if (r->i >= r->n) { free(cls.s); return rx_fail(r, "unterminated class"); }
        r->i++;
        /* inside JSON text a class member is the plain character; a negated class also excludes what a JSON
         * string cannot hold raw */
        if (neg) sb_addf(r->o, "[^%s\"\\\\\\x7F\\x00-\\x1F]", cls.s ? cls.s : "");
        else sb_addf(r->o, "[%s]", cls.s ? cls.s : "");
        free(cls.s);
        return true;
    }
    if (ch == '.') {
        r->i++;
        sb_add(r->o, k_strchar_plain);
        return true;
    }
    if (ch == '\\') {
        if (r->i + 1 >= r->n) return rx_fail(r, "trailing '\\'");
        char e = r->s[r->i + 1];
        r->i += 2;
        switch (e) {
        case 'd': sb_add(r->o, "[0-9]"); return true;
        case 'D': sb_add(r->o, "[^0-9\"\\\\\\x7F\\x00-\\x1F]"); return true;
        case 'w': sb_add(r->o, "[a-zA-Z0-9_]"); return true;
        case 'W': sb_add(r->o, "[^a-zA-Z0-9_\"\\\\\\x7F\\x00-\\x1F]"); return true;
        case 's': sb_add(r->o, "(\" \" | \"\\\\t\" | \"\\\\n\" | \"\\\\r\")"); return true;
        case 'S': sb_add(r->o, "[^ \"\\\\\\x7F\\x00-\\x1F]"); return true;
        default: {
            uint32_t cp;
            if (!rx_escape_cp(r, e, &cp)) return rx_fail(r, "unsupported escape");
            rx_lit(r, cp);
            return true;
        }
        }
    }
    if (ch == '^' || ch == '$') return rx_fail(r, "an anchor inside the pattern");
    if (ch == '*' || ch == '+' || ch == '?' || ch == '{') return rx_fail(r, "a quantifier with nothing before it");
    rx_lit(r, rx_utf8(r));
    return true;
}

static bool rx_seq(struct rx *r) {
    bool any = false;
    while (r->i < r->n && r->s[r->i] != '|' && r->s[r->i] != ')') {
        if (r->s[r->i] == '$' && r->i + 1 == r->n) break;   /* the end anchor, handled by the caller */
        size_t start = r->o->n;
        if (!rx_atom(r)) return false;
        any = true;
        /* quantifier */
        char q = r->i < r->n ? r->s[r->i] : 0;
        if (q == '*' || q == '+' || q == '?' || q == '{') {
            char *atom = strdup(r->o->s + start);
            if (!atom) return rx_fail(r, "out of memory");
            r->o->n = start;
            r->o->s[start] = 0;
            sb_add(r->o, "(");
            sb_add(r->o, atom);
            sb_add(r->o, ")");
            free(atom);
            if (q == '{') {
                long mn = 0, mx = -1;
                size_t j = r->i + 1;
                char *end;
                mn = strtol(r->s + j, &end, 10);
                if (end == r->s + j) return rx_fail(r, "bad {m,n}");
                j = (size_t)(end - r->s);
                if (r->s[j] == '}') mx = mn;
                else if (r->s[j] == ',') {
                    j++;
                    if (r->s[j] != '}') {
                        mx = strtol(r->s + j, &end, 10);
                        if (end == r->s + j) return rx_fail(r, "bad {m,n}");
                        j = (size_t)(end - r->s);
                    }
                    if (r->s[j] != '}') return rx_fail(r, "bad {m,n}");
                } else {
                    return rx_fail(r, "bad {m,n}");
                }
                if (mn > JS_MAX_REPEAT || mx > JS_MAX_REPEAT || (mx >= 0 && mx < mn)) return rx_fail(r, "bad {m,n}");
                r->i = j + 1;
                if (mx < 0) sb_addf(r->o, "{%ld,}", mn);
                else sb_addf(r->o, "{%ld,%ld}", mn, mx);
            } else {
                sb_addf(r->o, "%c", q);
                r->i++;
            }
            if (r->i < r->n && (r->s[r->i] == '?' || r->s[r->i] == '+')) r->i++;   /* lazy/possessive: same language */
            if (r->i < r->n && (r->s[r->i] == '*' || r->s[r->i] == '+' || r->s[r->i] == '{'))
                return rx_fail(r, "a quantifier after a quantifier");
        }
        sb_add(r->o, " ");
    }
    if (!any) sb_add(r->o, "\"\"");
    return true;
}

static bool rx_alt(struct rx *r) {
    if (!rx_seq(r)) return false;
    while (r->i < r->n && r->s[r->i] == '|') {
        r->i++;
        sb_add(r->o, " | ");
        if (!rx_seq(r)) return false;
    }
    return true;
}

/* A string matching pattern (a JSON Schema pattern is a search, so an
 * unanchored side is padded with any string characters). */
static const char *pattern_rule(struct jctx *c, const char *pat, const char *hint, const char *path) {
    prim(c, "char");
    prim(c, "space");
    struct sb body = { 0 };
    size_t n = strlen(pat), i = 0;
    bool a0 = n > 0 && pat[0] == '^';
    if (a0) i = 1;
    bool a1 = n > i && pat[n - 1] == '$' && (n < 2 || pat[n - 2] != '\\');
    sb_add(&body, "\"\\\"\" ");
    if (!a0) sb_add(&body, "char* ");
    sb_add(&body, "(");
    struct rx r = { pat, i, a1 ? n - 1 : n, c, path, &body, 0 };
    bool ok = rx_alt(&r);
    if (ok && r.i != r.n) ok = rx_fail(&r, "unbalanced ')'");
    sb_add(&body, ")");
    if (!a1) sb_add(&body, " char*");
    sb_add(&body, " \"\\\"\" space");
    const char *name = NULL;
    if (ok && !body.oom) name = rule_add(c, hint, body.s);
    else if (body.oom) jfail(c, KVLLM_ENOMEM, path, "out of memory");
    free(body.s);
    return name;
}

/* ---- keys other than a set (for additional properties) ---- */

static int cmp_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Rule for the rest of a key whose first `at` bytes are those of the
 * declared keys keys[lo..hi) (sorted bytewise, so a key that ends here
 * comes first and each next character's keys are a run): end here unless a
 * declared key ends here; or a next character of theirs and the rest; or
 * any other character and then anything.  One rule per trie node, each key
 * byte visited once per depth; the recursion is as deep as the longest key
 * (JS_MAX_KEY). */
static const char *not_keys_rule(struct jctx *c, const char *const *keys, size_t lo, size_t hi, size_t at,
                                 const char *hint) {
    struct sb b = { 0 }, seen = { 0 };
    size_t i = lo;
    if (i < hi && !keys[i][at]) i++;
    bool first = i > lo;
    if (!first) sb_add(&b, "\"\"");
    while (i < hi && !c->rc) {
        struct rx r = { keys[i] + at, 0, strlen(keys[i] + at), NULL, NULL, NULL, 0 };
        const uint32_t cp = rx_utf8(&r);
        size_t j = i + 1;
        while (j < hi && !strncmp(keys[j] + at, keys[i] + at, r.i)) j++;
        const char *sub = not_keys_rule(c, keys, i, j, at + r.i, hint);
        if (!sub) break;
        sb_add(&b, first ? "" : " | ");
        first = false;
        sb_add(&b, "[");
        class_cp(&b, cp);
        sb_addf(&b, "] %s", sub);
        class_cp(&seen, cp);
        i = j;
    }
    sb_add(&b, first ? "" : " | ");
    sb_addf(&b, "[^\"\\\\\\x7F\\x00-\\x1F%s] char* | [\\\\] ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) char*",
            seen.s ? seen.s : "");
    const char *name = NULL;
    if (b.oom || seen.oom) jfail(c, KVLLM_ENOMEM, "$", "out of memory");
    else if (!c->rc) name = rule_add(c, hint, b.s);
    free(b.s);
    free(seen.s);
    return name;
}

/* The rule of keys other than keys[0..n) (reordered), or NULL (c->rc set). */
static const char *extra_key_rule(struct jctx *c, const char **keys, int n, const char *hint, const char *path) {
    for (int k = 0; k < n; k++)
        if (strlen(keys[k]) > JS_MAX_KEY) {
            jfail(c, KVLLM_EUNSUPPORTED, path, "a property name longer than %d bytes beside additional properties",
                  JS_MAX_KEY);
            return NULL;
        }
    qsort(keys, (size_t)n, sizeof *keys, cmp_key);
    prim(c, "char");
    return not_keys_rule(c, keys, 0, (size_t)n, 0, hint);
}

/* ---- types ---- */

/* Refused before anything is built: an object whose optional properties
 * (and the additional ones) could each come next is wider than the matcher
 * follows (the GBNF parser would refuse it, after the whole compile). */
static bool object_fits(struct jctx *c, const bool *required, int n, bool allow_extra, const char *path) {
    int n_opt = allow_extra;
    for (int j = 0; j < n; j++) n_opt += !required[j];
    if (n_opt <= GRAMMAR_MAX_WIDTH) return true;
    jfail(c, KVLLM_ERANGE, path, "the schema is too large: %d optional properties%s, the matcher follows at most %u "
          "at once (make some required, or split the object)", n_opt - allow_extra,
          allow_extra ? " and additional ones" : "", GRAMMAR_MAX_WIDTH);
    return false;
}

/* required[j] for each name of the array req that is keys[j]; a name that
 * is not a key is refused.  0 or -1 (c->rc set). */
static int mark_required(struct jctx *c, json_object *req, const char *const *keys, int n, bool *required,
                         const char *path) {
    struct gnames index = { 0 };
    for (int j = 0; j < n; j++)
        if (!gnames_put(&index, keys[j], strlen(keys[j]), (uint32_t)j)) {
            gnames_free(&index);
            jfail(c, KVLLM_ENOMEM, path, "out of memory");
            return -1;
        }
    for (size_t k = 0; k < json_object_array_length(req) && !c->rc; k++) {
        json_object *r = json_object_array_get_idx(req, k);
        const char *name = json_object_get_string(r);
        int64_t j = json_object_is_type(r, json_type_string) ? gnames_get(&index, name, strlen(name)) : -1;
        if (j < 0) jfail(c, KVLLM_EUNSUPPORTED, path, "required property '%s' is not in 'properties'", name ? name : "?");
        else required[j] = true;
    }
    gnames_free(&index);
    return c->rc ? -1 : 0;
}

static const char *object_rule(struct jctx *c, json_object *s, const char *hint, char *path, size_t plen) {
    json_object *props = NULL, *req = NULL, *addl = NULL;
    json_object_object_get_ex(s, "properties", &props);
    json_object_object_get_ex(s, "required", &req);
    bool has_addl = json_object_object_get_ex(s, "additionalProperties", &addl);
    if (props && !json_object_is_type(props, json_type_object)) {
        jfail(c, KVLLM_EINVAL, path, "'properties' must be an object");
        return NULL;
    }
    if (req && !json_object_is_type(req, json_type_array)) {
        jfail(c, KVLLM_EINVAL, path, "'required' must be an array");
        return NULL;
    }
    int n = props ? json_object_object_length(props) : 0;
    /* kv rules */
    const char **kv = calloc((size_t)n + 1, sizeof *kv);
    bool *required = calloc((size_t)n + 1, sizeof *required);
    const char **keys = calloc((size_t)n + 1, sizeof *keys);
    if (!kv || !required || !keys) {
        free(kv); free(required); free(keys);
        jfail(c, KVLLM_ENOMEM, path, "out of memory");
        return NULL;
    }
    prim(c, "space");
    int i = 0;
    if (props) {
        json_object_object_foreach(props, key, val) {
            (void)val;
            keys[i++] = key;
        }
    }
    bool allow_extra = has_addl ? !(json_object_is_type(addl, json_type_boolean) && !json_object_get_boolean(addl))
                                : !c->strict;
    if ((req && mark_required(c, req, keys, n, required, path)) || !object_fits(c, required, n, allow_extra, path)) {
        free(kv); free(required); free(keys);
        return NULL;
    }
    i = 0;
    if (props) {
        json_object_object_foreach(props, key, val) {
            size_t pl = plen;
            path_push(path, &pl, ".properties.%s", key);
            char h[160];
            snprintf(h, sizeof h, "%.90s-%.40s", hint, key);
            const char *vref = visit(c, val, h, path, pl);
            path[plen] = 0;
            if (!vref) break;
            struct sb b = { 0 }, esc = { 0 };
            sb_add(&esc, "\"");
            json_escape(&esc, key, strlen(key));
            sb_add(&esc, "\"");
            sb_literal(&b, esc.s ? esc.s : "", esc.n);
            sb_addf(&b, " space \":\" space %s", vref);
            free(esc.s);
            snprintf(h, sizeof h, "%.90s-%.40s-kv", hint, key);
            kv[i] = b.oom ? NULL : rule_add(c, h, b.s);
            free(b.s);
            if (!kv[i]) break;
            i++;
        }
    }
    if (c->rc) { free(kv); free(required); free(keys); return NULL; }
    /* additional properties: a kv rule whose key is none of the declared keys */
    const char *extra = NULL;
    if (allow_extra) {
        const char *vref;
        if (!has_addl || (json_object_is_type(addl, json_type_boolean))) {
            vref = prim(c, "value");
        } else {
            size_t pl = plen;
            path_push(path, &pl, "%s", ".additionalProperties");
            char h[160];
            snprintf(h, sizeof h, "%.90s-additional", hint);
            vref = visit(c, addl, h, path, pl);
            path[plen] = 0;
        }
        char h[160];
        snprintf(h, sizeof h, "%.90s-extra-key", hint);
        const char **sorted = vref ? malloc(((size_t)n + 1) * sizeof *sorted) : NULL;
        if (sorted) memcpy(sorted, keys, (size_t)n * sizeof *sorted);
        else if (vref) jfail(c, KVLLM_ENOMEM, path, "out of memory");
        const char *keyrule = sorted ? extra_key_rule(c, sorted, n, h, path) : NULL;
        free(sorted);
        if (keyrule) {
            struct sb b = { 0 };
            sb_addf(&b, "\"\\\"\" %s \"\\\"\" space \":\" space %s", keyrule, vref);
            snprintf(h, sizeof h, "%.90s-extra-kv", hint);
            extra = b.oom ? NULL : rule_add(c, h, b.s);
            free(b.s);
        }
        if (!extra) { free(kv); free(required); free(keys); if (!c->rc) jfail(c, KVLLM_ENOMEM, path, "out of memory"); return NULL; }
    }
    /* after_i: properties i.. once something was written (each present one preceded by ",");
     * first_i: properties i.. with nothing written yet.  Built back to front as rules. */
    char **after = calloc((size_t)n + 2, sizeof *after), **firsts = calloc((size_t)n + 2, sizeof *firsts);
    struct sb tail = { 0 }, ftail = { 0 };
    if (extra) {
        sb_addf(&tail, "(\",\" space %s)*", extra);
        sb_addf(&ftail, "(%s (\",\" space %s)*)?", extra, extra);
    } else {
        sb_add(&tail, "\"\"");
        sb_add(&ftail, "\"\"");
    }
    after[n] = tail.s;
    firsts[n] = ftail.s;
    for (int k = n - 1; k >= 0 && !c->rc; k--) {
        struct sb a = { 0 }, f = { 0 };
        char h[200];
        snprintf(h, sizeof h, "%.90s-after-%.40s", hint, keys[k]);
        if (required[k]) sb_addf(&a, "\",\" space %s %s", kv[k], after[k + 1] ? after[k + 1] : "");
        else sb_addf(&a, "(\",\" space %s)? %s", kv[k], after[k + 1] ? after[k + 1] : "");
        const char *an = a.oom ? NULL : rule_add(c, h, a.s);
        /* first_k: kv_k after_{k+1} [| first_{k+1} when optional] */
        if (required[k]) sb_addf(&f, "%s %s", kv[k], after[k + 1] ? after[k + 1] : "");
        else sb_addf(&f, "%s %s | %s", kv[k], after[k + 1] ? after[k + 1] : "", firsts[k + 1] ? firsts[k + 1] : "");
        snprintf(h, sizeof h, "%.90s-first-%.40s", hint, keys[k]);
        const char *fn = f.oom ? NULL : rule_add(c, h, f.s);
        free(a.s);
        free(f.s);
        after[k] = an ? strdup(an) : NULL;
        firsts[k] = fn ? strdup(fn) : NULL;
        if (!after[k] || !firsts[k]) jfail(c, KVLLM_ENOMEM, path, "out of memory");
    }
    const char *name = NULL;
    if (!c->rc) {
        struct sb b = { 0 };
        sb_addf(&b, "\"{\" space %s \"}\" space", firsts[0]);
        name = b.oom ? NULL : rule_add(c, hint, b.s);
        free(b.s);
    }
    for (int k = 0; k <= n; k++) { free(after[k]); free(firsts[k]); }
    free(after); free(firsts); free(kv); free(required); free(keys);
    return name;
}

static const char *array_rule(struct jctx *c, json_object *s, const char *hint, char *path, size_t plen) {
    json_object *items = NULL;
    json_object_object_get_ex(s, "items", &items);
    long mn = 0, mx = -1;
    get_count(c, s, "minItems", &mn, path);
    get_count(c, s, "maxItems", &mx, path);
    if (c->rc) return NULL;
    if (mn > JS_MAX_REPEAT || mx > JS_MAX_REPEAT) {
        jfail(c, KVLLM_EUNSUPPORTED, path, "minItems/maxItems above %d", JS_MAX_REPEAT);
        return NULL;
    }
    if (mx >= 0 && mx < mn) { jfail(c, KVLLM_EINVAL, path, "maxItems below minItems"); return NULL; }
    const char *item;
    if (!items || (json_object_is_type(items, json_type_boolean) && json_object_get_boolean(items))) {
        item = prim(c, "value");
    } else if (json_object_is_type(items, json_type_boolean)) {   /* items: false: only [] */
        mx = 0;
        item = prim(c, "value");
    } else if (json_object_is_type(items, json_type_array)) {
        jfail(c, KVLLM_EUNSUPPORTED, path, "'items' as an array (tuples)");
        return NULL;
    } else {
        size_t pl = plen;
        path_push(path, &pl, "%s", ".items");
        char h[160];
        snprintf(h, sizeof h, "%.90s-item", hint);
        item = visit(c, items, h, path, pl);
        path[plen] = 0;
    }
    if (!item) return NULL;
    prim(c, "space");
    struct sb b = { 0 }, more = { 0 };
    sb_addf(&more, "(\",\" space %s)", item);
    sb_add(&b, "\"[\" space ");
    if (mx == 0) {
    } else if (mn == 0) {
        sb_addf(&b, "(%s ", item);
        rep_expr(&b, more.s, 0, mx < 0 ? -1 : mx - 1);
        sb_add(&b, ")?");
    } else {
        sb_addf(&b, "%s ", item);
        rep_expr(&b, more.s, mn - 1, mx < 0 ? -1 : mx - 1);
    }
    sb_add(&b, " \"]\" space");
    const char *name = b.oom ? NULL : rule_add(c, hint, b.s);
    free(b.s);
    free(more.s);
    return name;
}

static const char *string_rule(struct jctx *c, json_object *s, const char *hint, char *path, size_t plen) {
    json_object *pat = NULL, *fmt = NULL;
    json_object_object_get_ex(s, "pattern", &pat);
    json_object_object_get_ex(s, "format", &fmt);
    long mn = 0, mx = -1;
    bool has_len = get_count(c, s, "minLength", &mn, path);
    has_len |= get_count(c, s, "maxLength", &mx, path);
    if (c->rc) return NULL;
    if ((pat || fmt) && has_len) {
        jfail(c, KVLLM_EUNSUPPORTED, path, "minLength/maxLength together with pattern or format");
        return NULL;
    }
    if (pat && fmt) { jfail(c, KVLLM_EUNSUPPORTED, path, "pattern together with format"); return NULL; }
    if (pat) {
        if (!json_object_is_type(pat, json_type_string)) { jfail(c, KVLLM_EINVAL, path, "'pattern' must be a string"); return NULL; }
        size_t pl = plen;
        path_push(path, &pl, "%s", ".pattern");
        const char *r = pattern_rule(c, json_object_get_string(pat), hint, path);
        path[plen] = 0;
        return r;
    }
    prim(c, "space");
    if (fmt) {
        const char *f = json_object_get_string(fmt);
        static const char *const ok[] = { "date", "time", "date-time", "uuid", "email" };
        size_t k = 0;
        while (k < sizeof ok / sizeof *ok && strcmp(f, ok[k])) k++;
        if (k == sizeof ok / sizeof *ok) {
            size_t pl = plen;
            path_push(path, &pl, "%s", ".format");
            jfail(c, KVLLM_EUNSUPPORTED, path, "format '%s' (supported: date, time, date-time, uuid, email)", f);
            path[plen] = 0;
            return NULL;
        }
        prim(c, f);
        struct sb b = { 0 };
        sb_addf(&b, "\"\\\"\" %s \"\\\"\" space", f);
        const char *name = b.oom ? NULL : rule_add(c, hint, b.s);
        free(b.s);
        return name;
    }
    if (!has_len) return prim(c, "string");
    if (mn > JS_MAX_REPEAT || mx > JS_MAX_REPEAT) {
        jfail(c, KVLLM_EUNSUPPORTED, path, "minLength/maxLength above %d", JS_MAX_REPEAT);
        return NULL;
    }
    if (mx >= 0 && mx < mn) { jfail(c, KVLLM_EINVAL, path, "maxLength below minLength"); return NULL; }
    prim(c, "char");
    struct sb b = { 0 };
    sb_add(&b, "\"\\\"\" ");
    rep_expr(&b, "char", mn, mx);
    sb_add(&b, " \"\\\"\" space");
    const char *name = b.oom ? NULL : rule_add(c, hint, b.s);
    free(b.s);
    return name;
}

/* A bound: minimum/maximum/exclusiveMinimum/exclusiveMaximum (numbers, draft 6+). */
static bool get_bound(struct jctx *c, json_object *s, const char *key, double *v, const char *path) {
    json_object *x;
    if (!json_object_object_get_ex(s, key, &x)) return false;
    if (!json_object_is_type(x, json_type_int) && !json_object_is_type(x, json_type_double)) {
        jfail(c, KVLLM_EUNSUPPORTED, path, "'%s' must be a number (draft-4 boolean form not supported)", key);
        return false;
    }
    *v = json_object_get_double(x);
    if (fabs(*v) > 9e15) {
        jfail(c, KVLLM_EUNSUPPORTED, path, "'%s' beyond +-9e15", key);
        return false;
    }
    return true;
}

static const char *integer_rule(struct jctx *c, json_object *s, const char *hint, char *path) {
    double mn, mx, emn, emx;
    bool has_mn = get_bound(c, s, "minimum", &mn, path), has_mx = get_bound(c, s, "maximum", &mx, path);
    bool has_emn = get_bound(c, s, "exclusiveMinimum", &emn, path);
    bool has_emx = get_bound(c, s, "exclusiveMaximum", &emx, path);
    if (c->rc) return NULL;
    if (!has_mn && !has_mx && !has_emn && !has_emx) return prim(c, "integer");
    long long lo = 0, hi = 0;
    bool has_lo = false, has_hi = false;
    if (has_mn) { lo = (long long)ceil(mn); has_lo = true; }
    if (has_emn) { long long l = (long long)floor(emn) + 1; if (!has_lo || l > lo) lo = l; has_lo = true; }
    if (has_mx) { hi = (long long)floor(mx); has_hi = true; }
    if (has_emx) { long long h = (long long)ceil(emx) - 1; if (!has_hi || h < hi) hi = h; has_hi = true; }
    if (has_lo && has_hi && lo > hi) { jfail(c, KVLLM_EINVAL, path, "no integer within the bounds"); return NULL; }
    prim(c, "space");
    struct sb b = { 0 };
    sb_add(&b, "(");
    range_int(&b, has_lo, lo, has_hi, hi);
    sb_add(&b, ") space");
    const char *name = b.oom ? NULL : rule_add(c, hint, b.s);
    free(b.s);
    return name;
}

/* Non-negative decimals (no exponent) with integer part in a range: value in
 * [L, H] with exclusive flags, L, H integers >= 0 (H < 0: unbounded). */
static void decimal_nonneg(struct sb *o, long long L, bool lx, long long H, bool hx) {
    const char *frac = "(\".\" decimal-part)?", *frac_nz = "\".\" [0-9]{0,15} [1-9] [0-9]{0,15}",
               *frac_zero = "(\".\" \"0\"{1,16})?";
    bool first = true;
#define ALT() (sb_add(o, first ? "" : " | "), first = false)
    if (H >= 0 && L == H) {
        if (!lx && !hx) { ALT(); sb_addf(o, "\"%lld\" %s", L, frac_zero); }
        if (first) sb_add(o, "[^\\x00-\\U0010FFFF]");
        return;
    }
    /* integer part L */
    ALT();
    sb_addf(o, "\"%lld\" %s", L, lx ? frac_nz : frac);
    /* integer parts L+1 .. H-1 (or unbounded) */
    if (H < 0 || L + 1 <= H - 1) {
        ALT();
        sb_add(o, "(");
        range_nonneg(o, L + 1, H < 0 ? -1 : H - 1);
        sb_addf(o, ") %s", frac);
    }
    if (H >= 0 && !hx) { ALT(); sb_addf(o, "\"%lld\" %s", H, frac_zero); }
#undef ALT
}

static const char *number_rule(struct jctx *c, json_object *s, const char *hint, char *path) {
    double mn, mx, emn, emx;
    bool has_mn = get_bound(c, s, "minimum", &mn, path), has_mx = get_bound(c, s, "maximum", &mx, path);
    bool has_emn = get_bound(c, s, "exclusiveMinimum", &emn, path);
    bool has_emx = get_bound(c, s, "exclusiveMaximum", &emx, path);
    if (c->rc) return NULL;
    if (!has_mn && !has_mx && !has_emn && !has_emx) return prim(c, "number");
    /* the tighter of inclusive/exclusive per side */
    bool has_lo = has_mn || has_emn, has_hi = has_mx || has_emx, lx = false, hx = false;
    double lo = 0, hi = 0;
    if (has_mn) lo = mn;
    if (has_emn && (!has_mn || emn >= mn)) { lo = emn; lx = true; }
    if (has_mx) hi = mx;
    if (has_emx && (!has_mx || emx <= mx)) { hi = emx; hx = true; }
    if ((has_lo && lo != floor(lo)) || (has_hi && hi != floor(hi))) {
        jfail(c, KVLLM_EUNSUPPORTED, path, "number bounds that are not integers");
        return NULL;
    }
    if (has_lo && has_hi && (lo > hi || (lo == hi && (lx || hx)))) {
        jfail(c, KVLLM_EINVAL, path, "no number within the bounds");
        return NULL;
    }
    prim(c, "space");
    prim(c, "decimal-part");
    struct sb b = { 0 };
    sb_add(&b, "(");
    bool first = true;
    long long L = (long long)lo, H = (long long)hi;
    if (!has_lo || L < 0) {
        /* negative values -m: m in (max(0, -H), -L] (m > 0 strictly: zero is the non-negative part's) */
        long long mlo = has_hi && H < 0 ? -H : 0;
        bool mlx = !(has_hi && H < 0) || hx;   /* m > mlo, unless the bound -H itself is included */
        long long mhi = has_lo ? -L : -1;
        sb_add(&b, "\"-\" (");
        decimal_nonneg(&b, mlo, mlx, mhi, lx);
        sb_add(&b, ")");
        first = false;
    }
    if (!has_hi || H >= 0 || (H == 0 && !hx)) {
        if (!(has_hi && H < 0)) {
            sb_add(&b, first ? "(" : " | (");
            decimal_nonneg(&b, has_lo && L > 0 ? L : 0, has_lo && L >= 0 ? lx : false, has_hi ? H : -1, hx);
            sb_add(&b, ")");
        }
    }
    sb_add(&b, ") space");
    const char *name = b.oom ? NULL : rule_add(c, hint, b.s);
    free(b.s);
    return name;
}

/* A JSON value's text as a GBNF literal + space (enum, const).  Objects
 * and arrays as json-c writes them with spaces after ':' and ','. */
static void literal_value(struct sb *b, json_object *v) {
    const char *t = json_object_to_json_string_ext(v, JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE);
    if (json_object_is_type(v, json_type_object) || json_object_is_type(v, json_type_array)) {
        /* json-c's spaced form is "{ \"a\": 1 }": drop the padding inside brackets */
        struct sb tmp = { 0 };
        size_t n = strlen(t);
        bool in_str = false;
        for (size_t i = 0; i < n; i++) {
            char ch = t[i];
            if (in_str) {
                sb_addn(&tmp, &ch, 1);
                if (ch == '\\' && i + 1 < n) sb_addn(&tmp, &t[++i], 1);
                else if (ch == '"') in_str = false;
                continue;
            }
            if (ch == '"') in_str = true;
            if (ch == ' ' && ((i > 0 && (t[i - 1] == '{' || t[i - 1] == '[')) || (i + 1 < n && (t[i + 1] == '}' || t[i + 1] == ']'))))
                continue;
            sb_addn(&tmp, &ch, 1);
        }
        sb_literal(b, tmp.s ? tmp.s : "", tmp.n);
        free(tmp.s);
    } else {
        sb_literal(b, t, strlen(t));
    }
}

static const char *resolve_ref(struct jctx *c, const char *ref, const char *path) {
    int64_t known = gnames_get(&c->ref_names, ref, strlen(ref));
    if (known >= 0) return c->refs[known].rule;
    const char *p;
    if (!strncmp(ref, "#/$defs/", 8)) p = ref + 8;
    else if (!strncmp(ref, "#/definitions/", 14)) p = ref + 14;
    else if (!strcmp(ref, "#")) p = NULL;
    else {
        jfail(c, KVLLM_EUNSUPPORTED, path, "$ref '%s' (only local #/$defs/... and #/definitions/...)", ref);
        return NULL;
    }
    json_object *target = c->root;
    if (p) {
        json_object *defs;
        if (!json_object_object_get_ex(c->root, strncmp(ref, "#/$defs/", 8) ? "definitions" : "$defs", &defs) ||
            !json_object_object_get_ex(defs, p, &target)) {
            jfail(c, KVLLM_EINVAL, path, "$ref '%s' not found", ref);
            return NULL;
        }
    }
    /* reserve the rule first so recursive references resolve to it */
    char hint[160];
    snprintf(hint, sizeof hint, "ref-%.40s", p ? p : "root");
    const char *name = rule_add(c, hint, "");
    if (!name) return NULL;
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? c->cap_refs * 2 : 8;
        struct jref *r = realloc(c->refs, (size_t)cap * sizeof *r);
        if (!r) { jfail(c, KVLLM_ENOMEM, path, "out of memory"); return NULL; }
        c->refs = r;
        c->cap_refs = cap;
    }
    c->refs[c->n_refs].ref = strdup(ref);
    c->refs[c->n_refs].rule = strdup(name);
    if (!c->refs[c->n_refs].ref || !c->refs[c->n_refs].rule ||
        !gnames_put(&c->ref_names, c->refs[c->n_refs].ref, strlen(ref), (uint32_t)c->n_refs)) {
        free(c->refs[c->n_refs].ref);
        free(c->refs[c->n_refs].rule);
        jfail(c, KVLLM_ENOMEM, path, "out of memory");
        return NULL;
    }
    const char *rule = c->refs[c->n_refs++].rule;
    char tpath[512];
    snprintf(tpath, sizeof tpath, "$%s%s", p ? (strncmp(ref, "#/$defs/", 8) ? ".definitions." : ".$defs.") : "", p ? p : "");
    const char *body = visit(c, target, hint, tpath, strlen(tpath));
    if (body) rule_set_body(c, rule, body);
    return body ? rule : NULL;
}

static const char *visit_types(struct jctx *c, json_object *s, const char **types, int n_types, const char *hint,
                               char *path, size_t plen) {
    struct sb b = { 0 };
    for (int i = 0; i < n_types && !c->rc; i++) {
        const char *t = types[i], *r = NULL;
        char h[160];
        snprintf(h, sizeof h, n_types > 1 ? "%.90s-%.40s" : "%.90s", hint, t);
        if (!strcmp(t, "object")) r = object_rule(c, s, h, path, plen);
        else if (!strcmp(t, "array")) r = array_rule(c, s, h, path, plen);
        else if (!strcmp(t, "string")) r = string_rule(c, s, h, path, plen);
        else if (!strcmp(t, "integer")) r = integer_rule(c, s, h, path);
        else if (!strcmp(t, "number")) r = number_rule(c, s, h, path);
        else if (!strcmp(t, "boolean")) r = prim(c, "boolean");
        else if (!strcmp(t, "null")) r = prim(c, "null");
        else jfail(c, KVLLM_EINVAL, path, "unknown type '%s'", t);
        if (r) sb_addf(&b, "%s%s", i ? " | " : "", r);
    }
    const char *name = NULL;
    if (!c->rc) name = n_types == 1 ? rule_find_name(c, b.s) : rule_add(c, hint, b.s);
    free(b.s);
    return name;
}

static bool has_any(json_object *s, const char *const *keys, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (json_object_object_get_ex(s, keys[i], NULL)) return true;
    return false;
}

static const char *visit(struct jctx *c, json_object *s, const char *hint, char *path, size_t plen) {
    if (c->rc) return NULL;
    if (++c->depth > JS_MAX_DEPTH) {
        jfail(c, KVLLM_EUNSUPPORTED, path, "schema nested deeper than %d", JS_MAX_DEPTH);
        return NULL;
    }
    const char *out = NULL;
    if (json_object_is_type(s, json_type_boolean)) {
        if (json_object_get_boolean(s)) out = prim(c, "value");
        else jfail(c, KVLLM_EUNSUPPORTED, path, "the schema false (nothing can match)");
        c->depth--;
        return out;
    }
    if (!json_object_is_type(s, json_type_object)) {
        jfail(c, KVLLM_EINVAL, path, "a schema must be an object or a boolean");
        c->depth--;
        return NULL;
    }
    /* every keyword must be one we honour (or an annotation) */
    static const char *const known[] = {
        "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const",
        "anyOf", "oneOf", "$ref", "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
        "exclusiveMaximum", "format",
    };
    json_object_object_foreach(s, key, val) {
        (void)val;
        bool ok = is_annotation(key);
        for (size_t i = 0; !ok && i < sizeof known / sizeof *known; i++) ok = !strcmp(key, known[i]);
        if (!ok) {
            size_t pl = plen;
            path_push(path, &pl, ".%s", key);
            jfail(c, KVLLM_EUNSUPPORTED, path, "unsupported keyword");
            path[plen] = 0;
            c->depth--;
            return NULL;
        }
    }
    json_object *v;
    if (json_object_object_get_ex(s, "$ref", &v)) {
        if (json_object_object_length(s) > 1) {
            json_object_object_foreach(s, k2, v2) {
                (void)v2;
                if (strcmp(k2, "$ref") && !is_annotation(k2)) {
                    size_t pl = plen;
                    path_push(path, &pl, ".%s", k2);
                    jfail(c, KVLLM_EUNSUPPORTED, path, "a keyword beside $ref");
                    path[plen] = 0;
                    c->depth--;
                    return NULL;
                }
            }
        }
        out = resolve_ref(c, json_object_get_string(v), path);
    } else if (json_object_object_get_ex(s, "anyOf", &v) || json_object_object_get_ex(s, "oneOf", &v)) {
        const char *kw = json_object_object_get_ex(s, "anyOf", NULL) ? "anyOf" : "oneOf";
        if (json_object_object_get_ex(s, "anyOf", NULL) && json_object_object_get_ex(s, "oneOf", NULL)) {
            jfail(c, KVLLM_EUNSUPPORTED, path, "anyOf together with oneOf");
        } else if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) == 0) {
            jfail(c, KVLLM_EINVAL, path, "'%s' must be a non-empty array", kw);
        } else {
            json_object_object_foreach(s, k2, v2) {
                (void)v2;
                if (strcmp(k2, kw) && !is_annotation(k2) && !c->rc) {
                    size_t pl = plen;
                    path_push(path, &pl, ".%s", k2);
                    jfail(c, KVLLM_EUNSUPPORTED, path, "a keyword beside %s", kw);
                    path[plen] = 0;
                }
            }
            struct sb b = { 0 };
            for (size_t i = 0; i < json_object_array_length(v) && !c->rc; i++) {
                char seg[64], h[160];
                snprintf(seg, sizeof seg, ".%s[%zu]", kw, i);
                size_t pl = plen;
                path_push(path, &pl, "%s", seg);
                snprintf(h, sizeof h, "%.90s-%zu", hint, i);
                const char *r = visit(c, json_object_array_get_idx(v, i), h, path, pl);
                path[plen] = 0;
                if (r) sb_addf(&b, "%s%s", i ? " | " : "", r);
            }
            if (!c->rc) out = rule_add(c, hint, b.s);
            free(b.s);
        }
    } else if (json_object_object_get_ex(s, "const", &v) || json_object_object_get_ex(s, "enum", &v)) {
        bool is_enum = !json_object_object_get_ex(s, "const", NULL);
        if (is_enum && (!json_object_is_type(v, json_type_array) || json_object_array_length(v) == 0)) {
            jfail(c, KVLLM_EINVAL, path, "'enum' must be a non-empty array");
        } else {
            prim(c, "space");
            struct sb b = { 0 };
            sb_add(&b, "(");
            size_t n = is_enum ? json_object_array_length(v) : 1;
            for (size_t i = 0; i < n; i++) {
                if (i) sb_add(&b, " | ");
                literal_value(&b, is_enum ? json_object_array_get_idx(v, i) : v);
            }
            sb_add(&b, ") space");
            out = rule_add(c, hint, b.s);
            free(b.s);
        }
    } else {
        const char *types[8];
        int n_types = 0;
        if (json_object_object_get_ex(s, "type", &v)) {
            if (json_object_is_type(v, json_type_string)) {
                types[n_types++] = json_object_get_string(v);
            } else if (json_object_is_type(v, json_type_array)) {
                for (size_t i = 0; i < json_object_array_length(v) && n_types < 8; i++)
                    types[n_types++] = json_object_get_string(json_object_array_get_idx(v, i));
            }
            if (n_types == 0) jfail(c, KVLLM_EINVAL, path, "'type' must be a string or an array of strings");
        } else {
            /* no type: as llama.cpp, the keywords say which (one) type is meant; none: any value */
            static const char *const objk[] = { "properties", "required", "additionalProperties" };
            static const char *const arrk[] = { "items", "minItems", "maxItems" };
            static const char *const strk[] = { "pattern", "minLength", "maxLength", "format" };
            static const char *const numk[] = { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum" };
            int fams = has_any(s, objk, 3) + has_any(s, arrk, 3) + has_any(s, strk, 4) + has_any(s, numk, 4);
            if (fams > 1) jfail(c, KVLLM_EUNSUPPORTED, path, "keywords of several types without 'type'");
            else if (has_any(s, objk, 3)) types[n_types++] = "object";
            else if (has_any(s, arrk, 3)) types[n_types++] = "array";
            else if (has_any(s, strk, 4)) types[n_types++] = "string";
            else if (has_any(s, numk, 4)) types[n_types++] = "number";
            else out = prim(c, "value");
        }
        if (n_types && !c->rc) out = visit_types(c, s, types, n_types, hint, path, plen);
    }
    c->depth--;
    return c->rc ? NULL : out;
}

static void jctx_free(struct jctx *c) {
    for (int i = 0; i < c->n_rules; i++) { free(c->rules[i].name); free(c->rules[i].body); }
    free(c->rules);
    for (int i = 0; i < c->n_refs; i++) { free(c->refs[i].ref); free(c->refs[i].rule); }
    free(c->refs);
    gnames_free(&c->names);
    gnames_free(&c->ref_names);
}

/* The GBNF text of a schema (caller frees), or NULL with c->rc. */
static char *schema_to_gbnf(struct jctx *c) {
    char path[512] = "$";
    const char *top = visit(c, c->root, "root-value", path, 1);
    if (!top) return NULL;
    struct sb b = { 0 };
    sb_addf(&b, "root ::= %s\n", top);
    for (int i = 0; i < c->n_rules; i++) sb_addf(&b, "%s ::= %s\n", c->rules[i].name, c->rules[i].body);
    if (b.oom) {
        free(b.s);
        jfail(c, KVLLM_ENOMEM, "$", "out of memory");
        return NULL;
    }
    return b.s;
}

int kvllm_grammar_from_json_schema(const char *schema_json, bool strict, struct kvllm_grammar **out, char *err,
                                   size_t err_cap) {
    *out = NULL;
    if (err && err_cap) err[0] = 0;
    struct jctx c = { .strict = strict, .err = err, .err_cap = err_cap };
    if (!schema_json) { jfail(&c, KVLLM_EINVAL, "$", "no schema"); return c.rc; }
    enum json_tokener_error jerr;
    json_tokener *tok = json_tokener_new();
    if (!tok) return KVLLM_ENOMEM;
    c.root = json_tokener_parse_ex(tok, schema_json, (int)strlen(schema_json));
    jerr = json_tokener_get_error(tok);
    size_t end = tok->char_offset;
    json_tokener_free(tok);
    if (!c.root || jerr != json_tokener_success) {
        if (c.root) json_object_put(c.root);
        char msg[160];
        snprintf(msg, sizeof msg, "not valid JSON (%s at offset %zu)",
                 jerr == json_tokener_success ? "trailing text" : json_tokener_error_desc(jerr), end);
        jfail(&c, KVLLM_EINVAL, "$", "%s", msg);
        return c.rc;
    }
    for (; schema_json[end]; end++)
        if (schema_json[end] != ' ' && schema_json[end] != '\n' && schema_json[end] != '\t' && schema_json[end] != '\r') {
            json_object_put(c.root);
            jfail(&c, KVLLM_EINVAL, "$", "not valid JSON (trailing text at offset %zu)", end);
            return c.rc;
        }
    char *gbnf = schema_to_gbnf(&c);
    json_object_put(c.root);
    jctx_free(&c);
    if (!gbnf) return c.rc ? c.rc : KVLLM_ENOMEM;
    char perr[256];
    int rc = gbnf_parse(gbnf, out, perr, sizeof perr);
    if (rc == KVLLM_ERANGE) {   /* the schema's, not the compiler's: its grammar is past the matcher's sizes */
        if (err && err_cap) snprintf(err, err_cap, "$: %s", perr);
    } else if (rc) {
        /* a compiler bug, not the user's: say so with the parser's message */
        LOG_ERR("json schema: generated grammar does not parse (%s)", perr);
        if (err && err_cap) snprintf(err, err_cap, "$: internal error: generated grammar does not parse (%s)", perr);
    }
    free(gbnf);
    return rc;
}

int kvllm_grammar_json_object(struct kvllm_grammar **out) {
    struct jctx c = { 0 };
    /* any JSON object: the root is `object`, its values any JSON value */
    prim(&c, "object");
    struct sb b = { 0 };
    sb_add(&b, "root ::= object\n");
    for (int i = 0; i < c.n_rules; i++) sb_addf(&b, "%s ::= %s\n", c.rules[i].name, c.rules[i].body);
    jctx_free(&c);
    if (b.oom) { free(b.s); return KVLLM_ENOMEM; }
    int rc = gbnf_parse(b.s, out, NULL, 0);
    free(b.s);
    return rc;
}
