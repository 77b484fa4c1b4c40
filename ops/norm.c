/* Normalisations: LayerNorm and RMSNorm, and their backward ops.
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

static int infer_layernorm(const TpInferCtx *c) {
  const TpType *x = operand(c, 0), *scale = operand(c, 1), *bias = operand(c, 2);
  int64_t axis = tp_attr_int(c->m, c->op, "axis", -1);
  if (need_float(c, x, "X") || check_axis(c, axis, x->rank, "axis")) return TP_ERR_INPUT;
  TpType norm = {.dtype = x->dtype, .rank = x->rank - (int)axis}, t;
  memcpy(norm.dims, x->dims + axis, (size_t)norm.rank * sizeof norm.dims[0]);
  for (int i = 1; i < 3; i++) {
    const TpType *p = i == 1 ? scale : bias;
    if (!p) continue;
    if (same_dtype(c, x, p) || broadcast(c, p, &norm, &t)) return TP_ERR_INPUT;
    if (!tp_type_equal(&t, &norm))
      return tp_error_op(c->d, c->m, c->op, "%s does not broadcast to the normalised dims", i == 1 ? "Scale" : "B");
  }
  if (set_result(c, 0, *x)) return TP_ERR_INPUT;
  TpType stat = *x;
  stat.dtype = TP_F32;
  for (int i = (int)axis; i < x->rank; i++) stat.dims[i] = 1, stat.dimnames[i] = NULL;
  return set_result(c, 1, stat) || set_result(c, 2, stat) ? TP_ERR_INPUT : TP_OK;
}

static int infer_layernorm_backward(const TpInferCtx *c) {
  const TpType *dy = operand(c, 0), *x = operand(c, 1), *scale = operand(c, 2);
  const TpType *mean = operand(c, 3), *invstd = operand(c, 4);
  int64_t axis = tp_attr_int(c->m, c->op, "axis", -1);
  if (need_float(c, x, "X") || check_axis(c, axis, x->rank, "axis") || check_grad(c, dy, x)) return TP_ERR_INPUT;
  TpType stat = *x;
  stat.dtype = TP_F32;
  for (int i = (int)axis; i < x->rank; i++) stat.dims[i] = 1;
  if (!tp_type_equal(mean, &stat) || !tp_type_equal(invstd, &stat))
    return tp_error_op(c->d, c->m, c->op, "Mean and InvStdDev must be the forward LayerNorm's statistics");
  return set_result(c, 0, *x) || set_result(c, 1, *scale) || set_result(c, 2, *scale) ? TP_ERR_INPUT : TP_OK;
}

/* RMSNorm(X, Scale) and RMSNormBackward's X and Scale: Scale has the normalised shape. */
static int rmsnorm_operands(const TpInferCtx *c, const TpType *x, const TpType *scale) {
  int64_t axis = tp_attr_int(c->m, c->op, "axis", -1);
  if (need_float(c, x, "X") || check_axis(c, axis, x->rank, "axis") || same_dtype(c, x, scale)) return TP_ERR_INPUT;
  if (tp_attr_float(c->m, c->op, "epsilon", 0) < 0)
    return tp_error_op(c->d, c->m, c->op, "epsilon must not be negative");
  TpType norm = {.dtype = x->dtype, .rank = x->rank - (int)axis};
  memcpy(norm.dims, x->dims + axis, (size_t)norm.rank * sizeof norm.dims[0]);
  if (!tp_type_equal(scale, &norm))
    return tp_error_op(c->d, c->m, c->op, "Scale must have the normalised shape of X");
  return TP_OK;
}

static int infer_rmsnorm(const TpInferCtx *c) {
  if (rmsnorm_operands(c, operand(c, 0), operand(c, 1))) return TP_ERR_INPUT;
  return set_result(c, 0, *operand(c, 0));
}

static int infer_rmsnorm_backward(const TpInferCtx *c) {
  const TpType *dy = operand(c, 0), *x = operand(c, 1);
  if (rmsnorm_operands(c, x, operand(c, 2)) || check_grad(c, dy, x)) return TP_ERR_INPUT;
  return set_results_like(c, 1, 2);
}

/* ---- FLOPs ---- */

static double flops_layernorm(const TpModule *m, int op) { return 8 * tp_flops_per_result(m, op); }

/* ---- gradients ---- */

