/* Indexing ops: Gather, GatherElements, TopK, the raised Embedding, and their
 * backward ops.
 *
 * Each op's rule set, tp_rules_<Op> (ops/rules.h), is at the end of the file; the hooks
 * it names are above it. */
#include "axes.h"
#include "bind.h"
#include "grad.h"
#include "infer.h"
#include "split.h"

/* ---- shape rules ---- */

static int gather_type(const TpInferCtx *c, const TpType *data, const TpType *idx, int64_t axis, TpType *t) {
  if (check_axis(c, axis, data->rank, "axis")) return TP_ERR_INPUT;
  if (idx->dtype != TP_I64 && idx->dtype != TP_I32)
    return tp_error_op(c->d, c->m, c->op, "indices must be i32 or i64");
  if (data->rank - 1 + idx->rank > TP_MAX_RANK)
    return tp_error_op(c->d, c->m, c->op, "result rank exceeds %d", TP_MAX_RANK);
  int64_t rows = data->dims[axis], pad = tp_attr_int(c->m, c->op, "padding_idx", 0);
  if (pad < 0 || (pad >= rows && rows >= 0))
    return tp_error_op(c->d, c->m, c->op, "padding_idx %lld is not a row of the %lld along axis %lld",
                       (long long)pad, (long long)rows, (long long)axis);
  *t = (TpType){.dtype = data->dtype};
  for (int i = 0; i < axis; i++, t->rank++)
    t->dims[t->rank] = data->dims[i], t->dimnames[t->rank] = data->dimnames[i];
  for (int i = 0; i < idx->rank; i++, t->rank++)
    t->dims[t->rank] = idx->dims[i], t->dimnames[t->rank] = idx->dimnames[i];
  for (int i = (int)axis + 1; i < data->rank; i++, t->rank++)
    t->dims[t->rank] = data->dims[i], t->dimnames[t->rank] = data->dimnames[i];
  return TP_OK;
}

static int infer_gather(const TpInferCtx *c) {
  TpType t;
  return gather_type(c, operand(c, 0), operand(c, 1), tp_attr_int(c->m, c->op, "axis", 0), &t) || set_result(c, 0, t)
             ? TP_ERR_INPUT
             : TP_OK;
}

/* GatherElements(data, idx) {axis}: the result (and a gradient) has idx's dims */
static int gather_elements_type(const TpInferCtx *c, const TpType *data, const TpType *idx, int64_t axis,
                                TpType *t) {
  if (check_axis(c, axis, data->rank, "axis")) return TP_ERR_INPUT;
  if (idx->dtype != TP_I64 && idx->dtype != TP_I32)
    return tp_error_op(c->d, c->m, c->op, "indices must be i32 or i64");
  char sd[256], si[256];
  if (idx->rank != data->rank)
    return tp_error_op(c->d, c->m, c->op, "indices %s must have the rank of data %s", type_str(idx, si),
                       type_str(data, sd));
  for (int i = 0; i < idx->rank; i++)
    if (i != axis && idx->dims[i] > data->dims[i])
      return tp_error_op(c->d, c->m, c->op, "indices %s exceed data %s outside axis %lld", type_str(idx, si),
                         type_str(data, sd), (long long)axis);
  *t = *idx;
  t->dtype = data->dtype;
  for (int i = 0; i < t->rank; i++)
    t->dimnames[i] = i != axis && idx->dims[i] == data->dims[i] ? data->dimnames[i] : NULL;
  return TP_OK;
}

static int infer_gather_elements(const TpInferCtx *c) {
  TpType t;
  return gather_elements_type(c, operand(c, 0), operand(c, 1), tp_attr_int(c->m, c->op, "axis", 0), &t) ||
                 set_result(c, 0, t)
             ? TP_ERR_INPUT
             : TP_OK;
}

static int infer_topk(const TpInferCtx *c) {
  const TpType *x = operand(c, 0);
  int64_t axis = tp_attr_int(c->m, c->op, "axis", 0), k = tp_attr_int(c->m, c->op, "k", 0);
  if (check_axis(c, axis, x->rank, "axis")) return TP_ERR_INPUT;
  if (x->dtype == TP_BOOL) return tp_error_op(c->d, c->m, c->op, "the operand must be numeric");
  if (k < 1 || k > x->dims[axis])
    return tp_error_op(c->d, c->m, c->op, "k %lld is out of range for %lld entries on axis %lld", (long long)k,
                       (long long)x->dims[axis], (long long)axis);
  TpType t = *x;
  t.dtype = TP_I64;
  t.dims[axis] = k;
  t.dimnames[axis] = NULL;
  return set_result(c, 0, t);
}

