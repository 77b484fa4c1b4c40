/* The trainer's buffers and steps, on the compute backend (../compute.h): ABI 1 plans run
 * their stage functions in one process; ABI 2 plans, the ranks of a pipeline (tensor rank
 * t of stage k of replica d is rank (d * S + k) * N + t, plan.h) and their schedules. A
 * process hosts either every rank (one process, no MPI: the ranks take turns, each running
 * until it waits for a message another hosted rank has yet to send) or exactly one
 * (mpirun -np S*N*D). Both run the same instruction lists with the same arithmetic in the
 * same order, so a one-process run and an mpirun run of a plan give the same bits. A
 * tensor-parallel plan (N > 1) needs one process per rank: its units call
 * io->tensor_allreduce in the middle of their work, where a rank cannot wait for another
 * hosted rank to take its turn.
 *
 * Messages are packed into one device buffer per (kind, microbatch, slice): the sender's
 * arena is free again once the pack ran, and a message of several boundary buffers (or
 * none) is one send. These buffers are allocated with the rank (MessageBuffers), never on
 * the step path: allocating or freeing device memory may synchronize the whole device,
 * which would keep the host from running ahead of the GPU and, between a rank's sends and
 * the receive its peer waits for, deadlock a transport whose sends wait for their receives
 * (NCCL). Each (kind, microbatch, slice) has its own, so a step never reuses one; the step's
 * end (every send complete, every stream synchronized) frees them all for the next. Each
 * hosted rank queues its work on its own stream; events order a message's unpack after its
 * pack, and the host synchronizes before it hands a buffer to the transport (one that reads
 * device memory gets the stream instead, and its own stream waits for the pack) or reads a
 * result back. */
#include "train.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { GATHER_TAG = 31999 }; /* pipeline tags are below, collectives above (comm.c) */

typedef struct {
  int src, tag;
  size_t bytes;
  void *data;     /* device */
  TpEvent *ready; /* after its pack, on the sender's stream */
} Message;

typedef struct {
  TpCommRequest r;
  void *data, *view; /* the device buffer, and what the transport reads (host_view) */
  size_t bytes;
} PendingSend;

/* The device buffers of one kind of message (send or receive of activations or gradients):
 * one per (microbatch, slice), at data[mb * nslices + slice], carved from one allocation;
 * sends have an event each (one process: the receiver's stream waits for the pack). */
typedef struct {
  void *block;
  void **data;
  TpEvent **ready;
} MessageBuffers;

enum { MESSAGE_KINDS = 4, MESSAGE_ALIGN = 256 };

