/* test_server_toolcall.c — tool calls out of generated text: format
 * detection on the shared templates, a table of outputs per format (one and
 * several calls, text before and after, "parameters" or "arguments",
 * arguments as a JSON string, malformed JSON returned as text, unicode, a
 * missing closing tag), and the streaming parser fed every table entry in
 * pieces of 1, 2, 3, 5 and 7 bytes: what it shows plus what it finishes
 * with must equal the pure parse, and nothing that is part of a call is
 * ever shown.  Call ids: shape and uniqueness. */
#include "check.h"
#include "server/toolcall.h"
#include "server/schema_check.h"

#include <json-c/json.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct want_call { const char *name, *args; };

struct row {
    enum toolcall_format f;
    const char *text;
    const char *content;             /* NULL: none */
    int n_calls;
    struct want_call calls[3];
};

#define H TOOLCALL_HERMES
#define L TOOLCALL_LLAMA3
#define M TOOLCALL_MISTRAL

static const struct row k_rows[] = {
    /* Hermes / Qwen2.5 */
    { H, "Hello there.", "Hello there.", 0, { { 0 } } },
    { H, "Hello there.\n\n", "Hello there.\n\n", 0, { { 0 } } },
    { H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", NULL, 1,
      { { "get_weather", "{\"city\":\"Paris\"}" } } },
    { H, "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
         "{\"name\": \"b\", \"arguments\": {\"x\": [1, 2.5, true, null]}}\n</tool_call>", "Let me check.", 2,
      { { "a", "{}" }, { "b", "{\"x\":[1,2.5,true,null]}" } } },
    { H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"caf\xc3\xa9 \xf0\x9f\x98\x80\"}}", NULL, 1,
      { { "f", "{\"q\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}" } } },   /* no closing tag: EOS came first */
    { H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": 1}\n</tool_call>", 
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": 1}\n</tool_call>", 0, { { 0 } } },   /* malformed */
    { H, "<tool_call>{\"name\": \"f\"}</tool_call> ok", "<tool_call>{\"name\": \"f\"}</tool_call> ok", 0, { { 0 } } },
    { H, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>", NULL, 1,
      { { "f", "{\"a\":1}" } } },
    { H, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\nDone.", "Done.", 1, { { "f", "{}" } } },
    { H, "I might use <tool_call> later.", "I might use <tool_call> later.", 0, { { 0 } } },
    { H, "<tool_call>{\"name\": \"f\", \"parameters\": {\"k\": \"v\"}}</tool_call>", NULL, 1,
      { { "f", "{\"k\":\"v\"}" } } },
    { H, "<tool_call>[1, 2]</tool_call>", "<tool_call>[1, 2]</tool_call>", 0, { { 0 } } },
    /* Llama 3.1 / 3.2 */
    { L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", NULL, 1,
      { { "get_weather", "{\"city\":\"Paris\"}" } } },
    { L, "  <|python_tag|>{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"arguments\": {\"n\": -1e3}}", NULL, 2,
      { { "f", "{}" }, { "g", "{\"n\":-1e3}" } } },
    { L, "The weather is nice.", "The weather is nice.", 0, { { 0 } } },
    { L, "Sure: {\"name\": \"f\", \"parameters\": {}}", "Sure: {\"name\": \"f\", \"parameters\": {}}", 0, { { 0 } } },
    { L, "{\"name\": \"f\", \"parameters\": {}} and more", "{\"name\": \"f\", \"parameters\": {}} and more", 0,
      { { 0 } } },
    { L, "{\"name\": \"f\", \"parameters\": {\"a\": 1}", "{\"name\": \"f\", \"parameters\": {\"a\": 1}", 0, { { 0 } } },
    { L, "{\"answer\": 42}", "{\"answer\": 42}", 0, { { 0 } } },
    { L, "<|python_ta", "<|python_ta", 0, { { 0 } } },
    /* Mistral */
    { M, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"\xd0\x9c\xd0\xbe\xd1\x81\"}}]", NULL, 1,
      { { "get_weather", "{\"city\":\"\xd0\x9c\xd0\xbe\xd1\x81\"}" } } },
    { M, "Checking. [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"z\": \"\"}}]",
      "Checking.", 2, { { "a", "{}" }, { "b", "{\"z\":\"\"}" } } },
    { M, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}]", "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}]", 0,
      { { 0 } } },
    { M, "No tools needed.", "No tools needed.", 0, { { 0 } } },
    { M, "[TOOL_CALLS][]", "[TOOL_CALLS][]", 0, { { 0 } } },
    { M, " [{\"name\": \"a\", \"arguments\": {\"k\": 1}}]", NULL, 1, { { "a", "{\"k\":1}" } } },   /* marker detokenized to nothing */
    { M, "[1] is a list", "[1] is a list", 0, { { 0 } } },
    { M, "[{\"name\": \"a\", \"arguments\": {}}] trailing", "[{\"name\": \"a\", \"arguments\": {}}] trailing", 0,
      { { 0 } } },
    /* no format: all text */
    { TOOLCALL_NONE, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", 0, { { 0 } } },
};

