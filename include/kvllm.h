/* kvllm.h — the public contract of the kvllm inference engine.
 *
 * Everything a program needs to load a model, tokenize, evaluate tokens
 * through a KV cache and sample lives here; nothing else is installed.
 *
 * Conventions:
 *   - Functions returning int return 0 on success or a negative KVLLM_E*
 *     code (see kvllm_strerror()).  The library logs the reason once, with
 *     the file / field / offset involved, through the log callback; callers
 *     need not print another message.
 *   - x_new/x_free pairs: the caller owns what _new returns; _free is
 *     NULL-safe.
 *   - The library never calls exit() and never writes to stdout.
 */
#ifndef KVLLM_H
#define KVLLM_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors -------------------------------------------------------- */

#define KVLLM_ERRORS(X)                                                     \
    X(KVLLM_OK,           0,  "success")                                    \
    X(KVLLM_EIO,         -1,  "I/O error")                                  \
    X(KVLLM_ENOMEM,      -2,  "out of memory")                              \
    X(KVLLM_EFORMAT,     -3,  "malformed file")                             \
    X(KVLLM_EUNSUPPORTED,-4,  "unsupported feature")                        \
    X(KVLLM_EINVAL,      -5,  "invalid argument")                           \
    X(KVLLM_ENOTFOUND,   -6,  "not found")                                  \
    X(KVLLM_ERANGE,      -7,  "does not fit")                               \
    X(KVLLM_ECPU,        -8,  "CPU lacks a required feature")                \
    X(KVLLM_EBUSY,       -9,  "queue full")                                 \
    X(KVLLM_EBACKEND,   -10,  "backend failure (a kernel or device error)") \
    X(KVLLM_ECOMM,      -11,  "a tensor-parallel rank failed or did not answer")

enum kvllm_err {
#define KVLLM_X_(name, code, msg) name = code,
    KVLLM_ERRORS(KVLLM_X_)
#undef KVLLM_X_
};

/* Static string describing an error code; never NULL. */
const char *kvllm_strerror(int err);

/* ---- logging ------------------------------------------------------- */

enum kvllm_log_level {
    KVLLM_LOG_ERROR = 0,
    KVLLM_LOG_WARN  = 1,
    KVLLM_LOG_INFO  = 2,
    KVLLM_LOG_DEBUG = 3,
};

/* msg is one line without a trailing newline. */
typedef void (*kvllm_log_fn)(enum kvllm_log_level level, const char *msg, void *user);

/* Replace the log sink (NULL restores the default: stderr, "kvllm: " prefix)
 * and set the most verbose level that is delivered (default INFO). */
void kvllm_log_set(kvllm_log_fn fn, void *user);
void kvllm_log_set_level(enum kvllm_log_level max_level);

/* ---- tensor parallelism (docs/TP.md) -------------------------------- */

/* Join the MPI job this process was started in (mpirun -np N): *rank and
 * *size say where it stands; a process not started by mpirun (or a build
 * without MPI) is rank 0 of 1.  timeout_s (<= 0: 60) bounds every wait for
 * another rank during a step: a rank that died or hangs fails the step
 * with KVLLM_ECOMM instead of hanging the job.  Call it once, before any
 * model is loaded; returns 0 or KVLLM_ECOMM (logged). */
int kvllm_tp_init(double timeout_s, int *rank, int *size);
/* Whether this build can join an MPI job at all. */
bool kvllm_tp_mpi_built(void);
/* Ranks > 0: run the other side of rank 0's engines (their steps' forward
 * passes on this rank's share of model, loaded with tensor_parallel) until
 * rank 0 ends the job.  0 when it ended cleanly, else the error. */
struct kvllm_model;
int kvllm_tp_worker(struct kvllm_model *model);
/* Mark the job failed from any thread (why is logged): every engine fails
 * as kvllm_engine_failed says. */
void kvllm_tp_fail(const char *why);
/* What this rank's collectives cost since the job began (all zero outside
 * a job): per kind, how many, the bytes received from the other ranks, and
 * the seconds spent in them, waiting for the other ranks included.  Read it
 * between steps (kvllm bench does, around a test). */
struct kvllm_tp_stats {
    uint64_t all_reduces, gathers, broadcasts;
    uint64_t all_reduce_bytes, gather_bytes, broadcast_bytes;
    double all_reduce_s, gather_s, broadcast_s;
};
void kvllm_tp_stats(struct kvllm_tp_stats *out);
/* End this process's part of the job, after its engines and models are
 * freed: code 0 ends it cleanly (rank 0 first tells the other ranks to
 * leave kvllm_tp_worker); a non-zero code, or a failed job, ends every rank
 * at once with that exit status (MPI_Abort), which may not return. */
void kvllm_tp_end(int code);

/* ---- model --------------------------------------------------------- */

struct kvllm_model;

