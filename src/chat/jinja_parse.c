/* jinja_parse.c — tokens to a syntax tree, by recursive descent that
 * follows jinja2's Parser rule for rule (same precedence, same quirks:
 * filters and tests bind tighter than arithmetic, ** is left-associative,
 * a test takes one bare argument: `x is divisibleby 3`).
 *
 * Statements: if/elif/else, for/else (with `if` filter), set (also
 * namespace attributes and the block form), macro, with, filter, print,
 * break/continue (loopcontrols) and Transformers' {% generation %}.  Tags
 * Jinja2 knows but this interpreter lacks (extends, block, include,
 * import, from, call, autoescape, recursive loops, *args) are
 * KVLLM_EUNSUPPORTED at the tag; anything else malformed is KVLLM_EINVAL. */
#include "chat/jinja.h"
#include "kvllm.h"

#include <stdio.h>
#include <string.h>

struct parser {
    struct jctx *c;
    const struct jtoken *t;
    size_t i, n;
    int loop_depth;    /* enclosing for loops (reset inside a macro) */
};

struct nvec {
    struct jnode **v;
    struct jstr *names;
    int n, cap;
};

static void nvec_push(struct jctx *c, struct nvec *v, struct jnode *node, struct jstr name) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        struct jnode **nv = jalloc_array(c, (size_t)cap, sizeof *nv);
        struct jstr *nn = jalloc_array(c, (size_t)cap, sizeof *nn);
        if (v->n) {
            memcpy(nv, v->v, (size_t)v->n * sizeof *nv);
            memcpy(nn, v->names, (size_t)v->n * sizeof *nn);
        }
        v->v = nv;
        v->names = nn;
        v->cap = cap;
    }
    v->names[v->n] = name;
    v->v[v->n++] = node;
}

static const struct jtoken *cur(const struct parser *P) { return &P->t[P->i]; }
static const struct jtoken *look(const struct parser *P) { return &P->t[P->i + 1 < P->n ? P->i + 1 : P->i]; }
static const struct jtoken *next(struct parser *P) {
    const struct jtoken *t = &P->t[P->i];
    if (P->i + 1 < P->n) P->i++;
    return t;
}

static bool is_name(const struct jtoken *t, const char *s) { return t->type == JT_NAME && jstr_eq(t->s, s); }
static bool is_op(const struct jtoken *t, char op) { return t->type == JT_OP && t->op == op; }

static const char *describe(const struct jtoken *t, char *buf, size_t cap) {
    switch ((enum jtok)t->type) {
    case JT_EOF: return "end of template";
    case JT_DATA: return "template data / text";
    case JT_VAR_BEGIN: return "begin of print statement";
    case JT_VAR_END: return "end of print statement";
    case JT_BLOCK_BEGIN: return "begin of statement block";
    case JT_BLOCK_END: return "end of statement block";
    case JT_STRING: return "string";
    case JT_INT: return "integer";
    case JT_FLOAT: return "float";
    case JT_NAME:
        snprintf(buf, cap, "%.*s", (int)(t->s.n < 60 ? t->s.n : 60), t->s.p);
        return buf;
    case JT_OP: {
        static const char *two[] = { "F//", "P**", "E==", "N!=", "G>=", "L<=" };
        for (size_t k = 0; k < sizeof two / sizeof *two; k++)
            if (two[k][0] == t->op) return two[k] + 1;
        snprintf(buf, cap, "%c", t->op);
        return buf;
    }
    }
    return "token";
}

_Noreturn static void fail_unexpected(struct parser *P, const char *what) {
    char buf[64];
    const struct jtoken *t = cur(P);
    if (what) jfail(P->c, t->pos, KVLLM_EINVAL, "expected %s, got '%s'", what, describe(t, buf, sizeof buf));
    jfail(P->c, t->pos, KVLLM_EINVAL, "unexpected '%s'", describe(t, buf, sizeof buf));
}

static void expect_op(struct parser *P, char op, const char *what) {
    if (!is_op(cur(P), op)) fail_unexpected(P, what);
    next(P);
}

static struct jstr expect_name(struct parser *P) {
    if (cur(P)->type != JT_NAME) fail_unexpected(P, "a name");
    return next(P)->s;
}

