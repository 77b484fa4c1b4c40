#include "plan.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The DP's t(b, l, c): the slowest stage plus the activation out and its gradient back
 * over the slowest boundary. */
static double slice_seconds(const TpCostModel *cm, int b, int l, int c) {
  int S = cm->nstages;
  double worst = 0, send = 0;
  int kinds[3] = {0, S / 2, S - 1}; /* analytic: the middle stages are alike */
  for (int i = 0; i < (cm->cal ? S : 3); i++) {
    TpTime t = tp_stage_time(cm, cm->cal ? i : kinds[i], b, l, c);
    if (t.fwd + t.bwd > worst) worst = t.fwd + t.bwd;
  }
  for (int k = 0; k + 1 < S; k++) {
    double x = tp_send_time(cm, k, b, l);
    if (x > send) send = x;
  }
  return worst + 2 * send;
}

void tp_model_slice_cost(const TpCostModel *cm, int batch, int g, TpSliceCost *t, double *rms_rel_err,
                         double *max_rel_err) {
  int n = cm->model.seq / g;
  tp_slice_cost_init(t, TP_COST_SEPARABLE, batch, n, g);
  /* contexts and lengths on a geometric grid (in units) for the t_ctx fit */
  int grid[64], ng = 0;
  for (double x = 1; x <= n && ng < 60; x *= 1.6)
    if (!ng || (int)x != grid[ng - 1]) grid[ng++] = (int)x;
  if (grid[ng - 1] != n) grid[ng++] = n;
  TpSample *samples = malloc(sizeof(TpSample) * (size_t)(ng * (ng + 1) + 1));
  *rms_rel_err = *max_rel_err = 0;
  TpDiag quiet;
  tp_diag_init(&quiet, "tokpipe-plan", NULL, NULL);
  for (int b = 1; b <= batch; b++) {
    if (cm->microbatch_rows && b != cm->microbatch_rows) continue; /* cannot run: stays INFINITY */
    for (int s = 1; s <= n; s++) t->t0[(long)b * (n + 1) + s] = slice_seconds(cm, b, s * g, 0);
    int ns = 0;
    for (int i = 0; i < ng; i++)
      for (int j = -1; j < ng; j++) {
        int s = grid[i], c = j < 0 ? 0 : grid[j];
        if (s + c > n) continue;
        samples[ns++] = (TpSample){.b = b, .l = s * g, .c = c * g, .seconds = slice_seconds(cm, b, s * g, c * g)};
      }
    TpFit fit;
    if (tp_fit_samples(samples, ns, b, &fit, &quiet) == TP_OK) {
      double *a = &t->ctx[b * 4];
      a[0] = fit.a[0];
      a[1] = fit.a[1] * g;
      a[2] = fit.a[2] * g;
      a[3] = fit.a[3] * g * g;
      if (fit.rms_rel_err > *rms_rel_err) *rms_rel_err = fit.rms_rel_err;
      if (fit.max_rel_err > *max_rel_err) *max_rel_err = fit.max_rel_err;
      tp_fit_free(&fit);
    } /* else too few lengths (n tiny): t_ctx stays 0 */
  }
  free(samples);
  TpDiag d;
  tp_diag_init(&d, "tokpipe-plan", NULL, NULL);
  tp_slice_cost_finish(t, &d);
}

/* Stage cuts minimising the largest stage's compute (embedding on the first, head on the
 * last), each stage at least one layer: the linear-partition DP. */
static void balanced_cuts(const TpCostModel *cm, int *cuts) {
  int S = cm->nstages, L = cm->model.layers, seq = cm->model.seq;
  TpTime layer = tp_layer_time(cm, 1, seq, 0);
  TpCostModel edges = *cm;
  edges.stage[0].layers = 0;
  edges.stage[S - 1].layers = 0;
  TpTime e0 = tp_stage_time(&edges, 0, 1, seq, 0), e1 = tp_stage_time(&edges, S - 1, 1, seq, 0);
  double w = layer.fwd + layer.bwd, first = S > 1 ? e0.fwd + e0.bwd : 0, last = e1.fwd + e1.bwd;
  if (S == 1) first = 0; /* one stage holds both edges: e1 already counts them */
  double *best = malloc(sizeof(double) * (size_t)(S + 1) * (L + 1));
  int *from = malloc(sizeof(int) * (size_t)(S + 1) * (L + 1));
  for (int i = 0; i <= (S + 1) * (L + 1) - 1; i++) best[i] = INFINITY;
  best[0] = 0;
  for (int k = 1; k <= S; k++)
    for (int j = k; j <= L - (S - k); j++)
      for (int i = k - 1; i < j; i++) {
        double cost = (j - i) * w + (k == 1 ? first : 0) + (k == S ? last : 0);
        double v = best[(k - 1) * (L + 1) + i];
        if (cost > v) v = cost;
        if (v < best[k * (L + 1) + j]) {
          best[k * (L + 1) + j] = v;
          from[k * (L + 1) + j] = i;
        }
      }
  for (int k = S, j = L; k >= 1; k--) {
    j = from[k * (L + 1) + j];
    cuts[k - 1] = j;
  }
  free(best);
  free(from);
}

