/* Unit tests of the elementwise, layout and reduction CPU kernels (runtime/cpu/elementwise,
 * layout, reduce; TopK and the ops computed from constants) against hand-computed values,
 * including the multi-threaded paths on large tensors. */
#include "runtime/cpu/elementwise.h"
#include "runtime/cpu/layout.h"
#include "runtime/cpu/reduce.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond)                                                                                                 \
  do {                                                                                                              \
    if (!(cond)) {                                                                                                  \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                      \
      failures++;                                                                                                   \
    }                                                                                                               \
  } while (0)

static TpTensor T(TpDType t, int rank, const int64_t *dims, void *data) {
  TpTensor x = {t, rank, {0}, data};
  if (rank) memcpy(x.dims, dims, (size_t)rank * sizeof *dims);
  return x;
}

/* Compares n floats, reporting the first mismatch. */
static void check_f32(const char *what, const float *got, const float *want, int64_t n, float tol) {
  for (int64_t i = 0; i < n; i++)
    if (got[i] != want[i] && !(fabsf(got[i] - want[i]) <= tol) && !(isnan(got[i]) && isnan(want[i]))) {
      fprintf(stderr, "%s: element %lld is %g, expected %g\n", what, (long long)i, got[i], want[i]);
      failures++;
      return;
    }
}

static void check_i64(const char *what, const int64_t *got, const int64_t *want, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      fprintf(stderr, "%s: element %lld is %lld, expected %lld\n", what, (long long)i, (long long)got[i],
              (long long)want[i]);
      failures++;
      return;
    }
}

