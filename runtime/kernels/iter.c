#include "iter.h"

#include <string.h>

void tp_contiguous_strides(int rank, const int64_t *dims, size_t elsize, int64_t *strides) {
  int64_t s = (int64_t)elsize;
  for (int d = rank - 1; d >= 0; d--) {
    strides[d] = s;
    s *= dims[d];
  }
}

bool tp_iter_broadcast(TpIter *it, int noperands, const TpTensor *const ops[]) {
  const TpTensor *out = ops[0];
  if (noperands > TP_ITER_MAX_OPERANDS) return false;
  it->rank = out->rank;
  it->noperands = noperands;
  memcpy(it->dims, out->dims, sizeof it->dims);
  tp_contiguous_strides(out->rank, out->dims, tp_dtype_size(out->dtype), it->strides[0]);
  for (int k = 1; k < noperands; k++) {
    const TpTensor *t = ops[k];
    int64_t s[TP_MAX_RANK];
    int lead = out->rank - t->rank;
    if (lead < 0) return false;
    tp_contiguous_strides(t->rank, t->dims, tp_dtype_size(t->dtype), s);
    for (int d = 0; d < out->rank; d++) {
      int64_t td = d < lead ? 1 : t->dims[d - lead];
      if (td == out->dims[d]) it->strides[k][d] = d < lead ? 0 : s[d - lead];
      else if (td == 1) it->strides[k][d] = 0;
      else return false;
    }
  }
  return true;
}

void tp_iter_coalesce(TpIter *it) {
  int r = 0;
  for (int d = 0; d < it->rank; d++) {
    if (it->dims[d] == 1) continue;
    bool merge = r > 0;
    for (int k = 0; k < it->noperands && merge; k++)
      merge = it->strides[k][r - 1] == it->strides[k][d] * it->dims[d];
    if (merge) {
      it->dims[r - 1] *= it->dims[d];
      for (int k = 0; k < it->noperands; k++) it->strides[k][r - 1] = it->strides[k][d];
      continue;
    }
    it->dims[r] = it->dims[d];
    for (int k = 0; k < it->noperands; k++) it->strides[k][r] = it->strides[k][d];
    r++;
  }
  it->rank = r;
}

/* Runs over the flat index range [begin, end). Offsets are kept as integers so no pointer
 * ever points outside its tensor. */
