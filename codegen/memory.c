/* The memory plan (see codegen.h): requires a module after the training pipeline (op stage
 * and phase set; the loss and the gradient map when it trains); provides a TpMemSlot per
 * value and per op scratch buffer.
 *
 * Each stage runs its forward units (slice 0..N-1), then its backward units (N-1..0), each
 * in module order. A value is live from the op that defines it to the last op of its stage
 * that reads it (the loss and the graph outputs to the end of the forward); boundary
 * buffers (what a boundary copy receives, and what its operand sends) for the whole
 * microbatch. Tied copies of a parameter share its index. A buffer live across a unit
 * boundary (or a boundary buffer, which the runtime fills and sends between units) is kept
 * in the microbatch's arena; one live inside one unit goes to a gap of the arena below the
 * kept buffers' top where one holds it, else to the stage's transient region, which every
 * unit of the rank reuses, whatever its microbatch: a rank runs one unit at a time (a
 * device target queues them, their collectives and their messages' packs in order on the
 * rank's stream). Buffers are placed greedily, largest first, each in the smallest gap
 * left by the buffers of its region already placed whose live ranges overlap its own
 * (else above them): deterministic, and close to the live peak. tp_memory_one_region
 * places a stage's buffers all in its arena instead, as a rank that keeps one microbatch at
 * a time prefers (codegen/pipeline.c decides).
 *
 * A split module (split-backward's @weight ops) runs each backward unit as its input part
 * and its weight part; the run order is the forward units, the input parts N-1..0, then the
 * weight parts N-1..0, and since a weight part may run any time after its input part, two
 * arena buffers share bytes only where one's last reader runs before the other's writer in
 * every order the schedules may run them in (Order, disjoint()). */
#include "codegen.h"

#include <stdlib.h>
#include <string.h>

static int64_t align_up(int64_t n) { return (n + TP_ARENA_ALIGN - 1) / TP_ARENA_ALIGN * TP_ARENA_ALIGN; }

static int64_t value_bytes(const TpModule *m, int v) {
  const TpType *t = &m->values[v].type;
  return tp_type_numel(t) * (int64_t)tp_dtype_size(t->dtype);
}

/* The rows of the context buffer value v lives in (a token slice's keys or values, a
 * Concat {context_rows}, ir/ops.def), or 0. */
