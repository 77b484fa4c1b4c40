/* Reductions: ReduceMean, ReduceSum, and the running sum CumSum.
 *
 * Each op's rule set, tp_rules_<Op> (ops/rules.h), is at the end of the file; the hooks
 * it names are above it. */
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

/* ---- rule sets ---- */

const TpOpRules tp_rules_ReduceMean = {.infer = infer_reduce};
const TpOpRules tp_rules_ReduceSum = {.infer = infer_reduce};
const TpOpRules tp_rules_CumSum = {.infer = infer_cumsum};
