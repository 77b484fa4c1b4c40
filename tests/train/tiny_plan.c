/* A hand-written plan (what codegen/ would generate) for tests/train/tiny.onnx, so that the
 * trainer runtime is tested on its own:
 *
 *   x      = wte[tokens] + wpe + frozen.shift      (B, T, C)   stage 0
 *   logits = x @ wte^T + head.bias                 (B, T, V)   stage 1
 *   loss   = mean cross-entropy(logits, targets)
 *
 * The model's head.weight_t is wte re-tied (a derived initializer, transposed), head.bias
 * an Identity alias of shared.bias, frozen.shift a frozen parameter. Two stages, so the
 * trainer's stage order and per-stage arenas are exercised; x and dx cross between them
 * through static buffers (how activations travel between stages is not part of the plan
 * ABI yet). */
#include <string.h>

#include "runtime/cpu/nn_backward.h"
#include "runtime/cpu/transformer.h"
#include "runtime/train/plan.h"
#ifdef TEST_CUDA_DEVICE /* tests/cuda's tiny_trainer_cuda: the same plan on the CUDA backend */
#include "../cuda/test_device.h"
#endif

#ifndef TINY_BATCH /* tiny_trainer_b4: the same model with another batch (resume checks) */
#define TINY_BATCH 2
#endif
enum { B = TINY_BATCH, T = 8, V = 256, C = 8, BT = B * T };
enum { WTE, WPE, SHIFT, BIAS };

static float x_buf[BT * C], dx_buf[BT * C]; /* (B*T, C) */

/* stage 1's arena: logits, dlogits (BT, V); dwte (V, C); dbias (V) */
#define LOGITS(io) ((float *)(io)->arena)
#define DLOGITS(io) (LOGITS(io) + BT * V)
#define DWTE(io) (DLOGITS(io) + BT * V)
#define DBIAS(io) (DWTE(io) + V * C)

static void forward0(TpStepIO *io) {
  int64_t bad;
  tp_embedding_f32(io->param[WTE], io->tokens, BT, V, C, x_buf, &bad);
  for (int r = 0; r < BT; r++)
    for (int c = 0; c < C; c++) x_buf[r * C + c] += io->param[WPE][(r % T) * C + c] + io->param[SHIFT][c];
}

static void forward1(TpStepIO *io) {
  int64_t bad;
  tp_linear_f32(x_buf, io->param[WTE], io->param[BIAS], BT, C, V, true, LOGITS(io));
  tp_cross_entropy_f32(LOGITS(io), io->targets, BT, V, BT, &io->loss, &bad);
}

static void backward1(TpStepIO *io) {
  int64_t bad;
  tp_cross_entropy_backward_f32(1.0f, LOGITS(io), io->targets, BT, V, BT, DLOGITS(io), &bad);
  tp_linear_backward_f32(DLOGITS(io), x_buf, io->param[WTE], BT, C, V, true, dx_buf, DWTE(io), DBIAS(io));
  for (int i = 0; i < V * C; i++) io->grad[WTE][i] += DWTE(io)[i];
  for (int i = 0; i < V; i++) io->grad[BIAS][i] += DBIAS(io)[i];
}

static void backward0(TpStepIO *io) {
  for (int r = 0; r < BT; r++)
    for (int c = 0; c < C; c++) {
      io->grad[WTE][io->tokens[r] * C + c] += dx_buf[r * C + c];
      io->grad[WPE][(r % T) * C + c] += dx_buf[r * C + c];
    }
}

static const TpPlanParam params[] = {
    {"wte", "wte", 2, {V, C}, 1, 0, 0, {0, 0, 0}},
    {"wpe", "wpe", 2, {T, C}, 1, 0, 0, {0, 0, 0}},
    {"frozen.shift", "frozen.shift", 1, {C}, 0, 0, 0, {0, 0, 0}},
    {"head.bias", "shared.bias", 1, {V}, 1, 0, 0, {0, 0, 0}},
};
static const TpPlanDerived derived[] = {{"head.weight_t", WTE, 1}};
static const size_t arena_bytes[] = {64, (2 * BT * V + V * C + V) * sizeof(float)};
static const TpStageFn forward[] = {forward0, forward1};
static const TpStageFn backward[] = {backward0, backward1};

const TpPlan tp_plan = {
    .abi = TP_PLAN_ABI,
    .model = TINY_MODEL,
    .tokpipec_version = "hand-written",
    .batch = B,
    .seq = T,
    .vocab = V,
    .nparams = 4,
    .params = params,
    .nderived = 1,
    .derived = derived,
    .nstages = 2,
    .arena_bytes = arena_bytes,
    .forward = forward,
    .backward = backward,
#ifdef TEST_CUDA_DEVICE
    .device = &deferred_loss_device,
#endif
};

int main(int argc, char **argv) { return tp_trainer_main(&tp_plan, argc, argv); }
