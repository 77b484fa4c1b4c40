/* The device of tests/cuda's trainers (tiny_plan.c and pipe_plan.c built with
 * TEST_CUDA_DEVICE): tp_plan_device_cuda with two test doubles around it.
 *
 * Deferred losses (always): the CUDA compute backend, but a unit's io->loss reaches the
 * host only when its stream is next synchronized, as the copy a CUDA unit queues does; until
 * then it reads NaN. On the emulation every stream runs its work at once, so without this a
 * runtime reading a loss before it synchronizes would pass here and fail on a GPU. With
 * PIPE_COUNT_SYNCS=1 freeing a stream prints how often the host synchronized it ("stream I:
 * N synchronizations", I in creation order), so a test sees a runtime that waits for a
 * stream more often than it must.
 *
 * A transport of its own (PIPE_COUNTING_COMM=1, under mpirun), as a device with NCCL has
 * (TpPlanDevice.open_comm): it passes everything to the host transport it was built on and
 * counts the sends; closing it prints the count, so a test sees that the trainer opened it
 * after the compute backend, sent its messages through it and closed it.
 *
 * The NCCL transport (PIPE_NCCL=1, under mpirun with TOKPIPE_CUDA_EMULATE_DEVICES=np, so
 * that no two processes share a GPU): tp_plan_device_cuda's own open_comm, on the emulated
 * NCCL; each rank says which transport carries its messages. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"
#include "runtime/compute.h"
#include "runtime/cuda/comm_nccl.h"
#include "runtime/cuda/ops.h"

/* ---- deferred losses ---- */

enum { MAX_PENDING_LOSSES = 256 };
static struct {
  TpStream *stream;
  float *loss, value;
} pending_losses[MAX_PENDING_LOSSES];
static int npending_losses;
static TpComputeBackend deferred_loss_backend;

enum { MAX_COUNTED_STREAMS = 64 };
static struct {
  TpStream *stream;
  long syncs;
} counted_streams[MAX_COUNTED_STREAMS];
static int ncounted_streams;

static TpStream *deferred_stream_new(TpCompute *c) {
  TpStream *s = tp_compute_cuda.stream_new(c);
  if (ncounted_streams < MAX_COUNTED_STREAMS) counted_streams[ncounted_streams++].stream = s;
  return s;
}

static int counted_index(TpStream *s) {
  for (int i = 0; i < ncounted_streams; i++)
    if (counted_streams[i].stream == s) return i;
  return -1;
}

static void deferred_run_unit(TpCompute *c, TpStream *s, TpUnitFn fn, TpStepIO *io) {
  float before = io->loss;
  tp_compute_cuda.run_unit(c, s, fn, io);
  if (memcmp(&before, &io->loss, sizeof before) == 0) return; /* no loss set */
  if (npending_losses == MAX_PENDING_LOSSES) {
    fprintf(stderr, "test_device.h: more than %d losses never synchronized\n", MAX_PENDING_LOSSES);
    exit(3);
  }
  pending_losses[npending_losses++] = (typeof(pending_losses[0])){s, &io->loss, io->loss};
  io->loss = NAN;
}

static void deliver_losses(TpStream *s, bool keep) {
  int kept = 0;
  for (int i = 0; i < npending_losses; i++)
    if (pending_losses[i].stream != s) pending_losses[kept++] = pending_losses[i];
    else if (keep) *pending_losses[i].loss = pending_losses[i].value;
  npending_losses = kept;
}

static void deferred_stream_sync(TpCompute *c, TpStream *s) {
  int i = counted_index(s);
  if (i >= 0) counted_streams[i].syncs++;
  tp_compute_cuda.stream_sync(c, s);
  deliver_losses(s, true);
}

static void deferred_stream_free(TpCompute *c, TpStream *s) {
  const char *count = getenv("PIPE_COUNT_SYNCS");
  int i = counted_index(s);
  if (count && *count == '1' && i >= 0)
    fprintf(stderr, "stream %d: %ld synchronizations\n", i, counted_streams[i].syncs);
  if (i >= 0) counted_streams[i].stream = NULL;
  deliver_losses(s, false);
  tp_compute_cuda.stream_free(c, s);
}

