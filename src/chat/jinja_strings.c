/* jinja_strings.c — the Python str methods templates use (case mapping,
 * strip, split, splitlines, replace, find, count), over UTF-8 strings with
 * Python's notion of characters (code points) and whitespace. */
#include "chat/jinja.h"
#include "kvllm.h"

#include <string.h>

/* ---- case ---- */

/* Scripts with case that the tables below do not cover. */
static bool case_unsupported(uint32_t cp) {
    static const uint32_t ranges[][2] = {
        { 0x0180, 0x02af }, { 0x0345, 0x0345 }, { 0x0370, 0x03ff }, { 0x0460, 0x052f }, { 0x0531, 0x058f },
        { 0x10a0, 0x10ff }, { 0x13a0, 0x13ff }, { 0x1c80, 0x1cbf }, { 0x1d00, 0x1dbf }, { 0x1e00, 0x1fff },
        { 0x2126, 0x2126 }, { 0x212a, 0x212b }, { 0x2132, 0x2132 }, { 0x214e, 0x214e }, { 0x2160, 0x2188 },
        { 0x24b6, 0x24e9 }, { 0x2c00, 0x2d2f }, { 0xa640, 0xa69f }, { 0xa722, 0xa7ff }, { 0xab30, 0xabbf },
        { 0xfb00, 0xfb17 }, { 0xff21, 0xff3a }, { 0xff41, 0xff5a }, { 0x10400, 0x1044f }, { 0x104b0, 0x104ff },
        { 0x10570, 0x105bf }, { 0x10c80, 0x10cff }, { 0x118a0, 0x118ff }, { 0x16e40, 0x16e9f },
        { 0x1e900, 0x1e95f },
    };
    if (cp < 0x180) return false;
    for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++)
        if (cp >= ranges[i][0] && cp <= ranges[i][1]) return true;
    return false;
}

/* Latin Extended-A pairs: the upper-case partner (or 0). */
static bool exta_is_upper(uint32_t cp) {
    if ((cp <= 0x12f) || (cp >= 0x132 && cp <= 0x137) || (cp >= 0x14a && cp <= 0x177)) return !(cp & 1);
    if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17e)) return cp & 1;
    return cp == 0x130 || cp == 0x178;
}

static bool cp_is_upper(uint32_t cp) {
    if (cp < 0x80) return cp >= 'A' && cp <= 'Z';
    if (cp < 0x100) return cp >= 0xc0 && cp <= 0xde && cp != 0xd7;
    if (cp < 0x180) return exta_is_upper(cp);
    return cp >= 0x400 && cp <= 0x42f;
}

static bool cp_is_lower(uint32_t cp) {
    if (cp < 0x80) return cp >= 'a' && cp <= 'z';
    if (cp < 0x100) return (cp >= 0xdf && cp != 0xf7) || cp == 0xb5 || cp == 0xaa || cp == 0xba;
    if (cp < 0x180) return !exta_is_upper(cp);
    return cp >= 0x430 && cp <= 0x45f;
}

/* Map one character (mode: JCASE_LOWER, JCASE_UPPER or JCASE_TITLE for
 * title case); writes 1 or 2 code points. */
