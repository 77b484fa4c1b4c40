/* add-loss: requires a module with inferred types; provides m->loss, the scalar loss that
 * training minimises. Where it comes from, first match wins:
 *   1. opt->logits (the tool's --logits NAME): that graph output is the logits;
 *   2. a graph output computed by SoftmaxCrossEntropyLoss or NegativeLogLikelihoodLoss
 *      with reduction "mean": the model's own loss is used as it is;
 *   3. the one graph output that is a float [B, T, V] tensor is the logits.
 * For logits, a new graph input `targets` : i64[B, T] (dims named like the token input's)
 * and loss = CrossEntropy(logits, targets) {denominator = B*T}, the mean next-token
 * cross-entropy over all positions, are appended. A module that has a loss is left alone. */
#include "../ir/ir.h"

#include <string.h>

static bool is_logits_type(const TpType *t) { return t->rank == 3 && tp_dtype_is_float(t->dtype); }

/* The model's own loss among the graph outputs, or -1. */
static int find_model_loss(TpModule *m, TpDiag *d, int *loss) {
  *loss = -1;
  for (int i = 0; i < m->noutputs; i++) {
    const TpValue *v = &m->values[m->outputs[i]];
    if (v->kind != TP_VAL_RESULT) continue;
    int op = v->def;
    TpOpKind k = m->ops[op].kind;
    if ((k != TP_OP_SoftmaxCrossEntropyLoss && k != TP_OP_NegativeLogLikelihoodLoss) ||
        m->ops[op].outputs[0] != m->outputs[i])
      continue;
    const char *reduction = tp_attr_string(m, op, "reduction", "mean");
    if (strcmp(reduction, "mean") != 0)
      return tp_error_op(d, m, op,
                         "the model's loss has reduction '%s'; training needs the mean (or pass --logits NAME)",
                         reduction);
    *loss = m->outputs[i];
    return TP_OK;
  }
  return TP_OK;
}

/* The graph output that holds the logits (the one named `name`, when not NULL), or an error
 * that says how to name it. */
static int find_logits(TpModule *m, const char *name, TpDiag *d, int *logits) {
  char buf[256];
  *logits = -1;
  if (name) {
    for (int i = 0; i < m->noutputs; i++)
      if (strcmp(m->values[m->outputs[i]].name, name) == 0) *logits = m->outputs[i];
    if (*logits < 0) return tp_error(d, "cannot find the logits: no graph output is named '%s'", name);
    const TpType *t = &m->values[*logits].type;
    if (!is_logits_type(t))
      return tp_error(d, "the logits '%s' must be a float [B, T, V] tensor, not %s", name,
                      tp_type_str(t, buf, sizeof buf));
    return TP_OK;
  }
  for (int i = 0; i < m->noutputs; i++) {
    int v = m->outputs[i];
    if (!is_logits_type(&m->values[v].type) || v == *logits) continue;
    if (*logits >= 0)
      return tp_error(d,
                      "cannot find the logits: outputs '%s' and '%s' are both float [B, T, V] tensors; pass "
                      "--logits NAME",
                      m->values[*logits].name, m->values[v].name);
    *logits = v;
  }
  if (*logits < 0)
    return tp_error(d, "cannot find the logits: no graph output is a float [B, T, V] tensor; pass --logits NAME");
  return TP_OK;
}

int tp_loss_logits(TpModule *m, const char *name) {
  TpDiag quiet;
  tp_diag_init(&quiet, NULL, NULL, NULL);
  int loss = -1, logits = -1;
  if (m->loss >= 0 || (!name && (find_model_loss(m, &quiet, &loss) || loss >= 0))) return -1;
  return find_logits(m, name, &quiet, &logits) ? -1 : logits;
}

/* A new op of the loss, on stage `stage`, from kind(in) with one result named `name`; its
 * result (-1 after an error). */
static int loss_op(TpModule *m, TpDiag *d, TpOpKind kind, const int *in, int nin, const char *name, int stage) {
  int op = tp_add_op(m, kind, in, nin, (const char *[]){tp_unique_name(m, name)}, 1, (TpOrigin){0});
  m->ops[op].stage = stage;
  if (kind == TP_OP_TensorRank || kind == TP_OP_AllReduce) tp_set_attr_string(m, op, "group", "tensor");
  if (kind == TP_OP_AllReduce) tp_set_attr_string(m, op, "reduce", "sum");
  if (kind == TP_OP_CrossEntropyStats) tp_set_attr_int(m, op, "vocab_parts", tp_vocab_parts(m, in[0]));
  if (kind == TP_OP_CrossEntropyStats && tp_vocab_pad(m, in[0]))
    tp_set_attr_int(m, op, "vocab_pad", tp_vocab_pad(m, in[0]));
  return tp_infer_op(m, op, d) == TP_OK ? m->ops[op].outputs[0] : -1;
}

int pass_add_loss(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  if (m->loss >= 0) return TP_OK;
  int logits = -1;
  if (!opt->logits) {
    if (find_model_loss(m, d, &m->loss)) return TP_ERR_INPUT;
    if (m->loss >= 0) return TP_OK;
  }
  if (find_logits(m, opt->logits, d, &logits)) return TP_ERR_INPUT;

  /* targets [B, T]: named like the token input's dims where one matches */
  TpType lt = m->values[logits].type;
  int64_t bt[2] = {lt.dims[0], lt.dims[1]};
  TpType targets = tp_type_make(TP_I64, 2, bt);
  targets.dimnames[0] = lt.dimnames[0];
  targets.dimnames[1] = lt.dimnames[1];
  for (int i = 0; i < m->ninputs; i++) {
    const TpType *t = &m->values[m->inputs[i]].type;
    if (t->rank == 2 && (t->dtype == TP_I64 || t->dtype == TP_I32) && t->dims[0] == bt[0] && t->dims[1] == bt[1]) {
      targets.dimnames[0] = t->dimnames[0];
      targets.dimnames[1] = t->dimnames[1];
      break;
    }
  }
  int tv = tp_add_value(m, tp_unique_name(m, "targets"), TP_VAL_INPUT, targets, (TpOrigin){0});
  tp_add_input(m, tv);

  /* vocabulary-parallel logits (shard-tensor): each rank's statistics, summed over the
   * ranks, give the whole vocabulary's loss */
  int def = m->values[logits].def, stage = def >= 0 ? m->ops[def].stage : 0, in[4] = {logits, tv, -1, -1};
  if (tp_vocab_parts(m, logits) > 1) {
    int part = in[3] = loss_op(m, d, TP_OP_TensorRank, NULL, 0, "loss.part", stage);
    int stats = part < 0 ? -1
                         : loss_op(m, d, TP_OP_CrossEntropyStats, (int[]){logits, tv, part}, 3, "loss.stats", stage);
    in[2] = stats < 0 ? -1 : loss_op(m, d, TP_OP_AllReduce, &stats, 1, "loss.stats.sum", stage);
    if (in[2] < 0) return TP_ERR_INTERNAL;
  }
  int op = tp_add_op(m, TP_OP_CrossEntropy, in, in[2] >= 0 ? 4 : 2, (const char *[]){"loss"}, 1, (TpOrigin){0});
  tp_set_attr_float(m, op, "denominator", (double)(bt[0] * bt[1]));
  if (tp_vocab_pad(m, logits)) tp_set_attr_int(m, op, "vocab_pad", tp_vocab_pad(m, logits));
  m->ops[op].stage = stage;
  if (tp_infer_op(m, op, d)) return TP_ERR_INTERNAL;
  m->loss = m->ops[op].outputs[0];
  return TP_OK;
}
