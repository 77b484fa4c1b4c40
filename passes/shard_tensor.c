/* shard-tensor: Megatron-style tensor parallelism inside each stage, over the opt->tensor
 * ranks of the "tensor" group. Every rank runs the module this pass leaves (SPMD), so
 * every type it writes is one rank's type.
 *
 * It runs on the raised forward module, before add-loss. Values are replicated (whole on
 * every rank) until a column-parallel product splits one:
 *  - A Linear whose input is replicated and whose weight is a param read by it alone is
 *    column-parallel when its result reaches another Linear through ops that can work on
 *    a split value (the Q/K/V projections, the first MLP products, a gated MLP's gate and up;
 *    not the LM head, whose logits reach the loss). Its weight's output columns and its
 *    bias are split, and its input passes through TensorCopy (Megatron's f: identity
 *    forward, all-reduce of the input gradient backward), one per input value. The parts
 *    are N, except for K/V projections of fewer heads than ranks (grouped or multi-query
 *    attention) when N is a multiple of them: then each head is one part, held by N/heads
 *    ranks (TpShard). A fused Q|K|V product cut into equal chunks (by Split, by Slice at
 *    the chunk boundaries, or by Gather, after a Reshape into heads or not) keeps them:
 *    each rank holds its piece of every chunk.
 *  - Such a product stays whole instead (replicated, computed alike on every rank, with
 *    the attention it feeds) when the heads cannot be cut as TpShard writes them: K/V
 *    fused with more query heads (Falcon's multi-query Q|K|V: unequal chunks), an
 *    attention bias constant that differs per head (ALiBi), which each rank would need
 *    its own part of while only params are split, or queries or keys normalised over all
 *    heads at once by a norm that cannot be split across the ranks (a LayerNorm, or an
 *    RMSNorm whose scale is not a param of its own). Such a norm ends the block like the
 *    residual stream's, so the products it normalises are never column-parallel.
 *  - The split follows the feature axis through the ops with a tensor-split rule (ops/,
 *    TpOpRules.tensor_split): elementwise ops, Gelu, the fused gated activation, Split,
 *    Reshape (into and out of heads), Transpose, Slice and Concat along another axis (a
 *    head-major fused Q|K|V, partial rotary), Slice of one whole chunk, Gather along
 *    another axis (Bloom's [heads, 3, head_dim]), Rotary and Attention (which gets the
 *    per-rank head counts; a mask alike for every head stays whole, a per-head bias that
 *    is a param it alone reads is split with the heads), and RMSNorm or LayerNorm within
 *    each head (Qwen 3's and Gemma 3's q_norm and k_norm over head_dim, before rotary),
 *    whose scale stays whole, and RMSNorm over all heads at once, its scale a param of its
 *    own (OLMo 2's q_norm and k_norm over the projection's whole width): each rank's mean
 *    of squares is all-reduced (norm_across_ranks) and the scale cut with the features.
 *    A trainable value such an op broadcasts along the split axis (a scale, a Rotary
 *    table exported as a param, a norm's scale within heads) passes through TensorCopy,
 *    whose backward sums the ranks' partial gradients.
 *  - A Linear whose input is split along its last axis is row-parallel: its weight's rows
 *    are split, its result is this rank's partial sum, and an AllReduce (Megatron's g)
 *    sums it; its bias is added once after the sum.
 * The residual stream's norms and residuals stay replicated, and so do a mixture's routed
 * experts (Mixtral, Qwen2-MoE: products of expert weights gathered per token, by TopK of
 * the router), with a note: split neither by experts nor within them, every rank computes
 * all of them alike; a shared expert (Qwen2-MoE) is an MLP, split as one. Any other op
 * reading a split value, or a split value the graph outputs, is refused with an error
 * naming it.
 *
 * Vocabulary parallelism (Megatron's parallel embedding and cross-entropy; ir/ops.def):
 *  - The LM head (the Linear computing the logits add-loss trains, through a model's
 *    upcasting Cast) is column-parallel over the vocabulary: its weight (own, or the
 *    embedding table through its @retie view) and bias are split along the vocabulary,
 *    its input passes through TensorCopy, and each rank's logits are [..., V / N], the
 *    graph output as it is: add-loss then appends the parallel cross-entropy, which never
 *    gathers them (tp_vocab_parts tells it the split).
 *  - A token embedding (ids a graph input) whose table nothing else reads but the head
 *    looks up only its rank's rows, [r V/N, (r+1) V/N) for rank r = TensorRank() (ids
 *    outside give zeros), and an AllReduce sums the ranks' rows. A tied table is split
 *    once for both.
 *    An embedding with a padding row (padding_idx) keeps its table whole.
 *  - A vocabulary V that N does not divide is padded to the next multiple of N, as Megatron
 *    does: the table, the head's weight and its bias get rows of zeros at the end
 *    (TpShard.pad, on the last rank), which files never show (the runtime scatters and
 *    gathers the true V), no token id reaches (the trainer refuses ids >= V) and the loss
 *    masks out (CrossEntropyStats' and CrossEntropy's vocab_pad: no probability, so their
 *    rows get exactly zero gradient and AdamW, decay included, leaves them zero). Only a
 *    vocabulary so small that the last rank would hold nothing but padding stays
 *    replicated, with a note.
 *  - opt->vocab_multiple M (tokpipec --target cuda: 64) pads to a multiple of N x M
 *    instead, so each rank's logits row is a multiple of M classes (falling back to N
 *    where that would leave the last rank only padding), and also runs at N = 1: the head's
 *    weight (a tied table with it) and bias padded as one part of one rank, nothing split,
 *    the plain loss masking the padding (CrossEntropy's vocab_pad).
 * A model that computes its own loss keeps its head replicated. */
#include "../ir/ir.h"
#include "../ops/split.h"

