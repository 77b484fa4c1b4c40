#include "elementwise.h"

#include <string.h>
#include <tgmath.h> /* sqrt, exp, ... pick the float or double version from the argument */

#include "../kernels/check.h"
#include "../kernels/element.h"
#include "../kernels/scalar.h"
#include "vecmath.h"

/* ---- strided iteration ---- */

static void iter_range(const TpIter *it, char *const base[], int64_t begin, int64_t end, TpRunFn fn,
                       const void *ctx) {
  int rank = it->rank, np = it->noperands;
  char *ptr[TP_ITER_MAX_OPERANDS];
  int64_t step[TP_ITER_MAX_OPERANDS] = {0}, off[TP_ITER_MAX_OPERANDS] = {0}, idx[TP_MAX_RANK];
  if (rank == 0) {
    fn(ctx, 1, base, step);
    return;
  }
  int64_t rem = begin;
  for (int d = rank - 1; d >= 0; d--) {
    idx[d] = rem % it->dims[d];
    rem /= it->dims[d];
    for (int k = 0; k < np; k++) off[k] += idx[d] * it->strides[k][d];
  }
  for (int k = 0; k < np; k++) step[k] = it->strides[k][rank - 1];
  int64_t inner = it->dims[rank - 1];
  for (int64_t pos = begin; pos < end;) {
    int64_t n = inner - idx[rank - 1];
    if (n > end - pos) n = end - pos;
    for (int k = 0; k < np; k++) ptr[k] = base[k] + off[k];
    fn(ctx, n, ptr, step);
    pos += n;
    idx[rank - 1] += n;
    for (int k = 0; k < np; k++) off[k] += n * step[k];
    for (int d = rank - 1; d > 0 && idx[d] == it->dims[d]; d--) {
      idx[d] = 0;
      idx[d - 1]++;
      for (int k = 0; k < np; k++) off[k] += it->strides[k][d - 1] - it->dims[d] * it->strides[k][d];
    }
  }
}

#define ITER_CHUNK ((int64_t)1 << 15) /* elements per OpenMP work item */

void tp_iter_run(const TpIter *it, char *const base[], TpRunFn fn, const void *ctx) {
  int64_t total = tp_numel(it->rank, it->dims);
  int64_t nchunks = (total + ITER_CHUNK - 1) / ITER_CHUNK;
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t c = 0; c < nchunks; c++) {
    int64_t end = (c + 1) * ITER_CHUNK;
    iter_range(it, base, c * ITER_CHUNK, end < total ? end : total, fn, ctx);
  }
}

/* Same-shape operands: one flat dim. */
static void iter_flat(TpIter *it, int noperands, const TpTensor *const ops[]) {
  it->rank = 1;
  it->noperands = noperands;
  it->dims[0] = tp_tensor_numel(ops[0]);
  for (int k = 0; k < noperands; k++) it->strides[k][0] = (int64_t)tp_dtype_size(ops[k]->dtype);
}

/* ---- unary ---- */

typedef struct {
  TpUnaryOp op;
  TpDType dtype;
} UnaryCtx;

/* Loops over a run of n elements. SIMD_FOR vectorizes at -O2 too (outputs may alias inputs
 * at the same index only); library calls without vector versions use PLAIN_FOR (clang
 * warns when a simd loop cannot be vectorized). */
#define SIMD_FOR(n) _Pragma("omp simd") for (int64_t i = 0; i < (n); i++)
#define PLAIN_FOR(n) for (int64_t i = 0; i < (n); i++)

/* One loop per op, over runtime/kernels/element.h's formula for T (suffix f32 or f64) with
 * the op a constant, so the element function's switch folds away and each loop is the op's
 * own (vectorised where SIMD_FOR). */
#define UNARY_CASE(FOR, suffix, OP, n, y, x)                                                                        \
  case OP:                                                                                                          \
    FOR(n) y[i] = tp_unary_##suffix(OP, x[i]);                                                                      \
    break