static void expect_type(struct parser *P, enum jtok type, const char *what) {
    if (cur(P)->type != type) fail_unexpected(P, what);
    next(P);
}

static struct jnode *mk(struct parser *P, enum jn_kind kind, uint32_t pos) {
    struct jnode *n = jalloc(P->c, sizeof *n);
    n->kind = (uint8_t)kind;
    n->pos = pos;
    return n;
}

static void set_vec(struct jnode *n, const struct nvec *v) {
    n->v = v->v;
    n->names = v->names;
    n->n = v->n;
}

/* ---- expressions ---- */

static struct jnode *parse_expression(struct parser *P, bool with_condexpr);
static struct jnode *parse_unary(struct parser *P, bool with_filter);
static struct jnode *parse_primary(struct parser *P, bool with_namespace);
static struct jnode *parse_postfix(struct parser *P, struct jnode *node);

/* extra_end: a name that also ends a tuple ("in", "recursive"), or NULL */
static bool is_tuple_end(const struct parser *P, const char *extra_end) {
    const struct jtoken *t = cur(P);
    if (t->type == JT_VAR_END || t->type == JT_BLOCK_END || is_op(t, ')')) return true;
    return extra_end && is_name(t, extra_end);
}

static struct jnode *parse_tuple(struct parser *P, bool simplified, bool with_condexpr, const char *extra_end,
                                 bool explicit_parens, bool with_namespace) {
    uint32_t pos = cur(P)->pos;
    struct nvec items = { 0 };
    bool is_tuple = false;
    for (;;) {
        if (items.n) expect_op(P, ',', "','");
        if (is_tuple_end(P, extra_end)) break;
        struct jnode *e = simplified ? parse_primary(P, with_namespace) : parse_expression(P, with_condexpr);
        nvec_push(P->c, &items, e, (struct jstr){ 0 });
        if (is_op(cur(P), ',')) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) fail_unexpected(P, "an expression");
    }
    struct jnode *t = mk(P, JN_TUPLE, pos);
    set_vec(t, &items);
    return t;
}

/* (args) of a call, filter or test: positional then keyword arguments */
static void parse_call_args(struct parser *P, struct jnode *node) {
    uint32_t pos = cur(P)->pos;
    expect_op(P, '(', "'('");
    struct nvec args = { 0 };
    bool have_kw = false;
    while (!is_op(cur(P), ')')) {
        if (args.n) {
            expect_op(P, ',', "','");
            if (is_op(cur(P), ')')) break;
        }
        if (is_op(cur(P), '*') || is_op(cur(P), 'P'))
            jfail(P->c, cur(P)->pos, KVLLM_EUNSUPPORTED, "*args and **kwargs in calls are not supported");
        if (cur(P)->type == JT_NAME && is_op(look(P), '=')) {
            struct jstr key = next(P)->s;
            next(P);
            nvec_push(P->c, &args, parse_expression(P, true), key);
            have_kw = true;
        } else {
            if (have_kw) jfail(P->c, pos, KVLLM_EINVAL, "invalid syntax for function call expression");
            nvec_push(P->c, &args, parse_expression(P, true), (struct jstr){ 0 });
        }
    }
    next(P);
    set_vec(node, &args);
}

static struct jnode *parse_subscribed(struct parser *P) {
    uint32_t pos = cur(P)->pos;
    struct jnode *start = NULL;
    if (!is_op(cur(P), ':')) {
        start = parse_expression(P, true);
        if (!is_op(cur(P), ':')) return start;
    }
    next(P);
    struct jnode *s = mk(P, JN_SLICE, pos);
    s->a = start;
    if (!is_op(cur(P), ':') && !is_op(cur(P), ']') && !is_op(cur(P), ','))
        s->b = parse_expression(P, true);
    if (is_op(cur(P), ':')) {
        next(P);
        if (!is_op(cur(P), ']') && !is_op(cur(P), ','))
            s->c = parse_expression(P, true);
    }
    return s;
}

