/* gguf.c — GGUF reader over mmap, lookups, and the in-memory builder.
 *
 * Reading: a cursor walks the header, metadata and tensor infos; every read
 * is bounds-checked against the mapping and every size is computed with
 * overflow checks before a pointer is formed.  Any failure logs
 * "<path>: <problem> (offset N)" once and unwinds everything. */
#include "load/gguf.h"
#include "tensor/dtype.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena: owned copies for built values ---- */

struct gguf_arena { struct gguf_arena *next; max_align_t data[]; };

static void *arena_alloc(struct gguf *g, size_t n) {
    struct gguf_arena *a = malloc(sizeof *a + (n ? n : 1));
    if (!a) { LOG_ERR("out of memory (%zu bytes)", n); return NULL; }
    a->next = g->arena;
    g->arena = a;
    return a->data;
}

void *gguf_alloc(struct gguf *g, size_t n) { return arena_alloc(g, n); }

static const char *arena_strdup(struct gguf *g, const char *s, size_t n) {
    char *p = arena_alloc(g, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ---- reading ---- */

struct cursor {
    const uint8_t *p;
    uint64_t size, off;
    const char *path;
};

#define FAIL(c, code, ...) do { fail_at((c), __VA_ARGS__); return (code); } while (0)

__attribute__((format(printf, 2, 3)))
static void fail_at(const struct cursor *c, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    LOG_ERR("%s: %s (offset %llu)", c->path, msg, (unsigned long long)c->off);
}

static int rd(struct cursor *c, void *dst, uint64_t n, const char *what) {
    if (n > c->size - c->off) FAIL(c, KVLLM_EFORMAT, "file truncated while reading %s", what);
    memcpy(dst, c->p + c->off, n);
    c->off += n;
    return 0;
}

static int rd_u32(struct cursor *c, uint32_t *v, const char *what) { return rd(c, v, 4, what); }
static int rd_u64(struct cursor *c, uint64_t *v, const char *what) { return rd(c, v, 8, what); }

static int rd_str(struct cursor *c, struct gguf_str *s, const char *what) {
    uint64_t n;
    int rc = rd_u64(c, &n, what);
    if (rc) return rc;
    if (n > c->size - c->off)
        FAIL(c, KVLLM_EFORMAT, "%s: string length %llu runs past end of file (size %llu)", what,
             (unsigned long long)n, (unsigned long long)c->size);
    s->ptr = (const char *)c->p + c->off;
    s->len = n;
    c->off += n;
    return 0;
}

static const uint8_t k_vsize[GGUF_T_COUNT_] = {
    [GGUF_T_UINT8] = 1, [GGUF_T_INT8] = 1, [GGUF_T_UINT16] = 2, [GGUF_T_INT16] = 2,
    [GGUF_T_UINT32] = 4, [GGUF_T_INT32] = 4, [GGUF_T_FLOAT32] = 4, [GGUF_T_BOOL] = 1,
    [GGUF_T_UINT64] = 8, [GGUF_T_INT64] = 8, [GGUF_T_FLOAT64] = 8,
};

/* Read a scalar of fixed-size type t into kv->v. */
static void decode_scalar(enum gguf_vtype t, const uint8_t *b, struct gguf_kv *kv) {
    switch (t) {
    case GGUF_T_UINT8:  kv->v.u64 = b[0]; break;
    case GGUF_T_BOOL:   kv->v.u64 = b[0] != 0; break;
    case GGUF_T_INT8:   kv->v.i64 = (int8_t)b[0]; break;
    case GGUF_T_UINT16: { uint16_t x; memcpy(&x, b, 2); kv->v.u64 = x; break; }
    case GGUF_T_INT16:  { int16_t x; memcpy(&x, b, 2); kv->v.i64 = x; break; }
    case GGUF_T_UINT32: { uint32_t x; memcpy(&x, b, 4); kv->v.u64 = x; break; }
    case GGUF_T_INT32:  { int32_t x; memcpy(&x, b, 4); kv->v.i64 = x; break; }
    case GGUF_T_FLOAT32:{ float x; memcpy(&x, b, 4); kv->v.f64 = x; break; }
    case GGUF_T_UINT64: { uint64_t x; memcpy(&x, b, 8); kv->v.u64 = x; break; }
    case GGUF_T_INT64:  { int64_t x; memcpy(&x, b, 8); kv->v.i64 = x; break; }
    case GGUF_T_FLOAT64:{ double x; memcpy(&x, b, 8); kv->v.f64 = x; break; }
    default: break;
    }
}

/* Skip (validate) an array body of element type t, count n; depth limits nesting. */
static int skip_array(struct cursor *c, enum gguf_vtype t, uint64_t n, int depth) {
    if (depth > 8) FAIL(c, KVLLM_EFORMAT, "arrays nested too deeply");
    if (t == GGUF_T_STRING) {
        for (uint64_t i = 0; i < n; i++) {
            struct gguf_str s;
            int rc = rd_str(c, &s, "array string");
            if (rc) return rc;
        }
        return 0;
    }
    if (t == GGUF_T_ARRAY) {
        for (uint64_t i = 0; i < n; i++) {
            uint32_t et;
            uint64_t en;
            int rc = rd_u32(c, &et, "nested array type");
            if (!rc) rc = rd_u64(c, &en, "nested array length");
            if (rc) return rc;
            if (et >= GGUF_T_COUNT_) FAIL(c, KVLLM_EFORMAT, "unknown metadata type %u", et);
            if ((rc = skip_array(c, (enum gguf_vtype)et, en, depth + 1))) return rc;
        }
        return 0;
    }
    uint64_t bytes;
    if (!ckd_mul_u64(&bytes, n, k_vsize[t]) || bytes > c->size - c->off)
        FAIL(c, KVLLM_EFORMAT, "array of %llu elements runs past end of file", (unsigned long long)n);
    c->off += bytes;
    return 0;
}

static int read_kv(struct cursor *c, struct gguf *g, struct gguf_kv *kv) {
    int rc = rd_str(c, &kv->key, "metadata key");
    if (rc) return rc;
    uint32_t t;
    if ((rc = rd_u32(c, &t, "metadata type"))) return rc;
    if (t >= GGUF_T_COUNT_)
        FAIL(c, KVLLM_EFORMAT, "key '%.*s': unknown metadata type %u", (int)kv->key.len, kv->key.ptr, t);
    kv->type = (enum gguf_vtype)t;
    if (t == GGUF_T_STRING) return rd_str(c, &kv->v.str, "metadata string");
    if (t != GGUF_T_ARRAY) {
        uint8_t b[8];
        if ((rc = rd(c, b, k_vsize[t], "metadata value"))) return rc;
        decode_scalar(kv->type, b, kv);
        return 0;
    }
    uint32_t et;
    uint64_t n;
    if ((rc = rd_u32(c, &et, "array type")) || (rc = rd_u64(c, &n, "array length"))) return rc;
    if (et >= GGUF_T_COUNT_)
        FAIL(c, KVLLM_EFORMAT, "key '%.*s': unknown array element type %u", (int)kv->key.len, kv->key.ptr, et);
    kv->v.arr.type = (enum gguf_vtype)et;
    kv->v.arr.n = n;
    kv->v.arr.data = c->p + c->off;
    if (et == GGUF_T_STRING) {
        /* every string needs at least its 8-byte length: bound n before allocating */
        if (n > (c->size - c->off) / 8)
            FAIL(c, KVLLM_EFORMAT, "key '%.*s': %llu strings cannot fit in the file", (int)kv->key.len,
                 kv->key.ptr, (unsigned long long)n);
        kv->v.arr.strs = arena_alloc(g, (size_t)n * sizeof(struct gguf_str));
        if (!kv->v.arr.strs) return KVLLM_ENOMEM;
        for (uint64_t i = 0; i < n; i++)
            if ((rc = rd_str(c, &kv->v.arr.strs[i], "array string"))) return rc;
        return 0;
    }
    return skip_array(c, kv->v.arr.type, n, 0);
}

static int read_tensor_info(struct cursor *c, struct gguf_tensor *t) {
    int rc = rd_str(c, &t->name, "tensor name");
    if (rc || (rc = rd_u32(c, &t->n_dims, "tensor dims"))) return rc;
    const int nl = (int)(t->name.len > 64 ? 64 : t->name.len);
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        FAIL(c, KVLLM_EFORMAT, "tensor '%.*s': %u dimensions (1..4 allowed)", nl, t->name.ptr, t->n_dims);
    uint64_t n = 1;
    for (int i = 0; i < GGUF_MAX_DIMS; i++) t->ne[i] = 1;
    for (uint32_t i = 0; i < t->n_dims; i++) {
        uint64_t d;
        if ((rc = rd_u64(c, &d, "tensor shape"))) return rc;
        if (d == 0 || d > (uint64_t)INT64_MAX || !ckd_mul_u64(&n, n, d) || n > (uint64_t)INT64_MAX)
            FAIL(c, KVLLM_EFORMAT, "tensor '%.*s': absurd dimension %llu", nl, t->name.ptr, (unsigned long long)d);
        t->ne[i] = (int64_t)d;
    }
    t->n_elems = n;
    if ((rc = rd_u32(c, &t->type, "tensor type")) || (rc = rd_u64(c, &t->offset, "tensor offset"))) return rc;
    if (dtype_block_bytes(t->type) == 0)
        FAIL(c, KVLLM_EUNSUPPORTED, "tensor '%.*s': unknown tensor type %u", nl, t->name.ptr, t->type);
    uint64_t row;
    if (!dtype_row_bytes(t->type, (uint64_t)t->ne[0], &row) || !ckd_mul_u64(&t->n_bytes, row, n / (uint64_t)t->ne[0]))
        FAIL(c, KVLLM_EFORMAT, "tensor '%.*s': row of %lld elements does not fit type %s blocks", nl, t->name.ptr,
             (long long)t->ne[0], dtype_name(t->type));
    return 0;
}

static int parse(struct gguf *g, struct cursor *c) {
    char magic[4];
    int rc = rd(c, magic, 4, "magic");
    if (rc) return rc;
    if (memcmp(magic, "GGUF", 4) != 0) { c->off = 0; FAIL(c, KVLLM_EFORMAT, "not a GGUF file (bad magic)"); }
    if ((rc = rd_u32(c, &g->version, "version"))) return rc;
    if (g->version == 1) FAIL(c, KVLLM_EUNSUPPORTED, "GGUF version 1 is not supported (only 2 and 3)");
    if (g->version > 0xffff) FAIL(c, KVLLM_EUNSUPPORTED, "big-endian GGUF files are not supported");
    if (g->version != 2 && g->version != 3)
        FAIL(c, KVLLM_EUNSUPPORTED, "unsupported GGUF version %u (only 2 and 3)", g->version);
    if ((rc = rd_u64(c, &g->n_tensors, "tensor count")) || (rc = rd_u64(c, &g->n_kv, "metadata count"))) return rc;
    /* each kv takes >= 12 bytes and each tensor info >= 32: bound counts before allocating */
    uint64_t left = c->size - c->off;
    if (g->n_kv > left / 12) FAIL(c, KVLLM_EFORMAT, "metadata count %llu cannot fit in the file", (unsigned long long)g->n_kv);
    if (g->n_tensors > left / 32)
        FAIL(c, KVLLM_EFORMAT, "tensor count %llu cannot fit in the file", (unsigned long long)g->n_tensors);
    g->kv = xcalloc((size_t)g->n_kv, sizeof *g->kv);
    g->tensors = xcalloc((size_t)g->n_tensors, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return KVLLM_ENOMEM;
    g->cap_kv = g->n_kv;
    g->cap_tensors = g->n_tensors;
    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((rc = read_kv(c, g, &g->kv[i]))) return rc;

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *al = gguf_find(g, "general.alignment");
    if (al) {
        if (al->type != GGUF_T_UINT32 || al->v.u64 == 0 || (al->v.u64 & (al->v.u64 - 1)))
            FAIL(c, KVLLM_EFORMAT, "general.alignment must be a power-of-two uint32");
        g->alignment = al->v.u64;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((rc = read_tensor_info(c, &g->tensors[i]))) return rc;

    uint64_t data_off = (c->off + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors && data_off > c->size) FAIL(c, KVLLM_EFORMAT, "data section starts past end of file");
    g->data_offset = data_off;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        uint64_t start, end;
        const int nl = (int)(t->name.len > 64 ? 64 : t->name.len);
        if (t->offset % g->alignment)
            FAIL(c, KVLLM_EFORMAT, "tensor '%.*s': data offset %llu not aligned to %llu", nl, t->name.ptr,
                 (unsigned long long)t->offset, (unsigned long long)g->alignment);
        if (!ckd_add_u64(&start, data_off, t->offset) || !ckd_add_u64(&end, start, t->n_bytes) || end > c->size)
            FAIL(c, KVLLM_EFORMAT, "tensor '%.*s': data [%llu, +%llu bytes] runs past end of file (size %llu)", nl,
                 t->name.ptr, (unsigned long long)t->offset, (unsigned long long)t->n_bytes,
                 (unsigned long long)c->size);
        t->data = c->p + start;
        for (uint64_t j = 0; j < i; j++)
            if (g->tensors[j].name.len == t->name.len && !memcmp(g->tensors[j].name.ptr, t->name.ptr, t->name.len))
                FAIL(c, KVLLM_EFORMAT, "duplicate tensor name '%.*s'", nl, t->name.ptr);
    }
    return 0;
}

int gguf_open(const char *path, struct gguf **out) {
    *out = NULL;
    struct gguf *g = gguf_new(path);
    if (!g) return KVLLM_ENOMEM;
    int rc = file_map_open(&g->map, path);
    if (rc) { gguf_free(g); return rc; }
    free(g->kv);
    free(g->tensors);
    g->kv = NULL;
    g->tensors = NULL;
    g->cap_kv = g->cap_tensors = 0;
    struct cursor c = { g->map.data, g->map.size, 0, path };
    if ((rc = parse(g, &c))) { gguf_free(g); return rc; }
    *out = g;
    return 0;
}

bool gguf_is_gguf(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char m[4];
    bool ok = fread(m, 1, 4, f) == 4 && memcmp(m, "GGUF", 4) == 0;
    fclose(f);
    return ok;
}

struct gguf *gguf_new(const char *path) {
    struct gguf *g = xcalloc(1, sizeof *g);
    if (!g) return NULL;
    g->version = 3;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    g->path = arena_strdup(g, path ? path : "(memory)", strlen(path ? path : "(memory)"));
    if (!g->path) { free(g); return NULL; }
    return g;
}

void gguf_free(struct gguf *g) {
    if (!g) return;
    file_map_close(&g->map);
    free(g->kv);
    free(g->tensors);
    for (struct gguf_arena *a = g->arena, *n; a; a = n) { n = a->next; free(a); }
    free(g);
}

/* ---- lookups ---- */

bool gguf_str_eq(struct gguf_str s, const char *c) { return strlen(c) == s.len && !memcmp(s.ptr, c, s.len); }

const struct gguf_kv *gguf_find(const struct gguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (gguf_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (gguf_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static bool is_unsigned(enum gguf_vtype t) {
    return t == GGUF_T_UINT8 || t == GGUF_T_UINT16 || t == GGUF_T_UINT32 || t == GGUF_T_UINT64 || t == GGUF_T_BOOL;
}
static bool is_signed(enum gguf_vtype t) {
    return t == GGUF_T_INT8 || t == GGUF_T_INT16 || t == GGUF_T_INT32 || t == GGUF_T_INT64;
}

static int bad_type(const struct gguf *g, const char *key, const char *want) {
    LOG_ERR("%s: metadata key '%s' is not %s", g->path, key, want);
    return KVLLM_EFORMAT;
}

int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out) {
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv) return KVLLM_ENOTFOUND;
    if (is_unsigned(kv->type) && kv->v.u64 <= UINT32_MAX) { *out = (uint32_t)kv->v.u64; return 0; }
    if (is_signed(kv->type) && kv->v.i64 >= 0 && kv->v.i64 <= (int64_t)UINT32_MAX) { *out = (uint32_t)kv->v.i64; return 0; }
    if (is_unsigned(kv->type) || is_signed(kv->type)) {
        LOG_ERR("%s: metadata key '%s' = %lld is out of range", g->path, key,
                is_signed(kv->type) ? (long long)kv->v.i64 : (long long)kv->v.u64);
        return KVLLM_EFORMAT;
    }
    return bad_type(g, key, "an integer");
}

int gguf_get_f32(const struct gguf *g, const char *key, float *out) {
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv) return KVLLM_ENOTFOUND;
    if (kv->type == GGUF_T_FLOAT32 || kv->type == GGUF_T_FLOAT64) { *out = (float)kv->v.f64; return 0; }
    if (is_unsigned(kv->type)) { *out = (float)kv->v.u64; return 0; }
    if (is_signed(kv->type)) { *out = (float)kv->v.i64; return 0; }
    return bad_type(g, key, "a number");
}

int gguf_get_bool(const struct gguf *g, const char *key, bool *out) {
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv) return KVLLM_ENOTFOUND;
    if (kv->type != GGUF_T_BOOL) return bad_type(g, key, "a bool");
    *out = kv->v.u64 != 0;
    return 0;
}

int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out) {
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv) return KVLLM_ENOTFOUND;
    if (kv->type != GGUF_T_STRING) return bad_type(g, key, "a string");
    *out = kv->v.str;
    return 0;
}