#define UNARY_LOOP(suffix, op, n, y, x)                                                                             \
  do {                                                                                                              \
    switch (op) {                                                                                                   \
      UNARY_CASE(PLAIN_FOR, suffix, TP_UNARY_SQRT, n, y, x);                                                        \
      UNARY_CASE(SIMD_FOR, suffix, TP_UNARY_NEG, n, y, x);                                                          \
      UNARY_CASE(SIMD_FOR, suffix, TP_UNARY_RECIPROCAL, n, y, x);                                                   \
      UNARY_CASE(PLAIN_FOR, suffix, TP_UNARY_EXP, n, y, x);                                                         \
      UNARY_CASE(PLAIN_FOR, suffix, TP_UNARY_LOG, n, y, x);                                                         \
      UNARY_CASE(PLAIN_FOR, suffix, TP_UNARY_ERF, n, y, x);                                                         \
      UNARY_CASE(PLAIN_FOR, suffix, TP_UNARY_TANH, n, y, x);                                                        \
      UNARY_CASE(PLAIN_FOR, suffix, TP_UNARY_SIN, n, y, x);                                                         \
      UNARY_CASE(PLAIN_FOR, suffix, TP_UNARY_COS, n, y, x);                                                         \
      UNARY_CASE(SIMD_FOR, suffix, TP_UNARY_RELU, n, y, x);                                                         \
      UNARY_CASE(PLAIN_FOR, suffix, TP_UNARY_SIGMOID, n, y, x);                                                     \
      UNARY_CASE(PLAIN_FOR, suffix, TP_UNARY_GELU, n, y, x);                                                        \
      UNARY_CASE(PLAIN_FOR, suffix, TP_UNARY_GELU_TANH, n, y, x);                                                   \
    case TP_UNARY_NOT: break;                                                                                       \
    }                                                                                                               \
  } while (0)

/* f32 Gelu's loops on vecmath.h's exp and erfc (libm's erff and tanhf do not vectorise),
 * the float forms of element.h. */
TP_VECTOR_CLONES static void gelu_f32(bool tanh_approx, int64_t n, float *y, const float *x) {
  if (tanh_approx) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = tp_gelu_tanh_f32(x[i]);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = tp_gelu_f32(x[i]);
  }
}

#define BLOCK 256 /* elements converted at a time on the slow paths */

static void unary_run(const void *ctx, int64_t n, char *const p[], const int64_t step[]) {
  (void)step; /* same-shape operands: contiguous runs */
  const UnaryCtx *c = ctx;
  TpDType t = c->dtype;
  size_t es = tp_dtype_size(t);
  if (t == TP_F32) {
    float *y = (float *)p[0];
    const float *x = (const float *)p[1];
    if (c->op == TP_UNARY_GELU || c->op == TP_UNARY_GELU_TANH) gelu_f32(c->op == TP_UNARY_GELU_TANH, n, y, x);
    else UNARY_LOOP(f32, c->op, n, y, x);
  } else if (t == TP_F64) {
    double *y = (double *)p[0];
    const double *x = (const double *)p[1];
    UNARY_LOOP(f64, c->op, n, y, x);
  } else if (t == TP_F16 || t == TP_BF16) {
    double buf[BLOCK];
    for (int64_t b = 0; b < n; b += BLOCK) {
      int64_t m = n - b < BLOCK ? n - b : BLOCK;
      for (int64_t i = 0; i < m; i++) buf[i] = tp_load_float(t, p[1] + (b + i) * es);
      UNARY_LOOP(f64, c->op, m, buf, buf);
      for (int64_t i = 0; i < m; i++) tp_store_float(t, p[0] + (b + i) * es, buf[i]);
    }
  } else if (t == TP_BOOL) { /* Not */
    for (int64_t i = 0; i < n; i++) p[0][i] = !p[1][i];
  } else { /* signed integers: Neg, Relu */
    for (int64_t i = 0; i < n; i++) {
      uint64_t v = tp_load_bits(t, p[1] + i * es);
      if (c->op == TP_UNARY_NEG) v = 0 - v;
      else if ((int64_t)v < 0) v = 0;
      tp_store_bits(t, es, p[0] + i * es, v);
    }
  }
}

TpKernelStatus tp_unary(TpUnaryOp op, const TpTensor *x, TpTensor *y) {
  TpKernelStatus s = tp_check_unary(op, x, y);
  if (s != TP_KERNEL_OK) return s;
  TpIter it;
  iter_flat(&it, 2, (const TpTensor *const[]){y, x});
  UnaryCtx c = {op, x->dtype};
  tp_iter_run(&it, (char *const[]){y->data, x->data}, unary_run, &c);
  return TP_KERNEL_OK;
}

/* ---- binary ---- */

typedef struct {
  TpBinaryOp op;
  TpDType a, b, y;
} BinaryCtx;

