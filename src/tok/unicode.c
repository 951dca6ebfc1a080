/* unicode.c — GPT-2's byte <-> character mapping (see unicode.h). */
#include "tok/unicode.h"

/* Does byte b stand for itself? */
static int byte_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

/* Code point standing for byte b. */
static unsigned byte_to_cpt(unsigned b) {
    if (byte_is_printable(b)) return b;
    /* the others in order: 0x00..0x20 (33), 0x7F..0xA0 (34), 0xAD */
    if (b <= 0x20) return 0x100 + b;
    if (b <= 0xa0) return 0x100 + 33 + (b - 0x7f);
    return 0x100 + 67;
}

int unicode_byte_to_utf8(uint8_t b, char out[2]) {
    unsigned cp = byte_to_cpt(b);
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

int unicode_utf8_to_byte(const char *s, size_t n, size_t *len) {
    const uint8_t *u = (const uint8_t *)s;
    size_t l = unicode_len_utf8(u[0]);
    if (l > n) l = n;
    *len = l;
    unsigned cp;
    if (l == 1) cp = u[0];
    else if (l == 2 && (u[1] & 0xc0) == 0x80) cp = ((unsigned)(u[0] & 0x1f) << 6) | (u[1] & 0x3f);
    else return -1;
    if (cp < 0x100) return byte_is_printable(cp) ? (int)cp : -1;
    if (cp >= 0x100 + 68) return -1;
    unsigned k = cp - 0x100;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(0x7f + k - 33);
    return 0xad;
}
