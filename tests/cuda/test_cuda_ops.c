/* The kernel calls of CUDA plans (runtime/cuda/ops.h) on the CPU through
 * the emulation of the CUDA execution model, each tp_cuda_X against the CPU kernel tp_X on
 * the same inputs: every dtype the call takes, awkward shapes (odd lengths, broadcasting,
 * negative steps, empty tensors, axes other than the last), the same statuses for what the
 * host checks, and indices out of range reported through tp_cuda_stream_sync. One ctest per
 * entry and direction: `test_cuda_ops NAME`.
 *
 * Tolerances, |gpu - cpu| <= atol + rtol * |cpu| per element:
 *   exact: copies, integer arithmetic, comparisons, casts, IEEE operations (f64, f16 and
 *     bf16 ops are computed in double and rounded once, as on the CPU), sums in double in
 *     the CPU's order, the scatter-adds (the CPU's order).
 *   libm_tolerance: Exp, Log, Pow... on f64, f16, bf16 (the device's libm).
 *   F32 (1e-5, 1e-5): float sums in another order (softmax, norms, losses, products).
 *   BF16 (1e-4, 1e-4): the bf16 products against the CPU's on bf16-rounded operands (the
 *     same exact products, summed in fp32 in another order). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "cpu/elementwise.h"
#include "cpu/layout.h"
#include "cpu/layout_backward.h"
#include "cpu/loss.h"
#include "cpu/matmul.h"
#include "cpu/nn.h"
#include "cpu/nn_backward.h"
#include "cpu/reduce.h"
#include "cpu/transformer.h"
#include "cuda/ops.h"
#include "cuda/stats.h"
#include "compare.h" /* after cuda/ops.h: stream() */

static const Tolerance EXACT = {0, 0}, F32 = {1e-5, 1e-5}, BF16 = {1e-4, 1e-4};

/* Every buffer of the test (test_alloc'd), freed with the stream when it ends. */
static void **buffers;
static size_t nbuffers, buffer_slots;

static void *buffer(size_t bytes) {
  if (nbuffers == buffer_slots) {
    buffer_slots = buffer_slots ? 2 * buffer_slots : 256;
    buffers = realloc(buffers, buffer_slots * sizeof *buffers);
    if (!buffers) {
      fprintf(stderr, "out of memory\n");
      exit(1);
    }
  }
  return buffers[nbuffers++] = test_alloc(bytes);
}

static void free_buffers(void) {
  for (size_t i = 0; i < nbuffers; i++) free(buffers[i]);
  free(buffers);
  tp_cuda_stream_free(the_stream);
}

/* Waits for the queued work; a bad index reported when none was expected fails. */
static void sync_expect(const char *what, int64_t want_bad) {
  test_sync();
  int64_t bad = tp_cuda_stream_sync(stream());
  if (bad != want_bad) fail("%s: bad index %lld reported, %lld expected", what, (long long)bad, (long long)want_bad);
}

static void set_f64(TpTensor *t, int64_t i, double v) {
  char *p = (char *)t->data + (size_t)i * tp_dtype_size(t->dtype);
  switch (t->dtype) {
  case TP_F32: {
    float f = (float)v;
    memcpy(p, &f, 4);
    break;
  }
  case TP_F64: memcpy(p, &v, 8); break;
  case TP_F16: {
    uint16_t h = tp_f32_to_f16((float)v);
    memcpy(p, &h, 2);
    break;
  }
  case TP_BF16: {
    uint16_t h = tp_f32_to_bf16((float)v);
    memcpy(p, &h, 2);
    break;
  }
  case TP_BOOL: *p = v != 0; break;
  default: {
    int64_t x = (int64_t)v;
    memcpy(p, &x, tp_dtype_size(t->dtype));
    break;
  } /* low bytes */
  }
}

/* A tensor of test_alloc'd memory: its elements random in [lo, hi] (integers rounded, bool
 * 0 or 1), or every byte 0x5a (`lo > hi`: results, so that an element left unwritten differs). */
static TpTensor tensor(TpDType t, int rank, const int64_t *dims, double lo, double hi) {
  TpTensor v = {.dtype = t, .rank = rank};
  memcpy(v.dims, dims, (size_t)rank * sizeof *dims);
  v.data = buffer(tp_tensor_bytes(&v));
  int64_t n = tp_tensor_numel(&v);
  if (lo > hi) memset(v.data, 0x5a, tp_tensor_bytes(&v));
  else
    for (int64_t i = 0; i < n; i++) {
      double x = lo + (frand() + 1) / 2 * (hi - lo);
      set_f64(&v, i, tp_dtype_is_float(t) ? x : t == TP_BOOL ? x > (lo + hi) / 2 : round(x));
    }
  return v;
}
static TpTensor result(TpDType t, int rank, const int64_t *dims) { return tensor(t, rank, dims, 1, 0); }
static TpTensor result_like(const TpTensor *x) { return result(x->dtype, x->rank, x->dims); }

/* got against want element by element (as doubles; NaN equals NaN), integers exactly. */
static void check_tensor(const char *what, const TpTensor *got, const TpTensor *want, Tolerance tol) {
  int64_t n = tp_tensor_numel(want);
  if (!tp_dtype_is_float(want->dtype)) {
    size_t bytes = tp_tensor_bytes(want);
    if (bytes && memcmp(got->data, want->data, bytes)) {
      for (int64_t i = 0; i < n; i++)
        if (tp_tensor_get_f64(got, i) != tp_tensor_get_f64(want, i)) {
          fail("%s: [%lld] gpu %.17g, cpu %.17g", what, (long long)i, tp_tensor_get_f64(got, i),
               tp_tensor_get_f64(want, i));
          return;
        }
      fail("%s: the bytes differ", what);
    }
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    double g = tp_tensor_get_f64(got, i), w = tp_tensor_get_f64(want, i);
    if (g == w || (isnan(g) && isnan(w))) continue;
    if (!(fabs(g - w) <= tol.atol + tol.rtol * fabs(w))) {
      fail("%s: [%lld] gpu %.17g, cpu %.17g", what, (long long)i, g, w);
      return;
    }
  }
}

static void check_status(const char *what, TpKernelStatus got, TpKernelStatus want) {
  if (got != want) fail("%s: status %d, the CPU's %d", what, got, want);
}

static const char *dtype_name(TpDType t) { return tp_dtype_name(t); }

/* ---- unary ---- */
static const int64_t ODD[] = {37}, LONG[] = {3, 259}, EMPTY[] = {0, 5};

/* Exp, Log, Erf...: the same double formula over the device's libm (within 2 ulp of
 * double on a GPU, the host's own libm in the emulation), then rounded to the dtype. */
static Tolerance libm_tolerance(TpDType t) {
  const Tolerance f64 = {1e-300, 1e-14}, f16 = {1e-7, 1e-3}, bf16 = {1e-7, 8e-3}, exact = {0, 0};
  return t == TP_F64 ? f64 : t == TP_F16 ? f16 : t == TP_BF16 ? bf16 : exact;
}

static void unary_case(TpUnaryOp op, TpDType t, double lo, double hi) {
  bool ieee = op == TP_UNARY_NEG || op == TP_UNARY_RELU || op == TP_UNARY_SQRT || op == TP_UNARY_RECIPROCAL;
  const int64_t *shapes[] = {ODD, LONG, EMPTY};
  const int ranks[] = {1, 2, 2};
  for (int s = 0; s < 3; s++) {
    TpTensor x = tensor(t, ranks[s], shapes[s], lo, hi), want = result_like(&x), got = result_like(&x);
    char what[96];
    snprintf(what, sizeof what, "unary op %d on %s, case %d", op, dtype_name(t), s);
    check_status(what, tp_cuda_unary(op, &x, &got, stream()), tp_unary(op, &x, &want));
    sync_expect(what, -1);
    check_tensor(what, &got, &want, ieee ? EXACT : libm_tolerance(t));
  }
}

static void unary_fwd(void) {
  const TpDType floats[] = {TP_F32, TP_F64, TP_F16, TP_BF16};
  for (int f = 0; f < 4; f++) {
    for (int op = TP_UNARY_SQRT; op <= TP_UNARY_GELU_TANH; op++)
      if (op != TP_UNARY_NOT && !(floats[f] == TP_F32 && op != TP_UNARY_NEG && op != TP_UNARY_RELU))
        unary_case((TpUnaryOp)op, floats[f], -4, 4);
  }
  const TpDType ints[] = {TP_I8, TP_I16, TP_I32, TP_I64};
  for (int i = 0; i < 4; i++)
    unary_case(TP_UNARY_NEG, ints[i], -100, 100), unary_case(TP_UNARY_RELU, ints[i], -100, 100);
  unary_case(TP_UNARY_NOT, TP_BOOL, 0, 1);
  unary_case(TP_UNARY_NEG, TP_F32, -3, 3);
  /* refused as the CPU refuses: Not on a float, Exp on an integer, another dtype, other dims */
  unary_case(TP_UNARY_NOT, TP_F32, 0, 1);
  unary_case(TP_UNARY_EXP, TP_I32, 0, 1);
  unary_case(TP_UNARY_RELU, TP_U8, 0, 9);
  int64_t n = 4, m = 5;
  TpTensor x = tensor(TP_F64, 1, &n, -1, 1), y = result(TP_F64, 1, &m), y32 = result(TP_F32, 1, &n);
  check_status("Neg into other dims", tp_cuda_unary(TP_UNARY_NEG, &x, &y, stream()), TP_KERNEL_BAD_SHAPE);
  check_status("Neg into another dtype", tp_cuda_unary(TP_UNARY_NEG, &x, &y32, stream()), TP_KERNEL_BAD_DTYPE);
  sync_expect("refusals", -1);
}

/* ---- binary, Where ---- */
typedef struct {
  int ra, rb;
  int64_t a[4], b[4];
} PairCase;

static const PairCase PAIRS[] = {
    {1, 1, {37}, {37}},         {2, 2, {3, 1}, {1, 5}}, {3, 1, {2, 1, 3}, {3}}, {0, 2, {0}, {4, 1}}, /* a scalar */
    {2, 2, {0, 3}, {1, 3}},                                                                          /* empty */
    {2, 2, {2, 259}, {2, 259}},
};
enum { NPAIRS = sizeof PAIRS / sizeof *PAIRS };

