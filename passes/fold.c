/* fold-constants: requires a module with inferred types; provides a module where no op has
 * only constant operands (unless its results are too large to materialise). Evaluation uses
 * the reference interpreter, so folding and execution share each op's one implementation. */
#include "../ir/ir.h"
#include "../interp/interp.h"

#include <stdlib.h>

/* Folded results are module-owned copies; past this size an op is left to run time. */
enum { FOLD_MAX_BYTES = 64 << 20 };

int tp_fold_op(TpModule *m, int op, bool *folded, TpDiag *d) {
  const TpOp *o = &m->ops[op];
  *folded = false;
  if (o->kind == TP_OP_TensorRank) return TP_OK; /* no operands, yet a value per rank */
  size_t bytes = 0;
  for (int i = 0; i < o->ninputs; i++)
    if (o->inputs[i] >= 0 && m->values[o->inputs[i]].kind != TP_VAL_CONST) return TP_OK;
  for (int i = 0; i < o->noutputs; i++)
    if (o->outputs[i] >= 0) {
      const TpType *t = &m->values[o->outputs[i]].type;
      TP_ASSERT(t->dtype != TP_UNDEF);
      bytes += (size_t)tp_type_numel(t) * tp_dtype_size(t->dtype);
    }
  if (bytes > FOLD_MAX_BYTES) return TP_OK;

  TpTensor in[64], out[64];
  TP_ASSERT(o->ninputs <= 64 && o->noutputs <= 64);
  for (int i = 0; i < o->ninputs; i++) in[i] = o->inputs[i] >= 0 ? tp_value_tensor(m, o->inputs[i]) : (TpTensor){0};
  for (int i = 0; i < o->noutputs; i++) {
    out[i] = o->outputs[i] >= 0 ? tp_value_tensor(m, o->outputs[i]) : (TpTensor){0};
    if (o->outputs[i] >= 0) {
      out[i].data = malloc(tp_tensor_bytes(&out[i]) + 1);
      TP_ASSERT(out[i].data);
    }
  }
  int rc = tp_exec_op(m, op, in, out, d);
  for (int i = 0; i < o->noutputs; i++) {
    int r = o->outputs[i];
    if (r < 0) continue;
    if (rc != TP_OK) {
      free(out[i].data);
      continue;
    }
    TpValue *v = &m->values[r];
    v->kind = TP_VAL_CONST;
    v->def = -1;
    v->blob = tp_add_blob(m, (TpBlob){.base = out[i].data, .size = tp_tensor_bytes(&out[i]), .owned = true});
    v->offset = 0;
  }
  if (rc != TP_OK) return rc;
  m->ops[op].dead = true;
  *folded = true;
  return TP_OK;
}

int pass_fold_constants(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  (void)opt;
  for (int op = 0; op < m->nops; op++) {
    bool folded;
    int rc = tp_fold_op(m, op, &folded, d);
    if (rc != TP_OK) return rc;
  }
  tp_module_compact(m);
  return TP_OK;
}
