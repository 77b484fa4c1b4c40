/* What a kernel binder (TpOpRules.bind) works with: bind/bind.h's bound-kernel struct and
 * kernel table, and the checks binders share. A binder reads attributes, dims and dtypes,
 * never tensor data (codegen has none), and checks that the shapes fit the kernel. */
#ifndef TOKPIPE_OPS_BIND_H
#define TOKPIPE_OPS_BIND_H

#include "../bind/bind.h"
#include "rules.h"

#include <string.h>

/* An op's TpOpBinding: binder, dtypes (TpBindDtypes), the operands the dtype rule skips (a
 * bit each) and the ids operand (+1; 0: none). The training kernels take f32 only. */
#define TP_BINDING(fn, dtypes, not_float, ids) (&(const TpOpBinding){(fn), (dtypes), (not_float), (ids)})
#define TP_TRAINING_BINDING(fn) TP_BINDING(fn, TP_BIND_F32, 0, 0)

static inline const char *dtype_name(TpDType t) {
  const char *s = tp_dtype_name(t);
  return s ? s : "?";
}

static inline bool present_in(const TpModule *m, int op, int i) {
  return i < m->ops[op].ninputs && m->ops[op].inputs[i] >= 0;
}

static inline bool present_out(const TpModule *m, int op, int i) {
  return i < m->ops[op].noutputs && m->ops[op].outputs[i] >= 0;
}

/* Operand i's view, or NULL when the op has none there. */
static inline const TpTensor *opt_in(const TpModule *m, int op, const TpTensor *in, int i) {
  return present_in(m, op, i) ? &in[i] : NULL;
}

static inline TpTensor *opt_out(const TpModule *m, int op, TpTensor *out, int i) {
  return present_out(m, op, i) ? &out[i] : NULL;
}

static inline int64_t numel_from(const TpTensor *t, int from, int to) { return tp_numel(to - from, t->dims + from); }

static inline int64_t last_dim(const TpTensor *t) { return t->rank ? t->dims[t->rank - 1] : 1; }

static inline int shape_error(const TpModule *m, int op, TpDiag *d) {
  return tp_error_op(d, m, op, "CPU kernel: operand and result shapes do not fit");
}

/* An optional result's size, when present, is n. */
static inline bool out_numel(const TpModule *m, int op, const TpTensor *out, int i, int64_t n) {
  return !present_out(m, op, i) || tp_tensor_numel(&out[i]) == n;
}

/* The gelu variant of an `approximate` attribute. */
static inline int gelu_tanh(const TpModule *m, int op, bool *tanh_approx, TpDiag *d) {
  const char *approx = tp_attr_string(m, op, "approximate", "none");
  *tanh_approx = strcmp(approx, "tanh") == 0;
  if (*tanh_approx || strcmp(approx, "none") == 0) return TP_OK;
  return tp_error_op(d, m, op, "unknown approximate '%s' (expected none or tanh)", approx);
}
/* Binders several families use: unary elementwise kernels (ops/elementwise.c), a copy or
 * broadcast (Cast, Reshape, Expand, Tile: ops/layout.c), a vocabulary-parallel range
 * (ops/index.c). */
int tp_bind_unary(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d);
int tp_bind_copy(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d);
int tp_bind_vocab(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d);

#endif
