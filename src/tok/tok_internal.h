/* tok_internal.h — the tokenizer's tables, shared by tokenizer.c (loading,
 * lookups, decoding), spm.c and bpe.c (encoding) and detok.c (streaming
 * decode).
 * Not part of the module's interface: only src/tok/ includes it. */
#ifndef KVLLM_TOK_INTERNAL_H
#define KVLLM_TOK_INTERNAL_H

#include "tok/tokenizer.h"

/* The SentencePiece encoder (spm.c); tokenizer_encode picks it or
 * byte-level BPE (bpe.c) by the vocabulary's model. */
int tok_spm_encode(const struct tokenizer *t, const char *text, size_t len,
                   bool add_bos, bool parse_special, int32_t *ids, int n_max);

struct bpe;

struct tokenizer {
    int n_vocab;
    char *pieces;          /* every piece, NUL-terminated, piece id at piece_off[id] */
    size_t *piece_off;     /* (n_vocab + 1): piece id is pieces[off[id], off[id+1] - 1) */
    char *text;            /* decoded bytes of every token, back to back, no NULs added */
    size_t *text_off;      /* (n_vocab + 1): same layout as piece_off, without the NUL */
    float *scores;         /* (n_vocab) merge priority: higher merges first */
    uint8_t *types;        /* (n_vocab) enum tok_type */

    int32_t *slots;        /* open-addressing hash piece -> id; -1 is empty */
    uint32_t slot_mask;    /* slot count - 1 (a power of two >= 2 * n_vocab) */

    int32_t byte_id[256];  /* token for a raw byte (<0xNN>, else the 1-byte piece), -1 none */
    int32_t *special;      /* CONTROL, USER_DEFINED, UNKNOWN ids with a non-empty piece,
                            * longest piece first: matched in the text before merging */
    int n_special;

    int bos, eos, unk;     /* -1 when absent */
    bool add_bos;          /* tokenizer.ggml.add_bos_token */
    bool add_space_prefix; /* tokenizer.ggml.add_space_prefix */

    struct bpe *bpe;       /* byte-level BPE ("gpt2" model): merges and pre-tokenizer;
                            * NULL for SentencePiece */
};

/* Id of the piece s[0, n), or -1 when it is not in the vocabulary. */
int tok_lookup(const struct tokenizer *t, const char *s, size_t n);

/* Piece bytes and length of a valid id. */
static inline const char *tok_piece(const struct tokenizer *t, int id, size_t *n) {
    *n = t->piece_off[id + 1] - t->piece_off[id] - 1;
    return t->pieces + t->piece_off[id];
}

/* Decoded bytes of token id following prev (the leading-space rule of
 * tokenizer_token_bytes applied).  NULL (logged) when id is out of range. */
const char *tok_text(const struct tokenizer *t, int prev, int id, size_t *n);

#endif
