/* bench_plot.c — bench rows into SVG charts (bench_plot.h). */
#include "bench_plot.h"
#include "cli.h"
#include "svg.h"

#include <json-c/json.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int plot_rows_add(struct plot_rows *r, const struct plot_row *row) {
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 64;
        struct plot_row *v = realloc(r->v, (size_t)cap * sizeof *v);
        if (!v) { cli_error("bench plot: out of memory"); return 1; }
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n++] = *row;
    return 0;
}

void plot_rows_free(struct plot_rows *r) {
    free(r->v);
    *r = (struct plot_rows){ 0 };
}

/* ---- reading ---- */

static bool has(json_object *o, const char *k) { return json_object_object_get_ex(o, k, NULL); }

static double num(json_object *o, const char *k, double dflt) {
    json_object *v;
    if (!json_object_object_get_ex(o, k, &v)) return dflt;
    return json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double) ? json_object_get_double(v)
                                                                                               : dflt;
}

static void str(json_object *o, const char *k, char *out, size_t cap) {
    json_object *v;
    const char *s = json_object_object_get_ex(o, k, &v) && json_object_is_type(v, json_type_string)
                  ? json_object_get_string(v) : "model";
    const char *base = strrchr(s, '/');
    snprintf(out, cap, "%s", base ? base + 1 : s);
}

/* One JSON object: a kvllm bench row, a llama-bench row, or a bench/vs-llamacpp row (two engines). */
static int read_object(struct plot_rows *r, json_object *o, const char *label, const char *path, int index) {
    struct plot_row row = { .batch = 1 };
    if (!json_object_is_type(o, json_type_object)) goto bad;
    if (has(o, "kvllm_tokens_per_s_median") && has(o, "llamacpp_tokens_per_s_median")) {
        str(o, "model", row.model, sizeof row.model);
        row.threads = (long)num(o, "threads", 0), row.pp = (long)num(o, "pp", 0), row.tg = (long)num(o, "tg", 0);
        row.depth = (long)num(o, "depth", 0), row.batch = (long)num(o, "batch", 1);
        snprintf(row.engine, sizeof row.engine, "kvllm");
        row.tps = num(o, "kvllm_tokens_per_s_median", NAN);
        if (plot_rows_add(r, &row)) return 1;
        snprintf(row.engine, sizeof row.engine, "%s", label ? label : "llama.cpp");
        row.tps = num(o, "llamacpp_tokens_per_s_median", NAN);
    } else if (has(o, "tokens_per_s_median")) {
        snprintf(row.engine, sizeof row.engine, "kvllm");
        str(o, "model", row.model, sizeof row.model);
        row.threads = (long)num(o, "threads", 0), row.pp = (long)num(o, "pp", 0), row.tg = (long)num(o, "tg", 0);
        row.depth = (long)num(o, "depth", 0), row.batch = (long)num(o, "batch", 1);
        row.tps = num(o, "tokens_per_s_median", NAN);
    } else if (has(o, "avg_ts")) {
        snprintf(row.engine, sizeof row.engine, "%s", label ? label : "llama.cpp");
        str(o, "model_filename", row.model, sizeof row.model);
        row.threads = (long)num(o, "n_threads", 0), row.pp = (long)num(o, "n_prompt", 0);
        row.tg = (long)num(o, "n_gen", 0), row.depth = (long)num(o, "n_depth", 0);
        row.tps = num(o, "avg_ts", NAN);
    } else {
        goto bad;
    }
    if (!(row.tps > 0) || (row.pp > 0) == (row.tg > 0)) goto bad;
    return plot_rows_add(r, &row);
bad:
    cli_error("%s: row %d is not a bench row (kvllm's tokens_per_s_median, llama-bench's avg_ts with n_prompt or "
              "n_gen, or bench/vs-llamacpp's two medians)", path, index + 1);
    return 1;
}

static int read_value(struct plot_rows *r, json_object *v, const char *label, const char *path, int *index) {
    json_object *rows;
    if (json_object_is_type(v, json_type_object) && json_object_object_get_ex(v, "rows", &rows)) v = rows;
    if (!json_object_is_type(v, json_type_array)) return read_object(r, v, label, path, (*index)++);
    for (size_t i = 0; i < json_object_array_length(v); i++)
        if (read_object(r, json_object_array_get_idx(v, i), label, path, (*index)++)) return 1;
    return 0;
}

