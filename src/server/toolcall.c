/* toolcall.c — tool calls out of generated text (see toolcall.h). */
#include "server/toolcall.h"
#include "server/schema_check.h"
#include "kvllm.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#define JSON_FLAGS (JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)

static const char k_hermes_open[] = "<tool_call>", k_hermes_close[] = "</tool_call>";
static const char k_mistral[] = "[TOOL_CALLS]", k_python_tag[] = "<|python_tag|>";

const char *toolcall_format_name(enum toolcall_format f) {
    switch (f) {
    case TOOLCALL_HERMES: return "hermes";
    case TOOLCALL_LLAMA3: return "llama3";
    case TOOLCALL_MISTRAL: return "mistral";
    default: return "none";
    }
}

int toolcall_format_from_name(const char *name) {
    for (int f = TOOLCALL_NONE; f <= TOOLCALL_MISTRAL; f++)
        if (name && !strcmp(name, toolcall_format_name((enum toolcall_format)f))) return f;
    return -1;
}

enum toolcall_format toolcall_detect(const char *tmpl) {
    if (!tmpl) return TOOLCALL_NONE;
    if (strstr(tmpl, k_mistral)) return TOOLCALL_MISTRAL;
    if (strstr(tmpl, k_hermes_open)) return TOOLCALL_HERMES;
    if (strstr(tmpl, k_python_tag) || strstr(tmpl, "\"parameters\"")) return TOOLCALL_LLAMA3;
    return TOOLCALL_NONE;
}

/* ---- the pure parse ---- */

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static const char *find(const char *s, size_t n, size_t from, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = from; i + k <= n; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

/* One JSON value at s[*i, n) (leading whitespace skipped), *i moved past
 * it; NULL when there is none. */
static json_object *json_at(const char *s, size_t n, size_t *i) {
    while (*i < n && is_ws(s[*i])) (*i)++;
    if (*i >= n) return NULL;
    json_tokener *tok = json_tokener_new();
    if (!tok) return NULL;
#ifdef JSON_TOKENER_ALLOW_TRAILING_CHARS   /* json-c 0.16: strict mode refuses text after the value */
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_ALLOW_TRAILING_CHARS);
#else
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
#endif
    json_object *o = json_tokener_parse_ex(tok, s + *i, (int)(n - *i > INT32_MAX ? INT32_MAX : n - *i));
    enum json_tokener_error e = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!o || e != json_tokener_success) { json_object_put(o); return NULL; }
    *i += used;
    return o;
}

struct calls {
    struct toolcall *v;
    int n, cap;
    bool oom;
    size_t first_cut;     /* the outside text's length when the first call was found */
};

static void calls_free(struct calls *c) {
    for (int i = 0; i < c->n; i++) { free(c->v[i].name); free(c->v[i].arguments); }
    free(c->v);
    memset(c, 0, sizeof *c);
}

/* Add o as a call if it is one ({"name": str, "arguments"|"parameters":
 * object or a string holding one}).  Returns false when it is not. */
static bool add_call(struct calls *c, json_object *o) {
    json_object *name = NULL, *args = NULL, *parsed = NULL;
    if (!o || json_object_get_type(o) != json_type_object) return false;
    if (!json_object_object_get_ex(o, "name", &name) || json_object_get_type(name) != json_type_string ||
        !json_object_get_string_len(name))
        return false;
    if (!json_object_object_get_ex(o, "arguments", &args) && !json_object_object_get_ex(o, "parameters", &args))
        return false;
    if (json_object_get_type(args) == json_type_string) {
        const char *t = json_object_get_string(args);
        size_t k = 0, n = (size_t)json_object_get_string_len(args);
        parsed = json_at(t, n, &k);
        while (k < n && is_ws(t[k])) k++;
        if (!parsed || k != n) { json_object_put(parsed); return false; }
        args = parsed;
    }
    if (json_object_get_type(args) != json_type_object) { json_object_put(parsed); return false; }
    const char *a = json_object_to_json_string_ext(args, JSON_FLAGS);
    char *nm = strdup(json_object_get_string(name)), *ar = a ? strdup(a) : NULL;
    json_object_put(parsed);
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 4;
        struct toolcall *v = realloc(c->v, (size_t)cap * sizeof *v);
        if (v) { c->v = v; c->cap = cap; }
    }
    if (!nm || !ar || c->n == c->cap) { free(nm); free(ar); c->oom = true; return true; }
    c->v[c->n++] = (struct toolcall){ nm, ar };
    return true;
}

