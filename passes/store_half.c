/* store-bf16, store-fp16: require a trained module (after autodiff, staging and the last
 * dce); provide one whose parameters, activations and gradients are stored in 16 bits
 * while every kernel still computes in f32 (tokpipec --precision bf16|fp16).
 *
 * A float result r that outlives the unit computing it (read by another stage, slice or
 * phase: an activation saved for the backward, a boundary message, a K/V slice, a
 * gradient crossing slices) or that is a parameter's gradient is rounded by a Cast into
 * the 16-bit value r.bf16 (r.f16) that is kept; each op reading r reads a Cast of it back
 * to f32 placed right before it, in its own unit too, so that the backward sees the values
 * the forward computed with (a loss's statistics and the logits its backward reads agree).
 * The memory plan's liveness then keeps only 16-bit values from unit to unit, and the f32
 * values are the running unit's working set. A Reshape (a view, a stage-boundary
 * copy) and a re-tie view (a parameter's transpose) of a stored value read and yield the
 * 16-bit value itself, so boundary messages carry 16 bits and a re-tie view reads its
 * parameter directly.
 * Parameters become 16-bit values (the trainer's working copy, rounded from its f32
 * masters) and each parameter's gradient is the 16-bit value of what autodiff computed. A
 * parameter keeps its initializer's data reference, f32 (TpValue.data_dtype, printed `=
 * f32 blob ...`): the trainer reads the initial values into its f32 masters (--init).
 *
 * Stay f32: the loss, the results of loss ops and their statistics (also summed over a
 * vocabulary split over tensor ranks), the statistics a norm or attention keeps for its
 * backward (results after the first), a token slice's K/V context (Concat {context_rows}:
 * a buffer every slice writes its rows into in place), and a tensor rank's partial sum
 * that an AllReduce sums in place (rounding each partial before the sum would lose what
 * their cancellation leaves; the sum is stored). An AttentionBackward reads the forward's
 * Y as it was computed, f32, not its 16-bit copy: its row sums dy . y must be the ones its
 * kernel's statistics pass would compute, so that the gradients keep their bits (the
 * other readers of Y read the 16-bit copy as before).
 * A recomputed copy (passes/recompute.c, role recompute) is stored as the forward result
 * it copies is: whether that outlives its unit is judged as without recompute (a copy's
 * backward readers read the forward result, a copy op runs in its original's unit), and
 * where the forward result is rounded, so is the copy, and its readers read it back from
 * 16 bits, so the kernels see the bits they see without recompute.
 * Integer values and constants are not touched. A module that already holds a 16-bit
 * parameter is left as it is, so IR read back does not get the casts twice. */
#include "../ir/ir.h"

#include <stdlib.h>
#include <string.h>

/* Does result k of op `op` stay f32? `reduced`: the values an AllReduce reads. */
static bool keeps_f32(const TpModule *m, const bool *reduced, int op, int k) {
  const TpOp *o = &m->ops[op];
  int r = o->outputs[k];
  if (r == m->loss || reduced[r]) return true;
  if (o->kind == TP_OP_AllReduce && m->values[o->inputs[0]].def >= 0 &&
      m->ops[m->values[o->inputs[0]].def].kind == TP_OP_CrossEntropyStats)
    return true; /* the statistics summed over the vocabulary's ranges */
  if (o->kind == TP_OP_Concat && tp_attr_int(m, op, "context_rows", 0) > 0) return true;
  switch (o->kind) {
  case TP_OP_CrossEntropyStats:
  case TP_OP_SoftmaxCrossEntropyLoss:
  case TP_OP_NegativeLogLikelihoodLoss:
  case TP_OP_CrossEntropy: return true;
  case TP_OP_LayerNorm:
  case TP_OP_Attention: return k > 0;
  default: return false;
  }
}

/* Does operand i of op `op` read its f32 value even where a 16-bit copy is stored? */
static bool reads_f32(const TpModule *m, int op, int i) {
  return m->ops[op].kind == TP_OP_AttentionBackward && i == 5; /* the forward's Y */
}