int gguf_get_arr(const struct gguf *g, const char *key, enum gguf_vtype et, const struct gguf_kv **out) {
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv) return KVLLM_ENOTFOUND;
    if (kv->type != GGUF_T_ARRAY || kv->v.arr.type != et) {
        LOG_ERR("%s: metadata key '%s' is not an array of type %d", g->path, key, (int)et);
        return KVLLM_EFORMAT;
    }
    *out = kv;
    return 0;
}

int64_t gguf_arr_i64(const struct gguf_kv *kv, uint64_t i) {
    struct gguf_kv tmp = { .v.u64 = 0 };
    const uint8_t *b = (const uint8_t *)kv->v.arr.data + i * k_vsize[kv->v.arr.type];
    decode_scalar(kv->v.arr.type, b, &tmp);
    if (is_signed(kv->v.arr.type)) return tmp.v.i64;
    if (kv->v.arr.type == GGUF_T_FLOAT32 || kv->v.arr.type == GGUF_T_FLOAT64) {
        /* saturated: a float past int64's range (or NaN) has no int64 value (the cast is undefined) */
        const double d = tmp.v.f64;
        if (d != d) return 0;
        if (d >= 0x1p63) return INT64_MAX;
        if (d < -0x1p63) return INT64_MIN;
        return (int64_t)d;
    }
    return (int64_t)tmp.v.u64;
}