struct kvllm_model_params {
    const char *tokenizer_path; /* llama2.c tokenizer.bin or GGUF vocab; NULL: the model's own */
    int n_threads;              /* <= 0: all online CPUs */
    bool tensor_parallel;       /* hold this rank's share of the model in the job kvllm_tp_init joined
                                   (a job of one rank: the whole model, as without) */
    /* Where the model runs.  The library reads no environment variable to
     * choose: kvllm's CLI fills these from KVLLM_BACKEND, KVLLM_CPU,
     * KVLLM_ACT, KVLLM_CUDA_DEVICE and its flags (docs/CLI.md).  Zeroed or
     * NULL, each is the default. */
    const char *backend;        /* NULL, "" or "cpu": the CPU; "strict": the CPU kernels with backend memory
                                   unreadable outside ops (tests: code that touches device memory from the
                                   host crashes); "cuda": the CUDA backend (a -DKVLLM_CUDA=ON build) */
    const char *cpu_kernels;    /* the CPU's kernel set: NULL or "": the best this CPU runs (amx, avx512, avx2,
                                   then scalar); "scalar" (the f32 reference), "avx2", "avx512" or "amx"
                                   (avx512 with the integer matmul on AMX-INT8 tiles, the same bits) */
    const char *activations;    /* the matmul's arithmetic on quantized weights: NULL, "" or "q8": 8-bit
                                   activations with integer dot products, as llama.cpp; "f32": f32 on the
                                   dequantized weights; "int": the older 13-bit codes for Q8_0 / Q4_0 /
                                   Q4_1 (CPU).  The scalar set is always f32 */
    int device;                 /* the CUDA device's index (0: the first); the CPU backends ignore it */
};

/* Defaults: no tokenizer override, all threads, the CPU's best kernels on
 * 8-bit activations. */
struct kvllm_model_params kvllm_model_default_params(void);

/* Load a GGUF file, a llama2.c checkpoint or a Hugging Face folder
 * (safetensors + config.json + tokenizer.json) on the backend params
 * chooses, which places the weights (the CPU keeps them memory-mapped).
 * A backend, kernel set or activation name not listed above fails with
 * KVLLM_EINVAL, a kernel set this CPU or build lacks with KVLLM_ECPU, a
 * CUDA backend this build or machine lacks with KVLLM_EUNSUPPORTED, a
 * model needing an op the backend does not run (mixture-of-experts on
 * CUDA) with KVLLM_EUNSUPPORTED; each is logged, naming the field or op
 * and the valid choices.  On error *out is NULL and nothing is left open.
 *
 * Threads: a loaded model is immutable.  Any number of engines and
 * sessions, on any threads, may use one model at once, and kvllm_tokenize,
 * kvllm_token_to_bytes, kvllm_chat_render and kvllm_chat_tokenize may be
 * called on it from any thread (a kvllm_detok is its caller's: one thread at
 * a time); free it only after all of them are freed. */
int kvllm_model_load(const char *path, const struct kvllm_model_params *params,
                     struct kvllm_model **out);
void kvllm_model_free(struct kvllm_model *model);

struct kvllm_model_desc {
    const char *arch;       /* "llama" */
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot;
    int n_ctx_train;
    float rope_theta, norm_eps;
    int token_bos, token_eos;   /* -1 when absent */
    bool add_bos;
    uint64_t n_params;
    uint64_t weight_bytes;     /* in the file */
    uint64_t placed_bytes;     /* where the backend keeps them (mapped or copied) */
    const char *weight_type;   /* dtype holding most weight bytes ("F32", "Q8_0", ...) */
    int n_layer_swa, n_swa;    /* layers whose K/V an engine keeps for their sliding window of n_swa positions
                                  only (a model with both sliding and global layers); 0, 0 otherwise */
};
/* Pointer valid for the model's lifetime. */
const struct kvllm_model_desc *kvllm_model_describe(const struct kvllm_model *model);

/* Name of the backend and kernel set in use ("scalar", "avx2", "strict/avx2"). */
const char *kvllm_model_backend(const struct kvllm_model *model);

/* A string metadata value of the model by its GGUF key ("general.name",
 * "tokenizer.chat_template", "tokenizer.ggml.pre"): its bytes, not
 * NUL-terminated, *len of them (len may be NULL); NULL when the key is absent
 * or not a string (nothing logged).  Valid for the model's lifetime. */
const char *kvllm_model_meta_str(const struct kvllm_model *model, const char *key, size_t *len);

/* The chat template the model's conversations are rendered with when no
 * other is given: the file's tokenizer.chat_template, else the official
 * template of its family when kvllm carries one (Gemma 3 and Gemma 2 files
 * often come without; by general.architecture).  Its bytes, *len of them
 * (len may be NULL), NUL-terminated only when built in; *builtin (may be
 * NULL) tells which.  NULL when there is neither (nothing logged).  Valid
 * for the model's lifetime. */