static void check_result(int row, const char *how, const struct toolcall_result *r, const char *content) {
    const struct row *w = &k_rows[row];
    bool ok = (content == NULL) == (w->content == NULL) && (!content || !strcmp(content, w->content)) &&
              r->n_calls == w->n_calls;
    for (int i = 0; ok && i < w->n_calls; i++)
        ok = !strcmp(r->calls[i].name, w->calls[i].name) && !strcmp(r->calls[i].arguments, w->calls[i].args);
    CHECK_MSG(ok, "row %d (%s, %s): content '%s' (want '%s'), %d calls (want %d)%s%s%s%s", row,
              toolcall_format_name(w->f), how, content ? content : "(null)", w->content ? w->content : "(null)",
              r->n_calls, w->n_calls, r->n_calls ? ", first " : "", r->n_calls ? r->calls[0].name : "",
              r->n_calls ? " " : "", r->n_calls ? r->calls[0].arguments : "");
}

static void test_table(void) {
    for (int i = 0; i < (int)(sizeof k_rows / sizeof *k_rows); i++) {
        struct toolcall_result r;
        int rc = toolcall_parse(k_rows[i].f, k_rows[i].text, strlen(k_rows[i].text), &r);
        CHECK(rc == 0);
        check_result(i, "whole", &r, r.content);
        toolcall_result_free(&r);
    }
}

/* Every row in pieces: the content shown while streaming is never part of a
 * call, and shown + finished equals the whole parse. */
static void test_stream(void) {
    static const size_t k_pieces[] = { 1, 2, 3, 5, 7, 1000 };
    for (int i = 0; i < (int)(sizeof k_rows / sizeof *k_rows); i++) {
        const char *t = k_rows[i].text;
        size_t n = strlen(t);
        for (size_t p = 0; p < sizeof k_pieces / sizeof *k_pieces; p++) {
            struct toolcall_stream s;
            toolcall_stream_init(&s, k_rows[i].f);
            struct strbuf shown = { 0 };
            for (size_t off = 0; off < n; off += k_pieces[p]) {
                size_t k = n - off < k_pieces[p] ? n - off : k_pieces[p];
                toolcall_stream_push(&s, t + off, k, &shown);
                /* what is shown so far is a prefix of the final content */
                const char *want = k_rows[i].content ? k_rows[i].content : "";
                CHECK_MSG(shown.len <= strlen(want) && (!shown.len || !memcmp(shown.s, want, shown.len)),
                          "row %d piece %zu: shown '%.*s' is not a prefix of '%s'", i, k_pieces[p], (int)shown.len,
                          shown.s ? shown.s : "", want);
            }
            size_t before = shown.len;
            struct toolcall_result r;
            CHECK(toolcall_stream_finish(&s, &shown, &r) == 0);
            char how[32];
            snprintf(how, sizeof how, "stream by %zu (%zu shown early)", k_pieces[p], before);
            check_result(i, how, &r, k_rows[i].content ? shown.s : (shown.len ? shown.s : NULL));
            toolcall_result_free(&r);
            sb_free(&shown);
            toolcall_stream_deinit(&s);
        }
    }
}

/* Every prefix of every row (an answer cut anywhere, by max_tokens or a
 * stop), and each row with one byte flipped: streaming in pieces of 3 gives
 * exactly what the whole parse gives, content and calls. */
