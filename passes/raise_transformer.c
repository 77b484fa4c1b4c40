/* raise-transformer (and raise-transformer-unfused, without the last four patterns
 * below): requires folded constants (fold-constants) so masks and scalars are
 * CONST values; provides the transformer ops of ir/ops.def in place of the primitive chains
 * exporters write (onnx-export-patterns.md), leaving the chains dead for dce. First, a Cast
 * to its operand's own dtype or a Reshape to its own shape is dropped (its readers read the
 * operand). Then:
 *   Gather(table [V, C], ids, axis 0)                           -> Embedding(table, ids)
 *   MatMul(x, W) (+ Add(bias [N])), Gemm, Reshape-Gemm-Reshape  -> Linear(x, W, bias?)
 *   ReduceMean-Sub-Pow(2)-ReduceMean-Add(eps)-Sqrt-Div(-Mul(scale))(-Add(bias))
 *                                                               -> LayerNorm {axis, epsilon}
 *   0.5 * x * (1 + erf(x / sqrt 2)), 0.5 * x * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *                                                               -> Gelu {approximate}
 *   Softmax(mask(scale * MatMul(Q, K^T))) then MatMul(., V)      -> Attention(Q, K, V, bias?)
 *                                                                  {is_causal = 1, scale, window?}
 *     (the probabilities may pass a NaN guard Where(IsNaN(p), 0, p))
 *     with Gemma 2's soft-cap tanh(s / c) * c between the scale and the mask   {.., softcap = c}
 *   Attention(Q, K, V, mask) {is_causal = 0}, the mask proven causal -> Attention {is_causal = 1}
 *   Sqrt(mean(x^2) + eps): x * 1/sqrt (or x / sqrt) (* scale)    -> RMSNorm {axis, epsilon}
 *   x * cos + rot(x) * sin, rot = rotate_half or rotate_every_two -> Rotary {interleaved,
 *     and Concat(Rotary(x[..., :rd]), x[..., rd:])                   rotary_dim}
 *   gate * Sigmoid(gate) * up                                    -> SwiGLU(gate, up)
 *   Gelu(gate) * up (Gemma's MLP)                                -> GeGLU(gate, up) {approximate}
 * and last, rows flattened [d0, .., dk, C] -> [N, C] for row-wise ops and reshaped back keep
 * their leading dims (unflatten).
 * Every constant is checked (exponents, epsilon, GELU coefficients, reduce axes), and the
 * causal mask is proven from its values (see the attention section): the masked positions
 * of the [T, T] scores must be exactly those above the diagonal (and, for a sliding window,
 * those it leaves out). Whatever does not match
 * stays primitive, so the pass never changes what the module computes (beyond float
 * rounding).
 *
 * Each pattern is rewritten in place at its last op (the one whose result the rest of the
 * graph reads), so the result keeps its name, uses and origin and every operand is already
 * defined there; only Attention's K (when the export folded K^T into the head transpose),
 * the 4-D views of 3-D products and their Attention need new ops, placed by tp_sort_ops. A
 * weight that retie-params re-tied stays the result of its re-tie view (Linear reads it as
 * W), so the record of the tie survives. */
#include "../ir/ir.h"
#include "../interp/interp.h"

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

/* ---- identities and flattened rows ---- */

/* A Cast to its operand's own dtype (the .to(dtype) calls of HF code) or a Reshape to its
 * operand's own shape is its operand: its readers read that instead, so the chains below
 * (the residual stream, the attention scores) see through it; so is a Reshape back to the
 * shape a Reshape came from. A graph output keeps its op, and so its name. */
static void drop_identities(TpModule *m) {
  for (int o = 0; o < m->nops; o++) {
    const TpOp *op = &m->ops[o];
    int r = def_of(m, op->ninputs ? in(m, o, 0) : -1, TP_OP_Reshape);
    if (!op->dead && op->kind == TP_OP_Reshape && r >= 0 && tp_type_equal(type(m, in(m, r, 0)), type(m, out(m, o))))
      op->inputs[0] = in(m, r, 0);
    if (op->dead || (op->kind != TP_OP_Cast && op->kind != TP_OP_Reshape) || tp_is_output(m, out(m, o))) continue;
    const TpType *tx = type(m, in(m, o, 0)), *ty = type(m, out(m, o));
    if (op->kind == TP_OP_Cast ? tx->dtype == ty->dtype : tp_type_equal(tx, ty)) {
      tp_replace_uses(m, out(m, o), in(m, o, 0));
      m->ops[o].dead = true; /* read by nothing: no matcher may take it for a step */
    }
  }
}

enum { ROWS_MAX = 64 };

static bool among(int v, const int *set, int n) {
  for (int k = 0; k < n; k++)
    if (set[k] == v) return true;
  return false;
}

/* Whether op o computes row t of its one [N, C'] result from rows t of the operands in the
 * region rows[0..n) alone (and from row-independent ones outside it): elementwise ops,
 * Linear, LayerNorm over the last axis. */
static bool rowwise(const TpModule *m, int o, const int *rows, int n) {
  const TpOp *op = &m->ops[o];
  const TpType *ty = type(m, out(m, o));
  bool elementwise = tp_op_info[op->kind].traits & TP_TRAIT_ELEMENTWISE;
  bool ln = op->kind == TP_OP_LayerNorm && tp_attr_int(m, o, "axis", -1) == 1;
  if ((!elementwise && !ln && op->kind != TP_OP_Linear) || ty->rank != 2) return false;
  for (int i = 1; i < op->noutputs; i++)
    if (op->outputs[i] >= 0) return false;
  for (int i = 0; i < op->ninputs; i++) {
    int v = op->inputs[i];
    if (v < 0) continue;
    bool inside = among(v, rows, n);
    if (inside && (elementwise ? !tp_type_equal(type(m, v), ty) : i != 0)) return false; /* rows, unbroadcast */
    if (!inside && elementwise && type(m, v)->rank > 1) return false;                     /* one row for all */
  }
  return true;
}

/* Reshape r flattening x [d0, .., dk, C] to [N, C] (OPT's MLP block): when every reader of
 * the rows, up to Reshapes back to [d0, .., dk, C'], computes row by row, the rows keep
 * x's leading dims instead (the Reshapes become identities), so the token and batch axes
 * run through and the residual stream stays one chain. */
static int unflatten(TpModule *m, int r, TpDiag *d) {
  const TpType *tx = type(m, in(m, r, 0)), *ty = type(m, out(m, r));
  if (tx->rank < 3 || ty->rank != 2 || ty->dims[1] != tx->dims[tx->rank - 1]) return TP_OK;
  int rows[ROWS_MAX], ops[ROWS_MAX], n = 0, nops = 0;
  rows[n++] = out(m, r);
  for (int o = r + 1; o < m->nops; o++) { /* in order: an op's operands come first */
    const TpOp *op = &m->ops[o];
    bool reads = false;
    for (int i = 0; i < op->ninputs; i++) reads |= among(op->inputs[i], rows, n);
    if (op->dead || !reads) continue;
    const TpType *to = type(m, out(m, o));
    if (op->kind == TP_OP_Reshape && to->rank == tx->rank &&
        memcmp(to->dims, tx->dims, (size_t)(tx->rank - 1) * sizeof *to->dims) == 0)
      continue; /* back to [d0, .., dk, C'] */
    if (!rowwise(m, o, rows, n) || n == ROWS_MAX) return TP_OK;
    ops[nops++] = o;
    rows[n++] = out(m, o);
  }
  for (int i = 0; i < n; i++)
    if (tp_is_output(m, rows[i])) return TP_OK;
  for (int i = 0; i < n; i++) { /* [N, C'] -> [d0, .., dk, C'] */
    TpType *t = &m->values[rows[i]].type;
    int64_t c = t->dims[1];
    *t = *tx;
    t->dims[tx->rank - 1] = c;
  }
  for (int i = 0; i < nops; i++) {
    if (m->ops[ops[i]].kind == TP_OP_LayerNorm) tp_set_attr_int(m, ops[i], "axis", tx->rank - 1);
    if (check(m, ops[i], d) != TP_OK) return TP_ERR_INTERNAL;
  }
  return TP_OK;
}

/* ---- Embedding ---- */

