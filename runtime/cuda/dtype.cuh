/* What the kernels of other dtypes than f32 (anydtype.cu, reduce.cu) share beside the
 * elementwise conversions of cpu/scalar.h (host and device code): the sums as cpu/reduce.c
 * keeps them, element copies, index loads and the bad-index report. */
#ifndef TOKPIPE_CUDA_DTYPE_CUH
#define TOKPIPE_CUDA_DTYPE_CUH

#include "common.cuh" /* first: kernels.h includes the C headers under extern "C" */
#include "../kernels/scalar.h"

/* An f32 result as its entry point stores it: as it is, or rounded to bf16 (to nearest even,
 * as base/half.h and the bf16 products round their operands) by the kernels.def
 * BF16_RESULT_SIG entries. */
__device__ static inline void tp_store_result(float *p, float x) { *p = x; }
__device__ static inline void tp_store_result(uint16_t *p, float x) { *p = tp_half_f32_to_bf16(x); }

/* Sums as cpu/reduce.c keeps them: floats in double (*f), integers wrapping in 64 bits (*u). */
__device__ static inline void tp_sum_element(TpDType t, const char *p, double *f, uint64_t *u) {
  if (tp_dclass(t) == TP_CLASS_FLOAT) *f += tp_load_float(t, p);
  else *u += tp_load_bits(t, p);
}

/* A sum stored as cpu/reduce.c stores it (f16 and bf16 through f32). */
__device__ static inline void tp_store_sum(TpDType t, size_t es, char *p, double f, uint64_t u) {
  switch (t) {
  case TP_F32: *reinterpret_cast<float *>(p) = (float)f; break;
  case TP_F64: *reinterpret_cast<double *>(p) = f; break;
  case TP_F16: *reinterpret_cast<uint16_t *>(p) = tp_half_f32_to_f16((float)f); break;
  case TP_BF16: *reinterpret_cast<uint16_t *>(p) = tp_half_f32_to_bf16((float)f); break;
  default: tp_store_bits(t, es, p, u); break;
  }
}

/* Copies one element of es bytes (1, 2, 4 or 8). */
__device__ static inline void tp_copy_element(size_t es, char *dst, const char *src) {
  switch (es) {
  case 1: *dst = *src; break;
  case 2: *reinterpret_cast<uint16_t *>(dst) = *reinterpret_cast<const uint16_t *>(src); break;
  case 4: *reinterpret_cast<uint32_t *>(dst) = *reinterpret_cast<const uint32_t *>(src); break;
  default: *reinterpret_cast<uint64_t *>(dst) = *reinterpret_cast<const uint64_t *>(src); break;
  }
}

/* An index element (i32 or i64) of indices. */
__device__ static inline int64_t tp_load_index(TpDType t, const void *indices, int64_t j) {
  return t == TP_I64 ? static_cast<const int64_t *>(indices)[j] : static_cast<const int32_t *>(indices)[j];
}

/* The smallest position (of an index out of range) reported so far stays in *bad
 * (stream->bad); v is a position, never the index's value. */
__device__ static inline void tp_report_bad(int64_t *bad, int64_t v) {
  atomicMin(reinterpret_cast<long long *>(bad), static_cast<long long>(v));
}

#endif
