/* The ONNX op table and the lowering of each node into the canonical IR of ir/ops.def:
 * constant operands (shapes, axes, sizes) become attributes or result types, axes are
 * normalised to >= 0, Squeeze/Unsqueeze/Flatten become Reshape, variadic Max/Min chains of
 * binary ops, Identity (but of a parameter), one-operand Max/Min and inference Dropout become
 * aliases, Shape/Range/ConstantOfShape/Constant become constants. */
#include "import.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static void set_result_type(Importer *I, int op, int k, TpType t) {
  int v = I->m->ops[op].outputs[k];
  if (v >= 0) I->m->values[v].type = t;
}

static TpType type_of(Importer *I, int v) { return *value_type(I, v); }

/* One IR op over the node's operands with the row's kind and no attributes. */
static int import_plain(Importer *I, Node *N) {
  int op = new_op(I, N, N->kind, N->in, N->nin, N->nout);
  return finish_op(I, N, op);
}

/* A step of a node's lowering before its last op: a new op over `inputs` whose one result
 * is named `name` (made unique) and typed `t` where the op takes its type from it (Reshape,
 * Expand, Cast; NULL: inferred). The caller sets attributes, then step_value. */
static int step_named(Importer *I, const Node *N, const char *name, TpOpKind kind, const int *inputs, int ninputs,
                      const TpType *t) {
  const char *names[1] = {name};
  int op = tp_add_op(I->m, kind, inputs, ninputs, names, 1, N->at);
  if (t) set_result_type(I, op, 0, *t);
  return op;
}

/* The same, named <the node's first output>.<what>. */
static int step_op(Importer *I, const Node *N, const char *what, TpOpKind kind, const int *inputs, int ninputs,
                   const TpType *t) {
  char name[300];
  snprintf(name, sizeof name, "%.200s.%s", N->n->output[0], what);
  return step_named(I, N, name, kind, inputs, ninputs, t);
}

/* Infers and folds a step's op; *v gets its result. */
static int step_value(Importer *I, int op, int *v) {
  int rc = tp_infer_op(I->m, op, I->d);
  bool folded;
  if (rc || (rc = tp_fold_op(I->m, op, &folded, I->d))) return rc;
  *v = I->m->ops[op].outputs[0];
  return TP_OK;
}

/* A step without attributes: its result in *v. */
static int step(Importer *I, const Node *N, const char *what, TpOpKind kind, const int *inputs, int ninputs,
                const TpType *t, int *v) {
  return step_value(I, step_op(I, N, what, kind, inputs, ninputs, t), v);
}

/* A constant of the lowering, named <the node's first output>.<what>. */
static int step_const(Importer *I, const Node *N, const char *what, TpType t, const void *data) {
  char name[300];
  snprintf(name, sizeof name, "%.200s.%s", N->n->output[0], what);
  return tp_add_const(I->m, tp_unique_name(I->m, name), t, data, N->at);
}

/* IsNaN(x) = Not(Equal(x, x)): NaN is the one value unequal to itself (SDPA's
 * decomposition zeroes the probabilities of rows that see no key with it). */
static int import_isnan(Importer *I, Node *N) {
  int equal, rc = step(I, N, "equal", TP_OP_Equal, (int[]){N->in[0], N->in[0]}, 2, NULL, &equal);
  return rc ? rc : finish_op(I, N, new_op(I, N, TP_OP_Not, &equal, 1, 1));
}

/* value v (the result of node N's lowering) becomes Reshape(v) to `t`. */
static int emit_reshape(Importer *I, Node *N, int v, TpType t) {
  int op = new_op(I, N, TP_OP_Reshape, &v, 1, 1);
  set_result_type(I, op, 0, t);
  return finish_op(I, N, op);
}

/* The shape of a constant operand as dims (each >= 0, at most TP_MAX_RANK). */
static int const_shape(Importer *I, Node *N, int k, const char *what, int64_t *dims, int *rank) {
  int64_t v[TP_MAX_CONST_INTS];
  int n, rc = const_ints(I, N, k, what, v, &n);
  if (rc) return rc;
  if (n > TP_MAX_RANK)
    return node_error(I, N, "'%s' has %d dims; tokpipec supports rank <= %d", what, n, TP_MAX_RANK);
  for (int i = 0; i < n; i++) {
    if (v[i] < 0) return node_error(I, N, "'%s' has negative dim %lld", what, (long long)v[i]);
    dims[i] = v[i];
  }
  TpType t = tp_type_make(TP_F32, n, dims);
  if (!tp_type_size_ok(&t)) return node_error(I, N, "'%s' is too large", what); /* empty ones too */
  *rank = n;
  return TP_OK;
}

static int check_const_size(Importer *I, Node *N, const TpType *t) {
  int64_t numel = tp_type_numel(t), esize = (int64_t)tp_dtype_size(t->dtype);
  if (numel > TP_MAX_CONST_BYTES / esize)
    return node_error(I, N, "the constant it makes (%lld elements) is too large", (long long)numel);
  return TP_OK;
}

/* axes of Squeeze/Unsqueeze/Reduce*: normalised against rank, no repeats, sorted. */
static int norm_axes(Importer *I, Node *N, int64_t *axes, int n, int rank) {
  for (int i = 0; i < n; i++)
    if (norm_axis(I, N, "axis", axes[i], rank, &axes[i])) return TP_ERR_INPUT;
  for (int i = 1; i < n; i++) /* insertion sort: n <= 64 */
    for (int j = i; j > 0 && axes[j - 1] > axes[j]; j--) {
      int64_t t = axes[j];
      axes[j] = axes[j - 1];
      axes[j - 1] = t;
    }
  for (int i = 1; i < n; i++)
    if (axes[i] == axes[i - 1]) return node_error(I, N, "axis %lld is repeated", (long long)axes[i]);
  return TP_OK;
}

/* ---- elementwise, matrix products, gathers ---- */

/* Pow's exponent may have another dtype: cast it to the base's. */
static int import_pow(Importer *I, Node *N) {
  TpType base = type_of(I, N->in[0]), ex = type_of(I, N->in[1]);
  if (ex.dtype != base.dtype) {
    char name[300];
    snprintf(name, sizeof name, "%s.cast", I->m->values[N->in[1]].name);
    ex.dtype = base.dtype;
    int rc = step_value(I, step_named(I, N, name, TP_OP_Cast, &N->in[1], 1, &ex), &N->in[1]);
    if (rc) return rc;
  }
  return import_plain(I, N);
}

/* Max and Min of any number of operands: a chain of binary ops, numpy broadcasting at each;
 * one operand passes through. */
static int import_variadic(Importer *I, Node *N) {
  for (int k = 0; k < N->nin; k++)
    if (N->in[k] < 0) return node_error(I, N, "input %d is missing", k);
  if (N->nin == 1) {
    bind_output(I, N, 0, N->in[0]);
    return TP_OK;
  }
  int acc = N->in[0];
  for (int k = 1; k < N->nin - 1; k++) { /* all but the last op make temporaries */
    char what[16];
    snprintf(what, sizeof what, "%d", k);
    int rc = step(I, N, what, N->kind, (int[]){acc, N->in[k]}, 2, NULL, &acc);
    if (rc) return rc;
  }
  int op = new_op(I, N, N->kind, (int[]){acc, N->in[N->nin - 1]}, 2, 1);
  return finish_op(I, N, op);
}

static int import_gemm(Importer *I, Node *N) {
  int64_t ta, tb;
  double alpha, beta;
  if (attr_int(I, N, "transA", 0, &ta) || attr_int(I, N, "transB", 0, &tb) ||
      attr_float(I, N, "alpha", 1.0, &alpha) || attr_float(I, N, "beta", 1.0, &beta))
    return TP_ERR_INPUT;
  int op = new_op(I, N, TP_OP_Gemm, N->in, N->nin, 1);
  tp_set_attr_int(I->m, op, "transA", ta != 0);
  tp_set_attr_int(I->m, op, "transB", tb != 0);
  tp_set_attr_float(I->m, op, "alpha", alpha);
  tp_set_attr_float(I->m, op, "beta", beta);
  return finish_op(I, N, op);
}

/* ---- an embedding's padding row, from the export's node metadata ----
 * The torch.export-based exporter writes on every node metadata_props
 * `pkg.torch.onnx.fx_node`, the FX call it came from; for an embedding lookup
 *   %embedding : [num_users=3] = call_function[target=torch.ops.aten.embedding.default](args =
 *       (%p_embed_tokens_weight, %input_ids, 0), kwargs = {})
 * whose third argument is padding_idx. nn.Embedding has already made a negative one
 * count from the end, so at this level a negative one (aten's default, -1) means none,
 * as in aten's embedding_backward. */

/* The padding row of an embedding Gather of a table of `rows` rows into *row (-1: none). */
static int export_padding_idx(Importer *I, const Node *N, int64_t rows, int64_t *row) {
  *row = -1;
  const char *call = onnx_metadata(I, &N->n->base, true, "pkg.torch.onnx.fx_node"), *arg[5];
  if (!call || !strstr(call, "[target=torch.ops.aten.embedding.default]")) return TP_OK;
  /* the positional arguments: weight, indices, padding_idx, scale_grad_by_freq, sparse */
  int n = fx_call_args(I, call, arg, 5);
  char *end = NULL;
  long long pad = n > 2 ? strtoll(arg[2], &end, 10) : -1;
  if (n > 2 && (end == arg[2] || *end))
    return node_error(I, N, "the export's aten.embedding call has padding_idx '%s', not an integer", arg[2]);
  if (n > 3 && strcmp(arg[3], "False") != 0)
    return node_error(I, N, "the export's aten.embedding call has scale_grad_by_freq '%s', which is not supported",
                      arg[3]);
  if (rows >= 0 && pad >= rows)
    return node_error(I, N, "the export's aten.embedding padding_idx %lld is not a row of the table's %lld", pad,
                      (long long)rows);
  *row = pad < 0 ? -1 : pad;
  return TP_OK;
}

