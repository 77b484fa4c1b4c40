/* The trainer runtime every generated program links: tp_trainer_main parses the command
 * line, loads the data and the initial weights, runs the training steps of the plan's
 * stage functions with AdamW, and writes logs, checkpoints, dumps and the trained model.
 * Exit codes: 0 ok, 1 bad input (one error line), 2 bad usage, 3 internal error.
 *
 * An ABI 2 plan (stages x tensor ranks x replicas, see plan.h) runs in one process or under
 * mpirun with one process per rank (step.h; a tensor-parallel plan only the latter). Every process reads the options, the data and its
 * own parameters; process 0 alone writes the outputs (logs, dumps, checkpoints, the
 * model, the trace), from what it gathers, and only it prints errors: a failure of
 * another process is agreed on (pipe_agree), which prints that process's message. */
#include "train.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <regex.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../base/atomic.h"

#ifndef TOKPIPE_VERSION
#define TOKPIPE_VERSION "unknown"
#endif

enum { MAX_VAL_BATCHES = 20 };

/* ---- the command line ---- */

static const char *usage_text =
    "Usage: %s --data FILE [options]\n"
    "Trains the model compiled into this program (%s: batch %" PRId64 ", seq %" PRId64 ", vocab %" PRId64 ").\n"
    "\n"
    "Data and steps:\n"
    "  --data FILE          training tokens, llm.c's format (a 256 x int32 header: 20240520,\n"
    "                       1, count; then uint16 tokens); batch k reads batch*seq+1 tokens\n"
    "                       from k*batch*seq, wrapping around at the end\n"
    "  --steps N            total steps; a resumed run continues to N (default: one pass)\n"
    "  --val-data FILE      validation tokens, evaluated forward only\n"
    "  --val-every K        evaluate after every K-th step (default: after the last step)\n"
    "  --val-batches N      batches per evaluation, at most the file's whole batches\n"
    "                       (default: all of them, at most 20)\n"
    "Weights:\n"
    "  --init FILE          initial weights: an ONNX model's initializers (external data\n"
    "                       too), or a .safetensors of the parameters; without it they are\n"
    "                       random: matrices N(0, 0.02), vectors named *bias* 0, other 1\n"
    "  --seed N             seed of the random weights (default 1)\n"
    "Optimizer: AdamW as torch.optim.AdamW, decay on every trainable parameter but --no-decay's\n"
    "  --lr X               learning rate (default 0.001)\n"
    "  --beta1 X, --beta2 X (default 0.9, 0.999)\n"
    "  --eps X              (default 1e-8)\n"
    "  --weight-decay X     decoupled weight decay (default 0)\n"
    "  --no-decay REGEX     parameters whose ONNX names match (POSIX ERE) are not decayed,\n"
    "                       e.g. 'bias|norm' as Hugging Face's Trainer leaves biases and norms\n"
    "  --grad-clip NORM     scale the gradients down to this global norm (default: off)\n"
    "  --lr-schedule S      constant (default) or cosine (from --lr down to 0 at --steps)\n"
    "  --warmup N           linear warmup over the first N steps (default 0)\n"
    "Output:\n"
    "  --log FILE           one JSON object per step: step, loss, lr, grad_norm, ms,\n"
    "                       tokens_per_s, and val_loss when evaluated\n"
    "  --dump-grads FILE    .safetensors of the first step's gradients, before the update\n"
    "  --dump-weights FILE  .safetensors of the parameters after training\n"
    "  --save DIR           checkpoint (weights, AdamW state, step, data position) to\n"
    "                       DIR/checkpoint.safetensors, atomically\n"
    "  --save-every K       every K steps (default: after the last step only)\n"
    "  --resume DIR         continue from DIR's checkpoint, bit for bit as if never stopped\n"
    "                       (in another pipeline plan: the same to rounding)\n"
    "  --export-onnx FILE   the model (--init's, else the compiled one) with trained weights\n"
    "  --trace FILE.json    a Chrome/Perfetto trace of every rank's compute and communication\n"
    "                       (open it in ui.perfetto.dev or chrome://tracing)\n"
    "Profiling (instead of training):\n"
    "  --profile FILE.json  time each stage's forward and backward of one token slice of l\n"
    "                       tokens after c of context, on the grid compiled in (tokpipec\n"
    "                       --profile-grid), and one AdamW step; write the planner's profile\n"
    "                       file (tokpipe-plan). Run it as training runs (mpirun -np S*D), so\n"
    "                       the ranks share the machine as in a real run. Takes --init or\n"
    "                       --seed and the optimizer's options; no data, steps or outputs\n"
    "Pipeline: a plan of S stages x D replicas runs as one process, or as mpirun -np S*D\n"
    "  (TOKPIPE_COMM_TIMEOUT: seconds a rank may wait without progress, default 300)\n"
    "  --help, --version\n";

typedef struct {
  const char *flag;
  char kind; /* s string, i int64 >= lo, u uint64, f double in [lo, hi], c choice */
  size_t offset;
  double lo, hi;
} OptSpec;

#define AT(field) offsetof(TrainOptions, field)
static const OptSpec opt_specs[] = {
    {"--init", 's', AT(init), 0, 0},
    {"--data", 's', AT(data), 0, 0},
    {"--val-data", 's', AT(val_data), 0, 0},
    {"--log", 's', AT(log), 0, 0},
    {"--dump-grads", 's', AT(dump_grads), 0, 0},
    {"--dump-weights", 's', AT(dump_weights), 0, 0},
    {"--save", 's', AT(save), 0, 0},
    {"--resume", 's', AT(resume), 0, 0},
    {"--no-decay", 's', AT(no_decay), 0, 0},
    {"--export-onnx", 's', AT(export_onnx), 0, 0},
    {"--trace", 's', AT(trace), 0, 0},
    {"--profile", 's', AT(profile), 0, 0},
    {"--steps", 'i', AT(steps), 0, TRAIN_MAX_STEPS},
    {"--seed", 'u', AT(seed), 0, 0},
    {"--val-every", 'i', AT(val_every), 1, 0},
    {"--val-batches", 'i', AT(val_batches), 1, 0},
    {"--save-every", 'i', AT(save_every), 1, 0},
    {"--warmup", 'i', AT(warmup), 0, 0},
    /* The optimizer computes in float: every value finite as a float (an infinite --lr
     * trained to NaN weights without a word), --eps above 0 (else a zero gradient's update
     * is 0 / 0). */
    {"--lr", 'f', AT(lr), 0, FLT_MAX},
    {"--beta1", 'f', AT(beta1), 0, 0.999999999},
    {"--beta2", 'f', AT(beta2), 0, 0.999999999},
    {"--eps", 'f', AT(eps), 1e-30, FLT_MAX},
    {"--weight-decay", 'f', AT(weight_decay), 0, FLT_MAX},
    {"--grad-clip", 'f', AT(grad_clip), 1e-30, FLT_MAX},
    {"--lr-schedule", 'c', AT(cosine), 0, 0},
};
#undef AT

