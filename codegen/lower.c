/* Lowering (see lower.h): requires a module after the training pipeline and its memory plan;
 * provides, for a range of a stage's ops, the statements of the function that runs it. Each
 * op is bound by its binder (bind/bind.c, the one the interpreter runs too) and its bound
 * struct turned into the call's arguments in the order of the target's kernel table
 * (codegen/target.c). What is decided here besides is the plan's memory: where each view
 * points, which Reshapes run nothing, and how token slices append to and read their K/V
 * context buffers. */
#include "lower.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  const TpLowering *L;
  TpLowFunc *f;
  bool *declared; /* per value: declared in the function */
  bool *here;     /* per op: lowered in the function (not a boundary copy, not outlined) */
  int rc;
  /* Where the target's products read bf16 operands (fold_operands): */
  bool folds;     /* the target's table has such operands */
  int *readers;   /* per value: how many times ops read it */
  int *folded;    /* per value: the bf16 value a product reads in place of it (-1: none) */
  int pending[8]; /* read-back Casts waiting for the op after them */
  int npending;
  bool *absorbed;   /* per op: run by the Gelu epilogue of a product lowered before it */
  const int *order; /* the stage's order, the position of the op being lowered, the range's end */
  int pos, to;
} Lowerer;

static TpLowStmt *add(Lowerer *X, TpLowKind kind) {
  TpLowFunc *f = X->f;
  if (f->n == f->cap) {
    f->cap = f->cap ? 2 * f->cap : 32;
    f->stmts = realloc(f->stmts, (size_t)f->cap * sizeof *f->stmts);
    TP_ASSERT(f->stmts);
  }
  TpLowStmt *s = &f->stmts[f->n++];
  *s = (TpLowStmt){.kind = kind, .op = -1, .value = -1, .call = -1};
  return s;
}

static const TpType *type_of(const Lowerer *X, int v) { return &X->L->m->values[v].type; }

static const char *node_name(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  return o->origin.node ? o->origin.node : tp_op_info[o->kind].name;
}

static int unsupported(Lowerer *X, int op, const char *why) {
  const TpModule *m = X->L->m;
  const TpOp *o = &m->ops[op];
  return X->rc = tp_internal(X->L->d, "codegen: op %s (node '%s') is not supported%s%s", tp_op_info[o->kind].name,
                             node_name(m, op), why ? ": " : "", why ? why : "");
}

/* The flat kernels take f32 arrays: every float operand and result must be f32. */
static bool f32_only(Lowerer *X, int op) {
  const TpModule *m = X->L->m;
  const TpOp *o = &m->ops[op];
  for (int k = 0; k < o->ninputs + o->noutputs; k++) {
    int v = k < o->ninputs ? o->inputs[k] : o->outputs[k - o->ninputs];
    if (v >= 0 && tp_dtype_is_float(type_of(X, v)->dtype) && type_of(X, v)->dtype != TP_F32) {
      char why[96];
      snprintf(why, sizeof why, "'%s' is %s; the kernel takes f32", m->values[v].name,
               tp_dtype_name(type_of(X, v)->dtype));
      unsupported(X, op, why);
      return false;
    }
  }
  return true;
}

/* Integer ids read by a flat kernel must be i64. */
static bool i64_ids(Lowerer *X, int op, int v) {
  if (type_of(X, v)->dtype == TP_I64) return true;
  char why[96];
  snprintf(why, sizeof why, "ids '%s' are %s; the kernel takes i64", X->L->m->values[v].name,
           tp_dtype_name(type_of(X, v)->dtype));
  unsupported(X, op, why);
  return false;
}

/* A Reshape whose result shares its operand's bytes: nothing to run. */
static bool reshape_is_view(const TpMemoryPlan *p, int op, const TpModule *m) {
  const TpMemSlot *y = &p->value[m->ops[op].outputs[0]], *x = &p->value[m->ops[op].inputs[0]];
  return y->kind == TP_MEM_VIEW || (y->kind == TP_MEM_GRAD && x->kind == TP_MEM_GRAD && x->index == y->index);
}

