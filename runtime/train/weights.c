/* The trainer's weights: initial values (random, --init MODEL.onnx or .safetensors),
 * checkpoints (--save / --resume), dumps (--dump-grads, --dump-weights) and --export-onnx.
 * Everything is keyed by the ONNX initializer names of TpPlan. Each process loads only the
 * parameters it holds (t->held); the writers run on process 0 after pipe_gather. */
#include "train.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../frontend/weights.h"
#include "atomic.h"
#include "safetensors.h"

enum { CHECKPOINT_VERSION = 1 };
#define CHECKPOINT_FORMAT "tokpipe-checkpoint"
#define CHECKPOINT_FILE "checkpoint.safetensors"

static char *shape_str(int rank, const int64_t *dims, char *buf, size_t n) {
  size_t len = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < rank && len < n; i++)
    len += (size_t)snprintf(buf + len, n - len, "%s%" PRId64, i ? ", " : "", dims[i]);
  if (len < n) snprintf(buf + len, n - len, "]");
  return buf;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

static TpTensor param_tensor(const TpPlanParam *p, void *data) {
  TpTensor t = {.dtype = TP_F32, .rank = p->rank, .data = data};
  memcpy(t.dims, p->dims, sizeof t.dims);
  return t;
}

/* `have` (tensor `name` of file) can initialise plan parameter p. */
static int check_tensor(Trainer *t, const char *file, const char *name, const TpTensor *have,
                        const TpPlanParam *p) {
  char a[200], b[200];
  const char *saved = t->d->file;
  int rc = TP_OK;
  t->d->file = file;
  TpTensor want = param_tensor(p, NULL);
  if (have->dtype != TP_F32)
    rc = tp_error(t->d, "initializer '%s' is %s; the compiled plan needs f32", name,
                  tp_dtype_name(have->dtype) ? tp_dtype_name(have->dtype) : "of an unknown type");
  else if (have->rank != want.rank || memcmp(have->dims, want.dims, (size_t)want.rank * sizeof *want.dims))
    rc = tp_error(t->d, "initializer '%s' has shape %s; the compiled plan needs %s", name,
                  shape_str(have->rank, have->dims, a, sizeof a),
                  shape_str(want.rank, want.dims, b, sizeof b));
  t->d->file = saved;
  return rc;
}

static int missing(Trainer *t, const char *file, const char *what, const char *name) {
  const char *saved = t->d->file;
  t->d->file = file;
  int rc = tp_error(t->d, "%s '%s' is missing (the compiled plan needs it)", what, name);
  t->d->file = saved;
  return rc;
}

/* ---- random initial values ---- */

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* In (0, 1). */
static double uniform(uint64_t *s) { return ((double)(splitmix64(s) >> 11) + 0.5) * 0x1.0p-53; }

/* GPT-2's scheme, by shape: matrices N(0, 0.02); vectors named like a bias 0, other
 * vectors 1 (LayerNorm scales). */
static void init_random(Trainer *t) {
  const TpPlan *P = t->plan;
  t->rng = t->o.seed;
  for (int i = 0; i < P->nparams; i++) {
    float *w = t->param[i];
    if (!t->held[i]) { /* skip its two draws per element: splitmix64's state is a counter */
      if (P->params[i].rank >= 2) t->rng += 2 * (uint64_t)t->numel[i] * 0x9e3779b97f4a7c15ull;
      continue;
    }
    if (P->params[i].rank >= 2) {
      for (int64_t k = 0; k < t->numel[i]; k++) {
        double r = sqrt(-2 * log(uniform(&t->rng))), a = 2 * M_PI * uniform(&t->rng);
        w[k] = (float)(0.02 * r * cos(a));
      }
    } else {
      float fill = strstr(P->params[i].name, "bias") ? 0.0f : 1.0f;
      for (int64_t k = 0; k < t->numel[i]; k++) w[k] = fill;
    }
  }
}

/* ---- --init ---- */

static int init_from_onnx(Trainer *t, const char *path) {
  TpOnnxWeights *w;
  int rc = tp_onnx_weights_open(path, &w, t->d);
  for (int i = 0; !rc && i < t->plan->nparams; i++) {
    const TpPlanParam *p = &t->plan->params[i];
    TpTensor v;
    if (!t->held[i]) continue;
    if (!tp_onnx_weights_has(w, p->source)) rc = missing(t, path, "initializer", p->source);
    else if (!(rc = tp_onnx_weights_get(w, p->source, &v, t->d)) &&
             !(rc = check_tensor(t, path, p->source, &v, p)))
      memcpy(t->param[i], v.data, (size_t)t->numel[i] * 4);
  }
  tp_onnx_weights_close(w);
  return rc;
}

