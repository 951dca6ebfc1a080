/* model.h — a loaded model: hyper-parameters from metadata, weights placed
 * by the backend that computes with them, and the forward pass.
 *
 * Threads: a loaded model is immutable: any number of engines on any
 * threads may run model_forward on it at once, each with its own execution
 * context, activation buffers and KV storage (tests/unit/test_engine_share.c).
 * A struct forward_buf belongs to one engine and is used by one thread at a
 * time.  Model code never dereferences weight, KV or activation memory: it
 * only hands backend pointers to ops.
 *
 * Ownership: model_load's model is the caller's and owns its backend (and
 * with it the placed weights); free it with model_free (NULL-safe) after
 * every engine, context and buffer made over it.  Errors are negative
 * KVLLM_E* codes, logged once where they are found.
 *
 * The forward pass takes a batch of tokens from any number of sequences,
 * appends their K/V to the cache and computes logits for the rows that
 * need them; prefill is a batch of many tokens, decode a batch of one per
 * sequence, computed identically per row. */
#ifndef KVLLM_MODEL_H
#define KVLLM_MODEL_H

#include "backend/backend.h"
#include "comm/comm.h"
#include "load/gguf.h"
#include "tensor/tensor.h"
#include <stdbool.h>
#include <stdint.h>

struct model_hparams {
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot, n_ctx_train;
    float rope_theta, norm_eps;
    float rope_freq_scale;  /* positions are multiplied by this before RoPE (1; 1/factor for linear scaling) */
    float rope_attn_factor; /* cos and sin multiplied by this (LongRoPE: rope.scaling.attn_factor; 1 = none) */
    int n_ctx_orig;         /* rope.scaling.original_context_length: LongRoPE's long factors apply past it;
                               YaRN's ramp is measured against it */
    bool rope_yarn;         /* rope.scaling.type yarn: struct rope_params.yarn, its ramp between the pairs
                               that turn yarn_beta_fast and yarn_beta_slow times over n_ctx_orig */
    float yarn_beta_fast, yarn_beta_slow;
    int n_swa;              /* the file's sliding window (attend the last n_swa positions); 0 = none.
                               Which layers use it is the family's window pattern (struct llama_layer.window) */
    float attn_scale;       /* attention scores are (q . k) * attn_scale: 1/sqrt(head_dim) but for Gemma's 27B */
    float attn_softcap;     /* > 0: scores become attn_softcap * tanh(scores / attn_softcap) (Gemma 2) */
    float final_softcap;    /* > 0: the same on the logits */
    float embd_scale;       /* > 0: embeddings are multiplied by this (Gemma: sqrt(n_embd)) */
    int n_expert, n_expert_used;  /* mixture of experts: experts per layer and per token (0: a dense FFN) */
    int n_ff_exp;           /* one expert's hidden width */
};

/* How a family computes, as data: model.c holds one entry per
 * general.architecture it loads, and model_forward reads only these fields
 * (and the per-layer values model.c resolves from them), never the name. */
enum norm_kind { NORM_RMS, NORM_LAYER };              /* RMSNorm; LayerNorm with bias (GPT-2) */
enum pos_kind { POS_ROPE, POS_ROPE_NEOX, POS_LEARNED }; /* adjacent pairs; halves; position_embd (GPT-2) */
enum ffn_kind { FFN_SWIGLU, FFN_GEGLU, FFN_GELU,      /* silu(gate) * up; gelu(gate) * up; gelu(up) */
                FFN_SWIGLU_OAI };                     /* gpt-oss's clamped swiglu (GLU_SWIGLU_OAI): experts only */

