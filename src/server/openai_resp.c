/* openai_resp.c — responses, server-sent-event chunks and errors in OpenAI's
 * shapes (json-c), built from the engine's events. */
#include "server/openai.h"

#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_FLAGS (JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)

/* ---- errors ---- */

static const char *error_type(unsigned status) {
    switch (status) {
    case 401: return "authentication_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static char *to_string(json_object *o) {
    const char *s = o ? json_object_to_json_string_ext(o, JSON_FLAGS) : NULL;
    char *out = s ? strdup(s) : NULL;
    json_object_put(o);
    return out;
}

char *oai_error_json(const struct oai_error *e) {
    json_object *in = json_object_new_object(), *o = json_object_new_object();
    if (!in || !o) { json_object_put(in); json_object_put(o); return NULL; }
    /* the message may quote client bytes: keep the response valid UTF-8 */
    struct strbuf msg = { 0 };
    utf8_sanitize(&msg, e->message, strlen(e->message));
    json_object_object_add(in, "message", json_object_new_string(msg.s ? msg.s : ""));
    sb_free(&msg);
    json_object_object_add(in, "type", json_object_new_string(error_type(e->status)));
    json_object_object_add(in, "param", e->param[0] ? json_object_new_string(e->param) : NULL);
    json_object_object_add(in, "code", e->code ? json_object_new_string(e->code) : NULL);
    json_object_object_add(o, "error", in);
    return to_string(o);
}

/* ---- responses ---- */

int oai_resp_init(struct oai_resp *r, bool chat, const char *id, long long created, const char *model_id,
                  const struct kvllm_model *model, const int *n_prompt, int n_prompts, int n, int logprobs) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    snprintf(r->id, sizeof r->id, "%s", id);
    r->created = created;
    r->model_id = model_id;
    r->model = model;
    r->n_prompts = n_prompts;
    r->n = n;
    r->n_choices = n_prompts * n;
    r->logprobs = logprobs;
    r->choices = calloc((size_t)r->n_choices, sizeof *r->choices);
    r->n_prompt = calloc((size_t)n_prompts, sizeof *r->n_prompt);
    r->n_cached = calloc((size_t)n_prompts, sizeof *r->n_cached);
    if (!r->choices || !r->n_prompt || !r->n_cached) { oai_resp_deinit(r); return KVLLM_ENOMEM; }
    memcpy(r->n_prompt, n_prompt, (size_t)n_prompts * sizeof *n_prompt);
    return 0;
}

void oai_resp_deinit(struct oai_resp *r) {
    for (int i = 0; r->choices && i < r->n_choices; i++) {
        sb_free(&r->choices[i].text);
        json_object_put(r->choices[i].lp);
        if (r->choices[i].tc) toolcall_stream_deinit(r->choices[i].tc);
        free(r->choices[i].tc);
    }
    free(r->choices);
    toolcall_decls_free(r->tools, r->n_tools);
    free(r->n_prompt);
    free(r->n_cached);
    for (int k = 0; r->echo && k < r->n_prompts; k++) free(r->echo[k]);
    free(r->echo);
    free(r->n_echo);
    memset(r, 0, sizeof *r);
}

int oai_resp_set_echo(struct oai_resp *r, int k, const char *text, size_t len) {
    if (!r->echo) {
        r->echo = calloc((size_t)r->n_prompts, sizeof *r->echo);
        r->n_echo = calloc((size_t)r->n_prompts, sizeof *r->n_echo);
        if (!r->echo || !r->n_echo) return KVLLM_ENOMEM;
    }
    if (!(r->echo[k] = malloc(len + 1))) return KVLLM_ENOMEM;
    memcpy(r->echo[k], text, len);
    r->echo[k][len] = 0;
    r->n_echo[k] = len;
    for (int i = 0; i < r->n; i++) {   /* a whole response: the text starts with it */
        struct oai_choice *ch = &r->choices[k * r->n + i];
        sb_put(&ch->text, text, len);
        ch->n_text = len;
    }
    return 0;
}

static const char *finish_name(enum kvllm_finish f) {
    switch (f) {
    case KVLLM_FINISH_STOP: return "stop";
    case KVLLM_FINISH_LENGTH: return "length";
    case KVLLM_FINISH_ABORT: return "abort";
    default: return NULL;
    }
}

