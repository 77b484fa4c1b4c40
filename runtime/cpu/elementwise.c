#include "elementwise.h"

#include <string.h>
#include <tgmath.h> /* sqrt, exp, ... pick the float or double version from the argument */

#include "vecmath.h"

/* ---- strided iteration ---- */

void tp_contiguous_strides(int rank, const int64_t *dims, size_t elsize, int64_t *strides) {
  int64_t s = (int64_t)elsize;
  for (int d = rank - 1; d >= 0; d--) {
    strides[d] = s;
    s *= dims[d];
  }
}

bool tp_iter_broadcast(TpIter *it, int noperands, const TpTensor *const ops[]) {
  const TpTensor *out = ops[0];
  if (noperands > TP_ITER_MAX_OPERANDS) return false;
  it->rank = out->rank;
  it->noperands = noperands;
  memcpy(it->dims, out->dims, sizeof it->dims);
  tp_contiguous_strides(out->rank, out->dims, tp_dtype_size(out->dtype), it->strides[0]);
  for (int k = 1; k < noperands; k++) {
    const TpTensor *t = ops[k];
    int64_t s[TP_MAX_RANK];
    int lead = out->rank - t->rank;
    if (lead < 0) return false;
    tp_contiguous_strides(t->rank, t->dims, tp_dtype_size(t->dtype), s);
    for (int d = 0; d < out->rank; d++) {
      int64_t td = d < lead ? 1 : t->dims[d - lead];
      if (td == out->dims[d])
        it->strides[k][d] = d < lead ? 0 : s[d - lead];
      else if (td == 1)
        it->strides[k][d] = 0;
      else
        return false;
    }
  }
  return true;
}

void tp_iter_coalesce(TpIter *it) {
  int r = 0;
  for (int d = 0; d < it->rank; d++) {
    if (it->dims[d] == 1) continue;
    bool merge = r > 0;
    for (int k = 0; k < it->noperands && merge; k++)
      merge = it->strides[k][r - 1] == it->strides[k][d] * it->dims[d];
    if (merge) {
      it->dims[r - 1] *= it->dims[d];
      for (int k = 0; k < it->noperands; k++) it->strides[k][r - 1] = it->strides[k][d];
      continue;
    }
    it->dims[r] = it->dims[d];
    for (int k = 0; k < it->noperands; k++) it->strides[k][r] = it->strides[k][d];
    r++;
  }
  it->rank = r;
}

/* Runs over the flat index range [begin, end). Offsets are kept as integers so no pointer
 * ever points outside its tensor. */
