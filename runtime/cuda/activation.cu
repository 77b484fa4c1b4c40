/* Elementwise activations, forward and backward: Gelu (erf and tanh forms, in the CPU
 * kernels' cancellation-free forms) and SwiGLU's gate. Grid-stride loops. */
#include "../kernels/element.h"
#include "common.cuh"

/* The formulas: runtime/kernels/element.h. */
__global__ void gelu_kernel(const float *x, int64_t n, bool tanh_approx, float *y) {
  TP_GRID_STRIDE_LOOP(i, n) y[i] = tanh_approx ? tp_gelu_tanh_f32(x[i]) : tp_gelu_f32(x[i]);
}

void tp_cuda_launch_gelu_f32(const float *x, int64_t n, bool tanh_approx, float *y, TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(gelu_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, x, n, tanh_approx, y);
}

__global__ void gelu_backward_kernel(const float *dy, const float *x, int64_t n, bool tanh_approx, float *dx) {
  TP_GRID_STRIDE_LOOP(i, n) dx[i] = dy[i] * (tanh_approx ? tp_gelu_tanh_grad_f32(x[i]) : tp_gelu_grad_f32(x[i]));
}

void tp_cuda_launch_gelu_backward_f32(const float *dy, const float *x, int64_t n, bool tanh_approx, float *dx,
                               TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(gelu_backward_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, dy, x, n, tanh_approx,
            dx);
}

__global__ void swiglu_kernel(const float *gate, const float *up, int64_t n, float *y) {
  TP_GRID_STRIDE_LOOP(i, n) y[i] = tp_swiglu_elem_f32(gate[i], up[i]);
}

void tp_cuda_launch_swiglu_f32(const float *gate, const float *up, int64_t n, float *y, TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(swiglu_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, gate, up, n, y);
}

__global__ void swiglu_backward_kernel(const float *dy, const float *gate, const float *up, int64_t n, float *dgate,
                                       float *dup) {
  TP_GRID_STRIDE_LOOP(i, n) {
    float g = gate[i], s = tp_logistic_f32(g);
    if (dgate) dgate[i] = tp_swiglu_dgate_f32(dy[i], g, up[i], s);
    if (dup) dup[i] = tp_swiglu_dup_f32(dy[i], g, s);
  }
}

void tp_cuda_launch_swiglu_backward_f32(const float *dy, const float *gate, const float *up, int64_t n, float *dgate,
                                 float *dup, TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(swiglu_backward_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, dy, gate, up, n, dgate,
            dup);
}
