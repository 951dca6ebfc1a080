/* sampler.c — pick the next token from a row of logits.
 *
 * Model of the world: one sampler per request, created with fixed
 * parameters and n_vocab; every working array is allocated once in
 * kvllm_sampler_new, so kvllm_sampler_sample never allocates.  A sample
 * runs llama.cpp's default chain in its order:
 *
 *   repeat penalty -> [greedy: argmax, done] -> top-k -> top-p -> min-p
 *   -> temperature -> softmax -> draw (one rng_f32 from the seeded RNG)
 *
 * top-p and min-p look at the softmax of the surviving candidates at
 * temperature 1 (as llama.cpp's chain does: temperature comes last), so
 * the temperature reshapes only the draw, never which tokens survive.
 *
 * Candidates are ordered by a total order — higher logit first, lower id on
 * equal logits — so ties resolve to the lowest id everywhere (greedy,
 * top-k) and the result never depends on the sorting algorithm.  Sorting
 * is a heap: top-k keeps a min-heap of the k best (O(n log k)); top-p
 * without top-k histograms the mass by logit in one pass, sorts only the
 * tokens above the bucket where the mass reaches p, and falls back to a
 * full heapsort (O(n log n)) only if rounding made that cut fall short.
 *
 * Before the chain, the logit bias is added (OpenAI's logit_bias) and an
 * optional allow-mask (constrained decoding, min_tokens) sets every token
 * it excludes to -inf, so penalties, truncation and temperature see only
 * allowed tokens and greedy stays greedy among them.
 *
 * Logits: -inf masks a token out; NaN counts as -inf; +inf counts as the
 * largest finite float (several +inf share the mass equally).  If every
 * token is masked, sample returns KVLLM_EINVAL. */
#include "core/core.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* top-p without top-k buckets the mass by lmax - logit: TOP_P_BUCKETS
 * buckets of TOP_P_RANGE / TOP_P_BUCKETS logits each, the last open-ended. */
#define TOP_P_BUCKETS 256
#define TOP_P_RANGE 32.0f

struct cand {
    float logit;
    int32_t id;
};

struct kvllm_sampler {
    struct kvllm_sampling_params p;
    int n_vocab;
    struct rng rng;
    float *logits;   /* (n_vocab) penalized copy of the input row */
    struct cand *c;  /* (n_vocab) candidates, compacted as filters drop them */
    float *prob;     /* (n_vocab) unnormalized weights of c[i] for the draw */
    int32_t *count;  /* (n_vocab) occurrences in the penalty window while penalizing; else 0 */
    struct kvllm_logit_bias *bias;  /* (n_bias) own copy; NULL when none */
    int n_bias;
};

struct kvllm_sampling_params kvllm_sampling_default_params(void) {
    struct kvllm_sampling_params p = {
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .seed = 0,
    };
    return p;
}

static int check_params(const struct kvllm_sampling_params *p, int n_vocab) {
    if (n_vocab <= 0) {
        LOG_ERR("%s: n_vocab %d must be > 0", __func__, n_vocab);
        return KVLLM_EINVAL;
    }
    if (isnan(p->temperature) || isinf(p->temperature)) {
        LOG_ERR("%s: temperature %g must be finite (<= 0 means greedy)", __func__,
                (double)p->temperature);
        return KVLLM_EINVAL;
    }
    if (!(p->top_p > 0.0f)) { /* also catches NaN; >= 1 means off */
        LOG_ERR("%s: top_p %g must be in (0, 1] (>= 1 means off)", __func__, (double)p->top_p);
        return KVLLM_EINVAL;
    }
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) {
        LOG_ERR("%s: min_p %g must be in [0, 1] (0 means off)", __func__, (double)p->min_p);
        return KVLLM_EINVAL;
    }
    if (!(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty)) {
        LOG_ERR("%s: repeat_penalty %g must be finite and > 0 (1 means off)", __func__,
                (double)p->repeat_penalty);
        return KVLLM_EINVAL;
    }
    if (!(fabsf(p->presence_penalty) <= 2.0f) || !(fabsf(p->frequency_penalty) <= 2.0f)) {
        LOG_ERR("%s: presence_penalty %g and frequency_penalty %g must be in [-2, 2]", __func__,
                (double)p->presence_penalty, (double)p->frequency_penalty);
        return KVLLM_EINVAL;
    }
    return 0;
}