/* Hermes: <tool_call> blocks anywhere; the text between them is content. */
static void parse_hermes(const char *s, size_t n, struct strbuf *outside, struct calls *c) {
    size_t pos = 0;
    const size_t ko = sizeof k_hermes_open - 1, kc = sizeof k_hermes_close - 1;
    for (;;) {
        const char *m = find(s, n, pos, k_hermes_open);
        if (!m) { sb_put(outside, s + pos, n - pos); return; }
        size_t at = (size_t)(m - s), body = at + ko;
        const char *close = find(s, n, body, k_hermes_close);
        size_t body_end = close ? (size_t)(close - s) : n, next = close ? body_end + kc : n;
        sb_put(outside, s + pos, at - pos);
        size_t k = body;
        json_object *o = json_at(s, body_end, &k);
        while (k < body_end && is_ws(s[k])) k++;
        bool first = c->n == 0;
        bool ok = o && k == body_end && add_call(c, o);
        json_object_put(o);
        if (ok && first) c->first_cut = outside->len;
        if (!ok) sb_put(outside, s + at, next - at);   /* not a call: text */
        pos = next;
    }
}

/* Llama 3: the whole answer is [<|python_tag|>]call[; call]...; else no calls. */
static void parse_llama3(const char *s, size_t n, struct strbuf *outside, struct calls *c) {
    size_t i = 0;
    while (i < n && is_ws(s[i])) i++;
    if (n - i >= sizeof k_python_tag - 1 && !memcmp(s + i, k_python_tag, sizeof k_python_tag - 1))
        i += sizeof k_python_tag - 1;
    struct calls got = { 0 };
    bool ok = true;
    for (;;) {
        json_object *o = json_at(s, n, &i);
        bool one = o && add_call(&got, o);
        json_object_put(o);
        if (!one) { ok = false; break; }
        while (i < n && is_ws(s[i])) i++;
        if (i == n) break;
        if (s[i] != ';') { ok = false; break; }
        i++;
        while (i < n && is_ws(s[i])) i++;
        if (i == n) break;   /* a trailing ';' */
    }
    if (!ok || got.oom) {
        c->oom |= got.oom;
        calls_free(&got);
        sb_put(outside, s, n);
        return;
    }
    *c = got;
}

/* Mistral: text, then [TOOL_CALLS] and a JSON array of calls (or one call). */
static void parse_mistral(const char *s, size_t n, struct strbuf *outside, struct calls *c) {
    const char *m = find(s, n, 0, k_mistral);
    size_t at, i;
    if (m) {
        at = (size_t)(m - s);
        i = at + sizeof k_mistral - 1;
    } else {
        /* [TOOL_CALLS] is a control token, which detokenizes to nothing:
         * an answer that is only a JSON array of calls counts too */
        at = i = 0;
        while (i < n && is_ws(s[i])) i++;
        if (i == n || s[i] != '[') { sb_put(outside, s, n); return; }
        size_t k = i;
        json_object *probe = json_at(s, n, &k);
        json_object_put(probe);
        while (k < n && is_ws(s[k])) k++;
        if (!probe || k != n) { sb_put(outside, s, n); return; }
    }
    json_object *o = json_at(s, n, &i);
    struct calls got = { 0 };
    bool ok = o != NULL;
    if (ok && json_object_get_type(o) == json_type_array) {
        size_t k = json_object_array_length(o);
        ok = k > 0;
        for (size_t j = 0; ok && j < k; j++) ok = add_call(&got, json_object_array_get_idx(o, j));
    } else if (ok) {
        ok = add_call(&got, o);
    }
    json_object_put(o);
    if (!ok || got.oom) {
        c->oom |= got.oom;
        calls_free(&got);
        sb_put(outside, s, n);
        return;
    }
    sb_put(outside, s, at);
    got.first_cut = outside->len;
    sb_put(outside, s + i, n - i);
    *c = got;
}