double gguf_arr_f64(const struct gguf_kv *kv, uint64_t i) {
    struct gguf_kv tmp = { .v.u64 = 0 };
    const uint8_t *b = (const uint8_t *)kv->v.arr.data + i * k_vsize[kv->v.arr.type];
    decode_scalar(kv->v.arr.type, b, &tmp);
    if (kv->v.arr.type == GGUF_T_FLOAT32 || kv->v.arr.type == GGUF_T_FLOAT64) return tmp.v.f64;
    if (is_signed(kv->v.arr.type)) return (double)tmp.v.i64;
    return (double)tmp.v.u64;
}

/* ---- building ---- */

/* Slot for key: the existing entry (replaced) or a new one. */
static struct gguf_kv *kv_slot(struct gguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (gguf_str_eq(g->kv[i].key, key)) return &g->kv[i];
    if (g->n_kv == g->cap_kv) {
        uint64_t cap = g->cap_kv ? 2 * g->cap_kv : 32;
        struct gguf_kv *n = realloc(g->kv, (size_t)cap * sizeof *n);
        if (!n) { LOG_ERR("out of memory"); return NULL; }
        g->kv = n;
        g->cap_kv = cap;
    }
    struct gguf_kv *kv = &g->kv[g->n_kv];
    memset(kv, 0, sizeof *kv);
    kv->key.ptr = arena_strdup(g, key, strlen(key));
    if (!kv->key.ptr) return NULL;
    kv->key.len = strlen(key);
    g->n_kv++;
    return kv;
}

