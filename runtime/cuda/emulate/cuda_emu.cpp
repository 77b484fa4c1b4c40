/* The fiber scheduler under cuda_emu.h: one block at a time, each of its threads a
 * ucontext fiber with its own stack, switched only at barriers. (ucontext rather than
 * Boost.Fiber: the barriers must be strict, reporting a thread that leaves a block's
 * barrier unmatched, which needs our own scheduler loop anyway, and glibc's ucontext adds
 * no dependency.) */
#include "cuda_emu.h"

#include <deque>
#include <map>
#include <set>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

enum State { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };
enum { STACK_SIZE = 256 * 1024, MAX_SHUFFLE_BYTES = 8, MAX_GATHER_BYTES = 64 };

struct Fiber {
  ucontext_t ctx;
  State state;
  dim3 idx;
  char *stack;
};

struct Block {
  Fiber *fibers;
  int nthreads;
  int running; /* the fiber now executing */
  int block_arrived;
  int warp_arrived[32];
  unsigned char slot[1024][MAX_SHUFFLE_BYTES];
  unsigned char wide[1024][MAX_GATHER_BYTES]; /* tp_emu_warp_gather's */
  void (*body)(void *);
  void *closure;
  ucontext_t scheduler;
  const void *main_stack; /* the scheduler's stack, for AddressSanitizer's fiber switches */
  size_t main_stack_size;
};

Block *cur;

[[noreturn]] void die(const char *what) {
  fprintf(stderr, "cuda-emulate: block (%u,%u,%u) thread (%u,%u,%u): %s\n", blockIdx.x, blockIdx.y, blockIdx.z,
          threadIdx.x, threadIdx.y, threadIdx.z, what);
  abort();
}

int linear_thread(void) { return cur->running; }

/* Switches from the running fiber back to the scheduler. */
void yield_to_scheduler(void) {
  Fiber *f = &cur->fibers[cur->running];
#ifdef EMU_ASAN
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, cur->main_stack, cur->main_stack_size);
#endif
  swapcontext(&f->ctx, &cur->scheduler);
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, &cur->main_stack, &cur->main_stack_size);
#endif
}

void fiber_main(void) {
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &cur->main_stack, &cur->main_stack_size);
#endif
  cur->body(cur->closure);
  cur->fibers[cur->running].state = DONE;
#ifdef EMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, cur->main_stack, cur->main_stack_size); /* this fiber ends */
#endif
  setcontext(&cur->scheduler);
}

/* The lanes of warp w of the block (its last warp may be partial). */
unsigned warp_lanes(int w) {
  int n = cur->nthreads - w * warpSize;
  return n >= warpSize ? 0xffffffffu : (1u << n) - 1;
}

/* Thread i of the block, ready to start. Not inlined: getcontext returns twice, and the
 * caller's loop variables must not live across it. */
__attribute__((noinline)) void start_fiber(Fiber *f, int i) {
  f->state = RUNNABLE;
  f->idx = dim3(i % blockDim.x, i / blockDim.x % blockDim.y, i / (blockDim.x * blockDim.y));
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = f->stack;
  f->ctx.uc_stack.ss_size = STACK_SIZE;
  f->ctx.uc_link = nullptr;
  makecontext(&f->ctx, fiber_main, 0);
}

void run_block(Block *b) {
  int n = b->nthreads;
  for (int i = 0; i < n; i++) start_fiber(&b->fibers[i], i);
  b->block_arrived = 0;
  memset(b->warp_arrived, 0, sizeof b->warp_arrived);
  /* Each warp runs as far as it can (until every lane waits at a block barrier or has
   * ended) before the next one starts, so a warp races ahead of the others wherever no
   * __syncthreads holds it: a missing barrier shows up as a read of shared memory another
   * warp has not written yet, or has overwritten already. Odd blocks take the warps in
   * reverse order, so both orders are tried. */
  int warps = (n + warpSize - 1) / warpSize;
  for (;;) {
    bool progress = false, all_done = true;
    for (int k = 0; k < warps; k++) {
      int w = blockIdx.x % 2 ? warps - 1 - k : k;
      for (bool warp_ran = true; warp_ran;) {
        warp_ran = false;
        for (int i = w * warpSize; i < n && i < (w + 1) * warpSize; i++) {
          Fiber *f = &b->fibers[i];
          if (f->state != RUNNABLE) continue;
          warp_ran = progress = true;
          b->running = i;
          threadIdx = f->idx;
#ifdef EMU_ASAN
          void *fake = nullptr;
          __sanitizer_start_switch_fiber(&fake, f->stack, STACK_SIZE);
#endif
          swapcontext(&b->scheduler, &f->ctx);
#ifdef EMU_ASAN
          __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
        }
      }
    }
    for (int i = 0; i < n; i++)
      if (b->fibers[i].state != DONE) all_done = false;
    if (all_done) return;
    if (!progress) {
      for (int i = 0; i < n; i++)
        if (b->fibers[i].state == DONE) {
          threadIdx = b->fibers[i].idx;
          die("exited while other threads of its block wait at a barrier (__syncthreads or a shuffle in "
              "divergent code)");
        }
      die("deadlock: every thread waits at a barrier that cannot complete");
    }
  }
}

} // namespace

