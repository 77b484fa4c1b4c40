/* Type inference: result dtypes, shapes and symbolic dim names of every op, from its
 * operands and canonical attributes (ir/ops.def). The same code checks a module's recorded
 * types (the verifier) and fills them in while the importer builds one. */
#include "ir.h"

#include <string.h>


typedef struct {
  TpModule *m;
  int op;
  TpDiag *d;
} Ctx;

static const TpType *operand(const Ctx *c, int i) {
  const TpOp *op = &c->m->ops[c->op];
  if (i >= op->ninputs || op->inputs[i] < 0) return NULL;
  return &c->m->values[op->inputs[i]].type;
}

static TpType *result(const Ctx *c, int i) {
  const TpOp *op = &c->m->ops[c->op];
  if (i >= op->noutputs || op->outputs[i] < 0) return NULL;
  return &c->m->values[op->outputs[i]].type;
}

static const char *type_str(const TpType *t, char *buf) { return tp_type_str(t, buf, 256); }

/* Records `t` as result i, or checks it against the recorded type; names fill gaps only. */
static int set_result(const Ctx *c, int i, TpType t) {
  TpType *r = result(c, i);
  if (!r) return TP_OK;
  if (!tp_type_size_ok(&t)) { /* sizes must stay addressable: a corrupt model must not overflow them */
    char want[256];
    return tp_error_op(c->d, c->m, c->op, "result %d would be %s: too large", i, type_str(&t, want));
  }
  if (r->dtype == TP_UNDEF) {
    *r = t;
    return TP_OK;
  }
  if (!tp_type_equal(r, &t)) {
    char have[256], want[256];
    return tp_error_op(c->d, c->m, c->op, "result %d has type %s but the op computes %s", i,
                       type_str(r, have), type_str(&t, want));
  }
  for (int k = 0; k < r->rank; k++)
    if (!r->dimnames[k]) r->dimnames[k] = t.dimnames[k];
  return TP_OK;
}

/* The result type the importer fixed beforehand (Reshape, Expand, Cast, Split, Slice). */
static const TpType *preset(const Ctx *c, int i) {
  const TpType *r = result(c, i);
  if (r && r->dtype == TP_UNDEF) {
    tp_error_op(c->d, c->m, c->op, "result %d has no type (this op takes its type from its result)", i);
    return NULL;
  }
  return r;
}

static int need_float(const Ctx *c, const TpType *t, const char *what) {
  if (!tp_dtype_is_float(t->dtype))
    return tp_error_op(c->d, c->m, c->op, "%s must be a floating-point tensor, not %s", what,
                       tp_dtype_name(t->dtype));
  return TP_OK;
}

static int same_dtype(const Ctx *c, const TpType *a, const TpType *b) {
  if (a->dtype != b->dtype)
    return tp_error_op(c->d, c->m, c->op, "operand types differ: %s and %s", tp_dtype_name(a->dtype),
                       tp_dtype_name(b->dtype));
  return TP_OK;
}

static int check_axis(const Ctx *c, int64_t axis, int rank, const char *what) {
  if (axis < 0 || axis >= rank)
    return tp_error_op(c->d, c->m, c->op, "%s %lld is out of range for rank %d", what, (long long)axis, rank);
  return TP_OK;
}

bool tp_broadcast_shape(const TpType *a, const TpType *b, TpType *out) {
  int rank = a->rank > b->rank ? a->rank : b->rank;
  TpType t = {.dtype = a->dtype, .rank = rank};
  for (int i = 0; i < rank; i++) {
    int ia = i - (rank - a->rank), ib = i - (rank - b->rank);
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    const char *na = ia >= 0 ? a->dimnames[ia] : NULL, *nb = ib >= 0 ? b->dimnames[ib] : NULL;
    if (da != db && da != 1 && db != 1) return false;
    t.dims[i] = da == 1 ? db : da;
    /* a name belongs to an operand dim that is not broadcast */
    t.dimnames[i] = (na && da == t.dims[i]) ? na : (nb && db == t.dims[i]) ? nb : NULL;
  }
  *out = t;
  return true;
}

static int broadcast(const Ctx *c, const TpType *a, const TpType *b, TpType *out) {
  if (tp_broadcast_shape(a, b, out)) return TP_OK;
  char sa[256], sb[256];
  return tp_error_op(c->d, c->m, c->op, "shapes %s and %s do not broadcast", type_str(a, sa), type_str(b, sb));
}

static int infer_elementwise(const Ctx *c, TpOpKind kind) {
  const TpType *a = operand(c, 0), *b = operand(c, 1);
  TpType t = *a;
  if (b) {
    if (kind != TP_OP_Pow && same_dtype(c, a, b)) return TP_ERR_INPUT;
    if (broadcast(c, a, b, &t)) return TP_ERR_INPUT;
  }
  switch (kind) {
  case TP_OP_Not:
  case TP_OP_And:
    if (a->dtype != TP_BOOL) return tp_error_op(c->d, c->m, c->op, "operands must be bool");
    break;
  case TP_OP_Sqrt: case TP_OP_Reciprocal: case TP_OP_Exp: case TP_OP_Log: case TP_OP_Erf:
  case TP_OP_Tanh: case TP_OP_Sigmoid: case TP_OP_Gelu: case TP_OP_Sin: case TP_OP_Cos:
    if (need_float(c, a, "the operand")) return TP_ERR_INPUT;
    break;
  case TP_OP_Pow: case TP_OP_Max: case TP_OP_Min:
    if (b->dtype == TP_BOOL || a->dtype == TP_BOOL)
      return tp_error_op(c->d, c->m, c->op, "operands must be numeric");
    break;
  default:
    break;
  }
  if (tp_op_info[kind].traits & TP_TRAIT_BOOL_RESULT) t.dtype = TP_BOOL;
  return set_result(c, 0, t);
}

static int infer_where(const Ctx *c) {
  const TpType *cond = operand(c, 0), *x = operand(c, 1), *y = operand(c, 2);
  if (cond->dtype != TP_BOOL) return tp_error_op(c->d, c->m, c->op, "condition must be bool");
  if (same_dtype(c, x, y)) return TP_ERR_INPUT;
  TpType xy, t;
  if (broadcast(c, x, y, &xy) || broadcast(c, cond, &xy, &t)) return TP_ERR_INPUT;
  t.dtype = x->dtype;
  return set_result(c, 0, t);
}

