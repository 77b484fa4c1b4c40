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
 *     float, the runs in double), so bit for bit. (The bias is filled in and the product
 *     added onto it, inside the forward's product tolerance.)
 *
 * plan_cache and matmul_batched count what the products cost (stats.h): heuristic queries
 * (once per plan of the cuBLASLt plan cache) and launches (one per cuBLASLt call, however
 * many batch elements it multiplies). In emulation their results are the CPU's bits (the
 * same OpenBLAS calls, a bias added first as the CPU Linear adds it, a batched call one
 * element after another); on a GPU within product(K). */
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
#include "cuda/stats.h"

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

/* ---- the plan cache and the batched products ---- */

/* What the products run since *mark added to the counters (stats.h); *mark moves on. */
typedef struct {
  uint64_t queries, launches;
} Counts;
static Counts counted_since(TpCudaStats *mark) {
  Counts c = {tp_cuda_stats.queries - mark->queries, tp_cuda_stats.launches - mark->launches};
  *mark = tp_cuda_stats;
  return c;
}

static void expect_counts(const char *what, Counts got, uint64_t queries, uint64_t launches) {
  if (got.queries != queries || got.launches != launches)
    fail("%s: %llu queries and %llu launches, want %llu and %llu", what, (unsigned long long)got.queries,
         (unsigned long long)got.launches, (unsigned long long)queries, (unsigned long long)launches);
}

/* The first 256-byte aligned address in `block` (test_alloc memory of n + 64 floats): a
 * test picks each operand's alignment by its offset from there. */
static float *aligned_start(float *block) { return (float *)(((uintptr_t)block + 255) / 256 * 256); }

/* The emulated products are the CPU kernels' arithmetic (the same OpenBLAS calls, the bias
 * added first), so the same bits; on a GPU, cuBLASLt's order of the sums. */
#ifdef TOKPIPE_CUDA_TESTS_ON_GPU
static Tolerance cpu_bits_or_product(int64_t K) { return product(K); }
#else
static Tolerance cpu_bits_or_product(int64_t K) {
  (void)K;
  return EXACT;
}
#endif

/* A product queries the heuristic once, the same product again (at addresses of the same
 * alignment) not at all; another shape, transposition, dtype, epilogue or alignment is
 * another plan. A Linear with a bias is one launch. When the cache is full the least
 * recently used plan goes. Results against tp_linear_f32. */