/* Where value v's bytes are: a view declared before is addressed through it. */
static TpAddr addr_of(Lowerer *X, int v) {
  const TpMemSlot *s = &X->L->mem->value[v];
  const int *map = X->L->param_map;
  switch (s->kind) {
  case TP_MEM_ARENA:
    *(s->transient ? &X->f->uses_transient : &X->f->uses_arena) = true;
    return (TpAddr){s->transient ? TP_ADDR_TRANSIENT : TP_ADDR_ARENA, s->offset};
  case TP_MEM_VIEW: return X->declared[s->index] ? (TpAddr){TP_ADDR_VALUE, s->index} : addr_of(X, s->index);
  case TP_MEM_PARAM: return (TpAddr){TP_ADDR_PARAM, map ? map[s->index] : s->index};
  case TP_MEM_GRAD: return (TpAddr){TP_ADDR_GRAD, map ? map[s->index] : s->index};
  case TP_MEM_CONST: return (TpAddr){TP_ADDR_CONST, v};
  case TP_MEM_TOKENS: return (TpAddr){TP_ADDR_TOKENS, 0};
  case TP_MEM_TARGETS: return (TpAddr){TP_ADDR_TARGETS, 0};
  case TP_MEM_LOSS_SCALE: return (TpAddr){TP_ADDR_LOSS_SCALE, 0};
  case TP_MEM_NONE: break;
  }
  TP_ASSERT(!"a used value has no storage");
  return (TpAddr){TP_ADDR_TOKENS, 0};
}

static void declare(Lowerer *X, int v, bool top) {
  TpAddr a = addr_of(X, v);
  TpLowStmt *s = add(X, TP_LOW_DECLARE);
  s->value = v, s->top = top, s->addr = a;
  X->declared[v] = true;
}

/* The operands and results of the op being lowered, as the views its binder saw; extra:
 * the views of a fused Gelu (its result, and the operand of a GeluBackward; NULL when
 * none) of values extra_value. */
typedef struct {
  int op;
  const TpTensor *in, *out;
  int nin, nout;
  const TpTensor *extra;
  int extra_value[2];
} Views;

/* The value a view of the bound struct stands for (-1: none). */
static int value_of(const Lowerer *X, const Views *w, const TpTensor *t) {
  const TpOp *o = &X->L->m->ops[w->op];
  if (!t) return -1;
  if (w->extra && (t == &w->extra[0] || t == &w->extra[1])) return w->extra_value[t - w->extra];
  if (t >= w->in && t < w->in + w->nin) {
    int i = (int)(t - w->in);
    return i < o->ninputs ? o->inputs[i] : -1;
  }
  TP_ASSERT(t >= w->out && t < w->out + w->nout);
  int i = (int)(t - w->out);
  return i < o->noutputs ? o->outputs[i] : -1;
}

static int64_t *copy_ints(const int64_t *xs, int n) {
  int64_t *c = malloc(((size_t)n + 1) * sizeof *c);
  TP_ASSERT(c);
  if (n) memcpy(c, xs, (size_t)n * sizeof *c);
  return c;
}

/* One argument of the call of bound op b (w: its views), spelled s. */
static TpLowArg lower_arg(Lowerer *X, const TpArgSpelling *s, const TpBound *b, const Views *w) {
  const char *base = (const char *)b;
  const void *f = base + s->offset;
  const TpTensor *t = s->kind <= TP_ARG_DIMS ? *(const TpTensor *const *)f : NULL;
  TpLowArg a = {.kind = s->kind, .value = value_of(X, w, t), .aux = -1};
  switch (s->kind) {
  case TP_ARG_VIEW:
  case TP_ARG_DATA:
  case TP_ARG_SCALAR: break;
  case TP_ARG_SCRATCH:
    if (a.value < 0) {
      const TpMemSlot *scratch = &X->L->mem->scratch[w->op];
      a.i = scratch->offset, a.transient = scratch->transient;
      *(a.transient ? &X->f->uses_transient : &X->f->uses_arena) = true;
    }
    break;
  case TP_ARG_RANK: a.kind = TP_ARG_I64, a.i = t->rank; break;
  case TP_ARG_DIMS: a.kind = TP_ARG_I64S, a.n = t->rank, a.ints = copy_ints(t->dims, t->rank); break;
  case TP_ARG_I64: a.i = *(const int64_t *)f; break;
  case TP_ARG_INT: a.i = *(const int *)f; break;
  case TP_ARG_BOOL: a.i = *(const bool *)f; break;
  case TP_ARG_F32: a.f = *(const float *)f; break;
  case TP_ARG_F64: a.f = *(const double *)f; break;
  case TP_ARG_I64S:
    a.n = *(const int *)(base + s->aux);
    a.ints = copy_ints(*(const int64_t *const *)f, a.n);
    break;
  case TP_ARG_VIEWS_IN:
  case TP_ARG_VIEWS_OUT: {
    const TpTensor *xs = *(const TpTensor *const *)f;
    a.n = *(const int *)(base + s->aux);
    a.values = malloc(((size_t)a.n + 1) * sizeof *a.values);
    TP_ASSERT(a.values);
    for (int i = 0; i < a.n; i++) a.values[i] = value_of(X, w, &xs[i]);
    break;
  }
  case TP_ARG_UNARY_OP: a.i = *(const TpUnaryOp *)f; break;
  case TP_ARG_BINARY_OP: a.i = *(const TpBinaryOp *)f; break;
  case TP_ARG_ATTENTION:
    a.attention = *(const TpAttention *)f;
    a.aux = value_of(X, w, *(const TpTensor *const *)(base + s->aux));
    break;
  case TP_ARG_LOSS:
    a.loss = *(const TpLossOptions *)f;
    a.aux = value_of(X, w, *(const TpTensor *const *)(base + s->aux));
    break;
  case TP_ARG_BAD: X->f->uses_bad = true; break;
  case TP_ARG_STREAM: break;
  }
  return a;
}

