/* bench_plot.h — the plots of `kvllm bench model --svg DIR` and `kvllm bench plot`: rows of speed
 * measurements, from kvllm's own run or read from JSON (kvllm's and llama-bench's -o json / jsonl,
 * bench/vs-llamacpp's -o json), drawn as SVG charts (svg.h):
 *   batch.svg    decode tokens/s against the sequences decoding together (--batch), a line per series;
 *   depth.svg    decode tokens/s (one sequence) against the context already filled (--depth);
 *   compare.svg  one bar per engine for every test both engines ran (kvllm against llama.cpp).
 * A chart is written only when its rows vary along its x axis (or name two engines). */
#ifndef KVLLM_CLI_BENCH_PLOT_H
#define KVLLM_CLI_BENCH_PLOT_H

struct plot_row {
    char engine[32], model[128];
    long threads, pp, tg, depth, batch;   /* a prefill test has pp > 0, a decode test tg > 0 */
    double tps;                           /* tokens/s: kvllm's median, llama-bench's avg_ts */
};

struct plot_rows { struct plot_row *v; int n, cap; };

/* 0, or 1 (printed: out of memory). */
int plot_rows_add(struct plot_rows *r, const struct plot_row *row);
/* The rows of a JSON file; rows without kvllm's keys belong to engine `label` (NULL: "llama.cpp").
 * 0, or 1 with the reason printed (naming the file). */
int plot_rows_read(struct plot_rows *r, const char *path, const char *label);
/* The charts that have something to show, into folder dir (made when missing); each written one is
 * named on stderr.  0, or 1 (printed). */
int plot_write(const struct plot_rows *r, const char *dir);
void plot_rows_free(struct plot_rows *r);

#endif
