/* The transformer and optimizer kernels of runtime/cuda (RMSNorm, LayerNorm, softmax, GELU,
 * SwiGLU, embedding, cross-entropy and their vocabulary-parallel parts, AdamW, the sum of
 * squares and the scale) run on the CPU through the emulation of the CUDA execution model
 * (runtime/cuda/emulate), each against the CPU kernel it implements, at
 * small and awkward sizes: rows of 1, lengths below, at and past the warp size (32) and
 * the block size (256), odd lengths, more rows than a column-sum run (64). One ctest per
 * kernel and direction: `test_cuda_transformer NAME`.
 *
 * Tolerances, |gpu - cpu| <= atol + rtol * |cpu| per element:
 *   EXACT (0, 0): copies, the embedding's scatter-add (the same additions in the same
 *     order) and AdamW and scaling (the same float operations in the same order: AdamW's
 *     element rounds each one, kernels/element.h's TP_FMUL_RN, which neither nvcc nor the
 *     emulated build, compiled with contraction as nvcc is, fuses into FMAs).
 *   ELEMENTWISE (1e-6, 1e-5): the same float formula, but libm's expf/erff/erfcf/tanhf
 *     against runtime/cpu/vecmath.h's vectorised ones (each within a few ulp; a few ulp
 *     through the formula's few operations stays below 1e-5 relative; 1e-6 absolute where
 *     the result cancels to near 0, as dgate and Gelu's do).
 *   GELU_TANH_BWD (5e-6, 1e-5): the tanh form's gradient, 0.5 (1 + t) + 0.5 x (1 - t^2)
 *     c (1 + 3 k x^2), cancels where t = tanh(..) is near -1: an ulp of t (6e-8) there is
 *     multiplied by about |x| c (1 + 3 k x^2) <= 28 for the tests' |x| <= 6, so the two
 *     tanh implementations may differ by ~2e-6 on results near 0.
 *   ROW (1e-5, 1e-5): row reductions in float (block_reduce) against the CPU's in double:
 *     a float sum of n <= 4099 terms of magnitude <= 1 through per-thread runs of <= 17
 *     and a 13-level tree errs by <= ~30 ulp of the sum (~2e-6 relative); the statistics'
 *     error then scales outputs of magnitude ~1.
 *   COLUMN (1e-5 * rows, 1e-5): RMSNorm's scale gradient sums `rows` terms each carrying a
 *     ROW error (its inv_rms, recomputed in float), in the CPU's order.
 *   Bit for bit (check_bits): the column sums (colsum.cu) and so LayerNorm's scale and bias
 *     gradients, whose statistics are the saved ones: the CPU's sums in the CPU's order.
 *   SUM (0, 1e-12): the sums of squares and losses in double, in another order. */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "cpu/elementwise.h"
#include "cpu/layout_backward.h"
#include "cpu/nn.h"
#include "cpu/nn_backward.h"
#include "cpu/optim.h"
#include "cpu/transformer.h"
#include "cuda/kernels.h"
#include "cuda/ops.h"
#include "cuda/stats.h"
#include "compare.h"

static const Tolerance EXACT = {0, 0}, ELEMENTWISE = {1e-6, 1e-5}, GELU_TANH_BWD = {5e-6, 1e-5}, ROW = {1e-5, 1e-5},
                       SUM = {0, 1e-12};
static Tolerance column(int64_t rows) { return (Tolerance){1e-5 * (double)rows, 1e-5}; }

static float *zeros(int64_t n) { return test_alloc((size_t)n * sizeof(float)); }

/* (rows, n) shapes of the row kernels */
static const int64_t SHAPES[][2] = {{1, 1},   {3, 31},  {2, 32},   {5, 33},   {4, 255},
                                    {3, 256}, {3, 257}, {2, 1000}, {1, 4099}, {130, 7}};
enum { NSHAPES = sizeof SHAPES / sizeof SHAPES[0] };

static void rmsnorm_fwd(void) {
  for (int s = 0; s < NSHAPES; s++) {
    int64_t rows = SHAPES[s][0], n = SHAPES[s][1];
    char at[48];
    snprintf(at, sizeof at, "rows=%lld n=%lld", (long long)rows, (long long)n);
    float *x = test_rand(rows * n, 2), *scale = test_rand(n, 1.5f), *y = zeros(rows * n), *want = zeros(rows * n);
    tp_rmsnorm_f32(x, scale, rows, n, 1e-5f, want);
    if (tp_cuda_rmsnorm_f32(x, scale, rows, n, 1e-5f, y, stream()) != TP_KERNEL_OK) fail("tp_cuda_rmsnorm_f32");
    check_close(at, y, want, rows * n, ROW);
    test_free(x), test_free(scale), test_free(y), test_free(want);
  }
}

static void rmsnorm_bwd(void) {
  for (int s = 0; s < NSHAPES; s++) {
    int64_t rows = SHAPES[s][0], n = SHAPES[s][1];
    char at[48];
    snprintf(at, sizeof at, "rows=%lld n=%lld", (long long)rows, (long long)n);
    float *x = test_rand(rows * n, 2), *scale = test_rand(n, 1.5f), *dy = test_rand(rows * n, 1);
    float *dx = zeros(rows * n), *ds = zeros(n), *want_dx = zeros(rows * n), *want_ds = zeros(n);
    tp_rmsnorm_backward_f32(dy, x, scale, rows, n, 1e-5f, want_dx, want_ds);
    if (tp_cuda_rmsnorm_backward_f32(dy, x, scale, rows, n, 1e-5f, dx, ds, stream()) != TP_KERNEL_OK)
      fail("tp_cuda_rmsnorm_backward_f32");
    char what[96];
    snprintf(what, sizeof what, "dx %s", at);
    check_close(what, dx, want_dx, rows * n, ROW);
    snprintf(what, sizeof what, "dscale %s", at);
    check_close(what, ds, want_ds, n, column(rows));
    test_free(x), test_free(scale), test_free(dy), test_free(dx), test_free(ds), test_free(want_dx),
        test_free(want_ds);
  }
}

