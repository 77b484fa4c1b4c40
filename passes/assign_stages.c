/* assign-stages: requires the forward module (after add-loss and split-sequence, before
 * autodiff); provides op->stage on every op, boundary copies for every value that crosses
 * stages, and per-stage copies of parameters the first and last stage share.
 * finish-stages: requires autodiff after assign-stages; provides the check that nothing
 * but boundary copies crosses stages, and tied copies that train when their parameter does.
 *
 * Layers come from the structure, not from names: the residual stream is a chain of Adds
 * Add(x, f(x)) whose skip operand x is the previous Add's result (one chain per token
 * slice after split-sequence); Add(Add(x, f(x)), g(x)) adds a parallel block's second
 * branch. A layer starts at each chain member whose branch contains
 * an Attention (at every member when the model has none), so a transformer block (an
 * attention and an MLP residual) is one layer. Every op depending on the stream belongs to
 * the last layer whose start it depends on; the others (the embedding, weight-only ops such
 * as a re-tied head, ops on the targets) to the earliest layer that reads them. The
 * embedding thus goes with the first layer and the final norm, head and loss with the
 * last. Stage k gets layers [cut_k, cut_k+1): from opt->stage_cuts, or chosen to minimise
 * the largest stage's forward FLOPs (a simple count per op).
 *
 * A forward op of stage t reading a result of stage s < t reads the copy
 * "<value>.stage<t>" = Reshape(copy on stage t-1) placed on stage t, a boundary copy
 * (TP_ROLE_BOUNDARY) with the value's origin: one copy per stage in between, so transfers
 * go to the next stage only. Ops are then ordered by stage (stable, so still topological):
 * every stage's ops come before the next stage's, which makes autodiff sum the gradient
 * contributions of a sent value on the sending stage (the boundary's gradient copy, which
 * autodiff places there, is the first). A PARAM read on the first and the last stage gets
 * a tied copy "<param>.stage<last>" (TpValue.tied = param, same data and origin) that the
 * last stage reads instead: autodiff then gives each stage its own partial gradient, and
 * the runtime sums the two before the update (allreduce-tied). A parameter shared by other
 * stages is an error. */
#include "../ir/ir.h"
#include "../ops/rules.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char *fmt_name(TpModule *m, const char *base, int stage) {
  size_t n = strlen(base) + 24;
  char *s = tp_alloc(m, n);
  snprintf(s, n, "%s.stage%d", base, stage);
  return tp_unique_name(m, s);
}

static int def_of(const TpModule *m, int v) {
  return v >= 0 && m->values[v].kind == TP_VAL_RESULT ? m->values[v].def : -1;
}

/* ---- the residual stream ---- */

typedef struct {
  TpModule *m;
  int *mark; /* per value: generation it was reached in */
  int gen;
} Reach;

/* Marks the values computed from x by the ops after x's definition up to (not including)
 * op `end`, and reports whether y is one of them; *attention: an Attention op on the way
 * from x to y. */
static bool depends(Reach *r, int x, int y, int end, bool *attention) {
  TpModule *m = r->m;
  int from = def_of(m, x) + 1, g = ++r->gen;
  r->mark[x] = g;
  for (int o = from; o < end; o++) {
    const TpOp *op = &m->ops[o];
    if (op->dead) continue;
    bool hit = false;
    for (int i = 0; i < op->ninputs && !hit; i++) hit = op->inputs[i] >= 0 && r->mark[op->inputs[i]] == g;
    for (int k = 0; hit && k < op->noutputs; k++)
      if (op->outputs[k] >= 0) r->mark[op->outputs[k]] = g;
  }
  if (r->mark[y] != g) return false;
  /* ancestors of y among the marked ops: walk back from y */
  int *stack = malloc(((size_t)m->nvalues + 1) * sizeof *stack), sp = 0, g2 = ++r->gen;
  TP_ASSERT(stack);
  *attention = false;
  int d = def_of(m, y);
  if (d >= from) stack[sp++] = d;
  r->mark[y] = g2;
  while (sp) {
    const TpOp *op = &m->ops[stack[--sp]];
    if (op->kind == TP_OP_Attention) *attention = true;
    for (int i = 0; i < op->ninputs; i++) {
      int v = op->inputs[i], dv = def_of(m, v);
      /* only values reached from x: they carry mark g (g2 once visited) */
      if (v < 0 || dv < from || r->mark[v] != g) continue;
      r->mark[v] = g2;
      stack[sp++] = dv;
    }
  }
  free(stack);
  return true;
}

