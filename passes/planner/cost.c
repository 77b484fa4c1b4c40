#include <errno.h>
#include "cost.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"

/* ---- hardware profiles ---- */

static int profile_error(TpDiag *d, const char *path, const char *what) {
  return tp_error(d, "hardware profile %s: %s", path, what);
}

#define MIN_FIELD 1e-6

/* A required number in [MIN_FIELD, max] at obj.key (key may be "group.field"), whole if
 * `whole`. */
static bool field(const TpJson *j, const char *key, double max, bool whole, double *out) {
  const char *dot = strchr(key, '.');
  if (dot) {
    char group[64];
    snprintf(group, sizeof group, "%.*s", (int)(dot - key), key);
    j = tp_json_get(j, group);
    key = dot + 1;
  }
  const TpJson *v = tp_json_get(j, key);
  if (!v || v->kind != TP_JSON_NUMBER || !(v->number >= MIN_FIELD && v->number <= max) ||
      (whole && v->number != floor(v->number)))
    return false;
  *out = v->number;
  return true;
}

int tp_hardware_load(const char *path, TpHardware *hw, TpDiag *d) {
  char err[256];
  TpJson *j = tp_json_parse_file(path, err, sizeof err);
  if (!j) return profile_error(d, path, err);
  int rc = tp_hardware_from_json(j, path, hw, d);
  tp_json_free(j);
  return rc;
}

int tp_hardware_from_json(const TpJson *j, const char *path, TpHardware *hw, TpDiag *d) {
  memset(hw, 0, sizeof *hw);
  int rc = TP_OK;
  const TpJson *name = tp_json_get(j, "name"), *device = tp_json_get(j, "device"), *dtype = tp_json_get(j, "dtype");
  double per_node = 0, flops = 0, kernel_us = 0;
  /* generous bounds (a petabyte, a petabyte per second, a second of latency), so that every
   * cost computed from them stays finite (nothing is divided by less than MIN_FIELD) */
  const struct {
    const char *key;
    double *dst, max;
  } num[] = {
      {"devices_per_node", &per_node, 65536},
      {"memory_bytes", &hw->memory_bytes, 1e15},
      {"gemm_efficiency", &hw->gemm_efficiency, 1},
      {"gemm_half_rows", &hw->gemm_half_rows, 1e9},
      {"memory_bandwidth", &hw->mem_bandwidth, 1e15},
      {"kernel_overhead_us", &kernel_us, 1e6},
      {"intra_node.bandwidth", &hw->intra_bandwidth, 1e15},
      {"intra_node.latency_us", &hw->intra_latency_s, 1e6},
      {"inter_node.bandwidth", &hw->inter_bandwidth, 1e15},
      {"inter_node.latency_us", &hw->inter_latency_s, 1e6},
  };
  if (!name || name->kind != TP_JSON_STRING || !dtype || dtype->kind != TP_JSON_STRING) {
    rc = profile_error(d, path, "needs string fields \"name\" and \"dtype\"");
    goto done;
  }
  for (size_t i = 0; i < sizeof num / sizeof num[0]; i++)
    if (!field(j, num[i].key, num[i].max, i == 0, num[i].dst)) {
      char msg[128];
      snprintf(msg, sizeof msg, "field \"%s\" missing or not a %s in [%g, %g]", num[i].key,
               i == 0 ? "whole number" : "number", i == 0 ? 1 : MIN_FIELD, num[i].max);
      rc = profile_error(d, path, msg);
      goto done;
    }
  snprintf(hw->name, sizeof hw->name, "%s", name->string);
  snprintf(hw->device, sizeof hw->device, "%s",
           device && device->kind == TP_JSON_STRING ? device->string : name->string);
  snprintf(hw->dtype, sizeof hw->dtype, "%s", dtype->string);
  hw->dtype_bytes = !strcmp(hw->dtype, "fp32")                                 ? 4
                    : !strcmp(hw->dtype, "fp16") || !strcmp(hw->dtype, "bf16") ? 2
                                                                               : 0;
  if (!hw->dtype_bytes) {
    rc = profile_error(d, path, "\"dtype\" must be fp16, bf16 or fp32");
    goto done;
  }
  if (!field(tp_json_get(j, "peak_flops"), hw->dtype, 1e18, false, &flops)) {
    rc = profile_error(d, path, "\"peak_flops\" has no entry in [1e-06, 1e+18] for the training dtype");
    goto done;
  }
  hw->peak_flops = flops;
  hw->devices_per_node = (int)per_node;
  hw->kernel_overhead_s = kernel_us * 1e-6;
  hw->intra_latency_s *= 1e-6;
  hw->inter_latency_s *= 1e-6;
done:
  return rc;
}

int tp_hardware_find(const char *name, const char *dirs, TpHardware *hw, TpDiag *d) {
  size_t n = strlen(name);
  if (strchr(name, '/') || (n > 5 && !strcmp(name + n - 5, ".json"))) return tp_hardware_load(name, hw, d);
  char known[512] = "";
  const char *p = dirs ? dirs : "";
  while (*p) {
    const char *end = strchr(p, ':');
    if (!end) end = p + strlen(p);
    char dir[1024], path[1300];
    snprintf(dir, sizeof dir, "%.*s", (int)(end - p), p);
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    struct stat st; /* found: loaded (which refuses a FIFO), never opened here */
    if (stat(path, &st) == 0) return tp_hardware_load(path, hw, d);
    DIR *dd = opendir(dir);
    for (struct dirent *e; dd && (e = readdir(dd));) {
      size_t len = strlen(e->d_name);
      if (len > 5 && !strcmp(e->d_name + len - 5, ".json") && strlen(known) + len < sizeof known - 8) {
        if (known[0]) strcat(known, ", ");
        strncat(known, e->d_name, len - 5);
      }
    }
    if (dd) closedir(dd);
    p = *end ? end + 1 : end;
  }
  return tp_error(d, "unknown hardware '%s' (known: %s; or give a profile file path)", name,
                  known[0] ? known : "none found");
}

void tp_profile_dirs(const char *builtin, char *out, size_t size) {
  char exe[1024];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  char *slash = strrchr(exe, '/');
  if (slash) {
    *slash = 0; /* PREFIX/bin */
    snprintf(out, size, "%s:%s/../share/tokpipec/profiles", builtin, exe);
  } else snprintf(out, size, "%s", builtin);
}

/* ---- models ---- */

static const TpModelDesc builtin_models[] = {
    /* GPT-3 sizes of the TeraPipe paper's table of settings */
    {"GPT3-1B", 24, 2048, 16, 2048, 50257, 4 * 2048},
    {"GPT3-13B", 40, 5120, 40, 2048, 50257, 4 * 5120},
    {"GPT3-44B", 96, 6144, 48, 2048, 50257, 4 * 6144},
    {"GPT3-175B", 96, 12288, 96, 2048, 50257, 4 * 12288},
};

/* The transformer's sizes, read off a raised module (after raise-transformer; trained,
 * staged or sliced too): layers = Attention ops (of one slice), hidden and heads from the
 * first one, vocab = the LM head's width (the Linear the loss reads, else the one giving a
 * graph output, else the widest), ffn = the widest other Linear than the head and the QKV
 * projection. */
/* How surely the Linear op is the LM head: 2 if the loss reads it (in a trained module,
 * sliced or not), 1 if it gives a graph output, else 0. */