/* tp_cuda_launch_column_sums_f32 against tp_column_sums_f32, bit for bit, at rows below, at
 * and past a run of 64 (none, and not multiples of it) and odd column counts, for each set
 * of results: the sums of dy alone, of dy * xhat alone (with a mean and without), both.
 * Outputs start as NaN: one not asked for must stay so. Two launches past 64 rows, else one. */
static void column_sums(void) {
  static const int64_t ROWS[] = {0, 1, 63, 64, 65, 200}, COLUMNS[] = {1, 3, 33, 300};
  for (size_t a = 0; a < sizeof ROWS / sizeof *ROWS; a++)
    for (size_t b = 0; b < sizeof COLUMNS / sizeof *COLUMNS; b++) {
      int64_t rows = ROWS[a], n = COLUMNS[b];
      float *dy = test_rand(rows * n, 1), *x = test_rand(rows * n, 2), *mean = test_rand(rows, 1);
      float *inv = test_rand(rows, 1.5f), *got = test_alloc(2 * (size_t)n * sizeof(float));
      float *want = test_alloc(2 * (size_t)n * sizeof(float));
      void *scratch = test_alloc(tp_cuda_column_sums_scratch(rows, n, 2));
      for (int variant = 0; variant < 4; variant++) {
        bool with_dy = variant == 0 || variant == 3, with_xhat = variant != 0, with_mean = variant != 2;
        for (int64_t i = 0; i < 2 * n; i++) got[i] = want[i] = NAN;
        float *sum_dy_xhat = with_xhat ? got : NULL, *sum_dy = with_dy ? got + n : NULL;
        tp_column_sums_f32(dy, with_xhat ? x : NULL, with_mean ? mean : NULL, inv, rows, n, with_xhat ? want : NULL,
                           with_dy ? want + n : NULL);
        uint64_t launches = tp_cuda_stats.launches;
        tp_cuda_launch_column_sums_f32(dy, with_xhat ? x : NULL, with_mean ? mean : NULL, inv, rows, n, sum_dy_xhat,
                                       sum_dy, scratch, stream()->cuda);
        char what[96];
        snprintf(what, sizeof what, "rows=%lld n=%lld dy=%d xhat=%d mean=%d", (long long)rows, (long long)n, with_dy,
                 with_xhat, with_mean);
        check_bits(what, got, want, 2 * n);
        uint64_t expected = rows > 64 ? 2 : 1;
        if (tp_cuda_stats_on && tp_cuda_stats.launches - launches != expected)
          fail("%s: %llu launches, expected %llu", what, (unsigned long long)(tp_cuda_stats.launches - launches),
               (unsigned long long)expected);
      }
      test_free(dy), test_free(x), test_free(mean), test_free(inv), test_free(got), test_free(want),
          test_free(scratch);
    }
}

static void layernorm_fwd(void) {
  for (int s = 0; s < NSHAPES; s++) {
    int64_t rows = SHAPES[s][0], n = SHAPES[s][1];
    char at[48];
    snprintf(at, sizeof at, "rows=%lld n=%lld", (long long)rows, (long long)n);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      float *x = test_rand(rows * n, 2), *scale = test_rand(n, 1.5f), *bias = test_rand(n, 1);
      float *y = zeros(rows * n), *mean = zeros(rows), *inv = zeros(rows);
      float *want = zeros(rows * n), *want_mean = zeros(rows), *want_inv = zeros(rows);
      for (int64_t i = 0; i < rows * n; i++) x[i] += 3; /* a mean far from 0 */
      const float *b = with_bias ? bias : NULL;
      tp_layernorm_f32(x, scale, b, rows, n, 1e-5f, want, want_mean, want_inv);
      if (tp_cuda_layernorm_f32(x, scale, b, rows, n, 1e-5f, y, mean, inv, stream()) != TP_KERNEL_OK)
        fail("tp_cuda_layernorm_f32");
      char what[96];
      snprintf(what, sizeof what, "y %s bias=%d", at, with_bias);
      check_close(what, y, want, rows * n, ROW);
      snprintf(what, sizeof what, "mean %s", at);
      check_close(what, mean, want_mean, rows, ROW);
      snprintf(what, sizeof what, "inv_std %s", at);
      check_close(what, inv, want_inv, rows, ROW);
      test_free(x), test_free(scale), test_free(bias), test_free(y), test_free(mean), test_free(inv),
          test_free(want), test_free(want_mean), test_free(want_inv);
    }
  }
}

static void layernorm_bwd(void) {
  for (int s = 0; s < NSHAPES; s++) {
    int64_t rows = SHAPES[s][0], n = SHAPES[s][1];
    char at[48];
    snprintf(at, sizeof at, "rows=%lld n=%lld", (long long)rows, (long long)n);
    float *x = test_rand(rows * n, 2), *scale = test_rand(n, 1.5f), *dy = test_rand(rows * n, 1);
    float *y = zeros(rows * n), *mean = zeros(rows), *inv = zeros(rows);
    tp_layernorm_f32(x, scale, NULL, rows, n, 1e-5f, y, mean, inv); /* the saved statistics */
    float *dx = zeros(rows * n), *ds = zeros(n), *db = zeros(n);
    float *want_dx = zeros(rows * n), *want_ds = zeros(n), *want_db = zeros(n);
    tp_layernorm_backward_f32(dy, x, scale, mean, inv, rows, n, want_dx, want_ds, want_db);
    if (tp_cuda_layernorm_backward_f32(dy, x, scale, mean, inv, rows, n, dx, ds, db, stream()) != TP_KERNEL_OK)
      fail("tp_cuda_layernorm_backward_f32");
    char what[96];
    snprintf(what, sizeof what, "dx %s", at);
    check_close(what, dx, want_dx, rows * n, ROW);
    snprintf(what, sizeof what, "dscale %s", at);
    check_bits(what, ds, want_ds, n);
    snprintf(what, sizeof what, "dbias %s", at);
    check_bits(what, db, want_db, n);
    test_free(x), test_free(scale), test_free(dy), test_free(y), test_free(mean), test_free(inv), test_free(dx),
        test_free(ds), test_free(db);
    test_free(want_dx), test_free(want_ds), test_free(want_db);
  }
}

