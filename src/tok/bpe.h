/* bpe.h — byte-level BPE (GPT-2 style): merge ranks, encoding, and the
 * vocab.json + merges.txt reader.
 *
 * A tokenizer whose tokenizer.ggml.model is "gpt2" carries a struct bpe
 * (tokenizer.c builds it); tokenizer_encode hands such vocabularies to
 * bpe_encode.  Bare vocab.json + merges.txt files are first turned into the
 * same tokenizer.ggml.* keys (bpe_files_to_gguf), so one path serves both. */
#ifndef KVLLM_TOK_BPE_H
#define KVLLM_TOK_BPE_H

#include "load/gguf.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;
struct bpe;

/* From tokenizer.ggml.merges ("a b" strings, rank = index; a repeated pair
 * keeps its first rank) and tokenizer.ggml.pre (absent: "default", as
 * llama.cpp does).  Errors (logged): KVLLM_EUNSUPPORTED for an unknown
 * pre-tokenizer or missing merges, KVLLM_EFORMAT for a merge without a
 * space, KVLLM_ENOMEM. */
int bpe_new(const struct gguf *g, struct bpe **out);
void bpe_free(struct bpe *b);
/* Does the pre-tokenizer ask for BOS by default (llama3)? */
bool bpe_default_add_bos(const struct bpe *b);

/* tokenizer_encode for byte-level vocabularies (same contract). */
int bpe_encode(const struct tokenizer *t, const char *text, size_t len,
               bool add_bos, bool parse_special, int32_t *ids, int n_max);

/* A token added to a vocab.json vocabulary: CONTROL type, text at id. */
struct bpe_special { const char *text; int32_t id; };

/* Build tokenizer.ggml.* keys (model "gpt2", tokens, token_type, merges,
 * pre, bos/eos ids) from a Hugging Face vocab.json and merges.txt (a first
 * "#version" line is skipped).  Ids missing from vocab.json become UNUSED
 * "[PADn]" pieces; specials override or extend the vocabulary.  pre NULL:
 * "gpt-2".  bos: <|begin_of_text|> or <|endoftext|> when present (the
 * latter also marked CONTROL and used as eos); eos: <|end_of_text|>.
 * Errors (logged with the path): KVLLM_EIO, KVLLM_EFORMAT, KVLLM_ENOMEM;
 * *out is NULL on error, else owned by the caller (gguf_free). */
int bpe_files_to_gguf(const char *vocab_json, const char *merges_txt, const char *pre,
                      const struct bpe_special *specials, int n_specials, struct gguf **out);

#endif
