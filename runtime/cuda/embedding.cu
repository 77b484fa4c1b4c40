/* Embedding (a gather of table rows) and its backward (a scatter-add into the table). */
#include "common.cuh"

enum { EMBEDDING_THREADS = 256 };

/* The id at position i, counted from the end when negative; -1 when outside [-V, V). */
__device__ __forceinline__ int64_t table_row(const int64_t *ids, int64_t i, int64_t V) {
  int64_t id = ids[i];
  if (id < -V || id >= V) return -1;
  return id < 0 ? id + V : id;
}

__device__ __forceinline__ void report_bad(int64_t *bad, int64_t i) {
  atomicMin(reinterpret_cast<long long *>(bad), static_cast<long long>(i));
}

/* One block per position; its threads copy the row. */
__global__ void embedding_kernel(const float *table, const int64_t *ids, int64_t V, int64_t C, float *out,
                                 int64_t *bad) {
  int64_t i = blockIdx.x, id = table_row(ids, i, V);
  if (id < 0) {
    if (threadIdx.x == 0) report_bad(bad, i);
    return;
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[i * C + c] = table[id * C + c];
}

void tp_cuda_launch_embedding_f32(const float *table, const int64_t *ids, int64_t n, int64_t V, int64_t C, float *out,
                           int64_t *bad, TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(embedding_kernel, dim3((unsigned)n), dim3(EMBEDDING_THREADS), stream, table, ids, V, C, out, bad);
}

/* One thread per column c: dtable[:, c] = 0, then the positions in order. */
__global__ void embedding_backward_kernel(const float *dy, const int64_t *ids, int64_t n, int64_t V, int64_t C,
                                          float *dtable, int64_t *bad) {
  int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int64_t v = 0; v < V; v++) dtable[v * C + c] = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t id = table_row(ids, i, V);
    if (id >= 0) dtable[id * C + c] += dy[i * C + c];
    else if (c == 0) report_bad(bad, i);
  }
}

void tp_cuda_launch_embedding_backward_f32(const float *dy, const int64_t *ids, int64_t n, int64_t V, int64_t C,
                                    float *dtable, int64_t *bad, TpCudaStream stream) {
  if (C == 0) return;
  dim3 grid((unsigned)((C + EMBEDDING_THREADS - 1) / EMBEDDING_THREADS));
  TP_LAUNCH(embedding_backward_kernel, grid, dim3(EMBEDDING_THREADS), stream, dy, ids, n, V, C, dtable, bad);
}
