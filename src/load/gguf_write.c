/* gguf_write.c — serialize a struct gguf as GGUF v3: header, metadata,
 * tensor infos (offsets recomputed, aligned), padding, tensor data.  The
 * bytes go to a temporary file renamed over the target only when complete
 * (out_file in core.h), so the target may even be the file g maps. */
#include "load/gguf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

struct writer { FILE *f; bool ok; };

static void w_bytes(struct writer *w, const void *p, size_t n) {
    if (w->ok && n && fwrite(p, 1, n, w->f) != n) w->ok = false;
}
static void w_u32(struct writer *w, uint32_t v) { w_bytes(w, &v, 4); }
static void w_u64(struct writer *w, uint64_t v) { w_bytes(w, &v, 8); }
static void w_str(struct writer *w, struct gguf_str s) { w_u64(w, s.len); w_bytes(w, s.ptr, (size_t)s.len); }

static void w_scalar(struct writer *w, enum gguf_vtype t, const struct gguf_kv *kv) {
    switch (t) {
    case GGUF_T_UINT8: case GGUF_T_BOOL: { uint8_t x = (uint8_t)kv->v.u64; w_bytes(w, &x, 1); break; }
    case GGUF_T_INT8:   { int8_t x = (int8_t)kv->v.i64; w_bytes(w, &x, 1); break; }
    case GGUF_T_UINT16: { uint16_t x = (uint16_t)kv->v.u64; w_bytes(w, &x, 2); break; }
    case GGUF_T_INT16:  { int16_t x = (int16_t)kv->v.i64; w_bytes(w, &x, 2); break; }
    case GGUF_T_UINT32: { uint32_t x = (uint32_t)kv->v.u64; w_bytes(w, &x, 4); break; }
    case GGUF_T_INT32:  { int32_t x = (int32_t)kv->v.i64; w_bytes(w, &x, 4); break; }
    case GGUF_T_FLOAT32:{ float x = (float)kv->v.f64; w_bytes(w, &x, 4); break; }
    case GGUF_T_UINT64: w_u64(w, kv->v.u64); break;
    case GGUF_T_INT64:  { int64_t x = kv->v.i64; w_bytes(w, &x, 8); break; }
    case GGUF_T_FLOAT64:{ double x = kv->v.f64; w_bytes(w, &x, 8); break; }
    default: w->ok = false; break;
    }
}

static const uint8_t k_size[GGUF_T_COUNT_] = {
    [GGUF_T_UINT8] = 1, [GGUF_T_INT8] = 1, [GGUF_T_UINT16] = 2, [GGUF_T_INT16] = 2,
    [GGUF_T_UINT32] = 4, [GGUF_T_INT32] = 4, [GGUF_T_FLOAT32] = 4, [GGUF_T_BOOL] = 1,
    [GGUF_T_UINT64] = 8, [GGUF_T_INT64] = 8, [GGUF_T_FLOAT64] = 8,
};

static void w_kv(struct writer *w, const struct gguf_kv *kv) {
    w_str(w, kv->key);
    w_u32(w, kv->type);
    if (kv->type == GGUF_T_STRING) { w_str(w, kv->v.str); return; }
    if (kv->type != GGUF_T_ARRAY) { w_scalar(w, kv->type, kv); return; }
    w_u32(w, kv->v.arr.type);
    w_u64(w, kv->v.arr.n);
    if (kv->v.arr.type == GGUF_T_STRING) {
        for (uint64_t i = 0; i < kv->v.arr.n; i++) w_str(w, kv->v.arr.strs[i]);
    } else if (kv->v.arr.type == GGUF_T_ARRAY) {
        w->ok = false; /* nested arrays are never built */
    } else {
        w_bytes(w, kv->v.arr.data, (size_t)(kv->v.arr.n * k_size[kv->v.arr.type]));
    }
}

static void w_pad(struct writer *w, uint64_t *off, uint64_t align) {
    static const uint8_t zeros[256];
    uint64_t pad = (align - *off % align) % align;
    while (pad) {
        size_t n = pad > sizeof zeros ? sizeof zeros : (size_t)pad;
        w_bytes(w, zeros, n);
        pad -= n;
        *off += n;
    }
}

int gguf_write(const struct gguf *g, const char *path) {
    uint64_t align = GGUF_DEFAULT_ALIGNMENT;
    uint32_t a;
    if (gguf_get_u32(g, "general.alignment", &a) == 0 && a && !(a & (a - 1))) align = a;

    struct out_file of;
    int rc = out_file_open(&of, path);
    if (rc) return rc;
    FILE *f = of.f;
    struct writer w = { f, true };
    w_bytes(&w, "GGUF", 4);
    w_u32(&w, 3);
    w_u64(&w, g->n_tensors);
    w_u64(&w, g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) w_kv(&w, &g->kv[i]);
    uint64_t data_off = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct gguf_tensor *t = &g->tensors[i];
        w_str(&w, t->name);
        w_u32(&w, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) w_u64(&w, (uint64_t)t->ne[d]);
        w_u32(&w, t->type);
        w_u64(&w, data_off);
        data_off += (t->n_bytes + align - 1) / align * align;
    }
    long pos = ftell(f);
    uint64_t off = pos < 0 ? 0 : (uint64_t)pos;
    w_pad(&w, &off, align);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        w_bytes(&w, g->tensors[i].data, (size_t)g->tensors[i].n_bytes);
        off += g->tensors[i].n_bytes;
        w_pad(&w, &off, align);
    }
    if (!w.ok) {
        LOG_ERR("%s: write failed: %s", path, strerror(errno));
        out_file_abort(&of); /* the target, if any, is untouched */
        return KVLLM_EIO;
    }
    return out_file_commit(&of);
}
