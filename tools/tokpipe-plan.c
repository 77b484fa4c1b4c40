/* tokpipe-plan: plans token-level pipeline training of a transformer on a cluster with the
 * planner library (passes/planner): TeraPipe's optimal slicing (Eqs. 5-8), the paper's
 * baselines, and a joint search over schedule, stage cuts, recomputation and storage
 * (precision, --zero) under a memory bound, all priced by an event simulation of the per-rank instruction lists.
 * Model input: an ONNX model (sizes read off the raised IR), built-in GPT-3 sizes or a
 * KEY=VALUE description. --calibrate prices the stages from a generated trainer's
 * --profile; --slices/--microbatches price one given plan (as tokpipec compiles it)
 * instead of searching. --gpus with --search (or with some degrees left out) searches
 * the layout too: pipeline x tensor x data. The chosen plan is printed as the tokpipec
 * command line that compiles it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "passes/planner/gpu_step.h"
#include "passes/planner/plan.h"

#ifndef TOKPIPE_PROFILE_DIRS
#define TOKPIPE_PROFILE_DIRS "tools/profiles"
#endif

static const char usage[] =
    "usage: tokpipe-plan MODEL.onnx|--model M [options]\n"
    "       tokpipe-plan --cost-table FILE.json [--json]\n"
    "Plans token-level pipeline training (TeraPipe) and prints the slicing, the predicted\n"
    "iteration time, the batch-only and uniform-slicing baselines and per-rank memory; or,\n"
    "with --slices or --microbatches, predicts the step time of that one plan.\n"
    "Model:\n"
    "  MODEL.onnx           read layers, hidden, heads, vocabulary and a tied head off the\n"
    "                       model (imported, raised to transformer ops; or textual IR)\n"
    "  --seq T              its sequence length (default: the model's, or the profile's)\n"
    "  --dim NAME=VALUE     fix a symbolic input dimension of MODEL.onnx (repeatable)\n"
    "  --model M            gpt3-1b | gpt3-13b | gpt3-44b | gpt3-175b, or\n"
    "                       layers=L,hidden=H,heads=A,seq=T,vocab=V[,ffn=F]\n"
    "Layout and search:\n"
    "  --hardware H         profile name (tools/profiles/H.json) or a .json path\n"
    "                       (default p3.16xlarge; cpu with --calibrate)\n"
    "  --gpus N             devices in all: pipeline x tensor x data. The degrees left out\n"
    "                       are searched (as with --search naming them); given all, their\n"
    "                       product must be N\n"
    "  --pipeline S         pipeline stages (default 1, or searched)\n"
    "  --tensor T           tensor-parallel degree (default 1, or searched)\n"
    "  --data D             data-parallel replicas (default 1, or searched)\n"
    "  --search LIST        with --gpus: also choose these degrees, a ','-list of pipeline,\n"
    "                       tensor, data (or all): every layout with pipeline dividing the\n"
    "                       layers, tensor the heads and ffn width, data the batch gets the\n"
    "                       joint search below; the fastest that fits the memory bound wins\n"
    "                       and the layouts are listed with their times\n"
    "  --batch B            global batch in sequences, divided by D (default 1; calibrated:\n"
    "                       the profiled microbatch size x D x M)\n"
    "  --schedule S         gpipe (default, TeraPipe's), 1f1b, zb (zero-bubble ZB-H1:\n"
    "                       backwards split into input and weight parts, 1f1b's memory) or\n"
    "                       interleaved (with --chunks)\n"
    "  --chunks V           interleaved: V virtual stages per rank (2 or more; the layers cut\n"
    "                       into pipeline x V evenly). The joint search tries interleaved with\n"
    "                       every V the layers allow whatever the schedule given\n"
    "  --granularity G      slice lengths are multiples of G tokens (default 8)\n"
    "  --max-memory BYTES   per device (suffix K, M, G = 2^10..2^30); default: the profile's\n"
    "  --uniform-stages     price every stage like a middle one (no embedding/head)\n"
    "  --no-joint           skip the joint search (the joint plan is one tokpipec compiles as\n"
    "                       it is: equal microbatches sliced alike, with recomputation, bf16\n"
    "                       storage and --zero 1 where this tokpipec has them; printed as its\n"
    "                       tokpipec command line, whose --max-memory is the bound here:\n"
    "                       tokpipec checks it with the same per-rank memory model)\n"
    "  --show P             plan drawn and emitted: terapipe (default), joint, baseline, uniform\n"
    "Calibration:\n"
    "  --calibrate FILE     a generated trainer's --profile FILE.json: each stage's forward and\n"
    "                       backward fitted per (l, c) (t(l,0) per length + a0 + a1 l + a2 c\n"
    "                       + a3 l c; fit errors reported) and its optimizer step replace the\n"
    "                       analytic costs; transfers stay the hardware profile's. The pipeline\n"
    "                       degree and stage cuts are the profile's (a different --pipeline is\n"
    "                       an error), only its microbatch size b is priced (batches must be\n"
    "                       multiples of b), and the joint search keeps its cuts and tries no\n"
    "                       recomputation: it was not measured\n"
    "Prediction of one plan (the flags tokpipec compiles it with):\n"
    "  --slices N|L1,L2,..  each microbatch's token slices: N near-equal (longer first) or\n"
    "                       the lengths given\n"
    "  --microbatches M     microbatches per replica and step (default 1), of b sequences:\n"
    "                       the profile's batch, or --batch / (D x M)\n"
    "  --schedule S         as above. Prints the event-simulated step time of the per-rank\n"
    "                       instruction lists the trainer runs, optimizer and transfers\n"
    "                       included, and the per-stage unit times it used\n"
    "  --precision fp32|bf16, --zero 0|1, --recompute none|selective|full\n"
    "                       the plan's storage, optimizer-state sharding and recomputation\n"
    "                       (default fp32, 0, none), as tokpipec's options\n"
    "Output:\n"
    "  --emit=schedule      print the shown plan's per-rank instruction lists\n"
    "  --json               print one JSON object instead of text\n"
    "  --svg FILE           draw the shown plan's pipeline timeline\n"
    "  --trace FILE         write it as a Chrome/Perfetto trace\n"
    "  --cost-table FILE    solve Eq. 5 on {\"granularity\": g, \"stages\": K, \"t\": T[b][s][c]}\n"
    "One GPU's step:\n"
    "  --gpu-step           price the step of --batch sequences on one device of --hardware\n"
    "                       (e.g. h100, h200) kernel class by kernel class (products,\n"
    "                       attention as one flash kernel each way, elementwise/norm, loss,\n"
    "                       optimizer): FLOPs, bytes, kernels and time of each, the step's\n"
    "                       time, tokens/s and MFU (6N + 12 L h T FLOPs per token)\n"
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
  if (end == text || !unit || !(v >= 0) || !(v * unit <= 0x1p60))
    cli_usage_error("%s expects bytes up to 2^60 (e.g. 16G), got '%s'", flag, text);
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
    while (m + same < s->n && s->mb[m + same].size == s->mb[m].size && s->mb[m + same].nslices == s->mb[m].nslices &&
           !memcmp(s->mb[m + same].len, s->mb[m].len, sizeof(int) * (size_t)s->mb[m].nslices))
      same++;
    fprintf(out, "    %d microbatch%s of %d sequence%s, %d slice%s: ", same, same > 1 ? "es" : "", s->mb[m].size,
            s->mb[m].size > 1 ? "s" : "", s->mb[m].nslices, s->mb[m].nslices > 1 ? "s" : "");
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

/* The fullest rank's peak in the parts of codegen/rank_memory.h, as tokpipec's
 * --emit=memory prints them. */
