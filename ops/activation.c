/* Activations: GELU, softmax and log-softmax over an axis, the fused gated MLPs SwiGLU
 * (silu(gate) * up) and GeGLU (gelu(gate) * up, Gemma's), and their backward ops.
 *
 * Each op's rule set, tp_rules_<Op> (ops/rules.h), is at the end of the file; the hooks
 * it names are above it. */
#include "axes.h"
#include "bind.h"
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

/* SwiGLU and GeGLU: Gate and Up of one float shape. */
static int infer_gated(const TpInferCtx *c) {
  const TpType *gate = operand(c, 0), *up = operand(c, 1);
  if (need_float(c, gate, "Gate") || same_dtype(c, gate, up)) return TP_ERR_INPUT;
  if (!tp_type_equal(gate, up)) return tp_error_op(c->d, c->m, c->op, "Gate and Up must have one shape");
  return set_result(c, 0, *gate);
}

static int infer_gated_backward(const TpInferCtx *c) {
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

/* The Gelu and Mul it fuses, so stages cut as they did unfused. */
static double flops_geglu(const TpModule *m, int op) { return 9 * tp_flops_per_result(m, op); }

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

static void grad_swiglu(TpGradCtx *a, const TpGradOp *fwd) { tp_grad_one_op(a, fwd, TP_OP_SwiGLUBackward, false); }

static void grad_geglu(TpGradCtx *a, const TpGradOp *fwd) { /* the form goes with the attributes */
  tp_grad_one_op(a, fwd, TP_OP_GeGLUBackward, false);
}

/* ---- token axes ---- */

static void axes_softmax(const TpModule *m, int op, TpOpAxes *x) {
  int X = m->ops[op].inputs[0], Y = m->ops[op].outputs[0];
  int rx = value_type(m, X)->rank;
  axes_all(m, x, X, Y);
  axes_mix(x, X, (int)tp_attr_int(m, op, "axis", rx - 1), "normalises over");
}

static void axes_gated(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = o->inputs[0], Y = o->outputs[0];
  axes_all(m, x, X, Y), axes_all(m, x, o->inputs[1], Y);
}

/* ---- tensor-parallel split ---- */

static int split_gated(TpSplitCtx *s, int op) { return tp_split_positionwise(s, op, NULL); }

/* ---- kernel binders ---- */

/* Softmax, LogSoftmax {axis} and their backward (dY, Y). */
static int bind_softmax(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  TpOpKind k = m->ops[op].kind;
  bool fwd = k == TP_OP_Softmax || k == TP_OP_LogSoftmax;
  const TpTensor *y = fwd ? &in[0] : &in[1]; /* the shape */
  int axis = (int)tp_attr_int(m, op, "axis", y->rank - 1);
  int64_t n = tp_tensor_numel(y);
  if (axis < 0 || axis >= y->rank || tp_tensor_numel(&in[0]) != n || tp_tensor_numel(&out[0]) != n)
    return shape_error(m, op, d);
  b->kernel = fwd ? TP_K_SOFTMAX : TP_K_SOFTMAX_BACKWARD;
  b->a.softmax = (TpSoftmaxArgs){&in[0],
                                 fwd ? NULL : &in[1],
                                 &out[0],
                                 numel_from(y, 0, axis),
                                 y->dims[axis],
                                 numel_from(y, axis + 1, y->rank),
                                 k == TP_OP_LogSoftmax || k == TP_OP_LogSoftmaxBackward};
  return TP_OK;
}

static int bind_gelu_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  bool tanh_approx;
  int rc = gelu_tanh(m, op, &tanh_approx, d);
  if (rc) return rc;
  int64_t n = tp_tensor_numel(&in[1]);
  if (tp_tensor_numel(&in[0]) != n || tp_tensor_numel(&out[0]) != n) return shape_error(m, op, d);
  b->kernel = TP_K_GELU_BACKWARD;
  b->a.gelu_backward = (TpGeluBackwardArgs){&in[0], &in[1], n, tanh_approx, &out[0]};
  return TP_OK;
}

/* A gated MLP's operands, (Gate, Up) or (dY, Gate, Up): Gate, Up and Y (or dY) of one size
 * n, else a shape error. */
