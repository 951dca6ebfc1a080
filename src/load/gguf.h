/* gguf.h — GGUF files (v2, v3) in memory: read over mmap, build, write.
 *
 * Model of the world: a struct gguf holds metadata key/values and tensor
 * descriptions.  When opened from a file everything points into the
 * mapping, after every offset, count and size has been checked against the
 * file with overflow-safe arithmetic.  The same struct can be built in
 * memory (the llama2.c loader does this) and written out; values added
 * with gguf_set_* are copied and owned by the struct, tensor data is
 * borrowed (it must outlive the struct or the write).
 *
 * Strings are (ptr, len) and NOT NUL-terminated. */
#ifndef KVLLM_GGUF_H
#define KVLLM_GGUF_H

#include "core/core.h"
#include <stdbool.h>
#include <stdint.h>

enum gguf_vtype {
    GGUF_T_UINT8 = 0, GGUF_T_INT8 = 1, GGUF_T_UINT16 = 2, GGUF_T_INT16 = 3,
    GGUF_T_UINT32 = 4, GGUF_T_INT32 = 5, GGUF_T_FLOAT32 = 6, GGUF_T_BOOL = 7,
    GGUF_T_STRING = 8, GGUF_T_ARRAY = 9, GGUF_T_UINT64 = 10, GGUF_T_INT64 = 11,
    GGUF_T_FLOAT64 = 12, GGUF_T_COUNT_ = 13,
};

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

struct gguf_str { const char *ptr; uint64_t len; };

struct gguf_kv {
    struct gguf_str key;
    enum gguf_vtype type;
    union {
        uint64_t u64;   /* unsigned integer types, bool (0/1) */
        int64_t i64;    /* signed integer types */
        double f64;     /* FLOAT32, FLOAT64 */
        struct gguf_str str;
        struct {
            enum gguf_vtype type;   /* element type */
            uint64_t n;             /* element count */
            const void *data;       /* packed little-endian elements (not for STRING/ARRAY) */
            struct gguf_str *strs;  /* STRING arrays: n entries */
        } arr;
    } v;
};

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];  /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
    uint32_t type;              /* enum dtype / ggml type id */
    uint64_t offset;            /* relative to the data section */
    uint64_t n_elems;
    uint64_t n_bytes;
    const void *data;           /* into the mapping (or borrowed, when built) */
};

struct gguf {
    const char *path;           /* for messages; owned copy */
    uint32_t version;
    uint64_t n_kv;
    struct gguf_kv *kv;
    uint64_t n_tensors;
    struct gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;       /* file offset of the data section (read files) */
    struct file_map map;
    struct gguf_arena *arena;   /* owned copies of built keys/values */
    uint64_t cap_kv, cap_tensors;
};

/* Open and fully validate a GGUF file.  On error logs "<path>: <problem>",
 * returns KVLLM_EFORMAT / KVLLM_EUNSUPPORTED / KVLLM_EIO / KVLLM_ENOMEM and
 * sets *out to NULL.  Tensor types are only checked to be known by size;
 * whether kvllm can compute with them is the model's business. */
int gguf_open(const char *path, struct gguf **out);

/* Is this file a GGUF (by magic)?  false when unreadable. */
bool gguf_is_gguf(const char *path);

/* An empty in-memory GGUF (version 3) for building. NULL on OOM. */
struct gguf *gguf_new(const char *path_for_messages);
void gguf_free(struct gguf *g);

/* ---- lookups ---- */

const struct gguf_kv *gguf_find(const struct gguf *g, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf *g, const char *name);

/* Typed getters: return 0, KVLLM_ENOTFOUND when the key is absent (nothing
 * logged), or KVLLM_EFORMAT (logged) when present with an incompatible type
 * or out-of-range value.  Integer getters accept any integer type whose
 * value fits; float getters accept FLOAT32/FLOAT64 and integers. */
int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out);
int gguf_get_f32(const struct gguf *g, const char *key, float *out);
int gguf_get_bool(const struct gguf *g, const char *key, bool *out);
int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out);
/* Array of the given element type (any numeric type also checks the type). */
int gguf_get_arr(const struct gguf *g, const char *key, enum gguf_vtype elem_type,
                 const struct gguf_kv **out);

/* Element i of a numeric array, converted (caller checks i < n); a float
 * element is truncated toward zero, saturated at INT64_MIN/MAX, NaN 0. */
int64_t gguf_arr_i64(const struct gguf_kv *kv, uint64_t i);
double gguf_arr_f64(const struct gguf_kv *kv, uint64_t i);

/* Compare a gguf_str with a C string. */
bool gguf_str_eq(struct gguf_str s, const char *c);

/* ---- building (copies keys and values; last set of a key wins) ---- */

int gguf_set_u32(struct gguf *g, const char *key, uint32_t v);
int gguf_set_i32(struct gguf *g, const char *key, int32_t v);
int gguf_set_f32(struct gguf *g, const char *key, float v);
int gguf_set_bool(struct gguf *g, const char *key, bool v);
int gguf_set_str(struct gguf *g, const char *key, const char *v);
/* Numeric array (elem_type not STRING/ARRAY), n elements of packed data. */
int gguf_set_arr(struct gguf *g, const char *key, enum gguf_vtype elem_type, const void *data, uint64_t n);
int gguf_set_arr_str(struct gguf *g, const char *key, const struct gguf_str *strs, uint64_t n);
/* Copy a key/value of another gguf (any type). */
int gguf_set_kv(struct gguf *g, const struct gguf_kv *kv);

/* Add a tensor; data is borrowed.  ne has n_dims entries. */
int gguf_add_tensor(struct gguf *g, const char *name, uint32_t type, uint32_t n_dims,
                    const int64_t *ne, const void *data);

/* n bytes (max_align_t aligned) owned by g and freed by gguf_free: for
 * tensor data a loader materializes (permuted or converted copies).
 * NULL on OOM (logged). */
void *gguf_alloc(struct gguf *g, size_t n);

/* Write g to path as GGUF v3 (alignment from general.alignment or 32),
 * through a temporary file beside path renamed into place when complete:
 * on error (KVLLM_EIO, KVLLM_ENOMEM, logged) an existing file at path is
 * left as it was and no temporary file remains. */
int gguf_write(const struct gguf *g, const char *path);

#endif
