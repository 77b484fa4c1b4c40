/* rebatch: requires a forward module with inferred, static types, before add-loss (best
 * after fold-constants, so that masks and position tables built from constants are
 * constants); provides the same module for opt->batch rows of the token input (0: keep its
 * batch). A fixed-shape export (torch.onnx.export's default) was traced at one batch; this
 * makes its batch a free axis, so that microbatches and data-parallel replicas can take
 * any number of rows.
 *
 * The batch axes are the class of the token input's first dim under insert-token-dim's
 * positional relations (tp_op_axes: elementwise ops, Transpose, Expand, MatMul's batch
 * dims, ...), found in op order. A Reshape of a value on the batch axis puts the batch where
 * its rows are, as the outermost factor of the output axis that starts at the same element
 * ([B, H, T, D] <-> [B*H, T, D], the 3-D products of baddbmm; [1, T, C] -> [T, C], GPT-2's
 * Conv1D at batch 1): an axis of B*k elements becomes B'*k. Axes of one element of weights
 * and constants broadcast over any batch and are left out (at batch 1 they would line up
 * with it by chance). Constants join the class where they meet it (a causal mask folded to
 * [B, 1, T, T], OPT's positions [B, T], BLOOM's ALiBi [B*H, 1, T]); each must be the same
 * for every batch row, and becomes one row (when every reader is an elementwise op that
 * broadcasts it against a batch operand) or the new number of rows, repeated.
 *
 * Refused, naming the node: an op that combines elements along the batch axis (softmax,
 * reduction, contraction, gather, slice, concat), one that loses it (a Reshape that puts
 * the batch inside another axis), an op the axis relations do not describe, a value with two
 * batch axes, a parameter or a constant that differs along it, and any op whose types no
 * longer hold at the new batch (each op's types are inferred again). */
#include "../ir/ir.h"

#include <stdlib.h>
#include <string.h>

/* A constant repeated for the new batch is a module-owned copy; past this size it is refused
 * (like fold-constants' limit, a bound on what the compiler materialises). */
enum { MAX_CONSTANT_BYTES = 1 << 30 };

typedef struct {
  TpModule *m;
  TpDiag *d;
  int64_t from, to; /* the module's rows, the rows asked for */
  int *parent;      /* union-find over value * TP_MAX_RANK + axis */
  int *axis;        /* per value: its batch axis, or -1 */
  bool *computed;   /* per value: computed from a graph input (not from weights alone) */
} Rebatch;

/* An axis of one element of a weight or constant (nothing computed along it) broadcasts
 * over any batch, the traced one of one row included: it is never taken for the batch, and
 * links through it (an axis of one element lines up with any other) are not followed. */
static bool broadcasts(const Rebatch *r, int v, int a) {
  return !r->computed[v] && r->m->values[v].type.dims[a] == 1;
}

static void join(Rebatch *r, int v1, int a1, int v2, int a2) {
  if (broadcasts(r, v1, a1) || broadcasts(r, v2, a2)) return;
  r->parent[tp_axis_class(r->parent, v1 * TP_MAX_RANK + a1)] = tp_axis_class(r->parent, v2 * TP_MAX_RANK + a2);
}

static const TpType *type_of(const Rebatch *r, int v) { return &r->m->values[v].type; }

/* The output axis of a Reshape that carries input axis a's batch as its outermost factor,
 * or -1. Axis a holds `batch` rows (times the axes merged into it); row i is a block of the
 * elements from where a starts. The output axis that starts at the same element holds them
 * as its outermost digit when its extent is a multiple of the batch: the same axis, a merge
 * with the axes after a ([B, H, T] -> [B*H, T]) or a split ([B*H, T] -> [B, H, T]). Axes of
 * one element there are passed over unless the batch is one row (then any axis could hold
 * it; the first is taken). */
static int reshape_batch_axis(const TpType *ti, int a, const TpType *to, int64_t batch) {
  int64_t start = 1, before = 1;
  for (int k = 0; k < a; k++) start *= ti->dims[k];
  for (int b = 0; b < to->rank && before <= start; before *= to->dims[b], b++)
    if (before == start && to->dims[b] % batch == 0 && (to->dims[b] > 1 || batch == 1)) return b;
  return -1;
}