int tp_add_cast(TpModule *m, int x, TpDType to, int at, const char *suffix) {
  const char *name = tp_strfmt(m, "%s.%s", m->values[x].name, suffix);
  TpOrigin origin = m->ops[at].origin;
  int c = tp_add_op(m, TP_OP_Cast, &x, 1, &name, 1, origin);
  TpOp *op = &m->ops[c], *src = &m->ops[at];
  op->stage = src->stage, op->slice = src->slice, op->phase = src->phase;
  TpType t = m->values[x].type;
  t.dtype = to;
  m->values[op->outputs[0]].type = t;
  return c;
}

/* Do ops a and b run in the same unit (stage, slice and phase)? */
static bool same_unit(const TpOp *a, const TpOp *b) {
  return a->stage == b->stage && a->slice == b->slice && a->phase == b->phase;
}

/* original[v]: the forward result that v, a recomputed copy named "<result>.recompute",
 * copies; v itself for every other value. */
static void find_originals(TpModule *m, int *original) {
  static const char suffix[] = ".recompute";
  size_t ns = sizeof suffix - 1;
  for (int v = 0; v < m->nvalues; v++) {
    original[v] = v;
    const TpValue *val = &m->values[v];
    if (val->kind != TP_VAL_RESULT || val->def < 0 || m->ops[val->def].role != TP_ROLE_RECOMPUTE) continue;
    size_t n = strlen(val->name);
    if (n <= ns || strcmp(val->name + n - ns, suffix) != 0) continue;
    int x = tp_find_value(m, tp_strfmt(m, "%.*s", (int)(n - ns), val->name));
    if (x >= 0 && m->values[x].kind == TP_VAL_RESULT && m->values[x].def >= 0) original[v] = x;
  }
}

/* The op that op `op` copies (recompute), or op itself. */
static int original_op(const TpModule *m, const int *original, int op) {
  const TpOp *o = &m->ops[op];
  for (int k = 0; o->role == TP_ROLE_RECOMPUTE && k < o->noutputs; k++)
    if (o->outputs[k] >= 0) return m->values[original[o->outputs[k]]].def;
  return op;
}