static int map_cp(uint32_t cp, enum jcase mode, uint32_t out[2]) {
    out[0] = cp;
    bool up = mode != JCASE_LOWER;
    if (cp < 0x80) {
        if (up && cp >= 'a' && cp <= 'z') out[0] = cp - 32;
        if (!up && cp >= 'A' && cp <= 'Z') out[0] = cp + 32;
        return 1;
    }
    if (cp < 0x100) {
        if (cp == 0xdf && up) { out[0] = 'S'; out[1] = mode == JCASE_TITLE ? 's' : 'S'; return 2; }
        if (cp == 0xff && up) out[0] = 0x178;
        else if (cp == 0xb5 && up) out[0] = 0x39c;
        else if (up && cp >= 0xe0 && cp <= 0xfe && cp != 0xf7) out[0] = cp - 32;
        else if (!up && cp >= 0xc0 && cp <= 0xde && cp != 0xd7) out[0] = cp + 32;
        return 1;
    }
    if (cp < 0x180) {
        switch (cp) {
        case 0x130: if (!up) { out[0] = 'i'; out[1] = 0x307; return 2; } return 1;
        case 0x131: if (up) out[0] = 'I'; return 1;
        case 0x138: return 1;
        case 0x149: if (up) { out[0] = 0x2bc; out[1] = 'N'; return 2; } return 1;
        case 0x178: if (!up) out[0] = 0xff; return 1;
        case 0x17f: if (up) out[0] = 'S'; return 1;
        default: break;
        }
        bool is_up = exta_is_upper(cp);
        bool odd_upper = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17e);
        if (up && !is_up) out[0] = odd_upper ? cp - 1 : cp & ~1u;
        if (!up && is_up) out[0] = odd_upper ? cp + 1 : cp | 1u;
        return 1;
    }
    if (cp >= 0x400 && cp <= 0x45f) {
        if (up && cp >= 0x450) out[0] = cp - 0x50;
        else if (up && cp >= 0x430) out[0] = cp - 0x20;
        else if (!up && cp < 0x410) out[0] = cp + 0x50;
        else if (!up && cp < 0x430) out[0] = cp + 0x20;
    }
    return 1;
}

static void put_mapped(struct jctx *c, struct jbuf *b, uint32_t cp, enum jcase mode) {
    uint32_t m[2];
    int k = map_cp(cp, mode, m);
    for (int i = 0; i < k; i++) utf8_put(c, b, m[i]);
}

static bool is_title_sep(uint32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_isspace(cp);
}

struct jstr pystr_case(struct jctx *c, uint32_t pos, struct jstr s, enum jcase mode) {
    struct jbuf b = { 0 };
    bool prev = false;   /* TITLE: previous was cased; JTITLE: previous was a separator */
    if (mode == JCASE_JTITLE) prev = true;
    size_t idx = 0;
    for (size_t i = 0; i < s.n; idx++) {
        size_t start = i;
        uint32_t cp = utf8_next(s.p, s.n, &i);
        if (case_unsupported(cp))
            jfail(c, pos, KVLLM_EUNSUPPORTED, "case mapping of U+%04X is not supported", (unsigned)cp);
        if (cp >= 0xdc80 && cp <= 0xdcff && i == start + 1) { jb_putc(c, &b, s.p[start]); continue; }
        switch (mode) {
        case JCASE_LOWER: case JCASE_UPPER: put_mapped(c, &b, cp, mode); break;
        case JCASE_TITLE:
            put_mapped(c, &b, cp, prev ? JCASE_LOWER : JCASE_TITLE);
            prev = cp_is_upper(cp) || cp_is_lower(cp);
            break;
        case JCASE_CAPITALIZE: put_mapped(c, &b, cp, idx == 0 ? JCASE_TITLE : JCASE_LOWER); break;
        case JCASE_JTITLE: {
            bool sep = is_title_sep(cp);
            put_mapped(c, &b, cp, sep ? JCASE_LOWER : prev ? JCASE_UPPER : JCASE_LOWER);
            prev = sep;
            break;
        }
        }
    }
    return jb_str(&b);
}

bool pystr_is_case(struct jctx *c, uint32_t pos, struct jstr s, bool upper) {
    bool cased = false;
    for (size_t i = 0; i < s.n;) {
        uint32_t cp = utf8_next(s.p, s.n, &i);
        if (case_unsupported(cp))
            jfail(c, pos, KVLLM_EUNSUPPORTED, "case test of U+%04X is not supported", (unsigned)cp);
        if (upper ? cp_is_lower(cp) : cp_is_upper(cp)) return false;
        cased |= cp_is_upper(cp) || cp_is_lower(cp);
    }
    return cased;
}

/* ---- strip, split ---- */

static bool in_set(uint32_t cp, const struct jstr *chars) {
    if (!chars) return py_isspace(cp);
    for (size_t i = 0; i < chars->n;)
        if (utf8_next(chars->p, chars->n, &i) == cp) return true;
    return false;
}

