#include "tensor.h"

#include <string.h>
#include <unistd.h>

size_t tp_dtype_size(TpDType t) {
  switch (t) {
#define TP_X(name, num, spelling, size) \
  case TP_##name:                       \
    return size;
    TP_DTYPES(TP_X)
#undef TP_X
  default:
    return 0;
  }
}

const char *tp_dtype_name(TpDType t) {
  switch (t) {
#define TP_X(name, num, spelling, size) \
  case TP_##name:                       \
    return spelling;
    TP_DTYPES(TP_X)
#undef TP_X
  default:
    return NULL;
  }
}

TpDType tp_dtype_from_name(const char *s) {
#define TP_X(name, num, spelling, size) \
  if (strcmp(s, spelling) == 0) return TP_##name;
  TP_DTYPES(TP_X)
#undef TP_X
  return TP_UNDEF;
}

bool tp_dtype_is_float(TpDType t) { return t == TP_F32 || t == TP_F64 || t == TP_F16 || t == TP_BF16; }

bool tp_dtype_is_integer(TpDType t) {
  switch (t) {
  case TP_U8: case TP_I8: case TP_U16: case TP_I16: case TP_I32: case TP_I64: case TP_U32: case TP_U64:
    return true;
  default:
    return false;
  }
}

int64_t tp_numel(int rank, const int64_t *dims) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= dims[i];
  return n;
}

bool tp_dims_size_ok(int rank, const int64_t *dims) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) {
    if (dims[i] < 0 || (dims[i] && n > (INT64_C(1) << 50) / dims[i])) return false;
    if (dims[i]) n *= dims[i];
  }
  return true;
}

float tp_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: renormalise */
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        exp--;
      }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t tp_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = (int32_t)((x >> 23) & 0xff);
  uint32_t man = x & 0x7fffff;
  if (exp == 255) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
  exp = exp - 127 + 15;
  if (exp >= 31) return (uint16_t)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    man |= 0x800000;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13);
  uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* may carry into exponent: correct */
  return (uint16_t)half;
}

float tp_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t tp_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

double tp_tensor_get_f64(const TpTensor *t, int64_t i) {
  const unsigned char *p = (const unsigned char *)t->data + i * (int64_t)tp_dtype_size(t->dtype);
  union {
    float f32;
    double f64;
    int8_t i8;
    uint8_t u8;
    int16_t i16;
    uint16_t u16;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
  } u;
  memcpy(&u, p, tp_dtype_size(t->dtype));
  switch (t->dtype) {
  case TP_F32: return u.f32;
  case TP_F64: return u.f64;
  case TP_F16: return tp_f16_to_f32(u.u16);
  case TP_BF16: return tp_bf16_to_f32(u.u16);
  case TP_I8: return u.i8;
  case TP_U8: case TP_BOOL: return u.u8;
  case TP_I16: return u.i16;
  case TP_U16: return u.u16;
  case TP_I32: return u.i32;
  case TP_U32: return u.u32;
  case TP_I64: return (double)u.i64;
  case TP_U64: return (double)u.u64;
  default: return 0;
  }
}

int64_t tp_physical_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? (int64_t)pages * size : 0;
}

bool tp_slice_fits(int64_t start, int64_t step, int64_t n, int64_t dim) {
  if (n <= 0) return n == 0;
  if (start < 0 || start >= dim) return false;
  if (n == 1) return true;
  /* the last index moves (n-1)*|step| from start: compare by division, no product */
  uint64_t room = step > 0 ? (uint64_t)(dim - 1 - start) : (uint64_t)start;
  uint64_t mag = step > 0 ? (uint64_t)step : step < 0 ? -(uint64_t)step : 0;
  return mag != 0 && (uint64_t)(n - 1) <= room / mag;
}
