/* Elementwise ops: the numpy-broadcasting arithmetic, comparisons and logic,
 * the pointwise math functions, Where and Cast.
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
  case TP_OP_Sqrt:
  case TP_OP_Reciprocal:
  case TP_OP_Exp:
  case TP_OP_Log:
  case TP_OP_Erf:
  case TP_OP_Tanh:
  case TP_OP_Sigmoid:
  case TP_OP_Gelu:
  case TP_OP_Sin:
  case TP_OP_Cos:
    if (need_float(c, a, "the operand")) return TP_ERR_INPUT;
    break;
  case TP_OP_Pow:
  case TP_OP_Max:
  case TP_OP_Min:
    if (b->dtype == TP_BOOL || a->dtype == TP_BOOL)
      return tp_error_op(c->d, c->m, c->op, "operands must be numeric");
    break;
  default: break;
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

/* ---- gradients ---- */

/* The one element of a CONST, as a double; false if v is not such a constant. */
static bool const_scalar(const TpModule *m, int v, double *out) {
  const TpValue *val = &m->values[v];
  if (val->kind != TP_VAL_CONST || tp_type_numel(&val->type) != 1) return false;
  const uint8_t *p = tp_value_data(m, v);
  union {
    float f;
    double d;
    uint16_t h;
    int32_t i32;
    int64_t i64;
  } u;
  memcpy(&u, p, tp_dtype_size(val->type.dtype));
  switch (val->type.dtype) {
  case TP_F32: *out = u.f; return true;
  case TP_F64: *out = u.d; return true;
  case TP_F16: *out = tp_f16_to_f32(u.h); return true;
  case TP_BF16: *out = tp_bf16_to_f32(u.h); return true;
  case TP_I32: *out = u.i32; return true;
  case TP_I64: *out = (double)u.i64; return true;
  default: return false;
  }
}

static void grad_add(TpGradCtx *a, const TpGradOp *fwd) {
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy;
  for (int i = 0; i < 2; i++)
    if (need[i]) tp_grad_give_value(a, in[i], dy);
}

static void grad_sub(TpGradCtx *a, const TpGradOp *fwd) {
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy;
  if (need[0]) tp_grad_give_value(a, in[0], dy);
  if (need[1]) tp_grad_give_unary(a, in[1], TP_OP_Neg, dy);
}

static void grad_mul(TpGradCtx *a, const TpGradOp *fwd) {
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy;
  if (need[0]) tp_grad_give_binary(a, in[0], TP_OP_Mul, dy, in[1]);
  if (need[1]) tp_grad_give_binary(a, in[1], TP_OP_Mul, dy, in[0]);
}

/* d/db a/b = -y/b */
static void grad_div(TpGradCtx *a, const TpGradOp *fwd) {
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy, y = fwd->y;
  if (need[0]) tp_grad_give_binary(a, in[0], TP_OP_Div, dy, in[1]);
  if (need[1]) {
    int t = tp_grad_emit2(a, TP_OP_Div, y, in[1], tp_grad_tmp_name(a, in[1]));
    t = tp_grad_emit2(a, TP_OP_Mul, dy, t, tp_grad_tmp_name(a, in[1]));
    tp_grad_give_unary(a, in[1], TP_OP_Neg, t);
  }
}

