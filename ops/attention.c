/* Attention (ONNX opset 23, with the causal band and soft-cap tokpipec adds),
 * the rotary position embedding, and their backward ops.
 *
 * Each op's rule set, tp_rules_<Op> (ops/rules.h), is at the end of the file; the hooks
 * it names are above it. */
#include "axes.h"
#include "bind.h"
#include "grad.h"
#include "infer.h"
#include "split.h"

#include <math.h>

#include <stdlib.h>

/* ---- shape rules ---- */

/* Attention's and AttentionBackward's causal attributes: causal_offset >= 0, and a window
 * >= 0 that only a causal attention has. */
static int check_causal_attrs(const TpInferCtx *c) {
  int64_t offset = tp_attr_int(c->m, c->op, "causal_offset", 0), window = tp_attr_int(c->m, c->op, "window", 0);
  if (offset < 0) return tp_error_op(c->d, c->m, c->op, "causal_offset %lld must be >= 0", (long long)offset);
  if (window < 0) return tp_error_op(c->d, c->m, c->op, "window %lld must be >= 0", (long long)window);
  if (window && !tp_attr_int(c->m, c->op, "is_causal", 0))
    return tp_error_op(c->d, c->m, c->op, "window %lld needs is_causal = 1", (long long)window);
  return TP_OK;
}

/* An attention mask: bool or Q's dtype, rank <= 4, broadcast to the scores [B, H, S, T]. */
static int check_attention_mask(const TpInferCtx *c, const TpType *mask, TpDType dtype, int64_t batch, int64_t heads,
                                int64_t s, int64_t total) {
  TpType scores = {.dtype = mask->dtype, .rank = 4, .dims = {batch, heads, s, total}}, t;
  if (mask->rank > 4 || broadcast(c, mask, &scores, &t)) return TP_ERR_INPUT;
  if (!tp_type_equal(&t, &scores))
    return tp_error_op(c->d, c->m, c->op, "attn_mask does not broadcast to the scores");
  if (mask->dtype != TP_BOOL && mask->dtype != dtype)
    return tp_error_op(c->d, c->m, c->op, "attn_mask must be bool or Q's dtype");
  return TP_OK;
}

/* The log-sum-exp of attention's query rows: f32 [B, q_heads, q_len], Q's batch and
 * sequence dims. */
static TpType lse_type(const TpType *q, int64_t q_heads) {
  int seq = q->rank == 4 ? 2 : 1;
  TpType t = {.dtype = TP_F32, .rank = 3, .dims = {q->dims[0], q_heads, q->dims[seq]}};
  t.dimnames[0] = q->dimnames[0], t.dimnames[2] = q->dimnames[seq];
  return t;
}

