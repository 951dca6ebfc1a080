/* cmd_chat.c — `kvllm chat`: a conversation with an instruct model.
 *
 * Model of the world: the conversation is a list of messages.  Every turn
 * renders and tokenizes the whole list through the chat template
 * (kvllm_chat_tokenize, with the generation prompt: what the user types is
 * read as text, never as control tokens, unless --special-in-content);
 * `have` mirrors exactly the tokens
 * whose K/V sit in the session.  The new prompt shares a prefix with `have`
 * (usually everything up to the end of the previous answer): the session is
 * truncated to that prefix and only the rest is evaluated, so earlier turns
 * are never prefilled again.  The answer is sampled token by token until an
 * end-of-turn token or -n; each token kept is evaluated into the session and
 * appended to `have`.  Its text goes back into the conversation as the
 * assistant's message; should re-rendering tokenize it differently from what
 * was generated, the common prefix simply ends there and the rest is
 * recomputed — the cache never holds a token the prompt does not.
 *
 * Context overflow: when the conversation and room for an answer no longer
 * fit -c, whole turns after the system message are dropped, oldest first
 * (noted on stderr).  The cache then holds [system | dropped | kept]: the
 * dropped positions are discarded and the kept ones moved down in place
 * (kvllm_session_discard: llama.cpp's context shift, K re-rotated by the
 * distance), so only the new message is computed.  The kept turns' K/V
 * above the first layer were computed while they could see the dropped
 * turns, which a fresh evaluation would not: an approximation llama.cpp
 * makes too (docs/CLI.md); --no-context-shift recomputes the kept turns
 * instead, as do models whose positions cannot move (GPT-2's learned ones).
 *
 * Input: with -p, or when stdin is not a terminal, one answer and exit (the
 * -p text, else the whole of stdin is the user's message).  On a terminal,
 * or with --interactive, each line of stdin is a user turn until EOF or
 * "/exit".  stdout carries only the answers (one line break after each);
 * the per-turn statistics (tokens reused from the KV cache vs computed) go
 * to stderr. */
#include "cli.h"
#include "cli_opts.h"
#include "core/strbuf.h"
#include "kvllm.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Ctrl-C: set by the handler, taken by the generation loop (stop the
 * answer) or the prompt (a second one exits). */
static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

/* Take a pending Ctrl-C. */
static bool take_interrupt(void) {
    if (!g_interrupted) return false;
    g_interrupted = 0;
    return true;
}

enum {
    C_HELP = 1, C_VERSION, C_MODEL, C_TOKENIZER, C_TEMPLATE, C_TEMPLATE_FILE, C_SYSTEM, C_PROMPT, C_FILE, C_N_PREDICT,
    C_CTX, C_THREADS, C_INTERACTIVE, C_CNV, C_NO_REUSE, C_NO_SHIFT, C_SPECIAL_IN_CONTENT, C_VERBOSE, C_QUIET,
};

