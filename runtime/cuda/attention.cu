/* Fused (flash-style) attention, forward and backward: ops.h's tp_cuda_attention_f32 and
 * tp_cuda_attention_backward_f32 in fp32, and for bf16 plans tp_cuda_bf16_attention_f32 and
 * tp_cuda_bf16_attention_backward_f32 with bf16 products on the tensor cores (the second part
 * of this file, the same tiling and statistics), all computing what tp_attention_f32 and
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
 *             and delta_i = dy_i . y_i, in stream scratch; given the forward's lse and y,
 *             only delta, in the same order), then dq by query tiles, then dk
 *             and dv by key tiles, each key tile summing over its group's query heads and
 *             the query tiles that see it in a fixed order (deterministic, no atomics).
 * Threads: ROW_THREADS per row of a tile; thread t of a row owns the quads (4 columns)
 * t, t + 8, ... of the row's vectors and keys (or queries) t, t + 8, ... of the tile's
 * scores. A row's softmax statistics are read back from shared memory by its 8 threads,
 * so the kernels need no shuffles, only __syncthreads.
 *
 * fp32 on the CUDA cores, so the products are bounded by shared-memory traffic: an SM
 * issues 4 warp FMAs a cycle but reads 128 bytes of shared memory a cycle. The tiles are
 * stored in quads and each thread works on register blocks of them:
 *   QK^T (dots)     one quad of its row and one quad of each of its KEYS = ROWS / 8 keys
 *                   per 4 KEYS FMAs: a warp (4 rows x 8 threads) reads 64 + 128 KEYS
 *                   bytes (1 + KEYS shared cycles) per 4 KEYS warp FMAs;
 *   P V, dS K,...   one quad of 4 weights and COLS / 4 quads of 4 rows (accumulate) per
 *   (accumulate)    4 COLS FMAs: 1 + COLS shared cycles per 4 COLS warp FMAs.
 * In SM cycles (shared cycles / FMA cycles) that is 1.25 and 1.13 for head sizes <= 64
 * (KEYS 4, COLS 8), 1.5 and 1.06 for <= 128, 2 and 1.03 for <= 256, against 8 and 4.5
 * when every FMA loaded its operands as single floats (2 loads per FMA in QK^T, 1 + 1 /
 * COLS in P V): for D <= 64 the products can run at ~80-90% of the FMA peak instead of
 * 12-22% (a model from the code, not timed on a GPU). The quads' 16-byte loads need no
 * alignment fallback: rows are padded with zeros to whole quads in shared memory (the
 * global loads stay scalar and coalesced; they are O(1 / ROWS) of the shared traffic). */
#include "common.cuh"
#include "ops.h"

#ifndef TOKPIPE_CUDA_EMULATE
#include <cuda_bf16.h>
#include <mma.h>
#endif

enum { ROW_THREADS = 8, MAX_HEAD_SIZE = 256 };

/* Four floats, 16-byte aligned: the unit the tiles are stored and read in, so a thread
 * reads four columns of a shared row with one 128-bit load (ld.shared.v4; the emulation
 * has no float4, and a struct of an array needs no type punning). */
struct alignas(16) Quad {
  float v[4];
};

/* The tiles of a kernel for head sizes up to DMAX (64, 128, 256): ROWS rows of DMAX floats
 * are 8 KiB, so the four tiles a kernel stages (Q, K, V, dY) and its scores stay under the
 * 48 KiB of static shared memory a block may have (the emulation has no dynamic shared
 * memory); at most 32 rows: 256 threads. nvcc --resource-usage (sm_90) gives 25-44 KB of
 * shared memory and 79-157 registers per thread, no spills, so an H100/H200 SM (228 KB
 * shared, 64K registers) holds 3 forward blocks of 256 threads for D <= 64 (24 warps,
 * enough with 4-key register blocks). Key tiles are as long as query tiles, so the
 * masked-out triangle a causal query tile still computes is at most its diagonal tile's
 * half. A tile row is QUADS quads, one of padding: rows start 4 banks apart, so the 8
 * rows the 8 threads of a tile row read at once fill the 32 banks without conflict. */
template <int DMAX> struct Tile {
  static constexpr int ROWS = 2048 / DMAX < 32 ? 2048 / DMAX : 32;
  static constexpr int THREADS = ROWS * ROW_THREADS;
  static constexpr int COLS = DMAX / ROW_THREADS; /* the columns a thread owns (a multiple of 4) */
  static constexpr int KEYS = ROWS / ROW_THREADS; /* the scores of its row a thread computes */
  static constexpr int QUADS = DMAX / 4 + 1;      /* a Q/K/V/dY tile row */
  static constexpr int SQUADS = ROWS / 4 + 1;     /* a row of a tile's scores */
};

/* Column c (< COLS) of the vectors of its row thread t owns: the quads t, t + 8, ..., so
 * the 8 threads of a row read 128 consecutive bytes of a tile row at once. */
__device__ __forceinline__ int owned_col(int t, int c) { return 4 * (t + ROW_THREADS * (c / 4)) + c % 4; }

/* Element c of a row of quads. */
__device__ __forceinline__ float &elem(Quad *row, int c) { return row[c / 4].v[c % 4]; }

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

/* Rows [s0, s0 + n) of head `head` of batch b into the tile, zeros past row n and column
 * D: the products below run over whole quads and tiles, and a zero adds nothing. */
template <int DMAX>
__device__ void load_tile(Quad (*tile)[Tile<DMAX>::QUADS], Rows x, int64_t b, int64_t head, int64_t s0, int64_t n) {
  for (int e = threadIdx.x; e < Tile<DMAX>::ROWS * DMAX; e += Tile<DMAX>::THREADS) {
    int r = e / DMAX, c = e % DMAX;
    elem(tile[r], c) = r < n && c < x.D ? x.data[row_offset(x.packed, b, head, x.heads, x.rows, s0 + r, x.D) + c]
                                        : 0.0f;
  }
}

/* out[k] = a . rows[t + 8 k] over the first `quads` quads, k < K: a thread's K scores of
 * its row of a tile pair, summed in column order like a plain dot product. Each quad of `a`
 * loaded feeds 4 K FMAs, each quad of a row 4. */
template <int K, int QUADS>
__device__ __forceinline__ void dots(const Quad *a, const Quad (*rows)[QUADS], int t, int quads, float *out) {
  for (int k = 0; k < K; k++) out[k] = 0;
  for (int d = 0; d < quads; d++) {
    const Quad x = a[d];
    for (int k = 0; k < K; k++) {
      const Quad y = rows[t + ROW_THREADS * k][d];
      for (int u = 0; u < 4; u++) out[k] += x.v[u] * y.v[u];
    }
  }
}