/* On d's stream: NULL on every process but the first. */
static int usage_error(const TpDiag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_error(const TpDiag *d, const char *fmt, ...) {
  if (!d->stream) return TP_ERR_USAGE;
  va_list ap;
  va_start(ap, fmt);
  tp_vusage_error(d->stream, d->tool, fmt, ap);
  va_end(ap);
  return TP_ERR_USAGE;
}

static int set_option(TrainOptions *o, const OptSpec *s, const char *v, const TpDiag *d) {
  char *at = (char *)o + s->offset, *end = NULL;
  errno = 0;
  switch (s->kind) {
  case 's':
    if (!*v) return usage_error(d, "%s needs a non-empty value", s->flag);
    *(const char **)at = v;
    return TP_OK;
  case 'c':
    if (strcmp(v, "constant") != 0 && strcmp(v, "cosine") != 0)
      return usage_error(d, "%s must be constant or cosine, not '%s'", s->flag, v);
    *(bool *)at = strcmp(v, "cosine") == 0;
    return TP_OK;
  case 'i': {
    long long x = strtoll(v, &end, 10);
    if (s->hi > 0 && (!*v || *end || errno || x < (long long)s->lo || x > (long long)s->hi))
      return usage_error(d, "%s needs an integer in [%lld, %lld], not '%s'", s->flag, (long long)s->lo,
                         (long long)s->hi, v);
    if (!*v || *end || errno || x < (long long)s->lo)
      return usage_error(d, "%s needs an integer >= %d, not '%s'", s->flag, (int)s->lo, v);
    *(int64_t *)at = x;
    return TP_OK;
  }
  case 'u': {
    unsigned long long x = strtoull(v, &end, 10);
    if (!(*v >= '0' && *v <= '9') || *end || errno) /* strtoull takes " -1" as 2^64 - 1 */
      return usage_error(d, "%s needs a non-negative integer, not '%s'", s->flag, v);
    *(uint64_t *)at = x;
    return TP_OK;
  }
  default: {
    double x = strtod(v, &end);
    if (!*v || *end || errno || !(x >= s->lo && x <= s->hi))
      return usage_error(d, "%s needs a number in [%.9g, %.9g], not '%s'", s->flag, s->lo, s->hi, v);
    *(double *)at = x;
    return TP_OK;
  }
  }
}

/* What --profile cannot go with: it runs no step and writes nothing else. */
static const char *const training_only[] =
    {"--data",         "--val-data", "--steps",      "--val-every", "--val-batches", "--log",   "--dump-grads",
     "--dump-weights", "--save",     "--save-every", "--resume",    "--export-onnx", "--trace", NULL};

/* TP_OK, TP_ERR_USAGE, or -1 after --help or --version. */
static int parse_options(TrainOptions *o, int argc, char **argv, const TpDiag *d, const TpPlan *P) {
  const char *tool = d->tool;
  *o = (TrainOptions){.steps = -1, .seed = 1, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
  const char *training = NULL; /* the first option given that trains or writes training outputs */
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      if (d->stream) printf(usage_text, tool, P->model ? P->model : "?", train_rows(P), P->seq, P->vocab);
      return -1;
    }
    if (strcmp(arg, "--version") == 0) {
      if (d->stream)
        printf("%s: tokpipe trainer runtime %s; plan compiled by tokpipec %s from %s\n", tool, TOKPIPE_VERSION,
               P->tokpipec_version ? P->tokpipec_version : "?", P->model ? P->model : "?");
      return -1;
    }
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    const OptSpec *spec = NULL;
    for (size_t k = 0; k < sizeof opt_specs / sizeof *opt_specs; k++)
      if (strncmp(opt_specs[k].flag, arg, len) == 0 && opt_specs[k].flag[len] == 0) spec = &opt_specs[k];
    if (!spec) {
      if (arg[0] == '-') return usage_error(d, "unknown option '%.*s'", (int)len, arg);
      return usage_error(d, "unexpected argument '%s'", arg);
    }
    const char *value = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
    if (!value) return usage_error(d, "%s needs a value", spec->flag);
    int rc = set_option(o, spec, value, d);
    if (rc) return rc;
    for (int k = 0; training_only[k] && !training; k++)
      if (strcmp(training_only[k], spec->flag) == 0) training = spec->flag;
  }
  if (o->profile && training)
    return usage_error(d, "--profile measures the stages and does not train: it cannot go with %s", training);
  if (o->profile && !(P->stages && P->nprobes && train_chunks(P) == 1)) { /* one line: --help cannot help */
    if (d->stream)
      fprintf(d->stream,
              "%s: error: this trainer has no profiling units: compile it with tokpipec "
              "--profile-grid auto\n",
              tool);
    return TP_ERR_USAGE;
  }
  if (o->profile) return TP_OK;
  if (!o->data && o->steps != 0) return usage_error(d, "--data FILE is required");
  if (!o->val_data && (o->val_every || o->val_batches))
    return usage_error(d, "--val-every and --val-batches need --val-data");
  if (!o->save && o->save_every) return usage_error(d, "--save-every needs --save");
  if (o->init && o->resume)
    return usage_error(d, "--init and --resume exclude each other (a checkpoint holds the weights)");
  if (o->no_decay) {
    regex_t re;
    int err = regcomp(&re, o->no_decay, REG_EXTENDED | REG_NOSUB);
    char why[128] = "";
    if (err) regerror(err, &re, why, sizeof why);
    else regfree(&re);
    if (err) return usage_error(d, "--no-decay: bad regular expression '%s': %s", o->no_decay, why);
  }
  return TP_OK;
}

/* Each parameter's AdamW weight decay: --weight-decay, or 0 where --no-decay matches its
 * name; a --no-decay that matches no trained parameter is an error (a misspelt name would
 * silently decay everything). */
