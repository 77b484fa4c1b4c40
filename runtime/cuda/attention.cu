/* Fused causal attention, forward and backward (kernels.h's TpCudaAttention): one warp per
 * query row (forward, dq) or key row (dk, dv); lane l holds elements l, l + 32, ... of the
 * row's vectors, dot products are warp_reduce sums. */
#include "common.cuh"

enum { LANE_VALUES = TP_CUDA_ATTENTION_MAX_D / 32 };

/* Where row s of head `head` (of `heads`, `rows` rows each) of batch b starts. */
__device__ __forceinline__ int64_t row_offset(const TpCudaAttention &p, int64_t b, int64_t head, int64_t heads,
                                              int64_t rows, int64_t s, int64_t D) {
  return p.packed ? ((b * rows + s) * heads + head) * D : ((b * heads + head) * rows + s) * D;
}

__device__ __forceinline__ int64_t kv_rows(const TpCudaAttention &p) { return p.kv_rows ? p.kv_rows : p.kv_len; }

/* The keys [0, end) query row i sees. */
__device__ __forceinline__ int64_t keys_seen(const TpCudaAttention &p, int64_t i) {
  int64_t last = i + p.causal_offset;
  return p.is_causal && last + 1 < p.kv_len ? last + 1 : p.kv_len;
}

/* The lane's elements of a row of n (0 past n). */
__device__ __forceinline__ void load_row(const float *x, int64_t n, float *r) {
  for (int c = 0; c < LANE_VALUES; c++) {
    int64_t d = threadIdx.x + 32 * c;
    r[c] = d < n ? x[d] : 0.0f;
  }
}

/* The dot product of a lane-distributed row with x (n), every lane receiving it. */
__device__ __forceinline__ float dot_row(const float *r, const float *x, int64_t n) {
  float s = 0;
  for (int c = 0; c < LANE_VALUES; c++) {
    int64_t d = threadIdx.x + 32 * c;
    if (d < n) s += r[c] * x[d];
  }
  return warp_reduce(s, TpSum());
}

/* grid (q_len, q_heads, batch), one warp: query row i of head h */
__global__ void attention_kernel(TpCudaAttention p, const float *q, const float *k, const float *v, float *y,
                                 float *lse) {
  int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (p.q_heads / p.kv_heads);
  int64_t D = p.head_size, Dv = p.v_head_size, R = kv_rows(p), end = keys_seen(p, i);
  float qr[LANE_VALUES], acc[LANE_VALUES] = {0}, m = -INFINITY, l = 0;
  load_row(q + row_offset(p, b, h, p.q_heads, p.q_len, i, D), D, qr);
  for (int64_t j = 0; j < end; j++) { /* online softmax: rescale the sums when the maximum grows */
    float s = p.scale * dot_row(qr, k + row_offset(p, b, g, p.kv_heads, R, j, D), D);
    float m_new = fmaxf(m, s), correction = expf(m - m_new), e = expf(s - m_new);
    const float *vj = v + row_offset(p, b, g, p.kv_heads, R, j, Dv);
    l = l * correction + e;
    for (int c = 0; c < LANE_VALUES; c++) {
      int64_t d = threadIdx.x + 32 * c;
      acc[c] = acc[c] * correction + (d < Dv ? e * vj[d] : 0.0f);
    }
    m = m_new;
  }
  float *yr = y + row_offset(p, b, h, p.q_heads, p.q_len, i, Dv);
  for (int c = 0; c < LANE_VALUES; c++) {
    int64_t d = threadIdx.x + 32 * c;
    if (d < Dv) yr[d] = end ? acc[c] / l : 0.0f;
  }
  if (threadIdx.x == 0) lse[(b * p.q_heads + h) * p.q_len + i] = end ? m + logf(l) : -INFINITY;
}

static bool attention_empty(const TpCudaAttention *p) {
  return p->batch == 0 || p->q_heads == 0 || p->q_len == 0;
}

void tp_cuda_launch_attention_f32(const TpCudaAttention *p, const float *q, const float *k, const float *v, float *y,
                           float *lse, TpCudaStream stream) {
  if (attention_empty(p)) return;
  dim3 grid((unsigned)p->q_len, (unsigned)p->q_heads, (unsigned)p->batch);
  TP_LAUNCH(attention_kernel, grid, dim3(32), stream, *p, q, k, v, y, lse);
}

/* grid (q_len, q_heads, batch), one warp: dq of query row i, and delta_i = dy_i . y_i
 * (for the key rows' kernel). ds_ij = p_ij (dy_i . v_j - delta_i); dq_i = scale sum_j ds_ij k_j */