struct arch_desc {
    const char *name;          /* general.architecture */
    enum norm_kind norm;
    enum pos_kind pos;
    enum ffn_kind ffn;
    bool qkv_bias;             /* Q/K/V biases required (Qwen2); optional otherwise */
    bool qk_norm;              /* per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3) */
    bool post_norms;           /* RMSNorm of the attention and FFN outputs before each residual add (Gemma) */
    bool embd_scale;           /* embeddings scaled by sqrt(n_embd) (Gemma) */
    bool expert_norm;          /* experts' weights renormalized over the chosen ones (Mixtral, Qwen3-MoE) */
    int swa_period;            /* with a window in the file: layer il slides when il % period < period - 1
                                  (Gemma 2: 2, Gemma 3: 6); 0: every layer slides (Mistral) */
    float swa_rope_base;       /* > 0: the RoPE base of sliding layers (Gemma 3: 10000), the file's base
                                  being the global layers' */
    int nope_period;           /* > 0: layer il has no RoPE when (il + 1) % nope_period == 0 (SmolLM3: 4) */
    bool fine_down;            /* the FFN's down projection takes activation scales no coarser than per 32
                                  (TENSOR_F_FINE_ACT: f32 activations for K-quant weights): Gemma's GeGLU
                                  products carry outliers that 8-bit codes per 256 lose (on Gemma 3 270M
                                  Q4_K_M the next-token KLD to the f32 path falls from 5.4e-3 to 1.8e-3) */
    bool no_window;            /* the file's sliding_window is not used (Phi-3: llama.cpp disables it too, its
                                  converters writing windows the model was not run with) */
    bool sinks;                /* attn_sinks required: a learned logit per head in each softmax (gpt-oss) */
    bool moe_biases;           /* attention output, router and expert biases required (gpt-oss); they are
                                  read when present whatever the family */
    const char *ffn_norm;      /* the FFN input's norm tensor, NULL: "ffn_norm" (gpt-oss: "post_attention_norm",
                                  Transformers' post_attention_layernorm) */
    int scalar_embd_layers;    /* the layer count of the family's model whose attention scale is
                                  1/sqrt(n_embd / n_head) rather than 1/sqrt(head_dim) (Gemma's 27B: GGUF has no
                                  key for query_pre_attn_scalar, so llama.cpp infers it the same way); 0: none */
};

/* Optional tensors (biases, rope_freqs, position_embd) have data == NULL
 * when absent.  Every data pointer is backend memory once loaded. */
struct llama_layer {
    struct tensor attn_norm;  /* (n_embd) f32 */
    struct tensor attn_norm_b;/* (n_embd) f32, LayerNorm models */
    struct tensor wq;         /* (n_head * head_dim, n_embd); a row range of attn_qkv when fused */
    struct tensor wk, wv;     /* (n_head_kv * head_dim, n_embd) */
    struct tensor bq, bk, bv; /* (n_head * head_dim), (n_head_kv * head_dim) f32: Qwen2, GPT-2 */
    struct tensor wo;         /* (n_embd, n_head * head_dim) */
    struct tensor bo;         /* (n_embd) f32: GPT-2 */
    struct tensor ffn_norm;   /* (n_embd) f32 */
    struct tensor ffn_norm_b; /* (n_embd) f32, LayerNorm models */
    struct tensor ffn_gate;   /* (n_ff, n_embd); absent for GELU (ungated) FFNs */
    struct tensor ffn_up;     /* (n_ff, n_embd) */
    struct tensor ffn_up_b;   /* (n_ff) f32: GPT-2 */
    struct tensor ffn_down;   /* (n_embd, n_ff) */
    struct tensor ffn_down_b; /* (n_embd) f32: GPT-2 */
    struct tensor attn_sinks; /* (n_head) f32: gpt-oss */
    struct tensor ffn_gate_inp;   /* (n_expert, n_embd) the router, when the layer has experts */
    struct tensor ffn_gate_inp_b; /* (n_expert) f32: the router's bias (gpt-oss) */
    struct tensor exp_gate_b, exp_up_b, exp_down_b;   /* (n_expert, n_ff_exp | n_ff_exp | n_embd) f32: the
                                                         experts' biases, row e expert e's (gpt-oss) */
    struct tensor *exp_gate, *exp_up, *exp_down;  /* (n_expert) each: one expert's gate, up (n_ff_exp,
                                                     n_embd) and down (n_embd, n_ff_exp), views of the file's
                                                     3-D ffn_*_exps tensors; NULL for a dense FFN */
    struct tensor attn_q_norm, attn_k_norm;   /* (head_dim) f32: qk_norm families */
    struct tensor attn_post_norm, ffn_post_norm; /* (n_embd) f32: post_norms families */
    int window;               /* sliding window of this layer (0: full attention) */
    struct rope_params rope;  /* this layer's RoPE (sliding and global layers may differ) */
};

