/* Losses: ONNX's SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss, the raised
 * CrossEntropy (and its vocabulary-parallel statistics), and its backward op.
 *
 * Each op's rule set, tp_rules_<Op> (ops/rules.h), is at the end of the file; the hooks
 * it names are above it. */
#include "axes.h"
#include "bind.h"
#include "grad.h"
#include "infer.h"

#include <stdlib.h>
#include <string.h>

/* ---- shape rules ---- */

/* SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss: scores [N, C, d...], labels [N, d...]. */
static int infer_loss(const TpInferCtx *c) {
  const TpType *x = operand(c, 0), *labels = operand(c, 1), *w = operand(c, 2);
  if (need_float(c, x, "scores")) return TP_ERR_INPUT;
  if (x->rank < 2 || labels->rank != x->rank - 1 || labels->dims[0] != x->dims[0])
    return tp_error_op(c->d, c->m, c->op, "scores must be [N, C, d...] and labels [N, d...]");
  for (int i = 2; i < x->rank; i++)
    if (labels->dims[i - 1] != x->dims[i])
      return tp_error_op(c->d, c->m, c->op, "labels do not match the scores' extra dims");
  if (labels->dtype != TP_I64 && labels->dtype != TP_I32)
    return tp_error_op(c->d, c->m, c->op, "labels must be i32 or i64");
  if (w && (w->rank != 1 || w->dims[0] != x->dims[1] || w->dtype != x->dtype))
    return tp_error_op(c->d, c->m, c->op, "weights must be [C] of the scores' dtype");
  const char *reduction = tp_attr_string(c->m, c->op, "reduction", "mean");
  TpType loss = {.dtype = x->dtype};
  if (strcmp(reduction, "none") == 0) {
    loss = *labels;
    loss.dtype = x->dtype;
  } else if (strcmp(reduction, "mean") != 0 && strcmp(reduction, "sum") != 0) {
    return tp_error_op(c->d, c->m, c->op, "unknown reduction '%s'", reduction);
  }
  return set_result(c, 0, loss) || set_result(c, 1, *x) ? TP_ERR_INPUT : TP_OK;
}

/* Logits [..., V] and Targets [...] with the same leading dims. */
static int check_logits_targets(const TpInferCtx *c, const TpType *logits, const TpType *targets) {
  if (need_float(c, logits, "logits")) return TP_ERR_INPUT;
  bool ok = logits->rank >= 1 && targets->rank == logits->rank - 1 &&
            (targets->dtype == TP_I64 || targets->dtype == TP_I32);
  for (int i = 0; ok && i < targets->rank; i++) ok = targets->dims[i] == logits->dims[i];
  if (!ok) {
    char sl[256], st[256];
    return tp_error_op(c->d, c->m, c->op, "targets %s do not index logits %s", type_str(targets, st),
                       type_str(logits, sl));
  }
  if (tp_attr_float(c->m, c->op, "denominator", 1) <= 0)
    return tp_error_op(c->d, c->m, c->op, "denominator must be positive");
  return TP_OK;
}

/* The statistics CrossEntropyStats computes from logits [..., Vp] over `parts` ranges:
 * [..., 2 parts + 1]. */
static TpType vocab_stats_type(const TpType *logits, int64_t parts) {
  TpType t = *logits;
  t.dims[t.rank - 1] = 2 * parts + 1;
  t.dimnames[t.rank - 1] = NULL;
  return t;
}

/* CrossEntropy's (first = 0) and CrossEntropyBackward's (first = 1) optional Stats and
 * Part, both or neither: Stats as CrossEntropyStats gives them. */
static int check_vocab_stats(const TpInferCtx *c, int first, const TpType *logits) {
  const TpType *stats = operand(c, first + 2), *part = operand(c, first + 3);
  if (!stats && !part) return TP_OK;
  if (!stats || !part) return tp_error_op(c->d, c->m, c->op, "Stats and Part come together");
  if (check_vocab_part(c, first + 3, NULL)) return TP_ERR_INPUT;
  int64_t parts = stats->rank == logits->rank ? (stats->dims[stats->rank - 1] - 1) / 2 : 0;
  TpType want = vocab_stats_type(logits, parts);
  if (parts < 1 || !tp_type_equal(stats, &want)) {
    char ss[256], sl[256];
    return tp_error_op(c->d, c->m, c->op, "Stats %s are not the vocabulary statistics of logits %s",
                       type_str(stats, ss), type_str(logits, sl));
  }
  return TP_OK;
}

/* A padded vocabulary's vocab_pad: fewer classes than the last range's (it keeps one); the
 * whole row's when the vocabulary is padded but not split. */
