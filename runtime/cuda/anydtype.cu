/* The plan's kernel calls (ops.h) of cpu/elementwise.h, layout.h, layout_backward.h and
 * reduce.h: the host checks of the CPU kernel (the same statuses), then the f32 launchers
 * of kernels.h where they apply and, for the other dtypes, axes and ops, the kernels below:
 * one thread per output element (or per line that must be summed in order), computing
 * through cpu/scalar.h and dtype.cuh as the CPU computes. Deterministic: no float atomics. */
#include <string.h>

#include "../kernels/check.h"
#include "../kernels/element.h"
#include "dtype.cuh"
#include "ops.h"
#include "strided.cuh"

#define LAUNCH_OVER(n, kernel, stream, ...)                                                                         \
  TP_LAUNCH(kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), (stream)->cuda, __VA_ARGS__)

static bool same_dims(const TpTensor *a, const TpTensor *b) {
  return a->rank == b->rank && memcmp(a->dims, b->dims, (size_t)a->rank * sizeof a->dims[0]) == 0;
}

/* A TpIter over operands of the given byte sizes, offsets in bytes. */
static Strided byte_strided(const TpIter *it) {
  const size_t ones[TP_ITER_MAX_OPERANDS] = {1, 1, 1, 1};
  return strided(it, ones);
}

/* ---- unary ---- */

__global__ void unary_any_kernel(TpUnaryOp op, TpDType t, size_t es, const char *x, int64_t n, char *y) {
  TP_GRID_STRIDE_LOOP(i, n) {
    const char *px = x + i * (int64_t)es;
    char *py = y + i * (int64_t)es;
    if (t == TP_BOOL) {
      *py = !*px;
    } else if (tp_dclass(t) == TP_CLASS_FLOAT) {
      tp_store_float(t, py, tp_unary_f64(op, tp_load_float(t, px))); /* as the CPU computes */
    } else {                                                         /* signed integers: Neg, Relu */
      uint64_t v = tp_load_bits(t, px);
      if (op == TP_UNARY_NEG) v = 0 - v;
      else if ((int64_t)v < 0) v = 0;
      tp_store_bits(t, es, py, v);
    }
  }
}

TpKernelStatus tp_cuda_unary(TpUnaryOp op, const TpTensor *x, TpTensor *y, TpStream *stream) {
  TpKernelStatus s = tp_check_unary(op, x, y);
  if (s != TP_KERNEL_OK) return s;
  int64_t n = tp_tensor_numel(x);
  if (x->dtype == TP_F32) {
    tp_cuda_launch_unary_f32(op, static_cast<const float *>(x->data), n, static_cast<float *>(y->data),
                             stream->cuda);
    return TP_KERNEL_OK;
  }
  if (n)
    LAUNCH_OVER(n, unary_any_kernel, stream, op, x->dtype, tp_dtype_size(x->dtype),
                static_cast<const char *>(x->data), n, static_cast<char *>(y->data));
  return TP_KERNEL_OK;
}

/* ---- binary ---- */

/* The CPU's float formulas (elementwise.c FLOAT_BINARY) in double. */
__device__ static double float_binary(TpBinaryOp op, double a, double b) {
  switch (op) {
  case TP_BINARY_ADD: return a + b;
  case TP_BINARY_SUB: return a - b;
  case TP_BINARY_MUL: return a * b;
  case TP_BINARY_DIV: return a / b;
  case TP_BINARY_POW: return pow(a, b);
  case TP_BINARY_MAX: return a > b || a != a ? a : b;
  case TP_BINARY_MIN: return a < b || a != a ? a : b;
  default: return 0;
  }
}

struct BinaryTypes {
  TpDType a, b, y;
  size_t ey;
};

