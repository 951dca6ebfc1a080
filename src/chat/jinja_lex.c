/* jinja_lex.c — template text to tokens, as jinja2's Lexer does it with
 * trim_blocks and lstrip_blocks on.
 *
 * Outside tags the text is data.  A tag opener ({{ {% {#) may carry a sign:
 * '-' strips all whitespace before it; '+' keeps it; otherwise, for {% and
 * {#, lstrip_blocks removes the whitespace between the last newline (or the
 * start of a line) and the tag.  Closers: '-%}' '-}}' '-#}' eat the
 * whitespace after them; '%}' and '#}' eat one newline (trim_blocks); '+%}'
 * keeps it.  "Whitespace" is Python's str.isspace(), as jinja2's regexes
 * use.  Inside {{ }} and {% %} the text becomes names, numbers, strings and
 * operators; a closer counts only when brackets are balanced. */
#include "chat/jinja.h"
#include "kvllm.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct lexer {
    struct jctx *c;
    const char *s;
    size_t n, pos;
    bool line_starting;     /* the previous match ended with a newline */
    struct jtoken *toks;
    size_t nt, cap;
    char balance[64];       /* expected closing brackets */
    int n_balance;
};

static struct jtoken *emit(struct lexer *L, enum jtok type, uint32_t pos) {
    if (L->nt == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        struct jtoken *t = jalloc_array(L->c, cap, sizeof *t);
        if (L->nt) memcpy(t, L->toks, L->nt * sizeof *t);
        L->toks = t;
        L->cap = cap;
    }
    struct jtoken *t = &L->toks[L->nt++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->pos = pos;
    return t;
}

/* Bytes of Python whitespace starting at s[i]. */
static size_t ws_len(const char *s, size_t n, size_t i) {
    size_t k = i;
    while (k < n) {
        size_t next = k;
        if (!py_isspace(utf8_next(s, n, &next))) break;
        k = next;
    }
    return k - i;
}

/* Length of text[0..len) once the whitespace control of the tag after it
 * is applied (sign: '-', '+' or 0; lstrip: the tag is a block or comment). */
static size_t strip_before_tag(const struct lexer *L, const char *text, size_t len, char sign, bool lstrip) {
    if (sign == '-') {
        size_t keep = 0;
        for (size_t i = 0; i < len;) {
            if (!py_isspace(utf8_next(text, len, &i))) keep = i;
        }
        return keep;
    }
    if (sign == '+' || !lstrip) return len;
    size_t l_pos = len;
    while (l_pos > 0 && text[l_pos - 1] != '\n') l_pos--;
    if ((l_pos > 0 || L->line_starting) && l_pos < len && ws_len(text, len, l_pos) == len - l_pos)
        return l_pos;
    return len;
}

static void emit_data(struct lexer *L, size_t start, size_t len) {
    if (!len) return;
    struct jtoken *t = emit(L, JT_DATA, (uint32_t)start);
    t->s = (struct jstr){ L->s + start, len, NULL };
}

static bool at(const struct lexer *L, size_t i, const char *lit) {
    size_t k = strlen(lit);
    return i + k <= L->n && memcmp(L->s + i, lit, k) == 0;
}

/* A tag closer at i ("%}" or "#}" or "}}" as close; trim: a block or
 * comment closer, which trim_blocks and '+' apply to); returns the end of
 * the match, 0 if none. */
static size_t match_close(const struct lexer *L, size_t i, const char *close, bool trim) {
    if (trim && L->s[i] == '+' && at(L, i + 1, close)) return i + 3;  /* blocks and comments only */
    if (L->s[i] == '-' && at(L, i + 1, close)) { i += 3; return i + ws_len(L->s, L->n, i); }
    if (at(L, i, close)) {
        i += 2;
        if (trim && i < L->n && L->s[i] == '\n') i++;
        return i;
    }
    return 0;
}

/* ---- inside tags ---- */

static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static bool is_name_start(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static bool is_name_char(char ch) { return is_name_start(ch) || is_digit(ch); }

/* (\d+_)*\d+ at i: end, or i when none */
static size_t digits_us(const struct lexer *L, size_t i) {
    size_t k = i, good = i;
    while (k < L->n && is_digit(L->s[k])) {
        while (k < L->n && is_digit(L->s[k])) k++;
        good = k;
        if (k + 1 < L->n && L->s[k] == '_' && is_digit(L->s[k + 1])) k++;
        else break;
    }
    return good;
}

static size_t match_float(const struct lexer *L, size_t i) {
    if (i > 0 && L->s[i - 1] == '.') return 0;
    size_t k = digits_us(L, i);
    if (k == i) return 0;
    size_t frac = k;
    if (k < L->n && L->s[k] == '.') {
        size_t f = digits_us(L, k + 1);
        if (f > k + 1) frac = f;
    }
    size_t e = frac;
    if (e < L->n && (L->s[e] == 'e' || L->s[e] == 'E')) {
        size_t x = e + 1;
        if (x < L->n && (L->s[x] == '+' || L->s[x] == '-')) x++;
        size_t d = digits_us(L, x);
        if (d > x) return d;
    }
    return frac > k ? frac : 0;
}

static int digit_val(char ch) {
    if (is_digit(ch)) return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return 99;
}

/* integer_re; *base set */
static size_t match_int(const struct lexer *L, size_t i, int *base) {
    const char *s = L->s;
    if (s[i] == '0' && i + 1 < L->n) {
        char p = s[i + 1] | 0x20;
        int b = p == 'b' ? 2 : p == 'o' ? 8 : p == 'x' ? 16 : 0;
        if (b) {
            size_t k = i + 2, good = 0;
            for (;;) {
                size_t d = k < L->n && s[k] == '_' ? k + 1 : k;
                if (d < L->n && digit_val(s[d]) < b) { k = d + 1; good = k; }
                else break;
            }
            if (good) { *base = b; return good; }
        }
    }
    *base = 10;
    if (s[i] >= '1' && s[i] <= '9') {
        size_t k = i + 1;
        for (;;) {
            size_t d = k < L->n && s[k] == '_' ? k + 1 : k;
            if (d < L->n && is_digit(s[d])) k = d + 1;
            else break;
        }
        return k;
    }
    if (s[i] == '0') {
        size_t k = i + 1;
        for (;;) {
            size_t d = k < L->n && s[k] == '_' ? k + 1 : k;
            if (d < L->n && s[d] == '0') k = d + 1;
            else break;
        }
        return k;
    }
    return 0;
}

/* Python's "unicode-escape" decoding of a string literal's body (after
 * jinja2 turned non-ASCII characters into backslash escapes). */
static struct jstr unescape(struct lexer *L, size_t start, size_t end) {
    struct jctx *c = L->c;
    const char *s = L->s;
    struct jbuf b = { 0 };
    for (size_t i = start; i < end;) {
        if (s[i] != '\\') {
            size_t k = i;
            while (k < end && s[k] != '\\') k++;
            jb_put(c, &b, s + i, k - i);
            i = k;
            continue;
        }
        uint32_t esc_pos = (uint32_t)i;
        i++;  /* the string regex guarantees a character follows */
        char e = s[i];
        if ((uint8_t)e >= 0x80) {
            /* "\é" became "\\xe9" before decoding: a backslash, then the escape's text */
            uint32_t cp = utf8_next(s, end, &i);
            jb_printf(c, &b, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)cp);
            continue;
        }
        i++;
        switch (e) {
        case '\n': break;  /* line continuation */
        case '\\': jb_putc(c, &b, '\\'); break;
        case '\'': jb_putc(c, &b, '\''); break;
        case '"': jb_putc(c, &b, '"'); break;
        case 'a': jb_putc(c, &b, '\a'); break;
        case 'b': jb_putc(c, &b, '\b'); break;
        case 'f': jb_putc(c, &b, '\f'); break;
        case 'n': jb_putc(c, &b, '\n'); break;
        case 'r': jb_putc(c, &b, '\r'); break;
        case 't': jb_putc(c, &b, '\t'); break;
        case 'v': jb_putc(c, &b, '\v'); break;
        case 'x': case 'u': case 'U': {
            int want = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < want; k++, i++) {
                if (i >= end || digit_val(s[i]) > 15)
                    jfail(c, esc_pos, KVLLM_EINVAL, "truncated \\%c escape in a string", e);
                cp = cp * 16 + (uint32_t)digit_val(s[i]);
            }
            if (cp > 0x10ffff) jfail(c, esc_pos, KVLLM_EINVAL, "illegal Unicode character in a string");
            if (cp >= 0xd800 && cp <= 0xdfff)
                jfail(c, esc_pos, KVLLM_EUNSUPPORTED, "a surrogate escape in a string");
            utf8_put(c, &b, cp);
            break;
        }
        case 'N':
            jfail(c, esc_pos, KVLLM_EUNSUPPORTED, "\\N{...} escapes are not supported");
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < end && s[i] >= '0' && s[i] <= '7'; k++, i++)
                    cp = cp * 8 + (uint32_t)(s[i] - '0');
                utf8_put(c, &b, cp);
            } else {
                jb_putc(c, &b, '\\');   /* unknown escapes stay as written */
                jb_putc(c, &b, e);
            }
        }
    }
    return jb_str(&b);
}