/* Adds the Mean and InvStdDev results to forward LayerNorm op o where absent. */
static void layernorm_stats(TpGradCtx *a, int o) {
  TpModule *m = a->m;
  if (m->ops[o].noutputs < 3) {
    int *outs = tp_alloc(m, 3 * sizeof *outs);
    for (int i = 0; i < 3; i++) outs[i] = i < m->ops[o].noutputs ? m->ops[o].outputs[i] : -1;
    m->ops[o].outputs = outs;
    m->ops[o].noutputs = 3;
  }
  const char *y = name_of(a, m->ops[o].outputs[0]);
  for (int i = 1; i < 3; i++) {
    if (m->ops[o].outputs[i] >= 0) continue;
    const char *name = tp_unique_name(m, tp_strfmt(a->m, "%s.%s", y, i == 1 ? "mean" : "invstddev"));
    int v = tp_add_value(m, name, TP_VAL_RESULT, (TpType){0}, m->ops[o].origin);
    m->values[v].def = o;
    m->ops[o].outputs[i] = v;
  }
  if (tp_infer_op(m, o, a->d) != TP_OK) a->rc = TP_ERR_INTERNAL;
}

static void grad_rmsnorm(TpGradCtx *a, const TpGradOp *fwd) { tp_grad_one_op(a, fwd, TP_OP_RMSNormBackward, false); }

static void grad_layernorm(TpGradCtx *a, const TpGradOp *fwd) {
  TpModule *m = a->m;
  int o = a->fwd;
  int nin = fwd->nin;
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy, x = fwd->x;
  TpType xt = type_of(a, x);
  int64_t axis = tp_attr_int(m, o, "axis", -1), norm = tp_numel(xt.rank - (int)axis, xt.dims + axis);
  for (int i = 1; i < nin; i++)
    if (in[i] >= 0 && tp_type_numel(&m->values[in[i]].type) != norm) {
      tp_grad_cannot(a, "Scale and B must have the normalised shape");
      return;
    }
  layernorm_stats(a, o);
  int mean = m->ops[o].outputs[1], inv = m->ops[o].outputs[2];
  bool bias = nin > 2 && in[2] >= 0;
  const char *names[3] = {need[0] ? tp_grad_contrib_name(a, x) : tp_grad_tmp_name(a, x),
                          need[1] ? tp_grad_contrib_name(a, in[1]) : NULL,
                          bias && need[2] ? tp_grad_contrib_name(a, in[2]) : NULL};
  int op = tp_grad_begin(a, TP_OP_LayerNormBackward, (int[]){dy, x, in[1], mean, inv}, 5, names,
                         grad_results(names, 3));
  tp_grad_copy_attrs(a, op);
  tp_grad_end(a, op, NULL);
  for (int i = 0; i < m->ops[op].noutputs; i++)
    if (names[i] && (i > 0 || need[0])) tp_grad_give(a, in[i], m->ops[op].outputs[i]);
}

/* ---- token axes ---- */

/* LayerNorm(X, Scale, B?) -> Y, Mean?, InvStdDev? and RMSNorm(X, Scale) -> Y */
static void axes_norm(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = o->inputs[0], Y = o->outputs[0];
  int rx = value_type(m, X)->rank;
  int a = (int)tp_attr_int(m, op, "axis", -1);
  axes_all(m, x, X, Y);
  for (int k = a; k < rx; k++) axes_mix(x, X, k, "normalises over");
  for (int i = 1; i < o->noutputs; i++) /* Mean, InvStdDev: [d0 .. d(a-1), 1 ...] */
    for (int k = 0; k < a && o->outputs[i] >= 0; k++) axes_link(x, X, k, o->outputs[i], k);
  for (int i = 1; i < o->ninputs; i++) axes_broadcast(m, x, Y, o->inputs[i]);
}

/* ---- tensor-parallel split ---- */

/* RMSNorm op over axes that hold the split axis of its operand x (norm_splits_across):
 * each rank has some of every row's features, so it becomes
 *   x / sqrt(TensorCopy(AllReduce(mean(x^2))) / N + epsilon) * scale
 * with the scale cut as x's features. The all-reduced means of the N ranks (of equal
 * parts; ranks sharing a part add it alike) are N times the row's. The AllReduce's
 * gradient passes through, and TensorCopy's sums the ranks' partial ones, as each rank's
 * features reach the mean. */
