/* The layout ops plans keep, on any dtype: each a strided copy (one thread per element of
 * the copied view, reading and writing through element strides, negative for reversed
 * slices), the view built on the host as the CPU kernel builds it. Pure copies: the CPU's
 * results. Elements are moved as unsigned integers of their size. */
#include "strided.cuh"

template <typename T> __global__ void strided_copy_kernel(Strided s, const T *x, T *y) {
  TP_GRID_STRIDE_LOOP(e, s.n) y[offset_of(s, 0, e)] = x[offset_of(s, 1, e)];
}

template <typename T> static void launch_copy_as(const Strided &s, const void *x, void *y, TpCudaStream stream) {
  TP_LAUNCH(strided_copy_kernel<T>, tp_elementwise_grid(s.n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, s,
            static_cast<const T *>(x), static_cast<T *>(y));
}

/* Elements of es bytes (1, 2, 4 or 8: every dtype's size). */
static void launch_copy(const Strided &s, size_t es, const void *x, void *y, TpCudaStream stream) {
  if (s.n == 0) return;
  switch (es) {
  case 1: launch_copy_as<uint8_t>(s, x, y, stream); break;
  case 2: launch_copy_as<uint16_t>(s, x, y, stream); break;
  case 4: launch_copy_as<uint32_t>(s, x, y, stream); break;
  default: launch_copy_as<uint64_t>(s, x, y, stream); break;
  }
}

/* A view of rank dims: y's element strides contiguous over them, x's given. */
static Strided dense_to(int rank, const int64_t *dims, const int64_t *x_stride) {
  Strided s = {};
  s.rank = rank, s.n = 1;
  for (int d = rank - 1; d >= 0; d--) {
    s.dims[d] = dims[d];
    s.stride[0][d] = s.n;
    s.stride[1][d] = x_stride[d];
    s.n *= dims[d];
  }
  return s;
}

static void contiguous(int rank, const int64_t *dims, int64_t *stride) {
  int64_t t = 1;
  for (int d = rank - 1; d >= 0; d--) stride[d] = t, t *= dims[d];
}

void tp_cuda_launch_strided_copy(const TpIter *it, size_t es, const void *x, void *y, TpCudaStream stream) {
  const size_t elsize[] = {es, es};
  launch_copy(strided(it, elsize), es, x, y, stream);
}

void tp_cuda_launch_strided_copy_f32(const TpIter *it, const float *x, float *y, TpCudaStream stream) {
  tp_cuda_launch_strided_copy(it, sizeof(float), x, y, stream);
}

void tp_cuda_launch_copy_f32(const float *x, int64_t n, float *y, TpCudaStream stream) {
  int64_t one = 1;
  if (x != y) launch_copy(dense_to(1, &n, &one), sizeof(float), x, y, stream);
}

bool tp_cuda_launch_transpose_f32(const TpTensor *x, const int64_t *perm, TpTensor *y, TpCudaStream stream) {
  if (x->rank != y->rank) return false;
  int64_t xs[TP_MAX_RANK], from[TP_MAX_RANK];
  unsigned seen = 0;
  contiguous(x->rank, x->dims, xs);
  for (int d = 0; d < y->rank; d++) {
    int64_t p = perm[d];
    if (p < 0 || p >= x->rank || (seen & (1u << p)) || x->dims[p] != y->dims[d]) return false;
    seen |= 1u << p;
    from[d] = xs[p];
  }
  launch_copy(dense_to(y->rank, y->dims, from), tp_dtype_size(x->dtype), x->data, y->data, stream);
  return true;
}

/* Slice's view of x: y's dims, x's strides times the steps, from x's element `*start`. */
static Strided slice_view(const TpTensor *x, const int64_t *starts, const int64_t *steps, const TpTensor *y,
                          int64_t *start) {
  int64_t xs[TP_MAX_RANK], from[TP_MAX_RANK];
  contiguous(x->rank, x->dims, xs);
  *start = 0;
  for (int d = 0; d < y->rank; d++) {
    *start += starts[d] * xs[d];
    from[d] = steps[d] * xs[d];
  }
  return dense_to(y->rank, y->dims, from);
}

static void swap_operands(Strided *s) {
  for (int d = 0; d < s->rank; d++) {
    int64_t t = s->stride[0][d];
    s->stride[0][d] = s->stride[1][d], s->stride[1][d] = t;
  }
}

void tp_cuda_launch_slice_f32(const TpTensor *x, const int64_t *starts, const int64_t *steps, TpTensor *y,
                              TpCudaStream stream) {
  if (tp_numel(y->rank, y->dims) == 0) return; /* starts may be past the end then */
  int64_t start;
  Strided s = slice_view(x, starts, steps, y, &start);
  size_t es = tp_dtype_size(x->dtype);
  launch_copy(s, es, static_cast<const char *>(x->data) + start * (int64_t)es, y->data, stream);
}

void tp_cuda_launch_slice_backward_f32(const TpTensor *dy, const int64_t *starts, const int64_t *steps, TpTensor *dx,
                                       TpCudaStream stream) {
  size_t es = tp_dtype_size(dx->dtype), bytes = (size_t)tp_numel(dx->rank, dx->dims) * es;
  if (bytes == 0) return;
  TP_CUDA_CHECK(cudaMemsetAsync(dx->data, 0, bytes, stream)); /* all-zero bytes: 0 in every dtype */
  if (tp_numel(dy->rank, dy->dims) == 0) return;
  int64_t start;
  Strided s = slice_view(dx, starts, steps, dy, &start);
  swap_operands(&s); /* dy's elements written where the slice read them */
  launch_copy(s, es, dy->data, static_cast<char *>(dx->data) + start * (int64_t)es, stream);
}

/* The whole viewed as [outer, along, inner]; a piece of `n` along at `at` is copied between
 * the whole (`whole_along` along) and its own dense [outer, n, inner], elements of es bytes. */
static void move_piece(int64_t outer, int64_t n, int64_t inner, int64_t whole_along, int64_t at, size_t es,
                       void *whole, void *piece, bool to_piece, TpCudaStream stream) {
  int64_t dims[3] = {outer, n, inner}, whole_stride[3] = {whole_along * inner, inner, 1};
  Strided s = dense_to(3, dims, whole_stride);
  char *at_whole = static_cast<char *>(whole) + at * inner * (int64_t)es;
  if (to_piece) {
    launch_copy(s, es, at_whole, piece, stream);
    return;
  }
  swap_operands(&s); /* the other direction */
  launch_copy(s, es, piece, at_whole, stream);
}

static void move_pieces(TpTensor *whole, TpTensor *pieces, int n, int axis, bool to_pieces, TpCudaStream stream) {
  int64_t outer = tp_numel(axis, whole->dims), inner = tp_numel(whole->rank - axis - 1, whole->dims + axis + 1);
  int64_t at = 0;
  for (int k = 0; k < n; k++) {
    int64_t along = pieces[k].dims[axis];
    if (pieces[k].data)
      move_piece(outer, along, inner, whole->dims[axis], at, tp_dtype_size(whole->dtype), whole->data,
                 pieces[k].data, to_pieces, stream);
    at += along;
  }
}

void tp_cuda_launch_split_f32(const TpTensor *x, int axis, TpTensor *ys, int n, TpCudaStream stream) {
  move_pieces((TpTensor *)x, ys, n, axis, true, stream); /* x is only read */
}

void tp_cuda_launch_concat_f32(const TpTensor *xs, int n, int axis, TpTensor *y, TpCudaStream stream) {
  move_pieces(y, (TpTensor *)xs, n, axis, false, stream); /* the xs are only read */
}

void tp_cuda_launch_context_append_f32(const TpTensor *x, int axis, int64_t at, int64_t rows, float *buffer,
                                       TpCudaStream stream) {
  int64_t outer = tp_numel(axis, x->dims), inner = tp_numel(x->rank - axis - 1, x->dims + axis + 1);
  move_piece(outer, x->dims[axis], inner, rows, at, tp_dtype_size(x->dtype), buffer, x->data, false, stream);
}
