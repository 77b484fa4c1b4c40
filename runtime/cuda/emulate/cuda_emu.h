/* The CUDA execution model on the CPU, for tests only (so the kernels are checked without a
 * GPU): the kernels of
 * runtime/cuda/ (the .cu files) compile as host C++ against this header (TOKPIPE_CUDA_EMULATE) and run
 * a grid block by block, each CUDA thread a fiber (ucontext) of one OS thread. What the
 * kernels rely on behaves as on a GPU, and what CUDA leaves undefined stops the test:
 *   __syncthreads   a barrier of every thread of the block; a thread that exits while
 *                   others wait there (a barrier in divergent code) is reported, aborting
 *   __shfl_*_sync   a barrier of the warp + exchange; the mask must name every lane of the
 *                   calling warp (a partial last warp names only its lanes)
 *   __shared__      one copy per block: a function-static variable (blocks run one after
 *                   another), so shared memory is never per thread
 *   atomics         plain read-modify-write (one fiber runs at a time)
 *   nvcuda::wmma    the tensor-core fragments (bf16 16x16x16, f32 accumulators): warp-
 *                   collective, every lane must call (below), in a layout of its own
 * Fibers switch only at barriers and shuffles, and each warp runs as far as it can before
 * the next one (odd blocks: the last warp first), so a missing __syncthreads shows up as a
 * read of shared memory another warp has not written yet or has already overwritten.
 * Not checked: races between the lanes of one warp through shared memory (no __syncwarp
 * here; the kernels exchange within a warp only by shuffles), and shared memory read
 * before it is written (it keeps the previous block's values, not garbage). */
#ifndef TOKPIPE_CUDA_EMULATE_CUDA_EMU_H
#define TOKPIPE_CUDA_EMULATE_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../../base/half.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(n)

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

/* The runtime API the backend and the ops use, on the CPU: device memory is host memory
 * (64-byte aligned, from the heap), a stream runs its work at once (every kernel has
 * finished when its launch returns), so copies are plain copies and every wait is over.
 * TOKPIPE_CUDA_EMULATE_DEVICES=N pretends N devices (default 1; 0: none, for the "no GPU"
 * path). */
typedef enum {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorNotReady = 600,
} cudaError_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum { cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2 };
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);

/* Asynchronous work, for the emulated NCCL (nccl_emu.h, whose operations are MPI
 * requests): everything else on a stream is done when its call returns, but work queued
 * by tp_emu_stream_async is done once poll(arg) returns true (poll frees arg then), in the
 * order queued. Events recorded after it, cudaEventQuery (cudaErrorNotReady until then) and
 * the synchronizations see it; cudaStreamWaitEvent makes the host wait for the event, since
 * the waiting stream's later work runs at once. So does work queued after it on the same
 * stream (a kernel reading an all-reduce's sum: TP_LAUNCH, the emulated products,
 * cudaMemcpyAsync, cudaMemsetAsync), through tp_emu_stream_ready. Whenever the host waits
 * or queries, every stream's work moves on (as a GPU runs all its streams); cudaMalloc and
 * cudaFree first wait for every stream (cudaDeviceSynchronize), as CUDA may. */
void tp_emu_stream_async(cudaStream_t s, bool (*poll)(void *arg), void *arg);
/* The host waits for s's asynchronous work queued so far (the stream order of what it
 * queues next); at once when there is none. */
void tp_emu_stream_ready(cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
/* Where a pointer points: device memory is what cudaMalloc returned (a host address here). */
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void *devicePointer, *hostPointer;
};
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p);
/* "0000:NN:00.0", NN the device number: one bus id per emulated device */
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device);

/* The running fiber's coordinates, set by the scheduler before it resumes a fiber. */
extern dim3 threadIdx, blockIdx, blockDim, gridDim;
enum { warpSize = 32 };

void __syncthreads(void);
/* The warp barrier + exchange under the shuffles: every lane of mask puts `size` bytes
 * from `in`, then reads lane `src`'s into `out` (its own when src is outside the warp). */
void tp_emu_shuffle(unsigned mask, const void *in, void *out, size_t size, int src);
int tp_emu_lane(void);

template <typename T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
  T out;
  int lane = tp_emu_lane(), src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  tp_emu_shuffle(mask, &v, &out, sizeof v, src);
  return out;
}
template <typename T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  T out;
  int lane = tp_emu_lane(), src = lane + (int)delta;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  tp_emu_shuffle(mask, &v, &out, sizeof v, src);
  return out;
}
template <typename T> T __shfl_sync(unsigned mask, T v, int src_lane, int width = warpSize) {
  T out;
  int lane = tp_emu_lane();
  tp_emu_shuffle(mask, &v, &out, sizeof v, (lane & ~(width - 1)) + src_lane % width);
  return out;
}

template <typename T> T atomicAdd(T *p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}
template <typename T> T atomicMin(T *p, T v) {
  T old = *p;
  if (v < old) *p = v;
  return old;
}

/* cuda_bf16.h's bf16 storage type and its conversions (round to nearest even, as
 * __float2bfloat16 rounds: base/half.h's tp_half_f32_to_bf16). */
struct __nv_bfloat16 {
  uint16_t bits;
};
static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16{tp_half_f32_to_bf16(f)}; }
static inline float __bfloat162float(__nv_bfloat16 h) { return tp_half_bf16_to_f32(h.bits); }

