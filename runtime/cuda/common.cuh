/* What the kernels of runtime/cuda share: the CUDA headers or, in the emulated test build
 * (TOKPIPE_CUDA_EMULATE), emulate/cuda_emu.h; the launch macro; warp and block reductions. */
#ifndef TOKPIPE_CUDA_COMMON_CUH
#define TOKPIPE_CUDA_COMMON_CUH

#include "stats.h"

#ifdef TOKPIPE_CUDA_EMULATE
#include "emulate/cuda_emu.h"
/* kernel<<<grid, block, 0, stream>>>(args...) on the CPU emulation, after the stream's
 * asynchronous work (an all-reduce it may read) */
#define TP_LAUNCH(kernel, grid, block, stream, ...)                                                                 \
  (tp_emu_stream_ready(stream), TP_CUDA_COUNT(launches, 1),                                                         \
   tp_emu_launch_fn((grid), (block), [=] { kernel(__VA_ARGS__); }))
#else
#include <cuda_runtime.h>
#define TP_LAUNCH(kernel, grid, block, stream, ...)                                                                 \
  do {                                                                                                              \
    kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__);                                                          \
    TP_CUDA_CHECK(cudaGetLastError());                                                                              \
    TP_CUDA_COUNT(launches, 1);                                                                                     \
  } while (0)
#endif

#include <stdint.h>

#include "check.h"
#include "kernels.h"

/* Threads of the row kernels (one block per row): a multiple of the warp size, as the
 * full-mask shuffles of block_reduce require. */
enum { TP_CUDA_ROW_THREADS = 256 };

/* Elementwise kernels: grid-stride loops over at most this many blocks of this many threads. */
enum { TP_CUDA_ELEMENTWISE_THREADS = 256, TP_CUDA_ELEMENTWISE_MAX_BLOCKS = 4096 };

static inline dim3 tp_elementwise_grid(int64_t n) {
  int64_t blocks = (n + TP_CUDA_ELEMENTWISE_THREADS - 1) / TP_CUDA_ELEMENTWISE_THREADS;
  return dim3((unsigned)(blocks < (int64_t)TP_CUDA_ELEMENTWISE_MAX_BLOCKS
                             ? blocks
                             : (int64_t)TP_CUDA_ELEMENTWISE_MAX_BLOCKS));
}

#define TP_GRID_STRIDE_LOOP(i, n)                                                                                   \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

struct TpSum {
  template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct TpMax {
  template <typename T> __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

/* Op over the 32 lanes of a warp, every lane receiving the result (butterfly). */
template <typename T, typename Op> __device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/* Op over every thread of the block (blockDim.x a multiple of 32, at most 1024), every
 * thread receiving the result; `identity` fills the lanes past the last warp. Called by
 * all threads of the block (it holds barriers). */
template <typename T, typename Op> __device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T partial[32];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_reduce(v, op);
  __syncthreads(); /* an earlier call's readers are done with partial */
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_reduce(lane < warps ? partial[lane] : identity, op);
}

/* The sum of squares in double of piece p of the n floats at x (TP_CUDA_SUM_PIECES pieces,
 * kernels.h), by the whole block in a fixed order, every thread receiving it: one
 * definition for the per-tensor launch (optim.cu) and the multi-tensor one (backend.cu),
 * so both give the same bits. */
__device__ inline double tp_piece_sum_squares(const float *x, int64_t n, int64_t p) {
  int64_t i0 = n * p / TP_CUDA_SUM_PIECES, i1 = n * (p + 1) / TP_CUDA_SUM_PIECES;
  double s = 0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) s += (double)x[i] * x[i];
  return block_reduce(s, TpSum(), 0.0);
}

#endif