static int split_norm_across_ranks(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  int x = m->ops[op].inputs[0], w = m->ops[op].inputs[1], y = m->ops[op].outputs[0], a = tp_split_norm_axis(m, op);
  int rank = m->values[x].type.rank, axis = s->axis[x], parts = s->parts[x];
  if (tp_split_chunks_of(s, x) > 1)
    return tp_split_refuse(s, op, "it normalises the chunks of a fused product together");
  if (tp_split_param(s, op, w, axis - a, parts, 1)) return TP_ERR_INPUT;
  const char *name = m->values[y].name;
  float inv = 1.0f / (float)s->ranks, eps = (float)tp_attr_float(m, op, "epsilon", 1e-5);
  int c_inv = tp_add_const(m, tp_unique_name(m, tp_strfmt(m, "%s.ranks", name)), tp_type_make(TP_F32, 0, NULL), &inv,
                           m->ops[op].origin);
  int c_eps = tp_add_const(m, tp_unique_name(m, tp_strfmt(m, "%s.eps", name)), tp_type_make(TP_F32, 0, NULL), &eps,
                           m->ops[op].origin);
  int sq = tp_split_add_after(s, op, TP_OP_Mul, (int[]){x, x}, 2, tp_strfmt(m, "%s.sq", name));
  if (sq < 0) return TP_ERR_INPUT;
  int mean_op = tp_split_new_op(s, op, TP_OP_ReduceMean, &sq, 1, tp_strfmt(m, "%s.mean", name));
  int64_t axes[TP_MAX_RANK];
  for (int i = a; i < rank; i++) axes[i - a] = i;
  tp_set_attr_ints(m, mean_op, "axes", axes, rank - a);
  tp_set_attr_int(m, mean_op, "keepdims", 1);
  if (tp_infer_op(m, mean_op, s->d)) return TP_ERR_INPUT;
  int mean = m->ops[mean_op].outputs[0];
  int sum = tp_split_add_after(s, op, TP_OP_AllReduce, &mean, 1, tp_strfmt(m, "%s.sum", name));
  int all = sum < 0
                ? -1
                : tp_split_add_after(s, op, TP_OP_TensorCopy, &sum, 1, tp_strfmt(m, "%s.tp", m->values[sum].name));
  int row = all < 0 ? -1
                    : tp_split_add_after(s, op, TP_OP_Mul, (int[]){all, c_inv}, 2, tp_strfmt(m, "%s.row", name));
  int var = row < 0 ? -1
                    : tp_split_add_after(s, op, TP_OP_Add, (int[]){row, c_eps}, 2, tp_strfmt(m, "%s.var", name));
  int rms = var < 0 ? -1 : tp_split_add_after(s, op, TP_OP_Sqrt, &var, 1, tp_strfmt(m, "%s.rms", name));
  int xn = rms < 0 ? -1 : tp_split_add_after(s, op, TP_OP_Div, (int[]){x, rms}, 2, tp_strfmt(m, "%s.normed", name));
  if (xn < 0) return TP_ERR_INPUT;
  tp_split_mark(s, sq, axis, parts);
  tp_split_mark(s, xn, axis, parts);
  TpOp *o = &m->ops[op]; /* the norm itself becomes the product with the scale */
  o->kind = TP_OP_Mul;
  o->inputs[0] = xn, o->nattrs = 0, o->attrs = NULL;
  tp_split_mark(s, y, axis, parts);
  return tp_split_reinfer(s, op);
}

/* within each head its scale (and bias) stays whole; across the ranks, norm_across_ranks */
static int split_norm(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  TpOp *o = &s->m->ops[op];
  int x = o->inputs[0];
  for (int i = 1; i < o->ninputs; i++)
    if (o->inputs[i] >= 0 && s->axis[o->inputs[i]] >= 0)
      return tp_split_refuse(s, op,
                             tp_strfmt(m, "its scale or bias %%%s is split over the ranks",
                                       m->values[o->inputs[i]].name));
  if (s->axis[x] >= tp_split_norm_axis(m, op) && tp_split_norm_splits_across(m, op))
    return split_norm_across_ranks(s, op);
  if (s->axis[x] >= tp_split_norm_axis(m, op))
    return tp_split_refuse(s, op,
                           "it normalises over the axis split over the ranks (only an RMSNorm with a scale of its "
                           "own "
                           "splits so)");
  for (int i = 1; i < m->ops[op].ninputs; i++) /* o moves when an op is added */
    if (tp_split_share_operand(s, op, i)) return TP_ERR_INPUT;
  for (int r = 0; r < m->ops[op].noutputs; r++) /* LayerNorm's statistics keep the heads axis too */
    if (m->ops[op].outputs[r] >= 0) tp_split_mark(s, m->ops[op].outputs[r], s->axis[x], s->parts[x]);
  return tp_split_reinfer(s, op);
}

/* ---- kernel binders ---- */

/* LayerNorm(X, Scale, Bias) {axis, epsilon} -> Y, Mean, InvStdDev. Scale and bias have the
 * normalised shape. */
