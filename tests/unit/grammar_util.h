/* grammar_util.h — vocabularies for the grammar tests: a synthetic one
 * (every byte, multi-byte pieces, tokens that end or start inside a UTF-8
 * character, an end token and a special token) and real ones read from
 * tests/data/tokenizers (GPT-2's byte-level BPE encoder.json, llama2.c's
 * SentencePiece tokenizer.bin). */
#ifndef KVLLM_GRAMMAR_UTIL_H
#define KVLLM_GRAMMAR_UTIL_H

#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tvocab {
    int n;
    char **bytes;
    size_t *len;
    bool *special;
    int32_t end_id;
};

/* Whether the matcher of g over vocabulary v (token b is byte b) takes all of s[0..len) and may end
 * there: 1 yes, 0 no, -1 when no matcher could be made. */
static inline int gu_matcher_accepts(const struct kvllm_grammar *g, const struct gvocab *v, const char *s, size_t len) {
    struct gmatcher *m;
    if (gmatcher_new(g, v, &m)) return -1;
    int ok = 1;
    for (size_t i = 0; i < len && ok; i++)
        if (gmatcher_accept(m, (unsigned char)s[i])) ok = 0;
    if (ok && !gmatcher_can_end(m)) ok = 0;
    gmatcher_free(m);
    return ok;
}

static inline void tvocab_free(struct tvocab *t) {
    for (int i = 0; i < t->n; i++) free(t->bytes[i]);
    free(t->bytes);
    free(t->len);
    free(t->special);
    memset(t, 0, sizeof *t);
}

static inline void tvocab_add(struct tvocab *t, int cap, const void *b, size_t len, bool special) {
    if (t->n >= cap) return;
    t->bytes[t->n] = malloc(len + 1);
    memcpy(t->bytes[t->n], b, len);
    t->len[t->n] = len;
    t->special[t->n] = special;
    t->n++;
}

static inline void tvocab_alloc(struct tvocab *t, int cap) {
    t->bytes = calloc((size_t)cap, sizeof *t->bytes);
    t->len = calloc((size_t)cap, sizeof *t->len);
    t->special = calloc((size_t)cap, sizeof *t->special);
    t->n = 0;
}

/* Tokens 0..255: one byte each; then pieces; then <eos> (end) and <special>. */
static inline void tvocab_synthetic(struct tvocab *t) {
    static const char *const pieces[] = {
        "ab", "abc", "\"", "\",", "\":", "\": \"", "{\"", "}", "},", "\"}", "[", "]", "],", "[\"", "1", "12",
        "123", "0.", ".5", "-1", "e+", "true", "false", "null", "nul", " ", "  ", "\n", "\n ", " \"", ", ",
        "+", "*", "(", ")", "((", "))", "1+", "+2", "x", "xy", "é", "\xc3", "\xa9", "\xc3\xa9x", "a\xc3",
        "\xe2\x82", "\xac", "\xe2\x82\xac", "\xf0\x9f", "\x98\x80", "\xf0\x9f\x98\x80", "\xe4\xb8\xad\xe6",
        "\x96\x87", "\\", "\\n", "\\u00", "e9", "name", "\"name\"", "age", "\"age\": ", " 42", "42}", "a b",
        "\xff", "\x80", "1\xc3", "\xa9\xc3",
    };
    int cap = 256 + (int)(sizeof pieces / sizeof *pieces) + 2;
    tvocab_alloc(t, cap);
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        tvocab_add(t, cap, &c, 1, false);
    }
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++) tvocab_add(t, cap, pieces[i], strlen(pieces[i]), false);
    t->end_id = t->n;
    tvocab_add(t, cap, "", 0, true);
    tvocab_add(t, cap, "<special>", 9, true);
}

/* GPT-2's bytes_to_unicode, inverted: code point -> byte (-1: none). */
static inline int gpt2_byte_of(uint32_t cp) {
    static int table[324];
    static bool init;
    if (!init) {
        for (int i = 0; i < 324; i++) table[i] = -1;
        int n = 0;
        for (int b = 0; b < 256; b++) {
            bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            if (direct) table[b] = b;
            else table[256 + n++] = b;
        }
        init = true;
    }
    return cp < 324 ? table[cp] : -1;
}

/* A byte-level BPE vocabulary from an encoder.json; false if it is absent. */
static inline bool tvocab_gpt2(struct tvocab *t, const char *path) {
    json_object *j = json_object_from_file(path);
    if (!j) return false;
    int n = json_object_object_length(j);
    tvocab_alloc(t, n + 1);
    t->n = n + 1;
    json_object_object_foreach(j, key, val) {
        int id = json_object_get_int(val);
        if (id < 0 || id >= n) continue;
        char buf[1024];
        size_t len = 0;
        const unsigned char *s = (const unsigned char *)key;
        while (*s && len < sizeof buf) {
            uint32_t cp = *s++;
            if (cp >= 0xC0) {
                int extra = cp >= 0xF0 ? 3 : cp >= 0xE0 ? 2 : 1;
                cp &= 0x3Fu >> extra;
                for (int k = 0; k < extra && *s; k++) cp = (cp << 6) | (*s++ & 0x3Fu);
            }
            int b = gpt2_byte_of(cp);
            if (b < 0) { len = 0; break; }
            buf[len++] = (char)b;
        }
        t->bytes[id] = malloc(len + 1);
        memcpy(t->bytes[id], buf, len);
        t->len[id] = len;
        t->special[id] = !strcmp(key, "<|endoftext|>");
    }
    for (int i = 0; i < n; i++)
        if (!t->bytes[i]) { t->bytes[i] = calloc(1, 1); t->special[i] = true; }
    t->end_id = n;   /* an extra end token */
    t->bytes[n] = calloc(1, 1);
    t->special[n] = true;
    json_object_put(j);
    return true;
}

/* A SentencePiece vocabulary from llama2.c's tokenizer.bin ('▁' -> ' ',
 * <0xNN> -> the byte; <unk>, <s>, </s> special, </s> the end token). */
static inline bool tvocab_llama2c(struct tvocab *t, const char *path, int n_vocab) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    int max_len;
    if (fread(&max_len, 4, 1, f) != 1) { fclose(f); return false; }
    tvocab_alloc(t, n_vocab);
    for (int i = 0; i < n_vocab; i++) {
        float score;
        int len;
        if (fread(&score, 4, 1, f) != 1 || fread(&len, 4, 1, f) != 1 || len < 0 || len > 4096) break;
        char *raw = malloc((size_t)len + 1);
        if (fread(raw, 1, (size_t)len, f) != (size_t)len) { free(raw); break; }
        raw[len] = 0;
        char out[4096];
        size_t o = 0;
        unsigned hex;
        bool special = i < 3;
        if (len == 6 && sscanf(raw, "<0x%02X>", &hex) == 1) {
            out[o++] = (char)hex;
        } else if (!special) {
            for (int k = 0; k < len; k++) {
                if ((unsigned char)raw[k] == 0xE2 && k + 2 < len && (unsigned char)raw[k + 1] == 0x96 &&
                    (unsigned char)raw[k + 2] == 0x81) {
                    out[o++] = ' ';
                    k += 2;
                } else {
                    out[o++] = raw[k];
                }
            }
        }
        tvocab_add(t, n_vocab, out, o, special);
        free(raw);
    }
    fclose(f);
    t->end_id = 2;
    return t->n == n_vocab;
}

static inline int tvocab_index(const struct tvocab *t, struct gvocab **out) {
    int32_t end = t->end_id;
    return gvocab_new(t->n, (const char *const *)t->bytes, t->len, t->special, &end, 1, out);
}

#endif
