/* test_sample_sampler.c — the sampling chain: greedy, determinism, the
 * drawn distribution against softmax(logits / T), top-k / top-p / min-p
 * exclusion, repetition penalty and its window, masked logits, bad params. */
#include "kvllm.h"
#include "check.h"
#include "io_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static struct kvllm_sampling_params params(float temp, int top_k, float top_p, float min_p) {
    struct kvllm_sampling_params p = kvllm_sampling_default_params();
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repeat_penalty = 1.0f;
    p.seed = 1234;
    return p;
}

static struct kvllm_sampler *make(const struct kvllm_sampling_params *p, int n_vocab) {
    struct kvllm_sampler *s = NULL;
    int err = kvllm_sampler_new(p, n_vocab, &s);
    CHECK_MSG(err == 0 && s, "kvllm_sampler_new: %d", err);
    return s;
}

/* Draw n_draws tokens into counts (n_vocab ints, zeroed here).  Returns the
 * number of draws outside [0, n_vocab). */
static int draw_counts(const struct kvllm_sampling_params *p, const float *logits, int n_vocab,
                       int n_draws, int *counts) {
    memset(counts, 0, (size_t)n_vocab * sizeof(int));
    struct kvllm_sampler *s = make(p, n_vocab);
    if (!s) return n_draws;
    int bad = 0;
    for (int i = 0; i < n_draws; i++) {
        int32_t t = kvllm_sampler_sample(s, logits, NULL, 0);
        if (t < 0 || t >= n_vocab) bad++;
        else counts[t]++;
    }
    kvllm_sampler_free(s);
    return bad;
}

/* softmax(logits / temp) into out (masked entries -> 0). */
static void softmax_t(const float *logits, int n, double temp, double *out) {
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < n; i++) if (logits[i] > mx) mx = logits[i];
    for (int i = 0; i < n; i++) { out[i] = exp((logits[i] - mx) / temp); z += out[i]; }
    for (int i = 0; i < n; i++) out[i] /= z;
}

static uint64_t lcg_state = 88172645463325252ull;
static float rand_unit(void) { /* test-local RNG, independent of the sampler's */
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(lcg_state >> 40) / 16777216.0f;
}

/* ---- tests ---- */

static void test_defaults(void) {
    struct kvllm_sampling_params p = kvllm_sampling_default_params();
    CHECK(p.temperature == 0.8f);
    CHECK(p.top_k == 40);
    CHECK(p.top_p == 0.95f);
    CHECK(p.min_p == 0.05f);
    CHECK(p.repeat_penalty == 1.0f);
    CHECK(p.repeat_last_n == 64);
    CHECK(p.seed == 0);
    struct kvllm_sampler *s = make(&p, 32000);
    kvllm_sampler_free(s);
    kvllm_sampler_free(NULL); /* NULL-safe */
}

static void test_greedy(void) {
    const float logits[] = {0.1f, 2.5f, -1.0f, 2.4f, 2.5f, -INFINITY};
    for (int v = 0; v < 2; v++) {
        struct kvllm_sampling_params p = params(v == 0 ? 0.0f : -1.0f, 40, 0.95f, 0.05f);
        struct kvllm_sampler *s = make(&p, 6);
        if (!s) return;
        for (int i = 0; i < 5; i++) CHECK(kvllm_sampler_sample(s, logits, NULL, 0) == 1); /* tie 1/4 -> 1 */
        kvllm_sampler_free(s);
    }
    /* all equal -> 0 */
    float flat[16];
    for (int i = 0; i < 16; i++) flat[i] = 3.0f;
    struct kvllm_sampling_params p = params(0.0f, 0, 1.0f, 0.0f);
    struct kvllm_sampler *s = make(&p, 16);
    if (!s) return;
    CHECK(kvllm_sampler_sample(s, flat, NULL, 0) == 0);
    /* NaN and +inf: NaN never wins, +inf always does */
    flat[3] = NAN;
    flat[9] = INFINITY;
    CHECK(kvllm_sampler_sample(s, flat, NULL, 0) == 9);
    kvllm_sampler_free(s);
}