static int head_rank(const TpModule *m, int op) {
  int y = m->ops[op].outputs[0];
  for (int o = 0; o < m->nops; o++)
    if (m->ops[o].kind == TP_OP_CrossEntropy && m->ops[o].ninputs > 0 && m->ops[o].inputs[0] == y) return 2;
  return tp_is_output(m, y) ? 1 : 0;
}

bool tp_model_describe(const TpModule *m, int64_t seq, TpModelDesc *desc) {
  *desc = (TpModelDesc){.seq = (int)seq};
  snprintf(desc->name, sizeof desc->name, "model");
  int head = -1;
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    if (o->role == TP_ROLE_RECOMPUTE) continue; /* a layer's forward again (passes/recompute.c) */
    if (o->kind == TP_OP_Attention) {
      const TpType *q = &m->values[o->inputs[0]].type;
      desc->layers += o->slice <= 0; /* a sliced module has each layer's attention once per slice */
      desc->heads = q->rank == 4 ? (int)q->dims[1] : (int)tp_attr_int(m, op, "q_num_heads", 1);
      desc->hidden = q->rank == 4 ? (int)(q->dims[1] * q->dims[3]) : (int)q->dims[2];
    } else if (o->kind == TP_OP_Linear) {
      const TpType *y = &m->values[o->outputs[0]].type;
      int rank = head_rank(m, op), have = head >= 0 ? head_rank(m, head) : -1;
      if (rank > have || (rank == have && y->dims[y->rank - 1] > desc->vocab)) {
        head = op;
        desc->vocab = (int)y->dims[y->rank - 1];
      }
    }
  }
  for (int op = 0; op < m->nops; op++) {
    if (m->ops[op].kind != TP_OP_Linear || op == head) continue;
    const TpType *y = &m->values[m->ops[op].outputs[0]].type;
    int w = (int)y->dims[y->rank - 1];
    if (w != 3 * desc->hidden && w > desc->ffn) desc->ffn = w;
  }
  if (!desc->ffn) desc->ffn = 4 * desc->hidden;
  return desc->layers > 0 && desc->hidden > 0 && desc->heads > 0 && desc->vocab > 0 && seq > 0 && seq <= INT32_MAX;
}

int tp_model_parse(const char *spec, TpModelDesc *m, TpDiag *d) {
  for (size_t i = 0; i < sizeof builtin_models / sizeof builtin_models[0]; i++)
    if (!strcasecmp(spec, builtin_models[i].name)) {
      *m = builtin_models[i];
      return TP_OK;
    }
  if (!strchr(spec, '='))
    return tp_error(d,
                    "unknown model '%s' (built in: gpt3-1b, gpt3-13b, gpt3-44b, gpt3-175b; "
                    "or layers=L,hidden=H,heads=A,seq=T,vocab=V)",
                    spec);
  memset(m, 0, sizeof *m);
  snprintf(m->name, sizeof m->name, "custom");
  char *copy = strdup(spec), *save = NULL;
  int rc = TP_OK;
  for (char *kv = strtok_r(copy, ",", &save); kv && rc == TP_OK; kv = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(kv, '=');
    char *end = NULL;
    errno = 0;
    long long v = eq ? strtoll(eq + 1, &end, 10) : 0;
    if (!eq || end == eq + 1 || *end || v < 1) {
      rc = tp_error(d, "model description: '%s' is not KEY=POSITIVE_INTEGER", kv);
      break;
    }
    if (v > TP_MAX_MODEL_SIZE || errno) {
      rc = tp_error(d, "model description: '%s' is more than the planner handles (%d)", kv, TP_MAX_MODEL_SIZE);
      break;
    }
    *eq = 0;
    int *dst = !strcmp(kv, "layers")   ? &m->layers
               : !strcmp(kv, "hidden") ? &m->hidden
               : !strcmp(kv, "heads")  ? &m->heads
               : !strcmp(kv, "seq")    ? &m->seq
               : !strcmp(kv, "vocab")  ? &m->vocab
               : !strcmp(kv, "ffn")    ? &m->ffn
                                       : NULL;
    if (!dst) rc = tp_error(d, "model description: unknown key '%s' (layers, hidden, heads, seq, vocab, ffn)", kv);
    else if (*dst) rc = tp_error(d, "model description: '%s' is given twice", kv);
    else *dst = (int)v;
  }
  free(copy);
  if (rc) return rc;
  if (!m->layers || !m->hidden || !m->heads || !m->seq || !m->vocab)
    return tp_error(d, "model description needs layers, hidden, heads, seq and vocab");
  if (m->hidden % m->heads)
    return tp_error(d, "model description: hidden %d is not divisible by heads %d", m->hidden, m->heads);
  if (!m->ffn) m->ffn = 4 * m->hidden;
  return TP_OK;
}

/* ---- the cost model ---- */

int tp_cost_model_init(TpCostModel *cm, const TpHardware *hw, const TpModelDesc *m, int pipeline, int tensor,
                       int data, TpDiag *d) {
  memset(cm, 0, sizeof *cm);
  cm->hw = *hw;
  cm->model = *m;
  cm->pipeline = pipeline;
  cm->tensor = tensor;
  cm->data = data;
  if (m->layers > TP_MAX_LAYERS)
    return tp_error(d, "the model has %d layers, more than the planner handles (%d)", m->layers, TP_MAX_LAYERS);
  if (m->seq > TP_MAX_SEQ)
    return tp_error(d, "sequence length %d is more than the planner handles (%d)", m->seq, TP_MAX_SEQ);
  if (pipeline < 1 || pipeline > TP_MAX_STAGES)
    return tp_error(d, "pipeline degree %d out of range 1..%d", pipeline, TP_MAX_STAGES);
  if (m->layers % pipeline)
    return tp_error(d, "%d layers are not divisible into %d pipeline stages", m->layers, pipeline);
  if (m->heads % tensor || m->ffn % tensor)
    return tp_error(d, "tensor-parallel degree %d does not divide %s %d", tensor,
                    m->heads % tensor ? "heads" : "ffn", m->heads % tensor ? m->heads : m->ffn);
  if (m->vocab < tensor)
    return tp_error(d,
                    "tensor-parallel degree %d is more than the vocabulary of %d: every tensor rank holds at "
                    "least one row of the embedding and the head",
                    tensor, m->vocab);
  cm->nstages = pipeline;
  int cuts[TP_MAX_STAGES];
  for (int k = 0; k < pipeline; k++) cuts[k] = k * (m->layers / pipeline);
  tp_cost_model_set_cuts(cm, cuts);
  return TP_OK;
}

void tp_cost_model_set_cuts(TpCostModel *cm, const int *cuts) {
  for (int k = 0; k < cm->nstages; k++) {
    int next = k + 1 < cm->nstages ? cuts[k + 1] : cm->model.layers;
    TP_ASSERT(next > cuts[k] || (next == cuts[k] && cm->nstages > 1));
    cm->stage[k] = (TpStage){cuts[k], next - cuts[k], k == 0, k == cm->nstages - 1};
  }
}