static int infer_embedding(const TpInferCtx *c) {
  const TpType *w = operand(c, 0);
  if (w->rank != 2) return tp_error_op(c->d, c->m, c->op, "the table must be [V, C]");
  int64_t parts = 0; /* set by check_vocab_part */
  if (operand(c, 2) ? check_vocab_part(c, 2, &parts) : tp_get_attr(c->m, c->op, "vocab_parts") != NULL)
    return operand(c, 2) ? TP_ERR_INPUT : tp_error_op(c->d, c->m, c->op, "vocab_parts needs a Part operand");
  if (operand(c, 2) && tp_get_attr(c->m, c->op, "padding_idx")) /* the range kernels skip no row */
    return tp_error_op(c->d, c->m, c->op,
                       "a vocabulary-split embedding has no padding_idx (shard-tensor keeps one whole)");
  TpType t;
  return gather_type(c, w, operand(c, 1), 0, &t) || set_result(c, 0, t) ? TP_ERR_INPUT : TP_OK;
}

static int infer_embedding_backward(const TpInferCtx *c) {
  const TpType *w = preset(c, 0);
  int64_t parts = 0; /* set by check_vocab_part */
  TpType y;
  if (!w || check_vocab_part(c, 2, &parts)) return TP_ERR_INPUT;
  if (w->rank != 2) return tp_error_op(c->d, c->m, c->op, "the table must be [V, C]");
  if (gather_type(c, w, operand(c, 1), 0, &y)) return TP_ERR_INPUT;
  return check_grad(c, operand(c, 0), &y);
}

static int infer_gather_backward(const TpInferCtx *c) {
  const TpType *data = preset(c, 0);
  TpType y;
  if (!data) return TP_ERR_INPUT;
  if (gather_type(c, data, operand(c, 1), tp_attr_int(c->m, c->op, "axis", 0), &y)) return TP_ERR_INPUT;
  return check_grad(c, operand(c, 0), &y);
}

static int infer_gather_elements_backward(const TpInferCtx *c) {
  const TpType *data = preset(c, 0);
  TpType y;
  if (!data) return TP_ERR_INPUT;
  if (gather_elements_type(c, data, operand(c, 1), tp_attr_int(c->m, c->op, "axis", 0), &y)) return TP_ERR_INPUT;
  return check_grad(c, operand(c, 0), &y);
}

/* ---- gradients ---- */

/* copies axis and padding_idx */
static void grad_gather(TpGradCtx *a, const TpGradOp *fwd) {
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy, x = fwd->x;
  if (need[0]) tp_grad_give_op(a, x, TP_OP_GatherBackward, (int[]){dy, in[1]}, 2, true, true);
}

static void grad_gather_elements(TpGradCtx *a, const TpGradOp *fwd) {
  const int *in = fwd->in;
  const bool *need = fwd->need;
  int dy = fwd->dy, x = fwd->x;
  if (need[0]) tp_grad_give_op(a, x, TP_OP_GatherElementsBackward, (int[]){dy, in[1]}, 2, true, true);
}

static void grad_embedding(TpGradCtx *a, const TpGradOp *fwd) {
  TpModule *m = a->m;
  int nin = fwd->nin;
  const int *in = fwd->in;
  int dy = fwd->dy, x = fwd->x;
  TpType wt = type_of(a, x);
  if (nin > 2) { /* vocabulary-parallel: only the ids of this rank's rows */
    int op = tp_grad_begin(a, TP_OP_EmbeddingBackward, (int[]){dy, in[1], in[2]}, 3,
                           (const char *[]){tp_grad_contrib_name(a, x)}, 1);
    tp_grad_copy_attrs(a, op);
    tp_grad_give(a, x, tp_grad_end(a, op, &wt));
    return;
  }
  int op = tp_grad_begin(a, TP_OP_GatherBackward, (int[]){dy, in[1]}, 2,
                         (const char *[]){tp_grad_contrib_name(a, x)}, 1);
  tp_grad_copy_attrs(a, op); /* padding_idx: that row gets nothing from this lookup */
  tp_set_attr_int(m, op, "axis", 0);
  tp_grad_give(a, x, tp_grad_end(a, op, &wt));
}

/* ---- token axes ---- */

/* Embedding(W, Ids) -> [Ids..., C] */
static void axes_embedding(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = o->inputs[0], Y = o->outputs[0];
  axes_all(m, x, o->inputs[1], Y);
  axes_mix(x, X, 0, "gathers along");
}