static int pair_dims(const PairCase *c, int64_t *out) {
  int r = c->ra > c->rb ? c->ra : c->rb;
  for (int d = 0; d < r; d++) {
    int da = d - (r - c->ra), db = d - (r - c->rb);
    int64_t x = da >= 0 ? c->a[da] : 1, y = db >= 0 ? c->b[db] : 1;
    out[d] = x == 1 ? y : x;
  }
  return r;
}

static void binary_case(TpBinaryOp op, TpDType ta, TpDType tb, TpDType ty, double lo, double hi, Tolerance tol) {
  for (int c = 0; c < NPAIRS; c++) {
    int64_t yd[4];
    int ry = pair_dims(&PAIRS[c], yd);
    TpTensor a = tensor(ta, PAIRS[c].ra, PAIRS[c].a, lo, hi), b = tensor(tb, PAIRS[c].rb, PAIRS[c].b, lo, hi);
    if (tp_tensor_numel(&b) > 1) set_f64(&b, 1, 0); /* x / 0 */
    if (tp_tensor_numel(&a) > 2 && tp_dtype_is_float(ta)) set_f64(&a, 2, NAN);
    TpTensor want = result(ty, ry, yd), got = result(ty, ry, yd);
    char what[96];
    snprintf(what, sizeof what, "binary op %d on %s, %s -> %s, case %d", op, dtype_name(ta), dtype_name(tb),
             dtype_name(ty), c);
    check_status(what, tp_cuda_binary(op, &a, &b, &got, stream()), tp_binary(op, &a, &b, &want));
    sync_expect(what, -1);
    check_tensor(what, &got, &want, tol);
  }
}

static void binary_fwd(void) {
  const TpDType numeric[] = {TP_F32, TP_F64, TP_F16, TP_BF16, TP_I8, TP_I32, TP_I64, TP_U8, TP_U32};
  for (int t = 0; t < 9; t++) {
    TpDType d = numeric[t];
    bool is_unsigned = d == TP_U8 || d == TP_U32;
    double lo = is_unsigned ? 0 : -9, hi = 9;
    for (int op = TP_BINARY_ADD; op <= TP_BINARY_MIN; op++)
      if (op != TP_BINARY_POW) binary_case((TpBinaryOp)op, d, d, d, lo, hi, EXACT);
    binary_case(TP_BINARY_POW, d, d, d, is_unsigned ? 0 : -3, 3, d == TP_F32 ? F32 : libm_tolerance(d));
    for (int op = TP_BINARY_EQUAL; op <= TP_BINARY_GREATER_EQUAL; op++)
      binary_case((TpBinaryOp)op, d, d, TP_BOOL, lo, 3, EXACT);
  }
  binary_case(TP_BINARY_POW, TP_F32, TP_I64, TP_F32, 0, 3, F32); /* another exponent dtype */
  binary_case(TP_BINARY_POW, TP_I32, TP_F64, TP_I32, 0, 3, EXACT);
  binary_case(TP_BINARY_POW, TP_I64, TP_I32, TP_I64, -3, 3, EXACT); /* negative exponents */
  binary_case(TP_BINARY_AND, TP_BOOL, TP_BOOL, TP_BOOL, 0, 1, EXACT);
  binary_case(TP_BINARY_EQUAL, TP_BOOL, TP_BOOL, TP_BOOL, 0, 1, EXACT);
  /* refusals: Less on bool, Add of two dtypes, And of floats, shapes that do not broadcast */
  binary_case(TP_BINARY_LESS, TP_BOOL, TP_BOOL, TP_BOOL, 0, 1, EXACT);
  binary_case(TP_BINARY_ADD, TP_F32, TP_F64, TP_F32, 0, 1, EXACT);
  binary_case(TP_BINARY_AND, TP_F32, TP_F32, TP_BOOL, 0, 1, EXACT);
  int64_t three = 3, four = 4;
  TpTensor a = tensor(TP_I64, 1, &three, 0, 1), b = tensor(TP_I64, 1, &four, 0, 1), y = result(TP_I64, 1, &four);
  check_status("Add [3] [4]", tp_cuda_binary(TP_BINARY_ADD, &a, &b, &y, stream()), TP_KERNEL_BAD_SHAPE);
  sync_expect("refusals", -1);
}

static void where_fwd(void) {
  const TpDType types[] = {TP_F32, TP_F64, TP_F16, TP_I64, TP_I32, TP_BOOL, TP_U8};
  for (int t = 0; t < 7; t++)
    for (int c = 0; c < NPAIRS; c++) {
      int64_t yd[4];
      int ry = pair_dims(&PAIRS[c], yd);
      /* cond with a's shape, a with b's, b with y's: a three-way broadcast */
      TpTensor cond = tensor(TP_BOOL, PAIRS[c].ra, PAIRS[c].a, 0, 1),
               a = tensor(types[t], PAIRS[c].rb, PAIRS[c].b, -9, 9);
      TpTensor b = tensor(types[t], ry, yd, -9, 9), want = result(types[t], ry, yd), got = result(types[t], ry, yd);
      char what[64];
      snprintf(what, sizeof what, "Where on %s, case %d", dtype_name(types[t]), c);
      check_status(what, tp_cuda_where(&cond, &a, &b, &got, stream()), tp_where(&cond, &a, &b, &want));
      sync_expect(what, -1);
      check_tensor(what, &got, &want, EXACT);
    }
  int64_t n = 3;
  TpTensor c = tensor(TP_I32, 1, &n, 0, 1), a = tensor(TP_F32, 1, &n, 0, 1), y = result(TP_F32, 1, &n);
  check_status("Where on an i32 cond", tp_cuda_where(&c, &a, &a, &y, stream()), TP_KERNEL_BAD_DTYPE);
}

static void cast_fwd(void) {
  const TpDType types[] = {TP_F32, TP_F64, TP_F16, TP_BF16, TP_I8,  TP_I16,
                           TP_I32, TP_I64, TP_U8,  TP_U16,  TP_U64, TP_BOOL};
  const int nt = sizeof types / sizeof *types;
  int64_t n = 301;
  for (int s = 0; s < nt; s++)
    for (int d = 0; d < nt; d++) {
      TpTensor x = tensor(types[s], 1, &n, -400, 70000);
      if (tp_dtype_is_float(types[s])) { /* NaN, infinities, fractions, out of every integer range */
        set_f64(&x, 0, NAN), set_f64(&x, 1, INFINITY), set_f64(&x, 2, -INFINITY), set_f64(&x, 3, -2.7);
        set_f64(&x, 4, 1e30), set_f64(&x, 5, 0.3), set_f64(&x, 6, 65519.9);
        /* f64s just above a tie of f16 (1 + 2^-8 + 2^-11) and of bf16 (1 + 2^-8), which f32
           rounds onto the tie: only f32's round-to-odd keeps them rounding up */
        set_f64(&x, 7, 1 + ldexp(1, -8) + ldexp(1, -11) + ldexp(1, -40));
        set_f64(&x, 8, 1 + ldexp(1, -8) + ldexp(1, -40));
      }
      TpTensor want = result(types[d], 1, &n), got = result(types[d], 1, &n);
      char what[64];
      snprintf(what, sizeof what, "Cast %s -> %s", dtype_name(types[s]), dtype_name(types[d]));
      check_status(what, tp_cuda_cast(&x, &got, stream()), tp_cast(&x, &want));
      sync_expect(what, -1);
      check_tensor(what, &got, &want, EXACT);
    }
}

/* ---- layout ---- */
static const TpDType LAYOUT_TYPES[] = {TP_F32, TP_F64, TP_F16, TP_I64, TP_I32, TP_BOOL};
enum { NLAYOUT = sizeof LAYOUT_TYPES / sizeof *LAYOUT_TYPES };

static void reshape_expand_tile(void) {
  for (int t = 0; t < NLAYOUT; t++) {
    TpDType d = LAYOUT_TYPES[t];
    char what[64];
    int64_t xd[3] = {3, 1, 5}, rd[2] = {5, 3}, ed[4] = {2, 3, 4, 5}, td[3] = {6, 2, 5}, zd[3] = {0, 2, 5};
    TpTensor x = tensor(d, 3, xd, -9, 9);
    TpTensor w = result(d, 2, rd), g = result(d, 2, rd);
    snprintf(what, sizeof what, "Reshape on %s", dtype_name(d));
    check_status(what, tp_cuda_reshape(&x, &g, stream()), tp_reshape(&x, &w));
    sync_expect(what, -1);
    check_tensor(what, &g, &w, EXACT);
    w = result(d, 4, ed), g = result(d, 4, ed);
    snprintf(what, sizeof what, "Expand on %s", dtype_name(d));
    check_status(what, tp_cuda_expand(&x, &g, stream()), tp_expand(&x, &w));
    sync_expect(what, -1);
    check_tensor(what, &g, &w, EXACT);
    for (int z = 0; z < 2; z++) {
      w = result(d, 3, z ? zd : td), g = result(d, 3, z ? zd : td);
      snprintf(what, sizeof what, "Tile on %s%s", dtype_name(d), z ? " into an empty y" : "");
      check_status(what, tp_cuda_tile(&x, &g, stream()), tp_tile(&x, &w));
      sync_expect(what, -1);
      check_tensor(what, &g, &w, EXACT);
    }
  }
  int64_t a[2] = {2, 3}, b[2] = {4, 3}, c[2] = {2, 2};
  TpTensor x = tensor(TP_F32, 2, a, 0, 1), y = result(TP_F32, 2, b), z = result(TP_F32, 2, c),
           y64 = result(TP_F64, 2, b);
  check_status("Expand [2,3] to [4,3]", tp_cuda_expand(&x, &y, stream()), TP_KERNEL_BAD_SHAPE);
  check_status("Tile [2,3] to [2,2]", tp_cuda_tile(&x, &z, stream()), TP_KERNEL_BAD_SHAPE);
  check_status("Reshape [2,3] to [2,2]", tp_cuda_reshape(&x, &z, stream()), TP_KERNEL_BAD_SHAPE);
  check_status("Tile f32 to f64", tp_cuda_tile(&x, &y64, stream()), TP_KERNEL_BAD_DTYPE);
}