#include <stdlib.h>
#include <string.h>

int tp_split_refuse(TpSplitCtx *s, int op, const char *why) {
  const TpModule *m = s->m;
  if (m->ops[op].origin.node)
    return tp_error_op(s->d, m, op, "shard-tensor cannot split op %s over %d tensor ranks: %s",
                       tp_op_info[m->ops[op].kind].name, s->ranks, why);
  return tp_error(s->d, "op %s of %%%s: shard-tensor cannot split it over %d tensor ranks: %s",
                  tp_op_info[m->ops[op].kind].name, m->values[m->ops[op].outputs[0]].name, s->ranks, why);
}

static bool is_norm(TpOpKind k) { return k == TP_OP_LayerNorm || k == TP_OP_RMSNorm; }

/* Ops a split feature axis can flow through (each is checked when it is reached): those with
 * a tensor-split rule, the norms aside (split_norm). */
static bool carries_split(TpOpKind k) { return tp_op_rules[k]->tensor_split && !is_norm(k); }

/* The first axis norm op normalises (the axes from it to the last are normalised). */
int tp_split_norm_axis(const TpModule *m, int op) {
  int rank = m->values[m->ops[op].inputs[0]].type.rank, a = (int)tp_attr_int(m, op, "axis", -1);
  return a < 0 ? a + rank : a;
}

/* Is norm op one within each head, reached from a column product's result of rank `rank`:
 * its operand has been cut into more axes than that result (heads, then a head's
 * features) and it normalises the last axis alone (Qwen 3's and Gemma 3's q_norm, k_norm)?
 * One over all heads is norm_splits_across's. follow() checks the split itself. */
static bool norm_within_heads(const TpModule *m, int op, int rank) {
  int x = m->ops[op].inputs[0];
  return is_norm(m->ops[op].kind) && m->values[x].type.rank > rank &&
         tp_split_norm_axis(m, op) == m->values[x].type.rank - 1;
}

/* Is norm op one over all of a column product's heads that follow() can split across the
 * ranks (OLMo 2's q_norm and k_norm over the projection's whole width): an RMSNorm whose
 * scale is a param it alone reads, cut with the features. Each rank's mean of squares is
 * summed over the ranks (norm_across_ranks). */
bool tp_split_norm_splits_across(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  if (o->kind != TP_OP_RMSNorm) return false;
  const TpValue *w = &m->values[o->inputs[1]];
  return w->kind == TP_VAL_PARAM && w->tied < 0 && !w->shard.parts && tp_use_count(m, o->inputs[1]) == 1;
}

/* Does a split pass through op as a norm (norm_within_heads, norm_splits_across)? */
static bool split_norm(const TpModule *m, int op, int rank) {
  return norm_within_heads(m, op, rank) || tp_split_norm_splits_across(m, op);
}

/* Is op a residual: an Add or Sub of v and another activation (not only constants and
 * params)? A product of two activations (a gated MLP's gate and up) is not. */
static bool residual(const TpModule *m, const TpOp *op, int v) {
  if (op->kind != TP_OP_Add && op->kind != TP_OP_Sub) return false;
  for (int i = 0; i < op->ninputs; i++) {
    int u = op->inputs[i];
    if (u >= 0 && u != v && (m->values[u].kind == TP_VAL_RESULT || m->values[u].kind == TP_VAL_INPUT)) return true;
  }
  return false;
}

/* Does value v, a view of a column product's result of rank `rank`, reach the input of a
 * Linear within its block: through any op but a residual or a norm a split cannot pass
 * (split_norm; where a block ends)? *blocker gets the first op on such a path that cannot
 * carry a split, or stays -1. */
static bool reaches_linear(const TpModule *m, int v, int rank, bool *seen, int *blocker) {
  if (seen[v]) return false;
  seen[v] = true;
  bool found = false;
  for (int o = 0; o < m->nops; o++) {
    const TpOp *op = &m->ops[o];
    for (int i = 0; i < op->ninputs; i++) {
      if (op->inputs[i] != v) continue;
      if (op->kind == TP_OP_Linear && i == 0) {
        found = true;
        continue;
      }
      bool norm = split_norm(m, o, rank);
      if ((is_norm(op->kind) && !norm) || residual(m, op, v)) continue;
      for (int r = 0; r < op->noutputs; r++)
        if (op->outputs[r] >= 0 && reaches_linear(m, op->outputs[r], rank, seen, blocker)) {
          found = true;
          if (*blocker < 0 && !carries_split(op->kind) && !norm) *blocker = o;
        }
    }
  }
  return found;
}

/* The one op reading v (-1 when none or several). */
static int sole_reader(const TpModule *m, int v, int *operand) {
  int found = -1;
  for (int o = 0; o < m->nops; o++)
    for (int i = 0; i < m->ops[o].ninputs; i++)
      if (m->ops[o].inputs[i] == v) {
        if (found >= 0) return -1;
        found = o, *operand = i;
      }
  return found;
}

/* The heads a column product's result y (or a chunk of it), of rank `rank`, is reshaped
 * into (0: none, an MLP product), and whether they are keys or values of an attention,
 * following y's lone readers. */
static int64_t heads_of(const TpModule *m, int y, int rank, bool *kv) {
  int64_t heads = 0;
  *kv = false;
  for (int v = y, i; v >= 0;) {
    int o = sole_reader(m, v, &i);
    if (o < 0) break;
    const TpOp *op = &m->ops[o];
    const TpType *in = &m->values[v].type, *out = &m->values[op->outputs[0]].type;
    if (op->kind == TP_OP_Attention) {
      *kv = i == 1 || i == 2;
      break;
    }
    if (op->kind == TP_OP_Reshape && !heads && out->rank > in->rank) heads = out->dims[in->rank - 1];
    if ((!carries_split(op->kind) && !split_norm(m, o, rank)) || op->kind == TP_OP_Linear) break;
    v = op->outputs[0];
  }
  return heads;
}

