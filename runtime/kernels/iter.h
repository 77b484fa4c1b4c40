/* The strided iterator both targets build on the host: numpy broadcasting of the operands
 * of Add, Where, Expand and the like (with its shape check: the operands broadcast to the
 * output or not), and contiguous strides. */
#ifndef TOKPIPE_KERNELS_ITER_H
#define TOKPIPE_KERNELS_ITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../base/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- strided iteration ----
 * Walks an n-d index space in row-major order over up to TP_ITER_MAX_OPERANDS operands,
 * each with its own byte strides (0 on broadcast dims, negative for reversed slices).
 * Operand 0 is conventionally the output. The space is cut into runs along the innermost
 * dim (cpu/elementwise.h tp_iter_run); a CUDA kernel takes it as element strides
 * (cuda/strided.cuh). Built on the host, for both targets. */
#define TP_ITER_MAX_OPERANDS 4

typedef struct {
  int rank, noperands;
  int64_t dims[TP_MAX_RANK];
  int64_t strides[TP_ITER_MAX_OPERANDS][TP_MAX_RANK]; /* bytes */
} TpIter;

/* Byte strides of a contiguous row-major tensor of the given dims. */
void tp_contiguous_strides(int rank, const int64_t *dims, size_t elsize, int64_t *strides);
/* out = broadcast of ops[1..]: operand k's strides over out's dims (ops[0] is the output,
 * contiguous). False if an operand does not broadcast to the output's shape. */
bool tp_iter_broadcast(TpIter *it, int noperands, const TpTensor *const ops[]);
/* Drops size-1 dims and merges dims that are contiguous for every operand. */
void tp_iter_coalesce(TpIter *it);

#ifdef __cplusplus
}
#endif

#endif