const char *oai_finish_name(enum kvllm_finish f) { return finish_name(f); }

/* ---- tool calls ---- */

int oai_resp_set_tools(struct oai_resp *r, enum toolcall_format f, const char *prefill, bool single, uint64_t id_seed,
                       const char *tools) {
    r->tool_format = f;
    r->tool_prefill = prefill && *prefill ? prefill : NULL;
    r->tool_single = single;
    r->tool_ids = id_seed;
    if (!r->chat || f == TOOLCALL_NONE) return 0;
    if (toolcall_declared(tools, &r->tools, &r->n_tools)) return KVLLM_ENOMEM;
    for (int c = 0; c < r->n_choices; c++) {
        if (!(r->choices[c].tc = malloc(sizeof *r->choices[c].tc))) return KVLLM_ENOMEM;
        toolcall_stream_init(r->choices[c].tc, f);
        r->choices[c].tc->decls = r->tools;
        r->choices[c].tc->n_decls = r->n_tools;
        if (r->tool_prefill) {   /* an opening is held, never shown */
            struct strbuf shown = { 0 };
            toolcall_stream_push(r->choices[c].tc, r->tool_prefill, strlen(r->tool_prefill), &shown);
            sb_free(&shown);
        }
    }
    return 0;
}

/* The calls of one choice's whole text (prefill first); 0 or KVLLM_ENOMEM. */
static int parse_calls(struct oai_resp *r, const struct oai_choice *ch, struct toolcall_result *res) {
    struct strbuf all = { 0 };
    if (r->tool_prefill) sb_puts(&all, r->tool_prefill);
    sb_put(&all, ch->text.s ? ch->text.s : "", ch->text.len);
    int rc = all.oom ? KVLLM_ENOMEM : toolcall_parse(r->tool_format, all.s ? all.s : "", all.len, res);
    sb_free(&all);
    if (!rc) rc = toolcall_only_declared(res, r->tools, r->n_tools, ch->text.s ? ch->text.s : "", ch->text.len);
    return rc;
}

/* parallel_tool_calls false: the first call only. */
static void limit_calls(const struct oai_resp *r, struct toolcall_result *res) {
    while (r->tool_single && res->n_calls > 1) {
        struct toolcall *c = &res->calls[--res->n_calls];
        free(c->name);
        free(c->arguments);
    }
}

/* A choice that made calls finished for them (unless it failed). */
static const char *tools_finish(enum kvllm_finish f, int n_calls) {
    if (n_calls && (f == KVLLM_FINISH_STOP || f == KVLLM_FINISH_LENGTH)) return "tool_calls";
    return finish_name(f);
}

/* {"index", "id", "type": "function", "function": {"name", "arguments"}}:
 * the whole call (id NULL: an arguments-only stream delta). */
static json_object *call_json(int index, const char *id, const char *name, const char *args) {
    json_object *o = json_object_new_object(), *fn = json_object_new_object();
    if (index >= 0) json_object_object_add(o, "index", json_object_new_int(index));
    if (id) {
        json_object_object_add(o, "id", json_object_new_string(id));
        json_object_object_add(o, "type", json_object_new_string("function"));
    }
    if (name) json_object_object_add(fn, "name", json_object_new_string(name));
    json_object_object_add(fn, "arguments", json_object_new_string(args));
    json_object_object_add(o, "function", fn);
    return o;
}

/* Non-streaming: message.content (null when only calls) and message.tool_calls. */
static int tools_message(struct oai_resp *r, struct oai_choice *ch, json_object *m, const char **fin) {
    struct toolcall_result res;
    if (parse_calls(r, ch, &res)) return KVLLM_ENOMEM;
    limit_calls(r, &res);
    json_object_object_add(m, "content", res.content ? json_object_new_string(res.content) : NULL);
    if (res.n_calls) {
        json_object *a = json_object_new_array();
        for (int k = 0; k < res.n_calls; k++) {
            char id[32];
            toolcall_make_id(r->tool_format, &r->tool_ids, id);
            json_object_array_add(a, call_json(-1, id, res.calls[k].name, res.calls[k].arguments));
        }
        json_object_object_add(m, "tool_calls", a);
    }
    *fin = tools_finish(ch->finish, res.n_calls);
    toolcall_result_free(&res);
    return 0;
}

