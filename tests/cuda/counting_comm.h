/* A test device for pipe_plan.c (pipe_trainer_cuda with PIPE_COUNTING_COMM=1): CUDA's
 * compute backend with a transport of its own (TpPlanDevice.open_comm), as a device with
 * NCCL has. The transport passes everything to the host transport it was built on and
 * counts the sends; closing it prints the count, so a test sees that the trainer opened it
 * after the compute backend, sent its messages through it and closed it. */
#include <stdio.h>
#include <stdlib.h>

#include "runtime/comm/comm.h"
#include "runtime/compute.h"
#include "runtime/cuda/ops.h"

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
  if (!compute || compute->be != &tp_compute_cuda || !plan) return tp_internal(d, "open_comm before open_compute");
  if (host->size == 1) return TP_OK; /* one process: the host transport serves */
  TpComm *c = malloc(sizeof *c);
  if (!c) return tp_error(d, "out of memory");
  *c = *host;
  c->be = &counting_comm;
  counting_host = host;
  *out = c;
  return TP_OK;
}

static TpPlanDevice counting_device = {.name = "cuda", .open_comm = counting_open_comm};

static const TpPlanDevice *test_device(void) {
  counting_device.open_compute = tp_plan_device_cuda.open_compute;
  const char *counting = getenv("PIPE_COUNTING_COMM");
  return counting && *counting == '1' ? &counting_device : &tp_plan_device_cuda;
}