/* numpy matmul of a and b into *t */
static int matmul_type(const Ctx *c, const TpType *a, const TpType *b, TpType *t) {
  if (same_dtype(c, a, b)) return TP_ERR_INPUT;
  if (a->rank < 1 || b->rank < 1) return tp_error_op(c->d, c->m, c->op, "operands must have rank >= 1");
  /* promote vectors, as numpy does: [K] x [..,K,N] and [..,M,K] x [K] */
  TpType pa = *a, pb = *b;
  if (a->rank == 1) pa = (TpType){.dtype = a->dtype, .rank = 2, .dims = {1, a->dims[0]}, .dimnames = {NULL, a->dimnames[0]}};
  if (b->rank == 1) pb = (TpType){.dtype = b->dtype, .rank = 2, .dims = {b->dims[0], 1}, .dimnames = {b->dimnames[0], NULL}};
  int64_t k1 = pa.dims[pa.rank - 1], k2 = pb.dims[pb.rank - 2];
  if (k1 != k2) {
    char sa[256], sb[256];
    return tp_error_op(c->d, c->m, c->op, "inner dimensions differ: %s x %s", type_str(a, sa), type_str(b, sb));
  }
  TpType ba = pa, bb = pb;
  ba.rank -= 2;
  bb.rank -= 2;
  if (broadcast(c, &ba, &bb, t)) return TP_ERR_INPUT;
  if (a->rank > 1) {
    t->dims[t->rank] = pa.dims[pa.rank - 2];
    t->dimnames[t->rank++] = pa.dimnames[pa.rank - 2];
  }
  if (b->rank > 1) {
    t->dims[t->rank] = pb.dims[pb.rank - 1];
    t->dimnames[t->rank++] = pb.dimnames[pb.rank - 1];
  }
  t->dtype = a->dtype;
  return TP_OK;
}

static int infer_matmul(const Ctx *c) {
  TpType t;
  return matmul_type(c, operand(c, 0), operand(c, 1), &t) || set_result(c, 0, t) ? TP_ERR_INPUT : TP_OK;
}

static int infer_gemm(const Ctx *c) {
  const TpType *a = operand(c, 0), *b = operand(c, 1), *bias = operand(c, 2);
  if (a->rank != 2 || b->rank != 2) return tp_error_op(c->d, c->m, c->op, "A and B must be matrices");
  if (same_dtype(c, a, b)) return TP_ERR_INPUT;
  bool ta = tp_attr_int(c->m, c->op, "transA", 0), tb = tp_attr_int(c->m, c->op, "transB", 0);
  int64_t m = a->dims[ta ? 1 : 0], k = a->dims[ta ? 0 : 1], k2 = b->dims[tb ? 1 : 0], n = b->dims[tb ? 0 : 1];
  if (k != k2) {
    char sa[256], sb[256];
    return tp_error_op(c->d, c->m, c->op, "inner dimensions differ: %s x %s", type_str(a, sa), type_str(b, sb));
  }
  TpType t = {.dtype = a->dtype, .rank = 2, .dims = {m, n},
              .dimnames = {a->dimnames[ta ? 1 : 0], b->dimnames[tb ? 0 : 1]}};
  if (bias) {
    TpType bt;
    if (same_dtype(c, a, bias) || broadcast(c, bias, &t, &bt)) return TP_ERR_INPUT;
    if (!tp_type_equal(&bt, &t)) return tp_error_op(c->d, c->m, c->op, "C does not broadcast to [M, N]");
  }
  return set_result(c, 0, t);
}

static int gather_type(const Ctx *c, const TpType *data, const TpType *idx, int64_t axis, TpType *t) {
  if (check_axis(c, axis, data->rank, "axis")) return TP_ERR_INPUT;
  if (idx->dtype != TP_I64 && idx->dtype != TP_I32)
    return tp_error_op(c->d, c->m, c->op, "indices must be i32 or i64");
  if (data->rank - 1 + idx->rank > TP_MAX_RANK)
    return tp_error_op(c->d, c->m, c->op, "result rank exceeds %d", TP_MAX_RANK);
  int64_t rows = data->dims[axis], pad = tp_attr_int(c->m, c->op, "padding_idx", 0);
  if (pad < 0 || (pad >= rows && rows >= 0))
    return tp_error_op(c->d, c->m, c->op, "padding_idx %lld is not a row of the %lld along axis %lld", (long long)pad,
                       (long long)rows, (long long)axis);
  *t = (TpType){.dtype = data->dtype};
  for (int i = 0; i < axis; i++, t->rank++) t->dims[t->rank] = data->dims[i], t->dimnames[t->rank] = data->dimnames[i];
  for (int i = 0; i < idx->rank; i++, t->rank++) t->dims[t->rank] = idx->dims[i], t->dimnames[t->rank] = idx->dimnames[i];
  for (int i = (int)axis + 1; i < data->rank; i++, t->rank++)
    t->dims[t->rank] = data->dims[i], t->dimnames[t->rank] = data->dimnames[i];
  return TP_OK;
}

static int infer_gather(const Ctx *c) {
  TpType t;
  return gather_type(c, operand(c, 0), operand(c, 1), tp_attr_int(c->m, c->op, "axis", 0), &t) || set_result(c, 0, t)
             ? TP_ERR_INPUT : TP_OK;
}

/* GatherElements(data, idx) {axis}: the result (and a gradient) has idx's dims */
static int gather_elements_type(const Ctx *c, const TpType *data, const TpType *idx, int64_t axis, TpType *t) {
  if (check_axis(c, axis, data->rank, "axis")) return TP_ERR_INPUT;
  if (idx->dtype != TP_I64 && idx->dtype != TP_I32)
    return tp_error_op(c->d, c->m, c->op, "indices must be i32 or i64");
  char sd[256], si[256];
  if (idx->rank != data->rank)
    return tp_error_op(c->d, c->m, c->op, "indices %s must have the rank of data %s", type_str(idx, si),
                       type_str(data, sd));
  for (int i = 0; i < idx->rank; i++)
    if (i != axis && idx->dims[i] > data->dims[i])
      return tp_error_op(c->d, c->m, c->op, "indices %s exceed data %s outside axis %lld", type_str(idx, si),
                         type_str(data, sd), (long long)axis);
  *t = *idx;
  t->dtype = data->dtype;
  for (int i = 0; i < t->rank; i++)
    t->dimnames[i] = i != axis && idx->dims[i] == data->dims[i] ? data->dimnames[i] : NULL;
  return TP_OK;
}

static int infer_gather_elements(const Ctx *c) {
  TpType t;
  return gather_elements_type(c, operand(c, 0), operand(c, 1), tp_attr_int(c->m, c->op, "axis", 0), &t) ||
                 set_result(c, 0, t)
             ? TP_ERR_INPUT : TP_OK;
}

static int infer_reshape(const Ctx *c) {
  const TpType *x = operand(c, 0), *r = preset(c, 0);
  if (!r) return TP_ERR_INPUT;
  if (same_dtype(c, x, r)) return TP_ERR_INPUT;
  if (tp_type_numel(x) != tp_type_numel(r)) {
    char sx[256], sr[256];
    return tp_error_op(c->d, c->m, c->op, "cannot reshape %s to %s", type_str(x, sx), type_str(r, sr));
  }
  /* a row-major reshape keeps the leading dims it leaves unchanged, and their names */
  TpType *named = result(c, 0);
  for (int i = 0; i < x->rank && i < r->rank && x->dims[i] == r->dims[i]; i++)
    if (!named->dimnames[i]) named->dimnames[i] = x->dimnames[i];
  return TP_OK;
}

static int infer_expand(const Ctx *c) {
  const TpType *x = operand(c, 0), *r = preset(c, 0);
  if (!r) return TP_ERR_INPUT;
  TpType t;
  if (same_dtype(c, x, r) || broadcast(c, x, r, &t)) return TP_ERR_INPUT;
  if (!tp_type_equal(&t, r)) {
    char sx[256], sr[256];
    return tp_error_op(c->d, c->m, c->op, "cannot expand %s to %s", type_str(x, sx), type_str(r, sr));
  }
  return set_result(c, 0, t); /* fills in the names broadcasting carried over */
}

