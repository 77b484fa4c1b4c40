#include "loss.h"

#include "nn.h"

TpKernelStatus tp_nll_loss_f32(const float *logp, const int64_t *target, int64_t N, int64_t C, int64_t D,
                               const TpLossOptions *o, float *loss, int64_t *bad) {
  double sum = 0, wsum = 0;
  for (int64_t n = 0; n < N; n++)
    for (int64_t d = 0; d < D; d++) {
      int64_t i = n * D + d, t = target[i];
      float l = 0;
      if (o->has_ignore && t == o->ignore_index) {
        if (o->reduction == TP_REDUCE_NONE) loss[i] = 0;
        continue;
      }
      if (t < 0 || t >= C) {
        *bad = i;
        return TP_KERNEL_BAD_INDEX;
      }
      float w = o->weight ? o->weight[t] : 1.0f;
      l = -logp[(n * C + t) * D + d] * w;
      if (o->reduction == TP_REDUCE_NONE) loss[i] = l;
      sum += l;
      wsum += w;
    }
  if (o->reduction == TP_REDUCE_SUM) loss[0] = (float)sum;
  if (o->reduction == TP_REDUCE_MEAN) loss[0] = (float)(sum / wsum);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_softmax_cross_entropy_f32(const float *scores, const int64_t *target, int64_t N, int64_t C,
                                            int64_t D, const TpLossOptions *o, float *log_prob, float *loss,
                                            int64_t *bad) {
  tp_softmax_f32(scores, log_prob, N, C, D, true);
  return tp_nll_loss_f32(log_prob, target, N, C, D, o, loss, bad);
}
