/* grammar_internal.h — the compiled form of a grammar, shared by the GBNF
 * parser (gbnf.c), the JSON Schema compiler (json_schema.c) and the matcher
 * (matcher.c).
 *
 * A grammar is llama.cpp's representation: every rule is a run of elements
 * in one flat array, its alternatives separated by G_ALT and the rule closed
 * by G_END.  A character class is one G_CHAR / G_CHAR_NOT element followed
 * by G_CHAR_ALT (another char) and G_CHAR_RNG_UPPER (closes a range begun
 * by the element before it) elements; "." is G_CHAR_ANY.  Repetitions were
 * rewritten by the parser into generated rules, so the matcher sees only
 * sequences, alternatives and rule references. */
#ifndef KVLLM_GRAMMAR_INTERNAL_H
#define KVLLM_GRAMMAR_INTERNAL_H

#include "kvllm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum gelem_type {
    G_END = 0,         /* end of the rule */
    G_ALT,             /* start of another alternative */
    G_RULE_REF,        /* value: rule id */
    G_CHAR,            /* value: code point; starts a positive class */
    G_CHAR_NOT,        /* value: code point; starts a negated class */
    G_CHAR_RNG_UPPER,  /* value: upper bound of the range begun by the previous element */
    G_CHAR_ALT,        /* value: another code point of the class */
    G_CHAR_ANY,        /* any code point */
};

struct gelem {
    uint32_t type;   /* enum gelem_type */
    uint32_t value;
};

struct kvllm_grammar {
    atomic_int refs;
    struct gelem *elems;     /* (n_elems) all rules, each ended by G_END */
    uint32_t n_elems;
    uint32_t *rule_start;    /* (n_rules) index of each rule's first element */
    uint32_t n_rules;
    uint32_t root;           /* the start rule */
    char *gbnf;              /* the GBNF text it was compiled from (owned; for --print-gbnf) */
    /* The one mutable part: masks' context cache shared by every matcher of this grammar over one
     * vocabulary (matcher.c), so a context computed for one request serves the next.  Created by the
     * first gmatcher_new, guarded by lock, freed with the grammar. */
    pthread_mutex_t lock;
    struct gshared *shared;
};

void gshared_free(struct gshared *s);

/* What one grammar may hold: compiling costs time linear in its size, and a
 * grammar past these is refused (KVLLM_ERANGE) before anything is built, so
 * a request's compile is bounded whatever its body says. */
#define GRAMMAR_MAX_RULES (1u << 17)
#define GRAMMAR_MAX_ELEMS (1u << 20)
/* Stacks a rule may begin at once (its alternatives, through the rules that
 * start them): the matcher holds this many stacks in one set, so a rule
 * wider than this could never be matched (an object of thousands of
 * optional properties, an enum of thousands of values). */
#define GRAMMAR_MAX_WIDTH 1024
/* Rules entered before a first character (the matcher and the checks
 * recurse through them). */
#define GRAMMAR_MAX_LEAD 1024

/* Names to values by hash (FNV-1a, linear probing): the rule tables of the
 * GBNF parser and the JSON Schema compiler, so a lookup is O(1) and a
 * grammar of many rules compiles in linear time.  Keys are not copied: each
 * must stay valid (and unchanged) while the table is used. */
struct gname_slot {
    const char *key;   /* NULL: empty */
    uint32_t len, hash, value;
};
struct gnames {
    struct gname_slot *slot;   /* (cap) cap a power of two, at most half full */
    uint32_t cap, n;
};
/* The value of key[0..len), or -1 when absent. */
int64_t gnames_get(const struct gnames *t, const char *key, size_t len);
/* Add key[0..len) (absent) with value; false when memory runs out. */
bool gnames_put(struct gnames *t, const char *key, size_t len, uint32_t value);
void gnames_free(struct gnames *t);

/* Parse GBNF text into a new grammar (refs = 1).  err gets "line:col: what". */
int gbnf_parse(const char *text, struct kvllm_grammar **out, char *err, size_t err_cap);

/* A regular expression's language as one GBNF expression (regex.c),
 * matching output text as it is (REGEX_TEXT), or the inside of a JSON
 * string as JSON spells it (REGEX_JSON_STRING: a pattern's newline matches
 * the two characters \n; "." and negated classes match only characters the
 * string holds unescaped).  A leading '^' and a trailing '$' are taken off
 * and reported in *anchors.  Appends to out; returns 0, or KVLLM_EINVAL /
 * KVLLM_EUNSUPPORTED / KVLLM_ERANGE / KVLLM_ENOMEM with "regex offset N:
 * what" in err. */
struct strbuf;
enum regex_target { REGEX_TEXT, REGEX_JSON_STRING };
struct regex_anchors {
    bool start, end;
};
int regex_gbnf_expr(const char *pattern, size_t n, enum regex_target target, struct strbuf *out,
                    struct regex_anchors *anchors, char *err, size_t err_cap);

/* Decode one UTF-8 byte into a running state.  n_remain: bytes still missing
 * (0: *cp holds a complete code point), -1: invalid. */
struct gutf8 {
    uint32_t value;
    int32_t n_remain;
};

#endif
