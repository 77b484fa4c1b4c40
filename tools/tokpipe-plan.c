/* tokpipe-plan: plans token-level pipeline training of a transformer on a cluster with the
 * planner library (passes/planner): TeraPipe's optimal slicing (Eqs. 5-8), the paper's
 * baselines, and a joint search over schedule, stage cuts and recomputation under a
 * memory bound, all priced by an event simulation of the per-rank instruction lists.
 * Model input: built-in GPT-3 sizes or a KEY=VALUE description (ONNX input: later). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "passes/planner/plan.h"

#ifndef TOKPIPE_PROFILE_DIRS
#define TOKPIPE_PROFILE_DIRS "tools/profiles"
#endif

static const char usage[] =
    "usage: tokpipe-plan --model M [options]\n"
    "       tokpipe-plan --cost-table FILE.json [--json]\n"
    "Plans token-level pipeline training (TeraPipe) and prints the slicing, the predicted\n"
    "iteration time, the batch-only and uniform-slicing baselines and per-rank memory.\n"
    "  --model M            gpt3-1b | gpt3-13b | gpt3-44b | gpt3-175b, or\n"
    "                       layers=L,hidden=H,heads=A,seq=T,vocab=V[,ffn=F]\n"
    "  --hardware H         profile name (tools/profiles/H.json) or a .json path\n"
    "                       (default p3.16xlarge)\n"
    "  --gpus N             devices in all; must equal pipeline x tensor x data\n"
    "  --pipeline S         pipeline stages (default 1)\n"
    "  --tensor T           tensor-parallel degree (default 1)\n"
    "  --data D             data-parallel replicas (default 1)\n"
    "  --batch B            global batch in sequences (default 1), divided by D\n"
    "  --schedule S         gpipe (default, TeraPipe's) or 1f1b\n"
    "  --granularity G      slice lengths are multiples of G tokens (default 8)\n"
    "  --max-memory BYTES   per device (suffix K, M, G = 2^10..2^30); default: the profile's\n"
    "  --uniform-stages     price every stage like a middle one (no embedding/head)\n"
    "  --no-joint           skip the joint search\n"
    "  --show P             plan drawn and emitted: terapipe (default), joint, baseline, uniform\n"
    "  --emit=schedule      print the shown plan's per-rank instruction lists\n"
    "  --json               print one JSON object instead of text\n"
    "  --svg FILE           draw the shown plan's pipeline timeline\n"
    "  --trace FILE         write it as a Chrome/Perfetto trace\n"
    "  --cost-table FILE    solve Eq. 5 on {\"granularity\": g, \"stages\": K, \"t\": T[b][s][c]}\n"
    "  --profiles DIRS      ':'-separated profile folders (default: built-in)\n"
    "  --help, --version\n"
    "Exit status: 0 ok, 1 bad input, 2 bad usage, 3 internal error.\n";

static double parse_bytes(const char *flag, const char *text) {
  char *end;
  double v = strtod(text, &end);
  double unit = 1;
  if (end != text && *end) {
    unit = *end == 'K' || *end == 'k' ? 1024.0 : *end == 'M' ? 1048576.0 : *end == 'G' ? 1073741824.0 : 0;
    if (unit && end[1] && strcmp(end + 1, "iB") && strcmp(end + 1, "B")) unit = 0;
  }
  if (end == text || !unit || !(v >= 0) || isinf(v))
    cli_usage_error("%s expects bytes (e.g. 16G), got '%s'", flag, text);
  return v * unit;
}

static void print_lengths(FILE *out, const TpMicrobatch *mb) {
  fprintf(out, "[");
  for (int i = 0; i < mb->nslices; i++) fprintf(out, "%s%d", i ? "," : "", mb->len[i]);
  fprintf(out, "]");
}

static void json_slices(FILE *out, const TpSlicing *s) {
  fprintf(out, "[");
  for (int m = 0; m < s->n; m++) {
    fprintf(out, "%s{\"size\": %d, \"lengths\": ", m ? ", " : "", s->mb[m].size);
    print_lengths(out, &s->mb[m]);
    fprintf(out, "}");
  }
  fprintf(out, "]");
}

/* "2 x 1 seq: [384,384,...]" with runs of identical microbatches merged. */
static void text_slices(FILE *out, const TpSlicing *s) {
  for (int m = 0; m < s->n;) {
    int same = 1;
    while (m + same < s->n && s->mb[m + same].size == s->mb[m].size &&
           s->mb[m + same].nslices == s->mb[m].nslices &&
           !memcmp(s->mb[m + same].len, s->mb[m].len, sizeof(int) * (size_t)s->mb[m].nslices))
      same++;
    fprintf(out, "    %d microbatch%s of %d sequence%s, %d slice%s: ", same, same > 1 ? "es" : "",
            s->mb[m].size, s->mb[m].size > 1 ? "s" : "", s->mb[m].nslices,
            s->mb[m].nslices > 1 ? "s" : "");
    print_lengths(out, &s->mb[m]);
    fprintf(out, "\n");
    m += same;
  }
}