static int infer_tile(const Ctx *c) {
  const TpType *x = operand(c, 0);
  int n;
  const int64_t *repeats = tp_attr_ints(c->m, c->op, "repeats", &n);
  if (n != x->rank) return tp_error_op(c->d, c->m, c->op, "repeats has %d entries for rank %d", n, x->rank);
  TpType t = {.dtype = x->dtype, .rank = x->rank};
  for (int i = 0; i < n; i++) {
    if (repeats[i] < 0) return tp_error_op(c->d, c->m, c->op, "repeats has negative value %lld", (long long)repeats[i]);
    if (x->dims[i] && repeats[i] > INT64_MAX / 16 / x->dims[i])
      return tp_error_op(c->d, c->m, c->op, "the tiled tensor is too large");
    t.dims[i] = x->dims[i] * repeats[i];
    if (repeats[i] == 1) t.dimnames[i] = x->dimnames[i];
  }
  return set_result(c, 0, t); /* checks the total size */
}

static int infer_cumsum(const Ctx *c) {
  const TpType *x = operand(c, 0);
  if (check_axis(c, tp_attr_int(c->m, c->op, "axis", 0), x->rank, "axis")) return TP_ERR_INPUT;
  if (x->dtype == TP_BOOL) return tp_error_op(c->d, c->m, c->op, "the operand must be numeric");
  return set_result(c, 0, *x);
}

/* TopK(X) {axis, k} -> i64 indices: X's dims with k on axis (names kept off axis) */
static int infer_topk(const Ctx *c) {
  const TpType *x = operand(c, 0);
  int64_t axis = tp_attr_int(c->m, c->op, "axis", 0), k = tp_attr_int(c->m, c->op, "k", 0);
  if (check_axis(c, axis, x->rank, "axis")) return TP_ERR_INPUT;
  if (x->dtype == TP_BOOL) return tp_error_op(c->d, c->m, c->op, "the operand must be numeric");
  if (k < 1 || k > x->dims[axis])
    return tp_error_op(c->d, c->m, c->op, "k %lld is out of range for %lld entries on axis %lld", (long long)k,
                       (long long)x->dims[axis], (long long)axis);
  TpType t = *x;
  t.dtype = TP_I64;
  t.dims[axis] = k;
  t.dimnames[axis] = NULL;
  return set_result(c, 0, t);
}

static int infer_cast(const Ctx *c) {
  const TpType *x = operand(c, 0), *r = preset(c, 0);
  if (!r) return TP_ERR_INPUT;
  TpType t = *x;
  t.dtype = r->dtype;
  return set_result(c, 0, t);
}

static int infer_transpose(const Ctx *c) {
  const TpType *x = operand(c, 0);
  int n;
  const int64_t *perm = tp_attr_ints(c->m, c->op, "perm", &n);
  if (n != x->rank) return tp_error_op(c->d, c->m, c->op, "perm has %d entries for rank %d", n, x->rank);
  TpType t = {.dtype = x->dtype, .rank = x->rank};
  bool seen[TP_MAX_RANK] = {0};
  for (int i = 0; i < n; i++) {
    if (perm[i] < 0 || perm[i] >= n || seen[perm[i]])
      return tp_error_op(c->d, c->m, c->op, "perm is not a permutation of 0..%d", n - 1);
    seen[perm[i]] = true;
    t.dims[i] = x->dims[perm[i]];
    t.dimnames[i] = x->dimnames[perm[i]];
  }
  return set_result(c, 0, t);
}

/* dims of `r` equal to x's except on `axis`; names carried over from x */
static int same_but_axis(const Ctx *c, const TpType *x, TpType *r, int64_t axis) {
  if (r->rank != x->rank || r->dtype != x->dtype) {
    char sx[256], sr[256];
    return tp_error_op(c->d, c->m, c->op, "%s does not match %s outside axis %lld", type_str(r, sr),
                       type_str(x, sx), (long long)axis);
  }
  for (int i = 0; i < x->rank; i++) {
    if (i != axis && r->dims[i] != x->dims[i]) {
      char sx[256], sr[256];
      return tp_error_op(c->d, c->m, c->op, "%s does not match %s outside axis %lld", type_str(r, sr),
                         type_str(x, sx), (long long)axis);
    }
    if (i != axis && !r->dimnames[i]) r->dimnames[i] = x->dimnames[i];
  }
  return TP_OK;
}

static int infer_split(const Ctx *c) {
  const TpType *x = operand(c, 0);
  int64_t axis = tp_attr_int(c->m, c->op, "axis", 0), total = 0;
  if (check_axis(c, axis, x->rank, "axis")) return TP_ERR_INPUT;
  const TpOp *op = &c->m->ops[c->op];
  for (int i = 0; i < op->noutputs; i++) {
    TpType *r = result(c, i);
    if (!r) return tp_error_op(c->d, c->m, c->op, "every result of Split must be present");
    if (!preset(c, i) || same_but_axis(c, x, r, axis)) return TP_ERR_INPUT;
    total += r->dims[axis];
  }
  if (total != x->dims[axis])
    return tp_error_op(c->d, c->m, c->op, "split sizes sum to %lld, not %lld", (long long)total,
                       (long long)x->dims[axis]);
  return TP_OK;
}

static int infer_slice(const Ctx *c) {
  const TpType *x = operand(c, 0);
  TpType *r = result(c, 0);
  if (!preset(c, 0)) return TP_ERR_INPUT;
  int ns, nt;
  const int64_t *starts = tp_attr_ints(c->m, c->op, "starts", &ns), *steps = tp_attr_ints(c->m, c->op, "steps", &nt);
  if (ns != x->rank || nt != x->rank || r->rank != x->rank || r->dtype != x->dtype)
    return tp_error_op(c->d, c->m, c->op, "starts, steps and result must have the operand's rank %d", x->rank);
  for (int i = 0; i < x->rank; i++) {
    int64_t n = r->dims[i];
    if (steps[i] == 0 || !tp_slice_fits(starts[i], steps[i], n, x->dims[i]))
      return tp_error_op(c->d, c->m, c->op, "slice of dim %d (start %lld, step %lld, %lld elements) leaves [0, %lld)",
                         i, (long long)starts[i], (long long)steps[i], (long long)n, (long long)x->dims[i]);
    if (n == x->dims[i] && steps[i] == 1 && !r->dimnames[i]) r->dimnames[i] = x->dimnames[i];
  }
  return TP_OK;
}