static void test_binary(void) {
  float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {10, 20, 30}, y[6];
  TpTensor ta = T(TP_F32, 2, (int64_t[]){2, 3}, a), tb = T(TP_F32, 1, (int64_t[]){3}, b);
  TpTensor ty = T(TP_F32, 2, (int64_t[]){2, 3}, y);
  CHECK(tp_binary(TP_BINARY_SUB, &ta, &tb, &ty) == TP_KERNEL_OK);
  check_f32("sub bcast", y, (float[]){-9, -18, -27, -6, -15, -24}, 6, 0);

  /* [2,1] * [1,3] -> [2,3]: both operands broadcast */
  float c[2] = {2, 3};
  TpTensor tc = T(TP_F32, 2, (int64_t[]){2, 1}, c), tb2 = T(TP_F32, 2, (int64_t[]){1, 3}, b);
  CHECK(tp_binary(TP_BINARY_MUL, &tc, &tb2, &ty) == TP_KERNEL_OK);
  check_f32("mul outer", y, (float[]){20, 40, 60, 30, 60, 90}, 6, 0);

  /* incompatible shapes and dtypes are refused */
  TpTensor bad = T(TP_F32, 1, (int64_t[]){2}, c);
  CHECK(tp_binary(TP_BINARY_ADD, &ta, &bad, &ty) == TP_KERNEL_BAD_SHAPE);
  int32_t i3[3] = {1, 2, 3};
  TpTensor ti3 = T(TP_I32, 1, (int64_t[]){3}, i3);
  CHECK(tp_binary(TP_BINARY_ADD, &ta, &ti3, &ty) == TP_KERNEL_BAD_DTYPE);

  /* integer division truncates toward zero; x/0 gives 0 */
  int32_t n[5] = {-7, 7, -7, 5, 7}, dv[5] = {2, -2, -2, 0, -1}, q[5];
  TpTensor tn = T(TP_I32, 1, (int64_t[]){5}, n), td = T(TP_I32, 1, (int64_t[]){5}, dv);
  TpTensor tq = T(TP_I32, 1, (int64_t[]){5}, q);
  CHECK(tp_binary(TP_BINARY_DIV, &tn, &td, &tq) == TP_KERNEL_OK);
  CHECK(q[0] == -3 && q[1] == -3 && q[2] == 3 && q[3] == 0 && q[4] == -7);

  /* u8 wraps */
  uint8_t u1[2] = {250, 3}, u2[2] = {10, 5}, u3[2];
  TpTensor tu1 = T(TP_U8, 1, (int64_t[]){2}, u1), tu2 = T(TP_U8, 1, (int64_t[]){2}, u2);
  TpTensor tu3 = T(TP_U8, 1, (int64_t[]){2}, u3);
  CHECK(tp_binary(TP_BINARY_ADD, &tu1, &tu2, &tu3) == TP_KERNEL_OK);
  CHECK(u3[0] == 4 && u3[1] == 8);
  CHECK(tp_binary(TP_BINARY_SUB, &tu2, &tu1, &tu3) == TP_KERNEL_OK);
  CHECK(u3[0] == 16 && u3[1] == 2);

  /* Pow: mixed dtypes, result has the base's dtype */
  int64_t base[3] = {2, -3, 5}, ie[3] = {10, 3, 0}, ip[3];
  float fe[3] = {0.5f, 2.0f, 1.5f};
  TpTensor tbase = T(TP_I64, 1, (int64_t[]){3}, base), tie = T(TP_I64, 1, (int64_t[]){3}, ie);
  TpTensor tfe = T(TP_F32, 1, (int64_t[]){3}, fe), tip = T(TP_I64, 1, (int64_t[]){3}, ip);
  CHECK(tp_binary(TP_BINARY_POW, &tbase, &tie, &tip) == TP_KERNEL_OK);
  check_i64("pow i64^i64", ip, (int64_t[]){1024, -27, 1}, 3);
  CHECK(tp_binary(TP_BINARY_POW, &tbase, &tfe, &tip) == TP_KERNEL_OK);
  check_i64("pow i64^f32", ip, (int64_t[]){1, 9, 11}, 3); /* trunc(1.414), 9, trunc(11.18) */
  float fb[3] = {2, -3, 0.5f}, fp[3];
  TpTensor tfb = T(TP_F32, 1, (int64_t[]){3}, fb), tfp = T(TP_F32, 1, (int64_t[]){3}, fp);
  CHECK(tp_binary(TP_BINARY_POW, &tfb, &tie, &tfp) == TP_KERNEL_OK);
  check_f32("pow f32^i64", fp, (float[]){1024, -27, 1}, 3, 0);

  /* comparisons -> bool, NaN compares false */
  float l[4] = {1, 2, NAN, 4}, r[4] = {2, 2, 1, 3};
  uint8_t out[4];
  TpTensor tl = T(TP_F32, 1, (int64_t[]){4}, l), tr = T(TP_F32, 1, (int64_t[]){4}, r);
  TpTensor to = T(TP_BOOL, 1, (int64_t[]){4}, out);
  CHECK(tp_binary(TP_BINARY_LESS, &tl, &tr, &to) == TP_KERNEL_OK);
  CHECK(out[0] == 1 && out[1] == 0 && out[2] == 0 && out[3] == 0);
  CHECK(tp_binary(TP_BINARY_LESS_EQUAL, &tl, &tr, &to) == TP_KERNEL_OK);
  CHECK(out[0] == 1 && out[1] == 1 && out[2] == 0 && out[3] == 0);
  CHECK(tp_binary(TP_BINARY_GREATER, &tl, &tr, &to) == TP_KERNEL_OK);
  CHECK(out[0] == 0 && out[1] == 0 && out[2] == 0 && out[3] == 1);
  int64_t e1[3] = {-1, 5, 7}, e2[1] = {5};
  TpTensor te1 = T(TP_I64, 1, (int64_t[]){3}, e1), te2 = T(TP_I64, 1, (int64_t[]){1}, e2);
  TpTensor to3 = T(TP_BOOL, 1, (int64_t[]){3}, out);
  CHECK(tp_binary(TP_BINARY_EQUAL, &te1, &te2, &to3) == TP_KERNEL_OK);
  CHECK(out[0] == 0 && out[1] == 1 && out[2] == 0);
  CHECK(tp_binary(TP_BINARY_LESS, &te1, &te2, &to3) == TP_KERNEL_OK);
  CHECK(out[0] == 1 && out[1] == 0 && out[2] == 0); /* signed: -1 < 5 */
  uint8_t b1[4] = {0, 1, 0, 1}, b2[2] = {0, 1}, bo[4];
  TpTensor tb1 = T(TP_BOOL, 2, (int64_t[]){2, 2}, b1), tb2b = T(TP_BOOL, 1, (int64_t[]){2}, b2);
  TpTensor tbo = T(TP_BOOL, 2, (int64_t[]){2, 2}, bo);
  CHECK(tp_binary(TP_BINARY_AND, &tb1, &tb2b, &tbo) == TP_KERNEL_OK);
  CHECK(bo[0] == 0 && bo[1] == 1 && bo[2] == 0 && bo[3] == 1);

  /* f16 goes through double and rounds back */
  uint16_t h1[2] = {tp_f32_to_f16(1.5f), tp_f32_to_f16(-2)}, h2[2] = {tp_f32_to_f16(0.25f), tp_f32_to_f16(3)}, h3[2];
  TpTensor th1 = T(TP_F16, 1, (int64_t[]){2}, h1), th2 = T(TP_F16, 1, (int64_t[]){2}, h2);
  TpTensor th3 = T(TP_F16, 1, (int64_t[]){2}, h3);
  CHECK(tp_binary(TP_BINARY_MUL, &th1, &th2, &th3) == TP_KERNEL_OK);
  CHECK(tp_f16_to_f32(h3[0]) == 0.375f && tp_f16_to_f32(h3[1]) == -6);
}

