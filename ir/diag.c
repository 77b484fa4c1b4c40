/* Diagnostics at a node of the model or an op of the IR (the rest is base/diag.c). */
#include "ir.h"

static int error_at(TpDiag *d, TpOrigin at, int opset, const char *fmt, va_list ap) {
  char prefix[256];
  snprintf(prefix, sizeof prefix, "node '%s' (%s, opset %d): ", at.node ? at.node : "?",
           at.op_type ? at.op_type : "?", opset);
  return tp_verror(d, TP_ERR_INPUT, prefix, fmt, ap);
}

int tp_error_at(TpDiag *d, TpOrigin at, int opset, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = error_at(d, at, opset, fmt, ap);
  va_end(ap);
  return rc;
}

int tp_error_op(TpDiag *d, const TpModule *m, int op, const char *fmt, ...) {
  TpOrigin at = m->ops[op].origin;
  if (!at.op_type) at.op_type = tp_op_info[m->ops[op].kind].name;
  if (!at.node && m->ops[op].noutputs > 0 && m->ops[op].outputs[0] >= 0)
    at.node = m->values[m->ops[op].outputs[0]].name;
  va_list ap;
  va_start(ap, fmt);
  int rc = error_at(d, at, m->opset, fmt, ap);
  va_end(ap);
  return rc;
}
