/* chain.h — the sampling chain after the logits are final: candidates,
 * top-k -> top-p -> min-p -> temperature -> softmax -> draw.
 *
 * One implementation for both sides of the sampling stage: the host
 * sampler (sampler.c) runs it after its logit bias, allow-mask and
 * penalties, and the CPU backend's sample op (backend/cpu/sample.c) runs it
 * on rows that need nothing else, so a row gives the same token whichever
 * side samples it.  The draw u is an input: the caller takes it from the
 * request's seeded RNG (one rng_f32 per non-greedy sample), so the RNG
 * stream is the same on either side.
 *
 * Candidates are ordered by a total order — higher logit first, lower id on
 * equal logits — so ties resolve to the lowest id and the result never
 * depends on the sorting algorithm.  top-p and min-p look at the softmax of
 * the surviving candidates at temperature 1 (llama.cpp's chain: temperature
 * comes last), so the temperature reshapes only the draw.  The draw walks
 * the survivors in the total order when top-k or top-p cut them (they are
 * sorted then), in id order otherwise.
 *
 * Logits: -inf masks a token out; NaN counts as -inf; +inf counts as the
 * largest finite float.  Depends on libc and libm alone. */
#ifndef KVLLM_SAMPLE_CHAIN_H
#define KVLLM_SAMPLE_CHAIN_H

#include <stddef.h>
#include <stdint.h>

struct sample_cand {
    float logit;
    int32_t id;
};

/* One row's sampling: the truncations and the draw (the backend's sample
 * op takes an array of them, uploaded with the step). */
struct sample_chain {
    float temperature;            /* > 0 (<= 0 is greedy: sample_chain_pick returns the argmax) */
    int32_t top_k;                /* <= 0: off */
    float top_p;                  /* >= 1: off */
    float min_p;                  /* <= 0: off */
    float u;                      /* the draw, uniform in [0, 1) */
};

/* Scratch a pick over rows of n_vocab needs: the candidates, then the
 * weights (sample_chain_pick's c and prob). */
#define SAMPLE_CHAIN_SCRATCH(n_vocab) ((size_t)(n_vocab) * (sizeof(struct sample_cand) + sizeof(float)))

/* c (n) = the candidates of logits (n): every token but -inf and NaN, in id
 * order, +inf clamped to FLT_MAX.  Returns their count (0: none). */
size_t sample_chain_cands(const float *logits, int n, struct sample_cand *c);

/* The token of candidates c (n >= 1, in id order as sample_chain_cands
 * leaves them) under p; c is reordered and prob (n) is scratch. */
int32_t sample_chain_pick(struct sample_cand *c, size_t n, float *prob, const struct sample_chain *p);

/* Both for a row of logits (n_vocab) with scratch of
 * SAMPLE_CHAIN_SCRATCH(n_vocab) bytes: the token, or -1 when every logit is
 * -inf or NaN. */
int32_t sample_chain_row(const float *logits, int n_vocab, const struct sample_chain *p, void *scratch);

#endif
