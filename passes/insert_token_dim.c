/* insert-token-dim: requires a forward module with inferred, static types (after
 * raise-transformer; add-loss may have run, autodiff not); provides the token (sequence)
 * axis of every value, named TP_TOKEN_DIM in its type, and the guarantee that every op can
 * run slice by slice along it.
 *
 * Axes are related by positional identity: an op relates axis a of one of its values to
 * axis b of another when index t along a and index t along b are the same token, whatever
 * the data (elementwise ops align their broadcast axes, Transpose permutes, Reshape keeps
 * an axis whose extent and preceding elements are unchanged, attention relates the
 * queries' sequence axis to the keys' and values', a loss its logits' rows to its
 * targets'). The token axes are the class of the token input's second dim under these
 * relations (union-find over (value, axis)); parameters and constants join it too, e.g. a
 * [T, C] position table added to the [B, T, C] activations.
 *
 * tp_token_class then tells how each op treats the token axis (ir/ir.h TpTokenClass). An
 * op is token-global when it mixes rows: a softmax, reduction, normalisation, gather,
 * split, concat or partial slice along the token axis, a contraction over it, a result
 * with two token axes (a primitive attention's scores), a token axis that disappears (a
 * Reshape merging it with the batch), or attention that is not causal. The first
 * token-global op is an error naming the node and why: slicing would change the result.
 * tokpipec runs this pass only when slicing (or pipelining) is asked for, so a bidirectional
 * model still trains whole.
 *
 * When an op would stop the slicing, rows that merge the batch and the tokens ([B*T, C]: a
 * mixture of experts routes each token) are first given back their axes (lift_merged,
 * below), and the axes marked again. */
#include "../ir/ir.h"
#include "../ops/rules.h"

#include <stdlib.h>
#include <string.h>

/* ---- what an op does with its axes ---- */

typedef TpAxis Axis;
typedef TpOpAxes OpAxes; /* ir/ir.h: shared with passes/rebatch.c */

static const TpType *type_of(const TpModule *m, int v) { return &m->values[v].type; }

/* The axis relations of op `op` and the axes it combines elements along: its token-axes
 * rule (TpOpRules.token_axes); unknown for backward ops and ops without one. */
static void describe(const TpModule *m, int op, OpAxes *x) {
  const TpOp *o = &m->ops[op];
  void (*axes)(const TpModule *, int, TpOpAxes *) = tp_op_rules[o->kind]->token_axes;
  x->nlinks = x->nmixes = 0;
  x->unknown = false;
  if (o->phase == TP_PHASE_BACKWARD || !axes) {
    x->unknown = true;
    return;
  }
  axes(m, op, x);
}

void tp_op_axes(const TpModule *m, int op, TpOpAxes *x) { describe(m, op, x); }

/* ---- the marks ---- */

static bool is_token_name(const char *s) { return s && strcmp(s, TP_TOKEN_DIM) == 0; }

static int token_axes(const TpModule *m, int v) {
  int n = 0;
  for (int a = 0; a < type_of(m, v)->rank; a++) n += is_token_name(type_of(m, v)->dimnames[a]);
  return n;
}

static const char *node_of(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  if (o->origin.node) return o->origin.node;
  return o->noutputs && o->outputs[0] >= 0 ? m->values[o->outputs[0]].name : "?";
}