/* data[:a] ++ indices ++ data[a+1:] */
static void axes_gather(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = o->inputs[0], Y = o->outputs[0];
  int rx = value_type(m, X)->rank;
  int a = (int)tp_attr_int(m, op, "axis", 0), idx = o->inputs[1], ri = value_type(m, idx)->rank;
  for (int k = 0; k < rx; k++)
    if (k != a) axes_link(x, X, k, Y, k < a ? k : k - 1 + ri);
  for (int k = 0; k < ri; k++) axes_link(x, idx, k, Y, a + k);
  axes_mix(x, X, a, "gathers along");
}

/* the k largest along axis: the other axes kept */
static void axes_topk(const TpModule *m, int op, TpOpAxes *x) {
  int X = m->ops[op].inputs[0], Y = m->ops[op].outputs[0];
  int rx = value_type(m, X)->rank;
  int a = (int)tp_attr_int(m, op, "axis", 0);
  for (int k = 0; k < rx; k++)
    if (k != a) axes_link(x, X, k, Y, k);
  axes_mix(x, X, a, "selects the largest along");
}

/* the result has the indices' shape */
static void axes_gather_elements(const TpModule *m, int op, TpOpAxes *x) {
  const TpOp *o = &m->ops[op];
  int X = o->inputs[0], Y = o->outputs[0];
  int rx = value_type(m, X)->rank;
  int a = (int)tp_attr_int(m, op, "axis", 0), idx = o->inputs[1];
  axes_all(m, x, idx, Y);
  for (int k = 0; k < rx; k++)
    if (k != a && value_type(m, X)->dims[k] == value_type(m, idx)->dims[k]) axes_link(x, X, k, idx, k);
    else axes_mix(x, X, k, k == a ? "gathers along" : "gathers part of");
}

/* ---- tensor-parallel split ---- */

/* A Gather of split data along another axis with replicated indices (Bloom picks q, k or v
 * out of each head's [3, head_dim]). */
static int split_gather_other_axis(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  int x = m->ops[op].inputs[0], idx = m->ops[op].inputs[1], a = s->axis[x];
  int g = (int)tp_attr_int(m, op, "axis", 0);
  if (g < 0) g += m->values[x].type.rank;
  if (a < 0 || s->axis[idx] >= 0)
    return tp_split_refuse(s, op, tp_strfmt(m, "its indices %%%s are split over the ranks", m->values[idx].name));
  if (g == a) return tp_split_refuse(s, op, "it picks along the axis split over the ranks");
  tp_split_mark(s, m->ops[op].outputs[0], a < g ? a : a + m->values[idx].type.rank - 1, s->parts[x]);
  return tp_split_reinfer(s, op);
}

static int split_gather(TpSplitCtx *s, int op) { return split_gather_other_axis(s, op); }

/* ---- kernel binders ---- */

/* Gather, GatherElements and their backward ops: data (or dy), indices {axis}. */
static int bind_gather(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  TpOpKind k = m->ops[op].kind;
  b->kernel = k == TP_OP_Gather           ? TP_K_GATHER
              : k == TP_OP_GatherElements ? TP_K_GATHER_ELEMENTS
              : k == TP_OP_GatherBackward ? TP_K_GATHER_BACKWARD
                                          : TP_K_GATHER_ELEMENTS_BACKWARD;
  b->a.gather =
      (TpGatherArgs){&in[0],  &in[1], (int)tp_attr_int(m, op, "axis", 0), tp_attr_int(m, op, "padding_idx", -1),
                     &out[0], &b->bad};
  return TP_OK;
}

static int bind_topk(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  (void)d;
  b->kernel = TP_K_TOPK;
  b->a.topk = (TpTopkArgs){&in[0], (int)tp_attr_int(m, op, "axis", 0), &out[0]};
  return TP_OK;
}

/* The vocabulary-parallel ops (ir/ops.def): Embedding and CrossEntropy(Backward) with a
 * Part operand, EmbeddingBackward, CrossEntropyStats. */
