/* backend.c — choosing a backend (struct backend_params) and freeing one:
 * the only place that knows every backend.  Without -DKVLLM_CUDA=ON the
 * CUDA entry points here answer "not built". */
#include "backend/backend.h"
#include "backend/backend_list.h"
#include "core/core.h"

#include <stdio.h>
#include <string.h>

int backend_kind_parse(const char *name, enum backend_kind *out) {
    if (!name || !*name || strcmp(name, "cpu") == 0) *out = BACKEND_CPU;
    else if (strcmp(name, "strict") == 0) *out = BACKEND_STRICT;
    else if (strcmp(name, "cuda") == 0) *out = BACKEND_CUDA;
    else {
        LOG_ERR("backend=%s: unknown backend (valid: cpu, strict, cuda)", name);
        return KVLLM_EINVAL;
    }
    return 0;
}

int backend_act_parse(const char *name, enum backend_act *out) {
    if (!name || !*name || strcmp(name, "q8") == 0) *out = BACKEND_ACT_Q8;
    else if (strcmp(name, "f32") == 0) *out = BACKEND_ACT_F32;
    else if (strcmp(name, "int") == 0) *out = BACKEND_ACT_INT;
    else {
        LOG_ERR("activations=%s: unknown activation arithmetic (valid: q8, f32, int)", name);
        return KVLLM_EINVAL;
    }
    return 0;
}

int backend_new(const struct backend_params *p, struct backend **out) {
    *out = NULL;
    switch (p->kind) {
    case BACKEND_CPU: return backend_cpu_new(p->cpu_kernels, false, p->act, out);
    case BACKEND_STRICT: return backend_cpu_new(p->cpu_kernels, true, p->act, out);
    case BACKEND_CUDA: return backend_cuda_new(p->device, p->act, out);
    }
    LOG_ERR("backend kind %d: unknown", (int)p->kind);
    return KVLLM_EINVAL;
}

void backend_free(struct backend *be) {
    if (be) be->ops->free(be);
}

const char *backend_op_name(enum backend_op op) {
    static const char *const names[BACKEND_OP_COUNT_] = {
        [BACKEND_OP_MATMUL] = "matmul", [BACKEND_OP_GET_ROWS] = "get_rows",
        [BACKEND_OP_MOE] = "moe (mixture of experts)", [BACKEND_OP_KV_SHIFT] = "kv_shift",
        [BACKEND_OP_SAMPLE] = "sample", [BACKEND_OP_ADD_RMSNORM] = "add_rmsnorm",
        [BACKEND_OP_ROPE_KV_STORE] = "rope_kv_store",
    };
    return (unsigned)op < BACKEND_OP_COUNT_ ? names[op] : "?";
}

#ifndef KVLLM_HAVE_CUDA
bool backend_cuda_built(void) { return false; }

int backend_cuda_probe(char *why, size_t why_size) {
    snprintf(why, why_size, "this build has no CUDA backend (configure with -DKVLLM_CUDA=ON)");
    return 0;
}

int backend_cuda_new(int device, enum backend_act act, struct backend **out) {
    (void)device, (void)act;
    *out = NULL;
    LOG_ERR("backend=cuda: this build has no CUDA backend (configure with -DKVLLM_CUDA=ON; "
            "available: cpu, strict)");
    return KVLLM_EUNSUPPORTED;
}
#endif
