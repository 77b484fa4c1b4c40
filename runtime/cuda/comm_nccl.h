/* The NCCL transport between the GPUs of a pipeline (TpPlanDevice.open_comm of CUDA plans):
 * a TpCommBackend (../comm/comm.h, "nccl") whose messages and all-reduces of device
 * buffers go through NCCL, built on the host transport (MPI) the trainer opened, which
 * bootstraps it and carries everything in host memory. */
#ifndef TOKPIPE_CUDA_COMM_NCCL_H
#define TOKPIPE_CUDA_COMM_NCCL_H

#include "../../base/diag.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct TpComm TpComm;
typedef struct TpCompute TpCompute;
typedef struct TpPlan TpPlan;

/* TpPlanDevice.open_comm (../train/plan.h): *out NULL (the host transport serves, with host
 * copies) for one process, a plan whose ranks are not the processes (the runtime reports
 * that), or processes of one node sharing a GPU (NCCL takes one process per GPU; a note on
 * stderr says so); else the NCCL transport on the current GPU (open_compute chose it),
 * with every communicator the plan's schedules use created now, in a fixed order (see
 * comm_nccl.cu; a tensor group's all-reduce, allreduce_sum_on, is queued on the unit's
 * stream). Collective over the host transport's processes. TP_ERR_INTERNAL for a
 * plan whose messages NCCL could not match (a compiler bug); NCCL failures end the
 * process (check.h). */
int tp_cuda_comm_open(TpComm *host, TpCompute *compute, const TpPlan *plan, TpComm **out, TpDiag *d);

/* The communicators of an NCCL transport in the order they were created, one per line:
 * "world 0 1 2 3", then "round R: KIND m0 m1..." (KIND link: sender, receiver; tensor;
 * replicas; pieces; tied),
 * with "*" after the groups this rank belongs to and " stream" after those that have a
 * stream by now (comm_nccl.cu's Group.stream). For tests. */
void tp_cuda_comm_describe(const TpComm *c, char *out, size_t size);

#ifdef __cplusplus
}
#endif

#endif
