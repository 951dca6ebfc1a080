/* handlers.c — the endpoints: completions and chat (parse, tokenize, check
 * against the context, submit, then answer in one body or as server-sent
 * events), models, health and metrics.
 *
 * No handler blocks: once submitted, a completion request suspends its MHD
 * connection whenever its job's queue is empty, and the engine thread
 * resumes it — on every event for a stream (the SSE content reader), on the
 * last finishing event for a whole response (handle_pending).  The
 * connection watcher (http.c) cancels the job of a client that left, so its
 * KV blocks are released within a step or two.  A sequence that ends in
 * error (KVLLM_FINISH_ERROR) or is cut by shutdown ends a stream with an
 * error event and [DONE], and a whole response with 500 or 503. */
#include "server/server_internal.h"
#include "server/job.h"
#include "server/openai.h"
#include "core/core.h"

#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An error answer, counted (the caller has logged the request). */
static int reply_error(struct server *s, struct MHD_Connection *c, const struct oai_error *e) {
    metrics_request(&s->metrics, e->status >= 500 ? OUTCOME_SERVER_ERROR
                                 : e->status == 429 ? OUTCOME_BUSY : OUTCOME_CLIENT_ERROR);
    char *body = oai_error_json(e);
    if (!body) return http_error(c, 500, NULL, NULL, "out of memory");
    /* a full queue drains in about a step: tell clients when to come back */
    if (e->status == 429) return http_send_hdr(c, e->status, "application/json", body, "Retry-After", "1");
    return http_send(c, e->status, "application/json", body);
}

/* An error answer to a request that never ran: logged and counted. */
static int send_error(struct server *s, struct MHD_Connection *c, const struct oai_error *e) {
    server_log_request(s, "-", e->status, 0, 0, 0, -1, 0, NULL, 0, e->message);
    return reply_error(s, c, e);
}

/* Why a job ended without a whole answer (0: it did not). */
static int job_failure(struct job *j, const struct oai_resp *r, struct oai_error *e) {
    bool error = false, aborted = false;
    for (int c = 0; c < r->n_choices; c++) {
        error |= r->choices[c].finish == KVLLM_FINISH_ERROR;
        aborted |= r->choices[c].finish == KVLLM_FINISH_ABORT || r->choices[c].finish == KVLLM_FINISH_NONE;
    }
    if (error || job_lost(j))
        return oai_error_set(e, 500, "engine_error", NULL, "the engine failed this request%s",
                             job_lost(j) ? " (out of memory)" : "");
    if (atomic_load(&j->shutdown))
        return oai_error_set(e, 503, "server_shutdown", NULL, "the server is shutting down; the request was ended");
    if (aborted) return oai_error_set(e, 503, "aborted", NULL, "the request was aborted");
    return 0;
}

/* The request line for a job that ran: counts from its response, times from the job. */
static void log_job(struct server *s, const struct oai_resp *r, const struct job *j, unsigned status, const char *why) {
    int prompt = 0, cached = 0, gen = 0;
    for (int p = 0; p < r->n_prompts; p++) { prompt += r->n_prompt[p]; cached += r->n_cached[p]; }
    for (int c = 0; c < r->n_choices; c++) gen += r->choices[c].n_generated;
    double now = time_now();
    const char *finish = r->n_choices ? oai_finish_name(r->choices[0].finish) : NULL;
    if (status == 500) finish = "error";
    server_log_request(s, r->id, status, prompt, cached, gen, j->t_first > 0 ? j->t_first - j->t_arrival : -1,
                       j->t_first > 0 ? now - j->t_first : 0, finish, now - j->t_arrival, why);
}

/* ---- prompts ---- */

/* Prompt k of a completions request as ids (malloc'd). Returns the count or -1.  special:
 * control-token text becomes control tokens (llama-server's /completion does so). */
static int prompt_ids(struct server *s, const struct oai_prompt *p, bool special, int32_t **out, struct oai_error *e) {
    if (!p->text) {
        for (int i = 0; i < p->n_ids; i++)
            if (p->ids[i] >= s->n_vocab)
                return oai_error_set(e, 400, NULL, "prompt", "token id %d at index %d is out of range (vocabulary of %d)",
                                 p->ids[i], i, s->n_vocab);
        if (!(*out = malloc((size_t)p->n_ids * sizeof **out))) return oai_error_set(e, 500, NULL, NULL, "out of memory");
        memcpy(*out, p->ids, (size_t)p->n_ids * sizeof **out);
        return p->n_ids;
    }
    int n = kvllm_tokenize(s->model, p->text, p->len, true, special, NULL, 0);
    if (n < 0)
        return oai_error_set(e, 400, NULL, "prompt", "cannot tokenize the prompt: %s",
                             n == KVLLM_ENOTFOUND ? "the model has no vocabulary" : kvllm_strerror(n));
    if (!(*out = malloc((size_t)(n > 0 ? n : 1) * sizeof **out))) return oai_error_set(e, 500, NULL, NULL, "out of memory");
    int n2 = kvllm_tokenize(s->model, p->text, p->len, true, special, *out, n);
    if (n2 != n) {   /* the same text twice must give the same ids: an engine fault, not the client's */
        free(*out);
        *out = NULL;
        return oai_error_set(e, 500, NULL, NULL, "tokenizing the prompt gave %d ids, then %d", n, n2);
    }
    return n;
}

/* The engine's request for one prompt; max_tokens resolved against the
 * context (400 with the numbers when it cannot fit). */
