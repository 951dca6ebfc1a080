/* openai_parse.c — /v1/completions and /v1/chat/completions bodies into
 * struct oai_request (json-c).
 *
 * Parsing copies what it needs out of the JSON tree, so the tree is freed
 * before anything reaches the engine.  Every field is type- and range-checked
 * with a message naming it.  No field is accepted and then ignored: the
 * fields read here are honoured (docs/CLI.md lists them; `user` is metadata
 * that cannot change the output), and fields of OpenAI, vLLM and
 * llama-server that would change the output but are not implemented are
 * refused with a 400 unless they hold their neutral value (k_refused).
 * Other unknown fields are ignored, as OpenAI-compatible servers do. */
#include "server/openai.h"

#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_FLAGS (JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)
#define MAX_DEPTH 64

/* ---- errors ---- */

int oai_error_set(struct oai_error *e, unsigned status, const char *code, const char *param, const char *fmt, ...) {
    e->status = status;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* A 400 about `param`. */
#define fail(e, param, ...) oai_error_set((e), 400, NULL, (param), __VA_ARGS__)

/* ---- typed field access: absent and null mean "not given" ---- */

static json_object *field(json_object *o, const char *key) {
    json_object *v = NULL;
    json_object_object_get_ex(o, key, &v);
    return v; /* NULL for absent and for JSON null */
}

static const char *type_name(json_object *v) {
    switch (json_object_get_type(v)) {
    case json_type_boolean: return "a boolean";
    case json_type_double: case json_type_int: return "a number";
    case json_type_string: return "a string";
    case json_type_array: return "an array";
    case json_type_object: return "an object";
    default: return "null";
    }
}

/* An integer in [lo, hi] (a number with an integral value is accepted, as
 * Python clients may send 16.0).  Returns 1 if given, 0 if not, -1 on error. */
static int get_int(json_object *o, const char *key, int64_t lo, int64_t hi, int64_t *out, struct oai_error *e) {
    json_object *v = field(o, key);
    if (!v) return 0;
    enum json_type t = json_object_get_type(v);
    if (t == json_type_int) {
        /* json-c keeps values past INT64_MAX as uint64; get_int64 saturates them */
        int64_t x = json_object_get_int64(v);
        if (x < lo || x > hi)
            return fail(e, key, "'%s' must be an integer in [%lld, %lld], got %s", key, (long long)lo, (long long)hi,
                        json_object_to_json_string_ext(v, JSON_FLAGS));
        *out = x;
        return 1;
    }
    if (t == json_type_double) {
        double d = json_object_get_double(v);
        if (!isfinite(d) || d != floor(d))
            return fail(e, key, "'%s' must be an integer, got %s", key, json_object_to_json_string_ext(v, JSON_FLAGS));
        if (d < (double)lo || d > (double)hi)
            return fail(e, key, "'%s' must be an integer in [%lld, %lld], got %g", key, (long long)lo, (long long)hi, d);
        *out = (int64_t)d;
        return 1;
    }
    return fail(e, key, "'%s' must be an integer, not %s", key, type_name(v));
}

/* A finite number in [lo, hi] (lo excluded when lo_open). */
static int get_num(json_object *o, const char *key, double lo, double hi, bool lo_open, double *out,
                   struct oai_error *e) {
    json_object *v = field(o, key);
    if (!v) return 0;
    enum json_type t = json_object_get_type(v);
    if (t != json_type_int && t != json_type_double)
        return fail(e, key, "'%s' must be a number, not %s", key, type_name(v));
    double d = json_object_get_double(v);
    if (!isfinite(d) || d > hi || d < lo || (lo_open && d == lo))
        return fail(e, key, "'%s' must be a number in %s%g, %g], got %s", key, lo_open ? "(" : "[", lo, hi,
                    json_object_to_json_string_ext(v, JSON_FLAGS));
    *out = d;
    return 1;
}

static int get_bool(json_object *o, const char *key, bool *out, struct oai_error *e) {
    json_object *v = field(o, key);
    if (!v) return 0;
    if (json_object_get_type(v) != json_type_boolean)
        return fail(e, key, "'%s' must be a boolean, not %s", key, type_name(v));
    *out = json_object_get_boolean(v);
    return 1;
}

/* A copy of a JSON string value: no NUL inside (the engine takes C strings).
 * The body was checked as UTF-8, but escapes (a lone \ud800) can still
 * decode to ill-formed bytes: check again. */
static int copy_str(json_object *v, const char *what, char **out, size_t *len, struct oai_error *e) {
    if (json_object_get_type(v) != json_type_string)
        return fail(e, what, "'%s' must be a string, not %s", what, type_name(v));
    const char *s = json_object_get_string(v);
    size_t n = (size_t)json_object_get_string_len(v);
    if (memchr(s, 0, n)) return fail(e, what, "'%s' contains a NUL character", what);
    if (!utf8_valid(s, n)) return fail(e, what, "'%s' is not valid UTF-8 (an unpaired surrogate escape?)", what);
    if (!(*out = malloc(n + 1))) { e->status = 500; snprintf(e->message, sizeof e->message, "out of memory"); return -1; }
    memcpy(*out, s, n + 1);
    if (len) *len = n;
    return 1;
}


static int oom(struct oai_error *e) {
    e->status = 500;
    e->param[0] = 0;
    snprintf(e->message, sizeof e->message, "out of memory");
    return -1;
}

/* ---- prompts and messages ---- */

static int parse_ids(json_object *a, const char *what, struct oai_prompt *p, struct oai_error *e) {
    size_t n = json_object_array_length(a);
    if (!n) return fail(e, what, "'%s' has an empty token list", what);
    if (!(p->ids = malloc(n * sizeof *p->ids))) return oom(e);
    p->n_ids = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_object *v = json_object_array_get_idx(a, i);
        if (json_object_get_type(v) != json_type_int)
            return fail(e, what, "'%s' must be a string, a list of strings, a list of token ids (integers) or a "
                        "list of such lists; element %zu is %s", what, i, type_name(v));
        int64_t x = json_object_get_int64(v);
        if (x < 0 || x > INT32_MAX) return fail(e, what, "token id %lld at index %zu is out of range", (long long)x, i);
        p->ids[i] = (int32_t)x;
    }
    return 0;
}

