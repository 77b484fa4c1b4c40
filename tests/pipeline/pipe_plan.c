/* A hand-written ABI 2 plan (what codegen/ generates for pipelines) for tiny2.onnx (see
 * make_tiny2.py), so that the pipeline runtime is tested on its own:
 *
 *   x      = wte[tokens] + wpe + frozen.shift                      stage 0
 *   y_t    = x_t + (x_0 + ... + x_t) / (t + 1)                     stage 0
 *   logits = (y * gain) @ wte^T + head.bias; loss = mean CE        stage 1 (0 if one stage)
 *
 * The prefix mean plays attention's part: slice i reads the x rows of every earlier slice
 * of its microbatch (kept in the arena like K/V), and its backward adds into their
 * gradient rows (dx, like dK/dV), so slices run forward in order and backward in reverse.
 * wte is used by both stages (tied), so with two stages it lives on both.
 *
 * Being a test, the plan's shape comes from the environment when it starts:
 *   PIPE_STAGES 1|2, PIPE_MICROBATCHES M, PIPE_DP D, PIPE_SLICES "8" | "5,3" | ...,
 *   PIPE_SCHEDULE gpipe|1f1b
 * and the schedule lists are built by the compiler's planner (passes/planner/schedule.h),
 * then frozen into the plan as a generated plan has them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/planner/schedule.h"
#include "runtime/train/plan.h"
#ifdef TEST_CUDA_DEVICE /* tests/cuda's pipe_trainer_cuda: the same plan on the CUDA backend */
#include "../cuda/test_device.h"
#endif

enum { B = 4, T = 8, V = 256, C = 8, MAX_SLICES = 4 };
enum { WTE, WPE, SHIFT, GAIN, BIAS, NPARAMS };

typedef struct {
  float x[B][T][C];   /* stage 0: the embedded rows, read by later slices */
  float y0[B][T][C];  /* stage 0's output, sent */
  float dy0[B][T][C]; /* its gradient, received */
  float dx[B][T][C];  /* summed over the slices in reverse */
  float y1[B][T][C];  /* stage 1's input, received */
  float z[B][T][C];
  float logits[B][T][V];
  float dy1[B][T][C]; /* sent back */
  double loss_sum;
} Arena;

static int nstages = 2, nslices = 1, rows; /* rows: of a microbatch */
static int64_t slice_len[MAX_SLICES], slice_at[MAX_SLICES];

#define A(io) ((Arena *)(io)->arena)

static void forward0(TpStepIO *io, int i) {
  Arena *a = A(io);
  float *const *p = io->param;
  for (int b = 0; b < rows; b++)
    for (int64_t t = slice_at[i]; t < slice_at[i] + slice_len[i]; t++) {
      int64_t tok = io->tokens[b * T + t];
      for (int c = 0; c < C; c++) a->x[b][t][c] = p[WTE][tok * C + c] + p[WPE][t * C + c] + p[SHIFT][c];
      for (int c = 0; c < C; c++) {
        float sum = 0;
        for (int64_t s = 0; s <= t; s++) sum += a->x[b][s][c];
        a->y0[b][t][c] = a->x[b][t][c] + sum / (float)(t + 1);
      }
    }
}

static void forward1(TpStepIO *io, int i) {
  Arena *a = A(io);
  float *const *p = io->param;
  if (i == 0) a->loss_sum = 0;
  for (int64_t t = slice_at[i]; t < slice_at[i] + slice_len[i]; t++)
    for (int b = 0; b < rows; b++) {
      float *z = a->z[b][t], *l = a->logits[b][t], max = -INFINITY;
      for (int c = 0; c < C; c++) z[c] = a->y1[b][t][c] * p[GAIN][c];
      for (int v = 0; v < V; v++) {
        float s = p[BIAS][v];
        for (int c = 0; c < C; c++) s += z[c] * p[WTE][v * C + c];
        l[v] = s;
        if (s > max) max = s;
      }
      double e = 0;
      for (int v = 0; v < V; v++) e += exp((double)(l[v] - max));
      a->loss_sum += max + log(e) - l[io->targets[b * T + t]];
    }
  if (i == nslices - 1) io->loss = (float)(a->loss_sum / (rows * T));
}

