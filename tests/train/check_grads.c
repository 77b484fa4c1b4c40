/* Checks a --dump-grads file of the tiny plan (tiny_plan.c) against central finite
 * differences of the tiny model's loss, computed here in double from tiny.onnx's weights
 * and the first batch of the data file:
 *   check_grads tiny.onnx train.bin grads.safetensors
 * Each gradient must be within 1e-4 of the finite differences relative to the tensor's
 * largest magnitude; the derived head.weight_t must be wte's gradient transposed, bit for
 * bit; the frozen parameter must be absent. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/onnx/onnx_weights.h"
#include "runtime/train/safetensors.h"
#include "runtime/train/tokens.h"

enum { B = 2, T = 8, V = 256, C = 8, BT = B * T };

static double wte[V * C], wpe[T * C], shift[C], bias[V];
static int64_t tokens[BT], targets[BT];

static double loss(void) {
  double sum = 0;
  for (int r = 0; r < BT; r++) {
    double x[C], logit[V], mx = -INFINITY, z = 0;
    for (int c = 0; c < C; c++) x[c] = wte[tokens[r] * C + c] + wpe[(r % T) * C + c] + shift[c];
    for (int v = 0; v < V; v++) {
      logit[v] = bias[v];
      for (int c = 0; c < C; c++) logit[v] += x[c] * wte[v * C + c];
      mx = fmax(mx, logit[v]);
    }
    for (int v = 0; v < V; v++) z += exp(logit[v] - mx);
    sum += mx + log(z) - logit[targets[r]];
  }
  return sum / BT;
}

static void load(TpOnnxWeights *w, const char *name, double *out, int n, TpDiag *d) {
  TpTensor t;
  if (tp_onnx_weights_get(w, name, &t, d) || tp_tensor_numel(&t) != n) exit(1);
  for (int i = 0; i < n; i++) {
    float f;
    memcpy(&f, (char *)t.data + 4 * i, 4);
    out[i] = f;
  }
}

static int failures;

/* Compares the dumped gradient `name` (n values) with finite differences of p. */
static void check(const TpSafetensors *st, const char *name, double *p, int n) {
  const TpTensor *g = tp_safetensors_find(st, name);
  if (!g || g->dtype != TP_F32 || tp_tensor_numel(g) != n) {
    printf("FAIL %s: missing from the dump or of the wrong size\n", name);
    failures++;
    return;
  }
  const float *gv = g->data;
  double gmax = 0, err = 0;
  int at = 0;
  for (int i = 0; i < n; i++) gmax = fmax(gmax, fabs(gv[i]));
  for (int i = 0; i < n; i++) {
    double keep = p[i], h = 1e-4;
    p[i] = keep + h;
    double up = loss();
    p[i] = keep - h;
    double down = loss();
    p[i] = keep;
    double e = fabs((up - down) / (2 * h) - gv[i]);
    if (e > err) err = e, at = i;
  }
  bool ok = gmax > 0 && err <= 1e-4 * gmax;
  printf("%s %s: max_abs_err=%.3g at [%d] (largest gradient %.3g)\n", ok ? "ok" : "FAIL", name, err, at, gmax);
  failures += !ok;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: check_grads tiny.onnx train.bin grads.safetensors\n");
    return 2;
  }
  TpDiag d;
  tp_diag_init(&d, "check_grads", NULL, stderr);
  TpOnnxWeights *w;
  TpTokenFile data;
  TpSafetensors st;
  if (tp_onnx_weights_open(argv[1], &w, &d) || tp_tokens_open(argv[2], V, NULL, BT + 1, &data, &d) ||
      tp_safetensors_load(argv[3], &st, &d))
    return 1;
  load(w, "wte", wte, V * C, &d);
  load(w, "wpe", wpe, T * C, &d);
  load(w, "frozen.shift", shift, C, &d);
  load(w, "shared.bias", bias, V, &d);
  if (tp_tokens_batch(&data, 0, B, T, tokens, targets, &d)) return 1;
  check(&st, "wte", wte, V * C);
  check(&st, "wpe", wpe, T * C);
  check(&st, "head.bias", bias, V);
  const TpTensor *g = tp_safetensors_find(&st, "wte"), *gt = tp_safetensors_find(&st, "head.weight_t");
  bool tied = g && gt && gt->rank == 2 && gt->dims[0] == C && gt->dims[1] == V;
  for (int v = 0; tied && v < V; v++)
    for (int c = 0; c < C; c++) tied &= ((float *)gt->data)[c * V + v] == ((float *)g->data)[v * C + c];
  printf("%s head.weight_t is wte's gradient transposed\n", tied ? "ok" : "FAIL");
  bool frozen_absent = !tp_safetensors_find(&st, "frozen.shift") && st.n == 4;
  printf("%s the dump holds 4 tensors, not the frozen one (%d)\n", frozen_absent ? "ok" : "FAIL", st.n);
  failures += !tied + !frozen_absent;
  tp_safetensors_free(&st);
  tp_tokens_close(&data);
  tp_onnx_weights_close(w);
  return failures ? 1 : 0;
}
