/* Checking of every CUDA runtime, cuBLASLt and NCCL call: a failure prints the file, line,
 * the call and the library's message as one line and ends the process with exit code 1 (a
 * failed device call leaves the context unusable; nothing can be recovered). In the
 * emulated test build the runtime and NCCL calls are the emulation's (emulate/cuda_emu.h,
 * emulate/nccl_emu.h), checked the same way; it makes no cuBLASLt calls. */
#ifndef TOKPIPE_CUDA_CHECK_H
#define TOKPIPE_CUDA_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#ifdef TOKPIPE_CUDA_EMULATE
#include "emulate/cuda_emu.h"
#include "emulate/nccl_emu.h"
#else
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>
#endif

static inline void tp_cuda_fail(const char *file, int line, const char *call, const char *message) {
  fprintf(stderr, "tokpipe: error: %s:%d: %s: %s\n", file, line, call, message);
  exit(1);
}

#define TP_CUDA_CHECK(call)                                                             \
  do {                                                                                  \
    cudaError_t tp_err_ = (call);                                                       \
    if (tp_err_ != cudaSuccess) tp_cuda_fail(__FILE__, __LINE__, #call, cudaGetErrorString(tp_err_)); \
  } while (0)

#define TP_NCCL_CHECK(call)                                                             \
  do {                                                                                  \
    ncclResult_t tp_nr_ = (call);                                                       \
    if (tp_nr_ != ncclSuccess) tp_cuda_fail(__FILE__, __LINE__, #call, ncclGetErrorString(tp_nr_)); \
  } while (0)

#ifndef TOKPIPE_CUDA_EMULATE
#define TP_CUBLAS_CHECK(call)                                                           \
  do {                                                                                  \
    cublasStatus_t tp_st_ = (call);                                                     \
    if (tp_st_ != CUBLAS_STATUS_SUCCESS)                                                \
      tp_cuda_fail(__FILE__, __LINE__, #call, cublasLtGetStatusString(tp_st_));         \
  } while (0)
#endif

#endif