static int parse_prompt(json_object *root, struct oai_request *r, struct oai_error *e) {
    json_object *v = field(root, "prompt");
    if (!v) return fail(e, "prompt", "'prompt' is required");
    if (json_object_get_type(v) == json_type_string) {
        if (!(r->prompts = calloc(1, sizeof *r->prompts))) return oom(e);
        r->n_prompts = 1;
        return copy_str(v, "prompt", &r->prompts[0].text, &r->prompts[0].len, e) < 0 ? -1 : 0;
    }
    if (json_object_get_type(v) != json_type_array)
        return fail(e, "prompt", "'prompt' must be a string or a list, not %s", type_name(v));
    size_t n = json_object_array_length(v);
    if (!n) return fail(e, "prompt", "'prompt' is an empty list");
    json_object *first = json_object_array_get_idx(v, 0);
    if (json_object_get_type(first) == json_type_int) {    /* one prompt of token ids */
        if (!(r->prompts = calloc(1, sizeof *r->prompts))) return oom(e);
        r->n_prompts = 1;
        return parse_ids(v, "prompt", r->prompts, e);
    }
    if (n > OAI_MAX_PROMPTS) return fail(e, "prompt", "at most %d prompts per request, got %zu", OAI_MAX_PROMPTS, n);
    if (!(r->prompts = calloc(n, sizeof *r->prompts))) return oom(e);
    r->n_prompts = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_object *p = json_object_array_get_idx(v, i);
        if (json_object_get_type(p) == json_type_string) {
            if (copy_str(p, "prompt", &r->prompts[i].text, &r->prompts[i].len, e) < 0) return -1;
        } else if (json_object_get_type(p) == json_type_array) {
            if (parse_ids(p, "prompt", &r->prompts[i], e)) return -1;
        } else {
            return fail(e, "prompt", "'prompt' must be a string, a list of strings, a list of token ids or a list "
                        "of token-id lists; element %zu is %s", i, type_name(p));
        }
    }
    return 0;
}

/* content: a string, or a list of {"type": "text", "text": ...} parts
 * (concatenated); null only for an assistant turn. */
static int parse_content(json_object *m, size_t i, const char *role, char **out, struct oai_error *e) {
    json_object *c = field(m, "content");
    if (!c) {
        if (!strcmp(role, "assistant")) { *out = strdup(""); return *out ? 0 : oom(e); }
        return fail(e, "messages", "messages[%zu].content is required", i);
    }
    if (json_object_get_type(c) == json_type_string) return copy_str(c, "messages.content", out, NULL, e) < 0 ? -1 : 0;
    if (json_object_get_type(c) != json_type_array)
        return fail(e, "messages", "messages[%zu].content must be a string or a list of parts, not %s", i,
                    type_name(c));
    struct strbuf b = { 0 };
    sb_put(&b, "", 0);
    for (size_t k = 0; k < json_object_array_length(c); k++) {
        json_object *part = json_object_array_get_idx(c, k), *t = NULL, *txt = NULL;
        if (json_object_get_type(part) != json_type_object || !(t = field(part, "type")) ||
            json_object_get_type(t) != json_type_string) {
            sb_free(&b);
            return fail(e, "messages", "messages[%zu].content[%zu] must be an object with a 'type'", i, k);
        }
        if (strcmp(json_object_get_string(t), "text")) {
            sb_free(&b);
            return fail(e, "messages", "messages[%zu].content[%zu]: only text parts are supported, not '%s'", i, k,
                        json_object_get_string(t));
        }
        char *s = NULL;
        if (!(txt = field(part, "text")) || copy_str(txt, "messages.content.text", &s, NULL, e) < 0) {
            sb_free(&b);
            return txt ? -1 : fail(e, "messages", "messages[%zu].content[%zu].text is required", i, k);
        }
        sb_puts(&b, s);
        free(s);
    }
    if (!(*out = sb_take(&b))) return oom(e);
    return 0;
}

/* ---- tool calling: tools, tool_choice, and the tool fields of messages ---- */

#define OAI_MAX_TOOLS 128

