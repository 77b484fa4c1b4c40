/* autodiff: requires m->loss (add-loss) and inferred types; provides reverse-mode
 * gradients. The backward ops are appended after the forward ops, each in the backward
 * phase at the stage and slice of the forward op it differentiates and with that op's
 * origin; m->grads[p] is d loss / d p for every trainable PARAM p the loss depends on.
 * They play its role too (TpOpRole): the gradient of a stage-boundary copy
 * (passes/assign_stages.c) is a boundary copy sent back, a Reshape on the stage the forward
 * copy reads from.
 *
 * Trainable: every float PARAM whose name does not match opt->freeze (a POSIX extended
 * regex, matched anywhere in the name). Only values that depend on a trainable param and
 * that the loss depends on get a gradient; non-float values never do. The gradient of a
 * value is named "<value>.grad"; a value used k > 1 times receives contributions
 * "<value>.grad.0" .. ".k-1", summed by Adds of which the last is "<value>.grad".
 * Temporaries are "<value>.grad.tmp[.N]", constants "ad.<dtype>.<value>". A param whose
 * gradient passes through unchanged (Add with an operand of the result's shape) shares
 * that value. LayerNorm ops whose backward needs their Mean and InvStdDev get them added.
 * A float op on the path from a param to the loss without a gradient rule (ops/,
 * TpOpRules.gradient) is an error: "cannot differentiate op X at node 'Y'". A module that
 * has backward ops already is left alone. */
#include "../ir/ir.h"
#include "../ops/grad.h"

#include <regex.h>
#include <stdlib.h>
#include <string.h>

static bool same_shape(const TpType *x, const TpType *y) {
  return x->rank == y->rank && memcmp(x->dims, y->dims, (size_t)x->rank * sizeof x->dims[0]) == 0;
}

/* The name of the next contribution to v's gradient, and of a temporary on the way. */
const char *tp_grad_contrib_name(TpGradCtx *a, int v) {
  if (a->count[v] == 1) return tp_strfmt(a->m, "%s.grad", name_of(a, v));
  return tp_strfmt(a->m, "%s.grad.%d", name_of(a, v), a->seen[v]);
}
const char *tp_grad_tmp_name(TpGradCtx *a, int v) { return tp_strfmt(a->m, "%s.grad.tmp", name_of(a, v)); }

/* A new scalar CONST named `name` (made unique). */
static int new_scalar(TpGradCtx *a, TpDType dtype, double value, const char *name) {
  uint8_t data[8];
  float f = (float)value;
  uint16_t h;
  switch (dtype) {
  case TP_F64: memcpy(data, &value, 8); break;
  case TP_F32: memcpy(data, &f, 4); break;
  case TP_F16:
    h = tp_f32_to_f16(f);
    memcpy(data, &h, 2);
    break;
  case TP_BF16:
    h = tp_f32_to_bf16(f);
    memcpy(data, &h, 2);
    break;
  default: TP_ASSERT(!"scalar: not a float dtype");
  }
  return tp_add_const(a->m, tp_unique_name(a->m, name), tp_type_make(dtype, 0, NULL), data, (TpOrigin){0});
}

/* A scalar constant used by the backward ops (one per dtype and value). */
int tp_grad_scalar(TpGradCtx *a, TpDType dtype, double value) {
  for (int i = 0; i < a->nconsts; i++)
    if (a->consts[i].dtype == dtype && a->consts[i].value == value) return a->consts[i].v;
  int v = new_scalar(a, dtype, value, tp_strfmt(a->m, "ad.%s.%.9g", tp_dtype_name(dtype), value));
  a->consts = realloc(a->consts, (size_t)(a->nconsts + 1) * sizeof *a->consts);
  TP_ASSERT(a->consts);
  a->consts[a->nconsts++] = (TpGradConst){dtype, value, v};
  return v;
}

/* ---- emitting backward ops ---- */