void __syncthreads(void) {
  Fiber *f = &cur->fibers[cur->running];
  if (++cur->block_arrived == cur->nthreads) { /* the last one releases the others */
    cur->block_arrived = 0;
    for (int i = 0; i < cur->nthreads; i++)
      if (cur->fibers[i].state == AT_BLOCK_BARRIER) cur->fibers[i].state = RUNNABLE;
    return;
  }
  f->state = AT_BLOCK_BARRIER;
  yield_to_scheduler();
}

int tp_emu_lane(void) { return linear_thread() % warpSize; }

/* A barrier of the calling thread's warp. */
static void warp_barrier(void) {
  int t = linear_thread(), w = t / warpSize, first = w * warpSize;
  int lanes = __builtin_popcount(warp_lanes(w));
  if (++cur->warp_arrived[w] == lanes) {
    cur->warp_arrived[w] = 0;
    for (int i = first; i < first + lanes; i++)
      if (cur->fibers[i].state == AT_WARP_BARRIER) cur->fibers[i].state = RUNNABLE;
    return;
  }
  cur->fibers[t].state = AT_WARP_BARRIER;
  yield_to_scheduler();
}

void tp_emu_shuffle(unsigned mask, const void *in, void *out, size_t size, int src) {
  int t = linear_thread(), w = t / warpSize;
  if (mask != warp_lanes(w))
    die("shuffle mask must name exactly the warp's lanes (a partial warp: only those it has)");
  if (size > MAX_SHUFFLE_BYTES) die("shuffle of a value wider than 8 bytes");
  if (src < 0 || !(warp_lanes(w) >> src & 1)) die("shuffle reads a lane the warp does not have");
  memcpy(cur->slot[t], in, size);
  warp_barrier(); /* every lane has written */
  memcpy(out, cur->slot[w * warpSize + src], size);
  warp_barrier(); /* every lane has read before the slots are reused */
}

void tp_emu_warp_gather(const void *in, void *out, size_t size) {
  int t = linear_thread(), w = t / warpSize;
  if (warp_lanes(w) != 0xffffffffu) die("warp-collective operation in a partial warp");
  if (size > MAX_GATHER_BYTES) die("warp gather of more than 64 bytes a lane");
  memcpy(cur->wide[t], in, size);
  warp_barrier(); /* every lane has written */
  for (int l = 0; l < warpSize; l++)
    memcpy(static_cast<unsigned char *>(out) + l * size, cur->wide[w * warpSize + l], size);
  warp_barrier(); /* every lane has read before the slots are reused */
}

void tp_emu_die(const char *what) { die(what); }

void tp_emu_launch(dim3 grid, dim3 block, void (*body)(void *), void *closure) {
  int n = (int)(block.x * block.y * block.z);
  if (n < 1 || n > 1024) {
    fprintf(stderr, "cuda-emulate: block of %d threads (CUDA allows 1..1024)\n", n);
    abort();
  }
  Block *b = new Block();
  b->nthreads = n;
  b->body = body;
  b->closure = closure;
  b->fibers = new Fiber[n];
  for (int i = 0; i < n; i++) b->fibers[i].stack = static_cast<char *>(malloc(STACK_SIZE));
  Block *outer = cur;
  cur = b;
  gridDim = grid;
  blockDim = block;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        blockIdx = dim3(x, y, z);
        run_block(b);
      }
  cur = outer;
  for (int i = 0; i < n; i++) free(b->fibers[i].stack);
  delete[] b->fibers;
  delete b;
}

/* ---- the runtime API (cuda_emu.h): device memory is host memory, streams run at once ---- */
namespace {
int emulated_device_count(void) {
  const char *n = getenv("TOKPIPE_CUDA_EMULATE_DEVICES");
  return n ? atoi(n) : 1;
}
int current_device;
/* What cudaMalloc handed out (start -> bytes), for cudaPointerGetAttributes. */
std::map<uintptr_t, size_t> device_blocks;
} // namespace

void progress_all_streams(void);