/* chat's options: the parser, --help and docs/CLI.md's reference (kvllm help --markdown) read this table */
static const struct cli_opt k_chat_opts[] = {
    { C_MODEL, "-m, --model", "PATH", CLI_VALUE, "GGUF file, Hugging Face folder or llama2.c checkpoint" },
    { C_TOKENIZER, "--tokenizer", "PATH", CLI_VALUE,
      "vocabulary (llama2.c tokenizer.bin or GGUF) for models without one" },
    { C_TEMPLATE, "--chat-template", "NAME", CLI_VALUE,
      "chat template (default: the model's tokenizer.chat_template): a llama.cpp\nbuilt-in name kvllm has (chatml, "
      "llama3, gemma, phi3, zephyr) or Jinja text" },
    { C_TEMPLATE_FILE, "--chat-template-file", "FILE", CLI_VALUE, "the Jinja chat template in a file" },
    { C_SYSTEM, "-sys, --system-prompt, --system", "TEXT", CLI_VALUE, "a system message opening the conversation" },
    { C_PROMPT, "-p, --prompt", "TEXT", CLI_VALUE, "the user's message: answer it and exit" },
    { C_FILE, "-f, --file", "FILE", CLI_VALUE, "the user's message from FILE ('-': stdin): answer it and exit" },
    { C_N_PREDICT, "-n, --n-predict", "N", CLI_VALUE, "most tokens per answer (default 512)" },
    { C_CTX, "-c, --ctx-size", "N", CLI_VALUE, "positions the conversation may use (default: the model's)" },
    { C_THREADS, "-t, --threads", "N", CLI_VALUE, "threads (default: all CPUs)" },
    { C_INTERACTIVE, "--interactive", NULL, CLI_FLAG, "read turns from stdin line by line even when it is not a terminal" },
    { C_CNV, "-cnv, --conversation", NULL, CLI_FLAG, "accepted (llama-cli): chat always converses" },
    { C_NO_REUSE, "--no-reuse", NULL, CLI_FLAG, "recompute the whole conversation every turn (baseline, for tests)" },
    { C_NO_SHIFT, "--no-context-shift", NULL, CLI_FLAG,
      "when old turns are dropped, recompute the kept ones rather than move their\ncached K/V down (exact, slower; "
      "the default moves them as llama.cpp does)" },
    { C_SPECIAL_IN_CONTENT, "--special-in-content", NULL, CLI_FLAG,
      "control-token text typed in a message (\"<|im_end|>\") becomes control tokens,\nas Transformers does "
      "(default: it is read as text)" },
    { C_VERBOSE, "-v, --verbose", NULL, CLI_FLAG, "also print each rendered prompt to stderr" },
    { C_QUIET, "-q, --quiet", NULL, CLI_FLAG, "only errors on stderr" },
    { C_VERSION, "--version", NULL, CLI_FLAG, "print the version, commit and kernel sets" },
    { C_HELP, "-h, --help", NULL, CLI_FLAG, "print this help" },
};

static const struct cli_opt_group k_chat_group = CLI_GROUP(NULL, k_chat_opts);
static const struct cli_opt_group *const k_chat_groups[] = {
    &k_chat_group, &cli_sampling_group, &cli_hf_group, &cli_engine_group, &cli_gpu_group,
};

static const struct cli_cmd k_chat_cmd = {
    .name = "chat",
    .synopsis = "-m MODEL [options]",
    .groups = CLI_GROUPS(k_chat_groups),
    .n_own = 1,
    .notes =
        "  Without -p, on a terminal: one user turn per line; /help lists the commands (/clear, /exit), end of\n"
        "  input quits; Ctrl-C stops the answer being written, a second Ctrl-C at the prompt quits.\n"
        "  A conversation that outgrows -c loses its oldest turns after the system message (noted on stderr);\n"
        "  the turns kept stay in the KV cache, moved down (a context shift), unless --no-context-shift.\n"
        "  With -p, or when stdin is not a terminal: one answer (to -p, or to all of stdin), then exit.\n",
};

void cmd_chat_markdown(FILE *f) { cli_cmd_markdown(&k_chat_cmd, f); }

struct chat_opts {
    const char *model, *tokenizer, *template_arg, *prompt, *system, *file;
    bool template_is_file;
    struct kvllm_engine_params ep;  /* KV options (--kv-type, --block-size, --kv-mem, ...) */
    long n_predict, n_ctx, n_threads;
    bool seed_set, interactive, no_reuse, no_shift, verbose, quiet, special_in_content;
    struct kvllm_sampling_params sp;
    struct cli_hf hf;               /* -hf REPO[:QUANT]: downloaded, then model points at it */
};

