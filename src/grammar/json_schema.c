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
 * default, examples, ...) are accepted.
 *
 * This file is the walk (which keyword decides a schema's shape, $ref,
 * anyOf/oneOf, enum/const, the type(s) meant) and the entry points; each
 * type's rules are in schema_object.c, schema_string.c, schema_number.c,
 * and the rule table and text in schema_emit.c (schema_internal.h). */
#include "grammar/schema_internal.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- paths and keywords ---- */

void schema_path_push(char *path, size_t *len, const char *fmt, const char *arg) {
    int n = snprintf(path + *len, JS_MAX_PATH - *len, fmt, arg);
    if (n > 0) *len += (size_t)n < JS_MAX_PATH - *len ? (size_t)n : JS_MAX_PATH - *len - 1;
}

static bool is_annotation(const char *k) {
    static const char *const ann[] = { "title", "description", "$schema", "$id", "$comment", "examples", "default",
                                       "deprecated", "readOnly", "writeOnly", "$defs", "definitions" };
    for (size_t i = 0; i < sizeof ann / sizeof *ann; i++)
        if (!strcmp(k, ann[i])) return true;
    return false;
}

bool schema_get_count(struct schema_ctx *c, json_object *s, const char *key, long *out, const char *path) {
    json_object *v;
    if (!json_object_object_get_ex(s, key, &v)) return false;
    if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0) {
        schema_fail(c, KVLLM_EINVAL, path, "'%s' must be a non-negative integer", key);
        return false;
    }
    int64_t x = json_object_get_int64(v);
    *out = x > 1000000 ? 1000000 : (long)x;
    return true;
}

/* Refuse the keyword key of the schema at path (KVLLM_EUNSUPPORTED, at path.key). */
static void fail_at_key(struct schema_ctx *c, char *path, size_t plen, const char *key, const char *what) {
    size_t pl = plen;
    schema_path_push(path, &pl, ".%s", key);
    schema_fail(c, KVLLM_EUNSUPPORTED, path, "%s", what);
    path[plen] = 0;
}

/* Every keyword of s must be one the compiler honours, or an annotation. */
static bool keywords_known(struct schema_ctx *c, json_object *s, char *path, size_t plen) {
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
            fail_at_key(c, path, plen, key, "unsupported keyword");
            return false;
        }
    }
    return true;
}

/* Nothing but annotations beside kw ($ref, anyOf, oneOf). */
static bool keyword_alone(struct schema_ctx *c, json_object *s, const char *kw, char *path, size_t plen) {
    json_object_object_foreach(s, key, val) {
        (void)val;
        if (strcmp(key, kw) && !is_annotation(key)) {
            char what[64];
            snprintf(what, sizeof what, "a keyword beside %s", kw);
            fail_at_key(c, path, plen, key, what);
            return false;
        }
    }
    return true;
}

/* ---- $ref ---- */

/* A new entry of the $ref table for ref, its rule reserved as name; false (c->rc set) when out of memory. */
static bool ref_add(struct schema_ctx *c, const char *ref, const char *name, const char *path) {
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? c->cap_refs * 2 : 8;
        struct schema_ref *r = realloc(c->refs, (size_t)cap * sizeof *r);
        if (!r) { schema_fail(c, KVLLM_ENOMEM, path, "out of memory"); return false; }
        c->refs = r;
        c->cap_refs = cap;
    }
    struct schema_ref *r = &c->refs[c->n_refs];
    r->ref = strdup(ref);
    r->rule = strdup(name);
    if (!r->ref || !r->rule || !gnames_put(&c->ref_names, r->ref, strlen(ref), (uint32_t)c->n_refs)) {
        free(r->ref);
        free(r->rule);
        schema_fail(c, KVLLM_ENOMEM, path, "out of memory");
        return false;
    }
    c->n_refs++;
    return true;
}

/* The rule of a local $ref ("#", "#/$defs/NAME", "#/definitions/NAME"); a
 * target is compiled once, into a rule reserved before it is visited, so a
 * recursive reference resolves to that rule. */