int64_t tp_context_rows(const TpModule *m, int v) {
  int def = v >= 0 ? m->values[v].def : -1;
  return def >= 0 && m->ops[def].kind == TP_OP_Concat ? tp_attr_int(m, def, "context_rows", 0) : 0;
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

/* Is value v read as the class labels of a loss (so it is the trainer's targets)? A token
 * slice's loss reads a Slice of them (passes/split_sequence.c). */
static bool is_label_input(const TpModule *m, int v) {
  for (int i = 0; i < m->nops; i++) {
    const TpOp *o = &m->ops[i];
    int labels = -1;
    if (o->kind == TP_OP_CrossEntropy || o->kind == TP_OP_SoftmaxCrossEntropyLoss ||
        o->kind == TP_OP_NegativeLogLikelihoodLoss)
      labels = o->inputs[1];
    else if (o->kind == TP_OP_CrossEntropyBackward) labels = o->inputs[2];
    if (labels >= 0 && m->values[labels].kind == TP_VAL_RESULT && m->ops[m->values[labels].def].kind == TP_OP_Slice)
      labels = m->ops[m->values[labels].def].inputs[0];
    if (labels == v) return true;
  }
  return false;
}

/* May AllReduce op sum its operand's bytes in place (its result a view of them)? Only when
 * nothing else reads those bytes: the operand has a buffer of its own (not a view, a
 * context, a parameter's or a gradient's), and the op is its one reader (not the loss, not
 * a graph output). */
static bool reduces_in_place(const TpModule *m, const TpMemoryPlan *p, const int *uses, int op) {
  int x = m->ops[op].inputs[0];
  return p->value[x].kind == TP_MEM_ARENA && !tp_context_rows(m, x) && x != m->loss && uses[x] == 1;
}

/* Where each value lives, before any placement. uses[v]: tp_use_count(m, v), counted once
 * (asking per op is quadratic in a paper-scale module's ops). */
/* Is input v store-fp16's loss scale, the backward's seed d loss / d loss (%<loss>.grad)? */
static bool is_loss_scale(const TpModule *m, int v) {
  const TpValue *val = &m->values[v];
  if (m->loss < 0 || val->type.dtype != TP_F32 || val->type.rank != 0) return false;
  const char *loss = m->values[m->loss].name;
  size_t n = strlen(loss);
  return strncmp(val->name, loss, n) == 0 && strcmp(val->name + n, ".grad") == 0;
}

/* The trainer holds f32 parameters, or the 16-bit working copies of --precision bf16 or
 * fp16 (store-bf16, store-fp16), which ops read through a Cast to f32 or move (a re-tie
 * view). */
static int check_param_dtypes(const TpModule *m, TpDiag *d) {
  bool *computes_on = calloc((size_t)m->nvalues + 1, sizeof *computes_on);
  TP_ASSERT(computes_on);
  for (int op = 0; op < m->nops; op++)
    for (int i = 0; i < m->ops[op].ninputs; i++)
      if (m->ops[op].inputs[i] >= 0 && m->ops[op].kind != TP_OP_Cast && m->ops[op].role != TP_ROLE_RETIE)
        computes_on[m->ops[op].inputs[i]] = true;
  int rc = TP_OK;
  for (int v = 0; v < m->nvalues && rc == TP_OK; v++) {
    const TpValue *val = &m->values[v];
    if (val->kind == TP_VAL_PARAM && val->type.dtype != TP_F32 &&
        ((val->type.dtype != TP_BF16 && val->type.dtype != TP_F16) || computes_on[v]))
      rc = tp_internal(d,
                       "codegen: parameter '%s' is %s; the trainer holds f32 parameters, or bf16 or f16 ones "
                       "that ops read through a Cast (--precision)",
                       val->name, tp_dtype_name(val->type.dtype));
  }
  free(computes_on);
  return rc;
}

static int classify(const TpModule *m, TpMemoryPlan *p, const bool *used, const int *uses, const bool *bf16_results,
                    TpDiag *d) {
  int tokens = -1, targets = -1;
  int rc = check_param_dtypes(m, d);
  if (rc != TP_OK) return rc;
  for (int v = 0; v < m->nvalues; v++) {
    const TpValue *val = &m->values[v];
    TpMemSlot *s = &p->value[v];
    *s = (TpMemSlot){.kind = TP_MEM_NONE, .stage = -1, .offset = -1, .index = -1};
    if (val->kind == TP_VAL_PARAM) {
      s->kind = TP_MEM_PARAM;
      if (tp_tied_param(m, v) >= 0) continue; /* the copy of a parameter: below */
      s->index = p->nparams;
      p->params[p->nparams++] = v;
    } else if (val->kind == TP_VAL_CONST) {
      if (used[v]) s->kind = TP_MEM_CONST;
    } else if (val->kind == TP_VAL_INPUT) {
      if (!used[v]) continue;
      if (is_loss_scale(m, v)) {
        s->kind = TP_MEM_LOSS_SCALE;
        continue;
      }
      bool labels = is_label_input(m, v);
      int *which = labels ? &targets : &tokens;
      if (*which >= 0)
        return tp_internal(d, "codegen: inputs '%s' and '%s' both hold %s; the trainer feeds one",
                           m->values[*which].name, val->name, labels ? "targets" : "token ids");
      if (val->type.dtype != TP_I64 || val->type.rank != 2)
        return tp_internal(d, "codegen: input '%s' is %s; the trainer feeds i64[batch, seq] %s", val->name,
                           tp_dtype_name(val->type.dtype), labels ? "targets" : "token ids");
      *which = v;
      s->kind = labels ? TP_MEM_TARGETS : TP_MEM_TOKENS;
    }
  }
  if (tokens >= 0 && targets >= 0 && !tp_type_equal(&m->values[tokens].type, &m->values[targets].type))
    return tp_internal(d, "codegen: token ids '%s' and targets '%s' differ in shape", m->values[tokens].name,
                       m->values[targets].name);
  /* A tied copy (on the last stage) is its parameter, in that stage's buffers. */
  for (int v = 0; v < m->nvalues; v++) {
    int owner = tp_tied_param(m, v);
    if (owner >= 0) p->value[v].index = p->value[owner].index;
  }
  /* Gradients of parameters (and the partial gradients of tied copies) go straight to the
   * trainer's gradient buffers. */
  for (int v = 0; v < m->nvalues; v++) {
    int g = m->values[v].kind == TP_VAL_PARAM ? tp_grad_of(m, v) : -1;
    if (g < 0) continue;
    if (m->values[g].kind != TP_VAL_RESULT)
      return tp_internal(d, "codegen: the gradient of '%s' is not computed by an op", m->values[v].name);
    if (p->value[g].kind == TP_MEM_GRAD)
      return tp_internal(d, "codegen: '%s' is the gradient of two parameters", m->values[g].name);
    p->value[g] = (TpMemSlot){.kind = TP_MEM_GRAD, .stage = -1, .offset = -1, .index = p->value[v].index};
  }
  /* A gradient that is a Reshape of a value read nowhere else: that value is computed in the
   * gradient buffer directly (the Reshape then has nothing to do). */
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    int r = o->outputs[0], x = o->inputs[0];
    if (o->kind == TP_OP_Reshape && p->value[r].kind == TP_MEM_GRAD && m->values[x].kind == TP_VAL_RESULT &&
        p->value[x].kind == TP_MEM_NONE && x != m->loss && uses[x] == 1)
      p->value[x] = p->value[r];
  }
  /* Other results: a Reshape is a view of its operand's bytes, and so is a slice's
   * context of the one before (they share the buffer the first slice's context owns: its
   * bytes times context_rows / its rows), a TensorCopy (the identity on each rank) and an
   * AllReduce that may sum its operand's bytes in place; the rest need a buffer. */
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    for (int k = 0; k < o->noutputs; k++) {
      int r = o->outputs[k];
      if (r < 0 || p->value[r].kind != TP_MEM_NONE) continue;
      TpMemSlot *s = &p->value[r];
      int64_t context_rows = tp_context_rows(m, r);
      if ((o->kind == TP_OP_Reshape && !tp_is_boundary_op(m, op)) || (context_rows && o->ninputs == 2) ||
          o->kind == TP_OP_TensorCopy || (o->kind == TP_OP_AllReduce && reduces_in_place(m, p, uses, op))) {
        s->kind = TP_MEM_VIEW;
        s->index = o->inputs[0];
      } else if (context_rows) {
        const TpType *t = &m->values[r].type;
        s->kind = TP_MEM_ARENA;
        s->stage = o->stage;
        s->bytes = align_up(value_bytes(m, r) / t->dims[tp_attr_int(m, op, "axis", 0)] * context_rows);
      } else {
        s->kind = TP_MEM_ARENA;
        s->stage = o->stage;
        s->bf16 = bf16_results && bf16_results[r];
        s->bytes = align_up(s->bf16 ? tp_type_numel(&m->values[r].type) * 2 : value_bytes(m, r));
      }
    }
  }
  /* A context is laid out with context_rows rows: only its readers that know (attention,
   * through TpAttention.kv_rows, and the next slice's context) may read it. */
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    for (int i = 0; i < o->ninputs; i++) {
      int64_t rows = tp_context_rows(m, o->inputs[i]);
      bool kv = (o->kind == TP_OP_Attention && (i == 1 || i == 2)) ||
                (o->kind == TP_OP_AttentionBackward && (i == 2 || i == 3));
      if (rows && !kv && !(i == 0 && tp_context_rows(m, o->outputs[0]) == rows))
        return tp_internal(d, "codegen: the token-slice context '%s' is read by %s, which cannot read it in place",
                           m->values[o->inputs[i]].name, op_name(m, op));
    }
  }
  return TP_OK;
}

