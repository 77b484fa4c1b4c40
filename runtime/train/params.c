/* The parameter store: where each parameter lives (its owner rank), its device value and
 * AdamW state, and its host copies as whole tensors (t->host), which weights.c reads and
 * writes. Loading scatters a whole tensor to this process's piece of it (pipe_upload);
 * saving gathers every piece from its first holder into process 0's copy (pipe_download). */
#include "step.h"

#include <string.h>

/* The rank that owns parameter i (its piece held by tensor rank `tensor`): replica 0's
 * rank of its stage, the first tensor rank holding that piece (ABI 1: the one). */
int pipe_owner(const Trainer *t, int i, int tensor) {
  const TpPlan *P = t->plan;
  return P->stages ? rank_of(P, 0, P->params[i].stage % train_pipeline(P), piece_holder(P, &P->params[i], tensor))
                   : 0;
}

/* A parameter's value (under bf16 and fp16 its f32 master and 16-bit working copy; unless
 * it lies in t->param_block or t->work_block) and, if trainable, AdamW state (under --zero 1
 * the ranks' shards hold it, and under train_sharded_masters its master too: buffers.c). */
int pipe_alloc_param(Trainer *t, int i) {
  size_t bytes = (size_t)t->numel[i] * 4;
  const char *name = t->plan->params[i].name;
  bool trainable = t->plan->params[i].trainable;
  bool whole_state = trainable && !train_zero(t->plan);
  bool whole_master = !(trainable && train_sharded_masters(t->plan));
  if (t->plan->precision != TP_PLAN_FP32 && !t->work[i] &&
      !(t->work[i] = pipe_alloc(t, (size_t)t->numel[i] * 2, "the 16-bit copy of parameter '%s'", name)))
    return TP_ERR_INPUT;
  if ((whole_master && !t->param[i] && !(t->param[i] = pipe_alloc(t, bytes, "parameter '%s'", name))) ||
      (whole_state && (!(t->m[i] = pipe_alloc(t, bytes, "the optimizer state of '%s'", name)) ||
                       !(t->v[i] = pipe_alloc(t, bytes, "the optimizer state of '%s'", name)))))
    return TP_ERR_INPUT;
  return TP_OK;
}

/* ---- --zero 1's shards (step.h) ---- */

/* A rank's gradient block holds its parameters by chunk (its virtual stages' apart, so
 * that each is zeroed and summed as one range), each chunk's in parameter order. */
int64_t pipe_block_offset(const Trainer *t, int stage, int i) {
  const TpPlan *P = t->plan;
  int chunk = i < P->nparams ? param_chunk(P, &P->params[i], stage) : train_chunks(P);
  int64_t at = 0;
  for (int j = 0; j < P->nparams; j++) {
    if (!stage_holds(P, &P->params[j], stage)) continue;
    int c = param_chunk(P, &P->params[j], stage);
    if (c < chunk || (c == chunk && j < i)) at += t->numel[j];
  }
  return at;
}

void pipe_shard_bounds(const Trainer *t, int stage, int64_t *bounds) {
  const TpPlan *P = t->plan;
  int D = P->dp, d = 1;
  int64_t count = pipe_block_offset(t, stage, P->nparams), at = 0;
  for (int c = 0; c < train_chunks(P); c++) /* in the block's order */
    for (int i = 0; i < P->nparams; i++) {
      if (!stage_holds(P, &P->params[i], stage) || param_chunk(P, &P->params[i], stage) != c) continue;
      int64_t n = t->numel[i];
      for (int p = 0; p < TP_NORM_PIECES; p++) {
        int64_t start = at + n * p / TP_NORM_PIECES;
        while (d < D && start >= count * d / D) bounds[d++] = start;
      }
      at += n;
    }
  bounds[0] = 0;
  while (d <= D) bounds[d++] = count;
}

/* ---- host copies ---- */

TpTensor pipe_whole_tensor(const TpPlan *P, const TpPlanParam *p, void *data) {
  TpTensor v = {.dtype = TP_F32, .rank = p->rank, .data = data};
  memcpy(v.dims, p->dims, sizeof v.dims);
  if (train_split(P, p)) v.dims[p->shard.axis] = v.dims[p->shard.axis] * p->shard.parts - train_pad(P, p);
  return v;
}

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
  if (grads) return p->trainable && !(H->grad[i] = pipe_alloc_bytes(t, false, bytes, what)) ? TP_ERR_INPUT : TP_OK;
  if (!(H->param[i] = pipe_alloc_bytes(t, false, bytes, what))) return TP_ERR_INPUT;
  if (moments && p->trainable &&
      (!(H->m[i] = pipe_alloc_bytes(t, false, bytes, what)) || !(H->v[i] = pipe_alloc_bytes(t, false, bytes, what))))
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