static struct jnode *parse_subscript(struct parser *P, struct jnode *node) {
    const struct jtoken *t = next(P);
    if (t->op == '.') {
        const struct jtoken *attr = cur(P);
        if (attr->type == JT_NAME) {
            next(P);
            struct jnode *g = mk(P, JN_GETATTR, t->pos);
            g->a = node;
            g->s = attr->s;
            return g;
        }
        if (attr->type != JT_INT) fail_unexpected(P, "a name or number");
        next(P);
        struct jnode *g = mk(P, JN_GETITEM, t->pos), *k = mk(P, JN_CONST, attr->pos);
        k->k = jv_int(attr->i);
        g->a = node;
        g->b = k;
        return g;
    }
    struct nvec args = { 0 };
    while (!is_op(cur(P), ']')) {
        if (args.n) expect_op(P, ',', "','");
        nvec_push(P->c, &args, parse_subscribed(P), (struct jstr){ 0 });
    }
    next(P);
    struct jnode *g = mk(P, JN_GETITEM, t->pos);
    g->a = node;
    if (args.n == 1) g->b = args.v[0];
    else {
        g->b = mk(P, JN_TUPLE, t->pos);
        set_vec(g->b, &args);
    }
    return g;
}

static struct jnode *parse_call(struct parser *P, struct jnode *callee) {
    struct jnode *call = mk(P, JN_CALL, cur(P)->pos);
    call->a = callee;
    parse_call_args(P, call);
    return call;
}

static struct jnode *parse_postfix(struct parser *P, struct jnode *node) {
    for (;;) {
        const struct jtoken *t = cur(P);
        if (is_op(t, '.') || is_op(t, '[')) node = parse_subscript(P, node);
        else if (is_op(t, '(')) node = parse_call(P, node);
        else return node;
    }
}

/* `name.name...` of a filter or test */
static struct jstr parse_dotted_name(struct parser *P) {
    struct jstr name = expect_name(P);
    while (is_op(cur(P), '.')) {
        next(P);
        struct jstr more = expect_name(P);
        name.n = (size_t)(more.p + more.n - name.p);   /* the same source text */
    }
    return name;
}

/* One or more |filter(args); node may be NULL (filter blocks, set blocks). */
static struct jnode *parse_filter(struct parser *P, struct jnode *node, bool start_inline) {
    while (is_op(cur(P), '|') || start_inline) {
        if (!start_inline) next(P);
        uint32_t pos = cur(P)->pos;
        struct jnode *f = mk(P, JN_FILTER, pos);
        f->s = parse_dotted_name(P);
        f->a = node;
        if (is_op(cur(P), '(')) parse_call_args(P, f);
        node = f;
        start_inline = false;
    }
    return node;
}

static struct jnode *parse_test(struct parser *P, struct jnode *node) {
    uint32_t pos = next(P)->pos;   /* "is" */
    bool negated = false;
    if (is_name(cur(P), "not")) { next(P); negated = true; }
    struct jnode *t = mk(P, JN_TEST, pos);
    t->a = node;
    t->s = parse_dotted_name(P);
    const struct jtoken *c = cur(P);
    if (is_op(c, '(')) parse_call_args(P, t);
    else if ((c->type == JT_NAME || c->type == JT_STRING || c->type == JT_INT || c->type == JT_FLOAT ||
              is_op(c, '[') || is_op(c, '{')) &&
             !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) jfail(P->c, c->pos, KVLLM_EINVAL, "you cannot chain multiple tests with is");
        struct jnode *arg = parse_postfix(P, parse_primary(P, false));
        struct nvec args = { 0 };
        nvec_push(P->c, &args, arg, (struct jstr){ 0 });
        set_vec(t, &args);
    }
    if (!negated) return t;
    struct jnode *n = mk(P, JN_NOT, pos);
    n->a = t;
    return n;
}

static struct jnode *parse_filter_expr(struct parser *P, struct jnode *node) {
    for (;;) {
        const struct jtoken *t = cur(P);
        if (is_op(t, '|')) node = parse_filter(P, node, false);
        else if (is_name(t, "is")) node = parse_test(P, node);
        else if (is_op(t, '(')) node = parse_call(P, node);
        else return node;
    }
}

static struct jnode *parse_list(struct parser *P) {
    struct jnode *l = mk(P, JN_LIST, next(P)->pos);
    struct nvec items = { 0 };
    while (!is_op(cur(P), ']')) {
        if (items.n) expect_op(P, ',', "','");
        if (is_op(cur(P), ']')) break;
        nvec_push(P->c, &items, parse_expression(P, true), (struct jstr){ 0 });
    }
    next(P);
    set_vec(l, &items);
    return l;
}

