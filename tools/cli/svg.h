/* svg.h — line and bar charts written as SVG text, no library: the plots
 * `kvllm bench` writes beside its tables.  A chart is one file; each series
 * is a <g class="series" data-name="..."> holding its line or bars, each
 * point a mark with a <title> of its values (a browser shows it on hover).
 * The y axis starts at 0 (speeds compare by ratio); the x axis of a line
 * chart is linear or log2 (batch sizes, depths). */
#ifndef KVLLM_CLI_SVG_H
#define KVLLM_CLI_SVG_H

#include <stdbool.h>

struct svg_series {
    const char *name;
    int n;
    const double *x, *y;   /* lines: n points (x ascending); bars: y[group], n = n_groups, a NaN is no bar */
};

struct svg_chart {
    const char *title, *xlabel, *ylabel;
    bool log2_x;                  /* lines: x on a log2 scale (every x > 0) */
    const char *const *groups;    /* bars: the group labels along x */
    int n_groups;
};

/* Write the chart to path (replaced).  0, or 1 with the reason printed. */
int svg_write_lines(const char *path, const struct svg_chart *c, const struct svg_series *s, int n_series);
int svg_write_bars(const char *path, const struct svg_chart *c, const struct svg_series *s, int n_series);

#endif
