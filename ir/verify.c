/* The verifier: checks a module's invariants and reports the first violation.
 * Values: unique names, valid types with known dims, INPUTs listed once as graph inputs,
 * PARAM/CONST data inside their blob, RESULTs defined by exactly one op. Ops: arity from
 * the op table, operands defined before use (so the graph is acyclic), attributes known
 * to the op with sane kinds and values, result types equal to what type inference
 * (ir/infer.c) computes. Graph outputs: at least one, all valid. Nothing marked dead.
 * Placement: stage >= 0, slice >= -1; data flows forward through the stages and back:
 * an op of stage s reads forward results of stages <= s only, and a backward op reads
 * backward results of stages >= s only (so no forward op reads a backward result). A
 * boundary copy is a same-shape Reshape of a result of the neighbouring stage (the one
 * before for a forward copy, after for a backward one); a forward re-tie view a Transpose
 * {perm = [1, 0]} or same-shape Reshape of a param, its origin naming the initializer; a
 * tied copy a param of its parameter's type and data, that parameter no tied copy itself.
 * Training: the loss is a scalar float; every gradient belongs to a PARAM, has its type
 * and is computed (a result or a constant, never an input or a param). */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

static const char *const kind_names[] = {"an int", "a float", "an int list", "a string"};

static bool in_choices(const char *choices, const char *s) {
  size_t n = strlen(s);
  for (const char *p = choices; p;) {
    const char *end = strchr(p, '|');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == n && strncmp(p, s, n) == 0) return true;
    p = end ? end + 1 : NULL;
  }
  return false;
}

static int verify_attrs(const TpModule *m, int o, TpDiag *d) {
  const TpOp *op = &m->ops[o];
  for (int i = 0; i < op->nattrs; i++) {
    const TpAttr *a = &op->attrs[i];
    if (i && strcmp(op->attrs[i - 1].name, a->name) >= 0)
      return tp_error_op(d, m, o, "attributes are not sorted and unique at '%s'", a->name);
    const TpAttrRule *rule = tp_attr_rules;
    while (rule->name && !(rule->op == op->kind && strcmp(rule->name, a->name) == 0)) rule++;
    if (!rule->name)
      return tp_error_op(d, m, o, "unknown attribute '%s' for %s", a->name, tp_op_info[op->kind].name);
    TpAttrKind want = rule->kind;
    bool ok = a->kind == want || (want == TP_ATTR_FLOAT && a->kind == TP_ATTR_INT);
    if (!ok)
      return tp_error_op(d, m, o, "attribute '%s' must be %s, not %s", a->name, kind_names[want],
                         kind_names[a->kind]);
    char buf[32];
    if (a->kind == TP_ATTR_INT) snprintf(buf, sizeof buf, "%lld", (long long)a->i);
    const char *value = a->kind == TP_ATTR_INT ? buf : a->s;
    if (rule->choices && !in_choices(rule->choices, value))
      return tp_error_op(d, m, o, "attribute '%s' is '%s'; allowed: %s", a->name, value, rule->choices);
  }
  return TP_OK;
}

static int verify_type(const TpModule *m, int v, TpDiag *d) {
  const TpType *t = &m->values[v].type;
  const char *name = m->values[v].name;
  if (t->dtype == TP_UNDEF) return tp_error(d, "value %%%s has no type", name);
  if (!tp_dtype_name(t->dtype)) return tp_error(d, "value %%%s has unknown dtype %d", name, (int)t->dtype);
  if (t->rank < 0 || t->rank > TP_MAX_RANK) return tp_error(d, "value %%%s has rank %d", name, t->rank);
  for (int i = 0; i < t->rank; i++)
    if (t->dims[i] < 0) return tp_error(d, "value %%%s has an unknown dimension %d", name, i);
  if (!tp_type_size_ok(t)) return tp_error(d, "value %%%s is too large", name);
  return TP_OK;
}

/* A param's split over the tensor group (TpShard): an axis it has, every rank holding one
 * of the pieces (parts divides ranks), whole chunks along the axis. */