struct PipeRank {
  int rank, stage, replica, tensor;
  Trainer *trainer;       /* for io->tensor_allreduce (tensor_ctx is the rank) */
  int *tensor_group;      /* [N]: the ranks of its stage's tensor group */
  int reduces;            /* io->tensor_allreduce calls of the unit running */
  const TpPlanStage *st;
  float **param;          /* [nparams]: the process's values where this stage holds them */
  float **grad, **scratch; /* [nparams]: the step's gradient; one microbatch's (== grad if M == 1) */
  float *grad_block, *scratch_block; /* the held parameters' gradients, contiguous in param order */
  int64_t grad_count;
  void **arena;           /* [st->arenas] */
  double *loss;           /* [microbatches]: the last stage's losses */
  TpStepIO *loss_io;      /* [microbatches]: the last forward units' io, whose loss a device
                           * unit's copy sets by the step's final synchronization */
  int pc;                 /* the next instruction */
  bool waiting;           /* at a collective, until every hosted member arrives */
  bool grads_final;       /* divided by the microbatch count */
  Message *inbox;         /* one process: messages sent to this rank, not yet received */
  int ninbox, inbox_cap;
  PendingSend *sends;     /* mpirun: sends not yet complete */
  int nsends, sends_cap;
  MessageBuffers messages[MESSAGE_KINDS]; /* by message_kind() */
  TpStream *stream;       /* where its units and math run */
  TpEvent *event;
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

/* The rank of tensor rank `tensor` of stage `stage` of replica `replica` (plan.h). */
static int rank_of(const TpPlan *P, int replica, int stage, int tensor) {
  return (replica * P->nstages + stage) * train_tensor(P) + tensor;
}

static int stage_of(const TpPlan *P, int rank) { return rank / train_tensor(P) % P->nstages; }

/* The first tensor rank holding the same piece of p as tensor rank `tensor` (0 for a
 * parameter not split: every member holds the same bits, the first speaks for them). */
static int piece_holder(const TpPlan *P, const TpPlanParam *p, int tensor) {
  if (!train_split(P, p)) return 0;
  int N = train_tensor(P);
  return tensor * p->shard.parts / N * (N / p->shard.parts);
}

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
  int T = train_tensor(P);
  for (int i = 0; ok && i < P->nparams; i++) {
    const TpPlanParam *p = &P->params[i];
    const TpPlanShard *sh = &p->shard;
    ok = p->stage >= 0 && p->stage < S && (p->tied_stage == 0 || (p->tied_stage > p->stage && p->tied_stage < S));
    /* a piece is whole chunks' equal parts: its dim is chunks (>= 1) x the piece's length */
    if (ok && train_split(P, p))
      ok = sh->axis >= 0 && sh->axis < p->rank && sh->parts <= T && T % sh->parts == 0 && sh->chunks >= 0 &&
           p->dims[sh->axis] % (sh->chunks > 1 ? sh->chunks : 1) == 0;
  }
  for (int k = 0; ok && k < S; k++) {
    const TpPlanStage *st = &P->stages[k];
    ok = st->forward && st->backward && st->arenas >= 1 && st->ninsns >= 0 && (st->insns || !st->ninsns) &&
         (T == 1 || (st->forward_reduces && st->backward_reduces));
    for (int i = 0; ok && i < N; i++)
      ok = st->forward[i] && st->backward[i] && (T == 1 || (st->forward_reduces[i] >= 0 && st->backward_reduces[i] >= 0));
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

/* ---- buffers ---- */

static const TpComputeBackend *be(const Trainer *t) { return t->compute->be; }

/* `bytes` of device memory (device) or host memory, zeroed; NULL after an error naming
 * what they are for. */
static void *alloc_bytes(Trainer *t, bool device, size_t bytes, const char *what) {
  /* Beyond the machine's memory it is refused without trying: with overcommit the allocation
   * could succeed and zeroing it end in the OOM killer. */
  int64_t machine = tp_physical_memory();
  bool fits = bytes <= SIZE_MAX - 64 && (!machine || (uint64_t)bytes <= (uint64_t)machine);
  void *p = NULL;
  if (fits && device) p = be(t)->alloc(t->compute, bytes);
  else if (fits && (p = aligned_alloc(64, bytes ? (bytes + 63) / 64 * 64 : 64))) memset(p, 0, bytes);
  if (p) return p;
  tp_error(t->d, "cannot allocate %zu bytes (%.1f GiB) for %s: %s (compile the plan for a smaller --batch or "
           "--seq, or more --stages)", bytes, (double)bytes / (1 << 30), what,
           fits ? "out of memory" : "more than this machine's memory");
  return NULL;
}

void *pipe_alloc(Trainer *t, size_t bytes, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return alloc_bytes(t, true, bytes, what);
}

static void dev_free(Trainer *t, void *p) { be(t)->free(t->compute, p); }

static const TpPlanMessage *stage_messages(const TpPlanStage *st, int kind) {
  switch (kind) {
  case TP_PLAN_SEND_ACT: return st->send_act;
  case TP_PLAN_RECV_ACT: return st->recv_act;
  case TP_PLAN_SEND_GRAD: return st->send_grad;
  default: return st->recv_grad;
  }
}

static int message_kind(int kind) { return kind - TP_PLAN_SEND_ACT; } /* SEND_ACT..RECV_GRAD */

static size_t message_bytes(const TpPlanMessage *msg) {
  size_t n = 0;
  for (int j = 0; j < msg->nbuffers; j++) n += (size_t)msg->buffers[j].bytes;
  return n;
}

static size_t aligned(size_t bytes) { return (bytes + MESSAGE_ALIGN - 1) / MESSAGE_ALIGN * MESSAGE_ALIGN; }

/* R's buffers for the messages of `kind` its schedule has (mpirun: receives too; one
 * process: a receiver unpacks from the sender's buffer). */
static int alloc_messages(Trainer *t, PipeRank *R, int kind) {
  const TpPlan *P = t->plan;
  int M = P->microbatches, N = P->nslices;
  bool send = kind == TP_PLAN_SEND_ACT || kind == TP_PLAN_SEND_GRAD, used = false;
  for (int j = 0; j < R->st->ninsns; j++) used |= R->st->insns[j].kind == kind;
  if (!used || (!send && one_process(t))) return TP_OK;
  const TpPlanMessage *msgs = stage_messages(R->st, kind);
  size_t per_mb = 0;
  for (int i = 0; i < N; i++) per_mb += aligned(message_bytes(&msgs[i]));
  MessageBuffers *B = &R->messages[message_kind(kind)];
  B->data = xcalloc((size_t)M * N, sizeof *B->data);
  if (send) B->ready = xcalloc((size_t)M * N, sizeof *B->ready);
  if (!(B->block = pipe_alloc(t, per_mb * (size_t)M, "rank %d's message buffers", R->rank))) return TP_ERR_INPUT;
  for (int mb = 0, at = 0; mb < M; mb++) {
    char *next = (char *)B->block + per_mb * (size_t)mb;
    for (int i = 0; i < N; i++, at++) {
      B->data[at] = next;
      next += aligned(message_bytes(&msgs[i]));
      if (send) B->ready[at] = be(t)->event_new(t->compute);
    }
  }
  return TP_OK;
}

static void free_messages(Trainer *t, PipeRank *R) {
  int n = t->plan->microbatches * t->plan->nslices;
  for (int k = 0; k < MESSAGE_KINDS; k++) {
    MessageBuffers *B = &R->messages[k];
    for (int i = 0; B->ready && i < n; i++) be(t)->event_free(t->compute, B->ready[i]);
    dev_free(t, B->block);
    free(B->data), free(B->ready);
  }
}

/* Rank `rank`'s buffers into *out (set first, so that pipe_free frees what was allocated
 * before a failure). */
static int new_rank(Trainer *t, int rank, PipeRank **out) {
  const TpPlan *P = t->plan;
  PipeRank *R = *out = xcalloc(1, sizeof *R);
  int N = train_tensor(P);
  R->rank = rank;
  R->stage = stage_of(P, rank);
  R->replica = rank / (N * P->nstages);
  R->tensor = rank % N;
  R->trainer = t;
  R->tensor_group = xcalloc((size_t)N, sizeof *R->tensor_group);
  for (int j = 0; j < N; j++) R->tensor_group[j] = rank_of(P, R->replica, R->stage, j);
  R->st = &P->stages[R->stage];
  R->stream = be(t)->stream_new(t->compute);
  R->event = be(t)->event_new(t->compute);
  R->param = xcalloc((size_t)P->nparams, sizeof *R->param);
  R->grad = xcalloc((size_t)P->nparams, sizeof *R->grad);
  R->scratch = xcalloc((size_t)P->nparams, sizeof *R->scratch);
  for (int i = 0; i < P->nparams; i++)
    if (stage_holds(&P->params[i], R->stage)) R->grad_count += t->numel[i];
  R->arena = xcalloc((size_t)R->st->arenas, sizeof *R->arena);
  R->loss = xcalloc((size_t)P->microbatches, sizeof *R->loss);
  R->loss_io = xcalloc((size_t)P->microbatches, sizeof *R->loss_io);
  size_t grad_bytes = (size_t)R->grad_count * 4;
  if (!(R->grad_block = pipe_alloc(t, grad_bytes, "the gradients of rank %d", rank)) ||
      !(R->scratch_block = P->microbatches > 1 ? pipe_alloc(t, grad_bytes, "rank %d's microbatch gradients", rank)
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
    if (!(R->arena[a] = pipe_alloc(t, R->st->arena_bytes, "the activations of rank %d (arena %d of %d)", rank, a + 1,
                                   R->st->arenas)))
      return TP_ERR_INPUT;
  for (int kind = TP_PLAN_SEND_ACT; kind <= TP_PLAN_RECV_GRAD; kind++)
    if (alloc_messages(t, R, kind)) return TP_ERR_INPUT;
  return TP_OK;
}

/* A parameter's value and, if trainable, AdamW state. */
static int alloc_param(Trainer *t, int i) {
  size_t bytes = (size_t)t->numel[i] * 4;
  const char *name = t->plan->params[i].name;
  if (!(t->param[i] = pipe_alloc(t, bytes, "parameter '%s'", name)) ||
      (t->plan->params[i].trainable && (!(t->m[i] = pipe_alloc(t, bytes, "the optimizer state of '%s'", name)) ||
                                        !(t->v[i] = pipe_alloc(t, bytes, "the optimizer state of '%s'", name)))))
    return TP_ERR_INPUT;
  return TP_OK;
}

/* ABI 1: every parameter and stage in this process. */
static int setup_stages(Trainer *t) {
  const TpPlan *P = t->plan;
  t->arena = xcalloc((size_t)P->nstages, sizeof *t->arena);
  for (int i = 0; i < P->nparams; i++) {
    t->held[i] = true;
    if (alloc_param(t, i) ||
        !(t->grad[i] = pipe_alloc(t, (size_t)t->numel[i] * 4, "the gradient of '%s'", P->params[i].name)))
      return TP_ERR_INPUT;
  }
  for (int s = 0; s < P->nstages; s++)
    if (!(t->arena[s] = pipe_alloc(t, P->arena_bytes[s], "the activations of stage %d (its arena)", s)))
      return TP_ERR_INPUT;
  return TP_OK;
}

static int setup_ranks(Trainer *t) {
  const TpPlan *P = t->plan;
  int S = P->nstages, N = train_tensor(P), D = P->dp, nprocs = t->comm->size;
  t->nranks = S * N * D;
  /* one process hosts every rank, except a tensor-parallel plan's (see the top) */
  if (nprocs != t->nranks && (nprocs != 1 || N > 1)) {
    char tensor[48] = "";
    if (N > 1) snprintf(tensor, sizeof tensor, " x %d tensor ranks", N);
    if (train_is_root(t))
      fprintf(stderr, "%s: error: the plan has %d stage%s%s x %d replica%s = %d ranks; %s %d%s (run it as mpirun -np %d%s)\n",
              t->d->tool, S, S == 1 ? "" : "s", tensor, D, D == 1 ? "" : "s", t->nranks,
              tp_comm_launched_by_mpi() ? "mpirun started" : "it was started as", nprocs,
              tp_comm_launched_by_mpi() ? "" : " process", t->nranks,
              N > 1 ? ": a tensor-parallel plan runs one process per rank" : ", or as one process without mpirun");
    return TP_ERR_USAGE;
  }
  t->nhosted = nprocs == 1 ? t->nranks : 1;
  int first = nprocs == 1 ? 0 : t->comm->rank;
  for (int i = 0; i < P->nparams; i++) {
    t->held[i] = false;
    for (int h = 0; h < t->nhosted; h++) t->held[i] |= stage_holds(&P->params[i], stage_of(P, first + h));
    if (t->held[i] && alloc_param(t, i)) return TP_ERR_INPUT;
  }
  t->hosted = xcalloc((size_t)t->nhosted, sizeof *t->hosted);
  int rc = TP_OK;
  for (int h = 0; h < t->nhosted && !rc; h++) rc = new_rank(t, first + h, &t->hosted[h]);
  for (int i = 0; i < P->nparams && !rc; i++)
    for (int h = 0; h < t->nhosted && !t->grad[i]; h++) t->grad[i] = t->hosted[h]->grad[i];
  return rc;
}

int pipe_setup(Trainer *t) {
  const TpPlan *P = t->plan;
  size_t np = (size_t)(P->nparams ? P->nparams : 1), ntok = (size_t)(train_rows(P) * P->seq);
  t->param = xcalloc(np, sizeof *t->param);
  t->grad = xcalloc(np, sizeof *t->grad);
  t->m = xcalloc(np, sizeof *t->m);
  t->v = xcalloc(np, sizeof *t->v);
  t->held = xcalloc(np, sizeof *t->held);
  t->numel = xcalloc(np, sizeof *t->numel);
  t->whole_numel = xcalloc(np, sizeof *t->whole_numel);
  for (int i = 0; i < P->nparams; i++) {
    const TpPlanParam *p = &P->params[i];
    t->numel[i] = tp_numel(p->rank, p->dims);
    t->whole_numel[i] = t->numel[i] * (train_split(P, p) ? p->shard.parts : 1);
  }
  t->stream = be(t)->stream_new(t->compute);
  t->nranks = 1;
  if (!(t->tokens = alloc_bytes(t, false, ntok * sizeof *t->tokens, "a step's token ids")) ||
      !(t->targets = alloc_bytes(t, false, ntok * sizeof *t->targets, "a step's targets")) ||
      !(t->dev_tokens = pipe_alloc(t, ntok * sizeof *t->tokens, "a step's token ids")) ||
      !(t->dev_targets = pipe_alloc(t, ntok * sizeof *t->targets, "a step's targets")))
    return TP_ERR_INPUT;
  int rc = P->stages ? setup_ranks(t) : setup_stages(t);
  if (!rc && !(t->norm_sum = pipe_alloc(t, (size_t)(P->stages ? t->nhosted : 1) * sizeof(double),
                                        "the gradient norm")))
    rc = TP_ERR_INPUT;
  return rc;
}

void pipe_free(Trainer *t) {
  if (!t->compute) return;
  pipe_host_free(t);
  for (int h = 0; t->hosted && h < t->nhosted; h++) {
    PipeRank *R = t->hosted[h];
    if (!R) continue; /* setup failed before it */
    for (int a = 0; a < R->st->arenas; a++) dev_free(t, R->arena[a]);
    if (R->scratch_block != R->grad_block) dev_free(t, R->scratch_block);
    dev_free(t, R->grad_block);
    for (int j = 0; j < R->nsends; j++)
      if (R->sends[j].view != R->sends[j].data) free(R->sends[j].view);
    free_messages(t, R);
    be(t)->event_free(t->compute, R->event);
    be(t)->stream_free(t->compute, R->stream);
    free(R->arena), free(R->param), free(R->grad), free(R->scratch), free(R->loss), free(R->loss_io);
    free(R->tensor_group);
    free(R->inbox), free(R->sends);
    free(R);
  }
  free(t->hosted);
  t->hosted = NULL;
  for (int i = 0; t->param && i < t->plan->nparams; i++) {
    dev_free(t, t->param[i]);
    if (!t->plan->stages) dev_free(t, t->grad[i]); /* else a hosted rank's */
    dev_free(t, t->m[i]);
    dev_free(t, t->v[i]);
  }
  for (int s = 0; t->arena && s < t->plan->nstages; s++) dev_free(t, t->arena[s]);
  dev_free(t, t->dev_tokens), dev_free(t, t->dev_targets), dev_free(t, t->norm_sum);
  free(t->tokens), free(t->targets);
  free(t->param), free(t->grad), free(t->m), free(t->v), free(t->held), free(t->numel), free(t->arena);
  free(t->whole_numel);
  if (t->stream) be(t)->stream_free(t->compute, t->stream);
}

/* ---- transports and device memory ----
 * The transport gets device buffers where the backend is host_addressable (the CPU's
 * device memory is host memory, which MPI reads and writes directly) or the transport
 * reads device memory (NCCL) and the other side passes device memory too (`direct`: not
 * so for a tensor gathered into rank 0's host copy); else a host copy. */

/* What the transport may read or write for device buffer dev: dev, or a host copy (of
 * dev's contents when `fill`). */
static void *host_view(Trainer *t, TpStream *s, void *dev, size_t bytes, bool fill, bool direct) {
  if (be(t)->host_addressable || (direct && t->comm->be->device_memory)) return dev;
  void *view = malloc(bytes ? bytes : 1);
  TP_ASSERT(view);
  if (fill) {
    be(t)->copy_d2h(t->compute, s, view, dev, bytes);
    be(t)->stream_sync(t->compute, s);
  }
  return view;
}

/* The end of host_view: its contents back into dev when `back`. */
static void end_host_view(Trainer *t, TpStream *s, void *dev, void *view, size_t bytes, bool back) {
  if (view == dev) return;
  if (back) {
    be(t)->copy_h2d(t->compute, s, dev, view, bytes);
    be(t)->stream_sync(t->compute, s);
  }
  free(view);
}

/* ---- messages ---- */

static int message_tag(const TpPlan *P, int kind, int mb, int slice) {
  return (mb * P->nslices + slice) * 2 + (kind == TP_PLAN_SEND_GRAD || kind == TP_PLAN_RECV_GRAD);
}

static PipeRank *hosted_rank(Trainer *t, int rank) {
  for (int h = 0; h < t->nhosted; h++)
    if (t->hosted[h]->rank == rank) return t->hosted[h];
  return NULL;
}

static void send_message(Trainer *t, PipeRank *R, const TpPlanInsn *x) {
  const TpPlanStage *st = R->st;
  const TpPlanMessage *msg = &stage_messages(st, x->kind)[x->slice];
  size_t bytes = message_bytes(msg);
  const MessageBuffers *B = &R->messages[message_kind(x->kind)];
  int at = x->mb * t->plan->nslices + x->slice;
  void *data = B->data[at];
  be(t)->pack(t->compute, R->stream, data, R->arena[x->mb % st->arenas], msg->buffers, msg->nbuffers);
  int dst = rank_of(t->plan, R->replica, x->peer, R->tensor), tag = message_tag(t->plan, x->kind, x->mb, x->slice);
  if (one_process(t)) { /* the receiver's stream waits for the pack */
    TpEvent *ready = B->ready[at];
    be(t)->event_record(t->compute, ready, R->stream);
    PipeRank *to = hosted_rank(t, dst);
    if (to->ninbox == to->inbox_cap) {
      to->inbox_cap = to->inbox_cap ? 2 * to->inbox_cap : 8;
      to->inbox = realloc(to->inbox, (size_t)to->inbox_cap * sizeof *to->inbox);
      TP_ASSERT(to->inbox);
    }
    to->inbox[to->ninbox++] = (Message){R->rank, tag, bytes, data, ready};
    return;
  }
  if (R->nsends == R->sends_cap) {
    R->sends_cap = R->sends_cap ? 2 * R->sends_cap : 8;
    R->sends = realloc(R->sends, (size_t)R->sends_cap * sizeof *R->sends);
    TP_ASSERT(R->sends);
  }
  if (!t->comm->be->device_memory) { /* the transport reads it from the host's side; else its stream waits */
    be(t)->event_record(t->compute, R->event, R->stream);
    be(t)->event_sync(t->compute, R->event);
  }
  PendingSend *s = &R->sends[R->nsends++];
  *s = (PendingSend){.r = {.what = x->kind == TP_PLAN_SEND_ACT ? "an activation to be received"
                                                                : "a gradient to be received", .stream = R->stream},
                     .data = data, .view = host_view(t, R->stream, data, bytes, true, true), .bytes = bytes};
  t->comm->be->isend(t->comm, s->view, bytes, dst, tag, &s->r);
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
    end_host_view(t, R->stream, s->data, s->view, s->bytes, false);
  }
  R->nsends = kept;
}

/* False while the message has not arrived (one process: its sender has yet to run). */
static bool receive_message(Trainer *t, PipeRank *R, const TpPlanInsn *x) {
  const TpPlanStage *st = R->st;
  const TpPlanMessage *msg = &stage_messages(st, x->kind)[x->slice];
  int src = rank_of(t->plan, R->replica, x->peer, R->tensor), tag = message_tag(t->plan, x->kind, x->mb, x->slice);
  size_t bytes = message_bytes(msg);
  void *data;
  if (one_process(t)) {
    int j = 0;
    while (j < R->ninbox && !(R->inbox[j].src == src && R->inbox[j].tag == tag)) j++;
    if (j == R->ninbox) return false;
    TP_ASSERT(R->inbox[j].bytes == bytes);
    data = R->inbox[j].data;
    be(t)->stream_wait(t->compute, R->stream, R->inbox[j].ready);
    R->inbox[j] = R->inbox[--R->ninbox];
  } else {
    data = R->messages[message_kind(x->kind)].data[x->mb * t->plan->nslices + x->slice];
    char what[96];
    snprintf(what, sizeof what, "the %s of microbatch %d, slice %d", x->kind == TP_PLAN_RECV_ACT ?
             "activation" : "gradient", x->mb, x->slice);
    void *view = host_view(t, R->stream, data, bytes, false, true);
    tp_comm_recv(t->comm, view, bytes, src, tag, what); /* complete: the unpack below finds it */
    end_host_view(t, R->stream, data, view, bytes, true);
  }
  /* queued after the message on R's stream: nothing waits for it here (data is not reused
   * before the step's end) */
  be(t)->unpack(t->compute, R->stream, R->arena[x->mb % st->arenas], data, msg->buffers, msg->nbuffers);
  return true;
}

/* ---- collectives ---- */

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
 * their streams are done with them. */
static void sum_grads(Trainer *t, float **bufs, PipeRank **members, const int *group, int n, size_t count) {
  for (int i = 0; i < n; i++)
    if (members[i]) be(t)->stream_sync(t->compute, members[i]->stream);
  if (!one_process(t)) {
    float *mine = bufs[group_index(t, group)];
    void *view = host_view(t, t->stream, mine, count * 4, true, true);
    tp_comm_allreduce_sum(t->comm, view, count, TP_F32, group, n);
    end_host_view(t, t->stream, mine, view, count * 4, true);
    return;
  }
  for (int i = 1; i < n; i++) be(t)->add_into(t->compute, t->stream, bufs[0], bufs[i], (int64_t)count);
  for (int i = 1; i < n; i++) be(t)->copy_d2d(t->compute, t->stream, bufs[i], bufs[0], count * 4);
  be(t)->stream_sync(t->compute, t->stream);
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
  if (M > 1) be(t)->divide(t->compute, R->stream, R->grad_block, R->grad_count, (float)M);
}

static bool allreduce_tied(Trainer *t, PipeRank *R) {
  const TpPlan *P = t->plan;
  int group[2] = {rank_of(P, R->replica, 0, R->tensor), rank_of(P, R->replica, P->nstages - 1, R->tensor)};
  PipeRank *members[2];
  if (!arrive(t, R, group, 2, members)) return false;
  for (int i = 0; i < P->nparams; i++) {
    if (!P->params[i].tied_stage) continue;
    float *bufs[2] = {members[0] ? members[0]->grad[i] : NULL, members[1] ? members[1]->grad[i] : NULL};
    sum_grads(t, bufs, members, group, 2, (size_t)t->numel[i]);
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
      members[n] = hosted_rank(t, group[n]);
      bufs[n++] = j == R->tensor ? R->grad[i] : NULL;
    }
    sum_grads(t, bufs, members, group, n, (size_t)t->numel[i]);
  }
  free(group), free(members), free(bufs);
}

static bool allreduce_replicas(Trainer *t, PipeRank *R) {
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
    sum_grads(t, bufs, members, group, D, (size_t)R->grad_count);
    for (int d = 0; d < D; d++)
      if (members[d]) be(t)->divide(t->compute, members[d]->stream, members[d]->grad_block, R->grad_count, (float)D);
  }
  free(group), free(members), free(bufs);
  return done;
}

/* Every rank's value of x (one per hosted rank) summed in rank order, on every process. */
static double sum_ranks(Trainer *t, const double *x) {
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

/* ---- running the schedules ---- */

void pipe_tokens_to_device(Trainer *t) {
  size_t bytes = (size_t)(train_rows(t->plan) * t->plan->seq) * sizeof *t->tokens;
  be(t)->copy_h2d(t->compute, t->stream, t->dev_tokens, t->tokens, bytes);
  be(t)->copy_h2d(t->compute, t->stream, t->dev_targets, t->targets, bytes);
  be(t)->stream_sync(t->compute, t->stream); /* before any unit reads them, or the host refills them */
}

/* Runs a unit on `stream`. io->loss (a host float) is set once the stream is synchronized
 * (a device unit queues its copy there). */
static void run_unit(Trainer *t, TpStream *stream, TpUnitFn fn, TpStepIO *io) {
  be(t)->run_unit(t->compute, stream, fn, io);
}

/* io->tensor_allreduce: buf summed over the unit's tensor group, ordered after the work the
 * unit queued on io->stream (plan.h). */
static void tensor_allreduce(TpStepIO *io, float *buf, int64_t count) {
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
  void *view = host_view(t, io->stream, buf, (size_t)count * 4, true, true);
  c->be->allreduce_sum(c, view, (size_t)count, TP_F32, R->tensor_group, N);
  end_host_view(t, io->stream, buf, view, (size_t)count * 4, true);
}

static TpStepIO unit_io(Trainer *t, PipeRank *R, int mb) {
  const TpPlan *P = t->plan;
  int64_t row = ((int64_t)R->replica * P->microbatches + mb) * P->batch;
  bool tensor = train_tensor(P) > 1;
  return (TpStepIO){.arena = R->arena[mb % R->st->arenas], .param = R->param, .grad = R->scratch,
                    .tokens = t->dev_tokens + row * P->seq, .targets = t->dev_targets + row * P->seq, .loss = NAN,
                    .compute = t->compute, .stream = R->stream,
                    .tensor_allreduce = tensor ? tensor_allreduce : NULL, .tensor_ctx = tensor ? R : NULL,
                    .tensor_rank = R->tensor};
}

/* Runs unit x (FORWARD or BACKWARD) of R with io; with tensor parallelism, checks that it
 * called io->tensor_allreduce as often as the plan says (a member that does not would
 * leave the others waiting in an all-reduce, or pair theirs wrongly). */
static void run_rank_unit(Trainer *t, PipeRank *R, const TpPlanInsn *x, TpStepIO *io) {
  bool fwd = x->kind == TP_PLAN_FORWARD;
  R->reduces = 0;
  run_unit(t, R->stream, (fwd ? R->st->forward : R->st->backward)[x->slice], io);
  if (train_tensor(t->plan) == 1) return;
  int want = (fwd ? R->st->forward_reduces : R->st->backward_reduces)[x->slice];
  if (R->reduces != want)
    tp_comm_abort(t->comm, TP_ERR_INTERNAL, "the %s unit of stage %d, slice %d (microbatch %d) made %d tensor "
                  "all-reduce%s; the plan says %d (a compiler bug)", fwd ? "forward" : "backward", R->stage,
                  x->slice, x->mb, R->reduces, R->reduces == 1 ? "" : "s", want);
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
    if (R->stage == P->nstages - 1 && x->slice == P->nslices - 1) {
      /* the unit queues the copy of its loss: read after the schedule's last synchronization */
      R->loss_io[x->mb] = io;
      run_rank_unit(t, R, x, &R->loss_io[x->mb]);
    } else {
      run_rank_unit(t, R, x, &io);
    }
    return true;
  case TP_PLAN_BACKWARD:
    /* the microbatch's backward units run together, from its last slice to slice 0 */
    if (x->slice == P->nslices - 1)
      be(t)->memset(t->compute, R->stream, R->scratch_block, 0, (size_t)R->grad_count * 4);
    io = unit_io(t, R, x->mb);
    run_rank_unit(t, R, x, &io);
    if (x->slice == 0 && R->scratch_block != R->grad_block)
      be(t)->add_into(t->compute, R->stream, R->grad_block, R->scratch_block, R->grad_count);
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
    if (train && R->scratch_block != R->grad_block)
      be(t)->memset(t->compute, R->stream, R->grad_block, 0, (size_t)R->grad_count * 4);
    for (int m = 0; m < t->plan->microbatches; m++) R->loss[m] = R->loss_io[m].loss = NAN;
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
        if (t->trace) {
          be(t)->stream_sync(t->compute, R->stream); /* the instruction's end */
          trace_add(t->trace, R->rank, x->kind, x->mb, x->slice, x->peer, start, trace_now_us(t->trace));
        }
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
    PipeRank *R = t->hosted[h];
    complete_sends(t, R, true);
    if (train) finish_grads(t, R);
    be(t)->stream_sync(t->compute, R->stream);
    if (R->stage == t->plan->nstages - 1)
      for (int m = 0; m < t->plan->microbatches; m++) R->loss[m] = R->loss_io[m].loss;
  }
}

/* The mean over microbatches and replicas of the last stage's losses (tensor rank 0's). */
static double step_loss(Trainer *t) {
  const TpPlan *P = t->plan;
  double *x = xcalloc((size_t)t->nhosted, sizeof *x);
  for (int h = 0; h < t->nhosted; h++) {
    const PipeRank *R = t->hosted[h];
    if (R->stage != P->nstages - 1 || R->tensor != 0) continue;
    for (int m = 0; m < P->microbatches; m++) x[h] += R->loss[m];
    x[h] /= P->microbatches;
  }
  double loss = sum_ranks(t, x) / P->dp;
  free(x);
  return loss;
}

/* ABI 1: the stage functions in order (backward: in reverse), one process; the loss. */
static double run_stages(Trainer *t, bool backward) {
  const TpPlan *P = t->plan;
  TpStepIO io = {.param = t->param, .grad = t->grad, .tokens = t->dev_tokens, .targets = t->dev_targets,
                 .loss = NAN, .compute = t->compute, .stream = t->stream};
  for (int pass = 0; pass <= (int)backward; pass++)
    for (int k = 0; k < P->nstages; k++) {
      int s = pass ? P->nstages - 1 - k : k;
      double start = t->trace ? trace_now_us(t->trace) : 0;
      io.arena = t->arena[s];
      run_unit(t, t->stream, (pass ? P->backward : P->forward)[s], &io);
      if (t->trace) {
        be(t)->stream_sync(t->compute, t->stream);
        trace_add(t->trace, 0, pass ? TP_PLAN_BACKWARD : TP_PLAN_FORWARD, 0, 0, s, start, trace_now_us(t->trace));
      }
    }
  be(t)->stream_sync(t->compute, t->stream);
  return io.loss;
}

double pipe_train_step(Trainer *t) {
  pipe_tokens_to_device(t);
  if (!t->plan->stages) {
    for (int i = 0; i < t->plan->nparams; i++)
      be(t)->memset(t->compute, t->stream, t->grad[i], 0, (size_t)t->numel[i] * 4);
    return run_stages(t, true);
  }
  run_schedules(t, true);
  return step_loss(t);
}

double pipe_eval(Trainer *t) {
  pipe_tokens_to_device(t);
  if (!t->plan->stages) return run_stages(t, false);
  run_schedules(t, false);
  return step_loss(t);
}

/* The rank that owns parameter i (its piece held by tensor rank `tensor`): replica 0's
 * rank of its stage, the first tensor rank holding that piece (ABI 1: the one). */
static int owner(const Trainer *t, int i, int tensor) {
  const TpPlan *P = t->plan;
  return P->stages ? rank_of(P, 0, P->params[i].stage, piece_holder(P, &P->params[i], tensor)) : 0;
}

/* Whether hosted rank h (ABI 1: h 0, the process) counts parameter i in the norm: every
 * piece once. */
static bool counts_in_norm(const Trainer *t, int h, int i) {
  if (!t->plan->stages) return t->m[i] != NULL;
  const PipeRank *R = t->hosted[h];
  return t->plan->params[i].trainable && owner(t, i, R->tensor) == R->rank;
}

double pipe_grad_norm(Trainer *t) {
  int H = t->plan->stages ? t->nhosted : 1;
  double *x = xcalloc((size_t)H, sizeof *x);
  for (int h = 0; h < H; h++) {
    TpStream *s = t->plan->stages ? t->hosted[h]->stream : t->stream;
    float **grad = t->plan->stages ? t->hosted[h]->grad : t->grad;
    be(t)->memset(t->compute, s, &t->norm_sum[h], 0, sizeof *t->norm_sum);
    for (int i = 0; i < t->plan->nparams; i++)
      if (counts_in_norm(t, h, i)) be(t)->sum_squares(t->compute, s, grad[i], t->numel[i], &t->norm_sum[h]);
    be(t)->copy_d2h(t->compute, s, &x[h], &t->norm_sum[h], sizeof *x);
    be(t)->stream_sync(t->compute, s);
  }
  double norm = sqrt(t->plan->stages ? sum_ranks(t, x) : x[0]);
  free(x);
  return norm;
}

bool pipe_rank_updates(const Trainer *t, int h, int i) {
  if (!t->plan->stages) return t->m[i] != NULL;
  const PipeRank *R = t->hosted[h];
  return t->plan->params[i].trainable && (one_process(t) ? owner(t, i, 0) == R->rank : R->param[i] != NULL);
}

void pipe_update(Trainer *t, int64_t step, double lr, float clip) {
  const TpPlan *P = t->plan;
  const TrainOptions *o = &t->o;
  for (int h = 0; h < (P->stages ? t->nhosted : 1); h++) {
    TpStream *s = P->stages ? t->hosted[h]->stream : t->stream;
    float **grad = P->stages ? t->hosted[h]->grad : t->grad;
    double start = t->trace ? trace_now_us(t->trace) : 0;
    for (int i = 0; i < P->nparams; i++) {
      if (!pipe_rank_updates(t, h, i)) continue;
      TpAdamW adamw = {lr, o->beta1, o->beta2, o->eps, t->decay[i], step};
      if (clip != 1) be(t)->clip(t->compute, s, grad[i], t->numel[i], clip);
      be(t)->adamw(t->compute, s, t->param[i], grad[i], t->m[i], t->v[i], t->numel[i], &adamw);
    }
    be(t)->stream_sync(t->compute, s);
    if (t->trace)
      trace_add(t->trace, P->stages ? t->hosted[h]->rank : 0, TRACE_UPDATE, -1, -1, -1, start, trace_now_us(t->trace));
  }
}

/* ---- host copies ---- */

static float **host_array(const Trainer *t) {
  return xcalloc((size_t)(t->plan->nparams ? t->plan->nparams : 1), sizeof(float *));
}

/* Host copies for parameter i (the whole tensor): its gradient (grads), else its value and
 * with moments, if trainable, AdamW's m and v. */
static int host_alloc_param(Trainer *t, int i, bool grads, bool moments) {
  TrainHost *H = &t->host;
  const TpPlanParam *p = &t->plan->params[i];
  size_t bytes = (size_t)t->whole_numel[i] * 4;
  char what[256];
  snprintf(what, sizeof what, "a host copy of '%s'", p->name);
  if (grads) return p->trainable && !(H->grad[i] = alloc_bytes(t, false, bytes, what)) ? TP_ERR_INPUT : TP_OK;
  if (!(H->param[i] = alloc_bytes(t, false, bytes, what))) return TP_ERR_INPUT;
  if (moments && p->trainable &&
      (!(H->m[i] = alloc_bytes(t, false, bytes, what)) || !(H->v[i] = alloc_bytes(t, false, bytes, what))))
    return TP_ERR_INPUT;
  return TP_OK;
}

static void host_arrays(Trainer *t) {
  pipe_host_free(t);
  t->host = (TrainHost){host_array(t), host_array(t), host_array(t), host_array(t)};
}

int pipe_host_alloc(Trainer *t, bool moments) {
  host_arrays(t);
  int rc = TP_OK;
  for (int i = 0; i < t->plan->nparams && !rc; i++)
    if (t->held[i]) rc = host_alloc_param(t, i, false, moments);
  return rc;
}

void pipe_shard_copy(const TpPlan *P, const TpPlanParam *p, int tensor, float *piece, float *whole, bool gather) {
  if (!train_split(P, p)) {
    if (gather) memcpy(whole, piece, (size_t)tp_numel(p->rank, p->dims) * 4);
    else memcpy(piece, whole, (size_t)tp_numel(p->rank, p->dims) * 4);
    return;
  }
  const TpPlanShard *sh = &p->shard;
  int N = train_tensor(P), chunks = sh->chunks > 1 ? sh->chunks : 1, at = tensor * sh->parts / N;
  int64_t outer = tp_numel(sh->axis, p->dims), inner = tp_numel(p->rank - sh->axis - 1, p->dims + sh->axis + 1);
  int64_t len = p->dims[sh->axis] / chunks * inner; /* one piece of one chunk */
  int64_t chunk = len * sh->parts;                  /* one chunk of the whole */
  for (int64_t o = 0; o < outer; o++)
    for (int c = 0; c < chunks; c++) {
      float *mine = piece + (o * chunks + c) * len, *there = whole + (o * chunks + c) * chunk + at * len;
      memcpy(gather ? there : mine, gather ? mine : there, (size_t)len * 4);
    }
}

/* A host copy of parameter i (the whole tensor) into device buffer dev: this rank's piece
 * where it is split. */
/* A host buffer for one tensor rank's piece of parameter i. The whole tensor's host copy is
 * held meanwhile, so this can still fail: the job ends with one line (the ranks of the
 * tensor group wait on this one). */
static float *piece_buffer(Trainer *t, int i) {
  float *piece = alloc_bytes(t, false, (size_t)t->numel[i] * 4, "a parameter's piece");
  if (!piece)
    tp_comm_abort(t->comm, 1, "cannot hold a piece of parameter '%s' beside the whole tensor",
                  t->plan->params[i].name);
  return piece;
}

static void upload(Trainer *t, int i, void *dev, const float *host) {
  const TpPlan *P = t->plan;
  size_t bytes = (size_t)t->numel[i] * 4;
  if (!train_split(P, &P->params[i])) {
    be(t)->copy_h2d(t->compute, t->stream, dev, host, bytes);
    return;
  }
  float *piece = piece_buffer(t, i);
  pipe_shard_copy(P, &P->params[i], t->hosted[0]->tensor, piece, (float *)host, false);
  be(t)->copy_h2d(t->compute, t->stream, dev, piece, bytes);
  be(t)->stream_sync(t->compute, t->stream);
  free(piece);
}

void pipe_upload(Trainer *t) {
  TrainHost *H = &t->host;
  for (int i = 0; i < t->plan->nparams; i++) {
    if (!t->held[i]) continue;
    if (H->param[i]) upload(t, i, t->param[i], H->param[i]);
    if (H->m[i]) upload(t, i, t->m[i], H->m[i]);
    if (H->v[i]) upload(t, i, t->v[i], H->v[i]);
  }
  be(t)->stream_sync(t->compute, t->stream); /* before the host copies are freed */
}

void pipe_host_free(Trainer *t) {
  TrainHost *H = &t->host;
  for (int i = 0; H->param && i < t->plan->nparams; i++)
    free(H->param[i]), free(H->grad[i]), free(H->m[i]), free(H->v[i]);
  free(H->param), free(H->grad), free(H->m), free(H->v);
  *H = (TrainHost){0};
}

/* Device buffer dev of parameter i (the piece of tensor rank `tensor` where it is split)
 * from its owner into `host` on process 0. */
static void fetch_piece(Trainer *t, int i, int tensor, void *dev, float *host) {
  int from = owner(t, i, tensor);
  size_t bytes = (size_t)t->numel[i] * 4;
  if (one_process(t) || from == 0) {
    if (!train_is_root(t)) return;
    be(t)->copy_d2h(t->compute, t->stream, host, dev, bytes);
    be(t)->stream_sync(t->compute, t->stream);
  } else if (t->comm->rank == from) {
    void *view = host_view(t, t->stream, dev, bytes, true, false);
    tp_comm_send(t->comm, view, bytes, 0, GATHER_TAG, "rank 0 to gather a tensor");
    end_host_view(t, t->stream, dev, view, bytes, false);
  } else if (train_is_root(t)) {
    tp_comm_recv(t->comm, host, bytes, from, GATHER_TAG, "a tensor to gather");
  }
}

/* The whole tensor of device buffer dev of parameter i into process 0's host copy: from
 * its owner, or each piece from the first tensor rank holding it. */
static void fetch(Trainer *t, int i, void *dev, float *host) {
  const TpPlan *P = t->plan;
  const TpPlanParam *p = &P->params[i];
  if (!train_split(P, p)) {
    fetch_piece(t, i, 0, dev, host);
    return;
  }
  int N = train_tensor(P);
  float *piece = train_is_root(t) ? piece_buffer(t, i) : NULL;
  for (int tensor = 0; tensor < N; tensor += N / p->shard.parts) {
    fetch_piece(t, i, tensor, dev, piece);
    if (piece) pipe_shard_copy(P, p, tensor, piece, host, true);
  }
  free(piece);
}

int pipe_download(Trainer *t, bool grads, bool moments) {
  const TpPlan *P = t->plan;
  host_arrays(t);
  int rc = TP_OK;
  for (int i = 0; i < P->nparams && !rc && train_is_root(t); i++) rc = host_alloc_param(t, i, grads, moments);
  if ((rc = pipe_agree(t, rc))) return rc;
  for (int i = 0; i < P->nparams; i++) {
    if (grads) {
      if (P->params[i].trainable) fetch(t, i, t->grad[i], t->host.grad[i]);
      continue;
    }
    fetch(t, i, t->param[i], t->host.param[i]);
    if (moments && P->params[i].trainable) fetch(t, i, t->m[i], t->host.m[i]), fetch(t, i, t->v[i], t->host.v[i]);
  }
  return TP_OK;
}

int pipe_agree(Trainer *t, int rc) {
  int first;
  int worst = tp_comm_agree(t->comm, rc, &first);
  if (first > 0 && first == t->comm->rank)
    fprintf(stderr, "%s: %s: rank %d: %s\n", t->d->tool, rc == TP_ERR_INTERNAL ? "internal error" : "error",
            t->comm->rank, t->d->last);
  return worst;
}
