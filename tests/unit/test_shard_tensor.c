/* shard-tensor checked by running it: the GPT, NeoX and Llama blocks of tests/lit/shard-*.tir,
 * given random weights, are trained one step's worth (forward, loss, backward) by the
 * reference interpreter whole, and again sharded over N ranks in lockstep: every rank runs
 * the same sharded module on its own slice of each split parameter (cut as its TpShard
 * says), AllReduce sums the ranks' operands and TensorCopy copies. Every rank's logits and
 * loss must equal the whole run's, and every gradient the whole gradient's slice (summed
 * over the ranks sharing a piece, for K/V heads fewer than the ranks), within TOL relative
 * to the tensor's largest magnitude: f32 sums taken in another order differ near 1e-7.
 * The same for the modules of tests/lit/shard-fused.tir and shard-qknorm.tir and for every
 * ONNX fixture, raised as tokpipec raises it, over 2 ranks and over 4 where its heads
 * divide. */
#include "frontend/frontend.h"
#include "interp/interp.h"
#include "ir/ir.h"

#include <math.h>
#include <string.h>

#include "../check.h"

static const double TOL = 1e-5;
enum { MAX_RANKS = 5 };

/* The module after `//--- name` in the lit test file `lit`, parsed; NULL on failure. */
static TpModule *load(const char *lit, const char *name, TpDiag *d) {
  char path[1024];
  snprintf(path, sizeof path, "%s", __FILE__);
  char *slash = strrchr(path, '/');
  if (!slash) return NULL;
  snprintf(slash, sizeof path - (size_t)(slash - path), "/../lit/%s", lit);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  static char text[1 << 16];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  char marker[64];
  snprintf(marker, sizeof marker, "//--- %s\n", name);
  char *start = strstr(text, marker);
  if (!start) return NULL;
  start += strlen(marker);
  char *end = strstr(start, "//--- ");
  TpModule *m = NULL;
  if (tp_parse_module(start, end ? (size_t)(end - start) : strlen(start), path, &m, d) != TP_OK) return NULL;
  return m;
}

/* Gives every f32 param random data of its whole shape (after sharding: shard-tensor
 * refuses inline non-splat data, which the textual IR would print cut). */
static void randomize(TpModule *m) {
  for (int v = 0; v < m->nvalues; v++) {
    TpValue *val = &m->values[v];
    if (val->kind != TP_VAL_PARAM) continue;
    int64_t n = tp_type_numel(&val->type) * (val->shard.parts ? val->shard.parts : 1);
    float *data = malloc((size_t)n * sizeof *data);
    rng_state = 1469598103934665603u; /* seeded by the name: the same data in both modules */
    for (const char *c = val->name; *c; c++) rng_state = (rng_state ^ (uint8_t)*c) * 1099511628211u;
    for (int64_t i = 0; i < n; i++) data[i] = frand() * 0.5f;
    val->blob = tp_add_owned_blob(m, data, (size_t)n * sizeof *data);
    val->offset = 0;
    free(data);
  }
}

/* Copies rank r's part (TpShard sh) of the whole f32 tensor `whole` of per-rank type t
 * into part, or (add) adds part into the whole's slice. */
static void slice(const TpType *t, TpShard sh, int r, float *whole, float *part, bool add) {
  int64_t outer = 1, inner = 1, piece = t->dims[sh.axis] / sh.chunks;
  for (int i = 0; i < sh.axis; i++) outer *= t->dims[i];
  for (int i = sh.axis + 1; i < t->rank; i++) inner *= t->dims[i];
  int64_t wdim = t->dims[sh.axis] * sh.parts, wchunk = wdim / sh.chunks, k = (int64_t)r * sh.parts / sh.ranks;
  for (int64_t o = 0; o < outer; o++)
    for (int c = 0; c < sh.chunks; c++)
      for (int64_t j = 0; j < piece; j++) {
        float *w = whole + (o * wdim + c * wchunk + k * piece + j) * inner;
        float *p = part + (o * t->dims[sh.axis] + c * piece + j) * inner;
        for (int64_t i = 0; i < inner; i++)
          if (add) w[i] += p[i];
          else p[i] = w[i];
      }
}

