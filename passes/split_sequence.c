/* split-sequence: requires a module marked by insert-token-dim, with its loss (add-loss)
 * or without one (a forward module), and no backward ops yet; opt->nslices and
 * opt->slice_len (tokpipec --slices); provides the forward cut along the token axis into
 * opt->nslices units, first to last (TeraPipe's token slices), recorded in m->nslices and
 * m->slice_len. Slice i covers token rows [c_i, c_i + l_i), c_i = l_0 + ... + l_{i-1}.
 * With nslices <= 1 it does nothing.
 *   - An op that touches no token axis stays as it is, computed once (slice -1).
 *   - Every other op is repeated per slice (op->slice = i) on its rows, results named
 *     "<name>.s<i>", types those of the whole op with l_i rows. A graph input, parameter
 *     or constant with a token axis is cut by a Slice (folded for a constant), so the
 *     trainer still feeds the whole [B, T] tokens and targets.
 *   - Causal attention of slice i attends over the keys and values of rows [0, c_i + l_i):
 *     Attention(Q_i, Kctx_i, Vctx_i) {is_causal = 1, causal_offset = c_i}, where
 *     Kctx_0 = Concat(K_0) and Kctx_i = Concat(Kctx_{i-1}, K_i) along the token axis
 *     ("<K>.ctx.s<i>"), each {context_rows = T}: the compiled plan keeps one buffer of T
 *     rows per K and V that every slice appends its rows to (ir/ops.def), not a copy of
 *     the growing context per slice. Its mask (a position bias: insert-token-dim allows
 *     only one the tokens do not feed) is cut to the query rows [c_i, c_i + l_i) and key
 *     columns [0, c_i + l_i) ("<mask>.s<i>", folded when constant); a window stays exact
 *     as it is, since causal_offset places the rows.
 *   - The loss: CrossEntropy per slice with the whole run's denominator (B*T), summed as
 *     the slices come ("<loss>.sum.s<i>"; the last sum takes the loss's name), so it is
 *     the mean over all B*T positions. A model's own loss cannot be cut (train the logits
 *     with --logits).
 *   - A graph output with a token axis: a training module drops it (a step reads only the
 *     loss, which becomes the output if none is left); a forward module concatenates the
 *     slices' rows back under its name.
 * The units are emitted slice after slice, so autodiff, which differentiates in reverse
 * module order, runs the last slice's backward first; each Concat's backward hands the
 * earlier rows their share of dK and dV, summed into the context's gradient before the
 * slice that made those rows runs its own backward. */
#include "../ir/ir.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  TpModule *m;
  TpDiag *d;
  int M; /* slices */
  const int64_t *len;
  int64_t *start; /* c_i */
  int nvalues;    /* values before the pass: rep is indexed by them */
  int *rep;       /* rep[v * M + i]: slice i's part of value v, -1 before it exists */
  int *ctx;       /* ctx[v * M + i]: keys or values v of rows [0, c_i + l_i) */
  int *mask;      /* mask[v * M + i]: attention mask v cut for slice i */
  int rc;
} Split;

/* A new forward op of slice i at the stage of op `like`, with like's origin or none;
 * results typed `types` (all of them preset, checked by inference). */
static int add(Split *s, TpOpKind kind, const int *in, int nin, const char *const *names, int nout,
               const TpType *types, int like, bool origin, int i) {
  TpModule *m = s->m;
  int op = tp_add_op(m, kind, in, nin, names, nout, origin ? m->ops[like].origin : (TpOrigin){0});
  m->ops[op].stage = m->ops[like].stage;
  m->ops[op].slice = i;
  for (int k = 0; k < nout; k++)
    if (m->ops[op].outputs[k] >= 0) m->values[m->ops[op].outputs[k]].type = types[k];
  return op;
}

static int infer(Split *s, int op) {
  if (s->rc == TP_OK && tp_infer_op(s->m, op, s->d) != TP_OK)
    s->rc = tp_internal(s->d, "split-sequence: slice %d of %s does not type-check", s->m->ops[op].slice,
                        tp_op_info[s->m->ops[op].kind].name);
  return s->rc;
}

/* Type t with n rows along axis a. */
static TpType rows(TpType t, int a, int64_t n) {
  if (a >= 0) t.dims[a] = n;
  return t;
}

/* A Slice of v for slice i (like op `user`): the block of type t from `starts`, folded
 * when v is a constant. */
