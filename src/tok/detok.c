/* detok.c — streaming decoder that only ever hands out whole, valid UTF-8.
 *
 * Model of the world: token bytes go through a UTF-8 validator one byte at a
 * time.  Bytes of a character still being completed wait in d->pending;
 * a completed character is appended to the output.  Whatever cannot be
 * part of a valid character (a stray continuation byte, an overlong or
 * surrogate form, a lead byte followed by a non-continuation) becomes one
 * U+FFFD per maximal invalid subpart, the replacement practice Unicode
 * recommends (and Python's errors="replace" follows).  So the concatenated
 * output is always valid UTF-8, and equals the decoded text when that is. */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

static const char REPLACEMENT[] = "\xef\xbf\xbd"; /* U+FFFD */

/* Length of the character a lead byte starts, 0 if it cannot start one. */
static int lead_len(uint8_t c) {
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) return 2;
    if (c >= 0xe0 && c <= 0xef) return 3;
    if (c >= 0xf0 && c <= 0xf4) return 4;
    return 0;
}

/* May c come at position pos (>= 1) of a character led by lead?  The
 * second byte's range excludes overlongs, surrogates and > U+10FFFF. */
static bool continues(uint8_t lead, int pos, uint8_t c) {
    uint8_t lo = 0x80, hi = 0xbf;
    if (pos == 1) {
        if (lead == 0xe0) lo = 0xa0;
        else if (lead == 0xed) hi = 0x9f;
        else if (lead == 0xf0) lo = 0x90;
        else if (lead == 0xf4) hi = 0x8f;
    }
    return c >= lo && c <= hi;
}

/* Append n bytes to the output being built; false on OOM. */
static bool out_add(struct detok *d, const char *s, size_t n) {
    sb_put(&d->out, s, n);
    if (!d->out.oom) return true;
    LOG_ERR("out of memory");
    return false;
}

/* Start a new output: empty, keeping the buffer's memory. */
static bool out_begin(struct detok *d) {
    sb_clear(&d->out);
    return out_add(d, "", 0);
}

static bool feed_byte(struct detok *d, uint8_t c) {
    if (d->n_pending > 0) {
        uint8_t lead = (uint8_t)d->pending[0];
        if (continues(lead, d->n_pending, c)) {
            d->pending[d->n_pending++] = (char)c;
            if (d->n_pending < lead_len(lead)) return true;
            d->n_pending = 0;
            return out_add(d, d->pending, (size_t)lead_len(lead));
        }
        /* the pending prefix can never complete: replace it, then see c afresh */
        d->n_pending = 0;
        if (!out_add(d, REPLACEMENT, 3)) return false;
    }
    int need = lead_len(c);
    if (need == 0) return out_add(d, REPLACEMENT, 3);
    if (need == 1) return out_add(d, (const char *)&c, 1);
    d->pending[0] = (char)c;
    d->n_pending = 1;
    return true;
}

void detok_init(struct detok *d, const struct tokenizer *t) {
    memset(d, 0, sizeof *d);
    d->t = t;
}

void detok_deinit(struct detok *d) {
    if (!d) return;
    sb_free(&d->out);
    memset(d, 0, sizeof *d);
}

/* Returns NULL only when the output buffer cannot grow (logged).  An
 * invalid id (logged) contributes nothing. */
const char *detok_push(struct detok *d, int prev, int id) {
    if (!out_begin(d)) return NULL;
    size_t n;
    const char *s = tok_text(d->t, prev, id, &n);
    if (d->special && s && tokenizer_type(d->t, id) == TOK_CONTROL) {
        s = tokenizer_piece(d->t, id);
        n = s ? strlen(s) : 0;
    }
    for (size_t i = 0; s && i < n; i++)
        if (!feed_byte(d, (uint8_t)s[i])) return NULL;
    return d->out.s;
}

const char *detok_flush(struct detok *d) {
    if (!out_begin(d)) return NULL;
    if (d->n_pending > 0) {
        d->n_pending = 0;
        if (!out_add(d, REPLACEMENT, 3)) return NULL;
    }
    return d->out.s;
}