static int verify_shard(const TpModule *m, int v, TpDiag *d) {
  const TpValue *val = &m->values[v];
  const TpShard *s = &val->shard;
  if (s->parts == 0) return TP_OK;
  if (val->kind != TP_VAL_PARAM) return tp_error(d, "value %%%s is split over ranks but not a param", val->name);
  if (s->axis < 0 || s->axis >= val->type.rank)
    return tp_error(d, "param %%%s is split along axis %d, not one of its %d axes", val->name, s->axis,
                    val->type.rank);
  if (s->parts < 1 || s->ranks < s->parts || s->ranks % s->parts != 0)
    return tp_error(d, "param %%%s is split into %d parts over %d ranks: the parts must divide the ranks", val->name,
                    s->parts, s->ranks);
  if (s->chunks < 1 || val->type.dims[s->axis] % s->chunks != 0)
    return tp_error(d, "param %%%s: axis %d of %lld elements is not %d equal chunks", val->name, s->axis,
                    (long long)val->type.dims[s->axis], s->chunks);
  if (s->pad < 0 || (s->pad > 0 && (s->chunks != 1 || s->parts != s->ranks || s->pad >= val->type.dims[s->axis])))
    return tp_error(d,
                    "param %%%s: a padding of %d on axis %d needs one chunk, one part per rank and less than "
                    "one rank's %lld",
                    val->name, s->pad, s->axis, (long long)val->type.dims[s->axis]);
  return TP_OK;
}

static int verify_value(const TpModule *m, int v, TpDiag *d) {
  const TpValue *val = &m->values[v];
  if (!val->name) return tp_error(d, "value %d has no name", v);
  if (tp_find_value(m, val->name) != v) return tp_error(d, "value name %%%s is not unique", val->name);
  if (val->dead) return tp_error(d, "value %%%s is marked dead but still in the module", val->name);
  if (val->tied != -1 && val->kind != TP_VAL_PARAM)
    return tp_error(d, "value %%%s is a tied copy but not a param", val->name);
  if (verify_type(m, v, d) || verify_shard(m, v, d)) return TP_ERR_INPUT;
  switch (val->kind) {
  case TP_VAL_INPUT: {
    int listed = 0;
    for (int i = 0; i < m->ninputs; i++) listed += m->inputs[i] == v;
    if (listed != 1) return tp_error(d, "input %%%s is listed %d times as a graph input", val->name, listed);
    return TP_OK;
  }
  case TP_VAL_PARAM:
  case TP_VAL_CONST: {
    if (val->kind == TP_VAL_PARAM && !tp_dtype_is_float(val->type.dtype))
      return tp_error(d, "param %%%s must be floating-point, not %s", val->name, tp_dtype_name(val->type.dtype));
    if (val->blob < 0 || val->blob >= m->nblobs) return tp_error(d, "value %%%s has no data", val->name);
    const TpBlob *b = &m->blobs[val->blob];
    if (val->kind == TP_VAL_CONST && tp_data_dtype(m, v) != val->type.dtype)
      return tp_error(d, "const %%%s: its data must be its type's %s", val->name, tp_dtype_name(val->type.dtype));
    int64_t numel = tp_type_numel(&val->type), along = val->shard.pad > 0 ? val->type.dims[val->shard.axis] : 0;
    if (along > 0) /* a padded vocabulary: the padding is no file's (one part of one rank may be all of it) */
      numel = numel / along * (along - val->shard.pad);
    uint64_t bytes = (uint64_t)numel * tp_dtype_size(tp_data_dtype(m, v));
    if (val->offset < 0 || (uint64_t)val->offset > b->size || bytes > b->size - (uint64_t)val->offset)
      return tp_error(d, "data of %%%s (bytes %lld..%llu) lies outside its blob of %zu bytes", val->name,
                      (long long)val->offset, (unsigned long long)(val->offset + bytes), b->size);
    if (bytes && !b->base) return tp_error(d, "value %%%s points into a blob without data", val->name);
    return TP_OK;
  }
  case TP_VAL_RESULT: {
    if (val->def < 0 || val->def >= m->nops) return tp_error(d, "result %%%s has no defining op", val->name);
    const TpOp *op = &m->ops[val->def];
    int found = 0;
    for (int i = 0; i < op->noutputs; i++) found += op->outputs[i] == v;
    if (found != 1) return tp_error(d, "result %%%s is not a result of its defining op", val->name);
    return TP_OK;
  }
  }
  return tp_error(d, "value %%%s has unknown kind %d", val->name, (int)val->kind);
}

