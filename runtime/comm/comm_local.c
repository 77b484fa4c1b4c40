/* The one-process backend: no MPI, size 1. A plan of several ranks runs in one process by
 * the trainer hosting all of them (runtime/train/messages.c), which moves their messages
 * itself, so nothing here ever has a peer. */
#include "comm.h"

#include <stdio.h>
#include <stdlib.h>

static void local_finalize(TpComm *c) { (void)c; }

static void local_isend(TpComm *c, const void *buf, size_t bytes, int peer, int tag, TpCommRequest *r) {
  (void)c, (void)buf, (void)bytes, (void)peer, (void)tag, (void)r;
  TP_ASSERT(!"a send in a one-process run");
}

static void local_irecv(TpComm *c, void *buf, size_t bytes, int peer, int tag, TpCommRequest *r) {
  (void)c, (void)buf, (void)bytes, (void)peer, (void)tag, (void)r;
  TP_ASSERT(!"a receive in a one-process run");
}

static bool local_test(TpComm *c, TpCommRequest *r) {
  (void)c, (void)r;
  return true;
}

static void local_barrier(TpComm *c) { (void)c; }

static _Noreturn void local_abort(TpComm *c, int code, const char *msg) {
  fprintf(stderr, "%s: error: %s\n", c->tool, msg);
  fflush(stderr);
  exit(code);
}

const TpCommBackend tp_comm_local = {
    .name = "local",
    .finalize = local_finalize,
    .isend = local_isend,
    .irecv = local_irecv,
    .test = local_test,
    .allreduce_sum = tp_comm_allreduce_p2p,
    .broadcast = tp_comm_broadcast_p2p,
    .reduce_scatter_sum = tp_comm_reduce_scatter_p2p,
    .all_gather = tp_comm_all_gather_p2p,
    .barrier = local_barrier,
    .abort = local_abort,
};
