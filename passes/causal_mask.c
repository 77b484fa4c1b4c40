/* The causal-mask prover (causal_mask.h): causal self-attention proven from its mask.
 *
 * Anchored at a Softmax over the keys of [B, H, T, T] scores (or [B*H, T, T] ones, as
 * baddbmm exports them; or, with the heads inside the queries, [B, T, H, T] and
 * [B, T*H, T]). Back from it runs the score chain down to the product Q K^T (a MatMul):
 * reshapes between the 3-D and 4-D forms (no-op casts are gone already), and
 * elementwise ops whose other operands are constant data (Mul or Div by positive factors,
 * Add, Sub, Max clamps at the float minimum, Where). The chain is evaluated at every score
 * position (once per distinct chain: see "proofs already made") as an abstract value: alpha * s + beta of the product s, or masked (at most
 * beta, whatever s is). It is causal when the masked values are so low that the softmax
 * gives them weight exactly 0, the masked positions are exactly the keys after the query
 * (and, with a sliding window of W keys, those W or more before it), and alpha is one
 * constant (the scale); beta at the visible positions is an additive bias (ALiBi). Gemma 2's
 * soft-cap c * tanh(s / c) (Div by c, or Mul by 1 / c, then Tanh, then Mul by c; c a
 * positive scalar constant) may sit between the scales and the masks: it is one step of the
 * chain, which only scales (Mul, Div) may precede and only masks and biases may follow, as
 * Attention computes mask(softcap(scale * Q K^T)). It leaves alpha alone (the proof is about
 * the masks, and alpha before it is Attention's scale). Forward from the Softmax, reshapes
 * lead to MatMul(probabilities, V). Each failure returns why, which tp_attention_unproven
 * gives insert-token-dim's refusal.
 *
 * An imported Attention with a mask operand (tp_prove_causal_mask) is proven the same way,
 * from the mask's values alone. */
#include "causal_mask.h"
#include "match.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../interp/interp.h"

/* The lowest finite value of dt: exporters mask with it (finfo.min) or with -inf. */
static double lowest(TpDType dt) {
  switch (dt) {
  case TP_F16: return -65504.0;
  case TP_BF16: return -3.3895313892515355e38;
  case TP_F64: return -DBL_MAX;
  default: return -FLT_MAX;
  }
}

/* A mask constant may be as large as [T, T] f32 at T = 16384; the proof runs over at most
 * SCORES_MAX score positions (one [T, T] mask at T = 16384), one at a time. */
enum { EVAL_DEPTH = 8 };
static const int64_t EVAL_MAX_BYTES = (int64_t)1 << 30, SCORES_MAX = (int64_t)1 << 28;

/* v depends on constant data alone: CONST or PARAM leaves, at most `depth` small ops deep. */
static bool computable(const TpModule *m, int v, int depth) {
  const TpValue *val = &m->values[v];
  if (tp_type_numel(&val->type) * (int64_t)tp_dtype_size(val->type.dtype) > EVAL_MAX_BYTES) return false;
  if (val->kind == TP_VAL_CONST || val->kind == TP_VAL_PARAM) return true;
  if (val->kind != TP_VAL_RESULT || depth == 0) return false;
  const TpOp *op = &m->ops[val->def];
  if (op->dead || op->noutputs != 1 || op->ninputs > 8) return false;
  for (int i = 0; i < op->ninputs; i++)
    if (op->inputs[i] >= 0 && !computable(m, op->inputs[i], depth - 1)) return false;
  return true;
}

/* A parameter that computable v reads (the first found), or -1. */
static int param_leaf(const TpModule *m, int v, int depth) {
  const TpValue *val = &m->values[v];
  if (val->kind == TP_VAL_PARAM) return v;
  if (val->kind != TP_VAL_RESULT || depth == 0) return -1;
  const TpOp *op = &m->ops[val->def];
  for (int i = 0, p; i < op->ninputs; i++)
    if (op->inputs[i] >= 0 && (p = param_leaf(m, op->inputs[i], depth - 1)) >= 0) return p;
  return -1;
}

/* The data of v when it is computable: e.g. a mask that an export without constant folding
 * computes from a float buffer (Slice(causal) == 0). The caller frees t->data. */
static bool evaluate(const TpModule *m, int v, int depth, TpTensor *t) {
  *t = tp_value_tensor(m, v);
  const void *src = t->data;
  t->data = NULL;
  if (!computable(m, v, depth)) return false;
  const TpValue *val = &m->values[v];
  size_t bytes = tp_tensor_bytes(t);
  void *data = malloc(bytes + 1);
  TP_ASSERT(data);
  if (val->kind != TP_VAL_RESULT) {
    memcpy(data, src, bytes);
    t->data = data;
    return true;
  }
  const TpOp *op = &m->ops[val->def];
  TpTensor ins[8] = {{0}};
  bool ok = true;
  for (int i = 0; i < op->ninputs && ok; i++)
    if (op->inputs[i] >= 0) ok = evaluate(m, op->inputs[i], depth - 1, &ins[i]);
  TpDiag quiet;
  tp_diag_init(&quiet, "", NULL, NULL);
  t->data = data;
  ok = ok && tp_exec_op(m, val->def, ins, t, &quiet) == TP_OK;
  for (int i = 0; i < op->ninputs; i++) free(ins[i].data);
  if (!ok) {
    free(data);
    t->data = NULL;
  }
  return ok;
}

static const char *node_name(const TpModule *m, int o) {
  return m->ops[o].origin.node ? m->ops[o].origin.node : m->values[out(m, o)].name;
}

