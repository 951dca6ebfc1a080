/* test_cuda_errors.c — the CUDA backend's error path, on a runtime that fails on demand.
 *
 * The CUDA runtime remembers a failed call as its "last error" until cudaGetLastError reads it,
 * and the backend checks every kernel launch with cudaGetLastError.  A failure the backend has
 * already reported must therefore be cleared, or the next launch reports it again, under another
 * op.  This test defines the runtime calls cuda.c makes (the executable's definitions win over
 * libcudart's), makes one of them fail at a time, and checks after each failure that the backend
 * returned an error and that the runtime's last error is clear.  No kernel is launched and no GPU
 * is needed; it runs wherever the CUDA backend is built (make cuda-ci). */
#include "backend/backend.h"
#include "backend/backend_list.h"

#include <cuda_runtime_api.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the runtime, faked ---- */

static const char *g_fail;                 /* the call that fails next (NULL: none) */
static cudaError_t g_last = cudaSuccess;   /* the runtime's last error */
static int g_calls_failed;

/* Whether call `name` fails now; a failure is recorded as the last error, as the runtime does. */
static cudaError_t fake(const char *name) {
    if (!g_fail || strcmp(g_fail, name) != 0) return cudaSuccess;
    g_fail = NULL;
    g_calls_failed++;
    g_last = cudaErrorInvalidValue;
    return g_last;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_last; }
cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return fake("cudaGetDeviceCount");
}
cudaError_t cudaSetDevice(int dev) {
    (void)dev;
    return fake("cudaSetDevice");
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev) {
    (void)dev;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "fake device");
    p->major = 9;
    p->totalGlobalMem = (size_t)1 << 34;
    p->multiProcessorCount = 1;
    return fake("cudaGetDeviceProperties");
}
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev) {
    (void)a, (void)dev;
    *v = 48 << 10;
    return fake("cudaDeviceGetAttribute");
}
cudaError_t cudaFuncSetAttribute(const void *f, enum cudaFuncAttribute a, int v) {
    (void)f, (void)a, (void)v;
    return fake("cudaFuncSetAttribute");
}
cudaError_t cudaMalloc(void **p, size_t n) {
    cudaError_t e = fake("cudaMalloc");
    *p = e ? NULL : malloc(n);
    return e;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
    cudaError_t e = fake("cudaMallocHost");
    *p = e ? NULL : malloc(n);
    return e;
}
cudaError_t cudaFree(void *p) {
    free(p);
    return fake("cudaFree");
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return fake("cudaFreeHost");
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
    cudaError_t e = fake("cudaMemset");
    if (!e) memset(p, v, n);
    return e;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    (void)s;
    return cudaMemset(p, v, n);
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    (void)k;
    cudaError_t e = fake("cudaMemcpy");
    if (!e) memcpy(d, s, n);
    return e;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    (void)k, (void)st;
    cudaError_t e = fake("cudaMemcpyAsync");
    if (!e) memcpy(d, s, n);
    return e;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = (cudaStream_t)(void *)&g_fail;   /* any non-NULL handle */
    return fake("cudaStreamCreate");
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    (void)s;
    return fake("cudaStreamDestroy");
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return fake("cudaStreamSynchronize");
}
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) {
    *f = *t = (size_t)1 << 34;
    return fake("cudaMemGetInfo");
}

/* ---- the checks ---- */

static int g_failed;

#define CHECK(cond, ...)                                                           \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "CHECK failed at line %d: %s: ", __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                          \
            fputc('\n', stderr);                                                   \
            g_failed++;                                                            \
        }                                                                          \
    } while (0)

/* One backend entry point, run while `call` fails. */
struct path {
    const char *call;            /* the runtime call made to fail */
    const char *what;            /* the backend entry point exercised */
    int want_error;              /* whether the entry point reports the failure (frees do not) */
};

static const struct path k_paths[] = {
    { "cudaMalloc", "buf_alloc", 1 },
    { "cudaMemset", "buf_alloc", 1 },
    { "cudaFree", "buf_free", 0 },
    { "cudaMemcpy", "place_weights", 1 },
    { "cudaStreamCreate", "ctx_new", 1 },
    { "cudaMallocHost", "ctx_new", 1 },
    { "cudaMemcpyAsync", "upload", 1 },
    { "cudaMemcpyAsync", "download", 1 },
    { "cudaStreamSynchronize", "sync", 1 },
    { "cudaSetDevice", "ctx_free", 0 },
    { "cudaMemGetInfo", "mem_available", 0 },
};

/* run_path's answer when the path could not even be set up (KVLLM_E* codes are small negatives) */
#define SETUP_FAILED INT_MIN