typedef struct {
  int *member; /* residual Add ops, in stream order */
  int n;
} Chain;

typedef struct {
  TpModule *m;
  int nchains;
  Chain *chains; /* the longest chains: one per token slice */
  int *skip;     /* per op: the skip operand of a residual Add, else -1 */
  bool *attn;    /* per op: the residual Add's branch contains an Attention */
  int *layer;    /* per op */
} Stream;

/* The residual Adds of the forward ops: s->skip and s->attn of every op. */
static void residual_adds(Stream *s) {
  TpModule *m = s->m;
  Reach r = {m, calloc((size_t)m->nvalues + 1, sizeof(int)), 0};
  TP_ASSERT(r.mark);
  for (int o = 0; o < m->nops; o++) {
    s->skip[o] = -1;
    const TpOp *op = &m->ops[o];
    if (op->dead || op->kind != TP_OP_Add || op->phase != TP_PHASE_FORWARD) continue;
    int a = op->inputs[0], b = op->inputs[1];
    if (def_of(m, a) < 0 || def_of(m, b) < 0) continue;
    const TpType *ta = &m->values[a].type, *tb = &m->values[b].type, *ty = &m->values[op->outputs[0]].type;
    bool attention = false;
    if (tp_type_equal(ta, ty) && depends(&r, a, b, o, &attention)) s->skip[o] = a;
    else if (tp_type_equal(tb, ty) && depends(&r, b, a, o, &attention)) s->skip[o] = b;
    /* a parallel block added one branch at a time, (x + attn(n(x))) + mlp(n(x)) (Cohere's
     * dynamo export): the second branch reads the first Add's skip operand x */
    for (int k = 0; k < 2 && s->skip[o] < 0; k++) {
      int sum = k ? b : a, branch = k ? a : b, prev = def_of(m, sum);
      if (tp_type_equal(&m->values[sum].type, ty) && m->ops[prev].kind == TP_OP_Add && s->skip[prev] >= 0 &&
          depends(&r, s->skip[prev], branch, o, &attention))
        s->skip[o] = sum;
    }
    s->attn[o] = attention;
  }
  free(r.mark);
}

static void find_chains(Stream *s) {
  TpModule *m = s->m;
  int n = m->nops;
  int *next = malloc(((size_t)n + 1) * sizeof *next);
  bool *has_prev = calloc((size_t)n + 1, sizeof *has_prev);
  TP_ASSERT(next && has_prev);
  residual_adds(s);
  for (int o = 0; o < n; o++) next[o] = -1;
  /* link each residual Add to the one whose skip operand it computes */
  for (int o = 0; o < n; o++) {
    int prev = s->skip[o] >= 0 ? def_of(m, s->skip[o]) : -1;
    if (prev >= 0 && s->skip[prev] >= 0 && next[prev] < 0) next[prev] = o, has_prev[o] = true;
  }
  int longest = 0;
  for (int o = 0; o < n; o++) {
    if (s->skip[o] < 0 || has_prev[o]) continue;
    int len = 0;
    for (int a = o; a >= 0; a = next[a]) len++;
    if (len > longest) longest = len, s->nchains = 0;
    if (len < longest) continue;
    s->chains = realloc(s->chains, ((size_t)s->nchains + 1) * sizeof *s->chains);
    TP_ASSERT(s->chains);
    Chain *c = &s->chains[s->nchains++];
    c->member = malloc((size_t)len * sizeof *c->member);
    TP_ASSERT(c->member);
    c->n = 0;
    for (int a = o; a >= 0; a = next[a]) c->member[c->n++] = a;
  }
  if (!longest) s->nchains = 0;
  free(next);
  free(has_prev);
}

/* Layer of every op: values that start a layer (the stream's start and the first skip
 * operand of each later layer) anchor the ops that depend on them; the rest go to the
 * earliest layer reading them. Returns the layer count (0: no stream). */
