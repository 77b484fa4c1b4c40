/* The trainer's weights: initial values (random, --init MODEL.onnx or .safetensors),
 * checkpoints (--save / --resume), dumps (--dump-grads, --dump-weights) and --export-onnx.
 * Everything is keyed by the ONNX initializer names of TpPlan. Each process loads only the
 * parameters it holds (t->held); the writers run on process 0 after pipe_download. All of
 * it works on the host copies of t->host (train.h), which hold whole tensors also where a
 * rank holds a piece (tensor parallelism: params.c scatters and gathers them), so files
 * are the same whatever the plan's stages, tensor ranks and replicas. */
#include "train.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../onnx/onnx_weights.h"
#include "../../base/atomic.h"
#include "safetensors.h"

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

/* `have` (tensor `name` of file) can initialise plan parameter p. */
static int check_tensor(Trainer *t, const char *file, const char *name, const TpTensor *have, const TpPlanParam *p) {
  char a[200], b[200];
  const char *saved = t->d->file;
  int rc = TP_OK;
  t->d->file = file;
  TpTensor want = pipe_whole_tensor(t->plan, p, NULL);
  if (have->dtype != TP_F32)
    rc = tp_error(t->d, "initializer '%s' is %s; the compiled plan needs f32", name,
                  tp_dtype_name(have->dtype) ? tp_dtype_name(have->dtype) : "of an unknown type");
  else if (have->rank != want.rank || memcmp(have->dims, want.dims, (size_t)want.rank * sizeof *want.dims))
    rc = tp_error(t->d, "initializer '%s' has shape %s; the compiled plan needs %s", name,
                  shape_str(have->rank, have->dims, a, sizeof a), shape_str(want.rank, want.dims, b, sizeof b));
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
    float *w = t->host.param[i];
    if (!t->held[i]) { /* skip its two draws per element: splitmix64's state is a counter */
      if (P->params[i].rank >= 2) t->rng += 2 * (uint64_t)t->whole_numel[i] * 0x9e3779b97f4a7c15ull;
      continue;
    }
    if (P->params[i].rank >= 2) {
      for (int64_t k = 0; k < t->whole_numel[i]; k++) {
        double r = sqrt(-2 * log(uniform(&t->rng))), a = 2 * M_PI * uniform(&t->rng);
        w[k] = (float)(0.02 * r * cos(a));
      }
    } else {
      float fill = strstr(P->params[i].name, "bias") ? 0.0f : 1.0f;
      for (int64_t k = 0; k < t->whole_numel[i]; k++) w[k] = fill;
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
    else if (!(rc = tp_onnx_weights_get(w, p->source, &v, t->d)) && !(rc = check_tensor(t, path, p->source, &v, p)))
      memcpy(t->host.param[i], v.data, (size_t)t->whole_numel[i] * 4);
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
    else if (!(rc = check_tensor(t, path, p->name, v, p)))
      memcpy(t->host.param[i], v->data, (size_t)t->whole_numel[i] * 4);
  }
  tp_safetensors_free(&st);
  return rc;
}

/* ---- checkpoints ----
 * One safetensors file, so that writing it is one atomic rename: the parameters by ONNX
 * name, AdamW's moments as optimizer/m/NAME and optimizer/v/NAME, and in the metadata
 * what a resumed run needs to continue as if never stopped (the step, the data position,
 * the RNG state) and what it must agree with (global batch, sequence, vocabulary, the
 * training data's size and checksum). Version 2 (the first with checksums and the global
 * batch) is the only one read: version 1 stored the microbatch rows under "batch", which
 * cannot tell whether the data order matches. */

enum { CHECKPOINT_VERSION = 2 };

/* The metadata keys, each required; any other key is refused. */
static const char *const checkpoint_keys[] = {"format",      "version",     "step",  "data_position",
                                              "data_tokens", "data_crc32c", "rng",   "seed",
                                              "batch",       "seq",         "vocab", TP_SAFETENSORS_CRC_KEY,
                                              NULL};
