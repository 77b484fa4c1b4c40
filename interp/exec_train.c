/* The interpreter's training ops: the raised forward ops (Linear, Embedding, CrossEntropy,
 * RMSNorm, Rotary, SwiGLU) and the backward ops of ir/ops.def, read with their canonical
 * attributes and run by the f32 kernels of runtime/cpu (transformer.h, nn_backward.h,
 * layout_backward.h), the same ones the generated trainer calls. Training is f32 only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/cpu/layout_backward.h"
#include "../runtime/cpu/nn_backward.h"
#include "../runtime/cpu/transformer.h"
#include "interp.h"

static const char *dtype_name(TpDType t) {
  const char *s = tp_dtype_name(t);
  return s ? s : "?";
}

/* TP_OK if every present float operand and result is f32; index operands (`skip_in`, a
 * bit per operand) are checked by the caller. */
static int require_f32(const TpModule *m, int op, const TpTensor *in, const TpTensor *out,
                       unsigned skip_in, TpDiag *d) {
  const TpOp *o = &m->ops[op];
  for (int i = 0; i < o->ninputs; i++)
    if (!(skip_in >> i & 1) && o->inputs[i] >= 0 && in[i].dtype != TP_F32)
      return tp_error_op(d, m, op, "operand %d is %s: the CPU training kernels are f32 only", i,
                         dtype_name(in[i].dtype));
  for (int i = 0; i < o->noutputs; i++)
    if (o->outputs[i] >= 0 && out[i].dtype != TP_F32)
      return tp_error_op(d, m, op, "result %d is %s: the CPU training kernels are f32 only", i,
                         dtype_name(out[i].dtype));
  return TP_OK;
}

static int shape_error(const TpModule *m, int op, TpDiag *d) {
  return tp_error_op(d, m, op, "CPU kernel: operand and result shapes do not fit");
}

static bool present_out(const TpModule *m, int op, int i) {
  return i < m->ops[op].noutputs && m->ops[op].outputs[i] >= 0;
}

/* The data of result i, or NULL when it is absent. */
static float *out_f32(const TpModule *m, int op, TpTensor *out, int i) {
  return present_out(m, op, i) ? out[i].data : NULL;
}

static int64_t numel_from(const TpTensor *t, int from, int to) {
  return tp_numel(to - from, t->dims + from);
}

static int64_t last_dim(const TpTensor *t) { return t->rank ? t->dims[t->rank - 1] : 1; }

/* Index operand t (i32 or i64) as int64: t's own data, or a copy to free with free_ids. */
static int64_t *ids_i64(const TpTensor *t) {
  if (t->dtype == TP_I64) return t->data;
  int64_t n = tp_tensor_numel(t);
  int64_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
  TP_ASSERT(ids);
  for (int64_t i = 0; i < n; i++) ids[i] = ((const int32_t *)t->data)[i];
  return ids;
}

static void free_ids(const TpTensor *t, int64_t *ids) {
  if ((void *)ids != t->data) free(ids);
}

static int check_index_dtype(const TpModule *m, int op, const TpTensor *t, TpDiag *d) {
  if (t->dtype == TP_I32 || t->dtype == TP_I64) return TP_OK;
  return tp_error_op(d, m, op, "indices are %s, expected i32 or i64", dtype_name(t->dtype));
}

/* ---- Linear, LinearBackward ---- */

/* M, K, N of Linear(X[..., K], W) and whether W fits. */
static bool linear_dims(const TpModule *m, int op, const TpTensor *x, const TpTensor *w, int64_t *M,
                        int64_t *K, int64_t *N, bool *transpose_w) {
  *transpose_w = tp_attr_int(m, op, "transpose_w", 0) != 0;
  if (x->rank < 1 || w->rank != 2) return false;
  *K = last_dim(x);
  *M = numel_from(x, 0, x->rank - 1);
  *N = *transpose_w ? w->dims[0] : w->dims[1];
  return w->dims[*transpose_w ? 1 : 0] == *K;
}