enum { BATCH = 1, HEADS = 2, QUERY = 4, KEY = 8 };

/* What each axis of the scores' rank-`rank` form indexes (BATCH | HEADS: b * H + h). */
static const unsigned *axis_roles(const TpScoreChain *c, int rank) {
  static const unsigned outer4[] = {BATCH, HEADS, QUERY, KEY}, outer3[] = {BATCH | HEADS, QUERY, KEY};
  static const unsigned inner4[] = {BATCH, QUERY, HEADS, KEY}, inner3[] = {BATCH, QUERY | HEADS, KEY};
  return c->inner ? (rank == 4 ? inner4 : inner3) : (rank == 4 ? outer4 : outer3);
}

/* t is a form of the scores; the first that shows B and H fixes them. */
static bool score_type(TpScoreChain *c, const TpType *t) {
  if (t->dtype != c->dt || t->rank < 3 || t->rank > 4 || t->dims[t->rank - 1] != c->T) return false;
  const unsigned *role = axis_roles(c, t->rank);
  int64_t b = 1, h = 1;
  for (int a = 0; a < t->rank - 1; a++) {
    int64_t n = t->dims[a];
    if (role[a] & QUERY) {
      if (n % c->T) return false;
      n /= c->T;
    }
    if (role[a] == (BATCH | HEADS)) {
      if (n != c->BH) return false;
      continue; /* shows neither alone */
    }
    if (role[a] & BATCH) b = n;
    else if (role[a] & HEADS) h = n;
    else if (n != 1) return false;
  }
  if (t->rank == 3 && !c->inner) return true;
  if (b * h != c->BH) return false;
  if (!c->H) c->B = b, c->H = h;
  return b == c->B && h == c->H;
}

/* The operand of elementwise op o that carries the scores (same type as the result, not
 * computable), the others being constant data; -1 with *why set if there is none. */
static int score_operand(TpModule *m, int o, const char **why) {
  const TpOp *op = &m->ops[o];
  bool first_only = op->kind == TP_OP_Sub || op->kind == TP_OP_Div; /* c - s, c / s are not affine in s */
  int first = op->kind == TP_OP_Where ? 1 : 0, last = first_only ? 0 : op->ninputs - 1, slot = -1;
  for (int i = first; i <= last && slot < 0; i++)
    if (tp_type_equal(type(m, in(m, o, i)), type(m, out(m, o))) && !computable(m, in(m, o, i), EVAL_DEPTH)) slot = i;
  for (int i = 0; i < op->ninputs && slot >= 0; i++)
    if (i != slot && !computable(m, in(m, o, i), EVAL_DEPTH)) {
      *why = tp_strfmt(m, "%s at node '%s' combines the scores with a value known only at run time",
                       tp_op_info[op->kind].name, node_name(m, o));
      return -1;
    }
  if (slot < 0)
    *why = tp_strfmt(m, "%s at node '%s' does not take the scores %s", tp_op_info[op->kind].name, node_name(m, o),
                     first_only ? "as its first operand, unbroadcast" : "unbroadcast");
  return slot;
}

/* The soft-cap c of op `op` (naming it): a float scalar CONST, positive and finite; NULL, or
 * why not. A parameter would train (raised into Attention's attribute, it would not). */
static const char *cap_constant(TpModule *m, int op, int v, double *c) {
  const char *kind = tp_op_info[m->ops[op].kind].name, *node = node_name(m, op);
  if (m->values[v].kind == TP_VAL_PARAM)
    return tp_strfmt(m, "%s at node '%s' soft-caps the scores by the parameter %%%s, which trains (raised, it would not)",
                     kind, node, m->values[v].name);
  if (m->values[v].kind != TP_VAL_CONST || !scalar(m, v, c))
    return tp_strfmt(m, "%s at node '%s' soft-caps the scores by %%%s, not a constant scalar", kind, node,
                     m->values[v].name);
  if (!(*c > 0) || isinf(*c))
    return tp_strfmt(m, "%s at node '%s' soft-caps the scores at %g, not a positive cap", kind, node, *c);
  return NULL;
}

/* Op o of the score chain as Gemma 2's soft-cap: o = Mul(Tanh(Div(u, c) or Mul(u, 1 / c)), c)
 * in either operand order, u the scores (unbroadcast). 0 if no operand of o is a Tanh; 1 if
 * it is the soft-cap (*u, *slot: the Tanh's operand of o, *c); -1 if a Tanh feeds o but the
 * rest is not a soft-cap (*why). */
static int soft_cap(TpModule *m, int o, int *u, int *slot, double *c, const char **why) {
  int t = -1;
  for (int i = 0; i < 2 && t < 0; i++)
    if ((t = def_of(m, in(m, o, i), TP_OP_Tanh)) >= 0) *slot = i;
  if (t < 0 || !tp_type_equal(type(m, out(m, t)), type(m, out(m, o)))) return 0;
  if ((*why = cap_constant(m, o, in(m, o, 1 - *slot), c))) return -1;
  int div = def_of(m, in(m, t, 0), TP_OP_Div), mul = def_of(m, in(m, t, 0), TP_OP_Mul), first = div >= 0 ? div : mul;
  double k = 0;
  *u = -1;
  if (div >= 0) *u = in(m, div, 0);
  for (int i = 0; mul >= 0 && i < 2 && *u < 0; i++)
    if (tp_type_equal(type(m, in(m, mul, i)), type(m, out(m, t)))) *u = in(m, mul, i);
  if (*u < 0 || !tp_type_equal(type(m, *u), type(m, out(m, t)))) {
    *why =
        tp_strfmt(m,
                  "Tanh at node '%s' does not take the scores divided by the cap %g (a soft-cap is tanh(s / c) * c)",
                  node_name(m, t), *c);
    return -1;
  }
  if ((*why = cap_constant(m, first, div >= 0 ? in(m, div, 1) : other(m, mul, *u), &k))) return -1;
  bool same = div >= 0 ? k == *c : fabs(k * *c - 1) <= 1e-6;
  if (!same)
    *why =
        tp_strfmt(m,
                  "Mul at node '%s' multiplies the soft-capped scores by %g, not the cap %g that %s at node '%s' %s",
                  node_name(m, o), *c, div >= 0 ? k : 1 / k, div >= 0 ? "Div" : "Mul", node_name(m, first),
                  div >= 0 ? "divides them by" : "scales them by the inverse of");
  return same ? 1 : -1;
}