/* A broadcast big enough to be split across threads, with a run boundary inside chunks. */
static void test_binary_large(void) {
  enum { R = 301, C = 217 };
  float *a = malloc(R * C * sizeof *a), *b = malloc(C * sizeof *b), *y = malloc(R * C * sizeof *y);
  for (int i = 0; i < R * C; i++) a[i] = (float)i;
  for (int j = 0; j < C; j++) b[j] = (float)(j * 1000);
  TpTensor ta = T(TP_F32, 2, (int64_t[]){R, C}, a), tb = T(TP_F32, 2, (int64_t[]){1, C}, b);
  TpTensor ty = T(TP_F32, 2, (int64_t[]){R, C}, y);
  CHECK(tp_binary(TP_BINARY_ADD, &tb, &ta, &ty) == TP_KERNEL_OK);
  int bad = -1;
  for (int i = 0; i < R * C && bad < 0; i++)
    if (y[i] != a[i] + b[i % C]) bad = i;
  if (bad >= 0) fprintf(stderr, "large add: first mismatch at %d\n", bad);
  CHECK(bad < 0);
  free(a);
  free(b);
  free(y);
}

static void test_unary(void) {
  float x[5] = {-2, -0.5f, 0, 1, 3}, y[5];
  TpTensor tx = T(TP_F32, 1, (int64_t[]){5}, x), ty = T(TP_F32, 1, (int64_t[]){5}, y);
  CHECK(tp_unary(TP_UNARY_SIGMOID, &tx, &ty) == TP_KERNEL_OK);
  check_f32("sigmoid", y, (float[]){0.11920292f, 0.37754067f, 0.5f, 0.73105858f, 0.95257413f}, 5, 1e-6f);
  CHECK(tp_unary(TP_UNARY_GELU, &tx, &ty) == TP_KERNEL_OK);
  check_f32("gelu", y, (float[]){-0.04550026f, -0.15426877f, 0, 0.84134475f, 2.99595031f}, 5, 1e-6f);
  CHECK(tp_unary(TP_UNARY_GELU_TANH, &tx, &ty) == TP_KERNEL_OK);
  check_f32("gelu tanh", y, (float[]){-0.04540231f, -0.15428599f, 0, 0.84119199f, 2.99636261f}, 5, 1e-6f);
  CHECK(tp_unary(TP_UNARY_RELU, &tx, &ty) == TP_KERNEL_OK);
  check_f32("relu", y, (float[]){0, 0, 0, 1, 3}, 5, 0);
  float nan_in = NAN, nan_out = 0;
  TpTensor tnan = T(TP_F32, 0, NULL, &nan_in), tnan_out = T(TP_F32, 0, NULL, &nan_out);
  CHECK(tp_unary(TP_UNARY_RELU, &tnan, &tnan_out) == TP_KERNEL_OK && isnan(nan_out)); /* NaN propagates */
  CHECK(tp_unary(TP_UNARY_RECIPROCAL, &tx, &ty) == TP_KERNEL_OK);
  check_f32("reciprocal", y, (float[]){-0.5f, -2, INFINITY, 1, 1.0f / 3}, 5, 0);
  double xd[2] = {4, 1}, yd[2];
  TpTensor txd = T(TP_F64, 1, (int64_t[]){2}, xd), tyd = T(TP_F64, 1, (int64_t[]){2}, yd);
  CHECK(tp_unary(TP_UNARY_SQRT, &txd, &tyd) == TP_KERNEL_OK);
  CHECK(yd[0] == 2 && yd[1] == 1);
  CHECK(tp_unary(TP_UNARY_LOG, &txd, &tyd) == TP_KERNEL_OK);
  CHECK(fabs(yd[0] - 1.3862943611198906) < 1e-15 && yd[1] == 0);
  int32_t xi[3] = {-4, 0, 9}, yi[3];
  TpTensor txi = T(TP_I32, 1, (int64_t[]){3}, xi), tyi = T(TP_I32, 1, (int64_t[]){3}, yi);
  CHECK(tp_unary(TP_UNARY_NEG, &txi, &tyi) == TP_KERNEL_OK);
  CHECK(yi[0] == 4 && yi[1] == 0 && yi[2] == -9);
  CHECK(tp_unary(TP_UNARY_RELU, &txi, &tyi) == TP_KERNEL_OK);
  CHECK(yi[0] == 0 && yi[1] == 0 && yi[2] == 9);
  CHECK(tp_unary(TP_UNARY_EXP, &txi, &tyi) == TP_KERNEL_BAD_DTYPE);
  uint8_t bx[2] = {0, 1}, by[2];
  TpTensor tbx = T(TP_BOOL, 1, (int64_t[]){2}, bx), tby = T(TP_BOOL, 1, (int64_t[]){2}, by);
  CHECK(tp_unary(TP_UNARY_NOT, &tbx, &tby) == TP_KERNEL_OK);
  CHECK(by[0] == 1 && by[1] == 0);
  uint16_t hx[1] = {tp_f32_to_bf16(-3)}, hy[1];
  TpTensor thx = T(TP_BF16, 1, (int64_t[]){1}, hx), thy = T(TP_BF16, 1, (int64_t[]){1}, hy);
  CHECK(tp_unary(TP_UNARY_NEG, &thx, &thy) == TP_KERNEL_OK);
  CHECK(tp_bf16_to_f32(hy[0]) == 3);
}