static void plan_cache(void) {
  tp_cuda_stats_on = true; /* on a GPU too */
  /* each array twice in its block: at a 256-byte aligned start, and FAR floats on (also
   * 256-byte aligned), or FAR + 1 (4-byte aligned) */
  enum { M = 64, K = 1025, N = 48, FAR = ((M > N ? M : N) * K + 63) / 64 * 64 }; /* M N < FAR */
  TpCudaBlas *blas = tp_cuda_blas_create();
  float *x_block = test_rand(2 * FAR + 64 + 1, 1), *w_block = test_rand(2 * FAR + 64, 1);
  float *bias_block = test_rand(N + 64, 1), *y_block = nans(2 * FAR + 64);
  float *x = aligned_start(x_block), *w = aligned_start(w_block), *bias = aligned_start(bias_block);
  float *y = aligned_start(y_block), *want = nans(M * N), *first = nans(M * N);
  tp_linear_f32(x, w, bias, M, K, N, false, want);
  TpCudaStats mark = tp_cuda_stats;

  tp_cuda_launch_linear_f32(blas, x, w, bias, M, K, N, false, y, NULL);
  expect_counts("the first product (with a bias)", counted_since(&mark), 1, 1);
  check_close("the first product", y, want, M * N, cpu_bits_or_product(K));
  memcpy(first, y, sizeof(float) * M * N);
  tp_cuda_launch_linear_f32(blas, x, w, bias, M, K, N, false, y, NULL);
  expect_counts("the same product again", counted_since(&mark), 0, 1);
  check_close("the same product again, against the first", y, first, M * N, EXACT);
  memcpy(x + FAR, x, sizeof(float) * M * K), memcpy(w + FAR, w, sizeof(float) * K * N);
  tp_cuda_launch_linear_f32(blas, x + FAR, w + FAR, bias, M, K, N, false, y + FAR, NULL);
  expect_counts("the same product at other addresses of the same alignment", counted_since(&mark), 0, 1);
  check_close("the product at other addresses", y + FAR, want, M * N, cpu_bits_or_product(K));
  memcpy(x + FAR + 1, x, sizeof(float) * M * K);
  tp_cuda_launch_linear_f32(blas, x + FAR + 1, w, bias, M, K, N, false, y, NULL);
  expect_counts("x 4-byte aligned", counted_since(&mark), 1, 1);
  check_close("x 4-byte aligned", y, want, M * N, cpu_bits_or_product(K));
  tp_cuda_launch_linear_f32(blas, x + FAR + 1, w, bias, M, K, N, false, y, NULL);
  expect_counts("x 4-byte aligned again", counted_since(&mark), 0, 1);
  tp_cuda_launch_linear_f32(blas, x, w, NULL, M, K, N, false, y, NULL);
  expect_counts("without the bias", counted_since(&mark), 1, 1);
  tp_cuda_launch_linear_f32(blas, x, w, bias, M, K, N, true, y, NULL);
  expect_counts("w transposed", counted_since(&mark), 1, 1);
  tp_cuda_launch_linear_f32(blas, x, w, bias, M - 1, K, N, false, y, NULL);
  expect_counts("another M", counted_since(&mark), 1, 1);
  uint16_t *x16 = test_alloc(sizeof(uint16_t) * M * K), *w16 = test_alloc(sizeof(uint16_t) * K * N);
  tp_cuda_launch_linear_bf16(blas, x16, w16, bias, M, K, N, false, y, NULL);
  expect_counts("bf16 operands", counted_since(&mark), 1, 1);
  tp_cuda_launch_linear_bf16(blas, x16, w16, bias, M, K, N, false, y, NULL);
  expect_counts("bf16 operands again", counted_since(&mark), 0, 1);
  tp_cuda_blas_destroy(blas);

  /* a full cache: TP_CUDA_BLAS_PLANS products of M = 1, 2, ... all stay; one more product
   * evicts the least recently used (M = 1), not the next (M = 2) */
  blas = tp_cuda_blas_create();
  mark = tp_cuda_stats;
  for (int64_t m = 1; m <= TP_CUDA_BLAS_PLANS; m++)
    tp_cuda_launch_linear_f32(blas, x, w, NULL, m, 1, 1, false, y, NULL);
  expect_counts("a plan per shape", counted_since(&mark), TP_CUDA_BLAS_PLANS, TP_CUDA_BLAS_PLANS);
  for (int64_t m = 1; m <= TP_CUDA_BLAS_PLANS; m++)
    tp_cuda_launch_linear_f32(blas, x, w, NULL, m, 1, 1, false, y, NULL);
  expect_counts("the same shapes again", counted_since(&mark), 0, TP_CUDA_BLAS_PLANS);
  tp_cuda_launch_linear_f32(blas, x, w, NULL, 1, 2, 1, false, y, NULL);
  expect_counts("one more plan", counted_since(&mark), 1, 1);
  tp_cuda_launch_linear_f32(blas, x, w, NULL, 2, 1, 1, false, y, NULL);
  expect_counts("the second least recently used, kept", counted_since(&mark), 0, 1);
  tp_cuda_launch_linear_f32(blas, x, w, NULL, 1, 1, 1, false, y, NULL);
  expect_counts("the least recently used, evicted", counted_since(&mark), 1, 1);
  tp_cuda_blas_destroy(blas);
  test_free(x_block), test_free(w_block), test_free(bias_block), test_free(y_block), test_free(want),
      test_free(first), test_free(x16), test_free(w16);
}

/* MatMul batches and the cuBLASLt calls they take: forward, da (alone), db (alone),
 * counting the zero fill of a gradient summed over a broadcast batch dim. */
typedef struct {
  Shape a, b;
  uint64_t forward, da, db;
} BatchedCase;
static const BatchedCase BATCHED[] = {
    {{3, {4, 33, 65}}, {3, {4, 65, 17}}, 1, 1, 1},   /* equal batches: one strided call */
    {{3, {2, 3, 5}}, {2, {5, 4}}, 1, 1, 1},          /* b shared: the batch folds into M */
    {{2, {3, 5}}, {3, {2, 5, 4}}, 1, 3, 1},          /* a shared (stride 0); da sums: a call each */
    {{3, {1, 70, 9}}, {3, {3, 9, 130}}, 1, 4, 1},    /* likewise, a's batch dim of 1 */
    {{4, {2, 1, 3, 5}}, {4, {1, 4, 5, 7}}, 2, 9, 3}, /* b steps inside, a outside: 2 calls of 4 */
    {{4, {3, 2, 7, 5}}, {4, {3, 1, 5, 3}}, 3, 3, 7}, /* b broadcast inside: 3 calls of 2 */
    {{4, {2, 3, 1, 1}}, {4, {1, 3, 1, 2}}, 2, 2, 3}, /* sizes of 1 */
};
enum { NBATCHED = sizeof BATCHED / sizeof BATCHED[0] };

/* The batched products against the same products one batch element at a time (2-D MatMuls
 * through the same entry points): the same bits in emulation; a gradient summed over a
 * broadcast dim against tp_matmul_backward_f32, which sums in the batch's order. */
