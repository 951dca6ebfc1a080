/* cli_backend.c — where a command's model runs: the environment variables
 * kvllm's users and tests set (KVLLM_BACKEND, KVLLM_CPU, KVLLM_ACT,
 * KVLLM_CUDA_DEVICE) and the flags llama.cpp and vLLM users reach for
 * (-dev/--device, -mg/--main-gpu), turned into kvllm_model_params.  The
 * library reads no environment variable: this file is the one place the
 * CLI's habits meet its parameters.  A flag wins over the variable it
 * overlaps. */
#include "cli.h"
#include "kvllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* What the flags chose (unset: NULL, -1). */
static struct {
    const char *backend;          /* -dev's backend */
    int device;                   /* -dev's index or -mg's */
    char backend_opt[64];         /* the flags as given, for messages */
    char device_opt[64];
} g_flags = { NULL, -1, "", "" };

/* A device index: digits only, in int's range; -1 when s is not one. */
static int device_index(const char *s) {
    if (!s || !*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 6) return -1;
    return atoi(s);
}

int cli_device_flag(const char *opt, const char *v) {
    static const char *const valid = "none or cpu (the CPU), cuda (the first GPU or -mg's), CUDA<N>, cuda<N> or "
                                     "cuda:<N> (GPU N)";
    if (strchr(v, ',')) {
        cli_error("%s %s: kvllm runs a model on one device (several GPUs: tensor parallelism over MPI ranks, "
                  "docs/TP.md)", opt, v);
        return 2;
    }
    const char *n = !strncmp(v, "cuda:", 5) ? v + 5 : !strncasecmp(v, "cuda", 4) ? v + 4 : NULL;
    const bool cpu = !strcmp(v, "none") || !strcmp(v, "cpu"), first = n && !*n && n[-1] != ':';
    const int dev = n && !first ? device_index(n) : -1;
    if (!cpu && !first && dev < 0) {
        cli_error("%s %s: not a device (valid: %s)", opt, v, valid);
        return 2;
    }
    g_flags.backend = cpu ? "cpu" : "cuda";
    snprintf(g_flags.backend_opt, sizeof g_flags.backend_opt, "%s %s", opt, v);
    if (dev >= 0) {
        g_flags.device = dev;
        g_flags.device_opt[0] = '\0';   /* said by backend_opt */
    }
    return 0;
}

int cli_main_gpu_flag(const char *opt, const char *v) {
    const int dev = device_index(v);
    if (dev < 0) {
        cli_error("%s %s: expected a GPU's index (0, 1, ...)", opt, v);
        return 2;
    }
    g_flags.device = dev;
    snprintf(g_flags.device_opt, sizeof g_flags.device_opt, "%s %s", opt, v);
    return 0;
}

/* A variable's value, NULL when unset or empty (the default). */
static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Append "NAME=value" (or a flag) to the list of what chose the backend. */
static void said(char *buf, size_t size, const char *what, const char *v) {
    const size_t n = strlen(buf);
    if (v && n < size) snprintf(buf + n, size - n, "%s%s%s", n ? ", " : "", what, v);
}

/* Fill p's backend fields from the environment and the flags; 0, or 2
 * (printed) for a KVLLM_CUDA_DEVICE that is not an index.  origin: what
 * chose them, for messages ("" when nothing did). */
static int backend_choice(struct kvllm_model_params *p, char *origin, size_t size) {
    origin[0] = '\0';
    p->backend = g_flags.backend ? g_flags.backend : env("KVLLM_BACKEND");
    said(origin, size, g_flags.backend ? "" : "KVLLM_BACKEND=", g_flags.backend ? g_flags.backend_opt : p->backend);
    p->cpu_kernels = env("KVLLM_CPU");
    said(origin, size, "KVLLM_CPU=", p->cpu_kernels);
    p->activations = env("KVLLM_ACT");
    said(origin, size, "KVLLM_ACT=", p->activations);
    const char *dev = env("KVLLM_CUDA_DEVICE");
    if (g_flags.device >= 0) {
        p->device = g_flags.device;
        if (g_flags.device_opt[0]) said(origin, size, "", g_flags.device_opt);
    } else if (dev) {
        p->device = device_index(dev);
        if (p->device < 0) {
            cli_error("KVLLM_CUDA_DEVICE=%s: expected a GPU's index (0, 1, ...)", dev);
            return 2;
        }
        said(origin, size, "KVLLM_CUDA_DEVICE=", dev);
    }
    static bool noted;
    const bool cuda = p->backend && !strcmp(p->backend, "cuda");
    if (g_flags.device_opt[0] && !cuda && !noted) {
        noted = true;
        fprintf(stderr, "kvllm: note: %s ignored: the model runs on the CPU (-dev cuda or KVLLM_BACKEND=cuda "
                        "selects the GPU)\n", g_flags.device_opt);
    }
    return 0;
}

int cli_model_open(const char *path, const struct kvllm_model_params *mp, struct kvllm_model **out) {
    *out = NULL;
    struct kvllm_model_params p = *mp;
    char origin[256];
    if (backend_choice(&p, origin, sizeof origin)) return KVLLM_EINVAL;
    const int rc = kvllm_model_load(path, &p, out);
    /* the library names its fields (cpu_kernels=...); say which variable or flag set them, when the
     * choice can be what failed: a bad value, a CPU without the kernels, an op the GPU backend lacks (a
     * feature of the file the CPU backends do not run is the file's fault, whichever one was chosen) */
    const bool cuda = p.backend && !strcmp(p.backend, "cuda");
    if (origin[0] && (rc == KVLLM_EINVAL || rc == KVLLM_ECPU || (rc == KVLLM_EUNSUPPORTED && cuda)))
        fprintf(stderr, "kvllm: note: the backend was chosen by %s\n", origin);
    return rc;
}