/* The order a soft-cap needs in chain c (in forward order): scales and reshapes before it,
 * no scale after it; NULL, or why not. */
static const char *cap_order(TpModule *m, const TpScoreChain *c) {
  int at = -1;
  for (int s = 0; s < c->nsteps; s++)
    if (c->steps[s] == c->cap) at = s;
  for (int s = 0; s < c->nsteps; s++) {
    int o = c->steps[s];
    TpOpKind kind = m->ops[o].kind;
    bool scale = kind == TP_OP_Mul || kind == TP_OP_Div;
    if (s < at && !scale && kind != TP_OP_Reshape)
      return tp_strfmt(m,
                       "%s at node '%s' comes before the soft-cap at node '%s': only scales may (a mask must follow "
                       "it)",
                       tp_op_info[kind].name, node_name(m, o), node_name(m, c->cap));
    if (s > at && scale)
      return tp_strfmt(m,
                       "%s at node '%s' scales the soft-capped scores of node '%s': only masks may follow the "
                       "soft-cap",
                       tp_op_info[kind].name, node_name(m, o), node_name(m, c->cap));
  }
  return NULL;
}

/* The score chain back from Softmax sm to the product Q K^T: NULL, or why there is none. */
static const char *score_chain(TpModule *m, int sm, TpScoreChain *c) {
  int x = in(m, sm, 0);
  const TpType *t = type(m, x);
  *c = (TpScoreChain){.softmax = sm, .product = -1, .pv = -1, .cap = -1, .dt = t->dtype};
  if (t->rank < 3 || t->rank > 4 || tp_attr_int(m, sm, "axis", -1) != t->rank - 1 || !is_float(m, x))
    return tp_strfmt(m, "Softmax at node '%s' does not normalise the last axis of 3-D or 4-D scores",
                     node_name(m, sm));
  c->T = t->dims[t->rank - 1];
  c->BH = c->T ? tp_type_numel(t) / (c->T * c->T) : 0;
  c->inner = t->dims[t->rank - 2] != c->T;
  for (;;) {
    if (!score_type(c, type(m, x)) || c->BH == 0)
      return tp_strfmt(m, "the scores %%%s are not [B, H, %lld, %lld] or [B*H, %lld, %lld]", m->values[x].name,
                       (long long)c->T, (long long)c->T, (long long)c->T, (long long)c->T);
    int o = m->values[x].kind == TP_VAL_RESULT ? m->values[x].def : -1, slot = 0;
    if (o < 0 || m->ops[o].dead)
      return tp_strfmt(m, "the scores %%%s are not computed by a product", m->values[x].name);
    const char *kind = tp_op_info[m->ops[o].kind].name, *why = NULL;
    switch (m->ops[o].kind) {
    case TP_OP_MatMul:
      c->product = o;
      for (int i = 0, j = c->nsteps - 1; i < j; i++, j--) { /* forward order */
        int s = c->steps[i], k = c->slot[i];
        c->steps[i] = c->steps[j], c->slot[i] = c->slot[j];
        c->steps[j] = s, c->slot[j] = k;
      }
      if (!c->H) c->B = c->BH, c->H = 1; /* 3-D throughout: one head per batch row */
      return c->cap >= 0 ? cap_order(m, c) : NULL;
    case TP_OP_Reshape: break; /* its operand's shape is checked next round */
    case TP_OP_Mul: {
      int u, cap = soft_cap(m, o, &u, &slot, &c->softcap, &why);
      if (cap < 0) return why;
      if (cap == 0) {
        if ((slot = score_operand(m, o, &why)) < 0) return why;
        break;
      }
      if (c->cap >= 0)
        return tp_strfmt(m, "the scores are soft-capped twice, at nodes '%s' and '%s'", node_name(m, o),
                         node_name(m, c->cap));
      if (c->nsteps == TP_SCORE_CHAIN_MAX) break; /* refused below */
      c->cap = o;
      c->steps[c->nsteps] = o;
      c->slot[c->nsteps++] = slot;
      x = u; /* past the Tanh and the division */
      continue;
    }
    case TP_OP_Tanh:
      return tp_strfmt(m,
                       "Tanh at node '%s' in the score chain is not a soft-cap: its result is not multiplied by the "
                       "cap "
                       "(tanh(s / c) * c)",
                       node_name(m, o));
    case TP_OP_Add:
    case TP_OP_Sub:
    case TP_OP_Div:
    case TP_OP_Max:
    case TP_OP_Where:
      if ((slot = score_operand(m, o, &why)) < 0) return why;
      break;
    default: return tp_strfmt(m, "%s at node '%s' in the score chain is not understood", kind, node_name(m, o));
    }
    if (c->nsteps == TP_SCORE_CHAIN_MAX)
      return tp_strfmt(m, "the score chain before Softmax at node '%s' is longer than %d ops", node_name(m, sm),
                       TP_SCORE_CHAIN_MAX);
    c->steps[c->nsteps] = o;
    c->slot[c->nsteps++] = slot;
    x = in(m, o, slot);
  }
}