static void softmax_fwd(void) {
  for (int s = 0; s < NSHAPES; s++) {
    int64_t rows = SHAPES[s][0], n = SHAPES[s][1];
    char at[48];
    snprintf(at, sizeof at, "rows=%lld n=%lld", (long long)rows, (long long)n);
    for (int log = 0; log < 2; log++) {
      float *x = test_rand(rows * n, 8), *y = zeros(rows * n), *want = zeros(rows * n);
      for (int64_t j = 0; j < n; j++) x[j] = -INFINITY; /* row 0 masked out: zeros (log: -inf) */
      if (rows > 1) x[n + n / 2] = -INFINITY;           /* one masked element */
      tp_softmax_f32(x, want, rows, n, 1, log);
      if (tp_cuda_softmax_f32(x, y, rows, n, 1, log, stream()) != TP_KERNEL_OK) fail("tp_cuda_softmax_f32");
      char what[96];
      snprintf(what, sizeof what, "%s log=%d", at, log);
      check_close(what, y, want, rows * n, ROW);
      if (tp_cuda_softmax_f32(x, x, rows, n, 1, log, stream()) != TP_KERNEL_OK) /* in place */
        fail("tp_cuda_softmax_f32");
      snprintf(what, sizeof what, "in place %s log=%d", at, log);
      check_close(what, x, want, rows * n, ROW);
      test_free(x), test_free(y), test_free(want);
    }
  }
}

static void softmax_bwd(void) {
  for (int s = 0; s < NSHAPES; s++) {
    int64_t rows = SHAPES[s][0], n = SHAPES[s][1];
    char at[48];
    snprintf(at, sizeof at, "rows=%lld n=%lld", (long long)rows, (long long)n);
    for (int log = 0; log < 2; log++) {
      float *x = test_rand(rows * n, 4), *y = zeros(rows * n), *dy = test_rand(rows * n, 1);
      float *dx = zeros(rows * n), *want = zeros(rows * n);
      tp_softmax_f32(x, y, rows, n, 1, log);
      tp_softmax_backward_f32(dy, y, rows, n, 1, log, want);
      if (tp_cuda_softmax_backward_f32(dy, y, rows, n, 1, log, dx, stream()) != TP_KERNEL_OK)
        fail("tp_cuda_softmax_backward_f32");
      char what[96];
      snprintf(what, sizeof what, "%s log=%d", at, log);
      check_close(what, dx, want, rows * n, ROW);
      test_free(x), test_free(y), test_free(dy), test_free(dx), test_free(want);
    }
  }
}

/* Lengths of the elementwise kernels: one element, below and past a warp and a block,
 * several blocks. */
static const int64_t LENGTHS[] = {1, 31, 256, 257, 4099};
enum { NLENGTHS = sizeof LENGTHS / sizeof LENGTHS[0] };

static void gelu_fwd(void) {
  for (int l = 0; l < NLENGTHS; l++)
    for (int tanh_form = 0; tanh_form < 2; tanh_form++) {
      int64_t n = LENGTHS[l];
      float *x = test_rand(n, 6), *y = zeros(n), *want = zeros(n);
      TpTensor xt = {.dtype = TP_F32, .rank = 1, .dims = {n}, .data = x};
      TpTensor yt = {.dtype = TP_F32, .rank = 1, .dims = {n}, .data = want};
      if (tp_unary(tanh_form ? TP_UNARY_GELU_TANH : TP_UNARY_GELU, &xt, &yt) != TP_KERNEL_OK) fail("tp_unary");
      tp_cuda_launch_unary_f32(tanh_form ? TP_UNARY_GELU_TANH : TP_UNARY_GELU, x, n, y, NULL);
      char what[96];
      snprintf(what, sizeof what, "n=%lld tanh=%d", (long long)n, tanh_form);
      check_close(what, y, want, n, ELEMENTWISE);
      test_free(x), test_free(y), test_free(want);
    }
}

static void gelu_bwd(void) {
  for (int l = 0; l < NLENGTHS; l++)
    for (int tanh_form = 0; tanh_form < 2; tanh_form++) {
      int64_t n = LENGTHS[l];
      float *x = test_rand(n, 6), *dy = test_rand(n, 1), *dx = zeros(n), *want = zeros(n);
      tp_gelu_backward_f32(dy, x, n, tanh_form, want);
      if (tp_cuda_gelu_backward_f32(dy, x, n, tanh_form, dx, stream()) != TP_KERNEL_OK)
        fail("tp_cuda_gelu_backward_f32");
      char what[96];
      snprintf(what, sizeof what, "n=%lld tanh=%d", (long long)n, tanh_form);
      check_close(what, dx, want, n, tanh_form ? GELU_TANH_BWD : ELEMENTWISE);
      test_free(x), test_free(dy), test_free(dx), test_free(want);
    }
}

