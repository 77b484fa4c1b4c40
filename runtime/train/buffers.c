/* The trainer's buffers: device and host memory with an error naming what it is for, the
 * buffers of every plan (ABI 1: the stages' arenas and transient regions and the
 * parameters; ABI 2: the hosted ranks, each with its gradients, arenas, transient region
 * and message buffers), freed again at the end;
 * and what the transport reads and writes for a device buffer. */
#include "step.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- device memory ---- */

/* `bytes` of device memory (device) or host memory, zeroed; NULL after an error naming
 * what they are for. */
void *pipe_alloc_bytes(Trainer *t, bool device, size_t bytes, const char *what) {
  /* Beyond the machine's memory it is refused without trying: with overcommit the allocation
   * could succeed and zeroing it end in the OOM killer. */
  int64_t machine = tp_physical_memory();
  bool fits = bytes <= SIZE_MAX - 64 && (!machine || (uint64_t)bytes <= (uint64_t)machine);
  void *p = NULL;
  if (fits && device) p = be(t)->alloc(t->compute, bytes);
  else if (fits && (p = aligned_alloc(64, bytes ? (bytes + 63) / 64 * 64 : 64))) memset(p, 0, bytes);
  if (p) return p;
  tp_error(t->d,
           "cannot allocate %zu bytes (%.1f GiB) for %s: %s (compile the plan for a smaller --batch or "
           "--seq, or more --stages)",
           bytes, (double)bytes / (1 << 30), what, fits ? "out of memory" : "more than this machine's memory");
  return NULL;
}

void *pipe_alloc(Trainer *t, size_t bytes, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return pipe_alloc_bytes(t, true, bytes, what);
}

void pipe_dev_free(Trainer *t, void *p) { be(t)->free(t->compute, p); }

/* ---- staging memory: what a step copies between host and device ---- */

void *pipe_alloc_staging(Trainer *t, size_t bytes, const char *what) {
  if (!be(t)->host_alloc) return pipe_alloc_bytes(t, false, bytes, what);
  void *p = be(t)->host_alloc(t->compute, bytes);
  if (!p)
    tp_error(t->d, "cannot allocate %zu bytes (%.1f GiB) of page-locked host memory for %s: out of memory", bytes,
             (double)bytes / (1 << 30), what);
  return p;
}

void pipe_free_staging(Trainer *t, void *p) {
  if (be(t)->host_free) be(t)->host_free(t->compute, p);
  else free(p);
}

/* ---- every buffer of a plan ---- */

PipeRank *pipe_hosted_rank(Trainer *t, int rank) {
  for (int h = 0; h < t->nhosted; h++)
    if (t->hosted[h]->rank == rank) return t->hosted[h];
  return NULL;
}

/* Rank `rank`'s buffers into *out (set first, so that pipe_free frees what was allocated
 * before a failure). */