/* One score position after the chain: alpha * s + beta, or masked: at most beta. */
typedef struct {
  double alpha, beta;
  bool masked;
} Score;

/* The scores of every position, [nb, nh, T, T], computed one position at a time from the
 * chain's constants (a frame of them all would take 24 bytes a position): nb is 1 unless a
 * constant varies along the batch (then B), nh likewise along the heads. */
typedef struct {
  int64_t nb, nh;
  TpTensor k[TP_SCORE_CHAIN_MAX][2];    /* each step's constant operands (Where: condition, fill) */
  int64_t at[TP_SCORE_CHAIN_MAX][2][4]; /* and where each holds a position's element (offsets) */
} Frame;

static void frame_free(Frame *f) {
  for (int s = 0; s < TP_SCORE_CHAIN_MAX; s++) free(f->k[s][0].data), free(f->k[s][1].data);
}

/* Where constant k, broadcast to result type r (a form of the scores), holds its element at
 * score position (b, h, i, j): at offset b*o[0] + h*o[1] + i*o[2] + j*o[3] (an axis of both
 * the batch and heads indexes b * H + h; of the queries and heads, i * H + h). Computed once
 * per constant, so the proof does not decompose offsets at each of its positions. */
static void offsets(const TpScoreChain *c, const TpTensor *k, const TpType *r, int64_t o[4]) {
  const unsigned *role = axis_roles(c, r->rank);
  o[0] = o[1] = o[2] = o[3] = 0;
  int64_t step = 1;
  for (int a = k->rank - 1; a >= 0; step *= k->dims[a], a--) {
    unsigned ra = role[a + r->rank - k->rank];
    if (k->dims[a] == 1) continue; /* broadcast */
    if (ra & BATCH) o[0] += ra & HEADS ? step * c->H : step;
    if (ra & QUERY) o[2] += ra & HEADS ? step * c->H : step;
    if (ra & HEADS) o[1] += step;
    if (ra & KEY) o[3] += step;
  }
}

/* Whether every slice of k along axis a holds the same data as the first. */
static bool same_along(const TpTensor *k, int a) {
  size_t inner = tp_dtype_size(k->dtype), outer = 1;
  for (int i = a + 1; i < k->rank; i++) inner *= (size_t)k->dims[i];
  for (int i = 0; i < a; i++) outer *= (size_t)k->dims[i];
  const char *data = k->data;
  for (size_t o = 0; o < outer; o++)
    for (int64_t x = 1; x < k->dims[a]; x++)
      if (memcmp(data + (o * (size_t)k->dims[a] + (size_t)x) * inner, data + o * (size_t)k->dims[a] * inner, inner))
        return false;
  return true;
}

/* Whether constant k (broadcast to r) varies along the batch or the heads (a folded mask
 * [B, 1, T, T] that repeats one [T, T] does not). */
static void varies(const TpScoreChain *c, const TpTensor *k, const TpType *r, bool *batch, bool *heads) {
  const unsigned *role = axis_roles(c, r->rank);
  for (int a = 0; a < k->rank; a++) {
    unsigned ra = role[a + r->rank - k->rank];
    if (k->dims[a] == 1 || !(ra & (BATCH | HEADS)) || same_along(k, a)) continue;
    *batch |= ra & BATCH;
    *heads |= ra & HEADS;
  }
}

/* Score position p after step o, whose constant operands hold k (and, for Where, the
 * condition c); NULL, or why the step does not keep the scores' meaning. */
static const char *transfer(TpModule *m, int o, int slot, double k, double c, Score *p) {
  const char *kind = tp_op_info[m->ops[o].kind].name, *node = node_name(m, o);
  double low = lowest(type(m, out(m, o))->dtype);
  switch (m->ops[o].kind) {
  case TP_OP_Sub: k = -k; /* fallthrough */
  case TP_OP_Add:
    if (isnan(k) || k == INFINITY) return tp_strfmt(m, "%s at node '%s' adds %g to the scores", kind, node, k);
    if (k <= low && !p->masked) p->masked = true, p->beta = k;
    else p->beta += k;
    return NULL;
  case TP_OP_Div: k = 1 / k; /* fallthrough */
  case TP_OP_Mul:
    if (!(k > 0) || isinf(k)) return tp_strfmt(m, "%s at node '%s' scales the scores by %g", kind, node, k);
    p->alpha *= k, p->beta *= k;
    return NULL;
  case TP_OP_Max: /* max(x, finfo.min) is x for every finite x */
    if (!(k <= low))
      return tp_strfmt(m, "Max at node '%s' clamps the scores at %g, above the float minimum", node, k);
    if (p->masked) p->beta = fmax(p->beta, k);
    return NULL;
  case TP_OP_Where:
    if ((c != 0) == (slot == 1)) return NULL; /* keeps the score */
    if (!(k <= low))
      return tp_strfmt(m, "Where at node '%s' puts %g in place of scores, not the float minimum", node, k);
    p->masked = true, p->beta = k;
    return NULL;
  default: return tp_strfmt(m, "%s at node '%s' in the score chain is not understood", kind, node);
  }
}

