/* jinja_filters.c — jinja2's built-in filters and tests (the ones chat
 * templates use), plus Transformers' tojson.  Each reproduces the Python
 * function in jinja2/filters.py or jinja2/tests.py, including its quirks:
 * select/map/items return one-shot generators, |first of an empty list is
 * Undefined, |int falls back to int(float(x)), |round rounds half to even.
 * Built-ins that exist in jinja2 but not here fail as unsupported. */
#include "chat/jinja.h"
#include "kvllm.h"
#include "core/core.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char jmissing[] = "";

/* ---- argument helpers ---- */

void jbind(struct jctx *c, uint32_t pos, const char *fname, const struct jargs *a,
           const char *const *params, struct jv *out) {
    int np = 0;
    while (params[np]) np++;
    if (a->n_pos > np) jfail(c, pos, KVLLM_EINVAL, "%s() takes at most %d argument(s) (%d given)", fname, np, a->n_pos);
    for (int i = 0; i < np; i++) out[i] = i < a->n_pos ? a->pos[i] : jv_undef((struct jstr){ jmissing, 0, NULL });
    for (int k = 0; k < a->n_kw; k++) {
        int i = 0;
        while (i < np && !jstr_eq(a->kw[k], params[i])) i++;
        if (i == np)
            jfail(c, pos, KVLLM_EINVAL, "%s() got an unexpected keyword argument '%.*s'", fname,
                  (int)a->kw[k].n, a->kw[k].p);
        if (i < a->n_pos) jfail(c, pos, KVLLM_EINVAL, "%s() got multiple values for argument '%s'", fname, params[i]);
        out[i] = a->kwv[k];
    }
}

struct jstr jarg_str(struct jctx *c, uint32_t pos, const char *what, struct jv v) {
    if (v.kind != JK_STR) jfail(c, pos, KVLLM_EINVAL, "%s must be a string, not %s", what, jv_type_name(v));
    return v.u.s;
}

int64_t jarg_int(struct jctx *c, uint32_t pos, const char *what, struct jv v) {
    if (v.kind == JK_BOOL) return v.u.b;
    if (v.kind != JK_INT) jfail(c, pos, KVLLM_EINVAL, "%s must be an integer, not %s", what, jv_type_name(v));
    return v.u.i;
}

static bool arg_bool(struct jv v, bool def) { return jgiven(v) ? jv_truthy(v) : def; }

/* ---- sorting (stable merge sort; the comparison may fail the render) ---- */

void jsort(struct jctx *c, uint32_t pos, struct jv *items, const struct jv *keys, size_t n, bool reverse) {
    if (n < 2) return;
    const struct jv *k = keys ? keys : items;
    size_t *idx = jalloc_array(c, n, sizeof *idx), *tmp = jalloc_array(c, n, sizeof *tmp);
    for (size_t i = 0; i < n; i++) idx[i] = i;
    for (size_t w = 1; w < n; w *= 2) {
        jstep(c, pos, n);   /* a merge pass */
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) {
                /* reverse=True keeps equal items in order, as Python does */
                int r = jv_cmp(c, pos, k[idx[j]], k[idx[i]]);
                bool take_right = reverse ? r > 0 : r < 0;
                tmp[o++] = take_right ? idx[j++] : idx[i++];
            }
            while (i < mid) tmp[o++] = idx[i++];
            while (j < hi) tmp[o++] = idx[j++];
        }
        memcpy(idx, tmp, n * sizeof *idx);
    }
    struct jv *sorted = jalloc_array(c, n, sizeof *sorted);
    for (size_t i = 0; i < n; i++) sorted[i] = items[idx[i]];
    memcpy(items, sorted, n * sizeof *items);
}

/* ---- shared pieces ---- */

static struct jv gen_from(struct jctx *c, size_t cap) { return jv_list(c, JL_GEN, cap); }

/* jinja2's make_attrgetter: "a.b.0" looked up with getitem, part by part. */
static struct jv attr_path(struct jctx *c, uint32_t pos, struct jv item, struct jv attribute, struct jv def) {
    if (attribute.kind == JK_INT) return jgetitem(c, pos, item, attribute);
    struct jstr path = jarg_str(c, pos, "attribute", attribute);
    size_t start = 0;
    for (size_t i = 0; i <= path.n; i++) {
        if (i < path.n && path.p[i] != '.') continue;
        struct jstr part = { path.p + start, i - start, NULL };
        struct jv key = jv_str(part);
        bool digits = part.n > 0;
        for (size_t k = 0; k < part.n; k++) digits &= part.p[k] >= '0' && part.p[k] <= '9';
        if (digits) key = jv_int(strtoll(part.p, NULL, 10));
        item = jgetitem(c, pos, item, key);
        if (jgiven(def) && def.kind != JK_NONE && item.kind == JK_UNDEF) item = def;
        start = i + 1;
    }
    return item;
}

static struct jv lower_if_str(struct jctx *c, uint32_t pos, struct jv v) {
    if (v.kind == JK_STR) return jv_str(pystr_case(c, pos, v.u.s, JCASE_LOWER));
    return v;
}

static struct jv str_of(struct jctx *c, uint32_t pos, struct jv v) {
    struct jv r = jv_str(jv_to_str(c, pos, v));
    r.safe = v.kind == JK_STR && v.safe;
    return r;
}

/* ---- filters ---- */

#define FILTER_FN(name) static struct jv name(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a)

static struct jv f_abs(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "abs", a, (const char *const[]){ NULL }, NULL);
    if (v.kind == JK_FLOAT) return jv_float(fabs(v.u.f));
    if (v.kind == JK_INT || v.kind == JK_BOOL) {
        int64_t i = v.kind == JK_INT ? v.u.i : v.u.b;
        if (i == INT64_MIN) jfail(c, pos, KVLLM_EUNSUPPORTED, "integer overflow");
        return jv_int(i < 0 ? -i : i);
    }
    jfail(c, pos, KVLLM_EINVAL, "bad operand type for abs(): '%s'", jv_type_name(v));
}

