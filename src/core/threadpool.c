/* threadpool.c — persistent workers that spin briefly on a generation
 * counter between runs (decode issues dozens of runs per token, too many to
 * pay a futex wake-up each) and fall back to a condition variable when idle.
 *
 * Protocol: run() publishes fn/ctx, sets n_pending, bumps `gen` (release),
 * then broadcasts under the mutex; a worker that saw the old `gen` under the
 * mutex is therefore always woken.  Workers decrement n_pending when done;
 * run() spins until it reaches 0. */
#include "threadpool.h"
#include "core.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

/* ~1 ms of pause instructions: long enough to bridge the gaps between the
 * kernels of one step, short enough not to steal a core from an idle server */
#define SPIN_ITERS 20000

struct threadpool {
    int n;                    /* threads including the caller */
    pthread_t *threads;       /* (n - 1) workers */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_ulong gen;         /* incremented per run */
    atomic_int n_pending;     /* workers still busy in this run */
    atomic_bool stop;
    threadpool_fn fn;         /* published before gen is bumped */
    void *ctx;
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
        p->fn(p->ctx, wa.ith, p->n);
        atomic_fetch_sub_explicit(&p->n_pending, 1, memory_order_release);
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

void threadpool_run(struct threadpool *p, threadpool_fn fn, void *ctx) {
    if (!p || p->n == 1) { fn(ctx, 0, 1); return; }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->n_pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);

    fn(ctx, 0, p->n);

    /* yield early: with more threads than free cores the worker we wait for
     * may need this very core */
    for (unsigned long i = 0; atomic_load_explicit(&p->n_pending, memory_order_acquire) > 0; i++)
        if (i > 2000) sched_yield(); else cpu_relax();
}
