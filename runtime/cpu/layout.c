#include "layout.h"

#include <string.h>

#include "../kernels/check.h"

#define PARALLEL_BYTES ((int64_t)1 << 17) /* below this, copying is not worth threads */

static int64_t prod(const int64_t *dims, int from, int to) { return tp_numel(to - from, dims + from); }

/* Copies n elements of size es between strided runs. */
#define COPY_LOOP(ES)                                                                                               \
  for (int64_t i = 0; i < n; i++) memcpy(p[0] + i * step[0], p[1] + i * step[1], ES)

void tp_copy_run(const void *ctx, int64_t n, char *const p[], const int64_t step[]) {
  size_t es = *(const size_t *)ctx;
  if (step[0] == (int64_t)es && step[1] == (int64_t)es) {
    memcpy(p[0], p[1], (size_t)n * es);
    return;
  }
  switch (es) { /* constant sizes let the compiler turn memcpy into a move */
  case 1: COPY_LOOP(1); break;
  case 2: COPY_LOOP(2); break;
  case 4: COPY_LOOP(4); break;
  case 8: COPY_LOOP(8); break;
  default: COPY_LOOP(es); break;
  }
}

/* y (contiguous) = x read with it.strides[1], starting at x's byte offset `start`. */
static void strided_copy(TpIter *it, const TpTensor *x, int64_t start, TpTensor *y) {
  size_t es = tp_dtype_size(y->dtype);
  it->noperands = 2;
  it->rank = y->rank;
  memcpy(it->dims, y->dims, sizeof it->dims);
  tp_contiguous_strides(y->rank, y->dims, es, it->strides[0]);
  tp_iter_coalesce(it);
  tp_iter_run(it, (char *const[]){y->data, (char *)x->data + start}, tp_copy_run, &es);
}

