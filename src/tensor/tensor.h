/* tensor.h — a read-only 2-D view of weights: ne1 rows of ne0 elements of
 * one dtype, rows contiguous (row_bytes apart).  Data usually lives in the
 * model file's mapping. */
#ifndef KVLLM_TENSOR_H
#define KVLLM_TENSOR_H

#include "tensor/dtype.h"
#include <stddef.h>
#include <stdint.h>

struct tensor {
    uint32_t type;      /* enum dtype */
    int64_t ne0;        /* elements per row (input features) */
    int64_t ne1;        /* rows (output features) */
    size_t row_bytes;
    const void *data;   /* (ne1, ne0) of type */
};

static inline const void *tensor_row(const struct tensor *t, int64_t r) {
    return (const uint8_t *)t->data + (size_t)r * t->row_bytes;
}

#endif
