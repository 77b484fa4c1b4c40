/* A step: the schedule interpreter that runs every hosted rank's instruction list (ABI 2;
 * ABI 1: the stage functions in order), the step's loss, the global gradient norm and the
 * AdamW update. Messages are messages.c's, collectives collectives.c's. */
#include "step.h"

#include <math.h>

/* ---- the units ---- */

/* Queued on t->stream from staging memory, no host wait: the hosted ranks' streams wait for
 * the copies before their units read them (ABI 1's units run on t->stream), and the host
 * refills the staging memory only after the step's end, which synchronizes those streams. */
void pipe_tokens_to_device(Trainer *t) {
  size_t bytes = (size_t)(train_rows(t->plan) * t->plan->seq) * sizeof *t->tokens;
  *t->loss_scale_host = t->loss_scale;
  be(t)->copy_h2d(t->compute, t->stream, t->dev_tokens, t->tokens, bytes);
  be(t)->copy_h2d(t->compute, t->stream, t->dev_targets, t->targets, bytes);
  be(t)->copy_h2d(t->compute, t->stream, t->dev_loss_scale, t->loss_scale_host, sizeof *t->loss_scale_host);
  be(t)->event_record(t->compute, t->tokens_ready, t->stream);
  for (int h = 0; h < t->nhosted; h++) be(t)->stream_wait(t->compute, t->hosted[h]->stream, t->tokens_ready);
}

/* Runs a unit on `stream`. io->loss (a host float) is set once the stream is synchronized
 * (a device unit queues its copy there). */
static void run_unit(Trainer *t, TpStream *stream, TpUnitFn fn, TpStepIO *io) {
  be(t)->run_unit(t->compute, stream, fn, io);
}

/* The io of R's units of microbatch mb on its chunk c. */
static TpStepIO unit_io(Trainer *t, PipeRank *R, int c, int mb) {
  const TpPlan *P = t->plan;
  int64_t row = ((int64_t)R->replica * P->microbatches + mb) * P->batch;
  bool tensor = train_tensor(P) > 1;
  return (TpStepIO){.arena = R->chunk[c].arena[mb % R->chunk[c].st->arenas],
                    .transient = R->transient,
                    .param = R->param,
                    .grad = R->scratch,
                    .tokens = t->dev_tokens + row * P->seq,
                    .targets = t->dev_targets + row * P->seq,
                    .loss = NAN,
                    .compute = t->compute,
                    .stream = R->stream,
                    .tensor_allreduce = tensor ? pipe_tensor_allreduce : NULL,
                    .tensor_ctx = tensor ? R : NULL,
                    .tensor_rank = R->tensor,
                    .loss_scale = t->loss_scale,
                    .loss_scale_device = t->dev_loss_scale};
}

/* Runs unit x (FORWARD, BACKWARD, BACKWARD_INPUT or BACKWARD_WEIGHT) of R with io; with
 * tensor parallelism, checks that it called io->tensor_allreduce as often as the plan says
 * (a member that does not would leave the others waiting in an all-reduce, or pair theirs
 * wrongly). A split backward's all-reduces are its input part's (backward_reduces). */
static void run_rank_unit(Trainer *t, PipeRank *R, const TpPlanInsn *x, TpStepIO *io) {
  const RankChunk *C = &R->chunk[x->chunk];
  const TpPlanStage *st = C->st;
  bool fwd = x->kind == TP_PLAN_FORWARD, weight = x->kind == TP_PLAN_BACKWARD_WEIGHT;
  const TpUnitFn *fns = fwd                                 ? st->forward
                        : x->kind == TP_PLAN_BACKWARD_INPUT ? st->backward_input
                        : weight                            ? st->backward_weight
                                                            : st->backward;
  R->reduces = 0;
  run_unit(t, R->stream, fns[x->slice], io);
  if (train_tensor(t->plan) == 1) return;
  int want = weight ? 0 : (fwd ? st->forward_reduces : st->backward_reduces)[x->slice];
  if (R->reduces != want)
    tp_comm_abort(t->comm, TP_ERR_INTERNAL,
                  "the %s unit of stage %d, slice %d (microbatch %d) made %d tensor "
                  "all-reduce%s; the plan says %d (a compiler bug)",
                  fwd ? "forward" : "backward", C->stage, x->slice, x->mb, R->reduces, R->reduces == 1 ? "" : "s",
                  want);
}

TpStepIO pipe_rank_io(Trainer *t, int h, int *stage, int *replica) {
  PipeRank *R = t->hosted[h];
  *stage = R->stage;
  *replica = R->replica;
  return unit_io(t, R, 0, 0);
}

float *const *pipe_rank_grads(Trainer *t, int h) { return t->hosted[h]->grad; }

/* ---- the schedules ---- */

/* The step's gradient: the microbatches' sum over their count. */
static void finish_grads(Trainer *t, PipeRank *R) {
  if (R->grads_final) return;
  R->grads_final = true;
  /* fp16: the sum of the gradients of loss_scale * loss, unscaled at once */
  float by = (float)t->plan->microbatches * (t->plan->precision == TP_PLAN_FP16 ? t->loss_scale : 1);
  if (by != 1) be(t)->divide(t->compute, R->stream, R->grad_block, R->grad_count, by);
}

/* Runs instruction x of R; false if it must wait (one process only). */
static bool exec(Trainer *t, PipeRank *R, const TpPlanInsn *x) {
  const TpPlan *P = t->plan;
  TpStepIO io;
  switch (x->kind) {
  case TP_PLAN_FORWARD:
    io = unit_io(t, R, x->chunk, x->mb);
    if (R->chunk[x->chunk].stage == P->nstages - 1 && x->slice == P->nslices - 1) {
      /* the unit queues the copy of its loss: read after the schedule's last synchronization */
      R->loss_io[x->mb] = io;
      run_rank_unit(t, R, x, &R->loss_io[x->mb]);
    } else {
      run_rank_unit(t, R, x, &io);
    }
    return true;
  case TP_PLAN_BACKWARD_INPUT: /* writes no parameter gradients: its weight part does */
    io = unit_io(t, R, x->chunk, x->mb);
    run_rank_unit(t, R, x, &io);
    return true;
  case TP_PLAN_BACKWARD:
  case TP_PLAN_BACKWARD_WEIGHT: {
    /* the microbatch's backward units (split: weight parts) on a virtual stage run
     * together, from its last slice to slice 0, into one scratch set of gradients: those of
     * that stage's parameters, one range of the block (all of it unless interleaved) */
    const RankChunk *C = &R->chunk[x->chunk];
    int64_t lo = C->grad_lo, n = C->grad_hi - C->grad_lo;
    size_t elem = train_elem_bytes(P);
    if (x->slice == P->nslices - 1)
      be(t)->memset(t->compute, R->stream, (char *)R->scratch_block + lo * (int64_t)elem, 0, (size_t)n * elem);
    io = unit_io(t, R, x->chunk, x->mb);
    run_rank_unit(t, R, x, &io);
    void *scratch = (char *)R->scratch_block + lo * (int64_t)elem;
    if (x->slice == 0 && P->precision != TP_PLAN_FP32)
      be(t)->add_half_into(t->compute, R->stream, R->grad_block + lo, scratch, n, P->precision);
    else if (x->slice == 0 && R->scratch_block != R->grad_block)
      be(t)->add_into(t->compute, R->stream, R->grad_block + lo, scratch, n);
    return true;
  }
  case TP_PLAN_SEND_ACT:
  case TP_PLAN_SEND_GRAD: pipe_send(t, R, x); return true;
  case TP_PLAN_RECV_ACT:
  case TP_PLAN_RECV_GRAD: return pipe_receive(t, R, x);
  case TP_PLAN_ALLREDUCE_TIED: finish_grads(t, R); return pipe_allreduce_tied(t, R);
  case TP_PLAN_ALLREDUCE: finish_grads(t, R); return pipe_allreduce_replicas(t, R);
  default: TP_ASSERT(!"an instruction the runtime does not run here"); return false;
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
          int stage = train_chunks(t->plan) > 1 && x->mb >= 0 ? R->chunk[x->chunk].stage : -1;
          trace_add(t->trace, R->rank, x->kind, x->mb, x->slice, x->peer, stage, start, trace_now_us(t->trace));
        }
        R->pc++;
        progress = true;
        if (R->nsends) pipe_complete_sends(t, R, false);
      }
      if (R->pc < R->st->ninsns) done = false;
    }
    if (done) break;
    if (!progress) {
      const PipeRank *R = t->hosted[0];
      for (int h = 0; h < t->nhosted && R->pc >= R->st->ninsns; h++) R = t->hosted[h];
      tp_comm_abort(t->comm, TP_ERR_INTERNAL,
                    "the schedule deadlocked: rank %d waits at instruction %d "
                    "(a compiler bug: the plan's schedule was verified)",
                    R->rank, R->pc);
    }
  }
  for (int h = 0; h < t->nhosted; h++) {
    PipeRank *R = t->hosted[h];
    pipe_complete_sends(t, R, true);
    if (train) finish_grads(t, R);
    be(t)->stream_sync(t->compute, R->stream);
    if (R->stage == train_pipeline(t->plan) - 1)
      for (int m = 0; m < t->plan->microbatches; m++) R->loss[m] = R->loss_io[m].loss;
  }
}