/* Re-infers op's results from its (now per-rank) operands. */
int tp_split_reinfer(TpSplitCtx *s, int op) {
  TpOp *o = &s->m->ops[op];
  for (int r = 0; r < o->noutputs; r++)
    if (o->outputs[r] >= 0) s->m->values[o->outputs[r]].type.dtype = TP_UNDEF;
  return tp_infer_op(s->m, op, s->d);
}

void tp_split_mark(TpSplitCtx *s, int v, int axis, int parts) {
  s->axis[v] = axis;
  s->parts[v] = parts;
}

/* Is v's data one element repeated (a `dense<x>` splat)? */
static bool splat(const TpModule *m, int v) {
  const uint8_t *p = tp_value_data(m, v);
  size_t size = tp_dtype_size(m->values[v].type.dtype), n = (size_t)tp_type_numel(&m->values[v].type);
  for (size_t i = 1; i < n; i++)
    if (memcmp(p, p + i * size, size) != 0) return false;
  return true;
}

static int cut_param(TpSplitCtx *s, int op, int w, int axis, int parts, int chunks, int pad);

/* Splits param w along axis into parts (of chunks chunks each). */
int tp_split_param(TpSplitCtx *s, int op, int w, int axis, int parts, int chunks) {
  TpValue *val = &s->m->values[w];
  if (val->kind != TP_VAL_PARAM || val->tied >= 0 || val->shard.parts || tp_use_count(s->m, w) != 1)
    return tp_split_refuse(s, op, tp_strfmt(s->m, "its weight %%%s is not a param that it alone reads", val->name));
  return cut_param(s, op, w, axis, parts, chunks, 0);
}

/* split_param's cut, whoever reads w, after `pad` slices of padding along axis (TpShard). */
static int cut_param(TpSplitCtx *s, int op, int w, int axis, int parts, int chunks, int pad) {
  TpValue *val = &s->m->values[w];
  /* the textual IR prints inline data with the per-rank type: only a splat stays whole */
  if (!s->m->blobs[val->blob].path && !splat(s->m, w))
    return tp_split_refuse(s, op,
                           tp_strfmt(s->m, "%%%s holds inline data, not a file's: it would print cut", val->name));
  if ((val->type.dims[axis] + pad) % ((int64_t)parts * chunks) != 0)
    return tp_split_refuse(s, op,
                           tp_strfmt(s->m, "dim %d of %%%s (%lld) does not split into %d parts", axis, val->name,
                                     (long long)val->type.dims[axis], parts * chunks));
  val->type.dims[axis] = (val->type.dims[axis] + pad) / parts;
  val->shard = (TpShard){.axis = axis, .parts = parts, .ranks = s->ranks, .chunks = chunks, .pad = pad};
  return TP_OK;
}

/* A new op after `after` (same placement and origin) computing kind(in), its result not
 * yet inferred; the op. */
int tp_split_new_op(TpSplitCtx *s, int after, TpOpKind kind, const int *in, int nin, const char *name) {
  TpOrigin origin = s->m->ops[after].origin;
  int op = tp_add_op(s->m, kind, in, nin, (const char *[]){name}, 1, origin);
  TpOp *a = &s->m->ops[after], *o = &s->m->ops[op];
  o->stage = a->stage, o->slice = a->slice, o->phase = a->phase;
  if (kind == TP_OP_AllReduce || kind == TP_OP_TensorCopy || kind == TP_OP_TensorRank)
    tp_set_attr_string(s->m, op, "group", "tensor");
  if (kind == TP_OP_AllReduce) tp_set_attr_string(s->m, op, "reduce", "sum");
  return op;
}

/* new_op, inferred; its result (-1 after an error). */
int tp_split_add_after(TpSplitCtx *s, int after, TpOpKind kind, const int *in, int nin, const char *name) {
  int op = tp_split_new_op(s, after, kind, in, nin, name);
  return tp_infer_op(s->m, op, s->d) == TP_OK ? s->m->ops[op].outputs[0] : -1;
}

/* The chunks cut_pieces finds: their length (0: none yet), a value holding the first, and
 * whether every cut so far is one chunk at a chunk boundary. */
typedef struct {
  int64_t len;
  int piece;
  bool equal;
} Cuts;

static void cut(Cuts *c, int64_t at, int64_t len, int value) {
  if (!c->len) c->len = len, c->piece = value;
  c->equal &= len == c->len && len > 0 && at % len == 0;
}

/* How the readers of column product y cut the axis a split would follow (y's features, or
 * the heads axis of a Reshape of y into heads): into *chunks equal chunks (1: not cut), by
 * Split, Slice or Gather; *piece is a value holding one chunk (-1: none). False when the
 * cuts are unequal or off the chunk boundaries (K/V fused with more query heads: Falcon's
 * multi-query Q|K|V), which TpShard cannot write as one split. */