/* The slice whose unit runs op: its own; for an unsliced op the latest unit its operands
 * come from (forward: the highest slice; backward, which runs slices in reverse: the
 * lowest), so it runs once everything it reads exists. A boundary copy belongs to the
 * unit its value is sent after. */
static void unit_slices(const TpModule *m, int nslices, int *eff) {
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    bool fwd = o->phase == TP_PHASE_FORWARD;
    int e = o->slice >= 0 ? o->slice : fwd ? 0 : nslices - 1;
    for (int i = 0; o->slice < 0 && i < o->ninputs; i++) {
      int v = o->inputs[i], def = v >= 0 && m->values[v].kind == TP_VAL_RESULT ? m->values[v].def : -1;
      if (def < 0 || m->ops[def].phase != o->phase) continue;
      if (fwd ? eff[def] > e : eff[def] < e) e = eff[def];
    }
    eff[op] = e < 0 ? 0 : e >= nslices ? nslices - 1 : e;
  }
}

/* Run step r of a stage: forward slice r (r < N), then backward slice 2N - 1 - r, then
 * (split) the weight part of slice 3N - 1 - r. */
static int run_step(const TpOp *o, int N, int slice) {
  return o->phase == TP_PHASE_FORWARD ? slice : o->weight ? 3 * N - 1 - slice : 2 * N - 1 - slice;
}

/* The stage's run order: forward units slice 0..N-1, then backward units N-1..0 (split:
 * their input parts, then their weight parts N-1..0), each in module order. */
static int order_ops(const TpModule *m, TpMemoryPlan *p, int *pos, TpDiag *d) {
  int N = p->nslices, *eff = malloc(((size_t)m->nops + 1) * sizeof *eff);
  TP_ASSERT(eff);
  unit_slices(m, N, eff);
  /* One stable bucket pass puts each op at its (stage, step) in module order (scanning
   * every op for each unit is quadratic in a paper-scale module). */
  int steps = (p->split ? 3 : 2) * N, *first = calloc((size_t)p->nstages * steps + 1, sizeof *first);
  TP_ASSERT(first);
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    if (o->stage < 0 || o->stage >= p->nstages || eff[op] < 0 || eff[op] >= N) continue;
    first[o->stage * steps + run_step(o, N, eff[op]) + 1]++;
  }
  for (int s = 0; s < p->nstages; s++) {
    p->order[s] = malloc((size_t)(m->nops + 1) * sizeof(int));
    p->unit_begin[s] = malloc(sizeof(int) * (size_t)steps);
    p->unit_end[s] = malloc(sizeof(int) * (size_t)steps);
    TP_ASSERT(p->order[s] && p->unit_begin[s] && p->unit_end[s]);
    int *at = &first[s * steps];
    at[0] = 0;
    for (int r = 0; r < steps; r++) {
      int slice = r < N ? r : r < 2 * N ? 2 * N - 1 - r : 3 * N - 1 - r;
      int unit = tp_unit_index(p, r >= N, r >= 2 * N, slice);
      at[r + 1] += at[r];
      p->unit_begin[s][unit] = at[r];
      p->unit_end[s][unit] = at[r + 1];
    }
    p->norder[s] = at[steps];
    p->nforward[s] = at[N];
  }
  for (int op = 0; op < m->nops; op++) { /* first[s * steps + r] walks through step r's places */
    const TpOp *o = &m->ops[op];
    if (o->stage < 0 || o->stage >= p->nstages || eff[op] < 0 || eff[op] >= N) continue;
    int *next = &first[o->stage * steps + run_step(o, N, eff[op])];
    pos[op] = *next;
    p->order[o->stage][(*next)++] = op;
  }
  free(first);
  /* Every op runs after what it reads on its stage; a forward op must not read what the
   * backward computes. */
  int rc = TP_OK;
  for (int op = 0; op < m->nops && rc == TP_OK; op++) {
    const TpOp *o = &m->ops[op];
    for (int i = 0; i < o->ninputs && rc == TP_OK; i++) {
      int v = o->inputs[i], def = v >= 0 && m->values[v].kind == TP_VAL_RESULT ? m->values[v].def : -1;
      if (def < 0) continue;
      if (o->phase == TP_PHASE_FORWARD && m->ops[def].phase == TP_PHASE_BACKWARD)
        rc = tp_internal(d, "codegen: forward op '%s' reads '%s' of the backward pass", op_name(m, op),
                         m->values[v].name);
      else if (m->ops[def].stage == o->stage && pos[def] >= pos[op])
        rc = tp_internal(d,
                         "codegen: op '%s' (slice %d) reads '%s', computed later (slice %d) in stage %d's run "
                         "order",
                         op_name(m, op), eff[op], m->values[v].name, eff[def], o->stage);
    }
  }
  free(eff);
  return rc;
}

/* The boundary messages: per stage and slice, what the boundary copies receive and what
 * their operands send, in module order on both sides. */
static void list_messages(const TpModule *m, TpMemoryPlan *p, const int *pos) {
  int N = p->nslices;
  for (int s = 0; s < p->nstages; s++) {
    p->messages[s] = calloc((size_t)(TP_MSG_COUNT * N), sizeof(TpMemMessage));
    TP_ASSERT(p->messages[s]);
  }
  for (int op = 0; op < m->nops; op++) {
    if (!tp_is_boundary_op(m, op)) continue;
    const TpOp *o = &m->ops[op];
    int x = o->inputs[0], from = m->ops[m->values[x].def].stage, slice = 0;
    for (int i = 0; i < N; i++)
      if (p->unit_begin[o->stage][o->phase * N + i] <= pos[op] && pos[op] < p->unit_end[o->stage][o->phase * N + i])
        slice = i;
    bool fwd = o->phase == TP_PHASE_FORWARD;
    TpMemMessage *recv = &p->messages[o->stage][(fwd ? TP_MSG_RECV_ACT : TP_MSG_RECV_GRAD) * N + slice];
    TpMemMessage *send = &p->messages[from][(fwd ? TP_MSG_SEND_ACT : TP_MSG_SEND_GRAD) * N + slice];
    recv->values = realloc(recv->values, sizeof(int) * (size_t)(recv->n + 1));
    send->values = realloc(send->values, sizeof(int) * (size_t)(send->n + 1));
    TP_ASSERT(recv->values && send->values);
    recv->values[recv->n++] = o->outputs[0];
    send->values[send->n++] = x;
  }
}

