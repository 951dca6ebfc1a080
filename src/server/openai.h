/* openai.h — OpenAI's JSON shapes <-> kvllm's engine requests and events:
 * parsing and validating /v1/completions and /v1/chat/completions bodies
 * (openai_parse.c), and building responses, stream chunks and errors
 * (openai_resp.c).  No engine calls here beyond kvllm_token_to_bytes (for
 * log-probability token text). */
#ifndef KVLLM_SERVER_OPENAI_H
#define KVLLM_SERVER_OPENAI_H

#include "kvllm.h"
#include "server/job.h"
#include "core/strbuf.h"
#include "server/toolcall.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OAI_MAX_PROMPTS 64      /* prompts in one completions request */
#define OAI_MAX_N 128           /* samples per prompt */
#define OAI_MAX_STOP 16         /* stop strings */
#define OAI_MAX_STOP_IDS 64     /* stop_token_ids */
#define OAI_MAX_BIAS 1024       /* logit_bias entries */
#define OAI_MAX_CHOICES 1024    /* guided_choice strings (the grammar's width bound) */

struct oai_prompt {             /* a completions prompt: text or token ids */
    char *text;                 /* NULL when ids are given */
    size_t len;
    int32_t *ids;
    int n_ids;
};

enum oai_tool_choice { OAI_TOOL_NONE, OAI_TOOL_AUTO, OAI_TOOL_REQUIRED, OAI_TOOL_NAMED };

struct oai_request {
    bool chat;
    bool llama;                          /* llama-server's /completion: its response shape, no default length */
    char *model;                         /* NULL: the served model */
    struct oai_prompt *prompts;          /* (n_prompts) completions */
    int n_prompts;
    struct kvllm_chat_message *msgs;     /* (n_msgs) chat; strings owned */
    int n_msgs;
    int max_tokens;                      /* 0: not given */
    struct kvllm_sampling_params sp;
    bool seed_set;
    char **stop;                         /* (n_stop) */
    int n_stop;
    int n;
    bool stream, include_usage, ignore_eos;
    int logprobs;                        /* -1: none; else alternatives per position */
    double presence_penalty, frequency_penalty;   /* OpenAI penalties, passed to the sampler */
    /* constrained decoding, and fields that were once accepted and ignored */
    struct kvllm_grammar *grammar;       /* own reference (NULL: none): response_format json_object /
                                            json_schema, llama-server's grammar / json_schema, or a tool
                                            choice; every sample's text is a string of it */
    int min_tokens;                      /* vLLM: EOS and stop ids held back until this many tokens */
    int32_t *stop_token_ids;             /* (n_stop_token_ids) vLLM: finish when sampled, not in the text */
    int n_stop_token_ids;
    struct kvllm_logit_bias *logit_bias; /* (n_logit_bias) OpenAI: {"token id": bias in [-100, 100]} */
    int n_logit_bias;
    bool echo;                           /* completions: the prompt's text goes before the completion */
    bool include_stop_str;               /* vLLM: the stop string that ended a sample stays in its text */
    bool special_text;                   /* vLLM's skip_special_tokens false: control tokens' text is shown */
    /* tool calling (chat): the validated `tools` array as JSON text (NULL: none, or an empty
     * list), tool_choice (default auto with tools, none without), the function a named choice
     * names, parallel_tool_calls (default true; false: at most one call is returned) */
    char *tools;
    int n_tools;
    enum oai_tool_choice tool_choice;
    char *tool_name;
    bool parallel_tool_calls;
};

struct oai_error {
    unsigned status;                     /* HTTP status */
    const char *code;                    /* NULL or an OpenAI-style code */
    char param[64];                      /* the offending field, "" if none */
    char message[512];
};

/* Parse and validate a request body (len bytes, NUL-terminated).  Returns 0,
 * or -1 with *err filled (400: invalid UTF-8 or JSON, wrong types, values out
 * of range); r is then freed already.  Checks that need the model (token id
 * range, context length) are the caller's. */
/* Fill *e (status, code, param, printf-style message); returns -1 for
 * `return oai_error_set(...)` at the point of failure. */
