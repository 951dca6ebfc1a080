/* chat_template.h — render a model's chat template the way Hugging Face
 * Transformers does (Jinja2 with trim_blocks and lstrip_blocks, the
 * globals raise_exception and strftime_now, Transformers' tojson), with
 * the interpreter in jinja_*.c.  Depends on core only. */
#ifndef KVLLM_TOK_CHAT_TEMPLATE_H
#define KVLLM_TOK_CHAT_TEMPLATE_H

#include "kvllm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct chat_template_params {
    const struct kvllm_chat_message *msgs;  /* role and content (content NULL: None) */
    int n_msgs;
    bool add_generation_prompt;
    const char *bos_token, *eos_token;      /* NULL: "" */
    /* The tool definitions, a JSON array text (OpenAI's request `tools`:
     * [{"type": "function", "function": {...}}]), as the variable `tools`;
     * NULL: `tools` is undefined. */
    const char *tools;
    /* The date strftime_now() sees, "YYYY-MM-DD" (midnight).  NULL: the
     * KVLLM_TEMPLATE_NOW environment variable if set, else the local time. */
    const char *now;
    /* Budgets of the render (0: the defaults, 2,000,000 steps and 8 MiB):
     * a step is an expression or statement evaluated, a loop iteration, a
     * list item made or an item a builtin scans.  Exceeding one fails the
     * render with KVLLM_ERANGE and a message naming the budget. */
    uint64_t max_steps;
    size_t max_output;
};

/* Render tmpl (len bytes, UTF-8) with the variables messages (a list of
 * {"role", "content"} dicts, plus "name", "tool_calls" and "tool_call_id"
 * where a message has them), add_generation_prompt, bos_token, eos_token
 * and tools (when given); documents and everything else are undefined.
 * Strings that came as JSON (tools, tool_calls) count as message text.
 * On success *out is a malloc'd NUL-terminated string (free()) and
 * *out_len (may be NULL) its length.  On error *out is NULL and one line
 * is logged, "chat template LINE:COL: message", with the position in the
 * template: KVLLM_EINVAL for a malformed template, a Jinja runtime error
 * or raise_exception() (whose message is quoted), KVLLM_EUNSUPPORTED for a
 * construct this interpreter lacks, KVLLM_ERANGE past the step or output
 * budget, KVLLM_ENOMEM past 256 MiB. */
int chat_template_render(const char *tmpl, size_t len, const struct chat_template_params *p,
                         char **out, size_t *out_len);

/* The chat template of a model family whose files may come without one
 * (tokenizer.chat_template): the family's official template, by GGUF
 * general.architecture (arch[0, len)), as a static NUL-terminated string;
 * NULL when kvllm knows none for that architecture. */
const char *chat_template_builtin(const char *arch, size_t len);

/* Bytes [off, off + len) of a rendering that came from message text. */
struct chat_span {
    size_t off, len;
};

/* chat_template_render, and where the message text (every role and
 * content string, and whatever the template computed from them: see the
 * taint rule in jinja.h) landed in the output: *spans (malloc'd, free();
 * NULL when *n_spans is 0) sorted and disjoint.  Every other byte was
 * written by the template itself (its text, literals, bos/eos tokens).
 * spans may be NULL when they are not wanted.  Errors as
 * chat_template_render, with *spans NULL and *n_spans 0. */
int chat_template_render_spans(const char *tmpl, size_t len, const struct chat_template_params *p,
                               char **out, size_t *out_len, struct chat_span **spans, size_t *n_spans);

#endif
