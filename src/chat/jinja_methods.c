/* jinja_methods.c — methods of str, dict and list values as the sandbox
 * exposes them (x.strip(), d.items(), ...) and the global functions a
 * chat template can call: range, dict, namespace, and Transformers'
 * raise_exception and strftime_now.  Methods that would mutate a value are
 * blocked, as in jinja2's ImmutableSandboxedEnvironment. */
#include "chat/jinja.h"
#include "kvllm.h"

#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define METHOD(name) static struct jv name(struct jctx *c, uint32_t pos, struct jv self, const struct jargs *a)

static const struct jstr *opt_chars(struct jctx *c, uint32_t pos, struct jv v, struct jstr *store) {
    if (!jgiven(v) || v.kind == JK_NONE) return NULL;
    *store = jarg_str(c, pos, "chars", v);
    return store;
}

static struct jv strip_impl(struct jctx *c, uint32_t pos, struct jv self, const struct jargs *a, bool l, bool r) {
    struct jv p[1];
    jbind(c, pos, "strip", a, (const char *const[]){ "chars", NULL }, p);
    struct jstr store, t = pystr_strip(self.u.s, opt_chars(c, pos, p[0], &store), l, r);
    jprecise(c);   /* a substring, with its spans */
    return jv_str(jstr_sub(c, self.u.s, (size_t)(t.p - self.u.s.p), t.n));
}

METHOD(m_strip) { return strip_impl(c, pos, self, a, true, true); }
METHOD(m_lstrip) { return strip_impl(c, pos, self, a, true, false); }
METHOD(m_rstrip) { return strip_impl(c, pos, self, a, false, true); }

static struct jv affix_impl(struct jctx *c, uint32_t pos, struct jv self, const struct jargs *a, bool end) {
    struct jv p[3];
    jbind(c, pos, end ? "endswith" : "startswith", a, (const char *const[]){ "prefix", "start", "end", NULL }, p);
    if (jgiven(p[1]) || jgiven(p[2]))
        jfail(c, pos, KVLLM_EUNSUPPORTED, "start/end arguments of startswith/endswith are not supported");
    if (!jgiven(p[0])) jfail(c, pos, KVLLM_EINVAL, "startswith/endswith needs an argument");
    size_t n = 1;
    const struct jv *cands = &p[0];
    if (p[0].kind == JK_LIST && p[0].u.l->shape == JL_TUPLE) cands = jv_iterate(c, pos, p[0], &n);
    for (size_t i = 0; i < n; i++) {
        struct jstr x = jarg_str(c, pos, "prefix", cands[i]);
        if (x.n > self.u.s.n) continue;
        if (!memcmp(self.u.s.p + (end ? self.u.s.n - x.n : 0), x.p, x.n)) return jv_bool(true);
    }
    return jv_bool(false);
}

METHOD(m_startswith) { return affix_impl(c, pos, self, a, false); }
METHOD(m_endswith) { return affix_impl(c, pos, self, a, true); }

static struct jv split_impl(struct jctx *c, uint32_t pos, struct jv self, const struct jargs *a, bool right) {
    struct jv p[2];
    jbind(c, pos, right ? "rsplit" : "split", a, (const char *const[]){ "sep", "maxsplit", NULL }, p);
    struct jstr store;
    const struct jstr *sep = NULL;
    if (jgiven(p[0]) && p[0].kind != JK_NONE) { store = jarg_str(c, pos, "sep", p[0]); sep = &store; }
    int64_t maxsplit = jgiven(p[1]) ? jarg_int(c, pos, "maxsplit", p[1]) : -1;
    return pystr_split(c, pos, self.u.s, sep, maxsplit, right);
}

METHOD(m_split) { return split_impl(c, pos, self, a, false); }
METHOD(m_rsplit) { return split_impl(c, pos, self, a, true); }

METHOD(m_splitlines) {
    struct jv p[1];
    jbind(c, pos, "splitlines", a, (const char *const[]){ "keepends", NULL }, p);
    return pystr_splitlines(c, self.u.s, jgiven(p[0]) && jv_truthy(p[0]));
}

static struct jv case_impl(struct jctx *c, uint32_t pos, struct jv self, const struct jargs *a, enum jcase mode) {
    jbind(c, pos, "str method", a, (const char *const[]){ NULL }, NULL);
    struct jv r = jv_str(pystr_case(c, pos, self.u.s, mode));
    r.safe = self.safe;
    return r;
}