/* Attention (ONNX opset 23): 4-D [B, H, S, D] operands, or 3-D [B, S, H*D] with head counts. */
static int infer_attention(const TpInferCtx *c) {
  const TpType *q = operand(c, 0), *k = operand(c, 1), *v = operand(c, 2), *mask = operand(c, 3);
  const TpType *past_k = operand(c, 4), *past_v = operand(c, 5);
  if (need_float(c, q, "Q") || same_dtype(c, q, k) || same_dtype(c, q, v)) return TP_ERR_INPUT;
  if (q->rank != k->rank || q->rank != v->rank || (q->rank != 3 && q->rank != 4))
    return tp_error_op(c->d, c->m, c->op, "Q, K and V must all be 3-D or all 4-D");
  int64_t batch = q->dims[0], hq, hkv, s, l, dq, dv;
  if (q->rank == 4) {
    hq = q->dims[1], s = q->dims[2], dq = q->dims[3];
    hkv = k->dims[1], l = k->dims[2], dv = v->dims[3];
    if (k->dims[3] != dq || v->dims[1] != hkv || v->dims[2] != l)
      return tp_error_op(c->d, c->m, c->op, "K and V do not match Q's head size or each other");
  } else {
    hq = tp_attr_int(c->m, c->op, "q_num_heads", 0), hkv = tp_attr_int(c->m, c->op, "kv_num_heads", 0);
    if (hq <= 0 || hkv <= 0 || q->dims[2] % hq || k->dims[2] % hkv || v->dims[2] % hkv)
      return tp_error_op(c->d, c->m, c->op,
                         "3-D operands need q_num_heads and kv_num_heads dividing the hidden sizes");
    s = q->dims[1], l = k->dims[1], dq = q->dims[2] / hq, dv = v->dims[2] / hkv;
    if (k->dims[2] / hkv != dq || v->dims[1] != l)
      return tp_error_op(c->d, c->m, c->op, "K and V do not match Q's head size or each other");
  }
  if (k->dims[0] != batch || v->dims[0] != batch || hkv <= 0 || hq % hkv)
    return tp_error_op(c->d, c->m, c->op, "batch sizes differ or q heads are not a multiple of kv heads");
  int64_t past = 0;
  if ((past_k == NULL) != (past_v == NULL))
    return tp_error_op(c->d, c->m, c->op, "past_key and past_value come together");
  if (past_k) {
    past = past_k->dims[2];
    if (past_k->rank != 4 || past_v->rank != 4 || past_k->dims[0] != batch || past_k->dims[1] != hkv ||
        past_k->dims[3] != dq || past_v->dims[0] != batch || past_v->dims[1] != hkv || past_v->dims[2] != past ||
        past_v->dims[3] != dv)
      return tp_error_op(c->d, c->m, c->op, "past_key/past_value must be [B, kv_heads, P, head_size]");
  }
  int64_t total = past + l;
  if (dv && hq > INT64_MAX / dv)
    return tp_error_op(c->d, c->m, c->op, "q_num_heads %lld is too large", (long long)hq);
  if (check_causal_attrs(c) || (mask && check_attention_mask(c, mask, q->dtype, batch, hq, s, total)))
    return TP_ERR_INPUT;
  TpType y = q->rank == 4 ? (TpType){.dtype = q->dtype, .rank = 4, .dims = {batch, hq, s, dv}}
                          : (TpType){.dtype = q->dtype, .rank = 3, .dims = {batch, s, hq * dv}};
  y.dimnames[0] = q->dimnames[0];
  y.dimnames[q->rank == 4 ? 2 : 1] = q->dimnames[q->rank == 4 ? 2 : 1];
  TpType pk = {.dtype = q->dtype, .rank = 4, .dims = {batch, hkv, total, dq}};
  TpType pv = {.dtype = q->dtype, .rank = 4, .dims = {batch, hkv, total, dv}};
  TpType qk = {.dtype = q->dtype, .rank = 4, .dims = {batch, hq, s, total}};
  return set_result(c, 0, y) || set_result(c, 1, pk) || set_result(c, 2, pv) || set_result(c, 3, qk) ||
                 set_result(c, 4, lse_type(q, hq))
             ? TP_ERR_INPUT
             : TP_OK;
}

static bool same_dims(const TpType *a, const TpType *b) {
  if (a->rank != b->rank) return false;
  for (int k = 0; k < a->rank; k++)
    if (a->dims[k] != b->dims[k]) return false;
  return true;
}