static void swiglu_fwd(void) {
  for (int l = 0; l < NLENGTHS; l++) {
    int64_t n = LENGTHS[l];
    float *gate = test_rand(n, 6), *up = test_rand(n, 2), *y = zeros(n), *want = zeros(n);
    tp_swiglu_f32(gate, up, n, want);
    if (tp_cuda_swiglu_f32(gate, up, n, y, stream()) != TP_KERNEL_OK) fail("tp_cuda_swiglu_f32");
    char what[64];
    snprintf(what, sizeof what, "n=%lld", (long long)n);
    check_close(what, y, want, n, ELEMENTWISE);
    test_free(gate), test_free(up), test_free(y), test_free(want);
  }
}

static void swiglu_bwd(void) {
  for (int l = 0; l < NLENGTHS; l++) {
    int64_t n = LENGTHS[l];
    float *gate = test_rand(n, 6), *up = test_rand(n, 2), *dy = test_rand(n, 1);
    float *dg = zeros(n), *du = zeros(n), *want_dg = zeros(n), *want_du = zeros(n);
    tp_swiglu_backward_f32(dy, gate, up, n, want_dg, want_du);
    if (tp_cuda_swiglu_backward_f32(dy, gate, up, n, dg, du, stream()) != TP_KERNEL_OK)
      fail("tp_cuda_swiglu_backward_f32");
    char what[64];
    snprintf(what, sizeof what, "dgate n=%lld", (long long)n);
    check_close(what, dg, want_dg, n, ELEMENTWISE);
    snprintf(what, sizeof what, "dup n=%lld", (long long)n);
    check_close(what, du, want_du, n, ELEMENTWISE);
    test_free(gate), test_free(up), test_free(dy), test_free(dg), test_free(du), test_free(want_dg),
        test_free(want_du);
  }
}

static void geglu_fwd(void) {
  for (int l = 0; l < NLENGTHS; l++)
    for (int tanh_form = 0; tanh_form < 2; tanh_form++) {
      int64_t n = LENGTHS[l];
      float *gate = test_rand(n, 6), *up = test_rand(n, 2), *y = zeros(n), *want = zeros(n);
      tp_geglu_f32(gate, up, n, tanh_form, want);
      if (tp_cuda_geglu_f32(gate, up, n, tanh_form, y, stream()) != TP_KERNEL_OK) fail("tp_cuda_geglu_f32");
      char what[64];
      snprintf(what, sizeof what, "n=%lld tanh=%d", (long long)n, tanh_form);
      check_close(what, y, want, n, ELEMENTWISE);
      test_free(gate), test_free(up), test_free(y), test_free(want);
    }
}

static void geglu_bwd(void) {
  for (int l = 0; l < NLENGTHS; l++)
    for (int tanh_form = 0; tanh_form < 2; tanh_form++) {
      int64_t n = LENGTHS[l];
      float *gate = test_rand(n, 6), *up = test_rand(n, 2), *dy = test_rand(n, 1);
      float *dg = zeros(n), *du = zeros(n), *want_dg = zeros(n), *want_du = zeros(n);
      tp_geglu_backward_f32(dy, gate, up, n, tanh_form, want_dg, want_du);
      if (tp_cuda_geglu_backward_f32(dy, gate, up, n, tanh_form, dg, du, stream()) != TP_KERNEL_OK)
        fail("tp_cuda_geglu_backward_f32");
      char what[64];
      snprintf(what, sizeof what, "dgate n=%lld tanh=%d", (long long)n, tanh_form);
      check_close(what, dg, want_dg, n, tanh_form ? GELU_TANH_BWD : ELEMENTWISE);
      snprintf(what, sizeof what, "dup n=%lld tanh=%d", (long long)n, tanh_form);
      check_close(what, du, want_du, n, ELEMENTWISE);
      if (tp_cuda_geglu_backward_f32(dy, gate, up, n, tanh_form, NULL, du, stream()) !=
          TP_KERNEL_OK) /* one result */
        fail("tp_cuda_geglu_backward_f32");
      check_close(what, du, want_du, n, ELEMENTWISE);
      test_free(gate), test_free(up), test_free(dy), test_free(dg), test_free(du), test_free(want_dg),
          test_free(want_du);
    }
}

/* A kernel's bad-index flag, in memory the kernel can write. */
static int64_t *test_scalar_i64(int64_t value) {
  int64_t *p = test_alloc(sizeof *p);
  *p = value;
  return p;
}

/* (positions, vocabulary, width) of the embedding and cross-entropy tests */
static const int64_t TABLES[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 11, 257}, {64, 300, 40}, {5, 50000, 2}};
enum { NTABLES = sizeof TABLES / sizeof TABLES[0] };

/* n ids in [-V, V), repeats likely (the scatter-add's accumulation). */
static int64_t *random_ids(int64_t n, int64_t V) {
  int64_t *ids = test_alloc((size_t)n * sizeof *ids);
  for (int64_t i = 0; i < n; i++) ids[i] = (int64_t)((frand() + 1) * (double)V) - V;
  for (int64_t i = 0; i < n; i++) ids[i] = ids[i] < -V ? -V : ids[i] >= V ? V - 1 : ids[i];
  return ids;
}

static void embedding_fwd(void) {
  for (int t = 0; t < NTABLES; t++) {
    int64_t n = TABLES[t][0], V = TABLES[t][1], C = TABLES[t][2], want_bad = -1, *bad = test_scalar_i64(INT64_MAX);
    float *table = test_rand(V * C, 1), *out = zeros(n * C), *want = zeros(n * C);
    int64_t *ids = random_ids(n, V);
    if (tp_embedding_f32(table, ids, n, V, C, want, &want_bad) != TP_KERNEL_OK) fail("tp_embedding_f32");
    tp_cuda_launch_embedding_f32(table, ids, n, V, C, out, bad, NULL);
    char what[96];
    snprintf(what, sizeof what, "n=%lld V=%lld C=%lld", (long long)n, (long long)V, (long long)C);
    check_close(what, out, want, n * C, EXACT);
    if (*bad != INT64_MAX) fail("%s: bad id reported at %lld, none is", what, (long long)*bad);
    ids[n - 1] = V, ids[n / 2] = -V - 1; /* out of range: the first one is reported */
    tp_embedding_f32(table, ids, n, V, C, want, &want_bad);
    tp_cuda_launch_embedding_f32(table, ids, n, V, C, out, bad, NULL);
    test_sync();
    if (*bad != want_bad) fail("%s: bad id at %lld, cpu says %lld", what, (long long)*bad, (long long)want_bad);
    test_free(table), test_free(out), test_free(want), test_free(ids), test_free(bad);
  }
}

