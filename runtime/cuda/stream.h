/* The CUDA compute backend's stream: what a CUDA plan's units get as io->stream and pass
 * as the last argument of every kernel call (tokpipec --target cuda). Besides the CUDA
 * stream it carries what the plan's kernels need and cannot allocate per call: the
 * cuBLASLt handle, device scratch, the device copies of the plan's constants, and where
 * kernels report an index out of range.
 *
 * Implemented in runtime/cuda/backend.cu (the compute backend, tp_compute_cuda); the
 * entry points of runtime/cuda/ops.h use it. In the emulated test build the same code runs
 * on the emulated runtime API (emulate/cuda_emu.h): device memory is host memory. */
#ifndef TOKPIPE_CUDA_STREAM_H
#define TOKPIPE_CUDA_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "blas.h"    /* TpCudaBlas */
#include "kernels.h" /* TpCudaStream */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct TpCompute TpCompute;

typedef struct TpCudaConstant TpCudaConstant;

/* The table of a multi-tensor launch of the compute backend: filled on the host in pinned
 * memory and copied to device memory on the stream, before the kernel that reads it. */
typedef struct {
  void *host, *device;
  size_t bytes;              /* of each */
  struct CUevent_st *copied; /* after the last copy (NULL: none yet) */
} TpCudaTable;
enum { TP_CUDA_TABLE_NORM, TP_CUDA_TABLE_ADAMW, TP_CUDA_TABLES };

struct TpStream {
  TpCudaStream cuda;
  TpCudaBlas *blas; /* this stream's cuBLASLt handle and workspace */
  void *scratch;    /* device scratch (tp_cuda_scratch) */
  size_t scratch_bytes;
  /* device: the smallest position (in its ids, targets or indices) at which a kernel found
   * an index out of range (INT64_MAX: none) */
  int64_t *bad;
  /* the device copies of the plan's constants (tp_cuda_constant): an open-addressing
   * table keyed by the host address */
  TpCudaConstant *constants;
  size_t nconstants, constant_slots;
  TpCudaTable tables[TP_CUDA_TABLES]; /* tp_cuda_table */
  int64_t *bad_host;                  /* pinned: where tp_cuda_stream_sync reads bad back */
};

/* A stream with its handle, scratch (none yet) and bad index (none); NULL if the device
 * cannot make one (every other failure ends the process, check.h). */
TpStream *tp_cuda_stream_new(void);
void tp_cuda_stream_free(TpStream *s); /* after its work is done; s may be NULL */
/* The host waits for s's work; then the smallest position of an index out of range a
 * kernel met since the last call (and forgets it), or -1 if none. */
int64_t tp_cuda_stream_sync(TpStream *s);

/* At least `bytes` of device scratch for the kernels queued next on s, 256-byte aligned;
 * the same memory for every call (an op takes all it needs in one call). Growing it waits
 * for s's earlier work first. */
void *tp_cuda_scratch(TpStream *s, size_t bytes);

/* Table `which` of s on the device holding `bytes` of `data`, copied on s (queued; the
 * host's data may change at once). The table grows as needed (an allocation); refilling
 * waits for its previous copy only where that is still running. */
const void *tp_cuda_table(TpStream *s, int which, const void *data, size_t bytes);

/* The device copy of a plan's constant `host` (a static array of `bytes` in plan.c),
 * uploaded on first use and kept until the backend closes. */
const void *tp_cuda_constant(TpStream *s, const void *host, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif
