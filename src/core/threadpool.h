/* threadpool.h — a fork-join pool of persistent pthreads.
 *
 * threadpool_run(pool, fn, ctx) calls fn(ctx, ith, nth) once on each of the
 * nth threads (the caller is thread 0) and returns when all are done.  Work
 * is split by the callee from (ith, nth), so a given split never depends on
 * timing.  threadpool_run_chunks hands out numbered chunks instead.  Not
 * reentrant: one run at a time per pool. */
#ifndef KVLLM_THREADPOOL_H
#define KVLLM_THREADPOOL_H

struct threadpool;

typedef void (*threadpool_fn)(void *ctx, int ith, int nth);
typedef void (*threadpool_chunk_fn)(void *ctx, long chunk, int ith);

/* n_threads >= 1 (1: no extra threads).  NULL on failure (logged). */
struct threadpool *threadpool_new(int n_threads);
void threadpool_free(struct threadpool *p);
int threadpool_size(const struct threadpool *p);
void threadpool_run(struct threadpool *p, threadpool_fn fn, void *ctx);

/* fn(ctx, c, ith) once for each chunk c < n_chunks, chunks claimed by
 * whichever thread is free (ith: its index, the caller 0, for per-thread
 * scratch); returns when all are done.  Threads
 * the OS has not scheduled in time are left out, so a busy machine slows a
 * run down by the work it takes away, not by a time slice per run.  Which
 * thread computes a chunk varies: a chunk's result must depend on c only. */
void threadpool_run_chunks(struct threadpool *p, long n_chunks, threadpool_chunk_fn fn, void *ctx);

/* [begin, end) of n items for thread ith of nth, in contiguous chunks. */
static inline void threadpool_split(long n, int ith, int nth, long *begin, long *end) {
    long per = (n + nth - 1) / nth;
    long b = per * ith, e = b + per;
    if (b > n) b = n;
    if (e > n) e = n;
    *begin = b;
    *end = e;
}

#endif