const char *kvllm_model_chat_template(const struct kvllm_model *model, size_t *len, bool *builtin);

/* ---- tokenizer ----------------------------------------------------- */

/* Tokenize len bytes of text.  add_bos: prepend BOS when the vocabulary asks
 * for it.  parse_special: match control-token text.  Writes at most n_max ids
 * and returns the total count (which may exceed n_max: call again with a
 * larger buffer), or a negative error. */
int kvllm_tokenize(const struct kvllm_model *model, const char *text, size_t len,
                   bool add_bos, bool parse_special, int32_t *ids, int n_max);

/* Raw bytes of one token as it reads mid-text (SentencePiece '▁' turned into
 * ' ', its leading space kept; <0xNN> into its byte; control tokens give "").
 * Returns the byte count (only the first cap bytes are written) or < 0. */
int kvllm_token_to_bytes(const struct kvllm_model *model, int32_t id, char *buf, size_t cap);

/* Streaming detokenizer: feed ids one at a time, get back only complete
 * UTF-8 text (never half a character). */
struct kvllm_detok;
int kvllm_detok_new(const struct kvllm_model *model, struct kvllm_detok **out);
void kvllm_detok_free(struct kvllm_detok *d);
/* Returns a NUL-terminated string owned by d, valid until the next call;
 * prev is the id preceding `id` (-1 if none). */
const char *kvllm_detok_push(struct kvllm_detok *d, int32_t prev, int32_t id);
/* Whatever bytes remain (an incomplete sequence comes out as U+FFFD). */
const char *kvllm_detok_flush(struct kvllm_detok *d);

/* ---- chat templates ------------------------------------------------ */

struct kvllm_chat_message {
    const char *role;       /* "system", "user", "assistant", "tool", ... */
    const char *content;    /* UTF-8; NULL: None */
    /* Tool calling (each NULL: the key is absent from the message the
     * template sees, as templates test `'tool_calls' in message`): */
    const char *tool_calls;     /* assistant: OpenAI's tool_calls, JSON array text
                                 * [{"id", "type", "function": {"name", "arguments"}}]; an
                                 * "arguments" string that parses as JSON reaches the
                                 * template as that value (templates write it `| tojson`) */
    const char *tool_call_id;   /* tool: the id of the call this answers */
    const char *name;           /* tool: the function's name */
};

/* How a conversation is rendered (kvllm_chat_render_ex / _tokenize_ex);
 * zero-initialised fields are the plain functions' behaviour. */
struct kvllm_chat_opts {
    bool add_generation_prompt;
    bool special_in_content;    /* kvllm_chat_tokenize's flag */
    /* The tool definitions, JSON array text ([{"type": "function",
     * "function": {"name", "description", "parameters"}}]), given to the
     * template as `tools`; NULL: `tools` is undefined. */
    const char *tools;
    /* Text appended after the rendering as the template's own text (control
     * tokens read as such): the start of the assistant's answer, e.g.
     * "<tool_call>\n" to make the model write a call.  NULL: none. */
    const char *prefill;
    /* err (err_cap bytes; may be NULL): receives the one-line message of a
     * failure (a template error with its line and column, ...), "" on
     * success, for a caller that shows it to someone else. */
    char *err;
    size_t err_cap;
};

/* Render a conversation with a chat template, as Hugging Face Transformers
 * renders it (Jinja, trim_blocks + lstrip_blocks).  template_text: NULL for
 * the model's own (kvllm_model_chat_template).  bos_token / eos_token are
 * the model's.  On success *out is a malloc'd NUL-terminated string (free()).
 * Errors (logged): KVLLM_ENOTFOUND when there is no template, KVLLM_EINVAL
 * for a template error or raise_exception() (message with line and column),
 * KVLLM_EUNSUPPORTED for a construct the interpreter lacks. */
int kvllm_chat_render(const struct kvllm_model *model, const char *template_text,
                      const struct kvllm_chat_message *msgs, int n_msgs, bool add_generation_prompt,
                      char **out);

/* A conversation as the model's prompt ids: rendered as kvllm_chat_render
 * renders it, then tokenized with the template's own text read for control
 * tokens ("<|im_start|>" becomes one token) and the message text (roles,
 * contents, and whatever the template computed from them) read as plain
 * text, so a user who types "<|im_end|>" cannot close their turn and forge
 * another.  special_in_content: control-token text inside message text
 * becomes control tokens too (the reference behaviour, as Transformers'
 * apply_chat_template(tokenize=True)).  Without such text in the messages
 * both give the same ids.  BOS goes first when the vocabulary asks for it
 * and the rendering does not start with it.  On success *ids_out is
 * malloc'd (free()) holding *n_out ids; on error it is NULL and 0.  Errors
 * (logged) as kvllm_chat_render, plus KVLLM_ENOTFOUND for a model without a
 * vocabulary and KVLLM_ERANGE when the render exceeds its step or output
 * budget. */