static void backward1(TpStepIO *io, int i) {
  Arena *a = A(io);
  float *const *p = io->param, *const *g = io->grad;
  for (int64_t t = slice_at[i]; t < slice_at[i] + slice_len[i]; t++)
    for (int b = 0; b < rows; b++) {
      const float *l = a->logits[b][t], *z = a->z[b][t];
      float max = -INFINITY, dz[C] = {0};
      for (int v = 0; v < V; v++) max = l[v] > max ? l[v] : max;
      double e = 0;
      for (int v = 0; v < V; v++) e += exp((double)(l[v] - max));
      for (int v = 0; v < V; v++) {
        float d = (float)(exp((double)(l[v] - max)) / e) - (v == io->targets[b * T + t]);
        d /= (float)(rows * T);
        g[BIAS][v] += d;
        for (int c = 0; c < C; c++) {
          g[WTE][v * C + c] += d * z[c];
          dz[c] += d * p[WTE][v * C + c];
        }
      }
      for (int c = 0; c < C; c++) {
        g[GAIN][c] += dz[c] * a->y1[b][t][c];
        a->dy1[b][t][c] = dz[c] * p[GAIN][c];
      }
    }
}

static void backward0(TpStepIO *io, int i) {
  Arena *a = A(io);
  float *const *g = io->grad;
  if (i == nslices - 1) memset(a->dx, 0, sizeof a->dx);
  int64_t lo = slice_at[i], hi = slice_at[i] + slice_len[i];
  for (int b = 0; b < rows; b++)
    for (int64_t t = hi - 1; t >= lo; t--)
      for (int c = 0; c < C; c++) {
        float d = a->dy0[b][t][c];
        a->dx[b][t][c] += d;
        for (int64_t s = 0; s <= t; s++) a->dx[b][s][c] += d / (float)(t + 1);
      }
  /* rows [lo, hi) are complete: every later slice has added its part */
  for (int b = 0; b < rows; b++)
    for (int64_t t = lo; t < hi; t++) {
      int64_t tok = io->tokens[b * T + t];
      for (int c = 0; c < C; c++) {
        g[WTE][tok * C + c] += a->dx[b][t][c];
        g[WPE][t * C + c] += a->dx[b][t][c];
      }
    }
}

/* One stage doing both: the boundary copies instead of messages. */
static void copy_rows(float (*to)[T][C], float (*from)[T][C], int i) {
  for (int b = 0; b < rows; b++) memcpy(to[b][slice_at[i]], from[b][slice_at[i]], sizeof(float) * C * slice_len[i]);
}
static void forward_all(TpStepIO *io, int i) {
  forward0(io, i);
  copy_rows(A(io)->y1, A(io)->y0, i);
  forward1(io, i);
}
static void backward_all(TpStepIO *io, int i) {
  backward1(io, i);
  copy_rows(A(io)->dy0, A(io)->dy1, i);
  backward0(io, i);
}

/* The unit functions per slice: a generated plan has one function per (stage, slice). */
#define UNITS(fn)                                                                                                   \
  static void fn##_0(TpStepIO *io) { fn(io, 0); }                                                                   \
  static void fn##_1(TpStepIO *io) { fn(io, 1); }                                                                   \
  static void fn##_2(TpStepIO *io) { fn(io, 2); }                                                                   \
  static void fn##_3(TpStepIO *io) { fn(io, 3); }                                                                   \
  static const TpUnitFn fn##_units[MAX_SLICES] = {fn##_0, fn##_1, fn##_2, fn##_3};
UNITS(forward0)
UNITS(forward1)
UNITS(backward0)
UNITS(backward1)
UNITS(forward_all)
UNITS(backward_all)

/* ---- the plan's tables, filled from the environment ---- */

static TpPlanParam params[NPARAMS] = {
    {"wte", "wte", 2, {V, C}, 1, 0, 0, {0, 0, 0}},
    {"wpe", "wpe", 2, {T, C}, 1, 0, 0, {0, 0, 0}},
    {"frozen.shift", "frozen.shift", 1, {C}, 0, 0, 0, {0, 0, 0}},
    {"gain", "gain", 1, {C}, 1, 0, 0, {0, 0, 0}},
    {"head.bias", "shared.bias", 1, {V}, 1, 0, 0, {0, 0, 0}},
};
static const TpPlanDerived derived[] = {{"head.weight_t", WTE, 1}};
static TpPlanBuffer buffers[4][MAX_SLICES][B]; /* y0, y1, dy1, dy0 rows of each slice */
static TpPlanMessage messages[4][MAX_SLICES];
static TpPlanStage stages[2];
static TpPlan plan = {
    .abi = TP_PLAN_ABI,
    .model = TINY2_MODEL,
    .tokpipec_version = "hand-written",
    .seq = T,
    .vocab = V,
    .nparams = NPARAMS,
    .params = params,
    .nderived = 1,
    .derived = derived,
};