int kvllm_sampler_new(const struct kvllm_sampling_params *p, int n_vocab, struct kvllm_sampler **out) {
    if (!out) {
        LOG_ERR("%s: out is NULL", __func__);
        return KVLLM_EINVAL;
    }
    *out = NULL;
    if (!p) {
        LOG_ERR("%s: params are NULL", __func__);
        return KVLLM_EINVAL;
    }
    int err = check_params(p, n_vocab);
    if (err) return err;

    /* One slab: header, then the arrays, most-aligned first. */
    size_t n = (size_t)n_vocab;
    size_t off_c = (sizeof(struct kvllm_sampler) + 15) & ~(size_t)15;
    size_t off_logits = off_c + n * sizeof(struct cand);
    size_t off_prob = off_logits + n * sizeof(float);
    size_t off_count = off_prob + n * sizeof(float);
    size_t total = off_count + n * sizeof(int32_t);
    char *slab = xmalloc(total);
    if (!slab) return KVLLM_ENOMEM;

    struct kvllm_sampler *s = (struct kvllm_sampler *)slab;
    s->p = *p;
    s->n_vocab = n_vocab;
    rng_seed(&s->rng, p->seed);
    s->c = (struct cand *)(slab + off_c);
    s->logits = (float *)(slab + off_logits);
    s->prob = (float *)(slab + off_prob);
    s->count = (int32_t *)(slab + off_count);
    memset(s->count, 0, n * sizeof(int32_t));
    s->bias = NULL;
    s->n_bias = 0;
    *out = s;
    return 0;
}

void kvllm_sampler_free(struct kvllm_sampler *s) {
    if (!s) return;
    free(s->bias);
    free(s);
}

int kvllm_sampler_set_logit_bias(struct kvllm_sampler *s, const struct kvllm_logit_bias *bias, int n) {
    if (!s || n < 0 || (n > 0 && !bias)) {
        LOG_ERR("%s: %s", __func__, !s ? "sampler is NULL" : "n < 0 or bias is NULL");
        return KVLLM_EINVAL;
    }
    for (int i = 0; i < n; i++) {
        if (bias[i].token < 0 || bias[i].token >= s->n_vocab) {
            LOG_ERR("%s: logit_bias[%d]: token %d is out of range (vocabulary of %d)", __func__, i,
                    (int)bias[i].token, s->n_vocab);
            return KVLLM_EINVAL;
        }
        if (!isfinite(bias[i].bias)) {
            LOG_ERR("%s: logit_bias[%d]: the bias of token %d is not finite", __func__, i, (int)bias[i].token);
            return KVLLM_EINVAL;
        }
    }
    struct kvllm_logit_bias *copy = NULL;
    if (n > 0) {
        if (!(copy = xmalloc((size_t)n * sizeof *copy))) return KVLLM_ENOMEM;
        memcpy(copy, bias, (size_t)n * sizeof *copy);
    }
    free(s->bias);
    s->bias = copy;
    s->n_bias = n;
    return 0;
}

/* ---- ordering and heaps ---- */