static void iter_range(const TpIter *it, char *const base[], int64_t begin, int64_t end,
                       TpRunFn fn, const void *ctx) {
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

static bool same_dims(const TpTensor *a, const TpTensor *b) {
  return a->rank == b->rank && memcmp(a->dims, b->dims, (size_t)a->rank * sizeof a->dims[0]) == 0;
}

/* ---- scalar loads and stores of any dtype ---- */

typedef enum { CLASS_FLOAT, CLASS_SIGNED, CLASS_UNSIGNED, CLASS_BOOL, CLASS_NONE } DClass;

static DClass dclass(TpDType t) {
  switch (t) {
  case TP_F32: case TP_F64: case TP_F16: case TP_BF16: return CLASS_FLOAT;
  case TP_I8: case TP_I16: case TP_I32: case TP_I64: return CLASS_SIGNED;
  case TP_U8: case TP_U16: case TP_U32: case TP_U64: return CLASS_UNSIGNED;
  case TP_BOOL: return CLASS_BOOL;
  default: return CLASS_NONE;
  }
}

static double load_float(TpDType t, const char *p) {
  switch (t) {
  case TP_F32: { float v; memcpy(&v, p, 4); return v; }
  case TP_F64: { double v; memcpy(&v, p, 8); return v; }
  case TP_F16: { uint16_t v; memcpy(&v, p, 2); return tp_f16_to_f32(v); }
  case TP_BF16: { uint16_t v; memcpy(&v, p, 2); return tp_bf16_to_f32(v); }
  default: return 0;
  }
}

/* Integer or bool element as 64 bits, sign-extended for signed dtypes. */
static uint64_t load_bits(TpDType t, const char *p) {
  switch (t) {
  case TP_I8: { int8_t v; memcpy(&v, p, 1); return (uint64_t)(int64_t)v; }
  case TP_I16: { int16_t v; memcpy(&v, p, 2); return (uint64_t)(int64_t)v; }
  case TP_I32: { int32_t v; memcpy(&v, p, 4); return (uint64_t)(int64_t)v; }
  case TP_I64: { int64_t v; memcpy(&v, p, 8); return (uint64_t)v; }
  case TP_U8: case TP_BOOL: { uint8_t v; memcpy(&v, p, 1); return v; }
  case TP_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
  case TP_U32: { uint32_t v; memcpy(&v, p, 4); return v; }
  case TP_U64: { uint64_t v; memcpy(&v, p, 8); return v; }
  default: return 0;
  }
}

/* Any numeric element as a double (exact for all but 64-bit integers beyond 2^53). */
static double load_double(TpDType t, const char *p) {
  switch (dclass(t)) {
  case CLASS_FLOAT: return load_float(t, p);
  case CLASS_SIGNED: return (double)(int64_t)load_bits(t, p);
  default: return (double)load_bits(t, p);
  }
}

/* Low bytes of v (two's complement wraps); bool stores v != 0. */
static void store_bits(TpDType t, char *p, uint64_t v) {
  switch (tp_dtype_size(t)) {
  case 1: { uint8_t x = t == TP_BOOL ? v != 0 : (uint8_t)v; memcpy(p, &x, 1); break; }
  case 2: { uint16_t x = (uint16_t)v; memcpy(p, &x, 2); break; }
  case 4: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
  case 8: memcpy(p, &v, 8); break;
  }
}

/* v rounded to f32 with round-to-odd, so that a second rounding to f16/bf16 (11 and 8
 * bits, far below f32's 24) gives the correctly rounded result of v. */
static float round_to_odd_f32(double v) {
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if (isfinite(f) && (double)f != v && !(bits & 1)) f = nextafterf(f, v > f ? INFINITY : -INFINITY);
  return f;
}

static void store_float(TpDType t, char *p, double v) {
  switch (t) {
  case TP_F32: { float x = (float)v; memcpy(p, &x, 4); break; }
  case TP_F64: memcpy(p, &v, 8); break;
  case TP_F16: { uint16_t x = tp_f32_to_f16(round_to_odd_f32(v)); memcpy(p, &x, 2); break; }
  case TP_BF16: { uint16_t x = tp_f32_to_bf16(round_to_odd_f32(v)); memcpy(p, &x, 2); break; }
  default: break;
  }
}

/* Float to integer dtype t: truncation toward zero; NaN gives 0, out-of-range saturates. */
static uint64_t float_to_bits(TpDType t, double v) {
  if (isnan(v)) return 0;
  int bits = (int)tp_dtype_size(t) * 8;
  if (dclass(t) == CLASS_SIGNED) {
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

/* One formula per op, instantiated for float and double (tgmath picks the functions). */
#define UNARY_LOOP(T, op, n, y, x)                                                  \
  do {                                                                              \
    const T one = 1, half = 0.5;                                                    \
    switch (op) {                                                                   \
    case TP_UNARY_SQRT: PLAIN_FOR(n) y[i] = sqrt(x[i]); break;                      \
    case TP_UNARY_NEG: SIMD_FOR(n) y[i] = -x[i]; break;                             \
    case TP_UNARY_RECIPROCAL: SIMD_FOR(n) y[i] = one / x[i]; break;                 \
    case TP_UNARY_EXP: PLAIN_FOR(n) y[i] = exp(x[i]); break;                        \
    case TP_UNARY_LOG: PLAIN_FOR(n) y[i] = log(x[i]); break;                        \
    case TP_UNARY_ERF: PLAIN_FOR(n) y[i] = erf(x[i]); break;                        \
    case TP_UNARY_TANH: PLAIN_FOR(n) y[i] = tanh(x[i]); break;                      \
    case TP_UNARY_SIN: PLAIN_FOR(n) y[i] = sin(x[i]); break;                        \
    case TP_UNARY_COS: PLAIN_FOR(n) y[i] = cos(x[i]); break;                        \
    case TP_UNARY_RELU: SIMD_FOR(n) y[i] = x[i] < 0 ? 0 : x[i]; break; /* keeps NaN */ \
    case TP_UNARY_SIGMOID: /* exp of a non-positive argument only: no overflow */   \
      PLAIN_FOR(n) {                                                                \
        T e = exp(-fabs(x[i]));                                                     \
        y[i] = x[i] >= 0 ? one / (one + e) : e / (one + e);                         \
      }                                                                             \
      break;                                                                        \
    case TP_UNARY_GELU:                                                             \
      PLAIN_FOR(n) y[i] = half * x[i] * (one + erf(x[i] * (T)M_SQRT1_2));           \
      break;                                                                        \
    case TP_UNARY_GELU_TANH: {                                                      \
      const T c = (T)0.7978845608028654, k = (T)0.044715; /* sqrt(2/pi) */          \
      PLAIN_FOR(n) y[i] = half * x[i] * (one + tanh(c * (x[i] + k * x[i] * x[i] * x[i]))); \
      break;                                                                        \
    }                                                                               \
    case TP_UNARY_NOT: break;                                                       \
    }                                                                               \
  } while (0)

/* f32 Gelu on vecmath.h's exp and erfc (libm's erff and tanhf do not vectorise), in forms
 * without cancellation for negative x: x Phi(x) = x erfc(-x / sqrt 2) / 2 and
 * x (1 + tanh u) / 2 = x / (1 + e^-2u). */
TP_VECTOR_CLONES static void gelu_f32(bool tanh_approx, int64_t n, float *y, const float *x) {
  if (tanh_approx) {
    const float c = 0.7978845608028654f, k = 0.044715f; /* sqrt(2/pi) */
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
      float u = c * (x[i] + k * x[i] * x[i] * x[i]);
      y[i] = x[i] / (1.0f + tp_vexpf(-2.0f * u));
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * tp_verfcf(x[i] * -(float)M_SQRT1_2);
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
    else UNARY_LOOP(float, c->op, n, y, x);
  } else if (t == TP_F64) {
    double *y = (double *)p[0];
    const double *x = (const double *)p[1];
    UNARY_LOOP(double, c->op, n, y, x);
  } else if (t == TP_F16 || t == TP_BF16) {
    double buf[BLOCK];
    for (int64_t b = 0; b < n; b += BLOCK) {
      int64_t m = n - b < BLOCK ? n - b : BLOCK;
      for (int64_t i = 0; i < m; i++) buf[i] = load_float(t, p[1] + (b + i) * es);
      UNARY_LOOP(double, c->op, m, buf, buf);
      for (int64_t i = 0; i < m; i++) store_float(t, p[0] + (b + i) * es, buf[i]);
    }
  } else if (t == TP_BOOL) { /* Not */
    for (int64_t i = 0; i < n; i++) p[0][i] = !p[1][i];
  } else { /* signed integers: Neg, Relu */
    for (int64_t i = 0; i < n; i++) {
      uint64_t v = load_bits(t, p[1] + i * es);
      if (c->op == TP_UNARY_NEG) v = 0 - v;
      else if ((int64_t)v < 0) v = 0;
      store_bits(t, p[0] + i * es, v);
    }
  }
}

TpKernelStatus tp_unary(TpUnaryOp op, const TpTensor *x, TpTensor *y) {
  DClass cl = dclass(x->dtype);
  bool ok = op == TP_UNARY_NOT ? cl == CLASS_BOOL
            : op == TP_UNARY_NEG || op == TP_UNARY_RELU ? cl == CLASS_FLOAT || cl == CLASS_SIGNED
                                                          : cl == CLASS_FLOAT;
  if (!ok || y->dtype != x->dtype) return TP_KERNEL_BAD_DTYPE;
  if (!same_dims(x, y)) return TP_KERNEL_BAD_SHAPE;
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
#define FLOAT_BINARY_RUN(T, EXPR, FOR)                                    \
  do {                                                                    \
    if (sa && sb)                                                         \
      FOR(n) { T a = A[i], b = B[i]; y[i] = (EXPR); }                     \
    else if (sa)                                                          \
      FOR(n) { T a = A[i], b = B[0]; y[i] = (EXPR); }                     \
    else if (sb)                                                          \
      FOR(n) { T a = A[0], b = B[i]; y[i] = (EXPR); }                     \
    else                                                                  \
      FOR(n) { T a = A[0], b = B[0]; y[i] = (EXPR); }                     \
  } while (0)

#define FLOAT_BINARY(T, op)                                                  \
  do {                                                                       \
    switch (op) {                                                            \
    case TP_BINARY_ADD: FLOAT_BINARY_RUN(T, a + b, SIMD_FOR); break;         \
    case TP_BINARY_SUB: FLOAT_BINARY_RUN(T, a - b, SIMD_FOR); break;         \
    case TP_BINARY_MUL: FLOAT_BINARY_RUN(T, a * b, SIMD_FOR); break;         \
    case TP_BINARY_DIV: FLOAT_BINARY_RUN(T, a / b, SIMD_FOR); break;         \
    case TP_BINARY_POW: FLOAT_BINARY_RUN(T, pow(a, b), PLAIN_FOR); break;    \
    case TP_BINARY_MAX: FLOAT_BINARY_RUN(T, a > b || a != a ? a : b, SIMD_FOR); break; \
    case TP_BINARY_MIN: FLOAT_BINARY_RUN(T, a < b || a != a ? a : b, SIMD_FOR); break; \
    default: break;                                                          \
    }                                                                        \
  } while (0)

static void float_binary_f32(TpBinaryOp op, int64_t n, float *y, const float *A, bool sa,
                             const float *B, bool sb) {
  FLOAT_BINARY(float, op);
}

static void float_binary_f64(TpBinaryOp op, int64_t n, double *y, const double *A, bool sa,
                             const double *B, bool sb) {
  FLOAT_BINARY(double, op);
}

/* Integer arithmetic wraps; division truncates and x/0 gives 0. Pow: integer exponents by
 * squaring, float exponents through double. */
static uint64_t int_arith(TpBinaryOp op, bool sgn, uint64_t a, TpDType tb, const char *pb,
                          TpDType ty) {
  uint64_t b = dclass(tb) == CLASS_FLOAT ? 0 : load_bits(tb, pb);
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
    if (dclass(tb) == CLASS_FLOAT) {
      double base = sgn ? (double)(int64_t)a : (double)a;
      return float_to_bits(ty, pow(base, load_float(tb, pb)));
    }
    if (dclass(tb) == CLASS_SIGNED && (int64_t)b < 0) /* 1/a^|b| truncated */
      return a == 1 ? 1 : sgn && (int64_t)a == -1 ? ((b & 1) ? a : 1) : 0;
    uint64_t r = 1;
    for (; b; b >>= 1, a *= a)
      if (b & 1) r *= a;
    return r;
  }
  default: return 0;
  }
}

static bool compare(TpBinaryOp op, int c) { /* c: sign of a - b; 2 when unordered (NaN) */
  switch (op) {
  case TP_BINARY_EQUAL: return c == 0;
  case TP_BINARY_LESS: return c == -1;
  case TP_BINARY_LESS_EQUAL: return c == -1 || c == 0;
  case TP_BINARY_GREATER: return c == 1;
  case TP_BINARY_GREATER_EQUAL: return c == 1 || c == 0;
  default: return false;
  }
}

static int compare3(TpDType t, const char *pa, const char *pb) {
  switch (dclass(t)) {
  case CLASS_FLOAT: {
    double a = load_float(t, pa), b = load_float(t, pb);
    return a < b ? -1 : a > b ? 1 : a == b ? 0 : 2;
  }
  case CLASS_SIGNED: {
    int64_t a = (int64_t)load_bits(t, pa), b = (int64_t)load_bits(t, pb);
    return (a > b) - (a < b);
  }
  default: {
    uint64_t a = load_bits(t, pa), b = load_bits(t, pb);
    return (a > b) - (a < b);
  }
  }
}

static void binary_run(const void *ctx, int64_t n, char *const p[], const int64_t step[]) {
  const BinaryCtx *c = ctx;
  size_t ey = tp_dtype_size(c->y);
  bool sa = step[1] != 0, sb = step[2] != 0;
  if (!is_arith(c->op)) {
    for (int64_t i = 0; i < n; i++) {
      const char *pa = p[1] + i * step[1], *pb = p[2] + i * step[2];
      p[0][i] = c->op == TP_BINARY_AND ? (*pa && *pb) : compare(c->op, compare3(c->a, pa, pb));
    }
  } else if (c->y == TP_F32 && c->b == TP_F32) {
    float_binary_f32(c->op, n, (float *)p[0], (const float *)p[1], sa, (const float *)p[2], sb);
  } else if (c->y == TP_F64 && c->b == TP_F64) {
    float_binary_f64(c->op, n, (double *)p[0], (const double *)p[1], sa, (const double *)p[2], sb);
  } else if (dclass(c->y) == CLASS_FLOAT) { /* f16, bf16, Pow with another exponent dtype */
    double a[BLOCK], b[BLOCK];
    for (int64_t k = 0; k < n; k += BLOCK) {
      int64_t m = n - k < BLOCK ? n - k : BLOCK;
      for (int64_t i = 0; i < m; i++) {
        a[i] = load_double(c->a, p[1] + (k + i) * step[1]);
        b[i] = load_double(c->b, p[2] + (k + i) * step[2]);
      }
      float_binary_f64(c->op, m, a, a, true, b, true);
      for (int64_t i = 0; i < m; i++) store_float(c->y, p[0] + (k + i) * ey, a[i]);
    }
  } else {
    bool sgn = dclass(c->y) == CLASS_SIGNED;
    for (int64_t i = 0; i < n; i++) {
      uint64_t a = load_bits(c->a, p[1] + i * step[1]);
      store_bits(c->y, p[0] + i * ey, int_arith(c->op, sgn, a, c->b, p[2] + i * step[2], c->y));
    }
  }
}

static TpKernelStatus binary_dtypes_ok(TpBinaryOp op, TpDType a, TpDType b, TpDType y) {
  DClass ca = dclass(a), cb = dclass(b);
  switch (op) {
  case TP_BINARY_AND:
    return a == TP_BOOL && b == TP_BOOL && y == TP_BOOL;
  case TP_BINARY_EQUAL: case TP_BINARY_LESS: case TP_BINARY_LESS_EQUAL: case TP_BINARY_GREATER:
  case TP_BINARY_GREATER_EQUAL:
    return a == b && y == TP_BOOL && ca != CLASS_NONE && (ca != CLASS_BOOL || op == TP_BINARY_EQUAL);
  case TP_BINARY_POW:
    return a == y && ca != CLASS_NONE && ca != CLASS_BOOL && cb != CLASS_NONE && cb != CLASS_BOOL;
  default:
    return a == b && a == y && ca != CLASS_NONE && ca != CLASS_BOOL;
  }
}

TpKernelStatus tp_binary(TpBinaryOp op, const TpTensor *a, const TpTensor *b, TpTensor *y) {
  if (!binary_dtypes_ok(op, a->dtype, b->dtype, y->dtype)) return TP_KERNEL_BAD_DTYPE;
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
  DClass cx = dclass(c->x), cy = dclass(c->y);
  for (int64_t i = 0; i < n; i++) {
    const char *src = p[1] + i * ex;
    char *dst = p[0] + i * ey;
    if (cx == CLASS_FLOAT) {
      double v = load_float(c->x, src);
      if (cy == CLASS_FLOAT) store_float(c->y, dst, v);
      else if (cy == CLASS_BOOL) store_bits(c->y, dst, v != 0);
      else store_bits(c->y, dst, float_to_bits(c->y, v));
    } else {
      uint64_t v = load_bits(c->x, src);
      if (cy != CLASS_FLOAT) store_bits(c->y, dst, v);
      else if (c->y == TP_F32) /* directly, not through double: one rounding */
        store_float(c->y, dst, cx == CLASS_SIGNED ? (float)(int64_t)v : (float)v);
      else store_float(c->y, dst, cx == CLASS_SIGNED ? (double)(int64_t)v : (double)v);
    }
  }
}

TpKernelStatus tp_cast(const TpTensor *x, TpTensor *y) {
  if (dclass(x->dtype) == CLASS_NONE || dclass(y->dtype) == CLASS_NONE) return TP_KERNEL_BAD_DTYPE;
  if (!same_dims(x, y)) return TP_KERNEL_BAD_SHAPE;
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
