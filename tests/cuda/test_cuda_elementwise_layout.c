/* The elementwise, reduction, rotary and layout kernels of runtime/cuda (rotary.cu,
 * elementwise.cu, reduce.cu; Reshape, Expand, Transpose, Slice and its backward, Split,
 * Concat, the K/V context append at nonzero offsets) on the CPU through the emulation of the
 * CUDA execution model, each against the CPU kernel it implements, at awkward shapes: ranks
 * 1 to 6, 1-sized and broadcast dims, odd lengths and
 * lengths past the block size (256), partial rotary dims, tables of lower rank. One ctest
 * per kernel and direction: `test_cuda_elementwise_layout NAME`.
 *
 * Tolerances, |gpu - cpu| <= atol + rtol * |cpu| per element:
 *   EXACT (0, 0): copies (the layout ops) and single IEEE operations (Neg, Reciprocal, Sqrt, Relu, Add, Sub,
 *     Mul, Div, Max, Min, Where).
 *   Bit for bit (check_bits): ReduceSum, the same additions in double in the same runs of 64
 *     and order, one rounding to float.
 *   ROTARY (1e-6, 0): x_a c - x_b s in two products and a sum; the CPU kernel's AVX2 clone
 *     may contract one product into an FMA, which changes the result by at most an ulp of
 *     the products (|x| <= 2, |c|, |s| <= 1: 2.4e-7), however much the sum cancels.
 *   LIBM (1e-6, 1e-5): Exp, Log, Erf, Tanh, Sin, Cos, Sigmoid, Pow, Gelu: the same float
 *     formula over CUDA's functions (within 2 ulp) against the CPU's libm or vecmath.h. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "cpu/elementwise.h"
#include "cpu/layout.h"
#include "cpu/layout_backward.h"
#include "cpu/reduce.h"
#include "cpu/transformer.h"
#include "cuda/kernels.h"
#include "cuda/ops.h"
#include "compare.h"

static const Tolerance EXACT = {0, 0}, ROTARY = {1e-6, 0}, LIBM = {1e-6, 1e-5};

/* Filled with a value no kernel computes here, so that an element left unwritten differs. */
static float *poisoned(int64_t n) {
  float *a = test_alloc((size_t)(n ? n : 1) * sizeof *a);
  for (int64_t i = 0; i < n; i++) a[i] = 12345.0f;
  return a;
}

static TpTensor view(TpDType t, int rank, const int64_t *dims, void *data) {
  TpTensor v = {.dtype = t, .rank = rank, .data = data};
  memcpy(v.dims, dims, (size_t)rank * sizeof *dims);
  return v;
}

static void dims_text(char *out, size_t size, int rank, const int64_t *dims) {
  int at = snprintf(out, size, "[");
  for (int d = 0; d < rank && at < (int)size; d++)
    at += snprintf(out + at, size - at, d ? ",%lld" : "%lld", (long long)dims[d]);
  if (at < (int)size) snprintf(out + at, size - at, "]");
}

/* ---- rotary ---- */
typedef struct {
  int rank;
  int64_t dims[6], table_dims[6], rotary_dim;
} RotaryCase;

static const RotaryCase ROTARY_CASES[] = {
    {4, {2, 3, 5, 8}, {1, 1, 5, 8}, 8},        /* (B, H, T, D) tables (1, 1, T, D) */
    {4, {2, 3, 5, 10}, {1, 1, 5, 4}, 4},       /* partial: 6 features copied */
    {3, {2, 7, 6}, {2, 7, 6}, 6},              /* tables as large as x */
    {3, {3, 7, 12}, {3, 1, 8}, 8},             /* broadcast in the middle */
    {2, {5, 6}, {5, 6}, 6},                    /* (T, D) */
    {1, {9}, {6}, 6},                          /* one row */
    {4, {1, 3, 300, 65}, {1, 1, 300, 32}, 32}, /* past the block size, odd D */
    {5, {2, 1, 3, 4, 18}, {1, 1, 1, 4, 2}, 2}, /* one pair per row */
};

