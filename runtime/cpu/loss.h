/* Classification losses on the CPU, f32: negative log-likelihood and softmax cross-entropy
 * as ONNX defines them (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss). Declared from
 * their rows of runtime/kernels/kernels.def (kernels.h), their comments there. */
#ifndef TOKPIPE_CPU_LOSS_H
#define TOKPIPE_CPU_LOSS_H

#include "kernels.h"

#endif
