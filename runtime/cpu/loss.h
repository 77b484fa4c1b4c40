/* Classification losses on the CPU, f32: negative log-likelihood and softmax cross-entropy
 * as ONNX defines them (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss). */
#ifndef TOKPIPE_CPU_LOSS_H
#define TOKPIPE_CPU_LOSS_H

#include <stdbool.h>
#include <stdint.h>

#include "../kernels/args.h"


/* logp: [N, C, D] (D is the product of d1..dk, 1 when there are none); target: [N, D].
 * loss[n,d] = -logp[n, t, d] * weight[t] with t = target[n,d], 0 where t is ignored.
 * loss receives [N, D] (reduction none) or one scalar: the sum, or the mean weighted by
 * the targets' weights (ignored targets excluded; 0/0 is NaN). A class outside [0, C) that
 * is not ignored gives TP_KERNEL_BAD_INDEX with its flat index into target in *bad (loss is
 * then unspecified). */
TpKernelStatus tp_nll_loss_f32(const float *logp, const int64_t *target, int64_t N, int64_t C, int64_t D,
                               const TpLossOptions *o, float *loss, int64_t *bad);

/* The NLL loss of log_softmax(scores) along C; the log-probabilities [N, C, D] go to
 * log_prob (which the caller provides). Returns as tp_nll_loss_f32. */
TpKernelStatus tp_softmax_cross_entropy_f32(const float *scores, const int64_t *target, int64_t N,
                                            int64_t C, int64_t D, const TpLossOptions *o,
                                            float *log_prob, float *loss, int64_t *bad);

#endif
