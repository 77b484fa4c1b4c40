/* Neural-network layers on the CPU, f32: softmax, layer normalisation, attention.
 * Plain functions over flat arrays; the shapes are in the comments. */
#ifndef TOKPIPE_CPU_NN_H
#define TOKPIPE_CPU_NN_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "../../base/host_device.h"
#include "../kernels/args.h"

/* Softmax (or log-softmax when `log`) of x viewed as [outer, n, inner] along the middle
 * axis. Numerically stable (the row maximum is subtracted). A row that is all -inf gives
 * zeros (log: -inf) instead of NaN. x and y may alias. */
TpKernelStatus tp_softmax_f32(const float *x, float *y, int64_t outer, int64_t n, int64_t inner, bool log);

/* Layer normalisation of x viewed as [outer, n]: y = (x - mean) * inv_std * scale + bias,
 * inv_std = 1 / sqrt(var + eps), var the biased variance of the row. scale and bias are [n]
 * (bias may be NULL); mean and inv_std (each [outer]) are written when not NULL. */
TpKernelStatus tp_layernorm_f32(const float *x, const float *scale, const float *bias, int64_t outer,
                      int64_t n, float eps, float *y, float *mean, float *inv_std);

/* Scaled dot-product attention: TpAttention (runtime/kernels/attention.h) says what it computes. */

/* q: [B, q_heads, q_len, D] (or packed); k: [B, kv_heads, kv_len, D]; v: the same with
 * v_head_size; past_k/past_v: [B, kv_heads, past_len, D or Dv] or NULL (past_len 0).
 * y: [B, q_heads, q_len, Dv] (or packed). present_k/present_v ([B, kv_heads, total, D]),
 * qk_out ([B, q_heads, q_len, total]) are written when not NULL. */
TpKernelStatus tp_attention_f32(const TpAttention *p, const float *q, const float *k, const float *v,
                      const float *past_k, const float *past_v, float *y, float *present_k,
                      float *present_v, float *qk_out);

#endif