static int init_from_safetensors(Trainer *t, const char *path) {
  TpSafetensors st;
  int rc = tp_safetensors_load(path, &st, t->d);
  for (int i = 0; !rc && i < t->plan->nparams; i++) {
    const TpPlanParam *p = &t->plan->params[i];
    const TpTensor *v = tp_safetensors_find(&st, p->name);
    if (!t->held[i]) continue;
    if (!v) rc = missing(t, path, "tensor", p->name);
    else if (!(rc = check_tensor(t, path, p->name, v, p))) memcpy(t->param[i], v->data, (size_t)t->numel[i] * 4);
  }
  tp_safetensors_free(&st);
  return rc;
}

/* ---- checkpoints ----
 * One safetensors file, so that writing it is one atomic rename: the parameters by ONNX
 * name, AdamW's moments as optimizer/m/NAME and optimizer/v/NAME, and in the metadata
 * the step, the data position and the RNG state. */

char *train_checkpoint_path(const char *dir) {
  size_t n = strlen(dir) + sizeof CHECKPOINT_FILE + 1;
  char *path = malloc(n);
  TP_ASSERT(path);
  snprintf(path, n, "%s/%s", dir, CHECKPOINT_FILE);
  return path;
}

static char *moment_key(const char *which, const char *name) {
  size_t n = strlen(name) + 16;
  char *key = malloc(n);
  TP_ASSERT(key);
  snprintf(key, n, "optimizer/%s/%s", which, name);
  return key;
}

int train_save_checkpoint(Trainer *t) {
  const TpPlan *P = t->plan;
  TpNamedTensor *ts = malloc(3 * (size_t)P->nparams * sizeof *ts);
  TP_ASSERT(ts);
  int n = 0;
  for (int i = 0; i < P->nparams; i++) {
    ts[n++] = (TpNamedTensor){P->params[i].name, param_tensor(&P->params[i], t->param[i])};
    if (!t->m[i]) continue;
    ts[n++] = (TpNamedTensor){moment_key("m", P->params[i].name), param_tensor(&P->params[i], t->m[i])};
    ts[n++] = (TpNamedTensor){moment_key("v", P->params[i].name), param_tensor(&P->params[i], t->v[i])};
  }
  char step[24], pos[24], rng[24], seed[24], batch[24], seq[24], vocab[24], version[8];
  snprintf(step, sizeof step, "%" PRId64, t->step);
  snprintf(pos, sizeof pos, "%" PRId64, t->data_pos);
  snprintf(rng, sizeof rng, "%" PRIu64, t->rng);
  snprintf(seed, sizeof seed, "%" PRIu64, t->o.seed);
  snprintf(batch, sizeof batch, "%" PRId64, P->batch);
  snprintf(seq, sizeof seq, "%" PRId64, P->seq);
  snprintf(vocab, sizeof vocab, "%" PRId64, P->vocab);
  snprintf(version, sizeof version, "%d", CHECKPOINT_VERSION);
  const char *meta[] = {"format", CHECKPOINT_FORMAT, "version", version, "step", step,
                        "data_position", pos, "rng", rng, "seed", seed, "batch", batch,
                        "seq", seq, "vocab", vocab, NULL};
  char *path = train_checkpoint_path(t->o.save);
  TpAtomicFile a;
  int rc = tp_atomic_open(&a, path, t->d);
  if (!rc) {
    /* test hook: a kill in the middle of writing the checkpoint of this step */
    const char *kill_at = getenv("TOKPIPE_TEST_KILL_IN_SAVE");
    a.kill_half = kill_at && strtoll(kill_at, NULL, 10) == t->step;
    tp_safetensors_write(&a, ts, n, meta);
    rc = tp_atomic_commit(&a, t->d);
  }
  for (int i = 0; i < n; i++)
    if (strncmp(ts[i].name, "optimizer/", 10) == 0) free((char *)ts[i].name);
  free(ts);
  free(path);
  return rc;
}

