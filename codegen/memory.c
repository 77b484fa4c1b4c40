/* The memory plan (see codegen.h): requires a module after the training pipeline (op stage
 * and phase set; the loss and the gradient map when it trains); provides a TpMemSlot per
 * value and per op scratch buffer.
 *
 * Each stage runs its forward ops in module order, then its backward ops in module order;
 * a value is live from the op that defines it to the last op of its stage that reads it
 * (the loss and the graph outputs to the end of the forward). Buffers are placed greedily,
 * largest first, each in the smallest gap left by the buffers already placed whose live
 * ranges overlap its own (else above them): deterministic, and close to the live peak. */
#include "codegen.h"

#include <stdlib.h>
#include <string.h>

static int64_t align_up(int64_t n) { return (n + TP_ARENA_ALIGN - 1) / TP_ARENA_ALIGN * TP_ARENA_ALIGN; }

static int64_t value_bytes(const TpModule *m, int v) {
  const TpType *t = &m->values[v].type;
  return tp_type_numel(t) * (int64_t)tp_dtype_size(t->dtype);
}

static const char *op_name(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  return o->origin.node ? o->origin.node : tp_op_info[o->kind].name;
}

int64_t tp_op_scratch_bytes(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  /* The loss kernel writes the log-probabilities somewhere even when nobody reads them. */
  if (o->kind == TP_OP_SoftmaxCrossEntropyLoss && (o->noutputs < 2 || o->outputs[1] < 0))
    return value_bytes(m, o->inputs[0]);
  return 0;
}

/* Is value v read as the class labels of a loss (so it is the trainer's targets)? */
static bool is_label_input(const TpModule *m, int v) {
  for (int i = 0; i < m->nops; i++) {
    const TpOp *o = &m->ops[i];
    int labels = -1;
    if (o->kind == TP_OP_CrossEntropy || o->kind == TP_OP_SoftmaxCrossEntropyLoss ||
        o->kind == TP_OP_NegativeLogLikelihoodLoss)
      labels = o->inputs[1];
    else if (o->kind == TP_OP_CrossEntropyBackward)
      labels = o->inputs[2];
    if (labels == v) return true;
  }
  return false;
}

/* Where each value lives, before any placement. */
static int classify(const TpModule *m, TpMemoryPlan *p, const bool *used, TpDiag *d) {
  int tokens = -1, targets = -1;
  for (int v = 0; v < m->nvalues; v++) {
    const TpValue *val = &m->values[v];
    TpMemSlot *s = &p->value[v];
    *s = (TpMemSlot){.kind = TP_MEM_NONE, .stage = -1, .offset = -1, .index = -1};
    if (val->kind == TP_VAL_PARAM) {
      if (val->type.dtype != TP_F32)
        return tp_internal(d, "codegen: parameter '%s' is %s; the trainer holds f32 parameters",
                           val->name, tp_dtype_name(val->type.dtype));
      s->kind = TP_MEM_PARAM;
      s->index = p->nparams;
      p->params[p->nparams++] = v;
    } else if (val->kind == TP_VAL_CONST) {
      if (used[v]) s->kind = TP_MEM_CONST;
    } else if (val->kind == TP_VAL_INPUT) {
      if (!used[v]) continue;
      bool labels = is_label_input(m, v);
      int *which = labels ? &targets : &tokens;
      if (*which >= 0)
        return tp_internal(d, "codegen: inputs '%s' and '%s' both hold %s; the trainer feeds one",
                           m->values[*which].name, val->name, labels ? "targets" : "token ids");
      if (val->type.dtype != TP_I64 || val->type.rank != 2)
        return tp_internal(d, "codegen: input '%s' is %s; the trainer feeds i64[batch, seq] %s",
                           val->name, tp_dtype_name(val->type.dtype), labels ? "targets" : "token ids");
      *which = v;
      s->kind = labels ? TP_MEM_TARGETS : TP_MEM_TOKENS;
    }
  }
  if (tokens >= 0 && targets >= 0 &&
      !tp_type_equal(&m->values[tokens].type, &m->values[targets].type))
    return tp_internal(d, "codegen: token ids '%s' and targets '%s' differ in shape",
                       m->values[tokens].name, m->values[targets].name);
  /* Gradients of parameters go straight to the trainer's gradient buffers. */
  for (int i = 0; i < p->nparams; i++) {
    int g = tp_grad_of(m, p->params[i]);
    if (g < 0) continue;
    if (m->values[g].kind != TP_VAL_RESULT)
      return tp_internal(d, "codegen: the gradient of '%s' is not computed by an op",
                         m->values[p->params[i]].name);
    if (p->value[g].kind == TP_MEM_GRAD)
      return tp_internal(d, "codegen: '%s' is the gradient of two parameters", m->values[g].name);
    p->value[g] = (TpMemSlot){.kind = TP_MEM_GRAD, .stage = -1, .offset = -1, .index = i};
  }
  /* A gradient that is a Reshape of a value read nowhere else: that value is computed in the
   * gradient buffer directly (the Reshape then has nothing to do). */
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    int r = o->outputs[0], x = o->inputs[0];
    if (o->kind == TP_OP_Reshape && p->value[r].kind == TP_MEM_GRAD &&
        m->values[x].kind == TP_VAL_RESULT && p->value[x].kind == TP_MEM_NONE && x != m->loss &&
        tp_use_count(m, x) == 1)
      p->value[x] = p->value[r];
  }
  /* Other results: a Reshape is a view of its operand's bytes; the rest need a buffer. */
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    for (int k = 0; k < o->noutputs; k++) {
      int r = o->outputs[k];
      if (r < 0 || p->value[r].kind != TP_MEM_NONE) continue;
      TpMemSlot *s = &p->value[r];
      if (o->kind == TP_OP_Reshape) {
        s->kind = TP_MEM_VIEW;
        s->index = o->inputs[0];
      } else {
        s->kind = TP_MEM_ARENA;
        s->stage = o->stage;
        s->bytes = align_up(value_bytes(m, r));
      }
    }
  }
  return TP_OK;
}

