#include "check.h"

#include <string.h>

#include "scalar.h"

static bool same_dims(const TpTensor *a, const TpTensor *b) {
  return a->rank == b->rank && memcmp(a->dims, b->dims, (size_t)a->rank * sizeof a->dims[0]) == 0;
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

TpKernelStatus tp_check_matmul_shape(const TpTensor *a, const TpTensor *b, const TpTensor *y, TpMatmulLayout *l) {
  if (!tp_matmul_layout(a, b, l) || tp_tensor_numel(y) != l->nbatch * l->M * l->N) return TP_KERNEL_BAD_SHAPE;
  return TP_KERNEL_OK;
}

TpKernelStatus tp_check_matmul_backward(const TpTensor *dy, const TpTensor *a, const TpTensor *b,
                                        const TpTensor *da, const TpTensor *db, TpMatmulLayout *l) {
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
