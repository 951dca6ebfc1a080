/* jinja_eval.c — walks the syntax tree: expressions to values, statements
 * to output.
 *
 * Scopes follow jinja2: the template's top level is one scope (whose
 * parent holds the render variables and global functions); every for-loop
 * iteration, macro call and with block gets a fresh child scope, so a
 * `set` inside them is gone when they end (hence namespace()); if blocks
 * share their enclosing scope.  A macro resolves free names in the scope
 * it was defined in, at call time.  Attribute and item access follow
 * jinja2's sandboxed getattr/getitem: a dict's methods win over its keys
 * for `.name`, a missing key or index is Undefined, and anything done to
 * an Undefined other than printing, testing or iterating is an error. */
#include "chat/jinja.h"
#include "kvllm.h"

#include <math.h>
#include <string.h>

enum flow { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };

/* ---- scopes ---- */

struct jscope *jscope_new(struct jctx *c, struct jscope *parent) {
    struct jscope *s = jalloc(c, sizeof *s);
    s->parent = parent;
    return s;
}

void jscope_set(struct jctx *c, struct jscope *sc, struct jstr name, struct jv v) {
    jdict_set(c, &sc->vars, jv_str(name), v);
}

static bool lookup(const struct jscope *sc, struct jstr name, struct jv *out) {
    for (; sc; sc = sc->parent)
        if (jdict_get_str(&sc->vars, name, out)) return true;
    return false;
}

_Noreturn static void fail_undefined(struct jctx *c, uint32_t pos, struct jv u) {
    if (u.u.s.n) jfail(c, pos, KVLLM_EINVAL, "'%.*s' is undefined", (int)u.u.s.n, u.u.s.p);
    jfail(c, pos, KVLLM_EINVAL, "an undefined value was used");
}

/* ---- attribute and item access ---- */

static struct jv loop_attr(struct jctx *c, uint32_t pos, struct jloop *l, struct jstr name);

struct jv jgetattr(struct jctx *c, uint32_t pos, struct jv obj, struct jstr name) {
    struct jv out;
    switch ((enum jkind)obj.kind) {
    case JK_UNDEF: fail_undefined(c, pos, obj);
    case JK_DICT:
        if (jmethod_find(c, obj, name, &out)) return out;
        jstep(c, pos, obj.u.d->n);   /* the lookup is linear */
        if (jdict_get_str(obj.u.d, name, &out)) return out;
        break;
    case JK_NS:
        jstep(c, pos, obj.u.d->n);
        if (jdict_get_str(obj.u.d, name, &out)) return out;
        break;
    case JK_LOOP: return loop_attr(c, pos, obj.u.loop, name);
    case JK_STR: case JK_LIST:
        if (jmethod_find(c, obj, name, &out)) return out;
        break;
    default: break;
    }
    return jv_undef(name);
}

/* Python index i into a sequence of n items; false when out of range. */
static bool seq_index(struct jv key, size_t n, size_t *at) {
    int64_t i = key.kind == JK_BOOL ? key.u.b : key.u.i;
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *at = (size_t)i;
    return true;
}

struct jv jgetitem(struct jctx *c, uint32_t pos, struct jv obj, struct jv key) {
    struct jv out;
    bool int_key = key.kind == JK_INT || key.kind == JK_BOOL;
    switch ((enum jkind)obj.kind) {
    case JK_UNDEF: fail_undefined(c, pos, obj);
    case JK_DICT:
        jstep(c, pos, obj.u.d->n);   /* the lookup is linear */
        if (jdict_get(obj.u.d, key, &out)) return out;
        break;
    case JK_LIST: {
        const struct jlist *l = obj.u.l;
        bool indexable = l->shape == JL_LIST || l->shape == JL_TUPLE || l->shape == JL_RANGE;
        size_t at;
        if (indexable && int_key) return seq_index(key, l->n, &at) ? l->v[at] : jv_undef((struct jstr){ 0 });
        break;
    }
    case JK_STR:
        if (int_key) {
            size_t n, at;
            const struct jv *chars = jv_iterate(c, pos, obj, &n);
            return seq_index(key, n, &at) ? chars[at] : jv_undef((struct jstr){ 0 });
        }
        break;
    default: break;
    }
    /* jinja2: obj[key] failed; a string key falls back to getattr */
    if (key.kind == JK_STR) return jgetattr(c, pos, obj, key.u.s);
    return jv_undef((struct jstr){ 0 });
}