/* acc[c] += w_j rows[j][owned_col(t, c)] for j < n rounded up to 4 (w and rows zero past
 * n), in order of j; *wsum (or NULL) += w_j. Each quad of weights loaded feeds 4 C FMAs,
 * each quad of a row 4. */
template <int C, int QUADS>
__device__ __forceinline__ void accumulate(const Quad *w, const Quad (*rows)[QUADS], int t, int n, float *acc,
                                           float *wsum) {
  for (int j4 = 0; j4 < (n + 3) / 4; j4++) {
    const Quad e = w[j4];
    for (int u = 0; u < 4; u++) {
      if (wsum) *wsum += e.v[u];
      for (int c4 = 0; c4 < C / 4; c4++) {
        const Quad y = rows[4 * j4 + u][t + ROW_THREADS * c4];
        for (int q = 0; q < 4; q++) acc[4 * c4 + q] += e.v[u] * y.v[q];
      }
    }
  }
}

__device__ __forceinline__ int quads_of(int64_t n) { return (int)((n + 3) / 4); }

/* Score of query row i of batch b, head h with key j, from their dot product, as the
 * softmax sees it (cpu/nn.c's order): scaled, capped, masked; -inf for a key outside the
 * row's [first, end). *t gets tanh(s / softcap), for the backward. */
