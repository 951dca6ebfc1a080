/* step_layout.c — see step_layout.h. */
#include "backend/step_layout.h"
#include "core/core.h"

#include <string.h>

/* *at = *off rounded up to STEP_ALIGN; *off = *at + n int32; false on overflow. */
static bool take(uint64_t *off, uint64_t n, size_t *at) {
    uint64_t a = (*off + STEP_ALIGN - 1) / STEP_ALIGN * STEP_ALIGN, bytes;
    if (a < *off || !ckd_mul_u64(&bytes, n, 4) || !ckd_add_u64(off, a, bytes) || a > SIZE_MAX) return false;
    *at = (size_t)a;
    return true;
}

int step_layout(int n_tokens, int n_logits, int n_rows, int stride, bool win, struct step_layout *l) {
    memset(l, 0, sizeof *l);
    if (n_tokens < 0 || n_logits < 0 || n_rows < 0 || stride < 0) return KVLLM_EINVAL;
    *l = (struct step_layout){ .n_tokens = n_tokens, .n_logits = n_logits, .n_rows = n_rows, .stride = stride,
                               .win = win };
    const uint64_t nt = (uint64_t)n_tokens, nr = (uint64_t)n_rows * (uint64_t)stride;
    uint64_t off = 0;
    if (!take(&off, nt, &l->tok) || !take(&off, nt, &l->pos) || !take(&off, nt, &l->slot) ||
        !take(&off, nt, &l->seq) || (win && !take(&off, nt, &l->win_slot)) ||
        !take(&off, (uint64_t)n_logits, &l->rows) || !take(&off, nr, &l->table) ||
        (win && !take(&off, nr, &l->win_table)) || off > SIZE_MAX)
        return KVLLM_ERANGE;
    l->bytes = (size_t)off;
    return 0;
}

size_t step_layout_used(const struct step_layout *l, int n_seqs) {
    const size_t row = (size_t)l->stride * 4, n = (size_t)n_seqs;
    return n ? (l->win ? l->win_table : l->table) + n * row : l->rows + (size_t)l->n_logits * 4;
}
