/* --profile FILE.json: instead of training, every rank times its own stage's units of
 * the plan's profiling probes (plan.h, "Profiling probes"; tokpipec --profile-grid) and
 * one AdamW step of its stage's parameters, and process 0 writes the profile file the
 * planner fits (format: passes/planner/cost.h, above TpSample).
 *
 * The ranks run as in training (mpirun -np S*D, or one process), and all of them profile
 * the same probe at once, a barrier between probes, so that they load the machine as a
 * real run does; the file keeps replica 0's figures. In one process the hosted stages are
 * measured one after the other. The probes are timed in passes over the whole grid, the
 * first a warm-up, until there were MIN_REPEATS timed passes and MIN_SECONDS of timed work
 * per probe on average: this machine's speed drifts within seconds, and a probe timed in one
 * burst would see one moment of it while its neighbours on the grid saw others. Per pass,
 * probe and stage, forward and backward are timed separately (after the setup forwards,
 * untimed); a sample is the medians over the passes. Every pass does the same work, so the
 * spread of their wall times is the machine's drift while profiling: the file's "drift" is
 * their upper quartile / lower quartile - 1 (a single stalled pass does not move it). Expect
 * prediction errors of that order. */
#include "train.h"

#include <errno.h>
#include <inttypes.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../base/atomic.h"

enum { MIN_REPEATS = 5, MAX_PASSES = 100000, OPTIMIZER_REPEATS = 5 };
static const double MIN_SECONDS = 0.25; /* of timed work per probe on average: steady medians on a shared machine */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *x, int n) {
  qsort(x, (size_t)n, sizeof *x, by_value);
  return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

/* The q-quantile of x[0..n-1], sorted, by linear interpolation. */
static double quantile(const double *x, int n, double q) {
  double at = q * (n - 1);
  int i = (int)at;
  return i + 1 < n ? x[i] + (at - i) * (x[i + 1] - x[i]) : x[n - 1];
}

/* A probe's arena is planned for its whole run order (every slice's forward, then every
 * backward), so its probed units alone may read bytes that units not run here would have
 * written, or that the probed backward overwrote: each repetition starts, untimed, from a
 * zeroed arena and transient region and the setup forwards (zeros time like data; stale
 * bits may not). */
static void prepare(const TpPlanProbeStage *ps, TpStepIO *io) {
  const TpComputeBackend *be = io->compute->be;
  be->memset(io->compute, io->stream, io->arena, 0, (size_t)ps->arena_bytes);
  be->memset(io->compute, io->stream, io->transient, 0, (size_t)ps->transient_bytes);
  for (int i = 0; i < ps->nsetup; i++) be->run_unit(io->compute, io->stream, ps->setup[i], io);
  be->stream_sync(io->compute, io->stream);
}

/* A growing list of times, one per pass. */
typedef struct {
  double *x;
  int n, cap;
} Times;

static void append(Times *t, double x) {
  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 16;
    t->x = realloc(t->x, (size_t)t->cap * sizeof *t->x);
    TP_ASSERT(t->x);
  }
  t->x[t->n++] = x;
}

/* One probe's timings on one stage. */
typedef struct {
  Times fwd, bwd;
} ProbeTimes;

/* Stage `stage`'s units of probe pr with io (its parameters, gradients, tokens, and an
 * arena and a transient region large enough), run once; forward and backward times appended to pt unless this is
 * the warm-up (pt NULL). Returns the seconds they took. */
static double time_probe(const TpPlanProbe *pr, int stage, TpStepIO io, ProbeTimes *pt) {
  const TpPlanProbeStage *ps = &pr->stages[stage];
  const TpComputeBackend *be = io.compute->be;
  prepare(ps, &io);
  double t0 = now_s();
  be->run_unit(io.compute, io.stream, ps->forward, &io);
  be->stream_sync(io.compute, io.stream);
  double t1 = now_s();
  be->run_unit(io.compute, io.stream, ps->backward, &io);
  be->stream_sync(io.compute, io.stream);
  double t2 = now_s();
  if (pt) append(&pt->fwd, t1 - t0), append(&pt->bwd, t2 - t1);
  return t2 - t0;
}

/* One AdamW step over the parameters hosted rank h updates in training. */
static double time_optimizer(Trainer *t, int h, TpStepIO io) {
  double x[OPTIMIZER_REPEATS + 1];
  for (int r = 0; r <= OPTIMIZER_REPEATS; r++) { /* the first is the warm-up */
    double t0 = now_s();
    pipe_adamw(t, h, io.stream, pipe_rank_grads(t, h), 1, t->o.lr, 1);
    t->compute->be->stream_sync(t->compute, io.stream);
    x[r] = now_s() - t0;
  }
  return median(x + 1, OPTIMIZER_REPEATS);
}

