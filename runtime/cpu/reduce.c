#include "reduce.h"

#include <string.h>

#include "../kernels/check.h"
#include "../kernels/scalar.h"

/* Adds a run of n elements `step` bytes apart to *acc (signed integers wrap modulo 2^64). */
#define SUM_RUN(T, ACC, CONVERT)                                                                                    \
  for (int64_t i = 0; i < n; i++) {                                                                                 \
    T v;                                                                                                            \
    memcpy(&v, p + i * step, sizeof v);                                                                             \
    *ACC += CONVERT(v);                                                                                             \
  }
#define AS_IS(v) (v)

static void sum_run(TpDType t, const char *p, int64_t n, int64_t step, double *f, uint64_t *u) {
  switch (t) {
  case TP_F32: SUM_RUN(float, f, AS_IS); break;
  case TP_F64: SUM_RUN(double, f, AS_IS); break;
  case TP_F16: SUM_RUN(uint16_t, f, tp_f16_to_f32); break;
  case TP_BF16: SUM_RUN(uint16_t, f, tp_bf16_to_f32); break;
  case TP_I8: SUM_RUN(int8_t, u, AS_IS); break;
  case TP_I16: SUM_RUN(int16_t, u, AS_IS); break;
  case TP_I32: SUM_RUN(int32_t, u, AS_IS); break;
  case TP_I64: SUM_RUN(int64_t, u, AS_IS); break;
  case TP_U8: SUM_RUN(uint8_t, u, AS_IS); break;
  case TP_U16: SUM_RUN(uint16_t, u, AS_IS); break;
  case TP_U32: SUM_RUN(uint32_t, u, AS_IS); break;
  case TP_U64: SUM_RUN(uint64_t, u, AS_IS); break;
  default: break;
  }
}

static void store_result(TpDType t, char *p, double f, uint64_t u) {
  switch (t) {
  case TP_F32: {
    float v = (float)f;
    memcpy(p, &v, 4);
    break;
  }
  case TP_F64: memcpy(p, &f, 8); break;
  case TP_F16: {
    uint16_t v = tp_f32_to_f16((float)f);
    memcpy(p, &v, 2);
    break;
  }
  case TP_BF16: {
    uint16_t v = tp_f32_to_bf16((float)f);
    memcpy(p, &v, 2);
    break;
  }
  default: memcpy(p, &u, tp_dtype_size(t)); break; /* low bytes: little-endian */
  }
}

/* A set of dims (sizes and byte strides) of x, size-1 dims dropped and contiguous ones merged. */
typedef struct {
  int n;
  int64_t dims[TP_MAX_RANK], strides[TP_MAX_RANK];
} DimSet;

static void dimset_add(DimSet *s, int64_t dim, int64_t stride) {
  if (dim == 1) return;
  if (s->n > 0 && s->strides[s->n - 1] == stride * dim) {
    s->dims[s->n - 1] *= dim;
    s->strides[s->n - 1] = stride;
    return;
  }
  s->dims[s->n] = dim;
  s->strides[s->n++] = stride;
}

/* A float sum adds its elements (x's row-major order) in runs of REDUCE_RUN, each run in
 * double from 0, then the runs in double in order: a GPU sums a run per thread to the same
 * bits (runtime/cuda/reduce.cu). Integers wrap, so the runs change nothing for them. */
enum { REDUCE_RUN = 64 };