static int place_layers(Stream *s) {
  TpModule *m = s->m;
  bool any_attention = false;
  for (int c = 0; c < s->nchains; c++)
    for (int j = 0; j < s->chains[c].n; j++) any_attention |= s->attn[s->chains[c].member[j]];
  int *start = malloc(((size_t)m->nvalues + 1) * sizeof *start), nlayers = -1;
  TP_ASSERT(start);
  for (int v = 0; v < m->nvalues; v++) start[v] = -1;
  for (int c = 0; c < s->nchains; c++) {
    int l = -1;
    for (int j = 0; j < s->chains[c].n; j++) {
      int a = s->chains[c].member[j];
      if (j == 0 || s->attn[a] || !any_attention) start[s->skip[a]] = ++l;
    }
    if (nlayers >= 0 && nlayers != l + 1) {
      free(start);
      return -1; /* the slices disagree: reported by the caller */
    }
    nlayers = l + 1;
  }
  if (nlayers <= 0) {
    free(start);
    return 0;
  }
  int *vlayer = malloc(((size_t)m->nvalues + 1) * sizeof *vlayer);
  TP_ASSERT(vlayer);
  for (int v = 0; v < m->nvalues; v++) vlayer[v] = start[v];
  for (int o = 0; o < m->nops; o++) { /* forward: anchored ops */
    const TpOp *op = &m->ops[o];
    int l = -1;
    for (int i = 0; i < op->ninputs; i++)
      if (op->inputs[i] >= 0 && vlayer[op->inputs[i]] > l) l = vlayer[op->inputs[i]];
    s->layer[o] = l;
    for (int k = 0; k < op->noutputs; k++)
      if (op->outputs[k] >= 0 && start[op->outputs[k]] < 0) vlayer[op->outputs[k]] = l;
  }
  /* backward: an op the stream does not reach runs on the earliest layer reading it */
  int *first_use = vlayer; /* reused: per value, the least layer of an op reading it */
  for (int v = 0; v < m->nvalues; v++) first_use[v] = INT_MAX;
  for (int o = m->nops - 1; o >= 0; o--) {
    const TpOp *op = &m->ops[o];
    if (s->layer[o] < 0) {
      int l = INT_MAX;
      for (int k = 0; k < op->noutputs; k++)
        if (op->outputs[k] >= 0 && first_use[op->outputs[k]] < l) l = first_use[op->outputs[k]];
      s->layer[o] = l == INT_MAX ? 0 : l;
    }
    for (int i = 0; i < op->ninputs; i++)
      if (op->inputs[i] >= 0 && s->layer[o] < first_use[op->inputs[i]]) first_use[op->inputs[i]] = s->layer[o];
  }
  free(vlayer);
  free(start);
  return nlayers;
}

int tp_layer_inputs(TpModule *m, bool *input) {
  Stream s = {.m = m};
  s.skip = malloc(((size_t)m->nops + 1) * sizeof *s.skip);
  s.attn = calloc((size_t)m->nops + 1, sizeof *s.attn);
  TP_ASSERT(s.skip && s.attn);
  residual_adds(&s);
  bool any_attention = false;
  for (int o = 0; o < m->nops; o++) any_attention |= s.skip[o] >= 0 && s.attn[o];
  int n = 0;
  for (int o = 0; o < m->nops; o++) {
    int x = s.skip[o], prev = x >= 0 ? def_of(m, x) : -1;
    bool first = prev < 0 || s.skip[prev] < 0; /* no residual Add before it: a chain starts */
    if (x < 0 || !(first || s.attn[o] || !any_attention)) continue;
    n += !input[x];
    input[x] = true;
  }
  free(s.skip);
  free(s.attn);
  return n;
}

/* ---- cost and cuts ---- */

/* Forward FLOPs of an op (its rule's count; one per result element by default). */
static double op_flops(const TpModule *m, int op) {
  double (*flops)(const TpModule *, int) = tp_op_rules[m->ops[op].kind]->flops;
  return flops ? flops(m, op) : tp_flops_per_result(m, op);
}

/* cuts[k] = first layer of stage k, chosen to minimise the largest stage cost (the first
 * optimal cut wins, so equal layers split evenly and deterministically). */