static int infer_concat(const Ctx *c) {
  const TpOp *op = &c->m->ops[c->op];
  const TpType *first = operand(c, 0);
  int64_t axis = tp_attr_int(c->m, c->op, "axis", 0);
  if (check_axis(c, axis, first->rank, "axis")) return TP_ERR_INPUT;
  TpType t = *first;
  t.dims[axis] = 0;
  t.dimnames[axis] = NULL;
  for (int i = 0; i < op->ninputs; i++) {
    const TpType *x = operand(c, i);
    if (!x) return tp_error_op(c->d, c->m, c->op, "operand %d is absent", i);
    TpType probe = *x;
    if (same_but_axis(c, first, &probe, axis)) return TP_ERR_INPUT;
    t.dims[axis] += x->dims[axis];
  }
  /* a token slice's context (ir/ops.def): appends one operand to the previous context */
  int64_t rows = tp_attr_int(c->m, c->op, "context_rows", 0);
  if (rows < 0 || (rows && rows < t.dims[axis]))
    return tp_error_op(c->d, c->m, c->op, "context_rows %lld cannot hold the %lld rows of the result", (long long)rows,
                       (long long)t.dims[axis]);
  if (rows && (op->ninputs > 2 || t.dims[axis] == 0))
    return tp_error_op(c->d, c->m, c->op, "a context (context_rows) appends one non-empty operand to at most one "
                       "previous context");
  if (rows && op->ninputs == 2) {
    int prev = c->m->values[op->inputs[0]].def;
    if (prev < 0 || c->m->ops[prev].kind != TP_OP_Concat || tp_attr_int(c->m, prev, "context_rows", 0) != rows ||
        tp_attr_int(c->m, prev, "axis", 0) != axis)
      return tp_error_op(c->d, c->m, c->op, "operand 0 of a context must be the previous context: a Concat with the "
                         "same axis and context_rows");
  }
  return set_result(c, 0, t);
}

static int infer_same_type(const Ctx *c, int min_rank) {
  const TpType *x = operand(c, 0);
  if (x->rank < min_rank) return tp_error_op(c->d, c->m, c->op, "operand must have rank >= %d", min_rank);
  return set_result(c, 0, *x);
}

static int infer_softmax(const Ctx *c) {
  const TpType *x = operand(c, 0);
  if (need_float(c, x, "the operand") || check_axis(c, tp_attr_int(c->m, c->op, "axis", -1), x->rank, "axis"))
    return TP_ERR_INPUT;
  return set_result(c, 0, *x);
}

static int infer_reduce(const Ctx *c) {
  const TpType *x = operand(c, 0);
  int n;
  const int64_t *axes = tp_attr_ints(c->m, c->op, "axes", &n);
  bool keep = tp_attr_int(c->m, c->op, "keepdims", 1);
  if (n == 0) return tp_error_op(c->d, c->m, c->op, "axes must not be empty");
  TpType t = {.dtype = x->dtype};
  for (int i = 0, k = 0; i < x->rank; i++) {
    bool reduced = k < n && axes[k] == i;
    if (reduced) k++;
    if (!reduced) t.dims[t.rank] = x->dims[i], t.dimnames[t.rank++] = x->dimnames[i];
    else if (keep) t.dims[t.rank++] = 1;
  }
  for (int k = 0; k < n; k++)
    if (axes[k] < 0 || axes[k] >= x->rank || (k && axes[k] <= axes[k - 1]))
      return tp_error_op(c->d, c->m, c->op, "axes must be sorted, distinct and within rank %d", x->rank);
  return set_result(c, 0, t);
}

static int infer_layernorm(const Ctx *c) {
  const TpType *x = operand(c, 0), *scale = operand(c, 1), *bias = operand(c, 2);
  int64_t axis = tp_attr_int(c->m, c->op, "axis", -1);
  if (need_float(c, x, "X") || check_axis(c, axis, x->rank, "axis")) return TP_ERR_INPUT;
  TpType norm = {.dtype = x->dtype, .rank = x->rank - (int)axis}, t;
  memcpy(norm.dims, x->dims + axis, (size_t)norm.rank * sizeof norm.dims[0]);
  for (int i = 1; i < 3; i++) {
    const TpType *p = i == 1 ? scale : bias;
    if (!p) continue;
    if (same_dtype(c, x, p) || broadcast(c, p, &norm, &t)) return TP_ERR_INPUT;
    if (!tp_type_equal(&t, &norm))
      return tp_error_op(c->d, c->m, c->op, "%s does not broadcast to the normalised dims", i == 1 ? "Scale" : "B");
  }
  if (set_result(c, 0, *x)) return TP_ERR_INPUT;
  TpType stat = *x;
  stat.dtype = TP_F32;
  for (int i = (int)axis; i < x->rank; i++) stat.dims[i] = 1, stat.dimnames[i] = NULL;
  return set_result(c, 1, stat) || set_result(c, 2, stat) ? TP_ERR_INPUT : TP_OK;
}

/* Attention's and AttentionBackward's causal attributes: causal_offset >= 0, and a window
 * >= 0 that only a causal attention has. */
static int check_causal_attrs(const Ctx *c) {
  int64_t offset = tp_attr_int(c->m, c->op, "causal_offset", 0), window = tp_attr_int(c->m, c->op, "window", 0);
  if (offset < 0) return tp_error_op(c->d, c->m, c->op, "causal_offset %lld must be >= 0", (long long)offset);
  if (window < 0) return tp_error_op(c->d, c->m, c->op, "window %lld must be >= 0", (long long)window);
  if (window && !tp_attr_int(c->m, c->op, "is_causal", 0))
    return tp_error_op(c->d, c->m, c->op, "window %lld needs is_causal = 1", (long long)window);
  return TP_OK;
}

/* An attention mask: bool or Q's dtype, rank <= 4, broadcast to the scores [B, H, S, T]. */
static int check_attention_mask(const Ctx *c, const TpType *mask, TpDType dtype, int64_t batch, int64_t heads,
                                int64_t s, int64_t total) {
  TpType scores = {.dtype = mask->dtype, .rank = 4, .dims = {batch, heads, s, total}}, t;
  if (mask->rank > 4 || broadcast(c, mask, &scores, &t)) return TP_ERR_INPUT;
  if (!tp_type_equal(&t, &scores)) return tp_error_op(c->d, c->m, c->op, "attn_mask does not broadcast to the scores");
  if (mask->dtype != TP_BOOL && mask->dtype != dtype)
    return tp_error_op(c->d, c->m, c->op, "attn_mask must be bool or Q's dtype");
  return TP_OK;
}