static int infer_attention_backward(const TpInferCtx *c) {
  const TpType *dy = operand(c, 0), *q = operand(c, 1), *k = operand(c, 2), *v = operand(c, 3);
  if (need_float(c, q, "Q") || same_dtype(c, q, k) || same_dtype(c, q, v)) return TP_ERR_INPUT;
  if (q->rank != k->rank || q->rank != v->rank || (q->rank != 3 && q->rank != 4))
    return tp_error_op(c->d, c->m, c->op, "Q, K and V must all be 3-D or all 4-D");
  TpType y = *q; /* [B, H, S, Dv] or [B, S, H*Dv] */
  if (q->rank == 4) {
    if (k->dims[3] != q->dims[3] || k->dims[1] <= 0 || q->dims[1] % k->dims[1] || v->dims[1] != k->dims[1] ||
        v->dims[2] != k->dims[2])
      return tp_error_op(c->d, c->m, c->op, "K and V do not match Q's heads or head size");
    y.dims[3] = v->dims[3];
  } else {
    int64_t hq = tp_attr_int(c->m, c->op, "q_num_heads", 0), hkv = tp_attr_int(c->m, c->op, "kv_num_heads", 0);
    if (hq <= 0 || hkv <= 0 || hq % hkv || q->dims[2] % hq || k->dims[2] % hkv || v->dims[2] % hkv ||
        k->dims[2] / hkv != q->dims[2] / hq || v->dims[1] != k->dims[1])
      return tp_error_op(c->d, c->m, c->op, "3-D operands need matching q_num_heads and kv_num_heads");
    int64_t dv = v->dims[2] / hkv;
    if (dv && hq > INT64_MAX / dv)
      return tp_error_op(c->d, c->m, c->op, "q_num_heads %lld is too large", (long long)hq);
    y.dims[2] = hq * dv;
  }
  if (k->dims[0] != q->dims[0] || v->dims[0] != q->dims[0])
    return tp_error_op(c->d, c->m, c->op, "batch sizes differ");
  if (check_grad(c, dy, &y) || check_causal_attrs(c)) return TP_ERR_INPUT;
  const TpType *mask = operand(c, 4);
  int seq = q->rank == 4 ? 2 : 1;
  int64_t heads = q->rank == 4 ? q->dims[1] : tp_attr_int(c->m, c->op, "q_num_heads", 0);
  if (mask && check_attention_mask(c, mask, q->dtype, q->dims[0], heads, q->dims[seq], k->dims[seq]))
    return TP_ERR_INPUT;
  const TpType *fy = operand(c, 5), *lse = operand(c, 6);
  if (!fy != !lse) return tp_error_op(c->d, c->m, c->op, "the forward's Y and lse come together");
  if (fy) {
    TpType want = lse_type(q, heads);
    if (!same_dims(fy, &y) || !tp_dtype_is_float(fy->dtype))
      return tp_error_op(c->d, c->m, c->op, "Y must be the forward's result, of dY's shape");
    if (lse->dtype != TP_F32 || !same_dims(lse, &want))
      return tp_error_op(c->d, c->m, c->op, "lse must be f32 [B, q_heads, q_len]");
  }
  return set_results_like(c, 1, 3);
}

/* Rotary's (or RotaryBackward's) tables against X (or dY): one shape, X's rank, last dim
 * rotary_dim, the other dims 1 or X's. */
static int rotary_operands(const TpInferCtx *c, const TpType *x, const TpType *cos, const TpType *sin) {
  int64_t rd = tp_attr_int(c->m, c->op, "rotary_dim", 0);
  if (need_float(c, x, "X") || same_dtype(c, x, cos) || same_dtype(c, x, sin)) return TP_ERR_INPUT;
  if (x->rank < 1 || rd <= 0 || rd % 2 || rd > x->dims[x->rank - 1])
    return tp_error_op(c->d, c->m, c->op, "rotary_dim %lld must be even, positive and at most X's last dim",
                       (long long)rd);
  if (!tp_type_equal(cos, sin)) return tp_error_op(c->d, c->m, c->op, "Cos and Sin must have one shape");
  for (int t = 0; t < 2; t++) {
    const TpType *table = t ? sin : cos;
    bool ok = table->rank == x->rank && table->dims[x->rank - 1] == rd;
    for (int k = 0; ok && k < x->rank - 1; k++) ok = table->dims[k] == 1 || table->dims[k] == x->dims[k];
    if (!ok)
      return tp_error_op(c->d, c->m, c->op, "%s must have X's rank, last dim rotary_dim and other dims 1 or X's",
                         t ? "Sin" : "Cos");
  }
  return TP_OK;
}

static int infer_rotary(const TpInferCtx *c) {
  const TpType *x = operand(c, 0);
  if (rotary_operands(c, x, operand(c, 1), operand(c, 2))) return TP_ERR_INPUT;
  return set_result(c, 0, *x);
}

static int infer_rotary_backward(const TpInferCtx *c) {
  const TpType *dy = operand(c, 0);
  if (rotary_operands(c, dy, operand(c, 1), operand(c, 2))) return TP_ERR_INPUT;
  return set_result(c, 0, *dy);
}

/* ---- FLOPs ---- */

/* QK^T and PV: 2 multiply-adds per query element and key; half of them when causal */
static double flops_attention(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  const TpType *q = &m->values[o->inputs[0]].type, *k = &m->values[o->inputs[1]].type;
  double kv = (double)k->dims[k->rank == 4 ? 2 : 1];
  double f = 4 * (double)tp_type_numel(q) * kv;
  return tp_attr_int(m, op, "is_causal", 0) ? f / 2 : f;
}

/* ---- gradients ---- */

