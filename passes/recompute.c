/* recompute: requires a differentiated module (autodiff, after split-sequence,
 * assign-stages and finish-stages when they run); provides backward ops that read
 * recomputed activations instead of the forward's, all but the checkpoints, so that the
 * forward's own die in the forward (codegen/memory.c frees a buffer after its last reader).
 *
 * Every backward op that reads a forward result of its own stage and slice that is not a
 * checkpoint reads instead a copy of it: the forward op that made it run again in the
 * backward (same kind, attributes, stage and slice; the results "<result>.recompute"; role
 * TP_ROLE_RECOMPUTE, printed `@recompute`), on copies of its operands in turn, down to the
 * checkpoints. Each forward op is copied once, placed just before the first backward op that
 * reads it (tp_sort_ops), so the backward recomputes one layer at a time as it reaches it,
 * and only that layer's copies are alive at once. The copies compute what the forward
 * computed, with the same kernels on the same operands: the gradients do not change by a
 * bit.
 *
 * The checkpoints, kept from the forward as without recompute:
 *   - what a step does not compute: inputs, parameters, constants, and the results that
 *     depend on none of the inputs (a transposed weight, a tensor rank);
 *   - what the stage receives (boundary copies) and the re-tie views;
 *   - each layer's input, the residual stream entering it (tp_layer_inputs);
 *   - a token slice's keys and values (a Concat {context_rows}): the context the later
 *     slices read, kept already, so that a slice's copies read the context as it is and
 *     never write their rows into it again;
 *   - the all-reduce of a checkpoint (not sent again);
 *   - with TP_RECOMPUTE_SELECTIVE also the products (Linear, and a MatMul or Gemm of a
 *     weight: a parameter, or rows picked from one), as Korthikanti et al. keep them: the
 *     attention, norms and elementwise ops are recomputed, which cost few FLOPs per byte
 *     they keep.
 * A module recomputed already (an op with role recompute) is left alone, and so is every
 * module with opt->recompute TP_RECOMPUTE_NONE. */
#include "../ir/ir.h"

#include <stdlib.h>
#include <string.h>

static const char *const recompute_names[] = {
    [TP_RECOMPUTE_NONE] = "none",
    [TP_RECOMPUTE_SELECTIVE] = "selective",
    [TP_RECOMPUTE_FULL] = "full",
};

const char *tp_recompute_name(TpRecompute r) { return recompute_names[r]; }

bool tp_recompute_parse(const char *name, TpRecompute *r) {
  for (int k = TP_RECOMPUTE_NONE; k <= TP_RECOMPUTE_FULL; k++)
    if (strcmp(name, recompute_names[k]) == 0) {
      *r = (TpRecompute)k;
      return true;
    }
  return false;
}

typedef struct {
  TpModule *m;
  TpDiag *d;
  int nvalues; /* values before the pass: the forward results that may be copied */
  bool *keep;  /* per value: a checkpoint (or not a forward result) */
  int *copy;   /* per value: its recomputed copy, or -1 */
  int *next;   /* per op: the operand the copying walk looks at next */
  int *stack;  /* ops being copied, operands first */
  int rc;
} Recompute;

/* Does op o move elements of its first operand without computing new ones? */
static bool moves(TpOpKind kind) {
  switch (kind) {
  case TP_OP_Reshape:
  case TP_OP_Transpose:
  case TP_OP_Expand:
  case TP_OP_Slice:
  case TP_OP_Split:
  case TP_OP_Concat:
  case TP_OP_Gather:
  case TP_OP_Tile:
  case TP_OP_Cast: return true;
  default: return false;
  }
}

/* keep[v] for every value. `varies`: depends on an input of the step. */
static void checkpoints(Recompute *r, TpRecompute mode) {
  TpModule *m = r->m;
  int nv = m->nvalues;
  bool *varies = calloc((size_t)nv + 1, sizeof *varies), *weight = calloc((size_t)nv + 1, sizeof *weight);
  TP_ASSERT(varies && weight);
  tp_layer_inputs(m, r->keep);
  for (int v = 0; v < nv; v++) {
    varies[v] = m->values[v].kind == TP_VAL_INPUT;
    if (m->values[v].kind != TP_VAL_RESULT) r->keep[v] = true;
  }
  for (int o = 0; o < m->nops; o++) {
    const TpOp *op = &m->ops[o];
    if (op->phase != TP_PHASE_FORWARD) continue;
    bool any = false, product = op->kind == TP_OP_Linear;
    for (int i = 0; i < op->ninputs; i++) any |= op->inputs[i] >= 0 && varies[op->inputs[i]];
    if (op->kind == TP_OP_MatMul || op->kind == TP_OP_Gemm) product = weight[op->inputs[0]] || weight[op->inputs[1]];
    bool context = op->kind == TP_OP_Concat && tp_attr_int(m, o, "context_rows", 0) > 0;
    bool sum_of_kept = op->kind == TP_OP_AllReduce && r->keep[op->inputs[0]];
    bool keep = op->role != TP_ROLE_COMPUTE || !any || context || sum_of_kept ||
                (mode == TP_RECOMPUTE_SELECTIVE && product);
    for (int k = 0; k < op->noutputs; k++) {
      int y = op->outputs[k];
      if (y < 0) continue;
      varies[y] = any;
      weight[y] = !any || (moves(op->kind) && op->inputs[0] >= 0 && weight[op->inputs[0]]);
      r->keep[y] |= keep;
    }
  }
  free(varies);
  free(weight);
}