__device__ __forceinline__ float score(const TpAttention &p, int64_t b, int64_t h, int64_t i, int64_t j, float qk,
                                       int64_t first, int64_t end, float *t) {
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
template <int R, int RT = ROW_THREADS> __device__ QueryTile query_tile(const TpAttention &p, int64_t total) {
  QueryTile q;
  q.b = blockIdx.z, q.h = blockIdx.y, q.g = q.h / (p.q_heads / p.kv_heads);
  q.i0 = ((int64_t)gridDim.x - 1 - blockIdx.x) * R, q.n = p.q_len - q.i0 < R ? p.q_len - q.i0 : R;
  q.r = threadIdx.x / RT, q.t = threadIdx.x % RT, q.i = q.i0 + q.r;
  q.first = q.end = 0;
  if (q.r < q.n) tp_attention_key_range(&p, q.i, total, &q.first, &q.end);
  tp_attention_block_keys(&p, q.i0, q.i0 + q.n, total, &q.lo, &q.hi);
  return q;
}

/* Keys (and values) [j0, j0 + *nk) of a query tile's [lo, hi) into the shared tiles. */
template <int DMAX>
__device__ void load_keys(Quad (*ks)[Tile<DMAX>::QUADS], Quad (*vs)[Tile<DMAX>::QUADS], Rows k, Rows v,
                          const QueryTile &q, int64_t j0, int64_t *nk) {
  *nk = q.hi - j0 < Tile<DMAX>::ROWS ? q.hi - j0 : Tile<DMAX>::ROWS;
  load_tile<DMAX>(ks, k, q.b, q.g, j0, *nk);
  load_tile<DMAX>(vs, v, q.b, q.g, j0, *nk);
}

/* grid (query tiles, q_heads, batch). y (or NULL) as tp_attention_f32's; with lse, each
 * row's log-sum-exp of its scores (+inf for a row that sees no key, so that exp(s - lse)
 * is 0), and with dy and delta too the statistics pass of the backward: delta = dy . y
 * (y not stored). */
template <int DMAX>
__global__ void __launch_bounds__(Tile<DMAX>::THREADS)
    attention_forward_kernel(TpAttention p, Rows q, Rows k, Rows v, int64_t total, float *y, const float *dy,
                             float *lse, float *delta) {
  using Tl = Tile<DMAX>;
  constexpr int R = Tl::ROWS, C = Tl::COLS, K = Tl::KEYS, Q = Tl::QUADS;
  __shared__ Quad qs[R][Q], ks[R][Q], vs[R][Q], ss[R][Tl::SQUADS], es[R][Tl::SQUADS];
  const QueryTile tile = query_tile<R>(p, total);
  const int64_t b = tile.b, h = tile.h, i = tile.i, n = tile.n, Dv = p.v_head_size;
  const int r = tile.r, t = tile.t, dq4 = quads_of(p.head_size);
  load_tile<DMAX>(qs, q, b, h, tile.i0, n);

  float m = -INFINITY, l = 0, acc[C] = {0}, unused;
  for (int64_t j0 = tile.lo, nk; j0 < tile.hi; j0 += R) {
    load_keys<DMAX>(ks, vs, k, v, tile, j0, &nk);
    __syncthreads();
    float qk[K];
    dots<K, Q>(qs[r], ks, t, dq4, qk);
    for (int kk = 0; kk < K; kk++) { /* -inf past nk: the maximum below reads whole quads */
      int jj = t + ROW_THREADS * kk;
      elem(ss[r], jj) = r < n && jj < nk ? score(p, b, h, i, j0 + jj, qk[kk], tile.first, tile.end, &unused)
                                         : -INFINITY;
    }
    __syncthreads();
    float m_new = m; /* each thread of the row finds its maximum, then exponentiates its keys */
    for (int j4 = 0; j4 < quads_of(nk); j4++)
      for (int u = 0; u < 4; u++) m_new = fmaxf(m_new, ss[r][j4].v[u]);
    for (int kk = 0; kk < K; kk++) {
      int jj = t + ROW_THREADS * kk; /* zeros past nk: accumulate runs over whole quads */
      elem(es[r], jj) = jj < nk && m_new != -INFINITY ? expf(elem(ss[r], jj) - m_new) : 0.0f;
    }
    __syncthreads();
    if (m_new != -INFINITY) { /* else no key of the row so far has weight */
      float rescale = expf(m - m_new);
      l *= rescale;
      for (int c = 0; c < C; c++) acc[c] *= rescale;
      accumulate<C, Q>(es[r], vs, t, (int)nk, acc, &l);
      m = m_new;
    }
    __syncthreads(); /* every row is done with the tiles before the next ones overwrite them */
  }

  const float inv = l > 0 ? 1 / l : 0; /* a row that sees no key gives zeros */
  float part = 0;                      /* this thread's share of dy_i . y_i */
  for (int c = 0; c < C; c++) {
    int64_t col = owned_col(t, c);
    if (r >= n || col >= Dv) continue;
    int64_t at = row_offset(q.packed, b, h, p.q_heads, p.q_len, i, Dv) + col;
    if (y) y[at] = acc[c] * inv;
    if (dy) part += dy[at] * (acc[c] * inv);
  }
  if (!lse) return;
  elem(ss[r], t) = part; /* the last loop's barrier freed ss */
  __syncthreads();
  if (t == 0 && r < n) {
    float sum = 0;
    for (int u = 0; u < ROW_THREADS; u++) sum += elem(ss[r], u);
    int64_t row = (b * p.q_heads + h) * p.q_len + i;
    if (delta) delta[row] = sum;
    lse[row] = l > 0 ? m + logf(l) : INFINITY;
  }
}

/* The gradient of score s_ij, d s_ij = p_ij (dy_i . v_j - delta_i) with p_ij from row
 * i's log-sum-exp, through the softcap when there is one; qk = q_i . k_j, dyv = dy_i . v_j. */
__device__ __forceinline__ float score_gradient(const TpAttention &p, int64_t b, int64_t h, int64_t i, int64_t j,
                                                float qk, float dyv, int64_t first, int64_t end, float lse,
                                                float delta, float *prob) {
  float t = 0, s = score(p, b, h, i, j, qk, first, end, &t);
  float pij = expf(s - lse);
  *prob = pij;
  float ds = pij * (dyv - delta);
  return p.softcap > 0 ? ds * (1 - t * t) : ds;
}

/* grid (query tiles, q_heads, batch): dq of the tile's rows, dq_i = scale sum_j ds_ij k_j. */
template <int DMAX>
__global__ void __launch_bounds__(Tile<DMAX>::THREADS)
    attention_dq_kernel(TpAttention p, Rows q, Rows k, Rows v, Rows dy, const float *lse, const float *delta,
                        float *dq) {
  using Tl = Tile<DMAX>;
  constexpr int R = Tl::ROWS, C = Tl::COLS, K = Tl::KEYS, Q = Tl::QUADS;
  __shared__ Quad qs[R][Q], dys[R][Q], ks[R][Q], vs[R][Q], dss[R][Tl::SQUADS];
  const QueryTile tile = query_tile<R>(p, p.kv_len);
  const int64_t b = tile.b, h = tile.h, i = tile.i, n = tile.n, row = (b * p.q_heads + h) * p.q_len + i;
  const int r = tile.r, t = tile.t, dq4 = quads_of(p.head_size), dv4 = quads_of(p.v_head_size);
  const float li = r < n ? lse[row] : INFINITY, di = r < n ? delta[row] : 0;
  load_tile<DMAX>(qs, q, b, h, tile.i0, n);
  load_tile<DMAX>(dys, dy, b, h, tile.i0, n);

  float acc[C] = {0}, unused;
  for (int64_t j0 = tile.lo, nk; j0 < tile.hi; j0 += R) {
    load_keys<DMAX>(ks, vs, k, v, tile, j0, &nk);
    __syncthreads();
    float qk[K], dyv[K];
    dots<K, Q>(qs[r], ks, t, dq4, qk);
    dots<K, Q>(dys[r], vs, t, dv4, dyv);
    for (int kk = 0; kk < K; kk++) {
      int jj = t + ROW_THREADS * kk; /* zeros past nk: accumulate runs over whole quads */
      elem(dss[r], jj) = r < n && jj < nk ? score_gradient(p, b, h, i, j0 + jj, qk[kk], dyv[kk], tile.first,
                                                           tile.end, li, di, &unused)
                                          : 0.0f;
    }
    __syncthreads();
    accumulate<C, Q>(dss[r], ks, t, (int)nk, acc, NULL);
    __syncthreads();
  }
  for (int c = 0; c < C; c++) {
    int64_t col = owned_col(t, c);
    if (r < n && col < p.head_size)
      dq[row_offset(q.packed, b, h, p.q_heads, p.q_len, i, p.head_size) + col] = p.scale * acc[c];
  }
}

/* grid (key tiles, kv_heads, batch): dk and dv of the tile's keys (dense: kv_len rows),
 * dv_j = sum p_ij dy_i, dk_j = scale sum ds_ij q_i over the group's query heads in order
 * and, in each, the query tiles that see one of the keys, in order. Thread t of key row r
 * computes the scores of queries t, t + 8, ... of a query tile. */
template <int DMAX>
__global__ void __launch_bounds__(Tile<DMAX>::THREADS)
    attention_dkdv_kernel(TpAttention p, Rows q, Rows k, Rows v, Rows dy, const float *lse, const float *delta,
                          float *dk, float *dv) {
  using Tl = Tile<DMAX>;
  constexpr int R = Tl::ROWS, C = Tl::COLS, K = Tl::KEYS, Q = Tl::QUADS;
  __shared__ Quad ks[R][Q], vs[R][Q], qs[R][Q], dys[R][Q], ps[R][Tl::SQUADS], dss[R][Tl::SQUADS];
  __shared__ float ls[R], ds[R];
  const int64_t b = blockIdx.z, g = blockIdx.y, group = p.q_heads / p.kv_heads, T = p.kv_len;
  const int64_t j0 = (int64_t)blockIdx.x * R, nk = T - j0 < R ? T - j0 : R;
  const int r = threadIdx.x / ROW_THREADS, t = threadIdx.x % ROW_THREADS;
  const int dq4 = quads_of(p.head_size), dv4 = quads_of(p.v_head_size);
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
      for (int ii = threadIdx.x; ii < n; ii += Tl::THREADS) {
        int64_t row = (b * p.q_heads + h) * p.q_len + i0 + ii;
        ls[ii] = lse[row];
        ds[ii] = delta[row];
      }
      __syncthreads();
      float qk[K], dyv[K];
      dots<K, Q>(ks[r], qs, t, dq4, qk);
      dots<K, Q>(vs[r], dys, t, dv4, dyv);
      for (int kk = 0; kk < K; kk++) {
        int ii = t + ROW_THREADS * kk; /* zeros past n: accumulate runs over whole quads */
        float grad = 0, prob = 0;
        if (ii < n) {
          int64_t i = i0 + ii, first = 0, end = 0;
          if (r < nk) tp_attention_key_range(&p, i, T, &first, &end);
          grad = score_gradient(p, b, h, i, j, qk[kk], dyv[kk], first, end, ls[ii], ds[ii], &prob);
        }
        elem(dss[r], ii) = grad;
        elem(ps[r], ii) = prob;
      }
      __syncthreads();
      accumulate<C, Q>(ps[r], dys, t, (int)n, dv_acc, NULL);
      accumulate<C, Q>(dss[r], qs, t, (int)n, dk_acc, NULL);
      __syncthreads();
    }
  if (r >= nk) return;
  for (int c = 0; c < C; c++) {
    int64_t col = owned_col(t, c);
    if (dk && col < p.head_size)
      dk[row_offset(p.packed, b, g, p.kv_heads, T, j, p.head_size) + col] = p.scale * dk_acc[c];
    if (dv && col < p.v_head_size) dv[row_offset(p.packed, b, g, p.kv_heads, T, j, p.v_head_size) + col] = dv_acc[c];
  }
}

