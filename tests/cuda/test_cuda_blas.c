/* The matrix products of runtime/cuda/blas.h, run on the CPU in the emulated build (the
 * products through OpenBLAS with the column-major operands the cuBLASLt call takes, the
 * bias and column-sum kernels through the emulation), each against the CPU kernel it
 * implements, at awkward shapes: sizes of 0 and 1, odd sizes, more rows than a column-sum
 * run (64), w transposed both ways, with and without bias. Outputs start as NaN, so an
 * output the entry point should overwrite but reads or skips fails. One ctest per kernel
 * and direction: `test_cuda_blas NAME`.
 *
 * Tolerances, |gpu - cpu| <= atol + rtol * |cpu| per element:
 *   product(K) (1e-6 * K, 1e-5): a dot product of K terms, each |a b| <= 1 (inputs in
 *     [-1, 1)), summed in float in another order (other blocking, other kernel): the
 *     rounding errors of the K partial sums, each <= 2^-24 |partial sum|, stay well below
 *     1e-6 * K (about 17 K ulp of 1) for sums of random signs.
 *     A gradient summed over a broadcast batch dim adds (batch) such products: product(K *
 *     batch), K the inner size of one product.
 *     The products of bf16 operands are exact in f32 (8-bit significands), so product(K)
 *     too, against the CPU kernel on the operands widened back to f32.
 *   EXACT (0, 0): dbias is the CPU's column sum in the same order (runs of 64 rows in
 *     float, the runs in double), so bit for bit. (The bias broadcast is a copy the product
 *     is then added onto, inside the forward's product tolerance.) */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "compare.h"
#include "cpu/matmul.h"
#include "cpu/nn_backward.h"
#include "cpu/transformer.h"
#include "cuda/blas.h"

static const Tolerance EXACT = {0, 0};
static Tolerance product(int64_t K) { return (Tolerance){1e-6 * (double)K, 1e-5}; }

/* n floats set to NaN: what an output holds before the kernel must overwrite it. */
static float *nans(int64_t n) {
  float *a = test_alloc((size_t)(n ? n : 1) * sizeof *a);
  for (int64_t i = 0; i < n; i++) a[i] = NAN;
  return a;
}

/* (M, K, N) of the linear tests */
static const int64_t SHAPES[][3] = {{1, 1, 1},      {1, 7, 3},      {3, 1, 5}, {5, 33, 17}, {64, 65, 63},
                                    {130, 257, 31}, {200, 96, 300}, {0, 4, 3}, {3, 0, 4},   {2, 5, 0}};
enum { NSHAPES = sizeof SHAPES / sizeof SHAPES[0] };

static void describe(char *at, size_t size, const int64_t *shape, bool transpose_w, bool bias) {
  snprintf(at, size, "M=%lld K=%lld N=%lld transpose_w=%d bias=%d", (long long)shape[0], (long long)shape[1],
           (long long)shape[2], transpose_w, bias);
}

/* bf16 x and w: their products are exact in f32, so against tp_linear_f32 on the widened
 * values only the order of the f32 sums differs. (The emulated build widens the operands
 * itself: this checks the operand mapping and the bias, not cuBLASLt's bf16 path.) */
static uint16_t *bf16_of(const float *x, int64_t n, float **wide) {
  uint16_t *bits = test_alloc((size_t)(n ? n : 1) * sizeof *bits);
  *wide = test_alloc((size_t)(n ? n : 1) * sizeof **wide);
  for (int64_t i = 0; i < n; i++) bits[i] = tp_f32_to_bf16(x[i]), (*wide)[i] = tp_bf16_to_f32(bits[i]);
  return bits;
}

static uint16_t *rand_bf16(int64_t n, float **wide) {
  float *x = test_rand(n, 1);
  uint16_t *bits = bf16_of(x, n, wide);
  test_free(x);
  return bits;
}

