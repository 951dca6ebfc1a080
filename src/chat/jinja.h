/* jinja.h — internals of the chat-template interpreter, a subset of Jinja2
 * big enough for the chat templates models ship.  Only src/chat/jinja_*.c and
 * chat_template.c include it; the interface is chat/chat_template.h.
 *
 * Model of the world: one render is one `struct jctx`.  Everything it makes
 * (tokens, syntax tree, values, strings, scopes, output) lives in the
 * context's arena and is freed at once when the render ends, so values are
 * plain structs with no reference counts.  Errors are found deep inside the
 * lexer, parser or evaluator; they format a message with the source offset
 * and longjmp back to the one entry point (chat_template_render), which
 * frees the arena and logs "line:column: message".  Nothing outside the
 * arena is allocated between setjmp and the end of the render, so a longjmp
 * leaks nothing.
 *
 * Semantics follow Jinja2 3.1 as Hugging Face Transformers configures it:
 * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 * extensions=[loopcontrols]) with the default Undefined, and values behave
 * as the Python objects they stand for (str, int, float, list, tuple, dict,
 * generator).  Whatever the interpreter cannot reproduce exactly is an error
 * (KVLLM_EUNSUPPORTED), never a guess.
 *
 * Taint: every string knows which of its bytes came from message text (the
 * role and content the caller passed), as spans (struct jtaint), so that the
 * render can say which bytes of its output are the user's and the tokenizer
 * can refuse to read control tokens there.  Spans follow bytes exactly
 * through output, concatenation (+, ~), captures (macros, set blocks), join,
 * trim/strip and the characters of a string; any other builtin whose input
 * holds message text marks the whole string it returns (and every string of
 * a list it returns) as message text, unless it declares its result exact
 * (jprecise: it returns values it was given, unchanged).  Lists and dicts
 * carry a flag saying whether anything inside them is message text.  The
 * rule errs one way only: markup built from message text may be treated as
 * text, message text never as markup. */
#ifndef KVLLM_TOK_JINJA_H
#define KVLLM_TOK_JINJA_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define JINJA_MAX_DEPTH 400                    /* nested expressions / statements / macro calls */
#define JINJA_MAX_MEM   ((size_t)256 << 20)    /* arena bytes per render */
/* Default budgets of one render (chat_template_params can lower or raise
 * them): a step is one expression or statement evaluated, one loop
 * iteration, one list item made, or one item a builtin scans; the output is
 * the rendered text (and any string built on the way).  Exceeding either
 * fails the render (KVLLM_ERANGE). */
#define JINJA_MAX_STEPS  ((uint64_t)2000000)
#define JINJA_MAX_OUTPUT ((size_t)8 << 20)

struct jctx;

/* ---- strings and values ------------------------------------------------ */

struct jspan { size_t off, n; };   /* bytes [off, off + n) */

/* Message-text spans, sorted and disjoint, in the arena.  Shared by the
 * strings cut from one growing buffer, so a reader only looks at the spans
 * that start below its own length (and clips the last). */
struct jtaint {
    struct jspan *s;   /* (cap) */
    size_t n, cap;
};

struct jstr {
    const char *p;   /* UTF-8, not NUL-terminated */
    size_t n;        /* bytes */
    const struct jtaint *t;   /* message-text bytes; NULL: none */
};

enum jkind {
    JK_UNDEF,  /* jinja2.Undefined; u.s holds the name, for messages */
    JK_NONE, JK_BOOL, JK_INT, JK_FLOAT, JK_STR,
    JK_LIST,   /* list, tuple, generator or dict view: see enum jshape */
    JK_DICT,   /* insertion-ordered, keys compared with Python == */
    JK_NS,     /* namespace(): a dict whose entries are attributes */
    JK_MACRO, JK_FUNC, JK_LOOP,
};

