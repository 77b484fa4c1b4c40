/* Softmax and log-softmax over rows, forward and backward (tp_softmax_f32 with inner 1,
 * tp_softmax_backward_f32): one block per row. Each thread reads and writes only its own
 * elements, so x and y (dy and dx) may alias. */
#include "common.cuh"
#include "ops.h"

__global__ void softmax_kernel(const float *x, float *y, int64_t n, bool log) {
  const float *xr = x + blockIdx.x * n;
  float *yr = y + blockIdx.x * n, mx = -INFINITY, sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, xr[j]);
  mx = block_reduce(mx, TpMax(), -INFINITY);
  if (mx == -INFINITY) { /* every element masked out (uniform over the block) */
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = log ? -INFINITY : 0.0f;
    return;
  }
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += expf(xr[j] - mx);
  sum = block_reduce(sum, TpSum(), 0.0f);
  if (log) {
    float lse = logf(sum);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = (xr[j] - mx) - lse;
  } else {
    float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = expf(xr[j] - mx) * inv;
  }
}

/* rows of n; x and y may alias */
static void softmax_rows(const float *x, float *y, int64_t rows, int64_t n, bool log, TpCudaStream stream) {
  if (rows == 0 || n == 0) return;
  TP_LAUNCH(softmax_kernel, dim3((unsigned)rows), dim3(TP_CUDA_ROW_THREADS), stream, x, y, n, log);
}

/* softmax: dx = y * (dy - sum dy * y); log-softmax: dx = dy - exp(y) * sum dy */
__global__ void softmax_backward_kernel(const float *dy, const float *y, int64_t n, bool log, float *dx) {
  const float *d = dy + blockIdx.x * n, *yr = y + blockIdx.x * n;
  float *o = dx + blockIdx.x * n, dot = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dot += log ? d[j] : d[j] * yr[j];
  dot = block_reduce(dot, TpSum(), 0.0f);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) o[j] = log ? d[j] - expf(yr[j]) * dot : yr[j] * (d[j] - dot);
}

static void softmax_backward_rows(const float *dy, const float *y, int64_t rows, int64_t n, bool log, float *dx,
                                  TpCudaStream stream) {
  if (rows == 0 || n == 0) return;
  TP_LAUNCH(softmax_backward_kernel, dim3((unsigned)rows), dim3(TP_CUDA_ROW_THREADS), stream, dy, y, n, log, dx);
}

/* ---- the entry points (ops.h): rows of n in place for inner 1; else [outer, n, inner] is
 * transposed to rows in scratch and back ---- */

/* dst [outer, inner, n] = src [outer, n, inner], or back when `back` */
static void swap_last(const float *src, float *dst, int64_t outer, int64_t n, int64_t inner, bool back,
                      TpStream *stream) {
  TpTensor x = {TP_F32, 3, {outer, back ? inner : n, back ? n : inner}, const_cast<float *>(src)};
  TpTensor y = {TP_F32, 3, {outer, back ? n : inner, back ? inner : n}, dst};
  const int64_t perm[3] = {0, 2, 1};
  tp_cuda_launch_transpose_f32(&x, perm, &y, stream->cuda);
}

TpKernelStatus tp_cuda_softmax_f32(const float *x, float *y, int64_t outer, int64_t n, int64_t inner, bool log,
                                   TpStream *stream) {
  if (inner == 1) {
    softmax_rows(x, y, outer, n, log, stream->cuda);
    return TP_KERNEL_OK;
  }
  int64_t total = outer * n * inner;
  if (total == 0) return TP_KERNEL_OK;
  float *rows = static_cast<float *>(tp_cuda_scratch(stream, (size_t)total * sizeof(float)));
  swap_last(x, rows, outer, n, inner, false, stream);
  softmax_rows(rows, rows, outer * inner, n, log, stream->cuda);
  swap_last(rows, y, outer, n, inner, true, stream);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_softmax_backward_f32(const float *dy, const float *y, int64_t outer, int64_t n, int64_t inner,
                                            bool log, float *dx, TpStream *stream) {
  if (inner == 1) {
    softmax_backward_rows(dy, y, outer, n, log, dx, stream->cuda);
    return TP_KERNEL_OK;
  }
  int64_t total = outer * n * inner;
  if (total == 0) return TP_KERNEL_OK;
  float *dy_rows = static_cast<float *>(tp_cuda_scratch(stream, 2 * (size_t)total * sizeof(float)));
  float *y_rows = dy_rows + total;
  swap_last(dy, dy_rows, outer, n, inner, false, stream);
  swap_last(y, y_rows, outer, n, inner, false, stream);
  softmax_backward_rows(dy_rows, y_rows, outer * inner, n, log, dy_rows, stream->cuda);
  swap_last(dy_rows, dx, outer, n, inner, true, stream);
  return TP_KERNEL_OK;
}
