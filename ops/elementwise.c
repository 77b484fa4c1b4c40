/* Elementwise ops: the numpy-broadcasting arithmetic, comparisons and logic,
 * the pointwise math functions, Where and Cast.
 *
 * Each op's rule set, tp_rules_<Op> (ops/rules.h), is at the end of the file; the hooks
 * it names are above it. */
#include "infer.h"

/* ---- shape rules ---- */

int tp_infer_elementwise(const TpInferCtx *c) {
  TpOpKind kind = c->m->ops[c->op].kind;
  const TpType *a = operand(c, 0), *b = operand(c, 1);
  TpType t = *a;
  if (b) {
    if (kind != TP_OP_Pow && same_dtype(c, a, b)) return TP_ERR_INPUT;
    if (broadcast(c, a, b, &t)) return TP_ERR_INPUT;
  }
  switch (kind) {
  case TP_OP_Not:
  case TP_OP_And:
    if (a->dtype != TP_BOOL) return tp_error_op(c->d, c->m, c->op, "operands must be bool");
    break;
  case TP_OP_Sqrt: case TP_OP_Reciprocal: case TP_OP_Exp: case TP_OP_Log: case TP_OP_Erf:
  case TP_OP_Tanh: case TP_OP_Sigmoid: case TP_OP_Gelu: case TP_OP_Sin: case TP_OP_Cos:
    if (need_float(c, a, "the operand")) return TP_ERR_INPUT;
    break;
  case TP_OP_Pow: case TP_OP_Max: case TP_OP_Min:
    if (b->dtype == TP_BOOL || a->dtype == TP_BOOL)
      return tp_error_op(c->d, c->m, c->op, "operands must be numeric");
    break;
  default:
    break;
  }
  if (tp_op_info[kind].traits & TP_TRAIT_BOOL_RESULT) t.dtype = TP_BOOL;
  return set_result(c, 0, t);
}

static int infer_where(const TpInferCtx *c) {
  const TpType *cond = operand(c, 0), *x = operand(c, 1), *y = operand(c, 2);
  if (cond->dtype != TP_BOOL) return tp_error_op(c->d, c->m, c->op, "condition must be bool");
  if (same_dtype(c, x, y)) return TP_ERR_INPUT;
  TpType xy, t;
  if (broadcast(c, x, y, &xy) || broadcast(c, cond, &xy, &t)) return TP_ERR_INPUT;
  t.dtype = x->dtype;
  return set_result(c, 0, t);
}

static int infer_cast(const TpInferCtx *c) {
  const TpType *x = operand(c, 0), *r = preset(c, 0);
  if (!r) return TP_ERR_INPUT;
  TpType t = *x;
  t.dtype = r->dtype;
  return set_result(c, 0, t);
}

/* ---- rule sets ---- */

const TpOpRules tp_rules_Add = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Sub = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Mul = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Div = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Pow = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Max = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Min = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Sqrt = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Neg = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Reciprocal = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Exp = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Log = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Erf = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Tanh = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Relu = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Sigmoid = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Sin = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Cos = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Not = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_And = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Equal = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Less = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_LessOrEqual = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Greater = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_GreaterOrEqual = {.infer = tp_infer_elementwise};
const TpOpRules tp_rules_Where = {.infer = infer_where};
const TpOpRules tp_rules_Cast = {.infer = infer_cast};
