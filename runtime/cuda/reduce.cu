/* ReduceSum and ReduceMean (tp_reduce_sum), any dtype but bool, the CPU's bits without
 * atomics: each output's elements, in x's row-major order, fall in runs of REDUCE_RUN
 * (floats summed in double from 0, integers wrapping), as cpu/reduce.c sums them. Pass 1
 * gives every run of every output a thread (adjacent threads on adjacent outputs: coalesced
 * when the reduced dims lead, as in a gradient summed over its rows) and writes the run's
 * sum to scratch; pass 2 adds each output's runs in order. Gradient unbroadcasting runs on
 * it. */
#include "dtype.cuh"

enum { REDUCE_RUN = 64 }; /* cpu/reduce.c's */
/* Pass 1's block: 32 outputs (a warp) by 8 runs; past gridDim.y's limit the runs stride. */
enum { RUN_OUTPUTS = 32, RUN_ROWS = 8, RUN_MAX_GRID_ROWS = 65535 };
/* Pass 2: a thread per output, in small blocks spread over the SMs. */
enum { FINISH_THREADS = 64 };

/* x's kept and reduced dims with their element strides, by value. */
struct ReduceShape {
  int kept_rank, red_rank;
  int64_t kept_dims[TP_MAX_RANK], kept_stride[TP_MAX_RANK], red_dims[TP_MAX_RANK], red_stride[TP_MAX_RANK];
  int64_t nout, count, runs;
  bool mean;
  TpDType dtype;
  size_t es;
};

/* A run's sum: floats in f, integers in u (one 8-byte scratch slot holds either). */
union RunSum {
  double f;
  uint64_t u;
};

/* x's shape split into kept and reduced dims; false for axes that are not sorted, distinct
 * and in range. */
static bool reduce_shape(const TpTensor *x, const int64_t *axes, int naxes, bool mean, ReduceShape *p) {
  *p = ReduceShape{};
  p->mean = mean, p->nout = 1, p->count = 1, p->dtype = x->dtype, p->es = tp_dtype_size(x->dtype);
  int64_t stride[TP_MAX_RANK], t = 1;
  for (int d = x->rank - 1; d >= 0; d--) stride[d] = t, t *= x->dims[d]; /* contiguous */
  int a = 0;
  for (int d = 0; d < x->rank; d++) {
    bool reduced = a < naxes && axes[a] == d;
    if (reduced) a++;
    if (reduced)
      p->red_dims[p->red_rank] = x->dims[d], p->red_stride[p->red_rank++] = stride[d], p->count *= x->dims[d];
    else p->kept_dims[p->kept_rank] = x->dims[d], p->kept_stride[p->kept_rank++] = stride[d], p->nout *= x->dims[d];
  }
  p->runs = (p->count + REDUCE_RUN - 1) / REDUCE_RUN;
  return a == naxes;
}

/* The sum of output j's run k (elements [k REDUCE_RUN, (k + 1) REDUCE_RUN) of its reduced
 * ones), from 0. */
__device__ static RunSum run_sum(const char *x, const ReduceShape &p, int64_t j, int64_t k) {
  int64_t base = 0, rem = j;
  for (int d = p.kept_rank - 1; d >= 0; d--) {
    base += rem % p.kept_dims[d] * p.kept_stride[d];
    rem /= p.kept_dims[d];
  }
  int64_t first = k * REDUCE_RUN, end = first + REDUCE_RUN < p.count ? first + REDUCE_RUN : p.count;
  int64_t idx[TP_MAX_RANK], at = base, rest = first; /* the first element's index and offset */
  for (int d = p.red_rank - 1; d >= 0; d--) {
    idx[d] = rest % p.red_dims[d];
    at += idx[d] * p.red_stride[d];
    rest /= p.red_dims[d];
  }
  RunSum s;
  double f = 0;
  uint64_t u = 0;
  for (int64_t i = first; i < end; i++) {
    tp_sum_element(p.dtype, x + at * (int64_t)p.es, &f, &u);
    for (int d = p.red_rank - 1; d >= 0; d--) { /* an odometer to the next element */
      at += p.red_stride[d];
      if (++idx[d] < p.red_dims[d]) break;
      at -= idx[d] * p.red_stride[d];
      idx[d] = 0;
    }
  }
  if (tp_dclass(p.dtype) == TP_CLASS_FLOAT) s.f = f;
  else s.u = u;
  return s;
}