static int decay_of_params(Trainer *t) {
  const TpPlan *P = t->plan;
  t->decay = calloc((size_t)(P->nparams ? P->nparams : 1), sizeof *t->decay);
  TP_ASSERT(t->decay);
  regex_t re;
  bool matched = false;
  if (t->o.no_decay)
    TP_ASSERT(regcomp(&re, t->o.no_decay, REG_EXTENDED | REG_NOSUB) == 0); /* parse_options checked it */
  for (int i = 0; i < P->nparams; i++) {
    bool exempt = t->o.no_decay && regexec(&re, P->params[i].name, 0, NULL, 0) == 0;
    matched |= exempt && P->params[i].trainable;
    t->decay[i] = exempt ? 0 : t->o.weight_decay;
  }
  if (t->o.no_decay) regfree(&re);
  if (t->o.no_decay && !matched)
    return tp_error(t->d, "--no-decay '%s' matches no trained parameter", t->o.no_decay);
  return TP_OK;
}

/* ---- the plan ---- */

static int check_plan(const TpPlan *P, TpDiag *d) {
  if (P->abi != TP_PLAN_ABI)
    return tp_internal(d,
                       "the plan has ABI version %d, this runtime %d: compile it again with "
                       "the tokpipec of this runtime",
                       P->abi, TP_PLAN_ABI);
  bool ok = P->batch >= 1 && P->seq >= 1 && P->vocab >= 1 && P->token_limit >= 0 && P->nstages >= 1 &&
            P->nparams >= 0 && P->nderived >= 0 && (P->stages || (P->arena_bytes && P->forward && P->backward)) &&
            (P->stages || P->tensor <= 1) && /* tensor ranks run schedules (ABI 2) */
            (P->precision == TP_PLAN_FP32 ||
             (P->stages && (P->precision == TP_PLAN_BF16 || P->precision == TP_PLAN_FP16)));
  for (int s = 0; ok && !P->stages && s < P->nstages; s++) ok = P->forward[s] && P->backward[s];
  for (int i = 0; ok && i < P->nparams; i++) {
    const TpPlanParam *p = &P->params[i];
    ok = p->name && p->source && p->rank >= 0 && p->rank <= TP_MAX_RANK;
    for (int k = 0; ok && k < p->rank; k++) ok = p->dims[k] >= 0;
  }
  for (int k = 0; ok && k < P->nderived; k++) {
    const TpPlanDerived *dv = &P->derived[k];
    ok = dv->name && dv->param >= 0 && dv->param < P->nparams && (!dv->transpose || P->params[dv->param].rank == 2);
  }
  if (!ok) return tp_internal(d, "the compiled plan is malformed");
  return P->stages ? pipe_check_plan(P, d) : TP_OK;
}

/* ---- buffers ---- */

static void free_buffers(Trainer *t) {
  pipe_free(t);
  free(t->decay);
  tp_tokens_close(&t->train);
  tp_tokens_close(&t->val);
  trace_free(t->trace);
  train_close_checkpoint(t);
  tp_unlock_path(&t->resume_lock);
}

/* ---- one step ---- */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The learning rate of step (1-based): linear warmup, then constant or cosine to 0. */
static double lr_at(const TrainOptions *o, int64_t step, int64_t total) {
  int64_t i = step - 1;
  if (i < o->warmup) return o->lr * (double)(i + 1) / (double)o->warmup;
  if (!o->cosine) return o->lr;
  double ratio = (double)(i - o->warmup) / (double)(total - o->warmup);
  return o->lr * 0.5 * (1 + cos(M_PI * ratio));
}

/* The next batch of `file` into the step's tokens; every process learns whether each read it
 * (a file truncated under one of them fails them all). */
static int read_batch(Trainer *t, TpTokenFile *file, int64_t pos) {
  return pipe_agree(t, tp_tokens_batch(file, pos, train_rows(t->plan), t->plan->seq, t->tokens, t->targets, t->d));
}

/* The mean loss over the validation batches (forward only) into *loss. */
static int evaluate(Trainer *t, double *loss) {
  int64_t bt = train_rows(t->plan) * t->plan->seq, n = t->o.val_batches;
  double sum = 0;
  int rc;
  for (int64_t j = 0; j < n; j++) {
    if ((rc = read_batch(t, &t->val, j * bt % t->val.count))) return rc;
    sum += pipe_eval(t);
  }
  *loss = sum / (double)n;
  return TP_OK;
}

/* ---- logs ---- */

/* The shortest decimal that reads back as the same float (as the same double when !single). */
static void fmt_number(char *buf, size_t n, double x, bool single) {
  if (!isfinite(x)) {
    snprintf(buf, n, "null"); /* JSON has no NaN or infinity */
    return;
  }
  for (int digits = single ? 6 : 15; digits <= 17; digits++) {
    snprintf(buf, n, "%.*g", digits, x);
    if (single ? strtof(buf, NULL) == (float)x : strtod(buf, NULL) == x) return;
  }
}

typedef struct {
  int64_t step;
  float loss;
  double lr, norm, ms, val_loss; /* val_loss NaN: not evaluated */
  float loss_scale;              /* fp16: the step's loss scale (0: not logged) */
  bool skipped;                  /* fp16: not finite, no update */
} StepRecord;

static void log_json(FILE *f, const StepRecord *r, int64_t tokens) {
  char loss[40], lr[40], norm[40], val[40];
  fmt_number(loss, sizeof loss, r->loss, true);
  fmt_number(lr, sizeof lr, r->lr, false);
  fmt_number(norm, sizeof norm, r->norm, true);
  fprintf(f,
          "{\"step\": %" PRId64 ", \"loss\": %s, \"lr\": %s, \"grad_norm\": %s, \"ms\": %.3f, "
          "\"tokens_per_s\": %.1f",
          r->step, loss, lr, norm, r->ms, (double)tokens / (r->ms / 1e3));
  if (!isnan(r->val_loss)) {
    fmt_number(val, sizeof val, r->val_loss, true);
    fprintf(f, ", \"val_loss\": %s", val);
  }
  if (r->loss_scale)
    fprintf(f, ", \"loss_scale\": %.9g%s", (double)r->loss_scale, r->skipped ? ", \"skipped\": true" : "");
  fputs("}\n", f);
}

/* Opens --log when its first line is to be written (a run that fails before leaves none,
 * and a resumed run that fails before leaves the old log as it was). After a resume the log
 * keeps the lines of the steps up to the checkpoint (dropping those of steps run after it
 * before the interruption; the checkpoint is of step resumed_at), then goes on. */
