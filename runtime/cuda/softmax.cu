/* Softmax and log-softmax over rows, forward and backward (tp_softmax_f32 with inner 1,
 * tp_softmax_backward_f32): one block per row. Each thread reads and writes only its own
 * elements, so x and y (dy and dx) may alias. */
#include "common.cuh"

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

void tp_cuda_launch_softmax_f32(const float *x, float *y, int64_t rows, int64_t n, bool log, TpCudaStream stream) {
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

void tp_cuda_launch_softmax_backward_f32(const float *dy, const float *y, int64_t rows, int64_t n, bool log, float *dx,
                                  TpCudaStream stream) {
  if (rows == 0 || n == 0) return;
  TP_LAUNCH(softmax_backward_kernel, dim3((unsigned)rows), dim3(TP_CUDA_ROW_THREADS), stream, dy, y, n, log, dx);
}