static void test_where_cast(void) {
  uint8_t cond[3] = {1, 0, 1};
  float a[2] = {1, 2}, b = -1, y[6];
  TpTensor tc = T(TP_BOOL, 2, (int64_t[]){1, 3}, cond), ta = T(TP_F32, 2, (int64_t[]){2, 1}, a);
  TpTensor tb = T(TP_F32, 0, NULL, &b), ty = T(TP_F32, 2, (int64_t[]){2, 3}, y);
  CHECK(tp_where(&tc, &ta, &tb, &ty) == TP_KERNEL_OK);
  check_f32("where", y, (float[]){1, -1, 1, 2, -1, 2}, 6, 0);

  float f[6] = {-1.7f, 2.9f, NAN, 1e10f, -1e10f, 0.5f};
  int32_t i[6];
  TpTensor tf = T(TP_F32, 1, (int64_t[]){6}, f), ti = T(TP_I32, 1, (int64_t[]){6}, i);
  CHECK(tp_cast(&tf, &ti) == TP_KERNEL_OK);
  CHECK(i[0] == -1 && i[1] == 2 && i[2] == 0 && i[3] == INT32_MAX && i[4] == INT32_MIN && i[5] == 0);
  uint8_t bo[6];
  TpTensor tbo = T(TP_BOOL, 1, (int64_t[]){6}, bo);
  CHECK(tp_cast(&tf, &tbo) == TP_KERNEL_OK);
  CHECK(bo[0] == 1 && bo[5] == 1);
  int64_t big = (1LL << 40) + 3;
  float g;
  TpTensor tbig = T(TP_I64, 0, NULL, &big), tg = T(TP_F32, 0, NULL, &g);
  CHECK(tp_cast(&tbig, &tg) == TP_KERNEL_OK);
  CHECK(g == (float)big);
  /* f64 -> f16 rounds once: 1 + 2^-11 + 2^-40 is above the halfway point 1 + 2^-11, so it
   * rounds up to 1 + 2^-10 (a cast through f32 would round to 1 + 2^-11, then to 1). */
  double d = 1 + ldexp(1, -11) + ldexp(1, -40);
  uint16_t h;
  TpTensor td = T(TP_F64, 0, NULL, &d), th = T(TP_F16, 0, NULL, &h);
  CHECK(tp_cast(&td, &th) == TP_KERNEL_OK);
  CHECK(tp_f16_to_f32(h) == 1 + ldexp(1, -10));
  int8_t s8 = -1;
  uint16_t u16;
  TpTensor ts8 = T(TP_I8, 0, NULL, &s8), tu16 = T(TP_U16, 0, NULL, &u16);
  CHECK(tp_cast(&ts8, &tu16) == TP_KERNEL_OK);
  CHECK(u16 == 0xffff);
}