int kvllm_chat_tokenize(const struct kvllm_model *model, const char *template_text,
                        const struct kvllm_chat_message *msgs, int n_msgs, bool add_generation_prompt,
                        bool special_in_content, int32_t **ids_out, int *n_out);

/* kvllm_chat_render / kvllm_chat_tokenize with tools and a prefill (opts
 * NULL: all zero).  Errors as theirs; a tools or tool_calls text that is not
 * JSON, or not an array, is KVLLM_EINVAL (logged with the byte offset). */
int kvllm_chat_render_ex(const struct kvllm_model *model, const char *template_text,
                         const struct kvllm_chat_message *msgs, int n_msgs, const struct kvllm_chat_opts *opts,
                         char **out);
int kvllm_chat_tokenize_ex(const struct kvllm_model *model, const char *template_text,
                           const struct kvllm_chat_message *msgs, int n_msgs, const struct kvllm_chat_opts *opts,
                           int32_t **ids_out, int *n_out);

/* ---- sampling ------------------------------------------------------ */

struct kvllm_sampling_params {
    float temperature;    /* <= 0: greedy */
    int   top_k;          /* <= 0: off */
    float top_p;          /* >= 1: off */
    float min_p;          /* <= 0: off */
    float repeat_penalty; /* 1: off */
    int   repeat_last_n;  /* window for the penalties; <0: whole history */
    float presence_penalty;   /* OpenAI style, subtracted once from every token in the window (0: off) */
    float frequency_penalty;  /* OpenAI style, subtracted per occurrence in the window (0: off) */
    uint64_t seed;
};
/* temp 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1.0 (last 64), seed 0 */
struct kvllm_sampling_params kvllm_sampling_default_params(void);

struct kvllm_sampler;
int kvllm_sampler_new(const struct kvllm_sampling_params *p, int n_vocab, struct kvllm_sampler **out);
void kvllm_sampler_free(struct kvllm_sampler *s);
/* Pick the next token from logits (n_vocab floats, not modified).
 * history: the ids so far (for the repetition penalty).  Returns the id,
 * or KVLLM_EINVAL (logged) when no logit is finite. */
int32_t kvllm_sampler_sample(struct kvllm_sampler *s, const float *logits,
                             const int32_t *history, int n_history);

/* A bias added to one token's logit before anything else (OpenAI's
 * logit_bias: -100 effectively bans a token, +100 all but forces it). */
struct kvllm_logit_bias {
    int32_t token;
    float bias;
};
/* Give s a logit bias (copied; replaces the previous one; n = 0 clears it).
 * Biases of a token listed twice add up.  KVLLM_EINVAL (logged, s
 * unchanged) for a token outside [0, n_vocab) or a bias that is not finite;
 * KVLLM_ENOMEM. */
int kvllm_sampler_set_logit_bias(struct kvllm_sampler *s, const struct kvllm_logit_bias *bias, int n);
/* kvllm_sampler_sample restricted to the tokens of an allow-mask
 * ((n_vocab + 31) / 32 words; token id is allowed when bit id & 31 of word
 * id >> 5 is set; NULL: every token).  Order: logit bias, then the mask
 * (a masked token becomes -inf), then penalties, top-k, top-p, min-p,
 * temperature; greedy is the argmax among the allowed tokens.  KVLLM_EINVAL
 * (logged) when no allowed token has a finite logit. */
int32_t kvllm_sampler_sample_masked(struct kvllm_sampler *s, const float *logits, const int32_t *history,
                                    int n_history, const uint32_t *allow);

/* ---- grammars: constrained sampling ---------------------------------- */

/* A compiled grammar: immutable and reference-counted, so one grammar may
 * serve any number of requests on any threads; kvllm_engine_add takes its
 * own reference (free yours whenever you like).  err (may be NULL) receives
 * a one-line message: for GBNF "line:col: what", for a JSON Schema the JSON
 * path of the offending keyword ("$.properties.age.minimum: ..."). */
struct kvllm_grammar;
/* llama.cpp's GBNF; the start rule is "root".  KVLLM_EINVAL on a syntax
 * error or an undefined rule. */
int kvllm_grammar_from_gbnf(const char *text, struct kvllm_grammar **out, char *err, size_t err_cap);
/* A JSON Schema (JSON text).  "{}" or "true": any JSON value.  strict: as
 * OpenAI's strict mode, objects admit no properties beyond `properties`
 * unless the schema says otherwise.  KVLLM_EUNSUPPORTED names a keyword the
 * compiler does not honour (never silently ignored); KVLLM_EINVAL for a
 * schema that is not valid JSON or not a schema. */
int kvllm_grammar_from_json_schema(const char *schema_json, bool strict, struct kvllm_grammar **out,
                                   char *err, size_t err_cap);
