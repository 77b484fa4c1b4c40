/* The planner's search: from a model, a cluster and a parallel layout to a plan.
 *
 * 1. The DP's cost table t(b, s, c) from the cost model: the slowest stage's forward +
 *    backward plus two transfers (activation out, gradient back), t(l,0) exact per
 *    length and t_ctx fitted (the fit error is reported).
 * 2. TeraPipe's plan: the exact Eq. 5 optimum (slicing.h) under the GPipe schedule with
 *    equal stage cuts; the paper's baseline (batch-only microbatching, best equal
 *    microbatch size) and the best uniform slicing, all priced by the event simulation.
 * 3. The joint search: schedule (gpipe, 1f1b, zb, and interleaved with 2 to layers / pipeline
 *    chunks per rank when there are 2 ranks or more) x stage cuts (equal, compute-balanced
 *    with embedding and head; interleaved: over its virtual stages) x activation
 *    recomputation (none, selective, full) x candidate
 *    slicings (the Eq. 5 optimum overall and per microbatch size, the best uniform ones),
 *    each simulated; the fastest whose every rank fits the memory bound wins (with
 *    `compilable`, among the plans tokpipec compiles as they are). Each gets the first
 *    storage that fits of fp32, fp32 with the optimizer state sharded over the replicas
 *    (--zero 1), bf16, bf16 sharded: they change its memory, not its time (compute is
 *    priced in the hardware profile's dtype).
 * Calibrated (cm.cal): only the profiled microbatch size is priced, the stage cuts are the
 * profile's and recomputation (never measured) and interleaving (other stages than the
 * measured ones) are not searched. */
#ifndef TOKPIPE_PLANNER_PLAN_H
#define TOKPIPE_PLANNER_PLAN_H

#include "cost.h"
#include "schedule.h"
#include "simulate.h"
#include "slicing.h"

/* What tokpipec compiles besides the plain fp32 trainer: the joint search tries only
 * these options (with TpPlanRequest.compilable). */
typedef struct {
  bool bf16;      /* --precision bf16 (the target's) */
  bool zero;      /* --zero 1 (with --dp > 1) */
  bool recompute; /* --recompute selective|full */
  /* and how its memory plan counts (codegen/memory.c): */
  bool vocab_pad;        /* --tensor pads the vocabulary to a multiple of the ranks and splits it */
  bool transient_region; /* a rank holds one transient region for its units' working sets */
  bool zb;               /* --schedule zb (split backwards) */
  bool interleaved;      /* --schedule interleaved --chunks V */
} TpCompileCaps;

typedef struct {
  TpCostModel cm;          /* layout, equal stage cuts */
  int batch;               /* sequences per pipeline replica per step */
  int granularity;         /* slice lengths are multiples of this */
  TpScheduleKind schedule; /* the schedule of TeraPipe's plan and the baselines */
  int chunks;              /* with schedule interleaved: its virtual stages per rank */
  double max_memory;       /* bytes per device */
  bool joint;              /* also run the joint search */
  bool untied;             /* the LM head does not share the embedding (no allreduce-tied) */
  bool compilable;         /* the joint search keeps only plans tokpipec compiles as they are:
                               equal microbatches sliced alike, and only the options of caps */
  TpCompileCaps caps;      /* with compilable: the options tokpipec has */
} TpPlanRequest;

typedef struct {
  TpSlicing slicing;
  TpScheduleKind schedule;
  int chunks; /* interleaved: virtual stages per rank, cuts holds pipeline x chunks of them; else 1 */
  TpRecompute recompute;
  TpPrecision precision;
  bool zero; /* the optimizer state sharded over the data-parallel replicas */
  bool balanced_cuts;
  int cuts[TP_MAX_STAGES];
  double eq5_s;  /* the paper's estimate of this plan (its own DP table) */
  double time_s; /* simulated iteration time */
  double peak_bytes[TP_MAX_STAGES];
  TpRankMemory memory[TP_MAX_STAGES]; /* what each peak adds up */
  double max_peak_bytes;
  bool fits;
} TpPlanEval;

typedef struct {
  TpPlanEval terapipe, baseline, uniform, joint;
  bool has_joint;
  double fit_rms_rel_err, fit_max_rel_err;
  double solve_s;  /* wall time of the DP */
  int evaluations; /* DP runs */
} TpPlanResult;

/* Simulated plans hold at most this many (unit, stage) pairs: memory and time grow with
 * them. tp_plan refuses a search whose candidates could be larger. */
#define TP_PLAN_MAX_UNIT_STAGES (1 << 21)
/* An input error if `units` (slices of all microbatches) on `stages` exceed that. */
int tp_plan_check_units(int64_t units, int stages, TpDiag *d);

int tp_plan(const TpPlanRequest *req, TpPlanResult *out, TpDiag *d);
void tp_plan_result_free(TpPlanResult *r);

/* Does tokpipec compile this slicing as it is (--microbatches M --slices L1,..: M equal
 * microbatches, every one cut into the same lengths)? */
bool tp_slicing_compiles(const TpSlicing *s);

/* 4. The search over layouts: every (pipeline S, tensor N, data D) with S x N x D = gpus,
 * S dividing the layers (equal cuts to start from), N dividing the heads and the ffn
 * width, D dividing the global batch; a degree given (> 0) stays fixed. Each layout gets
 * tp_plan's joint search (base's hardware, model, granularity, schedule, memory bound);
 * the fastest layout whose joint plan fits wins. */
typedef struct {
  int pipeline, tensor, data;
  bool fits;             /* a plan of this layout fits the memory bound */
  double time_s;         /* its joint plan's simulated iteration time (INFINITY: none) */
  double terapipe_s;     /* TeraPipe's plan (gpipe, equal cuts) on it */
  double max_peak_bytes; /* of the joint plan (0 when it has none) */
  char why[200];         /* why it has no plan, when it has none */
} TpLayoutEval;

typedef struct {
  TpLayoutEval *layouts;
  int n;
  int best;            /* index of the winner, -1 when no layout fits */
  TpPlanRequest req;   /* the winner's request (its layout, batch per replica) */
  TpPlanResult result; /* and its search */
} TpLayoutSearch;

/* `base` carries the hardware, model and options (its layout is ignored); global_batch is
 * split over the D replicas. No layout at all (the degrees cannot multiply to gpus) or
 * none that fits is an input error naming the closest. */
int tp_plan_layouts(const TpPlanRequest *base, int gpus, int pipeline, int tensor, int data, int global_batch,
                    TpLayoutSearch *out, TpDiag *d);
void tp_layout_search_free(TpLayoutSearch *s);

/* The DP table for cm (its stage cuts): see 1. above. */
void tp_model_slice_cost(const TpCostModel *cm, int batch, int granularity, TpSliceCost *t, double *rms_rel_err,
                         double *max_rel_err);

/* Simulates one plan (with events if `record`); schedule returned in *sched. */
int tp_plan_simulate(const TpPlanRequest *req, const TpPlanEval *e, bool record, TpSchedule *sched, TpSimResult *r,
                     TpDiag *d);

#endif