static int run_path(struct backend *be, const struct path *p) {
    const struct backend_ctx_params cp = { .n_threads = 1, .max_tokens = 4, .max_ctx = 64, .n_head = 2,
                                           .head_dim = 8, .max_cols = 64 };
    struct backend_buf buf;
    struct backend_ctx *ctx = NULL;
    float host[16] = { 0 };
    int rc = 0;
    if (!strcmp(p->what, "buf_alloc")) {
        g_fail = p->call;
        rc = be->ops->buf_alloc(be, 64, &buf);
        if (!rc) be->ops->buf_free(be, &buf);
    } else if (!strcmp(p->what, "buf_free")) {
        if (be->ops->buf_alloc(be, 64, &buf)) return SETUP_FAILED;
        g_fail = p->call;
        be->ops->buf_free(be, &buf);
    } else if (!strcmp(p->what, "place_weights")) {
        struct tensor t = { .type = DTYPE_F32, .ne0 = 16, .ne1 = 1, .row_bytes = sizeof host, .data = host };
        struct tensor *ts[] = { &t };
        uint64_t placed = 0;
        g_fail = p->call;
        rc = be->ops->place_weights(be, ts, 1, NULL, &placed);
    } else if (!strcmp(p->what, "mem_available")) {
        g_fail = p->call;
        (void)be->ops->mem_available(be);
    } else {
        if (strcmp(p->what, "ctx_new") != 0 && be->ops->ctx_new(be, &cp, &ctx)) return SETUP_FAILED;
        if (be->ops->buf_alloc(be, sizeof host, &buf)) return SETUP_FAILED;
        g_fail = p->call;
        if (!strcmp(p->what, "ctx_new")) rc = be->ops->ctx_new(be, &cp, &ctx);
        else if (!strcmp(p->what, "upload")) rc = be->ops->upload(ctx, buf.data, host, sizeof host);
        else if (!strcmp(p->what, "download")) rc = be->ops->download(ctx, host, buf.data, sizeof host);
        else if (!strcmp(p->what, "sync")) rc = be->ops->sync(ctx);
        else if (!strcmp(p->what, "ctx_free")) {
            be->ops->ctx_free(ctx);
            ctx = NULL;
        }
        if (ctx) be->ops->ctx_free(ctx);
        be->ops->buf_free(be, &buf);
    }
    return rc;
}

int main(void) {
    struct backend *be = NULL;
    int rc = backend_cuda_new(0, BACKEND_ACT_Q8, &be);
    CHECK(rc == 0 && be, "backend_cuda_new on the fake runtime: %d", rc);
    if (!be) return 1;
    for (size_t i = 0; i < sizeof k_paths / sizeof k_paths[0]; i++) {
        const struct path *p = &k_paths[i];
        const int before = g_calls_failed;
        rc = run_path(be, p);
        CHECK(rc != SETUP_FAILED, "%s: setting up the path failed", p->what);
        CHECK(g_calls_failed == before + 1, "%s: %s was never called", p->what, p->call);
        if (p->want_error) CHECK(rc != 0, "%s with %s failing returned success", p->what, p->call);
        const cudaError_t left = g_last;
        CHECK(left == cudaSuccess, "%s with %s failing left the runtime's last error set (%d): the next kernel "
              "launch would report it", p->what, p->call, (int)left);
        g_last = cudaSuccess;
        g_fail = NULL;
    }
    /* creating the backend itself, failing at each step */
    static const char *const k_new[] = { "cudaGetDeviceCount", "cudaSetDevice", "cudaGetDeviceProperties",
                                         "cudaDeviceGetAttribute", "cudaFuncSetAttribute" };
    for (size_t i = 0; i < sizeof k_new / sizeof k_new[0]; i++) {
        struct backend *b2 = NULL;
        g_fail = k_new[i];
        rc = backend_cuda_new(0, BACKEND_ACT_Q8, &b2);
        CHECK(rc != 0 && !b2, "backend_cuda_new with %s failing: %d", k_new[i], rc);
        CHECK(g_last == cudaSuccess, "backend_cuda_new with %s failing left the last error set", k_new[i]);
        backend_free(b2);
        g_last = cudaSuccess;
        g_fail = NULL;
    }
    backend_free(be);
    printf("%s: %zu failure paths of the CUDA backend, %d checks failed\n", g_failed ? "FAIL" : "OK",
           sizeof k_paths / sizeof k_paths[0] + sizeof k_new / sizeof k_new[0], g_failed);
    return g_failed ? 1 : 0;
}