/* Where each parameter is held: the stages whose ops read it or its tied copy. */
static void param_stages(const TpModule *m, TpMemoryPlan *p) {
  for (int i = 0; i < p->nparams; i++) p->param_stage[i] = -1;
  for (int op = 0; op < m->nops; op++)
    for (int k = 0; k < m->ops[op].ninputs; k++) {
      int v = m->ops[op].inputs[k], s = m->ops[op].stage;
      if (v < 0 || p->value[v].kind != TP_MEM_PARAM) continue;
      int i = p->value[v].index;
      if (tp_tied_param(m, v) >= 0) p->param_tied_stage[i] = s;
      else if (p->param_stage[i] < 0 || s < p->param_stage[i]) p->param_stage[i] = s;
    }
  for (int i = 0; i < p->nparams; i++)
    if (p->param_stage[i] < 0) p->param_stage[i] = 0;
}

/* The value whose bytes v uses (v itself unless it is a view). */
static int storage_of(const TpMemoryPlan *p, int v) {
  while (p->value[v].kind == TP_MEM_VIEW) v = p->value[v].index;
  return v;
}

/* Live ranges of the arena buffers, in stage positions. */
/* A matrix product reading a read-back Cast's result (store-bf16's f32 widening of a bf16
 * value) that the target folds, reading the bf16 value itself: that value's buffer. */
static bool product_reads_bf16(const TpModule *m, const TpOp *o, int i) {
  int c = m->values[o->inputs[i]].kind == TP_VAL_RESULT ? m->values[o->inputs[i]].def : -1;
  bool product = o->kind == TP_OP_Linear || o->kind == TP_OP_LinearBackward || o->kind == TP_OP_MatMul ||
                 o->kind == TP_OP_MatMulBackward || o->kind == TP_OP_Gemm;
  return product && c >= 0 && m->ops[c].kind == TP_OP_Cast && m->values[m->ops[c].inputs[0]].type.dtype == TP_BF16 &&
         m->values[o->inputs[i]].type.dtype == TP_F32;
}

/* The unit (index tp_unit_index) running position `at` of stage s's order. */
static int unit_at(const TpMemoryPlan *p, int s, int at) {
  for (int u = 0; u < (p->split ? 3 : 2) * p->nslices; u++)
    if (p->unit_begin[s][u] <= at && at < p->unit_end[s][u]) return u;
  return -1;
}

/* Where stage s's weight parts begin in its order (split plans). */
static int weight_begin(const TpMemoryPlan *p, int s) {
  return p->unit_begin[s][tp_unit_index(p, true, true, p->nslices - 1)];
}

/* Arena buffer s is read at position t of its stage's order. */
static void read_at(const TpMemoryPlan *p, TpMemSlot *s, int t) {
  if (t > s->last) s->last = t;
  if (p->split && t >= p->nforward[s->stage] && t < weight_begin(p, s->stage) && t > s->last_input)
    s->last_input = t;
}

static int live_ranges(const TpModule *m, const TpMemoryOptions *mo, TpMemoryPlan *p, const int *pos, TpDiag *d) {
  for (int op = 0; op < m->nops; op++)
    for (int k = 0; k < m->ops[op].noutputs; k++) {
      int r = m->ops[op].outputs[k];
      if (r >= 0 && p->value[r].kind == TP_MEM_ARENA) {
        p->value[r].first = p->value[r].last = pos[op];
        p->value[r].last_input = -1;
      }
    }
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    for (int i = 0; i < o->ninputs; i++) {
      if (o->inputs[i] < 0) continue;
      int v = storage_of(p, o->inputs[i]);
      TpMemSlot *s = &p->value[v];
      if (s->kind != TP_MEM_ARENA) continue;
      if (s->stage != o->stage) {
        if (tp_is_boundary_op(m, op)) continue; /* sent: pinned below */
        return tp_internal(d,
                           "codegen: '%s' is computed in stage %d and read in stage %d without a "
                           "boundary copy (run assign-stages and finish-stages)",
                           m->values[o->inputs[i]].name, s->stage, o->stage);
      }
      read_at(p, s, pos[op]);
      if (mo && mo->products_read_bf16 && product_reads_bf16(m, o, i)) {
        TpMemSlot *b = &p->value[storage_of(p, m->ops[m->values[o->inputs[i]].def].inputs[0])];
        if (b->kind == TP_MEM_ARENA && b->stage == o->stage) read_at(p, b, pos[op]);
      }
    }
  }
  /* Boundary buffers live for the whole microbatch: the runtime fills and sends them
   * between units, and a send may complete late. */
  for (int op = 0; op < m->nops; op++) {
    if (!tp_is_boundary_op(m, op)) continue;
    for (int k = 0; k < 2; k++) {
      int v = storage_of(p, k ? m->ops[op].outputs[0] : m->ops[op].inputs[0]);
      TpMemSlot *s = &p->value[v];
      if (s->kind != TP_MEM_ARENA)
        return tp_internal(d, "codegen: boundary value '%s' is not an activation in the arena", m->values[v].name);
      s->first = 0;
      s->last = p->norder[s->stage] - 1;
    }
  }
  /* The loss and the graph outputs are read after the forward. */
  for (int i = 0; i <= m->noutputs; i++) {
    int v = i < m->noutputs ? m->outputs[i] : m->loss;
    if (v < 0) continue;
    TpMemSlot *s = &p->value[storage_of(p, v)];
    if (s->kind == TP_MEM_ARENA && s->last < p->nforward[s->stage] - 1 && s->first < p->nforward[s->stage])
      s->last = p->nforward[s->stage] - 1;
  }
  for (int op = 0; op < m->nops; op++) {
    int64_t bytes = align_up(tp_op_scratch_bytes(m, op));
    if (bytes)
      p->scratch[op] = (TpMemSlot){.kind = TP_MEM_ARENA,
                                   .stage = m->ops[op].stage,
                                   .bytes = bytes,
                                   .index = -1,
                                   .first = pos[op],
                                   .last = pos[op],
                                   .last_input = -1};
  }
  return TP_OK;
}