/* A CONST [1, .., 1, n] of rank `rank` filled with `value` (f32). */
static int filled_table(TpGradCtx *a, int rank, int64_t n, float value) {
  TpType t = {.dtype = TP_F32, .rank = rank};
  for (int k = 0; k < rank; k++) t.dims[k] = k == rank - 1 ? n : 1;
  float *data = malloc((size_t)n * sizeof *data + 1);
  TP_ASSERT(data);
  for (int64_t i = 0; i < n; i++) data[i] = value;
  int v = tp_add_const(a->m, tp_unique_name(a->m, tp_strfmt(a->m, "ad.rotary.%g", value)), t, data, (TpOrigin){0});
  free(data);
  return v;
}

/* Rotary's Cos and Sin as trainable values (a buffer exported as an initializer): over the
 * first rotary_dim features, dCos = dY X and dSin = dY rot(X), summed over the axes the
 * tables broadcast along; rot(X) is Rotary(X, 0, 1). */
static void rotary_tables_backward(TpGradCtx *a, const int *in, const bool *need, int dy) {
  TpModule *m = a->m;
  TpType part = type_of(a, in[0]);
  int r = part.rank, x = in[0], g = dy;
  int64_t rd = tp_attr_int(m, a->fwd, "rotary_dim", 0), starts[TP_MAX_RANK] = {0}, steps[TP_MAX_RANK];
  if (rd < part.dims[r - 1]) { /* the rotated features of X and dY */
    part.dims[r - 1] = rd;
    for (int k = 0; k < r; k++) steps[k] = 1;
    int s[2];
    for (int i = 0; i < 2; i++) {
      int op = tp_grad_begin(a, TP_OP_Slice, i ? &dy : &x, 1, (const char *[]){tp_grad_tmp_name(a, in[i ? 1 : 0])},
                             1);
      tp_set_attr_ints(m, op, "starts", starts, r);
      tp_set_attr_ints(m, op, "steps", steps, r);
      s[i] = tp_grad_end(a, op, &part);
    }
    x = s[0], g = s[1];
  }
  if (need[1]) tp_grad_give_binary(a, in[1], TP_OP_Mul, g, x);
  if (need[2]) {
    int op = tp_grad_begin(a, TP_OP_Rotary, (int[]){x, filled_table(a, r, rd, 0), filled_table(a, r, rd, 1)}, 3,
                           (const char *[]){tp_grad_tmp_name(a, in[2])}, 1);
    tp_grad_copy_attrs(a, op);
    tp_grad_give_binary(a, in[2], TP_OP_Mul, g, tp_grad_end(a, op, NULL));
  }
}

/* The lse result of forward Attention op o (added where absent): the backward reads it and
 * Y instead of computing the rows' statistics again. */
static int attention_lse(TpGradCtx *a, int o) {
  TpModule *m = a->m;
  if (m->ops[o].noutputs < 5) {
    int *outs = tp_alloc(m, 5 * sizeof *outs);
    for (int i = 0; i < 5; i++) outs[i] = i < m->ops[o].noutputs ? m->ops[o].outputs[i] : -1;
    m->ops[o].outputs = outs;
    m->ops[o].noutputs = 5;
  }
  if (m->ops[o].outputs[4] < 0) {
    const char *name = tp_unique_name(m, tp_strfmt(m, "%s.lse", name_of(a, m->ops[o].outputs[0])));
    int v = tp_add_value(m, name, TP_VAL_RESULT, (TpType){0}, m->ops[o].origin);
    m->values[v].def = o;
    m->ops[o].outputs[4] = v;
    if (tp_infer_op(m, o, a->d) != TP_OK) a->rc = TP_ERR_INTERNAL;
  }
  return m->ops[o].outputs[4];
}

