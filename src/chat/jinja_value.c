/* jinja_value.c — the interpreter's memory, errors and values: an arena
 * per render, Python's ==, <, truth, str(), repr() and json.dumps() over
 * struct jv, and the UTF-8 helpers they need. */
#include "chat/jinja.h"
#include "kvllm.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ---- */

struct jchunk {
    struct jchunk *next;
    size_t used, cap;
    max_align_t data[];
};

#define JCHUNK_MIN ((size_t)64 << 10)

void jarena_free(struct jctx *c) {
    for (struct jchunk *k = c->chunks, *next; k; k = next) {
        next = k->next;
        free(k);
    }
    c->chunks = NULL;
    c->mem_used = 0;
}

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

void *jalloc(struct jctx *c, size_t n) {
    if (n > c->mem_cap) jfail(c, c->err_pos, KVLLM_ENOMEM, "the template needs more than %zu MiB", c->mem_cap >> 20);
    n = round16(n ? n : 1);
    struct jchunk *k = c->chunks;
    if (!k || k->cap - k->used < n) {
        size_t cap = n > JCHUNK_MIN ? n : JCHUNK_MIN;
        if (c->mem_used + cap > c->mem_cap)
            jfail(c, c->err_pos, KVLLM_ENOMEM, "the template needs more than %zu MiB", c->mem_cap >> 20);
        k = malloc(sizeof *k + cap);
        if (!k) jfail(c, c->err_pos, KVLLM_ENOMEM, "out of memory");
        k->used = 0;
        k->cap = cap;
        k->next = c->chunks;
        c->chunks = k;
        c->mem_used += cap;
    }
    void *p = (char *)k->data + k->used;
    k->used += n;
    memset(p, 0, n);
    return p;
}

void *jalloc_array(struct jctx *c, size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) jfail(c, c->err_pos, KVLLM_ENOMEM, "array too large");
    return jalloc(c, n * size);
}

struct jstr jstr_dup(struct jctx *c, const char *p, size_t n) {
    char *d = jalloc(c, n + 1);
    if (n) memcpy(d, p, n);
    return (struct jstr){ d, n, NULL };
}

bool jstr_eq(struct jstr a, const char *s) {
    size_t n = strlen(s);
    return a.n == n && memcmp(a.p, s, n) == 0;
}

/* ---- errors ---- */

void jfail(struct jctx *c, uint32_t pos, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
    va_end(ap);
    c->err_code = code;
    c->err_pos = pos;
    longjmp(c->jmp, 1);
}

void jpos_linecol(const struct jctx *c, uint32_t pos, int *line, int *col) {
    int l = 1, k = 1;
    size_t end = pos < c->src_len ? pos : c->src_len;
    for (size_t i = 0; i < end; i++) {
        if (c->src[i] == '\n') { l++; k = 1; }
        else if (((uint8_t)c->src[i] & 0xc0) != 0x80) k++;
    }
    *line = l;
    *col = k;
}

void jfail_steps(struct jctx *c, uint32_t pos) {
    jfail(c, pos, KVLLM_ERANGE, "the render took more than %llu steps (the template's step budget; a loop that "
          "does not end, or work quadratic in its input?)", (unsigned long long)c->max_steps);
}

void jdepth_enter(struct jctx *c, uint32_t pos) {
    if (++c->depth > JINJA_MAX_DEPTH)
        jfail(c, pos, KVLLM_EINVAL, "nesting deeper than %d (recursive macro?)", JINJA_MAX_DEPTH);
}

/* ---- byte buffers ---- */

static void jb_reserve(struct jctx *c, struct jbuf *b, size_t extra) {
    /* the output, and any string a template builds, stays under the output budget */
    if (extra > c->max_out || b->n > c->max_out - extra)
        jfail(c, c->err_pos, KVLLM_ERANGE, "%s larger than %zu bytes (the template's output budget)",
              b == c->root_out ? "the output is" : "a string the template builds is", c->max_out);
    if (b->cap - b->n >= extra) return;
    if (extra > c->mem_cap) jfail(c, c->err_pos, KVLLM_ENOMEM, "string too large");
    size_t want = b->n + extra;
    /* grow in place when the buffer is the newest allocation of its chunk */
    struct jchunk *k = c->chunks;
    if (b->p && k && b->p + round16(b->cap) == (char *)k->data + k->used &&
        round16(want) - round16(b->cap) <= k->cap - k->used) {
        k->used += round16(want) - round16(b->cap);
        b->cap = round16(want);
        return;
    }
    size_t cap = b->cap * 2 > want ? b->cap * 2 : want;
    if (cap < 64) cap = 64;
    char *p = jalloc(c, cap);
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = round16(cap);
}

