/* Layout ops: they move elements without computing on them (Reshape, Expand,
 * Transpose, Split, Slice, Concat, Tile) or mask them (Trilu); SliceBackward scatters back.
 *
 * Each op's rule set, tp_rules_<Op> (ops/rules.h), is at the end of the file; the hooks
 * it names are above it. */
#include "axes.h"
#include "bind.h"
#include "grad.h"
#include "infer.h"
#include "split.h"

#include <string.h>

/* ---- shape rules ---- */

static int infer_reshape(const TpInferCtx *c) {
  const TpType *x = operand(c, 0), *r = preset(c, 0);
  if (!r) return TP_ERR_INPUT;
  if (same_dtype(c, x, r)) return TP_ERR_INPUT;
  if (tp_type_numel(x) != tp_type_numel(r)) {
    char sx[256], sr[256];
    return tp_error_op(c->d, c->m, c->op, "cannot reshape %s to %s", type_str(x, sx), type_str(r, sr));
  }
  /* a row-major reshape keeps the leading dims it leaves unchanged, and their names */
  TpType *named = result(c, 0);
  for (int i = 0; i < x->rank && i < r->rank && x->dims[i] == r->dims[i]; i++)
    if (!named->dimnames[i]) named->dimnames[i] = x->dimnames[i];
  return TP_OK;
}

static int infer_expand(const TpInferCtx *c) {
  const TpType *x = operand(c, 0), *r = preset(c, 0);
  if (!r) return TP_ERR_INPUT;
  TpType t;
  if (same_dtype(c, x, r) || broadcast(c, x, r, &t)) return TP_ERR_INPUT;
  if (!tp_type_equal(&t, r)) {
    char sx[256], sr[256];
    return tp_error_op(c->d, c->m, c->op, "cannot expand %s to %s", type_str(x, sx), type_str(r, sr));
  }
  return set_result(c, 0, t); /* fills in the names broadcasting carried over */
}

static int infer_tile(const TpInferCtx *c) {
  const TpType *x = operand(c, 0);
  int n;
  const int64_t *repeats = tp_attr_ints(c->m, c->op, "repeats", &n);
  if (n != x->rank) return tp_error_op(c->d, c->m, c->op, "repeats has %d entries for rank %d", n, x->rank);
  TpType t = {.dtype = x->dtype, .rank = x->rank};
  for (int i = 0; i < n; i++) {
    if (repeats[i] < 0)
      return tp_error_op(c->d, c->m, c->op, "repeats has negative value %lld", (long long)repeats[i]);
    if (x->dims[i] && repeats[i] > INT64_MAX / 16 / x->dims[i])
      return tp_error_op(c->d, c->m, c->op, "the tiled tensor is too large");
    t.dims[i] = x->dims[i] * repeats[i];
    if (repeats[i] == 1) t.dimnames[i] = x->dimnames[i];
  }
  return set_result(c, 0, t); /* checks the total size */
}

static int infer_transpose(const TpInferCtx *c) {
  const TpType *x = operand(c, 0);
  int n;
  const int64_t *perm = tp_attr_ints(c->m, c->op, "perm", &n);
  if (n != x->rank) return tp_error_op(c->d, c->m, c->op, "perm has %d entries for rank %d", n, x->rank);
  TpType t = {.dtype = x->dtype, .rank = x->rank};
  bool seen[TP_MAX_RANK] = {0};
  for (int i = 0; i < n; i++) {
    if (perm[i] < 0 || perm[i] >= n || seen[perm[i]])
      return tp_error_op(c->d, c->m, c->op, "perm is not a permutation of 0..%d", n - 1);
    seen[perm[i]] = true;
    t.dims[i] = x->dims[perm[i]];
    t.dimnames[i] = x->dimnames[perm[i]];
  }
  return set_result(c, 0, t);
}

