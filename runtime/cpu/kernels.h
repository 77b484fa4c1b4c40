/* The CPU kernels' declarations, one per SIG row of
 * runtime/kernels/kernels.def: TpKernelStatus tp_<stem>(parameters). Each kernel's comment
 * (what it computes, its shapes) is above its row there; its definition is in the file of
 * its header (the row's header column: elementwise.c for ELEMENTWISE, ...), which includes
 * this through that header, so a definition that differs from its row does not compile.
 * The kernel headers (elementwise.h ... transformer.h) include this; what they declare
 * themselves is not a kernel of kernels.def. */
#ifndef TOKPIPE_CPU_KERNELS_H
#define TOKPIPE_CPU_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "../../base/tensor.h"
#include "../kernels/args.h"

#define SIG(stem, ...) TpKernelStatus tp_##stem(__VA_ARGS__);
#include "../kernels/kernels.def"
#undef SIG

#endif