/* d/da a^b = b a^(b-1); d/db = y log(a) */
static void grad_pow(TpGradCtx *a, const TpGradOp *fwd) {
  TpModule *m = a->m;
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy, y = fwd->y, x = fwd->x;
  TpDType dt = fwd->dt;
  int b = in[1];
  double c;
  if (need[0]) {
    int t;
    if (const_scalar(m, b, &c) && c == 2) {
      t = tp_grad_emit2(a, TP_OP_Mul, x, tp_grad_scalar(a, dt, 2), tp_grad_tmp_name(a, x));
    } else if (const_scalar(m, b, &c)) {
      t = tp_grad_emit2(a, TP_OP_Pow, x, tp_grad_scalar(a, dt, c - 1), tp_grad_tmp_name(a, x));
      t = tp_grad_emit2(a, TP_OP_Mul, t, tp_grad_scalar(a, dt, c), tp_grad_tmp_name(a, x));
    } else {
      int bf = b;
      if (type_of(a, b).dtype != dt) {
        TpType bt = type_of(a, b);
        bt.dtype = dt;
        bf = tp_grad_emit(a, TP_OP_Cast, &b, 1, tp_grad_tmp_name(a, x), &bt);
      }
      t = tp_grad_emit2(a, TP_OP_Sub, bf, tp_grad_scalar(a, dt, 1), tp_grad_tmp_name(a, x));
      t = tp_grad_emit2(a, TP_OP_Pow, x, t, tp_grad_tmp_name(a, x));
      t = tp_grad_emit2(a, TP_OP_Mul, t, bf, tp_grad_tmp_name(a, x));
    }
    tp_grad_give_binary(a, x, TP_OP_Mul, dy, t);
  }
  if (need[1]) {
    if (type_of(a, b).dtype != dt) {
      tp_grad_cannot(a, "the exponent's type differs from the base's");
      return;
    }
    int t = tp_grad_emit(a, TP_OP_Log, &x, 1, tp_grad_tmp_name(a, b), NULL);
    t = tp_grad_emit2(a, TP_OP_Mul, y, t, tp_grad_tmp_name(a, b));
    tp_grad_give_binary(a, b, TP_OP_Mul, dy, t);
  }
}

/* dy / (2 y) */
static void grad_sqrt(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, y = fwd->y, x = fwd->x;
  TpDType dt = fwd->dt;
  tp_grad_give_binary(a, x, TP_OP_Div, dy,
                      tp_grad_emit2(a, TP_OP_Mul, y, tp_grad_scalar(a, dt, 2), tp_grad_tmp_name(a, x)));
}

static void grad_neg(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  tp_grad_give_unary(a, x, TP_OP_Neg, dy);
}

/* -dy y^2 */
static void grad_reciprocal(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, y = fwd->y, x = fwd->x;
  int t = tp_grad_emit2(a, TP_OP_Mul, y, y, tp_grad_tmp_name(a, x));
  t = tp_grad_emit2(a, TP_OP_Mul, dy, t, tp_grad_tmp_name(a, x));
  tp_grad_give_unary(a, x, TP_OP_Neg, t);
}

static void grad_exp(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, y = fwd->y, x = fwd->x;
  tp_grad_give_binary(a, x, TP_OP_Mul, dy, y);
}

static void grad_log(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  tp_grad_give_binary(a, x, TP_OP_Div, dy, x);
}

/* dy 2/sqrt(pi) exp(-x^2) */
static void grad_erf(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  TpDType dt = fwd->dt;
  int t = tp_grad_emit2(a, TP_OP_Mul, x, x, tp_grad_tmp_name(a, x));
  t = tp_grad_emit(a, TP_OP_Neg, &t, 1, tp_grad_tmp_name(a, x), NULL);
  t = tp_grad_emit(a, TP_OP_Exp, &t, 1, tp_grad_tmp_name(a, x), NULL);
  t = tp_grad_emit2(a, TP_OP_Mul, t, tp_grad_scalar(a, dt, 1.1283791670955126), tp_grad_tmp_name(a, x));
  tp_grad_give_binary(a, x, TP_OP_Mul, dy, t);
}

/* dy (1 - y^2) */
static void grad_tanh(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, y = fwd->y, x = fwd->x;
  TpDType dt = fwd->dt;
  int t = tp_grad_emit2(a, TP_OP_Mul, y, y, tp_grad_tmp_name(a, x));
  t = tp_grad_emit2(a, TP_OP_Sub, tp_grad_scalar(a, dt, 1), t, tp_grad_tmp_name(a, x));
  tp_grad_give_binary(a, x, TP_OP_Mul, dy, t);
}

/* dy y (1 - y) */
static void grad_sigmoid(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, y = fwd->y, x = fwd->x;
  TpDType dt = fwd->dt;
  int t = tp_grad_emit2(a, TP_OP_Sub, tp_grad_scalar(a, dt, 1), y, tp_grad_tmp_name(a, x));
  t = tp_grad_emit2(a, TP_OP_Mul, y, t, tp_grad_tmp_name(a, x));
  tp_grad_give_binary(a, x, TP_OP_Mul, dy, t);
}

