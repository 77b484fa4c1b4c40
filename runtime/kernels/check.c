#include "check.h"

#include <string.h>

#include "scalar.h"

static bool same_dims(const TpTensor *a, const TpTensor *b) {
  return a->rank == b->rank && memcmp(a->dims, b->dims, (size_t)a->rank * sizeof a->dims[0]) == 0;
}

TpKernelStatus tp_check_vocab_pad(int64_t V, int64_t pad) {
  return pad < 0 || (pad > 0 && pad >= V) ? TP_KERNEL_BAD_SHAPE : TP_KERNEL_OK;
}

TpKernelStatus tp_check_unary(TpUnaryOp op, const TpTensor *x, const TpTensor *y) {
  if (!tp_unary_dtype_ok(op, x->dtype) || y->dtype != x->dtype) return TP_KERNEL_BAD_DTYPE;
  if (!same_dims(x, y)) return TP_KERNEL_BAD_SHAPE;
  return TP_KERNEL_OK;
}

TpKernelStatus tp_check_cast(const TpTensor *x, const TpTensor *y) {
  if (tp_dclass(x->dtype) == TP_CLASS_NONE || tp_dclass(y->dtype) == TP_CLASS_NONE) return TP_KERNEL_BAD_DTYPE;
  if (!same_dims(x, y)) return TP_KERNEL_BAD_SHAPE;
  return TP_KERNEL_OK;
}