static bool cut_pieces(const TpModule *m, int y, int *chunks, int *piece) {
  int v = y, a = m->values[y].type.rank - 1, i, r = sole_reader(m, y, &i);
  *chunks = 1, *piece = -1;
  if (r >= 0 && m->ops[r].kind == TP_OP_Reshape && m->values[m->ops[r].outputs[0]].type.rank > a + 1) {
    v = m->ops[r].outputs[0];
    a = tp_split_reshape_axis(&m->values[y].type, &m->values[v].type, a, 1);
    if (a < 0) return true; /* follow() refuses the Reshape */
  }
  const TpType *t = &m->values[v].type;
  Cuts c = {0, -1, true};
  for (int o = 0; o < m->nops; o++) {
    const TpOp *op = &m->ops[o];
    if (op->ninputs < 1 || op->inputs[0] != v) continue;
    int n, axis = (int)tp_attr_int(m, o, "axis", 0), out = op->outputs[0];
    if (axis < 0) axis += t->rank;
    if (op->kind == TP_OP_Split && axis == a) {
      int64_t at = 0;
      for (int k = 0; k < op->noutputs; k++) {
        int64_t len = op->outputs[k] >= 0 ? m->values[op->outputs[k]].type.dims[a] : 0;
        cut(&c, at, len, op->outputs[k]);
        at += len;
      }
    } else if (op->kind == TP_OP_Slice && m->values[out].type.dims[a] != t->dims[a]) {
      const int64_t *starts = tp_attr_ints(m, o, "starts", &n), *steps = tp_attr_ints(m, o, "steps", &n);
      cut(&c, starts[a] < 0 ? starts[a] + t->dims[a] : starts[a], m->values[out].type.dims[a], out);
      c.equal &= steps[a] == 1;
    } else if (op->kind == TP_OP_Gather && axis == a) {
      int idx = op->inputs[1];
      TpDType dt = m->values[idx].type.dtype;
      bool one = m->values[idx].kind == TP_VAL_CONST && tp_type_numel(&m->values[idx].type) == 1 &&
                 (dt == TP_I64 || dt == TP_I32);
      const void *p = one ? tp_value_data(m, idx) : NULL;
      int64_t k = !p ? 0 : dt == TP_I64 ? *(const int64_t *)p : *(const int32_t *)p;
      cut(&c, k < 0 ? k + t->dims[a] : k, 1, out);
      c.equal &= one;
    }
  }
  if (!c.equal || (c.len && t->dims[a] % c.len != 0)) return false;
  if (c.len) *chunks = (int)(t->dims[a] / c.len), *piece = c.piece;
  return true;
}

/* Does Attention op add a bias that differs per head (ALiBi's slopes): a mask/bias operand
 * whose heads axis (of the scores [B, H, S, T], aligned from the right) is not 1? */
bool tp_split_per_head_bias(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  if (o->ninputs < 4 || o->inputs[3] < 0) return false;
  const TpType *t = &m->values[o->inputs[3]].type;
  return t->rank >= 3 && t->dims[t->rank - 3] > 1;
}

/* Is Attention op's bias a param that it alone reads (then split with the heads)? */
bool tp_split_own_bias(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  return o->ninputs > 3 && o->inputs[3] >= 0 && m->values[o->inputs[3]].kind == TP_VAL_PARAM &&
         tp_use_count(m, o->inputs[3]) == 1;
}

/* The column product that v views: the Linear reached back from v through the first
 * operands of ops that carry a split and norms (-1: none). */
static int viewed_product(const TpModule *m, int v) {
  while (v >= 0 && m->values[v].kind == TP_VAL_RESULT) {
    const TpOp *op = &m->ops[m->values[v].def];
    if (op->kind == TP_OP_Linear) return m->values[v].def;
    if (op->kind == TP_OP_Attention || (!carries_split(op->kind) && !is_norm(op->kind))) break;
    v = op->inputs[0];
  }
  return -1;
}

/* Is v, an operand of an Attention, normalised over all its heads at once on the way from
 * the product it views, by a norm that cannot be split across the ranks (a LayerNorm, or a
 * scale that is not a param of its own: norm_splits_across)? */
static bool normed_across_heads(const TpModule *m, int v) {
  int product = viewed_product(m, v);
  if (product < 0) return false;
  int rank = m->values[m->ops[product].outputs[0]].type.rank;
  for (; v != m->ops[product].outputs[0]; v = m->ops[m->values[v].def].inputs[0]) {
    int def = m->values[v].def;
    if (is_norm(m->ops[def].kind) && !split_norm(m, def, rank)) return true;
  }
  return false;
}

/* Why the Attention that v (a column product's result of rank `rank`, or a view of it)
 * reaches as Q, K or V within its block must stay whole, or NULL: a per-head bias that is
 * not its own param (a constant: ALiBi's), or an operand normalised over all heads. */
static const char *whole_attention(const TpModule *m, int v, int rank, bool *seen) {
  if (seen[v]) return NULL;
  seen[v] = true;
  for (int o = 0; o < m->nops; o++) {
    const TpOp *op = &m->ops[o];
    for (int i = 0; i < op->ninputs; i++) {
      if (op->inputs[i] != v) continue;
      if (op->kind == TP_OP_Attention && i < 3 && tp_split_per_head_bias(m, o) && !tp_split_own_bias(m, o))
        return "its attention adds a bias that differs per head (ALiBi)";
      for (int j = 0; op->kind == TP_OP_Attention && i < 3 && j < 3; j++)
        if (normed_across_heads(m, op->inputs[j]))
          return "its attention's queries or keys are normalised over all heads at once by a norm other than an "
                 "RMSNorm with a scale of its own";
      if (op->kind == TP_OP_Attention || op->kind == TP_OP_Linear || residual(m, op, v) ||
          (!carries_split(op->kind) && !split_norm(m, o, rank)))
        continue;
      for (int r = 0; r < op->noutputs; r++) {
        const char *why = op->outputs[r] >= 0 ? whole_attention(m, op->outputs[r], rank, seen) : NULL;
        if (why) return why;
      }
    }
  }
  return NULL;
}

/* Why the column candidate Linear op stays whole, computed alike on every rank with the
 * attention it feeds, or NULL: its result's heads are cut unequally (cut_pieces), or that
 * attention cannot be split by heads (whole_attention): ALiBi's bias, for which each rank
 * would need its own constant, which the plan cannot hold (only params are split), or
 * queries or keys normalised over every head. */
