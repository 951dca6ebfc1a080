/* fuzz_openai — the OpenAI request parser (oai_parse): the first byte
 * picks /v1/chat/completions (odd) or /v1/completions (even), the rest is
 * the body.  An accepted request is checked against the documented
 * limits; a refused one must carry a 4xx status and a message. */
#include "fuzz_util.h"
#include "server/openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    if (size < 1) return 0;
    const bool chat = data[0] & 1;
    char *body = fuzz_strndup(data + 1, size - 1);
    struct oai_request r;
    struct oai_error err;
    memset(&r, 0, sizeof r);
    memset(&err, 0, sizeof err);
    if (oai_parse(chat, body, size - 1, &r, &err) == 0) {
        if (r.chat != chat) abort();
        if (chat ? r.n_msgs < 1 : r.n_prompts < 1) abort();
        if (r.n < 1 || r.n > OAI_MAX_N || r.n_prompts > OAI_MAX_PROMPTS || r.n_stop > OAI_MAX_STOP) abort();
        for (int i = 0; i < r.n_prompts; i++)
            if (!r.prompts[i].text && r.prompts[i].n_ids > 0 && !r.prompts[i].ids) abort();
        oai_request_free(&r);
    } else {
        if (err.status < 400 || err.status > 499 || !err.message[0]) abort();
        char *j = oai_error_json(&err);
        free(j);
    }
    free(body);
    return 0;
}
