/* The schedule tests' shared parts: CHECK (check.h) and the costs of equal stages. */
#ifndef TOKPIPE_TESTS_PLANNER_UNIFORM_COSTS_H
#define TOKPIPE_TESTS_PLANNER_UNIFORM_COSTS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "passes/planner/simulate.h"

/* `stages` equal stages (virtual ones for interleaved lists): forward f and backward b per
 * unit, free transfers, one byte kept per microbatch (so peaks count arenas). A split
 * backward: half and half, except on the first stage (it sends no gradient: all weight
 * part). */
static void uniform_costs(TpSimCosts *c, int stages, int nmb, const int *nslices, double f, double b) {
  memset(c, 0, sizeof *c);
  c->stages = stages;
  c->nmb = nmb;
  c->base = calloc((size_t)nmb, sizeof(int));
  for (int m = 0; m < nmb; m++) c->base[m] = c->units, c->units += nslices[m];
  size_t su = (size_t)stages * c->units;
  c->fwd = calloc(su, sizeof(double));
  c->bwd = calloc(su, sizeof(double));
  c->send = calloc(su, sizeof(double));
  c->memory = calloc((size_t)stages, sizeof *c->memory);
  c->allreduce = calloc((size_t)stages, sizeof(double));
  c->optimizer = calloc((size_t)stages, sizeof(double));
  c->wgt = calloc(su, sizeof(double));
  for (size_t i = 0; i < su; i++) c->fwd[i] = f, c->bwd[i] = b, c->wgt[i] = i < (size_t)c->units ? b : b / 2;
  for (int k = 0; k < stages; k++) c->memory[k] = (TpRankMemoryInput){.microbatches = nmb, .kept = 1};
}

#endif
