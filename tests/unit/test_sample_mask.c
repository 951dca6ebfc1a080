/* test_sample_mask.c — the allow-mask and the logit bias: greedy is the
 * argmax among allowed tokens (checked against a plain loop on random
 * rows), a masked token is never drawn and the allowed ones keep
 * softmax(logits / T) restricted to them, the mask comes before top-k and
 * the penalties, a bias moves the choice and -100 bans, bad biases are
 * refused, and an empty mask is an error rather than a token. */
#include "kvllm.h"
#include "check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t lcg = 0x9E3779B97F4A7C15ull;
static float rnd(void) { /* test-local RNG, independent of the sampler's */
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(lcg >> 40) / 16777216.0f;
}

static struct kvllm_sampling_params params(float temp, int top_k) {
    struct kvllm_sampling_params p = kvllm_sampling_default_params();
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.seed = 77;
    return p;
}

static struct kvllm_sampler *make(struct kvllm_sampling_params p, int n_vocab) {
    struct kvllm_sampler *s = NULL;
    CHECK(kvllm_sampler_new(&p, n_vocab, &s) == 0 && s);
    return s;
}

static void set_bit(uint32_t *m, int i) { m[i >> 5] |= 1u << (i & 31); }
static int has_bit(const uint32_t *m, int i) { return (int)(m[i >> 5] >> (i & 31) & 1u); }

/* Greedy under random masks == the reference argmax among allowed (lowest id on ties). */
static void test_greedy_masked(void) {
    enum { V = 1000 };
    float logits[V];
    uint32_t mask[(V + 31) / 32];
    struct kvllm_sampler *s = make(params(0, 0), V);
    if (!s) return;
    for (int round = 0; round < 200; round++) {
        memset(mask, 0, sizeof mask);
        for (int i = 0; i < V; i++) {
            logits[i] = (float)(int)(rnd() * 40) - 20;   /* coarse: many ties */
            if (rnd() < (round % 2 ? 0.01f : 0.5f)) set_bit(mask, i);
        }
        set_bit(mask, (int)(rnd() * V));   /* at least one allowed */
        int ref = -1;
        for (int i = 0; i < V; i++)
            if (has_bit(mask, i) && (ref < 0 || logits[i] > logits[ref])) ref = i;
        int32_t got = kvllm_sampler_sample_masked(s, logits, NULL, 0, mask);
        CHECK_MSG(got == ref, "round %d: greedy masked %d, reference %d", round, (int)got, ref);
    }
    /* NULL mask: the same as kvllm_sampler_sample */
    CHECK(kvllm_sampler_sample_masked(s, logits, NULL, 0, NULL) == kvllm_sampler_sample(s, logits, NULL, 0));
    kvllm_sampler_free(s);
}

/* Temperature 1: masked tokens never come out; the allowed ones follow the
 * softmax restricted to them (within 5 standard deviations of the count). */
static void test_distribution_masked(void) {
    enum { V = 64, DRAWS = 40000 };
    float logits[V];
    uint32_t mask[(V + 31) / 32] = { 0 };
    for (int i = 0; i < V; i++) logits[i] = (float)(i % 7) * 0.5f;
    for (int i = 0; i < V; i += 3) set_bit(mask, i);
    double p[V], z = 0;
    for (int i = 0; i < V; i++) { p[i] = has_bit(mask, i) ? exp(logits[i]) : 0; z += p[i]; }
    int count[V] = { 0 };
    struct kvllm_sampler *s = make(params(1, 0), V);
    if (!s) return;
    for (int k = 0; k < DRAWS; k++) {
        int32_t t = kvllm_sampler_sample_masked(s, logits, NULL, 0, mask);
        CHECK(t >= 0 && t < V);
        if (t >= 0 && t < V) count[t]++;
    }
    kvllm_sampler_free(s);
    for (int i = 0; i < V; i++) {
        double mean = DRAWS * p[i] / z, sd = sqrt(mean * (1 - p[i] / z));
        if (!has_bit(mask, i)) CHECK_MSG(count[i] == 0, "masked token %d drawn %d times", i, count[i]);
        else CHECK_MSG(fabs(count[i] - mean) <= 5 * sd + 1, "token %d: %d draws, expected %.1f", i, count[i], mean);
    }
}

/* The mask comes before top-k: top-k 1 with the best token masked picks
 * the best allowed one (not an error); and before penalties. */
static void test_mask_before_top_k(void) {
    float logits[8] = { 9, 8, 7, 6, 5, 4, 3, 2 };
    uint32_t mask[1] = { 0xFE };   /* all but token 0 */
    struct kvllm_sampler *s = make(params(1, 1), 8);
    if (!s) return;
    for (int k = 0; k < 50; k++) CHECK(kvllm_sampler_sample_masked(s, logits, NULL, 0, mask) == 1);
    kvllm_sampler_free(s);
    /* a repetition penalty on the allowed best moves greedy to the next allowed */
    struct kvllm_sampling_params p = params(0, 0);
    p.repeat_penalty = 100.0f;
    s = make(p, 8);
    if (!s) return;
    int32_t hist[1] = { 1 };
    CHECK(kvllm_sampler_sample_masked(s, logits, hist, 1, mask) == 2);
    kvllm_sampler_free(s);
}

