/* The step counters of stats.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "stats.h"

static bool stats_wanted(void) {
#ifdef TOKPIPE_CUDA_EMULATE
  return true;
#else
  const char *s = getenv("TOKPIPE_CUDA_STATS");
  return s && strcmp(s, "0") != 0 && *s;
#endif
}

bool tp_cuda_stats_on = stats_wanted();
TpCudaStats tp_cuda_stats;

void tp_cuda_count_host_copy(const void *host) {
  if (!tp_cuda_stats_on) return;
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, host) != cudaSuccess) {
    (void)cudaGetLastError(); /* not an error: memory CUDA does not know */
    a.type = cudaMemoryTypeUnregistered;
  }
  if (a.type == cudaMemoryTypeUnregistered) TP_CUDA_COUNT(pageable, 1);
}

void tp_cuda_stats_take(char *line, size_t size) {
  const TpCudaStats *s = &tp_cuda_stats;
  double all = 0;
  for (int k = 0; k < TP_FLOPS_KINDS; k++) all += s->flops[k];
  snprintf(line, size,
           "launches=%llu syncs=%llu allocs=%llu queries=%llu pageable=%llu convert_bytes=%llu "
           "fp32_flop_share=%.3f",
           (unsigned long long)s->launches, (unsigned long long)s->syncs, (unsigned long long)s->allocs,
           (unsigned long long)s->queries, (unsigned long long)s->pageable, (unsigned long long)s->convert_bytes,
           all > 0 ? s->flops[TP_FLOPS_F32] / all : 0.0);
  tp_cuda_stats = TpCudaStats{};
}