/* A warp-collective exchange, as the tensor-core fragment operations need: every lane of
 * the calling warp (all must call it, or the block deadlocks and the scheduler reports it)
 * puts `size` <= 64 bytes from `in`; each then reads all 32 lanes' into out (lane l's at
 * l * size; a partial warp is refused: mma.sync needs whole warps). */
void tp_emu_warp_gather(const void *in, void *out, size_t size);
/* Stops the test with `what` (a misused fragment operation). */
[[noreturn]] void tp_emu_die(const char *what);

/* mma.h's nvcuda::wmma for the one shape and the types the kernels use: 16x16x16 tiles of
 * bf16 operands (matrix_a, matrix_b) with f32 accumulators. As on a GPU, every operation
 * but fill_fragment is warp-collective: each lane of the warp calls it with the same
 * pointer and leading dimension (checked: the lanes' arguments are exchanged, so a lane
 * that skips the call deadlocks the warp, which the scheduler reports); loads and stores
 * need 256-bit aligned pointers and a leading dimension of a multiple of 16 bytes
 * (checked). The fragment layout is opaque, as CUDA documents it: here lane l holds the
 * tile elements whose column-major index f = 16 c + r has f % 32 == l, in x[f / 32], which
 * is unlike any layout a GPU uses, so a kernel that reads or writes x[] as particular rows
 * or columns (rather than all elements alike) gets wrong results here. */
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has the 16x16x16 shape only");
  enum { num_elements = 8 };
  T x[num_elements];
};

/* Every lane's (pointer, leading dimension) alike, aligned: the collective's entry. */
inline void check_collective(const void *p, unsigned ldm, size_t elem) {
  struct {
    const void *p;
    uint64_t ldm;
  } mine = {p, ldm}, all[32];
  tp_emu_warp_gather(&mine, all, sizeof mine);
  for (int l = 0; l < 32; l++)
    if (all[l].p != p || all[l].ldm != ldm) tp_emu_die("wmma: the warp's lanes passed different pointers or ldm");
  if ((uintptr_t)p % 32) tp_emu_die("wmma: pointer not 256-bit aligned");
  if (ldm * elem % 16) tp_emu_die("wmma: ldm not a multiple of 16 bytes");
}
/* Element e of the calling lane's fragment: row *r, column *c of the tile. */
inline void fragment_element(int e, int *r, int *c) {
  int f = 32 * e + tp_emu_lane();
  *r = f % 16, *c = f / 16;
}

template <typename Use, typename T, typename L> void fill_fragment(fragment<Use, 16, 16, 16, T, L> &a, T v) {
  for (int e = 0; e < 8; e++) a.x[e] = v;
}
inline bool is_row_major(row_major) { return true; }
inline bool is_row_major(col_major) { return false; }

/* matrix_a or matrix_b from p: element (r, c) at p[r * ldm + c] (row_major) or
 * p[c * ldm + r] (col_major). */
template <typename Use, typename L>
void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, L> &a, const __nv_bfloat16 *p, unsigned ldm) {
  check_collective(p, ldm, sizeof *p);
  for (int e = 0; e < 8; e++) {
    int r, c;
    fragment_element(e, &r, &c);
    a.x[e] = p[is_row_major(L()) ? r * ldm + c : c * ldm + r];
  }
}

/* The accumulator to p: element (r, c) at p[r * ldm + c] (mem_row_major) or p[c * ldm + r]. */
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &a, unsigned ldm,
                              layout_t layout) {
  check_collective(p, ldm, sizeof *p);
  for (int e = 0; e < 8; e++) {
    int r, c;
    fragment_element(e, &r, &c);
    p[layout == mem_row_major ? r * ldm + c : c * ldm + r] = a.x[e];
  }
}

/* d = a b + c: the products of bf16 operands are exact in f32, and each element sums its
 * 16 products onto c's in order of k, in f32 (a GPU's order and rounding of the sum are
 * its own; the tests' tolerances allow for either). d may be c. */
template <typename La, typename Lb>
void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, La> &a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, Lb> &b,
              const fragment<accumulator, 16, 16, 16, float> &c) {
  struct {
    __nv_bfloat16 a[8], b[8];
  } mine, all[32];
  memcpy(mine.a, a.x, sizeof mine.a);
  memcpy(mine.b, b.x, sizeof mine.b);
  tp_emu_warp_gather(&mine, all, sizeof mine);
  float A[16][16], B[16][16];
  for (int l = 0; l < 32; l++)
    for (int e = 0; e < 8; e++) {
      int f = 32 * e + l;
      A[f % 16][f / 16] = __bfloat162float(all[l].a[e]);
      B[f % 16][f / 16] = __bfloat162float(all[l].b[e]);
    }
  float out[8];
  for (int e = 0; e < 8; e++) {
    int r, col;
    fragment_element(e, &r, &col);
    float s = c.x[e];
    for (int k = 0; k < 16; k++) s += A[r][k] * B[k][col];
    out[e] = s;
  }
  memcpy(d.x, out, sizeof out);
}
} // namespace wmma
} // namespace nvcuda

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }

/* Runs body(closure) as every thread of every block of the grid (blocks in x, y, z
 * order). Aborts with a message on a deadlock or a misused shuffle. */
void tp_emu_launch(dim3 grid, dim3 block, void (*body)(void *), void *closure);

template <typename F> void tp_emu_launch_fn(dim3 grid, dim3 block, F fn) {
  tp_emu_launch(
      grid, block, [](void *c) { (*static_cast<F *>(c))(); }, &fn);
}

#endif
