/* safetensors.c — safetensors header validation (see safetensors.h) and the
 * header writer.  The JSON is parsed by json-c from the (not NUL-terminated)
 * header bytes with a small depth limit; every number is range-checked
 * before it is used in arithmetic, and all products use checked math. */
#include "load/safetensors.h"
#include "core/strbuf.h"
#include "tensor/dtype.h"

#include <json-c/json.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define ST_MAX_HEADER (100u << 20) /* the reference implementation's limit too */
#define ST_JSON_DEPTH 8

const char *st_dtype_name(uint32_t dtype) {
    switch (dtype) {
    case DTYPE_F32: return "F32";
    case DTYPE_F16: return "F16";
    case DTYPE_BF16: return "BF16";
    default: return NULL;
    }
}

/* dtype string -> DTYPE_*; -1 for a known-but-unsupported name, -2 unknown. */
static int dtype_from_name(const char *s) {
    if (!strcmp(s, "F32")) return DTYPE_F32;
    if (!strcmp(s, "F16")) return DTYPE_F16;
    if (!strcmp(s, "BF16")) return DTYPE_BF16;
    static const char *other[] = { "F64", "I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64", "BOOL",
                                   "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64" };
    for (size_t i = 0; i < sizeof other / sizeof *other; i++)
        if (!strcmp(s, other[i])) return -1;
    return -2;
}

void st_file_deinit(struct st_file *f) {
    if (!f) return;
    for (uint64_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    memset(f, 0, sizeof *f);
}

/* A JSON integer in [0, max]; json-c stores big values as uint64/double. */
static bool json_u64(json_object *o, uint64_t max, uint64_t *out) {
    if (!o || !json_object_is_type(o, json_type_int)) return false;
    int64_t v = json_object_get_int64(o);
    if (v < 0) return false;
    if (v == INT64_MAX) { /* saturated: take the unsigned value */
        uint64_t u = json_object_get_uint64(o);
        if (u > max) return false;
        *out = u;
        return true;
    }
    if ((uint64_t)v > max) return false;
    *out = (uint64_t)v;
    return true;
}

static int cmp_by_offset(const void *a, const void *b) {
    const struct st_tensor *x = a, *y = b;
    return x->data < y->data ? -1 : x->data > y->data ? 1 : 0;
}

/* Validate one header entry (name, value) into t; logs on failure. */
static int parse_entry(const char *path, const char *name, json_object *v, const uint8_t *base, uint64_t data_size,
                       struct st_tensor *t) {
    if (!json_object_is_type(v, json_type_object)) {
        LOG_ERR("%s: tensor '%s': header entry is not a JSON object", path, name);
        return KVLLM_EFORMAT;
    }
    json_object *jd, *js, *jo;
    if (!json_object_object_get_ex(v, "dtype", &jd) || !json_object_is_type(jd, json_type_string)) {
        LOG_ERR("%s: tensor '%s': missing or non-string \"dtype\"", path, name);
        return KVLLM_EFORMAT;
    }
    const char *ds = json_object_get_string(jd);
    int dt = dtype_from_name(ds);
    if (dt < 0) {
        LOG_ERR("%s: tensor '%s': %s dtype '%.32s' (supported: F32, F16, BF16)", path, name,
                dt == -1 ? "unsupported" : "unknown", ds);
        return dt == -1 ? KVLLM_EUNSUPPORTED : KVLLM_EFORMAT;
    }
    t->dtype = (uint32_t)dt;
    if (!json_object_object_get_ex(v, "shape", &js) || !json_object_is_type(js, json_type_array)) {
        LOG_ERR("%s: tensor '%s': missing or non-array \"shape\"", path, name);
        return KVLLM_EFORMAT;
    }
    size_t nd = json_object_array_length(js);
    if (nd > ST_MAX_DIMS) {
        LOG_ERR("%s: tensor '%s': %zu dimensions (at most %d supported)", path, name, nd, ST_MAX_DIMS);
        return KVLLM_EFORMAT;
    }
    t->n_dims = (uint32_t)nd;
    uint64_t n = 1;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!json_u64(json_object_array_get_idx(js, i), (uint64_t)INT64_MAX, &d)) {
            LOG_ERR("%s: tensor '%s': shape[%zu] is not a non-negative integer", path, name, i);
            return KVLLM_EFORMAT;
        }
        t->shape[i] = (int64_t)d;
        if (!ckd_mul_u64(&n, n, d)) {
            LOG_ERR("%s: tensor '%s': shape product overflows", path, name);
            return KVLLM_EFORMAT;
        }
    }
    t->n_elems = n;
    uint64_t bytes;
    if (!ckd_mul_u64(&bytes, n, t->dtype == DTYPE_F32 ? 4 : 2)) {
        LOG_ERR("%s: tensor '%s': byte size overflows", path, name);
        return KVLLM_EFORMAT;
    }
    uint64_t b, e;
    if (!json_object_object_get_ex(v, "data_offsets", &jo) || !json_object_is_type(jo, json_type_array) ||
        json_object_array_length(jo) != 2 || !json_u64(json_object_array_get_idx(jo, 0), UINT64_MAX, &b) ||
        !json_u64(json_object_array_get_idx(jo, 1), UINT64_MAX, &e)) {
        LOG_ERR("%s: tensor '%s': \"data_offsets\" must be two non-negative integers", path, name);
        return KVLLM_EFORMAT;
    }
    if (b > e) {
        LOG_ERR("%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", path, name,
                (unsigned long long)b, (unsigned long long)e);
        return KVLLM_EFORMAT;
    }
    if (e > data_size) {
        LOG_ERR("%s: tensor '%s': data_offsets [%llu, %llu] out of range (data section has %llu bytes)", path, name,
                (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_size);
        return KVLLM_EFORMAT;
    }
    if (e - b != bytes) {
        LOG_ERR("%s: tensor '%s': %s shape of %llu elements needs %llu bytes but data_offsets [%llu, %llu] hold %llu",
                path, name, ds, (unsigned long long)n, (unsigned long long)bytes, (unsigned long long)b,
                (unsigned long long)e, (unsigned long long)(e - b));
        return KVLLM_EFORMAT;
    }
    t->n_bytes = bytes;
    t->data = base + b;
    return 0;
}

