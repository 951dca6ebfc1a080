/* backend.c — choosing a backend (struct backend_params) and freeing one:
 * the only place that knows every backend.  Without -DKVLLM_CUDA=ON the
 * CUDA entry points here answer "not built". */
#include "backend/backend.h"
#include "backend/backend_list.h"
#include "core/core.h"

#include <stdio.h>
#include <string.h>

/* name's index in names[0 .. n) (NULL or "": 0, the default), or
 * KVLLM_EINVAL logged with the field, what it chooses and the choices. */
static int parse_choice(const char *field, const char *what, const char *name, const char *const *names, int n,
                        int *out) {
    for (int i = 0; i < n; i++)
        if (!name || !*name ? i == 0 : strcmp(name, names[i]) == 0) {
            *out = i;
            return 0;
        }
    char valid[64] = "";
    for (int i = 0; i < n; i++)
        snprintf(valid + strlen(valid), sizeof valid - strlen(valid), i ? ", %s" : "%s", names[i]);
    LOG_ERR("%s=%s: unknown %s (valid: %s)", field, name, what, valid);
    return KVLLM_EINVAL;
}

int backend_kind_parse(const char *name, enum backend_kind *out) {
    static const char *const names[] = { [BACKEND_CPU] = "cpu", [BACKEND_STRICT] = "strict", [BACKEND_CUDA] = "cuda" };
    int i, rc = parse_choice("backend", "backend", name, names, 3, &i);
    if (!rc) *out = (enum backend_kind)i;
    return rc;
}

int backend_act_parse(const char *name, enum backend_act *out) {
    static const char *const names[] = { [BACKEND_ACT_Q8] = "q8", [BACKEND_ACT_F32] = "f32",
                                         [BACKEND_ACT_INT] = "int" };
    int i, rc = parse_choice("activations", "activation arithmetic", name, names, 3, &i);
    if (!rc) *out = (enum backend_act)i;
    return rc;
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
        [BACKEND_OP_MATMULS] = "matmuls",
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
