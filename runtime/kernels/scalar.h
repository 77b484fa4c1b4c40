/* One element of any dtype, for the kernels that convert (cpu/elementwise.c, and the CUDA
 * kernels of other dtypes than f32 in runtime/cuda, which include this too: host and device
 * code alike): loads and stores with the conversions the elementwise kernels define, and
 * the integer arithmetic and comparisons they compute. Floats are computed in double,
 * integers in 64-bit two's complement. */
#ifndef TOKPIPE_KERNELS_SCALAR_H
#define TOKPIPE_KERNELS_SCALAR_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "../../base/half.h" /* TP_HOST_DEVICE */
#include "args.h"            /* TpDType, TpUnaryOp, TpBinaryOp */

typedef enum { TP_CLASS_FLOAT, TP_CLASS_SIGNED, TP_CLASS_UNSIGNED, TP_CLASS_BOOL, TP_CLASS_NONE } TpDClass;

TP_HOST_DEVICE static inline TpDClass tp_dclass(TpDType t) {
  switch (t) {
  case TP_F32:
  case TP_F64:
  case TP_F16:
  case TP_BF16: return TP_CLASS_FLOAT;
  case TP_I8:
  case TP_I16:
  case TP_I32:
  case TP_I64: return TP_CLASS_SIGNED;
  case TP_U8:
  case TP_U16:
  case TP_U32:
  case TP_U64: return TP_CLASS_UNSIGNED;
  case TP_BOOL: return TP_CLASS_BOOL;
  default: return TP_CLASS_NONE;
  }
}

TP_HOST_DEVICE static inline double tp_load_float(TpDType t, const char *p) {
  switch (t) {
  case TP_F32: {
    float v;
    memcpy(&v, p, 4);
    return v;
  }
  case TP_F64: {
    double v;
    memcpy(&v, p, 8);
    return v;
  }
  case TP_F16: {
    uint16_t v;
    memcpy(&v, p, 2);
    return tp_half_f16_to_f32(v);
  }
  case TP_BF16: {
    uint16_t v;
    memcpy(&v, p, 2);
    return tp_half_bf16_to_f32(v);
  }
  default: return 0;
  }
}

/* An integer or bool element as 64 bits, sign-extended for signed dtypes. */
TP_HOST_DEVICE static inline uint64_t tp_load_bits(TpDType t, const char *p) {
  switch (t) {
  case TP_I8: {
    int8_t v;
    memcpy(&v, p, 1);
    return (uint64_t)(int64_t)v;
  }
  case TP_I16: {
    int16_t v;
    memcpy(&v, p, 2);
    return (uint64_t)(int64_t)v;
  }
  case TP_I32: {
    int32_t v;
    memcpy(&v, p, 4);
    return (uint64_t)(int64_t)v;
  }
  case TP_I64: {
    int64_t v;
    memcpy(&v, p, 8);
    return (uint64_t)v;
  }
  case TP_U8:
  case TP_BOOL: {
    uint8_t v;
    memcpy(&v, p, 1);
    return v;
  }
  case TP_U16: {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
  }
  case TP_U32: {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
  }
  case TP_U64: {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
  }
  default: return 0;
  }
}

/* Any numeric element as a double (exact for all but 64-bit integers beyond 2^53). */
TP_HOST_DEVICE static inline double tp_load_double(TpDType t, const char *p) {
  switch (tp_dclass(t)) {
  case TP_CLASS_FLOAT: return tp_load_float(t, p);
  case TP_CLASS_SIGNED: return (double)(int64_t)tp_load_bits(t, p);
  default: return (double)tp_load_bits(t, p);
  }
}

/* TopK's order of a line of numbers: (a, i) before (b, j) when a is NaN and b is not, or a > b,
 * or they are equal (or both NaN) and i < j: largest first, ties by lower index (ONNX). */
TP_HOST_DEVICE static inline bool tp_topk_before(double a, int64_t i, double b, int64_t j) {
  if (isnan(a) != isnan(b)) return isnan(a);
  if (!isnan(a) && a != b) return a > b;
  return i < j;
}