static void grad_attention(TpGradCtx *a, const TpGradOp *fwd) {
  TpModule *m = a->m;
  int nin = fwd->nin;
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy;
  for (int i = 4; i < nin; i++)
    if (in[i] >= 0) {
      tp_grad_cannot(a, "past key/value inputs are not supported");
      return;
    }
  int mask = nin > 3 ? in[3] : -1;
  if (mask >= 0 && need[3]) {
    tp_grad_cannot(a, "the attention mask would need a gradient (a trained mask is not supported)");
    return;
  }
  const char *names[3];
  for (int i = 0; i < 3; i++) names[i] = need[i] ? tp_grad_contrib_name(a, in[i]) : tp_grad_tmp_name(a, in[i]);
  if (in[0] == in[1] || in[0] == in[2] || in[1] == in[2]) { /* distinct contribution names */
    int v = in[0];
    for (int i = 0; i < 3; i++)
      names[i] = tp_strfmt(a->m, "%s.%d", need[i] ? tp_grad_contrib_name(a, in[i]) : tp_grad_tmp_name(a, v), i);
  }
  int lse = attention_lse(a, a->fwd);
  int op = tp_grad_begin(a, TP_OP_AttentionBackward, (int[]){dy, in[0], in[1], in[2], mask, fwd->y, lse}, 7, names,
                         3);
  tp_grad_copy_attrs(a, op);
  tp_grad_end(a, op, NULL);
  for (int i = 0; i < 3; i++)
    if (need[i]) tp_grad_give(a, in[i], m->ops[op].outputs[i]);
}

static void grad_rotary(TpGradCtx *a, const TpGradOp *fwd) {
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy, x = fwd->x;
  if (need[0]) tp_grad_give_op(a, x, TP_OP_RotaryBackward, (int[]){dy, in[1], in[2]}, 3, false, true);
  if (need[1] || need[2]) rotary_tables_backward(a, in, need, dy);
}

/* ---- token axes ---- */

static void attention_axes(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int q = o->inputs[0], k = o->inputs[1], v = o->inputs[2], y = o->outputs[0];
  int r = value_type(m, q)->rank, seq = r == 4 ? 2 : 1, feat = r - 1;
  axes_link(x, q, 0, y, 0), axes_link(x, k, 0, q, 0), axes_link(x, v, 0, q, 0);
  axes_link(x, q, seq, y, seq), axes_link(x, q, seq, k, seq), axes_link(x, k, seq, v, seq);
  if (r == 4) axes_link(x, q, 1, y, 1), axes_link(x, k, 1, v, 1); /* heads */
  int lse = o->noutputs > 4 ? o->outputs[4] : -1;                 /* [B, q_heads, q_len] */
  if (lse >= 0) {
    axes_link(x, q, 0, lse, 0), axes_link(x, q, seq, lse, 2);
    if (r == 4) axes_link(x, q, 1, lse, 1);
  }
  axes_mix(x, q, feat, "contracts over"), axes_mix(x, k, feat, "contracts over"),
      axes_mix(x, v, feat, "contracts over");
  /* the mask, broadcast to the scores [B, H, Tq, Tk]: its batch and head axes (a mask folded
   * per batch row, as torch's SDPA export has it, is cut by rebatch); its query and key
   * axes are cut by split-sequence itself */
  int mask = o->ninputs > 3 ? o->inputs[3] : -1, rm = mask >= 0 ? value_type(m, mask)->rank : 0;
  for (int a = 0; a < rm; a++) {
    int d = a + 4 - rm;
    if (d == 0 && value_type(m, mask)->dims[a] == value_type(m, q)->dims[0]) axes_link(x, mask, a, q, 0);
    if (d == 1 && r == 4 && value_type(m, mask)->dims[a] == value_type(m, q)->dims[1]) axes_link(x, mask, a, q, 1);
  }
}

static void axes_attention(const TpModule *m, int op, TpOpAxes *x) { attention_axes(m, op, x); }

/* the Cos and Sin tables (position by position) broadcast to X */
static void axes_rotary(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = o->inputs[0], Y = o->outputs[0];
  int rx = value_type(m, X)->rank;
  axes_all(m, x, X, Y);
  axes_mix(x, X, rx - 1, "rotates along");
  axes_broadcast(m, x, Y, o->inputs[1]), axes_broadcast(m, x, Y, o->inputs[2]);
}

/* ---- tensor-parallel split ---- */

