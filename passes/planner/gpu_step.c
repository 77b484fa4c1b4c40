/* A one-GPU training step by kernel class (gpu_step.h). */
#include "gpu_step.h"

#include <string.h>

const char *const tp_gpu_class_names[TP_GPU_CLASSES] = {"products", "attention", "elementwise/norm", "loss",
                                                        "optimizer"};

/* The class of a kernel of tp_layer_kernels / tp_edge_kernels, by its name. */
static TpGpuClass kernel_class(const TpKernel *k) {
  static const struct {
    const char *prefix;
    TpGpuClass cls;
  } classes[] = {
      {"qkv", TP_GPU_PRODUCTS},          {"attn_out", TP_GPU_PRODUCTS},   {"fc", TP_GPU_PRODUCTS},
      {"lm_head", TP_GPU_PRODUCTS},      {"attn_", TP_GPU_ATTENTION},     {"softmax", TP_GPU_ATTENTION},
      {"layernorm", TP_GPU_ELEMENTWISE}, {"dropout", TP_GPU_ELEMENTWISE}, {"gelu", TP_GPU_ELEMENTWISE},
      {"embed", TP_GPU_ELEMENTWISE},     {"cross_entropy", TP_GPU_LOSS},
  };
  for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++)
    if (!strncmp(k->name, classes[i].prefix, strlen(classes[i].prefix))) return classes[i].cls;
  TP_ASSERT(!"a kernel of no class"); /* a kernel added to cost.c without a row here */
  return TP_GPU_CLASSES;
}

static void add_kernels(const TpCostModel *cm, const TpKernel *k, int n, double times, TpGpuStep *s) {
  for (int i = 0; i < n; i++) {
    TpGpuClassCost *c = &s->cls[kernel_class(&k[i])];
    c->flops += times * k[i].flops;
    c->bytes += times * k[i].bytes;
    c->seconds += times * tp_kernel_time(cm, &k[i]);
    c->kernels += (int)times;
  }
}

void tp_gpu_step(const TpCostModel *cm, int batch, TpGpuStep *s) {
  TP_ASSERT(cm->nstages == 1 && cm->tensor == 1 && cm->data == 1 && !cm->cal && batch >= 1);
  const TpModelDesc *m = &cm->model;
  memset(s, 0, sizeof *s);
  TpKernel k[TP_MAX_KERNELS];
  for (int bw = 0; bw < 2; bw++) {
    add_kernels(cm, k, tp_layer_kernels(cm, batch, m->seq, 0, bw, k), m->layers, s);
    add_kernels(cm, k, tp_edge_kernels(cm, &cm->stage[0], batch, m->seq, bw, k), 1, s);
  }
  s->params = tp_stage_params(cm, 0);
  TpGpuClassCost *opt = &s->cls[TP_GPU_OPTIMIZER]; /* tp_optimizer_time's one pass of AdamW */
  opt->flops = 12 * s->params;                     /* moments, bias corrections, decay, update */
  opt->bytes = 32 * s->params;
  opt->seconds = tp_optimizer_time(cm, 0);
  opt->kernels = 1;
  for (int c = 0; c < TP_GPU_CLASSES; c++) s->seconds += s->cls[c].seconds;
  s->tokens = (double)batch * m->seq;
  /* nanoGPT's count: N without the position table (looked up, never multiplied) */
  double n = s->params - (double)m->seq * m->hidden;
  s->model_flops = s->tokens * (6 * n + 12.0 * m->layers * m->hidden * m->seq);
  s->tokens_per_s = s->tokens / s->seconds;
  s->mfu = s->model_flops / s->seconds / cm->hw.peak_flops;
}