/* A function name as OpenAI allows it: [a-zA-Z0-9_-], 1 to 64 characters. */
static bool function_name_ok(const char *s, size_t n) {
    if (n < 1 || n > 64) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

/* A string field of o copied into *out (absent or null: left NULL). */
static int opt_str(json_object *o, const char *key, const char *what, char **out, struct oai_error *e) {
    json_object *v = field(o, key);
    return v ? (copy_str(v, what, out, NULL, e) < 0 ? -1 : 0) : 0;
}

/* An assistant message's tool_calls ([{"id", "type": "function", "function":
 * {"name", "arguments"}}]) kept as JSON text for the template; a tool
 * message's tool_call_id and name.  An assistant turn that only calls has
 * content None, as the client sent it. */
static int parse_message_tools(json_object *m, size_t i, const char *role, struct kvllm_chat_message *msg,
                               struct oai_error *e) {
    json_object *tc = field(m, "tool_calls");
    if (tc && !strcmp(role, "assistant")) {
        if (json_object_get_type(tc) != json_type_array)
            return fail(e, "messages", "messages[%zu].tool_calls must be a list, not %s", i, type_name(tc));
        size_t n = json_object_array_length(tc);
        for (size_t k = 0; k < n; k++) {
            json_object *c = json_object_array_get_idx(tc, k), *fn, *name, *args;
            if (json_object_get_type(c) != json_type_object || !(fn = field(c, "function")) ||
                json_object_get_type(fn) != json_type_object)
                return fail(e, "messages", "messages[%zu].tool_calls[%zu] must be an object with a 'function' object",
                            i, k);
            if (!(name = field(fn, "name")) || json_object_get_type(name) != json_type_string)
                return fail(e, "messages", "messages[%zu].tool_calls[%zu].function.name must be a string", i, k);
            args = field(fn, "arguments");
            if (args && json_object_get_type(args) != json_type_string && json_object_get_type(args) != json_type_object)
                return fail(e, "messages", "messages[%zu].tool_calls[%zu].function.arguments must be a string", i, k);
        }
        if (n) {
            const char *t = json_object_to_json_string_ext(tc, JSON_FLAGS);
            if (!t || !(msg->tool_calls = strdup(t))) return oom(e);
            json_object *c = field(m, "content");
            if (!c || (json_object_get_type(c) == json_type_string && !json_object_get_string_len(c))) {
                free((char *)msg->content);   /* "" from parse_content: the template sees None */
                msg->content = NULL;
            }
        }
    } else if (tc && json_object_get_type(tc) != json_type_array) {
        return fail(e, "messages", "messages[%zu].tool_calls must be a list, not %s", i, type_name(tc));
    }
    char *s = NULL;
    if (opt_str(m, "tool_call_id", "messages.tool_call_id", &s, e)) return -1;
    msg->tool_call_id = s;
    s = NULL;
    if (opt_str(m, "name", "messages.name", &s, e)) return -1;
    msg->name = s;
    return 0;
}

/* `tools`: [{"type": "function", "function": {"name", "description",
 * "parameters", "strict"}}], checked and kept as JSON text. */
static int parse_tools(json_object *root, struct oai_request *r, struct oai_error *e) {
    json_object *v = field(root, "tools");
    if (!v) return 0;
    if (json_object_get_type(v) != json_type_array)
        return fail(e, "tools", "'tools' must be a list, not %s", type_name(v));
    size_t n = json_object_array_length(v);
    if (!n) return 0;
    if (n > OAI_MAX_TOOLS) return fail(e, "tools", "at most %d tools, got %zu", OAI_MAX_TOOLS, n);
    for (size_t k = 0; k < n; k++) {
        json_object *t = json_object_array_get_idx(v, k), *type, *fn, *name, *x;
        if (json_object_get_type(t) != json_type_object)
            return fail(e, "tools", "tools[%zu] must be an object, not %s", k, type_name(t));
        if (!(type = field(t, "type")) || json_object_get_type(type) != json_type_string ||
            strcmp(json_object_get_string(type), "function"))
            return fail(e, "tools", "tools[%zu].type must be \"function\"", k);
        if (!(fn = field(t, "function")) || json_object_get_type(fn) != json_type_object)
            return fail(e, "tools", "tools[%zu].function must be an object", k);
        if (!(name = field(fn, "name")) || json_object_get_type(name) != json_type_string ||
            !function_name_ok(json_object_get_string(name), (size_t)json_object_get_string_len(name)))
            return fail(e, "tools", "tools[%zu].function.name must be a string of 1 to 64 letters, digits, '_' or '-'",
                        k);
        for (size_t j = 0; j < k; j++) {
            json_object *o = field(field(json_object_array_get_idx(v, j), "function"), "name");
            if (!strcmp(json_object_get_string(o), json_object_get_string(name)))
                return fail(e, "tools", "tools[%zu]: the function '%s' is defined twice", k, json_object_get_string(name));
        }
        if ((x = field(fn, "description")) && json_object_get_type(x) != json_type_string)
            return fail(e, "tools", "tools[%zu].function.description must be a string", k);
        if ((x = field(fn, "parameters")) && json_object_get_type(x) != json_type_object)
            return fail(e, "tools", "tools[%zu].function.parameters must be a JSON Schema object", k);
        if ((x = field(fn, "strict")) && json_object_get_type(x) != json_type_boolean)
            return fail(e, "tools", "tools[%zu].function.strict must be a boolean", k);
    }
    const char *t = json_object_to_json_string_ext(v, JSON_FLAGS);
    if (!t || !(r->tools = strdup(t))) return oom(e);
    r->n_tools = (int)n;
    return 0;
}

/* tool_choice: "none" | "auto" | "required" | {"type": "function",
 * "function": {"name"}} (a function of `tools`); parallel_tool_calls. */
static int parse_tool_choice(json_object *root, struct oai_request *r, struct oai_error *e) {
    json_object *v = field(root, "tool_choice");
    r->tool_choice = r->tools ? OAI_TOOL_AUTO : OAI_TOOL_NONE;
    r->parallel_tool_calls = true;
    if (get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, e) < 0) return -1;
    if (!v) return 0;
    if (json_object_get_type(v) == json_type_string) {
        const char *s = json_object_get_string(v);
        if (!strcmp(s, "none")) r->tool_choice = OAI_TOOL_NONE;
        else if (!strcmp(s, "auto")) r->tool_choice = r->tools ? OAI_TOOL_AUTO : OAI_TOOL_NONE;
        else if (!strcmp(s, "required")) r->tool_choice = OAI_TOOL_REQUIRED;
        else return fail(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    } else if (json_object_get_type(v) == json_type_object) {
        json_object *type = field(v, "type"), *fn = field(v, "function"), *name = fn ? field(fn, "name") : NULL;
        if (!type || json_object_get_type(type) != json_type_string || strcmp(json_object_get_string(type), "function") ||
            !name || json_object_get_type(name) != json_type_string)
            return fail(e, "tool_choice", "a named 'tool_choice' is {\"type\": \"function\", \"function\": "
                        "{\"name\": ...}}");
        if (copy_str(name, "tool_choice", &r->tool_name, NULL, e) < 0) return -1;
        r->tool_choice = OAI_TOOL_NAMED;
    } else {
        return fail(e, "tool_choice", "'tool_choice' must be a string or an object, not %s", type_name(v));
    }
    if ((r->tool_choice == OAI_TOOL_REQUIRED || r->tool_choice == OAI_TOOL_NAMED) && !r->tools)
        return fail(e, "tool_choice", "'tool_choice' %s needs 'tools'",
                    r->tool_choice == OAI_TOOL_NAMED ? "naming a function" : "\"required\"");
    if (r->tool_choice == OAI_TOOL_NAMED) {
        json_object *tools = field(root, "tools");
        bool found = false;
        for (size_t k = 0; k < json_object_array_length(tools) && !found; k++)
            found = !strcmp(json_object_get_string(field(field(json_object_array_get_idx(tools, k), "function"), "name")),
                            r->tool_name);
        if (!found) return fail(e, "tool_choice", "'tool_choice' names the function '%s', which is not in 'tools'",
                                r->tool_name);
    }
    return 0;
}

static int parse_messages(json_object *root, struct oai_request *r, struct oai_error *e) {
    static const char *const roles[] = { "system", "developer", "user", "assistant", "tool" };
    json_object *v = field(root, "messages");
    if (!v) return fail(e, "messages", "'messages' is required");
    if (json_object_get_type(v) != json_type_array)
        return fail(e, "messages", "'messages' must be a list, not %s", type_name(v));
    size_t n = json_object_array_length(v);
    if (!n) return fail(e, "messages", "'messages' is empty");
    if (n > 4096) return fail(e, "messages", "at most 4096 messages, got %zu", n);
    if (!(r->msgs = calloc(n, sizeof *r->msgs))) return oom(e);
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(v, i), *role;
        if (json_object_get_type(m) != json_type_object)
            return fail(e, "messages", "messages[%zu] must be an object, not %s", i, type_name(m));
        if (!(role = field(m, "role")) || json_object_get_type(role) != json_type_string)
            return fail(e, "messages", "messages[%zu].role must be a string", i);
        const char *rs = json_object_get_string(role);
        size_t k = 0;
        while (k < sizeof roles / sizeof *roles && strcmp(rs, roles[k])) k++;
        if (k == sizeof roles / sizeof *roles)
            return fail(e, "messages", "messages[%zu].role must be one of system, developer, user, assistant, "
                        "tool", i);
        r->n_msgs++;
        char *content = NULL;
        r->msgs[i].role = roles[k];
        if (parse_content(m, i, roles[k], &content, e)) return -1;
        r->msgs[i].content = content;
        if (parse_message_tools(m, i, roles[k], &r->msgs[i], e)) return -1;
    }
    return 0;
}