/* TopK of one line: the n numbers of dtype t `step` bytes apart from x; the indices of the k
 * first in tp_topk_before's order into idx[0], idx[idx_step], ... Each pick is the first of
 * the entries after the previous pick: O(n k), for the few experts a router chooses from. */
TP_HOST_DEVICE static inline void tp_topk_line(TpDType t, const char *x, int64_t n, int64_t step, int64_t k,
                                               int64_t *idx, int64_t idx_step) {
  double prev = 0;
  int64_t prev_i = -1;
  for (int64_t r = 0; r < k; r++) {
    double best = 0;
    int64_t best_i = -1;
    for (int64_t i = 0; i < n; i++) {
      double v = tp_load_double(t, x + i * step);
      if (prev_i >= 0 && !tp_topk_before(prev, prev_i, v, i)) continue; /* picked already */
      if (best_i < 0 || tp_topk_before(v, i, best, best_i)) best = v, best_i = i;
    }
    idx[r * idx_step] = best_i;
    prev = best, prev_i = best_i;
  }
}

/* The low bytes of v (two's complement wraps); bool stores v != 0. es: t's size. */
TP_HOST_DEVICE static inline void tp_store_bits(TpDType t, size_t es, char *p, uint64_t v) {
  switch (es) {
  case 1: {
    uint8_t x = t == TP_BOOL ? v != 0 : (uint8_t)v;
    memcpy(p, &x, 1);
    break;
  }
  case 2: {
    uint16_t x = (uint16_t)v;
    memcpy(p, &x, 2);
    break;
  }
  case 4: {
    uint32_t x = (uint32_t)v;
    memcpy(p, &x, 4);
    break;
  }
  case 8: memcpy(p, &v, 8); break;
  }
}

/* v rounded to f32 with round-to-odd, so that a second rounding to f16/bf16 (11 and 8
 * bits, far below f32's 24) gives the correctly rounded result of v. */
TP_HOST_DEVICE static inline float tp_round_to_odd_f32(double v) {
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if (isfinite(f) && (double)f != v && !(bits & 1)) f = nextafterf(f, v > f ? INFINITY : -INFINITY);
  return f;
}

TP_HOST_DEVICE static inline void tp_store_float(TpDType t, char *p, double v) {
  switch (t) {
  case TP_F32: {
    float x = (float)v;
    memcpy(p, &x, 4);
    break;
  }
  case TP_F64: memcpy(p, &v, 8); break;
  case TP_F16: {
    uint16_t x = tp_half_f32_to_f16(tp_round_to_odd_f32(v));
    memcpy(p, &x, 2);
    break;
  }
  case TP_BF16: {
    uint16_t x = tp_half_f32_to_bf16(tp_round_to_odd_f32(v));
    memcpy(p, &x, 2);
    break;
  }
  default: break;
  }
}

/* Float to integer dtype t (es bytes): truncation toward zero; NaN gives 0, out-of-range
 * saturates. */
