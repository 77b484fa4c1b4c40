/* libFuzzer target for the planner's JSON inputs. The first byte picks the reader, the rest
 * is the document: 'h' a hardware profile (then a layer priced with it), 'p' a trainer's
 * profile (then calibrated: every fit evaluated over the sequence), 't' a cost table (then
 * Eq. 5 solved); any other byte the JSON parser alone. Any bytes must give a result or one
 * diagnostic, never a crash, a hang, a leak or a sanitizer report; what a reader accepts
 * must price finitely. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "passes/planner/cost.h"
#include "passes/planner/slicing.h"

static void price_layer(const TpHardware *hw, TpDiag *d) {
  TpModelDesc m;
  TpCostModel cm;
  if (tp_model_parse("layers=4,hidden=64,heads=4,seq=32,vocab=100", &m, d) ||
      tp_cost_model_init(&cm, hw, &m, 2, 2, 2, d))
    abort();
  TpTime t = tp_stage_time(&cm, 1, 2, 16, 16);
  if (!isfinite(t.fwd + t.bwd + tp_send_time(&cm, 0, 2, 16) + tp_grad_allreduce_time(&cm, 0))) abort();
}

/* Every fit at l, c in {powers of two, the sequence length} with l + c within it. */
static void calibrate(const TpProfile *p, TpDiag *d) {
  TpCalibration cal;
  if (tp_calibrate(p, "fuzz", &cal, d)) return;
  int seq = p->seq ? p->seq : TP_MAX_SEQ, x[32], n = 0;
  for (int v = 1; v < seq; v *= 2) x[n++] = v;
  x[n++] = seq;
  for (int k = 0; k < cal.nstages; k++)
    for (int i = 0; i < n; i++)
      for (int j = -1; j < n; j++) {
        int l = x[i], c = j < 0 ? 0 : x[j];
        if (c > seq - l) continue;
        if (!isfinite(tp_fit_eval(&cal.fwd[k], l, c)) || (cal.split && !isfinite(tp_fit_eval(&cal.bwd[k], l, c))))
          abort();
      }
  tp_calibration_free(&cal);
}

static void solve(const TpSliceCost *t, int stages, TpDiag *d) {
  TpSlicing plan;
  if (tp_solve_slicing(t, t->batch, stages, &plan, d)) return;
  if (!isfinite(plan.time)) abort();
  tp_slicing_free(&plan);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  TpDiag d;
  tp_diag_init(&d, "fuzz_planner_json", NULL, NULL); /* silent */
  char err[256];
  TpJson *j = tp_json_parse((const char *)data + 1, size - 1, err, sizeof err);
  if (!j) return 0;
  if (data[0] == 'h') {
    TpHardware hw;
    if (tp_hardware_from_json(j, "fuzz", &hw, &d) == TP_OK) price_layer(&hw, &d);
  } else if (data[0] == 'p') {
    TpProfile p;
    if (tp_profile_from_json(j, "fuzz", &p, &d) == TP_OK) {
      calibrate(&p, &d);
      tp_profile_free(&p);
    }
  } else if (data[0] == 't') {
    TpSliceCost t;
    int stages;
    if (tp_slice_cost_from_json(j, "fuzz", &t, &stages, &d) == TP_OK) {
      solve(&t, stages, &d);
      tp_slice_cost_free(&t);
    }
  }
  tp_json_free(j);
  return 0;
}
