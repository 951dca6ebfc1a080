/* gbnf.c — llama.cpp's GBNF grammar text into the compiled form.
 *
 * Follows llama.cpp's parser (src/llama-grammar.cpp) rule for rule, so a
 * .gbnf file means here what it means there: rules `name ::= alternates`
 * ended by a newline; inside parentheses and after `|` newlines are spaces;
 * `#` comments; string literals and character classes with the escapes
 * \xHH \uHHHH \UHHHHHHHH \t \r \n \\ \" \[ \]; `.`; and the repetition
 * operators * + ? {m} {m,} {m,n}, each rewritten into generated rules as
 * llama.cpp rewrites them (S{m,n} = S repeated m times, then a chain of
 * n-m optional rules).  Errors carry "line:col"; an undefined rule, a
 * missing root and left recursion (also through rules that can match
 * nothing) are refused, and so is a grammar past the sizes of
 * grammar_internal.h (rules, elements, a rule's width, rules entered before
 * a first character): every step here is linear in the text and the
 * elements made, so that bound is a bound on the time. */
#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"
#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GBNF_MAX_REPEAT 2000   /* llama.cpp's MAX_REPETITION_THRESHOLD */
#define GBNF_MAX_NEST 512      /* parentheses deep: the parser recurses */

struct gvec {
    struct gelem *e;
    uint32_t n, cap;
};

struct grule {
    char *name;
    struct gvec body;
    bool defined;
    uint32_t ref_off;  /* where it was first referenced (for "undefined rule") */
};

struct gparser {
    const char *text;
    struct grule *rules;
    uint32_t n_rules, cap_rules;
    struct gnames names;   /* rule name -> id */
    uint32_t n_elems;      /* elements made so far (the budget: GRAMMAR_MAX_ELEMS) */
    int rc;            /* first error */
    char *err;
    size_t err_cap;
    int depth;
};

static void where(const char *text, const char *pos, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *p = text; p < pos && *p; p++) {
        if (*p == '\n') { (*line)++; *col = 1; }
        else (*col)++;
    }
}

__attribute__((format(printf, 4, 5)))
static const char *fail(struct gparser *p, int rc, const char *pos, const char *fmt, ...) {
    if (p->rc) return NULL;
    p->rc = rc;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (pos) {
        int line, col;
        where(p->text, pos, &line, &col);
        if (p->err && p->err_cap) snprintf(p->err, p->err_cap, "%d:%d: %s", line, col, msg);
        LOG_ERR("grammar: %d:%d: %s", line, col, msg);
    } else {
        if (p->err && p->err_cap) snprintf(p->err, p->err_cap, "%s", msg);
        LOG_ERR("grammar: %s", msg);
    }
    return NULL;
}

static bool vec_push(struct gparser *p, struct gvec *v, uint32_t type, uint32_t value) {
    if (++p->n_elems > GRAMMAR_MAX_ELEMS) {
        fail(p, KVLLM_ERANGE, NULL, "the grammar is too large: more than %u elements once its repetitions are "
             "expanded", GRAMMAR_MAX_ELEMS);
        return false;
    }
    if (v->n == v->cap) {
        uint32_t cap = v->cap ? v->cap * 2 : 16;
        struct gelem *e = realloc(v->e, cap * sizeof *e);
        if (!e) { fail(p, KVLLM_ENOMEM, NULL, "out of memory"); return false; }
        v->e = e;
        v->cap = cap;
    }
    v->e[v->n++] = (struct gelem){ type, value };
    return true;
}

static bool vec_append(struct gparser *p, struct gvec *v, const struct gelem *e, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (!vec_push(p, v, e[i].type, e[i].value)) return false;
    return true;
}