static int parse_stop(json_object *root, struct oai_request *r, struct oai_error *e) {
    json_object *v = field(root, "stop");
    if (!v) return 0;
    bool one = json_object_get_type(v) == json_type_string;
    if (!one && json_object_get_type(v) != json_type_array)
        return fail(e, "stop", "'stop' must be a string or a list of strings, not %s", type_name(v));
    size_t n = one ? 1 : json_object_array_length(v);
    if (n > OAI_MAX_STOP) return fail(e, "stop", "at most %d stop strings, got %zu", OAI_MAX_STOP, n);
    if (!n) return 0;
    if (!(r->stop = calloc(n, sizeof *r->stop))) return oom(e);
    for (size_t i = 0; i < n; i++) {
        size_t len;
        if (copy_str(one ? v : json_object_array_get_idx(v, i), "stop", &r->stop[i], &len, e) < 0) return -1;
        r->n_stop++;
        /* an empty stop string would match before every token (OpenAI refuses it too) */
        if (!len) return fail(e, "stop", "stop strings must not be empty ('stop' entry %zu is \"\")", i);
    }
    return 0;
}

/* Fields of OpenAI, vLLM and llama-server that would change the output if
 * ignored, and their neutral values: refused unless absent, null or neutral
 * (clients such as llama.cpp's web UI send the neutral values). */
static const struct {
    const char *key;
    enum json_type type;   /* the type of the neutral value: boolean or double (numbers), else "empty" */
    double neutral;
    const char *instead;   /* what to use instead, or "" */
} k_refused[] = {
    { "typical_p", json_type_double, 1, "" },
    { "tfs_z", json_type_double, 1, "" },
    { "mirostat", json_type_double, 0, "" },
    { "dynatemp_range", json_type_double, 0, "" },
    { "dry_multiplier", json_type_double, 0, "" },
    { "xtc_probability", json_type_double, 0, "" },
    { "top_n_sigma", json_type_double, -1, "" },
    { "n_probs", json_type_double, 0, "; use 'logprobs'" },
    { "min_keep", json_type_double, 0, "" },
    { "n_indent", json_type_double, 0, "" },
    { "t_max_predict_ms", json_type_double, 0, "" },
    { "length_penalty", json_type_double, 1, "" },
    { "use_beam_search", json_type_boolean, 0, "" },
    { "post_sampling_probs", json_type_boolean, 0, "" },
    { "prompt_logprobs", json_type_null, 0, "" },
    { "truncate_prompt_tokens", json_type_null, 0, "" },
    { "bad_words", json_type_null, 0, "; use 'logit_bias' with -100" },
    { "allowed_token_ids", json_type_null, 0, "; use 'logit_bias'" },
    { "logits_processors", json_type_null, 0, "" },
    { "samplers", json_type_null, 0, "" },
    { "guided_whitespace_pattern", json_type_null, 0, "" },
};

/* A refused field's value is neutral: a number or boolean equal to the
 * neutral one, or an empty string, list or object. */
static bool neutral(json_object *v, enum json_type want, double n) {
    enum json_type t = json_object_get_type(v);
    if (want == json_type_double && (t == json_type_int || t == json_type_double))
        return json_object_get_double(v) == n;
    if (want == json_type_boolean && t == json_type_boolean) return json_object_get_boolean(v) == (n != 0);
    if (t == json_type_string) return json_object_get_string_len(v) == 0;
    if (t == json_type_array) return json_object_array_length(v) == 0;
    if (t == json_type_object) return json_object_object_length(v) == 0;
    return false;
}

/* Fields that would change the output if ignored: refuse them. */
static int refuse_unsupported(json_object *root, bool chat, struct oai_error *e) {
    json_object *v;
    if (!chat) {
        if ((v = field(root, "suffix")) && !(json_object_get_type(v) == json_type_string && !json_object_get_string_len(v)))
            return fail(e, "suffix", "'suffix' is not supported");
    }
    for (size_t i = 0; i < sizeof k_refused / sizeof *k_refused; i++)
        if ((v = field(root, k_refused[i].key)) && !neutral(v, k_refused[i].type, k_refused[i].neutral))
            return fail(e, k_refused[i].key, "'%s' is not supported%s", k_refused[i].key, k_refused[i].instead);
    return 0;
}

/* Compile a JSON Schema (a JSON value) for `what`; a schema the compiler
 * refuses is a 400 naming the field and the schema's path. */
static int compile_schema(json_object *schema, bool strict, const char *param, const char *what,
                          struct kvllm_grammar **g, struct oai_error *e) {
    enum json_type t = json_object_get_type(schema);
    if (schema && t != json_type_object && t != json_type_boolean)
        return fail(e, param, "%s must be a JSON Schema (an object), not %s", what, type_name(schema));
    const char *text = schema ? json_object_to_json_string_ext(schema, JSON_FLAGS) : "{}";
    if (!text) return oom(e);
    char msg[384] = "";
    int rc = kvllm_grammar_from_json_schema(text, strict, g, msg, sizeof msg);
    if (rc == KVLLM_ENOMEM) return oom(e);
    if (rc) return fail(e, param, "%s: %s", what, *msg ? msg : kvllm_strerror(rc));
    return 0;
}