/* dims of `r` equal to x's except on `axis`; names carried over from x */
static int same_but_axis(const TpInferCtx *c, const TpType *x, TpType *r, int64_t axis) {
  if (r->rank != x->rank || r->dtype != x->dtype) {
    char sx[256], sr[256];
    return tp_error_op(c->d, c->m, c->op, "%s does not match %s outside axis %lld", type_str(r, sr), type_str(x, sx),
                       (long long)axis);
  }
  for (int i = 0; i < x->rank; i++) {
    if (i != axis && r->dims[i] != x->dims[i]) {
      char sx[256], sr[256];
      return tp_error_op(c->d, c->m, c->op, "%s does not match %s outside axis %lld", type_str(r, sr),
                         type_str(x, sx), (long long)axis);
    }
    if (i != axis && !r->dimnames[i]) r->dimnames[i] = x->dimnames[i];
  }
  return TP_OK;
}

static int infer_split(const TpInferCtx *c) {
  const TpType *x = operand(c, 0);
  int64_t axis = tp_attr_int(c->m, c->op, "axis", 0), total = 0;
  if (check_axis(c, axis, x->rank, "axis")) return TP_ERR_INPUT;
  const TpOp *op = &c->m->ops[c->op];
  for (int i = 0; i < op->noutputs; i++) {
    TpType *r = result(c, i);
    if (!r) return tp_error_op(c->d, c->m, c->op, "every result of Split must be present");
    if (!preset(c, i) || same_but_axis(c, x, r, axis)) return TP_ERR_INPUT;
    total += r->dims[axis];
  }
  if (total != x->dims[axis])
    return tp_error_op(c->d, c->m, c->op, "split sizes sum to %lld, not %lld", (long long)total,
                       (long long)x->dims[axis]);
  return TP_OK;
}

static int infer_slice(const TpInferCtx *c) {
  const TpType *x = operand(c, 0);
  TpType *r = result(c, 0);
  if (!preset(c, 0)) return TP_ERR_INPUT;
  int ns, nt;
  const int64_t *starts = tp_attr_ints(c->m, c->op, "starts", &ns), *steps = tp_attr_ints(c->m, c->op, "steps", &nt);
  if (ns != x->rank || nt != x->rank || r->rank != x->rank || r->dtype != x->dtype)
    return tp_error_op(c->d, c->m, c->op, "starts, steps and result must have the operand's rank %d", x->rank);
  for (int i = 0; i < x->rank; i++) {
    int64_t n = r->dims[i];
    if (steps[i] == 0 || !tp_slice_fits(starts[i], steps[i], n, x->dims[i]))
      return tp_error_op(c->d, c->m, c->op,
                         "slice of dim %d (start %lld, step %lld, %lld elements) leaves [0, %lld)", i,
                         (long long)starts[i], (long long)steps[i], (long long)n, (long long)x->dims[i]);
    if (n == x->dims[i] && steps[i] == 1 && !r->dimnames[i]) r->dimnames[i] = x->dimnames[i];
  }
  return TP_OK;
}

static int infer_concat(const TpInferCtx *c) {
  const TpOp *op = &c->m->ops[c->op];
  const TpType *first = operand(c, 0);
  int64_t axis = tp_attr_int(c->m, c->op, "axis", 0);
  if (check_axis(c, axis, first->rank, "axis")) return TP_ERR_INPUT;
  TpType t = *first;
  t.dims[axis] = 0;
  t.dimnames[axis] = NULL;
  for (int i = 0; i < op->ninputs; i++) {
    const TpType *x = operand(c, i);
    if (!x) return tp_error_op(c->d, c->m, c->op, "operand %d is absent", i);
    TpType probe = *x;
    if (same_but_axis(c, first, &probe, axis)) return TP_ERR_INPUT;
    t.dims[axis] += x->dims[axis];
  }
  /* a token slice's context (ir/ops.def): appends one operand to the previous context */
  int64_t rows = tp_attr_int(c->m, c->op, "context_rows", 0);
  if (rows < 0 || (rows && rows < t.dims[axis]))
    return tp_error_op(c->d, c->m, c->op, "context_rows %lld cannot hold the %lld rows of the result",
                       (long long)rows, (long long)t.dims[axis]);
  if (rows && (op->ninputs > 2 || t.dims[axis] == 0))
    return tp_error_op(c->d, c->m, c->op,
                       "a context (context_rows) appends one non-empty operand to at most one "
                       "previous context");
  if (rows && op->ninputs == 2) {
    int prev = c->m->values[op->inputs[0]].def;
    if (prev < 0 || c->m->ops[prev].kind != TP_OP_Concat || tp_attr_int(c->m, prev, "context_rows", 0) != rows ||
        tp_attr_int(c->m, prev, "axis", 0) != axis)
      return tp_error_op(c->d, c->m, c->op,
                         "operand 0 of a context must be the previous context: a Concat with the "
                         "same axis and context_rows");
  }
  return set_result(c, 0, t);
}