static void test_layout(void) {
  /* Gather axis 1 of [2,3] with indices [[2,-3]] -> [2,1,2] */
  float data[6] = {0, 1, 2, 10, 11, 12}, y[4];
  int64_t idx[2] = {2, -3}, bad = 0;
  TpTensor td = T(TP_F32, 2, (int64_t[]){2, 3}, data), ti = T(TP_I64, 2, (int64_t[]){1, 2}, idx);
  TpTensor ty = T(TP_F32, 3, (int64_t[]){2, 1, 2}, y);
  CHECK(tp_gather(&td, &ti, 1, &ty, &bad) == TP_KERNEL_OK);
  check_f32("gather", y, (float[]){2, 0, 12, 10}, 4, 0);
  idx[1] = 3;
  CHECK(tp_gather(&td, &ti, 1, &ty, &bad) == TP_KERNEL_BAD_INDEX && bad == 3);

  /* Transpose [2,3,4] by perm [2,0,1]: y[k][i][j] = x[i][j][k] */
  float x[24], t[24];
  for (int i = 0; i < 24; i++) x[i] = (float)i;
  TpTensor tx = T(TP_F32, 3, (int64_t[]){2, 3, 4}, x), tt = T(TP_F32, 3, (int64_t[]){4, 2, 3}, t);
  CHECK(tp_transpose(&tx, (int64_t[]){2, 0, 1}, &tt) == TP_KERNEL_OK);
  int wrong = 0;
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 3; j++) wrong += t[(k * 2 + i) * 3 + j] != x[(i * 3 + j) * 4 + k];
  CHECK(wrong == 0);

  /* Slice dim 1 from 3 down by -2 (3, 1), dim 2 from 1 by 2 (1, 3) -> [2,2,2] */
  float s[8];
  TpTensor ts = T(TP_F32, 3, (int64_t[]){2, 2, 2}, s);
  CHECK(tp_slice(&tx, (int64_t[]){0, 2, 1}, (int64_t[]){1, -2, 2}, &ts) == TP_KERNEL_OK);
  check_f32("slice", s, (float[]){9, 11, 1, 3, 21, 23, 13, 15}, 8, 0);
  CHECK(tp_slice(&tx, (int64_t[]){0, 2, 2}, (int64_t[]){1, -2, 2}, &ts) == TP_KERNEL_BAD_SHAPE);

  /* Split [2,3,4] on axis 2 into 1 + 3, then Concat back */
  float p1[6], p2[18], back[24];
  TpTensor parts[2] = {T(TP_F32, 3, (int64_t[]){2, 3, 1}, p1), T(TP_F32, 3, (int64_t[]){2, 3, 3}, p2)};
  CHECK(tp_split(&tx, 2, parts, 2) == TP_KERNEL_OK);
  check_f32("split 0", p1, (float[]){0, 4, 8, 12, 16, 20}, 6, 0);
  check_f32("split 1", p2, (float[]){1, 2, 3, 5, 6, 7, 9, 10, 11}, 9, 0);
  TpTensor tback = T(TP_F32, 3, (int64_t[]){2, 3, 4}, back);
  CHECK(tp_concat(parts, 2, 2, &tback) == TP_KERNEL_OK);
  check_f32("concat", back, x, 24, 0);

  /* Expand [3,1] -> [2,3,4] */
  float e[3] = {1, 2, 3}, ey[24];
  TpTensor te = T(TP_F32, 2, (int64_t[]){3, 1}, e), tey = T(TP_F32, 3, (int64_t[]){2, 3, 4}, ey);
  CHECK(tp_expand(&te, &tey) == TP_KERNEL_OK);
  CHECK(ey[0] == 1 && ey[3] == 1 && ey[4] == 2 && ey[11] == 3 && ey[12] == 1 && ey[23] == 3);

  /* Trilu on 3x4 matrices, batched */
  int64_t m[24], u[24];
  for (int i = 0; i < 24; i++) m[i] = i + 1;
  TpTensor tm = T(TP_I64, 3, (int64_t[]){2, 3, 4}, m), tu = T(TP_I64, 3, (int64_t[]){2, 3, 4}, u);
  CHECK(tp_trilu(&tm, true, 1, &tu) == TP_KERNEL_OK);
  check_i64("triu k=1", u + 12, (int64_t[]){0, 14, 15, 16, 0, 0, 19, 20, 0, 0, 0, 24}, 12);
  CHECK(tp_trilu(&tm, false, -1, &tu) == TP_KERNEL_OK);
  check_i64("tril k=-1", u, (int64_t[]){0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0}, 12);
}