/* A GBNF grammar (a string) for `param`. */
static int compile_gbnf(json_object *gb, const char *param, struct kvllm_grammar **g, struct oai_error *e) {
    if (json_object_get_type(gb) != json_type_string)
        return fail(e, param, "'%s' must be a string (GBNF), not %s", param, type_name(gb));
    char msg[384] = "";
    int rc = kvllm_grammar_from_gbnf(json_object_get_string(gb), g, msg, sizeof msg);
    if (rc == KVLLM_ENOMEM) return oom(e);
    if (rc) return fail(e, param, "%s: %s", param, *msg ? msg : kvllm_strerror(rc));
    return 0;
}

/* A regular expression the whole output must match (vLLM's guided_regex). */
static int compile_regex(json_object *v, const char *param, struct kvllm_grammar **g, struct oai_error *e) {
    if (json_object_get_type(v) != json_type_string)
        return fail(e, param, "'%s' must be a string (a regular expression), not %s", param, type_name(v));
    char msg[384] = "";
    int rc = kvllm_grammar_from_regex(json_object_get_string(v), g, msg, sizeof msg);
    if (rc == KVLLM_ENOMEM) return oom(e);
    if (rc) return fail(e, param, "%s: %s", param, *msg ? msg : kvllm_strerror(rc));
    return 0;
}

/* One of a list of strings (vLLM's guided_choice). */
static int compile_choice(json_object *v, const char *param, struct kvllm_grammar **g, struct oai_error *e) {
    size_t n = json_object_get_type(v) == json_type_array ? json_object_array_length(v) : 0;
    if (!n || n > OAI_MAX_CHOICES)
        return fail(e, param, "'%s' must be a list of 1 to %d strings", param, OAI_MAX_CHOICES);
    const char **ch = malloc(n * sizeof *ch);
    if (!ch) return oom(e);
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(v, i);
        if (json_object_get_type(c) != json_type_string) {
            free(ch);
            return fail(e, param, "%s[%zu] must be a string, not %s", param, i, type_name(c));
        }
        ch[i] = json_object_get_string(c);
    }
    char msg[384] = "";
    int rc = kvllm_grammar_from_choices(ch, (int)n, g, msg, sizeof msg);
    free(ch);
    if (rc == KVLLM_ENOMEM) return oom(e);
    if (rc) return fail(e, param, "%s: %s", param, *msg ? msg : kvllm_strerror(rc));
    return 0;
}

/* vLLM's guided_json: a schema, or its JSON text. */
static int compile_guided_json(json_object *v, const char *param, struct kvllm_grammar **g, struct oai_error *e) {
    if (json_object_get_type(v) != json_type_string) return compile_schema(v, false, param, param, g, e);
    json_object *parsed = json_tokener_parse(json_object_get_string(v));
    if (!parsed) return fail(e, param, "'%s' is a string that is not a JSON Schema's JSON text", param);
    int rc = compile_schema(parsed, false, param, param, g, e);
    json_object_put(parsed);
    return rc;
}

/* vLLM's constraints: guided_json / guided_regex / guided_choice /
 * guided_grammar (before 0.12), or structured_outputs {json, regex, choice,
 * grammar, json_object} (0.10 on).  *n counts the ones given; the one to
 * compile is compiled into *g.  Backend options that would change the
 * output are refused; those that do not (disable_fallback) pass. */
static int parse_vllm_constraint(json_object *root, int *n, struct kvllm_grammar **g, struct oai_error *e) {
    static const struct {
        const char *key;
        int (*compile)(json_object *, const char *, struct kvllm_grammar **, struct oai_error *);
    } k_kinds[] = {
        { "json", compile_guided_json }, { "regex", compile_regex }, { "choice", compile_choice },
        { "grammar", compile_gbnf },
    };
    json_object *so = field(root, "structured_outputs");
    if (so && json_object_get_type(so) != json_type_object)
        return fail(e, "structured_outputs", "'structured_outputs' must be an object ({\"json\"|\"regex\"|"
                    "\"choice\"|\"grammar\": ...}), not %s", type_name(so));
    if (so) {
        json_object_object_foreach(so, key, val) {
            bool known = !strcmp(key, "json_object") || !strcmp(key, "disable_fallback");
            for (size_t k = 0; k < sizeof k_kinds / sizeof *k_kinds; k++) known |= !strcmp(key, k_kinds[k].key);
            if (!known && val && !neutral(val, json_type_boolean, 0))
                return fail(e, "structured_outputs", "structured_outputs.%.40s is not supported", key);
        }
    }
    json_object *jo = so ? field(so, "json_object") : NULL;
    if (jo && json_object_get_type(jo) != json_type_boolean)
        return fail(e, "structured_outputs", "structured_outputs.json_object must be a boolean");
    if (jo && json_object_get_boolean(jo)) {
        (*n)++;
        int rc = *n == 1 ? kvllm_grammar_json_object(g) : 0;
        if (rc) return rc == KVLLM_ENOMEM ? oom(e) : fail(e, "structured_outputs", "%s", kvllm_strerror(rc));
    }
    for (size_t k = 0; k < sizeof k_kinds / sizeof *k_kinds; k++) {
        char old[32], param[48];
        snprintf(old, sizeof old, "guided_%s", k_kinds[k].key);
        snprintf(param, sizeof param, "structured_outputs.%s", k_kinds[k].key);
        json_object *v = field(root, old), *w = so ? field(so, k_kinds[k].key) : NULL;
        for (int i = 0; i < 2; i++) {
            json_object *x = i ? w : v;
            if (!x) continue;
            if (++*n > 1) return 0;   /* the caller says which were given */
            if (k_kinds[k].compile(x, i ? param : old, g, e)) return -1;
        }
    }
    return 0;
}

/* Constrained output: response_format json_object / json_schema (strict
 * honoured; llama-server's json_object with a "schema" too), llama-server's
 * top-level grammar (GBNF text) and json_schema, vLLM's guided_* and
 * structured_outputs.  At most one; compiled here so that a bad schema,
 * grammar or pattern is a 400 naming where. */
