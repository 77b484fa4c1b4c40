/* Checks an --export-onnx model of the tiny plan: it imports (tp_import_onnx_file), every
 * tensor of the --dump-weights file is a parameter of it with the same bits (head.bias
 * included, an Identity alias in the original model), and the reference interpreter's
 * loss on the first batch of a token file equals the trainer's loss for it:
 *   check_export exported.onnx weights.safetensors tokens.bin LOSS */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "interp/interp.h"
#include "runtime/train/safetensors.h"
#include "runtime/train/tokens.h"

enum { B = 2, T = 8, V = 256 };

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: check_export exported.onnx weights.safetensors tokens.bin LOSS\n");
    return 2;
  }
  TpDiag d;
  tp_diag_init(&d, "check_export", NULL, stderr);
  TpModule *m;
  TpSafetensors st;
  TpTokenFile data;
  if (tp_import_onnx_file(argv[1], NULL, &m, &d) || tp_safetensors_load(argv[2], &st, &d) ||
      tp_tokens_open(argv[3], V, NULL, B * T + 1, &data, &d))
    return 1;
  int failures = 0;
  for (int i = 0; i < st.n; i++) {
    int v = tp_find_value(m, st.tensors[i].name);
    bool same = v >= 0 && m->values[v].kind == TP_VAL_PARAM;
    if (same) {
      TpTensor t = tp_value_tensor(m, v);
      same = tp_tensor_bytes(&t) == tp_tensor_bytes(&st.tensors[i].t) &&
             memcmp(t.data, st.tensors[i].t.data, tp_tensor_bytes(&t)) == 0;
    }
    printf("%s %s is a parameter of the exported model with the trained value\n", same ? "ok" : "FAIL",
           st.tensors[i].name);
    failures += !same;
  }
  int64_t tokens[B * T], targets[B * T];
  if (tp_tokens_batch(&data, 0, B, T, tokens, targets, &d)) return 1;
  TpTensor in = {.dtype = TP_I64, .rank = 2, .dims = {B, T}, .data = tokens}, out;
  if (tp_interp_run(m, &in, &out, &d)) return 1;
  const float *logits = out.data;
  double sum = 0;
  for (int r = 0; r < B * T; r++) {
    double mx = -INFINITY, z = 0;
    for (int v = 0; v < V; v++) mx = fmax(mx, logits[r * V + v]);
    for (int v = 0; v < V; v++) z += exp(logits[r * V + v] - mx);
    sum += mx + log(z) - logits[r * V + targets[r]];
  }
  double loss = sum / (B * T), want = atof(argv[4]), err = fabs(loss - want) / fabs(want);
  bool ok = err <= 1e-5;
  printf("%s the interpreter's loss %.9g vs the trainer's %.9g (relative error %.3g)\n", ok ? "ok" : "FAIL", loss,
         want, err);
  failures += !ok;
  free(out.data);
  tp_tokens_close(&data);
  tp_safetensors_free(&st);
  tp_module_free(m);
  return failures ? 1 : 0;
}
