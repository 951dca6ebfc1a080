/* schema_check.c — a JSON value against a JSON Schema subset (see the
 * header).  One recursive walk; each keyword is a small check in a table
 * of its own kind (types, then the keywords of numbers, strings, arrays and
 * objects, then the combinators), and the first one broken says why. */
#include "server/schema_check.h"

#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

struct walk {
    json_object *root;     /* for local $ref */
    char *why;
    size_t why_cap;
    int depth;
};

static bool broken(struct walk *w, const char *path, const char *fmt, const char *detail) {
    if (w->why && w->why_cap) {
        char what[160];
        snprintf(what, sizeof what, fmt, detail);
        snprintf(w->why, w->why_cap, "%s: %s", path, what);
    }
    return false;
}

static json_object *kw(json_object *schema, const char *key) {
    json_object *v = NULL;
    return json_object_object_get_ex(schema, key, &v) ? v : NULL;
}

static bool is_number(json_object *v) {
    return json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double);
}

/* Does v have the JSON Schema type `name`? */
static bool has_type(json_object *v, const char *name) {
    enum json_type t = json_object_get_type(v);
    if (!strcmp(name, "integer")) {
        if (t == json_type_int) return true;
        double d = t == json_type_double ? json_object_get_double(v) : NAN;
        return isfinite(d) && d == floor(d);
    }
    static const struct { const char *name; enum json_type t; } k_types[] = {
        { "string", json_type_string }, { "boolean", json_type_boolean }, { "object", json_type_object },
        { "array", json_type_array }, { "null", json_type_null },
    };
    if (!strcmp(name, "number")) return is_number(v);
    for (size_t i = 0; i < sizeof k_types / sizeof *k_types; i++)
        if (!strcmp(name, k_types[i].name)) return t == k_types[i].t;
    return true;   /* an unknown type name: not checked */
}

static bool check_type(struct walk *w, json_object *s, json_object *v, const char *path) {
    json_object *t = kw(s, "type");
    if (!t) return true;
    if (json_object_is_type(t, json_type_string))
        return has_type(v, json_object_get_string(t)) || broken(w, path, "type %s", json_object_get_string(t));
    size_t n = json_object_is_type(t, json_type_array) ? json_object_array_length(t) : 0;
    for (size_t i = 0; i < n; i++) {
        json_object *ti = json_object_array_get_idx(t, i);
        if (json_object_is_type(ti, json_type_string) && has_type(v, json_object_get_string(ti))) return true;
    }
    return !n || broken(w, path, "type %s", json_object_to_json_string_ext(t, JSON_C_TO_STRING_PLAIN));
}

static bool equal(json_object *a, json_object *b) { return json_object_equal(a, b) == 1; }

static bool check_enum(struct walk *w, json_object *s, json_object *v, const char *path) {
    json_object *c = kw(s, "const"), *e = kw(s, "enum");
    if (c && !equal(c, v)) return broken(w, path, "const %s", json_object_to_json_string_ext(c, JSON_C_TO_STRING_PLAIN));
    size_t n = e && json_object_is_type(e, json_type_array) ? json_object_array_length(e) : 0;
    for (size_t i = 0; i < n; i++)
        if (equal(json_object_array_get_idx(e, i), v)) return true;
    return !n || broken(w, path, "enum %s", json_object_to_json_string_ext(e, JSON_C_TO_STRING_PLAIN));
}

static bool check_number(struct walk *w, json_object *s, json_object *v, const char *path) {
    if (!is_number(v)) return true;
    static const struct { const char *key; int sign; bool strict; } k_bounds[] = {
        { "minimum", 1, false }, { "maximum", -1, false }, { "exclusiveMinimum", 1, true }, { "exclusiveMaximum", -1, true },
    };
    double x = json_object_get_double(v);
    for (size_t i = 0; i < sizeof k_bounds / sizeof *k_bounds; i++) {
        json_object *b = kw(s, k_bounds[i].key);
        if (!b || !is_number(b)) continue;
        double d = (x - json_object_get_double(b)) * k_bounds[i].sign;
        if (d < 0 || (k_bounds[i].strict && d == 0)) return broken(w, path, "%s", k_bounds[i].key);
    }
    return true;
}

