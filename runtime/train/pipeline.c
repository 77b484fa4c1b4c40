/* ABI 2 plans: the ranks of a pipeline (stage k of replica d is rank d * S + k) and their
 * schedules. A process hosts either every rank (one process, no MPI: the ranks take turns,
 * each running until it waits for a message another hosted rank has yet to send) or
 * exactly one (mpirun -np S*D). Both run the same instruction lists with the same
 * arithmetic in the same order, so a one-process run and an mpirun run of a plan give the
 * same bits.
 *
 * Messages are packed into one buffer per (kind, microbatch, slice): the sender's arena is
 * free again at once, and a message of several boundary buffers (or none) is one send. */
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cpu/optim.h"

enum { GATHER_TAG = 31999 }; /* pipeline tags are below, collectives above (comm.c) */

typedef struct {
  int src, tag;
  size_t bytes;
  char *data;
} Message;

typedef struct {
  TpCommRequest r;
  char *data;
} PendingSend;

struct PipeRank {
  int rank, stage, replica;
  const TpPlanStage *st;
  float **param;          /* [nparams]: the process's values where this stage holds them */
  float **grad, **scratch; /* [nparams]: the step's gradient; one microbatch's (== grad if M == 1) */
  float *grad_block, *scratch_block; /* the held parameters' gradients, contiguous in param order */
  int64_t grad_count;
  void **arena;           /* [st->arenas] */
  double *loss;           /* [microbatches]: the last stage's losses */
  int pc;                 /* the next instruction */
  bool waiting;           /* at a collective, until every hosted member arrives */
  bool grads_final;       /* divided by the microbatch count */
  Message *inbox;         /* one process: messages sent to this rank, not yet received */
  int ninbox, inbox_cap;
  PendingSend *sends;     /* mpirun: sends not yet complete */
  int nsends, sends_cap;
};

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  TP_ASSERT(p);
  return p;
}

static bool stage_holds(const TpPlanParam *p, int stage) {
  return p->stage == stage || (p->tied_stage && p->tied_stage == stage);
}

static bool one_process(const Trainer *t) { return t->comm->size == 1; }

/* ---- the plan ---- */

static bool message_ok(const TpPlanMessage *msgs, int n, size_t arena) {
  if (!msgs) return false;
  for (int i = 0; i < n; i++) {
    if (msgs[i].nbuffers < 0 || (msgs[i].nbuffers && !msgs[i].buffers)) return false;
    for (int j = 0; j < msgs[i].nbuffers; j++) {
      const TpPlanBuffer *b = &msgs[i].buffers[j];
      if (b->offset < 0 || b->bytes < 0 || (uint64_t)(b->offset + b->bytes) > arena) return false;
    }
  }
  return true;
}