/* The stage's run order: its forward ops, then its backward ops. */
static int order_ops(const TpModule *m, TpMemoryPlan *p, int *pos, TpDiag *d) {
  for (int s = 0; s < p->nstages; s++) {
    p->order[s] = malloc((size_t)(m->nops + 1) * sizeof(int));
    TP_ASSERT(p->order[s]);
    for (int phase = TP_PHASE_FORWARD; phase <= TP_PHASE_BACKWARD; phase++) {
      for (int op = 0; op < m->nops; op++)
        if (m->ops[op].stage == s && (int)m->ops[op].phase == phase) {
          pos[op] = p->norder[s];
          p->order[s][p->norder[s]++] = op;
        }
      if (phase == TP_PHASE_FORWARD) p->nforward[s] = p->norder[s];
    }
  }
  /* Module order is topological; a forward op must not read what the backward computes. */
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    for (int i = 0; i < o->ninputs; i++) {
      int v = o->inputs[i], def = v >= 0 ? m->values[v].def : -1;
      if (def >= 0 && m->values[v].kind == TP_VAL_RESULT && o->phase == TP_PHASE_FORWARD &&
          m->ops[def].phase == TP_PHASE_BACKWARD)
        return tp_internal(d, "codegen: forward op '%s' reads '%s' of the backward pass",
                           op_name(m, op), m->values[v].name);
    }
  }
  return TP_OK;
}

/* The value whose bytes v uses (v itself unless it is a view). */
static int storage_of(const TpMemoryPlan *p, int v) {
  while (p->value[v].kind == TP_MEM_VIEW) v = p->value[v].index;
  return v;
}

/* Live ranges of the arena buffers, in stage positions. */
static int live_ranges(const TpModule *m, TpMemoryPlan *p, const int *pos, TpDiag *d) {
  for (int op = 0; op < m->nops; op++)
    for (int k = 0; k < m->ops[op].noutputs; k++) {
      int r = m->ops[op].outputs[k];
      if (r >= 0 && p->value[r].kind == TP_MEM_ARENA) p->value[r].first = p->value[r].last = pos[op];
    }
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    for (int i = 0; i < o->ninputs; i++) {
      if (o->inputs[i] < 0) continue;
      int v = storage_of(p, o->inputs[i]);
      TpMemSlot *s = &p->value[v];
      if (s->kind != TP_MEM_ARENA) continue;
      if (s->stage != o->stage)
        return tp_internal(d, "codegen: '%s' is computed in stage %d and read in stage %d; "
                           "plans that pass values between stages are not supported yet",
                           m->values[o->inputs[i]].name, s->stage, o->stage);
      if (pos[op] > s->last) s->last = pos[op];
    }
  }
  /* The loss and the graph outputs are read after the forward. */
  for (int i = 0; i <= m->noutputs; i++) {
    int v = i < m->noutputs ? m->outputs[i] : m->loss;
    if (v < 0) continue;
    TpMemSlot *s = &p->value[storage_of(p, v)];
    if (s->kind == TP_MEM_ARENA && s->last < p->nforward[s->stage] - 1 &&
        s->first < p->nforward[s->stage])
      s->last = p->nforward[s->stage] - 1;
  }
  for (int op = 0; op < m->nops; op++) {
    int64_t bytes = align_up(tp_op_scratch_bytes(m, op));
    if (bytes)
      p->scratch[op] = (TpMemSlot){.kind = TP_MEM_ARENA, .stage = m->ops[op].stage,
                                   .bytes = bytes, .index = -1, .first = pos[op], .last = pos[op]};
  }
  return TP_OK;
}

