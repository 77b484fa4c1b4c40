/* Unit tests of the training kernels (runtime/cpu/{transformer,nn_backward,layout_backward,
 * optim}) and their interpreter entries (interp/interp.c through bind/bind.c). Every backward
 * kernel is checked against central finite differences of its forward kernel: with
 * L = sum(dy * forward(inputs)) for a random dy, d L / d input[i] must match the kernel's
 * gradient; forward kernels against plain loops. The optimizer is checked against
 * torch.optim.AdamW's numbers. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "runtime/cpu/elementwise.h"
#include "runtime/cpu/layout.h"
#include "runtime/cpu/layout_backward.h"
#include "runtime/cpu/matmul.h"
#include "runtime/cpu/nn.h"
#include "runtime/cpu/nn_backward.h"
#include "runtime/cpu/optim.h"
#include "runtime/cpu/transformer.h"
#include "runtime/cpu/vecmath.h"
#include "interp/interp.h"
#include "../check.h"

/* ---- helpers ---- */

static float *zeros(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }

static TpTensor tensor(TpDType t, void *data, int rank, const int64_t *dims) {
  TpTensor x = {.dtype = t, .rank = rank, .data = data};
  if (rank) memcpy(x.dims, dims, (size_t)rank * sizeof *dims);
  return x;
}