static int new_rank(Trainer *t, int rank, PipeRank **out) {
  const TpPlan *P = t->plan;
  PipeRank *R = *out = xcalloc(1, sizeof *R);
  int N = train_tensor(P);
  R->rank = rank;
  R->stage = stage_of(P, rank);
  R->replica = rank / (N * train_pipeline(P));
  R->tensor = rank % N;
  R->trainer = t;
  R->tensor_group = xcalloc((size_t)N, sizeof *R->tensor_group);
  for (int j = 0; j < N; j++) R->tensor_group[j] = rank_of(P, R->replica, R->stage, j);
  R->st = &P->stages[R->stage];
  R->nchunks = train_chunks(P);
  R->chunk = xcalloc((size_t)R->nchunks, sizeof *R->chunk);
  size_t transient = 0;
  for (int c = 0; c < R->nchunks; c++) {
    RankChunk *C = &R->chunk[c];
    C->stage = c * train_pipeline(P) + R->stage;
    C->st = &P->stages[C->stage];
    C->arena = xcalloc((size_t)C->st->arenas, sizeof *C->arena);
    if (C->st->transient_bytes > transient) transient = C->st->transient_bytes;
  }
  R->stream = be(t)->stream_new(t->compute);
  R->event = be(t)->event_new(t->compute);
  R->param = xcalloc((size_t)P->nparams, sizeof *R->param);
  R->grad = xcalloc((size_t)P->nparams, sizeof *R->grad);
  R->scratch = xcalloc((size_t)P->nparams, sizeof *R->scratch);
  R->grad_count = pipe_block_offset(t, R->stage, P->nparams);
  R->loss = xcalloc((size_t)P->microbatches, sizeof *R->loss);
  if (!(R->loss_io = pipe_alloc_staging(t, (size_t)P->microbatches * sizeof *R->loss_io, "the losses")))
    return TP_ERR_INPUT;
  /* the step's f32 sum, and a microbatch's gradients as the units write them (16-bit under
   * bf16 and fp16, where the sum is always apart) */
  size_t grad_bytes = (size_t)R->grad_count * 4, elem = train_elem_bytes(P);
  bool apart = P->microbatches > 1 || elem != 4;
  if (!(R->grad_block = pipe_alloc(t, grad_bytes, "the gradients of rank %d", rank)) ||
      !(R->scratch_block = apart
                               ? pipe_alloc(t, (size_t)R->grad_count * elem, "rank %d's microbatch gradients", rank)
                               : R->grad_block))
    return TP_ERR_INPUT;
  for (int c = 0; c < R->nchunks; c++) R->chunk[c].grad_lo = R->grad_count, R->chunk[c].grad_hi = 0;
  for (int i = 0; i < P->nparams; i++)
    if (stage_holds(P, &P->params[i], R->stage)) {
      int64_t at = pipe_block_offset(t, R->stage, i);
      RankChunk *C = &R->chunk[param_chunk(P, &P->params[i], R->stage)];
      R->param[i] = t->work[i] ? t->work[i] : t->param[i];
      R->grad[i] = R->grad_block + at;
      R->scratch[i] = (float *)((char *)R->scratch_block + at * (int64_t)elem);
      if (at < C->grad_lo) C->grad_lo = at;
      if (at + t->numel[i] > C->grad_hi) C->grad_hi = at + t->numel[i];
    }
  for (int c = 0; c < R->nchunks; c++) /* a chunk without parameters: an empty range */
    if (R->chunk[c].grad_lo > R->chunk[c].grad_hi) R->chunk[c].grad_lo = R->chunk[c].grad_hi = 0;
  if (train_zero(P)) {
    int64_t *bounds = xcalloc((size_t)P->dp + 1, sizeof *bounds);
    pipe_shard_bounds(t, R->stage, bounds);
    R->shard_lo = bounds[R->replica], R->shard_hi = bounds[R->replica + 1];
    R->shard_counts = xcalloc((size_t)P->dp, sizeof *R->shard_counts);
    for (int d = 0; d < P->dp; d++) R->shard_counts[d] = (size_t)(bounds[d + 1] - bounds[d]);
    free(bounds);
    size_t bytes = (size_t)(R->shard_hi - R->shard_lo) * 4;
    if (!(R->m_block = pipe_alloc(t, bytes, "rank %d's shard of the optimizer state", rank)) ||
        !(R->v_block = pipe_alloc(t, bytes, "rank %d's shard of the optimizer state", rank)) ||
        (train_sharded_masters(P) &&
         !(R->master_block = pipe_alloc(t, bytes, "rank %d's shard of the fp32 master weights", rank))))
      return TP_ERR_INPUT;
  }
  for (int c = 0; c < R->nchunks; c++) {
    const RankChunk *C = &R->chunk[c];
    char stage[48] = ""; /* an interleaved plan's: which virtual stage */
    if (R->nchunks > 1) snprintf(stage, sizeof stage, ", virtual stage %d", C->stage);
    for (int a = 0; a < C->st->arenas; a++)
      if (!(C->arena[a] = pipe_alloc(t, C->st->arena_bytes, "the activations of rank %d%s (arena %d of %d)", rank,
                                     stage, a + 1, C->st->arenas)))
        return TP_ERR_INPUT;
  }
  if (!(R->transient = pipe_alloc(t, transient, "the activations of rank %d (its transient region)", rank)))
    return TP_ERR_INPUT;
  for (int c = 0; c < R->nchunks; c++)
    for (int kind = TP_PLAN_SEND_ACT; kind <= TP_PLAN_RECV_GRAD; kind++)
      if (pipe_alloc_messages(t, R, c, kind)) return TP_ERR_INPUT;
  return TP_OK;
}

/* ABI 1: every parameter and stage in this process. */
static int setup_stages(Trainer *t) {
  const TpPlan *P = t->plan;
  t->arena = xcalloc((size_t)P->nstages, sizeof *t->arena);
  t->transient = xcalloc((size_t)P->nstages, sizeof *t->transient);
  for (int i = 0; i < P->nparams; i++) {
    t->held[i] = true;
    if (pipe_alloc_param(t, i) ||
        !(t->grad[i] = pipe_alloc(t, (size_t)t->numel[i] * 4, "the gradient of '%s'", P->params[i].name)))
      return TP_ERR_INPUT;
  }
  for (int s = 0; s < P->nstages; s++)
    if (!(t->arena[s] = pipe_alloc(t, P->arena_bytes[s], "the activations of stage %d (its arena)", s)) ||
        !(t->transient[s] = pipe_alloc(t, P->transient_bytes ? P->transient_bytes[s] : 0,
                                       "the activations of stage %d (its transient region)", s)))
      return TP_ERR_INPUT;
  return TP_OK;
}