/* A stream's asynchronous work (tp_emu_stream_async): queued[completed..] are pending. */
struct CUstream_st {
  struct Async {
    bool (*poll)(void *);
    void *arg;
  };
  std::deque<Async> pending;
  uint64_t queued = 0, completed = 0;
  /* Polls the pending work in order; true once everything queued before `upto` is done. */
  bool done_upto(uint64_t upto) {
    while (completed < upto && pending.front().poll(pending.front().arg)) pending.pop_front(), completed++;
    return completed >= upto;
  }
  /* Every stream moves on meanwhile, as a GPU's do whatever the host waits for: work queued
   * on one stream (an NCCL send) may be what another's (a receive) needs from the peer. */
  void wait_upto(uint64_t upto) {
    for (;;) {
      progress_all_streams();
      if (done_upto(upto)) return;
      sched_yield();
    }
  }
};
/* An event: its stream's work queued before the record (no stream: never recorded). */
struct CUevent_st {
  CUstream_st *stream = nullptr;
  uint64_t upto = 0;
};
namespace {
CUstream_st default_stream; /* stream 0 */
std::set<CUstream_st *> live_streams;
CUstream_st *stream_of(cudaStream_t s) { return s ? s : &default_stream; }
} // namespace

void progress_all_streams(void) {
  default_stream.done_upto(default_stream.queued);
  for (CUstream_st *s : live_streams) s->done_upto(s->queued);
}

cudaError_t cudaGetDeviceCount(int *count) {
  *count = emulated_device_count();
  return *count > 0 ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= emulated_device_count()) return cudaErrorInvalidDevice;
  current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
  *device = current_device;
  return cudaSuccess;
}
/* cudaMalloc and cudaFree wait for the whole device first, as CUDA may (and cudaFree does):
 * a runtime that allocates between an NCCL send and the receive its peer needs first
 * deadlocks here as it could on a GPU. */
cudaError_t cudaMalloc(void **p, size_t bytes) {
  cudaDeviceSynchronize();
  /* 256-byte aligned as CUDA's: the products' alignments (the cuBLASLt plans' keys) are then
   * a GPU's, not the host allocator's */
  *p = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (!*p) return cudaErrorMemoryAllocation;
  device_blocks[reinterpret_cast<uintptr_t>(*p)] = bytes;
  return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
  cudaDeviceSynchronize();
  device_blocks.erase(reinterpret_cast<uintptr_t>(p));
  free(p);
  return cudaSuccess;
}
/* Stream-ordered allocation: no device-wide wait. The memory is the stream's from this
 * point of it on, and it is released once the stream's earlier work is done. */
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t) {
  *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (!*p) return cudaErrorMemoryAllocation;
  device_blocks[reinterpret_cast<uintptr_t>(*p)] = bytes;
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  cudaStreamSynchronize(s);
  device_blocks.erase(reinterpret_cast<uintptr_t>(p));
  free(p);
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p) {
  uintptr_t at = reinterpret_cast<uintptr_t>(p);
  auto block = device_blocks.upper_bound(at);
  bool device = block != device_blocks.begin() && (--block, at < block->first + (block->second ? block->second : 1));
  *a = {device ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered, device ? current_device : -1,
        device ? const_cast<void *>(p) : nullptr, nullptr};
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device) {
  if (device < 0 || device >= emulated_device_count()) return cudaErrorInvalidDevice;
  snprintf(id, (size_t)len, "0000:%02x:00.0", device);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind) {
  if (bytes) memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  tp_emu_stream_ready(s);
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
  tp_emu_stream_ready(s);
  if (bytes) memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
  *s = new CUstream_st;
  live_streams.insert(*s);
  return cudaSuccess;
}
/* Its asynchronous work is done first (a GPU finishes it after the call returns). */
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return cudaErrorInvalidValue;
  s->wait_upto(s->queued);
  live_streams.erase(s);
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  stream_of(s)->wait_upto(stream_of(s)->queued);
  return cudaSuccess;
}
void tp_emu_stream_ready(cudaStream_t s) {
  if (stream_of(s)->completed < stream_of(s)->queued) stream_of(s)->wait_upto(stream_of(s)->queued);
}
void tp_emu_stream_async(cudaStream_t s, bool (*poll)(void *), void *arg) {
  stream_of(s)->pending.push_back({poll, arg});
  stream_of(s)->queued++;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  *e = {stream_of(s), stream_of(s)->queued};
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  progress_all_streams();
  return !e->stream || e->stream->done_upto(e->upto) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e->stream) e->stream->wait_upto(e->upto);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) { return cudaEventSynchronize(e); }
cudaError_t cudaDeviceSynchronize(void) {
  cudaStreamSynchronize(nullptr);
  for (CUstream_st *s : live_streams) s->wait_upto(s->queued);
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorNotReady: return "device not ready";
  }
  return "unknown error";
}