static int check_vocab_pad(const TpInferCtx *c, const TpType *logits) {
  int64_t pad = tp_attr_int(c->m, c->op, "vocab_pad", 0);
  if (pad == 0) return TP_OK;
  if (pad < 0 || pad >= logits->dims[logits->rank - 1])
    return tp_error_op(c->d, c->m, c->op, "vocab_pad %lld must be in [0, %lld): the last range keeps a class",
                       (long long)pad, (long long)logits->dims[logits->rank - 1]);
  return TP_OK;
}

static int infer_cross_entropy(const TpInferCtx *c) {
  const TpType *logits = operand(c, 0);
  if (check_logits_targets(c, logits, operand(c, 1)) || check_vocab_stats(c, 0, logits) ||
      check_vocab_pad(c, logits))
    return TP_ERR_INPUT;
  return set_result(c, 0, (TpType){.dtype = logits->dtype});
}

static int infer_cross_entropy_stats(const TpInferCtx *c) {
  const TpType *logits = operand(c, 0);
  int64_t parts = 0; /* set by check_vocab_part */
  if (check_logits_targets(c, logits, operand(c, 1)) || check_vocab_part(c, 2, &parts)) return TP_ERR_INPUT;
  if (logits->dtype != TP_F32) return tp_error_op(c->d, c->m, c->op, "the logits must be f32");
  if (check_vocab_pad(c, logits)) return TP_ERR_INPUT;
  return set_result(c, 0, vocab_stats_type(logits, parts));
}

static int infer_cross_entropy_backward(const TpInferCtx *c) {
  const TpType *dloss = operand(c, 0), *logits = operand(c, 1);
  if (dloss->rank != 0 || dloss->dtype != logits->dtype)
    return tp_error_op(c->d, c->m, c->op, "dLoss must be a scalar of the logits' dtype");
  if (check_logits_targets(c, logits, operand(c, 2)) || check_vocab_stats(c, 1, logits) ||
      check_vocab_pad(c, logits))
    return TP_ERR_INPUT;
  return set_result(c, 0, *logits);
}

/* ---- FLOPs ---- */

/* about 5 FLOPs per logit (max, exp, sum, log) */
static double flops_cross_entropy(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  return o->inputs[0] >= 0 ? 5 * (double)tp_type_numel(&m->values[o->inputs[0]].type) : tp_flops_per_result(m, op);
}

/* ---- gradients ---- */

/* SoftmaxCrossEntropyLoss (through CrossEntropyBackward, classes moved last) and
 * NegativeLogLikelihoodLoss (-dLoss/denominator where the class is the target). */
static void loss_backward(TpGradCtx *a, const int *in, int dy) {
  int o = a->fwd, x = in[0], labels = in[1];
  TpType xt = type_of(a, x), lt = type_of(a, labels);
  const char *reduction = tp_attr_string(a->m, o, "reduction", "mean");
  const TpAttr *ignore = tp_get_attr(a->m, o, "ignore_index");
  if (a->m->ops[o].ninputs > 2 && in[2] >= 0) {
    tp_grad_cannot(a, "class weights are not supported");
    return;
  }
  if (strcmp(reduction, "none") == 0) {
    tp_grad_cannot(a, "reduction 'none' is not supported");
    return;
  }
  /* an ignore_index no class can have changes nothing: the trainer's targets are tokens */
  if (ignore && ignore->i >= 0 && ignore->i < xt.dims[1]) {
    tp_grad_cannot(a, "an ignore_index inside the class range is not supported");
    return;
  }
  double denominator = strcmp(reduction, "mean") == 0 ? (double)tp_type_numel(&lt) : 1;
  if (a->m->ops[o].kind == TP_OP_SoftmaxCrossEntropyLoss) {
    int r = xt.rank, scores = x;
    int64_t last[TP_MAX_RANK], back[TP_MAX_RANK]; /* [N, C, d...] <-> [N, d..., C] */
    for (int i = 0; i < r; i++) last[i] = i == 0 ? 0 : i == r - 1 ? 1 : i + 1;
    for (int i = 0; i < r; i++) back[last[i]] = i;
    if (r > 2) {
      int op = tp_grad_begin(a, TP_OP_Transpose, &x, 1, (const char *[]){tp_grad_tmp_name(a, x)}, 1);
      tp_set_attr_ints(a->m, op, "perm", last, r);
      scores = tp_grad_end(a, op, NULL);
    }
    int op = tp_grad_begin(a, TP_OP_CrossEntropyBackward, (int[]){dy, scores, labels}, 3,
                           (const char *[]){r > 2 ? tp_grad_tmp_name(a, x) : tp_grad_contrib_name(a, x)}, 1);
    tp_set_attr_float(a->m, op, "denominator", denominator);
    int g = tp_grad_end(a, op, NULL);
    if (r > 2) {
      op = tp_grad_begin(a, TP_OP_Transpose, &g, 1, (const char *[]){tp_grad_contrib_name(a, x)}, 1);
      tp_set_attr_ints(a->m, op, "perm", back, r);
      g = tp_grad_end(a, op, NULL);
    }
    tp_grad_give(a, x, g);
    return;
  }
  /* NLL: onehot = Equal(labels as [N, 1, d...], classes [1, C, 1...]) */
  TpType col = lt, classes = {.dtype = lt.dtype, .rank = xt.rank};
  col.rank = xt.rank;
  col.dims[0] = lt.dims[0];
  col.dimnames[0] = lt.dimnames[0];
  col.dims[1] = 1;
  col.dimnames[1] = NULL;
  for (int i = 2; i < xt.rank; i++) col.dims[i] = lt.dims[i - 1], col.dimnames[i] = lt.dimnames[i - 1];
  for (int i = 0; i < xt.rank; i++) classes.dims[i] = i == 1 ? xt.dims[1] : 1;
  int64_t nclasses = xt.dims[1];
  size_t size = tp_dtype_size(lt.dtype);
  uint8_t *iota = malloc((size_t)nclasses * size + 1);
  TP_ASSERT(iota);
  for (int64_t c = 0; c < nclasses; c++) {
    int32_t c32 = (int32_t)c;
    if (size == 8) memcpy(iota + c * 8, &c, 8);
    else memcpy(iota + c * 4, &c32, 4);
  }
  int cls = tp_add_const(a->m, tp_unique_name(a->m, tp_strfmt(a->m, "%s.classes", name_of(a, x))), classes, iota,
                         (TpOrigin){0});
  free(iota);
  int lab = tp_grad_emit(a, TP_OP_Reshape, &labels, 1, tp_grad_tmp_name(a, x), &col);
  int onehot = tp_grad_emit2(a, TP_OP_Equal, lab, cls, tp_grad_tmp_name(a, x));
  TpDType dt = xt.dtype;
  int scale = tp_grad_emit2(a, TP_OP_Div, dy, tp_grad_scalar(a, dt, denominator), tp_grad_tmp_name(a, x));
  scale = tp_grad_emit(a, TP_OP_Neg, &scale, 1, tp_grad_tmp_name(a, x), NULL);
  tp_grad_give_elementwise(a, x, TP_OP_Where, (int[]){onehot, scale, tp_grad_scalar(a, dt, 0)}, 3);
}

