/* test_tok_chat_template.c — the chat-template renderer through its C API:
 * return codes (EINVAL, EUNSUPPORTED), the logged "line:col", content that
 * is NULL (None), length with embedded NULs, the date parameter, and a
 * real template from ../shared/templates.  Byte-for-byte agreement with
 * Jinja2 over many templates is tests/python/test_chat_template.py's job. */
#include "check.h"
#include "tok/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_log[1024];

static void capture(enum kvllm_log_level level, const char *msg, void *user) {
    (void)level; (void)user;
    snprintf(g_log, sizeof g_log, "%s", msg);
}

static const struct kvllm_chat_message k_conv[] = {
    { "system", "Be brief." }, { "user", "Hi" }, { "assistant", "Hello." }, { "user", "Bye \"now\"" },
};

/* Render tmpl; returns the code, *out (caller frees) on success. */
static int render(const char *tmpl, const struct kvllm_chat_message *msgs, int n, bool agp, char **out) {
    struct chat_template_params p = { .msgs = msgs, .n_msgs = n, .add_generation_prompt = agp,
                                      .bos_token = "<s>", .eos_token = "</s>", .now = "2024-07-26" };
    g_log[0] = 0;
    return chat_template_render(tmpl, strlen(tmpl), &p, out, NULL);
}

static void expect(const char *tmpl, const char *want) {
    char *out = NULL;
    int rc = render(tmpl, k_conv, 4, true, &out);
    CHECK_MSG(rc == 0 && out && !strcmp(out, want), "%s -> rc %d, '%s' (want '%s'; log: %s)", tmpl, rc,
              out ? out : "(null)", want, g_log);
    free(out);
}

static void expect_error(const char *tmpl, int code, const char *where) {
    char *out = (char *)1;
    int rc = render(tmpl, k_conv, 4, false, &out);
    CHECK_MSG(rc == code && out == NULL, "%s -> rc %d (want %d)", tmpl, rc, code);
    CHECK_MSG(strstr(g_log, where) != NULL, "%s: log '%s' lacks '%s'", tmpl, g_log, where);
}

static void test_basics(void) {
    expect("{% for m in messages %}{{ m.role[0] }}:{{ m.content }};{% endfor %}",
           "s:Be brief.;u:Hi;a:Hello.;u:Bye \"now\";");
    expect("{{ bos_token }}{{ messages|length }}{{ eos_token if add_generation_prompt }}", "<s>4</s>");
    expect("{% if true %}\n  x\n{% endif %}\n", "  x\n");
    expect("{{ strftime_now('%d %b %Y') }}", "26 Jul 2024");
    expect("{{ messages|selectattr('role', 'eq', 'user')|map(attribute='content')|join('|') }}", "Hi|Bye \"now\"");
    expect("{{ messages[-1]|tojson }}", "{\"role\": \"user\", \"content\": \"Bye \\\"now\\\"\"}");
    expect("{% set ns = namespace(n=0) %}{% for m in messages if m.role != 'system' %}"
           "{% set ns.n = ns.n + loop.index %}{% endfor %}{{ ns.n }}", "6");
}

static void test_none_content(void) {
    const struct kvllm_chat_message msgs[] = { { "assistant", NULL } };
    char *out = NULL;
    int rc = render("{{ messages[0].content is none }}|{{ messages[0].content }}", msgs, 1, false, &out);
    CHECK_MSG(rc == 0 && out && !strcmp(out, "True|None"), "rc %d out %s", rc, out ? out : "(null)");
    free(out);
    rc = render("{{ 'x' + messages[0].content }}", msgs, 1, false, &out);
    CHECK(rc == KVLLM_EINVAL && out == NULL);
}

static void test_lengths(void) {
    /* a template with a NUL inside, rendered by length */
    static const char tmpl[] = "a{{ '\\x00' }}b\0ignored";
    struct chat_template_params p = { 0 };
    char *out = NULL;
    size_t len = 0;
    int rc = chat_template_render(tmpl, strlen(tmpl), &p, &out, &len);
    CHECK_MSG(rc == 0 && len == 3 && out && !memcmp(out, "a\0b", 3), "rc %d len %zu", rc, len);
    free(out);
    /* one trailing newline is dropped, as jinja2 does */
    rc = chat_template_render("x\n\n", 3, &p, &out, &len);
    CHECK(rc == 0 && len == 2 && !strcmp(out, "x\n"));
    free(out);
}

static void test_errors(void) {
    expect_error("{% if x %}\nnever closed", KVLLM_EINVAL, "chat template 2:13:");
    expect_error("ok\n  {{ 1 + }}", KVLLM_EINVAL, "chat template 2:10:");
    expect_error("{{ raise_exception('No system role') }}", KVLLM_EINVAL, "raise_exception: No system role");
    expect_error("{{ x.y }}", KVLLM_EINVAL, "'x' is undefined");
    expect_error("{{ 'a'|format }}", KVLLM_EUNSUPPORTED, "1:8:");
    expect_error("{% include 'x' %}", KVLLM_EUNSUPPORTED, "'include' tag is not supported");
    expect_error("{{ [1]|nosuch }}", KVLLM_EINVAL, "no filter named 'nosuch'");
    expect_error("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", KVLLM_EINVAL, "nesting deeper");
    char deep[8192];
    size_t k = (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 1000; i++) k += (size_t)snprintf(deep + k, sizeof deep - k, "not ");
    snprintf(deep + k, sizeof deep - k, "1 }}");
    expect_error(deep, KVLLM_EINVAL, "nesting deeper");
    k = (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 70; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 70; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    expect_error(deep, KVLLM_EUNSUPPORTED, "brackets nested too deeply");
    struct chat_template_params p = { .now = "2024-02-30" };
    char *out = NULL;
    CHECK(chat_template_render("x", 1, &p, &out, NULL) == KVLLM_EINVAL && !out);
}

static void test_shared_template(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/templates/meta-llama-Llama-3.1-8B-Instruct.jinja", check_shared_dir());
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    if (!f) return;
    static char tmpl[1 << 16];
    size_t n = fread(tmpl, 1, sizeof tmpl - 1, f);
    fclose(f);
    struct chat_template_params p = { .msgs = k_conv, .n_msgs = 4, .add_generation_prompt = true,
                                      .bos_token = "<|begin_of_text|>", .now = "2024-07-26" };
    char *out = NULL;
    int rc = chat_template_render(tmpl, n, &p, &out, NULL);
    const char *want =
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye \"now\"<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n";
    CHECK_MSG(rc == 0 && out && !strcmp(out, want), "rc %d: %s", rc, out ? out : g_log);
    free(out);
}

int main(void) {
    kvllm_log_set(capture, NULL);
    test_basics();
    test_none_content();
    test_lengths();
    test_errors();
    test_shared_template();
    return check_report("test_tok_chat_template");
}