/* Attention (ONNX opset 23): 4-D [B, H, S, D] operands, or 3-D [B, S, H*D] with head counts. */
static int infer_attention(const Ctx *c) {
  const TpType *q = operand(c, 0), *k = operand(c, 1), *v = operand(c, 2), *mask = operand(c, 3);
  const TpType *past_k = operand(c, 4), *past_v = operand(c, 5);
  if (need_float(c, q, "Q") || same_dtype(c, q, k) || same_dtype(c, q, v)) return TP_ERR_INPUT;
  if (q->rank != k->rank || q->rank != v->rank || (q->rank != 3 && q->rank != 4))
    return tp_error_op(c->d, c->m, c->op, "Q, K and V must all be 3-D or all 4-D");
  int64_t batch = q->dims[0], hq, hkv, s, l, dq, dv;
  if (q->rank == 4) {
    hq = q->dims[1], s = q->dims[2], dq = q->dims[3];
    hkv = k->dims[1], l = k->dims[2], dv = v->dims[3];
    if (k->dims[3] != dq || v->dims[1] != hkv || v->dims[2] != l)
      return tp_error_op(c->d, c->m, c->op, "K and V do not match Q's head size or each other");
  } else {
    hq = tp_attr_int(c->m, c->op, "q_num_heads", 0), hkv = tp_attr_int(c->m, c->op, "kv_num_heads", 0);
    if (hq <= 0 || hkv <= 0 || q->dims[2] % hq || k->dims[2] % hkv || v->dims[2] % hkv)
      return tp_error_op(c->d, c->m, c->op, "3-D operands need q_num_heads and kv_num_heads dividing the hidden sizes");
    s = q->dims[1], l = k->dims[1], dq = q->dims[2] / hq, dv = v->dims[2] / hkv;
    if (k->dims[2] / hkv != dq || v->dims[1] != l)
      return tp_error_op(c->d, c->m, c->op, "K and V do not match Q's head size or each other");
  }
  if (k->dims[0] != batch || v->dims[0] != batch || hkv <= 0 || hq % hkv)
    return tp_error_op(c->d, c->m, c->op, "batch sizes differ or q heads are not a multiple of kv heads");
  int64_t past = 0;
  if ((past_k == NULL) != (past_v == NULL))
    return tp_error_op(c->d, c->m, c->op, "past_key and past_value come together");
  if (past_k) {
    past = past_k->dims[2];
    if (past_k->rank != 4 || past_v->rank != 4 || past_k->dims[0] != batch || past_k->dims[1] != hkv ||
        past_k->dims[3] != dq || past_v->dims[0] != batch || past_v->dims[1] != hkv || past_v->dims[2] != past ||
        past_v->dims[3] != dv)
      return tp_error_op(c->d, c->m, c->op, "past_key/past_value must be [B, kv_heads, P, head_size]");
  }
  int64_t total = past + l;
  if (dv && hq > INT64_MAX / dv) return tp_error_op(c->d, c->m, c->op, "q_num_heads %lld is too large", (long long)hq);
  if (check_causal_attrs(c) || (mask && check_attention_mask(c, mask, q->dtype, batch, hq, s, total)))
    return TP_ERR_INPUT;
  TpType y = q->rank == 4 ? (TpType){.dtype = q->dtype, .rank = 4, .dims = {batch, hq, s, dv}}
                          : (TpType){.dtype = q->dtype, .rank = 3, .dims = {batch, s, hq * dv}};
  y.dimnames[0] = q->dimnames[0];
  y.dimnames[q->rank == 4 ? 2 : 1] = q->dimnames[q->rank == 4 ? 2 : 1];
  TpType pk = {.dtype = q->dtype, .rank = 4, .dims = {batch, hkv, total, dq}};
  TpType pv = {.dtype = q->dtype, .rank = 4, .dims = {batch, hkv, total, dv}};
  TpType qk = {.dtype = q->dtype, .rank = 4, .dims = {batch, hq, s, total}};
  return set_result(c, 0, y) || set_result(c, 1, pk) || set_result(c, 2, pv) || set_result(c, 3, qk)
             ? TP_ERR_INPUT : TP_OK;
}

/* SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss: scores [N, C, d...], labels [N, d...]. */
static int infer_loss(const Ctx *c) {
  const TpType *x = operand(c, 0), *labels = operand(c, 1), *w = operand(c, 2);
  if (need_float(c, x, "scores")) return TP_ERR_INPUT;
  if (x->rank < 2 || labels->rank != x->rank - 1 || labels->dims[0] != x->dims[0])
    return tp_error_op(c->d, c->m, c->op, "scores must be [N, C, d...] and labels [N, d...]");
  for (int i = 2; i < x->rank; i++)
    if (labels->dims[i - 1] != x->dims[i])
      return tp_error_op(c->d, c->m, c->op, "labels do not match the scores' extra dims");
  if (labels->dtype != TP_I64 && labels->dtype != TP_I32) return tp_error_op(c->d, c->m, c->op, "labels must be i32 or i64");
  if (w && (w->rank != 1 || w->dims[0] != x->dims[1] || w->dtype != x->dtype))
    return tp_error_op(c->d, c->m, c->op, "weights must be [C] of the scores' dtype");
  const char *reduction = tp_attr_string(c->m, c->op, "reduction", "mean");
  TpType loss = {.dtype = x->dtype};
  if (strcmp(reduction, "none") == 0) {
    loss = *labels;
    loss.dtype = x->dtype;
  } else if (strcmp(reduction, "mean") != 0 && strcmp(reduction, "sum") != 0) {
    return tp_error_op(c->d, c->m, c->op, "unknown reduction '%s'", reduction);
  }
  return set_result(c, 0, loss) || set_result(c, 1, *x) ? TP_ERR_INPUT : TP_OK;
}

/* ---- raised and backward ops ---- */

/* Y = X W (+ B): X [..., K], W [K, N] or [N, K] (transpose_w), B [N] */
static int linear_type(const Ctx *c, const TpType *x, const TpType *w, const TpType *b, TpType *y) {
  bool tw = tp_attr_int(c->m, c->op, "transpose_w", 0);
  if (need_float(c, x, "X") || same_dtype(c, x, w)) return TP_ERR_INPUT;
  if (w->rank != 2 || x->rank < 1) return tp_error_op(c->d, c->m, c->op, "W must be a matrix and X at least 1-D");
  int64_t k = w->dims[tw ? 1 : 0], n = w->dims[tw ? 0 : 1];
  if (x->dims[x->rank - 1] != k) {
    char sx[256], sw[256];
    return tp_error_op(c->d, c->m, c->op, "inner dimensions differ: %s x %s%s", type_str(x, sx), type_str(w, sw),
                       tw ? " (transposed)" : "");
  }
  if (b && (b->rank != 1 || b->dims[0] != n || b->dtype != x->dtype))
    return tp_error_op(c->d, c->m, c->op, "B must be a vector of %lld %s", (long long)n, tp_dtype_name(x->dtype));
  *y = *x;
  y->dims[y->rank - 1] = n;
  y->dimnames[y->rank - 1] = w->dimnames[tw ? 0 : 1];
  return TP_OK;
}

static int infer_linear(const Ctx *c) {
  TpType y;
  return linear_type(c, operand(c, 0), operand(c, 1), operand(c, 2), &y) || set_result(c, 0, y) ? TP_ERR_INPUT : TP_OK;
}

static int check_grad(const Ctx *c, const TpType *dy, const TpType *want);

enum { MAX_VOCAB_PARTS = 1 << 20 }; /* as @shard's parts */

/* A vocabulary-parallel op's Part operand i (an i64 scalar: TensorRank's) and its
 * vocab_parts attribute (when `parts`: >= 1, in *parts). */
static int check_vocab_part(const Ctx *c, int i, int64_t *parts) {
  const TpType *part = operand(c, i);
  if (part->dtype != TP_I64 || part->rank != 0)
    return tp_error_op(c->d, c->m, c->op, "Part must be an i64 scalar (the tensor rank)");
  if (!parts) return TP_OK;
  *parts = tp_attr_int(c->m, c->op, "vocab_parts", 0);
  if (*parts < 1 || *parts > MAX_VOCAB_PARTS)
    return tp_error_op(c->d, c->m, c->op, "vocab_parts must be in [1, %d] with a Part operand", MAX_VOCAB_PARTS);
  return TP_OK;
}

