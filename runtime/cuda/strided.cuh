/* A host TpIter (byte strides) as the kernels take it: element strides, passed by value,
 * and each operand's offset found from the output index. */
#ifndef TOKPIPE_CUDA_STRIDED_CUH
#define TOKPIPE_CUDA_STRIDED_CUH

#include "common.cuh"

struct Strided {
  int rank;
  int64_t dims[TP_MAX_RANK], stride[TP_ITER_MAX_OPERANDS][TP_MAX_RANK], n;
};

/* elsize[k]: operand k's element size in bytes (its byte strides are multiples of it). */
static inline Strided strided(const TpIter *it, const size_t *elsize) {
  Strided s = {};
  s.rank = it->rank, s.n = 1;
  for (int d = 0; d < it->rank; d++) {
    s.dims[d] = it->dims[d];
    s.n *= it->dims[d];
    for (int k = 0; k < it->noperands; k++) s.stride[k][d] = it->strides[k][d] / (int64_t)elsize[k];
  }
  return s;
}

/* Operand k's element offset at output index e (row-major over s.dims). */
__device__ __forceinline__ int64_t offset_of(const Strided &s, int k, int64_t e) {
  int64_t at = 0;
  for (int d = s.rank - 1; d >= 0; d--) {
    at += e % s.dims[d] * s.stride[k][d];
    e /= s.dims[d];
  }
  return at;
}

#endif