static struct jnode *parse_dict(struct parser *P) {
    struct jnode *d = mk(P, JN_DICT, next(P)->pos);
    struct nvec keys = { 0 }, vals = { 0 };
    while (!is_op(cur(P), '}')) {
        if (keys.n) expect_op(P, ',', "','");
        if (is_op(cur(P), '}')) break;
        nvec_push(P->c, &keys, parse_expression(P, true), (struct jstr){ 0 });
        expect_op(P, ':', "':'");
        nvec_push(P->c, &vals, parse_expression(P, true), (struct jstr){ 0 });
    }
    next(P);
    set_vec(d, &keys);
    d->v2 = vals.v;
    return d;
}

static struct jnode *parse_primary(struct parser *P, bool with_namespace) {
    const struct jtoken *t = cur(P);
    struct jnode *node;
    switch ((enum jtok)t->type) {
    case JT_NAME:
        next(P);
        if (jstr_eq(t->s, "true") || jstr_eq(t->s, "True") || jstr_eq(t->s, "false") || jstr_eq(t->s, "False")) {
            node = mk(P, JN_CONST, t->pos);
            node->k = jv_bool(t->s.p[0] == 't' || t->s.p[0] == 'T');
        } else if (jstr_eq(t->s, "none") || jstr_eq(t->s, "None")) {
            node = mk(P, JN_CONST, t->pos);
            node->k = jv_none();
        } else if (with_namespace && is_op(cur(P), '.')) {
            next(P);
            node = mk(P, JN_NSREF, t->pos);
            node->s = t->s;
            node->k = jv_str(expect_name(P));
        } else {
            node = mk(P, JN_NAME, t->pos);
            node->s = t->s;
        }
        return node;
    case JT_STRING: {
        node = mk(P, JN_CONST, t->pos);
        next(P);
        struct jstr s = t->s;
        if (cur(P)->type == JT_STRING) {   /* adjacent literals concatenate */
            struct jbuf b = { 0 };
            jb_put(P->c, &b, s.p, s.n);
            while (cur(P)->type == JT_STRING) {
                const struct jtoken *more = next(P);
                jb_put(P->c, &b, more->s.p, more->s.n);
            }
            s = jb_str(&b);
        }
        node->k = jv_str(s);
        return node;
    }
    case JT_INT: case JT_FLOAT:
        node = mk(P, JN_CONST, t->pos);
        node->k = t->type == JT_INT ? jv_int(t->i) : jv_float(t->f);
        next(P);
        return node;
    case JT_OP:
        if (t->op == '(') {
            next(P);
            node = parse_tuple(P, false, true, NULL, true, false);
            expect_op(P, ')', "')'");
            return node;
        }
        if (t->op == '[') return parse_list(P);
        if (t->op == '{') return parse_dict(P);
        break;
    default:
        break;
    }
    fail_unexpected(P, NULL);
}

static struct jnode *parse_unary(struct parser *P, bool with_filter) {
    const struct jtoken *t = cur(P);
    struct jnode *node;
    if (is_op(t, '-') || is_op(t, '+')) {
        next(P);
        node = mk(P, t->op == '-' ? JN_NEG : JN_POS, t->pos);
        node->a = parse_unary(P, false);
    } else {
        node = parse_primary(P, false);
    }
    node = parse_postfix(P, node);
    return with_filter ? parse_filter_expr(P, node) : node;
}

static struct jnode *binop(struct parser *P, char op, uint32_t pos, struct jnode *l, struct jnode *r) {
    struct jnode *n = mk(P, JN_BINOP, pos);
    n->op = (uint8_t)op;
    n->a = l;
    n->b = r;
    return n;
}

static struct jnode *parse_pow(struct parser *P) {
    struct jnode *left = parse_unary(P, true);
    while (is_op(cur(P), 'P')) {
        uint32_t pos = next(P)->pos;
        left = binop(P, 'P', pos, left, parse_unary(P, true));
    }
    return left;
}