int plot_rows_read(struct plot_rows *r, const char *path, const char *label) {
    size_t len;
    char *text = cli_read_file(path, &len);
    if (!text) return 1;
    int rc = 0, index = 0;
    json_object *whole = json_tokener_parse(text);
    if (whole) {
        rc = read_value(r, whole, label, path, &index);
        json_object_put(whole);
    } else {   /* JSON lines */
        int line = 0;
        for (char *save = NULL, *l = strtok_r(text, "\n", &save); l && !rc; l = strtok_r(NULL, "\n", &save)) {
            line++;
            if (strspn(l, " \t\r") == strlen(l)) continue;
            json_object *o = json_tokener_parse(l);
            if (!o) { cli_error("%s:%d: not JSON (a JSON document, or one object per line)", path, line); rc = 1; }
            else rc = read_value(r, o, label, path, &index);
            json_object_put(o);
        }
    }
    free(text);
    if (!rc && !r->n) { cli_error("%s: no bench rows", path); rc = 1; }
    return rc;
}

/* ---- charts ---- */

/* Which of a set of rows' fields take more than one value (series names carry only those). */
struct varies { bool engine, model, threads, test, depth, batch; };

static struct varies what_varies(const struct plot_rows *r, const int *idx, int n) {
    struct varies v = { 0 };
    for (int i = 1; i < n; i++) {
        const struct plot_row *a = &r->v[idx[0]], *b = &r->v[idx[i]];
        v.engine |= strcmp(a->engine, b->engine) != 0;
        v.model |= strcmp(a->model, b->model) != 0;
        v.threads |= a->threads != b->threads;
        v.test |= a->pp != b->pp || a->tg != b->tg;
        v.depth |= a->depth != b->depth;
        v.batch |= a->batch != b->batch;
    }
    return v;
}

static void row_name(const struct plot_row *w, struct varies v, bool engine, char *out, size_t cap) {
    int n = snprintf(out, cap, "%s", engine ? w->engine : "");
#define ADD(...) do { if (n >= 0 && (size_t)n < cap) n += snprintf(out + n, cap - (size_t)n, __VA_ARGS__); } while (0)
    if (v.model) ADD("%s%s", n ? " " : "", w->model);
    if (v.test) ADD("%s%s%ld", n ? " " : "", w->pp ? "pp" : "tg", w->pp ? w->pp : w->tg);
    if (v.threads) ADD("%st=%ld", n ? " " : "", w->threads);
    if (v.depth) ADD("%sd=%ld", n ? " " : "", w->depth);
    if (v.batch) ADD("%sb=%ld", n ? " " : "", w->batch);
#undef ADD
}

/* Same series: every field but the chart's x (by_batch: batch, else depth). */
static bool same_series(const struct plot_row *a, const struct plot_row *b, bool by_batch) {
    return !strcmp(a->engine, b->engine) && !strcmp(a->model, b->model) && a->threads == b->threads &&
           a->tg == b->tg && (by_batch ? a->depth == b->depth : a->batch == b->batch);
}

/* batch.svg (by_batch) or depth.svg: decode rows, a line per series that has two x values or more. */
static int line_chart(const struct plot_rows *r, const char *dir, bool by_batch) {
    int n = 0, *idx = malloc((size_t)(r->n ? r->n : 1) * sizeof *idx), *series = malloc((size_t)(r->n ? r->n : 1) * sizeof *series);
    double *xs = malloc((size_t)(r->n ? r->n : 1) * sizeof *xs), *ys = malloc((size_t)(r->n ? r->n : 1) * sizeof *ys);
    struct svg_series *s = malloc((size_t)(r->n ? r->n : 1) * sizeof *s);
    char (*names)[160] = malloc((size_t)(r->n ? r->n : 1) * sizeof *names);
    int rc = !idx || !series || !xs || !ys || !s || !names;
    if (rc) cli_error("bench plot: out of memory");
    for (int i = 0; !rc && i < r->n; i++)
        if (r->v[i].tg > 0 && (by_batch || r->v[i].batch == 1)) idx[n++] = i;
    /* a series per head (its first row); drawn when it has two x values or more */
    int n_heads = 0, kept = 0, n_pts = 0;
    struct varies v = what_varies(r, idx, n);
    if (by_batch) v.batch = false; else v.depth = false;
    for (int i = 0; !rc && i < n; i++) {
        bool seen = false;
        for (int k = 0; k < n_heads && !seen; k++) seen = same_series(&r->v[series[k]], &r->v[idx[i]], by_batch);
        if (seen) continue;
        series[n_heads++] = idx[i];
        int start = n_pts;   /* its points, x ascending (insertion sort: a handful of rows) */
        for (int j = i; j < n; j++) {
            const struct plot_row *w = &r->v[idx[j]];
            if (!same_series(w, &r->v[idx[i]], by_batch)) continue;
            double x = (double)(by_batch ? w->batch : w->depth);
            int at = n_pts++;
            while (at > start && xs[at - 1] > x) { xs[at] = xs[at - 1]; ys[at] = ys[at - 1]; at--; }
            xs[at] = x, ys[at] = w->tps;
        }
        if (xs[n_pts - 1] == xs[start]) { n_pts = start; continue; }
        row_name(&r->v[idx[i]], v, true, names[kept], sizeof names[kept]);
        s[kept] = (struct svg_series){ names[kept], n_pts - start, xs + start, ys + start };
        kept++;
    }
    if (!rc && kept) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, by_batch ? "batch.svg" : "depth.svg");
        struct svg_chart c = { by_batch ? "Decode throughput against batch size" : "Decode speed against context depth",
                               by_batch ? "sequences decoding together (--batch)" : "context already filled (--depth, tokens)",
                               "tokens/s", by_batch, NULL, 0 };
        rc = svg_write_lines(path, &c, s, kept);
        if (!rc) fprintf(stderr, "kvllm: wrote %s\n", path);
    }
    free(idx), free(series), free(xs), free(ys), free(s), free(names);
    return rc;
}

