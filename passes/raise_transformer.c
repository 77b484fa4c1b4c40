/* raise-transformer (and raise-transformer-unfused, without the last three patterns
 * below): requires folded constants (fold-constants) so masks and scalars are
 * CONST values; provides the transformer ops of ir/ops.def in place of the primitive chains
 * exporters write (onnx-export-patterns.md), leaving the chains dead for dce:
 *   Gather(table [V, C], ids, axis 0)                           -> Embedding(table, ids)
 *   MatMul(x, W) (+ Add(bias [N])), Gemm, Reshape-Gemm-Reshape  -> Linear(x, W, bias?)
 *   ReduceMean-Sub-Pow(2)-ReduceMean-Add(eps)-Sqrt-Div(-Mul(scale))(-Add(bias))
 *                                                               -> LayerNorm {axis, epsilon}
 *   0.5 * x * (1 + erf(x / sqrt 2)), 0.5 * x * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *                                                               -> Gelu {approximate}
 *   Softmax(mask(scale * MatMul(Q, K^T))) then MatMul(., V)      -> Attention(Q, K, V)
 *                                                                  {is_causal = 1, scale}
 *   Sqrt(mean(x^2) + eps): x * 1/sqrt (or x / sqrt) (* scale)    -> RMSNorm {axis, epsilon}
 *   x * cos + rot(x) * sin, rot = rotate_half or rotate_every_two -> Rotary {interleaved,
 *     and Concat(Rotary(x[..., :rd]), x[..., rd:])                   rotary_dim}
 *   gate * Sigmoid(gate) * up                                    -> SwiGLU(gate, up)
 * (no-op Casts between the steps of an RMSNorm skipped)
 * Every constant is checked (exponents, epsilon, GELU coefficients, reduce axes), and the
 * causal mask is verified from its values: the masked positions of the [T, T] scores must be
 * exactly those above the diagonal. Whatever does not match stays primitive, so the pass
 * never changes what the module computes (beyond float rounding).
 *
 * Each pattern is rewritten in place at its last op (the one whose result the rest of the
 * graph reads), so the result keeps its name, uses and origin and every operand is already
 * defined there; only Attention's K (when the export folded K^T into the head transpose)
 * needs a new op, placed by tp_sort_ops. A weight that retie-params re-tied stays the
 * result of its "retie" op (Linear reads it as W), so the record of the tie survives. */
#include "../ir/ir.h"
#include "../runtime/interp/interp.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- queries ---- */

/* The live op of `kind` that defines v, or -1. */
static int def_of(const TpModule *m, int v, TpOpKind kind) {
  if (v < 0 || m->values[v].kind != TP_VAL_RESULT) return -1;
  int o = m->values[v].def;
  return o >= 0 && !m->ops[o].dead && m->ops[o].kind == kind ? o : -1;
}

/* The first live op of `kind` that reads v (as operand `slot`, or any when slot < 0). */
static int user_of(const TpModule *m, int v, TpOpKind kind, int slot) {
  for (int o = 0; o < m->nops; o++) {
    const TpOp *op = &m->ops[o];
    if (op->dead || op->kind != kind) continue;
    for (int i = 0; i < op->ninputs; i++)
      if (op->inputs[i] == v && (slot < 0 || slot == i)) return o;
  }
  return -1;
}

static int in(const TpModule *m, int o, int i) { return m->ops[o].inputs[i]; }
static int out(const TpModule *m, int o) { return m->ops[o].outputs[0]; }
static const TpType *type(const TpModule *m, int v) { return &m->values[v].type; }

/* The other operand of binary op o, given one of them; -1 if `one` is not an operand. */
static int other(const TpModule *m, int o, int one) {
  if (in(m, o, 0) == one) return in(m, o, 1);
  if (in(m, o, 1) == one) return in(m, o, 0);
  return -1;
}

/* v is constant data holding one floating-point number (any rank); *x gets it. */
static bool scalar(const TpModule *m, int v, double *x) {
  if (v < 0) return false;
  const TpValue *val = &m->values[v];
  if ((val->kind != TP_VAL_CONST && val->kind != TP_VAL_PARAM) || !tp_dtype_is_float(val->type.dtype) ||
      tp_type_numel(&val->type) != 1)
    return false;
  TpTensor t = tp_value_tensor(m, v);
  *x = tp_tensor_get_f64(&t, 0);
  return true;
}

static bool scalar_is(const TpModule *m, int v, double want) {
  double x;
  return scalar(m, v, &x) && x == want;
}

/* An irrational coefficient as the exporter rounded it (float32 or better). */
static bool scalar_near(const TpModule *m, int v, double want) {
  double x;
  return scalar(m, v, &x) && fabs(x - want) <= 1e-6 * fabs(want);
}

/* The other operand of binary op o when one of its operands is a scalar == want. */
static int with_scalar(const TpModule *m, int o, double want, bool near) {
  for (int i = 0; i < 2; i++) {
    int c = in(m, o, i);
    if (near ? scalar_near(m, c, want) : scalar_is(m, c, want)) return in(m, o, 1 - i);
  }
  return -1;
}

static bool is_float(const TpModule *m, int v) { return v >= 0 && tp_dtype_is_float(type(m, v)->dtype); }

/* A 1-D [n] operand of dtype dt (a LayerNorm scale or shift, a bias). */
static bool is_vector(const TpModule *m, int v, int64_t n, TpDType dt) {
  const TpType *t = type(m, v);
  return t->rank == 1 && t->dims[0] == n && t->dtype == dt;
}

/* ---- rewriting ---- */