/* fp16 plans' dynamic loss scaling (Trainer.loss_scale, good_steps, skipped_steps): present
 * exactly in their checkpoints. */
static const char *const loss_scale_keys[] = {"loss_scale", "loss_scale_good_steps", "loss_scale_skipped_steps",
                                              NULL};

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

/* The first element of values[numel] that is not finite, or -1. */
static int64_t first_non_finite(const float *values, int64_t numel) {
  for (int64_t k = 0; k < numel; k++)
    if (!isfinite(values[k])) return k;
  return -1;
}

int train_check_finite(Trainer *t, bool moments) {
  const TpPlan *P = t->plan;
  for (int i = 0; i < P->nparams; i++) {
    const float *what[3] = {t->host.param[i], moments ? t->host.m[i] : NULL, moments ? t->host.v[i] : NULL};
    for (int k = 0; k < 3; k++) {
      int64_t at = what[k] ? first_non_finite(what[k], t->whole_numel[i]) : -1;
      if (at >= 0)
        return tp_error(t->d,
                        "the %s of '%s' after step %" PRId64 " is %g at element %" PRId64
                        ": training diverged (lower --lr, or --grad-clip); nothing was written",
                        k == 0   ? "value"
                        : k == 1 ? "AdamW moment m"
                                 : "AdamW moment v",
                        P->params[i].name, t->step, (double)what[k][at], at);
    }
  }
  return TP_OK;
}

