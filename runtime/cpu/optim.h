/* Optimizer kernels for the trainer, f32: the AdamW update and the pieces of global-norm
 * gradient clipping. */
#ifndef TOKPIPE_CPU_OPTIM_H
#define TOKPIPE_CPU_OPTIM_H

#include <stdint.h>

/* One AdamW step over n parameters, as torch.optim.AdamW (amsgrad off) does it, in its
 * order of float operations, with step = 1 on the first call:
 *   w = w * (1 - lr * weight_decay)                        decoupled weight decay
 *   m = m * beta1 + (1 - beta1) * g
 *   v = v * beta2 + (1 - beta2) * g * g
 *   w = w - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
 * The scalar factors are computed in double, the per-element work in float
 * (runtime/kernels/element.h, tp_adamw_factors and tp_adamw_element).
 *   w, g, m, v (n); m and v start at 0 */
void tp_adamw_step(float *w, const float *g, float *m, float *v, int64_t n, double lr, double beta1, double beta2,
                   double eps, double weight_decay, int64_t step);

/* sum of x[i]^2 in double; the order of the additions does not depend on the thread count:
 * x is cut into TP_SUM_PIECES pieces (piece p: [n * p / 64, n * (p + 1) / 64)), each summed in
 * order, and the pieces are added in order. The global gradient norm is the sqrt of the sum
 * of this over every gradient. */
#define TP_SUM_PIECES 64
double tp_sum_squares_f32(const float *x, int64_t n);
/* out[j] = the sum of piece first + j of tp_sum_squares_f32, for j < count. */
void tp_sum_squares_pieces_f32(const float *x, int64_t n, int first, int count, double *out);

/* x *= s (e.g. the clipping factor max_norm / (norm + 1e-6) when it is below 1). */
void tp_scale_f32(float *x, int64_t n, float s);

#endif
