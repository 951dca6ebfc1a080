/* svg.c — line and bar charts as SVG text (svg.h). */
#include "svg.h"
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* the plot area inside a W x H picture; the legend sits right of it */
enum { W = 760, H = 440, LEFT = 72, RIGHT = 560, TOP = 44, BOTTOM = 380 };

static const char *const k_colors[] = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                        "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf" };
#define N_COLORS (sizeof k_colors / sizeof *k_colors)

/* Text with XML's five special characters escaped. */
static void xml_text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);   /* control bytes are not XML */
        }
    }
}

/* A round step (1, 2 or 5 times a power of ten) giving about 5 ticks up to max. */
static double tick_step(double max) {
    double raw = max / 5, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

static FILE *begin(const char *path, const struct svg_chart *c, double ymax, double *ytop) {
    FILE *f = fopen(path, "w");
    if (!f) { cli_error("%s: cannot write: %s", path, strerror(errno)); return NULL; }
    double step = tick_step(ymax > 0 ? ymax : 1);
    *ytop = step * ceil((ymax > 0 ? ymax : 1) * 1.05 / step);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H, W, H);
    fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"15\" font-weight=\"bold\">", LEFT);
    xml_text(f, c->title);
    fprintf(f, "</text>\n<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", (LEFT + RIGHT) / 2, BOTTOM + 40);
    xml_text(f, c->xlabel);
    fprintf(f, "</text>\n<text x=\"16\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 16 %d)\">",
            (TOP + BOTTOM) / 2, (TOP + BOTTOM) / 2);
    xml_text(f, c->ylabel);
    fprintf(f, "</text>\n<g class=\"y-axis\" stroke=\"#ddd\">\n");
    for (double v = 0; v <= *ytop * (1 + 1e-9); v += step) {
        double y = BOTTOM - (BOTTOM - TOP) * v / *ytop;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>"
                   "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" stroke=\"none\" fill=\"black\">%g</text>\n",
                LEFT, y, RIGHT, y, LEFT - 6, y + 4, v);
    }
    fprintf(f, "</g>\n<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", LEFT, BOTTOM, RIGHT, BOTTOM);
    return f;
}

static void legend(FILE *f, int k, const char *name) {
    int y = TOP + 18 * k;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">", RIGHT + 16,
            y, k_colors[k % N_COLORS], RIGHT + 34, y + 10);
    xml_text(f, name);
    fputs("</text>\n", f);
}

static int finish(FILE *f, const char *path) {
    fputs("</svg>\n", f);
    bool bad = ferror(f);
    if (fclose(f) || bad) { cli_error("%s: write error", path); return 1; }
    return 0;
}

int svg_write_lines(const char *path, const struct svg_chart *c, const struct svg_series *s, int n_series) {
    double xmin = INFINITY, xmax = -INFINITY, ymax = 0;
    for (int k = 0; k < n_series; k++)
        for (int i = 0; i < s[k].n; i++) {
            double x = c->log2_x ? log2(s[k].x[i] > 0 ? s[k].x[i] : 1) : s[k].x[i];
            xmin = fmin(xmin, x), xmax = fmax(xmax, x), ymax = fmax(ymax, s[k].y[i]);
        }
    if (!(xmax > xmin)) xmin -= 1, xmax += 1;
    double ytop;
    FILE *f = begin(path, c, ymax, &ytop);
    if (!f) return 1;
#define PX(v) (LEFT + 12 + (RIGHT - LEFT - 24) * ((c->log2_x ? log2((v) > 0 ? (v) : 1) : (v)) - xmin) / (xmax - xmin))
#define PY(v) (BOTTOM - (BOTTOM - TOP) * (v) / ytop)
    /* x ticks at the data's own x values */
    fputs("<g class=\"x-axis\">\n", f);
    for (int k = 0; k < n_series; k++)
        for (int i = 0; i < s[k].n; i++) {
            bool seen = false;
            for (int j = 0; j < k && !seen; j++)
                for (int m = 0; m < s[j].n && !seen; m++) seen = s[j].x[m] == s[k].x[i];
            for (int m = 0; m < i && !seen; m++) seen = s[k].x[m] == s[k].x[i];
            if (!seen)
                fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", PX(s[k].x[i]), BOTTOM + 18,
                        s[k].x[i]);
        }
    fputs("</g>\n", f);
    for (int k = 0; k < n_series; k++) {
        const char *col = k_colors[k % N_COLORS];
        fputs("<g class=\"series\" data-name=\"", f);
        xml_text(f, s[k].name);
        fprintf(f, "\">\n<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        for (int i = 0; i < s[k].n; i++) fprintf(f, "%s%.1f,%.1f", i ? " " : "", PX(s[k].x[i]), PY(s[k].y[i]));
        fputs("\"/>\n", f);
        for (int i = 0; i < s[k].n; i++) {
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>", PX(s[k].x[i]), PY(s[k].y[i]), col);
            xml_text(f, s[k].name);
            fprintf(f, ": %g, %.1f</title></circle>\n", s[k].x[i], s[k].y[i]);
        }
        fputs("</g>\n", f);
        legend(f, k, s[k].name);
    }
#undef PX
#undef PY
    return finish(f, path);
}

int svg_write_bars(const char *path, const struct svg_chart *c, const struct svg_series *s, int n_series) {
    double ymax = 0;
    for (int k = 0; k < n_series; k++)
        for (int g = 0; g < s[k].n; g++)
            if (!isnan(s[k].y[g])) ymax = fmax(ymax, s[k].y[g]);
    double ytop;
    FILE *f = begin(path, c, ymax, &ytop);
    if (!f) return 1;
    const double gw = (double)(RIGHT - LEFT) / (c->n_groups > 0 ? c->n_groups : 1), bw = gw * 0.8 / (n_series ? n_series : 1);
    fputs("<g class=\"x-axis\">\n", f);
    for (int g = 0; g < c->n_groups; g++) {
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", LEFT + gw * (g + 0.5), BOTTOM + 18);
        xml_text(f, c->groups[g]);
        fputs("</text>\n", f);
    }
    fputs("</g>\n", f);
    for (int k = 0; k < n_series; k++) {
        fputs("<g class=\"series\" data-name=\"", f);
        xml_text(f, s[k].name);
        fprintf(f, "\" fill=\"%s\">\n", k_colors[k % N_COLORS]);
        for (int g = 0; g < s[k].n && g < c->n_groups; g++) {
            if (isnan(s[k].y[g])) continue;
            double h = (BOTTOM - TOP) * s[k].y[g] / ytop;
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"><title>", LEFT + gw * g + gw * 0.1 + bw * k,
                    BOTTOM - h, bw, h);
            xml_text(f, s[k].name);
            fputs(", ", f);
            xml_text(f, c->groups[g]);
            fprintf(f, ": %.1f</title></rect>\n", s[k].y[g]);
        }
        fputs("</g>\n", f);
        legend(f, k, s[k].name);
    }
    return finish(f, path);
}