/* with Stats and Part: the whole derivative (ir/ops.def) */
static void grad_cross_entropy(TpGradCtx *a, const TpGradOp *fwd) {
  int nin = fwd->nin;
  const int *in = fwd->in;
  int dy = fwd->dy, x = fwd->x;
  int op = tp_grad_begin(a, TP_OP_CrossEntropyBackward,
                         (int[]){dy, in[0], in[1], nin > 2 ? in[2] : -1, nin > 3 ? in[3] : -1}, nin > 2 ? 5 : 3,
                         (const char *[]){tp_grad_contrib_name(a, x)}, 1);
  tp_grad_copy_attrs(a, op);
  tp_grad_give(a, x, tp_grad_end(a, op, NULL));
}

static void grad_onnx_loss(TpGradCtx *a, const TpGradOp *fwd) {
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy;
  if (need[0]) loss_backward(a, in, dy);
}

/* ---- token axes ---- */

/* Logits [..., V], Targets [...], Stats? [..., P + 1] */
static void axes_cross_entropy(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = o->inputs[0];
  int rx = value_type(m, X)->rank;
  axes_all(m, x, X, o->inputs[1]);
  if (o->ninputs > 2) axes_all(m, x, X, o->inputs[2]);
  axes_mix(x, X, rx - 1, "reduces over");
}

/* Logits [..., V], Targets [...] -> [..., P + 1] */
static void axes_cross_entropy_stats(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = o->inputs[0], Y = o->outputs[0];
  int rx = value_type(m, X)->rank;
  axes_all(m, x, X, o->inputs[1]), axes_all(m, x, X, Y);
  axes_mix(x, X, rx - 1, "reduces over");
}

/* scores [N, C, d...], labels [N, d...] */
static void axes_onnx_loss(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = o->inputs[0];
  int rx = value_type(m, X)->rank;
  int labels = o->inputs[1];
  axes_link(x, X, 0, labels, 0);
  for (int k = 2; k < rx; k++) axes_link(x, X, k, labels, k - 1);
  axes_mix(x, X, 1, "reduces over");
  if (o->noutputs > 1) axes_all(m, x, X, o->outputs[1]);
}

/* ---- kernel binders ---- */

/* CrossEntropy(Logits[..., V], Targets) {denominator, vocab_pad} and
 * CrossEntropyBackward(dLoss, Logits, Targets): R rows of V, the last vocab_pad of them
 * padding (the _PAD kernels). */