METHOD(m_upper) { return case_impl(c, pos, self, a, JCASE_UPPER); }
METHOD(m_lower) { return case_impl(c, pos, self, a, JCASE_LOWER); }
METHOD(m_title) { return case_impl(c, pos, self, a, JCASE_TITLE); }
METHOD(m_capitalize) { return case_impl(c, pos, self, a, JCASE_CAPITALIZE); }

METHOD(m_islower) {
    jbind(c, pos, "islower", a, (const char *const[]){ NULL }, NULL);
    return jv_bool(pystr_is_case(c, pos, self.u.s, false));
}

METHOD(m_isupper) {
    jbind(c, pos, "isupper", a, (const char *const[]){ NULL }, NULL);
    return jv_bool(pystr_is_case(c, pos, self.u.s, true));
}

METHOD(m_isspace) {
    jbind(c, pos, "isspace", a, (const char *const[]){ NULL }, NULL);
    struct jstr s = self.u.s;
    return jv_bool(s.n && pystr_strip(s, NULL, true, false).n == 0);
}

/* isdigit / isalpha / isalnum for ASCII text (Unicode classes are not tabled here) */
static struct jv class_impl(struct jctx *c, uint32_t pos, struct jv self, const struct jargs *a, int cls) {
    jbind(c, pos, "str method", a, (const char *const[]){ NULL }, NULL);
    struct jstr s = self.u.s;
    if (!s.n) return jv_bool(false);
    for (size_t i = 0; i < s.n; i++) {
        unsigned char ch = (unsigned char)s.p[i];
        if (ch >= 0x80) jfail(c, pos, KVLLM_EUNSUPPORTED, "character classes of non-ASCII text are not supported");
        bool digit = ch >= '0' && ch <= '9', alpha = (ch | 0x20) >= 'a' && (ch | 0x20) <= 'z';
        if (!(cls == 0 ? digit : cls == 1 ? alpha : digit || alpha)) return jv_bool(false);
    }
    return jv_bool(true);
}

METHOD(m_isdigit) { return class_impl(c, pos, self, a, 0); }
METHOD(m_isalpha) { return class_impl(c, pos, self, a, 1); }
METHOD(m_isalnum) { return class_impl(c, pos, self, a, 2); }

METHOD(m_replace) {
    struct jv p[3];
    jbind(c, pos, "replace", a, (const char *const[]){ "old", "new", "count", NULL }, p);
    if (!jgiven(p[0]) || !jgiven(p[1])) jfail(c, pos, KVLLM_EINVAL, "replace() needs old and new");
    int64_t count = jgiven(p[2]) ? jarg_int(c, pos, "count", p[2]) : -1;
    return jv_str(pystr_replace(c, self.u.s, jarg_str(c, pos, "old", p[0]), jarg_str(c, pos, "new", p[1]), count));
}

static struct jstr sub_arg(struct jctx *c, uint32_t pos, const char *name, const struct jargs *a) {
    struct jv p[3];
    jbind(c, pos, name, a, (const char *const[]){ "sub", "start", "end", NULL }, p);
    if (jgiven(p[1]) || jgiven(p[2]))
        jfail(c, pos, KVLLM_EUNSUPPORTED, "start/end arguments of %s are not supported", name);
    if (!jgiven(p[0])) jfail(c, pos, KVLLM_EINVAL, "%s() needs an argument", name);
    return jarg_str(c, pos, "sub", p[0]);
}

METHOD(m_find) { return jv_int(pystr_find(self.u.s, sub_arg(c, pos, "find", a), false)); }
METHOD(m_rfind) { return jv_int(pystr_find(self.u.s, sub_arg(c, pos, "rfind", a), true)); }
METHOD(m_str_count) { return jv_int(pystr_count(self.u.s, sub_arg(c, pos, "count", a))); }

static struct jv fix_impl(struct jctx *c, uint32_t pos, struct jv self, const struct jargs *a, bool suffix) {
    struct jv p[1];
    jbind(c, pos, suffix ? "removesuffix" : "removeprefix", a, (const char *const[]){ "affix", NULL }, p);
    struct jstr x = jarg_str(c, pos, "affix", jgiven(p[0]) ? p[0] : jv_none()), s = self.u.s;
    if (x.n && x.n <= s.n && !memcmp(s.p + (suffix ? s.n - x.n : 0), x.p, x.n))
        return jv_str((struct jstr){ s.p + (suffix ? 0 : x.n), s.n - x.n, NULL });
    return self;
}

