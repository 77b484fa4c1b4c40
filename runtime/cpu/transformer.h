/* Forward kernels of the raised transformer ops (ir/ops.def: Linear, Embedding,
 * CrossEntropy, RMSNorm, Rotary, SwiGLU, GeGLU, and the vocabulary-parallel Embedding and
 * CrossEntropy), f32, over flat row-major arrays. The backward kernels of the first three
 * are in nn_backward.h (Embedding's is tp_gather_backward); those of the fused ops of
 * modern blocks are here, with nn_backward.h's conventions (they write the gradients; a
 * NULL result pointer skips one). Declared from their rows of runtime/kernels/kernels.def
 * (kernels.h), their comments (with the shapes) there. Shared by the reference
 * interpreter and the generated trainer. */
#ifndef TOKPIPE_CPU_TRANSFORMER_H
#define TOKPIPE_CPU_TRANSFORMER_H

#include "kernels.h"

#endif