static void rotary_test(bool backward) {
  for (size_t c = 0; c < sizeof ROTARY_CASES / sizeof *ROTARY_CASES; c++) {
    const RotaryCase *rc = &ROTARY_CASES[c];
    int64_t n = 1, nt = 1;
    for (int d = 0; d < rc->rank; d++) n *= rc->dims[d], nt *= rc->table_dims[d];
    for (int interleaved = 0; interleaved < 2; interleaved++) {
      float *x = test_rand(n, 2), *cs = test_rand(nt, 1), *sn = test_rand(nt, 1);
      float *got = poisoned(n), *want = poisoned(n);
      if (backward) {
        tp_rotary_backward_f32(x, cs, sn, rc->rank, rc->dims, rc->table_dims, rc->rotary_dim, interleaved, want);
        if (tp_cuda_rotary_backward_f32(x, cs, sn, rc->rank, rc->dims, rc->table_dims, rc->rotary_dim, interleaved,
                                        got, stream()) != TP_KERNEL_OK)
          fail("tp_cuda_rotary_backward_f32");
      } else {
        tp_rotary_f32(x, cs, sn, rc->rank, rc->dims, rc->table_dims, rc->rotary_dim, interleaved, want);
        if (tp_cuda_rotary_f32(x, cs, sn, rc->rank, rc->dims, rc->table_dims, rc->rotary_dim, interleaved, got,
                               stream()) != TP_KERNEL_OK)
          fail("tp_cuda_rotary_f32");
      }
      char shape[64], what[160];
      dims_text(shape, sizeof shape, rc->rank, rc->dims);
      snprintf(what, sizeof what, "x %s rotary_dim %lld interleaved=%d", shape, (long long)rc->rotary_dim,
               interleaved);
      check_close(what, got, want, n, ROTARY);
      test_free(x), test_free(cs), test_free(sn), test_free(got), test_free(want);
    }
  }
}

static void rotary_fwd(void) { rotary_test(false); }
static void rotary_bwd(void) { rotary_test(true); }

/* ---- unary ---- */
static const int64_t LENGTHS[] = {1, 31, 33, 255, 256, 257, 1000, 4099};

static void unary_test(TpUnaryOp op, const char *name, float lo, float hi, Tolerance tol) {
  for (size_t l = 0; l < sizeof LENGTHS / sizeof *LENGTHS; l++) {
    int64_t n = LENGTHS[l];
    float *x = test_rand(n, 1), *got = poisoned(n), *want = poisoned(n);
    for (int64_t i = 0; i < n; i++) x[i] = lo + (x[i] + 1) / 2 * (hi - lo);
    if (n > 3) x[1] = 0, x[2] = -0.0f, x[3] = NAN; /* signed zeros and NaN as the CPU treats them */
    TpTensor xt = view(TP_F32, 1, &n, x), yt = view(TP_F32, 1, &n, want);
    if (tp_unary(op, &xt, &yt) != TP_KERNEL_OK) fail("%s: the CPU kernel refused it", name);
    if (!tp_cuda_launch_unary_f32(op, x, n, got, NULL)) fail("%s: the CUDA launcher refused it", name);
    char what[64];
    snprintf(what, sizeof what, "%s n=%lld", name, (long long)n);
    check_close(what, got, want, n, tol);
    test_free(x), test_free(got), test_free(want);
  }
}

static void unary_fwd(void) {
  unary_test(TP_UNARY_SQRT, "Sqrt", 0, 9, EXACT);
  unary_test(TP_UNARY_NEG, "Neg", -5, 5, EXACT);
  unary_test(TP_UNARY_RECIPROCAL, "Reciprocal", -5, 5, EXACT);
  unary_test(TP_UNARY_RELU, "Relu", -5, 5, EXACT);
  unary_test(TP_UNARY_EXP, "Exp", -20, 20, LIBM);
  unary_test(TP_UNARY_LOG, "Log", 1e-3f, 50, LIBM);
  unary_test(TP_UNARY_ERF, "Erf", -4, 4, LIBM);
  unary_test(TP_UNARY_TANH, "Tanh", -6, 6, LIBM);
  unary_test(TP_UNARY_SIN, "Sin", -10, 10, LIBM);
  unary_test(TP_UNARY_COS, "Cos", -10, 10, LIBM);
  unary_test(TP_UNARY_SIGMOID, "Sigmoid", -30, 30, LIBM);
  unary_test(TP_UNARY_GELU, "Gelu", -6, 6, LIBM);
  unary_test(TP_UNARY_GELU_TANH, "GeluTanh", -6, 6, LIBM);
  float x = 1, y = 0;
  if (tp_cuda_launch_unary_f32(TP_UNARY_NOT, &x, 1, &y, NULL)) fail("Not (bool only) was not refused");
}