int pipe_check_plan(const TpPlan *P, TpDiag *d) {
  int S = P->nstages, M = P->microbatches, N = P->nslices;
  bool ok = P->dp >= 1 && M >= 1 && N >= 1 && P->slice_len && P->global_batch == P->batch * M * P->dp &&
            (int64_t)M * N * 2 < GATHER_TAG;
  int64_t total = 0;
  for (int i = 0; ok && i < N; i++) ok = P->slice_len[i] >= 1, total += P->slice_len[i];
  ok = ok && total == P->seq;
  for (int i = 0; ok && i < P->nparams; i++) {
    const TpPlanParam *p = &P->params[i];
    ok = p->stage >= 0 && p->stage < S && (p->tied_stage == 0 || (p->tied_stage > p->stage && p->tied_stage < S));
  }
  for (int k = 0; ok && k < S; k++) {
    const TpPlanStage *st = &P->stages[k];
    ok = st->forward && st->backward && st->arenas >= 1 && st->ninsns >= 0 && (st->insns || !st->ninsns);
    for (int i = 0; ok && i < N; i++) ok = st->forward[i] && st->backward[i];
    if (ok && k > 0) ok = message_ok(st->recv_act, N, st->arena_bytes) && message_ok(st->send_grad, N, st->arena_bytes);
    if (ok && k + 1 < S) ok = message_ok(st->send_act, N, st->arena_bytes) && message_ok(st->recv_grad, N, st->arena_bytes);
    for (int j = 0; ok && j < st->ninsns; j++) {
      const TpPlanInsn *x = &st->insns[j];
      bool unit = x->kind <= TP_PLAN_RECV_GRAD;
      ok = x->kind >= 0 && x->kind <= TP_PLAN_OPTIMIZER_STEP &&
           (!unit || (x->mb >= 0 && x->mb < M && x->slice >= 0 && x->slice < N));
      switch (x->kind) {
      case TP_PLAN_SEND_ACT: case TP_PLAN_RECV_GRAD: ok = ok && x->peer == k + 1 && k + 1 < S; break;
      case TP_PLAN_RECV_ACT: case TP_PLAN_SEND_GRAD: ok = ok && x->peer == k - 1 && k > 0; break;
      case TP_PLAN_ALLREDUCE_TIED: ok = ok && S > 1 && (k == 0 || k == S - 1) && x->peer == (k == 0 ? S - 1 : 0); break;
      default: break;
      }
    }
  }
  ok = ok && P->nprobes >= 0 && (P->probes || !P->nprobes);
  for (int p = 0; ok && p < P->nprobes; p++) {
    const TpPlanProbe *pr = &P->probes[p];
    ok = pr->b == P->batch && pr->l >= 1 && pr->c >= 0 && pr->l + pr->c <= P->seq && pr->stages;
    for (int k = 0; ok && k < S; k++) {
      const TpPlanProbeStage *ps = &pr->stages[k];
      ok = ps->forward && ps->backward && ps->nsetup >= 0 && (ps->setup || !ps->nsetup);
      for (int i = 0; ok && i < ps->nsetup; i++) ok = ps->setup[i] != NULL;
    }
  }
  return ok ? TP_OK : tp_internal(d, "the compiled plan's pipeline is malformed");
}

/* ---- setup ---- */

/* Rank `rank`'s buffers into *out (set first, so that pipe_free frees what was allocated
 * before a failure). */
static int new_rank(Trainer *t, int rank, PipeRank **out) {
  const TpPlan *P = t->plan;
  PipeRank *R = *out = xcalloc(1, sizeof *R);
  R->rank = rank;
  R->stage = rank % P->nstages;
  R->replica = rank / P->nstages;
  R->st = &P->stages[R->stage];
  R->param = xcalloc((size_t)P->nparams, sizeof *R->param);
  R->grad = xcalloc((size_t)P->nparams, sizeof *R->grad);
  R->scratch = xcalloc((size_t)P->nparams, sizeof *R->scratch);
  for (int i = 0; i < P->nparams; i++)
    if (stage_holds(&P->params[i], R->stage)) R->grad_count += t->numel[i];
  R->arena = xcalloc((size_t)R->st->arenas, sizeof *R->arena);
  R->loss = xcalloc((size_t)P->microbatches, sizeof *R->loss);
  size_t grad_bytes = (size_t)R->grad_count * 4;
  if (!(R->grad_block = train_alloc(t, grad_bytes, "the gradients of rank %d", rank)) ||
      !(R->scratch_block = P->microbatches > 1 ? train_alloc(t, grad_bytes, "rank %d's microbatch gradients", rank)
                                               : R->grad_block))
    return TP_ERR_INPUT;
  int64_t at = 0;
  for (int i = 0; i < P->nparams; i++)
    if (stage_holds(&P->params[i], R->stage)) {
      R->param[i] = t->param[i];
      R->grad[i] = R->grad_block + at;
      R->scratch[i] = R->scratch_block + at;
      at += t->numel[i];
    }
  for (int a = 0; a < R->st->arenas; a++)
    if (!(R->arena[a] = train_alloc(t, R->st->arena_bytes, "the activations of rank %d (arena %d of %d)", rank, a + 1,
                                    R->st->arenas)))
      return TP_ERR_INPUT;
  return TP_OK;
}

