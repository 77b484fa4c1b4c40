/* Fused (flash-style) attention, forward and backward: ops.h's tp_cuda_attention_f32 and
 * tp_cuda_attention_backward_f32, computing what tp_attention_f32 and
 * tp_attention_backward_f32 (cpu/nn.h, cpu/nn_backward.h) compute for every case
 * TpAttention describes (grouped K/V heads, packed or not, causal with an offset, window,
 * softcap, bool or f32 masks, past keys, keys in a longer context buffer), but qk_out.
 *
 * The T x T scores are never stored. A block takes a tile of ROWS query rows of one
 * (batch, head) and walks the keys its rows see (tp_attention_block_keys: a causal tile
 * skips the keys past its last row's bound, a window the keys before its first row's) in
 * tiles of ROWS keys, staged in shared memory with the query tile:
 *   forward   scores of the tile pair, then an online softmax (running maximum and sum,
 *             the sums rescaled when the maximum grows) accumulating P V in registers;
 *   backward  a statistics pass (the forward without its output: each row's log-sum-exp
 *             and delta_i = dy_i . y_i, in stream scratch), then dq by query tiles, then dk
 *             and dv by key tiles, each key tile summing over its group's query heads and
 *             the query tiles that see it in a fixed order (deterministic, no atomics).
 * Threads: ROW_THREADS per row of a tile; thread t of a row owns columns t, t + 8, ... of
 * the row's vectors and keys (or queries) t, t + 8, ... of the tile's scores. A row's
 * softmax statistics are read back from shared memory by its 8 threads, so the kernels
 * need no shuffles, only __syncthreads. */
#include "common.cuh"
#include "ops.h"

enum { ROW_THREADS = 8, MAX_HEAD_SIZE = 256 };

/* The tiles of a kernel for head sizes up to DMAX (64, 128, 256): ROWS rows of DMAX floats
 * are 8 KiB, so the four tiles a kernel stages (Q, K, V, dY) and its scores stay under the
 * 48 KiB of static shared memory a block may have (the emulation has no dynamic shared
 * memory); at most 32 rows: 256 threads. fp32 attention runs on the CUDA cores (no fp32
 * tensor-core path), so the tiles are sized for occupancy: nvcc --resource-usage gives
 * 25-42 KB of shared memory and 54-139 registers per thread, no spills, so an H100/H200
 * SM (228 KB shared, 64K registers) holds 4 forward blocks of 256 threads for D <= 64.
 * Key tiles are as long as query tiles, so the masked-out triangle a causal query tile
 * still computes is at most its diagonal tile's half. */
template <int DMAX> struct Tile {
  static constexpr int ROWS = 2048 / DMAX < 32 ? 2048 / DMAX : 32;
  static constexpr int THREADS = ROWS * ROW_THREADS;
  static constexpr int COLS = DMAX / ROW_THREADS; /* the columns a thread owns */
  static constexpr int LD = DMAX + 1;             /* a padded row: rows start in different banks */
};

/* Where the rows of a Q/K/V-shaped tensor lie: `rows` rows per (batch, head), packed
 * ([B, rows, heads * D]) or not ([B, heads, rows, D]). */
struct Rows {
  const float *data;
  int64_t heads, rows, D;
  bool packed;
};

__device__ __forceinline__ int64_t row_offset(bool packed, int64_t b, int64_t head, int64_t heads, int64_t rows,
                                              int64_t s, int64_t D) {
  return packed ? ((b * rows + s) * heads + head) * D : ((b * heads + head) * rows + s) * D;
}

/* Rows [s0, s0 + n) of head `head` of batch b into tile[ROWS][LD] (rows past n: zeros). */
template <int DMAX>
__device__ void load_tile(float (*tile)[Tile<DMAX>::LD], Rows x, int64_t b, int64_t head, int64_t s0, int64_t n) {
  for (int64_t e = threadIdx.x; e < Tile<DMAX>::ROWS * x.D; e += Tile<DMAX>::THREADS) {
    int64_t r = e / x.D, c = e % x.D;
    tile[r][c] = r < n ? x.data[row_offset(x.packed, b, head, x.heads, x.rows, s0 + r, x.D) + c] : 0.0f;
  }
}