static bool same_result(const struct toolcall_result *a, const char *a_content, const struct toolcall_result *b) {
    const char *bc = b->content ? b->content : "";
    if (strcmp(a_content ? a_content : "", bc) || a->n_calls != b->n_calls) return false;
    for (int i = 0; i < a->n_calls; i++)
        if (strcmp(a->calls[i].name, b->calls[i].name) || strcmp(a->calls[i].arguments, b->calls[i].arguments))
            return false;
    return true;
}

static void test_stream_equals_whole_on_cuts(void) {
    static const char k_flip[] = "{}[]\":,<>/ \nx";
    for (int i = 0; i < (int)(sizeof k_rows / sizeof *k_rows); i++) {
        const char *t = k_rows[i].text;
        size_t n = strlen(t);
        char *buf = malloc(n + 1);
        for (size_t cut = 0; cut <= n + n; cut++) {
            size_t len = cut <= n ? cut : n;
            memcpy(buf, t, n + 1);
            if (cut > n) buf[cut - n - 1] = k_flip[(cut * 7) % (sizeof k_flip - 1)];   /* a flipped byte */
            struct toolcall_result whole, streamed;
            CHECK(toolcall_parse(k_rows[i].f, buf, len, &whole) == 0);
            struct toolcall_stream st;
            struct strbuf shown = { 0 };
            toolcall_stream_init(&st, k_rows[i].f);
            for (size_t off = 0; off < len; off += 3)
                toolcall_stream_push(&st, buf + off, len - off < 3 ? len - off : 3, &shown);
            CHECK(toolcall_stream_finish(&st, &shown, &streamed) == 0);
            CHECK_MSG(same_result(&streamed, shown.s, &whole),
                      "row %d cut %zu: streamed '%s' + %d calls, whole '%s' + %d", i, cut, shown.s ? shown.s : "", streamed.n_calls, whole.content ? whole.content : "(null)",
                      whole.n_calls);
            toolcall_result_free(&whole);
            toolcall_result_free(&streamed);
            sb_free(&shown);
            toolcall_stream_deinit(&st);
        }
        free(buf);
    }
}

/* Text streams early when it cannot be a call (not all held to the end). */
static void test_stream_shows_text_early(void) {
    struct toolcall_stream s;
    struct strbuf shown = { 0 };
    toolcall_stream_init(&s, TOOLCALL_HERMES);
    toolcall_stream_push(&s, "Hello ", 6, &shown);
    toolcall_stream_push(&s, "world <tool", 11, &shown);
    CHECK_MSG(shown.len == 11 && !memcmp(shown.s, "Hello world", 11), "shown '%.*s'", (int)shown.len, shown.s);
    sb_free(&shown);
    toolcall_stream_deinit(&s);
    toolcall_stream_init(&s, TOOLCALL_LLAMA3);
    toolcall_stream_push(&s, " It is", 6, &shown);
    CHECK_MSG(shown.len == 6, "llama3 text shown: '%.*s'", (int)shown.len, shown.s ? shown.s : "");
    sb_free(&shown);
    toolcall_stream_deinit(&s);
}

static void test_detect(void) {
    static const struct { const char *file; enum toolcall_format f; } k[] = {
        { "Qwen-Qwen2.5-7B-Instruct.jinja", TOOLCALL_HERMES },
        { "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", TOOLCALL_HERMES },
        { "Qwen-Qwen3-0.6B.jinja", TOOLCALL_HERMES },
        { "meta-llama-Llama-3.1-8B-Instruct.jinja", TOOLCALL_LLAMA3 },
        { "meta-llama-Llama-3.2-3B-Instruct.jinja", TOOLCALL_LLAMA3 },
        { "mistralai-Mistral-Nemo-Instruct-2407.jinja", TOOLCALL_MISTRAL },
        { "google-gemma-2-2b-it.jinja", TOOLCALL_NONE },
        { "microsoft-Phi-3.5-mini-instruct.jinja", TOOLCALL_NONE },
        { "ibm-granite-granite-3.3-2B-Instruct.jinja", TOOLCALL_NONE },
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/templates/%s", check_shared_dir(), k[i].file);
        FILE *fp = fopen(path, "rb");
        CHECK_MSG(fp != NULL, "cannot open %s", path);
        if (!fp) continue;
        static char buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf - 1, fp);
        fclose(fp);
        buf[n] = 0;
        enum toolcall_format f = toolcall_detect(buf);
        CHECK_MSG(f == k[i].f, "%s: detected %s, want %s", k[i].file, toolcall_format_name(f),
                  toolcall_format_name(k[i].f));
    }
    CHECK(toolcall_detect(NULL) == TOOLCALL_NONE);
    for (int f = TOOLCALL_NONE; f <= TOOLCALL_MISTRAL; f++)
        CHECK(toolcall_format_from_name(toolcall_format_name((enum toolcall_format)f)) == f);
    CHECK(toolcall_format_from_name("granite") == -1);
}

