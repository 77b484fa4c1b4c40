/* The CUDA stream of the compute backend and what the plan's kernels need beside it
 * (stream.h). */
#include "stream.h"

#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "ops.h"

/* What s->bad holds while no kernel has met an index out of range. Static: the copies that
 * set it are queued on the stream and read their source when the stream reaches them. */
static const int64_t no_bad_index = INT64_MAX;

void (*tp_cuda_failure_hook)(const char *what) = NULL; /* check.h (C linkage there) */

struct TpCudaConstant {
  const void *host; /* NULL: a free slot */
  void *device;
};

TpStream *tp_cuda_stream_new(void) {
  TpStream *s = static_cast<TpStream *>(calloc(1, sizeof *s));
  if (!s) return NULL;
  cudaStream_t cuda;
  TP_CUDA_CHECK(cudaStreamCreateWithFlags(&cuda, cudaStreamNonBlocking));
  s->cuda = cuda;
  s->blas = tp_cuda_blas_create();
  TP_CUDA_ALLOC(cudaMalloc(reinterpret_cast<void **>(&s->bad), sizeof *s->bad));
  TP_CUDA_ALLOC(cudaMallocHost(reinterpret_cast<void **>(&s->bad_host), sizeof *s->bad_host));
  /* on s itself: cudaMemcpy runs on the legacy stream, which a non-blocking stream's kernels
   * do not wait for */
  TP_CUDA_CHECK(cudaMemcpyAsync(s->bad, &no_bad_index, sizeof no_bad_index, cudaMemcpyHostToDevice, cuda));
  if (!s->blas) {
    tp_cuda_stream_free(s);
    return NULL;
  }
  return s;
}

void tp_cuda_stream_free(TpStream *s) {
  if (!s) return;
  for (size_t i = 0; i < s->constant_slots; i++)
    if (s->constants[i].host) TP_CUDA_CHECK(cudaFreeAsync(s->constants[i].device, s->cuda));
  free(s->constants);
  if (s->scratch) TP_CUDA_CHECK(cudaFreeAsync(s->scratch, s->cuda));
  TP_CUDA_WAIT(cudaStreamSynchronize(s->cuda));
  for (int i = 0; i < TP_CUDA_TABLES; i++) {
    TpCudaTable *t = &s->tables[i];
    if (t->device) TP_CUDA_CHECK(cudaFree(t->device));
    if (t->host) TP_CUDA_CHECK(cudaFreeHost(t->host));
    if (t->copied) TP_CUDA_CHECK(cudaEventDestroy(t->copied));
  }
  TP_CUDA_CHECK(cudaFree(s->bad));
  TP_CUDA_CHECK(cudaFreeHost(s->bad_host));
  tp_cuda_blas_destroy(s->blas);
  TP_CUDA_CHECK(cudaStreamDestroy(s->cuda));
  free(s);
}

int64_t tp_cuda_stream_sync(TpStream *s) {
  tp_cuda_count_host_copy(s->bad_host);
  TP_CUDA_CHECK(cudaMemcpyAsync(s->bad_host, s->bad, sizeof *s->bad, cudaMemcpyDeviceToHost, s->cuda));
  TP_CUDA_WAIT(cudaStreamSynchronize(s->cuda));
  int64_t bad = *s->bad_host;
  if (bad == no_bad_index) return -1;
  /* before the next kernels of s, never after one of them has reported */
  TP_CUDA_CHECK(cudaMemcpyAsync(s->bad, &no_bad_index, sizeof no_bad_index, cudaMemcpyHostToDevice, s->cuda));
  return bad;
}

/* Scratch and constants are allocated and freed in the order of the stream (cudaMallocAsync):
 * no device-wide wait, which a cudaMalloc or cudaFree in the middle of a step could make
 * while an NCCL transfer waits for this rank's next unit (a deadlock). */
void *tp_cuda_scratch(TpStream *s, size_t bytes) {
  if (bytes <= s->scratch_bytes) return s->scratch;
  size_t grown = s->scratch_bytes * 2 > bytes ? s->scratch_bytes * 2 : bytes;
  if (s->scratch) TP_CUDA_CHECK(cudaFreeAsync(s->scratch, s->cuda)); /* after the kernels queued before */
  s->scratch = NULL;
  TP_CUDA_ALLOC(cudaMallocAsync(&s->scratch, (grown + 255) / 256 * 256, s->cuda));
  s->scratch_bytes = grown;
  return s->scratch;
}