static int infer_embedding(const Ctx *c) {
  const TpType *w = operand(c, 0);
  if (w->rank != 2) return tp_error_op(c->d, c->m, c->op, "the table must be [V, C]");
  int64_t parts;
  if (operand(c, 2) ? check_vocab_part(c, 2, &parts) : tp_get_attr(c->m, c->op, "vocab_parts") != NULL)
    return operand(c, 2) ? TP_ERR_INPUT : tp_error_op(c->d, c->m, c->op, "vocab_parts needs a Part operand");
  if (operand(c, 2) && tp_get_attr(c->m, c->op, "padding_idx")) /* the range kernels skip no row */
    return tp_error_op(c->d, c->m, c->op, "a vocabulary-split embedding has no padding_idx (shard-tensor keeps one whole)");
  TpType t;
  return gather_type(c, w, operand(c, 1), 0, &t) || set_result(c, 0, t) ? TP_ERR_INPUT : TP_OK;
}

static int infer_tensor_rank(const Ctx *c) {
  if (!tp_get_attr(c->m, c->op, "group")) return tp_error_op(c->d, c->m, c->op, "TensorRank needs its group attribute");
  return set_result(c, 0, (TpType){.dtype = TP_I64});
}

static int infer_embedding_backward(const Ctx *c) {
  const TpType *w = preset(c, 0);
  int64_t parts;
  TpType y;
  if (!w || check_vocab_part(c, 2, &parts)) return TP_ERR_INPUT;
  if (w->rank != 2) return tp_error_op(c->d, c->m, c->op, "the table must be [V, C]");
  if (gather_type(c, w, operand(c, 1), 0, &y)) return TP_ERR_INPUT;
  return check_grad(c, operand(c, 0), &y);
}

/* Logits [..., V] and Targets [...] with the same leading dims. */
static int check_logits_targets(const Ctx *c, const TpType *logits, const TpType *targets) {
  if (need_float(c, logits, "logits")) return TP_ERR_INPUT;
  bool ok = logits->rank >= 1 && targets->rank == logits->rank - 1 &&
            (targets->dtype == TP_I64 || targets->dtype == TP_I32);
  for (int i = 0; ok && i < targets->rank; i++) ok = targets->dims[i] == logits->dims[i];
  if (!ok) {
    char sl[256], st[256];
    return tp_error_op(c->d, c->m, c->op, "targets %s do not index logits %s", type_str(targets, st),
                       type_str(logits, sl));
  }
  if (tp_attr_float(c->m, c->op, "denominator", 1) <= 0)
    return tp_error_op(c->d, c->m, c->op, "denominator must be positive");
  return TP_OK;
}

/* The statistics CrossEntropyStats computes from logits [..., Vp] over `parts` ranges:
 * [..., 2 parts + 1]. */
static TpType vocab_stats_type(const TpType *logits, int64_t parts) {
  TpType t = *logits;
  t.dims[t.rank - 1] = 2 * parts + 1;
  t.dimnames[t.rank - 1] = NULL;
  return t;
}

/* CrossEntropy's (first = 0) and CrossEntropyBackward's (first = 1) optional Stats and
 * Part, both or neither: Stats as CrossEntropyStats gives them. */
static int check_vocab_stats(const Ctx *c, int first, const TpType *logits) {
  const TpType *stats = operand(c, first + 2), *part = operand(c, first + 3);
  if (!stats && !part) return TP_OK;
  if (!stats || !part) return tp_error_op(c->d, c->m, c->op, "Stats and Part come together");
  if (check_vocab_part(c, first + 3, NULL)) return TP_ERR_INPUT;
  int64_t parts = stats->rank == logits->rank ? (stats->dims[stats->rank - 1] - 1) / 2 : 0;
  TpType want = vocab_stats_type(logits, parts);
  if (parts < 1 || !tp_type_equal(stats, &want)) {
    char ss[256], sl[256];
    return tp_error_op(c->d, c->m, c->op, "Stats %s are not the vocabulary statistics of logits %s",
                       type_str(stats, ss), type_str(logits, sl));
  }
  return TP_OK;
}

static int infer_cross_entropy(const Ctx *c) {
  const TpType *logits = operand(c, 0);
  if (check_logits_targets(c, logits, operand(c, 1)) || check_vocab_stats(c, 0, logits)) return TP_ERR_INPUT;
  return set_result(c, 0, (TpType){.dtype = logits->dtype});
}

static int infer_cross_entropy_stats(const Ctx *c) {
  const TpType *logits = operand(c, 0);
  int64_t parts;
  if (check_logits_targets(c, logits, operand(c, 1)) || check_vocab_part(c, 2, &parts)) return TP_ERR_INPUT;
  if (logits->dtype != TP_F32) return tp_error_op(c->d, c->m, c->op, "the logits must be f32");
  return set_result(c, 0, vocab_stats_type(logits, parts));
}

/* The gradient operand dY must have the type the forward op gave its result. */
static int check_grad(const Ctx *c, const TpType *dy, const TpType *want) {
  if (tp_type_equal(dy, want)) return TP_OK;
  char sd[256], sw[256];
  return tp_error_op(c->d, c->m, c->op, "gradient %s does not match the forward result %s", type_str(dy, sd),
                     type_str(want, sw));
}

static int set_results_like(const Ctx *c, int first, int n) { /* result i typed like operand first+i */
  for (int i = 0; i < n; i++)
    if (set_result(c, i, *operand(c, first + i))) return TP_ERR_INPUT;
  return TP_OK;
}

static int infer_linear_backward(const Ctx *c) {
  const TpType *dy = operand(c, 0), *x = operand(c, 1), *w = operand(c, 2);
  TpType y;
  if (linear_type(c, x, w, NULL, &y) || check_grad(c, dy, &y)) return TP_ERR_INPUT;
  TpType db = {.dtype = w->dtype, .rank = 1, .dims = {y.dims[y.rank - 1]}};
  return set_result(c, 0, *x) || set_result(c, 1, *w) || set_result(c, 2, db) ? TP_ERR_INPUT : TP_OK;
}

static int infer_matmul_backward(const Ctx *c) {
  TpType y;
  if (matmul_type(c, operand(c, 1), operand(c, 2), &y) || check_grad(c, operand(c, 0), &y)) return TP_ERR_INPUT;
  return set_results_like(c, 1, 2);
}

static int infer_gather_backward(const Ctx *c) {
  const TpType *data = preset(c, 0);
  TpType y;
  if (!data) return TP_ERR_INPUT;
  if (gather_type(c, data, operand(c, 1), tp_attr_int(c->m, c->op, "axis", 0), &y)) return TP_ERR_INPUT;
  return check_grad(c, operand(c, 0), &y);
}

static int infer_gather_elements_backward(const Ctx *c) {
  const TpType *data = preset(c, 0);
  TpType y;
  if (!data) return TP_ERR_INPUT;
  if (gather_elements_type(c, data, operand(c, 1), tp_attr_int(c->m, c->op, "axis", 0), &y)) return TP_ERR_INPUT;
  return check_grad(c, operand(c, 0), &y);
}

static int infer_slice_backward(const Ctx *c) {
  const TpType *x = preset(c, 0), *dy = operand(c, 0);
  if (!x) return TP_ERR_INPUT;
  int ns, nt;
  const int64_t *starts = tp_attr_ints(c->m, c->op, "starts", &ns), *steps = tp_attr_ints(c->m, c->op, "steps", &nt);
  if (ns != x->rank || nt != x->rank || dy->rank != x->rank || dy->dtype != x->dtype)
    return tp_error_op(c->d, c->m, c->op, "starts, steps and gradient must have the result's rank %d", x->rank);
  for (int i = 0; i < x->rank; i++) {
    if (steps[i] == 0 || !tp_slice_fits(starts[i], steps[i], dy->dims[i], x->dims[i]))
      return tp_error_op(c->d, c->m, c->op, "slice of dim %d leaves [0, %lld)", i, (long long)x->dims[i]);
  }
  return TP_OK;
}