/* Transpose large enough for threads: [3, 257, 129] -> [129, 3, 257] */
static void test_transpose_large(void) {
  enum { A = 3, B = 257, C = 129 };
  int32_t *x = malloc(A * B * C * sizeof *x), *y = malloc(A * B * C * sizeof *y);
  for (int i = 0; i < A * B * C; i++) x[i] = i;
  TpTensor tx = T(TP_I32, 3, (int64_t[]){A, B, C}, x), ty = T(TP_I32, 3, (int64_t[]){C, A, B}, y);
  CHECK(tp_transpose(&tx, (int64_t[]){2, 0, 1}, &ty) == TP_KERNEL_OK);
  int wrong = 0;
  for (int k = 0; k < C; k++)
    for (int i = 0; i < A; i++)
      for (int j = 0; j < B; j++) wrong += y[(k * A + i) * B + j] != x[(i * B + j) * C + k];
  CHECK(wrong == 0);
  free(x);
  free(y);
}

static void test_reduce(void) {
  float x[32], y[3]; /* 24 elements, then a poison tail a wrong walk would pick up */
  for (int i = 0; i < 32; i++) x[i] = i < 24 ? (float)i : 1e6f;
  TpTensor tx = T(TP_F32, 3, (int64_t[]){2, 3, 4}, x);
  TpTensor ty = T(TP_F32, 3, (int64_t[]){1, 3, 1}, y); /* keepdims */
  CHECK(tp_reduce_sum(&tx, (int64_t[]){0, 2}, 2, false, &ty) == TP_KERNEL_OK);
  /* j=0: 0+1+2+3 + 12+13+14+15 = 60; j=1: 92; j=2: 124 */
  check_f32("reduce sum 0,2", y, (float[]){60, 92, 124}, 3, 0);
  TpTensor ty2 = T(TP_F32, 1, (int64_t[]){3}, y);
  CHECK(tp_reduce_sum(&tx, (int64_t[]){0, 2}, 2, true, &ty2) == TP_KERNEL_OK);
  check_f32("reduce mean 0,2", y, (float[]){7.5f, 11.5f, 15.5f}, 3, 0);
  float all;
  TpTensor tall = T(TP_F32, 0, NULL, &all);
  CHECK(tp_reduce_sum(&tx, (int64_t[]){0, 1, 2}, 3, true, &tall) == TP_KERNEL_OK);
  CHECK(all == 11.5f);
  int32_t xi[6] = {1, -2, 3, 4, 5, -7}, yi[2];
  TpTensor txi = T(TP_I32, 2, (int64_t[]){2, 3}, xi), tyi = T(TP_I32, 1, (int64_t[]){2}, yi);
  CHECK(tp_reduce_sum(&txi, (int64_t[]){1}, 1, false, &tyi) == TP_KERNEL_OK);
  CHECK(yi[0] == 2 && yi[1] == 2);
  CHECK(tp_reduce_sum(&txi, (int64_t[]){1}, 1, true, &tyi) == TP_KERNEL_OK);
  CHECK(yi[0] == 0 && yi[1] == 0); /* 2/3 truncates */
  CHECK(tp_reduce_sum(&txi, (int64_t[]){0}, 1, false, &tyi) == TP_KERNEL_BAD_SHAPE);
  /* floats add in runs of 64 from 0, then the runs: 2^53 then 127 ones. In order, each 1
   * is lost to 2^53's rounding; the first run is 2^53, the second 64 ones make 64, and
   * 2^53 + 64 is exact. */
  double xd[128], yd;
  xd[0] = 0x1p53;
  for (int i = 1; i < 128; i++) xd[i] = 1;
  TpTensor txd = T(TP_F64, 1, (int64_t[]){128}, xd), tyd = T(TP_F64, 0, NULL, &yd);
  CHECK(tp_reduce_sum(&txd, (int64_t[]){0}, 1, false, &tyd) == TP_KERNEL_OK);
  CHECK(yd == 0x1p53 + 64);
}

/* TopK, a mixture's router: largest first; ties by lower index (ONNX's order,
 * which torch's CPU topk does not keep: it gives [2, 4, 1] for row 0's k = 3); NaN first. */
