/* Element types and the plain tensor view shared by the runtime kernels, the reference
 * interpreter and the IR. Depends on nothing else in tokpipec. */
#ifndef TOKPIPE_TENSOR_H
#define TOKPIPE_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TP_MAX_RANK 8

/* Element types, numbered as ONNX's TensorProto.DataType so conversion is the identity.
 * X(enum suffix, ONNX number, IR spelling, size in bytes) */
#define TP_DTYPES(X)                                                                                                \
  X(F32, 1, "f32", 4)                                                                                               \
  X(U8, 2, "u8", 1)                                                                                                 \
  X(I8, 3, "i8", 1)                                                                                                 \
  X(U16, 4, "u16", 2)                                                                                               \
  X(I16, 5, "i16", 2)                                                                                               \
  X(I32, 6, "i32", 4)                                                                                               \
  X(I64, 7, "i64", 8)                                                                                               \
  X(BOOL, 9, "bool", 1)                                                                                             \
  X(F16, 10, "f16", 2)                                                                                              \
  X(F64, 11, "f64", 8)                                                                                              \
  X(U32, 12, "u32", 4)                                                                                              \
  X(U64, 13, "u64", 8)                                                                                              \
  X(BF16, 16, "bf16", 2)

typedef enum {
  TP_UNDEF = 0,
#define TP_X(name, num, spelling, size) TP_##name = num,
  TP_DTYPES(TP_X)
#undef TP_X
      TP_DTYPE_END
} TpDType;

/* A dense row-major tensor. `data` is not owned by the view. */
typedef struct {
  TpDType dtype;
  int rank;
  int64_t dims[TP_MAX_RANK];
  void *data;
} TpTensor;

/* 0 for an unknown dtype. */
size_t tp_dtype_size(TpDType t);
/* "f32", ...; NULL for an unknown dtype. */
const char *tp_dtype_name(TpDType t);
/* TP_UNDEF when the name is unknown. */
TpDType tp_dtype_from_name(const char *name);
bool tp_dtype_is_float(TpDType t);   /* f16, bf16, f32, f64 */
bool tp_dtype_is_integer(TpDType t); /* signed and unsigned integers, not bool */

int64_t tp_numel(int rank, const int64_t *dims);
static inline int64_t tp_tensor_numel(const TpTensor *t) { return tp_numel(t->rank, t->dims); }
static inline size_t tp_tensor_bytes(const TpTensor *t) {
  return (size_t)tp_tensor_numel(t) * tp_dtype_size(t->dtype);
}

/* Whether every dim is >= 0 and the product of the non-zero dims is at most 2^50: sizes
 * of any part of the tensor stay far from overflow (dims of an empty tensor too). */
bool tp_dims_size_ok(int rank, const int64_t *dims);

/* Whether the n indices start, start + step, ..., start + (n-1)*step all lie in [0, dim)
 * (n == 0 always fits; n > 1 needs step != 0). Exact for any int64 values: the one check
 * of Slice and SliceBackward shapes, in type inference and in the kernels. */
bool tp_slice_fits(int64_t start, int64_t step, int64_t n, int64_t dim);

/* Element i of a tensor of any numeric or bool dtype as a double; the data may be unaligned
 * (weights referenced inside a model file). */
double tp_tensor_get_f64(const TpTensor *t, int64_t i);

/* IEEE half and bfloat16 conversions (round to nearest even). */
float tp_f16_to_f32(uint16_t h);
uint16_t tp_f32_to_f16(float f);
float tp_bf16_to_f32(uint16_t h);
uint16_t tp_f32_to_bf16(float f);

/* The machine's physical memory in bytes (0: unknown): what tokpipec checks a plan's ranks
 * against, and what no one trainer buffer can exceed. */
int64_t tp_physical_memory(void);

#endif
