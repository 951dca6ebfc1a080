/* schema_emit.c — the JSON Schema compiler's output side: GBNF text
 * (literals, class members, repetitions), the rule table (unique names,
 * bodies, the size budget), the shared primitives and the final GBNF. */
#include "grammar/schema_internal.h"
#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- text ---- */

void schema_put_literal(struct strbuf *b, const char *s, size_t n) {
    sb_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') sb_puts(b, "\\\"");
        else if (c == '\\') sb_puts(b, "\\\\");
        else if (c == '\n') sb_puts(b, "\\n");
        else if (c == '\t') sb_puts(b, "\\t");
        else if (c == '\r') sb_puts(b, "\\r");
        else if (c < 0x20 || c == 0x7F) sb_printf(b, "\\x%02X", c);
        else sb_put(b, (const char *)&c, 1);
    }
    sb_puts(b, "\"");
}

void schema_put_json_escaped(struct strbuf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': sb_puts(b, "\\\""); break;
        case '\\': sb_puts(b, "\\\\"); break;
        case '\n': sb_puts(b, "\\n"); break;
        case '\t': sb_puts(b, "\\t"); break;
        case '\r': sb_puts(b, "\\r"); break;
        case '\b': sb_puts(b, "\\b"); break;
        case '\f': sb_puts(b, "\\f"); break;
        default:
            if (c < 0x20) sb_printf(b, "\\u%04x", c);
            else sb_put(b, (const char *)&c, 1);
        }
    }
}

void schema_put_class_cp(struct strbuf *b, uint32_t cp) {
    if (cp == '\\' || cp == ']' || cp == '[' || cp == '^' || cp == '-' || cp == '"' || cp < 0x20 || cp == 0x7F)
        sb_printf(b, cp < 0x100 ? "\\x%02X" : "\\u%04X", cp);
    else if (cp < 0x80) sb_printf(b, "%c", (char)cp);
    else sb_printf(b, cp < 0x10000 ? "\\u%04X" : "\\U%08X", cp);
}

void schema_put_repeat(struct strbuf *b, const char *x, long mn, long mx) {
    if (mx < 0) sb_printf(b, "%s{%ld,}", x, mn);
    else if (mn == mx) sb_printf(b, "%s{%ld}", x, mn);
    else sb_printf(b, "%s{%ld,%ld}", x, mn, mx);
}

uint32_t schema_utf8_next(const char *s, size_t *i, size_t n) {
    unsigned char c0 = (unsigned char)s[(*i)++];
    if (c0 < 0x80) return c0;
    int extra = c0 >= 0xF0 ? 3 : c0 >= 0xE0 ? 2 : 1;
    uint32_t cp = c0 & (0x3Fu >> extra);
    for (int k = 0; k < extra && *i < n; k++) cp = (cp << 6) | ((unsigned char)s[(*i)++] & 0x3Fu);
    return cp;
}

/* ---- failures ---- */