typedef struct {
  TpTensor *vals[MAX_RANKS];
} Run;

/* Runs m forward and backward on `ranks` ranks in lockstep; inputs[i] feeds graph input i
 * on every rank. Returns TP_OK or the error. */
static int run(const TpModule *m, int ranks, const TpTensor *inputs, Run *out, TpDiag *d) {
  TP_ASSERT(ranks <= MAX_RANKS);
  for (int r = 0; r < ranks; r++) {
    TpTensor *vals = out->vals[r] = calloc((size_t)m->nvalues, sizeof *vals);
    for (int v = 0; v < m->nvalues; v++) {
      vals[v] = tp_value_tensor(m, v);
      const TpValue *val = &m->values[v];
      if (val->kind == TP_VAL_PARAM && val->shard.parts) {
        void *whole = (void *)tp_value_data(m, v);
        vals[v].data = malloc(tp_tensor_bytes(&vals[v]));
        slice(&val->type, val->shard, r, whole, vals[v].data, false);
      } else if (val->kind == TP_VAL_RESULT) {
        vals[v].data = calloc(1, tp_tensor_bytes(&vals[v]) + 1);
      }
    }
    for (int i = 0; i < m->ninputs; i++) vals[m->inputs[i]].data = inputs[i].data;
  }
  for (int o = 0; o < m->nops; o++) {
    const TpOp *op = &m->ops[o];
    for (int r = 0; r < ranks; r++) {
      TpTensor in[8], res[8], *vals = out->vals[r];
      for (int i = 0; i < op->ninputs; i++) in[i] = op->inputs[i] >= 0 ? vals[op->inputs[i]] : (TpTensor){0};
      for (int i = 0; i < op->noutputs; i++) res[i] = op->outputs[i] >= 0 ? vals[op->outputs[i]] : (TpTensor){0};
      if (op->kind == TP_OP_TensorRank) {
        *(int64_t *)res[0].data = r;
      } else if (op->kind == TP_OP_TensorCopy) {
        memcpy(res[0].data, in[0].data, tp_tensor_bytes(&in[0]));
      } else if (op->kind == TP_OP_AllReduce) {
        float *y = res[0].data;
        for (int64_t i = 0; i < tp_tensor_numel(&in[0]); i++) {
          y[i] = 0; /* in rank order; a runtime may sum in another: TOL covers it */
          for (int q = 0; q < ranks; q++) y[i] += ((const float *)out->vals[q][op->inputs[0]].data)[i];
        }
      } else if (tp_exec_op(m, o, in, res, d) != TP_OK) {
        return TP_ERR_INPUT;
      }
    }
  }
  return TP_OK;
}

static void free_run(const TpModule *m, int ranks, Run *out) {
  for (int r = 0; r < ranks; r++) {
    for (int v = 0; v < m->nvalues; v++)
      if (m->values[v].kind == TP_VAL_RESULT || (m->values[v].kind == TP_VAL_PARAM && m->values[v].shard.parts))
        free(out->vals[r][v].data);
    free(out->vals[r]);
  }
}

/* Largest |a - b| over the largest |b| (at least 1e-3), both of n floats. The floor: a
 * gradient zero in exact arithmetic (a key bias's: softmax ignores a shift of a row) is
 * rounding noise near 1e-9 in both runs; a wrong split errs by the gradient's size. */
static double rel_err(const float *a, const float *b, int64_t n);

/* rel_err of rank r's logits (rows of Vp) against its columns of the whole (rows of V): a
 * vocabulary-parallel head gives each rank V / ranks of them. */