static const char *whole_reason(const TpSplitCtx *s, int op) {
  int chunks, piece, y = s->m->ops[op].outputs[0];
  if (!cut_pieces(s->m, y, &chunks, &piece))
    return "its heads are cut into unequal groups (multi-query K/V fused with Q)";
  bool *seen = calloc((size_t)s->m->nvalues, 1);
  TP_ASSERT(seen);
  const char *why = whole_attention(s->m, y, s->m->values[y].type.rank, seen);
  free(seen);
  return why;
}

/* One note line: how many products (`what`) stay whole, naming the first, and why. */
static void note_whole(const TpSplitCtx *s, int nwhole, int first, const char *what, const char *why) {
  const TpModule *m = s->m;
  if (!nwhole || !s->d->stream) return;
  const char *node = m->ops[first].origin.node;
  if (!node) node = m->values[m->ops[first].outputs[0]].name;
  tp_print_line(s->d->stream,
                "%s: note: %s%sshard-tensor keeps %d %s%s whole on every tensor rank, such as '%s': %s",
                s->d->tool ? s->d->tool : "tokpipec", s->d->file ? s->d->file : "", s->d->file ? ": " : "", nwhole,
                what, nwhole > 1 ? "s" : "", node, why);
}

/* Is v (through Reshapes) a Gather of a param's rows: a mixture's expert weights, picked per
 * token by its router? */
static bool gathered_param(const TpModule *m, int v) {
  while (m->values[v].def >= 0 && m->ops[m->values[v].def].kind == TP_OP_Reshape)
    v = m->ops[m->values[v].def].inputs[0];
  if (m->values[v].def < 0 || m->ops[m->values[v].def].kind != TP_OP_Gather) return false;
  int data = m->ops[m->values[v].def].inputs[0];
  while (m->values[data].def >= 0 && m->ops[m->values[data].def].kind == TP_OP_Reshape)
    data = m->ops[m->values[data].def].inputs[0];
  return m->values[data].kind == TP_VAL_PARAM;
}

/* The chunks of split value v: those of the column product it views (through Reshape and
 * Transpose); 1 for a value cut out of it. */
int tp_split_chunks_of(const TpSplitCtx *s, int v) {
  const TpModule *m = s->m;
  for (int def = m->values[v].def; def >= 0; def = m->values[v].def) {
    const TpOp *op = &m->ops[def];
    const TpShard *sh = op->kind == TP_OP_Linear ? &m->values[op->inputs[1]].shard : NULL;
    if (sh) return sh->chunks > 1 ? sh->chunks : 1;
    if (op->kind != TP_OP_Reshape && op->kind != TP_OP_Transpose) break;
    v = op->inputs[0];
  }
  return 1;
}

/* Routes operand i of op, replicated while op works on split values (or makes them: a
 * column-parallel product's input), through TensorCopy (Megatron's f), one per value,
 * unless it is a constant or not a float: each rank differentiates it by its own part only
 * (also a trainable Rotary table, a scale broadcast over the split features), so its
 * gradient must be summed over the ranks. */
int tp_split_share_operand(TpSplitCtx *s, int op, int i) {
  TpModule *m = s->m;
  int v = m->ops[op].inputs[i];
  if (v < 0 || s->axis[v] >= 0 || m->values[v].kind == TP_VAL_CONST || !tp_dtype_is_float(m->values[v].type.dtype))
    return TP_OK;
  if (s->copy_of[v] < 0)
    s->copy_of[v] = tp_split_add_after(s, op, TP_OP_TensorCopy, &v, 1, tp_strfmt(m, "%s.tp", m->values[v].name));
  if (s->copy_of[v] < 0) return TP_ERR_INPUT;
  m->ops[op].inputs[i] = s->copy_of[v];
  return TP_OK;
}

/* Column-parallel Linear op (replicated input). */
static int column(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  int w = m->ops[op].inputs[1], b = m->ops[op].ninputs > 2 ? m->ops[op].inputs[2] : -1;
  int y = m->ops[op].outputs[0];
  bool kv;
  int chunks, piece;
  cut_pieces(m, y, &chunks, &piece); /* equal: whole_reason() checked */
  int64_t heads = heads_of(m, y, m->values[y].type.rank, &kv);
  int i, r = sole_reader(m, y, &i);
  if (!heads && piece >= 0) heads = heads_of(m, piece, m->values[y].type.rank, &kv);
  else if (r >= 0 && m->ops[r].kind == TP_OP_Reshape) heads /= chunks; /* the chunks cut y's heads */
  int parts = s->ranks;
  if (heads && heads % s->ranks != 0) {
    if (!kv || s->ranks % heads != 0)
      return tp_split_refuse(s, op,
                             tp_strfmt(m, "its %lld %s heads do not divide among the ranks", (long long)heads,
                                       kv ? "key/value" : "query"));
    parts = (int)heads; /* one head per part, N/heads ranks each */
  }
  bool tw = tp_attr_int(m, op, "transpose_w", 0) != 0;
  if (tp_split_param(s, op, w, tw ? 0 : 1, parts, chunks) || (b >= 0 && tp_split_param(s, op, b, 0, parts, chunks)))
    return TP_ERR_INPUT;
  if (tp_split_share_operand(s, op, 0)) return TP_ERR_INPUT;
  if (tp_split_reinfer(s, op)) return TP_ERR_INPUT;
  tp_split_mark(s, y, m->values[y].type.rank - 1, parts);
  return TP_OK;
}

/* Row-parallel Linear op (input split along its last axis): partial sums, all-reduced,
 * then the bias. */
