/* Collectives of a step: ALLREDUCE_TIED (a tied parameter's gradients summed over the
 * first and last stage), ALLREDUCE (a stage's gradients averaged over its replicas, and
 * first summed over the tensor ranks sharing a piece), the tensor-parallel all-reduce the
 * units call, sums over every rank, and the agreement on an error code. One process runs
 * a collective when the last hosted member arrives at it (arrive); under mpirun the
 * transport does. */
#include "step.h"

#include <string.h>

static int group_index(const Trainer *t, const int *group) {
  int me = 0;
  while (group[me] != t->comm->rank) me++;
  return me;
}

/* Sums `count` doubles of each member's host buffer (bufs[i] for group[i]; NULL where not
 * hosted) in group order; every member gets the sum. One process: every member is hosted. */
static void sum_host(Trainer *t, double **bufs, const int *group, int n, size_t count) {
  if (!one_process(t)) {
    tp_comm_allreduce_sum(t->comm, bufs[group_index(t, group)], count, TP_F64, group, n);
    return;
  }
  for (int i = 1; i < n; i++) tp_comm_sum_into(bufs[0], bufs[i], count, TP_F64);
  for (int i = 1; i < n; i++) memcpy(bufs[i], bufs[0], count * sizeof **bufs);
}

/* The same for the gradients of the members' (hosted ranks') device buffers bufs[i], once
 * their streams are done with them. With `shards` (--zero 1: member i's segment of the
 * buffers, shards[i] elements, one after another) a reduce-scatter: member i gets the sum of
 * its segment only, the same bits. A transport that orders an all-reduce on a compute
 * stream (NCCL) gets this rank's stream instead: no host wait. */
static void sum_grads(Trainer *t, float **bufs, PipeRank **members, const int *group, int n, size_t count,
                      const size_t *shards) {
  TpComm *c = t->comm;
  if (!one_process(t) && !shards && c->be->device_memory && c->be->allreduce_sum_on) {
    int me = group_index(t, group);
    c->be->allreduce_sum_on(c, bufs[me], count, TP_F32, group, n, members[me]->stream);
    return;
  }
  for (int i = 0; i < n; i++)
    if (members[i]) be(t)->stream_sync(t->compute, members[i]->stream);
  if (!one_process(t)) {
    float *mine = bufs[group_index(t, group)];
    void *view = pipe_host_view(t, t->stream, mine, count * 4, true, true);
    if (shards) tp_comm_reduce_scatter_sum(t->comm, view, shards, TP_F32, group, n);
    else tp_comm_allreduce_sum(t->comm, view, count, TP_F32, group, n);
    pipe_end_host_view(t, t->stream, mine, view, count * 4, true);
    return;
  }
  for (int i = 1; i < n; i++) be(t)->add_into(t->compute, t->stream, bufs[0], bufs[i], (int64_t)count);
  size_t at = shards ? shards[0] : 0; /* member i's segment */
  for (int i = 1; i < n; i++) {
    if (!shards) {
      be(t)->copy_d2d(t->compute, t->stream, bufs[i], bufs[0], count * 4);
      continue;
    }
    be(t)->copy_d2d(t->compute, t->stream, bufs[i] + at, bufs[0] + at, shards[i] * 4);
    at += shards[i];
  }
  be(t)->stream_sync(t->compute, t->stream);
}

/* A collective of R over the ranks `group`: one process runs it when the last member
 * arrives (the others wait at it; true for the one that runs it, which also moves the
 * others on); with mpirun at once. members[i]: the hosted rank of group[i] or NULL. */
static bool arrive(Trainer *t, PipeRank *R, const int *group, int n, PipeRank **members) {
  for (int i = 0; i < n; i++) members[i] = pipe_hosted_rank(t, group[i]);
  if (!one_process(t)) return true;
  R->waiting = true;
  int kind = R->st->insns[R->pc].kind;
  for (int i = 0; i < n; i++)
    if (!members[i]->waiting || members[i]->st->insns[members[i]->pc].kind != kind) return false;
  for (int i = 0; i < n; i++) {
    members[i]->waiting = false;
    if (members[i] != R) members[i]->pc++;
  }
  return true;
}

