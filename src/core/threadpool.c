/* threadpool.c — workers sleep on a condition variable between runs; a run
 * bumps a generation counter and waits until every worker has reported done. */
#include "threadpool.h"
#include "core.h"

#include <pthread.h>
#include <stdlib.h>

struct threadpool {
    int n;                    /* threads including the caller */
    pthread_t *threads;       /* (n - 1) workers */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    unsigned long gen;        /* incremented per run */
    int n_pending;            /* workers still busy in this run */
    bool stop;
    threadpool_fn fn;
    void *ctx;
};

struct worker_arg { struct threadpool *p; int ith; };

static void *worker_main(void *arg) {
    struct worker_arg wa = *(struct worker_arg *)arg;
    free(arg);
    struct threadpool *p = wa.p;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->gen == seen && !p->stop) pthread_cond_wait(&p->cv_work, &p->mu);
        if (p->stop) { pthread_mutex_unlock(&p->mu); return NULL; }
        seen = p->gen;
        threadpool_fn fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);

        fn(ctx, wa.ith, p->n);

        pthread_mutex_lock(&p->mu);
        if (--p->n_pending == 0) pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
    }
}

struct threadpool *threadpool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    struct threadpool *p = xcalloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->threads = xcalloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) { threadpool_free(p); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = xmalloc(sizeof *wa);
        if (!wa) { p->n = i; threadpool_free(p); return NULL; }
        wa->p = p;
        wa->ith = i;
        if (pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            LOG_ERR("cannot start thread %d of %d", i, n_threads);
            p->n = i;
            threadpool_free(p);
            return NULL;
        }
    }
    return p;
}

void threadpool_free(struct threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    free(p->threads);
    free(p);
}

int threadpool_size(const struct threadpool *p) { return p ? p->n : 1; }

void threadpool_run(struct threadpool *p, threadpool_fn fn, void *ctx) {
    if (!p || p->n == 1) { fn(ctx, 0, 1); return; }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);

    fn(ctx, 0, p->n);

    pthread_mutex_lock(&p->mu);
    while (p->n_pending > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
