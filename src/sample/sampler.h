/* sampler.h — what the engine needs of a sampler beyond kvllm.h: its chain
 * parameters and its next draw, for a row the backend samples (the
 * backend's sample op runs chain.h's chain on the device's logits). */
#ifndef KVLLM_SAMPLER_H
#define KVLLM_SAMPLER_H

#include "kvllm.h"
#include "sample/chain.h"

#include <stdbool.h>

/* *out = s's truncations and temperature with u = the draw s would take
 * for its next sample (advancing its RNG exactly as kvllm_sampler_sample
 * does); greedy (temperature <= 0) leaves the RNG untouched, u = 0, and
 * returns false.  Whoever calls this must then sample that row with *out
 * and not through kvllm_sampler_sample. */
bool sampler_chain_next(struct kvllm_sampler *s, struct sample_chain *out);

#endif