static int setup_ranks(Trainer *t) {
  const TpPlan *P = t->plan;
  int S = train_pipeline(P), N = train_tensor(P), D = P->dp, nprocs = t->comm->size;
  t->nranks = S * N * D;
  /* one process hosts every rank, except a tensor-parallel plan's (see step.h) */
  if (nprocs != t->nranks && (nprocs != 1 || N > 1)) {
    char tensor[96] = "";
    int V = train_chunks(P);
    if (V > 1) snprintf(tensor, sizeof tensor, " (of %d interleaved virtual stages each)", V);
    if (N > 1) snprintf(tensor + strlen(tensor), sizeof tensor - strlen(tensor), " x %d tensor ranks", N);
    if (train_is_root(t))
      fprintf(stderr,
              "%s: error: the plan has %d stage%s%s x %d replica%s = %d ranks; %s %d%s (run it as mpirun -np "
              "%d%s)\n",
              t->d->tool, S, S == 1 ? "" : "s", tensor, D, D == 1 ? "" : "s", t->nranks,
              tp_comm_launched_by_mpi() ? "mpirun started" : "it was started as", nprocs,
              tp_comm_launched_by_mpi() ? "" : " process", t->nranks,
              N > 1 ? ": a tensor-parallel plan runs one process per rank" : ", or as one process without mpirun");
    return TP_ERR_USAGE;
  }
  t->nhosted = nprocs == 1 ? t->nranks : 1;
  int first = nprocs == 1 ? 0 : t->comm->rank;
  if (train_zero(P) && nprocs > 1) { /* the values in one block, for the all-gather (step.h) */
    int stage = stage_of(P, first);
    int64_t count = pipe_block_offset(t, stage, P->nparams);
    bool half = train_sharded_masters(P); /* the 16-bit working copies are what is gathered */
    void *block = pipe_alloc(t, (size_t)count * train_elem_bytes(P), "the parameters of rank %d", first);
    if (!block) return TP_ERR_INPUT;
    if (half) t->work_block = block;
    else t->param_block = block;
    for (int i = 0; i < P->nparams; i++) {
      if (!stage_holds(P, &P->params[i], stage)) continue;
      int64_t at = pipe_block_offset(t, stage, i);
      if (half) t->work[i] = (char *)block + at * 2;
      else t->param[i] = t->param_block + at;
    }
  }
  for (int i = 0; i < P->nparams; i++) {
    t->held[i] = false;
    for (int h = 0; h < t->nhosted; h++) t->held[i] |= stage_holds(P, &P->params[i], stage_of(P, first + h));
    if (t->held[i] && pipe_alloc_param(t, i)) return TP_ERR_INPUT;
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
  t->work = xcalloc(np, sizeof *t->work);
  t->held = xcalloc(np, sizeof *t->held);
  t->numel = xcalloc(np, sizeof *t->numel);
  t->whole_numel = xcalloc(np, sizeof *t->whole_numel);
  for (int i = 0; i < P->nparams; i++) {
    const TpPlanParam *p = &P->params[i];
    t->numel[i] = tp_numel(p->rank, p->dims);
    t->whole_numel[i] = tp_numel(p->rank, pipe_whole_tensor(P, p, NULL).dims);
  }
  t->stream = be(t)->stream_new(t->compute);
  t->nranks = 1;
  t->loss_scale = P->precision == TP_PLAN_FP16 ? LOSS_SCALE_INITIAL : 1;
  t->scale_growth = LOSS_SCALE_GROWTH;
  /* test hook "S,N": fp16's initial loss scale S and growth interval N, to reach an
   * overflow and a growth in a few steps */
  const char *hook = getenv("TOKPIPE_TEST_LOSS_SCALE");
  if (hook && P->precision == TP_PLAN_FP16 && sscanf(hook, "%f,%" SCNd64, &t->loss_scale, &t->scale_growth) != 2)
    t->loss_scale = LOSS_SCALE_INITIAL, t->scale_growth = LOSS_SCALE_GROWTH;
  t->tokens_ready = be(t)->event_new(t->compute);
  if (!(t->tokens = pipe_alloc_staging(t, ntok * sizeof *t->tokens, "a step's token ids")) ||
      !(t->targets = pipe_alloc_staging(t, ntok * sizeof *t->targets, "a step's targets")) ||
      !(t->loss_scale_host = pipe_alloc_staging(t, sizeof *t->loss_scale_host, "the loss scale")) ||
      !(t->dev_tokens = pipe_alloc(t, ntok * sizeof *t->tokens, "a step's token ids")) ||
      !(t->dev_targets = pipe_alloc(t, ntok * sizeof *t->targets, "a step's targets")) ||
      !(t->dev_loss_scale = pipe_alloc(t, sizeof *t->dev_loss_scale, "the loss scale")))
    return TP_ERR_INPUT;
  int rc = P->stages ? setup_ranks(t) : setup_stages(t);
  size_t pieces = (size_t)(P->stages ? t->nhosted : 1) * (size_t)P->nparams * TP_NORM_PIECES;
  if (!rc && (!(t->norm_pieces = pipe_alloc(t, pieces * sizeof(double), "the gradient norm's pieces")) ||
              !(t->norm_host = pipe_alloc_staging(t, pieces * sizeof(double), "the gradient norm's pieces"))))
    rc = TP_ERR_INPUT;
  return rc;
}

void pipe_free(Trainer *t) {
  if (!t->compute) return;
  pipe_host_free(t);
  for (int h = 0; t->hosted && h < t->nhosted; h++) {
    PipeRank *R = t->hosted[h];
    if (!R) continue; /* setup failed before it */
    for (int c = 0; R->chunk && c < R->nchunks; c++) {
      for (int a = 0; R->chunk[c].arena && a < R->chunk[c].st->arenas; a++) pipe_dev_free(t, R->chunk[c].arena[a]);
      free(R->chunk[c].arena);
    }
    pipe_dev_free(t, R->transient);
    if (R->scratch_block != R->grad_block) pipe_dev_free(t, R->scratch_block);
    pipe_dev_free(t, R->grad_block);
    pipe_dev_free(t, R->m_block), pipe_dev_free(t, R->v_block), pipe_dev_free(t, R->master_block);
    free(R->shard_counts);
    pipe_free_messages(t, R);
    be(t)->event_free(t->compute, R->event);
    be(t)->stream_free(t->compute, R->stream);
    free(R->chunk), free(R->param), free(R->grad), free(R->scratch), free(R->loss);
    pipe_free_staging(t, R->loss_io);
    free(R->tensor_group);
    free(R);
  }
  free(t->hosted);
  t->hosted = NULL;
  pipe_dev_free(t, t->param_block), pipe_dev_free(t, t->work_block);
  for (int i = 0; t->param && i < t->plan->nparams; i++) {
    if (!t->param_block) pipe_dev_free(t, t->param[i]);
    if (!t->plan->stages) pipe_dev_free(t, t->grad[i]); /* else a hosted rank's */
    pipe_dev_free(t, t->m[i]);
    pipe_dev_free(t, t->v[i]);
    if (!t->work_block) pipe_dev_free(t, t->work[i]);
  }
  for (int s = 0; t->arena && s < t->plan->nstages; s++)
    pipe_dev_free(t, t->arena[s]), pipe_dev_free(t, t->transient[s]);
  pipe_dev_free(t, t->dev_tokens), pipe_dev_free(t, t->dev_targets), pipe_dev_free(t, t->dev_loss_scale),
      pipe_dev_free(t, t->norm_pieces);
  pipe_free_staging(t, t->tokens), pipe_free_staging(t, t->targets), pipe_free_staging(t, t->loss_scale_host);
  pipe_free_staging(t, t->norm_host);
  be(t)->event_free(t->compute, t->tokens_ready);
  free(t->param), free(t->grad), free(t->m), free(t->v), free(t->work), free(t->held), free(t->numel),
      free(t->arena), free(t->transient);
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
void *pipe_host_view(Trainer *t, TpStream *s, void *dev, size_t bytes, bool fill, bool direct) {
  if (be(t)->host_addressable || (direct && t->comm->be->device_memory)) return dev;
  void *view = malloc(bytes ? bytes : 1);
  TP_ASSERT(view);
  if (fill) {
    be(t)->copy_d2h(t->compute, s, view, dev, bytes);
    be(t)->stream_sync(t->compute, s);
  }
  return view;
}

/* The end of pipe_host_view: its contents back into dev when `back`. */
void pipe_end_host_view(Trainer *t, TpStream *s, void *dev, void *view, size_t bytes, bool back) {
  if (view == dev) return;
  if (back) {
    be(t)->copy_h2d(t->compute, s, dev, view, bytes);
    be(t)->stream_sync(t->compute, s);
  }
  free(view);
}
