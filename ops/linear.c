/* Matrix products: MatMul, Gemm, the raised Linear, and their backward ops.
 *
 * Each op's rule set, tp_rules_<Op> (ops/rules.h), is at the end of the file; the hooks
 * it names are above it. */
#include "axes.h"
#include "bind.h"
#include "grad.h"
#include "infer.h"

/* ---- shape rules ---- */

/* numpy matmul of a and b into *t */
static int matmul_type(const TpInferCtx *c, const TpType *a, const TpType *b, TpType *t) {
  if (same_dtype(c, a, b)) return TP_ERR_INPUT;
  if (a->rank < 1 || b->rank < 1) return tp_error_op(c->d, c->m, c->op, "operands must have rank >= 1");
  /* promote vectors, as numpy does: [K] x [..,K,N] and [..,M,K] x [K] */
  TpType pa = *a, pb = *b;
  if (a->rank == 1)
    pa = (TpType){.dtype = a->dtype, .rank = 2, .dims = {1, a->dims[0]}, .dimnames = {NULL, a->dimnames[0]}};
  if (b->rank == 1)
    pb = (TpType){.dtype = b->dtype, .rank = 2, .dims = {b->dims[0], 1}, .dimnames = {b->dimnames[0], NULL}};
  int64_t k1 = pa.dims[pa.rank - 1], k2 = pb.dims[pb.rank - 2];
  if (k1 != k2) {
    char sa[256], sb[256];
    return tp_error_op(c->d, c->m, c->op, "inner dimensions differ: %s x %s", type_str(a, sa), type_str(b, sb));
  }
  TpType ba = pa, bb = pb;
  ba.rank -= 2;
  bb.rank -= 2;
  if (broadcast(c, &ba, &bb, t)) return TP_ERR_INPUT;
  if (a->rank > 1) {
    t->dims[t->rank] = pa.dims[pa.rank - 2];
    t->dimnames[t->rank++] = pa.dimnames[pa.rank - 2];
  }
  if (b->rank > 1) {
    t->dims[t->rank] = pb.dims[pb.rank - 1];
    t->dimnames[t->rank++] = pb.dimnames[pb.rank - 1];
  }
  t->dtype = a->dtype;
  return TP_OK;
}

static int infer_matmul(const TpInferCtx *c) {
  TpType t;
  return matmul_type(c, operand(c, 0), operand(c, 1), &t) || set_result(c, 0, t) ? TP_ERR_INPUT : TP_OK;
}

static int infer_gemm(const TpInferCtx *c) {
  const TpType *a = operand(c, 0), *b = operand(c, 1), *bias = operand(c, 2);
  if (a->rank != 2 || b->rank != 2) return tp_error_op(c->d, c->m, c->op, "A and B must be matrices");
  if (same_dtype(c, a, b)) return TP_ERR_INPUT;
  bool ta = tp_attr_int(c->m, c->op, "transA", 0), tb = tp_attr_int(c->m, c->op, "transB", 0);
  int64_t m = a->dims[ta ? 1 : 0], k = a->dims[ta ? 0 : 1], k2 = b->dims[tb ? 1 : 0], n = b->dims[tb ? 0 : 1];
  if (k != k2) {
    char sa[256], sb[256];
    return tp_error_op(c->d, c->m, c->op, "inner dimensions differ: %s x %s", type_str(a, sa), type_str(b, sb));
  }
  TpType t = {.dtype = a->dtype,
              .rank = 2,
              .dims = {m, n},
              .dimnames = {a->dimnames[ta ? 1 : 0], b->dimnames[tb ? 0 : 1]}};
  if (bias) {
    TpType bt;
    if (same_dtype(c, a, bias) || broadcast(c, bias, &t, &bt)) return TP_ERR_INPUT;
    if (!tp_type_equal(&bt, &t)) return tp_error_op(c->d, c->m, c->op, "C does not broadcast to [M, N]");
  }
  return set_result(c, 0, t);
}

