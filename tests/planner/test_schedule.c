/* Schedules: for a grid of (stages, microbatches, slices) both built schedules verify
 * (every send matched once, no deadlock) and the simulation agrees with the closed form
 * of an equal-stage pipeline; 1f1b holds no more memory than gpipe; hand-made broken
 * lists (a crossed send/receive, a missing receive, a backward before its forward) are
 * refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/planner/simulate.h"

static int failures;
#define CHECK(cond, ...)                                                                                            \
  do {                                                                                                              \
    if (!(cond)) {                                                                                                  \
      printf("FAIL: " __VA_ARGS__);                                                                                 \
      printf("\n");                                                                                                 \
      failures++;                                                                                                   \
    }                                                                                                               \
  } while (0)

/* Equal stages: forward f and backward b per unit, free transfers. */
static void uniform_costs(TpSimCosts *c, int S, int nmb, const int *nslices, double f, double b) {
  memset(c, 0, sizeof *c);
  c->stages = S;
  c->nmb = nmb;
  c->base = calloc((size_t)nmb, sizeof(int));
  for (int m = 0; m < nmb; m++) c->base[m] = c->units, c->units += nslices[m];
  size_t su = (size_t)S * c->units;
  c->fwd = calloc(su, sizeof(double));
  c->bwd = calloc(su, sizeof(double));
  c->send = calloc(su, sizeof(double));
  c->memory = calloc((size_t)S, sizeof *c->memory);
  c->allreduce = calloc((size_t)S, sizeof(double));
  c->optimizer = calloc((size_t)S, sizeof(double));
  for (size_t i = 0; i < su; i++) c->fwd[i] = f, c->bwd[i] = b;
  for (int k = 0; k < S; k++) c->memory[k] = (TpRankMemoryInput){.microbatches = nmb, .kept = 1}; /* peak: arenas */
}

static void grid(void) {
  int checked = 0;
  for (int S = 1; S <= 6; S++)
    for (int M = 1; M <= 4; M++)
      for (int N = 1; N <= 4; N++)
        for (int kind = 0; kind < 2; kind++) {
          int nslices[4];
          for (int m = 0; m < M; m++) nslices[m] = N + (m % 2) * (S % 2); /* uneven across microbatches for odd S */
          TpScheduleSpec spec = {kind ? TP_SCHEDULE_1F1B : TP_SCHEDULE_GPIPE, S, M, nslices, true, true, 0};
          TpSchedule s;
          tp_schedule_build(&spec, &s);
          TpDiag d;
          tp_diag_init(&d, "test_schedule", NULL, stderr);
          CHECK(tp_schedule_verify(&s, false, &d) == TP_OK, "%s S=%d M=%d N=%d does not verify",
                tp_schedule_name(spec.kind), S, M, N);
          /* gpipe even survives blocking sends (MPI_Send without buffering); 1f1b needs
           * the non-blocking sends schedule.h prescribes (rank k sends an activation
           * while rank k+1 sends it a gradient) */
          TpDiag quiet;
          tp_diag_init(&quiet, "test_schedule", NULL, NULL);
          CHECK(kind == 1 || tp_schedule_verify(&s, true, &quiet) == TP_OK, "%s S=%d M=%d N=%d: %s",
                tp_schedule_name(spec.kind), S, M, N, quiet.last);
          TpSimCosts c;
          uniform_costs(&c, S, M, nslices, 1, 2);
          TpSimResult r;
          CHECK(tp_simulate(&s, &c, false, &r, &d) == TP_OK, "simulation failed");
          int U = c.units;
          if (kind == 0) /* gpipe, equal stages: (U + S - 1) beats forward and backward */
            CHECK(r.time_s == (U + S - 1) * 3.0, "gpipe S=%d U=%d: time %g, want %g", S, U, r.time_s,
                  (U + S - 1) * 3.0);
          else { /* 1f1b: no slower than gpipe here, about S - k microbatches in flight */
            CHECK(r.time_s <= (U + S - 1) * 3.0 + 1e-9, "1f1b S=%d U=%d slower: %g", S, U, r.time_s);
            for (int k = 0; k < S; k++) {
              int bound = S - k + 1 < M ? S - k + 1 : M;
              CHECK(r.peak_bytes[k] <= bound, "1f1b rank %d holds %g microbatch arenas > %d", k, r.peak_bytes[k],
                    bound);
            }
          }
          for (int k = 0; kind == 0 && k < S; k++) /* gpipe keeps every microbatch */
            CHECK(r.peak_bytes[k] == M, "gpipe rank %d holds %g microbatch arenas, not %d", k, r.peak_bytes[k], M);
          tp_sim_result_free(&r);
          tp_sim_costs_free(&c);
          tp_schedule_free(&s);
          checked++;
        }
  printf("%d schedules verified and simulated\n", checked);
}