static int env_int(const char *name, int fallback) {
  const char *s = getenv(name);
  return s && *s ? atoi(s) : fallback;
}

/* Message k (y0, y1, dy1, dy0) of slice i: the slice's rows of each batch row. */
static const TpPlanMessage *rows_of(int k, size_t field) {
  for (int i = 0; i < nslices; i++) {
    for (int b = 0; b < rows; b++)
      buffers[k][i][b] = (TpPlanBuffer){(int64_t)(field + ((size_t)b * T + (size_t)slice_at[i]) * C * sizeof(float)),
                                        (int64_t)(slice_len[i] * C * sizeof(float))};
    messages[k][i] = (TpPlanMessage){rows, buffers[k][i]};
  }
  return messages[k];
}

static int configure(void) {
  nstages = env_int("PIPE_STAGES", 2);
  int M = env_int("PIPE_MICROBATCHES", 1), D = env_int("PIPE_DP", 1);
  const char *sl = getenv("PIPE_SLICES"), *sched = getenv("PIPE_SCHEDULE");
  TpScheduleKind kind = TP_SCHEDULE_GPIPE;
  if (sched && !tp_schedule_parse(sched, &kind)) return fprintf(stderr, "bad PIPE_SCHEDULE\n"), 1;
  nslices = 0;
  int64_t at = 0;
  for (const char *s = sl && *sl ? sl : "8"; *s && nslices < MAX_SLICES; s += *s == ',') {
    char *end;
    slice_len[nslices] = strtol(s, &end, 10);
    slice_at[nslices++] = at;
    at += slice_len[nslices - 1];
    s = end;
  }
  if ((nstages != 1 && nstages != 2) || M < 1 || D < 1 || B % (M * D) || at != T)
    return fprintf(stderr, "bad pipeline configuration\n"), 1;
  rows = B / (M * D);
  params[GAIN].stage = params[BIAS].stage = nstages - 1;
  params[WTE].tied_stage = nstages - 1;

  int per_mb[64];
  for (int m = 0; m < M; m++) per_mb[m] = nslices;
  TpSchedule s;
  TpScheduleSpec spec = {kind, nstages, M, per_mb, D > 1, nstages > 1, 0};
  tp_schedule_build(&spec, &s);
  TpDiag d;
  tp_diag_init(&d, "pipe_plan", NULL, stderr);
  if (tp_schedule_verify(&s, false, &d)) return 1;
  for (int k = 0; k < nstages; k++) {
    TpPlanInsn *insns = calloc((size_t)s.count[k], sizeof *insns);
    for (int j = 0; j < s.count[k]; j++)
      insns[j] = (TpPlanInsn){(int)s.insn[k][j].kind, s.insn[k][j].mb, s.insn[k][j].slice, s.insn[k][j].peer,
                              s.insn[k][j].chunk};
    bool last = k == nstages - 1;
    stages[k] = (TpPlanStage){.forward = nstages == 1 ? forward_all_units
                                         : last       ? forward1_units
                                                      : forward0_units,
                              .backward = nstages == 1 ? backward_all_units
                                          : last       ? backward1_units
                                                       : backward0_units,
                              .arena_bytes = sizeof(Arena),
                              .arenas = M,
                              .ninsns = s.count[k],
                              .insns = insns};
  }
  if (nstages == 2) {
    stages[0].send_act = rows_of(0, offsetof(Arena, y0));
    stages[1].recv_act = rows_of(1, offsetof(Arena, y1));
    stages[1].send_grad = rows_of(2, offsetof(Arena, dy1));
    stages[0].recv_grad = rows_of(3, offsetof(Arena, dy0));
  }
  tp_schedule_free(&s);
  plan.batch = rows;
  plan.global_batch = B;
  plan.microbatches = M;
  plan.dp = D;
  plan.nstages = nstages;
  plan.nslices = nslices;
  plan.slice_len = slice_len;
  plan.schedule = kind == TP_SCHEDULE_1F1B ? TP_PLAN_1F1B : TP_PLAN_GPIPE;
  plan.stages = stages;
#ifdef TEST_CUDA_DEVICE
  plan.device = test_device();
#endif
  return 0;
}

int main(int argc, char **argv) {
  if (configure()) return 2;
  return tp_trainer_main(&plan, argc, argv);
}