/* ---- llama-server's /completion shape ---- */

/* probs: the positions' completion_probabilities (a reference is taken; NULL: none). */
static json_object *llama_final(const struct oai_resp *r, const struct oai_choice *ch, const char *text, size_t len,
                                json_object *probs) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "index", json_object_new_int(0));
    json_object_object_add(o, "content", json_object_new_string_len(text, (int)len));
    json_object_object_add(o, "id_slot", json_object_new_int(0));
    json_object_object_add(o, "stop", json_object_new_boolean(1));
    json_object_object_add(o, "model", json_object_new_string(r->model_id));
    json_object_object_add(o, "tokens_predicted", json_object_new_int(ch->n_generated));
    json_object_object_add(o, "tokens_evaluated", json_object_new_int(r->n_prompt[0]));
    json_object_object_add(o, "tokens_cached", json_object_new_int(r->n_cached[0]));
    /* the engine does not tell an end-of-sequence token from a stop string */
    json_object_object_add(o, "stop_type", json_object_new_string(ch->finish == KVLLM_FINISH_LENGTH ? "limit" : "eos"));
    json_object_object_add(o, "stopping_word", json_object_new_string(""));
    json_object_object_add(o, "truncated", json_object_new_boolean(0));
    if (probs) json_object_object_add(o, "completion_probabilities", json_object_get(probs));
    return o;
}

static json_object *lp_number(float x) {
    /* -inf (a masked logit) is not JSON: report it as vLLM does */
    return json_object_new_double(isfinite(x) ? (double)x : -9999.0);
}

/* A token's text as a JSON string (ill-formed UTF-8 of a partial byte token
 * becomes U+FFFD) and, for chat, its raw bytes. */
static void token_json(const struct oai_resp *r, int32_t id, json_object **text, json_object **bytes) {
    char buf[1024];
    int n = kvllm_token_to_bytes(r->model, id, buf, sizeof buf);
    if (n < 0) n = 0;
    struct strbuf b = { 0 };
    utf8_sanitize(&b, buf, (size_t)n);
    *text = json_object_new_string_len(b.s ? b.s : "", (int)b.len);
    sb_free(&b);
    if (bytes) {
        *bytes = json_object_new_array_ext(n > 0 ? n : 1);
        for (int i = 0; i < n; i++) json_object_array_add(*bytes, json_object_new_int((unsigned char)buf[i]));
    }
}

/* Chat: one {"token", "logprob", "bytes", "top_logprobs"} entry; llama-server's
 * completion_probabilities (r->llama) give each token's "id" too. */
static json_object *chat_lp_entry(const struct oai_resp *r, const struct job_event *e) {
    json_object *o = json_object_new_object(), *t, *b, *top = json_object_new_array();
    token_json(r, e->token, &t, &b);
    if (r->llama) json_object_object_add(o, "id", json_object_new_int(e->token));
    json_object_object_add(o, "token", t);
    json_object_object_add(o, "logprob", lp_number(e->logprob));
    json_object_object_add(o, "bytes", b);
    for (int i = 0; i < e->n_top && i < r->logprobs; i++) {
        json_object *a = json_object_new_object();
        token_json(r, e->top_id[i], &t, &b);
        if (r->llama) json_object_object_add(a, "id", json_object_new_int(e->top_id[i]));
        json_object_object_add(a, "token", t);
        json_object_object_add(a, "logprob", lp_number(e->top_lp[i]));
        json_object_object_add(a, "bytes", b);
        json_object_array_add(top, a);
    }
    json_object_object_add(o, "top_logprobs", top);
    return o;
}

/* Completions: append one position to {"tokens", "token_logprobs",
 * "top_logprobs", "text_offset"} (created when lp is NULL). */