static double dot(const float *a, const float *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

/* The forward of the op under test: returns L = sum(dy * y) for the current inputs. */
typedef double (*LossFn)(void *ctx);

/* Compares `grad` (the kernel's d L / d x) with central differences of f over each x[i].
 * The error is measured against the largest gradient magnitude. */
static void check_grad(const char *what, LossFn f, void *ctx, float *x, int64_t n, const float *grad, float eps,
                       double tol) {
  double worst = 0, scale = 1e-6;
  int64_t at = -1;
  double *num = malloc((size_t)(n ? n : 1) * sizeof *num);
  for (int64_t i = 0; i < n; i++) {
    float orig = x[i];
    x[i] = orig + eps;
    float hi = x[i];
    double lp = f(ctx);
    x[i] = orig - eps;
    float lo = x[i];
    double lm = f(ctx);
    x[i] = orig;
    num[i] = (lp - lm) / ((double)hi - lo);
    if (fabs(num[i]) > scale) scale = fabs(num[i]);
  }
  for (int64_t i = 0; i < n; i++) {
    double err = fabs(grad[i] - num[i]);
    if (!(err <= worst)) worst = err, at = i; /* NaN counts as the worst */
  }
  if (!(worst <= tol * scale))
    fail("%s: max_abs_err=%.3g at [%lld] (kernel %.7g, finite difference %.7g, largest %.3g)", what, worst,
         (long long)at, grad[at], num[at], scale);
  free(num);
}

/* ---- Linear ---- */

typedef struct {
  int64_t M, K, N;
  bool tw;
  float *x, *w, *b, *y, *dy;
} LinearCase;

static double linear_loss(void *ctx) {
  LinearCase *c = ctx;
  tp_linear_f32(c->x, c->w, c->b, c->M, c->K, c->N, c->tw, c->y);
  return dot(c->dy, c->y, c->M * c->N);
}

static void test_linear(bool tw, bool bias) {
  LinearCase c = {.M = 6, .K = 5, .N = 4, .tw = tw};
  c.x = rand_array(c.M * c.K, 1);
  c.w = rand_array(c.K * c.N, 1);
  c.b = bias ? rand_array(c.N, 1) : NULL;
  c.y = zeros(c.M * c.N);
  c.dy = rand_array(c.M * c.N, 1);
  /* forward against a plain loop */
  linear_loss(&c);
  for (int64_t i = 0; i < c.M; i++)
    for (int64_t j = 0; j < c.N; j++) {
      double s = bias ? c.b[j] : 0;
      for (int64_t k = 0; k < c.K; k++) s += (double)c.x[i * c.K + k] * c.w[tw ? j * c.K + k : k * c.N + j];
      if (fabs(s - c.y[i * c.N + j]) > 1e-5) {
        fail("linear tw=%d forward [%lld,%lld]: got %g want %g", tw, (long long)i, (long long)j, c.y[i * c.N + j],
             s);
        i = c.M;
        break;
      }
    }
  float *dx = zeros(c.M * c.K), *dw = zeros(c.K * c.N), *db = zeros(c.N);
  tp_linear_backward_f32(c.dy, c.x, c.w, c.M, c.K, c.N, tw, dx, dw, bias ? db : NULL);
  char what[64];
  snprintf(what, sizeof what, "linear tw=%d dX", tw);
  check_grad(what, linear_loss, &c, c.x, c.M * c.K, dx, 1e-2f, 1e-4);
  snprintf(what, sizeof what, "linear tw=%d dW", tw);
  check_grad(what, linear_loss, &c, c.w, c.K * c.N, dw, 1e-2f, 1e-4);
  if (bias) check_grad("linear dB", linear_loss, &c, c.b, c.N, db, 1e-2f, 1e-4);
  free(c.x), free(c.w), free(c.b), free(c.y), free(c.dy), free(dx), free(dw), free(db);
}

/* ---- MatMul with numpy broadcasting ---- */

typedef struct {
  TpTensor a, b, y;
  float *dy;
} MatMulCase;

static double matmul_loss(void *ctx) {
  MatMulCase *c = ctx;
  if (tp_matmul(&c->a, &c->b, &c->y) != TP_KERNEL_OK) fail("matmul forward refused");
  return dot(c->dy, c->y.data, tp_tensor_numel(&c->y));
}

static void test_matmul_case(const char *name, int ra, const int64_t *da, int rb, const int64_t *db, int ry,
                             const int64_t *dyd) {
  MatMulCase c;
  c.a = tensor(TP_F32, NULL, ra, da);
  c.b = tensor(TP_F32, NULL, rb, db);
  c.y = tensor(TP_F32, NULL, ry, dyd);
  int64_t na = tp_tensor_numel(&c.a), nb = tp_tensor_numel(&c.b), ny = tp_tensor_numel(&c.y);
  c.a.data = rand_array(na, 1);
  c.b.data = rand_array(nb, 1);
  c.y.data = zeros(ny);
  c.dy = rand_array(ny, 1);
  TpTensor dyt = tensor(TP_F32, c.dy, ry, dyd);
  TpTensor ga = tensor(TP_F32, zeros(na), ra, da), gb = tensor(TP_F32, zeros(nb), rb, db);
  /* garbage in the results: the kernel must write them whole */
  for (int64_t i = 0; i < na; i++) ((float *)ga.data)[i] = 1e6f;
  for (int64_t i = 0; i < nb; i++) ((float *)gb.data)[i] = 1e6f;
  if (tp_matmul_backward_f32(&dyt, &c.a, &c.b, &ga, &gb) != TP_KERNEL_OK) fail("matmul backward %s refused", name);
  char what[96];
  snprintf(what, sizeof what, "matmul %s dA", name);
  check_grad(what, matmul_loss, &c, c.a.data, na, ga.data, 1e-2f, 1e-4);
  snprintf(what, sizeof what, "matmul %s dB", name);
  check_grad(what, matmul_loss, &c, c.b.data, nb, gb.data, 1e-2f, 1e-4);
  /* one gradient alone */
  float *only = zeros(nb);
  TpTensor gb2 = tensor(TP_F32, only, rb, db);
  tp_matmul_backward_f32(&dyt, &c.a, &c.b, NULL, &gb2);
  if (memcmp(only, gb.data, (size_t)nb * sizeof(float))) fail("matmul %s: dB alone differs from dB with dA", name);
  free(only), free(c.a.data), free(c.b.data), free(c.y.data), free(c.dy), free(ga.data), free(gb.data);
}

static void test_matmul(void) {
  test_matmul_case("2d", 2, (int64_t[]){3, 4}, 2, (int64_t[]){4, 5}, 2, (int64_t[]){3, 5});
  test_matmul_case("broadcast [2,1,3,4]@[3,4,5]", 4, (int64_t[]){2, 1, 3, 4}, 3, (int64_t[]){3, 4, 5}, 4,
                   (int64_t[]){2, 3, 3, 5});
  test_matmul_case("broadcast [3,1,2,4]@[1,2,4,3]", 4, (int64_t[]){3, 1, 2, 4}, 4, (int64_t[]){1, 2, 4, 3}, 4,
                   (int64_t[]){3, 2, 2, 3});
  test_matmul_case("shared b [2,3,4]@[4,5]", 3, (int64_t[]){2, 3, 4}, 2, (int64_t[]){4, 5}, 3, (int64_t[]){2, 3, 5});
  test_matmul_case("shared a [3,4]@[2,4,5]", 2, (int64_t[]){3, 4}, 3, (int64_t[]){2, 4, 5}, 3, (int64_t[]){2, 3, 5});
  test_matmul_case("1-D a [4]@[2,4,3]", 1, (int64_t[]){4}, 3, (int64_t[]){2, 4, 3}, 2, (int64_t[]){2, 3});
  test_matmul_case("1-D b [2,3,4]@[4]", 3, (int64_t[]){2, 3, 4}, 1, (int64_t[]){4}, 2, (int64_t[]){2, 3});
  test_matmul_case("1-D both [4]@[4]", 1, (int64_t[]){4}, 1, (int64_t[]){4}, 0, (int64_t[]){0});
  float a[2], b[3], y[1];
  TpTensor A = tensor(TP_F32, a, 1, (int64_t[]){2}), B = tensor(TP_F32, b, 1, (int64_t[]){3});
  TpTensor Y = tensor(TP_F32, y, 0, (int64_t[]){0});
  if (tp_matmul_backward_f32(&Y, &A, &B, &A, &B) != TP_KERNEL_BAD_SHAPE) fail("matmul backward accepted K mismatch");
}

/* ---- Gather, Embedding ---- */

typedef struct {
  TpTensor data, idx, y;
  int axis;
  float *dy;
} GatherCase;

static double gather_loss(void *ctx) {
  GatherCase *c = ctx;
  int64_t bad;
  if (tp_gather(&c->data, &c->idx, c->axis, &c->y, &bad) != TP_KERNEL_OK) fail("gather refused");
  return dot(c->dy, c->y.data, tp_tensor_numel(&c->y));
}

static void test_gather_case(int axis, TpDType idt) {
  /* data [3,4,5]; indices [2,3] with repeats and a negative; y = data dims with axis -> [2,3] */
  int64_t ddims[3] = {3, 4, 5}, raw[6] = {1, 2, 1, -1, 0, 1};
  int32_t idx32[6];
  for (int i = 0; i < 6; i++) idx32[i] = (int32_t)raw[i];
  GatherCase c = {.axis = axis};
  c.data = tensor(TP_F32, rand_array(60, 1), 3, ddims);
  c.idx = tensor(idt, idt == TP_I64 ? (void *)raw : (void *)idx32, 2, (int64_t[]){2, 3});
  int64_t ydims[4];
  int r = 0;
  for (int d = 0; d < 3; d++) {
    if (d == axis) ydims[r++] = 2, ydims[r++] = 3;
    else ydims[r++] = ddims[d];
  }
  c.y = tensor(TP_F32, zeros(360), 4, ydims);
  c.dy = rand_array(tp_tensor_numel(&c.y), 1);
  TpTensor dyt = tensor(TP_F32, c.dy, 4, ydims), dd = tensor(TP_F32, rand_array(60, 1), 3, ddims);
  int64_t bad = 0;
  if (tp_gather_backward(&dyt, &c.idx, axis, -1, &dd, &bad) != TP_KERNEL_OK) fail("gather backward refused");
  char what[64];
  snprintf(what, sizeof what, "gather backward axis %d %s", axis, tp_dtype_name(idt));
  check_grad(what, gather_loss, &c, c.data.data, 60, dd.data, 1e-2f, 1e-5);
  /* padding index 1 (named three times) leaves its slice 0 and every other as it was */
  TpTensor dp = tensor(TP_F32, rand_array(60, 1), 3, ddims);
  if (tp_gather_backward(&dyt, &c.idx, axis, 1, &dp, &bad) != TP_KERNEL_OK)
    fail("gather backward refused a padding index");
  int64_t inner = 1;
  for (int d = axis + 1; d < 3; d++) inner *= ddims[d];
  for (int64_t e = 0; e < 60; e++) {
    bool pad_row = e / inner % ddims[axis] == 1;
    float want = pad_row ? 0.0f : ((float *)dd.data)[e], got = ((float *)dp.data)[e];
    if (got != want) fail("%s, padding index 1: element %lld is %g, want %g", what, (long long)e, got, want);
  }
  free(c.data.data), free(c.y.data), free(c.dy), free(dd.data), free(dp.data);
}

static void test_gather_embedding(void) {
  test_gather_case(0, TP_I64);
  test_gather_case(1, TP_I32);
  test_gather_case(2, TP_I64);

  /* Embedding forward = Gather rows; its backward is tp_gather_backward on axis 0 */
  int64_t ids[5] = {2, 0, 2, -1, 3};
  float *table = rand_array(4 * 3, 1), out[15], ref[15];
  int64_t bad = -7;
  if (tp_embedding_f32(table, ids, 5, 4, 3, out, &bad) != TP_KERNEL_OK) fail("embedding refused");
  TpTensor T = tensor(TP_F32, table, 2, (int64_t[]){4, 3}), I = tensor(TP_I64, ids, 1, (int64_t[]){5});
  TpTensor R = tensor(TP_F32, ref, 2, (int64_t[]){5, 3});
  tp_gather(&T, &I, 0, &R, &bad);
  if (memcmp(out, ref, sizeof out)) fail("embedding differs from gather on axis 0");
  ids[4] = 4;
  if (tp_embedding_f32(table, ids, 5, 4, 3, out, &bad) != TP_KERNEL_BAD_INDEX || bad != 4)
    fail("embedding: id 4 of 4 rows not reported at position 4 (bad %lld)", (long long)bad);
  ids[4] = -5;
  if (tp_embedding_f32(table, ids, 5, 4, 3, out, &bad) != TP_KERNEL_BAD_INDEX)
    fail("embedding: id -5 of 4 rows not reported");
  /* gather backward with a bad index */
  float g[15] = {0}, dt[12];
  TpTensor G = tensor(TP_F32, g, 2, (int64_t[]){5, 3}), DT = tensor(TP_F32, dt, 2, (int64_t[]){4, 3});
  if (tp_gather_backward(&G, &I, 0, -1, &DT, &bad) != TP_KERNEL_BAD_INDEX || bad != -5)
    fail("gather backward: index -5 not reported (bad %lld)", (long long)bad);
  free(table);
}

/* ---- Slice ---- */

typedef struct {
  TpTensor x, y;
  const int64_t *starts, *steps;
  float *dy;
} SliceCase;

static double slice_loss(void *ctx) {
  SliceCase *c = ctx;
  if (tp_slice(&c->x, c->starts, c->steps, &c->y) != TP_KERNEL_OK) fail("slice refused");
  return dot(c->dy, c->y.data, tp_tensor_numel(&c->y));
}

static void test_slice_case(const char *name, int rank, const int64_t *xd, const int64_t *yd, const int64_t *starts,
                            const int64_t *steps) {
  SliceCase c = {.starts = starts, .steps = steps};
  c.x = tensor(TP_F32, NULL, rank, xd);
  c.y = tensor(TP_F32, NULL, rank, yd);
  int64_t nx = tp_tensor_numel(&c.x), ny = tp_tensor_numel(&c.y);
  c.x.data = rand_array(nx, 1);
  c.y.data = zeros(ny);
  c.dy = rand_array(ny, 1);
  TpTensor dyt = tensor(TP_F32, c.dy, rank, yd), dx = tensor(TP_F32, rand_array(nx, 1), rank, xd);
  if (tp_slice_backward(&dyt, starts, steps, &dx) != TP_KERNEL_OK) fail("slice backward %s refused", name);
  char what[64];
  snprintf(what, sizeof what, "slice backward %s", name);
  check_grad(what, slice_loss, &c, c.x.data, nx, dx.data, 1e-2f, 1e-5);
  free(c.x.data), free(c.y.data), free(c.dy), free(dx.data);
}

static void test_slice(void) {
  test_slice_case("negative steps", 3, (int64_t[]){5, 6, 4}, (int64_t[]){3, 3, 4}, (int64_t[]){4, 1, 0},
                  (int64_t[]){-2, 2, 1});
  test_slice_case("reverse last", 2, (int64_t[]){3, 7}, (int64_t[]){2, 7}, (int64_t[]){1, 6}, (int64_t[]){1, -1});
  test_slice_case("step 3", 2, (int64_t[]){4, 10}, (int64_t[]){4, 3}, (int64_t[]){0, 2}, (int64_t[]){1, 3});
  float a[4] = {0}, b[2] = {0};
  TpTensor X = tensor(TP_F32, a, 1, (int64_t[]){4}), Y = tensor(TP_F32, b, 1, (int64_t[]){2});
  if (tp_slice_backward(&Y, (int64_t[]){3}, (int64_t[]){1}, &X) != TP_KERNEL_BAD_SHAPE)
    fail("slice backward accepted a slice past the end");
}

/* ---- LayerNorm ---- */

typedef struct {
  int64_t rows, n;
  float *x, *scale, *bias, *y, *dy;
} LayerNormCase;

static double layernorm_loss(void *ctx) {
  LayerNormCase *c = ctx;
  tp_layernorm_f32(c->x, c->scale, c->bias, c->rows, c->n, 1e-5f, c->y, NULL, NULL);
  return dot(c->dy, c->y, c->rows * c->n);
}

static void test_layernorm(void) {
  LayerNormCase c = {.rows = 6, .n = 8};
  int64_t total = c.rows * c.n;
  c.x = rand_array(total, 1);
  for (int64_t i = 0; i < c.n; i++) c.x[i] += 3; /* a row with an offset mean */
  c.scale = rand_array(c.n, 1);
  c.bias = rand_array(c.n, 1);
  c.y = zeros(total);
  c.dy = rand_array(total, 1);
  float *mean = zeros(c.rows), *inv = zeros(c.rows), *dx = zeros(total), *ds = zeros(c.n), *db = zeros(c.n);
  tp_layernorm_f32(c.x, c.scale, c.bias, c.rows, c.n, 1e-5f, c.y, mean, inv);
  tp_layernorm_backward_f32(c.dy, c.x, c.scale, mean, inv, c.rows, c.n, dx, ds, db);
  check_grad("layernorm dX", layernorm_loss, &c, c.x, total, dx, 1e-2f, 5e-4);
  check_grad("layernorm dScale", layernorm_loss, &c, c.scale, c.n, ds, 1e-2f, 1e-4);
  check_grad("layernorm dB", layernorm_loss, &c, c.bias, c.n, db, 1e-2f, 1e-4);
  free(c.x), free(c.scale), free(c.bias), free(c.y), free(c.dy), free(mean), free(inv), free(dx), free(ds), free(db);
}

/* ---- Gelu ---- */

typedef struct {
  bool tanh_approx;
  float *x, *y, *dy;
  int64_t n;
} GeluCase;

static double gelu_loss(void *ctx) {
  GeluCase *c = ctx;
  TpTensor X = tensor(TP_F32, c->x, 1, &c->n), Y = tensor(TP_F32, c->y, 1, &c->n);
  tp_unary(c->tanh_approx ? TP_UNARY_GELU_TANH : TP_UNARY_GELU, &X, &Y);
  return dot(c->dy, c->y, c->n);
}

static void test_gelu(bool tanh_approx) {
  GeluCase c = {.tanh_approx = tanh_approx, .n = 40};
  c.x = rand_array(c.n, 1);
  for (int64_t i = 0; i < c.n; i++) c.x[i] *= 4; /* [-4, 4): both tails and the middle */
  c.y = zeros(c.n);
  c.dy = rand_array(c.n, 1);
  float *dx = zeros(c.n);
  tp_gelu_backward_f32(c.dy, c.x, c.n, tanh_approx, dx);
  check_grad(tanh_approx ? "gelu tanh" : "gelu none", gelu_loss, &c, c.x, c.n, dx, 1e-2f, 5e-4);
  free(c.x), free(c.y), free(c.dy), free(dx);
}

/* ---- Softmax, LogSoftmax ---- */

typedef struct {
  int64_t outer, n, inner;
  bool log;
  float *x, *y, *dy;
} SoftmaxCase;

static double softmax_loss(void *ctx) {
  SoftmaxCase *c = ctx;
  tp_softmax_f32(c->x, c->y, c->outer, c->n, c->inner, c->log);
  return dot(c->dy, c->y, c->outer * c->n * c->inner);
}

static void test_softmax(bool log, int64_t inner) {
  SoftmaxCase c = {.outer = 3, .n = 5, .inner = inner, .log = log};
  int64_t total = c.outer * c.n * c.inner;
  c.x = rand_array(total, 1);
  for (int64_t i = 0; i < total; i++) c.x[i] *= 3;
  c.y = zeros(total);
  c.dy = rand_array(total, 1);
  float *dx = zeros(total);
  softmax_loss(&c);
  tp_softmax_backward_f32(c.dy, c.y, c.outer, c.n, c.inner, log, dx);
  char what[64];
  snprintf(what, sizeof what, "%s backward inner=%lld", log ? "logsoftmax" : "softmax", (long long)inner);
  check_grad(what, softmax_loss, &c, c.x, total, dx, 1e-2f, 5e-4);
  free(c.x), free(c.y), free(c.dy), free(dx);
}

/* ---- Attention ---- */

typedef struct {
  TpAttention p;
  float *q, *k, *v, *y, *dy;
  int64_t nq, nk, nv, ny;
} AttnCase;

static double attention_loss(void *ctx) {
  AttnCase *c = ctx;
  tp_attention_f32(&c->p, c->q, c->k, c->v, NULL, NULL, c->y, NULL, NULL, NULL, NULL);
  return dot(c->dy, c->y, c->ny);
}

static void test_attention_case(const char *name, TpAttention p) {
  AttnCase c = {.p = p};
  c.nq = p.batch * p.q_heads * p.q_len * p.head_size;
  c.nk = p.batch * p.kv_heads * p.kv_len * p.head_size;
  c.nv = p.batch * p.kv_heads * p.kv_len * p.v_head_size;
  c.ny = p.batch * p.q_heads * p.q_len * p.v_head_size;
  c.q = rand_array(c.nq, 1), c.k = rand_array(c.nk, 1), c.v = rand_array(c.nv, 1);
  for (int64_t i = 0; i < c.nq; i++) c.q[i] *= 2; /* peaked enough to matter */
  c.y = zeros(c.ny);
  c.dy = rand_array(c.ny, 1);
  float *dq = rand_array(c.nq, 1), *dk = rand_array(c.nk, 1), *dv = rand_array(c.nv, 1);
  tp_attention_backward_f32(&p, c.dy, c.q, c.k, c.v, NULL, NULL, dq, dk, dv);
  char what[96];
  snprintf(what, sizeof what, "attention %s dQ", name);
  check_grad(what, attention_loss, &c, c.q, c.nq, dq, 1e-2f, 5e-4);
  snprintf(what, sizeof what, "attention %s dK", name);
  check_grad(what, attention_loss, &c, c.k, c.nk, dk, 1e-2f, 5e-4);
  snprintf(what, sizeof what, "attention %s dV", name);
  check_grad(what, attention_loss, &c, c.v, c.nv, dv, 1e-2f, 5e-4);
  /* dV alone (dQ, dK skipped) is the same */
  float *dv2 = zeros(c.nv);
  tp_attention_backward_f32(&p, c.dy, c.q, c.k, c.v, NULL, NULL, NULL, NULL, dv2);
  if (memcmp(dv, dv2, (size_t)c.nv * sizeof *dv)) fail("attention %s: dV alone differs", name);
  free(c.q), free(c.k), free(c.v), free(c.y), free(c.dy), free(dq), free(dk), free(dv), free(dv2);
}

static void test_attention(void) {
  TpAttention p = {.batch = 2,
                   .q_heads = 4,
                   .kv_heads = 2,
                   .q_len = 5,
                   .kv_len = 5,
                   .head_size = 3,
                   .v_head_size = 4,
                   .is_causal = true};
  p.scale = 1 / sqrtf(3);
  test_attention_case("4-D GQA causal", p);
  /* one (batch, kv head): the serial path */
  TpAttention s = {.batch = 1,
                   .q_heads = 2,
                   .kv_heads = 1,
                   .q_len = 6,
                   .kv_len = 6,
                   .head_size = 4,
                   .v_head_size = 4,
                   .is_causal = true,
                   .scale = 0.7f};
  test_attention_case("4-D one group causal", s);
  TpAttention k = {.batch = 2,
                   .q_heads = 2,
                   .kv_heads = 2,
                   .q_len = 3,
                   .kv_len = 6,
                   .head_size = 4,
                   .v_head_size = 2,
                   .packed = true,
                   .scale = 0.5f,
                   .softcap = 1.5f};
  test_attention_case("3-D softcap q_len<kv_len", k);
  TpAttention g = {.batch = 2,
                   .q_heads = 6,
                   .kv_heads = 2,
                   .q_len = 4,
                   .kv_len = 4,
                   .head_size = 2,
                   .v_head_size = 3,
                   .packed = true,
                   .is_causal = true,
                   .scale = 1};
  test_attention_case("3-D GQA causal", g);
  /* causal with q_len != kv_len: query i sees keys j <= i (ONNX's upper-left alignment) */
  TpAttention r = {.batch = 1,
                   .q_heads = 2,
                   .kv_heads = 2,
                   .q_len = 4,
                   .kv_len = 6,
                   .head_size = 3,
                   .v_head_size = 3,
                   .is_causal = true,
                   .scale = 0.6f};
  test_attention_case("4-D causal q_len<kv_len", r);
  r.q_len = 6, r.kv_len = 4;
  test_attention_case("4-D causal q_len>kv_len", r);

  /* no keys: nothing attended, every gradient is zero */
  TpAttention e = {.batch = 1,
                   .q_heads = 1,
                   .kv_heads = 1,
                   .q_len = 2,
                   .kv_len = 0,
                   .head_size = 2,
                   .v_head_size = 2,
                   .scale = 1};
  float q[4] = {1, 2, 3, 4}, dy[4] = {1, 1, 1, 1}, dq[4] = {9, 9, 9, 9};
  tp_attention_backward_f32(&e, dy, q, NULL, NULL, NULL, NULL, dq, NULL, NULL);
  for (int i = 0; i < 4; i++)
    if (dq[i] != 0) {
      fail("attention without keys: dQ[%d] = %g, want 0", i, dq[i]);
      break;
    }
}

/* ---- CrossEntropy ---- */

typedef struct {
  int64_t R, V;
  float *logits, denom, dloss;
  const int64_t *targets;
} CECase;

static double ce_loss(void *ctx) {
  CECase *c = ctx;
  float loss;
  int64_t bad;
  if (tp_cross_entropy_f32(c->logits, c->targets, c->R, c->V, c->denom, &loss, &bad) != TP_KERNEL_OK)
    fail("cross entropy refused");
  return (double)c->dloss * loss;
}

static void test_cross_entropy(void) {
  int64_t targets[6] = {0, 6, 3, 3, 1, 5};
  CECase c = {.R = 6, .V = 7, .denom = 6, .dloss = 1.7f, .targets = targets};
  c.logits = rand_array(c.R * c.V, 1);
  for (int64_t i = 0; i < c.R * c.V; i++) c.logits[i] *= 4;
  /* forward against log-softmax + mean NLL */
  float lp[42], loss;
  int64_t bad = -1;
  tp_softmax_f32(c.logits, lp, c.R, c.V, 1, true);
  double want = 0;
  for (int64_t r = 0; r < c.R; r++) want -= lp[r * c.V + targets[r]];
  want /= 6;
  tp_cross_entropy_f32(c.logits, targets, c.R, c.V, c.denom, &loss, &bad);
  if (fabs(loss - want) > 1e-6 * fabs(want)) fail("cross entropy: got %.9g want %.9g", loss, want);

  float *dl = zeros(c.R * c.V);
  if (tp_cross_entropy_backward_f32(c.dloss, c.logits, targets, c.R, c.V, c.denom, dl, &bad))
    fail("cross entropy backward refused");
  check_grad("cross entropy backward", ce_loss, &c, c.logits, c.R * c.V, dl, 1e-2f, 5e-4);

  targets[2] = 7;
  if (tp_cross_entropy_f32(c.logits, targets, c.R, c.V, c.denom, &loss, &bad) != TP_KERNEL_BAD_INDEX || bad != 2)
    fail("cross entropy: target 7 of 7 classes not reported at row 2");
  targets[2] = -1;
  if (tp_cross_entropy_backward_f32(1, c.logits, targets, c.R, c.V, c.denom, dl, &bad) != TP_KERNEL_BAD_INDEX)
    fail("cross entropy backward: target -1 not reported");
  free(c.logits), free(dl);
}

/* ---- AdamW, global norm ---- */

static void check_exact(const char *what, const float *got, const float *want, int n, double rel) {
  for (int i = 0; i < n; i++)
    if (!(fabs(got[i] - want[i]) <= rel * fabs(want[i]))) {
      fail("%s: [%d] got %.9g want %.9g", what, i, got[i], want[i]);
      return;
    }
}

static void test_adamw(void) {
  float w[4] = {0.5f, -1.0f, 2.0f, 0.25f}, m[4] = {0}, v[4] = {0};
  const float g1[4] = {0.1f, -0.2f, 0.3f, 0.0f}, g2[4] = {-0.05f, 0.4f, 0.3f, 1e-3f};
  double lr = 0.01, wd = 0.1;
  /* Step 1 by hand: mhat = g, vhat = g^2, so w = w * (1 - lr*wd) - lr * sign(g). */
  float hand[4] = {0.5f * 0.999f - 0.01f, -1.0f * 0.999f + 0.01f, 2.0f * 0.999f - 0.01f, 0.25f * 0.999f};
  tp_adamw_step(w, g1, m, v, 4, lr, 0.9, 0.999, 1e-8, wd, 1);
  check_exact("adamw step 1 by hand", w, hand, 4, 1e-6);
  /* torch.optim.AdamW(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1), float32,
   * torch 1.13 (tools: print with %.9g after each opt.step()). */
  check_exact("adamw step 1 w", w, (float[]){0.489500016f, -0.989000022f, 1.98800004f, 0.249750003f}, 4, 2e-7);
  check_exact("adamw step 1 m", m, (float[]){0.0100000007f, -0.0200000014f, 0.0300000012f, 0}, 4, 2e-7);
  check_exact("adamw step 1 v", v, (float[]){1.00000007e-05f, 4.00000026e-05f, 9.00000086e-05f, 0}, 4, 2e-7);
  tp_adamw_step(w, g2, m, v, 4, lr, 0.9, 0.999, 1e-8, wd, 2);
  check_exact("adamw step 2 w", w, (float[]){0.486347139f, -0.991672099f, 1.97601211f, 0.242058992f}, 4, 2e-7);
  check_exact("adamw step 2 m", m, (float[]){0.00400000019f, 0.0219999999f, 0.0570000038f, 0.000100000005f}, 4,
              2e-7);
  check_exact("adamw step 2 v", v, (float[]){1.24900007e-05f, 0.000199960006f, 0.000179910014f, 1.00000019e-09f}, 4,
              2e-7);

  /* sum of squares: exact for small integers, and the same bits on a large array */
  float sq[5] = {1, -2, 3, 0, 4};
  if (tp_sum_squares_f32(sq, 5) != 30) fail("sum of squares: %g, want 30", tp_sum_squares_f32(sq, 5));
  int64_t n = 100003;
  float *big = rand_array(n, 1);
  double want = 0;
  for (int64_t i = 0; i < n; i++) want += (double)big[i] * big[i];
  double got = tp_sum_squares_f32(big, n);
  if (fabs(got - want) > 1e-9 * want) fail("sum of squares: %.17g want %.17g", got, want);
  tp_scale_f32(sq, 5, 0.5f);
  check_exact("scale", sq, (float[]){0.5f, -1, 1.5f, 0, 2}, 5, 0);
  free(big);
}

/* ---- the same bits on any thread count ---- */

/* Runs the reducing kernels on sizes past their parallel thresholds with 1 and 3 threads
 * (attention: its serial path on threaded BLAS, then its parallel path) and compares. */
static void test_thread_count(void) {
  enum { B = 8, T = 64, H = 4, D = 16, C = H * D, M = B * T, V = 512 };
  TpAttention p = {.batch = B,
                   .q_heads = H,
                   .kv_heads = 2,
                   .q_len = T,
                   .kv_len = T,
                   .head_size = D,
                   .v_head_size = D,
                   .is_causal = true,
                   .scale = 0.25f};
  float *q = rand_array(M * C, 1), *k = rand_array(M * C / 2, 1), *v = rand_array(M * C / 2, 1);
  float *dy = rand_array(M * C, 1), *scale = rand_array(C, 1), *mean = rand_array(M, 1);
  float *inv = rand_array(M, 1), *logits = rand_array(M * V, 1);
  int64_t targets[M], bad;
  for (int i = 0; i < M; i++) targets[i] = (i * 7919) % V;
  TpTensor G = tensor(TP_F32, dy, 2, (int64_t[]){M, C}), I = tensor(TP_I64, targets, 1, (int64_t[]){M});
  float *run[2][9];
  double sums[2];
  int threads[2] = {1, 3}, saved = omp_get_max_threads();
  for (int t = 0; t < 2; t++) {
    omp_set_num_threads(threads[t]);
    float **o = run[t];
    o[0] = zeros(M * C), o[1] = zeros(M * C / 2), o[2] = zeros(M * C / 2);
    o[3] = zeros(M * C), o[4] = zeros(C), o[5] = zeros(C), o[6] = zeros(M * V), o[7] = zeros(1);
    o[8] = zeros(V * C);
    tp_attention_backward_f32(&p, dy, q, k, v, NULL, NULL, o[0], o[1], o[2]);
    tp_layernorm_backward_f32(dy, q, scale, mean, inv, M, C, o[3], o[4], o[5]);
    tp_cross_entropy_backward_f32(1, logits, targets, M, V, M, o[6], &bad);
    tp_cross_entropy_f32(logits, targets, M, V, M, o[7], &bad);
    TpTensor DW = tensor(TP_F32, o[8], 2, (int64_t[]){V, C});
    tp_gather_backward(&G, &I, 0, -1, &DW, &bad);
    sums[t] = tp_sum_squares_f32(logits, M * V);
  }
  omp_set_num_threads(saved);
  const char *names[9] = {"attention dQ",           "attention dK",     "attention dV",
                          "layernorm dX",           "layernorm dScale", "layernorm dB",
                          "cross entropy backward", "cross entropy",    "gather backward"};
  int64_t sizes[9] = {M * C, M * C / 2, M * C / 2, M * C, C, C, M * V, 1, V * C};
  for (int i = 0; i < 9; i++) {
    if (memcmp(run[0][i], run[1][i], (size_t)sizes[i] * sizeof(float)))
      fail("%s: 1 and 3 threads give different bits", names[i]);
    free(run[0][i]), free(run[1][i]);
  }
  if (sums[0] != sums[1]) fail("sum of squares: 1 and 3 threads give different bits");
  free(q), free(k), free(v), free(dy), free(scale), free(mean), free(inv), free(logits);
}

/* ---- the vectorisable exp, tanh, erf against libm ---- */

static void test_vecmath(void) {
  double exp_rel = 0, tanh_abs = 0, erf_abs = 0;
  float at_exp = 0, at_tanh = 0, at_erf = 0;
  for (float x = -87; x < 88; x += 0.00073f) {
    double want = exp((double)x), err = fabs(tp_vexpf(x) - want) / want;
    if (err > exp_rel) exp_rel = err, at_exp = x;
  }
  for (float x = -12; x < 12; x += 0.00011f) {
    double et = fabs(tp_vtanhf(x) - tanh((double)x)), ee = fabs(tp_verff(x) - erf((double)x));
    if (et > tanh_abs) tanh_abs = et, at_tanh = x;
    if (ee > erf_abs) erf_abs = ee, at_erf = x;
  }
  printf("vecmath: exp rel %.3g, tanh abs %.3g, erf abs %.3g\n", exp_rel, tanh_abs, erf_abs);
  if (exp_rel > 1.3e-7) fail("tp_vexpf: relative error %.3g at %g", exp_rel, at_exp);
  if (tanh_abs > 2.5e-7) fail("tp_vtanhf: absolute error %.3g at %g", tanh_abs, at_tanh);
  if (erf_abs > 6e-7) fail("tp_verff: absolute error %.3g at %g", erf_abs, at_erf);
  if (tp_vexpf(-100) != 0 || tp_vtanhf(50) != 1 || tp_vtanhf(-50) != -1 || tp_verff(8) != 1)
    fail("vecmath saturation: exp(-100) %g tanh(50) %g tanh(-50) %g erf(8) %g", tp_vexpf(-100), tp_vtanhf(50),
         tp_vtanhf(-50), tp_verff(8));
}

/* ---- the interpreter entries ---- */

static TpModule *module;
static TpDiag diag;

/* An op of `kind` over fresh values (their types do not matter to tp_exec_op). */
static int add_op(TpOpKind kind, int nin, int nout) {
  int in[8];
  const char *names[8];
  TpType t = {.dtype = TP_F32};
  for (int i = 0; i < nin; i++)
    in[i] = tp_add_value(module, tp_unique_name(module, "x"), TP_VAL_INPUT, t, (TpOrigin){0});
  for (int i = 0; i < nout; i++) names[i] = "y";
  return tp_add_op(module, kind, in, nin, names, nout, (TpOrigin){"node", tp_op_info[kind].name});
}

static void test_exec(void) {
  module = tp_module_new("train.onnx");
  FILE *sink = tmpfile();
  tp_diag_init(&diag, "test", "train.onnx", sink);

  /* Linear through the table = the kernel */
  int op = add_op(TP_OP_Linear, 3, 1);
  tp_set_attr_int(module, op, "transpose_w", 1);
  float *x = rand_array(2 * 3 * 4, 1), *w = rand_array(5 * 4, 1), *b = rand_array(5, 1), y[30], want[30];
  TpTensor in[5] = {tensor(TP_F32, x, 3, (int64_t[]){2, 3, 4}), tensor(TP_F32, w, 2, (int64_t[]){5, 4}),
                    tensor(TP_F32, b, 1, (int64_t[]){5})};
  TpTensor out[3] = {tensor(TP_F32, y, 3, (int64_t[]){2, 3, 5})};
  if (tp_exec_op(module, op, in, out, &diag) != TP_OK) fail("exec Linear: %s", diag.last);
  tp_linear_f32(x, w, b, 6, 4, 5, true, want);
  if (memcmp(y, want, sizeof y)) fail("exec Linear differs from tp_linear_f32");
  out[0].dims[2] = 4;
  if (tp_exec_op(module, op, in, out, &diag) != TP_ERR_INPUT) fail("exec Linear accepted a bad result shape");

  /* CrossEntropy with i32 targets, default denominator = rows; a bad target is reported */
  op = add_op(TP_OP_CrossEntropy, 2, 1);
  int32_t t32[6] = {0, 4, 2, 1, 3, 3};
  int64_t t64[6] = {0, 4, 2, 1, 3, 3};
  float loss, loss_want;
  int64_t bad;
  float *lg = rand_array(30, 1);
  in[0] = tensor(TP_F32, lg, 3, (int64_t[]){2, 3, 5});
  in[1] = tensor(TP_I32, t32, 2, (int64_t[]){2, 3});
  out[0] = tensor(TP_F32, &loss, 0, NULL);
  if (tp_exec_op(module, op, in, out, &diag) != TP_OK) fail("exec CrossEntropy: %s", diag.last);
  tp_cross_entropy_f32(lg, t64, 6, 5, 6, &loss_want, &bad);
  if (loss != loss_want) fail("exec CrossEntropy: %g, kernel %g", loss, loss_want);
  t32[4] = 5;
  if (tp_exec_op(module, op, in, out, &diag) != TP_ERR_INPUT || !strstr(diag.last, "target 5 at position 4"))
    fail("exec CrossEntropy bad target: %s", diag.last);

  /* Embedding: an id out of range is a user error naming the id */
  op = add_op(TP_OP_Embedding, 2, 1);
  int64_t ids[3] = {1, 9, 0};
  float emb[6];
  in[0] = tensor(TP_F32, w, 2, (int64_t[]){5, 4});
  in[1] = tensor(TP_I64, ids, 1, (int64_t[]){3});
  out[0] = tensor(TP_F32, emb, 2, (int64_t[]){3, 4});
  if (tp_exec_op(module, op, in, out, &diag) != TP_ERR_INPUT || !strstr(diag.last, "id 9 at position 1"))
    fail("exec Embedding bad id: %s", diag.last);

  /* LogSoftmaxBackward is the log form, SoftmaxBackward the plain one */
  float *dy = rand_array(12, 1), *yy = rand_array(12, 1), dx[12], dxw[12];
  for (int k = 0; k < 2; k++) {
    op = add_op(k ? TP_OP_LogSoftmaxBackward : TP_OP_SoftmaxBackward, 2, 1);
    tp_set_attr_int(module, op, "axis", 0);
    in[0] = tensor(TP_F32, dy, 2, (int64_t[]){3, 4});
    in[1] = tensor(TP_F32, yy, 2, (int64_t[]){3, 4});
    out[0] = tensor(TP_F32, dx, 2, (int64_t[]){3, 4});
    if (tp_exec_op(module, op, in, out, &diag) != TP_OK) fail("exec softmax backward: %s", diag.last);
    tp_softmax_backward_f32(dy, yy, 1, 3, 4, k == 1, dxw);
    if (memcmp(dx, dxw, sizeof dx))
      fail("exec %s differs from the kernel", k ? "LogSoftmaxBackward" : "SoftmaxBackward");
  }

  /* AttentionBackward 3-D with head counts = the kernel on the packed layout; results absent */
  op = add_op(TP_OP_AttentionBackward, 4, 3);
  tp_set_attr_int(module, op, "q_num_heads", 2);
  tp_set_attr_int(module, op, "kv_num_heads", 1);
  tp_set_attr_int(module, op, "is_causal", 1);
  module->ops[op].outputs[0] = -1; /* dQ not needed */
  float *aq = rand_array(2 * 3 * 8, 1), *ak = rand_array(2 * 3 * 4, 1), *av = rand_array(2 * 3 * 4, 1);
  float *ady = rand_array(2 * 3 * 8, 1), dk[24], dv[24], dkw[24], dvw[24];
  in[0] = tensor(TP_F32, ady, 3, (int64_t[]){2, 3, 8});
  in[1] = tensor(TP_F32, aq, 3, (int64_t[]){2, 3, 8});
  in[2] = tensor(TP_F32, ak, 3, (int64_t[]){2, 3, 4});
  in[3] = tensor(TP_F32, av, 3, (int64_t[]){2, 3, 4});
  out[0] = (TpTensor){0};
  out[1] = tensor(TP_F32, dk, 3, (int64_t[]){2, 3, 4});
  out[2] = tensor(TP_F32, dv, 3, (int64_t[]){2, 3, 4});
  if (tp_exec_op(module, op, in, out, &diag) != TP_OK) fail("exec AttentionBackward: %s", diag.last);
  TpAttention p = {.batch = 2,
                   .q_heads = 2,
                   .kv_heads = 1,
                   .q_len = 3,
                   .kv_len = 3,
                   .head_size = 4,
                   .v_head_size = 4,
                   .packed = true,
                   .is_causal = true,
                   .scale = 0.5f};
  tp_attention_backward_f32(&p, ady, aq, ak, av, NULL, NULL, NULL, dkw, dvw);
  if (memcmp(dk, dkw, sizeof dk) || memcmp(dv, dvw, sizeof dv))
    fail("exec AttentionBackward differs from the kernel");

  /* The fused ops through the table = their kernels: RMSNormBackward without dScale,
   * RotaryBackward (interleaved, partial), SwiGLUBackward; a misfit table is refused */
  op = add_op(TP_OP_RMSNormBackward, 3, 2);
  tp_set_attr_int(module, op, "axis", 1);
  tp_set_attr_float(module, op, "epsilon", 1e-5);
  module->ops[op].outputs[1] = -1;
  float *g8 = rand_array(24, 1), *x8 = rand_array(24, 1), *u8 = rand_array(24, 1), f[24], fw[24], f2[24], f2w[24];
  in[0] = tensor(TP_F32, g8, 2, (int64_t[]){3, 8});
  in[1] = tensor(TP_F32, x8, 2, (int64_t[]){3, 8});
  in[2] = tensor(TP_F32, w, 1, (int64_t[]){8});
  out[0] = tensor(TP_F32, f, 2, (int64_t[]){3, 8});
  out[1] = (TpTensor){0};
  if (tp_exec_op(module, op, in, out, &diag) != TP_OK) fail("exec RMSNormBackward: %s", diag.last);
  tp_rmsnorm_backward_f32(g8, x8, w, 3, 8, 1e-5f, fw, NULL);
  if (memcmp(f, fw, sizeof f)) fail("exec RMSNormBackward differs from the kernel");

  op = add_op(TP_OP_RotaryBackward, 3, 1);
  tp_set_attr_int(module, op, "interleaved", 1);
  tp_set_attr_int(module, op, "rotary_dim", 4);
  in[0] = tensor(TP_F32, g8, 3, (int64_t[]){1, 3, 8});
  in[1] = tensor(TP_F32, x8, 3, (int64_t[]){1, 3, 4});
  in[2] = tensor(TP_F32, u8, 3, (int64_t[]){1, 3, 4});
  out[0] = tensor(TP_F32, f, 3, (int64_t[]){1, 3, 8});
  if (tp_exec_op(module, op, in, out, &diag) != TP_OK) fail("exec RotaryBackward: %s", diag.last);
  tp_rotary_backward_f32(g8, x8, u8, 3, (int64_t[]){1, 3, 8}, (int64_t[]){1, 3, 4}, 4, true, fw);
  if (memcmp(f, fw, sizeof f)) fail("exec RotaryBackward differs from the kernel");
  in[2].dims[1] = 1; /* Sin [1, 1, 4] against Cos [1, 3, 4] */
  if (tp_exec_op(module, op, in, out, &diag) != TP_ERR_INPUT)
    fail("exec RotaryBackward accepted tables that differ");

  op = add_op(TP_OP_SwiGLUBackward, 3, 2);
  in[0] = tensor(TP_F32, g8, 1, (int64_t[]){24});
  in[1] = tensor(TP_F32, x8, 1, (int64_t[]){24});
  in[2] = tensor(TP_F32, u8, 1, (int64_t[]){24});
  out[0] = tensor(TP_F32, f, 1, (int64_t[]){24});
  out[1] = tensor(TP_F32, f2, 1, (int64_t[]){24});
  if (tp_exec_op(module, op, in, out, &diag) != TP_OK) fail("exec SwiGLUBackward: %s", diag.last);
  tp_swiglu_backward_f32(g8, x8, u8, 24, fw, f2w);
  if (memcmp(f, fw, sizeof f) || memcmp(f2, f2w, sizeof f2)) fail("exec SwiGLUBackward differs from the kernel");

  op = add_op(TP_OP_GeGLUBackward, 3, 2); /* in and out as SwiGLUBackward's */
  tp_set_attr_string(module, op, "approximate", "tanh");
  if (tp_exec_op(module, op, in, out, &diag) != TP_OK) fail("exec GeGLUBackward: %s", diag.last);
  tp_geglu_backward_f32(g8, x8, u8, 24, true, fw, f2w);
  if (memcmp(f, fw, sizeof f) || memcmp(f2, f2w, sizeof f2)) fail("exec GeGLUBackward differs from the kernel");
  op = add_op(TP_OP_GeGLU, 2, 1);
  in[0] = in[1], in[1] = in[2];
  if (tp_exec_op(module, op, in, out, &diag) != TP_OK) fail("exec GeGLU: %s", diag.last);
  tp_geglu_f32(x8, u8, 24, false, fw); /* no attribute: the erf form, as Gelu's */
  if (memcmp(f, fw, sizeof f)) fail("exec GeGLU differs from the kernel");
  tp_set_attr_string(module, op, "approximate", "exact");
  if (tp_exec_op(module, op, in, out, &diag) != TP_ERR_INPUT || !strstr(diag.last, "unknown approximate 'exact'"))
    fail("exec GeGLU {approximate = exact}: %s", diag.last);
  free(g8), free(x8), free(u8);

  /* f16 is refused with a message, not computed */
  op = add_op(TP_OP_GeluBackward, 2, 1);
  in[0] = tensor(TP_F16, dy, 1, (int64_t[]){4});
  in[1] = tensor(TP_F16, yy, 1, (int64_t[]){4});
  out[0] = tensor(TP_F16, dx, 1, (int64_t[]){4});
  if (tp_exec_op(module, op, in, out, &diag) != TP_ERR_INPUT || !strstr(diag.last, "f32 only"))
    fail("exec GeluBackward f16: %s", diag.last);

  free(x), free(w), free(b), free(lg), free(dy), free(yy), free(aq), free(ak), free(av), free(ady);
  fclose(sink);
  tp_module_free(module);
}

/* ---- RMSNorm, Rotary, SwiGLU (the fused ops of modern blocks) ---- */

/* Forward results against a plain double reference: the first mismatch beyond tol. */
static void check_forward(const char *what, const float *got, const double *want, int64_t n, double tol) {
  for (int64_t i = 0; i < n; i++)
    if (!(fabs(got[i] - want[i]) <= tol)) {
      fail("%s forward: max_abs_err=%.3g at [%lld] (got %.7g, want %.7g)", what, fabs(got[i] - want[i]),
           (long long)i, got[i], want[i]);
      return;
    }
}

typedef struct {
  int64_t rows, n;
  float *x, *scale, *y, *dy;
} RmsCase;

static double rmsnorm_loss(void *ctx) {
  RmsCase *c = ctx;
  tp_rmsnorm_f32(c->x, c->scale, c->rows, c->n, 1e-6f, c->y);
  return dot(c->dy, c->y, c->rows * c->n);
}

static void test_rmsnorm(void) {
  RmsCase c = {.rows = 5, .n = 7};
  int64_t total = c.rows * c.n;
  c.x = rand_array(total, 2), c.scale = rand_array(c.n, 1), c.y = zeros(total), c.dy = rand_array(total, 1);
  double *want = malloc((size_t)total * sizeof *want);
  for (int64_t r = 0; r < c.rows; r++) {
    double ms = 0;
    for (int64_t j = 0; j < c.n; j++) ms += (double)c.x[r * c.n + j] * c.x[r * c.n + j] / (double)c.n;
    for (int64_t j = 0; j < c.n; j++) want[r * c.n + j] = c.x[r * c.n + j] / sqrt(ms + 1e-6) * c.scale[j];
  }
  rmsnorm_loss(&c);
  check_forward("rmsnorm", c.y, want, total, 1e-5);
  float *dx = zeros(total), *ds = zeros(c.n);
  tp_rmsnorm_backward_f32(c.dy, c.x, c.scale, c.rows, c.n, 1e-6f, dx, ds);
  check_grad("rmsnorm dX", rmsnorm_loss, &c, c.x, total, dx, 1e-2f, 5e-4);
  check_grad("rmsnorm dScale", rmsnorm_loss, &c, c.scale, c.n, ds, 1e-2f, 1e-4);
  free(c.x), free(c.scale), free(c.y), free(c.dy), free(want), free(dx), free(ds);
}

typedef struct {
  int64_t dims[4], table_dims[4], rd;
  bool interleaved;
  float *x, *cos, *sin, *y, *dy;
} RotaryCase;

static double rotary_loss(void *ctx) {
  RotaryCase *c = ctx;
  tp_rotary_f32(c->x, c->cos, c->sin, 4, c->dims, c->table_dims, c->rd, c->interleaved, c->y);
  return dot(c->dy, c->y, tp_numel(4, c->dims));
}

/* X dims, the tables' dims, rotary_dim: y = x cos + rot(x) sin on the first rd features,
 * with rot written out as the exporters' rotate_half and rotate_every_two compute it. */
static void test_rotary(const int64_t *dims, const int64_t *table_dims, int64_t rd, bool interleaved) {
  RotaryCase c = {.rd = rd, .interleaved = interleaved};
  memcpy(c.dims, dims, sizeof c.dims);
  memcpy(c.table_dims, table_dims, sizeof c.table_dims);
  int64_t n = tp_numel(4, dims), nt = tp_numel(4, table_dims), D = dims[3], h = rd / 2;
  c.x = rand_array(n, 1), c.cos = rand_array(nt, 1), c.sin = rand_array(nt, 1), c.y = zeros(n),
  c.dy = rand_array(n, 1);
  double *want = malloc((size_t)n * sizeof *want);
  for (int64_t i = 0; i < n; i++) {
    int64_t j = i % D, idx[4], rest = i, t = 0;
    for (int k = 3; k >= 0; k--) idx[k] = rest % dims[k], rest /= dims[k];
    for (int k = 0; k < 3; k++) t = t * table_dims[k] + (table_dims[k] == 1 ? 0 : idx[k]);
    t = t * rd + j;
    const float *x = c.x + (i - j);
    double rot = interleaved ? (j % 2 ? x[j - 1] : -x[j + 1]) : (j < h ? -x[j + h] : x[j - h]);
    want[i] = j < rd ? x[j] * (double)c.cos[t] + rot * c.sin[t] : x[j];
  }
  char what[96];
  snprintf(what, sizeof what, "rotary [%lld,%lld,%lld,%lld] rd %lld interleaved %d", (long long)dims[0],
           (long long)dims[1], (long long)dims[2], (long long)dims[3], (long long)rd, interleaved);
  rotary_loss(&c);
  check_forward(what, c.y, want, n, 1e-6);
  float *dx = zeros(n);
  tp_rotary_backward_f32(c.dy, c.cos, c.sin, 4, c.dims, c.table_dims, rd, interleaved, dx);
  check_grad(what, rotary_loss, &c, c.x, n, dx, 1e-2f, 1e-4);
  free(c.x), free(c.cos), free(c.sin), free(c.y), free(c.dy), free(want), free(dx);
}

typedef struct {
  int64_t n;
  float *gate, *up, *y, *dy;
} SwigluCase;

static double swiglu_loss(void *ctx) {
  SwigluCase *c = ctx;
  tp_swiglu_f32(c->gate, c->up, c->n, c->y);
  return dot(c->dy, c->y, c->n);
}

static void test_swiglu(void) {
  SwigluCase c = {.n = 40};
  c.gate = rand_array(c.n, 6), c.up = rand_array(c.n, 2), c.y = zeros(c.n), c.dy = rand_array(c.n, 1);
  c.gate[0] = -100, c.gate[1] = 100; /* sigmoid saturated both ways */
  double *want = malloc((size_t)c.n * sizeof *want);
  for (int64_t i = 0; i < c.n; i++) want[i] = c.gate[i] / (1 + exp(-(double)c.gate[i])) * c.up[i];
  swiglu_loss(&c);
  check_forward("swiglu", c.y, want, c.n, 1e-5);
  float *dg = zeros(c.n), *du = zeros(c.n);
  c.gate[0] = -10, c.gate[1] = 10; /* within float's finite-difference reach */
  tp_swiglu_backward_f32(c.dy, c.gate, c.up, c.n, dg, du);
  check_grad("swiglu dGate", swiglu_loss, &c, c.gate, c.n, dg, 1e-2f, 1e-4);
  check_grad("swiglu dUp", swiglu_loss, &c, c.up, c.n, du, 1e-2f, 1e-4);
  free(c.gate), free(c.up), free(c.y), free(c.dy), free(want), free(dg), free(du);
}

/* ---- GeGLU ---- */

typedef struct {
  bool tanh_approx;
  int64_t n;
  float *gate, *up, *y, *dy;
} GegluCase;

static double geglu_loss(void *ctx) {
  GegluCase *c = ctx;
  tp_geglu_f32(c->gate, c->up, c->n, c->tanh_approx, c->y);
  return dot(c->dy, c->y, c->n);
}

/* The largest |a - b| over n. */
static double max_diff(const float *a, const float *b, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; i++)
    if (!(fabs((double)a[i] - b[i]) <= worst)) worst = fabs((double)a[i] - b[i]);
  return worst;
}