/* ---- broadcasting: binary, Where ---- */
typedef struct {
  int ra, rb;
  int64_t a[6], b[6];
} BroadcastCase;

static const BroadcastCase BROADCAST_CASES[] = {
    {1, 1, {5}, {5}},
    {2, 2, {3, 1}, {1, 4}},
    {3, 1, {2, 1, 3}, {3}},
    {6, 6, {2, 1, 3, 1, 5, 1}, {1, 4, 1, 2, 1, 3}},
    {1, 3, {1}, {7, 33, 9}},
    {1, 2, {300}, {3, 300}},
    {4, 4, {2, 3, 4, 5}, {2, 3, 4, 5}},
    {0, 2, {0}, {3, 1}}, /* a scalar */
    {5, 2, {2, 1, 1, 3, 259}, {1, 259}},
};
enum { NBROADCAST = sizeof BROADCAST_CASES / sizeof *BROADCAST_CASES };

/* numpy's result shape of a and b (which do broadcast here) */
static int broadcast_dims(const BroadcastCase *bc, int64_t *out) {
  int r = bc->ra > bc->rb ? bc->ra : bc->rb;
  for (int d = 0; d < r; d++) {
    int da = d - (r - bc->ra), db = d - (r - bc->rb);
    int64_t x = da >= 0 ? bc->a[da] : 1, y = db >= 0 ? bc->b[db] : 1;
    out[d] = x == 1 ? y : x;
  }
  return r;
}

static int64_t numel(int rank, const int64_t *dims) {
  int64_t n = 1;
  for (int d = 0; d < rank; d++) n *= dims[d];
  return n;
}

static void binary_test(TpBinaryOp op, const char *name, Tolerance tol) {
  for (int c = 0; c < NBROADCAST; c++) {
    const BroadcastCase *bc = &BROADCAST_CASES[c];
    int64_t yd[6];
    int ry = broadcast_dims(bc, yd);
    int64_t na = numel(bc->ra, bc->a), nb = numel(bc->rb, bc->b), ny = numel(ry, yd);
    float *a = test_rand(na, 3), *b = test_rand(nb, 3), *got = poisoned(ny), *want = poisoned(ny);
    if (op == TP_BINARY_POW)
      for (int64_t i = 0; i < na; i++) a[i] = fabsf(a[i]) + 0.1f; /* a real power */
    if (na > 2) a[2] = NAN;                                       /* Max and Min propagate it */
    TpTensor at = view(TP_F32, bc->ra, bc->a, a), bt = view(TP_F32, bc->rb, bc->b, b);
    TpTensor wt = view(TP_F32, ry, yd, want), gt = view(TP_F32, ry, yd, got);
    if (tp_binary(op, &at, &bt, &wt) != TP_KERNEL_OK) fail("%s case %d: the CPU kernel refused it", name, c);
    TpIter it;
    const TpTensor *ops[] = {&gt, &at, &bt};
    if (!tp_iter_broadcast(&it, 3, ops)) fail("%s case %d: no broadcast", name, c);
    if (c % 2) tp_iter_coalesce(&it); /* both the raw and the merged dims */
    if (!tp_cuda_launch_binary_f32(op, &it, a, b, got, NULL)) fail("%s: the CUDA launcher refused it", name);
    char sa[48], sb[48], what[160];
    dims_text(sa, sizeof sa, bc->ra, bc->a), dims_text(sb, sizeof sb, bc->rb, bc->b);
    snprintf(what, sizeof what, "%s %s %s", name, sa, sb);
    check_close(what, got, want, ny, tol);
    test_free(a), test_free(b), test_free(got), test_free(want);
  }
}

static void binary_fwd(void) {
  binary_test(TP_BINARY_ADD, "Add", EXACT);
  binary_test(TP_BINARY_SUB, "Sub", EXACT);
  binary_test(TP_BINARY_MUL, "Mul", EXACT);
  binary_test(TP_BINARY_DIV, "Div", EXACT);
  binary_test(TP_BINARY_MAX, "Max", EXACT);
  binary_test(TP_BINARY_MIN, "Min", EXACT);
  binary_test(TP_BINARY_POW, "Pow", LIBM);
  TpIter it = {0};
  float v = 0;
  if (tp_cuda_launch_binary_f32(TP_BINARY_LESS, &it, &v, &v, &v, NULL)) fail("Less (a bool result) was not refused");
}

