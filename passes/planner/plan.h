/* The planner's search: from a model, a cluster and a parallel layout to a plan.
 *
 * 1. The DP's cost table t(b, s, c) from the cost model: the slowest stage's forward +
 *    backward plus two transfers (activation out, gradient back), t(l,0) exact per
 *    length and t_ctx fitted (the fit error is reported).
 * 2. TeraPipe's plan: the exact Eq. 5 optimum (slicing.h) under the GPipe schedule with
 *    equal stage cuts; the paper's baseline (batch-only microbatching, best equal
 *    microbatch size) and the best uniform slicing, all priced by the event simulation.
 * 3. The joint search: schedule (gpipe, 1f1b) x stage cuts (equal, compute-balanced with
 *    embedding and head) x activation recomputation x candidate slicings (the Eq. 5
 *    optimum overall and per microbatch size, the best uniform ones), each simulated;
 *    the fastest whose every rank fits the memory bound wins.
 * Calibrated (cm.cal): only the profiled microbatch size is priced, the stage cuts are the
 * profile's and recomputation (never measured) is not searched. */
#ifndef TOKPIPE_PLANNER_PLAN_H
#define TOKPIPE_PLANNER_PLAN_H

#include "cost.h"
#include "schedule.h"
#include "simulate.h"
#include "slicing.h"

typedef struct {
  TpCostModel cm;           /* layout, equal stage cuts */
  int batch;                /* sequences per pipeline replica per step */
  int granularity;          /* slice lengths are multiples of this */
  TpScheduleKind schedule;  /* the schedule of TeraPipe's plan and the baselines */
  double max_memory;        /* bytes per device */
  bool joint;               /* also run the joint search */
  bool untied;              /* the LM head does not share the embedding (no allreduce-tied) */
} TpPlanRequest;

typedef struct {
  TpSlicing slicing;
  TpScheduleKind schedule;
  bool recompute, balanced_cuts;
  int cuts[TP_MAX_STAGES];
  double eq5_s;             /* the paper's estimate of this plan (its own DP table) */
  double time_s;            /* simulated iteration time */
  double peak_bytes[TP_MAX_STAGES];
  double max_peak_bytes;
  bool fits;
} TpPlanEval;

typedef struct {
  TpPlanEval terapipe, baseline, uniform, joint;
  bool has_joint;
  double fit_rms_rel_err, fit_max_rel_err;
  double solve_s;           /* wall time of the DP */
  int evaluations;          /* DP runs */
} TpPlanResult;

/* Simulated plans hold at most this many (unit, stage) pairs: memory and time grow with
 * them. tp_plan refuses a search whose candidates could be larger. */
#define TP_PLAN_MAX_UNIT_STAGES (1 << 21)
/* An input error if `units` (slices of all microbatches) on `stages` exceed that. */
int tp_plan_check_units(int64_t units, int stages, TpDiag *d);

int tp_plan(const TpPlanRequest *req, TpPlanResult *out, TpDiag *d);
void tp_plan_result_free(TpPlanResult *r);

/* The DP table for cm (its stage cuts): see 1. above. */
void tp_model_slice_cost(const TpCostModel *cm, int batch, int granularity, TpSliceCost *t,
                         double *rms_rel_err, double *max_rel_err);

/* Simulates one plan (with events if `record`); schedule returned in *sched. */
int tp_plan_simulate(const TpPlanRequest *req, const TpPlanEval *e, bool record,
                     TpSchedule *sched, TpSimResult *r, TpDiag *d);

#endif