static void transpose_fwd(void) {
  const int64_t xd[4] = {2, 3, 1, 5}, perm[4] = {3, 0, 2, 1}, yd[4] = {5, 2, 1, 3}, bad_perm[4] = {3, 0, 3, 1};
  for (int t = 0; t < NLAYOUT; t++) {
    TpTensor x = tensor(LAYOUT_TYPES[t], 4, xd, -9, 9), w = result(LAYOUT_TYPES[t], 4, yd),
             g = result(LAYOUT_TYPES[t], 4, yd);
    check_status("Transpose", tp_cuda_transpose(&x, perm, &g, stream()), tp_transpose(&x, perm, &w));
    check_status("Transpose, no permutation", tp_cuda_transpose(&x, bad_perm, &g, stream()),
                 tp_transpose(&x, bad_perm, &w));
    sync_expect("Transpose", -1);
    check_tensor(dtype_name(LAYOUT_TYPES[t]), &g, &w, EXACT);
  }
}

typedef struct {
  int rank;
  int64_t x[3], y[3], starts[3], steps[3];
} SliceCase;

static const SliceCase SLICES[] = {
    {2, {5, 7}, {2, 3}, {1, 6}, {2, -2}}, /* negative steps */
    {3, {2, 3, 9}, {2, 1, 4}, {0, 2, 8}, {1, 1, -1}},
    {1, {4}, {0}, {9}, {1}},             /* empty: start past the end */
    {2, {3, 4}, {4, 1}, {0, 0}, {1, 1}}, /* does not fit: refused */
};

static void slice_test(bool backward) {
  for (int t = 0; t < NLAYOUT; t++)
    for (size_t c = 0; c < sizeof SLICES / sizeof *SLICES; c++) {
      const SliceCase *s = &SLICES[c];
      TpDType d = LAYOUT_TYPES[t];
      TpTensor in = tensor(d, s->rank, backward ? s->y : s->x, -9, 9);
      const int64_t *out_dims = backward ? s->x : s->y;
      TpTensor w = result(d, s->rank, out_dims), g = result(d, s->rank, out_dims);
      char what[64];
      snprintf(what, sizeof what, "Slice%s on %s, case %zu", backward ? "Backward" : "", dtype_name(d), c);
      if (backward)
        check_status(what, tp_cuda_slice_backward(&in, s->starts, s->steps, &g, stream()),
                     tp_slice_backward(&in, s->starts, s->steps, &w));
      else
        check_status(what, tp_cuda_slice(&in, s->starts, s->steps, &g, stream()),
                     tp_slice(&in, s->starts, s->steps, &w));
      sync_expect(what, -1);
      if (c < 3) check_tensor(what, &g, &w, EXACT);
    }
}
static void slice_fwd(void) { slice_test(false); }
static void slice_bwd(void) { slice_test(true); }

static void split_concat(void) {
  for (int t = 0; t < NLAYOUT; t++)
    for (int axis = 0; axis < 3; axis++) {
      TpDType d = LAYOUT_TYPES[t];
      int64_t whole[3] = {3, 4, 5}, sizes[3] = {1, 0, 0};
      sizes[1] = whole[axis] - 2, sizes[2] = 1; /* one piece of 0 on axis 0 */
      TpTensor x = tensor(d, 3, whole, -9, 9), want[3], got[3];
      for (int k = 0; k < 3; k++) {
        int64_t pd[3] = {3, 4, 5};
        pd[axis] = sizes[k];
        want[k] = result(d, 3, pd), got[k] = result(d, 3, pd);
      }
      char what[64];
      snprintf(what, sizeof what, "Split on %s, axis %d", dtype_name(d), axis);
      check_status(what, tp_cuda_split(&x, axis, got, 3, stream()), tp_split(&x, axis, want, 3));
      sync_expect(what, -1);
      for (int k = 0; k < 3; k++) check_tensor(what, &got[k], &want[k], EXACT);
      TpTensor cw = result_like(&x), cg = result_like(&x);
      snprintf(what, sizeof what, "Concat on %s, axis %d", dtype_name(d), axis);
      check_status(what, tp_cuda_concat(want, 3, axis, &cg, stream()), tp_concat(want, 3, axis, &cw));
      sync_expect(what, -1);
      check_tensor(what, &cg, &cw, EXACT);
      check_status("Split on axis 3", tp_cuda_split(&x, 3, got, 3, stream()), tp_split(&x, 3, want, 3));
      check_status("Concat of 2 pieces", tp_cuda_concat(want, 2, axis, &cg, stream()),
                   tp_concat(want, 2, axis, &cw));
    }
}

static void context_append(void) {
  for (int t = 0; t < NLAYOUT; t++) {
    int64_t xd[3] = {2, 3, 5}, bd[3] = {2, 7, 5};
    TpTensor x = tensor(LAYOUT_TYPES[t], 3, xd, -9, 9), w = tensor(LAYOUT_TYPES[t], 3, bd, -9, 9),
             g = result_like(&w);
    memcpy(g.data, w.data, tp_tensor_bytes(&w));
    check_status("ContextAppend", tp_cuda_context_append(&x, 1, 4, 7, g.data, stream()),
                 tp_context_append(&x, 1, 4, 7, w.data));
    check_status("ContextAppend past the rows", tp_cuda_context_append(&x, 1, 5, 7, g.data, stream()),
                 tp_context_append(&x, 1, 5, 7, w.data));
    sync_expect("ContextAppend", -1);
    check_tensor("ContextAppend", &g, &w, EXACT);
  }
}

static void trilu_fwd(void) {
  const int64_t ks[] = {0, 1, -2, 9, -9, INT64_MAX, INT64_MIN};
  for (int t = 0; t < NLAYOUT; t++)
    for (size_t k = 0; k < sizeof ks / sizeof *ks; k++)
      for (int upper = 0; upper < 2; upper++) {
        int64_t xd[3] = {2, 5, 7};
        TpTensor x = tensor(LAYOUT_TYPES[t], 3, xd, -9, 9), w = result_like(&x), g = result_like(&x);
        char what[64];
        snprintf(what, sizeof what, "Trilu on %s, k %lld, upper %d", dtype_name(x.dtype), (long long)ks[k], upper);
        check_status(what, tp_cuda_trilu(&x, upper, ks[k], &g, stream()), tp_trilu(&x, upper, ks[k], &w));
        sync_expect(what, -1);
        check_tensor(what, &g, &w, EXACT);
      }
  int64_t n = 4;
  TpTensor v = tensor(TP_F32, 1, &n, 0, 1), y = result_like(&v);
  check_status("Trilu of a vector", tp_cuda_trilu(&v, true, 0, &y, stream()), TP_KERNEL_BAD_SHAPE);
}

/* ---- Gather, GatherElements ---- */
static TpTensor indices(TpDType t, int rank, const int64_t *dims, int64_t n) {
  return tensor(t, rank, dims, -n, n - 1); /* negatives count from the end */
}

static void gather_test(bool backward) {
  const TpDType types[] = {TP_F32, TP_F64, TP_F16, TP_I64, TP_BOOL};
  const int64_t data_dims[3] = {4, 3, 6}, idx_dims[2] = {2, 5};
  for (int t = 0; t < (backward ? 1 : 5); t++)
    for (int it = 0; it < 2; it++)
      for (int axis = 0; axis < 3; axis++) {
        TpDType d = types[t], ti = it ? TP_I32 : TP_I64;
        TpTensor idx = indices(ti, 2, idx_dims, data_dims[axis]);
        int64_t yd[4];
        int ry = 0;
        for (int k = 0; k < axis; k++) yd[ry++] = data_dims[k];
        for (int k = 0; k < 2; k++) yd[ry++] = idx_dims[k];
        for (int k = axis + 1; k < 3; k++) yd[ry++] = data_dims[k];
        TpTensor in = backward ? tensor(d, ry, yd, -9, 9) : tensor(d, 3, data_dims, -9, 9);
        TpTensor w = backward ? result(d, 3, data_dims) : result(d, ry, yd), g = result_like(&w);
        int64_t bad = 0;
        char what[64];
        snprintf(what, sizeof what, "Gather%s on %s by %s, axis %d", backward ? "Backward" : "", dtype_name(d),
                 dtype_name(ti), axis);
        if (backward)
          check_status(what, tp_cuda_gather_backward(&in, &idx, axis, it ? 1 : -1, &g, NULL, stream()),
                       tp_gather_backward(&in, &idx, axis, it ? 1 : -1, &w, &bad)); /* a padding index by i32 */
        else
          check_status(what, tp_cuda_gather(&in, &idx, axis, &g, NULL, stream()),
                       tp_gather(&in, &idx, axis, &w, &bad));
        sync_expect(what, -1);
        check_tensor(what, &g, &w, EXACT);
        /* indices out of range, above n and below -n: the smallest position is reported */
        set_f64(&idx, 7, data_dims[axis] + 2);
        if (backward) tp_cuda_gather_backward(&in, &idx, axis, -1, &g, NULL, stream());
        else tp_cuda_gather(&in, &idx, axis, &g, NULL, stream());
        sync_expect(what, 7);
        set_f64(&idx, 3, -data_dims[axis] - 1);
        if (backward) tp_cuda_gather_backward(&in, &idx, axis, -1, &g, NULL, stream());
        else tp_cuda_gather(&in, &idx, axis, &g, NULL, stream());
        sync_expect(what, 3);
      }
  int64_t n = 3;
  TpTensor x = tensor(TP_F32, 1, &n, 0, 1), f = tensor(TP_F32, 1, &n, 0, 1), y = result_like(&x);
  check_status("Gather by f32 indices", tp_cuda_gather(&x, &f, 0, &y, NULL, stream()), TP_KERNEL_BAD_DTYPE);
  TpTensor i = tensor(TP_I64, 1, &n, 0, 1), y64 = result(TP_F64, 1, &n), d64 = tensor(TP_F64, 1, &n, 0, 1);
  check_status("Gather on axis 1", tp_cuda_gather(&x, &i, 1, &y, NULL, stream()), TP_KERNEL_BAD_SHAPE);
  check_status("Gather f32 into f64", tp_cuda_gather(&x, &i, 0, &y64, NULL, stream()), TP_KERNEL_BAD_DTYPE);
  check_status("GatherBackward on f64", tp_cuda_gather_backward(&d64, &i, 0, -1, &y64, NULL, stream()),
               TP_KERNEL_BAD_DTYPE);
  check_status("GatherElements f32 into f64", tp_cuda_gather_elements(&x, &i, 0, &y64, NULL, stream()),
               TP_KERNEL_BAD_DTYPE);
  check_status("GatherElementsBackward on f64", tp_cuda_gather_elements_backward(&d64, &i, 0, &y64, NULL, stream()),
               TP_KERNEL_BAD_DTYPE);
  check_status("GatherElements by f32", tp_cuda_gather_elements(&x, &f, 0, &y, NULL, stream()), TP_KERNEL_BAD_DTYPE);
}
static void gather_fwd(void) { gather_test(false); }
static void gather_bwd(void) { gather_test(true); }