static struct jnode *parse_math2(struct parser *P) {
    struct jnode *left = parse_pow(P);
    for (;;) {
        const struct jtoken *t = cur(P);
        if (!(is_op(t, '*') || is_op(t, '/') || is_op(t, 'F') || is_op(t, '%'))) return left;
        next(P);
        left = binop(P, (char)t->op, t->pos, left, parse_pow(P));
    }
}

static struct jnode *parse_concat(struct parser *P) {
    struct jnode *left = parse_math2(P);
    while (is_op(cur(P), '~')) {
        uint32_t pos = next(P)->pos;
        left = binop(P, '~', pos, left, parse_math2(P));
    }
    return left;
}

static struct jnode *parse_math1(struct parser *P) {
    struct jnode *left = parse_concat(P);
    for (;;) {
        const struct jtoken *t = cur(P);
        if (!(is_op(t, '+') || is_op(t, '-'))) return left;
        next(P);
        left = binop(P, (char)t->op, t->pos, left, parse_concat(P));
    }
}

static struct jnode *parse_compare(struct parser *P) {
    uint32_t pos = cur(P)->pos;
    struct jnode *expr = parse_math1(P);
    struct nvec rhs = { 0 };
    uint8_t ops[64];
    for (;;) {
        const struct jtoken *t = cur(P);
        int op = -1;
        if (t->type == JT_OP) {
            switch (t->op) {
            case 'E': op = JC_EQ; break;
            case 'N': op = JC_NE; break;
            case '<': op = JC_LT; break;
            case 'L': op = JC_LE; break;
            case '>': op = JC_GT; break;
            case 'G': op = JC_GE; break;
            default: break;
            }
            if (op >= 0) next(P);
        } else if (is_name(t, "in")) {
            next(P);
            op = JC_IN;
        } else if (is_name(t, "not") && is_name(look(P), "in")) {
            next(P);
            next(P);
            op = JC_NOTIN;
        }
        if (op < 0) break;
        if (rhs.n == (int)sizeof ops) jfail(P->c, t->pos, KVLLM_EUNSUPPORTED, "too many chained comparisons");
        ops[rhs.n] = (uint8_t)op;
        nvec_push(P->c, &rhs, parse_math1(P), (struct jstr){ 0 });
    }
    if (!rhs.n) return expr;
    struct jnode *n = mk(P, JN_COMPARE, pos);
    n->a = expr;
    set_vec(n, &rhs);
    n->ops = jalloc(P->c, (size_t)rhs.n);
    memcpy(n->ops, ops, (size_t)rhs.n);
    return n;
}

static struct jnode *parse_not(struct parser *P) {
    if (is_name(cur(P), "not")) {
        struct jnode *n = mk(P, JN_NOT, next(P)->pos);
        jdepth_enter(P->c, n->pos);
        n->a = parse_not(P);
        jdepth_leave(P->c);
        return n;
    }
    return parse_compare(P);
}

static struct jnode *parse_and(struct parser *P) {
    struct jnode *left = parse_not(P);
    while (is_name(cur(P), "and")) {
        struct jnode *n = mk(P, JN_AND, next(P)->pos);
        n->a = left;
        n->b = parse_not(P);
        left = n;
    }
    return left;
}

static struct jnode *parse_or(struct parser *P) {
    struct jnode *left = parse_and(P);
    while (is_name(cur(P), "or")) {
        struct jnode *n = mk(P, JN_OR, next(P)->pos);
        n->a = left;
        n->b = parse_and(P);
        left = n;
    }
    return left;
}

static struct jnode *parse_condexpr(struct parser *P) {
    struct jnode *expr = parse_or(P);
    while (is_name(cur(P), "if")) {
        struct jnode *n = mk(P, JN_COND, next(P)->pos);
        n->b = expr;
        n->a = parse_or(P);
        if (is_name(cur(P), "else")) {
            next(P);
            n->c = parse_condexpr(P);
        }
        expr = n;
    }
    return expr;
}

static struct jnode *parse_expression(struct parser *P, bool with_condexpr) {
    jdepth_enter(P->c, cur(P)->pos);
    struct jnode *e = with_condexpr ? parse_condexpr(P) : parse_or(P);
    jdepth_leave(P->c);
    return e;
}

/* ---- statements ---- */

