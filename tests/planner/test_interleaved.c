/* Interleaved schedules (V virtual stages per rank): over a grid of (ranks, chunks,
 * microbatches, slices) the built lists verify (every message matched once between adjacent
 * virtual stages, no deadlock); with one slice per microbatch and microbatches a multiple
 * of the ranks, each rank starts with Megatron's warm-up count of forwards and the
 * simulated step has Megatron's bubble, (S - 1) / V units; none is more than 1% slower than
 * 1f1b and the grid as a whole is over 10% faster; each chunk's arenas are counted apart; bad specs and
 * hand-made broken lists (a message to the wrong chunk, a deadlock, a chunk out of range) are
 * refused naming the instruction; the printer names chunks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/planner/simulate.h"
#include "uniform_costs.h"

/* Simulated time of `spec` with each rank's work f, b per unit split over its chunks. */
static double simulate(const TpScheduleSpec *spec, double f, double b, double *arenas) {
  TpSchedule s;
  tp_schedule_build(spec, &s);
  int V = spec->chunks > 1 ? spec->chunks : 1;
  TpSimCosts c;
  uniform_costs(&c, spec->stages * V, spec->nmb, spec->nslices, f / V, b / V);
  TpSimResult r;
  TpDiag d;
  tp_diag_init(&d, "test_interleaved", NULL, stderr);
  double time = tp_simulate(&s, &c, false, &r, &d) == TP_OK ? r.time_s : -1;
  *arenas = 0;
  for (int k = 0; k < spec->stages; k++)
    if (r.peak_bytes[k] > *arenas) *arenas = r.peak_bytes[k];
  tp_sim_result_free(&r);
  tp_sim_costs_free(&c);
  tp_schedule_free(&s);
  return time;
}

/* Forwards rank k runs before its first backward. */
static int forwards_before_backward(const TpSchedule *s, int k) {
  int n = 0;
  for (int i = 0; i < s->count[k] && s->insn[k][i].kind != TP_INSN_BACKWARD; i++)
    n += s->insn[k][i].kind == TP_INSN_FORWARD;
  return n;
}

static void grid(void) {
  int checked = 0;
  double interleaved_s = 0, one_s = 0;
  for (int S = 2; S <= 5; S++)
    for (int V = 2; V <= 4; V++)
      for (int M = 1; M <= 5; M++)
        for (int N = 1; N <= 3; N++) {
          int nslices[5];
          for (int m = 0; m < M; m++) nslices[m] = N + (m % 2) * (N > 1); /* uneven across microbatches */
          TpScheduleSpec spec = {TP_SCHEDULE_INTERLEAVED, S, M, nslices, true, true, V};
          TpDiag d;
          tp_diag_init(&d, "test_interleaved", NULL, stderr);
          CHECK(tp_schedule_check_spec(&spec, &d) == TP_OK, "S=%d V=%d refused", S, V);
          TpSchedule s;
          tp_schedule_build(&spec, &s);
          CHECK(s.chunks == V, "S=%d V=%d: schedule has %d chunks", S, V, s.chunks);
          CHECK(tp_schedule_verify(&s, false, &d) == TP_OK, "interleaved S=%d V=%d M=%d N=%d does not verify", S, V,
                M, N);
          int units = 0;
          for (int m = 0; m < M; m++) units += nslices[m];
          for (int k = 0; k < S; k++) {
            int warm = 2 * (S - k - 1) + (V - 1) * S + 1; /* Megatron's warm-up, then one more forward */
            if (warm > units * V) warm = units * V;
            if (N == 1 && M % S == 0) /* full groups of S units */
              CHECK(forwards_before_backward(&s, k) == warm,
                    "S=%d V=%d M=%d rank %d: %d forwards before the first "
                    "backward, not %d",
                    S, V, M, k, forwards_before_backward(&s, k), warm);
            int all = tp_schedule_arenas(&s, k);
            for (int c = 0; c < V; c++) {
              int a = tp_schedule_chunk_arenas(&s, k, c);
              CHECK(a >= 1 && a <= all && a <= M, "S=%d V=%d M=%d N=%d rank %d chunk %d: %d arenas (rank %d)", S, V,
                    M, N, k, c, a, all);
            }
          }
          tp_schedule_free(&s);
          /* each rank's work per unit: forward V, backward 2V (1 and 2 per chunk) */
          double arenas, it = simulate(&spec, V, 2.0 * V, &arenas);
          TpScheduleSpec one = {TP_SCHEDULE_1F1B, S, M, nslices, true, true, 0};
          double ot = simulate(&one, V, 2.0 * V, &arenas);
          if (N == 1 && M % S == 0) /* Megatron's bubble: (S - 1) units' work over V */
            CHECK(it == units * V * 3.0 + (S - 1) * 3.0, "S=%d V=%d M=%d: interleaved takes %g, not %g", S, V, M, it,
                  units * V * 3.0 + (S - 1) * 3.0);
          CHECK(it <= ot * 1.01, "S=%d V=%d M=%d N=%d: interleaved %g, more than 1%% over 1f1b's %g", S, V, M, N, it,
                ot);
          interleaved_s += it, one_s += ot;
          checked++;
        }
  CHECK(interleaved_s < 0.9 * one_s, "interleaved takes %g over the grid, 1f1b %g", interleaved_s, one_s);
  printf("%d interleaved schedules verified and simulated: %.4g time units, 1f1b's %.4g\n", checked, interleaved_s,
         one_s);
}