/* Trilu: a matrix or a batch of them, masked in place */
static int infer_trilu(const TpInferCtx *c) {
  const int min_rank = 2;
  const TpType *x = operand(c, 0);
  if (x->rank < min_rank) return tp_error_op(c->d, c->m, c->op, "operand must have rank >= %d", min_rank);
  return set_result(c, 0, *x);
}

static int infer_slice_backward(const TpInferCtx *c) {
  const TpType *x = preset(c, 0), *dy = operand(c, 0);
  if (!x) return TP_ERR_INPUT;
  int ns, nt;
  const int64_t *starts = tp_attr_ints(c->m, c->op, "starts", &ns), *steps = tp_attr_ints(c->m, c->op, "steps", &nt);
  if (ns != x->rank || nt != x->rank || dy->rank != x->rank || dy->dtype != x->dtype)
    return tp_error_op(c->d, c->m, c->op, "starts, steps and gradient must have the result's rank %d", x->rank);
  for (int i = 0; i < x->rank; i++) {
    if (steps[i] == 0 || !tp_slice_fits(starts[i], steps[i], dy->dims[i], x->dims[i]))
      return tp_error_op(c->d, c->m, c->op, "slice of dim %d leaves [0, %lld)", i, (long long)x->dims[i]);
  }
  return TP_OK;
}

/* ---- gradients ---- */

/* Tile: dy seen as [r0, x0, r1, x1, ...] (the dims repeated once only as x_d), summed over
 * the repeats. */
static void tile_backward(TpGradCtx *a, int x, int dy) {
  TpType xt = type_of(a, x), split = {.dtype = xt.dtype};
  int n, naxes = 0;
  const int64_t *repeats = tp_attr_ints(a->m, a->fwd, "repeats", &n);
  int64_t axes[TP_MAX_RANK];
  for (int d = 0; d < xt.rank; d++) naxes += repeats[d] != 1;
  if (xt.rank + naxes > TP_MAX_RANK) {
    tp_grad_cannot(a, tp_strfmt(a->m, "tiling %d dims of a rank-%d tensor (at most rank %d in all)", naxes, xt.rank,
                                TP_MAX_RANK));
    return;
  }
  if (!naxes) {
    tp_grad_give_value(a, x, dy);
    return;
  }
  naxes = 0;
  for (int d = 0; d < xt.rank; d++) {
    if (repeats[d] != 1) {
      axes[naxes++] = split.rank;
      split.dims[split.rank++] = repeats[d];
    }
    split.dims[split.rank++] = xt.dims[d];
  }
  int g = tp_grad_emit(a, TP_OP_Reshape, &dy, 1, tp_grad_tmp_name(a, x), &split);
  int op = tp_grad_begin(a, TP_OP_ReduceSum, &g, 1, (const char *[]){tp_grad_contrib_name(a, x)}, 1);
  tp_set_attr_ints(a->m, op, "axes", axes, naxes);
  tp_set_attr_int(a->m, op, "keepdims", 0);
  tp_grad_give(a, x, tp_grad_end(a, op, NULL));
}

static void grad_trilu(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  tp_grad_give_op(a, x, TP_OP_Trilu, &dy, 1, false, true);
}

static void grad_reshape(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  tp_grad_give_op(a, x, TP_OP_Reshape, &dy, 1, true, false);
}