__device__ __forceinline__ float dot(const float *a, const float *b, int64_t n) {
  float s = 0;
  for (int64_t d = 0; d < n; d++) s += a[d] * b[d];
  return s;
}

/* Score of query row i of batch b, head h with key j, from their dot product, as the
 * softmax sees it (cpu/nn.c's order): scaled, capped, masked; -inf for a key outside the
 * row's [first, end). *t gets tanh(s / softcap), for the backward. */
__device__ float score(const TpAttention &p, int64_t b, int64_t h, int64_t i, int64_t j, float qk, int64_t first,
                       int64_t end, float *t) {
  if (j < first || j >= end) return -INFINITY;
  float s = p.scale * qk;
  if (p.softcap > 0) {
    *t = tanhf(s / p.softcap);
    s = p.softcap * *t;
  }
  if (p.mask) {
    const int64_t *ms = p.mask_strides;
    int64_t at = b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3];
    if (p.mask_is_bool) {
      if (!static_cast<const unsigned char *>(p.mask)[at]) s = -INFINITY;
    } else {
      s += static_cast<const float *>(p.mask)[at];
    }
  }
  return s;
}

/* A block's tile of query rows (grid (query tiles, q_heads, batch), the last tiles first:
 * causal tiles further down see more keys) and the calling thread's place in it: row r
 * (query i, keys [first, end) of `total`), thread t of the row; the tile's rows see keys
 * [lo, hi). */
struct QueryTile {
  int64_t b, h, g, i0, n, i, first, end, lo, hi;
  int r, t;
};
template <int R> __device__ QueryTile query_tile(const TpAttention &p, int64_t total) {
  QueryTile q;
  q.b = blockIdx.z, q.h = blockIdx.y, q.g = q.h / (p.q_heads / p.kv_heads);
  q.i0 = ((int64_t)gridDim.x - 1 - blockIdx.x) * R, q.n = p.q_len - q.i0 < R ? p.q_len - q.i0 : R;
  q.r = threadIdx.x / ROW_THREADS, q.t = threadIdx.x % ROW_THREADS, q.i = q.i0 + q.r;
  q.first = q.end = 0;
  if (q.r < q.n) tp_attention_key_range(&p, q.i, total, &q.first, &q.end);
  tp_attention_block_keys(&p, q.i0, q.i0 + q.n, total, &q.lo, &q.hi);
  return q;
}

/* Keys (and values) [j0, j0 + *nk) of a query tile's [lo, hi) into the shared tiles. */
template <int DMAX>
__device__ void load_keys(float (*ks)[Tile<DMAX>::LD], float (*vs)[Tile<DMAX>::LD], Rows k, Rows v,
                          const QueryTile &q, int64_t j0, int64_t *nk) {
  *nk = q.hi - j0 < Tile<DMAX>::ROWS ? q.hi - j0 : Tile<DMAX>::ROWS;
  load_tile<DMAX>(ks, k, q.b, q.g, j0, *nk);
  load_tile<DMAX>(vs, v, q.b, q.g, j0, *nk);
}

/* grid (query tiles, q_heads, batch). y (or NULL) as tp_attention_f32's; with lse: the
 * statistics pass of the backward, writing each row's log-sum-exp of its scores (+inf for
 * a row that sees no key, so that exp(s - lse) is 0) and delta = dy . y (y not stored). */
