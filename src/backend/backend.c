/* backend.c — choosing a backend (KVLLM_BACKEND) and freeing one: the only
 * place that knows every backend.  Without -DKVLLM_CUDA=ON the CUDA entry
 * points here answer "not built". */
#include "backend/backend.h"
#include "backend/backend_list.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int backend_new_from_env(const char *kind, struct backend **out) {
    const char *name = getenv("KVLLM_BACKEND");
    if (!name || !*name || strcmp(name, "cpu") == 0) return backend_cpu_new(kind, false, out);
    if (strcmp(name, "strict") == 0) return backend_cpu_new(kind, true, out);
    if (strcmp(name, "cuda") == 0) return backend_cuda_new(out);
    *out = NULL;
    LOG_ERR("KVLLM_BACKEND=%s: unknown backend (valid: cpu, strict, cuda)", name);
    return KVLLM_EINVAL;
}

void backend_free(struct backend *be) {
    if (!be) return;
    if (backend_is_cuda(be)) backend_cuda_free(be);
    else backend_cpu_free(be);
}

#ifndef KVLLM_HAVE_CUDA
bool backend_cuda_built(void) { return false; }

int backend_cuda_probe(char *why, size_t why_size) {
    snprintf(why, why_size, "this build has no CUDA backend (configure with -DKVLLM_CUDA=ON)");
    return 0;
}

int backend_cuda_new(struct backend **out) {
    *out = NULL;
    LOG_ERR("KVLLM_BACKEND=cuda: this build has no CUDA backend (configure with -DKVLLM_CUDA=ON; "
            "available: cpu, strict)");
    return KVLLM_EUNSUPPORTED;
}

bool backend_is_cuda(const struct backend *be) { return false; }
void backend_cuda_free(struct backend *be) {}
#endif