/* Op o becomes kind(inputs) with no attributes; it keeps its (single) result and origin. */
static void rewrite(TpModule *m, int o, TpOpKind kind, const int *inputs, int n) {
  int *copy = tp_alloc(m, (size_t)n * sizeof *copy);
  memcpy(copy, inputs, (size_t)n * sizeof *copy);
  TpOp *op = &m->ops[o];
  TP_ASSERT(op->noutputs == 1);
  op->kind = kind;
  op->inputs = copy;
  op->ninputs = n;
  op->attrs = NULL;
  op->nattrs = 0;
}

/* The rewritten op must compute the type its result already has: a mismatch is a bug in a
 * matcher, reported (not aborted) so the module can still be dumped. */
static int check(TpModule *m, int o, TpDiag *d) {
  TpDiag quiet;
  tp_diag_init(&quiet, "", NULL, NULL);
  if (tp_infer_op(m, o, &quiet) == TP_OK) return TP_OK;
  return tp_internal(d, "raise-transformer made an invalid %s at node '%s': %s", tp_op_info[m->ops[o].kind].name,
                     m->ops[o].origin.node ? m->ops[o].origin.node : "?", quiet.last);
}

/* ---- Embedding ---- */

static bool is_retied(const TpModule *m, int v) {
  const TpValue *val = &m->values[v];
  return val->kind == TP_VAL_RESULT && val->origin.op_type && strcmp(val->origin.op_type, "retie") == 0;
}

/* A weight matrix: a PARAM, a re-tied one, or Transpose(PARAM) (*transposed is then set). */
static bool weight(const TpModule *m, int v, int *w, bool *transposed) {
  if (v < 0 || type(m, v)->rank != 2) return false;
  *w = v;
  *transposed = false;
  if (m->values[v].kind == TP_VAL_PARAM || is_retied(m, v)) return true;
  int t = def_of(m, v, TP_OP_Transpose);
  if (t < 0 || m->values[in(m, t, 0)].kind != TP_VAL_PARAM) return false;
  *w = in(m, t, 0);
  *transposed = true;
  return true;
}

static int raise_embedding(TpModule *m, int o, TpDiag *d) {
  int table = in(m, o, 0), ids = in(m, o, 1), w;
  bool transposed;
  TpDType it = type(m, ids)->dtype;
  if (tp_attr_int(m, o, "axis", 0) != 0 || !is_float(m, table) || !weight(m, table, &w, &transposed) ||
      transposed || (it != TP_I64 && it != TP_I32))
    return TP_OK;
  rewrite(m, o, TP_OP_Embedding, (int[]){table, ids}, 2);
  return check(m, o, d);
}

/* ---- Linear ---- */

static int make_linear(TpModule *m, int o, int x, int w, bool transpose_w, int bias, TpDiag *d) {
  rewrite(m, o, TP_OP_Linear, (int[]){x, w, bias}, bias >= 0 ? 3 : 2);
  tp_set_attr_int(m, o, "transpose_w", transpose_w);
  return check(m, o, d);
}

/* MatMul(x [..., K], W [K, N]) */
static int raise_matmul(TpModule *m, int o, TpDiag *d) {
  int x = in(m, o, 0), w;
  bool t;
  if (!is_float(m, x) || type(m, x)->rank < 1 || !weight(m, in(m, o, 1), &w, &t)) return TP_OK;
  return make_linear(m, o, x, w, t, -1, d);
}

/* Gemm(A [M, K], B, C? [N]) with alpha 1, beta 1 (or no C), no transA. */
static int raise_gemm(TpModule *m, int o, TpDiag *d) {
  int a = in(m, o, 0), c = m->ops[o].ninputs > 2 ? in(m, o, 2) : -1, w;
  bool t;
  if (!is_float(m, a) || type(m, a)->rank != 2 || tp_attr_float(m, o, "alpha", 1) != 1 ||
      tp_attr_int(m, o, "transA", 0) != 0 || !weight(m, in(m, o, 1), &w, &t))
    return TP_OK;
  bool transpose_w = t != (tp_attr_int(m, o, "transB", 0) != 0);
  int64_t n = type(m, out(m, o))->dims[1];
  if (c >= 0 && (tp_attr_float(m, o, "beta", 1) != 1 || !is_vector(m, c, n, type(m, a)->dtype))) return TP_OK;
  return make_linear(m, o, a, w, transpose_w, c, d);
}

/* Linear without bias, read only here: the bias folds in. */
static int bare_linear(const TpModule *m, int v) {
  int l = def_of(m, v, TP_OP_Linear);
  return l >= 0 && m->ops[l].ninputs == 2 && tp_use_count(m, v) == 1 ? l : -1;
}

/* Add(Linear(x, W), bias [N]) in either order. */
static int raise_bias(TpModule *m, int o, TpDiag *d) {
  for (int i = 0; i < 2; i++) {
    int y = in(m, o, i), b = in(m, o, 1 - i), l = bare_linear(m, y);
    const TpType *ty = type(m, y);
    if (l < 0 || !is_vector(m, b, ty->dims[ty->rank - 1], ty->dtype) || !tp_type_equal(ty, type(m, out(m, o))))
      continue;
    return make_linear(m, o, in(m, l, 0), in(m, l, 1), tp_attr_int(m, l, "transpose_w", 0), b, d);
  }
  return TP_OK;
}

/* Reshape(Linear(Reshape(x [..., K]) [M, K]) [M, N]) [..., N] -> Linear(x): Conv1D's
 * flatten-Gemm-unflatten, when the reshapes only merge and split the leading dims. */
static int raise_flattened(TpModule *m, int o, TpDiag *d) {
  int l = def_of(m, in(m, o, 0), TP_OP_Linear);
  int r = l >= 0 ? def_of(m, in(m, l, 0), TP_OP_Reshape) : -1;
  if (r < 0 || tp_use_count(m, out(m, l)) != 1) return TP_OK;
  int x = in(m, r, 0);
  const TpType *tx = type(m, x), *ty = type(m, out(m, o)), *flat = type(m, out(m, r));
  if (tx->rank < 2 || tx->rank != ty->rank || flat->rank != 2 || flat->dims[1] != tx->dims[tx->rank - 1])
    return TP_OK;
  for (int i = 0; i < tx->rank - 1; i++)
    if (tx->dims[i] != ty->dims[i]) return TP_OK;
  int bias = m->ops[l].ninputs > 2 ? in(m, l, 2) : -1;
  return make_linear(m, o, x, in(m, l, 1), tp_attr_int(m, l, "transpose_w", 0), bias, d);
}