static int row(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  int x = m->ops[op].inputs[0], w = m->ops[op].inputs[1], b = m->ops[op].ninputs > 2 ? m->ops[op].inputs[2] : -1;
  int y = m->ops[op].outputs[0];
  if (s->axis[x] != m->values[x].type.rank - 1 || s->parts[x] != s->ranks)
    return tp_split_refuse(s, op,
                           tp_strfmt(m, "its input %%%s is not split along its features into one part per rank",
                                     m->values[x].name));
  bool tw = tp_attr_int(m, op, "transpose_w", 0) != 0;
  if (tp_split_param(s, op, w, tw ? 1 : 0, s->ranks, 1)) return TP_ERR_INPUT;
  if (b >= 0) m->ops[op].inputs[2] = -1;
  if (tp_split_reinfer(s, op)) return TP_ERR_INPUT;
  const char *name = m->values[y].name;
  int sum = tp_split_add_after(s, op, TP_OP_AllReduce, &y, 1, tp_strfmt(m, "%s.sum", name));
  int out = sum >= 0 && b >= 0
                ? tp_split_add_after(s, op, TP_OP_Add, (int[]){sum, b}, 2, tp_strfmt(m, "%s.bias", name))
                : sum;
  if (out < 0) return TP_ERR_INPUT;
  tp_replace_uses(m, y, out);
  m->ops[m->values[sum].def].inputs[0] = y;
  return TP_OK;
}

/* The axis of the (whole) result dims `out` that continues axis a of the per-rank operand
 * dims `in`, split into p parts, through a Reshape, or -1: the same elements before it,
 * whole pieces either way. */
int tp_split_reshape_axis(const TpType *in, const TpType *out, int a, int p) {
  int64_t before = 1, after = 1, whole = in->dims[a] * p;
  for (int i = 0; i < a; i++) before *= in->dims[i];
  for (int b = 0; b < out->rank; after *= out->dims[b], b++)
    if (after == before && out->dims[b] % p == 0 && (whole % out->dims[b] == 0 || out->dims[b] % whole == 0))
      return b;
  return -1;
}

/* An op other than Linear reading at least one split value: its tensor-split rule
 * (TpOpRules.tensor_split), which splits its result along, or refuses. */
static int follow(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  int (*split)(TpSplitCtx *, int) = tp_op_rules[m->ops[op].kind]->tensor_split;
  if (!split)
    return tp_split_refuse(s, op,
                           tp_strfmt(m, "it reads %%%s, which is split over the ranks",
                                     m->values[m->ops[op].inputs[0]].name));
  return split(s, op);
}

/* ---- vocabulary-parallel embedding and LM head ---- */

/* The param that the weight w of a Linear stands for: w itself, or the param of a re-tie
 * view (a Transpose {perm = [1, 0]} or same-shape Reshape: passes/retie_params.c) read by
 * the Linear alone; -1 for anything else. *axis, an axis of w, becomes the param's. */
static int head_param(const TpModule *m, int w, int *axis) {
  if (m->values[w].kind == TP_VAL_PARAM) return w;
  if (m->values[w].kind != TP_VAL_RESULT || tp_use_count(m, w) != 1) return -1;
  const TpOp *view = &m->ops[m->values[w].def];
  if (view->role != TP_ROLE_RETIE || m->values[view->inputs[0]].kind != TP_VAL_PARAM) return -1;
  if (view->kind == TP_OP_Transpose) *axis = 1 - *axis;
  return view->inputs[0];
}

/* The Linear whose result logits v are, through Casts (a model's upcast of its logits)
 * that alone read their operands; -1 when v is not such a result. */
static int logits_linear(const TpModule *m, int v) {
  while (v >= 0 && m->values[v].kind == TP_VAL_RESULT && m->ops[m->values[v].def].kind == TP_OP_Cast &&
         tp_use_count(m, m->ops[m->values[v].def].inputs[0]) == 1)
    v = m->ops[m->values[v].def].inputs[0];
  return v >= 0 && m->values[v].kind == TP_VAL_RESULT && m->ops[m->values[v].def].kind == TP_OP_Linear
             ? m->values[v].def
             : -1;
}

/* The Linear computing logits v, if its weight (a param, or a view of one) is split along
 * its output columns, or padded there (one part: --tensor 1 on a target that pads). */
static int vocab_head(const TpModule *m, int v, int *param) {
  int op = logits_linear(m, v);
  if (op < 0) return -1;
  int axis = tp_attr_int(m, op, "transpose_w", 0) ? 0 : 1;
  *param = head_param(m, m->ops[op].inputs[1], &axis);
  const TpShard *sh = *param >= 0 ? &m->values[*param].shard : NULL;
  return sh && (sh->parts > 1 || (sh->parts == 1 && sh->pad > 0)) && sh->axis == axis ? op : -1;
}

int tp_vocab_parts(const TpModule *m, int v) {
  int param;
  return vocab_head(m, v, &param) >= 0 ? m->values[param].shard.parts : 1;
}

int tp_vocab_pad(const TpModule *m, int v) {
  int param;
  return vocab_head(m, v, &param) >= 0 ? m->values[param].shard.pad : 0;
}

/* Is op an Embedding of table w by token ids (a graph input) that can look up a range?
 * One with a padding row stays whole: the range kernels do not skip it. */
static bool token_embedding(const TpModule *m, int op, int w) {
  const TpOp *o = &m->ops[op];
  return o->kind == TP_OP_Embedding && o->ninputs == 2 && o->inputs[0] == w &&
         m->values[o->inputs[1]].kind == TP_VAL_INPUT && !tp_get_attr(m, op, "padding_idx");
}

/* Gives op one more operand, v. */
static void append_operand(TpModule *m, int op, int v) {
  TpOp *o = &m->ops[op];
  int *in = tp_alloc(m, (size_t)(o->ninputs + 1) * sizeof *in);
  memcpy(in, o->inputs, (size_t)o->ninputs * sizeof *in);
  in[o->ninputs] = v;
  o->inputs = in, o->ninputs++;
}

/* Embedding op looks up this rank's range of its (split) table; an AllReduce of the ranks'
 * rows (zeros outside each range) is the whole embedding. */