static size_t constant_slot(const TpCudaConstant *table, size_t slots, const void *host) {
  size_t i = ((uintptr_t)host >> 4) * 0x9E3779B97F4A7C15ull % slots;
  while (table[i].host && table[i].host != host) i = (i + 1) % slots;
  return i;
}

const void *tp_cuda_constant(TpStream *s, const void *host, size_t bytes) {
  if (s->constant_slots) {
    TpCudaConstant *c = &s->constants[constant_slot(s->constants, s->constant_slots, host)];
    if (c->host) return c->device;
  }
  if (2 * (s->nconstants + 1) > s->constant_slots) { /* grow, keeping it at most half full */
    size_t slots = s->constant_slots ? 2 * s->constant_slots : 64;
    TpCudaConstant *table = static_cast<TpCudaConstant *>(calloc(slots, sizeof *table));
    if (!table) {
      fprintf(stderr, "tokpipe: error: out of host memory for the plan's constants\n");
      exit(1);
    }
    for (size_t i = 0; i < s->constant_slots; i++)
      if (s->constants[i].host) table[constant_slot(table, slots, s->constants[i].host)] = s->constants[i];
    free(s->constants);
    s->constants = table;
    s->constant_slots = slots;
  }
  TpCudaConstant *c = &s->constants[constant_slot(s->constants, s->constant_slots, host)];
  TP_CUDA_ALLOC(cudaMallocAsync(&c->device, bytes ? bytes : 1, s->cuda));
  /* queued on s, before the kernel that asked for it (the plan's constants are static, so
   * the host copy outlives the transfer) */
  tp_cuda_count_host_copy(host);
  TP_CUDA_CHECK(cudaMemcpyAsync(c->device, host, bytes, cudaMemcpyHostToDevice, s->cuda));
  c->host = host;
  s->nconstants++;
  return c->device;
}

const void *tp_cuda_table(TpStream *s, int which, const void *data, size_t bytes) {
  TpCudaTable *t = &s->tables[which];
  if (t->copied) { /* the host memory is read by the previous copy until it ran */
    cudaError_t err = cudaEventQuery(t->copied);
    if (err == cudaErrorNotReady) TP_CUDA_WAIT(cudaEventSynchronize(t->copied));
    else TP_CUDA_CHECK(err);
  } else {
    TP_CUDA_CHECK(cudaEventCreateWithFlags(&t->copied, cudaEventDisableTiming));
  }
  if (bytes > t->bytes) {
    if (t->device) TP_CUDA_CHECK(cudaFreeAsync(t->device, s->cuda));
    if (t->host) TP_CUDA_CHECK(cudaFreeHost(t->host));
    t->bytes = bytes + bytes / 2;
    TP_CUDA_ALLOC(cudaMallocAsync(&t->device, t->bytes, s->cuda));
    TP_CUDA_ALLOC(cudaMallocHost(&t->host, t->bytes));
  }
  memcpy(t->host, data, bytes);
  tp_cuda_count_host_copy(t->host);
  TP_CUDA_CHECK(cudaMemcpyAsync(t->device, t->host, bytes, cudaMemcpyHostToDevice, s->cuda));
  TP_CUDA_CHECK(cudaEventRecord(t->copied, s->cuda));
  return t->device;
}

/* ---- the plan's copies (ops.h) ---- */

TpKernelStatus tp_cuda_copy_to_host(void *host, const void *device, size_t bytes, TpStream *stream) {
  if (!bytes) return TP_KERNEL_OK;
  tp_cuda_count_host_copy(host);
  TP_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream->cuda));
  return TP_KERNEL_OK;
}

/* One thread: the value travels in the launch, so the host's copy may change at once. */
__global__ void fill_i64_kernel(int64_t *dst, int64_t value) { *dst = value; }

TpKernelStatus tp_cuda_fill_i64(int64_t *dst, int64_t value, TpStream *stream) {
  TP_LAUNCH(fill_i64_kernel, dim3(1), dim3(1), stream->cuda, dst, value);
  return TP_KERNEL_OK;
}