/* The call of bound op b, its arguments in the target's order. */
static void lower_call(Lowerer *X, const TpBound *b, const Views *w) {
  const TpKernelSpelling *k = &X->L->target->kernels[b->kernel];
  TP_ASSERT(k->name[0]);
  TpLowArg *args = calloc((size_t)k->nargs + 1, sizeof *args);
  TP_ASSERT(args);
  for (int i = 0; i < k->nargs; i++) {
    args[i] = lower_arg(X, &k->args[i], b, w);
    if (X->folds && k->args[i].operand && args[i].value >= 0 && X->folded[args[i].value] >= 0)
      args[i].value = X->folded[args[i].value]; /* the bf16 value (fold_operands) */
  }
  TpLowStmt *s = add(X, TP_LOW_CALL);
  s->kernel = b->kernel, s->nargs = k->nargs, s->args = args;
}

/* Whether the plan has a tensor group for op to work over; else the error. */
static bool has_tensor_group(Lowerer *X, int op) {
  if (X->L->tensor > 1) return true;
  const TpModule *m = X->L->m;
  X->rc = tp_error_op(X->L->d, m, op,
                      "codegen: %s works over the tensor group, but the module has none (tokpipec "
                      "--tensor N)",
                      tp_op_info[m->ops[op].kind].name);
  return false;
}

/* TensorRank (passes/shard_tensor.c): this rank's place in its tensor group, which the
 * runtime gives in io->tensor_rank, stored in the i64 scalar for the vocabulary-parallel
 * ops that read it (queued on the stream on a device target: its buffer is the device's). */
static void lower_tensor_rank(Lowerer *X, int op) {
  const TpModule *m = X->L->m;
  int y = m->ops[op].outputs[0];
  if (!has_tensor_group(X, op)) return;
  if (strcmp(tp_attr_string(m, op, "group", "tensor"), "tensor") != 0 || type_of(X, y)->dtype != TP_I64 ||
      type_of(X, y)->rank != 0) {
    unsupported(X, op, "only the i64 scalar rank in the tensor group is");
    return;
  }
  add(X, X->L->target->fill_i64 ? TP_LOW_RANK_FILL : TP_LOW_RANK_STORE)->value = y;
}

/* The tensor group's ops (passes/shard_tensor.c). TensorCopy is the identity on every
 * rank: its result is a view of its operand (memory.c), nothing runs. AllReduce sums its
 * operand over the group in place through the runtime's io->tensor_allreduce (the same
 * call on every target: the runtime picks the transport), first copying it into the
 * result's own buffer where the memory plan could not alias them. */
static void lower_tensor_op(Lowerer *X, int op) {
  const TpModule *m = X->L->m;
  int x = m->ops[op].inputs[0], y = m->ops[op].outputs[0];
  if (!f32_only(X, op) || !has_tensor_group(X, op)) return;
  if (strcmp(tp_attr_string(m, op, "group", "tensor"), "tensor") != 0 ||
      (m->ops[op].kind == TP_OP_AllReduce && strcmp(tp_attr_string(m, op, "reduce", "sum"), "sum") != 0)) {
    unsupported(X, op, "only sums over the tensor group are");
    return;
  }
  if (X->L->mem->value[y].kind != TP_MEM_VIEW) {
    TpTensor views[2] = {tp_value_tensor(m, x), tp_value_tensor(m, y)};
    Views w = {op, views, views + 1, 1, 1, NULL, {-1, -1}};
    TpBound b = {.kernel = TP_K_RESHAPE};
    b.a.reshape = (TpCopyArgs){&views[0], &views[1]};
    lower_call(X, &b, &w);
  }
  if (m->ops[op].kind == TP_OP_AllReduce) {
    TpLowStmt *s = add(X, TP_LOW_ALLREDUCE);
    s->value = y, s->count = tp_type_numel(type_of(X, y));
  }
}

/* ---- bf16 operands read as they are stored ----
 * Where the target's products take bf16 operands (TpArgSpelling.operand), a product that
 * reads the f32 Cast of a bf16 value (store-bf16's read-back of a weight's working copy, a
 * saved activation, a gradient from another unit) is given the bf16 value itself, and the
 * Cast runs nothing: the product would round the f32 operand to bf16, which gives that
 * value back, so the result is the same without the conversion. Such a Cast waits
 * (X->pending) until the op after it is lowered: if that op is its only reader and takes it
 * only as such operands, and the bf16 value's bytes still hold it when the product runs
 * (the memory plan keeps them for the product where it is told the target's products read
 * bf16, TpMemoryOptions; planned without, it may give them to a later buffer once the Cast,
 * their last reader, has run), the Cast is folded; otherwise it is lowered then, where it
 * stood. */