static void matmul_batched(void) {
  tp_cuda_stats_on = true;
  TpCudaBlas *blas = tp_cuda_blas_create();
  for (int s = 0; s < NBATCHED; s++) {
    const BatchedCase *c = &BATCHED[s];
    TpTensor a = f32_tensor(c->a), b = f32_tensor(c->b);
    TpMatmulLayout l, l2;
    if (!tp_matmul_layout(&a, &b, &l)) {
      fail("batched case %d does not multiply", s);
      continue;
    }
    int64_t M = l.M, K = l.K, N = l.N, ny = l.nbatch * M * N, na = tp_tensor_numel(&a), nb = tp_tensor_numel(&b);
    TpTensor a2 = {.dtype = TP_F32, .rank = 2, .dims = {M, K}}, b2 = {.dtype = TP_F32, .rank = 2, .dims = {K, N}};
    tp_matmul_layout(&a2, &b2, &l2);
    char at[96], what[160];
    describe_matmul(at, sizeof at, &a, &b);
    a.data = test_rand(na, 1), b.data = test_rand(nb, 1);
    float *dy = test_rand(ny, 1), *y = nans(ny), *want_y = nans(ny);
    float *da = nans(na), *db = nans(nb), *want_da = nans(na), *want_db = nans(nb);
    bool sum_a = l.na != l.nbatch, sum_b = l.nb != l.nbatch;
    for (int64_t n = 0; n < l.nbatch; n++) {
      int64_t oa, ob;
      tp_matmul_operands(&l, n, &oa, &ob);
      const float *a_n = (const float *)a.data + oa * M * K, *b_n = (const float *)b.data + ob * K * N;
      tp_cuda_launch_matmul_f32(blas, &l2, a_n, b_n, want_y + n * M * N, NULL);
      tp_cuda_launch_matmul_backward_f32(blas, &l2, dy + n * M * N, a_n, b_n, sum_a ? NULL : want_da + oa * M * K,
                                         sum_b ? NULL : want_db + ob * K * N, NULL);
    }
    if (sum_a || sum_b) {
      TpTensor dy_t = {.dtype = TP_F32, .rank = 1, .dims = {ny}, .data = dy}, da_t = a, db_t = b;
      da_t.data = want_da, db_t.data = want_db;
      if (tp_matmul_backward_f32(&dy_t, &a, &b, sum_a ? &da_t : NULL, sum_b ? &db_t : NULL) != TP_KERNEL_OK)
        fail("%s: tp_matmul_backward_f32 refused", at);
    }
    /* each twice: the second time every plan is cached */
    for (int again = 0; again < 2; again++) {
      TpCudaStats mark = tp_cuda_stats;
      tp_cuda_launch_matmul_f32(blas, &l, a.data, b.data, y, NULL);
      Counts forward = counted_since(&mark);
      tp_cuda_launch_matmul_backward_f32(blas, &l, dy, a.data, b.data, da, NULL, NULL);
      Counts for_da = counted_since(&mark);
      tp_cuda_launch_matmul_backward_f32(blas, &l, dy, a.data, b.data, NULL, db, NULL);
      Counts for_db = counted_since(&mark);
      snprintf(what, sizeof what, "%s: forward%s", at, again ? " again" : "");
      expect_counts(what, forward, again ? 0 : forward.queries, c->forward);
      check_close(what, y, want_y, ny, cpu_bits_or_product(K));
      snprintf(what, sizeof what, "%s: da%s", at, again ? " again" : "");
      expect_counts(what, for_da, again ? 0 : for_da.queries, c->da);
      check_close(what, da, want_da, na, cpu_bits_or_product(N * l.nbatch));
      snprintf(what, sizeof what, "%s: db%s", at, again ? " again" : "");
      expect_counts(what, for_db, again ? 0 : for_db.queries, c->db);
      check_close(what, db, want_db, nb, cpu_bits_or_product(M * l.nbatch));
    }
    test_free(a.data), test_free(b.data), test_free(dy), test_free(y), test_free(want_y), test_free(da),
        test_free(db), test_free(want_da), test_free(want_db);
  }
  tp_cuda_blas_destroy(blas);
}

static const CudaTest TESTS[] = {
    {"linear_fwd", linear_fwd},           {"linear_bwd", linear_bwd},           {"linear_bf16_fwd", linear_bf16_fwd},
    {"linear_bf16_bwd", linear_bf16_bwd}, {"matmul_fwd", matmul_fwd},           {"matmul_bwd", matmul_bwd},
    {"matmul_bf16_fwd", matmul_bf16_fwd}, {"matmul_bf16_bwd", matmul_bf16_bwd}, {"plan_cache", plan_cache},
    {"matmul_batched", matmul_batched},
};

int main(int argc, char **argv) {
  return run_named_test("test_cuda_blas", TESTS, sizeof TESTS / sizeof *TESTS, argc, argv);
}