/* The id of a rule by name, created (undefined) on first use; UINT32_MAX on ENOMEM. */
static uint32_t symbol(struct gparser *p, const char *name, size_t len, const char *at) {
    int64_t id = gnames_get(&p->names, name, len);
    if (id >= 0) return (uint32_t)id;
    if (p->n_rules >= GRAMMAR_MAX_RULES) {
        fail(p, KVLLM_ERANGE, at, "the grammar is too large: more than %u rules once its groups and repetitions "
             "are expanded", GRAMMAR_MAX_RULES);
        return UINT32_MAX;
    }
    if (p->n_rules == p->cap_rules) {
        uint32_t cap = p->cap_rules ? p->cap_rules * 2 : 32;
        struct grule *r = realloc(p->rules, cap * sizeof *r);
        if (!r) { fail(p, KVLLM_ENOMEM, NULL, "out of memory"); return UINT32_MAX; }
        p->rules = r;
        p->cap_rules = cap;
    }
    struct grule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    r->name = malloc(len + 1);
    if (!r->name) { fail(p, KVLLM_ENOMEM, NULL, "out of memory"); return UINT32_MAX; }
    memcpy(r->name, name, len);
    r->name[len] = 0;
    r->ref_off = (uint32_t)(at - p->text);
    if (!gnames_put(&p->names, r->name, len, p->n_rules)) {
        free(r->name);
        fail(p, KVLLM_ENOMEM, NULL, "out of memory");
        return UINT32_MAX;
    }
    return p->n_rules++;
}

/* A fresh rule named base_N (llama.cpp's generate_symbol_id). */
static uint32_t gen_symbol(struct gparser *p, const char *base, const char *at) {
    char name[300];
    snprintf(name, sizeof name, "%.200s_%u", base, p->n_rules);
    return symbol(p, name, strlen(name), at);
}

static bool define(struct gparser *p, uint32_t id, struct gvec *body) {
    struct grule *r = &p->rules[id];
    free(r->body.e);   /* a rule defined twice: the last definition wins, as in llama.cpp */
    r->body = *body;
    r->defined = true;
    *body = (struct gvec){ 0 };
    return true;
}

static bool is_word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static const char *parse_space(const char *pos, bool newline_ok) {
    while (*pos) {
        if (*pos == ' ' || *pos == '\t' || (newline_ok && (*pos == '\r' || *pos == '\n'))) {
            pos++;
        } else if (*pos == '#') {
            while (*pos && *pos != '\r' && *pos != '\n') pos++;
        } else {
            break;
        }
    }
    return pos;
}