static bool can_assign(const struct jnode *t) {
    if (t->kind == JN_NAME || t->kind == JN_NSREF) return true;
    if (t->kind != JN_TUPLE) return false;
    for (int i = 0; i < t->n; i++)
        if (t->v[i]->kind == JN_NSREF || !can_assign(t->v[i])) return false;
    return true;
}

static struct jnode *parse_assign_target(struct parser *P, const char *extra_end, bool with_namespace) {
    struct jnode *t = parse_tuple(P, true, true, extra_end, false, with_namespace);
    if (!can_assign(t)) jfail(P->c, t->pos, KVLLM_EINVAL, "can't assign to this expression");
    return t;
}

/* Statements up to one of the names in `ends` (NULL-terminated); leaves that
 * name as the current token.  NULL ends: up to the end of the template. */
static struct jnode *subparse(struct parser *P, const char *const *ends);

static struct jnode *parse_body(struct parser *P, const char *const *ends) {
    if (is_op(cur(P), ':')) next(P);
    expect_type(P, JT_BLOCK_END, "end of statement block");
    return subparse(P, ends);
}

/* Consume the end tag's name ("endif") and its %}. */
static void end_tag(struct parser *P) {
    next(P);
    expect_type(P, JT_BLOCK_END, "end of statement block");
}

static struct jnode *parse_if(struct parser *P, uint32_t pos) {
    static const char *const ends[] = { "elif", "else", "endif", NULL };
    static const char *const end_only[] = { "endif", NULL };
    struct jnode *n = mk(P, JS_IF, pos);
    n->a = parse_tuple(P, false, false, NULL, false, false);
    n->b = parse_body(P, ends);
    const struct jtoken *t = next(P);
    if (is_name(t, "elif")) {
        n->c = parse_if(P, t->pos);     /* the elif chain ends at the same endif */
        return n;
    }
    if (is_name(t, "else")) {
        n->c = parse_body(P, end_only);
        next(P);
    }
    expect_type(P, JT_BLOCK_END, "end of statement block");
    return n;
}

static struct jnode *parse_for(struct parser *P, uint32_t pos) {
    static const char *const ends[] = { "endfor", "else", NULL };
    static const char *const end_only[] = { "endfor", NULL };
    struct jnode *n = mk(P, JS_FOR, pos);
    n->a = parse_assign_target(P, "in", false);
    if (!is_name(cur(P), "in")) fail_unexpected(P, "'in'");
    next(P);
    n->b = parse_tuple(P, false, false, "recursive", false, false);
    if (is_name(cur(P), "if")) {
        next(P);
        n->c = parse_expression(P, true);
    }
    if (is_name(cur(P), "recursive"))
        jfail(P->c, cur(P)->pos, KVLLM_EUNSUPPORTED, "recursive loops are not supported");
    P->loop_depth++;
    struct jnode *body = parse_body(P, ends);
    P->loop_depth--;
    n->v = body->v;
    n->n = body->n;
    if (is_name(next(P), "else")) {
        struct jnode *els = parse_body(P, end_only);
        n->v2 = els->v;
        n->n2 = els->n;
        next(P);
    }
    expect_type(P, JT_BLOCK_END, "end of statement block");
    return n;
}

static struct jnode *parse_set(struct parser *P, uint32_t pos) {
    static const char *const ends[] = { "endset", NULL };
    struct jnode *target = parse_assign_target(P, NULL, true);
    if (is_op(cur(P), '=')) {
        next(P);
        struct jnode *n = mk(P, JS_SET, pos);
        n->a = target;
        n->b = parse_tuple(P, false, true, NULL, false, false);
        expect_type(P, JT_BLOCK_END, "end of statement block");
        return n;
    }
    struct jnode *n = mk(P, JS_SETBLOCK, pos);
    n->a = target;
    n->b = parse_filter(P, NULL, false);
    struct jnode *body = parse_body(P, ends);
    n->v = body->v;
    n->n = body->n;
    end_tag(P);
    return n;
}