int pipe_setup(Trainer *t) {
  const TpPlan *P = t->plan;
  int S = P->nstages, D = P->dp, nprocs = t->comm->size;
  t->nranks = S * D;
  if (nprocs != 1 && nprocs != t->nranks) {
    if (train_is_root(t))
      fprintf(stderr, "%s: error: the plan has %d stage%s x %d replica%s = %d ranks; mpirun started %d "
              "(run it as mpirun -np %d, or as one process without mpirun)\n", t->d->tool, S,
              S == 1 ? "" : "s", D, D == 1 ? "" : "s", t->nranks, nprocs, t->nranks);
    return TP_ERR_USAGE;
  }
  t->nhosted = nprocs == 1 ? t->nranks : 1;
  int first = nprocs == 1 ? 0 : t->comm->rank;
  for (int i = 0; i < P->nparams; i++) {
    t->held[i] = false;
    for (int h = 0; h < t->nhosted; h++) t->held[i] |= stage_holds(&P->params[i], (first + h) % S);
    size_t bytes = (size_t)t->numel[i] * 4;
    if (!t->held[i] && !train_is_root(t)) continue;
    const char *name = P->params[i].name;
    if (!(t->param[i] = train_alloc(t, bytes, "parameter '%s'", name)) ||
        (P->params[i].trainable && (!(t->m[i] = train_alloc(t, bytes, "the optimizer state of '%s'", name)) ||
                                    !(t->v[i] = train_alloc(t, bytes, "the optimizer state of '%s'", name)))))
      return TP_ERR_INPUT;
  }
  t->hosted = xcalloc((size_t)t->nhosted, sizeof *t->hosted);
  int rc = TP_OK;
  for (int h = 0; h < t->nhosted && !rc; h++) rc = new_rank(t, first + h, &t->hosted[h]);
  for (int i = 0; i < P->nparams && !rc; i++) {
    for (int h = 0; h < t->nhosted && !t->grad[i]; h++) t->grad[i] = t->hosted[h]->grad[i];
    if (!t->grad[i] && train_is_root(t) &&
        !(t->grad[i] = train_alloc(t, (size_t)t->numel[i] * 4, "the gradient of '%s'", P->params[i].name)))
      rc = TP_ERR_INPUT;
  }
  return rc;
}

void pipe_free(Trainer *t) {
  for (int h = 0; t->hosted && h < t->nhosted; h++) {
    PipeRank *R = t->hosted[h];
    if (!R) continue; /* setup failed before it */
    for (int a = 0; a < R->st->arenas; a++) free(R->arena[a]);
    if (R->scratch_block != R->grad_block) free(R->scratch_block);
    free(R->grad_block);
    for (int j = 0; j < R->ninbox; j++) free(R->inbox[j].data);
    for (int j = 0; j < R->nsends; j++) free(R->sends[j].data);
    free(R->arena), free(R->param), free(R->grad), free(R->scratch), free(R->loss);
    free(R->inbox), free(R->sends);
    free(R);
  }
  free(t->hosted);
  t->hosted = NULL;
}

/* ---- messages ---- */

static int message_tag(const TpPlan *P, int kind, int mb, int slice) {
  return (mb * P->nslices + slice) * 2 + (kind == TP_PLAN_SEND_GRAD || kind == TP_PLAN_RECV_GRAD);
}

static size_t message_bytes(const TpPlanMessage *msg) {
  size_t n = 0;
  for (int j = 0; j < msg->nbuffers; j++) n += (size_t)msg->buffers[j].bytes;
  return n;
}

static PipeRank *hosted_rank(Trainer *t, int rank) {
  for (int h = 0; h < t->nhosted; h++)
    if (t->hosted[h]->rank == rank) return t->hosted[h];
  return NULL;
}

