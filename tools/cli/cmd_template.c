/* cmd_template.c — `kvllm template`: render a chat template for a
 * conversation and print the prompt exactly (no newline added), for tests
 * and for looking at what a model will be fed.
 *
 * With --template the file is rendered by the template module itself, with
 * the --bos/--eos given; with -m the model's own template (or --template's)
 * goes through kvllm_chat_render(), with the model's BOS/EOS.  The
 * conversation is a JSON array of {"role": str, "content": str|null}
 * objects, read with json-c.  Library errors are logged by the library
 * (one "kvllm: error: chat template LINE:COL: ..." line). */
#include "cli.h"
#include "cli_opts.h"
#include "kvllm.h"
#include "chat/chat_template.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TP_HELP = 1, TP_MODEL, TP_TEMPLATE, TP_MESSAGES, TP_TOOLS, TP_ADD_GEN, TP_BOS, TP_EOS, TP_NOW };

/* template's options: the parser, --help and docs/CLI.md's reference read this table */
static const struct cli_opt k_template_opts[] = {
    { TP_MODEL, "-m, --model", "MODEL", CLI_VALUE,
      "use the model's chat template (GGUF tokenizer.chat_template) and BOS/EOS" },
    { TP_TEMPLATE, "--template", "FILE", CLI_VALUE, "a Jinja chat template file (with -m: instead of the model's)" },
    { TP_MESSAGES, "--messages", "FILE", CLI_VALUE,
      "the conversation: a JSON array of {\"role\": ..., \"content\": ...} ('-': stdin);\nalso \"tool_calls\" "
      "(OpenAI's array), \"tool_call_id\" and \"name\"" },
    { TP_TOOLS, "--tools", "FILE", CLI_VALUE, "tool definitions (OpenAI's request \"tools\" array), the template's `tools`" },
    { TP_ADD_GEN, "--add-generation-prompt", NULL, CLI_FLAG, "end with the assistant's turn header" },
    { TP_BOS, "--bos", "TEXT", CLI_VALUE, "bos_token for --template without -m (default empty)" },
    { TP_EOS, "--eos", "TEXT", CLI_VALUE, "eos_token for --template without -m (default empty)" },
    { TP_NOW, "--now", "YYYY-MM-DD", CLI_VALUE, "the date strftime_now() sees (default: today; env KVLLM_TEMPLATE_NOW)" },
    { TP_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_template_group = CLI_GROUP(NULL, k_template_opts);
static const struct cli_opt_group *const k_template_groups[] = { &k_template_group };

static const struct cli_cmd k_template_cmd = {
    .name = "template",
    .synopsis = "(-m MODEL | --template FILE) --messages JSON_FILE [--add-generation-prompt]\n"
                "                      [--tools JSON_FILE] [--bos TEXT] [--eos TEXT] [--now YYYY-MM-DD]",
    .groups = CLI_GROUPS(k_template_groups),
    .n_own = 1,
    .notes = "  output: the rendered prompt on stdout, byte for byte\n",
};

void cmd_template_markdown(FILE *f) { cli_cmd_markdown(&k_template_cmd, f); }

struct opts {
    const char *model, *template_path, *messages, *bos, *eos, *now, *tools;
    bool add_gen;
};

/* 0 ok, 1 help printed, 2 usage error (reported). */
static int parse_args(int argc, char **argv, struct opts *o) {
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const struct cli_opt *op;
        const char *v;
        if (cli_cmd_next(&k_template_cmd, argc, argv, &i, &op, &v) < 0) return 2;
        switch (op->id) {
        case TP_HELP: cli_cmd_usage(&k_template_cmd, stdout); return 1;
        case TP_MODEL: o->model = v; break;
        case TP_TEMPLATE: o->template_path = v; break;
        case TP_MESSAGES: o->messages = v; break;
        case TP_TOOLS: o->tools = v; break;
        case TP_ADD_GEN: o->add_gen = true; break;
        case TP_BOS: o->bos = v; break;
        case TP_EOS: o->eos = v; break;
        case TP_NOW: o->now = v; break;
        }
    }
    if (!cli_opt_end()) return 2;
    if (!o->model && !o->template_path) { cli_error("template: give -m MODEL or --template FILE"); return 2; }
    if (!o->messages) { cli_error("template: --messages FILE is required"); return 2; }
    if (o->model && (o->bos || o->eos)) {
        cli_error("template: --bos/--eos apply to --template without -m (a model brings its own)");
        return 2;
    }
    return 0;
}

/* A JSON string field as a C string; NULL for JSON null; *ok false when
 * the field has another type or a NUL inside (reported). */
static const char *string_field(struct json_object *msg, const char *key, int idx, bool *ok) {
    struct json_object *v;
    if (!json_object_object_get_ex(msg, key, &v)) {
        cli_error("template: message %d has no \"%s\"", idx, key);
        *ok = false;
        return NULL;
    }
    if (json_object_is_type(v, json_type_null)) return NULL;
    if (!json_object_is_type(v, json_type_string)) {
        cli_error("template: message %d: \"%s\" must be a string or null", idx, key);
        *ok = false;
        return NULL;
    }
    const char *s = json_object_get_string(v);
    if ((size_t)json_object_get_string_len(v) != strlen(s)) {
        cli_error("template: message %d: \"%s\" contains a NUL character", idx, key);
        *ok = false;
    }
    return s;
}

/* Parse the conversation; *msgs points into root (json_object_put(root) frees it).
 * Returns the count, or -1 (reported). */
static int read_messages(const char *path, struct json_object **root, struct kvllm_chat_message **msgs) {
    size_t len;
    char *text = cli_read_file(path, &len);
    if (!text) return -1;
    enum json_tokener_error jerr = json_tokener_success;
    struct json_tokener *tok = json_tokener_new();
    *root = tok ? json_tokener_parse_ex(tok, text, (int)len) : NULL;
    if (tok) jerr = json_tokener_get_error(tok);
    bool trailing = tok && *root && (size_t)json_tokener_get_parse_end(tok) != len;
    json_tokener_free(tok);
    free(text);
    if (!*root || jerr != json_tokener_success || trailing) {
        cli_error("%s: not valid JSON (%s)", path, trailing ? "text after the value" : json_tokener_error_desc(jerr));
        json_object_put(*root);
        *root = NULL;
        return -1;
    }
    if (!json_object_is_type(*root, json_type_array)) {
        cli_error("%s: expected a JSON array of messages", path);
        return -1;
    }
    int n = (int)json_object_array_length(*root);
    *msgs = calloc((size_t)n + 1, sizeof **msgs);
    if (!*msgs) { cli_error("out of memory"); return -1; }
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        struct json_object *m = json_object_array_get_idx(*root, (size_t)i);
        if (!json_object_is_type(m, json_type_object)) {
            cli_error("%s: message %d is not an object", path, i);
            ok = false;
            break;
        }
        json_object_object_foreach(m, key, val) {
            (void)val;
            if (strcmp(key, "role") && strcmp(key, "content") && strcmp(key, "tool_calls") &&
                strcmp(key, "tool_call_id") && strcmp(key, "name")) {
                cli_error("%s: message %d: only \"role\", \"content\", \"tool_calls\", \"tool_call_id\" and "
                          "\"name\" are supported, not \"%s\"", path, i, key);
                ok = false;
            }
        }
        if (!ok) break;
        (*msgs)[i].role = string_field(m, "role", i, &ok);
        if (ok && !(*msgs)[i].role) { cli_error("%s: message %d: \"role\" is null", path, i); ok = false; }
        if (ok) (*msgs)[i].content = string_field(m, "content", i, &ok);
        struct json_object *v;
        if (ok && json_object_object_get_ex(m, "tool_calls", &v)) {
            if (!json_object_is_type(v, json_type_array)) {
                cli_error("%s: message %d: \"tool_calls\" must be an array", path, i);
                ok = false;
            } else {   /* the library takes it as JSON text; the string lives in v */
                (*msgs)[i].tool_calls = json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
            }
        }
        if (ok && json_object_object_get_ex(m, "tool_call_id", &v))
            (*msgs)[i].tool_call_id = string_field(m, "tool_call_id", i, &ok);
        if (ok && json_object_object_get_ex(m, "name", &v)) (*msgs)[i].name = string_field(m, "name", i, &ok);
    }
    return ok ? n : -1;
}

