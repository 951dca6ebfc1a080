/* toolcall.h — tool calls out of generated text: pure text -> (content,
 * calls), for the formats chat templates teach their models, and the same
 * thing incrementally for streams.  No engine here: text in, JSON out
 * (json-c).
 *
 * Model of the world: a template tells the model how to call a function,
 * and the model writes calls as text in that format:
 *   HERMES   (Hermes 2 Pro, Qwen2.5, Qwen3)  <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
 *            one block per call, text may come before; a missing closing tag
 *            at the very end is tolerated (generation stopped on EOS)
 *   LLAMA3   (Llama 3.1 / 3.2 JSON tool calling)  the whole answer is
 *            [<|python_tag|>]{"name": ..., "parameters": {...}}, several calls
 *            separated by ';'
 *   MISTRAL  (Mistral Nemo)  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
 *            text may come before; [TOOL_CALLS] is a control token, which
 *            detokenizes to nothing, so an answer that is only the array counts
 * A call is a JSON object with a string "name" and an "arguments" or
 * "parameters" value that is an object (or a string holding one).  Whatever
 * does not parse as such a call is text: a malformed call comes back in the
 * content, never dropped.  An answer without calls is all content, as it
 * is.  With calls, the content is the text before the first call less its
 * trailing whitespace, then (on a new line) the text after it, stripped;
 * NULL when that leaves nothing.
 *
 * Streaming holds text back from the first place a call may start (as stop
 * strings are held) and shows the calls when the output ends, so a stream
 * and a whole response of the same text give the same content and calls. */
#ifndef KVLLM_SERVER_TOOLCALL_H
#define KVLLM_SERVER_TOOLCALL_H

#include "core/strbuf.h"

#include <stdbool.h>
struct json_object;
#include <stddef.h>
#include <stdint.h>

enum toolcall_format { TOOLCALL_NONE, TOOLCALL_HERMES, TOOLCALL_LLAMA3, TOOLCALL_MISTRAL };

/* "hermes", "llama3", "mistral" ("none" for TOOLCALL_NONE). */
const char *toolcall_format_name(enum toolcall_format f);
/* The format named (as toolcall_format_name spells it); -1 for an unknown name. */
int toolcall_format_from_name(const char *name);
/* The format a chat template teaches, from its text: "[TOOL_CALLS]" is
 * Mistral, "<tool_call>" Hermes, "<|python_tag|>" or "\"parameters\"" Llama 3
 * (checked in that order: Hermes 2 Pro's template also names "parameters");
 * TOOLCALL_NONE when none is found (or tmpl is NULL). */
enum toolcall_format toolcall_detect(const char *tmpl);

struct toolcall {
    char *name;          /* malloc'd */
    char *arguments;     /* malloc'd: a JSON object, compact */
};

struct toolcall_result {
    char *content;       /* malloc'd; NULL: no text outside the calls */
    struct toolcall *calls;   /* (n_calls) malloc'd; NULL when none */
    int n_calls;
};

/* Split text[0, len) (UTF-8) into content and calls by format f
 * (TOOLCALL_NONE: all text).  Returns 0, or KVLLM_ENOMEM with *out empty. */
int toolcall_parse(enum toolcall_format f, const char *text, size_t len, struct toolcall_result *out);
void toolcall_result_free(struct toolcall_result *r);

/* A function offered in `tools`: its name and its parameters' JSON Schema. */
struct toolcall_decl {
    char *name;                  /* malloc'd */
    struct json_object *params;  /* own reference; NULL: none declared (not checked) */
};
/* The functions of an OpenAI `tools` array (JSON text), malloc'd (*n of
 * them, none for text that is not such an array).  0 or KVLLM_ENOMEM. */
int toolcall_declared(const char *tools, struct toolcall_decl **decls, int *n);
void toolcall_decls_free(struct toolcall_decl *decls, int n);
/* A call of a function that was not offered, or whose arguments break that
 * function's parameters schema (schema_check.h: under tool_choice auto no
 * grammar held the model to it), is not a call: r becomes text[0, len) as
 * content, without calls.  A model that invents a function or its
 * arguments answered in text, and a client must never be asked to run a
 * tool it did not offer, or with arguments it declared impossible.  0 or
 * KVLLM_ENOMEM. */
int toolcall_only_declared(struct toolcall_result *r, const struct toolcall_decl *decls, int n_decls, const char *text,
                           size_t len);

/* Streaming: text arrives in pieces; toolcall_stream_push appends to
 * `shown` the text that can be shown now, toolcall_stream_finish (at the
 * end of the output) the rest of the content and the calls.  The content
 * shown over a whole stream equals toolcall_parse's (with "" for NULL). */
struct toolcall_stream {
    enum toolcall_format f;
    struct strbuf text;  /* everything so far */
    size_t n_shown;      /* bytes of text already shown as content */
    bool held;           /* a call may have started: hold the rest until the end */
    const struct toolcall_decl *decls;  /* NULL, or the functions offered (n_decls; not owned): toolcall_only_declared */
    int n_decls;
};

void toolcall_stream_init(struct toolcall_stream *s, enum toolcall_format f);
void toolcall_stream_deinit(struct toolcall_stream *s);
void toolcall_stream_push(struct toolcall_stream *s, const char *text, size_t len, struct strbuf *shown);
/* Returns 0 or KVLLM_ENOMEM (also when an earlier push ran out). */
int toolcall_stream_finish(struct toolcall_stream *s, struct strbuf *shown, struct toolcall_result *out);

/* A call id: "call_" + 24 letters and digits, or, for Mistral (whose
 * template requires it), 9 letters and digits; from the 64-bit *state,
 * which is advanced.  out: at least 32 bytes. */
void toolcall_make_id(enum toolcall_format f, uint64_t *state, char *out);

#endif