void schema_fail(struct schema_ctx *c, int rc, const char *path, const char *fmt, ...) {
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

void schema_ctx_free(struct schema_ctx *c) {
    for (int i = 0; i < c->n_rules; i++) { free(c->rules[i].name); free(c->rules[i].body); }
    free(c->rules);
    for (int i = 0; i < c->n_refs; i++) { free(c->refs[i].ref); free(c->refs[i].rule); }
    free(c->refs);
    gnames_free(&c->names);
    gnames_free(&c->ref_names);
}

/* ---- the rule table ---- */

static struct schema_rule *rule_get(struct schema_ctx *c, const char *name) {
    int64_t i = name ? gnames_get(&c->names, name, strlen(name)) : -1;
    return i < 0 ? NULL : &c->rules[i];
}

const char *schema_rule_find_name(struct schema_ctx *c, const char *name) {
    const struct schema_rule *r = rule_get(c, name);
    return r ? r->name : NULL;
}

/* A name not yet taken: base, or base-N with N counted on from the last
 * rule of that base (so many rules of one base cost no search each). */
static void unique_name(struct schema_ctx *c, const char *base, char *name, size_t cap) {
    struct schema_rule *first = rule_get(c, base);
    snprintf(name, cap, "%s", base);
    if (!first) return;
    int i = first->next_suffix ? first->next_suffix : 1;
    do snprintf(name, cap, "%s-%d", base, i++);
    while (rule_get(c, name));
    first->next_suffix = i;
}

/* hint with every character GBNF does not allow in a name made '-'. */
static void safe_name(const char *hint, char *base, size_t cap) {
    size_t k = 0;
    for (const char *p = hint; *p && k < cap - 12; p++) {
        char ch = *p;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        base[k++] = ok ? ch : '-';
    }
    if (!k) base[k++] = 'r';
    base[k] = 0;
}

const char *schema_rule_add(struct schema_ctx *c, const char *hint, const char *body) {
    if (c->rc) return NULL;
    char base[120], name[140];
    safe_name(hint, base, sizeof base);
    unique_name(c, base, name, sizeof name);
    c->n_text += strlen(name) + (body ? strlen(body) : 0) + 6;
    if (c->n_text > JS_MAX_GBNF || (uint32_t)c->n_rules >= GRAMMAR_MAX_RULES) {
        schema_fail(c, KVLLM_ERANGE, "$", "the schema is too large: its grammar would pass %u rules or %d MiB",
                    GRAMMAR_MAX_RULES, JS_MAX_GBNF >> 20);
        return NULL;
    }
    if (c->n_rules == c->cap_rules) {
        int cap = c->cap_rules ? c->cap_rules * 2 : 32;
        struct schema_rule *r = realloc(c->rules, (size_t)cap * sizeof *r);
        if (!r) { schema_fail(c, KVLLM_ENOMEM, "$", "out of memory"); return NULL; }
        c->rules = r;
        c->cap_rules = cap;
    }
    struct schema_rule *r = &c->rules[c->n_rules];
    r->name = strdup(name);
    r->body = strdup(body ? body : "");
    r->next_suffix = 0;
    if (!r->name || !r->body || !gnames_put(&c->names, r->name, strlen(r->name), (uint32_t)c->n_rules)) {
        free(r->name);
        free(r->body);
        schema_fail(c, KVLLM_ENOMEM, "$", "out of memory");
        return NULL;
    }
    c->n_rules++;
    return r->name;
}

void schema_rule_set_body(struct schema_ctx *c, const char *name, const char *body) {
    struct schema_rule *r = rule_get(c, name);
    if (!r) return;
    char *d = strdup(body);
    if (!d) { schema_fail(c, KVLLM_ENOMEM, "$", "out of memory"); return; }
    free(r->body);
    r->body = d;
}

/* ---- primitives ---- */

/* Shared primitives, added on first use with the primitives they use (deps). */
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

const char *schema_prim(struct schema_ctx *c, const char *name) {
    for (size_t i = 0; i < sizeof k_prims / sizeof *k_prims; i++) {
        if (strcmp(k_prims[i].name, name)) continue;
        if (rule_get(c, name)) return name;
        schema_rule_add(c, name, k_prims[i].body);
        char deps[160];
        snprintf(deps, sizeof deps, "%s", k_prims[i].deps);
        for (char *save = NULL, *d = strtok_r(deps, " ", &save); d; d = strtok_r(NULL, " ", &save))
            schema_prim(c, d);
        return name;
    }
    KV_ASSERT(!"unknown primitive");
    return NULL;
}

/* ---- output ---- */

char *schema_gbnf(struct schema_ctx *c, const char *top) {
    struct strbuf b = { 0 };
    sb_printf(&b, "root ::= %s\n", top);
    for (int i = 0; i < c->n_rules; i++) sb_printf(&b, "%s ::= %s\n", c->rules[i].name, c->rules[i].body);
    if (b.oom) {
        sb_free(&b);
        schema_fail(c, KVLLM_ENOMEM, "$", "out of memory");
        return NULL;
    }
    return b.s;
}