static bool overlap(const TpMemSlot *a, const TpMemSlot *b) { return a->first <= b->last && b->first <= a->last; }

/* A split plan's run order puts every weight part after every input part, but the
 * schedules run a microbatch's units in a partial order (passes/planner/schedule.c
 * check_units verifies every list against it): the forward units in slice order before
 * every backward unit, the input parts N-1..0, the weight part of slice i after the input
 * part of slice i, and the weight parts N-1..0 (their partial sums of each parameter's
 * gradient pass from one to the next). So the weight part of slice i may run before or
 * after the input parts of slices below i: the one pair of units that the plan's order
 * puts one way and a run may put the other. unit[t]: the unit running position t of the
 * stage's order, NULL for a plan that is not split (its order is the run's). */
typedef struct {
  const TpMemoryPlan *p;
  int *unit;
} Order;

/* Does position a run before position b in every run of the microbatch? */
static bool runs_before(const Order *o, int a, int b) {
  if (a >= b) return false;
  if (!o->unit) return true;
  int N = o->p->nslices, ua = o->unit[a], ub = o->unit[b];
  bool input = ua >= N && ua < 2 * N, weight = ub >= 2 * N;
  return !(input && weight && ub - 2 * N > ua - N); /* input part of slice i, weight part of a slice above i */
}

/* Is every use of a before b's first in every run? Its last use in the op order, and its
 * last in an input part: a run may put that one after a weight part that the order puts
 * later (read by input part 0 and weight part 2, a buffer is still read after weight part
 * 1 in the run I2 W2 I1 W1 I0). Forward readers come before every backward unit. */
static bool ends_before(const Order *o, const TpMemSlot *a, const TpMemSlot *b) {
  return runs_before(o, a->last, b->first) && (a->last_input < 0 || runs_before(o, a->last_input, b->first));
}

/* May buffers a and b share bytes: is either one's every use before the other's first in
 * every run? (Not split: their live ranges do not overlap.) */
static bool disjoint(const Order *o, const TpMemSlot *a, const TpMemSlot *b) {
  if (!o->unit) return !overlap(a, b);
  return ends_before(o, a, b) || ends_before(o, b, a);
}

/* A buffer to place; id (values in printed order, then scratch buffers in op order) breaks ties. */
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

/* Where buffer b goes among the placed buffers placed[0, n) of its region: the smallest gap
 * between those it may be alive beside (disjoint()) that holds it, else above them all; -1
 * when that would end past `limit` (< 0: none). near: room for n pointers. */
static int64_t fit(const Order *o, const TpMemSlot *b, TpMemSlot *const *placed, int n, TpMemSlot **near,
                   int64_t limit) {
  int nnear = 0;
  for (int j = 0; j < n; j++)
    if (!disjoint(o, b, placed[j]) && placed[j]->bytes) near[nnear++] = placed[j];
  qsort(near, (size_t)nnear, sizeof *near, by_offset);
  int64_t cursor = 0, best = -1, best_gap = INT64_MAX;
  for (int j = 0; j < nnear; j++) {
    int64_t gap = near[j]->offset - cursor;
    if (gap >= b->bytes && gap < best_gap) best = cursor, best_gap = gap;
    if (near[j]->offset + near[j]->bytes > cursor) cursor = near[j]->offset + near[j]->bytes;
  }
  int64_t at = best >= 0 ? best : cursor;
  return limit >= 0 && at + b->bytes > limit ? -1 : at;
}

/* Greedy placement of stage s's buffers, largest first: the kept ones bufs[0, nkept) in the
 * arena, then each of the others (alive inside one unit) in a gap that the arena has below
 * its top where one holds it (bytes every microbatch holds anyway), else in the transient
 * region (whose buffers live inside one unit each, and a rank runs one unit at a time: there
 * the plan's order is as good as any). Sets the offsets and regions, and the sizes of both. */
static void place(TpMemoryPlan *p, int s, Buf *bufs, int nkept, int n) {
  Order order = {p, NULL}, within = {p, NULL};
  if (p->split) {
    order.unit = malloc(((size_t)p->norder[s] + 1) * sizeof *order.unit);
    TP_ASSERT(order.unit);
    for (int u = 0; u < 3 * p->nslices; u++)
      for (int t = p->unit_begin[s][u]; t < p->unit_end[s][u]; t++) order.unit[t] = u;
  }
  qsort(bufs, (size_t)nkept, sizeof *bufs, by_size);
  qsort(bufs + nkept, (size_t)(n - nkept), sizeof *bufs, by_size);
  TpMemSlot **arena = malloc((size_t)(n + 1) * sizeof *arena),
            **transient = malloc((size_t)(n + 1) * sizeof *transient),
            **near = malloc((size_t)(n + 1) * sizeof *near);
  TP_ASSERT(arena && transient && near);
  int narena = 0, ntransient = 0;
  int64_t top = 0, transient_top = 0;
  for (int i = 0; i < n; i++) {
    TpMemSlot *b = bufs[i].s;
    /* a weight part's own buffers stay out of the arena (codegen/pipeline.c keeps them there) */
    bool gapless = i >= nkept && p->split && b->first >= weight_begin(p, s);
    int64_t at = gapless ? -1 : fit(&order, b, arena, narena, near, i < nkept ? -1 : top);
    b->transient = at < 0;
    if (b->transient) {
      b->offset = fit(&within, b, transient, ntransient, near, -1);
      transient[ntransient++] = b;
      if (b->offset + b->bytes > transient_top) transient_top = b->offset + b->bytes;
    } else {
      b->offset = at;
      arena[narena++] = b;
      if (b->offset + b->bytes > top) top = b->offset + b->bytes;
    }
  }
  free(arena);
  free(transient);
  free(near);
  free(order.unit);
  p->arena_bytes[s] = top;
  p->transient_bytes[s] = transient_top;
}

