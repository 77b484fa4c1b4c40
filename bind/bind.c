/* The binders (bind.h): per op family, the IR attributes and the operand dims turned into the
 * kernel's argument struct, with the checks that the shapes fit the kernel. Compiler-side: the
 * interpreter and codegen both call them, so each op's attribute-to-argument logic is here
 * and nowhere else. */
#include "bind.h"

#include <math.h>
#include <string.h>

static bool present_in(const TpModule *m, int op, int i) {
  return i < m->ops[op].ninputs && m->ops[op].inputs[i] >= 0;
}

static bool present_out(const TpModule *m, int op, int i) {
  return i < m->ops[op].noutputs && m->ops[op].outputs[i] >= 0;
}

/* Operand i's view, or NULL when the op has none there. */
static const TpTensor *opt_in(const TpModule *m, int op, const TpTensor *in, int i) {
  return present_in(m, op, i) ? &in[i] : NULL;
}

static TpTensor *opt_out(const TpModule *m, int op, TpTensor *out, int i) {
  return present_out(m, op, i) ? &out[i] : NULL;
}

static int64_t numel_from(const TpTensor *t, int from, int to) {
  return tp_numel(to - from, t->dims + from);
}

static int64_t last_dim(const TpTensor *t) { return t->rank ? t->dims[t->rank - 1] : 1; }

static const char *dtype_name(TpDType t) {
  const char *s = tp_dtype_name(t);
  return s ? s : "?";
}

static int shape_error(const TpModule *m, int op, TpDiag *d) {
  return tp_error_op(d, m, op, "CPU kernel: operand and result shapes do not fit");
}

/* An optional result's size, when present, is n. */
static bool out_numel(const TpModule *m, int op, const TpTensor *out, int i, int64_t n) {
  return !present_out(m, op, i) || tp_tensor_numel(&out[i]) == n;
}

/* The gelu variant of an `approximate` attribute. */
static int gelu_tanh(const TpModule *m, int op, bool *tanh_approx, TpDiag *d) {
  const char *approx = tp_attr_string(m, op, "approximate", "none");
  *tanh_approx = strcmp(approx, "tanh") == 0;
  if (*tanh_approx || strcmp(approx, "none") == 0) return TP_OK;
  return tp_error_op(d, m, op, "unknown approximate '%s' (expected none or tanh)", approx);
}

/* ---- elementwise ---- */