/* Gather and GatherElements (N->kind): the axis normalised to the data's rank; a Gather
 * on axis 0 gets the padding row its export's metadata names (export_padding_idx). */
static int import_gather(Importer *I, Node *N) {
  int64_t axis, padding_idx = -1;
  TpType data = type_of(I, N->in[0]);
  if (attr_int(I, N, "axis", 0, &axis) || norm_axis(I, N, "axis", axis, data.rank, &axis) ||
      (N->kind == TP_OP_Gather && axis == 0 && export_padding_idx(I, N, data.dims[0], &padding_idx)))
    return TP_ERR_INPUT;
  int op = new_op(I, N, N->kind, N->in, 2, 1);
  tp_set_attr_int(I->m, op, "axis", axis);
  if (padding_idx >= 0) tp_set_attr_int(I->m, op, "padding_idx", padding_idx);
  return finish_op(I, N, op);
}

/* GatherND(data, indices) {batch_dims b}: each tuple of k indices (indices' last axis)
 * picks data[batch..., i1, .., ik, :]. Lowered onto Gather: data's first b + k dims become
 * one axis, each tuple its row there (negative entries wrapped, the batch row's offset
 * added). Constant indices are checked here; at run time an entry out of its dim's range
 * becomes a row past the end, so Gather reports it (as that row) rather than read a
 * neighbouring slice. */
static int import_gathernd(Importer *I, Node *N) {
  TpType dt = type_of(I, N->in[0]), it = type_of(I, N->in[1]);
  int64_t b;
  int r = dt.rank, q = it.rank, rc;
  if ((rc = attr_int(I, N, "batch_dims", 0, &b))) return rc;
  if (it.dtype != TP_I64 && it.dtype != TP_I32)
    return node_error(I, N, "indices are %s, expected int64 or int32", tp_dtype_name(it.dtype));
  if (r < 1 || q < 1 || b < 0 || b >= (r < q ? r : q))
    return node_error(I, N, "batch_dims %lld must be below the ranks of data (%d) and indices (%d)", (long long)b, r,
                      q);
  int64_t k = it.dims[q - 1];
  if (k < 1 || k > r - b)
    return node_error(I, N, "index tuples have %lld entries; data has %lld dims after the batch dims", (long long)k,
                      (long long)(r - b));
  for (int i = 0; i < b; i++)
    if (it.dims[i] != dt.dims[i])
      return node_error(I, N, "batch dim %d is %lld in indices but %lld in data", i, (long long)it.dims[i],
                        (long long)dt.dims[i]);
  int64_t dims[TP_MAX_RANK], strides[TP_MAX_RANK], rows = 1, block = 1; /* over the k indexed dims */
  for (int j = (int)k - 1; j >= 0; j--) {
    dims[j] = dt.dims[b + j];
    strides[j] = block;
    block *= dims[j];
  }
  for (int i = 0; i < b + k; i++) rows *= dt.dims[i];
  if (I->m->values[N->in[1]].kind == TP_VAL_CONST) { /* known now: name the entry */
    TpTensor t = tp_value_tensor(I->m, N->in[1]);
    for (int64_t e = 0; e < tp_tensor_numel(&t); e++) {
      int64_t at = (int64_t)tp_tensor_get_f64(&t, e), size = dims[e % k];
      if (at < -size || at >= size)
        return node_error(I, N, "index %lld (entry %lld of tuple %lld) is out of range for dim %lld of size %lld",
                          (long long)at, (long long)(e % k), (long long)(e / k), (long long)(b + e % k),
                          (long long)size);
    }
  }
  int64_t kk = k, zero = 0;
  TpType vec = tp_type_make(TP_I64, 1, &kk), scalar = tp_type_make(TP_I64, 0, &kk);
  int idx = N->in[1], neg, wrapped, lo, hi, ok, at, lin;
  int c_dims = step_const(I, N, "dims", vec, dims), c_strides = step_const(I, N, "strides", vec, strides);
  int c_zero = step_const(I, N, "zero", scalar, &zero), c_past = step_const(I, N, "past_end", scalar, &rows);
  TpType i64 = it;
  i64.dtype = TP_I64;
  if (it.dtype != TP_I64 && (rc = step(I, N, "i64", TP_OP_Cast, &idx, 1, &i64, &idx))) return rc;
  if ((rc = step(I, N, "negative", TP_OP_Less, (int[]){idx, c_zero}, 2, NULL, &neg)) ||
      (rc = step(I, N, "from_end", TP_OP_Add, (int[]){idx, c_dims}, 2, NULL, &wrapped)) ||
      (rc = step(I, N, "wrapped", TP_OP_Where, (int[]){neg, wrapped, idx}, 3, NULL, &idx)) ||
      (rc = step(I, N, "not_below", TP_OP_GreaterOrEqual, (int[]){idx, c_zero}, 2, NULL, &lo)) ||
      (rc = step(I, N, "below_dim", TP_OP_Less, (int[]){idx, c_dims}, 2, NULL, &hi)) ||
      (rc = step(I, N, "in_range", TP_OP_And, (int[]){lo, hi}, 2, NULL, &ok)) ||
      (rc = step(I, N, "checked", TP_OP_Where, (int[]){ok, idx, c_past}, 3, NULL, &idx)) ||
      (rc = step(I, N, "strided", TP_OP_Mul, (int[]){idx, c_strides}, 2, NULL, &at)))
    return rc;
  int sum = step_op(I, N, "row", TP_OP_ReduceSum, &at, 1, NULL);
  tp_set_attr_ints(I->m, sum, "axes", (int64_t[]){q - 1}, 1);
  tp_set_attr_int(I->m, sum, "keepdims", 0);
  if ((rc = step_value(I, sum, &lin))) return rc;
  if (b > 0) { /* batch row n's tuples index rows n * block .. */
    TpType ot = tp_type_make(TP_I64, q - 1, it.dims);
    for (int i = (int)b; i < q - 1; i++) ot.dims[i] = 1;
    int64_t n = tp_type_numel(&ot);
    int64_t *offsets = malloc((size_t)n * sizeof *offsets + 1);
    TP_ASSERT(offsets);
    for (int64_t i = 0; i < n; i++) offsets[i] = i * block;
    int c_offsets = step_const(I, N, "batch_offsets", ot, offsets);
    free(offsets);
    if ((rc = step(I, N, "batch_row", TP_OP_Add, (int[]){lin, c_offsets}, 2, NULL, &lin))) return rc;
  }
  TpType flat = dt;
  flat.rank = r - (int)(b + k) + 1;
  flat.dims[0] = rows;
  for (int i = 1; i < flat.rank; i++) flat.dims[i] = dt.dims[b + k + i - 1];
  memset(flat.dimnames, 0, sizeof flat.dimnames);
  int data;
  if ((rc = step(I, N, "rows", TP_OP_Reshape, &N->in[0], 1, &flat, &data))) return rc;
  int op = new_op(I, N, TP_OP_Gather, (int[]){data, lin}, 2, 1);
  tp_set_attr_int(I->m, op, "axis", 0);
  return finish_op(I, N, op);
}

/* CumSum's axis operand (a constant scalar) becomes the attribute. */
static int import_cumsum(Importer *I, Node *N) {
  int64_t axes[TP_MAX_CONST_INTS], axis, exclusive, reverse;
  int n, rc;
  if ((rc = const_ints(I, N, 1, "axis", axes, &n))) return rc;
  if (n != 1) return node_error(I, N, "operand 'axis' must hold one integer, not %d", n);
  if (norm_axis(I, N, "axis", axes[0], type_of(I, N->in[0]).rank, &axis) ||
      attr_int(I, N, "exclusive", 0, &exclusive) || attr_int(I, N, "reverse", 0, &reverse))
    return TP_ERR_INPUT;
  int op = new_op(I, N, TP_OP_CumSum, N->in, 1, 1);
  tp_set_attr_int(I->m, op, "axis", axis);
  tp_set_attr_int(I->m, op, "exclusive", exclusive != 0);
  tp_set_attr_int(I->m, op, "reverse", reverse != 0);
  return finish_op(I, N, op);
}

/* TopK(X, K) {axis, largest, sorted} -> Values, Indices: the indices by TopK (largest first,
 * ties by lower index: ONNX's order, which sorted = 0 allows too), the values GatherElements
 * of X by them, so a gradient reaches the selected entries alone. */
