/* What a shape rule (TpOpRules.infer) works with: the op being typed, and the checks and
 * setters every family shares. ir/infer.c builds the context and calls the hook; the
 * messages here are the type errors users see, so they name the op and its types. */
#ifndef TOKPIPE_OPS_INFER_H
#define TOKPIPE_OPS_INFER_H

#include "rules.h"

struct TpInferCtx {
  TpModule *m;
  int op;
  TpDiag *d;
};

static inline const TpType *operand(const TpInferCtx *c, int i) {
  const TpOp *op = &c->m->ops[c->op];
  if (i >= op->ninputs || op->inputs[i] < 0) return NULL;
  return &c->m->values[op->inputs[i]].type;
}

static inline TpType *result(const TpInferCtx *c, int i) {
  const TpOp *op = &c->m->ops[c->op];
  if (i >= op->noutputs || op->outputs[i] < 0) return NULL;
  return &c->m->values[op->outputs[i]].type;
}

static inline const char *type_str(const TpType *t, char *buf) { return tp_type_str(t, buf, 256); }

/* Records `t` as result i, or checks it against the recorded type; names fill gaps only. */
static inline int set_result(const TpInferCtx *c, int i, TpType t) {
  TpType *r = result(c, i);
  if (!r) return TP_OK;
  if (!tp_type_size_ok(&t)) { /* sizes must stay addressable: a corrupt model must not overflow them */
    char want[256];
    return tp_error_op(c->d, c->m, c->op, "result %d would be %s: too large", i, type_str(&t, want));
  }
  if (r->dtype == TP_UNDEF) {
    *r = t;
    return TP_OK;
  }
  if (!tp_type_equal(r, &t)) {
    char have[256], want[256];
    return tp_error_op(c->d, c->m, c->op, "result %d has type %s but the op computes %s", i, type_str(r, have),
                       type_str(&t, want));
  }
  for (int k = 0; k < r->rank; k++)
    if (!r->dimnames[k]) r->dimnames[k] = t.dimnames[k];
  return TP_OK;
}

/* The result type the importer fixed beforehand (Reshape, Expand, Cast, Split, Slice). */
static inline const TpType *preset(const TpInferCtx *c, int i) {
  const TpType *r = result(c, i);
  if (r && r->dtype == TP_UNDEF) {
    tp_error_op(c->d, c->m, c->op, "result %d has no type (this op takes its type from its result)", i);
    return NULL;
  }
  return r;
}

static inline int need_float(const TpInferCtx *c, const TpType *t, const char *what) {
  if (!tp_dtype_is_float(t->dtype))
    return tp_error_op(c->d, c->m, c->op, "%s must be a floating-point tensor, not %s", what,
                       tp_dtype_name(t->dtype));
  return TP_OK;
}

static inline int same_dtype(const TpInferCtx *c, const TpType *a, const TpType *b) {
  if (a->dtype != b->dtype)
    return tp_error_op(c->d, c->m, c->op, "operand types differ: %s and %s", tp_dtype_name(a->dtype),
                       tp_dtype_name(b->dtype));
  return TP_OK;
}

static inline int check_axis(const TpInferCtx *c, int64_t axis, int rank, const char *what) {
  if (axis < 0 || axis >= rank)
    return tp_error_op(c->d, c->m, c->op, "%s %lld is out of range for rank %d", what, (long long)axis, rank);
  return TP_OK;
}

static inline int broadcast(const TpInferCtx *c, const TpType *a, const TpType *b, TpType *out) {
  if (tp_broadcast_shape(a, b, out)) return TP_OK;
  char sa[256], sb[256];
  return tp_error_op(c->d, c->m, c->op, "shapes %s and %s do not broadcast", type_str(a, sa), type_str(b, sb));
}

/* The gradient operand dY must have the type the forward op gave its result. */
static inline int check_grad(const TpInferCtx *c, const TpType *dy, const TpType *want) {
  if (tp_type_equal(dy, want)) return TP_OK;
  char sd[256], sw[256];
  return tp_error_op(c->d, c->m, c->op, "gradient %s does not match the forward result %s", type_str(dy, sd),
                     type_str(want, sw));
}

static inline int set_results_like(const TpInferCtx *c, int first, int n) { /* result i typed like operand first+i */
  for (int i = 0; i < n; i++)
    if (set_result(c, i, *operand(c, first + i))) return TP_ERR_INPUT;
  return TP_OK;
}

enum { MAX_VOCAB_PARTS = 1 << 20 }; /* as @shard's parts */

/* A vocabulary-parallel op's Part operand i (an i64 scalar: TensorRank's) and its
 * vocab_parts attribute (when `parts`: >= 1, in *parts). */
static inline int check_vocab_part(const TpInferCtx *c, int i, int64_t *parts) {
  const TpType *part = operand(c, i);
  if (part->dtype != TP_I64 || part->rank != 0)
    return tp_error_op(c->d, c->m, c->op, "Part must be an i64 scalar (the tensor rank)");
  if (!parts) return TP_OK;
  *parts = tp_attr_int(c->m, c->op, "vocab_parts", 0);
  if (*parts < 1 || *parts > MAX_VOCAB_PARTS)
    return tp_error_op(c->d, c->m, c->op, "vocab_parts must be in [1, %d] with a Part operand", MAX_VOCAB_PARTS);
  return TP_OK;
}

/* Elementwise ops' rule (ops/elementwise.c): broadcast operands of one dtype. */
int tp_infer_elementwise(const TpInferCtx *c);

#endif
