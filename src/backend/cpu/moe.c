/* moe.c — mixture-of-experts ops of the CPU backend: routing (softmax and
 * top-k per token) and the experts' FFN grouped by expert.
 * Grouping: the tokens routed to expert e are gathered into consecutive
 * rows, multiplied by e's matrices with the kernel set's own matmul (so
 * each expert's weights are read once per call, whatever the batch), and
 * their results added back into each token's output.  A token's sum runs
 * over its experts in ascending id, and every matmul row depends on its
 * own input row only, so a token's output never depends on the batch. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_ops.h"
#include "core/core.h"

#include <math.h>

int cpu_moe_route(struct backend_ctx *c, int32_t *ids, float *weights, const float *logits, int n, int n_expert,
                  int n_used, bool norm) {
    (void)c;
    if (n_used < 1 || n_used > n_expert) {
        LOG_ERR("moe_route: %d experts used of %d", n_used, n_expert);
        return KVLLM_EINVAL;
    }
    for (int t = 0; t < n; t++) {
        const float *l = logits + (size_t)t * n_expert;
        int32_t *id = ids + (size_t)t * n_used;
        float *w = weights + (size_t)t * n_used;
        float mx = -INFINITY, sum = 0;
        for (int e = 0; e < n_expert; e++) mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < n_expert; e++) sum += expf(l[e] - mx);
        /* top n_used by insertion (experts are tens to hundreds): id[0 .. k) by descending logit,
         * the earlier expert first on ties */
        int k = 0;
        for (int e = 0; e < n_expert; e++) {
            if (k == n_used && !(l[e] > l[id[k - 1]])) continue;   /* no better than the worst kept */
            int i = k < n_used ? k++ : n_used - 1;                   /* a free place, or the worst's */
            while (i > 0 && l[e] > l[id[i - 1]]) { id[i] = id[i - 1]; i--; }
            id[i] = e;
        }
        float ws = 0;
        for (int j = 0; j < n_used; j++) ws += w[j] = expf(l[id[j]] - mx) / sum;
        if (norm)
            for (int j = 0; j < n_used; j++) w[j] /= ws;
    }
    return 0;
}

/* g (n) = swiglu_oai(g, u) (enum glu_kind). */
static void swiglu_oai(float *g, const float *u, long n) {
    for (long i = 0; i < n; i++) {
        const float x = g[i] < GLU_OAI_LIMIT ? g[i] : GLU_OAI_LIMIT;
        const float y = u[i] < -GLU_OAI_LIMIT ? -GLU_OAI_LIMIT : u[i] > GLU_OAI_LIMIT ? GLU_OAI_LIMIT : u[i];
        g[i] = x / (1.0f + expf(-GLU_OAI_ALPHA * x)) * (y + 1.0f);
    }
}

/* y (m, b->ne0) += row e of the 2-D bias b, when there is one. */
static int expert_bias(const struct backend_ops *k, struct backend_ctx *c, float *y, const struct tensor *b, int e,
                       int m) {
    if (!b) return 0;
    const struct tensor row = { .type = DTYPE_F32, .ne0 = b->ne0, .ne1 = 1, .row_bytes = b->row_bytes,
                                .data = tensor_row(b, e) };
    return k->add_bias(c, y, &row, m, (int)b->ne0);
}

int cpu_moe(struct backend_ctx *c, const struct moe_args *a) {
    const struct backend_ops *k = &cpu_backend_of(c->be)->kernels;   /* unwalled: this op is already inside */
    const int n = a->n_tokens, E = a->n_embd, F = a->n_ff;
    for (int t = 0; t < n; t++)
        for (int j = 0; j < a->n_used; j++)
            if (a->ids[(size_t)t * a->n_used + j] < 0 || a->ids[(size_t)t * a->n_used + j] >= a->n_expert) {
                LOG_ERR("moe: token %d routed to expert %d of %d", t, a->ids[(size_t)t * a->n_used + j],
                        a->n_expert);
                return KVLLM_EINVAL;
            }
    memset(a->out, 0, (size_t)n * E * sizeof(float));
    for (int e = 0; e < a->n_expert; e++) {
        /* the group: tokens routed to e, in token order (the second pass below walks the same order) */
        int m = 0;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < a->n_used; j++)
                if (a->ids[(size_t)t * a->n_used + j] == e) {
                    memcpy(a->xs + (size_t)m * E, a->x + (size_t)t * E, (size_t)E * sizeof(float));
                    m++;
                }
        if (!m) continue;
        int rc;
        if ((rc = k->matmul(c, a->g, &a->gate[e], a->xs, m)) || (rc = k->matmul(c, a->u, &a->up[e], a->xs, m)) ||
            (rc = expert_bias(k, c, a->g, a->gate_b, e, m)) || (rc = expert_bias(k, c, a->u, a->up_b, e, m)))
            return rc;
        switch (a->act) {
        case GLU_SILU: rc = k->swiglu(c, a->g, a->u, (long)m * F); break;
        case GLU_GELU: rc = k->geglu(c, a->g, a->u, (long)m * F); break;
        case GLU_SWIGLU_OAI: swiglu_oai(a->g, a->u, (long)m * F); break;
        }
        if (rc || (rc = k->matmul(c, a->ys, &a->down[e], a->g, m)) ||
            (rc = expert_bias(k, c, a->ys, a->down_b, e, m)))
            return rc;
        m = 0;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < a->n_used; j++)
                if (a->ids[(size_t)t * a->n_used + j] == e) {
                    const float w = a->weights[(size_t)t * a->n_used + j], *y = a->ys + (size_t)m++ * E;
                    float *o = a->out + (size_t)t * E;
                    for (int i = 0; i < E; i++) o[i] += w * y[i];
                }
    }
    return 0;
}
