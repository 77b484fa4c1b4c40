/* Elementwise CPU kernels (unary, binary with numpy broadcasting, Where, Cast) and the
 * strided iterator they share with the layout and reduction kernels. No IR dependency:
 * plain functions over TpTensor views; the output view's dims give the result shape.
 * Tensor data must be aligned to its element size (the fast paths load typed values).
 * The kernels are declared from their rows of runtime/kernels/kernels.def (kernels.h), their
 * comments there; what this header declares itself is the iterator's CPU side. */
#ifndef TOKPIPE_CPU_ELEMENTWISE_H
#define TOKPIPE_CPU_ELEMENTWISE_H

#include "../../base/tensor.h"
#include "../kernels/args.h"
#include "../kernels/iter.h"
#include "kernels.h"

/* ---- strided iteration: TpIter (runtime/kernels/iter.h) run over on the CPU ---- */
typedef void (*TpRunFn)(const void *ctx, int64_t n, char *const ptr[], const int64_t step[]);

/* Calls fn over the whole space, base[k] being operand k's address at index 0; splits the
 * space across OpenMP threads when it is large. */
void tp_iter_run(const TpIter *it, char *const base[], TpRunFn fn, const void *ctx);

#endif