int train_save_checkpoint(Trainer *t) {
  const TpPlan *P = t->plan;
  int rc = train_check_finite(t, true); /* never replace the last good checkpoint with these */
  if (rc) return rc;
  TpNamedTensor *ts = malloc(3 * (size_t)P->nparams * sizeof *ts);
  TP_ASSERT(ts);
  int n = 0;
  for (int i = 0; i < P->nparams; i++) {
    ts[n++] = (TpNamedTensor){P->params[i].name, pipe_whole_tensor(P, &P->params[i], t->host.param[i])};
    if (!t->host.m[i]) continue;
    ts[n++] = (TpNamedTensor){moment_key("m", P->params[i].name), pipe_whole_tensor(P, &P->params[i], t->host.m[i])};
    ts[n++] = (TpNamedTensor){moment_key("v", P->params[i].name), pipe_whole_tensor(P, &P->params[i], t->host.v[i])};
  }
  char step[24], pos[24], tokens[24], crc[16], rng[24], seed[24], batch[24], seq[24], vocab[24], version[8];
  snprintf(step, sizeof step, "%" PRId64, t->step);
  snprintf(pos, sizeof pos, "%" PRId64, t->data_pos);
  snprintf(tokens, sizeof tokens, "%" PRId64, t->train.count);
  snprintf(crc, sizeof crc, "%08" PRIx32, t->train.crc32c);
  snprintf(rng, sizeof rng, "%" PRIu64, t->rng);
  snprintf(seed, sizeof seed, "%" PRIu64, t->o.seed);
  snprintf(batch, sizeof batch, "%" PRId64, train_rows(P));
  snprintf(seq, sizeof seq, "%" PRId64, P->seq);
  snprintf(vocab, sizeof vocab, "%" PRId64, P->vocab);
  snprintf(version, sizeof version, "%d", CHECKPOINT_VERSION);
  const char *meta[] = {"format",
                        CHECKPOINT_FORMAT,
                        "version",
                        version,
                        "step",
                        step,
                        "data_position",
                        pos,
                        "data_tokens",
                        tokens,
                        "data_crc32c",
                        crc,
                        "rng",
                        rng,
                        "seed",
                        seed,
                        "batch",
                        batch,
                        "seq",
                        seq,
                        "vocab",
                        vocab,
                        NULL,
                        NULL,
                        NULL,
                        NULL,
                        NULL,
                        NULL,
                        NULL};
  char scale[32], good[24], skipped[24];
  if (P->precision == TP_PLAN_FP16) { /* in place of the NULLs */
    snprintf(scale, sizeof scale, "%.9g", (double)t->loss_scale);
    snprintf(good, sizeof good, "%" PRId64, t->good_steps);
    snprintf(skipped, sizeof skipped, "%" PRId64, t->skipped_steps);
    const char *more[] = {"loss_scale", scale, "loss_scale_good_steps", good, "loss_scale_skipped_steps", skipped};
    memcpy(meta + 22, more, sizeof more);
  }
  char *path = train_checkpoint_path(t->o.save);
  TpAtomicFile a;
  rc = tp_atomic_open(&a, path, t->d);
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

/* A metadata value in plain decimal (digits only, no sign, space or leading zero) within
 * [lo, hi]; errors name the key and value. */
static int meta_uint(const TpSafetensors *st, const char *key, uint64_t lo, uint64_t hi, uint64_t *out, TpDiag *d) {
  const char *s = tp_safetensors_meta(st, key);
  uint64_t v = 0;
  bool ok = s && *s && !(s[0] == '0' && s[1]);
  for (const char *c = s; ok && *c; c++) {
    ok = *c >= '0' && *c <= '9' && v <= (UINT64_MAX - (uint64_t)(*c - '0')) / 10;
    v = v * 10 + (uint64_t)(*c - '0');
  }
  if (!s) return tp_error(d, "checkpoint metadata '%s' is missing", key);
  if (!ok || v < lo || v > hi)
    return tp_error(d, "checkpoint metadata '%s' is '%s', not a whole number in [%" PRIu64 ", %" PRIu64 "]", key, s,
                    lo, hi);
  *out = v;
  return TP_OK;
}

static int meta_int(const TpSafetensors *st, const char *key, int64_t lo, int64_t hi, int64_t *out, TpDiag *d) {
  uint64_t v;
  int rc = meta_uint(st, key, (uint64_t)lo, (uint64_t)hi, &v, d);
  if (!rc) *out = (int64_t)v;
  return rc;
}

int train_checkpoint_meta(const TpSafetensors *st, TrainCheckpointMeta *m, TpDiag *d) {
  memset(m, 0, sizeof *m);
  for (int i = 0; i < st->nmeta; i++) {
    int k = 0;
    while (checkpoint_keys[k] && strcmp(checkpoint_keys[k], st->meta[2 * i]) != 0) k++;
    int j = 0;
    while (loss_scale_keys[j] && strcmp(loss_scale_keys[j], st->meta[2 * i]) != 0) j++;
    if (!checkpoint_keys[k] && !loss_scale_keys[j])
      return tp_error(d, "checkpoint metadata has an unknown key '%s'", st->meta[2 * i]);
  }
  const char *format = tp_safetensors_meta(st, "format"), *crc = tp_safetensors_meta(st, "data_crc32c");
  int64_t version;
  int rc;
  if (!format || strcmp(format, CHECKPOINT_FORMAT) != 0)
    return tp_error(d, "not a tokpipe checkpoint (metadata 'format' is not '%s')", CHECKPOINT_FORMAT);
  if ((rc = meta_int(st, "version", 1, INT32_MAX, &version, d))) return rc;
  if (version != CHECKPOINT_VERSION)
    return tp_error(d, "checkpoint version %" PRId64 " is not supported (expected %d)%s", version,
                    CHECKPOINT_VERSION,
                    version < CHECKPOINT_VERSION ? ": it was written by an older trainer, without checksums; "
                                                   "resume it with that trainer, or start again"
                                                 : "");
  if (!tp_safetensors_meta(st, TP_SAFETENSORS_CRC_KEY))
    return tp_error(d, "checkpoint metadata '%s' is missing: the tensors cannot be checked", TP_SAFETENSORS_CRC_KEY);
  if ((rc = meta_int(st, "step", 0, TRAIN_MAX_STEPS, &m->step, d)) ||
      (rc = meta_int(st, "data_tokens", 1, INT64_MAX, &m->data_tokens, d)) ||
      (rc = meta_int(st, "data_position", 0, m->data_tokens - 1, &m->data_position, d)) ||
      (rc = meta_uint(st, "rng", 0, UINT64_MAX, &m->rng, d)) ||
      (rc = meta_uint(st, "seed", 0, UINT64_MAX, &m->seed, d)) ||
      (rc = meta_int(st, "batch", 1, INT64_MAX, &m->batch, d)) ||
      (rc = meta_int(st, "seq", 1, INT64_MAX, &m->seq, d)) ||
      (rc = meta_int(st, "vocab", 1, INT64_MAX, &m->vocab, d)))
    return rc;
  const char *scale = tp_safetensors_meta(st, "loss_scale");
  if ((m->scaled = scale != NULL)) {
    char *end;
    m->loss_scale = strtof(scale, &end);
    if (*end || end == scale || !isfinite(m->loss_scale) || m->loss_scale <= 0)
      return tp_error(d, "checkpoint metadata 'loss_scale' is '%s', not a positive number", scale);
    if ((rc = meta_int(st, "loss_scale_good_steps", 0, INT64_MAX, &m->good_steps, d)) ||
        (rc = meta_int(st, "loss_scale_skipped_steps", 0, m->step, &m->skipped_steps, d)))
      return rc;
  }
  if (!crc || strlen(crc) != 8 || !tp_crc32c_parse(crc, &m->data_crc32c))
    return tp_error(d, "checkpoint metadata 'data_crc32c' is %s%s%s, not 8 lowercase hex digits",
                    crc ? "'" : "missing", crc ? crc : "", crc ? "'" : "");
  return TP_OK;
}

/* Plan parameter i's tensor k in the checkpoint (0 the value, 1 and 2 AdamW's m and v, which
 * only trainable parameters have), its name (malloc'ed) in *name. */
static const TpTensor *checkpoint_tensor(const TpSafetensors *st, const TpPlanParam *p, int k, char **name) {
  *name = k ? moment_key(k == 1 ? "m" : "v", p->name) : strdup(p->name);
  TP_ASSERT(*name);
  return tp_safetensors_find(st, *name);
}

/* The checkpoint's tensors are exactly the plan's parameters and their moments, of the
 * plan's shapes: a checkpoint of another model (or of other frozen parameters) is refused. */
static int check_checkpoint_tensors(Trainer *t, const TpSafetensors *st, const char *path) {
  const TpPlan *P = t->plan;
  int rc = TP_OK, expected = 0;
  for (int i = 0; !rc && i < P->nparams; i++) {
    for (int k = 0; k < (P->params[i].trainable ? 3 : 1) && !rc; k++) {
      char *name;
      const TpTensor *v = checkpoint_tensor(st, &P->params[i], k, &name);
      rc = v ? check_tensor(t, path, name, v, &P->params[i]) : missing(t, path, "tensor", name);
      free(name);
      expected++;
    }
  }
  for (int j = 0; !rc && st->n != expected && j < st->n; j++) { /* then some tensor is not the plan's */
    const char *name = st->tensors[j].name, *param = name;
    if (strncmp(name, "optimizer/m/", 12) == 0 || strncmp(name, "optimizer/v/", 12) == 0) param = name + 12;
    int i = 0;
    while (i < P->nparams && !(strcmp(P->params[i].name, param) == 0 && (param == name || P->params[i].trainable)))
      i++;
    if (i == P->nparams) {
      const char *saved = t->d->file;
      t->d->file = path;
      rc = tp_error(t->d, "tensor '%s' is not %s of the compiled plan (a checkpoint of another model?)", name,
                    param == name ? "a parameter" : "an AdamW moment of a trainable parameter");
      t->d->file = saved;
    }
  }
  return rc;
}

int train_open_checkpoint(Trainer *t) {
  char *path = train_checkpoint_path(t->o.resume);
  int rc = tp_safetensors_load(path, &t->resume_st, t->d);
  if (rc) {
    free(path);
    return rc;
  }
  t->resume_open = true;
  const char *saved = t->d->file;
  t->d->file = path;
  rc = train_checkpoint_meta(&t->resume_st, &t->resume_meta, t->d);
  t->d->file = saved;
  free(path);
  /* train_checkpoint_meta required the checksums: their CRC names the whole file */
  const char *sums = tp_safetensors_meta(&t->resume_st, TP_SAFETENSORS_CRC_KEY);
  if (!rc) t->resume_crc = tp_crc32c(0, sums, strlen(sums));
  return rc;
}

void train_close_checkpoint(Trainer *t) {
  if (t->resume_open) tp_safetensors_free(&t->resume_st);
  t->resume_open = false;
}

/* From the checkpoint train_open_checkpoint read. */
static int resume(Trainer *t) {
  const TpPlan *P = t->plan;
  char *path = train_checkpoint_path(t->o.resume);
  const TpSafetensors *st = &t->resume_st;
  const TrainCheckpointMeta m = t->resume_meta;
  TP_ASSERT(t->resume_open);
  int rc = TP_OK;
  const char *saved = t->d->file;
  t->d->file = path;
  if (m.batch != train_rows(P) || m.seq != P->seq || m.vocab != P->vocab)
    rc = tp_error(t->d,
                  "the checkpoint was trained with batch %" PRId64 " x seq %" PRId64 ", vocab %" PRId64
                  "; this trainer has batch %" PRId64 " x seq %" PRId64 ", vocab %" PRId64
                  " (the data order would differ)",
                  m.batch, m.seq, m.vocab, train_rows(P), P->seq, P->vocab);
  else if (m.scaled != (P->precision == TP_PLAN_FP16))
    rc = tp_error(t->d, "the checkpoint %s loss scale, and this trainer %s (--precision fp16 has one)",
                  m.scaled ? "has a" : "has no", P->precision == TP_PLAN_FP16 ? "needs one" : "has none");
  else if (t->o.steps >= 0 && m.step > t->o.steps)
    rc = tp_error(t->d, "the checkpoint is at step %" PRId64 ", beyond --steps %" PRId64, m.step, t->o.steps);
  else if (t->o.data && (m.data_tokens != t->train.count || m.data_crc32c != t->train.crc32c))
    rc = tp_error(t->d,
                  "the checkpoint was trained on %" PRId64 " tokens of CRC-32C %08" PRIx32 "; --data '%s' has "
                  "%" PRId64 " tokens of CRC-32C %08" PRIx32 " (another data file?)",
                  m.data_tokens, m.data_crc32c, t->o.data, t->train.count, t->train.crc32c);
  t->d->file = saved;
  if (!rc) rc = check_checkpoint_tensors(t, st, path);
  for (int i = 0; !rc && i < P->nparams; i++) {
    float *dst[3] = {t->host.param[i], t->host.m[i], t->host.v[i]};
    for (int k = 0; t->held[i] && k < 3 && dst[k]; k++) {
      char *name;
      const TpTensor *v = checkpoint_tensor(st, &P->params[i], k, &name);
      memcpy(dst[k], v->data, (size_t)t->whole_numel[i] * 4);
      free(name);
    }
  }
  if (!rc) {
    t->step = m.step;
    t->data_pos = m.data_position;
    t->rng = m.rng;
    if (m.scaled) t->loss_scale = m.loss_scale, t->good_steps = m.good_steps, t->skipped_steps = m.skipped_steps;
  }
  train_close_checkpoint(t);
  free(path);
  return rc;
}

static int load_weights(Trainer *t) {
  if (t->o.resume) return resume(t);
  if (!t->o.init) {
    init_random(t);
    return TP_OK;
  }
  return ends_with(t->o.init, ".safetensors") ? init_from_safetensors(t, t->o.init) : init_from_onnx(t, t->o.init);
}

/* Into host copies, then to the device. */
int train_load_weights(Trainer *t) {
  int rc = pipe_host_alloc(t, t->o.resume != NULL);
  if (!rc) rc = load_weights(t);
  if (!rc) pipe_upload(t);
  pipe_host_free(t);
  return rc;
}

/* ---- dumps and export ---- */

/* The value of derived initializer k computed from its parameter's values (or grads). */
static float *derived_value(const Trainer *t, int k, const float *src) {
  const TpPlanDerived *dv = &t->plan->derived[k];
  TpTensor whole = pipe_whole_tensor(t->plan, &t->plan->params[dv->param], NULL);
  int64_t n = t->whole_numel[dv->param];
  float *out = malloc((size_t)(n ? n : 1) * 4);
  TP_ASSERT(out);
  if (!dv->transpose) {
    memcpy(out, src, (size_t)n * 4);
  } else {
    int64_t rows = whole.dims[0], cols = whole.dims[1];
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++) out[c * rows + r] = src[r * cols + c];
  }
  return out;
}

