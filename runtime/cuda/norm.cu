/* RMSNorm and LayerNorm, forward and backward (runtime/cpu/transformer.h, nn.h,
 * nn_backward.h): one block per row, the row's sums through block_reduce; the parameter
 * gradients by colsum.cu's column sums (the CPU's, in its order: its bits from the same
 * statistics). */
#include "common.cuh"
#include "ops.h"

/* 1 / sqrt(mean(x^2) + eps) of the block's row xr of n (every thread gets it). */
__device__ float row_inv_rms(const float *xr, int64_t n, float eps) {
  float sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += xr[j] * xr[j];
  sum = block_reduce(sum, TpSum(), 0.0f);
  return 1.0f / sqrtf(sum / (float)n + eps);
}

__global__ void rmsnorm_kernel(const float *x, const float *scale, int64_t n, float eps, float *y) {
  const float *xr = x + blockIdx.x * n;
  float *yr = y + blockIdx.x * n, inv = row_inv_rms(xr, n, eps);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = xr[j] * inv * scale[j];
}

TpKernelStatus tp_cuda_rmsnorm_f32(const float *x, const float *scale, int64_t rows, int64_t n, float eps, float *y,
                                   TpStream *stream) {
  if (rows && n)
    TP_LAUNCH(rmsnorm_kernel, dim3((unsigned)rows), dim3(TP_CUDA_ROW_THREADS), stream->cuda, x, scale, n, eps, y);
  return TP_KERNEL_OK;
}

/* dx = r * (g - x * r^2 * mean(g * x)), g = dy * scale; inv_rms[row] = r. */
__global__ void rmsnorm_backward_kernel(const float *dy, const float *x, const float *scale, int64_t n, float eps,
                                        float *dx, float *inv_rms) {
  const float *d = dy + blockIdx.x * n, *xr = x + blockIdx.x * n;
  float r = row_inv_rms(xr, n, eps);
  if (threadIdx.x == 0) inv_rms[blockIdx.x] = r;
  if (!dx) return; /* the whole block leaves: no barrier is left unmatched */
  float sum_gx = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum_gx += d[j] * scale[j] * xr[j];
  sum_gx = block_reduce(sum_gx, TpSum(), 0.0f);
  float k = sum_gx / (float)n * r * r;
  float *o = dx + blockIdx.x * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) o[j] = r * (d[j] * scale[j] - xr[j] * k);
}

/* inv_rms (rows) and dscale's column runs in the stream's scratch; dx or dscale may be NULL */
TpKernelStatus tp_cuda_rmsnorm_backward_f32(const float *dy, const float *x, const float *scale, int64_t rows,
                                            int64_t n, float eps, float *dx, float *dscale, TpStream *stream) {
  if (n == 0) return TP_KERNEL_OK;
  size_t inv_bytes = ((size_t)rows * sizeof(float) + 255) / 256 * 256;
  size_t runs_bytes = dscale ? tp_cuda_column_sums_scratch(rows, n, 1) : 0;
  char *scratch = static_cast<char *>(tp_cuda_scratch(stream, inv_bytes + runs_bytes + 1));
  float *inv_rms = reinterpret_cast<float *>(scratch);
  if (rows)
    TP_LAUNCH(rmsnorm_backward_kernel, dim3((unsigned)rows), dim3(TP_CUDA_ROW_THREADS), stream->cuda, dy, x, scale,
              n, eps, dx, inv_rms);
  if (dscale)
    tp_cuda_launch_column_sums_f32(dy, x, nullptr, inv_rms, rows, n, dscale, nullptr, scratch + inv_bytes,
                                   stream->cuda);
  return TP_KERNEL_OK;
}

__global__ void layernorm_kernel(const float *x, const float *scale, const float *bias, int64_t n, float eps,
                                 float *y, float *mean, float *inv_std) {
  const float *xr = x + blockIdx.x * n;
  float *yr = y + blockIdx.x * n, sum = 0, sq = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += xr[j];
  float mu = block_reduce(sum, TpSum(), 0.0f) / (float)n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sq += (xr[j] - mu) * (xr[j] - mu);
  float inv = 1.0f / sqrtf(block_reduce(sq, TpSum(), 0.0f) / (float)n + eps);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    yr[j] = (xr[j] - mu) * inv * scale[j] + (bias ? bias[j] : 0.0f);
  if (threadIdx.x == 0) {
    if (mean) mean[blockIdx.x] = mu;
    if (inv_std) inv_std[blockIdx.x] = inv;
  }
}

/* bias, mean, inv_std may be NULL */
TpKernelStatus tp_cuda_layernorm_f32(const float *x, const float *scale, const float *bias, int64_t rows, int64_t n,
                                     float eps, float *y, float *mean, float *inv_std, TpStream *stream) {
  if (rows && n)
    TP_LAUNCH(layernorm_kernel, dim3((unsigned)rows), dim3(TP_CUDA_ROW_THREADS), stream->cuda, x, scale, bias, n,
              eps, y, mean, inv_std);
  return TP_KERNEL_OK;
}

/* dx = inv_std * (g - mean(g) - xhat * mean(g * xhat)), g = dy * scale. */
__global__ void layernorm_backward_kernel(const float *dy, const float *x, const float *scale, const float *mean,
                                          const float *inv_std, int64_t n, float *dx) {
  const float *d = dy + blockIdx.x * n, *xr = x + blockIdx.x * n;
  float mu = mean[blockIdx.x], rs = inv_std[blockIdx.x], sum_g = 0, sum_gx = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float g = d[j] * scale[j];
    sum_g += g;
    sum_gx += g * ((xr[j] - mu) * rs);
  }
  float mean_g = block_reduce(sum_g, TpSum(), 0.0f) / (float)n;
  float mean_gx = block_reduce(sum_gx, TpSum(), 0.0f) / (float)n;
  float *o = dx + blockIdx.x * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    o[j] = rs * (d[j] * scale[j] - mean_g - (xr[j] - mu) * rs * mean_gx);
}

/* dx, dscale, dbias may be NULL */
TpKernelStatus tp_cuda_layernorm_backward_f32(const float *dy, const float *x, const float *scale, const float *mean,
                                              const float *inv_std, int64_t rows, int64_t n, float *dx,
                                              float *dscale, float *dbias, TpStream *stream) {
  if (n == 0) return TP_KERNEL_OK;
  if (dx && rows)
    TP_LAUNCH(layernorm_backward_kernel, dim3((unsigned)rows), dim3(TP_CUDA_ROW_THREADS), stream->cuda, dy, x, scale,
              mean, inv_std, n, dx);
  if (dscale || dbias) {
    void *runs = tp_cuda_scratch(stream,
                                 tp_cuda_column_sums_scratch(rows, n, (dscale != NULL) + (dbias != NULL)) + 1);
    tp_cuda_launch_column_sums_f32(dy, x, mean, inv_std, rows, n, dscale, dbias, runs, stream->cuda);
  }
  return TP_KERNEL_OK;
}