static const char *parse_name(struct gparser *p, const char *pos) {
    const char *s = pos;
    while (is_word_char(*pos)) pos++;
    if (pos == s) return fail(p, KVLLM_EINVAL, s, "expecting name");
    return pos;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One UTF-8 code point of the source text (invalid bytes are taken as they are, as llama.cpp does). */
static const char *decode_utf8_src(const char *src, uint32_t *cp) {
    static const int lookup[] = { 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4 };
    uint8_t first = (uint8_t)*src;
    int len = lookup[first >> 4];
    if (len == 0) len = 1;
    static const uint8_t mask[] = { 0, 0x7F, 0x1F, 0x0F, 0x07 };
    uint32_t v = first & mask[len];
    const char *pos = src + 1;
    for (int i = 1; i < len && *pos; i++, pos++) v = (v << 6) | ((uint8_t)*pos & 0x3F);
    *cp = v;
    return pos;
}

static const char *parse_char(struct gparser *p, const char *src, uint32_t *cp) {
    if (src[0] != '\\') return decode_utf8_src(src, cp);
    int nhex = 0;
    switch (src[1]) {
    case 'x': nhex = 2; break;
    case 'u': nhex = 4; break;
    case 'U': nhex = 8; break;
    case 't': *cp = '\t'; return src + 2;
    case 'r': *cp = '\r'; return src + 2;
    case 'n': *cp = '\n'; return src + 2;
    case '\\': case '"': case '[': case ']': *cp = (uint8_t)src[1]; return src + 2;
    default: return fail(p, KVLLM_EINVAL, src, "unknown escape '\\%c'", src[1] ? src[1] : ' ');
    }
    uint32_t v = 0;
    const char *pos = src + 2;
    for (int i = 0; i < nhex; i++, pos++) {
        int h = hexval(*pos);
        if (h < 0) return fail(p, KVLLM_EINVAL, src, "expecting %d hex chars", nhex);
        v = (v << 4) | (uint32_t)h;
    }
    *cp = v;
    return pos;
}

static const char *parse_alternates(struct gparser *p, const char *src, const char *rule_name, uint32_t rule_id,
                                    bool nested);

/* S{min,max} (max < 0: unbounded) applied to rule->e[last_start..]. */
static bool repeat(struct gparser *p, struct gvec *rule, uint32_t last_start, const char *rule_name, int min_times,
                   int max_times, const char *at) {
    if (last_start == rule->n) { fail(p, KVLLM_EINVAL, at, "expecting preceding item to */+/?/{"); return false; }
    if (min_times > GBNF_MAX_REPEAT || max_times > GBNF_MAX_REPEAT) {
        fail(p, KVLLM_EINVAL, at, "number of repetitions exceeds %d", GBNF_MAX_REPEAT);
        return false;
    }
    if (max_times >= 0 && max_times < min_times) {
        fail(p, KVLLM_EINVAL, at, "repetition {%d,%d}: max below min", min_times, max_times);
        return false;
    }
    uint32_t n_prev = rule->n - last_start;
    struct gelem *prev = malloc(n_prev * sizeof *prev);
    if (!prev) { fail(p, KVLLM_ENOMEM, NULL, "out of memory"); return false; }
    memcpy(prev, rule->e + last_start, n_prev * sizeof *prev);
    bool ok = true;
    if (min_times == 0) rule->n = last_start;
    else
        for (int i = 1; i < min_times && ok; i++) ok = vec_append(p, rule, prev, n_prev);
    uint32_t last_rec = 0;
    int n_opt = max_times < 0 ? 1 : max_times - min_times;
    for (int i = 0; i < n_opt && ok; i++) {
        struct gvec rec = { 0 };
        uint32_t rec_id = gen_symbol(p, rule_name, at);
        ok = rec_id != UINT32_MAX && vec_append(p, &rec, prev, n_prev);
        if (ok && (i > 0 || max_times < 0)) ok = vec_push(p, &rec, G_RULE_REF, max_times < 0 ? rec_id : last_rec);
        ok = ok && vec_push(p, &rec, G_ALT, 0) && vec_push(p, &rec, G_END, 0);
        if (ok) define(p, rec_id, &rec);
        free(rec.e);
        last_rec = rec_id;
    }
    if (ok && n_opt > 0) ok = vec_push(p, rule, G_RULE_REF, last_rec);
    free(prev);
    return ok;
}

static const char *parse_int(const char *pos, int *v) {
    long x = 0;
    while (is_digit(*pos)) {
        if (x < 1000000) x = x * 10 + (*pos - '0');
        pos++;
    }
    *v = (int)x;
    return pos;
}

static const char *parse_sequence(struct gparser *p, const char *src, const char *rule_name, struct gvec *rule,
                                  bool nested) {
    uint32_t last_start = rule->n;
    const char *pos = src;
    while (*pos) {
        if (*pos == '"') {
            pos++;
            last_start = rule->n;
            while (*pos != '"') {
                if (!*pos) return fail(p, KVLLM_EINVAL, pos, "unexpected end of input");
                uint32_t cp;
                if (!(pos = parse_char(p, pos, &cp)) || !vec_push(p, rule, G_CHAR, cp)) return NULL;
            }
            pos = parse_space(pos + 1, nested);
        } else if (*pos == '[') {
            pos++;
            uint32_t start_type = G_CHAR;
            if (*pos == '^') { pos++; start_type = G_CHAR_NOT; }
            last_start = rule->n;
            while (*pos != ']') {
                if (!*pos) return fail(p, KVLLM_EINVAL, pos, "unexpected end of input");
                uint32_t cp;
                if (!(pos = parse_char(p, pos, &cp))) return NULL;
                if (!vec_push(p, rule, last_start < rule->n ? G_CHAR_ALT : start_type, cp)) return NULL;
                if (pos[0] == '-' && pos[1] != ']') {
                    if (!pos[1]) return fail(p, KVLLM_EINVAL, pos, "unexpected end of input");
                    if (!(pos = parse_char(p, pos + 1, &cp)) || !vec_push(p, rule, G_CHAR_RNG_UPPER, cp))
                        return NULL;
                }
            }
            pos = parse_space(pos + 1, nested);
        } else if (is_word_char(*pos)) {
            const char *end = parse_name(p, pos);
            uint32_t id = symbol(p, pos, (size_t)(end - pos), pos);
            if (id == UINT32_MAX) return NULL;
            pos = parse_space(end, nested);
            last_start = rule->n;
            if (!vec_push(p, rule, G_RULE_REF, id)) return NULL;
        } else if (*pos == '(') {
            if (++p->depth > GBNF_MAX_NEST) return fail(p, KVLLM_EINVAL, pos, "groups nested too deep");
            const char *open = pos;
            pos = parse_space(pos + 1, true);
            uint32_t sub = gen_symbol(p, rule_name, open);
            if (sub == UINT32_MAX) return NULL;
            if (!(pos = parse_alternates(p, pos, rule_name, sub, true))) return NULL;
            last_start = rule->n;
            if (!vec_push(p, rule, G_RULE_REF, sub)) return NULL;
            if (*pos != ')') return fail(p, KVLLM_EINVAL, pos, "expecting ')'");
            p->depth--;
            pos = parse_space(pos + 1, nested);
        } else if (*pos == '.') {
            last_start = rule->n;
            if (!vec_push(p, rule, G_CHAR_ANY, 0)) return NULL;
            pos = parse_space(pos + 1, nested);
        } else if (*pos == '*' || *pos == '+' || *pos == '?') {
            const char *at = pos;
            int mn = *pos == '+' ? 1 : 0, mx = *pos == '?' ? 1 : -1;
            pos = parse_space(pos + 1, nested);
            if (!repeat(p, rule, last_start, rule_name, mn, mx, at)) return NULL;
        } else if (*pos == '{') {
            const char *at = pos;
            pos = parse_space(pos + 1, nested);
            if (!is_digit(*pos)) return fail(p, KVLLM_EINVAL, pos, "expecting an int");
            int mn, mx = -1;
            pos = parse_space(parse_int(pos, &mn), nested);
            if (*pos == '}') {
                mx = mn;
                pos = parse_space(pos + 1, nested);
            } else if (*pos == ',') {
                pos = parse_space(pos + 1, nested);
                if (is_digit(*pos)) pos = parse_space(parse_int(pos, &mx), nested);
                if (*pos != '}') return fail(p, KVLLM_EINVAL, pos, "expecting '}'");
                pos = parse_space(pos + 1, nested);
            } else {
                return fail(p, KVLLM_EINVAL, pos, "expecting ','");
            }
            if (!repeat(p, rule, last_start, rule_name, mn, mx, at)) return NULL;
        } else {
            break;
        }
    }
    return pos;
}

static const char *parse_alternates(struct gparser *p, const char *src, const char *rule_name, uint32_t rule_id,
                                    bool nested) {
    struct gvec rule = { 0 };
    const char *pos = parse_sequence(p, src, rule_name, &rule, nested);
    while (pos && *pos == '|') {
        if (!vec_push(p, &rule, G_ALT, 0)) { pos = NULL; break; }
        pos = parse_space(pos + 1, true);
        pos = parse_sequence(p, pos, rule_name, &rule, nested);
    }
    if (pos && vec_push(p, &rule, G_END, 0)) define(p, rule_id, &rule);
    else pos = NULL;
    free(rule.e);
    return pos;
}

static const char *parse_rule(struct gparser *p, const char *src) {
    const char *name_end = parse_name(p, src);
    if (!name_end) return NULL;
    const char *pos = parse_space(name_end, false);
    size_t len = (size_t)(name_end - src);
    uint32_t id = symbol(p, src, len, src);
    if (id == UINT32_MAX) return NULL;
    if (!(pos[0] == ':' && pos[1] == ':' && pos[2] == '=')) return fail(p, KVLLM_EINVAL, pos, "expecting ::=");
    pos = parse_space(pos + 3, true);
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(len < 200 ? len : 200), src);
    p->depth = 0;
    if (!(pos = parse_alternates(p, pos, name, id, false))) return NULL;
    if (*pos == '\r') pos += pos[1] == '\n' ? 2 : 1;
    else if (*pos == '\n') pos++;
    else if (*pos) return fail(p, KVLLM_EINVAL, pos, "expecting newline or end");
    return parse_space(pos, true);
}

