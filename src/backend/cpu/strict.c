/* strict.c — the strict backend: the CPU kernels behind a wall.  Every
 * buffer it allocates, and its copy of the weights, is its own mapping,
 * PROT_NONE except while an op, upload or download runs.  Engine or model
 * code that reads or writes backend memory directly — as it could not on a
 * GPU — therefore crashes at once, which is how the suite proves the
 * interface device-clean without a device (backend "strict"; the CLI's KVLLM_BACKEND=strict).
 *
 * One mutex holds the wall open for one op at a time across every context
 * of the backend (several engines may share it), so ops of different
 * engines serialize; this is a test backend, not a fast one. */
#include "backend/cpu/cpu_internal.h"
#include "core/core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Regions are whole 2 MiB huge pages where the kernel gives them
 * (MADV_HUGEPAGE): toggling a region's protection then rewrites one entry
 * per 2 MiB instead of one per 4 KiB, which keeps a step's few hundred
 * toggles of the weights cheap. */
#define HUGE_PAGE ((size_t)2 << 20)

static size_t page_round(size_t n) { return (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE; }

static void protect_all(struct cpu_backend *b, int prot) {
    for (int i = 0; i < b->n_regions; i++)
        if (mprotect(b->regions[i].p, b->regions[i].n, prot) != 0)
            KV_ASSERT(!"strict backend: mprotect failed");
}

static void wall_open(struct cpu_backend *b) {
    pthread_mutex_lock(&b->wall_mu);
    protect_all(b, PROT_READ | PROT_WRITE);
}

static void wall_close(struct cpu_backend *b) {
    protect_all(b, PROT_NONE);
    pthread_mutex_unlock(&b->wall_mu);
}

int cpu_wall_add(struct cpu_backend *b, void *p, size_t n) {
    pthread_mutex_lock(&b->wall_mu);
    int rc = 0;
    if (b->n_regions == b->cap_regions) {
        int cap = b->cap_regions ? 2 * b->cap_regions : 16;
        struct cpu_region *r = realloc(b->regions, (size_t)cap * sizeof *r);
        if (r) { b->regions = r; b->cap_regions = cap; } else rc = KVLLM_ENOMEM;
    }
    if (!rc) {
        b->regions[b->n_regions++] = (struct cpu_region){ p, n };
        if (mprotect(p, n, PROT_NONE) != 0) KV_ASSERT(!"strict backend: mprotect failed");
    }
    pthread_mutex_unlock(&b->wall_mu);
    return rc;
}

/* Unmap region p (NULL: every region left). */
void cpu_wall_remove(struct cpu_backend *b, void *p) {
    pthread_mutex_lock(&b->wall_mu);
    for (int i = 0; i < b->n_regions;) {
        if (p && b->regions[i].p != p) { i++; continue; }
        munmap(b->regions[i].p, b->regions[i].n);
        b->regions[i] = b->regions[--b->n_regions];
    }
    pthread_mutex_unlock(&b->wall_mu);
}

/* ---- memory ---- */

/* A zeroed region of page_round(bytes), aligned to HUGE_PAGE. */
static int strict_map(size_t bytes, void **out) {
    const size_t n = page_round(bytes ? bytes : 1);
    uint8_t *p = mmap(NULL, n + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        LOG_ERR("strict backend: cannot map %zu bytes: %s", bytes, strerror(errno));
        return KVLLM_ENOMEM;
    }
    /* trim to an aligned run of n bytes */
    const size_t lead = (HUGE_PAGE - (uintptr_t)p % HUGE_PAGE) % HUGE_PAGE;
    if (lead) munmap(p, lead);
    if (HUGE_PAGE - lead) munmap(p + lead + n, HUGE_PAGE - lead);
    p += lead;
    madvise(p, n, MADV_HUGEPAGE);   /* a hint: without huge pages it is only slower */
    *out = p;
    return 0;
}

static int strict_buf_alloc(struct backend *be, size_t bytes, struct backend_buf *out) {
    memset(out, 0, sizeof *out);
    void *p;
    int rc = strict_map(bytes, &p);
    if (rc) return rc;
    if ((rc = cpu_wall_add(cpu_backend_of(be), p, page_round(bytes ? bytes : 1)))) {
        munmap(p, page_round(bytes ? bytes : 1));
        return rc;
    }
    out->data = p;
    out->size = bytes;
    return 0;
}

static void strict_buf_free(struct backend *be, struct backend_buf *b) {
    if (!b || !b->data) return;
    cpu_wall_remove(cpu_backend_of(be), b->data);
    memset(b, 0, sizeof *b);
}

/* The weights are copied into one region of their own, so that nothing
 * outside an op can read them either. */
static int strict_place_weights(struct backend *be, struct tensor *const *ts, int n, const struct place_copied *copied,
                                uint64_t *placed) {
    uint64_t total = 0;
    for (int i = 0; i < n; i++)
        if (ts[i]->data) total += ((uint64_t)ts[i]->ne1 * ts[i]->row_bytes + 63) / 64 * 64;
    *placed = total;
    if (!total) return 0;
    if (total > SIZE_MAX / 2) return KVLLM_ERANGE;
    void *p;
    int rc = strict_map((size_t)total, &p);
    if (rc) return rc;
    uint8_t *at = p;
    for (int i = 0; i < n; i++) {
        if (!ts[i]->data) continue;
        size_t bytes = (size_t)ts[i]->ne1 * ts[i]->row_bytes;
        memcpy(at, ts[i]->data, bytes);
        place_copied_tell(copied, ts[i]->data, bytes);
        ts[i]->data = at;
        at += (bytes + 63) / 64 * 64;
    }
    if ((rc = cpu_wall_add(cpu_backend_of(be), p, page_round((size_t)total)))) munmap(p, page_round((size_t)total));
    return rc;
}

/* ---- everything else: the kernels, inside the wall ---- */

#define WALLED(op, params, args)                                   \
    static int strict_##op params {                                \
        struct cpu_backend *b = cpu_backend_of(c->be);             \
        wall_open(b);                                              \
        int rc = b->kernels.op args;                               \
        wall_close(b);                                             \
        return rc;                                                 \
    }

