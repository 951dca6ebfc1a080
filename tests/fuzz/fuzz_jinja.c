/* fuzz_jinja — the chat-template interpreter: the input is a template,
 * the separator line, then the messages as JSON ([{"role", "content"}],
 * content may be null); without a separator the template renders a fixed
 * two-message conversation.  Budgets are lowered (200,000 steps, 1 MiB)
 * so a slow input is a budget error, not a libFuzzer timeout; the output
 * spans are checked to be sorted, disjoint and inside the output. */
#include "fuzz_util.h"
#include "chat/chat_template.h"

#include <json-c/json.h>

#define MAX_MSGS 32

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    size_t n1, n2;
    const uint8_t *p2;
    fuzz_split(data, size, &n1, &p2, &n2);

    struct kvllm_chat_message msgs[MAX_MSGS] = {
        { .role = "system", .content = "You are helpful." },
        { .role = "user", .content = "Hi {{ there }} <|im_end|>" },
    };
    int n_msgs = 2;
    json_object *root = NULL;
    if (n2) {
        json_tokener *tk = json_tokener_new();
        if (!tk) abort();
        root = json_tokener_parse_ex(tk, (const char *)p2, (int)(n2 > 1 << 20 ? 1 << 20 : n2));
        json_tokener_free(tk);
        n_msgs = 0;
        if (root && json_object_is_type(root, json_type_array)) {
            const size_t n = json_object_array_length(root);
            for (size_t i = 0; i < n && n_msgs < MAX_MSGS; i++) {
                json_object *m = json_object_array_get_idx(root, i), *r, *c;
                if (!json_object_is_type(m, json_type_object)) continue;
                if (!json_object_object_get_ex(m, "role", &r) || !json_object_is_type(r, json_type_string)) continue;
                const char *content = NULL;
                if (json_object_object_get_ex(m, "content", &c) && json_object_is_type(c, json_type_string))
                    content = json_object_get_string(c);
                msgs[n_msgs].role = json_object_get_string(r);
                msgs[n_msgs].content = content;
                /* tool fields: JSON text in a string, as the server passes them */
                if (json_object_object_get_ex(m, "tool_calls", &c) && json_object_is_type(c, json_type_string))
                    msgs[n_msgs].tool_calls = json_object_get_string(c);
                if (json_object_object_get_ex(m, "tool_call_id", &c) && json_object_is_type(c, json_type_string))
                    msgs[n_msgs].tool_call_id = json_object_get_string(c);
                n_msgs++;
            }
        }
    }

    struct chat_template_params p = {
        .msgs = msgs, .n_msgs = n_msgs, .add_generation_prompt = size & 1,
        .bos_token = "<s>", .eos_token = "</s>", .now = "2024-06-01",
        .max_steps = 200000, .max_output = 1 << 20,
    };
    char *out = NULL;
    size_t out_len = 0, n_spans = 0;
    struct chat_span *spans = NULL;
    if (chat_template_render_spans((const char *)data, n1, &p, &out, &out_len, &spans, &n_spans) == 0) {
        size_t end = 0;
        for (size_t i = 0; i < n_spans; i++) {
            if (spans[i].off < end || spans[i].off + spans[i].len > out_len) abort();
            end = spans[i].off + spans[i].len;
        }
        if (out[out_len] != 0) abort();
    } else if (out || spans || n_spans) {
        abort();   /* the contract: nothing returned on error */
    }
    free(out);
    free(spans);
    json_object_put(root);
    return 0;
}
