/* Cost model and planner sanity: the fit recovers known coefficients from synthetic
 * samples, and calibration from a synthetic profile file each stage's forward and
 * backward coefficients; every shipped hardware profile loads; slice costs grow with length and
 * context; with batch-only pipelining at B=1 more stages are never predicted faster;
 * the DP's plan is never worse (Eq. 5) than the uniform and batch-only plans.
 * usage: test_cost PROFILE_DIR SYNTHETIC_PROFILE.json */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "passes/planner/plan.h"

static void fit_recovers(void) {
  const double a[4] = {2e-4, 3e-6, 5e-7, 4e-9};
  TpSample s[200];
  int n = 0;
  for (int l = 16; l <= 512; l *= 2)
    for (int c = 0; c <= 1024; c = c ? c * 2 : 32) {
      double t0 = 1e-3 + 2e-5 * l + 1e-8 * l * l; /* some convex t(l,0) */
      double t = t0 + (c ? a[0] + a[1] * l + a[2] * c + a[3] * (double)l * c : 0);
      t *= 1 + 1e-4 * ((n * 7919) % 11 - 5) / 5.0; /* +-0.01% noise */
      s[n++] = (TpSample){.b = 2, .l = l, .c = c, .seconds = t};
    }
  s[n++] = (TpSample){.b = 1, .l = 16, .c = 0, .seconds = 1}; /* another microbatch size: ignored */
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
  /* below the shortest measured length a steep line is not extrapolated past zero: a token
   * costs at least what it does there */
  TpFit steep = {.nlen = 2, .len = (int[]){32, 64}, .t0 = (double[]){1, 3}};
  CHECK(fabs(tp_fit_eval(&steep, 8, 0) - 0.25) < 1e-12, "t(8) = %g, want 0.25", tp_fit_eval(&steep, 8, 0));
  CHECK(fabs(tp_fit_eval(&steep, 48, 0) - 2) < 1e-12, "t(48) = %g, want 2", tp_fit_eval(&steep, 48, 0));
}

/* tests/planner/profiles/synth.json: stage k's forward f and backward g are
 * c0 + c1*l + (c > 0: a0 + a1*l + a2*c + a3*l*c) with these coefficients (made by hand). */
static const double synth[2][2][6] = {{{1e-3, 2e-5, 1e-4, 1e-6, 2e-6, 1e-8}, {2e-3, 4e-5, 3e-4, 2e-6, 3e-6, 3e-8}},
                                      {{2e-3, 3e-5, 2e-4, 2e-6, 3e-6, 2e-8}, {4e-3, 6e-5, 4e-4, 3e-6, 5e-6, 4e-8}}};

