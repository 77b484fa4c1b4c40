/* Event simulation of per-rank instruction lists (schedule.h) with per-unit costs:
 * iteration time, per-rank compute and peak memory, and the timeline as events for
 * pictures (SVG) and Chrome/Perfetto traces.
 *
 * Semantics: a rank runs its list in order; compute instructions take their cost; a send
 * is posted when reached and occupies its link (one message at a time per direction of
 * each stage boundary), arriving after its transfer time; a receive waits for arrival;
 * allreduce-tied waits for both ranks. Memory: each rank's peak by codegen/rank_memory.h,
 * the compiler's own model: parameters, gradients and optimizer state, the microbatch
 * arenas its list keeps alive at once (tp_schedule_arenas) of the largest microbatch's kept
 * bytes each, and one transient region of its largest unit. A rank of several chunks
 * (interleaved) holds the parameters of all of them, each chunk's arenas
 * (tp_schedule_chunk_arenas) of that virtual stage's kept bytes, and one transient region
 * of its largest unit; its all-reduce and optimizer step take its chunks' times together.
 * Links: one per direction between neighbouring ranks (interleaved: rank S-1 to 0 too). */
#ifndef TOKPIPE_PLANNER_SIMULATE_H
#define TOKPIPE_PLANNER_SIMULATE_H

#include <stdio.h>

#include "cost.h"
#include "schedule.h"
#include "slicing.h"

/* Per stage, and with an interleaved schedule per virtual stage j (rank j % ranks, chunk
 * j / ranks): `stages` counts them. */
typedef struct {
  int stages, nmb, units;
  int *base;                     /* [nmb] index of a microbatch's first unit */
  double *fwd, *bwd;             /* [stage * units + u] seconds */
  double *wgt;                   /* [stage * units + u] the seconds of bwd that compute parameter
                                    gradients: a split backward's backward-weight; its
                                    backward-input takes the rest. NULL: none */
  double *send;                  /* [boundary k (k -> k+1) * units + u]: activation or its gradient */
  TpRankMemoryInput *memory;     /* [stage]: arenas filled in by the simulation */
  double *allreduce, *optimizer; /* [stage] */
  double tied_allreduce;         /* first <-> last rank */
} TpSimCosts;

/* Costs of `plan` under cm (cm's stage cuts, recomputation, precision, ZeRO). */
void tp_sim_costs_from_model(const TpCostModel *cm, const TpSlicing *plan, TpSimCosts *c);
void tp_sim_costs_free(TpSimCosts *c);

typedef struct {
  double start, end;
  int rank;
  TpInsnKind kind; /* forward, backward, send-* (a transfer on its link), allreduce... */
  int mb, slice;
  int chunk; /* interleaved: the rank's virtual stage; else 0 */
} TpEvent;

/* Per rank (an interleaved rank: all its chunks together). */
typedef struct {
  double time_s;        /* when the last rank finishes */
  double *busy_s;       /* [stage] compute seconds */
  double *peak_bytes;   /* [stage] */
  TpRankMemory *memory; /* [stage]: what peak_bytes adds up */
  TpEvent *events;      /* when recorded */
  int nevents;
} TpSimResult;

/* Runs the schedule. A deadlock is reported (TP_ERR_INPUT). `record` keeps events. */
int tp_simulate(const TpSchedule *s, const TpSimCosts *c, bool record, TpSimResult *r, TpDiag *d);
void tp_sim_result_free(TpSimResult *r);

/* Pictures of a recorded run: ranks as rows, units coloured by microbatch (hue) and
 * slice (lightness), backward hatched and darker, bubbles left blank. */
void tp_write_svg(const TpSimResult *r, const TpSchedule *s, const char *title, FILE *out);
/* Chrome trace event format (chrome://tracing, ui.perfetto.dev): one process per rank,
 * thread 0 compute, thread 1 sends. */
void tp_write_trace(const TpSimResult *r, const TpSchedule *s, FILE *out);

#endif
