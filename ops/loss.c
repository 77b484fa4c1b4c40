/* Losses: ONNX's SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss, the raised
 * CrossEntropy (and its vocabulary-parallel statistics), and its backward op.
 *
 * Each op's rule set, tp_rules_<Op> (ops/rules.h), is at the end of the file; the hooks
 * it names are above it. */
#include "infer.h"

#include <string.h>

/* ---- shape rules ---- */

/* SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss: scores [N, C, d...], labels [N, d...]. */
static int infer_loss(const TpInferCtx *c) {
  const TpType *x = operand(c, 0), *labels = operand(c, 1), *w = operand(c, 2);
  if (need_float(c, x, "scores")) return TP_ERR_INPUT;
  if (x->rank < 2 || labels->rank != x->rank - 1 || labels->dims[0] != x->dims[0])
    return tp_error_op(c->d, c->m, c->op, "scores must be [N, C, d...] and labels [N, d...]");
  for (int i = 2; i < x->rank; i++)
    if (labels->dims[i - 1] != x->dims[i])
      return tp_error_op(c->d, c->m, c->op, "labels do not match the scores' extra dims");
  if (labels->dtype != TP_I64 && labels->dtype != TP_I32) return tp_error_op(c->d, c->m, c->op, "labels must be i32 or i64");
  if (w && (w->rank != 1 || w->dims[0] != x->dims[1] || w->dtype != x->dtype))
    return tp_error_op(c->d, c->m, c->op, "weights must be [C] of the scores' dtype");
  const char *reduction = tp_attr_string(c->m, c->op, "reduction", "mean");
  TpType loss = {.dtype = x->dtype};
  if (strcmp(reduction, "none") == 0) {
    loss = *labels;
    loss.dtype = x->dtype;
  } else if (strcmp(reduction, "mean") != 0 && strcmp(reduction, "sum") != 0) {
    return tp_error_op(c->d, c->m, c->op, "unknown reduction '%s'", reduction);
  }
  return set_result(c, 0, loss) || set_result(c, 1, *x) ? TP_ERR_INPUT : TP_OK;
}

/* Logits [..., V] and Targets [...] with the same leading dims. */
static int check_logits_targets(const TpInferCtx *c, const TpType *logits, const TpType *targets) {
  if (need_float(c, logits, "logits")) return TP_ERR_INPUT;
  bool ok = logits->rank >= 1 && targets->rank == logits->rank - 1 &&
            (targets->dtype == TP_I64 || targets->dtype == TP_I32);
  for (int i = 0; ok && i < targets->rank; i++) ok = targets->dims[i] == logits->dims[i];
  if (!ok) {
    char sl[256], st[256];
    return tp_error_op(c->d, c->m, c->op, "targets %s do not index logits %s", type_str(targets, st),
                       type_str(logits, sl));
  }
  if (tp_attr_float(c->m, c->op, "denominator", 1) <= 0)
    return tp_error_op(c->d, c->m, c->op, "denominator must be positive");
  return TP_OK;
}

/* The statistics CrossEntropyStats computes from logits [..., Vp] over `parts` ranges:
 * [..., 2 parts + 1]. */
static TpType vocab_stats_type(const TpType *logits, int64_t parts) {
  TpType t = *logits;
  t.dims[t.rank - 1] = 2 * parts + 1;
  t.dimnames[t.rank - 1] = NULL;
  return t;
}

/* CrossEntropy's (first = 0) and CrossEntropyBackward's (first = 1) optional Stats and
 * Part, both or neither: Stats as CrossEntropyStats gives them. */
static int check_vocab_stats(const TpInferCtx *c, int first, const TpType *logits) {
  const TpType *stats = operand(c, first + 2), *part = operand(c, first + 3);
  if (!stats && !part) return TP_OK;
  if (!stats || !part) return tp_error_op(c->d, c->m, c->op, "Stats and Part come together");
  if (check_vocab_part(c, first + 3, NULL)) return TP_ERR_INPUT;
  int64_t parts = stats->rank == logits->rank ? (stats->dims[stats->rank - 1] - 1) / 2 : 0;
  TpType want = vocab_stats_type(logits, parts);
  if (parts < 1 || !tp_type_equal(stats, &want)) {
    char ss[256], sl[256];
    return tp_error_op(c->d, c->m, c->op, "Stats %s are not the vocabulary statistics of logits %s",
                       type_str(stats, ss), type_str(logits, sl));
  }
  return TP_OK;
}

static int infer_cross_entropy(const TpInferCtx *c) {
  const TpType *logits = operand(c, 0);
  if (check_logits_targets(c, logits, operand(c, 1)) || check_vocab_stats(c, 0, logits)) return TP_ERR_INPUT;
  return set_result(c, 0, (TpType){.dtype = logits->dtype});
}

static int infer_cross_entropy_stats(const TpInferCtx *c) {
  const TpType *logits = operand(c, 0);
  int64_t parts = 0; /* set by check_vocab_part */
  if (check_logits_targets(c, logits, operand(c, 1)) || check_vocab_part(c, 2, &parts)) return TP_ERR_INPUT;
  if (logits->dtype != TP_F32) return tp_error_op(c->d, c->m, c->op, "the logits must be f32");
  return set_result(c, 0, vocab_stats_type(logits, parts));
}

static int infer_cross_entropy_backward(const TpInferCtx *c) {
  const TpType *dloss = operand(c, 0), *logits = operand(c, 1);
  if (dloss->rank != 0 || dloss->dtype != logits->dtype)
    return tp_error_op(c->d, c->m, c->op, "dLoss must be a scalar of the logits' dtype");
  if (check_logits_targets(c, logits, operand(c, 2)) || check_vocab_stats(c, 1, logits)) return TP_ERR_INPUT;
  return set_result(c, 0, *logits);
}

/* ---- FLOPs ---- */

/* about 5 FLOPs per logit (max, exp, sum, log) */
static double flops_cross_entropy(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  return o->inputs[0] >= 0 ? 5 * (double)tp_type_numel(&m->values[o->inputs[0]].type) : tp_flops_per_result(m, op);
}

/* ---- rule sets ---- */

const TpOpRules tp_rules_SoftmaxCrossEntropyLoss = {.infer = infer_loss, .flops = flops_cross_entropy};
const TpOpRules tp_rules_NegativeLogLikelihoodLoss = {.infer = infer_loss};
const TpOpRules tp_rules_CrossEntropy = {.infer = infer_cross_entropy, .flops = flops_cross_entropy};
const TpOpRules tp_rules_CrossEntropyStats = {.infer = infer_cross_entropy_stats};
const TpOpRules tp_rules_CrossEntropyBackward = {.infer = infer_cross_entropy_backward};
