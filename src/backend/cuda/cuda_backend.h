/* The CUDA backend (issue 8): the same vtable as the CPU backend, with the planner's
 * arena, the weights (in their stored types) and the KV cache on the device.
 *
 * Built only when CMake finds nvcc (LLMOPT_HAVE_CUDA); otherwise nothing here exists
 * and selecting "cuda" is a clear error. */
#ifndef LLMOPT_BACKEND_CUDA_CUDA_BACKEND_H
#define LLMOPT_BACKEND_CUDA_CUDA_BACKEND_H

#include "backend/backend.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef LLMOPT_HAVE_CUDA
extern const struct backend_ops cuda_backend_ops;

/* True when a CUDA device can be used; otherwise why (cudaGetDeviceCount's error, or
 * "no CUDA device") goes into why[cap]. */
bool cuda_device_available(char *why, size_t cap);
/* "NVIDIA H200, 132 SMs, 139.8 GiB, cc 9.0" of device 0 into buf; false without one. */
bool cuda_device_describe(char *buf, size_t cap);
#endif

#ifdef __cplusplus
}
#endif

#endif