static bool lex_number(struct lexer *L) {
    size_t i = L->pos, end = match_float(L, i);
    struct jctx *c = L->c;
    char tmp[128];
    if (end) {
        size_t k = 0;
        for (size_t j = i; j < end && k < sizeof tmp - 1; j++)
            if (L->s[j] != '_') tmp[k++] = L->s[j];
        tmp[k] = 0;
        struct jtoken *t = emit(L, JT_FLOAT, (uint32_t)i);
        t->f = strtod(tmp, NULL);
        L->pos = end;
        return true;
    }
    int base;
    end = match_int(L, i, &base);
    if (!end) return false;
    size_t k = 0;
    for (size_t j = i + (base != 10 ? 2 : 0); j < end; j++) {
        if (L->s[j] == '_') continue;
        if (k >= sizeof tmp - 1) jfail(c, (uint32_t)i, KVLLM_EUNSUPPORTED, "integer literal too large");
        tmp[k++] = L->s[j];
    }
    tmp[k] = 0;
    errno = 0;
    long long v = strtoll(tmp, NULL, base);
    if (errno == ERANGE) jfail(c, (uint32_t)i, KVLLM_EUNSUPPORTED, "integer literal too large");
    struct jtoken *t = emit(L, JT_INT, (uint32_t)i);
    t->i = v;
    L->pos = end;
    return true;
}

