/* Rotary position embeddings, forward and backward (tp_rotary_f32, tp_rotary_backward_f32):
 * one thread per element of y, each computing its own output from its pair (a, b). */
#include "common.cuh"
#include "ops.h"

/* The tables' element strides of the row dims (0 where broadcast), by value. */
struct RotaryShape {
  int rank;
  int64_t dims[TP_MAX_RANK], table_stride[TP_MAX_RANK];
  int64_t rows, D, rd;
  bool interleaved, backward;
};

/* The pairs (a, b) are (j, j + rd/2) or (2i, 2i + 1). Forward: y_a = x_a c_a - x_b s_a,
 * y_b = x_b c_b + x_a s_b; backward (the transpose): y_a = x_a c_a + x_b s_b, y_b = x_b c_b -
 * x_a s_a, written as the CPU kernel writes them. Features past rd are copied; an odd rd's
 * last rotary feature is in no pair and, as on the CPU, not written. */
__global__ void rotary_kernel(const float *x, const float *cos, const float *sin, RotaryShape p, float *y) {
  int64_t half = p.rd / 2, off = p.interleaved ? 1 : half;
  TP_GRID_STRIDE_LOOP(e, p.rows * p.D) {
    int64_t r = e / p.D, j = e % p.D;
    if (j >= p.rd) {
      y[e] = x[e];
      continue;
    }
    if (j >= 2 * half) continue;
    int64_t rest = r, at = 0;
    for (int k = p.rank - 2; k >= 0; k--) {
      at += rest % p.dims[k] * p.table_stride[k];
      rest /= p.dims[k];
    }
    bool is_a = p.interleaved ? j % 2 == 0 : j < half;
    int64_t a = is_a ? j : j - off, b = a + off;
    const float *xr = x + r * p.D, *c = cos + at, *s = sin + at;
    float xa = xr[a], xb = xr[b], sa = p.backward ? 1.0f : -1.0f;
    if (is_a) y[e] = xa * c[a] + sa * xb * s[p.backward ? b : a];
    else y[e] = xb * c[b] - sa * xa * s[p.backward ? a : b];
  }
}

static void rotary(const float *x, const float *cos, const float *sin, int rank, const int64_t *dims,
                   const int64_t *table_dims, int64_t rd, bool interleaved, bool backward, float *y,
                   TpCudaStream stream) {
  RotaryShape p = {};
  p.rank = rank, p.D = dims[rank - 1], p.rd = rd, p.interleaved = interleaved, p.backward = backward;
  p.rows = 1;
  int64_t t = rd;
  for (int k = rank - 2; k >= 0; k--) {
    p.dims[k] = dims[k];
    p.table_stride[k] = table_dims[k] == 1 ? 0 : t;
    t *= table_dims[k];
    p.rows *= dims[k];
  }
  if (p.rows * p.D == 0) return;
  TP_LAUNCH(rotary_kernel, tp_elementwise_grid(p.rows * p.D), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, x, cos, sin,
            p, y);
}

/* dims and table_dims in host memory, the tensors on the device */
TpKernelStatus tp_cuda_rotary_f32(const float *x, const float *cos, const float *sin, int rank, const int64_t *dims,
                                  const int64_t *table_dims, int64_t rotary_dim, bool interleaved, float *y,
                                  TpStream *stream) {
  rotary(x, cos, sin, rank, dims, table_dims, rotary_dim, interleaved, false, y, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_rotary_backward_f32(const float *dy, const float *cos, const float *sin, int rank,
                                           const int64_t *dims, const int64_t *table_dims, int64_t rotary_dim,
                                           bool interleaved, float *dx, TpStream *stream) {
  rotary(dy, cos, sin, rank, dims, table_dims, rotary_dim, interleaved, true, dx, stream->cuda);
  return TP_KERNEL_OK;
}