/* ---- checks on the whole grammar ---- */

static bool is_char_start(uint32_t type) { return type == G_CHAR || type == G_CHAR_NOT || type == G_CHAR_ANY; }

/* Which rules can match nothing, in time linear in the elements (a fixpoint
 * that sweeps every rule until nothing changes is quadratic on a chain of
 * rules).  An alternative without a character is nullable once every rule
 * it references is: each alternative counts its references not yet known
 * nullable, and each rule found nullable is queued once and counts down the
 * alternatives that reference it. */
static int find_nullable(const struct gparser *p, bool *nullable) {
    uint32_t n_alts = 0, n_refs = 0;
    for (uint32_t r = 0; r < p->n_rules; r++)
        for (uint32_t i = 0; i < p->rules[r].body.n; i++) {
            uint32_t t = p->rules[r].body.e[i].type;
            n_alts += t == G_END || t == G_ALT;
            n_refs += t == G_RULE_REF;
        }
    const uint32_t HAS_CHAR = UINT32_MAX;
    uint32_t *alt_rule = malloc(((size_t)n_alts + 1) * sizeof *alt_rule);
    uint32_t *pending = calloc((size_t)n_alts + 1, sizeof *pending);
    uint32_t *head = calloc((size_t)p->n_rules + 1, sizeof *head);   /* references to rule t: occ[head[t]..head[t+1]) */
    uint32_t *occ = malloc(((size_t)n_refs + 1) * sizeof *occ);       /* the alternative of each reference */
    uint32_t *queue = malloc(((size_t)p->n_rules + 1) * sizeof *queue);
    int rc = alt_rule && pending && head && occ && queue ? 0 : KVLLM_ENOMEM;
    for (uint32_t r = 0, a = 0; !rc && r < p->n_rules; r++)
        for (uint32_t i = 0; i < p->rules[r].body.n; i++) {
            const struct gelem *e = &p->rules[r].body.e[i];
            if (e->type == G_RULE_REF) {
                head[e->value + 1]++;
                if (pending[a] != HAS_CHAR) pending[a]++;
            } else if (is_char_start(e->type)) {
                pending[a] = HAS_CHAR;
            } else if (e->type == G_END || e->type == G_ALT) {
                alt_rule[a++] = r;
            }
        }
    for (uint32_t t = 0; !rc && t < p->n_rules; t++) head[t + 1] += head[t];
    uint32_t n_queue = 0;
    for (uint32_t r = 0, a = 0; !rc && r < p->n_rules; r++)
        for (uint32_t i = 0; i < p->rules[r].body.n; i++) {
            const struct gelem *e = &p->rules[r].body.e[i];
            if (e->type == G_RULE_REF) occ[head[e->value]++] = a;   /* head[t] ends at head[t + 1]'s old value */
            else if (e->type == G_END || e->type == G_ALT) a++;
        }
    for (uint32_t t = p->n_rules; !rc && t > 0; t--) head[t] = head[t - 1];   /* back to the starts */
    if (!rc) head[0] = 0;
    for (uint32_t a = 0; !rc && a < n_alts; a++)
        if (pending[a] == 0 && !nullable[alt_rule[a]]) nullable[queue[n_queue++] = alt_rule[a]] = true;
    for (uint32_t q = 0; !rc && q < n_queue; q++) {
        const uint32_t t = queue[q];
        for (uint32_t k = head[t]; k < head[t + 1]; k++) {
            const uint32_t a = occ[k];
            if (pending[a] == HAS_CHAR || --pending[a] != 0 || nullable[alt_rule[a]]) continue;
            nullable[queue[n_queue++] = alt_rule[a]] = true;
        }
    }
    free(alt_rule);
    free(pending);
    free(head);
    free(occ);
    free(queue);
    return rc;
}

