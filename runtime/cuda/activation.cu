/* Elementwise activations, forward and backward: Gelu (erf and tanh forms, in the CPU
 * kernels' cancellation-free forms), SwiGLU's and GeGLU's gates. Grid-stride loops. */
#include "common.cuh"

static constexpr float SQRT1_2 = 0.70710678118654752f, SQRT_2_OVER_PI = 0.7978845608028654f,
                       INV_SQRT_2PI = 0.3989422804014327f, GELU_KAPPA = 0.044715f;

/* x Phi(x) = x erfc(-x / sqrt 2) / 2; tanh form x (1 + tanh u) / 2 = x / (1 + e^-2u) */
__device__ __forceinline__ float gelu(float xi, bool tanh_approx) {
  if (tanh_approx) return xi / (1.0f + expf(-2.0f * (SQRT_2_OVER_PI * (xi + GELU_KAPPA * xi * xi * xi))));
  return 0.5f * xi * erfcf(xi * -SQRT1_2);
}

/* d gelu(x) / dx */
__device__ __forceinline__ float gelu_grad(float xi, bool tanh_approx) {
  float x2 = xi * xi;
  if (tanh_approx) {
    float t = tanhf(SQRT_2_OVER_PI * (xi + GELU_KAPPA * x2 * xi));
    return 0.5f * (1 + t) + 0.5f * xi * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * GELU_KAPPA * x2);
  }
  return 0.5f * (1 + erff(xi * SQRT1_2)) + xi * (INV_SQRT_2PI * expf(-0.5f * x2));
}

__global__ void gelu_kernel(const float *x, int64_t n, bool tanh_approx, float *y) {
  TP_GRID_STRIDE_LOOP(i, n) y[i] = gelu(x[i], tanh_approx);
}

void tp_cuda_launch_gelu_f32(const float *x, int64_t n, bool tanh_approx, float *y, TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(gelu_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, x, n, tanh_approx, y);
}

__global__ void gelu_backward_kernel(const float *dy, const float *x, int64_t n, bool tanh_approx, float *dx) {
  TP_GRID_STRIDE_LOOP(i, n) dx[i] = dy[i] * gelu_grad(x[i], tanh_approx);
}

void tp_cuda_launch_gelu_backward_f32(const float *dy, const float *x, int64_t n, bool tanh_approx, float *dx,
                               TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(gelu_backward_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, dy, x, n, tanh_approx,
            dx);
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void swiglu_kernel(const float *gate, const float *up, int64_t n, float *y) {
  TP_GRID_STRIDE_LOOP(i, n) y[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

void tp_cuda_launch_swiglu_f32(const float *gate, const float *up, int64_t n, float *y, TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(swiglu_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, gate, up, n, y);
}

/* dgate = dy * up * s * (1 + gate * (1 - s)), dup = dy * gate * s, s = sigmoid(gate) */
__global__ void swiglu_backward_kernel(const float *dy, const float *gate, const float *up, int64_t n, float *dgate,
                                       float *dup) {
  TP_GRID_STRIDE_LOOP(i, n) {
    float g = gate[i], s = sigmoid(g);
    if (dgate) dgate[i] = dy[i] * up[i] * s * (1 + g * (1 - s));
    if (dup) dup[i] = dy[i] * g * s;
  }
}

void tp_cuda_launch_swiglu_backward_f32(const float *dy, const float *gate, const float *up, int64_t n, float *dgate,
                                 float *dup, TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(swiglu_backward_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, dy, gate, up, n, dgate,
            dup);
}

__global__ void geglu_kernel(const float *gate, const float *up, int64_t n, bool tanh_approx, float *y) {
  TP_GRID_STRIDE_LOOP(i, n) y[i] = gelu(gate[i], tanh_approx) * up[i];
}

void tp_cuda_launch_geglu_f32(const float *gate, const float *up, int64_t n, bool tanh_approx, float *y,
                              TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(geglu_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, gate, up, n, tanh_approx,
            y);
}

/* dgate = (dy * up) gelu'(gate), dup = dy * gelu(gate): the unfused Mul's and GeluBackward's */
__global__ void geglu_backward_kernel(const float *dy, const float *gate, const float *up, int64_t n,
                                      bool tanh_approx, float *dgate, float *dup) {
  TP_GRID_STRIDE_LOOP(i, n) {
    float g = gate[i];
    if (dgate) dgate[i] = dy[i] * up[i] * gelu_grad(g, tanh_approx);
    if (dup) dup[i] = dy[i] * gelu(g, tanh_approx);
  }
}

void tp_cuda_launch_geglu_backward_f32(const float *dy, const float *gate, const float *up, int64_t n,
                                       bool tanh_approx, float *dgate, float *dup, TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(geglu_backward_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, dy, gate, up, n,
            tanh_approx, dgate, dup);
}
