/* chat_template.h — render a model's chat template the way Hugging Face
 * Transformers does (Jinja2 with trim_blocks and lstrip_blocks, the
 * globals raise_exception and strftime_now, Transformers' tojson), with
 * the interpreter in jinja_*.c.  Depends on core only. */
#ifndef KVLLM_TOK_CHAT_TEMPLATE_H
#define KVLLM_TOK_CHAT_TEMPLATE_H

#include "kvllm.h"

#include <stdbool.h>
#include <stddef.h>

struct chat_template_params {
    const struct kvllm_chat_message *msgs;  /* role and content (content NULL: None) */
    int n_msgs;
    bool add_generation_prompt;
    const char *bos_token, *eos_token;      /* NULL: "" */
    /* The date strftime_now() sees, "YYYY-MM-DD" (midnight).  NULL: the
     * KVLLM_TEMPLATE_NOW environment variable if set, else the local time. */
    const char *now;
};

/* Render tmpl (len bytes, UTF-8) with the variables messages (a list of
 * {"role", "content"} dicts), add_generation_prompt, bos_token and
 * eos_token; tools, documents and everything else are undefined.
 * On success *out is a malloc'd NUL-terminated string (free()) and
 * *out_len (may be NULL) its length.  On error *out is NULL and one line
 * is logged, "chat template LINE:COL: message", with the position in the
 * template: KVLLM_EINVAL for a malformed template, a Jinja runtime error
 * or raise_exception() (whose message is quoted), KVLLM_EUNSUPPORTED for a
 * construct this interpreter lacks, KVLLM_ENOMEM past 256 MiB. */
int chat_template_render(const char *tmpl, size_t len, const struct chat_template_params *p,
                         char **out, size_t *out_len);

#endif