/* Python's slice.indices(n) and the indices it selects. */
static size_t slice_indices(struct jctx *c, uint32_t pos, const struct jv bound[3], size_t n,
                            int64_t *start, int64_t *step) {
    int64_t len = (int64_t)n, st = 1;
    if (bound[2].kind != JK_NONE) st = bound[2].kind == JK_BOOL ? bound[2].u.b : bound[2].u.i;
    if (st == 0) jfail(c, pos, KVLLM_EINVAL, "slice step cannot be zero");
    int64_t lo, hi;
    for (int k = 0; k < 2; k++) {
        int64_t def = k == 0 ? (st < 0 ? len - 1 : 0) : (st < 0 ? -1 : len), v = def;
        if (bound[k].kind != JK_NONE) {
            v = bound[k].kind == JK_BOOL ? bound[k].u.b : bound[k].u.i;
            if (v < 0) {
                v += len;
                if (v < 0) v = st < 0 ? -1 : 0;
            } else if (v >= len) {
                v = st < 0 ? len - 1 : len;
            }
        }
        if (k == 0) lo = v;
        else hi = v;
    }
    *start = lo;
    *step = st;
    if (st < 0) return hi < lo ? (size_t)((lo - hi - 1) / -st + 1) : 0;
    return lo < hi ? (size_t)((hi - lo - 1) / st + 1) : 0;
}

static struct jv get_slice(struct jctx *c, struct jscope *sc, const struct jnode *e) {
    struct jv obj = jeval(c, sc, e->a);
    const struct jnode *s = e->b;
    struct jv bound[3];
    bool ok = true;
    for (int k = 0; k < 3; k++) {
        const struct jnode *b = k == 0 ? s->a : k == 1 ? s->b : s->c;
        bound[k] = b ? jeval(c, sc, b) : jv_none();
        if (bound[k].kind != JK_NONE && bound[k].kind != JK_INT && bound[k].kind != JK_BOOL) ok = false;
    }
    if (obj.kind == JK_UNDEF) fail_undefined(c, e->pos, obj);
    bool seq = obj.kind == JK_STR ||
               (obj.kind == JK_LIST && (obj.u.l->shape == JL_LIST || obj.u.l->shape == JL_TUPLE ||
                                        obj.u.l->shape == JL_RANGE));
    /* jinja2 compiles a slice to Python's own obj[a:b:c] (not its getitem, which would turn the
     * TypeError into an undefined value), so these fail the render */
    if (obj.kind == JK_DICT) jfail(c, e->pos, KVLLM_EINVAL, "unhashable type: 'slice'");
    if (!seq) jfail(c, e->pos, KVLLM_EINVAL, "'%s' object is not subscriptable", jv_type_name(obj));
    if (!ok) jfail(c, e->pos, KVLLM_EINVAL, "slice indices must be integers or None or have an __index__ method");
    size_t n;
    const struct jv *items = obj.kind == JK_STR ? jv_iterate(c, e->pos, obj, &n) : obj.u.l->v;
    if (obj.kind == JK_LIST) n = obj.u.l->n;
    int64_t start, step;
    size_t cnt = slice_indices(c, e->pos, bound, n, &start, &step);
    if (obj.kind == JK_STR) {
        struct jbuf b = { 0 };
        for (size_t k = 0; k < cnt; k++) {
            jb_put_str(c, &b, items[start + (int64_t)k * step].u.s);   /* each character with its taint */
        }
        struct jv r = jv_str(jb_str(&b));
        r.safe = obj.safe;
        return r;
    }
    /* a slice of a list is a list, of a tuple a tuple, of a range a range */
    struct jv r = jv_list(c, obj.u.l->shape, cnt);
    for (size_t k = 0; k < cnt; k++) jlist_push(c, r.u.l, items[start + (int64_t)k * step]);
    return r;
}

static struct jv loop_cycle(struct jctx *c, uint32_t pos, struct jv self, const struct jargs *a) {
    if (a->n_kw || !a->n_pos) jfail(c, pos, KVLLM_EINVAL, "loop.cycle() takes positional arguments");
    return a->pos[self.u.loop->i % (size_t)a->n_pos];
}

