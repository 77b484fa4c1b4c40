/* Communication between the processes of a pipeline-parallel trainer, behind one small
 * interface: a table of functions per backend (as ggml's backends), so that the instruction
 * lists that drive MPI on CPU ranks drive NCCL on GPUs.
 *
 *   local  one process, no MPI (comm_local.c): size 1; collectives are no-ops
 *   mpi    OpenMPI (comm_mpi.c), when the program was started by mpirun
 *   nccl   NCCL between GPUs (runtime/cuda/comm_nccl.cu), built on mpi (device_memory)
 *
 * Failures are fatal to the whole job: a communication error, or a peer that stays silent
 * past the timeout, prints one line naming the rank and what it waited for and ends every
 * process (MPI_Abort). This is the one place runtime code ends the process: the other ranks
 * are blocked on this one and cannot be told otherwise. Collectives run over a group (an
 * ascending list of ranks). local and mpi reduce in the group's rank order, so their
 * results are the same bits on every run. nccl does not promise an order: NCCL picks its
 * algorithm (ring, tree, NVLS...), protocol and channel count from the topology, the size
 * and the NCCL version, and adds in the order that algorithm gives. What its maintainers
 * promise is the same bits on every member (NVIDIA/nccl#434, #855); ring and tree give the
 * same bits run to run for one job shape, machine and NCCL version, NVLS (in-switch
 * reduction on NVSwitch machines) may not (#1497; NCCL_NVLS_ENABLE=0 turns it off). A
 * group of two adds one pair (a + b == b + a): the same bits as rank order.
 *
 * The trainer's messages, gradients and gathered tensors live in the compute backend's
 * device memory (../compute.h). MPI gets those buffers directly from the CPU backend, whose
 * device memory is host memory, and host copies from any other (runtime/train/buffers.c,
 * pipe_host_view); a transport that reads device memory (device_memory: nccl) takes them
 * directly, and host memory as well, as a CUDA-aware MPI would: the two sides of a message
 * and every member of a collective must pass the same kind of memory. */
#ifndef TOKPIPE_COMM_H
#define TOKPIPE_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "../../base/diag.h"
#include "../../base/file.h"
#include "../../base/tensor.h"

typedef struct TpComm TpComm;
typedef struct TpStream TpStream; /* ../compute.h */

/* A posted send or receive. */
typedef struct {
  void *impl; /* the backend's handle; NULL once complete */
  int peer;
  const char *what; /* for the timeout message, e.g. "activation of unit (0, 1)" */
  /* A device_memory transport's transfer of a device buffer waits for this compute stream's
   * work queued so far (what produced the buffer); NULL: the buffer is ready. Host
   * transports ignore it (their caller synchronizes first). */
  TpStream *stream;
} TpCommRequest;

typedef struct {
  const char *name;
  /* isend, irecv, allreduce_sum and broadcast take device buffers of the compute backend
   * (../compute.h) as well as host memory */
  bool device_memory;
  void (*finalize)(TpComm *c);
  /* Non-blocking point to point; the buffer must stay untouched until the request completes. */
  void (*isend)(TpComm *c, const void *buf, size_t bytes, int peer, int tag, TpCommRequest *r);
  void (*irecv)(TpComm *c, void *buf, size_t bytes, int peer, int tag, TpCommRequest *r);
  /* Whether r completed (and then r->impl is NULL); never blocks. */
  bool (*test)(TpComm *c, TpCommRequest *r);
  /* Collectives (tp_comm_allreduce_p2p and friends below, unless a backend has better). */
  void (*allreduce_sum)(TpComm *c, void *buf, size_t count, TpDType dtype, const int *group, int n);
  /* allreduce_sum of a device buffer ordered on a compute stream: queued after the work on
   * `stream` so far, and work queued there later sees the sum (a tensor group's all-reduce
   * inside a unit). NULL: the caller synchronizes the stream, then calls allreduce_sum. */
  void (*allreduce_sum_on)(TpComm *c, void *buf, size_t count, TpDType dtype, const int *group, int n,
                           TpStream *stream);
  /* A receive into a device buffer ordered on a compute stream: work queued on `stream`
   * later sees the message, and the host does not wait for it (a failure shows where the
   * host next waits for the stream). NULL: the caller receives (tp_comm_recv) first. */
  void (*recv_on)(TpComm *c, void *buf, size_t bytes, int peer, int tag, TpStream *stream);
  void (*broadcast)(TpComm *c, void *buf, size_t bytes, int root, const int *group, int n);
  /* --zero 1's pair, over buf cut into n consecutive segments, counts[i] elements of dtype
   * for group[i]: reduce_scatter_sum leaves in member i's segment i the sum of every
   * member's segment i (the other segments undefined); all_gather gives every member each
   * member's segment i. */
  void (*reduce_scatter_sum)(TpComm *c, void *buf, const size_t *counts, TpDType dtype, const int *group, int n);
  void (*all_gather)(TpComm *c, void *buf, const size_t *counts, TpDType dtype, const int *group, int n);
  void (*barrier)(TpComm *c);
  /* Prints "tool: error: rank K: msg" and ends every process with `code`. */
  void (*abort)(TpComm *c, int code, const char *msg); /* does not return */
} TpCommBackend;