static void json_peaks(FILE *out, const TpPlanEval *e, int stages) {
  fprintf(out, "[");
  for (int k = 0; k < stages; k++) fprintf(out, "%s%.0f", k ? ", " : "", e->peak_bytes[k]);
  fprintf(out, "]");
}

static int run_cost_table(const char *path, bool json, TpDiag *d) {
  TpSliceCost t;
  int stages;
  int rc = tp_slice_cost_load(path, &t, &stages, d);
  if (rc) return rc;
  TpSlicing plan;
  clock_t t0 = clock();
  rc = tp_solve_slicing(&t, t.batch, stages, &plan, d);
  double solve = (double)(clock() - t0) / CLOCKS_PER_SEC;
  if (!rc) {
    if (json) {
      printf("{\n  \"iteration_time_s\": %.9g,\n  \"sum_s\": %.9g,\n  \"max_slice_s\": %.9g,\n",
             plan.time, plan.sum, plan.max);
      printf("  \"batch\": %d,\n  \"stages\": %d,\n  \"sequence\": %d,\n  \"slices\": ", t.batch,
             stages, t.units * t.granularity);
      json_slices(stdout, &plan);
      printf(",\n  \"solve_time_s\": %.6f,\n  \"dp_evaluations\": %d\n}\n", solve, plan.evaluations);
    } else {
      printf("cost table %s: batch %d, sequence %d (granularity %d), %d stages%s\n", path, t.batch,
             t.units * t.granularity, t.granularity, stages, t.monotone ? "" : " (not monotone)");
      printf("  Eq. 5 optimum %.6g s (sum %.6g + %d x max %.6g)\n", plan.time, plan.sum,
             stages - 1, plan.max);
      text_slices(stdout, &plan);
      printf("  solved in %.3f s (%d DP runs)\n", solve, plan.evaluations);
    }
    tp_slicing_free(&plan);
  }
  tp_slice_cost_free(&t);
  return rc;
}

typedef struct {
  const TpSimResult *r;
  const TpSchedule *s;
  const char *title;
} Picture;
static void write_svg(const void *ctx, FILE *out) {
  const Picture *p = ctx;
  tp_write_svg(p->r, p->s, p->title, out);
}
static void write_trace(const void *ctx, FILE *out) {
  const Picture *p = ctx;
  tp_write_trace(p->r, p->s, out);
}