void jb_put(struct jctx *c, struct jbuf *b, const char *p, size_t n) {
    if (!n) return;
    jb_reserve(c, b, n);
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

void jb_putc(struct jctx *c, struct jbuf *b, char ch) { jb_put(c, b, &ch, 1); }

void jb_printf(struct jctx *c, struct jbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) { jb_put(c, b, tmp, (size_t)n); return; }
    jb_reserve(c, b, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

/* ---- taint ---- */

/* Append span [off, off + n) to *t (allocated on first use); offsets only
 * grow, so a span touching the last one extends it. */
static void taint_add(struct jctx *c, struct jtaint **t, size_t off, size_t n) {
    if (!n) return;
    if (!*t) *t = jalloc(c, sizeof **t);
    struct jtaint *x = *t;
    if (x->n && x->s[x->n - 1].off + x->s[x->n - 1].n >= off) {
        struct jspan *last = &x->s[x->n - 1];
        if (off + n > last->off + last->n) last->n = off + n - last->off;
        return;
    }
    if (x->n == x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 4;
        struct jspan *ns = jalloc_array(c, cap, sizeof *ns);
        if (x->n) memcpy(ns, x->s, x->n * sizeof *ns);
        x->s = ns;
        x->cap = cap;
    }
    x->s[x->n++] = (struct jspan){ off, n };
}

/* Add the spans of s that overlap its bytes [from, to), shifted by -from + at. */
static void taint_copy(struct jctx *c, struct jtaint **t, struct jstr s, size_t from, size_t to, size_t at) {
    if (!s.t) return;
    for (size_t i = 0; i < s.t->n && s.t->s[i].off < to; i++) {
        size_t lo = s.t->s[i].off, hi = lo + s.t->s[i].n;
        if (hi > s.n) hi = s.n;
        if (lo < from) lo = from;
        if (hi > to) hi = to;
        if (lo < hi) taint_add(c, t, lo - from + at, hi - lo);
    }
}

bool jv_tainted(struct jv v) {
    /* A bound method's taint is its object's.  Followed through a pointer, not by
     * recursing on the by-value argument: clang 14 at -O2/-O3 turned that tail call
     * into a loop that overwrote the argument's memory, which, once inlined into
     * jdict_set, was the value being stored (every global function stored as Undefined). */
    const struct jv *p = &v;
    while (p->kind == JK_FUNC) p = &p->u.fn->self;
    switch ((enum jkind)p->kind) {
    case JK_STR: return jstr_tainted(p->u.s);
    case JK_LIST: return p->u.l->tainted;
    case JK_DICT: case JK_NS: return p->u.d->tainted;
    default: return false;
    }
}

void jb_put_str(struct jctx *c, struct jbuf *b, struct jstr s) {
    size_t at = b->n;
    jb_put(c, b, s.p, s.n);
    if (jstr_tainted(s)) taint_copy(c, &b->t, s, 0, s.n, at);
}

void jb_taint_from(struct jctx *c, struct jbuf *b, size_t start) {
    if (b->n > start) taint_add(c, &b->t, start, b->n - start);
}

struct jstr jstr_taint_all(struct jctx *c, struct jstr s) {
    struct jtaint *t = NULL;
    taint_add(c, &t, 0, s.n);
    s.t = t;
    return s;
}

struct jstr jstr_sub(struct jctx *c, struct jstr s, size_t off, size_t n) {
    struct jstr r = { s.p + off, n, NULL };
    if (jstr_tainted(s)) {
        struct jtaint *t = NULL;
        taint_copy(c, &t, s, off, off + n, 0);
        r.t = t;
    }
    return r;
}

/* Every string of a list's items (one level) marked as message text. */
static void taint_list_items(struct jctx *c, struct jlist *l) {
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].kind == JK_STR && l->v[i].u.s.n) l->v[i].u.s = jstr_taint_all(c, l->v[i].u.s);
    l->tainted = true;
}

struct jv jtaint_result(struct jctx *c, struct jv r, bool precise, struct jv self, const struct jargs *a) {
    if (precise) return r;
    bool in = jv_tainted(self);
    for (int i = 0; a && !in && i < a->n_pos; i++) in = jv_tainted(a->pos[i]);
    for (int i = 0; a && !in && i < a->n_kw; i++) in = jv_tainted(a->kwv[i]);
    if (!in) return r;
    if (r.kind == JK_STR && r.u.s.n) r.u.s = jstr_taint_all(c, r.u.s);
    else if (r.kind == JK_LIST) taint_list_items(c, r.u.l);
    return r;
}

