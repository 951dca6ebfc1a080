/* cli_opts.h — a command's options declared once, as a table (argparse's and llama.cpp's
 * common/arg.cpp habit): the same rows give the parser its spellings and value kinds, `--help` its
 * lines, and docs/CLI.md its reference (`kvllm help --markdown`, checked by tests/python/test_cli.py).
 * A value is taken as `--opt value` or `--opt=value` (cli_opt_split cuts the second). */
#ifndef KVLLM_CLI_OPTS_H
#define KVLLM_CLI_OPTS_H

#include <stdio.h>

enum cli_arg {
    CLI_FLAG,       /* no value; `--flag=x` is refused */
    CLI_VALUE,      /* a value follows */
    CLI_OPTIONAL,   /* a value may be glued on (`--opt=x`); the command decides about a separate one */
};

struct cli_opt {
    int id;               /* the command's code for it (what the parser's switch reads), > 0 */
    const char *names;    /* spellings, ", "-separated, as --help shows them: "-m, --model" */
    const char *arg;      /* the value's name ("PATH", "[on|off|auto]"); NULL for a flag */
    enum cli_arg kind;
    const char *help;     /* lines separated by '\n' */
};

struct cli_opt_group {
    const char *title;    /* NULL: the command's own options (no heading) */
    const struct cli_opt *opts;
    int n;
};

#define CLI_GROUP(title, table) { title, table, (int)(sizeof table / sizeof *table) }

/* The functions take an array of group pointers (a command's own group and shared ones).
 * argv[*i] against the groups: 1 when it is one of their options (*opt set; a CLI_VALUE option's
 * value in *value, *i advanced past a separate one; a CLI_OPTIONAL option's glued value or NULL),
 * 0 when it is none of them, -1 when a needed value is missing (printed). */
int cli_opts_match(int argc, char **argv, int *i, const struct cli_opt_group *const *g, int n_groups,
                   const struct cli_opt **opt, const char **value);
/* The --help lines of the groups, each group under its title. */
void cli_opts_usage(FILE *f, const struct cli_opt_group *const *g, int n_groups);
/* The same as a text, malloc'd (the caller frees it); NULL when out of memory. */
char *cli_opts_usage_text(const struct cli_opt_group *const *g, int n_groups);
/* cli_unknown for an argument none of the groups matched: "did you mean" searches their spellings. */
void cli_opts_unknown(const char *cmd, const char *arg, const struct cli_opt_group *const *g, int n_groups);
/* The reference rows of docs/CLI.md: a Markdown table per group. */
void cli_opts_markdown(FILE *f, const struct cli_opt_group *const *g, int n_groups);

#endif
