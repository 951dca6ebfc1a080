/* safetensors.h — the safetensors container (Hugging Face): read over a
 * mapping with a fully validated header, and write.
 *
 * Model of the world: a file is an 8-byte little-endian header length N,
 * N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [b, e]}, ...,
 * "__metadata__": {...}}, then the data section; offsets are relative to
 * the data section.  st_parse trusts nothing: the header length against the
 * file, the JSON itself, every dtype, shape product and byte count (with
 * overflow checks), every offset range against the data section, and that
 * no two tensors overlap.  Only F32, F16 and BF16 are accepted.
 *
 * Shapes are kept in safetensors (row-major, outermost first) order. */
#ifndef KVLLM_SAFETENSORS_H
#define KVLLM_SAFETENSORS_H

#include "core/core.h"
#include <stdint.h>
#include <stdio.h>

#define ST_MAX_DIMS 4

struct st_tensor {
    char *name;                 /* owned, NUL-terminated */
    uint32_t dtype;             /* DTYPE_F32 / DTYPE_F16 / DTYPE_BF16 */
    uint32_t n_dims;
    int64_t shape[ST_MAX_DIMS]; /* outermost first */
    uint64_t n_elems;
    uint64_t n_bytes;
    const uint8_t *data;        /* into the caller's buffer (not owned) */
};

struct st_file {
    const char *path;           /* for messages; borrowed */
    uint64_t n_tensors;
    struct st_tensor *tensors;  /* owned; sorted by data offset */
};

/* Parse and validate a safetensors image of `size` bytes (typically a
 * mapping; it must outlive *out's tensor data).  On error logs one line
 * "<path>: <problem>" naming the tensor where there is one, returns
 * KVLLM_EFORMAT (malformed), KVLLM_EUNSUPPORTED (a dtype other than
 * F32/F16/BF16) or KVLLM_ENOMEM, and leaves *out empty (nothing to free). */
int st_parse(const char *path, const uint8_t *data, uint64_t size, struct st_file *out);

/* Free what st_parse allocated; NULL-safe, leaves *f empty. */
void st_file_deinit(struct st_file *f);

/* The safetensors name of a dtype ("F32", "F16", "BF16"); NULL for others. */
const char *st_dtype_name(uint32_t dtype);

/* ---- writing ---- */

struct st_write_entry {
    const char *name;
    uint32_t dtype;             /* F32 / F16 / BF16 */
    uint32_t n_dims;
    int64_t shape[ST_MAX_DIMS]; /* outermost first */
};

/* Write the 8-byte length and the JSON header for n entries stored back to
 * back in the given order (the header is padded with spaces to a multiple
 * of 8 bytes).  Data is then written by the caller, entry after entry.
 * Returns 0 or KVLLM_EIO / KVLLM_EINVAL (logged with path). */
int st_write_header(FILE *f, const char *path, const struct st_write_entry *e, uint64_t n);

#endif
