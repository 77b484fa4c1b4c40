/* Kernels of the raised transformer ops (ir/ops.def: the rows of runtime/kernels/kernels.def
 * whose header is TRANSFORMER), f32, over flat row-major arrays: the linear layer, the
 * embedding and cross-entropy (whole and vocabulary-parallel), RMSNorm, rotary and the
 * gated MLPs. The backward kernels of the linear layer and cross-entropy are in
 * nn_backward.h (the embedding's is tp_gather_backward); those of the fused ops of modern
 * blocks are here, with nn_backward.h's conventions (they write the gradients; a NULL
 * result pointer skips one). Declared from their rows of kernels.def (kernels.h), their
 * comments (with the shapes) there. Shared by the reference interpreter and the generated
 * trainer. */
#ifndef TOKPIPE_CPU_TRANSFORMER_H
#define TOKPIPE_CPU_TRANSFORMER_H

#include "kernels.h"

#endif