static int range_embedding(TpSplitCtx *s, int op) {
  TpModule *m = s->m;
  int y = m->ops[op].outputs[0];
  const char *name = m->values[y].name;
  int part = tp_split_add_after(s, op, TP_OP_TensorRank, NULL, 0, tp_strfmt(m, "%s.part", name));
  if (part < 0) return TP_ERR_INPUT;
  append_operand(m, op, part);
  tp_set_attr_int(m, op, "vocab_parts", s->ranks);
  int sum = tp_split_reinfer(s, op)
                ? -1
                : tp_split_add_after(s, op, TP_OP_AllReduce, &y, 1, tp_strfmt(m, "%s.sum", name));
  if (sum < 0) return TP_ERR_INPUT;
  tp_replace_uses(m, y, sum);
  m->ops[m->values[sum].def].inputs[0] = y;
  return TP_OK;
}

/* The padding that makes a vocabulary of `vocab` classes a multiple of ranks x multiple
 * (each rank's range a multiple of `multiple` classes), falling back to a multiple of the
 * ranks alone where that would leave the last rank nothing but padding; -1 where even
 * that would (a vocabulary smaller than the ranks). */
static int64_t vocab_padding(int64_t vocab, int ranks, int multiple) {
  for (int64_t unit = (int64_t)ranks * (multiple > 1 ? multiple : 1);; unit = ranks) {
    int64_t pad = (unit - vocab % unit) % unit;
    if (pad < (vocab + pad) / ranks) return pad;
    if (unit == ranks) return -1;
  }
}

/* Does param w hold inline data (not a file's)? Padded, not split, its type would outgrow
 * its data (a splat's too). */
static bool inline_data(const TpModule *m, int w) { return w >= 0 && !m->blobs[m->values[w].blob].path; }

/* Splits table w (a param) along its rows (axis 0) or, for a head's own weight, its output
 * columns (axis), for every reader: the token embeddings, and the LM head `head` (-1: none;
 * through the view of w it reads when there is one). op names the place for errors. A
 * vocabulary is padded to a multiple of the ranks x `multiple` (vocab_padding), as Megatron
 * does (TpShard.pad: the last rank's last rows; the loss masks their logits out); one
 * smaller than the ranks would leave a rank nothing but padding and stays replicated, with
 * a note. With one rank (--tensor 1, padding alone) nothing is split and only the head's
 * weight (a tied table with it) and bias get their padding: a table only embeddings read
 * stays as it is, and so does a head that needs none or holds inline data. */
static int split_vocab(TpSplitCtx *s, int w, int axis, int head, int op, int multiple) {
  TpModule *m = s->m;
  const TpValue *val = &m->values[w];
  int64_t vocab = val->type.dims[axis], pad = vocab_padding(vocab, s->ranks, multiple);
  if (pad < 0) {
    if (s->d->stream)
      tp_print_line(s->d->stream,
                    "%s: note: %s%s%%%s: a vocabulary of %lld padded for %d tensor ranks would leave the last "
                    "only padding; it stays replicated",
                    s->d->tool ? s->d->tool : "tokpipec", s->d->file ? s->d->file : "", s->d->file ? ": " : "",
                    val->name, (long long)vocab, s->ranks);
    return TP_OK;
  }
  int b = head >= 0 && m->ops[head].ninputs > 2 ? m->ops[head].inputs[2] : -1;
  if (s->ranks == 1 && (head < 0 || !pad || inline_data(m, w) || inline_data(m, b))) return TP_OK;
  if (cut_param(s, op, w, axis, s->ranks, 1, (int)pad) ||
      (b >= 0 && cut_param(s, head, b, 0, s->ranks, 1, (int)pad)))
    return TP_ERR_INPUT;
  for (int e = 0; e < m->nops && s->ranks > 1; e++)
    if (token_embedding(m, e, w) && range_embedding(s, e)) return TP_ERR_INPUT;
  if (head < 0) return TP_OK;
  int view = m->ops[head].inputs[1], x = m->ops[head].inputs[0];
  if (view != w) { /* the re-tie view: a Transpose infers its cut type, a Reshape is preset */
    int def = m->values[view].def;
    if (m->ops[def].kind == TP_OP_Reshape) m->values[view].type.dims[axis] = m->values[w].type.dims[axis];
    else if (tp_split_reinfer(s, def)) return TP_ERR_INPUT;
  }
  if (s->ranks > 1 && s->copy_of[x] < 0)
    s->copy_of[x] = tp_split_add_after(s, head, TP_OP_TensorCopy, &x, 1, tp_strfmt(m, "%s.tp", m->values[x].name));
  if (s->ranks > 1 && s->copy_of[x] < 0) return TP_ERR_INPUT;
  if (s->ranks > 1) m->ops[head].inputs[0] = s->copy_of[x];
  if (tp_split_reinfer(s, head)) return TP_ERR_INPUT;
  for (int op = head, i;;) { /* the Casts of its logits: their result types are preset */
    int y = m->ops[op].outputs[0], r = m->values[y].type.rank - 1;
    op = sole_reader(m, y, &i);
    if (op < 0 || m->ops[op].kind != TP_OP_Cast) return TP_OK;
    m->values[m->ops[op].outputs[0]].type.dims[r] = m->values[y].type.dims[r];
    if (tp_infer_op(m, op, s->d)) return TP_ERR_INPUT;
  }
}

/* Vocabulary parallelism: the LM head whose logits add-loss trains becomes column-parallel
 * over the vocabulary (add-loss then appends the parallel cross-entropy, which never
 * gathers the logits), and every token embedding looks up only its rank's rows of its
 * table, tied to the head or not. A table anything else reads stays replicated, and so
 * does a tied table the head reads along its rows' other axis. */