static struct jv f_capitalize(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "capitalize", a, (const char *const[]){ NULL }, NULL);
    struct jv r = jv_str(pystr_case(c, pos, jv_to_str(c, pos, v), JCASE_CAPITALIZE));
    r.safe = v.kind == JK_STR && v.safe;
    return r;
}

static struct jv f_length(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "length", a, (const char *const[]){ NULL }, NULL);
    return jv_int((int64_t)jv_len(c, pos, v));
}

static struct jv f_default(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    struct jv p[2];
    jbind(c, pos, "default", a, (const char *const[]){ "default_value", "boolean", NULL }, p);
    if (v.kind == JK_UNDEF || (arg_bool(p[1], false) && !jv_truthy(v)))
        return jgiven(p[0]) ? p[0] : jv_str(jstr_c(""));
    return v;
}

static struct jv f_dictsort(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    struct jv p[3];
    jbind(c, pos, "dictsort", a, (const char *const[]){ "case_sensitive", "by", "reverse", NULL }, p);
    if (v.kind != JK_DICT) jfail(c, pos, KVLLM_EINVAL, "dictsort needs a dict, not %s", jv_type_name(v));
    int by = 0;
    if (jgiven(p[1])) {
        struct jstr s = jarg_str(c, pos, "by", p[1]);
        if (jstr_eq(s, "value")) by = 1;
        else if (!jstr_eq(s, "key")) jfail(c, pos, KVLLM_EINVAL, "You can only sort by either \"key\" or \"value\"");
    }
    size_t n = v.u.d->n;
    struct jv r = jv_list(c, JL_LIST, n);
    struct jv *keys = jalloc_array(c, n ? n : 1, sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        struct jv pair = jv_list(c, JL_TUPLE, 2);
        jlist_push(c, pair.u.l, v.u.d->k[i]);
        jlist_push(c, pair.u.l, v.u.d->v[i]);
        jlist_push(c, r.u.l, pair);
        keys[i] = by ? v.u.d->v[i] : v.u.d->k[i];
        if (!arg_bool(p[0], false)) keys[i] = lower_if_str(c, pos, keys[i]);
    }
    jsort(c, pos, r.u.l->v, keys, n, arg_bool(p[2], false));
    return r;
}

static struct jv f_escape(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "escape", a, (const char *const[]){ NULL }, NULL);
    return jv_escape(c, pos, v);
}

static struct jv f_forceescape(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "forceescape", a, (const char *const[]){ NULL }, NULL);
    return jv_escape(c, pos, jv_str(jv_to_str(c, pos, v)));
}

static struct jv f_first(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "first", a, (const char *const[]){ NULL }, NULL);
    size_t n;
    const struct jv *items = jv_iterate(c, pos, v, &n);
    return n ? items[0] : jv_undef(jstr_c("No first item, sequence was empty."));
}

static struct jv f_last(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "last", a, (const char *const[]){ NULL }, NULL);
    if (v.kind == JK_LIST && v.u.l->shape == JL_GEN)
        jfail(c, pos, KVLLM_EINVAL, "'generator' object is not reversible");
    size_t n;
    const struct jv *items = jv_iterate(c, pos, v, &n);
    return n ? items[n - 1] : jv_undef(jstr_c("No last item, sequence was empty."));
}

/* Python float(str): strict syntax, surrounding whitespace allowed. */
static bool parse_float(struct jstr s, double *out) {
    s = pystr_strip(s, NULL, true, true);
    char buf[128];
    size_t k = 0;
    for (size_t i = 0; i < s.n; i++) {
        char ch = s.p[i];
        if (ch == '_') {   /* only between digits */
            bool digit_before = i > 0 && s.p[i - 1] >= '0' && s.p[i - 1] <= '9';
            bool digit_after = i + 1 < s.n && s.p[i + 1] >= '0' && s.p[i + 1] <= '9';
            if (!digit_before || !digit_after) return false;
            continue;
        }
        if (!strchr("0123456789+-.eEinfatyINFATY", ch) || !ch || k + 1 >= sizeof buf) return false;
        buf[k++] = ch;
    }
    if (!k) return false;
    buf[k] = 0;
    const char *word = buf + (buf[0] == '+' || buf[0] == '-');
    if (strchr("iInN", word[0])) {
        if (strcasecmp(word, "inf") && strcasecmp(word, "infinity") && strcasecmp(word, "nan")) return false;
    } else if (!strchr("0123456789.", word[0])) {
        return false;
    }
    char *end;
    errno = 0;
    *out = strtod(buf, &end);
    return *end == 0;
}

static struct jv f_float(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    struct jv p[1];
    jbind(c, pos, "float", a, (const char *const[]){ "default", NULL }, p);
    double f;
    if (v.kind == JK_FLOAT) return v;
    if (v.kind == JK_INT || v.kind == JK_BOOL) return jv_float(jv_num(v));
    if (v.kind == JK_STR && parse_float(v.u.s, &f)) return jv_float(f);
    if (v.kind == JK_UNDEF) jfail(c, pos, KVLLM_EINVAL, "float() of an undefined value");
    return jgiven(p[0]) ? p[0] : jv_float(0.0);
}