static int check_fit(struct server *s, const struct oai_request *rq, int n_prompt, int *max_tokens,
                     struct oai_error *e) {
    if (n_prompt == 0) return oai_error_set(e, 400, NULL, rq->chat ? "messages" : "prompt", "the prompt is empty");
    if (n_prompt >= s->n_ctx)
        return oai_error_set(e, 400, "context_length_exceeded", rq->chat ? "messages" : "prompt",
                         "This model's maximum context length is %d tokens, but the prompt has %d tokens "
                         "(at least one position must remain for the completion).", s->n_ctx, n_prompt);
    /* the longest a sequence may grow: the context, or the KV pool if smaller */
    int cap = s->pool_tokens > 0 && s->pool_tokens < s->n_ctx ? s->pool_tokens : s->n_ctx;
    int mt = rq->max_tokens;
    if (mt > 0 && (int64_t)n_prompt + mt > s->n_ctx)
        return oai_error_set(e, 400, "context_length_exceeded", rq->chat ? "max_completion_tokens" : "max_tokens",
                         "This model's maximum context length is %d tokens. However, you requested %lld tokens "
                         "(%d in the prompt, %d for the completion). Please reduce the prompt or max_tokens.",
                         s->n_ctx, (long long)n_prompt + mt, n_prompt, mt);
    if (mt == 0) {
        /* OpenAI's defaults: 16 new tokens for completions, for chat until
         * EOS or the context is full */
        mt = rq->chat || rq->llama ? cap - n_prompt : 16;
        if (mt > cap - n_prompt) mt = cap - n_prompt;
        if (mt < 1)
            return oai_error_set(e, 400, "context_length_exceeded", "prompt",
                             "the prompt (%d tokens) leaves no room in the KV pool (%d tokens)", n_prompt, cap);
    }
    *max_tokens = mt;
    return 0;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* ---- streaming ---- */

struct stream {
    struct server *s;
    struct MHD_Connection *c;
    struct job *j;
    struct oai_resp resp;
    bool include_usage, ended, counted;
    enum metrics_outcome outcome;
    unsigned status;         /* once ended: what the stream told the client (200, or its error event's) */
    char why[sizeof ((struct oai_error *)0)->message];   /* the error event's message */
    struct strbuf out;       /* SSE bytes not yet handed to MHD: out.s[off..len) */
    size_t off;
};

/* The request's outcome into the metrics, once: when its last event is
 * made, before MHD has its bytes (a client that has read [DONE] finds its
 * request counted; counted when MHD freed the response, it could read the
 * metrics first), else when the connection ends (a client that left). */
static void stream_count(struct stream *st, enum metrics_outcome oc) {
    if (st->counted) return;
    st->counted = true;
    metrics_request(&st->s->metrics, oc);
}

/* One event into SSE bytes.  A sequence that failed, or was aborted (by
 * shutdown: a client that left reads nothing), ends the whole stream with an
 * error event and [DONE]: OpenAI's clients raise on it, where a chunk with
 * finish_reason null or "abort" would pass for a short answer. */
static void stream_event(struct stream *st, struct job_event *e) {
    if (e->finish != KVLLM_FINISH_ERROR && e->finish != KVLLM_FINISH_ABORT) {
        oai_stream_event(&st->resp, e, &st->out);
        return;
    }
    if (e->len) {   /* the text before the failure still counts */
        e->finish = KVLLM_FINISH_NONE;
        oai_stream_event(&st->resp, e, &st->out);
    }
    struct oai_error err = { 0 };
    if (e->finish == KVLLM_FINISH_ERROR || job_lost(st->j)) oai_error_set(&err, 500, "engine_error", NULL, "the engine failed this request");
    else if (atomic_load(&st->j->shutdown))
        oai_error_set(&err, 503, "server_shutdown", NULL, "the server is shutting down; the request was ended");
    else oai_error_set(&err, 503, "aborted", NULL, "the request was aborted");
    st->outcome = err.status == 500 ? OUTCOME_SERVER_ERROR : OUTCOME_ABORTED;
    st->status = err.status;
    snprintf(st->why, sizeof st->why, "%s", err.message);
    oai_stream_error(&err, &st->out);
    st->ended = true;
    stream_count(st, st->outcome);
    job_cancel(st->j);   /* the other choices have nobody left to read them */
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct stream *st = cls;
    while (st->off == st->out.len) {
        if (st->ended) return -1;   /* MHD_CONTENT_READER_END_OF_STREAM */
        st->out.len = 0;
        st->off = 0;
        if (atomic_load(&st->j->gone)) return -2;   /* END_WITH_ERROR: drop the connection */
        struct job_event *e = job_pop(st->j);
        if (e) {
            stream_event(st, e);
            free(e);
        } else if (job_lost(st->j)) {
            struct job_event fail = { .finish = KVLLM_FINISH_ERROR };
            stream_event(st, &fail);
        } else if (st->resp.n_done == st->resp.n_choices) {
            oai_stream_end(&st->resp, st->include_usage, &st->out);
            st->outcome = OUTCOME_SUCCESS;
            st->status = 200;
            st->ended = true;
            stream_count(st, st->outcome);
        } else if (job_take_ping(st->j)) {
            sb_puts(&st->out, ": ping\n\n");   /* a comment: probes a half-closed client */
        } else if (job_suspend(st->j, st->c)) {
            return 0;   /* the engine thread resumes us with the next event */
        }
        if (st->out.oom) return -2;
    }
    size_t n = st->out.len - st->off;
    if (n > max) n = max;
    memcpy(buf, st->out.s + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    struct stream *st = cls;
    enum metrics_outcome oc = st->ended ? st->outcome : OUTCOME_ABORTED;
    /* a stream that ended told its client how (a shutdown's 503 event is not a client that left) */
    log_job(st->s, &st->resp, st->j, st->ended ? st->status : 499,
            st->ended && st->status != 200 ? st->why : st->ended ? NULL : "the client closed the connection");
    job_release(st->j);
    stream_count(st, oc);
    oai_resp_deinit(&st->resp);
    sb_free(&st->out);
    free(st);
}

/* ---- whole responses ---- */

struct whole {
    struct server *s;
    struct job *j;
    struct oai_resp resp;
};

void pending_free(void *pending) {
    struct whole *w = pending;
    if (!w) return;
    job_release(w->j);
    oai_resp_deinit(&w->resp);
    free(w);
}

/* The answer once every choice finished (or the client left). */
static int whole_answer(struct server *s, struct MHD_Connection *c, struct whole *w) {
    bool gone = atomic_load(&w->j->gone);
    struct oai_error err = { 0 };
    int failed = gone ? 0 : job_failure(w->j, &w->resp, &err);
    char *out = gone || failed ? NULL : oai_resp_json(&w->resp);
    const bool drained = job_drained(w->j);
    log_job(s, &w->resp, w->j, gone ? 499 : failed ? err.status : out ? 200 : 500,
            gone ? "the client closed the connection" : failed ? err.message : out ? NULL : "out of memory");
    pending_free(w);
    if (out && strlen(out) >= SERVER_RELEASE_BYTES) server_release_memory();   /* the choices it was built from */
    if (gone) {
        metrics_request(&s->metrics, OUTCOME_ABORTED);
        return HTTP_NO;   /* nobody reads: close */
    }
    if (failed && err.status == 503) {
        metrics_request(&s->metrics, OUTCOME_ABORTED);
        char *body = oai_error_json(&err);
        return body ? http_send(c, 503, "application/json", body) : HTTP_NO;
    }
    if (failed) return reply_error(s, c, &err);   /* logged above, with the job's counts */
    if (!out) return http_error(c, 500, NULL, NULL, "out of memory");
    metrics_request(&s->metrics, OUTCOME_SUCCESS);
    /* what the client pipelined behind this request was dropped (job_drain): nothing more can be read */
    if (drained) return http_send_hdr(c, 200, "application/json", out, "Connection", "close");
    return http_send(c, 200, "application/json", out);
}

/* Fold in what has arrived; answer when complete, else suspend until the
 * engine thread resumes the connection. */
static int whole_step(struct server *s, struct MHD_Connection *c, struct whole *w, void **pending) {
    for (;;) {
        struct job_event *e;
        while ((e = job_pop(w->j))) { oai_resp_add(&w->resp, e); free(e); }
        if (w->resp.n_done == w->resp.n_choices || atomic_load(&w->j->gone) || job_lost(w->j)) break;
        if (job_suspend(w->j, c)) { *pending = w; return HTTP_YES; }
    }
    *pending = NULL;
    return whole_answer(s, c, w);
}

int handle_pending(struct server *s, struct MHD_Connection *c, void **pending) {
    return whole_step(s, c, *pending, pending);
}

/* ---- completions and chat ---- */

/* ---- tool calling ---- */

/* What a chat request's tools change: the template gets them, the answer is
 * parsed for calls in the server's format, and a forced call (required, or
 * a named function) starts the answer with the format's opening and is
 * constrained by the grammar of its JSON Schema. */
struct tool_plan {
    const char *tools;               /* JSON text for the template; NULL: not offered */
    enum toolcall_format format;     /* TOOLCALL_NONE: answers are not parsed */
    const char *prefill;             /* static; NULL: none */
    struct kvllm_grammar *grammar;   /* a forced call's grammar (own reference); NULL: none */
};

/* A forced call's JSON Schema compiled (gram's compiler): a keyword it
 * cannot enforce is a 400 naming its path, never a call left unconstrained. */
static int tool_grammar_compile(const char *schema, bool strict, struct kvllm_grammar **g, struct oai_error *err) {
    char why[256] = "";
    int rc = kvllm_grammar_from_json_schema(schema, strict, g, why, sizeof why);
    if (rc == KVLLM_ENOMEM) return oai_error_set(err, 500, NULL, NULL, "out of memory");
    if (rc)
        return oai_error_set(err, 400, NULL, "tools", "the function's parameters cannot be enforced for a forced "
                             "call (tool_choice required or named): %s (the call's schema holds the function's "
                             "parameters under $.properties.arguments, or .parameters for Llama 3)", why);
    return 0;
}

/* The opening a forced call starts with, written by the prompt so that
 * the model continues inside a call (Llama 3 has none: its call is the
 * whole answer). */
static const char *call_opening(enum toolcall_format f) {
    switch (f) {
    case TOOLCALL_HERMES: return "<tool_call>\n";
    case TOOLCALL_MISTRAL: return "[TOOL_CALLS]";
    default: return NULL;
    }
}

/* The JSON Schema of what a forced call's answer is after its opening: a
 * call object {"name": one of the functions, "arguments" (Llama 3:
 * "parameters"): that function's parameters schema}, for Mistral inside a
 * list of one (or more, with parallel calls).  tools: the request's
 * validated `tools`; only: the named function (NULL: any).  *strict: a
 * function asked for OpenAI's strict mode.  Returns malloc'd JSON text, or
 * NULL when out of memory. */
static char *call_schema(const char *tools, const char *only, enum toolcall_format f, bool parallel, bool *strict) {
    json_object *t = json_tokener_parse(tools), *any = json_object_new_array();
    *strict = false;
    for (size_t k = 0; t && k < json_object_array_length(t); k++) {
        json_object *fn = json_object_object_get(json_object_array_get_idx(t, k), "function");
        json_object *name = json_object_object_get(fn, "name"), *params = json_object_object_get(fn, "parameters");
        json_object *st = json_object_object_get(fn, "strict");
        if (only && strcmp(json_object_get_string(name), only)) continue;
        if (st && json_object_get_boolean(st)) *strict = true;
        json_object *call = json_object_new_object(), *props = json_object_new_object();
        json_object *nm = json_object_new_object(), *en = json_object_new_array(), *req = json_object_new_array();
        const char *args_key = f == TOOLCALL_LLAMA3 ? "parameters" : "arguments";
        json_object_array_add(en, json_object_get(name));
        json_object_object_add(nm, "enum", en);
        json_object_object_add(props, "name", nm);
        /* a function without parameters takes none: its arguments are {} */
        json_object *no_params = params ? NULL : json_tokener_parse("{\"type\": \"object\", \"properties\": {}, "
                                                                    "\"additionalProperties\": false}");
        json_object_object_add(props, args_key, params ? json_object_get(params) : no_params);
        json_object_object_add(call, "type", json_object_new_string("object"));
        json_object_object_add(call, "properties", props);
        json_object_array_add(req, json_object_new_string("name"));
        json_object_array_add(req, json_object_new_string(args_key));
        json_object_object_add(call, "required", req);
        json_object_object_add(call, "additionalProperties", json_object_new_boolean(0));
        json_object_array_add(any, call);
    }
    json_object *one;
    if (json_object_array_length(any) == 1) {
        one = json_object_get(json_object_array_get_idx(any, 0));
    } else {
        one = json_object_new_object();
        json_object_object_add(one, "anyOf", json_object_get(any));
    }
    json_object_put(any);
    json_object_put(t);
    if (f == TOOLCALL_MISTRAL) {
        json_object *list = json_object_new_object();
        json_object_object_add(list, "type", json_object_new_string("array"));
        json_object_object_add(list, "items", one);
        json_object_object_add(list, "minItems", json_object_new_int(1));
        if (!parallel) json_object_object_add(list, "maxItems", json_object_new_int(1));
        one = list;
    }
    const char *str = json_object_to_json_string_ext(one, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    char *out = str ? strdup(str) : NULL;
    json_object_put(one);
    return out;
}

/* The grammar of a forced call (see call_schema). */
static int call_grammar(const struct oai_request *rq, enum toolcall_format f, struct kvllm_grammar **g,
                        struct oai_error *err) {
    *g = NULL;
    bool strict;
    char *schema = call_schema(rq->tools, rq->tool_choice == OAI_TOOL_NAMED ? rq->tool_name : NULL, f,
                               rq->parallel_tool_calls, &strict);
    if (!schema) return oai_error_set(err, 500, NULL, NULL, "out of memory");
    int rc = tool_grammar_compile(schema, strict, g, err);
    free(schema);
    return rc;
}

static int plan_tools(struct server *s, const struct oai_request *rq, struct tool_plan *tp, struct oai_error *err) {
    *tp = (struct tool_plan){ .format = TOOLCALL_NONE };
    if (!rq->chat || rq->tool_choice == OAI_TOOL_NONE || !rq->tools) return 0;   /* none: not offered, not parsed */
    if (s->tool_format == TOOLCALL_NONE)
        return oai_error_set(err, 400, "tools_unsupported", "tools",
                             "this server reads no tool calls: its chat template shows no tool-call format kvllm "
                             "knows (Hermes/Qwen <tool_call>, Llama 3 JSON, Mistral [TOOL_CALLS]) and no "
                             "--tool-call-format was given; send tool_choice \"none\" or leave out 'tools'");
    tp->tools = rq->tools;
    tp->format = (enum toolcall_format)s->tool_format;
    if (rq->tool_choice == OAI_TOOL_REQUIRED || rq->tool_choice == OAI_TOOL_NAMED) {
        if (rq->grammar)
            return oai_error_set(err, 400, NULL, "tool_choice", "a forced tool call cannot be combined with "
                                 "response_format, grammar or json_schema: the call has its own grammar");
        tp->prefill = call_opening(tp->format);
        if (call_grammar(rq, tp->format, &tp->grammar, err)) return -1;
    }
    return 0;
}

/* Submit every prompt; on failure the ones already queued are aborted. */
static int submit(struct server *s, struct job *j, const struct oai_request *rq, int np, int32_t **ids,
                  const int *n_ids, const int *max_tokens, struct oai_error *e) {
    for (int k = 0; k < np; k++) {
        struct kvllm_sampling_params sp = rq->sp;
        if (!rq->seed_set) sp.seed = splitmix64((uint64_t)(time_now() * 1e9) ^ atomic_fetch_add(&s->next_id, 1));
        struct kvllm_request q = { .prompt = ids[k], .n_prompt = n_ids[k], .max_tokens = max_tokens[k],
                                   .sampling = sp, .n = rq->n, .ignore_eos = rq->ignore_eos,
                                   .stop = (const char *const *)rq->stop, .n_stop = rq->n_stop,
                                   .grammar = rq->grammar, .min_tokens = rq->min_tokens,
                                   .stop_token_ids = rq->stop_token_ids, .n_stop_token_ids = rq->n_stop_token_ids,
                                   .logit_bias = rq->logit_bias, .n_logit_bias = rq->n_logit_bias,
                                   .include_stop_str = rq->include_stop_str, .special_text = rq->special_text };
        char why[sizeof e->message];
        int rc = job_submit(j, k, &q, why, sizeof why);
        if (rc == KVLLM_EBUSY)
            return oai_error_set(e, 429, "queue_full", NULL, "the server's queue is full (--max-queue); try again later");
        if (rc == KVLLM_ERANGE || rc == KVLLM_EINVAL)
            return oai_error_set(e, 400, NULL, NULL, "%s", *why ? why : kvllm_strerror(rc));
        if (rc) return oai_error_set(e, 500, NULL, NULL, "cannot queue the request: %s", *why ? why : kvllm_strerror(rc));
    }
    return 0;
}

/* The token ids of stop_token_ids and logit_bias against the vocabulary,
 * min_tokens against max_tokens: 400s naming the field. */
static int check_token_fields(struct server *s, const struct oai_request *rq, const int *max_tokens, int np,
                              struct oai_error *e) {
    for (int i = 0; i < rq->n_stop_token_ids; i++)
        if (rq->stop_token_ids[i] >= s->n_vocab)
            return oai_error_set(e, 400, NULL, "stop_token_ids", "stop_token_ids[%d] = %d is out of range "
                                 "(vocabulary of %d)", i, rq->stop_token_ids[i], s->n_vocab);
    for (int i = 0; i < rq->n_logit_bias; i++)
        if (rq->logit_bias[i].token >= s->n_vocab)
            return oai_error_set(e, 400, NULL, "logit_bias", "logit_bias: token %d is out of range (vocabulary of "
                                 "%d)", rq->logit_bias[i].token, s->n_vocab);
    for (int k = 0; k < np; k++)
        if (rq->min_tokens > max_tokens[k])
            return oai_error_set(e, 400, NULL, "min_tokens", "'min_tokens' (%d) exceeds the tokens this request may "
                                 "generate (%d: max_tokens or what the context leaves)", rq->min_tokens,
                                 max_tokens[k]);
    return 0;
}

/* The text a completions prompt stands for (echo): its text, or its ids
 * decoded.  malloc'd, *len bytes; NULL when out of memory. */
static char *prompt_text(struct server *s, const struct oai_prompt *p, size_t *len) {
    struct strbuf b = { 0 };
    sb_put(&b, "", 0);
    if (p->text) {
        sb_put(&b, p->text, p->len);
    } else {
        struct kvllm_detok *d = NULL;
        if (kvllm_detok_new(s->model, &d)) { sb_free(&b); return NULL; }
        for (int i = 0; i < p->n_ids; i++) {
            const char *piece = kvllm_detok_push(d, i ? p->ids[i - 1] : -1, p->ids[i]);
            if (piece) sb_puts(&b, piece);
        }
        const char *rest = kvllm_detok_flush(d);
        if (rest) sb_puts(&b, rest);
        kvllm_detok_free(d);
    }
    if (b.oom) { sb_free(&b); return NULL; }
    *len = b.len;
    return sb_take(&b);
}

/* Everything before the engine: model name, chat rendering, tokenization,
 * context checks.  Fills ids / n_ids / max_tokens (np entries). */
/* What a whole (not streamed) response may take while it is built: its
 * choices' text and, heaviest, a JSON object per log-probability (about 220
 * bytes each, measured).  One 2 KB request of 16 prompts x n = 32 x 250
 * tokens with logprobs 20 built a 69 MB answer from 811 MB of objects; a
 * request whose worst case passes the budget is refused before it runs.  A
 * stream builds nothing: each event goes out as it comes. */
#define RESPONSE_BUDGET ((uint64_t)64 << 20)
#define RESPONSE_TOKEN_BYTES 8
#define RESPONSE_LOGPROB_BYTES 256

static int check_response_size(const struct oai_request *rq, int np, const int *max_tokens, struct oai_error *e) {
    if (rq->stream) return 0;
    uint64_t positions = 0;
    int longest = 0;
    for (int k = 0; k < np; k++) {
        positions += (uint64_t)max_tokens[k] * (uint64_t)rq->n;
        if (max_tokens[k] > longest) longest = max_tokens[k];
    }
    const uint64_t per = RESPONSE_TOKEN_BYTES + (rq->logprobs >= 0 ? (uint64_t)(1 + rq->logprobs) * RESPONSE_LOGPROB_BYTES : 0);
    if (positions * per <= RESPONSE_BUDGET) return 0;
    return oai_error_set(e, 400, "response_too_large",
                         rq->logprobs >= 0 ? (rq->chat ? "top_logprobs" : "logprobs") : "n",
                         "the response could take %llu MB to build (%d prompt%s x n = %d x up to %d tokens%s), more than "
                         "the %llu MB a response may: lower n, max_tokens or logprobs, or stream it",
                         (unsigned long long)((positions * per) >> 20), np, np == 1 ? "" : "s", rq->n, longest,
                         rq->logprobs >= 0 ? " with log-probabilities" : "", (unsigned long long)(RESPONSE_BUDGET >> 20));
}

static int prepare(struct server *s, const struct oai_request *rq, int np, int32_t **ids, int *n_ids, int *max_tokens,
                   struct tool_plan *tp, struct oai_error *err) {
    if (rq->model && strcmp(rq->model, s->model_id))
        return oai_error_set(err, 404, "model_not_found", "model", "The model '%s' does not exist; this server serves '%s'",
                         rq->model, s->model_id);
    if (rq->chat) {
        /* rendered and tokenized: message text stays text unless --special-in-content */
        char why[sizeof err->message - 64];
        struct kvllm_chat_opts co = { .add_generation_prompt = true, .special_in_content = s->special_in_content,
                                      .tools = tp->tools, .prefill = tp->prefill, .err = why, .err_cap = sizeof why };
        int cr = kvllm_chat_tokenize_ex(s->model, s->chat_template, rq->msgs, rq->n_msgs, &co, &ids[0], &n_ids[0]);
        if (cr == KVLLM_ENOTFOUND)
            return oai_error_set(err, 400, "no_chat_template", "messages",
                             "this model has no chat template; start the server with --chat-template FILE, or use "
                             "/v1/completions");
        if (cr == KVLLM_ENOMEM) return oai_error_set(err, 500, NULL, NULL, "out of memory");
        if (cr)
            return oai_error_set(err, 400, "chat_template", "messages", "cannot apply the chat template (%s): %s",
                             kvllm_strerror(cr), *why ? why : "no detail");
    }
    for (int k = 0; !rq->chat && k < np; k++)
        if ((n_ids[k] = prompt_ids(s, &rq->prompts[k], rq->llama, &ids[k], err)) < 0) return -1;
    for (int k = 0; k < np; k++)
        if (check_fit(s, rq, n_ids[k], &max_tokens[k], err)) return -1;
    return check_token_fields(s, rq, max_tokens, np, err);
}

int handle_completion(struct server *s, struct MHD_Connection *c, enum api_kind kind, const char *body, size_t len,
                      bool http11, void **pending) {
    const double t_arrival = time_now();
    const bool chat = kind == API_CHAT;
    struct oai_error err = { 0 };
    int state = atomic_load(&s->state);
    if (state != SRV_READY) {
        if (state == SRV_LOADING) oai_error_set(&err, 503, NULL, NULL, "the model is still loading");
        else if (state == SRV_FAILED)
            oai_error_set(&err, 503, "server_failed", NULL, "the server failed (a tensor-parallel rank was lost)");
        else oai_error_set(&err, 503, "server_shutdown", NULL, "the server is shutting down");
        return send_error(s, c, &err);
    }
    struct oai_request rq;
    if (kind == API_LLAMA) {
        char *translated = oai_llama_body(body, len);
        if (!translated) return http_error(c, 500, NULL, NULL, "out of memory");
        int pr = oai_parse(false, translated, strlen(translated), &rq, &err);
        free(translated);
        if (pr) return send_error(s, c, &err);
        rq.llama = true;
        if (rq.n_prompts > 1 || rq.n > 1) {
            oai_request_free(&rq);
            oai_error_set(&err, 400, NULL, "prompt", "/completion takes one prompt and one sample; use /v1/completions");
            return send_error(s, c, &err);
        }
    } else if (oai_parse(chat, body, len, &rq, &err)) {
        return send_error(s, c, &err);
    }

    const int np = chat ? 1 : rq.n_prompts;   /* a rendered conversation is one prompt */
    int32_t **ids = calloc((size_t)np, sizeof *ids);
    int *n_ids = calloc((size_t)np, sizeof *n_ids), *max_tokens = calloc((size_t)np, sizeof *max_tokens);
    struct job *j = NULL;
    struct oai_resp resp = { 0 };
    struct tool_plan tp = { .format = TOOLCALL_NONE };
    int rc = ids && n_ids && max_tokens ? 0 : oai_error_set(&err, 500, NULL, NULL, "out of memory");
    if (!rc) rc = plan_tools(s, &rq, &tp, &err);
    if (!rc && tp.grammar) {   /* the request owns it from here (oai_request_free) */
        rq.grammar = tp.grammar;
        tp.grammar = NULL;
    }
    if (!rc) rc = prepare(s, &rq, np, ids, n_ids, max_tokens, &tp, &err);
    if (!rc) rc = check_response_size(&rq, np, max_tokens, &err);
    if (!rc && !(j = job_new(s, np, rq.n, s->n_vocab, rq.logprobs, t_arrival, rq.stream)))
        rc = oai_error_set(&err, 500, NULL, NULL, "out of memory");
    if (!rc) rc = submit(s, j, &rq, np, ids, n_ids, max_tokens, &err);
    if (!rc) {
        char id[48];
        snprintf(id, sizeof id, "%s-%016llx", chat ? "chatcmpl" : "cmpl",
                 (unsigned long long)splitmix64(atomic_fetch_add(&s->next_id, 1) ^ (uint64_t)s->created));
        if (oai_resp_init(&resp, chat, id, (long long)time(NULL), s->model_id, s->model, n_ids, np, rq.n,
                          rq.logprobs))
            rc = oai_error_set(&err, 500, NULL, NULL, "out of memory");
        resp.llama = rq.llama;
        uint64_t ids_seed = splitmix64(atomic_fetch_add(&s->next_id, 1) ^ (uint64_t)(time_now() * 1e9));
        if (!rc && oai_resp_set_tools(&resp, tp.format, tp.prefill, !rq.parallel_tool_calls, ids_seed, tp.tools))
            rc = oai_error_set(&err, 500, NULL, NULL, "out of memory");
    }
    for (int k = 0; !rc && rq.echo && k < np; k++) {
        size_t tl = 0;
        char *t = prompt_text(s, &rq.prompts[k], &tl);
        if (!t || oai_resp_set_echo(&resp, k, t, tl)) rc = oai_error_set(&err, 500, NULL, NULL, "out of memory");
        free(t);
    }
    if (!rc) {
        uint64_t total = 0;
        for (int k = 0; k < np; k++) total += (uint64_t)n_ids[k];
        metrics_prompt_tokens(&s->metrics, total);
    }
    for (int k = 0; ids && k < np; k++) free(ids[k]);
    free(ids);
    free(n_ids);
    free(max_tokens);
    bool stream = rq.stream, include_usage = rq.include_usage;
    oai_request_free(&rq);
    struct stream *st = !rc && stream ? calloc(1, sizeof *st) : NULL;
    struct whole *w = !rc && !stream ? calloc(1, sizeof *w) : NULL;
    if (!rc && !st && !w) rc = oai_error_set(&err, 500, NULL, NULL, "out of memory");
    if (rc) {
        if (j) job_release(j);   /* aborts whatever was queued */
        oai_resp_deinit(&resp);
        return send_error(s, c, &err);
    }
    j->http11 = http11;
    http_watch(s, c, j);
    /* shutdown began after the check above and may have missed this job:
     * http_end_requests sets SRV_STOPPING before it collects the watched */
    if (atomic_load(&s->state) == SRV_STOPPING) job_shutdown(j);
    if (w) {
        *w = (struct whole){ .s = s, .j = j, .resp = resp };
        return whole_step(s, c, w, pending);
    }
    *st = (struct stream){ .s = s, .c = c, .j = j, .resp = resp, .include_usage = include_usage,
                           .outcome = OUTCOME_ABORTED };
    return http_stream(c, stream_read, st, stream_free);
}

/* ---- models, health, metrics ---- */

static json_object *model_json(struct server *s) {
    json_object *m = json_object_new_object();
    json_object_object_add(m, "id", json_object_new_string(s->model_id));
    json_object_object_add(m, "object", json_object_new_string("model"));
    json_object_object_add(m, "created", json_object_new_int64((int64_t)s->created));
    json_object_object_add(m, "owned_by", json_object_new_string("kvllm"));
    if (atomic_load(&s->state) == SRV_READY) {
        /* extensions, as vLLM reports max_model_len; the load generator reads vocab_size */
        json_object_object_add(m, "max_model_len", json_object_new_int(s->n_ctx));
        json_object_object_add(m, "vocab_size", json_object_new_int(s->n_vocab));
    }
    return m;
}

int send_json(struct MHD_Connection *c, unsigned status, json_object *o) {
    const char *str = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    char *body = str ? strdup(str) : NULL;
    json_object_put(o);
    if (!body) return http_error(c, 500, NULL, NULL, "out of memory");
    return http_send(c, status, "application/json", body);
}

int handle_models(struct server *s, struct MHD_Connection *c, const char *id) {
    if (id) {
        if (strcmp(id, s->model_id))
            return http_error(c, 404, "model_not_found", "model", "The model '%s' does not exist", id);
        return send_json(c, 200, model_json(s));
    }
    json_object *o = json_object_new_object(), *a = json_object_new_array();
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_array_add(a, model_json(s));
    json_object_object_add(o, "data", a);
    return send_json(c, 200, o);
}

int handle_health(struct server *s, struct MHD_Connection *c) {
    int st = atomic_load(&s->state);
    json_object *o = json_object_new_object();
    json_object_object_add(o, "status", json_object_new_string(st == SRV_READY ? "ok" : st == SRV_LOADING ? "loading"
                                                               : st == SRV_DRAINING ? "draining"
                                                               : st == SRV_FAILED ? "failed" : "stopping"));
    return send_json(c, st == SRV_READY ? 200 : 503, o);
}

int handle_metrics(struct server *s, struct MHD_Connection *c) {
    struct kvllm_engine_stats st;
    bool ready = server_stats(s, &st);
    int counted, over;
    http_connections(s, &counted, &over);
    char *body = metrics_render(&s->metrics, ready ? &st : NULL, counted, over, s->model_id);
    if (!body) return http_error(c, 500, NULL, NULL, "out of memory");
    return http_send(c, 200, "text/plain; version=0.0.4; charset=utf-8", body);
}

/* ---- llama-server's and vLLM's extras: tokenize, detokenize, version, props ---- */

/* A JSON object body, or an answered 400 (*root NULL; returns MHD's result). */
static int json_body(struct MHD_Connection *c, const char *body, size_t len, json_object **root) {
    *root = NULL;
    if (!utf8_valid(body, len)) return http_error(c, 400, NULL, NULL, "the request body is not valid UTF-8");
    json_tokener *tok = json_tokener_new_ex(64);
    if (!tok) return http_error(c, 500, NULL, NULL, "out of memory");
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    json_object *o = len ? json_tokener_parse_ex(tok, body, (int)len) : NULL;
    bool ok = o && json_tokener_get_error(tok) == json_tokener_success && json_tokener_get_parse_end(tok) == len;
    json_tokener_free(tok);
    if (!ok || json_object_get_type(o) != json_type_object) {
        json_object_put(o);
        return http_error(c, 400, NULL, NULL, "the request body must be a JSON object");
    }
    *root = o;
    return HTTP_YES;
}

static json_object *get_field(json_object *o, const char *key) {
    json_object *v = NULL;
    json_object_object_get_ex(o, key, &v);
    return v;
}

/* A boolean field: 1 true, 0 false, def when absent, -1 of another type. */
static int get_flag(json_object *o, const char *key, int def) {
    json_object *v = get_field(o, key);
    if (!v) return def;
    return json_object_get_type(v) == json_type_boolean ? json_object_get_boolean(v) : -1;
}

static int not_ready(struct server *s, struct MHD_Connection *c) {
    int st = atomic_load(&s->state);
    if (st == SRV_LOADING) return http_error(c, 503, NULL, NULL, "the model is still loading");
    return http_error(c, 503, "server_shutdown", NULL, "the server is shutting down");
}

/* A token's bytes as JSON: a string when they are valid UTF-8, else a list of byte values
 * (llama-server's convention for partial characters). */
static json_object *piece_json(struct server *s, int32_t id) {
    char buf[256];
    int n = kvllm_token_to_bytes(s->model, id, buf, sizeof buf);
    if (n < 0) n = 0;
    if (n > (int)sizeof buf) n = (int)sizeof buf;
    if (utf8_valid(buf, (size_t)n)) return json_object_new_string_len(buf, n);
    json_object *a = json_object_new_array();
    for (int i = 0; i < n; i++) json_object_array_add(a, json_object_new_int((unsigned char)buf[i]));
    return a;
}

/* POST /tokenize.  llama-server: {"content", "add_special" (false), "parse_special" (true),
 * "with_pieces" (false)} -> {"tokens": [...]}.  vLLM: {"prompt", "add_special_tokens" (true)} or
 * {"messages", "add_generation_prompt" (true)}, "return_token_strs" -> {"count", "max_model_len",
 * "tokens", "token_strs"}.  Both shapes' fields are in the answer. */
int handle_tokenize(struct server *s, struct MHD_Connection *c, const char *body, size_t len) {
    if (atomic_load(&s->state) != SRV_READY) return not_ready(s, c);
    json_object *root;
    int ret = json_body(c, body, len, &root);
    if (!root) return ret;
    json_object *content = get_field(root, "content"), *prompt = get_field(root, "prompt");
    json_object *msgs = get_field(root, "messages"), *model = get_field(root, "model");
    json_object *text = content ? content : prompt;
    int add = get_flag(root, content ? "add_special" : "add_special_tokens", content ? 0 : 1);
    int special = get_flag(root, "parse_special", 1), pieces = get_flag(root, "with_pieces", 0);
    int strs = get_flag(root, "return_token_strs", 0), gen = get_flag(root, "add_generation_prompt", 1);
    int32_t *ids = NULL;
    int n = 0;
    if (model && (json_object_get_type(model) != json_type_string || strcmp(json_object_get_string(model), s->model_id))) {
        ret = http_error(c, 404, "model_not_found", "model", "this server serves '%s'", s->model_id);
    } else if (add < 0 || special < 0 || pieces < 0 || strs < 0 || gen < 0) {
        ret = http_error(c, 400, NULL, NULL, "add_special, add_special_tokens, parse_special, with_pieces, "
                         "return_token_strs and add_generation_prompt must be booleans");
    } else if (msgs) {
        /* through the chat parser: the same checks as /v1/chat/completions */
        json_object *req = json_object_new_object();
        json_object_object_add(req, "messages", json_object_get(msgs));
        const char *str = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
        struct oai_request rq;
        struct oai_error err = { 0 };
        int pr = str ? oai_parse(true, str, strlen(str), &rq, &err) : oai_error_set(&err, 500, NULL, NULL, "out of memory");
        json_object_put(req);
        if (pr) {
            char *e = oai_error_json(&err);
            ret = e ? http_send(c, err.status, "application/json", e) : HTTP_NO;
        } else {
            char why[400];
            struct kvllm_chat_opts co = { .add_generation_prompt = gen, .special_in_content = s->special_in_content,
                                          .err = why, .err_cap = sizeof why };
            int rc = kvllm_chat_tokenize_ex(s->model, s->chat_template, rq.msgs, rq.n_msgs, &co, &ids, &n);
            oai_request_free(&rq);
            if (rc == KVLLM_ENOTFOUND) ret = http_error(c, 400, "no_chat_template", "messages", "this model has no chat template");
            else if (rc) ret = http_error(c, 400, "chat_template", "messages", "cannot apply the chat template: %s",
                                          *why ? why : kvllm_strerror(rc));
            else ret = -1;
        }
    } else if (!text || json_object_get_type(text) != json_type_string) {
        ret = http_error(c, 400, NULL, content ? "content" : "prompt",
                         "'content' (llama-server), 'prompt' or 'messages' (vLLM) is required, as a string");
    } else {
        const char *t = json_object_get_string(text);
        size_t tl = (size_t)json_object_get_string_len(text);
        n = kvllm_tokenize(s->model, t, tl, add, special, NULL, 0);
        ids = n >= 0 ? malloc((size_t)(n > 0 ? n : 1) * sizeof *ids) : NULL;
        if (n < 0) ret = http_error(c, 400, NULL, NULL, "cannot tokenize: %s", kvllm_strerror(n));
        else if (!ids) ret = http_error(c, 500, NULL, NULL, "out of memory");
        else { kvllm_tokenize(s->model, t, tl, add, special, ids, n); ret = -1; }
    }
    if (ret == -1) {
        json_object *o = json_object_new_object(), *a = json_object_new_array();
        json_object *ts = strs ? json_object_new_array() : NULL;
        for (int i = 0; i < n; i++) {
            if (pieces) {
                json_object *x = json_object_new_object();
                json_object_object_add(x, "id", json_object_new_int(ids[i]));
                json_object_object_add(x, "piece", piece_json(s, ids[i]));
                json_object_array_add(a, x);
            } else {
                json_object_array_add(a, json_object_new_int(ids[i]));
            }
            if (ts) json_object_array_add(ts, piece_json(s, ids[i]));
        }
        json_object_object_add(o, "tokens", a);
        json_object_object_add(o, "count", json_object_new_int(n));
        json_object_object_add(o, "max_model_len", json_object_new_int(s->n_ctx));
        json_object_object_add(o, "token_strs", ts);
        ret = send_json(c, 200, o);
    }
    free(ids);
    json_object_put(root);
    return ret;
}

/* POST /detokenize: {"tokens": [ids]} -> {"content" (llama-server), "prompt" (vLLM)}. */
int handle_detokenize(struct server *s, struct MHD_Connection *c, const char *body, size_t len) {
    if (atomic_load(&s->state) != SRV_READY) return not_ready(s, c);
    json_object *root;
    int ret = json_body(c, body, len, &root);
    if (!root) return ret;
    json_object *a = get_field(root, "tokens");
    struct kvllm_detok *d = NULL;
    struct strbuf out = { 0 };
    sb_put(&out, "", 0);
    if (!a || json_object_get_type(a) != json_type_array) {
        ret = http_error(c, 400, NULL, "tokens", "'tokens' must be a list of token ids");
    } else if (kvllm_detok_new(s->model, &d)) {
        ret = http_error(c, 500, NULL, NULL, "cannot detokenize with this model");
    } else {
        int32_t prev = -1;
        ret = -1;
        for (size_t i = 0; i < json_object_array_length(a) && ret == -1; i++) {
            json_object *v = json_object_array_get_idx(a, i);
            int64_t id = json_object_get_type(v) == json_type_int ? json_object_get_int64(v) : -1;
            if (id < 0 || id >= s->n_vocab) {
                ret = http_error(c, 400, NULL, "tokens", "tokens[%zu] is not a token id in [0, %d)", i, s->n_vocab);
                break;
            }
            const char *piece = kvllm_detok_push(d, prev, (int32_t)id);
            if (piece) sb_puts(&out, piece);
            prev = (int32_t)id;
        }
        const char *rest = ret == -1 ? kvllm_detok_flush(d) : NULL;
        if (rest) sb_puts(&out, rest);
    }
    if (ret == -1 && out.oom) ret = http_error(c, 500, NULL, NULL, "out of memory");
    if (ret == -1) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "content", json_object_new_string_len(out.s, (int)out.len));
        json_object_object_add(o, "prompt", json_object_new_string_len(out.s, (int)out.len));
        ret = send_json(c, 200, o);
    }
    kvllm_detok_free(d);
    sb_free(&out);
    json_object_put(root);
    return ret;
}

int handle_version(struct server *s, struct MHD_Connection *c) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "name", json_object_new_string("kvllm"));
    json_object_object_add(o, "version", json_object_new_string(s->version));
    json_object_object_add(o, "commit", json_object_new_string(s->commit));
    return send_json(c, 200, o);
}

