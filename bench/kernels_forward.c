/* Micro-benchmark of the runtime's forward kernels at the sizes of bench/train_vs_pytorch.sh's
 * GPT (B=8, T=256, C=256, 4 heads of 64, vocab 256, MLP 1024). Prints one line per op:
 * name, median and minimum milliseconds over the timed repetitions. Built and run, side by
 * side with PyTorch's ops, by bench/kernels_forward.sh; not a test.
 *
 *   kernels_forward [REPS]    (default 30, after 3 untimed ones) */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/elementwise.h"
#include "cpu/layout.h"
#include "cpu/nn.h"
#include "cpu/transformer.h"

enum { B = 8, T = 256, C = 256, H = 4, D = 64, V = 256, F = 1024, ROWS = B * T };

static float *randoms(int64_t n, float scale, unsigned *seed) {
  float *p = malloc((size_t)n * sizeof *p);
  if (!p) abort();
  for (int64_t i = 0; i < n; i++) p[i] = scale * ((float)rand_r(seed) / RAND_MAX * 2 - 1);
  return p;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int reps = 30;

/* Times fn(ctx) and prints "name median min" in milliseconds. */
static void timeit(const char *name, void (*fn)(void *), void *ctx) {
  double t[1000];
  for (int i = 0; i < 3; i++) fn(ctx);
  for (int i = 0; i < reps; i++) {
    double t0 = omp_get_wtime();
    fn(ctx);
    t[i] = (omp_get_wtime() - t0) * 1e3;
  }
  qsort(t, (size_t)reps, sizeof *t, cmp_double);
  printf("%-14s %9.4f %9.4f\n", name, t[reps / 2], t[0]);
  fflush(stdout);
}

/* The buffers of one transformer block's forward, named as in the model. */
static struct {
  int64_t *idx, *targets;
  float *wte, *wpe, *x, *res, *ln, *mean, *rstd, *wqkv, *bqkv, *qkv, *q, *k, *v, *att, *atty;
  float *wproj, *bproj, *proj, *wfc, *bfc, *fc, *gelu, *wfc2, *bfc2, *wte_t, *logits, *ln_w, *ln_b, *soft, loss;
} g;

static TpTensor tensor(float *p, int rank, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  return (TpTensor){TP_F32, rank, {d0, d1, d2, d3}, p};
}

static void check(TpKernelStatus s) {
  if (s != TP_KERNEL_OK) {
    fprintf(stderr, "kernels_forward: kernel failed (%d)\n", (int)s);
    exit(1);
  }
}

static void op_embedding(void *c) {
  (void)c;
  int64_t bad;
  check(tp_embedding_f32(g.wte, g.idx, ROWS, V, C, g.x, &bad));
}
static void op_add(void *c) {
  (void)c;
  TpTensor a = tensor(g.x, 3, B, T, C, 0), b = tensor(g.proj, 3, B, T, C, 0), y = tensor(g.res, 3, B, T, C, 0);
  check(tp_binary(TP_BINARY_ADD, &a, &b, &y));
}
static void op_layernorm(void *c) {
  (void)c;
  tp_layernorm_f32(g.res, g.ln_w, g.ln_b, ROWS, C, 1e-5f, g.ln, g.mean, g.rstd);
}
static void op_linear_qkv(void *c) {
  (void)c;
  tp_linear_f32(g.ln, g.wqkv, g.bqkv, ROWS, C, 3 * C, false, g.qkv);
}
/* Split q, k, v and move heads first: [B, T, H, D] -> [B, H, T, D], as the export does. */
static void op_qkv_heads(void *c) {
  (void)c;
  TpTensor qkv = tensor(g.qkv, 3, B, T, 3 * C, 0);
  TpTensor parts[3] = {tensor(g.proj, 3, B, T, C, 0), tensor(g.res, 3, B, T, C, 0), tensor(g.atty, 3, B, T, C, 0)};
  check(tp_split(&qkv, 2, parts, 3));
  float *dst[3] = {g.q, g.k, g.v};
  for (int i = 0; i < 3; i++) {
    TpTensor x = tensor(parts[i].data, 4, B, T, H, D), y = tensor(dst[i], 4, B, H, T, D);
    check(tp_transpose(&x, (const int64_t[]){0, 2, 1, 3}, &y));
  }
}
static void op_attention(void *c) {
  (void)c;
  TpAttention p = {.batch = B,
                   .q_heads = H,
                   .kv_heads = H,
                   .q_len = T,
                   .kv_len = T,
                   .head_size = D,
                   .v_head_size = D,
                   .is_causal = true,
                   .scale = 0.125f};
  tp_attention_f32(&p, g.q, g.k, g.v, NULL, NULL, g.att, NULL, NULL, NULL, NULL);
}
static void op_heads_back(void *c) {
  (void)c;
  TpTensor x = tensor(g.att, 4, B, H, T, D), y = tensor(g.atty, 4, B, T, H, D);
  check(tp_transpose(&x, (const int64_t[]){0, 2, 1, 3}, &y));
}
static void op_linear_proj(void *c) {
  (void)c;
  tp_linear_f32(g.atty, g.wproj, g.bproj, ROWS, C, C, false, g.proj);
}
static void op_linear_fc(void *c) {
  (void)c;
  tp_linear_f32(g.ln, g.wfc, g.bfc, ROWS, C, F, false, g.fc);
}
static void op_gelu(void *c) {
  TpTensor x = tensor(g.fc, 2, ROWS, F, 0, 0), y = tensor(g.gelu, 2, ROWS, F, 0, 0);
  check(tp_unary(*(TpUnaryOp *)c, &x, &y));
}
static void op_linear_fc2(void *c) {
  (void)c;
  tp_linear_f32(g.gelu, g.wfc2, g.bfc2, ROWS, F, C, false, g.proj);
}
/* The tied head: wte transposed once, then a linear without bias. */
static void op_head(void *c) {
  (void)c;
  TpTensor w = tensor(g.wte, 2, V, C, 0, 0), wt = tensor(g.wte_t, 2, C, V, 0, 0);
  check(tp_transpose(&w, (const int64_t[]){1, 0}, &wt));
  tp_linear_f32(g.ln, g.wte_t, NULL, ROWS, C, V, false, g.logits);
}
static void op_cross_entropy(void *c) {
  (void)c;
  int64_t bad;
  check(tp_cross_entropy_f32(g.logits, g.targets, ROWS, V, ROWS, &g.loss, &bad));
}
static void op_softmax(void *c) { tp_softmax_f32(g.logits, g.soft, ROWS, V, 1, *(bool *)c); }

int main(int argc, char **argv) {
  if (argc > 1) reps = atoi(argv[1]);
  if (reps < 1 || reps > 1000) {
    fprintf(stderr, "usage: kernels_forward [REPS (1..1000)]\n");
    return 2;
  }
  unsigned seed = 1;
  g.idx = malloc(ROWS * sizeof *g.idx);
  g.targets = malloc(ROWS * sizeof *g.targets);
  for (int i = 0; i < ROWS; i++) g.idx[i] = rand_r(&seed) % V, g.targets[i] = rand_r(&seed) % V;
  g.wte = randoms(V * C, 0.02f, &seed);
  g.wpe = randoms(T * C, 0.02f, &seed);
  g.x = randoms(ROWS * C, 1, &seed);
  g.res = randoms(ROWS * C, 1, &seed);
  g.ln = randoms(ROWS * C, 1, &seed);
  g.mean = randoms(ROWS, 1, &seed);
  g.rstd = randoms(ROWS, 1, &seed);
  g.ln_w = randoms(C, 1, &seed);
  g.ln_b = randoms(C, 1, &seed);
  g.wqkv = randoms(C * 3 * C, 0.06f, &seed);
  g.bqkv = randoms(3 * C, 0.02f, &seed);
  g.qkv = randoms(ROWS * 3 * C, 1, &seed);
  g.q = randoms(ROWS * C, 1, &seed);
  g.k = randoms(ROWS * C, 1, &seed);
  g.v = randoms(ROWS * C, 1, &seed);
  g.att = randoms(ROWS * C, 1, &seed);
  g.atty = randoms(ROWS * C, 1, &seed);
  g.wproj = randoms(C * C, 0.06f, &seed);
  g.bproj = randoms(C, 0.02f, &seed);
  g.proj = randoms(ROWS * C, 1, &seed);
  g.wfc = randoms(C * F, 0.06f, &seed);
  g.bfc = randoms(F, 0.02f, &seed);
  g.fc = randoms(ROWS * F, 2, &seed);
  g.gelu = randoms(ROWS * F, 1, &seed);
  g.wfc2 = randoms(F * C, 0.03f, &seed);
  g.bfc2 = randoms(C, 0.02f, &seed);
  g.wte_t = randoms(V * C, 1, &seed);
  g.logits = randoms(ROWS * V, 3, &seed);
  g.soft = randoms(ROWS * V, 1, &seed);

  printf("# tokpipe kernels, %d threads, %d reps: op median_ms min_ms\n", omp_get_max_threads(), reps);
  TpUnaryOp gelu_tanh = TP_UNARY_GELU_TANH, gelu_erf = TP_UNARY_GELU;
  bool log = true, plain = false;
  timeit("embedding", op_embedding, NULL);
  timeit("add", op_add, NULL);
  timeit("layernorm", op_layernorm, NULL);
  timeit("linear_qkv", op_linear_qkv, NULL);
  timeit("qkv_heads", op_qkv_heads, NULL);
  timeit("attention", op_attention, NULL);
  timeit("heads_back", op_heads_back, NULL);
  timeit("linear_proj", op_linear_proj, NULL);
  timeit("linear_fc", op_linear_fc, NULL);
  timeit("gelu_tanh", op_gelu, &gelu_tanh);
  timeit("gelu_erf", op_gelu, &gelu_erf);
  timeit("linear_fc2", op_linear_fc2, NULL);
  timeit("head", op_head, NULL);
  timeit("cross_entropy", op_cross_entropy, NULL);
  timeit("softmax", op_softmax, &plain);
  timeit("log_softmax", op_softmax, &log);
  return 0;
}
