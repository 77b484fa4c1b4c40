/* AdamW and the pieces of global-norm clipping (runtime/cpu/optim.h) on the device. */
#include "../kernels/element.h"
#include "common.cuh"

/* tp_adamw_step's per-element work (kernels/element.h) on the device. */
__global__ void adamw_kernel(float *w, const float *g, float *m, float *v, int64_t n, TpAdamWFactors f) {
  TP_GRID_STRIDE_LOOP(i, n) tp_adamw_element(w, g, m, v, i, f);
}

void tp_cuda_launch_adamw_step(float *w, const float *g, float *m, float *v, int64_t n, double lr, double beta1,
                               double beta2, double eps, double weight_decay, int64_t step, TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(adamw_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, w, g, m, v, n,
            tp_adamw_factors(lr, beta1, beta2, eps, weight_decay, step));
}

/* Block b: the sum of squares of piece first + b of TP_CUDA_SUM_PIECES, in double. */
__global__ void sum_squares_pieces_kernel(const float *x, int64_t n, int first, double *out) {
  double s = tp_piece_sum_squares(x, n, first + blockIdx.x);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

void tp_cuda_launch_sum_squares_pieces_f32(const float *x, int64_t n, int first, int count, double *out,
                                           TpCudaStream stream) {
  if (count <= 0) return;
  TP_LAUNCH(sum_squares_pieces_kernel, dim3(count), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, x, n, first, out);
}

__global__ void scale_kernel(float *x, int64_t n, const float *s) { TP_GRID_STRIDE_LOOP(i, n) x[i] *= *s; }

void tp_cuda_launch_scale_f32(float *x, int64_t n, const float *s, TpCudaStream stream) {
  if (n == 0) return;
  TP_LAUNCH(scale_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, x, n, s);
}
