/* The MPI backend (OpenMPI from Debian), for processes started by mpirun. Every MPI call
 * goes through CHECK, which turns a failure into an abort of the job naming the call and
 * its file:line. Errors return to us (MPI_ERRORS_RETURN) instead of MPI's own handler, and
 * waits poll (comm.c) so that a silent peer ends in a timeout rather than a hang; a peer
 * that dies is noticed by mpirun, which ends the others at once. */
#include "comm.h"

#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(c, call) check_mpi((c), (call), #call, __FILE__, __LINE__)

static void check_mpi(TpComm *c, int err, const char *call, const char *file, int line) {
  if (err == MPI_SUCCESS) return;
  char what[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, what, &len) != MPI_SUCCESS) snprintf(what, sizeof what, "error %d", err);
  tp_comm_abort(c, TP_ERR_INTERNAL, "%s:%d: %s failed: %s", file, line, call, what);
}

int tp_comm_mpi_init(TpComm *c, int *argc, char ***argv, TpDiag *d) {
  int provided = 0;
  /* only the main thread calls MPI; OpenMP threads run the kernels in between */
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    return tp_error(d, "MPI_Init_thread failed");
  CHECK(c, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  CHECK(c, MPI_Comm_rank(MPI_COMM_WORLD, &c->rank));
  CHECK(c, MPI_Comm_size(MPI_COMM_WORLD, &c->size));
  return TP_OK;
}

static void mpi_finalize(TpComm *c) { CHECK(c, MPI_Finalize()); }

/* A posted MPI request and, for a receive, the bytes it must bring. */
typedef struct {
  MPI_Request q;
  bool receive;
  int bytes;
} Request;

static MPI_Request *new_request(TpCommRequest *r, int peer, bool receive, size_t bytes) {
  Request *q = malloc(sizeof *q);
  TP_ASSERT(q);
  *q = (Request){.receive = receive, .bytes = (int)bytes};
  r->impl = q;
  r->peer = peer;
  return &q->q;
}

static void mpi_isend(TpComm *c, const void *buf, size_t bytes, int peer, int tag, TpCommRequest *r) {
  TP_ASSERT(bytes <= (size_t)INT32_MAX);
  CHECK(c, MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, new_request(r, peer, false, bytes)));
}

static void mpi_irecv(TpComm *c, void *buf, size_t bytes, int peer, int tag, TpCommRequest *r) {
  TP_ASSERT(bytes <= (size_t)INT32_MAX);
  CHECK(c, MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, new_request(r, peer, true, bytes)));
}

/* A received message of another size than the receiver expects (longer: MPI truncates it
 * with an error; shorter: MPI delivers it as it is) means ranks out of step: one error
 * naming both ranks and the sizes. */
static _Noreturn void wrong_size(TpComm *c, const TpCommRequest *r, const char *got) {
  const Request *q = r->impl;
  tp_comm_abort(c, TP_ERR_INTERNAL,
                "%s from rank %d has %s bytes, not the %d this rank expects: the ranks are out "
                "of step (were they given other options?)",
                r->what ? r->what : "a message", r->peer, got, q->bytes);
}

static bool mpi_test(TpComm *c, TpCommRequest *r) {
  if (!r->impl) return true;
  Request *q = r->impl;
  int done = 0, err, cls = 0;
  MPI_Status status;
  err = MPI_Test(&q->q, &done, &status);
  if (err != MPI_SUCCESS && q->receive && MPI_Error_class(err, &cls) == MPI_SUCCESS && cls == MPI_ERR_TRUNCATE)
    wrong_size(c, r, "more");
  CHECK(c, err);
  if (!done) return false;
  int count = 0;
  if (q->receive && (MPI_Get_count(&status, MPI_BYTE, &count) != MPI_SUCCESS || count != q->bytes)) {
    char got[24];
    snprintf(got, sizeof got, "%d", count);
    wrong_size(c, r, got);
  }
  free(r->impl);
  r->impl = NULL;
  return true;
}

static _Noreturn void mpi_abort(TpComm *c, int code, const char *msg) {
  fprintf(stderr, "%s: error: rank %d: %s\n", c->tool, c->rank, msg);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  exit(code); /* not reached */
}

const TpCommBackend tp_comm_mpi = {
    .name = "mpi",
    .finalize = mpi_finalize,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .allreduce_sum = tp_comm_allreduce_p2p,
    .broadcast = tp_comm_broadcast_p2p,
    .reduce_scatter_sum = tp_comm_reduce_scatter_p2p,
    .all_gather = tp_comm_all_gather_p2p,
    .barrier = tp_comm_barrier_p2p, /* numbered and checked like the other collectives */
    .abort = mpi_abort,
};