/* present [B, kv_heads, total, D] = past ++ the new rows x (cpu/nn.c's concat_kv). */
__global__ void concat_kv_kernel(const float *past, Rows x, int64_t batch, int64_t past_len, int64_t kv_len,
                                 float *present) {
  const int64_t total = past_len + kv_len, n = batch * x.heads * total * x.D;
  TP_GRID_STRIDE_LOOP(e, n) {
    int64_t d = e % x.D, s = e / x.D % total, bg = e / (x.D * total);
    present[e] =
        s < past_len
            ? past[(bg * past_len + s) * x.D + d]
            : x.data[row_offset(x.packed, bg / x.heads, bg % x.heads, x.heads, x.rows, s - past_len, x.D) + d];
  }
}

/* ---- --precision bf16: the same tiles on the tensor cores ----
 * The products (Q K^T, P V; in the backward Q K^T, dY V^T, dS K, P^T dY, dS^T Q) run on
 * WMMA fragments, 16x16x16 tiles of bf16 operands with f32 accumulators; everything else
 * (masks, softcap, the online softmax, dS) is f32 on the CUDA cores, as in the kernels
 * above. Q, K, V and dY are read in f32 and rounded to bf16 (round to nearest even) as
 * they are staged in shared memory; the probabilities P and dS are rounded to bf16 for the
 * products they feed. Each warp owns 16 rows of the tile (query rows; key rows in the
 * dk/dv kernel) and RT = 2 threads per row do its row-wise work, with a shuffle between
 * the two. A warp writes products to shared memory with store_matrix_sync and only reads
 * them back after a __syncthreads, so nothing depends on the (opaque) fragment layout:
 * the running output of the forward lives in registers per (row, column), rescaled there,
 * and each key tile's P V is added through shared memory; dq, dk and dv accumulate in
 * fragments across tiles (no rescaling) and leave through a 16x16 staging tile per warp.
 * The forward writes each row's log-sum-exp when asked (lse), which the backward takes
 * with y in place of a statistics pass (the fp32 kernels too); without them it runs that
 * pass itself.
 * Shapes: head sizes up to 256 in classes of 64 (64 query rows, 32-key steps), 128 (32,
 * 32) and 256 (16, 16), under the 48 KiB of static shared memory; a head size is padded
 * with zeros to a multiple of 16 and the products run over those columns only. */
typedef __nv_bfloat16 bf16;
namespace wmma = nvcuda::wmma;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;

template <int DMAX> struct TcTile {
  static constexpr int ROWS = DMAX == 64 ? 64 : DMAX == 128 ? 32 : 16; /* a block's query (dk/dv: key) rows */
  static constexpr int STEP = DMAX == 256 ? 16 : 32;                   /* keys per step of forward and dq */
  static constexpr int KV_STEP = DMAX == 64 ? 16 : STEP;               /* queries per step of dk/dv */
  static constexpr int THREADS = ROWS / 16 * 32;                       /* a warp per 16 rows */
  static constexpr int RT = THREADS / ROWS;                            /* threads per row: 2 */
  static constexpr int COLS = DMAX / RT;                               /* output columns a thread owns */
  static constexpr int FRAGS = DMAX / 16;                              /* accumulators per warp */
};

__device__ __forceinline__ int tiles16(int64_t n) { return (int)((n + 15) / 16); }

/* Rows [s0, s0 + n) of head `head` of batch b into tile (rows x LD bf16), the columns up to
 * x.D rounded up to 16, zeros past row n and column x.D (a zero adds nothing to a product). */
template <int LD>
__device__ void load_bf16(bf16 *tile, int rows, Rows x, int64_t b, int64_t head, int64_t s0, int64_t n) {
  const int cols = 16 * tiles16(x.D);
  for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
    int r = e / cols, c = e % cols;
    float f = r < n && c < x.D ? x.data[row_offset(x.packed, b, head, x.heads, x.rows, s0 + r, x.D) + c] : 0.0f;
    tile[r * LD + c] = __float2bfloat16(f);
  }
}

/* out[16][16 n_tiles] (row stride ldo) = a b^T over k_steps * 16 columns: a warp's 16 rows
 * a (row stride LD) against the rows of b (row stride LD). */
template <int LD>
__device__ void product_abt(const bf16 *a, const bf16 *b, int n_tiles, int k_steps, float *out, int ldo) {
  for (int nt = 0; nt < n_tiles; nt++) {
    Acc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int ks = 0; ks < k_steps; ks++) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, a + 16 * ks, LD);
      wmma::load_matrix_sync(fb, b + 16 * nt * LD + 16 * ks, LD);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + 16 * nt, acc, (unsigned)ldo, wmma::mem_row_major);
  }
}

/* acc[nt] += a b[:, 16 nt ...] for nt < n_tiles (<= FRAGS): a is a warp's 16 rows of
 * 16 k_steps columns (row stride lda), b 16 k_steps rows (row stride LD). */
template <int LD, int FRAGS>
__device__ void product_ab(const bf16 *a, int lda, const bf16 *b, int n_tiles, int k_steps, Acc *acc) {
  for (int nt = 0; nt < FRAGS; nt++) { /* constant bounds: the fragments stay in registers */
    if (nt >= n_tiles) continue;
    for (int ks = 0; ks < k_steps; ks++) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, a + 16 * ks, (unsigned)lda);
      wmma::load_matrix_sync(fb, b + 16 * ks * LD + 16 * nt, LD);
      wmma::mma_sync(acc[nt], fa, fb, acc[nt]);
    }
  }
}

/* The accumulators acc[nt < n_tiles] of warp w (its rows row0 + [0, 16)) out through the
 * warp's 16x16 staging tile: out(row, col) gets scale * acc for rows < n, columns < D. A
 * loop of the whole block (every thread calls it: it has barriers). */
