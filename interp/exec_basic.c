/* Exec functions of the elementwise, layout and reduction ops: read the op's canonical
 * attributes (ir/ops.def) and call the kernels of runtime/cpu. */
#include "interp.h"

#include <string.h>

#include "../runtime/cpu/elementwise.h"
#include "../runtime/cpu/layout.h"
#include "../runtime/cpu/reduce.h"

static const char *dtype_name(TpDType t) {
  const char *s = tp_dtype_name(t);
  return s ? s : "?";
}

/* Reports a kernel failure at the op; in/nin name the operand dtypes in the message. */
static int check(TpKernelStatus s, const TpModule *m, int op, const TpTensor *in, int nin,
                 const TpTensor *out, TpDiag *d) {
  if (s == TP_KERNEL_OK) return TP_OK;
  const char *what = s == TP_KERNEL_BAD_DTYPE ? "unsupported element types" : "mismatched shapes";
  char buf[160];
  int len = 0;
  for (int i = 0; i < nin && len < (int)sizeof buf - 16; i++)
    len += snprintf(buf + len, sizeof buf - (size_t)len, "%s%s", i ? ", " : "",
                    in[i].data ? dtype_name(in[i].dtype) : "-");
  return tp_error_op(d, m, op, "CPU kernel: %s (operands %s -> %s)", what, buf,
                     dtype_name(out->dtype));
}

int tp_exec_unary(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  TpUnaryOp u;
  switch (m->ops[op].kind) {
  case TP_OP_Sqrt: u = TP_UNARY_SQRT; break;
  case TP_OP_Neg: u = TP_UNARY_NEG; break;
  case TP_OP_Reciprocal: u = TP_UNARY_RECIPROCAL; break;
  case TP_OP_Exp: u = TP_UNARY_EXP; break;
  case TP_OP_Log: u = TP_UNARY_LOG; break;
  case TP_OP_Erf: u = TP_UNARY_ERF; break;
  case TP_OP_Tanh: u = TP_UNARY_TANH; break;
  case TP_OP_Relu: u = TP_UNARY_RELU; break;
  case TP_OP_Sigmoid: u = TP_UNARY_SIGMOID; break;
  case TP_OP_Sin: u = TP_UNARY_SIN; break;
  case TP_OP_Cos: u = TP_UNARY_COS; break;
  case TP_OP_Not: u = TP_UNARY_NOT; break;
  case TP_OP_Gelu: {
    const char *approx = tp_attr_string(m, op, "approximate", "none");
    if (strcmp(approx, "none") == 0) u = TP_UNARY_GELU;
    else if (strcmp(approx, "tanh") == 0) u = TP_UNARY_GELU_TANH;
    else return tp_error_op(d, m, op, "unknown approximate '%s' (expected none or tanh)", approx);
    break;
  }
  default: return tp_internal(d, "tp_exec_unary: op %s", tp_op_info[m->ops[op].kind].name);
  }
  return check(tp_unary(u, &in[0], &out[0]), m, op, in, 1, out, d);
}

int tp_exec_binary(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  TpBinaryOp b;
  switch (m->ops[op].kind) {
  case TP_OP_Add: b = TP_BINARY_ADD; break;
  case TP_OP_Sub: b = TP_BINARY_SUB; break;
  case TP_OP_Mul: b = TP_BINARY_MUL; break;
  case TP_OP_Div: b = TP_BINARY_DIV; break;
  case TP_OP_Pow: b = TP_BINARY_POW; break;
  case TP_OP_Max: b = TP_BINARY_MAX; break;
  case TP_OP_Min: b = TP_BINARY_MIN; break;
  case TP_OP_And: b = TP_BINARY_AND; break;
  case TP_OP_Equal: b = TP_BINARY_EQUAL; break;
  case TP_OP_Less: b = TP_BINARY_LESS; break;
  case TP_OP_LessOrEqual: b = TP_BINARY_LESS_EQUAL; break;
  case TP_OP_Greater: b = TP_BINARY_GREATER; break;
  case TP_OP_GreaterOrEqual: b = TP_BINARY_GREATER_EQUAL; break;
  default: return tp_internal(d, "tp_exec_binary: op %s", tp_op_info[m->ops[op].kind].name);
  }
  return check(tp_binary(b, &in[0], &in[1], &out[0]), m, op, in, 2, out, d);
}

