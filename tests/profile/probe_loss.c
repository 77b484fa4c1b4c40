/* probe_loss, compiled by run.sh with a generated one-stage plan.c included (-DPLAN_C=
 * "FILE"): every profiling probe whose slice ends the sequence (c + l = seq) computes,
 * after its setup forwards, the loss of the plan's own forward on the same parameters and
 * tokens (within 1e-5; the slices sum it in another order). A probe that read a wrong
 * parameter (its indices are remapped to the plan's by name) or a wrong context would not.
 * Exit 0 or 1. */
#define main plan_main
#include PLAN_C
#undef main

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *zeroed(size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, bytes ? bytes : 64);
  if (!p) abort();
  memset(p, 0, bytes ? bytes : 64);
  return p;
}

int main(void) {
  const TpPlan *P = &tp_plan;
  if (P->nstages != 1 || !P->nprobes) return fprintf(stderr, "probe_loss: needs a one-stage plan with probes\n"), 2;
  float **param = calloc((size_t)P->nparams, sizeof *param), **grad = calloc((size_t)P->nparams, sizeof *grad);
  for (int i = 0; i < P->nparams; i++) {
    int64_t n = tp_numel(P->params[i].rank, P->params[i].dims);
    param[i] = zeroed((size_t)n * 4), grad[i] = zeroed((size_t)n * 4);
    for (int64_t j = 0; j < n; j++) param[i][j] = 0.05f * sinf((float)(j * 7 + i * 131) * 0.37f) + (i % 3 == 0);
  }
  int64_t nt = P->batch * P->seq, *tokens = malloc((size_t)nt * 8), *targets = malloc((size_t)nt * 8);
  for (int64_t j = 0; j < nt; j++) tokens[j] = (j * 31 + 5) % P->vocab, targets[j] = (j * 17 + 3) % P->vocab;
  TpStepIO io = {.arena = zeroed(P->stages[0].arena_bytes),
                 .transient = zeroed(P->stages[0].transient_bytes),
                 .param = param,
                 .grad = grad,
                 .tokens = tokens,
                 .targets = targets,
                 .loss = NAN};
  for (int i = 0; i < P->nslices; i++) P->stages[0].forward[i](&io);
  double want = io.loss;
  free(io.arena), free(io.transient);
  int checked = 0, bad = !isfinite(want);
  for (int p = 0; p < P->nprobes; p++) {
    const TpPlanProbe *pr = &P->probes[p];
    if (pr->c + pr->l != P->seq) continue;
    const TpPlanProbeStage *ps = &pr->stages[0];
    io.arena = zeroed(ps->arena_bytes);
    io.transient = zeroed(ps->transient_bytes);
    io.loss = NAN;
    for (int i = 0; i < ps->nsetup; i++) ps->setup[i](&io);
    ps->forward(&io);
    bool same = fabs(io.loss - want) <= 1e-5 * fabs(want);
    printf("probe (l %lld, c %lld): loss %.7g, the plan's %.7g%s\n", (long long)pr->l, (long long)pr->c, io.loss,
           want, same ? "" : "  DIFFERENT");
    bad |= !same;
    checked++;
    free(io.arena), free(io.transient);
  }
  for (int i = 0; i < P->nparams; i++) free(param[i]), free(grad[i]);
  free(param), free(grad), free(tokens), free(targets);
  return bad || checked < 2;
}
