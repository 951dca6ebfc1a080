/* jinja_json.c — JSON text into template values, as Python's json.loads
 * makes them, for the render variables that arrive as JSON (the request's
 * tools, an assistant message's tool_calls).
 *
 * Objects become dicts in document order (a repeated key keeps its first
 * place and takes the last value, as a Python dict does), arrays lists,
 * integers int, other numbers float, true/false/null bool/None.  What Python
 * would hold but a template value cannot (an integer past 64 bits, a lone
 * surrogate escape) fails the render rather than being approximated.  The
 * parser is strict RFC 8259 (no trailing commas, no comments) and recursive
 * with a depth cap; everything lives in the render's arena. */
#include "chat/jinja.h"
#include "kvllm.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 128

struct jjson {
    struct jctx *c;
    const char *what;   /* for messages: "tools", "messages[2].tool_calls" */
    const char *s;
    size_t n, i;
    bool taint;         /* mark every string (keys too) as message text */
};

_Noreturn static void bad(struct jjson *p, const char *why) {
    jfail(p->c, UINT32_MAX, KVLLM_EINVAL, "%s: invalid JSON at byte %zu: %s", p->what, p->i, why);
}

static void skip_ws(struct jjson *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int hexval(char ch) {
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
         : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

static uint32_t hex4(struct jjson *p) {
    if (p->n - p->i < 4) bad(p, "a \\u escape needs four hex digits");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int d = hexval(p->s[p->i + (size_t)k]);
        if (d < 0) bad(p, "a \\u escape needs four hex digits");
        v = v << 4 | (uint32_t)d;
    }
    p->i += 4;
    return v;
}

/* A string at p->s[p->i] == '"'. */
static struct jv string(struct jjson *p) {
    struct jbuf b = { 0 };
    p->i++;
    for (;;) {
        if (p->i >= p->n) bad(p, "the string does not end");
        unsigned char ch = (unsigned char)p->s[p->i];
        if (ch == '"') { p->i++; break; }
        if (ch < 0x20) bad(p, "a control character inside a string");
        if (ch != '\\') {
            size_t start = p->i;
            uint32_t cp = utf8_next(p->s, p->n, &p->i);
            if (cp >= 0xDC00 && cp <= 0xDCFF && p->i - start == 1 && ch >= 0x80) bad(p, "invalid UTF-8");
            jb_put(p->c, &b, p->s + start, p->i - start);
            continue;
        }
        if (++p->i >= p->n) bad(p, "the string does not end");
        char e = p->s[p->i++];
        switch (e) {
        case '"': jb_putc(p->c, &b, '"'); break;
        case '\\': jb_putc(p->c, &b, '\\'); break;
        case '/': jb_putc(p->c, &b, '/'); break;
        case 'b': jb_putc(p->c, &b, '\b'); break;
        case 'f': jb_putc(p->c, &b, '\f'); break;
        case 'n': jb_putc(p->c, &b, '\n'); break;
        case 'r': jb_putc(p->c, &b, '\r'); break;
        case 't': jb_putc(p->c, &b, '\t'); break;
        case 'u': {
            uint32_t cp = hex4(p);
            if (cp >= 0xD800 && cp <= 0xDBFF && p->n - p->i >= 6 && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
                size_t save = p->i;
                p->i += 2;
                uint32_t lo = hex4(p);
                if (lo >= 0xDC00 && lo <= 0xDFFF) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else p->i = save;
            }
            /* Python keeps a lone surrogate in its str; UTF-8 text cannot */
            if (cp >= 0xD800 && cp <= 0xDFFF) bad(p, "a lone surrogate escape");
            utf8_put(p->c, &b, cp);
            break;
        }
        default: bad(p, "an unknown escape");
        }
    }
    struct jstr s = jb_str(&b);
    if (p->taint && s.n) s = jstr_taint_all(p->c, s);
    return jv_str(s);
}

static struct jv number(struct jjson *p) {
    size_t start = p->i;
    bool is_float = false;
    if (p->s[p->i] == '-') p->i++;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') bad(p, "a number needs digits");
    if (p->s[p->i] == '0') p->i++;
    else while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    if (p->i < p->n && p->s[p->i] == '.') {
        is_float = true;
        p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') bad(p, "digits must follow the decimal point");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        is_float = true;
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') bad(p, "digits must follow the exponent");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    char buf[64];
    size_t len = p->i - start;
    if (len >= sizeof buf) {
        if (!is_float)
            jfail(p->c, UINT32_MAX, KVLLM_EUNSUPPORTED, "%s: the integer at byte %zu does not fit in 64 bits",
                  p->what, start);
        bad(p, "a number of more than 63 characters");
    }
    memcpy(buf, p->s + start, len);
    buf[len] = 0;
    errno = 0;
    if (is_float) return jv_float(strtod(buf, NULL));   /* Python too reads 1e999 as inf */
    long long v = strtoll(buf, NULL, 10);
    if (errno == ERANGE)
        jfail(p->c, UINT32_MAX, KVLLM_EUNSUPPORTED, "%s: the integer at byte %zu does not fit in 64 bits", p->what,
              start);
    return jv_int(v);
}

static bool literal(struct jjson *p, const char *word) {
    size_t k = strlen(word);
    if (p->n - p->i < k || memcmp(p->s + p->i, word, k)) return false;
    p->i += k;
    return true;
}

static struct jv value(struct jjson *p, int depth) {
    if (depth > JSON_MAX_DEPTH) bad(p, "nested deeper than 128");
    jstep(p->c, UINT32_MAX, 1);
    skip_ws(p);
    if (p->i >= p->n) bad(p, "a value is missing");
    char ch = p->s[p->i];
    if (ch == '{') {
        struct jv d = jv_dict(p->c);
        p->i++;
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == '}') { p->i++; return d; }
        for (;;) {
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') bad(p, "an object key must be a string");
            struct jv k = string(p);
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') bad(p, "':' must follow an object key");
            p->i++;
            struct jv v = value(p, depth + 1);
            jdict_set(p->c, d.u.d, k, v);
            skip_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
            if (p->i < p->n && p->s[p->i] == '}') { p->i++; return d; }
            bad(p, "',' or '}' must follow an object member");
        }
    }
    if (ch == '[') {
        struct jv l = jv_list(p->c, JL_LIST, 0);
        p->i++;
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ']') { p->i++; return l; }
        for (;;) {
            jlist_push(p->c, l.u.l, value(p, depth + 1));
            skip_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
            if (p->i < p->n && p->s[p->i] == ']') { p->i++; return l; }
            bad(p, "',' or ']' must follow an array item");
        }
    }
    if (ch == '"') return string(p);
    if (ch == '-' || (ch >= '0' && ch <= '9')) return number(p);
    if (literal(p, "true")) return jv_bool(true);
    if (literal(p, "false")) return jv_bool(false);
    if (literal(p, "null")) return jv_none();
    bad(p, "not a JSON value");
}

struct jv jjson_parse(struct jctx *c, const char *what, const char *s, size_t n, bool taint) {
    struct jjson p = { .c = c, .what = what, .s = s, .n = n, .taint = taint };
    struct jv v = value(&p, 0);
    skip_ws(&p);
    if (p.i != p.n) bad(&p, "text after the value");
    return v;
}

bool jjson_try_parse(struct jctx *c, const char *what, const char *s, size_t n, bool taint, struct jv *out) {
    /* a nested catch: malformed JSON is an answer here, not a failed render;
     * running out of steps or memory still fails the render */
    jmp_buf outer;
    memcpy(outer, c->jmp, sizeof outer);
    if (setjmp(c->jmp)) {
        memcpy(c->jmp, outer, sizeof outer);
        if (c->err_code != KVLLM_EINVAL && c->err_code != KVLLM_EUNSUPPORTED) longjmp(c->jmp, 1);
        c->err_code = 0;
        c->err_msg[0] = 0;
        c->err_pos = UINT32_MAX;
        return false;
    }
    *out = jjson_parse(c, what, s, n, taint);
    memcpy(c->jmp, outer, sizeof outer);
    return true;
}