/* Against PyTorch's numbers, against the Gelu, Mul and GeluBackward kernels it fuses (the
 * same bits: it calls them), and the backward against finite differences. */
static void test_geglu(bool tanh_approx) {
  const char *form = tanh_approx ? "geglu tanh" : "geglu none";
  /* torch 2.15, float64: y = gelu(gate, approximate) * up, y.backward(dy) */
  static const float gate7[7] = {-3.5f, -1.25f, -0.5f, 0, 0.75f, 2, 5.5f};
  static const float up7[7] = {0.5f, -2, 1.5f, 3, -0.25f, 1, -1.5f};
  static const float dy7[7] = {1, 0.5f, -1, 2, -0.75f, 1.25f, 0.25f};
  static const double torch[2][3][7] =
      {{{-0.000407100888, 0.264124434, -0.231403154, 0, -0.145007371, 1.95449974, -8.24999984},
        {-0.00141088018, 0.122661583, -0.198757313, 3, 0.187354823, 1.35653975, -0.375000215},
        {-0.000814201777, -0.0660311085, 0.154268769, 0, -0.435022114, 2.44312467, 1.37499997}},
       {{-0.000308098828, 0.264571594, -0.231428985, 0, -0.144990139, 1.95459769, -8.24999999},
        {-0.00121132188, 0.122492632, -0.198945145, 3, 0.187300923, 1.35762407, -0.375000018},
        {-0.000616197655, -0.0661428985, 0.15428599, 0, -0.434970416, 2.44324712, 1.375}}};
  float y7[7], dg7[7], du7[7];
  char what[64];
  tp_geglu_f32(gate7, up7, 7, tanh_approx, y7);
  tp_geglu_backward_f32(dy7, gate7, up7, 7, tanh_approx, dg7, du7);
  snprintf(what, sizeof what, "%s vs torch", form);
  check_forward(what, y7, torch[tanh_approx][0], 7, 4e-6);
  snprintf(what, sizeof what, "%s dGate vs torch", form);
  check_forward(what, dg7, torch[tanh_approx][1], 7, 4e-6);
  snprintf(what, sizeof what, "%s dUp vs torch", form);
  check_forward(what, du7, torch[tanh_approx][2], 7, 4e-6);

  /* the unfused kernels, on several threads' pieces and a ragged end */
  int64_t n = 50003;
  float *g = rand_array(n, 6), *u = rand_array(n, 2), *d = rand_array(n, 1), *y = zeros(n), *dg = zeros(n);
  float *du = zeros(n), *gelu = zeros(n), *ref = zeros(n), *dgelu = zeros(n), *ref_dg = zeros(n), *ref_du = zeros(n);
  TpTensor G = tensor(TP_F32, g, 1, &n), U = tensor(TP_F32, u, 1, &n), D = tensor(TP_F32, d, 1, &n);
  TpTensor Gelu = tensor(TP_F32, gelu, 1, &n), Ref = tensor(TP_F32, ref, 1, &n),
           Dgelu = tensor(TP_F32, dgelu, 1, &n);
  TpTensor RefDu = tensor(TP_F32, ref_du, 1, &n);
  tp_unary(tanh_approx ? TP_UNARY_GELU_TANH : TP_UNARY_GELU, &G, &Gelu);
  tp_binary(TP_BINARY_MUL, &Gelu, &U, &Ref);
  tp_binary(TP_BINARY_MUL, &D, &U, &Dgelu);
  tp_gelu_backward_f32(dgelu, g, n, tanh_approx, ref_dg);
  tp_binary(TP_BINARY_MUL, &D, &Gelu, &RefDu);
  tp_geglu_f32(g, u, n, tanh_approx, y);
  tp_geglu_backward_f32(d, g, u, n, tanh_approx, dg, du);
  double dy_ = max_diff(y, ref, n), dg_ = max_diff(dg, ref_dg, n), du_ = max_diff(du, ref_du, n);
  if (dy_ != 0 || dg_ != 0 || du_ != 0)
    fail("%s: the fused kernels differ from the unfused ones by y %.3g, dGate %.3g, dUp %.3g", form, dy_, dg_, du_);
  float *only = zeros(n); /* one result asked for: the same values */
  tp_geglu_backward_f32(d, g, u, n, tanh_approx, only, NULL);
  if (memcmp(only, dg, (size_t)n * sizeof *only)) fail("%s: dGate alone differs", form);
  tp_geglu_backward_f32(d, g, u, n, tanh_approx, NULL, only);
  if (memcmp(only, du, (size_t)n * sizeof *only)) fail("%s: dUp alone differs", form);
  free(g), free(u), free(d), free(y), free(dg), free(du), free(gelu), free(ref), free(dgelu), free(ref_dg),
      free(ref_du), free(only);

  GegluCase c = {.tanh_approx = tanh_approx, .n = 40};
  c.gate = rand_array(c.n, 4), c.up = rand_array(c.n, 2), c.y = zeros(c.n), c.dy = rand_array(c.n, 1);
  float *cg = zeros(c.n), *cu = zeros(c.n);
  tp_geglu_backward_f32(c.dy, c.gate, c.up, c.n, tanh_approx, cg, cu);
  snprintf(what, sizeof what, "%s dGate", form);
  check_grad(what, geglu_loss, &c, c.gate, c.n, cg, 1e-2f, 5e-4);
  snprintf(what, sizeof what, "%s dUp", form);
  check_grad(what, geglu_loss, &c, c.up, c.n, cu, 1e-2f, 1e-4);
  free(c.gate), free(c.up), free(c.y), free(c.dy), free(cg), free(cu);
}