/* 0 ok, -1 help printed, 2 usage error (reported). */
static int parse(int argc, char **argv, struct chat_opts *o) {
    o->n_predict = 512;
    o->sp = kvllm_sampling_default_params();
    o->ep = kvllm_engine_default_params();
    for (int i = 1; i < argc; i++) {
        if (!cli_opt_split(argv, i)) return 2;
        const char *a = argv[i], *v;
        int so = cli_sampling_opt(argc, argv, &i, &o->sp, &o->seed_set);
        if (so == 0) so = cli_engine_opt(argc, argv, &i, &o->ep);
        if (so == 0) so = cli_gpu_opt(argc, argv, &i);
        if (so == 0) so = cli_hf_opt(argc, argv, &i, &o->hf);
        if (so < 0) return 2;
        if (so > 0) continue;
        const struct cli_opt *op;
        if (cli_cmd_next(&k_chat_cmd, argc, argv, &i, &op, &v) < 0) return 2;
        switch (op->id) {
        case C_HELP: cli_cmd_usage(&k_chat_cmd, stdout); return -1;
        case C_VERSION: cli_print_version(stdout); return -1;
        case C_MODEL: o->model = v; break;
        case C_TOKENIZER: o->tokenizer = v; break;
        case C_TEMPLATE: case C_TEMPLATE_FILE: o->template_arg = v; o->template_is_file = op->id == C_TEMPLATE_FILE; break;
        case C_CNV: break;
        case C_SYSTEM: o->system = v; break;
        case C_PROMPT: o->prompt = v; break;
        case C_FILE: o->file = v; break;
        case C_N_PREDICT: if (!cli_int(a, v, 1, 1 << 24, &o->n_predict)) return 2; break;
        case C_CTX: if (!cli_int(a, v, 2, 1 << 24, &o->n_ctx)) return 2; break;
        case C_THREADS: if (!cli_int(a, v, 1, 1024, &o->n_threads)) return 2; break;
        case C_INTERACTIVE: o->interactive = true; break;
        case C_NO_REUSE: o->no_reuse = true; break;
        case C_NO_SHIFT: o->no_shift = true; break;
        case C_SPECIAL_IN_CONTENT: o->special_in_content = true; break;
        case C_VERBOSE: o->verbose = true; break;
        case C_QUIET: o->quiet = true; break;
        }
    }
    if (!cli_opt_end()) return 2;
    if (!o->model && !o->hf.repo) { cli_error("chat: -m MODEL (or -hf REPO) is required (see kvllm chat --help)"); return 2; }
    if (o->file && o->prompt) { cli_error("chat: give the message with -p or -f, not both"); return 2; }
    if (!o->seed_set) o->sp.seed = (uint64_t)time(NULL);
    return 0;
}

/* A file ('-': stdin) as text: NULL on error or a NUL byte inside (reported). */
static char *read_text(const char *path, const char *name) {
    size_t n;
    char *buf = cli_read_file(path, &n);
    if (buf && strlen(buf) != n) { cli_error("%s: contains a NUL byte", name); free(buf); return NULL; }
    return buf;
}

#define MAX_END_IDS 8

struct chat {
    struct kvllm_model *model;
    const struct kvllm_model_desc *d;
    struct kvllm_session *sess;
    struct kvllm_sampler *smp;
    struct kvllm_detok *detok;
    const char *tmpl;                 /* NULL: the model's own */
    struct kvllm_chat_message *msgs;  /* (cap_msgs); content malloc'd, role static */
    int n_msgs, cap_msgs;
    int32_t *have;                    /* (n_ctx) the tokens whose K/V are in sess, n_have of them */
    int n_have, n_ctx;
    float *logits;                    /* (n_vocab) after the last token of have */
    int32_t end_ids[MAX_END_IDS];     /* tokens that end an answer */
    int n_end;
    struct strbuf answer;             /* the answer being generated */
    long n_predict;
    bool quiet, verbose, no_reuse, no_shift, special_in_content;
    bool shift_unsupported;           /* the model's positions cannot move: noted once */
    bool interrupted;                 /* the last answer was cut by Ctrl-C */
    int turn;
};

static bool is_end(const struct chat *c, int32_t id) {
    for (int i = 0; i < c->n_end; i++)
        if (c->end_ids[i] == id) return true;
    return false;
}

/* The vocabulary's EOS, plus every common end-of-turn marker that the
 * vocabulary holds as a single control token (text "" when printed). */
static void find_end_ids(struct chat *c) {
    static const char *const k_markers[] = {
        "<|im_end|>", "<|eot_id|>", "<end_of_turn>", "</s>", "<|end|>", "<|endoftext|>", "<|end_of_text|>",
    };
    if (c->d->token_eos >= 0) c->end_ids[c->n_end++] = c->d->token_eos;
    for (size_t i = 0; i < sizeof k_markers / sizeof *k_markers && c->n_end < MAX_END_IDS; i++) {
        int32_t id[2];
        char b;
        int n = kvllm_tokenize(c->model, k_markers[i], strlen(k_markers[i]), false, true, id, 2);
        if (n == 1 && kvllm_token_to_bytes(c->model, id[0], &b, 0) == 0 && !is_end(c, id[0]))
            c->end_ids[c->n_end++] = id[0];
    }
}

