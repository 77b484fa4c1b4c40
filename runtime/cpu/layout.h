/* Data-movement CPU kernels: Gather, GatherElements, Reshape, Expand, Tile, Transpose,
 * Split, Slice, Concat, Trilu. Generic over dtypes by element size. The output views' dims give the result
 * shapes; the kernels check that they fit the inputs. The kernels are declared from their rows
 * of runtime/kernels/kernels.def (kernels.h, through elementwise.h), their comments there;
 * this header adds the strided copy they share. */
#ifndef TOKPIPE_CPU_LAYOUT_H
#define TOKPIPE_CPU_LAYOUT_H

#include "elementwise.h"

/* A tp_iter_run callback copying a run of n elements (their size in *(size_t *)ctx) from
 * p[1] to p[0] with their byte steps: the strided copy behind Slice, Transpose, Expand and
 * SliceBackward. */
void tp_copy_run(const void *ctx, int64_t n, char *const p[], const int64_t step[]);

#endif