static struct jv loop_attr(struct jctx *c, uint32_t pos, struct jloop *l, struct jstr name) {
    if (jstr_eq(name, "index")) return jv_int((int64_t)l->i + 1);
    if (jstr_eq(name, "index0")) return jv_int((int64_t)l->i);
    if (jstr_eq(name, "revindex")) return jv_int((int64_t)(l->n - l->i));
    if (jstr_eq(name, "revindex0")) return jv_int((int64_t)(l->n - l->i - 1));
    if (jstr_eq(name, "first")) return jv_bool(l->i == 0);
    if (jstr_eq(name, "last")) return jv_bool(l->i + 1 == l->n);
    if (jstr_eq(name, "length")) return jv_int((int64_t)l->n);
    if (jstr_eq(name, "depth")) return jv_int(l->depth);
    if (jstr_eq(name, "depth0")) return jv_int(l->depth - 1);
    if (jstr_eq(name, "previtem"))
        return l->i > 0 ? l->items[l->i - 1] : jv_undef(jstr_c("there is no previous item"));
    if (jstr_eq(name, "nextitem"))
        return l->i + 1 < l->n ? l->items[l->i + 1] : jv_undef(jstr_c("there is no next item"));
    if (jstr_eq(name, "cycle")) {
        struct jv self = { .kind = JK_LOOP };
        self.u.loop = l;
        return jv_func(c, "cycle", loop_cycle, self);
    }
    if (jstr_eq(name, "changed"))
        jfail(c, pos, KVLLM_EUNSUPPORTED, "loop.changed() is not supported");
    return jv_undef(name);
}

/* ---- operators ---- */

_Noreturn static void fail_operands(struct jctx *c, uint32_t pos, const char *op, struct jv a, struct jv b) {
    if (a.kind == JK_UNDEF) fail_undefined(c, pos, a);
    if (b.kind == JK_UNDEF) fail_undefined(c, pos, b);
    jfail(c, pos, KVLLM_EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'", op,
          jv_type_name(a), jv_type_name(b));
}

static int64_t as_int(struct jv v) { return v.kind == JK_BOOL ? v.u.b : v.u.i; }

_Noreturn static void fail_overflow(struct jctx *c, uint32_t pos) {
    jfail(c, pos, KVLLM_EUNSUPPORTED, "integer overflow (Python integers are unbounded; these are 64-bit)");
}

static struct jv repeat(struct jctx *c, uint32_t pos, struct jv seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.kind == JK_STR) {
        if (!seq.u.s.n) return jv_str(jstr_c(""));   /* '' * 10**18 must not loop */
        struct jbuf b = { 0 };
        if (seq.u.s.n && (uint64_t)times > c->mem_cap / seq.u.s.n)
            jfail(c, pos, KVLLM_ENOMEM, "string repetition too large");
        for (int64_t k = 0; k < times; k++) jb_put_str(c, &b, seq.u.s);
        return jv_str(jb_str(&b));
    }
    if (seq.u.l->n && (uint64_t)times > c->mem_cap / (seq.u.l->n * sizeof(struct jv)))
        jfail(c, pos, KVLLM_ENOMEM, "list repetition too large");
    struct jv r = jv_list(c, seq.u.l->shape, 0);
    if (!seq.u.l->n) return r;
    for (int64_t k = 0; k < times; k++)
        for (size_t i = 0; i < seq.u.l->n; i++) jlist_push(c, r.u.l, seq.u.l->v[i]);
    return r;
}

/* HTML-escape s (markupsafe.escape). */
static struct jstr html_escape(struct jctx *c, struct jstr s) {
    struct jbuf b = { 0 };
    for (size_t i = 0; i < s.n; i++) {
        switch (s.p[i]) {
        case '&': jb_puts(c, &b, "&amp;"); break;
        case '<': jb_puts(c, &b, "&lt;"); break;
        case '>': jb_puts(c, &b, "&gt;"); break;
        case '"': jb_puts(c, &b, "&#34;"); break;
        case '\'': jb_puts(c, &b, "&#39;"); break;
        default: jb_putc(c, &b, s.p[i]);
        }
    }
    return jb_str(&b);
}

struct jv jv_escape(struct jctx *c, uint32_t pos, struct jv v) {
    if (v.kind == JK_STR && v.safe) return v;
    struct jv r = jv_str(html_escape(c, jv_to_str(c, pos, v)));
    if (jv_tainted(v) && r.u.s.n) r.u.s = jstr_taint_all(c, r.u.s);
    r.safe = true;
    return r;
}

