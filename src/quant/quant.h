/* quant.h — rewriting a GGUF model's weights in another type (`kvllm quantize`): the policy, which
 * tensor gets which type, and the conversion.
 *
 * The policy is llama-quantize's.  Which tensors change: those with two or more dimensions (of size
 * > 1) whose name ends in "weight" (not ffn_gate_inp, pos_embd, token_types); 1-D tensors (norms,
 * biases) are copied unchanged.  A plain target (Q8_0, Q4_K, ...) puts every such matrix in its type
 * (llama-quantize --pure); Q4_K_M and Q5_K_M are llama-quantize's mixes for Llama-style models
 * (llama_tensor_get_type):
 *   output.weight (token_embd.weight when there is no output.weight) Q6_K;
 *   attn_v.weight and ffn_down.weight Q6_K in the layers where
 *     use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2,
 *     i counting those tensors in file order, n how many there are;
 *   attn_qkv.weight Q5_K (Q4_K_M) or Q6_K (Q5_K_M); the rest Q4_K / Q5_K.
 * A row length (ne[0]) that is not a whole number of blocks of the chosen type falls back:
 *   Q2_K, Q3_K, IQ4_XS -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 (the output in a mix: Q8_0),
 *   as llama.cpp's convert_incompatible_tensor; a 32-element block type that does not fit either -> F16.
 * The plan decides every tensor's type before any work (so a refusal costs nothing).
 *
 * The conversion: a tensor already in its target type is copied byte for byte; others are dequantized
 * row by row (dtype_to_f32) and quantized with the reference quantizers (dtype_from_f32), rows in
 * chunks over a thread pool.  A row's bytes depend on that row alone, so the output does not depend on
 * the thread count.  general.file_type is set in llama.cpp's LLAMA_FTYPE numbering (a pure K type as
 * its _S variant: Q3_K 11, Q4_K 14, Q5_K 16, Q6_K 18; MXFP4 as MXFP4_MOE 38).
 *
 * Errors are logged once, naming the file and tensor, and returned as KVLLM_E* codes. */
#ifndef KVLLM_QUANT_H
#define KVLLM_QUANT_H

#include <stddef.h>
#include <stdint.h>

struct gguf;
struct threadpool;

enum quant_mix { QUANT_MIX_NONE, QUANT_MIX_Q4_K_M, QUANT_MIX_Q5_K_M };

struct quant_target {
    const char *name;   /* "Q4_K_M" */
    uint32_t type;      /* DTYPE_*: every matrix's type, or the mix's base */
    uint32_t ftype;     /* general.file_type (LLAMA_FTYPE_*) */
    enum quant_mix mix;
};

/* The target named name (case-insensitive), or NULL.  Static storage. */
const struct quant_target *quant_target_find(const char *name);
/* The targets' names, space-separated, into out (cut to cap). */
void quant_target_names(char *out, size_t cap);

#define QUANT_MAX_FALLBACK_GROUPS 8

/* Tensors whose rows fell back, grouped by (wanted, used, row length) for one summary line. */
struct quant_fallback {
    uint32_t want, to;
    int64_t ne0;
    int n;
    char first[64];   /* the first tensor's name (cut) */
};

struct quant_plan {
    uint32_t *to;                 /* (n_tensors) output type of each tensor; owned */
    int n_quantized;              /* tensors whose type changes to or from a block type */
    int n_requant;                /* of those, converted from an already block-quantized type */
    char first_requant[160];      /* "NAME (Q8_0 -> Q4_0)" of the first */
    struct quant_fallback fb[QUANT_MAX_FALLBACK_GROUPS];
    int n_fb_groups, n_fb, n_fb_other;   /* groups, tensors that fell back, those in no group */
};

/* Decide every tensor's type, walking src's tensors in file order as llama-quantize does.  0, or a
 * KVLLM_E* code (logged: a tensor kvllm cannot read, a name too long; out of memory); p is then
 * freed.  Free a plan with quant_plan_free (NULL-safe, idempotent). */
int quant_plan_make(const struct gguf *src, const struct quant_target *t, struct quant_plan *p);
void quant_plan_free(struct quant_plan *p);

/* Called after each tensor is added to dst: its index, name, types and bytes before and after. */
typedef void (*quant_tensor_fn)(uint64_t i, const char *name, uint32_t from, uint32_t to, uint64_t in_bytes,
                                uint64_t out_bytes, void *user);

/* Fill dst (from gguf_new) with src's metadata (general.file_type and general.quantization_version
 * set) and its tensors converted as p says, on pool's threads.  Converted data lives in dst (gguf_alloc)
 * until gguf_free(dst).  0, or a KVLLM_E* code (logged: a row holding a NaN or infinity, a tensor too
 * large, out of memory); dst is then partly filled and only fit to be freed. */
int quant_model(const struct gguf *src, const struct quant_target *t, const struct quant_plan *p,
                struct threadpool *pool, struct gguf *dst, quant_tensor_fn on_tensor, void *user);

#endif