TP_HOST_DEVICE static inline uint64_t tp_float_to_bits(TpDType t, size_t es, double v) {
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

/* Integer arithmetic wraps; division truncates and x/0 gives 0. Pow: integer exponents by
 * squaring, float exponents through double. b's dtype tb, the result's ty (ey bytes). */
TP_HOST_DEVICE static inline uint64_t tp_int_binary(TpBinaryOp op, bool sgn, uint64_t a, TpDType tb, const char *pb,
                                                    TpDType ty, size_t ey) {
  uint64_t b = tp_dclass(tb) == TP_CLASS_FLOAT ? 0 : tp_load_bits(tb, pb);
  switch (op) {
  case TP_BINARY_ADD: return a + b;
  case TP_BINARY_SUB: return a - b;
  case TP_BINARY_MUL: return a * b;
  case TP_BINARY_MAX: return (sgn ? (int64_t)a > (int64_t)b : a > b) ? a : b;
  case TP_BINARY_MIN: return (sgn ? (int64_t)a < (int64_t)b : a < b) ? a : b;
  case TP_BINARY_DIV:
    if (b == 0) return 0;
    if (!sgn) return a / b;
    if ((int64_t)b == -1) return 0 - a; /* INT64_MIN / -1 wraps */
    return (uint64_t)((int64_t)a / (int64_t)b);
  case TP_BINARY_POW: {
    if (tp_dclass(tb) == TP_CLASS_FLOAT) {
      double base = sgn ? (double)(int64_t)a : (double)a;
      return tp_float_to_bits(ty, ey, pow(base, tp_load_float(tb, pb)));
    }
    if (tp_dclass(tb) == TP_CLASS_SIGNED && (int64_t)b < 0) /* 1/a^|b| truncated */
      return a == 1 ? 1 : sgn && (int64_t)a == -1 ? ((b & 1) ? a : 1) : 0;
    uint64_t r = 1;
    for (; b; b >>= 1, a *= a)
      if (b & 1) r *= a;
    return r;
  }
  default: return 0;
  }
}

TP_HOST_DEVICE static inline bool tp_compare(TpBinaryOp op, int c) { /* c: sign of a - b; 2 when unordered (NaN) */
  switch (op) {
  case TP_BINARY_EQUAL: return c == 0;
  case TP_BINARY_LESS: return c == -1;
  case TP_BINARY_LESS_EQUAL: return c == -1 || c == 0;
  case TP_BINARY_GREATER: return c == 1;
  case TP_BINARY_GREATER_EQUAL: return c == 1 || c == 0;
  default: return false;
  }
}

TP_HOST_DEVICE static inline int tp_compare3(TpDType t, const char *pa, const char *pb) {
  switch (tp_dclass(t)) {
  case TP_CLASS_FLOAT: {
    double a = tp_load_float(t, pa), b = tp_load_float(t, pb);
    return a < b ? -1 : a > b ? 1 : a == b ? 0 : 2;
  }
  case TP_CLASS_SIGNED: {
    int64_t a = (int64_t)tp_load_bits(t, pa), b = (int64_t)tp_load_bits(t, pb);
    return (a > b) - (a < b);
  }
  default: {
    uint64_t a = tp_load_bits(t, pa), b = tp_load_bits(t, pb);
    return (a > b) - (a < b);
  }
  }
}

/* The dtypes tp_unary and tp_binary take. */
static inline bool tp_unary_dtype_ok(TpUnaryOp op, TpDType x) {
  TpDClass cl = tp_dclass(x);
  return op == TP_UNARY_NOT                          ? cl == TP_CLASS_BOOL
         : op == TP_UNARY_NEG || op == TP_UNARY_RELU ? cl == TP_CLASS_FLOAT || cl == TP_CLASS_SIGNED
                                                     : cl == TP_CLASS_FLOAT;
}

static inline bool tp_binary_dtypes_ok(TpBinaryOp op, TpDType a, TpDType b, TpDType y) {
  TpDClass ca = tp_dclass(a), cb = tp_dclass(b);
  switch (op) {
  case TP_BINARY_AND: return a == TP_BOOL && b == TP_BOOL && y == TP_BOOL;
  case TP_BINARY_EQUAL:
  case TP_BINARY_LESS:
  case TP_BINARY_LESS_EQUAL:
  case TP_BINARY_GREATER:
  case TP_BINARY_GREATER_EQUAL:
    return a == b && y == TP_BOOL && ca != TP_CLASS_NONE && (ca != TP_CLASS_BOOL || op == TP_BINARY_EQUAL);
  case TP_BINARY_POW:
    return a == y && ca != TP_CLASS_NONE && ca != TP_CLASS_BOOL && cb != TP_CLASS_NONE && cb != TP_CLASS_BOOL;
  default: return a == b && a == y && ca != TP_CLASS_NONE && ca != TP_CLASS_BOOL;
  }
}

#endif