/* Is v a forward result of (stage, slice) that the backward reads a copy of? */
static bool copied(const Recompute *r, int v, int stage, int slice) {
  if (v < 0 || v >= r->nvalues || r->keep[v]) return false;
  const TpOp *op = &r->m->ops[r->m->values[v].def];
  return op->phase == TP_PHASE_FORWARD && op->stage == stage && op->slice == slice;
}

/* The copy of forward op o, on the copies of its operands (made before). */
static void copy_op(Recompute *r, int o) {
  TpModule *m = r->m;
  int nin = m->ops[o].ninputs, nout = m->ops[o].noutputs, stage = m->ops[o].stage, slice = m->ops[o].slice;
  int in[64];
  const char *names[64] = {0};
  TP_ASSERT(nin <= 64 && nout <= 64);
  for (int i = 0; i < nin; i++) {
    int v = m->ops[o].inputs[i];
    in[i] = copied(r, v, stage, slice) ? r->copy[v] : v;
    TP_ASSERT(in[i] >= 0 || v < 0);
  }
  for (int k = 0; k < nout; k++) {
    int y = m->ops[o].outputs[k];
    names[k] = y >= 0 ? tp_strfmt(m, "%s.recompute", m->values[y].name) : NULL;
  }
  int c = tp_add_op(m, m->ops[o].kind, in, nin, names, nout, m->ops[o].origin);
  TpOp *op = &m->ops[c];
  op->stage = stage;
  op->slice = slice;
  op->phase = TP_PHASE_BACKWARD;
  op->role = TP_ROLE_RECOMPUTE;
  tp_copy_attrs(m, o, c);
  for (int k = 0; k < nout; k++) {
    int y = m->ops[o].outputs[k], z = m->ops[c].outputs[k];
    if (y < 0) continue;
    m->values[z].type = m->values[y].type; /* checked by inference below */
    m->values[z].origin = m->values[y].origin;
    r->copy[y] = z;
  }
  if (r->rc == TP_OK && tp_infer_op(m, c, r->d) != TP_OK)
    r->rc = tp_internal(r->d, "recompute: the copy of op %s (%s) does not type-check",
                        tp_op_info[m->ops[c].kind].name, m->ops[c].origin.node ? m->ops[c].origin.node : "-");
}

/* The copy of v, made with the copies it needs (operands first, without recursion: a
 * layer-less model's chain is as deep as the model). */
static int copy_of(Recompute *r, int v, int stage, int slice) {
  TpModule *m = r->m;
  if (r->copy[v] >= 0) return r->copy[v];
  int sp = 0;
  r->stack[sp++] = m->values[v].def;
  while (sp > 0) {
    int o = r->stack[sp - 1];
    if (r->next[o] < m->ops[o].ninputs) {
      int u = m->ops[o].inputs[r->next[o]++];
      if (copied(r, u, stage, slice) && r->copy[u] < 0) r->stack[sp++] = m->values[u].def;
    } else {
      copy_op(r, o);
      sp--;
    }
  }
  return r->copy[v];
}

int pass_recompute(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  if (opt->recompute == TP_RECOMPUTE_NONE) return TP_OK;
  bool backward = false;
  for (int o = 0; o < m->nops; o++) {
    if (m->ops[o].role == TP_ROLE_RECOMPUTE) return TP_OK; /* recomputed already */
    backward |= m->ops[o].phase == TP_PHASE_BACKWARD;
  }
  if (!backward)
    return tp_error(d, "--recompute %s: the module has no backward pass to recompute in (run autodiff first)",
                    tp_recompute_name(opt->recompute));
  int nv = m->nvalues, nops = m->nops;
  Recompute r = {.m = m, .d = d, .nvalues = nv};
  r.keep = calloc((size_t)nv + 1, sizeof *r.keep);
  r.copy = malloc(((size_t)nv + 1) * sizeof *r.copy);
  r.next = calloc((size_t)nops + 1, sizeof *r.next);
  r.stack = malloc(((size_t)nops + 1) * sizeof *r.stack);
  TP_ASSERT(r.keep && r.copy && r.next && r.stack);
  for (int v = 0; v < nv; v++) r.copy[v] = -1;
  checkpoints(&r, opt->recompute);
  /* the backward ops as autodiff made them, in order: each reads copies, made on demand */
  for (int o = 0; o < nops && r.rc == TP_OK; o++) {
    if (m->ops[o].phase != TP_PHASE_BACKWARD) continue;
    for (int i = 0; i < m->ops[o].ninputs; i++) {
      int v = m->ops[o].inputs[i], stage = m->ops[o].stage, slice = m->ops[o].slice;
      if (copied(&r, v, stage, slice)) {
        int c = copy_of(&r, v, stage, slice);
        m->ops[o].inputs[i] = c;
      }
    }
  }
  free(r.keep);
  free(r.copy);
  free(r.next);
  free(r.stack);
  if (r.rc == TP_OK) tp_sort_ops(m); /* each copy just before the first backward op reading it */
  return r.rc;
}