static int split_vocabularies(TpSplitCtx *s, int multiple) {
  TpModule *m = s->m;
  int logits = tp_loss_logits(m, s->logits),
      head = logits >= 0 && tp_use_count(m, logits) == 1 ? logits_linear(m, logits) : -1;
  int head_w = -1, view = -1, axis = -1, b = head >= 0 && m->ops[head].ninputs > 2 ? m->ops[head].inputs[2] : -1;
  if (b >= 0 && (m->values[b].kind != TP_VAL_PARAM || m->values[b].tied >= 0 || m->values[b].shard.parts ||
                 tp_use_count(m, b) != 1))
    head = -1; /* a bias it cannot split with the head: all stays replicated */
  if (logits >= 0 && m->values[logits].type.dtype != TP_F32)
    head = -1;     /* the parallel cross-entropy takes f32 logits; the plain loss says what it needs */
  if (head >= 0) { /* logits read by the graph output alone */
    axis = tp_attr_int(m, head, "transpose_w", 0) ? 0 : 1;
    int w = m->ops[head].inputs[1];
    head_w = head_param(m, w, &axis);
    view = head_w >= 0 && w != head_w ? m->values[w].def : -1;
  }
  for (int w = 0; w < m->nvalues; w++) {
    const TpValue *val = &m->values[w];
    if (val->kind != TP_VAL_PARAM || val->tied >= 0 || val->shard.parts || val->type.rank != 2) continue;
    int embeddings = 0, others = 0, first = -1;
    for (int op = 0; op < m->nops; op++)
      for (int i = 0; i < m->ops[op].ninputs; i++) {
        if (m->ops[op].inputs[i] != w) continue;
        if (i == 0 && token_embedding(m, op, w)) embeddings++, first = first < 0 ? op : first;
        else if (w != head_w || (op != head && op != view) || (op == head && i != 1)) others++;
      }
    bool is_head = w == head_w;
    if (others || (!embeddings && !is_head) || (is_head && embeddings && axis != 0)) continue;
    if (split_vocab(s, w, is_head ? axis : 0, is_head ? head : -1, is_head ? head : first, multiple))
      return TP_ERR_INPUT;
  }
  return TP_OK;
}

int pass_shard_tensor(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  if (opt->tensor <= 1 && (opt->vocab_multiple <= 1 || opt->forward_only)) return TP_OK;
  if (m->loss >= 0) return tp_error(d, "shard-tensor runs on the forward module: before add-loss");
  if (opt->tensor <= 1) { /* one rank: the LM head's vocabulary padded, nothing split */
    TpSplitCtx one = {m, d, 1, opt->logits, NULL, NULL, NULL};
    return split_vocabularies(&one, opt->vocab_multiple);
  }
  m->tensor = opt->tensor; /* the group the module is split over, for codegen */
  TpSplitCtx s = {m, d, opt->tensor, opt->logits, NULL, NULL, NULL};
  int nvalues = m->nvalues, nops = m->nops, rc = TP_OK, nwhole = 0, first_whole = -1, nexperts = 0,
      first_expert = -1;
  const char *first_why = NULL;
  /* room for the values added below too: at most 11 per op (norm_across_ranks) */
  int cap = nvalues + 12 * nops;
  s.axis = malloc((size_t)cap * sizeof *s.axis);
  s.parts = calloc((size_t)cap, sizeof *s.parts);
  s.copy_of = malloc((size_t)cap * sizeof *s.copy_of);
  bool *seen = malloc((size_t)cap);
  TP_ASSERT(s.axis && s.parts && s.copy_of && seen);
  for (int v = 0; v < cap; v++) s.axis[v] = s.copy_of[v] = -1;
  for (int op = 0; op < nops && rc == TP_OK; op++) {
    const TpOp *o = &m->ops[op];
    bool split_in = false;
    for (int i = 0; i < o->ninputs; i++) split_in |= o->inputs[i] >= 0 && s.axis[o->inputs[i]] >= 0;
    if (o->kind == TP_OP_MatMul && (gathered_param(m, o->inputs[0]) || gathered_param(m, o->inputs[1])) &&
        !nexperts++)
      first_expert = op;
    if (o->kind == TP_OP_Linear && split_in) {
      rc = row(&s, op);
    } else if (o->kind == TP_OP_Linear) {
      int blocker = -1;
      memset(seen, 0, (size_t)m->nvalues);
      int y = o->outputs[0];
      bool block = m->values[o->inputs[1]].kind == TP_VAL_PARAM &&
                   reaches_linear(m, y, m->values[y].type.rank, seen, &blocker);
      const char *why = block ? whole_reason(&s, op) : NULL;
      if (why && !nwhole++) first_whole = op, first_why = why;
      block = block && !why;
      if (block && blocker >= 0)
        rc = tp_split_refuse(&s, blocker,
                             tp_strfmt(m, "it lies between the column-parallel product %%%s and a row-parallel one",
                                       m->values[o->outputs[0]].name));
      else if (block) rc = column(&s, op);
    } else if (split_in) {
      rc = follow(&s, op);
    }
  }
  if (rc == TP_OK) rc = split_vocabularies(&s, opt->vocab_multiple);
  for (int i = 0; i < m->noutputs && rc == TP_OK; i++)
    if (s.axis[m->outputs[i]] >= 0)
      rc = tp_split_refuse(&s, m->values[m->outputs[i]].def,
                           tp_strfmt(m, "the graph outputs its split result %%%s", m->values[m->outputs[i]].name));
  free(s.axis);
  free(s.parts);
  free(s.copy_of);
  free(seen);
  if (rc == TP_OK) note_whole(&s, nwhole, first_whole, "attention product", first_why);
  if (rc == TP_OK)
    note_whole(&s, nexperts, first_expert, "expert product",
               "a mixture's experts, picked per token, are split neither by experts nor within them");
  if (rc == TP_OK) tp_sort_ops(m);
  return rc;
}
