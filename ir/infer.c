/* Type inference: result dtypes, shapes and symbolic dim names of every op, from its
 * operands and canonical attributes (ir/ops.def). The same code checks a module's recorded
 * types (the verifier) and fills them in while the importer builds one. This file is the
 * driver: it checks the op's arity and calls the op's shape rule, TpOpRules.infer, which
 * sits with the op's other hooks in its family file under ops/. */
#include "ir.h"

#include "../ops/infer.h"

bool tp_broadcast_shape(const TpType *a, const TpType *b, TpType *out) {
  int rank = a->rank > b->rank ? a->rank : b->rank;
  TpType t = {.dtype = a->dtype, .rank = rank};
  for (int i = 0; i < rank; i++) {
    int ia = i - (rank - a->rank), ib = i - (rank - b->rank);
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    const char *na = ia >= 0 ? a->dimnames[ia] : NULL, *nb = ib >= 0 ? b->dimnames[ib] : NULL;
    if (da != db && da != 1 && db != 1) return false;
    t.dims[i] = da == 1 ? db : da;
    /* a name belongs to an operand dim that is not broadcast */
    t.dimnames[i] = (na && da == t.dims[i]) ? na : (nb && db == t.dims[i]) ? nb : NULL;
  }
  *out = t;
  return true;
}

int tp_infer_op(TpModule *m, int op, TpDiag *d) {
  TpInferCtx c = {m, op, d};
  const TpOp *o = &m->ops[op];
  const TpOpInfo *info = &tp_op_info[o->kind];
  if (o->ninputs < info->min_inputs || o->ninputs > info->max_inputs || o->noutputs < info->min_outputs ||
      o->noutputs > info->max_outputs)
    return tp_error_op(d, m, op, "%d operands and %d results; %s takes %d-%d and %d-%d", o->ninputs, o->noutputs,
                       info->name, info->min_inputs, info->max_inputs, info->min_outputs, info->max_outputs);
  for (int i = 0; i < info->min_inputs; i++)
    if (o->inputs[i] < 0) return tp_error_op(d, m, op, "required operand %d is absent", i);
  if (info->min_outputs > 0 && o->outputs[0] < 0) return tp_error_op(d, m, op, "the first result must be present");

  const TpOpRules *rules = tp_op_rules[o->kind];
  TP_ASSERT(rules && rules->infer);
  return rules->infer(&c);
}