static int bind_layernorm(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  const TpTensor *x = &in[0];
  int axis = (int)tp_attr_int(m, op, "axis", x->rank - 1);
  if (axis < 0 || axis >= x->rank) return shape_error(m, op, d);
  int64_t outer = numel_from(x, 0, axis), n = numel_from(x, axis, x->rank);
  const TpTensor *bias = opt_in(m, op, in, 2);
  if (tp_tensor_numel(&in[1]) != n || (bias && tp_tensor_numel(bias) != n))
    return tp_error_op(d, m, op, "scale and bias must have the normalised shape");
  if (tp_tensor_numel(&out[0]) != outer * n || !out_numel(m, op, out, 1, outer) || !out_numel(m, op, out, 2, outer))
    return shape_error(m, op, d);
  b->kernel = TP_K_LAYERNORM;
  b->a.layernorm = (TpLayerNormArgs){x,
                                     &in[1],
                                     bias,
                                     outer,
                                     n,
                                     (float)tp_attr_float(m, op, "epsilon", 1e-5),
                                     &out[0],
                                     opt_out(m, op, out, 1),
                                     opt_out(m, op, out, 2)};
  return TP_OK;
}

/* LayerNormBackward(dY, X, Scale, Mean, InvStdDev) -> dX, dScale, dBias. */
static int bind_layernorm_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b,
                                   TpDiag *d) {
  const TpTensor *x = &in[1];
  int axis = (int)tp_attr_int(m, op, "axis", x->rank - 1);
  if (axis < 0 || axis >= x->rank) return shape_error(m, op, d);
  int64_t rows = numel_from(x, 0, axis), n = numel_from(x, axis, x->rank);
  /* Scale (and so dScale, dB) must have the normalised shape: no broadcast to sum back. */
  if (tp_tensor_numel(&in[0]) != rows * n || tp_tensor_numel(&in[2]) != n || tp_tensor_numel(&in[3]) != rows ||
      tp_tensor_numel(&in[4]) != rows || !out_numel(m, op, out, 0, rows * n) || !out_numel(m, op, out, 1, n) ||
      !out_numel(m, op, out, 2, n))
    return shape_error(m, op, d);
  b->kernel = TP_K_LAYERNORM_BACKWARD;
  b->a.layernorm_backward = (TpLayerNormBackwardArgs){&in[0],
                                                      x,
                                                      &in[2],
                                                      &in[3],
                                                      &in[4],
                                                      rows,
                                                      n,
                                                      opt_out(m, op, out, 0),
                                                      opt_out(m, op, out, 1),
                                                      opt_out(m, op, out, 2)};
  return TP_OK;
}

/* RMSNorm(X, Scale) {axis, epsilon} and RMSNormBackward(dY, X, Scale) -> dX, dScale. */
static int bind_rmsnorm(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  bool fwd = m->ops[op].kind == TP_OP_RMSNorm;
  const TpTensor *x = fwd ? &in[0] : &in[1], *scale = fwd ? &in[1] : &in[2];
  int axis = (int)tp_attr_int(m, op, "axis", x->rank - 1);
  if (axis < 0 || axis >= x->rank) return shape_error(m, op, d);
  int64_t rows = numel_from(x, 0, axis), n = numel_from(x, axis, x->rank);
  if (tp_tensor_numel(scale) != n || (!fwd && tp_tensor_numel(&in[0]) != rows * n)) return shape_error(m, op, d);
  b->kernel = fwd ? TP_K_RMSNORM : TP_K_RMSNORM_BACKWARD;
  b->a.rmsnorm = (TpRMSNormArgs){fwd ? NULL : &in[0],
                                 x,
                                 scale,
                                 rows,
                                 n,
                                 (float)tp_attr_float(m, op, "epsilon", 0),
                                 opt_out(m, op, out, 0),
                                 fwd ? NULL : opt_out(m, op, out, 1)};
  return TP_OK;
}

/* ---- rule sets ---- */

const TpOpRules tp_rules_LayerNorm = {
    .infer = infer_layernorm,
    .flops = flops_layernorm,
    .gradient = grad_layernorm,
    .token_axes = axes_norm,
    .tensor_split = split_norm,
    .bind = TP_BINDING(bind_layernorm, TP_BIND_F32_COPY, 0, 0),
};
const TpOpRules tp_rules_RMSNorm = {
    .infer = infer_rmsnorm,
    .gradient = grad_rmsnorm,
    .token_axes = axes_norm,
    .tensor_split = split_norm,
    .bind = TP_TRAINING_BINDING(bind_rmsnorm),
};
const TpOpRules tp_rules_LayerNormBackward = {
    .infer = infer_layernorm_backward,
    .bind = TP_TRAINING_BINDING(bind_layernorm_backward),
};
const TpOpRules tp_rules_RMSNormBackward = {
    .infer = infer_rmsnorm_backward,
    .bind = TP_TRAINING_BINDING(bind_rmsnorm),
};