static struct jv add(struct jctx *c, uint32_t pos, struct jv a, struct jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.kind == JK_FLOAT || b.kind == JK_FLOAT) return jv_float(jv_num(a) + jv_num(b));
        int64_t r;
        if (__builtin_add_overflow(as_int(a), as_int(b), &r)) fail_overflow(c, pos);
        return jv_int(r);
    }
    if (a.kind == JK_STR && b.kind == JK_STR) {
        bool safe = a.safe || b.safe;   /* Markup + str escapes the str */
        if (safe && !a.safe) a = jv_escape(c, pos, a);
        if (safe && !b.safe) b = jv_escape(c, pos, b);
        struct jbuf buf = { 0 };
        jb_put_str(c, &buf, a.u.s);
        jb_put_str(c, &buf, b.u.s);
        struct jv r = jv_str(jb_str(&buf));
        r.safe = safe;
        return r;
    }
    if (a.kind == JK_LIST && b.kind == JK_LIST && a.u.l->shape == b.u.l->shape &&
        (a.u.l->shape == JL_LIST || a.u.l->shape == JL_TUPLE)) {
        struct jv r = jv_list(c, a.u.l->shape, a.u.l->n + b.u.l->n);
        for (size_t i = 0; i < a.u.l->n; i++) jlist_push(c, r.u.l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) jlist_push(c, r.u.l, b.u.l->v[i]);
        return r;
    }
    fail_operands(c, pos, "+", a, b);
}

/* CPython's float divmod: floor quotient and modulo with the divisor's sign. */
static void float_divmod(double vx, double wx, double *floordiv, double *mod) {
    double m = fmod(vx, wx), div = (vx - m) / wx;
    if (m != 0.0) {
        if ((wx < 0) != (m < 0)) { m += wx; div -= 1.0; }
    } else {
        m = copysign(0.0, wx);
    }
    double fd;
    if (div != 0.0) {
        fd = floor(div);
        if (div - fd > 0.5) fd += 1.0;
    } else {
        fd = copysign(0.0, vx / wx);
    }
    *floordiv = fd;
    *mod = m;
}

static struct jv ipow(struct jctx *c, uint32_t pos, int64_t base, int64_t e) {
    int64_t r = 1;
    while (e > 0) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) fail_overflow(c, pos);
        e >>= 1;
        if (e && __builtin_mul_overflow(base, base, &base)) fail_overflow(c, pos);
    }
    return jv_int(r);
}

static struct jv arith(struct jctx *c, uint32_t pos, char op, struct jv a, struct jv b) {
    static const char *names[] = { "-", "*", "/", "//", "%", "**" };
    const char *opname = names[op == '-' ? 0 : op == '*' ? 1 : op == '/' ? 2 : op == 'F' ? 3 : op == '%' ? 4 : 5];
    if (op == '*') {
        if ((a.kind == JK_STR || (a.kind == JK_LIST && (a.u.l->shape == JL_LIST || a.u.l->shape == JL_TUPLE))) &&
            (b.kind == JK_INT || b.kind == JK_BOOL))
            return repeat(c, pos, a, as_int(b));
        if ((b.kind == JK_STR || (b.kind == JK_LIST && (b.u.l->shape == JL_LIST || b.u.l->shape == JL_TUPLE))) &&
            (a.kind == JK_INT || a.kind == JK_BOOL))
            return repeat(c, pos, b, as_int(a));
    }
    if (op == '%' && a.kind == JK_STR)
        jfail(c, pos, KVLLM_EUNSUPPORTED, "printf-style string formatting ('...' %% x) is not supported");
    if (!jv_is_num(a) || !jv_is_num(b)) fail_operands(c, pos, opname, a, b);
    bool is_float = a.kind == JK_FLOAT || b.kind == JK_FLOAT;
    if (op == '/' || is_float) {
        double x = jv_num(a), y = jv_num(b), fd, m;
        switch (op) {
        case '-': return jv_float(x - y);
        case '*': return jv_float(x * y);
        case '/':
            if (y == 0.0) jfail(c, pos, KVLLM_EINVAL, "division by zero");
            return jv_float(x / y);
        case 'F': case '%':
            if (y == 0.0) jfail(c, pos, KVLLM_EINVAL, "float %s by zero", op == '%' ? "modulo" : "floor division");
            float_divmod(x, y, &fd, &m);
            return jv_float(op == 'F' ? fd : m);
        default:
            if (x == 0.0 && y < 0) jfail(c, pos, KVLLM_EINVAL, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y))
                jfail(c, pos, KVLLM_EUNSUPPORTED, "a negative number to a fractional power is complex");
            return jv_float(pow(x, y));
        }
    }
    int64_t x = as_int(a), y = as_int(b), r;
    switch (op) {
    case '-':
        if (__builtin_sub_overflow(x, y, &r)) fail_overflow(c, pos);
        return jv_int(r);
    case '*':
        if (__builtin_mul_overflow(x, y, &r)) fail_overflow(c, pos);
        return jv_int(r);
    case 'F': case '%': {
        if (y == 0) jfail(c, pos, KVLLM_EINVAL, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) fail_overflow(c, pos);
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
        return jv_int(op == 'F' ? q : m);
    }
    default:
        if (y < 0) {
            if (x == 0) jfail(c, pos, KVLLM_EINVAL, "0.0 cannot be raised to a negative power");
            return jv_float(pow((double)x, (double)y));
        }
        return ipow(c, pos, x, y);
    }
}