struct jv {
    uint8_t kind;    /* enum jkind */
    bool safe;       /* JK_STR: a markupsafe.Markup (from |safe or |escape) */
    union {
        bool b;
        int64_t i;
        double f;
        struct jstr s;
        struct jlist *l;
        struct jdict *d;
        struct jmacro *m;
        struct jfunc *fn;
        struct jloop *loop;
    } u;
};

enum jshape {
    JL_LIST, JL_TUPLE,
    JL_GEN,                          /* a one-shot Python generator (select, map, ...) */
    JL_ITEMS, JL_KEYS, JL_VALUES,    /* dict.items() / keys() / values() views */
    JL_RANGE,                        /* range(): a tuple that does not print */
};

struct jlist {
    struct jv *v;    /* (cap) */
    size_t n, cap;
    uint8_t shape;   /* enum jshape */
    bool consumed;   /* JL_GEN: already iterated (iterates as empty again) */
    bool tainted;    /* an item holds message text (set by jlist_push) */
};

struct jdict {
    struct jv *k, *v;  /* (cap) each */
    size_t n, cap;
    bool tainted;      /* a key or value holds message text (set by jdict_set) */
};

/* Arguments of a call, filter or test (the value filtered or tested is
 * passed separately as `self`). */
struct jargs {
    const struct jv *pos;
    int n_pos;
    const struct jstr *kw;     /* (n_kw) names */
    const struct jv *kwv;      /* (n_kw) values */
    int n_kw;
};

/* A built-in function, filter, test or bound method.  pos: source offset
 * for errors. */
typedef struct jv (*jbuiltin)(struct jctx *c, uint32_t pos, struct jv self, const struct jargs *a);

struct jfunc {
    const char *name;
    jbuiltin fn;
    struct jv self;          /* the bound object of a method (JK_UNDEF for plain functions) */
};

struct jnode;
struct jscope;

struct jmacro {
    const struct jnode *def;     /* JS_MACRO */
    struct jscope *closure;      /* names not local to the macro resolve here, at call time */
};

struct jloop {
    const struct jv *items;      /* (n) after the loop's `if` filter */
    size_t n, i;                 /* i: current index0 */
    int depth;                   /* 1 for the outermost loop */
};

struct jscope {
    struct jscope *parent;
    struct jdict vars;
};

/* ---- syntax tree -------------------------------------------------------- */

enum jn_kind {
    /* expressions */
    JN_CONST,      /* k */
    JN_NAME,       /* s */
    JN_LIST,       /* v[n] */
    JN_TUPLE,      /* v[n] */
    JN_DICT,       /* keys v[n], values v2[n] */
    JN_GETATTR,    /* a.s */
    JN_GETITEM,    /* a[b] */
    JN_SLICE,      /* the b of a JN_GETITEM: a:b:c (start, stop, step), missing ones NULL */
    JN_CALL,       /* a(args): v[n] with names[n] (.p NULL: positional) */
    JN_FILTER,     /* a|s(args); a NULL inside a filter block or `set x | f` */
    JN_TEST,       /* a is s(args) (`is not` wraps it in a JN_NOT) */
    JN_NOT,        /* not a */
    JN_NEG, JN_POS,/* -a, +a */
    JN_BINOP,      /* a op b: op is one of '+','-','*','/','%','~', 'F' (//), 'P' (**) */
    JN_AND, JN_OR, /* a and b, a or b */
    JN_COMPARE,    /* a ops[0] v[0] ops[1] v[1] ... (enum jcmp) */
    JN_COND,       /* b if a else c (c may be NULL) */
    JN_NSREF,      /* s.(k.u.s): a namespace attribute as an assignment target */
    /* statements */
    JS_DATA,       /* literal text s */
    JS_OUTPUT,     /* {{ a }} or {% print a %} */
    JS_IF,         /* if a: body b (a JS_BLOCK) else c (a JS_BLOCK, a JS_IF for elif, or NULL) */
    JS_FOR,        /* for target a in b [if c]: v[n] else v2[n2] */
    JS_SET,        /* set target a = b */
    JS_SETBLOCK,   /* set target a [| filter chain b, innermost a NULL]: body v[n] */
    JS_MACRO,      /* macro s(names[n] = defaults v2[n], NULL: none): body c (a JS_BLOCK) */
    JS_BREAK, JS_CONTINUE,
    JS_WITH,       /* with names[n] = v2[n]: body c (a JS_BLOCK) */
    JS_FILTERBLOCK,/* filter b (b is a JN_FILTER chain whose innermost a is NULL): v[n] */
    JS_BLOCK,      /* statements v[n] (a body; also {% generation %}) */
};

