/* hf.h — Hugging Face model folders (Llama / Mistral architecture) read as
 * an in-memory GGUF, and written from one.
 *
 * Model of the world: a folder holds config.json (hyper-parameters) and
 * the weights in model.safetensors, or in shards listed by
 * model.safetensors.index.json.  hf_open maps every shard into one
 * contiguous reservation owned by the returned gguf (g->map), validates
 * each header (safetensors.h), renames tensors to GGUF's names and sets
 * llama.* keys, so the model code sees what it sees for a GGUF file.
 *
 * RoPE layout: HF Llama rotates the two halves of each head (rotate_half),
 * GGUF llama rotates adjacent pairs.  As llama.cpp's converter does, the
 * rows of Q and K are permuted on load (reshape (n_head, 2, head_dim/2,
 * n_embd), swap axes 1 and 2); those copies live in the gguf's arena.
 * 1-D tensors (the norms) are converted to F32, as GGUF files store them;
 * everything else keeps its dtype and stays in the mapping.
 *
 * The vocabulary (tokenizer.json) is not read here: without one, pass a
 * tokenizer file (--tokenizer). */
#ifndef KVLLM_HF_H
#define KVLLM_HF_H

#include "load/gguf.h"

/* Is path a directory holding config.json?  (Silent probe.) */
bool hf_is_folder(const char *path);

/* Read the folder as a GGUF.  On error logs one line naming the file
 * (config.json, the index, or a shard, with the tensor where there is
 * one), returns KVLLM_EFORMAT / KVLLM_EUNSUPPORTED / KVLLM_EIO /
 * KVLLM_ENOMEM and sets *out to NULL. */
int hf_open(const char *dir, struct gguf **out);

/* Write a llama GGUF (F32/F16/BF16 tensors) as a HF folder: config.json,
 * generation_config.json, model.safetensors (Q/K rows permuted back to
 * the halves layout).  Creates dir if needed.  No tokenizer files are
 * written.  Errors logged with the path; the folder may be left partial. */
int hf_write(const struct gguf *g, const char *dir);

#endif