METHOD(m_removeprefix) { return fix_impl(c, pos, self, a, false); }
METHOD(m_removesuffix) { return fix_impl(c, pos, self, a, true); }

METHOD(m_join) {
    struct jv p[1];
    jbind(c, pos, "join", a, (const char *const[]){ "iterable", NULL }, p);
    if (!jgiven(p[0])) jfail(c, pos, KVLLM_EINVAL, "join() needs an argument");
    size_t n;
    const struct jv *items = jv_iterate(c, pos, p[0], &n);
    struct jbuf b = { 0 };
    for (size_t i = 0; i < n; i++) {
        if (items[i].kind != JK_STR)
            jfail(c, pos, KVLLM_EINVAL, "sequence item %zu: expected str instance, %s found", i,
                  jv_type_name(items[i]));
        if (i) jb_put_str(c, &b, self.u.s);
        jb_put_str(c, &b, items[i].u.s);
    }
    jprecise(c);   /* spans carried by jb_put_str */
    return jv_str(jb_str(&b));
}

/* ---- dict ---- */

static struct jv view(struct jctx *c, uint32_t pos, struct jv self, const struct jargs *a, enum jshape shape) {
    jbind(c, pos, "dict method", a, (const char *const[]){ NULL }, NULL);
    const struct jdict *d = self.u.d;
    struct jv r = jv_list(c, shape, d->n);
    for (size_t i = 0; i < d->n; i++) {
        if (shape == JL_ITEMS) {
            struct jv pair = jv_list(c, JL_TUPLE, 2);
            jlist_push(c, pair.u.l, d->k[i]);
            jlist_push(c, pair.u.l, d->v[i]);
            jlist_push(c, r.u.l, pair);
        } else {
            jlist_push(c, r.u.l, shape == JL_KEYS ? d->k[i] : d->v[i]);
        }
    }
    jprecise(c);   /* the dict's keys and values, unchanged */
    return r;
}

METHOD(m_items) { return view(c, pos, self, a, JL_ITEMS); }
METHOD(m_keys) { return view(c, pos, self, a, JL_KEYS); }
METHOD(m_values) { return view(c, pos, self, a, JL_VALUES); }

METHOD(m_get) {
    struct jv p[2], out;
    jbind(c, pos, "get", a, (const char *const[]){ "key", "default", NULL }, p);
    if (!jgiven(p[0])) jfail(c, pos, KVLLM_EINVAL, "get() needs a key");
    jprecise(c);   /* a stored value or the default, unchanged */
    jstep(c, pos, self.u.d->n);   /* the lookup is linear */
    if (jdict_get(self.u.d, p[0], &out)) return out;
    return jgiven(p[1]) ? p[1] : jv_none();
}

/* ---- list / tuple ---- */

METHOD(m_list_count) {
    struct jv p[1];
    jbind(c, pos, "count", a, (const char *const[]){ "value", NULL }, p);
    int64_t n = 0;
    jstep(c, pos, self.u.l->n);   /* a linear scan */
    for (size_t i = 0; i < self.u.l->n; i++) n += jv_eq(self.u.l->v[i], p[0]);
    return jv_int(n);
}

METHOD(m_list_index) {
    struct jv p[1];
    jbind(c, pos, "index", a, (const char *const[]){ "value", NULL }, p);
    jstep(c, pos, self.u.l->n);   /* a linear scan */
    for (size_t i = 0; i < self.u.l->n; i++)
        if (jv_eq(self.u.l->v[i], p[0])) return jv_int((int64_t)i);
    jfail(c, pos, KVLLM_EINVAL, "value is not in list");
}

METHOD(m_unsupported) {
    jfail(c, pos, KVLLM_EUNSUPPORTED, "this method is not supported by the template interpreter");
}

enum { ON_STR = 1, ON_DICT = 2, ON_SEQ = 4 };