static int import_topk(Importer *I, Node *N) {
  int64_t ks[TP_MAX_CONST_INTS], axis, largest;
  int n, rc;
  TpType xt = type_of(I, N->in[0]);
  if ((rc = const_ints(I, N, 1, "K", ks, &n))) return rc;
  if (n != 1) return node_error(I, N, "operand 'K' must hold one integer, not %d", n);
  if (attr_int(I, N, "axis", -1, &axis) || norm_axis(I, N, "axis", axis, xt.rank, &axis) ||
      attr_int(I, N, "largest", 1, &largest))
    return TP_ERR_INPUT;
  if (!largest) return node_error(I, N, "largest = 0 (the k smallest entries) is not supported");
  if (ks[0] < 1 || ks[0] > xt.dims[axis])
    return node_error(I, N, "K = %lld is out of range for %lld entries on axis %lld", (long long)ks[0],
                      (long long)xt.dims[axis], (long long)axis);
  bool named = N->nout > 1 && *N->n->output[1];
  int top = named ? step_named(I, N, N->n->output[1], TP_OP_TopK, N->in, 1, NULL)
                  : step_op(I, N, "indices", TP_OP_TopK, N->in, 1, NULL);
  tp_set_attr_int(I->m, top, "axis", axis);
  tp_set_attr_int(I->m, top, "k", ks[0]);
  int idx;
  if ((rc = step_value(I, top, &idx))) return rc;
  bind_output(I, N, 1, idx);
  int op = new_op(I, N, TP_OP_GatherElements, (int[]){N->in[0], idx}, 2, 1);
  tp_set_attr_int(I->m, op, "axis", axis);
  return finish_op(I, N, op);
}

/* ---- shape ops ---- */

static int import_tile(Importer *I, Node *N) {
  int64_t repeats[TP_MAX_CONST_INTS];
  int n, rc;
  if ((rc = const_ints(I, N, 1, "repeats", repeats, &n))) return rc;
  int op = new_op(I, N, TP_OP_Tile, N->in, 1, 1);
  tp_set_attr_ints(I->m, op, "repeats", repeats, n);
  return finish_op(I, N, op); /* type inference checks the repeats and the result's size */
}

static int import_reshape(Importer *I, Node *N) {
  TpType in = type_of(I, N->in[0]), out = in;
  int64_t shape[TP_MAX_CONST_INTS], allowzero = 0;
  int n, infer = -1, rc;
  if ((rc = const_ints(I, N, 1, "shape", shape, &n))) return rc;
  if (N->since >= 14 && (rc = attr_int(I, N, "allowzero", 0, &allowzero))) return rc;
  if (n > TP_MAX_RANK) return node_error(I, N, "shape has %d dims; tokpipec supports rank <= %d", n, TP_MAX_RANK);
  int64_t known = 1;
  for (int i = 0; i < n; i++) {
    int64_t s = shape[i];
    if (s == 0 && !allowzero) {
      if (i >= in.rank) return node_error(I, N, "shape dim %d is 0 (copy) but the input has rank %d", i, in.rank);
      s = in.dims[i];
    }
    if (s == -1) {
      if (infer >= 0) return node_error(I, N, "shape has more than one -1");
      infer = i;
      continue;
    }
    if (s < 0) return node_error(I, N, "shape has negative dim %lld", (long long)s);
    if (s && known > INT64_MAX / 16 / s) return node_error(I, N, "shape is too large");
    known *= s;
    out.dims[i] = s;
  }
  int64_t numel = tp_type_numel(&in);
  if (infer >= 0) {
    if (known == 0 || numel % known)
      return node_error(I, N, "cannot infer the -1 dim: %lld elements into blocks of %lld", (long long)numel,
                        (long long)known);
    out.dims[infer] = numel / known;
    known = numel;
  }
  if (known != numel)
    return node_error(I, N, "cannot reshape %lld elements into %lld", (long long)numel, (long long)known);
  out.rank = n;
  if (!tp_type_size_ok(&out)) return node_error(I, N, "shape is too large"); /* an empty one's dims too */
  memset(out.dimnames, 0, sizeof out.dimnames);
  return emit_reshape(I, N, N->in[0], out);
}

static int import_unsqueeze(Importer *I, Node *N) {
  TpType in = type_of(I, N->in[0]), out = in;
  int64_t axes[TP_MAX_CONST_INTS];
  int n, rc;
  if ((rc = const_ints(I, N, 1, "axes", axes, &n))) return rc;
  if (in.rank + n > TP_MAX_RANK) return node_error(I, N, "result rank %d exceeds %d", in.rank + n, TP_MAX_RANK);
  out.rank = in.rank + n;
  if ((rc = norm_axes(I, N, axes, n, out.rank))) return rc;
  memset(out.dimnames, 0, sizeof out.dimnames);
  for (int i = 0, j = 0, a = 0; i < out.rank; i++) {
    if (a < n && axes[a] == i) {
      out.dims[i] = 1;
      a++;
    } else {
      out.dimnames[i] = in.dimnames[j];
      out.dims[i] = in.dims[j++];
    }
  }
  return emit_reshape(I, N, N->in[0], out);
}

static int import_squeeze(Importer *I, Node *N) {
  TpType in = type_of(I, N->in[0]), out = in;
  int64_t axes[TP_MAX_CONST_INTS];
  int n = 0, rc;
  if (N->nin > 1 && N->in[1] >= 0 && (rc = const_ints(I, N, 1, "axes", axes, &n))) return rc;
  if (n == 0) /* all size-1 dims */
    for (int i = 0; i < in.rank; i++)
      if (in.dims[i] == 1) axes[n++] = i;
  if ((rc = norm_axes(I, N, axes, n, in.rank))) return rc;
  out.rank = 0;
  for (int i = 0, a = 0; i < in.rank; i++) {
    if (a < n && axes[a] == i) {
      if (in.dims[i] != 1) return node_error(I, N, "cannot squeeze dim %d of size %lld", i, (long long)in.dims[i]);
      a++;
      continue;
    }
    out.dimnames[out.rank] = in.dimnames[i];
    out.dims[out.rank++] = in.dims[i];
  }
  for (int i = out.rank; i < TP_MAX_RANK; i++) out.dimnames[i] = NULL;
  return emit_reshape(I, N, N->in[0], out);
}

static int import_flatten(Importer *I, Node *N) {
  TpType in = type_of(I, N->in[0]), out = in;
  int64_t axis;
  if (attr_int(I, N, "axis", 1, &axis)) return TP_ERR_INPUT;
  if (axis < -in.rank || axis > in.rank)
    return node_error(I, N, "axis %lld is out of range for rank %d", (long long)axis, in.rank);
  if (axis < 0) axis += in.rank;
  out.rank = 2;
  out.dims[0] = tp_numel((int)axis, in.dims);
  out.dims[1] = tp_numel(in.rank - (int)axis, in.dims + axis);
  memset(out.dimnames, 0, sizeof out.dimnames);
  return emit_reshape(I, N, N->in[0], out);
}

static int import_expand(Importer *I, Node *N) {
  TpType in = type_of(I, N->in[0]), shape = {0}, out;
  int rc = const_shape(I, N, 1, "shape", shape.dims, &shape.rank);
  if (rc) return rc;
  /* numpy broadcast; a 1 in the shape operand keeps the input's dim */
  out = in;
  out.rank = in.rank > shape.rank ? in.rank : shape.rank;
  memset(out.dimnames, 0, sizeof out.dimnames);
  for (int i = 0; i < out.rank; i++) {
    int ia = in.rank - out.rank + i, ib = shape.rank - out.rank + i;
    int64_t a = ia >= 0 ? in.dims[ia] : 1, b = ib >= 0 ? shape.dims[ib] : 1;
    if (a != b && a != 1 && b != 1)
      return node_error(I, N, "cannot expand dim %lld to %lld", (long long)a, (long long)b);
    out.dims[i] = a == 1 ? b : a;
    if (out.dims[i] && tp_numel(i, out.dims) > INT64_MAX / 16 / out.dims[i])
      return node_error(I, N, "the expanded tensor is too large");
    if (ia >= 0 && out.dims[i] == a) out.dimnames[i] = in.dimnames[ia];
  }
  int op = new_op(I, N, TP_OP_Expand, N->in, 1, 1);
  set_result_type(I, op, 0, out);
  return finish_op(I, N, op);
}

static int import_transpose(Importer *I, Node *N) {
  int rank = type_of(I, N->in[0]).rank, n;
  int64_t perm[TP_MAX_CONST_INTS];
  if (attr_ints(I, N, "perm", perm, &n)) return TP_ERR_INPUT;
  if (n < 0) { /* default: reverse */
    n = rank;
    for (int i = 0; i < rank; i++) perm[i] = rank - 1 - i;
  }
  if (n != rank) return node_error(I, N, "perm has %d entries for rank %d", n, rank);
  unsigned seen = 0;
  for (int i = 0; i < n; i++) {
    if (perm[i] < 0 || perm[i] >= rank || (seen >> perm[i] & 1))
      return node_error(I, N, "perm is not a permutation of 0..%d", rank - 1);
    seen |= 1u << perm[i];
  }
  int op = new_op(I, N, TP_OP_Transpose, N->in, 1, 1);
  tp_set_attr_ints(I->m, op, "perm", perm, n);
  return finish_op(I, N, op);
}

/* A Split of the node's first operand along axis into n results of the sizes, named. */
static int split_op(Importer *I, const Node *N, const char *const *names, const int64_t *sizes, int n,
                    int64_t axis) {
  TpType in = type_of(I, N->in[0]);
  int op = tp_add_op(I->m, TP_OP_Split, N->in, 1, names, n, N->at);
  tp_set_attr_int(I->m, op, "axis", axis);
  for (int k = 0; k < n; k++) {
    TpType t = in;
    t.dims[axis] = sizes[k];
    t.dimnames[axis] = NULL;
    set_result_type(I, op, k, t);
  }
  return op;
}