/* The CPU's model name (/proc/cpuinfo), else "unknown". */
static void device_name(char *buf, size_t n) {
  snprintf(buf, n, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) != 0 || !colon) continue;
    colon += 1 + (colon[1] == ' ');
    colon[strcspn(colon, "\n")] = 0;
    snprintf(buf, n, "%s", colon);
    break;
  }
  fclose(f);
}

/* The profile file (format: passes/planner/cost.h): times[(p * S + k) * 2 + {0, 1}] is
 * stage k's forward and backward of probe p, opt[k] its optimizer step. */
static int write_profile(Trainer *t, const double *times, const double *opt, double drift) {
  const TpPlan *P = t->plan;
  int S = P->nstages;
  char device[256];
  device_name(device, sizeof device);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  TP_ASSERT(f);
  fputs("{\"format\": \"tokpipe-profile\", \"version\": 1,\n \"device\": ", f);
  tp_json_write_string(f, device);
  fprintf(f, ", \"threads\": %d, \"ranks\": %d,\n \"model\": ", omp_get_max_threads(), t->comm->size);
  tp_json_write_string(f, P->model ? P->model : "");
  int64_t params = 0; /* the model's size: tokpipe-plan --calibrate refuses to price another model */
  for (int i = 0; i < P->nparams; i++) params += t->whole_numel[i];
  fprintf(f, ", \"parameters\": %" PRId64 ", \"stages\": %d, ", params, S);
  if (P->stage_cuts) {
    fputs("\"stage_cuts\": [", f);
    for (int k = 0; k < S; k++) fprintf(f, "%s%d", k ? ", " : "", P->stage_cuts[k]);
    fputs("], ", f);
  }
  fprintf(f, "\"batch\": %" PRId64 ", \"seq\": %" PRId64 ",\n \"optimizer\": [", P->batch, P->seq);
  for (int k = 0; k < S; k++) fprintf(f, "%s%.9g", k ? ", " : "", opt[k]);
  fprintf(f, "], \"drift\": %.4f,\n \"samples\": [", drift);
  for (int p = 0; p < P->nprobes; p++)
    for (int k = 0; k < S; k++) {
      const TpPlanProbe *pr = &P->probes[p];
      const double *x = &times[(p * S + k) * 2];
      fprintf(f,
              "%s\n  {\"stage\": %d, \"b\": %" PRId64 ", \"l\": %" PRId64 ", \"c\": %" PRId64
              ", \"forward\": %.9g, \"backward\": %.9g, \"seconds\": %.9g}",
              p || k ? "," : "", k, pr->b, pr->l, pr->c, x[0], x[1], x[0] + x[1]);
    }
  fputs("\n ]}\n", f);
  fclose(f);
  int rc = tp_write_file_atomic(t->o.profile, text, len, t->d);
  free(text);
  return rc;
}

