/* schema_number.c — integer and number bounds (minimum, maximum and their
 * exclusive forms) as rules over decimal digits.
 *
 * An integer range is written as alternatives of same-length digit ranges
 * ([a, b] with a and b of d digits each), so every accepted text is the
 * canonical decimal (no leading zeros) of a value inside the bounds.  A
 * number's bounds must be integers: the integer part is then ranged the
 * same way and the fraction is free except at the bounds themselves (and
 * no exponent is allowed). */
#include "grammar/schema_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- integer ranges ---- */

/* Decimal strings (no leading zeros) of [a, b], a and b with the same number
 * of digits, as a GBNF expression. */
static void range_same_len(struct strbuf *o, const char *a, const char *b, size_t n) {
    if (n == 0) return;
    if (n == 1) {
        if (a[0] == b[0]) sb_printf(o, "[%c]", a[0]);
        else sb_printf(o, "[%c-%c]", a[0], b[0]);
        return;
    }
    if (a[0] == b[0]) {
        sb_printf(o, "[%c] (", a[0]);
        range_same_len(o, a + 1, b + 1, n - 1);
        sb_puts(o, ")");
        return;
    }
    bool a_zeros = true, b_nines = true;
    for (size_t i = 1; i < n; i++) {
        a_zeros &= a[i] == '0';
        b_nines &= b[i] == '9';
    }
    char lo = a[0], hi = b[0];
    bool first = true;
    if (!a_zeros) {
        char nines[32];
        memset(nines, '9', n - 1);
        sb_printf(o, "[%c] (", a[0]);
        range_same_len(o, a + 1, nines, n - 1);
        sb_puts(o, ")");
        lo++;
        first = false;
    }
    char mid_hi = b_nines ? hi : (char)(hi - 1);
    if (lo <= mid_hi) {
        sb_printf(o, "%s[%c-%c] [0-9]{%zu}", first ? "" : " | ", lo, mid_hi, n - 1);
        first = false;
    }
    if (!b_nines) {
        char zeros[32];
        memset(zeros, '0', n - 1);
        sb_printf(o, "%s[%c] (", first ? "" : " | ", hi);
        range_same_len(o, zeros, b + 1, n - 1);
        sb_puts(o, ")");
    }
}

/* Non-negative integers lo..hi (hi < 0: up to JS_INT_DIGITS digits), canonical decimal. */
static void range_nonneg(struct strbuf *o, long long lo, long long hi) {
    long long cap = 9999999999999999LL;   /* JS_INT_DIGITS nines */
    if (hi < 0 || hi > cap) hi = cap;
    bool first = true;
    long long p10 = 1;
    for (int d = 1; d <= JS_INT_DIGITS; d++, p10 *= 10) {
        long long dlo = d == 1 ? 0 : p10, dhi = p10 * 10 - 1;
        if (dlo < lo) dlo = lo;
        if (dhi > hi) dhi = hi;
        if (dlo > dhi) continue;
        char a[32], b[32];
        snprintf(a, sizeof a, "%lld", dlo);
        snprintf(b, sizeof b, "%lld", dhi);
        sb_puts(o, first ? "(" : " | (");
        range_same_len(o, a, b, strlen(a));
        sb_puts(o, ")");
        first = false;
    }
    if (first) sb_puts(o, "[^\\x00-\\U0010FFFF]");   /* empty range: matches nothing */
}