static void test_empty_mask(void) {
    float logits[40];
    for (int i = 0; i < 40; i++) logits[i] = (float)i;
    uint32_t mask[2] = { 0, 0 };
    struct kvllm_sampler *s = make(params(0, 0), 40);
    if (!s) return;
    CHECK(kvllm_sampler_sample_masked(s, logits, NULL, 0, mask) == KVLLM_EINVAL);
    /* an allowed token whose logit is -inf does not count */
    logits[33] = -INFINITY;
    mask[1] = 1u << 1;
    CHECK(kvllm_sampler_sample_masked(s, logits, NULL, 0, mask) == KVLLM_EINVAL);
    mask[1] |= 1u << 2;   /* token 34 */
    CHECK(kvllm_sampler_sample_masked(s, logits, NULL, 0, mask) == 34);
    kvllm_sampler_free(s);
}

static void test_logit_bias(void) {
    enum { V = 16 };
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = (float)i * 0.1f;   /* 15 is the best */
    struct kvllm_sampler *s = make(params(0, 0), V);
    if (!s) return;
    CHECK(kvllm_sampler_sample(s, logits, NULL, 0) == 15);
    struct kvllm_logit_bias ban = { 15, -100 };
    CHECK(kvllm_sampler_set_logit_bias(s, &ban, 1) == 0);
    CHECK(kvllm_sampler_sample(s, logits, NULL, 0) == 14);
    struct kvllm_logit_bias up[2] = { { 3, 1.0f }, { 3, 0.5f } };   /* adds up to 1.5: 0.3 + 1.5 > 1.5 */
    CHECK(kvllm_sampler_set_logit_bias(s, up, 2) == 0);              /* replaces the ban */
    CHECK(kvllm_sampler_sample(s, logits, NULL, 0) == 3);
    up[1].bias = 0.1f;                                               /* 0.3 + 1.1 < 1.5 */
    CHECK(kvllm_sampler_set_logit_bias(s, up, 2) == 0);
    CHECK(kvllm_sampler_sample(s, logits, NULL, 0) == 15);
    /* the input row is not modified */
    CHECK(logits[3] == 0.3f);
    /* bias, then mask: a boosted token that the mask excludes stays out */
    uint32_t mask[1] = { (1u << 1) | (1u << 2) };
    struct kvllm_logit_bias big = { 0, 100 };
    CHECK(kvllm_sampler_set_logit_bias(s, &big, 1) == 0);
    CHECK(kvllm_sampler_sample_masked(s, logits, NULL, 0, mask) == 2);
    /* at temperature 1, a -100 bias bans in practice */
    kvllm_sampler_free(s);
    s = make(params(1, 0), V);
    if (!s) return;
    struct kvllm_logit_bias bans[V - 1];
    for (int i = 0; i < V - 1; i++) bans[i] = (struct kvllm_logit_bias){ i + 1, -100 };
    CHECK(kvllm_sampler_set_logit_bias(s, bans, V - 1) == 0);
    int others = 0;
    for (int k = 0; k < 2000; k++) others += kvllm_sampler_sample(s, logits, NULL, 0) != 0;
    CHECK_MSG(others == 0, "%d draws of banned tokens", others);
    /* refused: out of range, not finite; the previous bias stays */
    struct kvllm_logit_bias bad[2] = { { V, 1 }, { -1, 1 } };
    CHECK(kvllm_sampler_set_logit_bias(s, &bad[0], 1) == KVLLM_EINVAL);
    CHECK(kvllm_sampler_set_logit_bias(s, &bad[1], 1) == KVLLM_EINVAL);
    struct kvllm_logit_bias nan = { 2, NAN };
    CHECK(kvllm_sampler_set_logit_bias(s, &nan, 1) == KVLLM_EINVAL);
    CHECK(kvllm_sampler_set_logit_bias(s, NULL, 1) == KVLLM_EINVAL);
    CHECK(kvllm_sampler_sample(s, logits, NULL, 0) == 0);
    CHECK(kvllm_sampler_set_logit_bias(s, NULL, 0) == 0);   /* cleared */
    kvllm_sampler_free(s);
}

int main(void) {
    kvllm_log_set_level(KVLLM_LOG_ERROR);
    test_greedy_masked();
    test_distribution_masked();
    test_mask_before_top_k();
    test_empty_mask();
    test_logit_bias();
    return check_report("test_sample_mask");
}