static void grad_expand(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  tp_grad_give_value(a, x, dy);
}

static void grad_slice(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  tp_grad_give_op(a, x, TP_OP_SliceBackward, &dy, 1, true, true);
}

static void grad_tile(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  tile_backward(a, x, dy);
}

static void grad_transpose(TpGradCtx *a, const TpGradOp *fwd) {
  TpModule *m = a->m;
  int o = a->fwd;
  int dy = fwd->dy, x = fwd->x;
  int n;
  const int64_t *perm = tp_attr_ints(m, o, "perm", &n);
  int64_t inv[TP_MAX_RANK];
  for (int i = 0; i < n; i++) inv[perm[i]] = i;
  int op = tp_grad_begin(a, TP_OP_Transpose, &dy, 1, (const char *[]){tp_grad_contrib_name(a, x)}, 1);
  tp_set_attr_ints(m, op, "perm", inv, n);
  tp_grad_give(a, x, tp_grad_end(a, op, NULL));
}

/* Concat of the results' gradients, zeros for those without */
static void grad_split(TpGradCtx *a, const TpGradOp *fwd) {
  TpModule *m = a->m;
  int o = a->fwd;
  const int *out = fwd->out;
  const int *dys = fwd->dys;
  int x = fwd->x;
  TpDType dt = fwd->dt;
  int nout = m->ops[o].noutputs, parts[64];
  for (int k = 0; k < nout; k++) {
    parts[k] = dys[k];
    if (parts[k] < 0) {
      TpType t = type_of(a, out[k]);
      int zero = tp_grad_scalar(a, dt, 0);
      parts[k] = tp_grad_emit(a, TP_OP_Expand, &zero, 1, tp_grad_tmp_name(a, x), &t);
    }
  }
  int op = tp_grad_begin(a, TP_OP_Concat, parts, nout, (const char *[]){tp_grad_contrib_name(a, x)}, 1);
  tp_grad_copy_attrs(a, op);
  tp_grad_give(a, x, tp_grad_end(a, op, NULL));
}

/* each operand's part of dy */
static void grad_concat(TpGradCtx *a, const TpGradOp *fwd) {
  TpModule *m = a->m;
  int o = a->fwd;
  int nin = fwd->nin;
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy;
  int64_t axis = tp_attr_int(m, o, "axis", 0), offset = 0;
  for (int i = 0; i < nin; i++) {
    TpType t = type_of(a, in[i]);
    if (need[i]) {
      int64_t starts[TP_MAX_RANK] = {0}, steps[TP_MAX_RANK];
      for (int k = 0; k < t.rank; k++) steps[k] = 1;
      starts[axis] = offset;
      int op = tp_grad_begin(a, TP_OP_Slice, &dy, 1, (const char *[]){tp_grad_contrib_name(a, in[i])}, 1);
      tp_set_attr_ints(m, op, "starts", starts, t.rank);
      tp_set_attr_ints(m, op, "steps", steps, t.rank);
      tp_grad_give(a, in[i], tp_grad_end(a, op, &t));
    }
    offset += t.dims[axis];
  }
}

/* ---- token axes ---- */

/* Reshape: input axis a and output axis b are the same positions when their extents and
 * the elements before them are equal. */
static void reshape_links(const TpModule *m, TpOpAxes *x, int in, int out) {
  const TpType *ti = value_type(m, in), *to = value_type(m, out);
  int64_t before_in = 1;
  for (int a = 0; a < ti->rank; a++) {
    int64_t before_out = 1;
    for (int b = 0; b < to->rank; b++) {
      if (before_out == before_in && to->dims[b] == ti->dims[a]) {
        axes_link(x, in, a, out, b);
        break;
      }
      before_out *= to->dims[b];
    }
    before_in *= ti->dims[a];
  }
}