/* The backward's sort (one block of 1024 threads, contiguous chunks per thread) and row
 * sums: besides TABLES, n past the block and not a multiple of it with many repeats (V
 * small), and V large next to n. */
static const int64_t BACKWARD_SHAPES[][3] = {{3000, 3, 5}, {2049, 1, 2}, {1500, 40000, 3}, {1025, 700, 9}};

static void embedding_bwd_case(int64_t n, int64_t V, int64_t C) {
  int64_t want_bad = -1, *bad = test_scalar_i64(INT64_MAX);
  float *dy = test_rand(n * C, 1), *dtable = test_rand(V * C, 1), *want = zeros(V * C);
  int64_t *ids = random_ids(n, V);
  void *scratch = test_alloc(tp_cuda_embedding_backward_scratch(n));
  TpTensor dyt = {.dtype = TP_F32, .rank = 2, .dims = {n, C}, .data = dy};
  TpTensor idt = {.dtype = TP_I64, .rank = 1, .dims = {n}, .data = ids};
  TpTensor dtt = {.dtype = TP_F32, .rank = 2, .dims = {V, C}, .data = want};
  if (tp_gather_backward(&dyt, &idt, 0, -1, &dtt, &want_bad) != TP_KERNEL_OK) fail("tp_gather_backward");
  tp_cuda_launch_embedding_backward_f32(dy, ids, false, -1, n, 1, V, C, dtable, bad, scratch, NULL);
  char what[96];
  snprintf(what, sizeof what, "backward n=%lld V=%lld C=%lld", (long long)n, (long long)V, (long long)C);
  test_sync();
  check_close(what, dtable, want, V * C, EXACT);
  if (*bad != INT64_MAX) fail("%s: bad id reported at %lld, none is", what, (long long)*bad);
  /* the row of the first id as the padding row: it stays 0 on both, the others as before */
  int64_t pad = ids[0] < 0 ? ids[0] + V : ids[0];
  if (tp_gather_backward(&dyt, &idt, 0, pad, &dtt, &want_bad) != TP_KERNEL_OK) fail("tp_gather_backward");
  tp_cuda_launch_embedding_backward_f32(dy, ids, false, pad, n, 1, V, C, dtable, bad, scratch, NULL);
  test_sync();
  for (int64_t c = 0; c < C; c++)
    if (want[pad * C + c] != 0) fail("%s: the CPU's padding row %lld is not 0", what, (long long)pad);
  check_close(what, dtable, want, V * C, EXACT);
  ids[n - 1] = -V - 3; /* below -V: skipped, its position reported */
  tp_cuda_launch_embedding_backward_f32(dy, ids, false, -1, n, 1, V, C, dtable, bad, scratch, NULL);
  test_sync();
  if (*bad != n - 1) fail("%s: bad id at %lld, want %lld", what, (long long)*bad, (long long)(n - 1));
  ids[n / 2] = V; /* the smallest position of the two */
  tp_cuda_launch_embedding_backward_f32(dy, ids, false, -1, n, 1, V, C, dtable, bad, scratch, NULL);
  test_sync();
  if (*bad != n / 2) fail("%s: bad id at %lld, want %lld", what, (long long)*bad, (long long)(n / 2));
  /* the others' rows are still the CPU's (which skips nothing, so zero those two dy rows) */
  memset(dy + (n - 1) * C, 0, (size_t)C * sizeof *dy), memset(dy + n / 2 * C, 0, (size_t)C * sizeof *dy);
  ids[n - 1] = ids[n / 2] = 0;
  tp_gather_backward(&dyt, &idt, 0, -1, &dtt, &want_bad);
  check_close(what, dtable, want, V * C, EXACT);
  test_free(dy), test_free(dtable), test_free(want), test_free(ids), test_free(bad), test_free(scratch);
}

static void embedding_bwd(void) {
  for (int t = 0; t < NTABLES; t++) embedding_bwd_case(TABLES[t][0], TABLES[t][1], TABLES[t][2]);
  for (size_t t = 0; t < sizeof BACKWARD_SHAPES / sizeof *BACKWARD_SHAPES; t++)
    embedding_bwd_case(BACKWARD_SHAPES[t][0], BACKWARD_SHAPES[t][1], BACKWARD_SHAPES[t][2]);
}

/* targets in [0, V) */
static int64_t *random_targets(int64_t R, int64_t V) {
  int64_t *t = random_ids(R, V);
  for (int64_t r = 0; r < R; r++) t[r] = t[r] < 0 ? t[r] + V : t[r];
  return t;
}

