/* raise-transformer (and raise-transformer-unfused, without the last four patterns
 * below): requires folded constants (fold-constants) so masks and scalars are
 * CONST values; provides the transformer ops of ir/ops.def in place of the primitive chains
 * exporters write (torch.onnx.export and the dynamo exporter), leaving the chains dead for dce. First, a Cast
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
 * causal mask is proven from its values (passes/causal_mask.c): the masked positions
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
#include "causal_mask.h"
#include "match.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- queries (the shared ones: passes/match.h) ---- */

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
    if (!inside && elementwise && type(m, v)->rank > 1) return false;                    /* one row for all */
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
  if (tp_attr_int(m, o, "axis", 0) != 0 || !is_float(m, table) || !weight(m, table, &w, &transposed) || transposed ||
      (it != TP_I64 && it != TP_I32))
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
 * The attentions passes/causal_mask.c proves causal are raised here: Q, K and V read off
 * the products, in the heads layout Attention takes. */

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
static int untranspose_k(TpModule *m, const TpScoreChain *c, int kt, int64_t heads, TpDiag *d) {
  static const int64_t swap3[] = {0, 2, 1}, swap_last[] = {0, 1, 3, 2}, heads_kt[] = {0, 2, 3, 1},
                       heads_p[] = {0, 2, 1, 3};
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

/* Anchored at Softmax sm: the P V MatMul becomes Attention(Q, K, V[, bias]) {is_causal = 1,
 * scale, window?} (3-D products: Attention on the 4-D heads, and a Reshape back; heads
 * inside the queries: Attention on [B, T, heads*D] rows, q_num_heads H, kv_num_heads 1). */
static int raise_attention(TpModule *m, int sm, TpCausalMemo *memo, TpDiag *d) {
  TpScoreChain c;
  TpCausalProof pr;
  int bias;
  const char *why = tp_prove_causal_attention(m, sm, memo, &c, &pr, &bias);
  if (why) return TP_OK; /* not causal: stays primitive, and insert-token-dim says why */
  /* SDPA's decomposition scales Q and K^T each by sqrt(scale): part of the scale */
  double scale = pr.scale, sq = 1, sk = 1;
  int qs = unscaled(m, in(m, c.product, 0), &sq), kts = unscaled(m, in(m, c.product, 1), &sk);
  scale *= sq * sk;
  int q, k = untranspose_k(m, &c, kts, tp_score_heads(&c, type(m, kts)), d), v = in(m, c.pv, 1);
  if (c.inner) {
    const TpType *tq = type(m, qs);
    q = view_as(m, qs, 3, (int64_t[]){c.B, c.T, c.H * tq->dims[2]}, "rows", d);
  } else {
    q = as_heads(m, qs, c.B, c.H, d);
    v = as_heads(m, v, c.B, tp_score_heads(&c, type(m, v)), d);
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
 * position of the [T, T] scores (tp_prove_causal_mask), hides exactly the keys after each
 * query (and those outside a sliding window), the op becomes is_causal = 1 {window?} with no mask, or with
 * the bias alone (0 where hidden) when some visible position has one. Else it stays. */
static int raise_attention_mask(TpModule *m, int o, TpDiag *d) {
  const TpOp *op = &m->ops[o];
  int q = in(m, o, 0), k = in(m, o, 1), mask = op->ninputs > 3 ? in(m, o, 3) : -1;
  if (tp_attr_int(m, o, "is_causal", 0) || mask < 0 || op->ninputs > 4 || op->noutputs > 1) return TP_OK;
  const TpType *tq = type(m, q), *tk = type(m, k), *tm = type(m, mask);
  int64_t T = tq->dims[tq->rank == 4 ? 2 : 1], L = tk->dims[tk->rank == 4 ? 2 : 1]; /* 4-D heads or 3-D rows */
  if (T != L || T < 1 || tm->rank < 2 || tm->dims[tm->rank - 1] != T || tm->dims[tm->rank - 2] != T) return TP_OK;
  int64_t window;
  float *bias;
  if (!tp_prove_causal_mask(m, mask, tq->dtype, T, &window, &bias)) return TP_OK;
  int nin = 3;
  if (bias) {
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
  if (tv->rank != r || n != r || starts[r - 1] != start || steps[r - 1] != step || tv->dims[r - 1] != len)
    return false;
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
    if (b->rank != a->rank + 1 || b->dims[b->rank - 1] != 1 ||
        memcmp(a->dims, b->dims, (size_t)a->rank * sizeof a->dims[0]))
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
  TpCausalMemo memo = {0};
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
  tp_causal_memo_free(&memo);
  for (int o = 0; o < nops && rc == TP_OK; o++) /* after Gemm became Linear */
    if (!m->ops[o].dead && m->ops[o].kind == TP_OP_Reshape) rc = unflatten(m, o, d);
  drop_identities(m);                  /* what unflatten left */
  if (m->nops != nops) tp_sort_ops(m); /* Attention's new K transposes */
  tp_module_compact(m);                /* the identities dropped */
  return rc;
}

int pass_raise_transformer(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  (void)opt;
  return raise(m, true, d);
}

/* The same, with the chains of RMSNorm, rotary embeddings, SwiGLU and GeGLU left primitive: the
 * reference the fused ops are measured and checked against (tokpipec --no-fuse). */
int pass_raise_transformer_unfused(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  (void)opt;
  return raise(m, false, d);
}