static int store_half(TpModule *m, TpDType half, TpDiag *d) {
  for (int v = 0; v < m->nvalues; v++)
    if (m->values[v].kind == TP_VAL_PARAM && m->values[v].type.dtype == half) return TP_OK;
  int nops = m->nops, nvalues = m->nvalues;
  /* stored[v]: the 16-bit value standing for f32 value v (-1: none) */
  int *stored = malloc(sizeof(int) * ((size_t)nvalues + 1));
  int *original = malloc(sizeof(int) * ((size_t)nvalues + 1));
  bool *reduced = calloc((size_t)nvalues + 1, sizeof *reduced),
       *outlives = calloc((size_t)nvalues + 1, sizeof *outlives);
  /* the new op order: each old op with its casts up before it and down after it */
  int *order = malloc(sizeof(int) * ((size_t)nops * 8 + 64)), norder = 0, cap = nops * 8 + 64;
  TP_ASSERT(stored && original && reduced && outlives && order);
  find_originals(m, original);
  /* as without recompute: copies stand for their originals, copy ops run in theirs' units */
  for (int op = 0; op < nops; op++) {
    const TpOp *o = &m->ops[op], *o0 = &m->ops[original_op(m, original, op)];
    if (o->kind == TP_OP_AllReduce) reduced[original[o->inputs[0]]] = true;
    for (int i = 0; i < o->ninputs; i++) {
      int x = o->inputs[i] >= 0 ? original[o->inputs[i]] : -1;
      if (x >= 0 && m->values[x].kind == TP_VAL_RESULT && !same_unit(&m->ops[m->values[x].def], o0) &&
          !reads_f32(m, op, i))
        outlives[x] = true;
    }
  }
  for (int v = 0; v < nvalues; v++) {
    stored[v] = -1;
    TpValue *val = &m->values[v];
    if (val->kind == TP_VAL_PARAM && val->type.dtype == TP_F32) {
      val->type.dtype = half;   /* the working copy */
      val->data_dtype = TP_F32; /* the initial values, for the f32 masters */
      stored[v] = v;
    }
    if (m->grads && v < m->ngrads && m->grads[v] >= 0) outlives[m->grads[v]] = true;
  }
  for (int op = 0; op < nops; op++) {
    if (norder + 2 * (m->ops[op].ninputs + m->ops[op].noutputs) + 1 > cap) {
      cap *= 2;
      order = realloc(order, sizeof(int) * (size_t)cap);
      TP_ASSERT(order);
    }
    int op0 = original_op(m, original, op); /* decides as the op it copies */
    bool moves = m->ops[op].kind == TP_OP_Reshape || m->ops[op].role == TP_ROLE_RETIE;
    if (moves && m->ops[op].inputs[0] >= 0 && stored[m->ops[op].inputs[0]] >= 0 && !keeps_f32(m, reduced, op0, 0)) {
      /* moves the 16-bit elements: a view, or a re-tie view's transpose of a parameter */
      int x = m->ops[op].inputs[0], r = m->ops[op].outputs[0];
      m->ops[op].inputs[0] = stored[x];
      m->values[r].type.dtype = half;
      stored[r] = r;
      order[norder++] = op;
      continue;
    }
    for (int i = 0; i < m->ops[op].ninputs; i++) {
      int x = m->ops[op].inputs[i];
      if (x < 0 || x >= nvalues || stored[x] < 0 || reads_f32(m, op, i)) continue;
      int up = tp_add_cast(m, stored[x], TP_F32, op, "f32");
      order[norder++] = up;
      int y = m->ops[up].outputs[0];
      for (int j = i; j < m->ops[op].ninputs; j++) /* an operand read twice: one cast */
        if (m->ops[op].inputs[j] == x) m->ops[op].inputs[j] = y;
    }
    order[norder++] = op;
    for (int k = 0; k < m->ops[op].noutputs; k++) {
      int r = m->ops[op].outputs[k];
      if (r < 0 || m->values[r].type.dtype != TP_F32 || !outlives[original[r]] || keeps_f32(m, reduced, op0, k))
        continue;
      int down = tp_add_cast(m, r, half, op, tp_dtype_name(half));
      order[norder++] = down;
      stored[r] = m->ops[down].outputs[0];
    }
  }
  /* each parameter's gradient is the 16-bit value */
  for (int v = 0; v < nvalues && m->grads; v++) {
    int g = tp_grad_of(m, v);
    if (g >= 0 && g < nvalues && stored[g] >= 0) tp_set_grad(m, v, stored[g]);
  }
  /* the new order (ops already topological: each cast sits next to its op) */
  TP_ASSERT(norder == m->nops);
  TpOp *ops = malloc(sizeof(TpOp) * ((size_t)m->nops + 1));
  int *index = malloc(sizeof(int) * ((size_t)m->nops + 1));
  TP_ASSERT(ops && index);
  for (int i = 0; i < norder; i++) ops[i] = m->ops[order[i]], index[order[i]] = i;
  memcpy(m->ops, ops, sizeof(TpOp) * (size_t)m->nops);
  for (int v = 0; v < m->nvalues; v++)
    if (m->values[v].def >= 0) m->values[v].def = index[m->values[v].def];
  free(ops), free(index), free(order), free(stored), free(original), free(reduced), free(outlives);
  return pass_dce(m, NULL, d); /* the casts of results nothing reads */
}

int pass_store_bf16(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  (void)opt;
  return store_half(m, TP_BF16, d);
}

/* fp16: the backward starts from the loss scale, an input the trainer sets (dynamic loss
 * scaling), in place of autodiff's constant d loss / d loss = 1 (%loss.grad), so that small
 * gradients keep their bits in fp16's narrow range. */
static int seed_loss_scale(TpModule *m, TpDiag *d) {
  int seed = m->loss >= 0 ? tp_find_value(m, tp_strfmt(m, "%s.grad", m->values[m->loss].name)) : -1;
  TpValue *val = seed >= 0 ? &m->values[seed] : NULL;
  if (!val || val->kind == TP_VAL_INPUT) return TP_OK; /* no backward, or an input already */
  if (val->kind != TP_VAL_CONST || val->type.dtype != TP_F32 || val->type.rank != 0 ||
      *(const float *)tp_value_data(m, seed) != 1.0f)
    return tp_internal(d, "store-fp16: %%%s is not the backward's seed d loss / d loss = 1", val->name);
  val->kind = TP_VAL_INPUT;
  val->blob = -1;
  val->offset = 0;
  tp_add_input(m, seed);
  return TP_OK;
}

int pass_store_fp16(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  (void)opt;
  int rc = store_half(m, TP_F16, d);
  return rc == TP_OK ? seed_loss_scale(m, d) : rc;
}
