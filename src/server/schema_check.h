/* schema_check.h — does a parsed JSON value satisfy a JSON Schema?  For the
 * arguments of a tool call the model wrote under tool_choice auto (which no
 * grammar constrained): a call whose arguments break the declared
 * parameters is not returned as a call.
 *
 * The subset checked: type (a name or a list; "integer" is a number without
 * a fraction), enum, const, properties, required, additionalProperties
 * (false or a schema), items (one schema), minItems / maxItems, minimum /
 * maximum / exclusiveMinimum / exclusiveMaximum (numbers), minLength /
 * maxLength (code points), anyOf / oneOf / allOf, and local $ref
 * ("#/$defs/x", "#/definitions/x").  Other keywords are not checked: a value
 * is refused only for a keyword of this list it breaks.  Recursion is
 * bounded (SCHEMA_CHECK_DEPTH): past it a value is refused. */
#ifndef KVLLM_SERVER_SCHEMA_CHECK_H
#define KVLLM_SERVER_SCHEMA_CHECK_H

#include <stdbool.h>
#include <stddef.h>

struct json_object;

#define SCHEMA_CHECK_DEPTH 64

/* true when v satisfies schema (NULL or true: anything).  On false, why
 * (may be NULL) gets the path and the keyword, "$.age: type integer". */
bool schema_check(struct json_object *schema, struct json_object *v, char *why, size_t why_cap);

#endif