int tp_exec_linear(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int rc = require_f32(m, op, in, out, 0, d);
  if (rc) return rc;
  int64_t M, K, N;
  bool tw;
  bool has_bias = m->ops[op].ninputs > 2 && m->ops[op].inputs[2] >= 0;
  if (!linear_dims(m, op, &in[0], &in[1], &M, &K, &N, &tw) || tp_tensor_numel(&out[0]) != M * N ||
      (has_bias && tp_tensor_numel(&in[2]) != N))
    return shape_error(m, op, d);
  tp_linear_f32(in[0].data, in[1].data, has_bias ? in[2].data : NULL, M, K, N, tw, out[0].data);
  return TP_OK;
}

int tp_exec_linear_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out,
                            TpDiag *d) {
  int rc = require_f32(m, op, in, out, 0, d);
  if (rc) return rc;
  int64_t M, K, N;
  bool tw;
  if (!linear_dims(m, op, &in[1], &in[2], &M, &K, &N, &tw) || tp_tensor_numel(&in[0]) != M * N ||
      (present_out(m, op, 0) && tp_tensor_numel(&out[0]) != M * K) ||
      (present_out(m, op, 1) && tp_tensor_numel(&out[1]) != K * N) ||
      (present_out(m, op, 2) && tp_tensor_numel(&out[2]) != N))
    return shape_error(m, op, d);
  tp_linear_backward_f32(in[0].data, in[1].data, in[2].data, M, K, N, tw, out_f32(m, op, out, 0),
                         out_f32(m, op, out, 1), out_f32(m, op, out, 2));
  return TP_OK;
}

/* ---- Embedding, GatherBackward, GatherElementsBackward, SliceBackward ---- */

int tp_exec_embedding(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int rc = require_f32(m, op, in, out, 1u << 1, d);
  if (rc || (rc = check_index_dtype(m, op, &in[1], d))) return rc;
  const TpTensor *W = &in[0];
  int64_t n = tp_tensor_numel(&in[1]);
  if (W->rank != 2 || tp_tensor_numel(&out[0]) != n * W->dims[1]) return shape_error(m, op, d);
  int64_t *ids = ids_i64(&in[1]), bad = 0;
  TpKernelStatus s = tp_embedding_f32(W->data, ids, n, W->dims[0], W->dims[1], out[0].data, &bad);
  if (s == TP_KERNEL_BAD_INDEX)
    rc = tp_error_op(d, m, op, "id %lld at position %lld is out of range for %lld embedding rows",
                     (long long)ids[bad], (long long)bad, (long long)W->dims[0]);
  free_ids(&in[1], ids);
  return rc;
}

/* GatherBackward and GatherElementsBackward: the kernel by op kind. */
int tp_exec_gather_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out,
                            TpDiag *d) {
  int rc = require_f32(m, op, in, out, 1u << 1, d);
  if (rc || (rc = check_index_dtype(m, op, &in[1], d))) return rc;
  int axis = (int)tp_attr_int(m, op, "axis", 0);
  int64_t bad = 0;
  TpKernelStatus s = (m->ops[op].kind == TP_OP_GatherBackward ? tp_gather_backward : tp_gather_elements_backward)(
      &in[0], &in[1], axis, &out[0], &bad);
  if (s == TP_KERNEL_BAD_INDEX)
    return tp_error_op(d, m, op, "index %lld is out of range for axis %d of size %lld",
                       (long long)bad, axis, (long long)out[0].dims[axis]);
  return s == TP_KERNEL_OK ? TP_OK : shape_error(m, op, d);
}

int tp_exec_slice_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out,
                           TpDiag *d) {
  int ns, nt;
  const int64_t *starts = tp_attr_ints(m, op, "starts", &ns),
                *steps = tp_attr_ints(m, op, "steps", &nt);
  if (ns != out[0].rank || nt != out[0].rank)
    return tp_error_op(d, m, op, "starts/steps have %d/%d entries for rank %d", ns, nt,
                       out[0].rank);
  TpKernelStatus s = tp_slice_backward(&in[0], starts, steps, &out[0]);
  if (s == TP_KERNEL_BAD_DTYPE)
    return tp_error_op(d, m, op, "CPU kernel: unsupported element types (%s -> %s)",
                       dtype_name(in[0].dtype), dtype_name(out[0].dtype));
  return s == TP_KERNEL_OK ? TP_OK : shape_error(m, op, d);
}