static void calibration_recovers(const char *path, const char *dirs) {
  TpDiag d;
  tp_diag_init(&d, "test_cost", NULL, stderr);
  TpProfile p;
  TpCalibration cal;
  CHECK(tp_profile_load(path, &p, &d) == TP_OK, "load %s", path);
  if (failures) return;
  CHECK(p.stages == 2 && p.batch == 2 && p.seq == 128 && p.split && p.nsamples == 26 && p.cuts && p.cuts[1] == 2 &&
            p.optimizer && p.optimizer[1] == 0.004,
        "profile fields");
  CHECK(tp_calibrate(&p, path, &cal, &d) == TP_OK && cal.b == 2 && cal.split, "calibrate");
  if (failures) return;
  for (int k = 0; k < 2; k++)
    for (int q = 0; q < 2; q++) {
      const TpFit *f = q ? &cal.bwd[k] : &cal.fwd[k];
      for (int i = 0; i < 4; i++)
        CHECK(fabs(f->a[i] - synth[k][q][2 + i]) < 1e-3 * synth[k][q][2 + i], "stage %d %s a%d = %g, want %g", k,
              q ? "backward" : "forward", i, f->a[i], synth[k][q][2 + i]);
      CHECK(f->max_rel_err < 1e-6, "stage %d fit error %g", k, f->max_rel_err);
    }
  /* the calibrated model prices the profile's microbatch size only, off the grid too */
  TpHardware hw;
  TpModelDesc m;
  static TpCostModel cm;
  tp_hardware_find("cpu", dirs, &hw, &d);
  tp_model_parse("layers=4,hidden=256,heads=4,seq=128,vocab=1000", &m, &d);
  CHECK(tp_cost_model_init(&cm, &hw, &m, 1, 1, 1, &d) == TP_OK, "model");
  CHECK(tp_cost_model_calibrate(&cm, &cal, p.cuts, &d) == TP_OK && cm.nstages == 2 && cm.stage[1].first == 2,
        "calibrate the model");
  for (int k = 0; k < 2; k++) {
    int l = 48, c = 40; /* l between measured lengths: t(l,0) is linear there, as made */
    TpTime t = tp_stage_time(&cm, k, 2, l, c);
    const double *f = synth[k][0], *g = synth[k][1];
    double want_f = f[0] + f[1] * l + f[2] + f[3] * l + f[4] * c + f[5] * l * c;
    double want_g = g[0] + g[1] * l + g[2] + g[3] * l + g[4] * c + g[5] * l * c;
    CHECK(fabs(t.fwd - want_f) < 1e-6 * want_f && fabs(t.bwd - want_g) < 1e-6 * want_g,
          "stage %d t(48, 40) = %g + %g, want %g + %g", k, t.fwd, t.bwd, want_f, want_g);
    CHECK(isinf(tp_stage_time(&cm, k, 1, l, c).fwd), "microbatch size 1 priced without samples");
    CHECK(tp_optimizer_time(&cm, k) == p.optimizer[k], "optimizer of stage %d", k);
  }
  /* a profile with too few context samples is one input error naming the stage */
  tp_calibration_free(&cal);
  p.nsamples = 5;
  tp_diag_init(&d, "test_cost", NULL, NULL);
  CHECK(tp_calibrate(&p, path, &cal, &d) == TP_ERR_INPUT && strstr(d.last, "stage 0 forward"), "few samples: %s",
        d.last);
  tp_profile_free(&p);
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
    CHECK(r.baseline.eq5_s >= prev, "batch-only B=1 with %d stages (%g s) faster than fewer (%g s)", stages[i],
          r.baseline.eq5_s, prev);
    prev = r.baseline.eq5_s;
    CHECK(r.terapipe.eq5_s <= r.uniform.eq5_s * (1 + 1e-12) && r.uniform.eq5_s <= r.baseline.eq5_s * (1 + 1e-12),
          "S=%d: Eq. 5 of DP %g, uniform %g, baseline %g not ordered", stages[i], r.terapipe.eq5_s, r.uniform.eq5_s,
          r.baseline.eq5_s);
    CHECK(r.fit_rms_rel_err < 0.02, "cost table fit error %g", r.fit_rms_rel_err);
    tp_plan_result_free(&r);
  }
}

/* The joint search's memory options: recomputation keeps less (full < selective < none)
 * and costs an extra forward (none < selective < full); under a bound that only
 * recomputation or smaller storage meets, the plan takes them, --zero only with replicas,
 * and only the options the compiler has (caps). */
/* GPT3-1B on p3.16xlarge V100s, 4 stages x `data` replicas. */
static void gpt3_1b(const char *dirs, int data, TpHardware *hw, TpModelDesc *m, TpCostModel *cm) {
  TpDiag d;
  tp_diag_init(&d, "test_cost", NULL, stderr);
  tp_hardware_find("p3.16xlarge", dirs, hw, &d);
  tp_model_parse("gpt3-1b", m, &d);
  tp_cost_model_init(cm, hw, m, 4, 1, data, &d);
}