int tp_cost_model_set_chunks(TpCostModel *cm, int chunks, TpDiag *d) {
  int J = cm->pipeline * chunks, L = cm->model.layers;
  if (chunks < 1 || J > TP_MAX_STAGES)
    return tp_error(d, "%d chunks on %d pipeline ranks: %d virtual stages, out of range 1..%d", chunks, cm->pipeline,
                    J, TP_MAX_STAGES);
  if (J > L)
    return tp_error(d, "%d layers are too few for %d pipeline ranks x %d chunks (a virtual stage needs a layer)", L,
                    cm->pipeline, chunks);
  if (cm->cal && chunks > 1)
    return tp_error(d, "a calibrated cost model prices the profiled stages, not %d chunks per rank", chunks);
  cm->nstages = J;
  int cuts[TP_MAX_STAGES];
  for (int j = 0, first = 0; j < J; first += L / J + (j < L % J), j++) cuts[j] = first;
  tp_cost_model_set_cuts(cm, cuts);
  return TP_OK;
}

static void add(TpKernel *out, int *n, const char *name, TpKernelKind kind, double flops, double bytes,
                double rows) {
  TP_ASSERT(*n < TP_MAX_KERNELS);
  out[(*n)++] = (TpKernel){name, kind, flops, bytes, rows, false};
}

/* A GEMM (rows x in) @ (in x out): forward, or its two backward GEMMs (input gradient and
 * weight gradient, the latter accumulating into the gradient buffer). */
static void gemm(TpKernel *out, int *n, const char *name, double rows, double in, double out_, double db,
                 bool backward) {
  double flops = 2 * rows * in * out_;
  if (!backward) {
    add(out, n, name, TP_KERNEL_GEMM, flops, db * (rows * in + in * out_ + rows * out_), rows);
    return;
  }
  add(out, n, name, TP_KERNEL_GEMM, flops, db * (rows * out_ + in * out_ + rows * in), rows);
  add(out, n, name, TP_KERNEL_GEMM, flops, db * (rows * out_ + rows * in + 2 * in * out_), rows);
  out[*n - 1].weight = true;
}

int tp_layer_kernels(const TpCostModel *cm, int b, int l, int c, bool bw, TpKernel *out) {
  const TpModelDesc *m = &cm->model;
  double t = cm->tensor, db = cm->hw.dtype_bytes;
  double tokens = (double)b * l, h = m->hidden, hl = h / t, ffn = m->ffn / t;
  double heads = m->heads / t, kv = (double)c + l;
  double scores = b * heads * l * kv; /* attention score elements on this device */
  int n = 0;
  /* memory-bound kernels move (reads + writes) x elements; backward about 1.5x */
  double mem = bw ? 1.5 : 1;
  add(out, &n, "layernorm1", TP_KERNEL_MEMORY, 8 * tokens * h, mem * 2 * tokens * h * db, 0);
  gemm(out, &n, "qkv", tokens, h, 3 * hl, db, bw);
  /* attention over the K/V rows [0, c + l): scores = Q K^T, probs = softmax, mix = P V */
  double attn_bytes = db * (tokens * hl + b * kv * hl + scores);
  if (cm->flash_attention) { /* one tiled kernel: the scores stay on chip */
    /* causal: a query sees the context and, on average, half the slice (the tiles above
     * the diagonal are skipped); the backward's five products (Q K^T again, dP = dO V^T,
     * dV, dQ, dK) against the forward's two; the forward keeps the log-sum-exp (f32), the
     * backward reads it and the rows' dO.O */
    double seen = tokens * ((double)c + l / 2.0) * hl;
    double lse = 4.0 * b * heads * l;
    if (!bw) /* reads Q, K, V; writes the output */
      add(out, &n, "attn_flash", TP_KERNEL_GEMM, 4 * seen, db * (2 * tokens * hl + 2 * b * kv * hl) + lse, tokens);
    else /* reads Q, O, dO, K, V; writes dQ; dK, dV rows [0, c + l) accumulate: read + write */
      add(out, &n, "attn_flash_bw", TP_KERNEL_GEMM, 10 * seen, db * (4 * tokens * hl + 6 * b * kv * hl) + 2 * lse,
          tokens);
  } else if (!bw) {
    add(out, &n, "attn_scores", TP_KERNEL_GEMM, 2 * tokens * kv * hl, attn_bytes, tokens);
    add(out, &n, "softmax", TP_KERNEL_MEMORY, 5 * scores, scores * (2 * db + 1), 0);
    add(out, &n, "attn_mix", TP_KERNEL_GEMM, 2 * tokens * kv * hl, attn_bytes, tokens);
  } else { /* dK/dV rows [0, c + l) accumulate: read + write */
    double acc = 2 * db * b * kv * hl;
    add(out, &n, "attn_mix_dp", TP_KERNEL_GEMM, 2 * tokens * kv * hl, attn_bytes, tokens);
    add(out, &n, "attn_mix_dv", TP_KERNEL_GEMM, 2 * tokens * kv * hl, attn_bytes + acc, tokens);
    add(out, &n, "softmax_bw", TP_KERNEL_MEMORY, 5 * scores, scores * (3 * db + 1), 0);
    add(out, &n, "attn_scores_dq", TP_KERNEL_GEMM, 2 * tokens * kv * hl, attn_bytes, tokens);
    add(out, &n, "attn_scores_dk", TP_KERNEL_GEMM, 2 * tokens * kv * hl, attn_bytes + acc, tokens);
  }
  gemm(out, &n, "attn_out", tokens, hl, h, db, bw);
  if (t > 1) add(out, &n, "allreduce_attn", TP_KERNEL_ALLREDUCE, 0, tokens * h * db, 0);
  add(out, &n, "dropout_residual1", TP_KERNEL_MEMORY, 3 * tokens * h, mem * 3 * tokens * h * db, 0);
  add(out, &n, "layernorm2", TP_KERNEL_MEMORY, 8 * tokens * h, mem * 2 * tokens * h * db, 0);
  gemm(out, &n, "fc1", tokens, h, ffn, db, bw);
  add(out, &n, "gelu", TP_KERNEL_MEMORY, 8 * tokens * ffn, mem * 2 * tokens * ffn * db, 0);
  gemm(out, &n, "fc2", tokens, ffn, h, db, bw);
  if (t > 1) add(out, &n, "allreduce_mlp", TP_KERNEL_ALLREDUCE, 0, tokens * h * db, 0);
  add(out, &n, "dropout_residual2", TP_KERNEL_MEMORY, 3 * tokens * h, mem * 3 * tokens * h * db, 0);
  return n;
}

/* Ring all-reduce among `n` devices of `bytes` each, inside a node if n fits in one. */
static double allreduce_time(double bytes, int n, double bandwidth, double latency) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / bandwidth + 2.0 * (n - 1) * latency;
}

double tp_kernel_time(const TpCostModel *cm, const TpKernel *k) {
  const TpHardware *hw = &cm->hw;
  double memory = k->bytes / hw->mem_bandwidth;
  switch (k->kind) {
  case TP_KERNEL_GEMM: {
    double eff = hw->gemm_efficiency * k->rows / (k->rows + hw->gemm_half_rows);
    double compute = k->flops / (hw->peak_flops * eff);
    return hw->kernel_overhead_s + (compute > memory ? compute : memory);
  }
  case TP_KERNEL_MEMORY: return hw->kernel_overhead_s + memory;
  case TP_KERNEL_ALLREDUCE:
    if (cm->tensor <= hw->devices_per_node)
      return hw->kernel_overhead_s + allreduce_time(k->bytes, cm->tensor, hw->intra_bandwidth, hw->intra_latency_s);
    return hw->kernel_overhead_s +
           allreduce_time(k->bytes, cm->tensor, hw->inter_bandwidth / hw->devices_per_node, hw->inter_latency_s);
  }
  TP_ASSERT(0);
}

