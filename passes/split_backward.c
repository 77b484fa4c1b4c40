/* split-backward: requires a trained module after the training pipeline (autodiff, stages,
 * recompute, store-bf16/fp16 when asked); provides each backward op marked as part of the
 * backward-input or the backward-weight half of its unit (TpOp.weight, printed `@weight`),
 * for schedules that run them apart (zero-bubble: the input half is what the previous
 * stage and the earlier slices wait for; the weight half may run later, in an idle slot).
 *
 * A backward op is in the weight half when everything it makes only feeds parameter
 * gradients: each of its results is a parameter's gradient, or read only by weight-half
 * ops (the greatest such set, found by a worklist from the readers that must stay in the
 * input half: the ops of the forward, boundary copies, tensor all-reduces, the graph's
 * outputs). A product or norm backward that makes both kinds of result (LinearBackward's
 * dX and its dW, dB) is split into two ops of the same kind, attributes and placement:
 * one with the input gradients, one with the parameter gradients; each computes its
 * results with the same kernel calls as the fused op did (a kernel computes each result
 * apart), and every sum keeps its operands and order, so gradients keep their bits.
 * Every parameter gradient ends up made in the weight half: the runtime zeroes and sums the
 * gradient buffers around a microbatch's weight units.
 *
 * Under 16-bit storage (store-bf16/fp16, which run before) every reader reads a stored
 * value through its own widening Cast to f32, and a split op keeps the fused op's
 * operands: its weight part would read the f32 copies the input part's Casts made (of the
 * weight, of the activation), alive from the input part to the weight part, which may run
 * after later slices' input parts. So where a weight-half op reads an f32 value made by a
 * widening Cast (16-bit to f32) outside the weight half, the Cast is cloned into the weight
 * half (tp_add_cast, named as store-bf16 names its casts; the reader's unit, which is the
 * Cast's; placed just before its first weight-half reader, as recompute places its copies)
 * and the weight-half readers read the clone. A Cast is exact: the kernels see the same
 * bits, and what lives until the weight part is the 16-bit value, half the bytes.
 * Running it again changes nothing. */
#include "../ir/ir.h"

#include <stdlib.h>

static bool splittable(TpOpKind k) {
  return k == TP_OP_LinearBackward || k == TP_OP_MatMulBackward || k == TP_OP_LayerNormBackward ||
         k == TP_OP_RMSNormBackward;
}

/* May op be in the weight half at all? */
static bool eligible(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  return !o->dead && o->phase == TP_PHASE_BACKWARD && o->kind != TP_OP_AllReduce && !tp_is_boundary_op(m, op);
}

typedef struct {
  bool *weight; /* [nops]: in the weight half */
  bool *mixed;  /* [nops]: a splittable op with results of both halves (its weight part) */
  bool *grad;   /* [nvalues]: a parameter's gradient */
  int *held;    /* [nvalues]: readers of the value outside the weight half */
  int *work, nwork;
} Classes;

/* Is value v made only for parameter gradients, as far as its readers go? */
static bool feeds_weights(const TpModule *m, const Classes *c, int v) {
  return c->grad[v] || (c->held[v] == 0 && v != m->loss && !tp_is_output(m, v));
}

/* Op's operands gain a reader outside the weight half. */
static void hold_operands(const TpModule *m, Classes *c, int op) {
  const TpOp *o = &m->ops[op];
  for (int i = 0; i < o->ninputs; i++) {
    int v = o->inputs[i];
    if (v < 0 || c->held[v]++ || m->values[v].kind != TP_VAL_RESULT) continue;
    int def = m->values[v].def;
    if (c->weight[def]) c->work[c->nwork++] = def;
  }
}

/* Takes op out of the weight half. */
static void demote(const TpModule *m, Classes *c, int op) {
  c->weight[op] = false;
  hold_operands(m, c, op);
}

/* Fills c->weight: the greatest set of eligible ops whose results all feed weights, and
 * c->mixed: the splittable ops with both kinds of result (in it: they will be split, their
 * operands read by the input part). */
static void classify(const TpModule *m, Classes *c) {
  for (int v = 0; v < m->nvalues; v++) c->held[v] = 0;
  for (int op = 0; op < m->nops; op++) c->weight[op] = eligible(m, op), c->mixed[op] = false;
  for (int op = 0; op < m->nops; op++)
    if (!c->weight[op] && !m->ops[op].dead) {
      c->weight[op] = true; /* so that demote counts its operands */
      demote(m, c, op);
    }
  for (int op = m->nops - 1; op >= 0; op--)
    if (c->weight[op]) c->work[c->nwork++] = op;
  while (c->nwork > 0) {
    int op = c->work[--c->nwork];
    if (!c->weight[op]) continue;
    const TpOp *o = &m->ops[op];
    bool feeds = false, held = false;
    for (int k = 0; k < o->noutputs; k++)
      if (o->outputs[k] >= 0) {
        if (feeds_weights(m, c, o->outputs[k])) feeds = true;
        else held = true;
      }
    if (held && !(splittable(o->kind) && feeds)) demote(m, c, op);
    else if (held && !c->mixed[op]) { /* its input part will read all its operands */ c->mixed[op] = true;
      hold_operands(m, c, op);
    }
  }
}