/* The indices (b, h, i, j) of score position p, row-major over frame f. */
static void position(const TpScoreChain *c, const Frame *f, int64_t p, int64_t pos[4]) {
  int64_t T = c->T;
  pos[0] = p / (T * T * f->nh), pos[1] = p / (T * T) % f->nh, pos[2] = p / T % T, pos[3] = p % T;
}

/* Score position pos after chain step s; NULL, or why the step
 * does not keep the scores' meaning (which depends on the step's constants alone). */
static const char *step_at(TpModule *m, const TpScoreChain *c, const Frame *f, int s, const int64_t pos[4],
                           Score *score) {
  int o = c->steps[s];
  bool where = m->ops[o].kind == TP_OP_Where;
  if (!f->k[s][where].data || o == c->cap) return NULL; /* a reshape; the soft-cap keeps alpha */
  double k[2] = {0, 0};                                 /* the constants' elements there (Where: condition, fill) */
  for (int n = 0; n <= where; n++) {
    const int64_t *at = f->at[s][n];
    k[n] = tp_tensor_get_f64(&f->k[s][n], pos[0] * at[0] + pos[1] * at[1] + pos[2] * at[2] + pos[3] * at[3]);
  }
  return transfer(m, o, c->slot[s], k[where], where ? k[0] : 0, score);
}

/* Score position p after the whole chain, which evaluate_chain has checked. */
static Score score_at(TpModule *m, const TpScoreChain *c, const Frame *f, int64_t p) {
  Score score = {.alpha = 1};
  int64_t pos[4];
  position(c, f, p, pos);
  for (int s = 0; s < c->nsteps; s++) step_at(m, c, f, s, pos, &score);
  return score;
}

static int64_t frame_size(const TpScoreChain *c, const Frame *f) { return f->nb * f->nh * c->T * c->T; }

/* Evaluates the chain's constants into the frame; NULL, or why one cannot be evaluated.
 * The caller frees the frame (frame_free). */
static const char *evaluate_chain(TpModule *m, const TpScoreChain *c, Frame *f) {
  const char *why = NULL;
  bool batch = false, heads = false;
  memset(f, 0, sizeof *f);
  for (int s = 0; s < c->nsteps && !why; s++) {
    const TpOp *op = &m->ops[c->steps[s]];
    for (int i = 0, n = 0; i < op->ninputs && !why; i++) {
      if (i == c->slot[s] || n == 2) continue;
      if (!evaluate(m, op->inputs[i], EVAL_DEPTH, &f->k[s][n]))
        why = tp_strfmt(m, "the constant %%%s of the score chain cannot be evaluated",
                        m->values[op->inputs[i]].name);
      else {
        varies(c, &f->k[s][n], type(m, op->outputs[0]), &batch, &heads);
        offsets(c, &f->k[s][n], type(m, op->outputs[0]), f->at[s][n]);
        n++;
      }
    }
  }
  f->nb = batch ? c->B : 1, f->nh = heads ? c->H : 1;
  return why;
}

/* A parameter that a constant operand of chain step s reads, or -1. */
static int step_param(const TpModule *m, const TpScoreChain *c, int s) {
  const TpOp *op = &m->ops[c->steps[s]];
  int param = -1;
  for (int i = 0; i < op->ninputs && param < 0; i++)
    if (i != c->slot[s]) param = param_leaf(m, op->inputs[i], EVAL_DEPTH);
  return param;
}

/* Checks every step of the chain at every position of frame f (evaluate_chain filled it);
 * NULL, or why the chain cannot be followed. */
static const char *check_steps(TpModule *m, const TpScoreChain *c, const Frame *f) {
  const char *why = NULL;
  int64_t n = frame_size(c, f);
  if (n > SCORES_MAX)
    why = tp_strfmt(m, "its mask has %lld positions, more than the %lld raise-transformer checks", (long long)n,
                    (long long)SCORES_MAX);
  /* A parameter may mask (a float buffer the export made an initializer); one that scales
   * or shifts visible scores would be frozen into the attention, and is trained instead. */
  for (int s = 0; s < c->nsteps && !why; s++) {
    const TpOp *op = &m->ops[c->steps[s]];
    int param = step_param(m, c, s);
    for (int64_t p = 0; p < n && !why; p++) {
      Score one = {.alpha = 1};
      int64_t pos[4];
      position(c, f, p, pos);
      why = step_at(m, c, f, s, pos, &one);
      if (!why && param >= 0 && (one.alpha != 1 || (!one.masked && one.beta != 0)))
        why = tp_strfmt(m,
                        "%s at node '%s' %s the scores by the parameter %%%s, which trains (raised, it would not)",
                        tp_op_info[op->kind].name, node_name(m, c->steps[s]), one.alpha != 1 ? "scales" : "shifts",
                        m->values[param].name);
    }
  }
  return why;
}

/* "query i" of frame position p, naming its batch row and head where the frame has them. */
static const char *query_at(TpModule *m, const Frame *f, int64_t T, int64_t p) {
  const char *at = tp_strfmt(m, "query %lld", (long long)(p / T % T));
  if (f->nb > 1) at = tp_strfmt(m, "%s of batch row %lld", at, (long long)(p / (T * T * f->nh)));
  if (f->nh > 1) at = tp_strfmt(m, "%s in head %lld", at, (long long)(p / (T * T) % f->nh));
  return at;
}

