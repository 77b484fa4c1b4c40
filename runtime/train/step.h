/* Private to the files of a training step (runtime/train/): a rank's state, and what these
 * files call of each other. The trainer's buffers and steps run on the compute backend
 * (../compute.h): ABI 1 plans run their stage functions in one process; ABI 2 plans, the
 * ranks of a pipeline (tensor rank t of stage k of replica d is rank (d * S + k) * N + t,
 * plan.h) and their schedules. A process hosts either every rank (one process, no MPI: the
 * ranks take turns, each running until it waits for a message another hosted rank has yet
 * to send) or exactly one (mpirun -np S*N*D). Both run the same instruction lists with the
 * same arithmetic in the same order, so a one-process run and an mpirun run of a plan give
 * the same bits. A tensor-parallel plan (N > 1) needs one process per rank: its units call
 * io->tensor_allreduce in the middle of their work, where a rank cannot wait for another
 * hosted rank to take its turn.
 *
 *   schedule.c     runs the step: the schedule interpreter, the gradient norm, AdamW
 *   plan_check.c   the plan's pipeline checked before anything runs
 *   buffers.c      device memory, the ranks' buffers, the transport's view of device memory
 *   messages.c     point-to-point messages between a stage and its neighbours
 *   collectives.c  all-reduces over replicas, tied stages and tensor groups; sums over ranks
 *   params.c       the parameter store: host copies of whole tensors, scattered to the
 *                  ranks' pieces and gathered back to process 0; --zero 1's shards
 *
 * --zero 1 (train_zero): the D replicas of a rank (the same stage and tensor rank) cut its
 * gradient block (the held parameters' gradients in parameter order) into D contiguous
 * shards, replica d taking the d-th. The cuts lie on the gradient norm's pieces
 * (TP_NORM_PIECES per parameter, ../compute.h), the first piece start at or past
 * d * count / D, so that every piece's sum of squares is one replica's and the norm adds
 * the same doubles in the same order as without sharding. A replica keeps the AdamW
 * moments of its shard (and, in 16-bit precisions, its fp32 masters alike, the trained
 * parameters' only), receives the sum of its shard's gradients (reduce-scatter), updates the
 * values of its shard and all-gathers them (in 16-bit precisions: rounds its shard of the
 * masters to the working copies and all-gathers those). Under mpirun the held values are one block in the gradient
 * block's order, gathered in place; one process holds one copy of each value, which every
 * replica's rank updates its shard of, so there is nothing to gather. Host copies and files
 * hold whole tensors: loading scatters the moments to the shards, saving gathers them.
 * The entry points the rest of the trainer calls are in train.h. */
#ifndef TOKPIPE_TRAIN_STEP_H
#define TOKPIPE_TRAIN_STEP_H

#include <stdlib.h>

#include "train.h"

enum { GATHER_TAG = 31999 }; /* pipeline tags are below, collectives above (comm.c) */

/* ---- messages.c's state in a rank ---- */

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

enum { MESSAGE_KINDS = 4 };

/* One of the virtual stages a rank runs (chunk c of rank k: virtual stage c * S + k; one,
 * the rank's stage, unless the plan is interleaved): its units, arenas and messages, and
 * where its parameters' gradients lie in the rank's gradient block. */
typedef struct {
  int stage; /* the virtual stage */
  const TpPlanStage *st;
  void **arena;                           /* [st->arenas] */
  MessageBuffers messages[MESSAGE_KINDS]; /* by message_kind() */
  int64_t grad_lo, grad_hi;               /* its parameters' elements of the gradient block */
} RankChunk;

