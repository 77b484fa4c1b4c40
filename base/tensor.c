#include "tensor.h"

#include <string.h>
#include <unistd.h>

#include "half.h"

size_t tp_dtype_size(TpDType t) {
  switch (t) {
#define TP_X(name, num, spelling, size)                                                                             \
  case TP_##name: return size;
    TP_DTYPES(TP_X)
#undef TP_X
  default: return 0;
  }
}

const char *tp_dtype_name(TpDType t) {
  switch (t) {
#define TP_X(name, num, spelling, size)                                                                             \
  case TP_##name: return spelling;
    TP_DTYPES(TP_X)
#undef TP_X
  default: return NULL;
  }
}

TpDType tp_dtype_from_name(const char *s) {
#define TP_X(name, num, spelling, size)                                                                             \
  if (strcmp(s, spelling) == 0) return TP_##name;
  TP_DTYPES(TP_X)
#undef TP_X
  return TP_UNDEF;
}

bool tp_dtype_is_float(TpDType t) { return t == TP_F32 || t == TP_F64 || t == TP_F16 || t == TP_BF16; }

bool tp_dtype_is_integer(TpDType t) {
  switch (t) {
  case TP_U8:
  case TP_I8:
  case TP_U16:
  case TP_I16:
  case TP_I32:
  case TP_I64:
  case TP_U32:
  case TP_U64: return true;
  default: return false;
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

float tp_f16_to_f32(uint16_t h) { return tp_half_f16_to_f32(h); }
uint16_t tp_f32_to_f16(float f) { return tp_half_f32_to_f16(f); }
float tp_bf16_to_f32(uint16_t h) { return tp_half_bf16_to_f32(h); }
uint16_t tp_f32_to_bf16(float f) { return tp_half_f32_to_bf16(f); }

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
  case TP_U8:
  case TP_BOOL: return u.u8;
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