static int bind_unary(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  static const TpUnaryOp ops[TP_OP_COUNT] = {
      [TP_OP_Sqrt] = TP_UNARY_SQRT,       [TP_OP_Neg] = TP_UNARY_NEG,   [TP_OP_Reciprocal] = TP_UNARY_RECIPROCAL,
      [TP_OP_Exp] = TP_UNARY_EXP,         [TP_OP_Log] = TP_UNARY_LOG,   [TP_OP_Erf] = TP_UNARY_ERF,
      [TP_OP_Tanh] = TP_UNARY_TANH,       [TP_OP_Relu] = TP_UNARY_RELU, [TP_OP_Sigmoid] = TP_UNARY_SIGMOID,
      [TP_OP_Sin] = TP_UNARY_SIN,         [TP_OP_Cos] = TP_UNARY_COS,   [TP_OP_Not] = TP_UNARY_NOT,
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
      [TP_OP_Add] = TP_BINARY_ADD,     [TP_OP_Sub] = TP_BINARY_SUB,
      [TP_OP_Mul] = TP_BINARY_MUL,     [TP_OP_Div] = TP_BINARY_DIV,
      [TP_OP_Pow] = TP_BINARY_POW,     [TP_OP_Max] = TP_BINARY_MAX,
      [TP_OP_Min] = TP_BINARY_MIN,     [TP_OP_And] = TP_BINARY_AND,
      [TP_OP_Equal] = TP_BINARY_EQUAL, [TP_OP_Less] = TP_BINARY_LESS,
      [TP_OP_LessOrEqual] = TP_BINARY_LESS_EQUAL, [TP_OP_Greater] = TP_BINARY_GREATER,
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

/* Cast, Reshape, Expand, Tile: x to y, the kernel by op kind. */
static int bind_copy(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  TpOpKind k = m->ops[op].kind;
  b->kernel = k == TP_OP_Cast ? TP_K_CAST : k == TP_OP_Reshape ? TP_K_RESHAPE : k == TP_OP_Expand ? TP_K_EXPAND : TP_K_TILE;
  b->a.cast = (TpCopyArgs){&in[0], &out[0]};
  return TP_OK;
}

/* ---- layout ---- */

/* Gather, GatherElements and their backward ops: data (or dy), indices {axis}. */
static int bind_gather(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  TpOpKind k = m->ops[op].kind;
  b->kernel = k == TP_OP_Gather           ? TP_K_GATHER
              : k == TP_OP_GatherElements ? TP_K_GATHER_ELEMENTS
              : k == TP_OP_GatherBackward ? TP_K_GATHER_BACKWARD
                                          : TP_K_GATHER_ELEMENTS_BACKWARD;
  b->a.gather = (TpGatherArgs){&in[0], &in[1], (int)tp_attr_int(m, op, "axis", 0),
                               tp_attr_int(m, op, "padding_idx", -1), &out[0], &b->bad};
  return TP_OK;
}

static int bind_cumsum(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  b->kernel = TP_K_CUMSUM;
  b->a.cumsum = (TpCumsumArgs){&in[0], (int)tp_attr_int(m, op, "axis", 0), tp_attr_int(m, op, "exclusive", 0) != 0,
                               tp_attr_int(m, op, "reverse", 0) != 0, &out[0]};
  return TP_OK;
}

static int bind_topk(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  b->kernel = TP_K_TOPK;
  b->a.topk = (TpTopkArgs){&in[0], (int)tp_attr_int(m, op, "axis", 0), &out[0]};
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

static int bind_reduce(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  int n;
  const int64_t *axes = tp_attr_ints(m, op, "axes", &n);
  b->kernel = TP_K_REDUCE_SUM;
  b->a.reduce_sum = (TpReduceArgs){&in[0], axes, n, m->ops[op].kind == TP_OP_ReduceMean, &out[0]};
  return TP_OK;
}

/* ---- products ---- */

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
    if (tp_tensor_numel(&out[0]) != M * N || (a->bias && tp_tensor_numel(a->bias) != N)) return shape_error(m, op, d);
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
  b->a.matmul_backward = (TpMatmulBackwardArgs){&in[0], &in[1], &in[2], opt_out(m, op, out, 0), opt_out(m, op, out, 1)};
  return TP_OK;
}

/* ---- normalisation, softmax, gelu ---- */

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
  b->a.layernorm_backward = (TpLayerNormBackwardArgs){&in[0], x, &in[2], &in[3], &in[4], rows, n,
                                                      opt_out(m, op, out, 0), opt_out(m, op, out, 1),
                                                      opt_out(m, op, out, 2)};
  return TP_OK;
}

static int bind_gelu_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b,
                              TpDiag *d) {
  bool tanh_approx;
  int rc = gelu_tanh(m, op, &tanh_approx, d);
  if (rc) return rc;
  int64_t n = tp_tensor_numel(&in[1]);
  if (tp_tensor_numel(&in[0]) != n || tp_tensor_numel(&out[0]) != n) return shape_error(m, op, d);
  b->kernel = TP_K_GELU_BACKWARD;
  b->a.gelu_backward = (TpGeluBackwardArgs){&in[0], &in[1], n, tanh_approx, &out[0]};
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

/* Rotary(X, Cos, Sin) {rotary_dim, interleaved}, and RotaryBackward with dY as X. */
static int bind_rotary(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  const TpTensor *x = &in[0], *cos = &in[1], *sin = &in[2];
  int64_t rd = tp_attr_int(m, op, "rotary_dim", 0);
  bool ok = x->rank >= 1 && rd > 0 && rd % 2 == 0 && rd <= last_dim(x) && cos->rank == x->rank &&
            sin->rank == x->rank && tp_tensor_numel(&out[0]) == tp_tensor_numel(x);
  for (int k = 0; ok && k < x->rank; k++)
    ok = cos->dims[k] == sin->dims[k] &&
         (k == x->rank - 1 ? cos->dims[k] == rd : cos->dims[k] == 1 || cos->dims[k] == x->dims[k]);
  if (!ok) return shape_error(m, op, d);
  b->kernel = m->ops[op].kind == TP_OP_Rotary ? TP_K_ROTARY : TP_K_ROTARY_BACKWARD;
  b->a.rotary = (TpRotaryArgs){x, cos, sin, rd, tp_attr_int(m, op, "interleaved", 0) != 0, &out[0]};
  return TP_OK;
}

/* SwiGLU(Gate, Up) and SwiGLUBackward(dY, Gate, Up) -> dGate, dUp. */
static int bind_swiglu(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  bool fwd = m->ops[op].kind == TP_OP_SwiGLU;
  const TpTensor *gate = fwd ? &in[0] : &in[1], *up = fwd ? &in[1] : &in[2];
  int64_t n = tp_tensor_numel(gate);
  if (tp_tensor_numel(up) != n || (fwd ? tp_tensor_numel(&out[0]) : tp_tensor_numel(&in[0])) != n)
    return shape_error(m, op, d);
  b->kernel = fwd ? TP_K_SWIGLU : TP_K_SWIGLU_BACKWARD;
  b->a.swiglu =
      (TpSwiGLUArgs){fwd ? NULL : &in[0], gate, up, n, opt_out(m, op, out, 0), fwd ? NULL : opt_out(m, op, out, 1)};
  return TP_OK;
}

/* GeGLU(Gate, Up) and GeGLUBackward(dY, Gate, Up) -> dGate, dUp, {approximate} as Gelu's. */
static int bind_geglu(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  bool fwd = m->ops[op].kind == TP_OP_GeGLU, tanh_approx;
  int rc = gelu_tanh(m, op, &tanh_approx, d);
  if (rc) return rc;
  const TpTensor *gate = fwd ? &in[0] : &in[1], *up = fwd ? &in[1] : &in[2];
  int64_t n = tp_tensor_numel(gate);
  if (tp_tensor_numel(up) != n || (fwd ? tp_tensor_numel(&out[0]) : tp_tensor_numel(&in[0])) != n)
    return shape_error(m, op, d);
  b->kernel = fwd ? TP_K_GEGLU : TP_K_GEGLU_BACKWARD;
  b->a.geglu = (TpGeGLUArgs){fwd ? NULL : &in[0], gate, up, n, tanh_approx, opt_out(m, op, out, 0),
                             fwd ? NULL : opt_out(m, op, out, 1)};
  return TP_OK;
}

/* ---- attention ---- */

/* The TpAttention of Q, K, V (heads, lengths, head sizes, causality, scale, softcap; no mask
 * or past), shapes checked. */
static int attention_params(const TpModule *m, int op, const TpTensor *Q, const TpTensor *K, const TpTensor *V,
                            TpAttention *p, TpDiag *d) {
  *p = (TpAttention){0};
  if (Q->rank != K->rank || Q->rank != V->rank || (Q->rank != 3 && Q->rank != 4))
    return tp_error_op(d, m, op, "Q, K and V must all be 3-D or all 4-D");
  p->packed = Q->rank == 3;
  p->batch = Q->dims[0];
  bool fit;
  if (p->packed) {
    p->q_heads = tp_attr_int(m, op, "q_num_heads", 0);
    p->kv_heads = tp_attr_int(m, op, "kv_num_heads", 0);
    if (p->q_heads <= 0 || p->kv_heads <= 0)
      return tp_error_op(d, m, op, "3-D inputs need q_num_heads and kv_num_heads");
    p->q_len = Q->dims[1];
    p->kv_len = K->dims[1];
    p->head_size = Q->dims[2] / p->q_heads;
    p->v_head_size = V->dims[2] / p->kv_heads;
    fit = Q->dims[2] % p->q_heads == 0 && K->dims[2] == p->head_size * p->kv_heads &&
          V->dims[2] % p->kv_heads == 0 && V->dims[1] == p->kv_len;
  } else {
    p->q_heads = Q->dims[1];
    p->kv_heads = K->dims[1];
    p->q_len = Q->dims[2];
    p->kv_len = K->dims[2];
    p->head_size = Q->dims[3];
    p->v_head_size = V->dims[3];
    fit = K->dims[3] == p->head_size && V->dims[1] == p->kv_heads && V->dims[2] == p->kv_len;
  }
  if (!fit || K->dims[0] != p->batch || V->dims[0] != p->batch)
    return tp_error_op(d, m, op, "the shapes of Q, K and V do not fit together");
  if (p->kv_heads <= 0 || p->q_heads % p->kv_heads != 0)
    return tp_error_op(d, m, op, "q_num_heads %lld is not a multiple of kv_num_heads %lld", (long long)p->q_heads,
                       (long long)p->kv_heads);
  p->is_causal = tp_attr_int(m, op, "is_causal", 0) != 0;
  p->causal_offset = tp_attr_int(m, op, "causal_offset", 0);
  if (p->causal_offset < 0) return tp_error_op(d, m, op, "causal_offset must be >= 0");
  p->window = tp_attr_int(m, op, "window", 0);
  if (p->window < 0 || (p->window && !p->is_causal))
    return tp_error_op(d, m, op, "window must be >= 0, and only causal attention has one");
  p->scale = (float)tp_attr_float(m, op, "scale", 0);
  if (p->scale == 0) p->scale = 1.0f / sqrtf((float)p->head_size);
  p->softcap = (float)tp_attr_float(m, op, "softcap", 0);
  return TP_OK;
}

/* Attention(Q, K, V, Mask, PastK, PastV) -> Y, PresentK, PresentV, QK, and
 * AttentionBackward(dY, Q, K, V, Mask) -> dQ, dK, dV. */
static int bind_attention(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  bool fwd = m->ops[op].kind == TP_OP_Attention;
  int q = fwd ? 0 : 1, mask = fwd ? 3 : 4;
  TpAttentionArgs *a = &b->a.attention;
  *a = (TpAttentionArgs){0};
  int rc = attention_params(m, op, &in[q], &in[q + 1], &in[q + 2], &a->p, d);
  if (rc) return rc;
  a->q = &in[q], a->k = &in[q + 1], a->v = &in[q + 2];
  a->mask = opt_in(m, op, in, mask);
  if (a->mask) {
    /* the interpreter computes a forward's float mask in an f32 copy */
    if (a->mask->dtype != TP_BOOL && (fwd ? !tp_dtype_is_float(a->mask->dtype) : a->mask->dtype != TP_F32))
      return tp_error_op(d, m, op, "the mask is %s: the CPU kernels take bool or f32", dtype_name(a->mask->dtype));
    tp_attention_set_mask(&a->p, NULL, a->mask->dtype == TP_BOOL, a->mask->dims, a->mask->rank);
  }
  if (fwd) {
    a->past_k = opt_in(m, op, in, 4), a->past_v = opt_in(m, op, in, 5);
    if (!a->past_k || !a->past_v) a->past_k = a->past_v = NULL;
    a->p.past_len = a->past_k ? a->past_k->dims[2] : 0;
    a->p.qk_mode = (int)tp_attr_int(m, op, "qk_matmul_output_mode", 0);
    a->y = &out[0];
    a->present_k = opt_out(m, op, out, 1), a->present_v = opt_out(m, op, out, 2), a->qk_out = opt_out(m, op, out, 3);
    b->kernel = TP_K_ATTENTION;
    return TP_OK;
  }
  const TpAttention *p = &a->p;
  a->dy = &in[0];
  if (tp_tensor_numel(&in[0]) != p->batch * p->q_heads * p->q_len * p->v_head_size ||
      !out_numel(m, op, out, 0, tp_tensor_numel(a->q)) || !out_numel(m, op, out, 1, tp_tensor_numel(a->k)) ||
      !out_numel(m, op, out, 2, tp_tensor_numel(a->v)))
    return shape_error(m, op, d);
  a->y = opt_out(m, op, out, 0), a->present_k = opt_out(m, op, out, 1), a->present_v = opt_out(m, op, out, 2);
  b->kernel = TP_K_ATTENTION_BACKWARD;
  return TP_OK;
}

/* ---- ids and losses ---- */

/* The vocabulary-parallel ops (ir/ops.def): Embedding and CrossEntropy(Backward) with a
 * Part operand, EmbeddingBackward, CrossEntropyStats. */
static int bind_vocab(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  TpOpKind kind = m->ops[op].kind;
  TpVocabArgs *a = &b->a.embedding_part;
  *a = (TpVocabArgs){.bad = &b->bad, .y = &out[0]};
  if (kind == TP_OP_Embedding || kind == TP_OP_EmbeddingBackward) {
    bool fwd = kind == TP_OP_Embedding;
    const TpTensor *w = fwd ? &in[0] : &out[0];
    a->x = &in[0], a->ids = &in[1], a->part = &in[2];
    a->n = tp_tensor_numel(&in[1]), a->parts = tp_attr_int(m, op, "vocab_parts", 1);
    if (w->rank != 2 || tp_tensor_numel(fwd ? &out[0] : &in[0]) != a->n * w->dims[1]) return shape_error(m, op, d);
    a->V = w->dims[0], a->C = w->dims[1];
    b->kernel = fwd ? TP_K_EMBEDDING_PART : TP_K_EMBEDDING_PART_BACKWARD;
    return TP_OK;
  }
  int first = kind == TP_OP_CrossEntropyBackward; /* dLoss before the logits */
  const TpTensor *logits = &in[first];
  if (logits->rank < 1) return shape_error(m, op, d);
  a->x = logits, a->ids = &in[first + 1];
  a->V = last_dim(logits), a->n = numel_from(logits, 0, logits->rank - 1);
  a->denominator = (float)tp_attr_float(m, op, "denominator", (double)a->n);
  if (tp_tensor_numel(a->ids) != a->n) return shape_error(m, op, d);
  if (kind == TP_OP_CrossEntropyStats) {
    a->part = &in[2], a->parts = tp_attr_int(m, op, "vocab_parts", 1);
    if (tp_tensor_numel(&out[0]) != a->n * (2 * a->parts + 1)) return shape_error(m, op, d);
    b->kernel = TP_K_CROSS_ENTROPY_STATS;
    return TP_OK;
  }
  a->stats = &in[first + 2], a->part = &in[first + 3], a->parts = (last_dim(a->stats) - 1) / 2;
  if (tp_tensor_numel(a->stats) != a->n * (2 * a->parts + 1) || tp_tensor_numel(&out[0]) != (first ? a->n * a->V : 1) ||
      (first && tp_tensor_numel(&in[0]) != 1))
    return shape_error(m, op, d);
  a->dloss = first ? &in[0] : NULL;
  b->kernel = first ? TP_K_CROSS_ENTROPY_PARTS_BACKWARD : TP_K_CROSS_ENTROPY_PARTS;
  return TP_OK;
}

static int bind_embedding(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  if (m->ops[op].ninputs > 2) return bind_vocab(m, op, in, out, b, d);
  const TpTensor *w = &in[0];
  int64_t n = tp_tensor_numel(&in[1]);
  if (w->rank != 2 || tp_tensor_numel(&out[0]) != n * w->dims[1]) return shape_error(m, op, d);
  b->kernel = TP_K_EMBEDDING;
  b->a.embedding = (TpEmbeddingArgs){w, &in[1], n, w->dims[0], w->dims[1], &out[0], &b->bad};
  return TP_OK;
}

/* CrossEntropy(Logits[..., V], Targets) {denominator} and CrossEntropyBackward(dLoss,
 * Logits, Targets): R rows of V. */
static int bind_cross_entropy(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b,
                              TpDiag *d) {
  bool fwd = m->ops[op].kind == TP_OP_CrossEntropy;
  if (m->ops[op].ninputs > (fwd ? 2 : 3)) return bind_vocab(m, op, in, out, b, d);
  const TpTensor *logits = fwd ? &in[0] : &in[1], *targets = fwd ? &in[1] : &in[2];
  if (logits->rank < 1) return shape_error(m, op, d);
  int64_t V = last_dim(logits), R = numel_from(logits, 0, logits->rank - 1);
  if (tp_tensor_numel(targets) != R || tp_tensor_numel(&out[0]) != (fwd ? 1 : R * V) ||
      (!fwd && tp_tensor_numel(&in[0]) != 1))
    return shape_error(m, op, d);
  b->kernel = fwd ? TP_K_CROSS_ENTROPY : TP_K_CROSS_ENTROPY_BACKWARD;
  b->a.cross_entropy = (TpCrossEntropyArgs){fwd ? NULL : &in[0], logits, targets, R, V,
                                            (float)tp_attr_float(m, op, "denominator", (double)R), &out[0], &b->bad};
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

/* ---- the table ---- */

#define UNARY {bind_unary, TP_BIND_ANY, 0, 0}
#define BINARY {bind_binary, TP_BIND_ANY, 0, 0}
#define COPY {bind_copy, TP_BIND_ANY, 0, 0}
#define TRAIN(fn) {fn, TP_BIND_F32, 0, 0}

const TpOpBinding tp_op_bindings[TP_OP_COUNT] = {
    [TP_OP_Add] = BINARY, [TP_OP_Sub] = BINARY, [TP_OP_Mul] = BINARY, [TP_OP_Div] = BINARY,
    [TP_OP_Pow] = BINARY, [TP_OP_Max] = BINARY, [TP_OP_Min] = BINARY, [TP_OP_And] = BINARY,
    [TP_OP_Equal] = BINARY, [TP_OP_Less] = BINARY, [TP_OP_LessOrEqual] = BINARY, [TP_OP_Greater] = BINARY,
    [TP_OP_GreaterOrEqual] = BINARY,
    [TP_OP_Sqrt] = UNARY, [TP_OP_Neg] = UNARY, [TP_OP_Reciprocal] = UNARY, [TP_OP_Exp] = UNARY,
    [TP_OP_Log] = UNARY, [TP_OP_Erf] = UNARY, [TP_OP_Tanh] = UNARY, [TP_OP_Relu] = UNARY,
    [TP_OP_Sigmoid] = UNARY, [TP_OP_Sin] = UNARY, [TP_OP_Cos] = UNARY, [TP_OP_Not] = UNARY,
    [TP_OP_Gelu] = UNARY,
    [TP_OP_Where] = {bind_where, TP_BIND_ANY, 0, 0},
    [TP_OP_Cast] = COPY, [TP_OP_Reshape] = COPY, [TP_OP_Expand] = COPY, [TP_OP_Tile] = COPY,
    [TP_OP_MatMul] = {bind_matmul, TP_BIND_HALF_COPY, 0, 0},
    [TP_OP_Gemm] = {bind_gemm, TP_BIND_HALF_COPY, 0, 0},
    [TP_OP_Gather] = {bind_gather, TP_BIND_ANY, 0, 0},
    [TP_OP_GatherElements] = {bind_gather, TP_BIND_ANY, 0, 0},
    [TP_OP_CumSum] = {bind_cumsum, TP_BIND_ANY, 0, 0},
    [TP_OP_TopK] = {bind_topk, TP_BIND_ANY, 0, 0},
    [TP_OP_Transpose] = {bind_transpose, TP_BIND_ANY, 0, 0},
    [TP_OP_Split] = {bind_split, TP_BIND_ANY, 0, 0},
    [TP_OP_Slice] = {bind_slice, TP_BIND_ANY, 0, 0},
    [TP_OP_Concat] = {bind_concat, TP_BIND_ANY, 0, 0},
    [TP_OP_Trilu] = {bind_trilu, TP_BIND_ANY, 0, 0},
    [TP_OP_ReduceMean] = {bind_reduce, TP_BIND_ANY, 0, 0},
    [TP_OP_ReduceSum] = {bind_reduce, TP_BIND_ANY, 0, 0},
    [TP_OP_Softmax] = {bind_softmax, TP_BIND_F32_COPY, 0, 0},
    [TP_OP_LogSoftmax] = {bind_softmax, TP_BIND_F32_COPY, 0, 0},
    [TP_OP_LayerNorm] = {bind_layernorm, TP_BIND_F32_COPY, 0, 0},
    [TP_OP_Attention] = {bind_attention, TP_BIND_F32_COPY, 0, 0},
    [TP_OP_SoftmaxCrossEntropyLoss] = {bind_loss, TP_BIND_F32_COPY, 1u << 1, 2},
    [TP_OP_NegativeLogLikelihoodLoss] = {bind_loss, TP_BIND_F32_COPY, 1u << 1, 2},
    [TP_OP_Linear] = TRAIN(bind_linear),
    [TP_OP_Embedding] = {bind_embedding, TP_BIND_F32, 1u << 1 | 1u << 2, 2},
    [TP_OP_CrossEntropy] = {bind_cross_entropy, TP_BIND_F32, 1u << 1 | 1u << 3, 2},
    [TP_OP_EmbeddingBackward] = {bind_vocab, TP_BIND_F32, 1u << 1 | 1u << 2, 2},
    [TP_OP_CrossEntropyStats] = {bind_vocab, TP_BIND_F32, 1u << 1 | 1u << 2, 2},
    [TP_OP_LinearBackward] = TRAIN(bind_linear),
    [TP_OP_MatMulBackward] = TRAIN(bind_matmul_backward),
    [TP_OP_GatherBackward] = {bind_gather, TP_BIND_F32, 1u << 1, 0},
    [TP_OP_GatherElementsBackward] = {bind_gather, TP_BIND_F32, 1u << 1, 0},
    [TP_OP_SliceBackward] = {bind_slice, TP_BIND_ANY, 0, 0},
    [TP_OP_LayerNormBackward] = TRAIN(bind_layernorm_backward),
    [TP_OP_GeluBackward] = TRAIN(bind_gelu_backward),
    [TP_OP_SoftmaxBackward] = TRAIN(bind_softmax),
    [TP_OP_LogSoftmaxBackward] = TRAIN(bind_softmax),
    [TP_OP_AttentionBackward] = {bind_attention, TP_BIND_F32, 1u << 4, 0},
    [TP_OP_CrossEntropyBackward] = {bind_cross_entropy, TP_BIND_F32, 1u << 2 | 1u << 4, 3},
    [TP_OP_RMSNorm] = TRAIN(bind_rmsnorm),
    [TP_OP_RMSNormBackward] = TRAIN(bind_rmsnorm),
    [TP_OP_Rotary] = TRAIN(bind_rotary),
    [TP_OP_RotaryBackward] = TRAIN(bind_rotary),
    [TP_OP_SwiGLU] = TRAIN(bind_swiglu),
    [TP_OP_SwiGLUBackward] = TRAIN(bind_swiglu),
    [TP_OP_GeGLU] = TRAIN(bind_geglu),
    [TP_OP_GeGLUBackward] = TRAIN(bind_geglu),
};

int tp_bind_op(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  TpBindFn fn = tp_op_bindings[m->ops[op].kind].bind;
  if (!fn) return tp_internal(d, "no kernel runs op %s", tp_op_info[m->ops[op].kind].name);
  memset(b, 0, sizeof *b);
  return fn(m, op, in, out, b, d);
}

int tp_bound_failed(const TpModule *m, int op, const TpBound *b, const TpTensor *in, const TpTensor *out,
                    TpKernelStatus s, TpDiag *d) {
  long long bad = (long long)b->bad;
  if (s == TP_KERNEL_BAD_INDEX) switch (b->kernel) {
    case TP_K_GATHER:
    case TP_K_GATHER_ELEMENTS:
    case TP_K_GATHER_BACKWARD:
    case TP_K_GATHER_ELEMENTS_BACKWARD: {
      const TpGatherArgs *a = &b->a.gather;
      const TpTensor *data = b->kernel == TP_K_GATHER || b->kernel == TP_K_GATHER_ELEMENTS ? a->data : a->y;
      return tp_error_op(d, m, op, "index %lld is out of range for axis %d of size %lld", bad, a->axis,
                         (long long)data->dims[a->axis]);
    }
    case TP_K_EMBEDDING: {
      const TpEmbeddingArgs *a = &b->a.embedding;
      return tp_error_op(d, m, op, "id %lld at position %lld is out of range for %lld embedding rows",
                         (long long)((const int64_t *)a->ids->data)[bad], bad, (long long)a->V);
    }
    case TP_K_EMBEDDING_PART:
    case TP_K_EMBEDDING_PART_BACKWARD:
    case TP_K_CROSS_ENTROPY_STATS:
    case TP_K_CROSS_ENTROPY_PARTS_BACKWARD: {
      const TpVocabArgs *a = &b->a.embedding_part;
      return tp_error_op(d, m, op, "%s %lld at position %lld is not a class in [0, %lld)",
                         b->kernel == TP_K_EMBEDDING_PART || b->kernel == TP_K_EMBEDDING_PART_BACKWARD ? "id" : "target",
                         (long long)((const int64_t *)a->ids->data)[bad], bad, (long long)(a->V * a->parts));
    }
    case TP_K_CROSS_ENTROPY:
    case TP_K_CROSS_ENTROPY_BACKWARD: {
      const TpCrossEntropyArgs *a = &b->a.cross_entropy;
      return tp_error_op(d, m, op, "target %lld at position %lld is not a class in [0, %lld)",
                         (long long)((const int64_t *)a->targets->data)[bad], bad, (long long)a->V);
    }
    case TP_K_NLL_LOSS:
    case TP_K_SOFTMAX_CROSS_ENTROPY: {
      const TpLossArgs *a = &b->a.nll_loss;
      return tp_error_op(d, m, op, "target %lld at flat index %lld is not a class in [0, %lld)",
                         (long long)((const int64_t *)a->target->data)[bad], bad, (long long)a->C);
    }
    default: break;
    }
  const TpOp *o = &m->ops[op];
  char buf[160];
  int len = 0;
  for (int i = 0; i < o->ninputs && len < (int)sizeof buf - 16; i++)
    len += snprintf(buf + len, sizeof buf - (size_t)len, "%s%s", i ? ", " : "",
                    o->inputs[i] >= 0 ? dtype_name(in[i].dtype) : "-");
  return tp_error_op(d, m, op, "CPU kernel: %s (operands %s -> %s)",
                     s == TP_KERNEL_BAD_DTYPE ? "unsupported element types" : "mismatched shapes", buf,
                     o->noutputs && o->outputs[0] >= 0 ? dtype_name(out[0].dtype) : "-");
}