/* A regular expression (UTF-8) that the whole text must match, as vLLM's
 * guided_regex: literals, classes ([a-z], [^...], \d \w \s and their
 * negations, as PCRE2 reads them without Unicode properties), "." (any
 * character but newline), groups ((...), (?:...), named), alternation, the
 * quantifiers ? * + {m} {m,} {m,n} (lazy ones too: the same strings match in
 * full), escapes \n \t \r \f \v \xHH \x{H...} \uHHHH; '^' may open it and
 * '$' close it.  KVLLM_EUNSUPPORTED names what a grammar cannot follow
 * (backreferences, lookaround, \b, inner anchors, possessive quantifiers,
 * flags) with its offset; KVLLM_EINVAL a malformed pattern. */
int kvllm_grammar_from_regex(const char *pattern, struct kvllm_grammar **out, char *err, size_t err_cap);
/* Exactly one of n strings (UTF-8), as vLLM's guided_choice.  KVLLM_EINVAL
 * when n < 1. */
int kvllm_grammar_from_choices(const char *const *choices, int n, struct kvllm_grammar **out, char *err,
                               size_t err_cap);
/* Any JSON object (response_format json_object). */
int kvllm_grammar_json_object(struct kvllm_grammar **out);
struct kvllm_grammar *kvllm_grammar_ref(struct kvllm_grammar *g);
void kvllm_grammar_free(struct kvllm_grammar *g);  /* drops one reference; NULL-safe */

/* ---- the engine: continuous batching over a paged KV cache ---------- */

struct kvllm_engine;

/* Speculative decoding: how a sequence's draft tokens are proposed.  Each
 * step, a sequence in decode appends up to spec_tokens drafts; one forward
 * computes its last token and the drafts, and the request's own sampler
 * verifies them position by position, keeping the drafts it would have
 * sampled anyway and the token it samples at the first mismatch.  Every
 * kernel is batch-invariant, so the logits of each position are bit-identical
 * to decoding one token at a time: the output is identical token for token
 * (greedy, and sampled too: the sampler is called exactly as often, in the
 * same order, on the same logits).  Only the speed changes.  (On the CUDA
 * backend this holds in its exact mode, KVLLM_ACT=f32; its fast default
 * may round large verification steps differently: docs/GPU.md.) */
enum kvllm_spec {
    KVLLM_SPEC_NONE = 0,    /* off */
    KVLLM_SPEC_NGRAM,       /* prompt lookup: the tokens that followed the latest earlier occurrence of the
                               sequence's last n-gram (spec_ngram_max down to spec_ngram_min) in its own context */
    KVLLM_SPEC_DRAFT,       /* a draft model (draft_model, same vocabulary) run greedily over its own paged KV */
};

/* Asynchronous scheduling (vLLM's --async-scheduling): while the backend
 * runs step t, the host drains the inbox and plans step t+1 (admissions,
 * chunked prefill, block allocation, preemption), each running sequence
 * assumed to get its one token; once t's tokens are known, t+1 drops what
 * finished and is issued.  Every sequence's tokens are the same as without
 * it; what may differ is which step a request is admitted or preempted in.
 * Steps with speculative decoding, the first token of n > 1 samples (the
 * fork), sessions, no_kv_cache and tensor parallelism keep the synchronous
 * order.  It pays only where the backend runs asynchronously (CUDA); the
 * CPU backends compute inside each op, leaving nothing to overlap. */
enum kvllm_async {
    KVLLM_ASYNC_AUTO = 0,   /* on where the backend runs asynchronously (CUDA), off on the CPU */
    KVLLM_ASYNC_ON,
    KVLLM_ASYNC_OFF,
};

struct kvllm_engine_params {
    int n_ctx;              /* longest sequence (prompt + output); <= 0: the model's trained context */
    uint64_t kv_mem;        /* KV pool in bytes; 0: from kv_tokens */
    int kv_tokens;          /* KV pool in positions; 0: max_seqs full contexts, capped at half the free RAM */
    const char *kv_type;    /* "f32", "f16" (default), "bf16", "int8", "fp8" */
    int block_size;         /* positions per KV block (16) */
    int max_seqs;           /* sequences running at once (32) */
    int max_batch_tokens;   /* tokens computed per step (512) */
    int max_queue;          /* requests waiting (1024); more: kvllm_engine_add fails with KVLLM_EBUSY */
    bool prefix_caching;    /* reuse cached full blocks of identical prefixes (true) */
    bool no_kv_cache;       /* baseline: drop every sequence's K/V after each step, recompute the prefix */
    bool kv_full;           /* sliding-window layers keep whole contexts too (one pool, as for a model without
                               windows): a full cache, for comparisons; else a model with both sliding and
                               global layers keeps only the window of its sliding ones */
    /* speculative decoding (off by default); never with no_kv_cache, sessions or n > 1 forks' first token */
    enum kvllm_spec spec;   /* KVLLM_SPEC_NONE (default), _NGRAM or _DRAFT */
    int spec_tokens;        /* drafts per sequence and step (k); <= 0 with spec on: 5 */
    int spec_ngram_min, spec_ngram_max;  /* prompt lookup n-gram sizes; <= 0: 1 and 3 */
    struct kvllm_model *draft_model;     /* KVLLM_SPEC_DRAFT: the drafter (borrowed: outlives the engine) */
    enum kvllm_async async_scheduling;   /* KVLLM_ASYNC_AUTO (default), _ON or _OFF (see above) */
    /* false (default): a step's forward is recorded once per step shape and replayed (a CUDA graph on
       the GPU); true: every op issued directly, step by step (vLLM's --enforce-eager).  Same outputs.
       Tensor parallelism always runs eagerly (its all-reduce is a host collective between ops). */
    bool enforce_eager;
};
struct kvllm_engine_params kvllm_engine_default_params(void);

