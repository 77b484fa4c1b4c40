/* Checking of every CUDA runtime, cuBLASLt and NCCL call: a failure prints the file, line,
 * the call and the library's message (NCCL's: with ncclGetLastError's detail) as one line
 * and ends the process with exit code 1 (a failed device call leaves the context unusable;
 * nothing can be recovered). Where tp_cuda_failure_hook is set (the NCCL transport sets it
 * to its host transport's abort), the hook ends the whole job instead, so that no other
 * rank stays blocked in a collective waiting for this one. In the
 * emulated test build the runtime and NCCL calls are the emulation's (emulate/cuda_emu.h,
 * emulate/nccl_emu.h), checked the same way; it makes no cuBLASLt calls. */
#ifndef TOKPIPE_CUDA_CHECK_H
#define TOKPIPE_CUDA_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "stats.h"

#ifdef TOKPIPE_CUDA_EMULATE
#include "emulate/cuda_emu.h"
#include "emulate/nccl_emu.h"
#else
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#ifdef __cplusplus
extern "C"
#endif
    void (*tp_cuda_failure_hook)(const char *what); /* stream.cu: NULL; never returns */

static inline void tp_cuda_fail(const char *file, int line, const char *call, const char *message) {
  char what[1024];
  snprintf(what, sizeof what, "%s:%d: %s: %s", file, line, call, message);
  if (tp_cuda_failure_hook) tp_cuda_failure_hook(what);
  fprintf(stderr, "tokpipe: error: %s\n", what);
  exit(1);
}

/* NCCL's message for r, with the detail NCCL kept of the thread's last error if any. */
static inline const char *tp_nccl_message(ncclResult_t r, char *out, size_t size) {
  const char *detail = ncclGetLastError(NULL);
  if (detail && *detail) snprintf(out, size, "%s (%s)", ncclGetErrorString(r), detail);
  else snprintf(out, size, "%s", ncclGetErrorString(r));
  return out;
}

#define TP_CUDA_CHECK(call)                                                                                         \
  do {                                                                                                              \
    cudaError_t tp_err_ = (call);                                                                                   \
    if (tp_err_ != cudaSuccess) tp_cuda_fail(__FILE__, __LINE__, #call, cudaGetErrorString(tp_err_));               \
  } while (0)

/* A host wait for the device (cudaStreamSynchronize, cudaEventSynchronize,
 * cudaDeviceSynchronize) and a device allocation (cudaMalloc, cudaMallocAsync), checked and
 * counted (stats.h). */
#define TP_CUDA_WAIT(call)                                                                                          \
  do {                                                                                                              \
    TP_CUDA_COUNT(syncs, 1);                                                                                        \
    TP_CUDA_CHECK(call);                                                                                            \
  } while (0)
#define TP_CUDA_ALLOC(call)                                                                                         \
  do {                                                                                                              \
    TP_CUDA_COUNT(allocs, 1);                                                                                       \
    TP_CUDA_CHECK(call);                                                                                            \
  } while (0)

#define TP_NCCL_CHECK(call)                                                                                         \
  do {                                                                                                              \
    ncclResult_t tp_nr_ = (call);                                                                                   \
    char tp_msg_[512];                                                                                              \
    if (tp_nr_ != ncclSuccess)                                                                                      \
      tp_cuda_fail(__FILE__, __LINE__, #call, tp_nccl_message(tp_nr_, tp_msg_, sizeof tp_msg_));                    \
  } while (0)

#ifndef TOKPIPE_CUDA_EMULATE
#define TP_CUBLAS_CHECK(call)                                                                                       \
  do {                                                                                                              \
    cublasStatus_t tp_st_ = (call);                                                                                 \
    if (tp_st_ != CUBLAS_STATUS_SUCCESS) tp_cuda_fail(__FILE__, __LINE__, #call, cublasLtGetStatusString(tp_st_));  \
  } while (0)
#endif

#endif