static json_object *completion_lp_add(const struct oai_resp *r, json_object *lp, const struct job_event *e,
                                      size_t offset) {
    if (!lp) {
        lp = json_object_new_object();
        json_object_object_add(lp, "tokens", json_object_new_array());
        json_object_object_add(lp, "token_logprobs", json_object_new_array());
        json_object_object_add(lp, "top_logprobs", json_object_new_array());
        json_object_object_add(lp, "text_offset", json_object_new_array());
    }
    json_object *t, *top = json_object_new_object();
    token_json(r, e->token, &t, NULL);
    json_object_array_add(json_object_object_get(lp, "tokens"), t);
    json_object_array_add(json_object_object_get(lp, "token_logprobs"), lp_number(e->logprob));
    for (int i = 0; i < e->n_top && i < r->logprobs; i++) {
        token_json(r, e->top_id[i], &t, NULL);
        /* two tokens may spell the same text: the better one (first) stays */
        if (!json_object_object_get_ex(top, json_object_get_string(t), NULL))
            json_object_object_add(top, json_object_get_string(t), lp_number(e->top_lp[i]));
        json_object_put(t);
    }
    json_object_array_add(json_object_object_get(lp, "top_logprobs"), top);
    json_object_array_add(json_object_object_get(lp, "text_offset"), json_object_new_int64((int64_t)offset));
    return lp;
}

/* State shared by both modes: counts, finish, usage. */
static void note_event(struct oai_resp *r, const struct job_event *e) {
    struct oai_choice *ch = &r->choices[e->choice];
    int p = e->choice / r->n;
    ch->n_text += e->len;
    ch->n_generated = e->n_generated;
    if (e->n_cached > r->n_cached[p]) r->n_cached[p] = e->n_cached;
    if (e->finish != KVLLM_FINISH_NONE && ch->finish == KVLLM_FINISH_NONE) {
        ch->finish = e->finish;
        r->n_done++;
    }
}

void oai_resp_add(struct oai_resp *r, const struct job_event *e) {
    struct oai_choice *ch = &r->choices[e->choice];
    if (r->logprobs >= 0 && e->token >= 0) {
        if (r->chat || r->llama) {
            if (!ch->lp) ch->lp = json_object_new_array();
            json_object_array_add(ch->lp, chat_lp_entry(r, e));
        } else {
            ch->lp = completion_lp_add(r, ch->lp, e, ch->n_text);
        }
    }
    sb_put(&ch->text, e->text, e->len);
    note_event(r, e);
}

static json_object *usage_json(const struct oai_resp *r) {
    long long prompt = 0, cached = 0, gen = 0;
    for (int p = 0; p < r->n_prompts; p++) { prompt += r->n_prompt[p]; cached += r->n_cached[p]; }
    for (int c = 0; c < r->n_choices; c++) gen += r->choices[c].n_generated;
    json_object *u = json_object_new_object(), *d = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int64(prompt));
    json_object_object_add(u, "completion_tokens", json_object_new_int64(gen));
    json_object_object_add(u, "total_tokens", json_object_new_int64(prompt + gen));
    json_object_object_add(d, "cached_tokens", json_object_new_int64(cached));
    json_object_object_add(u, "prompt_tokens_details", d);
    return u;
}

static json_object *envelope(const struct oai_resp *r, const char *object) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(r->id));
    json_object_object_add(o, "object", json_object_new_string(object));
    json_object_object_add(o, "created", json_object_new_int64(r->created));
    json_object_object_add(o, "model", json_object_new_string(r->model_id));
    return o;
}

char *oai_resp_json(struct oai_resp *r) {
    if (r->llama) {
        const struct oai_choice *ch = &r->choices[0];
        json_object *probs = r->logprobs >= 0 && !ch->lp ? json_object_new_array() : NULL;
        char *s = to_string(llama_final(r, ch, ch->text.s ? ch->text.s : "", ch->text.len, probs ? probs : ch->lp));
        json_object_put(probs);
        return s;
    }
    json_object *o = envelope(r, r->chat ? "chat.completion" : "text_completion"), *cs = json_object_new_array();
    for (int c = 0; c < r->n_choices; c++) {
        struct oai_choice *ch = &r->choices[c];
        json_object *x = json_object_new_object();
        json_object *text = json_object_new_string_len(ch->text.s ? ch->text.s : "", (int)ch->text.len);
        json_object_object_add(x, "index", json_object_new_int(c));
        const char *fin = finish_name(ch->finish);
        if (r->chat) {
            json_object *m = json_object_new_object();
            json_object_object_add(m, "role", json_object_new_string("assistant"));
            if (r->tool_format != TOOLCALL_NONE) {
                json_object_put(text);
                if (tools_message(r, ch, m, &fin)) {
                    json_object_put(m);
                    json_object_put(x);
                    json_object_put(cs);
                    json_object_put(o);
                    return NULL;
                }
            } else {
                json_object_object_add(m, "content", text);
            }
            json_object_object_add(x, "message", m);
            json_object *lp = NULL;
            if (r->logprobs >= 0) {
                lp = json_object_new_object();
                json_object_object_add(lp, "content", ch->lp ? ch->lp : json_object_new_array());
                ch->lp = NULL;
            }
            json_object_object_add(x, "logprobs", lp);
        } else {
            json_object_object_add(x, "text", text);
            json_object_object_add(x, "logprobs", ch->lp);
            ch->lp = NULL;
        }
        json_object_object_add(x, "finish_reason", fin ? json_object_new_string(fin) : NULL);
        json_object_array_add(cs, x);
    }
    json_object_object_add(o, "choices", cs);
    json_object_object_add(o, "usage", usage_json(r));
    return to_string(o);
}