TpKernelStatus tp_check_reshape(const TpTensor *x, const TpTensor *y) {
  if (x->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  if (tp_tensor_numel(x) != tp_tensor_numel(y)) return TP_KERNEL_BAD_SHAPE;
  return TP_KERNEL_OK;
}

TpKernelStatus tp_check_tile(const TpTensor *x, const TpTensor *y) {
  if (x->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  if (x->rank != y->rank) return TP_KERNEL_BAD_SHAPE;
  for (int d = 0; d < x->rank; d++)
    if (x->dims[d] ? y->dims[d] % x->dims[d] : y->dims[d]) return TP_KERNEL_BAD_SHAPE;
  return TP_KERNEL_OK;
}

TpKernelStatus tp_check_slice(const TpTensor *whole, const int64_t *starts, const int64_t *steps,
                              const TpTensor *slice) {
  if (whole->dtype != slice->dtype) return TP_KERNEL_BAD_DTYPE;
  if (whole->rank != slice->rank) return TP_KERNEL_BAD_SHAPE;
  for (int d = 0; d < whole->rank; d++)
    if (!tp_slice_fits(starts[d], steps[d], slice->dims[d], whole->dims[d])) return TP_KERNEL_BAD_SHAPE;
  return TP_KERNEL_OK;
}

/* ---- indices ---- */

/* Every index in [-n, n) (bad NULL: not read, they may be on a device), or the first one
 * outside into *bad: checked first, so that the copies cannot fail. */
static TpKernelStatus check_indices(const TpTensor *indices, int64_t n, int64_t *bad) {
  int64_t total = tp_tensor_numel(indices);
  for (int64_t j = 0; bad && j < total; j++)
    if (tp_index_at(indices, j) < -n || tp_index_at(indices, j) >= n) {
      *bad = tp_index_at(indices, j);
      return TP_KERNEL_BAD_INDEX;
    }
  return TP_KERNEL_OK;
}

TpKernelStatus tp_gather_check(int rank, const int64_t *data_dims, const TpTensor *indices, int axis,
                               const TpTensor *y, int64_t *bad) {
  if (indices->dtype != TP_I64 && indices->dtype != TP_I32) return TP_KERNEL_BAD_DTYPE;
  if (axis < 0 || axis >= rank || y->rank != rank - 1 + indices->rank) return TP_KERNEL_BAD_SHAPE;
  for (int d = 0; d < y->rank; d++) {
    int64_t want = d < axis                   ? data_dims[d]
                   : d < axis + indices->rank ? indices->dims[d - axis]
                                              : data_dims[d - indices->rank + 1];
    if (y->dims[d] != want) return TP_KERNEL_BAD_SHAPE;
  }
  return check_indices(indices, data_dims[axis], bad);
}

TpKernelStatus tp_gather_elements_check(int rank, const int64_t *data_dims, const TpTensor *indices, int axis,
                                        const TpTensor *y, int64_t *bad) {
  if (indices->dtype != TP_I64 && indices->dtype != TP_I32) return TP_KERNEL_BAD_DTYPE;
  if (axis < 0 || axis >= rank || indices->rank != rank || y->rank != rank) return TP_KERNEL_BAD_SHAPE;
  for (int d = 0; d < rank; d++)
    if (y->dims[d] != indices->dims[d] || (d != axis && indices->dims[d] > data_dims[d])) return TP_KERNEL_BAD_SHAPE;
  return check_indices(indices, data_dims[axis], bad);
}

/* ---- layout, TopK ---- */

TpKernelStatus tp_pieces_check(const TpTensor *whole, const TpTensor *pieces, int n, int axis) {
  if (axis < 0 || axis >= whole->rank) return TP_KERNEL_BAD_SHAPE;
  int64_t along = 0;
  for (int k = 0; k < n; k++) {
    const TpTensor *p = &pieces[k];
    if (p->dtype != whole->dtype) return TP_KERNEL_BAD_DTYPE;
    if (p->rank != whole->rank) return TP_KERNEL_BAD_SHAPE;
    for (int d = 0; d < whole->rank; d++)
      if (d != axis && p->dims[d] != whole->dims[d]) return TP_KERNEL_BAD_SHAPE;
    along += p->dims[axis];
  }
  return along == whole->dims[axis] ? TP_KERNEL_OK : TP_KERNEL_BAD_SHAPE;
}

TpKernelStatus tp_topk_check(const TpTensor *x, int axis, const TpTensor *y) {
  TpDClass c = tp_dclass(x->dtype);
  if (c == TP_CLASS_BOOL || c == TP_CLASS_NONE || y->dtype != TP_I64) return TP_KERNEL_BAD_DTYPE;
  if (axis < 0 || axis >= x->rank || x->rank != y->rank || y->dims[axis] > x->dims[axis]) return TP_KERNEL_BAD_SHAPE;
  for (int d = 0; d < x->rank; d++)
    if (d != axis && x->dims[d] != y->dims[d]) return TP_KERNEL_BAD_SHAPE;
  return TP_KERNEL_OK;
}

bool tp_matmul_layout(const TpTensor *a, const TpTensor *b, TpMatmulLayout *l) {
  if (a->rank < 1 || b->rank < 1) return false;
  l->M = a->rank >= 2 ? a->dims[a->rank - 2] : 1;
  l->K = a->dims[a->rank - 1];
  l->N = b->rank >= 2 ? b->dims[b->rank - 1] : 1;
  if (l->K != (b->rank >= 2 ? b->dims[b->rank - 2] : b->dims[0])) return false;
  int ra = a->rank > 2 ? a->rank - 2 : 0, rb = b->rank > 2 ? b->rank - 2 : 0;
  l->rank = ra > rb ? ra : rb;
  l->nbatch = l->na = l->nb = 1;
  for (int i = l->rank - 1; i >= 0; i--) {
    int ia = i - (l->rank - ra), ib = i - (l->rank - rb);
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    if (da != db && da != 1 && db != 1) return false;
    l->dims[i] = da == 1 ? db : da;
    l->sa[i] = da == 1 ? 0 : l->na;
    l->sb[i] = db == 1 ? 0 : l->nb;
    l->na *= da;
    l->nb *= db;
    l->nbatch *= l->dims[i];
  }
  return true;
}

void tp_matmul_operands(const TpMatmulLayout *l, int64_t n, int64_t *ia, int64_t *ib) {
  *ia = *ib = 0;
  for (int i = l->rank - 1; i >= 0; i--) {
    int64_t idx = n % l->dims[i];
    n /= l->dims[i];
    *ia += idx * l->sa[i];
    *ib += idx * l->sb[i];
  }
}

TpKernelStatus tp_check_matmul_shape(const TpTensor *a, const TpTensor *b, const TpTensor *y, TpMatmulLayout *l) {
  if (!tp_matmul_layout(a, b, l) || tp_tensor_numel(y) != l->nbatch * l->M * l->N) return TP_KERNEL_BAD_SHAPE;
  return TP_KERNEL_OK;
}

TpKernelStatus tp_check_matmul_backward(const TpTensor *dy, const TpTensor *a, const TpTensor *b, const TpTensor *da,
                                        const TpTensor *db, TpMatmulLayout *l) {
  if (dy->dtype != TP_F32 || a->dtype != TP_F32 || b->dtype != TP_F32) return TP_KERNEL_BAD_DTYPE;
  if ((da && da->dtype != TP_F32) || (db && db->dtype != TP_F32)) return TP_KERNEL_BAD_DTYPE;
  if ((da && tp_tensor_numel(da) != tp_tensor_numel(a)) || (db && tp_tensor_numel(db) != tp_tensor_numel(b)))
    return TP_KERNEL_BAD_SHAPE;
  return tp_check_matmul_shape(a, b, dy, l);
}

TpKernelStatus tp_check_gemm_shape(const TpTensor *a, const TpTensor *b, const TpTensor *c, bool trans_a,
                                   bool trans_b, double beta, const TpTensor *y, TpGemmShape *g) {
  if (a->rank != 2 || b->rank != 2 || y->rank != 2 || (c && c->rank > 2)) return TP_KERNEL_BAD_SHAPE;
  int64_t M = trans_a ? a->dims[1] : a->dims[0], K = trans_a ? a->dims[0] : a->dims[1];
  int64_t Kb = trans_b ? b->dims[1] : b->dims[0], N = trans_b ? b->dims[0] : b->dims[1];
  if (K != Kb || y->dims[0] != M || y->dims[1] != N) return TP_KERNEL_BAD_SHAPE;
  *g = (TpGemmShape){.M = M, .K = K, .N = N, .cm = 1, .cn = 1, .with_c = c && beta != 0};
  if (g->with_c) {
    g->cm = c->rank == 2 ? c->dims[0] : 1, g->cn = c->rank >= 1 ? c->dims[c->rank - 1] : 1;
    if ((g->cm != 1 && g->cm != M) || (g->cn != 1 && g->cn != N)) return TP_KERNEL_BAD_SHAPE;
  }
  return TP_KERNEL_OK;
}