struct model {
    struct gguf *file;            /* owned: metadata + the mapping the weights live in */
    char arch[32];                /* general.architecture as the file names it */
    const struct arch_desc *desc; /* how the family computes (static) */
    struct model_hparams hp;
    struct tensor tok_embd;       /* (n_vocab, n_embd) */
    struct tensor pos_embd;       /* (n_ctx_train, n_embd) when learned_pos */
    struct tensor rope_freqs;     /* (n_rot / 2) f32 frequency divisors, optional: Llama 3's rope_freqs, or
                                     LongRoPE's rope_factors_long / _short, whichever the context calls for */
    struct tensor output_norm;    /* (n_embd) f32 */
    struct tensor output_norm_b;  /* (n_embd) f32, LayerNorm models */
    struct tensor output;         /* (n_vocab, n_embd); tok_embd when tied */
    bool tied_output;
    struct llama_layer *layers;   /* (n_layer) */
    struct backend *be;           /* owned; immutable once the weights are placed */
    int n_threads;                /* default threads of an execution context */
    uint64_t n_params, weight_bytes;
    uint64_t placed_bytes;        /* what the placed weights take where the backend keeps them */
    uint32_t main_type;           /* dtype holding most weight bytes */
    /* tensor parallelism (shard.c): this rank's share of the heads, the FFN (or of every expert) and the
       vocabulary */
    struct comm *comm;            /* not owned: the job's communicator; NULL: one process */
    int tp_rank, tp_size;         /* 0, 1 for one process */
    void **shard_copies;          /* (n_shard_copies) owned: column slices copied out of the mapping */
    int n_shard_copies;
};

/* Open a GGUF file, llama2.c checkpoint or Hugging Face folder, validate
 * every key and tensor the architecture needs, and have the backend bp
 * chooses place the weights.  n_threads: the contexts' default (<= 0: all
 * CPUs).  Errors are logged with the path and the offending key/tensor:
 * KVLLM_EIO, KVLLM_EFORMAT, KVLLM_EUNSUPPORTED (an architecture or dtype
 * kvllm does not run, or an op the backend does not: backend_ops.
 * supports_op), KVLLM_ENOMEM, or the backend's creation failing
 * (backend_new: KVLLM_ECPU for a kernel set this CPU cannot run, ...);
 * *out is NULL on error and nothing stays open. */
int model_load(const char *path, const struct backend_params *bp, int n_threads, struct model **out);
/* model_load for rank cm->rank of a tensor-parallel job of cm->size ranks
 * (cm NULL or of one rank: the whole model): the weights are this rank's
 * views (shard.c), and model_forward meets the other ranks through cm,
 * which must outlive the model.  A shape that cannot be split is refused
 * with the reason (KVLLM_EUNSUPPORTED): KV heads, the FFN width or an
 * expert's width not divisible by the ranks, a slice that would cut a
 * quantized block. */
int model_load_tp(const char *path, const struct backend_params *bp, int n_threads, struct comm *cm,
                  struct model **out);
void model_free(struct model *m);

/* shard.c: cut the loaded views down to rank's share of n (before the
 * weights are placed); model_shard_release frees the copied slices the
 * backend no longer reads (after). */