static bool contains(struct jctx *c, uint32_t pos, struct jv container, struct jv item) {
    switch ((enum jkind)container.kind) {
    case JK_UNDEF: return false;
    case JK_STR:
        if (item.kind != JK_STR)
            jfail(c, pos, KVLLM_EINVAL, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
        if (!item.u.s.n) return true;
        return container.u.s.n >= item.u.s.n &&
               memmem(container.u.s.p, container.u.s.n, item.u.s.p, item.u.s.n) != NULL;
    case JK_LIST:
        jstep(c, pos, container.u.l->n);   /* a linear scan */
        for (size_t i = 0; i < container.u.l->n; i++)
            if (jv_eq(container.u.l->v[i], item)) return true;
        return false;
    case JK_DICT: {
        struct jv unused;
        jstep(c, pos, container.u.d->n);
        return jdict_get(container.u.d, item, &unused);
    }
    default:
        jfail(c, pos, KVLLM_EINVAL, "argument of type '%s' is not iterable", jv_type_name(container));
    }
}

static bool less(struct jctx *c, uint32_t pos, struct jv a, struct jv b) {
    if (jv_is_num(a) && jv_is_num(b) && (a.kind == JK_FLOAT || b.kind == JK_FLOAT))
        return jv_num(a) < jv_num(b);   /* NaN compares false */
    return jv_cmp(c, pos, a, b) < 0;
}

static bool compare(struct jctx *c, uint32_t pos, enum jcmp op, struct jv a, struct jv b) {
    switch (op) {
    case JC_EQ: return jv_eq(a, b);
    case JC_NE: return !jv_eq(a, b);
    case JC_LT: return less(c, pos, a, b);
    case JC_GT: return less(c, pos, b, a);
    case JC_LE: return less(c, pos, a, b) || jv_eq(a, b);
    case JC_GE: return less(c, pos, b, a) || jv_eq(a, b);
    case JC_IN: return contains(c, pos, b, a);
    case JC_NOTIN: return !contains(c, pos, b, a);
    }
    return false;
}

/* ---- calls ---- */

static void eval_args(struct jctx *c, struct jscope *sc, const struct jnode *e, struct jargs *a) {
    int n_kw = 0;
    for (int i = 0; i < e->n; i++) n_kw += e->names[i].p != NULL;
    struct jv *pos = jalloc_array(c, (size_t)e->n + 1, sizeof *pos);
    struct jv *kwv = jalloc_array(c, (size_t)n_kw + 1, sizeof *kwv);
    struct jstr *kw = jalloc_array(c, (size_t)n_kw + 1, sizeof *kw);
    int np = 0, nk = 0;
    for (int i = 0; i < e->n; i++) {
        struct jv v = jeval(c, sc, e->v[i]);
        if (e->names[i].p) {
            for (int k = 0; k < nk; k++)
                if (jstr_same(kw[k], e->names[i]))
                    jfail(c, e->v[i]->pos, KVLLM_EINVAL, "keyword argument repeated");
            kw[nk] = e->names[i];
            kwv[nk++] = v;
        } else {
            pos[np++] = v;
        }
    }
    *a = (struct jargs){ .pos = pos, .n_pos = np, .kw = kw, .kwv = kwv, .n_kw = nk };
}

static int exec_block(struct jctx *c, struct jscope *sc, struct jnode *const *body, int n);

static struct jv call_macro(struct jctx *c, uint32_t pos, const struct jmacro *m, const struct jargs *a) {
    const struct jnode *def = m->def;
    if (a->n_pos > def->n)
        jfail(c, pos, KVLLM_EINVAL, "macro '%.*s' takes not more than %d argument(s)", (int)def->s.n, def->s.p, def->n);
    struct jscope *sc = jscope_new(c, m->closure);
    for (int k = 0; k < a->n_kw; k++) {
        bool known = false;
        for (int i = 0; i < def->n; i++) known |= jstr_same(def->names[i], a->kw[k]);
        if (!known)
            jfail(c, pos, KVLLM_EUNSUPPORTED, "macro '%.*s' has no parameter '%.*s' (**kwargs are not supported)",
                  (int)def->s.n, def->s.p, (int)a->kw[k].n, a->kw[k].p);
    }
    for (int i = 0; i < def->n; i++) {
        struct jv v = jv_undef(def->names[i]);
        bool given = i < a->n_pos;
        if (given) v = a->pos[i];
        for (int k = 0; k < a->n_kw; k++)
            if (jstr_same(def->names[i], a->kw[k])) {
                if (given) jfail(c, pos, KVLLM_EINVAL, "macro '%.*s' got multiple values for argument '%.*s'",
                                 (int)def->s.n, def->s.p, (int)a->kw[k].n, a->kw[k].p);
                v = a->kwv[k];
                given = true;
            }
        if (!given && def->v2[i]) v = jeval(c, sc, def->v2[i]);
        jscope_set(c, sc, def->names[i], v);
    }
    struct jbuf *saved = c->out, buf = { 0 };
    c->out = &buf;
    jdepth_enter(c, pos);
    exec_block(c, sc, def->c->v, def->c->n);
    jdepth_leave(c);
    c->out = saved;
    return jv_str(jb_str(&buf));
}

struct jv jcall(struct jctx *c, uint32_t pos, struct jv callee, const struct jargs *a) {
    switch ((enum jkind)callee.kind) {
    case JK_FUNC: {
        bool saved = c->precise;
        c->precise = false;
        struct jv r = callee.u.fn->fn(c, pos, callee.u.fn->self, a);
        bool precise = c->precise;
        c->precise = saved;
        return jtaint_result(c, r, precise, callee.u.fn->self, a);
    }
    case JK_MACRO: return call_macro(c, pos, callee.u.m, a);
    case JK_UNDEF: fail_undefined(c, pos, callee);
    default: jfail(c, pos, KVLLM_EINVAL, "'%s' object is not callable", jv_type_name(callee));
    }
}

/* ---- expressions ---- */

static struct jv eval_filter(struct jctx *c, struct jscope *sc, const struct jnode *e, struct jv input) {
    struct jv v = e->a ? jeval(c, sc, e->a) : input;
    struct jargs a;
    eval_args(c, sc, e, &a);
    return jcall_filter(c, e->pos, e->s, v, &a);
}

struct jv jeval(struct jctx *c, struct jscope *sc, const struct jnode *e) {
    struct jv r, l;
    jstep(c, e->pos, 1);
    jdepth_enter(c, e->pos);
    switch ((enum jn_kind)e->kind) {
    case JN_CONST: r = e->k; break;
    case JN_NAME:
        if (!lookup(sc, e->s, &r)) r = jv_undef(e->s);
        break;
    case JN_LIST: case JN_TUPLE:
        r = jv_list(c, e->kind == JN_LIST ? JL_LIST : JL_TUPLE, (size_t)e->n);
        for (int i = 0; i < e->n; i++) jlist_push(c, r.u.l, jeval(c, sc, e->v[i]));
        break;
    case JN_DICT:
        r = jv_dict(c);
        for (int i = 0; i < e->n; i++) {
            struct jv k = jeval(c, sc, e->v[i]);
            c->err_pos = e->v[i]->pos;
            jdict_set(c, r.u.d, k, jeval(c, sc, e->v2[i]));
        }
        break;
    case JN_GETATTR: r = jgetattr(c, e->pos, jeval(c, sc, e->a), e->s); break;
    case JN_GETITEM:
        if (e->b->kind == JN_SLICE) r = get_slice(c, sc, e);
        else {
            l = jeval(c, sc, e->a);
            r = jgetitem(c, e->pos, l, jeval(c, sc, e->b));
        }
        break;
    case JN_CALL: {
        struct jv callee = jeval(c, sc, e->a);
        struct jargs a;
        eval_args(c, sc, e, &a);
        r = jcall(c, e->pos, callee, &a);
        break;
    }
    case JN_FILTER: r = eval_filter(c, sc, e, jv_undef((struct jstr){ 0 })); break;
    case JN_TEST: {
        struct jv v = jeval(c, sc, e->a);
        struct jargs a;
        eval_args(c, sc, e, &a);
        r = jv_bool(jcall_test(c, e->pos, e->s, v, &a));
        break;
    }
    case JN_NOT: r = jv_bool(!jv_truthy(jeval(c, sc, e->a))); break;
    case JN_NEG: case JN_POS:
        l = jeval(c, sc, e->a);
        if (l.kind == JK_FLOAT) r = jv_float(e->kind == JN_NEG ? -l.u.f : l.u.f);
        else if (l.kind == JK_INT || l.kind == JK_BOOL) {
            int64_t i = as_int(l);
            if (e->kind == JN_NEG && i == INT64_MIN) fail_overflow(c, e->pos);
            r = jv_int(e->kind == JN_NEG ? -i : i);
        } else if (l.kind == JK_UNDEF) fail_undefined(c, e->pos, l);
        else jfail(c, e->pos, KVLLM_EINVAL, "bad operand type for unary %c: '%s'", e->kind == JN_NEG ? '-' : '+',
                   jv_type_name(l));
        break;
    case JN_BINOP:
        l = jeval(c, sc, e->a);
        r = jeval(c, sc, e->b);
        if (e->op == '~') {
            struct jbuf b = { 0 };
            jv_write_str(c, e->pos, &b, l);
            jv_write_str(c, e->pos, &b, r);
            r = jv_str(jb_str(&b));
        } else if (e->op == '+') r = add(c, e->pos, l, r);
        else r = arith(c, e->pos, (char)e->op, l, r);
        break;
    case JN_AND: case JN_OR:
        r = jeval(c, sc, e->a);
        if (jv_truthy(r) == (e->kind == JN_AND)) r = jeval(c, sc, e->b);
        break;
    case JN_COMPARE:
        l = jeval(c, sc, e->a);
        r = jv_bool(true);
        for (int i = 0; i < e->n; i++) {
            struct jv rhs = jeval(c, sc, e->v[i]);
            if (!compare(c, e->v[i]->pos, (enum jcmp)e->ops[i], l, rhs)) { r = jv_bool(false); break; }
            l = rhs;
        }
        break;
    case JN_COND:
        if (jv_truthy(jeval(c, sc, e->a))) r = jeval(c, sc, e->b);
        else r = e->c ? jeval(c, sc, e->c) : jv_undef(jstr_c("the inline if-expression had no else"));
        break;
    default:
        jfail(c, e->pos, KVLLM_EINVAL, "not an expression");
    }
    jdepth_leave(c);
    return r;
}

/* ---- statements ---- */

static void assign(struct jctx *c, struct jscope *sc, const struct jnode *target, struct jv v) {
    if (target->kind == JN_NAME) { jscope_set(c, sc, target->s, v); return; }
    if (target->kind == JN_NSREF) {
        struct jv ns;
        if (!lookup(sc, target->s, &ns) || ns.kind != JK_NS)
            jfail(c, target->pos, KVLLM_EINVAL, "can not assign attribute on non-namespace object");
        jdict_set(c, ns.u.d, target->k, v);
        return;
    }
    size_t n;
    const struct jv *items = jv_iterate(c, target->pos, v, &n);
    if (n != (size_t)target->n)
        jfail(c, target->pos, KVLLM_EINVAL, "%s values to unpack (expected %d, got %zu)",
              n > (size_t)target->n ? "too many" : "not enough", target->n, n);
    for (int i = 0; i < target->n; i++) assign(c, sc, target->v[i], items[i]);
}

/* Render body into a fresh buffer (block set, filter block). */
static struct jstr capture(struct jctx *c, struct jscope *sc, struct jnode *const *body, int n) {
    struct jbuf *saved = c->out, buf = { 0 };
    c->out = &buf;
    exec_block(c, sc, body, n);
    c->out = saved;
    return jb_str(&buf);
}

static int exec_for(struct jctx *c, struct jscope *sc, const struct jnode *s) {
    struct jv seq = jeval(c, sc, s->b);
    size_t n;
    const struct jv *items = jv_iterate(c, s->b->pos, seq, &n);
    if (s->c) {   /* for x in y if cond: filter first, so loop.* count what remains */
        struct jv *kept = jalloc_array(c, n ? n : 1, sizeof *kept);
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            struct jscope *it = jscope_new(c, sc);
            assign(c, it, s->a, items[i]);
            if (jv_truthy(jeval(c, it, s->c))) kept[k++] = items[i];
        }
        items = kept;
        n = k;
    }
    if (!n) {
        exec_block(c, jscope_new(c, sc), s->v2, s->n2);
        return FLOW_NORMAL;
    }
    /* jinja2 runs the else block unless some iteration reached the end of the body: one that
     * ends in break or continue does not count (its compiled loop clears the flag at the end) */
    bool completed = false;
    struct jloop *loop = jalloc(c, sizeof *loop);
    loop->items = items;
    loop->n = n;
    loop->depth = 1;   /* depth grows only in recursive loops, which are not supported */
    struct jv lv = { .kind = JK_LOOP };
    lv.u.loop = loop;
    for (size_t i = 0; i < n; i++) {
        jstep(c, s->pos, 1);
        loop->i = i;
        struct jscope *it = jscope_new(c, sc);
        jscope_set(c, it, jstr_c("loop"), lv);
        assign(c, it, s->a, items[i]);
        const int flow = exec_block(c, it, s->v, s->n);
        if (flow == FLOW_BREAK) break;
        completed |= flow == FLOW_NORMAL;
    }
    if (!completed) exec_block(c, jscope_new(c, sc), s->v2, s->n2);
    return FLOW_NORMAL;
}