static bool same_test(const struct plot_row *a, const struct plot_row *b) {
    return !strcmp(a->model, b->model) && a->threads == b->threads && a->pp == b->pp && a->tg == b->tg &&
           a->depth == b->depth && a->batch == b->batch;
}

/* compare.svg: a group per test that two engines or more ran, a bar per engine. */
static int compare_chart(const struct plot_rows *r, const char *dir) {
    enum { MAX_ENGINES = 8, MAX_GROUPS = 64 };
    const char *engines[MAX_ENGINES];
    int n_eng = 0, heads[MAX_GROUPS], n_groups = 0;
    for (int i = 0; i < r->n && n_eng < MAX_ENGINES; i++) {
        bool seen = false;
        for (int e = 0; e < n_eng && !seen; e++) seen = !strcmp(engines[e], r->v[i].engine);
        if (!seen) engines[n_eng++] = r->v[i].engine;
    }
    if (n_eng < 2) return 0;
    for (int i = 0; i < r->n && n_groups < MAX_GROUPS; i++) {
        bool seen = false, other = false;
        for (int g = 0; g < n_groups && !seen; g++) seen = same_test(&r->v[heads[g]], &r->v[i]);
        for (int j = 0; j < r->n && !other; j++)
            other = same_test(&r->v[j], &r->v[i]) && strcmp(r->v[j].engine, r->v[i].engine);
        if (!seen && other) heads[n_groups++] = i;
    }
    if (!n_groups) return 0;
    int hidx[MAX_GROUPS];
    memcpy(hidx, heads, sizeof hidx);
    struct varies v = what_varies(r, hidx, n_groups);
    v.test = true;
    static char labels[MAX_GROUPS][160];
    const char *groups[MAX_GROUPS];
    double y[MAX_ENGINES][MAX_GROUPS];
    struct svg_series s[MAX_ENGINES];
    for (int g = 0; g < n_groups; g++) {
        row_name(&r->v[heads[g]], v, false, labels[g], sizeof labels[g]);
        groups[g] = labels[g];
    }
    for (int e = 0; e < n_eng; e++) {
        for (int g = 0; g < n_groups; g++) {
            y[e][g] = NAN;
            for (int j = 0; j < r->n; j++)
                if (!strcmp(r->v[j].engine, engines[e]) && same_test(&r->v[j], &r->v[heads[g]])) y[e][g] = r->v[j].tps;
        }
        s[e] = (struct svg_series){ engines[e], n_groups, NULL, y[e] };
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/compare.svg", dir);
    struct svg_chart c = { "Tokens per second, engine against engine", "test", "tokens/s", false, groups, n_groups };
    int rc = svg_write_bars(path, &c, s, n_eng);
    if (!rc) fprintf(stderr, "kvllm: wrote %s\n", path);
    return rc;
}

int plot_write(const struct plot_rows *r, const char *dir) {
    if (mkdir(dir, 0755) && errno != EEXIST) { cli_error("--svg %s: cannot create: %s", dir, strerror(errno)); return 1; }
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) { cli_error("--svg %s: not a folder", dir); return 1; }
    if (line_chart(r, dir, true) || line_chart(r, dir, false) || compare_chart(r, dir)) return 1;
    return 0;
}
