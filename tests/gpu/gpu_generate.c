/* gpu_generate.c — greedy generation through the public API, for the GPU
 * check (scripts/gpu-check.sh), where the CLI is not built (KVLLM_CORE_ONLY).
 *
 *   gpu_generate MODEL TOKENIZER|- N [PREFILL [MARGINS]]
 *
 * Evaluates BOS and PREFILL prompt tokens (default 0; ids (31 i + 7) mod
 * vocab) in one call, then N times the argmax of the last logits (ties: the
 * lowest id), one token per step through a session, and prints the N ids
 * on one line separated by spaces, as `kvllm run --temp 0 --ids` does.
 * MARGINS, a file, gets one line per generated token: its id, the runner-up
 * and the logit margin between them (where two backends part ways, the
 * margin says whether it was a near-tie).  The backend is the one
 * KVLLM_BACKEND names (cpu, strict, cuda; read here, as the CLI does) on
 * device KVLLM_CUDA_DEVICE (default 0), with the kernel set KVLLM_CPU and
 * the activations KVLLM_ACT name (as the CLI reads them); KVLLM_ENFORCE_EAGER=1 issues every
 * op directly instead of replaying recorded forwards (CUDA graphs), as
 * --enforce-eager does.  Exit 0, or 1 with the error logged. */
#include "kvllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "usage: gpu_generate MODEL TOKENIZER|- N [PREFILL [MARGINS]]\n");
        return 2;
    }
    const int n = atoi(argv[3]), n_pre = argc > 4 ? atoi(argv[4]) : 0;
    FILE *mf = argc > 5 ? fopen(argv[5], "w") : NULL;
    if (n < 1 || n_pre < 0 || (argc > 5 && !mf)) {
        fprintf(stderr, "gpu_generate: N must be >= 1, PREFILL >= 0, MARGINS a writable file\n");
        return 2;
    }
    struct kvllm_model_params mp = kvllm_model_default_params();
    mp.tokenizer_path = strcmp(argv[2], "-") == 0 ? NULL : argv[2];
    mp.backend = getenv("KVLLM_BACKEND");
    mp.cpu_kernels = getenv("KVLLM_CPU");
    mp.activations = getenv("KVLLM_ACT");
    const char *dev = getenv("KVLLM_CUDA_DEVICE");
    mp.device = dev && *dev ? atoi(dev) : 0;
    struct kvllm_model *m = NULL;
    if (kvllm_model_load(argv[1], &mp, &m)) return 1;
    const struct kvllm_model_desc *d = kvllm_model_describe(m);
    fprintf(stderr, "gpu_generate: backend %s, %d layers, vocab %d\n", kvllm_model_backend(m), d->n_layer,
            d->n_vocab);
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    const char *eager = getenv("KVLLM_ENFORCE_EAGER");
    ep.enforce_eager = eager && *eager && strcmp(eager, "0") != 0;
    struct kvllm_session_params sp = { .n_ctx = n + n_pre + 1, .engine = &ep };
    struct kvllm_session *s = NULL;
    float *logits = malloc((size_t)d->n_vocab * sizeof *logits);
    int32_t *prompt = malloc((size_t)(n_pre + 1) * sizeof *prompt);
    int rc = logits && prompt ? kvllm_session_new(m, &sp, &s) : KVLLM_ENOMEM;
    if (!rc) {
        prompt[0] = d->token_bos >= 0 ? d->token_bos : 1;
        for (int i = 1; i <= n_pre; i++) prompt[i] = (int32_t)((31L * i + 7) % d->n_vocab);
        rc = kvllm_session_eval(s, prompt, n_pre + 1, false, logits);
    }
    for (int i = 0; !rc && i < n; i++) {
        int best = 0, second = d->n_vocab > 1 ? 1 : 0;
        for (int v = 1; v < d->n_vocab; v++)
            if (logits[v] > logits[best]) {
                second = best;
                best = v;
            } else if (v != best && logits[v] > logits[second]) {
                second = v;
            }
        if (mf) fprintf(mf, "%d %d %.6g\n", best, second, (double)(logits[best] - logits[second]));
        int32_t tok = best;
        printf(i ? " %d" : "%d", tok);
        if (i + 1 < n) rc = kvllm_session_eval(s, &tok, 1, false, logits);
    }
    printf("\n");
    if (rc) fprintf(stderr, "gpu_generate: %s\n", kvllm_strerror(rc));
    kvllm_session_free(s);
    kvllm_model_free(m);
    free(logits);
    free(prompt);
    if (mf) fclose(mf);
    return rc ? 1 : 0;
}