static double kernels_time(const TpCostModel *cm, const TpKernel *k, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += tp_kernel_time(cm, &k[i]);
  return s;
}

static double weight_kernels_time(const TpCostModel *cm, const TpKernel *k, int n) {
  double s = 0;
  for (int i = 0; i < n; i++)
    if (k[i].weight) s += tp_kernel_time(cm, &k[i]);
  return s;
}

/* The extra forward a layer's backward runs when recomputing: full redoes the layer's
 * forward; selective only what it does not keep, the attention (scores, softmax, mix), the
 * norms and the elementwise ops, not the products. */
static double recompute_forward(const TpCostModel *cm, int b, int l, int c) {
  if (cm->recompute == TP_RECOMPUTE_NONE) return 0;
  TpKernel k[TP_MAX_KERNELS];
  int n = tp_layer_kernels(cm, b, l, c, false, k);
  double s = 0;
  for (int i = 0; i < n; i++) {
    bool attention = !strncmp(k[i].name, "attn_scores", 11) || !strncmp(k[i].name, "attn_mix", 8) ||
                     !strncmp(k[i].name, "attn_flash", 10);
    if (cm->recompute == TP_RECOMPUTE_FULL || (k[i].kind == TP_KERNEL_MEMORY || attention))
      s += tp_kernel_time(cm, &k[i]);
  }
  return s;
}

TpTime tp_layer_time(const TpCostModel *cm, int b, int l, int c) {
  TpKernel k[TP_MAX_KERNELS];
  TpTime t;
  t.fwd = kernels_time(cm, k, tp_layer_kernels(cm, b, l, c, false, k));
  int n = tp_layer_kernels(cm, b, l, c, true, k);
  t.bwd = kernels_time(cm, k, n) + recompute_forward(cm, b, l, c);
  t.wgt = weight_kernels_time(cm, k, n);
  return t;
}

/* Embedding lookup (+ position) on the first stage, the same forward and backward. */
static int embedding_kernels(const TpCostModel *cm, int b, int l, TpKernel *k) {
  double db = cm->hw.dtype_bytes, tokens = (double)b * l, h = cm->model.hidden;
  int n = 0;
  add(k, &n, "embed", TP_KERNEL_MEMORY, tokens * h, 4 * tokens * h * db, 0);
  if (cm->tensor > 1) add(k, &n, "allreduce_embed", TP_KERNEL_ALLREDUCE, 0, tokens * h * db, 0);
  return n;
}

/* The logits' columns on each tensor rank: its share of the vocabulary, padded to a multiple
 * of tensor x vocab_multiple where the target pads it (cost.h). */
static double head_columns(const TpCostModel *cm) {
  int64_t V = cm->model.vocab, unit = (int64_t)cm->tensor * cm->vocab_multiple;
  if (cm->vocab_multiple <= 1) return (double)V / cm->tensor;
  return (double)((V + unit - 1) / unit * unit) / cm->tensor;
}

/* Final norm, LM head and the loss on the last stage (vocabulary split across the
 * tensor-parallel devices). */
static int head_kernels(const TpCostModel *cm, int b, int l, bool bw, TpKernel *k) {
  const TpModelDesc *m = &cm->model;
  double db = cm->hw.dtype_bytes, tokens = (double)b * l, h = m->hidden;
  double vocab = head_columns(cm);
  int n = 0;
  add(k, &n, "layernorm_f", TP_KERNEL_MEMORY, 8 * tokens * h, (bw ? 3 : 2) * tokens * h * db, 0);
  gemm(k, &n, "lm_head", tokens, h, vocab, db, bw);
  add(k, &n, "cross_entropy", TP_KERNEL_MEMORY, 5 * tokens * vocab, tokens * vocab * (db + 4) * (bw ? 1.5 : 1), 0);
  if (cm->tensor > 1 && !bw) add(k, &n, "allreduce_loss", TP_KERNEL_ALLREDUCE, 0, 3 * tokens * 4, 0);
  if (cm->tensor > 1 && bw) add(k, &n, "allreduce_head", TP_KERNEL_ALLREDUCE, 0, tokens * h * db, 0);
  return n;
}

int tp_edge_kernels(const TpCostModel *cm, const TpStage *s, int b, int l, bool backward, TpKernel *out) {
  int n = s->embedding ? embedding_kernels(cm, b, l, out) : 0;
  if (s->head) n += head_kernels(cm, b, l, backward, out + n);
  return n;
}

static TpTime edge_time(const TpCostModel *cm, const TpStage *s, int b, int l) {
  TpKernel k[TP_MAX_KERNELS];
  TpTime t = {0, 0, 0};
  if (s->embedding) { /* its backward scatters into the table's gradient: all weight */
    int n = embedding_kernels(cm, b, l, k);
    t.fwd += kernels_time(cm, k, n);
    t.bwd += kernels_time(cm, k, n);
    t.wgt += kernels_time(cm, k, n);
  }
  if (s->head) {
    t.fwd += kernels_time(cm, k, head_kernels(cm, b, l, false, k));
    int n = head_kernels(cm, b, l, true, k);
    t.bwd += kernels_time(cm, k, n);
    t.wgt += weight_kernels_time(cm, k, n);
  }
  return t;
}

static TpTime analytic_stage_time(const TpCostModel *cm, int k, int b, int l, int c) {
  TpStage s = cm->stage[k];
  if (cm->uniform_stages) s = (TpStage){0, cm->model.layers / cm->nstages, false, false};
  TpTime layer = tp_layer_time(cm, b, l, c), t = edge_time(cm, &s, b, l);
  t.fwd += s.layers * layer.fwd;
  t.bwd += s.layers * layer.bwd;
  t.wgt += s.layers * layer.wgt;
  if (k == 0) t.wgt = t.bwd; /* no stage before it waits: all its backward feeds its parameters */
  return t;
}

TpTime tp_stage_time(const TpCostModel *cm, int k, int b, int l, int c) {
  TP_ASSERT(k >= 0 && k < cm->nstages);
  const TpCalibration *cal = cm->cal;
  if (!cal) return analytic_stage_time(cm, k, b, l, c);
  if (b != cal->b) return (TpTime){INFINITY, INFINITY, 0};
  double f = tp_fit_eval(&cal->fwd[k], l, c);
  TpTime a = analytic_stage_time(cm, k, b, l, c); /* the weight-gradient share; the split of a measured sum */
  double share = a.bwd > 0 ? a.wgt / a.bwd : 0;
  if (cal->split) {
    double g = tp_fit_eval(&cal->bwd[k], l, c);
    if (!(g > 0)) g = 0;
    return (TpTime){f > 0 ? f : 0, g, g * share};
  }
  if (!(f > 0)) f = 0;
  double g = f * a.bwd / (a.fwd + a.bwd);
  return (TpTime){f * a.fwd / (a.fwd + a.bwd), g, g * share};
}

/* Devices are numbered replica-major, then stage, then tensor rank; a node holds
 * devices_per_node consecutive devices. */