static void evaluate_plan(const TpPlanRequest *req, const TpSliceCost *table, TpPlanEval *e) {
  TpSchedule sched;
  TpSimResult r;
  TpDiag d;
  tp_diag_init(&d, "tokpipe-plan", NULL, stderr);
  tp_slicing_eval(table, req->cm.nstages, &e->slicing);
  e->eq5_s = e->slicing.time;
  int rc = tp_plan_simulate(req, e, false, &sched, &r, &d);
  TP_ASSERT(rc == TP_OK); /* the built schedules never deadlock (tests check it) */
  e->time_s = r.time_s;
  e->max_peak_bytes = 0;
  for (int k = 0; k < req->cm.nstages; k++) {
    e->peak_bytes[k] = r.peak_bytes[k];
    e->memory[k] = r.memory[k];
    if (r.peak_bytes[k] > e->max_peak_bytes) e->max_peak_bytes = r.peak_bytes[k];
  }
  e->fits = e->max_peak_bytes <= req->max_memory;
  tp_sim_result_free(&r);
  tp_schedule_free(&sched);
}

/* Prices e in the first storage that fits of fp32, fp32 --zero 1, bf16, bf16 --zero 1 (of
 * those caps allows; zero only with replicas to shard over), else in the smallest. The
 * time does not depend on it, so the plain one wins a tie. */
static void evaluate_storage(const TpPlanRequest *req, const TpCompileCaps *caps, const TpSliceCost *table,
                             TpPlanEval *e) {
  TpPlanEval *best = NULL, *trial = malloc(sizeof *trial);
  TP_ASSERT(trial);
  for (int option = 0; option < 4; option++) {
    bool bf16 = option >= 2, zero = option % 2;
    if ((bf16 && !caps->bf16) || (zero && (!caps->zero || req->cm.data <= 1))) continue;
    *trial = *e;
    trial->precision = bf16 ? TP_PRECISION_BF16 : TP_PRECISION_FP32;
    trial->zero = zero;
    evaluate_plan(req, table, trial);
    if (!best || (trial->fits && !best->fits) || (!best->fits && trial->max_peak_bytes < best->max_peak_bytes)) {
      if (!best) best = malloc(sizeof *best);
      TP_ASSERT(best);
      *best = *trial;
    }
    if (best->fits) break;
  }
  *e = *best; /* the slicing is e's own: the trials share it */
  free(best);
  free(trial);
}

int tp_plan_check_units(int64_t units, int stages, TpDiag *d) {
  if (units * stages > TP_PLAN_MAX_UNIT_STAGES)
    return tp_error(d, "%lld units (microbatch slices) x %d stages = %lld, more than the simulation takes (%d)",
                    (long long)units, stages, (long long)units * stages, TP_PLAN_MAX_UNIT_STAGES);
  return TP_OK;
}

