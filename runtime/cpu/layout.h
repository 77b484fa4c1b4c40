/* Data-movement CPU kernels: Gather, GatherElements, Reshape, Expand, Tile, Transpose,
 * Split, Slice, Concat, Trilu. Generic over dtypes by element size. The output views' dims give the result
 * shapes; the kernels check that they fit the inputs. */
#ifndef TOKPIPE_CPU_LAYOUT_H
#define TOKPIPE_CPU_LAYOUT_H

#include "elementwise.h"

/* y = data taken along `axis` at `indices` (i32 or i64; -n <= index < n, negatives count
 * from the end). y's dims: data's before axis, then indices', then data's after axis. An
 * index out of range gives TP_KERNEL_BAD_INDEX with the index in *bad. */
TpKernelStatus tp_gather(const TpTensor *data, const TpTensor *indices, int axis, TpTensor *y,
                         int64_t *bad);
/* y[i] = data[i with its `axis` coordinate replaced by indices[i]]: indices (i32 or i64,
 * negatives count from the end) and y have data's rank and the same dims, each of indices'
 * dims but `axis` at most data's. An index out of range: TP_KERNEL_BAD_INDEX, *bad. */
TpKernelStatus tp_gather_elements(const TpTensor *data, const TpTensor *indices, int axis, TpTensor *y,
                                  int64_t *bad);
/* Same elements, new dims (a copy). */
TpKernelStatus tp_reshape(const TpTensor *x, TpTensor *y);
/* x broadcast numpy-style to y's dims. */
TpKernelStatus tp_expand(const TpTensor *x, TpTensor *y);
/* x repeated along every dim: y's dim d is a multiple (repeats) of x's, y[i] = x[i mod x's dims]. */
TpKernelStatus tp_tile(const TpTensor *x, TpTensor *y);
/* y dim i = x dim perm[i]. */
TpKernelStatus tp_transpose(const TpTensor *x, const int64_t *perm, TpTensor *y);
/* ys[0..n) are consecutive pieces of x along axis, sized by their dims on it (a piece whose
 * data is NULL is skipped). */
TpKernelStatus tp_split(const TpTensor *x, int axis, TpTensor *ys, int n);
/* y[j] = x[starts + j*steps] per dim (steps may be negative). */
TpKernelStatus tp_slice(const TpTensor *x, const int64_t *starts, const int64_t *steps, TpTensor *y);
/* y = xs[0..n) joined along axis. */
TpKernelStatus tp_concat(const TpTensor *xs, int n, int axis, TpTensor *y);
/* Writes x as rows [at, at + x->dims[axis]) along `axis` of `buffer`, shaped like x but
 * with `rows` rows there: a token slice's keys or values appended to the context buffer
 * that holds the whole sequence's (IR: Concat {context_rows}). */
TpKernelStatus tp_context_append(const TpTensor *x, int axis, int64_t at, int64_t rows, void *buffer);
/* Keeps the upper (col - row >= k) or lower (col - row <= k) triangle of each matrix in the
 * last two dims, zeroing the rest. */
TpKernelStatus tp_trilu(const TpTensor *x, bool upper, int64_t k, TpTensor *y);

/* A tp_iter_run callback copying a run of n elements (their size in *(size_t *)ctx) from
 * p[1] to p[0] with their byte steps: the strided copy behind Slice, Transpose, Expand and
 * SliceBackward. */
void tp_copy_run(const void *ctx, int64_t n, char *const p[], const int64_t step[]);

#endif
