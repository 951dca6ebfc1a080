/* cli_opts.c — option tables: parsing, --help and Markdown from the same rows (cli_opts.h). */
#include "cli_opts.h"
#include "cli.h"

#include <stdlib.h>
#include <string.h>

/* Whether arg[0..n) is one of names' ", "-separated spellings. */
static bool spelled(const char *names, const char *arg, size_t n) {
    for (const char *p = names; p && *p;) {
        const char *end = strstr(p, ", ");
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && !strncmp(p, arg, n)) return true;
        p = end ? end + 2 : NULL;
    }
    return false;
}

const struct cli_opt *cli_opts_find(const struct cli_opt_group *const *g, int n_groups, const char *name, size_t n) {
    for (int k = 0; k < n_groups; k++)
        for (int j = 0; j < g[k]->n; j++)
            if (spelled(g[k]->opts[j].names, name, n)) return &g[k]->opts[j];
    return NULL;
}

int cli_opts_match(int argc, char **argv, int *i, const struct cli_opt_group *const *g, int n_groups,
                   const struct cli_opt **opt, const char **value) {
    *value = NULL;
    const struct cli_opt *o = cli_opts_find(g, n_groups, argv[*i], strlen(argv[*i]));
    if (!o) return 0;
    *opt = o;
    if (o->kind == CLI_OPTIONAL) *value = cli_opt_value();
    else if (o->kind == CLI_VALUE && !(*value = cli_arg(argc, argv, i))) return -1;
    return 1;
}

void cli_opts_usage(FILE *f, const struct cli_opt_group *const *g, int n_groups) {
    for (int k = 0; k < n_groups; k++) {
        if (g[k]->title) fprintf(f, "%s:\n", g[k]->title);
        for (int j = 0; j < g[k]->n; j++) {
            const struct cli_opt *o = &g[k]->opts[j];
            char left[128];
            snprintf(left, sizeof left, "%s%s%s", o->names, o->arg ? " " : "", o->arg ? o->arg : "");
            /* the help starts in column 25, or two spaces after a longer left part */
            int col = fprintf(f, "  %s", left);
            fprintf(f, "%*s", col < 24 ? 25 - col : 2, "");
            for (const char *p = o->help; *p; p++) {
                fputc(*p, f);
                if (*p == '\n') fprintf(f, "%25s", "");
            }
            fputc('\n', f);
        }
    }
}

char *cli_opts_usage_text(const struct cli_opt_group *const *g, int n_groups) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    cli_opts_usage(f, g, n_groups);
    fclose(f);
    return buf;
}

void cli_opts_unknown(const char *cmd, const char *arg, const struct cli_opt_group *const *g, int n_groups) {
    char *text = cli_opts_usage_text(g, n_groups);
    cli_unknown(cmd, arg, text ? text : "", NULL);
    free(text);
}

/* Text for a Markdown table cell: '|' escaped, line breaks as spaces. */
static void md_cell(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (*s == '|') fputs("\\|", f);
        else if (*s == '\n') fputc(' ', f);
        else fputc(*s, f);
    }
}

void cli_opts_markdown(FILE *f, const struct cli_opt_group *const *g, int n_groups) {
    for (int k = 0; k < n_groups; k++) {
        if (g[k]->title) fprintf(f, "\n%s:\n", g[k]->title);
        fputs("\n| option | value | |\n|---|---|---|\n", f);
        for (int j = 0; j < g[k]->n; j++) {
            const struct cli_opt *o = &g[k]->opts[j];
            fputs("| ", f);
            for (const char *p = o->names; p && *p;) {
                const char *end = strstr(p, ", ");
                int len = end ? (int)(end - p) : (int)strlen(p);
                fprintf(f, "%s`%.*s`", p == o->names ? "" : ", ", len, p);
                p = end ? end + 2 : NULL;
            }
            fputs(" | ", f);
            if (o->arg) { fputc('`', f); md_cell(f, o->arg); fputc('`', f); }
            fputs(" | ", f);
            md_cell(f, o->help);
            fputs(" |\n", f);
        }
    }
}

void cli_cmd_usage(const struct cli_cmd *c, FILE *f) {
    fprintf(f, "usage: kvllm %s %s\n", c->name, c->synopsis);
    cli_opts_usage(f, c->groups, c->n_groups);
    if (c->notes) fputs(c->notes, f);
}

void cli_cmd_markdown(const struct cli_cmd *c, FILE *f) {
    fprintf(f, "\n### `kvllm %s`\n", c->name);
    cli_opts_markdown(f, c->groups, c->n_groups);
}

int cli_cmd_next(const struct cli_cmd *c, int argc, char **argv, int *i, const struct cli_opt **opt,
                 const char **value) {
    const char *a = argv[*i];
    if (c->positional && (a[0] != '-' || !a[1])) return 0;   /* "-" alone: standard input */
    int m = cli_opts_match(argc, argv, i, c->groups, c->n_own, opt, value);
    if (m == 0) cli_cmd_unknown(c, a);
    return m == 1 ? 1 : -1;
}

void cli_cmd_unknown(const struct cli_cmd *c, const char *arg) { cli_opts_unknown(c->name, arg, c->groups, c->n_groups); }