int64_t pipe_shard_copy(const TpPlan *P, const TpPlanParam *p, int tensor, float *piece, float *whole, bool gather) {
  if (!train_split(P, p)) {
    if (gather) memcpy(whole, piece, (size_t)tp_numel(p->rank, p->dims) * 4);
    else memcpy(piece, whole, (size_t)tp_numel(p->rank, p->dims) * 4);
    return -1;
  }
  const TpPlanShard *sh = &p->shard;
  int N = train_tensor(P), chunks = sh->chunks > 1 ? sh->chunks : 1, at = tensor * sh->parts / N;
  int64_t outer = tp_numel(sh->axis, p->dims), inner = tp_numel(p->rank - sh->axis - 1, p->dims + sh->axis + 1);
  int64_t len = p->dims[sh->axis] / chunks * inner;          /* one piece of one chunk */
  int64_t chunk = len * sh->parts - train_pad(P, p) * inner; /* one chunk of the whole (a padded one: one chunk) */
  /* the piece's part of the whole: all of it but a padded vocabulary's padding (zeros) */
  int64_t held = at * len + len <= chunk ? len : chunk - at * len;
  int64_t moved = -1;
  for (int64_t o = 0; o < outer; o++)
    for (int c = 0; c < chunks; c++) {
      float *mine = piece + (o * chunks + c) * len, *there = whole + (o * chunks + c) * chunk + at * len;
      memcpy(gather ? there : mine, gather ? mine : there, (size_t)held * 4);
      if (!gather && held < len) memset(mine + held, 0, (size_t)(len - held) * 4);
      for (int64_t k = held; gather && k < len && moved < 0; k++)
        if (mine[k] != 0) moved = (o * chunks + c) * len + k;
    }
  return moved;
}

/* A host buffer for one tensor rank's piece of parameter i. The whole tensor's host copy is
 * held meanwhile, so this can still fail: the job ends with one line (the ranks of the
 * tensor group wait on this one). */
static float *piece_buffer(Trainer *t, int i) {
  float *piece = pipe_alloc_bytes(t, false, (size_t)t->numel[i] * 4, "a parameter's piece");
  if (!piece)
    tp_comm_abort(t->comm, 1, "cannot hold a piece of parameter '%s' beside the whole tensor",
                  t->plan->params[i].name);
  return piece;
}

/* A host copy of parameter i (the whole tensor) into device buffer dev: this rank's piece
 * where it is split. */
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

/* What a rank keeps of a trained parameter in its --zero 1 shard: the AdamW moments (M, V)
 * and under train_sharded_masters the fp32 master (MASTER); or the whole buffer (WHOLE) or
 * the gradient (GRAD), which are not sharded this way. */
enum { WHOLE, GRAD, M, V, MASTER };
static float *shard_block(const PipeRank *R, int kind) {
  return kind == M ? R->m_block : kind == V ? R->v_block : R->master_block;
}

/* --zero 1: the parts of host copy `whole` of parameter i (M, V or MASTER, a whole tensor)
 * that the shards of the hosted ranks holding i keep. */
static void upload_shards(Trainer *t, int i, const float *whole, int kind) {
  const TpPlan *P = t->plan;
  float *piece = train_split(P, &P->params[i]) ? piece_buffer(t, i) : NULL;
  for (int h = 0; h < t->nhosted; h++) {
    PipeRank *R = t->hosted[h];
    int64_t a, b;
    if (!stage_holds(P, &P->params[i], R->stage) || !rank_shard_part(t, R, i, &a, &b)) continue;
    int64_t at = R->grad[i] - R->grad_block + a - R->shard_lo;
    const float *src = whole;
    if (piece) pipe_shard_copy(P, &P->params[i], R->tensor, piece, (float *)src, false), src = piece;
    be(t)->copy_h2d(t->compute, t->stream, shard_block(R, kind) + at, src + a, (size_t)(b - a) * 4);
    be(t)->stream_sync(t->compute, t->stream); /* before the piece is refilled */
    if (kind == MASTER) pipe_round_shard(t, t->stream, R, i);
  }
  free(piece);
}

void pipe_round_param(Trainer *t, TpStream *s, int i) {
  if (t->work[i] && t->param[i])
    be(t)->round_to_half(t->compute, s, t->work[i], t->param[i], t->numel[i], t->plan->precision);
}

void pipe_round_shard(Trainer *t, TpStream *s, const PipeRank *R, int i) {
  int64_t a, b;
  if (!rank_shard_part(t, R, i, &a, &b)) return;
  int64_t at = R->grad[i] - R->grad_block + a - R->shard_lo;
  be(t)->round_to_half(t->compute, s, (char *)t->work[i] + a * 2, R->master_block + at, b - a, t->plan->precision);
}

void pipe_upload(Trainer *t) {
  TrainHost *H = &t->host;
  bool sharded_masters = train_sharded_masters(t->plan);
  for (int i = 0; i < t->plan->nparams; i++) {
    if (!t->held[i]) continue;
    if (H->param[i] && sharded_masters && t->plan->params[i].trainable) upload_shards(t, i, H->param[i], MASTER);
    else if (H->param[i]) upload(t, i, t->param[i], H->param[i]), pipe_round_param(t, t->stream, i);
    if (H->m[i] && train_zero(t->plan)) upload_shards(t, i, H->m[i], M), upload_shards(t, i, H->v[i], V);
    else if (H->m[i]) upload(t, i, t->m[i], H->m[i]), upload(t, i, t->v[i], H->v[i]);
  }
  be(t)->stream_sync(t->compute, t->stream); /* before the host copies are freed */
}