int tp_plan_simulate(const TpPlanRequest *req, const TpPlanEval *e, bool record, TpSchedule *sched, TpSimResult *r,
                     TpDiag *d) {
  memset(sched, 0, sizeof *sched);
  memset(r, 0, sizeof *r);
  int64_t units = 0;
  for (int m = 0; m < e->slicing.n; m++) units += e->slicing.mb[m].nslices;
  int chunks = e->chunks > 1 ? e->chunks : 1, rc = tp_plan_check_units(units, req->cm.nstages * chunks, d);
  if (rc) return rc;
  TpCostModel *cm = malloc(sizeof *cm);
  *cm = req->cm;
  cm->recompute = e->recompute;
  cm->precision = e->precision;
  cm->zero = e->zero;
  cm->split_backward = e->schedule == TP_SCHEDULE_ZB;
  rc = tp_cost_model_set_chunks(cm, chunks, d);
  int *nslices = malloc(sizeof(int) * (size_t)e->slicing.n);
  for (int m = 0; m < e->slicing.n; m++) nslices[m] = e->slicing.mb[m].nslices;
  TpScheduleSpec spec = {e->schedule, req->cm.nstages, e->slicing.n, nslices, cm->data > 1, !req->untied, chunks};
  if (!rc) rc = tp_schedule_check_spec(&spec, d);
  if (rc) {
    free(nslices);
    free(cm);
    return rc;
  }
  tp_cost_model_set_cuts(cm, e->cuts);
  tp_schedule_build(&spec, sched);
  TpSimCosts costs;
  tp_sim_costs_from_model(cm, &e->slicing, &costs);
  rc = tp_simulate(sched, &costs, record, r, d);
  tp_sim_costs_free(&costs);
  free(nslices);
  free(cm);
  return rc;
}

/* The cuts of cm's pipeline x chunks virtual stages: as even as the layers allow, or
 * compute-balanced. cm's chunks must be possible (tp_cost_model_set_chunks). */
static void virtual_cuts(const TpCostModel *cm, int chunks, bool balanced, int *cuts) {
  TpCostModel *v = malloc(sizeof *v);
  *v = *cm;
  TpDiag quiet;
  tp_diag_init(&quiet, "tokpipe-plan", NULL, NULL);
  TP_ASSERT(tp_cost_model_set_chunks(v, chunks, &quiet) == TP_OK);
  if (balanced) balanced_cuts(v, cuts);
  else
    for (int j = 0; j < v->nstages; j++) cuts[j] = v->stage[j].first;
  free(v);
}

/* A plan of schedule `sched` (interleaved: `chunks` per rank) on req's cuts (interleaved:
 * even virtual ones). */
static void init_eval(const TpPlanRequest *req, TpPlanEval *e, TpScheduleKind sched, int chunks) {
  memset(e, 0, sizeof *e);
  e->schedule = sched;
  e->chunks = sched == TP_SCHEDULE_INTERLEAVED ? chunks : 1;
  e->recompute = req->cm.recompute;
  e->precision = req->cm.precision;
  e->zero = req->cm.zero;
  if (e->chunks > 1) virtual_cuts(&req->cm, e->chunks, false, e->cuts);
  else
    for (int k = 0; k < req->cm.nstages; k++) e->cuts[k] = req->cm.stage[k].first;
}

/* Keeps the better of *best and *cand (fitting and faster; when neither fits, the
 * smaller); frees the other. */
static void keep_better(TpPlanEval *best, TpPlanEval *cand) {
  bool better = !best->slicing.mb || (cand->fits && !best->fits) ||
                (cand->fits && best->fits && cand->time_s < best->time_s) ||
                (!cand->fits && !best->fits && cand->max_peak_bytes < best->max_peak_bytes);
  if (better) {
    tp_slicing_free(&best->slicing);
    *best = *cand;
  } else tp_slicing_free(&cand->slicing);
  memset(cand, 0, sizeof *cand);
}

/* The fullest rank's parameters, gradients, masters and optimizer state. */
static double fixed_bytes(const TpPlanEval *e) {
  double most = 0;
  for (int k = 0; k < TP_MAX_STAGES && e->memory[k].peak; k++) {
    const TpRankMemory *r = &e->memory[k];
    double b = (double)(r->params + r->grads + r->masters + r->state);
    if (b > most) most = b;
  }
  return most;
}