/* Integers in [lo, hi]; has_lo / has_hi false: unbounded on that side. */
static void range_int(struct strbuf *o, bool has_lo, long long lo, bool has_hi, long long hi) {
    bool first = true;
    if (!has_lo || lo < 0) {   /* negative part: "-" magnitude in [max(1, -hi), -lo] */
        long long mlo = has_hi && hi < 0 ? -hi : 1, mhi = has_lo ? -lo : -1;
        sb_puts(o, "\"-\" (");
        range_nonneg(o, mlo, mhi);
        sb_puts(o, ")");
        first = false;
    }
    if (!has_hi || hi >= 0) {
        sb_puts(o, first ? "(" : " | (");
        range_nonneg(o, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
        sb_puts(o, ")");
    }
}

/* ---- bounds ---- */

/* A bound: minimum/maximum/exclusiveMinimum/exclusiveMaximum (numbers, draft 6+). */
static bool get_bound(struct schema_ctx *c, json_object *s, const char *key, double *v, const char *path) {
    json_object *x;
    if (!json_object_object_get_ex(s, key, &x)) return false;
    if (!json_object_is_type(x, json_type_int) && !json_object_is_type(x, json_type_double)) {
        schema_fail(c, KVLLM_EUNSUPPORTED, path, "'%s' must be a number (draft-4 boolean form not supported)", key);
        return false;
    }
    *v = json_object_get_double(x);
    if (fabs(*v) > 9e15) {
        schema_fail(c, KVLLM_EUNSUPPORTED, path, "'%s' beyond +-9e15", key);
        return false;
    }
    return true;
}

/* The four bound keywords of s; false when s has none (or one is malformed: c->rc set). */
struct bounds {
    double mn, mx, emn, emx;
    bool has_mn, has_mx, has_emn, has_emx;
};

static bool get_bounds(struct schema_ctx *c, json_object *s, struct bounds *b, const char *path) {
    b->has_mn = get_bound(c, s, "minimum", &b->mn, path);
    b->has_mx = get_bound(c, s, "maximum", &b->mx, path);
    b->has_emn = get_bound(c, s, "exclusiveMinimum", &b->emn, path);
    b->has_emx = get_bound(c, s, "exclusiveMaximum", &b->emx, path);
    return !c->rc && (b->has_mn || b->has_mx || b->has_emn || b->has_emx);
}

/* ---- integer ---- */

const char *schema_integer_rule(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen) {
    struct bounds bd;
    if (!get_bounds(c, s, &bd, path)) return c->rc ? NULL : schema_prim(c, "integer");
    long long lo = 0, hi = 0;
    bool has_lo = false, has_hi = false;
    if (bd.has_mn) { lo = (long long)ceil(bd.mn); has_lo = true; }
    if (bd.has_emn) { long long l = (long long)floor(bd.emn) + 1; if (!has_lo || l > lo) lo = l; has_lo = true; }
    if (bd.has_mx) { hi = (long long)floor(bd.mx); has_hi = true; }
    if (bd.has_emx) { long long h = (long long)ceil(bd.emx) - 1; if (!has_hi || h < hi) hi = h; has_hi = true; }
    if (has_lo && has_hi && lo > hi) { schema_fail(c, KVLLM_EINVAL, path, "no integer within the bounds"); return NULL; }
    schema_prim(c, "space");
    struct strbuf b = { 0 };
    sb_puts(&b, "(");
    range_int(&b, has_lo, lo, has_hi, hi);
    sb_puts(&b, ") space");
    const char *name = b.oom ? NULL : schema_rule_add(c, hint, b.s);
    sb_free(&b);
    return name;
}

/* ---- number ---- */

/* Non-negative decimals (no exponent) with integer part in a range: value in
 * [L, H] with exclusive flags, L, H integers >= 0 (H < 0: unbounded). */
static void decimal_nonneg(struct strbuf *o, long long L, bool lx, long long H, bool hx) {
    const char *frac = "(\".\" decimal-part)?", *frac_nz = "\".\" [0-9]{0,15} [1-9] [0-9]{0,15}",
               *frac_zero = "(\".\" \"0\"{1,16})?";
    bool first = true;
#define ALT() (sb_puts(o, first ? "" : " | "), first = false)
    if (H >= 0 && L == H) {
        if (!lx && !hx) { ALT(); sb_printf(o, "\"%lld\" %s", L, frac_zero); }
        if (first) sb_puts(o, "[^\\x00-\\U0010FFFF]");
        return;
    }
    /* integer part L */
    ALT();
    sb_printf(o, "\"%lld\" %s", L, lx ? frac_nz : frac);
    /* integer parts L+1 .. H-1 (or unbounded) */
    if (H < 0 || L + 1 <= H - 1) {
        ALT();
        sb_puts(o, "(");
        range_nonneg(o, L + 1, H < 0 ? -1 : H - 1);
        sb_printf(o, ") %s", frac);
    }
    if (H >= 0 && !hx) { ALT(); sb_printf(o, "\"%lld\" %s", H, frac_zero); }
#undef ALT
}

const char *schema_number_rule(struct schema_ctx *c, json_object *s, const char *hint, char *path, size_t plen) {
    struct bounds bd;
    if (!get_bounds(c, s, &bd, path)) return c->rc ? NULL : schema_prim(c, "number");
    /* the tighter of inclusive/exclusive per side */
    bool has_lo = bd.has_mn || bd.has_emn, has_hi = bd.has_mx || bd.has_emx, lx = false, hx = false;
    double lo = 0, hi = 0;
    if (bd.has_mn) lo = bd.mn;
    if (bd.has_emn && (!bd.has_mn || bd.emn >= bd.mn)) { lo = bd.emn; lx = true; }
    if (bd.has_mx) hi = bd.mx;
    if (bd.has_emx && (!bd.has_mx || bd.emx <= bd.mx)) { hi = bd.emx; hx = true; }
    if ((has_lo && lo != floor(lo)) || (has_hi && hi != floor(hi))) {
        schema_fail(c, KVLLM_EUNSUPPORTED, path, "number bounds that are not integers");
        return NULL;
    }
    if (has_lo && has_hi && (lo > hi || (lo == hi && (lx || hx)))) {
        schema_fail(c, KVLLM_EINVAL, path, "no number within the bounds");
        return NULL;
    }
    schema_prim(c, "space");
    schema_prim(c, "decimal-part");
    struct strbuf b = { 0 };
    sb_puts(&b, "(");
    long long L = (long long)lo, H = (long long)hi;
    bool negative = !has_lo || L < 0;
    if (negative) {
        /* negative values -m: m in (max(0, -H), -L] (m > 0 strictly: zero is the non-negative part's) */
        long long mlo = has_hi && H < 0 ? -H : 0;
        bool mlx = !(has_hi && H < 0) || hx;   /* m > mlo, unless the bound -H itself is included */
        long long mhi = has_lo ? -L : -1;
        sb_puts(&b, "\"-\" (");
        decimal_nonneg(&b, mlo, mlx, mhi, lx);
        sb_puts(&b, ")");
    }
    if (!(has_hi && H < 0)) {
        sb_puts(&b, negative ? " | (" : "(");
        decimal_nonneg(&b, has_lo && L > 0 ? L : 0, has_lo && L >= 0 ? lx : false, has_hi ? H : -1, hx);
        sb_puts(&b, ")");
    }
    sb_puts(&b, ") space");
    const char *name = b.oom ? NULL : schema_rule_add(c, hint, b.s);
    sb_free(&b);
    return name;
}