/* Python int(str, base) */
static bool parse_int(struct jstr s, int base, int64_t *out) {
    s = pystr_strip(s, NULL, true, true);
    size_t i = 0;
    bool neg = false;
    if (i < s.n && (s.p[i] == '+' || s.p[i] == '-')) neg = s.p[i++] == '-';
    if (i + 1 < s.n && s.p[i] == '0') {
        char p = s.p[i + 1] | 0x20;
        int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
        if (pb && (base == pb || base == 0)) { base = pb; i += 2; if (i < s.n && s.p[i] == '_') i++; }
    }
    if (base == 0) base = 10;
    if (base < 2 || base > 36 || i >= s.n) return false;
    uint64_t v = 0;
    bool prev_digit = false;
    for (; i < s.n; i++) {
        char ch = s.p[i];
        if (ch == '_') {
            if (!prev_digit || i + 1 >= s.n) return false;
            prev_digit = false;
            continue;
        }
        char low = (char)(ch | 0x20);
        int d = ch >= '0' && ch <= '9' ? ch - '0' : low >= 'a' && low <= 'z' ? low - 'a' + 10 : 99;
        if (d >= base) return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
        prev_digit = true;
    }
    if (!prev_digit || v > (uint64_t)INT64_MAX + neg) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static bool float_to_int(double f, int64_t *out) {
    if (isnan(f) || f >= 9223372036854775808.0 || f < -9223372036854775808.0) return false;
    *out = (int64_t)f;
    return true;
}

static struct jv f_int(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    struct jv p[2];
    jbind(c, pos, "int", a, (const char *const[]){ "default", "base", NULL }, p);
    int base = jgiven(p[1]) ? (int)jarg_int(c, pos, "base", p[1]) : 10;
    struct jv def = jgiven(p[0]) ? p[0] : jv_int(0);
    int64_t i;
    double f;
    switch ((enum jkind)v.kind) {
    case JK_INT: return v;
    case JK_BOOL: return jv_int(v.u.b);
    case JK_FLOAT:
        if (isinf(v.u.f)) jfail(c, pos, KVLLM_EINVAL, "cannot convert float infinity to integer");
        if (!float_to_int(v.u.f, &i)) {
            if (isnan(v.u.f)) return def;
            jfail(c, pos, KVLLM_EUNSUPPORTED, "integer overflow");
        }
        return jv_int(i);
    case JK_STR:
        if (parse_int(v.u.s, base, &i)) return jv_int(i);
        if (parse_float(v.u.s, &f) && float_to_int(f, &i)) return jv_int(i);
        if (parse_float(v.u.s, &f) && !isnan(f) && !isinf(f)) jfail(c, pos, KVLLM_EUNSUPPORTED, "integer overflow");
        return def;
    case JK_UNDEF: jfail(c, pos, KVLLM_EINVAL, "int() of an undefined value");
    default: return def;
    }
}

static struct jv f_indent(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    struct jv p[3];
    jbind(c, pos, "indent", a, (const char *const[]){ "width", "first", "blank", NULL }, p);
    struct jbuf ind = { 0 };
    if (jgiven(p[0]) && p[0].kind == JK_STR) jb_put(c, &ind, p[0].u.s.p, p[0].u.s.n);
    else {
        int64_t w = jgiven(p[0]) ? jarg_int(c, pos, "width", p[0]) : 4;
        for (int64_t k = 0; k < w; k++) jb_putc(c, &ind, ' ');
    }
    /* jinja2 appends "\n" to its argument with += before anything else, so a number, None or a
     * list fails there (the differential fuzzer, docs/RELIABILITY.md) */
    if (v.kind != JK_STR)
        jfail(c, pos, KVLLM_EINVAL, "unsupported operand type(s) for +=: '%s' and 'str'", jv_type_name(v));
    struct jbuf s = { 0 };
    jb_put(c, &s, v.u.s.p, v.u.s.n);
    jb_putc(c, &s, '\n');   /* jinja2's quirk for splitlines */
    struct jv lines = pystr_splitlines(c, jb_str(&s), false);
    struct jbuf out = { 0 };
    if (arg_bool(p[1], false)) jb_put(c, &out, ind.p, ind.n);
    for (size_t i = 0; i < lines.u.l->n; i++) {
        struct jstr ln = lines.u.l->v[i].u.s;
        if (i) {
            jb_putc(c, &out, '\n');
            if (arg_bool(p[2], false) || ln.n) jb_put(c, &out, ind.p, ind.n);
        }
        jb_put(c, &out, ln.p, ln.n);
    }
    return jv_str(jb_str(&out));
}

static struct jv f_items(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "items", a, (const char *const[]){ NULL }, NULL);
    if (v.kind == JK_UNDEF) return gen_from(c, 0);
    if (v.kind != JK_DICT) jfail(c, pos, KVLLM_EINVAL, "Can only get item pairs from a mapping.");
    struct jv r = gen_from(c, v.u.d->n);
    for (size_t i = 0; i < v.u.d->n; i++) {
        struct jv pair = jv_list(c, JL_TUPLE, 2);
        jlist_push(c, pair.u.l, v.u.d->k[i]);
        jlist_push(c, pair.u.l, v.u.d->v[i]);
        jlist_push(c, r.u.l, pair);
    }
    return r;
}

static struct jv f_join(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    struct jv p[2];
    jbind(c, pos, "join", a, (const char *const[]){ "d", "attribute", NULL }, p);
    struct jstr sep = jgiven(p[0]) ? jv_to_str(c, pos, p[0]) : jstr_c("");
    size_t n;
    const struct jv *items = jv_iterate(c, pos, v, &n);
    struct jbuf b = { 0 };
    for (size_t i = 0; i < n; i++) {
        if (i) jb_put_str(c, &b, sep);
        struct jv item = jgiven(p[1]) && p[1].kind != JK_NONE ? attr_path(c, pos, items[i], p[1], jv_none()) : items[i];
        jv_write_str(c, pos, &b, item);
    }
    return jv_str(jb_str(&b));
}

static struct jv f_list(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "list", a, (const char *const[]){ NULL }, NULL);
    size_t n;
    const struct jv *items = jv_iterate(c, pos, v, &n);
    struct jv r = jv_list(c, JL_LIST, n);
    for (size_t i = 0; i < n; i++) jlist_push(c, r.u.l, items[i]);
    return r;
}

static struct jv f_lower(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "lower", a, (const char *const[]){ NULL }, NULL);
    struct jv r = jv_str(pystr_case(c, pos, jv_to_str(c, pos, v), JCASE_LOWER));
    r.safe = v.kind == JK_STR && v.safe;
    return r;
}

static struct jv f_upper(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "upper", a, (const char *const[]){ NULL }, NULL);
    struct jv r = jv_str(pystr_case(c, pos, jv_to_str(c, pos, v), JCASE_UPPER));
    r.safe = v.kind == JK_STR && v.safe;
    return r;
}

