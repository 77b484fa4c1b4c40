/* A one-GPU training step priced kernel by kernel (cost.h's kernels and hardware profile):
 * the FLOPs, bytes, kernels and seconds of each class of kernel, the predicted step time,
 * tokens/s and MFU. It is what the first measured step on a device is compared with
 * (tests/device/run.sh), so that a gap points at a class of kernels. */
#ifndef TOKPIPE_PLANNER_GPU_STEP_H
#define TOKPIPE_PLANNER_GPU_STEP_H

#include "cost.h"

typedef enum {
  TP_GPU_PRODUCTS,    /* the layers' and the head's matrix products */
  TP_GPU_ATTENTION,   /* scores, softmax and mix (or the one flash kernel each way) */
  TP_GPU_ELEMENTWISE, /* norms, activations, residual adds, the embedding */
  TP_GPU_LOSS,        /* softmax cross-entropy over the vocabulary */
  TP_GPU_OPTIMIZER,   /* AdamW over every parameter, the gradient norm */
  TP_GPU_CLASSES
} TpGpuClass;

extern const char *const tp_gpu_class_names[TP_GPU_CLASSES];

typedef struct {
  double flops, bytes, seconds;
  int kernels;
} TpGpuClassCost;

typedef struct {
  TpGpuClassCost cls[TP_GPU_CLASSES];
  double tokens;      /* per step: batch x seq */
  double params;      /* N, as tp_stage_params counts them (a tied head once) */
  double model_flops; /* per step: (6 N' + 12 layers hidden seq) per token, N' = N less the
                         position table: nanoGPT's count (attention not halved for causality) */
  double seconds, tokens_per_s, mfu;
} TpGpuStep;

/* The step of `batch` sequences of cm's model (its seq tokens each) on one device of cm's
 * hardware: cm has one stage, no tensor or data parallelism (an internal error otherwise).
 * The classes run one after another (one stream); each kernel costs tp_kernel_time. */
void tp_gpu_step(const TpCostModel *cm, int batch, TpGpuStep *out);

#endif
