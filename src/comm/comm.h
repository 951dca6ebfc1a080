/* comm.h — the ranks of a tensor-parallel job and the collectives between
 * them, in the compute layer beside the backend.
 *
 * Model of the world: a job is `size` processes (ranks) that each hold 1/size
 * of every layer (model.c's sharded views).  Rank 0 runs everything above the
 * forward pass (requests, scheduler, block tables, sampling) and broadcasts
 * each step's inputs; every rank runs the same forward, which meets the others
 * twice per layer (an all-reduce of the attention's and of the FFN's partial
 * outputs) and once at the end (rank 0 gathers the vocabulary slices of the
 * logits).  A single process is the job of one rank (comm_local.c), whose
 * collectives do nothing, so the forward never asks how many ranks there are.
 *
 * Determinism: the all-reduce gathers every rank's partial rows and each rank
 * adds them in rank order 0, 1, ..., size - 1, so a row's sum depends on that
 * row alone: never on the batch (an MPI reduction may split a message into
 * segments summed in different orders), nor on the run.
 *
 * Faults: MPI collectives have no timeout, so every wait here polls a
 * non-blocking collective against a deadline (timeout_s).  A rank that died or
 * hangs makes the wait fail with KVLLM_ECOMM (logged once); the communicator is
 * then failed for good: every later call returns KVLLM_ECOMM at once, and the
 * process is expected to end the job with comm_abort.  comm_fail marks it
 * failed from any thread (a signal handler's thread, a watchdog).
 *
 * Memory: collectives stage backend memory through host buffers sized by
 * comm_reserve at creation of the engines (never inside a step).  Threads:
 * one thread at a time issues collectives (the engine thread). */
#ifndef KVLLM_COMM_H
#define KVLLM_COMM_H

#include "backend/backend.h"
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct comm;

/* An implementation's transport (MPI, NCCL on a GPU later).  Buffers are
 * host memory; every call returns 0 or KVLLM_ECOMM (deadline passed, peer
 * lost: the implementation sets cm->failed). */
struct comm_ops {
    const char *name;
    /* bytes from rank 0 to every rank.  idle: the caller waits for work that
     * may be long in coming (a worker between steps): no deadline, and the
     * wait sleeps rather than spins. */
    int (*bcast)(struct comm *cm, void *buf, size_t bytes, bool idle);
    /* every rank's `bytes` of send into recv (size * bytes), in rank order */
    int (*allgather)(struct comm *cm, const void *send, void *recv, size_t bytes);
    /* every rank's counts[rank] bytes of send into rank 0's recv, in rank order
     * (recv is ignored elsewhere) */
    int (*gatherv)(struct comm *cm, const void *send, void *recv, const size_t *counts);
    /* end every rank of the job with exit status code (does not return for MPI) */
    void (*abort)(struct comm *cm, int code);
    /* a clean end (every rank calls it); NULL-safe */
    void (*free)(struct comm *cm);
};

/* What this rank's collectives cost: counted by comm.c, read by kvllm_tp_stats.  Plain counters: the
 * collectives run on one thread (the engine's), and a reader reads between its steps. */
enum comm_kind { COMM_BCAST, COMM_ALL_REDUCE, COMM_GATHER, COMM_KINDS };
struct comm_stats {
    uint64_t calls[COMM_KINDS];
    uint64_t bytes_received[COMM_KINDS];   /* from the other ranks, into this one */
    double seconds[COMM_KINDS];            /* wall time inside them, waiting for the others included */
};

struct comm {
    const struct comm_ops *ops;
    int rank, size;
    struct comm_stats stats;      /* but idle broadcasts' (a worker waiting for work) */
    double timeout_s;             /* deadline of a wait (but an idle bcast's) */
    atomic_bool failed;           /* set once; every later collective returns KVLLM_ECOMM */
    float *stage;                 /* host staging: comm_reserve's floats */
    size_t cap_stage;
    size_t *counts;               /* (size) scratch for gatherv */
};

/* The single-process job: rank 0 of 1 (comm_local.c).  NULL on ENOMEM. */
struct comm *comm_local_new(void);
/* The MPI job this process was started in (comm_mpi.c): *out is NULL and 0
 * returned when the process was not started by mpirun (or the build has no
 * MPI), so the caller runs alone.  KVLLM_ECOMM (logged) when MPI fails to
 * start. */
int comm_mpi_new(double timeout_s, struct comm **out);
/* Whether this build can join an MPI job. */
bool comm_mpi_built(void);

/* Frees cm (its transport's clean end); NULL-safe. */
void comm_free(struct comm *cm);
/* Mark cm failed (any thread): every wait in progress or to come returns
 * KVLLM_ECOMM.  why is logged once. */
void comm_fail(struct comm *cm, const char *why);
bool comm_failed(const struct comm *cm);
/* End the job: every rank exits with code (MPI_Abort); for one rank, nothing. */
void comm_abort(struct comm *cm, int code);

/* Host staging for collectives of up to n floats per rank (grows; call it
 * when sizing an engine, never in a step).  0 or KVLLM_ENOMEM. */
int comm_reserve(struct comm *cm, size_t n);

/* Rank r's share of n things split over the ranks: [*lo, *lo + *cnt); the
 * first n % size ranks take one more. */
void comm_split(int64_t n, int size, int rank, int64_t *lo, int64_t *cnt);

/* Bytes of host memory from rank 0 to every rank (idle: see comm_ops). */
int comm_bcast(struct comm *cm, void *buf, size_t bytes, bool idle);

/* x (n floats of backend memory on context c) = the sum over ranks of
 * every rank's x, added in rank order; the issued ops are synchronized
 * first.  Every rank calls it with the same n. */
int comm_all_reduce(struct comm *cm, struct backend_ctx *c, float *x, size_t n);

/* Column slices to whole rows on rank 0: each rank holds x = (rows,
 * cnt_r) (its share of cols, comm_split) contiguous; afterwards rank 0's x
 * is (rows, cols).  Other ranks' x is left as it was. */
int comm_gather_cols(struct comm *cm, struct backend_ctx *c, float *x, int rows, int64_t cols);

#endif