static int parse_constraint(json_object *root, struct oai_request *r, struct oai_error *e) {
    json_object *rf = field(root, "response_format"), *gb = field(root, "grammar"), *js = field(root, "json_schema");
    int n_vllm = 0;
    if (parse_vllm_constraint(root, &n_vllm, &r->grammar, e)) return -1;
    const char *rf_type = NULL;
    if (rf) {
        json_object *t = json_object_get_type(rf) == json_type_object ? field(rf, "type") : NULL;
        if (!t || json_object_get_type(t) != json_type_string)
            return fail(e, "response_format", "'response_format' must be an object with a 'type': text, "
                        "json_object or json_schema");
        rf_type = json_object_get_string(t);
        if (strcmp(rf_type, "text") && strcmp(rf_type, "json_object") && strcmp(rf_type, "json_schema"))
            return fail(e, "response_format", "response_format type '%.40s' is not one of text, json_object, "
                        "json_schema", rf_type);
        if (!strcmp(rf_type, "text")) rf_type = NULL;
    }
    if ((rf_type != NULL) + (gb != NULL) + (js != NULL) + n_vllm > 1)
        return fail(e, rf_type ? "response_format" : gb ? "grammar" : js ? "json_schema" : "structured_outputs",
                    "give one constraint: response_format (json_object or json_schema), 'grammar', 'json_schema', "
                    "or one of vLLM's guided_json, guided_regex, guided_choice, guided_grammar and structured_outputs "
                    "{json, regex, choice, grammar, json_object}; not several");
    if (n_vllm) return 0;
    if (rf_type && !strcmp(rf_type, "json_object")) {
        json_object *schema = field(rf, "schema");   /* llama-server's extension */
        if (schema) return compile_schema(schema, false, "response_format", "response_format.schema", &r->grammar, e);
        int rc = kvllm_grammar_json_object(&r->grammar);
        return rc == KVLLM_ENOMEM ? oom(e) : rc ? fail(e, "response_format", "json_object: %s", kvllm_strerror(rc)) : 0;
    }
    if (rf_type) {   /* json_schema: {"name", "description", "schema", "strict"} */
        json_object *o = field(rf, "json_schema");
        if (!o || json_object_get_type(o) != json_type_object)
            return fail(e, "response_format", "response_format json_schema needs a 'json_schema' object "
                        "({\"name\", \"schema\", \"strict\"})");
        json_object *name = field(o, "name");
        if (name && json_object_get_type(name) != json_type_string)
            return fail(e, "response_format", "response_format.json_schema.name must be a string");
        bool strict = false;
        if (get_bool(o, "strict", &strict, e) < 0) return -1;
        return compile_schema(field(o, "schema"), strict, "response_format", "response_format.json_schema.schema",
                              &r->grammar, e);
    }
    if (js) return compile_schema(js, false, "json_schema", "json_schema", &r->grammar, e);
    return gb ? compile_gbnf(gb, "grammar", &r->grammar, e) : 0;
}

/* vLLM's stop_token_ids: a list of token ids (the vocabulary range is the engine's check). */
static int parse_stop_ids(json_object *root, struct oai_request *r, struct oai_error *e) {
    json_object *v = field(root, "stop_token_ids");
    if (!v) return 0;
    if (json_object_get_type(v) != json_type_array)
        return fail(e, "stop_token_ids", "'stop_token_ids' must be a list of token ids, not %s", type_name(v));
    size_t n = json_object_array_length(v);
    if (n > OAI_MAX_STOP_IDS)
        return fail(e, "stop_token_ids", "at most %d stop_token_ids, got %zu", OAI_MAX_STOP_IDS, n);
    if (!n) return 0;
    if (!(r->stop_token_ids = malloc(n * sizeof *r->stop_token_ids))) return oom(e);
    for (size_t i = 0; i < n; i++) {
        json_object *x = json_object_array_get_idx(v, i);
        int64_t id = json_object_get_type(x) == json_type_int ? json_object_get_int64(x) : -1;
        if (id < 0 || id > INT32_MAX)
            return fail(e, "stop_token_ids", "stop_token_ids[%zu] must be a token id (an integer >= 0)", i);
        r->stop_token_ids[r->n_stop_token_ids++] = (int32_t)id;
    }
    return 0;
}

/* OpenAI's logit_bias: {"token id": bias in [-100, 100]}. */
static int parse_logit_bias(json_object *root, struct oai_request *r, struct oai_error *e) {
    json_object *v = field(root, "logit_bias");
    if (!v) return 0;
    if (json_object_get_type(v) != json_type_object)
        return fail(e, "logit_bias", "'logit_bias' must be an object of token ids to biases, not %s", type_name(v));
    size_t n = (size_t)json_object_object_length(v);
    if (n > OAI_MAX_BIAS) return fail(e, "logit_bias", "at most %d logit_bias entries, got %zu", OAI_MAX_BIAS, n);
    if (!n) return 0;
    if (!(r->logit_bias = malloc(n * sizeof *r->logit_bias))) return oom(e);
    json_object_object_foreach(v, key, val) {
        char *end;
        long long id = strtoll(key, &end, 10);
        if (!*key || *end || id < 0 || id > INT32_MAX || (key[0] == '0' && key[1]))
            return fail(e, "logit_bias", "logit_bias key '%.40s' must be a token id (a decimal integer >= 0)", key);
        enum json_type t = json_object_get_type(val);
        double b = t == json_type_int || t == json_type_double ? json_object_get_double(val) : NAN;
        if (!(b >= -100 && b <= 100))
            return fail(e, "logit_bias", "logit_bias['%s'] must be a number in [-100, 100]", key);
        r->logit_bias[r->n_logit_bias++] = (struct kvllm_logit_bias){ (int32_t)id, (float)b };
    }
    return 0;
}

