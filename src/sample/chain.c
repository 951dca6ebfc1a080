/* chain.c — the sampling chain (chain.h).  Sorting is a heap: top-k keeps a
 * min-heap of the k best (O(n log k)); top-p without top-k histograms the
 * mass by logit in one pass, sorts only the tokens above the bucket where
 * the mass reaches p, and falls back to a full heapsort (O(n log n)) only if
 * rounding made that cut fall short.  Nothing here allocates. */
#include "sample/chain.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* top-p without top-k buckets the mass by lmax - logit: TOP_P_BUCKETS
 * buckets of TOP_P_RANGE / TOP_P_BUCKETS logits each, the last open-ended. */
#define TOP_P_BUCKETS 256
#define TOP_P_RANGE 32.0f

/* ---- ordering and heaps ---- */

/* a ranks before b: higher logit, then lower id. */
static inline int better(const struct sample_cand *a, const struct sample_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* Min-heap on `better` (the worst candidate at the root). */
static void sift_down(struct sample_cand *h, size_t n, size_t i) {
    struct sample_cand x = h[i];
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n) break;
        size_t w = l; /* the worse child */
        if (l + 1 < n && better(&h[l], &h[l + 1])) w = l + 1;
        if (!better(&x, &h[w])) break;
        h[i] = h[w];
        i = w;
    }
    h[i] = x;
}

/* Leave the best k of c[0..n) at c[0..k), best first; c[k..n) keeps the
 * rest in unspecified order (c stays a permutation).  O(n log k). */
static void select_top(struct sample_cand *c, size_t n, size_t k) {
    if (k > n) k = n;
    if (k == 0) return;
    for (size_t i = k / 2; i-- > 0;) sift_down(c, k, i);
    for (size_t i = k; i < n; i++) {
        if (better(&c[i], &c[0])) {
            struct sample_cand t = c[0];
            c[0] = c[i];
            c[i] = t;
            sift_down(c, k, 0);
        }
    }
    /* Heapsort: move the worst to the end each round -> best first. */
    for (size_t m = k; m > 1; m--) {
        struct sample_cand t = c[0];
        c[0] = c[m - 1];
        c[m - 1] = t;
        sift_down(c, m - 1, 0);
    }
}

/* ---- the chain ---- */

size_t sample_chain_cands(const float *logits, int n, struct sample_cand *c) {
    size_t m = 0;
    for (int i = 0; i < n; i++) {
        float l = logits[i];
        if (isnan(l) || l == -INFINITY) continue;
        if (l == INFINITY) l = FLT_MAX;
        c[m].logit = l;
        c[m].id = i;
        m++;
    }
    return m;
}

static inline int mass_bucket(float lmax, float logit) {
    float d = (lmax - logit) * (TOP_P_BUCKETS / TOP_P_RANGE); /* >= 0, maybe inf */
    return d < (float)(TOP_P_BUCKETS - 1) ? (int)d : TOP_P_BUCKETS - 1;
}

/* Length of the shortest prefix of sorted c[0..m) whose weight
 * exp(logit - lmax) reaches target; 0 if the whole of it does not. */
static size_t nucleus_len(const struct sample_cand *c, size_t m, float lmax, double target) {
    double cum = 0.0;
    for (size_t i = 0; i < m; i++) {
        cum += expf(c[i].logit - lmax);
        if (cum >= target) return i + 1;
    }
    return 0;
}

static float max_logit(const struct sample_cand *c, size_t n) {
    float lmax = c[0].logit;
    for (size_t i = 1; i < n; i++)
        if (c[i].logit > lmax) lmax = c[i].logit;
    return lmax;
}

/* top-p over c[0..n) (sorted best first when `sorted`): leaves the nucleus
 * sorted at the front and returns its length. */