int tp_exec_where(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  return check(tp_where(&in[0], &in[1], &in[2], &out[0]), m, op, in, 3, out, d);
}

int tp_exec_cast(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  return check(tp_cast(&in[0], &out[0]), m, op, in, 1, out, d);
}

/* Gather and GatherElements: one index check and message, the kernel by op kind. */
int tp_exec_gather(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int axis = (int)tp_attr_int(m, op, "axis", 0);
  int64_t bad = 0;
  TpKernelStatus s =
      (m->ops[op].kind == TP_OP_Gather ? tp_gather : tp_gather_elements)(&in[0], &in[1], axis, &out[0], &bad);
  if (s == TP_KERNEL_BAD_INDEX)
    return tp_error_op(d, m, op, "index %lld is out of range for axis %d of size %lld",
                       (long long)bad, axis, (long long)in[0].dims[axis]);
  return check(s, m, op, in, 2, out, d);
}

int tp_exec_tile(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  return check(tp_tile(&in[0], &out[0]), m, op, in, 1, out, d);
}

int tp_exec_cumsum(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int axis = (int)tp_attr_int(m, op, "axis", 0);
  bool exclusive = tp_attr_int(m, op, "exclusive", 0) != 0, reverse = tp_attr_int(m, op, "reverse", 0) != 0;
  return check(tp_cumsum(&in[0], axis, exclusive, reverse, &out[0]), m, op, in, 1, out, d);
}

int tp_exec_reshape(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  return check(tp_reshape(&in[0], &out[0]), m, op, in, 1, out, d);
}

int tp_exec_expand(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  return check(tp_expand(&in[0], &out[0]), m, op, in, 1, out, d);
}

int tp_exec_transpose(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int n;
  const int64_t *perm = tp_attr_ints(m, op, "perm", &n);
  if (n != in[0].rank) return tp_error_op(d, m, op, "perm has %d entries for rank %d", n, in[0].rank);
  return check(tp_transpose(&in[0], perm, &out[0]), m, op, in, 1, out, d);
}

int tp_exec_split(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int axis = (int)tp_attr_int(m, op, "axis", 0);
  return check(tp_split(&in[0], axis, out, m->ops[op].noutputs), m, op, in, 1, out, d);
}

int tp_exec_slice(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int ns, nt;
  const int64_t *starts = tp_attr_ints(m, op, "starts", &ns), *steps = tp_attr_ints(m, op, "steps", &nt);
  if (ns != in[0].rank || nt != in[0].rank)
    return tp_error_op(d, m, op, "starts/steps have %d/%d entries for rank %d", ns, nt, in[0].rank);
  return check(tp_slice(&in[0], starts, steps, &out[0]), m, op, in, 1, out, d);
}

int tp_exec_concat(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int axis = (int)tp_attr_int(m, op, "axis", 0);
  int n = m->ops[op].ninputs;
  return check(tp_concat(in, n, axis, &out[0]), m, op, in, n, out, d);
}

int tp_exec_trilu(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  bool upper = tp_attr_int(m, op, "upper", 1) != 0;
  int64_t k = tp_attr_int(m, op, "k", 0);
  return check(tp_trilu(&in[0], upper, k, &out[0]), m, op, in, 1, out, d);
}

int tp_exec_reduce(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int n;
  const int64_t *axes = tp_attr_ints(m, op, "axes", &n);
  bool mean = m->ops[op].kind == TP_OP_ReduceMean;
  return check(tp_reduce_sum(&in[0], axes, n, mean, &out[0]), m, op, in, 1, out, d);
}
