/* test_engine_model_params.c — where a model runs is a parameter of
 * kvllm_model_load, never the environment: each field of struct
 * kvllm_model_params reaches the backend (its name says which), a name
 * outside the valid ones is refused with nothing left loaded, and the
 * variables the CLI reads (set here to nonsense) change nothing. */
#include "check.h"
#include "stories_util.h"
#include "kvllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_path[512], g_tok[512];

/* Load stories260K on the backend the three names choose; *m NULL on error. */
static int load(const char *backend, const char *kernels, const char *act, struct kvllm_model **m) {
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = g_tok;
    mp.n_threads = 1;
    mp.backend = backend;
    mp.cpu_kernels = kernels;
    mp.activations = act;
    *m = (struct kvllm_model *)1;
    return kvllm_model_load(g_path, &mp, m);
}

/* A load that must succeed on the backend named want. */
static void expect_backend(const char *backend, const char *kernels, const char *act, const char *want) {
    struct kvllm_model *m;
    const int rc = load(backend, kernels, act, &m);
    CHECK_MSG(rc == 0 && m, "backend %s, kernels %s, activations %s: %s", backend ? backend : "(default)",
              kernels ? kernels : "(default)", act ? act : "(default)", kvllm_strerror(rc));
    if (m) CHECK_MSG(strcmp(kvllm_model_backend(m), want) == 0, "on %s, expected %s", kvllm_model_backend(m), want);
    kvllm_model_free(m);
}

/* A load that must fail with rc and leave no model. */
static void expect_refused(const char *backend, const char *kernels, const char *act, int rc) {
    struct kvllm_model *m;
    const int got = load(backend, kernels, act, &m);
    CHECK_MSG(got == rc && m == NULL, "backend %s, kernels %s, activations %s: %s, expected %s",
              backend ? backend : "(default)", kernels ? kernels : "(default)", act ? act : "(default)",
              kvllm_strerror(got), kvllm_strerror(rc));
}

int main(void) {
    snprintf(g_path, sizeof g_path, "%s/models/stories260K/stories260K.bin", check_shared_dir());
    snprintf(g_tok, sizeof g_tok, "%s/models/stories260K/tok512.bin", check_shared_dir());
    setenv("KVLLM_BACKEND", "bogus", 1);   /* read by the CLI alone */
    setenv("KVLLM_CPU", "bogus", 1);
    setenv("KVLLM_ACT", "bogus", 1);
    setenv("KVLLM_CUDA_DEVICE", "bogus", 1);
    struct kvllm_build_info bi;
    kvllm_build_info(&bi);
    expect_backend(NULL, NULL, NULL, bi.cpu_kernels_default);
    expect_backend("", "", "", bi.cpu_kernels_default);
    expect_backend("cpu", "scalar", "f32", "scalar");
    expect_backend("strict", "scalar", "q8", "strict/scalar");
    char strict_best[32];
    snprintf(strict_best, sizeof strict_best, "strict/%s", bi.cpu_kernels_default);
    expect_backend("strict", NULL, "int", strict_best);
    fprintf(stderr, "(the next errors are expected)\n");
    expect_refused("gpu", NULL, NULL, KVLLM_EINVAL);
    expect_refused(NULL, "avx9", NULL, KVLLM_ECPU);
    expect_refused(NULL, NULL, "q4", KVLLM_EINVAL);
    if (!bi.cuda_built) expect_refused("cuda", NULL, NULL, KVLLM_EUNSUPPORTED);
    return check_report("test_engine_model_params");
}
