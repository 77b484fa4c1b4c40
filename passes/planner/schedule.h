/* Pipeline schedules: per-rank instruction lists over (microbatch, slice) units. These
 * are the lists the compiler emits into a generated trainer and the planner simulates.
 *
 * Rank k runs stage k of one pipeline replica. A unit is slice `slice` of microbatch `mb`.
 * Instructions, in program order per rank:
 *   forward U      run stage k's forward of unit U (needs its input activation)
 *   backward U     run stage k's backward of U (needs the gradient of its output)
 *   backward-input U   the first part of a split backward (zero-bubble schedules): the
 *                  gradients of U's inputs (activations, the K/V context of earlier slices),
 *                  which the previous stage waits for
 *   backward-weight U  the second part: U's parameter gradients, from values its
 *                  backward-input kept; it may run later, in an idle slot. A unit has either
 *                  backward, or backward-input then backward-weight.
 *   send-act U     send U's output activation to rank k+1   (non-blocking)
 *   recv-act U     receive U's input activation from rank k-1 (blocking)
 *   send-grad U    send the gradient of U's input to rank k-1 (non-blocking)
 *   recv-grad U    receive the gradient of U's output from rank k+1 (blocking)
 *   allreduce-tied sum the tied embedding/head gradients with `peer` (first <-> last rank)
 *   allreduce      average gradients across the data-parallel replicas of this stage
 *   optimizer-step update this stage's parameters
 * Sends are non-blocking: the runtime posts them (MPI_Isend) and completes them before
 * the buffer is reused or at the step's end. gpipe lists also survive blocking sends;
 * 1f1b lists do not (rank k sends an activation while rank k+1 sends it a gradient). Slices of a microbatch run forward in order
 * 0..N-1 and backward in order N-1..0 on every rank (as in TeraPipe: a slice's keys and
 * values are the context of the slices after it). */
#ifndef TOKPIPE_PLANNER_SCHEDULE_H
#define TOKPIPE_PLANNER_SCHEDULE_H

#include <stdbool.h>
#include <stdio.h>

#include "ir/ir.h"

/* zb: zero-bubble ZB-H1 (split backwards, 1F1B's memory); interleaved: each rank runs
 * `chunks` virtual stages (Megatron's interleaved 1F1B). */
typedef enum { TP_SCHEDULE_GPIPE, TP_SCHEDULE_1F1B, TP_SCHEDULE_ZB, TP_SCHEDULE_INTERLEAVED } TpScheduleKind;

typedef enum {
  TP_INSN_FORWARD,
  TP_INSN_BACKWARD,
  TP_INSN_SEND_ACT,
  TP_INSN_RECV_ACT,
  TP_INSN_SEND_GRAD,
  TP_INSN_RECV_GRAD,
  TP_INSN_ALLREDUCE_TIED,
  TP_INSN_ALLREDUCE,
  TP_INSN_OPTIMIZER_STEP,
  TP_INSN_BACKWARD_INPUT,
  TP_INSN_BACKWARD_WEIGHT,
  TP_INSN_COUNT
} TpInsnKind;

typedef struct {
  TpInsnKind kind;
  int mb, slice; /* the unit; -1 for the step-level instructions */
  int peer;      /* the other rank of a send, receive or allreduce-tied; else -1 */
  int chunk;     /* interleaved: which of the rank's virtual stages (rank k's chunk c is
                    virtual stage c * stages + k); 0 otherwise. For a send or receive, the
                    sender's or receiver's own chunk (the peer's follows from it). */
} TpInsn;

typedef struct {
  TpScheduleKind kind;
  int stages; /* ranks (interleaved: each runs `chunks` virtual stages) */
  int chunks; /* virtual stages per rank: V >= 2 for interleaved, else 1 */
  int nmb;
  int *nslices;  /* [nmb] slices of each microbatch */
  int *count;    /* [stages] instructions per rank */
  TpInsn **insn; /* [stages][count] */
} TpSchedule;

typedef struct {
  TpScheduleKind kind;
  int stages;
  int nmb;
  const int *nslices;
  bool data_parallel;  /* emit allreduce (data-parallel degree > 1) */
  bool tied_embedding; /* embedding and LM head share a parameter across first and last */
  int chunks;          /* interleaved: virtual stages per rank (>= 2); 0 or 1 otherwise */
} TpScheduleSpec;

