/* Reduction CPU kernels: ReduceSum and ReduceMean over a set of axes, CumSum along one. */
#ifndef TOKPIPE_CPU_REDUCE_H
#define TOKPIPE_CPU_REDUCE_H

#include "elementwise.h"

/* y = sum (mean when `mean`) of x over axes[0..naxes) (sorted, distinct, in [0, rank)).
 * y's dims are x's with the reduced ones set to 1 or dropped (keepdims or not: the same
 * data). Floats accumulate in double; integers wrap, and their mean truncates. */
TpKernelStatus tp_reduce_sum(const TpTensor *x, const int64_t *axes, int naxes, bool mean,
                             TpTensor *y);
/* y = running sums of x along axis (same dims and dtype): y[j] = x[0] + ... + x[j], without
 * x[j] when `exclusive`, from the end when `reverse`. Accumulates as tp_reduce_sum. */
TpKernelStatus tp_cumsum(const TpTensor *x, int axis, bool exclusive, bool reverse, TpTensor *y);
/* TopK: y (i64, x's dims but k = y's dim on axis) gets the indices of each line's k largest
 * entries along axis, largest first, ties by lower index, NaN above all (scalar.h). */
TpKernelStatus tp_topk(const TpTensor *x, int axis, TpTensor *y);

#endif
