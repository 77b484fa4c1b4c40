/* What a gradient rule (TpOpRules.gradient) works with: the autodiff pass's state
 * (passes/autodiff.c, which walks the forward ops in reverse and calls the rules) and the
 * helpers that emit backward ops and hand contributions to operands' gradients. Every
 * backward op is placed like the forward op it differentiates (stage, slice, origin). */
#ifndef TOKPIPE_OPS_GRAD_H
#define TOKPIPE_OPS_GRAD_H

#include "rules.h"

typedef struct {
  TpDType dtype;
  double value;
  int v;
} TpGradConst;

struct TpGradCtx {
  TpModule *m;
  TpDiag *d;
  int rc;         /* sticky: the first failure */
  int fwd;        /* the forward op being differentiated: stage, slice and origin of new ops */
  int nvalues;    /* values of the forward program (the arrays below have this many) */
  bool *requires; /* depends on a trainable param (float values only) */
  int *count;     /* gradient contributions the value will receive */
  int *seen;      /* contributions received so far */
  int *grad;      /* the sum of the contributions so far, -1 before the first */
  TpGradConst *consts;
  int nconsts;
};

/* The forward op a gradient rule differentiates: its operands and results, which operands
 * need a gradient, and the gradient of each result (dys[k], -1: none); dy, y and x are
 * dys[0], out[0] and in[0], dt the first result's dtype. */
struct TpGradOp {
  const int *in, *out;
  const bool *need;
  const int *dys;
  int nin;
  int dy, y, x;
  TpDType dt;
};

static inline TpType type_of(const TpGradCtx *a, int v) { return a->m->values[v].type; }
static inline const char *name_of(const TpGradCtx *a, int v) { return a->m->values[v].name; }

/* The result count that leaves out absent (NULL-named) trailing results. */
static inline int grad_results(const char *const *names, int n) {
  while (n > 1 && !names[n - 1]) n--;
  return n;
}

/* The name of the next contribution to v's gradient, and of a temporary on the way. */
const char *tp_grad_contrib_name(TpGradCtx *a, int v);
const char *tp_grad_tmp_name(TpGradCtx *a, int v);
/* A scalar constant used by the backward ops (one per dtype and value). */
int tp_grad_scalar(TpGradCtx *a, TpDType dtype, double value);

/* A new backward op placed like the forward op; set its attributes, then call
 * tp_grad_end(), which types it (result 0 `preset` for the ops that take their type from
 * it) and returns result 0. */
int tp_grad_begin(TpGradCtx *a, TpOpKind kind, const int *in, int nin, const char *const *names, int nout);
int tp_grad_end(TpGradCtx *a, int op, const TpType *preset);
/* begin + end of a one-result op; emit2 of a binary one */
int tp_grad_emit(TpGradCtx *a, TpOpKind kind, const int *in, int nin, const char *name, const TpType *preset);
int tp_grad_emit2(TpGradCtx *a, TpOpKind kind, int x, int y, const char *name);
/* Copies the forward op's attributes that `op` (a backward op) accepts. */
void tp_grad_copy_attrs(TpGradCtx *a, int op);

/* Adds contribution g to v's gradient. */
void tp_grad_give(TpGradCtx *a, int v, int g);
/* Gives v the contribution g (of the forward result's shape), reduced to v's shape. */
void tp_grad_give_value(TpGradCtx *a, int v, int g);
/* Gives v the contribution kind(in...), an elementwise op, reduced to v's shape. */
void tp_grad_give_elementwise(TpGradCtx *a, int v, TpOpKind kind, const int *in, int nin);
void tp_grad_give_binary(TpGradCtx *a, int v, TpOpKind kind, int x, int y);
void tp_grad_give_unary(TpGradCtx *a, int v, TpOpKind kind, int x);
/* Gives v the result of a one-result op whose result has v's type: taken from v for the
 * ops that read it from their result (`preset`), attributes copied from the forward op
 * (`copy`). */
void tp_grad_give_op(TpGradCtx *a, int v, TpOpKind kind, const int *in, int nin, bool preset, bool copy);
/* The gradient of an op with one backward op computing every operand's gradient:
 * back(dY, X0, X1) -> dX0, dX1?, dB? (dB when `bias`). */
void tp_grad_one_op(TpGradCtx *a, const TpGradOp *fwd, TpOpKind back, bool bias);

/* Fails the pass: "cannot differentiate op X at node 'Y'[: why]". */
int tp_grad_cannot(TpGradCtx *a, const char *why);

#endif
