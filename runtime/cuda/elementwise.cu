/* Unary and binary f32 ops with numpy broadcasting, Where, over the host's TpIter (the CPU
 * kernels' broadcasting, computed once on the host): one thread per output element, which
 * finds each operand's offset from its index. */
#include <math.h>

#include "../kernels/element.h"
#include "strided.cuh"

/* The CPU's float formulas (runtime/kernels/element.h) */
__global__ void unary_kernel(TpUnaryOp op, const float *x, int64_t n, float *y) {
  TP_GRID_STRIDE_LOOP(i, n) y[i] = tp_unary_f32(op, x[i]);
}

bool tp_cuda_launch_unary_f32(TpUnaryOp op, const float *x, int64_t n, float *y, TpCudaStream stream) {
  if (op == TP_UNARY_NOT) return false;
  if (n == 0) return true;
  TP_LAUNCH(unary_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, op, x, n, y);
  return true;
}

/* The CPU's float formulas (elementwise.c FLOAT_BINARY_RUN): Max and Min propagate a's NaN. */
__global__ void binary_kernel(TpBinaryOp op, Strided s, const float *a, const float *b, float *y) {
  TP_GRID_STRIDE_LOOP(e, s.n) {
    float u = a[offset_of(s, 1, e)], v = b[offset_of(s, 2, e)], r = 0;
    switch (op) {
    case TP_BINARY_ADD: r = u + v; break;
    case TP_BINARY_SUB: r = u - v; break;
    case TP_BINARY_MUL: r = u * v; break;
    case TP_BINARY_DIV: r = u / v; break;
    case TP_BINARY_POW: r = powf(u, v); break;
    case TP_BINARY_MAX: r = u > v || u != u ? u : v; break;
    case TP_BINARY_MIN: r = u < v || u != u ? u : v; break;
    default: break; /* bool results never get here */
    }
    y[offset_of(s, 0, e)] = r;
  }
}

bool tp_cuda_launch_binary_f32(TpBinaryOp op, const TpIter *it, const float *a, const float *b, float *y,
                               TpCudaStream stream) {
  if (op > TP_BINARY_MIN) return false;
  const size_t elsize[] = {sizeof(float), sizeof(float), sizeof(float)};
  Strided s = strided(it, elsize);
  if (s.n == 0) return true;
  TP_LAUNCH(binary_kernel, tp_elementwise_grid(s.n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, op, s, a, b, y);
  return true;
}

__global__ void where_kernel(Strided s, const bool *cond, const float *a, const float *b, float *y) {
  TP_GRID_STRIDE_LOOP(e, s.n) {
    y[offset_of(s, 0, e)] = cond[offset_of(s, 1, e)] ? a[offset_of(s, 2, e)] : b[offset_of(s, 3, e)];
  }
}

void tp_cuda_launch_where_f32(const TpIter *it, const bool *cond, const float *a, const float *b, float *y,
                              TpCudaStream stream) {
  const size_t elsize[] = {sizeof(float), sizeof(bool), sizeof(float), sizeof(float)};
  Strided s = strided(it, elsize);
  if (s.n == 0) return;
  TP_LAUNCH(where_kernel, tp_elementwise_grid(s.n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, s, cond, a, b, y);
}