template <int FRAGS>
__device__ void store_rows(Acc *acc, int n_tiles, float *stage, int64_t row0, int64_t n, int64_t D, float scale,
                           float *out, Rows where, int64_t b, int64_t head) {
  for (int nt = 0; nt < FRAGS; nt++) {
    if (nt >= n_tiles) continue;
    wmma::store_matrix_sync(stage, acc[nt], 16, wmma::mem_row_major);
    __syncthreads();
    for (int e = threadIdx.x % 32; e < 256; e += 32) {
      int64_t r = row0 + e / 16, c = 16 * nt + e % 16;
      if (r < n && c < D)
        out[row_offset(where.packed, b, head, where.heads, where.rows, r, D) + c] = scale * stage[e];
    }
    __syncthreads();
  }
}

template <int DMAX> struct alignas(32) TcForwardShared {
  using Tl = TcTile<DMAX>;
  bf16 q[Tl::ROWS * DMAX], k[Tl::STEP * DMAX], v[Tl::STEP * DMAX], p[Tl::ROWS * Tl::STEP];
  float s[Tl::ROWS * DMAX]; /* a step's scores (ROWS x STEP), then its P V (ROWS x DMAX) */
};

/* grid (query tiles, q_heads, batch), as attention_forward_kernel: y (or NULL), lse (or
 * NULL), and with dy the backward's delta = dy . y. */
template <int DMAX>
__global__ void __launch_bounds__(TcTile<DMAX>::THREADS)
    attention_forward_tc_kernel(TpAttention p, Rows q, Rows k, Rows v, int64_t total, float *y, const float *dy,
                                float *lse, float *delta) {
  using Tl = TcTile<DMAX>;
  constexpr int R = Tl::ROWS, S = Tl::STEP, RT = Tl::RT, C = Tl::COLS;
  static_assert(sizeof(TcForwardShared<DMAX>) <= 48 * 1024, "static shared memory");
  __shared__ TcForwardShared<DMAX> sh;
  const QueryTile tile = query_tile<R, RT>(p, total);
  const int64_t b = tile.b, h = tile.h, i = tile.i, n = tile.n, Dv = p.v_head_size;
  const int r = tile.r, t = tile.t, w = threadIdx.x / 32;
  load_bf16<DMAX>(sh.q, R, q, b, h, tile.i0, n);

  float m = -INFINITY, l = 0, acc[C] = {0}, unused;
  for (int64_t j0 = tile.lo; j0 < tile.hi; j0 += S) {
    const int64_t nk = tile.hi - j0 < S ? tile.hi - j0 : S;
    load_bf16<DMAX>(sh.k, S, k, b, tile.g, j0, nk);
    load_bf16<DMAX>(sh.v, S, v, b, tile.g, j0, nk);
    __syncthreads();
    product_abt<DMAX>(sh.q + 16 * w * DMAX, sh.k, S / 16, tiles16(p.head_size), sh.s + 16 * w * S, S);
    __syncthreads();
    float sc[S / RT], m_new = m, part = 0;
    for (int u = 0; u < S / RT; u++) {
      int jj = t + RT * u;
      sc[u] = r < n && jj < nk ? score(p, b, h, i, j0 + jj, sh.s[r * S + jj], tile.first, tile.end, &unused)
                               : -INFINITY;
      m_new = fmaxf(m_new, sc[u]);
    }
    m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));
    for (int u = 0; u < S / RT; u++) { /* the sum of the f32 weights, the product's rounded */
      float e = m_new == -INFINITY ? 0.0f : expf(sc[u] - m_new);
      sh.p[r * S + t + RT * u] = __float2bfloat16(e);
      part += e;
    }
    const float rescale = m_new == -INFINITY ? 1.0f : expf(m - m_new);
    l = l * rescale + (part + __shfl_xor_sync(0xffffffffu, part, 1));
    m = m_new;
    __syncthreads(); /* the scores are read: sh.s takes P V */
    Acc pv[Tl::FRAGS];
    for (int f = 0; f < Tl::FRAGS; f++) wmma::fill_fragment(pv[f], 0.0f);
    product_ab<DMAX, Tl::FRAGS>(sh.p + 16 * w * S, S, sh.v, tiles16(Dv), S / 16, pv);
    for (int f = 0; f < Tl::FRAGS; f++)
      if (f < tiles16(Dv)) wmma::store_matrix_sync(sh.s + 16 * w * DMAX + 16 * f, pv[f], DMAX, wmma::mem_row_major);
    __syncthreads();
    for (int c = 0; c < C; c++) {
      int col = t + RT * c;
      acc[c] = acc[c] * rescale + (col < Dv ? sh.s[r * DMAX + col] : 0.0f);
    }
    __syncthreads(); /* every row is done with the tiles before the next ones overwrite them */
  }

  const float inv = l > 0 ? 1 / l : 0; /* a row that sees no key gives zeros */
  float part = 0;                      /* this thread's share of dy_i . y_i */
  for (int c = 0; c < C; c++) {
    int64_t col = t + RT * c;
    if (r >= n || col >= Dv) continue;
    int64_t at = row_offset(q.packed, b, h, p.q_heads, p.q_len, i, Dv) + col;
    if (y) y[at] = acc[c] * inv;
    if (dy) part += dy[at] * (acc[c] * inv);
  }
  part += __shfl_xor_sync(0xffffffffu, part, 1);
  if (t == 0 && r < n) {
    int64_t row = (b * p.q_heads + h) * p.q_len + i;
    if (delta) delta[row] = part;
    if (lse) lse[row] = l > 0 ? m + logf(l) : INFINITY;
  }
}

/* How a statistics pass sums delta_i = dy_i . y_i: each of `threads` threads of a row
 * the columns dealt to it `width` at a time, round robin, then the threads' parts in order,
 * from zero (fp32: 8 threads, quads; sum_from_zero) or from the first (tensor cores: 2
 * threads, single columns). */
struct DeltaOrder {
  int threads, width;
  bool sum_from_zero;
};

/* delta_i = dy_i . y_i per query row from the forward's y (rows of Dv), summed in the
 * statistics pass's order, so that the gradients keep the bits they have with that pass. */
__global__ void attention_delta_kernel(Rows dy, const float *y, int64_t batch, DeltaOrder order, float *delta) {
  const int64_t rows = batch * dy.heads * dy.rows, deal = (int64_t)order.threads * order.width;
  TP_GRID_STRIDE_LOOP(row, rows) {
    int64_t i = row % dy.rows, h = row / dy.rows % dy.heads, b = row / (dy.rows * dy.heads);
    int64_t at = row_offset(dy.packed, b, h, dy.heads, dy.rows, i, dy.D);
    float sum = 0;
    for (int u = 0; u < order.threads; u++) {
      float part = 0;
      for (int64_t c0 = (int64_t)u * order.width; c0 < dy.D; c0 += deal)
        for (int64_t c = c0; c < c0 + order.width && c < dy.D; c++) part += dy.data[at + c] * y[at + c];
      sum = u == 0 && !order.sum_from_zero ? part : sum + part;
    }
    delta[row] = sum;
  }
}