/* Stage s's buffers into bufs, returning how many; the first *nkept of them are those a
 * microbatch keeps in its arena: what lives from one of its units into a later one
 * (activations saved for the backward, K/V contexts and their gradients) and the boundary
 * buffers (boundary[v]: the runtime fills and sends them between units); the others live
 * inside one unit. boundary NULL: all of them kept (one region). */
/* Each value's place in the printed IR (results in op order, after the rest): placement
 * ties go by it, so IR read back places its buffers as the module it was printed from
 * (store-bf16 appends its casts' values after the backward's). Freed by the caller. */
static int *printed_order(const TpModule *m) {
  int *printed = malloc(((size_t)m->nvalues + 1) * sizeof *printed), next = 0;
  TP_ASSERT(printed);
  for (int v = 0; v < m->nvalues; v++) printed[v] = m->values[v].kind != TP_VAL_RESULT ? next++ : -1;
  for (int op = 0; op < m->nops; op++)
    for (int k = 0; k < m->ops[op].noutputs; k++) {
      int r = m->ops[op].outputs[k];
      if (r >= 0 && printed[r] < 0 && m->values[r].def == op) printed[r] = next++;
    }
  for (int v = 0; v < m->nvalues; v++)
    if (printed[v] < 0) printed[v] = next++;
  return printed;
}

static int stage_buffers(const TpModule *m, TpMemoryPlan *p, int s, const bool *boundary, Buf *bufs, int *nkept) {
  int n = 0, *printed = printed_order(m);
  for (int pass = 0; pass < 2; pass++) { /* the kept ones first */
    for (int i = 0; i < m->nvalues + m->nops; i++) {
      TpMemSlot *b = i < m->nvalues ? &p->value[i] : &p->scratch[i - m->nvalues];
      if (b->kind != TP_MEM_ARENA || b->stage != s) continue;
      int u = boundary ? unit_at(p, s, b->first) : -1;
      bool inside = u >= 0 && b->last < p->unit_end[s][u] && !(i < m->nvalues && boundary[i]);
      if (inside == (pass == 1)) bufs[n++] = (Buf){b, i < m->nvalues ? printed[i] : i};
    }
    if (pass == 0) *nkept = n;
  }
  free(printed);
  return n;
}