static void send_message(Trainer *t, PipeRank *R, const TpPlanInsn *x) {
  const TpPlanStage *st = R->st;
  const TpPlanMessage *msg = x->kind == TP_PLAN_SEND_ACT ? &st->send_act[x->slice] : &st->send_grad[x->slice];
  const char *arena = R->arena[x->mb % st->arenas];
  size_t bytes = message_bytes(msg), at = 0;
  char *data = malloc(bytes ? bytes : 1);
  TP_ASSERT(data);
  for (int j = 0; j < msg->nbuffers; j++) {
    memcpy(data + at, arena + msg->buffers[j].offset, (size_t)msg->buffers[j].bytes);
    at += (size_t)msg->buffers[j].bytes;
  }
  int dst = R->replica * t->plan->nstages + x->peer, tag = message_tag(t->plan, x->kind, x->mb, x->slice);
  if (one_process(t)) {
    PipeRank *to = hosted_rank(t, dst);
    if (to->ninbox == to->inbox_cap) {
      to->inbox_cap = to->inbox_cap ? 2 * to->inbox_cap : 8;
      to->inbox = realloc(to->inbox, (size_t)to->inbox_cap * sizeof *to->inbox);
      TP_ASSERT(to->inbox);
    }
    to->inbox[to->ninbox++] = (Message){R->rank, tag, bytes, data};
    return;
  }
  if (R->nsends == R->sends_cap) {
    R->sends_cap = R->sends_cap ? 2 * R->sends_cap : 8;
    R->sends = realloc(R->sends, (size_t)R->sends_cap * sizeof *R->sends);
    TP_ASSERT(R->sends);
  }
  PendingSend *s = &R->sends[R->nsends++];
  *s = (PendingSend){.r = {.what = x->kind == TP_PLAN_SEND_ACT ? "an activation to be received"
                                                                : "a gradient to be received"},
                     .data = data};
  t->comm->be->isend(t->comm, data, bytes, dst, tag, &s->r);
}

/* Frees the sends that completed; all of them when `all` (waiting). */
static void complete_sends(Trainer *t, PipeRank *R, bool all) {
  int kept = 0;
  for (int j = 0; j < R->nsends; j++) {
    PendingSend *s = &R->sends[j];
    if (all) tp_comm_wait(t->comm, &s->r);
    if (s->r.impl && !t->comm->be->test(t->comm, &s->r)) {
      R->sends[kept++] = *s;
      continue;
    }
    free(s->data);
  }
  R->nsends = kept;
}

/* False while the message has not arrived (one process: its sender has yet to run). */
static bool receive_message(Trainer *t, PipeRank *R, const TpPlanInsn *x) {
  const TpPlanStage *st = R->st;
  const TpPlanMessage *msg = x->kind == TP_PLAN_RECV_ACT ? &st->recv_act[x->slice] : &st->recv_grad[x->slice];
  int src = R->replica * t->plan->nstages + x->peer, tag = message_tag(t->plan, x->kind, x->mb, x->slice);
  size_t bytes = message_bytes(msg);
  char *data;
  if (one_process(t)) {
    int j = 0;
    while (j < R->ninbox && !(R->inbox[j].src == src && R->inbox[j].tag == tag)) j++;
    if (j == R->ninbox) return false;
    TP_ASSERT(R->inbox[j].bytes == bytes);
    data = R->inbox[j].data;
    R->inbox[j] = R->inbox[--R->ninbox];
  } else {
    data = malloc(bytes ? bytes : 1);
    TP_ASSERT(data);
    char what[96];
    snprintf(what, sizeof what, "the %s of microbatch %d, slice %d", x->kind == TP_PLAN_RECV_ACT ?
             "activation" : "gradient", x->mb, x->slice);
    tp_comm_recv(t->comm, data, bytes, src, tag, what);
  }
  char *arena = R->arena[x->mb % st->arenas];
  size_t at = 0;
  for (int j = 0; j < msg->nbuffers; j++) {
    memcpy(arena + msg->buffers[j].offset, data + at, (size_t)msg->buffers[j].bytes);
    at += (size_t)msg->buffers[j].bytes;
  }
  free(data);
  return true;
}

/* ---- collectives ---- */

/* Sums `count` values of each member's buffer (bufs[i] for group[i]; NULL where not
 * hosted) in group order; every member gets the sum. One process: every member is hosted. */
