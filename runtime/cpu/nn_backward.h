/* Backward kernels of the products and layers, f32 (ir/ops.def's *Backward ops): each
 * takes the gradient of the forward result (dy) and what the forward read, and WRITES the
 * gradients of the forward operands (it does not accumulate: a gradient used twice is
 * summed by the autodiff with Add). A NULL result pointer skips that gradient. Flat
 * row-major arrays with the shapes in the comments, like the forward kernels. Long sums
 * accumulate in double; none depends on the thread count, so results are reproducible bit
 * for bit. The kernels are declared from their rows of runtime/kernels/kernels.def
 * (kernels.h), their comments there; this header adds the column sums that several of them
 * (and transformer.c's) share. */
#ifndef TOKPIPE_CPU_NN_BACKWARD_H
#define TOKPIPE_CPU_NN_BACKWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "../../base/tensor.h"
#include "elementwise.h" /* TpKernelStatus */
#include "nn.h"          /* TpAttention */

/* Over the rows of dy (rows, n): sum_dy[j] = sum_r dy[r, j] and, when x is given,
 * sum_dy_xhat[j] = sum_r dy[r, j] * (x[r, j] - mean[r]) * inv_std[r] (mean NULL: 0);
 * either result may be NULL. The order of the sums does not depend on the thread count. */
void tp_column_sums_f32(const float *dy, const float *x, const float *mean, const float *inv_std, int64_t rows,
                        int64_t n, float *sum_dy_xhat, float *sum_dy);

#endif