/* tp_cuda_launch_linear_f32, or tp_cuda_launch_linear_bf16 on bf16 x and w, against tp_linear_f32 */
static void linear_forward(bool bf16) {
  TpCudaBlas *blas = tp_cuda_blas_create();
  for (int s = 0; s < NSHAPES; s++)
    for (int variant = 0; variant < 4; variant++) {
      int64_t M = SHAPES[s][0], K = SHAPES[s][1], N = SHAPES[s][2];
      bool transpose_w = variant & 1, with_bias = variant & 2;
      char at[96];
      describe(at, sizeof at, SHAPES[s], transpose_w, with_bias);
      float *x, *w, *bias = with_bias ? test_rand(N, 1) : NULL;
      uint16_t *x_bits = NULL, *w_bits = NULL;
      if (bf16) x_bits = rand_bf16(M * K, &x), w_bits = rand_bf16(K * N, &w);
      else x = test_rand(M * K, 1), w = test_rand(K * N, 1);
      float *y = nans(M * N), *want = nans(M * N);
      tp_linear_f32(x, w, bias, M, K, N, transpose_w, want);
      if (bf16) tp_cuda_launch_linear_bf16(blas, x_bits, w_bits, bias, M, K, N, transpose_w, y, NULL);
      else tp_cuda_launch_linear_f32(blas, x, w, bias, M, K, N, transpose_w, y, NULL);
      check_close(at, y, want, M * N, product(K));
      test_free(x), test_free(w), test_free(x_bits), test_free(w_bits), test_free(bias), test_free(y),
          test_free(want);
    }
  tp_cuda_blas_destroy(blas);
}

static void linear_fwd(void) { linear_forward(false); }
static void linear_bf16_fwd(void) { linear_forward(true); }

/* tp_cuda_launch_linear_backward_f32, or tp_cuda_launch_linear_backward_bf16 on dy, x and w
 * rounded to bf16 (dbias from dy unrounded), against tp_linear_backward_f32 on the values
 * the products read */
static void linear_backward(bool bf16) {
  TpCudaBlas *blas = tp_cuda_blas_create();
  for (int s = 0; s < NSHAPES; s++)
    for (int variant = 0; variant < 4; variant++) {
      int64_t M = SHAPES[s][0], K = SHAPES[s][1], N = SHAPES[s][2];
      bool transpose_w = variant & 1, all_outputs = variant & 2; /* else dw alone (dx, dbias NULL) */
      char at[96], what[128];
      describe(at, sizeof at, SHAPES[s], transpose_w, all_outputs);
      float *dy = test_rand(M * N, 1), *x, *w, *dy_read = dy;
      uint16_t *dy_bits = NULL, *x_bits = NULL, *w_bits = NULL;
      if (bf16) dy_bits = bf16_of(dy, M * N, &dy_read), x_bits = rand_bf16(M * K, &x), w_bits = rand_bf16(K * N, &w);
      else x = test_rand(M * K, 1), w = test_rand(K * N, 1);
      float *dx = nans(M * K), *dw = nans(K * N), *dbias = nans(N);
      float *want_dx = nans(M * K), *want_dw = nans(K * N), *want_dbias = nans(N);
      tp_linear_backward_f32(dy_read, x, w, M, K, N, transpose_w, all_outputs ? want_dx : NULL, want_dw, NULL);
      if (all_outputs) tp_linear_backward_f32(dy, x, w, M, K, N, transpose_w, NULL, NULL, want_dbias);
      if (bf16)
        tp_cuda_launch_linear_backward_bf16(blas, dy_bits, x_bits, w_bits, dy, M, K, N, transpose_w,
                                            all_outputs ? dx : NULL, dw, all_outputs ? dbias : NULL, NULL);
      else
        tp_cuda_launch_linear_backward_f32(blas, dy, x, w, M, K, N, transpose_w, all_outputs ? dx : NULL, dw,
                                           all_outputs ? dbias : NULL, NULL);
      snprintf(what, sizeof what, "%s dw", at);
      check_close(what, dw, want_dw, K * N, product(M));
      snprintf(what, sizeof what, "%s dx", at);
      check_close(what, dx, want_dx, all_outputs ? M * K : 0, product(N));
      snprintf(what, sizeof what, "%s dbias", at);
      check_close(what, dbias, want_dbias, all_outputs ? N : 0, EXACT);
      if (!all_outputs) /* the outputs not asked for are left alone */
        for (int64_t i = 0; i < M * K; i++)
          if (!isnan(dx[i])) {
            fail("%s: dx[%lld] written though dx was not asked for", at, (long long)i);
            break;
          }
      if (bf16) test_free(dy_read), test_free(dy_bits), test_free(x_bits), test_free(w_bits);
      test_free(dy), test_free(x), test_free(w), test_free(dx), test_free(dw), test_free(dbias), test_free(want_dx),
          test_free(want_dw), test_free(want_dbias);
    }
  tp_cuda_blas_destroy(blas);
}

