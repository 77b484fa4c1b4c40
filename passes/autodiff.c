/* autodiff: requires m->loss (add-loss) and inferred types; provides reverse-mode
 * gradients. The backward ops are appended after the forward ops, each in the backward
 * phase at the stage and slice of the forward op it differentiates and with that op's
 * origin; m->grads[p] is d loss / d p for every trainable PARAM p the loss depends on.
 * They play its role too (TpOpRole): the gradient of a stage-boundary copy
 * (passes/assign_stages.c) is a boundary copy sent back, a Reshape on the stage the forward
 * copy reads from.
 *
 * Trainable: every float PARAM whose name does not match m->freeze (a POSIX extended
 * regex, matched anywhere in the name). Only values that depend on a trainable param and
 * that the loss depends on get a gradient; non-float values never do. The gradient of a
 * value is named "<value>.grad"; a value used k > 1 times receives contributions
 * "<value>.grad.0" .. ".k-1", summed by Adds of which the last is "<value>.grad".
 * Temporaries are "<value>.grad.tmp[.N]", constants "ad.<dtype>.<value>". A param whose
 * gradient passes through unchanged (Add with an operand of the result's shape) shares
 * that value. LayerNorm ops whose backward needs their Mean and InvStdDev get them added.
 * A float op on the path from a param to the loss without a backward rule here is an
 * error: "cannot differentiate op X at node 'Y'". A module that has backward ops already
 * is left alone. */
#include "../ir/ir.h"

#include <regex.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  TpDType dtype;
  double value;
  int v;
} ScalarConst;

typedef struct {
  TpModule *m;
  TpDiag *d;
  int rc;         /* sticky: the first failure */
  int fwd;        /* the forward op being differentiated: stage, slice and origin of new ops */
  int nvalues;    /* values of the forward program (the arrays below have this many) */
  bool *requires; /* depends on a trainable param (float values only) */
  int *count;     /* gradient contributions the value will receive */
  int *seen;      /* contributions received so far */
  int *grad;      /* the sum of the contributions so far, -1 before the first */
  ScalarConst *consts;
  int nconsts;
} Ad;

static TpType type_of(const Ad *a, int v) { return a->m->values[v].type; }
static const char *name_of(const Ad *a, int v) { return a->m->values[v].name; }

static bool same_shape(const TpType *x, const TpType *y) {
  return x->rank == y->rank && memcmp(x->dims, y->dims, (size_t)x->rank * sizeof x->dims[0]) == 0;
}

/* The name of the next contribution to v's gradient, and of a temporary on the way. */
static const char *contrib_name(Ad *a, int v) {
  if (a->count[v] == 1) return tp_strfmt(a->m, "%s.grad", name_of(a, v));
  return tp_strfmt(a->m, "%s.grad.%d", name_of(a, v), a->seen[v]);
}
static const char *tmp_name(Ad *a, int v) { return tp_strfmt(a->m, "%s.grad.tmp", name_of(a, v)); }

/* A new scalar CONST named `name` (made unique). */
static int new_scalar(Ad *a, TpDType dtype, double value, const char *name) {
  uint8_t data[8];
  float f = (float)value;
  uint16_t h;
  switch (dtype) {
  case TP_F64: memcpy(data, &value, 8); break;
  case TP_F32: memcpy(data, &f, 4); break;
  case TP_F16: h = tp_f32_to_f16(f); memcpy(data, &h, 2); break;
  case TP_BF16: h = tp_f32_to_bf16(f); memcpy(data, &h, 2); break;
  default: TP_ASSERT(!"scalar: not a float dtype");
  }
  return tp_add_const(a->m, tp_unique_name(a->m, name), tp_type_make(dtype, 0, NULL), data, (TpOrigin){0});
}

/* A scalar constant used by the backward ops (one per dtype and value). */
static int scalar(Ad *a, TpDType dtype, double value) {
  for (int i = 0; i < a->nconsts; i++)
    if (a->consts[i].dtype == dtype && a->consts[i].value == value) return a->consts[i].v;
  int v = new_scalar(a, dtype, value, tp_strfmt(a->m, "ad.%s.%.9g", tp_dtype_name(dtype), value));
  a->consts = realloc(a->consts, (size_t)(a->nconsts + 1) * sizeof *a->consts);
  TP_ASSERT(a->consts);
  a->consts[a->nconsts++] = (ScalarConst){dtype, value, v};
  return v;
}

/* ---- emitting backward ops ---- */

/* A new backward op placed like the forward op; set its attributes, then call end(). */
static int begin(Ad *a, TpOpKind kind, const int *in, int nin, const char *const *names, int nout) {
  const TpOp *f = &a->m->ops[a->fwd];
  TpOrigin origin = f->origin;
  int stage = f->stage, slice = f->slice;
  TpOpRole role = f->role;
  /* A boundary copy's gradient goes back to the sender: the Reshape is the boundary copy
   * of the gradient, and an Add summing it into the operand's other contributions is
   * ordinary compute on the sender's stage. */
  if (role == TP_ROLE_BOUNDARY) {
    stage = a->m->ops[a->m->values[f->inputs[0]].def].stage;
    if (kind != TP_OP_Reshape) role = TP_ROLE_COMPUTE;
  }
  int op = tp_add_op(a->m, kind, in, nin, names, nout, origin);
  a->m->ops[op].stage = stage;
  a->m->ops[op].slice = slice;
  a->m->ops[op].phase = TP_PHASE_BACKWARD;
  a->m->ops[op].role = role;
  return op;
}

/* Types the results (result 0 is `preset` for the ops that take their type from it);
 * returns result 0. An op that does not type-check is a bug in this pass. */
static int end(Ad *a, int op, const TpType *preset) {
  int r = a->m->ops[op].outputs[0];
  if (preset) a->m->values[r].type = *preset;
  if (a->rc == TP_OK && tp_infer_op(a->m, op, a->d) != TP_OK) a->rc = TP_ERR_INTERNAL;
  return r;
}