/* Y = X W (+ B): X [..., K], W [K, N] or [N, K] (transpose_w), B [N] */
static int linear_type(const TpInferCtx *c, const TpType *x, const TpType *w, const TpType *b, TpType *y) {
  bool tw = tp_attr_int(c->m, c->op, "transpose_w", 0);
  if (need_float(c, x, "X") || same_dtype(c, x, w)) return TP_ERR_INPUT;
  if (w->rank != 2 || x->rank < 1) return tp_error_op(c->d, c->m, c->op, "W must be a matrix and X at least 1-D");
  int64_t k = w->dims[tw ? 1 : 0], n = w->dims[tw ? 0 : 1];
  if (x->dims[x->rank - 1] != k) {
    char sx[256], sw[256];
    return tp_error_op(c->d, c->m, c->op, "inner dimensions differ: %s x %s%s", type_str(x, sx), type_str(w, sw),
                       tw ? " (transposed)" : "");
  }
  if (b && (b->rank != 1 || b->dims[0] != n || b->dtype != x->dtype))
    return tp_error_op(c->d, c->m, c->op, "B must be a vector of %lld %s", (long long)n, tp_dtype_name(x->dtype));
  *y = *x;
  y->dims[y->rank - 1] = n;
  y->dimnames[y->rank - 1] = w->dimnames[tw ? 0 : 1];
  return TP_OK;
}

static int infer_linear(const TpInferCtx *c) {
  TpType y;
  return linear_type(c, operand(c, 0), operand(c, 1), operand(c, 2), &y) || set_result(c, 0, y) ? TP_ERR_INPUT
                                                                                                : TP_OK;
}

static int infer_linear_backward(const TpInferCtx *c) {
  const TpType *dy = operand(c, 0), *x = operand(c, 1), *w = operand(c, 2);
  TpType y;
  if (linear_type(c, x, w, NULL, &y) || check_grad(c, dy, &y)) return TP_ERR_INPUT;
  TpType db = {.dtype = w->dtype, .rank = 1, .dims = {y.dims[y.rank - 1]}};
  return set_result(c, 0, *x) || set_result(c, 1, *w) || set_result(c, 2, db) ? TP_ERR_INPUT : TP_OK;
}

static int infer_matmul_backward(const TpInferCtx *c) {
  TpType y;
  if (matmul_type(c, operand(c, 1), operand(c, 2), &y) || check_grad(c, operand(c, 0), &y)) return TP_ERR_INPUT;
  return set_results_like(c, 1, 2);
}

/* ---- FLOPs ---- */

/* MatMul and Linear: a multiply-add per result element and inner index */
static double flops_matmul(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  const TpType *x = o->inputs[0] >= 0 ? &m->values[o->inputs[0]].type : NULL;
  double out = tp_flops_per_result(m, op);
  return x && x->rank ? 2 * out * (double)x->dims[x->rank - 1] : out;
}

static double flops_gemm(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  const TpType *x = o->inputs[0] >= 0 ? &m->values[o->inputs[0]].type : NULL;
  double out = tp_flops_per_result(m, op);
  return x && x->rank == 2 ? 2 * out * (double)x->dims[tp_attr_int(m, op, "transA", 0) ? 0 : 1] : out;
}

/* ---- gradients ---- */

/* Gemm: Y = alpha op(A) op(B) + beta C, op(X) = X or X^T. Its gradients are Gemms too. */
static void gemm_backward(TpGradCtx *a, const int *in, bool need_a, bool need_b, bool need_c, int dy) {
  int o = a->fwd;
  double alpha = tp_attr_float(a->m, o, "alpha", 1), beta = tp_attr_float(a->m, o, "beta", 1);
  bool ta = tp_attr_int(a->m, o, "transA", 0), tb = tp_attr_int(a->m, o, "transB", 0);
  for (int which = 0; which < 2; which++) {
    if (!(which ? need_b : need_a)) continue;
    int v = in[which], x, y;
    bool tx, ty;
    if (which == 0 && !ta) x = dy, y = in[1], tx = false, ty = !tb; /* dA = dY op(B)^T */
    else if (which == 0) x = in[1], y = dy, tx = tb, ty = true;     /* dA = op(B) dY^T */
    else if (!tb) x = in[0], y = dy, tx = !ta, ty = false;          /* dB = op(A)^T dY */
    else x = dy, y = in[0], tx = true, ty = ta;                     /* dB = dY^T op(A) */
    int op = tp_grad_begin(a, TP_OP_Gemm, (int[]){x, y}, 2, (const char *[]){tp_grad_contrib_name(a, v)}, 1);
    if (alpha != 1) tp_set_attr_float(a->m, op, "alpha", alpha);
    if (tx) tp_set_attr_int(a->m, op, "transA", 1);
    if (ty) tp_set_attr_int(a->m, op, "transB", 1);
    tp_grad_give(a, v, tp_grad_end(a, op, NULL));
  }
  if (need_c) {
    if (beta == 1) tp_grad_give_value(a, in[2], dy);
    else tp_grad_give_binary(a, in[2], TP_OP_Mul, dy, tp_grad_scalar(a, type_of(a, dy).dtype, beta));
  }
}