template <int DMAX> struct alignas(32) TcDqShared {
  using Tl = TcTile<DMAX>;
  bf16 q[Tl::ROWS * DMAX], dy[Tl::ROWS * DMAX], k[Tl::STEP * DMAX], v[Tl::STEP * DMAX], ds[Tl::ROWS * Tl::STEP];
  float s[Tl::ROWS * Tl::STEP], dp[Tl::ROWS * Tl::STEP]; /* s: then the warps' staging tiles */
};

/* grid (query tiles, q_heads, batch): dq, as attention_dq_kernel. */
template <int DMAX>
__global__ void __launch_bounds__(TcTile<DMAX>::THREADS)
    attention_dq_tc_kernel(TpAttention p, Rows q, Rows k, Rows v, Rows dy, const float *lse, const float *delta,
                           float *dq) {
  using Tl = TcTile<DMAX>;
  constexpr int R = Tl::ROWS, S = Tl::STEP, RT = Tl::RT;
  static_assert(sizeof(TcDqShared<DMAX>) <= 48 * 1024, "static shared memory");
  __shared__ TcDqShared<DMAX> sh;
  const QueryTile tile = query_tile<R, RT>(p, p.kv_len);
  const int64_t b = tile.b, h = tile.h, i = tile.i, n = tile.n, row = (b * p.q_heads + h) * p.q_len + i;
  const int r = tile.r, t = tile.t, w = threadIdx.x / 32;
  const float li = r < n ? lse[row] : INFINITY, di = r < n ? delta[row] : 0;
  load_bf16<DMAX>(sh.q, R, q, b, h, tile.i0, n);
  load_bf16<DMAX>(sh.dy, R, dy, b, h, tile.i0, n);

  Acc acc[Tl::FRAGS];
  for (int f = 0; f < Tl::FRAGS; f++) wmma::fill_fragment(acc[f], 0.0f);
  float unused;
  for (int64_t j0 = tile.lo; j0 < tile.hi; j0 += S) {
    const int64_t nk = tile.hi - j0 < S ? tile.hi - j0 : S;
    load_bf16<DMAX>(sh.k, S, k, b, tile.g, j0, nk);
    load_bf16<DMAX>(sh.v, S, v, b, tile.g, j0, nk);
    __syncthreads();
    product_abt<DMAX>(sh.q + 16 * w * DMAX, sh.k, S / 16, tiles16(p.head_size), sh.s + 16 * w * S, S);
    product_abt<DMAX>(sh.dy + 16 * w * DMAX, sh.v, S / 16, tiles16(p.v_head_size), sh.dp + 16 * w * S, S);
    __syncthreads();
    for (int u = 0; u < S / RT; u++) {
      int jj = t + RT * u;
      float ds = r < n && jj < nk ? score_gradient(p, b, h, i, j0 + jj, sh.s[r * S + jj], sh.dp[r * S + jj],
                                                   tile.first, tile.end, li, di, &unused)
                                  : 0.0f;
      sh.ds[r * S + jj] = __float2bfloat16(ds);
    }
    __syncthreads();
    product_ab<DMAX, Tl::FRAGS>(sh.ds + 16 * w * S, S, sh.k, tiles16(p.head_size), S / 16, acc);
    __syncthreads();
  }
  store_rows<Tl::FRAGS>(acc, tiles16(p.head_size), sh.s + 16 * w * S, tile.i0 + 16 * w, tile.i0 + n, p.head_size,
                        p.scale, dq, q, b, h);
}

template <int DMAX> struct alignas(32) TcDkdvShared {
  using Tl = TcTile<DMAX>;
  static constexpr int QS = Tl::KV_STEP;
  bf16 k[Tl::ROWS * DMAX], v[Tl::ROWS * DMAX], q[QS * DMAX], dy[QS * DMAX], pt[Tl::ROWS * QS], dst[Tl::ROWS * QS];
  float s[Tl::ROWS * QS], dp[Tl::ROWS * QS], lse[QS], delta[QS]; /* s: then the staging tiles */
};

/* grid (key tiles, kv_heads, batch): dk and dv, as attention_dkdv_kernel (the same order of
 * query heads and tiles; thread t of key row r computes queries t, t + 2, ... of a tile). */
