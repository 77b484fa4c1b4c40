/* dce: requires nothing; provides a module without ops whose results nothing reads (graph
 * outputs, the loss and the gradients are read) and without parameters or constants nothing
 * reads. Graph inputs stay (they are the interface). */
#include "../ir/ir.h"

#include <stdlib.h>

int pass_dce(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  (void)opt, (void)d;
  bool *live = calloc((size_t)m->nvalues + 1, sizeof *live);
  TP_ASSERT(live);
  for (int i = 0; i < m->noutputs; i++) live[m->outputs[i]] = true;
  if (m->loss >= 0) live[m->loss] = true; /* training keeps the loss and every gradient */
  for (int v = 0; v < m->ngrads; v++)
    if (m->grads[v] >= 0) live[m->grads[v]] = live[v] = true;
  for (int op = m->nops - 1; op >= 0; op--) { /* ops are in topological order */
    TpOp *o = &m->ops[op];
    if (o->dead) continue; /* already folded away */
    bool used = false;
    for (int i = 0; i < o->noutputs; i++) used |= o->outputs[i] >= 0 && live[o->outputs[i]];
    o->dead = !used;
    if (used)
      for (int i = 0; i < o->ninputs; i++)
        if (o->inputs[i] >= 0) live[o->inputs[i]] = true;
  }
  for (int v = 0; v < m->nvalues; v++) {
    TpValue *val = &m->values[v];
    if (val->kind == TP_VAL_PARAM || val->kind == TP_VAL_CONST) val->dead = !live[v];
  }
  free(live);
  tp_module_compact(m);
  return TP_OK;
}
