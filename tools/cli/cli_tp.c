/* cli_tp.c — tensor parallelism for the CLI (docs/TP.md): `mpirun -np N
 * kvllm run|serve|bench|batch|eval ... [--tp N]`.  main() takes --tp / --tp-timeout
 * out of the arguments and joins the job; a command loads its model with
 * cli_model_load, where the ranks > 0 stay to follow rank 0's engines and
 * then end the process. */
#include "cli.h"
#include "cli_opts.h"
#include "kvllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_rank, g_size = 1, g_loads;

int cli_tp_rank(void) { return g_rank; }
int cli_tp_size(void) { return g_size; }

/* Remove argv[i] .. argv[i + n) from the arguments. */
static void drop(int *argc, char **argv, int i, int n) {
    memmove(argv + i, argv + i + n, (size_t)(*argc - i - n + 1) * sizeof *argv);
    *argc -= n;
}

enum { TP_SIZE = 1, TP_TIMEOUT };

static const struct cli_opt k_tp_opts[] = {
    { TP_SIZE, "--tp", "N", CLI_VALUE, "the job's size, checked against mpirun's (default: mpirun's)" },
    { TP_TIMEOUT, "--tp-timeout", "S", CLI_VALUE,
      "seconds a rank waits for another before the job fails (default 60)" },
};

const struct cli_opt_group cli_tp_group =
    CLI_GROUP("tensor parallelism (mpirun -np N kvllm ...: the model split over the ranks; docs/TP.md)", k_tp_opts);

int cli_tp_setup(int *argc, char **argv) {
    const struct cli_opt_group *const g[] = { &cli_tp_group };
    long want = 0;
    double timeout = 0;
    const char *cmd = *argc > 1 ? argv[1] : "";
    /* taken out wherever they stand, before the command parses the rest */
    for (int i = 2; i < *argc;) {
        const char *a = argv[i], *eq = strchr(a, '=');
        const struct cli_opt *o = a[0] == '-' && a[1] == '-' ? cli_opts_find(g, 1, a, eq ? (size_t)(eq - a) : strlen(a))
                                                             : NULL;
        if (!o) { i++; continue; }
        const char *v = eq ? eq + 1 : i + 1 < *argc ? argv[i + 1] : NULL;
        if (!v) { cli_error("%s needs a value", a); return 2; }
        if (o->id == TP_SIZE && !cli_int("--tp", v, 1, 4096, &want)) return 2;
        if (o->id == TP_TIMEOUT && !cli_float("--tp-timeout", v, 0.1, 86400, &timeout)) return 2;
        drop(argc, argv, i, eq ? 1 : 2);
    }
    if (kvllm_tp_init(timeout, &g_rank, &g_size)) return 1;
    static const char *const parallel[] = { "run", "serve", "bench", "batch", "eval" };
    bool parallel_cmd = false;
    for (size_t i = 0; i < sizeof parallel / sizeof *parallel; i++) parallel_cmd |= !strcmp(cmd, parallel[i]);
    if (g_size > 1 && !parallel_cmd) {
        if (g_rank == 0)
            cli_error("%s does not run tensor-parallel: under mpirun use run, serve, bench, batch or eval", cmd);
        return 2;
    }
    if (want && want != g_size) {
        if (g_rank == 0)
            cli_error("--tp %ld: this process is %s; start it with mpirun -np %ld (a build with MPI: %s)", want,
                      g_size > 1 ? "in a job of another size" : "alone", want,
                      kvllm_tp_mpi_built() ? "yes" : "no, install libopenmpi-dev and rebuild");
        return 2;
    }
    return 0;
}

/* Ranks of this job on this machine: they share its cores. */
static int local_ranks(void) {
    const char *s = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int n = s ? atoi(s) : g_size;
    return n > 0 ? n : 1;
}

int cli_model_load(const char *path, struct kvllm_model_params *mp, struct kvllm_model **out) {
    *out = NULL;
    if (g_size > 1) {
        if (g_loads++) {
            cli_error("under tensor parallelism a command loads one model once (one --threads value for bench)");
            return KVLLM_EINVAL;
        }
        mp->tensor_parallel = true;
        if (mp->n_threads <= 0) {   /* the machine's cores shared between its ranks */
            long n = sysconf(_SC_NPROCESSORS_ONLN) / local_ranks();
            mp->n_threads = n > 0 ? (int)n : 1;
        }
    }
    int rc = cli_model_open(path, mp, out);
    if (g_rank == 0) return rc;
    /* a rank > 0 follows rank 0 until it ends the job, then ends this process */
    int wrc = rc ? rc : kvllm_tp_worker(*out);
    kvllm_model_free(*out);
    kvllm_tp_end(wrc ? 1 : 0);
    exit(wrc ? 1 : 0);
}