static int open_log(Trainer *t, int64_t resumed_at) {
  const char *path = t->o.log;
  if (t->o.resume && access(path, F_OK) == 0) {
    char why[256];
    size_t size;
    char *old = tp_read_input(path, &size, why, sizeof why), *kept = NULL;
    if (!old) return tp_error(t->d, "cannot read the --log '%s' to continue it: %s", path, why);
    size_t len = 0;
    for (char *line = old, *end; line < old + size; line = end + 1) {
      end = memchr(line, '\n', (size_t)(old + size - line));
      if (!end) break; /* a line cut by the interruption */
      long long step;
      if (sscanf(line, "{\"step\": %lld", &step) != 1 || step > resumed_at) continue;
      kept = realloc(kept, len + (size_t)(end + 1 - line));
      TP_ASSERT(kept);
      memcpy(kept + len, line, (size_t)(end + 1 - line));
      len += (size_t)(end + 1 - line);
    }
    free(old);
    int rc = tp_write_file_atomic(path, kept ? kept : "", len, t->d);
    free(kept);
    if (rc) return rc;
  }
  /* O_NONBLOCK: a FIFO nobody reads is an error (ENXIO) instead of a wait without end */
  int fd = open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | (t->o.resume ? O_APPEND : O_TRUNC), 0666);
  int flags = fd < 0 ? -1 : fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0 || !(t->log = fdopen(fd, t->o.resume ? "a" : "w"))) {
    int err = errno;
    if (fd >= 0) close(fd);
    return tp_error(t->d, "cannot write '%s': %s", path, err == ENXIO ? "a FIFO that nobody reads" : strerror(err));
  }
  return TP_OK;
}

/* One step's line of --log (process 0); every process learns the outcome. */
static int write_log(Trainer *t, const StepRecord *r, int64_t tokens) {
  int rc = TP_OK;
  if (train_is_root(t) && !t->log) rc = open_log(t, r->step - 1);
  if (!rc && t->log) {
    log_json(t->log, r, tokens);
    if (fflush(t->log) != 0) rc = tp_error(t->d, "cannot write '%s': %s", t->o.log, strerror(errno));
  }
  return pipe_agree(t, rc);
}

/* ---- the run ---- */

