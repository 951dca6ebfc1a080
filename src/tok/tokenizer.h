/* tokenizer.h — text <-> token ids for the vocabularies kvllm reads.
 *
 * A tokenizer is built from GGUF metadata (tokenizer.ggml.*); other vocab
 * sources (llama2.c tokenizer.bin) are first turned into those keys by the
 * load module.  It copies what it needs: the gguf may be freed afterwards.
 *
 * Threads: a tokenizer is immutable once tokenizer_new returns, so any number
 * of threads may call every tokenizer_* function on one at once (the server's
 * handlers tokenize while the engine thread decodes).  A struct detok is the
 * caller's: one per stream, used by one thread at a time.
 *
 * Ownership and errors: tokenizer_new's result is the caller's, freed by
 * tokenizer_free (NULL-safe) once no thread uses it; strings returned point
 * into the tokenizer (or the detok) and live as long as it.  Functions that
 * return int give a negative KVLLM_E* on error, logged where it is found;
 * nothing is written past the caller's capacity. */
#ifndef KVLLM_TOKENIZER_H
#define KVLLM_TOKENIZER_H

#include "load/gguf.h"
#include "core/strbuf.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Token types as GGUF tokenizer.ggml.token_type stores them. */
enum tok_type {
    TOK_UNDEFINED = 0, TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3,
    TOK_USER_DEFINED = 4, TOK_UNUSED = 5, TOK_BYTE = 6,
};

struct tokenizer;

/* From tokenizer.ggml.model ("llama" = SentencePiece BPE, "gpt2" = byte-level
 * BPE with .merges and the .pre pre-tokenizer name), .tokens, .scores,
 * .token_type, .bos/.eos/.unknown_token_id, .add_bos_token, .add_space_prefix.
 * Errors (logged with the gguf path): KVLLM_ENOTFOUND when there is no
 * vocabulary, KVLLM_EUNSUPPORTED for an unknown tokenizer model or
 * pre-tokenizer, KVLLM_EFORMAT for inconsistent arrays or ids out of range,
 * KVLLM_ENOMEM; *out is NULL on error and nothing is left allocated. */
int tokenizer_new(const struct gguf *g, struct tokenizer **out);
void tokenizer_free(struct tokenizer *t);

int tokenizer_n_vocab(const struct tokenizer *t);
int tokenizer_bos(const struct tokenizer *t);        /* -1 if none */
int tokenizer_eos(const struct tokenizer *t);        /* -1 if none */
bool tokenizer_add_bos(const struct tokenizer *t);   /* does the vocab ask for BOS? */
/* TOK_UNDEFINED when id is out of range. */
enum tok_type tokenizer_type(const struct tokenizer *t, int id);
/* The vocabulary entry as stored ("▁the", "<0x0A>"), NUL-terminated, owned
 * by t; NULL when id is out of range. */
const char *tokenizer_piece(const struct tokenizer *t, int id);

/* Encode len bytes. add_bos: prepend BOS if the vocab asks for it (and has
 * one).  parse_special: text of CONTROL (and UNKNOWN) tokens becomes those
 * tokens; USER_DEFINED token text always does, as in llama.cpp.  Like
 * llama.cpp, the space prefix goes before the first text and before text
 * that follows a special token.  Writes up to n_max ids (ids may be NULL
 * when n_max is 0); returns the full count, or KVLLM_ERANGE when it would
 * pass INT_MAX, KVLLM_ENOMEM (both logged). */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len,
                     bool add_bos, bool parse_special, int32_t *ids, int n_max);

/* A byte range [off, off + len) of a text. */
struct tok_span {
    size_t off, len;
};

/* tokenizer_encode with parse_special, except inside the `plain` spans
 * (sorted, disjoint; n_plain may be 0): control and unknown token text
 * that overlaps one is read as text, as parse_special=false would read it
 * (user-defined token text is matched everywhere, as always).  The text is
 * cut at exactly the special pieces tokenizer_encode would cut at, less
 * those, so with no control-token text inside a span the ids are those of
 * tokenizer_encode(parse_special=true).  Used for chat renderings whose
 * message text must not turn into control tokens.  Returns the full count
 * (ids as tokenizer_encode), or KVLLM_EINVAL (logged) for spans out of order
 * or past the text, or another negative error. */
int tokenizer_encode_spans(const struct tokenizer *t, const char *text, size_t len, bool add_bos,
                           const struct tok_span *plain, size_t n_plain, int32_t *ids, int n_max);

/* Bytes of one token: '▁' -> ' ', <0xNN> -> byte, CONTROL/UNKNOWN -> "".
 * If prev is BOS or -1 (the start of the text) and the vocab adds a space
 * prefix, the leading space is dropped, as SentencePiece decoders do; pass
 * -2 for a token in the middle of a text (its space kept).  Returns the
 * byte count (may exceed cap: nothing past cap is written), or KVLLM_EINVAL
 * for an id out of range. */
int tokenizer_token_bytes(const struct tokenizer *t, int prev, int id, char *buf, size_t cap);

/* Decode a whole id sequence (inverse of encode: decode(encode(x)) == x
 * for valid UTF-8 x without '▁' or special-token text).  Returns the byte
 * count like tokenizer_token_bytes (KVLLM_EINVAL for an id out of range,
 * KVLLM_ERANGE past INT32_MAX bytes); NUL-terminated when the count < cap. */
int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int n, char *buf, size_t cap);

/* Streaming decoder: holds back bytes of an unfinished UTF-8 character. */
struct detok {
    const struct tokenizer *t;
    char pending[8];  /* bytes of an incomplete UTF-8 sequence */
    int n_pending;
    struct strbuf out;   /* the text handed out last, its memory kept for the next */
    bool special;        /* a control token gives its text ("<|im_start|>"), not "" (set after detok_init) */
};
/* detok_init cannot fail (the buffer grows on first use); detok_deinit is
 * NULL-safe.  t must outlive d. */
void detok_init(struct detok *d, const struct tokenizer *t);
void detok_deinit(struct detok *d);
/* Returns NUL-terminated complete text (owned by d, valid until next call);
 * invalid bytes come out as U+FFFD.  NULL only when out of memory. */
const char *detok_push(struct detok *d, int prev, int id);
/* Remaining bytes; an incomplete sequence becomes U+FFFD. */
const char *detok_flush(struct detok *d);

#endif