static void test_top_k1_is_greedy(void) {
    enum { N = 1000 };
    static float logits[N];
    for (int i = 0; i < N; i++) logits[i] = rand_unit() * 4.0f;
    logits[617] = 4.5f;
    logits[123] = 4.5f; /* tie: the lower id wins, as in greedy */
    struct kvllm_sampling_params pg = params(0.0f, 0, 1.0f, 0.0f);
    struct kvllm_sampler *g = make(&pg, N);
    if (!g) return;
    int32_t want = kvllm_sampler_sample(g, logits, NULL, 0);
    CHECK(want == 123);
    kvllm_sampler_free(g);

    struct kvllm_sampling_params p = params(100.0f, 1, 1.0f, 0.0f);
    static int counts[N];
    CHECK(draw_counts(&p, logits, N, 500, counts) == 0);
    CHECK(counts[want] == 500);
}

static void test_determinism(void) {
    enum { N = 50, DRAWS = 200 };
    float logits[N];
    for (int i = 0; i < N; i++) logits[i] = rand_unit() * 2.0f;
    int32_t a[DRAWS], b[DRAWS], c[DRAWS];
    struct kvllm_sampling_params p = params(1.0f, 0, 1.0f, 0.0f);
    for (int run = 0; run < 3; run++) {
        p.seed = run == 2 ? 99 : 42;
        struct kvllm_sampler *s = make(&p, N);
        if (!s) return;
        int32_t *out = run == 0 ? a : run == 1 ? b : c;
        for (int i = 0; i < DRAWS; i++) out[i] = kvllm_sampler_sample(s, logits, out, i);
        kvllm_sampler_free(s);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    int differ = 0;
    for (int i = 0; i < DRAWS; i++) differ += a[i] != c[i];
    CHECK_MSG(differ > DRAWS / 2, "only %d of %d draws differ across seeds", differ, DRAWS);
}

/* Frequencies over 20000 draws against softmax(logits / T). */
static void check_distribution(float temp) {
    enum { N = 8, DRAWS = 20000 };
    const float logits[N] = {1.0f, 0.5f, 2.0f, -0.5f, 1.5f, 0.0f, 1.9f, -1.0f};
    double want[N];
    softmax_t(logits, N, temp, want);
    int counts[N];
    struct kvllm_sampling_params p = params(temp, 0, 1.0f, 0.0f);
    CHECK(draw_counts(&p, logits, N, DRAWS, counts) == 0);
    double chi2 = 0, maxdiff = 0;
    for (int i = 0; i < N; i++) {
        double e = want[i] * DRAWS;
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
        double d = fabs(counts[i] / (double)DRAWS - want[i]);
        if (d > maxdiff) maxdiff = d;
    }
    /* 7 degrees of freedom: P(chi2 > 24.32) = 0.001 */
    CHECK_MSG(chi2 < 24.32, "T=%g chi2 %.2f", (double)temp, chi2);
    CHECK_MSG(maxdiff < 0.015, "T=%g max |freq - p| %.4f", (double)temp, maxdiff);
}

static void test_distribution(void) {
    check_distribution(1.0f);
    check_distribution(0.5f);
    check_distribution(2.0f);
}

/* probs 0.5 0.3 0.1 0.05 0.05, shuffled over the ids. */
static void five(float *logits) {
    const double pr[5] = {0.05, 0.3, 0.05, 0.5, 0.1};
    for (int i = 0; i < 5; i++) logits[i] = (float)log(pr[i]);
}

static void test_top_k(void) {
    enum { N = 64 };
    float logits[N];
    for (int i = 0; i < N; i++) logits[i] = (float)(i % 7) * 0.1f; /* many ties */
    /* top 5: id 6, 13, 20, 27, 34 (logit 0.6, lowest ids first) */
    int counts[N];
    struct kvllm_sampling_params p = params(5.0f, 5, 1.0f, 0.0f);
    CHECK(draw_counts(&p, logits, N, 5000, counts) == 0);
    int outside = 0;
    for (int i = 0; i < N; i++) {
        int in = i == 6 || i == 13 || i == 20 || i == 27 || i == 34;
        if (!in) outside += counts[i];
        else CHECK_MSG(counts[i] > 800, "top-k member %d drawn %d times", i, counts[i]);
    }
    CHECK(outside == 0);

    /* top-k >= n_vocab is off: everything can be drawn */
    p = params(1.0f, N, 1.0f, 0.0f);
    CHECK(draw_counts(&p, logits, N, 20000, counts) == 0);
    int zero = 0;
    for (int i = 0; i < N; i++) zero += counts[i] == 0;
    CHECK(zero == 0);
}

static void test_top_p(void) {
    float logits[5];
    five(logits);
    int counts[5];
    /* p = 0.75: 0.5 + 0.3 reaches it -> ids 3 and 1, renormalized 5/8, 3/8 */
    struct kvllm_sampling_params p = params(1.0f, 0, 0.75f, 0.0f);
    CHECK(draw_counts(&p, logits, 5, 20000, counts) == 0);
    CHECK(counts[0] == 0 && counts[2] == 0 && counts[4] == 0);
    CHECK_MSG(fabs(counts[3] / 20000.0 - 0.625) < 0.015, "top-p freq of id 3: %d", counts[3]);
    /* a high temperature reshapes the draw but not the nucleus */
    p = params(50.0f, 0, 0.75f, 0.0f);
    CHECK(draw_counts(&p, logits, 5, 5000, counts) == 0);
    CHECK(counts[0] == 0 && counts[2] == 0 && counts[4] == 0);
    CHECK(counts[1] > 2000 && counts[3] > 2000);
    /* p tiny: only the top token */
    p = params(1.0f, 0, 1e-6f, 0.0f);
    CHECK(draw_counts(&p, logits, 5, 1000, counts) == 0);
    CHECK(counts[3] == 1000);
    /* p = 0.85 -> 3 tokens (0.5 + 0.3 + 0.1) */
    p = params(1.0f, 0, 0.85f, 0.0f);
    CHECK(draw_counts(&p, logits, 5, 20000, counts) == 0);
    CHECK(counts[0] == 0 && counts[2] == 0 && counts[4] > 0);
}

static void test_min_p(void) {
    float logits[5];
    five(logits);
    int counts[5];
    /* min_p 0.15 -> threshold 0.075: keeps 0.5, 0.3, 0.1 */
    struct kvllm_sampling_params p = params(3.0f, 0, 1.0f, 0.15f);
    CHECK(draw_counts(&p, logits, 5, 20000, counts) == 0);
    CHECK(counts[0] == 0 && counts[2] == 0);
    CHECK(counts[1] > 0 && counts[3] > 0 && counts[4] > 0);
    /* min_p 1 -> only the max */
    p = params(3.0f, 0, 1.0f, 1.0f);
    CHECK(draw_counts(&p, logits, 5, 1000, counts) == 0);
    CHECK(counts[3] == 1000);
}

/* A large random vocabulary: drawn ids always inside the brute-force set. */
static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static void test_large_vocab(void) {
    enum { N = 32000, DRAWS = 300 };
    static float logits[N], sorted[N];
    for (int i = 0; i < N; i++) logits[i] = rand_unit() * 10.0f; /* distinct w.h.p. */
    memcpy(sorted, logits, sizeof logits);
    qsort(sorted, N, sizeof(float), cmp_desc);

    /* top-k 40 (+ default top-p/min-p): drawn logit >= the 40th best */
    struct kvllm_sampling_params p = params(1.5f, 40, 0.95f, 0.05f);
    struct kvllm_sampler *s = make(&p, N);
    if (!s) return;
    int bad = 0;
    for (int i = 0; i < DRAWS; i++) {
        int32_t t = kvllm_sampler_sample(s, logits, NULL, 0);
        if (t < 0 || t >= N || logits[t] < sorted[39]) bad++;
    }
    CHECK(bad == 0);
    kvllm_sampler_free(s);

    /* top-p alone over a flat-ish vocabulary (forces the full sort):
     * drawn logit >= the smallest logit in the nucleus. */
    for (int v = 0; v < 2; v++) {
        float top_p = v == 0 ? 0.5f : 0.01f;
        double z = 0, mx = sorted[0];
        for (int i = 0; i < N; i++) z += exp(sorted[i] - mx);
        double cum = 0;
        int keep = N;
        for (int i = 0; i < N; i++) {
            cum += exp(sorted[i] - mx);
            if (cum >= top_p * z) { keep = i + 1; break; }
        }
        p = params(1.0f, 0, top_p, 0.0f);
        s = make(&p, N);
        if (!s) return;
        /* the test sums in double in sorted order, the sampler in another
         * order: allow the boundary to move by one token */
        float edge = sorted[keep < N ? keep : N - 1];
        bad = 0;
        for (int i = 0; i < DRAWS; i++) {
            int32_t t = kvllm_sampler_sample(s, logits, NULL, 0);
            if (t < 0 || t >= N || logits[t] < edge) bad++;
        }
        CHECK_MSG(bad == 0, "top_p %g: %d draws outside the nucleus of %d", (double)top_p, bad, keep);
        CHECK_MSG(keep > (v == 0 ? 300 : 1), "top_p %g: nucleus of %d", (double)top_p, keep);
        kvllm_sampler_free(s);
    }
}

/* top-p cutting through a group of equal logits keeps its lowest ids. */
static void test_top_p_ties(void) {
    enum { N = 5000, DRAWS = 2000 };
    static float logits[N];
    static int counts[N];
    double z = 0;
    int n_top = 0;
    for (int i = 0; i < N; i++) {
        int level = (int)((i * 7919u) % 10u);
        logits[i] = -0.5f * (float)level;
        z += exp(logits[i]);
        n_top += level == 0;
    }
    const float top_p = 0.2f; /* the top level holds ~0.4 of the mass */
    int keep = (int)ceil(top_p * z);  /* weight 1 per top token */
    CHECK(keep > 10 && keep < n_top);
    struct kvllm_sampling_params p = params(1.0f, 0, top_p, 0.0f);
    CHECK(draw_counts(&p, logits, N, DRAWS, counts) == 0);
    int rank = 0, bad = 0, used = 0;
    for (int i = 0; i < N; i++) {
        if (logits[i] != 0.0f) { bad += counts[i]; continue; }
        rank++;
        if (rank > keep + 1) bad += counts[i]; /* one token of rounding slack */
        else used += counts[i] > 0;
    }
    CHECK_MSG(bad == 0, "%d draws outside the %d lowest top ids", bad, keep);
    CHECK_MSG(used > keep * 3 / 4, "only %d of %d nucleus ids drawn", used, keep);
}

static void test_repeat_penalty(void) {
    struct kvllm_sampling_params p = params(0.0f, 0, 1.0f, 0.0f);
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 64;
    struct kvllm_sampler *s = make(&p, 4);
    if (!s) return;
    /* positive logit divided: 2.0 / 1.5 = 1.33 < 1.9 */
    const float pos[4] = {2.0f, 1.9f, -1.0f, -1.05f};
    const int32_t h0[] = {0};
    CHECK(kvllm_sampler_sample(s, pos, NULL, 0) == 0);
    CHECK(kvllm_sampler_sample(s, pos, h0, 1) == 1);
    /* negative logit multiplied: -1 * 1.5 = -1.5 < -1.2 */
    const float neg[4] = {-1.0f, -1.2f, -3.0f, -INFINITY};
    CHECK(kvllm_sampler_sample(s, neg, NULL, 0) == 0);
    CHECK(kvllm_sampler_sample(s, neg, h0, 1) == 1);
    /* each distinct token once: 2.0 / 1.5 = 1.33 > 1.0 (thrice would be 0.59) */
    const float once[4] = {2.0f, 1.0f, 0.0f, 0.0f};
    const int32_t h000[] = {0, 0, 0};
    CHECK(kvllm_sampler_sample(s, once, h000, 3) == 0);
    /* out-of-range ids in the history are ignored */
    const int32_t hbad[] = {-1, 4, 1000, 0};
    CHECK(kvllm_sampler_sample(s, pos, hbad, 4) == 1);
    kvllm_sampler_free(s);

    /* the window: token 0 is 4 back */
    const int32_t hw[] = {0, 2, 2, 2};
    const struct { int last_n; int32_t want; } cases[] = {
        {2, 0}, {3, 0}, {4, 1}, {100, 1}, {-1, 1}, {0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        p.repeat_last_n = cases[i].last_n;
        s = make(&p, 4);
        if (!s) return;
        int32_t got = kvllm_sampler_sample(s, pos, hw, 4);
        CHECK_MSG(got == cases[i].want, "repeat_last_n %d: got %d want %d",
                  cases[i].last_n, got, cases[i].want);
        kvllm_sampler_free(s);
    }

    /* penalty 1: off */
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = -1;
    s = make(&p, 4);
    if (!s) return;
    CHECK(kvllm_sampler_sample(s, pos, hw, 4) == 0);
    kvllm_sampler_free(s);

    /* penalty < 1 boosts: 1.9 / 0.5 = 3.8 > 2.0 */
    p.repeat_penalty = 0.5f;
    s = make(&p, 4);
    if (!s) return;
    const int32_t h1[] = {1};
    CHECK(kvllm_sampler_sample(s, pos, h1, 1) == 1);
    kvllm_sampler_free(s);

    /* a stochastic sampler too: the penalized token loses most of its mass */
    p = params(1.0f, 0, 1.0f, 0.0f);
    p.repeat_penalty = 10.0f;
    const float two[2] = {3.0f, 0.0f};
    s = make(&p, 2);
    if (!s) return;
    int n0 = 0;
    for (int i = 0; i < 1000; i++) n0 += kvllm_sampler_sample(s, two, h0, 1) == 0;
    CHECK_MSG(n0 < 700, "penalized token drawn %d / 1000", n0); /* p0 = 0.57 */
    kvllm_sampler_free(s);
}

static void test_masked(void) {
    enum { N = 10 };
    float logits[N];
    for (int i = 0; i < N; i++) logits[i] = (float)i * 0.3f;
    logits[9] = -INFINITY; /* would be the max */
    logits[0] = -INFINITY;
    logits[4] = NAN;
    int counts[N];
    const struct kvllm_sampling_params ps[] = {
        params(1.5f, 0, 1.0f, 0.0f),
        params(5.0f, 0, 0.99f, 0.0f),
        params(5.0f, 8, 1.0f, 0.0f),    /* top-k larger than the unmasked set */
        params(5.0f, 3, 0.99f, 0.01f),
    };
    for (size_t v = 0; v < sizeof ps / sizeof ps[0]; v++) {
        CHECK(draw_counts(&ps[v], logits, N, 5000, counts) == 0);
        CHECK_MSG(counts[0] == 0 && counts[9] == 0 && counts[4] == 0, "variant %zu", v);
    }
    CHECK(counts[8] > 0);

    /* +inf: always drawn (both +inf share the mass) */
    logits[2] = INFINITY;
    logits[6] = INFINITY;
    struct kvllm_sampling_params p = params(1.0f, 0, 1.0f, 0.0f);
    CHECK(draw_counts(&p, logits, N, 2000, counts) == 0);
    CHECK(counts[2] + counts[6] == 2000 && counts[2] > 800 && counts[6] > 800);

    /* every logit masked: an error, not a token */
    for (int i = 0; i < N; i++) logits[i] = i % 2 ? -INFINITY : NAN;
    for (int g = 0; g < 2; g++) {
        p = params(g ? 0.0f : 1.0f, 40, 0.95f, 0.05f);
        struct kvllm_sampler *s = make(&p, N);
        if (!s) return;
        tu_log_reset();
        kvllm_log_set(tu_log_capture, NULL);
        CHECK(kvllm_sampler_sample(s, logits, NULL, 0) == KVLLM_EINVAL);
        kvllm_log_set(NULL, NULL);
        CHECK(tu_log.n == 1);
        kvllm_sampler_free(s);
    }
}

static void expect_invalid(struct kvllm_sampling_params p, int n_vocab, const char *field) {
    struct kvllm_sampler *s = (struct kvllm_sampler *)&p; /* must be overwritten with NULL */
    tu_log_reset();
    kvllm_log_set(tu_log_capture, NULL);
    int err = kvllm_sampler_new(&p, n_vocab, &s);
    kvllm_log_set(NULL, NULL);
    CHECK_MSG(err == KVLLM_EINVAL, "%s: err %d", field, err);
    CHECK(s == NULL);
    CHECK_MSG(tu_log.n == 1 && strstr(tu_log.last, field), "%s: log '%s'", field, tu_log.last);
}

static void test_invalid(void) {
    struct kvllm_sampling_params d = kvllm_sampling_default_params(), p;
    p = d; p.top_p = 0.0f;           expect_invalid(p, 100, "top_p");
    p = d; p.top_p = -0.5f;          expect_invalid(p, 100, "top_p");
    p = d; p.top_p = NAN;            expect_invalid(p, 100, "top_p");
    p = d; p.min_p = -0.1f;          expect_invalid(p, 100, "min_p");
    p = d; p.min_p = 1.5f;           expect_invalid(p, 100, "min_p");
    p = d; p.min_p = NAN;            expect_invalid(p, 100, "min_p");
    p = d; p.repeat_penalty = 0.0f;  expect_invalid(p, 100, "repeat_penalty");
    p = d; p.repeat_penalty = -1.0f; expect_invalid(p, 100, "repeat_penalty");
    p = d; p.repeat_penalty = NAN;   expect_invalid(p, 100, "repeat_penalty");
    p = d; p.repeat_penalty = INFINITY; expect_invalid(p, 100, "repeat_penalty");
    p = d; p.temperature = NAN;      expect_invalid(p, 100, "temperature");
    p = d;                           expect_invalid(p, 0, "n_vocab");
    p = d;                           expect_invalid(p, -5, "n_vocab");

    struct kvllm_sampler *s = NULL;
    kvllm_log_set(tu_log_capture, NULL);
    CHECK(kvllm_sampler_new(NULL, 100, &s) == KVLLM_EINVAL && s == NULL);
    CHECK(kvllm_sampler_new(&d, 100, NULL) == KVLLM_EINVAL);
    kvllm_log_set(NULL, NULL);

    /* the edges that are valid */
    const struct kvllm_sampling_params ok[] = {
        params(-2.0f, 0, 1.0f, 0.0f),   /* negative temperature: greedy */
        params(1.0f, -3, 1.5f, 0.0f),   /* top_k < 0, top_p > 1: off */
        params(1.0f, 5, 1.0f, 1.0f),    /* min_p 1 */
        params(1.0f, 5, 1e-9f, 0.0f),
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        s = NULL;
        CHECK_MSG(kvllm_sampler_new(&ok[i], 1, &s) == 0 && s, "ok[%zu]", i);
        float one = 0.0f;
        if (s) CHECK(kvllm_sampler_sample(s, &one, NULL, 0) == 0);
        kvllm_sampler_free(s);
    }
}

/* OpenAI presence / frequency penalties: logit - frequency * count - presence. */
static void test_presence_frequency(void) {
    struct kvllm_sampling_params p = params(0.0f, 0, 1.0f, 0.0f);
    p.repeat_last_n = -1;
    p.presence_penalty = 0.5f;
    struct kvllm_sampler *s = make(&p, 3);
    if (!s) return;
    const float l[3] = { 1.0f, 0.8f, 0.0f };
    const int32_t h[] = { 0, 0, 0 };
    CHECK(kvllm_sampler_sample(s, l, h, 3) == 1);  /* 1.0 - 0.5 = 0.5 < 0.8: once, not per occurrence */
    const float l2[3] = { 1.0f, 0.4f, 0.0f };
    CHECK(kvllm_sampler_sample(s, l2, h, 3) == 0); /* 0.5 > 0.4 */
    kvllm_sampler_free(s);
    p.presence_penalty = 0;
    p.frequency_penalty = 0.1f;
    s = make(&p, 3);
    if (!s) return;
    CHECK(kvllm_sampler_sample(s, l, h, 2) == 0);  /* 1.0 - 0.2 = 0.8: tie, lowest id */
    CHECK(kvllm_sampler_sample(s, l, h, 3) == 1);  /* 1.0 - 0.3 = 0.7 < 0.8 */
    kvllm_sampler_free(s);
    p.frequency_penalty = 3.0f; /* out of OpenAI's [-2, 2] */
    struct kvllm_sampler *bad = NULL;
    CHECK(kvllm_sampler_new(&p, 3, &bad) == KVLLM_EINVAL && bad == NULL);
}

int main(void) {
    test_defaults();
    test_presence_frequency();
    test_greedy();
    test_top_k1_is_greedy();
    test_determinism();
    test_distribution();
    test_top_k();
    test_top_p();
    test_min_p();
    test_large_vocab();
    test_top_p_ties();
    test_repeat_penalty();
    test_masked();
    test_invalid();
    return check_report("test_sample_sampler");
}