/* ---- UTF-8 ---- */

uint32_t utf8_next(const char *s, size_t n, size_t *i) {
    const uint8_t *u = (const uint8_t *)s;
    size_t k = *i;
    uint8_t b = u[k];
    int len = b < 0x80 ? 1 : b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
    if (len == 1) { *i = k + 1; return b; }
    if (len == 0 || k + (size_t)len > n) { *i = k + 1; return 0xdc00u + b; }
    uint32_t cp = b & (0x7f >> len);
    for (int j = 1; j < len; j++) {
        uint8_t cb = u[k + j];
        uint8_t lo = 0x80, hi = 0xbf;
        if (j == 1) {
            if (b == 0xe0) lo = 0xa0;
            else if (b == 0xed) hi = 0x9f;
            else if (b == 0xf0) lo = 0x90;
            else if (b == 0xf4) hi = 0x8f;
        }
        if (cb < lo || cb > hi) { *i = k + 1; return 0xdc00u + b; }
        cp = (cp << 6) | (cb & 0x3f);
    }
    *i = k + (size_t)len;
    return cp;
}

void utf8_put(struct jctx *c, struct jbuf *b, uint32_t cp) {
    char t[4];
    size_t n;
    if (cp >= 0xdc80 && cp <= 0xdcff) { t[0] = (char)(cp - 0xdc00); n = 1; }  /* a raw byte */
    else if (cp < 0x80) { t[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { t[0] = (char)(0xc0 | cp >> 6); t[1] = (char)(0x80 | (cp & 0x3f)); n = 2; }
    else if (cp < 0x10000) {
        t[0] = (char)(0xe0 | cp >> 12); t[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        t[2] = (char)(0x80 | (cp & 0x3f)); n = 3;
    } else {
        t[0] = (char)(0xf0 | cp >> 18); t[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); t[3] = (char)(0x80 | (cp & 0x3f)); n = 4;
    }
    jb_put(c, b, t, n);
}

size_t utf8_count(struct jstr s) {
    size_t n = 0;
    for (size_t i = 0; i < s.n; n++) utf8_next(s.p, s.n, &i);
    return n;
}

bool py_isspace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* ---- constructors ---- */

struct jv jv_cstr(struct jctx *c, const char *s) { return jv_str(jstr_dup(c, s, strlen(s))); }

struct jv jv_list(struct jctx *c, enum jshape shape, size_t cap) {
    struct jv v = { .kind = JK_LIST };
    v.u.l = jalloc(c, sizeof *v.u.l);
    v.u.l->shape = (uint8_t)shape;
    if (cap) {
        v.u.l->v = jalloc_array(c, cap, sizeof(struct jv));
        v.u.l->cap = cap;
    }
    return v;
}

struct jv jv_dict(struct jctx *c) {
    struct jv v = { .kind = JK_DICT };
    v.u.d = jalloc(c, sizeof *v.u.d);
    return v;
}

struct jv jv_func(struct jctx *c, const char *name, jbuiltin fn, struct jv self) {
    struct jv v = { .kind = JK_FUNC };
    v.u.fn = jalloc(c, sizeof *v.u.fn);
    v.u.fn->name = name;
    v.u.fn->fn = fn;
    v.u.fn->self = self;
    return v;
}

void jlist_push(struct jctx *c, struct jlist *l, struct jv v) {
    jstep(c, c->err_pos, 1);
    if (jv_tainted(v)) l->tainted = true;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        struct jv *nv = jalloc_array(c, cap, sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

static bool hashable(struct jv v, int depth);

bool jv_hashable(struct jv v) { return hashable(v, 0); }

static bool hashable(struct jv v, int depth) {
    if (v.kind == JK_LIST) {
        if (v.u.l->shape != JL_TUPLE || depth > JINJA_MAX_DEPTH) return false;
        for (size_t i = 0; i < v.u.l->n; i++)
            if (!hashable(v.u.l->v[i], depth + 1)) return false;
        return true;
    }
    return v.kind != JK_DICT && v.kind != JK_NS;
}

static bool jdict_find(const struct jdict *d, struct jv key, size_t *at) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->k[i], key)) { *at = i; return true; }
    return false;
}

void jdict_set(struct jctx *c, struct jdict *d, struct jv key, struct jv val) {
    if (!hashable(key, 0)) jfail(c, c->err_pos, KVLLM_EINVAL, "unhashable type: '%s'", jv_type_name(key));
    size_t at;
    jstep(c, c->err_pos, d->n);   /* the find is linear */
    if (jv_tainted(key) || jv_tainted(val)) d->tainted = true;
    if (jdict_find(d, key, &at)) { d->v[at] = val; return; }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;   /* most dicts are scopes of a few names */
        struct jv *nk = jalloc_array(c, cap, sizeof *nk), *nv = jalloc_array(c, cap, sizeof *nv);
        if (d->n) { memcpy(nk, d->k, d->n * sizeof *nk); memcpy(nv, d->v, d->n * sizeof *nv); }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n++] = val;
}

bool jdict_get(const struct jdict *d, struct jv key, struct jv *out) {
    size_t at;
    if (!jdict_find(d, key, &at)) return false;
    *out = d->v[at];
    return true;
}

bool jdict_get_str(const struct jdict *d, struct jstr key, struct jv *out) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].kind == JK_STR && jstr_same(d->k[i].u.s, key)) { *out = d->v[i]; return true; }
    return false;
}

