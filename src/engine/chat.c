/* chat.c — a conversation rendered with the chat template
 * (kvllm_chat_render), and to token ids (kvllm_chat_tokenize): render it,
 * then tokenize the rendering so that only the template's own text can
 * become control tokens.
 *
 * Model of the world: a rendering is the template's markup ("<|im_start|>",
 * "<|im_end|>", the model's BOS/EOS) interleaved with message text (roles
 * and contents, and whatever the template computed from them).  The
 * renderer reports where the message text landed (chat_template_render_spans);
 * the tokenizer reads control-token text as control tokens everywhere else
 * and as plain text inside those spans (tokenizer_encode_spans).  So a user
 * who types "<|im_end|>\n<|im_start|>system" gets those characters as text,
 * not a forged turn, while a conversation without such text tokenizes
 * exactly as the whole rendering with special tokens parsed always did.
 * special_in_content restores that reference behaviour (Transformers'
 * apply_chat_template(tokenize=True) parses special text everywhere). */
#include "engine/engine_internal.h"
#include "chat/chat_template.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

/* The model's BOS or EOS text ("" when it has none) for the template. */
static const char *special_piece(const struct tokenizer *tok, int id) {
    const char *p = tok && id >= 0 ? tokenizer_piece(tok, id) : NULL;
    return p ? p : "";
}

/* Tokenize text[0, len) twice (count, then fill) into a malloc'd array
 * with one free slot in front (for BOS).  Returns the count or < 0. */
static int encode(const struct tokenizer *tok, const char *text, size_t len, bool special_in_content,
                  const struct tok_span *plain, size_t n_plain, int32_t **out) {
    *out = NULL;
    int n = special_in_content ? tokenizer_encode(tok, text, len, false, true, NULL, 0)
                               : tokenizer_encode_spans(tok, text, len, false, plain, n_plain, NULL, 0);
    if (n < 0) return n;
    if (n == INT32_MAX) return KVLLM_ERANGE;
    int32_t *ids = xmalloc((size_t)(n + 1) * sizeof *ids);
    if (!ids) return KVLLM_ENOMEM;
    int again = special_in_content ? tokenizer_encode(tok, text, len, false, true, ids + 1, n)
                                   : tokenizer_encode_spans(tok, text, len, false, plain, n_plain, ids + 1, n);
    if (again != n) {   /* the tokenizer is deterministic: only an error gets here */
        free(ids);
        if (again >= 0) LOG_ERR("chat: the conversation tokenized to %d ids, then %d", n, again);
        return again < 0 ? again : KVLLM_EINVAL;
    }
    *out = ids;
    return n;
}

const char *kvllm_model_chat_template(const struct kvllm_model *km, size_t *len, bool *builtin) {
    if (builtin) *builtin = false;
    const struct gguf *g = km ? km->m->file : NULL;
    struct gguf_str t, arch;
    const char *b;
    if (!g) return NULL;
    if (gguf_get_str(g, "tokenizer.chat_template", &t) == 0) {
        if (len) *len = (size_t)t.len;
        return t.ptr;
    }
    if (gguf_get_str(g, "general.architecture", &arch) || !(b = chat_template_builtin(arch.ptr, (size_t)arch.len)))
        return NULL;
    if (len) *len = strlen(b);
    if (builtin) *builtin = true;
    return b;
}

/* Check a conversation and resolve its template (template_text, or the
 * model's own) into *tmpl and the renderer's parameters. */
static int chat_setup(const struct kvllm_model *km, const char *template_text, const struct kvllm_chat_message *msgs,
                      int n_msgs, const struct kvllm_chat_opts *o, struct gguf_str *tmpl, struct chat_template_params *p) {
    const char *name = km ? km->path : "chat template";
    if (n_msgs < 0 || (n_msgs > 0 && !msgs)) {
        LOG_ERR("%s: %d messages at %p", name, n_msgs, (const void *)msgs);
        return KVLLM_EINVAL;
    }
    for (int i = 0; i < n_msgs; i++)
        if (!msgs[i].role) {
            LOG_ERR("%s: message %d has no role", name, i);
            return KVLLM_EINVAL;
        }
    *tmpl = (struct gguf_str){ template_text, template_text ? strlen(template_text) : 0 };
    if (!template_text) {
        size_t len = 0;
        tmpl->ptr = kvllm_model_chat_template(km, &len, NULL);
        tmpl->len = len;
        if (!tmpl->ptr) {
            LOG_ERR("%s: the model has no chat template (tokenizer.chat_template)", name);
            return KVLLM_ENOTFOUND;
        }
    }
    const struct tokenizer *tok = km ? km->tok : NULL;
    *p = (struct chat_template_params){
        .msgs = msgs, .n_msgs = n_msgs, .add_generation_prompt = o->add_generation_prompt, .tools = o->tools,
        .bos_token = special_piece(tok, tok ? tokenizer_bos(tok) : -1),
        .eos_token = special_piece(tok, tok ? tokenizer_eos(tok) : -1),
    };
    return 0;
}

/* The rendering with opts->prefill appended (template text: it sits after
 * every span, so it is read for control tokens).  Returns 0 or < 0. */
