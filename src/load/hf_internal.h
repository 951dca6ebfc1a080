/* hf_internal.h — what the Hugging Face readers and writers share: hf.c /
 * hf_write.c (model folders) and hf_tokenizer.c / hf_tokenizer_write.c
 * (tokenizer.json).  Not part of the module's interface: only
 * src/load/hf*.c include it. */
#ifndef KVLLM_HF_INTERNAL_H
#define KVLLM_HF_INTERNAL_H

#include "load/gguf.h"

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Parse a whole JSON file whose top level must be an object; logs
 * "<path>: malformed JSON: ..." and returns KVLLM_EFORMAT (or KVLLM_EIO,
 * KVLLM_ENOMEM) on failure, *out NULL.  The caller owns *out
 * (json_object_put). */
int hf_read_json(const char *path, json_object **out);

/* dir + "/" + name, malloc'd (NULL on OOM). */
char *hf_path_join(const char *dir, const char *name);

/* ---- model folders (hf.c reads, hf_write.c writes) ---- */

enum hf_arch { HF_LLAMA, HF_QWEN2, HF_GPT2, HF_QWEN3, HF_GEMMA3, HF_PHI3, HF_GEMMA2, HF_SMOLLM3, HF_ARCH_COUNT_ };

/* The GGUF architecture name of each hf_arch. */
extern const char *const hf_gguf_arch[HF_ARCH_COUNT_];

/* How a tensor's rows change on the way in: Q/K rows from halves to pairs
 * (Llama), a Conv1D (in, out) matrix transposed to (out, in) rows (GPT-2),
 * or a Gemma norm's w stored as 1 + w; the writer undoes the same. */
enum { PERM_NONE, PERM_Q, PERM_K, PERM_T, PERM_SHIFT };

/* Row permutation between HF's halves and GGUF's pairs layout, for a
 * (n_head * head_dim, cols) matrix of row_bytes rows.  to_gguf: row
 * h*hd + 2i + j of the result is row h*hd + j*hd/2 + i of src; else the
 * inverse.  dst and src must not overlap. */
void hf_permute_rows(uint8_t *dst, const uint8_t *src, int64_t n_head, int64_t hd, size_t row_bytes, bool to_gguf);

/* ---- tokenizer.json (hf_tokenizer.c reads, hf_tokenizer_write.c writes) ---- */

#define MAX_VOCAB (1 << 24)

/* Token types as GGUF stores them (tok/tokenizer.h's enum tok_type). */
enum { T_NORMAL = 1, T_UNKNOWN = 2, T_CONTROL = 3, T_USER = 4, T_UNUSED = 5, T_BYTE = 6 };

#define SPM_SPACE "\xe2\x96\x81" /* '▁' */

/* Entries of a pre-tokenizer description: a Split regex as written, or one
 * of these markers for the built-in steps. */
#define PRE_BYTELEVEL "\x01" "ByteLevel"
#define PRE_DIGIT     "\x01" "Digits1"
#define PRE_DIGITS    "\x01" "Digits+"
#define MAX_PRE 8

/* The byte-level pre-tokenizers kvllm knows, in tokenizer.json's spelling. */
struct known_pre {
    const char *name;            /* tokenizer.ggml.pre */
    bool ignore_merges;          /* as llama.cpp attaches it to the name */
    const char *steps[MAX_PRE];  /* NULL-terminated */
};
#define N_KNOWN_PRE 5
extern const struct known_pre hf_known_pre[N_KNOWN_PRE];

/* piece -> id: an open-addressing hash over an array of pieces. */
struct piece_index {
    const struct gguf_str *tok;   /* the pieces, not owned */
    int32_t *slots;               /* -1: empty */
    uint32_t mask;
};

/* Index tok[0 .. n) (a repeated piece keeps its first id); 0 or
 * KVLLM_ENOMEM.  The caller frees x->slots. */
int piece_index_build(struct piece_index *x, const struct gguf_str *tok, int n);
/* The id of piece s (n bytes), or -1. */
int piece_index_find(const struct piece_index *x, const char *s, size_t n);

#endif
