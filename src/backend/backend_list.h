/* backend_list.h — the backends backend.c chooses among beside the CPU:
 * the CUDA backend's constructor and availability probe.  Included by
 * backend.c (backend_new), by cuda/cuda.c, which defines them, by
 * engine/api.c (whether this build has CUDA, for kvllm_build_info) and by
 * tests that create the CUDA backend; nothing else needs it. */
#ifndef KVLLM_BACKEND_LIST_H
#define KVLLM_BACKEND_LIST_H

#include "backend/backend.h"

/* Whether this build has the CUDA backend (-DKVLLM_CUDA=ON). */
bool backend_cuda_built(void);
/* CUDA devices usable here (cudaGetDeviceCount); 0 with why filled (no
 * CUDA in this build, no driver, no device), never logged: the caller
 * decides whether that is an error or a SKIP. */
int backend_cuda_probe(char *why, size_t why_size);
/* Create the CUDA backend on device (0 .. count - 1) with activation
 * arithmetic act (BACKEND_ACT_INT is taken as q8: the CUDA backend has
 * q8 and f32).  KVLLM_EUNSUPPORTED (logged) where the build lacks CUDA or
 * no usable device is found; KVLLM_EINVAL for a device out of range;
 * KVLLM_EBACKEND for other CUDA failures.  Freed by backend_free. */
int backend_cuda_new(int device, enum backend_act act, struct backend **out);

#endif