static int expect_refused(TpSchedule *s, const char *what, const char *needle) {
  TpDiag d;
  tp_diag_init(&d, "test_schedule", NULL, NULL);
  int rc = tp_schedule_verify(s, false, &d);
  CHECK(rc == TP_ERR_INPUT && strstr(d.last, needle), "%s: not refused as '%s' (got rc %d: %s)", what, needle, rc,
        d.last);
  return rc;
}

static void broken(void) {
  int ns[1] = {2};
  TpScheduleSpec spec = {TP_SCHEDULE_GPIPE, 2, 1, ns, false, false, 0};
  TpSchedule s;
  /* crossed: rank 1 receives slice 1 before slice 0 while rank 0 sends 0 then 1 is fine
   * with tags, but receiving slice 0's activation as a gradient is not */
  tp_schedule_build(&spec, &s);
  for (int i = 0; i < s.count[1]; i++)
    if (s.insn[1][i].kind == TP_INSN_RECV_ACT && s.insn[1][i].slice == 0) s.insn[1][i].kind = TP_INSN_RECV_GRAD;
  expect_refused(&s, "crossed send/receive", "no matching");
  tp_schedule_free(&s);
  /* a deadlock: rank 0 waits for a gradient before sending the activation it needs */
  tp_schedule_init(&s, TP_SCHEDULE_GPIPE, 2, 1, (int[]){1});
  tp_schedule_push(&s, 0, (TpInsn){TP_INSN_FORWARD, 0, 0, -1, 0});
  tp_schedule_push(&s, 0, (TpInsn){TP_INSN_RECV_GRAD, 0, 0, 1, 0});
  tp_schedule_push(&s, 0, (TpInsn){TP_INSN_SEND_ACT, 0, 0, 1, 0});
  tp_schedule_push(&s, 0, (TpInsn){TP_INSN_BACKWARD, 0, 0, -1, 0});
  tp_schedule_push(&s, 1, (TpInsn){TP_INSN_RECV_ACT, 0, 0, 0, 0});
  tp_schedule_push(&s, 1, (TpInsn){TP_INSN_FORWARD, 0, 0, -1, 0});
  tp_schedule_push(&s, 1, (TpInsn){TP_INSN_BACKWARD, 0, 0, -1, 0});
  tp_schedule_push(&s, 1, (TpInsn){TP_INSN_SEND_GRAD, 0, 0, 0, 0});
  expect_refused(&s, "receive before the matching send", "deadlocks");
  tp_schedule_free(&s);
  /* backward before forward; backward of slice 0 before slice 1 */
  tp_schedule_init(&s, TP_SCHEDULE_GPIPE, 1, 1, (int[]){2});
  tp_schedule_push(&s, 0, (TpInsn){TP_INSN_FORWARD, 0, 0, -1, 0});
  tp_schedule_push(&s, 0, (TpInsn){TP_INSN_FORWARD, 0, 1, -1, 0});
  tp_schedule_push(&s, 0, (TpInsn){TP_INSN_BACKWARD, 0, 0, -1, 0});
  tp_schedule_push(&s, 0, (TpInsn){TP_INSN_BACKWARD, 0, 1, -1, 0});
  expect_refused(&s, "slices backward in the wrong order", "later slices go first");
  tp_schedule_free(&s);
}

int main(void) {
  grid();
  broken();
  /* the printer's form */
  TpScheduleSpec spec = {TP_SCHEDULE_1F1B, 2, 1, (int[]){2}, false, false, 0};
  TpSchedule s;
  tp_schedule_build(&spec, &s);
  char buf[4096] = "";
  FILE *f = fmemopen(buf, sizeof buf - 1, "w");
  tp_schedule_print(&s, f);
  fclose(f);
  CHECK(strstr(buf, "schedule 1f1b: 2 stages, 1 microbatches, slices [2]\nrank 0:\n"
                    "  forward         mb 0 slice 0\n  send-act        mb 0 slice 0 -> 1\n"),
        "printer output:\n%s", buf);
  tp_schedule_free(&s);
  return failures != 0;
}
