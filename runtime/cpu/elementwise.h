/* Elementwise CPU kernels (unary, binary with numpy broadcasting, Where, Cast) and the
 * strided iterator they share with the layout and reduction kernels. No IR dependency:
 * plain functions over TpTensor views; the output view's dims give the result shape.
 * Tensor data must be aligned to its element size (the fast paths load typed values). */
#ifndef TOKPIPE_CPU_ELEMENTWISE_H
#define TOKPIPE_CPU_ELEMENTWISE_H

#include "../../base/tensor.h"
#include "../kernels/args.h"
#include "../kernels/iter.h"

/* ---- strided iteration: TpIter (runtime/kernels/iter.h) run over on the CPU ---- */
typedef void (*TpRunFn)(const void *ctx, int64_t n, char *const ptr[], const int64_t step[]);

/* Calls fn over the whole space, base[k] being operand k's address at index 0; splits the
 * space across OpenMP threads when it is large. */
void tp_iter_run(const TpIter *it, char *const base[], TpRunFn fn, const void *ctx);

/* ---- unary ---- */

/* y = op(x), same shape and dtype. Floats (f16, bf16, f32, f64) for all but Not; Neg and
 * Relu also take signed integers. */
TpKernelStatus tp_unary(TpUnaryOp op, const TpTensor *x, TpTensor *y);

/* ---- binary, numpy broadcasting ---- */

/* y = a op b. Arithmetic over floats and integers (a, b, y one dtype, but Pow); comparisons
 * over any numeric dtype (and bool for Equal) into a bool y. */
TpKernelStatus tp_binary(TpBinaryOp op, const TpTensor *a, const TpTensor *b, TpTensor *y);

/* y = cond ? a : b with 3-way broadcasting; cond is bool, a, b, y share any dtype. */
TpKernelStatus tp_where(const TpTensor *cond, const TpTensor *a, const TpTensor *b, TpTensor *y);

/* y = x converted to y's dtype (any pair of dtypes; float -> integer truncates toward zero,
 * NaN gives 0 and out-of-range values saturate; nonzero -> true for bool). */
TpKernelStatus tp_cast(const TpTensor *x, TpTensor *y);

#endif