/* Splits op (in the weight half, some results held outside it) into a new op making the
 * held results and op keeping the others. The new op is appended; the caller re-sorts. */
static void split_op(TpModule *m, const Classes *c, int op) {
  int n = m->ops[op].noutputs, ninputs = m->ops[op].ninputs;
  const char **none = tp_alloc(m, sizeof *none * (size_t)n);
  int input = tp_add_op(m, m->ops[op].kind, m->ops[op].inputs, ninputs, none, n, m->ops[op].origin);
  tp_copy_attrs(m, op, input);
  TpOp *o = &m->ops[op], *in = &m->ops[input];
  in->stage = o->stage, in->slice = o->slice, in->phase = o->phase, in->role = o->role;
  for (int k = 0; k < n; k++) {
    int v = o->outputs[k];
    if (v < 0 || feeds_weights(m, c, v)) continue;
    in->outputs[k] = v;
    m->values[v].def = input;
    o->outputs[k] = -1;
  }
}

/* Is op a Cast widening a 16-bit value to f32? */
static bool widens(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  if (o->kind != TP_OP_Cast || o->inputs[0] < 0 || o->outputs[0] < 0) return false;
  TpDType from = m->values[o->inputs[0]].type.dtype, to = m->values[o->outputs[0]].type.dtype;
  return (from == TP_BF16 || from == TP_F16) && to == TP_F32;
}

/* Gives the weight half its own widening Casts (m->ops[].weight set): each weight-half
 * reader of a widening Cast outside the weight half reads instead a clone of the Cast, one
 * per Cast, @weight. The clones are appended; returns how many (the caller re-sorts). */
static int own_widenings(TpModule *m) {
  int nops = m->nops, nvalues = m->nvalues, made = 0;
  int *clone = malloc(sizeof(int) * ((size_t)nvalues + 1)); /* per Cast result: its clone */
  TP_ASSERT(clone);
  for (int v = 0; v < nvalues; v++) clone[v] = -1;
  for (int op = 0; op < nops; op++) {
    if (!m->ops[op].weight || m->ops[op].dead) continue;
    for (int i = 0; i < m->ops[op].ninputs; i++) {
      int v = m->ops[op].inputs[i];
      if (v < 0 || m->values[v].kind != TP_VAL_RESULT) continue;
      int def = m->values[v].def;
      if (m->ops[def].weight || !widens(m, def)) continue;
      if (clone[v] < 0) {
        int c = tp_add_cast(m, m->ops[def].inputs[0], TP_F32, op, "f32");
        m->ops[c].weight = true;
        clone[v] = m->ops[c].outputs[0];
        made++;
      }
      m->ops[op].inputs[i] = clone[v];
    }
  }
  free(clone);
  return made;
}

int pass_split_backward(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  (void)opt;
  if (m->loss < 0 || !m->grads) return tp_error(d, "split-backward: the module has no backward (run autodiff)");
  int cap = 2 * m->nops + 1;
  Classes c = {.weight = calloc((size_t)cap, sizeof(bool)),
               .mixed = calloc((size_t)cap, sizeof(bool)),
               .grad = calloc((size_t)m->nvalues + 1, sizeof(bool)),
               .held = calloc((size_t)m->nvalues + 1, sizeof(int)),
               .work = malloc(sizeof(int) * (size_t)(cap + 2 * m->nvalues + 1))};
  TP_ASSERT(c.weight && c.mixed && c.grad && c.held && c.work);
  for (int v = 0; v < m->ngrads; v++)
    if (m->grads[v] >= 0) c.grad[m->grads[v]] = true;
  classify(m, &c);
  int nops = m->nops, split = 0;
  for (int op = 0; op < nops; op++) {
    if (c.mixed[op] && c.weight[op]) split_op(m, &c, op), split++;
  }
  if (split) tp_sort_ops(m);
  classify(m, &c); /* the split ops' halves (the order changed) */
  int rc = TP_OK;
  for (int op = 0; op < m->nops; op++) {
    m->ops[op].weight = c.weight[op];
    for (int k = 0; k < m->ops[op].noutputs && rc == TP_OK; k++) {
      int v = m->ops[op].outputs[k];
      if (v >= 0 && c.grad[v] && !c.weight[op])
        rc =
            tp_internal(d,
                        "split-backward: the parameter gradient %%%s is made by %s '%s', which the input half needs",
                        m->values[v].name, tp_op_info[m->ops[op].kind].name,
                        m->ops[op].origin.node ? m->ops[op].origin.node : "?");
    }
  }
  free(c.weight), free(c.mixed), free(c.grad), free(c.held), free(c.work);
  if (rc == TP_OK && own_widenings(m)) tp_sort_ops(m); /* each clone before its first reader */
  return rc;
}