__global__ void binary_any_kernel(TpBinaryOp op, BinaryTypes t, Strided s, const char *a, const char *b, char *y) {
  TP_GRID_STRIDE_LOOP(e, s.n) {
    const char *pa = a + offset_of(s, 1, e), *pb = b + offset_of(s, 2, e);
    char *py = y + offset_of(s, 0, e);
    if (op > TP_BINARY_MIN) /* And, comparisons: bool */
      *py = op == TP_BINARY_AND ? (*pa && *pb) : tp_compare(op, tp_compare3(t.a, pa, pb));
    else if (tp_dclass(t.y) == TP_CLASS_FLOAT)
      tp_store_float(t.y, py, float_binary(op, tp_load_double(t.a, pa), tp_load_double(t.b, pb)));
    else
      tp_store_bits(t.y, t.ey, py,
                    tp_int_binary(op, tp_dclass(t.y) == TP_CLASS_SIGNED, tp_load_bits(t.a, pa), t.b, pb, t.y, t.ey));
  }
}

TpKernelStatus tp_cuda_binary(TpBinaryOp op, const TpTensor *a, const TpTensor *b, TpTensor *y, TpStream *stream) {
  if (!tp_binary_dtypes_ok(op, a->dtype, b->dtype, y->dtype)) return TP_KERNEL_BAD_DTYPE;
  TpIter it;
  const TpTensor *const ops[] = {y, a, b};
  if (!tp_iter_broadcast(&it, 3, ops)) return TP_KERNEL_BAD_SHAPE;
  tp_iter_coalesce(&it);
  if (op <= TP_BINARY_MIN && y->dtype == TP_F32 && b->dtype == TP_F32) {
    tp_cuda_launch_binary_f32(op, &it, static_cast<const float *>(a->data), static_cast<const float *>(b->data),
                              static_cast<float *>(y->data), stream->cuda);
    return TP_KERNEL_OK;
  }
  Strided s = byte_strided(&it);
  BinaryTypes t = {a->dtype, b->dtype, y->dtype, tp_dtype_size(y->dtype)};
  if (s.n)
    LAUNCH_OVER(s.n, binary_any_kernel, stream, op, t, s, static_cast<const char *>(a->data),
                static_cast<const char *>(b->data), static_cast<char *>(y->data));
  return TP_KERNEL_OK;
}

/* ---- Where, Cast ---- */

__global__ void where_any_kernel(Strided s, size_t es, const char *cond, const char *a, const char *b, char *y) {
  TP_GRID_STRIDE_LOOP(e, s.n) {
    const char *src = cond[offset_of(s, 1, e)] ? a + offset_of(s, 2, e) : b + offset_of(s, 3, e);
    tp_copy_element(es, y + offset_of(s, 0, e), src);
  }
}