/* A new backward op placed like the forward op; set its attributes, then call tp_grad_end(). */
int tp_grad_begin(TpGradCtx *a, TpOpKind kind, const int *in, int nin, const char *const *names, int nout) {
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
int tp_grad_end(TpGradCtx *a, int op, const TpType *preset) {
  int r = a->m->ops[op].outputs[0];
  if (preset) a->m->values[r].type = *preset;
  if (a->rc == TP_OK && tp_infer_op(a->m, op, a->d) != TP_OK) a->rc = TP_ERR_INTERNAL;
  return r;
}

int tp_grad_emit(TpGradCtx *a, TpOpKind kind, const int *in, int nin, const char *name, const TpType *preset) {
  return tp_grad_end(a, tp_grad_begin(a, kind, in, nin, &name, 1), preset);
}

int tp_grad_emit2(TpGradCtx *a, TpOpKind kind, int x, int y, const char *name) {
  return tp_grad_emit(a, kind, (int[]){x, y}, 2, name, NULL);
}

/* Adds contribution g to v's gradient. */
void tp_grad_give(TpGradCtx *a, int v, int g) {
  a->seen[v]++;
  TP_ASSERT(a->seen[v] <= a->count[v]);
  if (a->grad[v] < 0) {
    a->grad[v] = g;
    return;
  }
  bool last = a->seen[v] == a->count[v];
  a->grad[v] = tp_grad_emit2(a, TP_OP_Add, a->grad[v], g,
                             last ? tp_strfmt(a->m, "%s.grad", name_of(a, v)) : tp_grad_tmp_name(a, v));
}

/* g summed over the axes numpy broadcasting added to v (ReduceSum, then Reshape where the
 * rank differs); the last op is named `name`. g itself if the shapes agree. */
static int unbroadcast(TpGradCtx *a, int g, int v, const char *name) {
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
    int op = tp_grad_begin(a, TP_OP_ReduceSum, &g, 1, (const char *[]){reshape ? tp_grad_tmp_name(a, v) : name}, 1);
    tp_set_attr_ints(a->m, op, "axes", axes, n);
    tp_set_attr_int(a->m, op, "keepdims", 1);
    g = tp_grad_end(a, op, NULL);
  }
  return reshape ? tp_grad_emit(a, TP_OP_Reshape, &g, 1, name, &vt) : g;
}

/* Gives v the contribution g (of the forward result's shape), reduced to v's shape. */
void tp_grad_give_value(TpGradCtx *a, int v, int g) {
  if (a->rc) return;
  TpType gt = type_of(a, g), vt = type_of(a, v);
  tp_grad_give(a, v, same_shape(&gt, &vt) ? g : unbroadcast(a, g, v, tp_grad_contrib_name(a, v)));
}

/* Gives v the contribution kind(in...), an elementwise op, reduced to v's shape. */
void tp_grad_give_elementwise(TpGradCtx *a, int v, TpOpKind kind, const int *in, int nin) {
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
  const char *name = tp_grad_contrib_name(a, v);
  int g = tp_grad_emit(a, kind, in, nin, fits ? name : tp_grad_tmp_name(a, v), NULL);
  tp_grad_give(a, v, fits ? g : unbroadcast(a, g, v, name));
}

void tp_grad_give_binary(TpGradCtx *a, int v, TpOpKind kind, int x, int y) {
  tp_grad_give_elementwise(a, v, kind, (int[]){x, y}, 2);
}
void tp_grad_give_unary(TpGradCtx *a, int v, TpOpKind kind, int x) { tp_grad_give_elementwise(a, v, kind, &x, 1); }