__global__ void attention_dq_kernel(TpCudaAttention p, const float *dy, const float *q, const float *k,
                                    const float *v, const float *y, const float *lse, float *dq, float *delta) {
  int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (p.q_heads / p.kv_heads);
  int64_t D = p.head_size, Dv = p.v_head_size, R = kv_rows(p), end = keys_seen(p, i);
  int64_t row = (b * p.q_heads + h) * p.q_len + i;
  float qr[LANE_VALUES], dyr[LANE_VALUES], acc[LANE_VALUES] = {0};
  load_row(q + row_offset(p, b, h, p.q_heads, p.q_len, i, D), D, qr);
  load_row(dy + row_offset(p, b, h, p.q_heads, p.q_len, i, Dv), Dv, dyr);
  float di = dot_row(dyr, y + row_offset(p, b, h, p.q_heads, p.q_len, i, Dv), Dv), li = lse[row];
  if (threadIdx.x == 0) delta[row] = di;
  for (int64_t j = 0; j < end; j++) {
    const float *kj = k + row_offset(p, b, g, p.kv_heads, R, j, D);
    float pij = expf(p.scale * dot_row(qr, kj, D) - li);
    float ds = pij * (dot_row(dyr, v + row_offset(p, b, g, p.kv_heads, R, j, Dv), Dv) - di);
    for (int c = 0; c < LANE_VALUES; c++) {
      int64_t d = threadIdx.x + 32 * c;
      if (d < D) acc[c] += ds * kj[d];
    }
  }
  float *o = dq + row_offset(p, b, h, p.q_heads, p.q_len, i, D);
  for (int c = 0; c < LANE_VALUES; c++) {
    int64_t d = threadIdx.x + 32 * c;
    if (d < D) o[d] = p.scale * acc[c];
  }
}

/* grid (kv_len, kv_heads, batch), one warp: dk and dv of key row j, over the group's query
 * heads and the query rows that see j (i >= j - causal_offset when causal), in order. */
__global__ void attention_dkdv_kernel(TpCudaAttention p, const float *dy, const float *q, const float *k,
                                      const float *v, const float *lse, const float *delta, float *dk, float *dv) {
  int64_t j = blockIdx.x, g = blockIdx.y, b = blockIdx.z, group = p.q_heads / p.kv_heads;
  int64_t D = p.head_size, Dv = p.v_head_size, R = kv_rows(p);
  int64_t first = p.is_causal && j - p.causal_offset > 0 ? j - p.causal_offset : 0;
  float kr[LANE_VALUES], vr[LANE_VALUES], dk_acc[LANE_VALUES] = {0}, dv_acc[LANE_VALUES] = {0};
  load_row(k + row_offset(p, b, g, p.kv_heads, R, j, D), D, kr);
  load_row(v + row_offset(p, b, g, p.kv_heads, R, j, Dv), Dv, vr);
  for (int64_t h = g * group; h < (g + 1) * group; h++)
    for (int64_t i = first; i < p.q_len; i++) {
      int64_t row = (b * p.q_heads + h) * p.q_len + i;
      const float *qi = q + row_offset(p, b, h, p.q_heads, p.q_len, i, D);
      const float *dyi = dy + row_offset(p, b, h, p.q_heads, p.q_len, i, Dv);
      float pij = expf(p.scale * dot_row(kr, qi, D) - lse[row]);
      float ds = pij * (dot_row(vr, dyi, Dv) - delta[row]);
      for (int c = 0; c < LANE_VALUES; c++) {
        int64_t d = threadIdx.x + 32 * c;
        if (d < Dv) dv_acc[c] += pij * dyi[d];
        if (d < D) dk_acc[c] += ds * qi[d];
      }
    }
  float *dkr = dk + row_offset(p, b, g, p.kv_heads, p.kv_len, j, D);
  float *dvr = dv + row_offset(p, b, g, p.kv_heads, p.kv_len, j, Dv);
  for (int c = 0; c < LANE_VALUES; c++) {
    int64_t d = threadIdx.x + 32 * c;
    if (d < D) dkr[d] = p.scale * dk_acc[c];
    if (d < Dv) dvr[d] = dv_acc[c];
  }
}

void tp_cuda_launch_attention_backward_f32(const TpCudaAttention *p, const float *dy, const float *q, const float *k,
                                    const float *v, const float *y, const float *lse, float *dq, float *dk,
                                    float *dv, float *delta, TpCudaStream stream) {
  if (p->batch == 0 || p->kv_heads == 0) return;
  if (!attention_empty(p)) {
    dim3 grid((unsigned)p->q_len, (unsigned)p->q_heads, (unsigned)p->batch);
    TP_LAUNCH(attention_dq_kernel, grid, dim3(32), stream, *p, dy, q, k, v, y, lse, dq, delta);
  }
  if (p->kv_len) {
    dim3 grid((unsigned)p->kv_len, (unsigned)p->kv_heads, (unsigned)p->batch);
    TP_LAUNCH(attention_dkdv_kernel, grid, dim3(32), stream, *p, dy, q, k, v, lse, delta, dk, dv);
  }
}