/* Why causal attention op `op` cannot run slice by slice, or NULL if it can. */
static const char *attention_problem(TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  const char *node = node_of(m, op);
  if (!tp_attr_int(m, op, "is_causal", 0)) return tp_strfmt(m, "attention at node '%s' is not causal", node);
  /* With is_causal, a mask only biases (or hides) keys the causal band allows: a position
   * bias that split-sequence cuts along its query and key dims, if the tokens do not feed it. */
  if (o->ninputs > 3 && o->inputs[3] >= 0 && tp_token_axis(m, o->inputs[3]) >= 0)
    return tp_strfmt(m,
                     "attention at node '%s' has a mask computed from the tokens (%%%s); only a position bias "
                     "the tokens do not feed can be sliced",
                     node, m->values[o->inputs[3]].name);
  for (int i = 4; i < o->ninputs; i++)
    if (o->inputs[i] >= 0) return tp_strfmt(m, "attention at node '%s' reads past keys and values", node);
  for (int i = 1; i < o->noutputs && i < 4; i++) /* present K/V or the scores; its lse is cut with Y */
    if (o->outputs[i] >= 0) return tp_strfmt(m, "attention at node '%s' returns more than its result", node);
  int q = o->inputs[0], k = o->inputs[1], r = type_of(m, q)->rank, seq = r == 4 ? 2 : 1;
  if (tp_token_axis(m, q) != seq || tp_token_axis(m, k) != seq)
    return tp_strfmt(m, "attention at node '%s' does not attend along the token axis", node);
  if (type_of(m, q)->dims[seq] + tp_attr_int(m, op, "causal_offset", 0) != type_of(m, k)->dims[seq])
    return tp_strfmt(m, "attention at node '%s' does not attend over its own tokens", node);
  return NULL;
}

/* Why the product `op` of a primitive attention's scores cannot be sliced. */
static const char *scores_why(TpModule *m, int op) {
  const char *node = node_of(m, op), *kind = tp_op_info[m->ops[op].kind].name;
  const char *unproven = m->ops[op].kind == TP_OP_MatMul ? tp_attention_unproven(m, op) : NULL;
  return tp_strfmt(m,
                   "attention at node '%s' is not causal: its scores (%s) relate every token to every other, with "
                   "no "
                   "causal mask raise-transformer could prove%s%s",
                   node, kind, unproven ? ": " : "", unproven ? unproven : "");
}

TpTokenClass tp_token_class(TpModule *m, int op, const char **why) {
  const TpOp *o = &m->ops[op];
  const char *kind = tp_op_info[o->kind].name, *node = node_of(m, op);
  *why = NULL;
  bool in_tokens = false, out_tokens = false;
  for (int i = 0; i < o->ninputs; i++) in_tokens |= o->inputs[i] >= 0 && tp_token_axis(m, o->inputs[i]) >= 0;
  for (int i = 0; i < o->noutputs; i++) out_tokens |= o->outputs[i] >= 0 && tp_token_axis(m, o->outputs[i]) >= 0;
  if (!in_tokens && !out_tokens) return TP_TOKEN_FREE;

  OpAxes *x = malloc(sizeof *x);
  TP_ASSERT(x);
  describe(m, op, x);
  TpTokenClass c = TP_TOKEN_POSITIONWISE;
  if (x->unknown) {
    *why = tp_strfmt(m, "%s at node '%s' is not known to keep tokens apart", kind, node);
    c = TP_TOKEN_GLOBAL;
  }
  for (int i = 0; i < x->nmixes && !*why; i++)
    if (tp_token_axis(m, x->mix[i].v) == x->mix[i].a)
      *why = tp_strfmt(m, "%s at node '%s' %s the token axis", kind, node, x->mix_why[i]);
  for (int i = 0; i < o->noutputs && !*why; i++) /* token x token: a primitive attention's scores */
    if (o->outputs[i] >= 0 && token_axes(m, o->outputs[i]) > 1)
      *why = o->kind == TP_OP_MatMul || o->kind == TP_OP_Gemm
                 ? scores_why(m, op)
                 : tp_strfmt(m, "%s at node '%s' mixes tokens: its result has two token axes", kind, node);
  free(x);
  if (*why) return TP_TOKEN_GLOBAL;
  if (tp_op_info[o->kind].traits & TP_TRAIT_TOKEN_REDUCING) return TP_TOKEN_REDUCING;
  if (tp_op_info[o->kind].traits & TP_TRAIT_TOKEN_PREFIX) {
    *why = attention_problem(m, op);
    return *why ? TP_TOKEN_GLOBAL : TP_TOKEN_CAUSAL_PREFIX;
  }
  if (in_tokens && !out_tokens) {
    *why = tp_strfmt(m, "%s at node '%s' does not keep the token axis (it merges or reduces it)", kind, node);
    return TP_TOKEN_GLOBAL;
  }
  return c;
}

