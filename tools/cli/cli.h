/* cli.h — the kvllm command-line tool's subcommands.  Each returns the
 * process exit status (0 ok, 1 error, 2 usage). */
#ifndef KVLLM_CLI_H
#define KVLLM_CLI_H

int cmd_run(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_batch(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_grammar(int argc, char **argv);
/* Each command's options reference (its struct cli_cmd, cli_opts.h), as Markdown:
 * `kvllm help --markdown`, the generated section of docs/CLI.md. */
#include <stdio.h>
void cmd_run_markdown(FILE *f);
void cmd_chat_markdown(FILE *f);
void cmd_serve_markdown(FILE *f);
void cmd_bench_markdown(FILE *f);
void cmd_info_markdown(FILE *f);
void cmd_quantize_markdown(FILE *f);
void cmd_convert_markdown(FILE *f);
void cmd_eval_markdown(FILE *f);
void cmd_tokenize_markdown(FILE *f);
void cmd_batch_markdown(FILE *f);
void cmd_template_markdown(FILE *f);
void cmd_grammar_markdown(FILE *f);
/* `kvllm bench serve` (cmd_bench_serve.c), dispatched from cmd_bench; its options (cli_opts.h). */
int bench_serve_cmd(int argc, char **argv);
extern const struct cli_cmd bench_serve_cli;

/* Shared option parsing helpers (cli_util.c). */
#include <stdbool.h>
#include <stdint.h>
bool cli_is_help(const char *arg);
/* The output of a command that writes a file beside OUT and renames it over
 * OUT (folder false), or that fills the folder OUT (true): OUT must not
 * exist yet, or be a regular file (a folder).  A rename over a device node
 * (-o /dev/full, or /dev/null as root) replaces the node.  0, or 1 with the
 * reason printed. */
int cli_out_kind_check(const char *cmd, const char *out, bool folder);
/* Parse a number for option `opt`; on error prints "kvllm: error: ..." and returns false. */
bool cli_int(const char *opt, const char *s, long lo, long hi, long *out);
bool cli_float(const char *opt, const char *s, double lo, double hi, double *out);
/* Fetch the argument of an option at argv[*i], advancing *i; prints usage error if missing.  After
 * cli_opt_split cut "--name=value", the value is that part (and *i stays). */
const char *cli_arg(int argc, char **argv, int *i);
/* --name=value as well as --name value (argparse's and llama.cpp's habit): called first for each
 * argv[i] an option loop looks at, it cuts "--name=value" at the '=' (argv[i] is then "--name") and
 * keeps the value for cli_arg or cli_opt_value.  A value left over from the option before, one that
 * takes none, is an error: false (printed).  cli_opt_end says the same after the loop. */
bool cli_opt_split(char **argv, int i);
bool cli_opt_end(void);
/* The value cut off the current option (NULL when none), taken: for options whose value is optional. */
const char *cli_opt_value(void);
/* Text given inline or by file: `value` is the text itself unless is_file, or unless it names an
 * existing file (kvllm's older habit for --grammar and --json-schema).  malloc'd, NUL-free; NULL on
 * error (printed, naming opt). */
char *cli_text_arg(const char *opt, const char *value, bool is_file);
/* --chat-template VALUE: one of llama.cpp's built-in template names that kvllm has (chatml, llama3,
 * gemma, phi3, zephyr), Jinja text, or a file; --chat-template-file FILE (is_file).  The Jinja text,
 * malloc'd; NULL on error (printed: a llama.cpp name kvllm lacks is refused naming the ones it has). */
char *cli_chat_template(const char *opt, const char *value, bool is_file);
extern const char *const cli_chat_template_names;
/* Monotonic seconds. */
double cli_time(void);
/* Parse a comma-separated list of integers (at most max); returns the count or -1 (error printed). */
int cli_int_list(const char *opt, const char *s, long lo, long hi, long *out, int max);
/* Engine options shared by run, bench and batch (--kv-mem, --kv-tokens,
 * --kv-type, --block-size, --max-seqs, --max-batch-tokens, --no-prefix-cache).
 * Returns 1 if argv[*i] was one (consumed, with its value), 0 if not, -1 on
 * a bad value (error printed). */
struct kvllm_engine_params;
int cli_engine_opt(int argc, char **argv, int *i, struct kvllm_engine_params *p);
/* The shared option tables (cli_opts.h), and the engine's --help text made from them. */
struct cli_opt_group;
extern const struct cli_opt_group cli_engine_group, cli_spec_group, cli_sampling_group, cli_hf_group, cli_gpu_group;
extern const struct cli_opt_group *const cli_engine_groups[2];   /* engine, spec */
const char *cli_engine_usage_text(void);
#define cli_engine_usage (cli_engine_usage_text())
/* Speculation from the engine options: --spec-tokens alone means prompt
 * lookup; --draft-model's model is loaded into p->draft_model (the caller
 * frees it with kvllm_model_free after the engine).  0, or 1 (reported). */
int cli_spec_setup(struct kvllm_engine_params *p, int n_threads);
/* One stderr line: drafts accepted, acceptance rate (nothing when speculation is off). */
struct kvllm_engine;
void cli_spec_report(struct kvllm_engine *e, const struct kvllm_engine_params *p);
/* Sampling options shared by run, chat and batch (--temp, --top-k, --top-p,
 * --min-p, --repeat-penalty, --seed); same return values as cli_engine_opt. */
struct kvllm_sampling_params;
int cli_sampling_opt(int argc, char **argv, int *i, struct kvllm_sampling_params *sp, bool *seed_set);
/* The whole file ('-': stdin), NUL-terminated (its length in *len, which may
 * be NULL); NULL on error (reported). */
#include <stddef.h>
char *cli_read_file(const char *path, size_t *len);
/* Parse "A:B" (or "A") into lo..hi. */
bool cli_range(const char *opt, const char *s, long lo, long hi, long *a, long *b);
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Report an unknown option of `cmd`, naming the closest option found in the
 * usage texts (more may be NULL): "did you mean --temp?". */
void cli_unknown(const char *cmd, const char *arg, const char *usage, const char *more);
/* llama.cpp / vLLM options that only matter on a GPU: -dev/--device and -mg/--main-gpu choose the
 * device (cli_device_flag, cli_main_gpu_flag); the others (-ngl, -fa, --gpu-memory-utilization, ...)
 * are consumed with a one-line note on stderr.  Returns 1 if argv[*i] was one, 0 if not, -1 when
 * its value is missing or refused (error printed). */
int cli_gpu_opt(int argc, char **argv, int *i);
/* Models by name (hub.h): llama.cpp's -hf/-hfr/--hf-repo REPO[:QUANT], -hff/--hf-file FILE,
 * -hft/--hf-token TOKEN.  cli_hf_opt: same return values as cli_engine_opt.  cli_hf_model: when a
 * repository was named (or *model is not a path but owner/name, and allow_name), downloads it and points
 * *model at the local path (hf->path, freed by cli_hf_free); 0, or 1 (printed). */
struct cli_hf { const char *repo, *file, *token; char *path; };
int cli_hf_opt(int argc, char **argv, int *i, struct cli_hf *hf);
int cli_hf_model(struct cli_hf *hf, const char **model, bool allow_name, bool prefer_folder);
void cli_hf_free(struct cli_hf *hf);
/* "kvllm VERSION (commit HASH)" and the compiled kernel sets. */
#include <stdio.h>
void cli_print_version(FILE *f);
const char *cli_version_string(void);
const char *cli_commit_string(void);

/* Tensor parallelism (cli_tp.c): take --tp N and --tp-timeout S (cli_tp_group, which the --help of the
 * commands that run tensor-parallel lists) out of the arguments and join the MPI job this process was started
 * in; 0, or the exit status (reported). */
int cli_tp_setup(int *argc, char **argv);
extern const struct cli_opt_group cli_tp_group;
int cli_tp_rank(void);
int cli_tp_size(void);
/* cli_model_open for run, serve and bench: under mpirun the model is this rank's share, and a rank
 * > 0 never returns (it follows rank 0's engines, then exits). */
struct kvllm_model;
struct kvllm_model_params;
int cli_model_load(const char *path, struct kvllm_model_params *mp, struct kvllm_model **out);

/* Where a model runs (cli_backend.c).  cli_model_open: kvllm_model_load with mp's backend fields
 * filled from KVLLM_BACKEND, KVLLM_CPU, KVLLM_ACT, KVLLM_CUDA_DEVICE and the device flags (a flag
 * wins); every command loads its models through it.  Its result is kvllm_model_load's; a
 * KVLLM_CUDA_DEVICE that is not an index is KVLLM_EINVAL (printed).  cli_device_flag (-dev,
 * --device: none, cpu, cuda, CUDA<N>, cuda:<N>) and cli_main_gpu_flag (-mg, --main-gpu N) record a
 * flag's value: 0, or 2 (printed) for one they refuse. */
int cli_model_open(const char *path, const struct kvllm_model_params *mp, struct kvllm_model **out);
int cli_device_flag(const char *opt, const char *v);
int cli_main_gpu_flag(const char *opt, const char *v);

#endif