enum kvllm_finish {
    KVLLM_FINISH_NONE = 0,  /* more events follow for this sequence */
    KVLLM_FINISH_STOP,      /* end-of-sequence token or a stop string */
    KVLLM_FINISH_LENGTH,    /* max_tokens reached, or the context is full */
    KVLLM_FINISH_ABORT,     /* kvllm_engine_abort */
    KVLLM_FINISH_ERROR,     /* the engine failed this sequence (a step that could not run, a sampler
                               that found no valid token); logged, no text */
};

/* Delivered on the engine thread, inside kvllm_engine_step. */
struct kvllm_event {
    uint64_t request;       /* id from kvllm_engine_add */
    int index;              /* which of the request's n samples */
    int32_t token;          /* the new token, or -1 (an event that only finishes) */
    const char *text;       /* new complete UTF-8 text ("" possible; stop strings withheld) */
    enum kvllm_finish finish;
    int n_prompt, n_generated, n_cached;  /* n_cached: prompt tokens served by the prefix cache */
    const float *logits;    /* (n_vocab) the distribution `token` was sampled from, before any
                               sampling transform, when the request set want_logits; else NULL */
};
typedef void (*kvllm_event_fn)(const struct kvllm_event *ev, void *user);

struct kvllm_request {
    const int32_t *prompt;  /* token ids (copied) */
    int n_prompt;           /* >= 1 */
    const char *prompt_text;  /* instead of ids: UTF-8 text, tokenized with BOS as the vocabulary asks */
    int max_tokens;         /* new tokens per sample; <= 0: until the context is full */
    struct kvllm_sampling_params sampling;  /* sample i uses seed + i */
    int n;                  /* samples, sharing the prompt's KV blocks (>= 1) */
    bool ignore_eos;
    const char *const *stop;  /* stop strings (copied), n_stop of them */
    int n_stop;
    bool no_text;           /* skip detokenization (events carry ids only) */
    bool want_logits;       /* events carry the logits (logprobs, dumps); otherwise logits stay in the backend */
    kvllm_event_fn on_event;
    void *user;
    /* Constrained decoding: every sample's text is a string of this grammar
     * (NULL: none).  kvllm_engine_add takes its own reference; each of the n
     * samples gets its own matcher, made at add and freed when the sample
     * ends.  A sample finishes with STOP when the grammar admits nothing but
     * its end, or when an end token (EOS, <|im_end|>, <|eot_id|>... which
     * the grammar allows only once its string is complete) is sampled, even
     * with ignore_eos; a state that allows no token at all finishes with
     * FINISH_ERROR (logged with why).  Needs a vocabulary.  Such a request is
     * never speculated. */
    const struct kvllm_grammar *grammar;
    /* EOS, the end tokens and stop_token_ids are masked, and stop strings
     * not matched, until a sample has this many tokens (vLLM's min_tokens;
     * 0: off).  With a grammar, the grammar wins: when its string is
     * complete and nothing else may follow, the sample ends anyway. */
    int min_tokens;
    /* Token ids that finish a sample with STOP when sampled; the token is
     * not part of the text (vLLM's stop_token_ids), n_stop_token_ids of them
     * (copied; each in [0, n_vocab)). */
    const int32_t *stop_token_ids;
    int n_stop_token_ids;
    /* Added to the logits before anything else (copied; tokens in
     * [0, n_vocab), finite biases; see kvllm_sampler_set_logit_bias). */
    const struct kvllm_logit_bias *logit_bias;
    int n_logit_bias;
    /* A stop string that finishes a sample stays at the end of its text
     * (vLLM's include_stop_str_in_output); default: cut before it. */
    bool include_stop_str;
    /* Control tokens sampled mid-text give their text ("<|im_start|>",
     * "<tool_call>" when it is one) instead of nothing (vLLM's
     * skip_special_tokens false).  The end token that finishes a sample is
     * never part of the text. */
    bool special_text;
};

/* Plan and allocate the KV pool (logs the memory plan through the log
 * callback).  KVLLM_ERANGE with the numbers when the pool would not fit the
 * machine or cannot hold one full context. */