/* ---- MatMulBackward, LayerNormBackward, GeluBackward, Softmax/LogSoftmaxBackward ---- */

int tp_exec_matmul_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out,
                            TpDiag *d) {
  int rc = require_f32(m, op, in, out, 0, d);
  if (rc) return rc;
  TpKernelStatus s = tp_matmul_backward_f32(&in[0], &in[1], &in[2], present_out(m, op, 0) ? &out[0] : NULL,
                                            present_out(m, op, 1) ? &out[1] : NULL);
  return s == TP_KERNEL_OK ? TP_OK : shape_error(m, op, d);
}

int tp_exec_layernorm_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out,
                               TpDiag *d) {
  int rc = require_f32(m, op, in, out, 0, d);
  if (rc) return rc;
  const TpTensor *X = &in[1];
  int axis = (int)tp_attr_int(m, op, "axis", X->rank - 1);
  if (axis < 0 || axis >= X->rank) return shape_error(m, op, d);
  int64_t rows = numel_from(X, 0, axis), n = numel_from(X, axis, X->rank);
  /* Scale (and so dScale, dB) must have the normalised shape: no broadcast to sum back. */
  if (tp_tensor_numel(&in[0]) != rows * n || tp_tensor_numel(&in[2]) != n ||
      tp_tensor_numel(&in[3]) != rows || tp_tensor_numel(&in[4]) != rows ||
      (present_out(m, op, 0) && tp_tensor_numel(&out[0]) != rows * n) ||
      (present_out(m, op, 1) && tp_tensor_numel(&out[1]) != n) ||
      (present_out(m, op, 2) && tp_tensor_numel(&out[2]) != n))
    return shape_error(m, op, d);
  tp_layernorm_backward_f32(in[0].data, X->data, in[2].data, in[3].data, in[4].data, rows, n,
                            out_f32(m, op, out, 0), out_f32(m, op, out, 1), out_f32(m, op, out, 2));
  return TP_OK;
}

int tp_exec_gelu_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int rc = require_f32(m, op, in, out, 0, d);
  if (rc) return rc;
  const char *approx = tp_attr_string(m, op, "approximate", "none");
  bool tanh_approx = strcmp(approx, "tanh") == 0;
  if (!tanh_approx && strcmp(approx, "none") != 0)
    return tp_error_op(d, m, op, "unknown approximate '%s' (expected none or tanh)", approx);
  int64_t n = tp_tensor_numel(&in[1]);
  if (tp_tensor_numel(&in[0]) != n || tp_tensor_numel(&out[0]) != n) return shape_error(m, op, d);
  tp_gelu_backward_f32(in[0].data, in[1].data, n, tanh_approx, out[0].data);
  return TP_OK;
}

int tp_exec_softmax_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out,
                             TpDiag *d) {
  int rc = require_f32(m, op, in, out, 0, d);
  if (rc) return rc;
  const TpTensor *Y = &in[1];
  int axis = (int)tp_attr_int(m, op, "axis", Y->rank - 1);
  int64_t n = tp_tensor_numel(Y);
  if (axis < 0 || axis >= Y->rank || tp_tensor_numel(&in[0]) != n || tp_tensor_numel(&out[0]) != n)
    return shape_error(m, op, d);
  tp_softmax_backward_f32(in[0].data, Y->data, numel_from(Y, 0, axis), Y->dims[axis],
                          numel_from(Y, axis + 1, Y->rank),
                          m->ops[op].kind == TP_OP_LogSoftmaxBackward, out[0].data);
  return TP_OK;
}

/* ---- AttentionBackward ---- */