/* Copies the forward op's attributes that `op` (a backward op) accepts. */
void tp_grad_copy_attrs(TpGradCtx *a, int op) {
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
void tp_grad_give_op(TpGradCtx *a, int v, TpOpKind kind, const int *in, int nin, bool preset, bool copy) {
  TpType vt = type_of(a, v);
  int op = tp_grad_begin(a, kind, in, nin, (const char *[]){tp_grad_contrib_name(a, v)}, 1);
  if (copy) tp_grad_copy_attrs(a, op);
  tp_grad_give(a, v, tp_grad_end(a, op, preset ? &vt : NULL));
}

int tp_grad_cannot(TpGradCtx *a, const char *why) {
  const TpOp *f = &a->m->ops[a->fwd];
  const char *node = f->origin.node ? f->origin.node : name_of(a, f->outputs[0]);
  return a->rc = tp_error_op(a->d, a->m, a->fwd, "cannot differentiate op %s at node '%s'%s%s",
                             tp_op_info[f->kind].name, node, why ? ": " : "", why ? why : "");
}

/* The gradient of an op with one backward op computing every operand's gradient:
 * back(dY, X0, X1) -> dX0, dX1?, dB? (dB when `bias`); the first is always computed. */
void tp_grad_one_op(TpGradCtx *a, const TpGradOp *fwd, TpOpKind back, bool bias) {
  TpModule *m = a->m;
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy;
  const char *names[3] = {need[0] ? tp_grad_contrib_name(a, in[0]) : tp_grad_tmp_name(a, in[0]),
                          need[1] ? tp_grad_contrib_name(a, in[1]) : NULL,
                          bias && need[2] ? tp_grad_contrib_name(a, in[2]) : NULL};
  int op = tp_grad_begin(a, back, (int[]){dy, in[0], in[1]}, 3, names, grad_results(names, 3));
  tp_grad_copy_attrs(a, op);
  tp_grad_end(a, op, NULL);
  for (int i = 0; i < m->ops[op].noutputs; i++)
    if (names[i] && (i > 0 || need[0])) tp_grad_give(a, in[i], m->ops[op].outputs[i]);
}

/* Emits the backward of forward op a->fwd through its gradient rule (TpOpRules.gradient):
 * a contribution to every operand that requires a gradient. dy[k] is the gradient of
 * result k (-1: none). */
static void backward(TpGradCtx *a, const int *dys) {
  TpModule *m = a->m;
  int o = a->fwd;
  const TpOpRules *rules = tp_op_rules[m->ops[o].kind];
  int nin = m->ops[o].ninputs, in[64], out[64];
  TP_ASSERT(nin <= 64 && m->ops[o].noutputs <= 64);
  memcpy(in, m->ops[o].inputs, (size_t)nin * sizeof in[0]);
  memcpy(out, m->ops[o].outputs, (size_t)m->ops[o].noutputs * sizeof out[0]);
  bool need[64];
  for (int i = 0; i < nin; i++) need[i] = in[i] >= 0 && a->requires[in[i]];
  for (int k = 1; k < m->ops[o].noutputs && !rules->grads_every_result; k++)
    if (dys[k] >= 0) {
      tp_grad_cannot(a, tp_strfmt(a->m, "result %d carries a gradient", k));
      return;
    }
  if (!rules->gradient) {
    tp_grad_cannot(a, NULL);
    return;
  }
  TpGradOp g = {.in = in,
                .out = out,
                .need = need,
                .dys = dys,
                .nin = nin,
                .dy = dys[0],
                .y = out[0],
                .x = in[0],
                .dt = type_of(a, out[0]).dtype};
  rules->gradient(a, &g);
}

int pass_autodiff(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  if (m->loss < 0) return tp_error(d, "no loss to differentiate: run add-loss first");
  for (int o = 0; o < m->nops; o++)
    if (m->ops[o].phase == TP_PHASE_BACKWARD) return TP_OK; /* differentiated already */
  regex_t freeze;
  if (opt->freeze) {
    int err = regcomp(&freeze, opt->freeze, REG_EXTENDED | REG_NOSUB);
    if (err) {
      char why[256];
      regerror(err, &freeze, why, sizeof why);
      return tp_error(d, "bad --freeze regex '%s': %s", opt->freeze, why);
    }
  }
  int nv = m->nvalues, nforward = m->nops;
  TpGradCtx a = {.m = m, .d = d, .nvalues = nv};
  a.requires = calloc((size_t)nv, sizeof *a.requires);
  a.count = calloc((size_t)nv, sizeof *a.count);
  a.seen = calloc((size_t)nv, sizeof *a.seen);
  a.grad = malloc((size_t)nv * sizeof *a.grad);
  TP_ASSERT(a.requires && a.count && a.seen && a.grad);
  for (int v = 0; v < nv; v++) {
    const TpValue *val = &m->values[v];
    a.grad[v] = -1;
    a.requires[v] = val->kind == TP_VAL_PARAM && !val->dead && tp_dtype_is_float(val->type.dtype) &&
                    !(opt->freeze && regexec(&freeze, val->name, 0, NULL, 0) == 0);
  }
  if (opt->freeze) regfree(&freeze);

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
  a.grad[m->loss] = new_scalar(&a, m->values[m->loss].type.dtype, 1,
                               tp_strfmt(m, "%s.grad", m->values[m->loss].name));
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
    for (int i = 0; i < m->ops[o].ninputs; i++)
    any_need |= m->ops[o].inputs[i] >= 0 && a.requires[m->ops[o].inputs[i]];
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