/* Does op wait for the op after it (a Cast from bf16 to f32 that a product may fold)? */
static bool waits(const Lowerer *X, int op) {
  const TpModule *m = X->L->m;
  const TpOp *o = &m->ops[op];
  if (!X->folds || o->kind != TP_OP_Cast || X->npending == (int)(sizeof X->pending / sizeof *X->pending))
    return false;
  int x = o->inputs[0], y = o->outputs[0];
  if (type_of(X, x)->dtype != TP_BF16 || type_of(X, y)->dtype != TP_F32 || y == m->loss) return false;
  for (int i = 0; i < m->noutputs; i++)
    if (m->outputs[i] == y) return false;
  return true;
}

static const TpMemSlot *storage(const TpMemoryPlan *p, int v) {
  while (p->value[v].kind == TP_MEM_VIEW) v = p->value[v].index;
  return &p->value[v];
}

/* Can writing slot b change the bytes of slot a? */
static bool slots_overlap(const TpMemSlot *a, const TpMemSlot *b) {
  if (a->kind != b->kind) return false;
  if (a->kind == TP_MEM_PARAM || a->kind == TP_MEM_GRAD) return a->index == b->index;
  if (a->kind != TP_MEM_ARENA) return false;
  return a->stage == b->stage && a->transient == b->transient && a->offset < b->offset + b->bytes &&
         b->offset < a->offset + a->bytes;
}

/* Is slot s written by op's results or scratch, or by a pending Cast that is not folded? */
static bool written_before_product(const Lowerer *X, int op, const TpMemSlot *s, const bool *fold) {
  const TpModule *m = X->L->m;
  const TpMemoryPlan *p = X->L->mem;
  for (int k = 0; k < m->ops[op].noutputs; k++)
    if (m->ops[op].outputs[k] >= 0 && slots_overlap(s, storage(p, m->ops[op].outputs[k]))) return true;
  if (slots_overlap(s, &p->scratch[op])) return true;
  for (int i = 0; i < X->npending; i++)
    if (!fold[i] && slots_overlap(s, storage(p, m->ops[X->pending[i]].outputs[0]))) return true;
  return false;
}

static void lower_op(Lowerer *X, int op);
/* Ops a Gelu epilogue's fusion absorbs besides the Gelu: a read-back Cast of its operand,
 * Reshapes that run nothing between the product's dx and the GeluBackward. */
typedef struct {
  int ops[4], n;
} Absorbed;
static int gelu_partner(const Lowerer *X, const int *order, int i, int to, const TpBound *b, Absorbed *more);
static void lower_gelu_epilogue(Lowerer *X, TpBound *b, Views *w, int gelu, const Absorbed *more);

/* Lowers the pending Casts not folded, in their order. */
static void flush_pending(Lowerer *X, const bool *fold) {
  int n = X->npending, casts[sizeof X->pending / sizeof *X->pending];
  memcpy(casts, X->pending, sizeof casts);
  X->npending = 0;
  for (int i = 0; i < n && X->rc == TP_OK; i++)
    if (!fold || !fold[i]) lower_op(X, casts[i]);
}

/* Decides which pending Casts the call of bound op b (w: its views) folds (X->folded), and
 * lowers the others. */
static void fold_operands(Lowerer *X, const TpBound *b, const Views *w) {
  const TpModule *m = X->L->m;
  const TpKernelSpelling *k = &X->L->target->kernels[b->kernel];
  const TpOp *o = &m->ops[w->op];
  bool fold[sizeof X->pending / sizeof *X->pending] = {false};
  for (int i = 0; i < X->npending; i++) {
    int y = m->ops[X->pending[i]].outputs[0], reads = 0, operands = 0, inputs = 0;
    for (int j = 0; j < o->ninputs; j++) inputs += o->inputs[j] == y;
    for (int a = 0; a < k->nargs; a++) {
      if (k->args[a].kind > TP_ARG_DIMS) continue;
      const TpTensor *t = *(const TpTensor *const *)((const char *)b + k->args[a].offset);
      if (value_of(X, w, t) != y) continue;
      reads++;
      operands += k->args[a].operand;
    }
    fold[i] = reads > 0 && operands == reads && inputs == X->readers[y];
  }
  for (bool changed = true; changed;) { /* a Cast left to run writes its result: check again */
    changed = false;
    for (int i = 0; i < X->npending; i++) {
      const TpMemSlot *s = storage(X->L->mem, m->ops[X->pending[i]].inputs[0]);
      if (fold[i] && written_before_product(X, w->op, s, fold)) fold[i] = false, changed = true;
    }
  }
  for (int i = 0; i < X->npending; i++)
    if (fold[i]) X->folded[m->ops[X->pending[i]].outputs[0]] = m->ops[X->pending[i]].inputs[0];
  flush_pending(X, fold);
}