static bool is_retied(const TpModule *m, int v) {
  const TpValue *val = &m->values[v];
  return val->kind == TP_VAL_RESULT && m->ops[val->def].role == TP_ROLE_RETIE;
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
  const TpAttr *pad = tp_get_attr(m, o, "padding_idx");
  int64_t padding_idx = pad ? pad->i : -1;
  rewrite(m, o, TP_OP_Embedding, (int[]){table, ids}, 2);
  if (padding_idx >= 0) tp_set_attr_int(m, o, "padding_idx", padding_idx);
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

static int view_as(TpModule *m, int v, int rank, const int64_t *dims, const char *suffix, TpDiag *d);

/* Reshape(Linear(Reshape(x [..., K]) [M, K]) [M, N]) [..., N] -> Linear(x): Conv1D's
 * flatten-Gemm-unflatten, when the reshapes only merge and split the leading dims. The
 * dynamo exporter flattens the heads with the rows ([B, T, H, D] -> [B*T, H*D] before
 * GPT-2's c_proj): x is then seen as [B, T, H*D] first. */
static int raise_flattened(TpModule *m, int o, TpDiag *d) {
  int l = def_of(m, in(m, o, 0), TP_OP_Linear);
  int r = l >= 0 ? def_of(m, in(m, l, 0), TP_OP_Reshape) : -1;
  if (r < 0 || tp_use_count(m, out(m, l)) != 1) return TP_OK;
  int x = in(m, r, 0);
  const TpType *tx = type(m, x), *ty = type(m, out(m, o)), *flat = type(m, out(m, r));
  int lead = ty->rank - 1;
  if (ty->rank < 2 || tx->rank < ty->rank || flat->rank != 2) return TP_OK;
  int64_t k = 1, dims[TP_MAX_RANK];
  for (int i = 0; i < tx->rank; i++) {
    if (i < lead && tx->dims[i] != ty->dims[i]) return TP_OK;
    if (i >= lead) k *= tx->dims[i];
    dims[i] = tx->dims[i];
  }
  if (k != flat->dims[1]) return TP_OK;
  dims[lead] = k;
  if (tx->rank != ty->rank && (x = view_as(m, x, ty->rank, dims, "rows", d)) < 0) return TP_ERR_INTERNAL;
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

/* ---- causal self-attention ----
 *
 * Anchored at a Softmax over the keys of [B, H, T, T] scores (or [B*H, T, T] ones, as
 * baddbmm exports them; or, with the heads inside the queries, [B, T, H, T] and
 * [B, T*H, T]). Back from it runs the score chain down to the product Q K^T (a MatMul):
 * reshapes between the 3-D and 4-D forms (no-op casts are gone already), and
 * elementwise ops whose other operands are constant data (Mul or Div by positive factors,
 * Add, Sub, Max clamps at the float minimum, Where). The chain is evaluated at every score
 * position (once per distinct chain: see "proofs already made") as an abstract value: alpha * s + beta of the product s, or masked (at most
 * beta, whatever s is). It is causal when the masked values are so low that the softmax
 * gives them weight exactly 0, the masked positions are exactly the keys after the query
 * (and, with a sliding window of W keys, those W or more before it), and alpha is one
 * constant (the scale); beta at the visible positions is an additive bias (ALiBi). Gemma 2's
 * soft-cap c * tanh(s / c) (Div by c, or Mul by 1 / c, then Tanh, then Mul by c; c a
 * positive scalar constant) may sit between the scales and the masks: it is one step of the
 * chain, which only scales (Mul, Div) may precede and only masks and biases may follow, as
 * Attention computes mask(softcap(scale * Q K^T)). It leaves alpha alone (the proof is about
 * the masks, and alpha before it is Attention's scale). Forward from the Softmax, reshapes
 * lead to MatMul(probabilities, V). Each failure returns why, which tp_attention_unproven
 * gives insert-token-dim's refusal. */

/* The lowest finite value of dt: exporters mask with it (finfo.min) or with -inf. */
static double lowest(TpDType dt) {
  switch (dt) {
  case TP_F16: return -65504.0;
  case TP_BF16: return -3.3895313892515355e38;
  case TP_F64: return -DBL_MAX;
  default: return -FLT_MAX;
  }
}

/* A mask constant may be as large as [T, T] f32 at T = 16384; the proof runs over at most
 * SCORES_MAX score positions (one [T, T] mask at T = 16384), one at a time. */
enum { EVAL_DEPTH = 8, CHAIN_MAX = 32 };
static const int64_t EVAL_MAX_BYTES = (int64_t)1 << 30, SCORES_MAX = (int64_t)1 << 28;

/* v depends on constant data alone: CONST or PARAM leaves, at most `depth` small ops deep. */
static bool computable(const TpModule *m, int v, int depth) {
  const TpValue *val = &m->values[v];
  if (tp_type_numel(&val->type) * (int64_t)tp_dtype_size(val->type.dtype) > EVAL_MAX_BYTES) return false;
  if (val->kind == TP_VAL_CONST || val->kind == TP_VAL_PARAM) return true;
  if (val->kind != TP_VAL_RESULT || depth == 0) return false;
  const TpOp *op = &m->ops[val->def];
  if (op->dead || op->noutputs != 1 || op->ninputs > 8) return false;
  for (int i = 0; i < op->ninputs; i++)
    if (op->inputs[i] >= 0 && !computable(m, op->inputs[i], depth - 1)) return false;
  return true;
}

/* A parameter that computable v reads (the first found), or -1. */
static int param_leaf(const TpModule *m, int v, int depth) {
  const TpValue *val = &m->values[v];
  if (val->kind == TP_VAL_PARAM) return v;
  if (val->kind != TP_VAL_RESULT || depth == 0) return -1;
  const TpOp *op = &m->ops[val->def];
  for (int i = 0, p; i < op->ninputs; i++)
    if (op->inputs[i] >= 0 && (p = param_leaf(m, op->inputs[i], depth - 1)) >= 0) return p;
  return -1;
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

static const char *node_name(const TpModule *m, int o) {
  return m->ops[o].origin.node ? m->ops[o].origin.node : m->values[out(m, o)].name;
}

typedef struct {
  int softmax, product, pv; /* the Softmax, the MatMuls Q K^T and P V */
  int cap;                  /* the soft-cap's last op, Mul(Tanh(..), c), a step; -1: none */
  double softcap;           /* its c */
  int steps[CHAIN_MAX];     /* the score chain's ops, from the product to the Softmax */
  int slot[CHAIN_MAX];      /* which operand of each carries the scores */
  int nsteps;
  TpDType dt;
  int64_t B, H, T, BH;      /* B batch rows, H heads (0 until a form shows them), T tokens */
  bool inner;               /* the heads inside the queries: [B, T, H, T] and [B, T*H, T]
                               (GPT-BigCode's multi-query), not [B, H, T, T], [B*H, T, T] */
} Chain;

enum { BATCH = 1, HEADS = 2, QUERY = 4, KEY = 8 };

/* What each axis of the scores' rank-`rank` form indexes (BATCH | HEADS: b * H + h). */
static const unsigned *axis_roles(const Chain *c, int rank) {
  static const unsigned outer4[] = {BATCH, HEADS, QUERY, KEY}, outer3[] = {BATCH | HEADS, QUERY, KEY};
  static const unsigned inner4[] = {BATCH, QUERY, HEADS, KEY}, inner3[] = {BATCH, QUERY | HEADS, KEY};
  return c->inner ? (rank == 4 ? inner4 : inner3) : (rank == 4 ? outer4 : outer3);
}

/* t is a form of the scores; the first that shows B and H fixes them. */
static bool score_type(Chain *c, const TpType *t) {
  if (t->dtype != c->dt || t->rank < 3 || t->rank > 4 || t->dims[t->rank - 1] != c->T) return false;
  const unsigned *role = axis_roles(c, t->rank);
  int64_t b = 1, h = 1;
  for (int a = 0; a < t->rank - 1; a++) {
    int64_t n = t->dims[a];
    if (role[a] & QUERY) {
      if (n % c->T) return false;
      n /= c->T;
    }
    if (role[a] == (BATCH | HEADS)) {
      if (n != c->BH) return false;
      continue; /* shows neither alone */
    }
    if (role[a] & BATCH) b = n;
    else if (role[a] & HEADS) h = n;
    else if (n != 1) return false;
  }
  if (t->rank == 3 && !c->inner) return true;
  if (b * h != c->BH) return false;
  if (!c->H) c->B = b, c->H = h;
  return b == c->B && h == c->H;
}

/* The operand of elementwise op o that carries the scores (same type as the result, not
 * computable), the others being constant data; -1 with *why set if there is none. */
static int score_operand(TpModule *m, int o, const char **why) {
  const TpOp *op = &m->ops[o];
  bool first_only = op->kind == TP_OP_Sub || op->kind == TP_OP_Div; /* c - s, c / s are not affine in s */
  int first = op->kind == TP_OP_Where ? 1 : 0, last = first_only ? 0 : op->ninputs - 1, slot = -1;
  for (int i = first; i <= last && slot < 0; i++)
    if (tp_type_equal(type(m, in(m, o, i)), type(m, out(m, o))) && !computable(m, in(m, o, i), EVAL_DEPTH)) slot = i;
  for (int i = 0; i < op->ninputs && slot >= 0; i++)
    if (i != slot && !computable(m, in(m, o, i), EVAL_DEPTH)) {
      *why = tp_strfmt(m, "%s at node '%s' combines the scores with a value known only at run time",
                       tp_op_info[op->kind].name, node_name(m, o));
      return -1;
    }
  if (slot < 0)
    *why = tp_strfmt(m, "%s at node '%s' does not take the scores %s", tp_op_info[op->kind].name, node_name(m, o),
                     first_only ? "as its first operand, unbroadcast" : "unbroadcast");
  return slot;
}

/* The soft-cap c of op `op` (naming it): a float scalar CONST, positive and finite; NULL, or
 * why not. A parameter would train (raised into Attention's attribute, it would not). */
static const char *cap_constant(TpModule *m, int op, int v, double *c) {
  const char *kind = tp_op_info[m->ops[op].kind].name, *node = node_name(m, op);
  if (m->values[v].kind == TP_VAL_PARAM)
    return tp_strfmt(m, "%s at node '%s' soft-caps the scores by the parameter %%%s, which trains (raised, it would not)",
                     kind, node, m->values[v].name);
  if (m->values[v].kind != TP_VAL_CONST || !scalar(m, v, c))
    return tp_strfmt(m, "%s at node '%s' soft-caps the scores by %%%s, not a constant scalar", kind, node,
                     m->values[v].name);
  if (!(*c > 0) || isinf(*c))
    return tp_strfmt(m, "%s at node '%s' soft-caps the scores at %g, not a positive cap", kind, node, *c);
  return NULL;
}

/* Op o of the score chain as Gemma 2's soft-cap: o = Mul(Tanh(Div(u, c) or Mul(u, 1 / c)), c)
 * in either operand order, u the scores (unbroadcast). 0 if no operand of o is a Tanh; 1 if
 * it is the soft-cap (*u, *slot: the Tanh's operand of o, *c); -1 if a Tanh feeds o but the
 * rest is not a soft-cap (*why). */
static int soft_cap(TpModule *m, int o, int *u, int *slot, double *c, const char **why) {
  int t = -1;
  for (int i = 0; i < 2 && t < 0; i++)
    if ((t = def_of(m, in(m, o, i), TP_OP_Tanh)) >= 0) *slot = i;
  if (t < 0 || !tp_type_equal(type(m, out(m, t)), type(m, out(m, o)))) return 0;
  if ((*why = cap_constant(m, o, in(m, o, 1 - *slot), c))) return -1;
  int div = def_of(m, in(m, t, 0), TP_OP_Div), mul = def_of(m, in(m, t, 0), TP_OP_Mul), first = div >= 0 ? div : mul;
  double k = 0;
  *u = -1;
  if (div >= 0) *u = in(m, div, 0);
  for (int i = 0; mul >= 0 && i < 2 && *u < 0; i++)
    if (tp_type_equal(type(m, in(m, mul, i)), type(m, out(m, t)))) *u = in(m, mul, i);
  if (*u < 0 || !tp_type_equal(type(m, *u), type(m, out(m, t)))) {
    *why = tp_strfmt(m, "Tanh at node '%s' does not take the scores divided by the cap %g (a soft-cap is tanh(s / c) * c)",
                     node_name(m, t), *c);
    return -1;
  }
  if ((*why = cap_constant(m, first, div >= 0 ? in(m, div, 1) : other(m, mul, *u), &k))) return -1;
  bool same = div >= 0 ? k == *c : fabs(k * *c - 1) <= 1e-6;
  if (!same)
    *why = tp_strfmt(m, "Mul at node '%s' multiplies the soft-capped scores by %g, not the cap %g that %s at node '%s' %s",
                     node_name(m, o), *c, div >= 0 ? k : 1 / k, div >= 0 ? "Div" : "Mul", node_name(m, first),
                     div >= 0 ? "divides them by" : "scales them by the inverse of");
  return same ? 1 : -1;
}

/* The order a soft-cap needs in chain c (in forward order): scales and reshapes before it,
 * no scale after it; NULL, or why not. */
static const char *cap_order(TpModule *m, const Chain *c) {
  int at = -1;
  for (int s = 0; s < c->nsteps; s++)
    if (c->steps[s] == c->cap) at = s;
  for (int s = 0; s < c->nsteps; s++) {
    int o = c->steps[s];
    TpOpKind kind = m->ops[o].kind;
    bool scale = kind == TP_OP_Mul || kind == TP_OP_Div;
    if (s < at && !scale && kind != TP_OP_Reshape)
      return tp_strfmt(m, "%s at node '%s' comes before the soft-cap at node '%s': only scales may (a mask must follow it)",
                       tp_op_info[kind].name, node_name(m, o), node_name(m, c->cap));
    if (s > at && scale)
      return tp_strfmt(m, "%s at node '%s' scales the soft-capped scores of node '%s': only masks may follow the soft-cap",
                       tp_op_info[kind].name, node_name(m, o), node_name(m, c->cap));
  }
  return NULL;
}

/* The score chain back from Softmax sm to the product Q K^T: NULL, or why there is none. */
static const char *score_chain(TpModule *m, int sm, Chain *c) {
  int x = in(m, sm, 0);
  const TpType *t = type(m, x);
  *c = (Chain){.softmax = sm, .product = -1, .pv = -1, .cap = -1, .dt = t->dtype};
  if (t->rank < 3 || t->rank > 4 || tp_attr_int(m, sm, "axis", -1) != t->rank - 1 || !is_float(m, x))
    return tp_strfmt(m, "Softmax at node '%s' does not normalise the last axis of 3-D or 4-D scores", node_name(m, sm));
  c->T = t->dims[t->rank - 1];
  c->BH = c->T ? tp_type_numel(t) / (c->T * c->T) : 0;
  c->inner = t->dims[t->rank - 2] != c->T;
  for (;;) {
    if (!score_type(c, type(m, x)) || c->BH == 0)
      return tp_strfmt(m, "the scores %%%s are not [B, H, %lld, %lld] or [B*H, %lld, %lld]", m->values[x].name,
                       (long long)c->T, (long long)c->T, (long long)c->T, (long long)c->T);
    int o = m->values[x].kind == TP_VAL_RESULT ? m->values[x].def : -1, slot = 0;
    if (o < 0 || m->ops[o].dead) return tp_strfmt(m, "the scores %%%s are not computed by a product", m->values[x].name);
    const char *kind = tp_op_info[m->ops[o].kind].name, *why = NULL;
    switch (m->ops[o].kind) {
    case TP_OP_MatMul:
      c->product = o;
      for (int i = 0, j = c->nsteps - 1; i < j; i++, j--) { /* forward order */
        int s = c->steps[i], k = c->slot[i];
        c->steps[i] = c->steps[j], c->slot[i] = c->slot[j];
        c->steps[j] = s, c->slot[j] = k;
      }
      if (!c->H) c->B = c->BH, c->H = 1; /* 3-D throughout: one head per batch row */
      return c->cap >= 0 ? cap_order(m, c) : NULL;
    case TP_OP_Reshape: break; /* its operand's shape is checked next round */
    case TP_OP_Mul: {
      int u, cap = soft_cap(m, o, &u, &slot, &c->softcap, &why);
      if (cap < 0) return why;
      if (cap == 0) {
        if ((slot = score_operand(m, o, &why)) < 0) return why;
        break;
      }
      if (c->cap >= 0)
        return tp_strfmt(m, "the scores are soft-capped twice, at nodes '%s' and '%s'", node_name(m, o), node_name(m, c->cap));
      if (c->nsteps == CHAIN_MAX) break; /* refused below */
      c->cap = o;
      c->steps[c->nsteps] = o;
      c->slot[c->nsteps++] = slot;
      x = u; /* past the Tanh and the division */
      continue;
    }
    case TP_OP_Tanh:
      return tp_strfmt(m, "Tanh at node '%s' in the score chain is not a soft-cap: its result is not multiplied by the cap "
                          "(tanh(s / c) * c)",
                       node_name(m, o));
    case TP_OP_Add:
    case TP_OP_Sub:
    case TP_OP_Div:
    case TP_OP_Max:
    case TP_OP_Where:
      if ((slot = score_operand(m, o, &why)) < 0) return why;
      break;
    default:
      return tp_strfmt(m, "%s at node '%s' in the score chain is not understood", kind, node_name(m, o));
    }
    if (c->nsteps == CHAIN_MAX)
      return tp_strfmt(m, "the score chain before Softmax at node '%s' is longer than %d ops", node_name(m, sm), CHAIN_MAX);
    c->steps[c->nsteps] = o;
    c->slot[c->nsteps++] = slot;
    x = in(m, o, slot);
  }
}

/* One score position after the chain: alpha * s + beta, or masked: at most beta. */
typedef struct {
  double alpha, beta;
  bool masked;
} Score;

/* The scores of every position, [nb, nh, T, T], computed one position at a time from the
 * chain's constants (a frame of them all would take 24 bytes a position): nb is 1 unless a
 * constant varies along the batch (then B), nh likewise along the heads. */
typedef struct {
  int64_t nb, nh;
  TpTensor k[CHAIN_MAX][2]; /* each step's constant operands (Where: condition, fill) */
  int64_t at[CHAIN_MAX][2][4]; /* and where each holds a position's element (offsets) */
} Frame;

static void frame_free(Frame *f) {
  for (int s = 0; s < CHAIN_MAX; s++) free(f->k[s][0].data), free(f->k[s][1].data);
}

/* Where constant k, broadcast to result type r (a form of the scores), holds its element at
 * score position (b, h, i, j): at offset b*o[0] + h*o[1] + i*o[2] + j*o[3] (an axis of both
 * the batch and heads indexes b * H + h; of the queries and heads, i * H + h). Computed once
 * per constant, so the proof does not decompose offsets at each of its positions. */
static void offsets(const Chain *c, const TpTensor *k, const TpType *r, int64_t o[4]) {
  const unsigned *role = axis_roles(c, r->rank);
  o[0] = o[1] = o[2] = o[3] = 0;
  int64_t step = 1;
  for (int a = k->rank - 1; a >= 0; step *= k->dims[a], a--) {
    unsigned ra = role[a + r->rank - k->rank];
    if (k->dims[a] == 1) continue; /* broadcast */
    if (ra & BATCH) o[0] += ra & HEADS ? step * c->H : step;
    if (ra & QUERY) o[2] += ra & HEADS ? step * c->H : step;
    if (ra & HEADS) o[1] += step;
    if (ra & KEY) o[3] += step;
  }
}

/* Whether every slice of k along axis a holds the same data as the first. */
static bool same_along(const TpTensor *k, int a) {
  size_t inner = tp_dtype_size(k->dtype), outer = 1;
  for (int i = a + 1; i < k->rank; i++) inner *= (size_t)k->dims[i];
  for (int i = 0; i < a; i++) outer *= (size_t)k->dims[i];
  const char *data = k->data;
  for (size_t o = 0; o < outer; o++)
    for (int64_t x = 1; x < k->dims[a]; x++)
      if (memcmp(data + (o * (size_t)k->dims[a] + (size_t)x) * inner, data + o * (size_t)k->dims[a] * inner, inner))
        return false;
  return true;
}

/* Whether constant k (broadcast to r) varies along the batch or the heads (a folded mask
 * [B, 1, T, T] that repeats one [T, T] does not). */
static void varies(const Chain *c, const TpTensor *k, const TpType *r, bool *batch, bool *heads) {
  const unsigned *role = axis_roles(c, r->rank);
  for (int a = 0; a < k->rank; a++) {
    unsigned ra = role[a + r->rank - k->rank];
    if (k->dims[a] == 1 || !(ra & (BATCH | HEADS)) || same_along(k, a)) continue;
    *batch |= ra & BATCH;
    *heads |= ra & HEADS;
  }
}

/* Score position p after step o, whose constant operands hold k (and, for Where, the
 * condition c); NULL, or why the step does not keep the scores' meaning. */
static const char *transfer(TpModule *m, int o, int slot, double k, double c, Score *p) {
  const char *kind = tp_op_info[m->ops[o].kind].name, *node = node_name(m, o);
  double low = lowest(type(m, out(m, o))->dtype);
  switch (m->ops[o].kind) {
  case TP_OP_Sub: k = -k; /* fallthrough */
  case TP_OP_Add:
    if (isnan(k) || k == INFINITY) return tp_strfmt(m, "%s at node '%s' adds %g to the scores", kind, node, k);
    if (k <= low && !p->masked) p->masked = true, p->beta = k;
    else p->beta += k;
    return NULL;
  case TP_OP_Div: k = 1 / k; /* fallthrough */
  case TP_OP_Mul:
    if (!(k > 0) || isinf(k)) return tp_strfmt(m, "%s at node '%s' scales the scores by %g", kind, node, k);
    p->alpha *= k, p->beta *= k;
    return NULL;
  case TP_OP_Max: /* max(x, finfo.min) is x for every finite x */
    if (!(k <= low)) return tp_strfmt(m, "Max at node '%s' clamps the scores at %g, above the float minimum", node, k);
    if (p->masked) p->beta = fmax(p->beta, k);
    return NULL;
  case TP_OP_Where:
    if ((c != 0) == (slot == 1)) return NULL; /* keeps the score */
    if (!(k <= low)) return tp_strfmt(m, "Where at node '%s' puts %g in place of scores, not the float minimum", node, k);
    p->masked = true, p->beta = k;
    return NULL;
  default: return tp_strfmt(m, "%s at node '%s' in the score chain is not understood", kind, node);
  }
}

/* The indices (b, h, i, j) of score position p, row-major over frame f. */
static void position(const Chain *c, const Frame *f, int64_t p, int64_t pos[4]) {
  int64_t T = c->T;
  pos[0] = p / (T * T * f->nh), pos[1] = p / (T * T) % f->nh, pos[2] = p / T % T, pos[3] = p % T;
}

/* Score position pos after chain step s; NULL, or why the step
 * does not keep the scores' meaning (which depends on the step's constants alone). */
static const char *step_at(TpModule *m, const Chain *c, const Frame *f, int s, const int64_t pos[4], Score *score) {
  int o = c->steps[s];
  bool where = m->ops[o].kind == TP_OP_Where;
  if (!f->k[s][where].data || o == c->cap) return NULL; /* a reshape; the soft-cap keeps alpha */
  double k[2] = {0, 0}; /* the constants' elements there (Where: condition, fill) */
  for (int n = 0; n <= where; n++) {
    const int64_t *at = f->at[s][n];
    k[n] = tp_tensor_get_f64(&f->k[s][n], pos[0] * at[0] + pos[1] * at[1] + pos[2] * at[2] + pos[3] * at[3]);
  }
  return transfer(m, o, c->slot[s], k[where], where ? k[0] : 0, score);
}

/* Score position p after the whole chain, which evaluate_chain has checked. */
static Score score_at(TpModule *m, const Chain *c, const Frame *f, int64_t p) {
  Score score = {.alpha = 1};
  int64_t pos[4];
  position(c, f, p, pos);
  for (int s = 0; s < c->nsteps; s++) step_at(m, c, f, s, pos, &score);
  return score;
}

static int64_t frame_size(const Chain *c, const Frame *f) { return f->nb * f->nh * c->T * c->T; }

/* Evaluates the chain's constants into the frame; NULL, or why one cannot be evaluated.
 * The caller frees the frame (frame_free). */
static const char *evaluate_chain(TpModule *m, const Chain *c, Frame *f) {
  const char *why = NULL;
  bool batch = false, heads = false;
  memset(f, 0, sizeof *f);
  for (int s = 0; s < c->nsteps && !why; s++) {
    const TpOp *op = &m->ops[c->steps[s]];
    for (int i = 0, n = 0; i < op->ninputs && !why; i++) {
      if (i == c->slot[s] || n == 2) continue;
      if (!evaluate(m, op->inputs[i], EVAL_DEPTH, &f->k[s][n]))
        why = tp_strfmt(m, "the constant %%%s of the score chain cannot be evaluated", m->values[op->inputs[i]].name);
      else {
        varies(c, &f->k[s][n], type(m, op->outputs[0]), &batch, &heads);
        offsets(c, &f->k[s][n], type(m, op->outputs[0]), f->at[s][n]);
        n++;
      }
    }
  }
  f->nb = batch ? c->B : 1, f->nh = heads ? c->H : 1;
  return why;
}

/* A parameter that a constant operand of chain step s reads, or -1. */
static int step_param(const TpModule *m, const Chain *c, int s) {
  const TpOp *op = &m->ops[c->steps[s]];
  int param = -1;
  for (int i = 0; i < op->ninputs && param < 0; i++)
    if (i != c->slot[s]) param = param_leaf(m, op->inputs[i], EVAL_DEPTH);
  return param;
}

/* Checks every step of the chain at every position of frame f (evaluate_chain filled it);
 * NULL, or why the chain cannot be followed. */
static const char *check_steps(TpModule *m, const Chain *c, const Frame *f) {
  const char *why = NULL;
  int64_t n = frame_size(c, f);
  if (n > SCORES_MAX)
    why = tp_strfmt(m, "its mask has %lld positions, more than the %lld raise-transformer checks", (long long)n,
                    (long long)SCORES_MAX);
  /* A parameter may mask (a float buffer the export made an initializer); one that scales
   * or shifts visible scores would be frozen into the attention, and is trained instead. */
  for (int s = 0; s < c->nsteps && !why; s++) {
    const TpOp *op = &m->ops[c->steps[s]];
    int param = step_param(m, c, s);
    for (int64_t p = 0; p < n && !why; p++) {
      Score one = {.alpha = 1};
      int64_t pos[4];
      position(c, f, p, pos);
      why = step_at(m, c, f, s, pos, &one);
      if (!why && param >= 0 && (one.alpha != 1 || (!one.masked && one.beta != 0)))
        why = tp_strfmt(m, "%s at node '%s' %s the scores by the parameter %%%s, which trains (raised, it would not)",
                        tp_op_info[op->kind].name, node_name(m, c->steps[s]), one.alpha != 1 ? "scales" : "shifts",
                        m->values[param].name);
    }
  }
  return why;
}

/* What the attention computes, proven from the frame. */
typedef struct {
  double scale;
  double softcap; /* 0: none */
  int64_t window; /* 0: none */
  bool biased;    /* some visible position has beta != 0 */
} Proof;

/* "query i" of frame position p, naming its batch row and head where the frame has them. */
static const char *query_at(TpModule *m, const Frame *f, int64_t T, int64_t p) {
  const char *at = tp_strfmt(m, "query %lld", (long long)(p / T % T));
  if (f->nb > 1) at = tp_strfmt(m, "%s of batch row %lld", at, (long long)(p / (T * T * f->nh)));
  if (f->nh > 1) at = tp_strfmt(m, "%s in head %lld", at, (long long)(p / (T * T) % f->nh));
  return at;
}

/* Whether every score is proven causal (see the section's comment); NULL, or why not. */
static const char *prove(TpModule *m, const Chain *c, const Frame *f, Proof *pr) {
  int64_t T = c->T, n = frame_size(c, f), seen = 0;
  /* A masked score must leave exp() exactly 0 beside any visible score: a float32 finfo.min
   * scaled by up to 1e-6 does (-3.4e32), and so does anything at or below -1e4 (exp(-1e4)
   * underflows in every float type); float16's finfo.min scaled down further does not. */
  double bound = fmin(lowest(c->dt) * 1e-6, -1e4);
  for (int64_t j = 0; j < T; j++) seen += !score_at(m, c, f, (T - 1) * T + j).masked;
  *pr = (Proof){.window = seen < T ? seen : 0, .softcap = c->cap >= 0 ? c->softcap : 0};
  bool touched = false; /* by a mask or a bias */
  for (int64_t p = 0; p < n && !touched; p++) {
    Score s = score_at(m, c, f, p);
    touched = s.masked || s.beta != 0;
  }
  if (!touched && T > 1) return "nothing masks its scores: every query sees every key";
  bool have_scale = false;
  for (int64_t p = 0; p < n; p++) {
    Score score = score_at(m, c, f, p);
    const Score *s = &score;
    long long j = p % T, i = p / T % T;
    bool want = j <= i && (pr->window == 0 || j > i - pr->window);
    if (s->masked && want)
      return tp_strfmt(m, "its mask hides key %lld from %s, which is not after it%s", j, query_at(m, f, T, p),
                       pr->window ? " nor outside the sliding window" : "");
    if (!s->masked && j > i)
      return tp_strfmt(m, "its mask lets %s see key %lld after it%s", query_at(m, f, T, p), j,
                       s->beta ? tp_strfmt(m, " (adds %g there, not the float minimum)", s->beta) : "");
    if (!s->masked && !want)
      return tp_strfmt(m, "its mask lets %s see key %lld, outside the sliding window of %lld keys its last query has",
                       query_at(m, f, T, p), j, (long long)pr->window);
    if (s->masked && !(s->beta <= bound))
      return tp_strfmt(m, "it masks key %lld of %s with %g, which may keep weight in the softmax", j, query_at(m, f, T, p),
                       s->beta);
    if (s->masked) continue;
    if (have_scale && s->alpha != pr->scale)
      return tp_strfmt(m, "it scales the scores by %g at key %lld of %s but by %g elsewhere", s->alpha, j,
                       query_at(m, f, T, p), pr->scale);
    pr->scale = s->alpha, have_scale = true;
    pr->biased |= s->beta != 0;
  }
  return NULL;
}

/* Collapses axis a of the bias b (dims d, row-major; NaN where masked) to 1 when each fibre
 * along it holds one value at its visible positions (masked ones are free). */
static void collapse(float *b, int64_t d[4], int a) {
  int64_t inner = 1, outer = 1;
  for (int k = a + 1; k < 4; k++) inner *= d[k];
  for (int k = 0; k < a; k++) outer *= d[k];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      float first = NAN;
      for (int64_t x = 0; x < d[a]; x++) {
        float e = b[(o * d[a] + x) * inner + i];
        if (isnan(e)) continue;
        if (!isnan(first) && e != first) return;
        first = e;
      }
    }
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      float keep = NAN;
      for (int64_t x = 0; x < d[a] && isnan(keep); x++) keep = b[(o * d[a] + x) * inner + i];
      b[o * inner + i] = keep;
    }
  d[a] = 1;
}

/* The additive bias at the visible positions as a constant [nb|1, nh|1, T|1, T] (0 where
 * masked: the attention masks those itself); -1 if the scores are not f32. */
static int make_bias(TpModule *m, const Chain *c, const Frame *f, TpOrigin at) {
  if (c->dt != TP_F32) return -1;
  int64_t d[4] = {f->nb, f->nh, c->T, c->T}, n = frame_size(c, f);
  float *data = malloc((size_t)n * sizeof *data + 1);
  TP_ASSERT(data);
  for (int64_t p = 0; p < n; p++) {
    Score s = score_at(m, c, f, p);
    data[p] = s.masked ? NAN : (float)s.beta;
  }
  collapse(data, d, 2);
  collapse(data, d, 0);
  collapse(data, d, 1);
  n = d[0] * d[1] * d[2] * d[3];
  for (int64_t p = 0; p < n; p++)
    if (isnan(data[p])) data[p] = 0;
  char name[300];
  snprintf(name, sizeof name, "%s.bias", m->values[out(m, c->pv)].name);
  int v = tp_add_const(m, tp_unique_name(m, name), tp_type_make(TP_F32, 4, d), data, at);
  free(data);
  return v;
}

/* The heads of operand t of a product over the scores: [B, h, ..] (4-D) or [B*H, ..] (3-D,
 * H heads); -1 if its batch is not the scores'. */
static int64_t heads_of(const Chain *c, const TpType *t) {
  if (t->rank == 4) return t->dims[0] == c->B ? t->dims[1] : -1;
  return t->rank == 3 && t->dims[0] == c->BH ? c->H : -1;
}

/* Where(IsNaN(p), 0, p) (IsNaN imported as Not(Equal(p, p))): SDPA's decomposition
 * zeroes the probabilities of a row that sees no key, as Attention does. The guard, or -1. */
static int nan_guard(const TpModule *m, int p) {
  for (int o = 0; o < m->nops; o++) {
    const TpOp *op = &m->ops[o];
    if (op->dead || op->kind != TP_OP_Where || in(m, o, 2) != p || m->values[in(m, o, 1)].kind != TP_VAL_CONST ||
        !scalar_is(m, in(m, o, 1), 0))
      continue;
    int n = def_of(m, in(m, o, 0), TP_OP_Not), e = n >= 0 ? def_of(m, in(m, n, 0), TP_OP_Equal) : -1;
    if (e >= 0 && in(m, e, 0) == p && in(m, e, 1) == p) return o;
  }
  return -1;
}

/* MatMul(probabilities, V) after Softmax c->softmax, through reshapes of the scores and a
 * NaN guard; -1 if there is none. */
static int times_values(TpModule *m, Chain *c) {
  int p = out(m, c->softmax);
  for (int step = 0; step < CHAIN_MAX; step++) {
    int u = user_of(m, p, TP_OP_MatMul, 0);
    if (u >= 0) return u;
    if ((u = user_of(m, p, TP_OP_Reshape, 0)) >= 0 && score_type(c, type(m, out(m, u)))) p = out(m, u);
    else if ((u = nan_guard(m, p)) >= 0) p = out(m, u);
    else return -1;
  }
  return -1;
}

static bool perm_is(const TpModule *m, int o, const int64_t *want, int n) {
  int got;
  const int64_t *p = tp_attr_ints(m, o, "perm", &got);
  return got == n && memcmp(p, want, (size_t)n * sizeof *p) == 0;
}

/* A new op of `kind` on x at origin `at`, its result named "<value named>.<suffix>" and
 * typed type_out (the caller sets its attributes, then check()s it). */
static int add_view(TpModule *m, TpOpKind kind, int x, int named, const char *suffix, TpOrigin at, TpType type_out) {
  char name[300];
  snprintf(name, sizeof name, "%s.%s", m->values[named].name, suffix);
  const char *names[] = {name};
  int o = tp_add_op(m, kind, &x, 1, names, 1, at);
  m->values[out(m, o)].type = type_out;
  return o;
}

/* v seen as `dims` (the same elements in the same order): v itself, the value a Reshape
 * made it from, or a new Reshape "<v>.<suffix>". */
static int view_as(TpModule *m, int v, int rank, const int64_t *dims, const char *suffix, TpDiag *d) {
  TpType want = tp_type_make(type(m, v)->dtype, rank, dims);
  int r = def_of(m, v, TP_OP_Reshape);
  if (tp_type_equal(type(m, v), &want)) return v;
  if (r >= 0 && tp_type_equal(type(m, in(m, r, 0)), &want)) return in(m, r, 0);
  /* a view of a Reshape's source (repeat_kv's Expand stays in sight of unrepeat) */
  int o = add_view(m, TP_OP_Reshape, r >= 0 ? in(m, r, 0) : v, v, suffix, m->values[v].origin, want);
  return check(m, o, d) == TP_OK ? out(m, o) : -1;
}

/* v as [B, heads, S, D]: itself when 4-D, else [B*heads, S, D] viewed so. */
static int as_heads(TpModule *m, int v, int64_t B, int64_t heads, TpDiag *d) {
  const TpType *t = type(m, v);
  return t->rank == 4 ? v : view_as(m, v, 4, (int64_t[]){B, heads, t->dims[1], t->dims[2]}, "heads", d);
}

/* x = Mul(y, s) with s a scalar CONST: y, *s set; else x itself. */
static int unscaled(const TpModule *m, int x, double *s) {
  int o = def_of(m, x, TP_OP_Mul);
  for (int i = 0; o >= 0 && i < 2; i++)
    if (m->values[in(m, o, i)].kind == TP_VAL_CONST && scalar(m, in(m, o, i), s)) return in(m, o, 1 - i);
  return x;
}

/* A new Transpose(x, perm) for K^T kt ("<kt>.k"). */
static int transpose_k(TpModule *m, int x, int kt, const int64_t *perm, TpOrigin at, TpDiag *d) {
  TpType t = *type(m, x);
  for (int i = 0; i < t.rank; i++) t.dims[i] = type(m, x)->dims[perm[i]];
  int o = add_view(m, TP_OP_Transpose, x, kt, "k", at, t);
  tp_set_attr_ints(m, o, "perm", perm, t.rank);
  return check(m, o, d) == TP_OK ? out(m, o) : -1;
}

/* K given K^T: [B, H, T, D] from [B, H, D, T] (4-D) or [B*H, D, T]; [B, T, D] from
 * [B, D, T] when the heads are inside the queries. The operand of the transpose that made
 * K^T, else a new Transpose (of the [B, T, H, D] heads when the export folded the head
 * transpose into K^T's [0,2,3,1], or of K^T itself). */
static int untranspose_k(TpModule *m, const Chain *c, int kt, int64_t heads, TpDiag *d) {
  static const int64_t swap3[] = {0, 2, 1}, swap_last[] = {0, 1, 3, 2}, heads_kt[] = {0, 2, 3, 1}, heads_p[] = {0, 2, 1, 3};
  int o = def_of(m, kt, TP_OP_Transpose);
  TpOrigin at = o >= 0 ? m->ops[o].origin : m->values[kt].origin;
  if (type(m, kt)->rank == 3) {
    bool swapped = o >= 0 && perm_is(m, o, swap3, 3);
    if (c->inner) return swapped ? in(m, o, 0) : transpose_k(m, kt, kt, swap3, at, d);
    if (swapped) return as_heads(m, in(m, o, 0), c->B, heads, d);
    if ((kt = as_heads(m, kt, c->B, heads, d)) < 0) return -1;
    o = def_of(m, kt, TP_OP_Transpose);
  }
  if (o >= 0 && perm_is(m, o, swap_last, 4)) return in(m, o, 0);
  if (o >= 0 && perm_is(m, o, heads_kt, 4)) return transpose_k(m, in(m, o, 0), kt, heads_p, at, d);
  /* SDPA's decomposition: [B, H, D, T] viewed from K [B*H, T, D] transposed in 3-D */
  int r = def_of(m, kt, TP_OP_Reshape), t3 = r >= 0 ? def_of(m, in(m, r, 0), TP_OP_Transpose) : -1;
  if (t3 >= 0 && perm_is(m, t3, swap3, 3) && type(m, in(m, t3, 0))->dims[0] == c->B * heads)
    return as_heads(m, in(m, t3, 0), c->B, heads, d);
  return transpose_k(m, kt, kt, swap_last, at, d);
}

/* K or V [B, Hkv*r, T, D] that HF's repeat_kv made from kv [B, Hkv, T, D] (Unsqueeze to
 * [B, Hkv, 1, T, D], Expand to [B, Hkv, r, T, D], Reshape): kv; else x itself. */
static int unrepeat(const TpModule *m, int x) {
  int r2 = def_of(m, x, TP_OP_Reshape);
  int e = r2 >= 0 ? def_of(m, in(m, r2, 0), TP_OP_Expand) : -1;
  int r1 = e >= 0 ? def_of(m, in(m, e, 0), TP_OP_Reshape) : -1;
  if (r1 < 0) return x;
  int kv = in(m, r1, 0);
  const TpType *tk = type(m, kv), *t1 = type(m, out(m, r1)), *te = type(m, out(m, e)), *tx = type(m, x);
  if (tk->rank != 4 || t1->rank != 5 || te->rank != 5) return x;
  int64_t B = tk->dims[0], Hkv = tk->dims[1], T = tk->dims[2], D = tk->dims[3], r = te->dims[2];
  const int64_t want1[] = {B, Hkv, 1, T, D}, wante[] = {B, Hkv, r, T, D}, wantx[] = {B, Hkv * r, T, D};
  return memcmp(t1->dims, want1, sizeof want1) == 0 && memcmp(te->dims, wante, sizeof wante) == 0 &&
                 memcmp(tx->dims, wantx, sizeof wantx) == 0
             ? kv
             : x;
}

/* ---- proofs already made ----
 *
 * check_steps and prove evaluate the chain at every score position: at T = 2048, 4 million
 * positions per layer, although the layers of a model usually share one mask. What they
 * compute at a position depends only on the chain's shape (T, B, H, the scores' dtype and
 * form), each step's kind, score operand, result type, constant data, whether a
 * parameter feeds it and whether it is the soft-cap: the op and value ids only name things
 * in refusals. So a chain equal to one proven causal in all of these has the same proof,
 * and is not evaluated again.
 * Only acceptances are remembered: a refusal is recomputed, and names its own nodes. */

typedef struct {
  TpOpKind kind;
  int slot;
  TpType type;
  bool param, cap; /* cap: the soft-cap */
} StepKey;

typedef struct {
  Chain c;                 /* its shape (steps and slot name the first chain proven) */
  StepKey step[CHAIN_MAX];
  Frame f;                 /* its constants, owned */
  Proof pr;
} Proven;

typedef struct {
  Proven *at;
  int n;
} ProofMemo;

static StepKey step_key(const TpModule *m, const Chain *c, int s) {
  int o = c->steps[s];
  return (StepKey){m->ops[o].kind, c->slot[s], *type(m, out(m, o)), step_param(m, c, s) >= 0, o == c->cap};
}

static bool same_tensor(const TpTensor *a, const TpTensor *b) {
  if (!a->data || !b->data) return !a->data && !b->data;
  return a->dtype == b->dtype && a->rank == b->rank && memcmp(a->dims, b->dims, (size_t)a->rank * sizeof *a->dims) == 0 &&
         memcmp(a->data, b->data, tp_tensor_bytes(a)) == 0;
}

/* The proof of a chain equal to c with frame f (see above), or NULL. */
static const Proven *recall(const TpModule *m, const ProofMemo *memo, const Chain *c, const Frame *f) {
  for (int e = 0; memo && e < memo->n; e++) {
    const Proven *p = &memo->at[e];
    bool same = p->c.dt == c->dt && p->c.T == c->T && p->c.B == c->B && p->c.H == c->H && p->c.BH == c->BH &&
                p->c.inner == c->inner && p->c.nsteps == c->nsteps && p->f.nb == f->nb && p->f.nh == f->nh;
    for (int s = 0; s < c->nsteps && same; s++) {
      StepKey k = step_key(m, c, s);
      same = k.kind == p->step[s].kind && k.slot == p->step[s].slot && k.param == p->step[s].param &&
             k.cap == p->step[s].cap && tp_type_equal(&k.type, &p->step[s].type) && same_tensor(&f->k[s][0], &p->f.k[s][0]) &&
             same_tensor(&f->k[s][1], &p->f.k[s][1]);
    }
    if (same) return p;
  }
  return NULL;
}

/* Remembers proof pr of chain c with frame f (copied). */
static void remember(const TpModule *m, ProofMemo *memo, const Chain *c, const Frame *f, const Proof *pr) {
  memo->at = realloc(memo->at, (size_t)(memo->n + 1) * sizeof *memo->at);
  TP_ASSERT(memo->at);
  Proven *p = &memo->at[memo->n++];
  *p = (Proven){.c = *c, .f = *f, .pr = *pr};
  for (int s = 0; s < c->nsteps; s++) {
    p->step[s] = step_key(m, c, s);
    for (int n = 0; n < 2; n++) {
      TpTensor *k = &p->f.k[s][n];
      if (!k->data) continue;
      void *copy = malloc(tp_tensor_bytes(k) + 1);
      TP_ASSERT(copy);
      k->data = memcpy(copy, k->data, tp_tensor_bytes(k));
    }
  }
}

static void memo_free(ProofMemo *memo) {
  for (int e = 0; e < memo->n; e++) frame_free(&memo->at[e].f);
  free(memo->at);
}

/* The whole analysis of the attention at Softmax sm: its chain, frame (the caller frees it:
 * frame_free), proof and P V product; NULL, or why it is not causal attention. A memo
 * (may be NULL) gives and keeps the proofs of the score chains. */
static const char *analyse(TpModule *m, int sm, ProofMemo *memo, Chain *c, Frame *f, Proof *pr) {
  memset(f, 0, sizeof *f);
  const char *why = score_chain(m, sm, c);
  if (!why) why = evaluate_chain(m, c, f);
  const Proven *known = why ? NULL : recall(m, memo, c, f);
  if (known) *pr = known->pr;
  else {
    if (!why) why = check_steps(m, c, f);
    if (!why) why = prove(m, c, f, pr);
    if (!why && memo) remember(m, memo, c, f, pr);
  }
  if (why) return why;
  c->pv = times_values(m, c);
  if (c->pv < 0) return tp_strfmt(m, "the probabilities of Softmax at node '%s' are not multiplied by values", node_name(m, sm));
  const TpType *tq = type(m, in(m, c->product, 0)), *tkt = type(m, in(m, c->product, 1)), *tv = type(m, in(m, c->pv, 1));
  if (c->inner) { /* Q [B, T*H, D], K^T [B, D, T], V [B, T, Dv]: one K/V head */
    bool ok = tq->rank == 3 && tkt->rank == 3 && tv->rank == 3 && tq->dims[0] == c->B && tkt->dims[0] == c->B &&
              tv->dims[0] == c->B && tq->dims[1] == c->T * c->H && tkt->dims[2] == c->T && tv->dims[1] == c->T;
    return ok ? NULL
              : tp_strfmt(m, "the products at nodes '%s' and '%s' are not Q K^T and P V of one K/V head",
                          node_name(m, c->product), node_name(m, c->pv));
  }
  int64_t hk = heads_of(c, tkt), hv = heads_of(c, tv);
  if (heads_of(c, tq) != c->H || hk < 0 || hv < 0 || tkt->dims[tkt->rank - 1] != c->T || tv->dims[tv->rank - 2] != c->T)
    return tp_strfmt(m, "the products at nodes '%s' and '%s' are not Q K^T and P V over the scores' batch",
                     node_name(m, c->product), node_name(m, c->pv));
  if (hk != hv) return tp_strfmt(m, "its K has %lld heads and its V %lld", (long long)hk, (long long)hv);
  if (heads_of(c, type(m, out(m, c->pv))) != c->H)
    return tp_strfmt(m, "MatMul at node '%s' does not keep the scores' batch and heads", node_name(m, c->pv));
  if (pr->biased && c->dt != TP_F32) return tp_strfmt(m, "its additive bias is on %s scores, not f32", tp_dtype_name(c->dt));
  return NULL;
}

/* Anchored at Softmax sm: the P V MatMul becomes Attention(Q, K, V[, bias]) {is_causal = 1,
 * scale, window?} (3-D products: Attention on the 4-D heads, and a Reshape back; heads
 * inside the queries: Attention on [B, T, heads*D] rows, q_num_heads H, kv_num_heads 1). */
static int raise_attention(TpModule *m, int sm, ProofMemo *memo, TpDiag *d) {
  Chain c;
  Frame f;
  Proof pr;
  const char *why = analyse(m, sm, memo, &c, &f, &pr);
  int bias = !why && pr.biased ? make_bias(m, &c, &f, m->ops[sm].origin) : -1;
  frame_free(&f);
  if (why) return TP_OK; /* not causal: stays primitive, and insert-token-dim says why */
  /* SDPA's decomposition scales Q and K^T each by sqrt(scale): part of the scale */
  double scale = pr.scale, sq = 1, sk = 1;
  int qs = unscaled(m, in(m, c.product, 0), &sq), kts = unscaled(m, in(m, c.product, 1), &sk);
  scale *= sq * sk;
  int q, k = untranspose_k(m, &c, kts, heads_of(&c, type(m, kts)), d), v = in(m, c.pv, 1);
  if (c.inner) {
    const TpType *tq = type(m, qs);
    q = view_as(m, qs, 3, (int64_t[]){c.B, c.T, c.H * tq->dims[2]}, "rows", d);
  } else {
    q = as_heads(m, qs, c.B, c.H, d);
    v = as_heads(m, v, c.B, heads_of(&c, type(m, v)), d);
  }
  if (q < 0 || k < 0 || v < 0) return TP_ERR_INTERNAL;
  int k1 = unrepeat(m, k), v1 = unrepeat(m, v); /* grouped K/V: the kv heads themselves */
  if (!c.inner && type(m, k1)->dims[1] == type(m, v1)->dims[1]) k = k1, v = v1;
  int at = c.pv;
  if (type(m, out(m, c.pv))->rank == 3) { /* Attention on the heads, then the 3-D view */
    const char *names[] = {tp_strfmt(m, "%s.heads", m->values[out(m, c.pv)].name)};
    at = tp_add_op(m, TP_OP_Attention, (int[]){q, k, v}, 3, names, 1, m->ops[c.pv].origin);
    rewrite(m, c.pv, TP_OP_Reshape, (int[]){out(m, at)}, 1);
  }
  rewrite(m, at, TP_OP_Attention, (int[]){q, k, v, bias}, bias >= 0 ? 4 : 3);
  tp_set_attr_int(m, at, "is_causal", 1);
  tp_set_attr_float(m, at, "scale", scale);
  if (pr.window) tp_set_attr_int(m, at, "window", pr.window);
  if (pr.softcap) tp_set_attr_float(m, at, "softcap", pr.softcap);
  if (c.inner) tp_set_attr_int(m, at, "q_num_heads", c.H), tp_set_attr_int(m, at, "kv_num_heads", 1);
  return check(m, at, d) != TP_OK || check(m, c.pv, d) != TP_OK ? TP_ERR_INTERNAL : TP_OK;
}

/* An imported Attention (opset 23) whose 4-D K and V are repeat_kv's repeated heads (torch's
 * SDPA with grouped K/V): it reads the K/V heads themselves, as raise_attention does, so
 * the repeat is not computed and shard-tensor splits the K/V heads. */
static int read_kv_once(TpModule *m, int o, TpDiag *d) {
  if (m->ops[o].ninputs < 3 || type(m, in(m, o, 1))->rank != 4 || type(m, in(m, o, 2))->rank != 4) return TP_OK;
  int k = unrepeat(m, in(m, o, 1)), v = unrepeat(m, in(m, o, 2));
  if (k == in(m, o, 1) || v == in(m, o, 2) || type(m, k)->dims[1] != type(m, v)->dims[1]) return TP_OK;
  m->ops[o].inputs[1] = k, m->ops[o].inputs[2] = v;
  if (tp_attr_int(m, o, "kv_num_heads", 0) > 0) tp_set_attr_int(m, o, "kv_num_heads", type(m, k)->dims[1]);
  return check(m, o, d);
}

/* Anchored at an imported Attention(Q, K, V, mask) {is_causal = 0} without past keys (torch
 * emits SDPA so at opset 23, its causal mask a constant): when the mask, evaluated at every
 * position of the [T, T] scores as above (bool: false hides; float: at most the bound hides,
 * anything else is an additive bias), hides exactly the keys after each query (and those
 * outside a sliding window), the op becomes is_causal = 1 {window?} with no mask, or with
 * the bias alone (0 where hidden) when some visible position has one. Else it stays. */
static int raise_attention_mask(TpModule *m, int o, TpDiag *d) {
  const TpOp *op = &m->ops[o];
  int q = in(m, o, 0), k = in(m, o, 1), mask = op->ninputs > 3 ? in(m, o, 3) : -1;
  if (tp_attr_int(m, o, "is_causal", 0) || mask < 0 || op->ninputs > 4 || op->noutputs > 1) return TP_OK;
  const TpType *tq = type(m, q), *tk = type(m, k), *tm = type(m, mask);
  int64_t T = tq->dims[tq->rank == 4 ? 2 : 1], L = tk->dims[tk->rank == 4 ? 2 : 1]; /* 4-D heads or 3-D rows */
  if (T != L || T < 1 || tm->rank < 2 || tm->dims[tm->rank - 1] != T || tm->dims[tm->rank - 2] != T) return TP_OK;
  TpTensor t;
  if (!evaluate(m, mask, EVAL_DEPTH, &t)) return TP_OK;
  bool boolean = t.dtype == TP_BOOL, biased = false, causal = true;
  double bound = fmin(lowest(type(m, q)->dtype) * 1e-6, -1e4);
  int64_t n = tp_tensor_numel(&t), window = 0;
  for (int64_t j = 0; j < T; j++) { /* the visible keys of the last query: the window */
    double v = tp_tensor_get_f64(&t, (T - 1) * T + j);
    window += boolean ? v != 0 : v > bound;
  }
  if (window == T) window = 0;
  float *bias = malloc((size_t)n * sizeof *bias + 1);
  TP_ASSERT(bias);
  for (int64_t p = 0; p < n && causal; p++) {
    int64_t j = p % T, i = p / T % T;
    double v = tp_tensor_get_f64(&t, p);
    bool visible = boolean ? v != 0 : v > bound, want = j <= i && (window == 0 || j > i - window);
    causal = visible == want && (boolean || !visible || isfinite(v));
    bias[p] = boolean || !visible ? 0.0f : (float)v;
    biased |= bias[p] != 0;
  }
  free(t.data);
  /* a parameter may hide keys (a float buffer the export made an initializer); one that
   * biases visible scores would be frozen into the attention, and is trained instead */
  if (!causal || (biased && (param_leaf(m, mask, EVAL_DEPTH) >= 0 || tm->dtype != TP_F32))) {
    free(bias);
    return TP_OK;
  }
  int nin = 3;
  if (biased) {
    char name[300];
    snprintf(name, sizeof name, "%s.bias", m->values[mask].name);
    m->ops[o].inputs[3] = tp_add_const(m, tp_unique_name(m, name), *tm, bias, m->ops[o].origin);
    nin = 4;
  }
  free(bias);
  m->ops[o].ninputs = nin;
  tp_set_attr_int(m, o, "is_causal", 1);
  if (window) tp_set_attr_int(m, o, "window", window);
  return check(m, o, d);
}

const char *tp_attention_unproven(TpModule *m, int product) {
  /* the Softmax the product's scores reach, through the ops a score chain may hold */
  int frontier[CHAIN_MAX], n = 0;
  frontier[n++] = out(m, product);
  for (int i = 0; i < n; i++)
    for (int o = 0; o < m->nops; o++) {
      const TpOp *op = &m->ops[o];
      bool reads = false;
      for (int k = 0; k < op->ninputs; k++) reads |= op->inputs[k] == frontier[i];
      if (op->dead || !reads) continue;
      if (op->kind == TP_OP_Softmax) {
        Chain c;
        Frame f;
        Proof pr;
        const char *why = analyse(m, o, NULL, &c, &f, &pr);
        frame_free(&f);
        if (why) return why;
        return c.product == product ? "raise-transformer did not run" : NULL;
      }
      if (n < CHAIN_MAX && op->noutputs == 1 && (tp_op_info[op->kind].traits & TP_TRAIT_ELEMENTWISE || op->kind == TP_OP_Reshape))
        frontier[n++] = op->outputs[0];
    }
  return "no Softmax over its keys follows the product";
}

/* ---- RMSNorm, Rotary, SwiGLU, GeGLU (f32: their kernels' type) ---- */

static bool is_f32(const TpModule *m, int v) { return v >= 0 && type(m, v)->dtype == TP_F32; }

/* A Mul reading v whose other operand is want (any when want < 0): the op,
 * its other operand in *other. */
static int mul_with(const TpModule *m, int v, int want, int *other_operand) {
  for (int o = 0; o < m->nops; o++) {
    if (m->ops[o].dead || m->ops[o].kind != TP_OP_Mul) continue;
    int f = other(m, o, v);
    if (f >= 0 && (want < 0 || f == want)) {
      *other_operand = f;
      return o;
    }
  }
  return -1;
}

/* Anchored at Sqrt(mean(x^2) + eps) over the last axis: x * (1 / sqrt) (Div or Reciprocal)
 * or x / sqrt, then an optional Mul by the scale [C] (Gemma's 1 + weight is a folded
 * constant, or an Add the scale operand keeps). The no-op Casts of HF's chain
 * (x.to(float32), .to(dtype)) are gone already (drop_identities). */
static int raise_rmsnorm(TpModule *m, int sq, TpDiag *d) {
  int add = def_of(m, in(m, sq, 0), TP_OP_Add), var = -1;
  double eps = -1;
  for (int i = 0; add >= 0 && i < 2 && var < 0; i++)
    if (scalar(m, in(m, add, i), &eps)) var = mean_last(m, in(m, add, 1 - i));
  if (var < 0 || !(eps >= 0)) return TP_OK;
  int pow = def_of(m, in(m, var, 0), TP_OP_Pow), mul = def_of(m, in(m, var, 0), TP_OP_Mul), x = -1;
  if (pow >= 0 && scalar_is(m, in(m, pow, 1), 2)) x = in(m, pow, 0);
  if (mul >= 0 && in(m, mul, 0) == in(m, mul, 1)) x = in(m, mul, 0);
  int sub = def_of(m, x, TP_OP_Sub);
  if (!is_f32(m, x) || (sub >= 0 && mean_last(m, in(m, sub, 1)) >= 0)) return TP_OK; /* a LayerNorm's */

  int root = out(m, sq), div = user_of(m, root, TP_OP_Div, 1), normed = -1, inv = -1, f;
  if (div >= 0 && scalar_is(m, in(m, div, 0), 1)) inv = out(m, div);
  else if (div >= 0 && in(m, div, 0) == x) normed = div;
  int rec = user_of(m, root, TP_OP_Reciprocal, 0);
  if (inv < 0 && normed < 0 && rec >= 0) inv = out(m, rec);
  if (inv >= 0) normed = mul_with(m, inv, x, &f);
  if (normed < 0) return TP_OK;
  int last = normed, scale = -1;
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

/* Anchored at Gelu(gate) (raised above, or imported): Mul(Gelu(gate), up) in either order,
 * up of gate's type; the Gelu's form (approximate) carries over. */
static int raise_geglu(TpModule *m, int gelu, TpDiag *d) {
  int gate = in(m, gelu, 0), up = -1;
  int last = is_f32(m, gate) ? mul_with(m, out(m, gelu), -1, &up) : -1;
  if (last < 0 || up == gate || !tp_type_equal(type(m, up), type(m, gate)) ||
      !tp_type_equal(type(m, out(m, last)), type(m, gate)))
    return TP_OK;
  const char *approximate = tp_attr_string(m, gelu, "approximate", "none");
  rewrite(m, last, TP_OP_GeGLU, (int[]){gate, up}, 2);
  tp_set_attr_string(m, last, "approximate", approximate);
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

/* A Cos or Sin table for x: its last dim d, the others 1 or x's, right-aligned as numpy
 * broadcasts (missing leading dims are 1); a constant as exports compute it, or a parameter
 * where a buffer became an initializer. */
static bool rotary_table(const TpModule *m, int t, int x, int64_t d) {
  const TpType *tt = type(m, t), *tx = type(m, x);
  if (tt->dtype != TP_F32 || tt->rank < 1 || tt->rank > tx->rank || tt->dims[tt->rank - 1] != d) return false;
  for (int k = 0; k < tt->rank - 1; k++)
    if (tt->dims[k] != 1 && tt->dims[k] != tx->dims[k + tx->rank - tt->rank]) return false;
  return true;
}

/* Table t at rank `rank`: itself, or a view with leading dims of 1 (a [T, D] table that
 * broadcasts over [B, H, T, D] heads, as models written by hand export it). */
static int table_at_rank(TpModule *m, int t, int rank, TpDiag *d) {
  const TpType *tt = type(m, t);
  int64_t dims[TP_MAX_RANK];
  int lead = rank - tt->rank;
  for (int k = 0; k < rank; k++) dims[k] = k < lead ? 1 : tt->dims[k - lead];
  return view_as(m, t, rank, dims, "table", d);
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
      int rank = type(m, x)->rank, same = sin == cos;
      if ((cos = table_at_rank(m, cos, rank, d)) < 0 || (sin = same ? cos : table_at_rank(m, sin, rank, d)) < 0)
        return TP_ERR_INTERNAL;
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

/* fused: also the ops of modern blocks (RMSNorm, Rotary, SwiGLU, GeGLU). A Gelu the
 * tanh or erf chain became is visited at its place, after its chain's ops. */
static int raise(TpModule *m, bool fused, TpDiag *d) {
  int nops = m->nops, rc = TP_OK;
  ProofMemo memo = {0};
  drop_identities(m);
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
    case TP_OP_Gelu: rc = fused ? raise_geglu(m, o, d) : TP_OK; break;
    case TP_OP_Concat: rc = fused ? raise_partial_rotary(m, o, d) : TP_OK; break;
    case TP_OP_Reshape: rc = raise_flattened(m, o, d); break;
    case TP_OP_Div: rc = raise_layernorm(m, o, d); break;
    case TP_OP_Erf: rc = raise_gelu_erf(m, o, d); break;
    case TP_OP_Tanh: rc = raise_gelu_tanh(m, o, d); break;
    case TP_OP_Softmax: rc = raise_attention(m, o, &memo, d); break;
    case TP_OP_Attention:
      rc = raise_attention_mask(m, o, d);
      if (rc == TP_OK) rc = read_kv_once(m, o, d);
      break;
    default: break;
    }
  }
  memo_free(&memo);
  for (int o = 0; o < nops && rc == TP_OK; o++) /* after Gemm became Linear */
    if (!m->ops[o].dead && m->ops[o].kind == TP_OP_Reshape) rc = unflatten(m, o, d);
  drop_identities(m); /* what unflatten left */
  if (m->nops != nops) tp_sort_ops(m); /* Attention's new K transposes */
  tp_module_compact(m); /* the identities dropped */
  return rc;
}

int pass_raise_transformer(TpModule *m, TpDiag *d) { return raise(m, true, d); }

/* The same, with the chains of RMSNorm, rotary embeddings, SwiGLU and GeGLU left primitive: the
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
