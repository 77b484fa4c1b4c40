/* Reduction CPU kernels: ReduceSum and ReduceMean over a set of axes. */
#ifndef TOKPIPE_CPU_REDUCE_H
#define TOKPIPE_CPU_REDUCE_H

#include "elementwise.h"

/* y = sum (mean when `mean`) of x over axes[0..naxes) (sorted, distinct, in [0, rank)).
 * y's dims are x's with the reduced ones set to 1 or dropped (keepdims or not: the same
 * data). Floats accumulate in double; integers wrap, and their mean truncates. */
TpKernelStatus tp_reduce_sum(const TpTensor *x, const int64_t *axes, int naxes, bool mean,
                             TpTensor *y);

#endif