int model_shard(struct model *m, const char *path, int rank, int n);
void model_shard_release(struct model *m);
/* Give back the pages of the file's mapping wholly inside [p, p + n): they
 * were read to copy weights out and nothing reads them now.  The mapping
 * is private and read-only, so a page read again refaults from the page
 * cache: nothing is lost.  Memory outside the mapping is left alone. */
void model_release_mapped(const struct model *m, const void *p, size_t n);

/* Whether contexts of n_ctx positions can be computed: learned-position
 * models (GPT-2) have n_ctx_train positions and no more.  Returns 0, or
 * KVLLM_ERANGE (logged) when n_ctx is too long.  Engines call it before
 * sizing anything; model_forward asserts positions are in range. */
int model_check_ctx(const struct model *m, int n_ctx);

/* The RoPE settings K was rotated with (model_forward's), when every layer
 * shares them: 0, or KVLLM_EUNSUPPORTED when positions are not rotations
 * (learned positions: GPT-2) or layers rotate differently (Gemma 3's
 * sliding and global layers), so cached K cannot be moved to other
 * positions with one setting (kv_shift). */
int model_rope_params(const struct model *m, struct rope_params *out);

/* One step's tokens, from any number of sequences.  Every array is
 * backend memory (uploaded by the engine); the counts are host values. */
struct batch {
    int n_tokens;
    const int32_t *tokens;         /* (n_tokens) */
    const int32_t *pos;            /* (n_tokens) position of each token in its sequence */
    const int32_t *slots;          /* (n_tokens) where its K/V go: block * block_size + offset */
    const int32_t *seq;            /* (n_tokens) its sequence's row in block_table */
    const int32_t *block_table;    /* (n_seqs, max_blocks) dense block tables */
    int max_blocks;
    const int32_t *win_slots;      /* (n_tokens) NULL, or the sliding-window layers' slots and tables when */
    const int32_t *win_block_table;/* (n_seqs, max_blocks) their K/V live in a pool of their own */
    int n_logits;
    const int32_t *logit_rows;     /* (n_logits) ascending rows whose logits are wanted */
    int ctx_hi;                    /* host: 1 + the largest pos (paged_attn_args.ctx_hi); 0: unknown */
};

/* Activation buffers (backend memory) for batches of up to n_max tokens,
 * n_logits_max of them with logits; sized once, reused every step.
 * forward_buf_init returns 0, KVLLM_ERANGE (a size past the address space)
 * or the backend's allocation error (nothing held then);
 * forward_buf_deinit is NULL-safe and may be called on a zeroed buffer. */
struct forward_buf {
    struct backend *be;
    struct backend_buf mem;
    int n_max, n_logits_max;
    float *x, *xn, *q, *k, *v, *att, *gate, *up;  /* (n_max, width) each */
    float *router, *moe_w, *moe_x, *moe_y;        /* (n_max, n_expert | n_expert_used | n_embd | n_embd) */
    int32_t *moe_ids;                             /* (n_max, n_expert_used) */
    float *logits;                                /* (n_logits_max, n_vocab) */
};
int forward_buf_init(struct forward_buf *b, struct backend *be, const struct model_hparams *hp, int n_max,
                     int n_logits_max);
void forward_buf_deinit(struct forward_buf *b);
/* Bytes forward_buf_init allocates. */
uint64_t forward_buf_bytes(const struct model_hparams *hp, int n_max, int n_logits_max);

/* Issue the ops of a batch on context c (n_tokens <= b->n_max, n_logits <=
 * b->n_logits_max, positions < n_ctx_train for learned-position models):
 * K/V of every token are stored at its slot in kv (n_layer views) before
 * attention, and logits (n_logits, n_vocab) are written to b->logits.  The
 * arithmetic of a row depends only on its token, position and context.
 * Returns 0 or the first op's error (the context's status); results are
 * ready after backend_sync(c). */
int model_forward(const struct model *m, struct backend_ctx *c, const struct kv_layer_view *kv,
                  const struct forward_buf *b, const struct batch *bt);

#endif