static void balance(const double *cost, int nlayers, int nstages, int *cuts) {
  int L = nlayers, S = nstages;
  double *prefix = calloc((size_t)L + 1, sizeof *prefix),
         *best = malloc(sizeof(double) * (size_t)(S + 1) * (size_t)(L + 1));
  int *from = malloc(sizeof(int) * (size_t)(S + 1) * (size_t)(L + 1));
  TP_ASSERT(prefix && best && from);
  for (int j = 0; j < L; j++) prefix[j + 1] = prefix[j] + cost[j];
#define AT(k, j) ((size_t)(k) * (size_t)(L + 1) + (size_t)(j))
  for (int j = 0; j <= L; j++) best[AT(1, j)] = prefix[j], from[AT(1, j)] = 0;
  for (int k = 2; k <= S; k++)
    for (int j = k; j <= L; j++) {
      best[AT(k, j)] = -1;
      for (int i = k - 1; i < j; i++) { /* stages 1..k-1 take layers [0, i) */
        double c = best[AT(k - 1, i)] > prefix[j] - prefix[i] ? best[AT(k - 1, i)] : prefix[j] - prefix[i];
        if (best[AT(k, j)] < 0 || c < best[AT(k, j)]) best[AT(k, j)] = c, from[AT(k, j)] = i;
      }
    }
  for (int k = S, j = L; k >= 1; k--) {
    cuts[k - 1] = from[AT(k, j)];
    j = from[AT(k, j)];
  }
#undef AT
  free(prefix);
  free(best);
  free(from);
}

int tp_stage_cuts_parse(const char *text, int nlayers, int *nstages, int **out, TpDiag *d) {
  int n = 1;
  for (const char *p = text; *p; p++) n += *p == ',';
  if (*nstages > 1 && n + 1 != *nstages)
    return tp_error(d, "--stage-cuts '%s' has %d cut%s, but %d stages need %d", text, n, n == 1 ? "" : "s", *nstages,
                    *nstages - 1);
  *nstages = n + 1;
  int *cuts = malloc(sizeof(int) * (size_t)(n + 1));
  TP_ASSERT(cuts);
  cuts[0] = 0;
  const char *p = text;
  for (int k = 1; k <= n; k++) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || (*end != ',' && *end) || v <= cuts[k - 1] || v >= nlayers) {
      int lo = cuts[k - 1] + 1;
      free(cuts);
      return tp_error(d,
                      "--stage-cuts '%s': cut %d must be a layer number in [%d, %d] (stage k starts at "
                      "layer cut k; the model has %d layers)",
                      text, k, lo, nlayers - 1, nlayers);
    }
    cuts[k] = (int)v;
    p = *end ? end + 1 : end;
  }
  *out = cuts;
  return TP_OK;
}

/* ---- rewriting ---- */

/* The copy of value v on stage t (v itself on its own stage), made on demand. */
static int copy_on(TpModule *m, TpDiag *d, int **copies, int nstages, int v, int t) {
  int s = m->ops[m->values[v].def].stage;
  if (t == s) return v;
  if (!copies[v]) {
    copies[v] = malloc(sizeof(int) * (size_t)nstages);
    TP_ASSERT(copies[v]);
    for (int k = 0; k < nstages; k++) copies[v][k] = -1;
  }
  if (copies[v][t] >= 0) return copies[v][t];
  int prev = copy_on(m, d, copies, nstages, v, t - 1);
  const char *name = fmt_name(m, m->values[v].name, t);
  int op = tp_add_op(m, TP_OP_Reshape, &prev, 1, &name, 1, m->values[v].origin);
  m->ops[op].stage = t;
  m->ops[op].slice = m->ops[m->values[v].def].slice;
  m->ops[op].role = TP_ROLE_BOUNDARY;
  int r = m->ops[op].outputs[0];
  m->values[r].type = m->values[v].type;
  int rc = tp_infer_op(m, op, d);
  TP_ASSERT(rc == TP_OK);
  copies[v][t] = r;
  return r;
}

/* Stable order by stage: reads go to the same or earlier stages, so this is topological
 * but for the copies appended at the end (tp_sort_ops moves them up after). */
static void sort_by_stage(TpModule *m, int nstages) {
  int n = m->nops, k = 0;
  TpOp *ops = malloc(((size_t)n + 1) * sizeof *ops);
  int *where = malloc(((size_t)n + 1) * sizeof *where);
  TP_ASSERT(ops && where);
  for (int s = 0; s < nstages; s++)
    for (int o = 0; o < n; o++)
      if (m->ops[o].stage == s) where[o] = k, ops[k++] = m->ops[o];
  TP_ASSERT(k == n);
  memcpy(m->ops, ops, (size_t)n * sizeof *ops);
  for (int v = 0; v < m->nvalues; v++)
    if (m->values[v].def >= 0) m->values[v].def = where[m->values[v].def];
  free(ops);
  free(where);
}