const char *tp_schedule_name(TpScheduleKind k);
/* "gpipe", "1f1b", "zb" or "interleaved"; false if none. */
bool tp_schedule_parse(const char *name, TpScheduleKind *k);
const char *tp_insn_name(TpInsnKind k);

/* gpipe, 1f1b; zb: ZB-H1 with 1F1B's arenas on every rank, W units deferred into idle
 * slots (schedule.c says how the lists are chosen); and interleaved: Megatron's interleaved
 * 1F1B over virtual stages, units (mb, slice). Rank k's chunk c is virtual stage
 * j = c * stages + k; activations of j go to j + 1 (rank stages-1's chunk c sends to rank
 * 0's chunk c + 1), gradients back. Every rank runs the
 * same forward order: the units in groups of whole microbatches of at least `stages` units
 * (the last group may be smaller), each group through chunk 0, then chunk 1, ...;
 * backwards likewise over the backward order (later slices first), chunks V-1 down to 0.
 * The lists interleave the two orders as the ranks would run them with equal unit costs:
 * rank k runs Megatron's warm-up of 2 (stages - k - 1) + (V - 1) x stages forwards, then
 * one forward and one backward in turn; a backward of microbatch mb waits until the rank
 * has run mb's last slice forward on its last chunk and 2 (stages - k - 1) forwards more;
 * a rank whose next forward is not there yet runs its next backward if that is. Any
 * microbatch count works (a short last group leaves a bubble). allreduce-tied pairs
 * virtual stage 0 (rank 0, chunk 0) with the last one (rank stages-1, chunk V-1). */
/* The spec's kind and chunks agree (interleaved: stages >= 2 and 2 <= chunks <=
 * TP_SCHEDULE_MAX_CHUNKS; the others: chunks 0 or 1); else one input error naming them. */
#define TP_SCHEDULE_MAX_CHUNKS 64
int tp_schedule_check_spec(const TpScheduleSpec *spec, TpDiag *d);
/* Builds the lists of a spec that tp_schedule_check_spec accepts. */
void tp_schedule_build(const TpScheduleSpec *spec, TpSchedule *out);
/* A schedule with empty lists, for building one by hand with tp_schedule_push. */
void tp_schedule_init(TpSchedule *s, TpScheduleKind kind, int stages, int nmb, const int *nslices);
void tp_schedule_push(TpSchedule *s, int rank, TpInsn insn);
void tp_schedule_free(TpSchedule *s);

/* The virtual stage rank k's instruction x talks to: j + 1 for send-act and recv-grad, j - 1
 * for recv-act and send-grad (j = x->chunk * stages + k), the other end (0 or the last)
 * for allreduce-tied; -1 when there is none (the pipeline's first or last virtual stage)
 * or x is no message. With chunks == 1 it is a rank. Generated plans name this stage as
 * the instruction's peer (runtime/train/plan.h). */
int tp_schedule_peer_stage(const TpSchedule *s, int k, const TpInsn *x);

/* Checks: every unit runs forward then backward exactly once per rank and chunk, slices in
 * order (a split backward: backward-input, later slices first, then backward-weight; a unit
 * never has both a backward and a split one; the backward-weights of one microbatch run in
 * its backward-inputs' order and are not interleaved with another microbatch's, as the
 * runtime sums a microbatch's parameter gradients in one go); every send has exactly one matching receive (same unit, kind, ranks, and the
 * chunks of adjacent virtual stages) and vice versa;
 * and running all ranks (sends non-blocking, or blocking until received if `rendezvous`)
 * ends with every rank done. The first problem is reported (TP_ERR_INPUT); a deadlock
 * names the instruction each stuck rank waits at. */
int tp_schedule_verify(const TpSchedule *s, bool rendezvous, TpDiag *d);

/* Readable text: a header line, then "rank K:" and one instruction per line. */
void tp_schedule_print(const TpSchedule *s, FILE *out);

/* The microbatch arenas rank k holds: the fewest such that the microbatches alive at once
 * (from their first instruction to their last: a split backward's last backward-weight
 * keeps its microbatch alive) have distinct mb % arenas (microbatch mb
 * uses arena mb % arenas). The compiler's and the planner's count. */
int tp_schedule_arenas(const TpSchedule *s, int k);
/* The same for rank k's chunk c alone (its instructions with chunk c): the arenas of
 * virtual stage c * stages + k. With chunks == 1, chunk 0 gives tp_schedule_arenas. */
int tp_schedule_chunk_arenas(const TpSchedule *s, int k, int chunk);

#endif
