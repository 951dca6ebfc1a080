/* threadpool.c — persistent workers that spin briefly on a generation
 * counter between runs (decode issues dozens of runs per token, too many to
 * pay a futex wake-up each) and fall back to a condition variable when idle.
 *
 * Protocol: a run publishes its parameters and its `door` word (run id,
 * kind, closed bit, workers entered), bumps `gen` (release), then
 * broadcasts under the mutex; a worker that saw the old `gen` under the
 * mutex is therefore always woken.
 *
 * Static runs (threadpool_run): every worker takes part; the caller waits
 * for n_pending to reach 0.
 *
 * Chunked runs (threadpool_run_chunks): chunks are claimed from an atomic
 * counter, and a worker takes part only if it enters the door (a CAS on
 * `door` while it is open and still names this run).  When no chunk is left
 * the caller closes the door and waits only for the workers that entered.
 * A worker the OS has not scheduled yet (a busy machine) is simply left
 * out, instead of the whole step waiting a time slice for it; its share is
 * done by whoever claims it.  A worker that finds the door closed or naming
 * a newer run touches nothing of that run. */
#include "threadpool.h"
#include "core.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

/* ~1 ms of pause instructions: long enough to bridge the gaps between the
 * kernels of one step, short enough not to steal a core from an idle server */
#define SPIN_ITERS 20000

/* door word: run id (low 32 bits of gen) << 32 | CHUNKED | CLOSED | entered */
#define DOOR_CHUNKED 0x80000000ull
#define DOOR_CLOSED 0x40000000ull
#define DOOR_COUNT 0x3fffffffull

struct threadpool {
    int n;                    /* threads including the caller */
    pthread_t *threads;       /* (n - 1) workers */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_ulong gen;         /* incremented per run */
    atomic_int n_pending;     /* static run: workers still busy */
    atomic_bool stop;
    atomic_ullong door;       /* see above; published before gen is bumped */
    threadpool_fn fn;         /* static run; published before gen is bumped */
    threadpool_chunk_fn cfn;  /* chunked run */
    void *ctx;
    long n_chunks;
    atomic_long next_chunk;
    atomic_int n_left;        /* chunked run: workers that entered and finished */
};

struct worker_arg { struct threadpool *p; int ith; };

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg) {
    struct worker_arg wa = *(struct worker_arg *)arg;
    free(arg);
    struct threadpool *p = wa.p;
    unsigned long seen = 0;
    for (;;) {
        for (int i = 0; i < SPIN_ITERS && atomic_load_explicit(&p->gen, memory_order_acquire) == seen &&
                        !atomic_load_explicit(&p->stop, memory_order_relaxed); i++)
            cpu_relax();
        if (atomic_load_explicit(&p->gen, memory_order_acquire) == seen) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        unsigned long long d = atomic_load_explicit(&p->door, memory_order_acquire);
        if ((d >> 32) != (seen & 0xffffffffu)) continue;      /* superseded: a closed chunked run */
        if (!(d & DOOR_CHUNKED)) {
            p->fn(p->ctx, wa.ith, p->n);
            atomic_fetch_sub_explicit(&p->n_pending, 1, memory_order_release);
            continue;
        }
        bool in = false;
        while (!in && (d >> 32) == (seen & 0xffffffffu) && !(d & DOOR_CLOSED))
            in = atomic_compare_exchange_weak_explicit(&p->door, &d, d + 1, memory_order_acq_rel,
                                                       memory_order_acquire);
        if (!in) continue;
        for (long c; (c = atomic_fetch_add_explicit(&p->next_chunk, 1, memory_order_relaxed)) < p->n_chunks;)
            p->cfn(p->ctx, c, wa.ith);
        atomic_fetch_add_explicit(&p->n_left, 1, memory_order_release);
    }
}

struct threadpool *threadpool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    struct threadpool *p = xcalloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = xcalloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) { threadpool_free(p); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = xmalloc(sizeof *wa);
        if (!wa) { threadpool_free(p); return NULL; }
        wa->p = p;
        wa->ith = i;
        if (pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            LOG_ERR("cannot start thread %d of %d", i, n_threads);
            threadpool_free(p);
            return NULL;
        }
        p->n = i + 1;
    }
    return p;
}

void threadpool_free(struct threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

int threadpool_size(const struct threadpool *p) { return p ? p->n : 1; }

/* Publish a run of the given kind and wake the workers. */
static void publish(struct threadpool *p, unsigned long long kind) {
    const unsigned long next = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&p->door, ((unsigned long long)(next & 0xffffffffu) << 32) | kind, memory_order_relaxed);
    atomic_store_explicit(&p->gen, next, memory_order_release);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void threadpool_run_chunks(struct threadpool *p, long n_chunks, threadpool_chunk_fn fn, void *ctx) {
    if (!p || p->n == 1 || n_chunks <= 1) {
        for (long c = 0; c < n_chunks; c++) fn(ctx, c, 0);
        return;
    }
    p->cfn = fn;
    p->ctx = ctx;
    p->n_chunks = n_chunks;
    atomic_store_explicit(&p->next_chunk, 0, memory_order_relaxed);
    atomic_store_explicit(&p->n_left, 0, memory_order_relaxed);
    publish(p, DOOR_CHUNKED);
    for (long c; (c = atomic_fetch_add_explicit(&p->next_chunk, 1, memory_order_relaxed)) < n_chunks;) fn(ctx, c, 0);
    /* every chunk is claimed: close the door, wait for those who entered */
    const int entered = (int)(atomic_fetch_or_explicit(&p->door, DOOR_CLOSED, memory_order_acq_rel) & DOOR_COUNT);
    for (unsigned long i = 0; atomic_load_explicit(&p->n_left, memory_order_acquire) < entered; i++)
        if (i > 2000) sched_yield(); else cpu_relax();
}

void threadpool_run(struct threadpool *p, threadpool_fn fn, void *ctx) {
    if (!p || p->n == 1) { fn(ctx, 0, 1); return; }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->n_pending, p->n - 1, memory_order_relaxed);
    publish(p, 0);

    fn(ctx, 0, p->n);

    /* yield early: with more threads than free cores the worker we wait for
     * may need this very core */
    for (unsigned long i = 0; atomic_load_explicit(&p->n_pending, memory_order_acquire) > 0; i++)
        if (i > 2000) sched_yield(); else cpu_relax();
}