static int set_scalar(struct gguf *g, const char *key, enum gguf_vtype t, const struct gguf_kv *val) {
    struct gguf_kv *kv = kv_slot(g, key);
    if (!kv) return KVLLM_ENOMEM;
    kv->type = t;
    kv->v = val->v;
    return 0;
}

int gguf_set_u32(struct gguf *g, const char *key, uint32_t v) {
    struct gguf_kv x = { .v.u64 = v };
    return set_scalar(g, key, GGUF_T_UINT32, &x);
}
int gguf_set_i32(struct gguf *g, const char *key, int32_t v) {
    struct gguf_kv x = { .v.i64 = v };
    return set_scalar(g, key, GGUF_T_INT32, &x);
}
int gguf_set_f32(struct gguf *g, const char *key, float v) {
    struct gguf_kv x = { .v.f64 = v };
    return set_scalar(g, key, GGUF_T_FLOAT32, &x);
}
int gguf_set_bool(struct gguf *g, const char *key, bool v) {
    struct gguf_kv x = { .v.u64 = v };
    return set_scalar(g, key, GGUF_T_BOOL, &x);
}

static int set_str_n(struct gguf *g, const char *key, const char *v, size_t n) {
    const char *copy = arena_strdup(g, v, n);
    if (!copy) return KVLLM_ENOMEM;
    struct gguf_kv x = { .v.str = { copy, n } };
    return set_scalar(g, key, GGUF_T_STRING, &x);
}
int gguf_set_str(struct gguf *g, const char *key, const char *v) { return set_str_n(g, key, v, strlen(v)); }