/* Code points of a UTF-8 string (continuation bytes not counted). */
static size_t n_code_points(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* minLength / maxLength, minItems / maxItems, minProperties / maxProperties: count against a pair of keywords. */
static bool check_count(struct walk *w, json_object *s, size_t n, const char *lo, const char *hi, const char *path) {
    json_object *a = kw(s, lo), *b = kw(s, hi);
    if (a && json_object_is_type(a, json_type_int) && (int64_t)n < json_object_get_int64(a)) return broken(w, path, "%s", lo);
    if (b && json_object_is_type(b, json_type_int) && (int64_t)n > json_object_get_int64(b)) return broken(w, path, "%s", hi);
    return true;
}

static bool walk(struct walk *w, json_object *s, json_object *v, const char *path);

static bool check_array(struct walk *w, json_object *s, json_object *v, const char *path) {
    if (!json_object_is_type(v, json_type_array)) return true;
    size_t n = json_object_array_length(v);
    if (!check_count(w, s, n, "minItems", "maxItems", path)) return false;
    json_object *items = kw(s, "items");
    if (!items || json_object_is_type(items, json_type_array)) return true;   /* tuples: not checked */
    for (size_t i = 0; i < n; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s[%zu]", path, i);
        if (!walk(w, items, json_object_array_get_idx(v, i), p)) return false;
    }
    return true;
}

static bool check_object(struct walk *w, json_object *s, json_object *v, const char *path) {
    if (!json_object_is_type(v, json_type_object)) return true;
    if (!check_count(w, s, (size_t)json_object_object_length(v), "minProperties", "maxProperties", path)) return false;
    json_object *props = kw(s, "properties"), *req = kw(s, "required"), *add = kw(s, "additionalProperties");
    size_t n_req = req && json_object_is_type(req, json_type_array) ? json_object_array_length(req) : 0;
    for (size_t i = 0; i < n_req; i++) {
        json_object *k = json_object_array_get_idx(req, i);
        if (json_object_is_type(k, json_type_string) && !kw(v, json_object_get_string(k)))
            return broken(w, path, "required property '%.60s' missing", json_object_get_string(k));
    }
    json_object_object_foreach(v, key, val) {
        char p[256];
        snprintf(p, sizeof p, "%s.%.80s", path, key);
        json_object *ps = props && json_object_is_type(props, json_type_object) ? kw(props, key) : NULL;
        if (ps && !walk(w, ps, val, p)) return false;
        if (ps || !add) continue;
        if (json_object_is_type(add, json_type_boolean)) {
            if (!json_object_get_boolean(add)) return broken(w, p, "%s", "not a declared property (additionalProperties false)");
        } else if (!walk(w, add, val, p)) {
            return false;
        }
    }
    return true;
}

/* anyOf: one branch; oneOf: exactly one; allOf: every one. */
static bool check_combinators(struct walk *w, json_object *s, json_object *v, const char *path) {
    static const char *const k_keys[] = { "anyOf", "oneOf", "allOf" };
    for (int k = 0; k < 3; k++) {
        json_object *a = kw(s, k_keys[k]);
        size_t n = a && json_object_is_type(a, json_type_array) ? json_object_array_length(a) : 0;
        if (!n) continue;
        size_t ok = 0;
        for (size_t i = 0; i < n; i++) ok += walk(w, json_object_array_get_idx(a, i), v, path);
        bool pass = k == 0 ? ok > 0 : k == 1 ? ok == 1 : ok == n;
        if (!pass) return broken(w, path, "%s", k_keys[k]);
    }
    return true;
}

/* "#/$defs/name" or "#/definitions/name" in the root schema (NULL: not found or not local). */
static json_object *resolve(struct walk *w, const char *ref) {
    static const char *const k_defs[] = { "$defs", "definitions" };
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(k_defs[i]);
        if (strncmp(ref, "#/", 2) || strncmp(ref + 2, k_defs[i], n) || ref[2 + n] != '/') continue;
        json_object *defs = kw(w->root, k_defs[i]);
        return defs ? kw(defs, ref + 3 + n) : NULL;
    }
    return !strcmp(ref, "#") ? w->root : NULL;
}

static bool walk(struct walk *w, json_object *s, json_object *v, const char *path) {
    if (!s || json_object_is_type(s, json_type_boolean))
        return !s || json_object_get_boolean(s) || broken(w, path, "%s", "the schema false admits nothing");
    if (!json_object_is_type(s, json_type_object)) return true;
    if (++w->depth > SCHEMA_CHECK_DEPTH) return broken(w, path, "%s", "nested too deep");
    json_object *ref = kw(s, "$ref");
    bool ok;
    if (ref && json_object_is_type(ref, json_type_string)) {
        json_object *target = resolve(w, json_object_get_string(ref));
        ok = !target || walk(w, target, v, path);   /* a remote $ref is not checked */
    } else {
        ok = check_type(w, s, v, path) && check_enum(w, s, v, path) && check_number(w, s, v, path) &&
             (!json_object_is_type(v, json_type_string) ||
              check_count(w, s, n_code_points(json_object_get_string(v)), "minLength", "maxLength", path)) &&
             check_array(w, s, v, path) && check_object(w, s, v, path) && check_combinators(w, s, v, path);
    }
    w->depth--;
    return ok;
}

bool schema_check(json_object *schema, json_object *v, char *why, size_t why_cap) {
    struct walk w = { .root = schema, .why = why, .why_cap = why_cap };
    if (why && why_cap) *why = 0;
    return walk(&w, schema, v, "$");
}
