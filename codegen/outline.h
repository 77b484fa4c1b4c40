/* Outlining (codegen/outline.c): the runs of ops that several units of a plan run alike,
 * found on their lowered statements (codegen/lower.h), the way LLVM's MachineOutliner finds
 * repeated instruction sequences on MIR. A unit is one stage's forward or backward of one
 * token slice; its ops fall into runs that other units run too, equal up to a renaming of
 * their values and to their arena offsets and parameter indices: a layer (the kernels of
 * layer 5 are those of layer 4 on other parameters, at other offsets), or a middle stage's
 * whole unit. Each distinct run shared by two or more is a body that codegen/emit_c.c
 * writes once, as a function taking those numbers, and every unit running it calls it with
 * its own; the plan thus grows with the distinct layer shapes and (slice length, context)
 * pairs, not with layers x slices.
 *
 * Candidate runs are found on op keys (kind, attributes, operand types and storage kinds):
 * the repeats within a unit (its layers), else a unit's whole op list where other units
 * have the same one (a middle stage). Each candidate is then lowered alone, and only runs
 * whose statements are equal share a body, so the key only decides where to look. */
#ifndef TOKPIPE_CODEGEN_OUTLINE_H
#define TOKPIPE_CODEGEN_OUTLINE_H

#include "lower.h"

/* A unit of the plan: stage s's forward or backward of one slice (split backwards: its
 * input part, or with `weight` its weight part). */
typedef struct {
  int s, slice;
  bool backward, weight;
} TpUnitId;

/* A run of a unit's ops: positions [begin, end) of its stage's order. */
typedef struct {
  int unit;
  int begin, end;
  int body;      /* the shared body it calls, or -1: lowered with its unit */
  TpLowFunc low; /* the run lowered alone: kept for its body's first run (printed) */
  int64_t *at;   /* its arena offsets, in order of use (the body's `at`); a transient
                    region's offset + 1 (odd: offsets are multiples of TP_ARENA_ALIGN) */
  int *p;        /* its parameter indices, in order of use (the body's `p`) */
  int nat, np;
  int table;      /* its arena offsets: list `table` of its body's (runs alike share one) */
  bool new_table; /* the first run with that list */
} TpRun;

/* A distinct run; shared when count >= 2. */
typedef struct {
  int first;     /* its first run */
  int count;     /* runs with it */
  int ntables;   /* distinct arena offset lists of its runs */
  bool contexts; /* its runs follow contexts of different lengths */
  bool regions;  /* a run's offset is the transient region's: tp_plan_at addresses them */
} TpBody;

typedef struct {
  int nunits;
  TpUnitId *units;
  int *first_run, *nruns; /* per unit: its runs, in order */
  int nrun;
  TpRun *runs;
  int nbodies;
  TpBody *bodies;
} TpOutline;

/* Outlines the units[0, n) of L's plan. On error (a run that cannot be lowered) the error
 * of the lowering; *o is freed by tp_outline_free either way. */
int tp_outline(const TpLowering *L, const TpUnitId *units, int n, TpOutline *o);
void tp_outline_free(TpOutline *o);

/* The ranges of unit u's runs with a shared body (malloc'd, *n of them), for tp_lower_range;
 * calls[k] is the run of range k. */
TpLowRange *tp_outline_calls(const TpOutline *o, int u, int *calls, int *n);

/* FNV-1a of a string. */
uint64_t tp_hash_str(const char *s);

#endif