static void where_fwd(void) {
  for (int c = 0; c < NBROADCAST; c++) {
    const BroadcastCase *bc = &BROADCAST_CASES[c];
    int64_t yd[6];
    int ry = broadcast_dims(bc, yd);
    /* cond shaped as a, a shaped as b, b as the result: three ways of broadcasting */
    int64_t nc = numel(bc->ra, bc->a), na = numel(bc->rb, bc->b), ny = numel(ry, yd);
    bool *cond = test_alloc((size_t)nc);
    for (int64_t i = 0; i < nc; i++) cond[i] = frand() > 0;
    float *a = test_rand(na, 3), *b = test_rand(ny, 3), *got = poisoned(ny), *want = poisoned(ny);
    TpTensor ct = view(TP_BOOL, bc->ra, bc->a, cond), at = view(TP_F32, bc->rb, bc->b, a);
    TpTensor bt = view(TP_F32, ry, yd, b), wt = view(TP_F32, ry, yd, want), gt = view(TP_F32, ry, yd, got);
    if (tp_where(&ct, &at, &bt, &wt) != TP_KERNEL_OK) fail("Where case %d: the CPU kernel refused it", c);
    TpIter it;
    const TpTensor *ops[] = {&gt, &ct, &at, &bt};
    if (!tp_iter_broadcast(&it, 4, ops)) fail("Where case %d: no broadcast", c);
    if (c % 2) tp_iter_coalesce(&it);
    tp_cuda_launch_where_f32(&it, cond, a, b, got, NULL);
    char what[64];
    snprintf(what, sizeof what, "Where case %d", c);
    check_close(what, got, want, ny, EXACT);
    test_free(cond), test_free(a), test_free(b), test_free(got), test_free(want);
  }
}

/* ---- ReduceSum ---- */
typedef struct {
  int rank;
  int64_t dims[6];
  int naxes;
  int64_t axes[6];
} ReduceCase;

static const ReduceCase REDUCE_CASES[] = {
    {1, {1000}, 1, {0}},
    {1, {7}, 0, {0}},      /* nothing reduced: a copy */
    {2, {3, 257}, 1, {0}}, /* a bias gradient */
    {2, {1, 3}, 1, {0}},   /* gradients over rows below, at and past a run of 64 */
    {2, {63, 33}, 1, {0}},
    {2, {64, 1}, 1, {0}},
    {2, {65, 300}, 1, {0}},
    {2, {200, 3}, 1, {0}},
    {3, {5, 3, 40}, 2, {0, 2}}, /* runs across lines of the reduced dims */
    {2, {300, 5}, 1, {1}},
    {3, {4, 1, 9}, 2, {0, 1}},    /* a 1-sized dim reduced */
    {4, {2, 3, 4, 5}, 2, {1, 3}}, /* reduced and kept dims interleaved */
    {6, {2, 1, 3, 2, 5, 3}, 3, {0, 2, 4}},
    {6, {2, 1, 3, 2, 5, 3}, 6, {0, 1, 2, 3, 4, 5}},
    {3, {2, 0, 3}, 1, {1}}, /* an empty reduction: 0, NaN for the mean */
};

static void reduce_test(bool mean) {
  for (size_t c = 0; c < sizeof REDUCE_CASES / sizeof *REDUCE_CASES; c++) {
    const ReduceCase *rc = &REDUCE_CASES[c];
    int64_t n = numel(rc->rank, rc->dims), nout = 1;
    for (int d = 0, a = 0; d < rc->rank; d++) {
      if (a < rc->naxes && rc->axes[a] == d) a++;
      else nout *= rc->dims[d];
    }
    float *x = test_rand(n, 3), *got = poisoned(nout), *want = poisoned(nout);
    TpTensor xt = view(TP_F32, rc->rank, rc->dims, x), yt = view(TP_F32, 1, &nout, want);
    if (tp_reduce_sum(&xt, rc->axes, rc->naxes, mean, &yt) != TP_KERNEL_OK)
      fail("case %zu: the CPU kernel refused it", c);
    void *scratch = test_alloc(tp_cuda_reduce_sum_scratch(&xt, rc->axes, rc->naxes));
    if (!tp_cuda_launch_reduce_sum_f32(&xt, rc->axes, rc->naxes, mean, got, scratch, NULL))
      fail("case %zu: the launcher refused it", c);
    char shape[64], what[128];
    dims_text(shape, sizeof shape, rc->rank, rc->dims);
    snprintf(what, sizeof what, "x %s naxes %d mean=%d", shape, rc->naxes, mean);
    check_bits(what, got, want, nout);
    test_free(x), test_free(got), test_free(want), test_free(scratch);
  }
  float x[6] = {0}, y = 0;
  int64_t dims[2] = {2, 3}, unsorted[2] = {1, 0};
  TpTensor xt = view(TP_F32, 2, dims, x);
  if (tp_cuda_launch_reduce_sum_f32(&xt, unsorted, 2, mean, &y, NULL, NULL)) fail("unsorted axes were not refused");
}

