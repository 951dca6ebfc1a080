/* llama2c_vocab.c — llama2.c tokenizer.bin -> tokenizer.ggml.* keys.
 *
 * The file (written by llama2.c's tokenizer.py export) is
 *     int32 max_token_length
 *     n_vocab times: float32 score, int32 len, len bytes of piece
 * little-endian, with no count and no magic: the number of tokens is the
 * model's vocab_size (or whatever the file holds).  The exporter turned
 * SentencePiece's '▁' into ' ' and wrote BOS/EOS as "\n<s>\n"/"\n</s>\n";
 * both are undone here so the vocabulary is the SentencePiece one again. */
#include "load/llama2c.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* SentencePiece's fixed ids, which llama2.c's models use. */
enum { L2C_UNK = 0, L2C_BOS = 1, L2C_EOS = 2 };

/* Token types as GGUF's tokenizer.ggml.token_type stores them. */
enum { TYPE_NORMAL = 1, TYPE_UNKNOWN = 2, TYPE_CONTROL = 3, TYPE_BYTE = 6 };

struct l2c_vocab {
    int n;                  /* tokens read */
    struct gguf_str *pieces;/* (n) into text */
    float *scores;          /* (n) */
    int32_t *types;         /* (n) */
    char *text;             /* restored pieces, back to back */
};

static void vocab_free(struct l2c_vocab *v) {
    free(v->pieces);
    free(v->scores);
    free(v->types);
    free(v->text);
}

static int32_t rd_i32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }
static float rd_f32(const uint8_t *p) { float v; memcpy(&v, p, 4); return v; }

static bool is_byte_piece(const char *s, size_t n) {
    static const char hex[] = "0123456789ABCDEF";
    return n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' &&
           memchr(hex, s[3], 16) && memchr(hex, s[4], 16);
}

/* Count the tokens (n_vocab < 0: all the file holds) and check every length
 * against the file before anything is copied.  Sets *n and *text_bytes: an
 * upper bound on the restored pieces (each ' ' grows to three bytes). */
static int scan(const char *path, const struct file_map *m, int n_vocab, int *n, size_t *text_bytes) {
    size_t off = 4, bytes = 0;
    int i = 0;
    for (; n_vocab < 0 ? off < m->size : i < n_vocab; i++) {
        if (i == INT_MAX || m->size - off < 8) {
            LOG_ERR("%s: truncated at token %d (offset %zu): no room for its score and length",
                    path, i, off);
            return KVLLM_EFORMAT;
        }
        int32_t len = rd_i32(m->data + off + 4);
        off += 8;
        if (len < 0 || (size_t)len > m->size - off) {
            LOG_ERR("%s: token %d (offset %zu) has length %d but %zu bytes remain",
                    path, i, off - 4, (int)len, m->size - off);
            return KVLLM_EFORMAT;
        }
        off += (size_t)len;
        bytes += 3 * (size_t)len;
    }
    if (i == 0) {
        LOG_ERR("%s: tokenizer has no tokens", path);
        return KVLLM_EFORMAT;
    }
    *n = i;
    *text_bytes = bytes;
    return 0;
}

/* Copy piece i back to SentencePiece form at dst; returns its length. */
static size_t restore_piece(int i, const uint8_t *s, size_t n, char *dst) {
    if (i == L2C_BOS && n == 5 && memcmp(s, "\n<s>\n", 5) == 0) { memcpy(dst, "<s>", 3); return 3; }
    if (i == L2C_EOS && n == 6 && memcmp(s, "\n</s>\n", 6) == 0) { memcpy(dst, "</s>", 4); return 4; }
    size_t o = 0;
    for (size_t k = 0; k < n; k++) {
        if (s[k] == ' ') { memcpy(dst + o, "\xe2\x96\x81", 3); o += 3; }
        else dst[o++] = (char)s[k];
    }
    return o;
}

static int32_t piece_type(int i, const char *s, size_t n) {
    if (i == L2C_UNK) return TYPE_UNKNOWN;
    if (i == L2C_BOS || i == L2C_EOS) return TYPE_CONTROL;
    return is_byte_piece(s, n) ? TYPE_BYTE : TYPE_NORMAL;
}

static int read_vocab(const char *path, const struct file_map *m, int n_vocab, struct l2c_vocab *v) {
    if (m->size < 4) {
        LOG_ERR("%s: too short for a llama2.c tokenizer (%zu bytes)", path, m->size);
        return KVLLM_EFORMAT;
    }
    size_t text_bytes;
    int rc = scan(path, m, n_vocab, &v->n, &text_bytes);
    if (rc < 0) return rc;
    v->pieces = xmalloc((size_t)v->n * sizeof *v->pieces);
    v->scores = xmalloc((size_t)v->n * sizeof *v->scores);
    v->types = xmalloc((size_t)v->n * sizeof *v->types);
    v->text = xmalloc(text_bytes ? text_bytes : 1);
    if (!v->pieces || !v->scores || !v->types || !v->text) return KVLLM_ENOMEM;
    size_t off = 4, o = 0;
    for (int i = 0; i < v->n; i++) {
        v->scores[i] = rd_f32(m->data + off);
        size_t len = (size_t)rd_i32(m->data + off + 4);
        off += 8;
        size_t n = restore_piece(i, m->data + off, len, v->text + o);
        off += len;
        v->pieces[i] = (struct gguf_str){ v->text + o, n };
        v->types[i] = piece_type(i, v->text + o, n);
        o += n;
    }
    return 0;
}

static int set_keys(struct gguf *g, const struct l2c_vocab *v) {
    int rc = gguf_set_str(g, "tokenizer.ggml.model", "llama");
    if (rc == 0) rc = gguf_set_arr_str(g, "tokenizer.ggml.tokens", v->pieces, (uint64_t)v->n);
    if (rc == 0) rc = gguf_set_arr(g, "tokenizer.ggml.scores", GGUF_T_FLOAT32, v->scores, (uint64_t)v->n);
    if (rc == 0) rc = gguf_set_arr(g, "tokenizer.ggml.token_type", GGUF_T_INT32, v->types, (uint64_t)v->n);
    /* ids the model may lack (a tiny vocabulary) are left unset */
    if (rc == 0 && v->n > L2C_BOS) rc = gguf_set_u32(g, "tokenizer.ggml.bos_token_id", L2C_BOS);
    if (rc == 0 && v->n > L2C_EOS) rc = gguf_set_u32(g, "tokenizer.ggml.eos_token_id", L2C_EOS);
    if (rc == 0) rc = gguf_set_u32(g, "tokenizer.ggml.unknown_token_id", L2C_UNK);
    if (rc == 0) rc = gguf_set_bool(g, "tokenizer.ggml.add_bos_token", true);
    if (rc == 0) rc = gguf_set_bool(g, "tokenizer.ggml.add_space_prefix", true);
    return rc;
}

/* On error g may hold some of the keys already. */
int llama2c_vocab_to_gguf(const char *path, int n_vocab, struct gguf *g) {
    struct file_map m;
    int rc = file_map_open(&m, path);
    if (rc < 0) return rc;
    struct l2c_vocab v = { 0 };
    rc = read_vocab(path, &m, n_vocab, &v);
    if (rc == 0) rc = set_keys(g, &v);
    vocab_free(&v);
    file_map_close(&m);
    return rc;
}