static struct jnode *parse_macro(struct parser *P, uint32_t pos) {
    static const char *const ends[] = { "endmacro", NULL };
    struct jnode *n = mk(P, JS_MACRO, pos);
    n->s = expect_name(P);
    expect_op(P, '(', "'('");
    struct nvec params = { 0 }, defaults = { 0 };
    while (!is_op(cur(P), ')')) {
        if (params.n) expect_op(P, ',', "','");
        struct jstr name = expect_name(P);
        struct jnode *def = NULL;
        if (is_op(cur(P), '=')) {
            next(P);
            def = parse_expression(P, true);
        } else if (defaults.n && defaults.v[defaults.n - 1]) {
            jfail(P->c, cur(P)->pos, KVLLM_EINVAL, "non-default argument follows default argument");
        }
        nvec_push(P->c, &params, NULL, name);
        nvec_push(P->c, &defaults, def, (struct jstr){ 0 });
    }
    next(P);
    n->names = params.names;
    n->n = params.n;
    n->v2 = defaults.v;
    int saved = P->loop_depth;
    P->loop_depth = 0;
    n->c = parse_body(P, ends);
    P->loop_depth = saved;
    end_tag(P);
    return n;
}

static struct jnode *parse_with(struct parser *P, uint32_t pos) {
    static const char *const ends[] = { "endwith", NULL };
    struct jnode *n = mk(P, JS_WITH, pos);
    struct nvec targets = { 0 }, values = { 0 };
    while (cur(P)->type != JT_BLOCK_END) {
        if (targets.n) expect_op(P, ',', "','");
        nvec_push(P->c, &targets, NULL, expect_name(P));
        expect_op(P, '=', "'='");
        nvec_push(P->c, &values, parse_expression(P, true), (struct jstr){ 0 });
    }
    n->names = targets.names;
    n->n = targets.n;
    n->v2 = values.v;
    n->c = parse_body(P, ends);
    end_tag(P);
    return n;
}

static struct jnode *parse_statement(struct parser *P) {
    const struct jtoken *t = cur(P);
    if (t->type != JT_NAME) fail_unexpected(P, "a tag name");
    uint32_t pos = t->pos;
    struct jstr tag = t->s;
    next(P);
    if (jstr_eq(tag, "if")) return parse_if(P, pos);
    if (jstr_eq(tag, "for")) return parse_for(P, pos);
    if (jstr_eq(tag, "set")) return parse_set(P, pos);
    if (jstr_eq(tag, "macro")) return parse_macro(P, pos);
    if (jstr_eq(tag, "with")) return parse_with(P, pos);
    if (jstr_eq(tag, "break") || jstr_eq(tag, "continue")) {
        if (!P->loop_depth) jfail(P->c, pos, KVLLM_EINVAL, "'%.*s' outside of a loop", (int)tag.n, tag.p);
        struct jnode *n = mk(P, tag.p[0] == 'b' ? JS_BREAK : JS_CONTINUE, pos);
        expect_type(P, JT_BLOCK_END, "end of statement block");
        return n;
    }
    if (jstr_eq(tag, "print")) {
        struct jnode *n = mk(P, JS_OUTPUT, pos);
        n->a = parse_tuple(P, false, true, NULL, false, false);
        expect_type(P, JT_BLOCK_END, "end of statement block");
        return n;
    }
    if (jstr_eq(tag, "filter")) {
        static const char *const ends[] = { "endfilter", NULL };
        struct jnode *n = mk(P, JS_FILTERBLOCK, pos);
        n->b = parse_filter(P, NULL, true);
        struct jnode *body = parse_body(P, ends);
        n->v = body->v;
        n->n = body->n;
        end_tag(P);
        return n;
    }
    if (jstr_eq(tag, "generation")) {   /* Transformers' assistant-mask marker: renders its body */
        static const char *const ends[] = { "endgeneration", NULL };
        struct jnode *n = parse_body(P, ends);
        end_tag(P);
        return n;
    }
    static const char *const unsupported[] = { "extends", "block", "include", "import", "from", "call",
                                               "autoescape", NULL };
    for (int i = 0; unsupported[i]; i++)
        if (jstr_eq(tag, unsupported[i]))
            jfail(P->c, pos, KVLLM_EUNSUPPORTED, "the '%s' tag is not supported", unsupported[i]);
    jfail(P->c, pos, KVLLM_EINVAL, "encountered unknown tag '%.*s'", (int)(tag.n < 60 ? tag.n : 60), tag.p);
}

