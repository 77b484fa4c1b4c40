/* Embedding (a gather of table rows) and its backward (a scatter-add into the table). */
#include "dtype.cuh"
#include "ops.h"

enum { EMBEDDING_THREADS = 256 };

/* The row of id, counted from the end when negative; -1 when outside [-V, V). */
__device__ __forceinline__ int64_t table_row(int64_t id, int64_t V) {
  if (id < -V || id >= V) return -1;
  return id < 0 ? id + V : id;
}

/* The row of the range *part (of V rows; none: the whole table) that the table row `row`
 * of a table of V * parts rows falls on, or -1. */
__device__ __forceinline__ int64_t range_row(int64_t row, const int64_t *part, int64_t V) {
  int64_t local = part ? row - *part * V : row;
  return local >= 0 && local < V ? local : -1;
}

/* One block per position; its threads copy the row, zeros for an id outside the range. */
__global__ void embedding_kernel(const float *table, const int64_t *ids, const int64_t *part, int64_t V,
                                 int64_t parts, int64_t C, float *out, int64_t *bad) {
  int64_t i = blockIdx.x, id = table_row(ids[i], V * parts);
  if (id < 0) {
    if (threadIdx.x == 0) tp_report_bad(bad, i);
    return;
  }
  id = range_row(id, part, V);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[i * C + c] = id < 0 ? 0.0f : table[id * C + c];
}

void tp_cuda_launch_embedding_f32(const float *table, const int64_t *ids, int64_t n, int64_t V, int64_t C,
                                  float *out, int64_t *bad, TpCudaStream stream) {
  tp_cuda_launch_embedding_part_f32(table, ids, NULL, n, V, 1, C, out, bad, stream);
}

void tp_cuda_launch_embedding_part_f32(const float *table, const int64_t *ids, const int64_t *part, int64_t n,
                                       int64_t V, int64_t parts, int64_t C, float *out, int64_t *bad,
                                       TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(embedding_kernel, dim3((unsigned)n), dim3(EMBEDDING_THREADS), stream, table, ids, part, V, parts, C, out,
            bad);
}

/* ---- the backward: a scatter-add, deterministic ----
 * The positions are sorted by their row (stable: each row's stay in the order of i), then
 * one thread per (row, column) adds that row's dy in that order, as the CPU does. */

enum { SORT_THREADS = 1024 };

/* One block: keys[i] = the row of ids[i] in the range *part of V rows of a table of V *
 * parts (part NULL: the whole; V when outside it, reported when outside the table, or
 * when it is the table's row padding_idx, which adds nothing),
 * pos[i] = i, then
 * a stable LSD radix sort of (key, pos), one bit a pass, between (keys, pos) and (keys2,
 * pos2); after `bits` passes the result is in (keys, pos) if bits is even, else in
 * (keys2, pos2). Each thread keeps a contiguous chunk, so a pass is a count of the
 * chunk's zeros, a block scan of the counts and an in-order scatter. */
__global__ void __launch_bounds__(SORT_THREADS)
    sort_rows_kernel(const void *ids, bool ids_i32, int64_t padding_idx, const int64_t *part, int64_t n, int64_t V,
                     int64_t parts, int bits, int64_t *keys, int64_t *pos, int64_t *keys2, int64_t *pos2,
                     int64_t *bad) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    int64_t row = table_row(tp_load_index(ids_i32 ? TP_I32 : TP_I64, ids, i), V * parts);
    if (row < 0) tp_report_bad(bad, i);
    else row = row == padding_idx ? -1 : range_row(row, part, V);
    keys[i] = row < 0 ? V : row, pos[i] = i;
  }
  __shared__ int64_t zeros_through[SORT_THREADS]; /* zeros in the chunks up to this thread's */
  int64_t per = (n + blockDim.x - 1) / blockDim.x, first = per * threadIdx.x, last = first + per;
  first = first < n ? first : n, last = last < n ? last : n;
  for (int b = 0; b < bits; b++) {
    __syncthreads(); /* the previous pass's scatter (or the fill) is done */
    int64_t zeros = 0;
    for (int64_t k = first; k < last; k++) zeros += !(keys[k] >> b & 1);
    zeros_through[threadIdx.x] = zeros;
    for (unsigned step = 1; step < blockDim.x; step <<= 1) {
      __syncthreads();
      int64_t add = threadIdx.x >= step ? zeros_through[threadIdx.x - step] : 0;
      __syncthreads();
      zeros_through[threadIdx.x] += add;
    }
    __syncthreads();
    int64_t zero_at = zeros_through[threadIdx.x] - zeros, one_at = zeros_through[blockDim.x - 1] + first - zero_at;
    for (int64_t k = first; k < last; k++) {
      int64_t at = keys[k] >> b & 1 ? one_at++ : zero_at++;
      keys2[at] = keys[k], pos2[at] = pos[k];
    }
    int64_t *t = keys;
    keys = keys2, keys2 = t, t = pos, pos = pos2, pos2 = t;
  }
}