int cmd_template(int argc, char **argv) {
    struct opts o = { 0 };
    int prc = parse_args(argc, argv, &o);
    if (prc) return prc == 1 ? 0 : 2;
    struct json_object *root = NULL;
    struct kvllm_chat_message *msgs = NULL;
    char *tmpl = NULL, *out = NULL, *tools = NULL;
    size_t tmpl_len = 0, out_len = 0;
    int status = 1, rc = 0;
    int n = read_messages(o.messages, &root, &msgs);
    if (n < 0) goto done;
    if (o.template_path && !(tmpl = cli_read_file(o.template_path, &tmpl_len))) goto done;
    size_t tools_len = 0;
    if (o.tools && !(tools = cli_read_file(o.tools, &tools_len))) goto done;
    if (tools && strlen(tools) != tools_len) { cli_error("%s: the tools file contains a NUL byte", o.tools); goto done; }
    if (o.model) {
        /* the library reads the date from the environment */
        if (o.now && setenv("KVLLM_TEMPLATE_NOW", o.now, 1)) { cli_error("cannot set KVLLM_TEMPLATE_NOW"); goto done; }
        if (tmpl && strlen(tmpl) != tmpl_len) {
            cli_error("%s: the template contains a NUL byte", o.template_path);
            goto done;
        }
        kvllm_log_set_level(KVLLM_LOG_WARN);
        struct kvllm_model_params mp = kvllm_model_default_params();
        struct kvllm_model *m = NULL;
        rc = cli_model_open(o.model, &mp, &m);
        struct kvllm_chat_opts co = { .add_generation_prompt = o.add_gen, .tools = tools };
        if (!rc) rc = kvllm_chat_render_ex(m, tmpl, msgs, n, &co, &out);
        if (!rc) out_len = strlen(out);
        kvllm_model_free(m);
    } else {
        struct chat_template_params p = {
            .msgs = msgs, .n_msgs = n, .add_generation_prompt = o.add_gen,
            .bos_token = o.bos, .eos_token = o.eos, .now = o.now, .tools = tools,
        };
        rc = chat_template_render(tmpl, tmpl_len, &p, &out, &out_len);
    }
    if (rc) goto done;
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout)) {
        cli_error("cannot write the output");
        goto done;
    }
    status = 0;
done:
    free(out);
    free(tmpl);
    free(tools);
    free(msgs);
    json_object_put(root);
    return status;
}
