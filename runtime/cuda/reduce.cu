/* ReduceSum and ReduceMean (tp_reduce_sum), any dtype but bool: one thread per output,
 * adding its elements in x's row-major order as the CPU kernel does (floats in double,
 * integers wrapping), so the results are the CPU's and never depend on the launch (no
 * atomics). Gradient unbroadcasting runs on it. */
#include "dtype.cuh"

/* x's kept and reduced dims with their element strides, by value. */
struct ReduceShape {
  int kept_rank, red_rank;
  int64_t kept_dims[TP_MAX_RANK], kept_stride[TP_MAX_RANK], red_dims[TP_MAX_RANK], red_stride[TP_MAX_RANK];
  int64_t nout, count;
  bool mean;
  TpDType dtype;
  size_t es;
};

__global__ void reduce_sum_kernel(const char *x, ReduceShape p, char *y) {
  TP_GRID_STRIDE_LOOP(j, p.nout) {
    int64_t base = 0, rem = j;
    for (int d = p.kept_rank - 1; d >= 0; d--) {
      base += rem % p.kept_dims[d] * p.kept_stride[d];
      rem /= p.kept_dims[d];
    }
    double f = 0;
    uint64_t u = 0;
    for (int64_t i = 0; i < p.count; i++) { /* the reduced elements in row-major order */
      int64_t at = base, r = i;
      for (int d = p.red_rank - 1; d >= 0; d--) {
        at += r % p.red_dims[d] * p.red_stride[d];
        r /= p.red_dims[d];
      }
      tp_sum_element(p.dtype, x + at * (int64_t)p.es, &f, &u);
    }
    bool is_signed = tp_dclass(p.dtype) == TP_CLASS_SIGNED;
    if (p.mean && tp_dclass(p.dtype) == TP_CLASS_FLOAT)
      f /= (double)p.count; /* NaN for an empty reduction, as numpy */
    else if (p.mean && p.count > 0) u = is_signed ? (uint64_t)((int64_t)u / p.count) : u / (uint64_t)p.count;
    tp_store_sum(p.dtype, p.es, y + j * (int64_t)p.es, f, u);
  }
}

bool tp_cuda_launch_reduce_sum_f32(const TpTensor *x, const int64_t *axes, int naxes, bool mean, float *y,
                                   TpCudaStream stream) {
  return tp_cuda_launch_reduce_sum(x, axes, naxes, mean, y, stream);
}

bool tp_cuda_launch_reduce_sum(const TpTensor *x, const int64_t *axes, int naxes, bool mean, void *y,
                               TpCudaStream stream) {
  ReduceShape p = {};
  p.mean = mean, p.nout = 1, p.count = 1, p.dtype = x->dtype, p.es = tp_dtype_size(x->dtype);
  int64_t stride[TP_MAX_RANK], t = 1;
  for (int d = x->rank - 1; d >= 0; d--) stride[d] = t, t *= x->dims[d]; /* contiguous */
  int a = 0;
  for (int d = 0; d < x->rank; d++) {
    bool reduced = a < naxes && axes[a] == d;
    if (reduced) a++;
    if (reduced) p.red_dims[p.red_rank] = x->dims[d], p.red_stride[p.red_rank++] = stride[d], p.count *= x->dims[d];
    else p.kept_dims[p.kept_rank] = x->dims[d], p.kept_stride[p.kept_rank++] = stride[d], p.nout *= x->dims[d];
  }
  if (a != naxes) return false; /* axes not sorted, distinct and in range */
  if (p.nout == 0) return true;
  TP_LAUNCH(reduce_sum_kernel, tp_elementwise_grid(p.nout), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream,
            static_cast<const char *>(x->data), p, static_cast<char *>(y));
  return true;
}