static int import_split(Importer *I, Node *N) {
  TpType in = type_of(I, N->in[0]);
  int64_t axis, sizes[TP_MAX_CONST_INTS], num;
  int n = 0, nout = (int)N->n->n_output, rc;
  if ((rc = attr_int(I, N, "axis", 0, &axis)) || (rc = norm_axis(I, N, "axis", axis, in.rank, &axis))) return rc;
  int64_t dim = in.dims[axis];
  if ((rc = attr_int(I, N, "num_outputs", -1, &num))) return rc;
  if (N->nin > 1) {
    if (num >= 0) return node_error(I, N, "has both 'split' and 'num_outputs'");
    if ((rc = const_ints(I, N, 1, "split", sizes, &n))) return rc;
    if (n != nout) return node_error(I, N, "'split' has %d sizes for %d outputs", n, nout);
  } else if (N->since >= 18 && num >= 0) { /* ceil(dim / num) each, the last one smaller */
    if (num != nout)
      return node_error(I, N, "num_outputs is %lld but the node has %d outputs", (long long)num, nout);
    int64_t chunk = (dim + num - 1) / num;
    for (n = 0; n < nout; n++) sizes[n] = n < nout - 1 ? chunk : dim - chunk * (nout - 1);
  } else {
    if (dim % nout) return node_error(I, N, "cannot split dim %lld into %d equal parts", (long long)dim, nout);
    for (n = 0; n < nout; n++) sizes[n] = dim / nout;
  }
  int64_t total = 0;
  for (int k = 0; k < n; k++) {
    if (sizes[k] < 0 || sizes[k] > dim - total)
      return node_error(I, N, "split sizes do not add up to dim %lld (%lld)", (long long)axis, (long long)dim);
    total += sizes[k];
  }
  if (total != dim)
    return node_error(I, N, "split sizes add up to %lld, dim %lld is %lld", (long long)total, (long long)axis,
                      (long long)dim);
  /* every result carries its size, so unnamed outputs get names */
  const char *names[TP_MAX_CONST_INTS];
  for (int k = 0; k < nout; k++) {
    if (*N->n->output[k]) {
      names[k] = N->n->output[k];
    } else {
      char buf[160];
      snprintf(buf, sizeof buf, "%.100s.unused%d", N->at.node, k);
      names[k] = tp_unique_name(I->m, buf);
    }
  }
  int op = split_op(I, N, names, sizes, nout, axis);
  N->nout = nout;
  return finish_op(I, N, op);
}

