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
    const void *data;   /* (ne1, ne0) of type, or as layout says */
    uint32_t layout;    /* TENSOR_ROWS (0): rows as above; otherwise a backend's repacked layout
                           (set by place_weights; only that backend's ops read it) */
    uint32_t flags;     /* TENSOR_F_* hints from the model to the backend */
};

/* A matrix whose input keeps f32 activations on the CPU backend's 8-bit
 * path: the logits' (the output head, or the token embedding when the head
 * is tied to it), whose activation rounding decided near-ties of the top
 * token (SmolLM2: 95.9 % top-1 agreement with the exact path with it,
 * 97.5 % without; docs/PERF.md).  Where the kernel set has it, a Q8_0 one
 * takes 16-bit activation codes instead (qmm.h), as near as f32 there. */
#define TENSOR_F_F32_ACT 1u
/* A matrix whose input needs activation scales no coarser than per 32 on
 * the 8-bit path: where that path would scale them per 256 (the K-quants'
 * rows) it keeps f32 activations; the 32-block types take their integer
 * kernels as usual.  The FFN's down projection of the families that ask
 * (struct arch_desc.fine_down). */
#define TENSOR_F_FINE_ACT 2u

enum tensor_layout {
    TENSOR_ROWS = 0,
    TENSOR_Q8X16,       /* CPU 8-bit path: 16 rows interleaved per block (src/backend/cpu/qmm.h) */
};

/* Row r of a TENSOR_ROWS tensor. */
static inline const void *tensor_row(const struct tensor *t, int64_t r) {
    return (const uint8_t *)t->data + (size_t)r * t->row_bytes;
}

#endif