typedef struct TpCommGroupSeq TpCommGroupSeq; /* comm.c */

struct TpComm {
  const TpCommBackend *be;
  const char *tool;
  int rank, size;
  double timeout_s; /* how long a wait may see no progress before the job is aborted */
  void *impl;
  /* The collectives done so far per group (comm.c): every member numbers a group's
   * collectives alike, so a member out of step is seen at the next one. */
  TpCommGroupSeq *group_seqs;
  int ngroup_seqs;
};

/* True if this process was started by an MPI launcher (mpirun, srun with PMI). */
bool tp_comm_launched_by_mpi(void);
/* The backend for how the process was started: mpi under a launcher, else local. An error
 * (TP_ERR_USAGE) if started by a launcher but built without MPI. */
int tp_comm_open(TpComm **out, const char *tool, int *argc, char ***argv, TpDiag *d);
void tp_comm_close(TpComm *c);

/* Blocks until r completes, polling; aborts the job after c->timeout_s without progress. */
void tp_comm_wait(TpComm *c, TpCommRequest *r);
void tp_comm_send(TpComm *c, const void *buf, size_t bytes, int peer, int tag, const char *what);
void tp_comm_recv(TpComm *c, void *buf, size_t bytes, int peer, int tag, const char *what);
TP_NORETURN void tp_comm_abort(TpComm *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static inline void tp_comm_allreduce_sum(TpComm *c, void *buf, size_t count, TpDType dtype, const int *group,
                                         int n) {
  c->be->allreduce_sum(c, buf, count, dtype, group, n);
}
static inline void tp_comm_broadcast(TpComm *c, void *buf, size_t bytes, int root, const int *group, int n) {
  c->be->broadcast(c, buf, bytes, root, group, n);
}
static inline void tp_comm_reduce_scatter_sum(TpComm *c, void *buf, const size_t *counts, TpDType dtype,
                                              const int *group, int n) {
  c->be->reduce_scatter_sum(c, buf, counts, dtype, group, n);
}
static inline void tp_comm_all_gather(TpComm *c, void *buf, const size_t *counts, TpDType dtype, const int *group,
                                      int n) {
  c->be->all_gather(c, buf, counts, dtype, group, n);
}
static inline void tp_comm_barrier(TpComm *c) { c->be->barrier(c); }

/* All ranks agree on an exit code: the largest of every rank's rc. The lowest rank with a
 * non-zero rc is returned in *first (-1 if none). */
int tp_comm_agree(TpComm *c, int rc, int *first);

/* Collectives built on isend/irecv/test: sum at the group's first rank in group order
 * ((g0 + g1) + g2 ...), then a broadcast from it. dtype TP_F32, TP_F64 or TP_I64.
 * Every member first sends the collective's root a header: the group's collective number
 * (its sequence number in that group), the kind, the dtype, the bytes and the root. The
 * root takes a member's data only after its header matched its own, so members out of step
 * (one ran a collective the others did not, or with another size) end the job with one
 * error naming both ranks and what differs, never a truncated message or memory written
 * past a buffer. */
void tp_comm_allreduce_p2p(TpComm *c, void *buf, size_t count, TpDType dtype, const int *group, int n);
void tp_comm_broadcast_p2p(TpComm *c, void *buf, size_t bytes, int root, const int *group, int n);
/* The same through the group's first rank: it sums the whole buffer in group order (the
 * bits of tp_comm_allreduce_p2p) and sends member i its segment; or it collects every
 * member's segment and sends everyone the whole. */
void tp_comm_reduce_scatter_p2p(TpComm *c, void *buf, const size_t *counts, TpDType dtype, const int *group, int n);
void tp_comm_all_gather_p2p(TpComm *c, void *buf, const size_t *counts, TpDType dtype, const int *group, int n);
/* A barrier over every rank, with the same header check. */
void tp_comm_barrier_p2p(TpComm *c);
/* dst[i] += src[i] for count elements of dtype: the one reduction every backend uses. */
void tp_comm_sum_into(void *dst, const void *src, size_t count, TpDType dtype);

extern const TpCommBackend tp_comm_local;
#ifdef TOKPIPE_HAVE_MPI
extern const TpCommBackend tp_comm_mpi;
int tp_comm_mpi_init(TpComm *c, int *argc, char ***argv, TpDiag *d);
#endif

#endif