struct jstr pystr_strip(struct jstr s, const struct jstr *chars, bool left, bool right) {
    size_t lo = 0, hi = s.n;
    if (left)
        while (lo < hi) {
            size_t i = lo;
            if (!in_set(utf8_next(s.p, s.n, &i), chars)) break;
            lo = i;
        }
    if (right) {
        /* the end of the last character not in the set */
        size_t keep = lo;
        for (size_t i = lo; i < hi;)
            if (!in_set(utf8_next(s.p, hi, &i), chars)) keep = i;
        hi = keep;
    }
    return (struct jstr){ s.p + lo, hi - lo, NULL };
}

static void push_str(struct jctx *c, struct jv list, const char *p, size_t n) {
    jlist_push(c, list.u.l, jv_str((struct jstr){ p, n, NULL }));
}

/* Byte offsets of each character start, plus s.n at the end. */
static size_t *char_offsets(struct jctx *c, struct jstr s, size_t *n_chars) {
    size_t n = utf8_count(s), k = 0;
    size_t *off = jalloc_array(c, n + 1, sizeof *off);
    for (size_t i = 0; i < s.n; k++) {
        off[k] = i;
        utf8_next(s.p, s.n, &i);
    }
    off[n] = s.n;
    *n_chars = n;
    return off;
}

static struct jv split_ws(struct jctx *c, struct jstr s, int64_t maxsplit, bool right) {
    struct jv list = jv_list(c, JL_LIST, 0);
    size_t n;
    size_t *off = char_offsets(c, s, &n);
    bool *ws = jalloc_array(c, n + 1, sizeof *ws);
    for (size_t k = 0; k < n; k++) {
        size_t i = off[k];
        ws[k] = py_isspace(utf8_next(s.p, s.n, &i));
    }
    /* words as [start, end) character ranges */
    size_t *ws_start = jalloc_array(c, n + 1, sizeof *ws_start), *ws_end = jalloc_array(c, n + 1, sizeof *ws_end);
    size_t nw = 0;
    int64_t splits = 0;
    if (!right) {
        size_t k = 0;
        while (k < n) {
            while (k < n && ws[k]) k++;
            if (k == n) break;
            if (maxsplit >= 0 && splits == maxsplit) {   /* the rest, trailing whitespace kept */
                ws_start[nw] = k; ws_end[nw++] = n;
                break;
            }
            size_t st = k;
            while (k < n && !ws[k]) k++;
            ws_start[nw] = st; ws_end[nw++] = k;
            splits++;
        }
        for (size_t w = 0; w < nw; w++) push_str(c, list, s.p + off[ws_start[w]], off[ws_end[w]] - off[ws_start[w]]);
        return list;
    }
    size_t k = n;
    while (k > 0) {
        while (k > 0 && ws[k - 1]) k--;
        if (k == 0) break;
        if (maxsplit >= 0 && splits == maxsplit) { ws_start[nw] = 0; ws_end[nw++] = k; break; }
        size_t en = k;
        while (k > 0 && !ws[k - 1]) k--;
        ws_start[nw] = k; ws_end[nw++] = en;
        splits++;
    }
    for (size_t w = nw; w-- > 0;) push_str(c, list, s.p + off[ws_start[w]], off[ws_end[w]] - off[ws_start[w]]);
    return list;
}