static void grad_matmul(TpGradCtx *a, const TpGradOp *fwd) { tp_grad_one_op(a, fwd, TP_OP_MatMulBackward, false); }

static void grad_linear(TpGradCtx *a, const TpGradOp *fwd) {
  tp_grad_one_op(a, fwd, TP_OP_LinearBackward, fwd->nin > 2 && fwd->in[2] >= 0);
}

static void grad_gemm(TpGradCtx *a, const TpGradOp *fwd) {
  int nin = fwd->nin;
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy;
  gemm_backward(a, in, need[0], need[1], nin > 2 && need[2], dy);
}

/* ---- token axes ---- */

static void matmul_axes(const TpModule *m, TpOpAxes *x, int A, int B, int Y) {
  int ra = value_type(m, A)->rank, rb = value_type(m, B)->rank, ry = value_type(m, Y)->rank;
  axes_mix(x, A, ra - 1, "contracts over");
  axes_mix(x, B, rb >= 2 ? rb - 2 : 0, "contracts over");
  if (ra >= 2) axes_link(x, A, ra - 2, Y, ry - (rb >= 2 ? 2 : 1));
  if (rb >= 2) axes_link(x, B, rb - 1, Y, ry - 1);
  if (ra < 2 || rb < 2) return;
  const TpType *ty = value_type(m, Y);
  for (int side = 0; side < 2; side++) { /* batch axes broadcast */
    int v = side ? B : A, r = side ? rb : ra;
    for (int k = 0; k < r - 2; k++) {
      int b = k + ry - r;
      if (b >= 0 && value_type(m, v)->dims[k] == ty->dims[b]) axes_link(x, v, k, Y, b);
    }
  }
}

static void axes_matmul(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = o->inputs[0], Y = o->outputs[0];
  matmul_axes(m, x, X, o->inputs[1], Y);
}

/* A [M, K] (transA: [K, M]), B [K, N] (transB: [N, K]) */
static void axes_gemm(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = o->inputs[0], Y = o->outputs[0];
  bool ta = tp_attr_int(m, op, "transA", 0), tb = tp_attr_int(m, op, "transB", 0);
  int B = o->inputs[1];
  axes_link(x, X, ta ? 1 : 0, Y, 0), axes_link(x, B, tb ? 0 : 1, Y, 1);
  axes_mix(x, X, ta ? 0 : 1, "contracts over"), axes_mix(x, B, tb ? 1 : 0, "contracts over");
  if (o->ninputs > 2) axes_broadcast(m, x, Y, o->inputs[2]);
}

static void axes_linear(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = o->inputs[0], Y = o->outputs[0];
  int rx = value_type(m, X)->rank;
  for (int k = 0; k < rx - 1; k++) axes_link(x, X, k, Y, k);
  axes_mix(x, X, rx - 1, "contracts over");
  if (o->ninputs > 2) axes_broadcast(m, x, Y, o->inputs[2]);
}

/* ---- kernel binders ---- */

static int bind_matmul(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)m, (void)op, (void)d;
  b->kernel = TP_K_MATMUL;
  b->a.matmul = (TpMatmulArgs){&in[0], &in[1], &out[0]};
  return TP_OK;
}