/* ---- LayerNorm ---- */

/* A new f32 CONST [c] of ones, "<result of op o>.ones": a normalisation's missing scale. */
static int ones(TpModule *m, int64_t c, int o) {
  float *data = malloc((size_t)c * sizeof *data + 1);
  TP_ASSERT(data);
  for (int64_t i = 0; i < c; i++) data[i] = 1;
  int v = tp_add_const(m, tp_unique_name(m, tp_strfmt(m, "%s.ones", m->values[out(m, o)].name)),
                       tp_type_make(TP_F32, 1, &c), data, m->ops[o].origin);
  free(data);
  return v;
}

/* ReduceMean(x) over the last axis, keeping it. */
static int mean_last(const TpModule *m, int v) {
  int o = def_of(m, v, TP_OP_ReduceMean);
  if (o < 0) return -1;
  int n;
  const int64_t *axes = tp_attr_ints(m, o, "axes", &n);
  int rank = type(m, in(m, o, 0))->rank;
  return n == 1 && axes[0] == rank - 1 && tp_attr_int(m, o, "keepdims", 1) == 1 ? o : -1;
}

/* Anchored at n = Div(x - mean(x), sqrt(mean((x - mean(x))^2) + eps)). */
static int raise_layernorm(TpModule *m, int div, TpDiag *d) {
  int centred = in(m, div, 0);
  int sub = def_of(m, centred, TP_OP_Sub);
  int sq = def_of(m, in(m, div, 1), TP_OP_Sqrt);
  if (sub < 0 || sq < 0) return TP_OK;
  int x = in(m, sub, 0), mu = mean_last(m, in(m, sub, 1));
  if (mu < 0 || in(m, mu, 0) != x || !is_float(m, x)) return TP_OK;
  int add = def_of(m, in(m, sq, 0), TP_OP_Add);
  double eps = -1;
  int var = -1;
  for (int i = 0; add >= 0 && i < 2; i++)
    if (scalar(m, in(m, add, i), &eps)) var = mean_last(m, in(m, add, 1 - i));
  if (var < 0 || !(eps >= 0)) return TP_OK;
  int pow = def_of(m, in(m, var, 0), TP_OP_Pow), mul = def_of(m, in(m, var, 0), TP_OP_Mul);
  bool squared = (pow >= 0 && in(m, pow, 0) == centred && scalar_is(m, in(m, pow, 1), 2)) ||
                 (mul >= 0 && in(m, mul, 0) == centred && in(m, mul, 1) == centred);
  TpType tx = *type(m, x);
  if (!squared || !tp_type_equal(type(m, out(m, div)), &tx)) return TP_OK;

  /* the affine part: Mul by scale [C], then Add of shift [C], each in either order; the
   * last op of the chain becomes the LayerNorm */
  int64_t c = tx.dims[tx.rank - 1];
  int last = div, scale = -1, shift = -1;
  for (int o = 0; o < m->nops && scale < 0; o++) {
    if (m->ops[o].dead || m->ops[o].kind != TP_OP_Mul) continue;
    int s = other(m, o, out(m, div));
    if (s >= 0 && is_vector(m, s, c, tx.dtype)) scale = s, last = o;
  }
  for (int o = 0; o < m->nops && scale >= 0 && shift < 0; o++) {
    if (m->ops[o].dead || m->ops[o].kind != TP_OP_Add) continue;
    int s = other(m, o, out(m, last));
    if (s >= 0 && is_vector(m, s, c, tx.dtype)) shift = s, last = o;
  }
  if (scale < 0) { /* no affine part: the Div itself becomes LayerNorm(x, ones) */
    if (tx.dtype != TP_F32) return TP_OK;
    scale = ones(m, c, div);
  }
  rewrite(m, last, TP_OP_LayerNorm, (int[]){x, scale, shift}, shift >= 0 ? 3 : 2);
  tp_set_attr_int(m, last, "axis", tx.rank - 1);
  tp_set_attr_float(m, last, "epsilon", eps);
  return check(m, last, d);
}

/* ---- GELU ---- */

/* Given u = 1 + erf(..) or 1 + tanh(..), the op computing 0.5 * x * u in any association:
 * (u x) 0.5, (u 0.5) x, u (x 0.5); -1 if none. */
static int half_x_times(const TpModule *m, int u, int x) {
  for (int o = 0; o < m->nops; o++) {
    if (m->ops[o].dead || m->ops[o].kind != TP_OP_Mul) continue;
    int f = other(m, o, u);
    if (f < 0) continue;
    bool need_half = f == x; /* else the factor x is missing */
    if (!need_half && !scalar_is(m, f, 0.5)) {
      int mx = def_of(m, f, TP_OP_Mul);
      if (mx >= 0 && with_scalar(m, mx, 0.5, false) == x) return o;
      continue;
    }
    for (int p = o + 1; p < m->nops; p++) {
      if (m->ops[p].dead || m->ops[p].kind != TP_OP_Mul) continue;
      int g = other(m, p, out(m, o));
      if (g >= 0 && (need_half ? scalar_is(m, g, 0.5) : g == x)) return p;
    }
  }
  return -1;
}