static void reduce_sum(void) { reduce_test(false); }
static void reduce_mean(void) { reduce_test(true); }

/* ---- layout ---- */
static void reshape_fwd(void) {
  for (size_t l = 0; l < sizeof LENGTHS / sizeof *LENGTHS; l++) {
    int64_t n = LENGTHS[l], dims2[2] = {1, n};
    float *x = test_rand(n, 1), *got = poisoned(n), *want = poisoned(n);
    TpTensor xt = view(TP_F32, 1, &n, x), yt = view(TP_F32, 2, dims2, want);
    if (tp_reshape(&xt, &yt) != TP_KERNEL_OK) fail("n=%lld: the CPU kernel refused it", (long long)n);
    tp_cuda_launch_copy_f32(x, n, got, NULL);
    char what[32];
    snprintf(what, sizeof what, "n=%lld", (long long)n);
    check_close(what, got, want, n, EXACT);
    test_free(x), test_free(got), test_free(want);
  }
}

static void expand_fwd(void) {
  for (int c = 0; c < NBROADCAST; c++) {
    const BroadcastCase *bc = &BROADCAST_CASES[c];
    int64_t yd[6];
    int ry = broadcast_dims(bc, yd);
    int64_t nx = numel(bc->ra, bc->a), ny = numel(ry, yd);
    float *x = test_rand(nx, 1), *got = poisoned(ny), *want = poisoned(ny);
    TpTensor xt = view(TP_F32, bc->ra, bc->a, x), wt = view(TP_F32, ry, yd, want), gt = view(TP_F32, ry, yd, got);
    if (tp_expand(&xt, &wt) != TP_KERNEL_OK) fail("case %d: the CPU kernel refused it", c);
    TpIter it;
    if (!tp_iter_broadcast(&it, 2, (const TpTensor *const[]){&gt, &xt})) fail("case %d: no broadcast", c);
    if (c % 2) tp_iter_coalesce(&it);
    tp_cuda_launch_strided_copy_f32(&it, x, got, NULL);
    char what[32];
    snprintf(what, sizeof what, "Expand case %d", c);
    check_close(what, got, want, ny, EXACT);
    test_free(x), test_free(got), test_free(want);
  }
}

typedef struct {
  int rank;
  int64_t dims[6], perm[6];
} TransposeCase;

static const TransposeCase TRANSPOSE_CASES[] = {
    {1, {7}, {0}},
    {2, {3, 257}, {1, 0}},
    {3, {2, 1, 5}, {2, 0, 1}},
    {4, {2, 3, 4, 5}, {0, 2, 1, 3}}, /* heads to the front and back */
    {5, {2, 3, 1, 4, 3}, {4, 3, 2, 1, 0}},
    {6, {2, 1, 3, 2, 5, 3}, {5, 0, 4, 1, 3, 2}},
};