static void expect(int rc, const TpDiag *d, const char *what, const char *needle) {
  CHECK(rc == TP_ERR_INPUT && strstr(d->last, needle), "%s: not refused as '%s' (got rc %d: %s)", what, needle, rc,
        d->last);
}

static void bad_specs(void) {
  TpDiag d;
  tp_diag_init(&d, "test_interleaved", NULL, NULL);
  int ns[2] = {1, 1};
  TpScheduleSpec one_chunk = {TP_SCHEDULE_INTERLEAVED, 2, 2, ns, false, false, 1};
  expect(tp_schedule_check_spec(&one_chunk, &d), &d, "interleaved with 1 chunk", "needs 2 to 64 chunks");
  TpScheduleSpec one_rank = {TP_SCHEDULE_INTERLEAVED, 1, 2, ns, false, false, 2};
  expect(tp_schedule_check_spec(&one_rank, &d), &d, "interleaved on 1 rank", "at least 2 pipeline ranks");
  TpScheduleSpec chunks_1f1b = {TP_SCHEDULE_1F1B, 2, 2, ns, false, false, 2};
  expect(tp_schedule_check_spec(&chunks_1f1b, &d), &d, "1f1b with chunks", "need the interleaved schedule");
}

/* Two ranks, two chunks, one unit: virtual stages 0..3 in a row. */
static void chain(TpSchedule *s) {
  tp_schedule_init(s, TP_SCHEDULE_INTERLEAVED, 2, 1, (int[]){1});
  s->chunks = 2;
  for (int j = 0; j < 4; j++) { /* forwards */
    int k = j % 2, c = j / 2;
    if (j > 0) tp_schedule_push(s, k, (TpInsn){TP_INSN_RECV_ACT, 0, 0, 1 - k, c});
    tp_schedule_push(s, k, (TpInsn){TP_INSN_FORWARD, 0, 0, -1, c});
    if (j < 3) tp_schedule_push(s, k, (TpInsn){TP_INSN_SEND_ACT, 0, 0, 1 - k, c});
  }
  for (int j = 3; j >= 0; j--) { /* backwards */
    int k = j % 2, c = j / 2;
    if (j < 3) tp_schedule_push(s, k, (TpInsn){TP_INSN_RECV_GRAD, 0, 0, 1 - k, c});
    tp_schedule_push(s, k, (TpInsn){TP_INSN_BACKWARD, 0, 0, -1, c});
    if (j > 0) tp_schedule_push(s, k, (TpInsn){TP_INSN_SEND_GRAD, 0, 0, 1 - k, c});
  }
}

