/* NCCL on the CPU, for tests only (so the transport is checked without a GPU): the part of
 * nccl.h that
 * runtime/cuda/comm_nccl.cu calls, run on MPI, so that the transport above it (the
 * communicators it creates and their order, the groups, streams and events) runs for real
 * in the cuda-emulated tests under mpirun. A communicator is an MPI communicator:
 *   ncclCommInitRank  MPI_Comm_split of MPI_COMM_WORLD, which every process must call
 *                     (nranks is the world's size); the members' unique ids are compared
 *                     (a bootstrap that handed out different ids fails: ncclInvalidArgument)
 *   ncclCommSplit     MPI_Comm_split (NCCL_SPLIT_NOCOLOR: MPI_UNDEFINED)
 *   ncclSend/Recv     MPI_Issend/MPI_Irecv of bytes, tag 0: matched in order, as NCCL does;
 *                     a send completes only once its receive is posted (rendezvous, as
 *                     NCCL's), so a runtime whose peer posts that receive only after
 *                     something this rank blocks on deadlocks here as on GPUs
 *   ncclAllReduce     MPI_Iallreduce (MPI's order of addition, not NCCL's), ncclReduce
 *                     MPI_Ireduce, ncclBroadcast MPI_Ibcast
 * Each operation is queued on the stream as asynchronous work (cuda_emu.h's
 * tp_emu_stream_async), started when the stream reaches it (its earlier work done): an
 * event recorded after it is complete once MPI completed it. Built
 * without MPI, every call fails with ncclSystemError. */
#ifndef TOKPIPE_CUDA_EMULATE_NCCL_EMU_H
#define TOKPIPE_CUDA_EMULATE_NCCL_EMU_H

#include <stddef.h>

#include "cuda_emu.h"

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclInProgress = 7,
} ncclResult_t;
typedef enum { ncclInt8 = 0, ncclInt64 = 4, ncclFloat32 = 7, ncclFloat64 = 8 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
#define NCCL_SPLIT_NOCOLOR -1
typedef struct ncclComm *ncclComm_t;
typedef struct ncclConfig ncclConfig_t; /* only NULL is passed */

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream);
/* Operations between these two run together on NCCL; MPI's non-blocking calls need no grouping. */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
const char *ncclGetErrorString(ncclResult_t r);
/* The detail of the last failure (empty: none). */
const char *ncclGetLastError(ncclComm_t comm);
/* An operation that failed after its call returned (never here: every failure is the call's). */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async);
/* Tests: TOKPIPE_NCCL_EMULATE_FAIL_RANK=R makes ncclCommSplit fail on world rank R (one
 * rank of a job failing while the others wait in the collective). */

#endif