static int64_t clamp(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

static int import_slice(Importer *I, Node *N) {
  TpType in = type_of(I, N->in[0]), out = in;
  int64_t starts[TP_MAX_CONST_INTS], ends[TP_MAX_CONST_INTS], axes[TP_MAX_CONST_INTS], steps[TP_MAX_CONST_INTS];
  int n, ne, na, ns, rc;
  if ((rc = const_ints(I, N, 1, "starts", starts, &n)) || (rc = const_ints(I, N, 2, "ends", ends, &ne))) return rc;
  if (ne != n) return node_error(I, N, "'starts' has %d values, 'ends' %d", n, ne);
  na = ns = n;
  for (int i = 0; i < n; i++) axes[i] = i, steps[i] = 1;
  if (N->nin > 3 && N->in[3] >= 0 && (rc = const_ints(I, N, 3, "axes", axes, &na))) return rc;
  if (N->nin > 4 && N->in[4] >= 0 && (rc = const_ints(I, N, 4, "steps", steps, &ns))) return rc;
  if (na != n || ns != n) return node_error(I, N, "'starts', 'axes' and 'steps' differ in length");
  int64_t full_starts[TP_MAX_RANK], full_steps[TP_MAX_RANK];
  unsigned seen = 0;
  for (int d = 0; d < in.rank; d++) full_starts[d] = 0, full_steps[d] = 1;
  for (int i = 0; i < n; i++) {
    int64_t a, dim, s = starts[i], e = ends[i], st = steps[i], len;
    if ((rc = norm_axis(I, N, "axis", axes[i], in.rank, &a))) return rc;
    if (seen >> a & 1) return node_error(I, N, "axis %lld is repeated", (long long)a);
    seen |= 1u << a;
    if (st == 0) return node_error(I, N, "step is 0");
    dim = in.dims[a];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    if (st > 0) {
      s = clamp(s, 0, dim);
      e = clamp(e, 0, dim);
      len = e > s ? (e - s - 1) / st + 1 : 0;
    } else {
      int64_t mag = st == INT64_MIN ? INT64_MAX : -st;
      s = clamp(s, 0, dim - 1);
      e = clamp(e, -1, dim - 1);
      len = dim > 0 && s > e ? (s - e - 1) / mag + 1 : 0; /* clamping made s 0 on an empty dim */
    }
    full_starts[a] = len ? s : 0;
    full_steps[a] = st;
    out.dims[a] = len;
    if (len != dim) out.dimnames[a] = NULL;
  }
  int op = new_op(I, N, TP_OP_Slice, N->in, 1, 1);
  tp_set_attr_ints(I->m, op, "starts", full_starts, in.rank);
  tp_set_attr_ints(I->m, op, "steps", full_steps, in.rank);
  set_result_type(I, op, 0, out);
  return finish_op(I, N, op);
}

static int import_concat(Importer *I, Node *N) {
  int64_t axis;
  for (int k = 0; k < N->nin; k++)
    if (N->in[k] < 0) return node_error(I, N, "input %d is missing", k);
  if (attr_int(I, N, "axis", 0, &axis) || norm_axis(I, N, "axis", axis, type_of(I, N->in[0]).rank, &axis))
    return TP_ERR_INPUT;
  int op = new_op(I, N, TP_OP_Concat, N->in, N->nin, 1);
  tp_set_attr_int(I->m, op, "axis", axis);
  return finish_op(I, N, op);
}

/* Value v (the node's first operand, or a step's result) cast to `t` as the node's result. */
static int cast_to_type(Importer *I, Node *N, int v, TpType t) {
  int op = new_op(I, N, TP_OP_Cast, &v, 1, 1);
  set_result_type(I, op, 0, t);
  return finish_op(I, N, op);
}

static int cast_to(Importer *I, Node *N, TpDType dtype) {
  TpType t = type_of(I, N->in[0]);
  t.dtype = dtype;
  return cast_to_type(I, N, N->in[0], t);
}

static int import_cast(Importer *I, Node *N) {
  int64_t to;
  if (attr_int(I, N, "to", 0, &to)) return TP_ERR_INPUT;
  if (!node_attr(N, "to")) return node_error(I, N, "attribute 'to' is missing");
  TpDType dtype = tp_onnx_dtype(to);
  if (dtype == TP_UNDEF) return node_error(I, N, "cannot cast to unsupported element type %lld", (long long)to);
  return cast_to(I, N, dtype);
}

/* CastLike: Cast to the element type of the second operand (only its type is read). */
static int import_castlike(Importer *I, Node *N) { return cast_to(I, N, type_of(I, N->in[1]).dtype); }

/* ---- ops that become constants or aliases ---- */

static int import_shape(Importer *I, Node *N) {
  TpType in = type_of(I, N->in[0]);
  int64_t start = 0, end = in.rank;
  if (N->since >= 15 && (attr_int(I, N, "start", 0, &start) || attr_int(I, N, "end", in.rank, &end)))
    return TP_ERR_INPUT;
  if (start < 0) start += in.rank;
  if (end < 0) end += in.rank;
  start = clamp(start, 0, in.rank);
  end = clamp(end, 0, in.rank);
  int64_t n = end > start ? end - start : 0;
  TpType t = tp_type_make(TP_I64, 1, &n);
  return add_output_const(I, N, 0, t, in.dims + start);
}

/* A scalar integer tensor (i16, i32, i64) as int64. */
static int64_t elem_i64(const TpTensor *t) {
  int64_t v64 = 0;
  int32_t v32 = 0;
  int16_t v16 = 0;
  switch (t->dtype) {
  case TP_I64: memcpy(&v64, t->data, 8); return v64;
  case TP_I32: memcpy(&v32, t->data, 4); return v32;
  default: memcpy(&v16, t->data, 2); return v16;
  }
}

/* SplitToSequence(input, split?) {axis, keepdims}: a Split whose results are the sequence's
 * elements (sizes 1, squeezed unless keepdims; or chunks of a scalar split, the last
 * smaller; or the sizes of a 1-D one). Only SequenceAt reads a sequence here (the exporter
 * without its optimizer splits so); the node's output name stands for the first element. */
static int import_split_to_sequence(Importer *I, Node *N) {
  TpType in = type_of(I, N->in[0]);
  int64_t axis, keepdims, sizes[TP_MAX_CONST_INTS], split[TP_MAX_CONST_INTS];
  int n = 0, rc;
  if ((rc = attr_int(I, N, "axis", 0, &axis)) || (rc = attr_int(I, N, "keepdims", 1, &keepdims)) ||
      (rc = norm_axis(I, N, "axis", axis, in.rank, &axis)))
    return rc;
  int64_t dim = in.dims[axis], total = 0;
  bool squeeze = N->nin < 2 && !keepdims;
  if (N->nin < 2) { /* one element per index */
    if (dim > TP_MAX_CONST_INTS)
      return node_error(I, N, "splits dim %lld into more than %d tensors", (long long)dim, TP_MAX_CONST_INTS);
    for (n = 0; n < dim; n++) sizes[n] = 1;
  } else if ((rc = const_ints(I, N, 1, "split", split, &n))) {
    return rc;
  } else if (type_of(I, N->in[1]).rank == 0) { /* chunks of split[0] */
    if (split[0] < 1) return node_error(I, N, "split %lld is not positive", (long long)split[0]);
    if ((dim + split[0] - 1) / split[0] > TP_MAX_CONST_INTS)
      return node_error(I, N, "splits dim %lld into more than %d tensors", (long long)dim, TP_MAX_CONST_INTS);
    for (n = 0; total < dim; n++) total += sizes[n] = dim - total < split[0] ? dim - total : split[0];
  } else {
    for (int k = 0; k < n; k++) {
      if (split[k] < 0 || split[k] > dim - total)
        return node_error(I, N, "split sizes do not add up to dim %lld (%lld)", (long long)axis, (long long)dim);
      total += sizes[k] = split[k];
    }
    if (total != dim)
      return node_error(I, N, "split sizes add up to %lld, dim %lld is %lld", (long long)total, (long long)axis,
                        (long long)dim);
  }
  if (n < 1) return node_error(I, N, "makes an empty sequence");
  const char *names[TP_MAX_CONST_INTS];
  for (int k = 0; k < n; k++) names[k] = tp_strfmt(I->m, "%.200s.%d", N->n->output[0], k);
  int op = split_op(I, N, names, sizes, n, axis);
  bool folded;
  if ((rc = tp_infer_op(I->m, op, I->d)) || (rc = tp_fold_op(I->m, op, &folded, I->d))) return rc;
  Sequence *seq = tp_alloc(I->m, sizeof *seq);
  seq->name = tp_strdup(I->m, N->n->output[0]);
  seq->n = n;
  seq->values = tp_alloc(I->m, (size_t)n * sizeof *seq->values);
  for (int k = 0; k < n; k++) {
    seq->values[k] = I->m->ops[op].outputs[k];
    if (!squeeze) continue;
    TpType t = in; /* the axis dropped */
    t.rank--;
    memmove(t.dims + axis, t.dims + axis + 1, (size_t)(t.rank - axis) * sizeof t.dims[0]);
    memmove(t.dimnames + axis, t.dimnames + axis + 1, (size_t)(t.rank - axis) * sizeof t.dimnames[0]);
    t.dimnames[t.rank] = NULL;
    char what[32];
    snprintf(what, sizeof what, "%d.squeezed", k);
    if ((rc = step(I, N, what, TP_OP_Reshape, &seq->values[k], 1, &t, &seq->values[k]))) return rc;
  }
  seq->next = I->sequences;
  I->sequences = seq;
  bind_output(I, N, 0, seq->values[0]);
  return TP_OK;
}

/* SequenceAt(sequence, position): the element itself (a negative position counts from the
 * end). */
static int import_sequence_at(Importer *I, Node *N) {
  const Sequence *seq = I->sequences;
  while (seq && strcmp(seq->name, N->n->input[0]) != 0) seq = seq->next;
  if (!seq)
    return node_error(I, N, "input '%s' is not a sequence made by SplitToSequence, the one tokpipec reads",
                      N->n->input[0]);
  TpTensor t;
  int rc = const_operand(I, N, 1, "position", &t);
  if (rc) return rc;
  if ((t.dtype != TP_I64 && t.dtype != TP_I32) || tp_tensor_numel(&t) != 1)
    return node_error(I, N, "position must be an int32 or int64 scalar");
  int64_t at = elem_i64(&t);
  if (at < -seq->n || at >= seq->n)
    return node_error(I, N, "position %lld is outside the sequence of %d tensors", (long long)at, seq->n);
  bind_output(I, N, 0, seq->values[at < 0 ? at + seq->n : at]);
  return TP_OK;
}

static int import_range(Importer *I, Node *N) {
  TpTensor start, limit, delta;
  int rc;
  if ((rc = const_operand(I, N, 0, "start", &start)) || (rc = const_operand(I, N, 1, "limit", &limit)) ||
      (rc = const_operand(I, N, 2, "delta", &delta)))
    return rc;
  TpDType dt = start.dtype;
  if (limit.dtype != dt || delta.dtype != dt)
    return node_error(I, N, "start, limit and delta differ in element type");
  if (dt != TP_F32 && dt != TP_F64 && dt != TP_I16 && dt != TP_I32 && dt != TP_I64)
    return node_error(I, N, "element type %s is not supported", tp_dtype_name(dt));
  if (tp_tensor_numel(&start) != 1 || tp_tensor_numel(&limit) != 1 || tp_tensor_numel(&delta) != 1)
    return node_error(I, N, "start, limit and delta must be scalars");
  int64_t n;
  TpType t;
  void *data;
  if (dt == TP_I64 || dt == TP_I32 || dt == TP_I16) { /* exact integer arithmetic */
    int64_t s = elem_i64(&start), l = elem_i64(&limit), d = elem_i64(&delta);
    if (d == 0) return node_error(I, N, "delta is 0");
    __int128 diff = (__int128)l - s, mag = d > 0 ? d : -(__int128)d, count = 0;
    if ((diff > 0) == (d > 0) && diff != 0) count = ((diff > 0 ? diff : -diff) - 1) / mag + 1;
    n = count > ((__int128)1 << 40) ? (int64_t)1 << 40 : (int64_t)count; /* too large: rejected below */
    t = tp_type_make(dt, 1, &n);
    if ((rc = check_const_size(I, N, &t))) return rc;
    data = malloc((size_t)n * tp_dtype_size(dt) + 1);
    TP_ASSERT(data);
    for (int64_t i = 0; i < n; i++) {
      int64_t x = (int64_t)((uint64_t)s + (uint64_t)i * (uint64_t)d); /* wraps like the dtype */
      if (dt == TP_I64) ((int64_t *)data)[i] = x;
      else if (dt == TP_I32) ((int32_t *)data)[i] = (int32_t)x;
      else ((int16_t *)data)[i] = (int16_t)x;
    }
  } else {
    double s = tp_tensor_get_f64(&start, 0), l = tp_tensor_get_f64(&limit, 0), d = tp_tensor_get_f64(&delta, 0);
    if (d == 0 || !isfinite(s) || !isfinite(l) || !isfinite(d))
      return node_error(I, N, "start, limit and delta must be finite and delta non-zero");
    double span = ceil((l - s) / d);
    if (span > 1e12) span = 1e12; /* rejected by the size check below */
    n = span > 0 ? (int64_t)span : 0;
    t = tp_type_make(dt, 1, &n);
    if ((rc = check_const_size(I, N, &t))) return rc;
    data = malloc((size_t)n * tp_dtype_size(dt) + 1);
    TP_ASSERT(data);
    for (int64_t i = 0; i < n; i++) {
      if (dt == TP_F32) ((float *)data)[i] = (float)(s + (double)i * d);
      else ((double *)data)[i] = s + (double)i * d;
    }
  }
  rc = add_output_const(I, N, 0, t, data);
  free(data);
  return rc;
}

static int import_constant_of_shape(Importer *I, Node *N) {
  TpType t = {0};
  int rc = const_shape(I, N, 0, "input", t.dims, &t.rank);
  if (rc) return rc;
  uint8_t value[8] = {0};
  t.dtype = TP_F32;
  const Onnx__AttributeProto *a = node_attr(N, "value");
  if (a) {
    if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR || !a->t)
      return node_error(I, N, "attribute 'value' must be a tensor");
    TpType vt;
    void *data;
    if ((rc = read_small_tensor(I, N, a->t, "attribute 'value'", &vt, &data))) return rc;
    if (tp_type_numel(&vt) != 1) {
      free(data);
      return node_error(I, N, "attribute 'value' must hold one element");
    }
    t.dtype = vt.dtype;
    memcpy(value, data, tp_dtype_size(vt.dtype));
    free(data);
  }
  if ((rc = check_const_size(I, N, &t))) return rc;
  size_t esize = tp_dtype_size(t.dtype);
  int64_t numel = tp_type_numel(&t);
  uint8_t *data = malloc((size_t)numel * esize + 1);
  TP_ASSERT(data);
  for (int64_t i = 0; i < numel; i++) memcpy(data + i * (int64_t)esize, value, esize);
  rc = add_output_const(I, N, 0, t, data);
  free(data);
  return rc;
}

/* Identity passes its operand through, except a parameter's: an exporter that merged equal
 * initializers (fresh LayerNorm weights of every layer) reconnects each one through an
 * Identity whose output carries that parameter's own name. It becomes a PARAM of its own
 * over the same bytes, with origin (source initializer, "Identity") (see TpValue.origin). */
static int import_identity(Importer *I, Node *N) {
  TpValue src = I->m->values[N->in[0]];
  if (src.kind != TP_VAL_PARAM) {
    bind_output(I, N, 0, N->in[0]);
    return TP_OK;
  }
  bool alias = src.origin.op_type && strcmp(src.origin.op_type, "Identity") == 0;
  TpOrigin from = {alias ? src.origin.node : src.name, "Identity"};
  int v = tp_add_data_value(I->m, tp_unique_name(I->m, N->n->output[0]), TP_VAL_PARAM, src.type, src.blob,
                            src.offset, from);
  bind_output(I, N, 0, v);
  return TP_OK;
}

