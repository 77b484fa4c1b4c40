/* The losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (one thread per target),
 * and cross-entropy over rows of logits (tp_cross_entropy_f32 and its backward): one block per
 * row; the rows' losses summed in double by one block in a fixed order (deterministic). */
#include "common.cuh"
#include "dtype.cuh" /* tp_report_bad, tp_store_result */
#include "ops.h"

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

/* Rows of V columns, the last pad of them padding (no probability; no target there). */
__global__ void cross_entropy_rows_kernel(const float *logits, const int64_t *targets, int64_t V, int64_t pad,
                                          double *row_loss, int64_t *bad) {
  int64_t r = blockIdx.x, t = targets[r];
  const float *x = logits + r * V;
  float mx, sum;
  row_max_sumexp(x, V - pad, &mx, &sum);
  if (threadIdx.x != 0) return;
  if (t < 0 || t >= V - pad) {
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

void tp_cuda_launch_cross_entropy_f32(const float *logits, const int64_t *targets, int64_t R, int64_t V, int64_t pad,
                                      float denominator, float *loss, double *row_loss, int64_t *bad,
                                      TpCudaStream stream) {
  if (R)
    TP_LAUNCH(cross_entropy_rows_kernel, dim3((unsigned)R), dim3(TP_CUDA_ROW_THREADS), stream, logits, targets, V,
              pad, row_loss, bad);
  TP_LAUNCH(sum_rows_kernel, dim3(1), dim3(LOSS_SUM_THREADS), stream, row_loss, R, denominator, loss);
}

/* dlogits[r, :] = (softmax(logits[r, :]) - onehot(t)) * dloss / denominator, stored as Out;
 * the last pad columns (padding) get 0 */
template <typename Out>
__global__ void cross_entropy_backward_kernel(const float *dloss, const float *logits, const int64_t *targets,
                                              int64_t V, int64_t pad, float denominator, Out *dlogits,
                                              int64_t *bad) {
  int64_t r = blockIdx.x, t = targets[r], classes = V - pad;
  if (t < 0 || t >= classes) { /* uniform over the block */
    if (threadIdx.x == 0) atomicMin(reinterpret_cast<long long *>(bad), static_cast<long long>(r));
    return;
  }
  const float *x = logits + r * V;
  Out *o = dlogits + r * V;
  float mx, sum, scale = *dloss / denominator;
  row_max_sumexp(x, classes, &mx, &sum);
  float inv = 1.0f / sum * scale;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
    tp_store_result(&o[j], j < classes ? expf(x[j] - mx) * inv - (j == t ? scale : 0.0f) : 0.0f);
}

template <typename Out>
static void launch_cross_entropy_backward(const float *dloss, const float *logits, const int64_t *targets, int64_t R,
                                          int64_t V, int64_t pad, float denominator, Out *dlogits, int64_t *bad,
                                          TpCudaStream stream) {
  if (R == 0 || V == 0) return;
  TP_LAUNCH(cross_entropy_backward_kernel<Out>, dim3((unsigned)R), dim3(TP_CUDA_ROW_THREADS), stream, dloss, logits,
            targets, V, pad, denominator, dlogits, bad);
}

void tp_cuda_launch_cross_entropy_backward_f32(const float *dloss, const float *logits, const int64_t *targets,
                                               int64_t R, int64_t V, int64_t pad, float denominator, float *dlogits,
                                               int64_t *bad, TpCudaStream stream) {
  launch_cross_entropy_backward(dloss, logits, targets, R, V, pad, denominator, dlogits, bad, stream);
}

/* ---- vocabulary-parallel (tp_cross_entropy_stats_f32 and the loss from the summed
 * statistics, runtime/cpu/transformer.h) ---- */

/* One block per row: this range's maximum and sum of exp in the row's statistics. */
/* The columns of range `part`'s V that are true classes: all but the last range's last pad
 * (a padded vocabulary, ir/ops.def's vocab_pad). */
__device__ int64_t range_classes(int64_t V, int64_t parts, int64_t part, int64_t pad) {
  return part == parts - 1 ? V - pad : V;
}

__global__ void cross_entropy_stats_kernel(const float *logits, const int64_t *targets, const int64_t *part,
                                           int64_t V, int64_t parts, int64_t pad, float *stats, int64_t *bad) {
  int64_t r = blockIdx.x, t = targets[r] - *part * V, width = 2 * parts + 1;
  float *s = stats + r * width, mx, sum;
  row_max_sumexp(logits + r * V, range_classes(V, parts, *part, pad), &mx, &sum);
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) s[j] = 0;
  __syncthreads();
  if (threadIdx.x != 0) return;
  /* the range: never past the row; no target in the padding */
  if (targets[r] < 0 || targets[r] >= V * parts - pad || *part < 0 || *part >= parts) {
    atomicMin(reinterpret_cast<long long *>(bad), static_cast<long long>(r));
    return;
  }
  s[*part] = mx, s[parts + *part] = isinf(mx) ? 1.0f : sum;
  if (t >= 0 && t < V) s[2 * parts] = logits[r * V + t];
}

void tp_cuda_launch_cross_entropy_stats_f32(const float *logits, const int64_t *targets, const int64_t *part,
                                            int64_t R, int64_t V, int64_t parts, int64_t pad, float *stats,
                                            int64_t *bad, TpCudaStream stream) {
  if (R == 0) return;
  TP_LAUNCH(cross_entropy_stats_kernel, dim3((unsigned)R), dim3(TP_CUDA_ROW_THREADS), stream, logits, targets, part,
            V, parts, pad, stats, bad);
}

/* From a row of summed statistics: the row's maximum and the sum of exp(x - max) over every
 * range, in double (the CPU's stats_sumexp). */
__device__ double stats_sumexp(const float *s, int64_t parts, float *mx) {
  float m = -INFINITY;
  for (int64_t p = 0; p < parts; p++) m = fmaxf(m, s[p]);
  *mx = m;
  if (isinf(m)) return 1;
  double sum = 0;
  for (int64_t p = 0; p < parts; p++)
    if (s[p] != -INFINITY) sum += s[parts + p] * exp((double)s[p] - m);
  return sum;
}

__global__ void cross_entropy_parts_rows_kernel(const float *stats, int64_t R, int64_t parts, double *row_loss) {
  TP_GRID_STRIDE_LOOP(r, R) {
    const float *s = stats + r * (2 * parts + 1);
    float mx;
    double sum = stats_sumexp(s, parts, &mx);
    row_loss[r] = (isinf(mx) ? (double)mx : mx + log(sum)) - s[2 * parts];
  }
}

void tp_cuda_launch_cross_entropy_parts_f32(const float *stats, int64_t R, int64_t parts, float denominator,
                                            float *loss, double *row_loss, TpCudaStream stream) {
  if (R)
    TP_LAUNCH(cross_entropy_parts_rows_kernel, tp_elementwise_grid(R), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream,
              stats, R, parts, row_loss);
  TP_LAUNCH(sum_rows_kernel, dim3(1), dim3(LOSS_SUM_THREADS), stream, row_loss, R, denominator, loss);
}

/* One block per row: exp(x - max) / sum - onehot, scaled (as cross_entropy_backward_kernel). */
__global__ void cross_entropy_parts_backward_kernel(const float *dloss, const float *logits, const int64_t *targets,
                                                    const float *stats, const int64_t *part, int64_t V,
                                                    int64_t parts, int64_t pad, float denominator, float *dlogits,
                                                    int64_t *bad) {
  int64_t r = blockIdx.x, t = targets[r];
  if (t < 0 || t >= V * parts - pad) { /* uniform over the block */
    if (threadIdx.x == 0) atomicMin(reinterpret_cast<long long *>(bad), static_cast<long long>(r));
    return;
  }
  t -= *part * V;
  const float *x = logits + r * V;
  float *o = dlogits + r * V, mx, scale = *dloss / denominator;
  float inv = (float)(1.0 / stats_sumexp(stats + r * (2 * parts + 1), parts, &mx)) * scale;
  int64_t classes = range_classes(V, parts, *part, pad); /* the padding: no probability, no gradient */
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
    o[j] = j < classes ? expf(x[j] - mx) * inv - (j == t ? scale : 0.0f) : 0.0f;
}

void tp_cuda_launch_cross_entropy_parts_backward_f32(const float *dloss, const float *logits, const int64_t *targets,
                                                     const float *stats, const int64_t *part, int64_t R, int64_t V,
                                                     int64_t parts, int64_t pad, float denominator, float *dlogits,
                                                     int64_t *bad, TpCudaStream stream) {
  if (R == 0 || V == 0) return;
  TP_LAUNCH(cross_entropy_parts_backward_kernel, dim3((unsigned)R), dim3(TP_CUDA_ROW_THREADS), stream, dloss, logits,
            targets, stats, part, V, parts, pad, denominator, dlogits, bad);
}

/* ---- the entry points (ops.h) ---- */

/* ---- NLL loss (loss.h): one thread per element of target; the sum in a fixed order ---- */

/* per element: its loss (into loss for reduction none) and weight, into terms [2][N*D]
 * for the sums; a class out of range (not ignored) reports its flat index */
__global__ void nll_terms_kernel(const float *logp, const int64_t *target, int64_t N, int64_t C, int64_t D,
                                 TpLossOptions o, float *loss, double *terms, int64_t *bad) {
  TP_GRID_STRIDE_LOOP(i, N * D) {
    int64_t n = i / D, d = i % D, t = target[i];
    float l = 0, w = 0;
    if (!(o.has_ignore && t == o.ignore_index)) {
      if (t < 0 || t >= C) {
        tp_report_bad(bad, i);
      } else {
        w = o.weight ? o.weight[t] : 1.0f;
        l = -logp[(n * C + t) * D + d] * w;
      }
    }
    if (o.reduction == TP_REDUCE_NONE) loss[i] = l;
    else terms[i] = l, terms[N * D + i] = w;
  }
}

/* One block: the sums of the terms in double, each thread a strided share, combined in a
 * fixed order (deterministic). */
__global__ void nll_reduce_kernel(const double *terms, int64_t count, TpReduction reduction, float *loss) {
  double sum = 0, wsum = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += terms[i], wsum += terms[count + i];
  sum = block_reduce(sum, TpSum(), 0.0);
  wsum = block_reduce(wsum, TpSum(), 0.0);
  if (threadIdx.x == 0) *loss = (float)(reduction == TP_REDUCE_SUM ? sum : sum / wsum);
}

TpKernelStatus tp_cuda_nll_loss_f32(const float *logp, const int64_t *target, int64_t N, int64_t C, int64_t D,
                                    const TpLossOptions *o, float *loss, int64_t *bad, TpStream *stream) {
  (void)bad;
  int64_t count = N * D;
  double *terms = NULL;
  if (o->reduction != TP_REDUCE_NONE)
    terms = static_cast<double *>(tp_cuda_scratch(stream, 2 * (size_t)count * sizeof(double) + 1));
  if (count)
    TP_LAUNCH(nll_terms_kernel, tp_elementwise_grid(count), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream->cuda, logp,
              target, N, C, D, *o, loss, terms, stream->bad);
  if (o->reduction != TP_REDUCE_NONE)
    TP_LAUNCH(nll_reduce_kernel, dim3(1), dim3(TP_CUDA_ROW_THREADS), stream->cuda, terms, count, o->reduction, loss);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_softmax_cross_entropy_f32(const float *scores, const int64_t *target, int64_t N, int64_t C,
                                                 int64_t D, const TpLossOptions *o, float *log_prob, float *loss,
                                                 int64_t *bad, TpStream *stream) {
  tp_cuda_softmax_f32(scores, log_prob, N, C, D, true, stream);
  return tp_cuda_nll_loss_f32(log_prob, target, N, C, D, o, loss, bad, stream);
}

TpKernelStatus tp_cuda_cross_entropy_f32(const float *logits, const int64_t *targets, int64_t R, int64_t V,
                                         float denominator, float *loss, int64_t *bad, TpStream *stream) {
  return tp_cuda_cross_entropy_pad_f32(logits, targets, R, V, 0, denominator, loss, bad, stream);
}

TpKernelStatus tp_cuda_cross_entropy_pad_f32(const float *logits, const int64_t *targets, int64_t R, int64_t V,
                                             int64_t pad, float denominator, float *loss, int64_t *bad,
                                             TpStream *stream) {
  (void)bad;
  TpKernelStatus status = tp_check_vocab_pad(V, pad);
  if (status != TP_KERNEL_OK) return status;
  double *row_loss = static_cast<double *>(tp_cuda_scratch(stream, (size_t)R * sizeof(double) + 1));
  tp_cuda_launch_cross_entropy_f32(logits, targets, R, V, pad, denominator, loss, row_loss, stream->bad,
                                   stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_cross_entropy_stats_f32(const float *logits, const int64_t *targets, const int64_t *part,
                                               int64_t R, int64_t V, int64_t parts, float *stats, int64_t *bad,
                                               TpStream *stream) {
  return tp_cuda_cross_entropy_stats_pad_f32(logits, targets, part, R, V, parts, 0, stats, bad, stream);
}

TpKernelStatus tp_cuda_cross_entropy_stats_pad_f32(const float *logits, const int64_t *targets, const int64_t *part,
                                                   int64_t R, int64_t V, int64_t parts, int64_t pad, float *stats,
                                                   int64_t *bad, TpStream *stream) {
  (void)bad;
  tp_cuda_launch_cross_entropy_stats_f32(logits, targets, part, R, V, parts, pad, stats, stream->bad, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_cross_entropy_parts_f32(const float *stats, int64_t R, int64_t parts, float denominator,
                                               float *loss, TpStream *stream) {
  double *row_loss = static_cast<double *>(tp_cuda_scratch(stream, (size_t)R * sizeof(double) + 1));
  tp_cuda_launch_cross_entropy_parts_f32(stats, R, parts, denominator, loss, row_loss, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_cross_entropy_parts_backward_f32(const float *dloss, const float *logits,
                                                        const int64_t *targets, const float *stats,
                                                        const int64_t *part, int64_t R, int64_t V, int64_t parts,
                                                        float denominator, float *dlogits, int64_t *bad,
                                                        TpStream *stream) {
  return tp_cuda_cross_entropy_parts_backward_pad_f32(dloss, logits, targets, stats, part, R, V, parts, 0,
                                                      denominator, dlogits, bad, stream);
}

TpKernelStatus tp_cuda_cross_entropy_parts_backward_pad_f32(const float *dloss, const float *logits,
                                                            const int64_t *targets, const float *stats,
                                                            const int64_t *part, int64_t R, int64_t V, int64_t parts,
                                                            int64_t pad, float denominator, float *dlogits,
                                                            int64_t *bad, TpStream *stream) {
  (void)bad;
  tp_cuda_launch_cross_entropy_parts_backward_f32(dloss, logits, targets, stats, part, R, V, parts, pad, denominator,
                                                  dlogits, stream->bad, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_cross_entropy_backward_f32(const float *dloss, const float *logits, const int64_t *targets,
                                                  int64_t R, int64_t V, float denominator, float *dlogits,
                                                  int64_t *bad, TpStream *stream) {
  return tp_cuda_cross_entropy_backward_pad_f32(dloss, logits, targets, R, V, 0, denominator, dlogits, bad, stream);
}

TpKernelStatus tp_cuda_cross_entropy_backward_pad_f32(const float *dloss, const float *logits,
                                                      const int64_t *targets, int64_t R, int64_t V, int64_t pad,
                                                      float denominator, float *dlogits, int64_t *bad,
                                                      TpStream *stream) {
  (void)bad;
  TpKernelStatus status = tp_check_vocab_pad(V, pad);
  if (status != TP_KERNEL_OK) return status;
  launch_cross_entropy_backward(dloss, logits, targets, R, V, pad, denominator, dlogits, stream->bad, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_cross_entropy_backward_bf16(const float *dloss, const float *logits, const int64_t *targets,
                                                   int64_t R, int64_t V, float denominator, uint16_t *dlogits,
                                                   int64_t *bad, TpStream *stream) {
  return tp_cuda_cross_entropy_backward_pad_bf16(dloss, logits, targets, R, V, 0, denominator, dlogits, bad, stream);
}

TpKernelStatus tp_cuda_cross_entropy_backward_pad_bf16(const float *dloss, const float *logits,
                                                       const int64_t *targets, int64_t R, int64_t V, int64_t pad,
                                                       float denominator, uint16_t *dlogits, int64_t *bad,
                                                       TpStream *stream) {
  (void)bad;
  TpKernelStatus status = tp_check_vocab_pad(V, pad);
  if (status != TP_KERNEL_OK) return status;
  launch_cross_entropy_backward(dloss, logits, targets, R, V, pad, denominator, dlogits, stream->bad, stream->cuda);
  return TP_KERNEL_OK;
}
