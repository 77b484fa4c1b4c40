/* Cross-entropy over rows of logits (tp_cross_entropy_f32 and its backward): one block per
 * row; the rows' losses summed in double by one block in a fixed order (deterministic). */
#include "common.cuh"

enum { LOSS_SUM_THREADS = 256 };

/* The row's maximum and sum of exp(x - max) (every thread gets both). */
__device__ void row_max_sumexp(const float *x, int64_t V, float *mx, float *sum) {
  float m = -INFINITY, s = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, x[j]);
  m = block_reduce(m, TpMax(), -INFINITY);
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += expf(x[j] - m);
  *mx = m;
  *sum = block_reduce(s, TpSum(), 0.0f);
}

__global__ void cross_entropy_rows_kernel(const float *logits, const int64_t *targets, int64_t V, double *row_loss,
                                          int64_t *bad) {
  int64_t r = blockIdx.x, t = targets[r];
  const float *x = logits + r * V;
  float mx, sum;
  row_max_sumexp(x, V, &mx, &sum);
  if (threadIdx.x != 0) return;
  if (t < 0 || t >= V) {
    row_loss[r] = 0;
    atomicMin(reinterpret_cast<long long *>(bad), static_cast<long long>(r));
    return;
  }
  double lse = isinf(mx) ? (double)mx : mx + log((double)sum); /* an infinite maximum is the logsumexp */
  row_loss[r] = lse - x[t];
}

__global__ void sum_rows_kernel(const double *row_loss, int64_t R, float denominator, float *loss) {
  double s = 0;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) s += row_loss[r];
  s = block_reduce(s, TpSum(), 0.0);
  if (threadIdx.x == 0) *loss = (float)(s / denominator);
}

void tp_cuda_launch_cross_entropy_f32(const float *logits, const int64_t *targets, int64_t R, int64_t V,
                               float denominator, float *loss, double *row_loss, int64_t *bad,
                               TpCudaStream stream) {
  if (R)
    TP_LAUNCH(cross_entropy_rows_kernel, dim3((unsigned)R), dim3(TP_CUDA_ROW_THREADS), stream, logits, targets, V,
              row_loss, bad);
  TP_LAUNCH(sum_rows_kernel, dim3(1), dim3(LOSS_SUM_THREADS), stream, row_loss, R, denominator, loss);
}

/* dlogits[r, :] = (softmax(logits[r, :]) - onehot(t)) * dloss / denominator */
__global__ void cross_entropy_backward_kernel(const float *dloss, const float *logits, const int64_t *targets,
                                              int64_t V, float denominator, float *dlogits, int64_t *bad) {
  int64_t r = blockIdx.x, t = targets[r];
  if (t < 0 || t >= V) { /* uniform over the block */
    if (threadIdx.x == 0) atomicMin(reinterpret_cast<long long *>(bad), static_cast<long long>(r));
    return;
  }
  const float *x = logits + r * V;
  float *o = dlogits + r * V, mx, sum, scale = *dloss / denominator;
  row_max_sumexp(x, V, &mx, &sum);
  float inv = 1.0f / sum * scale;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) o[j] = expf(x[j] - mx) * inv - (j == t ? scale : 0.0f);
}

void tp_cuda_launch_cross_entropy_backward_f32(const float *dloss, const float *logits, const int64_t *targets,
                                        int64_t R, int64_t V, float denominator, float *dlogits, int64_t *bad,
                                        TpCudaStream stream) {
  if (R == 0 || V == 0) return;
  TP_LAUNCH(cross_entropy_backward_kernel, dim3((unsigned)R), dim3(TP_CUDA_ROW_THREADS), stream, dloss, logits,
            targets, V, denominator, dlogits, bad);
}