int toolcall_parse(enum toolcall_format f, const char *text, size_t len, struct toolcall_result *out) {
    memset(out, 0, sizeof *out);
    struct strbuf outside = { 0 };
    struct calls c = { 0 };
    switch (f) {
    case TOOLCALL_HERMES: parse_hermes(text, len, &outside, &c); break;
    case TOOLCALL_LLAMA3: parse_llama3(text, len, &outside, &c); break;
    case TOOLCALL_MISTRAL: parse_mistral(text, len, &outside, &c); break;
    default: sb_put(&outside, text, len); break;
    }
    if (c.n && !outside.oom) {
        /* with calls, the whitespace around them is not content: the text
         * before the first call loses its trailing whitespace (a stream holds
         * it back), the text after it is stripped and, if any is left, goes
         * on a line of its own */
        size_t a = c.first_cut, b = outside.len;
        while (a > 0 && is_ws(outside.s[a - 1])) a--;
        size_t t0 = c.first_cut;
        while (t0 < b && is_ws(outside.s[t0])) t0++;
        while (b > t0 && is_ws(outside.s[b - 1])) b--;
        struct strbuf joined = { 0 };
        sb_put(&joined, outside.s, a);
        if (b > t0) {
            if (a) sb_put(&joined, "\n", 1);
            sb_put(&joined, outside.s + t0, b - t0);
        }
        sb_free(&outside);
        outside = joined;
    }
    if (outside.oom || c.oom) {
        sb_free(&outside);
        calls_free(&c);
        return KVLLM_ENOMEM;
    }
    if (outside.len || !c.n) {
        out->content = sb_take(&outside);
        if (!out->content) { calls_free(&c); return KVLLM_ENOMEM; }
    }
    sb_free(&outside);
    out->calls = c.v;
    out->n_calls = c.n;
    return 0;
}

void toolcall_result_free(struct toolcall_result *r) {
    if (!r) return;
    struct calls c = { .v = r->calls, .n = r->n_calls, .cap = r->n_calls };
    calls_free(&c);
    free(r->content);
    memset(r, 0, sizeof *r);
}

/* ---- streaming ---- */

void toolcall_stream_init(struct toolcall_stream *s, enum toolcall_format f) {
    memset(s, 0, sizeof *s);
    s->f = f;
}

void toolcall_stream_deinit(struct toolcall_stream *s) {
    sb_free(&s->text);
    memset(s, 0, sizeof *s);
}

/* Where a marker could begin in s[from, n): its first occurrence (*whole
 * set), or the start of a tail that is a proper prefix of it; n when neither. */
static size_t marker_start(const char *s, size_t n, size_t from, const char *marker, bool *whole) {
    const char *m = find(s, n, from, marker);
    *whole = m != NULL;
    if (m) return (size_t)(m - s);
    size_t k = strlen(marker);
    for (size_t i = n >= k ? n - k + 1 : 0; i < n; i++)
        if (i >= from && !memcmp(s + i, marker, n - i)) return i;
    return n;
}

void toolcall_stream_push(struct toolcall_stream *s, const char *text, size_t len, struct strbuf *shown) {
    sb_put(&s->text, text, len);
    if (s->held || s->text.oom) return;
    const char *t = s->text.s ? s->text.s : "";
    size_t n = s->text.len, end = n;
    switch (s->f) {
    case TOOLCALL_HERMES: end = marker_start(t, n, s->n_shown, k_hermes_open, &s->held); break;
    case TOOLCALL_MISTRAL: {
        size_t i = 0;
        while (i < n && is_ws(t[i])) i++;
        if (i < n && t[i] == '[' && s->n_shown <= i) { s->held = true; return; }   /* maybe a bare call array */
        end = marker_start(t, n, s->n_shown, k_mistral, &s->held);
        break;
    }
    case TOOLCALL_LLAMA3: {
        /* calls only when the answer starts with one: decided on the first
         * character that is not whitespace */
        size_t i = 0;
        while (i < n && is_ws(t[i])) i++;
        if (i == n || s->n_shown > i) break;   /* all space so far, or decided: text */
        if (t[i] == '{') { s->held = true; return; }
        size_t k = sizeof k_python_tag - 1, m = n - i < k ? n - i : k;
        if (!memcmp(t + i, k_python_tag, m)) {
            s->held = m == k;
            return;   /* the tag, or maybe the tag: wait */
        }
        break;
    }
    default: break;
    }
    /* trailing whitespace may turn out to precede a call (and not be content) */
    while (end > s->n_shown && is_ws(t[end - 1])) end--;
    if (end > s->n_shown) {
        sb_put(shown, t + s->n_shown, end - s->n_shown);
        s->n_shown = end;
    }
}