/* Inference Dropout: the input passes through; the mask is all true. */
static int import_dropout(Importer *I, Node *N) {
  if (N->nin > 2 && N->in[2] >= 0) {
    TpTensor mode;
    int rc = const_operand(I, N, 2, "training_mode", &mode);
    if (rc) return rc;
    if (mode.dtype != TP_BOOL || tp_tensor_numel(&mode) != 1)
      return node_error(I, N, "training_mode must be a boolean scalar");
    if (*(const uint8_t *)mode.data) { /* training with ratio 0 is inference too */
      TpTensor ratio;
      bool zero = N->in[1] >= 0 && const_operand(I, N, 1, "ratio", &ratio) == TP_OK &&
                  tp_tensor_numel(&ratio) == 1 && tp_dtype_is_float(ratio.dtype) &&
                  tp_tensor_get_f64(&ratio, 0) == 0;
      if (!zero) return node_error(I, N, "training_mode is true; tokpipec imports Dropout for inference only");
    }
  }
  bind_output(I, N, 0, N->in[0]);
  if (N->nout > 1 && *N->n->output[1]) {
    TpType t = type_of(I, N->in[0]);
    t.dtype = TP_BOOL;
    int rc = check_const_size(I, N, &t);
    if (rc) return rc;
    void *ones = malloc((size_t)tp_type_numel(&t) + 1);
    TP_ASSERT(ones);
    memset(ones, 1, (size_t)tp_type_numel(&t));
    rc = add_output_const(I, N, 1, t, ones);
    free(ones);
    return rc;
  }
  return TP_OK;
}

static int import_constant(Importer *I, Node *N) {
  const Onnx__AttributeProto *a = N->n->n_attribute == 1 ? N->n->attribute[0] : NULL;
  if (!a || !a->name) return node_error(I, N, "needs exactly one attribute");
  const char *name = N->n->output[0];
  TpType t = {0};
  int64_t n;
  if (strcmp(a->name, "value") == 0 && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR && a->t) {
    int v, rc = import_tensor_value(I, a->t, tp_unique_name(I->m, name), TP_VAL_CONST, N->at, -1, &v);
    if (rc) return rc;
    bind_output(I, N, 0, v);
    return TP_OK;
  }
  if (strcmp(a->name, "value_float") == 0 && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT) {
    t.dtype = TP_F32;
    return add_output_const(I, N, 0, t, &a->f);
  }
  if (strcmp(a->name, "value_int") == 0 && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT) {
    t.dtype = TP_I64;
    return add_output_const(I, N, 0, t, &a->i);
  }
  if (strcmp(a->name, "value_floats") == 0 && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS) {
    n = (int64_t)a->n_floats;
    t = tp_type_make(TP_F32, 1, &n);
    return add_output_const(I, N, 0, t, n ? (const void *)a->floats : "");
  }
  if (strcmp(a->name, "value_ints") == 0 && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS) {
    n = (int64_t)a->n_ints;
    t = tp_type_make(TP_I64, 1, &n);
    return add_output_const(I, N, 0, t, n ? (const void *)a->ints : "");
  }
  return node_error(I, N, "a constant given as '%s' (%s) is not supported", a->name,
                    a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSOR ? "sparse tensor"
                                                                                    : "this attribute type");
}

/* ---- normalisation, reductions, attention, losses ---- */

static int import_softmax(Importer *I, Node *N) {
  int64_t axis;
  if (attr_int(I, N, "axis", -1, &axis) || norm_axis(I, N, "axis", axis, type_of(I, N->in[0]).rank, &axis))
    return TP_ERR_INPUT;
  int op = new_op(I, N, N->kind, N->in, 1, 1);
  tp_set_attr_int(I->m, op, "axis", axis);
  return finish_op(I, N, op);
}

/* ReduceMean (axes attribute before opset 18) and ReduceSum (axes input from 13). */
static int import_reduce(Importer *I, Node *N) {
  int rank = type_of(I, N->in[0]).rank, n = -1, rc;
  int64_t axes[TP_MAX_CONST_INTS], keepdims, noop = 0;
  bool axes_input = N->kind == TP_OP_ReduceSum || N->since >= 18;
  if ((rc = attr_int(I, N, "keepdims", 1, &keepdims))) return rc;
  if (axes_input) {
    if ((rc = attr_int(I, N, "noop_with_empty_axes", 0, &noop))) return rc;
    if (N->nin > 1 && (rc = const_ints(I, N, 1, "axes", axes, &n))) return rc;
  } else if ((rc = attr_ints(I, N, "axes", axes, &n))) {
    return rc;
  }
  if (n <= 0) {
    if (noop || rank == 0) { /* nothing to reduce */
      bind_output(I, N, 0, N->in[0]);
      return TP_OK;
    }
    for (n = 0; n < rank; n++) axes[n] = n;
  }
  if ((rc = norm_axes(I, N, axes, n, rank))) return rc;
  int op = new_op(I, N, N->kind, N->in, 1, 1);
  tp_set_attr_ints(I->m, op, "axes", axes, n);
  tp_set_attr_int(I->m, op, "keepdims", keepdims != 0);
  return finish_op(I, N, op);
}

static int import_layernorm(Importer *I, Node *N) {
  int64_t axis;
  double eps;
  if (attr_int(I, N, "axis", -1, &axis) || attr_float(I, N, "epsilon", 1e-5, &eps) ||
      norm_axis(I, N, "axis", axis, type_of(I, N->in[0]).rank, &axis))
    return TP_ERR_INPUT;
  int op = new_op(I, N, TP_OP_LayerNorm, N->in, N->nin, N->nout);
  tp_set_attr_int(I->m, op, "axis", axis);
  tp_set_attr_float(I->m, op, "epsilon", eps);
  return finish_op(I, N, op);
}

/* RMSNormalization(X, scale) {axis, epsilon, stash_type} onto RMSNorm, which computes in
 * f32 (stash_type 1): the scale is reshaped or expanded to the normalised shape X[axis:],
 * and other float types are cast to f32 and back. */
static int import_rms_normalization(Importer *I, Node *N) {
  TpType xt = type_of(I, N->in[0]), st = type_of(I, N->in[1]);
  int64_t axis, stash;
  double eps;
  int rc;
  if ((rc = attr_int(I, N, "axis", -1, &axis)) || (rc = attr_float(I, N, "epsilon", 1e-5, &eps)) ||
      (rc = attr_int(I, N, "stash_type", 1, &stash)) || (rc = norm_axis(I, N, "axis", axis, xt.rank, &axis)))
    return rc;
  if (stash != 1)
    return node_error(I, N, "stash_type %lld is not supported: tokpipec computes RMSNormalization in float (1)",
                      (long long)stash);
  if (!tp_dtype_is_float(xt.dtype) || !tp_dtype_is_float(st.dtype))
    return node_error(I, N, "X and scale must be floats, not %s and %s", tp_dtype_name(xt.dtype),
                      tp_dtype_name(st.dtype));
  TpType norm = xt; /* X[axis:] in f32 */
  norm.dtype = TP_F32;
  norm.rank = xt.rank - (int)axis;
  memmove(norm.dims, xt.dims + axis, (size_t)norm.rank * sizeof norm.dims[0]);
  memset(norm.dimnames, 0, sizeof norm.dimnames);
  TpType aligned = norm; /* the scale's dims right-aligned to the normalised ones */
  for (int i = 0; i < st.rank; i++) {
    int j = i - (st.rank - norm.rank);
    if (j < 0 ? st.dims[i] != 1 : st.dims[i] != 1 && st.dims[i] != norm.dims[j])
      return node_error(I, N, "scale's shape does not broadcast to the normalised shape X[%lld:]", (long long)axis);
  }
  for (int j = 0; j < norm.rank; j++) {
    int i = j + (st.rank - norm.rank);
    aligned.dims[j] = i >= 0 ? st.dims[i] : 1;
  }
  int x = N->in[0], scale = N->in[1], y;
  TpType x32 = xt;
  x32.dtype = TP_F32;
  if (xt.dtype != TP_F32 && (rc = step(I, N, "x_f32", TP_OP_Cast, &x, 1, &x32, &x))) return rc;
  TpType s32 = st;
  s32.dtype = TP_F32;
  if (st.dtype != TP_F32 && (rc = step(I, N, "scale_f32", TP_OP_Cast, &scale, 1, &s32, &scale))) return rc;
  if (!tp_type_equal(&s32, &aligned) &&
      (rc = step(I, N, "scale_aligned", TP_OP_Reshape, &scale, 1, &aligned, &scale)))
    return rc;
  if (!tp_type_equal(&aligned, &norm) && (rc = step(I, N, "scale_expanded", TP_OP_Expand, &scale, 1, &norm, &scale)))
    return rc;
  if (xt.dtype == TP_F32) {
    int op = new_op(I, N, TP_OP_RMSNorm, (int[]){x, scale}, 2, 1);
    tp_set_attr_int(I->m, op, "axis", axis);
    tp_set_attr_float(I->m, op, "epsilon", eps);
    return finish_op(I, N, op);
  }
  int op = step_op(I, N, "f32", TP_OP_RMSNorm, (int[]){x, scale}, 2, NULL);
  tp_set_attr_int(I->m, op, "axis", axis);
  tp_set_attr_float(I->m, op, "epsilon", eps);
  if ((rc = step_value(I, op, &y))) return rc;
  return cast_to_type(I, N, y, xt);
}

/* One RotaryEmbedding cache as a Rotary table: looked up at the positions (when given),
 * one angle per pair widened to one per feature (the halves, or each pair, share it), and
 * shaped [batch, 1, seq, rd] (4-D X, heads on axis 1) or [batch, seq, 1, rd] (3-D X). */