int oai_error_set(struct oai_error *e, unsigned status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

int oai_parse(bool chat, const char *body, size_t len, struct oai_request *r, struct oai_error *err);
/* llama-server's /completion body (prompt, n_predict, repeat_penalty, seed -1, its sampling defaults)
 * as a /v1/completions body for oai_parse: malloc'd; NULL if out of memory.  A body that is not a
 * JSON object comes back as it is (oai_parse reports it). */
char *oai_llama_body(const char *body, size_t len);
void oai_request_free(struct oai_request *r);

/* {"error": {"message", "type", "param", "code"}}: malloc'd, NULL if out of memory. */
char *oai_error_json(const struct oai_error *e);

/* ---- responses ---- */

struct oai_choice {
    struct strbuf text;                  /* non-streaming: the text so far */
    size_t n_text;                       /* bytes of text produced so far (text_offset) */
    enum kvllm_finish finish;
    int n_generated;
    bool started;                        /* streaming: the role delta (chat) or the echo (completions) was sent */
    void *lp;                            /* json_object: log-probabilities so far (non-streaming) */
    struct toolcall_stream *tc;          /* streaming chat with tools: the call parser (NULL: none) */
};

struct oai_resp {
    bool chat;
    bool llama;                          /* llama-server's /completion shape (set after oai_resp_init) */
    char id[48];
    long long created;
    const char *model_id;
    const struct kvllm_model *model;     /* for token text */
    int n_prompts, n, n_choices, n_done;
    int logprobs;                        /* -1: none */
    struct oai_choice *choices;          /* (n_choices) */
    int *n_prompt, *n_cached;            /* (n_prompts) usage */
    char **echo;                         /* (n_prompts) completions' echo: the prompt's text; NULL: none */
    size_t *n_echo;
    /* tool calls (oai_resp_set_tools): parsed out of chat choices in this format */
    enum toolcall_format tool_format;    /* TOOLCALL_NONE: no parsing */
    const char *tool_prefill;            /* static: the answer's opening that the prompt already holds */
    bool tool_single;                    /* parallel_tool_calls false: at most one call */
    uint64_t tool_ids;                   /* call-id generator state */
    struct toolcall_decl *tools;         /* (n_tools) the functions offered: calls of others, or with arguments
                                            their parameters do not admit, are text */
    int n_tools;
};

/* Returns 0 or KVLLM_ENOMEM. */
int oai_resp_init(struct oai_resp *r, bool chat, const char *id, long long created, const char *model_id,
                  const struct kvllm_model *model, const int *n_prompt, int n_prompts, int n, int logprobs);
void oai_resp_deinit(struct oai_resp *r);
/* Completions' echo: prompt k's text (copied) goes before each of its
 * choices' text, and counts in text_offset.  0 or KVLLM_ENOMEM. */
int oai_resp_set_echo(struct oai_resp *r, int k, const char *text, size_t len);
/* Chat: return tool calls parsed out of each choice's text in format f
 * (toolcall.h) as message.tool_calls / streamed tool_call deltas, with
 * finish_reason "tool_calls".  prefill (static, may be NULL): text the
 * prompt ended with that belongs to the answer (a forced call's opening).
 * single: at most one call per choice.  id_seed: where call ids start.
 * Returns 0 or KVLLM_ENOMEM. */
int oai_resp_set_tools(struct oai_resp *r, enum toolcall_format f, const char *prefill, bool single, uint64_t id_seed,
                       const char *tools);
/* Non-streaming: fold one event into the response. */
void oai_resp_add(struct oai_resp *r, const struct job_event *e);
/* The whole response body (malloc'd; NULL if out of memory). */
char *oai_resp_json(struct oai_resp *r);
/* Streaming: the SSE chunk(s) for one event appended to out (maybe none). */
void oai_stream_event(struct oai_resp *r, const struct job_event *e, struct strbuf *out);
/* Streaming: a stream that ends in error: `data: {"error": {...}}` (the
 * shape of oai_error_json) and "data: [DONE]". */
void oai_stream_error(const struct oai_error *e, struct strbuf *out);
/* The name of a finish reason ("stop", "length", ...; NULL while running). */
const char *oai_finish_name(enum kvllm_finish f);
/* Streaming: the usage chunk (when asked) and "data: [DONE]" (a llama-shaped
 * stream ends with its stop:true chunk instead). */
void oai_stream_end(struct oai_resp *r, bool include_usage, struct strbuf *out);

#endif
