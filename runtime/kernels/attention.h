/* Attention's parameters (TpAttention) and the index arithmetic both targets' kernels
 * share: which keys a query row sees, where a head's matrix starts, the mask's values. */
#ifndef TOKPIPE_KERNELS_ATTENTION_H
#define TOKPIPE_KERNELS_ATTENTION_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "../../base/host_device.h"

/* Scaled dot-product attention as ONNX Attention (opset 23) defines it. Per batch b and
 * query head h (kv head h / (q_heads / kv_heads), grouped-query attention):
 *   s = scale * Q K^T                      [q_len, total], total = past_len + kv_len
 *   s = softcap * tanh(s / softcap)        when softcap > 0
 *   s = s + mask + causal                  -inf where masked out
 *   Y = softmax(s) V
 * Causal: query i sees key j iff j <= i + past_len + causal_offset (a token slice's queries
 * start causal_offset rows into the sequence its keys cover); with a window w > 0 also
 * j > i + past_len + causal_offset - w (a band of the w latest keys: sliding-window and
 * local attention). A row that sees no key gives zeros. */
typedef struct {
  int64_t batch, q_heads, kv_heads;
  int64_t q_len, kv_len, past_len;
  int64_t head_size, v_head_size;
  /* true: Q, K, V and Y are [B, S, heads*D] ("3-D"); false: [B, heads, S, D] */
  bool packed;
  bool is_causal;
  int64_t causal_offset; /* >= 0; 0 for a whole sequence */
  int64_t window;        /* >= 0, with is_causal; 0: none */
  /* Rows k and v hold per (batch, kv head) along the sequence, >= kv_len (0: kv_len): the
   * keys of a token slice read in place from a context buffer sized for the whole sequence.
   * Their gradients (tp_attention_backward_f32's dk, dv) are dense [.., kv_len, ..]. */
  int64_t kv_rows;
  float scale;   /* resolved: never 0 */
  float softcap; /* 0: none */
  /* what qk_out receives: 0 the scaled product, 1 after softcap, 2 after the mask,
   * 3 after softmax */
  int qk_mode;
  /* Optional mask broadcast to [B, q_heads, q_len, mask_len]: element (b,h,i,j) at
   * mask_strides . (b,h,i,j), 0 strides where broadcast. bool (1 byte, true = attend) or
   * f32 (added). Keys j >= mask_len (mask_len <= total) are masked out. */
  const void *mask;
  bool mask_is_bool;
  int64_t mask_strides[4];
  int64_t mask_len;
} TpAttention;

/* Describes a mask of `rank` <= 4 dims (right-aligned, numpy broadcasting) to p: its
 * strides over [B, q_heads, q_len, mask_len], 0 where it is broadcast, and mask_len. */
static inline void tp_attention_set_mask(TpAttention *p, const void *mask, bool is_bool, const int64_t *dims,
                                         int rank) {
  p->mask = mask;
  p->mask_is_bool = is_bool;
  p->mask_len = rank ? dims[rank - 1] : 1;
  int64_t stride = 1;
  for (int k = 3, km = rank - 1; k >= 0; k--, km--) {
    int64_t dim = km >= 0 ? dims[km] : 1;
    p->mask_strides[k] = dim == 1 ? 0 : stride;
    stride *= dim;
  }
}

/* The keys [*first, *end) of the `total` that query row i may see: the causal and window
 * bounds, and the mask's length (first <= end; the mask's values are not read). */
TP_HOST_DEVICE static inline void tp_attention_key_range(const TpAttention *p, int64_t i, int64_t total,
                                                         int64_t *first, int64_t *end) {
  int64_t last = i + p->past_len + p->causal_offset; /* the latest key a causal row sees */
  *end = p->is_causal && last + 1 < total ? last + 1 : total;
  if (p->mask && *end > p->mask_len) *end = p->mask_len;
  *first = p->is_causal && p->window > 0 && last + 1 - p->window > 0 ? last + 1 - p->window : 0;
  if (*first > *end) *first = *end;
}

/* Query rows per attention block: a block needs only the keys up to its last row's causal
 * bound (and, with a window, from its first row's first), so causal attention skips the
 * masked-out triangle and a window the keys before it. */
enum { TP_ATTENTION_QUERY_BLOCK = 64 };

/* The keys [*lo, *hi) that some row of query rows [i0, i1) may see (the rows' ranges only
 * move forward). */
TP_HOST_DEVICE static inline void tp_attention_block_keys(const TpAttention *p, int64_t i0, int64_t i1,
                                                          int64_t total, int64_t *lo, int64_t *hi) {
  int64_t unused;
  tp_attention_key_range(p, i0, total, lo, &unused);
  tp_attention_key_range(p, i1 - 1, total, &unused, hi);
}

/* Row i of the scores of batch b, head h over keys [j0, j1) (s[0] is key j0), masked:
 * a bool mask sets -inf where false, a float mask is added. */
static inline void tp_attention_mask_row(const TpAttention *p, int64_t b, int64_t h, int64_t i, int64_t j0,
                                         int64_t j1, float *s) {
  const int64_t *ms = p->mask_strides;
  const int64_t at = b * ms[0] + h * ms[1] + i * ms[2];
  if (p->mask_is_bool) {
    const unsigned char *mb = (const unsigned char *)p->mask;
    for (int64_t j = j0; j < j1; j++)
      if (!mb[at + j * ms[3]]) s[j - j0] = -INFINITY;
  } else {
    const float *mf = (const float *)p->mask;
    for (int64_t j = j0; j < j1; j++) s[j - j0] += mf[at + j * ms[3]];
  }
}

/* Where the [S, D] matrix of batch b, head h of a Q/K/V/Y-shaped tensor with `heads` heads
 * and S rows per head starts, and its leading dimension (*ld). */
static inline int64_t tp_attention_head_offset(const TpAttention *p, int64_t b, int64_t h, int64_t heads, int64_t S,
                                               int64_t D, int64_t *ld) {
  *ld = p->packed ? heads * D : D;
  return p->packed ? b * S * heads * D + h * D : (b * heads + h) * S * D;
}

/* The rows per (batch, kv head) of k and v (see kv_rows). */
static inline int64_t tp_attention_kv_rows(const TpAttention *p) { return p->kv_rows ? p->kv_rows : p->kv_len; }

#endif