bool tp_boundary_crosses_nodes(const TpCostModel *cm, int k) {
  int per_node = cm->hw.devices_per_node, from = k % cm->pipeline, to = (k + 1) % cm->pipeline; /* the ranks */
  return (from * cm->tensor) / per_node != (to * cm->tensor) / per_node || (cm->tensor > per_node);
}

/* The activation's tensor-parallel devices each send their 1/t share; across nodes all
 * shares go through the node's one network link. */
double tp_send_time(const TpCostModel *cm, int k, int b, int l) {
  const TpHardware *hw = &cm->hw;
  double bytes = (double)b * l * cm->model.hidden * hw->dtype_bytes;
  if (tp_boundary_crosses_nodes(cm, k)) return hw->inter_latency_s + bytes / hw->inter_bandwidth;
  return hw->intra_latency_s + bytes / cm->tensor / hw->intra_bandwidth;
}

double tp_model_params(const TpModelDesc *m) {
  double h = m->hidden;
  return m->layers * (4 * h * h + 2 * h * m->ffn + 9 * h + m->ffn) + 2.0 * m->vocab * h + (double)m->seq * h + 2 * h;
}

static double vocab_rows(const TpCostModel *cm);

double tp_stage_params(const TpCostModel *cm, int k) {
  const TpModelDesc *m = &cm->model;
  const TpStage *s = &cm->stage[k];
  double h = m->hidden, t = cm->tensor;
  double layer = (4 * h * h + 2 * h * m->ffn + 3 * h + m->ffn) / t + 6 * h; /* biases split */
  double p = s->layers * layer;
  if (s->embedding) p += vocab_rows(cm) * h + (double)m->seq * h;
  /* the head's table: the embedding's tied copy, or its own; one stage holds a tied one once */
  if (s->head) p += (s->embedding && !cm->untied ? 0 : vocab_rows(cm) * h) + 2 * h;
  return p;
}

double tp_grad_allreduce_time(const TpCostModel *cm, int k) {
  const TpHardware *hw = &cm->hw;
  if (cm->data <= 1) return 0;
  double bytes = tp_stage_params(cm, k) * hw->dtype_bytes;
  int replica_devices = cm->pipeline * cm->tensor;
  if (replica_devices * cm->data <= hw->devices_per_node)
    return allreduce_time(bytes, cm->data, hw->intra_bandwidth, hw->intra_latency_s);
  /* every device of a node all-reduces at once: they share the node's link */
  int sharing = replica_devices < hw->devices_per_node ? replica_devices : hw->devices_per_node;
  return allreduce_time(bytes, cm->data, hw->inter_bandwidth / sharing, hw->inter_latency_s);
}

/* Adam over fp32 state: about 32 bytes moved per parameter. */
double tp_optimizer_time(const TpCostModel *cm, int k) {
  if (cm->cal && cm->cal->optimizer) return cm->cal->optimizer[k];
  return cm->hw.kernel_overhead_s + 32 * tp_stage_params(cm, k) / cm->hw.mem_bandwidth;
}

/* Rows of the embedding and head each tensor rank holds: its share of the vocabulary
 * (padded up to a multiple of the ranks), or the whole table where tokpipec cannot split a
 * vocabulary that does not divide. */
static double vocab_rows(const TpCostModel *cm) {
  int V = cm->model.vocab, t = cm->tensor;
  if (t <= 1) return V;
  if (cm->vocab_split || V % t == 0) return (double)((V + t - 1) / t);
  return V;
}

/* What tokpipec's trainer keeps, read off the raised IR of a GPT-3-shaped layer and its
 * memory plan (tokpipec --emit=memory on bench/gpt3_onnx.py models: the arena grows by
 * exactly 16h + 4 floats per token per layer at fp32, none). Per token and layer, one
 * tensor rank of t, s = the stored element size (4 fp32, 2 bf16):
 *   none       the layer input x, ln1's and ln2's outputs, the residual after attention
 *              (4h, whole on every rank), Q, K, V and the attention output (4h / t), the
 *              MLP's product and its GELU (2 ffn / t): s (4h + (4h + 2 ffn) / t), plus the
 *              two norms' mean and 1/stddev, 16 bytes in fp32;
 *   selective  x and the attention's output product (2h), the QKV and first MLP products
 *              ((3h + ffn) / t): the norms, attention and GELU are recomputed;
 *   full       x alone: s h.
 * Cut into token slices, every layer also keeps its K/V context (2h / t; under none they
 * are the K and V already counted) and gradient accumulators (2h / t; recomputing, the
 * later slices' partial gradients over the earlier rows too). */
static double layer_kept_bytes(const TpCostModel *cm, TpRecompute r, int nslices, double s) {
  double h = cm->model.hidden, ffn = cm->model.ffn, t = cm->tensor;
  double context = 0;
  if (nslices > 1 && r == TP_RECOMPUTE_NONE) context = 2 * h / t * s;
  /* recomputing, the context and the gradients of every later slice's keys and values over
   * the earlier rows ((n + 1) / 2 of the rows on average) */
  if (nslices > 1 && r != TP_RECOMPUTE_NONE) context = 2 * h / t * s * (1 + (nslices + 1) / 2.0);
  switch (r) {
  case TP_RECOMPUTE_NONE: return s * (4 * h + (4 * h + 2 * ffn) / t) + 16 + context;
  case TP_RECOMPUTE_SELECTIVE: return s * (2 * h + (3 * h + ffn) / t) + context;
  case TP_RECOMPUTE_FULL: return s * h + context;
  }
  TP_ASSERT(0);
}

/* Split backwards (zb), per token and layer: a slice's weight parts read the layer input x,
 * ln1's and ln2's outputs and the residual after attention (4h), the attention output and
 * the GELU (h + ffn) / t, the norms' statistics (16 bytes), and the output gradients of
 * the four products and both norms: the QKV and first MLP products' (3h + ffn) / t, the
 * attention output and second MLP products' and the norms' 4h (tokpipec's IR after
 * split-backward, passes/split_backward.c). Each lives from its forward or input part to
 * the slice's weight part, and a rank may run all of a microbatch's input parts before
 * its first weight part, so all slices' sets are alive at once; the values only the input
 * parts read (Q, K, V, the first MLP product, the token-slice contexts) are gone by then.
 * Recomputing, the input part recomputes what the weight part reads, which then lives as
 * long: the same set. The activations are stored in s bytes: under 16-bit storage the
 * weight part widens them itself, with its own read-back Casts (split-backward clones the
 * input part's), so the 16-bit values live until it and the fp32 copies only inside it.
 * The statistics and the output gradients are fp32 whatever the storage (store-bf16 keeps
 * a norm's statistics in fp32 and rounds only what leaves its unit, and the input and
 * weight parts are one unit). The microbatch keeps the larger of it and the forward's set
 * (layer_kept_bytes); under none the difference is 16h + (4 - s) (3h + ffn) / t bytes:
 * the fp32 gradients where the forward's set holds Q, K, V and the first MLP product. */
static double layer_weight_kept_bytes(const TpCostModel *cm, double s) {
  double h = cm->model.hidden, ffn = cm->model.ffn, t = cm->tensor;
  return s * (4 * h + (h + ffn) / t) + 16 + 4 * ((3 * h + ffn) / t + 4 * h);
}