static bool is_arith(TpBinaryOp op) { return op <= TP_BINARY_MIN; }

/* A run of a float op: a and b step by one element or by 0 (broadcast in the run). */
#define FLOAT_BINARY_RUN(T, EXPR, FOR)                                                                              \
  do {                                                                                                              \
    if (sa && sb) FOR(n) {                                                                                          \
        T a = A[i], b = B[i];                                                                                       \
        y[i] = (EXPR);                                                                                              \
      }                                                                                                             \
    else if (sa) FOR(n) {                                                                                           \
        T a = A[i], b = B[0];                                                                                       \
        y[i] = (EXPR);                                                                                              \
      }                                                                                                             \
    else if (sb) FOR(n) {                                                                                           \
        T a = A[0], b = B[i];                                                                                       \
        y[i] = (EXPR);                                                                                              \
      }                                                                                                             \
    else FOR(n) {                                                                                                   \
        T a = A[0], b = B[0];                                                                                       \
        y[i] = (EXPR);                                                                                              \
      }                                                                                                             \
  } while (0)

#define FLOAT_BINARY(T, op)                                                                                         \
  do {                                                                                                              \
    switch (op) {                                                                                                   \
    case TP_BINARY_ADD: FLOAT_BINARY_RUN(T, a + b, SIMD_FOR); break;                                                \
    case TP_BINARY_SUB: FLOAT_BINARY_RUN(T, a - b, SIMD_FOR); break;                                                \
    case TP_BINARY_MUL: FLOAT_BINARY_RUN(T, a *b, SIMD_FOR); break;                                                 \
    case TP_BINARY_DIV: FLOAT_BINARY_RUN(T, a / b, SIMD_FOR); break;                                                \
    case TP_BINARY_POW: FLOAT_BINARY_RUN(T, pow(a, b), PLAIN_FOR); break;                                           \
    case TP_BINARY_MAX: FLOAT_BINARY_RUN(T, a > b || a != a ? a : b, SIMD_FOR); break;                              \
    case TP_BINARY_MIN: FLOAT_BINARY_RUN(T, a < b || a != a ? a : b, SIMD_FOR); break;                              \
    default: break;                                                                                                 \
    }                                                                                                               \
  } while (0)

static void float_binary_f32(TpBinaryOp op, int64_t n, float *y, const float *A, bool sa, const float *B, bool sb) {
  FLOAT_BINARY(float, op);
}

static void float_binary_f64(TpBinaryOp op, int64_t n, double *y, const double *A, bool sa, const double *B,
                             bool sb) {
  FLOAT_BINARY(double, op);
}

static void binary_run(const void *ctx, int64_t n, char *const p[], const int64_t step[]) {
  const BinaryCtx *c = ctx;
  size_t ey = tp_dtype_size(c->y);
  bool sa = step[1] != 0, sb = step[2] != 0;
  if (!is_arith(c->op)) {
    for (int64_t i = 0; i < n; i++) {
      const char *pa = p[1] + i * step[1], *pb = p[2] + i * step[2];
      p[0][i] = c->op == TP_BINARY_AND ? (*pa && *pb) : tp_compare(c->op, tp_compare3(c->a, pa, pb));
    }
  } else if (c->y == TP_F32 && c->b == TP_F32) {
    float_binary_f32(c->op, n, (float *)p[0], (const float *)p[1], sa, (const float *)p[2], sb);
  } else if (c->y == TP_F64 && c->b == TP_F64) {
    float_binary_f64(c->op, n, (double *)p[0], (const double *)p[1], sa, (const double *)p[2], sb);
  } else if (tp_dclass(c->y) == TP_CLASS_FLOAT) { /* f16, bf16, Pow with another exponent dtype */
    double a[BLOCK], b[BLOCK];
    for (int64_t k = 0; k < n; k += BLOCK) {
      int64_t m = n - k < BLOCK ? n - k : BLOCK;
      for (int64_t i = 0; i < m; i++) {
        a[i] = tp_load_double(c->a, p[1] + (k + i) * step[1]);
        b[i] = tp_load_double(c->b, p[2] + (k + i) * step[2]);
      }
      float_binary_f64(c->op, m, a, a, true, b, true);
      for (int64_t i = 0; i < m; i++) tp_store_float(c->y, p[0] + (k + i) * ey, a[i]);
    }
  } else {
    bool sgn = tp_dclass(c->y) == TP_CLASS_SIGNED;
    for (int64_t i = 0; i < n; i++) {
      uint64_t a = tp_load_bits(c->a, p[1] + i * step[1]);
      tp_store_bits(c->y, ey, p[0] + i * ey, tp_int_binary(c->op, sgn, a, c->b, p[2] + i * step[2], c->y, ey));
    }
  }
}