static bool overlap(const TpMemSlot *a, const TpMemSlot *b) {
  return a->first <= b->last && b->first <= a->last;
}

/* A buffer to place; id (values, then scratch buffers in op order) breaks ties. */
typedef struct {
  TpMemSlot *s;
  int id;
} Buf;

static int by_size(const void *pa, const void *pb) {
  const Buf *a = pa, *b = pb;
  if (a->s->bytes != b->s->bytes) return a->s->bytes > b->s->bytes ? -1 : 1;
  if (a->s->first != b->s->first) return a->s->first < b->s->first ? -1 : 1;
  return (a->id > b->id) - (a->id < b->id);
}

static int by_offset(const void *pa, const void *pb) {
  const TpMemSlot *a = *(TpMemSlot *const *)pa, *b = *(TpMemSlot *const *)pb;
  return (a->offset > b->offset) - (a->offset < b->offset);
}

/* Greedy placement of one stage's buffers; sets the offsets and the arena size. */
static void place(TpMemoryPlan *p, int stage, Buf *bufs, int n) {
  qsort(bufs, (size_t)n, sizeof *bufs, by_size);
  TpMemSlot **near = malloc((size_t)(n + 1) * sizeof *near);
  TP_ASSERT(near);
  int64_t top = 0;
  for (int i = 0; i < n; i++) {
    TpMemSlot *b = bufs[i].s;
    int nnear = 0;
    for (int j = 0; j < i; j++)
      if (overlap(b, bufs[j].s) && bufs[j].s->bytes) near[nnear++] = bufs[j].s;
    qsort(near, (size_t)nnear, sizeof *near, by_offset);
    int64_t cursor = 0, best = -1, best_gap = INT64_MAX;
    for (int j = 0; j < nnear; j++) {
      int64_t gap = near[j]->offset - cursor;
      if (gap >= b->bytes && gap < best_gap) best = cursor, best_gap = gap;
      if (near[j]->offset + near[j]->bytes > cursor) cursor = near[j]->offset + near[j]->bytes;
    }
    b->offset = best >= 0 ? best : cursor;
    if (b->offset + b->bytes > top) top = b->offset + b->bytes;
  }
  free(near);
  p->arena_bytes[stage] = top;
  p->nbuffers[stage] = n;
}

/* The most bytes live at one position of the stage. */
static int64_t live_peak(const Buf *bufs, int n, int positions) {
  int64_t peak = 0;
  for (int t = 0; t < positions; t++) {
    int64_t live = 0;
    for (int i = 0; i < n; i++)
      if (bufs[i].s->first <= t && t <= bufs[i].s->last) live += bufs[i].s->bytes;
    if (live > peak) peak = live;
  }
  return peak;
}