static void gather_elements_test(bool backward) {
  const int64_t data_dims[3] = {4, 3, 6};
  for (int it = 0; it < 2; it++)
    for (int axis = 0; axis < 3; axis++) {
      int64_t idx_dims[3] = {3, 2, 5};
      idx_dims[axis] = 7; /* longer than data along axis: repeated indices */
      TpDType ti = it ? TP_I32 : TP_I64, d = it && !backward ? TP_I64 : TP_F32;
      TpTensor idx = indices(ti, 3, idx_dims, data_dims[axis]);
      TpTensor in = backward ? tensor(d, 3, idx_dims, -9, 9) : tensor(d, 3, data_dims, -9, 9);
      TpTensor w = backward ? result(d, 3, data_dims) : result(d, 3, idx_dims), g = result_like(&w);
      int64_t bad = 0;
      char what[64];
      snprintf(what, sizeof what, "GatherElements%s by %s, axis %d", backward ? "Backward" : "", dtype_name(ti),
               axis);
      if (backward)
        check_status(what, tp_cuda_gather_elements_backward(&in, &idx, axis, &g, NULL, stream()),
                     tp_gather_elements_backward(&in, &idx, axis, &w, &bad));
      else
        check_status(what, tp_cuda_gather_elements(&in, &idx, axis, &g, NULL, stream()),
                     tp_gather_elements(&in, &idx, axis, &w, &bad));
      sync_expect(what, -1);
      check_tensor(what, &g, &w, EXACT);
      set_f64(&idx, 11, -data_dims[axis] - 1);
      if (backward) tp_cuda_gather_elements_backward(&in, &idx, axis, &g, NULL, stream());
      else tp_cuda_gather_elements(&in, &idx, axis, &g, NULL, stream());
      sync_expect(what, 11); /* the position of the index below -n, not its value */
      TpTensor short_y = result(d, 2, idx_dims);
      check_status("GatherElements of another rank",
                   backward ? tp_cuda_gather_elements_backward(&in, &idx, axis, &short_y, NULL, stream())
                            : tp_cuda_gather_elements(&in, &idx, axis, &short_y, NULL, stream()),
                   TP_KERNEL_BAD_SHAPE);
    }
}
static void gather_elements_fwd(void) { gather_elements_test(false); }
static void gather_elements_bwd(void) { gather_elements_test(true); }

/* ---- CumSum, ReduceSum ---- */
static const TpDType SUM_TYPES[] = {TP_F32, TP_F64, TP_F16, TP_BF16, TP_I64, TP_I32, TP_U8};

static void cumsum_fwd(void) {
  const int64_t xd[3] = {3, 37, 4};
  for (int t = 0; t < 7; t++)
    for (int axis = 0; axis < 3; axis++)
      for (int flags = 0; flags < 4; flags++) {
        TpTensor x = tensor(SUM_TYPES[t], 3, xd, -9, 9), w = result_like(&x), g = result_like(&x);
        char what[64];
        snprintf(what, sizeof what, "CumSum on %s, axis %d, flags %d", dtype_name(x.dtype), axis, flags);
        check_status(what, tp_cuda_cumsum(&x, axis, flags & 1, flags & 2, &g, stream()),
                     tp_cumsum(&x, axis, flags & 1, flags & 2, &w));
        sync_expect(what, -1);
        check_tensor(what, &g, &w, EXACT);
      }
  TpTensor b = tensor(TP_BOOL, 3, xd, 0, 1), y = result_like(&b);
  check_status("CumSum on bool", tp_cuda_cumsum(&b, 0, false, false, &y, stream()), TP_KERNEL_BAD_DTYPE);
  check_status("CumSum on axis 3", tp_cuda_cumsum(&b, 3, false, false, &y, stream()), TP_KERNEL_BAD_DTYPE);
}

/* TopK: random lines, and lines of few distinct values (ties broken by lower index) */
static void topk_fwd(void) {
  const int64_t xd[3] = {3, 37, 4};
  for (int t = 0; t < 7; t++)
    for (int axis = 0; axis < 3; axis++)
      for (int ties = 0; ties < 2; ties++) {
        TpTensor x = tensor(SUM_TYPES[t], 3, xd, ties ? 0 : -9, ties ? 2 : 9);
        int64_t yd[3] = {3, 37, 4};
        yd[axis] = xd[axis] > 2 ? 2 : 1;
        TpTensor w = result(TP_I64, 3, yd), g = result(TP_I64, 3, yd);
        char what[64];
        snprintf(what, sizeof what, "TopK on %s, axis %d%s", dtype_name(x.dtype), axis, ties ? ", ties" : "");
        check_status(what, tp_cuda_topk(&x, axis, &g, stream()), tp_topk(&x, axis, &w));
        sync_expect(what, -1);
        check_tensor(what, &g, &w, EXACT);
      }
  TpTensor b = tensor(TP_BOOL, 3, xd, 0, 1), y = result(TP_I64, 3, xd);
  check_status("TopK on bool", tp_cuda_topk(&b, 0, &y, stream()), TP_KERNEL_BAD_DTYPE);
}

static void reduce_sum_fwd(void) {
  const int64_t xd[4] = {3, 5, 1, 37}, axes_sets[4][3] = {{1, 3}, {0}, {0, 1, 2}, {2}};
  const int naxes[4] = {2, 1, 3, 1};
  for (int t = 0; t < 7; t++)
    for (int a = 0; a < 4; a++)
      for (int mean = 0; mean < 2; mean++) {
        int64_t yd[4];
        int ry = 0;
        for (int d = 0, k = 0; d < 4; d++)
          if (k < naxes[a] && axes_sets[a][k] == d) k++;
          else yd[ry++] = xd[d];
        TpTensor x = tensor(SUM_TYPES[t], 4, xd, -9, 9), w = result(x.dtype, ry, yd), g = result(x.dtype, ry, yd);
        char what[64];
        snprintf(what, sizeof what, "ReduceSum on %s, axes %d, mean %d", dtype_name(x.dtype), a, mean);
        check_status(what, tp_cuda_reduce_sum(&x, axes_sets[a], naxes[a], mean, &g, stream()),
                     tp_reduce_sum(&x, axes_sets[a], naxes[a], mean, &w));
        sync_expect(what, -1);
        check_tensor(what, &g, &w, EXACT);
      }
  const int64_t unsorted[2] = {3, 1};
  TpTensor x = tensor(TP_I64, 4, xd, 0, 1), y = result(TP_I64, 2, xd);
  check_status("ReduceSum, unsorted axes", tp_cuda_reduce_sum(&x, unsorted, 2, false, &y, stream()),
               TP_KERNEL_BAD_SHAPE);
  TpTensor b = tensor(TP_BOOL, 4, xd, 0, 1), yb = result(TP_BOOL, 2, xd);
  check_status("ReduceSum on bool", tp_cuda_reduce_sum(&b, unsorted, 2, false, &yb, stream()), TP_KERNEL_BAD_DTYPE);
}

/* ReduceSum over the rows (a gradient unbroadcast), f64 with full 53-bit significands, whose
 * sums round in double, so only the CPU's order (runs of 64 rows) gives its bits: rows
 * below, at and past a run and not multiples of it, odd column counts. */
static void reduce_sum_rows(void) {
  static const int64_t ROWS[] = {1, 63, 64, 65, 200}, COLUMNS[] = {1, 3, 33, 300};
  const int64_t axis0[1] = {0};
  for (size_t a = 0; a < sizeof ROWS / sizeof *ROWS; a++)
    for (size_t b = 0; b < sizeof COLUMNS / sizeof *COLUMNS; b++) {
      int64_t xd[2] = {ROWS[a], COLUMNS[b]};
      TpTensor x = tensor(TP_F64, 2, xd, -9, 9), w = result(TP_F64, 1, xd + 1), g = result(TP_F64, 1, xd + 1);
      for (int64_t i = 0; i < xd[0] * xd[1]; i++) ((double *)x.data)[i] += frand() * 0x1p-30; /* low bits set */
      char what[64];
      snprintf(what, sizeof what, "ReduceSum on f64 (%lld, %lld), axis 0", (long long)xd[0], (long long)xd[1]);
      check_status(what, tp_cuda_reduce_sum(&x, axis0, 1, false, &g, stream()),
                   tp_reduce_sum(&x, axis0, 1, false, &w));
      sync_expect(what, -1);
      const double *got = g.data, *want = w.data;
      for (int64_t j = 0; j < xd[1]; j++)
        if (memcmp(&got[j], &want[j], sizeof got[j])) {
          fail("%s: not the CPU's bits at [%lld] (gpu %.17g, cpu %.17g)", what, (long long)j, got[j], want[j]);
          break;
        }
    }
}

/* ---- nn (f32 arrays) ---- */
static float *floats(int64_t n, float scale) {
  float *a = buffer((size_t)n * sizeof *a);
  for (int64_t i = 0; i < n; i++) a[i] = frand() * scale;
  return a;
}

static float *poison(int64_t n) {
  float *a = buffer((size_t)n * sizeof *a);
  for (int64_t i = 0; i < n; i++) a[i] = 12345.0f;
  return a;
}

static void compare(const char *what, const float *got, const float *want, int64_t n, Tolerance tol) {
  sync_expect(what, -1);
  check_close(what, got, want, n, tol);
}