TpKernelStatus tp_reduce_sum(const TpTensor *x, const int64_t *axes, int naxes, bool mean, TpTensor *y) {
  TpDType t = x->dtype;
  if (y->dtype != t || t == TP_BOOL || tp_dtype_size(t) == 0) return TP_KERNEL_BAD_DTYPE;
  int64_t xs[TP_MAX_RANK];
  tp_contiguous_strides(x->rank, x->dims, tp_dtype_size(t), xs);
  DimSet kept = {0}, red = {0};
  int a = 0;
  for (int d = 0; d < x->rank; d++) {
    bool reduced = a < naxes && axes[a] == d;
    if (reduced) a++;
    dimset_add(reduced ? &red : &kept, x->dims[d], xs[d]);
  }
  if (a != naxes) return TP_KERNEL_BAD_SHAPE; /* axes not sorted or out of range */
  int64_t nout = tp_numel(kept.n, kept.dims), count = tp_numel(red.n, red.dims);
  if (nout != tp_tensor_numel(y)) return TP_KERNEL_BAD_SHAPE;
  if (red.n == 0) { /* nothing to add up: one element per output */
    red.n = 1;
    red.dims[0] = 1;
    red.strides[0] = 0;
  }
  bool is_float = tp_dtype_is_float(t), is_signed = t == TP_I8 || t == TP_I16 || t == TP_I32 || t == TP_I64;
  size_t es = tp_dtype_size(t);
  int last = red.n - 1;
#pragma omp parallel for schedule(static) if (tp_tensor_numel(x) > (1 << 15))
  for (int64_t j = 0; j < nout; j++) {
    int64_t base = 0, rem = j, idx[TP_MAX_RANK] = {0}, off = 0;
    for (int d = kept.n - 1; d >= 0; d--) {
      base += (rem % kept.dims[d]) * kept.strides[d];
      rem /= kept.dims[d];
    }
    const char *p = (const char *)x->data + base;
    double f = 0, run = 0;
    uint64_t u = 0;
    int64_t in_run = 0; /* elements in `run` */
    while (count > 0) { /* odometer over the reduced dims, innermost one as a line */
      for (int64_t done = 0, line = red.dims[last]; done < line;) {
        int64_t take = line - done < REDUCE_RUN - in_run ? line - done : REDUCE_RUN - in_run;
        sum_run(t, p + off + done * red.strides[last], take, red.strides[last], &run, &u);
        done += take, in_run += take;
        if (in_run == REDUCE_RUN) f += run, run = 0, in_run = 0;
      }
      int d = last - 1;
      for (; d >= 0; d--) {
        off += red.strides[d];
        if (++idx[d] < red.dims[d]) break;
        off -= idx[d] * red.strides[d];
        idx[d] = 0;
      }
      if (d < 0) break;
    }
    if (in_run) f += run;
    if (mean && is_float) f /= (double)count; /* NaN for an empty reduction, as numpy */
    else if (mean && count > 0) u = is_signed ? (uint64_t)((int64_t)u / count) : u / (uint64_t)count;
    store_result(t, (char *)y->data + (size_t)j * es, f, u);
  }
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cumsum(const TpTensor *x, int axis, bool exclusive, bool reverse, TpTensor *y) {
  TpDType t = x->dtype;
  if (y->dtype != t || t == TP_BOOL || tp_dtype_size(t) == 0) return TP_KERNEL_BAD_DTYPE;
  if (axis < 0 || axis >= x->rank || x->rank != y->rank ||
      memcmp(x->dims, y->dims, (size_t)x->rank * sizeof x->dims[0]) != 0)
    return TP_KERNEL_BAD_SHAPE;
  size_t es = tp_dtype_size(t);
  int64_t outer = tp_numel(axis, x->dims), n = x->dims[axis];
  int64_t inner = tp_numel(x->rank - axis - 1, x->dims + axis + 1), step = inner * (int64_t)es;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t first = ((o * n + (reverse ? n - 1 : 0)) * inner + i) * (int64_t)es;
      int64_t dir = reverse ? -step : step;
      double f = 0;
      uint64_t u = 0;
      for (int64_t j = 0; j < n; j++) {
        int64_t at = first + j * dir;
        if (!exclusive) sum_run(t, (const char *)x->data + at, 1, 0, &f, &u);
        store_result(t, (char *)y->data + at, f, u);
        if (exclusive) sum_run(t, (const char *)x->data + at, 1, 0, &f, &u);
      }
    }
  return TP_KERNEL_OK;
}

TpKernelStatus tp_topk(const TpTensor *x, int axis, TpTensor *y) {
  TpKernelStatus s = tp_topk_check(x, axis, y);
  if (s != TP_KERNEL_OK) return s;
  size_t es = tp_dtype_size(x->dtype);
  int64_t outer = tp_numel(axis, x->dims), n = x->dims[axis], k = y->dims[axis];
  int64_t inner = tp_numel(x->rank - axis - 1, x->dims + axis + 1);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++)
      tp_topk_line(x->dtype, (const char *)x->data + ((o * n) * inner + i) * (int64_t)es, n, inner * (int64_t)es, k,
                   (int64_t *)y->data + (o * k) * inner + i, inner);
  return TP_KERNEL_OK;
}