TpKernelStatus tp_binary(TpBinaryOp op, const TpTensor *a, const TpTensor *b, TpTensor *y) {
  if (!tp_binary_dtypes_ok(op, a->dtype, b->dtype, y->dtype)) return TP_KERNEL_BAD_DTYPE;
  TpIter it;
  if (!tp_iter_broadcast(&it, 3, (const TpTensor *const[]){y, a, b})) return TP_KERNEL_BAD_SHAPE;
  tp_iter_coalesce(&it);
  BinaryCtx c = {op, a->dtype, b->dtype, y->dtype};
  tp_iter_run(&it, (char *const[]){y->data, a->data, b->data}, binary_run, &c);
  return TP_KERNEL_OK;
}

/* ---- Where ---- */

static void where_run(const void *ctx, int64_t n, char *const p[], const int64_t step[]) {
  size_t es = *(const size_t *)ctx;
  for (int64_t i = 0; i < n; i++) {
    const char *src = p[1][i * step[1]] ? p[2] + i * step[2] : p[3] + i * step[3];
    memcpy(p[0] + (size_t)i * es, src, es);
  }
}

TpKernelStatus tp_where(const TpTensor *cond, const TpTensor *a, const TpTensor *b, TpTensor *y) {
  if (cond->dtype != TP_BOOL || a->dtype != y->dtype || b->dtype != y->dtype) return TP_KERNEL_BAD_DTYPE;
  TpIter it;
  if (!tp_iter_broadcast(&it, 4, (const TpTensor *const[]){y, cond, a, b})) return TP_KERNEL_BAD_SHAPE;
  tp_iter_coalesce(&it);
  size_t es = tp_dtype_size(y->dtype);
  tp_iter_run(&it, (char *const[]){y->data, cond->data, a->data, b->data}, where_run, &es);
  return TP_KERNEL_OK;
}

/* ---- Cast ---- */

typedef struct {
  TpDType x, y;
} CastCtx;

static void cast_run(const void *ctx, int64_t n, char *const p[], const int64_t step[]) {
  (void)step;
  const CastCtx *c = ctx;
  size_t ex = tp_dtype_size(c->x), ey = tp_dtype_size(c->y);
  TpDClass cx = tp_dclass(c->x), cy = tp_dclass(c->y);
  for (int64_t i = 0; i < n; i++) {
    const char *src = p[1] + i * ex;
    char *dst = p[0] + i * ey;
    if (cx == TP_CLASS_FLOAT) {
      double v = tp_load_float(c->x, src);
      if (cy == TP_CLASS_FLOAT) tp_store_float(c->y, dst, v);
      else if (cy == TP_CLASS_BOOL) tp_store_bits(c->y, ey, dst, v != 0);
      else tp_store_bits(c->y, ey, dst, tp_float_to_bits(c->y, ey, v));
    } else {
      uint64_t v = tp_load_bits(c->x, src);
      if (cy != TP_CLASS_FLOAT) tp_store_bits(c->y, ey, dst, v);
      else if (c->y == TP_F32) /* directly, not through double: one rounding */
        tp_store_float(c->y, dst, cx == TP_CLASS_SIGNED ? (float)(int64_t)v : (float)v);
      else tp_store_float(c->y, dst, cx == TP_CLASS_SIGNED ? (double)(int64_t)v : (double)v);
    }
  }
}

TpKernelStatus tp_cast(const TpTensor *x, TpTensor *y) {
  TpKernelStatus s = tp_check_cast(x, y);
  if (s != TP_KERNEL_OK) return s;
  if (x->dtype == y->dtype) {
    if (tp_tensor_bytes(x)) memcpy(y->data, x->data, tp_tensor_bytes(x));
    return TP_KERNEL_OK;
  }
  TpIter it;
  iter_flat(&it, 2, (const TpTensor *const[]){y, x});
  CastCtx c = {x->dtype, y->dtype};
  tp_iter_run(&it, (char *const[]){y->data, x->data}, cast_run, &c);
  return TP_KERNEL_OK;
}