static struct jnode *subparse(struct parser *P, const char *const *ends) {
    struct jnode *block = mk(P, JS_BLOCK, cur(P)->pos);
    struct nvec body = { 0 };
    jdepth_enter(P->c, block->pos);
    for (;;) {
        const struct jtoken *t = cur(P);
        if (t->type == JT_EOF) {
            if (ends) {
                char want[64] = "";
                for (int i = 0; ends[i]; i++)
                    snprintf(want + strlen(want), sizeof want - strlen(want), "%s'%s'", i ? " or " : "", ends[i]);
                jfail(P->c, t->pos, KVLLM_EINVAL, "unexpected end of template, expected %s", want);
            }
            break;
        }
        if (t->type == JT_DATA) {
            struct jnode *d = mk(P, JS_DATA, t->pos);
            d->s = t->s;
            nvec_push(P->c, &body, d, (struct jstr){ 0 });
            next(P);
        } else if (t->type == JT_VAR_BEGIN) {
            next(P);
            struct jnode *o = mk(P, JS_OUTPUT, t->pos);
            o->a = parse_tuple(P, false, true, NULL, false, false);
            expect_type(P, JT_VAR_END, "end of print statement");
            nvec_push(P->c, &body, o, (struct jstr){ 0 });
        } else if (t->type == JT_BLOCK_BEGIN) {
            next(P);
            bool is_end = false;
            for (int i = 0; ends && ends[i]; i++) is_end |= is_name(cur(P), ends[i]);
            if (is_end) break;
            nvec_push(P->c, &body, parse_statement(P), (struct jstr){ 0 });
        } else {
            fail_unexpected(P, NULL);
        }
    }
    jdepth_leave(P->c);
    set_vec(block, &body);
    return block;
}

/* jinja2 rejects an unknown filter or test when it compiles the template,
 * unless the use sits in an if statement or an inline if (a "soft" frame;
 * loops, macros, with and block sets open a fresh, hard one): there it
 * fails only if executed, as the evaluator does. */
static void check_names(struct jctx *c, const struct jnode *n, bool soft) {
    if (!n) return;
    bool unsupported;
    if (!soft && n->kind == JN_FILTER && !jfilter_find(n->s, &unsupported) && !unsupported)
        jfail(c, n->pos, KVLLM_EINVAL, "no filter named '%.*s'", (int)n->s.n, n->s.p);
    if (!soft && n->kind == JN_TEST && !jtest_find(n->s, &unsupported))
        jfail(c, n->pos, KVLLM_EINVAL, "no test named '%.*s'", (int)n->s.n, n->s.p);
    bool here = soft || n->kind == JS_IF || n->kind == JN_COND;   /* a, b, c and the if's branches */
    switch ((enum jn_kind)n->kind) {
    case JS_FOR:
        check_names(c, n->b, soft);     /* the iterable is evaluated outside the loop */
        check_names(c, n->c, false);
        for (int i = 0; i < n->n; i++) check_names(c, n->v[i], false);
        for (int i = 0; i < n->n2; i++) check_names(c, n->v2[i], false);
        return;
    case JS_MACRO:
        for (int i = 0; i < n->n; i++) check_names(c, n->v2[i], false);
        check_names(c, n->c, false);
        return;
    case JS_WITH:                       /* values outside, body inside */
        for (int i = 0; i < n->n; i++) check_names(c, n->v2[i], soft);
        check_names(c, n->c, false);
        return;
    case JS_SETBLOCK: case JS_FILTERBLOCK:   /* the filter runs in the block's frame too */
        check_names(c, n->b, false);
        for (int i = 0; i < n->n; i++) check_names(c, n->v[i], false);
        return;
    default:
        break;
    }
    check_names(c, n->a, here);
    check_names(c, n->b, here);
    check_names(c, n->c, here);
    for (int i = 0; n->v && i < n->n; i++) check_names(c, n->v[i], here);
    if (n->kind == JN_DICT)
        for (int i = 0; i < n->n; i++) check_names(c, n->v2[i], here);
}

struct jnode *jparse(struct jctx *c, const struct jtoken *toks, size_t n) {
    struct parser P = { .c = c, .t = toks, .n = n };
    struct jnode *root = subparse(&P, NULL);
    check_names(c, root, false);
    return root;
}
