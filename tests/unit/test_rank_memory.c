/* Unit tests of the per-rank memory model (codegen/rank_memory.h), against byte counts
 * written out by hand from its header's table. */
#include "../check.h"

#include <stdint.h>

#include "codegen/rank_memory.h"

static void expect(const char *label, TpRankMemoryInput in, TpRankMemory want) {
  TpRankMemory got;
  if (!tp_rank_memory(&in, &got)) fail("%s: refused", label);
  if (got.params != want.params || got.grads != want.grads || got.masters != want.masters ||
      got.state != want.state || got.activations != want.activations || got.peak != want.peak)
    fail("%s: got params %lld grads %lld masters %lld state %lld activations %lld peak %lld", label,
         (long long)got.params, (long long)got.grads, (long long)got.masters, (long long)got.state,
         (long long)got.activations, (long long)got.peak);
}

int main(void) {
  /* 1000 trained and 10 frozen elements; 3 arenas of 100 kept bytes and 50 transient */
  TpRankMemoryInput in =
      {.trained = 1000, .frozen = 10, .microbatches = 1, .kept = 100, .transient = 50, .arenas = 3};
  expect("fp32, M 1", in, (TpRankMemory){4040, 4000, 0, 8000, 350, 16390});
  in.microbatches = 4;
  expect("fp32, M 4: a microbatch's gradient besides the sum", in, (TpRankMemory){4040, 8000, 0, 8000, 350, 20390});
  in.zero_shards = 3; /* 1000 / 3 rounds up to 334 elements */
  expect("fp32, ZeRO over 3", in, (TpRankMemory){4040, 8000, 0, 2672, 350, 15062});
  in.precision = TP_PRECISION_BF16;
  in.zero_shards = 1;
  expect("bf16", in, (TpRankMemory){2020, 6000, 4040, 8000, 350, 20410});
  in.zero_shards = 2; /* the trained masters sharded too, the frozen ones whole */
  expect("bf16, ZeRO over 2", in, (TpRankMemory){2020, 6000, 2040, 4000, 350, 14410});
  in.zero_shards = 3;
  expect("bf16, ZeRO over 3", in, (TpRankMemory){2020, 6000, 1376, 2672, 350, 12418});
  in.zero_shards = 2;
  in.precision = TP_PRECISION_FP16;
  expect("fp16 as bf16", in, (TpRankMemory){2020, 6000, 2040, 4000, 350, 14410});

  in.chunks_kept = 2 * 70; /* interleaved: another virtual stage's 2 arenas of 70 kept bytes */
  expect("fp16, a second chunk's arenas", in, (TpRankMemory){2020, 6000, 2040, 4000, 490, 14550});

  TpRankMemoryInput huge = {.trained = 1, .kept = INT64_C(1) << 52, .arenas = 4096};
  TpRankMemory out;
  if (tp_rank_memory(&huge, &out)) fail("2^64 bytes of arenas were not refused");
  huge = (TpRankMemoryInput){.trained = 1, .kept = INT64_C(1) << 61, .arenas = 2, .chunks_kept = INT64_C(1) << 62};
  if (tp_rank_memory(&huge, &out)) fail("2^63 bytes over two chunks were not refused");

  TpPrecision p;
  if (!tp_precision_parse("bf16", &p) || p != TP_PRECISION_BF16 || tp_precision_parse("f16", &p))
    fail("tp_precision_parse");
  if (tp_precision_bytes(TP_PRECISION_FP32) != 4 || tp_precision_bytes(TP_PRECISION_FP16) != 2)
    fail("tp_precision_bytes");
  return failures != 0;
}