TpKernelStatus tp_gather(const TpTensor *data, const TpTensor *indices, int axis, TpTensor *y, int64_t *bad) {
  if (data->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  TpKernelStatus s = tp_gather_check(data->rank, data->dims, indices, axis, y, bad);
  if (s != TP_KERNEL_OK) return s;
  int64_t outer = prod(data->dims, 0, axis), n = data->dims[axis];
  int64_t nidx = tp_tensor_numel(indices);
  size_t row = (size_t)prod(data->dims, axis + 1, data->rank) * tp_dtype_size(data->dtype);
  const char *src = data->data;
  char *dst = y->data;
  int64_t total = outer * nidx;
#pragma omp parallel for schedule(static) if (total * (int64_t)row > PARALLEL_BYTES)
  for (int64_t r = 0; r < total; r++) {
    int64_t o = r / nidx, j = r % nidx;
    int64_t ix = tp_index_at(indices, j);
    if (ix < 0) ix += n;
    memcpy(dst + (size_t)r * row, src + (size_t)(o * n + ix) * row, row);
  }
  return TP_KERNEL_OK;
}

TpKernelStatus tp_gather_elements(const TpTensor *data, const TpTensor *indices, int axis, TpTensor *y,
                                  int64_t *bad) {
  if (data->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  TpKernelStatus s = tp_gather_elements_check(data->rank, data->dims, indices, axis, y, bad);
  if (s != TP_KERNEL_OK) return s;
  int rank = data->rank;
  int64_t n = data->dims[axis], total = tp_tensor_numel(indices);
  size_t es = tp_dtype_size(data->dtype);
  int64_t ds[TP_MAX_RANK], idx[TP_MAX_RANK] = {0};
  tp_contiguous_strides(rank, data->dims, 1, ds);
  for (int64_t j = 0; j < total; j++) { /* idx: the multi-index of element j of indices */
    int64_t ix = tp_index_at(indices, j), src = 0;
    if (ix < 0) ix += n;
    for (int d = 0; d < rank; d++) src += (d == axis ? ix : idx[d]) * ds[d];
    memcpy((char *)y->data + (size_t)j * es, (const char *)data->data + (size_t)src * es, es);
    for (int d = rank - 1; d >= 0 && ++idx[d] == indices->dims[d]; d--) idx[d] = 0;
  }
  return TP_KERNEL_OK;
}

TpKernelStatus tp_reshape(const TpTensor *x, TpTensor *y) {
  TpKernelStatus s = tp_check_reshape(x, y);
  if (s != TP_KERNEL_OK) return s;
  if (tp_tensor_bytes(x) && x->data != y->data) memcpy(y->data, x->data, tp_tensor_bytes(x));
  return TP_KERNEL_OK;
}

TpKernelStatus tp_expand(const TpTensor *x, TpTensor *y) {
  if (x->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  TpIter it;
  if (!tp_iter_broadcast(&it, 2, (const TpTensor *const[]){y, x})) return TP_KERNEL_BAD_SHAPE;
  tp_iter_coalesce(&it);
  size_t es = tp_dtype_size(y->dtype);
  tp_iter_run(&it, (char *const[]){y->data, x->data}, tp_copy_run, &es);
  return TP_KERNEL_OK;
}

/* Element by element: Tile mostly sees constants (rotary tables), folded at import. */
TpKernelStatus tp_tile(const TpTensor *x, TpTensor *y) {
  TpKernelStatus s = tp_check_tile(x, y);
  if (s != TP_KERNEL_OK) return s;
  size_t es = tp_dtype_size(x->dtype);
  int64_t xs[TP_MAX_RANK];
  tp_contiguous_strides(x->rank, x->dims, es, xs);
  int64_t total = tp_tensor_numel(y), idx[TP_MAX_RANK] = {0};
  for (int64_t j = 0; j < total; j++) {
    int64_t src = 0;
    for (int d = 0; d < x->rank; d++) src += (idx[d] % x->dims[d]) * xs[d];
    memcpy((char *)y->data + (size_t)j * es, (const char *)x->data + src, es);
    for (int d = x->rank - 1; d >= 0 && ++idx[d] == y->dims[d]; d--) idx[d] = 0;
  }
  return TP_KERNEL_OK;
}

TpKernelStatus tp_transpose(const TpTensor *x, const int64_t *perm, TpTensor *y) {
  if (x->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  if (x->rank != y->rank) return TP_KERNEL_BAD_SHAPE;
  int64_t xs[TP_MAX_RANK];
  unsigned seen = 0;
  tp_contiguous_strides(x->rank, x->dims, tp_dtype_size(x->dtype), xs);
  TpIter it;
  for (int d = 0; d < y->rank; d++) {
    int64_t p = perm[d];
    if (p < 0 || p >= x->rank || (seen & (1u << p)) || x->dims[p] != y->dims[d]) return TP_KERNEL_BAD_SHAPE;
    seen |= 1u << p;
    it.strides[1][d] = xs[p];
  }
  strided_copy(&it, x, 0, y);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_slice(const TpTensor *x, const int64_t *starts, const int64_t *steps, TpTensor *y) {
  TpKernelStatus s = tp_check_slice(x, starts, steps, y);
  if (s != TP_KERNEL_OK) return s;
  if (tp_tensor_numel(y) == 0) return TP_KERNEL_OK;
  int64_t xs[TP_MAX_RANK], start = 0;
  tp_contiguous_strides(x->rank, x->dims, tp_dtype_size(x->dtype), xs);
  TpIter it;
  for (int d = 0; d < y->rank; d++) {
    start += starts[d] * xs[d];
    it.strides[1][d] = y->dims[d] > 1 ? steps[d] * xs[d] : 0; /* fits: (n-1)*|step| < dim */
  }
  strided_copy(&it, x, start, y);
  return TP_KERNEL_OK;
}

/* Split and Concat: x viewed as [outer, along, inner]; piece k owns a band of `along`.
 * Copies between the whole and its pieces, in the direction `to_pieces`. */
static void move_pieces(const TpTensor *whole, TpTensor *pieces, int n, int axis, bool to_pieces) {
  int64_t outer = prod(whole->dims, 0, axis);
  size_t inner = (size_t)prod(whole->dims, axis + 1, whole->rank) * tp_dtype_size(whole->dtype);
  size_t whole_row = (size_t)whole->dims[axis] * inner, offset = 0;
  for (int k = 0; k < n; k++) {
    size_t piece_row = (size_t)pieces[k].dims[axis] * inner;
    char *w = (char *)whole->data + offset, *p = pieces[k].data;
    offset += piece_row;
    if (!p || piece_row == 0) continue;
#pragma omp parallel for schedule(static) if (outer * (int64_t)piece_row > PARALLEL_BYTES)
    for (int64_t o = 0; o < outer; o++) {
      if (to_pieces) memcpy(p + o * piece_row, w + o * whole_row, piece_row);
      else memcpy(w + o * whole_row, p + o * piece_row, piece_row);
    }
  }
}

TpKernelStatus tp_split(const TpTensor *x, int axis, TpTensor *ys, int n) {
  TpKernelStatus s = tp_pieces_check(x, ys, n, axis);
  if (s == TP_KERNEL_OK) move_pieces(x, ys, n, axis, true);
  return s;
}

TpKernelStatus tp_concat(const TpTensor *xs, int n, int axis, TpTensor *y) {
  TpKernelStatus s = tp_pieces_check(y, xs, n, axis);
  if (s == TP_KERNEL_OK) move_pieces(y, (TpTensor *)xs, n, axis, false);
  return s;
}

TpKernelStatus tp_context_append(const TpTensor *x, int axis, int64_t at, int64_t rows, void *buffer) {
  if (axis < 0 || axis >= x->rank || at < 0 || at + x->dims[axis] > rows) return TP_KERNEL_BAD_SHAPE;
  int64_t n = x->dims[axis];
  int64_t outer = 1, inner = (int64_t)tp_dtype_size(x->dtype);
  for (int k = 0; k < axis; k++) outer *= x->dims[k];
  for (int k = axis + 1; k < x->rank; k++) inner *= x->dims[k];
  const char *src = x->data;
  char *dst = buffer;
#pragma omp parallel for schedule(static) if (outer * n * inner > PARALLEL_BYTES)
  for (int64_t o = 0; o < outer; o++)
    memcpy(dst + (o * rows + at) * inner, src + o * n * inner, (size_t)(n * inner));
  return TP_KERNEL_OK;
}

TpKernelStatus tp_trilu(const TpTensor *x, bool upper, int64_t k, TpTensor *y) {
  if (x->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  if (x->rank < 2 || x->rank != y->rank || memcmp(x->dims, y->dims, (size_t)x->rank * sizeof x->dims[0]) != 0)
    return TP_KERNEL_BAD_SHAPE;
  int64_t rows = x->dims[x->rank - 2], cols = x->dims[x->rank - 1];
  /* a k beyond the matrix keeps all or nothing, as k = cols or -rows would: clamping keeps
     i + k below overflow for any k */
  k = k > cols ? cols : k < -rows ? -rows : k;
  int64_t total = tp_tensor_numel(x) / (cols ? cols : 1);
  size_t es = tp_dtype_size(x->dtype);
  if (cols == 0) return TP_KERNEL_OK;
#pragma omp parallel for schedule(static) if (total * cols * (int64_t)es > PARALLEL_BYTES)
  for (int64_t r = 0; r < total; r++) {
    int64_t i = r % rows;
    /* kept columns: [i + k, cols) for upper, [0, i + k] for lower */
    int64_t lo = upper ? i + k : 0, hi = upper ? cols : i + k + 1;
    lo = lo < 0 ? 0 : lo > cols ? cols : lo;
    hi = hi < lo ? lo : hi > cols ? cols : hi;
    const char *src = (const char *)x->data + (size_t)(r * cols) * es;
    char *dst = (char *)y->data + (size_t)(r * cols) * es;
    memset(dst, 0, (size_t)lo * es); /* all-zero bytes are 0 in every dtype */
    memcpy(dst + lo * es, src + lo * es, (size_t)(hi - lo) * es);
    memset(dst + hi * es, 0, (size_t)(cols - hi) * es);
  }
  return TP_KERNEL_OK;
}