static int fullest_rank(const TpPlanEval *e, int stages) {
  int most = 0;
  for (int k = 1; k < stages; k++)
    if (e->memory[k].peak > e->memory[most].peak) most = k;
  return most;
}

static void json_memory(const TpPlanEval *e, int stages) {
  int k = fullest_rank(e, stages);
  const TpRankMemory *r = &e->memory[k];
  printf("{\"stage\": %d, \"parameters\": %lld, \"gradients\": %lld, \"masters\": %lld, \"optimizer_state\": "
         "%lld, \"activations\": %lld, \"peak\": %lld}",
         k, (long long)r->params, (long long)r->grads, (long long)r->masters, (long long)r->state,
         (long long)r->activations, (long long)r->peak);
}

static void text_memory(const TpPlanEval *e, int stages) {
  int k = fullest_rank(e, stages);
  const TpRankMemory *r = &e->memory[k];
  printf("  fullest rank: stage %d, %.2f GiB = parameters %.2f + gradients %.2f", k, r->peak / 0x1p30,
         r->params / 0x1p30, r->grads / 0x1p30);
  if (r->masters) printf(" + fp32 masters %.2f", r->masters / 0x1p30);
  printf(" + optimizer state %.2f + activations %.2f\n", r->state / 0x1p30, r->activations / 0x1p30);
}

