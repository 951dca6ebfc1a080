/* hf.h — Hugging Face model folders (Llama, Mistral, Qwen2, GPT-2, Qwen3,
 * Gemma 2, Gemma 3 text, Phi-3, SmolLM3, and the mixtures of experts
 * Mixtral and Qwen3-MoE) read as an in-memory GGUF, and written from one
 * (not the mixtures).
 *
 * Model of the world: a folder holds config.json (hyper-parameters) and
 * the weights in model.safetensors, or in shards listed by
 * model.safetensors.index.json.  hf_open maps every shard into one
 * contiguous reservation owned by the returned gguf (g->map), validates
 * each header (safetensors.h), renames tensors to GGUF's names and sets
 * llama.* keys, so the model code sees what it sees for a GGUF file.
 *
 * RoPE layout: HF Llama rotates the two halves of each head (rotate_half),
 * GGUF llama (and smollm3) rotates adjacent pairs.  As llama.cpp's
 * converter does, the rows of Q and K are permuted on load (reshape
 * (n_head, 2, head_dim/2, n_embd), swap axes 1 and 2); those copies live in
 * the gguf's arena.
 * (GGUF's qwen2, qwen3, gemma2, gemma3 and phi3 rotate halves too: no
 * permutation; Phi-3's fused qkv_proj and gate_up_proj stay fused, as
 * llama.cpp keeps them, and its LongRoPE factors become rope_factors_long
 * / _short.)
 * Experts: one 2-D tensor per expert as the folder has them, named
 * blk.N.ffn_{gate,up,down}.E.weight (llama.cpp's first Mixtral layout),
 * left in the mapping: the model takes them as the experts' views, where a
 * GGUF file has them stacked in 3-D ffn_*_exps (copying them into that
 * shape would double a large model's memory at load).
 * 1-D tensors (the norms) are converted to F32, as GGUF files store them,
 * Gemma's with its RMSNorm offset added (GGUF stores 1 + w); everything
 * else keeps its dtype and stays in the mapping.
 *
 * The vocabulary: tokenizer.json (+ tokenizer_config.json) when the folder
 * has one, turned into tokenizer.ggml.* keys by hf_tokenizer.c; without
 * one the model has no vocabulary (pass a tokenizer file, --tokenizer). */
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

/* A mixture of experts read from a folder (hf_open) keeps each expert's
 * tensors apart; for writing it as a GGUF file, stack them into the 3-D
 * blk.N.ffn_{gate,up,down}_exps.weight (n_expert, rows, cols) that GGUF
 * files and llama.cpp's converter have, and drop the per-expert ones.  The
 * stacked copies live in g's arena: this needs the experts' size in memory,
 * which is why loading a folder does not do it.  A g without expert_count,
 * or already stacked, is left as it is.  Errors (logged): KVLLM_EFORMAT for
 * experts of one kind that differ in shape or type, KVLLM_ENOMEM. */
int hf_stack_experts(struct gguf *g);

/* Write a GGUF (llama, mistral, qwen2, gpt2, qwen3, gemma2, gemma3, phi3
 * or smollm3 architecture; F32/F16/BF16 tensors) as a HF folder:
 * config.json, generation_config.json, model.safetensors (llama and smollm3
 * Q/K rows permuted back to the halves layout, GPT-2 matrices back to
 * Conv1D, Gemma's norms less the 1 GGUF adds; Phi-3's LongRoPE factors go
 * to config.json), and, when g carries a vocabulary, tokenizer.json + tokenizer_config.json (hf_tokenizer_write).  Creates dir
 * if needed.  Every file is written to a temporary file beside it and
 * renamed into place once all are complete: on error (logged with the path)
 * the files already there are left as they were (tokenizer.json aside, if
 * tokenizer_config.json alone fails) and no temporary file remains. */
int hf_write(const struct gguf *g, const char *dir);

/* ---- tokenizer.json (hf_tokenizer.c) ---- */

/* Read a tokenizer.json, and config_path (tokenizer_config.json; NULL or
 * absent: skipped) for bos/eos/unk, add_bos_token and chat_template, into
 * tokenizer.ggml.* keys (+ tokenizer.chat_template) of g.  Byte-level BPE
 * becomes model "gpt2" with merges and a named pre-tokenizer; the
 * SentencePiece-style form (Prepend/Replace normalizer or Metaspace, BPE
 * with byte_fallback) model "llama" with scores = -(rank of the first merge
 * making the piece).  Errors (logged "<file>: <json path>: <problem>"):
 * KVLLM_EFORMAT for malformed input, KVLLM_EUNSUPPORTED for a model,
 * normalizer, pre-tokenizer or post-processor kvllm does not run,
 * KVLLM_EIO, KVLLM_ENOMEM; g may then hold some keys. */
int hf_tokenizer_read(const char *json_path, const char *config_path, struct gguf *g);

/* Does path name an existing regular file ending in ".json"? */
bool hf_is_tokenizer_json(const char *path);

/* A vocabulary from a tokenizer.json file (with the tokenizer_config.json
 * beside it) or from a folder holding one: a new in-memory gguf with only
 * the tokenizer keys.  Errors as hf_tokenizer_read (KVLLM_ENOTFOUND for a
 * folder without tokenizer.json); *out NULL on error. */
int hf_vocab_open(const char *path, struct gguf **out);

/* Write dir/tokenizer.json and dir/tokenizer_config.json from g's
 * tokenizer.ggml.* keys (and tokenizer.chat_template): "llama" vocabularies
 * in the Llama 2 form (merges rebuilt from the scores, as Transformers'
 * converter does), "gpt2" ones with the pre-tokenizer their
 * tokenizer.ggml.pre names (gpt-2, llama-bpe, smaug-bpe, qwen2, smollm,
 * starcoder...).  Returns 0 without writing when g has no vocabulary;
 * KVLLM_EUNSUPPORTED (logged) for a vocabulary it cannot express.  Both
 * files are staged beside their targets and renamed into place when both
 * are complete; on error neither target is touched. */
int hf_tokenizer_write(const struct gguf *g, const char *dir);

#endif