/* ---- rows that merge the batch and the tokens ---- */

/* An export may run a block on the batch's tokens as rows: [B, T, C] -> [B*T, C], as the
 * experts of a mixture do (Mixtral, Qwen2-MoE: routing is per token). A merged value's
 * leading axis holds B*T*q rows, (b, t) outermost and q rows per token. lift_merged gives
 * every such value back its own axes, [B, T, q, ...] (q = 1: [B, T, ...]), from the
 * Reshape that merges the rows to the one that splits them again, moving the ops' axis
 * attributes; the ops compute the same numbers in the same order, and the token axis is an
 * axis again. An op it cannot carry over is refused, naming the node. */
typedef struct {
  TpModule *m;
  TpDiag *d;
  int64_t rows; /* B*T */
  int64_t B, T;
  int64_t *q; /* per value: rows per token of a merged value, 0: not merged */
} Lift;

static int shift_of(const Lift *L, int v) { return L->q[v] > 1 ? 2 : 1; }

/* The lifted form of merged type t: [B, T, q, rest] or [B, T, rest]; false if t's leading
 * axis is not whole tokens or the rank would be too large. */
static bool lifted_type(const Lift *L, const TpType *t, TpType *out, int64_t *q) {
  if (t->rank < 1 || t->dims[0] < L->rows || t->dims[0] % L->rows) return false;
  *q = t->dims[0] / L->rows;
  int s = *q > 1 ? 2 : 1;
  if (t->rank + s > TP_MAX_RANK) return false;
  *out = *t;
  out->rank = t->rank + s;
  out->dims[0] = L->B, out->dims[1] = L->T, out->dims[2] = *q;
  out->dimnames[0] = out->dimnames[1] = out->dimnames[2] = NULL;
  for (int k = 1; k < t->rank; k++) out->dims[k + s] = t->dims[k], out->dimnames[k + s] = t->dimnames[k];
  return true;
}

static int lift_refused(Lift *L, int op, const char *why) {
  const TpOp *o = &L->m->ops[op];
  return tp_error_op(L->d, L->m, op,
                     "cannot slice the sequence: %s at node '%s' reads the batch's tokens merged into rows (%%%s) "
                     "and %s",
                     tp_op_info[o->kind].name, node_of(L->m, op), L->m->values[o->inputs[0]].name, why);
}

/* Moves axis attribute `name` of op past the s axes the lift puts in front; 0 is refused. */
static int lift_axis(Lift *L, int op, const char *name, int s) {
  int64_t a = tp_attr_int(L->m, op, name, 0);
  if (a == 0) return lift_refused(L, op, "combines the rows (axis 0)");
  tp_set_attr_int(L->m, op, name, a + s);
  return TP_OK;
}

/* Op `op` reads merged values: its attributes moved, its results lifted (their types
 * inferred again and checked against the lift of the old ones). */