template <int DMAX>
__global__ void __launch_bounds__(Tile<DMAX>::THREADS)
    attention_forward_kernel(TpAttention p, Rows q, Rows k, Rows v, int64_t total, float *y, const float *dy,
                             float *lse, float *delta) {
  constexpr int R = Tile<DMAX>::ROWS, C = Tile<DMAX>::COLS, LD = Tile<DMAX>::LD;
  __shared__ float qs[R][LD], ks[R][LD], vs[R][LD], ss[R][R + 1], es[R][R + 1];
  const QueryTile tile = query_tile<R>(p, total);
  const int64_t b = tile.b, h = tile.h, i = tile.i, n = tile.n, D = p.head_size, Dv = p.v_head_size;
  const int r = tile.r, t = tile.t;
  load_tile<DMAX>(qs, q, b, h, tile.i0, n);

  float m = -INFINITY, l = 0, acc[C] = {0}, unused;
  for (int64_t j0 = tile.lo, nk; j0 < tile.hi; j0 += R) {
    load_keys<DMAX>(ks, vs, k, v, tile, j0, &nk);
    __syncthreads();
    for (int jj = t; jj < nk; jj += ROW_THREADS)
      ss[r][jj] = r < n ? score(p, b, h, i, j0 + jj, dot(qs[r], ks[jj], D), tile.first, tile.end, &unused)
                        : -INFINITY;
    __syncthreads();
    float m_new = m; /* each thread of the row finds its maximum, then exponentiates its keys */
    for (int jj = 0; jj < nk; jj++) m_new = fmaxf(m_new, ss[r][jj]);
    for (int jj = t; jj < nk; jj += ROW_THREADS) es[r][jj] = m_new != -INFINITY ? expf(ss[r][jj] - m_new) : 0.0f;
    __syncthreads();
    if (m_new != -INFINITY) { /* else no key of the row so far has weight */
      float rescale = expf(m - m_new);
      l *= rescale;
      for (int c = 0; c < C; c++) acc[c] *= rescale;
      for (int jj = 0; jj < nk; jj++) {
        float e = es[r][jj];
        l += e;
        for (int c = 0; c < C; c++) acc[c] += e * vs[jj][t + ROW_THREADS * c];
      }
      m = m_new;
    }
    __syncthreads(); /* every row is done with the tiles before the next ones overwrite them */
  }

  const float inv = l > 0 ? 1 / l : 0; /* a row that sees no key gives zeros */
  float part = 0;                      /* this thread's share of dy_i . y_i */
  for (int c = 0; c < C; c++) {
    int64_t col = t + ROW_THREADS * c;
    if (r >= n || col >= Dv) continue;
    int64_t at = row_offset(q.packed, b, h, p.q_heads, p.q_len, i, Dv) + col;
    if (y) y[at] = acc[c] * inv;
    if (dy) part += dy[at] * (acc[c] * inv);
  }
  if (!lse) return;
  ss[r][t] = part; /* the last loop's barrier freed ss */
  __syncthreads();
  if (t == 0 && r < n) {
    float sum = 0;
    for (int u = 0; u < ROW_THREADS; u++) sum += ss[r][u];
    int64_t row = (b * p.q_heads + h) * p.q_len + i;
    delta[row] = sum;
    lse[row] = l > 0 ? m + logf(l) : INFINITY;
  }
}

/* The probability of key j for row i (from its log-sum-exp) and the gradient of its
 * score, d s_ij = p_ij (dy_i . v_j - delta_i), through the softcap when there is one. */
__device__ __forceinline__ float score_gradient(const TpAttention &p, int64_t b, int64_t h, int64_t i, int64_t j,
                                                const float *qi, const float *kj, const float *dyi, const float *vj,
                                                int64_t first, int64_t end, float lse, float delta, float *prob) {
  float t = 0, s = score(p, b, h, i, j, dot(qi, kj, p.head_size), first, end, &t);
  float pij = expf(s - lse);
  *prob = pij;
  float ds = pij * (dot(dyi, vj, p.v_head_size) - delta);
  return p.softcap > 0 ? ds * (1 - t * t) : ds;
}