/* Per token beside the layers: the activation a stage sends down and the gradient it
 * receives back (2h), the gradient it sends up (h; what it receives is layer 0's x); the
 * last stage's final norm (its input and output, 2h, and 8 bytes of statistics) and logits
 * (the vocabulary rows): selective keeps the logits and the norm's input, full recomputes
 * them all with the last layer. And per microbatch, with slices, the stage's weight
 * gradients summed so far, stored in s bytes as the gradients are. */
double tp_microbatch_kept_bytes(const TpCostModel *cm, int k, int b, int nslices) {
  const TpStage *st = &cm->stage[k];
  double h = cm->model.hidden, s = tp_precision_bytes(cm->precision), tokens = (double)b * cm->model.seq;
  /* the first stage sends no gradient: its backward is all weight part, run as 1f1b's */
  bool split = cm->split_backward && k > 0;
  double layer = layer_kept_bytes(cm, cm->recompute, nslices, s);
  if (split && layer_weight_kept_bytes(cm, s) > layer) layer = layer_weight_kept_bytes(cm, s);
  double per_token = st->layers * layer;
  if (k + 1 < cm->nstages) per_token += 2 * h * s;
  if (k > 0) per_token += h * s;
  if (st->head && cm->recompute == TP_RECOMPUTE_NONE) per_token += (vocab_rows(cm) + 2 * h) * s + 8;
  if (st->head && cm->recompute == TP_RECOMPUTE_SELECTIVE) per_token += (vocab_rows(cm) + h) * s;
  /* split backwards: the final norm's output gradient (fp32), which its weight part reads */
  if (split && st->head) per_token += 4 * h;
  /* cut into slices, the backward sums each weight's gradient over the slices: the partial
   * sum, stored as the gradients are, lives from the last slice's backward unit to the
   * first's (split: from the last slice's weight part to the first's, which run in order:
   * one beside all the slices' sets above, two only once the last slice's set is gone).
   * Under 16-bit storage a weight part widens the weights it reads itself, inside its unit:
   * no slice's fp32 copy of them outlives a unit, split or not. */
  return tokens * per_token + (nslices > 1 ? tp_stage_params(cm, k) * s : 0);
}

/* One unit's working set, in fp32 whatever the storage (16-bit storage computes in fp32
 * through casts): a layer's MLP gradient (ffn / t); selective recomputes the GELU beside it
 * (ffn / t more), full the whole layer (what none keeps beyond its input) and, on the last
 * stage, the head (logits and the final norm); else the last stage's logits gradient where
 * that is larger (a unit's layers run one after another). */
double tp_unit_transient_bytes(const TpCostModel *cm, int k, int b, int l, int c) {
  (void)c;
  const TpStage *st = &cm->stage[k];
  double tokens = (double)b * l, ffn = cm->model.ffn / (double)cm->tensor * 4, head = vocab_rows(cm) * 4;
  double layer = ffn;
  /* 16-bit storage: the backward reads a layer's kept values through fp32 casts, at most
   * its MLP pair (2 ffn / t) and a residual pair (2h) at once (selective: its MLP product);
   * recomputing, the recomputed values are rounded to 16 bits as the forward's were,
   * beside their fp32 results */
  double s = tp_precision_bytes(cm->precision);
  if (cm->precision != TP_PRECISION_FP32 && cm->recompute == TP_RECOMPUTE_NONE)
    layer += 2 * ffn + 2 * cm->model.hidden * 4.0;
  if (cm->precision != TP_PRECISION_FP32 && cm->recompute == TP_RECOMPUTE_SELECTIVE) layer += ffn;
  if (cm->precision != TP_PRECISION_FP32 && cm->recompute != TP_RECOMPUTE_NONE)
    layer += layer_kept_bytes(cm, TP_RECOMPUTE_NONE, 1, s) - layer_kept_bytes(cm, cm->recompute, 1, s);
  if (cm->recompute == TP_RECOMPUTE_SELECTIVE) layer += ffn;
  if (cm->recompute == TP_RECOMPUTE_FULL) {
    layer += layer_kept_bytes(cm, TP_RECOMPUTE_NONE, 1, 4) - layer_kept_bytes(cm, cm->recompute, 1, 4);
    if (st->head) return tokens * (layer + head + 2 * cm->model.hidden * 4.0);
  }
  return tokens * (st->layers && layer > (st->head ? head : 0) ? layer : st->head ? head : 0);
}

TpRankMemoryInput tp_stage_memory_input(const TpCostModel *cm, int k, int microbatches, double kept,
                                        double transient, int arenas) {
  if (cm->one_region) kept += transient, transient = 0;
  return (TpRankMemoryInput){.trained = (int64_t)tp_stage_params(cm, k),
                             .precision = cm->precision,
                             .microbatches = microbatches,
                             .zero_shards = cm->zero && cm->data > 1 ? cm->data : 1,
                             .kept = (int64_t)kept,
                             .transient = (int64_t)transient,
                             .arenas = arenas};
}

/* ---- calibration ---- */

/* A JSON integer in [lo, hi] at obj.key: absent leaves *out (true), else false when bad. */
static bool int_field(const TpJson *j, const char *key, int lo, int hi, int *out) {
  const TpJson *v = tp_json_get(j, key);
  if (!v) return true;
  if (v->kind != TP_JSON_NUMBER || v->number != floor(v->number) || v->number < lo || v->number > hi) return false;
  *out = (int)v->number;
  return true;
}

static bool seconds_in_range(double s) { return s >= TP_MIN_SECONDS && s <= TP_MAX_SECONDS; }

static int load_sample(const TpJson *e, int i, const TpProfile *p, const char *path, TpSample *s, TpDiag *d) {
  if (e->kind != TP_JSON_OBJECT) return tp_error(d, "profile %s: sample %d is not an object", path, i);
  bool ok = true;
  double b = tp_json_number(e, "b", -1, &ok), l = tp_json_number(e, "l", -1, &ok);
  double c = tp_json_number(e, "c", -1, &ok), sec = tp_json_number(e, "seconds", NAN, &ok);
  double fwd = tp_json_number(e, "forward", NAN, &ok), bwd = tp_json_number(e, "backward", NAN, &ok);
  double stage = tp_json_number(e, "stage", 0, &ok);
  if (!ok) return tp_error(d, "profile %s: sample %d: a field is not a number", path, i);
  if (b < 1 || l < 1 || c < 0 || b != floor(b) || l != floor(l) || c != floor(c) || b > TP_MAX_MICROBATCH ||
      l + c > TP_MAX_SEQ)
    return tp_error(d, "profile %s: sample %d needs integers b in [1, %d], l >= 1, c >= 0, l + c <= %d", path, i,
                    TP_MAX_MICROBATCH, TP_MAX_SEQ);
  if (isnan(fwd) != isnan(bwd))
    return tp_error(d, "profile %s: sample %d has only one of \"forward\" and \"backward\"", path, i);
  bool split = !isnan(fwd);
  if (split && !(seconds_in_range(fwd) && seconds_in_range(bwd)))
    return tp_error(d, "profile %s: sample %d needs forward and backward in [%g, %g] seconds", path, i,
                    TP_MIN_SECONDS, TP_MAX_SECONDS);
  if (isnan(sec) && split) sec = fwd + bwd;
  if (!seconds_in_range(sec))
    return tp_error(d, "profile %s: sample %d needs seconds in [%g, %g]", path, i, TP_MIN_SECONDS, TP_MAX_SECONDS);
  if (split && fabs(fwd + bwd - sec) > 1e-6 + 1e-3 * sec)
    return tp_error(d, "profile %s: sample %d: forward %g + backward %g is not seconds %g", path, i, fwd, bwd, sec);
  if (stage != floor(stage) || stage < 0 || stage >= p->stages)
    return tp_error(d, "profile %s: sample %d: stage %g is not one of the %d stage%s", path, i, stage, p->stages,
                    p->stages == 1 ? "" : "s");
  if (p->seq && l + c > p->seq)
    return tp_error(d, "profile %s: sample %d: l %g + c %g exceeds the sequence length %d", path, i, l, c, p->seq);
  *s = (TpSample){(int)b, (int)l, (int)c, sec, (int)stage, split, split ? fwd : 0, split ? bwd : 0};
  return TP_OK;
}