static struct jv f_title(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "title", a, (const char *const[]){ NULL }, NULL);
    return jv_str(pystr_case(c, pos, jv_to_str(c, pos, v), JCASE_JTITLE));
}

/* Keyword argument `name` of a map/select-style call, removed from the
 * rest; false when absent. */
static bool take_kw(const struct jargs *a, const char *name, struct jv *out, struct jargs *rest) {
    bool found = false;
    struct jstr *kw = (struct jstr *)rest->kw;
    struct jv *kwv = (struct jv *)rest->kwv;
    rest->n_kw = 0;
    for (int k = 0; k < a->n_kw; k++) {
        if (jstr_eq(a->kw[k], name)) { *out = a->kwv[k]; found = true; continue; }
        kw[rest->n_kw] = a->kw[k];
        kwv[rest->n_kw++] = a->kwv[k];
    }
    return found;
}

static struct jargs args_copy(struct jctx *c, const struct jargs *a, int skip_pos) {
    struct jargs r = *a;
    r.pos = a->pos + (skip_pos < a->n_pos ? skip_pos : a->n_pos);
    r.n_pos = a->n_pos > skip_pos ? a->n_pos - skip_pos : 0;
    r.kw = jalloc_array(c, (size_t)a->n_kw + 1, sizeof *r.kw);
    r.kwv = jalloc_array(c, (size_t)a->n_kw + 1, sizeof *r.kwv);
    memcpy((void *)r.kw, a->kw, (size_t)a->n_kw * sizeof *r.kw);
    memcpy((void *)r.kwv, a->kwv, (size_t)a->n_kw * sizeof *r.kwv);
    return r;
}

static struct jv f_map(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    if (!jv_truthy(v)) return gen_from(c, 0);   /* jinja2 checks `if value:` first */
    struct jv attribute, def = jv_none();
    struct jargs rest = args_copy(c, a, 0);
    bool by_attr = !a->n_pos && take_kw(a, "attribute", &attribute, &rest);
    if (by_attr) {
        struct jargs rest2 = args_copy(c, &rest, 0);
        take_kw(&rest, "default", &def, &rest2);
        if (rest2.n_kw)
            jfail(c, pos, KVLLM_EINVAL, "Unexpected keyword argument '%.*s'", (int)rest2.kw[0].n, rest2.kw[0].p);
    } else if (!a->n_pos) {
        jfail(c, pos, KVLLM_EINVAL, "map requires a filter argument");
    }
    struct jstr fname = by_attr ? jstr_c("") : jarg_str(c, pos, "filter name", a->pos[0]);
    struct jargs fargs = args_copy(c, a, 1);
    size_t n;
    const struct jv *items = jv_iterate(c, pos, v, &n);
    struct jv r = gen_from(c, n);
    for (size_t i = 0; i < n; i++)
        jlist_push(c, r.u.l, by_attr ? attr_path(c, pos, items[i], attribute, def)
                                     : jcall_filter(c, pos, fname, items[i], &fargs));
    return r;
}

/* select / reject / selectattr / rejectattr */
static struct jv select_impl(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a,
                             bool keep, bool by_attr) {
    if (!jv_truthy(v)) return gen_from(c, 0);   /* jinja2 checks `if value:` first */
    int off = by_attr ? 1 : 0;
    if (by_attr && a->n_pos < 1) jfail(c, pos, KVLLM_EINVAL, "Missing parameter for attribute name");
    bool has_test = a->n_pos > off;
    struct jstr test = has_test ? jarg_str(c, pos, "test name", a->pos[off]) : jstr_c("");
    struct jargs targs = args_copy(c, a, off + 1);
    size_t n;
    const struct jv *items = jv_iterate(c, pos, v, &n);
    struct jv r = gen_from(c, n);
    for (size_t i = 0; i < n; i++) {
        struct jv x = by_attr ? attr_path(c, pos, items[i], a->pos[0], jv_none()) : items[i];
        bool ok = has_test ? jcall_test(c, pos, test, x, &targs) : jv_truthy(x);
        if (ok == keep) jlist_push(c, r.u.l, items[i]);
    }
    return r;
}

FILTER_FN(f_select) { return select_impl(c, pos, v, a, true, false); }
FILTER_FN(f_reject) { return select_impl(c, pos, v, a, false, false); }
FILTER_FN(f_selectattr) { return select_impl(c, pos, v, a, true, true); }
FILTER_FN(f_rejectattr) { return select_impl(c, pos, v, a, false, true); }

static struct jv min_max(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a, bool want_max) {
    struct jv p[2];
    jbind(c, pos, want_max ? "max" : "min", a, (const char *const[]){ "case_sensitive", "attribute", NULL }, p);
    size_t n;
    const struct jv *items = jv_iterate(c, pos, v, &n);
    if (!n) return jv_undef(jstr_c("No aggregated item, sequence was empty."));
    size_t best = 0;
    struct jv best_key = { 0 };
    for (size_t i = 0; i < n; i++) {
        struct jv k = jgiven(p[1]) && p[1].kind != JK_NONE ? attr_path(c, pos, items[i], p[1], jv_none()) : items[i];
        if (!arg_bool(p[0], false)) k = lower_if_str(c, pos, k);
        if (i == 0 || (want_max ? jv_cmp(c, pos, best_key, k) < 0 : jv_cmp(c, pos, k, best_key) < 0)) {
            best = i;
            best_key = k;
        }
    }
    return items[best];
}

FILTER_FN(f_max) { return min_max(c, pos, v, a, true); }
FILTER_FN(f_min) { return min_max(c, pos, v, a, false); }