int main(void) {
  test_linear(false, true);
  test_linear(true, true);
  test_linear(false, false);
  test_matmul();
  test_gather_embedding();
  test_slice();
  test_layernorm();
  test_gelu(false);
  test_gelu(true);
  test_softmax(false, 1);
  test_softmax(false, 3);
  test_softmax(true, 1);
  test_softmax(true, 3);
  test_attention();
  test_cross_entropy();
  test_rmsnorm();
  test_rotary((int64_t[]){2, 3, 4, 8}, (int64_t[]){1, 1, 4, 8}, 8, false); /* Llama: [B, H, T, D] */
  test_rotary((int64_t[]){2, 3, 4, 8}, (int64_t[]){2, 1, 4, 4}, 4, false); /* partial, per-row tables */
  test_rotary((int64_t[]){2, 4, 3, 8}, (int64_t[]){1, 4, 1, 4}, 4, true);  /* GPT-J: [B, T, H, D] */
  test_rotary((int64_t[]){2, 4, 3, 8}, (int64_t[]){1, 4, 1, 8}, 8, true);
  test_swiglu();
  test_geglu(false);
  test_geglu(true);
  test_adamw();
  test_vecmath();
  test_thread_count();
  test_exec();
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("train kernels: all passed\n");
  return 0;
}