int tp_plan(const TpPlanRequest *req, TpPlanResult *out, TpDiag *d) {
  memset(out, 0, sizeof *out);
  const TpCostModel *cm = &req->cm;
  int B = req->batch, g = req->granularity;
  if (B < 1) return tp_error(d, "batch per pipeline replica must be >= 1 (got %d)", B);
  if (g < 1 || cm->model.seq % g)
    return tp_error(d, "granularity %d does not divide the sequence length %d", g, cm->model.seq);
  if (cm->cal && B % cm->cal->b)
    return tp_error(d, "batch per pipeline replica %d is not a multiple of the profiled microbatch size %d", B,
                    cm->cal->b);
  int n = cm->model.seq / g, rc = tp_slicing_check_size(B, n, d);
  if (rc) return rc;
  /* every candidate plan has at most B x n units */
  if ((int64_t)B * n * cm->nstages > TP_PLAN_MAX_UNIT_STAGES)
    return tp_error(d,
                    "batch per pipeline replica %d x %d slice units x %d stages = %lld, more than the simulation "
                    "takes (%d): a smaller batch per replica or a coarser granularity",
                    B, n, cm->nstages, (long long)B * n * cm->nstages, TP_PLAN_MAX_UNIT_STAGES);
  if (req->schedule == TP_SCHEDULE_INTERLEAVED) { /* the chunks of TeraPipe's plan and the baselines */
    TpCostModel *v = malloc(sizeof *v);
    *v = *cm;
    TpScheduleSpec spec = {req->schedule, cm->nstages, 0, NULL, false, false, req->chunks};
    rc = tp_schedule_check_spec(&spec, d);
    if (!rc) rc = tp_cost_model_set_chunks(v, req->chunks, d);
    if (!rc) rc = tp_plan_check_units((int64_t)B * n, cm->nstages * req->chunks, d);
    free(v);
    if (rc) return rc;
  }
  TpSliceCost table;
  tp_model_slice_cost(cm, B, g, &table, &out->fit_rms_rel_err, &out->fit_max_rel_err);
  rc = tp_slice_cost_finish(&table, d); /* a calibrated fit can price a slice below zero */
  if (rc) goto done;

  /* TeraPipe's plan */
  init_eval(req, &out->terapipe, req->schedule, req->chunks);
  clock_t t0 = clock();
  rc = tp_solve_slicing(&table, B, cm->nstages, &out->terapipe.slicing, d);
  out->solve_s = (double)(clock() - t0) / CLOCKS_PER_SEC;
  if (rc) goto done;
  out->evaluations = out->terapipe.slicing.evaluations;
  evaluate_plan(req, &table, &out->terapipe);

  /* baseline and best uniform, over equal microbatch sizes */
  for (int mb = 1; mb <= B; mb++) {
    if (B % mb || (cm->microbatch_rows && mb != cm->microbatch_rows)) continue;
    TpPlanEval cand;
    init_eval(req, &cand, req->schedule, req->chunks);
    tp_uniform_slicing(&table, B, mb, 1, cm->nstages, &cand.slicing);
    evaluate_plan(req, &table, &cand);
    keep_better(&out->baseline, &cand);
    int best_n = 1;
    double best_t = INFINITY;
    for (int slices = 1; slices <= n; slices++) { /* one microbatch, its sum counted B / mb times */
      TpSlicing u;
      tp_uniform_slicing(&table, mb, mb, slices, cm->nstages, &u);
      double time = (double)(B / mb) * u.sum + (cm->nstages - 1) * u.max;
      if (time < best_t) best_t = time, best_n = slices;
      tp_slicing_free(&u);
    }
    init_eval(req, &cand, req->schedule, req->chunks);
    tp_uniform_slicing(&table, B, mb, best_n, cm->nstages, &cand.slicing);
    evaluate_plan(req, &table, &cand);
    keep_better(&out->uniform, &cand);
  }

  if (req->joint) {
    /* candidate slicings: the optimum, the optimum per microbatch size, best uniform */
    int ncand = 0;
    TpSlicing *cands = calloc((size_t)B + 3, sizeof *cands);
    tp_slicing_copy(&cands[ncand++], &out->terapipe.slicing);
    tp_slicing_copy(&cands[ncand++], &out->uniform.slicing);
    for (int mb = 1; mb <= B; mb++) {
      if (B % mb || mb == B || (cm->microbatch_rows && mb != cm->microbatch_rows)) continue;
      TpSliceCost only = table;
      size_t rows = ((size_t)B + 1) * ((size_t)n + 1);
      only.t0 = malloc(rows * sizeof(double));
      for (size_t i = 0; i < rows; i++) only.t0[i] = i / ((size_t)n + 1) == (size_t)mb ? table.t0[i] : INFINITY;
      TpDiag quiet;
      tp_diag_init(&quiet, "tokpipe-plan", NULL, NULL);
      if (tp_solve_slicing(&only, B, cm->nstages, &cands[ncand], &quiet) == TP_OK) ncand++;
      free(only.t0);
    }
    /* calibrated: only what was measured (no recomputation, the profile's stages); compilable:
     * tokpipec's options */
    const TpCompileCaps all = {true, true, true, true, true, true, true},
                        *caps = req->compilable ? &req->caps : &all;
    /* the schedules: gpipe, 1f1b, zb, interleaved with each chunk count the layers allow,
     * each with its (virtual) stage cuts, equal and balanced */
    int nsched = caps->zb ? 3 : 2, S = cm->nstages;
    int most = cm->cal || !caps->interleaved || S < 2 ? 1 : cm->model.layers / S;
    if (most > TP_MAX_STAGES / S) most = TP_MAX_STAGES / S;
    while (most > 1 && (int64_t)B * n * S * most > TP_PLAN_MAX_UNIT_STAGES) most--;
    struct Schedule {
      TpScheduleKind kind;
      int chunks;
      bool cuts_differ;
      int cuts[2][TP_MAX_STAGES];
    } *scheds = malloc(sizeof *scheds * (size_t)(2 + most));
    const TpScheduleKind kinds[] = {TP_SCHEDULE_GPIPE, TP_SCHEDULE_1F1B, TP_SCHEDULE_ZB};
    for (int i = 0; i < nsched; i++) {
      scheds[i].kind = kinds[i];
      scheds[i].chunks = 1;
      for (int k = 0; k < S; k++) scheds[i].cuts[0][k] = cm->stage[k].first;
      /* calibrated: only what was measured (the profile's cuts) */
      if (cm->cal) memcpy(scheds[i].cuts[1], scheds[i].cuts[0], sizeof(int) * (size_t)S);
      else balanced_cuts(cm, scheds[i].cuts[1]);
    }
    for (int V = 2; V <= most; V++, nsched++) {
      scheds[nsched].kind = TP_SCHEDULE_INTERLEAVED;
      scheds[nsched].chunks = V;
      virtual_cuts(cm, V, false, scheds[nsched].cuts[0]);
      virtual_cuts(cm, V, true, scheds[nsched].cuts[1]);
    }
    for (int i = 0; i < nsched; i++)
      scheds[i].cuts_differ = memcmp(scheds[i].cuts[0], scheds[i].cuts[1],
                                     sizeof(int) * (size_t)(S * scheds[i].chunks)) != 0;
    int recomputes = cm->cal || !caps->recompute ? 1 : 3;
    for (int c = 0; c < ncand; c++)
      for (int s = 0; s < nsched && (!req->compilable || tp_slicing_compiles(&cands[c])); s++)
        for (int rec = 0; rec < recomputes; rec++)
          for (int cut = 0; cut < 1 + scheds[s].cuts_differ; cut++) {
            TpPlanEval cand;
            init_eval(req, &cand, scheds[s].kind, scheds[s].chunks);
            cand.recompute = (TpRecompute)rec;
            cand.balanced_cuts = cut;
            memcpy(cand.cuts, scheds[s].cuts[cut], sizeof(int) * (size_t)(S * scheds[s].chunks));
            tp_slicing_copy(&cand.slicing, &cands[c]);
            evaluate_storage(req, caps, &table, &cand);
            keep_better(&out->joint, &cand);
          }
    free(scheds);
    for (int c = 0; c < ncand; c++) tp_slicing_free(&cands[c]);
    free(cands);
    out->has_joint = true;
    if (!out->joint.fits) {
      rc = tp_error(d,
                    "no plan fits in %.3g GiB per device: the smallest needs %.3g GiB on "
                    "its fullest rank (weights, gradients and optimizer state alone: %.3g GiB)",
                    req->max_memory / (1 << 30), out->joint.max_peak_bytes / (1 << 30),
                    fixed_bytes(&out->joint) / (1 << 30));
      goto done;
    }
  }
done:
  tp_slice_cost_free(&table);
  if (rc) tp_plan_result_free(out);
  return rc;
}