/* ---- Python semantics ---- */

const char *jv_type_name(struct jv v) {
    switch ((enum jkind)v.kind) {
    case JK_UNDEF: return "Undefined";
    case JK_NONE: return "NoneType";
    case JK_BOOL: return "bool";
    case JK_INT: return "int";
    case JK_FLOAT: return "float";
    case JK_STR: return v.safe ? "Markup" : "str";
    case JK_LIST:
        switch ((enum jshape)v.u.l->shape) {
        case JL_LIST: return "list";
        case JL_TUPLE: return "tuple";
        case JL_GEN: return "generator";
        case JL_ITEMS: return "dict_items";
        case JL_KEYS: return "dict_keys";
        case JL_VALUES: return "dict_values";
        case JL_RANGE: return "range";
        }
        return "list";
    case JK_DICT: return "dict";
    case JK_NS: return "Namespace";
    case JK_MACRO: return "Macro";
    case JK_FUNC: return "builtin_function_or_method";
    case JK_LOOP: return "LoopContext";
    }
    return "object";
}

bool jv_truthy(struct jv v) {
    switch ((enum jkind)v.kind) {
    case JK_UNDEF: case JK_NONE: return false;
    case JK_BOOL: return v.u.b;
    case JK_INT: return v.u.i != 0;
    case JK_FLOAT: return v.u.f != 0.0;
    case JK_STR: return v.u.s.n > 0;
    case JK_LIST: return v.u.l->shape == JL_GEN || v.u.l->n > 0;  /* a generator is always true */
    case JK_DICT: return v.u.d->n > 0;
    default: return true;
    }
}

double jv_num(struct jv v) {
    return v.kind == JK_FLOAT ? v.u.f : v.kind == JK_INT ? (double)v.u.i : v.kind == JK_BOOL ? (double)v.u.b : 0.0;
}

/* Exact int == float, as Python compares them. */
static bool int_eq_float(int64_t i, double f) {
    if (!(f == floor(f)) || f < -9223372036854775808.0 || f >= 9223372036854775808.0) return false;
    return (int64_t)f == i;
}

/* Python ==.  Containers nested deeper than JINJA_MAX_DEPTH (only a
 * template building them on purpose gets there) compare unequal rather
 * than overflow the stack. */
static bool eq_depth(struct jv a, struct jv b, int depth);

bool jv_eq(struct jv a, struct jv b) { return eq_depth(a, b, 0); }

static bool eq_depth(struct jv a, struct jv b, int depth) {
    if (depth > JINJA_MAX_DEPTH) return false;
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.kind != JK_FLOAT && b.kind != JK_FLOAT)
            return (a.kind == JK_INT ? a.u.i : a.u.b) == (b.kind == JK_INT ? b.u.i : b.u.b);
        if (a.kind == JK_FLOAT && b.kind == JK_FLOAT) return a.u.f == b.u.f;
        if (a.kind == JK_FLOAT) { struct jv t = a; a = b; b = t; }
        return int_eq_float(a.kind == JK_INT ? a.u.i : a.u.b, b.u.f);
    }
    if (a.kind != b.kind) return false;
    switch ((enum jkind)a.kind) {
    case JK_UNDEF: case JK_NONE: return true;
    case JK_STR: return jstr_same(a.u.s, b.u.s);
    case JK_LIST: {
        const struct jlist *x = a.u.l, *y = b.u.l;
        if (x == y) return true;
        bool seq_x = x->shape == JL_LIST || x->shape == JL_TUPLE;
        if (x->shape != y->shape || !seq_x || x->n != y->n) return false;
        for (size_t i = 0; i < x->n; i++)
            if (!eq_depth(x->v[i], y->v[i], depth + 1)) return false;
        return true;
    }
    case JK_DICT: {
        const struct jdict *x = a.u.d, *y = b.u.d;
        if (x->n != y->n) return false;
        for (size_t i = 0; i < x->n; i++) {
            struct jv other;
            if (!jdict_get(y, x->k[i], &other) || !eq_depth(x->v[i], other, depth + 1)) return false;
        }
        return true;
    }
    case JK_NS: return a.u.d == b.u.d;
    case JK_MACRO: return a.u.m == b.u.m;
    case JK_FUNC: return a.u.fn == b.u.fn;
    case JK_LOOP: return a.u.loop == b.u.loop;
    default: return false;
    }
}