static void cross_entropy_fwd(void) {
  for (int c = 0; c < NTABLES; c++) {
    int64_t R = TABLES[c][0], V = TABLES[c][1], want_bad = -1, *bad = test_scalar_i64(INT64_MAX);
    float *logits = test_rand(R * V, 10), *loss = test_alloc(sizeof *loss), want = 0;
    int64_t *targets = random_targets(R, V);
    double *row_loss = test_alloc((size_t)R * sizeof *row_loss);
    if (tp_cross_entropy_f32(logits, targets, R, V, (float)R, &want, &want_bad) != TP_KERNEL_OK)
      fail("tp_cross_entropy_f32");
    tp_cuda_launch_cross_entropy_f32(logits, targets, R, V, 0, (float)R, loss, row_loss, bad, NULL);
    char what[96];
    snprintf(what, sizeof what, "R=%lld V=%lld", (long long)R, (long long)V);
    /* the rows' sums of exp in float against the CPU's in double: ROW */
    check_close(what, loss, &want, 1, ROW);
    if (*bad != INT64_MAX) fail("%s: bad target reported at %lld, none is", what, (long long)*bad);
    targets[R - 1] = V, targets[R / 2] = -1;
    tp_cross_entropy_f32(logits, targets, R, V, (float)R, &want, &want_bad);
    tp_cuda_launch_cross_entropy_f32(logits, targets, R, V, 0, (float)R, loss, row_loss, bad, NULL);
    test_sync();
    if (*bad != want_bad) fail("%s: bad target at %lld, cpu says %lld", what, (long long)*bad, (long long)want_bad);
    test_free(logits), test_free(targets), test_free(row_loss), test_free(loss), test_free(bad);
  }
}

static void cross_entropy_bwd(void) {
  for (int c = 0; c < NTABLES; c++) {
    int64_t R = TABLES[c][0], V = TABLES[c][1], want_bad = -1, *bad = test_scalar_i64(INT64_MAX);
    float *logits = test_rand(R * V, 10), *d = zeros(R * V), *want = zeros(R * V),
          *dloss = test_alloc(sizeof *dloss);
    int64_t *targets = random_targets(R, V);
    *dloss = 0.75f;
    if (tp_cross_entropy_backward_f32(*dloss, logits, targets, R, V, (float)R, want, &want_bad) != TP_KERNEL_OK)
      fail("tp_cross_entropy_backward_f32");
    tp_cuda_launch_cross_entropy_backward_f32(dloss, logits, targets, R, V, 0, (float)R, d, bad, NULL);
    char what[96];
    snprintf(what, sizeof what, "R=%lld V=%lld", (long long)R, (long long)V);
    check_close(what, d, want, R * V, ROW);
    if (*bad != INT64_MAX) fail("%s: bad target reported at %lld, none is", what, (long long)*bad);
    test_free(logits), test_free(d), test_free(want), test_free(targets), test_free(dloss), test_free(bad);
  }
}

/* A padded vocabulary (vocab_pad, not split): rows of V columns whose last pad are padding.
 * The CPU's padded kernels give the bits of the plain ones on the rows without the padding
 * (dlogits 0 there); the CUDA launches agree with them as the plain ones do; a target in
 * the padding is bad. */
static void cross_entropy_pad(void) {
  for (int c = 0; c < NTABLES; c++) {
    int64_t R = TABLES[c][0], V = TABLES[c][1] + 3, pad = 3, K = V - pad, want_bad = -1,
            *bad = test_scalar_i64(INT64_MAX);
    float *logits = test_rand(R * V, 10), *tight = zeros(R * K), *loss = test_alloc(sizeof *loss), want = 0,
          plain = 0, *d = zeros(R * V), *dwant = zeros(R * V), *dplain = zeros(R * K),
          *dloss = test_alloc(sizeof *dloss);
    int64_t *targets = random_targets(R, K);
    double *row_loss = test_alloc((size_t)R * sizeof *row_loss);
    *dloss = 0.75f;
    for (int64_t r = 0; r < R; r++) memcpy(tight + r * K, logits + r * V, (size_t)K * sizeof *tight);
    char what[96];
    snprintf(what, sizeof what, "R=%lld V=%lld pad=%lld", (long long)R, (long long)V, (long long)pad);
    if (tp_cross_entropy_pad_f32(logits, targets, R, V, pad, (float)R, &want, &want_bad) != TP_KERNEL_OK ||
        tp_cross_entropy_f32(tight, targets, R, K, (float)R, &plain, &want_bad) != TP_KERNEL_OK ||
        tp_cross_entropy_backward_pad_f32(*dloss, logits, targets, R, V, pad, (float)R, dwant, &want_bad) !=
            TP_KERNEL_OK ||
        tp_cross_entropy_backward_f32(*dloss, tight, targets, R, K, (float)R, dplain, &want_bad) != TP_KERNEL_OK)
      fail("%s: the CPU kernels", what);
    check_close(what, &want, &plain, 1, EXACT);
    for (int64_t r = 0; r < R; r++) {
      check_close(what, dwant + r * V, dplain + r * K, K, EXACT);
      for (int64_t j = K; j < V; j++)
        if (dwant[r * V + j] != 0)
          fail("%s: the CPU's dlogits[%lld, %lld] in the padding is %g", what, (long long)r, (long long)j,
               dwant[r * V + j]);
    }
    tp_cuda_launch_cross_entropy_f32(logits, targets, R, V, pad, (float)R, loss, row_loss, bad, NULL);
    tp_cuda_launch_cross_entropy_backward_f32(dloss, logits, targets, R, V, pad, (float)R, d, bad, NULL);
    test_sync();
    check_close(what, loss, &want, 1, ROW);
    check_close(what, d, dwant, R * V, ROW);
    for (int64_t j = 0; j < R * V; j++)
      if (j % V >= K && d[j] != 0) fail("%s: dlogits[%lld] in the padding is %g", what, (long long)j, d[j]);
    if (*bad != INT64_MAX) fail("%s: bad target reported at %lld, none is", what, (long long)*bad);
    targets[R - 1] = K; /* the first padded class */
    if (tp_cross_entropy_pad_f32(logits, targets, R, V, pad, (float)R, &want, &want_bad) != TP_KERNEL_BAD_INDEX)
      fail("%s: the CPU takes a target in the padding", what);
    tp_cuda_launch_cross_entropy_f32(logits, targets, R, V, pad, (float)R, loss, row_loss, bad, NULL);
    test_sync();
    if (*bad != want_bad) fail("%s: bad target at %lld, cpu says %lld", what, (long long)*bad, (long long)want_bad);
    test_free(logits), test_free(tight), test_free(loss), test_free(d), test_free(dwant), test_free(dplain);
    test_free(dloss), test_free(targets), test_free(row_loss), test_free(bad);
  }
}