static void linear_bwd(void) { linear_backward(false); }
static void linear_bf16_bwd(void) { linear_backward(true); }

/* MatMul operand shapes: 2-D, 1-D either side, a batch folded into the rows (shared b),
 * equal batches, a broadcast a, both broadcast over different dims, sizes of 1, K = 0,
 * M = 0, larger odd sizes. */
typedef struct {
  int rank;
  int64_t dims[4];
} Shape;
static const Shape MATMUL_SHAPES[][2] = {
    {{2, {3, 5}}, {2, {5, 4}}},
    {{1, {5}}, {2, {5, 4}}},
    {{2, {3, 5}}, {1, {5}}},
    {{3, {2, 3, 5}}, {2, {5, 4}}},
    {{3, {2, 3, 5}}, {3, {2, 5, 4}}},
    {{2, {3, 5}}, {3, {2, 5, 4}}},
    {{4, {2, 1, 3, 5}}, {4, {1, 4, 5, 7}}},
    {{3, {1, 1, 1}}, {2, {1, 1}}},
    {{3, {2, 3, 0}}, {2, {0, 4}}},
    {{3, {2, 3, 0}}, {3, {2, 0, 4}}},
    {{3, {2, 0, 5}}, {2, {5, 3}}},
    {{3, {4, 33, 65}}, {3, {4, 65, 17}}},
    {{3, {1, 70, 9}}, {3, {3, 9, 130}}},
};
enum { NMATMUL_SHAPES = sizeof MATMUL_SHAPES / sizeof MATMUL_SHAPES[0] };

static TpTensor f32_tensor(Shape shape) {
  TpTensor t = {.dtype = TP_F32, .rank = shape.rank};
  for (int i = 0; i < shape.rank; i++) t.dims[i] = shape.dims[i];
  return t;
}

/* "a 2x3x5 b 5x4" */
static void describe_matmul(char *at, size_t size, const TpTensor *a, const TpTensor *b) {
  int used = 0;
  for (int t = 0; t < 2; t++) {
    const TpTensor *x = t ? b : a;
    used += snprintf(at + used, size - (size_t)used, "%s", t ? " b" : "a");
    for (int i = 0; i < x->rank; i++)
      used += snprintf(at + used, size - (size_t)used, "%s%lld", i ? "x" : " ", (long long)x->dims[i]);
  }
}

/* a tensor's data as the products read it: rounded to bf16 (*bits, and the values widened
 * back in place) when bf16, else as drawn */
static void read_as(TpTensor *t, bool bf16, uint16_t **bits) {
  *bits = NULL;
  if (!bf16) return;
  float *wide;
  *bits = bf16_of(t->data, tp_tensor_numel(t), &wide);
  test_free(t->data);
  t->data = wide;
}

/* tp_cuda_launch_matmul_f32, or tp_cuda_launch_matmul_bf16 on bf16 a and b, against tp_matmul */
static void matmul_forward(bool bf16) {
  TpCudaBlas *blas = tp_cuda_blas_create();
  for (int s = 0; s < NMATMUL_SHAPES; s++) {
    TpTensor a = f32_tensor(MATMUL_SHAPES[s][0]), b = f32_tensor(MATMUL_SHAPES[s][1]);
    TpMatmulLayout l;
    if (!tp_matmul_layout(&a, &b, &l)) {
      fail("shape %d does not multiply", s);
      continue;
    }
    char at[96];
    describe_matmul(at, sizeof at, &a, &b);
    int64_t ny = l.nbatch * l.M * l.N;
    a.data = test_rand(tp_tensor_numel(&a), 1), b.data = test_rand(tp_tensor_numel(&b), 1);
    uint16_t *a_bits, *b_bits;
    read_as(&a, bf16, &a_bits), read_as(&b, bf16, &b_bits);
    float *y = nans(ny), *want = nans(ny);
    TpTensor want_t = {.dtype = TP_F32, .rank = 1, .dims = {ny}, .data = want};
    if (tp_matmul(&a, &b, &want_t) != TP_KERNEL_OK) fail("%s: tp_matmul refused", at);
    if (bf16) tp_cuda_launch_matmul_bf16(blas, &l, a_bits, b_bits, y, NULL);
    else tp_cuda_launch_matmul_f32(blas, &l, a.data, b.data, y, NULL);
    check_close(at, y, want, ny, product(l.K));
    test_free(a.data), test_free(b.data), test_free(a_bits), test_free(b_bits), test_free(y), test_free(want);
  }
  tp_cuda_blas_destroy(blas);
}

