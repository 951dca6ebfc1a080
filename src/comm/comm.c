/* comm.c — the collectives the forward pass uses, over a transport's
 * (comm_ops) host-memory primitives: backend memory is staged through the
 * host, and sums are added in rank order here, never by the transport. */
#include "comm/comm.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

void comm_free(struct comm *cm) {
    if (!cm) return;
    cm->ops->free(cm);
    free(cm->stage);
    free(cm->counts);
    free(cm);
}

void comm_fail(struct comm *cm, const char *why) {
    if (!cm || atomic_exchange(&cm->failed, true)) return;
    LOG_ERR("tensor parallelism (rank %d of %d): %s; the job cannot compute any more", cm->rank, cm->size, why);
}

bool comm_failed(const struct comm *cm) { return cm && atomic_load(&cm->failed); }

void comm_abort(struct comm *cm, int code) {
    if (cm) cm->ops->abort(cm, code);
}

int comm_reserve(struct comm *cm, size_t n) {
    if (!cm || cm->size == 1) return 0;
    const size_t need = (size_t)(cm->size + 1) * n;   /* own rows, then every rank's */
    if (need <= cm->cap_stage) return 0;
    float *p = realloc(cm->stage, need * sizeof *p);
    if (!p) return KVLLM_ENOMEM;
    cm->stage = p;
    cm->cap_stage = need;
    return 0;
}

void comm_split(int64_t n, int size, int rank, int64_t *lo, int64_t *cnt) {
    const int64_t q = n / size, r = n % size;
    *cnt = q + (rank < r);
    *lo = (int64_t)rank * q + (rank < r ? rank : r);
}

/* One collective of kind k, begun at t0, that brought `in` bytes to this rank. */
static void count(struct comm *cm, enum comm_kind k, double t0, size_t in) {
    cm->stats.calls[k]++;
    cm->stats.bytes_received[k] += in;
    cm->stats.seconds[k] += time_now() - t0;
}

int comm_bcast(struct comm *cm, void *buf, size_t bytes, bool idle) {
    if (!cm || cm->size == 1) return 0;
    if (comm_failed(cm)) return KVLLM_ECOMM;
    const double t0 = time_now();
    int rc = cm->ops->bcast(cm, buf, bytes, idle);
    if (!rc && !idle) count(cm, COMM_BCAST, t0, cm->rank ? bytes : 0);
    return rc;
}

static int all_reduce(struct comm *cm, struct backend_ctx *c, float *x, size_t n) {
    KV_ASSERT((size_t)(cm->size + 1) * n <= cm->cap_stage);
    float *own = cm->stage, *all = cm->stage + n;
    int rc = backend_sync(c);
    if (!rc) rc = c->ops->download(c, own, x, n * sizeof *own);
    if (!rc) rc = backend_sync(c);
    if (rc) {   /* the peers wait in the collective: this rank cannot leave them a partial sum */
        comm_fail(cm, "a step's ops failed before an all-reduce");
        return rc;
    }
    if ((rc = cm->ops->allgather(cm, own, all, n * sizeof *own))) return rc;
    /* rank order, whatever the transport: a row's sum depends on that row alone */
    memcpy(own, all, n * sizeof *own);
    for (int r = 1; r < cm->size; r++) {
        const float *p = all + (size_t)r * n;
        for (size_t i = 0; i < n; i++) own[i] += p[i];
    }
    rc = c->ops->upload(c, x, own, n * sizeof *own);
    return rc ? rc : backend_sync(c);
}

int comm_all_reduce(struct comm *cm, struct backend_ctx *c, float *x, size_t n) {
    if (!cm || cm->size == 1) return 0;
    if (comm_failed(cm)) return KVLLM_ECOMM;
    const double t0 = time_now();
    int rc = all_reduce(cm, c, x, n);
    if (!rc) count(cm, COMM_ALL_REDUCE, t0, (size_t)(cm->size - 1) * n * sizeof *x);
    return rc;
}

static int gather_cols(struct comm *cm, struct backend_ctx *c, float *x, int rows, int64_t cols) {
    int64_t lo, cnt;
    comm_split(cols, cm->size, cm->rank, &lo, &cnt);
    const size_t n_own = (size_t)rows * (size_t)cnt, n_all = (size_t)rows * (size_t)cols;
    KV_ASSERT(n_own + 2 * n_all <= cm->cap_stage);
    float *own = cm->stage, *all = cm->stage + n_own, *out = all + n_all;
    int rc = backend_sync(c);
    if (!rc) rc = c->ops->download(c, own, x, n_own * sizeof *own);
    if (!rc) rc = backend_sync(c);
    if (rc) {
        comm_fail(cm, "a step's ops failed before the logits were gathered");
        return rc;
    }
    for (int r = 0; r < cm->size; r++) {
        int64_t l, k;
        comm_split(cols, cm->size, r, &l, &k);
        cm->counts[r] = (size_t)rows * (size_t)k * sizeof(float);
    }
    if ((rc = cm->ops->gatherv(cm, own, all, cm->counts))) return rc;
    if (cm->rank) return 0;
    /* (rows, cnt_r) blocks in rank order -> (rows, cols) */
    const float *src = all;
    for (int r = 0; r < cm->size; r++) {
        int64_t l, k;
        comm_split(cols, cm->size, r, &l, &k);
        for (int i = 0; i < rows; i++, src += k) memcpy(out + (size_t)i * cols + l, src, (size_t)k * sizeof *out);
    }
    rc = c->ops->upload(c, x, out, n_all * sizeof *out);
    return rc ? rc : backend_sync(c);
}

int comm_gather_cols(struct comm *cm, struct backend_ctx *c, float *x, int rows, int64_t cols) {
    if (!cm || cm->size == 1) return 0;
    if (comm_failed(cm)) return KVLLM_ECOMM;
    const double t0 = time_now();
    int rc = gather_cols(cm, c, x, rows, cols);
    if (!rc) {
        int64_t lo, cnt;
        comm_split(cols, cm->size, cm->rank, &lo, &cnt);
        count(cm, COMM_GATHER, t0, cm->rank ? 0 : (size_t)rows * (size_t)(cols - cnt) * sizeof *x);
    }
    return rc;
}