/* The mean over microbatches and replicas of the last stage's losses (tensor rank 0's). */
static double step_loss(Trainer *t) {
  const TpPlan *P = t->plan;
  double *x = xcalloc((size_t)t->nhosted, sizeof *x);
  for (int h = 0; h < t->nhosted; h++) {
    const PipeRank *R = t->hosted[h];
    if (R->stage != train_pipeline(P) - 1 || R->tensor != 0) continue;
    for (int m = 0; m < P->microbatches; m++) x[h] += R->loss[m];
    x[h] /= P->microbatches;
  }
  double loss = pipe_sum_ranks(t, x) / P->dp;
  free(x);
  return loss;
}

/* ABI 1: the stage functions in order (backward: in reverse), one process; the loss. */
static double run_stages(Trainer *t, bool backward) {
  const TpPlan *P = t->plan;
  TpStepIO io = {.param = t->param,
                 .grad = t->grad,
                 .tokens = t->dev_tokens,
                 .targets = t->dev_targets,
                 .loss = NAN,
                 .compute = t->compute,
                 .stream = t->stream};
  for (int pass = 0; pass <= (int)backward; pass++)
    for (int k = 0; k < P->nstages; k++) {
      int s = pass ? P->nstages - 1 - k : k;
      double start = t->trace ? trace_now_us(t->trace) : 0;
      io.arena = t->arena[s];
      io.transient = t->transient[s];
      run_unit(t, t->stream, (pass ? P->backward : P->forward)[s], &io);
      if (t->trace) {
        be(t)->stream_sync(t->compute, t->stream);
        trace_add(t->trace, 0, pass ? TP_PLAN_BACKWARD : TP_PLAN_FORWARD, 0, 0, s, -1, start,
                  trace_now_us(t->trace));
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

/* ---- the gradient norm and the optimizer ---- */

/* Whether hosted rank h (ABI 1: h 0, the process) counts parameter i in the norm: every
 * piece once. */
static bool counts_in_norm(const Trainer *t, int h, int i) {
  if (!t->plan->stages) return t->m[i] != NULL;
  const PipeRank *R = t->hosted[h];
  return t->plan->params[i].trainable && pipe_owner(t, i, R->tensor) == R->rank;
}

/* The norm's pieces of parameter i that hosted rank h sums, [*first, *first + count): all of
 * them where it counts i; under --zero 1, on every replica of the counting rank, those that
 * start in its shard (the shards are cut on pieces, so each lies in one). */
static int norm_pieces(const Trainer *t, int h, int i, int *first) {
  *first = 0;
  if (!train_zero(t->plan)) return counts_in_norm(t, h, i) ? TP_NORM_PIECES : 0;
  const PipeRank *R = t->hosted[h];
  const TpPlanParam *p = &t->plan->params[i];
  if (!p->trainable || p->stage % train_pipeline(t->plan) != R->stage ||
      piece_holder(t->plan, p, R->tensor) != R->tensor)
    return 0;
  int64_t offset = R->grad[i] - R->grad_block, n = t->numel[i];
  while (*first < TP_NORM_PIECES && offset + n * *first / TP_NORM_PIECES < R->shard_lo) ++*first;
  int end = *first;
  while (end < TP_NORM_PIECES && offset + n * end / TP_NORM_PIECES < R->shard_hi) end++;
  return end - *first;
}

/* Each gradient's sum of squares in TP_NORM_PIECES pieces, on the device, added on the
 * host: the pieces in order into the parameter's sum, the parameters' sums in order into
 * the rank's, the ranks' in rank order. Under --zero 1 the replicas of a rank sum the pieces
 * of their shards and exchange them first, so the same doubles are added in the same order
 * as without it. */
double pipe_grad_norm(Trainer *t) {
  const TpPlan *P = t->plan;
  int H = P->stages ? t->nhosted : 1;
  size_t count = (size_t)P->nparams * TP_NORM_PIECES;
  double *x = xcalloc((size_t)H, sizeof *x), **pieces = xcalloc((size_t)H, sizeof *pieces);
  for (int h = 0; h < H; h++) {
    TpStream *s = P->stages ? t->hosted[h]->stream : t->stream;
    float **grad = P->stages ? t->hosted[h]->grad : t->grad;
    double *dev = t->norm_pieces + (size_t)h * count;
    pieces[h] = t->norm_host + (size_t)h * count; /* every element copied below */
    be(t)->memset(t->compute, s, dev, 0, count * sizeof *dev);
    if (be(t)->sum_squares_many) { /* every piece of the rank in one launch */
      TpNormPiece *list = xcalloc(count, sizeof *list);
      int listed = 0;
      for (int i = 0, first; i < P->nparams; i++)
        for (int p = 0, m = norm_pieces(t, h, i, &first); p < m; p++)
          list[listed++] = (TpNormPiece){grad[i], t->numel[i], first + p, (int64_t)i * TP_NORM_PIECES + first + p};
      be(t)->sum_squares_many(t->compute, s, list, listed, dev);
      free(list);
    } else {
      for (int i = 0, first, n; i < P->nparams; i++)
        if ((n = norm_pieces(t, h, i, &first)))
          be(t)->sum_squares_pieces(t->compute, s, grad[i], t->numel[i], first, n,
                                    dev + (size_t)i * TP_NORM_PIECES + first);
    }
    be(t)->copy_d2h(t->compute, s, pieces[h], dev, count * sizeof *dev);
    be(t)->stream_sync(t->compute, s);
  }
  if (train_zero(P)) pipe_sum_replicas(t, pieces, count);
  for (int h = 0; h < H; h++) {
    for (int i = 0; i < P->nparams; i++) {
      if (!counts_in_norm(t, h, i)) continue;
      double sum = 0;
      for (int p = 0; p < TP_NORM_PIECES; p++) sum += pieces[h][(size_t)i * TP_NORM_PIECES + p];
      x[h] += sum;
    }
  }
  double norm = sqrt(P->stages ? pipe_sum_ranks(t, x) : x[0]);
  free(x), free(pieces);
  return norm;
}

/* Does hosted rank h update parameter i in the optimizer step? (In one process each value
 * has one copy, updated by its owner, or under --zero 1 by every replica of the owner's
 * stage, each its shard; under mpirun every rank that holds it.) */
static bool rank_updates(const Trainer *t, int h, int i) {
  if (!t->plan->stages) return t->m[i] != NULL;
  const PipeRank *R = t->hosted[h];
  const TpPlanParam *p = &t->plan->params[i];
  if (!p->trainable) return false;
  if (!one_process(t)) return R->param[i] != NULL;
  return train_zero(t->plan) ? p->stage % train_pipeline(t->plan) == R->stage : pipe_owner(t, i, 0) == R->rank;
}

void pipe_adamw(Trainer *t, int h, TpStream *s, float *const *grad, int64_t step, double lr, float clip) {
  const TrainOptions *o = &t->o;
  bool zero = train_zero(t->plan), many = be(t)->adamw_many != NULL;
  TpAdamWTensor *tensors = many ? xcalloc((size_t)t->plan->nparams, sizeof *tensors) : NULL;
  int ntensors = 0;
  for (int i = 0; i < t->plan->nparams; i++) {
    if (!rank_updates(t, h, i)) continue;
    TpAdamW adamw = {lr, o->beta1, o->beta2, o->eps, t->decay[i], step};
    int64_t a = 0, b = t->numel[i];
    float *m = t->m[i], *v = t->v[i], *value = t->param[i];
    const PipeRank *R = zero ? t->hosted[h] : NULL;
    if (zero) { /* the part of i in the rank's shard, whose moments (and masters) its blocks hold */
      if (!rank_shard_part(t, R, i, &a, &b)) continue;
      int64_t at = R->grad[i] - R->grad_block + a - R->shard_lo;
      m = R->m_block + at, v = R->v_block + at;
      value = R->master_block ? R->master_block + at : value + a;
    }
    if (many) { /* updated below, all at once */
      tensors[ntensors++] = (TpAdamWTensor){value, grad[i] + a, m, v, b - a, t->decay[i]};
      continue;
    }
    if (clip != 1) be(t)->clip(t->compute, s, grad[i] + a, b - a, clip);
    be(t)->adamw(t->compute, s, value, grad[i] + a, m, v, b - a, &adamw);
    if (zero && R->master_block) pipe_round_shard(t, s, R, i); /* before the gather */
  }
  if (!many) return;
  TpAdamW adamw = {lr, o->beta1, o->beta2, o->eps, 0, step};
  be(t)->adamw_many(t->compute, s, tensors, ntensors, &adamw, clip);
  free(tensors);
  if (zero && t->hosted[h]->master_block) /* before the gather */
    for (int i = 0; i < t->plan->nparams; i++)
      if (rank_updates(t, h, i)) pipe_round_shard(t, s, t->hosted[h], i);
}

void pipe_update(Trainer *t, int64_t step, double lr, float clip) {
  const TpPlan *P = t->plan;
  for (int h = 0; h < (P->stages ? t->nhosted : 1); h++) {
    TpStream *s = P->stages ? t->hosted[h]->stream : t->stream;
    float **grad = P->stages ? t->hosted[h]->grad : t->grad;
    double start = t->trace ? trace_now_us(t->trace) : 0;
    pipe_adamw(t, h, s, grad, step, lr, clip);
    /* the gather's collectives are not ordered on s; a trace times the update's work */
    if ((train_zero(P) && !one_process(t)) || t->trace) be(t)->stream_sync(t->compute, s);
    if (train_zero(P) && !one_process(t)) pipe_gather_params(t);
    if (t->trace)
      trace_add(t->trace, P->stages ? t->hosted[h]->rank : 0, TRACE_UPDATE, -1, -1, -1, -1, start,
                trace_now_us(t->trace));
    if (P->stages) { /* the rounding below and whatever t->stream reads next come after it */
      be(t)->event_record(t->compute, t->hosted[h]->event, s);
      be(t)->stream_wait(t->compute, t->stream, t->hosted[h]->event);
    }
  }
  /* bf16, fp16: the working copies from the updated masters, once every shard is in (under
   * train_sharded_masters each shard's were rounded before the gather: nothing here). No
   * host wait: the next step's units wait for t->stream (pipe_tokens_to_device), and
   * whatever reads the values back synchronizes t->stream first. */
  for (int i = 0; i < P->nparams; i++)
    if (P->params[i].trainable) pipe_round_param(t, t->stream, i);
}