/* a mask or bias alike for every head stays whole */
static int split_attention(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  TpOp *o = &s->m->ops[op];
  int y = o->outputs[0], x = o->inputs[0];
  int bias = o->ninputs > 3 ? o->inputs[3] : -1, a = bias >= 0 ? m->values[bias].type.rank - 3 : -1;
  bool per_head = tp_split_per_head_bias(m, op);
  if (per_head && tp_split_own_bias(m, op)) { /* a per-head bias param: split with the heads */
    if (tp_split_param(s, op, bias, a, s->parts[x], 1)) return TP_ERR_INPUT;
    tp_split_mark(s, bias, a, s->parts[x]);
  }
  for (int i = 3; i < o->ninputs; i++)
    if (o->inputs[i] >= 0 && (i > 3 || (per_head ? s->axis[bias] != a : s->axis[bias] >= 0)))
      return tp_split_refuse(s, op, "a per-head bias or past keys would need splitting too");
  for (int i = 0; i < 3; i++)
    if (s->axis[o->inputs[i]] != m->values[o->inputs[i]].type.rank - (m->values[x].type.rank == 4 ? 3 : 1))
      return tp_split_refuse(s, op,
                             tp_strfmt(m, "its operand %%%s is not split by heads", m->values[o->inputs[i]].name));
  if (tp_get_attr(m, op, "q_num_heads"))
    tp_set_attr_int(m, op, "q_num_heads", tp_attr_int(m, op, "q_num_heads", 0) / s->parts[x]);
  if (tp_get_attr(m, op, "kv_num_heads"))
    tp_set_attr_int(m, op, "kv_num_heads", tp_attr_int(m, op, "kv_num_heads", 0) / s->parts[o->inputs[1]]);
  if (o->ninputs > 3 && tp_split_share_operand(s, op, 3)) return TP_ERR_INPUT;
  tp_split_mark(s, y, s->axis[x], s->parts[x]);
  if (o->noutputs > 4 && o->outputs[4] >= 0) tp_split_mark(s, o->outputs[4], 1, s->parts[x]); /* lse: by heads */
  return tp_split_reinfer(s, op);
}

static int split_rotary(TpSplitCtx *s, int op) {
  return tp_split_positionwise(s, op, "the rotated features are split");
}

/* ---- kernel binders ---- */

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

/* Attention(Q, K, V, Mask, PastK, PastV) -> Y, PresentK, PresentV, QK, lse, and
 * AttentionBackward(dY, Q, K, V, Mask, Y, lse) -> dQ, dK, dV. */
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
    a->lse = opt_out(m, op, out, 4);
    if (a->lse && tp_tensor_numel(a->lse) != a->p.batch * a->p.q_heads * a->p.q_len) return shape_error(m, op, d);
    b->kernel = TP_K_ATTENTION;
    return TP_OK;
  }
  const TpAttention *p = &a->p;
  a->dy = &in[0];
  if (tp_tensor_numel(&in[0]) != p->batch * p->q_heads * p->q_len * p->v_head_size ||
      !out_numel(m, op, out, 0, tp_tensor_numel(a->q)) || !out_numel(m, op, out, 1, tp_tensor_numel(a->k)) ||
      !out_numel(m, op, out, 2, tp_tensor_numel(a->v)))
    return shape_error(m, op, d);
  a->saved_y = opt_in(m, op, in, 5), a->saved_lse = opt_in(m, op, in, 6);
  if (!a->saved_y != !a->saved_lse) return tp_error_op(d, m, op, "the forward's Y and lse come together");
  if (a->saved_y && (tp_tensor_numel(a->saved_y) != tp_tensor_numel(&in[0]) ||
                     tp_tensor_numel(a->saved_lse) != p->batch * p->q_heads * p->q_len))
    return shape_error(m, op, d);
  a->y = opt_out(m, op, out, 0), a->present_k = opt_out(m, op, out, 1), a->present_v = opt_out(m, op, out, 2);
  b->kernel = TP_K_ATTENTION_BACKWARD;
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

/* ---- rule sets ---- */

const TpOpRules tp_rules_Attention = {
    .infer = infer_attention,
    .flops = flops_attention,
    .gradient = grad_attention,
    .token_axes = axes_attention,
    .tensor_split = split_attention,
    .bind = TP_BINDING(bind_attention, TP_BIND_F32_COPY, 0, 0),
};
const TpOpRules tp_rules_Rotary = {
    .infer = infer_rotary,
    .gradient = grad_rotary,
    .token_axes = axes_rotary,
    .tensor_split = split_rotary,
    .bind = TP_TRAINING_BINDING(bind_rotary),
};
const TpOpRules tp_rules_AttentionBackward = {
    .infer = infer_attention_backward,
    .bind = TP_BINDING(bind_attention, TP_BIND_F32, 1u << 4, 0),
};
const TpOpRules tp_rules_RotaryBackward = {
    .infer = infer_rotary_backward,
    .bind = TP_TRAINING_BINDING(bind_rotary),
};