static void test_topk(void) {
  float x[3][5] = {{1, 3, 3, 2, 3}, {0, 0, 0, 0, 0}, {NAN, 1, NAN, 5, 5}};
  int64_t y[3][3], y0[1][5];
  TpTensor tx = T(TP_F32, 2, (int64_t[]){3, 5}, x), ty = T(TP_I64, 2, (int64_t[]){3, 3}, y);
  CHECK(tp_topk(&tx, 1, &ty) == TP_KERNEL_OK);
  check_i64("topk ties by lower index, NaN first", &y[0][0], (int64_t[]){1, 2, 4, 0, 1, 2, 0, 2, 3}, 9);
  TpTensor ty0 = T(TP_I64, 2, (int64_t[]){1, 5}, y0);
  CHECK(tp_topk(&tx, 0, &ty0) == TP_KERNEL_OK); /* along axis 0: per column */
  check_i64("topk along axis 0", &y0[0][0], (int64_t[]){2, 0, 2, 2, 2}, 5);
  int32_t xi[4] = {-7, 9, 9, -1};
  int64_t yi[2];
  TpTensor txi = T(TP_I32, 1, (int64_t[]){4}, xi), tyi = T(TP_I64, 1, (int64_t[]){2}, yi);
  CHECK(tp_topk(&txi, 0, &tyi) == TP_KERNEL_OK);
  check_i64("topk of i32", yi, (int64_t[]){1, 2}, 2);
  TpTensor wide = T(TP_I64, 2, (int64_t[]){3, 6}, y);
  CHECK(tp_topk(&tx, 1, &wide) == TP_KERNEL_BAD_SHAPE); /* k 6 > 5 entries */
  CHECK(tp_topk(&tx, 1, &tx) == TP_KERNEL_BAD_DTYPE);   /* indices are i64 */
}

/* The ops Hugging Face exports compute from constants: Sin, Cos, Max, Min, GreaterOrEqual,
 * CumSum, Tile, GatherElements. */
