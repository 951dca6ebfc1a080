/* cli_opts.h — a command's options declared once, as a table (argparse's and llama.cpp's
 * common/arg.cpp habit): the same rows give the parser its spellings and value kinds, `--help` its
 * lines, and docs/CLI.md its reference (`kvllm help --markdown`, checked by tests/python/test_cli.py).
 * A value is taken as `--opt value` or `--opt=value` (cli_opt_split cuts the second). */
#ifndef KVLLM_CLI_OPTS_H
#define KVLLM_CLI_OPTS_H

#include <stdbool.h>
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
 * The option of the groups spelled name[0..n), or NULL. */
const struct cli_opt *cli_opts_find(const struct cli_opt_group *const *g, int n_groups, const char *name, size_t n);
/* argv[*i] against the groups: 1 when it is one of their options (*opt set; a CLI_VALUE option's
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

/* A whole command declared once: its usage line, option groups and closing notes give --help, the parse
 * loop (cli_cmd_next) and its section of docs/CLI.md's reference. */
struct cli_cmd {
    const char *name;       /* "bench model": error messages and the reference's heading */
    const char *synopsis;   /* what follows "usage: kvllm NAME " (may span lines) */
    const struct cli_opt_group *const *groups;   /* the command's own group(s) first, then shared ones */
    int n_groups;
    int n_own;              /* groups cli_cmd_next matches; the shared ones after them are parsed by their
                             * own helpers (cli_engine_opt, ...) and listed here for --help and "did you mean" */
    bool positional;        /* arguments not starting with '-' (and "-") are the command's; else refused */
    const char *notes;      /* lines printed after the options by --help, or NULL */
};

#define CLI_GROUPS(array) (array), (int)(sizeof(array) / sizeof *(array))

/* --help: the usage line, the options of every group, the notes. */
void cli_cmd_usage(const struct cli_cmd *c, FILE *f);
/* The command's section of the reference: a "### `kvllm NAME`" heading and the groups' tables. */
void cli_cmd_markdown(const struct cli_cmd *c, FILE *f);
/* argv[*i] in the command's option loop, once cli_opt_split cut it and the shared helpers passed it by:
 * 1 when it is one of the first n_own groups' options (*opt, *value as cli_opts_match sets them), 0 when
 * it is a positional argument the command takes (c->positional), -1 on error (printed: a missing value, an
 * unknown option with the closest spelling of all the groups, or an argument the command does not take). */
int cli_cmd_next(const struct cli_cmd *c, int argc, char **argv, int *i, const struct cli_opt **opt,
                 const char **value);
/* An argument the command refuses (a positional one too many): cli_opts_unknown over all its groups. */
void cli_cmd_unknown(const struct cli_cmd *c, const char *arg);

#endif
