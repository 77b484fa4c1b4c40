/* Cost model and planner sanity: the fit recovers known coefficients from synthetic
 * samples; every shipped hardware profile loads; slice costs grow with length and
 * context; with batch-only pipelining at B=1 more stages are never predicted faster;
 * the DP's plan is never worse (Eq. 5) than the uniform and batch-only plans.
 * usage: test_cost PROFILE_DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/planner/plan.h"

static int failures;
#define CHECK(cond, ...) \
  do { if (!(cond)) { printf("FAIL: " __VA_ARGS__); printf("\n"); failures++; } } while (0)

static void fit_recovers(void) {
  const double a[4] = {2e-4, 3e-6, 5e-7, 4e-9};
  TpSample s[200];
  int n = 0;
  for (int l = 16; l <= 512; l *= 2)
    for (int c = 0; c <= 1024; c = c ? c * 2 : 32) {
      double t0 = 1e-3 + 2e-5 * l + 1e-8 * l * l; /* some convex t(l,0) */
      double t = t0 + (c ? a[0] + a[1] * l + a[2] * c + a[3] * (double)l * c : 0);
      t *= 1 + 1e-4 * ((n * 7919) % 11 - 5) / 5.0; /* +-0.01% noise */
      s[n++] = (TpSample){2, l, c, t};
    }
  s[n++] = (TpSample){1, 16, 0, 1}; /* another microbatch size: ignored */
  TpFit fit;
  TpDiag d;
  tp_diag_init(&d, "test_cost", NULL, stderr);
  CHECK(tp_fit_samples(s, n, 2, &fit, &d) == TP_OK, "fit failed");
  for (int i = 0; i < 4; i++)
    CHECK(fabs(fit.a[i] - a[i]) < 0.05 * a[i] + 2e-6 * (i == 0), "a%d = %g, want %g", i, fit.a[i], a[i]);
  CHECK(fit.rms_rel_err < 2e-4, "fit error %g", fit.rms_rel_err);
  CHECK(fit.nlen == 6 && fit.len[0] == 16, "lengths %d", fit.nlen);
  printf("fit: a = %.3g %.3g %.3g %.3g, rms error %.2g%%\n", fit.a[0], fit.a[1], fit.a[2], fit.a[3],
         100 * fit.rms_rel_err);
  tp_fit_free(&fit);
  /* too few context samples is an input error */
  tp_diag_init(&d, "test_cost", NULL, NULL);
  CHECK(tp_fit_samples(s, 2, 2, &fit, &d) == TP_ERR_INPUT, "fit of 2 samples accepted");
}

static void model_sanity(const char *dirs) {
  const char *names[] = {"p3.16xlarge", "a100", "h100", "h200", "cpu"};
  TpHardware hw;
  TpDiag d;
  tp_diag_init(&d, "test_cost", NULL, stderr);
  for (int i = 0; i < 5; i++) CHECK(tp_hardware_find(names[i], dirs, &hw, &d) == TP_OK, "profile %s", names[i]);
  tp_hardware_find("p3.16xlarge", dirs, &hw, &d);
  TpModelDesc m;
  tp_model_parse("gpt3-1b", &m, &d);
  static TpCostModel cm;
  tp_cost_model_init(&cm, &hw, &m, 4, 2, 1, &d);
  for (int l = 8; l < 1024; l *= 2)
    for (int c = 0; c < 1024; c += 256) {
      TpTime a = tp_stage_time(&cm, 1, 1, l, c), b = tp_stage_time(&cm, 1, 1, 2 * l, c),
             e = tp_stage_time(&cm, 1, 1, l, c + 256);
      CHECK(b.fwd > a.fwd && b.bwd > a.bwd, "longer slice not dearer at l=%d c=%d", l, c);
      CHECK(e.fwd > a.fwd && e.bwd > a.bwd, "longer context not dearer at l=%d c=%d", l, c);
      CHECK(a.bwd > a.fwd, "backward cheaper than forward at l=%d", l);
    }
  /* batch-only pipelining of one sequence: nothing overlaps, so more stages only add
   * transfers (Eq. 5; the simulated step does get faster: the optimizer step is split) */
  double prev = 0;
  int stages[] = {1, 2, 3, 4, 6, 8, 12, 24};
  for (int i = 0; i < 8; i++) {
    static TpPlanRequest req;
    memset(&req, 0, sizeof req);
    tp_cost_model_init(&req.cm, &hw, &m, stages[i], 1, 1, &d);
    req.batch = 1;
    req.granularity = 64;
    req.max_memory = 1e30;
    TpPlanResult r;
    CHECK(tp_plan(&req, &r, &d) == TP_OK, "plan failed");
    CHECK(r.baseline.eq5_s >= prev, "batch-only B=1 with %d stages (%g s) faster than fewer (%g s)",
          stages[i], r.baseline.eq5_s, prev);
    prev = r.baseline.eq5_s;
    CHECK(r.terapipe.eq5_s <= r.uniform.eq5_s * (1 + 1e-12) && r.uniform.eq5_s <= r.baseline.eq5_s * (1 + 1e-12),
          "S=%d: Eq. 5 of DP %g, uniform %g, baseline %g not ordered", stages[i],
          r.terapipe.eq5_s, r.uniform.eq5_s, r.baseline.eq5_s);
    CHECK(r.fit_rms_rel_err < 0.02, "cost table fit error %g", r.fit_rms_rel_err);
    tp_plan_result_free(&r);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: test_cost PROFILE_DIR\n"); return 2; }
  fit_recovers();
  model_sanity(argv[1]);
  return failures != 0;
}