static double logits_err(const float *part, const float *whole, int64_t rows, int64_t Vp, int64_t V, int r) {
  float *cut = malloc((size_t)(rows * Vp) * sizeof *cut);
  int64_t first = Vp == V ? 0 : r * Vp;
  for (int64_t i = 0; i < rows; i++) memcpy(cut + i * Vp, whole + i * V + first, (size_t)Vp * sizeof *cut);
  double err = rel_err(part, cut, rows * Vp);
  free(cut);
  return err;
}

static double rel_err(const float *a, const float *b, int64_t n) {
  double err = 0, big = 1e-3;
  for (int64_t i = 0; i < n; i++) {
    err = fmax(err, fabs((double)a[i] - b[i]));
    big = fmax(big, fabs((double)b[i]));
  }
  return err / big;
}

/* The larger of error `worst` so far and error e of the tensor `what` (the gradient of the
 * value so named, or the logits or loss), which *where then names. */
static double worse(double worst, double e, const char **where, const char *what) {
  if (e <= worst) return worst;
  *where = what;
  return e;
}

/* Shards `sharded` (a second copy of `whole`) over `ranks` and compares the two runs; the
 * graph output `logits` names the logits; params matching `freeze` (NULL: none) are not
 * trained. Frees both. */
static void compare(const char *name, TpModule *whole, TpModule *sharded, const char *logits, const char *freeze,
                    int ranks, TpDiag *d) {
  TpPassOptions opt = {.freeze = freeze, .tensor = ranks};
  const char *const train[] = {"add-loss", "autodiff", "verify"};
  const char *const shard[] = {"shard-tensor"};
  if (tp_run_passes(sharded, shard, 1, &opt, d) != TP_OK) {
    fail("%s: shard-tensor failed", name);
    return;
  }
  randomize(whole);
  randomize(sharded);
  if (tp_run_passes(whole, train, 3, &opt, d) != TP_OK || tp_run_passes(sharded, train, 3, &opt, d) != TP_OK) {
    fail("%s: add-loss or autodiff failed", name);
    return;
  }
  /* integer inputs: token ids and targets below every vocabulary here (12 or 16), each
   * vocabulary range met */
  TpTensor inputs[4];
  int64_t ids[64];
  for (int i = 0; i < 64; i++) ids[i] = (i * 7 + 3) % 12;
  TP_ASSERT(whole->ninputs <= 4 && whole->ninputs == sharded->ninputs);
  for (int i = 0; i < whole->ninputs; i++) {
    inputs[i] = tp_value_tensor(whole, whole->inputs[i]);
    inputs[i].data = ids;
    TP_ASSERT(tp_tensor_numel(&inputs[i]) <= 64 && inputs[i].dtype == TP_I64);
  }
  Run a = {{0}}, b = {{0}};
  if (run(whole, 1, inputs, &a, d) != TP_OK || run(sharded, ranks, inputs, &b, d) != TP_OK) {
    fail("%s: the interpreter failed", name);
    return;
  }
  double worst = 0;
  const char *where = "";
  int lw = tp_find_value(whole, logits), ls = tp_find_value(sharded, logits);
  for (int r = 0; r < ranks; r++) {
    const TpType *tw = &whole->values[lw].type, *ts = &sharded->values[ls].type;
    int64_t V = tw->dims[tw->rank - 1], Vp = ts->dims[ts->rank - 1];
    worst = worse(worst, logits_err(b.vals[r][ls].data, a.vals[0][lw].data, tp_type_numel(tw) / V, Vp, V, r), &where,
                  logits);
    worst = worse(worst, rel_err(b.vals[r][sharded->loss].data, a.vals[0][whole->loss].data, 1), &where, "the loss");
  }
  for (int v = 0; v < sharded->nvalues; v++) {
    const TpValue *val = &sharded->values[v];
    int g = tp_grad_of(sharded, v), w = tp_find_value(whole, val->name), gw = w >= 0 ? tp_grad_of(whole, w) : -1;
    if (g < 0) continue;
    if (gw < 0) {
      fail("%s: %%%s has a gradient only when sharded", name, val->name);
      continue;
    }
    const float *want = a.vals[0][gw].data;
    int64_t n = tp_type_numel(&whole->values[w].type);
    if (!val->shard.parts) {
      for (int r = 0; r < ranks; r++) worst = worse(worst, rel_err(b.vals[r][g].data, want, n), &where, val->name);
      continue;
    }
    float *got = calloc((size_t)n, sizeof *got); /* the ranks' parts put together */
    for (int r = 0; r < ranks; r++) slice(&val->type, val->shard, r, got, b.vals[r][g].data, true);
    worst = worse(worst, rel_err(got, want, n), &where, val->name);
    free(got);
  }
  printf("test_shard_tensor: %s over %d ranks: worst relative error %.2g (%s)\n", name, ranks, worst, where);
  if (worst > TOL) fail("%s over %d ranks: relative error %.2g above %.0e in %s", name, ranks, worst, TOL, where);
  free_run(whole, 1, &a);
  free_run(sharded, ranks, &b);
  tp_module_free(whole);
  tp_module_free(sharded);
}

