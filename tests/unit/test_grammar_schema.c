/* test_grammar_schema.c — the JSON Schema compiler's numeric bounds and
 * lengths against plain arithmetic: for many (minimum, maximum,
 * exclusive) combinations, every integer in a window around the bounds (and
 * decimals for numbers) is accepted exactly when it lies within them.  The
 * digit-range rules are the one intricate part of the compiler; the rest is
 * covered by tests/python/test_grammar_schemas.py against jsonschema. */
#include "check.h"
#include "grammar_util.h"
#include "core/core.h"

#include <math.h>
#include <string.h>

/* Is s a complete string?  One matcher per grammar, rolled back after each string (they are short). */
static int accepts_m(struct gmatcher *m, const char *s) {
    int n = 0, ok = 1;
    for (const char *p = s; *p && ok; p++) {
        ok = gmatcher_accept(m, (unsigned char)*p) == 0;
        n += ok;
    }
    ok = ok && gmatcher_can_end(m);
    CHECK(n <= GMATCHER_HISTORY && gmatcher_rollback(m, n) == 0);
    return ok;
}

static int accepts(const struct kvllm_grammar *g, const struct gvocab *v, const char *s) {
    struct gmatcher *m;
    if (gmatcher_new(g, v, &m)) return -1;
    int ok = accepts_m(m, s);
    gmatcher_free(m);
    return ok;
}