/* min_tokens, stop_token_ids, logit_bias, best_of and completions' echo. */
static int parse_item5(json_object *root, struct oai_request *r, struct oai_error *e) {
    int64_t i64;
    int got;
    if ((got = get_int(root, "min_tokens", 0, INT32_MAX, &i64, e)) < 0) return -1;
    if (got) r->min_tokens = (int)i64;
    if (parse_stop_ids(root, r, e) || parse_logit_bias(root, r, e)) return -1;
    /* best_of: kvllm does not rank samples, so best_of may only equal n (then it changes nothing) */
    if ((got = get_int(root, "best_of", 1, OAI_MAX_N, &i64, e)) < 0) return -1;
    if (got && i64 != r->n)
        return fail(e, "best_of", "'best_of' (%lld) must equal 'n' (%d): kvllm does not generate extra samples to "
                    "return the best of them", (long long)i64, r->n);
    if (!r->chat && get_bool(root, "echo", &r->echo, e) < 0) return -1;
    /* vLLM's detokenization fields: skip_special_tokens (default true), include_stop_str_in_output (false);
     * spaces_between_special_tokens only spaces what skip_special_tokens false shows, and kvllm joins token
     * text as fast tokenizers do (no spaces added): accepted as a boolean */
    bool skip = true, spaces = true;
    if (get_bool(root, "skip_special_tokens", &skip, e) < 0) return -1;
    r->special_text = !skip;
    if (get_bool(root, "include_stop_str_in_output", &r->include_stop_str, e) < 0) return -1;
    if (get_bool(root, "spaces_between_special_tokens", &spaces, e) < 0) return -1;
    if (r->echo && r->logprobs >= 0)
        return fail(e, "echo", "'echo' with 'logprobs' is not supported (the prompt's log-probabilities are not "
                    "computed)");
    return 0;
}

static int parse_fields(json_object *root, struct oai_request *r, struct oai_error *e) {
    json_object *v;
    if ((v = field(root, "model")) && copy_str(v, "model", &r->model, NULL, e) < 0) return -1;
    if (r->chat ? parse_messages(root, r, e) : parse_prompt(root, r, e)) return -1;
    if (refuse_unsupported(root, r->chat, e)) return -1;
    if (r->chat && (parse_tools(root, r, e) || parse_tool_choice(root, r, e))) return -1;

    int64_t i64;
    double d;
    int got;
    const char *mt = r->chat && field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if ((got = get_int(root, mt, 1, INT32_MAX, &i64, e)) < 0) return -1;
    if (got) r->max_tokens = (int)i64;
    if ((got = get_num(root, "temperature", 0, 2, false, &d, e)) < 0) return -1;
    if (got) r->sp.temperature = (float)d;
    bool top_p_zero = false;
    if ((got = get_num(root, "top_p", 0, 1, false, &d, e)) < 0) return -1;
    if (got) r->sp.top_p = (float)d;
    if (got && d == 0) { top_p_zero = true; r->sp.top_p = 1.0f; }   /* OpenAI accepts 0: the top token, greedy */
    if ((got = get_int(root, "top_k", -1, INT32_MAX, &i64, e)) < 0) return -1;
    if (got) r->sp.top_k = i64 < 0 ? 0 : (int)i64;   /* -1 and 0: off (vLLM's convention) */
    if ((got = get_num(root, "min_p", 0, 1, false, &d, e)) < 0) return -1;
    if (got) r->sp.min_p = (float)d;
    if ((got = get_num(root, "repetition_penalty", 0, 10, true, &d, e)) < 0) return -1;
    if (got) r->sp.repeat_penalty = (float)d;
    if ((got = get_int(root, "seed", INT64_MIN, INT64_MAX, &i64, e)) < 0) return -1;
    if (got) { r->sp.seed = (uint64_t)i64; r->seed_set = true; }
    if ((got = get_int(root, "n", 1, OAI_MAX_N, &i64, e)) < 0) return -1;
    if (got) r->n = (int)i64;
    if (get_num(root, "presence_penalty", -2, 2, false, &r->presence_penalty, e) < 0) return -1;
    if (get_num(root, "frequency_penalty", -2, 2, false, &r->frequency_penalty, e) < 0) return -1;
    /* OpenAI's penalties count over the whole text so far */
    r->sp.presence_penalty = (float)r->presence_penalty;
    r->sp.frequency_penalty = (float)r->frequency_penalty;
    if (r->presence_penalty != 0 || r->frequency_penalty != 0) r->sp.repeat_last_n = -1;
    if ((got = get_int(root, "repeat_last_n", -1, INT32_MAX, &i64, e)) < 0) return -1;   /* llama-server's window */
    if (got) r->sp.repeat_last_n = (int)i64;
    if (parse_stop(root, r, e)) return -1;
    if (get_bool(root, "stream", &r->stream, e) < 0) return -1;
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e) < 0) return -1;
    if ((v = field(root, "stream_options"))) {
        if (json_object_get_type(v) != json_type_object)
            return fail(e, "stream_options", "'stream_options' must be an object, not %s", type_name(v));
        if (get_bool(v, "include_usage", &r->include_usage, e) < 0) return -1;
    }
    if ((v = field(root, "user")) && json_object_get_type(v) != json_type_string)
        return fail(e, "user", "'user' must be a string, not %s", type_name(v));

    /* log-probabilities: an int (completions) or a bool + top_logprobs (chat) */
    if (!r->chat) {
        v = field(root, "logprobs");
        if (v && json_object_get_type(v) == json_type_boolean) {   /* tolerated: true means the token alone */
            if (json_object_get_boolean(v)) r->logprobs = 0;
        } else {
            if ((got = get_int(root, "logprobs", 0, JOB_MAX_TOP, &i64, e)) < 0) return -1;
            if (got) r->logprobs = (int)i64;
        }
    } else {
        bool lp = false;
        if (get_bool(root, "logprobs", &lp, e) < 0) return -1;
        if ((got = get_int(root, "top_logprobs", 0, JOB_MAX_TOP, &i64, e)) < 0) return -1;
        if (got && !lp) return fail(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        if (lp) r->logprobs = got ? (int)i64 : 0;
    }
    if (top_p_zero) r->sp.temperature = 0;
    if (parse_constraint(root, r, e)) return -1;
    return parse_item5(root, r, e);
}

static int hex4(const char *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | d;
    }
    return v;
}

/* A \uD800-\uDFFF escape not part of a surrogate pair: json-c would quietly
 * turn it into U+FFFD; we refuse it like any other ill-formed text.  Only
 * backslashes matter and they only occur inside strings in valid JSON, so no
 * string tracking is needed (a malformed body fails parsing anyway). */
