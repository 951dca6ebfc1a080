/* pretok.h — byte-level BPE pre-tokenizers: the text is cut into words by
 * the split regexes of a pre-tokenizer, named as GGUF's tokenizer.ggml.pre
 * names them (llama.cpp's names: "gpt-2", "llama-bpe", "qwen2", ...).
 *
 * Model of the world: a pre-tokenizer is a list of PCRE2 patterns (UTF +
 * UCP, JIT-compiled), applied one after the other as llama.cpp does: each
 * pattern cuts every piece the previous one left into its matches and the
 * text between them, so the pieces always tile the input.  The compiled
 * patterns are immutable; any number of threads may split with them. */
#ifndef KVLLM_TOK_PRETOK_H
#define KVLLM_TOK_PRETOK_H

#include <stdbool.h>
#include <stddef.h>

struct pretok;

/* Per-name defaults that llama.cpp attaches to a pre-tokenizer. */
struct pretok_info {
    bool ignore_merges; /* a word that is a whole vocabulary piece is not merged (llama3) */
    bool add_bos;       /* BOS by default when the vocab does not say */
};

/* Compile the patterns of pre-tokenizer name[0, n).  "default" (and a NULL
 * name) are llama.cpp's fallback list.  Errors: KVLLM_EUNSUPPORTED for an
 * unknown name (not logged: the caller knows where the name came from),
 * KVLLM_ENOMEM, KVLLM_EFORMAT (logged) if PCRE2 rejects a pattern (a bug).
 * *out is NULL on error. */
int pretok_new(const char *name, size_t n, struct pretok **out);
/* A pre-tokenizer from explicit patterns (PCRE2 syntax, NUL-terminated;
 * at most 8), applied one after the other as the named ones are: the
 * Split regexes of a tokenizer.json kvllm has no name for.  Errors
 * (logged, starting with what: "<file>: <key>"): KVLLM_EFORMAT when a
 * pattern does not compile (with its index and PCRE2's message),
 * KVLLM_EUNSUPPORTED for too many, KVLLM_ENOMEM. */
int pretok_new_patterns(const char *what, const char *const *patterns, int n, struct pretok_info info,
                        struct pretok **out);
void pretok_free(struct pretok *p);
struct pretok_info pretok_info(const struct pretok *p);

/* One word: bytes [off, off + len) of the text. */
struct pretok_span { size_t off, len; };

/* A growable list of spans, owned by the caller (free(v) when done). */
struct pretok_spans { struct pretok_span *v; size_t n, cap; };

/* Cut text[0, len) into words, replacing the contents of *out (its storage
 * is reused and grown).  Returns 0, KVLLM_ENOMEM, or KVLLM_EINVAL (logged)
 * when PCRE2 fails to match. */
int pretok_split(const struct pretok *p, const char *text, size_t len, struct pretok_spans *out);

#endif