static int rotary_table(Importer *I, const Node *N, int k, int positions, bool interleaved, bool heads_first,
                        int64_t rd, int *v) {
  const char *what = k == 1 ? "cos" : "sin";
  int t = N->in[k], rc;
  TpType ct = type_of(I, t);
  if (ct.rank != (positions >= 0 ? 2 : 3))
    return node_error(I, N, "%s_cache has rank %d, expected %d", what, ct.rank, positions >= 0 ? 2 : 3);
  if (positions >= 0) {
    int g = step_op(I, N, tp_strfmt(I->m, "%s_at", what), TP_OP_Gather, (int[]){t, positions}, 2, NULL);
    tp_set_attr_int(I->m, g, "axis", 0);
    if ((rc = step_value(I, g, &t))) return rc;
    ct = type_of(I, t);
  }
  if (ct.rank != 3 || ct.dims[2] != rd / 2)
    return node_error(I, N, "%s_cache gives %lld angles per position; rotary_embedding_dim %lld needs %lld", what,
                      (long long)ct.dims[ct.rank - 1], (long long)rd, (long long)(rd / 2));
  int64_t bs = ct.dims[0], seq = ct.dims[1];
  if (interleaved) { /* [b, s, rd/2] -> [b, s, rd/2, 1] -> [b, s, rd/2, 2] */
    TpType col = tp_type_make(ct.dtype, 4, (int64_t[]){bs, seq, rd / 2, 1});
    if ((rc = step(I, N, tp_strfmt(I->m, "%s_col", what), TP_OP_Reshape, &t, 1, &col, &t))) return rc;
  }
  int cat = step_op(I, N, tp_strfmt(I->m, "%s_wide", what), TP_OP_Concat, (int[]){t, t}, 2, NULL);
  tp_set_attr_int(I->m, cat, "axis", interleaved ? 3 : 2);
  if ((rc = step_value(I, cat, &t))) return rc;
  int64_t dims[4] = {bs, 1, seq, rd};
  if (!heads_first) dims[1] = seq, dims[2] = 1;
  TpType table = tp_type_make(ct.dtype, 4, dims);
  return step(I, N, what, TP_OP_Reshape, &t, 1, &table, v);
}

/* RotaryEmbedding(X, cos_cache, sin_cache, position_ids?) {interleaved, num_heads,
 * rotary_embedding_dim} onto Rotary: X [batch, heads, seq, head] as it is, X [batch, seq,
 * hidden] viewed as [batch, seq, num_heads, head] and back. */
static int import_rotary_embedding(Importer *I, Node *N) {
  TpType xt = type_of(I, N->in[0]);
  int64_t interleaved, heads, rd;
  int rc;
  if ((rc = attr_int(I, N, "interleaved", 0, &interleaved)) || (rc = attr_int(I, N, "num_heads", 0, &heads)) ||
      (rc = attr_int(I, N, "rotary_embedding_dim", 0, &rd)))
    return rc;
  int x = N->in[0];
  if (xt.rank == 3) {
    if (heads <= 0 || xt.dims[2] % heads)
      return node_error(I, N, "a 3-D input needs num_heads dividing its hidden size %lld (num_heads %lld)",
                        (long long)xt.dims[2], (long long)heads);
    TpType split = tp_type_make(xt.dtype, 4, (int64_t[]){xt.dims[0], xt.dims[1], heads, xt.dims[2] / heads});
    if ((rc = step(I, N, "heads", TP_OP_Reshape, &x, 1, &split, &x))) return rc;
  } else if (xt.rank != 4) {
    return node_error(I, N, "input has rank %d, expected 3 or 4", xt.rank);
  }
  int64_t head = type_of(I, x).dims[3];
  if (rd == 0) rd = head;
  if (rd < 2 || rd % 2 || rd > head)
    return node_error(I, N, "rotary_embedding_dim %lld must be even, positive and at most the head size %lld",
                      (long long)rd, (long long)head);
  int positions = N->nin > 3 ? N->in[3] : -1, cos, sin;
  if ((rc = rotary_table(I, N, 1, positions, interleaved != 0, xt.rank == 4, rd, &cos)) ||
      (rc = rotary_table(I, N, 2, positions, interleaved != 0, xt.rank == 4, rd, &sin)))
    return rc;
  int op, y;
  if (xt.rank == 4) op = new_op(I, N, TP_OP_Rotary, (int[]){x, cos, sin}, 3, 1);
  else op = step_op(I, N, "rotated", TP_OP_Rotary, (int[]){x, cos, sin}, 3, NULL);
  tp_set_attr_int(I->m, op, "interleaved", interleaved != 0);
  tp_set_attr_int(I->m, op, "rotary_dim", rd);
  if (xt.rank == 4) return finish_op(I, N, op);
  if ((rc = step_value(I, op, &y))) return rc;
  return emit_reshape(I, N, y, xt);
}

static int import_gelu(Importer *I, Node *N) {
  const char *approx;
  if (attr_string(I, N, "approximate", "none", &approx)) return TP_ERR_INPUT;
  if (strcmp(approx, "none") != 0 && strcmp(approx, "tanh") != 0)
    return node_error(I, N, "approximate '%s' is not 'none' or 'tanh'", approx);
  int op = new_op(I, N, TP_OP_Gelu, N->in, 1, 1);
  tp_set_attr_string(I->m, op, "approximate", approx);
  return finish_op(I, N, op);
}

static int import_attention(Importer *I, Node *N) {
  int64_t causal, qh, kvh, mode;
  double scale, softcap;
  if (attr_int(I, N, "is_causal", 0, &causal) || attr_int(I, N, "q_num_heads", 0, &qh) ||
      attr_int(I, N, "kv_num_heads", 0, &kvh) || attr_int(I, N, "qk_matmul_output_mode", 0, &mode) ||
      attr_float(I, N, "scale", 0, &scale) || attr_float(I, N, "softcap", 0, &softcap))
    return TP_ERR_INPUT;
  if (node_attr(N, "scale") && scale == 0) return node_error(I, N, "scale 0 is not supported");
  if (qh < 0 || kvh < 0) return node_error(I, N, "head counts must not be negative");
  int op = new_op(I, N, TP_OP_Attention, N->in, N->nin, N->nout);
  tp_set_attr_int(I->m, op, "is_causal", causal != 0);
  tp_set_attr_int(I->m, op, "q_num_heads", qh);
  tp_set_attr_int(I->m, op, "kv_num_heads", kvh);
  tp_set_attr_int(I->m, op, "qk_matmul_output_mode", mode);
  tp_set_attr_float(I->m, op, "scale", scale);
  tp_set_attr_float(I->m, op, "softcap", softcap);
  return finish_op(I, N, op);
}

/* SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss. */
static int import_loss(Importer *I, Node *N) {
  const char *reduction;
  int64_t ignore;
  if (attr_string(I, N, "reduction", "mean", &reduction) || attr_int(I, N, "ignore_index", 0, &ignore))
    return TP_ERR_INPUT;
  if (strcmp(reduction, "mean") != 0 && strcmp(reduction, "sum") != 0 && strcmp(reduction, "none") != 0)
    return node_error(I, N, "reduction '%s' is not 'mean', 'sum' or 'none'", reduction);
  int op = new_op(I, N, N->kind, N->in, N->nin, N->nout);
  tp_set_attr_string(I->m, op, "reduction", reduction);
  if (node_attr(N, "ignore_index")) tp_set_attr_int(I->m, op, "ignore_index", ignore);
  return finish_op(I, N, op);
}

static int import_trilu(Importer *I, Node *N) {
  int64_t upper, k = 0;
  if (attr_int(I, N, "upper", 1, &upper)) return TP_ERR_INPUT;
  if (N->nin > 1) {
    TpTensor t;
    int rc = const_operand(I, N, 1, "k", &t);
    if (rc) return rc;
    if (t.dtype != TP_I64 || tp_tensor_numel(&t) != 1) return node_error(I, N, "'k' must be an int64 scalar");
    memcpy(&k, t.data, 8);
  }
  int op = new_op(I, N, TP_OP_Trilu, N->in, 1, 1);
  tp_set_attr_int(I->m, op, "upper", upper != 0);
  tp_set_attr_int(I->m, op, "k", k);
  return finish_op(I, N, op);
}

/* ---- the table ----
 * One row per (op, since_version) from the oldest version still current at opset 13 up to
 * opset 23; a node takes the row with the highest since_version <= the model's opset.
 * Columns: op_type, since, lowering, IR op, ONNX min inputs, max inputs, max outputs. */
