/* Backward kernels of the data-movement ops (ir/ops.def: GatherBackward,
 * GatherElementsBackward, SliceBackward): the adjoints of tp_gather, tp_gather_elements and
 * tp_slice (layout.h), over TpTensor views whose dims give
 * the shapes. They write their result whole (zeros where the forward did not read). */
#ifndef TOKPIPE_CPU_LAYOUT_BACKWARD_H
#define TOKPIPE_CPU_LAYOUT_BACKWARD_H

#include "elementwise.h"

/* Of y = tp_gather(data, indices, axis): ddata = 0, then ddata[.., indices[j], ..] += dy[..,
 * j, ..]; repeated indices accumulate, in the order of j (deterministic: the work is split
 * over the columns after axis, never over j). Also Embedding's backward (axis 0).
 *   dy (outer, nidx, inner), indices (nidx) i32|i64 (negatives count from the end),
 *   padding_idx: an index in [0, n) whose positions add nothing (torch's embedding
 *   padding_idx: that row's gradient stays 0), or -1 for none,
 *   ddata (outer, n, inner): data's shape; f32.
 * An index outside [-n, n) gives TP_KERNEL_BAD_INDEX with the index in *bad. */
TpKernelStatus tp_gather_backward(const TpTensor *dy, const TpTensor *indices, int axis, int64_t padding_idx,
                                  TpTensor *ddata, int64_t *bad);

/* Of y = tp_gather_elements(data, indices, axis): ddata = 0, then ddata[i with its axis
 * coordinate replaced by indices[i]] += dy[i], in the order of i. dy and indices have the
 * same dims; ddata has data's; f32. An index outside [-n, n): TP_KERNEL_BAD_INDEX, *bad. */
TpKernelStatus tp_gather_elements_backward(const TpTensor *dy, const TpTensor *indices, int axis,
                                           TpTensor *ddata, int64_t *bad);

/* Of y = tp_slice(x, starts, steps): dx = 0, then dx[starts + j*steps] = dy[j] per dim
 * (steps may be negative, never 0). Any dtype; dx has x's shape, dy the slice's. */
TpKernelStatus tp_slice_backward(const TpTensor *dy, const int64_t *starts, const int64_t *steps,
                                 TpTensor *dx);

/* Their entries, over layout.h's argument structs. */
#include "layout.h"

#endif