struct PipeRank {
  int rank, stage, replica, tensor; /* stage: the pipeline rank k < S (train_pipeline) */
  Trainer *trainer;                 /* for io->tensor_allreduce (tensor_ctx is the rank) */
  int *tensor_group;                /* [N]: the ranks of its stage's tensor group */
  int reduces;                      /* io->tensor_allreduce calls of the unit running */
  const TpPlanStage *st;            /* stages[stage]: the instruction list */
  int nchunks;
  RankChunk *chunk;                  /* [nchunks]: its virtual stages, chunk c at c */
  float **param;                     /* [nparams]: the process's values where this stage holds them */
  float **grad, **scratch;           /* [nparams]: the step's gradient; one microbatch's (== grad if M == 1) */
  float *grad_block, *scratch_block; /* the held parameters' gradients, contiguous in param order */
  int64_t grad_count;
  /* --zero 1: this rank's shard of its gradient block, elements [shard_lo, shard_hi), whose
   * values it updates with its AdamW moments m_block and v_block (shard_hi - shard_lo
   * elements each); shard_counts[d]: replica d's shard size, for the collectives */
  int64_t shard_lo, shard_hi;
  size_t *shard_counts;
  float *m_block, *v_block;
  /* train_sharded_masters: the fp32 masters of the shard, laid out alike */
  float *master_block;
  void *transient;   /* the largest of its chunks' transient_bytes: every unit's, one at a time */
  double *loss;      /* [microbatches]: the last stage's losses */
  TpStepIO *loss_io; /* [microbatches]: the last forward units' io, whose loss a device
                           * unit's copy sets by the step's final synchronization */
  int pc;            /* the next instruction */
  bool waiting;      /* at a collective, until every hosted member arrives */
  bool grads_final;  /* divided by the microbatch count */
  Message *inbox;    /* one process: messages sent to this rank, not yet received */
  int ninbox, inbox_cap;
  PendingSend *sends; /* mpirun: sends not yet complete */
  int nsends, sends_cap;
  TpStream *stream; /* where its units and math run */
  TpEvent *event;
};

/* ---- small helpers ---- */

static inline void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  TP_ASSERT(p);
  return p;
}

static inline const TpComputeBackend *be(const Trainer *t) { return t->compute->be; }

/* Whether pipeline rank `stage` holds parameter p (its virtual stage's or, tied, the last
 * one's), and as which chunk. */
static inline bool stage_holds(const TpPlan *P, const TpPlanParam *p, int stage) {
  int S = train_pipeline(P);
  return p->stage % S == stage || (p->tied_stage && p->tied_stage % S == stage);
}
static inline int param_chunk(const TpPlan *P, const TpPlanParam *p, int stage) {
  int S = train_pipeline(P);
  return p->stage % S == stage ? p->stage / S : p->tied_stage / S;
}

static inline bool one_process(const Trainer *t) { return t->comm->size == 1; }

/* The rank of tensor rank `tensor` of pipeline rank `stage` (< S) of replica `replica`
 * (plan.h). */
static inline int rank_of(const TpPlan *P, int replica, int stage, int tensor) {
  return (replica * train_pipeline(P) + stage) * train_tensor(P) + tensor;
}

static inline int stage_of(const TpPlan *P, int rank) { return rank / train_tensor(P) % train_pipeline(P); }

/* The first tensor rank holding the same piece of p as tensor rank `tensor` (0 for a
 * parameter not split: every member holds the same bits, the first speaks for them). */
static inline int piece_holder(const TpPlan *P, const TpPlanParam *p, int tensor) {
  if (!train_split(P, p)) return 0;
  int N = train_tensor(P);
  return tensor * p->shard.parts / N * (N / p->shard.parts);
}

/* ---- params.c: --zero 1's shards ---- */
/* bounds[0..D]: the shards of stage `stage`'s gradient block, replica d's [bounds[d],
 * bounds[d + 1]). */
void pipe_shard_bounds(const Trainer *t, int stage, int64_t *bounds);
/* Where parameter i starts in stage `stage`'s gradient block (it holds i). */
int64_t pipe_block_offset(const Trainer *t, int stage, int i);
/* The elements [*a, *b) of an n-element parameter at `offset` of a block that lie in the
 * shard [lo, hi); false when none do. */
static inline bool shard_part(int64_t offset, int64_t n, int64_t lo, int64_t hi, int64_t *a, int64_t *b) {
  *a = lo > offset ? lo - offset : 0;
  *b = hi < offset + n ? hi - offset : n;
  return *a < *b;
}
/* The same for hosted rank R's shard and parameter i (which its stage holds). */
static inline bool rank_shard_part(const Trainer *t, const PipeRank *R, int i, int64_t *a, int64_t *b) {
  return shard_part(R->grad[i] - R->grad_block, t->numel[i], R->shard_lo, R->shard_hi, a, b);
}