template <int DMAX>
__global__ void __launch_bounds__(TcTile<DMAX>::THREADS)
    attention_dkdv_tc_kernel(TpAttention p, Rows q, Rows k, Rows v, Rows dy, const float *lse, const float *delta,
                             float *dk, float *dv) {
  using Tl = TcTile<DMAX>;
  constexpr int R = Tl::ROWS, QS = Tl::KV_STEP, RT = Tl::RT;
  static_assert(sizeof(TcDkdvShared<DMAX>) <= 48 * 1024, "static shared memory");
  __shared__ TcDkdvShared<DMAX> sh;
  const int64_t b = blockIdx.z, g = blockIdx.y, group = p.q_heads / p.kv_heads, T = p.kv_len;
  const int64_t j0 = (int64_t)blockIdx.x * R, nk = T - j0 < R ? T - j0 : R;
  const int r = threadIdx.x / RT, t = threadIdx.x % RT, w = threadIdx.x / 32;
  const int64_t j = j0 + r;
  load_bf16<DMAX>(sh.k, R, k, b, g, j0, nk);
  load_bf16<DMAX>(sh.v, R, v, b, g, j0, nk);

  Acc dk_acc[Tl::FRAGS], dv_acc[Tl::FRAGS];
  for (int f = 0; f < Tl::FRAGS; f++) wmma::fill_fragment(dk_acc[f], 0.0f), wmma::fill_fragment(dv_acc[f], 0.0f);
  for (int64_t h = g * group; h < (g + 1) * group; h++)
    for (int64_t i0 = 0; i0 < p.q_len; i0 += QS) {
      int64_t n = p.q_len - i0 < QS ? p.q_len - i0 : QS, lo, hi;
      tp_attention_block_keys(&p, i0, i0 + n, T, &lo, &hi);
      if (hi <= j0 || lo >= j0 + nk) continue; /* no row of the tile sees these keys */
      load_bf16<DMAX>(sh.q, QS, q, b, h, i0, n);
      load_bf16<DMAX>(sh.dy, QS, dy, b, h, i0, n);
      for (int ii = threadIdx.x; ii < n; ii += Tl::THREADS) {
        int64_t row = (b * p.q_heads + h) * p.q_len + i0 + ii;
        sh.lse[ii] = lse[row];
        sh.delta[ii] = delta[row];
      }
      __syncthreads();
      product_abt<DMAX>(sh.k + 16 * w * DMAX, sh.q, QS / 16, tiles16(p.head_size), sh.s + 16 * w * QS, QS);
      product_abt<DMAX>(sh.v + 16 * w * DMAX, sh.dy, QS / 16, tiles16(p.v_head_size), sh.dp + 16 * w * QS, QS);
      __syncthreads();
      for (int u = 0; u < QS / RT; u++) {
        int ii = t + RT * u;
        float grad = 0, prob = 0;
        if (ii < n && r < nk) {
          int64_t i = i0 + ii, first, end;
          tp_attention_key_range(&p, i, T, &first, &end);
          grad = score_gradient(p, b, h, i, j, sh.s[r * QS + ii], sh.dp[r * QS + ii], first, end, sh.lse[ii],
                                sh.delta[ii], &prob);
        }
        sh.dst[r * QS + ii] = __float2bfloat16(grad);
        sh.pt[r * QS + ii] = __float2bfloat16(prob);
      }
      __syncthreads();
      product_ab<DMAX, Tl::FRAGS>(sh.pt + 16 * w * QS, QS, sh.dy, tiles16(p.v_head_size), QS / 16, dv_acc);
      product_ab<DMAX, Tl::FRAGS>(sh.dst + 16 * w * QS, QS, sh.q, tiles16(p.head_size), QS / 16, dk_acc);
      __syncthreads();
    }
  const Rows dense_k = {NULL, p.kv_heads, T, p.head_size, p.packed},
             dense_v = {NULL, p.kv_heads, T, p.v_head_size, p.packed};
  float *stage = sh.s + 16 * w * QS;
  if (dk)
    store_rows<Tl::FRAGS>(dk_acc, tiles16(p.head_size), stage, j0 + 16 * w, T, p.head_size, p.scale, dk, dense_k, b,
                          g);
  if (dv)
    store_rows<Tl::FRAGS>(dv_acc, tiles16(p.v_head_size), stage, j0 + 16 * w, T, p.v_head_size, 1.0f, dv, dense_v, b,
                          g);
}

/* The tile class of a head size (0: too large). */
static int head_class(const TpAttention *p) {
  int64_t d = p->head_size > p->v_head_size ? p->head_size : p->v_head_size;
  return d <= 64 ? 64 : d <= 128 ? 128 : d <= MAX_HEAD_SIZE ? 256 : 0;
}

static int64_t tiles(int64_t n, int rows) { return (n + rows - 1) / rows; }

/* The (query, key) pairs attention visits: every one, less the upper triangle a causal
 * mask hides (as many flops as the kernels' tiles skip, roughly). */
static double attention_pairs(const TpAttention *p) {
  double q = (double)p->q_len, keys = (double)(p->past_len + p->kv_len);
  double pairs = q * keys;
  if (p->is_causal && keys >= q) pairs -= q * (q - 1) / 2;
  return (double)p->batch * (double)p->q_heads * pairs;
}

/* Flops per visited pair of each kernel, by its products' operands (f32, or bf16 on the
 * tensor cores): the forward's scores and sum of values, the dq kernel's scores, dP and
 * dS K, the dk/dv kernel's scores, dV, dP and dK. */
static void count_attention(const TpAttention *p, double per_pair, bool tensor_cores) {
  TP_CUDA_COUNT(flops[tensor_cores ? TP_FLOPS_BF16 : TP_FLOPS_F32], per_pair * attention_pairs(p));
}

/* Which kernels a call runs: fp32 on the CUDA cores or bf16 products on the tensor cores. */
struct Kernels {
  bool tensor_cores;
};

template <int DMAX>
static void launch_forward(Kernels kind, const TpAttention *p, Rows q, Rows k, Rows v, float *y, const float *dy,
                           float *lse, float *delta, TpStream *s) {
  const int64_t total = p->past_len + p->kv_len;
  count_attention(p, 2.0 * (double)(p->head_size + p->v_head_size), kind.tensor_cores);
  if (kind.tensor_cores) {
    dim3 grid((unsigned)tiles(p->q_len, TcTile<DMAX>::ROWS), (unsigned)p->q_heads, (unsigned)p->batch);
    TP_LAUNCH(attention_forward_tc_kernel<DMAX>, grid, dim3(TcTile<DMAX>::THREADS), s->cuda, *p, q, k, v, total, y,
              dy, lse, delta);
  } else {
    dim3 grid((unsigned)tiles(p->q_len, Tile<DMAX>::ROWS), (unsigned)p->q_heads, (unsigned)p->batch);
    TP_LAUNCH(attention_forward_kernel<DMAX>, grid, dim3(Tile<DMAX>::THREADS), s->cuda, *p, q, k, v, total, y, dy,
              lse, delta);
  }
}

/* dq, dk, dv (each or NULL) from each query row's lse and delta. */
template <int DMAX>
static void launch_gradients(Kernels kind, const TpAttention *p, Rows q, Rows k, Rows v, Rows dy, const float *lse,
                             const float *delta, float *dq, float *dk, float *dv, TpStream *s) {
  const bool tc = kind.tensor_cores;
  const int rows = tc ? TcTile<DMAX>::ROWS : Tile<DMAX>::ROWS,
            threads = tc ? TcTile<DMAX>::THREADS : Tile<DMAX>::THREADS;
  if (dq) {
    dim3 grid((unsigned)tiles(p->q_len, rows), (unsigned)p->q_heads, (unsigned)p->batch);
    count_attention(p, 2.0 * (double)(2 * p->head_size + p->v_head_size), tc);
    if (tc) TP_LAUNCH(attention_dq_tc_kernel<DMAX>, grid, dim3(threads), s->cuda, *p, q, k, v, dy, lse, delta, dq);
    else TP_LAUNCH(attention_dq_kernel<DMAX>, grid, dim3(threads), s->cuda, *p, q, k, v, dy, lse, delta, dq);
  }
  if (dk || dv) {
    dim3 grid((unsigned)tiles(p->kv_len, rows), (unsigned)p->kv_heads, (unsigned)p->batch);
    count_attention(p, 4.0 * (double)(p->head_size + p->v_head_size), tc);
    if (tc)
      TP_LAUNCH(attention_dkdv_tc_kernel<DMAX>, grid, dim3(threads), s->cuda, *p, q, k, v, dy, lse, delta, dk, dv);
    else TP_LAUNCH(attention_dkdv_kernel<DMAX>, grid, dim3(threads), s->cuda, *p, q, k, v, dy, lse, delta, dk, dv);
  }
}

