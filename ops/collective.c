/* Tensor-parallel collectives: AllReduce, TensorCopy, and TensorRank (a rank's
 * index in its group).
 *
 * Each op's rule set, tp_rules_<Op> (ops/rules.h), is at the end of the file; the hooks
 * it names are above it. */
#include "axes.h"
#include "grad.h"
#include "infer.h"

/* ---- shape rules ---- */

static int infer_tensor_rank(const TpInferCtx *c) {
  if (!tp_get_attr(c->m, c->op, "group"))
    return tp_error_op(c->d, c->m, c->op, "TensorRank needs its group attribute");
  return set_result(c, 0, (TpType){.dtype = TP_I64});
}

/* AllReduce and TensorCopy: a float operand, the result of its type; the group is named. */
static int infer_collective(const TpInferCtx *c) {
  const TpType *x = operand(c, 0);
  if (need_float(c, x, "X")) return TP_ERR_INPUT;
  if (!tp_get_attr(c->m, c->op, "group"))
    return tp_error_op(c->d, c->m, c->op, "a collective needs its group attribute");
  return set_result(c, 0, *x);
}

/* ---- gradients ---- */

/* every rank's partial sum counts once in the sum: dX = dY */
static void grad_all_reduce(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  tp_grad_give_value(a, x, dy);
}

/* each rank's dX is partial (its columns only): sum them */
static void grad_tensor_copy(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  tp_grad_give_op(a, x, TP_OP_AllReduce, &dy, 1, false, true);
}

/* ---- token axes ---- */

/* the tensor-parallel collectives sum or copy across the ranks, position by position:
 * every axis kept */
static void axes_collective(const TpModule *m, int op, TpOpAxes *x) {
  int X = m->ops[op].inputs[0], Y = m->ops[op].outputs[0];
  axes_all(m, x, X, Y);
}

/* ---- rule sets ---- */

const TpOpRules tp_rules_AllReduce = {
    .infer = infer_collective,
    .gradient = grad_all_reduce,
    .token_axes = axes_collective,
};
const TpOpRules tp_rules_TensorCopy = {
    .infer = infer_collective,
    .gradient = grad_tensor_copy,
    .token_axes = axes_collective,
};
const TpOpRules tp_rules_TensorRank = {.infer = infer_tensor_rank};