static const char *resolve_ref(struct schema_ctx *c, const char *ref, const char *path) {
    int64_t known = gnames_get(&c->ref_names, ref, strlen(ref));
    if (known >= 0) return c->refs[known].rule;
    bool defs = !strncmp(ref, "#/$defs/", 8);
    const char *p;
    if (defs) p = ref + 8;
    else if (!strncmp(ref, "#/definitions/", 14)) p = ref + 14;
    else if (!strcmp(ref, "#")) p = NULL;
    else {
        schema_fail(c, KVLLM_EUNSUPPORTED, path, "$ref '%s' (only local #/$defs/... and #/definitions/...)", ref);
        return NULL;
    }
    json_object *target = c->root, *table;
    if (p && (!json_object_object_get_ex(c->root, defs ? "$defs" : "definitions", &table) ||
              !json_object_object_get_ex(table, p, &target))) {
        schema_fail(c, KVLLM_EINVAL, path, "$ref '%s' not found", ref);
        return NULL;
    }
    char hint[160];
    snprintf(hint, sizeof hint, "ref-%.40s", p ? p : "root");
    const char *name = schema_rule_add(c, hint, "");
    if (!name || !ref_add(c, ref, name, path)) return NULL;
    const char *rule = c->refs[c->n_refs - 1].rule;
    char tpath[JS_MAX_PATH];
    snprintf(tpath, sizeof tpath, "$%s%s", p ? (defs ? ".$defs." : ".definitions.") : "", p ? p : "");
    const char *body = schema_visit(c, target, hint, tpath, strlen(tpath));
    if (body) schema_rule_set_body(c, rule, body);
    return body ? rule : NULL;
}

/* ---- anyOf / oneOf, enum / const ---- */

/* One alternative per subschema of the array v (kw: anyOf or oneOf). */
static const char *visit_union(struct schema_ctx *c, json_object *s, json_object *v, const char *kw,
                               const char *hint, char *path, size_t plen) {
    if (json_object_object_get_ex(s, "anyOf", NULL) && json_object_object_get_ex(s, "oneOf", NULL)) {
        schema_fail(c, KVLLM_EUNSUPPORTED, path, "anyOf together with oneOf");
        return NULL;
    }
    if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) == 0) {
        schema_fail(c, KVLLM_EINVAL, path, "'%s' must be a non-empty array", kw);
        return NULL;
    }
    if (!keyword_alone(c, s, kw, path, plen)) return NULL;
    struct strbuf b = { 0 };
    for (size_t i = 0; i < json_object_array_length(v) && !c->rc; i++) {
        char seg[64], h[160];
        snprintf(seg, sizeof seg, ".%s[%zu]", kw, i);
        size_t pl = plen;
        schema_path_push(path, &pl, "%s", seg);
        snprintf(h, sizeof h, "%.90s-%zu", hint, i);
        const char *r = schema_visit(c, json_object_array_get_idx(v, i), h, path, pl);
        path[plen] = 0;
        if (r) sb_printf(&b, "%s%s", i ? " | " : "", r);
    }
    const char *out = c->rc ? NULL : schema_rule_add(c, hint, b.s);
    sb_free(&b);
    return out;
}

/* A JSON value's text as a GBNF literal (enum, const).  Objects and arrays
 * as json-c writes them with spaces after ':' and ',' ("{"a": 1}"). */
static void literal_value(struct strbuf *b, json_object *v) {
    const char *t = json_object_to_json_string_ext(v, JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE);
    if (!json_object_is_type(v, json_type_object) && !json_object_is_type(v, json_type_array)) {
        schema_put_literal(b, t, strlen(t));
        return;
    }
    /* json-c's spaced form is "{ \"a\": 1 }": drop the padding inside brackets */
    struct strbuf tmp = { 0 };
    size_t n = strlen(t);
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char ch = t[i];
        if (in_str) {
            sb_put(&tmp, &ch, 1);
            if (ch == '\\' && i + 1 < n) sb_put(&tmp, &t[++i], 1);
            else if (ch == '"') in_str = false;
            continue;
        }
        if (ch == '"') in_str = true;
        bool pad = ch == ' ' && ((i > 0 && (t[i - 1] == '{' || t[i - 1] == '[')) ||
                                 (i + 1 < n && (t[i + 1] == '}' || t[i + 1] == ']')));
        if (!pad) sb_put(&tmp, &ch, 1);
    }
    schema_put_literal(b, tmp.s ? tmp.s : "", tmp.len);
    sb_free(&tmp);
}