/* ---- buffers.c ---- */
/* `bytes` of device memory (device) or host memory, zeroed; NULL after an error naming
 * what they are for. */
void *pipe_alloc_bytes(Trainer *t, bool device, size_t bytes, const char *what);
void pipe_dev_free(Trainer *t, void *p);
/* Host memory that a step copies to or from the device, zeroed: the backend's page-locked
 * memory where it has some (TpComputeBackend.host_alloc), so that the copies queue without
 * a host wait; NULL after an error naming what it is for. pipe_free_staging frees it (NULL:
 * nothing). */
void *pipe_alloc_staging(Trainer *t, size_t bytes, const char *what);
void pipe_free_staging(Trainer *t, void *p);
/* What the transport may read or write for device buffer dev: dev, or a host copy (of
 * dev's contents when `fill`); `direct` when the other side passes device memory too. */
void *pipe_host_view(Trainer *t, TpStream *s, void *dev, size_t bytes, bool fill, bool direct);
/* The end of pipe_host_view: its contents back into dev when `back`. */
void pipe_end_host_view(Trainer *t, TpStream *s, void *dev, void *view, size_t bytes, bool back);
/* The hosted rank `rank`, or NULL where another process hosts it. */
PipeRank *pipe_hosted_rank(Trainer *t, int rank);

/* ---- messages.c ---- */
/* The buffers of R's chunk c for the messages of `kind` (TP_PLAN_SEND_ACT..TP_PLAN_RECV_GRAD). */
int pipe_alloc_messages(Trainer *t, PipeRank *R, int c, int kind);
/* Every message buffer of R, its inbox and its pending sends. */
void pipe_free_messages(Trainer *t, PipeRank *R);
/* SEND_ACT or SEND_GRAD instruction x of R. */
void pipe_send(Trainer *t, PipeRank *R, const TpPlanInsn *x);
/* RECV_ACT or RECV_GRAD instruction x of R; false while the message has not arrived. */
bool pipe_receive(Trainer *t, PipeRank *R, const TpPlanInsn *x);
/* Frees the sends that completed; all of them when `all` (waiting). */
void pipe_complete_sends(Trainer *t, PipeRank *R, bool all);

/* ---- collectives.c ---- */
/* ALLREDUCE_TIED and ALLREDUCE of R; false while R waits for hosted members (one process). */
bool pipe_allreduce_tied(Trainer *t, PipeRank *R);
bool pipe_allreduce_replicas(Trainer *t, PipeRank *R);
/* Every rank's value of x (one per hosted rank) summed in rank order, on every process. */
double pipe_sum_ranks(Trainer *t, const double *x);
/* --zero 1: bufs[h] (count doubles of hosted rank h) summed over each rank's replicas in
 * replica order, on every member (the norm's pieces, each a replica's, the others 0). */
void pipe_sum_replicas(Trainer *t, double **bufs, size_t count);
/* --zero 1 under mpirun: the values each replica updated (its shard of the rank's block)
 * gathered to every replica. */
void pipe_gather_params(Trainer *t);
/* io->tensor_allreduce of every unit of a tensor-parallel plan. */
void pipe_tensor_allreduce(TpStepIO *io, float *buf, int64_t count);

/* ---- params.c ---- */
/* A parameter's device value and, if trainable, AdamW state. */
int pipe_alloc_param(Trainer *t, int i);
/* Parameter i's 16-bit working copy rounded from its f32 master (bf16, fp16; else nothing;
 * under train_sharded_masters a trained one's is rounded by shards: pipe_round_shard). */
void pipe_round_param(Trainer *t, TpStream *s, int i);
/* train_sharded_masters: the part of parameter i's working copy in hosted rank R's shard,
 * rounded from R's masters. */
void pipe_round_shard(Trainer *t, TpStream *s, const PipeRank *R, int i);
/* The rank that owns parameter i (its piece held by tensor rank `tensor`). */
int pipe_owner(const Trainer *t, int i, int tensor);

#endif
