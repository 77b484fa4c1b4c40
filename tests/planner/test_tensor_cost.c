/* The cost model's tensor-parallel terms against the simulator (passes/planner): for
 * N = 2, 4, 8 (one node) and 16 (across nodes), one stage, a plan of microbatches and
 * slices, the simulated step time minus the same plan's with free links (infinite
 * bandwidth, no latency) must be the all-reduces written out here by hand, per slice
 * of b x l tokens of width C on a layer: 2 in the forward (after the attention output and
 * after the second MLP product) and their 2 mirrors in the backward, each of b*l*C
 * values, priced as a ring: 2(N-1)/N * bytes / bandwidth + 2(N-1) * latency; plus the
 * vocab-parallel edges (embedding output forward and backward, the loss's 3 fp32 sums
 * per token, the head's input gradient). And the compute is divided by N: every GEMM's
 * FLOPs at N are those at 1 over N. Prints both sides of each check.
 * usage: test_tensor_cost PROFILE_DIR */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "passes/planner/plan.h"

enum { LAYERS = 4, HIDDEN = 1024, HEADS = 16, SEQ = 512, B = 2, M = 2 };
static const int slices[] = {256, 160, 96};
enum { NSLICES = sizeof slices / sizeof slices[0] };

/* A ring all-reduce of `bytes` among n devices on links of `bw` bytes/s, `lat` s each. */
static double ring(double bytes, int n, double bw, double lat) {
  return 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * lat;
}

/* The step's tensor-parallel all-reduce seconds, by hand. */
static double allreduce_by_hand(const TpHardware *hw, int n) {
  bool inside = n <= hw->devices_per_node;
  double bw = inside ? hw->intra_bandwidth : hw->inter_bandwidth / hw->devices_per_node;
  double lat = inside ? hw->intra_latency_s : hw->inter_latency_s, db = hw->dtype_bytes, total = 0;
  for (int m = 0; m < M; m++)
    for (int i = 0; i < NSLICES; i++) {
      double act = (double)B * slices[i] * HIDDEN * db; /* b * l * C values */
      int per_layer = 2 + 2;                            /* forward + backward */
      total += LAYERS * per_layer * ring(act, n, bw, lat);
      total += 3 * ring(act, n, bw, lat);                 /* embedding f + b, head b */
      total += ring(3.0 * B * slices[i] * 4, n, bw, lat); /* the loss's sums */
    }
  return total;
}

static double simulated_step(const TpHardware *hw, const TpModelDesc *m, int n, TpDiag *d) {
  static TpPlanRequest req;
  memset(&req, 0, sizeof req);
  CHECK(tp_cost_model_init(&req.cm, hw, m, 1, n, 1, d) == TP_OK, "model at N=%d", n);
  req.batch = B * M;
  req.max_memory = 1e30;
  static TpPlanEval e;
  memset(&e, 0, sizeof e);
  e.slicing.n = M;
  TpMicrobatch mb[M];
  for (int i = 0; i < M; i++) mb[i] = (TpMicrobatch){B, NSLICES, (int *)slices};
  e.slicing.mb = mb;
  TpSchedule s;
  TpSimResult r;
  CHECK(tp_plan_simulate(&req, &e, false, &s, &r, d) == TP_OK, "simulate N=%d", n);
  double t = r.time_s;
  tp_sim_result_free(&r);
  tp_schedule_free(&s);
  return t;
}

static double gemm_flops(const TpHardware *hw, const TpModelDesc *m, int n, bool backward, int *allreduces,
                         double *allreduce_bytes) {
  static TpCostModel cm;
  TpDiag d;
  tp_diag_init(&d, "test_tensor_cost", NULL, stderr);
  tp_cost_model_init(&cm, hw, m, 1, n, 1, &d);
  TpKernel k[TP_MAX_KERNELS];
  int count = tp_layer_kernels(&cm, B, 128, 256, backward, k);
  double flops = 0;
  *allreduces = 0;
  *allreduce_bytes = 0;
  for (int i = 0; i < count; i++) {
    if (k[i].kind == TP_KERNEL_GEMM) flops += k[i].flops;
    if (k[i].kind == TP_KERNEL_ALLREDUCE) ++*allreduces, *allreduce_bytes += k[i].bytes;
  }
  return flops;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_tensor_cost PROFILE_DIR\n");
    return 2;
  }
  TpDiag d;
  tp_diag_init(&d, "test_tensor_cost", NULL, stderr);
  TpHardware hw;
  CHECK(tp_hardware_find("p3.16xlarge", argv[1], &hw, &d) == TP_OK, "profile");
  if (failures) return 1;
  TpModelDesc m;
  char spec[128];
  snprintf(spec, sizeof spec, "layers=%d,hidden=%d,heads=%d,seq=%d,vocab=8192", LAYERS, HIDDEN, HEADS, SEQ);
  CHECK(tp_model_parse(spec, &m, &d) == TP_OK, "model");
  TpHardware free_links = hw; /* the same machine with links that cost nothing */
  free_links.intra_bandwidth = free_links.inter_bandwidth = INFINITY;
  free_links.intra_latency_s = free_links.inter_latency_s = 0;
  printf("%-4s %-12s %16s %16s %10s\n", "N", "links", "simulator (s)", "by hand (s)", "rel. err");
  const int degrees[] = {2, 4, 8, 16};
  for (int i = 0; i < 4; i++) {
    int n = degrees[i];
    double sim = simulated_step(&hw, &m, n, &d) - simulated_step(&free_links, &m, n, &d);
    double hand = allreduce_by_hand(&hw, n);
    double err = fabs(sim - hand) / hand;
    printf("%-4d %-12s %16.9f %16.9f %10.2e\n", n, n <= hw.devices_per_node ? "intra-node" : "inter-node", sim, hand,
           err);
    CHECK(err < 1e-9, "N=%d: the simulated all-reduces take %.9g s, by hand %.9g s", n, sim, hand);
  }
  /* per layer: 2 all-reduces of b*l*C each way, and the GEMMs' work divided by N */
  printf("%-4s %-9s %14s %14s %11s %14s\n", "N", "pass", "GEMM FLOPs", "x N / at N=1", "all-reduces", "bytes each");
  for (int bw = 0; bw < 2; bw++) {
    int ar1;
    double bytes1, one = gemm_flops(&hw, &m, 1, bw, &ar1, &bytes1);
    CHECK(ar1 == 0, "N=1 has %d all-reduces", ar1);
    for (int i = 0; i < 3; i++) {
      int n = degrees[i], ar;
      double bytes, f = gemm_flops(&hw, &m, n, bw, &ar, &bytes);
      printf("%-4d %-9s %14.6g %14.12f %11d %14.0f\n", n, bw ? "backward" : "forward", f, f * n / one, ar,
             ar ? bytes / ar : 0);
      CHECK(fabs(f * n / one - 1) < 1e-12, "N=%d %s: GEMM FLOPs %g, want %g / %d", n, bw ? "backward" : "forward", f,
            one, n);
      CHECK(ar == 2 && bytes == 2.0 * B * 128 * HIDDEN * hw.dtype_bytes, "N=%d %s: %d all-reduces of %g bytes", n,
            bw ? "backward" : "forward", ar, bytes);
    }
  }
  return failures != 0;
}
