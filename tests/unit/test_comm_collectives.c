/* test_comm_collectives — the communicator (src/comm): alone it is the
 * single-rank implementation; under `mpirun -np N` (ctest's
 * unit_test_comm_mpi) the MPI one.  Every rank fills its buffers from a
 * formula of (rank, index), so each can compute what every other rank
 * sent and check the collectives exactly:
 *   comm_split covers 0 .. n once, in rank order;
 *   bcast delivers rank 0's bytes;
 *   all_reduce equals the sum added in rank order bit for bit, on every
 *   rank, for any length (the sum of a row never depends on how many rows
 *   travel with it);
 *   gather_cols assembles rows of uneven column slices on rank 0;
 *   a failed communicator refuses every collective with KVLLM_ECOMM. */
#include "check.h"
#include "comm/comm.h"
#include "core/core.h"

#include <math.h>
#include <string.h>

static float part(int rank, size_t i) { return sinf((float)(i * 7 + 1) * 0.37f + (float)rank) * (float)(1 + rank); }

static void check_split(void) {
    for (int size = 1; size <= 7; size++)
        for (int64_t n = 0; n <= 40; n++) {
            int64_t next = 0;
            for (int r = 0; r < size; r++) {
                int64_t lo, cnt;
                comm_split(n, size, r, &lo, &cnt);
                CHECK(lo == next && cnt >= n / size && cnt <= n / size + 1);
                next = lo + cnt;
            }
            CHECK(next == n);
        }
}

static void check_bcast(struct comm *cm) {
    int32_t v[5] = { 0 };
    if (cm->rank == 0)
        for (int i = 0; i < 5; i++) v[i] = 1000 + i;
    CHECK(comm_bcast(cm, v, sizeof v, false) == 0);
    for (int i = 0; i < 5; i++) CHECK(v[i] == 1000 + i);
}

static void check_all_reduce(struct comm *cm, struct backend *be, struct backend_ctx *c, size_t n) {
    struct backend_buf buf;
    CHECK(be->ops->buf_alloc(be, n * sizeof(float), &buf) == 0);
    float *host = xmalloc(n * sizeof *host), *want = xmalloc(n * sizeof *want);
    for (size_t i = 0; i < n; i++) host[i] = part(cm->rank, i);
    CHECK(c->ops->upload(c, buf.data, host, n * sizeof *host) == 0);
    CHECK(comm_all_reduce(cm, c, buf.data, n) == 0);
    CHECK(c->ops->download(c, host, buf.data, n * sizeof *host) == 0);
    CHECK(backend_sync(c) == 0);
    for (size_t i = 0; i < n; i++) {
        want[i] = part(0, i);
        for (int r = 1; r < cm->size; r++) want[i] += part(r, i);
    }
    CHECK_MSG(memcmp(host, want, n * sizeof *host) == 0, "rank %d, n %zu: not the rank-order sum", cm->rank, n);
    free(host);
    free(want);
    be->ops->buf_free(be, &buf);
}

static void check_gather(struct comm *cm, struct backend *be, struct backend_ctx *c, int rows, int64_t cols) {
    int64_t lo, cnt;
    comm_split(cols, cm->size, cm->rank, &lo, &cnt);
    struct backend_buf buf;
    const size_t n_all = (size_t)rows * (size_t)cols;
    CHECK(be->ops->buf_alloc(be, n_all * sizeof(float), &buf) == 0);
    float *host = xmalloc(n_all * sizeof *host);
    for (int i = 0; i < rows; i++)   /* this rank's (rows, cnt) block: the value names row and column */
        for (int64_t j = 0; j < cnt; j++) host[(size_t)i * (size_t)cnt + (size_t)j] = (float)(i * 100000 + lo + j);
    CHECK(c->ops->upload(c, buf.data, host, (size_t)rows * (size_t)cnt * sizeof *host) == 0);
    CHECK(comm_gather_cols(cm, c, buf.data, rows, cols) == 0);
    if (cm->rank == 0) {
        CHECK(c->ops->download(c, host, buf.data, n_all * sizeof *host) == 0);
        CHECK(backend_sync(c) == 0);
        int bad = 0;
        for (int i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) bad += host[(size_t)i * (size_t)cols + (size_t)j] != (float)(i * 100000 + j);
        CHECK_MSG(bad == 0, "rows %d, cols %lld: %d misplaced", rows, (long long)cols, bad);
    }
    free(host);
    be->ops->buf_free(be, &buf);
}

int main(void) {
    struct comm *cm = NULL;
    CHECK(comm_mpi_new(30, &cm) == 0);
    if (!cm) cm = comm_local_new();   /* not under mpirun: the single-rank implementation */
    CHECK(cm != NULL);
    if (!cm) return check_report("test_comm_collectives");
    printf("test_comm_collectives: %s, rank %d of %d\n", cm->ops->name, cm->rank, cm->size);
    struct backend *be = NULL;
    struct backend_ctx *c = NULL;
    CHECK(backend_cpu_new(NULL, false, BACKEND_ACT_Q8, &be) == 0);
    struct backend_ctx_params cp = { .n_threads = 1, .max_tokens = 4, .max_ctx = 16, .n_head = 1, .head_dim = 8,
                                     .max_cols = 64 };
    CHECK(backend_ctx_new(be, &cp, &c) == 0);
    CHECK(comm_reserve(cm, 4096) == 0);
    check_split();
    check_bcast(cm);
    static const size_t lens[] = { 1, 3, 64, 1000, 4096 };
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) check_all_reduce(cm, be, c, lens[i]);
    check_gather(cm, be, c, 1, 7);
    check_gather(cm, be, c, 5, 333);
    check_gather(cm, be, c, 3, 1024);
    if (cm->size > 1) {   /* a failed communicator: every rank marks it (a real failure is one-sided) */
        comm_fail(cm, "test: marked failed");
        int32_t v = 0;
        CHECK(comm_bcast(cm, &v, sizeof v, false) == KVLLM_ECOMM);
        CHECK(comm_failed(cm));
        atomic_store(&cm->failed, false);   /* every rank did the same: the job can still end cleanly */
    }
    backend_ctx_free(c);
    backend_free(be);
    const int rc = check_report("test_comm_collectives");
    comm_free(cm);
    return rc;
}