static struct jv f_replace(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    struct jv p[3];
    jbind(c, pos, "replace", a, (const char *const[]){ "old", "new", "count", NULL }, p);
    if (!jgiven(p[0]) || !jgiven(p[1])) jfail(c, pos, KVLLM_EINVAL, "replace() needs old and new");
    int64_t count = jgiven(p[2]) && p[2].kind != JK_NONE ? jarg_int(c, pos, "count", p[2]) : -1;
    return jv_str(pystr_replace(c, jv_to_str(c, pos, v), jv_to_str(c, pos, p[0]), jv_to_str(c, pos, p[1]), count));
}

static struct jv f_reverse(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "reverse", a, (const char *const[]){ NULL }, NULL);
    size_t n;
    if (v.kind == JK_STR) {
        const struct jv *chars = jv_iterate(c, pos, v, &n);
        struct jbuf b = { 0 };
        for (size_t i = n; i-- > 0;) jb_put(c, &b, chars[i].u.s.p, chars[i].u.s.n);
        return jv_str(jb_str(&b));
    }
    bool gen = v.kind == JK_LIST && v.u.l->shape == JL_GEN;   /* not reversible: list(value) reversed */
    const struct jv *items = jv_iterate(c, pos, v, &n);
    struct jv r = jv_list(c, gen ? JL_LIST : JL_GEN, n);
    for (size_t i = n; i-- > 0;) jlist_push(c, r.u.l, items[i]);
    jprecise(c);   /* the items, unchanged */
    return r;
}

static struct jv f_round(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    struct jv p[2];
    jbind(c, pos, "round", a, (const char *const[]){ "precision", "method", NULL }, p);
    int64_t prec = jgiven(p[0]) ? jarg_int(c, pos, "precision", p[0]) : 0;
    struct jstr method = jgiven(p[1]) ? jarg_str(c, pos, "method", p[1]) : jstr_c("common");
    if (!jstr_eq(method, "common") && !jstr_eq(method, "ceil") && !jstr_eq(method, "floor"))
        jfail(c, pos, KVLLM_EINVAL, "method must be common, ceil or floor");
    if (!jv_is_num(v)) jfail(c, pos, KVLLM_EINVAL, "round() needs a number, not %s", jv_type_name(v));
    if (prec < 0 || prec > 300)
        jfail(c, pos, KVLLM_EUNSUPPORTED, "round() precision %lld is not supported", (long long)prec);
    if (jstr_eq(method, "common")) {
        if (v.kind != JK_FLOAT) return jv_int(v.kind == JK_INT ? v.u.i : v.u.b);   /* round(int, n) is the int */
        if (!isfinite(v.u.f)) return v;
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)prec, v.u.f);   /* correctly rounded, ties to even */
        return jv_float(strtod(buf, NULL));
    }
    double scale = pow(10.0, (double)prec), x = jv_num(v) * scale;
    return jv_float((jstr_eq(method, "ceil") ? ceil(x) : floor(x)) / scale);
}

static struct jv f_safe(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "safe", a, (const char *const[]){ NULL }, NULL);
    struct jv r = jv_str(jv_to_str(c, pos, v));
    r.safe = true;
    return r;
}

static struct jv f_sort(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    struct jv p[3];
    jbind(c, pos, "sort", a, (const char *const[]){ "reverse", "case_sensitive", "attribute", NULL }, p);
    struct jv r = f_list(c, pos, v, &(struct jargs){ 0 });
    size_t n = r.u.l->n;
    struct jv *keys = jalloc_array(c, n ? n : 1, sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        keys[i] = r.u.l->v[i];
        if (jgiven(p[2]) && p[2].kind != JK_NONE) {
            if (p[2].kind == JK_STR && memchr(p[2].u.s.p, ',', p[2].u.s.n))
                jfail(c, pos, KVLLM_EUNSUPPORTED, "sorting by several attributes is not supported");
            keys[i] = attr_path(c, pos, keys[i], p[2], jv_none());
        }
        if (!arg_bool(p[1], false)) keys[i] = lower_if_str(c, pos, keys[i]);
    }
    jsort(c, pos, r.u.l->v, keys, n, arg_bool(p[0], false));
    return r;
}

static struct jv f_string(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    jbind(c, pos, "string", a, (const char *const[]){ NULL }, NULL);
    return str_of(c, pos, v);
}

static struct jv f_sum(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    struct jv p[2];
    jbind(c, pos, "sum", a, (const char *const[]){ "attribute", "start", NULL }, p);
    struct jv total = jgiven(p[1]) ? p[1] : jv_int(0);
    size_t n;
    const struct jv *items = jv_iterate(c, pos, v, &n);
    for (size_t i = 0; i < n; i++) {
        struct jv x = jgiven(p[0]) && p[0].kind != JK_NONE ? attr_path(c, pos, items[i], p[0], jv_none()) : items[i];
        if (!jv_is_num(x) || !jv_is_num(total))
            jfail(c, pos, KVLLM_EUNSUPPORTED, "sum() of non-numbers is not supported");
        if (x.kind == JK_FLOAT || total.kind == JK_FLOAT) total = jv_float(jv_num(total) + jv_num(x));
        else {
            int64_t r, t = total.kind == JK_INT ? total.u.i : total.u.b, y = x.kind == JK_INT ? x.u.i : x.u.b;
            if (__builtin_add_overflow(t, y, &r)) jfail(c, pos, KVLLM_EUNSUPPORTED, "integer overflow");
            total = jv_int(r);
        }
    }
    return total;
}