static int infer_layernorm_backward(const Ctx *c) {
  const TpType *dy = operand(c, 0), *x = operand(c, 1), *scale = operand(c, 2);
  const TpType *mean = operand(c, 3), *invstd = operand(c, 4);
  int64_t axis = tp_attr_int(c->m, c->op, "axis", -1);
  if (need_float(c, x, "X") || check_axis(c, axis, x->rank, "axis") || check_grad(c, dy, x)) return TP_ERR_INPUT;
  TpType stat = *x;
  stat.dtype = TP_F32;
  for (int i = (int)axis; i < x->rank; i++) stat.dims[i] = 1;
  if (!tp_type_equal(mean, &stat) || !tp_type_equal(invstd, &stat))
    return tp_error_op(c->d, c->m, c->op, "Mean and InvStdDev must be the forward LayerNorm's statistics");
  return set_result(c, 0, *x) || set_result(c, 1, *scale) || set_result(c, 2, *scale) ? TP_ERR_INPUT : TP_OK;
}

static int infer_unary_backward(const Ctx *c) { /* dY and the forward operand or result */
  const TpType *dy = operand(c, 0), *x = operand(c, 1);
  if (need_float(c, x, "the operand") || check_grad(c, dy, x)) return TP_ERR_INPUT;
  if ((c->m->ops[c->op].kind == TP_OP_SoftmaxBackward || c->m->ops[c->op].kind == TP_OP_LogSoftmaxBackward) &&
      check_axis(c, tp_attr_int(c->m, c->op, "axis", -1), x->rank, "axis"))
    return TP_ERR_INPUT;
  return set_result(c, 0, *x);
}

static int infer_attention_backward(const Ctx *c) {
  const TpType *dy = operand(c, 0), *q = operand(c, 1), *k = operand(c, 2), *v = operand(c, 3);
  if (need_float(c, q, "Q") || same_dtype(c, q, k) || same_dtype(c, q, v)) return TP_ERR_INPUT;
  if (q->rank != k->rank || q->rank != v->rank || (q->rank != 3 && q->rank != 4))
    return tp_error_op(c->d, c->m, c->op, "Q, K and V must all be 3-D or all 4-D");
  TpType y = *q; /* [B, H, S, Dv] or [B, S, H*Dv] */
  if (q->rank == 4) {
    if (k->dims[3] != q->dims[3] || k->dims[1] <= 0 || q->dims[1] % k->dims[1] || v->dims[1] != k->dims[1] || v->dims[2] != k->dims[2])
      return tp_error_op(c->d, c->m, c->op, "K and V do not match Q's heads or head size");
    y.dims[3] = v->dims[3];
  } else {
    int64_t hq = tp_attr_int(c->m, c->op, "q_num_heads", 0), hkv = tp_attr_int(c->m, c->op, "kv_num_heads", 0);
    if (hq <= 0 || hkv <= 0 || hq % hkv || q->dims[2] % hq || k->dims[2] % hkv || v->dims[2] % hkv ||
        k->dims[2] / hkv != q->dims[2] / hq || v->dims[1] != k->dims[1])
      return tp_error_op(c->d, c->m, c->op, "3-D operands need matching q_num_heads and kv_num_heads");
    int64_t dv = v->dims[2] / hkv;
    if (dv && hq > INT64_MAX / dv) return tp_error_op(c->d, c->m, c->op, "q_num_heads %lld is too large", (long long)hq);
    y.dims[2] = hq * dv;
  }
  if (k->dims[0] != q->dims[0] || v->dims[0] != q->dims[0])
    return tp_error_op(c->d, c->m, c->op, "batch sizes differ");
  if (check_grad(c, dy, &y) || check_causal_attrs(c)) return TP_ERR_INPUT;
  const TpType *mask = operand(c, 4);
  int seq = q->rank == 4 ? 2 : 1;
  int64_t heads = q->rank == 4 ? q->dims[1] : tp_attr_int(c->m, c->op, "q_num_heads", 0);
  if (mask && check_attention_mask(c, mask, q->dtype, q->dims[0], heads, q->dims[seq], k->dims[seq]))
    return TP_ERR_INPUT;
  return set_results_like(c, 1, 3);
}

static int infer_cross_entropy_backward(const Ctx *c) {
  const TpType *dloss = operand(c, 0), *logits = operand(c, 1);
  if (dloss->rank != 0 || dloss->dtype != logits->dtype)
    return tp_error_op(c->d, c->m, c->op, "dLoss must be a scalar of the logits' dtype");
  if (check_logits_targets(c, logits, operand(c, 2)) || check_vocab_stats(c, 1, logits)) return TP_ERR_INPUT;
  return set_result(c, 0, *logits);
}

/* ---- the fused ops of modern blocks: RMSNorm, Rotary, SwiGLU, GeGLU and their backward ---- */

/* RMSNorm(X, Scale) and RMSNormBackward's X and Scale: Scale has the normalised shape. */
static int rmsnorm_operands(const Ctx *c, const TpType *x, const TpType *scale) {
  int64_t axis = tp_attr_int(c->m, c->op, "axis", -1);
  if (need_float(c, x, "X") || check_axis(c, axis, x->rank, "axis") || same_dtype(c, x, scale)) return TP_ERR_INPUT;
  if (tp_attr_float(c->m, c->op, "epsilon", 0) < 0) return tp_error_op(c->d, c->m, c->op, "epsilon must not be negative");
  TpType norm = {.dtype = x->dtype, .rank = x->rank - (int)axis};
  memcpy(norm.dims, x->dims + axis, (size_t)norm.rank * sizeof norm.dims[0]);
  if (!tp_type_equal(scale, &norm)) return tp_error_op(c->d, c->m, c->op, "Scale must have the normalised shape of X");
  return TP_OK;
}

static int infer_rmsnorm(const Ctx *c) {
  if (rmsnorm_operands(c, operand(c, 0), operand(c, 1))) return TP_ERR_INPUT;
  return set_result(c, 0, *operand(c, 0));
}

static int infer_rmsnorm_backward(const Ctx *c) {
  const TpType *dy = operand(c, 0), *x = operand(c, 1);
  if (rmsnorm_operands(c, x, operand(c, 2)) || check_grad(c, dy, x)) return TP_ERR_INPUT;
  return set_results_like(c, 1, 2);
}

/* Rotary's (or RotaryBackward's) tables against X (or dY): one shape, X's rank, last dim
 * rotary_dim, the other dims 1 or X's. */