TpKernelStatus tp_cuda_where(const TpTensor *cond, const TpTensor *a, const TpTensor *b, TpTensor *y,
                             TpStream *stream) {
  if (cond->dtype != TP_BOOL || a->dtype != y->dtype || b->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  TpIter it;
  const TpTensor *const ops[] = {y, cond, a, b};
  if (!tp_iter_broadcast(&it, 4, ops)) return TP_KERNEL_BAD_SHAPE;
  tp_iter_coalesce(&it);
  if (y->dtype == TP_F32) {
    tp_cuda_launch_where_f32(&it, static_cast<const bool *>(cond->data), static_cast<const float *>(a->data),
                             static_cast<const float *>(b->data), static_cast<float *>(y->data), stream->cuda);
    return TP_KERNEL_OK;
  }
  Strided s = byte_strided(&it);
  if (s.n)
    LAUNCH_OVER(s.n, where_any_kernel, stream, s, tp_dtype_size(y->dtype), static_cast<const char *>(cond->data),
                static_cast<const char *>(a->data), static_cast<const char *>(b->data),
                static_cast<char *>(y->data));
  return TP_KERNEL_OK;
}

/* elementwise.c cast_run */
__global__ void cast_kernel(TpDType tx, size_t ex, TpDType ty, size_t ey, const char *x, int64_t n, char *y) {
  TpDClass cx = tp_dclass(tx), cy = tp_dclass(ty);
  TP_GRID_STRIDE_LOOP(i, n) {
    const char *src = x + i * (int64_t)ex;
    char *dst = y + i * (int64_t)ey;
    if (cx == TP_CLASS_FLOAT) {
      double v = tp_load_float(tx, src);
      if (cy == TP_CLASS_FLOAT) tp_store_float(ty, dst, v);
      else if (cy == TP_CLASS_BOOL) tp_store_bits(ty, ey, dst, v != 0);
      else tp_store_bits(ty, ey, dst, tp_float_to_bits(ty, ey, v));
    } else {
      uint64_t v = tp_load_bits(tx, src);
      if (cy != TP_CLASS_FLOAT) tp_store_bits(ty, ey, dst, v);
      else if (ty == TP_F32) /* directly, not through double: one rounding */
        tp_store_float(ty, dst, cx == TP_CLASS_SIGNED ? (float)(int64_t)v : (float)v);
      else tp_store_float(ty, dst, cx == TP_CLASS_SIGNED ? (double)(int64_t)v : (double)v);
    }
  }
}

TpKernelStatus tp_cuda_cast(const TpTensor *x, TpTensor *y, TpStream *stream) {
  TpKernelStatus s = tp_check_cast(x, y);
  if (s != TP_KERNEL_OK) return s;
  int64_t n = tp_tensor_numel(x);
  if (x->dtype == y->dtype) {
    if (n && x->data != y->data)
      TP_CUDA_CHECK(cudaMemcpyAsync(y->data, x->data, tp_tensor_bytes(x), cudaMemcpyDeviceToDevice, stream->cuda));
    return TP_KERNEL_OK;
  }
  if (n)
    LAUNCH_OVER(n, cast_kernel, stream, x->dtype, tp_dtype_size(x->dtype), y->dtype, tp_dtype_size(y->dtype),
                static_cast<const char *>(x->data), n, static_cast<char *>(y->data));
  return TP_KERNEL_OK;
}

/* ---- layout: layout.cu's strided copies move any dtype ---- */

TpKernelStatus tp_cuda_reshape(const TpTensor *x, TpTensor *y, TpStream *stream) {
  TpKernelStatus s = tp_check_reshape(x, y);
  if (s != TP_KERNEL_OK) return s;
  if (tp_tensor_bytes(x) && x->data != y->data)
    TP_CUDA_CHECK(cudaMemcpyAsync(y->data, x->data, tp_tensor_bytes(x), cudaMemcpyDeviceToDevice, stream->cuda));
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_expand(const TpTensor *x, TpTensor *y, TpStream *stream) {
  if (x->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  TpIter it;
  const TpTensor *const ops[] = {y, x};
  if (!tp_iter_broadcast(&it, 2, ops)) return TP_KERNEL_BAD_SHAPE;
  tp_iter_coalesce(&it);
  tp_cuda_launch_strided_copy(&it, tp_dtype_size(y->dtype), x->data, y->data, stream->cuda);
  return TP_KERNEL_OK;
}

/* y's dims and x's (element strides), by value */
struct TileShape {
  int rank;
  int64_t y_dims[TP_MAX_RANK], x_dims[TP_MAX_RANK], x_stride[TP_MAX_RANK], n;
};

__global__ void tile_kernel(TileShape p, size_t es, const char *x, char *y) {
  TP_GRID_STRIDE_LOOP(e, p.n) {
    int64_t src = 0, rem = e;
    for (int d = p.rank - 1; d >= 0; d--) {
      src += rem % p.y_dims[d] % p.x_dims[d] * p.x_stride[d];
      rem /= p.y_dims[d];
    }
    tp_copy_element(es, y + e * (int64_t)es, x + src * (int64_t)es);
  }
}

TpKernelStatus tp_cuda_tile(const TpTensor *x, TpTensor *y, TpStream *stream) {
  TpKernelStatus s = tp_check_tile(x, y);
  if (s != TP_KERNEL_OK) return s;
  TileShape p = {};
  p.rank = x->rank, p.n = tp_tensor_numel(y);
  memcpy(p.y_dims, y->dims, sizeof p.y_dims);
  memcpy(p.x_dims, x->dims, sizeof p.x_dims);
  tp_contiguous_strides(x->rank, x->dims, 1, p.x_stride);
  if (p.n)
    LAUNCH_OVER(p.n, tile_kernel, stream, p, tp_dtype_size(x->dtype), static_cast<const char *>(x->data),
                static_cast<char *>(y->data));
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_transpose(const TpTensor *x, const int64_t *perm, TpTensor *y, TpStream *stream) {
  if (x->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  return tp_cuda_launch_transpose_f32(x, perm, y, stream->cuda) ? TP_KERNEL_OK : TP_KERNEL_BAD_SHAPE;
}

TpKernelStatus tp_cuda_slice(const TpTensor *x, const int64_t *starts, const int64_t *steps, TpTensor *y,
                             TpStream *stream) {
  TpKernelStatus s = tp_check_slice(x, starts, steps, y);
  if (s != TP_KERNEL_OK) return s;
  tp_cuda_launch_slice_f32(x, starts, steps, y, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_slice_backward(const TpTensor *dy, const int64_t *starts, const int64_t *steps, TpTensor *dx,
                                      TpStream *stream) {
  TpKernelStatus s = tp_check_slice(dx, starts, steps, dy);
  if (s != TP_KERNEL_OK) return s;
  tp_cuda_launch_slice_backward_f32(dy, starts, steps, dx, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_split(const TpTensor *x, int axis, TpTensor *ys, int n, TpStream *stream) {
  TpKernelStatus s = tp_pieces_check(x, ys, n, axis);
  if (s == TP_KERNEL_OK) tp_cuda_launch_split_f32(x, axis, ys, n, stream->cuda);
  return s;
}

TpKernelStatus tp_cuda_concat(const TpTensor *xs, int n, int axis, TpTensor *y, TpStream *stream) {
  TpKernelStatus s = tp_pieces_check(y, xs, n, axis);
  if (s == TP_KERNEL_OK) tp_cuda_launch_concat_f32(xs, n, axis, y, stream->cuda);
  return s;
}

TpKernelStatus tp_cuda_context_append(const TpTensor *x, int axis, int64_t at, int64_t rows, void *buffer,
                                      TpStream *stream) {
  if (axis < 0 || axis >= x->rank || at < 0 || at + x->dims[axis] > rows) return TP_KERNEL_BAD_SHAPE;
  tp_cuda_launch_context_append_f32(x, axis, at, rows, static_cast<float *>(buffer), stream->cuda);
  return TP_KERNEL_OK;
}

/* layout.c tp_trilu: k already clamped to [-rows, cols] */
__global__ void trilu_kernel(const char *x, int64_t n, int64_t rows, int64_t cols, bool upper, int64_t k, size_t es,
                             char *y) {
  TP_GRID_STRIDE_LOOP(e, n) {
    int64_t col = e % cols, i = e / cols % rows;
    bool keep = upper ? col >= i + k : col <= i + k;
    char *dst = y + e * (int64_t)es;
    if (keep) tp_copy_element(es, dst, x + e * (int64_t)es);
    else memset(dst, 0, es); /* all-zero bytes are 0 in every dtype */
  }
}

TpKernelStatus tp_cuda_trilu(const TpTensor *x, bool upper, int64_t k, TpTensor *y, TpStream *stream) {
  if (x->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  if (x->rank < 2 || !same_dims(x, y)) return TP_KERNEL_BAD_SHAPE;
  int64_t rows = x->dims[x->rank - 2], cols = x->dims[x->rank - 1], n = tp_tensor_numel(x);
  k = k > cols ? cols : k < -rows ? -rows : k;
  if (n)
    LAUNCH_OVER(n, trilu_kernel, stream, static_cast<const char *>(x->data), n, rows, cols, upper, k,
                tp_dtype_size(x->dtype), static_cast<char *>(y->data));
  return TP_KERNEL_OK;
}

/* ---- Gather, GatherElements and their backwards: an index out of range is skipped and
 * the smallest flat position (in indices) of one goes to stream->bad, as the embedding
 * and loss kernels report theirs ---- */

/* data [outer, n, inner] -> y [outer, nidx, inner], elements of es bytes */
__global__ void gather_kernel(const char *data, TpDType index_type, const void *indices, int64_t outer, int64_t n,
                              int64_t nidx, int64_t inner, size_t es, char *y, int64_t *bad) {
  TP_GRID_STRIDE_LOOP(e, outer * nidx * inner) {
    int64_t c = e % inner, j = e / inner % nidx, o = e / inner / nidx, ix = tp_load_index(index_type, indices, j);
    if (ix < -n || ix >= n) {
      if (c == 0) tp_report_bad(bad, j);
      continue;
    }
    if (ix < 0) ix += n;
    tp_copy_element(es, y + e * (int64_t)es, data + ((o * n + ix) * inner + c) * (int64_t)es);
  }
}

TpKernelStatus tp_cuda_gather(const TpTensor *data, const TpTensor *indices, int axis, TpTensor *y, int64_t *bad,
                              TpStream *stream) {
  (void)bad;
  if (data->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  TpKernelStatus s = tp_gather_check(data->rank, data->dims, indices, axis, y, NULL);
  if (s != TP_KERNEL_OK) return s;
  int64_t outer = tp_numel(axis, data->dims), n = data->dims[axis], nidx = tp_tensor_numel(indices);
  int64_t inner = tp_numel(data->rank - axis - 1, data->dims + axis + 1), total = outer * nidx * inner;
  if (total)
    LAUNCH_OVER(total, gather_kernel, stream, static_cast<const char *>(data->data), indices->dtype, indices->data,
                outer, n, nidx, inner, tp_dtype_size(data->dtype), static_cast<char *>(y->data), stream->bad);
  return TP_KERNEL_OK;
}

/* Embedding's backward with outer rows of (n, inner) (embedding.cu). */
TpKernelStatus tp_cuda_gather_backward(const TpTensor *dy, const TpTensor *indices, int axis, int64_t padding_idx,
                                       TpTensor *ddata, int64_t *bad, TpStream *stream) {
  (void)bad;
  if (dy->dtype != TP_F32 || ddata->dtype != TP_F32) return TP_KERNEL_BAD_DTYPE;
  TpKernelStatus s = tp_gather_check(ddata->rank, ddata->dims, indices, axis, dy, NULL);
  if (s != TP_KERNEL_OK) return s;
  int64_t outer = tp_numel(axis, ddata->dims), n = ddata->dims[axis], nidx = tp_tensor_numel(indices);
  int64_t inner = tp_numel(ddata->rank - axis - 1, ddata->dims + axis + 1);
  void *scratch = tp_cuda_scratch(stream, tp_cuda_embedding_backward_scratch(nidx) + 1);
  tp_cuda_launch_embedding_backward_f32(static_cast<const float *>(dy->data), indices->data,
                                        indices->dtype == TP_I32, padding_idx, nidx, outer, n, inner,
                                        static_cast<float *>(ddata->data), stream->bad, scratch, stream->cuda);
  return TP_KERNEL_OK;
}

/* indices' dims and data's element strides, by value */
struct ElementsShape {
  int rank, axis;
  int64_t dims[TP_MAX_RANK], data_stride[TP_MAX_RANK], n, total, inner; /* inner: indices' dims after axis */
};

/* data's element offset for element e of indices (-1: its index is out of range) */
__device__ static int64_t elements_source(const ElementsShape &p, TpDType index_type, const void *indices, int64_t e,
                                          int64_t *bad) {
  int64_t ix = tp_load_index(index_type, indices, e), src = 0, rem = e;
  if (ix < -p.n || ix >= p.n) {
    tp_report_bad(bad, e);
    return -1;
  }
  if (ix < 0) ix += p.n;
  for (int d = p.rank - 1; d >= 0; d--) {
    src += (d == p.axis ? ix : rem % p.dims[d]) * p.data_stride[d];
    rem /= p.dims[d];
  }
  return src;
}

__global__ void gather_elements_kernel(const char *data, ElementsShape p, TpDType index_type, const void *indices,
                                       size_t es, char *y, int64_t *bad) {
  TP_GRID_STRIDE_LOOP(e, p.total) {
    int64_t src = elements_source(p, index_type, indices, e, bad);
    if (src >= 0) tp_copy_element(es, y + e * (int64_t)es, data + src * (int64_t)es);
  }
}

static ElementsShape elements_shape(int rank, const int64_t *data_dims, const TpTensor *indices, int axis) {
  ElementsShape p = {};
  p.rank = rank, p.axis = axis, p.n = data_dims[axis], p.total = tp_tensor_numel(indices);
  p.inner = tp_numel(rank - axis - 1, indices->dims + axis + 1);
  memcpy(p.dims, indices->dims, sizeof p.dims);
  tp_contiguous_strides(rank, data_dims, 1, p.data_stride);
  return p;
}

TpKernelStatus tp_cuda_gather_elements(const TpTensor *data, const TpTensor *indices, int axis, TpTensor *y,
                                       int64_t *bad, TpStream *stream) {
  (void)bad;
  if (data->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  TpKernelStatus s = tp_gather_elements_check(data->rank, data->dims, indices, axis, y, NULL);
  if (s != TP_KERNEL_OK) return s;
  ElementsShape p = elements_shape(data->rank, data->dims, indices, axis);
  if (p.total)
    LAUNCH_OVER(p.total, gather_elements_kernel, stream, static_cast<const char *>(data->data), p, indices->dtype,
                indices->data, tp_dtype_size(data->dtype), static_cast<char *>(y->data), stream->bad);
  return TP_KERNEL_OK;
}

/* One thread per line of indices along axis (the other coordinates fixed, which the scatter
 * keeps): its dy elements added in the order along axis, as the CPU adds them. */
__global__ void gather_elements_backward_kernel(const float *dy, ElementsShape p, TpDType index_type,
                                                const void *indices, float *ddata, int64_t *bad) {
  int64_t along = p.dims[p.axis], inner = p.inner;
  TP_GRID_STRIDE_LOOP(line, p.total / along) {
    int64_t first = line / inner * along * inner + line % inner;
    for (int64_t j = 0; j < along; j++) {
      int64_t e = first + j * inner, dst = elements_source(p, index_type, indices, e, bad);
      if (dst >= 0) ddata[dst] += dy[e];
    }
  }
}

TpKernelStatus tp_cuda_gather_elements_backward(const TpTensor *dy, const TpTensor *indices, int axis,
                                                TpTensor *ddata, int64_t *bad, TpStream *stream) {
  (void)bad;
  if (dy->dtype != TP_F32 || ddata->dtype != TP_F32) return TP_KERNEL_BAD_DTYPE;
  TpKernelStatus s = tp_gather_elements_check(ddata->rank, ddata->dims, indices, axis, dy, NULL);
  if (s != TP_KERNEL_OK) return s;
  if (tp_tensor_bytes(ddata)) TP_CUDA_CHECK(cudaMemsetAsync(ddata->data, 0, tp_tensor_bytes(ddata), stream->cuda));
  ElementsShape p = elements_shape(ddata->rank, ddata->dims, indices, axis);
  if (p.total)
    LAUNCH_OVER(p.total / p.dims[axis], gather_elements_backward_kernel, stream,
                static_cast<const float *>(dy->data), p, indices->dtype, indices->data,
                static_cast<float *>(ddata->data), stream->bad);
  return TP_KERNEL_OK;
}

/* ---- CumSum, ReduceSum ---- */

/* One thread per line (o, i) along axis: running sums as cpu/reduce.c keeps them. */
__global__ void cumsum_kernel(TpDType t, size_t es, const char *x, int64_t outer, int64_t n, int64_t inner,
                              bool exclusive, bool reverse, char *y) {
  TP_GRID_STRIDE_LOOP(line, outer * inner) {
    int64_t o = line / inner, i = line % inner, step = inner * (int64_t)es;
    int64_t first = ((o * n + (reverse ? n - 1 : 0)) * inner + i) * (int64_t)es, dir = reverse ? -step : step;
    double f = 0;
    uint64_t u = 0;
    for (int64_t j = 0; j < n; j++) {
      int64_t at = first + j * dir;
      if (!exclusive) tp_sum_element(t, x + at, &f, &u);
      tp_store_sum(t, es, y + at, f, u);
      if (exclusive) tp_sum_element(t, x + at, &f, &u);
    }
  }
}

TpKernelStatus tp_cuda_cumsum(const TpTensor *x, int axis, bool exclusive, bool reverse, TpTensor *y,
                              TpStream *stream) {
  TpDType t = x->dtype;
  if (y->dtype != t || t == TP_BOOL || tp_dtype_size(t) == 0) return TP_KERNEL_BAD_DTYPE;
  if (axis < 0 || axis >= x->rank || !same_dims(x, y)) return TP_KERNEL_BAD_SHAPE;
  int64_t outer = tp_numel(axis, x->dims), n = x->dims[axis];
  int64_t inner = tp_numel(x->rank - axis - 1, x->dims + axis + 1);
  if (outer * inner != 0 && n != 0)
    LAUNCH_OVER(outer * inner, cumsum_kernel, stream, t, tp_dtype_size(t), static_cast<const char *>(x->data), outer,
                n, inner, exclusive, reverse, static_cast<char *>(y->data));
  return TP_KERNEL_OK;
}

/* One thread per line (o, i) along axis: TopK's picks as the CPU makes them (cpu/scalar.h). */
__global__ void topk_kernel(TpDType t, size_t es, const char *x, int64_t outer, int64_t n, int64_t inner, int64_t k,
                            int64_t *y) {
  TP_GRID_STRIDE_LOOP(line, outer * inner) {
    int64_t o = line / inner, i = line % inner;
    tp_topk_line(t, x + (o * n * inner + i) * (int64_t)es, n, inner * (int64_t)es, k, y + o * k * inner + i, inner);
  }
}

TpKernelStatus tp_cuda_topk(const TpTensor *x, int axis, TpTensor *y, TpStream *stream) {
  TpKernelStatus s = tp_topk_check(x, axis, y);
  if (s != TP_KERNEL_OK) return s;
  int64_t outer = tp_numel(axis, x->dims), n = x->dims[axis], k = y->dims[axis];
  int64_t inner = tp_numel(x->rank - axis - 1, x->dims + axis + 1);
  if (outer * inner != 0 && k != 0)
    LAUNCH_OVER(outer * inner, topk_kernel, stream, x->dtype, tp_dtype_size(x->dtype),
                static_cast<const char *>(x->data), outer, n, inner, k, static_cast<int64_t *>(y->data));
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_reduce_sum(const TpTensor *x, const int64_t *axes, int naxes, bool mean, TpTensor *y,
                                  TpStream *stream) {
  TpDType t = x->dtype;
  if (y->dtype != t || t == TP_BOOL || tp_dtype_size(t) == 0) return TP_KERNEL_BAD_DTYPE;
  int64_t kept = 1;
  for (int d = 0, a = 0; d < x->rank; d++) /* the kept dims' elements, as y must hold them */
    if (a < naxes && axes[a] == d) a++;
    else kept *= x->dims[d];
  if (kept != tp_tensor_numel(y)) return TP_KERNEL_BAD_SHAPE;
  void *runs = tp_cuda_scratch(stream, tp_cuda_reduce_sum_scratch(x, axes, naxes) + 1);
  bool launched = tp_cuda_launch_reduce_sum(x, axes, naxes, mean, y->data, runs, stream->cuda);
  return launched ? TP_KERNEL_OK : TP_KERNEL_BAD_SHAPE;
}
