/* nccl_emu.h's NCCL on MPI. */
#include "nccl_emu.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <functional>

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error (the emulated NCCL needs MPI)";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

static char last_error[256];

const char *ncclGetLastError(ncclComm_t) { return last_error; }

ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *async) {
  *async = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

/* Distinct on every call of every process (what matters is that members pass the same). */
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  static uint64_t calls;
  uint64_t words[3] = {(uint64_t)getpid(), (uint64_t)time(NULL), ++calls};
  memset(id, 0, sizeof *id);
  memcpy(id->internal, words, sizeof words);
  return ncclSuccess;
}

#ifdef TOKPIPE_HAVE_MPI
/* MPI's C API only (OpenMPI and MPICH would bring their C++ bindings, another library) */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

struct ncclComm {
  MPI_Comm mpi;
};

static size_t type_bytes(ncclDataType_t t) { return t == ncclInt8 ? 1 : t == ncclFloat32 ? 4 : 8; }

static ncclResult_t new_comm(MPI_Comm mpi, ncclComm_t *out) {
  *out = NULL;
  if (mpi == MPI_COMM_NULL) return ncclSuccess;
  *out = new ncclComm{mpi};
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  int world = 0, inited = 0;
  if (MPI_Initialized(&inited) != MPI_SUCCESS || !inited) return ncclSystemError;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (nranks != world || rank < 0 || rank >= nranks) return ncclInvalidUsage; /* only world-sized here */
  MPI_Comm mpi;
  if (MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &mpi) != MPI_SUCCESS) return ncclSystemError;
  unsigned char all_and[NCCL_UNIQUE_ID_BYTES], all_or[NCCL_UNIQUE_ID_BYTES];
  if (MPI_Allreduce(id.internal, all_and, NCCL_UNIQUE_ID_BYTES, MPI_BYTE, MPI_BAND, mpi) != MPI_SUCCESS ||
      MPI_Allreduce(id.internal, all_or, NCCL_UNIQUE_ID_BYTES, MPI_BYTE, MPI_BOR, mpi) != MPI_SUCCESS)
    return ncclSystemError;
  if (memcmp(all_and, all_or, NCCL_UNIQUE_ID_BYTES) != 0) {
    MPI_Comm_free(&mpi);
    return ncclInvalidArgument;
  }
  return new_comm(mpi, comm);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *) {
  const char *fail = getenv("TOKPIPE_NCCL_EMULATE_FAIL_RANK");
  int world = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  if (fail && atoi(fail) == world) {
    snprintf(last_error, sizeof last_error, "emulated failure of rank %d (TOKPIPE_NCCL_EMULATE_FAIL_RANK)", world);
    return ncclInternalError;
  }
  MPI_Comm mpi;
  if (MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &mpi) != MPI_SUCCESS)
    return ncclSystemError;
  return new_comm(mpi, newcomm);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}

/* An operation on a stream: started (an MPI request) when the stream reaches it, as NCCL's
 * kernel starts once the stream's earlier work is done; done once MPI_Test says so. */
struct Op {
  std::function<int(MPI_Request *)> start;
  const char *name;
  MPI_Request q;
  bool started;
};

static bool op_done(void *arg) {
  Op *op = static_cast<Op *>(arg);
  int done = 0;
  if (!op->started && op->start(&op->q) != MPI_SUCCESS) {
    fprintf(stderr, "nccl_emu: %s: MPI failed\n", op->name);
    abort();
  }
  op->started = true;
  if (MPI_Test(&op->q, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
    fprintf(stderr, "nccl_emu: %s: MPI_Test failed\n", op->name);
    abort();
  }
  if (done) delete op;
  return done;
}

static ncclResult_t queue(const char *name, cudaStream_t stream, std::function<int(MPI_Request *)> start) {
  tp_emu_stream_async(stream, op_done, new Op{std::move(start), name, MPI_REQUEST_NULL, false});
  return ncclSuccess;
}

static int mpi_count(size_t bytes) { return bytes <= (size_t)INT32_MAX ? (int)bytes : -1; }

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  int n = mpi_count(count * type_bytes(type));
  if (n < 0) return ncclInvalidArgument;
  /* synchronous mode: complete only once the receive matched it, as an NCCL send */
  MPI_Comm mpi = comm->mpi;
  return queue("ncclSend", stream, [=](MPI_Request *q) { return MPI_Issend(buf, n, MPI_BYTE, peer, 0, mpi, q); });
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  int n = mpi_count(count * type_bytes(type));
  if (n < 0) return ncclInvalidArgument;
  MPI_Comm mpi = comm->mpi;
  return queue("ncclRecv", stream, [=](MPI_Request *q) { return MPI_Irecv(buf, n, MPI_BYTE, peer, 0, mpi, q); });
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  MPI_Datatype t = type == ncclFloat32   ? MPI_FLOAT
                   : type == ncclFloat64 ? MPI_DOUBLE
                   : type == ncclInt64   ? MPI_INT64_T
                                         : MPI_INT8_T;
  if (op != ncclSum || count > (size_t)INT32_MAX) return ncclInvalidArgument;
  MPI_Comm mpi = comm->mpi;
  return queue("ncclAllReduce", stream, [=](MPI_Request *q) {
    if (send != recv) memcpy(recv, send, count * type_bytes(type));
    return MPI_Iallreduce(MPI_IN_PLACE, recv, (int)count, t, MPI_SUM, mpi, q);
  });
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  MPI_Datatype t = type == ncclFloat32   ? MPI_FLOAT
                   : type == ncclFloat64 ? MPI_DOUBLE
                   : type == ncclInt64   ? MPI_INT64_T
                                         : MPI_INT8_T;
  int rank = 0;
  if (op != ncclSum || count > (size_t)INT32_MAX) return ncclInvalidArgument;
  MPI_Comm_rank(comm->mpi, &rank);
  MPI_Comm mpi = comm->mpi;
  return queue("ncclReduce", stream, [=](MPI_Request *q) {
    if (rank != root) return MPI_Ireduce(send, NULL, (int)count, t, MPI_SUM, root, mpi, q);
    if (send != recv) memcpy(recv, send, count * type_bytes(type));
    return MPI_Ireduce(MPI_IN_PLACE, recv, (int)count, t, MPI_SUM, root, mpi, q);
  });
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  int n = mpi_count(count * type_bytes(type)), rank = 0;
  if (n < 0) return ncclInvalidArgument;
  MPI_Comm_rank(comm->mpi, &rank);
  MPI_Comm mpi = comm->mpi;
  return queue("ncclBroadcast", stream, [=](MPI_Request *q) {
    if (rank == root && send != recv) memcpy(recv, send, (size_t)n);
    return MPI_Ibcast(recv, n, MPI_BYTE, root, mpi, q);
  });
}

#else /* without MPI: no communicator can be made */

ncclResult_t ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int) { return ncclSystemError; }
ncclResult_t ncclCommSplit(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *) { return ncclSystemError; }
ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclSystemError; }
ncclResult_t ncclSend(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return ncclSystemError;
}
ncclResult_t ncclRecv(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return ncclSystemError; }
ncclResult_t ncclAllReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
  return ncclSystemError;
}
ncclResult_t ncclReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t) {
  return ncclSystemError;
}
ncclResult_t ncclBroadcast(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return ncclSystemError;
}

#endif
