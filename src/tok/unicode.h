/* unicode.h — the byte <-> character mapping of byte-level BPE (GPT-2).
 *
 * Byte-level vocabularies spell every byte as one printable character: the
 * bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves (as code
 * points), the other 68 bytes become U+0100, U+0101, ... in byte order.  So
 * ' ' is 'Ġ' (U+0120) and '\n' is 'Ċ' (U+010A).  Every mapped character is
 * one or two bytes of UTF-8. */
#ifndef KVLLM_TOK_UNICODE_H
#define KVLLM_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* The UTF-8 of the character standing for byte b, written at out (2 bytes
 * of room); returns its length (1 or 2). */
int unicode_byte_to_utf8(uint8_t b, char out[2]);

/* The byte whose character starts s (n bytes left); *len gets the
 * character's length.  -1 (with *len = length of the UTF-8 character, at
 * least 1) when the character stands for no byte. */
int unicode_utf8_to_byte(const char *s, size_t n, size_t *len);

/* Bytes of the UTF-8 character led by c (1 for stray continuation bytes),
 * the rule llama.cpp's unicode_len_utf8 uses. */
static inline size_t unicode_len_utf8(uint8_t c) {
    static const uint8_t len[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };
    return len[c >> 4];
}

#endif