/* The backward after its statistics: from the forward's lse and y (delta = dy . y, a pass
 * over the rows, summed as the statistics pass sums it: the same bits), or, without them,
 * from the statistics pass (the forward again, writing lse and delta). */
template <int DMAX>
static void launch_backward(Kernels kind, const TpAttention *p, Rows q, Rows k, Rows v, Rows dy, const float *y,
                            const float *saved_lse, float *lse, float *delta, float *dq, float *dk, float *dv,
                            TpStream *s) {
  if (saved_lse) {
    int64_t rows = p->batch * p->q_heads * p->q_len;
    TP_CUDA_COUNT(flops[TP_FLOPS_F32], 2.0 * (double)rows * (double)p->v_head_size);
    const DeltaOrder order = kind.tensor_cores ? DeltaOrder{TcTile<DMAX>::RT, 1, false}
                                               : DeltaOrder{ROW_THREADS, 4, true};
    TP_LAUNCH(attention_delta_kernel, tp_elementwise_grid(rows), dim3(TP_CUDA_ELEMENTWISE_THREADS), s->cuda, dy, y,
              p->batch, order, delta);
  } else {
    launch_forward<DMAX>(kind, p, q, k, v, NULL, dy.data, lse, delta, s);
  }
  launch_gradients<DMAX>(kind, p, q, k, v, dy, saved_lse ? saved_lse : lse, delta, dq, dk, dv, s);
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
  if (n)
    TP_LAUNCH(concat_kv_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), s->cuda, past, in,
              p->batch, p->past_len, p->kv_len, present);
  return Rows{present, p->kv_heads, p->past_len + p->kv_len, D, false};
}

static TpKernelStatus attention_forward(Kernels kind, const TpAttention *p, const float *q, const float *k,
                                        const float *v, const float *past_k, const float *past_v, float *y,
                                        float *present_k, float *present_v, float *qk_out, float *lse,
                                        TpStream *stream) {
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
  if (dclass == 64) launch_forward<64>(kind, p, qr, kr, vr, y, NULL, lse, NULL, stream);
  else if (dclass == 128) launch_forward<128>(kind, p, qr, kr, vr, y, NULL, lse, NULL, stream);
  else launch_forward<256>(kind, p, qr, kr, vr, y, NULL, lse, NULL, stream);
  return TP_KERNEL_OK;
}

static TpKernelStatus attention_backward(Kernels kind, const TpAttention *p, const float *dy, const float *q,
                                         const float *k, const float *v, const float *y, const float *saved_lse,
                                         float *dq, float *dk, float *dv, TpStream *stream) {
  int dclass = head_class(p);
  if (!dclass || p->past_len) return TP_KERNEL_BAD_DTYPE; /* the CPU's backward has no past either */
  if (!y != !saved_lse) return TP_KERNEL_BAD_DTYPE;       /* the forward's statistics come as a pair */
  int64_t B = p->batch, Sq = p->q_len, T = p->kv_len, D = p->head_size, Dv = p->v_head_size;
  if (Sq == 0 || T == 0 || B * p->q_heads == 0) { /* nothing attended: every gradient is zero */
    if (dq) TP_CUDA_CHECK(cudaMemsetAsync(dq, 0, (size_t)(B * p->q_heads * Sq * D) * sizeof *dq, stream->cuda));
    if (dk) TP_CUDA_CHECK(cudaMemsetAsync(dk, 0, (size_t)(B * p->kv_heads * T * D) * sizeof *dk, stream->cuda));
    if (dv) TP_CUDA_CHECK(cudaMemsetAsync(dv, 0, (size_t)(B * p->kv_heads * T * Dv) * sizeof *dv, stream->cuda));
    return TP_KERNEL_OK;
  }
  if (!dq && !dk && !dv) return TP_KERNEL_OK;
  size_t rows = (size_t)(B * p->q_heads * Sq); /* each query row's log-sum-exp (unless saved) and delta */
  float *lse = static_cast<float *>(tp_cuda_scratch(stream, 2 * rows * sizeof(float))), *delta = lse + rows;
  Rows qr = query_rows(p, q, D), kr = key_rows(p, k, D), vr = key_rows(p, v, Dv), dyr = query_rows(p, dy, Dv);
  if (dclass == 64) launch_backward<64>(kind, p, qr, kr, vr, dyr, y, saved_lse, lse, delta, dq, dk, dv, stream);
  else if (dclass == 128)
    launch_backward<128>(kind, p, qr, kr, vr, dyr, y, saved_lse, lse, delta, dq, dk, dv, stream);
  else launch_backward<256>(kind, p, qr, kr, vr, dyr, y, saved_lse, lse, delta, dq, dk, dv, stream);
  return TP_KERNEL_OK;
}

static const Kernels FP32 = {false}, TENSOR_CORES = {true};

extern "C" TpKernelStatus tp_cuda_attention_f32(const TpAttention *p, const float *q, const float *k, const float *v,
                                                const float *past_k, const float *past_v, float *y, float *present_k,
                                                float *present_v, float *qk_out, float *lse, TpStream *stream) {
  return attention_forward(FP32, p, q, k, v, past_k, past_v, y, present_k, present_v, qk_out, lse, stream);
}

extern "C" TpKernelStatus tp_cuda_attention_backward_f32(const TpAttention *p, const float *dy, const float *q,
                                                         const float *k, const float *v, const float *y,
                                                         const float *lse, float *dq, float *dk, float *dv,
                                                         TpStream *stream) {
  return attention_backward(FP32, p, dy, q, k, v, y, lse, dq, dk, dv, stream);
}

extern "C" TpKernelStatus tp_cuda_bf16_attention_f32(const TpAttention *p, const float *q, const float *k,
                                                     const float *v, const float *past_k, const float *past_v,
                                                     float *y, float *present_k, float *present_v, float *qk_out,
                                                     float *lse, TpStream *stream) {
  return attention_forward(TENSOR_CORES, p, q, k, v, past_k, past_v, y, present_k, present_v, qk_out, lse, stream);
}

extern "C" TpKernelStatus tp_cuda_bf16_attention_backward_f32(const TpAttention *p, const float *dy, const float *q,
                                                              const float *k, const float *v, const float *y,
                                                              const float *lse, float *dq, float *dk, float *dv,
                                                              TpStream *stream) {
  return attention_backward(TENSOR_CORES, p, dy, q, k, v, y, lse, dq, dk, dv, stream);
}