/* After every value's own checks: a tied copy has its parameter's type and data. */
static int verify_tied(const TpModule *m, int v, TpDiag *d) {
  const TpValue *val = &m->values[v];
  int p = val->tied;
  if (p == -1) return TP_OK;
  if (p < 0 || p >= m->nvalues || p == v)
    return tp_error(d, "param %%%s is a tied copy of value %d, out of range", val->name, p);
  const TpValue *pv = &m->values[p];
  if (pv->kind != TP_VAL_PARAM)
    return tp_error(d, "param %%%s is a tied copy of %%%s, not a param", val->name, pv->name);
  if (pv->tied != -1)
    return tp_error(d, "param %%%s is a tied copy of %%%s, itself a tied copy", val->name, pv->name);
  if (!tp_type_equal(&val->type, &pv->type) || val->type.dtype != pv->type.dtype) {
    char have[256], want[256];
    return tp_error(d, "param %%%s is a tied copy of %%%s but has type %s, not %s", val->name, pv->name,
                    tp_type_str(&val->type, have, sizeof have), tp_type_str(&pv->type, want, sizeof want));
  }
  const void *a = tp_value_data(m, v), *b = tp_value_data(m, p);
  size_t bytes = (size_t)tp_type_numel(&val->type) * tp_dtype_size(val->type.dtype);
  if (a != b && memcmp(a, b, bytes) != 0)
    return tp_error(d, "param %%%s is a tied copy of %%%s but holds other data", val->name, pv->name);
  return TP_OK;
}

static const char *phase_name(TpPhase p) { return p == TP_PHASE_BACKWARD ? "backward" : "forward"; }

/* The operand and result of a boundary copy or re-tie view (arity checked before). */
static int verify_role(const TpModule *m, int o, TpDiag *d) {
  const TpOp *op = &m->ops[o];
  if (op->role == TP_ROLE_COMPUTE) return TP_OK;
  if (op->role < 0 || op->role >= TP_ROLE_COUNT) return tp_error_op(d, m, o, "unknown role %d", (int)op->role);
  if (op->role == TP_ROLE_RETIE && op->phase == TP_PHASE_BACKWARD) return TP_OK; /* what differentiates one */
  if (op->role == TP_ROLE_RECOMPUTE) {
    if (op->phase != TP_PHASE_BACKWARD)
      return tp_error_op(d, m, o, "a recomputed op must be in the backward phase: @backward @recompute");
    return TP_OK;
  }
  /* both views have one operand and one result, which verify_op checked are there */
  bool view = op->kind == TP_OP_Reshape || op->kind == TP_OP_Transpose;
  int x = view ? op->inputs[0] : -1, y = view ? op->outputs[0] : -1;
  bool same = op->kind == TP_OP_Reshape && tp_type_equal(&m->values[x].type, &m->values[y].type);
  if (op->role == TP_ROLE_BOUNDARY) {
    if (!same) return tp_error_op(d, m, o, "a boundary copy must be a Reshape to its operand's own shape");
    int from = op->phase == TP_PHASE_FORWARD ? op->stage - 1 : op->stage + 1;
    const TpValue *xv = &m->values[x];
    if (xv->kind != TP_VAL_RESULT)
      return tp_error_op(d, m, o,
                         "a %s boundary copy on stage %d must read a result of stage %d, not %%%s, which "
                         "no op computes",
                         phase_name(op->phase), op->stage, from, xv->name);
    if (m->ops[xv->def].stage != from)
      return tp_error_op(d, m, o,
                         "a %s boundary copy on stage %d must read a result of stage %d, not %%%s of stage %d",
                         phase_name(op->phase), op->stage, from, xv->name, m->ops[xv->def].stage);
    return TP_OK;
  }
  int n = 0;
  const int64_t *perm = tp_attr_ints(m, o, "perm", &n);
  bool transpose = op->kind == TP_OP_Transpose && m->values[x].type.rank == 2 && n == 2 && perm[0] == 1 &&
                   perm[1] == 0;
  if ((!same && !transpose) || m->values[x].kind != TP_VAL_PARAM)
    return tp_error_op(d, m, o,
                       "a re-tie view must be a Transpose {perm = [1, 0]} or a same-shape Reshape of a "
                       "param");
  if (!op->origin.node)
    return tp_error_op(d, m, o, "a re-tie view must name the initializer it stands for: loc(\"name\")");
  return TP_OK;
}