static size_t top_p_cut(struct sample_cand *c, size_t n, int sorted, float top_p) {
    /* Weights at temperature 1 relative to the max, summed in the current
     * order (the same on every path). */
    const float lmax = sorted ? c[0].logit : max_logit(c, n);
    double z = 0.0;
    double hist[TOP_P_BUCKETS]; /* mass per bucket of lmax - logit */
    if (!sorted) memset(hist, 0, sizeof hist);
    for (size_t i = 0; i < n; i++) {
        float w = expf(c[i].logit - lmax);
        z += w;
        if (!sorted) hist[mass_bucket(lmax, c[i].logit)] += w;
    }
    const double target = (double)top_p * z;

    size_t m = n; /* c[0..m) is sorted and holds every token above c[m-1] */
    if (!sorted) {
        /* The first bucket where the mass reaches p, plus one of margin
         * against rounding; move its tokens and all above to the front and
         * sort only those. */
        int cut = TOP_P_BUCKETS - 1;
        double acc = 0.0;
        for (int b = 0; b < TOP_P_BUCKETS; b++) {
            acc += hist[b];
            if (acc >= target) { cut = b + 1 < TOP_P_BUCKETS ? b + 1 : b; break; }
        }
        m = 0;
        for (size_t i = 0; i < n; i++) {
            if (mass_bucket(lmax, c[i].logit) > cut) continue;
            struct sample_cand t = c[m];
            c[m] = c[i];
            c[i] = t;
            m++;
        }
        select_top(c, m, m);
    }
    size_t keep = nucleus_len(c, m, lmax, target);
    if (keep == 0 && m < n) { /* the cut fell short (rounding): sort all */
        select_top(c, n, n);
        keep = nucleus_len(c, n, lmax, target);
    }
    return keep ? keep : n; /* never reached (rounding): keep all */
}

int32_t sample_chain_pick(struct sample_cand *c, size_t n, float *prob, const struct sample_chain *p) {
    /* Greedy: argmax, lowest id on ties (c is in id order). */
    if (!(p->temperature > 0.0f)) {
        size_t best = 0;
        for (size_t i = 1; i < n; i++)
            if (c[i].logit > c[best].logit) best = i;
        return c[best].id;
    }

    int sorted = 0; /* c[0..n) best first */
    if (p->top_k > 0 && (size_t)p->top_k < n) {
        select_top(c, n, (size_t)p->top_k);
        n = (size_t)p->top_k;
        sorted = 1;
    }
    if (p->top_p < 1.0f && n > 1) {
        n = top_p_cut(c, n, sorted, p->top_p);
        sorted = 1;
    }
    if (p->min_p > 0.0f && n > 1) {
        /* Keep p_i >= min_p * p_max, i.e. exp(l_i - l_max) >= min_p. */
        const float lmax = sorted ? c[0].logit : max_logit(c, n);
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (expf(c[i].logit - lmax) >= p->min_p) c[m++] = c[i];
        n = m; /* >= 1: the max itself has ratio 1 */
    }

    /* Temperature, softmax (unnormalized), draw by inverse CDF.  Divide,
     * not multiply by 1/T: a tiny T would make 1/T inf and 0 * inf NaN for
     * the max; 0 / T stays 0. */
    const float lmax = max_logit(c, n), temp = p->temperature;
    double z = 0.0;
    for (size_t i = 0; i < n; i++) {
        prob[i] = expf((c[i].logit - lmax) / temp);
        z += prob[i];
    }
    const double r = (double)p->u * z;
    double cum = 0.0;
    size_t last = 0; /* last candidate with nonzero weight: rounding fallback */
    for (size_t i = 0; i < n; i++) {
        if (prob[i] <= 0.0f) continue;
        cum += prob[i];
        last = i;
        if (cum > r) return c[i].id;
    }
    return c[last].id;
}

int32_t sample_chain_row(const float *logits, int n_vocab, const struct sample_chain *p, void *scratch) {
    struct sample_cand *c = scratch;
    float *prob = (float *)(c + n_vocab);
    const size_t n = sample_chain_cands(logits, n_vocab, c);
    return n ? sample_chain_pick(c, n, prob, p) : -1;
}