/* GET /props, as llama-server: the model, its context, slots, template and build. */
int handle_props(struct server *s, struct MHD_Connection *c) {
    if (atomic_load(&s->state) != SRV_READY) return not_ready(s, c);
    size_t tl;
    const char *tmpl = server_chat_template(s, &tl);
    const struct kvllm_model_desc *d = kvllm_model_describe(s->model);
    char build[128];
    snprintf(build, sizeof build, "kvllm %s (commit %s), kernels %s", s->version, s->commit, kvllm_model_backend(s->model));
    json_object *o = json_object_new_object(), *g = json_object_new_object(), *p = json_object_new_object();
    json_object_object_add(p, "temperature", json_object_new_double(0.8));
    json_object_object_add(p, "top_k", json_object_new_int(40));
    json_object_object_add(p, "top_p", json_object_new_double(0.95));
    json_object_object_add(p, "min_p", json_object_new_double(0.05));
    json_object_object_add(p, "n_predict", json_object_new_int(-1));
    json_object_object_add(g, "n_ctx", json_object_new_int(s->n_ctx));
    json_object_object_add(g, "params", p);
    json_object_object_add(o, "default_generation_settings", g);
    json_object_object_add(o, "model", json_object_new_string(s->model_id));
    json_object_object_add(o, "model_alias", json_object_new_string(s->model_id));
    json_object_object_add(o, "n_ctx", json_object_new_int(s->n_ctx));
    json_object_object_add(o, "n_ctx_train", json_object_new_int(d->n_ctx_train));
    json_object_object_add(o, "n_vocab", json_object_new_int(d->n_vocab));
    json_object_object_add(o, "total_slots", json_object_new_int(s->max_seqs));
    json_object_object_add(o, "chat_template", json_object_new_string_len(tmpl ? tmpl : "", (int)tl));
    json_object_object_add(o, "has_chat_template", json_object_new_boolean(tmpl != NULL));
    json_object_object_add(o, "build_info", json_object_new_string(build));
    json_object_object_add(o, "version", json_object_new_string(s->version));
    json_object_object_add(o, "commit", json_object_new_string(s->commit));
    return send_json(c, 200, o);
}
