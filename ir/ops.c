/* The op table and attribute schema expanded from ops.def. */
#include "ir.h"

#include <string.h>

const TpOpInfo tp_op_info[TP_OP_COUNT] = {
#define TP_OP(name, min_in, max_in, min_out, max_out, traits)                                                       \
  [TP_OP_##name] = {#name, min_in, max_in, min_out, max_out, traits},
#include "ops.def"
};

const TpAttrRule tp_attr_rules[] = {
#define TP_ATTR(op, name, kind, choices) {TP_OP_##op, #name, TP_ATTR_##kind, choices},
#include "ops.def"
    {TP_OP_COUNT, NULL, 0, NULL},
};

TpOpKind tp_op_from_name(const char *name) {
  for (int k = 0; k < TP_OP_COUNT; k++)
    if (strcmp(tp_op_info[k].name, name) == 0) return (TpOpKind)k;
  return TP_OP_COUNT;
}