static void transpose_fwd(void) {
  for (size_t c = 0; c < sizeof TRANSPOSE_CASES / sizeof *TRANSPOSE_CASES; c++) {
    const TransposeCase *tc = &TRANSPOSE_CASES[c];
    int64_t yd[6], n = numel(tc->rank, tc->dims);
    for (int d = 0; d < tc->rank; d++) yd[d] = tc->dims[tc->perm[d]];
    float *x = test_rand(n, 1), *got = poisoned(n), *want = poisoned(n);
    TpTensor xt = view(TP_F32, tc->rank, tc->dims, x), wt = view(TP_F32, tc->rank, yd, want);
    TpTensor gt = view(TP_F32, tc->rank, yd, got);
    if (tp_transpose(&xt, tc->perm, &wt) != TP_KERNEL_OK) fail("case %zu: the CPU kernel refused it", c);
    if (!tp_cuda_launch_transpose_f32(&xt, tc->perm, &gt, NULL)) fail("case %zu: the launcher refused it", c);
    char shape[64], what[96];
    dims_text(shape, sizeof shape, tc->rank, tc->dims);
    snprintf(what, sizeof what, "Transpose x %s", shape);
    check_close(what, got, want, n, EXACT);
    test_free(x), test_free(got), test_free(want);
  }
  float x[6] = {0}, y[6];
  int64_t dims[2] = {2, 3}, twice[2] = {0, 0};
  TpTensor xt = view(TP_F32, 2, dims, x), yt = view(TP_F32, 2, dims, y);
  if (tp_cuda_launch_transpose_f32(&xt, twice, &yt, NULL)) fail("a perm naming one dim twice was not refused");
}

typedef struct {
  int rank;
  int64_t x[4], starts[4], steps[4], y[4];
} SliceCase;

static const SliceCase SLICE_CASES[] = {
    {1, {10}, {1}, {3}, {3}},       /* 1, 4, 7 */
    {1, {300}, {299}, {-1}, {300}}, /* reversed, past the block size */
    {2, {5, 7}, {4, 1}, {-2, 2}, {3, 3}},
    {3, {2, 5, 9}, {1, 0, 8}, {1, 1, -3}, {1, 5, 3}},
    {4, {2, 3, 4, 6}, {0, 2, 1, 5}, {1, -1, 2, -5}, {2, 3, 2, 2}},
    {2, {4, 3}, {5, 0}, {1, 1}, {0, 3}}, /* empty */
};

static void slice_test(bool backward) {
  for (size_t c = 0; c < sizeof SLICE_CASES / sizeof *SLICE_CASES; c++) {
    const SliceCase *sc = &SLICE_CASES[c];
    int64_t nx = numel(sc->rank, sc->x), ny = numel(sc->rank, sc->y), nout = backward ? nx : ny;
    float *in = test_rand(backward ? ny : nx, 1), *got = poisoned(nout), *want = poisoned(nout);
    TpTensor xt = view(TP_F32, sc->rank, sc->x, backward ? want : in),
             yt = view(TP_F32, sc->rank, sc->y, backward ? in : want);
    TpTensor gx = view(TP_F32, sc->rank, sc->x, got), gy = view(TP_F32, sc->rank, sc->y, got);
    TpKernelStatus st = backward ? tp_slice_backward(&yt, sc->starts, sc->steps, &xt)
                                 : tp_slice(&xt, sc->starts, sc->steps, &yt);
    if (st != TP_KERNEL_OK) fail("case %zu: the CPU kernel refused it", c);
    if (backward) tp_cuda_launch_slice_backward_f32(&yt, sc->starts, sc->steps, &gx, NULL);
    else tp_cuda_launch_slice_f32(&xt, sc->starts, sc->steps, &gy, NULL);
    char shape[64], what[96];
    dims_text(shape, sizeof shape, sc->rank, sc->x);
    snprintf(what, sizeof what, "Slice case %zu x %s", c, shape);
    check_close(what, got, want, nout, EXACT);
    test_free(in), test_free(got), test_free(want);
  }
}

static void slice_fwd(void) { slice_test(false); }
static void slice_bwd(void) { slice_test(true); }