/* the axes repeated once are kept */
static void axes_tile(const TpModule *m, int op, TpOpAxes *x) {
  int X = m->ops[op].inputs[0], Y = m->ops[op].outputs[0];
  int rx = value_type(m, X)->rank;
  int n;
  const int64_t *repeats = tp_attr_ints(m, op, "repeats", &n);
  for (int k = 0; k < rx && k < n; k++)
    if (repeats[k] == 1) axes_link(x, X, k, Y, k);
    else axes_mix(x, X, k, "repeats along");
}

static void axes_reshape(const TpModule *m, int op, TpOpAxes *x) {
  int X = m->ops[op].inputs[0], Y = m->ops[op].outputs[0];
  reshape_links(m, x, X, Y);
}

static void axes_expand(const TpModule *m, int op, TpOpAxes *x) {
  int X = m->ops[op].inputs[0], Y = m->ops[op].outputs[0];
  axes_broadcast(m, x, Y, X);
}

static void axes_transpose(const TpModule *m, int op, TpOpAxes *x) {
  int X = m->ops[op].inputs[0], Y = m->ops[op].outputs[0];
  int n;
  const int64_t *perm = tp_attr_ints(m, op, "perm", &n);
  for (int k = 0; k < n; k++) axes_link(x, X, (int)perm[k], Y, k);
}

static void axes_split_concat(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = o->inputs[0], Y = o->outputs[0];
  int rx = value_type(m, X)->rank;
  int a = (int)tp_attr_int(m, op, "axis", 0), whole = o->kind == TP_OP_Split ? X : Y;
  int n = o->kind == TP_OP_Split ? o->noutputs : o->ninputs;
  for (int i = 0; i < n; i++) {
    int part = o->kind == TP_OP_Split ? o->outputs[i] : o->inputs[i];
    for (int k = 0; k < rx; k++)
      if (k != a) axes_link(x, whole, k, part, k);
    axes_mix(x, part, a, o->kind == TP_OP_Split ? "splits along" : "concatenates along");
  }
  axes_mix(x, whole, a, o->kind == TP_OP_Split ? "splits along" : "concatenates along");
}

static void axes_slice(const TpModule *m, int op, TpOpAxes *x) {
  int X = m->ops[op].inputs[0], Y = m->ops[op].outputs[0];
  int rx = value_type(m, X)->rank;
  int n;
  const int64_t *starts = tp_attr_ints(m, op, "starts", &n), *steps = tp_attr_ints(m, op, "steps", &n);
  for (int k = 0; k < rx; k++) {
    if (starts[k] == 0 && steps[k] == 1 && value_type(m, Y)->dims[k] == value_type(m, X)->dims[k])
      axes_link(x, X, k, Y, k);
    else axes_mix(x, X, k, "slices");
  }
}

static void axes_trilu(const TpModule *m, int op, TpOpAxes *x) {
  int X = m->ops[op].inputs[0], Y = m->ops[op].outputs[0];
  int rx = value_type(m, X)->rank;
  axes_all(m, x, X, Y);
  axes_mix(x, X, rx - 1, "masks a triangle of"), axes_mix(x, X, rx - 2, "masks a triangle of");
}

/* ---- tensor-parallel split ---- */

/* A Slice of split value x that takes one whole chunk of it (a fused Q|K|V cut along its
 * features, MPT): this rank's piece of that chunk. */
static int split_slice_chunk(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  int n, x = m->ops[op].inputs[0], y = m->ops[op].outputs[0], a = s->axis[x], p = s->parts[x];
  int64_t whole = m->values[x].type.dims[a] * p, len = m->values[y].type.dims[a];
  const int64_t *starts = tp_attr_ints(m, op, "starts", &n), *steps = tp_attr_ints(m, op, "steps", &n);
  if (tp_split_chunks_of(s, x) < 2 || steps[a] != 1 || len <= 0 || len * tp_split_chunks_of(s, x) != whole ||
      starts[a] % len || len % p)
    return tp_split_refuse(s, op, "it cuts the axis split over the ranks, not into the chunks of a fused product");
  int64_t local[TP_MAX_RANK];
  memcpy(local, starts, (size_t)n * sizeof *local);
  local[a] /= p;
  tp_set_attr_ints(m, op, "starts", local, n);
  m->values[y].type.dims[a] /= p;
  tp_split_mark(s, y, a, p);
  return tp_infer_op(m, op, s->d); /* checks the preset result */
}