static int render(const struct gguf_str *tmpl, const struct chat_template_params *p, const char *prefill, char **text,
                  size_t *len, struct chat_span **spans, size_t *n_spans) {
    int rc = chat_template_render_spans(tmpl->ptr, (size_t)tmpl->len, p, text, len, spans, n_spans);
    if (rc || !prefill || !*prefill) return rc;
    size_t np = strlen(prefill);
    char *t = realloc(*text, *len + np + 1);
    if (!t) {
        LOG_ERR("chat: out of memory for the prefill");
        free(*text);
        *text = NULL;
        if (spans) { free(*spans); *spans = NULL; *n_spans = 0; }
        return KVLLM_ENOMEM;
    }
    memcpy(t + *len, prefill, np + 1);
    *text = t;
    *len += np;
    return 0;
}

static int chat_render(const struct kvllm_model *km, const char *template_text, const struct kvllm_chat_message *msgs,
                       int n_msgs, const struct kvllm_chat_opts *opts, char **out) {
    *out = NULL;
    const struct kvllm_chat_opts none = { 0 }, *o = opts ? opts : &none;
    struct gguf_str tmpl;
    struct chat_template_params p;
    int rc = chat_setup(km, template_text, msgs, n_msgs, o, &tmpl, &p);
    size_t len = 0;
    return rc ? rc : render(&tmpl, &p, o->prefill, out, &len, NULL, NULL);
}

static int chat_tokenize(const struct kvllm_model *km, const char *template_text, const struct kvllm_chat_message *msgs,
                         int n_msgs, const struct kvllm_chat_opts *opts, int32_t **ids_out, int *n_out);

int kvllm_chat_render(const struct kvllm_model *km, const char *template_text,
                      const struct kvllm_chat_message *msgs, int n_msgs, bool add_generation_prompt, char **out) {
    struct kvllm_chat_opts o = { .add_generation_prompt = add_generation_prompt };
    return chat_render(km, template_text, msgs, n_msgs, &o, out);
}

int kvllm_chat_tokenize(const struct kvllm_model *km, const char *template_text,
                        const struct kvllm_chat_message *msgs, int n_msgs, bool add_generation_prompt,
                        bool special_in_content, int32_t **ids_out, int *n_out) {
    struct kvllm_chat_opts o = { .add_generation_prompt = add_generation_prompt,
                                 .special_in_content = special_in_content };
    return chat_tokenize(km, template_text, msgs, n_msgs, &o, ids_out, n_out);
}

static int chat_tokenize(const struct kvllm_model *km, const char *template_text, const struct kvllm_chat_message *msgs,
                         int n_msgs, const struct kvllm_chat_opts *opts, int32_t **ids_out, int *n_out) {
    *ids_out = NULL;
    *n_out = 0;
    const struct kvllm_chat_opts none = { 0 }, *o = opts ? opts : &none;
    const bool special_in_content = o->special_in_content;
    if (!km || !km->tok) {
        LOG_ERR("%s: the model carries no vocabulary; pass a tokenizer (--tokenizer PATH)",
                km ? km->path : "chat template");
        return KVLLM_ENOTFOUND;
    }
    struct gguf_str tmpl;
    struct chat_template_params p;
    int rc = chat_setup(km, template_text, msgs, n_msgs, o, &tmpl, &p);
    if (rc) return rc;
    const struct tokenizer *tok = km->tok;
    char *text = NULL;
    size_t len = 0, n_spans = 0;
    struct chat_span *spans = NULL;
    rc = render(&tmpl, &p, o->prefill, &text, &len, &spans, &n_spans);
    if (rc) return rc;
    /* chat_span and tok_span are both (off, len) */
    struct tok_span *plain = n_spans ? xmalloc(n_spans * sizeof *plain) : NULL;
    int32_t *ids = NULL;
    int n = KVLLM_ENOMEM;
    if (!n_spans || plain) {
        for (size_t i = 0; i < n_spans; i++) plain[i] = (struct tok_span){ spans[i].off, spans[i].len };
        n = encode(tok, text, len, special_in_content, plain, n_spans, &ids);
    }
    free(plain);
    free(spans);
    free(text);
    if (n < 0) return n;
    /* BOS first when the vocabulary asks for it and the template did not write it */
    int bos = tokenizer_bos(tok);
    bool add = tokenizer_add_bos(tok) && !(n > 0 && ids[1] == bos);
    if (add) ids[0] = bos;
    else memmove(ids, ids + 1, (size_t)n * sizeof *ids);
    *ids_out = ids;
    *n_out = n + add;
    return 0;
}

/* The public entry points: a failure's message goes back in opts->err too. */
int kvllm_chat_render_ex(const struct kvllm_model *km, const char *template_text,
                         const struct kvllm_chat_message *msgs, int n_msgs, const struct kvllm_chat_opts *opts,
                         char **out) {
    struct log_capture cap;
    log_capture_begin(&cap, opts ? opts->err : NULL, opts ? opts->err_cap : 0);
    int rc = chat_render(km, template_text, msgs, n_msgs, opts, out);
    log_capture_end(&cap);
    return rc;
}

int kvllm_chat_tokenize_ex(const struct kvllm_model *km, const char *template_text,
                           const struct kvllm_chat_message *msgs, int n_msgs, const struct kvllm_chat_opts *opts,
                           int32_t **ids_out, int *n_out) {
    struct log_capture cap;
    log_capture_begin(&cap, opts ? opts->err : NULL, opts ? opts->err_cap : 0);
    int rc = chat_tokenize(km, template_text, msgs, n_msgs, opts, ids_out, n_out);
    log_capture_end(&cap);
    return rc;
}