static int lift_op(Lift *L, int op) {
  TpModule *m = L->m;
  TpOp *o = &m->ops[op];
  int X = o->inputs[0], s = L->q[X] ? shift_of(L, X) : 0, rold = 0;
  TpType old[64]; /* Split's most results */
  TP_ASSERT(o->noutputs <= (int)(sizeof old / sizeof *old));
  for (int i = 0; i < o->noutputs; i++)
    if (o->outputs[i] >= 0) old[i] = m->values[o->outputs[i]].type;
  if (o->noutputs && o->outputs[0] >= 0) rold = old[0].rank;
  bool preset = false, elementwise = tp_op_info[o->kind].traits & TP_TRAIT_ELEMENTWISE;
  for (int i = 0; i < o->ninputs; i++) { /* a plain operand must not line up with the rows */
    int v = o->inputs[i];
    if (v < 0 || L->q[v]) continue;
    const TpType *t = type_of(m, v);
    bool aligned = elementwise               ? t->rank == rold && t->dims[0] != 1
                   : o->kind == TP_OP_MatMul ? t->rank >= 3 && t->rank >= rold && t->dims[0] != 1
                   : o->kind == TP_OP_Gather || o->kind == TP_OP_Linear || o->kind == TP_OP_RMSNorm ? false
                                                                                                    : i > 0;
    if (aligned) return lift_refused(L, op, "combines them with a value that is not merged");
  }
  switch (o->kind) {
  case TP_OP_Reshape: {
    const TpType *y = &old[0];
    if (y->rank >= 2 && y->dims[0] == L->B && y->dims[1] == L->T) return TP_OK; /* splits them again */
    preset = true;
    break;
  }
  case TP_OP_Expand:
  case TP_OP_Cast:
  case TP_OP_Split:
    preset = true;
    if (o->kind == TP_OP_Split && lift_axis(L, op, "axis", s)) return TP_ERR_INPUT;
    break;
  case TP_OP_Slice: {
    int n;
    const int64_t *starts = tp_attr_ints(m, op, "starts", &n), *steps = tp_attr_ints(m, op, "steps", &n);
    if (starts[0] != 0 || steps[0] != 1 || old[0].dims[0] != L->rows * L->q[X])
      return lift_refused(L, op, "slices the rows");
    int64_t st[TP_MAX_RANK] = {0}, sp[TP_MAX_RANK] = {1, 1, 1};
    for (int k = 1; k < n; k++) st[k + s] = starts[k], sp[k + s] = steps[k];
    tp_set_attr_ints(m, op, "starts", st, n + s), tp_set_attr_ints(m, op, "steps", sp, n + s);
    preset = true;
    break;
  }
  case TP_OP_Softmax:
  case TP_OP_LogSoftmax:
  case TP_OP_TopK:
  case TP_OP_CumSum:
  case TP_OP_Concat:
  case TP_OP_RMSNorm:
    if (lift_axis(L, op, "axis", s)) return TP_ERR_INPUT;
    break;
  case TP_OP_GatherElements:
    if (!L->q[o->inputs[1]] || L->q[o->inputs[1]] != L->q[X])
      return lift_refused(L, op, "gathers by indices of other rows");
    if (lift_axis(L, op, "axis", s)) return TP_ERR_INPUT;
    break;
  case TP_OP_Gather:
    if (L->q[X] && L->q[o->inputs[1]]) return lift_refused(L, op, "gathers by merged indices");
    if (L->q[X] && lift_axis(L, op, "axis", s)) return TP_ERR_INPUT;
    if (!L->q[X] && tp_attr_int(m, op, "axis", 0) != 0) return lift_refused(L, op, "gathers inside its rows");
    break;
  case TP_OP_ReduceSum:
  case TP_OP_ReduceMean: {
    int n;
    const int64_t *axes = tp_attr_ints(m, op, "axes", &n);
    int64_t moved[TP_MAX_RANK];
    for (int k = 0; k < n; k++) {
      if (axes[k] == 0) return lift_refused(L, op, "reduces over the rows");
      moved[k] = axes[k] + s;
    }
    tp_set_attr_ints(m, op, "axes", moved, n);
    break;
  }
  case TP_OP_Tile: {
    int n;
    const int64_t *repeats = tp_attr_ints(m, op, "repeats", &n);
    if (repeats[0] != 1) return lift_refused(L, op, "repeats the rows");
    int64_t moved[TP_MAX_RANK] = {1, 1, 1};
    for (int k = 1; k < n; k++) moved[k + s] = repeats[k];
    tp_set_attr_ints(m, op, "repeats", moved, n + s);
    break;
  }
  case TP_OP_Transpose: {
    int n;
    const int64_t *perm = tp_attr_ints(m, op, "perm", &n);
    if (perm[0] != 0) return lift_refused(L, op, "moves the rows");
    int64_t moved[TP_MAX_RANK];
    for (int k = 0; k <= s; k++) moved[k] = k;
    for (int k = 1; k < n; k++) moved[k + s] = perm[k] + s;
    tp_set_attr_ints(m, op, "perm", moved, n + s);
    break;
  }
  case TP_OP_MatMul:
    if (L->q[o->inputs[1]] && type_of(m, o->inputs[1])->rank < 3 + shift_of(L, o->inputs[1]))
      return lift_refused(L, op, "contracts over the rows");
    break;
  default:
    if (!elementwise && !(tp_op_info[o->kind].traits & TP_TRAIT_ROWWISE))
      return lift_refused(L, op, "is not known to keep them apart");
  }
  for (int i = 0; i < o->noutputs; i++) {
    int v = o->outputs[i];
    TpType want;
    int64_t q;
    if (v < 0) continue;
    if (!lifted_type(L, &old[i], &want, &q))
      return lift_refused(L, op, "gives a result whose rows are not whole tokens");
    if (preset) m->values[v].type = want;
    else m->values[v].type.dtype = TP_UNDEF;
    L->q[v] = q;
  }
  if (tp_infer_op(m, op, L->d)) return TP_ERR_INPUT;
  for (int i = 0; i < o->noutputs; i++) {
    int v = o->outputs[i];
    TpType want;
    int64_t q;
    if (v >= 0 && lifted_type(L, &old[i], &want, &q) && !tp_type_equal(&want, &m->values[v].type))
      return lift_refused(L, op, "does not compute the lifted shape");
  }
  return TP_OK;
}

