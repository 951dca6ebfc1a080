/* schema_string.c — string schemas: minLength / maxLength as a repetition
 * of JSON string characters, a format as a shared primitive, and a pattern
 * (regex.c's subset of regular expressions) as character-level rules over
 * JSON string text: a character of the pattern matches that character as
 * the JSON text spells it (a newline is the two bytes "\n"). */
#include "grammar/schema_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A string matching pattern, translated by regex.c over JSON string text
 * (a JSON Schema pattern is a search, so an unanchored side is padded with
 * any string characters). */
static const char *pattern_rule(struct schema_ctx *c, const char *pat, const char *hint, const char *path) {
    schema_prim(c, "char");
    schema_prim(c, "space");
    struct strbuf expr = { 0 }, body = { 0 };
    struct regex_anchors an;
    char err[256];
    int rc = regex_gbnf_expr(pat, strlen(pat), REGEX_JSON_STRING, &expr, &an, err, sizeof err);
    const char *name = NULL;
    if (rc) {
        schema_fail(c, rc, path, "pattern: %s", err);
    } else {
        sb_printf(&body, "\"\\\"\" %s(%s)%s \"\\\"\" space", an.start ? "" : "char* ", expr.s,
                  an.end ? "" : " char*");
        if (body.oom) schema_fail(c, KVLLM_ENOMEM, path, "out of memory");
        else name = schema_rule_add(c, hint, body.s);
    }
    sb_free(&expr);
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