int tp_profile_load(const char *path, TpProfile *p, TpDiag *d) {
  memset(p, 0, sizeof *p);
  char err[256];
  TpJson *j = tp_json_parse_file(path, err, sizeof err);
  if (!j) return tp_error(d, "profile %s: %s", path, err);
  int rc = tp_profile_from_json(j, path, p, d);
  tp_json_free(j);
  return rc;
}

int tp_profile_from_json(const TpJson *j, const char *path, TpProfile *p, TpDiag *d) {
  memset(p, 0, sizeof *p);
  int rc = TP_OK;
  const TpJson *format = tp_json_get(j, "format"), *device = tp_json_get(j, "device"),
               *model = tp_json_get(j, "model"), *s = tp_json_get(j, "samples"),
               *cuts = tp_json_get(j, "stage_cuts"), *opt = tp_json_get(j, "optimizer"),
               *drift = tp_json_get(j, "drift");
  int version = 1;
  if (j->kind != TP_JSON_OBJECT ||
      (format && (format->kind != TP_JSON_STRING || strcmp(format->string, "tokpipe-profile")))) {
    rc = tp_error(d, "profile %s: not a tokpipe profile (\"format\" must be \"tokpipe-profile\")", path);
    goto done;
  }
  if (!int_field(j, "version", 1, 1 << 30, &version) || version != 1) {
    rc = tp_error(d, "profile %s: unsupported \"version\" (this reader knows 1)", path);
    goto done;
  }
  const struct {
    const char *key;
    int *dst, max;
  } ints[] = {{"threads", &p->threads, 1 << 20},
              {"ranks", &p->ranks, 1 << 24},
              {"stages", &p->stages, TP_MAX_STAGES},
              {"batch", &p->batch, TP_MAX_MICROBATCH},
              {"seq", &p->seq, TP_MAX_SEQ}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    if (!int_field(j, ints[i].key, 1, ints[i].max, ints[i].dst)) {
      rc = tp_error(d, "profile %s: \"%s\" must be an integer in [1, %d]", path, ints[i].key, ints[i].max);
      goto done;
    }
  const TpJson *params = tp_json_get(j, "parameters");
  if (params && (params->kind != TP_JSON_NUMBER || !(params->number >= 1 && params->number <= 1e15))) {
    rc = tp_error(d, "profile %s: \"parameters\" must be a count in [1, 1e15]", path);
    goto done;
  }
  p->parameters = params ? params->number : 0;
  snprintf(p->device, sizeof p->device, "%s", device && device->kind == TP_JSON_STRING ? device->string : "unknown");
  snprintf(p->model, sizeof p->model, "%s", model && model->kind == TP_JSON_STRING ? model->string : "");
  if (!s || s->kind != TP_JSON_ARRAY || s->count == 0) {
    rc = tp_error(d, "profile %s: needs a non-empty \"samples\" array", path);
    goto done;
  }
  if (!p->stages) { /* absent: as many as the samples name */
    p->stages = 1;
    for (int i = 0; i < s->count; i++) {
      double k = tp_json_number(&s->items[i], "stage", 0, NULL);
      if (k >= p->stages && k < TP_MAX_STAGES) p->stages = (int)k + 1;
    }
  }
  if (cuts) {
    bool ok = cuts->kind == TP_JSON_ARRAY && cuts->count == p->stages;
    p->cuts = calloc((size_t)p->stages, sizeof *p->cuts);
    for (int k = 0; ok && k < p->stages; k++) {
      const TpJson *v = &cuts->items[k];
      ok = v->kind == TP_JSON_NUMBER && v->number == floor(v->number) && v->number < 1 << 24 &&
           (k ? v->number > p->cuts[k - 1] : v->number == 0);
      if (ok) p->cuts[k] = (int)v->number;
    }
    if (!ok) {
      rc = tp_error(d,
                    "profile %s: \"stage_cuts\" must list the first layer of each of the %d stages (0, then "
                    "increasing)",
                    path, p->stages);
      goto done;
    }
  }
  if (opt) {
    bool ok = opt->kind == TP_JSON_ARRAY && opt->count == p->stages;
    p->optimizer = calloc((size_t)p->stages, sizeof *p->optimizer);
    for (int k = 0; ok && k < p->stages; k++) {
      ok = opt->items[k].kind == TP_JSON_NUMBER && opt->items[k].number >= 0 &&
           opt->items[k].number <= TP_MAX_SECONDS;
      if (ok) p->optimizer[k] = opt->items[k].number;
    }
    if (!ok) {
      rc = tp_error(d, "profile %s: \"optimizer\" must hold seconds in [0, %g] for each of the %d stages", path,
                    TP_MAX_SECONDS, p->stages);
      goto done;
    }
  }
  p->drift = -1;
  if (drift && (drift->kind != TP_JSON_NUMBER || !(drift->number >= 0 && drift->number <= 1000))) {
    rc = tp_error(d,
                  "profile %s: \"drift\" must be a number in [0, 1000] (the upper / lower quartile of the "
                  "timed passes over the grid - 1)",
                  path);
    goto done;
  }
  if (drift) p->drift = drift->number;
  p->samples = calloc((size_t)s->count, sizeof *p->samples);
  p->split = true;
  for (int i = 0; i < s->count && !rc; i++) {
    rc = load_sample(&s->items[i], i, p, path, &p->samples[i], d);
    p->split &= p->samples[i].split;
  }
  p->nsamples = s->count;
done:
  if (rc) tp_profile_free(p);
  return rc;
}

void tp_profile_free(TpProfile *p) {
  free(p->cuts);
  free(p->optimizer);
  free(p->samples);
  memset(p, 0, sizeof *p);
}

/* Solves the 4x4 system A x = y by Gaussian elimination with partial pivoting. */
static bool solve4(double A[4][4], double y[4], double x[4]) {
  for (int col = 0; col < 4; col++) {
    int piv = col;
    for (int r = col + 1; r < 4; r++)
      if (fabs(A[r][col]) > fabs(A[piv][col])) piv = r;
    if (fabs(A[piv][col]) < 1e-300) return false;
    for (int k = 0; k < 4; k++) {
      double tmp = A[col][k];
      A[col][k] = A[piv][k];
      A[piv][k] = tmp;
    }
    double tmp = y[col];
    y[col] = y[piv];
    y[piv] = tmp;
    for (int r = col + 1; r < 4; r++) {
      double f = A[r][col] / A[col][col];
      for (int k = col; k < 4; k++) A[r][k] -= f * A[col][k];
      y[r] -= f * y[col];
    }
  }
  for (int r = 3; r >= 0; r--) {
    double s = y[r];
    for (int k = r + 1; k < 4; k++) s -= A[r][k] * x[k];
    x[r] = s / A[r][r];
    if (!(fabs(x[r]) <= 1e30)) return false; /* ill-conditioned: a fit that would price slices at infinity */
  }
  return true;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

int tp_fit_samples(const TpSample *s, int n, int b, TpFit *fit, TpDiag *d) {
  memset(fit, 0, sizeof *fit);
  fit->b = b;
  /* t(l, 0): mean per measured length */
  int *lens = malloc(sizeof(int) * (size_t)(n + 1));
  int nl = 0;
  for (int i = 0; i < n; i++)
    if (s[i].b == b && s[i].c == 0) lens[nl++] = s[i].l;
  qsort(lens, (size_t)nl, sizeof *lens, cmp_int);
  int u = 0;
  for (int i = 0; i < nl; i++)
    if (!u || lens[u - 1] != lens[i]) lens[u++] = lens[i];
  if (!u) {
    free(lens);
    return tp_error(d, "no samples with c = 0 for microbatch size %d", b);
  }
  fit->nlen = u;
  fit->len = lens;
  fit->t0 = calloc((size_t)u, sizeof(double));
  int *count = calloc((size_t)u, sizeof(int));
  for (int i = 0; i < n; i++)
    if (s[i].b == b && s[i].c == 0) {
      int j = 0;
      while (lens[j] != s[i].l) j++;
      fit->t0[j] += s[i].seconds;
      count[j]++;
    }
  for (int j = 0; j < u; j++) fit->t0[j] /= count[j];
  free(count);
  /* t_ctx by least squares on the residuals of the c > 0 samples */
  double A[4][4] = {{0}}, y[4] = {0};
  int nctx = 0;
  for (int i = 0; i < n; i++) {
    if (s[i].b != b || s[i].c == 0) continue;
    double f[4] = {1, s[i].l, s[i].c, (double)s[i].l * s[i].c};
    double r = s[i].seconds - tp_fit_eval(fit, s[i].l, 0);
    double w = 1 / (s[i].seconds * s[i].seconds); /* relative error counts */
    for (int p = 0; p < 4; p++) {
      y[p] += w * f[p] * r;
      for (int q = 0; q < 4; q++) A[p][q] += w * f[p] * f[q];
    }
    nctx++;
  }
  if (nctx < 4 || !solve4(A, y, fit->a)) {
    tp_fit_free(fit);
    return tp_error(d,
                    "microbatch size %d needs samples with c > 0 at two or more lengths "
                    "and contexts to fit t_ctx",
                    b);
  }
  double sq = 0;
  for (int i = 0; i < n; i++) {
    if (s[i].b != b) continue;
    double rel = fabs(tp_fit_eval(fit, s[i].l, s[i].c) - s[i].seconds) / s[i].seconds;
    sq += rel * rel;
    if (rel > fit->max_rel_err) fit->max_rel_err = rel;
    fit->nsamples++;
  }
  fit->rms_rel_err = sqrt(sq / fit->nsamples);
  return TP_OK;
}

double tp_fit_eval(const TpFit *f, double l, double c) {
  double t0;
  if (f->nlen == 1) t0 = f->t0[0] * l / f->len[0];
  else {
    int j = 0; /* segment [j, j+1] containing l, or the nearest one */
    while (j + 2 < f->nlen && f->len[j + 1] < l) j++;
    double x0 = f->len[j], x1 = f->len[j + 1];
    t0 = f->t0[j] + (f->t0[j + 1] - f->t0[j]) * (l - x0) / (x1 - x0);
    /* below the shortest measured slice a token never costs less than there (a noisy line
     * extrapolated to l -> 0 could price a short slice at nothing) */
    if (l < x0 && t0 < f->t0[0] * l / x0) t0 = f->t0[0] * l / x0;
  }
  if (c <= 0) return t0; /* t_ctx is fitted to, and applies at, c > 0 */
  return t0 + f->a[0] + f->a[1] * l + f->a[2] * c + f->a[3] * l * c;
}

void tp_fit_free(TpFit *f) {
  free(f->len);
  free(f->t0);
  f->len = NULL;
  f->t0 = NULL;
}

/* ---- calibrated cost model ---- */

static const char *const quantity_names[3] = {"forward", "backward", "forward+backward"};

int tp_calibrate(const TpProfile *p, const char *path, TpCalibration *cal, TpDiag *d) {
  memset(cal, 0, sizeof *cal);
  int b = p->batch;
  for (int i = 0; i < p->nsamples && !b; i++) b = p->samples[i].b;
  cal->b = b;
  cal->nstages = p->stages;
  cal->split = p->split;
  cal->fwd = calloc((size_t)p->stages, sizeof *cal->fwd);
  cal->bwd = calloc((size_t)p->stages, sizeof *cal->bwd);
  if (p->optimizer) {
    cal->optimizer = malloc(sizeof(double) * (size_t)p->stages);
    memcpy(cal->optimizer, p->optimizer, sizeof(double) * (size_t)p->stages);
  }
  TpSample *s = malloc(sizeof *s * (size_t)p->nsamples);
  TpDiag quiet;
  tp_diag_init(&quiet, d->tool, NULL, NULL);
  int rc = TP_OK;
  for (int k = 0; k < p->stages && !rc; k++)
    for (int q = cal->split ? 0 : 2; q < (cal->split ? 2 : 3) && !rc; q++) {
      int n = 0;
      for (int i = 0; i < p->nsamples; i++) {
        const TpSample *x = &p->samples[i];
        if (x->stage != k || x->b != b) continue;
        s[n] = *x;
        s[n++].seconds = q == 0 ? x->forward : q == 1 ? x->backward : x->seconds;
      }
      if (!n) rc = tp_error(d, "profile %s: no samples of stage %d with microbatch size %d", path, k, b);
      else if (tp_fit_samples(s, n, b, q == 1 ? &cal->bwd[k] : &cal->fwd[k], &quiet))
        rc = tp_error(d, "profile %s: stage %d %s: %s", path, k, quantity_names[q], quiet.last);
    }
  free(s);
  if (rc) tp_calibration_free(cal);
  return rc;
}

void tp_calibration_free(TpCalibration *cal) {
  for (int k = 0; cal->fwd && k < cal->nstages; k++) {
    tp_fit_free(&cal->fwd[k]);
    tp_fit_free(&cal->bwd[k]);
  }
  free(cal->fwd);
  free(cal->bwd);
  free(cal->optimizer);
  memset(cal, 0, sizeof *cal);
}

int tp_cost_model_calibrate(TpCostModel *cm, const TpCalibration *cal, const int *cuts, TpDiag *d) {
  if (cuts) { /* the profile's stages, however uneven */
    if (cuts[cal->nstages - 1] >= cm->model.layers)
      return tp_error(d, "the profile's stage cuts need more than the model's %d layers", cm->model.layers);
    cm->pipeline = cm->nstages = cal->nstages;
    tp_cost_model_set_cuts(cm, cuts);
  }
  if (cal->nstages != cm->nstages)
    return tp_error(d, "the profile has %d stage%s, the plan %d", cal->nstages, cal->nstages == 1 ? "" : "s",
                    cm->nstages);
  cm->cal = cal;
  cm->microbatch_rows = cal->b;
  return TP_OK;
}