static int make_gelu(TpModule *m, int core, int x, const char *approximate, TpDiag *d) {
  int u = -1;
  for (int o = 0; o < m->nops && u < 0; o++)
    if (!m->ops[o].dead && m->ops[o].kind == TP_OP_Add && with_scalar(m, o, 1, false) == out(m, core)) u = out(m, o);
  int last = u >= 0 ? half_x_times(m, u, x) : -1;
  if (last < 0 || !tp_type_equal(type(m, out(m, last)), type(m, x))) return TP_OK;
  rewrite(m, last, TP_OP_Gelu, &x, 1);
  tp_set_attr_string(m, last, "approximate", approximate);
  return check(m, last, d);
}

/* Erf(x / sqrt 2) or Erf(x * (1 / sqrt 2)). */
static int raise_gelu_erf(TpModule *m, int erf, TpDiag *d) {
  int a = in(m, erf, 0), div = def_of(m, a, TP_OP_Div), mul = def_of(m, a, TP_OP_Mul), x = -1;
  if (div >= 0 && scalar_near(m, in(m, div, 1), sqrt(2.0))) x = in(m, div, 0);
  if (mul >= 0) x = with_scalar(m, mul, sqrt(0.5), true);
  if (!is_float(m, x)) return TP_OK;
  return make_gelu(m, erf, x, "none", d);
}

/* v = x^3 as Pow(x, 3), Mul(x, Mul(x, x)) or Mul(Mul(x, x), x): x, else -1. */
static int cube_base(const TpModule *m, int v) {
  int pow = def_of(m, v, TP_OP_Pow);
  if (pow >= 0) return scalar_is(m, in(m, pow, 1), 3) ? in(m, pow, 0) : -1;
  int mul = def_of(m, v, TP_OP_Mul);
  for (int i = 0; mul >= 0 && i < 2; i++) {
    int x = in(m, mul, i), sq = def_of(m, in(m, mul, 1 - i), TP_OP_Mul);
    if (sq >= 0 && in(m, sq, 0) == x && in(m, sq, 1) == x) return x;
  }
  return -1;
}

/* Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)). */
static int raise_gelu_tanh(TpModule *m, int tanh_op, TpDiag *d) {
  int mul = def_of(m, in(m, tanh_op, 0), TP_OP_Mul);
  int inner = mul >= 0 ? with_scalar(m, mul, 0.79788456080286536 /* sqrt(2/pi) */, true) : -1;
  int add = def_of(m, inner, TP_OP_Add);
  for (int i = 0; add >= 0 && i < 2; i++) {
    int x = in(m, add, i), k = def_of(m, in(m, add, 1 - i), TP_OP_Mul);
    if (k >= 0 && cube_base(m, with_scalar(m, k, 0.044715, true)) == x && is_float(m, x))
      return make_gelu(m, tanh_op, x, "tanh", d);
  }
  return TP_OK;
}

/* ---- causal self-attention ---- */

/* The lowest finite value of dt: exporters mask with it (finfo.min) or with -inf. */
static double lowest(TpDType dt) {
  switch (dt) {
  case TP_F16: return -65504.0;
  case TP_BF16: return -3.3895313892515355e38;
  case TP_F64: return -DBL_MAX;
  default: return -FLT_MAX;
  }
}

enum { EVAL_DEPTH = 8, EVAL_MAX_BYTES = 64 << 20 };

/* v depends on constant data alone: CONST or PARAM leaves, at most `depth` small ops deep. */
static bool computable(const TpModule *m, int v, int depth) {
  const TpValue *val = &m->values[v];
  if ((size_t)tp_type_numel(&val->type) * tp_dtype_size(val->type.dtype) > EVAL_MAX_BYTES) return false;
  if (val->kind == TP_VAL_CONST || val->kind == TP_VAL_PARAM) return true;
  if (val->kind != TP_VAL_RESULT || depth == 0) return false;
  const TpOp *op = &m->ops[val->def];
  if (op->dead || op->noutputs != 1 || op->ninputs > 8) return false;
  for (int i = 0; i < op->ninputs; i++)
    if (op->inputs[i] >= 0 && !computable(m, op->inputs[i], depth - 1)) return false;
  return true;
}

/* The data of v when it is computable: e.g. a mask that an export without constant folding
 * computes from a float buffer (Slice(causal) == 0). The caller frees t->data. */
static bool evaluate(const TpModule *m, int v, int depth, TpTensor *t) {
  *t = tp_value_tensor(m, v);
  const void *src = t->data;
  t->data = NULL;
  if (!computable(m, v, depth)) return false;
  const TpValue *val = &m->values[v];
  size_t bytes = tp_tensor_bytes(t);
  void *data = malloc(bytes + 1);
  TP_ASSERT(data);
  if (val->kind != TP_VAL_RESULT) {
    memcpy(data, src, bytes);
    t->data = data;
    return true;
  }
  const TpOp *op = &m->ops[val->def];
  TpTensor ins[8] = {{0}};
  bool ok = true;
  for (int i = 0; i < op->ninputs && ok; i++)
    if (op->inputs[i] >= 0) ok = evaluate(m, op->inputs[i], depth - 1, &ins[i]);
  TpDiag quiet;
  tp_diag_init(&quiet, "", NULL, NULL);
  t->data = data;
  ok = ok && tp_exec_op(m, val->def, ins, t, &quiet) == TP_OK;
  for (int i = 0; i < op->ninputs; i++) free(ins[i].data);
  if (!ok) {
    free(data);
    t->data = NULL;
  }
  return ok;
}

/* Every element of constant v is -inf or <= the dtype's lowest finite value. */
static bool all_masked(const TpModule *m, int v, TpDType dt) {
  TpTensor t;
  if (!is_float(m, v) || !evaluate(m, v, EVAL_DEPTH, &t)) return false;
  bool ok = true;
  for (int64_t i = 0, n = tp_tensor_numel(&t); i < n && ok; i++) ok = tp_tensor_get_f64(&t, i) <= lowest(dt);
  free(t.data);
  return ok;
}