/* pieces of x (rank 4, dims[axis] split 1, 3, 0, along - 4) */
static void pieces_test(bool concat) {
  static const int64_t X[4] = {3, 5, 7, 33};
  for (int axis = 0; axis < 4; axis++) {
    int64_t n = numel(4, X), along = X[axis], sizes[4] = {1, 3, 0, along - 4};
    if (along < 4) sizes[0] = along, sizes[1] = sizes[2] = sizes[3] = 0;
    float *x = test_rand(n, 1), *bufs[2][4];
    TpTensor pieces[2][4];
    for (int k = 0; k < 4; k++) {
      int64_t d[4];
      memcpy(d, X, sizeof d);
      d[axis] = sizes[k];
      for (int w = 0; w < 2; w++) {
        bufs[w][k] = concat ? test_rand(numel(4, d), 1) : poisoned(numel(4, d));
        if (concat && w) memcpy(bufs[1][k], bufs[0][k], (size_t)numel(4, d) * sizeof(float));
        pieces[w][k] = view(TP_F32, 4, d, bufs[w][k]);
      }
    }
    if (!concat) pieces[0][1].data = pieces[1][1].data = NULL; /* skipped */
    char what[64];
    if (concat) {
      float *got = poisoned(n), *want = poisoned(n);
      TpTensor wt = view(TP_F32, 4, X, want), gt = view(TP_F32, 4, X, got);
      if (tp_concat(pieces[0], 4, axis, &wt) != TP_KERNEL_OK) fail("axis %d: the CPU kernel refused it", axis);
      tp_cuda_launch_concat_f32(pieces[1], 4, axis, &gt, NULL);
      snprintf(what, sizeof what, "Concat axis %d", axis);
      check_close(what, got, want, n, EXACT);
      test_free(got), test_free(want);
    } else {
      TpTensor xt = view(TP_F32, 4, X, x);
      if (tp_split(&xt, axis, pieces[0], 4) != TP_KERNEL_OK) fail("axis %d: the CPU kernel refused it", axis);
      tp_cuda_launch_split_f32(&xt, axis, pieces[1], 4, NULL);
      for (int k = 0; k < 4; k++) {
        snprintf(what, sizeof what, "Split axis %d piece %d", axis, k);
        check_close(what, bufs[1][k], bufs[0][k], tp_tensor_numel(&pieces[0][k]), EXACT);
      }
    }
    for (int k = 0; k < 4; k++) test_free(bufs[0][k]), test_free(bufs[1][k]);
    test_free(x);
  }
}

static void concat_fwd(void) { pieces_test(true); }
static void split_fwd(void) { pieces_test(false); }

/* keys (B, H, T, D) of a token slice appended at rows [at, at + T) of a buffer of `rows` */
static void context_append(void) {
  static const int64_t CASES[][6] = {/* B, H, T, D, at, rows */
                                     {1, 1, 1, 1, 0, 1},
                                     {2, 3, 5, 8, 0, 16},
                                     {2, 3, 5, 8, 11, 16},
                                     {1, 4, 7, 33, 3, 10},
                                     {2, 1, 300, 3, 1, 301}};
  for (size_t c = 0; c < sizeof CASES / sizeof *CASES; c++) {
    const int64_t *p = CASES[c];
    int64_t dims[4] = {p[0], p[1], p[2], p[3]}, n = numel(4, dims), nbuf = p[0] * p[1] * p[5] * p[3];
    float *x = test_rand(n, 1), *got = poisoned(nbuf), *want = poisoned(nbuf);
    TpTensor xt = view(TP_F32, 4, dims, x);
    if (tp_context_append(&xt, 2, p[4], p[5], want) != TP_KERNEL_OK) fail("case %zu: the CPU kernel refused it", c);
    tp_cuda_launch_context_append_f32(&xt, 2, p[4], p[5], got, NULL);
    char what[64];
    snprintf(what, sizeof what, "T=%lld at %lld of %lld rows", (long long)p[2], (long long)p[4], (long long)p[5]);
    check_close(what, got, want, nbuf, EXACT); /* the rows around the slice stay as they were */
    test_free(x), test_free(got), test_free(want);
  }
}

/* one ctest each (tests/cuda/CMakeLists.txt reads the names from here) */
static const CudaTest TESTS[] = {
    {"rotary_fwd", rotary_fwd},       {"rotary_bwd", rotary_bwd},   {"unary_fwd", unary_fwd},
    {"binary_fwd", binary_fwd},       {"where_fwd", where_fwd},     {"reduce_sum", reduce_sum},
    {"reduce_mean", reduce_mean},     {"reshape_fwd", reshape_fwd}, {"expand_fwd", expand_fwd},
    {"transpose_fwd", transpose_fwd}, {"slice_fwd", slice_fwd},     {"slice_bwd", slice_bwd},
    {"concat_fwd", concat_fwd},       {"split_fwd", split_fwd},     {"context_append", context_append},
};

int main(int argc, char **argv) {
  return run_named_test("test_cuda_elementwise_layout", TESTS, sizeof TESTS / sizeof *TESTS, argc, argv);
}
