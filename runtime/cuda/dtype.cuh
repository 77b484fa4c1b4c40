/* Device loads and stores of one element of any dtype, with the conversions of the CPU
 * kernels (cpu/elementwise.c's load_float, load_bits, store_float..., cpu/reduce.c's sums):
 * the kernels of other dtypes than f32 (anydtype.cu, reduce.cu) compute through these, in
 * double for floats and in 64-bit two's complement for integers, as the CPU does. */
#ifndef TOKPIPE_CUDA_DTYPE_CUH
#define TOKPIPE_CUDA_DTYPE_CUH

#include <math.h>

#include "../../base/half.h"
#include "common.cuh"

enum TpDClass { TP_CLASS_FLOAT, TP_CLASS_SIGNED, TP_CLASS_UNSIGNED, TP_CLASS_BOOL, TP_CLASS_NONE };

__host__ __device__ static inline TpDClass tp_dclass(TpDType t) {
  switch (t) {
  case TP_F32: case TP_F64: case TP_F16: case TP_BF16: return TP_CLASS_FLOAT;
  case TP_I8: case TP_I16: case TP_I32: case TP_I64: return TP_CLASS_SIGNED;
  case TP_U8: case TP_U16: case TP_U32: case TP_U64: return TP_CLASS_UNSIGNED;
  case TP_BOOL: return TP_CLASS_BOOL;
  default: return TP_CLASS_NONE;
  }
}

/* Elements are aligned to their size (elementwise.h), so they load as their type. */
__device__ static inline double tp_load_float(TpDType t, const char *p) {
  switch (t) {
  case TP_F32: return *reinterpret_cast<const float *>(p);
  case TP_F64: return *reinterpret_cast<const double *>(p);
  case TP_F16: return tp_half_f16_to_f32(*reinterpret_cast<const uint16_t *>(p));
  case TP_BF16: return tp_half_bf16_to_f32(*reinterpret_cast<const uint16_t *>(p));
  default: return 0;
  }
}

/* An integer or bool element as 64 bits, sign-extended for signed dtypes. */
__device__ static inline uint64_t tp_load_bits(TpDType t, const char *p) {
  switch (t) {
  case TP_I8: return (uint64_t)(int64_t)*reinterpret_cast<const int8_t *>(p);
  case TP_I16: return (uint64_t)(int64_t)*reinterpret_cast<const int16_t *>(p);
  case TP_I32: return (uint64_t)(int64_t)*reinterpret_cast<const int32_t *>(p);
  case TP_I64: return (uint64_t)*reinterpret_cast<const int64_t *>(p);
  case TP_U8: case TP_BOOL: return *reinterpret_cast<const uint8_t *>(p);
  case TP_U16: return *reinterpret_cast<const uint16_t *>(p);
  case TP_U32: return *reinterpret_cast<const uint32_t *>(p);
  case TP_U64: return *reinterpret_cast<const uint64_t *>(p);
  default: return 0;
  }
}

__device__ static inline double tp_load_double(TpDType t, const char *p) {
  switch (tp_dclass(t)) {
  case TP_CLASS_FLOAT: return tp_load_float(t, p);
  case TP_CLASS_SIGNED: return (double)(int64_t)tp_load_bits(t, p);
  default: return (double)tp_load_bits(t, p);
  }
}

/* The low bytes of v (two's complement wraps); bool stores v != 0. es: t's size. */
__device__ static inline void tp_store_bits(TpDType t, size_t es, char *p, uint64_t v) {
  switch (es) {
  case 1: *reinterpret_cast<uint8_t *>(p) = t == TP_BOOL ? v != 0 : (uint8_t)v; break;
  case 2: *reinterpret_cast<uint16_t *>(p) = (uint16_t)v; break;
  case 4: *reinterpret_cast<uint32_t *>(p) = (uint32_t)v; break;
  default: *reinterpret_cast<uint64_t *>(p) = v; break;
  }
}

/* v rounded to f32 with round-to-odd, so that the second rounding to f16/bf16 gives the
 * correctly rounded result of v (as the CPU's store_float). */
__device__ static inline float tp_round_to_odd_f32(double v) {
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if (isfinite(f) && (double)f != v && !(bits & 1)) f = nextafterf(f, v > f ? INFINITY : -INFINITY);
  return f;
}

__device__ static inline void tp_store_float(TpDType t, char *p, double v) {
  switch (t) {
  case TP_F32: *reinterpret_cast<float *>(p) = (float)v; break;
  case TP_F64: *reinterpret_cast<double *>(p) = v; break;
  case TP_F16: *reinterpret_cast<uint16_t *>(p) = tp_half_f32_to_f16(tp_round_to_odd_f32(v)); break;
  case TP_BF16: *reinterpret_cast<uint16_t *>(p) = tp_half_f32_to_bf16(tp_round_to_odd_f32(v)); break;
  default: break;
  }
}

/* A float to integer dtype t: truncation toward zero; NaN gives 0, out-of-range saturates. */
__device__ static inline uint64_t tp_float_to_bits(TpDType t, size_t es, double v) {
  if (isnan(v)) return 0;
  int bits = (int)es * 8;
  if (tp_dclass(t) == TP_CLASS_SIGNED) {
    double lo = -ldexp(1.0, bits - 1), hi = ldexp(1.0, bits - 1); /* valid: [lo, hi) */
    if (v <= lo) return (uint64_t)(int64_t)lo;
    if (v >= hi) return bits == 64 ? (uint64_t)INT64_MAX : (uint64_t)((int64_t)hi - 1);
    return (uint64_t)(int64_t)v;
  }
  double hi = ldexp(1.0, bits);
  if (v <= 0) return 0;
  if (v >= hi) return bits == 64 ? UINT64_MAX : (uint64_t)hi - 1;
  return (uint64_t)v;
}

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

/* The smallest out-of-range value reported so far stays in *bad (stream->bad). */
__device__ static inline void tp_report_bad(int64_t *bad, int64_t v) {
  atomicMin(reinterpret_cast<long long *>(bad), static_cast<long long>(v));
}

#endif