/* Lifts the merged rows of a [B, T, ...] token value (tokens on axis 1) wherever a Reshape
 * merges them; *lifted tells whether any was. */
static int lift_merged(TpModule *m, TpDiag *d, int tokens, bool *lifted) {
  Lift L = {.m = m, .d = d, .B = type_of(m, tokens)->dims[0], .T = type_of(m, tokens)->dims[1]};
  L.rows = L.B * L.T;
  *lifted = false;
  if (L.rows <= 1) return TP_OK;
  L.q = calloc((size_t)m->nvalues, sizeof *L.q);
  TP_ASSERT(L.q);
  int rc = TP_OK;
  for (int op = 0; op < m->nops && !rc; op++) {
    TpOp *o = &m->ops[op];
    if (o->dead) continue;
    bool merged = false;
    for (int i = 0; i < o->ninputs; i++) merged |= o->inputs[i] >= 0 && L.q[o->inputs[i]];
    if (merged) {
      rc = lift_op(&L, op);
      continue;
    }
    int X = o->ninputs ? o->inputs[0] : -1, Y = o->noutputs ? o->outputs[0] : -1;
    if (o->kind != TP_OP_Reshape || X < 0 || Y < 0) continue;
    const TpType *x = type_of(m, X), *y = type_of(m, Y);
    TpType want;
    int64_t q;
    if (x->rank >= 2 && x->dims[0] == L.B && tp_token_axis(m, X) == 1 && tp_token_axis(m, Y) <= 0 &&
        lifted_type(&L, y, &want, &q)) { /* [B, T, ...] -> [B*T*q, ...] (B = 1: [T, ...]): now [B, T, q, ...] */
      m->values[Y].type = want;
      L.q[Y] = q;
      *lifted = true;
    }
  }
  for (int i = 0; i < m->noutputs && !rc; i++) {
    int v = m->outputs[i], def = m->values[v].def;
    if (L.q[v])
      rc = tp_error_op(d, m, def,
                       "cannot slice the sequence: %s at node '%s' gives the module's output %%%s the batch's "
                       "tokens merged into rows",
                       tp_op_info[m->ops[def].kind].name, node_of(m, def), m->values[v].name);
  }
  free(L.q);
  return rc;
}

/* ---- the pass ---- */

