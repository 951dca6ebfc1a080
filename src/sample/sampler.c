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
 * The chain from top-k on (chain.h) is shared with the backend's sample
 * op, which runs it on rows that need nothing before it: this file adds
 * the logit bias, allow-mask and penalties in front, and draws the one u.
 * Ties resolve to the lowest id everywhere (greedy, top-k).
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
#include "sample/chain.h"
#include "sample/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kvllm_sampler {
    struct kvllm_sampling_params p;
    int n_vocab;
    struct rng rng;
    float *logits;   /* (n_vocab) penalized copy of the input row */
    struct sample_cand *c;  /* (n_vocab) candidates, compacted as filters drop them */
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
    size_t off_logits = off_c + n * sizeof(struct sample_cand);
    size_t off_prob = off_logits + n * sizeof(float);
    size_t off_count = off_prob + n * sizeof(float);
    size_t total = off_count + n * sizeof(int32_t);
    char *slab = xmalloc(total);
    if (!slab) return KVLLM_ENOMEM;

    struct kvllm_sampler *s = (struct kvllm_sampler *)slab;
    s->p = *p;
    s->n_vocab = n_vocab;
    rng_seed(&s->rng, p->seed);
    s->c = (struct sample_cand *)(slab + off_c);
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

bool sampler_chain_next(struct kvllm_sampler *s, struct sample_chain *out) {
    const struct kvllm_sampling_params *p = &s->p;
    *out = (struct sample_chain){ .temperature = p->temperature, .top_k = p->top_k, .top_p = p->top_p,
                                  .min_p = p->min_p, .u = 0.0f };
    if (!(p->temperature > 0.0f)) return false;   /* greedy: the RNG is untouched */
    out->u = rng_f32(&s->rng);
    return true;
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

    const size_t n = sample_chain_cands(s->logits, n_vocab, s->c);
    if (n == 0) {
        LOG_ERR("%s: every one of %d logits is -inf or NaN%s", __func__, n_vocab,
                allow ? " or masked out" : "");
        return KVLLM_EINVAL;
    }
    struct sample_chain ch;
    sampler_chain_next(s, &ch);
    return sample_chain_pick(s->c, n, s->prob, &ch);
}