/* Append a message (content copied).  false on OOM (reported). */
static bool push_msg(struct chat *c, const char *role, const char *content, size_t len) {
    if (c->n_msgs == c->cap_msgs) {
        int cap = c->cap_msgs ? 2 * c->cap_msgs : 8;
        struct kvllm_chat_message *m = realloc(c->msgs, (size_t)cap * sizeof *m);
        if (!m) { cli_error("out of memory"); return false; }
        c->msgs = m;
        c->cap_msgs = cap;
    }
    char *s = malloc(len + 1);
    if (!s) { cli_error("out of memory"); return false; }
    memcpy(s, content, len);
    s[len] = 0;
    c->msgs[c->n_msgs++] = (struct kvllm_chat_message){ .role = role, .content = s };
    return true;
}

static void pop_msg(struct chat *c) {
    free((char *)c->msgs[--c->n_msgs].content);
}

static bool answer_add(struct chat *c, const char *s) {
    sb_puts(&c->answer, s);
    if (!c->answer.oom) return true;
    cli_error("out of memory");
    return false;
}

/* After turns were dropped the cache holds [prefix (p0 tokens) | dropped
 * (delta) | rest] while the prompt ids are [prefix | rest | new]: the rest
 * is found where the dropped turns end (the prompt that still held them
 * was delta tokens longer), the dropped positions discarded and the rest
 * moved down.  Returns the tokens kept that way (have and the session then
 * hold p0 + that many), or 0 when nothing could be (the caller truncates
 * at p0 and computes the rest). */
static int shift_kept(struct chat *c, const int32_t *ids, int n_ids, int p0, int delta) {
    if (c->no_shift || c->shift_unsupported || delta <= 0) return 0;
    int m = 0;
    while (p0 + delta + m < c->n_have && p0 + m < n_ids && c->have[p0 + delta + m] == ids[p0 + m]) m++;
    if (m == 0) return 0;
    kvllm_session_truncate(c->sess, p0 + delta + m);   /* fewer rows to move */
    c->n_have = p0 + delta + m;
    const double t0 = cli_time();
    int rc = kvllm_session_discard(c->sess, p0, p0 + delta);
    if (rc == KVLLM_EUNSUPPORTED) {
        c->shift_unsupported = true;
        if (!c->quiet)
            fprintf(stderr, "kvllm: turn %d: no context shift for this model (learned positions) or backend (no "
                            "kv_shift op): the kept turns are recomputed\n", c->turn);
        return 0;
    }
    if (rc) {   /* the op failed (reported): the session holds the prefix only */
        c->n_have = p0;
        return 0;
    }
    memmove(c->have + p0, c->have + p0 + delta, (size_t)m * sizeof *c->have);
    c->n_have = p0 + m;
    if (!c->quiet)
        fprintf(stderr, "kvllm: turn %d: context shift: %d cached tokens of the kept turns moved back %d positions "
                        "(K re-rotated), not recomputed (%.2f ms)\n", c->turn, m, delta, 1e3 * (cli_time() - t0));
    return m;
}

/* One user turn: render, reuse the cached prefix, evaluate the rest, stream
 * the answer, add it to the conversation.  Returns 0, or 1 (reported) with
 * the user's message taken back out of the conversation
 * (the session stays consistent with `have` whatever failed). */
