/* Reductions: ReduceMean, ReduceSum, and the running sum CumSum.
 *
 * Each op's rule set, tp_rules_<Op> (ops/rules.h), is at the end of the file; the hooks
 * it names are above it. */
#include "axes.h"
#include "bind.h"
#include "grad.h"
#include "infer.h"

/* ---- shape rules ---- */

static int infer_cumsum(const TpInferCtx *c) {
  const TpType *x = operand(c, 0);
  if (check_axis(c, tp_attr_int(c->m, c->op, "axis", 0), x->rank, "axis")) return TP_ERR_INPUT;
  if (x->dtype == TP_BOOL) return tp_error_op(c->d, c->m, c->op, "the operand must be numeric");
  return set_result(c, 0, *x);
}

/* TopK(X) {axis, k} -> i64 indices: X's dims with k on axis (names kept off axis) */

static int infer_reduce(const TpInferCtx *c) {
  const TpType *x = operand(c, 0);
  int n;
  const int64_t *axes = tp_attr_ints(c->m, c->op, "axes", &n);
  bool keep = tp_attr_int(c->m, c->op, "keepdims", 1);
  if (n == 0) return tp_error_op(c->d, c->m, c->op, "axes must not be empty");
  TpType t = {.dtype = x->dtype};
  for (int i = 0, k = 0; i < x->rank; i++) {
    bool reduced = k < n && axes[k] == i;
    if (reduced) k++;
    if (!reduced) t.dims[t.rank] = x->dims[i], t.dimnames[t.rank++] = x->dimnames[i];
    else if (keep) t.dims[t.rank++] = 1;
  }
  for (int k = 0; k < n; k++)
    if (axes[k] < 0 || axes[k] >= x->rank || (k && axes[k] <= axes[k - 1]))
      return tp_error_op(c->d, c->m, c->op, "axes must be sorted, distinct and within rank %d", x->rank);
  return set_result(c, 0, t);
}

/* ---- gradients ---- */

/* running sums of dy in the other direction */
static void grad_cumsum(TpGradCtx *a, const TpGradOp *fwd) {
  TpModule *m = a->m;
  int o = a->fwd;
  int dy = fwd->dy, x = fwd->x;
  int op = tp_grad_begin(a, TP_OP_CumSum, &dy, 1, (const char *[]){tp_grad_contrib_name(a, x)}, 1);
  tp_set_attr_int(m, op, "axis", tp_attr_int(m, o, "axis", 0));
  tp_set_attr_int(m, op, "exclusive", tp_attr_int(m, o, "exclusive", 0));
  tp_set_attr_int(m, op, "reverse", !tp_attr_int(m, o, "reverse", 0));
  tp_grad_give(a, x, tp_grad_end(a, op, NULL));
}

/* dy (divided by the count), expanded back */
static void grad_reduce(TpGradCtx *a, const TpGradOp *fwd) {
  TpModule *m = a->m;
  int o = a->fwd;
  TpOpKind kind = a->m->ops[a->fwd].kind;
  int dy = fwd->dy, x = fwd->x;
  TpDType dt = fwd->dt;
  TpType xt = type_of(a, x), kept = xt;
  int n;
  const int64_t *axes = tp_attr_ints(m, o, "axes", &n);
  int64_t count = 1;
  for (int k = 0; k < n; k++) count *= xt.dims[axes[k]], kept.dims[axes[k]] = 1, kept.dimnames[axes[k]] = NULL;
  int g = dy;
  if (kind == TP_OP_ReduceMean)
    g = tp_grad_emit2(a, TP_OP_Div, g, tp_grad_scalar(a, dt, (double)count), tp_grad_tmp_name(a, x));
  if (!tp_attr_int(m, o, "keepdims", 1)) g = tp_grad_emit(a, TP_OP_Reshape, &g, 1, tp_grad_tmp_name(a, x), &kept);
  tp_grad_give_op(a, x, TP_OP_Expand, &g, 1, true, false);
}

/* ---- token axes ---- */

static void axes_reduce(const TpModule *m, int op, TpOpAxes *x) {
  int X = m->ops[op].inputs[0], Y = m->ops[op].outputs[0];
  int rx = value_type(m, X)->rank;
  int n, kept = 0;
  const int64_t *axes = tp_attr_ints(m, op, "axes", &n);
  bool keepdims = tp_attr_int(m, op, "keepdims", 1);
  for (int k = 0, j = 0; k < rx; k++) {
    bool reduced = j < n && axes[j] == k;
    if (reduced) j++, axes_mix(x, X, k, "reduces over");
    else axes_link(x, X, k, Y, keepdims ? k : kept);
    if (!reduced || keepdims) kept++;
  }
}

/* ---- kernel binders ---- */

static int bind_cumsum(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  b->kernel = TP_K_CUMSUM;
  b->a.cumsum = (TpCumsumArgs){&in[0], (int)tp_attr_int(m, op, "axis", 0), tp_attr_int(m, op, "exclusive", 0) != 0,
                               tp_attr_int(m, op, "reverse", 0) != 0, &out[0]};
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

/* ---- rule sets ---- */

const TpOpRules tp_rules_ReduceMean = {
    .infer = infer_reduce,
    .gradient = grad_reduce,
    .token_axes = axes_reduce,
    .bind = TP_BINDING(bind_reduce, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_ReduceSum = {
    .infer = infer_reduce,
    .gradient = grad_reduce,
    .token_axes = axes_reduce,
    .bind = TP_BINDING(bind_reduce, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_CumSum = {
    .infer = infer_cumsum,
    .gradient = grad_cumsum,
    .bind = TP_BINDING(bind_cumsum, TP_BIND_ANY, 0, 0),
};