int main(int argc, char **argv) {
  cli_tool = "tokpipe-plan";
  const char *model_spec = NULL, *hardware = "p3.16xlarge", *cost_table = NULL, *svg = NULL,
             *trace = NULL, *show = "terapipe", *profiles = TOKPIPE_PROFILE_DIRS, *v;
  int64_t gpus = 0, pipeline = 1, tensor = 1, data = 1, batch = 1, granularity = 8;
  double max_memory = -1;
  bool json = false, joint = true, uniform_stages = false, emit_schedule = false;
  TpScheduleKind schedule = TP_SCHEDULE_GPIPE;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (cli_is(a, "--help")) { fputs(usage, stdout); return 0; }
    else if (cli_is(a, "--version")) { printf("tokpipe-plan %s\n", TOKPIPE_VERSION); return 0; }
    else if (cli_is(a, "--json")) json = true;
    else if (cli_is(a, "--no-joint")) joint = false;
    else if (cli_is(a, "--uniform-stages")) uniform_stages = true;
    else if (cli_is(a, "--emit=schedule")) emit_schedule = true;
    else if (cli_value(argc, argv, &i, "--model", &model_spec)) {}
    else if (cli_value(argc, argv, &i, "--hardware", &hardware)) {}
    else if (cli_value(argc, argv, &i, "--cost-table", &cost_table)) {}
    else if (cli_value(argc, argv, &i, "--svg", &svg)) {}
    else if (cli_value(argc, argv, &i, "--trace", &trace)) {}
    else if (cli_value(argc, argv, &i, "--profiles", &profiles)) {}
    else if (cli_value(argc, argv, &i, "--show", &show)) {
      if (strcmp(show, "terapipe") && strcmp(show, "joint") && strcmp(show, "baseline") && strcmp(show, "uniform"))
        cli_usage_error("--show expects terapipe, joint, baseline or uniform, got '%s'", show);
    }
    else if (cli_value(argc, argv, &i, "--gpus", &v)) gpus = cli_int("--gpus", v, 1, 1 << 24);
    else if (cli_value(argc, argv, &i, "--pipeline", &v)) pipeline = cli_int("--pipeline", v, 1, TP_MAX_STAGES);
    else if (cli_value(argc, argv, &i, "--tensor", &v)) tensor = cli_int("--tensor", v, 1, 1 << 16);
    else if (cli_value(argc, argv, &i, "--data", &v)) data = cli_int("--data", v, 1, 1 << 20);
    else if (cli_value(argc, argv, &i, "--batch", &v)) batch = cli_int("--batch", v, 0, 1 << 20);
    else if (cli_value(argc, argv, &i, "--granularity", &v)) granularity = cli_int("--granularity", v, 1, 1 << 20);
    else if (cli_value(argc, argv, &i, "--max-memory", &v)) max_memory = parse_bytes("--max-memory", v);
    else if (cli_value(argc, argv, &i, "--schedule", &v)) {
      if (!tp_schedule_parse(v, &schedule)) cli_usage_error("--schedule expects gpipe or 1f1b, got '%s'", v);
    } else cli_usage_error("unknown option '%s'", a);
  }
  TpDiag d;
  tp_diag_init(&d, cli_tool, NULL, stderr);
  if (cost_table) {
    if (model_spec) cli_usage_error("--cost-table and --model exclude each other");
    return cli_exit_code(run_cost_table(cost_table, json, &d));
  }
  if (!model_spec) cli_usage_error("--model or --cost-table is required");

  TpModelDesc model;
  TpHardware hw;
  int rc = tp_model_parse(model_spec, &model, &d);
  if (!rc) rc = tp_hardware_find(hardware, profiles, &hw, &d);
  if (rc) return cli_exit_code(rc);
  if (gpus && gpus != pipeline * tensor * data)
    return cli_exit_code(tp_error(&d, "--gpus %lld is not pipeline x tensor x data = %lld x %lld x %lld = %lld",
                                  (long long)gpus, (long long)pipeline, (long long)tensor,
                                  (long long)data, (long long)(pipeline * tensor * data)));
  if (batch < 1) return cli_exit_code(tp_error(&d, "batch must be at least 1 (got %lld)", (long long)batch));
  if (batch % data)
    return cli_exit_code(tp_error(&d, "global batch %lld is not divisible by %lld data-parallel replicas",
                                  (long long)batch, (long long)data));
  TpPlanRequest *req = calloc(1, sizeof *req);
  rc = tp_cost_model_init(&req->cm, &hw, &model, (int)pipeline, (int)tensor, (int)data, &d);
  if (rc) {
    free(req);
    return cli_exit_code(rc);
  }
  req->cm.uniform_stages = uniform_stages;
  req->batch = (int)(batch / data);
  req->granularity = (int)granularity;
  req->schedule = schedule;
  req->max_memory = max_memory >= 0 ? max_memory : hw.memory_bytes;
  req->joint = joint;
  TpPlanResult *res = calloc(1, sizeof *res);
  rc = tp_plan(req, res, &d);
  if (rc) {
    free(res);
    free(req);
    return cli_exit_code(rc);
  }

  const TpPlanEval *tp = &res->terapipe, *base = &res->baseline, *uni = &res->uniform, *jt = &res->joint;
  int S = req->cm.nstages;
  if (json) {
    printf("{\n  \"model\": {\"name\": \"%s\", \"layers\": %d, \"hidden\": %d, \"heads\": %d, \"seq\": %d, \"vocab\": %d},\n",
           model.name, model.layers, model.hidden, model.heads, model.seq, model.vocab);
    printf("  \"hardware\": \"%s\",\n  \"pipeline\": %d,\n  \"tensor\": %d,\n  \"data\": %d,\n", hw.name,
           (int)pipeline, (int)tensor, (int)data);
    printf("  \"batch\": %d,\n  \"granularity\": %d,\n  \"schedule\": \"%s\",\n", (int)batch,
           (int)granularity, tp_schedule_name(schedule));
    printf("  \"iteration_time_s\": %.6g,\n  \"eq5_time_s\": %.6g,\n", tp->time_s, tp->eq5_s);
    printf("  \"baseline_time_s\": %.6g,\n  \"speedup\": %.4f,\n", base->time_s, base->time_s / tp->time_s);
    printf("  \"uniform_best_time_s\": %.6g,\n  \"uniform_best_slices\": %d,\n", uni->time_s,
           uni->slicing.mb[0].nslices);
    printf("  \"slices\": ");
    json_slices(stdout, &tp->slicing);
    printf(",\n  \"baseline_slices\": ");
    json_slices(stdout, &base->slicing);
    printf(",\n  \"peak_memory_bytes\": ");
    json_peaks(stdout, tp, S);
    printf(",\n");
    printf("  \"cost_fit_rms_rel_err\": %.3g,\n  \"dp_evaluations\": %d,\n", res->fit_rms_rel_err, res->evaluations);
    printf("  \"solve_time_s\": %.6f,\n", res->solve_s);
    if (res->has_joint) {
      printf("  \"joint\": {\"iteration_time_s\": %.6g, \"speedup_over_terapipe\": %.4f, \"schedule\": \"%s\", "
             "\"recompute\": %s, \"stage_cuts\": [", jt->time_s, tp->time_s / jt->time_s,
             tp_schedule_name(jt->schedule), jt->recompute ? "true" : "false");
      for (int k = 0; k < S; k++) printf("%s%d", k ? ", " : "", jt->cuts[k]);
      printf("], \"slices\": ");
      json_slices(stdout, &jt->slicing);
      printf(", \"peak_memory_bytes\": ");
      json_peaks(stdout, jt, S);
      printf("},\n");
    }
    printf("  \"fits_memory\": %s\n}\n", tp->fits ? "true" : "false");
  } else {
    printf("%s: %d layers, hidden %d, %d heads, sequence %d, vocabulary %d\n", model.name,
           model.layers, model.hidden, model.heads, model.seq, model.vocab);
    printf("%s (%s): %lld devices = pipeline %lld x tensor %lld x data %lld; batch %lld (%d per replica)\n",
           hw.name, hw.device, (long long)(pipeline * tensor * data), (long long)pipeline,
           (long long)tensor, (long long)data, (long long)batch, req->batch);
    printf("TeraPipe plan (%s, granularity %d):\n", tp_schedule_name(schedule), (int)granularity);
    text_slices(stdout, &tp->slicing);
    printf("  iteration time      %.4g s simulated; Eq. 5 estimate %.4g s (%+.1f%%)\n", tp->time_s,
           tp->eq5_s, 100 * (tp->eq5_s - tp->time_s) / tp->time_s);
    printf("  batch-only baseline %.4g s (%d microbatches of %d)  -> speedup %.2fx\n", base->time_s,
           base->slicing.n, base->slicing.mb[0].size, base->time_s / tp->time_s);
    printf("  best uniform        %.4g s (%d slices per microbatch of %d)\n", uni->time_s,
           uni->slicing.mb[0].nslices, uni->slicing.mb[0].size);
    printf("  peak memory per rank (GiB):");
    for (int k = 0; k < S; k++) printf(" %.2f", tp->peak_bytes[k] / (1 << 30));
    printf("%s\n", tp->fits ? "" : "  (does NOT fit)");
    printf("  DP: %d runs in %.3f s; cost table fit error %.2f%% rms, %.2f%% max\n", res->evaluations,
           res->solve_s, 100 * res->fit_rms_rel_err, 100 * res->fit_max_rel_err);
    if (res->has_joint) {
      printf("joint search: %.4g s (%.2fx over TeraPipe's plan): %s, %s stage cuts%s, max %.2f GiB\n",
             jt->time_s, tp->time_s / jt->time_s, tp_schedule_name(jt->schedule),
             jt->balanced_cuts ? "balanced" : "equal", jt->recompute ? ", recomputation" : "",
             jt->max_peak_bytes / (1 << 30));
      text_slices(stdout, &jt->slicing);
    }
  }

  if (svg || trace || emit_schedule) {
    const TpPlanEval *e = !strcmp(show, "joint") ? jt : !strcmp(show, "baseline") ? base
                        : !strcmp(show, "uniform") ? uni : tp;
    if (!strcmp(show, "joint") && !res->has_joint) cli_usage_error("--show joint needs the joint search");
    TpSchedule sched;
    TpSimResult sim;
    rc = tp_plan_simulate(req, e, true, &sched, &sim, &d);
    if (!rc) rc = tp_schedule_verify(&sched, false, &d);
    if (!rc && emit_schedule) tp_schedule_print(&sched, stdout);
    char title[256];
    snprintf(title, sizeof title, "%s on %s: pipeline %lld x tensor %lld, %s plan, %s: %.4g s",
             model.name, hw.name, (long long)pipeline, (long long)tensor, show,
             tp_schedule_name(e->schedule), sim.time_s);
    Picture pic = {&sim, &sched, title};
    if (!rc && svg) rc = cli_write_output(svg, write_svg, &pic, &d);
    if (!rc && trace) rc = cli_write_output(trace, write_trace, &pic, &d);
    tp_sim_result_free(&sim);
    tp_schedule_free(&sched);
  }
  tp_plan_result_free(res);
  free(res);
  free(req);
  return cli_exit_code(rc);
}
