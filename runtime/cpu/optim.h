/* Optimizer kernels for the trainer, f32: the AdamW update and the pieces of global-norm
 * gradient clipping. */
#ifndef TOKPIPE_CPU_OPTIM_H
#define TOKPIPE_CPU_OPTIM_H

#include <math.h>
#include <stdint.h>

#include "../../base/host_device.h"

/* One AdamW step over n parameters, as torch.optim.AdamW (amsgrad off) does it, in its
 * order of float operations, with step = 1 on the first call:
 *   w = w * (1 - lr * weight_decay)                        decoupled weight decay
 *   m = m * beta1 + (1 - beta1) * g
 *   v = v * beta2 + (1 - beta2) * g * g
 *   w = w - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
 * The scalar factors are computed in double, the per-element work in float.
 *   w, g, m, v (n); m and v start at 0 */
void tp_adamw_step(float *w, const float *g, float *m, float *v, int64_t n, double lr, double beta1,
                   double beta2, double eps, double weight_decay, int64_t step);

/* tp_adamw_step's scalar factors, computed in double and rounded to float once. */
typedef struct {
  float decay, b1, a1, b2, a2, neg_step_size, bc2_sqrt, eps;
} TpAdamWFactors;
static inline TpAdamWFactors tp_adamw_factors(double lr, double beta1, double beta2, double eps,
                                              double weight_decay, int64_t step) {
  TpAdamWFactors f; /* assigned, not designated: C++ (runtime/cuda) reads this too */
  f.decay = (float)(1 - lr * weight_decay);
  f.b1 = (float)beta1;
  f.a1 = (float)(1 - beta1);
  f.b2 = (float)beta2;
  f.a2 = (float)(1 - beta2);
  f.neg_step_size = (float)-(lr / (1 - pow(beta1, (double)step)));
  f.bc2_sqrt = (float)sqrt(1 - pow(beta2, (double)step));
  f.eps = (float)eps;
  return f;
}

/* tp_adamw_step's per-element float work on element i, in its order of operations: the one
 * copy the CPU loop and the CUDA kernel both run. */
TP_HOST_DEVICE static inline void tp_adamw_element(float *w, const float *g, float *m, float *v, int64_t i,
                                                   TpAdamWFactors f) {
  float wi = w[i] * f.decay, gi = g[i];
  float mi = m[i] * f.b1 + f.a1 * gi;
  float vi = v[i] * f.b2 + f.a2 * gi * gi;
  float denom = sqrtf(vi) / f.bc2_sqrt + f.eps;
  w[i] = wi + f.neg_step_size * mi / denom;
  m[i] = mi;
  v[i] = vi;
}

/* sum of x[i]^2 in double; the order of the additions does not depend on the thread count.
 * The global gradient norm is the sqrt of the sum of this over every gradient. */
double tp_sum_squares_f32(const float *x, int64_t n);

/* x *= s (e.g. the clipping factor max_norm / (norm + 1e-6) when it is below 1). */
void tp_scale_f32(float *x, int64_t n, float s);

#endif
