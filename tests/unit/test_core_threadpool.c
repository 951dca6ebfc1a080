/* test_core_threadpool.c — the pool's two kinds of run: static runs call
 * every thread once; chunked runs call every chunk exactly once, whoever
 * claims it, including when there are more threads than CPUs (workers
 * arriving late are left out) and when static and chunked runs alternate
 * back to back (a late worker must never run a closed run's chunks). */
#include "check.h"
#include "core/core.h"
#include "core/threadpool.h"

#include <stdatomic.h>
#include <string.h>

#define MAX_CHUNKS 5000

struct chunk_ctx { atomic_int hits[MAX_CHUNKS]; atomic_long sum; };

static void chunk_fn(void *arg, long c, int ith) {
    struct chunk_ctx *x = arg;
    if (ith < 0 || ith >= 16) atomic_fetch_add(&x->sum, 1L << 40);   /* out-of-range thread index */
    atomic_fetch_add(&x->hits[c], 1);
    atomic_fetch_add(&x->sum, c);
}

struct static_ctx { atomic_int calls[16]; atomic_int nth_seen; };

static void static_fn(void *arg, int ith, int nth) {
    struct static_ctx *x = arg;
    atomic_fetch_add(&x->calls[ith], 1);
    atomic_store(&x->nth_seen, nth);   /* same value from every thread (atomic: they all store it) */
}

static void exercise(int n_threads, int runs, struct rng *g) {
    struct threadpool *p = threadpool_new(n_threads);
    CHECK(p != NULL);
    if (!p) return;
    static struct chunk_ctx cx;
    int bad_chunk = 0, bad_static = 0;
    for (int r = 0; r < runs; r++) {
        if ((uint32_t)rng_u64(g) % 3 == 0) {
            struct static_ctx sx;
            memset(&sx, 0, sizeof sx);
            threadpool_run(p, static_fn, &sx);
            for (int i = 0; i < threadpool_size(p); i++) bad_static += atomic_load(&sx.calls[i]) != 1;
            bad_static += atomic_load(&sx.nth_seen) != threadpool_size(p);
            continue;
        }
        const long n = (long)((uint32_t)rng_u64(g) % 50 == 0 ? (uint32_t)rng_u64(g) % MAX_CHUNKS : (uint32_t)rng_u64(g) % 40);
        for (long c = 0; c < n; c++) atomic_store(&cx.hits[c], 0);
        atomic_store(&cx.sum, 0);
        threadpool_run_chunks(p, n, chunk_fn, &cx);
        long want = n * (n - 1) / 2;
        for (long c = 0; c < n; c++) bad_chunk += atomic_load(&cx.hits[c]) != 1;
        bad_chunk += atomic_load(&cx.sum) != want;
    }
    CHECK_MSG(bad_chunk == 0, "%d threads: %d chunk errors", n_threads, bad_chunk);
    CHECK_MSG(bad_static == 0, "%d threads: %d static-run errors", n_threads, bad_static);
    threadpool_free(p);
}

int main(void) {
    struct rng g;
    rng_seed(&g, 7);
    exercise(1, 200, &g);
    exercise(2, 5000, &g);
    exercise(3, 5000, &g);
    exercise(8, 2000, &g);   /* more threads than CPUs: late workers are left out */
    return check_report("test_core_threadpool");
}