struct jv pystr_split(struct jctx *c, uint32_t pos, struct jstr s, const struct jstr *sep, int64_t maxsplit,
                      bool right) {
    if (!sep) return split_ws(c, s, maxsplit, right);
    if (!sep->n) jfail(c, pos, KVLLM_EINVAL, "empty separator");
    struct jv list = jv_list(c, JL_LIST, 0);
    int64_t splits = 0;
    if (!right) {
        size_t start = 0;
        for (;;) {
            const char *hit = maxsplit >= 0 && splits == maxsplit ? NULL
                              : memmem(s.p + start, s.n - start, sep->p, sep->n);
            if (!hit) break;
            push_str(c, list, s.p + start, (size_t)(hit - s.p) - start);
            start = (size_t)(hit - s.p) + sep->n;
            splits++;
        }
        push_str(c, list, s.p + start, s.n - start);
        return list;
    }
    /* rsplit: collect pieces from the right, then reverse */
    struct jv rev = jv_list(c, JL_LIST, 0);
    size_t end = s.n;
    while (!(maxsplit >= 0 && splits == maxsplit) && end >= sep->n) {
        size_t at = end - sep->n, found = SIZE_MAX;
        for (size_t i = at + 1; i-- > 0;)
            if (memcmp(s.p + i, sep->p, sep->n) == 0) { found = i; break; }
        if (found == SIZE_MAX) break;
        push_str(c, rev, s.p + found + sep->n, end - found - sep->n);
        end = found;
        splits++;
    }
    push_str(c, rev, s.p, end);
    for (size_t i = rev.u.l->n; i-- > 0;) jlist_push(c, list.u.l, rev.u.l->v[i]);
    return list;
}

static bool is_line_break(uint32_t cp) {
    return cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

struct jv pystr_splitlines(struct jctx *c, struct jstr s, bool keepends) {
    struct jv list = jv_list(c, JL_LIST, 0);
    size_t start = 0, i = 0;
    while (i < s.n) {
        size_t at = i;
        uint32_t cp = utf8_next(s.p, s.n, &i);
        if (!is_line_break(cp)) continue;
        if (cp == '\r' && i < s.n && s.p[i] == '\n') i++;
        push_str(c, list, s.p + start, (keepends ? i : at) - start);
        start = i;
    }
    if (start < s.n) push_str(c, list, s.p + start, s.n - start);
    return list;
}

struct jstr pystr_replace(struct jctx *c, struct jstr s, struct jstr old, struct jstr rep, int64_t count) {
    struct jbuf b = { 0 };
    int64_t done = 0;
    if (!old.n) {   /* insert rep before every character and at the end */
        for (size_t i = 0; i < s.n;) {
            if (count < 0 || done < count) { jb_put(c, &b, rep.p, rep.n); done++; }
            size_t start = i;
            utf8_next(s.p, s.n, &i);
            jb_put(c, &b, s.p + start, i - start);
        }
        if (count < 0 || done < count) jb_put(c, &b, rep.p, rep.n);
        return jb_str(&b);
    }
    size_t start = 0;
    for (;;) {
        const char *hit = count >= 0 && done >= count ? NULL : memmem(s.p + start, s.n - start, old.p, old.n);
        if (!hit) break;
        jb_put(c, &b, s.p + start, (size_t)(hit - s.p) - start);
        jb_put(c, &b, rep.p, rep.n);
        start = (size_t)(hit - s.p) + old.n;
        done++;
    }
    jb_put(c, &b, s.p + start, s.n - start);
    return jb_str(&b);
}

int64_t pystr_find(struct jstr s, struct jstr sub, bool last) {
    if (sub.n > s.n) return -1;
    size_t found = SIZE_MAX;
    if (!last) {
        const char *hit = sub.n ? memmem(s.p, s.n, sub.p, sub.n) : s.p;
        if (hit) found = (size_t)(hit - s.p);
    } else {
        for (size_t i = s.n - sub.n + 1; i-- > 0;)
            if (!sub.n || memcmp(s.p + i, sub.p, sub.n) == 0) { found = i; break; }
    }
    if (found == SIZE_MAX) return -1;
    return (int64_t)utf8_count((struct jstr){ s.p, found, NULL });
}

int64_t pystr_count(struct jstr s, struct jstr sub) {
    if (!sub.n) return (int64_t)utf8_count(s) + 1;
    int64_t n = 0;
    for (size_t start = 0;;) {
        const char *hit = memmem(s.p + start, s.n - start, sub.p, sub.n);
        if (!hit) return n;
        n++;
        start = (size_t)(hit - s.p) + sub.n;
    }
}
