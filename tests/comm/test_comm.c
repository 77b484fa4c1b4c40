/* The communication layer (runtime/comm) on its own, as `test_comm MODE` under mpirun -np N
 * (or without mpirun: the local backend, size 1):
 *   basic  ring messages of several sizes, all-reduce (f32, f64, int64; all ranks and a
 *          sub-group) bit for bit equal to the sum in rank order, reduce-scatter (the same
 *          bits in each member's segment) and all-gather over segments of unequal sizes,
 *          one empty, broadcast, barrier, agree
 *   die    rank 1 is killed (SIGKILL) while the others wait for it
 *   hang   rank 1 stops answering (sleeps) while the others wait for it: their watchdog
 *          (TOKPIPE_COMM_TIMEOUT) must end the job
 *   size   rank 1 all-reduces more elements than the others: one error naming both ranks,
 *          never a truncated message or a buffer overrun
 *   order  rank 1 runs a collective the others do not (as a rank with an option the
 *          others lack would): the next collective's header shows it out of step
 *   longer, shorter  rank 0 sends rank 1 a message of 16 (4) bytes where rank 1 expects 8:
 *          one error naming both ranks and the sizes (MPI truncates a longer one with an
 *          error of its own, and delivers a shorter one without a word) */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "expect.h"
#include "runtime/comm/comm.h"

static void ring(TpComm *c) {
  if (c->size < 2) return;
  int next = (c->rank + 1) % c->size, prev = (c->rank + c->size - 1) % c->size;
  const size_t sizes[] = {0, 1, 4096, 1 << 20};
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    size_t n = sizes[k];
    unsigned char *out = malloc(n + 1), *in = malloc(n + 1);
    for (size_t i = 0; i < n; i++) out[i] = (unsigned char)(c->rank * 31 + i);
    TpCommRequest s = {.what = "ring send"}, r = {.what = "ring receive"};
    c->be->irecv(c, in, n, prev, (int)k, &r);
    c->be->isend(c, out, n, next, (int)k, &s);
    tp_comm_wait(c, &r);
    tp_comm_wait(c, &s);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += in[i] != (unsigned char)(prev * 31 + i);
    EXPECT(c, bad == 0);
    free(out);
    free(in);
  }
}

static void allreduce(TpComm *c, const int *group, int n) {
  bool member = false;
  for (int i = 0; i < n; i++) member |= group[i] == c->rank;
  if (!member) return;
  enum { COUNT = 1000 };
  float *x = malloc(COUNT * sizeof *x), *want = malloc(COUNT * sizeof *want);
  double y[3] = {c->rank * 0.1, 1.0 / (c->rank + 7), -2.5}, ywant[3] = {0};
  int64_t z[2] = {c->rank, (int64_t)1 << 40}, zwant[2] = {0};
  for (size_t i = 0; i < COUNT; i++) {
    x[i] = value_f32(c->rank, i);
    want[i] = value_f32(group[0], i);
    for (int g = 1; g < n; g++) want[i] += value_f32(group[g], i);
  }
  for (int g = 0; g < n; g++) {
    double v[3] = {group[g] * 0.1, 1.0 / (group[g] + 7), -2.5};
    for (int k = 0; k < 3; k++) ywant[k] = g ? ywant[k] + v[k] : v[k];
    zwant[0] += group[g], zwant[1] += (int64_t)1 << 40;
  }
  tp_comm_allreduce_sum(c, x, COUNT, TP_F32, group, n);
  tp_comm_allreduce_sum(c, y, 3, TP_F64, group, n);
  tp_comm_allreduce_sum(c, z, 2, TP_I64, group, n);
  EXPECT(c, memcmp(x, want, COUNT * sizeof *x) == 0); /* the same bits: the order is fixed */
  EXPECT(c, memcmp(y, ywant, sizeof y) == 0);
  EXPECT(c, z[0] == zwant[0] && z[1] == zwant[1]);
  free(x);
  free(want);
}

/* --zero 1's pair over every rank: segment i (i + 1 elements, rank 1's none) is rank i's. */
static void scatter_gather(TpComm *c, const int *all) {
  size_t *counts = malloc(sizeof *counts * (size_t)c->size), total = 0, at = 0;
  for (int i = 0; i < c->size; i++) {
    counts[i] = i == 1 ? 0 : (size_t)i + 1;
    if (i < c->rank) at += counts[i];
    total += counts[i];
  }
  float *x = malloc(sizeof *x * total), *want = malloc(sizeof *want * total);
  for (size_t i = 0; i < total; i++) {
    x[i] = value_f32(c->rank, i);
    want[i] = value_f32(0, i);
    for (int g = 1; g < c->size; g++) want[i] += value_f32(g, i);
  }
  tp_comm_reduce_scatter_sum(c, x, counts, TP_F32, all, c->size);
  EXPECT(c, memcmp(x + at, want + at, counts[c->rank] * sizeof *x) == 0); /* the all-reduce's bits */
  for (size_t i = 0; i < total; i++) x[i] = i >= at && i < at + counts[c->rank] ? (float)i : -1.0f;
  tp_comm_all_gather(c, x, counts, TP_F32, all, c->size);
  size_t bad = 0;
  for (size_t i = 0; i < total; i++) bad += x[i] != (float)i;
  EXPECT(c, bad == 0);
  free(counts), free(x), free(want);
}

