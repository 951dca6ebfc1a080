/* llama2.c checkpoints (legacy version-0 format) and tokenizer.bin files,
 * turned into in-memory GGUF (llama architecture keys, GGUF tensor names,
 * tokenizer.ggml.* keys) so that everything downstream reads one format. */
#ifndef KVLLM_LLAMA2C_H
#define KVLLM_LLAMA2C_H

#include "load/gguf.h"

/* Silent probe: the 7-int header is plausible (sizes checked by llama2c_open). */
bool llama2c_is_checkpoint(const char *path);

/* Map a checkpoint and describe it as a GGUF (tensors borrow the mapping,
 * which the returned gguf owns).  Errors logged with the path. */
int llama2c_open(const char *path, struct gguf **out);

/* Read a llama2.c tokenizer.bin and set tokenizer.ggml.{model,tokens,scores,
 * token_type,bos_token_id,eos_token_id,unknown_token_id,add_bos_token,
 * add_space_prefix} on g.  n_vocab: tokens to read (the model's vocab size),
 * or -1 to read until end of file.  Undoes the export's changes: pieces get
 * '▁' back for ' ', "\n<s>\n" and "\n</s>\n" become "<s>" and "</s>".
 * Types: <0xNN> BYTE, <unk> UNKNOWN, <s>/</s> CONTROL, else NORMAL. */
int llama2c_vocab_to_gguf(const char *path, int n_vocab, struct gguf *g);

/* A vocabulary file: a GGUF (opened as it is), a Hugging Face tokenizer.json
 * or a folder holding one (hf_vocab_open), or a llama2.c tokenizer.bin
 * (read into a new in-memory GGUF, n_vocab as for llama2c_vocab_to_gguf).
 * On error *out is NULL (the problem is logged). */
int vocab_file_open(const char *path, int n_vocab, struct gguf **out);

#endif