#define UN(op, ...)                                                                                                 \
  { #op, __VA_ARGS__, import_plain, TP_OP_##op, 1, 1, 1 }
#define BIN(op, ...)                                                                                                \
  { #op, __VA_ARGS__, import_plain, TP_OP_##op, 2, 2, 1 }
static const OpRow op_table[] = {
    BIN(Add, 13),
    BIN(Add, 14),
    BIN(Sub, 13),
    BIN(Sub, 14),
    BIN(Mul, 13),
    BIN(Mul, 14),
    BIN(Div, 13),
    BIN(Div, 14),
    {"Pow", 13, import_pow, TP_OP_Pow, 2, 2, 1},
    {"Pow", 15, import_pow, TP_OP_Pow, 2, 2, 1},
    UN(Sqrt, 13),
    UN(Neg, 13),
    UN(Reciprocal, 13),
    UN(Exp, 13),
    UN(Log, 13),
    UN(Erf, 13),
    UN(Tanh, 13),
    UN(Relu, 13),
    UN(Relu, 14),
    UN(Sigmoid, 13),
    UN(Not, 1),
    {"IsNaN", 13, import_isnan, TP_OP_COUNT, 1, 1, 1},
    {"IsNaN", 20, import_isnan, TP_OP_COUNT, 1, 1, 1},
    UN(Sin, 7),
    UN(Sin, 22),
    UN(Cos, 7),
    UN(Cos, 22),
    {"Max", 13, import_variadic, TP_OP_Max, 1, TP_MAX_CONST_INTS, 1},
    {"Min", 13, import_variadic, TP_OP_Min, 1, TP_MAX_CONST_INTS, 1},
    BIN(And, 7),
    BIN(Equal, 13),
    BIN(Equal, 19),
    BIN(Less, 13),
    BIN(LessOrEqual, 12),
    BIN(LessOrEqual, 16),
    BIN(Greater, 13),
    BIN(GreaterOrEqual, 12),
    BIN(GreaterOrEqual, 16),
    {"Where", 9, import_plain, TP_OP_Where, 3, 3, 1},
    {"Where", 16, import_plain, TP_OP_Where, 3, 3, 1},
    BIN(MatMul, 13),
    {"Gemm", 13, import_gemm, TP_OP_Gemm, 2, 3, 1},
    {"Gather", 13, import_gather, TP_OP_Gather, 2, 2, 1},
    {"GatherElements", 13, import_gather, TP_OP_GatherElements, 2, 2, 1},
    {"GatherND", 13, import_gathernd, TP_OP_COUNT, 2, 2, 1},
    {"CumSum", 11, import_cumsum, TP_OP_CumSum, 2, 2, 1},
    {"CumSum", 14, import_cumsum, TP_OP_CumSum, 2, 2, 1},
    {"TopK", 11, import_topk, TP_OP_COUNT, 2, 2, 2},
    {"Tile", 13, import_tile, TP_OP_Tile, 2, 2, 1},
    {"Reshape", 13, import_reshape, TP_OP_Reshape, 2, 2, 1},
    {"Reshape", 14, import_reshape, TP_OP_Reshape, 2, 2, 1},
    {"Reshape", 19, import_reshape, TP_OP_Reshape, 2, 2, 1},
    {"Reshape", 21, import_reshape, TP_OP_Reshape, 2, 2, 1},
    {"Reshape", 23, import_reshape, TP_OP_Reshape, 2, 2, 1},
    {"Transpose", 13, import_transpose, TP_OP_Transpose, 1, 1, 1},
    {"Transpose", 21, import_transpose, TP_OP_Transpose, 1, 1, 1},
    {"Transpose", 23, import_transpose, TP_OP_Transpose, 1, 1, 1},
    {"Split", 13, import_split, TP_OP_Split, 1, 2, TP_MAX_CONST_INTS},
    {"Split", 18, import_split, TP_OP_Split, 1, 2, TP_MAX_CONST_INTS},
    {"SplitToSequence", 11, import_split_to_sequence, TP_OP_Split, 1, 2, 1},
    {"SequenceAt", 11, import_sequence_at, TP_OP_COUNT, 2, 2, 1},
    {"Slice", 13, import_slice, TP_OP_Slice, 3, 5, 1},
    {"Concat", 13, import_concat, TP_OP_Concat, 1, TP_MAX_CONST_INTS, 1},
    {"Unsqueeze", 13, import_unsqueeze, TP_OP_Reshape, 2, 2, 1},
    {"Unsqueeze", 21, import_unsqueeze, TP_OP_Reshape, 2, 2, 1},
    {"Unsqueeze", 23, import_unsqueeze, TP_OP_Reshape, 2, 2, 1},
    {"Squeeze", 13, import_squeeze, TP_OP_Reshape, 1, 2, 1},
    {"Squeeze", 21, import_squeeze, TP_OP_Reshape, 1, 2, 1},
    {"Squeeze", 23, import_squeeze, TP_OP_Reshape, 1, 2, 1},
    {"Flatten", 13, import_flatten, TP_OP_Reshape, 1, 1, 1},
    {"Flatten", 21, import_flatten, TP_OP_Reshape, 1, 1, 1},
    {"Flatten", 23, import_flatten, TP_OP_Reshape, 1, 1, 1},
    {"Expand", 13, import_expand, TP_OP_Expand, 2, 2, 1},
    {"Cast", 13, import_cast, TP_OP_Cast, 1, 1, 1},
    {"Cast", 19, import_cast, TP_OP_Cast, 1, 1, 1},
    {"Cast", 21, import_cast, TP_OP_Cast, 1, 1, 1},
    {"Cast", 23, import_cast, TP_OP_Cast, 1, 1, 1},
    {"CastLike", 15, import_castlike, TP_OP_Cast, 2, 2, 1},
    {"CastLike", 19, import_castlike, TP_OP_Cast, 2, 2, 1},
    {"CastLike", 21, import_castlike, TP_OP_Cast, 2, 2, 1},
    {"CastLike", 23, import_castlike, TP_OP_Cast, 2, 2, 1},
    {"Shape", 13, import_shape, TP_OP_COUNT, 1, 1, 1},
    {"Shape", 15, import_shape, TP_OP_COUNT, 1, 1, 1},
    {"Shape", 19, import_shape, TP_OP_COUNT, 1, 1, 1},
    {"Shape", 21, import_shape, TP_OP_COUNT, 1, 1, 1},
    {"Shape", 23, import_shape, TP_OP_COUNT, 1, 1, 1},
    {"Range", 11, import_range, TP_OP_COUNT, 3, 3, 1},
    {"Trilu", 14, import_trilu, TP_OP_Trilu, 1, 2, 1},
    {"ConstantOfShape", 9, import_constant_of_shape, TP_OP_COUNT, 1, 1, 1},
    {"ConstantOfShape", 20, import_constant_of_shape, TP_OP_COUNT, 1, 1, 1},
    {"ConstantOfShape", 21, import_constant_of_shape, TP_OP_COUNT, 1, 1, 1},
    {"ConstantOfShape", 23, import_constant_of_shape, TP_OP_COUNT, 1, 1, 1},
    {"Identity", 13, import_identity, TP_OP_COUNT, 1, 1, 1},
    {"Identity", 14, import_identity, TP_OP_COUNT, 1, 1, 1},
    {"Identity", 16, import_identity, TP_OP_COUNT, 1, 1, 1},
    {"Identity", 19, import_identity, TP_OP_COUNT, 1, 1, 1},
    {"Identity", 21, import_identity, TP_OP_COUNT, 1, 1, 1},
    {"Identity", 23, import_identity, TP_OP_COUNT, 1, 1, 1},
    {"Dropout", 13, import_dropout, TP_OP_COUNT, 1, 3, 2},
    {"Dropout", 22, import_dropout, TP_OP_COUNT, 1, 3, 2},
    {"Constant", 13, import_constant, TP_OP_COUNT, 0, 0, 1},
    {"Constant", 19, import_constant, TP_OP_COUNT, 0, 0, 1},
    {"Constant", 21, import_constant, TP_OP_COUNT, 0, 0, 1},
    {"Constant", 23, import_constant, TP_OP_COUNT, 0, 0, 1},
    {"Softmax", 13, import_softmax, TP_OP_Softmax, 1, 1, 1},
    {"LogSoftmax", 13, import_softmax, TP_OP_LogSoftmax, 1, 1, 1},
    {"ReduceMean", 13, import_reduce, TP_OP_ReduceMean, 1, 1, 1},
    {"ReduceMean", 18, import_reduce, TP_OP_ReduceMean, 1, 2, 1},
    {"ReduceSum", 13, import_reduce, TP_OP_ReduceSum, 1, 2, 1},
    {"LayerNormalization", 17, import_layernorm, TP_OP_LayerNorm, 2, 3, 3},
    {"RMSNormalization", 23, import_rms_normalization, TP_OP_RMSNorm, 2, 2, 1},
    {"RotaryEmbedding", 23, import_rotary_embedding, TP_OP_Rotary, 3, 4, 1},
    {"Gelu", 20, import_gelu, TP_OP_Gelu, 1, 1, 1},
    {"Attention", 23, import_attention, TP_OP_Attention, 3, 6, 4},
    {"SoftmaxCrossEntropyLoss", 13, import_loss, TP_OP_SoftmaxCrossEntropyLoss, 2, 3, 2},
    {"NegativeLogLikelihoodLoss", 13, import_loss, TP_OP_NegativeLogLikelihoodLoss, 2, 3, 1},
    {"NegativeLogLikelihoodLoss", 22, import_loss, TP_OP_NegativeLogLikelihoodLoss, 2, 3, 1},
};
#undef UN
#undef BIN

const OpRow *tp_onnx_find_op(const char *op_type, int opset, int *first_since) {
  const OpRow *best = NULL;
  *first_since = 0;
  for (size_t i = 0; i < sizeof op_table / sizeof *op_table; i++) {
    const OpRow *r = &op_table[i];
    if (strcmp(r->op_type, op_type) != 0) continue;
    if (!*first_since || r->since < *first_since) *first_since = r->since;
    if (r->since <= opset && (!best || r->since > best->since)) best = r;
  }
  return best;
}
