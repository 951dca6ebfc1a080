/* stories_util.h — the engine tests' model: stories260K (llama2.c
 * checkpoint + tok512 vocabulary) from the test data folder. */
#ifndef KVLLM_STORIES_UTIL_H
#define KVLLM_STORIES_UTIL_H
#include "check.h"
#include "kvllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The engine tests' model params: the defaults, on the backend
 * KVLLM_BACKEND names (the strict_unit_* runs set "strict").  The test
 * reads the variable, as the CLI does: the library reads none. */
static inline struct kvllm_model_params test_model_params(void) {
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.backend = getenv("KVLLM_BACKEND");
    return mp;
}

/* Whether m runs on the backend mp asked for (a strict run that silently
 * fell back to the plain CPU would prove nothing). */
static inline bool test_model_on_backend(const struct kvllm_model *m, const struct kvllm_model_params *mp) {
    const bool strict = mp->backend && strcmp(mp->backend, "strict") == 0;
    return strict == (strncmp(kvllm_model_backend(m), "strict/", 7) == 0);
}

/* Load stories260K with n_threads per execution context; NULL (after a
 * failed CHECK) when it cannot be loaded. */
static inline struct kvllm_model *load_stories(int n_threads) {
    char path[512], tok[512];
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.bin", check_shared_dir());
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", check_shared_dir());
    struct kvllm_model_params mp = test_model_params();
    mp.tokenizer_path = tok;
    mp.n_threads = n_threads;
    struct kvllm_model *m = NULL;
    CHECK(kvllm_model_load(path, &mp, &m) == 0);
    if (m) CHECK_MSG(test_model_on_backend(m, &mp), "model on %s", kvllm_model_backend(m));
    return m;
}
#endif
