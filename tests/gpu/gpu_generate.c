/* gpu_generate.c — greedy generation through the public API, for the GPU
 * check (scripts/gpu-check.sh), where the CLI is not built (KVLLM_CORE_ONLY).
 *
 *   gpu_generate MODEL TOKENIZER|- N
 *
 * Evaluates BOS, then N times the argmax of the last logits (ties: the
 * lowest id), one token per step through a session, and prints the N ids
 * on one line separated by spaces, as `kvllm run --temp 0 --ids` does.  The
 * backend is KVLLM_BACKEND's (cpu, strict, cuda).  Exit 0, or 1 with the
 * error logged. */
#include "kvllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: gpu_generate MODEL TOKENIZER|- N\n");
        return 2;
    }
    const int n = atoi(argv[3]);
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = strcmp(argv[2], "-") == 0 ? NULL : argv[2];
    struct kvllm_model *m = NULL;
    if (kvllm_model_load(argv[1], &mp, &m)) return 1;
    const struct kvllm_model_desc *d = kvllm_model_describe(m);
    fprintf(stderr, "gpu_generate: backend %s, %d layers, vocab %d\n", kvllm_model_backend(m), d->n_layer,
            d->n_vocab);
    struct kvllm_session_params sp = { .n_ctx = n + 1 };
    struct kvllm_session *s = NULL;
    float *logits = malloc((size_t)d->n_vocab * sizeof *logits);
    int rc = logits ? kvllm_session_new(m, &sp, &s) : KVLLM_ENOMEM;
    int32_t tok = d->token_bos >= 0 ? d->token_bos : 1;
    for (int i = 0; !rc && i < n; i++) {
        rc = kvllm_session_eval(s, &tok, 1, false, logits);
        if (rc) break;
        int best = 0;
        for (int v = 1; v < d->n_vocab; v++)
            if (logits[v] > logits[best]) best = v;
        tok = best;
        printf(i ? " %d" : "%d", tok);
    }
    printf("\n");
    if (rc) fprintf(stderr, "gpu_generate: %s\n", kvllm_strerror(rc));
    kvllm_session_free(s);
    kvllm_model_free(m);
    free(logits);
    return rc ? 1 : 0;
}
