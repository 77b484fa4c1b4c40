/* Elementwise activations, forward and backward: Gelu's gradient, SwiGLU and GeGLU. Each kernel
 * is its __global__ function (a grid-stride loop over element.h's formula) and its entry
 * point of ops.h, which launches it on the unit's stream. Gelu's forward is a unary op
 * (elementwise.cu). */
#include "../kernels/element.h"
#include "common.cuh"
#include "dtype.cuh" /* tp_store_result */
#include "ops.h"

#define LAUNCH_OVER(n, kernel, stream, ...)                                                                         \
  TP_LAUNCH(kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), (stream)->cuda, __VA_ARGS__)

/* ---- Gelu's gradient ---- */

template <typename Out>
__global__ void gelu_backward_kernel(const float *dy, const float *x, int64_t n, bool tanh_approx, Out *dx) {
  TP_GRID_STRIDE_LOOP(i, n) {
    tp_store_result(&dx[i], dy[i] * (tanh_approx ? tp_gelu_tanh_grad_f32(x[i]) : tp_gelu_grad_f32(x[i])));
  }
}

TpKernelStatus tp_cuda_gelu_backward_f32(const float *dy, const float *x, int64_t n, bool tanh_approx, float *dx,
                                         TpStream *stream) {
  if (n) LAUNCH_OVER(n, gelu_backward_kernel<float>, stream, dy, x, n, tanh_approx, dx);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_gelu_backward_bf16(const float *dy, const float *x, int64_t n, bool tanh_approx, uint16_t *dx,
                                          TpStream *stream) {
  if (n) LAUNCH_OVER(n, gelu_backward_kernel<uint16_t>, stream, dy, x, n, tanh_approx, dx);
  return TP_KERNEL_OK;
}

/* ---- SwiGLU: y = silu(gate) * up ---- */

__global__ void swiglu_kernel(const float *gate, const float *up, int64_t n, float *y) {
  TP_GRID_STRIDE_LOOP(i, n) y[i] = tp_swiglu_elem_f32(gate[i], up[i]);
}

TpKernelStatus tp_cuda_swiglu_f32(const float *gate, const float *up, int64_t n, float *y, TpStream *stream) {
  if (n) LAUNCH_OVER(n, swiglu_kernel, stream, gate, up, n, y);
  return TP_KERNEL_OK;
}

/* dgate or dup may be NULL */
template <typename Out>
__global__ void swiglu_backward_kernel(const float *dy, const float *gate, const float *up, int64_t n, Out *dgate,
                                       Out *dup) {
  TP_GRID_STRIDE_LOOP(i, n) {
    float g = gate[i], s = tp_logistic_f32(g);
    if (dgate) tp_store_result(&dgate[i], tp_swiglu_dgate_f32(dy[i], g, up[i], s));
    if (dup) tp_store_result(&dup[i], tp_swiglu_dup_f32(dy[i], g, s));
  }
}

TpKernelStatus tp_cuda_swiglu_backward_f32(const float *dy, const float *gate, const float *up, int64_t n,
                                           float *dgate, float *dup, TpStream *stream) {
  if (n) LAUNCH_OVER(n, swiglu_backward_kernel<float>, stream, dy, gate, up, n, dgate, dup);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_swiglu_backward_bf16(const float *dy, const float *gate, const float *up, int64_t n,
                                            uint16_t *dgate, uint16_t *dup, TpStream *stream) {
  if (n) LAUNCH_OVER(n, swiglu_backward_kernel<uint16_t>, stream, dy, gate, up, n, dgate, dup);
  return TP_KERNEL_OK;
}

/* ---- GeGLU: y = gelu(gate) * up ---- */

__global__ void geglu_kernel(const float *gate, const float *up, int64_t n, bool tanh_approx, float *y) {
  TP_GRID_STRIDE_LOOP(i, n) y[i] = (tanh_approx ? tp_gelu_tanh_f32(gate[i]) : tp_gelu_f32(gate[i])) * up[i];
}

TpKernelStatus tp_cuda_geglu_f32(const float *gate, const float *up, int64_t n, bool tanh_approx, float *y,
                                 TpStream *stream) {
  if (n) LAUNCH_OVER(n, geglu_kernel, stream, gate, up, n, tanh_approx, y);
  return TP_KERNEL_OK;
}

/* dgate = (dy * up) gelu'(gate), dup = dy * gelu(gate), as the unfused Mul and GeluBackward;
 * dgate or dup may be NULL */
__global__ void geglu_backward_kernel(const float *dy, const float *gate, const float *up, int64_t n,
                                      bool tanh_approx, float *dgate, float *dup) {
  TP_GRID_STRIDE_LOOP(i, n) {
    float g = gate[i];
    if (dgate) dgate[i] = dy[i] * up[i] * (tanh_approx ? tp_gelu_tanh_grad_f32(g) : tp_gelu_grad_f32(g));
    if (dup) dup[i] = dy[i] * (tanh_approx ? tp_gelu_tanh_f32(g) : tp_gelu_f32(g));
  }
}

TpKernelStatus tp_cuda_geglu_backward_f32(const float *dy, const float *gate, const float *up, int64_t n,
                                          bool tanh_approx, float *dgate, float *dup, TpStream *stream) {
  if (n) LAUNCH_OVER(n, geglu_backward_kernel, stream, dy, gate, up, n, tanh_approx, dgate, dup);
  return TP_KERNEL_OK;
}