/* Parameters read on two stages: the later reads a tied copy. */
static int tie_params(TpModule *m, TpDiag *d, int nstages) {
  int nv = m->nvalues, *lo = malloc(sizeof(int) * (size_t)(nv + 1)), *hi = malloc(sizeof(int) * (size_t)(nv + 1));
  bool *middle = calloc((size_t)nv + 1, sizeof *middle);
  TP_ASSERT(lo && hi && middle);
  for (int v = 0; v < nv; v++) lo[v] = INT_MAX, hi[v] = -1;
  for (int pass = 0; pass < 2; pass++)
    for (int o = 0; o < m->nops; o++)
      for (int i = 0; i < m->ops[o].ninputs; i++) {
        int v = m->ops[o].inputs[i], s = m->ops[o].stage;
        if (v < 0 || m->values[v].kind != TP_VAL_PARAM) continue;
        if (pass == 1) middle[v] |= s != lo[v] && s != hi[v];
        else if (s < lo[v]) lo[v] = s;
        if (pass == 0 && s > hi[v]) hi[v] = s;
      }
  int rc = TP_OK;
  for (int v = 0; v < nv && rc == TP_OK; v++) {
    if (hi[v] <= lo[v]) continue;
    if (lo[v] != 0 || hi[v] != nstages - 1 || middle[v]) {
      rc = tp_error(d,
                    "parameter '%s' is read on stages %d to %d: only the first and the last stage may "
                    "share a parameter (a tied embedding and head); choose other --stage-cuts",
                    m->values[v].name, lo[v], hi[v]);
      break;
    }
    const TpValue val = m->values[v];
    int copy = tp_add_data_value(m, fmt_name(m, val.name, hi[v]), TP_VAL_PARAM, val.type, val.blob, val.offset,
                                 val.origin);
    m->values[copy].tied = v;
    m->values[copy].shard = val.shard; /* a vocabulary-parallel table: the same rows */
    for (int o = 0; o < m->nops; o++)
      if (m->ops[o].stage == hi[v])
        for (int i = 0; i < m->ops[o].ninputs; i++)
          if (m->ops[o].inputs[i] == v) m->ops[o].inputs[i] = copy;
  }
  free(lo);
  free(hi);
  free(middle);
  return rc;
}

