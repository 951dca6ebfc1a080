/* backend_list.h — the backends backend.c chooses among: each one's
 * constructor, destructor and availability probe.  Included by backend.c
 * (backend_new_from_env, backend_free), by the backends that define these
 * (cpu/cpu.c, cuda/cuda.c), by engine/api.c (whether this build has CUDA,
 * for kvllm_build_info) and by tests that create a particular backend;
 * nothing else needs it. */
#ifndef KVLLM_BACKEND_LIST_H
#define KVLLM_BACKEND_LIST_H

#include "backend/backend.h"

/* The CPU backend's destructor (cpu.c); backend_free calls it for every
 * backend the CUDA one does not own. */
void backend_cpu_free(struct backend *be);

/* Whether this build has the CUDA backend (-DKVLLM_CUDA=ON). */
bool backend_cuda_built(void);
/* CUDA devices usable here (cudaGetDeviceCount); 0 with why filled (no
 * CUDA in this build, no driver, no device), never logged: the caller
 * decides whether that is an error or a SKIP. */
int backend_cuda_probe(char *why, size_t why_size);
/* Create the CUDA backend on device 0.  KVLLM_EUNSUPPORTED (logged) where
 * the build lacks CUDA or no device is found; KVLLM_EBACKEND for other
 * CUDA failures. */
int backend_cuda_new(struct backend **out);
/* Whether be was made by backend_cuda_new (false for NULL). */
bool backend_is_cuda(const struct backend *be);
void backend_cuda_free(struct backend *be);   /* NULL-safe */

#endif