/* dy cos x */
static void grad_sin(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  tp_grad_give_binary(a, x, TP_OP_Mul, dy, tp_grad_emit(a, TP_OP_Cos, &x, 1, tp_grad_tmp_name(a, x), NULL));
}

/* -dy sin x */
static void grad_cos(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  int t = tp_grad_emit(a, TP_OP_Sin, &x, 1, tp_grad_tmp_name(a, x), NULL);
  t = tp_grad_emit2(a, TP_OP_Mul, dy, t, tp_grad_tmp_name(a, x));
  tp_grad_give_unary(a, x, TP_OP_Neg, t);
}

/* dy to the operand chosen; a tie splits it equally, as torch.maximum */
static void grad_max_min(TpGradCtx *a, const TpGradOp *fwd) {
  TpOpKind kind = a->m->ops[a->fwd].kind;
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy, x = fwd->x;
  TpDType dt = fwd->dt;
  int tie = -1;
  for (int i = 0; i < 2; i++) {
    if (!need[i]) continue;
    if (tie < 0) {
      int eq = tp_grad_emit2(a, TP_OP_Equal, in[0], in[1], tp_grad_tmp_name(a, x));
      int half = tp_grad_emit2(a, TP_OP_Mul, dy, tp_grad_scalar(a, dt, 0.5), tp_grad_tmp_name(a, x));
      tie = tp_grad_emit(a, TP_OP_Where, (int[]){eq, half, tp_grad_scalar(a, dt, 0)}, 3, tp_grad_tmp_name(a, x),
                         NULL);
    }
    int wins = tp_grad_emit2(a, kind == TP_OP_Max ? TP_OP_Greater : TP_OP_Less, in[i], in[1 - i],
                             tp_grad_tmp_name(a, in[i]));
    tp_grad_give_elementwise(a, in[i], TP_OP_Where, (int[]){wins, dy, tie}, 3);
  }
}

static void grad_relu(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, y = fwd->y, x = fwd->x;
  TpDType dt = fwd->dt;
  int pos = tp_grad_emit2(a, TP_OP_Greater, y, tp_grad_scalar(a, dt, 0), tp_grad_tmp_name(a, x));
  tp_grad_give_elementwise(a, x, TP_OP_Where, (int[]){pos, dy, tp_grad_scalar(a, dt, 0)}, 3);
}

static void grad_where(TpGradCtx *a, const TpGradOp *fwd) {
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy;
  TpDType dt = fwd->dt;
  if (need[1]) tp_grad_give_elementwise(a, in[1], TP_OP_Where, (int[]){in[0], dy, tp_grad_scalar(a, dt, 0)}, 3);
  if (need[2]) tp_grad_give_elementwise(a, in[2], TP_OP_Where, (int[]){in[0], tp_grad_scalar(a, dt, 0), dy}, 3);
}

static void grad_cast(TpGradCtx *a, const TpGradOp *fwd) {
  int dy = fwd->dy, x = fwd->x;
  tp_grad_give_op(a, x, TP_OP_Cast, &dy, 1, true, false);
}

/* ---- token axes ---- */

/* Every operand's axes broadcast to the result's (numpy, right-aligned). */
void tp_axes_elementwise(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  for (int i = 0; i < o->ninputs; i++) axes_broadcast(m, x, o->outputs[0], o->inputs[i]);
}

/* ---- tensor-parallel split ---- */

/* Positionwise ops (elementwise and fused ones): the result split as the operands, when
 * every split operand is split along one axis (aligned from the right) and the others
 * broadcast along it; `last_axis_refusal`, when set, refuses a split last axis. */
