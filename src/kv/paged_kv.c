/* paged_kv.c — the KV storage: one zeroed backend buffer holding, for
 * every layer in turn, K data, V data, and (8-bit types) K scales and V
 * scales, each sub-array starting on a 64-byte boundary (buffers are
 * 64-byte aligned).  Views in `layers` point into it; the block pool decides
 * which blocks hold what. */
#include "kv/paged_kv.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

#define KV_ALIGN 64

static const char *const k_names[KV_TYPE_COUNT_] = {
    [KV_F32] = "f32", [KV_F16] = "f16", [KV_BF16] = "bf16", [KV_INT8] = "int8", [KV_FP8] = "fp8",
};

static bool has_scales(enum kv_type t) { return t == KV_INT8 || t == KV_FP8; }

const char *kv_type_name(enum kv_type t) {
    return (unsigned)t < KV_TYPE_COUNT_ ? k_names[t] : "?";
}

int kv_type_parse(const char *name) {
    if (!name) return -1;
    for (int t = 0; t < KV_TYPE_COUNT_; t++)
        if (strcmp(name, k_names[t]) == 0) return t;
    return -1;
}

uint64_t paged_kv_bytes_per_token(enum kv_type type, int n_layer, int n_head_kv, int head_dim) {
    uint64_t per_head = (uint64_t)head_dim * kv_elem_bytes(type) + (has_scales(type) ? 4 : 0);
    return 2 * (uint64_t)n_layer * (uint64_t)n_head_kv * per_head;
}

static uint64_t round_up(uint64_t x) { return (x + KV_ALIGN - 1) / KV_ALIGN * KV_ALIGN; }

/* Per layer: rows = positions * heads; data = rows * head_dim * elem;
 * scales = rows * 4 (8-bit types); every sub-array rounded up to 64. */
static bool layout(enum kv_type type, int n_layer, int n_blocks, int block_size, int n_head_kv, int head_dim,
                   uint64_t *data, uint64_t *scales, uint64_t *total) {
    uint64_t pos, rows, elems, layer;
    *scales = 0;
    bool ok = ckd_mul_u64(&pos, (uint64_t)n_blocks, (uint64_t)block_size) && pos <= INT32_MAX &&
              ckd_mul_u64(&rows, pos, (uint64_t)n_head_kv) &&
              ckd_mul_u64(&elems, rows, (uint64_t)head_dim) &&
              ckd_mul_u64(data, elems, kv_elem_bytes(type)) && *data <= UINT64_MAX - KV_ALIGN &&
              (!has_scales(type) || (ckd_mul_u64(scales, rows, 4) && *scales <= UINT64_MAX - KV_ALIGN));
    if (!ok) return false;
    *data = round_up(*data);
    *scales = round_up(*scales);
    return ckd_add_u64(&layer, *data, *data) && ckd_add_u64(&layer, layer, 2 * *scales) &&
           ckd_mul_u64(total, layer, (uint64_t)n_layer) && *total <= SIZE_MAX - KV_ALIGN;
}

uint64_t paged_kv_bytes(enum kv_type type, int n_layer, int n_blocks, int block_size, int n_head_kv, int head_dim) {
    uint64_t data, scales, total;
    return layout(type, n_layer, n_blocks, block_size, n_head_kv, head_dim, &data, &scales, &total) ? total : 0;
}

int paged_kv_init(struct paged_kv *c, struct backend *be, enum kv_type type, int n_layer, int n_blocks,
                  int block_size, int n_head_kv, int head_dim) {
    memset(c, 0, sizeof *c);
    if ((unsigned)type >= KV_TYPE_COUNT_ || n_layer <= 0 || n_blocks <= 0 || block_size <= 0 ||
        n_head_kv <= 0 || head_dim <= 0) {
        LOG_ERR("%s: bad shape (type %d, %d layers, %d blocks of %d, %d kv heads of %d)", __func__,
                (int)type, n_layer, n_blocks, block_size, n_head_kv, head_dim);
        return KVLLM_EINVAL;
    }
    uint64_t data, scales, total;
    if (!layout(type, n_layer, n_blocks, block_size, n_head_kv, head_dim, &data, &scales, &total)) {
        LOG_ERR("%s: KV storage of %d layers x %d blocks x %d positions x %d heads x %d does not fit",
                __func__, n_layer, n_blocks, block_size, n_head_kv, head_dim);
        return KVLLM_ERANGE;
    }
    c->be = be;
    c->layers = calloc((size_t)n_layer, sizeof *c->layers);
    int rc = c->layers ? be->ops->buf_alloc(be, (size_t)total, &c->mem) : KVLLM_ENOMEM;
    if (rc) {
        LOG_ERR("%s: out of memory allocating %llu bytes of KV storage (%s, %d layers, %d blocks of %d)",
                __func__, (unsigned long long)total, kv_type_name(type), n_layer, n_blocks, block_size);
        paged_kv_deinit(c);
        return KVLLM_ENOMEM;
    }
    c->type = type;
    c->n_layer = n_layer;
    c->n_blocks = n_blocks;
    c->block_size = block_size;
    c->n_head_kv = n_head_kv;
    c->head_dim = head_dim;
    uint8_t *p = c->mem.data;   /* addresses only: never dereferenced here */
    for (int il = 0; il < n_layer; il++) {
        struct kv_layer_view *l = &c->layers[il];
        l->type = type;
        l->block_size = block_size;
        l->n_head_kv = n_head_kv;
        l->head_dim = head_dim;
        l->k = p; p += data;
        l->v = p; p += data;
        if (has_scales(type)) {
            l->k_scale = (float *)(void *)p; p += scales;
            l->v_scale = (float *)(void *)p; p += scales;
        }
    }
    return 0;
}

void paged_kv_deinit(struct paged_kv *c) {
    if (!c) return;
    if (c->be) c->be->ops->buf_free(c->be, &c->mem);
    free(c->layers);
    memset(c, 0, sizeof *c);
}