static int bind_cross_entropy(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  bool fwd = m->ops[op].kind == TP_OP_CrossEntropy;
  if (m->ops[op].ninputs > (fwd ? 2 : 3)) return tp_bind_vocab(m, op, in, out, b, d);
  const TpTensor *logits = fwd ? &in[0] : &in[1], *targets = fwd ? &in[1] : &in[2];
  if (logits->rank < 1) return shape_error(m, op, d);
  int64_t V = last_dim(logits), R = numel_from(logits, 0, logits->rank - 1);
  if (tp_tensor_numel(targets) != R || tp_tensor_numel(&out[0]) != (fwd ? 1 : R * V) ||
      (!fwd && tp_tensor_numel(&in[0]) != 1))
    return shape_error(m, op, d);
  int64_t pad = tp_attr_int(m, op, "vocab_pad", 0);
  b->kernel = fwd ? (pad ? TP_K_CROSS_ENTROPY_PAD : TP_K_CROSS_ENTROPY)
                  : (pad ? TP_K_CROSS_ENTROPY_BACKWARD_PAD : TP_K_CROSS_ENTROPY_BACKWARD);
  b->a.cross_entropy = (TpCrossEntropyArgs){fwd ? NULL : &in[0],
                                            logits,
                                            targets,
                                            R,
                                            V,
                                            pad,
                                            (float)tp_attr_float(m, op, "denominator", (double)R),
                                            &out[0],
                                            &b->bad};
  return TP_OK;
}

/* SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (X [N, C, d1...], Labels, Weight)
 * {reduction, ignore_index} -> Loss (and LogProb). */
static int bind_loss(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  const char *red = tp_attr_string(m, op, "reduction", "mean");
  TpLossArgs *a = &b->a.nll_loss;
  *a = (TpLossArgs){0};
  if (strcmp(red, "none") == 0) a->o.reduction = TP_REDUCE_NONE;
  else if (strcmp(red, "sum") == 0) a->o.reduction = TP_REDUCE_SUM;
  else if (strcmp(red, "mean") == 0) a->o.reduction = TP_REDUCE_MEAN;
  else return tp_error_op(d, m, op, "unknown reduction '%s'", red);
  a->o.has_ignore = tp_get_attr(m, op, "ignore_index") != NULL;
  a->o.ignore_index = tp_attr_int(m, op, "ignore_index", 0);
  const TpTensor *x = &in[0];
  if (x->rank < 1) return shape_error(m, op, d);
  a->x = x, a->target = &in[1], a->weight = opt_in(m, op, in, 2);
  a->N = x->dims[0], a->C = x->rank > 1 ? x->dims[1] : 1, a->D = numel_from(x, 2, x->rank);
  if (tp_tensor_numel(&in[1]) != a->N * a->D || (a->weight && tp_tensor_numel(a->weight) != a->C))
    return shape_error(m, op, d);
  a->loss = &out[0];
  a->bad = &b->bad;
  bool sce = m->ops[op].kind == TP_OP_SoftmaxCrossEntropyLoss;
  a->log_prob = sce ? opt_out(m, op, out, 1) : NULL;
  b->kernel = sce ? TP_K_SOFTMAX_CROSS_ENTROPY : TP_K_NLL_LOSS;
  return TP_OK;
}

/* ---- rule sets ---- */

const TpOpRules tp_rules_SoftmaxCrossEntropyLoss = {
    .infer = infer_loss,
    .flops = flops_cross_entropy,
    .gradient = grad_onnx_loss,
    .token_axes = axes_onnx_loss,
    .bind = TP_BINDING(bind_loss, TP_BIND_F32_COPY, 1u << 1, 2),
};
const TpOpRules tp_rules_NegativeLogLikelihoodLoss = {
    .infer = infer_loss,
    .gradient = grad_onnx_loss,
    .token_axes = axes_onnx_loss,
    .bind = TP_BINDING(bind_loss, TP_BIND_F32_COPY, 1u << 1, 2),
};
const TpOpRules tp_rules_CrossEntropy = {
    .infer = infer_cross_entropy,
    .flops = flops_cross_entropy,
    .gradient = grad_cross_entropy,
    .token_axes = axes_cross_entropy,
    .bind = TP_BINDING(bind_cross_entropy, TP_BIND_F32, 1u << 1 | 1u << 3, 2),
};
const TpOpRules tp_rules_CrossEntropyStats = {
    .infer = infer_cross_entropy_stats,
    .token_axes = axes_cross_entropy_stats,
    .bind = TP_BINDING(tp_bind_vocab, TP_BIND_F32, 1u << 1 | 1u << 2, 2),
};
const TpOpRules tp_rules_CrossEntropyBackward = {
    .infer = infer_cross_entropy_backward,
    .bind = TP_BINDING(bind_cross_entropy, TP_BIND_F32, 1u << 2 | 1u << 4, 3),
};
