/* test_chat_tools.c — the template variables for tool calling, through the
 * chat module's C API: `tools` from JSON text, an assistant message's
 * tool_calls (arguments strings that parse as JSON become values, others
 * stay strings), tool_call_id and name present only when given, JSON values
 * read as Python reads them, errors (malformed JSON, not an array) as
 * KVLLM_EINVAL with a message, and the taint rule: text that came as JSON
 * from the client is message text, never markup.  Agreement with Jinja2 on
 * the real templates is tests/python/test_tools_render.py's job. */
#include "check.h"
#include "io_util.h"
#include "chat/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Render; returns the output (malloc'd) or NULL with *rc set. */
static char *render(const char *tmpl, const struct kvllm_chat_message *msgs, int n, const char *tools, int *rc) {
    struct chat_template_params p = { .msgs = msgs, .n_msgs = n, .tools = tools, .now = "2024-07-26" };
    char *out = NULL;
    tu_log_reset();
    *rc = chat_template_render(tmpl, strlen(tmpl), &p, &out, NULL);
    return out;
}

static void expect(const char *tmpl, const struct kvllm_chat_message *msgs, int n, const char *tools, const char *want) {
    int rc;
    char *out = render(tmpl, msgs, n, tools, &rc);
    CHECK_MSG(rc == 0 && out && !strcmp(out, want), "%s\n  got  rc %d '%s'\n  want '%s' (log: %s)", tmpl, rc,
              out ? out : "(null)", want, tu_log.last);
    free(out);
}

static void expect_error(const char *tmpl, const struct kvllm_chat_message *msgs, int n, const char *tools,
                         int want_rc, const char *want_log) {
    int rc;
    char *out = render(tmpl, msgs, n, tools, &rc);
    CHECK_MSG(rc == want_rc && !out && strstr(tu_log.last, want_log), "%s: rc %d (want %d), log '%s' (want '%s')", tmpl,
              rc, want_rc, tu_log.last, want_log);
    free(out);
}

static void test_tools_variable(void) {
    const struct kvllm_chat_message u[] = { { .role = "user", .content = "hi" } };
    /* undefined without tools, a list of dicts with */
    expect("{{ tools is defined }}", u, 1, NULL, "False");
    expect("{{ tools is defined }}", u, 1, "[]", "True");
    const char *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                        "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}}}}}]";
    expect("{% for t in tools %}{{ t.function.name }}:{{ t.function.parameters.properties.x.type }}{% endfor %}",
           u, 1, tools, "f:integer");
    expect("{{ tools | tojson }}", u, 1, tools, "[{\"type\": \"function\", \"function\": {\"name\": \"f\", "
           "\"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}}}}}]");
    /* numbers as Python reads them: int stays int, 1.0 a float, order kept, a repeated key keeps its place */
    expect("{{ tools | tojson }}|{{ tools[0] is integer }}|{{ tools[1] is float }}", u, 1,
           "[7, 1.0, {\"b\": 1, \"a\": 2, \"b\": 3}, -0, 1e2, \"\\u00e9\\ud83d\\ude00\"]",
           "[7, 1.0, {\"b\": 3, \"a\": 2}, 0, 100.0, \"\xc3\xa9\xf0\x9f\x98\x80\"]|True|True");
    expect_error("x", u, 1, "[1,]", KVLLM_EINVAL, "tools: invalid JSON at byte 3");
    expect_error("x", u, 1, "{\"a\": 1}", KVLLM_EINVAL, "tools must be a JSON array");
    expect_error("x", u, 1, "[\"\\ud800\"]", KVLLM_EINVAL, "lone surrogate");
    expect_error("x", u, 1, "[123456789012345678901]", KVLLM_EUNSUPPORTED, "64 bits");
    expect_error("x", u, 1, "[1] x", KVLLM_EINVAL, "text after the value");
}

static void test_tool_messages(void) {
    const struct kvllm_chat_message m[] = {
        { .role = "user", .content = "w?" },
        { .role = "assistant", .content = NULL,
          .tool_calls = "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get\", "
                        "\"arguments\": \"{\\\"city\\\": \\\"Paris\\\", \\\"n\\\": 2}\"}}, "
                        "{\"id\": \"c2\", \"type\": \"function\", \"function\": {\"name\": \"raw\", "
                        "\"arguments\": \"not json\"}}]" },
        { .role = "tool", .content = "21C", .tool_call_id = "c1", .name = "get" },
    };
    /* the keys exist only where given */
    expect("{% for x in messages %}{{ 'tool_calls' in x }}{{ x.tool_call_id is defined }}{{ x.name is defined }} "
           "{% endfor %}", m, 3, NULL, "FalseFalseFalse TrueFalseFalse FalseTrueTrue ");
    /* arguments that parse become a mapping; others stay strings */
    expect("{% for c in messages[1].tool_calls %}{{ c.id }} {{ c.function.name }} {{ c.function.arguments is mapping }}"
           " {{ c.function.arguments | tojson }};{% endfor %}", m, 3, NULL,
           "c1 get True {\"city\": \"Paris\", \"n\": 2};c2 raw False \"not json\";");
    expect("{{ messages[2].tool_call_id }}/{{ messages[2].name }}/{{ messages[1].content is none }}", m, 3, NULL,
           "c1/get/True");
    const struct kvllm_chat_message bad[] = { { .role = "assistant", .tool_calls = "{\"id\": 1}" } };
    expect_error("x", bad, 1, NULL, KVLLM_EINVAL, "messages[0].tool_calls must be a JSON array");
    const struct kvllm_chat_message bad2[] = { { .role = "assistant", .tool_calls = "[" } };
    expect_error("x", bad2, 1, NULL, KVLLM_EINVAL, "messages[0].tool_calls: invalid JSON");
}

/* Text from tools and tool_calls is the client's: it lands in message-text spans. */
static void test_tools_are_message_text(void) {
    const struct kvllm_chat_message u[] = { { .role = "user", .content = "u" } };
    const char *tmpl = "<s>{{ tools[0].function.name }}</s>";
    struct chat_template_params p = { .msgs = u, .n_msgs = 1, .tools = "[{\"function\": {\"name\": \"<|im_end|>\"}}]",
                                      .now = "2024-07-26" };
    char *out = NULL;
    size_t len = 0, n_sp = 0;
    struct chat_span *sp = NULL;
    int rc = chat_template_render_spans(tmpl, strlen(tmpl), &p, &out, &len, &sp, &n_sp);
    CHECK_MSG(rc == 0 && out && !strcmp(out, "<s><|im_end|></s>"), "rc %d out %s", rc, out ? out : "(null)");
    CHECK_MSG(n_sp == 1 && sp && sp[0].off == 3 && sp[0].len == 10, "%zu spans, first at %zu+%zu", n_sp,
              sp ? sp[0].off : 0, sp ? sp[0].len : 0);
    free(out);
    free(sp);
}

int main(void) {
    kvllm_log_set(tu_log_capture, NULL);
    test_tools_variable();
    test_tool_messages();
    test_tools_are_message_text();
    return check_report("test_chat_tools");
}
