/* comm_mpi.c — the communicator on MPI (Open MPI: mpirun -np N on one
 * machine over shared memory, mpirun -H a,b across machines).
 *
 * Every wait is a non-blocking collective polled against a deadline
 * (MPI collectives have no timeout of their own): a peer that died or
 * hangs fails the wait with KVLLM_ECOMM instead of hanging this rank, and
 * comm_fail from another thread ends a wait at once.  An idle wait (a
 * worker between steps) has no deadline and sleeps between polls, so idle
 * ranks do not spin a core each. */
#include "comm/comm.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef KVLLM_HAVE_MPI
#include <mpi.h>
#include <sched.h>

bool comm_mpi_built(void) { return true; }

/* Polls spun before yielding: on a loaded 2-core machine spinning 100x longer made decode 1.7x slower
 * (the spinner takes the core its peer needs) */
enum { SPIN_POLLS = 2000 };

/* Wait for *req: 0, or KVLLM_ECOMM past the deadline or once failed. */
static int wait_req(struct comm *cm, MPI_Request *req, bool idle, const char *what) {
    const double until = time_now() + cm->timeout_s;
    long polls = 0;
    for (;;) {
        int done = 0;
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            comm_fail(cm, "an MPI call failed");
            return KVLLM_ECOMM;
        }
        if (done) return 0;
        if (comm_failed(cm)) return KVLLM_ECOMM;   /* the request is abandoned: the job is ending */
        polls++;
        if (!idle && (polls & 255) == 0 && time_now() > until) {
            char why[160];
            snprintf(why, sizeof why, "%s did not complete within %g s (a rank died or hangs)", what, cm->timeout_s);
            comm_fail(cm, why);
            return KVLLM_ECOMM;
        }
        /* spin briefly (a step's collectives complete in microseconds), then yield, then sleep */
        if (polls < SPIN_POLLS) continue;
        if (!idle && polls < 20 * SPIN_POLLS) { sched_yield(); continue; }
        long ns = idle ? (polls < 100000 ? 50000 : 1000000) : 20000;
        nanosleep(&(struct timespec){ .tv_nsec = ns }, NULL);
    }
}

static int mpi_bcast(struct comm *cm, void *buf, size_t bytes, bool idle) {
    MPI_Request req;
    if (bytes > (size_t)INT32_MAX) return KVLLM_ERANGE;
    if (MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD, &req) != MPI_SUCCESS) return KVLLM_ECOMM;
    return wait_req(cm, &req, idle && cm->rank != 0, "a broadcast of the step's inputs");
}

static int mpi_allgather(struct comm *cm, const void *send, void *recv, size_t bytes) {
    MPI_Request req;
    if (bytes > (size_t)INT32_MAX) return KVLLM_ERANGE;
    if (MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
        return KVLLM_ECOMM;
    return wait_req(cm, &req, false, "an all-reduce");
}

static int mpi_gatherv(struct comm *cm, const void *send, void *recv, const size_t *counts) {
    int cnt[256], displ[256];
    KV_ASSERT(cm->size <= 256);
    size_t at = 0;
    for (int r = 0; r < cm->size; r++) {
        if (counts[r] > (size_t)INT32_MAX || at > (size_t)INT32_MAX) return KVLLM_ERANGE;
        cnt[r] = (int)counts[r];
        displ[r] = (int)at;
        at += counts[r];
    }
    MPI_Request req;
    if (MPI_Igatherv(send, cnt[cm->rank], MPI_BYTE, recv, cnt, displ, MPI_BYTE, 0, MPI_COMM_WORLD, &req) !=
        MPI_SUCCESS)
        return KVLLM_ECOMM;
    return wait_req(cm, &req, false, "the gather of the logits");
}

static void mpi_abort(struct comm *cm, int code) { MPI_Abort(MPI_COMM_WORLD, code); }

static void mpi_free(struct comm *cm) {
    /* after a failure a peer may never reach MPI_Finalize: the job is ended by comm_abort instead */
    if (!comm_failed(cm)) MPI_Finalize();
}

static const struct comm_ops k_mpi_ops = {
    .name = "mpi", .bcast = mpi_bcast, .allgather = mpi_allgather, .gatherv = mpi_gatherv,
    .abort = mpi_abort, .free = mpi_free,
};

/* Whether a launcher started this process as part of a job (Open MPI,
 * MPICH / PMI, PMIx): otherwise MPI is not started at all, and kvllm runs
 * alone as any program does. */
static bool launched_by_mpirun(void) {
    static const char *const vars[] = { "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK" };
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return true;
    return false;
}

int comm_mpi_new(double timeout_s, struct comm **out) {
    *out = NULL;
    if (!launched_by_mpirun()) return 0;
    int provided = 0, rank = 0, size = 1;
    /* the engine thread issues collectives while the main thread started MPI: serialized, never concurrent */
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        LOG_ERR("MPI_Init_thread failed: cannot join the MPI job");
        return KVLLM_ECOMM;
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        LOG_ERR("this MPI library gives thread level %d, kvllm needs MPI_THREAD_SERIALIZED (%d)", provided,
                MPI_THREAD_SERIALIZED);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    struct comm *cm = xcalloc(1, sizeof *cm);
    if (cm) cm->counts = xcalloc((size_t)size, sizeof *cm->counts);
    if (!cm || !cm->counts) {
        free(cm);
        MPI_Abort(MPI_COMM_WORLD, 1);
        return KVLLM_ENOMEM;
    }
    cm->ops = &k_mpi_ops;
    cm->rank = rank;
    cm->size = size;
    cm->timeout_s = timeout_s > 0 ? timeout_s : 60;
    atomic_init(&cm->failed, false);
    *out = cm;
    return 0;
}

#else   /* a build without MPI: every process runs alone */

bool comm_mpi_built(void) { return false; }

int comm_mpi_new(double timeout_s, struct comm **out) {
    *out = NULL;
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK"))
        LOG_WARN("started by mpirun, but this kvllm was built without MPI: each process runs alone");
    return 0;
}

#endif