/* Checks the mask c against causality over scores [.., T, T] (c broadcasts to them):
 * element (i, j) of every leading index must be masked exactly when j > i. A bool mask is
 * masked where it equals `masked_when`; an additive float mask must be 0 below and on the
 * diagonal and <= lowest(dt) above it. */
static bool causal(const TpModule *m, int c, int64_t t, bool additive, bool masked_when, TpDType dt) {
  TpTensor k;
  if (additive ? !is_float(m, c) : type(m, c)->dtype != TP_BOOL) return false;
  if (!evaluate(m, c, EVAL_DEPTH, &k)) return false;
  int64_t rows = k.rank >= 2 ? k.dims[k.rank - 2] : 1, cols = k.rank >= 1 ? k.dims[k.rank - 1] : 1;
  int64_t n = tp_tensor_numel(&k);
  bool ok = (rows == 1 || rows == t) && (cols == 1 || cols == t) && n > 0;
  for (int64_t lead = 0; ok && lead < n / (rows * cols); lead++)
    for (int64_t i = 0; ok && i < t; i++)
      for (int64_t j = 0; ok && j < t; j++) {
        double e = tp_tensor_get_f64(&k, lead * rows * cols + (rows == 1 ? 0 : i) * cols + (cols == 1 ? 0 : j));
        bool masked = additive ? e <= lowest(dt) : (e != 0) == masked_when;
        ok = masked == (j > i) && (masked || !additive || e == 0);
      }
  free(k.data);
  return ok;
}

/* If op o applies a causal mask to scores s (its other operand), returns s; else -1.
 * Where(keep, s, fill), Where(drop, fill, s), Add(s, additive) in either order. */
static int unmask(const TpModule *m, int o) {
  const TpType *ty = type(m, out(m, o));
  TpDType dt = ty->dtype;
  int64_t t = ty->dims[3];
  if (m->ops[o].kind == TP_OP_Where) {
    int c = in(m, o, 0), a = in(m, o, 1), b = in(m, o, 2);
    if (all_masked(m, b, dt) && tp_type_equal(type(m, a), ty) && causal(m, c, t, false, false, dt)) return a;
    if (all_masked(m, a, dt) && tp_type_equal(type(m, b), ty) && causal(m, c, t, false, true, dt)) return b;
  } else if (m->ops[o].kind == TP_OP_Add) {
    for (int i = 0; i < 2; i++) {
      int s = in(m, o, i), k = in(m, o, 1 - i);
      if (tp_type_equal(type(m, s), ty) && causal(m, k, t, true, true, dt)) return s;
    }
  }
  return -1;
}

/* If op o multiplies s by a positive constant (Mul by c, Div by 1/c), returns s; *scale *= c. */
static int unscale(const TpModule *m, int o, double *scale) {
  const TpType *ty = type(m, out(m, o));
  double c;
  if (m->ops[o].kind == TP_OP_Div && scalar(m, in(m, o, 1), &c) && c > 0 && tp_type_equal(type(m, in(m, o, 0)), ty)) {
    *scale /= c;
    return in(m, o, 0);
  }
  for (int i = 0; m->ops[o].kind == TP_OP_Mul && i < 2; i++)
    if (scalar(m, in(m, o, 1 - i), &c) && c > 0 && tp_type_equal(type(m, in(m, o, i)), ty)) {
      *scale *= c;
      return in(m, o, i);
    }
  return -1;
}

static bool perm_is(const TpModule *m, int o, const int64_t *want) {
  int n;
  const int64_t *p = tp_attr_ints(m, o, "perm", &n);
  return n == 4 && memcmp(p, want, 4 * sizeof *p) == 0;
}

/* K [B, H, T, D] given K^T [B, H, D, T]: the operand of Transpose(K, [0,1,3,2]); else a new
 * Transpose (of the [B, T, H, D] heads when the export folded the head transpose into K^T's
 * [0,2,3,1], or of K^T itself). */
static int untranspose_k(TpModule *m, int kt, TpDiag *d) {
  static const int64_t swap_last[] = {0, 1, 3, 2}, heads_kt[] = {0, 2, 3, 1}, heads[] = {0, 2, 1, 3};
  int o = def_of(m, kt, TP_OP_Transpose), src = kt;
  const int64_t *perm = swap_last;
  if (o >= 0 && perm_is(m, o, swap_last)) return in(m, o, 0);
  if (o >= 0 && perm_is(m, o, heads_kt)) {
    src = in(m, o, 0);
    perm = heads;
  }
  char name[300];
  snprintf(name, sizeof name, "%s.k", m->values[kt].name);
  const char *names[] = {name};
  TpOrigin at = o >= 0 ? m->ops[o].origin : m->values[kt].origin;
  int t = tp_add_op(m, TP_OP_Transpose, &src, 1, names, 1, at);
  tp_set_attr_ints(m, t, "perm", perm, 4);
  return check(m, t, d) == TP_OK ? out(m, t) : -1;
}