int tp_split_positionwise(TpSplitCtx *s, int op, const char *last_axis_refusal) {
  TpModule *m = s->m;
  TpOp *o = &s->m->ops[op];
  int y = o->outputs[0], x = o->inputs[0], ry = s->m->values[o->outputs[0]].type.rank;
  /* Positionwise: every split operand along one axis (aligned from the right), the others
   * broadcast along it. */
  int axis = -1, parts = 0, split = x;
  for (int i = 0; i < o->ninputs; i++) {
    int v = o->inputs[i];
    if (v < 0 || s->axis[v] < 0) continue;
    int a = s->axis[v] + ry - m->values[v].type.rank;
    split = v;
    if (axis >= 0 && (a != axis || s->parts[v] != parts))
      return tp_split_refuse(s, op, "its operands are split along different axes");
    axis = a, parts = s->parts[v];
  }
  if (last_axis_refusal && axis == ry - 1) return tp_split_refuse(s, op, last_axis_refusal);
  for (int i = 0; i < o->ninputs; i++) {
    int v = o->inputs[i];
    if (v < 0 || s->axis[v] >= 0) continue;
    int a = axis - (ry - m->values[v].type.rank);
    if (a >= 0 && m->values[v].type.dims[a] != 1)
      return tp_split_refuse(s, op,
                             tp_strfmt(m, "it combines the split %%%s with the replicated %%%s",
                                       m->values[split].name, m->values[v].name));
  }
  for (int i = 0; i < m->ops[op].ninputs; i++) /* o moves when an op is added */
    if (tp_split_share_operand(s, op, i)) return TP_ERR_INPUT;
  tp_split_mark(s, y, axis, parts);
  return tp_split_reinfer(s, op);
}

int tp_split_elementwise(TpSplitCtx *s, int op) { return tp_split_positionwise(s, op, NULL); }

/* ---- kernel binders ---- */

int tp_bind_unary(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  static const TpUnaryOp ops[TP_OP_COUNT] = {
      [TP_OP_Sqrt] = TP_UNARY_SQRT, [TP_OP_Neg] = TP_UNARY_NEG,   [TP_OP_Reciprocal] = TP_UNARY_RECIPROCAL,
      [TP_OP_Exp] = TP_UNARY_EXP,   [TP_OP_Log] = TP_UNARY_LOG,   [TP_OP_Erf] = TP_UNARY_ERF,
      [TP_OP_Tanh] = TP_UNARY_TANH, [TP_OP_Relu] = TP_UNARY_RELU, [TP_OP_Sigmoid] = TP_UNARY_SIGMOID,
      [TP_OP_Sin] = TP_UNARY_SIN,   [TP_OP_Cos] = TP_UNARY_COS,   [TP_OP_Not] = TP_UNARY_NOT,
  };
  TpUnaryOp u = ops[m->ops[op].kind];
  if (m->ops[op].kind == TP_OP_Gelu) {
    bool tanh_approx;
    int rc = gelu_tanh(m, op, &tanh_approx, d);
    if (rc) return rc;
    u = tanh_approx ? TP_UNARY_GELU_TANH : TP_UNARY_GELU;
  }
  b->kernel = TP_K_UNARY;
  b->a.unary = (TpUnaryArgs){u, &in[0], &out[0]};
  return TP_OK;
}

static int bind_binary(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  static const TpBinaryOp ops[TP_OP_COUNT] = {
      [TP_OP_Add] = TP_BINARY_ADD,
      [TP_OP_Sub] = TP_BINARY_SUB,
      [TP_OP_Mul] = TP_BINARY_MUL,
      [TP_OP_Div] = TP_BINARY_DIV,
      [TP_OP_Pow] = TP_BINARY_POW,
      [TP_OP_Max] = TP_BINARY_MAX,
      [TP_OP_Min] = TP_BINARY_MIN,
      [TP_OP_And] = TP_BINARY_AND,
      [TP_OP_Equal] = TP_BINARY_EQUAL,
      [TP_OP_Less] = TP_BINARY_LESS,
      [TP_OP_LessOrEqual] = TP_BINARY_LESS_EQUAL,
      [TP_OP_Greater] = TP_BINARY_GREATER,
      [TP_OP_GreaterOrEqual] = TP_BINARY_GREATER_EQUAL,
  };
  b->kernel = TP_K_BINARY;
  b->a.binary = (TpBinaryArgs){ops[m->ops[op].kind], &in[0], &in[1], &out[0]};
  return TP_OK;
}

static int bind_where(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)m, (void)op, (void)d;
  b->kernel = TP_K_WHERE;
  b->a.where = (TpWhereArgs){&in[0], &in[1], &in[2], &out[0]};
  return TP_OK;
}