static int chat_turn(struct chat *c, const char *user, size_t len) {
    c->turn++;
    if (!push_msg(c, "user", user, len)) return 1;
    char *text = NULL;
    int32_t *ids = NULL;
    int n_gen = 0, n_ids = 0;
    /* room for an answer: a quarter of the context, or -n if less */
    const int room = c->n_predict < c->n_ctx / 4 ? (int)c->n_predict : c->n_ctx / 4;
    int dropped = 0, rc, n_full = -1;   /* n_full: tokens of the prompt before any turn was dropped */
    for (;;) {
        rc = kvllm_chat_tokenize(c->model, c->tmpl, c->msgs, c->n_msgs, true, c->special_in_content, &ids, &n_ids);
        if (rc) {
            if (rc == KVLLM_ENOTFOUND) cli_error("chat: no chat template; give one with --chat-template NAME or --chat-template-file FILE");
            goto fail;
        }
        if (n_full < 0) n_full = n_ids;
        /* too long: drop the oldest turn after the system message (the new message stays) */
        int first = c->n_msgs > 0 && !strcmp(c->msgs[0].role, "system");
        if (n_ids + room <= c->n_ctx || c->n_msgs - first <= 1) break;
        int k = first + 1;   /* a user message and the replies up to the next user message */
        while (k < c->n_msgs - 1 && strcmp(c->msgs[k].role, "user")) k++;
        for (int i = first; i < k; i++) free((char *)c->msgs[i].content);
        memmove(c->msgs + first, c->msgs + k, (size_t)(c->n_msgs - k) * sizeof *c->msgs);
        c->n_msgs -= k - first;
        dropped += k - first;
        free(ids);
        ids = NULL;
    }
    if (dropped && !c->quiet)
        fprintf(stderr, "kvllm: turn %d: the conversation outgrew the context of %d positions: dropped the %d oldest "
                        "message(s) after the system prompt (%d messages, %d tokens remain)\n",
                c->turn, c->n_ctx, dropped, c->n_msgs, n_ids);
    if (c->verbose && !kvllm_chat_render(c->model, c->tmpl, c->msgs, c->n_msgs, true, &text))
        fprintf(stderr, "kvllm: turn %d prompt:\n%s\n", c->turn, text);
    if (n_ids == 0) { cli_error("chat: the conversation renders to no tokens"); goto fail; }
    if (n_ids >= c->n_ctx) {
        cli_error("chat: the conversation (%d tokens) no longer fits the context of %d positions "
                  "(leaving room for an answer); raise -c", n_ids, c->n_ctx);
        goto fail;
    }

    /* the longest prefix already in the cache; at least one token is
     * evaluated so that there are logits to sample from */
    int keep = 0;
    while (!c->no_reuse && keep < c->n_have && keep < n_ids && c->have[keep] == ids[keep]) keep++;
    if (dropped && !c->no_reuse) keep += shift_kept(c, ids, n_ids, keep, n_full - n_ids);
    if (keep == n_ids) keep--;
    kvllm_session_truncate(c->sess, keep);
    c->n_have = keep;
    double t0 = cli_time();
    if (kvllm_session_eval(c->sess, ids + keep, n_ids - keep, false, c->logits)) goto fail;
    memcpy(c->have + keep, ids + keep, (size_t)(n_ids - keep) * sizeof *ids);
    c->n_have = n_ids;
    double t1 = cli_time();
    if (!c->quiet)
        fprintf(stderr, "kvllm: turn %d: prompt %d tokens: %d reused from the KV cache, %d computed (%.1f ms)\n",
                c->turn, n_ids, keep, n_ids - keep, 1e3 * (t1 - t0));

    /* generate */
    const char *why = "-n limit";
    int32_t prev = -1;
    sb_clear(&c->answer);
    if (!answer_add(c, "")) goto fail;
    for (;;) {
        int32_t id = kvllm_sampler_sample(c->smp, c->logits, c->have, c->n_have);
        if (id < 0) goto fail;
        if (is_end(c, id)) { why = "end of turn"; break; }
        if (take_interrupt()) { why = "Ctrl-C"; c->interrupted = true; break; }
        const char *s = kvllm_detok_push(c->detok, prev, id);
        if (!s || !answer_add(c, s)) goto fail;
        fputs(s, stdout);
        fflush(stdout);
        prev = id;
        if (++n_gen >= c->n_predict) break;
        if (c->n_have >= c->n_ctx) { why = "context full"; break; }
        if (kvllm_session_eval(c->sess, &id, 1, false, c->logits)) goto fail;
        c->have[c->n_have++] = id;
    }
    const char *s = kvllm_detok_flush(c->detok);
    if (!s || !answer_add(c, s)) goto fail;
    fputs(s, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    double t2 = cli_time();
    if (!c->quiet)
        fprintf(stderr, "kvllm: turn %d: answer %d tokens in %.1f ms (%.1f tok/s), stopped by %s\n", c->turn, n_gen,
                1e3 * (t2 - t1), n_gen / (t2 - t1 + 1e-12), why);
    free(ids);
    free(text);
    return push_msg(c, "assistant", c->answer.s, c->answer.len) ? 0 : 1;
fail:
    if (n_gen > 0) fputc('\n', stdout);  /* end the partial answer */
    fflush(stdout);
    kvllm_session_truncate(c->sess, c->n_have);  /* drop whatever a failed evaluation left */
    pop_msg(c);
    free(ids);
    free(text);
    return 1;
}

/* Strip trailing line-break characters in place; returns the new length. */
static size_t chomp(char *s, size_t n) {
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = 0;
    return n;
}

static const char *k_commands =
    "  /help     this list\n"
    "  /clear    forget the conversation (the system message stays)\n"
    "  /exit     quit (also /quit, end of input, or Ctrl-C twice at the prompt)\n"
    "  Ctrl-C    stop the answer being written\n";

/* On a terminal, wait until a line can be read or Ctrl-C comes; false for
 * Ctrl-C.  A Ctrl-C that lands after the prompt is printed but before
 * getline blocks would otherwise be seen only after the next line (the
 * signal interrupts no read that has not started): polling with a short
 * timeout closes that window.  A terminal in canonical mode hands getline
 * one whole line per read, so nothing waits in stdio's buffer meanwhile. */
static bool wait_line_or_interrupt(void) {
    struct pollfd pf = { .fd = STDIN_FILENO, .events = POLLIN };
    for (;;) {
        if (g_interrupted) return false;
        int r = poll(&pf, 1, 100);
        if (r > 0 || (r < 0 && errno != EINTR)) return true;   /* readable, or let getline report */
    }
}

/* Lines of stdin as turns until EOF or /exit.  Returns 0 or 1. */
static int chat_loop(struct chat *c, bool tty) {
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    bool armed = false;   /* a Ctrl-C came just before: the next one at the prompt quits */
    if (tty) fputs("kvllm: /help for commands; Ctrl-C stops an answer, twice at the prompt quits\n", stderr);
    for (;;) {
        if (tty) { fputs("> ", stderr); fflush(stderr); }
        errno = 0;
        ssize_t got = tty && !wait_line_or_interrupt() ? -1 : getline(&line, &cap, stdin);
        if (got < 0 && (errno == EINTR || g_interrupted)) {
            clearerr(stdin);
            take_interrupt();
            if (armed) break;
            armed = true;
            fputs("\n(Ctrl-C again to quit)\n", stderr);
            continue;
        }
        if (got < 0) break;
        size_t n = chomp(line, (size_t)got);
        if (strlen(line) != n) { cli_error("chat: the line contains a NUL byte; skipped"); continue; }
        if (!n) continue;
        armed = false;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/help")) { fputs(k_commands, stderr); continue; }
        if (!strcmp(line, "/clear")) {
            int first = c->n_msgs > 0 && !strcmp(c->msgs[0].role, "system");
            while (c->n_msgs > first) pop_msg(c);
            fprintf(stderr, "kvllm: conversation cleared%s\n", first ? " (the system message stays)" : "");
            continue;
        }
        if (line[0] == '/' && strchr("abcdefghijklmnopqrstuvwxyz", line[1] ? line[1] : '#') && !strchr(line, ' ')) {
            fprintf(stderr, "kvllm: unknown command %s\n%s", line, k_commands);
            continue;
        }
        take_interrupt();   /* a Ctrl-C typed before the answer began does not cut it */
        int turn = chat_turn(c, line, n);
        if (c->interrupted || take_interrupt()) { c->interrupted = false; armed = true; }
        if (turn) {
            /* a template error or a full context: on a terminal the user may
             * go on (the message was taken back); from a pipe it is fatal */
            if (!tty) { rc = 1; break; }
        }
    }
    if (tty) fputc('\n', stderr);
    free(line);
    return rc;
}

static int chat_main(struct chat_opts o);

int cmd_chat(int argc, char **argv) {
    struct chat_opts o = { 0 };
    int rc = parse(argc, argv, &o);
    if (!rc) rc = cli_hf_model(&o.hf, &o.model, false, false);
    if (!rc) rc = chat_main(o);
    cli_hf_free(&o.hf);
    return rc < 0 ? 0 : rc;
}

static int chat_main(struct chat_opts o) {
    if (o.quiet) kvllm_log_set_level(KVLLM_LOG_ERROR);

    struct chat c = { .n_predict = o.n_predict, .quiet = o.quiet, .verbose = o.verbose, .no_reuse = o.no_reuse,
                      .no_shift = o.no_shift, .special_in_content = o.special_in_content };
    char *tmpl = NULL, *input = NULL, *file_text = NULL;
    int status = 1;
    if (o.file) {
        if (!(file_text = read_text(o.file, o.file))) return 1;
        size_t n = chomp(file_text, strlen(file_text));
        if (!n) { cli_error("chat: %s holds no message", o.file); free(file_text); return 1; }
        o.prompt = file_text;
    }
    if (o.template_arg) {
        if (!(tmpl = cli_chat_template(o.template_is_file ? "--chat-template-file" : "--chat-template", o.template_arg,
                                       o.template_is_file))) {
            free(file_text);
            return 1;
        }
        c.tmpl = tmpl;
    }

    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = o.tokenizer;
    mp.n_threads = (int)o.n_threads;
    if (cli_model_open(o.model, &mp, &c.model)) { free(tmpl); free(file_text); return 1; }
    c.d = kvllm_model_describe(c.model);

    /* no template at all is a usage problem: say so before reading input */
    char *probe = NULL;
    struct kvllm_chat_message hi = { .role = "user", .content = "hi" };
    if (!c.tmpl && kvllm_chat_render(c.model, NULL, &hi, 1, true, &probe) == KVLLM_ENOTFOUND) {
        cli_error("chat: %s has no chat template (tokenizer.chat_template); give one with --chat-template NAME or --chat-template-file FILE",
                  o.model);
        goto done;
    }
    free(probe);

    c.n_ctx = (int)(o.n_ctx ? o.n_ctx : c.d->n_ctx_train);
    if (o.n_ctx > c.d->n_ctx_train && !o.quiet)
        fprintf(stderr, "kvllm: warning: context %ld exceeds the model's trained context length %d; "
                        "quality may degrade past it\n", o.n_ctx, c.d->n_ctx_train);
    struct kvllm_session_params sp = { .n_ctx = c.n_ctx, .engine = &o.ep };
    if (kvllm_session_new(c.model, &sp, &c.sess)) goto done;
    if (kvllm_sampler_new(&o.sp, c.d->n_vocab, &c.smp) || kvllm_detok_new(c.model, &c.detok)) goto done;
    c.have = malloc((size_t)c.n_ctx * sizeof *c.have);
    c.logits = malloc((size_t)c.d->n_vocab * sizeof *c.logits);
    if (!c.have || !c.logits) { cli_error("out of memory"); goto done; }
    find_end_ids(&c);
    if (!o.quiet)
        fprintf(stderr, "kvllm: %s, %d layers, n_embd %d, vocab %d, kernels %s; context %d, %d end-of-turn token(s)\n",
                c.d->arch, c.d->n_layer, c.d->n_embd, c.d->n_vocab, kvllm_model_backend(c.model), c.n_ctx, c.n_end);
    if (o.system && !push_msg(&c, "system", o.system, strlen(o.system))) goto done;

    bool tty = isatty(STDIN_FILENO);
    /* Ctrl-C interrupts the answer (and a blocked read: no SA_RESTART) */
    struct sigaction sa = { .sa_handler = on_sigint };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    if (o.prompt && chat_turn(&c, o.prompt, strlen(o.prompt))) goto done;
    if (o.interactive || (tty && !o.prompt)) {
        if (chat_loop(&c, tty)) goto done;
    } else if (!o.prompt) {
        /* one answer to all of stdin */
        if (!(input = read_text("-", "stdin"))) goto done;
        size_t n = chomp(input, strlen(input));
        if (!n) { cli_error("chat: no message on stdin (give one with -p TEXT)"); goto done; }
        if (chat_turn(&c, input, n)) goto done;
    }
    status = 0;
done:
    while (c.n_msgs > 0) pop_msg(&c);
    free(c.msgs);
    sb_free(&c.answer);
    free(c.have);
    free(c.logits);
    free(input);
    free(file_text);
    free(tmpl);
    kvllm_detok_free(c.detok);
    kvllm_sampler_free(c.smp);
    kvllm_session_free(c.sess);
    kvllm_model_free(c.model);
    return status;
}