/* "data: {json}\n\n" */
static void sse(struct strbuf *out, json_object *o) {
    const char *s = json_object_to_json_string_ext(o, JSON_FLAGS);
    if (!s) { out->oom = true; json_object_put(o); return; }
    sb_puts(out, "data: ");
    sb_puts(out, s);
    sb_puts(out, "\n\n");
    json_object_put(o);
}

static json_object *chunk_named(const struct oai_resp *r, int c, json_object *delta_or_text, json_object *lp,
                                const char *finish) {
    json_object *o = envelope(r, r->chat ? "chat.completion.chunk" : "text_completion");
    json_object *cs = json_object_new_array(), *x = json_object_new_object();
    json_object_object_add(x, "index", json_object_new_int(c));
    json_object_object_add(x, r->chat ? "delta" : "text", delta_or_text);
    json_object_object_add(x, "logprobs", lp);
    json_object_object_add(x, "finish_reason", finish ? json_object_new_string(finish) : NULL);
    json_object_array_add(cs, x);
    json_object_object_add(o, "choices", cs);
    return o;
}

static json_object *chunk(const struct oai_resp *r, int c, json_object *delta_or_text, json_object *lp,
                          enum kvllm_finish f) {
    return chunk_named(r, c, delta_or_text, lp, finish_name(f));
}

/* Streaming chat with tools: content as the call parser lets it out, and at
 * the end each call as OpenAI streams one (a delta with index, id, type and
 * name and empty arguments, then the arguments), then a last chunk with
 * finish_reason "tool_calls". */
static void stream_event_tools(struct oai_resp *r, const struct job_event *e, json_object *lp, struct strbuf *out) {
    struct oai_choice *ch = &r->choices[e->choice];
    struct strbuf shown = { 0 };
    struct toolcall_result res = { 0 };
    const bool fin = e->finish != KVLLM_FINISH_NONE;
    toolcall_stream_push(ch->tc, e->text, e->len, &shown);
    if (fin && toolcall_stream_finish(ch->tc, &shown, &res)) out->oom = true;
    limit_calls(r, &res);
    if (shown.len || lp) {
        json_object *d = json_object_new_object();
        json_object_object_add(d, "content", json_object_new_string_len(shown.s ? shown.s : "", (int)shown.len));
        sse(out, chunk(r, e->choice, d, lp, KVLLM_FINISH_NONE));
    }
    sb_free(&shown);
    if (!fin) return;
    for (int k = 0; k < res.n_calls; k++) {
        char id[32];
        toolcall_make_id(r->tool_format, &r->tool_ids, id);
        for (int part = 0; part < 2; part++) {
            json_object *d = json_object_new_object(), *a = json_object_new_array();
            json_object_array_add(a, part ? call_json(k, NULL, NULL, res.calls[k].arguments)
                                          : call_json(k, id, res.calls[k].name, ""));
            json_object_object_add(d, "tool_calls", a);
            sse(out, chunk(r, e->choice, d, NULL, KVLLM_FINISH_NONE));
        }
    }
    sse(out, chunk_named(r, e->choice, json_object_new_object(), NULL, tools_finish(e->finish, res.n_calls)));
    toolcall_result_free(&res);
}