/* ---- rule sets ---- */

#define BINARY TP_BINDING(bind_binary, TP_BIND_ANY, 0, 0)
#define UNARY TP_BINDING(tp_bind_unary, TP_BIND_ANY, 0, 0)

const TpOpRules tp_rules_Add = {TP_ELEMENTWISE_RULES, .gradient = grad_add, .bind = BINARY};
const TpOpRules tp_rules_Sub = {TP_ELEMENTWISE_RULES, .gradient = grad_sub, .bind = BINARY};
const TpOpRules tp_rules_Mul = {TP_ELEMENTWISE_RULES, .gradient = grad_mul, .bind = BINARY};
const TpOpRules tp_rules_Div = {TP_ELEMENTWISE_RULES, .gradient = grad_div, .bind = BINARY};
const TpOpRules tp_rules_Pow = {TP_ELEMENTWISE_RULES, .gradient = grad_pow, .bind = BINARY};
const TpOpRules tp_rules_Max = {TP_ELEMENTWISE_RULES, .gradient = grad_max_min, .bind = BINARY};
const TpOpRules tp_rules_Min = {TP_ELEMENTWISE_RULES, .gradient = grad_max_min, .bind = BINARY};
const TpOpRules tp_rules_Sqrt = {TP_ELEMENTWISE_RULES, .gradient = grad_sqrt, .bind = UNARY};
const TpOpRules tp_rules_Neg = {TP_ELEMENTWISE_RULES, .gradient = grad_neg, .bind = UNARY};
const TpOpRules tp_rules_Reciprocal = {TP_ELEMENTWISE_RULES, .gradient = grad_reciprocal, .bind = UNARY};
const TpOpRules tp_rules_Exp = {TP_ELEMENTWISE_RULES, .gradient = grad_exp, .bind = UNARY};
const TpOpRules tp_rules_Log = {TP_ELEMENTWISE_RULES, .gradient = grad_log, .bind = UNARY};
const TpOpRules tp_rules_Erf = {TP_ELEMENTWISE_RULES, .gradient = grad_erf, .bind = UNARY};
const TpOpRules tp_rules_Tanh = {TP_ELEMENTWISE_RULES, .gradient = grad_tanh, .bind = UNARY};
const TpOpRules tp_rules_Relu = {TP_ELEMENTWISE_RULES, .gradient = grad_relu, .bind = UNARY};
const TpOpRules tp_rules_Sigmoid = {TP_ELEMENTWISE_RULES, .gradient = grad_sigmoid, .bind = UNARY};
const TpOpRules tp_rules_Sin = {TP_ELEMENTWISE_RULES, .gradient = grad_sin, .bind = UNARY};
const TpOpRules tp_rules_Cos = {TP_ELEMENTWISE_RULES, .gradient = grad_cos, .bind = UNARY};
const TpOpRules tp_rules_Not = {TP_ELEMENTWISE_RULES, .bind = UNARY};
const TpOpRules tp_rules_And = {TP_ELEMENTWISE_RULES, .bind = BINARY};
const TpOpRules tp_rules_Equal = {TP_ELEMENTWISE_RULES, .bind = BINARY};
const TpOpRules tp_rules_Less = {TP_ELEMENTWISE_RULES, .bind = BINARY};
const TpOpRules tp_rules_LessOrEqual = {TP_ELEMENTWISE_RULES, .bind = BINARY};
const TpOpRules tp_rules_Greater = {TP_ELEMENTWISE_RULES, .bind = BINARY};
const TpOpRules tp_rules_GreaterOrEqual = {TP_ELEMENTWISE_RULES, .bind = BINARY};
const TpOpRules tp_rules_Where = {
    .infer = infer_where,
    .gradient = grad_where,
    .token_axes = tp_axes_elementwise,
    .tensor_split = tp_split_elementwise,
    .bind = TP_BINDING(bind_where, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_Cast = {
    .infer = infer_cast,
    .gradient = grad_cast,
    .token_axes = tp_axes_elementwise,
    .tensor_split = tp_split_elementwise,
    .bind = TP_BINDING(tp_bind_copy, TP_BIND_ANY, 0, 0),
};