/* const (the value v) or enum (the array v): one literal per value. */
static const char *visit_literal(struct schema_ctx *c, json_object *v, bool is_enum, const char *hint,
                                 const char *path) {
    if (is_enum && (!json_object_is_type(v, json_type_array) || json_object_array_length(v) == 0)) {
        schema_fail(c, KVLLM_EINVAL, path, "'enum' must be a non-empty array");
        return NULL;
    }
    schema_prim(c, "space");
    struct strbuf b = { 0 };
    sb_puts(&b, "(");
    size_t n = is_enum ? json_object_array_length(v) : 1;
    for (size_t i = 0; i < n; i++) {
        if (i) sb_puts(&b, " | ");
        literal_value(&b, is_enum ? json_object_array_get_idx(v, i) : v);
    }
    sb_puts(&b, ") space");
    const char *out = schema_rule_add(c, hint, b.s);
    sb_free(&b);
    return out;
}

/* ---- types ---- */

/* The rule maker of each type; boolean and null are primitives. */
static const struct {
    const char *type;
    const char *(*rule)(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen);
} k_types[] = {
    { "object", schema_object_rule }, { "array", schema_array_rule }, { "string", schema_string_rule },
    { "integer", schema_integer_rule }, { "number", schema_number_rule }, { "boolean", NULL }, { "null", NULL },
};

static const char *type_rule(struct schema_ctx *c, json_object *s, const char *t, const char *hint, char *path,
                             size_t plen) {
    for (size_t k = 0; k < sizeof k_types / sizeof *k_types; k++) {
        if (strcmp(t, k_types[k].type)) continue;
        return k_types[k].rule ? k_types[k].rule(c, s, hint, path, plen) : schema_prim(c, t);
    }
    schema_fail(c, KVLLM_EINVAL, path, "unknown type '%s'", t);
    return NULL;
}

/* The rule of s as one of types[0..n_types) (several: alternatives). */
static const char *visit_types(struct schema_ctx *c, json_object *s, const char **types, int n_types,
                               const char *hint, char *path, size_t plen) {
    struct strbuf b = { 0 };
    for (int i = 0; i < n_types && !c->rc; i++) {
        char h[160];
        snprintf(h, sizeof h, n_types > 1 ? "%.90s-%.40s" : "%.90s", hint, types[i]);
        const char *r = type_rule(c, s, types[i], h, path, plen);
        if (r) sb_printf(&b, "%s%s", i ? " | " : "", r);
    }
    const char *name = NULL;
    if (!c->rc) name = n_types == 1 ? schema_rule_find_name(c, b.s) : schema_rule_add(c, hint, b.s);
    sb_free(&b);
    return name;
}

static bool has_any(json_object *s, const char *const *keys, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (json_object_object_get_ex(s, keys[i], NULL)) return true;
    return false;
}

/* Without "type", the keywords say which (one) type is meant, as llama.cpp
 * reads them; NULL when none does (any value) or several do (c->rc set). */