/* Anchored at Softmax(axis -1) of 4-D scores; the last op is MatMul(probabilities, V). */
static int raise_attention(TpModule *m, int sm, TpDiag *d) {
  int p = out(m, sm);
  const TpType *tp = type(m, p);
  if (tp->rank != 4 || tp_attr_int(m, sm, "axis", -1) != 3 || tp->dims[2] != tp->dims[3]) return TP_OK;
  double scale = 1;
  bool masked = false, scaled = false, scaled_after_mask = false;
  int s = in(m, sm, 0), qk = -1;
  for (int step = 0; step < 3 && qk < 0; step++) { /* back from the Softmax */
    int o = m->values[s].kind == TP_VAL_RESULT ? m->values[s].def : -1, next;
    if (o < 0 || m->ops[o].dead) return TP_OK;
    if (m->ops[o].kind == TP_OP_MatMul) qk = o;
    else if (!masked && (next = unmask(m, o)) >= 0) masked = true, s = next;
    else if (!scaled && (next = unscale(m, o, &scale)) >= 0) scaled = true, scaled_after_mask = !masked, s = next;
    else return TP_OK;
  }
  int pv = user_of(m, p, TP_OP_MatMul, 0);
  if (!masked || qk < 0 || pv < 0) return TP_OK; /* not causal: stays primitive */
  if (scaled_after_mask && scale < 1e-6) return TP_OK; /* a scaled finfo.min may not vanish */
  int q = in(m, qk, 0), kt = in(m, qk, 1), v = in(m, pv, 1);
  const TpType *tq = type(m, q), *tk = type(m, kt), *tv = type(m, v);
  if (tq->rank != 4 || tk->rank != 4 || tv->rank != 4) return TP_OK;
  for (int i = 0; i < 2; i++) /* no broadcasting over batch or heads */
    if (tk->dims[i] != tq->dims[i] || tv->dims[i] != tq->dims[i]) return TP_OK;
  if (tk->dims[2] != tq->dims[3] || tk->dims[3] != tq->dims[2] || tv->dims[2] != tq->dims[2]) return TP_OK;
  int k = untranspose_k(m, kt, d);
  if (k < 0) return TP_ERR_INTERNAL;
  rewrite(m, pv, TP_OP_Attention, (int[]){q, k, v}, 3);
  tp_set_attr_int(m, pv, "is_causal", 1);
  tp_set_attr_float(m, pv, "scale", scale);
  return check(m, pv, d);
}

/* ---- RMSNorm, Rotary, SwiGLU (f32: their kernels' type) ---- */

/* v with the no-op Casts (to its own dtype) that .to(dtype) calls leave skipped. */
static int uncast(const TpModule *m, int v) {
  for (int c; (c = def_of(m, v, TP_OP_Cast)) >= 0 && type(m, in(m, c, 0))->dtype == type(m, v)->dtype;) v = in(m, c, 0);
  return v;
}

static bool is_f32(const TpModule *m, int v) { return v >= 0 && type(m, v)->dtype == TP_F32; }

/* A Mul reading v whose other operand, casts skipped, is want (any when want < 0): the op,
 * its other operand in *other. */
static int mul_with(const TpModule *m, int v, int want, int *other_operand) {
  for (int o = 0; o < m->nops; o++) {
    if (m->ops[o].dead || m->ops[o].kind != TP_OP_Mul) continue;
    int f = other(m, o, v);
    if (f >= 0 && (want < 0 || uncast(m, f) == want)) {
      *other_operand = f;
      return o;
    }
  }
  return -1;
}

/* Anchored at Sqrt(mean(x^2) + eps) over the last axis: x * (1 / sqrt) (Div or Reciprocal)
 * or x / sqrt, an optional no-op Cast, then an optional Mul by the scale [C] (Gemma's
 * 1 + weight is a folded constant, or an Add the scale operand keeps). */
static int raise_rmsnorm(TpModule *m, int sq, TpDiag *d) {
  int add = def_of(m, in(m, sq, 0), TP_OP_Add), var = -1;
  double eps = -1;
  for (int i = 0; add >= 0 && i < 2 && var < 0; i++)
    if (scalar(m, in(m, add, i), &eps)) var = mean_last(m, in(m, add, 1 - i));
  if (var < 0 || !(eps >= 0)) return TP_OK;
  int pow = def_of(m, in(m, var, 0), TP_OP_Pow), mul = def_of(m, in(m, var, 0), TP_OP_Mul), x = -1;
  if (pow >= 0 && scalar_is(m, in(m, pow, 1), 2)) x = in(m, pow, 0);
  if (mul >= 0 && in(m, mul, 0) == in(m, mul, 1)) x = in(m, mul, 0);
  /* X stays the value the chain squares (a no-op Cast of the residual stream, often read
   * by the residual Add too, which assign-stages follows); the casts are skipped only to
   * compare it with the value normalised */
  int base = x >= 0 ? uncast(m, x) : -1, sub = def_of(m, base, TP_OP_Sub);
  if (!is_f32(m, x) || (sub >= 0 && mean_last(m, in(m, sub, 1)) >= 0)) return TP_OK; /* a LayerNorm's */

  int root = out(m, sq), div = user_of(m, root, TP_OP_Div, 1), normed = -1, inv = -1, f;
  if (div >= 0 && scalar_is(m, in(m, div, 0), 1)) inv = out(m, div);
  else if (div >= 0 && uncast(m, in(m, div, 0)) == base) normed = div;
  int rec = user_of(m, root, TP_OP_Reciprocal, 0);
  if (inv < 0 && normed < 0 && rec >= 0) inv = out(m, rec);
  if (inv >= 0) normed = mul_with(m, inv, base, &f);
  if (normed < 0) return TP_OK;
  int last = normed, cast = user_of(m, out(m, last), TP_OP_Cast, 0), scale = -1;
  if (cast >= 0 && tp_use_count(m, out(m, last)) == 1 && is_f32(m, out(m, cast))) last = cast;
  TpType tx = *type(m, x);
  int64_t c = tx.dims[tx.rank - 1];
  int by = mul_with(m, out(m, last), -1, &scale);
  if (by >= 0 && is_vector(m, scale, c, TP_F32)) last = by;
  else scale = -1;
  if (!tp_type_equal(type(m, out(m, last)), &tx)) return TP_OK;
  if (scale < 0) scale = ones(m, c, last); /* no scale: RMSNorm(x, ones) */
  rewrite(m, last, TP_OP_RMSNorm, (int[]){x, scale}, 2);
  tp_set_attr_int(m, last, "axis", tx.rank - 1);
  tp_set_attr_float(m, last, "epsilon", eps);
  return check(m, last, d);
}