static int prepare_save_dir(Trainer *t) {
  struct stat st;
  const char *dir = t->o.save;
  if (stat(dir, &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return tp_error(t->d, "--save '%s' is not a folder", dir);
    if (access(dir, W_OK) != 0)
      return tp_error(t->d, "--save folder '%s' is not writable: %s", dir, strerror(errno));
    char *path = train_checkpoint_path(dir);
    int rc = stat(path, &st) == 0 && !S_ISREG(st.st_mode) /* a folder, a FIFO: tp_atomic_open refuses it */
                 ? tp_error(t->d, "--save checkpoint '%s' exists and is not a regular file", path)
                 : TP_OK;
    free(path);
    return rc;
  }
  if (errno != ENOENT) return tp_error(t->d, "--save folder '%s': %s", dir, strerror(errno));
  return tp_check_writable(dir, "--save folder", t->d);
}

/* The --save folder (created if missing) and the lock of its checkpoint, so that a second
 * trainer saving there fails at start-up instead of mixing its checkpoints with ours. */
static int lock_save_dir(Trainer *t) {
  if (mkdir(t->o.save, 0777) == 0) t->made_save_dir = true;
  else if (errno != EEXIST)
    return tp_error(t->d, "cannot create the --save folder '%s': %s", t->o.save, strerror(errno));
  char *path = train_checkpoint_path(t->o.save);
  int rc = tp_lock_path(&t->save_lock, path, "--save checkpoint", t->d);
  /* With the lock held, temporaries of the checkpoint are a killed writer's: remove them. */
  const char *base = strrchr(path, '/') + 1;
  size_t n = strlen(base);
  DIR *dir = rc ? NULL : opendir(t->o.save);
  for (struct dirent *e; dir && (e = readdir(dir));)
    if (strncmp(e->d_name, base, n) == 0 && strncmp(e->d_name + n, ".tmp.", 5) == 0)
      unlinkat(dirfd(dir), e->d_name, 0);
  if (dir) closedir(dir);
  free(path);
  return rc;
}

/* After the run: the log closed, the lock released, and after a failure a --save folder
 * this run created but wrote nothing into removed (rmdir leaves a non-empty one). */
static int close_outputs(Trainer *t, int rc) {
  if (t->log && fclose(t->log) != 0 && !rc) rc = tp_error(t->d, "cannot write '%s': %s", t->o.log, strerror(errno));
  t->log = NULL;
  tp_unlock_path(&t->save_lock);
  if (rc && t->made_save_dir) rmdir(t->o.save);
  t->made_save_dir = false;
  return rc;
}

/* One write of the whole line: other processes write to the same stderr (their step counts). */
static void print_progress(const Trainer *t, const StepRecord *r, int64_t total) {
  char line[256];
  int width = snprintf(NULL, 0, "%" PRId64, total);
  size_t n = (size_t)snprintf(line, sizeof line,
                              "step %*" PRId64 "/%" PRId64
                              " | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s",
                              width, r->step, total, r->loss, r->lr, r->norm, r->ms,
                              (double)(train_rows(t->plan) * t->plan->seq) / (r->ms / 1e3));
  if (!isnan(r->val_loss) && n < sizeof line)
    n += (size_t)snprintf(line + n, sizeof line - n, " | val %.6f", r->val_loss);
  if (r->loss_scale && n < sizeof line)
    snprintf(line + n, sizeof line - n, " | scale %g%s", (double)r->loss_scale, r->skipped ? " (skipped)" : "");
  fprintf(stderr, "%s\n", line);
}

/* Test hooks: SIGKILL after the given step; with TOKPIPE_TEST_KILL_RANK, only that rank. */
static void kill_hook(const Trainer *t, const char *var, int64_t step) {
  const char *s = getenv(var), *rank = getenv("TOKPIPE_TEST_KILL_RANK");
  if (s && strtoll(s, NULL, 10) == step && (!rank || strtol(rank, NULL, 10) == t->comm->rank)) raise(SIGKILL);
}

/* Writes (on process 0) what write() produces; every process learns the outcome. */
static int root_writes(Trainer *t, int (*write)(Trainer *t)) {
  return pipe_agree(t, train_is_root(t) ? write(t) : TP_OK);
}

/* root_writes of the host copies of the gradients (grads) or the values (with moments,
 * AdamW's m and v too), brought to process 0 first. */
static int root_writes_host(Trainer *t, bool grads, bool moments, int (*write)(Trainer *t)) {
  int rc = pipe_download(t, grads, moments);
  if (!rc) rc = root_writes(t, write);
  pipe_host_free(t);
  return rc;
}

static int write_grads(Trainer *t) { return train_dump(t, t->o.dump_grads, true); }
static int write_weights(Trainer *t) { return train_dump(t, t->o.dump_weights, false); }

/* The backend's counts of the step (the CUDA runtime's: launches, host waits, ...), one line
 * per process on stderr, where it counts. */
static void print_step_counts(Trainer *t) {
  char line[512];
  const TpComputeBackend *be = t->compute->be;
  if (be->step_counts && be->step_counts(t->compute, line, sizeof line))
    fprintf(stderr, "step counts (rank %d): %s\n", t->comm->rank, line);
}

static int train(Trainer *t, int64_t total) {
  const TpPlan *P = t->plan;
  const TrainOptions *o = &t->o;
  int64_t rows = train_rows(P), bt = rows * P->seq, first = t->step + 1;
  int rc;
  if (o->log && o->resume && first > total && /* nothing to run: the log still ends at the checkpoint */
      (rc = pipe_agree(t, train_is_root(t) ? open_log(t, t->step) : TP_OK)))
    return rc;
  for (int64_t step = first; step <= total; step++) {
    double t0 = now_ms();
    if ((rc = read_batch(t, &t->train, t->data_pos))) return rc;
    double loss = pipe_train_step(t);
    bool scaled = P->precision == TP_PLAN_FP16;
    if (!isfinite(loss) && !scaled) /* the same loss on every process: each fails, process 0 says why */
      return tp_error(t->d,
                      "the loss is %f at step %" PRId64 ": training diverged (lower --lr, or "
                      "--grad-clip)",
                      loss, step);
    double norm = pipe_grad_norm(t), lr = lr_at(o, step, total);
    /* fp16: an overflow skips the update and halves the loss scale (the same everywhere) */
    bool skip = scaled && (!isfinite(loss) || !isfinite(norm));
    float scale = t->loss_scale;
    if (!isfinite(norm) && !skip) /* likewise the same everywhere */
      return tp_error(t->d,
                      "the gradient norm is %f at step %" PRId64 ": training diverged (lower --lr, or "
                      "--grad-clip)",
                      norm, step);
    double t_grads = now_ms();
    if (step == first && o->dump_grads) {
      t->step = step; /* the dump's metadata names the step */
      if ((rc = root_writes_host(t, true, false, write_grads))) return rc;
    }
    double dump_ms = now_ms() - t_grads;
    float clip = 1;
    if (o->grad_clip > 0 && o->grad_clip / (norm + 1e-6) < 1) clip = (float)(o->grad_clip / (norm + 1e-6));
    if (skip) {
      t->skipped_steps++, t->good_steps = 0;
      t->loss_scale /= 2;
    } else {
      pipe_update(t, step - t->skipped_steps, lr, clip); /* AdamW counts its updates */
      if (scaled && ++t->good_steps == t->scale_growth) t->loss_scale *= 2, t->good_steps = 0;
    }
    t->step = step;
    t->data_pos = (t->data_pos + bt) % t->train.count;
    StepRecord r = {step, (float)loss, lr, norm, now_ms() - t0 - dump_ms, NAN, scaled ? scale : 0, skip};
    if (o->val_data && (o->val_every ? step % o->val_every == 0 : step == total) && (rc = evaluate(t, &r.val_loss)))
      return rc;
    if (o->log && (rc = write_log(t, &r, bt))) return rc;
    if (train_is_root(t)) print_progress(t, &r, total);
    print_step_counts(t);
    if (o->save && (step == total || (o->save_every && step % o->save_every == 0))) {
      if ((rc = root_writes_host(t, false, true, train_save_checkpoint))) return rc;
    }
    kill_hook(t, "TOKPIPE_TEST_KILL_AFTER_STEP", step);
  }
  return TP_OK;
}

/* Checks on process 0 before long work: the outputs can be written. */
static int check_outputs(Trainer *t) {
  const TrainOptions *o = &t->o;
  int rc = TP_OK;
  if ((o->log && (rc = tp_check_folder_writable(o->log, "--log", t->d))) ||
      (o->dump_grads && (rc = tp_check_writable(o->dump_grads, "--dump-grads", t->d))) ||
      (o->dump_weights && (rc = tp_check_writable(o->dump_weights, "--dump-weights", t->d))) ||
      (o->export_onnx && (rc = tp_check_writable(o->export_onnx, "--export-onnx", t->d))) ||
      (o->trace && (rc = tp_check_writable(o->trace, "--trace", t->d))) || (o->save && (rc = prepare_save_dir(t))) ||
      (o->export_onnx && (rc = train_check_export(t))))
    return rc;
  return TP_OK;
}

/* A plan's TpPlanSchedule as tokpipec --schedule names it. */
static const char *schedule_name(int schedule) {
  static const char *const names[] = {"gpipe", "1f1b", "zb", "interleaved"};
  return schedule >= 0 && schedule <= TP_PLAN_INTERLEAVED ? names[schedule] : "?";
}

static void print_start(const Trainer *t, int64_t total) {
  const TpPlan *P = t->plan;
  int64_t nel = 0, ntrain = 0;
  for (int i = 0; i < P->nparams; i++) {
    nel += t->whole_numel[i];
    if (P->params[i].trainable) ntrain += t->whole_numel[i];
  }
  fprintf(stderr,
          "%s: %" PRId64 " parameters (%" PRId64 " trainable) in %d tensors; batch %" PRId64 " x seq %" PRId64
          "; %" PRId64 " training tokens; steps %" PRId64 "..%" PRId64 "\n",
          t->d->tool, nel, ntrain, P->nparams, train_rows(P), P->seq, t->train.count, t->step + 1, total);
  char tensor[96] = "";
  int S = train_pipeline(P);
  if (train_chunks(P) > 1) snprintf(tensor, sizeof tensor, " of %d virtual stages each", train_chunks(P));
  if (train_tensor(P) > 1)
    snprintf(tensor + strlen(tensor), sizeof tensor - strlen(tensor), " x %d tensor ranks", train_tensor(P));
  if (P->stages)
    fprintf(stderr,
            "%s: pipeline of %d stage%s%s x %d replica%s, %d microbatch%s of %" PRId64 " row%s, %d slice%s, "
            "%s schedule; %d rank%s in %d process%s (%s)\n",
            t->d->tool, S, S == 1 ? "" : "s", tensor, P->dp, P->dp == 1 ? "" : "s", P->microbatches,
            P->microbatches == 1 ? "" : "es", P->batch, P->batch == 1 ? "" : "s", P->nslices,
            P->nslices == 1 ? "" : "s", schedule_name(P->schedule), t->nranks, t->nranks == 1 ? "" : "s",
            t->comm->size, t->comm->size == 1 ? "" : "es", t->comm->be->name);
}

/* ---- the ranks agree at start-up ---- */

static uint32_t crc_of(uint32_t crc, const void *data, size_t size) { return tp_crc32c(crc, data, size); }
static uint32_t crc_i64(uint32_t crc, int64_t x) { return crc_of(crc, &x, sizeof x); }
static uint32_t crc_str(uint32_t crc, const char *s) { return s ? crc_of(crc, s, strlen(s) + 1) : crc_i64(crc, -1); }

static uint32_t crc_message(uint32_t crc, const TpPlanMessage *msgs, int n) {
  crc = crc_i64(crc, msgs != NULL);
  for (int i = 0; msgs && i < n; i++) {
    crc = crc_i64(crc, msgs[i].nbuffers);
    for (int j = 0; j < msgs[i].nbuffers; j++)
      crc = crc_i64(crc_i64(crc, msgs[i].buffers[j].offset), msgs[i].buffers[j].bytes);
  }
  return crc;
}

/* The plan's identity: a CRC-32C of what it says (sizes, parameters, stages, schedules,
 * messages, collectives), not of its code's addresses, so that every process of one
 * program, or of two programs compiled alike, has the same. */
static uint32_t plan_identity(const TpPlan *P) {
  uint32_t c = crc_i64(0, P->abi);
  c = crc_str(c, P->tokpipec_version);
  int64_t sizes[] = {P->batch,    P->seq,      P->vocab,        P->token_limit,  P->nparams,
                     P->nderived, P->nstages,  P->global_batch, P->microbatches, P->dp,
                     P->nslices,  P->schedule, P->tensor,       P->nprobes,      P->zero};
  c = crc_of(c, sizes, sizeof sizes);
  if (train_chunks(P) > 1) c = crc_i64(c, P->chunks); /* only interleaved plans': the others' stay */
  c = crc_str(c, P->device ? P->device->name : "cpu");
  for (int i = 0; i < P->nparams; i++) {
    const TpPlanParam *p = &P->params[i];
    c = crc_str(crc_str(c, p->name), p->source);
    int64_t v[] = {p->rank, p->trainable, p->stage, p->tied_stage, p->shard.axis, p->shard.parts, p->shard.chunks};
    c = crc_of(c, v, sizeof v);
    if (train_pad(P, p)) c = crc_i64(c, train_pad(P, p)); /* only where there is one: the others' stay */
    for (int k = 0; k < p->rank && k < TP_MAX_RANK; k++) c = crc_i64(c, p->dims[k]);
  }
  for (int k = 0; k < P->nderived; k++)
    c = crc_i64(crc_i64(crc_str(c, P->derived[k].name), P->derived[k].param), P->derived[k].transpose);
  for (int i = 0; P->slice_len && i < P->nslices; i++) c = crc_i64(c, P->slice_len[i]);
  for (int k = 0; !P->stages && P->arena_bytes && k < P->nstages; k++) c = crc_i64(c, (int64_t)P->arena_bytes[k]);
  for (int k = 0; !P->stages && P->transient_bytes && k < P->nstages; k++)
    c = crc_i64(c, (int64_t)P->transient_bytes[k]);
  for (int k = 0; P->stages && k < P->nstages; k++) {
    const TpPlanStage *st = &P->stages[k];
    c = crc_i64(crc_i64(crc_i64(crc_i64(c, (int64_t)st->arena_bytes), st->arenas), (int64_t)st->transient_bytes),
                st->ninsns);
    for (int i = 0; i < st->ninsns; i++) {
      int64_t v[] = {st->insns[i].kind, st->insns[i].mb, st->insns[i].slice, st->insns[i].peer};
      c = crc_of(c, v, sizeof v);
      if (train_chunks(P) > 1) c = crc_i64(c, st->insns[i].chunk);
    }
    c = crc_message(crc_message(c, st->recv_act, P->nslices), st->send_act, P->nslices);
    c = crc_message(crc_message(c, st->recv_grad, P->nslices), st->send_grad, P->nslices);
    for (int i = 0; st->forward_reduces && i < P->nslices; i++) c = crc_i64(c, st->forward_reduces[i]);
    for (int i = 0; st->backward_reduces && i < P->nslices; i++) c = crc_i64(c, st->backward_reduces[i]);
  }
  for (int p = 0; p < P->nprobes; p++) {
    int64_t v[] = {P->probes[p].b, P->probes[p].l, P->probes[p].c};
    c = crc_of(c, v, sizeof v);
  }
  return c;
}

typedef enum { FIELD_COUNT, FIELD_NUMBER, FIELD_GIVEN, FIELD_CRC } FieldKind;

/* What every process must have alike, each a 64-bit slot of the start-up gather. */
typedef struct {
  const char *name;
  FieldKind kind;
} StartField;

/* One option a line (the formatter would re-flow them). */
/* clang-format off */
#define OPTION_FIELDS(X)             \
  X("--init", init)                  \
  X("--data", data)                  \
  X("--val-data", val_data)          \
  X("--log", log)                    \
  X("--dump-grads", dump_grads)      \
  X("--dump-weights", dump_weights)  \
  X("--save", save)                  \
  X("--resume", resume)              \
  X("--export-onnx", export_onnx)    \
  X("--trace", trace)                \
  X("--profile", profile)
/* clang-format on */

enum {
  F_PLAN,
  F_STEPS,
  F_SEED,
  F_VAL_EVERY,
  F_VAL_BATCHES,
  F_SAVE_EVERY,
  F_WARMUP,
  F_LR,
  F_BETA1,
  F_BETA2,
  F_EPS,
  F_WEIGHT_DECAY,
  F_GRAD_CLIP,
  F_SCHEDULE,
  F_NO_DECAY,
  F_DATA_TOKENS,
  F_DATA_CRC,
  F_VAL_TOKENS,
  F_VAL_CRC,
  F_CKPT_STEP,
  F_CKPT_CRC,
  F_GIVEN /* then one per OPTION_FIELDS entry */
};

static const StartField start_fields[] = {{"the plan (its CRC-32C)", FIELD_CRC},
                                          {"--steps", FIELD_COUNT},
                                          {"--seed", FIELD_COUNT},
                                          {"--val-every", FIELD_COUNT},
                                          {"--val-batches", FIELD_COUNT},
                                          {"--save-every", FIELD_COUNT},
                                          {"--warmup", FIELD_COUNT},
                                          {"--lr", FIELD_NUMBER},
                                          {"--beta1", FIELD_NUMBER},
                                          {"--beta2", FIELD_NUMBER},
                                          {"--eps", FIELD_NUMBER},
                                          {"--weight-decay", FIELD_NUMBER},
                                          {"--grad-clip", FIELD_NUMBER},
                                          {"--lr-schedule (1: cosine)", FIELD_COUNT},
                                          {"--no-decay (its CRC-32C)", FIELD_CRC},
                                          {"the --data file's token count", FIELD_COUNT},
                                          {"the --data file's CRC-32C", FIELD_CRC},
                                          {"the --val-data file's token count", FIELD_COUNT},
                                          {"the --val-data file's CRC-32C", FIELD_CRC},
                                          {"the --resume checkpoint's step", FIELD_COUNT},
                                          {"the --resume checkpoint's checksums (their CRC-32C)", FIELD_CRC},
#define NAME_FIELD(flag, field) {flag, FIELD_GIVEN},
                                          OPTION_FIELDS(NAME_FIELD)
#undef NAME_FIELD
};
enum { NFIELDS = sizeof start_fields / sizeof *start_fields };

static int64_t bits_of(double x) {
  int64_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

static void field_text(char *out, size_t size, const StartField *f, int64_t v) {
  FieldKind kind = f->kind;
  double x;
  memcpy(&x, &v, sizeof x);
  switch (kind) {
  case FIELD_COUNT: snprintf(out, size, "%" PRId64, v); break;
  case FIELD_NUMBER: snprintf(out, size, "%.17g", x); break;
  case FIELD_GIVEN: snprintf(out, size, "%s%s", v ? "" : "no ", f->name); break;
  default: snprintf(out, size, "%08" PRIx32, (uint32_t)v); break;
  }
}

/* Before the first step, in one collective: every process has the same plan, the same
 * options that decide the collectives and the results, the same training and validation
 * data (token count and CRC-32C) and the same checkpoint (step and checksums). Else one
 * error naming the field and the processes that differ: processes out of step would
 * deadlock or mix what they compute. */
static int agree_at_start(Trainer *t) {
  if (t->comm->size == 1) return TP_OK;
  const TrainOptions *o = &t->o;
  int64_t mine[NFIELDS] = {[F_PLAN] = plan_identity(t->plan),
                           [F_STEPS] = o->steps,
                           [F_SEED] = (int64_t)o->seed,
                           [F_VAL_EVERY] = o->val_every,
                           [F_VAL_BATCHES] = o->val_batches,
                           [F_SAVE_EVERY] = o->save_every,
                           [F_WARMUP] = o->warmup,
                           [F_LR] = bits_of(o->lr),
                           [F_BETA1] = bits_of(o->beta1),
                           [F_BETA2] = bits_of(o->beta2),
                           [F_EPS] = bits_of(o->eps),
                           [F_WEIGHT_DECAY] = bits_of(o->weight_decay),
                           [F_GRAD_CLIP] = bits_of(o->grad_clip),
                           [F_SCHEDULE] = o->cosine,
                           [F_NO_DECAY] = o->no_decay ? crc_str(0, o->no_decay) : 0,
                           [F_DATA_TOKENS] = o->data ? t->train.count : 0,
                           [F_DATA_CRC] = o->data ? t->train.crc32c : 0,
                           [F_VAL_TOKENS] = o->val_data ? t->val.count : 0,
                           [F_VAL_CRC] = o->val_data ? t->val.crc32c : 0,
                           [F_CKPT_STEP] = t->resume_open ? t->resume_meta.step : 0,
                           [F_CKPT_CRC] = t->resume_open ? t->resume_crc : 0};
  int f = F_GIVEN;
#define GIVEN_FIELD(flag, field) mine[f++] = o->field != NULL;
  OPTION_FIELDS(GIVEN_FIELD)
#undef GIVEN_FIELD
  TP_ASSERT(f == NFIELDS);
  int n = t->comm->size;
  int64_t *all = calloc((size_t)n * NFIELDS, sizeof *all);
  TP_ASSERT(all);
  memcpy(all + (size_t)t->comm->rank * NFIELDS, mine, sizeof mine); /* a gather as a sum of slots */
  pipe_sum_processes(t, all, (size_t)n * NFIELDS, TP_I64);
  int rc = TP_OK;
  for (int k = 0; k < NFIELDS && !rc; k++) {
    char list[160] = "";
    int odd = 0, other = -1;
    for (int r = 1; r < n; r++) {
      if (all[(size_t)r * NFIELDS + k] == all[k]) continue;
      if (other < 0) other = r;
      if (odd < 8) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", odd ? ", " : "", r);
      odd++;
    }
    if (other < 0) continue;
    if (odd > 8) snprintf(list + strlen(list), sizeof list - strlen(list), " and %d more", odd - 8);
    char a[40], b[40];
    field_text(a, sizeof a, &start_fields[k], all[k]);
    field_text(b, sizeof b, &start_fields[k], all[(size_t)other * NFIELDS + k]);
    const char *why = k == F_PLAN                            ? "every process must run the same compiled plan"
                      : k >= F_DATA_TOKENS && k <= F_VAL_CRC ? "every process must read the same tokens: a stale "
                                                               "copy of the file on another node?"
                      : k == F_CKPT_STEP || k == F_CKPT_CRC
                          ? "every process must resume from the same checkpoint: "
                            "another copy of the folder, or one replaced meanwhile?"
                          : "every process must be given the same options";
    if (odd == 1)
      rc = tp_error(t->d, "the processes disagree on %s: process 0 has %s, process %s has %s (%s)",
                    start_fields[k].name, a, list, b, why);
    else
      rc = tp_error(t->d,
                    "the processes disagree on %s: process 0 has %s, processes %s have others (process %d: %s) "
                    "(%s)",
                    start_fields[k].name, a, list, other, b, why);
  }
  free(all);
  return rc;
}

/* --resume: process 0 holds the checkpoint's lock for reading while every process reads it
 * (a trainer saving there would replace it between two processes' reads), unless it holds
 * it already for --save; then every process reads it. */
static int open_resume(Trainer *t) {
  int rc = TP_OK;
  if (train_is_root(t)) {
    struct stat a, b;
    bool saving_there = t->o.save && stat(t->o.save, &a) == 0 && stat(t->o.resume, &b) == 0 &&
                        a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    char *path = train_checkpoint_path(t->o.resume);
    if (!saving_there) rc = tp_lock_path_shared(&t->resume_lock, path, "--resume checkpoint", t->d);
    free(path);
  }
  if ((rc = pipe_agree(t, rc))) return rc;
  return pipe_agree(t, train_open_checkpoint(t));
}

static int run(Trainer *t) {
  const TpPlan *P = t->plan;
  TrainOptions *o = &t->o;
  int64_t need = train_rows(P) * P->seq + 1;
  int rc;
  if (!P->stages && t->comm->size > 1) {
    if (train_is_root(t))
      fprintf(stderr,
              "%s: error: the plan has 1 stage x 1 replica = 1 rank; mpirun started %d (run it "
              "without mpirun)\n",
              t->d->tool, t->comm->size);
    return TP_ERR_USAGE;
  }
  if ((rc = pipe_agree(t, decay_of_params(t))) || (rc = pipe_agree(t, pipe_setup(t)))) return rc;
  /* Up to agree_at_start every process runs the same collectives whatever its options */
  if (o->data) rc = tp_tokens_open(o->data, train_token_limit(P), P->token_limit_of, need, &t->train, t->d);
  if (!rc && o->val_data)
    rc = tp_tokens_open(o->val_data, train_token_limit(P), P->token_limit_of, need, &t->val, t->d);
  if ((rc = pipe_agree(t, rc))) return rc;
  if ((rc = pipe_agree(t, train_is_root(t) ? check_outputs(t) : TP_OK))) return rc;
  /* The lock before the resume: a second trainer on this --save stops at once, before it
   * reads a checkpoint the first one may be replacing. */
  rc = pipe_agree(t, o->save && train_is_root(t) ? lock_save_dir(t) : TP_OK);
  if (!rc && o->resume) rc = open_resume(t);
  if (!rc) rc = agree_at_start(t);
  if (!rc && o->profile) return train_profile(t);                       /* it has no outputs to close */
  int64_t val_held = o->val_data ? (t->val.count - 1) / (need - 1) : 0; /* whole batches */
  if (!rc && o->val_batches > val_held)
    rc = tp_error(t->d,
                  "--val-batches %" PRId64 " is more than '%s' holds: %" PRId64 " batch%s of %" PRId64
                  " tokens (batch * seq + 1)",
                  o->val_batches, o->val_data, val_held, val_held == 1 ? "" : "es", need);
  if (o->val_data && !o->val_batches) o->val_batches = val_held < MAX_VAL_BATCHES ? val_held : MAX_VAL_BATCHES;
  int64_t total = o->steps >= 0 ? o->steps : (t->train.count - 1) / (need - 1);
  o->steps = total; /* the default is below 2^31: a token file holds fewer tokens */
  if (!rc) rc = pipe_agree(t, train_load_weights(t));
  if (!rc) pipe_gather_loaded(t);
  tp_unlock_path(&t->resume_lock); /* every process has read the checkpoint */
  if (!rc && o->dump_grads && t->step >= total)
    rc = tp_error(t->d, "--dump-grads: no step is left to run (steps %" PRId64 "..%" PRId64 ")", t->step + 1, total);
  if (!rc) {
    if (train_is_root(t)) print_start(t, total);
    tp_comm_barrier(t->comm); /* the trace's common start */
    if (o->trace) t->trace = trace_new();
    rc = train(t, total);
  }
  if ((rc = pipe_agree(t, close_outputs(t, rc)))) return rc;
  if (o->dump_weights && (rc = root_writes_host(t, false, false, write_weights))) return rc;
  if (o->export_onnx && (rc = root_writes_host(t, false, false, train_export_onnx))) return rc;
  if (o->trace) rc = pipe_agree(t, trace_write(t, o->trace));
  return rc;
}

/* This process's index among the processes of its node, which picks its GPU: what the MPI
 * launcher tells it (OpenMPI, MPICH's Hydra, Slurm), else its rank (one node); 0 alone. */
static int local_rank(const TpComm *comm) {
  if (comm->size == 1) return 0;
  static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v >= '0' && *v <= '9') return atoi(v);
  }
  return comm->rank;
}

