/* json_schema.c — JSON Schema to GBNF (in progress). */
#include "grammar/grammar_internal.h"
#include "core/core.h"

#include <stdio.h>

/* Any JSON value, llama.cpp's json-schema-to-grammar primitives with bounded whitespace. */
static const char k_json_gbnf[] =
    "root ::= object\n"
    "value ::= object | array | string | number | (\"true\" | \"false\" | \"null\") space\n"
    "object ::= \"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? \"}\" space\n"
    "array ::= \"[\" space ( value (\",\" space value)* )? \"]\" space\n"
    "string ::= \"\\\"\" char* \"\\\"\" space\n"
    "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [0-9]{0,15})? space\n"
    "space ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

int kvllm_grammar_json_object(struct kvllm_grammar **out) {
    return gbnf_parse(k_json_gbnf, out, NULL, 0);
}

int kvllm_grammar_from_json_schema(const char *schema_json, bool strict, struct kvllm_grammar **out, char *err,
                                   size_t err_cap) {
    (void)schema_json;
    (void)strict;
    *out = NULL;
    if (err && err_cap) snprintf(err, err_cap, "JSON Schema grammars are not implemented yet");
    LOG_ERR("grammar: JSON Schema grammars are not implemented yet");
    return KVLLM_EUNSUPPORTED;
}