int jv_cmp(struct jctx *c, uint32_t pos, struct jv a, struct jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.kind != JK_FLOAT && b.kind != JK_FLOAT) {
            int64_t x = a.kind == JK_INT ? a.u.i : a.u.b, y = b.kind == JK_INT ? b.u.i : b.u.b;
            return x < y ? -1 : x > y;
        }
        double x = jv_num(a), y = jv_num(b);
        return x < y ? -1 : x > y ? 1 : 0;   /* NaN: "equal" here; callers test == first */
    }
    if (a.kind == JK_STR && b.kind == JK_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int r = n ? memcmp(a.u.s.p, b.u.s.p, n) : 0;
        if (r) return r < 0 ? -1 : 1;
        return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    if (a.kind == JK_LIST && b.kind == JK_LIST && a.u.l->shape == b.u.l->shape &&
        (a.u.l->shape == JL_LIST || a.u.l->shape == JL_TUPLE)) {
        const struct jlist *x = a.u.l, *y = b.u.l;
        for (size_t i = 0; i < x->n && i < y->n; i++) {
            if (jv_eq(x->v[i], y->v[i])) continue;
            jdepth_enter(c, pos);
            int r = jv_cmp(c, pos, x->v[i], y->v[i]);
            jdepth_leave(c);
            return r;
        }
        return x->n < y->n ? -1 : x->n > y->n;
    }
    if (a.kind == JK_UNDEF || b.kind == JK_UNDEF)
        jfail(c, pos, KVLLM_EINVAL, "'%.*s' is undefined", (int)(a.kind == JK_UNDEF ? a : b).u.s.n,
              (a.kind == JK_UNDEF ? a : b).u.s.p);
    jfail(c, pos, KVLLM_EINVAL, "'<' not supported between instances of '%s' and '%s'",
          jv_type_name(a), jv_type_name(b));
}

/* ---- str() and repr() ---- */

