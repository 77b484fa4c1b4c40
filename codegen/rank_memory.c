/* One memory model for compiler and planner: see rank_memory.h. */
#include "rank_memory.h"

#include <string.h>

static const char *const precision_names[] = {"fp32", "bf16", "fp16"};

const char *tp_precision_name(TpPrecision p) { return precision_names[p]; }

bool tp_precision_parse(const char *name, TpPrecision *p) {
  for (int i = 0; i < (int)(sizeof precision_names / sizeof *precision_names); i++)
    if (!strcmp(name, precision_names[i])) {
      *p = (TpPrecision)i;
      return true;
    }
  return false;
}

int tp_precision_bytes(TpPrecision p) { return p == TP_PRECISION_FP32 ? 4 : 2; }

/* n elements of `bytes` each shared by z ranks: each rank's part, rounded up. */
static int64_t shard(int64_t n, int64_t bytes, int z) { return (n + z - 1) / z * bytes; }

bool tp_rank_memory(const TpRankMemoryInput *in, TpRankMemory *out) {
  int64_t n = in->trained, b = tp_precision_bytes(in->precision);
  int z = in->zero_shards > 0 ? in->zero_shards : 1;
  bool mixed = in->precision != TP_PRECISION_FP32;
  *out = (TpRankMemory){0};
  out->params = (n + in->frozen) * b;
  out->grads = mixed ? n * (b + 4) : n * 4 * (in->microbatches > 1 ? 2 : 1);
  out->masters = mixed ? shard(n, 4, z) + in->frozen * 4 : 0; /* the trained ones' shard, the frozen whole */
  out->state = shard(n, 8, z);
  int64_t fixed = out->params + out->grads + out->masters + out->state;
  if (in->chunks_kept < 0 || in->chunks_kept > INT64_MAX - fixed - in->transient) return false;
  int64_t room = INT64_MAX - fixed - in->transient - in->chunks_kept;
  if (in->arenas > 0 && in->kept > room / in->arenas) return false;
  out->activations = in->arenas * in->kept + in->chunks_kept + in->transient;
  out->peak = fixed + out->activations;
  return true;
}