static int basic(TpComm *c) {
  ring(c);
  int *all = malloc(sizeof *all * (size_t)c->size), *even = malloc(sizeof *even * (size_t)c->size), neven = 0;
  for (int i = 0; i < c->size; i++) {
    all[i] = i;
    if (i % 2 == 0) even[neven++] = i;
  }
  allreduce(c, all, c->size);
  allreduce(c, even, neven);
  scatter_gather(c, all);
  char msg[32] = "";
  int root = c->size - 1;
  if (c->rank == root) snprintf(msg, sizeof msg, "hello from %d", root);
  tp_comm_broadcast(c, msg, sizeof msg, root, all, c->size);
  char want[32];
  snprintf(want, sizeof want, "hello from %d", root);
  EXPECT(c, strcmp(msg, want) == 0);
  tp_comm_barrier(c);
  int first;
  EXPECT(c, tp_comm_agree(c, 0, &first) == 0 && first == -1);
  int rc = tp_comm_agree(c, c->rank == c->size - 1 ? 2 : c->rank == c->size / 2 ? 1 : 0, &first);
  EXPECT(c, rc == 2 && first == c->size / 2);
  free(all);
  free(even);
  return failures ? 1 : 0;
}

/* Rank 1 fails after a barrier; the others wait for a message from it that never comes. */
static int lose_rank_one(TpComm *c, bool die) {
  if (c->size < 2) return 1;
  tp_comm_barrier(c);
  if (c->rank == 1) {
    if (die) raise(SIGKILL);
    sleep(600);
    return 1;
  }
  int x;
  tp_comm_recv(c, &x, sizeof x, 1, 7, "the test message");
  fprintf(stderr, "rank %d: received a message that was never sent\n", c->rank);
  return 1;
}

/* Ranks out of step: after this the job must have ended with an error. */
static int out_of_step(TpComm *c, bool by_size) {
  int *all = malloc(sizeof *all * (size_t)c->size);
  for (int i = 0; i < c->size; i++) all[i] = i;
  float x[8] = {0};
  if (by_size) {
    tp_comm_allreduce_sum(c, x, c->rank == 1 ? 8 : 4, TP_F32, all, c->size);
  } else {
    if (c->rank == 1) tp_comm_allreduce_sum(c, x, 4, TP_F32, all, c->size);
    tp_comm_allreduce_sum(c, x, 4, TP_F32, all, c->size);
    tp_comm_barrier(c);
    tp_comm_broadcast(c, x, sizeof x, 0, all, c->size);
  }
  fprintf(stderr, "rank %d: the collectives of ranks out of step completed\n", c->rank);
  free(all);
  return 1;
}

/* A message of another size than its receiver expects. */
static int wrong_message_size(TpComm *c, size_t sent) {
  char buf[16] = {0};
  if (c->rank == 0) tp_comm_send(c, buf, sent, 1, 5, "the test message");
  if (c->rank == 1) tp_comm_recv(c, buf, 8, 0, 5, "the test message");
  tp_comm_barrier(c);
  fprintf(stderr, "rank %d: a message of %zu bytes was taken for one of 8\n", c->rank, sent);
  return 1;
}

int main(int argc, char **argv) {
  TpDiag d;
  tp_diag_init(&d, "test_comm", NULL, stderr);
  TpComm *c;
  if (tp_comm_open(&c, "test_comm", &argc, &argv, &d)) return 1;
  const char *mode = argc > 1 ? argv[1] : "basic";
  int rc = 2;
  if (strcmp(mode, "basic") == 0) {
    rc = basic(c);
    if (c->rank == 0) printf("%s backend, %d ranks: %s\n", c->be->name, c->size, rc ? "FAILED" : "ok");
  } else if (strcmp(mode, "die") == 0 || strcmp(mode, "hang") == 0) {
    rc = lose_rank_one(c, strcmp(mode, "die") == 0);
  } else if (strcmp(mode, "longer") == 0 || strcmp(mode, "shorter") == 0) {
    rc = wrong_message_size(c, strcmp(mode, "longer") == 0 ? 16 : 4);
  } else if (strcmp(mode, "size") == 0 || strcmp(mode, "order") == 0) {
    rc = out_of_step(c, strcmp(mode, "size") == 0);
  } else {
    fprintf(stderr, "test_comm: unknown mode '%s'\n", mode);
  }
  tp_comm_close(c);
  return rc;
}