static bool lex_string(struct lexer *L) {
    size_t i = L->pos;
    char q = L->s[i];
    if (q != '\'' && q != '"') return false;
    size_t k = i + 1;
    while (k < L->n && L->s[k] != q) k += L->s[k] == '\\' ? 2 : 1;
    if (k >= L->n) return false;
    struct jtoken *t = emit(L, JT_STRING, (uint32_t)i);
    t->s = unescape(L, i + 1, k);
    L->pos = k + 1;
    return true;
}

static bool lex_operator(struct lexer *L) {
    static const struct { const char *text; char op; } two[] = {
        { "//", 'F' }, { "**", 'P' }, { "==", 'E' }, { "!=", 'N' }, { ">=", 'G' }, { "<=", 'L' },
    };
    size_t i = L->pos;
    struct jctx *c = L->c;
    for (size_t k = 0; k < sizeof two / sizeof *two; k++)
        if (at(L, i, two[k].text)) {
            emit(L, JT_OP, (uint32_t)i)->op = (uint8_t)two[k].op;
            L->pos += 2;
            return true;
        }
    char ch = L->s[i];
    if (!strchr("+-/*%~[](){}><=.:|,;", ch) || !ch) return false;
    if (ch == '(' || ch == '[' || ch == '{') {
        if (L->n_balance == (int)sizeof L->balance)
            jfail(c, (uint32_t)i, KVLLM_EUNSUPPORTED, "brackets nested too deeply");
        L->balance[L->n_balance++] = ch == '(' ? ')' : ch == '[' ? ']' : '}';
    } else if (ch == ')' || ch == ']' || ch == '}') {
        if (!L->n_balance) jfail(c, (uint32_t)i, KVLLM_EINVAL, "unexpected '%c'", ch);
        char want = L->balance[--L->n_balance];
        if (want != ch) jfail(c, (uint32_t)i, KVLLM_EINVAL, "unexpected '%c', expected '%c'", ch, want);
    }
    emit(L, JT_OP, (uint32_t)i)->op = (uint8_t)ch;
    L->pos++;
    return true;
}

/* Tokens of one {{ }} or {% %} up to and including its closer. */
static void lex_tag(struct lexer *L, bool is_block, uint32_t open_pos) {
    struct jctx *c = L->c;
    L->n_balance = 0;
    for (;;) {
        if (L->pos >= L->n)
            jfail(c, open_pos, KVLLM_EINVAL, "unexpected end of template: %s never closed",
                  is_block ? "'{%'" : "'{{'");
        if (!L->n_balance) {
            size_t end = match_close(L, L->pos, is_block ? "%}" : "}}", is_block);
            if (end) {
                emit(L, is_block ? JT_BLOCK_END : JT_VAR_END, (uint32_t)L->pos);
                L->line_starting = L->s[end - 1] == '\n';
                L->pos = end;
                return;
            }
        }
        size_t w = ws_len(L->s, L->n, L->pos);
        if (w) { L->pos += w; continue; }
        char ch = L->s[L->pos];
        if (lex_number(L) || lex_string(L)) continue;
        if (is_name_start(ch)) {
            size_t k = L->pos;
            while (k < L->n && is_name_char(L->s[k])) k++;
            if (k < L->n && (uint8_t)L->s[k] >= 0x80)
                jfail(c, (uint32_t)L->pos, KVLLM_EUNSUPPORTED, "non-ASCII names are not supported");
            struct jtoken *t = emit(L, JT_NAME, (uint32_t)L->pos);
            t->s = (struct jstr){ L->s + L->pos, k - L->pos, NULL };
            L->pos = k;
            continue;
        }
        if (lex_operator(L)) continue;
        if ((uint8_t)ch >= 0x80)
            jfail(c, (uint32_t)L->pos, KVLLM_EUNSUPPORTED, "non-ASCII characters in a tag are not supported");
        jfail(c, (uint32_t)L->pos, KVLLM_EINVAL, "unexpected char '%c'", ch);
    }
}

