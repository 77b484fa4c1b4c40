/* The layout ops plans keep, on f32: each a strided copy (one thread per element of the
 * copied view, reading and writing through element strides, negative for reversed slices),
 * the view built on the host as the CPU kernel builds it. Pure copies: the CPU's results. */
#include "strided.cuh"

__global__ void strided_copy_kernel(Strided s, const float *x, float *y) {
  TP_GRID_STRIDE_LOOP(e, s.n) y[offset_of(s, 0, e)] = x[offset_of(s, 1, e)];
}

static void launch_copy(const Strided &s, const float *x, float *y, TpCudaStream stream) {
  if (s.n == 0) return;
  TP_LAUNCH(strided_copy_kernel, tp_elementwise_grid(s.n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, s, x, y);
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

void tp_cuda_launch_strided_copy_f32(const TpIter *it, const float *x, float *y, TpCudaStream stream) {
  const size_t elsize[] = {sizeof(float), sizeof(float)};
  launch_copy(strided(it, elsize), x, y, stream);
}

void tp_cuda_launch_copy_f32(const float *x, int64_t n, float *y, TpCudaStream stream) {
  int64_t one = 1;
  if (x != y) launch_copy(dense_to(1, &n, &one), x, y, stream);
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
  launch_copy(dense_to(y->rank, y->dims, from), (const float *)x->data, (float *)y->data, stream);
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
  launch_copy(s, (const float *)x->data + start, (float *)y->data, stream);
}

__global__ void zero_kernel(float *y, int64_t n) {
  TP_GRID_STRIDE_LOOP(i, n) y[i] = 0;
}

void tp_cuda_launch_slice_backward_f32(const TpTensor *dy, const int64_t *starts, const int64_t *steps, TpTensor *dx,
                                TpCudaStream stream) {
  int64_t n = tp_numel(dx->rank, dx->dims);
  if (n == 0) return;
  TP_LAUNCH(zero_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, (float *)dx->data, n);
  if (tp_numel(dy->rank, dy->dims) == 0) return;
  int64_t start;
  Strided s = slice_view(dx, starts, steps, dy, &start);
  swap_operands(&s); /* dy's elements written where the slice read them */
  launch_copy(s, (const float *)dy->data, (float *)dx->data + start, stream);
}

/* The whole viewed as [outer, along, inner]; a piece of `n` along at `at` is copied between
 * the whole (`whole_along` along) and its own dense [outer, n, inner]. */
static void move_piece(int64_t outer, int64_t n, int64_t inner, int64_t whole_along, int64_t at, float *whole,
                       float *piece, bool to_piece, TpCudaStream stream) {
  int64_t dims[3] = {outer, n, inner}, whole_stride[3] = {whole_along * inner, inner, 1};
  Strided s = dense_to(3, dims, whole_stride);
  if (to_piece) {
    launch_copy(s, whole + at * inner, piece, stream);
    return;
  }
  swap_operands(&s); /* the other direction */
  launch_copy(s, piece, whole + at * inner, stream);
}

static void move_pieces(TpTensor *whole, TpTensor *pieces, int n, int axis, bool to_pieces, TpCudaStream stream) {
  int64_t outer = tp_numel(axis, whole->dims), inner = tp_numel(whole->rank - axis - 1, whole->dims + axis + 1);
  int64_t at = 0;
  for (int k = 0; k < n; k++) {
    int64_t along = pieces[k].dims[axis];
    if (pieces[k].data)
      move_piece(outer, along, inner, whole->dims[axis], at, (float *)whole->data, (float *)pieces[k].data,
                 to_pieces, stream);
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
  move_piece(outer, x->dims[axis], inner, rows, at, buffer, (float *)x->data, false, stream);
}