static void broken(void) {
  TpDiag d;
  tp_diag_init(&d, "test_interleaved", NULL, NULL);
  TpSchedule s;
  chain(&s);
  CHECK(tp_schedule_verify(&s, false, &d) == TP_OK, "the hand-made chain does not verify: %s", d.last);
  tp_schedule_free(&s);
  /* rank 1's chunk 0 receives its activation as if it were chunk 1: rank 0's chunk 0 send
   * has no match */
  chain(&s);
  for (int i = 0; i < s.count[1]; i++)
    if (s.insn[1][i].kind == TP_INSN_RECV_ACT && s.insn[1][i].chunk == 0) s.insn[1][i].chunk = 1;
  expect(tp_schedule_verify(&s, false, &d), &d, "a receive on the wrong chunk",
         "rank 0: send-act mb 0 slice 0 chunk 0 to rank 1 chunk 0 has no matching receive");
  tp_schedule_free(&s);
  /* rank 0 runs chunk 1's forward (virtual stage 2) before chunk 0's (stage 0): it waits for
   * an activation that needs its own chunk 0 first */
  chain(&s);
  TpInsn *x = s.insn[0];
  TpInsn first[2] = {x[0], x[1]};   /* forward chunk 0, send-act chunk 0 */
  memmove(x, x + 2, sizeof *x * 3); /* recv-act, forward, send-act of chunk 1 */
  x[3] = first[0], x[4] = first[1];
  expect(tp_schedule_verify(&s, false, &d), &d, "chunk 1 before chunk 0",
         "rank 0 waits at instruction 0 (recv-act mb 0 slice 0 chunk 1, peer 1)");
  tp_schedule_free(&s);
  /* a chunk the ranks do not have */
  chain(&s);
  s.insn[1][1].chunk = 2;
  expect(tp_schedule_verify(&s, false, &d), &d, "chunk out of range", "chunk 2, not one of the rank's 2");
  tp_schedule_free(&s);
  /* the last virtual stage sends its activation on */
  chain(&s);
  tp_schedule_push(&s, 1, (TpInsn){TP_INSN_SEND_ACT, 0, 0, 0, 1});
  expect(tp_schedule_verify(&s, false, &d), &d, "a send past the last virtual stage",
         "no virtual stage on that side");
  tp_schedule_free(&s);
}

int main(void) {
  grid();
  bad_specs();
  broken();
  /* the printer's form: chunks on the units and on the peers */
  TpScheduleSpec spec = {TP_SCHEDULE_INTERLEAVED, 2, 2, (int[]){1, 1}, false, true, 2};
  TpSchedule s;
  tp_schedule_build(&spec, &s);
  char buf[8192] = "";
  FILE *f = fmemopen(buf, sizeof buf - 1, "w");
  tp_schedule_print(&s, f);
  fclose(f);
  CHECK(strstr(buf,
               "schedule interleaved: 2 stages x 2 chunks, 2 microbatches, slices [1, 1]\nrank 0:\n"
               "  forward         mb 0 slice 0 chunk 0\n  send-act        mb 0 slice 0 chunk 0 -> 1 chunk 0\n") &&
            strstr(buf, "rank 1:\n  recv-act        mb 0 slice 0 chunk 0 <- 0 chunk 0\n") &&
            strstr(buf, "  send-act        mb 0 slice 0 chunk 0 -> 0 chunk 1\n") &&
            strstr(buf, "  allreduce-tied  chunk 1 with 0 chunk 0\n"),
        "printer output:\n%s", buf);
  tp_schedule_free(&s);
  return failures != 0;
}