/* Anchored at Sigmoid(gate): Mul(gate, Sigmoid(gate)) (silu), then Mul(silu, up), each in
 * either order, up of gate's type. */
static int raise_swiglu(TpModule *m, int sig, TpDiag *d) {
  int gate = in(m, sig, 0), up = -1, f;
  int silu = is_f32(m, gate) ? mul_with(m, out(m, sig), gate, &f) : -1;
  if (silu < 0 || f != gate) return TP_OK;
  int last = mul_with(m, out(m, silu), -1, &up);
  if (last < 0 || up == gate || !tp_type_equal(type(m, up), type(m, gate)) ||
      !tp_type_equal(type(m, out(m, last)), type(m, gate)))
    return TP_OK;
  rewrite(m, last, TP_OP_SwiGLU, (int[]){gate, up}, 2);
  return check(m, last, d);
}

/* v = Slice(x) taking `len` features of x's last axis from `start` by `step`, the rest whole. */
static bool last_axis_slice(const TpModule *m, int v, int x, int64_t start, int64_t step, int64_t len) {
  int s = def_of(m, v, TP_OP_Slice);
  if (s < 0 || in(m, s, 0) != x) return false;
  const TpType *tx = type(m, x), *tv = type(m, v);
  int n, r = tx->rank;
  const int64_t *starts = tp_attr_ints(m, s, "starts", &n), *steps = tp_attr_ints(m, s, "steps", &n);
  if (tv->rank != r || n != r || starts[r - 1] != start || steps[r - 1] != step || tv->dims[r - 1] != len) return false;
  for (int k = 0; k < r - 1; k++)
    if (starts[k] != 0 || steps[k] != 1 || tv->dims[k] != tx->dims[k]) return false;
  return true;
}

/* v through Negs and last-axis Unsqueezes (Reshape [..., n] -> [..., n, 1]): the value
 * under them; *negated when their number of Negs is odd. */
static int peel(const TpModule *m, int v, bool *negated) {
  *negated = false;
  for (;;) {
    int o = def_of(m, v, TP_OP_Neg), r = def_of(m, v, TP_OP_Reshape);
    if (o >= 0) {
      *negated = !*negated;
      v = in(m, o, 0);
      continue;
    }
    if (r < 0) return v;
    const TpType *a = type(m, in(m, r, 0)), *b = type(m, v);
    if (b->rank != a->rank + 1 || b->dims[b->rank - 1] != 1 || memcmp(a->dims, b->dims, (size_t)a->rank * sizeof a->dims[0]))
      return v;
    v = in(m, r, 0);
  }
}

/* Is Concat op c (axis a) of [-x2, x1]: x1 the first, x2 the second of x's last-axis halves
 * (step 1), or of its even and odd features (interleaved, step 2)? */
static bool concat_rotates(const TpModule *m, int c, int a, int x, bool interleaved) {
  if (c < 0 || m->ops[c].ninputs != 2 || tp_attr_int(m, c, "axis", -1) != a) return false;
  int64_t h = type(m, x)->dims[type(m, x)->rank - 1] / 2, step = interleaved ? 2 : 1;
  bool neg0, neg1;
  int x2 = peel(m, in(m, c, 0), &neg0), x1 = peel(m, in(m, c, 1), &neg1);
  return neg0 && !neg1 && last_axis_slice(m, x2, x, interleaved ? 1 : h, step, h) &&
         last_axis_slice(m, x1, x, 0, step, h);
}

/* rot(x) as exported: Concat(-x2, x1) on the last axis (rotate_half, interleaved 0), or
 * Reshape(Concat(-x2[..., 1], x1[..., 1]) [..., D/2, 2]) of the odd and even features
 * (GPT-J's rotate_every_two, interleaved 1). 0 or 1, -1 if r is neither. */
static int rotated(const TpModule *m, int r, int x) {
  int rank = type(m, x)->rank;
  if (rank < 1 || type(m, x)->dims[rank - 1] % 2 || !tp_type_equal(type(m, r), type(m, x))) return -1;
  if (concat_rotates(m, def_of(m, r, TP_OP_Concat), rank - 1, x, false)) return 0;
  int rs = def_of(m, r, TP_OP_Reshape);
  return rs >= 0 && concat_rotates(m, def_of(m, in(m, rs, 0), TP_OP_Concat), rank, x, true) ? 1 : -1;
}

/* A Cos or Sin table for x: x's rank, its last dim d, the others 1 or x's (a constant as
 * exports compute it, or a parameter where a buffer became an initializer). */
static bool rotary_table(const TpModule *m, int t, int x, int64_t d) {
  const TpType *tt = type(m, t), *tx = type(m, x);
  if (tt->dtype != TP_F32 || tt->rank != tx->rank || tt->dims[tt->rank - 1] != d) return false;
  for (int k = 0; k < tx->rank - 1; k++)
    if (tt->dims[k] != 1 && tt->dims[k] != tx->dims[k]) return false;
  return true;
}

/* Anchored at Add(x * cos, rot(x) * sin), each product in either order. */
static int raise_rotary(TpModule *m, int add, TpDiag *d) {
  for (int i = 0; i < 4; i++) { /* which Add operand is x * cos; which Mul operand is x */
    int mc = def_of(m, in(m, add, i & 1), TP_OP_Mul), ms = def_of(m, in(m, add, 1 - (i & 1)), TP_OP_Mul);
    if (mc < 0 || ms < 0) continue;
    int x = in(m, mc, i >> 1), cos = in(m, mc, 1 - (i >> 1));
    if (!is_f32(m, x) || !tp_type_equal(type(m, out(m, add)), type(m, x))) continue;
    int64_t dim = type(m, x)->dims[type(m, x)->rank - 1];
    for (int j = 0; j < 2; j++) {
      int rot = in(m, ms, j), sin = in(m, ms, 1 - j), interleaved = rotated(m, rot, x);
      if (interleaved < 0 || !rotary_table(m, cos, x, dim) || !tp_type_equal(type(m, cos), type(m, sin))) continue;
      rewrite(m, add, TP_OP_Rotary, (int[]){x, cos, sin}, 3);
      tp_set_attr_int(m, add, "interleaved", interleaved);
      tp_set_attr_int(m, add, "rotary_dim", dim);
      return check(m, add, d);
    }
  }
  return TP_OK;
}