/* Is v read as the labels of a loss? */
static bool is_labels(const TpModule *m, int v) {
  for (int op = 0; op < m->nops; op++)
    if (!m->ops[op].dead && (tp_op_info[m->ops[op].kind].traits & TP_TRAIT_TOKEN_REDUCING) &&
        m->ops[op].inputs[1] == v)
      return true;
  return false;
}

int tp_token_input(const TpModule *m) {
  int first = -1;
  for (int i = 0; i < m->ninputs; i++) {
    int v = m->inputs[i];
    const TpType *t = type_of(m, v);
    if (t->rank != 2 || (t->dtype != TP_I64 && t->dtype != TP_I32) || is_labels(m, v)) continue;
    for (int op = 0; op < m->nops; op++) /* the ids of an embedding */
      if (!m->ops[op].dead && m->ops[op].ninputs > 1 && m->ops[op].inputs[1] == v &&
          (m->ops[op].kind == TP_OP_Embedding || m->ops[op].kind == TP_OP_Gather))
        return v;
    if (first < 0) first = v;
  }
  return first;
}

/* Names TP_TOKEN_DIM the axes in the class of the token input's second dim. */
static void mark_tokens(TpModule *m, int tokens) {
  int n = m->nvalues * TP_MAX_RANK;
  int *parent = malloc((size_t)n * sizeof *parent);
  OpAxes *x = malloc(sizeof *x);
  TP_ASSERT(parent && x);
  for (int i = 0; i < n; i++) parent[i] = i;
  for (int op = 0; op < m->nops; op++) {
    if (m->ops[op].dead) continue;
    describe(m, op, x);
    for (int i = 0; i < x->nlinks; i++) {
      Axis p = x->link[i][0], q = x->link[i][1];
      parent[tp_axis_class(parent, p.v * TP_MAX_RANK + p.a)] = tp_axis_class(parent, q.v * TP_MAX_RANK + q.a);
    }
  }
  int root = tp_axis_class(parent, tokens * TP_MAX_RANK + 1);
  const char *name = tp_strdup(m, TP_TOKEN_DIM);
  for (int v = 0; v < m->nvalues; v++) {
    TpType *t = &m->values[v].type;
    for (int a = 0; a < t->rank; a++) {
      if (tp_axis_class(parent, v * TP_MAX_RANK + a) == root) t->dimnames[a] = name;
      else if (is_token_name(t->dimnames[a])) t->dimnames[a] = NULL; /* the name is reserved */
    }
  }
  free(parent);
  free(x);
}

int pass_insert_token_dim(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  for (int op = 0; op < m->nops; op++)
    if (m->ops[op].phase == TP_PHASE_BACKWARD)
      return tp_error(d, "insert-token-dim marks the forward module: run it before autodiff");
  pass_dce(m, opt, d); /* what raising left behind (the primitive attention) is not computed */
  int tokens = tp_token_input(m);
  if (tokens < 0) return tp_error(d, "cannot slice the sequence: no graph input is integer [batch, seq] token ids");
  for (int v = 0; v < m->nvalues; v++)
    for (int a = 0; a < type_of(m, v)->rank; a++)
      if (type_of(m, v)->dims[a] < 0)
        return tp_error(d,
                        "cannot slice the sequence: %%%s has an unknown dimension (fix it with --dim, --batch or "
                        "--seq)",
                        m->values[v].name);

  bool lifted = false, global = false;
  mark_tokens(m, tokens);
  for (int op = 0; op < m->nops && !global; op++) {
    const char *why;
    global = !m->ops[op].dead && tp_token_class(m, op, &why) == TP_TOKEN_GLOBAL;
  }
  if (global && lift_merged(m, d, tokens, &lifted)) return TP_ERR_INPUT; /* only where the rows stop it */
  if (lifted) mark_tokens(m, tokens);

  for (int op = 0; op < m->nops; op++) {
    const char *why;
    if (!m->ops[op].dead && tp_token_class(m, op, &why) == TP_TOKEN_GLOBAL)
      return tp_error_op(d, m, op, "cannot slice the sequence: %s", why);
  }
  return TP_OK;
}