int kvllm_engine_new(struct kvllm_model *model, const struct kvllm_engine_params *p, struct kvllm_engine **out);
/* Pending requests are dropped without events. */
void kvllm_engine_free(struct kvllm_engine *e);

/* Queue a request; thread-safe.  KVLLM_ERANGE (logged, with the numbers)
 * if it can never fit the context or the KV pool; KVLLM_EBUSY when the
 * queue is full; KVLLM_EINVAL for bad parameters (logged with the field and
 * index: a token id out of range, min_tokens < 0, a grammar on a model
 * without a vocabulary...).  The first constrained request of an engine
 * builds its vocabulary index here (tens of milliseconds), never in a step. */
int kvllm_engine_add(struct kvllm_engine *e, const struct kvllm_request *r, uint64_t *id);
/* kvllm_engine_add that also hands back why it failed: err (err_cap bytes;
 * may be NULL) receives the one-line message the library logged (the field,
 * index or numbers involved), "" on success.  For a caller that shows the
 * reason to someone else (a server's client). */
int kvllm_engine_add_ex(struct kvllm_engine *e, const struct kvllm_request *r, uint64_t *id, char *err, size_t err_cap);
/* Abort a request (its sequences get a FINISH_ABORT event at the next step
 * and their blocks are released in it); thread-safe; unknown ids ignored.
 * KVLLM_ENOMEM (logged) when the abort could not be recorded. */
int kvllm_engine_abort(struct kvllm_engine *e, uint64_t id);
/* Run one step: one forward pass over a batch mixing decode tokens and
 * prefill chunks.  Returns the tokens computed (0 when idle).  A step whose
 * ops fail ends the requests it computed with KVLLM_FINISH_ERROR events
 * (counted in stats.failed_steps); the engine goes on with the others.
 * Threads: one engine is stepped by one thread at a time; engines over the
 * same model may step on different threads at once. */
int kvllm_engine_step(struct kvllm_engine *e);
/* No request running, waiting or in the inbox (engine thread, as get_stats). */
bool kvllm_engine_idle(struct kvllm_engine *e);
/* Whether the engine can compute no more: a rank of its tensor-parallel job
 * died or stopped answering (every request then ends with
 * KVLLM_FINISH_ERROR, kvllm_engine_add refuses with KVLLM_ECOMM, and the
 * process should end the job: kvllm_tp_end with a non-zero code). */
bool kvllm_engine_failed(const struct kvllm_engine *e);

struct kvllm_engine_stats {
    int n_running, n_waiting;
    int block_size, blocks_total, blocks_held, blocks_cached, blocks_free;
    uint64_t steps, tokens_computed, preemptions;
    uint64_t prompt_tokens, cached_tokens;     /* at admission; cached: served by the prefix cache */
    double kv_util_sum, kv_waste_sum;          /* per-step sums of held/total and (allocated-used)/allocated */
    double kv_waste_ideal_sum;                 /* per-step sum of the waste if only last blocks were partial */
    uint64_t batch_seqs_sum;                   /* per-step sum of sequences in the batch */
    uint64_t failed_steps;                     /* steps whose ops failed (their requests got FINISH_ERROR) */
    uint64_t steps_planned_ahead;              /* steps planned while the previous one ran (async_scheduling) */
    /* speculative decoding: drafts verified (those after a sequence's end, which no one compared, are
       not counted) and those accepted (acceptance rate = spec_accepted / spec_drafted); spec_verifies:
       sequence-steps that verified at least one draft;
       spec_accept_hist[i]: verifications that accepted i drafts (the last bin counts i >= 16) */
    uint64_t spec_drafted, spec_accepted, spec_verifies;
    uint64_t spec_accept_hist[17];
    /* a model with both sliding-window and global layers keeps the sliding layers' K/V in a pool of
       their own, window positions per sequence (blocks_* above are then the global layers' pool);
       win_blocks_total is 0 for other models */
    int window, win_blocks_total, win_blocks_held, win_blocks_cached;
    uint64_t kv_bytes, kv_bytes_held;          /* KV storage of every layer, and what live sequences hold */
};
/* Engine-thread state: call it from the thread that steps the engine (or
 * between steps); other threads must take their own snapshot there. */
void kvllm_engine_get_stats(struct kvllm_engine *e, struct kvllm_engine_stats *st);

/* ---- what the prefix cache holds, for routers --------------------------- */

/* A block of the prefix cache stored (published: a later prompt with the
 * same prefix may reuse it) or removed (evicted).  Only full blocks of the
 * global layers' pool are told (a sliding-window pool is not). */