/* A Reshape of values not (yet) on the batch axis, such as constants that meet it later:
 * each axis that could hold the batch with the output axis that would then hold it. */
static void merge_links(Rebatch *r, int op) {
  const TpOp *o = &r->m->ops[op];
  const TpType *ti = type_of(r, o->inputs[0]), *to = type_of(r, o->outputs[0]);
  for (int a = 0; a < ti->rank; a++) {
    int b = ti->dims[a] % r->from == 0 ? reshape_batch_axis(ti, a, to, r->from) : -1;
    if (b >= 0) join(r, o->inputs[0], a, o->outputs[0], b);
  }
}

/* The axis of v in the batch class so far, or -1. */
static int class_axis(Rebatch *r, int v, int tokens) {
  int root = tp_axis_class(r->parent, tokens * TP_MAX_RANK);
  for (int a = 0; a < type_of(r, v)->rank; a++)
    if (tp_axis_class(r->parent, v * TP_MAX_RANK + a) == root) return a;
  return -1;
}

/* "cannot re-batch ...: WHY" at op (or without a node when op < 0). */
static int refuse(Rebatch *r, int op, const char *why) {
  if (op < 0)
    return tp_error(r->d, "cannot re-batch from %lld to %lld rows: %s", (long long)r->from, (long long)r->to, why);
  return tp_error_op(r->d, r->m, op, "cannot re-batch from %lld to %lld rows: %s", (long long)r->from,
                     (long long)r->to, why);
}

/* The first live op reading v, or -1. */
static int first_reader(const TpModule *m, int v) {
  for (int op = 0; op < m->nops; op++)
    for (int i = 0; i < m->ops[op].ninputs && !m->ops[op].dead; i++)
      if (m->ops[op].inputs[i] == v) return op;
  return -1;
}

/* The op to name for value v: the one that computes it, else its first reader. */
static int value_op(const TpModule *m, int v) {
  return m->values[v].kind == TP_VAL_RESULT ? m->values[v].def : first_reader(m, v);
}

/* The batch axis of every value (class of the token input's dim 0), or a refusal. */
static int find_batch_axes(Rebatch *r, int tokens, TpOpAxes *x) {
  TpModule *m = r->m;
  for (int op = 0; op < m->nops; op++) { /* in order: a Reshape's input is classified before it */
    const TpOp *o = &m->ops[op];
    if (o->dead) continue;
    int a = o->kind == TP_OP_Reshape ? class_axis(r, o->inputs[0], tokens) : -1;
    if (a >= 0) { /* only the batch axis: its other links may hold only at the traced batch */
      int b = reshape_batch_axis(type_of(r, o->inputs[0]), a, type_of(r, o->outputs[0]), r->from);
      if (b >= 0) join(r, o->inputs[0], a, o->outputs[0], b);
      continue;
    }
    tp_op_axes(m, op, x);
    for (int i = 0; i < x->nlinks; i++) join(r, x->link[i][0].v, x->link[i][0].a, x->link[i][1].v, x->link[i][1].a);
    if (o->kind == TP_OP_Reshape) merge_links(r, op);
  }
  int root = tp_axis_class(r->parent, tokens * TP_MAX_RANK);
  for (int v = 0; v < m->nvalues; v++) {
    r->axis[v] = -1;
    if (m->values[v].dead) continue;
    const TpType *t = type_of(r, v);
    for (int a = 0; a < t->rank; a++) {
      if (tp_axis_class(r->parent, v * TP_MAX_RANK + a) != root) continue;
      const char *why = NULL;
      if (r->axis[v] >= 0)
        why = tp_strfmt(m, "%%%s has two batch axes (%d and %d)", m->values[v].name, r->axis[v], a);
      else if (t->dims[a] % r->from)
        why = tp_strfmt(m, "%%%s has %lld elements along its batch axis %d, not a multiple of the batch",
                        m->values[v].name, (long long)t->dims[a], a);
      if (why) return refuse(r, value_op(m, v), why);
      r->axis[v] = a;
    }
  }
  return TP_OK;
}