struct lead_check {
    struct gparser *p;
    const bool *nullable;
    uint8_t *colour;    /* (n_rules) 0 unvisited, 1 on the path, 2 done */
    uint32_t *width;    /* (n_rules) stacks the rule begins (done rules) */
};

/* Through the first elements of r's alternatives (skipping rules that can
 * match nothing), depth-first: a rule met again on the path is left
 * recursion; a path of more than GRAMMAR_MAX_LEAD rules, or a rule that
 * begins more than GRAMMAR_MAX_WIDTH stacks, is too large for the matcher.
 * Each rule is visited once. */
static int lead_dfs(struct lead_check *k, uint32_t r, uint32_t depth) {
    struct gparser *p = k->p;
    if (depth > GRAMMAR_MAX_LEAD) {
        fail(p, KVLLM_ERANGE, NULL, "the grammar is too large: rule '%s' is entered through more than %u rules "
             "before a first character", p->rules[r].name, GRAMMAR_MAX_LEAD);
        return KVLLM_ERANGE;
    }
    k->colour[r] = 1;
    const struct gvec *b = &p->rules[r].body;
    bool at_start = true;
    uint64_t w = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        const struct gelem *e = &b->e[i];
        if (e->type == G_END || e->type == G_ALT) {
            at_start = true;
        } else if (!at_start) {
            continue;
        } else if (e->type == G_RULE_REF) {
            if (k->colour[e->value] == 1) {
                fail(p, KVLLM_EINVAL, NULL, "left recursion in rule '%s' (through '%s')", p->rules[e->value].name,
                     p->rules[r].name);
                return KVLLM_EINVAL;
            }
            if (k->colour[e->value] == 0) {
                int rc = lead_dfs(k, e->value, depth + 1);
                if (rc) return rc;
            }
            w += k->width[e->value] ? k->width[e->value] : 1;   /* an empty rule is still a step */
            if (!k->nullable[e->value]) at_start = false;
        } else if (is_char_start(e->type)) {
            w++;
            at_start = false;
        }
    }
    if (w > GRAMMAR_MAX_WIDTH) {
        fail(p, KVLLM_ERANGE, NULL, "the grammar is too large: rule '%s' can begin %llu ways at once (its "
             "alternatives, through the rules that start them), the matcher follows at most %u (thousands of "
             "optional properties or enum values?)", p->rules[r].name, (unsigned long long)w, GRAMMAR_MAX_WIDTH);
        return KVLLM_ERANGE;
    }
    k->width[r] = (uint32_t)w;
    k->colour[r] = 2;
    return 0;
}