static const char *infer_type(struct schema_ctx *c, json_object *s, const char *path) {
    static const char *const objk[] = { "properties", "required", "additionalProperties" };
    static const char *const arrk[] = { "items", "minItems", "maxItems" };
    static const char *const strk[] = { "pattern", "minLength", "maxLength", "format" };
    static const char *const numk[] = { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum" };
    bool obj = has_any(s, objk, 3), arr = has_any(s, arrk, 3), str = has_any(s, strk, 4), num = has_any(s, numk, 4);
    if (obj + arr + str + num > 1) {
        schema_fail(c, KVLLM_EUNSUPPORTED, path, "keywords of several types without 'type'");
        return NULL;
    }
    return obj ? "object" : arr ? "array" : str ? "string" : num ? "number" : NULL;
}

/* A schema without $ref, anyOf/oneOf, enum/const: its type(s), named or inferred. */
static const char *visit_typed(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen) {
    const char *types[8];
    int n_types = 0;
    json_object *v;
    if (json_object_object_get_ex(s, "type", &v)) {
        if (json_object_is_type(v, json_type_string)) {
            types[n_types++] = json_object_get_string(v);
        } else if (json_object_is_type(v, json_type_array)) {
            for (size_t i = 0; i < json_object_array_length(v) && n_types < 8; i++) {
                json_object *t = json_object_array_get_idx(v, i);
                if (!t) { n_types = 0; break; }   /* null: no type name at all */
                types[n_types++] = json_object_get_string(t);
            }
        }
        if (n_types == 0) {
            schema_fail(c, KVLLM_EINVAL, path, "'type' must be a string or an array of strings");
            return NULL;
        }
    } else {
        const char *t = infer_type(c, s, path);
        if (!t) return c->rc ? NULL : schema_prim(c, "value");
        types[n_types++] = t;
    }
    return visit_types(c, s, types, n_types, hint, path, plen);
}

/* ---- the walk ---- */

/* s, an object schema: by its keyword that decides the shape. */
static const char *visit_object_schema(struct schema_ctx *c, json_object *s, const char *hint, char *path,
                                       size_t plen) {
    if (!keywords_known(c, s, path, plen)) return NULL;
    json_object *v;
    if (json_object_object_get_ex(s, "$ref", &v))
        return keyword_alone(c, s, "$ref", path, plen) ? resolve_ref(c, json_object_get_string(v), path) : NULL;
    if (json_object_object_get_ex(s, "anyOf", &v))
        return visit_union(c, s, v, "anyOf", hint, path, plen);
    if (json_object_object_get_ex(s, "oneOf", &v))
        return visit_union(c, s, v, "oneOf", hint, path, plen);
    if (json_object_object_get_ex(s, "const", &v)) return visit_literal(c, v, false, hint, path);
    if (json_object_object_get_ex(s, "enum", &v)) return visit_literal(c, v, true, hint, path);
    return visit_typed(c, s, hint, path, plen);
}

const char *schema_visit(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen) {
    if (c->rc) return NULL;
    if (++c->depth > JS_MAX_DEPTH) {
        schema_fail(c, KVLLM_EUNSUPPORTED, path, "schema nested deeper than %d", JS_MAX_DEPTH);
        return NULL;
    }
    const char *out = NULL;
    if (json_object_is_type(s, json_type_boolean)) {
        if (json_object_get_boolean(s)) out = schema_prim(c, "value");
        else schema_fail(c, KVLLM_EUNSUPPORTED, path, "the schema false (nothing can match)");
    } else if (!json_object_is_type(s, json_type_object)) {
        schema_fail(c, KVLLM_EINVAL, path, "a schema must be an object or a boolean");
    } else {
        out = visit_object_schema(c, s, hint, path, plen);
    }
    c->depth--;
    return c->rc ? NULL : out;
}

/* ---- entry points ---- */

/* c->root parsed from text (nothing but whitespace after the value); 0 or c->rc. */
static int parse_schema(struct schema_ctx *c, const char *text) {
    json_tokener *tok = json_tokener_new();
    if (!tok) return KVLLM_ENOMEM;
    c->root = json_tokener_parse_ex(tok, text, (int)strlen(text));
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = tok->char_offset;
    json_tokener_free(tok);
    if (!c->root || jerr != json_tokener_success) {
        if (c->root) json_object_put(c->root);
        c->root = NULL;
        schema_fail(c, KVLLM_EINVAL, "$", "not valid JSON (%s at offset %zu)",
                    jerr == json_tokener_success ? "trailing text" : json_tokener_error_desc(jerr), end);
        return c->rc;
    }
    for (; text[end]; end++)
        if (text[end] != ' ' && text[end] != '\n' && text[end] != '\t' && text[end] != '\r') {
            json_object_put(c->root);
            c->root = NULL;
            schema_fail(c, KVLLM_EINVAL, "$", "not valid JSON (trailing text at offset %zu)", end);
            return c->rc;
        }
    return 0;
}

int kvllm_grammar_from_json_schema(const char *schema_json, bool strict, struct kvllm_grammar **out, char *err,
                                   size_t err_cap) {
    *out = NULL;
    if (err && err_cap) err[0] = 0;
    struct schema_ctx c = { .strict = strict, .err = err, .err_cap = err_cap };
    if (!schema_json) { schema_fail(&c, KVLLM_EINVAL, "$", "no schema"); return c.rc; }
    int rc = parse_schema(&c, schema_json);
    if (rc) return rc;
    char path[JS_MAX_PATH] = "$";
    const char *top = schema_visit(&c, c.root, "root-value", path, 1);
    char *gbnf = top ? schema_gbnf(&c, top) : NULL;
    json_object_put(c.root);
    schema_ctx_free(&c);
    if (!gbnf) return c.rc ? c.rc : KVLLM_ENOMEM;
    char perr[256];
    rc = gbnf_parse(gbnf, out, perr, sizeof perr);
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
    struct schema_ctx c = { 0 };
    /* any JSON object: the root is `object`, its values any JSON value */
    schema_prim(&c, "object");
    char *gbnf = schema_gbnf(&c, "object");
    schema_ctx_free(&c);
    if (!gbnf) return KVLLM_ENOMEM;
    int rc = gbnf_parse(gbnf, out, NULL, 0);
    free(gbnf);
    return rc;
}