void pipe_gather_loaded(Trainer *t) {
  if (train_sharded_masters(t->plan) && !one_process(t)) pipe_gather_params(t);
}

void pipe_host_free(Trainer *t) {
  TrainHost *H = &t->host;
  for (int i = 0; H->param && i < t->plan->nparams; i++)
    free(H->param[i]), free(H->grad[i]), free(H->m[i]), free(H->v[i]);
  free(H->param), free(H->grad), free(H->m), free(H->v);
  *H = (TrainHost){0};
}

/* `bytes` at dev on rank `from` (dev: valid on the process hosting it) into `host` on
 * process 0. */
static void fetch_bytes(Trainer *t, int from, void *dev, float *host, size_t bytes) {
  if (one_process(t) || from == 0) {
    if (!train_is_root(t)) return;
    be(t)->copy_d2h(t->compute, t->stream, host, dev, bytes);
    be(t)->stream_sync(t->compute, t->stream);
  } else if (t->comm->rank == from) {
    void *view = pipe_host_view(t, t->stream, dev, bytes, true, false);
    tp_comm_send(t->comm, view, bytes, 0, GATHER_TAG, "rank 0 to gather a tensor");
    pipe_end_host_view(t, t->stream, dev, view, bytes, false);
  } else if (train_is_root(t)) {
    tp_comm_recv(t->comm, host, bytes, from, GATHER_TAG, "a tensor to gather");
  }
}

/* What a rank holds of parameter i (tensor rank `tensor`'s piece where it is split) into
 * `host` on process 0: device buffer dev from its owner; or, for a buffer --zero 1 shards
 * (`sharded`: GRAD, M, V or MASTER), each replica's part from its shard. */
static void fetch_piece(Trainer *t, int i, int tensor, void *dev, int sharded, float *host) {
  const TpPlan *P = t->plan;
  if (!sharded || !train_zero(P)) {
    fetch_bytes(t, pipe_owner(t, i, tensor), dev, host, (size_t)t->numel[i] * 4);
    return;
  }
  int stage = P->params[i].stage % train_pipeline(P), D = P->dp;
  int64_t *bounds = xcalloc((size_t)D + 1, sizeof *bounds), offset = pipe_block_offset(t, stage, i), a, b;
  pipe_shard_bounds(t, stage, bounds);
  for (int d = 0; d < D; d++) {
    if (!shard_part(offset, t->numel[i], bounds[d], bounds[d + 1], &a, &b)) continue;
    int from = rank_of(P, d, stage, piece_holder(P, &P->params[i], tensor));
    PipeRank *R = pipe_hosted_rank(t, from);
    float *src = NULL;
    if (R && sharded == GRAD) src = R->grad[i] + a;
    else if (R) src = shard_block(R, sharded) + (offset + a - bounds[d]);
    fetch_bytes(t, from, src, host ? host + a : NULL, (size_t)(b - a) * 4);
  }
  free(bounds);
}

/* The whole tensor of parameter i's device buffer dev (or its shards; `what` of it, for
 * errors) into process 0's host copy: each piece from the first tensor rank holding it. A
 * padded vocabulary's padding must still be zeros: the loss masks it out, so no gradient,
 * moment or update (decay included) can reach it. */
static void fetch(Trainer *t, int i, void *dev, int sharded, float *host, const char *what) {
  const TpPlan *P = t->plan;
  const TpPlanParam *p = &P->params[i];
  if (!train_split(P, p)) {
    fetch_piece(t, i, 0, dev, sharded, host);
    return;
  }
  int N = train_tensor(P);
  float *piece = train_is_root(t) ? piece_buffer(t, i) : NULL;
  for (int tensor = 0; tensor < N; tensor += N / p->shard.parts) {
    fetch_piece(t, i, tensor, dev, sharded, piece);
    int64_t moved = piece ? pipe_shard_copy(P, p, tensor, piece, host, true) : -1;
    if (moved >= 0)
      tp_comm_abort(t->comm, TP_ERR_INTERNAL,
                    "the %s of parameter '%s' is %g at element %lld of tensor rank %d's piece, in the padding of "
                    "its padded vocabulary, which must stay 0 (a compiler bug)",
                    what, p->name, (double)piece[moved], (long long)moved, tensor);
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
      if (P->params[i].trainable) fetch(t, i, t->grad[i], GRAD, t->host.grad[i], "gradient");
      continue;
    }
    bool sharded = P->params[i].trainable && train_sharded_masters(P);
    fetch(t, i, t->param[i], sharded ? MASTER : WHOLE, t->host.param[i], "value");
    if (moments && P->params[i].trainable)
      fetch(t, i, t->m[i], M, t->host.m[i], "AdamW first moment"),
          fetch(t, i, t->v[i], V, t->host.v[i], "AdamW second moment");
  }
  return TP_OK;
}
