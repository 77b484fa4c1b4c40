/* The GPU step model's arithmetic (passes/planner/gpu_step.h) against hand counts: on a
 * device with GEMMs at the full peak, no launch cost and memory fast enough not to matter,
 * the products' and the flash attention's FLOPs of a GPT, their time FLOPs / peak; then
 * with a launch cost, every kernel pays it once; tokens/s and MFU from the step's time.
 * usage: test_gpu_step */
#include <math.h>
#include <stdio.h>

#include "passes/planner/gpu_step.h"

static int failures;
#define CHECK_NEAR(got, want, what)                                                                                 \
  do {                                                                                                              \
    double g_ = (got), w_ = (want);                                                                                 \
    if (!(fabs(g_ - w_) <= 1e-9 * fabs(w_))) {                                                                      \
      printf("FAIL: %s = %.17g, want %.17g (rel_err=%.3g)\n", what, g_, w_, fabs(g_ - w_) / fabs(w_));              \
      failures++;                                                                                                   \
    }                                                                                                               \
  } while (0)

int main(void) {
  const TpModelDesc gpt = {"small", .layers = 3, .hidden = 64, .heads = 4, .seq = 32, .vocab = 101, .ffn = 256};
  const TpHardware ideal = {.name = "ideal",
                            .devices_per_node = 1,
                            .memory_bytes = 1e12,
                            .dtype = "bf16",
                            .dtype_bytes = 2,
                            .peak_flops = 1e12,
                            .gemm_efficiency = 1,
                            .gemm_half_rows = 0,
                            .mem_bandwidth = 1e30};
  const int batch = 5;
  TpDiag d;
  tp_diag_init(&d, "test_gpu_step", NULL, stderr);
  TpCostModel cm;
  if (tp_cost_model_init(&cm, &ideal, &gpt, 1, 1, 1, &d)) return 1;
  cm.flash_attention = true;
  TpGpuStep s;
  tp_gpu_step(&cm, batch, &s);

  double tokens = batch * gpt.seq, h = gpt.hidden, L = gpt.layers, T = gpt.seq;
  /* per layer forward 2 x tokens x (h.3h + h.h + h.ffn + ffn.h), the backward twice that;
   * the head 2 x tokens x h x vocab forward, twice that backward */
  double products = 3 * (L * 2 * tokens * (4 * h * h + 2 * h * gpt.ffn) + 2 * tokens * h * gpt.vocab);
  CHECK_NEAR(s.cls[TP_GPU_PRODUCTS].flops, products, "products' FLOPs");
  CHECK_NEAR(s.cls[TP_GPU_PRODUCTS].seconds, products / ideal.peak_flops, "products' seconds");
  CHECK_NEAR(s.cls[TP_GPU_PRODUCTS].kernels, L * (4 + 8) + 1 + 2, "products' kernels");
  /* causal flash attention: a query sees T/2 keys on average; 4 FLOPs per (query, key,
   * channel) forward, 10 backward */
  double attention = L * 14 * tokens * (T / 2) * h;
  CHECK_NEAR(s.cls[TP_GPU_ATTENTION].flops, attention, "attention's FLOPs");
  CHECK_NEAR(s.cls[TP_GPU_ATTENTION].seconds, attention / ideal.peak_flops, "attention's seconds");
  CHECK_NEAR(s.cls[TP_GPU_ATTENTION].kernels, 2 * L, "attention's kernels");
  /* the parameters: per layer 4h^2 + 2h ffn + 9h + ffn (weights, biases, two norms), the
   * tied table, the positions, the final norm */
  double params = L * (4 * h * h + 2 * h * gpt.ffn + 9 * h + gpt.ffn) + gpt.vocab * h + T * h + 2 * h;
  CHECK_NEAR(s.params, params, "parameters");
  CHECK_NEAR(s.cls[TP_GPU_OPTIMIZER].bytes, 32 * params, "optimizer bytes");
  double model_flops = tokens * (6 * (params - T * h) + 12 * L * h * T);
  CHECK_NEAR(s.model_flops, model_flops, "model FLOPs");
  double sum = 0;
  for (int c = 0; c < TP_GPU_CLASSES; c++) sum += s.cls[c].seconds;
  CHECK_NEAR(s.seconds, sum, "step seconds (the classes in series)");
  CHECK_NEAR(s.tokens_per_s, tokens / s.seconds, "tokens/s");
  CHECK_NEAR(s.mfu, model_flops / s.seconds / ideal.peak_flops, "MFU");

  /* a launch cost: each kernel pays it once, the FLOPs stay */
  TpHardware launched = ideal;
  launched.kernel_overhead_s = 1e-5;
  tp_cost_model_init(&cm, &launched, &gpt, 1, 1, 1, &d);
  cm.flash_attention = true;
  TpGpuStep o;
  tp_gpu_step(&cm, batch, &o);
  int kernels = 0;
  for (int c = 0; c < TP_GPU_CLASSES; c++) kernels += o.cls[c].kernels;
  CHECK_NEAR(o.seconds, s.seconds + kernels * 1e-5, "step seconds with a launch cost");
  CHECK_NEAR(o.cls[TP_GPU_PRODUCTS].flops, products, "products' FLOPs with a launch cost");
  printf("%d kernels; ideal step %.4g ms (%.4g tokens/s, MFU %.3f), with 10 us launches %.4g ms\n", kernels,
         1e3 * s.seconds, s.tokens_per_s, s.mfu, 1e3 * o.seconds);
  if (failures) printf("%d check(s) failed\n", failures);
  return failures ? 1 : 0;
}
