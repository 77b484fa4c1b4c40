/* The backend-independent half of the communication layer: choosing a backend, waiting
 * with a watchdog, and collectives built on point-to-point messages with a fixed
 * reduction order. */
#include "comm.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { COLLECTIVE_TAG = 32000 }; /* above every pipeline tag; MPI guarantees tags < 32768 */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool tp_comm_launched_by_mpi(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

int tp_comm_open(TpComm **out, const char *tool, int *argc, char ***argv, TpDiag *d) {
  TpComm *c = calloc(1, sizeof *c);
  TP_ASSERT(c);
  c->tool = tool;
  c->size = 1;
  c->timeout_s = 300;
  const char *t = getenv("TOKPIPE_COMM_TIMEOUT");
  if (t && atof(t) > 0) c->timeout_s = atof(t);
  *out = c;
  if (!tp_comm_launched_by_mpi()) {
    c->be = &tp_comm_local;
    return TP_OK;
  }
#ifdef TOKPIPE_HAVE_MPI
  c->be = &tp_comm_mpi;
  int rc = tp_comm_mpi_init(c, argc, argv, d);
  if (rc) c->be = &tp_comm_local; /* nothing to finalize */
  return rc;
#else
  (void)argc, (void)argv;
  c->be = &tp_comm_local;
  const char *n = getenv("OMPI_COMM_WORLD_SIZE") ? getenv("OMPI_COMM_WORLD_SIZE") : getenv("PMI_SIZE");
  if (n && strcmp(n, "1") == 0) return TP_OK; /* mpirun -np 1: one process anyway */
  return tp_error(d, "started by an MPI launcher, but this trainer was built without MPI: "
                  "install libopenmpi-dev and build tokpipec again, or run it without mpirun");
#endif
}

void tp_comm_close(TpComm *c) {
  if (!c) return;
  if (c->be) c->be->finalize(c);
  free(c);
}

_Noreturn void tp_comm_abort(TpComm *c, int code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  c->be->abort(c, code, msg);
  abort(); /* not reached: every backend's abort ends the process */
}

/* Polls without burning a core that another rank may need: spin briefly, then sleep up to
 * a millisecond between tests; a transport of device memory (NCCL) up to 20 us, since a
 * GPU's transfer ends far sooner than a host message and the step waits on it. */
void tp_comm_wait(TpComm *c, TpCommRequest *r) {
  double start = now_s();
  long sleep_ns = 0, max_sleep_ns = c->be->device_memory ? 20000 : 1000000;
  for (int polls = 0; !c->be->test(c, r); polls++) {
    if (polls < 100) continue;
    sleep_ns = sleep_ns ? sleep_ns * 2 : 1000;
    if (sleep_ns > max_sleep_ns) sleep_ns = max_sleep_ns;
    nanosleep(&(struct timespec){0, sleep_ns}, NULL);
    if ((polls & 63) == 0 && now_s() - start > c->timeout_s) {
      char peer[32] = "";
      if (r->peer >= 0) snprintf(peer, sizeof peer, " (peer: rank %d)", r->peer);
      tp_comm_abort(c, TP_ERR_INTERNAL, "no progress for %g s waiting for %s%s (did a rank die or "
                    "hang? the limit is TOKPIPE_COMM_TIMEOUT seconds)", c->timeout_s,
                    r->what ? r->what : "a message", peer);
    }
  }
}

void tp_comm_send(TpComm *c, const void *buf, size_t bytes, int peer, int tag, const char *what) {
  TpCommRequest r = {.what = what};
  c->be->isend(c, buf, bytes, peer, tag, &r);
  tp_comm_wait(c, &r);
}

void tp_comm_recv(TpComm *c, void *buf, size_t bytes, int peer, int tag, const char *what) {
  TpCommRequest r = {.what = what};
  c->be->irecv(c, buf, bytes, peer, tag, &r);
  tp_comm_wait(c, &r);
}