static void check_frozen(const char *lit, const char *name, int ranks, const char *freeze) {
  TpDiag d;
  tp_diag_init(&d, "test_shard_tensor", name, stderr);
  TpModule *whole = load(lit, name, &d), *sharded = load(lit, name, &d);
  if (!whole || !sharded) {
    fail("%s: cannot read it from tests/lit/%s", name, lit);
    return;
  }
  compare(name, whole, sharded, "logits", freeze, ranks, &d);
}

static void check_case(const char *lit, const char *name, int ranks) { check_frozen(lit, name, ranks, NULL); }

/* The ONNX fixture tests/fixtures/<name>, imported with tokens [2, 16] and raised as
 * tokpipec does before shard-tensor (its weights are replaced by random ones). */
static TpModule *load_fixture(const char *name, TpDiag *d) {
  char path[1024];
  snprintf(path, sizeof path, "%s", __FILE__);
  char *slash = strrchr(path, '/');
  if (!slash) return NULL;
  snprintf(slash, sizeof path - (size_t)(slash - path), "/../fixtures/%s/model.onnx", name);
  TpImportOptions o = {.token_dims = {2, 16}};
  TpModule *m = NULL;
  const char *const raise[] = {"fold-constants", "dce", "raise-transformer", "insert-token-dim"};
  if (tp_import_onnx_file(path, &o, &m, d) != TP_OK || tp_run_passes(m, raise, 4, NULL, d) != TP_OK) {
    tp_module_free(m);
    return NULL;
  }
  return m;
}

static void check_fixture(const char *name, int ranks) {
  TpDiag d;
  tp_diag_init(&d, "test_shard_tensor", name, stderr);
  TpModule *whole = load_fixture(name, &d), *sharded = load_fixture(name, &d);
  if (!whole || !sharded || whole->noutputs != 1) {
    fail("%s: cannot import and raise tests/fixtures/%s with one output", name, name);
    tp_module_free(whole);
    tp_module_free(sharded);
    return;
  }
  char logits[256];
  snprintf(logits, sizeof logits, "%s", whole->values[whole->outputs[0]].name);
  compare(name, whole, sharded, logits, NULL, ranks, &d);
}

