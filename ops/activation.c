/* Activations: GELU, softmax and log-softmax over an axis, the fused SwiGLU
 * (silu(gate) * up), and their backward ops.
 *
 * Each op's rule set, tp_rules_<Op> (ops/rules.h), is at the end of the file; the hooks
 * it names are above it. */
#include "axes.h"
#include "grad.h"
#include "infer.h"
#include "split.h"

/* ---- shape rules ---- */

static int infer_softmax(const TpInferCtx *c) {
  const TpType *x = operand(c, 0);
  if (need_float(c, x, "the operand") || check_axis(c, tp_attr_int(c->m, c->op, "axis", -1), x->rank, "axis"))
    return TP_ERR_INPUT;
  return set_result(c, 0, *x);
}

static int infer_unary_backward(const TpInferCtx *c) { /* dY and the forward operand or result */
  const TpType *dy = operand(c, 0), *x = operand(c, 1);
  if (need_float(c, x, "the operand") || check_grad(c, dy, x)) return TP_ERR_INPUT;
  if ((c->m->ops[c->op].kind == TP_OP_SoftmaxBackward || c->m->ops[c->op].kind == TP_OP_LogSoftmaxBackward) &&
      check_axis(c, tp_attr_int(c->m, c->op, "axis", -1), x->rank, "axis"))
    return TP_ERR_INPUT;
  return set_result(c, 0, *x);
}

static int infer_swiglu(const TpInferCtx *c) {
  const TpType *gate = operand(c, 0), *up = operand(c, 1);
  if (need_float(c, gate, "Gate") || same_dtype(c, gate, up)) return TP_ERR_INPUT;
  if (!tp_type_equal(gate, up)) return tp_error_op(c->d, c->m, c->op, "Gate and Up must have one shape");
  return set_result(c, 0, *gate);
}

static int infer_swiglu_backward(const TpInferCtx *c) {
  const TpType *dy = operand(c, 0), *gate = operand(c, 1), *up = operand(c, 2);
  if (need_float(c, gate, "Gate") || same_dtype(c, gate, up)) return TP_ERR_INPUT;
  if (!tp_type_equal(gate, up)) return tp_error_op(c->d, c->m, c->op, "Gate and Up must have one shape");
  if (check_grad(c, dy, gate)) return TP_ERR_INPUT;
  return set_results_like(c, 1, 2);
}

/* ---- FLOPs ---- */

/* about 8 FLOPs per element (the erf or tanh form) */
static double flops_gelu(const TpModule *m, int op) { return 8 * tp_flops_per_result(m, op); }

static double flops_softmax(const TpModule *m, int op) { return 5 * tp_flops_per_result(m, op); }

/* ---- gradients ---- */

static void grad_gelu(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  tp_grad_give_op(a, x, TP_OP_GeluBackward, (int[]){dy, x}, 2, false, true);
}

static void grad_softmax(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, y = fwd->y, x = fwd->x;
  tp_grad_give_op(a, x, TP_OP_SoftmaxBackward, (int[]){dy, y}, 2, false, true);
}

static void grad_log_softmax(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, y = fwd->y, x = fwd->x;
  tp_grad_give_op(a, x, TP_OP_LogSoftmaxBackward, (int[]){dy, y}, 2, false, true);
}

static void grad_swiglu(TpGradCtx *a, const TpGradOp *fwd) {
  tp_grad_one_op(a, fwd, TP_OP_SwiGLUBackward, false);
}

/* ---- token axes ---- */

static void axes_softmax(const TpModule *m, int op, TpOpAxes *x) {
  int X = m->ops[op].inputs[0], Y = m->ops[op].outputs[0];
  int rx = value_type(m, m->ops[op].inputs[0])->rank;
  axes_all(m, x, X, Y);
  axes_mix(x, X, (int)tp_attr_int(m, op, "axis", rx - 1), "normalises over");
}

static void axes_swiglu(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = m->ops[op].inputs[0], Y = m->ops[op].outputs[0];
  axes_all(m, x, X, Y), axes_all(m, x, o->inputs[1], Y);
}

/* ---- tensor-parallel split ---- */

static int split_swiglu(TpSplitCtx *s, int op) { return tp_split_positionwise(s, op, NULL); }

/* ---- rule sets ---- */

const TpOpRules tp_rules_Gelu = {.infer = tp_infer_elementwise, .flops = flops_gelu, .gradient = grad_gelu, .token_axes = tp_axes_elementwise, .tensor_split = tp_split_elementwise};
const TpOpRules tp_rules_Softmax = {.infer = infer_softmax, .flops = flops_softmax, .gradient = grad_softmax, .token_axes = axes_softmax};
const TpOpRules tp_rules_LogSoftmax = {.infer = infer_softmax, .flops = flops_softmax, .gradient = grad_log_softmax, .token_axes = axes_softmax};
const TpOpRules tp_rules_SwiGLU = {.infer = infer_swiglu, .gradient = grad_swiglu, .token_axes = axes_swiglu, .tensor_split = split_swiglu};
const TpOpRules tp_rules_GeluBackward = {.infer = infer_unary_backward};
const TpOpRules tp_rules_SoftmaxBackward = {.infer = infer_unary_backward};
const TpOpRules tp_rules_LogSoftmaxBackward = {.infer = infer_unary_backward};
const TpOpRules tp_rules_SwiGLUBackward = {.infer = infer_swiglu_backward};