/* Refuses an op that combines, drops or may mix elements along the batch axis. */
static int check_op(Rebatch *r, int op, TpOpAxes *x) {
  TpModule *m = r->m;
  const TpOp *o = &m->ops[op];
  const char *kind = tp_op_info[o->kind].name;
  bool in_batch = false, out_batch = false;
  for (int i = 0; i < o->ninputs; i++) in_batch |= o->inputs[i] >= 0 && r->axis[o->inputs[i]] >= 0;
  for (int i = 0; i < o->noutputs; i++) out_batch |= o->outputs[i] >= 0 && r->axis[o->outputs[i]] >= 0;
  if (!in_batch && !out_batch) return TP_OK;
  tp_op_axes(m, op, x);
  if (x->unknown) return refuse(r, op, tp_strfmt(m, "%s is not known to keep batch rows apart", kind));
  for (int i = 0; i < x->nmixes; i++)
    if (r->axis[x->mix[i].v] == x->mix[i].a)
      return refuse(r, op, tp_strfmt(m, "%s %s the batch axis, mixing batch rows", kind, x->mix_why[i]));
  if (in_batch && !out_batch && !(tp_op_info[o->kind].traits & TP_TRAIT_TOKEN_REDUCING))
    return refuse(r, op,
                  tp_strfmt(m,
                            "%s does not keep the batch axis (it moves it inside another axis or "
                            "reduces it)",
                            kind));
  return TP_OK;
}

/* May constant v (batch axis with one row per batch row) become a single row? Only when
 * every reader is an elementwise op with an operand computed along the batch: that operand
 * gives the result its rows, and the one row broadcasts. */
static bool one_row_suffices(const Rebatch *r, int v) {
  const TpModule *m = r->m;
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    bool reads = false, batch_operand = false;
    for (int i = 0; i < o->ninputs && !o->dead; i++) {
      int u = o->inputs[i];
      if (u == v) reads = true;
      else if (u >= 0 && r->axis[u] >= 0 && r->computed[u]) batch_operand = true;
    }
    if (reads && (!(tp_op_info[o->kind].traits & TP_TRAIT_ELEMENTWISE) || !batch_operand)) return false;
  }
  return true;
}

/* Constant v: the same for every batch row, else a refusal; then one row or r->to rows. */
static int rebatch_constant(Rebatch *r, int v) {
  TpModule *m = r->m;
  TpType *t = &m->values[v].type;
  int a = r->axis[v];
  int64_t per_row = t->dims[a] / r->from, outer = 1, row_bytes = per_row * (int64_t)tp_dtype_size(t->dtype);
  for (int k = 0; k < a; k++) outer *= t->dims[k];
  for (int k = a + 1; k < t->rank; k++) row_bytes *= t->dims[k];
  const uint8_t *data = tp_value_data(m, v);
  TP_ASSERT(data);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t b = 1; b < r->from; b++) {
      const uint8_t *first = data + o * r->from * row_bytes;
      if (memcmp(first + b * row_bytes, first, (size_t)row_bytes) != 0)
        return refuse(r, first_reader(m, v),
                      tp_strfmt(m,
                                "constant %%%s differs between batch rows 0 and %lld (axis %d): it is not one "
                                "row repeated",
                                m->values[v].name, (long long)b, a));
    }
  int64_t rows = per_row == 1 && one_row_suffices(r, v) ? 1 : r->to;
  size_t bytes = (size_t)(outer * rows * row_bytes); /* the resized type's size, checked */
  uint8_t *out = bytes <= MAX_CONSTANT_BYTES ? malloc(bytes + 1) : NULL;
  if (!out)
    return refuse(r, first_reader(m, v),
                  tp_strfmt(m, "constant %%%s would take %zu bytes (at most %d MiB)", m->values[v].name, bytes,
                            MAX_CONSTANT_BYTES >> 20));
  for (int64_t o = 0; o < outer; o++)
    for (int64_t b = 0; b < rows; b++)
      memcpy(out + (o * rows + b) * row_bytes, data + o * r->from * row_bytes, (size_t)row_bytes);
  t->dims[a] = rows * per_row;
  m->values[v].blob = tp_add_owned_blob(m, out, bytes);
  m->values[v].offset = 0;
  free(out);
  return TP_OK;
}