int tp_exec_attention_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out,
                               TpDiag *d) {
  int rc = require_f32(m, op, in, out, 1u << 4, d); /* the mask: below */
  if (rc) return rc;
  const TpTensor *dY = &in[0], *Q = &in[1], *K = &in[2], *V = &in[3];
  TpAttention p;
  rc = tp_attention_params(m, op, Q, K, V, &p, d);
  if (rc) return rc;
  if (tp_tensor_numel(dY) != p.batch * p.q_heads * p.q_len * p.v_head_size ||
      (present_out(m, op, 0) && tp_tensor_numel(&out[0]) != tp_tensor_numel(Q)) ||
      (present_out(m, op, 1) && tp_tensor_numel(&out[1]) != tp_tensor_numel(K)) ||
      (present_out(m, op, 2) && tp_tensor_numel(&out[2]) != tp_tensor_numel(V)))
    return shape_error(m, op, d);
  if (m->ops[op].ninputs > 4 && m->ops[op].inputs[4] >= 0) {
    const TpTensor *mask = &in[4];
    if (mask->dtype != TP_BOOL && mask->dtype != TP_F32)
      return tp_error_op(d, m, op, "the mask is %s: the CPU training kernels take bool or f32", dtype_name(mask->dtype));
    tp_attention_set_mask(&p, mask->data, mask->dtype == TP_BOOL, mask->dims, mask->rank);
  }
  tp_attention_backward_f32(&p, dY->data, Q->data, K->data, V->data, out_f32(m, op, out, 0),
                            out_f32(m, op, out, 1), out_f32(m, op, out, 2));
  return TP_OK;
}

/* ---- CrossEntropy, CrossEntropyBackward ---- */

/* Logits [..., V] and Targets [...] as R rows of V; false if they do not fit. */
static bool cross_entropy_dims(const TpTensor *logits, const TpTensor *targets, int64_t *R,
                               int64_t *V) {
  if (logits->rank < 1) return false;
  *V = last_dim(logits);
  *R = numel_from(logits, 0, logits->rank - 1);
  return tp_tensor_numel(targets) == *R;
}

static int bad_target(const TpModule *m, int op, const int64_t *targets, int64_t row, int64_t V,
                      TpDiag *d) {
  return tp_error_op(d, m, op, "target %lld at position %lld is not a class in [0, %lld)",
                     (long long)targets[row], (long long)row, (long long)V);
}

int tp_exec_cross_entropy(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int rc = require_f32(m, op, in, out, 1u << 1, d);
  if (rc || (rc = check_index_dtype(m, op, &in[1], d))) return rc;
  int64_t R, V, bad = 0;
  if (!cross_entropy_dims(&in[0], &in[1], &R, &V) || tp_tensor_numel(&out[0]) != 1)
    return shape_error(m, op, d);
  float denom = (float)tp_attr_float(m, op, "denominator", (double)R);
  int64_t *targets = ids_i64(&in[1]);
  if (tp_cross_entropy_f32(in[0].data, targets, R, V, denom, out[0].data, &bad) != TP_KERNEL_OK)
    rc = bad_target(m, op, targets, bad, V, d);
  free_ids(&in[1], targets);
  return rc;
}

int tp_exec_cross_entropy_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out,
                                   TpDiag *d) {
  int rc = require_f32(m, op, in, out, 1u << 2, d);
  if (rc || (rc = check_index_dtype(m, op, &in[2], d))) return rc;
  int64_t R, V, bad = 0;
  if (tp_tensor_numel(&in[0]) != 1 || !cross_entropy_dims(&in[1], &in[2], &R, &V) ||
      tp_tensor_numel(&out[0]) != R * V)
    return shape_error(m, op, d);
  float denom = (float)tp_attr_float(m, op, "denominator", (double)R);
  int64_t *targets = ids_i64(&in[2]);
  if (tp_cross_entropy_backward_f32(*(const float *)in[0].data, in[1].data, targets, R, V, denom,
                                    out[0].data, &bad) != TP_KERNEL_OK)
    rc = bad_target(m, op, targets, bad, V, d);
  free_ids(&in[2], targets);
  return rc;
}