/* Whether every score is proven causal (see the section's comment); NULL, or why not. */
static const char *prove(TpModule *m, const TpScoreChain *c, const Frame *f, TpCausalProof *pr) {
  int64_t T = c->T, n = frame_size(c, f), seen = 0;
  /* A masked score must leave exp() exactly 0 beside any visible score: a float32 finfo.min
   * scaled by up to 1e-6 does (-3.4e32), and so does anything at or below -1e4 (exp(-1e4)
   * underflows in every float type); float16's finfo.min scaled down further does not. */
  double bound = fmin(lowest(c->dt) * 1e-6, -1e4);
  for (int64_t j = 0; j < T; j++) seen += !score_at(m, c, f, (T - 1) * T + j).masked;
  *pr = (TpCausalProof){.window = seen < T ? seen : 0, .softcap = c->cap >= 0 ? c->softcap : 0};
  bool touched = false; /* by a mask or a bias */
  for (int64_t p = 0; p < n && !touched; p++) {
    Score s = score_at(m, c, f, p);
    touched = s.masked || s.beta != 0;
  }
  if (!touched && T > 1) return "nothing masks its scores: every query sees every key";
  bool have_scale = false;
  for (int64_t p = 0; p < n; p++) {
    Score score = score_at(m, c, f, p);
    const Score *s = &score;
    long long j = p % T, i = p / T % T;
    bool want = j <= i && (pr->window == 0 || j > i - pr->window);
    if (s->masked && want)
      return tp_strfmt(m, "its mask hides key %lld from %s, which is not after it%s", j, query_at(m, f, T, p),
                       pr->window ? " nor outside the sliding window" : "");
    if (!s->masked && j > i)
      return tp_strfmt(m, "its mask lets %s see key %lld after it%s", query_at(m, f, T, p), j,
                       s->beta ? tp_strfmt(m, " (adds %g there, not the float minimum)", s->beta) : "");
    if (!s->masked && !want)
      return tp_strfmt(m,
                       "its mask lets %s see key %lld, outside the sliding window of %lld keys its last query has",
                       query_at(m, f, T, p), j, (long long)pr->window);
    if (s->masked && !(s->beta <= bound))
      return tp_strfmt(m, "it masks key %lld of %s with %g, which may keep weight in the softmax", j,
                       query_at(m, f, T, p), s->beta);
    if (s->masked) continue;
    if (have_scale && s->alpha != pr->scale)
      return tp_strfmt(m, "it scales the scores by %g at key %lld of %s but by %g elsewhere", s->alpha, j,
                       query_at(m, f, T, p), pr->scale);
    pr->scale = s->alpha, have_scale = true;
    pr->biased |= s->beta != 0;
  }
  return NULL;
}

/* Collapses axis a of the bias b (dims d, row-major; NaN where masked) to 1 when each fibre
 * along it holds one value at its visible positions (masked ones are free). */
static void collapse(float *b, int64_t d[4], int a) {
  int64_t inner = 1, outer = 1;
  for (int k = a + 1; k < 4; k++) inner *= d[k];
  for (int k = 0; k < a; k++) outer *= d[k];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      float first = NAN;
      for (int64_t x = 0; x < d[a]; x++) {
        float e = b[(o * d[a] + x) * inner + i];
        if (isnan(e)) continue;
        if (!isnan(first) && e != first) return;
        first = e;
      }
    }
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      float keep = NAN;
      for (int64_t x = 0; x < d[a] && isnan(keep); x++) keep = b[(o * d[a] + x) * inner + i];
      b[o * inner + i] = keep;
    }
  d[a] = 1;
}

/* The additive bias at the visible positions as a constant [nb|1, nh|1, T|1, T] (0 where
 * masked: the attention masks those itself); -1 if the scores are not f32. */
static int make_bias(TpModule *m, const TpScoreChain *c, const Frame *f, TpOrigin at) {
  if (c->dt != TP_F32) return -1;
  int64_t d[4] = {f->nb, f->nh, c->T, c->T}, n = frame_size(c, f);
  float *data = malloc((size_t)n * sizeof *data + 1);
  TP_ASSERT(data);
  for (int64_t p = 0; p < n; p++) {
    Score s = score_at(m, c, f, p);
    data[p] = s.masked ? NAN : (float)s.beta;
  }
  collapse(data, d, 2);
  collapse(data, d, 0);
  collapse(data, d, 1);
  n = d[0] * d[1] * d[2] * d[3];
  for (int64_t p = 0; p < n; p++)
    if (isnan(data[p])) data[p] = 0;
  char name[300];
  snprintf(name, sizeof name, "%s.bias", m->values[out(m, c->pv)].name);
  int v = tp_add_const(m, tp_unique_name(m, name), tp_type_make(TP_F32, 4, d), data, at);
  free(data);
  return v;
}

int64_t tp_score_heads(const TpScoreChain *c, const TpType *t) {
  if (t->rank == 4) return t->dims[0] == c->B ? t->dims[1] : -1;
  return t->rank == 3 && t->dims[0] == c->BH ? c->H : -1;
}

/* Where(IsNaN(p), 0, p) (IsNaN imported as Not(Equal(p, p))): SDPA's decomposition
 * zeroes the probabilities of a row that sees no key, as Attention does. The guard, or -1. */
static int nan_guard(const TpModule *m, int p) {
  for (int o = 0; o < m->nops; o++) {
    const TpOp *op = &m->ops[o];
    if (op->dead || op->kind != TP_OP_Where || in(m, o, 2) != p || m->values[in(m, o, 1)].kind != TP_VAL_CONST ||
        !scalar_is(m, in(m, o, 1), 0))
      continue;
    int n = def_of(m, in(m, o, 0), TP_OP_Not), e = n >= 0 ? def_of(m, in(m, n, 0), TP_OP_Equal) : -1;
    if (e >= 0 && in(m, e, 0) == p && in(m, e, 1) == p) return o;
  }
  return -1;
}

