/* The pipeline of a plan (see codegen.h): requires a module's memory plan (stages, slices,
 * parameter placement, arena and transient region sizes); provides the verified schedule of
 * every rank, the microbatch arenas each rank keeps alive, and its memory. */
#include "codegen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/train/plan.h"

/* The plan's instruction kinds are the schedule's (plan.h cannot include the compiler). */
_Static_assert((int)TP_PLAN_FORWARD == (int)TP_INSN_FORWARD && (int)TP_PLAN_RECV_GRAD == (int)TP_INSN_RECV_GRAD &&
                   (int)TP_PLAN_ALLREDUCE_TIED == (int)TP_INSN_ALLREDUCE_TIED &&
                   (int)TP_PLAN_OPTIMIZER_STEP == (int)TP_INSN_OPTIMIZER_STEP &&
                   (int)TP_PLAN_BACKWARD_WEIGHT == (int)TP_INSN_BACKWARD_WEIGHT,
               "plan.h's TpPlanInsnKind follows schedule.h's TpInsnKind");

int tp_tensor_ranks(const TpModule *m) {
  int n = m->tensor > 1 ? m->tensor : 1;
  for (int v = 0; v < m->nvalues && n == 1; v++)
    if (m->values[v].kind == TP_VAL_PARAM && m->values[v].shard.parts) n = m->values[v].shard.ranks;
  return n;
}

/* Is a parameter split into fewer parts than the tensor group has ranks (grouped K/V heads
 * fewer than the ranks)? Each rank holding a piece then has a partial gradient of it, which
 * the schedule's allreduce sums over the ranks sharing the piece (runtime/train/plan.h). */
static bool shared_pieces(const TpModule *m, const TpMemoryPlan *mem) {
  for (int i = 0; i < mem->nparams; i++) {
    const TpShard *sh = &m->values[mem->params[i]].shard;
    if (sh->parts && sh->parts < sh->ranks) return true;
  }
  return false;
}