/* Transformers: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
static struct jv f_tojson(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    struct jv p[4];
    jbind(c, pos, "tojson", a, (const char *const[]){ "ensure_ascii", "indent", "separators", "sort_keys", NULL }, p);
    struct jjson_opts o = { .ensure_ascii = arg_bool(p[0], false), .sort_keys = arg_bool(p[3], false) };
    if (jgiven(p[1]) && p[1].kind != JK_NONE) {
        o.pretty = true;
        if (p[1].kind == JK_STR) o.indent = p[1].u.s;
        else {
            int64_t w = jarg_int(c, pos, "indent", p[1]);
            struct jbuf b = { 0 };
            for (int64_t k = 0; k < w && k < 1024; k++) jb_putc(c, &b, ' ');
            o.indent = jb_str(&b);
        }
    }
    o.item_sep = jstr_c(o.pretty ? "," : ", ");
    o.key_sep = jstr_c(": ");
    if (jgiven(p[2]) && p[2].kind != JK_NONE) {
        size_t n;
        const struct jv *sep = jv_iterate(c, pos, p[2], &n);
        if (n != 2) jfail(c, pos, KVLLM_EINVAL, "separators must be an (item_separator, key_separator) pair");
        o.item_sep = jarg_str(c, pos, "item separator", sep[0]);
        o.key_sep = jarg_str(c, pos, "key separator", sep[1]);
    }
    struct jbuf b = { 0 };
    jv_write_json(c, pos, &b, v, &o, 0);
    return jv_str(jb_str(&b));
}

static struct jv f_trim(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    struct jv p[1];
    jbind(c, pos, "trim", a, (const char *const[]){ "chars", NULL }, p);
    struct jstr chars = { 0 };
    bool have = jgiven(p[0]) && p[0].kind != JK_NONE;
    if (have) chars = jarg_str(c, pos, "chars", p[0]);
    struct jstr s = jv_to_str(c, pos, v), t = pystr_strip(s, have ? &chars : NULL, true, true);
    struct jv r = jv_str(jstr_sub(c, s, (size_t)(t.p - s.p), t.n));   /* a substring keeps its spans */
    r.safe = v.kind == JK_STR && v.safe;
    return r;
}

/* A hash consistent with jv_eq (Python ==): equal values hash alike, so
 * 1, 1.0 and True share a hash, as do equal strings, tuples and dicts. */
static uint64_t hash_mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

static uint64_t jv_hash(struct jv v, int depth) {
    if (depth > JINJA_MAX_DEPTH) return 0;   /* jv_eq calls these unequal anyway */
    switch ((enum jkind)v.kind) {
    case JK_BOOL: return (uint64_t)v.u.b;
    case JK_INT: return (uint64_t)v.u.i;
    case JK_FLOAT:
        /* an integral float equals the int of the same value */
        if (v.u.f == floor(v.u.f) && v.u.f >= -9223372036854775808.0 && v.u.f < 9223372036854775808.0)
            return (uint64_t)(int64_t)v.u.f;
        if (isnan(v.u.f)) return 0x7ff8;
        { uint64_t bits; memcpy(&bits, &v.u.f, sizeof bits); return bits; }
    case JK_STR: return hash_bytes(v.u.s.p, v.u.s.n) ^ ((uint64_t)v.u.s.n << 32);
    case JK_LIST: {
        uint64_t h = 0x11ull + v.u.l->n;
        for (size_t i = 0; i < v.u.l->n; i++) h = hash_mix(h, jv_hash(v.u.l->v[i], depth + 1));
        return h;
    }
    case JK_DICT: {   /* key order does not matter to == */
        uint64_t h = 0x22ull + v.u.d->n;
        for (size_t i = 0; i < v.u.d->n; i++)
            h += hash_mix(jv_hash(v.u.d->k[i], depth + 1), jv_hash(v.u.d->v[i], depth + 1));
        return h;
    }
    case JK_NS: return (uint64_t)(uintptr_t)v.u.d;
    case JK_MACRO: return (uint64_t)(uintptr_t)v.u.m;
    case JK_FUNC: return (uint64_t)(uintptr_t)v.u.fn;
    case JK_LOOP: return (uint64_t)(uintptr_t)v.u.loop;
    default: return (uint64_t)v.kind;   /* None, Undefined */
    }
}

/* Linear in the items: a hash set of the keys seen (open addressing over
 * indices into keys[]). */
static struct jv f_unique(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a) {
    struct jv p[2];
    jbind(c, pos, "unique", a, (const char *const[]){ "case_sensitive", "attribute", NULL }, p);
    size_t n;
    const struct jv *items = jv_iterate(c, pos, v, &n);
    struct jv r = gen_from(c, n);
    size_t n_slots = 16;
    while (n_slots < 2 * n) n_slots *= 2;
    struct jv *keys = jalloc_array(c, n ? n : 1, sizeof *keys);      /* (n_keys) distinct keys so far */
    size_t *slots = jalloc_array(c, n_slots, sizeof *slots);         /* (n_slots) 1 + index in keys, 0 empty */
    size_t n_keys = 0;
    for (size_t i = 0; i < n; i++) {
        struct jv k = jgiven(p[1]) && p[1].kind != JK_NONE ? attr_path(c, pos, items[i], p[1], jv_none()) : items[i];
        if (!arg_bool(p[0], false)) k = lower_if_str(c, pos, k);
        if (!jv_hashable(k)) jfail(c, pos, KVLLM_EINVAL, "unhashable type: '%s'", jv_type_name(k));   /* a set */
        jstep(c, pos, 1);
        uint64_t h = jv_hash(k, 0);
        h = (h ^ (h >> 31)) * 0xbf58476d1ce4e5b9ull;   /* spread the bits the mask keeps */
        size_t at = (size_t)(h ^ (h >> 29)) & (n_slots - 1);
        bool dup = false;
        for (; slots[at] && !dup; at = (at + 1) & (n_slots - 1)) {
            jstep(c, pos, 1);   /* colliding keys cost steps, never an unbounded hang */
            dup = jv_eq(keys[slots[at] - 1], k);
        }
        if (dup) continue;
        keys[n_keys++] = k;
        slots[at] = n_keys;
        jlist_push(c, r.u.l, items[i]);
    }
    return r;
}

/* precise: the filter returns the values it was given unchanged (or
 * computes its result's message-text spans exactly); any other filter's
 * result is all message text when its input holds any (jtaint_result). */