/* a ranks before b: higher logit, then lower id. */
static inline int better(const struct cand *a, const struct cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* Min-heap on `better` (the worst candidate at the root). */
static void sift_down(struct cand *h, size_t n, size_t i) {
    struct cand x = h[i];
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
static void select_top(struct cand *c, size_t n, size_t k) {
    if (k > n) k = n;
    if (k == 0) return;
    for (size_t i = k / 2; i-- > 0;) sift_down(c, k, i);
    for (size_t i = k; i < n; i++) {
        if (better(&c[i], &c[0])) {
            struct cand t = c[0];
            c[0] = c[i];
            c[i] = t;
            sift_down(c, k, 0);
        }
    }
    /* Heapsort: move the worst to the end each round -> best first. */
    for (size_t m = k; m > 1; m--) {
        struct cand t = c[0];
        c[0] = c[m - 1];
        c[m - 1] = t;
        sift_down(c, m - 1, 0);
    }
}

/* ---- the chain ---- */

static inline int mass_bucket(float lmax, float logit) {
    float d = (lmax - logit) * (TOP_P_BUCKETS / TOP_P_RANGE); /* >= 0, maybe inf */
    return d < (float)(TOP_P_BUCKETS - 1) ? (int)d : TOP_P_BUCKETS - 1;
}

/* Length of the shortest prefix of sorted c[0..m) whose weight
 * exp(logit - lmax) reaches target; 0 if the whole of it does not. */
static size_t nucleus_len(const struct cand *c, size_t m, float lmax, double target) {
    double cum = 0.0;
    for (size_t i = 0; i < m; i++) {
        cum += expf(c[i].logit - lmax);
        if (cum >= target) return i + 1;
    }
    return 0;
}

/* Penalties over the window: repetition (llama.cpp style: each distinct
 * token once, divide positive logits, multiply negative ones), then OpenAI's
 * presence (once per distinct token) and frequency (per occurrence). */
static void apply_penalties(struct kvllm_sampler *s, const int32_t *history, int n_history) {
    const float pen = s->p.repeat_penalty, pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
    int last_n = s->p.repeat_last_n;
    if ((pen == 1.0f && pres == 0.0f && freq == 0.0f) || last_n == 0 || !history || n_history <= 0) return;
    int start = (last_n < 0 || last_n >= n_history) ? 0 : n_history - last_n;
    for (int i = start; i < n_history; i++)
        if (history[i] >= 0 && history[i] < s->n_vocab) s->count[history[i]]++;
    for (int i = start; i < n_history; i++) {
        int32_t t = history[i];
        if (t < 0 || t >= s->n_vocab || s->count[t] == 0) continue;
        float l = s->logits[t];
        if (pen != 1.0f) l = l > 0.0f ? l / pen : l * pen;
        s->logits[t] = l - freq * (float)s->count[t] - pres;
        s->count[t] = 0; /* each distinct token once */
    }
}

int32_t kvllm_sampler_sample(struct kvllm_sampler *s, const float *logits,
                             const int32_t *history, int n_history) {
    return kvllm_sampler_sample_masked(s, logits, history, n_history, NULL);
}

int32_t kvllm_sampler_sample_masked(struct kvllm_sampler *s, const float *logits, const int32_t *history,
                                    int n_history, const uint32_t *allow) {
    if (!s || !logits) {
        LOG_ERR("%s: %s is NULL", __func__, !s ? "sampler" : "logits");
        return KVLLM_EINVAL;
    }
    const int n_vocab = s->n_vocab;
    memcpy(s->logits, logits, (size_t)n_vocab * sizeof(float));
    for (int i = 0; i < s->n_bias; i++) s->logits[s->bias[i].token] += s->bias[i].bias;
    if (allow)
        for (int i = 0; i < n_vocab; i++)
            if (!(allow[i >> 5] >> (i & 31) & 1u)) s->logits[i] = -INFINITY;
    apply_penalties(s, history, n_history);

    /* Candidates: drop -inf and NaN, clamp +inf. */
    struct cand *c = s->c;
    size_t n = 0;
    for (int i = 0; i < n_vocab; i++) {
        float l = s->logits[i];
        if (isnan(l) || l == -INFINITY) continue;
        if (l == INFINITY) l = FLT_MAX;
        c[n].logit = l;
        c[n].id = i;
        n++;
    }
    if (n == 0) {
        LOG_ERR("%s: every one of %d logits is -inf or NaN%s", __func__, n_vocab,
                allow ? " or masked out" : "");
        return KVLLM_EINVAL;
    }

    /* Greedy: argmax, lowest id on ties (c is in id order); RNG untouched. */
    if (!(s->p.temperature > 0.0f)) {
        size_t best = 0;
        for (size_t i = 1; i < n; i++)
            if (c[i].logit > c[best].logit) best = i;
        return c[best].id;
    }

    int sorted = 0; /* c[0..n) best first */
    if (s->p.top_k > 0 && (size_t)s->p.top_k < n) {
        select_top(c, n, (size_t)s->p.top_k);
        n = (size_t)s->p.top_k;
        sorted = 1;
    }

    if (s->p.top_p < 1.0f && n > 1) {
        /* Weights at temperature 1 relative to the max, summed in the
         * current order (the same on every path). */
        float lmax = c[0].logit;
        if (!sorted)
            for (size_t i = 1; i < n; i++)
                if (c[i].logit > lmax) lmax = c[i].logit;
        double z = 0.0;
        double hist[TOP_P_BUCKETS]; /* mass per bucket of lmax - logit */
        if (!sorted) memset(hist, 0, sizeof hist);
        for (size_t i = 0; i < n; i++) {
            float w = expf(c[i].logit - lmax);
            z += w;
            if (!sorted) hist[mass_bucket(lmax, c[i].logit)] += w;
        }
        const double target = (double)s->p.top_p * z;

        size_t m = n; /* c[0..m) is sorted and holds every token above c[m-1] */
        if (!sorted) {
            /* The first bucket where the mass reaches p, plus one of margin
             * against rounding; move its tokens and all above to the front
             * and sort only those. */
            int cut = TOP_P_BUCKETS - 1;
            double acc = 0.0;
            for (int b = 0; b < TOP_P_BUCKETS; b++) {
                acc += hist[b];
                if (acc >= target) { cut = b + 1 < TOP_P_BUCKETS ? b + 1 : b; break; }
            }
            m = 0;
            for (size_t i = 0; i < n; i++) {
                if (mass_bucket(lmax, c[i].logit) > cut) continue;
                struct cand t = c[m];
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
        n = keep ? keep : n; /* never reached (rounding): keep all */
        sorted = 1;
    }

    if (s->p.min_p > 0.0f && n > 1) {
        /* Keep p_i >= min_p * p_max, i.e. exp(l_i - l_max) >= min_p. */
        float lmax = c[0].logit;
        if (!sorted)
            for (size_t i = 1; i < n; i++)
                if (c[i].logit > lmax) lmax = c[i].logit;
        const float min_p = s->p.min_p;
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (expf(c[i].logit - lmax) >= min_p) c[m++] = c[i];
        n = m; /* >= 1: the max itself has ratio 1 */
    }

    /* Temperature, softmax (unnormalized), draw by inverse CDF. */
    float lmax = c[0].logit;
    for (size_t i = 1; i < n; i++)
        if (c[i].logit > lmax) lmax = c[i].logit;
    /* Divide, not multiply by 1/T: a tiny T would make 1/T inf and
     * 0 * inf NaN for the max; 0 / T stays 0. */
    const float temp = s->p.temperature;
    double z = 0.0;
    for (size_t i = 0; i < n; i++) {
        s->prob[i] = expf((c[i].logit - lmax) / temp);
        z += s->prob[i];
    }
    const double r = (double)rng_f32(&s->rng) * z;
    double cum = 0.0;
    size_t last = 0; /* last candidate with nonzero weight: rounding fallback */
    for (size_t i = 0; i < n; i++) {
        if (s->prob[i] <= 0.0f) continue;
        cum += s->prob[i];
        last = i;
        if (cum > r) return c[i].id;
    }
    return c[last].id;
}
