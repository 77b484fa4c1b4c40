/* What a CUDA step costs besides its arithmetic, counted per process (a rank per process
 * under mpirun): kernel launches (and cuBLASLt products), host waits for the device,
 * device allocations, cuBLASLt heuristic queries, copies to or from pageable host memory,
 * bytes written by f32 -> bf16/fp16 conversions, and floating-point operations by the
 * precision of their operands. Counted under TOKPIPE_CUDA_STATS=1 on a GPU, always in the
 * emulated build (the tests read them); the trainer prints each step's counts through the
 * compute backend's step_counts (backend.cu), then they start again from zero. */
#ifndef TOKPIPE_CUDA_STATS_H
#define TOKPIPE_CUDA_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The precision of a product's operands (its sums are f32 in each). */
typedef enum { TP_FLOPS_F32, TP_FLOPS_BF16, TP_FLOPS_F16, TP_FLOPS_KINDS } TpFlopsKind;

typedef struct {
  uint64_t launches, syncs, allocs, queries, pageable, convert_bytes;
  double flops[TP_FLOPS_KINDS];
} TpCudaStats;

extern bool tp_cuda_stats_on; /* stats.cu: from TOKPIPE_CUDA_STATS, or true when emulated */
extern TpCudaStats tp_cuda_stats;

/* An expression (TP_LAUNCH's emulated form is one). */
#define TP_CUDA_COUNT(field, n) ((void)(tp_cuda_stats_on && (tp_cuda_stats.field += (n), true)))

/* A copy to or from host memory `host`: counted as pageable unless the memory is pinned. */
void tp_cuda_count_host_copy(const void *host);

/* The counts as "launches=L syncs=H allocs=A queries=Q pageable=P convert_bytes=C
 * fp32_flop_share=F" (F: the f32 share of the flops, 0 when none), then zeroed. */
void tp_cuda_stats_take(char *line, size_t size);

#ifdef __cplusplus
}
#endif

#endif