/* Partial rotary (GPT-NeoX, Phi, GPT-J): Concat(Rotary(x[..., :rd]), x[..., rd:]) on the
 * last axis -> Rotary(x) {rotary_dim = rd}. */
static int raise_partial_rotary(TpModule *m, int cat, TpDiag *d) {
  int r = m->ops[cat].ninputs == 2 ? def_of(m, in(m, cat, 0), TP_OP_Rotary) : -1;
  int s = r >= 0 ? def_of(m, in(m, r, 0), TP_OP_Slice) : -1;
  if (s < 0 || tp_use_count(m, out(m, r)) != 1) return TP_OK;
  int x = in(m, s, 0), rank = type(m, x)->rank;
  int64_t dim = type(m, x)->dims[rank - 1], rd = tp_attr_int(m, r, "rotary_dim", 0);
  if (tp_attr_int(m, cat, "axis", -1) != rank - 1 || !last_axis_slice(m, in(m, r, 0), x, 0, 1, rd) ||
      !last_axis_slice(m, in(m, cat, 1), x, rd, 1, dim - rd))
    return TP_OK;
  int64_t interleaved = tp_attr_int(m, r, "interleaved", 0);
  rewrite(m, cat, TP_OP_Rotary, (int[]){x, in(m, r, 1), in(m, r, 2)}, 3);
  tp_set_attr_int(m, cat, "interleaved", interleaved);
  tp_set_attr_int(m, cat, "rotary_dim", rd);
  return check(m, cat, d);
}

/* ---- the pass ---- */

/* fused: also the ops of modern blocks (RMSNorm, Rotary, SwiGLU). */
static int raise(TpModule *m, bool fused, TpDiag *d) {
  int nops = m->nops, rc = TP_OK;
  for (int o = 0; o < nops && rc == TP_OK; o++) {
    if (m->ops[o].dead) continue;
    switch (m->ops[o].kind) {
    case TP_OP_Gather: rc = raise_embedding(m, o, d); break;
    case TP_OP_MatMul: rc = raise_matmul(m, o, d); break;
    case TP_OP_Gemm: rc = raise_gemm(m, o, d); break;
    case TP_OP_Add:
      rc = raise_bias(m, o, d);
      if (fused && rc == TP_OK && m->ops[o].kind == TP_OP_Add) rc = raise_rotary(m, o, d);
      break;
    case TP_OP_Sqrt: rc = fused ? raise_rmsnorm(m, o, d) : TP_OK; break;
    case TP_OP_Sigmoid: rc = fused ? raise_swiglu(m, o, d) : TP_OK; break;
    case TP_OP_Concat: rc = fused ? raise_partial_rotary(m, o, d) : TP_OK; break;
    case TP_OP_Reshape: rc = raise_flattened(m, o, d); break;
    case TP_OP_Div: rc = raise_layernorm(m, o, d); break;
    case TP_OP_Erf: rc = raise_gelu_erf(m, o, d); break;
    case TP_OP_Tanh: rc = raise_gelu_tanh(m, o, d); break;
    case TP_OP_Softmax: rc = raise_attention(m, o, d); break;
    default: break;
    }
  }
  if (m->nops != nops) tp_sort_ops(m); /* Attention's new K transposes */
  return rc;
}

int pass_raise_transformer(TpModule *m, TpDiag *d) { return raise(m, true, d); }

/* The same, with the chains of RMSNorm, rotary embeddings and SwiGLU left primitive: the
 * reference the fused ops are measured and checked against (tokpipec --no-fuse). */
int pass_raise_transformer_unfused(TpModule *m, TpDiag *d) { return raise(m, false, d); }

/* Iterative depth-first search from each op in order, emitting its producers first. */
void tp_sort_ops(TpModule *m) {
  int n = m->nops, count = 0;
  int *order = malloc(((size_t)n + 1) * sizeof *order), *stack = malloc(((size_t)n + 1) * sizeof *stack);
  int *next = calloc((size_t)n + 1, sizeof *next);
  char *state = calloc((size_t)n + 1, 1); /* 0 new, 1 on the stack, 2 emitted */
  TP_ASSERT(order && stack && next && state);
  for (int root = 0; root < n; root++) {
    if (state[root]) continue;
    int sp = 0;
    stack[sp++] = root;
    state[root] = 1;
    while (sp > 0) {
      int o = stack[sp - 1];
      if (next[o] < m->ops[o].ninputs) {
        int v = m->ops[o].inputs[next[o]++];
        int p = v >= 0 && m->values[v].kind == TP_VAL_RESULT ? m->values[v].def : -1;
        if (p < 0 || state[p] == 2) continue;
        TP_ASSERT(state[p] == 0); /* a cycle */
        state[p] = 1;
        stack[sp++] = p;
      } else {
        state[o] = 2;
        order[count++] = o;
        sp--;
      }
    }
  }
  TpOp *ops = malloc(((size_t)n + 1) * sizeof *ops);
  TP_ASSERT(ops);
  for (int i = 0; i < n; i++) {
    ops[i] = m->ops[order[i]];
    next[order[i]] = i; /* reused: old index -> new index */
  }
  if (n) memcpy(m->ops, ops, (size_t)n * sizeof *ops);
  for (int v = 0; v < m->nvalues; v++)
    if (m->values[v].def >= 0) m->values[v].def = next[m->values[v].def];
  free(ops);
  free(order);
  free(stack);
  free(next);
  free(state);
}