static int exec(struct jctx *c, struct jscope *sc, const struct jnode *s) {
    c->err_pos = s->pos;
    jstep(c, s->pos, 1);
    switch ((enum jn_kind)s->kind) {
    case JS_DATA: jb_put(c, c->out, s->s.p, s->s.n); return FLOW_NORMAL;
    case JS_OUTPUT: {
        struct jv v = jeval(c, sc, s->a);
        if (v.kind == JK_FUNC)
            jfail(c, s->pos, KVLLM_EUNSUPPORTED, "cannot print a function (did you mean to call it?)");
        jv_write_str(c, s->a->pos, c->out, v);
        return FLOW_NORMAL;
    }
    case JS_IF:
        if (jv_truthy(jeval(c, sc, s->a))) return exec_block(c, sc, s->b->v, s->b->n);
        return s->c ? exec(c, sc, s->c) : FLOW_NORMAL;
    case JS_FOR: return exec_for(c, sc, s);
    case JS_SET: assign(c, sc, s->a, jeval(c, sc, s->b)); return FLOW_NORMAL;
    case JS_SETBLOCK: {   /* its body is a frame of its own: a set inside does not leak out */
        struct jv v = jv_str(capture(c, jscope_new(c, sc), s->v, s->n));
        if (s->b) v = eval_filter(c, sc, s->b, v);
        assign(c, sc, s->a, v);
        return FLOW_NORMAL;
    }
    case JS_FILTERBLOCK: {
        struct jv v = eval_filter(c, sc, s->b, jv_str(capture(c, jscope_new(c, sc), s->v, s->n)));
        jv_write_str(c, s->pos, c->out, v);
        return FLOW_NORMAL;
    }
    case JS_MACRO: {
        struct jv m = { .kind = JK_MACRO };
        m.u.m = jalloc(c, sizeof *m.u.m);
        m.u.m->def = s;
        m.u.m->closure = sc;
        jscope_set(c, sc, s->s, m);
        return FLOW_NORMAL;
    }
    case JS_WITH: {
        struct jscope *inner = jscope_new(c, sc);
        for (int i = 0; i < s->n; i++) jscope_set(c, inner, s->names[i], jeval(c, sc, s->v2[i]));
        return exec_block(c, inner, s->c->v, s->c->n);
    }
    case JS_BREAK: return FLOW_BREAK;
    case JS_CONTINUE: return FLOW_CONTINUE;
    case JS_BLOCK: return exec_block(c, sc, s->v, s->n);
    default: jfail(c, s->pos, KVLLM_EINVAL, "not a statement");
    }
}

static int exec_block(struct jctx *c, struct jscope *sc, struct jnode *const *body, int n) {
    for (int i = 0; i < n; i++) {
        jdepth_enter(c, body[i]->pos);
        int flow = exec(c, sc, body[i]);
        jdepth_leave(c);
        if (flow != FLOW_NORMAL) return flow;
    }
    return FLOW_NORMAL;
}

void jrender(struct jctx *c, const struct jnode *root, struct jbuf *out) {
    c->out = out;
    c->root_out = out;
    exec_block(c, jscope_new(c, c->globals), root->v, root->n);
}
