/* The registry: every op of ir/ops.def to its rule set, tp_rules_<Op> in its family file. */
#include "rules.h"

const TpOpRules *const tp_op_rules[TP_OP_COUNT] = {
#define TP_OP(name, min_in, max_in, min_out, max_out, traits) [TP_OP_##name] = &tp_rules_##name,
#include "../ir/ops.def"
};

double tp_flops_per_result(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  return o->noutputs && o->outputs[0] >= 0 ? (double)tp_type_numel(&m->values[o->outputs[0]].type) : 0;
}