static int split_reshape(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  int y = s->m->ops[op].outputs[0], x = s->m->ops[op].inputs[0];
  TpType *out = &m->values[y].type;
  int b = s->axis[x] < 0 ? -1 : tp_split_reshape_axis(&m->values[x].type, out, s->axis[x], s->parts[x]);
  if (b < 0) return tp_split_refuse(s, op, "the split axis does not map onto one axis of the result");
  out->dims[b] /= s->parts[x];
  tp_split_mark(s, y, b, s->parts[x]);
  return TP_OK;
}

static int split_transpose(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  int y = s->m->ops[op].outputs[0], x = s->m->ops[op].inputs[0];
  int n, b = 0;
  const int64_t *perm = tp_attr_ints(m, op, "perm", &n);
  while (b < n && perm[b] != s->axis[x]) b++;
  if (s->axis[x] < 0 || b == n) return tp_split_refuse(s, op, "the split axis is not permuted");
  tp_split_mark(s, y, b, s->parts[x]);
  return tp_split_reinfer(s, op);
}

static int split_split(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  TpOp *o = &s->m->ops[op];
  int x = o->inputs[0], ry = s->m->values[o->outputs[0]].type.rank;
  if (s->axis[x] < 0) return tp_split_refuse(s, op, "its operand is replicated");
  if ((tp_attr_int(m, op, "axis", 0) + ry) % ry == s->axis[x] && tp_split_chunks_of(s, x) != o->noutputs)
    return tp_split_refuse(s, op, "it cuts the axis split over the ranks, not into the chunks of a fused product");
  for (int r = 0; r < o->noutputs; r++)
    if (o->outputs[r] >= 0 && m->values[o->outputs[r]].type.dims[s->axis[x]] % s->parts[x])
      return tp_split_refuse(s, op, "its parts do not cut into whole pieces per rank (heads that do not divide)");
  for (int r = 0; r < o->noutputs; r++)
    if (o->outputs[r] >= 0) {
      m->values[o->outputs[r]].type.dims[s->axis[x]] /= s->parts[x];
      tp_split_mark(s, o->outputs[r], s->axis[x], s->parts[x]);
    }
  return TP_OK;
}

/* a fused product's parts cut along another axis (GPT-NeoX) */
static int split_slice(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  int y = s->m->ops[op].outputs[0], x = s->m->ops[op].inputs[0];
  int n, a = s->axis[x];
  const int64_t *starts = tp_attr_ints(m, op, "starts", &n), *steps = tp_attr_ints(m, op, "steps", &n);
  TpType *out = &m->values[y].type;
  if (starts[a] != 0 || steps[a] != 1 || out->dims[a] != m->values[x].type.dims[a] * s->parts[x])
    return split_slice_chunk(s, op);
  out->dims[a] /= s->parts[x];
  tp_split_mark(s, y, a, s->parts[x]);
  return tp_infer_op(m, op, s->d); /* checks the preset result */
}

static int split_concat(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  TpOp *o = &s->m->ops[op];
  int y = o->outputs[0], x = o->inputs[0];
  for (int i = 0; i < o->ninputs; i++)
    if (s->axis[o->inputs[i]] != s->axis[x] || s->parts[o->inputs[i]] != s->parts[x] ||
        tp_attr_int(m, op, "axis", -1) == s->axis[x])
      return tp_split_refuse(s, op, "its operands are not all split along one axis it does not join along");
  tp_split_mark(s, y, s->axis[x], s->parts[x]);
  return tp_split_reinfer(s, op);
}

/* ---- kernel binders ---- */

/* Cast, Reshape, Expand, Tile: x to y, the kernel by op kind. */
int tp_bind_copy(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  TpOpKind k = m->ops[op].kind;
  b->kernel = k == TP_OP_Cast      ? TP_K_CAST
              : k == TP_OP_Reshape ? TP_K_RESHAPE
              : k == TP_OP_Expand  ? TP_K_EXPAND
                                   : TP_K_TILE;
  b->a.cast = (TpCopyArgs){&in[0], &out[0]};
  return TP_OK;
}