static const struct { const char *name; jbuiltin fn; bool precise; } k_filters[] = {
    { "abs", f_abs, false }, { "capitalize", f_capitalize, false }, { "count", f_length, true },
    { "d", f_default, true }, { "default", f_default, true }, { "dictsort", f_dictsort, true },
    { "e", f_escape, true }, { "escape", f_escape, true }, { "first", f_first, true }, { "float", f_float, false },
    { "forceescape", f_forceescape, true }, { "indent", f_indent, false }, { "int", f_int, false },
    { "items", f_items, true }, { "join", f_join, true }, { "last", f_last, true }, { "length", f_length, true },
    { "list", f_list, true }, { "lower", f_lower, false }, { "map", f_map, true }, { "max", f_max, true },
    { "min", f_min, true }, { "reject", f_reject, true }, { "rejectattr", f_rejectattr, true },
    { "replace", f_replace, false }, { "reverse", f_reverse, false }, { "round", f_round, false },
    { "safe", f_safe, true }, { "select", f_select, true }, { "selectattr", f_selectattr, true },
    { "sort", f_sort, true }, { "string", f_string, true }, { "sum", f_sum, false }, { "title", f_title, false },
    { "tojson", f_tojson, false }, { "trim", f_trim, true }, { "unique", f_unique, true },
    { "upper", f_upper, false },
};

/* jinja2 built-ins this interpreter does not implement */
static const char *const k_filters_missing[] = {
    "attr", "batch", "center", "filesizeformat", "format", "groupby", "pprint", "random", "slice",
    "striptags", "truncate", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr", NULL,
};

/* ---- tests ---- */

#define TEST_FN(name) static struct jv name(struct jctx *c, uint32_t pos, struct jv v, const struct jargs *a)

static struct jv test_arg(struct jctx *c, uint32_t pos, const char *name, const struct jargs *a) {
    struct jv p[1];
    jbind(c, pos, name, a, (const char *const[]){ "other", NULL }, p);
    if (!jgiven(p[0])) jfail(c, pos, KVLLM_EINVAL, "test '%s' needs an argument", name);
    return p[0];
}

static void no_args(struct jctx *c, uint32_t pos, const char *name, const struct jargs *a) {
    jbind(c, pos, name, a, (const char *const[]){ NULL }, NULL);
}

TEST_FN(t_boolean) { no_args(c, pos, "boolean", a); return jv_bool(v.kind == JK_BOOL); }
TEST_FN(t_callable) { no_args(c, pos, "callable", a); return jv_bool(v.kind == JK_FUNC || v.kind == JK_MACRO); }
TEST_FN(t_defined) { no_args(c, pos, "defined", a); return jv_bool(v.kind != JK_UNDEF); }
TEST_FN(t_undefined) { no_args(c, pos, "undefined", a); return jv_bool(v.kind == JK_UNDEF); }
TEST_FN(t_none) { no_args(c, pos, "none", a); return jv_bool(v.kind == JK_NONE); }
TEST_FN(t_true) { no_args(c, pos, "true", a); return jv_bool(v.kind == JK_BOOL && v.u.b); }
TEST_FN(t_false) { no_args(c, pos, "false", a); return jv_bool(v.kind == JK_BOOL && !v.u.b); }
TEST_FN(t_string) { no_args(c, pos, "string", a); return jv_bool(v.kind == JK_STR); }
TEST_FN(t_number) { no_args(c, pos, "number", a); return jv_bool(jv_is_num(v)); }
TEST_FN(t_integer) { no_args(c, pos, "integer", a); return jv_bool(v.kind == JK_INT); }
TEST_FN(t_float) { no_args(c, pos, "float", a); return jv_bool(v.kind == JK_FLOAT); }
TEST_FN(t_mapping) { no_args(c, pos, "mapping", a); return jv_bool(v.kind == JK_DICT); }
TEST_FN(t_escaped) { no_args(c, pos, "escaped", a); return jv_bool(v.kind == JK_STR && v.safe); }
TEST_FN(t_iterable) {
    no_args(c, pos, "iterable", a);
    return jv_bool(v.kind == JK_UNDEF || v.kind == JK_STR || v.kind == JK_LIST || v.kind == JK_DICT ||
                   v.kind == JK_LOOP);
}
TEST_FN(t_sequence) {
    no_args(c, pos, "sequence", a);
    bool seq = v.kind == JK_UNDEF || v.kind == JK_STR || v.kind == JK_DICT ||
               (v.kind == JK_LIST && (v.u.l->shape == JL_LIST || v.u.l->shape == JL_TUPLE || v.u.l->shape == JL_RANGE));
    return jv_bool(seq);
}
TEST_FN(t_lower) { no_args(c, pos, "lower", a); return jv_bool(pystr_is_case(c, pos, jv_to_str(c, pos, v), false)); }
TEST_FN(t_upper) { no_args(c, pos, "upper", a); return jv_bool(pystr_is_case(c, pos, jv_to_str(c, pos, v), true)); }

static int64_t int_or_fail(struct jctx *c, uint32_t pos, struct jv v) {
    if (v.kind == JK_UNDEF) jfail(c, pos, KVLLM_EINVAL, "an undefined value was used");
    if (v.kind == JK_FLOAT) jfail(c, pos, KVLLM_EUNSUPPORTED, "odd/even/divisibleby on floats is not supported");
    return jarg_int(c, pos, "value", v);
}

TEST_FN(t_odd) { no_args(c, pos, "odd", a); int64_t i = int_or_fail(c, pos, v); return jv_bool(i % 2 != 0); }
TEST_FN(t_even) { no_args(c, pos, "even", a); int64_t i = int_or_fail(c, pos, v); return jv_bool(i % 2 == 0); }
TEST_FN(t_divisibleby) {
    int64_t d = int_or_fail(c, pos, test_arg(c, pos, "divisibleby", a)), i = int_or_fail(c, pos, v);
    if (!d) jfail(c, pos, KVLLM_EINVAL, "integer division or modulo by zero");
    return jv_bool(d == -1 || i % d == 0);
}
TEST_FN(t_eq) { return jv_bool(jv_eq(v, test_arg(c, pos, "eq", a))); }
TEST_FN(t_ne) { return jv_bool(!jv_eq(v, test_arg(c, pos, "ne", a))); }