/* The compute backend of the plan's device (none: the CPU's), then its transport, which
 * replaces the host transport when it gives one (*device_comm). Each step agreed by every
 * process, since opening a transport is collective. */
static int open_device(Trainer *t, TpComm **device_comm) {
  const TpPlanDevice *dev = t->plan->device;
  int rc = dev ? dev->open_compute(&t->compute, local_rank(t->comm), t->d) : tp_compute_open(&t->compute, t->d);
  if (!rc && t->plan->precision != TP_PLAN_FP32 && !t->compute->be->add_half_into)
    rc = tp_error(t->d, "the %s device cannot run a plan stored in 16 bits (--precision %s): compile it for the cpu",
                  t->compute->be->name, t->plan->precision == TP_PLAN_BF16 ? "bf16" : "fp16");
  if ((rc = pipe_agree(t, rc)) || !dev || !dev->open_comm) return rc;
  if ((rc = pipe_agree(t, dev->open_comm(t->comm, t->compute, t->plan, device_comm, t->d)))) return rc;
  if (*device_comm) t->comm = *device_comm;
  return TP_OK;
}

/* parse_options on every process; a process whose command line is wrong (an MPMD launch
 * gives each its own) fails them all, and the first such process prints its error (process
 * 0 prints its own). */
static int parse_command_line(Trainer *t, int argc, char **argv) {
  int rc = parse_options(&t->o, argc, argv, t->d, t->plan), first;
  if (rc < 0 || t->comm->size == 1) return rc;
  int worst = tp_comm_agree(t->comm, rc, &first);
  if (first > 0 && first == t->comm->rank) {
    TpDiag mine = *t->d;
    mine.stream = stderr;
    fprintf(stderr, "%s: rank %d's command line:\n", t->d->tool, t->comm->rank);
    parse_options(&t->o, argc, argv, &mine, t->plan);
  }
  return worst;
}

int tp_trainer_main(const TpPlan *plan, int argc, char **argv) {
  const char *tool = argc > 0 && argv[0] ? argv[0] : "trainer";
  if (strrchr(tool, '/')) tool = strrchr(tool, '/') + 1;
  TpDiag d;
  tp_diag_init(&d, tool, NULL, stderr);
  TpComm *comm;
  int rc = tp_comm_open(&comm, tool, &argc, &argv, &d);
  if (rc) {
    tp_comm_close(comm);
    return rc;
  }
  if (comm->rank != 0) d.stream = NULL; /* process 0 speaks for all (pipe_agree) */
  Trainer t = {.plan = plan, .d = &d, .comm = comm};
  TpComm *device_comm = NULL;
  rc = check_plan(plan, &d);
  if (rc) rc = TP_ERR_INTERNAL;
  else if ((rc = parse_command_line(&t, argc, argv)) < 0) rc = TP_OK; /* --help, --version */
  else if (!rc && !(rc = open_device(&t, &device_comm))) rc = run(&t);
  free_buffers(&t);
  tp_comm_close(device_comm); /* before the device it runs on */
  tp_compute_close(t.compute);
  tp_comm_close(comm);
  return rc;
}