enum jcmp { JC_EQ, JC_NE, JC_LT, JC_LE, JC_GT, JC_GE, JC_IN, JC_NOTIN };

struct jnode {
    uint8_t kind;            /* enum jn_kind */
    uint8_t op;
    uint32_t pos;            /* byte offset in the (normalised) source */
    struct jnode *a, *b, *c;
    struct jnode **v;        /* (n) */
    struct jnode **v2;       /* (n2), or (n) for JN_DICT / JS_MACRO / JS_WITH */
    struct jstr *names;      /* (n): call keywords (.p NULL: positional), macro params, with targets */
    uint8_t *ops;            /* (n): JN_COMPARE operators */
    int n, n2;
    struct jstr s;
    struct jv k;
};

/* ---- the render context ------------------------------------------------- */

struct jchunk;

struct jbuf {                /* growable byte string in the arena */
    char *p;
    size_t n, cap;
    struct jtaint *t;        /* message-text spans written so far (jb_put_str) */
};

struct jctx {
    /* memory */
    struct jchunk *chunks;
    size_t mem_used, mem_cap;
    /* errors */
    jmp_buf jmp;
    int err_code;            /* KVLLM_E* */
    uint32_t err_pos;
    char err_msg[512];
    /* the template, newlines normalised to \n, one trailing \n dropped */
    const char *src;
    size_t src_len;
    /* evaluation */
    int depth;
    uint64_t steps, max_steps;   /* work done, and the budget (jstep) */
    size_t max_out;              /* bytes the output, or any string built, may reach */
    struct jbuf *root_out;       /* the render's output buffer */
    struct jscope *globals;  /* render variables and global functions */
    struct jbuf *out;        /* current output (a macro or block set captures into its own) */
    struct tm now;           /* for strftime_now */
    bool precise;            /* set by a builtin whose result's taint is exact (jprecise) */
};

/* ---- jinja_value.c: memory, errors, values ------------------------------ */