int st_parse(const char *path, const uint8_t *data, uint64_t size, struct st_file *out) {
    memset(out, 0, sizeof *out);
    out->path = path;
    if (size < 8) {
        LOG_ERR("%s: not a safetensors file (%llu bytes, shorter than the 8-byte header length)", path,
                (unsigned long long)size);
        return KVLLM_EFORMAT;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | data[i];
    if (hlen > size - 8) {
        LOG_ERR("%s: safetensors header length %llu runs past the end of the file (size %llu)", path,
                (unsigned long long)hlen, (unsigned long long)size);
        return KVLLM_EFORMAT;
    }
    if (hlen < 2 || hlen > ST_MAX_HEADER) {
        LOG_ERR("%s: implausible safetensors header length %llu", path, (unsigned long long)hlen);
        return KVLLM_EFORMAT;
    }
    const char *hdr = (const char *)data + 8;
    if (memchr(hdr, 0, hlen)) {
        LOG_ERR("%s: malformed safetensors header (NUL byte in the JSON)", path);
        return KVLLM_EFORMAT;
    }
    json_tokener *tok = json_tokener_new_ex(ST_JSON_DEPTH);
    if (!tok) { LOG_ERR("%s: out of memory", path); return KVLLM_ENOMEM; }
    json_object *root = json_tokener_parse_ex(tok, hdr, (int)hlen);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    /* trailing spaces are the writer's padding; anything else is garbage */
    bool trailing_ok = true;
    for (size_t i = used; root && i < hlen; i++)
        if (hdr[i] != ' ' && hdr[i] != '\n' && hdr[i] != '\t' && hdr[i] != '\r') trailing_ok = false;
    if (!root || jerr != json_tokener_success || !trailing_ok) {
        LOG_ERR("%s: malformed safetensors header: %s (JSON byte %zu of %llu)", path,
                root ? "trailing data after the JSON object"
                     : jerr == json_tokener_continue || jerr == json_tokener_success ? "the JSON ends early"
                                                                                     : json_tokener_error_desc(jerr),
                used, (unsigned long long)hlen);
        json_object_put(root);
        return KVLLM_EFORMAT;
    }
    if (!json_object_is_type(root, json_type_object)) {
        LOG_ERR("%s: malformed safetensors header: not a JSON object", path);
        json_object_put(root);
        return KVLLM_EFORMAT;
    }
    const uint8_t *base = data + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;
    int n = json_object_object_length(root);
    int rc = 0;
    out->tensors = xcalloc(n > 0 ? (size_t)n : 1, sizeof *out->tensors);
    if (!out->tensors) rc = KVLLM_ENOMEM;
    json_object_object_foreach(root, key, val) {
        if (rc) break;
        if (!strcmp(key, "__metadata__")) continue;
        struct st_tensor *t = &out->tensors[out->n_tensors];
        rc = parse_entry(path, key, val, base, data_size, t);
        if (!rc && !(t->name = strdup(key))) { LOG_ERR("%s: out of memory", path); rc = KVLLM_ENOMEM; }
        if (!rc) out->n_tensors++;
    }
    json_object_put(root);
    if (!rc && out->n_tensors > 1) {
        qsort(out->tensors, out->n_tensors, sizeof *out->tensors, cmp_by_offset);
        for (uint64_t i = 1; i < out->n_tensors; i++) {
            const struct st_tensor *a = &out->tensors[i - 1], *b = &out->tensors[i];
            if (b->n_bytes && a->n_bytes && b->data < a->data + a->n_bytes) {
                LOG_ERR("%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap", path, a->name,
                        (unsigned long long)(a->data - base), (unsigned long long)(a->data - base + a->n_bytes),
                        b->name, (unsigned long long)(b->data - base),
                        (unsigned long long)(b->data - base + b->n_bytes));
                rc = KVLLM_EFORMAT;
                break;
            }
        }
    }
    if (rc) st_file_deinit(out);
    out->path = path;
    return rc;
}

/* ---- writing ---- */

int st_write_header(FILE *f, const char *path, const struct st_write_entry *e, uint64_t n) {
    struct strbuf b = { 0 };
    uint64_t off = 0;
    sb_printf(&b, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (uint64_t i = 0; i < n; i++) {
        const char *dn = st_dtype_name(e[i].dtype);
        if (!dn || e[i].n_dims > ST_MAX_DIMS || strpbrk(e[i].name, "\"\\")) {
            LOG_ERR("%s: tensor '%s' cannot be written to safetensors", path, e[i].name);
            sb_free(&b);
            return KVLLM_EINVAL;
        }
        uint64_t ne = 1;
        for (uint32_t d = 0; d < e[i].n_dims; d++) ne *= (uint64_t)e[i].shape[d];
        uint64_t bytes = ne * (e[i].dtype == DTYPE_F32 ? 4 : 2);
        sb_printf(&b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e[i].name, dn);
        for (uint32_t d = 0; d < e[i].n_dims; d++) sb_printf(&b, "%s%lld", d ? "," : "", (long long)e[i].shape[d]);
        sb_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    sb_puts(&b, "}");
    while (!b.oom && b.len % 8) sb_puts(&b, " ");
    int rc = 0;
    if (b.oom) {
        LOG_ERR("%s: out of memory", path);
        rc = KVLLM_ENOMEM;
    } else {
        uint8_t lb[8];
        for (int i = 0; i < 8; i++) lb[i] = (uint8_t)((uint64_t)b.len >> (8 * i));
        if (fwrite(lb, 1, 8, f) != 8 || fwrite(b.s, 1, b.len, f) != b.len) {
            LOG_ERR("%s: write failed", path);
            rc = KVLLM_EIO;
        }
    }
    sb_free(&b);
    return rc;
}