static bool num_less(struct jctx *c, uint32_t pos, struct jv x, struct jv y) {
    if (jv_is_num(x) && jv_is_num(y) && (x.kind == JK_FLOAT || y.kind == JK_FLOAT)) return jv_num(x) < jv_num(y);
    return jv_cmp(c, pos, x, y) < 0;
}
TEST_FN(t_lt) { return jv_bool(num_less(c, pos, v, test_arg(c, pos, "lt", a))); }
TEST_FN(t_gt) { struct jv o = test_arg(c, pos, "gt", a); return jv_bool(num_less(c, pos, o, v)); }
TEST_FN(t_le) { struct jv o = test_arg(c, pos, "le", a); return jv_bool(num_less(c, pos, v, o) || jv_eq(v, o)); }
TEST_FN(t_ge) { struct jv o = test_arg(c, pos, "ge", a); return jv_bool(num_less(c, pos, o, v) || jv_eq(v, o)); }
TEST_FN(t_in) {
    struct jv seq = test_arg(c, pos, "in", a);
    if (seq.kind == JK_STR) {
        if (v.kind != JK_STR) jfail(c, pos, KVLLM_EINVAL, "'in <string>' requires string as left operand");
        return jv_bool(!v.u.s.n || memmem(seq.u.s.p, seq.u.s.n, v.u.s.p, v.u.s.n) != NULL);
    }
    if (seq.kind == JK_DICT) {
        struct jv unused;
        jstep(c, pos, seq.u.d->n);   /* a linear scan */
        return jv_bool(jdict_get(seq.u.d, v, &unused));
    }
    size_t n;
    const struct jv *items = jv_iterate(c, pos, seq, &n);
    jstep(c, pos, n);
    for (size_t i = 0; i < n; i++)
        if (jv_eq(items[i], v)) return jv_bool(true);
    return jv_bool(false);
}
TEST_FN(t_sameas) {
    struct jv o = test_arg(c, pos, "sameas", a);
    if (v.kind == JK_NONE || o.kind == JK_NONE) return jv_bool(v.kind == o.kind);
    if (v.kind == JK_BOOL || o.kind == JK_BOOL) return jv_bool(v.kind == o.kind && v.u.b == o.u.b);
    if (v.kind == o.kind && (v.kind == JK_LIST || v.kind == JK_DICT || v.kind == JK_NS))
        return jv_bool(v.u.l == o.u.l);
    jfail(c, pos, KVLLM_EUNSUPPORTED, "'sameas' on %s values is not supported", jv_type_name(v));
}
TEST_FN(t_filter) {
    no_args(c, pos, "filter", a);
    bool unsupported;
    return jv_bool(v.kind == JK_STR && (jfilter_find(v.u.s, &unsupported) || unsupported));
}
TEST_FN(t_test) {
    no_args(c, pos, "test", a);
    bool unsupported;
    return jv_bool(v.kind == JK_STR && (jtest_find(v.u.s, &unsupported) || unsupported));
}

static const struct { const char *name; jbuiltin fn; } k_tests[] = {
    { "boolean", t_boolean }, { "callable", t_callable }, { "defined", t_defined }, { "divisibleby", t_divisibleby },
    { "eq", t_eq }, { "equalto", t_eq }, { "escaped", t_escaped }, { "even", t_even }, { "false", t_false },
    { "filter", t_filter }, { "float", t_float }, { "ge", t_ge }, { "greaterthan", t_gt }, { "gt", t_gt },
    { "in", t_in }, { "integer", t_integer }, { "iterable", t_iterable }, { "le", t_le }, { "lessthan", t_lt },
    { "lower", t_lower }, { "lt", t_lt }, { "mapping", t_mapping }, { "ne", t_ne }, { "none", t_none },
    { "number", t_number }, { "odd", t_odd }, { "sameas", t_sameas }, { "sequence", t_sequence },
    { "string", t_string }, { "test", t_test }, { "true", t_true }, { "undefined", t_undefined },
    { "upper", t_upper },
};

/* ---- lookup ---- */

static int filter_index(struct jstr name) {
    for (size_t i = 0; i < sizeof k_filters / sizeof *k_filters; i++)
        if (jstr_eq(name, k_filters[i].name)) return (int)i;
    return -1;
}

jbuiltin jfilter_find(struct jstr name, bool *unsupported) {
    *unsupported = false;
    int at = filter_index(name);
    if (at >= 0) return k_filters[at].fn;
    for (int i = 0; k_filters_missing[i]; i++)
        if (jstr_eq(name, k_filters_missing[i])) *unsupported = true;
    return NULL;
}

jbuiltin jtest_find(struct jstr name, bool *unsupported) {
    *unsupported = false;
    for (size_t i = 0; i < sizeof k_tests / sizeof *k_tests; i++)
        if (jstr_eq(name, k_tests[i].name)) return k_tests[i].fn;
    return NULL;
}

struct jv jcall_filter(struct jctx *c, uint32_t pos, struct jstr name, struct jv v, const struct jargs *a) {
    bool unsupported;
    jbuiltin fn = jfilter_find(name, &unsupported);
    if (!fn) {
        if (unsupported) jfail(c, pos, KVLLM_EUNSUPPORTED, "the '%.*s' filter is not supported", (int)name.n, name.p);
        jfail(c, pos, KVLLM_EINVAL, "no filter named '%.*s'", (int)name.n, name.p);
    }
    bool saved = c->precise;
    c->precise = false;
    struct jv r = fn(c, pos, v, a);
    bool precise = c->precise || k_filters[filter_index(name)].precise;
    c->precise = saved;
    return jtaint_result(c, r, precise, v, a);
}

bool jcall_test(struct jctx *c, uint32_t pos, struct jstr name, struct jv v, const struct jargs *a) {
    bool unsupported;
    jbuiltin fn = jtest_find(name, &unsupported);
    if (!fn) jfail(c, pos, KVLLM_EINVAL, "no test named '%.*s'", (int)name.n, name.p);
    return fn(c, pos, v, a).u.b;
}