static int emit(Ad *a, TpOpKind kind, const int *in, int nin, const char *name, const TpType *preset) {
  return end(a, begin(a, kind, in, nin, &name, 1), preset);
}

static int emit2(Ad *a, TpOpKind kind, int x, int y, const char *name) {
  return emit(a, kind, (int[]){x, y}, 2, name, NULL);
}

/* Adds contribution g to v's gradient. */
static void give(Ad *a, int v, int g) {
  a->seen[v]++;
  TP_ASSERT(a->seen[v] <= a->count[v]);
  if (a->grad[v] < 0) {
    a->grad[v] = g;
    return;
  }
  bool last = a->seen[v] == a->count[v];
  a->grad[v] = emit2(a, TP_OP_Add, a->grad[v], g, last ? tp_strfmt(a->m, "%s.grad", name_of(a, v)) : tmp_name(a, v));
}

/* g summed over the axes numpy broadcasting added to v (ReduceSum, then Reshape where the
 * rank differs); the last op is named `name`. g itself if the shapes agree. */
static int unbroadcast(Ad *a, int g, int v, const char *name) {
  if (a->rc) return g; /* types may be missing after a failure */
  TpType gt = type_of(a, g), vt = type_of(a, v);
  if (same_shape(&gt, &vt)) return g;
  int lead = gt.rank - vt.rank, n = 0;
  int64_t axes[TP_MAX_RANK];
  TP_ASSERT(lead >= 0);
  for (int i = 0; i < gt.rank; i++)
    if (gt.dims[i] != 1 && (i < lead || vt.dims[i - lead] == 1)) axes[n++] = i;
  bool reshape = lead > 0;
  if (n) {
    int op = begin(a, TP_OP_ReduceSum, &g, 1, (const char *[]){reshape ? tmp_name(a, v) : name}, 1);
    tp_set_attr_ints(a->m, op, "axes", axes, n);
    tp_set_attr_int(a->m, op, "keepdims", 1);
    g = end(a, op, NULL);
  }
  return reshape ? emit(a, TP_OP_Reshape, &g, 1, name, &vt) : g;
}

/* Gives v the contribution g (of the forward result's shape), reduced to v's shape. */
static void give_value(Ad *a, int v, int g) {
  if (a->rc) return;
  TpType gt = type_of(a, g), vt = type_of(a, v);
  give(a, v, same_shape(&gt, &vt) ? g : unbroadcast(a, g, v, contrib_name(a, v)));
}

/* Gives v the contribution kind(in...), an elementwise op, reduced to v's shape. */
static void give_elementwise(Ad *a, int v, TpOpKind kind, const int *in, int nin) {
  if (a->rc) return;
  TpType t = type_of(a, in[0]), u;
  for (int i = 1; i < nin; i++) {
    TpType b = type_of(a, in[i]);
    bool ok = tp_broadcast_shape(&t, &b, &u);
    TP_ASSERT(ok);
    t = u;
  }
  TpType vt = type_of(a, v);
  bool fits = same_shape(&t, &vt);
  const char *name = contrib_name(a, v);
  int g = emit(a, kind, in, nin, fits ? name : tmp_name(a, v), NULL);
  give(a, v, fits ? g : unbroadcast(a, g, v, name));
}

static void give_binary(Ad *a, int v, TpOpKind kind, int x, int y) { give_elementwise(a, v, kind, (int[]){x, y}, 2); }
static void give_unary(Ad *a, int v, TpOpKind kind, int x) { give_elementwise(a, v, kind, &x, 1); }

/* Copies the forward op's attributes that `op` (a backward op) accepts. */
static void copy_attrs(Ad *a, int op) {
  const TpOp *f = &a->m->ops[a->fwd];
  TpOpKind kind = a->m->ops[op].kind;
  for (int i = 0; i < f->nattrs; i++) {
    const TpAttr at = f->attrs[i];
    const TpAttrRule *rule = tp_attr_rules;
    while (rule->name && !(rule->op == kind && strcmp(rule->name, at.name) == 0)) rule++;
    if (!rule->name) continue;
    switch (at.kind) {
    case TP_ATTR_INT: tp_set_attr_int(a->m, op, at.name, at.i); break;
    case TP_ATTR_FLOAT: tp_set_attr_float(a->m, op, at.name, at.f); break;
    case TP_ATTR_INTS: tp_set_attr_ints(a->m, op, at.name, at.ints, at.nints); break;
    case TP_ATTR_STRING: tp_set_attr_string(a->m, op, at.name, at.s); break;
    }
  }
}

/* Gives v the result of a one-result op whose result has v's type: taken from v for the
 * ops that read it from their result (`preset`), attributes copied from the forward op
 * (`copy`). */
static void give_op(Ad *a, int v, TpOpKind kind, const int *in, int nin, bool preset, bool copy) {
  TpType vt = type_of(a, v);
  int op = begin(a, kind, in, nin, (const char *[]){contrib_name(a, v)}, 1);
  if (copy) copy_attrs(a, op);
  give(a, v, end(a, op, preset ? &vt : NULL));
}