static const struct { int on; const char *name; jbuiltin fn; } k_methods[] = {
    { ON_STR, "strip", m_strip }, { ON_STR, "lstrip", m_lstrip }, { ON_STR, "rstrip", m_rstrip },
    { ON_STR, "startswith", m_startswith }, { ON_STR, "endswith", m_endswith }, { ON_STR, "split", m_split },
    { ON_STR, "rsplit", m_rsplit }, { ON_STR, "splitlines", m_splitlines }, { ON_STR, "upper", m_upper },
    { ON_STR, "lower", m_lower }, { ON_STR, "title", m_title }, { ON_STR, "capitalize", m_capitalize },
    { ON_STR, "islower", m_islower }, { ON_STR, "isupper", m_isupper }, { ON_STR, "isspace", m_isspace },
    { ON_STR, "isdigit", m_isdigit }, { ON_STR, "isalpha", m_isalpha }, { ON_STR, "isalnum", m_isalnum },
    { ON_STR, "replace", m_replace }, { ON_STR, "find", m_find }, { ON_STR, "rfind", m_rfind },
    { ON_STR, "count", m_str_count }, { ON_STR, "join", m_join }, { ON_STR, "removeprefix", m_removeprefix },
    { ON_STR, "removesuffix", m_removesuffix },
    { ON_DICT, "items", m_items }, { ON_DICT, "keys", m_keys }, { ON_DICT, "values", m_values },
    { ON_DICT, "get", m_get },
    { ON_SEQ, "count", m_list_count }, { ON_SEQ, "index", m_list_index },
};

/* Python methods that exist but are not implemented here (calling one fails). */
static const char *const k_str_missing[] = {
    "casefold", "center", "encode", "expandtabs", "format", "format_map", "index", "isascii", "isdecimal",
    "isidentifier", "isnumeric", "isprintable", "istitle", "ljust", "maketrans", "partition", "rindex",
    "rjust", "rpartition", "swapcase", "translate", "zfill", NULL,
};
static const char *const k_dict_missing[] = { "copy", "fromkeys", NULL };
/* Methods the immutable sandbox refuses. */
static const char *const k_dict_unsafe[] = { "clear", "pop", "popitem", "setdefault", "update", NULL };
static const char *const k_list_unsafe[] = {
    "append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort", NULL,
};

static bool in_names(struct jstr name, const char *const *names) {
    for (int i = 0; names[i]; i++)
        if (jstr_eq(name, names[i])) return true;
    return false;
}

bool jmethod_find(struct jctx *c, struct jv obj, struct jstr name, struct jv *out) {
    int on = obj.kind == JK_STR ? ON_STR : obj.kind == JK_DICT ? ON_DICT
             : obj.kind == JK_LIST && obj.u.l->shape == JL_LIST ? ON_SEQ
             : obj.kind == JK_LIST && obj.u.l->shape == JL_TUPLE ? ON_SEQ : 0;
    if (!on) return false;
    for (size_t i = 0; i < sizeof k_methods / sizeof *k_methods; i++)
        if ((k_methods[i].on & on) && jstr_eq(name, k_methods[i].name)) {
            *out = jv_func(c, k_methods[i].name, k_methods[i].fn, obj);
            return true;
        }
    if ((on == ON_STR && in_names(name, k_str_missing)) || (on == ON_DICT && in_names(name, k_dict_missing))) {
        *out = jv_func(c, "unsupported", m_unsupported, obj);
        return true;
    }
    bool is_list = on == ON_SEQ && obj.u.l->shape == JL_LIST;
    if ((on == ON_DICT && in_names(name, k_dict_unsafe)) || (is_list && in_names(name, k_list_unsafe))) {
        *out = jv_undef(jstr_c("a method that modifies a value (blocked by the immutable sandbox)"));
        return true;
    }
    return false;
}

/* ---- global functions ---- */

METHOD(g_range) {
    if (a->n_kw || a->n_pos < 1 || a->n_pos > 3)
        jfail(c, pos, KVLLM_EINVAL, "range() takes 1 to 3 positional arguments");
    int64_t start = 0, stop, step = 1;
    if (a->n_pos == 1) stop = jarg_int(c, pos, "range() argument", a->pos[0]);
    else {
        start = jarg_int(c, pos, "range() argument", a->pos[0]);
        stop = jarg_int(c, pos, "range() argument", a->pos[1]);
        if (a->n_pos == 3) step = jarg_int(c, pos, "range() argument", a->pos[2]);
    }
    if (!step) jfail(c, pos, KVLLM_EINVAL, "range() arg 3 must not be zero");
    double span = (double)stop - (double)start, count = span / (double)step;
    if (count > 100000)
        jfail(c, pos, KVLLM_EINVAL, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    struct jv r = jv_list(c, JL_RANGE, 0);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) jlist_push(c, r.u.l, jv_int(i));
    return r;
}