int tp_plan_memory(const TpModule *m, TpMemoryPlan *p, TpDiag *d) {
  *p = (TpMemoryPlan){0};
  p->nstages = 1;
  for (int op = 0; op < m->nops; op++) {
    TP_ASSERT(m->ops[op].stage >= 0);
    if (m->ops[op].stage >= p->nstages) p->nstages = m->ops[op].stage + 1;
  }
  int ns = p->nstages, nv = m->nvalues, no = m->nops;
  p->value = calloc((size_t)nv + 1, sizeof *p->value);
  p->scratch = calloc((size_t)no + 1, sizeof *p->scratch);
  p->params = calloc((size_t)nv + 1, sizeof *p->params);
  p->arena_bytes = calloc((size_t)ns, sizeof *p->arena_bytes);
  p->live_peak = calloc((size_t)ns, sizeof *p->live_peak);
  p->total_bytes = calloc((size_t)ns, sizeof *p->total_bytes);
  p->nbuffers = calloc((size_t)ns, sizeof *p->nbuffers);
  p->order = calloc((size_t)ns, sizeof *p->order);
  p->norder = calloc((size_t)ns, sizeof *p->norder);
  p->nforward = calloc((size_t)ns, sizeof *p->nforward);
  int *pos = calloc((size_t)no + 1, sizeof *pos);
  bool *used = calloc((size_t)nv + 1, sizeof *used);
  Buf *bufs = malloc((size_t)(nv + no + 1) * sizeof *bufs);
  TP_ASSERT(p->value && p->scratch && p->params && p->arena_bytes && p->live_peak &&
            p->total_bytes && p->nbuffers && p->order && p->norder && p->nforward && pos &&
            used && bufs);
  for (int op = 0; op < no; op++)
    for (int i = 0; i < m->ops[op].ninputs; i++)
      if (m->ops[op].inputs[i] >= 0) used[m->ops[op].inputs[i]] = true;

  int rc = classify(m, p, used, d);
  if (rc == TP_OK) rc = order_ops(m, p, pos, d);
  if (rc == TP_OK) rc = live_ranges(m, p, pos, d);
  for (int s = 0; s < ns && rc == TP_OK; s++) {
    int n = 0;
    for (int v = 0; v < nv; v++)
      if (p->value[v].kind == TP_MEM_ARENA && p->value[v].stage == s)
        bufs[n++] = (Buf){&p->value[v], v};
    for (int op = 0; op < no; op++)
      if (p->scratch[op].kind == TP_MEM_ARENA && p->scratch[op].stage == s)
        bufs[n++] = (Buf){&p->scratch[op], nv + op};
    for (int i = 0; i < n; i++) p->total_bytes[s] += bufs[i].s->bytes;
    p->live_peak[s] = live_peak(bufs, n, p->norder[s]);
    place(p, s, bufs, n);
  }
  free(pos);
  free(used);
  free(bufs);
  if (rc != TP_OK) tp_memory_plan_free(p);
  return rc;
}

void tp_memory_plan_free(TpMemoryPlan *p) {
  for (int s = 0; p->order && s < p->nstages; s++) free(p->order[s]);
  free(p->value);
  free(p->scratch);
  free(p->params);
  free(p->arena_bytes);
  free(p->live_peak);
  free(p->total_bytes);
  free(p->nbuffers);
  free(p->order);
  free(p->norder);
  free(p->nforward);
  *p = (TpMemoryPlan){0};
}

/* "1234567 bytes (1.2 MiB)" */
static void print_bytes(FILE *out, const char *what, int64_t bytes, const char *note) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = -1;
  while (v >= 1024 && u < 3) v /= 1024, u++;
  fprintf(out, "%-18s %14lld bytes", what, (long long)bytes);
  if (u >= 0) fprintf(out, " (%.1f %s)", v, units[u]);
  if (note) fprintf(out, "  %s", note);
  fputc('\n', out);
}

void tp_print_memory(const TpModule *m, const TpMemoryPlan *p, FILE *out) {
  fprintf(out, "memory plan of %s\n", m->source ? m->source : "<module>");
  int64_t activations = 0;
  for (int s = 0; s < p->nstages; s++) {
    fprintf(out, "stage %d: %d ops (%d forward, %d backward), %d buffers\n", s, p->norder[s],
            p->nforward[s], p->norder[s] - p->nforward[s], p->nbuffers[s]);
    print_bytes(out, "  arena", p->arena_bytes[s], "peak activation bytes, as placed");
    print_bytes(out, "  live peak", p->live_peak[s], "most bytes live at once");
    print_bytes(out, "  no reuse", p->total_bytes[s], "every buffer on its own");
    activations += p->arena_bytes[s];
  }
  int64_t params = 0, grads = 0;
  int ntrainable = 0;
  for (int i = 0; i < p->nparams; i++) {
    int v = p->params[i];
    int64_t bytes = value_bytes(m, v);
    params += bytes;
    if (m->grads && tp_grad_of(m, v) >= 0) grads += bytes, ntrainable++;
  }
  char note[64];
  fprintf(out, "totals:\n");
  snprintf(note, sizeof note, "%d tensors, %lld floats", p->nparams, (long long)(params / 4));
  print_bytes(out, "  parameters", params, note);
  snprintf(note, sizeof note, "%d trainable tensors", ntrainable);
  print_bytes(out, "  gradients", grads, note);
  print_bytes(out, "  optimizer state", 2 * grads, "AdamW first and second moments");
  print_bytes(out, "  activations", activations, "the stage arenas");
  print_bytes(out, "  total", params + grads + 2 * grads + activations, NULL);
}