/* For each (o, p, c) where p starts the run of a row in the sorted keys: that row's dy,
 * added in the order of the positions (the CPU's bits: 0 + the first is the first). */
__global__ void add_rows_kernel(const float *dy, const int64_t *keys, const int64_t *pos, int64_t n, int64_t outer,
                                int64_t V, int64_t C, float *dtable) {
  TP_GRID_STRIDE_LOOP(e, outer * n * C) {
    int64_t c = e % C, p = e / C % n, o = e / C / n, row = keys[p];
    if (row == V || (p > 0 && keys[p - 1] == row)) continue;
    float sum = 0;
    for (int64_t q = p; q < n && keys[q] == row; q++) sum += dy[(o * n + pos[q]) * C + c];
    dtable[(o * V + row) * C + c] = sum;
  }
}

size_t tp_cuda_embedding_backward_scratch(int64_t n) { return 4 * (size_t)n * sizeof(int64_t); }

/* The backward of the range *part (NULL: the whole table, parts 1); row padding_idx of the
 * whole table (-1: none) gets nothing. */
static void embedding_backward(const float *dy, const void *ids, bool ids_i32, int64_t padding_idx,
                               const int64_t *part, int64_t n, int64_t outer, int64_t V, int64_t parts, int64_t C,
                               float *dtable, int64_t *bad, void *scratch, TpCudaStream stream) {
  if (outer * V * C != 0) TP_CUDA_CHECK(cudaMemsetAsync(dtable, 0, (size_t)(outer * V * C) * sizeof(float), stream));
  if (n == 0) return;
  int bits = 0; /* the keys are in [0, V] */
  while (bits < 63 && (V >> bits) != 0) bits++;
  int64_t *keys = static_cast<int64_t *>(scratch), *pos = keys + n, *keys2 = pos + n, *pos2 = keys2 + n;
  TP_LAUNCH(sort_rows_kernel, dim3(1), dim3(SORT_THREADS), stream, ids, ids_i32, padding_idx, part, n, V, parts,
            bits, keys, pos, keys2, pos2, bad);
  if (bits % 2) keys = keys2, pos = pos2;
  if (outer * C != 0)
    TP_LAUNCH(add_rows_kernel, tp_elementwise_grid(outer * n * C), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, dy,
              keys, pos, n, outer, V, C, dtable);
}

void tp_cuda_launch_embedding_backward_f32(const float *dy, const void *ids, bool ids_i32, int64_t padding_idx,
                                           int64_t n, int64_t outer, int64_t V, int64_t C, float *dtable,
                                           int64_t *bad, void *scratch, TpCudaStream stream) {
  embedding_backward(dy, ids, ids_i32, padding_idx, NULL, n, outer, V, 1, C, dtable, bad, scratch, stream);
}

void tp_cuda_launch_embedding_part_backward_f32(const float *dy, const int64_t *ids, const int64_t *part, int64_t n,
                                                int64_t V, int64_t parts, int64_t C, float *dtable, int64_t *bad,
                                                void *scratch, TpCudaStream stream) {
  embedding_backward(dy, ids, false, -1, part, n, 1, V, parts, C, dtable, bad, scratch, stream);
}

/* ---- the entry points (ops.h): out-of-range ids reported in the stream's bad index ---- */

TpKernelStatus tp_cuda_embedding_f32(const float *table, const int64_t *ids, int64_t n, int64_t V, int64_t C,
                                     float *out, int64_t *bad, TpStream *stream) {
  (void)bad;
  tp_cuda_launch_embedding_f32(table, ids, n, V, C, out, stream->bad, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_embedding_part_f32(const float *table, const int64_t *ids, const int64_t *part, int64_t n,
                                          int64_t V, int64_t parts, int64_t C, float *out, int64_t *bad,
                                          TpStream *stream) {
  (void)bad;
  tp_cuda_launch_embedding_part_f32(table, ids, part, n, V, parts, C, out, stream->bad, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_embedding_part_backward_f32(const float *dy, const int64_t *ids, const int64_t *part,
                                                   int64_t n, int64_t V, int64_t parts, int64_t C, float *dtable,
                                                   int64_t *bad, TpStream *stream) {
  (void)bad;
  void *scratch = tp_cuda_scratch(stream, tp_cuda_embedding_backward_scratch(n) + 1);
  tp_cuda_launch_embedding_part_backward_f32(dy, ids, part, n, V, parts, C, dtable, stream->bad, scratch,
                                             stream->cuda);
  return TP_KERNEL_OK;
}