_Noreturn void jfail(struct jctx *c, uint32_t pos, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Line and column (1-based, columns in characters) of a source offset. */
void jpos_linecol(const struct jctx *c, uint32_t pos, int *line, int *col);
void jdepth_enter(struct jctx *c, uint32_t pos);
static inline void jdepth_leave(struct jctx *c) { c->depth--; }
/* Charge n steps to the render's budget; past c->max_steps the render
 * fails with KVLLM_ERANGE (a template looping for ever, or quadratic work). */
_Noreturn void jfail_steps(struct jctx *c, uint32_t pos);
static inline void jstep(struct jctx *c, uint32_t pos, uint64_t n) {
    if ((c->steps += n) > c->max_steps) jfail_steps(c, pos);
}

void jarena_free(struct jctx *c);
void *jalloc(struct jctx *c, size_t n);                       /* zeroed; fails the render when over budget */
void *jalloc_array(struct jctx *c, size_t n, size_t size);
struct jstr jstr_dup(struct jctx *c, const char *p, size_t n);
static inline struct jstr jstr_c(const char *s) { struct jstr r = { s, 0, NULL }; while (s[r.n]) r.n++; return r; }
bool jstr_eq(struct jstr a, const char *s);
static inline bool jstr_same(struct jstr a, struct jstr b) {
    return a.n == b.n && (a.n == 0 || __builtin_memcmp(a.p, b.p, a.n) == 0);
}

void jb_put(struct jctx *c, struct jbuf *b, const char *p, size_t n);
static inline void jb_puts(struct jctx *c, struct jbuf *b, const char *s) { jb_put(c, b, s, __builtin_strlen(s)); }
void jb_putc(struct jctx *c, struct jbuf *b, char ch);
void jb_printf(struct jctx *c, struct jbuf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline struct jstr jb_str(const struct jbuf *b) { struct jstr s = { b->p ? b->p : "", b->n, b->t }; return s; }

/* ---- taint (message-text spans) ---- */

/* Does any byte of s come from message text? */
static inline bool jstr_tainted(struct jstr s) { return s.t && s.t->n && s.t->s[0].off < s.n; }
/* Does v hold message text (a string's bytes, or anything inside a list,
 * dict, namespace or bound method)?  O(1). */
bool jv_tainted(struct jv v);
/* Append s to b, its message-text spans with it. */
void jb_put_str(struct jctx *c, struct jbuf *b, struct jstr s);
/* Mark b's bytes [start, b->n) as message text. */
void jb_taint_from(struct jctx *c, struct jbuf *b, size_t start);
/* s with all its bytes marked as message text. */
struct jstr jstr_taint_all(struct jctx *c, struct jstr s);
/* Bytes [off, off + n) of s, with the spans that fall inside. */
struct jstr jstr_sub(struct jctx *c, struct jstr s, size_t off, size_t n);
/* A builtin's declaration that the taint of the value it returns is exact. */
static inline void jprecise(struct jctx *c) { c->precise = true; }
/* The taint rule for a builtin's result r given its inputs (self and
 * arguments): unless the builtin called jprecise, a result computed from
 * message text is message text, all of it. */
struct jv jtaint_result(struct jctx *c, struct jv r, bool precise, struct jv self, const struct jargs *a);

static inline struct jv jv_undef(struct jstr name) { struct jv v = { .kind = JK_UNDEF }; v.u.s = name; return v; }
static inline struct jv jv_none(void) { struct jv v = { .kind = JK_NONE }; return v; }
static inline struct jv jv_bool(bool b) { struct jv v = { .kind = JK_BOOL }; v.u.b = b; return v; }
static inline struct jv jv_int(int64_t i) { struct jv v = { .kind = JK_INT }; v.u.i = i; return v; }
static inline struct jv jv_float(double f) { struct jv v = { .kind = JK_FLOAT }; v.u.f = f; return v; }
static inline struct jv jv_str(struct jstr s) { struct jv v = { .kind = JK_STR }; v.u.s = s; return v; }
struct jv jv_cstr(struct jctx *c, const char *s);             /* copies */
struct jv jv_list(struct jctx *c, enum jshape shape, size_t cap);
struct jv jv_dict(struct jctx *c);
struct jv jv_func(struct jctx *c, const char *name, jbuiltin fn, struct jv self);
void jlist_push(struct jctx *c, struct jlist *l, struct jv v);
void jdict_set(struct jctx *c, struct jdict *d, struct jv key, struct jv val);
bool jdict_get(const struct jdict *d, struct jv key, struct jv *out);
bool jdict_get_str(const struct jdict *d, struct jstr key, struct jv *out);
static inline bool jv_is_str(struct jv v) { return v.kind == JK_STR; }
static inline bool jv_is_num(struct jv v) { return v.kind == JK_INT || v.kind == JK_FLOAT || v.kind == JK_BOOL; }

const char *jv_type_name(struct jv v);                       /* Python's type name */
bool jv_truthy(struct jv v);
bool jv_hashable(struct jv v);                               /* a dict key / set member in Python */
bool jv_eq(struct jv a, struct jv b);                        /* Python == */
int jv_cmp(struct jctx *c, uint32_t pos, struct jv a, struct jv b);  /* Python <, error if unordered */
double jv_num(struct jv v);                                   /* int, float or bool as a double */
void jv_write_str(struct jctx *c, uint32_t pos, struct jbuf *b, struct jv v);   /* Python str(v) */
void jv_write_repr(struct jctx *c, uint32_t pos, struct jbuf *b, struct jv v);  /* Python repr(v) */
struct jstr jv_to_str(struct jctx *c, uint32_t pos, struct jv v);
void jv_write_float(struct jctx *c, struct jbuf *b, double f); /* Python repr(float) */

struct jjson_opts {
    bool ensure_ascii, sort_keys;
    bool pretty;              /* indent given */
    struct jstr indent;       /* per level */
    struct jstr item_sep, key_sep;
};
/* json.dumps(v, **opts) as Python writes it. */
void jv_write_json(struct jctx *c, uint32_t pos, struct jbuf *b, struct jv v,
                   const struct jjson_opts *o, int level);

/* The items of an iterable (list, tuple, generator, view, dict keys, string
 * characters; Undefined is empty); fails on anything else. */
const struct jv *jv_iterate(struct jctx *c, uint32_t pos, struct jv v, size_t *n);
/* Length as Python len(), or fails. */
size_t jv_len(struct jctx *c, uint32_t pos, struct jv v);

/* UTF-8: decode one character at s[*i] (n bytes in all), advancing *i; a
 * byte that starts no valid character decodes alone to 0xDC00 + byte. */
uint32_t utf8_next(const char *s, size_t n, size_t *i);
void utf8_put(struct jctx *c, struct jbuf *b, uint32_t cp);
size_t utf8_count(struct jstr s);                            /* characters */
bool py_isspace(uint32_t cp);                               /* str.isspace() */

/* ---- jinja_lex.c / jinja_parse.c --------------------------------------- */

enum jtok {
    JT_EOF, JT_DATA, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP,
};

struct jtoken {
    uint8_t type;    /* enum jtok */
    uint8_t op;      /* JT_OP: the operator char, or 'F' //, 'P' **, 'E' ==, 'N' !=, 'G' >=, 'L' <= */
    uint32_t pos;
    struct jstr s;   /* DATA, NAME, STRING (unescaped) */
    int64_t i;
    double f;
};

/* Tokenise c->src; *out: array ending with JT_EOF. */
void jlex(struct jctx *c, struct jtoken **out, size_t *n);
/* The template's statements (a JS_BLOCK). */
struct jnode *jparse(struct jctx *c, const struct jtoken *toks, size_t n);

/* ---- jinja_eval.c ------------------------------------------------------- */

void jrender(struct jctx *c, const struct jnode *root, struct jbuf *out);
struct jv jeval(struct jctx *c, struct jscope *sc, const struct jnode *e);
struct jv jgetattr(struct jctx *c, uint32_t pos, struct jv obj, struct jstr name);   /* x.name */
struct jv jgetitem(struct jctx *c, uint32_t pos, struct jv obj, struct jv key);      /* x[key] */
struct jv jcall(struct jctx *c, uint32_t pos, struct jv callee, const struct jargs *a);
void jscope_set(struct jctx *c, struct jscope *sc, struct jstr name, struct jv v);
struct jscope *jscope_new(struct jctx *c, struct jscope *parent);

/* markupsafe.escape(v): HTML-escaped str(v), marked safe (a safe string is kept). */
struct jv jv_escape(struct jctx *c, uint32_t pos, struct jv v);

/* ---- jinja_strings.c: Python str methods over UTF-8 --------------------- */

enum jcase {
    JCASE_LOWER, JCASE_UPPER,
    JCASE_TITLE,        /* str.title() */
    JCASE_CAPITALIZE,   /* str.capitalize() */
    JCASE_JTITLE,       /* jinja2's |title: upper after - ( { [ < and whitespace */
};
/* Case mapping is exact for ASCII, Latin-1, Latin Extended-A and basic
 * Cyrillic; a cased character of any other script fails (unsupported). */
struct jstr pystr_case(struct jctx *c, uint32_t pos, struct jstr s, enum jcase mode);
/* str.islower() (upper false) / str.isupper() (upper true). */
bool pystr_is_case(struct jctx *c, uint32_t pos, struct jstr s, bool upper);
/* str.strip/lstrip/rstrip(chars); chars NULL: whitespace. */
struct jstr pystr_strip(struct jstr s, const struct jstr *chars, bool left, bool right);
/* str.split / rsplit(sep, maxsplit); sep NULL: runs of whitespace. */
struct jv pystr_split(struct jctx *c, uint32_t pos, struct jstr s, const struct jstr *sep, int64_t maxsplit,
                      bool right);
struct jv pystr_splitlines(struct jctx *c, struct jstr s, bool keepends);
struct jstr pystr_replace(struct jctx *c, struct jstr s, struct jstr old, struct jstr rep, int64_t count);
int64_t pystr_find(struct jstr s, struct jstr sub, bool last);     /* in characters; -1: absent */
int64_t pystr_count(struct jstr s, struct jstr sub);

/* ---- jinja_json.c: JSON text as values (tools, tool_calls) ------------ */

/* JSON text as Python's json.loads reads it (dicts in document order,
 * integers int, other numbers float), every string (keys too) marked as
 * message text when taint.  Malformed JSON fails the render (KVLLM_EINVAL,
 * "WHAT: invalid JSON at byte N: why"); an integer past 64 bits or a lone
 * surrogate escape, which a template value cannot hold, fails it too. */
struct jv jjson_parse(struct jctx *c, const char *what, const char *s, size_t n, bool taint);
/* The same, but malformed JSON returns false (*out untouched) instead of
 * failing the render; the step and memory budgets still fail it. */
bool jjson_try_parse(struct jctx *c, const char *what, const char *s, size_t n, bool taint, struct jv *out);

/* ---- jinja_filters.c / jinja_methods.c --------------------------------- */

/* Bind a builtin's arguments to its parameter names (NULL-terminated):
 * out[i] is the value, or an Undefined named jmissing when not given.
 * Fails on extra positional or unknown keyword arguments. */
void jbind(struct jctx *c, uint32_t pos, const char *fname, const struct jargs *a,
           const char *const *params, struct jv *out);
extern const char jmissing[];
static inline bool jgiven(struct jv v) { return !(v.kind == JK_UNDEF && v.u.s.p == jmissing); }
/* A str argument (or fail). */
struct jstr jarg_str(struct jctx *c, uint32_t pos, const char *what, struct jv v);
int64_t jarg_int(struct jctx *c, uint32_t pos, const char *what, struct jv v);
/* Stable sort of items by key (Python sorted(); key may be NULL). */
void jsort(struct jctx *c, uint32_t pos, struct jv *items, const struct jv *keys, size_t n, bool reverse);

/* NULL when Jinja2 has no such filter / test; *unsupported set when Jinja2
 * has it but this interpreter does not. */
jbuiltin jfilter_find(struct jstr name, bool *unsupported);
jbuiltin jtest_find(struct jstr name, bool *unsupported);
struct jv jcall_filter(struct jctx *c, uint32_t pos, struct jstr name, struct jv v, const struct jargs *a);
bool jcall_test(struct jctx *c, uint32_t pos, struct jstr name, struct jv v, const struct jargs *a);
/* A method of a str, dict or list (x.name), bound; false when none. */
bool jmethod_find(struct jctx *c, struct jv obj, struct jstr name, struct jv *out);
/* Global functions: range, dict, namespace, raise_exception, strftime_now. */
void jglobals_add(struct jctx *c, struct jscope *globals);

#endif