/* ---- the gradients' all-reduces ---- */

bool pipe_allreduce_tied(Trainer *t, PipeRank *R) {
  const TpPlan *P = t->plan;
  int group[2] = {rank_of(P, R->replica, 0, R->tensor), rank_of(P, R->replica, train_pipeline(P) - 1, R->tensor)};
  PipeRank *members[2];
  if (!arrive(t, R, group, 2, members)) return false;
  for (int i = 0; i < P->nparams; i++) {
    if (!P->params[i].tied_stage) continue;
    float *bufs[2] = {members[0] ? members[0]->grad[i] : NULL, members[1] ? members[1]->grad[i] : NULL};
    sum_grads(t, bufs, members, group, 2, (size_t)t->numel[i], NULL);
  }
  return true;
}

/* The gradients of R's parameters split in fewer pieces than tensor ranks (grouped K/V
 * heads): each holder of a piece has a partial gradient, summed over the holders. Only
 * with one process per rank (N > 1), so no member waits in arrive(). */
static void sum_shared_pieces(Trainer *t, PipeRank *R) {
  const TpPlan *P = t->plan;
  int N = train_tensor(P);
  int *group = xcalloc((size_t)N, sizeof *group);
  PipeRank **members = xcalloc((size_t)N, sizeof *members);
  float **bufs = xcalloc((size_t)N, sizeof *bufs);
  for (int i = 0; i < P->nparams; i++) {
    const TpPlanParam *p = &P->params[i];
    if (!R->grad[i] || !p->trainable || !train_split(P, p) || p->shard.parts == N) continue;
    int n = 0, first = piece_holder(P, p, R->tensor);
    for (int j = first; j < first + N / p->shard.parts; j++) {
      group[n] = R->tensor_group[j];
      members[n] = pipe_hosted_rank(t, group[n]);
      bufs[n++] = j == R->tensor ? R->grad[i] : NULL;
    }
    sum_grads(t, bufs, members, group, n, (size_t)t->numel[i], NULL);
  }
  free(group), free(members), free(bufs);
}

bool pipe_allreduce_replicas(Trainer *t, PipeRank *R) {
  const TpPlan *P = t->plan;
  int D = P->dp;
  int *group = xcalloc((size_t)D, sizeof *group);
  PipeRank **members = xcalloc((size_t)D, sizeof *members);
  float **bufs = xcalloc((size_t)D, sizeof *bufs);
  for (int d = 0; d < D; d++) group[d] = rank_of(P, d, R->stage, R->tensor);
  bool done = arrive(t, R, group, D, members);
  if (done && train_tensor(P) > 1) sum_shared_pieces(t, R);
  if (done) {
    for (int d = 0; d < D; d++) bufs[d] = members[d] ? members[d]->grad_block : NULL;
    bool zero = train_zero(P); /* each member's shard only */
    sum_grads(t, bufs, members, group, D, (size_t)R->grad_count, zero ? R->shard_counts : NULL);
    for (int d = 0; d < D; d++) {
      PipeRank *M = members[d];
      if (M)
        be(t)->divide(t->compute, M->stream, M->grad_block + (zero ? M->shard_lo : 0),
                      zero ? M->shard_hi - M->shard_lo : R->grad_count, (float)D);
    }
  }
  free(group), free(members), free(bufs);
  return done;
}

/* ---- --zero 1 ---- */

/* The replicas of R (its stage and tensor rank) and, where hosted, each one's index among
 * the hosted ranks (-1 where not). */
static void replica_group(Trainer *t, const PipeRank *R, int *group, int *hosted) {
  for (int d = 0; d < t->plan->dp; d++) {
    group[d] = rank_of(t->plan, d, R->stage, R->tensor);
    hosted[d] = -1;
    for (int h = 0; h < t->nhosted; h++)
      if (t->hosted[h]->rank == group[d]) hosted[d] = h;
  }
}