/* A metadata number of the checkpoint in [lo, hi]. */
static int meta_int(Trainer *t, const TpSafetensors *st, const char *key, int64_t lo, int64_t hi,
                    int64_t *out) {
  const char *s = tp_safetensors_meta(st, key);
  char *end = NULL;
  long long v = s ? strtoll(s, &end, 10) : 0;
  if (!s || !*s || *end || v < lo || v > hi)
    return tp_error(t->d, "checkpoint metadata '%s' is %s%s%s", key, s ? "'" : "missing", s ? s : "",
                    s ? "', out of range" : "");
  *out = v;
  return TP_OK;
}

static int resume(Trainer *t) {
  const TpPlan *P = t->plan;
  char *path = train_checkpoint_path(t->o.resume);
  TpSafetensors st;
  int rc = tp_safetensors_load(path, &st, t->d);
  if (rc) {
    free(path);
    return rc;
  }
  const char *saved = t->d->file;
  t->d->file = path;
  const char *format = tp_safetensors_meta(&st, "format");
  int64_t version = 0, batch = 0, seq = 0, vocab = 0, step = 0, pos = 0;
  if (!format || strcmp(format, CHECKPOINT_FORMAT) != 0)
    rc = tp_error(t->d, "not a tokpipe checkpoint (metadata 'format' is not '%s')", CHECKPOINT_FORMAT);
  else if (!(rc = meta_int(t, &st, "version", 0, INT32_MAX, &version)) && version != CHECKPOINT_VERSION)
    rc = tp_error(t->d, "checkpoint version %" PRId64 " is not supported (expected %d)", version,
                  CHECKPOINT_VERSION);
  if (!rc && !(rc = meta_int(t, &st, "batch", 1, INT64_MAX, &batch)) &&
      !(rc = meta_int(t, &st, "seq", 1, INT64_MAX, &seq)) &&
      !(rc = meta_int(t, &st, "vocab", 1, INT64_MAX, &vocab)) &&
      (batch != P->batch || seq != P->seq || vocab != P->vocab))
    rc = tp_error(t->d, "the checkpoint is of a plan with batch %" PRId64 ", seq %" PRId64 ", vocab %" PRId64
                  "; this one has %" PRId64 ", %" PRId64 ", %" PRId64, batch, seq, vocab, P->batch, P->seq, P->vocab);
  if (!rc && !(rc = meta_int(t, &st, "step", 0, INT64_MAX, &step)) && t->o.steps >= 0 && step > t->o.steps)
    rc = tp_error(t->d, "the checkpoint is at step %" PRId64 ", beyond --steps %" PRId64, step, t->o.steps);
  if (!rc && !(rc = meta_int(t, &st, "data_position", 0, INT64_MAX, &pos)) && pos >= t->train.count)
    rc = tp_error(t->d, "the checkpoint's data position %" PRId64 " lies beyond the %" PRId64
                  " tokens of '%s' (another data file?)", pos, t->train.count, t->o.data);
  const char *rng = tp_safetensors_meta(&st, "rng");
  if (!rc && !rng) rc = tp_error(t->d, "checkpoint metadata 'rng' is missing");
  t->d->file = saved;
  for (int i = 0; !rc && i < P->nparams; i++) {
    const TpPlanParam *p = &P->params[i];
    float *dst[3] = {t->param[i], t->m[i], t->v[i]};
    if (!t->held[i]) continue;
    for (int k = 0; k < 3 && !rc && dst[k]; k++) {
      char *key = k ? moment_key(k == 1 ? "m" : "v", p->name) : NULL;
      const char *name = key ? key : p->name;
      const TpTensor *v = tp_safetensors_find(&st, name);
      if (!v) rc = missing(t, path, "tensor", name);
      else if (!(rc = check_tensor(t, path, name, v, p))) memcpy(dst[k], v->data, (size_t)t->numel[i] * 4);
      free(key);
    }
  }
  if (!rc) {
    t->step = step;
    t->data_pos = pos;
    t->rng = strtoull(rng, NULL, 10);
  }
  tp_safetensors_free(&st);
  free(path);
  return rc;
}

int train_load_weights(Trainer *t) {
  if (t->o.resume) return resume(t);
  if (!t->o.init) {
    init_random(t);
    return TP_OK;
  }
  return ends_with(t->o.init, ".safetensors") ? init_from_safetensors(t, t->o.init)
                                              : init_from_onnx(t, t->o.init);
}

/* ---- dumps and export ---- */