static int verify_placement(const TpModule *m, int o, TpDiag *d) {
  const TpOp *op = &m->ops[o];
  if (op->stage < 0 || op->slice < -1)
    return tp_error_op(d, m, o, "bad placement: stage %d, slice %d", op->stage, op->slice);
  if (op->phase != TP_PHASE_FORWARD && op->phase != TP_PHASE_BACKWARD)
    return tp_error_op(d, m, o, "unknown phase %d", (int)op->phase);
  if (op->weight && op->phase != TP_PHASE_BACKWARD)
    return tp_error_op(d, m, o, "@weight marks a backward op (a split backward's weight part): @backward @weight");
  for (int i = 0; i < op->ninputs; i++) {
    int v = op->inputs[i];
    if (v < 0 || m->values[v].kind != TP_VAL_RESULT) continue;
    if (m->ops[m->values[v].def].weight && !op->weight)
      return tp_error_op(d, m, o, "reads %%%s, a result of the weight part of a split backward, outside it",
                         m->values[v].name);
    const TpOp *def = &m->ops[m->values[v].def];
    bool ok = def->phase == TP_PHASE_FORWARD ? def->stage <= op->stage
                                             : op->phase == TP_PHASE_BACKWARD && def->stage >= op->stage;
    if (!ok)
      return tp_error_op(d, m, o, "%s op of stage %d reads %%%s, a %s result of stage %d", phase_name(op->phase),
                         op->stage, m->values[v].name, phase_name(def->phase), def->stage);
  }
  return TP_OK;
}

static int verify_training(const TpModule *m, TpDiag *d) {
  if (m->loss != -1) {
    if (m->loss < 0 || m->loss >= m->nvalues) return tp_error(d, "the loss is out of range (%d)", m->loss);
    const TpType *t = &m->values[m->loss].type;
    if (t->rank != 0 || !tp_dtype_is_float(t->dtype)) {
      char buf[256];
      return tp_error(d, "the loss %%%s must be a float scalar, not %s", m->values[m->loss].name,
                      tp_type_str(t, buf, sizeof buf));
    }
  }
  if (m->ngrads > m->nvalues)
    return tp_error(d, "the gradient map has %d entries for %d values", m->ngrads, m->nvalues);
  for (int v = 0; v < m->ngrads; v++) {
    int g = m->grads[v];
    if (g == -1) continue;
    const char *name = m->values[v].name;
    if (g < 0 || g >= m->nvalues) return tp_error(d, "the gradient of %%%s is out of range (%d)", name, g);
    if (m->values[v].kind != TP_VAL_PARAM) return tp_error(d, "%%%s has a gradient but is not a param", name);
    const TpValue *gv = &m->values[g];
    if (gv->kind == TP_VAL_INPUT || gv->kind == TP_VAL_PARAM)
      return tp_error(d, "the gradient of %%%s is %%%s, an input or param", name, gv->name);
    if (!tp_type_equal(&gv->type, &m->values[v].type)) {
      char want[256], have[256];
      return tp_error(d, "the gradient %%%s of %%%s has type %s, not %s", gv->name, name,
                      tp_type_str(&gv->type, have, sizeof have), tp_type_str(&m->values[v].type, want, sizeof want));
    }
  }
  return TP_OK;
}

static int verify_op(const TpModule *m, int o, TpDiag *d) {
  const TpOp *op = &m->ops[o];
  if (op->kind < 0 || op->kind >= TP_OP_COUNT) return tp_error(d, "op %d has unknown kind %d", o, (int)op->kind);
  if (op->dead) return tp_error_op(d, m, o, "op is marked dead but still in the module");
  const TpOpInfo *info = &tp_op_info[op->kind];
  if (op->ninputs < info->min_inputs || op->ninputs > info->max_inputs)
    return tp_error_op(d, m, o, "%s takes %d to %d operands, not %d", info->name, info->min_inputs, info->max_inputs,
                       op->ninputs);
  if (op->noutputs < info->min_outputs || op->noutputs > info->max_outputs)
    return tp_error_op(d, m, o, "%s has %d to %d results, not %d", info->name, info->min_outputs, info->max_outputs,
                       op->noutputs);
  for (int i = 0; i < op->ninputs; i++) {
    int v = op->inputs[i];
    if (v < -1 || v >= m->nvalues) return tp_error_op(d, m, o, "operand %d is out of range (%d)", i, v);
    if (v < 0) {
      if (i < info->min_inputs) return tp_error_op(d, m, o, "required operand %d is absent", i);
      continue;
    }
    if (m->values[v].kind == TP_VAL_RESULT && m->values[v].def >= o)
      return tp_error_op(d, m, o, "operand %%%s is used before its definition (a cycle?)", m->values[v].name);
  }
  for (int i = 0; i < op->noutputs; i++) {
    int v = op->outputs[i];
    if (v < -1 || v >= m->nvalues) return tp_error_op(d, m, o, "result %d is out of range (%d)", i, v);
    if (v < 0) {
      if (i < info->min_outputs) return tp_error_op(d, m, o, "required result %d is absent", i);
      continue;
    }
    if (m->values[v].kind != TP_VAL_RESULT || m->values[v].def != o)
      return tp_error_op(d, m, o, "result %%%s is defined elsewhere too", m->values[v].name);
    for (int j = 0; j < i; j++)
      if (op->outputs[j] == v) return tp_error_op(d, m, o, "result %%%s appears twice", m->values[v].name);
  }
  if (verify_attrs(m, o, d) || verify_placement(m, o, d) || verify_role(m, o, d)) return TP_ERR_INPUT;

  /* Inference checks the recorded result types but also fills in missing dim names; it
   * runs on the module itself and the result types are put back, so the module is left
   * exactly as it was. */
  TpModule *mm = (TpModule *)m;
  TpType saved[64];
  TP_ASSERT(op->noutputs <= 64);
  for (int i = 0; i < op->noutputs; i++)
    if (op->outputs[i] >= 0) saved[i] = m->values[op->outputs[i]].type;
  int rc = tp_infer_op(mm, o, d);
  for (int i = 0; i < op->noutputs; i++)
    if (op->outputs[i] >= 0) mm->values[op->outputs[i]].type = saved[i];
  return rc;
}