static void softmax_test(bool backward) {
  const int64_t shapes[][3] = {{3, 37, 1}, {2, 5, 7}, {1, 300, 3}, {0, 4, 2}, {4, 1, 5}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
    for (int log = 0; log < 2; log++) {
      int64_t outer = shapes[s][0], n = shapes[s][1], inner = shapes[s][2], total = outer * n * inner;
      float *x = floats(total, 4), *dy = floats(total, 1), *want = poison(total), *got = poison(total);
      char what[64];
      snprintf(what, sizeof what, "Softmax%s [%lld,%lld,%lld] log %d", backward ? "Backward" : "", (long long)outer,
               (long long)n, (long long)inner, log);
      if (total > 2) x[1] = -INFINITY;
      tp_softmax_f32(x, x, outer, n, inner, log); /* x becomes a forward result y */
      if (backward) {
        tp_softmax_backward_f32(dy, x, outer, n, inner, log, want);
        check_status(what, tp_cuda_softmax_backward_f32(dy, x, outer, n, inner, log, got, stream()), TP_KERNEL_OK);
      } else {
        float *x2 = floats(total, 4);
        tp_softmax_f32(x2, want, outer, n, inner, log);
        check_status(what, tp_cuda_softmax_f32(x2, got, outer, n, inner, log, stream()), TP_KERNEL_OK);
        compare(what, got, want, total, F32);
        continue;
      }
      compare(what, got, want, total, F32);
    }
}
static void softmax_fwd(void) { softmax_test(false); }
static void softmax_bwd(void) { softmax_test(true); }

static void layernorm_test(bool backward) {
  const int64_t rows = 5, n = 259;
  float *x = floats(rows * n, 3), *scale = floats(n, 1), *bias = floats(n, 1), *dy = floats(rows * n, 1);
  float *mean = poison(rows), *inv = poison(rows), *wy = poison(rows * n), *gy = poison(rows * n);
  float *gmean = poison(rows), *ginv = poison(rows);
  tp_layernorm_f32(x, scale, bias, rows, n, 1e-5f, wy, mean, inv);
  if (!backward) {
    check_status("LayerNorm", tp_cuda_layernorm_f32(x, scale, bias, rows, n, 1e-5f, gy, gmean, ginv, stream()),
                 TP_KERNEL_OK);
    compare("LayerNorm y", gy, wy, rows * n, F32);
    check_close("LayerNorm mean", gmean, mean, rows, F32);
    check_close("LayerNorm inv_std", ginv, inv, rows, F32);
    return;
  }
  float *wdx = poison(rows * n), *gdx = poison(rows * n), *wds = poison(n), *gds = poison(n), *wdb = poison(n),
        *gdb = poison(n);
  tp_layernorm_backward_f32(dy, x, scale, mean, inv, rows, n, wdx, wds, wdb);
  check_status("LayerNormBackward",
               tp_cuda_layernorm_backward_f32(dy, x, scale, mean, inv, rows, n, gdx, gds, gdb, stream()),
               TP_KERNEL_OK);
  compare("LayerNormBackward dx", gdx, wdx, rows * n, F32);
  check_close("LayerNormBackward dscale", gds, wds, n, F32);
  check_close("LayerNormBackward dbias", gdb, wdb, n, F32);
}
static void layernorm_fwd(void) { layernorm_test(false); }
static void layernorm_bwd(void) { layernorm_test(true); }

static void rmsnorm_test(bool backward) {
  const int64_t rows = 7, n = 37;
  float *x = floats(rows * n, 3), *scale = floats(n, 1), *dy = floats(rows * n, 1);
  float *want = poison(rows * n), *got = poison(rows * n), *wds = poison(n), *gds = poison(n);
  if (!backward) {
    tp_rmsnorm_f32(x, scale, rows, n, 1e-6f, want);
    check_status("RMSNorm", tp_cuda_rmsnorm_f32(x, scale, rows, n, 1e-6f, got, stream()), TP_KERNEL_OK);
    compare("RMSNorm", got, want, rows * n, F32);
    return;
  }
  tp_rmsnorm_backward_f32(dy, x, scale, rows, n, 1e-6f, want, wds);
  check_status("RMSNormBackward", tp_cuda_rmsnorm_backward_f32(dy, x, scale, rows, n, 1e-6f, got, gds, stream()),
               TP_KERNEL_OK);
  compare("RMSNormBackward dx", got, want, rows * n, F32);
  check_close("RMSNormBackward dscale", gds, wds, n, F32);
}
static void rmsnorm_fwd(void) { rmsnorm_test(false); }
static void rmsnorm_bwd(void) { rmsnorm_test(true); }

static void rotary_test(bool backward) {
  const int64_t dims[4] = {2, 3, 5, 10}, table[4] = {1, 1, 5, 4}, n = 300;
  float *x = floats(n, 2), *cs = floats(20, 1), *sn = floats(20, 1), *want = poison(n), *got = poison(n);
  for (int interleaved = 0; interleaved < 2; interleaved++) {
    if (backward) {
      tp_rotary_backward_f32(x, cs, sn, 4, dims, table, 4, interleaved, want);
      check_status("RotaryBackward",
                   tp_cuda_rotary_backward_f32(x, cs, sn, 4, dims, table, 4, interleaved, got, stream()),
                   TP_KERNEL_OK);
    } else {
      tp_rotary_f32(x, cs, sn, 4, dims, table, 4, interleaved, want);
      check_status("Rotary", tp_cuda_rotary_f32(x, cs, sn, 4, dims, table, 4, interleaved, got, stream()),
                   TP_KERNEL_OK);
    }
    compare(backward ? "RotaryBackward" : "Rotary", got, want, n, F32);
  }
}
static void rotary_fwd(void) { rotary_test(false); }
static void rotary_bwd(void) { rotary_test(true); }

static void swiglu_gelu(void) {
  const int64_t n = 517;
  float *gate = floats(n, 4), *up = floats(n, 2), *dy = floats(n, 1), *want = poison(n), *got = poison(n);
  float *wup = poison(n), *gup = poison(n);
  tp_swiglu_f32(gate, up, n, want);
  check_status("SwiGLU", tp_cuda_swiglu_f32(gate, up, n, got, stream()), TP_KERNEL_OK);
  compare("SwiGLU", got, want, n, F32);
  tp_swiglu_backward_f32(dy, gate, up, n, want, wup);
  check_status("SwiGLUBackward", tp_cuda_swiglu_backward_f32(dy, gate, up, n, got, gup, stream()), TP_KERNEL_OK);
  compare("SwiGLUBackward dgate", got, want, n, F32);
  check_close("SwiGLUBackward dup", gup, wup, n, F32);
  for (int tanh_approx = 0; tanh_approx < 2; tanh_approx++) {
    tp_gelu_backward_f32(dy, gate, n, tanh_approx, want);
    check_status("GeluBackward", tp_cuda_gelu_backward_f32(dy, gate, n, tanh_approx, got, stream()), TP_KERNEL_OK);
    compare("GeluBackward", got, want, n, F32);
    tp_geglu_f32(gate, up, n, tanh_approx, want);
    check_status("GeGLU", tp_cuda_geglu_f32(gate, up, n, tanh_approx, got, stream()), TP_KERNEL_OK);
    compare("GeGLU", got, want, n, F32);
    tp_geglu_backward_f32(dy, gate, up, n, tanh_approx, want, wup);
    check_status("GeGLUBackward", tp_cuda_geglu_backward_f32(dy, gate, up, n, tanh_approx, got, gup, stream()),
                 TP_KERNEL_OK);
    compare("GeGLUBackward dgate", got, want, n, F32);
    check_close("GeGLUBackward dup", gup, wup, n, F32);
  }
}

static int64_t *ids(int64_t n, int64_t lo, int64_t hi) {
  int64_t *a = buffer((size_t)n * sizeof *a);
  for (int64_t i = 0; i < n; i++) a[i] = lo + (int64_t)((frand() + 1) / 2 * (double)(hi - lo + 1)) % (hi - lo + 1);
  return a;
}

static void embedding_fwd(void) {
  const int64_t n = 19, V = 11, C = 37;
  float *table = floats(V * C, 1), *want = poison(n * C), *got = poison(n * C);
  int64_t *id = ids(n, -V, V - 1), bad = -1;
  check_status("Embedding", tp_cuda_embedding_f32(table, id, n, V, C, got, NULL, stream()),
               tp_embedding_f32(table, id, n, V, C, want, &bad));
  compare("Embedding", got, want, n * C, EXACT);
  id[5] = V, id[9] = -V - 1;
  tp_cuda_embedding_f32(table, id, n, V, C, got, NULL, stream());
  sync_expect("Embedding, ids out of range", 5); /* the first position */
}

static void cross_entropy_test(bool backward) {
  const int64_t R = 13, V = 301;
  float *logits = floats(R * V, 5), *want = poison(backward ? R * V : 1), *got = poison(backward ? R * V : 1);
  float *dloss = buffer(sizeof *dloss);
  int64_t *targets = ids(R, 0, V - 1), bad = -1;
  *dloss = 0.75f;
  if (backward) {
    check_status("CrossEntropyBackward",
                 tp_cuda_cross_entropy_backward_f32(dloss, logits, targets, R, V, 7, got, NULL, stream()),
                 tp_cross_entropy_backward_f32(*dloss, logits, targets, R, V, 7, want, &bad));
    compare("CrossEntropyBackward", got, want, R * V, F32);
  } else {
    check_status("CrossEntropy", tp_cuda_cross_entropy_f32(logits, targets, R, V, 7, got, NULL, stream()),
                 tp_cross_entropy_f32(logits, targets, R, V, 7, want, &bad));
    compare("CrossEntropy", got, want, 1, F32);
  }
  targets[4] = V;
  if (backward) tp_cuda_cross_entropy_backward_f32(dloss, logits, targets, R, V, 7, got, NULL, stream());
  else tp_cuda_cross_entropy_f32(logits, targets, R, V, 7, got, NULL, stream());
  sync_expect("CrossEntropy, a target out of range", 4);
}
static void cross_entropy_fwd(void) { cross_entropy_test(false); }
static void cross_entropy_bwd(void) { cross_entropy_test(true); }

/* NLL and SoftmaxCrossEntropy with every reduction, weights or not, an ignored class or not. */
static void loss_test(bool softmax) {
  const int64_t shapes[][3] = {{7, 5, 1}, {3, 4, 6}, {0, 3, 2}};
  for (int s = 0; s < 3; s++)
    for (int opt = 0; opt < 12; opt++) {
      int64_t N = shapes[s][0], C = shapes[s][1], D = shapes[s][2];
      float *x = floats(N * C * D, 3), *weight = floats(C, 1);
      for (int64_t c = 0; c < C; c++) weight[c] = fabsf(weight[c]) + 0.1f;
      int64_t *target = ids(N * D, 0, C - 1), bad = -1;
      TpLossOptions o = {opt & 1 ? weight : NULL, (opt & 2) != 0, 2, (TpReduction)(opt / 4)};
      if (N * D > 3) target[3] = 2; /* an ignored one when ignoring */
      int64_t nloss = o.reduction == TP_REDUCE_NONE ? N * D : 1;
      float *want = poison(nloss ? nloss : 1), *got = poison(nloss ? nloss : 1);
      float *wlp = poison(N * C * D + 1), *glp = poison(N * C * D + 1);
      char what[80];
      snprintf(what, sizeof what, "%s [%lld,%lld,%lld] options %d", softmax ? "SoftmaxCrossEntropy" : "NLLLoss",
               (long long)N, (long long)C, (long long)D, opt);
      if (softmax)
        check_status(what, tp_cuda_softmax_cross_entropy_f32(x, target, N, C, D, &o, glp, got, NULL, stream()),
                     tp_softmax_cross_entropy_f32(x, target, N, C, D, &o, wlp, want, &bad));
      else
        check_status(what, tp_cuda_nll_loss_f32(x, target, N, C, D, &o, got, NULL, stream()),
                     tp_nll_loss_f32(x, target, N, C, D, &o, want, &bad));
      compare(what, got, want, nloss, F32);
      if (softmax) check_close(what, glp, wlp, N * C * D, F32);
      if (N * D > 5) { /* a class out of range, not ignored: its flat index */
        target[5] = C;
        if (softmax) tp_cuda_softmax_cross_entropy_f32(x, target, N, C, D, &o, glp, got, NULL, stream());
        else tp_cuda_nll_loss_f32(x, target, N, C, D, &o, got, NULL, stream());
        sync_expect(what, 5);
      }
    }
}
static void nll_loss_fwd(void) { loss_test(false); }
static void softmax_cross_entropy_fwd(void) { loss_test(true); }

static void copy_to_host(void) {
  float *device = floats(3, 1), host[3] = {0};
  check_status("CopyToHost", tp_cuda_copy_to_host(host, device, sizeof host, stream()), TP_KERNEL_OK);
  compare("CopyToHost", host, device, 3, EXACT);
}

/* ---- matrix products, in f32 and with bf16 operands (checked against the CPU's product of
 * the operands rounded to bf16). The bf16 entry points take each multiplied operand as a
 * view: f32 (rounded in scratch, 2 bytes per element counted in convert_bytes) or bf16 (a
 * stored value, read as it is, nothing counted). Every operand f32, every one bf16 and a mix
 * give the same bits. ---- */

/* x as the bf16 plan's products read it: a copy rounded to bf16 when bf16, else x */
static float *operand(const float *x, int64_t n, bool bf16) {
  if (!bf16) return (float *)x;
  float *r = buffer((size_t)n * sizeof *r);
  for (int64_t i = 0; i < n; i++) r[i] = tp_bf16_to_f32(tp_f32_to_bf16(x[i]));
  return r;
}

/* n f32 elements at x as a 1-D view */
static TpTensor flat(float *x, int64_t n) { return (TpTensor){.dtype = TP_F32, .rank = 1, .dims = {n}, .data = x}; }

/* f32 view t's values rounded to bf16, as a bf16 view (how a stored operand holds them) */
static TpTensor bf16_copy(const TpTensor *t) {
  TpTensor r = result(TP_BF16, t->rank, t->dims);
  for (int64_t i = 0; i < tp_tensor_numel(t); i++)
    ((uint16_t *)r.data)[i] = tp_f32_to_bf16(((const float *)t->data)[i]);
  return r;
}

/* The operand mixes tried: operand k bf16 where bit k is set (all f32 first). */
static const unsigned MIXES[] = {0, 5, 7};
enum { NMIXES = sizeof MIXES / sizeof *MIXES, MAX_OPERANDS = 3 };

/* The product's operands in mix `mix`: views f[k], or bf16 copies of them; *convert gets the
 * bytes the call rounds (2 per element of each wanted f32 operand). */
static void mix_operands(unsigned mix, int n, const TpTensor *f, const bool *wanted, TpTensor *out,
                         uint64_t *convert) {
  *convert = 0;
  for (int k = 0; k < n; k++) {
    out[k] = mix >> k & 1 ? bf16_copy(&f[k]) : f[k];
    if (!(mix >> k & 1) && wanted[k]) *convert += 2 * (uint64_t)tp_tensor_numel(&f[k]);
  }
}

/* Checks the bytes the calls since *mark converted (where they are counted), then marks. */
static void check_converted(const char *what, unsigned mix, uint64_t want, uint64_t *mark) {
  uint64_t got = tp_cuda_stats.convert_bytes - *mark;
  *mark = tp_cuda_stats.convert_bytes;
  if (tp_cuda_stats_on && got != want)
    fail("%s, operand mix %u: convert_bytes %llu, want %llu", what, mix, (unsigned long long)got,
         (unsigned long long)want);
}

static void linear_test(bool backward, bool bf16) {
  const int64_t shapes[][3] = {{5, 37, 9}, {33, 1, 7}, {67, 129, 33}, {4, 0, 3}, {0, 5, 2}};
  for (int s = 0; s < 5; s++)
    for (int tw = 0; tw < 2; tw++)
      for (int outputs = 0; outputs < (backward ? 3 : 1); outputs++) { /* backward: all, dx alone, dw alone */
        int64_t M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
        float *x = floats(M * K + 1, 2), *w = floats(K * N + 1, 2), *bias = floats(N, 1), *dy = floats(M * N + 1, 1);
        float *xr = operand(x, M * K, bf16), *wr = operand(w, K * N, bf16), *dyr = operand(dy, M * N, bf16);
        char what[96];
        snprintf(what, sizeof what, "%sLinear%s [%lld,%lld,%lld] transpose_w %d outputs %d", bf16 ? "bf16 " : "",
                 backward ? "Backward" : "", (long long)M, (long long)K, (long long)N, tw, outputs);
        Tolerance tol = bf16 ? BF16 : F32;
        bool with_dx = outputs != 2, with_dw = outputs != 1;
        /* the operands: (x, w) forward, (dy, x, w) backward */
        const TpTensor views[3] = {backward ? flat(dy, M * N) : flat(x, M * K),
                                   backward ? flat(x, M * K) : flat(w, K * N), flat(w, K * N)};
        const bool wanted[3] = {backward ? with_dx || with_dw : true, backward ? with_dw : true, with_dx};
        int nops = backward ? 3 : 2;
        uint64_t mark = tp_cuda_stats.convert_bytes;
        float *first = NULL; /* mix 0's result */
        if (!backward) {
          float *want = poison(M * N + 1);
          tp_linear_f32(xr, wr, bias, M, K, N, tw, want);
          for (int mix = 0; mix < (bf16 ? NMIXES : 1); mix++) {
            float *got = poison(M * N + 1);
            TpTensor op[MAX_OPERANDS];
            uint64_t convert;
            mix_operands(MIXES[mix], nops, views, wanted, op, &convert);
            mark = tp_cuda_stats.convert_bytes;
            check_status(what,
                         bf16 ? tp_cuda_bf16_linear_f32(&op[0], &op[1], bias, M, K, N, tw, got, stream())
                              : tp_cuda_linear_f32(x, w, bias, M, K, N, tw, got, stream()),
                         TP_KERNEL_OK);
            compare(what, got, mix ? first : want, M * N, mix ? EXACT : tol);
            if (bf16) check_converted(what, MIXES[mix], convert, &mark);
            first = mix ? first : got;
          }
        } else {
          float *wdx = poison(M * K + 1), *wdw = poison(K * N + 1), *wdb = poison(N + 1), *wdb16 = poison(N + 1);
          tp_linear_backward_f32(dyr, xr, wr, M, K, N, tw, with_dx ? wdx : NULL, with_dw ? wdw : NULL, NULL);
          tp_linear_backward_f32(dy, x, w, M, K, N, tw, NULL, NULL, wdb);    /* a sum of dy, no product */
          tp_linear_backward_f32(dyr, x, w, M, K, N, tw, NULL, NULL, wdb16); /* of a bf16 dy: its values */
          float *first_dx = NULL, *first_dw = NULL;
          for (int mix = 0; mix < (bf16 ? NMIXES : 1); mix++) {
            float *gdx = poison(M * K + 1), *gdw = poison(K * N + 1), *gdb = poison(N + 1);
            TpTensor op[MAX_OPERANDS];
            uint64_t convert;
            mix_operands(MIXES[mix], nops, views, wanted, op, &convert);
            mark = tp_cuda_stats.convert_bytes;
            check_status(what,
                         bf16 ? tp_cuda_bf16_linear_backward_f32(&op[0], &op[1], &op[2], M, K, N, tw,
                                                                 with_dx ? gdx : NULL, with_dw ? gdw : NULL, gdb,
                                                                 stream())
                              : tp_cuda_linear_backward_f32(dy, x, w, M, K, N, tw, with_dx ? gdx : NULL,
                                                            with_dw ? gdw : NULL, gdb, stream()),
                         TP_KERNEL_OK);
            /* + 1: the poison past the end, and all of an output left out */
            compare(what, gdx, mix ? first_dx : wdx, M * K + 1, mix ? EXACT : tol);
            check_close(what, gdw, mix ? first_dw : wdw, K * N + 1, mix ? EXACT : tol);
            check_close(what, gdb, MIXES[mix] & 1 ? wdb16 : wdb, N, F32);
            if (bf16) check_converted(what, MIXES[mix], convert, &mark);
            first_dx = mix ? first_dx : gdx, first_dw = mix ? first_dw : gdw;
          }
        }
      }
  if (!bf16) return;
  /* refused: an operand of another dtype or size */
  int64_t n6 = 6;
  TpTensor f = tensor(TP_F32, 1, &n6, -1, 1), h = tensor(TP_F16, 1, &n6, -1, 1);
  float *y = poison(9);
  check_status("bf16 Linear on an f16 operand", tp_cuda_bf16_linear_f32(&h, &f, NULL, 3, 2, 3, false, y, stream()),
               TP_KERNEL_BAD_DTYPE);
  check_status("bf16 Linear, w of 6 elements for [2,4]",
               tp_cuda_bf16_linear_f32(&f, &f, NULL, 3, 2, 4, false, y, stream()), TP_KERNEL_BAD_SHAPE);
}
/* ---- Gelu epilogues (LINEAR_GELU, LINEAR_BACKWARD_DGELU: what codegen/lower.c fuses) ----
 * Against the unfused calls they replace, Linear then Gelu (tanh) and LinearBackward then
 * GeluBackward, on the same operands: in emulation the same bits (the epilogue runs the
 * Gelu kernels' element functions), on a GPU within F32 (cuBLASLt's own Gelu); and one
 * launch fewer where cuBLASLt takes the Gelu's operand (its row length a multiple of 8),
 * the same launches where it does not (the Gelu then runs as a kernel after the product).
 * f32 operands, and bf16 views (the backward's pre f32 and bf16: a bf16 pre is widened
 * first, one launch). The CPU kernels are checked against the unfused CPU ones, to the bit. */
#ifdef TOKPIPE_CUDA_TESTS_ON_GPU
static const Tolerance EPILOGUE = {1e-5, 1e-5};
#else
static const Tolerance EPILOGUE = {0, 0};
#endif

static uint64_t launches_since(uint64_t *mark) {
  uint64_t n = tp_cuda_stats.launches - *mark;
  *mark = tp_cuda_stats.launches;
  return n;
}

static void expect_saved(const char *what, uint64_t unfused, uint64_t fused, uint64_t saved) {
  if (tp_cuda_stats_on && fused + saved != unfused)
    fail("%s: %llu launches fused, %llu unfused, want %llu fewer", what, (unsigned long long)fused,
         (unsigned long long)unfused, (unsigned long long)saved);
}

static void gelu_epilogue_test(bool backward) {
  const int64_t shapes[][3] = {{5, 7, 9}, {6, 16, 24}, {67, 24, 40}, {3, 0, 8}};
  for (int s = 0; s < 4; s++)
    for (int variant = 0; variant < 8; variant++) {
      int64_t M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
      bool tw = variant & 1, with_bias = variant & 2, bf16 = variant & 4;
      float *x = floats(M * K + 1, 2), *w = floats(K * N + 1, 2), *bias = with_bias ? floats(N, 1) : NULL;
      float *dy = floats(M * N + 1, 1), *pre_in = floats(M * K + 1, 3);
      char what[112];
      snprintf(what, sizeof what, "%s%s [%lld,%lld,%lld] transpose_w %d bias %d", bf16 ? "bf16 " : "",
               backward ? "LinearBackward+DGELU" : "Linear+GELU", (long long)M, (long long)K, (long long)N, tw,
               with_bias);
      TpTensor vx = flat(x, M * K), vw = flat(w, K * N), vdy = flat(dy, M * N);
      uint64_t mark = tp_cuda_stats.launches, unfused, fused;
      if (!backward) {
        float *pre_u = poison(M * N + 1), *y_u = poison(M * N + 1), *pre = poison(M * N + 1), *y = poison(M * N + 1);
        TpTensor from = flat(pre_u, M * N), to = flat(y_u, M * N);
        check_status(what,
                     bf16 ? tp_cuda_bf16_linear_f32(&vx, &vw, bias, M, K, N, tw, pre_u, stream())
                          : tp_cuda_linear_f32(x, w, bias, M, K, N, tw, pre_u, stream()),
                     TP_KERNEL_OK);
        check_status(what, tp_cuda_unary(TP_UNARY_GELU_TANH, &from, &to, stream()), TP_KERNEL_OK);
        unfused = launches_since(&mark);
        check_status(what,
                     bf16 ? tp_cuda_bf16_linear_gelu_f32(&vx, &vw, bias, M, K, N, tw, pre, y, stream())
                          : tp_cuda_linear_gelu_f32(x, w, bias, M, K, N, tw, pre, y, stream()),
                     TP_KERNEL_OK);
        fused = launches_since(&mark);
        compare(what, pre, pre_u, M * N + 1, EPILOGUE);
        check_close(what, y, y_u, M * N + 1, EPILOGUE);
        expect_saved(what, unfused, fused, N % 8 == 0 && K > 0 && M > 0);
        if (!bf16) { /* the CPU kernel: the unfused CPU calls' bits */
          float *cpu_pre = poison(M * N + 1), *cpu_y = poison(M * N + 1), *want = poison(M * N + 1);
          tp_linear_gelu_f32(x, w, bias, M, K, N, tw, cpu_pre, cpu_y);
          tp_linear_f32(x, w, bias, M, K, N, tw, want);
          TpTensor wf = flat(want, M * N);
          tp_unary(TP_UNARY_GELU_TANH, &wf, &wf);
          check_close("CPU Linear+GELU", cpu_y, want, M * N + 1, EXACT);
        }
        continue;
      }
      for (int pre_bf16 = 0; pre_bf16 < (bf16 ? 2 : 1); pre_bf16++) {
        float *pre = pre_bf16 ? operand(pre_in, M * K, true) : pre_in; /* the values a bf16 pre holds */
        TpTensor vpre = flat(pre, M * K), pre_view = pre_bf16 ? bf16_copy(&vpre) : vpre;
        float *dx_u = poison(M * K + 1), *dw_u = poison(K * N + 1), *db_u = poison(N + 1);
        float *dx = poison(M * K + 1), *dw = poison(K * N + 1), *db = poison(N + 1);
        float *dbias_u = with_bias ? db_u : NULL, *dbias = with_bias ? db : NULL;
        check_status(what,
                     bf16 ? tp_cuda_bf16_linear_backward_f32(&vdy, &vx, &vw, M, K, N, tw, dx_u, dw_u, dbias_u,
                                                             stream())
                          : tp_cuda_linear_backward_f32(dy, x, w, M, K, N, tw, dx_u, dw_u, dbias_u, stream()),
                     TP_KERNEL_OK);
        check_status(what, tp_cuda_gelu_backward_f32(dx_u, pre, M * K, true, dx_u, stream()), TP_KERNEL_OK);
        unfused = launches_since(&mark);
        check_status(what,
                     bf16 ? tp_cuda_bf16_linear_backward_dgelu_f32(&vdy, &vx, &vw, &pre_view, M, K, N, tw, dx, dw,
                                                                   dbias, stream())
                          : tp_cuda_linear_backward_dgelu_f32(dy, x, w, pre, M, K, N, tw, dx, dw, dbias, stream()),
                     TP_KERNEL_OK);
        fused = launches_since(&mark);
        compare(what, dx, dx_u, M * K + 1, EPILOGUE);
        check_close(what, dw, dw_u, K * N + 1, EPILOGUE);
        check_close(what, db, db_u, N + 1, EXACT);
        /* a bf16 pre costs the launch that widens it */
        expect_saved(what, unfused + (pre_bf16 && M * K > 0), fused, K % 8 == 0 && N > 0 && M * K > 0);
        if (!bf16) {
          float *cpu_dx = poison(M * K + 1), *cpu_dw = poison(K * N + 1), *want = poison(M * K + 1);
          tp_linear_backward_dgelu_f32(dy, x, w, pre, M, K, N, tw, cpu_dx, cpu_dw, NULL);
          tp_linear_backward_f32(dy, x, w, M, K, N, tw, want, NULL, NULL);
          tp_gelu_backward_f32(want, pre, M * K, true, want);
          check_close("CPU LinearBackward+DGELU", cpu_dx, want, M * K + 1, EXACT);
        }
      }
    }
}
static void gelu_epilogue_fwd(void) { gelu_epilogue_test(false); }
static void gelu_epilogue_bwd(void) { gelu_epilogue_test(true); }

static void linear_fwd(void) { linear_test(false, false); }
static void linear_bwd(void) { linear_test(true, false); }
static void bf16_linear_fwd(void) { linear_test(false, true); }
static void bf16_linear_bwd(void) { linear_test(true, true); }

typedef struct {
  int ra, rb;
  int64_t a[4], b[4];
} MatmulCase;

static const MatmulCase MATMULS[] = {
    {3, 2, {2, 5, 37}, {37, 3}},      /* one shared b */
    {3, 3, {2, 5, 4}, {1, 4, 3}},     /* b broadcast */
    {4, 3, {2, 1, 3, 4}, {3, 4, 5}},  /* both broadcast */
    {1, 3, {4}, {2, 4, 3}},           /* a vector */
    {2, 2, {3, 0}, {0, 2}},           /* K = 0 */
    {3, 3, {1, 70, 9}, {3, 9, 130}},  /* a broadcast, odd sizes */
    {3, 3, {4, 33, 65}, {4, 65, 17}}, /* equal batches, odd sizes */
};

static void matmul_test(bool backward, bool bf16) {
  for (size_t c = 0; c < sizeof MATMULS / sizeof *MATMULS; c++) {
    const MatmulCase *m = &MATMULS[c];
    TpTensor a = tensor(TP_F32, m->ra, m->a, -2, 2), b = tensor(TP_F32, m->rb, m->b, -2, 2);
    TpTensor ar = a, br = b;
    ar.data = operand(a.data, tp_tensor_numel(&a), bf16), br.data = operand(b.data, tp_tensor_numel(&b), bf16);
    TpMatmulLayout l;
    tp_matmul_layout(&a, &b, &l);
    int64_t yd[2] = {l.nbatch * l.M, l.N};
    char what[64];
    snprintf(what, sizeof what, "%sMatMul%s case %zu", bf16 ? "bf16 " : "", backward ? "Backward" : "", c);
    Tolerance tol = bf16 ? BF16 : F32;
    uint64_t mark = tp_cuda_stats.convert_bytes, convert;
    TpTensor op[MAX_OPERANDS];
    if (!backward) {
      TpTensor w = result(TP_F32, 2, yd), first = w;
      const TpTensor views[2] = {a, b};
      const bool wanted[2] = {true, true};
      check_status(what, tp_matmul(&ar, &br, &w), TP_KERNEL_OK);
      for (int mix = 0; mix < (bf16 ? NMIXES : 1); mix++) {
        TpTensor g = result(TP_F32, 2, yd);
        mix_operands(MIXES[mix], 2, views, wanted, op, &convert);
        mark = tp_cuda_stats.convert_bytes;
        check_status(what, (bf16 ? tp_cuda_bf16_matmul : tp_cuda_matmul)(&op[0], &op[1], &g, stream()),
                     TP_KERNEL_OK);
        sync_expect(what, -1);
        check_tensor(what, &g, mix ? &first : &w, mix ? EXACT : tol);
        if (bf16) check_converted(what, MIXES[mix], convert, &mark);
        first = mix ? first : g;
      }
    } else {
      TpTensor dy = tensor(TP_F32, 2, yd, -1, 1), dyr = dy;
      dyr.data = operand(dy.data, tp_tensor_numel(&dy), bf16);
      const TpTensor views[3] = {dy, a, b};
      for (int outputs = 0; outputs < 3; outputs++) { /* da and db, da alone, db alone */
        TpTensor wda = result_like(&a), wdb = result_like(&b), first_da = wda, first_db = wdb;
        bool with_da = outputs != 2, with_db = outputs != 1;
        const bool wanted[3] = {true, with_db, with_da};
        check_status(what, tp_matmul_backward_f32(&dyr, &ar, &br, with_da ? &wda : NULL, with_db ? &wdb : NULL),
                     TP_KERNEL_OK);
        for (int mix = 0; mix < (bf16 ? NMIXES : 1); mix++) {
          TpTensor gda = result_like(&a), gdb = result_like(&b);
          mix_operands(MIXES[mix], 3, views, wanted, op, &convert);
          mark = tp_cuda_stats.convert_bytes;
          check_status(what,
                       (bf16 ? tp_cuda_bf16_matmul_backward_f32
                             : tp_cuda_matmul_backward_f32)(&op[0], &op[1], &op[2], with_da ? &gda : NULL,
                                                            with_db ? &gdb : NULL, stream()),
                       TP_KERNEL_OK);
          sync_expect(what, -1);
          /* an output left out: the poison of both, untouched */
          check_tensor(what, &gda, mix ? &first_da : &wda, mix ? EXACT : tol);
          check_tensor(what, &gdb, mix ? &first_db : &wdb, mix ? EXACT : tol);
          if (bf16) check_converted(what, MIXES[mix], convert, &mark);
          if (!mix) first_da = gda, first_db = gdb;
        }
      }
    }
  }
  int64_t d2[2] = {2, 3};
  TpTensor x = tensor(TP_F64, 2, d2, 0, 1), y = result(TP_F64, 2, d2), f = tensor(TP_F32, 2, d2, 0, 1);
  TpTensor fy = result(TP_F32, 2, d2), h = bf16_copy(&f);
  check_status("MatMul on f64 (the CPU's, not here)", tp_cuda_matmul(&x, &x, &y, stream()), TP_KERNEL_BAD_DTYPE);
  check_status("MatMul [2,3] [2,3]", tp_cuda_matmul(&f, &f, &fy, stream()), tp_matmul(&f, &f, &fy));
  check_status("MatMulBackward [2,3] [2,3]", tp_cuda_matmul_backward_f32(&fy, &f, &f, NULL, NULL, stream()),
               tp_matmul_backward_f32(&fy, &f, &f, NULL, NULL));
  check_status("MatMul on bf16 (a bf16 product's operand only)", tp_cuda_matmul(&h, &f, &fy, stream()),
               TP_KERNEL_BAD_DTYPE);
  check_status("bf16 MatMul on f64", tp_cuda_bf16_matmul(&x, &f, &fy, stream()), TP_KERNEL_BAD_DTYPE);
  check_status("bf16 MatMul [2,3] [2,3]", tp_cuda_bf16_matmul(&h, &h, &fy, stream()), TP_KERNEL_BAD_SHAPE);
  check_status("bf16 MatMulBackward [2,3] [2,3]",
               tp_cuda_bf16_matmul_backward_f32(&fy, &h, &h, NULL, NULL, stream()), TP_KERNEL_BAD_SHAPE);
}
static void matmul_fwd(void) { matmul_test(false, false); }
static void matmul_bwd(void) { matmul_test(true, false); }
static void bf16_matmul_fwd(void) { matmul_test(false, true); }
static void bf16_matmul_bwd(void) { matmul_test(true, true); }

static void gemm_test(bool bf16) {
  const int64_t M = 5, K = 37, N = 3;
  const int64_t c_shapes[][2] = {{M, N}, {1, N}, {M, 1}};
  for (int t = 0; t < 4; t++)
    for (int cs = 0; cs < 4; cs++) {
      bool ta = t & 1, tb = t & 2;
      int64_t ad[2] = {ta ? K : M, ta ? M : K}, bd[2] = {tb ? N : K, tb ? K : N}, yd[2] = {M, N};
      TpTensor a = tensor(TP_F32, 2, ad, -2, 2), b = tensor(TP_F32, 2, bd, -2, 2), ar = a, br = b;
      ar.data = operand(a.data, M * K, bf16), br.data = operand(b.data, K * N, bf16);
      TpTensor c = tensor(TP_F32, 2, cs < 3 ? c_shapes[cs] : yd, -1, 1);
      TpTensor w = result(TP_F32, 2, yd), first = w;
      const TpTensor *cp = cs < 3 ? &c : NULL;
      const TpTensor views[2] = {a, b};
      const bool wanted[2] = {true, true};
      char what[64];
      snprintf(what, sizeof what, "%sGemm trans %d, c case %d", bf16 ? "bf16 " : "", t, cs);
      check_status(what, tp_gemm(&ar, &br, cp, ta, tb, 0.5, 2, &w), TP_KERNEL_OK);
      for (int mix = 0; mix < (bf16 ? NMIXES : 1); mix++) {
        TpTensor g = result(TP_F32, 2, yd), op[MAX_OPERANDS];
        uint64_t convert, mark;
        mix_operands(MIXES[mix], 2, views, wanted, op, &convert);
        mark = tp_cuda_stats.convert_bytes;
        check_status(what,
                     (bf16 ? tp_cuda_bf16_gemm : tp_cuda_gemm)(&op[0], &op[1], cp, ta, tb, 0.5, 2, &g, stream()),
                     TP_KERNEL_OK);
        sync_expect(what, -1);
        check_tensor(what, &g, mix ? &first : &w, mix ? EXACT : bf16 ? BF16 : F32);
        if (bf16) check_converted(what, MIXES[mix], convert, &mark);
        first = mix ? first : g;
      }
    }
  int64_t d2[2] = {2, 3}, d3[2] = {3, 3};
  TpTensor x = tensor(TP_F32, 2, d2, 0, 1), y = result(TP_F32, 2, d3), i = tensor(TP_I32, 2, d2, 0, 1);
  check_status("Gemm [2,3] [2,3]", tp_cuda_gemm(&x, &x, NULL, false, false, 1, 0, &y, stream()),
               tp_gemm(&x, &x, NULL, false, false, 1, 0, &y));
  check_status("Gemm on i32 (the CPU's, not here)", tp_cuda_gemm(&i, &i, NULL, true, false, 1, 0, &y, stream()),
               TP_KERNEL_BAD_DTYPE);
  check_status("bf16 Gemm on i32", tp_cuda_bf16_gemm(&i, &x, NULL, true, false, 1, 0, &y, stream()),
               TP_KERNEL_BAD_DTYPE);
}
static void gemm_fwd(void) { gemm_test(false); }
static void bf16_gemm_fwd(void) { gemm_test(true); }

static const CudaTest TESTS[] = {
    {"ops_unary_fwd", unary_fwd},
    {"ops_binary_fwd", binary_fwd},
    {"ops_where_fwd", where_fwd},
    {"ops_cast_fwd", cast_fwd},
    {"ops_reshape_expand_tile", reshape_expand_tile},
    {"ops_transpose_fwd", transpose_fwd},
    {"ops_slice_fwd", slice_fwd},
    {"ops_slice_bwd", slice_bwd},
    {"ops_split_concat", split_concat},
    {"ops_context_append", context_append},
    {"ops_trilu_fwd", trilu_fwd},
    {"ops_gather_fwd", gather_fwd},
    {"ops_gather_bwd", gather_bwd},
    {"ops_gather_elements_fwd", gather_elements_fwd},
    {"ops_gather_elements_bwd", gather_elements_bwd},
    {"ops_cumsum_fwd", cumsum_fwd},
    {"ops_topk_fwd", topk_fwd},
    {"ops_reduce_sum_fwd", reduce_sum_fwd},
    {"ops_reduce_sum_rows", reduce_sum_rows},
    {"ops_softmax_fwd", softmax_fwd},
    {"ops_softmax_bwd", softmax_bwd},
    {"ops_layernorm_fwd", layernorm_fwd},
    {"ops_layernorm_bwd", layernorm_bwd},
    {"ops_rmsnorm_fwd", rmsnorm_fwd},
    {"ops_rmsnorm_bwd", rmsnorm_bwd},
    {"ops_rotary_fwd", rotary_fwd},
    {"ops_rotary_bwd", rotary_bwd},
    {"ops_swiglu_gelu", swiglu_gelu},
    {"ops_embedding_fwd", embedding_fwd},
    {"ops_cross_entropy_fwd", cross_entropy_fwd},
    {"ops_cross_entropy_bwd", cross_entropy_bwd},
    {"ops_nll_loss_fwd", nll_loss_fwd},
    {"ops_softmax_cross_entropy_fwd", softmax_cross_entropy_fwd},
    {"ops_copy_to_host", copy_to_host},
    {"ops_linear_fwd", linear_fwd},
    {"ops_linear_bwd", linear_bwd},
    {"ops_gelu_epilogue_fwd", gelu_epilogue_fwd},
    {"ops_gelu_epilogue_bwd", gelu_epilogue_bwd},
    {"ops_matmul_fwd", matmul_fwd},
    {"ops_matmul_bwd", matmul_bwd},
    {"ops_gemm_fwd", gemm_fwd},
    {"ops_bf16_linear_fwd", bf16_linear_fwd},
    {"ops_bf16_linear_bwd", bf16_linear_bwd},
    {"ops_bf16_matmul_fwd", bf16_matmul_fwd},
    {"ops_bf16_matmul_bwd", bf16_matmul_bwd},
    {"ops_bf16_gemm_fwd", bf16_gemm_fwd},
};

int main(int argc, char **argv) {
  atexit(free_buffers);
  return run_named_test("test_cuda_ops", TESTS, sizeof TESTS / sizeof *TESTS, argc, argv);
}
