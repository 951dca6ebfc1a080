/* test_grammar_budget.c — a grammar's compile is bounded by its size, and a
 * grammar the matcher could never follow is refused at once:
 *   time      a 40,000-rule GBNF chain, a chain of nullable rules and a
 *             schema of 1,000 optional properties (with additional ones)
 *             compile in well under a second (the rule tables are hashed,
 *             nullability is a worklist, key rules are built once per trie
 *             node);
 *   refusals  KVLLM_ERANGE, quickly, naming the limit: 5,000 optional
 *             properties, an enum of 3,000 values, a rule entered through
 *             2,000 rules before a character, a literal repeated into 2M
 *             elements;
 *   depth     a pattern of 100,000 nested groups and a 100 KB property name
 *             beside additional properties are refused, not recursed into;
 *   matching  the 1,000-property grammar still matches what it should. */
#include "check.h"
#include "grammar_util.h"
#include "core/core.h"

#include <stdarg.h>
#include <time.h>

/* A growable string for building big inputs. */
struct text {
    char *s;
    size_t n, cap;
};

__attribute__((format(printf, 2, 3)))
static void add(struct text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (t->n + (size_t)n + 1 > t->cap) {
        t->cap = (t->n + (size_t)n + 1) * 2;
        t->s = realloc(t->s, t->cap);
        KV_ASSERT(t->s);
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    t->n += (size_t)n;
}

static void add_times(struct text *t, const char *piece, int n) {
    for (int i = 0; i < n; i++) add(t, "%s", piece);
}

/* t becomes head, piece n times, tail. */
static const char *build(struct text *t, const char *head, const char *piece, int n, const char *tail) {
    t->n = 0;
    add(t, "%s", head);
    add_times(t, piece, n);
    add(t, "%s", tail);
    return t->s;
}

/* The bounds are for an optimized build; an unoptimized or sanitizer build (make test runs the unit
 * tests under ASan at -O0) is allowed ten times as long, which still fails the cubic compile times
 * these cases were written against (a 40,000-rule chain took 35 s). */
#if !defined(__OPTIMIZE__) || defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SLOW 10.0
#else
#define SLOW 1.0
#endif

/* This thread's CPU time: a compile runs on the calling thread, and CPU time is what a loaded
 * machine (other tests in parallel) does not inflate. */
static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Compile GBNF or a schema; the code, the CPU time taken and the message. */
static int compile(bool schema, const char *text, struct kvllm_grammar **g, double *secs, char *err, size_t cap) {
    double t0 = thread_cpu_s();
    int rc = schema ? kvllm_grammar_from_json_schema(text, false, g, err, cap) : kvllm_grammar_from_gbnf(text, g, err, cap);
    *secs = thread_cpu_s() - t0;
    return rc;
}

/* Must compile, in under max_s seconds; returns the grammar. */
static struct kvllm_grammar *fast_ok(const char *what, bool schema, const char *text, double max_s) {
    struct kvllm_grammar *g = NULL;
    char err[512] = "";
    double s;
    int rc = compile(schema, text, &g, &s, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: %s", what, err);
    CHECK_MSG(s < max_s * SLOW, "%s: compiled in %.3f s of CPU (bound %.1f s)", what, s, max_s * SLOW);
    printf("%-44s compiled in %.3f s\n", what, s);
    return g;
}

/* Must be refused with rc, in under a second, the message holding `says`. */
static void refused(const char *what, bool schema, const char *text, int want, const char *says) {
    struct kvllm_grammar *g = NULL;
    char err[512] = "";
    double s;
    int rc = compile(schema, text, &g, &s, err, sizeof err);
    CHECK_MSG(rc == want && !g, "%s: rc %d (want %d)", what, rc, want);
    CHECK_MSG(strstr(err, says), "%s: message '%s' lacks '%s'", what, err, says);
    CHECK_MSG(s < 1.0 * SLOW, "%s: refused after %.3f s of CPU", what, s);
    printf("%-44s refused in %.3f s: %.120s\n", what, s, err);
    kvllm_grammar_free(g);
}

static char *object_schema(int n_props, bool additional) {
    struct text t = { 0 };
    add(&t, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < n_props; i++) add(&t, "%s\"property_number_%d\":{\"type\":\"string\"}", i ? "," : "", i);
    add(&t, "}%s}", additional ? "" : ",\"additionalProperties\":false");
    return t.s;
}

static int accepts(const struct kvllm_grammar *g, const struct gvocab *v, const char *s) {
    struct gmatcher *m;
    if (gmatcher_new(g, v, &m)) return -1;
    int ok = 1;
    for (const char *p = s; *p && ok; p++) ok = gmatcher_accept(m, (unsigned char)*p) == 0;
    ok = ok && gmatcher_can_end(m);
    gmatcher_free(m);
    return ok;
}

int main(void) {
    kvllm_log_set_level(KVLLM_LOG_ERROR);
    struct tvocab tv;
    tvocab_synthetic(&tv);
    struct gvocab *v = NULL;
    CHECK(tvocab_index(&tv, &v) == 0);

    /* a chain of 40,000 rules: rule lookups were a linear scan (35 s) */
    struct text t = { 0 };
    add(&t, "root ::= r0\n");
    for (int i = 0; i < 40000; i++) add(&t, "r%d ::= \"x\" r%d\n", i, i + 1);
    add(&t, "r40000 ::= \"y\"\n");
    kvllm_grammar_free(fast_ok("GBNF chain of 40,000 rules", false, t.s, 0.5));
    /* nullable rules defined in the order the old fixpoint learnt one per sweep */
    t.n = 0;
    add(&t, "root ::= n0 \"z\"\n");
    for (int i = 0; i < 20000; i++) add(&t, "n%d ::= \"a\" n%d | \"\"\n", i, i + 1);
    add(&t, "n20000 ::= \"\"\n");
    kvllm_grammar_free(fast_ok("GBNF chain of 20,000 nullable rules", false, t.s, 0.5));

    /* 1,000 optional properties and any others: rule names collided on one base (8 s) */
    char *schema = object_schema(1000, true);
    struct kvllm_grammar *g = fast_ok("schema of 1,000 properties (+ additional)", true, schema, 0.5);
    if (g && v) {
        CHECK(accepts(g, v, "{}") == 1);
        CHECK(accepts(g, v, "{\"property_number_999\": \"a\"}") == 1);
        CHECK(accepts(g, v, "{\"property_number_1\": \"a\", \"property_number_0\": \"b\"}") == 0);   /* order */
        CHECK(accepts(g, v, "{\"property_number_1000\": 5}") == 1);    /* an additional property */
        CHECK(accepts(g, v, "{\"property_number_99\": 5}") == 0);      /* a declared one: a string */
    }
    kvllm_grammar_free(g);
    free(schema);

    /* too wide for the matcher: refused before anything is built */
    schema = object_schema(5000, false);
    refused("schema of 5,000 optional properties", true, schema, KVLLM_ERANGE, "the matcher follows at most");
    free(schema);
    t.n = 0;
    add(&t, "{\"enum\":[");
    for (int i = 0; i < 3000; i++) add(&t, "%s\"value %d\"", i ? "," : "", i);
    add(&t, "]}");
    refused("enum of 3,000 values", true, t.s, KVLLM_ERANGE, "can begin 3000 ways");
    t.n = 0;
    add(&t, "root ::= l0\n");
    for (int i = 0; i < 2000; i++) add(&t, "l%d ::= l%d \"x\"\n", i, i + 1);
    add(&t, "l2000 ::= \"y\"\n");
    refused("GBNF: 2,000 rules before a character", false, t.s, KVLLM_ERANGE, "before a first character");
    refused("GBNF: a literal repeated into 2M elements", false, build(&t, "root ::= \"", "x", 1000, "\"{2000}\n"),
            KVLLM_ERANGE, "elements");

    /* deep input is refused, never recursed into */
    build(&t, "{\"type\":\"string\",\"pattern\":\"", "(", 100000, "a");
    add_times(&t, ")", 100000);
    add(&t, "\"}");
    refused("pattern of 100,000 nested groups", true, t.s, KVLLM_ERANGE, "nested deeper than");
    refused("a 100 KB property name", true,
            build(&t, "{\"type\":\"object\",\"properties\":{\"", "k", 100000, "\":{\"type\":\"string\"}}}"),
            KVLLM_EUNSUPPORTED, "longer than");

    free(t.s);
    gvocab_free(v);
    tvocab_free(&tv);
    return check_report("test_grammar_budget");
}