void tp_memory_one_region(const TpModule *m, TpMemoryPlan *p, int s) {
  Buf *bufs = malloc((size_t)(m->nvalues + m->nops + 1) * sizeof *bufs);
  TP_ASSERT(bufs);
  int nkept, n = stage_buffers(m, p, s, NULL, bufs, &nkept);
  place(p, s, bufs, n, n);
  free(bufs);
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

int tp_plan_memory(const TpModule *m, const TpMemoryOptions *mo, TpMemoryPlan *p, TpDiag *d) {
  *p = (TpMemoryPlan){0};
  p->nstages = p->nslices = 1;
  for (int op = 0; op < m->nops; op++) {
    TP_ASSERT(m->ops[op].stage >= 0);
    if (m->ops[op].stage >= p->nstages) p->nstages = m->ops[op].stage + 1;
    if (m->ops[op].slice >= p->nslices) p->nslices = m->ops[op].slice + 1;
    p->split |= m->ops[op].weight;
  }
  int ns = p->nstages, nv = m->nvalues, no = m->nops;
  p->value = calloc((size_t)nv + 1, sizeof *p->value);
  p->scratch = calloc((size_t)no + 1, sizeof *p->scratch);
  p->params = calloc((size_t)nv + 1, sizeof *p->params);
  p->arena_bytes = calloc((size_t)ns, sizeof *p->arena_bytes);
  p->transient_bytes = calloc((size_t)ns, sizeof *p->transient_bytes);
  p->one_region_bytes = calloc((size_t)ns, sizeof *p->one_region_bytes);
  p->live_peak = calloc((size_t)ns, sizeof *p->live_peak);
  p->total_bytes = calloc((size_t)ns, sizeof *p->total_bytes);
  p->nbuffers = calloc((size_t)ns, sizeof *p->nbuffers);
  p->order = calloc((size_t)ns, sizeof *p->order);
  p->norder = calloc((size_t)ns, sizeof *p->norder);
  p->nforward = calloc((size_t)ns, sizeof *p->nforward);
  p->unit_begin = calloc((size_t)ns, sizeof *p->unit_begin);
  p->unit_end = calloc((size_t)ns, sizeof *p->unit_end);
  p->messages = calloc((size_t)ns, sizeof *p->messages);
  p->param_stage = calloc((size_t)nv + 1, sizeof *p->param_stage);
  p->param_tied_stage = calloc((size_t)nv + 1, sizeof *p->param_tied_stage);
  int *pos = calloc((size_t)no + 1, sizeof *pos);
  bool *used = calloc((size_t)nv + 1, sizeof *used);
  int *uses = calloc((size_t)nv + 1, sizeof *uses);
  Buf *bufs = malloc((size_t)(nv + no + 1) * sizeof *bufs);
  TP_ASSERT(p->value && p->scratch && p->params && p->arena_bytes && p->transient_bytes && p->one_region_bytes &&
            p->live_peak && p->total_bytes && p->nbuffers && p->order && p->norder && p->nforward && pos && used &&
            uses && bufs && p->unit_begin && p->unit_end && p->messages && p->param_stage && p->param_tied_stage);
  for (int op = 0; op < no; op++)
    for (int i = 0; i < m->ops[op].ninputs; i++)
      if (m->ops[op].inputs[i] >= 0) {
        used[m->ops[op].inputs[i]] = true;
        uses[m->ops[op].inputs[i]] += !m->ops[op].dead;
      }
  for (int i = 0; i < m->noutputs; i++) uses[m->outputs[i]]++;

  int rc = classify(m, p, used, uses, mo ? mo->bf16_results : NULL, d);
  if (rc == TP_OK) rc = order_ops(m, p, pos, d);
  if (rc == TP_OK) rc = live_ranges(m, mo, p, pos, d);
  if (rc == TP_OK) list_messages(m, p, pos), param_stages(m, p);
  bool *boundary = calloc((size_t)nv + 1, sizeof *boundary);
  TP_ASSERT(boundary);
  for (int op = 0; op < no && rc == TP_OK; op++)
    if (tp_is_boundary_op(m, op))
      boundary[storage_of(p, m->ops[op].inputs[0])] = boundary[storage_of(p, m->ops[op].outputs[0])] = true;
  for (int s = 0; s < ns && rc == TP_OK; s++) {
    int nkept, n = stage_buffers(m, p, s, NULL, bufs, &nkept);
    for (int i = 0; i < n; i++) p->total_bytes[s] += bufs[i].s->bytes;
    p->live_peak[s] = live_peak(bufs, n, p->norder[s]);
    p->nbuffers[s] = n;
    place(p, s, bufs, n, n);
    p->one_region_bytes[s] = p->arena_bytes[s];
    n = stage_buffers(m, p, s, boundary, bufs, &nkept);
    place(p, s, bufs, nkept, n);
  }
  free(boundary);
  free(pos);
  free(used);
  free(uses);
  free(bufs);
  if (rc != TP_OK) tp_memory_plan_free(p);
  return rc;
}

/* Does op o hand on the values of an id-carrying operand as they are (selecting, moving or
 * repeating them, never computing new ones)? */
static bool moves_ids(const TpModule *m, const TpOp *o, const bool *ids) {
  switch (o->kind) {
  case TP_OP_Slice:
  case TP_OP_Reshape:
  case TP_OP_Transpose:
  case TP_OP_Expand:
  case TP_OP_Split:
  case TP_OP_Gather: return ids[o->inputs[0]];
  case TP_OP_Cast: return ids[o->inputs[0]] && tp_dtype_is_integer(m->values[o->outputs[0]].type.dtype);
  case TP_OP_Concat:
    for (int k = 0; k < o->ninputs; k++)
      if (o->inputs[k] >= 0 && ids[o->inputs[k]]) return true;
    return false;
  default: return false;
  }
}

int64_t tp_loss_classes(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  const TpType *t = &m->values[o->inputs[0]].type;
  if (o->kind != TP_OP_CrossEntropy) return t->dims[1];
  const TpType *stats = o->ninputs > 2 && o->inputs[2] >= 0 ? &m->values[o->inputs[2]].type : NULL;
  int64_t parts = stats ? (stats->dims[stats->rank - 1] - 1) / 2 : 1;       /* 2 P + 1 columns (ir/infer.c) */
  return t->dims[t->rank - 1] * parts - tp_attr_int(m, op, "vocab_pad", 0); /* a padded vocabulary's true V */
}

int64_t tp_token_limit(const TpModule *m, const TpMemoryPlan *plan, char *what, size_t what_size) {
  bool *ids = calloc((size_t)m->nvalues + 1, sizeof *ids);
  TP_ASSERT(ids);
  for (int v = 0; v < m->nvalues; v++)
    ids[v] = plan->value[v].kind == TP_MEM_TOKENS || plan->value[v].kind == TP_MEM_TARGETS;
  for (bool more = true; more;) { /* to a fixed point: the op order need not be the data flow's */
    more = false;
    for (int op = 0; op < m->nops; op++) {
      const TpOp *o = &m->ops[op];
      if (o->dead || !moves_ids(m, o, ids)) continue;
      for (int k = 0; k < o->noutputs; k++)
        if (o->outputs[k] >= 0 && !ids[o->outputs[k]]) ids[o->outputs[k]] = more = true;
    }
  }
  int64_t limit = 0;
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    if (o->dead || o->ninputs < 2 || !ids[o->inputs[1]]) continue;
    const TpType *t = &m->values[o->inputs[0]].type;
    int64_t n = 0;
    if (o->kind == TP_OP_Embedding || o->kind == TP_OP_Gather) {
      int64_t axis = o->kind == TP_OP_Gather ? tp_attr_int(m, op, "axis", 0) : 0;
      if (axis < 0) axis += t->rank;
      if (axis < 0 || axis >= t->rank) continue;
      n = t->dims[axis] * (o->kind == TP_OP_Embedding ? tp_attr_int(m, op, "vocab_parts", 1) : 1);
      if (o->kind == TP_OP_Embedding)           /* split or not */
        n -= m->values[o->inputs[0]].shard.pad; /* a padded table's true rows: no id reaches the padding */
      if (n > 0 && (!limit || n < limit))
        snprintf(what, what_size, "the %lld rows of table '%s'", (long long)n, m->values[o->inputs[0]].name);
    } else if (o->kind == TP_OP_CrossEntropy || o->kind == TP_OP_SoftmaxCrossEntropyLoss ||
               o->kind == TP_OP_NegativeLogLikelihoodLoss) {
      n = tp_loss_classes(m, op);
      if (n > 0 && (!limit || n < limit))
        snprintf(what, what_size, "the %lld classes of the loss on '%s'", (long long)n,
                 m->values[o->inputs[0]].name);
    }
    if (n > 0 && (!limit || n < limit)) limit = n;
  }
  free(ids);
  return limit;
}