static int bind_gemm(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  b->kernel = TP_K_GEMM;
  b->a.gemm = (TpGemmArgs){&in[0],
                           &in[1],
                           opt_in(m, op, in, 2),
                           tp_attr_int(m, op, "transA", 0) != 0,
                           tp_attr_int(m, op, "transB", 0) != 0,
                           tp_attr_float(m, op, "alpha", 1.0),
                           tp_attr_float(m, op, "beta", 1.0),
                           &out[0]};
  return TP_OK;
}

/* M, K, N of Linear(X[..., K], W) {transpose_w} and whether W fits. */
static bool linear_dims(const TpModule *m, int op, const TpTensor *x, const TpTensor *w, TpLinearArgs *a) {
  a->transpose_w = tp_attr_int(m, op, "transpose_w", 0) != 0;
  if (x->rank < 1 || w->rank != 2) return false;
  a->K = last_dim(x);
  a->M = numel_from(x, 0, x->rank - 1);
  a->N = a->transpose_w ? w->dims[0] : w->dims[1];
  return w->dims[a->transpose_w ? 1 : 0] == a->K;
}

/* Linear(X, W, Bias) and LinearBackward(dY, X, W) -> dX, dW, dBias. */
static int bind_linear(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  bool fwd = m->ops[op].kind == TP_OP_Linear;
  TpLinearArgs *a = &b->a.linear;
  *a = (TpLinearArgs){0};
  int x = fwd ? 0 : 1;
  if (!linear_dims(m, op, &in[x], &in[x + 1], a)) return shape_error(m, op, d);
  int64_t M = a->M, K = a->K, N = a->N;
  a->x = &in[x];
  a->w = &in[x + 1];
  if (fwd) {
    a->bias = opt_in(m, op, in, 2);
    a->y = &out[0];
    if (tp_tensor_numel(&out[0]) != M * N || (a->bias && tp_tensor_numel(a->bias) != N))
      return shape_error(m, op, d);
    b->kernel = TP_K_LINEAR;
    return TP_OK;
  }
  a->dy = &in[0];
  a->y = opt_out(m, op, out, 0);
  a->dw = opt_out(m, op, out, 1);
  a->dbias = opt_out(m, op, out, 2);
  if (tp_tensor_numel(&in[0]) != M * N || !out_numel(m, op, out, 0, M * K) || !out_numel(m, op, out, 1, K * N) ||
      !out_numel(m, op, out, 2, N))
    return shape_error(m, op, d);
  b->kernel = TP_K_LINEAR_BACKWARD;
  return TP_OK;
}

static int bind_matmul_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b,
                                TpDiag *d) {
  (void)d;
  b->kernel = TP_K_MATMUL_BACKWARD;
  b->a.matmul_backward = (TpMatmulBackwardArgs){&in[0], &in[1], &in[2], opt_out(m, op, out, 0),
                                                opt_out(m, op, out, 1)};
  return TP_OK;
}

/* ---- rule sets ---- */

const TpOpRules tp_rules_MatMul = {
    .infer = infer_matmul,
    .flops = flops_matmul,
    .gradient = grad_matmul,
    .token_axes = axes_matmul,
    .bind = TP_BINDING(bind_matmul, TP_BIND_HALF_COPY, 0, 0),
};
const TpOpRules tp_rules_Gemm = {
    .infer = infer_gemm,
    .flops = flops_gemm,
    .gradient = grad_gemm,
    .token_axes = axes_gemm,
    .bind = TP_BINDING(bind_gemm, TP_BIND_HALF_COPY, 0, 0),
};
const TpOpRules tp_rules_Linear = {
    .infer = infer_linear,
    .flops = flops_matmul,
    .gradient = grad_linear,
    .token_axes = axes_linear,
    .bind = TP_TRAINING_BINDING(bind_linear),
};
const TpOpRules tp_rules_LinearBackward = {
    .infer = infer_linear_backward,
    .bind = TP_TRAINING_BINDING(bind_linear),
};
const TpOpRules tp_rules_MatMulBackward = {
    .infer = infer_matmul_backward,
    .bind = TP_TRAINING_BINDING(bind_matmul_backward),
};