enum kvllm_kv_event_kind { KVLLM_KV_BLOCK_STORED, KVLLM_KV_BLOCK_REMOVED };
struct kvllm_kv_event {
    enum kvllm_kv_event_kind kind;
    int32_t block;          /* its id in the pool, in [0, stats.blocks_total) */
    int32_t parent;         /* STORED: the block before it in its prefix, -1 for a first block (a parent
                               was itself told STORED before, and not REMOVED since); REMOVED: -1 */
    const int32_t *tokens;  /* STORED: its stats.block_size token ids, valid during the call; else NULL */
};
typedef void (*kvllm_kv_event_fn)(const struct kvllm_kv_event *ev, void *user);
/* From now on fn(ev, user) is called on the engine thread, inside
 * kvllm_engine_step, for every block the prefix cache gains or loses (NULL:
 * off).  Call it before stepping starts or from the stepping thread; fn must
 * be quick and must not call the engine. */
void kvllm_engine_set_kv_events(struct kvllm_engine *e, kvllm_kv_event_fn fn, void *user);
/* The blocks the prefix cache holds now, held or cached: every block told
 * STORED and not REMOVED since (whether or not anyone listens).  Their ids,
 * ascending, go to ids (at most cap of them; ids may be NULL with cap 0);
 * returns how many there are, which may exceed cap.  Engine-thread state, as
 * kvllm_engine_get_stats: for checking what was told against what is held. */
int kvllm_engine_kv_blocks(struct kvllm_engine *e, int32_t *ids, int cap);

/* ---- a manually driven sequence (tests, benchmarks, chat) --------------- */

struct kvllm_session;

struct kvllm_session_params {
    int n_ctx;            /* positions it may hold; <= 0: the model's trained context */
    bool no_kv_cache;     /* keep no K/V between calls: every call recomputes its prefix */
    const char *kv_type;  /* NULL: "f16" (overrides engine->kv_type) */
    int max_batch;        /* tokens per forward pass; <= 0: 512 */
    const struct kvllm_engine_params *engine;  /* optional: KV type, block size, pool size (at least
                                                  n_ctx positions), batch tokens; the rest is ignored */
};

/* A private engine with a pool sized for one sequence of n_ctx positions;
 * its sequence goes through the engine's scheduler and step like any
 * request.  One thread at a time per session; sessions over one model may
 * run on different threads at once. */
int kvllm_session_new(struct kvllm_model *model, const struct kvllm_session_params *p,
                      struct kvllm_session **out);
void kvllm_session_free(struct kvllm_session *s);

/* Positions already in the cache. */
int kvllm_session_n_past(const struct kvllm_session *s);
/* Forget everything from position `pos` on (0: empty the cache). */
void kvllm_session_truncate(struct kvllm_session *s, int pos);
/* Forget positions p0 .. p1-1 and move the ones after them down by
 * p1 - p0, keeping their K/V (a context shift, as llama.cpp's: K is rotated
 * back by the RoPE angle of the distance).  What the moved positions hold
 * is not what evaluating the remaining tokens afresh would give: beyond the
 * first layer their K/V were computed attending to the forgotten positions,
 * and K is rounded to the KV type once more (docs/CLI.md, chat).
 * Returns 0; KVLLM_EINVAL (logged) unless 0 <= p0 <= p1 <= n_past;
 * KVLLM_EUNSUPPORTED, changing nothing, when positions cannot be moved
 * (learned positions as GPT-2's, a session without KV cache, a backend
 * without the op): truncate at p0 and evaluate again instead; with p1 =
 * n_past it is a truncation and works for every model.  KVLLM_EBACKEND when
 * the op failed: the session then holds positions 0 .. p0-1. */
int kvllm_session_discard(struct kvllm_session *s, int p0, int p1);

/* Evaluate n tokens at positions n_past .. n_past+n-1, appending their K/V
 * (in chunks of max_batch).  logits (may be NULL) receives n_vocab floats
 * for the last token, or, with all_logits, n * n_vocab floats.  Fails with
 * KVLLM_ERANGE, changing nothing, when the tokens do not fit; with
 * KVLLM_EBACKEND when a step failed (the session is then empty). */
int kvllm_session_eval(struct kvllm_session *s, const int32_t *tokens, int n,
                       bool all_logits, float *logits);

/* ---- build (appended for kvllm --version and the GPU-option note) ---- */

/* What this binary holds.  Static strings, never NULL. */
struct kvllm_build_info {
    const char *cpu_kernels_built;  /* CPU kernel sets compiled in: "scalar", "scalar, avx2" or
                                       "scalar, avx2, avx512" (kvllm_model_params.cpu_kernels names them) */
    const char *cpu_kernels_here;   /* those this CPU can run, same spelling */
    const char *cpu_kernels_default;/* the one a backend picks when cpu_kernels is NULL */
    bool cuda_built;                /* the CUDA backend (-DKVLLM_CUDA=ON; kvllm_model_params.backend "cuda"
                                       selects it) */
};
/* Fill *out.  Cheap (probes the CPU, allocates nothing that outlives the call); cannot fail. */
void kvllm_build_info(struct kvllm_build_info *out);

#ifdef __cplusplus
}
#endif
#endif
