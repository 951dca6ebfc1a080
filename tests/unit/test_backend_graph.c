/* test_backend_graph.c — a recorded op list (graph.h) replays to exactly
 * what the same ops issued directly compute: a chain of ops (matmul on a
 * placed quantized weight, norm, RoPE, element-wise ops, argmax) run
 * directly, then recorded (nothing computed while recording) and
 * replayed on the same inputs, outputs compared byte for byte; on the
 * strict backend too (KVLLM_BACKEND=strict).  Also: the recorder mirrors
 * which optional ops the real context has, refuses what no record holds
 * (a transfer, a wait), reports a list past its capacity, and a replay
 * passes its own ctx_hi to paged attention, never the recording's. */
#include "check.h"
#include "be_util.h"
#include "backend/graph.h"

#include <stdlib.h>
#include <string.h>

enum { N = 5, K = 64, M = 96, HEADS = 6, HD = 16 };   /* M = HEADS * HD */

struct bufs { float *x, *y, *z; int32_t *pos, *ids; };

/* The chain: what a forward does, in miniature. */
static int chain(struct backend_ctx *c, const struct bufs *b, const struct tensor *w, const struct tensor *nw,
                 const struct rope_params *rp) {
    int rc = BE_OP(c, matmul, b->y, w, b->x, N);
    if (!rc) rc = BE_OP(c, rmsnorm, b->z, b->y, nw, N, M, 1e-6f);
    if (!rc) rc = BE_OP(c, rope, b->z, N, HEADS, HD, b->pos, rp);
    if (!rc) rc = BE_OP(c, add, b->z, b->y, (long)N * M);
    if (!rc) rc = BE_OP(c, softcap, b->z, (long)N * M, 3.0f);
    if (!rc) rc = BE_OP(c, swiglu, b->y, b->z, (long)N * M);
    if (!rc) rc = BE_OP(c, scale, b->y, (long)N * M, 0.5f);
    if (!rc) rc = BE_OP(c, argmax, b->ids, b->y, N, M);
    return rc;
}
#define CHAIN_OPS 8

/* ---- ctx_hi at replay: a fake context that notes what paged attention was given ---- */
static int g_seen_ctx_hi;
static int fake_attn(struct backend_ctx *c, const struct paged_attn_args *a) {
    g_seen_ctx_hi = a->ctx_hi;
    return 0;
}

static void test_ctx_hi_and_limits(void) {
    static const struct backend_ops ops = { .name = "fake", .paged_attention = fake_attn };
    struct backend_ctx real = { .ops = &ops };
    struct graph_recorder r;
    graph_recorder_init(&r, &real);
    CHECK(r.ops.paged_attention && !r.ops.matmul && !r.ops.moe && !r.ops.graph_compute);   /* mirrors real */
    struct graph g;
    CHECK(graph_init(&g, 2) == 0);
    graph_record_begin(&r, &g);
    struct paged_attn_args a = { .n_tokens = 1, .ctx_hi = 7 };
    CHECK(BE_OP(&r.base, paged_attention, &a) == 0);
    CHECK(graph_record_end(&r, 0) == 0 && g.n == 1);
    CHECK(graph_replay(&real, &g, 123) == 0 && g_seen_ctx_hi == 123);
    CHECK(graph_compute(&real, &g, 5) == 0 && g_seen_ctx_hi == 5);
    /* past the capacity: counted, refused */
    graph_record_begin(&r, &g);
    for (int i = 0; i < 3; i++) BE_OP(&r.base, paged_attention, &a);
    CHECK(graph_recorded(&r) == 3 && graph_record_end(&r, 0) == KVLLM_ERANGE);
    graph_deinit(&g);
    graph_deinit(&g);   /* NULL-safe and idempotent on a deinited graph */
}

