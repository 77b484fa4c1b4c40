/* Schedules: for a grid of (stages, microbatches, slices) the built schedules verify
 * (every send matched once, no deadlock) and the simulation agrees with the closed form
 * of an equal-stage pipeline; 1f1b holds no more memory than gpipe; zb (ZB-H1) holds no
 * more microbatch arenas than 1f1b on any rank and, with the backward split into equal
 * input and weight halves, finishes sooner than 1f1b wherever there is a bubble; hand-made
 * broken lists (a crossed send/receive, a missing receive, a backward before its forward,
 * split backwards out of order) are refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/planner/simulate.h"
#include "uniform_costs.h"

static void grid(void) {
  int checked = 0;
  for (int S = 1; S <= 6; S++)
    for (int M = 1; M <= 4; M++)
      for (int N = 1; N <= 4; N++) {
        double time_1f1b = 0;
        int arenas_1f1b[6];
        for (int kind = 0; kind < 3; kind++) {
          int nslices[4];
          for (int m = 0; m < M; m++) nslices[m] = N + (m % 2) * (S % 2); /* uneven across microbatches for odd S */
          TpScheduleKind kinds[3] = {TP_SCHEDULE_GPIPE, TP_SCHEDULE_1F1B, TP_SCHEDULE_ZB};
          TpScheduleSpec spec = {kinds[kind], S, M, nslices, true, true, 0};
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
          CHECK(kind > 0 || tp_schedule_verify(&s, true, &quiet) == TP_OK, "%s S=%d M=%d N=%d: %s",
                tp_schedule_name(spec.kind), S, M, N, quiet.last);
          TpSimCosts c;
          uniform_costs(&c, S, M, nslices, 1, 2);
          TpSimResult r;
          CHECK(tp_simulate(&s, &c, false, &r, &d) == TP_OK, "simulation failed");
          int U = c.units;
          if (kind == 0) /* gpipe, equal stages: (U + S - 1) beats forward and backward */
            CHECK(r.time_s == (U + S - 1) * 3.0, "gpipe S=%d U=%d: time %g, want %g", S, U, r.time_s,
                  (U + S - 1) * 3.0);
          else if (kind == 1) { /* 1f1b: no slower than gpipe here, about S - k microbatches in flight */
            CHECK(r.time_s <= (U + S - 1) * 3.0 + 1e-9, "1f1b S=%d U=%d slower: %g", S, U, r.time_s);
            for (int k = 0; k < S; k++) {
              int bound = S - k + 1 < M ? S - k + 1 : M;
              CHECK(r.peak_bytes[k] <= bound, "1f1b rank %d holds %g microbatch arenas > %d", k, r.peak_bytes[k],
                    bound);
              arenas_1f1b[k] = tp_schedule_arenas(&s, k);
            }
            time_1f1b = r.time_s;
          } else { /* zb: 1f1b's memory, a smaller bubble (none to shrink on one stage) */
            for (int k = 0; k < S; k++)
              CHECK(tp_schedule_arenas(&s, k) <= arenas_1f1b[k], "zb S=%d M=%d N=%d rank %d: %d arenas > 1f1b's %d",
                    S, M, N, k, tp_schedule_arenas(&s, k), arenas_1f1b[k]);
            CHECK(S == 1 ? r.time_s <= time_1f1b + 1e-9 : r.time_s < time_1f1b - 1e-9,
                  "zb S=%d M=%d N=%d: time %g, 1f1b's %g", S, M, N, r.time_s, time_1f1b);
            if (U == M) /* unsliced: the bubble is (S - 1)(F + B), 1f1b's (S - 1)(F + B + W) */
              CHECK(r.time_s == 3.0 * U + 2.0 * (S - 1) && time_1f1b == 3.0 * U + 3.0 * (S - 1),
                    "zb S=%d M=%d: time %g (1f1b %g), want %g (%g)", S, M, r.time_s, time_1f1b,
                    3.0 * U + 2.0 * (S - 1), 3.0 * U + 3.0 * (S - 1));
            for (int k = 0; k < S; k++) /* every unit's F, B and W ran */
              CHECK(fabs(r.busy_s[k] - 3.0 * U) < 1e-9, "zb rank %d busy %g, want %g", k, r.busy_s[k], 3.0 * U);
          }
          for (int k = 0; kind == 0 && k < S; k++) /* gpipe keeps every microbatch */
            CHECK(r.peak_bytes[k] == M, "gpipe rank %d holds %g microbatch arenas, not %d", k, r.peak_bytes[k], M);
          tp_sim_result_free(&r);
          tp_sim_costs_free(&c);
          tp_schedule_free(&s);
          checked++;
        }
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

/* One rank's list of compute instructions: "F0.1" forward mb 0 slice 1, "B" backward,
 * "I" backward-input, "W" backward-weight. */
static void one_rank(TpSchedule *s, int nmb, const int *nslices, const char *list) {
  tp_schedule_init(s, TP_SCHEDULE_ZB, 1, nmb, nslices);
  for (const char *p = list; *p; p++) {
    if (*p == ' ') continue;
    TpInsnKind kind = *p == 'F'   ? TP_INSN_FORWARD
                      : *p == 'B' ? TP_INSN_BACKWARD
                      : *p == 'I' ? TP_INSN_BACKWARD_INPUT
                                  : TP_INSN_BACKWARD_WEIGHT;
    int mb = p[1] - '0', slice = p[3] - '0';
    tp_schedule_push(s, 0, (TpInsn){kind, mb, slice, -1, 0});
    p += 3;
  }
}

/* Split backwards: each unit's input part before its weight part, never both a whole
 * backward and a split one; a microbatch's weight parts in its input parts' order and not
 * interleaved with another microbatch's; a microbatch's arena lives until its last weight
 * part. */