/* grid (query tiles, q_heads, batch): dq of the tile's rows, dq_i = scale sum_j ds_ij k_j. */
template <int DMAX>
__global__ void __launch_bounds__(Tile<DMAX>::THREADS)
    attention_dq_kernel(TpAttention p, Rows q, Rows k, Rows v, Rows dy, const float *lse, const float *delta,
                        float *dq) {
  constexpr int R = Tile<DMAX>::ROWS, C = Tile<DMAX>::COLS, LD = Tile<DMAX>::LD;
  __shared__ float qs[R][LD], dys[R][LD], ks[R][LD], vs[R][LD], dss[R][R + 1];
  const QueryTile tile = query_tile<R>(p, p.kv_len);
  const int64_t b = tile.b, h = tile.h, i = tile.i, n = tile.n, row = (b * p.q_heads + h) * p.q_len + i;
  const int r = tile.r, t = tile.t;
  const float li = r < n ? lse[row] : INFINITY, di = r < n ? delta[row] : 0;
  load_tile<DMAX>(qs, q, b, h, tile.i0, n);
  load_tile<DMAX>(dys, dy, b, h, tile.i0, n);

  float acc[C] = {0}, unused;
  for (int64_t j0 = tile.lo, nk; j0 < tile.hi; j0 += R) {
    load_keys<DMAX>(ks, vs, k, v, tile, j0, &nk);
    __syncthreads();
    for (int jj = t; jj < nk; jj += ROW_THREADS)
      dss[r][jj] = r < n ? score_gradient(p, b, h, i, j0 + jj, qs[r], ks[jj], dys[r], vs[jj], tile.first, tile.end,
                                          li, di, &unused)
                         : 0.0f;
    __syncthreads();
    for (int jj = 0; jj < nk; jj++)
      for (int c = 0; c < C; c++) acc[c] += dss[r][jj] * ks[jj][t + ROW_THREADS * c];
    __syncthreads();
  }
  for (int c = 0; c < C; c++) {
    int64_t col = t + ROW_THREADS * c;
    if (r < n && col < p.head_size) dq[row_offset(q.packed, b, h, p.q_heads, p.q_len, i, p.head_size) + col] = p.scale * acc[c];
  }
}

/* grid (key tiles, kv_heads, batch): dk and dv of the tile's keys (dense: kv_len rows),
 * dv_j = sum p_ij dy_i, dk_j = scale sum ds_ij q_i over the group's query heads in order
 * and, in each, the query tiles that see one of the keys, in order. */
template <int DMAX>
__global__ void __launch_bounds__(Tile<DMAX>::THREADS)
    attention_dkdv_kernel(TpAttention p, Rows q, Rows k, Rows v, Rows dy, const float *lse, const float *delta,
                          float *dk, float *dv) {
  constexpr int R = Tile<DMAX>::ROWS, C = Tile<DMAX>::COLS, LD = Tile<DMAX>::LD;
  __shared__ float ks[R][LD], vs[R][LD], qs[R][LD], dys[R][LD], ps[R][R + 1], dss[R][R + 1], ls[R], ds[R];
  const int64_t b = blockIdx.z, g = blockIdx.y, group = p.q_heads / p.kv_heads, T = p.kv_len;
  const int64_t j0 = (int64_t)blockIdx.x * R, nk = T - j0 < R ? T - j0 : R;
  const int r = threadIdx.x / ROW_THREADS, t = threadIdx.x % ROW_THREADS;
  const int64_t j = j0 + r;
  load_tile<DMAX>(ks, k, b, g, j0, nk);
  load_tile<DMAX>(vs, v, b, g, j0, nk);

  float dk_acc[C] = {0}, dv_acc[C] = {0};
  for (int64_t h = g * group; h < (g + 1) * group; h++)
    for (int64_t i0 = 0; i0 < p.q_len; i0 += R) {
      int64_t n = p.q_len - i0 < R ? p.q_len - i0 : R, lo, hi;
      tp_attention_block_keys(&p, i0, i0 + n, T, &lo, &hi);
      if (hi <= j0 || lo >= j0 + nk) continue; /* no row of the tile sees these keys */
      load_tile<DMAX>(qs, q, b, h, i0, n);
      load_tile<DMAX>(dys, dy, b, h, i0, n);
      for (int ii = threadIdx.x; ii < n; ii += Tile<DMAX>::THREADS) {
        int64_t row = (b * p.q_heads + h) * p.q_len + i0 + ii;
        ls[ii] = lse[row];
        ds[ii] = delta[row];
      }
      __syncthreads();
      for (int ii = t; ii < n; ii += ROW_THREADS) {
        int64_t i = i0 + ii, first = 0, end = 0;
        if (r < nk) tp_attention_key_range(&p, i, T, &first, &end);
        float prob;
        dss[r][ii] = score_gradient(p, b, h, i, j, qs[ii], ks[r], dys[ii], vs[r], first, end, ls[ii], ds[ii], &prob);
        ps[r][ii] = prob;
      }
      __syncthreads();
      for (int ii = 0; ii < n; ii++)
        for (int c = 0; c < C; c++) {
          dv_acc[c] += ps[r][ii] * dys[ii][t + ROW_THREADS * c];
          dk_acc[c] += dss[r][ii] * qs[ii][t + ROW_THREADS * c];
        }
      __syncthreads();
    }
  if (r >= nk) return;
  for (int c = 0; c < C; c++) {
    int64_t col = t + ROW_THREADS * c;
    if (dk && col < p.head_size) dk[row_offset(p.packed, b, g, p.kv_heads, T, j, p.head_size) + col] = p.scale * dk_acc[c];
    if (dv && col < p.v_head_size) dv[row_offset(p.packed, b, g, p.kv_heads, T, j, p.v_head_size) + col] = dv_acc[c];
  }
}