/* Nullable rules, then left recursion and the matcher's sizes. */
static int check_rules(struct gparser *p) {
    bool *nullable = calloc((size_t)p->n_rules + 1, sizeof *nullable);
    struct lead_check k = { p, nullable, calloc((size_t)p->n_rules + 1, 1),
                            calloc((size_t)p->n_rules + 1, sizeof *k.width) };
    int rc = nullable && k.colour && k.width ? find_nullable(p, nullable) : KVLLM_ENOMEM;
    for (uint32_t r = 0; !rc && r < p->n_rules; r++)
        if (!k.colour[r]) rc = lead_dfs(&k, r, 0);
    if (rc == KVLLM_ENOMEM) fail(p, rc, NULL, "out of memory");
    free(nullable);
    free(k.colour);
    free(k.width);
    return rc;
}

static void free_rules(struct gparser *p) {
    for (uint32_t i = 0; i < p->n_rules; i++) {
        free(p->rules[i].name);
        free(p->rules[i].body.e);
    }
    free(p->rules);
    gnames_free(&p->names);
}

int gbnf_parse(const char *text, struct kvllm_grammar **out, char *err, size_t err_cap) {
    *out = NULL;
    if (err && err_cap) err[0] = 0;
    struct gparser p = { .text = text, .err = err, .err_cap = err_cap };
    if (!text) { fail(&p, KVLLM_EINVAL, NULL, "no grammar text"); return KVLLM_EINVAL; }
    const char *pos = parse_space(text, true);
    while (pos && *pos) pos = parse_rule(&p, pos);
    int rc = p.rc;
    uint32_t root = UINT32_MAX;
    for (uint32_t i = 0; !rc && i < p.n_rules; i++) {
        if (!p.rules[i].defined) {
            fail(&p, KVLLM_EINVAL, text + p.rules[i].ref_off, "undefined rule '%s'", p.rules[i].name);
            rc = p.rc;
        }
        if (!strcmp(p.rules[i].name, "root")) root = i;
    }
    if (!rc && root == UINT32_MAX) rc = (fail(&p, KVLLM_EINVAL, NULL, "grammar does not contain a root rule"), p.rc);
    if (!rc) rc = check_rules(&p);
    struct kvllm_grammar *g = NULL;
    if (!rc) {
        g = calloc(1, sizeof *g);
        uint64_t n = 0;
        for (uint32_t r = 0; r < p.n_rules; r++) n += p.rules[r].body.n;
        if (g) {
            g->elems = malloc((size_t)n * sizeof *g->elems);
            g->rule_start = malloc(p.n_rules * sizeof *g->rule_start);
            g->gbnf = strdup(text);
        }
        if (!g || !g->elems || !g->rule_start || !g->gbnf || n > UINT32_MAX / 2) {
            rc = KVLLM_ENOMEM;
        } else {
            uint32_t k = 0;
            for (uint32_t r = 0; r < p.n_rules; r++) {
                g->rule_start[r] = k;
                memcpy(g->elems + k, p.rules[r].body.e, p.rules[r].body.n * sizeof *g->elems);
                k += p.rules[r].body.n;
            }
            g->n_elems = k;
            g->n_rules = p.n_rules;
            g->root = root;
            atomic_init(&g->refs, 1);
            pthread_mutex_init(&g->lock, NULL);
        }
    }
    free_rules(&p);
    if (rc) {
        if (rc == KVLLM_ENOMEM && err && err_cap && !err[0]) snprintf(err, err_cap, "out of memory");
        if (g) { free(g->elems); free(g->rule_start); free(g->gbnf); free(g); }
        return rc;
    }
    *out = g;
    return 0;
}