int toolcall_declared(const char *tools, struct toolcall_decl **decls, int *n) {
    *decls = NULL;
    *n = 0;
    json_object *a = tools ? json_tokener_parse(tools) : NULL;
    size_t k = a && json_object_is_type(a, json_type_array) ? json_object_array_length(a) : 0;
    int rc = 0;
    if (k && !(*decls = calloc(k, sizeof **decls))) rc = KVLLM_ENOMEM;
    for (size_t i = 0; !rc && i < k; i++) {
        json_object *fn = NULL, *name = NULL, *params = NULL;
        json_object_object_get_ex(json_object_array_get_idx(a, i), "function", &fn);
        if (!json_object_object_get_ex(fn, "name", &name) || !json_object_is_type(name, json_type_string)) continue;
        json_object_object_get_ex(fn, "parameters", &params);
        struct toolcall_decl *d = &(*decls)[*n];
        if (!(d->name = strdup(json_object_get_string(name)))) { rc = KVLLM_ENOMEM; break; }
        d->params = json_object_get(params);
        (*n)++;
    }
    json_object_put(a);
    return rc;
}

void toolcall_decls_free(struct toolcall_decl *decls, int n) {
    for (int i = 0; decls && i < n; i++) {
        free(decls[i].name);
        json_object_put(decls[i].params);
    }
    free(decls);
}

/* Is call c one of decls, with arguments its parameters admit? */
static bool call_declared(const struct toolcall *c, const struct toolcall_decl *decls, int n_decls) {
    for (int i = 0; i < n_decls; i++) {
        if (strcmp(c->name, decls[i].name)) continue;
        if (!decls[i].params) return true;
        json_object *args = json_tokener_parse(c->arguments);
        bool ok = args && schema_check(decls[i].params, args, NULL, 0);
        json_object_put(args);
        return ok;
    }
    return false;
}

int toolcall_only_declared(struct toolcall_result *r, const struct toolcall_decl *decls, int n_decls, const char *text,
                           size_t len) {
    bool all = true;
    for (int k = 0; all && k < r->n_calls; k++) all = call_declared(&r->calls[k], decls, n_decls);
    if (all) return 0;
    toolcall_result_free(r);
    if (!len) return 0;
    if (!(r->content = malloc(len + 1))) return KVLLM_ENOMEM;
    memcpy(r->content, text, len);
    r->content[len] = 0;
    return 0;
}

int toolcall_stream_finish(struct toolcall_stream *s, struct strbuf *shown, struct toolcall_result *out) {
    memset(out, 0, sizeof *out);
    if (s->text.oom) return KVLLM_ENOMEM;
    int rc = toolcall_parse(s->f, s->text.s ? s->text.s : "", s->text.len, out);
    if (!rc && s->decls) rc = toolcall_only_declared(out, s->decls, s->n_decls, s->text.s ? s->text.s : "", s->text.len);
    if (rc) return rc;
    /* what was shown is a prefix of the content by construction: text before
     * any place a call could start, ending in a character that is not space */
    size_t n = out->content ? strlen(out->content) : 0;
    if (n > s->n_shown) sb_put(shown, out->content + s->n_shown, n - s->n_shown);
    s->n_shown = n;
    return 0;
}

void toolcall_make_id(enum toolcall_format f, uint64_t *state, char *out) {
    static const char k_alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    size_t n = 0, len = f == TOOLCALL_MISTRAL ? 9 : 24;
    if (f != TOOLCALL_MISTRAL) { memcpy(out, "call_", 5); n = 5; }
    for (size_t i = 0; i < len; i++) {
        /* splitmix64 */
        uint64_t x = (*state += 0x9E3779B97F4A7C15ull);
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        x ^= x >> 31;
        out[n++] = k_alnum[x % (sizeof k_alnum - 1)];
    }
    out[n] = 0;
}