static int deferred_open_compute(TpCompute **out, int local_rank, TpDiag *d) {
  int rc = tp_plan_device_cuda.open_compute(out, local_rank, d);
  if (rc) return rc;
  deferred_loss_backend = tp_compute_cuda;
  deferred_loss_backend.run_unit = deferred_run_unit;
  deferred_loss_backend.stream_new = deferred_stream_new;
  deferred_loss_backend.stream_sync = deferred_stream_sync;
  deferred_loss_backend.stream_free = deferred_stream_free;
  (*out)->be = &deferred_loss_backend;
  return TP_OK;
}

/* ---- a transport of its own ---- */

static TpComm *counting_host;
static long counting_sends;

static void counting_finalize(TpComm *c) {
  fprintf(stderr, "%s: rank %d: the device transport carried %ld sends\n", c->tool, c->rank, counting_sends);
}
static void counting_isend(TpComm *c, const void *buf, size_t bytes, int peer, int tag, TpCommRequest *r) {
  (void)c;
  counting_sends++;
  counting_host->be->isend(counting_host, buf, bytes, peer, tag, r);
}
static void counting_irecv(TpComm *c, void *buf, size_t bytes, int peer, int tag, TpCommRequest *r) {
  (void)c;
  counting_host->be->irecv(counting_host, buf, bytes, peer, tag, r);
}
static bool counting_test(TpComm *c, TpCommRequest *r) {
  (void)c;
  return counting_host->be->test(counting_host, r);
}
static void counting_allreduce(TpComm *c, void *buf, size_t count, TpDType dtype, const int *group, int n) {
  (void)c;
  counting_host->be->allreduce_sum(counting_host, buf, count, dtype, group, n);
}
static void counting_broadcast(TpComm *c, void *buf, size_t bytes, int root, const int *group, int n) {
  (void)c;
  counting_host->be->broadcast(counting_host, buf, bytes, root, group, n);
}
static void counting_barrier(TpComm *c) {
  (void)c;
  counting_host->be->barrier(counting_host);
}
static void counting_abort(TpComm *c, int code, const char *msg) {
  (void)c;
  counting_host->be->abort(counting_host, code, msg);
}

static const TpCommBackend counting_comm = {
    .name = "counting",
    .finalize = counting_finalize,
    .isend = counting_isend,
    .irecv = counting_irecv,
    .test = counting_test,
    .allreduce_sum = counting_allreduce,
    .broadcast = counting_broadcast,
    .barrier = counting_barrier,
    .abort = counting_abort,
};

static int counting_open_comm(TpComm *host, TpCompute *compute, const TpPlan *plan, TpComm **out, TpDiag *d) {
  *out = NULL;
  if (!compute || compute->be != &deferred_loss_backend || !plan)
    return tp_internal(d, "open_comm before open_compute");
  if (host->size == 1) return TP_OK; /* one process: the host transport serves */
  TpComm *c = malloc(sizeof *c);
  if (!c) return tp_error(d, "out of memory");
  *c = *host;
  c->group_seqs = NULL; /* the host's collectives stay the host's (it runs them), never freed twice */
  c->ngroup_seqs = 0;
  c->be = &counting_comm;
  counting_host = host;
  *out = c;
  return TP_OK;
}

/* ---- the NCCL transport ---- */

static int nccl_open_comm(TpComm *host, TpCompute *compute, const TpPlan *plan, TpComm **out, TpDiag *d) {
  int rc = tp_cuda_comm_open(host, compute, plan, out, d);
  if (!rc && host->size > 1)
    fprintf(stderr, "%s: rank %d: messages go through %s\n", host->tool, host->rank, (*out ? *out : host)->be->name);
  return rc;
}

static const TpPlanDevice deferred_loss_device = {"cuda", deferred_open_compute, NULL},
                          counting_device = {"cuda", deferred_open_compute, counting_open_comm},
                          nccl_device = {"cuda", deferred_open_compute, nccl_open_comm};

static inline const TpPlanDevice *test_device(void) {
  const char *counting = getenv("PIPE_COUNTING_COMM"), *nccl = getenv("PIPE_NCCL");
  if (nccl && *nccl == '1') return &nccl_device;
  return counting && *counting == '1' ? &counting_device : &deferred_loss_device;
}