void pipe_sum_replicas(Trainer *t, double **bufs, size_t count) {
  int D = t->plan->dp;
  int *group = xcalloc((size_t)D, sizeof *group), *hosted = xcalloc((size_t)D, sizeof *hosted);
  double **mine = xcalloc((size_t)D, sizeof *mine);
  for (int h = 0; h < t->nhosted; h++) {
    if (one_process(t) && t->hosted[h]->replica != 0) continue; /* its group is replica 0's */
    replica_group(t, t->hosted[h], group, hosted);
    for (int d = 0; d < D; d++) mine[d] = hosted[d] >= 0 ? bufs[hosted[d]] : NULL;
    sum_host(t, mine, group, D, count);
  }
  free(group), free(hosted), free(mine);
}

void pipe_gather_params(Trainer *t) {
  const PipeRank *R = t->hosted[0];
  int D = t->plan->dp;
  int *group = xcalloc((size_t)D, sizeof *group), *hosted = xcalloc((size_t)D, sizeof *hosted);
  replica_group(t, R, group, hosted);
  /* the fp32 values, or under train_sharded_masters the 16-bit working copies */
  bool half = t->work_block != NULL;
  void *block = half ? t->work_block : (void *)t->param_block;
  size_t bytes = (size_t)R->grad_count * (half ? 2 : 4);
  TpDType dtype = !half ? TP_F32 : t->plan->precision == TP_PLAN_BF16 ? TP_BF16 : TP_F16;
  void *view = pipe_host_view(t, t->stream, block, bytes, true, true);
  tp_comm_all_gather(t->comm, view, R->shard_counts, dtype, group, D);
  pipe_end_host_view(t, t->stream, block, view, bytes, true);
  free(group), free(hosted);
}

/* ---- over every process ---- */

/* buf (count elements of dtype) summed over every process in place: a gather where each
 * process filled its own slots and left the others zero. */
void pipe_sum_processes(Trainer *t, void *buf, size_t count, TpDType dtype) {
  int n = t->comm->size;
  int *group = xcalloc((size_t)n, sizeof *group);
  for (int r = 0; r < n; r++) group[r] = r;
  tp_comm_allreduce_sum(t->comm, buf, count, dtype, group, n);
  free(group);
}

/* Every rank's value of x (one per hosted rank) summed in rank order, on every process. */
double pipe_sum_ranks(Trainer *t, const double *x) {
  int *group = xcalloc((size_t)t->nranks, sizeof *group);
  double *vals = xcalloc((size_t)t->nranks, sizeof *vals);
  double **bufs = xcalloc((size_t)t->nranks, sizeof *bufs);
  for (int r = 0; r < t->nranks; r++) group[r] = r;
  for (int h = 0; h < t->nhosted; h++) {
    vals[t->hosted[h]->rank] = x[h];
    bufs[t->hosted[h]->rank] = &vals[t->hosted[h]->rank];
  }
  sum_host(t, bufs, group, t->nranks, 1);
  double sum = vals[t->hosted[0]->rank];
  free(group), free(vals), free(bufs);
  return sum;
}

int pipe_agree(Trainer *t, int rc) {
  int first;
  int worst = tp_comm_agree(t->comm, rc, &first);
  if (first > 0 && first == t->comm->rank)
    fprintf(stderr, "%s: %s: rank %d: %s\n", t->d->tool, rc == TP_ERR_INTERNAL ? "internal error" : "error",
            t->comm->rank, t->d->last);
  return worst;
}

/* ---- tensor-parallel ---- */

/* io->tensor_allreduce: buf summed over the unit's tensor group, ordered after the work the
 * unit queued on io->stream (plan.h). */
void pipe_tensor_allreduce(TpStepIO *io, float *buf, int64_t count) {
  PipeRank *R = io->tensor_ctx;
  Trainer *t = R->trainer;
  TpComm *c = t->comm;
  int N = train_tensor(t->plan);
  R->reduces++;
  if (c->be->device_memory && c->be->allreduce_sum_on) {
    c->be->allreduce_sum_on(c, buf, (size_t)count, TP_F32, R->tensor_group, N, io->stream);
    return;
  }
  be(t)->stream_sync(t->compute, io->stream);
  void *view = pipe_host_view(t, io->stream, buf, (size_t)count * 4, true, true);
  c->be->allreduce_sum(c, view, (size_t)count, TP_F32, R->tensor_group, N);
  pipe_end_host_view(t, io->stream, buf, view, (size_t)count * 4, true);
}