static TpTensor derived_tensor(const Trainer *t, int k, float *data) {
  const TpPlanDerived *dv = &t->plan->derived[k];
  TpTensor v = pipe_whole_tensor(t->plan, &t->plan->params[dv->param], data);
  if (dv->transpose) {
    int64_t rows = v.dims[0];
    v.dims[0] = v.dims[1], v.dims[1] = rows;
  }
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
      ts[(*n)++] = (TpNamedTensor){P->params[i].name,
                                   pipe_whole_tensor(P, &P->params[i], grads ? t->host.grad[i] : t->host.param[i])};
  *owned_from = *n;
  for (int k = 0; k < P->nderived; k++) {
    int i = P->derived[k].param;
    if (grads && !P->params[i].trainable) continue;
    float *v = derived_value(t, k, grads ? t->host.grad[i] : t->host.param[i]);
    ts[(*n)++] = (TpNamedTensor){P->derived[k].name, derived_tensor(t, k, v)};
  }
  return ts;
}

static void free_collected(TpNamedTensor *ts, int n, int owned_from) {
  for (int i = owned_from; i < n; i++) free(ts[i].t.data);
  free(ts);
}

int train_dump(Trainer *t, const char *path, bool grads) {
  int rc = grads ? TP_OK : train_check_finite(t, false);
  if (rc) return rc;
  int n, owned_from;
  TpNamedTensor *ts = collect(t, grads, &n, &owned_from);
  char step[24];
  snprintf(step, sizeof step, "%" PRId64, t->step);
  const char *meta[] = {"content", grads ? "gradients before the update" : "weights", "step", step, NULL};
  rc = tp_safetensors_save(path, ts, n, meta, t->d);
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
  if (!src || !*src) return tp_error(t->d, "--export-onnx needs the original model: pass --init MODEL.onnx");
  TpOnnxWeights *w;
  int rc = tp_onnx_weights_open(src, &w, t->d);
  for (int i = 0; !rc && i < P->nparams; i++) rc = tp_onnx_weights_check_replace(w, P->params[i].name, t->d);
  for (int k = 0; !rc && k < P->nderived; k++) rc = tp_onnx_weights_check_replace(w, P->derived[k].name, t->d);
  tp_onnx_weights_close(w);
  return rc;
}

int train_export_onnx(Trainer *t) {
  TpOnnxWeights *w;
  int rc = train_check_finite(t, false);
  if (!rc) rc = tp_onnx_weights_open(export_source(t), &w, t->d);
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