/* The op's first statement and its results' declarations (but unwritten's: -1 for none). */
static void begin_op_but(Lowerer *X, int op, bool view, int unwritten) {
  const TpOp *o = &X->L->m->ops[op];
  TpLowStmt *begin = add(X, TP_LOW_OP);
  begin->op = op, begin->view = view;
  for (int k = 0; k < o->noutputs; k++)
    if (o->outputs[k] >= 0 && o->outputs[k] != unwritten) declare(X, o->outputs[k], false);
}

static void begin_op(Lowerer *X, int op, bool view) { begin_op_but(X, op, view, -1); }

/* The statements of one op, after the pending Casts it does not fold. The op's binder gives
 * the kernel and its arguments from views of the operands' types; what is decided here is
 * the plan's memory: a token slice's keys and values are appended to, and read in place from,
 * their context buffers, and a product reads bf16 operands as they are stored. */
static void lower_op(Lowerer *X, int op) {
  const TpModule *m = X->L->m;
  const TpOp *o = &m->ops[op];
  const TpOpBinding *r = tp_op_binding(o->kind);
  if (o->kind == TP_OP_Reshape && reshape_is_view(X->L->mem, op, m)) {
    flush_pending(X, NULL);
    begin_op(X, op, true);
    return;
  }
  bool tensor_op = o->kind == TP_OP_TensorCopy || o->kind == TP_OP_AllReduce;
  if (tensor_op || o->kind == TP_OP_TensorRank || !r->bind) {
    flush_pending(X, NULL);
    begin_op(X, op, false);
    if (tensor_op) lower_tensor_op(X, op);
    else if (o->kind == TP_OP_TensorRank) lower_tensor_rank(X, op);
    else unsupported(X, op, NULL);
    return;
  }
  if ((r->dtypes == TP_BIND_F32 || r->dtypes == TP_BIND_F32_COPY) && !f32_only(X, op)) return;
  if (r->ids && !i64_ids(X, op, o->inputs[r->ids - 1])) return;
  TpTensor views[128];
  TP_ASSERT(o->ninputs + o->noutputs <= 128);
  Views w = {op, views, views + o->ninputs, o->ninputs, o->noutputs, NULL, {-1, -1}};
  for (int k = 0; k < o->ninputs + o->noutputs; k++) {
    int v = k < o->ninputs ? o->inputs[k] : o->outputs[k - o->ninputs];
    views[k] = v >= 0 ? tp_value_tensor(m, v) : (TpTensor){0};
  }
  TpBound b;
  int rc = tp_bind_op(m, op, w.in, views + o->ninputs, &b, X->L->d);
  if (rc != TP_OK) {
    X->rc = rc;
    return;
  }
  if (b.kernel == TP_K_CONCAT && tp_context_rows(m, o->outputs[0])) {
    /* only the slice's own rows are new in the buffer */
    const TpConcatArgs *c = &b.a.concat;
    const TpTensor *own = &c->xs[c->n - 1];
    b.kernel = TP_K_CONTEXT_APPEND;
    b.a.context_append = (TpContextAppendArgs){own, c->axis, c->y->dims[c->axis] - own->dims[c->axis],
                                               tp_context_rows(m, o->outputs[0]), c->y};
  }
  if (b.kernel == TP_K_ATTENTION || b.kernel == TP_K_ATTENTION_BACKWARD) {
    TpAttentionArgs *a = &b.a.attention;
    if (a->past_k) {
      unsupported(X, op, "past keys and values");
      return;
    }
    int64_t rows = tp_context_rows(m, value_of(X, &w, a->k));
    if (rows != tp_context_rows(m, value_of(X, &w, a->v))) {
      unsupported(X, op, "K and V must both be token-slice contexts, or neither");
      return;
    }
    a->p.kv_rows = rows;
  }
  Absorbed more;
  int gelu = gelu_partner(X, X->order, X->pos, X->to, &b, &more);
  if (gelu >= 0) {
    lower_gelu_epilogue(X, &b, &w, X->order[gelu], &more);
    return;
  }
  fold_operands(X, &b, &w);
  begin_op(X, op, false);
  lower_call(X, &b, &w);
}