int gguf_set_arr(struct gguf *g, const char *key, enum gguf_vtype et, const void *data, uint64_t n) {
    KV_ASSERT(et < GGUF_T_COUNT_ && et != GGUF_T_STRING && et != GGUF_T_ARRAY);
    uint64_t bytes;
    if (!ckd_mul_u64(&bytes, n, k_vsize[et]) || bytes > SIZE_MAX / 2) return KVLLM_ERANGE;
    void *copy = arena_alloc(g, (size_t)bytes);
    if (!copy) return KVLLM_ENOMEM;
    if (bytes) memcpy(copy, data, (size_t)bytes);
    struct gguf_kv *kv = kv_slot(g, key);
    if (!kv) return KVLLM_ENOMEM;
    kv->type = GGUF_T_ARRAY;
    kv->v.arr.type = et;
    kv->v.arr.n = n;
    kv->v.arr.data = copy;
    kv->v.arr.strs = NULL;
    return 0;
}

int gguf_set_arr_str(struct gguf *g, const char *key, const struct gguf_str *strs, uint64_t n) {
    if (n > SIZE_MAX / sizeof(struct gguf_str)) return KVLLM_ERANGE;
    struct gguf_str *copy = arena_alloc(g, (size_t)n * sizeof *copy);
    if (!copy) return KVLLM_ENOMEM;
    for (uint64_t i = 0; i < n; i++) {
        copy[i].ptr = arena_strdup(g, strs[i].ptr, (size_t)strs[i].len);
        if (!copy[i].ptr) return KVLLM_ENOMEM;
        copy[i].len = strs[i].len;
    }
    struct gguf_kv *kv = kv_slot(g, key);
    if (!kv) return KVLLM_ENOMEM;
    kv->type = GGUF_T_ARRAY;
    kv->v.arr.type = GGUF_T_STRING;
    kv->v.arr.n = n;
    kv->v.arr.data = NULL;
    kv->v.arr.strs = copy;
    return 0;
}

