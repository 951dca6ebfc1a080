/* schema_object.c — objects and arrays.
 *
 * An object is "{" space kv ("," space kv)* "}" space with its properties in
 * the order the schema lists them, each optional one skippable, and the
 * additional properties (additionalProperties true or a schema, or absent
 * outside strict mode) after them, with keys other than the declared ones.
 * The commas are placed by two chains of rules built back to front:
 * after_k (properties k.. once something was written, each present one
 * preceded by ",") and first_k (properties k.. with nothing written yet).
 *
 * An array is "[" space (item ("," space item){min-1,max-1})? "]" space. */
#include "grammar/schema_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- keys other than a set (for additional properties) ---- */

static int cmp_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Rule for the rest of a key whose first `at` bytes are those of the
 * declared keys keys[lo..hi) (sorted bytewise, so a key that ends here
 * comes first and each next character's keys are a run): end here unless a
 * declared key ends here; or a next character of theirs and the rest; or
 * any other character and then anything.  One rule per trie node, each key
 * byte visited once per depth; the recursion is as deep as the longest key
 * (JS_MAX_KEY). */
static const char *not_keys_rule(struct schema_ctx *c, const char *const *keys, size_t lo, size_t hi, size_t at,
                                 const char *hint) {
    struct strbuf b = { 0 }, seen = { 0 };
    size_t i = lo;
    if (i < hi && !keys[i][at]) i++;
    bool first = i > lo;
    if (!first) sb_puts(&b, "\"\"");
    while (i < hi && !c->rc) {
        size_t cp_len = 0;
        const uint32_t cp = schema_utf8_next(keys[i] + at, &cp_len, strlen(keys[i] + at));
        size_t j = i + 1;
        while (j < hi && !strncmp(keys[j] + at, keys[i] + at, cp_len)) j++;
        const char *sub = not_keys_rule(c, keys, i, j, at + cp_len, hint);
        if (!sub) break;
        sb_puts(&b, first ? "" : " | ");
        first = false;
        sb_puts(&b, "[");
        schema_put_class_cp(&b, cp);
        sb_printf(&b, "] %s", sub);
        schema_put_class_cp(&seen, cp);
        i = j;
    }
    sb_puts(&b, first ? "" : " | ");
    sb_printf(&b, "[^\"\\\\\\x7F\\x00-\\x1F%s] char* | [\\\\] ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) char*",
              seen.s ? seen.s : "");
    const char *name = NULL;
    if (b.oom || seen.oom) schema_fail(c, KVLLM_ENOMEM, "$", "out of memory");
    else if (!c->rc) name = schema_rule_add(c, hint, b.s);
    sb_free(&b);
    sb_free(&seen);
    return name;
}

/* The rule of keys other than keys[0..n) (reordered), or NULL (c->rc set). */
static const char *extra_key_rule(struct schema_ctx *c, const char **keys, int n, const char *hint, const char *path) {
    for (int k = 0; k < n; k++)
        if (strlen(keys[k]) > JS_MAX_KEY) {
            schema_fail(c, KVLLM_EUNSUPPORTED, path,
                        "a property name longer than %d bytes beside additional properties", JS_MAX_KEY);
            return NULL;
        }
    qsort(keys, (size_t)n, sizeof *keys, cmp_key);
    schema_prim(c, "char");
    return not_keys_rule(c, keys, 0, (size_t)n, 0, hint);
}

/* ---- objects ---- */

/* One object being compiled: its declared properties in schema order. */
struct object_parts {
    int n;                 /* declared properties */
    const char **keys;     /* (n) their names (json-c's strings) */
    bool *required;        /* (n) */
    const char **kv;       /* (n) rule of each "key": value */
    bool allow_extra;      /* additional properties come after them */
    const char *extra;     /* rule of one additional "key": value (allow_extra) */
};

static void object_parts_free(struct object_parts *o) {
    free(o->keys);
    free(o->required);
    free(o->kv);
}

/* Refused before anything is built: an object whose optional properties
 * (and the additional ones) could each come next is wider than the matcher
 * follows (the GBNF parser would refuse it, after the whole compile). */
static bool object_fits(struct schema_ctx *c, const struct object_parts *o, const char *path) {
    int n_opt = o->allow_extra;
    for (int j = 0; j < o->n; j++) n_opt += !o->required[j];
    if (n_opt <= GRAMMAR_MAX_WIDTH) return true;
    schema_fail(c, KVLLM_ERANGE, path, "the schema is too large: %d optional properties%s, the matcher follows at "
                "most %u at once (make some required, or split the object)", n_opt - o->allow_extra,
                o->allow_extra ? " and additional ones" : "", GRAMMAR_MAX_WIDTH);
    return false;
}

/* required[j] for each name of the array req that is keys[j]; a name that
 * is not a key is refused.  0 or -1 (c->rc set). */
static int mark_required(struct schema_ctx *c, json_object *req, struct object_parts *o, const char *path) {
    struct gnames index = { 0 };
    for (int j = 0; j < o->n; j++)
        if (!gnames_put(&index, o->keys[j], strlen(o->keys[j]), (uint32_t)j)) {
            gnames_free(&index);
            schema_fail(c, KVLLM_ENOMEM, path, "out of memory");
            return -1;
        }
    for (size_t k = 0; k < json_object_array_length(req) && !c->rc; k++) {
        json_object *r = json_object_array_get_idx(req, k);
        const char *name = json_object_get_string(r);
        int64_t j = json_object_is_type(r, json_type_string) ? gnames_get(&index, name, strlen(name)) : -1;
        if (j < 0)
            schema_fail(c, KVLLM_EUNSUPPORTED, path, "required property '%s' is not in 'properties'", name ? name : "?");
        else o->required[j] = true;
    }
    gnames_free(&index);
    return c->rc ? -1 : 0;
}

/* The declared keys, which are required, whether extras are allowed; 0 or -1 (c->rc set). */
static int object_keys(struct schema_ctx *c, json_object *s, json_object *props, struct object_parts *o,
                       const char *path) {
    json_object *req = NULL, *addl = NULL;
    json_object_object_get_ex(s, "required", &req);
    bool has_addl = json_object_object_get_ex(s, "additionalProperties", &addl);
    if (props && !json_object_is_type(props, json_type_object)) {
        schema_fail(c, KVLLM_EINVAL, path, "'properties' must be an object");
        return -1;
    }
    if (req && !json_object_is_type(req, json_type_array)) {
        schema_fail(c, KVLLM_EINVAL, path, "'required' must be an array");
        return -1;
    }
    o->n = props ? json_object_object_length(props) : 0;
    o->kv = calloc((size_t)o->n + 1, sizeof *o->kv);
    o->required = calloc((size_t)o->n + 1, sizeof *o->required);
    o->keys = calloc((size_t)o->n + 1, sizeof *o->keys);
    if (!o->kv || !o->required || !o->keys) {
        schema_fail(c, KVLLM_ENOMEM, path, "out of memory");
        return -1;
    }
    schema_prim(c, "space");
    int i = 0;
    if (props) {
        json_object_object_foreach(props, key, val) {
            (void)val;
            o->keys[i++] = key;
        }
    }
    o->allow_extra = has_addl ? !(json_object_is_type(addl, json_type_boolean) && !json_object_get_boolean(addl))
                              : !c->strict;
    if ((req && mark_required(c, req, o, path)) || !object_fits(c, o, path)) return -1;
    return 0;
}

/* The rule "key" space ":" space value of each declared property; 0 or -1 (c->rc set). */
static int object_kv_rules(struct schema_ctx *c, json_object *props, struct object_parts *o, const char *hint,
                           char *path, size_t plen) {
    int i = 0;
    if (!props) return 0;
    json_object_object_foreach(props, key, val) {
        size_t pl = plen;
        schema_path_push(path, &pl, ".properties.%s", key);
        char h[160];
        snprintf(h, sizeof h, "%.90s-%.40s", hint, key);
        const char *vref = schema_visit(c, val, h, path, pl);
        path[plen] = 0;
        if (!vref) break;
        struct strbuf b = { 0 }, esc = { 0 };
        sb_puts(&esc, "\"");
        schema_put_json_escaped(&esc, key, strlen(key));
        sb_puts(&esc, "\"");
        schema_put_literal(&b, esc.s ? esc.s : "", esc.len);
        sb_printf(&b, " space \":\" space %s", vref);
        sb_free(&esc);
        snprintf(h, sizeof h, "%.90s-%.40s-kv", hint, key);
        o->kv[i] = b.oom ? NULL : schema_rule_add(c, h, b.s);
        sb_free(&b);
        if (!o->kv[i]) break;
        i++;
    }
    return c->rc ? -1 : 0;
}

/* o->extra: one additional property, a key none of the declared ones and
 * a value of additionalProperties (any value when it is true or absent);
 * 0 or -1 (c->rc set). */
static int object_extra_rule(struct schema_ctx *c, json_object *s, struct object_parts *o, const char *hint,
                             char *path, size_t plen) {
    json_object *addl = NULL;
    const char *vref;
    if (!json_object_object_get_ex(s, "additionalProperties", &addl) || json_object_is_type(addl, json_type_boolean)) {
        vref = schema_prim(c, "value");
    } else {
        size_t pl = plen;
        schema_path_push(path, &pl, "%s", ".additionalProperties");
        char h[160];
        snprintf(h, sizeof h, "%.90s-additional", hint);
        vref = schema_visit(c, addl, h, path, pl);
        path[plen] = 0;
    }
    char h[160];
    snprintf(h, sizeof h, "%.90s-extra-key", hint);
    const char **sorted = vref ? malloc(((size_t)o->n + 1) * sizeof *sorted) : NULL;
    if (sorted) memcpy(sorted, o->keys, (size_t)o->n * sizeof *sorted);
    else if (vref) schema_fail(c, KVLLM_ENOMEM, path, "out of memory");
    const char *keyrule = sorted ? extra_key_rule(c, sorted, o->n, h, path) : NULL;
    free(sorted);
    if (keyrule) {
        struct strbuf b = { 0 };
        sb_printf(&b, "\"\\\"\" %s \"\\\"\" space \":\" space %s", keyrule, vref);
        snprintf(h, sizeof h, "%.90s-extra-kv", hint);
        o->extra = b.oom ? NULL : schema_rule_add(c, h, b.s);
        sb_free(&b);
    }
    if (o->extra) return 0;
    if (!c->rc) schema_fail(c, KVLLM_ENOMEM, path, "out of memory");
    return -1;
}

/* after[k] and first[k] for property k (after[k + 1], first[k + 1] made):
 * after_k = ("," kv_k)? after_{k+1} (the "?" only when optional);
 * first_k = kv_k after_{k+1} [| first_{k+1} when optional]. */
static void object_chain_link(struct schema_ctx *c, const struct object_parts *o, int k, char **after, char **first,
                              const char *hint, const char *path) {
    struct strbuf a = { 0 }, f = { 0 };
    const char *next_after = after[k + 1] ? after[k + 1] : "", *next_first = first[k + 1] ? first[k + 1] : "";
    char h[200];
    snprintf(h, sizeof h, "%.90s-after-%.40s", hint, o->keys[k]);
    if (o->required[k]) sb_printf(&a, "\",\" space %s %s", o->kv[k], next_after);
    else sb_printf(&a, "(\",\" space %s)? %s", o->kv[k], next_after);
    const char *an = a.oom ? NULL : schema_rule_add(c, h, a.s);
    if (o->required[k]) sb_printf(&f, "%s %s", o->kv[k], next_after);
    else sb_printf(&f, "%s %s | %s", o->kv[k], next_after, next_first);
    snprintf(h, sizeof h, "%.90s-first-%.40s", hint, o->keys[k]);
    const char *fn = f.oom ? NULL : schema_rule_add(c, h, f.s);
    sb_free(&a);
    sb_free(&f);
    after[k] = an ? strdup(an) : NULL;
    first[k] = fn ? strdup(fn) : NULL;
    if (!after[k] || !first[k]) schema_fail(c, KVLLM_ENOMEM, path, "out of memory");
}

/* The object's rule: "{" space first_0 "}" space, the chains built back to front. */
static const char *object_chain(struct schema_ctx *c, const struct object_parts *o, const char *hint,
                                const char *path) {
    int n = o->n;
    char **after = calloc((size_t)n + 2, sizeof *after), **first = calloc((size_t)n + 2, sizeof *first);
    if (!after || !first) {
        free(after);
        free(first);
        schema_fail(c, KVLLM_ENOMEM, path, "out of memory");
        return NULL;
    }
    struct strbuf tail = { 0 }, ftail = { 0 };
    if (o->extra) {
        sb_printf(&tail, "(\",\" space %s)*", o->extra);
        sb_printf(&ftail, "(%s (\",\" space %s)*)?", o->extra, o->extra);
    } else {
        sb_puts(&tail, "\"\"");
        sb_puts(&ftail, "\"\"");
    }
    after[n] = tail.s;
    first[n] = ftail.s;
    for (int k = n - 1; k >= 0 && !c->rc; k--) object_chain_link(c, o, k, after, first, hint, path);
    const char *name = NULL;
    if (!c->rc) {
        struct strbuf b = { 0 };
        sb_printf(&b, "\"{\" space %s \"}\" space", first[0]);
        name = b.oom ? NULL : schema_rule_add(c, hint, b.s);
        sb_free(&b);
    }
    for (int k = 0; k <= n; k++) { free(after[k]); free(first[k]); }
    free(after);
    free(first);
    return name;
}

const char *schema_object_rule(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen) {
    json_object *props = NULL;
    json_object_object_get_ex(s, "properties", &props);
    struct object_parts o = { 0 };
    const char *name = NULL;
    if (!object_keys(c, s, props, &o, path) && !object_kv_rules(c, props, &o, hint, path, plen) &&
        (!o.allow_extra || !object_extra_rule(c, s, &o, hint, path, plen)))
        name = object_chain(c, &o, hint, path);
    object_parts_free(&o);
    return name;
}

/* ---- arrays ---- */

/* The rule of one item (any value when items is absent or true). */
static const char *array_item_rule(struct schema_ctx *c, json_object *items, long *mx, const char *hint, char *path,
                                   size_t plen) {
    if (!items || (json_object_is_type(items, json_type_boolean) && json_object_get_boolean(items)))
        return schema_prim(c, "value");
    if (json_object_is_type(items, json_type_boolean)) {   /* items: false: only [] */
        *mx = 0;
        return schema_prim(c, "value");
    }
    if (json_object_is_type(items, json_type_array)) {
        schema_fail(c, KVLLM_EUNSUPPORTED, path, "'items' as an array (tuples)");
        return NULL;
    }
    size_t pl = plen;
    schema_path_push(path, &pl, "%s", ".items");
    char h[160];
    snprintf(h, sizeof h, "%.90s-item", hint);
    const char *item = schema_visit(c, items, h, path, pl);
    path[plen] = 0;
    return item;
}

const char *schema_array_rule(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen) {
    json_object *items = NULL;
    json_object_object_get_ex(s, "items", &items);
    long mn = 0, mx = -1;
    schema_get_count(c, s, "minItems", &mn, path);
    schema_get_count(c, s, "maxItems", &mx, path);
    if (c->rc) return NULL;
    if (mn > JS_MAX_REPEAT || mx > JS_MAX_REPEAT) {
        schema_fail(c, KVLLM_EUNSUPPORTED, path, "minItems/maxItems above %d", JS_MAX_REPEAT);
        return NULL;
    }
    if (mx >= 0 && mx < mn) { schema_fail(c, KVLLM_EINVAL, path, "maxItems below minItems"); return NULL; }
    const char *item = array_item_rule(c, items, &mx, hint, path, plen);
    if (!item) return NULL;
    schema_prim(c, "space");
    struct strbuf b = { 0 }, more = { 0 };
    sb_printf(&more, "(\",\" space %s)", item);
    sb_puts(&b, "\"[\" space ");
    if (mx == 0) {
    } else if (mn == 0) {
        sb_printf(&b, "(%s ", item);
        schema_put_repeat(&b, more.s, 0, mx < 0 ? -1 : mx - 1);
        sb_puts(&b, ")?");
    } else {
        sb_printf(&b, "%s ", item);
        schema_put_repeat(&b, more.s, mn - 1, mx < 0 ? -1 : mx - 1);
    }
    sb_puts(&b, " \"]\" space");
    const char *name = b.oom ? NULL : schema_rule_add(c, hint, b.s);
    sb_free(&b);
    sb_free(&more);
    return name;
}