static void test_replay_equals_direct(bool strict) {
    struct backend_ctx *c = tb_new(NULL, strict, BACKEND_ACT_Q8, 2, K > M ? K : M, N, 64, HEADS, HD);
    CHECK(c != NULL);
    if (!c) return;
    struct backend *be = c->be;
    struct rng rg;
    rng_seed(&rg, 11);
    struct tensor w = tb_weight(&rg, DTYPE_Q8_0, K, M, true), nw = tb_weight(&rg, DTYPE_F32, M, 1, false);
    void *w_host = (void *)w.data, *nw_host = (void *)nw.data;   /* tb_weight gave them to us */
    struct tensor *ts[2] = { &w, &nw };
    uint64_t placed = 0;
    CHECK(be->ops->place_weights(be, ts, 2, NULL, &placed) == 0);
    const struct rope_params rp = { .n_rot = HD, .theta = 10000.0f, .neox = true };

    struct backend_buf buf;
    const size_t fl = (size_t)N * M;
    CHECK(be->ops->buf_alloc(be, (N * K + 2 * fl) * sizeof(float) + 2 * N * sizeof(int32_t), &buf) == 0);
    struct bufs b = { .x = buf.data };
    b.y = b.x + N * K;
    b.z = b.y + fl;
    b.pos = (int32_t *)(b.z + fl);
    b.ids = b.pos + N;
    float hx[N * K];
    int32_t hpos[N] = { 0, 1, 2, 7, 30 };
    for (int i = 0; i < N * K; i++) hx[i] = rng_f32(&rg) * 2 - 1;
    float *out1 = tu_xnew(2 * fl * sizeof(float)), *out2 = tu_xnew(2 * fl * sizeof(float));
    int32_t ids1[N], ids2[N];

    /* inputs in, outputs zeroed */
#define RESET() do { \
        float *zero = tu_xnew(2 * fl * sizeof(float)); \
        CHECK(c->ops->upload(c, b.x, hx, sizeof hx) == 0 && c->ops->upload(c, b.pos, hpos, sizeof hpos) == 0); \
        CHECK(c->ops->upload(c, b.y, zero, 2 * fl * sizeof(float)) == 0); \
        free(zero); \
    } while (0)
    RESET();
    CHECK(chain(c, &b, &w, &nw, &rp) == 0 && backend_sync(c) == 0);
    CHECK(c->ops->download(c, out1, b.y, 2 * fl * sizeof(float)) == 0);
    CHECK(c->ops->download(c, ids1, b.ids, sizeof ids1) == 0 && backend_sync(c) == 0);

    RESET();
    struct graph_recorder r;
    graph_recorder_init(&r, c);
    struct graph g;
    CHECK(graph_init(&g, CHAIN_OPS) == 0);
    graph_record_begin(&r, &g);
    CHECK(graph_record_end(&r, chain(&r.base, &b, &w, &nw, &rp)) == 0 && g.n == CHAIN_OPS);
    /* recording computed nothing: the outputs are still zero */
    CHECK(c->ops->download(c, out2, b.y, 2 * fl * sizeof(float)) == 0 && backend_sync(c) == 0);
    int nonzero = 0;
    for (size_t i = 0; i < 2 * fl; i++) nonzero += out2[i] != 0.0f;
    CHECK(nonzero == 0);
    for (int rep = 0; rep < 2; rep++) {   /* a graph replays any number of times */
        RESET();
        CHECK(graph_compute(c, &g, 31) == 0 && backend_sync(c) == 0);
        CHECK(c->ops->download(c, out2, b.y, 2 * fl * sizeof(float)) == 0);
        CHECK(c->ops->download(c, ids2, b.ids, sizeof ids2) == 0 && backend_sync(c) == 0);
        CHECK_MSG(memcmp(out1, out2, 2 * fl * sizeof(float)) == 0, "replay %d differs from the direct ops", rep);
        CHECK(memcmp(ids1, ids2, sizeof ids1) == 0);
    }
    /* a failure injected into the n-th op hits the n-th replayed op, as for direct ops */
    c->fail_after = 3;
    c->fail_code = KVLLM_EBACKEND;
    CHECK(graph_compute(c, &g, 31) == KVLLM_EBACKEND && backend_sync(c) == KVLLM_EBACKEND);
    /* what a recording cannot hold */
    graph_record_begin(&r, &g);
    CHECK(r.ops.upload(&r.base, b.x, hx, 4) == KVLLM_EUNSUPPORTED);
    CHECK(graph_record_end(&r, 0) == KVLLM_EUNSUPPORTED);
#undef RESET
    graph_deinit(&g);
    free(out1);
    free(out2);
    be->ops->buf_free(be, &buf);
    tb_free(c);
    free(w_host);
    free(nw_host);
}

int main(void) {
    test_ctx_hi_and_limits();
    const char *bk = getenv("KVLLM_BACKEND");
    test_replay_equals_direct(bk && strcmp(bk, "strict") == 0);
    return check_report("test_backend_graph");
}