static int cut(Split *s, int v, const int64_t *starts, TpType t, int i, int user) {
  TpModule *m = s->m;
  int64_t steps[TP_MAX_RANK];
  for (int k = 0; k < t.rank; k++) steps[k] = 1;
  int op = add(s, TP_OP_Slice, &v, 1, (const char *[]){tp_strfmt(m, "%s.s%d", m->values[v].name, i)}, 1, &t, user,
               false, i);
  tp_set_attr_ints(m, op, "starts", starts, t.rank);
  tp_set_attr_ints(m, op, "steps", steps, t.rank);
  int r = m->ops[op].outputs[0];
  if (infer(s, op)) return r;
  bool folded;
  if (m->values[v].kind == TP_VAL_CONST && tp_fold_op(m, op, &folded, s->d) != TP_OK) s->rc = TP_ERR_INTERNAL;
  return r;
}

/* Slice i of value v: v itself without a token axis, else the replica, or a Slice of a
 * graph input, parameter or constant (made on first use, like op `user`). */
static int part(Split *s, int v, int i, int user) {
  TpModule *m = s->m;
  int a = v >= 0 ? tp_token_axis(m, v) : -1;
  if (a < 0) return v;
  int *r = &s->rep[v * s->M + i];
  if (*r >= 0) return *r;
  TP_ASSERT(m->values[v].kind != TP_VAL_RESULT); /* results are repeated before their users */
  int64_t starts[TP_MAX_RANK] = {0};
  starts[a] = s->start[i];
  return *r = cut(s, v, starts, rows(m->values[v].type, a, s->len[i]), i, user);
}

/* Keys (or values) of rows [0, c_i + l_i) for slice i's attention, op `att`. */
static int context(Split *s, int kv, int i, int att) {
  TpModule *m = s->m;
  int *r = &s->ctx[kv * s->M + i];
  if (*r >= 0) return *r;
  int own = part(s, kv, i, att), a = tp_token_axis(m, kv);
  int in[2] = {i ? context(s, kv, i - 1, att) : own, own};
  TpType t = rows(m->values[kv].type, a, s->start[i] + s->len[i]);
  int op = add(s, TP_OP_Concat, i ? in : in + 1, i ? 2 : 1,
               (const char *[]){tp_strfmt(m, "%s.ctx.s%d", m->values[kv].name, i)}, 1, &t, att, true, i);
  tp_set_attr_int(m, op, "axis", a);
  tp_set_attr_int(m, op, "context_rows", m->values[kv].type.dims[a]);
  infer(s, op);
  return *r = m->ops[op].outputs[0];
}

/* Slice i's part of attention op att's mask v: the query rows [c_i, c_i + l_i) and key
 * columns [0, c_i + l_i) of the scores it is added to (a dim of 1 is broadcast and stays
 * whole); folded when v is a constant. */
static int mask_part(Split *s, int v, int i, int att) {
  TpModule *m = s->m;
  int *r = &s->mask[v * s->M + i];
  if (*r >= 0) return *r;
  TpType t = m->values[v].type;
  int64_t starts[TP_MAX_RANK] = {0};
  int qd = t.rank - 2, kd = t.rank - 1;
  if (qd >= 0 && t.dims[qd] != 1) starts[qd] = s->start[i], t.dims[qd] = s->len[i];
  if (kd >= 0 && t.dims[kd] != 1) t.dims[kd] = s->start[i] + s->len[i];
  return *r = cut(s, v, starts, t, i, att);
}

/* Slice i of op o: its results go to rep. */
static int repeat(Split *s, int o, int i, TpTokenClass c) {
  TpModule *m = s->m;
  int nin = m->ops[o].ninputs, nout = m->ops[o].noutputs, in[64];
  const char *names[64];
  TpType types[64];
  TP_ASSERT(nin <= 64 && nout <= 64);
  for (int k = 0; k < nin; k++) in[k] = part(s, m->ops[o].inputs[k], i, o);
  if (c == TP_TOKEN_CAUSAL_PREFIX) {
    for (int k = 1; k <= 2; k++) in[k] = context(s, m->ops[o].inputs[k], i, o);
    if (nin > 3 && in[3] >= 0) in[3] = mask_part(s, m->ops[o].inputs[3], i, o);
  }
  for (int k = 0; k < nout; k++) {
    int r = m->ops[o].outputs[k];
    names[k] = r >= 0 ? tp_strfmt(m, "%s.s%d", m->values[r].name, i) : NULL;
    if (r >= 0) types[k] = rows(m->values[r].type, tp_token_axis(m, r), s->len[i]);
  }
  int op = add(s, m->ops[o].kind, in, nin, names, nout, types, o, true, i);
  m->ops[op].role = m->ops[o].role; /* a slice of an op plays its part in placement */
  tp_copy_attrs(m, o, op);
  if (c == TP_TOKEN_CAUSAL_PREFIX) tp_set_attr_int(m, op, "causal_offset", s->start[i]);
  infer(s, op);
  for (int k = 0; k < nout; k++)
    if (m->ops[o].outputs[k] >= 0) s->rep[m->ops[o].outputs[k] * s->M + i] = m->ops[op].outputs[k];
  return op;
}

