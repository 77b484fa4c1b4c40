/* Column sums of a row-major (rows, n) gradient: the bias gradient (blas.cu) and the norms'
 * scale and bias gradients (norm.cu), the bits of runtime/cpu/nn_backward.c's
 * tp_column_sums_f32, which sums each column's runs of COLUMN_RUN rows in float in row
 * order and adds the runs in double. Two passes, no atomics: pass 1 gives every run of
 * every column a thread (adjacent threads on adjacent columns, so a warp reads 32
 * consecutive floats of a row), which writes its float sum to scratch; pass 2 adds each
 * column's runs in double, in order. */
#include "common.cuh"

enum { COLUMN_RUN = 64 }; /* tp_column_sums_f32's ROW_RUN */
/* Pass 1's block: 32 columns (a warp) by 8 runs; past gridDim.y's limit the runs stride. */
enum { RUN_COLUMNS = 32, RUN_ROWS = 8, RUN_MAX_GRID_ROWS = 65535 };
/* Pass 2: a thread per column, in small blocks spread over the SMs. */
enum { FINISH_THREADS = 64 };

__host__ __device__ static inline int64_t run_count(int64_t rows) { return (rows + COLUMN_RUN - 1) / COLUMN_RUN; }

size_t tp_cuda_column_sums_scratch(int64_t rows, int64_t n, int sums) {
  int64_t runs = run_count(rows);
  return runs > 1 ? (size_t)sums * (size_t)(runs * n) * sizeof(float) : 0;
}

/* acc + a * b with the product rounded first, as the CPU kernel computes it (nvcc, and the
 * emulated build's compiler where it contracts, would fuse them into one FMA). */
__device__ static inline float add_product(float acc, float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(acc, __fmul_rn(a, b));
#else
  volatile float product = a * b;
  return acc + product;
#endif
}

/* Pass 1: dy_runs[k * n + j] = the float sum of column j over rows [64 k, 64 k + 64),
 * xhat_runs the same of dy * (x - mean) * inv_std (mean NULL: 0); either may be NULL.
 * With one run these are the sums themselves (0.0 + s in double is s: a float sum from +0
 * is never -0). */
__global__ void column_runs_kernel(const float *dy, const float *x, const float *mean, const float *inv_std,
                                   int64_t rows, int64_t n, float *xhat_runs, float *dy_runs) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, runs = run_count(rows);
  if (j >= n) return;
  for (int64_t k = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; k < runs; k += (int64_t)gridDim.y * blockDim.y) {
    int64_t end = (k + 1) * COLUMN_RUN < rows ? (k + 1) * COLUMN_RUN : rows;
    float s = 0, sx = 0;
    for (int64_t r = k * COLUMN_RUN; r < end; r++) {
      float d = dy[r * n + j];
      s += d;
      if (xhat_runs) sx = add_product(sx, d, (x[r * n + j] - (mean ? mean[r] : 0.0f)) * inv_std[r]);
    }
    if (dy_runs) dy_runs[k * n + j] = s;
    if (xhat_runs) xhat_runs[k * n + j] = sx;
  }
}

/* Pass 2: each column's runs added in double in order, rounded to float. */
__global__ void column_finish_kernel(const float *xhat_runs, const float *dy_runs, int64_t runs, int64_t n,
                                     float *sum_dy_xhat, float *sum_dy) {
  TP_GRID_STRIDE_LOOP(j, n) {
    double s = 0, sx = 0;
    for (int64_t k = 0; k < runs; k++) {
      if (sum_dy) s += dy_runs[k * n + j];
      if (sum_dy_xhat) sx += xhat_runs[k * n + j];
    }
    if (sum_dy) sum_dy[j] = (float)s;
    if (sum_dy_xhat) sum_dy_xhat[j] = (float)sx;
  }
}

void tp_cuda_launch_column_sums_f32(const float *dy, const float *x, const float *mean, const float *inv_std,
                                    int64_t rows, int64_t n, float *sum_dy_xhat, float *sum_dy, void *scratch,
                                    TpCudaStream stream) {
  if (n == 0 || (!sum_dy_xhat && !sum_dy)) return;
  int64_t runs = run_count(rows);
  if (runs > 1) { /* the run sums in scratch, one (runs, n) block per wanted sum */
    float *first = static_cast<float *>(scratch), *second = first + runs * n;
    float *xhat_runs = sum_dy_xhat ? first : NULL, *dy_runs = sum_dy ? (sum_dy_xhat ? second : first) : NULL;
    int64_t grid_rows = (runs + RUN_ROWS - 1) / RUN_ROWS, max_grid_rows = RUN_MAX_GRID_ROWS;
    dim3 grid((unsigned)((n + RUN_COLUMNS - 1) / RUN_COLUMNS),
              (unsigned)(grid_rows < max_grid_rows ? grid_rows : max_grid_rows));
    TP_LAUNCH(column_runs_kernel, grid, dim3(RUN_COLUMNS, RUN_ROWS), stream, dy, x, mean, inv_std, rows, n,
              xhat_runs, dy_runs);
    TP_LAUNCH(column_finish_kernel, dim3((unsigned)((n + FINISH_THREADS - 1) / FINISH_THREADS)),
              dim3(FINISH_THREADS), stream, xhat_runs, dy_runs, runs, n, sum_dy_xhat, sum_dy);
  } else if (runs == 1) { /* one run: pass 1 alone, into the outputs */
    TP_LAUNCH(column_runs_kernel, dim3((unsigned)((n + RUN_COLUMNS - 1) / RUN_COLUMNS)), dim3(RUN_COLUMNS), stream,
              dy, x, mean, inv_std, rows, n, sum_dy_xhat, sum_dy);
  } else { /* no rows: zeros */
    TP_LAUNCH(column_finish_kernel, dim3((unsigned)((n + FINISH_THREADS - 1) / FINISH_THREADS)),
              dim3(FINISH_THREADS), stream, (const float *)NULL, (const float *)NULL, runs, n, sum_dy_xhat, sum_dy);
  }
}