/* The value of derived initializer k computed from its parameter's values (or grads). */
static float *derived_value(const Trainer *t, int k, const float *src) {
  const TpPlanDerived *dv = &t->plan->derived[k];
  const TpPlanParam *p = &t->plan->params[dv->param];
  int64_t n = t->numel[dv->param];
  float *out = malloc((size_t)(n ? n : 1) * 4);
  TP_ASSERT(out);
  if (!dv->transpose) {
    memcpy(out, src, (size_t)n * 4);
  } else {
    int64_t rows = p->dims[0], cols = p->dims[1];
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++) out[c * rows + r] = src[r * cols + c];
  }
  return out;
}

static TpTensor derived_tensor(const Trainer *t, int k, float *data) {
  const TpPlanDerived *dv = &t->plan->derived[k];
  TpTensor v = param_tensor(&t->plan->params[dv->param], data);
  if (dv->transpose) v.dims[0] = t->plan->params[dv->param].dims[1], v.dims[1] = t->plan->params[dv->param].dims[0];
  return v;
}

/* Every parameter (only trainable ones when grads) and derived initializer, named; the
 * derived values are malloc'ed (free them from index *nowned_from on). */
static TpNamedTensor *collect(const Trainer *t, bool grads, int *n, int *owned_from) {
  const TpPlan *P = t->plan;
  TpNamedTensor *ts = malloc((size_t)(P->nparams + P->nderived + 1) * sizeof *ts);
  TP_ASSERT(ts);
  *n = 0;
  for (int i = 0; i < P->nparams; i++)
    if (!grads || P->params[i].trainable)
      ts[(*n)++] = (TpNamedTensor){P->params[i].name, param_tensor(&P->params[i], grads ? t->grad[i] : t->param[i])};
  *owned_from = *n;
  for (int k = 0; k < P->nderived; k++) {
    int i = P->derived[k].param;
    if (grads && !P->params[i].trainable) continue;
    float *v = derived_value(t, k, grads ? t->grad[i] : t->param[i]);
    ts[(*n)++] = (TpNamedTensor){P->derived[k].name, derived_tensor(t, k, v)};
  }
  return ts;
}

static void free_collected(TpNamedTensor *ts, int n, int owned_from) {
  for (int i = owned_from; i < n; i++) free(ts[i].t.data);
  free(ts);
}

int train_dump(Trainer *t, const char *path, bool grads) {
  int n, owned_from;
  TpNamedTensor *ts = collect(t, grads, &n, &owned_from);
  char step[24];
  snprintf(step, sizeof step, "%" PRId64, t->step);
  const char *meta[] = {"content", grads ? "gradients before the update" : "weights", "step", step, NULL};
  int rc = tp_safetensors_save(path, ts, n, meta, t->d);
  free_collected(ts, n, owned_from);
  return rc;
}

/* The model --export-onnx rewrites: the --init model, else the one the plan was compiled from. */
static const char *export_source(const Trainer *t) {
  if (t->o.init && !ends_with(t->o.init, ".safetensors")) return t->o.init;
  return t->plan->model;
}

int train_check_export(Trainer *t) {
  const TpPlan *P = t->plan;
  const char *src = export_source(t);
  if (!src || !*src)
    return tp_error(t->d, "--export-onnx needs the original model: pass --init MODEL.onnx");
  TpOnnxWeights *w;
  int rc = tp_onnx_weights_open(src, &w, t->d);
  for (int i = 0; !rc && i < P->nparams; i++) rc = tp_onnx_weights_check_replace(w, P->params[i].name, t->d);
  for (int k = 0; !rc && k < P->nderived; k++) rc = tp_onnx_weights_check_replace(w, P->derived[k].name, t->d);
  tp_onnx_weights_close(w);
  return rc;
}

int train_export_onnx(Trainer *t) {
  TpOnnxWeights *w;
  int rc = tp_onnx_weights_open(export_source(t), &w, t->d);
  if (rc) return rc;
  int n, owned_from;
  TpNamedTensor *ts = collect(t, false, &n, &owned_from);
  const char **names = malloc((size_t)(n + 1) * sizeof *names);
  TpTensor *values = malloc((size_t)(n + 1) * sizeof *values);
  TP_ASSERT(names && values);
  for (int i = 0; i < n; i++) names[i] = ts[i].name, values[i] = ts[i].t;
  void *bytes;
  size_t size;
  rc = tp_onnx_weights_pack(w, names, values, n, &bytes, &size, t->d);
  if (!rc) rc = tp_write_file_atomic(t->o.export_onnx, bytes, size, t->d);
  free(bytes);
  free(names);
  free(values);
  free_collected(ts, n, owned_from);
  tp_onnx_weights_close(w);
  return rc;
}