/* present [B, kv_heads, total, D] = past ++ the new rows x (cpu/nn.c's concat_kv). */
__global__ void concat_kv_kernel(const float *past, Rows x, int64_t batch, int64_t past_len, int64_t kv_len,
                                 float *present) {
  const int64_t total = past_len + kv_len, n = batch * x.heads * total * x.D;
  TP_GRID_STRIDE_LOOP(e, n) {
    int64_t d = e % x.D, s = e / x.D % total, bg = e / (x.D * total);
    present[e] = s < past_len ? past[(bg * past_len + s) * x.D + d]
                              : x.data[row_offset(x.packed, bg / x.heads, bg % x.heads, x.heads, x.rows, s - past_len, x.D) + d];
  }
}

/* The tile class of a head size (0: too large). */
static int head_class(const TpAttention *p) {
  int64_t d = p->head_size > p->v_head_size ? p->head_size : p->v_head_size;
  return d <= 64 ? 64 : d <= 128 ? 128 : d <= MAX_HEAD_SIZE ? 256 : 0;
}

static int64_t tiles(int64_t n, int rows) { return (n + rows - 1) / rows; }

template <int DMAX>
static void launch_forward(const TpAttention *p, Rows q, Rows k, Rows v, float *y, const float *dy, float *lse,
                           float *delta, TpStream *s) {
  dim3 grid((unsigned)tiles(p->q_len, Tile<DMAX>::ROWS), (unsigned)p->q_heads, (unsigned)p->batch);
  TP_LAUNCH(attention_forward_kernel<DMAX>, grid, dim3(Tile<DMAX>::THREADS), s->cuda, *p, q, k, v,
            p->past_len + p->kv_len, y, dy, lse, delta);
}

template <int DMAX>
static void launch_backward(const TpAttention *p, Rows q, Rows k, Rows v, Rows dy, float *lse, float *delta,
                            float *dq, float *dk, float *dv, TpStream *s) {
  constexpr int R = Tile<DMAX>::ROWS;
  launch_forward<DMAX>(p, q, k, v, NULL, dy.data, lse, delta, s);
  if (dq) {
    dim3 grid((unsigned)tiles(p->q_len, R), (unsigned)p->q_heads, (unsigned)p->batch);
    TP_LAUNCH(attention_dq_kernel<DMAX>, grid, dim3(Tile<DMAX>::THREADS), s->cuda, *p, q, k, v, dy, lse, delta, dq);
  }
  if (dk || dv) {
    dim3 grid((unsigned)tiles(p->kv_len, R), (unsigned)p->kv_heads, (unsigned)p->batch);
    TP_LAUNCH(attention_dkdv_kernel<DMAX>, grid, dim3(Tile<DMAX>::THREADS), s->cuda, *p, q, k, v, dy, lse, delta,
              dk, dv);
  }
}

static Rows query_rows(const TpAttention *p, const float *x, int64_t D) {
  return Rows{x, p->q_heads, p->q_len, D, p->packed};
}
static Rows key_rows(const TpAttention *p, const float *x, int64_t D) {
  return Rows{x, p->kv_heads, p->kv_rows ? p->kv_rows : p->kv_len, D, p->packed};
}

/* The keys (or values) the forward reads: the inputs in place or, when there is a past or
 * the caller wants present, present (or scratch) = past ++ inputs, [B, kv_heads, total, D]. */