/* A plan that broke what the module is split into would compile and then fail at run
 * time. */
int tp_verify_split(const TpModule *m, int tensor, int nslices, TpDiag *d) {
  int first = -1;
  for (int v = 0; v < m->nvalues; v++) {
    const TpValue *val = &m->values[v];
    if (val->kind != TP_VAL_PARAM || !val->shard.parts) continue;
    if (first < 0) first = v;
    else if (val->shard.ranks != m->values[first].shard.ranks)
      return tp_error(d,
                      "param %%%s is split over %d ranks, param %%%s over %d: the params of a module split over "
                      "one tensor group",
                      val->name, val->shard.ranks, m->values[first].name, m->values[first].shard.ranks);
  }
  if (first >= 0 && tensor > 1 && m->values[first].shard.ranks != tensor)
    return tp_error(d, "param %%%s is split over %d ranks, but the module is compiled for %d tensor ranks",
                    m->values[first].name, m->values[first].shard.ranks, tensor);
  int last = -1;
  for (int o = 0; o < m->nops; o++) {
    if (m->ops[o].slice > (last >= 0 ? m->ops[last].slice : -1)) last = o;
    if (nslices > 1 && m->ops[o].slice >= nslices)
      return tp_error_op(d, m, o, "the op is in slice %d, but the module is cut into %d slices", m->ops[o].slice,
                         nslices);
  }
  if (last < 0) return TP_OK;
  /* n ops leave a slice among 0..n empty if they use more: the table need not be longer */
  int size = m->ops[last].slice + 1 <= m->nops ? m->ops[last].slice + 1 : m->nops + 1, missing = -1;
  bool *used = calloc((size_t)size, sizeof *used);
  TP_ASSERT(used);
  for (int o = 0; o < m->nops; o++)
    if (m->ops[o].slice >= 0 && m->ops[o].slice < size) used[m->ops[o].slice] = true;
  for (int k = 0; k < size && missing < 0; k++)
    if (!used[k]) missing = k;
  free(used);
  if (missing >= 0)
    return tp_error_op(d, m, last,
                       "the op is in slice %d, but no op is in slice %d: slices are numbered 0, 1, .. "
                       "without gaps",
                       m->ops[last].slice, missing);
  return TP_OK;
}

int tp_verify(const TpModule *m, TpDiag *d) {
  for (int v = 0; v < m->nvalues; v++)
    if (verify_value(m, v, d)) return TP_ERR_INPUT;
  for (int v = 0; v < m->nvalues; v++)
    if (verify_tied(m, v, d)) return TP_ERR_INPUT;
  for (int i = 0; i < m->ninputs; i++) {
    int v = m->inputs[i];
    if (v < 0 || v >= m->nvalues || m->values[v].kind != TP_VAL_INPUT)
      return tp_error(d, "graph input %d is not an input value", i);
  }
  for (int o = 0; o < m->nops; o++)
    if (verify_op(m, o, d)) return TP_ERR_INPUT;
  if (m->noutputs == 0) return tp_error(d, "the module has no outputs");
  for (int i = 0; i < m->noutputs; i++)
    if (m->outputs[i] < 0 || m->outputs[i] >= m->nvalues)
      return tp_error(d, "graph output %d is out of range (%d)", i, m->outputs[i]);
  if (tp_verify_split(m, m->tensor, m->nslices, d)) return TP_ERR_INPUT;
  return verify_training(m, d);
}