static void sum_over(Trainer *t, void **bufs, const int *group, int n, size_t count, TpDType dtype) {
  if (!one_process(t)) {
    int me = 0;
    while (group[me] != t->comm->rank) me++;
    tp_comm_allreduce_sum(t->comm, bufs[me], count, dtype, group, n);
    return;
  }
  size_t bytes = count * (dtype == TP_F32 ? 4 : 8);
  for (int i = 1; i < n; i++) tp_comm_sum_into(bufs[0], bufs[i], count, dtype);
  for (int i = 1; i < n; i++) memcpy(bufs[i], bufs[0], bytes);
}

/* A collective of R over the ranks `group`: one process runs it when the last member
 * arrives (the others wait at it; true for the one that runs it, which also moves the
 * others on); with mpirun at once. members[i]: the hosted rank of group[i] or NULL. */
static bool arrive(Trainer *t, PipeRank *R, const int *group, int n, PipeRank **members) {
  for (int i = 0; i < n; i++) members[i] = hosted_rank(t, group[i]);
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

/* The step's gradient: the microbatches' sum over their count. */
static void finish_grads(Trainer *t, PipeRank *R) {
  if (R->grads_final) return;
  R->grads_final = true;
  int M = t->plan->microbatches;
  if (M > 1)
    for (int64_t j = 0; j < R->grad_count; j++) R->grad_block[j] /= (float)M;
}

static bool allreduce_tied(Trainer *t, PipeRank *R) {
  const TpPlan *P = t->plan;
  int group[2] = {R->replica * P->nstages, R->replica * P->nstages + P->nstages - 1};
  PipeRank *members[2];
  if (!arrive(t, R, group, 2, members)) return false;
  for (int i = 0; i < P->nparams; i++) {
    if (!P->params[i].tied_stage) continue;
    void *bufs[2] = {members[0] ? members[0]->grad[i] : NULL, members[1] ? members[1]->grad[i] : NULL};
    sum_over(t, bufs, group, 2, (size_t)t->numel[i], TP_F32);
  }
  return true;
}

static bool allreduce_replicas(Trainer *t, PipeRank *R) {
  const TpPlan *P = t->plan;
  int D = P->dp;
  int *group = xcalloc((size_t)D, sizeof *group);
  PipeRank **members = xcalloc((size_t)D, sizeof *members);
  void **bufs = xcalloc((size_t)D, sizeof *bufs);
  for (int d = 0; d < D; d++) group[d] = d * P->nstages + R->stage;
  bool done = arrive(t, R, group, D, members);
  if (done) {
    for (int d = 0; d < D; d++) bufs[d] = members[d] ? members[d]->grad_block : NULL;
    sum_over(t, bufs, group, D, (size_t)R->grad_count, TP_F32);
    for (int d = 0; d < D; d++)
      if (members[d])
        for (int64_t j = 0; j < R->grad_count; j++) members[d]->grad_block[j] /= (float)D;
  }
  free(group), free(members), free(bufs);
  return done;
}

/* Every rank's value of x (one per hosted rank) summed in rank order, on every process. */
static double sum_ranks(Trainer *t, const double *x) {
  int *group = xcalloc((size_t)t->nranks, sizeof *group);
  double *vals = xcalloc((size_t)t->nranks, sizeof *vals);
  void **bufs = xcalloc((size_t)t->nranks, sizeof *bufs);
  for (int r = 0; r < t->nranks; r++) group[r] = r;
  for (int h = 0; h < t->nhosted; h++) {
    vals[t->hosted[h]->rank] = x[h];
    bufs[t->hosted[h]->rank] = &vals[t->hosted[h]->rank];
  }
  sum_over(t, bufs, group, t->nranks, 1, TP_F64);
  double sum = vals[t->hosted[0]->rank];
  free(group), free(vals), free(bufs);
  return sum;
}

/* ---- running the schedules ---- */

static TpStepIO unit_io(Trainer *t, PipeRank *R, int mb) {
  const TpPlan *P = t->plan;
  int64_t row = ((int64_t)R->replica * P->microbatches + mb) * P->batch;
  return (TpStepIO){.arena = R->arena[mb % R->st->arenas], .param = R->param, .grad = R->scratch,
                    .tokens = t->tokens + row * P->seq, .targets = t->targets + row * P->seq, .loss = NAN};
}

TpStepIO pipe_rank_io(Trainer *t, int h, int *stage, int *replica) {
  PipeRank *R = t->hosted[h];
  *stage = R->stage;
  *replica = R->replica;
  return unit_io(t, R, 0);
}

/* Runs instruction x of R; false if it must wait (one process only). */
static bool exec(Trainer *t, PipeRank *R, const TpPlanInsn *x) {
  const TpPlan *P = t->plan;
  TpStepIO io;
  switch (x->kind) {
  case TP_PLAN_FORWARD:
    io = unit_io(t, R, x->mb);
    R->st->forward[x->slice](&io);
    if (R->stage == P->nstages - 1 && x->slice == P->nslices - 1) R->loss[x->mb] = io.loss;
    return true;
  case TP_PLAN_BACKWARD:
    /* the microbatch's backward units run together, from its last slice to slice 0 */
    if (x->slice == P->nslices - 1) memset(R->scratch_block, 0, (size_t)R->grad_count * 4);
    io = unit_io(t, R, x->mb);
    R->st->backward[x->slice](&io);
    if (x->slice == 0 && R->scratch_block != R->grad_block)
      for (int64_t j = 0; j < R->grad_count; j++) R->grad_block[j] += R->scratch_block[j];
    return true;
  case TP_PLAN_SEND_ACT:
  case TP_PLAN_SEND_GRAD:
    send_message(t, R, x);
    return true;
  case TP_PLAN_RECV_ACT:
  case TP_PLAN_RECV_GRAD:
    return receive_message(t, R, x);
  case TP_PLAN_ALLREDUCE_TIED:
    finish_grads(t, R);
    return allreduce_tied(t, R);
  case TP_PLAN_ALLREDUCE:
    finish_grads(t, R);
    return allreduce_replicas(t, R);
  default:
    TP_ASSERT(!"an instruction the runtime does not run here");
    return false;
  }
}

static bool forward_side(int kind) {
  return kind == TP_PLAN_FORWARD || kind == TP_PLAN_SEND_ACT || kind == TP_PLAN_RECV_ACT;
}

/* Runs every hosted rank's schedule up to its optimizer step (train) or its forward
 * instructions only (!train). One process: round robin, each rank until it must wait. */
static void run_schedules(Trainer *t, bool train) {
  for (int h = 0; h < t->nhosted; h++) {
    PipeRank *R = t->hosted[h];
    R->pc = 0;
    R->waiting = R->grads_final = false;
    if (train && R->scratch_block != R->grad_block) memset(R->grad_block, 0, (size_t)R->grad_count * 4);
    for (int m = 0; m < t->plan->microbatches; m++) R->loss[m] = NAN;
  }
  for (;;) {
    bool progress = false, done = true;
    for (int h = 0; h < t->nhosted; h++) {
      PipeRank *R = t->hosted[h];
      while (R->pc < R->st->ninsns) {
        const TpPlanInsn *x = &R->st->insns[R->pc];
        if (x->kind == TP_PLAN_OPTIMIZER_STEP || (!train && !forward_side(x->kind))) {
          R->pc++;
          continue;
        }
        double start = t->trace ? trace_now_us(t->trace) : 0;
        if (!exec(t, R, x)) break;
        if (t->trace) trace_add(t->trace, R->rank, x->kind, x->mb, x->slice, x->peer, start, trace_now_us(t->trace));
        R->pc++;
        progress = true;
        if (R->nsends) complete_sends(t, R, false);
      }
      if (R->pc < R->st->ninsns) done = false;
    }
    if (done) break;
    if (!progress) {
      const PipeRank *R = t->hosted[0];
      for (int h = 0; h < t->nhosted && R->pc >= R->st->ninsns; h++) R = t->hosted[h];
      tp_comm_abort(t->comm, TP_ERR_INTERNAL, "the schedule deadlocked: rank %d waits at instruction %d "
                    "(a compiler bug: the plan's schedule was verified)", R->rank, R->pc);
    }
  }
  for (int h = 0; h < t->nhosted; h++) {
    complete_sends(t, t->hosted[h], true);
    if (train) finish_grads(t, t->hosted[h]);
  }
}

/* The mean over microbatches and replicas of the last stage's losses. */
static double step_loss(Trainer *t) {
  const TpPlan *P = t->plan;
  double *x = xcalloc((size_t)t->nhosted, sizeof *x);
  for (int h = 0; h < t->nhosted; h++) {
    const PipeRank *R = t->hosted[h];
    if (R->stage != P->nstages - 1) continue;
    for (int m = 0; m < P->microbatches; m++) x[h] += R->loss[m];
    x[h] /= P->microbatches;
  }
  double loss = sum_ranks(t, x) / P->dp;
  free(x);
  return loss;
}

double pipe_train_step(Trainer *t) {
  run_schedules(t, true);
  return step_loss(t);
}

double pipe_eval(Trainer *t) {
  run_schedules(t, false);
  return step_loss(t);
}

/* The rank that owns parameter i: replica 0's rank of its stage. */
static int owner(const Trainer *t, int i) { return t->plan->params[i].stage; }

double pipe_grad_norm(Trainer *t) {
  double *x = xcalloc((size_t)t->nhosted, sizeof *x);
  for (int h = 0; h < t->nhosted; h++)
    for (int i = 0; i < t->plan->nparams; i++)
      if (t->plan->params[i].trainable && owner(t, i) == t->hosted[h]->rank)
        x[h] += tp_sum_squares_f32(t->hosted[h]->grad[i], t->numel[i]);
  double norm = sqrt(sum_ranks(t, x));
  free(x);
  return norm;
}

bool pipe_rank_updates(const Trainer *t, int h, int i) {
  const PipeRank *R = t->hosted[h];
  return t->plan->params[i].trainable && (one_process(t) ? owner(t, i) == R->rank : R->param[i] != NULL);
}

void pipe_update(Trainer *t, int64_t step, double lr, float clip) {
  const TpPlan *P = t->plan;
  const TrainOptions *o = &t->o;
  for (int h = 0; h < t->nhosted; h++) {
    PipeRank *R = t->hosted[h];
    double start = t->trace ? trace_now_us(t->trace) : 0;
    for (int i = 0; i < P->nparams; i++) {
      if (!pipe_rank_updates(t, h, i)) continue;
      if (clip != 1) tp_scale_f32(R->grad[i], t->numel[i], clip);
      tp_adamw_step(t->param[i], R->grad[i], t->m[i], t->v[i], t->numel[i], lr, o->beta1, o->beta2, o->eps,
                    t->decay[i], step);
    }
    if (t->trace) trace_add(t->trace, R->rank, TRACE_UPDATE, -1, -1, -1, start, trace_now_us(t->trace));
  }
}

/* ---- gathering to process 0 ---- */

static void gather_buffer(Trainer *t, int i, float *buf) {
  int from = owner(t, i);
  size_t bytes = (size_t)t->numel[i] * 4;
  if (from == 0) return;
  if (t->comm->rank == from) tp_comm_send(t->comm, buf, bytes, 0, GATHER_TAG, "rank 0 to gather a tensor");
  else if (t->comm->rank == 0) tp_comm_recv(t->comm, buf, bytes, from, GATHER_TAG, "a tensor to gather");
}

void pipe_gather(Trainer *t, bool grads, bool moments) {
  if (one_process(t)) return;
  const TpPlan *P = t->plan;
  for (int i = 0; i < P->nparams; i++) {
    if (grads) {
      if (P->params[i].trainable) gather_buffer(t, i, t->grad[i]);
      continue;
    }
    gather_buffer(t, i, t->param[i]);
    if (moments && P->params[i].trainable) gather_buffer(t, i, t->m[i]), gather_buffer(t, i, t->v[i]);
  }
}

int pipe_agree(Trainer *t, int rc) {
  int first;
  int worst = tp_comm_agree(t->comm, rc, &first);
  if (first > 0 && first == t->comm->rank)
    fprintf(stderr, "%s: %s: rank %d: %s\n", t->d->tool, rc == TP_ERR_INTERNAL ? "internal error" : "error",
            t->comm->rank, t->d->last);
  return worst;
}