static void matmul_fwd(void) { matmul_forward(false); }
static void matmul_bf16_fwd(void) { matmul_forward(true); }

/* tp_cuda_launch_matmul_backward_f32, or its bf16 entry on bf16 dy, a and b, against
 * tp_matmul_backward_f32 */
static void matmul_backward(bool bf16) {
  TpCudaBlas *blas = tp_cuda_blas_create();
  for (int s = 0; s < NMATMUL_SHAPES; s++)
    for (int variant = 0; variant < 2; variant++) { /* both gradients, then db alone */
      TpTensor a = f32_tensor(MATMUL_SHAPES[s][0]), b = f32_tensor(MATMUL_SHAPES[s][1]);
      TpMatmulLayout l;
      if (!tp_matmul_layout(&a, &b, &l)) {
        fail("shape %d does not multiply", s);
        continue;
      }
      char at[96], what[128];
      describe_matmul(at, sizeof at, &a, &b);
      int64_t ny = l.nbatch * l.M * l.N, na = tp_tensor_numel(&a), nb = tp_tensor_numel(&b);
      bool with_da = variant == 0;
      a.data = test_rand(na, 1), b.data = test_rand(nb, 1);
      TpTensor dy_t = {.dtype = TP_F32, .rank = 1, .dims = {ny}, .data = test_rand(ny, 1)};
      uint16_t *a_bits, *b_bits, *dy_bits;
      read_as(&a, bf16, &a_bits), read_as(&b, bf16, &b_bits), read_as(&dy_t, bf16, &dy_bits);
      float *dy = dy_t.data, *da = nans(na), *db = nans(nb), *want_da = nans(na), *want_db = nans(nb);
      TpTensor want_da_t = a, want_db_t = b;
      want_da_t.data = want_da, want_db_t.data = want_db;
      if (tp_matmul_backward_f32(&dy_t, &a, &b, with_da ? &want_da_t : NULL, &want_db_t) != TP_KERNEL_OK)
        fail("%s: tp_matmul_backward_f32 refused", at);
      if (bf16)
        tp_cuda_launch_matmul_backward_bf16(blas, &l, dy_bits, a_bits, b_bits, with_da ? da : NULL, db, NULL);
      else tp_cuda_launch_matmul_backward_f32(blas, &l, dy, a.data, b.data, with_da ? da : NULL, db, NULL);
      /* a gradient summed over a broadcast batch adds nbatch / (its own matrices) products */
      snprintf(what, sizeof what, "%s da", at);
      check_close(what, da, want_da, with_da ? na : 0, product(l.N * (l.nbatch / (l.na ? l.na : 1))));
      snprintf(what, sizeof what, "%s db", at);
      check_close(what, db, want_db, nb, product(l.M * (l.nbatch / (l.nb ? l.nb : 1))));
      if (!with_da)
        for (int64_t i = 0; i < na; i++)
          if (!isnan(da[i])) {
            fail("%s: da[%lld] written though da was not asked for", at, (long long)i);
            break;
          }
      test_free(a_bits), test_free(b_bits), test_free(dy_bits);
      test_free(a.data), test_free(b.data), test_free(dy), test_free(da), test_free(db), test_free(want_da),
          test_free(want_db);
    }
  tp_cuda_blas_destroy(blas);
}

static void matmul_bwd(void) { matmul_backward(false); }
static void matmul_bf16_bwd(void) { matmul_backward(true); }

static const CudaTest TESTS[] = {
    {"linear_fwd", linear_fwd},           {"linear_bwd", linear_bwd},           {"linear_bf16_fwd", linear_bf16_fwd},
    {"linear_bf16_bwd", linear_bf16_bwd}, {"matmul_fwd", matmul_fwd},           {"matmul_bwd", matmul_bwd},
    {"matmul_bf16_fwd", matmul_bf16_fwd}, {"matmul_bf16_bwd", matmul_bf16_bwd},
};

int main(int argc, char **argv) {
  return run_named_test("test_cuda_blas", TESTS, sizeof TESTS / sizeof *TESTS, argc, argv);
}
