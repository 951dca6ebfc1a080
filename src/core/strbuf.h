/* strbuf.h — the one growable byte string (HTTP bodies, GBNF text compiled
 * from a JSON Schema, ...) and UTF-8 checks.  Allocation failure is sticky:
 * the buffer sets `oom`, later appends do nothing, and the caller checks
 * once at the end.  A zeroed struct is an empty buffer. */
#ifndef KVLLM_CORE_STRBUF_H
#define KVLLM_CORE_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

struct strbuf {
    char *s;        /* NUL-terminated when len > 0 */
    size_t len, cap;
    bool oom;
};

void sb_put(struct strbuf *b, const char *s, size_t n);
void sb_puts(struct strbuf *b, const char *s);
void sb_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The string (never NULL unless out of memory: "" for an empty buffer); the
 * buffer is left empty and the caller owns the result. */
char *sb_take(struct strbuf *b);
/* Empty the buffer for reuse: its memory is kept, a past allocation
 * failure forgotten. */
void sb_clear(struct strbuf *b);
void sb_free(struct strbuf *b);

/* Whether s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code
 * points past U+10FFFF). */
bool utf8_valid(const char *s, size_t n);
/* Append s[0..n) to b with every ill-formed sequence replaced by U+FFFD. */
void utf8_sanitize(struct strbuf *b, const char *s, size_t n);

#endif