int train_profile(Trainer *t) {
  const TpPlan *P = t->plan;
  int S = P->nstages, rc;
  if ((rc = pipe_agree(t, train_is_root(t) ? tp_check_writable(t->o.profile, "--profile", t->d) : TP_OK))) return rc;
  if ((rc = pipe_agree(t, train_load_weights(t)))) return rc;
  /* token ids spread over the vocabulary (any valid ids time the same) */
  int64_t ids = train_token_limit(P);
  for (int64_t j = 0; j < train_rows(P) * P->seq; j++)
    t->tokens[j] = (j * 7919 + 13) % ids, t->targets[j] = (j * 7919 + 7932) % ids;
  pipe_tokens_to_device(t);
  if (train_is_root(t))
    fprintf(stderr,
            "%s: profiling %d grid point%s x %d stage%s (microbatch of %" PRId64 " row%s, seq %" PRId64
            "); %d rank%s in %d process%s, %d thread%s each\n",
            t->d->tool, P->nprobes, P->nprobes == 1 ? "" : "s", S, S == 1 ? "" : "s", P->batch,
            P->batch == 1 ? "" : "s", P->seq, t->nranks, t->nranks == 1 ? "" : "s", t->comm->size,
            t->comm->size == 1 ? "" : "es", omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s");
  size_t n = (size_t)P->nprobes * (size_t)S * 2 + (size_t)S;
  double *times = calloc(n, sizeof *times), *opt = times + (size_t)P->nprobes * S * 2, start = now_s();
  TP_ASSERT(times);
  int H = t->nhosted, first, passes = 0;
  double timed = 0; /* this process's timed work */
  Times pass = {0}; /* the timed passes' wall times */
  ProbeTimes *pt = calloc((size_t)P->nprobes * (size_t)H, sizeof *pt);
  /* per hosted rank, for its largest probe: arena[h] and transient[h] */
  void **arena = calloc((size_t)H, sizeof *arena), **transient = calloc((size_t)H, sizeof *transient);
  TP_ASSERT(pt && arena && transient);
  for (int h = 0; h < H; h++) {
    int stage, replica;
    pipe_rank_io(t, h, &stage, &replica);
    size_t bytes = 0, transient_bytes = 0;
    for (int p = 0; p < P->nprobes; p++) {
      const TpPlanProbeStage *ps = &P->probes[p].stages[stage];
      if (ps->arena_bytes > bytes) bytes = ps->arena_bytes;
      if (ps->transient_bytes > transient_bytes) transient_bytes = ps->transient_bytes;
    }
    if (!rc && (!(arena[h] = pipe_alloc(t, bytes, "the largest probe's activations on stage %d", stage)) ||
                !(transient[h] = pipe_alloc(t, transient_bytes, "the largest probe's transient region on stage %d",
                                            stage))))
      rc = TP_ERR_INPUT;
  }
  if ((rc = pipe_agree(t, rc))) {
    for (int h = 0; h < H; h++)
      t->compute->be->free(t->compute, arena[h]), t->compute->be->free(t->compute, transient[h]);
    free(arena), free(transient), free(pt), free(times);
    return rc;
  }
  for (int more = 1; more && passes < MAX_PASSES; passes++) {
    double pass_start = now_s();
    for (int p = 0; p < P->nprobes; p++) {
      tp_comm_barrier(t->comm); /* every rank on the same probe */
      for (int h = 0; h < H; h++) {
        int stage, replica;
        TpStepIO io = pipe_rank_io(t, h, &stage, &replica);
        if (replica > 0 && t->comm->size == 1) continue; /* one process: replica 0 is enough */
        ProbeTimes *x = &pt[p * H + h];
        io.arena = arena[h];
        io.transient = transient[h];
        double s = time_probe(&P->probes[p], stage, io, passes ? x : NULL);
        if (passes) timed += s;
      }
    }
    more = passes < MIN_REPEATS || timed < MIN_SECONDS * P->nprobes;
    more = tp_comm_agree(t->comm, more, &first); /* every rank runs the same passes */
    double pass_s = now_s() - pass_start;        /* until the slowest rank is done */
    if (passes) append(&pass, pass_s);
  }
  for (int p = 0; p < P->nprobes; p++)
    for (int h = 0; h < H; h++) {
      int stage, replica;
      ProbeTimes *x = &pt[p * H + h];
      pipe_rank_io(t, h, &stage, &replica);
      if (replica == 0 && x->fwd.n) {
        times[(p * S + stage) * 2] = median(x->fwd.x, x->fwd.n);
        times[(p * S + stage) * 2 + 1] = median(x->bwd.x, x->bwd.n);
      }
      free(x->fwd.x), free(x->bwd.x);
    }
  free(pt);
  for (int h = 0; h < H; h++)
    t->compute->be->free(t->compute, arena[h]), t->compute->be->free(t->compute, transient[h]);
  free(arena), free(transient);
  tp_comm_barrier(t->comm);
  for (int h = 0; h < t->nhosted; h++) {
    int stage, replica;
    TpStepIO io = pipe_rank_io(t, h, &stage, &replica);
    if (replica > 0 && t->comm->size == 1) continue;
    double x = time_optimizer(t, h, io);
    if (replica == 0) opt[stage] = x;
  }
  if (t->comm->size > 1) /* each entry is one rank's, zero elsewhere: the sum gathers them */
    pipe_sum_processes(t, times, n, TP_F64);
  double typical = median(pass.x, pass.n), lower = quantile(pass.x, pass.n, 0.25),
         drift = lower > 0 ? quantile(pass.x, pass.n, 0.75) / lower - 1 : 0;
  free(pass.x);
  rc = train_is_root(t) ? write_profile(t, times, opt, drift) : TP_OK;
  if (!rc && train_is_root(t))
    fprintf(stderr,
            "%s: wrote %s: %d samples in %.1f s; %d timed passes over the grid, %.3g s each (median), "
            "drift %.0f%% (upper / lower quartile - 1)\n",
            t->d->tool, t->o.profile, P->nprobes * S, now_s() - start, pass.n, typical, 100 * drift);
  free(times);
  return pipe_agree(t, rc);
}