static int gated_operands(const TpModule *m, int op, bool fwd, const TpTensor *in, const TpTensor *out,
                          const TpTensor **gate, const TpTensor **up, int64_t *n, TpDiag *d) {
  *gate = fwd ? &in[0] : &in[1], *up = fwd ? &in[1] : &in[2];
  *n = tp_tensor_numel(*gate);
  if (tp_tensor_numel(*up) != *n || (fwd ? tp_tensor_numel(&out[0]) : tp_tensor_numel(&in[0])) != *n)
    return shape_error(m, op, d);
  return TP_OK;
}

/* SwiGLU(Gate, Up) and SwiGLUBackward(dY, Gate, Up) -> dGate, dUp. */
static int bind_swiglu(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  bool fwd = m->ops[op].kind == TP_OP_SwiGLU;
  const TpTensor *gate, *up;
  int64_t n;
  int rc = gated_operands(m, op, fwd, in, out, &gate, &up, &n, d);
  if (rc) return rc;
  b->kernel = fwd ? TP_K_SWIGLU : TP_K_SWIGLU_BACKWARD;
  b->a.swiglu =
      (TpSwiGLUArgs){fwd ? NULL : &in[0], gate, up, n, opt_out(m, op, out, 0), fwd ? NULL : opt_out(m, op, out, 1)};
  return TP_OK;
}

/* GeGLU(Gate, Up) and GeGLUBackward(dY, Gate, Up) -> dGate, dUp, {approximate} as Gelu's. */
static int bind_geglu(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  bool fwd = m->ops[op].kind == TP_OP_GeGLU, tanh_approx;
  const TpTensor *gate, *up;
  int64_t n;
  int rc = gelu_tanh(m, op, &tanh_approx, d);
  if (!rc) rc = gated_operands(m, op, fwd, in, out, &gate, &up, &n, d);
  if (rc) return rc;
  b->kernel = fwd ? TP_K_GEGLU : TP_K_GEGLU_BACKWARD;
  b->a.geglu = (TpGeGLUArgs){fwd ? NULL : &in[0],
                             gate,
                             up,
                             n,
                             tanh_approx,
                             opt_out(m, op, out, 0),
                             fwd ? NULL : opt_out(m, op, out, 1)};
  return TP_OK;
}

/* ---- rule sets ---- */

const TpOpRules tp_rules_Gelu = {
    TP_ELEMENTWISE_RULES,
    .flops = flops_gelu,
    .gradient = grad_gelu,
    .bind = TP_BINDING(tp_bind_unary, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_Softmax = {
    .infer = infer_softmax,
    .flops = flops_softmax,
    .gradient = grad_softmax,
    .token_axes = axes_softmax,
    .bind = TP_BINDING(bind_softmax, TP_BIND_F32_COPY, 0, 0),
};
const TpOpRules tp_rules_LogSoftmax = {
    .infer = infer_softmax,
    .flops = flops_softmax,
    .gradient = grad_log_softmax,
    .token_axes = axes_softmax,
    .bind = TP_BINDING(bind_softmax, TP_BIND_F32_COPY, 0, 0),
};
const TpOpRules tp_rules_SwiGLU = {
    .infer = infer_gated,
    .gradient = grad_swiglu,
    .token_axes = axes_gated,
    .tensor_split = split_gated,
    .bind = TP_TRAINING_BINDING(bind_swiglu),
};
const TpOpRules tp_rules_GeGLU = {
    .infer = infer_gated,
    .flops = flops_geglu,
    .gradient = grad_geglu,
    .token_axes = axes_gated,
    .tensor_split = split_gated,
    .bind = TP_TRAINING_BINDING(bind_geglu),
};
const TpOpRules tp_rules_GeluBackward = {
    .infer = infer_unary_backward,
    .bind = TP_TRAINING_BINDING(bind_gelu_backward),
};
const TpOpRules tp_rules_SoftmaxBackward = {
    .infer = infer_unary_backward,
    .bind = TP_TRAINING_BINDING(bind_softmax),
};
const TpOpRules tp_rules_LogSoftmaxBackward = {
    .infer = infer_unary_backward,
    .bind = TP_TRAINING_BINDING(bind_softmax),
};
const TpOpRules tp_rules_SwiGLUBackward = {
    .infer = infer_gated_backward,
    .bind = TP_TRAINING_BINDING(bind_swiglu),
};
const TpOpRules tp_rules_GeGLUBackward = {
    .infer = infer_gated_backward,
    .bind = TP_TRAINING_BINDING(bind_geglu),
};