int main(void) {
  check_case("shard-gpt.tir", "gpt.tir", 2);
  check_case("shard-gpt.tir", "neox.tir", 2); /* head-major fused Q|K|V, Slice and Concat */
  check_case("shard-llama.tir", "llama.tir", 2);
  check_case("shard-llama.tir", "llama.tir", 4); /* K/V heads shared by two ranks each */
  /* vocabulary-parallel: a table tied to the head; an own [C, V] head with bias and an
   * upcast, over 2, 3 and 5 ranks (5: V = 12 does not split into them, kept whole) */
  check_case("shard-vocab.tir", "tied.tir", 2);
  check_case("shard-vocab.tir", "small.tir", 2);
  check_case("shard-vocab.tir", "small.tir", 3);
  check_case("shard-vocab.tir", "small.tir", 5);
  check_case("shard-fused.tir", "mpt.tir", 2);   /* fused Q|K|V cut by Slice: three chunks */
  check_case("shard-fused.tir", "bloom.tir", 2); /* head-major [heads, 3, head_dim] picked by Gather */
  check_case("shard-fused.tir", "mask.tir", 2);  /* a bias alike for every head stays whole */
  check_case("shard-fused.tir", "alibi.tir", 2); /* a per-head bias: the attention stays whole */
  check_frozen("shard-fused.tir", "alibi-param.tir", 2, "alibi"); /* a frozen bias param: split */
  check_case("shard-fused.tir", "mqa.tir", 2);                    /* multi-query K/V fused with Q: likewise */
  check_case("shard-fused.tir", "qkv-mq.tir", 2);      /* one K/V head fused apart from Q: whole on both */
  check_case("shard-fused.tir", "grouped.tir", 2);     /* [groups, q per group + 2, head_dim] */
  check_case("shard-fused.tir", "scaled.tir", 2);      /* a trainable scale of split features */
  check_case("shard-fused.tir", "heads-split.tir", 2); /* [3 x heads, head_dim] cut by Split */
  check_case("shard-qknorm.tir", "qk.tir", 2);         /* norms within each head: scales whole, summed */
  check_case("shard-qknorm.tir", "qk.tir", 4);         /* ... and K/V heads shared by two ranks each */
  check_case("shard-qknorm.tir", "olmo.tir", 2);       /* norms over all heads: mean squares all-reduced */
  check_case("shard-qknorm.tir", "olmo.tir", 4);       /* ... with K/V heads shared by two ranks each */
  check_case("shard-qknorm.tir", "across.tir", 2);     /* likewise over heads and features of [B, T, H, D] */
  /* every fixture, raised as tokpipec raises it, over 2 ranks and over 4 where its heads
   * divide (not fused_block's 2, gpt_o17_erf_untied_bias_dyn_trilu's 2 or
   * gpt_o17_erf_untied_bias_external's 6) */
  static const char *const fixtures[] = {"fused_block",
                                         "gpt_o14_erf_tied_bias_static",
                                         "gpt_o14_erf_untied_bias_static_nofold",
                                         "gpt_o14_tanh_tied_bias_dyn_conv1d",
                                         "gpt_o14_tanh_untied_nobias_dyn",
                                         "gpt_o17_erf_tied_bias_static",
                                         "gpt_o17_erf_untied_bias_dyn_trilu",
                                         "gpt_o17_erf_untied_bias_external",
                                         "gpt_o17_tanh_untied_nobias_dyn",
                                         "hf_bloom",
                                         "hf_falcon",
                                         "hf_gemma",
                                         "hf_gpt2",
                                         "hf_gpt_neo",
                                         "hf_gpt_neox",
                                         "hf_gptj",
                                         "hf_llama",
                                         "hf_mistral",
                                         "hf_mpt",
                                         "hf_opt",
                                         "hf_phi",
                                         "hf_qwen2"};
  for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
    check_fixture(fixtures[i], 2);
    if (i != 0 && i != 6 && i != 7) check_fixture(fixtures[i], 4);
  }
  /* today's exports with query and key norms: within each head (Qwen 3, TorchScript; Gemma 3,
   * dynamo: 1 + w scales, one K/V head) and over all heads (OLMo 2, dynamo) */
  static const char *const qk_norms[] = {"hf26_qwen3_t", "hf26_gemma3_d", "hf26_olmo2_d"};
  for (size_t i = 0; i < sizeof qk_norms / sizeof *qk_norms; i++) {
    check_fixture(qk_norms[i], 2);
    check_fixture(qk_norms[i], 4);
  }
  if (failures) fprintf(stderr, "test_shard_tensor: %d failures\n", failures);
  return failures ? 1 : 0;
}