static int rotary_operands(const Ctx *c, const TpType *x, const TpType *cos, const TpType *sin) {
  int64_t rd = tp_attr_int(c->m, c->op, "rotary_dim", 0);
  if (need_float(c, x, "X") || same_dtype(c, x, cos) || same_dtype(c, x, sin)) return TP_ERR_INPUT;
  if (x->rank < 1 || rd <= 0 || rd % 2 || rd > x->dims[x->rank - 1])
    return tp_error_op(c->d, c->m, c->op, "rotary_dim %lld must be even, positive and at most X's last dim",
                       (long long)rd);
  if (!tp_type_equal(cos, sin)) return tp_error_op(c->d, c->m, c->op, "Cos and Sin must have one shape");
  for (int t = 0; t < 2; t++) {
    const TpType *table = t ? sin : cos;
    bool ok = table->rank == x->rank && table->dims[x->rank - 1] == rd;
    for (int k = 0; ok && k < x->rank - 1; k++) ok = table->dims[k] == 1 || table->dims[k] == x->dims[k];
    if (!ok)
      return tp_error_op(c->d, c->m, c->op, "%s must have X's rank, last dim rotary_dim and other dims 1 or X's",
                         t ? "Sin" : "Cos");
  }
  return TP_OK;
}

static int infer_rotary(const Ctx *c) {
  const TpType *x = operand(c, 0);
  if (rotary_operands(c, x, operand(c, 1), operand(c, 2))) return TP_ERR_INPUT;
  return set_result(c, 0, *x);
}

static int infer_rotary_backward(const Ctx *c) {
  const TpType *dy = operand(c, 0);
  if (rotary_operands(c, dy, operand(c, 1), operand(c, 2))) return TP_ERR_INPUT;
  return set_result(c, 0, *dy);
}

/* SwiGLU and GeGLU (one rule: Gate and Up of one float shape), and their backward. */
static int infer_swiglu(const Ctx *c) {
  const TpType *gate = operand(c, 0), *up = operand(c, 1);
  if (need_float(c, gate, "Gate") || same_dtype(c, gate, up)) return TP_ERR_INPUT;
  if (!tp_type_equal(gate, up)) return tp_error_op(c->d, c->m, c->op, "Gate and Up must have one shape");
  return set_result(c, 0, *gate);
}

static int infer_swiglu_backward(const Ctx *c) {
  const TpType *dy = operand(c, 0), *gate = operand(c, 1), *up = operand(c, 2);
  if (need_float(c, gate, "Gate") || same_dtype(c, gate, up)) return TP_ERR_INPUT;
  if (!tp_type_equal(gate, up)) return tp_error_op(c->d, c->m, c->op, "Gate and Up must have one shape");
  if (check_grad(c, dy, gate)) return TP_ERR_INPUT;
  return set_results_like(c, 1, 2);
}

/* AllReduce and TensorCopy: a float operand, the result of its type; the group is named. */
static int infer_collective(const Ctx *c) {
  const TpType *x = operand(c, 0);
  if (need_float(c, x, "X")) return TP_ERR_INPUT;
  if (!tp_get_attr(c->m, c->op, "group"))
    return tp_error_op(c->d, c->m, c->op, "a collective needs its group attribute");
  return set_result(c, 0, *x);
}

int tp_infer_op(TpModule *m, int op, TpDiag *d) {
  Ctx c = {m, op, d};
  const TpOp *o = &m->ops[op];
  const TpOpInfo *info = &tp_op_info[o->kind];
  if (o->ninputs < info->min_inputs || o->ninputs > info->max_inputs || o->noutputs < info->min_outputs ||
      o->noutputs > info->max_outputs)
    return tp_error_op(d, m, op, "%d operands and %d results; %s takes %d-%d and %d-%d", o->ninputs,
                       o->noutputs, info->name, info->min_inputs, info->max_inputs, info->min_outputs,
                       info->max_outputs);
  for (int i = 0; i < info->min_inputs; i++)
    if (o->inputs[i] < 0) return tp_error_op(d, m, op, "required operand %d is absent", i);
  if (o->outputs[0] < 0) return tp_error_op(d, m, op, "the first result must be present");

  switch (o->kind) {
  case TP_OP_Where: return infer_where(&c);
  case TP_OP_Cast: return infer_cast(&c);
  case TP_OP_MatMul: return infer_matmul(&c);
  case TP_OP_Gemm: return infer_gemm(&c);
  case TP_OP_Gather: return infer_gather(&c);
  case TP_OP_GatherElements: return infer_gather_elements(&c);
  case TP_OP_Tile: return infer_tile(&c);
  case TP_OP_CumSum: return infer_cumsum(&c);
  case TP_OP_TopK: return infer_topk(&c);
  case TP_OP_Reshape: return infer_reshape(&c);
  case TP_OP_Expand: return infer_expand(&c);
  case TP_OP_Transpose: return infer_transpose(&c);
  case TP_OP_Split: return infer_split(&c);
  case TP_OP_Slice: return infer_slice(&c);
  case TP_OP_Concat: return infer_concat(&c);
  case TP_OP_Trilu: return infer_same_type(&c, 2);
  case TP_OP_Softmax:
  case TP_OP_LogSoftmax: return infer_softmax(&c);
  case TP_OP_ReduceMean:
  case TP_OP_ReduceSum: return infer_reduce(&c);
  case TP_OP_LayerNorm: return infer_layernorm(&c);
  case TP_OP_Attention: return infer_attention(&c);
  case TP_OP_SoftmaxCrossEntropyLoss:
  case TP_OP_NegativeLogLikelihoodLoss: return infer_loss(&c);
  case TP_OP_Linear: return infer_linear(&c);
  case TP_OP_Embedding: return infer_embedding(&c);
  case TP_OP_CrossEntropy: return infer_cross_entropy(&c);
  case TP_OP_LinearBackward: return infer_linear_backward(&c);
  case TP_OP_MatMulBackward: return infer_matmul_backward(&c);
  case TP_OP_GatherBackward: return infer_gather_backward(&c);
  case TP_OP_GatherElementsBackward: return infer_gather_elements_backward(&c);
  case TP_OP_SliceBackward: return infer_slice_backward(&c);
  case TP_OP_LayerNormBackward: return infer_layernorm_backward(&c);
  case TP_OP_GeluBackward:
  case TP_OP_SoftmaxBackward:
  case TP_OP_LogSoftmaxBackward: return infer_unary_backward(&c);
  case TP_OP_AttentionBackward: return infer_attention_backward(&c);
  case TP_OP_CrossEntropyBackward: return infer_cross_entropy_backward(&c);
  case TP_OP_RMSNorm: return infer_rmsnorm(&c);
  case TP_OP_RMSNormBackward: return infer_rmsnorm_backward(&c);
  case TP_OP_Rotary: return infer_rotary(&c);
  case TP_OP_RotaryBackward: return infer_rotary_backward(&c);
  case TP_OP_SwiGLU:
  case TP_OP_GeGLU: return infer_swiglu(&c);
  case TP_OP_SwiGLUBackward:
  case TP_OP_GeGLUBackward: return infer_swiglu_backward(&c);
  case TP_OP_AllReduce:
  case TP_OP_TensorCopy: return infer_collective(&c);
  case TP_OP_TensorRank: return infer_tensor_rank(&c);
  case TP_OP_EmbeddingBackward: return infer_embedding_backward(&c);
  case TP_OP_CrossEntropyStats: return infer_cross_entropy_stats(&c);
  default:
    TP_ASSERT(info->traits & TP_TRAIT_ELEMENTWISE);
    return infer_elementwise(&c, o->kind);
  }
}
