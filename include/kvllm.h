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
    X(KVLLM_ECPU,        -8,  "CPU lacks a required feature")

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

/* ---- model --------------------------------------------------------- */

struct kvllm_model;

struct kvllm_model_params {
    const char *tokenizer_path; /* llama2.c tokenizer.bin or GGUF vocab; NULL: the model's own */
    int n_threads;              /* <= 0: all online CPUs */
};

/* Defaults: no tokenizer override, all threads. */
struct kvllm_model_params kvllm_model_default_params(void);

/* Load a GGUF file or a llama2.c checkpoint (weights stay memory-mapped).
 * On error *out is NULL and nothing is left open. */
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
    uint64_t weight_bytes;
    const char *weight_type;   /* dtype holding most weight bytes ("F32", "Q8_0", ...) */
};
/* Pointer valid for the model's lifetime. */
const struct kvllm_model_desc *kvllm_model_describe(const struct kvllm_model *model);

/* Name of the CPU kernel set in use ("scalar", ...). */
const char *kvllm_model_backend(const struct kvllm_model *model);

/* ---- tokenizer ----------------------------------------------------- */

/* Tokenize len bytes of text.  add_bos: prepend BOS when the vocabulary asks
 * for it.  parse_special: match control-token text.  Writes at most n_max ids
 * and returns the total count (which may exceed n_max: call again with a
 * larger buffer), or a negative error. */
int kvllm_tokenize(const struct kvllm_model *model, const char *text, size_t len,
                   bool add_bos, bool parse_special, int32_t *ids, int n_max);

/* Raw bytes of one token (SentencePiece '▁' turned into ' ', <0xNN> into
 * its byte; control tokens give ""). Returns the byte count written (at most
 * cap) or a negative error. */
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

/* ---- a sequence and its KV cache ---------------------------------- */

struct kvllm_session;

struct kvllm_session_params {
    int n_ctx;          /* positions the KV cache holds; <= 0: the model's trained context */
    bool no_kv_cache;   /* keep no K/V between calls: every call recomputes its prefix */
};

/* Allocate a session whose KV cache holds n_ctx positions (checked against
 * the memory the machine has, with the numbers in the error). */
int kvllm_session_new(struct kvllm_model *model, const struct kvllm_session_params *p,
                      struct kvllm_session **out);
void kvllm_session_free(struct kvllm_session *s);

/* Positions already in the cache. */
int kvllm_session_n_past(const struct kvllm_session *s);
/* Forget everything from position `pos` on (0: empty the cache). */
void kvllm_session_truncate(struct kvllm_session *s, int pos);

/* Evaluate n tokens at positions n_past .. n_past+n-1, appending their K/V.
 * logits (may be NULL) receives n_vocab floats for the last token, or, with
 * all_logits, n * n_vocab floats (row per token).  Fails with KVLLM_ERANGE,
 * changing nothing, when the tokens do not fit the cache. */
int kvllm_session_eval(struct kvllm_session *s, const int32_t *tokens, int n,
                       bool all_logits, float *logits);

/* ---- sampling ------------------------------------------------------ */

struct kvllm_sampling_params {
    float temperature;    /* <= 0: greedy */
    int   top_k;          /* <= 0: off */
    float top_p;          /* >= 1: off */
    float min_p;          /* <= 0: off */
    float repeat_penalty; /* 1: off */
    int   repeat_last_n;  /* window for the penalty; <0: whole history */
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

#ifdef __cplusplus
}
#endif
#endif