static bool lone_surrogate(const char *s, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '\\') continue;
        if (s[i + 1] == 'u' && i + 6 <= n) {
            int v = hex4(s + i + 2);
            if (v >= 0xDC00 && v <= 0xDFFF) return true;
            if (v >= 0xD800 && v <= 0xDBFF) {
                int w = i + 12 <= n && s[i + 6] == '\\' && s[i + 7] == 'u' ? hex4(s + i + 8) : -1;
                if (w < 0xDC00 || w > 0xDFFF) return true;
                i += 6;   /* skip the low half too */
            }
        }
        i++;   /* the escaped character */
    }
    return false;
}

int oai_parse(bool chat, const char *body, size_t len, struct oai_request *r, struct oai_error *err) {
    memset(r, 0, sizeof *r);
    memset(err, 0, sizeof *err);
    r->chat = chat;
    r->n = 1;
    r->logprobs = -1;
    /* OpenAI's defaults, not the CLI's: temperature 1 and no truncation */
    r->sp = kvllm_sampling_default_params();
    r->sp.temperature = 1.0f;
    r->sp.top_k = 0;
    r->sp.top_p = 1.0f;
    r->sp.min_p = 0.0f;
    r->sp.repeat_penalty = 1.0f;

    if (!utf8_valid(body, len)) return fail(err, NULL, "the request body is not valid UTF-8");
    if (lone_surrogate(body, len))
        return fail(err, NULL, "the request body is not valid UTF-8: an unpaired surrogate escape (\\uD800-\\uDFFF)");
    json_tokener *tok = json_tokener_new_ex(MAX_DEPTH);
    if (!tok) return oom(err);
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    json_object *root = len ? json_tokener_parse_ex(tok, body, (int)len) : NULL;
    enum json_tokener_error je = len ? json_tokener_get_error(tok) : json_tokener_continue;
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    int rc = 0;
    if (je == json_tokener_continue || (!root && je == json_tokener_success)) {
        rc = fail(err, NULL, len ? "invalid JSON: the body ends in the middle of a value" : "the request body is empty");
    } else if (je != json_tokener_success) {
        rc = fail(err, NULL, "invalid JSON at byte %zu: %s", end, json_tokener_error_desc(je));
    } else if (end < len && strspn(body + end, " \t\r\n") != len - end) {
        rc = fail(err, NULL, "invalid JSON: unexpected data after the value at byte %zu", end);
    } else if (json_object_get_type(root) != json_type_object) {
        rc = fail(err, NULL, "the request body must be a JSON object, not %s", type_name(root));
    } else {
        rc = parse_fields(root, r, err);
    }
    json_object_put(root);
    if (rc) oai_request_free(r);
    return rc;
}

void oai_request_free(struct oai_request *r) {
    free(r->model);
    for (int i = 0; i < r->n_prompts; i++) { free(r->prompts[i].text); free(r->prompts[i].ids); }
    free(r->prompts);
    for (int i = 0; i < r->n_msgs; i++) {
        free((char *)r->msgs[i].content);
        free((char *)r->msgs[i].tool_calls);
        free((char *)r->msgs[i].tool_call_id);
        free((char *)r->msgs[i].name);
    }
    free(r->tools);
    free(r->tool_name);
    free(r->msgs);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_token_ids);
    free(r->logit_bias);
    kvllm_grammar_free(r->grammar);
    memset(r, 0, sizeof *r);
}

/* ---- llama-server's /completion ---- */

char *oai_llama_body(const char *body, size_t len) {
    json_tokener *tok = json_tokener_new_ex(MAX_DEPTH);
    if (!tok) return NULL;
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    json_object *root = len ? json_tokener_parse_ex(tok, body, (int)len) : NULL;
    bool ok = root && json_tokener_get_error(tok) == json_tokener_success &&
              json_object_get_type(root) == json_type_object;
    json_tokener_free(tok);
    if (!ok) {   /* oai_parse says what is wrong with it */
        json_object_put(root);
        char *copy = malloc(len + 1);
        if (copy) { memcpy(copy, body, len); copy[len] = 0; }
        return copy;
    }
    json_object *v;
    /* n_predict: > 0 a limit; -1 (or absent) until end of text or context */
    if ((v = field(root, "n_predict"))) {
        if (json_object_get_type(v) == json_type_int && json_object_get_int64(v) > 0)
            json_object_object_add(root, "max_tokens", json_object_get(v));
        else if (json_object_get_type(v) != json_type_int)
            json_object_object_add(root, "max_tokens", json_object_get(v));   /* reported as max_tokens */
        json_object_object_del(root, "n_predict");
    }
    /* n_probs: the n best tokens' log-probabilities at each position (completion_probabilities);
     * llama-server returns "at most n_probs", kvllm at most JOB_MAX_TOP of them */
    if ((v = field(root, "n_probs"))) {
        if (json_object_get_type(v) == json_type_int && json_object_get_int64(v) > 0)
            json_object_object_add(root, "logprobs", json_object_new_int(json_object_get_int64(v) > JOB_MAX_TOP
                                                                         ? JOB_MAX_TOP : (int)json_object_get_int64(v)));
        else if (json_object_get_type(v) != json_type_int)
            json_object_object_add(root, "logprobs", json_object_get(v));   /* reported as logprobs */
        json_object_object_del(root, "n_probs");
    }
    if ((v = field(root, "repeat_penalty"))) {
        json_object_object_add(root, "repetition_penalty", json_object_get(v));
        json_object_object_del(root, "repeat_penalty");
    }
    if ((v = field(root, "seed")) && json_object_get_type(v) == json_type_int && json_object_get_int64(v) == -1)
        json_object_object_del(root, "seed");   /* llama-server: -1 is a random seed */
    /* llama-server's sampling defaults, not OpenAI's */
    static const struct { const char *key; double v; } defaults[] = {
        { "temperature", 0.8 }, { "top_k", 40 }, { "top_p", 0.95 }, { "min_p", 0.05 },
    };
    for (size_t i = 0; i < sizeof defaults / sizeof *defaults; i++)
        if (!field(root, defaults[i].key))
            json_object_object_add(root, defaults[i].key, !strcmp(defaults[i].key, "top_k")
                                   ? json_object_new_int((int)defaults[i].v) : json_object_new_double(defaults[i].v));
    const char *str = json_object_to_json_string_ext(root, JSON_FLAGS);
    char *out = str ? strdup(str) : NULL;
    json_object_put(root);
    return out;
}