static Rows forward_keys(const TpAttention *p, const float *past, const float *x, int64_t D, float *present,
                         TpStream *s) {
  Rows in = key_rows(p, x, D);
  if (!present) return in;
  int64_t n = p->batch * p->kv_heads * (p->past_len + p->kv_len) * D;
  if (n) TP_LAUNCH(concat_kv_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), s->cuda, past, in,
                   p->batch, p->past_len, p->kv_len, present);
  return Rows{present, p->kv_heads, p->past_len + p->kv_len, D, false};
}

extern "C" TpKernelStatus tp_cuda_attention_f32(const TpAttention *p, const float *q, const float *k, const float *v,
                                                const float *past_k, const float *past_v, float *y, float *present_k,
                                                float *present_v, float *qk_out, TpStream *stream) {
  int dclass = head_class(p);
  if (qk_out || !dclass) return TP_KERNEL_BAD_DTYPE; /* qk_out would need the scores the kernel never stores */
  int64_t total = p->past_len + p->kv_len, D = p->head_size, Dv = p->v_head_size;
  float *kbuf = present_k, *vbuf = present_v;
  if (p->past_len && (!kbuf || !vbuf)) { /* the concatenation goes to scratch */
    size_t kn = (size_t)(p->batch * p->kv_heads * total * D), vn = (size_t)(p->batch * p->kv_heads * total * Dv);
    float *scratch = static_cast<float *>(tp_cuda_scratch(stream, (kn + vn) * sizeof(float)));
    if (!kbuf) kbuf = scratch;
    if (!vbuf) vbuf = scratch + kn;
  }
  Rows kr = forward_keys(p, past_k, k, D, kbuf, stream), vr = forward_keys(p, past_v, v, Dv, vbuf, stream);
  if (p->batch * p->q_heads * p->q_len == 0) return TP_KERNEL_OK;
  Rows qr = query_rows(p, q, D);
  if (dclass == 64) launch_forward<64>(p, qr, kr, vr, y, NULL, NULL, NULL, stream);
  else if (dclass == 128) launch_forward<128>(p, qr, kr, vr, y, NULL, NULL, NULL, stream);
  else launch_forward<256>(p, qr, kr, vr, y, NULL, NULL, NULL, stream);
  return TP_KERNEL_OK;
}

extern "C" TpKernelStatus tp_cuda_attention_backward_f32(const TpAttention *p, const float *dy, const float *q,
                                                         const float *k, const float *v, float *dq, float *dk,
                                                         float *dv, TpStream *stream) {
  int dclass = head_class(p);
  if (!dclass || p->past_len) return TP_KERNEL_BAD_DTYPE; /* the CPU's backward has no past either */
  int64_t B = p->batch, Sq = p->q_len, T = p->kv_len, D = p->head_size, Dv = p->v_head_size;
  if (Sq == 0 || T == 0 || B * p->q_heads == 0) { /* nothing attended: every gradient is zero */
    if (dq) TP_CUDA_CHECK(cudaMemsetAsync(dq, 0, (size_t)(B * p->q_heads * Sq * D) * sizeof *dq, stream->cuda));
    if (dk) TP_CUDA_CHECK(cudaMemsetAsync(dk, 0, (size_t)(B * p->kv_heads * T * D) * sizeof *dk, stream->cuda));
    if (dv) TP_CUDA_CHECK(cudaMemsetAsync(dv, 0, (size_t)(B * p->kv_heads * T * Dv) * sizeof *dv, stream->cuda));
    return TP_KERNEL_OK;
  }
  if (!dq && !dk && !dv) return TP_KERNEL_OK;
  size_t rows = (size_t)(B * p->q_heads * Sq); /* each query row's log-sum-exp and delta */
  float *lse = static_cast<float *>(tp_cuda_scratch(stream, 2 * rows * sizeof(float))), *delta = lse + rows;
  Rows qr = query_rows(p, q, D), kr = key_rows(p, k, D), vr = key_rows(p, v, Dv), dyr = query_rows(p, dy, Dv);
  if (dclass == 64) launch_backward<64>(p, qr, kr, vr, dyr, lse, delta, dq, dk, dv, stream);
  else if (dclass == 128) launch_backward<128>(p, qr, kr, vr, dyr, lse, delta, dq, dk, dv, stream);
  else launch_backward<256>(p, qr, kr, vr, dyr, lse, delta, dq, dk, dv, stream);
  return TP_KERNEL_OK;
}
