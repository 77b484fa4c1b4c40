/* Queries the pattern matchers of raise-transformer (passes/raise_transformer.c) and the
 * causal-mask prover (passes/causal_mask.c) share: who defines or reads a value, operands
 * and types, and constant scalars. */
#ifndef TOKPIPE_PASSES_MATCH_H
#define TOKPIPE_PASSES_MATCH_H

#include "../ir/ir.h"

/* The live op of `kind` that defines v, or -1. */
static inline int def_of(const TpModule *m, int v, TpOpKind kind) {
  if (v < 0 || m->values[v].kind != TP_VAL_RESULT) return -1;
  int o = m->values[v].def;
  return o >= 0 && !m->ops[o].dead && m->ops[o].kind == kind ? o : -1;
}

/* The first live op of `kind` that reads v (as operand `slot`, or any when slot < 0). */
static inline int user_of(const TpModule *m, int v, TpOpKind kind, int slot) {
  for (int o = 0; o < m->nops; o++) {
    const TpOp *op = &m->ops[o];
    if (op->dead || op->kind != kind) continue;
    for (int i = 0; i < op->ninputs; i++)
      if (op->inputs[i] == v && (slot < 0 || slot == i)) return o;
  }
  return -1;
}

static inline int in(const TpModule *m, int o, int i) { return m->ops[o].inputs[i]; }
static inline int out(const TpModule *m, int o) { return m->ops[o].outputs[0]; }
static inline const TpType *type(const TpModule *m, int v) { return &m->values[v].type; }

/* The other operand of binary op o, given one of them; -1 if `one` is not an operand. */
static inline int other(const TpModule *m, int o, int one) {
  if (in(m, o, 0) == one) return in(m, o, 1);
  if (in(m, o, 1) == one) return in(m, o, 0);
  return -1;
}

/* v is constant data holding one floating-point number (any rank); *x gets it. */
static inline bool scalar(const TpModule *m, int v, double *x) {
  if (v < 0) return false;
  const TpValue *val = &m->values[v];
  if ((val->kind != TP_VAL_CONST && val->kind != TP_VAL_PARAM) || !tp_dtype_is_float(val->type.dtype) ||
      tp_type_numel(&val->type) != 1)
    return false;
  TpTensor t = tp_value_tensor(m, v);
  *x = tp_tensor_get_f64(&t, 0);
  return true;
}

static inline bool scalar_is(const TpModule *m, int v, double want) {
  double x;
  return scalar(m, v, &x) && x == want;
}

static inline bool is_float(const TpModule *m, int v) { return v >= 0 && tp_dtype_is_float(type(m, v)->dtype); }

#endif