/* ---- RMSNorm, Rotary, SwiGLU and their backward ---- */

/* Rows and row length of RMSNorm(X, Scale) {axis}; false if Scale does not fit. */
static bool rmsnorm_dims(const TpModule *m, int op, const TpTensor *x, const TpTensor *scale,
                         int64_t *rows, int64_t *n) {
  int axis = (int)tp_attr_int(m, op, "axis", x->rank - 1);
  if (axis < 0 || axis >= x->rank) return false;
  *rows = numel_from(x, 0, axis);
  *n = numel_from(x, axis, x->rank);
  return tp_tensor_numel(scale) == *n;
}

int tp_exec_rmsnorm(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int rc = require_f32(m, op, in, out, 0, d);
  if (rc) return rc;
  int64_t rows, n;
  if (!rmsnorm_dims(m, op, &in[0], &in[1], &rows, &n)) return shape_error(m, op, d);
  tp_rmsnorm_f32(in[0].data, in[1].data, rows, n, (float)tp_attr_float(m, op, "epsilon", 0), out[0].data);
  return TP_OK;
}

int tp_exec_rmsnorm_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int rc = require_f32(m, op, in, out, 0, d);
  if (rc) return rc;
  int64_t rows, n;
  if (!rmsnorm_dims(m, op, &in[1], &in[2], &rows, &n) || tp_tensor_numel(&in[0]) != rows * n)
    return shape_error(m, op, d);
  tp_rmsnorm_backward_f32(in[0].data, in[1].data, in[2].data, rows, n, (float)tp_attr_float(m, op, "epsilon", 0),
                          out_f32(m, op, out, 0), out_f32(m, op, out, 1));
  return TP_OK;
}

/* Rotary and RotaryBackward: in[0] is X or dY, in[1] and in[2] the tables. */
int tp_exec_rotary(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int rc = require_f32(m, op, in, out, 0, d);
  if (rc) return rc;
  const TpTensor *x = &in[0], *cos = &in[1], *sin = &in[2];
  int64_t rd = tp_attr_int(m, op, "rotary_dim", 0);
  bool interleaved = tp_attr_int(m, op, "interleaved", 0) != 0;
  bool ok = x->rank >= 1 && rd > 0 && rd % 2 == 0 && rd <= last_dim(x) && cos->rank == x->rank &&
            sin->rank == x->rank && tp_tensor_numel(&out[0]) == tp_tensor_numel(x);
  for (int k = 0; ok && k < x->rank; k++)
    ok = cos->dims[k] == sin->dims[k] &&
         (k == x->rank - 1 ? cos->dims[k] == rd : cos->dims[k] == 1 || cos->dims[k] == x->dims[k]);
  if (!ok) return shape_error(m, op, d);
  if (m->ops[op].kind == TP_OP_Rotary)
    tp_rotary_f32(x->data, cos->data, sin->data, x->rank, x->dims, cos->dims, rd, interleaved, out[0].data);
  else
    tp_rotary_backward_f32(x->data, cos->data, sin->data, x->rank, x->dims, cos->dims, rd, interleaved, out[0].data);
  return TP_OK;
}

int tp_exec_swiglu(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int rc = require_f32(m, op, in, out, 0, d);
  if (rc) return rc;
  int64_t n = tp_tensor_numel(&in[0]);
  if (tp_tensor_numel(&in[1]) != n || tp_tensor_numel(&out[0]) != n) return shape_error(m, op, d);
  tp_swiglu_f32(in[0].data, in[1].data, n, out[0].data);
  return TP_OK;
}

int tp_exec_swiglu_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  int rc = require_f32(m, op, in, out, 0, d);
  if (rc) return rc;
  int64_t n = tp_tensor_numel(&in[1]);
  if (tp_tensor_numel(&in[0]) != n || tp_tensor_numel(&in[2]) != n) return shape_error(m, op, d);
  tp_swiglu_backward_f32(in[0].data, in[1].data, in[2].data, n, out_f32(m, op, out, 0), out_f32(m, op, out, 1));
  return TP_OK;
}