static int bind_transpose(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  int n;
  const int64_t *perm = tp_attr_ints(m, op, "perm", &n);
  if (n != in[0].rank) return tp_error_op(d, m, op, "perm has %d entries for rank %d", n, in[0].rank);
  b->kernel = TP_K_TRANSPOSE;
  b->a.transpose = (TpTransposeArgs){&in[0], perm, n, &out[0]};
  return TP_OK;
}

static int bind_split(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  b->kernel = TP_K_SPLIT;
  b->a.split = (TpSplitArgs){&in[0], (int)tp_attr_int(m, op, "axis", 0), out, m->ops[op].noutputs};
  return TP_OK;
}

/* Slice and SliceBackward: {starts, steps} per dim of the sliced tensor (x, or dx). */
static int bind_slice(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  bool fwd = m->ops[op].kind == TP_OP_Slice;
  int ns, nt, rank = fwd ? in[0].rank : out[0].rank;
  const int64_t *starts = tp_attr_ints(m, op, "starts", &ns), *steps = tp_attr_ints(m, op, "steps", &nt);
  if (ns != rank || nt != rank)
    return tp_error_op(d, m, op, "starts/steps have %d/%d entries for rank %d", ns, nt, rank);
  b->kernel = fwd ? TP_K_SLICE : TP_K_SLICE_BACKWARD;
  b->a.slice = (TpSliceArgs){&in[0], starts, steps, rank, &out[0]};
  return TP_OK;
}

static int bind_concat(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  b->kernel = TP_K_CONCAT;
  b->a.concat = (TpConcatArgs){in, m->ops[op].ninputs, (int)tp_attr_int(m, op, "axis", 0), &out[0]};
  return TP_OK;
}

static int bind_trilu(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  b->kernel = TP_K_TRILU;
  b->a.trilu = (TpTriluArgs){&in[0], tp_attr_int(m, op, "upper", 1) != 0, tp_attr_int(m, op, "k", 0), &out[0]};
  return TP_OK;
}

/* ---- rule sets ---- */

const TpOpRules tp_rules_Reshape = {
    .infer = infer_reshape,
    .gradient = grad_reshape,
    .token_axes = axes_reshape,
    .tensor_split = split_reshape,
    .bind = TP_BINDING(tp_bind_copy, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_Expand = {
    .infer = infer_expand,
    .gradient = grad_expand,
    .token_axes = axes_expand,
    .bind = TP_BINDING(tp_bind_copy, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_Transpose = {
    .infer = infer_transpose,
    .gradient = grad_transpose,
    .token_axes = axes_transpose,
    .tensor_split = split_transpose,
    .bind = TP_BINDING(bind_transpose, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_Split = {
    .infer = infer_split,
    .gradient = grad_split,
    .grads_every_result = true,
    .token_axes = axes_split_concat,
    .tensor_split = split_split,
    .bind = TP_BINDING(bind_split, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_Slice = {
    .infer = infer_slice,
    .gradient = grad_slice,
    .token_axes = axes_slice,
    .tensor_split = split_slice,
    .bind = TP_BINDING(bind_slice, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_Concat = {
    .infer = infer_concat,
    .gradient = grad_concat,
    .token_axes = axes_split_concat,
    .tensor_split = split_concat,
    .bind = TP_BINDING(bind_concat, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_Trilu = {
    .infer = infer_trilu,
    .gradient = grad_trilu,
    .token_axes = axes_trilu,
    .bind = TP_BINDING(bind_trilu, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_Tile = {
    .infer = infer_tile,
    .gradient = grad_tile,
    .token_axes = axes_tile,
    .bind = TP_BINDING(tp_bind_copy, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_SliceBackward = {
    .infer = infer_slice_backward,
    .bind = TP_BINDING(bind_slice, TP_BIND_ANY, 0, 0),
};
