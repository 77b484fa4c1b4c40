/* Backward kernels of the data-movement ops (ir/ops.def: GatherBackward,
 * GatherElementsBackward, SliceBackward): the adjoints of tp_gather, tp_gather_elements and
 * tp_slice (layout.h), over TpTensor views whose dims give
 * the shapes. They write their result whole (zeros where the forward did not read).
 * Declared from their rows of runtime/kernels/kernels.def (kernels.h), their comments
 * there. */
#ifndef TOKPIPE_CPU_LAYOUT_BACKWARD_H
#define TOKPIPE_CPU_LAYOUT_BACKWARD_H

#include "elementwise.h"
#include "layout.h"

#endif