void oai_stream_event(struct oai_resp *r, const struct job_event *e, struct strbuf *out) {
    struct oai_choice *ch = &r->choices[e->choice];
    if (r->llama) {   /* {"content", "stop": false} per piece (and per token with n_probs), then the whole
                       * summary with "stop": true */
        const bool has_lp = r->logprobs >= 0 && e->token >= 0;
        if (e->len || has_lp) {
            json_object *o = json_object_new_object();
            json_object_object_add(o, "index", json_object_new_int(0));
            json_object_object_add(o, "content", json_object_new_string_len(e->text, (int)e->len));
            json_object_object_add(o, "stop", json_object_new_boolean(0));
            json_object_object_add(o, "id_slot", json_object_new_int(0));
            json_object_object_add(o, "tokens_predicted", json_object_new_int(e->n_generated));
            if (has_lp) {
                json_object *a = json_object_new_array();
                json_object_array_add(a, chat_lp_entry(r, e));
                json_object_object_add(o, "completion_probabilities", a);
            }
            sse(out, o);
        }
        note_event(r, e);
        if (e->finish != KVLLM_FINISH_NONE) sse(out, llama_final(r, ch, "", 0, NULL));
        return;
    }
    if (!r->chat && !ch->started && r->echo && r->echo[e->choice / r->n]) {
        /* completions' echo: the prompt's text comes first, in a chunk of its own */
        const int k = e->choice / r->n;
        sse(out, chunk(r, e->choice, json_object_new_string_len(r->echo[k], (int)r->n_echo[k]), NULL,
                       KVLLM_FINISH_NONE));
        ch->started = true;
    }
    if (r->chat && !ch->started) {
        /* OpenAI opens every chat choice with the role */
        json_object *d = json_object_new_object();
        json_object_object_add(d, "role", json_object_new_string("assistant"));
        json_object_object_add(d, "content", json_object_new_string(""));
        sse(out, chunk(r, e->choice, d, NULL, KVLLM_FINISH_NONE));
        ch->started = true;
    }
    bool has_lp = r->logprobs >= 0 && e->token >= 0;
    if (r->chat && ch->tc) {
        json_object *lp = NULL;
        if (has_lp) {
            lp = json_object_new_object();
            json_object *a = json_object_new_array();
            json_object_array_add(a, chat_lp_entry(r, e));
            json_object_object_add(lp, "content", a);
        }
        stream_event_tools(r, e, lp, out);
        note_event(r, e);
        return;
    }
    /* a token whose text is withheld (a possible stop string, half a
     * character) makes no chunk unless its log-probability was asked for */
    if (e->len || has_lp || e->finish != KVLLM_FINISH_NONE) {
        json_object *lp = NULL;
        if (has_lp && r->chat) {
            lp = json_object_new_object();
            json_object *a = json_object_new_array();
            json_object_array_add(a, chat_lp_entry(r, e));
            json_object_object_add(lp, "content", a);
        } else if (has_lp) {
            lp = completion_lp_add(r, NULL, e, ch->n_text);
        }
        json_object *body;
        if (r->chat) {
            body = json_object_new_object();
            if (e->len || e->finish == KVLLM_FINISH_NONE)
                json_object_object_add(body, "content", json_object_new_string_len(e->text, (int)e->len));
        } else {
            body = json_object_new_string_len(e->text, (int)e->len);
        }
        sse(out, chunk(r, e->choice, body, lp, e->finish));
    }
    note_event(r, e);
}

void oai_stream_error(const struct oai_error *e, struct strbuf *out) {
    char *body = oai_error_json(e);
    if (!body) { out->oom = true; return; }
    sb_puts(out, "data: ");
    sb_puts(out, body);
    sb_puts(out, "\n\ndata: [DONE]\n\n");
    free(body);
}

void oai_stream_end(struct oai_resp *r, bool include_usage, struct strbuf *out) {
    if (r->llama) { sb_put(out, "", 0); return; }
    if (include_usage) {
        json_object *o = envelope(r, r->chat ? "chat.completion.chunk" : "text_completion");
        json_object_object_add(o, "choices", json_object_new_array());
        json_object_object_add(o, "usage", usage_json(r));
        sse(out, o);
    }
    sb_puts(out, "data: [DONE]\n\n");
}
