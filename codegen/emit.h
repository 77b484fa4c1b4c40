/* What codegen/emit_c.c (the functions) and codegen/plan_tables.c (the TpPlan tables) of
 * one plan.c share: the names of the unit functions and the facts the tables print. */
#ifndef TOKPIPE_CODEGEN_EMIT_H
#define TOKPIPE_CODEGEN_EMIT_H

#include <stdbool.h>
#include <stdio.h>

#include "codegen.h"
#include "target.h"

/* What the tables need of a profiling probe. */
typedef struct {
  int nslices, probed; /* the probed slice; the ones before it are the setup */
  int64_t b;
  int64_t *arena_bytes, *transient_bytes; /* per stage */
} TpProbeInfo;

typedef struct {
  const TpModule *m;
  const TpMemoryPlan *mem;
  const TpEmitOptions *o;
  const TpPipeline *pipe;
  const TpProbeInfo *probe; /* per probe of o */
  const TpTarget *target;
  int tensor; /* the ranks of the tensor group (1: none) */
} TpPlanTables;

/* The name of stage s's function of (phase, slice): stageS_forward in unsliced plans,
 * else stageS_forward_sliceI; a probe's with its prefix (probeP_stageS_...). */
void tp_unit_name(const char *prefix, int nslices, int s, const char *phase, int slice, char *buf, size_t n);
/* "forward", "backward", or a split backward's "backward_input" or "backward_weight". */
const char *tp_unit_phase(bool backward, bool weight, bool split);

/* The TpPlan tables and main (codegen/plan_tables.c): the parameters, re-tied initializers,
 * slices, arenas, per stage its unit functions, boundary messages and instruction list,
 * the probes; on a device target the plan names its TpPlanDevice. */
void tp_emit_plan_tables(const TpPlanTables *t, FILE *out);

#endif
