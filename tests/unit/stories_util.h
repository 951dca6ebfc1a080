/* stories_util.h — the engine tests' model: stories260K (llama2.c
 * checkpoint + tok512 vocabulary) from the test data folder. */
#ifndef KVLLM_STORIES_UTIL_H
#define KVLLM_STORIES_UTIL_H
#include "check.h"
#include "kvllm.h"

#include <stdio.h>

/* Load stories260K with n_threads per execution context; NULL (after a
 * failed CHECK) when it cannot be loaded. */
static inline struct kvllm_model *load_stories(int n_threads) {
    char path[512], tok[512];
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.bin", check_shared_dir());
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", check_shared_dir());
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = tok;
    mp.n_threads = n_threads;
    struct kvllm_model *m = NULL;
    CHECK(kvllm_model_load(path, &mp, &m) == 0);
    return m;
}
#endif