WALLED(upload, (struct backend_ctx *c, void *dst, const void *src, size_t n), (c, dst, src, n))
WALLED(download, (struct backend_ctx *c, void *dst, const void *src, size_t n), (c, dst, src, n))
WALLED(matmul, (struct backend_ctx *c, float *y, const struct tensor *w, const float *x, int n), (c, y, w, x, n))
WALLED(get_rows, (struct backend_ctx *c, float *y, const struct tensor *w, const int32_t *ids, int n),
       (c, y, w, ids, n))
WALLED(gather_rows, (struct backend_ctx *c, float *y, const float *x, const int32_t *ids, int n, int dim),
       (c, y, x, ids, n, dim))
WALLED(rmsnorm, (struct backend_ctx *c, float *y, const float *x, const struct tensor *w, int n, int dim, float eps),
       (c, y, x, w, n, dim, eps))
WALLED(layernorm, (struct backend_ctx *c, float *y, const float *x, const struct tensor *w, const struct tensor *bt,
                   int n, int dim, float eps), (c, y, x, w, bt, n, dim, eps))
WALLED(rope, (struct backend_ctx *c, float *x, int n, int n_head, int head_dim, const int32_t *pos,
              const struct rope_params *p), (c, x, n, n_head, head_dim, pos, p))
WALLED(add_bias, (struct backend_ctx *c, float *y, const struct tensor *bt, int n, int dim), (c, y, bt, n, dim))
WALLED(add, (struct backend_ctx *c, float *y, const float *x, long n), (c, y, x, n))
WALLED(swiglu, (struct backend_ctx *c, float *g, const float *u, long n), (c, g, u, n))
WALLED(gelu, (struct backend_ctx *c, float *x, long n), (c, x, n))
WALLED(geglu, (struct backend_ctx *c, float *g, const float *u, long n), (c, g, u, n))
WALLED(scale, (struct backend_ctx *c, float *x, long n, float s), (c, x, n, s))
WALLED(softcap, (struct backend_ctx *c, float *x, long n, float cap), (c, x, n, cap))
WALLED(moe_route, (struct backend_ctx *c, int32_t *ids, float *weights, const float *logits, int n, int n_expert,
                   int n_used, bool norm), (c, ids, weights, logits, n, n_expert, n_used, norm))
WALLED(moe, (struct backend_ctx *c, const struct moe_args *a), (c, a))
WALLED(kv_store, (struct backend_ctx *c, const struct kv_layer_view *kv, const int32_t *slots, const float *k,
                  const float *v, int n), (c, kv, slots, k, v, n))
WALLED(paged_attention, (struct backend_ctx *c, const struct paged_attn_args *a), (c, a))
WALLED(add_rmsnorm, (struct backend_ctx *c, float *y, float *x, const float *h, const struct tensor *w, int n, int dim,
                     float eps), (c, y, x, h, w, n, dim, eps))
WALLED(rope_kv_store, (struct backend_ctx *c, const struct rope_kv_args *a), (c, a))
WALLED(matmuls, (struct backend_ctx *c, const struct matmuls_args *a), (c, a))
WALLED(argmax, (struct backend_ctx *c, int32_t *ids, const float *x, int n, int dim), (c, ids, x, n, dim))
WALLED(sample, (struct backend_ctx *c, const struct sample_args *a), (c, a))
WALLED(copy_blocks, (struct backend_ctx *c, const struct kv_layer_view *layers, int n_layer,
                     const int32_t (*pairs)[2], int n), (c, layers, n_layer, pairs, n))
WALLED(kv_shift, (struct backend_ctx *c, const struct kv_layer_view *layers, int n_layer, const int32_t *src,
                  const int32_t *dst, int n, int delta, const struct rope_params *p),
       (c, layers, n_layer, src, dst, n, delta, p))

void cpu_strict_ops(struct cpu_backend *b) {
    struct backend_ops *o = &b->ops;
    snprintf(b->name, sizeof b->name, "strict/%s", b->kernels.name);
    o->name = b->name;
    o->buf_alloc = strict_buf_alloc;
    o->buf_free = strict_buf_free;
    o->place_weights = strict_place_weights;
    o->upload = strict_upload;
    o->download = strict_download;
    o->matmul = strict_matmul;
    o->get_rows = strict_get_rows;
    o->gather_rows = strict_gather_rows;
    o->rmsnorm = strict_rmsnorm;
    o->layernorm = strict_layernorm;
    o->rope = strict_rope;
    o->add_bias = strict_add_bias;
    o->add = strict_add;
    o->swiglu = strict_swiglu;
    o->gelu = strict_gelu;
    o->geglu = strict_geglu;
    o->scale = strict_scale;
    o->softcap = strict_softcap;
    o->moe_route = strict_moe_route;
    o->moe = strict_moe;
    o->kv_store = strict_kv_store;
    o->paged_attention = strict_paged_attention;
    o->add_rmsnorm = strict_add_rmsnorm;
    o->rope_kv_store = strict_rope_kv_store;
    o->matmuls = strict_matmuls;
    o->copy_blocks = strict_copy_blocks;
    o->argmax = strict_argmax;
    o->sample = strict_sample;
    o->kv_shift = strict_kv_shift;
}