/* ---- the name table (grammar_internal.h) ---- */

int64_t gnames_get(const struct gnames *t, const char *key, size_t len) {
    if (!t->cap) return -1;
    const uint32_t h = hash_bytes(key, len), mask = t->cap - 1;
    for (uint32_t i = h & mask;; i = (i + 1) & mask) {
        const struct gname_slot *s = &t->slot[i];
        if (!s->key) return -1;
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len)) return s->value;
    }
}

static void gnames_place(struct gname_slot *slot, uint32_t cap, struct gname_slot v) {
    for (uint32_t i = v.hash & (cap - 1);; i = (i + 1) & (cap - 1))
        if (!slot[i].key) { slot[i] = v; return; }
}

bool gnames_put(struct gnames *t, const char *key, size_t len, uint32_t value) {
    if (len > UINT32_MAX) return false;
    if (2 * (t->n + 1) > t->cap) {
        uint32_t cap = t->cap ? 2 * t->cap : 64;
        struct gname_slot *slot = calloc(cap, sizeof *slot);
        if (!slot) return false;
        for (uint32_t i = 0; i < t->cap; i++)
            if (t->slot[i].key) gnames_place(slot, cap, t->slot[i]);
        free(t->slot);
        t->slot = slot;
        t->cap = cap;
    }
    gnames_place(t->slot, t->cap, (struct gname_slot){ key, (uint32_t)len, hash_bytes(key, len), value });
    t->n++;
    return true;
}

void gnames_free(struct gnames *t) {
    free(t->slot);
    *t = (struct gnames){ 0 };
}

/* ---- public API (kvllm.h) ---- */

int kvllm_grammar_from_gbnf(const char *text, struct kvllm_grammar **out, char *err, size_t err_cap) {
    return gbnf_parse(text, out, err, err_cap);
}

const char *grammar_gbnf_text(const struct kvllm_grammar *g) { return g && g->gbnf ? g->gbnf : ""; }

struct kvllm_grammar *kvllm_grammar_ref(struct kvllm_grammar *g) {
    if (g) atomic_fetch_add(&g->refs, 1);
    return g;
}

void kvllm_grammar_free(struct kvllm_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    gshared_free(g->shared);
    pthread_mutex_destroy(&g->lock);
    free(g->elems);
    free(g->rule_start);
    free(g->gbnf);
    free(g);
}