void jv_write_float(struct jctx *c, struct jbuf *b, double f) {
    if (isnan(f)) { jb_puts(c, b, "nan"); return; }
    if (isinf(f)) { jb_puts(c, b, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { jb_puts(c, b, signbit(f) ? "-0.0" : "0.0"); return; }
    /* shortest digits that read back as f (Python's repr) */
    char buf[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    char digits[24];
    int nd = 0, i = 0;
    bool neg = buf[0] == '-';
    if (neg) i++;
    for (; buf[i] && buf[i] != 'e'; i++)
        if (buf[i] != '.') digits[nd++] = buf[i];
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int exp = atoi(buf + i + 1);
    int decpt = exp + 1;
    if (neg) jb_putc(c, b, '-');
    if (decpt > 16 || decpt <= -4) {
        jb_putc(c, b, digits[0]);
        if (nd > 1) { jb_putc(c, b, '.'); jb_put(c, b, digits + 1, (size_t)nd - 1); }
        jb_printf(c, b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (decpt <= 0) {
        jb_puts(c, b, "0.");
        for (int k = 0; k < -decpt; k++) jb_putc(c, b, '0');
        jb_put(c, b, digits, (size_t)nd);
    } else if (decpt >= nd) {
        jb_put(c, b, digits, (size_t)nd);
        for (int k = nd; k < decpt; k++) jb_putc(c, b, '0');
        jb_puts(c, b, ".0");
    } else {
        jb_put(c, b, digits, (size_t)decpt);
        jb_putc(c, b, '.');
        jb_put(c, b, digits + decpt, (size_t)(nd - decpt));
    }
}

/* Characters Python's str.isprintable() rejects, as far as repr() needs
 * them: controls, separators other than space, the common format
 * characters, private use, surrogates, noncharacters. */
static bool py_unprintable(uint32_t cp) {
    if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) return true;
    if (cp < 0x600) return false;
    return (cp >= 0x600 && cp <= 0x605) || cp == 0x61c || cp == 0x6dd || cp == 0x70f || cp == 0x180e ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) ||
           (cp >= 0x205f && cp <= 0x206f) || cp == 0x3000 || (cp >= 0xd800 && cp <= 0xf8ff) ||
           (cp >= 0xfdd0 && cp <= 0xfdef) || cp == 0xfeff || (cp >= 0xfff9 && cp <= 0xfffb) ||
           (cp & 0xfffe) == 0xfffe || cp == 0x110bd || cp == 0x110cd || (cp >= 0x1bca0 && cp <= 0x1bca3) ||
           (cp >= 0x1d173 && cp <= 0x1d17a) || cp == 0xe0001 || (cp >= 0xe0020 && cp <= 0xe007f) ||
           cp >= 0xf0000;
}

static void write_str_repr(struct jctx *c, struct jbuf *b, struct jstr s) {
    bool has_sq = memchr(s.p, '\'', s.n) != NULL, has_dq = memchr(s.p, '"', s.n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jb_putc(c, b, q);
    for (size_t i = 0; i < s.n;) {
        size_t start = i;
        uint32_t cp = utf8_next(s.p, s.n, &i);
        if (cp == (uint32_t)q || cp == '\\') { jb_putc(c, b, '\\'); jb_putc(c, b, (char)cp); }
        else if (cp == '\n') jb_puts(c, b, "\\n");
        else if (cp == '\r') jb_puts(c, b, "\\r");
        else if (cp == '\t') jb_puts(c, b, "\\t");
        else if (cp >= 0xdc80 && cp <= 0xdcff && i == start + 1 && (uint8_t)s.p[start] >= 0x80)
            jb_printf(c, b, "\\udc%02x", (unsigned)(cp & 0xff));   /* surrogateescape'd byte */
        else if (py_unprintable(cp)) {
            if (cp < 0x100) jb_printf(c, b, "\\x%02x", (unsigned)cp);
            else if (cp < 0x10000) jb_printf(c, b, "\\u%04x", (unsigned)cp);
            else jb_printf(c, b, "\\U%08x", (unsigned)cp);
        } else jb_put(c, b, s.p + start, i - start);
    }
    jb_putc(c, b, q);
}

static void write_seq(struct jctx *c, uint32_t pos, struct jbuf *b, const struct jlist *l,
                      const char *open, const char *close) {
    jb_puts(c, b, open);
    for (size_t i = 0; i < l->n; i++) {
        if (i) jb_puts(c, b, ", ");
        jv_write_repr(c, pos, b, l->v[i]);
    }
    if (l->shape == JL_TUPLE && l->n == 1) jb_putc(c, b, ',');
    jb_puts(c, b, close);
}

static void write_dict(struct jctx *c, uint32_t pos, struct jbuf *b, const struct jdict *d) {
    jb_putc(c, b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) jb_puts(c, b, ", ");
        jv_write_repr(c, pos, b, d->k[i]);
        jb_puts(c, b, ": ");
        jv_write_repr(c, pos, b, d->v[i]);
    }
    jb_putc(c, b, '}');
}

static void write_object(struct jctx *c, uint32_t pos, struct jbuf *b, struct jv v);

static void write_container(struct jctx *c, uint32_t pos, struct jbuf *b, struct jv v) {
    jdepth_enter(c, pos);
    write_object(c, pos, b, v);
    jdepth_leave(c);
}

static void write_object(struct jctx *c, uint32_t pos, struct jbuf *b, struct jv v) {
    switch ((enum jkind)v.kind) {
    case JK_LIST:
        switch ((enum jshape)v.u.l->shape) {
        case JL_LIST: write_seq(c, pos, b, v.u.l, "[", "]"); return;
        case JL_TUPLE: write_seq(c, pos, b, v.u.l, "(", ")"); return;
        case JL_ITEMS: write_seq(c, pos, b, v.u.l, "dict_items([", "])"); return;
        case JL_KEYS: write_seq(c, pos, b, v.u.l, "dict_keys([", "])"); return;
        case JL_VALUES: write_seq(c, pos, b, v.u.l, "dict_values([", "])"); return;
        case JL_GEN: case JL_RANGE: break;
        }
        break;
    case JK_DICT: write_dict(c, pos, b, v.u.d); return;
    case JK_NS: jb_puts(c, b, "<Namespace "); write_dict(c, pos, b, v.u.d); jb_putc(c, b, '>'); return;
    case JK_MACRO:
        jb_puts(c, b, "<Macro ");
        write_str_repr(c, b, v.u.m->def->s);
        jb_putc(c, b, '>');
        return;
    case JK_LOOP:
        jb_printf(c, b, "<LoopContext %zu/%zu>", v.u.loop->i + 1, v.u.loop->n);
        return;
    default: break;
    }
    /* Python would print a memory address */
    jfail(c, pos, KVLLM_EUNSUPPORTED, "cannot print a %s object", jv_type_name(v));
}

void jv_write_str(struct jctx *c, uint32_t pos, struct jbuf *b, struct jv v) {
    switch ((enum jkind)v.kind) {
    case JK_UNDEF: return;
    case JK_NONE: jb_puts(c, b, "None"); return;
    case JK_BOOL: jb_puts(c, b, v.u.b ? "True" : "False"); return;
    case JK_INT: jb_printf(c, b, "%lld", (long long)v.u.i); return;
    case JK_FLOAT: jv_write_float(c, b, v.u.f); return;
    case JK_STR: jb_put_str(c, b, v.u.s); return;
    default: {
        size_t start = b->n;
        write_container(c, pos, b, v);
        if (jv_tainted(v)) jb_taint_from(c, b, start);   /* a repr holding message text is message text */
    }
    }
}

void jv_write_repr(struct jctx *c, uint32_t pos, struct jbuf *b, struct jv v) {
    if (v.kind == JK_UNDEF) { jb_puts(c, b, "Undefined"); return; }
    if (v.kind == JK_STR) {
        if (v.safe) jb_puts(c, b, "Markup(");
        write_str_repr(c, b, v.u.s);
        if (v.safe) jb_putc(c, b, ')');
        return;
    }
    jv_write_str(c, pos, b, v);
}

struct jstr jv_to_str(struct jctx *c, uint32_t pos, struct jv v) {
    if (v.kind == JK_STR) return v.u.s;
    struct jbuf b = { 0 };
    jv_write_str(c, pos, &b, v);
    return jb_str(&b);
}

/* ---- json.dumps ---- */

static void write_json_str(struct jctx *c, struct jbuf *b, struct jstr s, bool ascii) {
    jb_putc(c, b, '"');
    for (size_t i = 0; i < s.n;) {
        size_t start = i;
        uint32_t cp = utf8_next(s.p, s.n, &i);
        switch (cp) {
        case '"': jb_puts(c, b, "\\\""); continue;
        case '\\': jb_puts(c, b, "\\\\"); continue;
        case '\n': jb_puts(c, b, "\\n"); continue;
        case '\r': jb_puts(c, b, "\\r"); continue;
        case '\t': jb_puts(c, b, "\\t"); continue;
        case '\b': jb_puts(c, b, "\\b"); continue;
        case '\f': jb_puts(c, b, "\\f"); continue;
        default: break;
        }
        if (cp < 0x20 || (ascii && cp > 0x7e)) {
            if (cp >= 0x10000 && !(cp >= 0xdc80 && cp <= 0xdcff)) {
                uint32_t v = cp - 0x10000;
                jb_printf(c, b, "\\u%04x\\u%04x", (unsigned)(0xd800 | (v >> 10)), (unsigned)(0xdc00 | (v & 0x3ff)));
            } else jb_printf(c, b, "\\u%04x", (unsigned)cp);
        } else jb_put(c, b, s.p + start, i - start);
    }
    jb_putc(c, b, '"');
}

static void json_newline(struct jctx *c, struct jbuf *b, const struct jjson_opts *o, int level) {
    jb_putc(c, b, '\n');
    for (int i = 0; i < level; i++) jb_put(c, b, o->indent.p, o->indent.n);
}

/* A dict key as json.dumps converts it. */
static struct jstr json_key(struct jctx *c, uint32_t pos, struct jv k) {
    struct jbuf kb = { 0 };
    switch ((enum jkind)k.kind) {
    case JK_STR: return k.u.s;
    case JK_BOOL: return jstr_c(k.u.b ? "true" : "false");
    case JK_NONE: return jstr_c("null");
    case JK_INT: jb_printf(c, &kb, "%lld", (long long)k.u.i); return jb_str(&kb);
    case JK_FLOAT:
        if (isnan(k.u.f)) return jstr_c("NaN");
        if (isinf(k.u.f)) return jstr_c(k.u.f < 0 ? "-Infinity" : "Infinity");
        jv_write_float(c, &kb, k.u.f);
        return jb_str(&kb);
    default:
        jfail(c, pos, KVLLM_EINVAL, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

/* Indices of d's items in sort_keys order (a stable insertion sort: dicts
 * in templates are small). */
static size_t *json_key_order(struct jctx *c, uint32_t pos, const struct jdict *d, bool sort) {
    size_t *ord = jalloc_array(c, d->n ? d->n : 1, sizeof *ord);
    for (size_t i = 0; i < d->n; i++) {
        size_t j = i;
        if (sort)
            while (j > 0 && jv_cmp(c, pos, d->k[i], d->k[ord[j - 1]]) < 0) {
                jstep(c, pos, 1);
                ord[j] = ord[j - 1];
                j--;
            }
        ord[j] = i;
    }
    return ord;
}

void jv_write_json(struct jctx *c, uint32_t pos, struct jbuf *b, struct jv v,
                   const struct jjson_opts *o, int level) {
    jdepth_enter(c, pos);
    switch ((enum jkind)v.kind) {
    case JK_NONE: jb_puts(c, b, "null"); break;
    case JK_BOOL: jb_puts(c, b, v.u.b ? "true" : "false"); break;
    case JK_INT: jb_printf(c, b, "%lld", (long long)v.u.i); break;
    case JK_FLOAT:
        if (isnan(v.u.f)) jb_puts(c, b, "NaN");
        else if (isinf(v.u.f)) jb_puts(c, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else jv_write_float(c, b, v.u.f);
        break;
    case JK_STR: write_json_str(c, b, v.u.s, o->ensure_ascii); break;
    case JK_LIST: {
        const struct jlist *l = v.u.l;
        if (l->shape != JL_LIST && l->shape != JL_TUPLE) goto unserializable;
        if (!l->n) { jb_puts(c, b, "[]"); break; }
        jb_putc(c, b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) jb_put(c, b, o->item_sep.p, o->item_sep.n);
            if (o->pretty) json_newline(c, b, o, level + 1);
            jv_write_json(c, pos, b, l->v[i], o, level + 1);
        }
        if (o->pretty) json_newline(c, b, o, level);
        jb_putc(c, b, ']');
        break;
    }
    case JK_DICT: {
        const struct jdict *d = v.u.d;
        if (!d->n) { jb_puts(c, b, "{}"); break; }
        size_t *ord = json_key_order(c, pos, d, o->sort_keys);
        jb_putc(c, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) jb_put(c, b, o->item_sep.p, o->item_sep.n);
            if (o->pretty) json_newline(c, b, o, level + 1);
            write_json_str(c, b, json_key(c, pos, d->k[ord[i]]), o->ensure_ascii);
            jb_put(c, b, o->key_sep.p, o->key_sep.n);
            jv_write_json(c, pos, b, d->v[ord[i]], o, level + 1);
        }
        if (o->pretty) json_newline(c, b, o, level);
        jb_putc(c, b, '}');
        break;
    }
    default:
    unserializable:
        jfail(c, pos, KVLLM_EINVAL, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
    jdepth_leave(c);
}

/* ---- iteration and length ---- */

const struct jv *jv_iterate(struct jctx *c, uint32_t pos, struct jv v, size_t *n) {
    switch ((enum jkind)v.kind) {
    case JK_UNDEF: *n = 0; return NULL;
    case JK_LIST:
        if (v.u.l->shape == JL_GEN) {
            if (v.u.l->consumed) { *n = 0; return NULL; }
            v.u.l->consumed = true;
        }
        *n = v.u.l->n;
        return v.u.l->v;
    case JK_DICT:
        *n = v.u.d->n;
        return v.u.d->k;
    case JK_STR: {
        size_t cnt = utf8_count(v.u.s), k = 0;
        struct jv *items = jalloc_array(c, cnt ? cnt : 1, sizeof *items);
        for (size_t i = 0; i < v.u.s.n; k++) {
            size_t start = i;
            utf8_next(v.u.s.p, v.u.s.n, &i);
            items[k] = jv_str(jstr_sub(c, v.u.s, start, i - start));
            items[k].safe = v.safe;
        }
        *n = cnt;
        return items;
    }
    default:
        jfail(c, pos, KVLLM_EINVAL, "'%s' object is not iterable", jv_type_name(v));
    }
}

size_t jv_len(struct jctx *c, uint32_t pos, struct jv v) {
    switch ((enum jkind)v.kind) {
    case JK_UNDEF: return 0;
    case JK_STR: return utf8_count(v.u.s);
    case JK_LIST:
        if (v.u.l->shape != JL_GEN) return v.u.l->n;
        break;
    case JK_DICT: return v.u.d->n;
    case JK_LOOP: return v.u.loop->n;
    default: break;
    }
    jfail(c, pos, KVLLM_EINVAL, "object of type '%s' has no len()", jv_type_name(v));
}