int gguf_set_kv(struct gguf *g, const struct gguf_kv *src) {
    char key[256];
    if (src->key.len >= sizeof key) return KVLLM_ERANGE;
    memcpy(key, src->key.ptr, src->key.len);
    key[src->key.len] = 0;
    if (src->type == GGUF_T_STRING) return set_str_n(g, key, src->v.str.ptr, (size_t)src->v.str.len);
    if (src->type != GGUF_T_ARRAY) return set_scalar(g, key, src->type, src);
    if (src->v.arr.type == GGUF_T_STRING) return gguf_set_arr_str(g, key, src->v.arr.strs, src->v.arr.n);
    if (src->v.arr.type == GGUF_T_ARRAY) return KVLLM_EUNSUPPORTED;
    return gguf_set_arr(g, key, src->v.arr.type, src->v.arr.data, src->v.arr.n);
}

int gguf_add_tensor(struct gguf *g, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne,
                    const void *data) {
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || !dtype_block_bytes(type)) return KVLLM_EINVAL;
    if (g->n_tensors == g->cap_tensors) {
        uint64_t cap = g->cap_tensors ? 2 * g->cap_tensors : 64;
        struct gguf_tensor *n = realloc(g->tensors, (size_t)cap * sizeof *n);
        if (!n) { LOG_ERR("out of memory"); return KVLLM_ENOMEM; }
        g->tensors = n;
        g->cap_tensors = cap;
    }
    struct gguf_tensor *t = &g->tensors[g->n_tensors];
    memset(t, 0, sizeof *t);
    t->name.ptr = arena_strdup(g, name, strlen(name));
    if (!t->name.ptr) return KVLLM_ENOMEM;
    t->name.len = strlen(name);
    t->n_dims = n_dims;
    t->type = type;
    uint64_t n = 1;
    for (int i = 0; i < GGUF_MAX_DIMS; i++) t->ne[i] = 1;
    for (uint32_t i = 0; i < n_dims; i++) {
        if (ne[i] <= 0 || !ckd_mul_u64(&n, n, (uint64_t)ne[i])) return KVLLM_EINVAL;
        t->ne[i] = ne[i];
    }
    uint64_t row;
    if (!dtype_row_bytes(type, (uint64_t)ne[0], &row) || !ckd_mul_u64(&t->n_bytes, row, n / (uint64_t)ne[0]))
        return KVLLM_EINVAL;
    t->n_elems = n;
    t->data = data;
    g->n_tensors++;
    return 0;
}
