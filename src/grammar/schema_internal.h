/* schema_internal.h — the JSON Schema compiler's shared state, split by
 * concern over five files:
 *   json_schema.c    the walk: keywords checked, $ref, anyOf/oneOf, enum/const,
 *                    the type(s) meant; the two public entry points
 *   schema_emit.c    text (GBNF literals, JSON escapes), the rule table
 *                    (unique names, bodies), the shared primitives, the output
 *   schema_number.c  integer and number bounds as digit-range rules
 *   schema_string.c  minLength/maxLength, formats, and pattern (a regex subset)
 *   schema_object.c  objects (properties, required, additional properties) and arrays
 *
 * Model of the world: every (sub)schema becomes one rule, named after its
 * JSON path; primitives (string, number, space, ...) are shared rules.  The
 * shapes follow llama.cpp's json-schema-to-grammar, with its bounded
 * whitespace (`space` is nothing, one space, or a newline and up to 20
 * spaces/tabs) and bounded number digits, so a model cannot spin forever.
 *
 * Errors: the first failure is kept in schema_ctx.rc (with its message,
 * prefixed by the JSON path, in err); every rule maker returns NULL once rc
 * is set, and later failures are not reported.  Rule names a maker returns
 * are owned by the rule table and stay valid while the context lives. */
#ifndef KVLLM_GRAMMAR_SCHEMA_INTERNAL_H
#define KVLLM_GRAMMAR_SCHEMA_INTERNAL_H

#include "grammar/grammar_internal.h"
#include "core/strbuf.h"

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JS_MAX_DEPTH 64
#define JS_MAX_REPEAT 1000   /* largest minItems/maxItems/minLength/maxLength expanded */
#define JS_INT_DIGITS 16     /* an unbounded integer part has at most this many digits (as llama.cpp) */
#define JS_MAX_GBNF (16 << 20)   /* GBNF text one schema may compile to (the compile's budget) */
#define JS_MAX_KEY 1024      /* bytes of a property name beside additional properties (a rule per byte) */
#define JS_MAX_PATH 512      /* bytes of a JSON path (longer paths are cut) */

/* ---- text (schema_emit.c), into a core strbuf ---- */

/* A GBNF string literal of the bytes s[0..n). */
void schema_put_literal(struct strbuf *b, const char *s, size_t n);
/* s[0..n) as it reads inside a JSON string (escaped). */
void schema_put_json_escaped(struct strbuf *b, const char *s, size_t n);
/* A code point as a GBNF character-class member (escaped). */
void schema_put_class_cp(struct strbuf *b, uint32_t cp);
/* "X{m,n}" of an expression (mx < 0: unbounded). */
void schema_put_repeat(struct strbuf *b, const char *x, long mn, long mx);
/* The code point starting at s[*i] (s of n bytes; not validated), *i moved past it. */
uint32_t schema_utf8_next(const char *s, size_t *i, size_t n);

/* ---- the compile's state ---- */

struct schema_rule {
    char *name, *body;
    int next_suffix;   /* the next "-N" to try for another rule of this name */
};

struct schema_ref {
    char *ref, *rule;   /* a $ref and the rule reserved for it */
};

struct schema_ctx {
    struct schema_rule *rules;   /* (n_rules) in order of creation */
    int n_rules, cap_rules;
    struct gnames names;         /* rule name -> index */
    size_t n_text;               /* GBNF bytes made so far (the budget: JS_MAX_GBNF) */
    struct schema_ref *refs;     /* (n_refs) */
    int n_refs, cap_refs;
    struct gnames ref_names;     /* $ref -> index in refs */
    json_object *root;           /* the whole schema ($ref targets are found from it) */
    bool strict;                 /* absent additionalProperties means false */
    int rc;                      /* the first failure (0: none) */
    char *err;                   /* (err_cap) its message, "path: what" */
    size_t err_cap;
    int depth;                   /* schemas being visited (JS_MAX_DEPTH) */
};

/* Record the first failure (later ones are dropped) and log it. */
void schema_fail(struct schema_ctx *c, int rc, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void schema_ctx_free(struct schema_ctx *c);

/* ---- rules (schema_emit.c) ---- */

/* Add a rule; its name is `hint` made GBNF-safe and unique.  Returns the
 * name (owned by the table) or NULL (c->rc set). */
const char *schema_rule_add(struct schema_ctx *c, const char *hint, const char *body);
/* Replace the body of an existing rule (a $ref reserved before its target was visited). */
void schema_rule_set_body(struct schema_ctx *c, const char *name, const char *body);
/* The table's copy of a rule name, or NULL when there is no such rule. */
const char *schema_rule_find_name(struct schema_ctx *c, const char *name);
/* A shared primitive (space, char, string, number, value, date, ...) with
 * those it uses, added on first use; returns its name. */
const char *schema_prim(struct schema_ctx *c, const char *name);
/* The GBNF text: "root ::= top" and every rule (caller frees), or NULL (c->rc set). */
char *schema_gbnf(struct schema_ctx *c, const char *top);

/* ---- the walk (json_schema.c) ---- */

/* Paths are buffers of JS_MAX_PATH bytes; a maker appends a segment, visits,
 * and cuts the path back to plen before it returns. */
void schema_path_push(char *path, size_t *len, const char *fmt, const char *arg);
/* The rule of a subschema s, or NULL (c->rc set). */
const char *schema_visit(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen);
/* A non-negative integer keyword into *out (capped at 10^6): false when
 * absent, or when malformed (c->rc set). */
bool schema_get_count(struct schema_ctx *c, json_object *s, const char *key, long *out, const char *path);

/* ---- one rule per type; each returns the rule's name or NULL (c->rc set) ---- */

const char *schema_object_rule(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen);
const char *schema_array_rule(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen);
const char *schema_string_rule(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen);
const char *schema_integer_rule(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen);
const char *schema_number_rule(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen);

#endif