/* dict(mapping or pairs, **kw) into d */
static void fill_dict(struct jctx *c, uint32_t pos, struct jdict *d, const struct jargs *a, const char *fname) {
    if (a->n_pos > 1) jfail(c, pos, KVLLM_EINVAL, "%s expected at most 1 positional argument", fname);
    if (a->n_pos == 1) {
        struct jv src = a->pos[0];
        if (src.kind == JK_DICT || src.kind == JK_NS) {
            for (size_t i = 0; i < src.u.d->n; i++) jdict_set(c, d, src.u.d->k[i], src.u.d->v[i]);
        } else {
            size_t n;
            const struct jv *items = jv_iterate(c, pos, src, &n);
            for (size_t i = 0; i < n; i++) {
                size_t m;
                const struct jv *pair = jv_iterate(c, pos, items[i], &m);
                if (m != 2)
                    jfail(c, pos, KVLLM_EINVAL, "dictionary update sequence element #%zu has length %zu; 2 is required",
                          i, m);
                jdict_set(c, d, pair[0], pair[1]);
            }
        }
    }
    for (int k = 0; k < a->n_kw; k++) jdict_set(c, d, jv_str(a->kw[k]), a->kwv[k]);
}

METHOD(g_dict) {
    struct jv r = jv_dict(c);
    fill_dict(c, pos, r.u.d, a, "dict");
    return r;
}

METHOD(g_namespace) {
    struct jv r = jv_dict(c);
    fill_dict(c, pos, r.u.d, a, "namespace");
    r.kind = JK_NS;
    return r;
}

METHOD(g_raise_exception) {
    struct jv p[1];
    jbind(c, pos, "raise_exception", a, (const char *const[]){ "message", NULL }, p);
    struct jstr msg = jgiven(p[0]) ? jv_to_str(c, pos, p[0]) : jstr_c("");
    jfail(c, pos, KVLLM_EINVAL, "raise_exception: %.*s", (int)(msg.n < 400 ? msg.n : 400), msg.p);
}

/* datetime.strftime over c->now: Python handles %f %z %Z itself, the C
 * library (in the "C" locale) the rest. */
METHOD(g_strftime_now) {
    struct jv p[1];
    jbind(c, pos, "strftime_now", a, (const char *const[]){ "format", NULL }, p);
    struct jstr fmt = jarg_str(c, pos, "format", jgiven(p[0]) ? p[0] : jv_none());
    struct jbuf f = { 0 };
    for (size_t i = 0; i < fmt.n; i++) {
        if (fmt.p[i] == '%' && i + 1 < fmt.n) {
            char d = fmt.p[i + 1];
            if (d == 'f') { jb_puts(c, &f, "000000"); i++; continue; }
            if (d == 'z' || d == 'Z') { i++; continue; }
            if (d == '%') { jb_puts(c, &f, "%%"); i++; continue; }
        }
        if (!fmt.p[i]) jfail(c, pos, KVLLM_EINVAL, "embedded null character in the format");
        jb_putc(c, &f, fmt.p[i]);
    }
    jb_putc(c, &f, 0);
    /* nothing between newlocale and freelocale may fail the render */
    char *buf = NULL;
    size_t n = 0;
    for (size_t cap = 256; cap <= ((size_t)1 << 20); cap *= 4) {
        buf = jalloc(c, cap);
        locale_t cl = newlocale(LC_ALL_MASK, "C", (locale_t)0);
        if (!cl) jfail(c, pos, KVLLM_ENOMEM, "out of memory");
        n = strftime_l(buf, cap, f.p, &c->now, cl);
        freelocale(cl);
        if (n || f.n == 1) break;
    }
    return jv_str((struct jstr){ buf, n, NULL });
}

METHOD(g_unsupported) {
    jfail(c, pos, KVLLM_EUNSUPPORTED, "this global function is not supported by the template interpreter");
}

void jglobals_add(struct jctx *c, struct jscope *globals) {
    static const struct { const char *name; jbuiltin fn; } fns[] = {
        { "range", g_range }, { "dict", g_dict }, { "namespace", g_namespace },
        { "raise_exception", g_raise_exception }, { "strftime_now", g_strftime_now },
        { "lipsum", g_unsupported }, { "cycler", g_unsupported }, { "joiner", g_unsupported },
    };
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++)
        jscope_set(c, globals, jstr_c(fns[i].name), jv_func(c, fns[i].name, fns[i].fn, jv_undef((struct jstr){ 0 })));
}