int tp_pipeline_build(const TpModule *m, TpMemoryPlan *mem, const TpPipelineOptions *o, TpPipeline *pl, TpDiag *d) {
  static const TpPipelineOptions one = {.microbatches = 1, .dp = 1, .kind = TP_SCHEDULE_GPIPE};
  *pl = (TpPipeline){.o = o ? *o : one, .tensor = tp_tensor_ranks(m)};
  /* interleaved: the memory plan's stages are the S * V virtual stages, rank k running
   * k, k + S, ..., k + (V - 1) * S */
  int V = pl->o.kind == TP_SCHEDULE_INTERLEAVED && pl->o.chunks > 1 ? pl->o.chunks : 1;
  int VS = mem->nstages, S = VS / V, M = pl->o.microbatches;
  TP_ASSERT(M >= 1 && pl->o.dp >= 1 && S * V == VS);
  pl->chunks = V;
  for (int i = 0; i < mem->nparams; i++) pl->tied |= mem->param_tied_stage[i] != 0;
  int *nslices = malloc(sizeof(int) * (size_t)M);
  TP_ASSERT(nslices);
  for (int mb = 0; mb < M; mb++) nslices[mb] = mem->nslices;
  TpScheduleSpec spec = {.kind = pl->o.kind,
                         .stages = S,
                         .nmb = M,
                         .nslices = nslices,
                         .data_parallel = pl->o.dp > 1 || shared_pieces(m, mem),
                         .tied_embedding = pl->tied,
                         .chunks = V};
  tp_schedule_build(&spec, &pl->schedule);
  free(nslices);
  TpDiag quiet;
  tp_diag_init(&quiet, d->tool, d->file, NULL);
  if (tp_schedule_verify(&pl->schedule, false, &quiet) != TP_OK) {
    int rc = tp_internal(d,
                         "compiler bug: the %s schedule of %d stages x %d microbatches x %d slices fails "
                         "verification: %s",
                         tp_schedule_name(pl->o.kind), S, M, mem->nslices, quiet.last);
    tp_pipeline_free(pl);
    return rc;
  }
  pl->arenas = calloc((size_t)VS, sizeof *pl->arenas);
  pl->memory = calloc((size_t)S, sizeof *pl->memory);
  pl->whole = calloc((size_t)S, sizeof *pl->whole);
  TpRankMemoryInput *in = pl->input = calloc((size_t)S, sizeof *in), *whole = calloc((size_t)S, sizeof *whole);
  TP_ASSERT(pl->arenas && pl->memory && pl->whole && in && whole);
  for (int k = 0; k < S; k++) {
    in[k] = (TpRankMemoryInput){.precision = pl->o.precision,
                                .microbatches = M,
                                .zero_shards = pl->o.zero ? pl->o.dp : 1};
    whole[k] = in[k];
  }
  for (int i = 0; i < mem->nparams; i++) {
    int v = mem->params[i];
    const TpValue *val = &m->values[v];
    int64_t n = tp_type_numel(&val->type), parts = val->shard.parts, unsplit = n * (parts ? parts : 1);
    if (val->shard.pad) /* a rank holds its padded piece; the unsplit model, the true vocabulary */
      unsplit = n / val->type.dims[val->shard.axis] * (val->type.dims[val->shard.axis] * parts - val->shard.pad);
    bool trained = m->grads && tp_grad_of(m, v) >= 0;
    int tied = mem->param_tied_stage[i];
    for (int k = 0; k < S; k++) {
      if (k != mem->param_stage[i] % S && (!tied || k != tied % S)) continue;
      *(trained ? &in[k].trained : &in[k].frozen) += n;
      *(trained ? &whole[k].trained : &whole[k].frozen) += unsplit;
    }
  }
  for (int s = 0; s < VS; s++) {
    int k = s % S;
    pl->arenas[s] = tp_schedule_chunk_arenas(&pl->schedule, k, s / S);
    double a = pl->arenas[s]; /* (compared in double: the products may pass 2^63) */
    /* one region in place of arena and transient region, where that is no more bytes (not
     * for a rank of several virtual stages: their units share its transient region) */
    if (V == 1 && mem->transient_bytes[s] && !mem->split && /* a weight part's buffers must stay out of the arena */
        a * (double)mem->one_region_bytes[s] <= a * (double)mem->arena_bytes[s] + (double)mem->transient_bytes[s])
      tp_memory_one_region(m, mem, s);
    if (s < S) {
      in[k].arenas = pl->arenas[s];
      in[k].kept = mem->arena_bytes[s];
    } else if (pl->arenas[s] && (double)mem->arena_bytes[s] * pl->arenas[s] + (double)in[k].chunks_kept < 0x1p62) {
      in[k].chunks_kept += mem->arena_bytes[s] * pl->arenas[s];
    } else {
      in[k].chunks_kept = INT64_MAX; /* refused below */
    }
    if (mem->transient_bytes[s] > in[k].transient) in[k].transient = mem->transient_bytes[s];
  }
  int rc = TP_OK;
  for (int k = 0; k < S && rc == TP_OK; k++) {
    TpRankMemory w;
    tp_rank_memory(&whole[k], &w);
    pl->whole[k] = w.peak;
    if (!tp_rank_memory(&in[k], &pl->memory[k]))
      rc = tp_error(d,
                    "rank %d (pipeline stage %d) would need %d microbatch arena%s of %lld bytes and %lld "
                    "transient bytes: more than 2^63 bytes in all (lower --batch, --seq or --microbatches)",
                    k, k, pl->arenas[k], pl->arenas[k] == 1 ? "" : "s", (long long)mem->arena_bytes[k],
                    (long long)mem->transient_bytes[k]);
  }
  free(whole);
  if (rc != TP_OK) tp_pipeline_free(pl);
  return rc;
}

void tp_pipeline_free(TpPipeline *pl) {
  if (pl->schedule.count) tp_schedule_free(&pl->schedule);
  free(pl->arenas);
  free(pl->memory);
  free(pl->whole);
  free(pl->input);
  *pl = (TpPipeline){0};
}

int tp_pipeline_check_memory(const TpPipeline *pl, int64_t max_bytes, const char *limit, const char *hint,
                             TpDiag *d) {
  int rc = TP_OK;
  char tensor[64] = ""; /* the first tensor rank of the stage speaks for all of them */
  if (pl->tensor > 1) snprintf(tensor, sizeof tensor, ", tensor rank 0 of %d, the others alike", pl->tensor);
  for (int k = 0; k < pl->schedule.stages; k++) {
    const TpRankMemory *r = &pl->memory[k];
    if (r->peak <= max_bytes) continue;
    char masters[64] = "";
    if (r->masters) snprintf(masters, sizeof masters, ", fp32 master weights %lld", (long long)r->masters);
    rc = tp_error(d,
                  "rank %d (pipeline stage %d%s%s) needs %lld bytes at its peak, %lld more than %s "
                  "%lld: parameters %lld, gradients %lld%s, optimizer state %lld, activations %lld (%d microbatch "
                  "arena%s of %lld bytes and a transient region of %lld)%s",
                  k * pl->tensor, k, tensor, pl->o.dp > 1 ? ", as in every replica" : "", (long long)r->peak,
                  (long long)(r->peak - max_bytes), limit, (long long)max_bytes, (long long)r->params,
                  (long long)r->grads, masters, (long long)r->state, (long long)r->activations, pl->arenas[k],
                  pl->arenas[k] == 1 ? "" : "s", (long long)pl->input[k].kept, (long long)pl->input[k].transient,
                  hint ? hint : "");
  }
  return rc;
}
