/* strbuf.c — growable strings and UTF-8 validation. */
#include "core/strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(struct strbuf *b, size_t extra) {
    if (b->oom) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2) { b->oom = true; return false; }
        cap *= 2;
    }
    char *s = realloc(b->s, cap);
    if (!s) { b->oom = true; return false; }
    b->s = s;
    b->cap = cap;
    return true;
}

void sb_put(struct strbuf *b, const char *s, size_t n) {
    if (!reserve(b, n)) return;
    if (n) memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

void sb_puts(struct strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

void sb_printf(struct strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) { sb_put(b, tmp, (size_t)n); return; }
    if (!reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

char *sb_take(struct strbuf *b) {
    if (b->oom) { sb_free(b); return NULL; }
    char *s = b->s ? b->s : calloc(1, 1);
    *b = (struct strbuf){ 0 };
    return s;
}

void sb_clear(struct strbuf *b) {
    b->len = 0;
    b->oom = false;
    if (b->s) b->s[0] = 0;
}

void sb_free(struct strbuf *b) {
    free(b->s);
    *b = (struct strbuf){ 0 };
}

/* Length of the well-formed sequence at s (n bytes available), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

bool utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(p + i, n - i);
        if (!k) return false;
        i += k;
    }
    return true;
}

void utf8_sanitize(struct strbuf *b, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t run = 0;     /* start of the current valid run */
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(p + i, n - i);
        if (k) { i += k; continue; }
        sb_put(b, s + run, i - run);
        sb_put(b, "\xEF\xBF\xBD", 3);
        run = ++i;
    }
    sb_put(b, s + run, n - run);
}