static void adamw(void) {
  for (int l = 0; l < NLENGTHS; l++) {
    int64_t n = LENGTHS[l];
    float *w = test_rand(n, 1), *m = zeros(n), *v = zeros(n);
    float *ww = test_alloc((size_t)n * sizeof *ww), *wm = zeros(n), *wv = zeros(n);
    memcpy(ww, w, (size_t)n * sizeof *w);
    for (int64_t step = 1; step <= 3; step++) { /* the bias corrections change with the step */
      float *g = test_rand(n, 1);
      tp_adamw_step(ww, g, wm, wv, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, step);
      tp_cuda_launch_adamw_step(w, g, m, v, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, step, NULL);
      test_free(g);
    }
    char what[64];
    snprintf(what, sizeof what, "w n=%lld", (long long)n);
    check_close(what, w, ww, n, EXACT);
    snprintf(what, sizeof what, "m n=%lld", (long long)n);
    check_close(what, m, wm, n, EXACT);
    snprintf(what, sizeof what, "v n=%lld", (long long)n);
    check_close(what, v, wv, n, EXACT);
    test_free(w), test_free(m), test_free(v), test_free(ww), test_free(wm), test_free(wv);
  }
}

/* The pieces, added on the host in order as the trainer does, against tp_sum_squares_f32; a
 * range of pieces alone gives the same bits as within all of them. */
static void sum_squares(void) {
  const int64_t lengths[] = {0, 1, 63, 64, 65, 4099, 100003};
  for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++) {
    int64_t n = lengths[l];
    float *x = test_rand(n, 3);
    double *pieces = test_alloc(TP_CUDA_SUM_PIECES * sizeof *pieces), *some = test_alloc(5 * sizeof *some);
    double want = tp_sum_squares_f32(x, n), got = 0;
    tp_cuda_launch_sum_squares_pieces_f32(x, n, 0, TP_CUDA_SUM_PIECES, pieces, NULL);
    tp_cuda_launch_sum_squares_pieces_f32(x, n, 30, 5, some, NULL);
    test_sync();
    for (int p = 0; p < TP_CUDA_SUM_PIECES; p++) got += pieces[p];
    if (!(fabs(got - want) <= SUM.rtol * fabs(want)))
      fail("n=%lld: sum of squares %.17g, cpu %.17g", (long long)n, got, want);
    if (memcmp(some, pieces + 30, 5 * sizeof *some) != 0) fail("n=%lld: pieces 30..34 alone differ", (long long)n);
    test_free(x), test_free(pieces), test_free(some);
  }
}

static void scale(void) {
  for (int l = 0; l < NLENGTHS; l++) {
    int64_t n = LENGTHS[l];
    float *x = test_rand(n, 3), *want = test_alloc((size_t)n * sizeof *want), *s = test_alloc(sizeof *s);
    *s = 0.37f;
    memcpy(want, x, (size_t)n * sizeof *x);
    tp_scale_f32(want, n, *s);
    tp_cuda_launch_scale_f32(x, n, s, NULL);
    char what[64];
    snprintf(what, sizeof what, "n=%lld", (long long)n);
    check_close(what, x, want, n, EXACT);
    test_free(x), test_free(want), test_free(s);
  }
}

/* one ctest each (tests/cuda/CMakeLists.txt reads the names from here) */
/* The vocabulary-parallel kernels, range by range (2 and 3 ranges of TABLES' V each),
 * against the CPU's: the embedding's lookup and scatter-add EXACT, the statistics ROW (the
 * float sum of exp against the CPU's double); the loss and dlogits from the same summed
 * statistics SUM and ROW. Ids and targets are over the whole vocabulary, so most fall
 * outside a range. */
static void embedding_part(void) {
  for (int t = 0; t < NTABLES; t++)
    for (int64_t parts = 2; parts <= 3; parts++) {
      int64_t n = TABLES[t][0], V = TABLES[t][1], C = TABLES[t][2], want_bad = -1, *bad = test_scalar_i64(INT64_MAX);
      int64_t *ids = random_ids(n, V * parts), *part = test_scalar_i64(parts - 1);
      float *table = test_rand(V * C, 1), *out = zeros(n * C), *want = zeros(n * C), *dy = test_rand(n * C, 1);
      float *dtable = test_rand(V * C, 1), *dwant = zeros(V * C);
      void *scratch = test_alloc(tp_cuda_embedding_backward_scratch(n));
      char what[96];
      snprintf(what, sizeof what, "range %lld of %lld: n=%lld V=%lld C=%lld", (long long)*part, (long long)parts,
               (long long)n, (long long)V, (long long)C);
      if (tp_embedding_part_f32(table, ids, part, n, V, parts, C, want, &want_bad) ||
          tp_embedding_part_backward_f32(dy, ids, part, n, V, parts, C, dwant, &want_bad))
        fail("%s: the cpu refused", what);
      tp_cuda_launch_embedding_part_f32(table, ids, part, n, V, parts, C, out, bad, NULL);
      tp_cuda_launch_embedding_part_backward_f32(dy, ids, part, n, V, parts, C, dtable, bad, scratch, NULL);
      test_sync();
      check_close(what, out, want, n * C, EXACT);
      check_close(what, dtable, dwant, V * C, EXACT);
      if (*bad != INT64_MAX) fail("%s: bad id reported at %lld, none is", what, (long long)*bad);
      ids[n - 1] = V * parts; /* outside the whole table: reported */
      tp_embedding_part_f32(table, ids, part, n, V, parts, C, want, &want_bad);
      tp_cuda_launch_embedding_part_f32(table, ids, part, n, V, parts, C, out, bad, NULL);
      test_sync();
      if (*bad != want_bad) fail("%s: bad id at %lld, cpu says %lld", what, (long long)*bad, (long long)want_bad);
      test_free(ids), test_free(part), test_free(table), test_free(out), test_free(want), test_free(dy);
      test_free(dtable), test_free(dwant), test_free(scratch), test_free(bad);
    }
}