/* The one element of a CONST, as a double; false if v is not such a constant. */
static bool const_scalar(const TpModule *m, int v, double *out) {
  const TpValue *val = &m->values[v];
  if (val->kind != TP_VAL_CONST || tp_type_numel(&val->type) != 1) return false;
  const uint8_t *p = tp_value_data(m, v);
  union { float f; double d; uint16_t h; int32_t i32; int64_t i64; } u;
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

static int cannot(Ad *a, const char *why) {
  const TpOp *f = &a->m->ops[a->fwd];
  const char *node = f->origin.node ? f->origin.node : name_of(a, f->outputs[0]);
  return a->rc = tp_error_op(a->d, a->m, a->fwd, "cannot differentiate op %s at node '%s'%s%s",
                             tp_op_info[f->kind].name, node, why ? ": " : "", why ? why : "");
}

/* Adds the Mean and InvStdDev results to forward LayerNorm op o where absent. */
static void layernorm_stats(Ad *a, int o) {
  TpModule *m = a->m;
  if (m->ops[o].noutputs < 3) {
    int *outs = tp_alloc(m, 3 * sizeof *outs);
    for (int i = 0; i < 3; i++) outs[i] = i < m->ops[o].noutputs ? m->ops[o].outputs[i] : -1;
    m->ops[o].outputs = outs;
    m->ops[o].noutputs = 3;
  }
  const char *y = name_of(a, m->ops[o].outputs[0]);
  for (int i = 1; i < 3; i++) {
    if (m->ops[o].outputs[i] >= 0) continue;
    const char *name = tp_unique_name(m, tp_strfmt(a->m, "%s.%s", y, i == 1 ? "mean" : "invstddev"));
    int v = tp_add_value(m, name, TP_VAL_RESULT, (TpType){0}, m->ops[o].origin);
    m->values[v].def = o;
    m->ops[o].outputs[i] = v;
  }
  if (tp_infer_op(m, o, a->d) != TP_OK) a->rc = TP_ERR_INTERNAL;
}

/* Gemm: Y = alpha op(A) op(B) + beta C, op(X) = X or X^T. Its gradients are Gemms too. */
static void gemm_backward(Ad *a, const int *in, bool need_a, bool need_b, bool need_c, int dy) {
  int o = a->fwd;
  double alpha = tp_attr_float(a->m, o, "alpha", 1), beta = tp_attr_float(a->m, o, "beta", 1);
  bool ta = tp_attr_int(a->m, o, "transA", 0), tb = tp_attr_int(a->m, o, "transB", 0);
  for (int which = 0; which < 2; which++) {
    if (!(which ? need_b : need_a)) continue;
    int v = in[which], x, y;
    bool tx, ty;
    if (which == 0 && !ta) x = dy, y = in[1], tx = false, ty = !tb;      /* dA = dY op(B)^T */
    else if (which == 0) x = in[1], y = dy, tx = tb, ty = true;           /* dA = op(B) dY^T */
    else if (!tb) x = in[0], y = dy, tx = !ta, ty = false;                /* dB = op(A)^T dY */
    else x = dy, y = in[0], tx = true, ty = ta;                           /* dB = dY^T op(A) */
    int op = begin(a, TP_OP_Gemm, (int[]){x, y}, 2, (const char *[]){contrib_name(a, v)}, 1);
    if (alpha != 1) tp_set_attr_float(a->m, op, "alpha", alpha);
    if (tx) tp_set_attr_int(a->m, op, "transA", 1);
    if (ty) tp_set_attr_int(a->m, op, "transB", 1);
    give(a, v, end(a, op, NULL));
  }
  if (need_c) {
    if (beta == 1)
      give_value(a, in[2], dy);
    else
      give_binary(a, in[2], TP_OP_Mul, dy, scalar(a, type_of(a, dy).dtype, beta));
  }
}

/* SoftmaxCrossEntropyLoss (through CrossEntropyBackward, classes moved last) and
 * NegativeLogLikelihoodLoss (-dLoss/denominator where the class is the target). */
static void loss_backward(Ad *a, const int *in, int dy) {
  int o = a->fwd, x = in[0], labels = in[1];
  TpType xt = type_of(a, x), lt = type_of(a, labels);
  const char *reduction = tp_attr_string(a->m, o, "reduction", "mean");
  const TpAttr *ignore = tp_get_attr(a->m, o, "ignore_index");
  if (a->m->ops[o].ninputs > 2 && in[2] >= 0) {
    cannot(a, "class weights are not supported");
    return;
  }
  if (strcmp(reduction, "none") == 0) {
    cannot(a, "reduction 'none' is not supported");
    return;
  }
  /* an ignore_index no class can have changes nothing: the trainer's targets are tokens */
  if (ignore && ignore->i >= 0 && ignore->i < xt.dims[1]) {
    cannot(a, "an ignore_index inside the class range is not supported");
    return;
  }
  double denominator = strcmp(reduction, "mean") == 0 ? (double)tp_type_numel(&lt) : 1;
  if (a->m->ops[o].kind == TP_OP_SoftmaxCrossEntropyLoss) {
    int r = xt.rank, scores = x;
    int64_t last[TP_MAX_RANK], back[TP_MAX_RANK]; /* [N, C, d...] <-> [N, d..., C] */
    for (int i = 0; i < r; i++) last[i] = i == 0 ? 0 : i == r - 1 ? 1 : i + 1;
    for (int i = 0; i < r; i++) back[last[i]] = i;
    if (r > 2) {
      int op = begin(a, TP_OP_Transpose, &x, 1, (const char *[]){tmp_name(a, x)}, 1);
      tp_set_attr_ints(a->m, op, "perm", last, r);
      scores = end(a, op, NULL);
    }
    int op = begin(a, TP_OP_CrossEntropyBackward, (int[]){dy, scores, labels}, 3,
                   (const char *[]){r > 2 ? tmp_name(a, x) : contrib_name(a, x)}, 1);
    tp_set_attr_float(a->m, op, "denominator", denominator);
    int g = end(a, op, NULL);
    if (r > 2) {
      op = begin(a, TP_OP_Transpose, &g, 1, (const char *[]){contrib_name(a, x)}, 1);
      tp_set_attr_ints(a->m, op, "perm", back, r);
      g = end(a, op, NULL);
    }
    give(a, x, g);
    return;
  }
  /* NLL: onehot = Equal(labels as [N, 1, d...], classes [1, C, 1...]) */
  TpType col = lt, classes = {.dtype = lt.dtype, .rank = xt.rank};
  col.rank = xt.rank;
  col.dims[0] = lt.dims[0];
  col.dimnames[0] = lt.dimnames[0];
  col.dims[1] = 1;
  col.dimnames[1] = NULL;
  for (int i = 2; i < xt.rank; i++) col.dims[i] = lt.dims[i - 1], col.dimnames[i] = lt.dimnames[i - 1];
  for (int i = 0; i < xt.rank; i++) classes.dims[i] = i == 1 ? xt.dims[1] : 1;
  int64_t nclasses = xt.dims[1];
  size_t size = tp_dtype_size(lt.dtype);
  uint8_t *iota = malloc((size_t)nclasses * size + 1);
  TP_ASSERT(iota);
  for (int64_t c = 0; c < nclasses; c++) {
    int32_t c32 = (int32_t)c;
    if (size == 8) memcpy(iota + c * 8, &c, 8);
    else memcpy(iota + c * 4, &c32, 4);
  }
  int cls = tp_add_const(a->m, tp_unique_name(a->m, tp_strfmt(a->m, "%s.classes", name_of(a, x))), classes, iota, (TpOrigin){0});
  free(iota);
  int lab = emit(a, TP_OP_Reshape, &labels, 1, tmp_name(a, x), &col);
  int onehot = emit2(a, TP_OP_Equal, lab, cls, tmp_name(a, x));
  TpDType dt = xt.dtype;
  int scale = emit2(a, TP_OP_Div, dy, scalar(a, dt, denominator), tmp_name(a, x));
  scale = emit(a, TP_OP_Neg, &scale, 1, tmp_name(a, x), NULL);
  give_elementwise(a, x, TP_OP_Where, (int[]){onehot, scale, scalar(a, dt, 0)}, 3);
}

/* Tile: dy seen as [r0, x0, r1, x1, ...] (the dims repeated once only as x_d), summed over
 * the repeats. */
static void tile_backward(Ad *a, int x, int dy) {
  TpType xt = type_of(a, x), split = {.dtype = xt.dtype};
  int n, naxes = 0;
  const int64_t *repeats = tp_attr_ints(a->m, a->fwd, "repeats", &n);
  int64_t axes[TP_MAX_RANK];
  for (int d = 0; d < xt.rank; d++) naxes += repeats[d] != 1;
  if (xt.rank + naxes > TP_MAX_RANK) {
    cannot(a, tp_strfmt(a->m, "tiling %d dims of a rank-%d tensor (at most rank %d in all)", naxes, xt.rank, TP_MAX_RANK));
    return;
  }
  if (!naxes) {
    give_value(a, x, dy);
    return;
  }
  naxes = 0;
  for (int d = 0; d < xt.rank; d++) {
    if (repeats[d] != 1) {
      axes[naxes++] = split.rank;
      split.dims[split.rank++] = repeats[d];
    }
    split.dims[split.rank++] = xt.dims[d];
  }
  int g = emit(a, TP_OP_Reshape, &dy, 1, tmp_name(a, x), &split);
  int op = begin(a, TP_OP_ReduceSum, &g, 1, (const char *[]){contrib_name(a, x)}, 1);
  tp_set_attr_ints(a->m, op, "axes", axes, naxes);
  tp_set_attr_int(a->m, op, "keepdims", 0);
  give(a, x, end(a, op, NULL));
}

/* A CONST [1, .., 1, n] of rank `rank` filled with `value` (f32). */
static int filled_table(Ad *a, int rank, int64_t n, float value) {
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
static void rotary_tables_backward(Ad *a, const int *in, const bool *need, int dy) {
  TpModule *m = a->m;
  TpType part = type_of(a, in[0]);
  int r = part.rank, x = in[0], g = dy;
  int64_t rd = tp_attr_int(m, a->fwd, "rotary_dim", 0), starts[TP_MAX_RANK] = {0}, steps[TP_MAX_RANK];
  if (rd < part.dims[r - 1]) { /* the rotated features of X and dY */
    part.dims[r - 1] = rd;
    for (int k = 0; k < r; k++) steps[k] = 1;
    int s[2];
    for (int i = 0; i < 2; i++) {
      int op = begin(a, TP_OP_Slice, i ? &dy : &x, 1, (const char *[]){tmp_name(a, in[i ? 1 : 0])}, 1);
      tp_set_attr_ints(m, op, "starts", starts, r);
      tp_set_attr_ints(m, op, "steps", steps, r);
      s[i] = end(a, op, &part);
    }
    x = s[0], g = s[1];
  }
  if (need[1]) give_binary(a, in[1], TP_OP_Mul, g, x);
  if (need[2]) {
    int op = begin(a, TP_OP_Rotary, (int[]){x, filled_table(a, r, rd, 0), filled_table(a, r, rd, 1)}, 3,
                   (const char *[]){tmp_name(a, in[2])}, 1);
    copy_attrs(a, op);
    give_binary(a, in[2], TP_OP_Mul, g, end(a, op, NULL));
  }
}

/* The result count that leaves out absent (NULL-named) trailing results. */
static int results(const char *const *names, int n) {
  while (n > 1 && !names[n - 1]) n--;
  return n;
}

/* Emits the backward of forward op a->fwd: a contribution to every operand that requires
 * a gradient. dy[k] is the gradient of result k (-1: none). */
static void backward(Ad *a, const int *dys) {
  TpModule *m = a->m;
  int o = a->fwd;
  TpOpKind kind = m->ops[o].kind;
  int nin = m->ops[o].ninputs, in[64], out[64];
  TP_ASSERT(nin <= 64 && m->ops[o].noutputs <= 64);
  memcpy(in, m->ops[o].inputs, (size_t)nin * sizeof in[0]);
  memcpy(out, m->ops[o].outputs, (size_t)m->ops[o].noutputs * sizeof out[0]);
  bool need[64];
  for (int i = 0; i < nin; i++) need[i] = in[i] >= 0 && a->requires[in[i]];
  int dy = dys[0], y = out[0], x = in[0];
  for (int k = 1; k < m->ops[o].noutputs && kind != TP_OP_Split; k++)
    if (dys[k] >= 0) {
      cannot(a, tp_strfmt(a->m, "result %d carries a gradient", k));
      return;
    }
  TpDType dt = type_of(a, y).dtype;
  switch (kind) {
  case TP_OP_Add:
    for (int i = 0; i < 2; i++)
      if (need[i]) give_value(a, in[i], dy);
    break;
  case TP_OP_Sub:
    if (need[0]) give_value(a, in[0], dy);
    if (need[1]) give_unary(a, in[1], TP_OP_Neg, dy);
    break;
  case TP_OP_Mul:
    if (need[0]) give_binary(a, in[0], TP_OP_Mul, dy, in[1]);
    if (need[1]) give_binary(a, in[1], TP_OP_Mul, dy, in[0]);
    break;
  case TP_OP_Div: /* d/db a/b = -y/b */
    if (need[0]) give_binary(a, in[0], TP_OP_Div, dy, in[1]);
    if (need[1]) {
      int t = emit2(a, TP_OP_Div, y, in[1], tmp_name(a, in[1]));
      t = emit2(a, TP_OP_Mul, dy, t, tmp_name(a, in[1]));
      give_unary(a, in[1], TP_OP_Neg, t);
    }
    break;
  case TP_OP_Pow: { /* d/da a^b = b a^(b-1); d/db = y log(a) */
    int b = in[1];
    double c;
    if (need[0]) {
      int t;
      if (const_scalar(m, b, &c) && c == 2) {
        t = emit2(a, TP_OP_Mul, x, scalar(a, dt, 2), tmp_name(a, x));
      } else if (const_scalar(m, b, &c)) {
        t = emit2(a, TP_OP_Pow, x, scalar(a, dt, c - 1), tmp_name(a, x));
        t = emit2(a, TP_OP_Mul, t, scalar(a, dt, c), tmp_name(a, x));
      } else {
        int bf = b;
        if (type_of(a, b).dtype != dt) {
          TpType bt = type_of(a, b);
          bt.dtype = dt;
          bf = emit(a, TP_OP_Cast, &b, 1, tmp_name(a, x), &bt);
        }
        t = emit2(a, TP_OP_Sub, bf, scalar(a, dt, 1), tmp_name(a, x));
        t = emit2(a, TP_OP_Pow, x, t, tmp_name(a, x));
        t = emit2(a, TP_OP_Mul, t, bf, tmp_name(a, x));
      }
      give_binary(a, x, TP_OP_Mul, dy, t);
    }
    if (need[1]) {
      if (type_of(a, b).dtype != dt) {
        cannot(a, "the exponent's type differs from the base's");
        return;
      }
      int t = emit(a, TP_OP_Log, &x, 1, tmp_name(a, b), NULL);
      t = emit2(a, TP_OP_Mul, y, t, tmp_name(a, b));
      give_binary(a, b, TP_OP_Mul, dy, t);
    }
    break;
  }
  case TP_OP_Sqrt: /* dy / (2 y) */
    give_binary(a, x, TP_OP_Div, dy, emit2(a, TP_OP_Mul, y, scalar(a, dt, 2), tmp_name(a, x)));
    break;
  case TP_OP_Neg:
    give_unary(a, x, TP_OP_Neg, dy);
    break;
  case TP_OP_Reciprocal: { /* -dy y^2 */
    int t = emit2(a, TP_OP_Mul, y, y, tmp_name(a, x));
    t = emit2(a, TP_OP_Mul, dy, t, tmp_name(a, x));
    give_unary(a, x, TP_OP_Neg, t);
    break;
  }
  case TP_OP_Exp:
    give_binary(a, x, TP_OP_Mul, dy, y);
    break;
  case TP_OP_Log:
    give_binary(a, x, TP_OP_Div, dy, x);
    break;
  case TP_OP_Erf: { /* dy 2/sqrt(pi) exp(-x^2) */
    int t = emit2(a, TP_OP_Mul, x, x, tmp_name(a, x));
    t = emit(a, TP_OP_Neg, &t, 1, tmp_name(a, x), NULL);
    t = emit(a, TP_OP_Exp, &t, 1, tmp_name(a, x), NULL);
    t = emit2(a, TP_OP_Mul, t, scalar(a, dt, 1.1283791670955126), tmp_name(a, x));
    give_binary(a, x, TP_OP_Mul, dy, t);
    break;
  }
  case TP_OP_Tanh: { /* dy (1 - y^2) */
    int t = emit2(a, TP_OP_Mul, y, y, tmp_name(a, x));
    t = emit2(a, TP_OP_Sub, scalar(a, dt, 1), t, tmp_name(a, x));
    give_binary(a, x, TP_OP_Mul, dy, t);
    break;
  }
  case TP_OP_Sigmoid: { /* dy y (1 - y) */
    int t = emit2(a, TP_OP_Sub, scalar(a, dt, 1), y, tmp_name(a, x));
    t = emit2(a, TP_OP_Mul, y, t, tmp_name(a, x));
    give_binary(a, x, TP_OP_Mul, dy, t);
    break;
  }
  case TP_OP_Sin: /* dy cos x */
    give_binary(a, x, TP_OP_Mul, dy, emit(a, TP_OP_Cos, &x, 1, tmp_name(a, x), NULL));
    break;
  case TP_OP_Cos: { /* -dy sin x */
    int t = emit(a, TP_OP_Sin, &x, 1, tmp_name(a, x), NULL);
    t = emit2(a, TP_OP_Mul, dy, t, tmp_name(a, x));
    give_unary(a, x, TP_OP_Neg, t);
    break;
  }
  case TP_OP_Max:
  case TP_OP_Min: { /* dy to the operand chosen; a tie splits it equally, as torch.maximum */
    int tie = -1;
    for (int i = 0; i < 2; i++) {
      if (!need[i]) continue;
      if (tie < 0) {
        int eq = emit2(a, TP_OP_Equal, in[0], in[1], tmp_name(a, x));
        int half = emit2(a, TP_OP_Mul, dy, scalar(a, dt, 0.5), tmp_name(a, x));
        tie = emit(a, TP_OP_Where, (int[]){eq, half, scalar(a, dt, 0)}, 3, tmp_name(a, x), NULL);
      }
      int wins = emit2(a, kind == TP_OP_Max ? TP_OP_Greater : TP_OP_Less, in[i], in[1 - i], tmp_name(a, in[i]));
      give_elementwise(a, in[i], TP_OP_Where, (int[]){wins, dy, tie}, 3);
    }
    break;
  }
  case TP_OP_Relu: {
    int pos = emit2(a, TP_OP_Greater, y, scalar(a, dt, 0), tmp_name(a, x));
    give_elementwise(a, x, TP_OP_Where, (int[]){pos, dy, scalar(a, dt, 0)}, 3);
    break;
  }
  case TP_OP_Where:
    if (need[1]) give_elementwise(a, in[1], TP_OP_Where, (int[]){in[0], dy, scalar(a, dt, 0)}, 3);
    if (need[2]) give_elementwise(a, in[2], TP_OP_Where, (int[]){in[0], scalar(a, dt, 0), dy}, 3);
    break;
  case TP_OP_Cast:
    give_op(a, x, TP_OP_Cast, &dy, 1, true, false);
    break;
  case TP_OP_Trilu:
    give_op(a, x, TP_OP_Trilu, &dy, 1, false, true);
    break;
  case TP_OP_Gelu:
    give_op(a, x, TP_OP_GeluBackward, (int[]){dy, x}, 2, false, true);
    break;
  case TP_OP_Softmax:
    give_op(a, x, TP_OP_SoftmaxBackward, (int[]){dy, y}, 2, false, true);
    break;
  case TP_OP_LogSoftmax:
    give_op(a, x, TP_OP_LogSoftmaxBackward, (int[]){dy, y}, 2, false, true);
    break;
  case TP_OP_Reshape:
    give_op(a, x, TP_OP_Reshape, &dy, 1, true, false);
    break;
  case TP_OP_Expand:
    give_value(a, x, dy);
    break;
  case TP_OP_Slice:
    give_op(a, x, TP_OP_SliceBackward, &dy, 1, true, true);
    break;
  case TP_OP_Gather: /* copies axis and padding_idx */
    if (need[0]) give_op(a, x, TP_OP_GatherBackward, (int[]){dy, in[1]}, 2, true, true);
    break;
  case TP_OP_GatherElements:
    if (need[0]) give_op(a, x, TP_OP_GatherElementsBackward, (int[]){dy, in[1]}, 2, true, true);
    break;
  case TP_OP_CumSum: { /* running sums of dy in the other direction */
    int op = begin(a, TP_OP_CumSum, &dy, 1, (const char *[]){contrib_name(a, x)}, 1);
    tp_set_attr_int(m, op, "axis", tp_attr_int(m, o, "axis", 0));
    tp_set_attr_int(m, op, "exclusive", tp_attr_int(m, o, "exclusive", 0));
    tp_set_attr_int(m, op, "reverse", !tp_attr_int(m, o, "reverse", 0));
    give(a, x, end(a, op, NULL));
    break;
  }
  case TP_OP_Tile:
    tile_backward(a, x, dy);
    break;
  case TP_OP_Embedding: {
    TpType wt = type_of(a, x);
    if (nin > 2) { /* vocabulary-parallel: only the ids of this rank's rows */
      int op = begin(a, TP_OP_EmbeddingBackward, (int[]){dy, in[1], in[2]}, 3, (const char *[]){contrib_name(a, x)}, 1);
      copy_attrs(a, op);
      give(a, x, end(a, op, &wt));
      break;
    }
    int op = begin(a, TP_OP_GatherBackward, (int[]){dy, in[1]}, 2, (const char *[]){contrib_name(a, x)}, 1);
    copy_attrs(a, op); /* padding_idx: that row gets nothing from this lookup */
    tp_set_attr_int(m, op, "axis", 0);
    give(a, x, end(a, op, &wt));
    break;
  }
  case TP_OP_Transpose: {
    int n;
    const int64_t *perm = tp_attr_ints(m, o, "perm", &n);
    int64_t inv[TP_MAX_RANK];
    for (int i = 0; i < n; i++) inv[perm[i]] = i;
    int op = begin(a, TP_OP_Transpose, &dy, 1, (const char *[]){contrib_name(a, x)}, 1);
    tp_set_attr_ints(m, op, "perm", inv, n);
    give(a, x, end(a, op, NULL));
    break;
  }
  case TP_OP_Split: { /* Concat of the results' gradients, zeros for those without */
    int nout = m->ops[o].noutputs, parts[64];
    for (int k = 0; k < nout; k++) {
      parts[k] = dys[k];
      if (parts[k] < 0) {
        TpType t = type_of(a, out[k]);
        int zero = scalar(a, dt, 0);
        parts[k] = emit(a, TP_OP_Expand, &zero, 1, tmp_name(a, x), &t);
      }
    }
    int op = begin(a, TP_OP_Concat, parts, nout, (const char *[]){contrib_name(a, x)}, 1);
    copy_attrs(a, op);
    give(a, x, end(a, op, NULL));
    break;
  }
  case TP_OP_Concat: { /* each operand's part of dy */
    int64_t axis = tp_attr_int(m, o, "axis", 0), offset = 0;
    for (int i = 0; i < nin; i++) {
      TpType t = type_of(a, in[i]);
      if (need[i]) {
        int64_t starts[TP_MAX_RANK] = {0}, steps[TP_MAX_RANK];
        for (int k = 0; k < t.rank; k++) steps[k] = 1;
        starts[axis] = offset;
        int op = begin(a, TP_OP_Slice, &dy, 1, (const char *[]){contrib_name(a, in[i])}, 1);
        tp_set_attr_ints(m, op, "starts", starts, t.rank);
        tp_set_attr_ints(m, op, "steps", steps, t.rank);
        give(a, in[i], end(a, op, &t));
      }
      offset += t.dims[axis];
    }
    break;
  }
  case TP_OP_ReduceSum:
  case TP_OP_ReduceMean: { /* dy (divided by the count), expanded back */
    TpType xt = type_of(a, x), kept = xt;
    int n;
    const int64_t *axes = tp_attr_ints(m, o, "axes", &n);
    int64_t count = 1;
    for (int k = 0; k < n; k++) count *= xt.dims[axes[k]], kept.dims[axes[k]] = 1, kept.dimnames[axes[k]] = NULL;
    int g = dy;
    if (kind == TP_OP_ReduceMean) g = emit2(a, TP_OP_Div, g, scalar(a, dt, (double)count), tmp_name(a, x));
    if (!tp_attr_int(m, o, "keepdims", 1)) g = emit(a, TP_OP_Reshape, &g, 1, tmp_name(a, x), &kept);
    give_op(a, x, TP_OP_Expand, &g, 1, true, false);
    break;
  }
  case TP_OP_MatMul:
  case TP_OP_Linear:
  case TP_OP_RMSNorm:
  case TP_OP_SwiGLU:
  case TP_OP_GeGLU: { /* one op for every operand's gradient; the first is always computed */
    bool bias = kind == TP_OP_Linear && nin > 2 && in[2] >= 0;
    TpOpKind back = kind == TP_OP_Linear    ? TP_OP_LinearBackward
                    : kind == TP_OP_MatMul  ? TP_OP_MatMulBackward
                    : kind == TP_OP_RMSNorm ? TP_OP_RMSNormBackward
                    : kind == TP_OP_SwiGLU  ? TP_OP_SwiGLUBackward
                                            : TP_OP_GeGLUBackward;
    const char *names[3] = {need[0] ? contrib_name(a, in[0]) : tmp_name(a, in[0]),
                            need[1] ? contrib_name(a, in[1]) : NULL, bias && need[2] ? contrib_name(a, in[2]) : NULL};
    int op = begin(a, back, (int[]){dy, in[0], in[1]}, 3, names, results(names, 3));
    copy_attrs(a, op);
    end(a, op, NULL);
    for (int i = 0; i < m->ops[op].noutputs; i++)
      if (names[i] && (i > 0 || need[0])) give(a, in[i], m->ops[op].outputs[i]);
    break;
  }
  case TP_OP_Gemm:
    gemm_backward(a, in, need[0], need[1], nin > 2 && need[2], dy);
    break;
  case TP_OP_LayerNorm: {
    TpType xt = type_of(a, x);
    int64_t axis = tp_attr_int(m, o, "axis", -1), norm = tp_numel(xt.rank - (int)axis, xt.dims + axis);
    for (int i = 1; i < nin; i++)
      if (in[i] >= 0 && tp_type_numel(&m->values[in[i]].type) != norm) {
        cannot(a, "Scale and B must have the normalised shape");
        return;
      }
    layernorm_stats(a, o);
    int mean = m->ops[o].outputs[1], inv = m->ops[o].outputs[2];
    bool bias = nin > 2 && in[2] >= 0;
    const char *names[3] = {need[0] ? contrib_name(a, x) : tmp_name(a, x), need[1] ? contrib_name(a, in[1]) : NULL,
                            bias && need[2] ? contrib_name(a, in[2]) : NULL};
    int op = begin(a, TP_OP_LayerNormBackward, (int[]){dy, x, in[1], mean, inv}, 5, names, results(names, 3));
    copy_attrs(a, op);
    end(a, op, NULL);
    for (int i = 0; i < m->ops[op].noutputs; i++)
      if (names[i] && (i > 0 || need[0])) give(a, in[i], m->ops[op].outputs[i]);
    break;
  }
  case TP_OP_Attention: {
    for (int i = 4; i < nin; i++)
      if (in[i] >= 0) {
        cannot(a, "past key/value inputs are not supported");
        return;
      }
    int mask = nin > 3 ? in[3] : -1;
    if (mask >= 0 && need[3]) {
      cannot(a, "the attention mask would need a gradient (a trained mask is not supported)");
      return;
    }
    const char *names[3];
    for (int i = 0; i < 3; i++) names[i] = need[i] ? contrib_name(a, in[i]) : tmp_name(a, in[i]);
    if (in[0] == in[1] || in[0] == in[2] || in[1] == in[2]) { /* distinct contribution names */
      int v = in[0];
      for (int i = 0; i < 3; i++) names[i] = tp_strfmt(a->m, "%s.%d", need[i] ? contrib_name(a, in[i]) : tmp_name(a, v), i);
    }
    int op = begin(a, TP_OP_AttentionBackward, (int[]){dy, in[0], in[1], in[2], mask}, mask >= 0 ? 5 : 4, names, 3);
    copy_attrs(a, op);
    end(a, op, NULL);
    for (int i = 0; i < 3; i++)
      if (need[i]) give(a, in[i], m->ops[op].outputs[i]);
    break;
  }
  case TP_OP_CrossEntropy: { /* with Stats and Part: the whole derivative (ir/ops.def) */
    int op = begin(a, TP_OP_CrossEntropyBackward, (int[]){dy, in[0], in[1], nin > 2 ? in[2] : -1, nin > 3 ? in[3] : -1},
                   nin > 2 ? 5 : 3, (const char *[]){contrib_name(a, x)}, 1);
    copy_attrs(a, op);
    give(a, x, end(a, op, NULL));
    break;
  }
  case TP_OP_SoftmaxCrossEntropyLoss:
  case TP_OP_NegativeLogLikelihoodLoss:
    if (need[0]) loss_backward(a, in, dy);
    break;
  case TP_OP_Rotary:
    if (need[0]) give_op(a, x, TP_OP_RotaryBackward, (int[]){dy, in[1], in[2]}, 3, false, true);
    if (need[1] || need[2]) rotary_tables_backward(a, in, need, dy);
    break;
  case TP_OP_AllReduce: /* every rank's partial sum counts once in the sum: dX = dY */
    give_value(a, x, dy);
    break;
  case TP_OP_TensorCopy: /* each rank's dX is partial (its columns only): sum them */
    give_op(a, x, TP_OP_AllReduce, &dy, 1, false, true);
    break;
  default:
    cannot(a, NULL);
    break;
  }
}

int pass_autodiff(TpModule *m, TpDiag *d) {
  if (m->loss < 0) return tp_error(d, "no loss to differentiate: run add-loss first");
  for (int o = 0; o < m->nops; o++)
    if (m->ops[o].phase == TP_PHASE_BACKWARD) return TP_OK; /* differentiated already */
  regex_t freeze;
  if (m->freeze) {
    int err = regcomp(&freeze, m->freeze, REG_EXTENDED | REG_NOSUB);
    if (err) {
      char why[256];
      regerror(err, &freeze, why, sizeof why);
      return tp_error(d, "bad --freeze regex '%s': %s", m->freeze, why);
    }
  }
  int nv = m->nvalues, nforward = m->nops;
  Ad a = {.m = m, .d = d, .nvalues = nv};
  a.requires = calloc((size_t)nv, sizeof *a.requires);
  a.count = calloc((size_t)nv, sizeof *a.count);
  a.seen = calloc((size_t)nv, sizeof *a.seen);
  a.grad = malloc((size_t)nv * sizeof *a.grad);
  TP_ASSERT(a.requires && a.count && a.seen && a.grad);
  for (int v = 0; v < nv; v++) {
    const TpValue *val = &m->values[v];
    a.grad[v] = -1;
    a.requires[v] = val->kind == TP_VAL_PARAM && !val->dead && tp_dtype_is_float(val->type.dtype) &&
                    !(m->freeze && regexec(&freeze, val->name, 0, NULL, 0) == 0);
  }
  if (m->freeze) regfree(&freeze);

  /* forward: which values depend on a trainable param */
  for (int o = 0; o < nforward; o++) {
    const TpOp *op = &m->ops[o];
    bool any = false;
    for (int i = 0; i < op->ninputs; i++) any |= op->inputs[i] >= 0 && a.requires[op->inputs[i]];
    if (op->kind == TP_OP_CrossEntropyStats) continue; /* CrossEntropy's backward covers it */
    for (int i = 0; any && !op->dead && i < op->noutputs; i++)
      if (op->outputs[i] >= 0) a.requires[op->outputs[i]] = tp_dtype_is_float(m->values[op->outputs[i]].type.dtype);
  }
  if (!a.requires[m->loss]) {
    a.rc = tp_error(d, "the loss %%%s does not depend on any trainable parameter", m->values[m->loss].name);
    goto done;
  }
  /* backward, counting only: how many contributions each value's gradient sums */
  bool *flows = calloc((size_t)nv, sizeof *flows);
  TP_ASSERT(flows);
  flows[m->loss] = true;
  for (int o = nforward - 1; o >= 0; o--) {
    const TpOp *op = &m->ops[o];
    bool any = false;
    for (int i = 0; i < op->noutputs; i++) any |= op->outputs[i] >= 0 && flows[op->outputs[i]];
    for (int i = 0; any && !op->dead && i < op->ninputs; i++) {
      int v = op->inputs[i];
      if (v >= 0 && a.requires[v]) a.count[v]++, flows[v] = true;
    }
  }
  free(flows);

  /* backward, emitting: d loss / d loss = 1, then every op in reverse order */
  a.grad[m->loss] = new_scalar(&a, m->values[m->loss].type.dtype, 1, tp_strfmt(m, "%s.grad", m->values[m->loss].name));
  for (int o = nforward - 1; o >= 0 && a.rc == TP_OK; o--) {
    if (m->ops[o].dead) continue;
    int dys[64];
    bool any_dy = false, any_need = false;
    TP_ASSERT(m->ops[o].noutputs <= 64);
    for (int i = 0; i < m->ops[o].noutputs; i++) {
      int r = m->ops[o].outputs[i];
      dys[i] = r >= 0 ? a.grad[r] : -1;
      if (dys[i] >= 0) TP_ASSERT(r == m->loss || a.seen[r] == a.count[r]);
      any_dy |= dys[i] >= 0;
    }
    for (int i = 0; i < m->ops[o].ninputs; i++) any_need |= m->ops[o].inputs[i] >= 0 && a.requires[m->ops[o].inputs[i]];
    if (!any_dy || !any_need) continue;
    a.fwd = o;
    backward(&a, dys);
  }
  for (int v = 0; v < nv && a.rc == TP_OK; v++) {
    if (m->values[v].kind != TP_VAL_PARAM || a.grad[v] < 0) continue;
    TP_ASSERT(a.seen[v] == a.count[v]);
    tp_set_grad(m, v, a.grad[v]);
  }
done:
  free(a.requires);
  free(a.count);
  free(a.seen);
  free(a.grad);
  free(a.consts);
  return a.rc;
}
