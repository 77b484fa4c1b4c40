#include "layout_backward.h"

#include <string.h>

#include "../kernels/check.h"

#include "layout.h"

#define PARALLEL_MIN_ELEMS 32768
/* Columns per task of the scatter-add: each task owns its columns of ddata. */
#define COLUMN_BLOCK 64

static int64_t load_index(const TpTensor *t, int64_t i) {
  return t->dtype == TP_I64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
}

TpKernelStatus tp_gather_backward(const TpTensor *dy, const TpTensor *indices, int axis, int64_t padding_idx,
                                  TpTensor *ddata, int64_t *bad) {
  if (indices->dtype != TP_I64 && indices->dtype != TP_I32) return TP_KERNEL_BAD_DTYPE;
  if (dy->dtype != TP_F32 || ddata->dtype != TP_F32) return TP_KERNEL_BAD_DTYPE;
  TpKernelStatus status = tp_gather_check(ddata->rank, ddata->dims, indices, axis, dy, bad);
  if (status != TP_KERNEL_OK) return status;
  int64_t outer = tp_numel(axis, ddata->dims), n = ddata->dims[axis];
  int64_t inner = tp_numel(ddata->rank - axis - 1, ddata->dims + axis + 1);
  int64_t nidx = tp_tensor_numel(indices);
  const float *g = dy->data;
  float *out = ddata->data;
  int64_t nblocks = (inner + COLUMN_BLOCK - 1) / COLUMN_BLOCK, tasks = outer * nblocks;
#pragma omp parallel for schedule(static) if ((nidx + n) * outer * inner >= PARALLEL_MIN_ELEMS)
  for (int64_t t = 0; t < tasks; t++) {
    int64_t o = t / nblocks, c0 = t % nblocks * COLUMN_BLOCK;
    int64_t w = inner - c0 < COLUMN_BLOCK ? inner - c0 : COLUMN_BLOCK;
    float *dst = out + o * n * inner + c0;
    const float *src = g + o * nidx * inner + c0;
    for (int64_t r = 0; r < n; r++) memset(dst + r * inner, 0, (size_t)w * sizeof *dst);
    for (int64_t j = 0; j < nidx; j++) {
      int64_t ix = load_index(indices, j);
      if (ix < 0) ix += n;
      if (ix == padding_idx) continue;
      float *d = dst + ix * inner;
      const float *s = src + j * inner;
#pragma omp simd
      for (int64_t c = 0; c < w; c++) d[c] += s[c];
    }
  }
  return TP_KERNEL_OK;
}

TpKernelStatus tp_gather_elements_backward(const TpTensor *dy, const TpTensor *indices, int axis, TpTensor *ddata,
                                           int64_t *bad) {
  if (dy->dtype != TP_F32 || ddata->dtype != TP_F32) return TP_KERNEL_BAD_DTYPE;
  TpKernelStatus s = tp_gather_elements_check(ddata->rank, ddata->dims, indices, axis, dy, bad);
  if (s != TP_KERNEL_OK) return s;
  int rank = ddata->rank;
  int64_t n = ddata->dims[axis], total = tp_tensor_numel(indices);
  int64_t ds[TP_MAX_RANK], idx[TP_MAX_RANK] = {0};
  tp_contiguous_strides(rank, ddata->dims, 1, ds);
  float *out = ddata->data;
  const float *g = dy->data;
  if (tp_tensor_bytes(ddata)) memset(out, 0, tp_tensor_bytes(ddata));
  for (int64_t j = 0; j < total; j++) { /* idx: the multi-index of element j of indices */
    int64_t ix = load_index(indices, j), dst = 0;
    if (ix < 0) ix += n;
    for (int d = 0; d < rank; d++) dst += (d == axis ? ix : idx[d]) * ds[d];
    out[dst] += g[j];
    for (int d = rank - 1; d >= 0 && ++idx[d] == indices->dims[d]; d--) idx[d] = 0;
  }
  return TP_KERNEL_OK;
}

TpKernelStatus tp_slice_backward(const TpTensor *dy, const int64_t *starts, const int64_t *steps, TpTensor *dx) {
  TpKernelStatus s = tp_check_slice(dx, starts, steps, dy);
  if (s != TP_KERNEL_OK) return s;
  size_t es = tp_dtype_size(dx->dtype);
  int64_t xs[TP_MAX_RANK], start = 0;
  tp_contiguous_strides(dx->rank, dx->dims, es, xs);
  TpIter it = {.rank = dy->rank, .noperands = 2};
  memcpy(it.dims, dy->dims, sizeof it.dims);
  tp_contiguous_strides(dy->rank, dy->dims, es, it.strides[1]);
  for (int d = 0; d < dy->rank; d++) {
    if (dy->dims[d] == 0) continue;
    start += starts[d] * xs[d];
    it.strides[0][d] = dy->dims[d] > 1 ? steps[d] * xs[d] : 0; /* fits: (n-1)*|step| < dim */
  }
  if (tp_tensor_bytes(dx)) memset(dx->data, 0, tp_tensor_bytes(dx));
  if (tp_tensor_numel(dy) == 0) return TP_KERNEL_OK;
  tp_iter_coalesce(&it);
  tp_iter_run(&it, (char *const[]){(char *)dx->data + start, dy->data}, tp_copy_run, &es);
  return TP_KERNEL_OK;
}