static int rebatch(Rebatch *r, int tokens) {
  TpModule *m = r->m;
  for (int i = 0; i < m->ninputs; i++) r->computed[m->inputs[i]] = true;
  for (int op = 0; op < m->nops; op++) { /* ops are in topological order */
    const TpOp *o = &m->ops[op];
    bool computed = false;
    for (int i = 0; i < o->ninputs; i++) computed |= o->inputs[i] >= 0 && r->computed[o->inputs[i]];
    for (int i = 0; i < o->noutputs; i++)
      if (o->outputs[i] >= 0) r->computed[o->outputs[i]] = computed;
  }
  TpOpAxes *x = malloc(sizeof *x);
  TP_ASSERT(x);
  int rc = find_batch_axes(r, tokens, x);
  for (int op = 0; op < m->nops && rc == TP_OK; op++)
    if (!m->ops[op].dead) rc = check_op(r, op, x);
  free(x);

  for (int v = 0; v < m->nvalues && rc == TP_OK; v++) {
    TpValue *val = &m->values[v];
    int a = r->axis[v];
    if (a < 0) continue;
    TpType resized = val->type;
    if (__builtin_mul_overflow(val->type.dims[a] / r->from, r->to, &resized.dims[a]) || !tp_type_size_ok(&resized))
      rc = refuse(r, value_op(m, v), tp_strfmt(m, "%%%s would be too large", val->name));
    else if (val->kind == TP_VAL_PARAM)
      rc = refuse(r, value_op(m, v),
                  tp_strfmt(m, "parameter %%%s has one entry per batch row (axis %d)", val->name, a));
    else if (val->kind == TP_VAL_CONST) rc = rebatch_constant(r, v);
    else val->type = resized;
  }
  if (rc != TP_OK) return rc;

  /* Every op's types must hold again at the new batch (a Reshape that mixed the batch with
   * other axes in ways the relations missed would not). */
  TpDiag quiet;
  tp_diag_init(&quiet, NULL, NULL, NULL);
  for (int op = 0; op < m->nops; op++)
    if (!m->ops[op].dead && tp_infer_op(m, op, &quiet) != TP_OK)
      return refuse(r, op, tp_strfmt(m, "its types do not hold at the new batch: %s", quiet.last));
  return TP_OK;
}

int pass_rebatch(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  if (opt->batch <= 0) return TP_OK;
  for (int op = 0; op < m->nops; op++)
    if (m->ops[op].phase == TP_PHASE_BACKWARD)
      return tp_error(d, "rebatch re-sizes the forward module: run it before autodiff");
  if (m->loss >= 0) return tp_error(d, "rebatch re-sizes the forward module: run it before add-loss");
  int tokens = tp_token_input(m);
  if (tokens < 0) return tp_error(d, "cannot re-batch: no graph input is integer [batch, seq] token ids");
  Rebatch r = {.m = m, .d = d, .from = m->values[tokens].type.dims[0], .to = opt->batch};
  if (r.from == r.to) return TP_OK;
  if (r.from <= 0) return tp_error(d, "cannot re-batch: the token input %%%s has no rows", m->values[tokens].name);
  int n = m->nvalues * TP_MAX_RANK;
  r.parent = malloc((size_t)n * sizeof *r.parent);
  r.axis = malloc((size_t)m->nvalues * sizeof *r.axis);
  r.computed = calloc((size_t)m->nvalues, sizeof *r.computed);
  TP_ASSERT(r.parent && r.axis && r.computed);
  for (int i = 0; i < n; i++) r.parent[i] = i;
  int rc = rebatch(&r, tokens);
  free(r.parent);
  free(r.axis);
  free(r.computed);
  return rc;
}