static void test_ids(void) {
    uint64_t st = 42;
    char a[32], b[32];
    toolcall_make_id(TOOLCALL_HERMES, &st, a);
    toolcall_make_id(TOOLCALL_HERMES, &st, b);
    CHECK_MSG(strlen(a) == 29 && !strncmp(a, "call_", 5) && strcmp(a, b), "ids %s %s", a, b);
    toolcall_make_id(TOOLCALL_MISTRAL, &st, a);
    CHECK_MSG(strlen(a) == 9 && strspn(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") == 9,
              "mistral id %s", a);
}

/* A call of a function that was not offered is text: toolcall_only_declared on a whole answer, and a
 * stream given the names shows the whole answer as content (an invented function was returned as a
 * tool_calls entry under tool_choice auto). */
static void test_only_declared(void) {
    struct toolcall_decl *names;
    int n;
    CHECK(toolcall_declared("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}, "
                            "{\"type\": \"function\", \"function\": {\"name\": \"add\"}}]", &names, &n) == 0);
    CHECK(n == 2 && !strcmp(names[0].name, "get_weather") && !strcmp(names[1].name, "add") && !names[0].params);
    static const char ok[] = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>";
    static const char bad[] = "Sure.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>\n"
                              "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>";
    struct toolcall_result r;
    CHECK(toolcall_parse(TOOLCALL_HERMES, ok, strlen(ok), &r) == 0 && r.n_calls == 1);
    CHECK(toolcall_only_declared(&r, names, n, ok, strlen(ok)) == 0 && r.n_calls == 1 && !r.content);
    toolcall_result_free(&r);
    CHECK(toolcall_parse(TOOLCALL_HERMES, bad, strlen(bad), &r) == 0 && r.n_calls == 2);
    CHECK(toolcall_only_declared(&r, names, n, bad, strlen(bad)) == 0);
    CHECK_MSG(r.n_calls == 0 && r.content && !strcmp(r.content, bad), "%d calls, content '%s'", r.n_calls,
              r.content ? r.content : "(null)");
    toolcall_result_free(&r);
    for (size_t piece = 1; piece <= 7; piece += 3) {
        struct toolcall_stream st;
        toolcall_stream_init(&st, TOOLCALL_HERMES);
        st.decls = names;
        st.n_decls = n;
        struct strbuf shown = { 0 };
        for (size_t off = 0; off < strlen(bad); off += piece)
            toolcall_stream_push(&st, bad + off, strlen(bad) - off < piece ? strlen(bad) - off : piece, &shown);
        CHECK(toolcall_stream_finish(&st, &shown, &r) == 0);
        CHECK_MSG(r.n_calls == 0 && shown.s && !strcmp(shown.s, bad), "stream by %zu: %d calls, shown '%s'", piece,
                  r.n_calls, shown.s ? shown.s : "");
        toolcall_result_free(&r);
        sb_free(&shown);
        toolcall_stream_deinit(&st);
    }
    toolcall_decls_free(names, n);
}

/* Arguments the declared parameters do not admit make the answer text, as an undeclared function does
 * (tool_choice auto: no grammar held the model to the schema); arguments it admits stay a call. */
static void test_arguments_checked(void) {
    static const char tools[] =
        "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"city\": {\"type\": \"string\", \"minLength\": 1}, \"unit\": {\"enum\": [\"c\", \"f\"]}, "
        "\"days\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 7}, \"tags\": {\"type\": \"array\", "
        "\"items\": {\"type\": \"string\"}, \"maxItems\": 2}}, \"required\": [\"city\"], \"additionalProperties\": false}}}]";
    struct toolcall_decl *d;
    int n;
    CHECK(toolcall_declared(tools, &d, &n) == 0 && n == 1 && d[0].params);
    static const struct { const char *args; bool ok; } cases[] = {
        { "{\"city\": \"Paris\"}", true },
        { "{\"city\": \"Paris\", \"unit\": \"c\", \"days\": 3, \"tags\": [\"a\", \"b\"]}", true },
        { "{\"city\": \"Paris\", \"days\": 3.0}", true },
        { "{}", false },                                        /* required */
        { "{\"city\": 3}", false },                             /* type */
        { "{\"city\": \"\"}", false },                           /* minLength */
        { "{\"city\": \"Paris\", \"unit\": \"k\"}", false },        /* enum */
        { "{\"city\": \"Paris\", \"days\": 9}", false },           /* maximum */
        { "{\"city\": \"Paris\", \"days\": 2.5}", false },         /* integer */
        { "{\"city\": \"Paris\", \"tags\": [\"a\", 1]}", false },   /* items */
        { "{\"city\": \"Paris\", \"tags\": [\"a\", \"b\", \"c\"]}", false },   /* maxItems */
        { "{\"city\": \"Paris\", \"country\": \"FR\"}", false },  /* additionalProperties */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char text[512];
        snprintf(text, sizeof text, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": %s}\n</tool_call>", cases[k].args);
        struct toolcall_result r;
        CHECK(toolcall_parse(TOOLCALL_HERMES, text, strlen(text), &r) == 0 && r.n_calls == 1);
        CHECK(toolcall_only_declared(&r, d, n, text, strlen(text)) == 0);
        CHECK_MSG(cases[k].ok ? r.n_calls == 1 && !r.content : r.n_calls == 0 && r.content && !strcmp(r.content, text),
                  "arguments %s: %d calls, content '%s'", cases[k].args, r.n_calls, r.content ? r.content : "(null)");
        toolcall_result_free(&r);
    }
    toolcall_decls_free(d, n);
}

/* The validator's combinators and references, alone. */
static void test_schema_check(void) {
    static const struct { const char *schema, *value; bool ok; const char *why; } cases[] = {
        { "{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"null\"}]}", "null", true, "" },
        { "{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"null\"}]}", "1", false, "$: anyOf" },
        { "{\"oneOf\": [{\"type\": \"integer\"}, {\"type\": \"number\"}]}", "1", false, "$: oneOf" },
        { "{\"oneOf\": [{\"type\": \"integer\"}, {\"type\": \"string\"}]}", "1", true, "" },
        { "{\"type\": [\"string\", \"null\"]}", "true", false, "$: type" },
        { "{\"$defs\": {\"p\": {\"type\": \"object\", \"required\": [\"x\"]}}, \"type\": \"array\", "
          "\"items\": {\"$ref\": \"#/$defs/p\"}}", "[{\"x\": 1}, {}]", false, "$[1]: required property 'x'" },
        { "{\"const\": \"a\"}", "\"a\"", true, "" },
        { "{\"exclusiveMinimum\": 0}", "0", false, "$: exclusiveMinimum" },
        { "{\"maxLength\": 2}", "\"\u00e9\u00e9\"", true, "" },
        { "{\"type\": \"object\", \"additionalProperties\": {\"type\": \"integer\"}}", "{\"a\": \"b\"}", false, "$.a: type" },
        { "false", "1", false, "admits nothing" },
        { "{\"pattern\": \"^a$\", \"format\": \"email\"}", "\"b\"", true, "" },   /* not checked */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        json_object *s = json_tokener_parse(cases[k].schema), *v = json_tokener_parse(cases[k].value);
        char why[256];
        bool ok = schema_check(s, v, why, sizeof why);
        CHECK_MSG(ok == cases[k].ok && (ok || strstr(why, cases[k].why)), "%s on %s: %d '%s'", cases[k].schema,
                  cases[k].value, ok, why);
        json_object_put(s);
        json_object_put(v);
    }
}

int main(void) {
    test_table();
    test_stream();
    test_stream_shows_text_early();
    test_stream_equals_whole_on_cuts();
    test_detect();
    test_ids();
    test_only_declared();
    test_arguments_checked();
    test_schema_check();
    return check_report("test_server_toolcall");
}