/* ---- Gelu epilogues ----
 * Where the target's products run epilogues (TpLowering.gelu_epilogues: cuBLASLt's), a
 * Linear whose result a tanh-approximate Gelu reads is one call with that Gelu
 * (TP_K_LINEAR_GELU: the Linear's result is still written, for the Gelu's backward), and a
 * LinearBackward whose dx is read only by a tanh-approximate GeluBackward (as its dy) is
 * one call with it (TP_K_LINEAR_BACKWARD_DGELU: dx itself is not written). The call runs
 * where the product stood, so the Gelu's result is written before the ops between them
 * run: only where its bytes are none those ops (and the product) read or write. The
 * GeluBackward's other operand must hold its value there: computed before the product, or
 * the read-back Cast of a stored bf16 value whose only reader it is (the call then reads
 * the bf16 value, and the Cast runs nothing). The erf Gelu is not fused (cuBLASLt's GELU
 * epilogues are the tanh approximation), nor is a Gelu reading a rounded copy of the
 * Linear's result (a bf16 plan's stored pre-activation: the epilogue would see the
 * unrounded sum). */

static bool tanh_gelu(const TpModule *m, int op, TpOpKind kind) {
  return m->ops[op].kind == kind && strcmp(tp_attr_string(m, op, "approximate", "none"), "tanh") == 0;
}

/* The position of value v's defining op in order[from, to), or -1 (computed elsewhere). */
static int def_position(const Lowerer *X, const int *order, int from, int to, int v) {
  const TpModule *m = X->L->m;
  if (m->values[v].kind != TP_VAL_RESULT) return -1;
  for (int p = from; p < to; p++)
    if (order[p] == m->values[v].def) return p;
  return -1;
}

/* Do the ops at positions [i, j) read or write slot s (their scratch too), but for the
 * values `unwritten` (results the fusion does not write, operands read before s is
 * written) and the outputs of the Cast absorbed? */
static bool touched(const Lowerer *X, const int *order, int i, int j, const TpMemSlot *s, const int *unwritten,
                    int nunwritten, int absorbed_cast) {
  const TpModule *m = X->L->m;
  const TpMemoryPlan *p = X->L->mem;
  for (int q = i; q < j; q++) {
    const TpOp *o = &m->ops[order[q]];
    for (int k = 0; k < o->ninputs + o->noutputs; k++) {
      int v = k < o->ninputs ? o->inputs[k] : o->outputs[k - o->ninputs];
      bool skip = v < 0 || (order[q] == absorbed_cast && k >= o->ninputs);
      for (int u = 0; u < nunwritten && !skip; u++) skip = v == unwritten[u];
      if (!skip && slots_overlap(s, storage(p, v))) return true;
    }
    if (slots_overlap(s, &p->scratch[order[q]])) return true;
  }
  return false;
}

static bool in(const int *xs, int n, int v) {
  for (int k = 0; k < n; k++)
    if (xs[k] == v) return true;
  return false;
}

/* The position of the op fused with the product at position i (a Linear or
 * LinearBackward, bound as b), or -1; *more: the other ops the fusion absorbs. The Gelu
 * may read the product's result through Reshapes that run nothing (a Conv1D's views). */
static int gelu_partner(const Lowerer *X, const int *order, int i, int to, const TpBound *b, Absorbed *more) {
  const TpModule *m = X->L->m;
  const TpOp *o = &m->ops[order[i]];
  bool forward = b->kernel == TP_K_LINEAR;
  int y = o->outputs[0];
  more->n = 0;
  if (!X->L->gelu_epilogues || (!forward && b->kernel != TP_K_LINEAR_BACKWARD) || y < 0 ||
      (!forward && X->readers[y] != 1))
    return -1;
  /* y and its views; not written by a backward's call: dx, its views, the absorbed Cast's
   * result; read before the Gelu's result is written: the backward's x, which only dw's
   * product reads, and the call computes dw first */
  int chain[4] = {y}, nchain = 1, unwritten[7] = {forward ? -1 : y, forward ? -1 : o->inputs[1]}, nunwritten = 2;
  int j = i + 1;
  for (; j < to; j++) {
    const TpOp *g = &m->ops[order[j]];
    bool reads = false;
    if (!X->here[order[j]] && !tp_is_boundary_op(m, order[j])) return -1; /* outlined */
    for (int k = 0; k < g->ninputs; k++) reads = reads || in(chain, nchain, g->inputs[k]);
    if (!reads) continue;
    if (X->here[order[j]] && g->kind == TP_OP_Reshape && reshape_is_view(X->L->mem, order[j], m) && nchain < 4) {
      if (!forward && X->readers[g->outputs[0]] != 1) return -1;
      chain[nchain++] = g->outputs[0];
      if (!forward) more->ops[more->n++] = order[j], unwritten[nunwritten++] = g->outputs[0];
      continue;
    }
    if (X->here[order[j]] && g->ninputs > 0 && in(chain, nchain, g->inputs[0])) break;
    return -1; /* read first by another op */
  }
  if (j == to || !tanh_gelu(m, order[j], forward ? TP_OP_Gelu : TP_OP_GeluBackward)) return -1;
  const TpOp *g = &m->ops[order[j]];
  int cast = -1;
  if (!forward) { /* the Gelu's operand, at position i */
    int pre = g->inputs[1], p = def_position(X, order, i, j, pre);
    if (p >= 0) {
      const TpOp *c = &m->ops[order[p]];
      if (!X->folds || c->kind != TP_OP_Cast || type_of(X, c->inputs[0])->dtype != TP_BF16 ||
          type_of(X, pre)->dtype != TP_F32 || X->readers[pre] != 1 ||
          def_position(X, order, i, j, c->inputs[0]) >= 0)
        return -1;
      cast = order[p], more->ops[more->n++] = cast, unwritten[nunwritten++] = pre;
    }
  }
  const TpMemSlot *result = storage(X->L->mem, g->outputs[0]);
  if (touched(X, order, i, j, result, unwritten, nunwritten, cast)) return -1;
  if (!forward && slots_overlap(result, storage(X->L->mem, g->inputs[1]))) return -1; /* dx, pre: read apart */
  for (int k = 0; k < X->npending; k++) /* a bf16 value the product may read in place */
    if (m->ops[X->pending[k]].outputs[0] != unwritten[1] &&
        slots_overlap(result, storage(X->L->mem, m->ops[X->pending[k]].inputs[0])))
      return -1;
  return j;
}