/* MatMul(probabilities, V) after Softmax c->softmax, through reshapes of the scores and a
 * NaN guard; -1 if there is none. */
static int times_values(TpModule *m, TpScoreChain *c) {
  int p = out(m, c->softmax);
  for (int step = 0; step < TP_SCORE_CHAIN_MAX; step++) {
    int u = user_of(m, p, TP_OP_MatMul, 0);
    if (u >= 0) return u;
    if ((u = user_of(m, p, TP_OP_Reshape, 0)) >= 0 && score_type(c, type(m, out(m, u)))) p = out(m, u);
    else if ((u = nan_guard(m, p)) >= 0) p = out(m, u);
    else return -1;
  }
  return -1;
}

/* ---- proofs already made ----
 *
 * check_steps and prove evaluate the chain at every score position: at T = 2048, 4 million
 * positions per layer, although the layers of a model usually share one mask. What they
 * compute at a position depends only on the chain's shape (T, B, H, the scores' dtype and
 * form), each step's kind, score operand, result type, constant data, whether a
 * parameter feeds it and whether it is the soft-cap: the op and value ids only name things
 * in refusals. So a chain equal to one proven causal in all of these has the same proof,
 * and is not evaluated again.
 * Only acceptances are remembered: a refusal is recomputed, and names its own nodes. */

typedef struct {
  TpOpKind kind;
  int slot;
  TpType type;
  bool param, cap; /* cap: the soft-cap */
} StepKey;

typedef struct TpProven {
  TpScoreChain c; /* its shape (steps and slot name the first chain proven) */
  StepKey step[TP_SCORE_CHAIN_MAX];
  Frame f; /* its constants, owned */
  TpCausalProof pr;
} Proven;

static StepKey step_key(const TpModule *m, const TpScoreChain *c, int s) {
  int o = c->steps[s];
  return (StepKey){m->ops[o].kind, c->slot[s], *type(m, out(m, o)), step_param(m, c, s) >= 0, o == c->cap};
}

static bool same_tensor(const TpTensor *a, const TpTensor *b) {
  if (!a->data || !b->data) return !a->data && !b->data;
  return a->dtype == b->dtype && a->rank == b->rank &&
         memcmp(a->dims, b->dims, (size_t)a->rank * sizeof *a->dims) == 0 &&
         memcmp(a->data, b->data, tp_tensor_bytes(a)) == 0;
}

/* The proof of a chain equal to c with frame f (see above), or NULL. */
static const Proven *recall(const TpModule *m, const TpCausalMemo *memo, const TpScoreChain *c, const Frame *f) {
  for (int e = 0; memo && e < memo->n; e++) {
    const Proven *p = &memo->at[e];
    bool same = p->c.dt == c->dt && p->c.T == c->T && p->c.B == c->B && p->c.H == c->H && p->c.BH == c->BH &&
                p->c.inner == c->inner && p->c.nsteps == c->nsteps && p->f.nb == f->nb && p->f.nh == f->nh;
    for (int s = 0; s < c->nsteps && same; s++) {
      StepKey k = step_key(m, c, s);
      same = k.kind == p->step[s].kind && k.slot == p->step[s].slot && k.param == p->step[s].param &&
             k.cap == p->step[s].cap && tp_type_equal(&k.type, &p->step[s].type) &&
             same_tensor(&f->k[s][0], &p->f.k[s][0]) && same_tensor(&f->k[s][1], &p->f.k[s][1]);
    }
    if (same) return p;
  }
  return NULL;
}

/* Remembers proof pr of chain c with frame f (copied). */
static void remember(const TpModule *m, TpCausalMemo *memo, const TpScoreChain *c, const Frame *f,
                     const TpCausalProof *pr) {
  memo->at = realloc(memo->at, (size_t)(memo->n + 1) * sizeof *memo->at);
  TP_ASSERT(memo->at);
  Proven *p = &memo->at[memo->n++];
  *p = (Proven){.c = *c, .f = *f, .pr = *pr};
  for (int s = 0; s < c->nsteps; s++) {
    p->step[s] = step_key(m, c, s);
    for (int n = 0; n < 2; n++) {
      TpTensor *k = &p->f.k[s][n];
      if (!k->data) continue;
      void *copy = malloc(tp_tensor_bytes(k) + 1);
      TP_ASSERT(copy);
      k->data = memcpy(copy, k->data, tp_tensor_bytes(k));
    }
  }
}

void tp_causal_memo_free(TpCausalMemo *memo) {
  for (int e = 0; e < memo->n; e++) frame_free(&memo->at[e].f);
  free(memo->at);
}

/* The whole analysis of the attention at Softmax sm: its chain, frame (the caller frees it:
 * frame_free), proof and P V product; NULL, or why it is not causal attention. A memo
 * (may be NULL) gives and keeps the proofs of the score chains. */