int tp_bind_vocab(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  TpOpKind kind = m->ops[op].kind;
  TpVocabArgs *a = &b->a.embedding_part;
  *a = (TpVocabArgs){.bad = &b->bad, .y = &out[0]};
  if (kind == TP_OP_Embedding || kind == TP_OP_EmbeddingBackward) {
    bool fwd = kind == TP_OP_Embedding;
    const TpTensor *w = fwd ? &in[0] : &out[0];
    a->x = &in[0], a->ids = &in[1], a->part = &in[2];
    a->n = tp_tensor_numel(&in[1]), a->parts = tp_attr_int(m, op, "vocab_parts", 1);
    if (w->rank != 2 || tp_tensor_numel(fwd ? &out[0] : &in[0]) != a->n * w->dims[1]) return shape_error(m, op, d);
    a->V = w->dims[0], a->C = w->dims[1];
    b->kernel = fwd ? TP_K_EMBEDDING_PART : TP_K_EMBEDDING_PART_BACKWARD;
    return TP_OK;
  }
  int first = kind == TP_OP_CrossEntropyBackward; /* dLoss before the logits */
  const TpTensor *logits = &in[first];
  if (logits->rank < 1) return shape_error(m, op, d);
  a->x = logits, a->ids = &in[first + 1];
  a->V = last_dim(logits), a->n = numel_from(logits, 0, logits->rank - 1);
  a->denominator = (float)tp_attr_float(m, op, "denominator", (double)a->n);
  if (tp_tensor_numel(a->ids) != a->n) return shape_error(m, op, d);
  a->pad = tp_attr_int(m, op, "vocab_pad", 0);
  if (kind == TP_OP_CrossEntropyStats) {
    a->part = &in[2], a->parts = tp_attr_int(m, op, "vocab_parts", 1);
    if (tp_tensor_numel(&out[0]) != a->n * (2 * a->parts + 1)) return shape_error(m, op, d);
    b->kernel = a->pad ? TP_K_CROSS_ENTROPY_STATS_PAD : TP_K_CROSS_ENTROPY_STATS;
    return TP_OK;
  }
  a->stats = &in[first + 2], a->part = &in[first + 3], a->parts = (last_dim(a->stats) - 1) / 2;
  if (tp_tensor_numel(a->stats) != a->n * (2 * a->parts + 1) ||
      tp_tensor_numel(&out[0]) != (first ? a->n * a->V : 1) || (first && tp_tensor_numel(&in[0]) != 1))
    return shape_error(m, op, d);
  a->dloss = first ? &in[0] : NULL;
  b->kernel = TP_K_CROSS_ENTROPY_PARTS;
  if (first) b->kernel = a->pad ? TP_K_CROSS_ENTROPY_PARTS_BACKWARD_PAD : TP_K_CROSS_ENTROPY_PARTS_BACKWARD;
  return TP_OK;
}

static int bind_embedding(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  if (m->ops[op].ninputs > 2) return tp_bind_vocab(m, op, in, out, b, d);
  const TpTensor *w = &in[0];
  int64_t n = tp_tensor_numel(&in[1]);
  if (w->rank != 2 || tp_tensor_numel(&out[0]) != n * w->dims[1]) return shape_error(m, op, d);
  b->kernel = TP_K_EMBEDDING;
  b->a.embedding = (TpEmbeddingArgs){w, &in[1], n, w->dims[0], w->dims[1], &out[0], &b->bad};
  return TP_OK;
}

/* ---- rule sets ---- */

const TpOpRules tp_rules_Gather = {
    .infer = infer_gather,
    .gradient = grad_gather,
    .token_axes = axes_gather,
    .tensor_split = split_gather,
    .bind = TP_BINDING(bind_gather, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_GatherElements = {
    .infer = infer_gather_elements,
    .gradient = grad_gather_elements,
    .token_axes = axes_gather_elements,
    .bind = TP_BINDING(bind_gather, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_TopK = {
    .infer = infer_topk,
    .token_axes = axes_topk,
    .bind = TP_BINDING(bind_topk, TP_BIND_ANY, 0, 0),
};
const TpOpRules tp_rules_Embedding = {
    .infer = infer_embedding,
    .gradient = grad_embedding,
    .token_axes = axes_embedding,
    .bind = TP_BINDING(bind_embedding, TP_BIND_F32, 1u << 1 | 1u << 2, 2),
};
const TpOpRules tp_rules_GatherBackward = {
    .infer = infer_gather_backward,
    .bind = TP_BINDING(bind_gather, TP_BIND_F32, 1u << 1, 0),
};
const TpOpRules tp_rules_GatherElementsBackward = {
    .infer = infer_gather_elements_backward,
    .bind = TP_BINDING(bind_gather, TP_BIND_F32, 1u << 1, 0),
};
const TpOpRules tp_rules_EmbeddingBackward = {
    .infer = infer_embedding_backward,
    .bind = TP_BINDING(tp_bind_vocab, TP_BIND_F32, 1u << 1 | 1u << 2, 2),
};