static void memory_options(const char *dirs) {
  TpHardware hw;
  TpModelDesc m;
  static TpCostModel cm;
  gpt3_1b(dirs, 2, &hw, &m, &cm);
  TpDiag d;
  tp_diag_init(&d, "test_cost", NULL, stderr);
  double kept[3], bwd[3];
  for (int r = 0; r < 3; r++) {
    cm.recompute = (TpRecompute)r;
    kept[r] = tp_microbatch_kept_bytes(&cm, 1, 1, 1);
    bwd[r] = tp_stage_time(&cm, 1, 1, 512, 512).bwd;
  }
  CHECK(kept[2] < kept[1] && kept[1] < kept[0] && kept[2] < kept[0] / 2, "kept none/selective/full %g %g %g",
        kept[0], kept[1], kept[2]);
  CHECK(bwd[0] < bwd[1] && bwd[1] < bwd[2], "backward none/selective/full %g %g %g", bwd[0], bwd[1], bwd[2]);
  cm.recompute = TP_RECOMPUTE_NONE;
  cm.precision = TP_PRECISION_BF16;
  CHECK(tp_microbatch_kept_bytes(&cm, 1, 1, 1) < 0.51 * kept[0], "bf16 does not halve the kept bytes");
  static TpPlanRequest req;
  for (int caps = 0; caps < 2; caps++) {
    memset(&req, 0, sizeof req);
    tp_cost_model_init(&req.cm, &hw, &m, 4, 1, 2, &d);
    req.batch = 8;
    req.granularity = 256;
    req.joint = req.compilable = true;
    req.caps = (TpCompileCaps){caps, caps, caps, true, true, caps, false}; /* zb against gpipe and 1f1b */
    req.max_memory = 12.0 * (1 << 30);
    TpPlanResult r;
    TpDiag quiet;
    tp_diag_init(&quiet, "test_cost", NULL, NULL);
    int rc = tp_plan(&req, &r, &quiet);
    if (!caps) { /* fp32 without recomputation needs more */
      CHECK(rc == TP_ERR_INPUT, "fits in 12 GiB without the options");
      continue;
    }
    CHECK(rc == TP_OK && r.joint.fits, "no plan in 12 GiB with the options: %s", quiet.last);
    if (rc) continue;
    CHECK(r.joint.recompute || r.joint.precision != TP_PRECISION_FP32 || r.joint.zero,
          "the plan takes none of the options");
    /* zb spends less time idle than 1f1b and gpipe: it wins where it fits */
    CHECK(r.joint.schedule == TP_SCHEDULE_ZB, "the joint plan's schedule is %s, not zb (%s, recompute %d, zero %d)",
          tp_schedule_name(r.joint.schedule), tp_precision_name(r.joint.precision), (int)r.joint.recompute,
          (int)r.joint.zero);
    tp_plan_result_free(&r);
  }
}

/* The split of a backward into its input and weight parts: the weight part is the
 * weight-gradient products (with the forward's products' FLOPs: about a third of a layer's
 * backward, a bit less with attention's share); recomputation adds to the input part only. */
static void weight_share(const char *dirs) {
  TpHardware hw;
  TpModelDesc m;
  static TpCostModel cm;
  gpt3_1b(dirs, 1, &hw, &m, &cm);
  TpTime t = tp_stage_time(&cm, 1, 1, 512, 512), first = tp_stage_time(&cm, 0, 1, 512, 512);
  CHECK(t.wgt > 0.25 * t.bwd && t.wgt < 0.5 * t.bwd, "middle stage: weight part %g of backward %g", t.wgt, t.bwd);
  CHECK(first.wgt == first.bwd, "first stage: weight part %g of backward %g (it sends no gradient: all of it)",
        first.wgt, first.bwd);
  cm.recompute = TP_RECOMPUTE_FULL;
  TpTime full = tp_stage_time(&cm, 1, 1, 512, 512);
  CHECK(full.bwd > t.bwd && fabs(full.wgt - t.wgt) < 1e-12 * t.wgt, "recomputation moved the weight part: %g -> %g",
        t.wgt, full.wgt);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: test_cost PROFILE_DIR SYNTHETIC_PROFILE.json\n");
    return 2;
  }
  fit_recovers();
  calibration_recovers(argv[2], argv[1]);
  model_sanity(argv[1]);
  memory_options(argv[1]);
  weight_share(argv[1]);
  return failures != 0;
}