static void split_backward(void) {
  int two[2] = {2, 2};
  TpSchedule s;
  TpDiag d;
  tp_diag_init(&d, "test_schedule", NULL, stderr);
  one_rank(&s, 2, two, "F0.0 F0.1 I0.1 I0.0 F1.0 F1.1 W0.1 I1.1 W0.0 I1.0 W1.1 W1.0");
  CHECK(tp_schedule_verify(&s, false, &d) == TP_OK, "a valid split list refused");
  CHECK(tp_schedule_arenas(&s, 0) == 2, "mb 0 lives until its last W (after mb 1 began): %d arenas, want 2",
        tp_schedule_arenas(&s, 0));
  tp_schedule_free(&s);
  one_rank(&s, 2, two, "F0.0 F0.1 I0.1 W0.1 I0.0 W0.0 F1.0 F1.1 I1.1 W1.1 I1.0 W1.0");
  CHECK(tp_schedule_arenas(&s, 0) == 1, "W right after B: %d arenas, want 1", tp_schedule_arenas(&s, 0));
  tp_schedule_free(&s);
  struct {
    const char *list, *needle;
  } bad[] = {
      {"F0.0 F0.1 I0.1 W0.0 I0.0 W0.1 F1.0 F1.1 I1.1 I1.0 W1.1 W1.0", "before its backward-input"},
      {"F0.0 F0.1 I0.1 I0.0 W0.0 W0.1 F1.0 F1.1 I1.1 I1.0 W1.1 W1.0", "before slice 1's"},
      {"F0.0 F0.1 I0.1 I0.0 F1.0 F1.1 I1.1 I1.0 W0.1 W1.1 W0.0 W1.0", "not interleaved with another's"},
      {"F0.0 F0.1 B0.1 I0.1 I0.0 W0.0 F1.0 F1.1 B1.1 B1.0", "has both backward and backward-input"},
      {"F0.0 F0.1 B0.1 W0.1 B0.0 F1.0 F1.1 B1.1 B1.0", "has both backward and backward-weight"},
      {"F0.0 F0.1 I0.1 W0.1 I0.0 W0.0 F1.0 F1.1 I1.1 I1.0 W1.1", "mb 1 slice 0 has no backward-weight"},
      {"F0.0 F0.1 I0.0 I0.1 W0.1 W0.0 F1.0 F1.1 B1.1 B1.0", "before slice 1 (later slices go first)"},
      {"F0.0 F0.1 I0.1 W0.1 W0.1 I0.0 W0.0 F1.0 F1.1 B1.1 B1.0", "backward-weight of mb 0 slice 1 twice"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    one_rank(&s, 2, two, bad[i].list);
    expect_refused(&s, bad[i].list, bad[i].needle);
    tp_schedule_free(&s);
  }
  /* a deadlock in a split list names the waiting instruction: rank 0 waits for mb 0's
   * gradient before sending mb 1's activation, which rank 1 needs first */
  TpScheduleSpec spec = {TP_SCHEDULE_ZB, 2, 2, (int[]){1, 1}, false, false, 0};
  tp_schedule_build(&spec, &s);
  CHECK(tp_schedule_verify(&s, false, &d) == TP_OK, "zb 2 x 2 refused");
  tp_schedule_free(&s);
  tp_schedule_init(&s, TP_SCHEDULE_ZB, 2, 2, (int[]){1, 1});
  TpInsn r0[] = {{TP_INSN_FORWARD, 0, 0, -1, 0},         {TP_INSN_SEND_ACT, 0, 0, 1, 0},
                 {TP_INSN_FORWARD, 1, 0, -1, 0},         {TP_INSN_RECV_GRAD, 0, 0, 1, 0},
                 {TP_INSN_SEND_ACT, 1, 0, 1, 0},         {TP_INSN_BACKWARD_INPUT, 0, 0, -1, 0},
                 {TP_INSN_RECV_GRAD, 1, 0, 1, 0},        {TP_INSN_BACKWARD_INPUT, 1, 0, -1, 0},
                 {TP_INSN_BACKWARD_WEIGHT, 0, 0, -1, 0}, {TP_INSN_BACKWARD_WEIGHT, 1, 0, -1, 0}};
  TpInsn r1[] = {{TP_INSN_RECV_ACT, 0, 0, 0, 0},  {TP_INSN_RECV_ACT, 1, 0, 0, 0},
                 {TP_INSN_FORWARD, 0, 0, -1, 0},  {TP_INSN_BACKWARD_INPUT, 0, 0, -1, 0},
                 {TP_INSN_SEND_GRAD, 0, 0, 0, 0}, {TP_INSN_BACKWARD_WEIGHT, 0, 0, -1, 0},
                 {TP_INSN_FORWARD, 1, 0, -1, 0},  {TP_INSN_BACKWARD_INPUT, 1, 0, -1, 0},
                 {TP_INSN_SEND_GRAD, 1, 0, 0, 0}, {TP_INSN_BACKWARD_WEIGHT, 1, 0, -1, 0}};
  for (size_t i = 0; i < sizeof r0 / sizeof *r0; i++) tp_schedule_push(&s, 0, r0[i]);
  for (size_t i = 0; i < sizeof r1 / sizeof *r1; i++) tp_schedule_push(&s, 1, r1[i]);
  expect_refused(&s, "split list that deadlocks",
                 "schedule zb deadlocks: rank 0 waits at instruction 3 (recv-grad mb 0 slice 0, peer 1)");
  tp_schedule_free(&s);
}

int main(void) {
  grid();
  broken();
  split_backward();
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