bool tp_slicing_compiles(const TpSlicing *s) {
  for (int m = 1; m < s->n; m++)
    if (s->mb[m].size != s->mb[0].size || s->mb[m].nslices != s->mb[0].nslices ||
        memcmp(s->mb[m].len, s->mb[0].len, sizeof(int) * (size_t)s->mb[0].nslices))
      return false;
  return s->n > 0;
}

static void free_plan_result(TpPlanResult *r) {
  tp_plan_result_free(r);
  memset(r, 0, sizeof *r);
}

int tp_plan_layouts(const TpPlanRequest *base, int gpus, int pipeline, int tensor, int data, int global_batch,
                    TpLayoutSearch *out, TpDiag *d) {
  memset(out, 0, sizeof *out);
  out->best = -1;
  const TpModelDesc *m = &base->cm.model;
  TpPlanRequest *req = malloc(sizeof *req);
  TpPlanResult *res = malloc(sizeof *res);
  TP_ASSERT(req && res);
  int cap = 0;
  for (int S = 1; S <= gpus && S <= m->layers && S <= TP_MAX_STAGES; S++) {
    if (gpus % S || m->layers % S || (pipeline && S != pipeline)) continue;
    for (int N = 1; N <= gpus / S; N++) {
      int D = gpus / S / N;
      if ((gpus / S) % N || m->heads % N || m->ffn % N || m->vocab < N || (tensor && N != tensor) ||
          (data && D != data) || global_batch % D)
        continue;
      *req = *base;
      TpDiag quiet;
      tp_diag_init(&quiet, d->tool, d->file, NULL);
      int rc = tp_cost_model_init(&req->cm, &base->cm.hw, m, S, N, D, &quiet);
      req->cm.uniform_stages = base->cm.uniform_stages;
      req->cm.untied = base->cm.untied;
      req->cm.vocab_split = base->cm.vocab_split;
      req->cm.one_region = base->cm.one_region;
      req->batch = global_batch / D;
      req->joint = true;
      if (!rc) rc = tp_plan(req, res, &quiet);
      if (out->n == cap)
        out->layouts = realloc(out->layouts, sizeof *out->layouts * (size_t)(cap = cap ? 2 * cap : 16));
      TpLayoutEval *e = &out->layouts[out->n++];
      *e = (TpLayoutEval){S, N, D, false, INFINITY, INFINITY, 0, ""};
      if (rc == TP_ERR_INPUT) { /* this layout has no plan: say why, try the others */
        snprintf(e->why, sizeof e->why, "%.*s", (int)sizeof e->why - 1, quiet.last);
        continue;
      }
      if (rc) { /* not the input's fault: stop */
        free(req), free(res);
        tp_layout_search_free(out);
        return tp_internal(d, "layout %d x %d x %d: %s", S, N, D, quiet.last);
      }
      e->fits = res->joint.fits;
      e->time_s = res->joint.time_s;
      e->terapipe_s = res->terapipe.time_s;
      e->max_peak_bytes = res->joint.max_peak_bytes;
      if (out->best < 0 || e->time_s < out->layouts[out->best].time_s) {
        if (out->best >= 0) free_plan_result(&out->result);
        out->best = out->n - 1;
        out->req = *req;
        out->result = *res;
      } else free_plan_result(res);
    }
  }
  free(req), free(res);
  if (!out->n) {
    int rc = tp_error(d,
                      "no layout of %d devices: pipeline%s x tensor%s x data%s must be %d, pipeline dividing the "
                      "%d layers, tensor the %d heads and the ffn width %d (and at most the vocabulary of %d) and "
                      "data the batch %d",
                      gpus, pipeline ? " (given)" : "", tensor ? " (given)" : "", data ? " (given)" : "", gpus,
                      m->layers, m->heads, m->ffn, m->vocab, global_batch);
    tp_layout_search_free(out);
    return rc;
  }
  if (out->best < 0) { /* the most model-parallel layout needs the least memory per device: its reason */
    const TpLayoutEval *close = &out->layouts[0];
    for (int i = 0; i < out->n; i++)
      if (out->layouts[i].pipeline * out->layouts[i].tensor > close->pipeline * close->tensor)
        close = &out->layouts[i];
    int rc = tp_error(d, "none of the %d layouts of %d devices has a plan; pipeline %d x tensor %d x data %d: %s",
                      out->n, gpus, close->pipeline, close->tensor, close->data, close->why);
    tp_layout_search_free(out);
    return rc;
  }
  return TP_OK;
}

void tp_layout_search_free(TpLayoutSearch *s) {
  if (s->best >= 0) tp_plan_result_free(&s->result);
  free(s->layouts);
  memset(s, 0, sizeof *s);
  s->best = -1;
}

void tp_plan_result_free(TpPlanResult *r) {
  tp_slicing_free(&r->terapipe.slicing);
  tp_slicing_free(&r->baseline.slicing);
  tp_slicing_free(&r->uniform.slicing);
  tp_slicing_free(&r->joint.slicing);
}