static struct kvllm_grammar *compile(const char *schema) {
    struct kvllm_grammar *g = NULL;
    char err[256];
    int rc = kvllm_grammar_from_json_schema(schema, false, &g, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: %s", schema, err);
    return g;
}

/* kind: "integer" or "number"; has_*: which keywords appear. */
static void check_bounds(const struct gvocab *v, const char *kind, bool has_lo, long lo, bool lx, bool has_hi, long hi,
                         bool hx) {
    char schema[256];
    int n = snprintf(schema, sizeof schema, "{\"type\": \"%s\"", kind);
    if (has_lo) n += snprintf(schema + n, sizeof schema - (size_t)n, ", \"%s\": %ld", lx ? "exclusiveMinimum" : "minimum", lo);
    if (has_hi) n += snprintf(schema + n, sizeof schema - (size_t)n, ", \"%s\": %ld", hx ? "exclusiveMaximum" : "maximum", hi);
    snprintf(schema + n, sizeof schema - (size_t)n, "}");
    struct kvllm_grammar *g = compile(schema);
    if (!g) return;
    bool number = !strcmp(kind, "number");
    struct gmatcher *m;
    CHECK(gmatcher_new(g, v, &m) == 0);
    long c_lo = has_lo ? lo : (has_hi ? hi : 0), c_hi = has_hi ? hi : c_lo;
    int bad = 0;
    for (long x = c_lo - 130; x <= c_hi + 130 && bad < 5; x++) {
        for (int f = 0; f < (number ? 4 : 1); f++) {
            /* f: integer text, x.0, x.5 (x + 0.5, written for x >= 0 and as -(|x|).5 for x < 0), x.05 */
            static const char *const frac[] = { "", ".0", ".5", ".05" };
            char text[64];
            double val;
            if (f == 0 || f == 1) { snprintf(text, sizeof text, "%ld%s", x, frac[f]); val = (double)x; }
            else if (x >= 0) { snprintf(text, sizeof text, "%ld%s", x, frac[f]); val = (double)x + (f == 2 ? 0.5 : 0.05); }
            else { snprintf(text, sizeof text, "-%ld%s", -x, frac[f]); val = (double)x - (f == 2 ? 0.5 : 0.05); }
            bool want = (!has_lo || (lx ? val > (double)lo : val >= (double)lo)) &&
                        (!has_hi || (hx ? val < (double)hi : val <= (double)hi));
            int got = accepts_m(m, text);
            if (got != want) bad++;
            CHECK_MSG(got == want, "%s: '%s' got %d want %d", schema, text, got, want);
        }
    }
    /* a few far values */
    static const char *const far[] = { "123456789012", "-123456789012", "0", "-0" };
    for (size_t i = 0; i < sizeof far / sizeof *far; i++) {
        double val = atof(far[i]);
        if (!strcmp(far[i], "-0")) continue;   /* "-0" is refused by the negative branch (documented) */
        bool want = (!has_lo || (lx ? val > (double)lo : val >= (double)lo)) &&
                    (!has_hi || (hx ? val < (double)hi : val <= (double)hi));
        CHECK_MSG(accepts_m(m, far[i]) == want, "%s: '%s' want %d", schema, far[i], want);
    }
    gmatcher_free(m);
    kvllm_grammar_free(g);
}

static void test_lengths(const struct gvocab *v) {
    struct kvllm_grammar *g = compile("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 2, \"maxItems\": 5}");
    if (!g) return;
    for (int n = 0; n <= 8; n++) {
        char text[64] = "[";
        for (int i = 0; i < n; i++) strcat(text, i ? ", 1" : "1");
        strcat(text, "]");
        CHECK_MSG(accepts(g, v, text) == (n >= 2 && n <= 5), "%s", text);
    }
    kvllm_grammar_free(g);
    g = compile("{\"type\": \"string\", \"minLength\": 1, \"maxLength\": 4}");
    if (!g) return;
    for (int n = 0; n <= 7; n++) {
        char text[64] = "\"";
        for (int i = 0; i < n; i++) strcat(text, i % 2 ? "\xc3\xa9" : "\\n");   /* é or an escape: one character each */
        strcat(text, "\"");
        CHECK_MSG(accepts(g, v, text) == (n >= 1 && n <= 4), "%s", text);
    }
    kvllm_grammar_free(g);
}

int main(void) {
    struct tvocab syn;
    tvocab_synthetic(&syn);
    struct gvocab *v;
    CHECK(tvocab_index(&syn, &v) == 0);
    static const long pts[] = { -1234, -100, -15, -10, -9, -1, 0, 1, 7, 9, 10, 11, 99, 100, 250, 1000, 4321 };
    const int np = (int)(sizeof pts / sizeof *pts);
    struct rng r;
    rng_seed(&r, 5);
    for (int k = 0; k < 60; k++) {
        long a = pts[rng_u64(&r) % (uint64_t)np], b = pts[rng_u64(&r) % (uint64_t)np];
        if (a > b) { long t = a; a = b; b = t; }
        int shape = (int)(rng_u64(&r) % 3);   /* both bounds, min only, max only */
        bool lx = rng_u64(&r) & 1, hx = rng_u64(&r) & 1;
        if (shape == 0 && a == b && (lx || hx)) continue;   /* empty: refused, tested below */
        const char *kind = k % 2 ? "number" : "integer";
        if (!strcmp(kind, "integer") && shape == 0 && (lx ? a + 1 : a) > (hx ? b - 1 : b)) continue;
        check_bounds(v, kind, shape != 2, a, lx, shape != 1, b, hx);
    }
    /* bounds with nothing inside are an error, not a grammar that matches nothing */
    struct kvllm_grammar *g = NULL;
    CHECK(kvllm_grammar_from_json_schema("{\"type\": \"integer\", \"minimum\": 5, \"maximum\": 4}", false, &g, NULL, 0) ==
          KVLLM_EINVAL);
    CHECK(kvllm_grammar_from_json_schema("{\"type\": \"number\", \"exclusiveMinimum\": 3, \"maximum\": 3}", false, &g, NULL,
                                         0) == KVLLM_EINVAL);
    CHECK(kvllm_grammar_from_json_schema("{\"type\": \"number\", \"minimum\": 0.5}", false, &g, NULL, 0) ==
          KVLLM_EUNSUPPORTED);
    /* a null among the type names is refused (it once reached strcmp as a NULL name) */
    char err[256];
    CHECK(kvllm_grammar_from_json_schema("{\"type\": [\"string\", null]}", false, &g, err, sizeof err) == KVLLM_EINVAL);
    CHECK_MSG(strstr(err, "'type' must be a string or an array of strings") != NULL, "%s", err);
    test_lengths(v);
    gvocab_free(v);
    tvocab_free(&syn);
    return check_report("test_grammar_schema");
}