static const char *analyse(TpModule *m, int sm, TpCausalMemo *memo, TpScoreChain *c, Frame *f, TpCausalProof *pr) {
  memset(f, 0, sizeof *f);
  const char *why = score_chain(m, sm, c);
  if (!why) why = evaluate_chain(m, c, f);
  const Proven *known = why ? NULL : recall(m, memo, c, f);
  if (known) *pr = known->pr;
  else {
    if (!why) why = check_steps(m, c, f);
    if (!why) why = prove(m, c, f, pr);
    if (!why && memo) remember(m, memo, c, f, pr);
  }
  if (why) return why;
  c->pv = times_values(m, c);
  if (c->pv < 0)
    return tp_strfmt(m, "the probabilities of Softmax at node '%s' are not multiplied by values", node_name(m, sm));
  const TpType *tq = type(m, in(m, c->product, 0)), *tkt = type(m, in(m, c->product, 1)),
               *tv = type(m, in(m, c->pv, 1));
  if (c->inner) { /* Q [B, T*H, D], K^T [B, D, T], V [B, T, Dv]: one K/V head */
    bool ok = tq->rank == 3 && tkt->rank == 3 && tv->rank == 3 && tq->dims[0] == c->B && tkt->dims[0] == c->B &&
              tv->dims[0] == c->B && tq->dims[1] == c->T * c->H && tkt->dims[2] == c->T && tv->dims[1] == c->T;
    return ok ? NULL
              : tp_strfmt(m, "the products at nodes '%s' and '%s' are not Q K^T and P V of one K/V head",
                          node_name(m, c->product), node_name(m, c->pv));
  }
  int64_t hk = tp_score_heads(c, tkt), hv = tp_score_heads(c, tv);
  if (tp_score_heads(c, tq) != c->H || hk < 0 || hv < 0 || tkt->dims[tkt->rank - 1] != c->T ||
      tv->dims[tv->rank - 2] != c->T)
    return tp_strfmt(m, "the products at nodes '%s' and '%s' are not Q K^T and P V over the scores' batch",
                     node_name(m, c->product), node_name(m, c->pv));
  if (hk != hv) return tp_strfmt(m, "its K has %lld heads and its V %lld", (long long)hk, (long long)hv);
  if (tp_score_heads(c, type(m, out(m, c->pv))) != c->H)
    return tp_strfmt(m, "MatMul at node '%s' does not keep the scores' batch and heads", node_name(m, c->pv));
  if (pr->biased && c->dt != TP_F32)
    return tp_strfmt(m, "its additive bias is on %s scores, not f32", tp_dtype_name(c->dt));
  return NULL;
}

const char *tp_prove_causal_attention(TpModule *m, int softmax, TpCausalMemo *memo, TpScoreChain *c,
                                      TpCausalProof *pr, int *bias) {
  Frame f;
  const char *why = analyse(m, softmax, memo, c, &f, pr);
  if (bias) *bias = !why && pr->biased ? make_bias(m, c, &f, m->ops[softmax].origin) : -1;
  frame_free(&f);
  return why;
}

bool tp_prove_causal_mask(TpModule *m, int mask, TpDType dt, int64_t T, int64_t *window, float **bias) {
  *window = 0, *bias = NULL;
  TpTensor t;
  if (!evaluate(m, mask, EVAL_DEPTH, &t)) return false;
  bool boolean = t.dtype == TP_BOOL, biased = false, causal = true;
  double bound = fmin(lowest(dt) * 1e-6, -1e4);
  int64_t n = tp_tensor_numel(&t), keys = 0;
  for (int64_t j = 0; j < T; j++) { /* the visible keys of the last query: the window */
    double v = tp_tensor_get_f64(&t, (T - 1) * T + j);
    keys += boolean ? v != 0 : v > bound;
  }
  if (keys == T) keys = 0;
  float *b = malloc((size_t)n * sizeof *b + 1);
  TP_ASSERT(b);
  for (int64_t p = 0; p < n && causal; p++) {
    int64_t j = p % T, i = p / T % T;
    double v = tp_tensor_get_f64(&t, p);
    bool visible = boolean ? v != 0 : v > bound, want = j <= i && (keys == 0 || j > i - keys);
    causal = visible == want && (boolean || !visible || isfinite(v));
    b[p] = boolean || !visible ? 0.0f : (float)v;
    biased |= b[p] != 0;
  }
  free(t.data);
  /* a parameter may hide keys (a float buffer the export made an initializer); one that
   * biases visible scores would be frozen into the attention, and is trained instead */
  if (!causal || (biased && (param_leaf(m, mask, EVAL_DEPTH) >= 0 || type(m, mask)->dtype != TP_F32))) {
    free(b);
    return false;
  }
  *window = keys;
  if (biased) *bias = b;
  else free(b);
  return true;
}

const char *tp_attention_unproven(TpModule *m, int product) {
  /* the Softmax the product's scores reach, through the ops a score chain may hold */
  int frontier[TP_SCORE_CHAIN_MAX], n = 0;
  frontier[n++] = out(m, product);
  for (int i = 0; i < n; i++)
    for (int o = 0; o < m->nops; o++) {
      const TpOp *op = &m->ops[o];
      bool reads = false;
      for (int k = 0; k < op->ninputs; k++) reads |= op->inputs[k] == frontier[i];
      if (op->dead || !reads) continue;
      if (op->kind == TP_OP_Softmax) {
        TpScoreChain c;
        TpCausalProof pr;
        const char *why = tp_prove_causal_attention(m, o, NULL, &c, &pr, NULL);
        if (why) return why;
        return c.product == product ? "raise-transformer did not run" : NULL;
      }
      if (n < TP_SCORE_CHAIN_MAX && op->noutputs == 1 &&
          (tp_op_info[op->kind].traits & TP_TRAIT_ELEMENTWISE || op->kind == TP_OP_Reshape))
        frontier[n++] = op->outputs[0];
    }
  return "no Softmax over its keys follows the product";
}