/* Output j from its total (f or u): the mean taken where asked, stored in y's dtype. */
__device__ static void store_output(const ReduceShape &p, int64_t j, double f, uint64_t u, char *y) {
  bool is_signed = tp_dclass(p.dtype) == TP_CLASS_SIGNED;
  if (p.mean && tp_dclass(p.dtype) == TP_CLASS_FLOAT)
    f /= (double)p.count; /* NaN for an empty reduction, as numpy */
  else if (p.mean && p.count > 0) u = is_signed ? (uint64_t)((int64_t)u / p.count) : u / (uint64_t)p.count;
  tp_store_sum(p.dtype, p.es, y + j * (int64_t)p.es, f, u);
}

/* Pass 1: runs[k * nout + j] = output j's run k; with one run, the outputs themselves (the
 * CPU's 0 + the run is the run: a sum from +0 is never -0). */
__global__ void reduce_runs_kernel(const char *x, ReduceShape p, RunSum *runs, char *y) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= p.nout) return;
  for (int64_t k = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; k < p.runs;
       k += (int64_t)gridDim.y * blockDim.y) {
    RunSum s = run_sum(x, p, j, k);
    if (p.runs > 1) runs[k * p.nout + j] = s;
    else store_output(p, j, s.f, s.u, y);
  }
}

/* Pass 2: each output's runs added in order (no runs: an empty reduction). */
__global__ void reduce_finish_kernel(const RunSum *runs, ReduceShape p, char *y) {
  bool is_float = tp_dclass(p.dtype) == TP_CLASS_FLOAT;
  TP_GRID_STRIDE_LOOP(j, p.nout) {
    double f = 0;
    uint64_t u = 0;
    for (int64_t k = 0; k < p.runs; k++)
      if (is_float) f += runs[k * p.nout + j].f;
      else u += runs[k * p.nout + j].u;
    store_output(p, j, f, u, y);
  }
}

size_t tp_cuda_reduce_sum_scratch(const TpTensor *x, const int64_t *axes, int naxes) {
  ReduceShape p;
  if (!reduce_shape(x, axes, naxes, false, &p) || p.runs <= 1) return 0;
  return (size_t)(p.runs * p.nout) * sizeof(RunSum);
}

bool tp_cuda_launch_reduce_sum_f32(const TpTensor *x, const int64_t *axes, int naxes, bool mean, float *y,
                                   void *scratch, TpCudaStream stream) {
  return tp_cuda_launch_reduce_sum(x, axes, naxes, mean, y, scratch, stream);
}

bool tp_cuda_launch_reduce_sum(const TpTensor *x, const int64_t *axes, int naxes, bool mean, void *y, void *scratch,
                               TpCudaStream stream) {
  ReduceShape p;
  if (!reduce_shape(x, axes, naxes, mean, &p)) return false;
  if (p.nout == 0) return true;
  const char *xd = static_cast<const char *>(x->data);
  char *yd = static_cast<char *>(y);
  RunSum *runs = static_cast<RunSum *>(scratch);
  if (p.runs >= 1) {
    int64_t grid_rows = (p.runs + RUN_ROWS - 1) / RUN_ROWS, max_grid_rows = RUN_MAX_GRID_ROWS;
    dim3 grid((unsigned)((p.nout + RUN_OUTPUTS - 1) / RUN_OUTPUTS),
              (unsigned)(grid_rows < max_grid_rows ? grid_rows : max_grid_rows));
    TP_LAUNCH(reduce_runs_kernel, grid, dim3(RUN_OUTPUTS, p.runs > 1 ? RUN_ROWS : 1), stream, xd, p, runs, yd);
  }
  if (p.runs != 1)
    TP_LAUNCH(reduce_finish_kernel, dim3((unsigned)((p.nout + FINISH_THREADS - 1) / FINISH_THREADS)),
              dim3(FINISH_THREADS), stream, runs, p, yd);
  return true;
}