/* The product at position i fused with the Gelu at position j (gelu_partner), the ops
 * `more` absorbed too. */
static void lower_gelu_epilogue(Lowerer *X, TpBound *b, Views *w, int gelu, const Absorbed *more) {
  const TpModule *m = X->L->m;
  const TpOp *g = &m->ops[gelu];
  TpTensor extra[2] = {tp_value_tensor(m, g->outputs[0]), {0}};
  TpLinearArgs a = b->kernel == TP_K_LINEAR ? b->a.linear : b->a.linear_backward;
  w->extra = extra, w->extra_value[0] = g->outputs[0], w->extra_value[1] = -1;
  if (b->kernel == TP_K_LINEAR) { /* pre: the Linear's result; y: the Gelu's */
    a.pre = a.y, a.y = &extra[0];
    b->kernel = TP_K_LINEAR_GELU, b->a.linear_gelu = a;
  } else { /* dx: the GeluBackward's result; pre: its operand */
    extra[1] = tp_value_tensor(m, g->inputs[1]), w->extra_value[1] = g->inputs[1];
    a.y = &extra[0], a.pre = &extra[1];
    b->kernel = TP_K_LINEAR_BACKWARD_DGELU, b->a.linear_backward_dgelu = a;
  }
  fold_operands(X, b, w);
  begin_op_but(X, w->op, false, b->kernel == TP_K_LINEAR_GELU ? -1 : m->ops[w->op].outputs[0]); /* dx: unwritten */
  begin_op(X, gelu, false);
  X->absorbed[gelu] = true;
  for (int k = 0; k < more->n; k++) {
    const TpOp *c = &m->ops[more->ops[k]];
    X->absorbed[more->ops[k]] = true;
    if (c->kind == TP_OP_Cast) X->folded[c->outputs[0]] = c->inputs[0]; /* the call reads the bf16 value */
  }
  lower_call(X, b, w);
}

/* Is value v read by one of the ops ops[0..n) lowered here (or is it the loss)? */
static bool read_after(const Lowerer *X, const int *ops, int n, int v) {
  const TpModule *m = X->L->m;
  if (v == m->loss) return true;
  for (int i = 0; i < n; i++)
    for (int k = 0; X->here[ops[i]] && k < m->ops[ops[i]].ninputs; k++)
      if (m->ops[ops[i]].inputs[k] == v) return true;
  return false;
}