/* Search "{% [-+] endraw %}" from i: start of the match, its sign, its end. */
static bool find_endraw(const struct lexer *L, size_t i, size_t *start, char *sign, size_t *end) {
    for (; i + 1 < L->n; i++) {
        if (!at(L, i, "{%")) continue;
        size_t k = i + 2;
        char sg = 0;
        if (k < L->n && (L->s[k] == '-' || L->s[k] == '+')) sg = L->s[k++];
        k += ws_len(L->s, L->n, k);
        if (!at(L, k, "endraw")) continue;
        k += 6;
        k += ws_len(L->s, L->n, k);
        size_t e = match_close(L, k, "%}", true);
        if (!e) continue;
        *start = i;
        *sign = sg;
        *end = e;
        return true;
    }
    return false;
}

/* "{% [-+] raw [-]%}" at i: end of the match (0 if none) and its sign. */
static size_t match_raw(const struct lexer *L, size_t i, char *sign) {
    size_t k = i + 2;
    *sign = 0;
    if (k < L->n && (L->s[k] == '-' || L->s[k] == '+')) *sign = L->s[k++];
    k += ws_len(L->s, L->n, k);
    if (!at(L, k, "raw")) return 0;
    k += 3;
    k += ws_len(L->s, L->n, k);
    if (L->s[k] == '-' && at(L, k + 1, "%}")) { k += 3; return k + ws_len(L->s, L->n, k); }
    if (at(L, k, "%}")) return k + 2;
    return 0;
}

void jlex(struct jctx *c, struct jtoken **out, size_t *n) {
    struct lexer L = { .c = c, .s = c->src, .n = c->src_len, .line_starting = true };
    while (L.pos < L.n) {
        size_t t = L.pos;
        while (t + 1 < L.n && !(L.s[t] == '{' && (L.s[t + 1] == '{' || L.s[t + 1] == '%' || L.s[t + 1] == '#'))) t++;
        if (t + 1 >= L.n) { emit_data(&L, L.pos, L.n - L.pos); break; }
        char kind = L.s[t + 1];
        size_t after = t + 2;
        char sign = after < L.n && (L.s[after] == '-' || L.s[after] == '+') ? L.s[after] : 0;
        size_t raw_end = kind == '%' ? match_raw(&L, t, &sign) : 0;
        emit_data(&L, L.pos, strip_before_tag(&L, L.s + L.pos, t - L.pos, sign, kind != '{'));
        if (raw_end) {
            L.line_starting = L.s[raw_end - 1] == '\n';
            size_t body_end, end;
            char esign;
            if (!find_endraw(&L, raw_end, &body_end, &esign, &end))
                jfail(c, (uint32_t)t, KVLLM_EINVAL, "missing end of raw directive");
            emit_data(&L, raw_end, strip_before_tag(&L, L.s + raw_end, body_end - raw_end, esign, true));
            L.line_starting = L.s[end - 1] == '\n';
            L.pos = end;
            continue;
        }
        L.line_starting = false;
        L.pos = after + (sign ? 1 : 0);
        if (kind == '#') {
            size_t k = L.pos, end = 0;
            for (; k + 1 < L.n; k++) {
                if (!at(&L, k, "#}")) continue;
                size_t from = k > L.pos && (L.s[k - 1] == '-' || L.s[k - 1] == '+') ? k - 1 : k;
                end = match_close(&L, from, "#}", true);
                break;
            }
            if (!end) jfail(c, (uint32_t)t, KVLLM_EINVAL, "missing end of comment tag");
            L.line_starting = L.s[end - 1] == '\n';
            L.pos = end;
            continue;
        }
        emit(&L, kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, (uint32_t)t);
        lex_tag(&L, kind == '%', (uint32_t)t);
    }
    emit(&L, JT_EOF, (uint32_t)L.n);
    *out = L.toks;
    *n = L.nt;
}