static void test_constant_ops(void) {
  float x[4] = {0, 1.5f, NAN, -2}, z[4] = {1, 1.5f, 0, NAN}, y[4];
  TpTensor tx = T(TP_F32, 1, (int64_t[]){4}, x), tz = T(TP_F32, 1, (int64_t[]){4}, z);
  TpTensor ty = T(TP_F32, 1, (int64_t[]){4}, y);
  CHECK(tp_unary(TP_UNARY_SIN, &tx, &ty) == TP_KERNEL_OK);
  check_f32("sin", y, (float[]){0, sinf(1.5f), NAN, sinf(-2)}, 4, 1e-7f);
  CHECK(tp_unary(TP_UNARY_COS, &tx, &ty) == TP_KERNEL_OK);
  check_f32("cos", y, (float[]){1, cosf(1.5f), NAN, cosf(-2)}, 4, 1e-7f);
  CHECK(tp_binary(TP_BINARY_MAX, &tx, &tz, &ty) == TP_KERNEL_OK);
  check_f32("max, NaN on either side propagates", y, (float[]){1, 1.5f, NAN, NAN}, 4, 0);
  CHECK(tp_binary(TP_BINARY_MIN, &tx, &tz, &ty) == TP_KERNEL_OK);
  check_f32("min, NaN on either side propagates", y, (float[]){0, 1.5f, NAN, NAN}, 4, 0);
  uint8_t ge[4];
  TpTensor tge = T(TP_BOOL, 1, (int64_t[]){4}, ge);
  CHECK(tp_binary(TP_BINARY_GREATER_EQUAL, &tx, &tz, &tge) == TP_KERNEL_OK);
  CHECK(ge[0] == 0 && ge[1] == 1 && ge[2] == 0 && ge[3] == 0); /* a tie is true, NaN false */
  int32_t si[3] = {-1, 5, 7}, s2[1] = {3}, so[3];
  TpTensor tsi = T(TP_I32, 1, (int64_t[]){3}, si), ts2 = T(TP_I32, 1, (int64_t[]){1}, s2);
  TpTensor tso = T(TP_I32, 1, (int64_t[]){3}, so);
  CHECK(tp_binary(TP_BINARY_MAX, &tsi, &ts2, &tso) == TP_KERNEL_OK);
  CHECK(so[0] == 3 && so[1] == 5 && so[2] == 7); /* signed: -1 < 3 */
  uint32_t ui[2] = {0xffffffffu, 1}, u2[1] = {2}, uo[2];
  TpTensor tui = T(TP_U32, 1, (int64_t[]){2}, ui), tu2 = T(TP_U32, 1, (int64_t[]){1}, u2);
  TpTensor tuo = T(TP_U32, 1, (int64_t[]){2}, uo);
  CHECK(tp_binary(TP_BINARY_MIN, &tui, &tu2, &tuo) == TP_KERNEL_OK);
  CHECK(uo[0] == 2 && uo[1] == 1); /* unsigned: 0xffffffff > 2 */

  /* CumSum of [[1, 2, 3], [4, 5, 6]] along 1, four ways; i64 and a shape mismatch */
  float c[6] = {1, 2, 3, 4, 5, 6}, cy[6];
  TpTensor tc = T(TP_F32, 2, (int64_t[]){2, 3}, c), tcy = T(TP_F32, 2, (int64_t[]){2, 3}, cy);
  CHECK(tp_cumsum(&tc, 1, false, false, &tcy) == TP_KERNEL_OK);
  check_f32("cumsum", cy, (float[]){1, 3, 6, 4, 9, 15}, 6, 0);
  CHECK(tp_cumsum(&tc, 1, true, false, &tcy) == TP_KERNEL_OK);
  check_f32("cumsum exclusive", cy, (float[]){0, 1, 3, 0, 4, 9}, 6, 0);
  CHECK(tp_cumsum(&tc, 1, false, true, &tcy) == TP_KERNEL_OK);
  check_f32("cumsum reverse", cy, (float[]){6, 5, 3, 15, 11, 6}, 6, 0);
  CHECK(tp_cumsum(&tc, 1, true, true, &tcy) == TP_KERNEL_OK);
  check_f32("cumsum exclusive reverse", cy, (float[]){5, 3, 0, 11, 6, 0}, 6, 0);
  CHECK(tp_cumsum(&tc, 0, false, false, &tcy) == TP_KERNEL_OK);
  check_f32("cumsum axis 0", cy, (float[]){1, 2, 3, 5, 7, 9}, 6, 0);
  int64_t ci[3] = {1, 1, 1}, cio[3];
  TpTensor tci = T(TP_I64, 1, (int64_t[]){3}, ci), tcio = T(TP_I64, 1, (int64_t[]){3}, cio);
  CHECK(tp_cumsum(&tci, 0, false, false, &tcio) == TP_KERNEL_OK);
  check_i64("cumsum i64 (OPT positions)", cio, (int64_t[]){1, 2, 3}, 3);
  CHECK(tp_cumsum(&tc, 2, false, false, &tcy) == TP_KERNEL_BAD_SHAPE);
  CHECK(tp_cumsum(&tc, 0, false, false, &tci) == TP_KERNEL_BAD_DTYPE);

  /* Tile [[1, 2, 3], [4, 5, 6]] by (2, 2) -> [4, 6]; a result that is not a multiple */
  float tl[24];
  TpTensor ttl = T(TP_F32, 2, (int64_t[]){4, 6}, tl);
  CHECK(tp_tile(&tc, &ttl) == TP_KERNEL_OK);
  check_f32("tile", tl, (float[]){1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6, 1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6}, 24, 0);
  TpTensor bad_tile = T(TP_F32, 2, (int64_t[]){4, 4}, tl);
  CHECK(tp_tile(&tc, &bad_tile) == TP_KERNEL_BAD_SHAPE);

  /* GatherElements along 1 with a negative index; along 0 with fewer columns; out of range */
  int64_t gi[4] = {2, -3, 0, 1}, bad = 0;
  float gy[4];
  TpTensor tgi = T(TP_I64, 2, (int64_t[]){2, 2}, gi), tgy = T(TP_F32, 2, (int64_t[]){2, 2}, gy);
  CHECK(tp_gather_elements(&tc, &tgi, 1, &tgy, &bad) == TP_KERNEL_OK);
  check_f32("gather_elements axis 1", gy, (float[]){3, 1, 4, 5}, 4, 0);
  int64_t g0[2] = {1, 0};
  TpTensor tg0 = T(TP_I64, 2, (int64_t[]){1, 2}, g0), tgy0 = T(TP_F32, 2, (int64_t[]){1, 2}, gy);
  CHECK(tp_gather_elements(&tc, &tg0, 0, &tgy0, &bad) == TP_KERNEL_OK);
  check_f32("gather_elements axis 0", gy, (float[]){4, 2}, 2, 0);
  gi[3] = 3;
  CHECK(tp_gather_elements(&tc, &tgi, 1, &tgy, &bad) == TP_KERNEL_BAD_INDEX && bad == 3);
  TpTensor wide = T(TP_I64, 2, (int64_t[]){1, 4}, gi), twide = T(TP_F32, 2, (int64_t[]){1, 4}, gy);
  CHECK(tp_gather_elements(&tc, &wide, 0, &twide, &bad) == TP_KERNEL_BAD_SHAPE); /* 4 columns > 3 */
}

int main(void) {
  test_binary();
  test_binary_large();
  test_unary();
  test_where_cast();
  test_layout();
  test_transpose_large();
  test_reduce();
  test_constant_ops();
  test_topk();
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  return failures != 0;
}
