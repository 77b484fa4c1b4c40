/* Reduction CPU kernels: ReduceSum and ReduceMean over a set of axes, CumSum and TopK along
 * one. Declared from their rows of runtime/kernels/kernels.def (kernels.h), their comments
 * there. */
#ifndef TOKPIPE_CPU_REDUCE_H
#define TOKPIPE_CPU_REDUCE_H

#include "elementwise.h"

#endif
