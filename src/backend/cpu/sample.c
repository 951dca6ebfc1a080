/* sample.c — the CPU backend's sample op: the host sampler's own chain
 * (sample/chain.h) on each row, so a row gives exactly the token the host
 * sampler would give for the same logits and draw.  Rows run one after
 * another through the caller's scratch: sampling is a sliver of a step,
 * and a row's result never depends on the others (batch invariance). */
#include "backend/cpu/cpu_ops.h"

int cpu_sample(struct backend_ctx *c, const struct sample_args *a) {
    for (int i = 0; i < a->n; i++)
        a->ids[i] = sample_chain_row(a->logits + (size_t)i * a->dim, a->dim, &a->rows[i], a->scratch);
    return 0;
}
