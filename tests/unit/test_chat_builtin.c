/* test_chat_builtin.c — the templates kvllm uses for files that carry none
 * (chat_template_builtin): looked up by architecture name and length (GGUF
 * strings are not NUL-terminated), Gemma 2 sharing Gemma 3's, unknown
 * families NULL, and Gemma's rendering written out: the system text folded
 * into the first user turn, "model" for the assistant, alternation enforced.
 * Agreement with Jinja2 on Transformers' text of the template is
 * tests/python/test_gemma3_tok.py's job. */
#include "check.h"
#include "io_util.h"
#include "chat/chat_template.h"

#include <stdlib.h>
#include <string.h>

static void test_lookup(void) {
    const char *g3 = chat_template_builtin("gemma3", 6);
    CHECK_MSG(g3 && strstr(g3, "<start_of_turn>"), "gemma3: %s", g3 ? g3 : "(null)");
    CHECK(chat_template_builtin("gemma2", 6) == g3);
    CHECK(chat_template_builtin("gemma3-and-more", 6) == g3);  /* only len bytes are the name */
    CHECK(chat_template_builtin("gemma", 5) == NULL);
    CHECK(chat_template_builtin("gemma3", 5) == NULL);
    CHECK(chat_template_builtin("llama", 5) == NULL);
    CHECK(chat_template_builtin("", 0) == NULL);
    CHECK(chat_template_builtin(NULL, 0) == NULL);
}

static void expect(const struct kvllm_chat_message *msgs, int n, bool agp, int want_rc, const char *want) {
    const char *tmpl = chat_template_builtin("gemma3", 6);
    struct chat_template_params p = { .msgs = msgs, .n_msgs = n, .add_generation_prompt = agp,
                                      .bos_token = "<bos>", .eos_token = "<eos>" };
    char *out = NULL;
    tu_log_reset();
    int rc = chat_template_render(tmpl, strlen(tmpl), &p, &out, NULL);
    CHECK_MSG(rc == want_rc && (want ? out && !strcmp(out, want) : !out), "rc %d (want %d) '%s' (want '%s'; log %s)",
              rc, want_rc, out ? out : "(null)", want ? want : "(null)", tu_log.last);
    free(out);
}

static void test_gemma_render(void) {
    const struct kvllm_chat_message conv[] = {
        { .role = "system", .content = "Be brief." }, { .role = "user", .content = "  Hi\n" },
        { .role = "assistant", .content = "Hello." }, { .role = "user", .content = "Bye" },
    };
    expect(conv, 4, true, 0,
           "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
           "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
    expect(conv + 1, 1, false, 0, "<bos><start_of_turn>user\nHi<end_of_turn>\n");
    const struct kvllm_chat_message twice[] = { { .role = "user", .content = "a" }, { .role = "user", .content = "b" } };
    expect(twice, 2, true, KVLLM_EINVAL, NULL);
    CHECK_MSG(strstr(tu_log.last, "Conversation roles must alternate"), "log: %s", tu_log.last);
}

int main(void) {
    kvllm_log_set(tu_log_capture, NULL);
    test_lookup();
    test_gemma_render();
    return check_report("test_chat_builtin");
}