int pass_assign_stages(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  int nstages = opt->nstages > 1 ? opt->nstages : 1;
  if (nstages == 1 && !opt->stage_cuts) return TP_OK;
  for (int o = 0; o < m->nops; o++)
    if (m->ops[o].phase == TP_PHASE_BACKWARD)
      return tp_error(d, "assign-stages runs on the forward module: run it before autodiff");
  /* dead ops (what raising left of a primitive chain) must not count as readers */
  int rc0 = pass_dce(m, opt, d);
  if (rc0) return rc0;
  Stream s = {.m = m};
  s.skip = malloc(((size_t)m->nops + 1) * sizeof *s.skip);
  s.attn = calloc((size_t)m->nops + 1, sizeof *s.attn);
  s.layer = malloc(((size_t)m->nops + 1) * sizeof *s.layer);
  TP_ASSERT(s.skip && s.attn && s.layer);
  find_chains(&s);
  int nlayers = place_layers(&s), rc = TP_OK, *cuts = NULL;
  if (nlayers < 0)
    rc = tp_internal(d, "assign-stages: the token slices' residual streams have different layer counts");
  else if (nlayers == 0)
    rc = tp_error(d, "cannot cut the model into pipeline stages: no residual stream (a chain of residual "
                     "Adds, x + f(x)) to find its layers in");
  else if (opt->stage_cuts) rc = tp_stage_cuts_parse(opt->stage_cuts, nlayers, &nstages, &cuts, d);
  if (rc == TP_OK && nstages > nlayers && opt->chunks > 1)
    rc = tp_error(d,
                  "cannot cut %d layer%s into %d stages x %d chunks = %d virtual stages (--schedule interleaved): "
                  "every virtual stage needs at least one layer",
                  nlayers, nlayers == 1 ? "" : "s", nstages / opt->chunks, opt->chunks, nstages);
  else if (rc == TP_OK && nstages > nlayers)
    rc = tp_error(d, "cannot cut %d layer%s into %d stages: every stage needs at least one layer", nlayers,
                  nlayers == 1 ? "" : "s", nstages);
  if (rc == TP_OK && !cuts) {
    double *cost = calloc((size_t)nlayers, sizeof *cost);
    cuts = malloc(sizeof(int) * (size_t)nstages);
    TP_ASSERT(cost && cuts);
    for (int o = 0; o < m->nops; o++)
      if (!m->ops[o].dead) cost[s.layer[o]] += op_flops(m, o);
    balance(cost, nlayers, nstages, cuts);
    free(cost);
  }
  if (rc == TP_OK) {
    int *stage_of = malloc(sizeof(int) * (size_t)nlayers);
    TP_ASSERT(stage_of);
    for (int k = 0, l = 0; l < nlayers; l++) {
      while (k + 1 < nstages && cuts[k + 1] <= l) k++;
      stage_of[l] = k;
    }
    for (int o = 0; o < m->nops; o++) m->ops[o].stage = stage_of[s.layer[o]];
    free(stage_of);
    /* the cuts used, for whoever compiles the model again alike (tokpipec --profile-grid) */
    char *text = tp_alloc(m, (size_t)nstages * 12);
    for (int k = 1, at = 0; k < nstages; k++) at += sprintf(text + at, "%s%d", k > 1 ? "," : "", cuts[k]);
    opt->staged_nstages = nstages;
    opt->staged_cuts = text;
    rc = tie_params(m, d, nstages);
  }
  if (rc == TP_OK) {
    int nv = m->nvalues, nops = m->nops;
    int **copies = calloc((size_t)nv + 1, sizeof *copies);
    TP_ASSERT(copies);
    for (int o = 0; o < nops; o++)
      for (int i = 0; i < m->ops[o].ninputs; i++) {
        int v = m->ops[o].inputs[i], def = def_of(m, v);
        if (def < 0 || m->ops[def].stage == m->ops[o].stage) continue;
        TP_ASSERT(m->ops[def].stage < m->ops[o].stage);
        int c = copy_on(m, d, copies, nstages, v, m->ops[o].stage);
        m->ops[o].inputs[i] = c;
      }
    for (int v = 0; v < nv; v++) free(copies[v]);
    free(copies);
    sort_by_stage(m, nstages);
    tp_sort_ops(m); /* the copies, appended, move before their first readers */
  }
  for (int c = 0; c < s.nchains; c++) free(s.chains[c].member);
  free(s.chains);
  free(s.skip);
  free(s.attn);
  free(s.layer);
  free(cuts);
  return rc;
}

int pass_finish_stages(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  (void)opt;
  /* a tied copy trains exactly when its parameter does */
  for (int v = 0; v < m->nvalues; v++) {
    int p = tp_tied_param(m, v);
    if (p < 0 || !m->grads) continue;
    if (tp_grad_of(m, p) < 0 && tp_grad_of(m, v) >= 0) tp_set_grad(m, v, -1);
    else if (tp_grad_of(m, p) >= 0 && tp_grad_of(m, v) < 0 && tp_use_count(m, v) > 0)
      return tp_error(d,
                      "--freeze matches '%s', the last stage's copy of the trained parameter '%s': "
                      "freeze both or neither",
                      m->values[v].name, m->values[p].name);
  }
  /* only boundary copies read another stage's results, and only the neighbour's */
  for (int o = 0; o < m->nops; o++) {
    const TpOp *op = &m->ops[o];
    if (op->dead) continue;
    for (int i = 0; i < op->ninputs; i++) {
      int def = def_of(m, op->inputs[i]);
      if (def < 0 || m->ops[def].stage == op->stage) continue;
      int want = op->phase == TP_PHASE_FORWARD ? op->stage - 1 : op->stage + 1;
      if (!tp_is_boundary_op(m, o) || m->ops[def].stage != want)
        return tp_internal(d,
                           "finish-stages: %s op %s (%s) on stage %d reads %%%s of stage %d, not through a "
                           "boundary copy",
                           op->phase == TP_PHASE_FORWARD ? "forward" : "backward", tp_op_info[op->kind].name,
                           op->origin.node ? op->origin.node : "-", op->stage, m->values[op->inputs[i]].name,
                           m->ops[def].stage);
    }
  }
  return TP_OK;
}