static int run_cost_table(const char *path, bool json, TpDiag *d) {
  TpSliceCost t;
  int stages;
  int rc = tp_slice_cost_load(path, &t, &stages, d);
  if (rc) return rc;
  TpSlicing plan;
  TpDiag fd; /* the search's own errors (its size) name the file */
  tp_diag_init(&fd, d->tool, path, d->stream);
  clock_t t0 = clock();
  rc = tp_solve_slicing(&t, t.batch, stages, &plan, &fd);
  double solve = (double)(clock() - t0) / CLOCKS_PER_SEC;
  if (!rc) {
    if (json) {
      printf("{\n  \"iteration_time_s\": %.9g,\n  \"sum_s\": %.9g,\n  \"max_slice_s\": %.9g,\n", plan.time, plan.sum,
             plan.max);
      printf("  \"batch\": %d,\n  \"stages\": %d,\n  \"sequence\": %d,\n  \"slices\": ", t.batch, stages,
             t.units * t.granularity);
      json_slices(stdout, &plan);
      printf(",\n  \"solve_time_s\": %.6f,\n  \"dp_evaluations\": %d\n}\n", solve, plan.evaluations);
    } else {
      printf("cost table %s: batch %d, sequence %d (granularity %d), %d stages%s\n", path, t.batch,
             t.units * t.granularity, t.granularity, stages, t.monotone ? "" : " (not monotone)");
      printf("  Eq. 5 optimum %.6g s (sum %.6g + %d x max %.6g)\n", plan.time, plan.sum, stages - 1, plan.max);
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

/* Checks a simulated plan's schedule, prints it (--emit=schedule) and draws it (--svg,
 * --trace). */
static int show_plan(const TpSimResult *sim, const TpSchedule *sched, const char *title, bool emit_schedule,
                     const char *svg, const char *trace, TpDiag *d) {
  int rc = tp_schedule_verify(sched, false, d);
  if (!rc && emit_schedule) tp_schedule_print(sched, stdout);
  Picture pic = {sim, sched, title};
  if (!rc && svg) rc = cli_write_output(svg, write_svg, &pic, d);
  if (!rc && trace) rc = cli_write_output(trace, write_trace, &pic, d);
  return rc;
}

/* ---- model input ---- */

/* Does a Linear (the LM head) read the embedding's table, directly or transposed? Then
 * the first and last stages all-reduce its gradient (allreduce-tied). */
static bool head_is_tied(const TpModule *m) {
  for (int op = 0; op < m->nops; op++) {
    if (m->ops[op].kind != TP_OP_Linear) continue;
    int w = m->ops[op].inputs[1], def = m->values[w].def;
    if (def >= 0 && m->ops[def].kind == TP_OP_Transpose) w = m->ops[def].inputs[0];
    for (int e = 0; e < m->nops; e++)
      if (m->ops[e].kind == TP_OP_Embedding && m->ops[e].inputs[0] == w) return true;
  }
  return false;
}

/* Imports MODEL (ONNX or textual IR), runs the default pipeline up to and including
 * raise-transformer and reads the transformer's sizes off it. */
static int describe_file(const char *path, const CliDims *dims, TpModelDesc *desc, bool *tied, TpDiag *d) {
  TpModule *m = NULL;
  /* the batch rows do not matter here: a symbolic batch dim is bound to 1 (a static one
   * refuses that, so then the model is read as it is) */
  CliDims one = *dims;
  if (cli_ends_with(path, ".onnx")) one.token_dims[0] = 1;
  TpDiag quiet;
  tp_diag_init(&quiet, d->tool, d->file, NULL);
  int rc = cli_load_module(path, &one, &m, &quiet);
  if (rc) {
    tp_module_free(m);
    m = NULL;
    rc = cli_load_module(path, dims, &m, d);
  }
  const char *names[64];
  int n = 0;
  for (int i = 0; tp_default_pipeline[i] && n < 64; i++) {
    names[n++] = tp_default_pipeline[i];
    if (!strcmp(tp_default_pipeline[i], "raise-transformer")) break;
  }
  TpPassOptions po = {0};
  if (rc == TP_OK &&
      !cli_ends_with(path, ".onnx")) { /* IR tokpipec printed: the passes it shows are not run again */
    bool done[CLI_RESUME_COUNT], wanted[CLI_RESUME_COUNT] = {0};
    cli_passes_done(m, done);
    rc = done[CLI_RESUME_SHARD]
             ? tp_error(d, "IR printed after shard-tensor holds one tensor rank's sizes: give "
                           "tokpipe-plan the IR printed without --tensor (its --tensor prices the split)")
             : cli_resume_after(m, names, &n, wanted, false, d);
  }
  if (rc == TP_OK) rc = cli_run_pipeline(m, names, n, &po, d);
  int tokens = rc == TP_OK ? tp_token_input(m) : -1;
  if (rc == TP_OK && (tokens < 0 || !tp_model_describe(m, m->values[tokens].type.dims[1], desc)))
    rc = tp_error(d, "cannot read the layer count, width, heads and vocabulary off the model (it needs an "
                     "integer [batch, seq] token input, causal attention and an LM head)");
  if (rc == TP_OK) {
    const char *base = strrchr(path, '/');
    snprintf(desc->name, sizeof desc->name, "%s", base ? base + 1 : path);
    *tied = head_is_tied(m);
  }
  tp_module_free(m);
  return rc;
}

/* ---- output ---- */

static void json_model(const TpModelDesc *m) {
  printf("  \"model\": {\"name\": ");
  tp_json_write_string(stdout, m->name);
  printf(", \"layers\": %d, \"hidden\": %d, \"heads\": %d, \"seq\": %d, \"vocab\": %d, "
         "\"ffn\": %d},\n",
         m->layers, m->hidden, m->heads, m->seq, m->vocab, m->ffn);
}

static void json_fit(const TpFit *f) {
  printf("{\"rms_rel_err\": %.6f, \"max_rel_err\": %.6f, \"samples\": %d}", f->rms_rel_err, f->max_rel_err,
         f->nsamples);
}

/* Per stage: the fit errors of forward and backward (or of their sum); the machine's drift
 * while profiling (null where the profile does not say). */
static void json_calibration(const TpCalibration *cal, const char *path, const TpProfile *p) {
  printf("  \"calibration\": {\"profile\": ");
  tp_json_write_string(stdout, path);
  printf(", \"microbatch_size\": %d, \"split\": %s, \"drift\": ", cal->b, cal->split ? "true" : "false");
  if (p->drift >= 0) printf("%.4f", p->drift);
  else printf("null");
  printf(", \"fit\": [");
  for (int k = 0; k < cal->nstages; k++) {
    printf("%s{\"stage\": %d, \"%s\": ", k ? ", " : "", k, cal->split ? "forward" : "sum");
    json_fit(&cal->fwd[k]);
    if (cal->split) printf(", \"backward\": "), json_fit(&cal->bwd[k]);
    printf("}");
  }
  printf("]},\n");
}

static void text_calibration(const TpCalibration *cal, const char *path, const TpProfile *p) {
  printf("calibrated by %s (%s, %d thread%s x %d rank%s): microbatches of %d, fit error (rms / max):\n", path,
         p->device, p->threads, p->threads == 1 ? "" : "s", p->ranks, p->ranks == 1 ? "" : "s", cal->b);
  for (int k = 0; k < cal->nstages; k++) {
    printf("  stage %d: %s %.2f%% / %.2f%%", k, cal->split ? "forward" : "forward+backward",
           100 * cal->fwd[k].rms_rel_err, 100 * cal->fwd[k].max_rel_err);
    if (cal->split)
      printf(", backward %.2f%% / %.2f%%", 100 * cal->bwd[k].rms_rel_err, 100 * cal->bwd[k].max_rel_err);
    printf(" over %d samples%s\n", cal->fwd[k].nsamples,
           cal->optimizer ? "" : "; optimizer step: analytic (not in the profile)");
  }
  if (p->drift >= 0)
    printf("  the machine drifted by %.0f%% while profiling (upper / lower quartile of the passes over the\n"
           "  grid): expect errors of that order in predictions from this profile\n",
           100 * p->drift);
}

/* Prices one plan: M microbatches of b sequences, each cut into `len`, on req's layout. */
static int predict(const TpPlanRequest *req, int M, int b, const int *len, int nslices, TpScheduleKind kind,
                   bool json, const char *svg, const char *trace, bool emit_schedule, TpDiag *d) {
  /* S ranks of J stages (interleaved: J = S x chunks virtual stages, cut evenly) */
  TpCostModel *cm = malloc(sizeof *cm);
  *cm = req->cm;
  int S = cm->nstages, V = kind == TP_SCHEDULE_INTERLEAVED ? req->chunks : 1;
  TpScheduleSpec spec = {kind, S, 0, NULL, false, false, V};
  int rc = tp_schedule_check_spec(&spec, d);
  if (!rc) rc = tp_cost_model_set_chunks(cm, V, d);
  if (rc) {
    free(cm);
    return rc;
  }
  int J = cm->nstages;
  TpPlanEval *e = calloc(1, sizeof *e);
  e->schedule = kind;
  e->chunks = V;
  e->recompute = cm->recompute;
  e->precision = cm->precision;
  e->zero = cm->zero;
  for (int k = 0; k < J; k++) e->cuts[k] = cm->stage[k].first;
  e->slicing.n = M;
  e->slicing.mb = calloc((size_t)M, sizeof *e->slicing.mb);
  for (int m = 0; m < M; m++) {
    TpMicrobatch *mb = &e->slicing.mb[m];
    mb->size = b;
    mb->nslices = nslices;
    mb->len = malloc(sizeof(int) * (size_t)nslices);
    memcpy(mb->len, len, sizeof(int) * (size_t)nslices);
  }
  TpSchedule sched;
  TpSimResult sim;
  rc = tp_plan_simulate(req, e, svg || trace, &sched, &sim, d);
  if (rc) goto done;
  if (!isfinite(sim.time_s)) {
    rc = tp_error(d, "the plan has units the cost model cannot price (microbatch size %d)", b);
    goto done_sim;
  }
  TpSimCosts c;
  tp_sim_costs_from_model(cm, &e->slicing, &c);
  int fits = 1;
  for (int k = 0; k < S; k++) fits &= sim.peak_bytes[k] <= req->max_memory;
  bool split = kind == TP_SCHEDULE_ZB; /* its backwards run as input and weight parts */
  if (json) {
    printf("  \"schedule\": \"%s\",\n", tp_schedule_name(kind));
    if (V > 1) printf("  \"chunks\": %d,\n", V);
    printf("  \"microbatches\": %d,\n  \"microbatch_size\": %d,\n  \"stage_cuts\": [", M, b);
    for (int k = 0; k < J; k++) printf("%s%d", k ? ", " : "", e->cuts[k]);
    printf("],\n  \"slices\": ");
    json_slices(stdout, &e->slicing);
    printf(",\n  \"iteration_time_s\": %.6g,\n  \"units\": [", sim.time_s);
    for (int k = 0; k < J; k++) { /* every microbatch is alike: microbatch 0's units */
      printf("%s[", k ? ", " : "");
      for (int i = 0, ctx = 0; i < nslices; ctx += len[i], i++) {
        printf("%s{\"l\": %d, \"c\": %d, \"forward_s\": %.6g, \"backward_s\": %.6g", i ? ", " : "", len[i], ctx,
               c.fwd[(size_t)k * c.units + i], c.bwd[(size_t)k * c.units + i]);
        if (split) printf(", \"weight_s\": %.6g", c.wgt[(size_t)k * c.units + i]); /* of backward_s */
        printf("}");
      }
      printf("]");
    }
    printf("],\n  \"send_s\": [");
    for (int k = 0; k + 1 < J; k++) {
      printf("%s[", k ? ", " : "");
      for (int i = 0; i < nslices; i++) printf("%s%.6g", i ? ", " : "", c.send[(size_t)k * c.units + i]);
      printf("]");
    }
    printf("],\n  \"tied_allreduce_s\": %.6g,\n  \"optimizer_s\": [", req->untied ? 0 : c.tied_allreduce);
    for (int k = 0; k < J; k++) printf("%s%.6g", k ? ", " : "", c.optimizer[k]);
    printf("],\n  \"busy_s\": [");
    for (int k = 0; k < S; k++) printf("%s%.6g", k ? ", " : "", sim.busy_s[k]);
    printf("],\n  \"peak_memory_bytes\": [");
    for (int k = 0; k < S; k++) printf("%s%.0f", k ? ", " : "", sim.peak_bytes[k]);
    printf("],\n  \"fits_memory\": %s\n}\n", fits ? "true" : "false");
  } else {
    printf("plan: %d stage%s", S, S == 1 ? "" : "s");
    if (V > 1) printf(" x %d chunks", V);
    printf(" (cuts");
    for (int k = 0; k < J; k++) printf("%s%d", k ? ", " : " ", e->cuts[k]);
    printf("), %s, %d microbatch%s of %d sequence%s, slices ", tp_schedule_name(kind), M, M == 1 ? "" : "es", b,
           b == 1 ? "" : "s");
    print_lengths(stdout, &e->slicing.mb[0]);
    printf("\n  predicted step time %.4g ms (event simulation of the per-rank instruction lists,\n"
           "  transfers%s and the optimizer step included)\n",
           1e3 * sim.time_s, req->untied ? "" : ", the tied embedding all-reduce");
    printf("  %-6s %-12s %12s %12s%s\n", "stage", "unit l+c", "forward ms", "backward ms",
           split ? "  of which weight ms" : "");
    for (int k = 0; k < J; k++)
      for (int i = 0, ctx = 0; i < nslices; ctx += len[i], i++) {
        printf("  %-6d %5d+%-6d %12.3f %12.3f", k, len[i], ctx, 1e3 * c.fwd[(size_t)k * c.units + i],
               1e3 * c.bwd[(size_t)k * c.units + i]);
        if (split) printf(" %20.3f", 1e3 * c.wgt[(size_t)k * c.units + i]);
        printf("\n");
      }
    printf("  optimizer ms:");
    for (int k = 0; k < J; k++) printf(" %.3f", 1e3 * c.optimizer[k]);
    printf("; busy ms:");
    for (int k = 0; k < S; k++) printf(" %.2f", 1e3 * sim.busy_s[k]);
    printf("\n  peak memory per rank (GiB):");
    for (int k = 0; k < S; k++) printf(" %.3f", sim.peak_bytes[k] / (1 << 30));
    printf("%s\n", fits ? "" : "  (does NOT fit)");
  }
  tp_sim_costs_free(&c);
  char title[256];
  char chunks[32] = "";
  if (V > 1) snprintf(chunks, sizeof chunks, " x %d chunks", V);
  snprintf(title, sizeof title, "%s: %d stages, %d microbatches, %d slices, %s%s: %.4g s", cm->model.name, S, M,
           nslices, tp_schedule_name(kind), chunks, sim.time_s);
  rc = show_plan(&sim, &sched, title, emit_schedule, svg, trace, d);
done_sim:
  tp_sim_result_free(&sim);
  tp_schedule_free(&sched);
done:
  tp_slicing_free(&e->slicing);
  free(e);
  free(cm);
  return rc;
}

/* The layouts the search tried: their joint and TeraPipe times, or why they have no plan. */
static void json_layouts(const TpLayoutSearch *s, int gpus, int best) {
  printf("  \"search\": {\"gpus\": %d, \"layouts\": [", gpus);
  for (int i = 0; i < s->n; i++) {
    const TpLayoutEval *e = &s->layouts[i];
    printf("%s\n    {\"pipeline\": %d, \"tensor\": %d, \"data\": %d, \"chosen\": %s, \"fits\": %s", i ? "," : "",
           e->pipeline, e->tensor, e->data, i == best ? "true" : "false", e->fits ? "true" : "false");
    if (e->fits)
      printf(", \"iteration_time_s\": %.6g, \"terapipe_time_s\": %.6g, \"max_peak_bytes\": %.0f}", e->time_s,
             e->terapipe_s, e->max_peak_bytes);
    else printf(", \"why\": "), tp_json_write_string(stdout, e->why), printf("}");
  }
  printf("]},\n");
}

static void text_layouts(const TpLayoutSearch *s, int gpus, int best) {
  printf("layouts of %d devices (pipeline x tensor x data), joint plan / TeraPipe's plan:\n", gpus);
  for (int i = 0; i < s->n; i++) {
    const TpLayoutEval *e = &s->layouts[i];
    printf("  %c %4d x %3d x %4d  ", i == best ? '*' : ' ', e->pipeline, e->tensor, e->data);
    if (e->fits)
      printf("%9.4g s / %9.4g s, max %.2f GiB\n", e->time_s, e->terapipe_s, e->max_peak_bytes / (1 << 30));
    else printf("no plan: %s\n", e->why);
  }
}

/* A word for the shell: as it is when plain, else in single quotes. */
static void shell_word(FILE *out, const char *w) {
  if (*w && strspn(w, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./=,:+-") == strlen(w)) {
    fputs(w, out);
    return;
  }
  fputc('\'', out);
  for (; *w; w++) fputs(*w == '\'' ? "'\\''" : (char[2]){*w, 0}, out);
  fputc('\'', out);
}

/* The tokpipec command line that compiles plan `e` of req's layout as it is (a plan of
 * equal microbatches sliced alike: tp_slicing_compiles; its storage and recomputation
 * options only where the plan has them). `model` is the model file, or
 * MODEL.onnx for a --model description; `extra` the model options given here (--seq,
 * --dim). Written into a malloc'ed string. */
static char *tokpipec_command(const char *model, const char *extra, const TpPlanRequest *req, int global_batch,
                              const TpPlanEval *e) {
  char *text = NULL;
  size_t size = 0;
  FILE *out = open_memstream(&text, &size);
  TP_ASSERT(out);
  const TpCostModel *cm = &req->cm;
  const TpMicrobatch *mb = &e->slicing.mb[0];
  fputs("tokpipec ", out);
  shell_word(out, model);
  int J = cm->nstages * e->chunks; /* interleaved: the virtual stages' cuts */
  fprintf(out, "%s --batch %d --stages %d", extra, global_batch, cm->nstages);
  if (J > 1) { /* the planner's cuts, not tokpipec's own balance */
    fputs(" --stage-cuts ", out);
    for (int k = 1; k < J; k++) fprintf(out, "%s%d", k > 1 ? "," : "", e->cuts[k]);
  }
  fprintf(out, " --tensor %d --dp %d --microbatches %d --slices ", cm->tensor, cm->data, e->slicing.n);
  if (mb->nslices == 1) fputs("1", out); /* one number is a count */
  for (int i = 0; mb->nslices > 1 && i < mb->nslices; i++) fprintf(out, "%s%d", i ? "," : "", mb->len[i]);
  fprintf(out, " --schedule %s", tp_schedule_name(e->schedule));
  if (e->chunks > 1) fprintf(out, " --chunks %d", e->chunks);
  if (e->precision != TP_PRECISION_FP32) fprintf(out, " --precision %s", tp_precision_name(e->precision));
  if (e->zero) fputs(" --zero 1", out);
  if (e->recompute) fprintf(out, " --recompute %s", tp_recompute_name(e->recompute));
  fprintf(out, " --max-memory %.0f -o plan.c", req->max_memory);
  fclose(out);
  return text;
}

/* The options this tokpipec compiles, which the joint search may choose (its memory
 * accounting follows codegen/rank_memory.h for them all). */
static const TpCompileCaps tokpipec_caps = {.bf16 = true,
                                            .zero = true,
                                            .recompute = true,
                                            .vocab_pad = true,
                                            .transient_region = true,
                                            .zb = true,
                                            .interleaved = true};

/* A profile prices the model it was measured on: one of another size (its "parameters"
 * more than 4x off the model's estimate, far beyond the estimate's error) is refused; a
 * profile without its size, of a model under another file name, is warned about (into
 * warning, printed once the plan is made, so that an error stays one line). Both name the
 * two models. */
/* --gpu-step: one device's step by kernel class (passes/planner/gpu_step.h). */
static int run_gpu_step(const TpHardware *hw, const TpModelDesc *model, bool tied, int batch, bool json, TpDiag *d) {
  TpCostModel cm;
  int rc = tp_cost_model_init(&cm, hw, model, 1, 1, 1, d);
  if (rc) return rc;
  cm.untied = !tied;
  cm.flash_attention = true;
  cm.vocab_multiple = 64; /* a CUDA plan's padded head (tokpipec --target cuda) */
  TpGpuStep s;
  tp_gpu_step(&cm, batch, &s);
  if (json) {
    printf("{\"hardware\": \"%s\", \"peak_flops\": %.6g, \"memory_bandwidth\": %.6g, \"batch\": %d, \"seq\": %d, "
           "\"params\": %.6g, \"classes\": {",
           hw->name, hw->peak_flops, hw->mem_bandwidth, batch, model->seq, s.params);
    for (int c = 0; c < TP_GPU_CLASSES; c++)
      printf("%s\"%s\": {\"flops\": %.6g, \"bytes\": %.6g, \"kernels\": %d, \"seconds\": %.6g}", c ? ", " : "",
             tp_gpu_class_names[c], s.cls[c].flops, s.cls[c].bytes, s.cls[c].kernels, s.cls[c].seconds);
    printf("}, \"model_flops\": %.6g, \"seconds\": %.6g, \"tokens_per_s\": %.6g, \"mfu\": %.6g}\n", s.model_flops,
           s.seconds, s.tokens_per_s, s.mfu);
    return TP_OK;
  }
  printf("GPU step model: %d layers, hidden %d, %d heads, vocabulary %d%s, %.4g parameters; batch %d x %d tokens\n",
         model->layers, model->hidden, model->heads, model->vocab, tied ? ", tied head" : "", s.params, batch,
         model->seq);
  printf("on %s: %s, %.0f TFLOP/s %s dense peak, GEMMs at %.2f of it, %.0f GB/s sustained, %.0f us per kernel\n",
         hw->name, hw->device, hw->peak_flops / 1e12, hw->dtype, hw->gemm_efficiency, hw->mem_bandwidth / 1e9,
         hw->kernel_overhead_s * 1e6);
  printf("  %-17s %8s %10s %10s %9s %6s\n", "class", "kernels", "GFLOP", "GB", "ms", "share");
  for (int c = 0; c < TP_GPU_CLASSES; c++)
    printf("  %-17s %8d %10.1f %10.2f %9.3f %5.1f%%\n", tp_gpu_class_names[c], s.cls[c].kernels,
           s.cls[c].flops / 1e9, s.cls[c].bytes / 1e9, s.cls[c].seconds * 1e3, 100 * s.cls[c].seconds / s.seconds);
  printf("predicted step %.2f ms: %.0f tokens/s, MFU %.1f%% (%.2f TFLOP of model FLOPs per step)\n", s.seconds * 1e3,
         s.tokens_per_s, 100 * s.mfu, s.model_flops / 1e12);
  return TP_OK;
}

static int check_profile_model(const TpProfile *prof, const char *path, const char *name, const TpModelDesc *model,
                               char *warning, size_t size, TpDiag *d) {
  const char *measured = prof->model[0] ? prof->model : "an unnamed model";
  double have = tp_model_params(model);
  if (prof->parameters > 0 && (have > 4 * prof->parameters || prof->parameters > 4 * have))
    return tp_error(d,
                    "the profile %s was measured on '%s' (%.4g parameters), not on '%s' (about %.4g): its "
                    "times do not price another model; profile this model's trainer",
                    path, measured, prof->parameters, name, have);
  const char *a = strrchr(measured, '/') ? strrchr(measured, '/') + 1 : measured;
  const char *b = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
  if (prof->parameters == 0 && strcmp(a, b) != 0)
    snprintf(warning, size,
             "%s: warning: the profile %s was measured on '%s' and does not record its size: nothing "
             "checks that '%s' is that model",
             d->tool, path, measured, name);
  return TP_OK;
}

int main(int argc, char **argv) {
  cli_tool = "tokpipe-plan";
  const char *model_spec = NULL, *hardware = NULL, *cost_table = NULL, *svg = NULL, *trace = NULL,
             *show = "terapipe", *profiles = NULL, *input = NULL, *calibrate = NULL, *slices = NULL, *search = NULL,
             *v;
  int64_t gpus = 0, pipeline = 0, tensor = 0, data = 0, batch = -1, granularity = 8, microbatches = 0;
  char extra[1024] = ""; /* the model options, for the tokpipec command line */
  size_t nextra = 0;
  double max_memory = -1;
  bool json = false, joint = true, uniform_stages = false, emit_schedule = false, storage_given = false,
       gpu_step = false;
  TpPrecision precision = TP_PRECISION_FP32;
  TpRecompute recompute = TP_RECOMPUTE_NONE;
  int64_t zero = 0;
  TpScheduleKind schedule = TP_SCHEDULE_GPIPE;
  int64_t chunks = 0;
  CliDims dims = {0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (cli_is(a, "--help")) {
      fputs(usage, stdout);
      return 0;
    } else if (cli_is(a, "--version")) {
      printf("tokpipe-plan %s\n", TOKPIPE_VERSION);
      return 0;
    } else if (cli_is(a, "--json")) json = true;
    else if (cli_is(a, "--no-joint")) joint = false;
    else if (cli_is(a, "--uniform-stages")) uniform_stages = true;
    else if (cli_is(a, "--emit=schedule")) emit_schedule = true;
    else if (cli_is(a, "--gpu-step")) gpu_step = true;
    else if (cli_value(argc, argv, &i, "--model", &model_spec)) {
    } else if (cli_value(argc, argv, &i, "--hardware", &hardware)) {
    } else if (cli_value(argc, argv, &i, "--cost-table", &cost_table)) {
    } else if (cli_value(argc, argv, &i, "--svg", &svg)) {
    } else if (cli_value(argc, argv, &i, "--trace", &trace)) {
    } else if (cli_value(argc, argv, &i, "--profiles", &profiles)) {
    } else if (cli_value(argc, argv, &i, "--calibrate", &calibrate)) {
    } else if (cli_value(argc, argv, &i, "--slices", &slices)) {
    } else if (cli_value(argc, argv, &i, "--search", &search)) {
    } else if (cli_value(argc, argv, &i, "--show", &show)) {
      if (strcmp(show, "terapipe") && strcmp(show, "joint") && strcmp(show, "baseline") && strcmp(show, "uniform"))
        cli_usage_error("--show expects terapipe, joint, baseline or uniform, got '%s'", show);
    } else if (cli_value(argc, argv, &i, "--gpus", &v)) gpus = cli_int("--gpus", v, 1, 1 << 24);
    else if (cli_value(argc, argv, &i, "--pipeline", &v)) pipeline = cli_int("--pipeline", v, 1, TP_MAX_STAGES);
    else if (cli_value(argc, argv, &i, "--tensor", &v)) tensor = cli_int("--tensor", v, 1, 1 << 16);
    else if (cli_value(argc, argv, &i, "--data", &v)) data = cli_int("--data", v, 1, 1 << 20);
    else if (cli_value(argc, argv, &i, "--batch", &v)) batch = cli_int("--batch", v, 0, 1 << 20);
    else if (cli_value(argc, argv, &i, "--microbatches", &v)) microbatches = cli_int("--microbatches", v, 1, 65536);
    else if (cli_value(argc, argv, &i, "--granularity", &v)) granularity = cli_int("--granularity", v, 1, 1 << 20);
    else if (cli_value(argc, argv, &i, "--max-memory", &v)) max_memory = parse_bytes("--max-memory", v);
    else if (cli_value(argc, argv, &i, "--seq", &v) || cli_value(argc, argv, &i, "--dim", &v)) {
      if (a[2] == 's') dims.token_dims[1] = cli_int("--seq", v, 1, TP_MAX_SEQ);
      else cli_add_dim(&dims, v);
      if (nextra + strlen(v) + 8 < sizeof extra)
        nextra += (size_t)snprintf(extra + nextra, sizeof extra - nextra, " %s %s", a[2] == 's' ? "--seq" : "--dim",
                                   v);
    } else if (cli_value(argc, argv, &i, "--precision", &v)) {
      if (!tp_precision_parse(v, &precision) || precision == TP_PRECISION_FP16)
        cli_usage_error("--precision expects fp32 or bf16, got '%s'", v);
      storage_given = true;
    } else if (cli_value(argc, argv, &i, "--recompute", &v)) {
      if (!tp_recompute_parse(v, &recompute))
        cli_usage_error("--recompute expects none, selective or full, got '%s'", v);
      storage_given = true;
    } else if (cli_value(argc, argv, &i, "--zero", &v)) {
      zero = cli_int("--zero", v, 0, 1);
      storage_given = true;
    } else if (cli_value(argc, argv, &i, "--schedule", &v)) {
      if (!tp_schedule_parse(v, &schedule))
        cli_usage_error("--schedule expects gpipe, 1f1b, zb or interleaved, got '%s'", v);
    } else if (cli_value(argc, argv, &i, "--chunks", &v)) chunks = cli_int("--chunks", v, 2, TP_SCHEDULE_MAX_CHUNKS);
    else if (a[0] == '-' && a[1]) cli_usage_error("unknown option '%s'", a);
    else if (input) cli_usage_error("more than one input model ('%s' and '%s')", input, a);
    else input = a;
  }
  if (chunks && schedule != TP_SCHEDULE_INTERLEAVED)
    cli_usage_error("--chunks %lld needs --schedule interleaved", (long long)chunks);
  if (!chunks && schedule == TP_SCHEDULE_INTERLEAVED)
    cli_usage_error("--schedule interleaved needs --chunks V: the virtual stages per rank (2 or more)");
  char default_profiles[4096];
  tp_profile_dirs(TOKPIPE_PROFILE_DIRS, default_profiles, sizeof default_profiles);
  if (!profiles) profiles = default_profiles;
  TpDiag d;
  tp_diag_init(&d, cli_tool, NULL, stderr);
  if (cost_table) {
    if (model_spec || input) cli_usage_error("--cost-table excludes a model (MODEL.onnx or --model)");
    return cli_exit_code(run_cost_table(cost_table, json, &d));
  }
  if (!model_spec && !input) cli_usage_error("a model is required: MODEL.onnx, --model M or --cost-table FILE");
  if (model_spec && input) cli_usage_error("give the model once: '%s' or --model %s", input, model_spec);
  if (!input && (dims.n || dims.token_dims[1]))
    cli_usage_error("--seq and --dim apply to a model file (MODEL.onnx)");
  bool predicting = slices || microbatches;
  if (gpu_step && (calibrate || predicting || search || gpus || storage_given || svg || trace || emit_schedule ||
                   uniform_stages || !joint || (pipeline | tensor | data) > 1))
    cli_usage_error("--gpu-step prices one device's step of the whole model: it takes a model, --hardware, "
                    "--batch and --json only");
  if (storage_given && !predicting)
    cli_usage_error("--precision, --zero and --recompute price one plan (with --slices or --microbatches); the "
                    "search chooses them itself");
  bool onnx = input && cli_ends_with(input, ".onnx");
  if (calibrate && uniform_stages)
    cli_usage_error("--uniform-stages cannot go with --calibrate: the profile prices each stage");
  if (calibrate && tensor > 1) cli_usage_error("--calibrate prices the profiled stages: --tensor must be 1");
  /* the layout: with --gpus the degrees not given are searched (--search says so
   * explicitly); without, they are 1 */
  if (search && !gpus) cli_usage_error("--search needs --gpus: the device count the layouts divide");
  if (search && (calibrate || predicting))
    cli_usage_error("--search is for the planner's search, not with --calibrate or the prediction of one plan");
  char **names = search ? cli_split_list("--search", search, &(int){0}) : NULL;
  for (char **n = names; n && *n; n++) {
    bool all = !strcmp(*n, "all");
    if (!all && strcmp(*n, "pipeline") && strcmp(*n, "tensor") && strcmp(*n, "data"))
      cli_usage_error("--search expects pipeline, tensor, data or all, got '%s'", *n);
    if ((all || !strcmp(*n, "pipeline")) && pipeline) cli_usage_error("--search %s: --pipeline is given", *n);
    if ((all || !strcmp(*n, "tensor")) && tensor) cli_usage_error("--search %s: --tensor is given", *n);
    if ((all || !strcmp(*n, "data")) && data) cli_usage_error("--search %s: --data is given", *n);
  }
  if (names) cli_free_list(names);
  bool searching = gpus && !calibrate && !predicting && (!pipeline || !tensor || !data);
  if (searching && !joint)
    cli_usage_error(
        "--no-joint cannot go with the layout search (--gpus with degrees left out): it compares joint plans");
  int64_t fixed[3] = {pipeline, tensor, data}; /* searching: the degrees given, 0 = searched */
  if (searching) pipeline = 1;                 /* the base request: each layout sets its own */
  tensor = tensor && !searching ? tensor : 1;
  data = data && !searching ? data : 1;
  if (predicting && (joint == false || strcmp(show, "terapipe")))
    cli_usage_error(
        "--no-joint and --show are for the search, not for the prediction of one plan (--slices, --microbatches)");

  /* the profile first: it fixes the sequence length, pipeline degree and cuts */
  TpProfile prof = {0};
  TpCalibration cal = {0};
  int rc = TP_OK;
  if (calibrate) {
    rc = tp_profile_load(calibrate, &prof, &d);
    if (!rc) rc = tp_calibrate(&prof, calibrate, &cal, &d);
    if (rc) {
      tp_profile_free(&prof);
      return cli_exit_code(rc);
    }
    if (pipeline && pipeline != prof.stages)
      rc = tp_error(&d, "--pipeline %lld conflicts with the profile %s, measured on %d stage%s", (long long)pipeline,
                    calibrate, prof.stages, prof.stages == 1 ? "" : "s");
    pipeline = prof.stages;
    if (!hardware) hardware = "cpu";
    if (input && onnx && !dims.token_dims[1]) dims.token_dims[1] = prof.seq;
  }
  if (!pipeline) pipeline = 1;
  if (!hardware) hardware = "p3.16xlarge";

  TpModelDesc model;
  TpHardware hw;
  bool tied = true;
  if (!rc && input) {
    TpDiag fd;
    tp_diag_init(&fd, cli_tool, strcmp(input, "-") ? input : "<stdin>", stderr);
    rc = describe_file(input, &dims, &model, &tied, &fd);
  } else if (!rc) rc = tp_model_parse(model_spec, &model, &d);
  cli_free_dims(&dims);
  if (!rc && calibrate && prof.seq && prof.seq != model.seq)
    rc = tp_error(&d, "the profile %s was measured at sequence length %d, the model has %d", calibrate, prof.seq,
                  model.seq);
  char profile_warning[1024] = "";
  if (!rc && calibrate)
    rc = check_profile_model(&prof, calibrate, input ? input : model_spec, &model, profile_warning,
                             sizeof profile_warning, &d);
  if (!rc) rc = tp_hardware_find(hardware, profiles, &hw, &d);
  if (gpu_step)
    return cli_exit_code(rc ? rc : run_gpu_step(&hw, &model, tied, batch > 0 ? (int)batch : 1, json, &d));
  if (!rc && gpus && !searching && gpus != pipeline * tensor * data)
    rc = tp_error(&d, "--gpus %lld is not pipeline x tensor x data = %lld x %lld x %lld = %lld", (long long)gpus,
                  (long long)pipeline, (long long)tensor, (long long)data, (long long)(pipeline * tensor * data));
  /* the microbatch size: the profile's, or the global batch's share of each microbatch */
  int64_t M = microbatches ? microbatches : 1, b = 1;
  if (!rc && predicting) {
    b = calibrate ? cal.b : batch > 0 ? batch / (data * M) : 1;
    if (batch < 0) batch = b * data * M;
    if (batch != b * data * M && calibrate)
      rc = tp_error(&d, "--batch %lld is not data %lld x microbatches %lld x the profiled microbatch size %lld",
                    (long long)batch, (long long)data, (long long)M, (long long)b);
    else if (batch != b * data * M)
      rc = tp_error(&d, "--batch %lld is not divisible into data %lld x microbatches %lld equal microbatches",
                    (long long)batch, (long long)data, (long long)M);
  }
  if (batch < 0) batch = calibrate ? cal.b * data : 1;
  if (!rc && batch < 1) rc = tp_error(&d, "batch must be at least 1 (got %lld)", (long long)batch);
  if (!rc && batch % data)
    rc = tp_error(&d, "global batch %lld is not divisible by %lld data-parallel replicas", (long long)batch,
                  (long long)data);
  TpPlanRequest *req = calloc(1, sizeof *req);
  if (!rc) /* calibrated: one stage first, then the profile's stages and cuts */
    rc = tp_cost_model_init(&req->cm, &hw, &model, calibrate && prof.cuts ? 1 : (int)pipeline, (int)tensor,
                            (int)data, &d);
  if (!rc && calibrate) rc = tp_cost_model_calibrate(&req->cm, &cal, prof.cuts, &d);
  if (rc) {
    free(req);
    tp_calibration_free(&cal);
    tp_profile_free(&prof);
    return cli_exit_code(rc);
  }
  req->cm.uniform_stages = uniform_stages;
  req->cm.untied = !tied;
  req->cm.vocab_split = tokpipec_caps.vocab_pad;
  req->cm.one_region = !tokpipec_caps.transient_region;
  req->cm.precision = precision;
  req->cm.recompute = recompute;
  req->cm.zero = zero;
  req->batch = (int)(batch / data);
  req->granularity = (int)granularity;
  req->schedule = schedule;
  req->chunks = (int)chunks;
  req->max_memory = max_memory >= 0 ? max_memory : hw.memory_bytes;
  req->joint = joint;
  req->untied = !tied;
  req->compilable = true;
  req->caps = tokpipec_caps;
  int S = req->cm.nstages;

  if (predicting) {
    int n;
    int64_t *lengths = cli_parse_slices(slices ? slices : "1", model.seq, &n);
    int *len = malloc(sizeof(int) * (size_t)n); /* the planner's lengths are ints */
    TP_ASSERT(len);
    for (int i = 0; i < n; i++) len[i] = (int)lengths[i];
    free(lengths);
    /* before any output, and M copies of the slices */
    rc = tp_plan_check_units(M * n, S * (chunks ? (int)chunks : 1), &d);
    if (!rc && json) {
      printf("{\n  \"mode\": \"predict\",\n");
      json_model(&model);
      printf("  \"hardware\": ");
      tp_json_write_string(stdout, hw.name);
      printf(",\n  \"pipeline\": %d,\n  \"tensor\": %d,\n  \"data\": %d,\n  \"tied\": %s,\n", S, (int)tensor,
             (int)data, tied ? "true" : "false");
      if (calibrate) json_calibration(&cal, calibrate, &prof);
    } else if (!rc) {
      printf("%s: %d layers, hidden %d, %d heads, sequence %d, vocabulary %d%s\n", model.name, model.layers,
             model.hidden, model.heads, model.seq, model.vocab, tied ? ", tied head" : "");
      if (calibrate) text_calibration(&cal, calibrate, &prof);
      printf("transfers: %s (%s)%s\n", hw.name, hw.device, calibrate ? "" : "; compute: analytic");
    }
    if (!rc) rc = predict(req, (int)M, (int)b, len, n, schedule, json, svg, trace, emit_schedule, &d);
    free(len);
    free(req);
    tp_calibration_free(&cal);
    tp_profile_free(&prof);
    if (!rc && profile_warning[0]) tp_print_line(stderr, "%s", profile_warning);
    return cli_exit_code(rc);
  }

  TpPlanResult *res = calloc(1, sizeof *res);
  TpLayoutSearch layouts = {.best = -1};
  int best = -1;
  if (searching) {
    rc = tp_plan_layouts(req, (int)gpus, (int)fixed[0], (int)fixed[1], (int)fixed[2], (int)batch, &layouts, &d);
    if (!rc) { /* the winner's request and plans are the ones shown */
      *req = layouts.req;
      *res = layouts.result;
      best = layouts.best;
      layouts.best = -1; /* res holds its plans now */
      S = req->cm.nstages;
      tensor = req->cm.tensor;
      data = req->cm.data;
    }
  } else rc = tp_plan(req, res, &d);
  if (rc) {
    free(res);
    free(req);
    tp_calibration_free(&cal);
    tp_profile_free(&prof);
    return cli_exit_code(rc);
  }

  const TpPlanEval *tp = &res->terapipe, *base = &res->baseline, *uni = &res->uniform, *jt = &res->joint;
  char *command = res->has_joint ? tokpipec_command(input ? input : "MODEL.onnx", extra, req, (int)batch, jt) : NULL;
  if (json) {
    printf("{\n");
    json_model(&model);
    printf("  \"hardware\": ");
    tp_json_write_string(stdout, hw.name);
    printf(",\n  \"pipeline\": %d,\n  \"tensor\": %d,\n  \"data\": %d,\n", S, (int)tensor, (int)data);
    if (searching) json_layouts(&layouts, (int)gpus, best);
    if (calibrate) json_calibration(&cal, calibrate, &prof);
    printf("  \"batch\": %d,\n  \"granularity\": %d,\n  \"schedule\": \"%s\",\n", (int)batch, (int)granularity,
           tp_schedule_name(schedule));
    if (chunks) printf("  \"chunks\": %d,\n", (int)chunks);
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
      printf("  \"joint\": {\"iteration_time_s\": %.6g, \"speedup_over_terapipe\": %.4f, \"schedule\": \"%s\", ",
             jt->time_s, tp->time_s / jt->time_s, tp_schedule_name(jt->schedule));
      if (jt->chunks > 1) printf("\"chunks\": %d, ", jt->chunks); /* interleaved */
      printf("\"recompute\": \"%s\", \"precision\": \"%s\", \"zero\": %d, \"stage_cuts\": [",
             tp_recompute_name(jt->recompute), tp_precision_name(jt->precision), jt->zero);
      for (int k = 0; k < S * jt->chunks; k++) printf("%s%d", k ? ", " : "", jt->cuts[k]);
      printf("], \"microbatches\": %d, \"microbatch_size\": %d, \"slices\": ", jt->slicing.n,
             jt->slicing.mb[0].size);
      json_slices(stdout, &jt->slicing);
      printf(", \"peak_memory_bytes\": ");
      json_peaks(stdout, jt, S);
      printf(", \"memory\": ");
      json_memory(jt, S);
      printf(", \"tokpipec\": ");
      tp_json_write_string(stdout, command);
      printf("},\n");
    }
    printf("  \"fits_memory\": %s\n}\n", tp->fits ? "true" : "false");
  } else {
    printf("%s: %d layers, hidden %d, %d heads, sequence %d, vocabulary %d\n", model.name, model.layers,
           model.hidden, model.heads, model.seq, model.vocab);
    printf("%s (%s): %lld devices = pipeline %d x tensor %lld x data %lld; batch %lld (%d per replica)\n", hw.name,
           hw.device, (long long)(S * tensor * data), S, (long long)tensor, (long long)data, (long long)batch,
           req->batch);
    if (searching) text_layouts(&layouts, (int)gpus, best);
    if (calibrate) text_calibration(&cal, calibrate, &prof);
    printf("TeraPipe plan (%s", tp_schedule_name(schedule));
    if (chunks) printf(" x %d chunks", (int)chunks);
    printf(", granularity %d):\n", (int)granularity);
    text_slices(stdout, &tp->slicing);
    printf("  iteration time      %.4g s simulated; Eq. 5 estimate %.4g s (%+.1f%%)\n", tp->time_s, tp->eq5_s,
           100 * (tp->eq5_s - tp->time_s) / tp->time_s);
    printf("  batch-only baseline %.4g s (%d microbatches of %d)  -> speedup %.2fx\n", base->time_s, base->slicing.n,
           base->slicing.mb[0].size, base->time_s / tp->time_s);
    printf("  best uniform        %.4g s (%d slices per microbatch of %d)\n", uni->time_s,
           uni->slicing.mb[0].nslices, uni->slicing.mb[0].size);
    printf("  peak memory per rank (GiB):");
    for (int k = 0; k < S; k++) printf(" %.2f", tp->peak_bytes[k] / (1 << 30));
    printf("%s\n", tp->fits ? "" : "  (does NOT fit)");
    printf("  DP: %d runs in %.3f s; cost table fit error %.2f%% rms, %.2f%% max\n", res->evaluations, res->solve_s,
           100 * res->fit_rms_rel_err, 100 * res->fit_max_rel_err);
    if (res->has_joint) {
      char chunks_text[32] = "";
      if (jt->chunks > 1) snprintf(chunks_text, sizeof chunks_text, " x %d chunks", jt->chunks);
      printf("joint search%s: %.4g s (%.2fx over TeraPipe's plan): %s%s, %s stage cuts, %s%s, recompute %s, max "
             "%.2f GiB\n",
             calibrate ? " (calibrated: the profile's stage cuts and microbatch size, no recomputation)" : "",
             jt->time_s, tp->time_s / jt->time_s, tp_schedule_name(jt->schedule), chunks_text,
             calibrate           ? "the profile's"
             : jt->balanced_cuts ? "balanced"
                                 : "equal",
             tp_precision_name(jt->precision), jt->zero ? " --zero 1" : "", tp_recompute_name(jt->recompute),
             jt->max_peak_bytes / (1 << 30));
      text_slices(stdout, &jt->slicing);
      text_memory(jt, S);
      printf("  compile it with: %s\n", command);
    }
  }

  if (svg || trace || emit_schedule) {
    const TpPlanEval *e = !strcmp(show, "joint")      ? jt
                          : !strcmp(show, "baseline") ? base
                          : !strcmp(show, "uniform")  ? uni
                                                      : tp;
    if (!strcmp(show, "joint") && !res->has_joint) cli_usage_error("--show joint needs the joint search");
    TpSchedule sched;
    TpSimResult sim;
    rc = tp_plan_simulate(req, e, true, &sched, &sim, &d);
    char title[256];
    char chunks_text[32] = "";
    if (e->chunks > 1) snprintf(chunks_text, sizeof chunks_text, " x %d chunks", e->chunks);
    snprintf(title, sizeof title, "%s on %s: pipeline %d x tensor %lld, %s plan, %s%s: %.4g s", model.name, hw.name,
             S, (long long)tensor, show, tp_schedule_name(e->schedule), chunks_text, sim.time_s);
    if (!rc) rc = show_plan(&sim, &sched, title, emit_schedule, svg, trace, &d);
    tp_sim_result_free(&sim);
    tp_schedule_free(&sched);
  }
  tp_plan_result_free(res);
  tp_layout_search_free(&layouts);
  free(command);
  free(res);
  free(req);
  tp_calibration_free(&cal);
  tp_profile_free(&prof);
  if (!rc && profile_warning[0]) tp_print_line(stderr, "%s", profile_warning);
  return cli_exit_code(rc);
}