/* After compaction: the value named `now` takes the name `want` (free by then). */
static void rename_value(TpModule *m, const char *now, const char *want) {
  int v = tp_find_value(m, now);
  TP_ASSERT(v >= 0 && tp_find_value(m, want) < 0);
  m->values[v].name = tp_strdup(m, want);
}

int pass_split_sequence(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  if (opt->nslices <= 1) return TP_OK;
  for (int op = 0; op < m->nops; op++)
    if (m->ops[op].phase == TP_PHASE_BACKWARD)
      return tp_error(d, "split-sequence cuts the forward module: run it before autodiff");
  pass_dce(m, opt, d); /* only what is computed is cut */
  int tokens = tp_token_input(m), axis = tokens >= 0 ? tp_token_axis(m, tokens) : -1;
  if (axis < 0) return tp_error(d, "split-sequence needs the token axis: run insert-token-dim first");
  int64_t T = m->values[tokens].type.dims[axis], sum = 0;
  for (int i = 0; i < opt->nslices; i++) {
    if (opt->slice_len[i] < 1)
      return tp_error(d, "slice %d has %lld tokens; each needs at least one", i, (long long)opt->slice_len[i]);
    sum += opt->slice_len[i];
  }
  if (sum != T)
    return tp_error(d, "the %d slices hold %lld tokens, but the sequence has %lld", opt->nslices, (long long)sum,
                    (long long)T);
  int64_t *len = tp_alloc(m, (size_t)opt->nslices * sizeof *len); /* the cut, for codegen */
  memcpy(len, opt->slice_len, (size_t)opt->nslices * sizeof *len);
  m->nslices = opt->nslices, m->slice_len = len;

  /* what each op is; the first that cannot be sliced is an error */
  int nops = m->nops;
  TpTokenClass *cls = malloc((size_t)(nops + 1) * sizeof *cls);
  TP_ASSERT(cls);
  int rc = TP_OK;
  for (int op = 0; op < nops && rc == TP_OK; op++) {
    const char *why = NULL;
    cls[op] = m->ops[op].dead ? TP_TOKEN_FREE : tp_token_class(m, op, &why);
    if (cls[op] == TP_TOKEN_GLOBAL) rc = tp_error_op(d, m, op, "cannot slice the sequence: %s", why);
    else if (cls[op] == TP_TOKEN_REDUCING &&
             (m->ops[op].kind != TP_OP_CrossEntropy || m->ops[op].outputs[0] != m->loss))
      rc = tp_error_op(d, m, op,
                       "cannot slice the sequence: the model's own loss (%s) cannot be cut into slices; "
                       "train on the logits (--logits NAME)",
                       tp_op_info[m->ops[op].kind].name);
  }
  for (int op = 0; op < nops && rc == TP_OK; op++) /* what is computed once reads no slice */
    for (int k = 0; rc == TP_OK && cls[op] == TP_TOKEN_FREE && !m->ops[op].dead && k < m->ops[op].ninputs; k++) {
      int v = m->ops[op].inputs[k];
      if (v >= 0 && m->values[v].kind == TP_VAL_RESULT && cls[m->values[v].def] != TP_TOKEN_FREE)
        rc = tp_error_op(d, m, op, "cannot slice the sequence: %s reads %%%s, which is computed per slice",
                         tp_op_info[m->ops[op].kind].name, m->values[v].name);
    }
  if (rc) {
    free(cls);
    return rc;
  }

  Split s = {.m = m, .d = d, .M = m->nslices, .len = m->slice_len, .nvalues = m->nvalues};
  s.start = malloc((size_t)s.M * sizeof *s.start);
  s.rep = malloc((size_t)s.nvalues * (size_t)s.M * sizeof *s.rep);
  s.ctx = malloc((size_t)s.nvalues * (size_t)s.M * sizeof *s.ctx);
  s.mask = malloc((size_t)s.nvalues * (size_t)s.M * sizeof *s.mask);
  TP_ASSERT(s.start && s.rep && s.ctx && s.mask);
  for (int i = 0; i < s.M; i++) s.start[i] = i ? s.start[i - 1] + s.len[i - 1] : 0;
  for (size_t k = 0; k < (size_t)s.nvalues * (size_t)s.M; k++) s.rep[k] = s.ctx[k] = s.mask[k] = -1;

  int loss = m->loss, sum_v = -1;
  for (int i = 0; i < s.M && s.rc == TP_OK; i++)
    for (int o = 0; o < nops && s.rc == TP_OK; o++) {
      if (cls[o] == TP_TOKEN_FREE) continue;
      int op = repeat(&s, o, i, cls[o]);
      if (cls[o] != TP_TOKEN_REDUCING) continue;
      int term = m->ops[op].outputs[0];
      if (sum_v < 0) {
        sum_v = term;
        continue;
      }
      TpType t = m->values[loss].type;
      int add_op = add(&s, TP_OP_Add, (int[]){sum_v, term}, 2,
                       (const char *[]){tp_strfmt(m, "%s.sum.s%d", m->values[loss].name, i)}, 1, &t, o, false, i);
      infer(&s, add_op);
      sum_v = m->ops[add_op].outputs[0];
    }
  rc = s.rc;
  const char *loss_name = loss >= 0 ? m->values[loss].name : NULL, *sum_name = NULL;
  if (rc == TP_OK && loss >= 0) {
    m->loss = sum_v;
    sum_name = m->values[sum_v].name;
  }

  /* graph outputs with a token axis: dropped when training, else put back together */
  int nout = 0, nrenames = 0;
  const char **renames = malloc((size_t)(2 * m->noutputs + 2) * sizeof *renames);
  TP_ASSERT(renames);
  for (int k = 0; k < m->noutputs && rc == TP_OK; k++) {
    int v = m->outputs[k], a = tp_token_axis(m, v);
    if (v >= s.nvalues || m->values[v].kind != TP_VAL_RESULT || cls[m->values[v].def] == TP_TOKEN_FREE) {
      m->outputs[nout++] = v;
      continue;
    }
    if (a < 0) {
      rc = tp_error(d, "cannot slice the sequence: output %%%s has no token axis but is computed per slice",
                    m->values[v].name);
      break;
    }
    if (loss >= 0) continue;
    int parts[64], n = 0, whole = v;
    for (int i = 0; i < s.M; i++) {
      parts[n++] = s.rep[v * s.M + i];
      if (n == 64 || i == s.M - 1) { /* Concat takes at most 64 operands */
        TpType t = rows(m->values[v].type, a, s.start[i] + s.len[i]);
        int op = add(&s, TP_OP_Concat, parts, n, (const char *[]){tp_strfmt(m, "%s.whole", m->values[v].name)}, 1,
                     &t, m->values[v].def, false, -1);
        tp_set_attr_int(m, op, "axis", a);
        infer(&s, op);
        whole = parts[0] = m->ops[op].outputs[0];
        n = 1;
      }
    }
    renames[nrenames++] = m->values[whole].name;
    renames[nrenames++] = m->values[v].name;
    m->outputs[nout++] = whole;
  }
  rc = rc ? rc : s.rc;
  if (rc == TP_OK) {
    m->noutputs = nout;
    if (!nout) tp_add_output(m, m->loss); /* a module has outputs: a training step's is its loss */
    for (int o = 0; o < nops; o++)
      if (cls[o] != TP_TOKEN_FREE) m->ops[o].dead = true;
    tp_module_compact(m);
    if (loss >= 0) rename_value(m, sum_name, loss_name);
    for (int k = 0; k < nrenames; k += 2) rename_value(m, renames[k], renames[k + 1]);
    tp_module_compact(m); /* rebuilds the name table */
    pass_dce(m, opt, d);  /* constants only the whole op read */
  }
  free(renames);
  free(cls);
  free(s.start);
  free(s.rep);
  free(s.ctx);
  free(s.mask);
  return rc;
}