static size_t dtype_bytes(TpDType t) {
  switch (t) {
  case TP_F32: return 4;
  case TP_F64:
  case TP_I64: return 8;
  default: TP_ASSERT(!"a collective of an unsupported dtype");
  }
  return 0;
}

void tp_comm_sum_into(void *dst, const void *src, size_t count, TpDType dtype) {
  switch (dtype) {
  case TP_F32:
    for (size_t i = 0; i < count; i++) ((float *)dst)[i] += ((const float *)src)[i];
    break;
  case TP_F64:
    for (size_t i = 0; i < count; i++) ((double *)dst)[i] += ((const double *)src)[i];
    break;
  default:
    TP_ASSERT(dtype == TP_I64);
    for (size_t i = 0; i < count; i++) ((int64_t *)dst)[i] += ((const int64_t *)src)[i];
  }
}

static int group_index(const TpComm *c, const int *group, int n) {
  for (int i = 0; i < n; i++)
    if (group[i] == c->rank) return i;
  TP_ASSERT(!"a collective over a group without this rank");
  return -1;
}

void tp_comm_broadcast_p2p(TpComm *c, void *buf, size_t bytes, int root, const int *group, int n) {
  group_index(c, group, n);
  if (n < 2) return;
  if (c->rank != root) {
    tp_comm_recv(c, buf, bytes, root, COLLECTIVE_TAG, "a broadcast");
    return;
  }
  TpCommRequest *rs = calloc((size_t)n, sizeof *rs);
  TP_ASSERT(rs);
  for (int i = 0; i < n; i++) {
    rs[i].what = "a broadcast";
    if (group[i] != root) c->be->isend(c, buf, bytes, group[i], COLLECTIVE_TAG, &rs[i]);
  }
  for (int i = 0; i < n; i++)
    if (rs[i].impl) tp_comm_wait(c, &rs[i]);
  free(rs);
}

void tp_comm_allreduce_p2p(TpComm *c, void *buf, size_t count, TpDType dtype, const int *group, int n) {
  int me = group_index(c, group, n);
  if (n < 2) return;
  size_t bytes = count * dtype_bytes(dtype);
  if (me != 0) {
    tp_comm_send(c, buf, bytes, group[0], COLLECTIVE_TAG, "an all-reduce");
  } else {
    /* receive everything first (in any order of arrival), then add in group order */
    void *parts = malloc(bytes * (size_t)(n - 1) + 1);
    TpCommRequest *rs = calloc((size_t)n, sizeof *rs);
    TP_ASSERT(parts && rs);
    for (int i = 1; i < n; i++) {
      rs[i].what = "an all-reduce";
      c->be->irecv(c, (char *)parts + bytes * (size_t)(i - 1), bytes, group[i], COLLECTIVE_TAG, &rs[i]);
    }
    for (int i = 1; i < n; i++) tp_comm_wait(c, &rs[i]);
    for (int i = 1; i < n; i++) tp_comm_sum_into(buf, (char *)parts + bytes * (size_t)(i - 1), count, dtype);
    free(parts);
    free(rs);
  }
  tp_comm_broadcast_p2p(c, buf, bytes, group[0], group, n);
}

int tp_comm_agree(TpComm *c, int rc, int *first) {
  if (c->size == 1) {
    *first = rc ? 0 : -1;
    return rc;
  }
  int *all = malloc(sizeof *all * (size_t)c->size);
  int64_t *rcs = calloc((size_t)c->size, sizeof *rcs);
  TP_ASSERT(all && rcs);
  for (int i = 0; i < c->size; i++) all[i] = i;
  rcs[c->rank] = rc; /* every rank's rc in its own slot: the sum is a gather */
  tp_comm_allreduce_sum(c, rcs, (size_t)c->size, TP_I64, all, c->size);
  int worst = 0;
  *first = -1;
  for (int i = 0; i < c->size; i++) {
    if (rcs[i] > worst) worst = (int)rcs[i];
    if (rcs[i] && *first < 0) *first = i;
  }
  free(all);
  free(rcs);
  return worst;
}