void tp_memory_plan_free(TpMemoryPlan *p) {
  for (int s = 0; p->order && s < p->nstages; s++) free(p->order[s]);
  for (int s = 0; p->unit_begin && s < p->nstages; s++) free(p->unit_begin[s]), free(p->unit_end[s]);
  for (int s = 0; p->messages && s < p->nstages; s++) {
    for (int k = 0; p->messages[s] && k < TP_MSG_COUNT * p->nslices; k++) free(p->messages[s][k].values);
    free(p->messages[s]);
  }
  free(p->unit_begin);
  free(p->unit_end);
  free(p->messages);
  free(p->param_stage);
  free(p->param_tied_stage);
  free(p->value);
  free(p->scratch);
  free(p->params);
  free(p->arena_bytes);
  free(p->transient_bytes);
  free(p->one_region_bytes);
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

void tp_print_memory(const TpModule *m, const TpMemoryPlan *p, const TpPipeline *pl, FILE *out) {
  fprintf(out, "memory plan of %s\n", m->source ? m->source : "<module>");
  int64_t activations = 0;
  for (int s = 0; s < p->nstages; s++) {
    fprintf(out, "stage %d: %d ops (%d forward, %d backward", s, p->norder[s], p->nforward[s],
            p->norder[s] - p->nforward[s]);
    if (p->split) /* the input parts, then the weight parts */
      fprintf(out, ": %d input, %d weight", weight_begin(p, s) - p->nforward[s], p->norder[s] - weight_begin(p, s));
    fprintf(out, "), %d buffers\n", p->nbuffers[s]);
    print_bytes(out, "  kept", p->arena_bytes[s],
                p->split                ? "a microbatch's arena: what it keeps from unit to unit (to its weight "
                                          "parts, in any order they may run), as placed"
                : p->transient_bytes[s] ? "a microbatch's arena: what it keeps from unit to unit, as placed"
                                        : "a microbatch's arena: all its buffers, as placed");
    print_bytes(out, "  transient", p->transient_bytes[s], "the rank's region for what lives inside one unit");
    print_bytes(out, "  live peak", p->live_peak[s],
                p->split ? "most bytes of a microbatch live at once, input parts first"
                         : "most bytes of a microbatch live at once");
    print_bytes(out, "  no reuse", p->total_bytes[s], "every buffer on its own");
    activations += p->arena_bytes[s] + p->transient_bytes[s];
  }
  int64_t params = 0, grads = 0, elements = 0, trained = 0; /* bytes as stored (16-bit under bf16, fp16) */
  int ntrainable = 0;
  for (int i = 0; i < p->nparams; i++) {
    int v = p->params[i];
    int64_t bytes = value_bytes(m, v), n = tp_type_numel(&m->values[v].type);
    params += bytes, elements += n;
    if (m->grads && tp_grad_of(m, v) >= 0) grads += bytes, trained += n, ntrainable++;
  }
  char note[256];
  int tensor = tp_tensor_ranks(m);
  if (tensor > 1) fprintf(out, "totals (per tensor rank: its parts of the parameters split %d ways):\n", tensor);
  else fprintf(out, "totals:\n");
  snprintf(note, sizeof note, "%d tensors, %lld floats", p->nparams, (long long)elements);
  print_bytes(out, "  parameters", params, note);
  snprintf(note, sizeof note, "%d trainable tensors", ntrainable);
  print_bytes(out, "  gradients", grads, note);
  print_bytes(out, "  optimizer state", 8 * trained, "AdamW first and second moments");
  print_bytes(out, "  activations", activations, "one microbatch's kept and transient bytes");
  print_bytes(out, "  total", params + grads + 8 * trained + activations, NULL);
  if (!pl) return;
  if (tensor > 1) snprintf(note, sizeof note, " x %d tensor ranks", tensor);
  int S = pl->schedule.stages, V = pl->chunks;
  char chunks[64] = "";
  if (V > 1) snprintf(chunks, sizeof chunks, " (x %d chunks: %d virtual stages)", V, S * V);
  fprintf(out, "ranks: %d stage%s%s%s x %d replica%s; %s schedule, %d microbatch%s x %d slice%s per replica\n", S,
          S == 1 ? "" : "s", chunks, tensor > 1 ? note : "", pl->o.dp, pl->o.dp == 1 ? "" : "s",
          tp_schedule_name(pl->o.kind), pl->o.microbatches, pl->o.microbatches == 1 ? "" : "es", p->nslices,
          p->nslices == 1 ? "" : "s");
  for (int s = 0; s < S; s++) {
    if (tensor > 1)
      fprintf(out, "ranks %d-%d (stage %d, per tensor rank%s):\n", s * tensor, s * tensor + tensor - 1, s,
              pl->o.dp > 1 ? "; every replica's alike" : "");
    else fprintf(out, "rank %d (stage %d%s):\n", s, s, pl->o.dp > 1 ? "; every replica's alike" : "");
    const TpRankMemory *r = &pl->memory[s];
    print_bytes(out, "  parameters", r->params, pl->o.precision ? tp_precision_name(pl->o.precision) : NULL);
    const char *grads_note = pl->o.precision          ? "16-bit, and the step's fp32 sum"
                             : pl->o.microbatches > 1 ? "the step's sum and a microbatch's"
                                                      : NULL;
    print_bytes(out, "  gradients", r->grads, grads_note);
    if (r->masters) print_bytes(out, "  master weights", r->masters, pl->o.zero ? "fp32, 1/D of them" : "fp32");
    print_bytes(out, "  optimizer state", r->state, pl->o.zero ? "1/D of AdamW's moments" : NULL);
    if (V == 1)
      snprintf(note, sizeof note, "%d microbatch%s alive at once: %d x %lld kept + %lld transient", pl->arenas[s],
               pl->arenas[s] == 1 ? "" : "es", pl->arenas[s], (long long)pl->input[s].kept,
               (long long)pl->input[s].transient);
    else /* per virtual stage k + c S: its arenas x its kept bytes */
      for (int c = 0, n = 0; c < V && n < (int)sizeof note; c++) {
        int j = c * S + s;
        n += snprintf(note + n, sizeof note - (size_t)n, "%sstage %d: %d x %lld kept", c ? ", " : "", j,
                      pl->arenas[j], (long long)p->arena_bytes[j]);
        if (c + 1 == V && n < (int)sizeof note)
          snprintf(note + n, sizeof note - (size_t)n, "; + %lld transient", (long long)pl->input[s].transient);
      }
    print_bytes(out, "  activations", r->activations, note);
    print_bytes(out, "  peak", r->peak, NULL);
    if (tensor > 1) {
      int64_t split = r->peak - r->activations;
      snprintf(note, sizeof note, "parameters, gradients and optimizer state at --tensor 1; %d-way saves %lld",
               tensor, (long long)(pl->whole[s] - split));
      print_bytes(out, "  unsplit", pl->whole[s], note);
    }
  }
}