/* The last range's kernels, of a whole vocabulary (pad 0) and of a padded one (pad 1: its
 * last column padding, which the statistics leave out and the backward gives 0). */
static void cross_entropy_parts(void) {
  for (int c = 0; c < NTABLES; c++)
    for (int64_t parts = 2; parts <= 3; parts++)
      for (int64_t pad = 0; pad <= (TABLES[c][1] > 1 ? 1 : 0); pad++) {
        int64_t R = TABLES[c][0], V = TABLES[c][1], W = 2 * parts + 1, want_bad = -1,
                *bad = test_scalar_i64(INT64_MAX);
        int64_t *targets = random_targets(R, V * parts - pad), *part = test_scalar_i64(parts - 1);
        float *logits = test_rand(R * V, 10), *stats = zeros(R * W), *want = zeros(R * W), *loss = zeros(1),
              want_loss;
        float *d = zeros(R * V), *dwant = zeros(R * V), *dloss = zeros(1);
        double *row_loss = test_alloc((size_t)R * sizeof *row_loss);
        *dloss = 0.75f;
        char what[96];
        snprintf(what, sizeof what, "range %lld of %lld: R=%lld V=%lld pad %lld", (long long)*part, (long long)parts,
                 (long long)R, (long long)V, (long long)pad);
        if (tp_cross_entropy_stats_pad_f32(logits, targets, part, R, V, parts, pad, want, &want_bad))
          fail("%s: cpu stats", what);
        tp_cuda_launch_cross_entropy_stats_f32(logits, targets, part, R, V, parts, pad, stats, bad, NULL);
        test_sync();
        check_close(what, stats, want, R * W, ROW);
        for (int64_t r = 0; r < R; r++) /* the other ranges' statistics, as the AllReduce would bring them */
          for (int64_t p = 0; p < parts - 1; p++) want[r * W + p] = frand(), want[r * W + parts + p] = 2 + frand();
        tp_cross_entropy_parts_f32(want, R, parts, (float)R, &want_loss);
        tp_cross_entropy_parts_backward_pad_f32(*dloss, logits, targets, want, part, R, V, parts, pad, (float)R,
                                                dwant, &want_bad);
        tp_cuda_launch_cross_entropy_parts_f32(want, R, parts, (float)R, loss, row_loss, NULL);
        tp_cuda_launch_cross_entropy_parts_backward_f32(dloss, logits, targets, want, part, R, V, parts, pad,
                                                        (float)R, d, bad, NULL);
        test_sync();
        check_close(what, loss, &want_loss, 1, SUM);
        check_close(what, d, dwant, R * V, ROW);
        for (int64_t r = 0; pad && r < R; r++)
          if (d[r * V + V - 1] != 0)
            fail("%s: row %lld's padded class has dlogit %g", what, (long long)r, (double)d[r * V + V - 1]);
        if (*bad != INT64_MAX) fail("%s: bad target reported at %lld, none is", what, (long long)*bad);
        targets[R - 1] = V * parts - pad; /* past the true classes: reported */
        tp_cross_entropy_stats_pad_f32(logits, targets, part, R, V, parts, pad, want, &want_bad);
        tp_cuda_launch_cross_entropy_stats_f32(logits, targets, part, R, V, parts, pad, stats, bad, NULL);
        test_sync();
        if (*bad != want_bad || want_bad != R - 1)
          fail("%s: bad target at %lld, cpu says %lld", what, (long long)*bad, (long long)want_bad);
        test_free(targets), test_free(part), test_free(logits), test_free(stats), test_free(want), test_free(loss);
        test_free(d), test_free(dwant), test_free(dloss), test_free(row_loss), test_free(bad);
      }
}

static const CudaTest TESTS[] = {
    {"rmsnorm_fwd", rmsnorm_fwd},
    {"rmsnorm_bwd", rmsnorm_bwd},
    {"layernorm_fwd", layernorm_fwd},
    {"layernorm_bwd", layernorm_bwd},
    {"column_sums", column_sums},
    {"softmax_fwd", softmax_fwd},
    {"softmax_bwd", softmax_bwd},
    {"gelu_fwd", gelu_fwd},
    {"gelu_bwd", gelu_bwd},
    {"swiglu_fwd", swiglu_fwd},
    {"swiglu_bwd", swiglu_bwd},
    {"geglu_fwd", geglu_fwd},
    {"geglu_bwd", geglu_bwd},
    {"embedding_fwd", embedding_fwd},
    {"embedding_bwd", embedding_bwd},
    {"cross_entropy_fwd", cross_entropy_fwd},
    {"cross_entropy_bwd", cross_entropy_bwd},
    {"cross_entropy_pad", cross_entropy_pad},
    {"embedding_part", embedding_part},
    {"cross_entropy_parts", cross_entropy_parts},
    {"adamw", adamw},
    {"sum_squares", sum_squares},
    {"scale", scale},
};

int main(int argc, char **argv) {
  return run_named_test("test_cuda_transformer", TESTS, sizeof TESTS / sizeof *TESTS, argc, argv);
}