int tp_lower_range(const TpLowering *L, int s, bool backward, int from, int to, const TpLowRange *outlined,
                   int noutlined, TpLowFunc *f) {
  const TpModule *m = L->m;
  const int *order = L->mem->order[s];
  *f = (TpLowFunc){0};
  Lowerer X = {.L = L,
               .f = f,
               .declared = calloc((size_t)m->nvalues + 1, sizeof(bool)),
               .here = calloc((size_t)m->nops + 1, sizeof(bool)),
               .rc = TP_OK};
  TP_ASSERT(X.declared && X.here);
  X.folds = tp_target_reads_bf16(L->target);
  X.absorbed = calloc((size_t)m->nops + 1, sizeof *X.absorbed);
  X.order = order, X.to = to;
  TP_ASSERT(X.absorbed);
  if (X.folds || L->gelu_epilogues) {
    X.readers = calloc((size_t)m->nvalues + 1, sizeof *X.readers);
    X.folded = malloc(((size_t)m->nvalues + 1) * sizeof *X.folded);
    TP_ASSERT(X.readers && X.folded);
    for (int v = 0; v < m->nvalues; v++) X.folded[v] = -1;
    for (int op = 0; op < m->nops; op++)
      for (int k = 0; k < m->ops[op].ninputs; k++)
        if (m->ops[op].inputs[k] >= 0) X.readers[m->ops[op].inputs[k]]++;
  }
  for (int i = from, c = 0; i < to; i++) {
    if (tp_is_boundary_op(m, order[i])) continue;
    f->nops++;
    while (c < noutlined && outlined[c].end <= i) c++;
    if (c == noutlined || i < outlined[c].begin) X.here[order[i]] = true;
  }
  /* What the function reads from outside, in order of first use. */
  for (int i = from; i < to; i++) {
    const TpOp *o = &m->ops[order[i]];
    if (!X.here[order[i]]) continue;
    for (int k = 0; k < o->ninputs; k++) {
      int v = o->inputs[k];
      if (v < 0 || X.declared[v]) continue;
      int def = m->values[v].kind == TP_VAL_RESULT ? m->values[v].def : -1;
      if (def >= 0 && X.here[def]) continue;
      declare(&X, v, true);
    }
  }
  for (int i = from, c = 0; i < to && X.rc == TP_OK; i++) {
    int op = order[i];
    const TpOp *o = &m->ops[op];
    if (c < noutlined && i == outlined[c].begin) {
      flush_pending(&X, NULL);
      add(&X, TP_LOW_OUTLINED)->call = c;
      i = outlined[c++].end - 1;
      continue;
    }
    if (!X.here[op] || X.absorbed[op]) continue;
    X.pos = i;
    bool view = o->kind == TP_OP_Reshape && reshape_is_view(L->mem, op, m);
    /* A Reshape that runs nothing is only worth a line where its result is read here. */
    if (view && !read_after(&X, order + i + 1, to - i - 1, o->outputs[0])) continue;
    if (waits(&X, op)) X.pending[X.npending++] = op;
    else lower_op(&X, op);
  }
  if (X.rc == TP_OK) flush_pending(&X, NULL);
  if (X.rc == TP_OK && !backward && m->loss >= 0 && m->values[m->loss].def >= 0 && X.here[m->values[m->loss].def])
    add(&X, L->target->copy_to_host ? TP_LOW_LOSS_COPY : TP_LOW_LOSS_STORE)->value = m->loss;
  free(X.declared);
  free(X.here);
  free(X.readers);
  free(X.folded);
  free(X.absorbed);
  return X.rc;
}

void tp_low_func_free(TpLowFunc *f) {
  for (int i = 0; i < f->n; i++) {
    for (int k = 0; k < f->stmts[i].nargs; k++) {
      free(f->stmts[i].args[k].ints);
      free(f->stmts[i].args[k].values);
    }
    free(f->stmts[i].args);
  }
  free(f->stmts);
  *f = (TpLowFunc){0};
}

int64_t tp_slice_length(const TpModule *m, const TpMemoryPlan *mem, int slice, int64_t seq) {
  if (mem->nslices == 1) return seq;
  if (m->nslices == mem->nslices && m->slice_len) return m->slice_len[slice];
  /* else from the token axis of a forward result of the slice */
  for (int op = 0; op < m->nops; op++)
    if (m->ops[op].slice == slice && m->ops[op].phase == TP_PHASE_FORWARD)
      for (int k = 0; k < m->ops[op].noutputs; k++) {
        int v = m->ops[op].outputs[k], axis = v >= 0 ? tp_token_axis(m, v) : -1;
        if (axis >= 0) return m->values[v].type.dims[axis];
      }
  return 0;
}

int64_t tp_slice_context(const TpModule *m, const TpMemoryPlan *mem, int slice, int64_t seq) {
  int64_t c = 0;
  for (int i = 0; i < slice; i++) c += tp_slice_length(m, mem, i, seq);
  return c;
}

int tp_lower_param_map(const TpModule *m, const TpMemoryPlan *mem, const TpModule *pm, const TpMemoryPlan *pp,
                       int *map, TpDiag *d) {
  for (int i = 0; i < pp->nparams; i++) {
    const char *name = pm->values[pp->params[i]].name;
    int j = 0;
    while (j < mem->nparams && strcmp(m->values[mem->params[j]].name, name) != 0) j++;
    if (j == mem->nparams)
      return tp_internal(d, "codegen: probe parameter '%s' is not a parameter of the plan", name);
    if (pp->param_stage[i] != mem->param_stage[j] || pp->param_tied_stage[i] != mem->param_tied_stage[j])
      return tp_internal(d,
                         "codegen: probe parameter '%s' is held by stage %d, in the plan by stage %d: the stage "
                         "cuts differ",
                         name, pp->param_stage[i], mem->param_stage[j]);
    map[i] = j;
  }
  return TP_OK;
}
