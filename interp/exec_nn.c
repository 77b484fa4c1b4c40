/* The interpreter's neural-network ops: attributes and operands from the IR, the work done
 * by the f32 kernels of runtime/cpu (other float types go through f32 copies). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/cpu/loss.h"
#include "../runtime/cpu/matmul.h"
#include "../runtime/cpu/nn.h"
#include "interp.h"

static bool present_in(const TpModule *m, int op, int i) {
  return i < m->ops[op].ninputs && m->ops[op].inputs[i] >= 0;
}

static bool present_out(const TpModule *m, int op, int i) {
  return i < m->ops[op].noutputs && m->ops[op].outputs[i] >= 0;
}

static int64_t numel_from(const TpTensor *t, int from, int to) {
  int64_t n = 1;
  for (int i = from; i < to; i++) n *= t->dims[i];
  return n;
}

/* ---- f32 working copies of f16/bf16/f64 tensors ---- */

static float load_float(const void *p, TpDType t, int64_t i) {
  switch (t) {
  case TP_F32: return ((const float *)p)[i];
  case TP_F64: return (float)((const double *)p)[i];
  case TP_F16: return tp_f16_to_f32(((const uint16_t *)p)[i]);
  case TP_BF16: return tp_bf16_to_f32(((const uint16_t *)p)[i]);
  default: return 0;
  }
}

static void store_float(void *p, TpDType t, int64_t i, float v) {
  switch (t) {
  case TP_F32: ((float *)p)[i] = v; break;
  case TP_F64: ((double *)p)[i] = v; break;
  case TP_F16: ((uint16_t *)p)[i] = tp_f32_to_f16(v); break;
  case TP_BF16: ((uint16_t *)p)[i] = tp_f32_to_bf16(v); break;
  default: break;
  }
}

/* An f32 view of t: t itself, or a converted copy when `convert` (else uninitialised, for
 * results). Undo with f32_release, or f32_commit for a result. */
static TpTensor f32_view(const TpTensor *t, bool convert) {
  TpTensor v = *t;
  if (t->dtype == TP_F32 || !t->data) return v;
  int64_t n = tp_tensor_numel(t);
  v.dtype = TP_F32;
  v.data = malloc((size_t)(n ? n : 1) * sizeof(float));
  TP_ASSERT(v.data);
  if (convert)
    for (int64_t i = 0; i < n; i++) ((float *)v.data)[i] = load_float(t->data, t->dtype, i);
  return v;
}

/* Frees a copy made by f32_view of t. */
static void f32_release(const TpTensor *t, TpTensor *v) {
  if (v->data != t->data) free(v->data);
}

/* Stores a result computed in the f32 view v into t, freeing the copy. */
static void f32_commit(TpTensor *t, TpTensor *v) {
  if (v->data == t->data) return;
  for (int64_t i = 0, n = tp_tensor_numel(t); i < n; i++)
    store_float(t->data, t->dtype, i, ((float *)v->data)[i]);
  free(v->data);
}

static int bad_dtype(const TpModule *m, int op, TpDType t, TpDiag *d) {
  const char *name = tp_dtype_name(t);
  return tp_error_op(d, m, op, "element type %s is not supported by the CPU kernel", name ? name : "?");
}

/* ---- MatMul, Gemm ---- */

static bool half_float(TpDType t) { return t == TP_F16 || t == TP_BF16; }

int tp_exec_matmul(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  TpDType t = in[0].dtype;
  bool conv = half_float(t);
  TpTensor a = in[0], b = in[1], y = out[0];
  if (conv) {
    a = f32_view(&in[0], true);
    b = f32_view(&in[1], true);
    y = f32_view(&out[0], false);
  }
  TpKernelStatus s = tp_matmul(&a, &b, &y);
  if (conv) {
    f32_release(&in[0], &a);
    f32_release(&in[1], &b);
    f32_commit(&out[0], &y);
  }
  return s == TP_KERNEL_OK ? TP_OK : bad_dtype(m, op, t, d);
}

int tp_exec_gemm(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  TpDType t = in[0].dtype;
  bool conv = half_float(t), has_c = present_in(m, op, 2);
  TpTensor a = in[0], b = in[1], c = has_c ? in[2] : (TpTensor){0}, y = out[0];
  if (conv) {
    a = f32_view(&in[0], true);
    b = f32_view(&in[1], true);
    if (has_c) c = f32_view(&in[2], true);
    y = f32_view(&out[0], false);
  }
  TpKernelStatus s = tp_gemm(&a, &b, has_c ? &c : NULL, tp_attr_int(m, op, "transA", 0) != 0,
                             tp_attr_int(m, op, "transB", 0) != 0, tp_attr_float(m, op, "alpha", 1.0),
                             tp_attr_float(m, op, "beta", 1.0), &y);
  if (conv) {
    f32_release(&in[0], &a);
    f32_release(&in[1], &b);
    if (has_c) f32_release(&in[2], &c);
    f32_commit(&out[0], &y);
  }
  return s == TP_KERNEL_OK ? TP_OK : bad_dtype(m, op, t, d);
}

/* ---- Softmax, LogSoftmax, LayerNorm ---- */

int tp_exec_softmax(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  if (!tp_dtype_is_float(in[0].dtype)) return bad_dtype(m, op, in[0].dtype, d);
  int axis = (int)tp_attr_int(m, op, "axis", in[0].rank - 1);
  TP_ASSERT(axis >= 0 && axis < in[0].rank);
  TpTensor x = f32_view(&in[0], true), y = f32_view(&out[0], false);
  tp_softmax_f32(x.data, y.data, numel_from(&x, 0, axis), x.dims[axis], numel_from(&x, axis + 1, x.rank),
                 m->ops[op].kind == TP_OP_LogSoftmax);
  f32_release(&in[0], &x);
  f32_commit(&out[0], &y);
  return TP_OK;
}

/* dst = src broadcast (numpy rules, right-aligned) to shape dims[rank]; src is f32. */
static void broadcast_f32(const TpTensor *src, int rank, const int64_t *dims, float *dst) {
  int64_t n = tp_numel(rank, dims);
  for (int64_t i = 0; i < n; i++) {
    int64_t rest = i, si = 0, stride = 1;
    for (int k = rank - 1, ks = src->rank - 1; k >= 0; k--, ks--) {
      int64_t idx = rest % dims[k];
      rest /= dims[k];
      if (ks >= 0) {
        if (src->dims[ks] != 1) si += idx * stride;
        stride *= src->dims[ks];
      }
    }
    dst[i] = ((const float *)src->data)[si];
  }
}

int tp_exec_layernorm(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  if (!tp_dtype_is_float(in[0].dtype)) return bad_dtype(m, op, in[0].dtype, d);
  int axis = (int)tp_attr_int(m, op, "axis", in[0].rank - 1);
  TP_ASSERT(axis >= 0 && axis < in[0].rank);
  float eps = (float)tp_attr_float(m, op, "epsilon", 1e-5);
  bool has_bias = present_in(m, op, 2), has_mean = present_out(m, op, 1),
       has_inv = present_out(m, op, 2);
  TpTensor x = f32_view(&in[0], true), y = f32_view(&out[0], false);
  int64_t outer = numel_from(&x, 0, axis), n = numel_from(&x, axis, x.rank);

  /* Scale and bias broadcast to the normalised shape x.dims[axis..]. */
  float *params = malloc((size_t)(2 * n + 1) * sizeof(float));
  TP_ASSERT(params);
  TpTensor scale = f32_view(&in[1], true);
  broadcast_f32(&scale, x.rank - axis, x.dims + axis, params);
  f32_release(&in[1], &scale);
  if (has_bias) {
    TpTensor bias = f32_view(&in[2], true);
    broadcast_f32(&bias, x.rank - axis, x.dims + axis, params + n);
    f32_release(&in[2], &bias);
  }
  TpTensor mean = has_mean ? f32_view(&out[1], false) : (TpTensor){0};
  TpTensor inv = has_inv ? f32_view(&out[2], false) : (TpTensor){0};
  tp_layernorm_f32(x.data, params, has_bias ? params + n : NULL, outer, n, eps, y.data, mean.data,
                   inv.data);
  if (has_mean) f32_commit(&out[1], &mean);
  if (has_inv) f32_commit(&out[2], &inv);
  free(params);
  f32_release(&in[0], &x);
  f32_commit(&out[0], &y);
  return TP_OK;
}

/* ---- Attention ---- */

int tp_attention_params(const TpModule *m, int op, const TpTensor *Q, const TpTensor *K,
                        const TpTensor *V, TpAttention *p, TpDiag *d) {
  *p = (TpAttention){0};
  if (Q->rank != K->rank || Q->rank != V->rank || (Q->rank != 3 && Q->rank != 4))
    return tp_error_op(d, m, op, "Q, K and V must all be 3-D or all 4-D");
  p->packed = Q->rank == 3;
  p->batch = Q->dims[0];
  bool fit;
  if (p->packed) {
    p->q_heads = tp_attr_int(m, op, "q_num_heads", 0);
    p->kv_heads = tp_attr_int(m, op, "kv_num_heads", 0);
    if (p->q_heads <= 0 || p->kv_heads <= 0)
      return tp_error_op(d, m, op, "3-D inputs need q_num_heads and kv_num_heads");
    p->q_len = Q->dims[1];
    p->kv_len = K->dims[1];
    p->head_size = Q->dims[2] / p->q_heads;
    p->v_head_size = V->dims[2] / p->kv_heads;
    fit = Q->dims[2] % p->q_heads == 0 && K->dims[2] == p->head_size * p->kv_heads &&
          V->dims[2] % p->kv_heads == 0 && V->dims[1] == p->kv_len;
  } else {
    p->q_heads = Q->dims[1];
    p->kv_heads = K->dims[1];
    p->q_len = Q->dims[2];
    p->kv_len = K->dims[2];
    p->head_size = Q->dims[3];
    p->v_head_size = V->dims[3];
    fit = K->dims[3] == p->head_size && V->dims[1] == p->kv_heads && V->dims[2] == p->kv_len;
  }
  if (!fit || K->dims[0] != p->batch || V->dims[0] != p->batch)
    return tp_error_op(d, m, op, "the shapes of Q, K and V do not fit together");
  if (p->kv_heads <= 0 || p->q_heads % p->kv_heads != 0)
    return tp_error_op(d, m, op, "q_num_heads %lld is not a multiple of kv_num_heads %lld",
                       (long long)p->q_heads, (long long)p->kv_heads);
  p->is_causal = tp_attr_int(m, op, "is_causal", 0) != 0;
  p->causal_offset = tp_attr_int(m, op, "causal_offset", 0);
  if (p->causal_offset < 0) return tp_error_op(d, m, op, "causal_offset must be >= 0");
  p->window = tp_attr_int(m, op, "window", 0);
  if (p->window < 0 || (p->window && !p->is_causal))
    return tp_error_op(d, m, op, "window must be >= 0, and only causal attention has one");
  p->scale = (float)tp_attr_float(m, op, "scale", 0);
  if (p->scale == 0) p->scale = 1.0f / sqrtf((float)p->head_size);
  p->softcap = (float)tp_attr_float(m, op, "softcap", 0);
  return TP_OK;
}

int tp_exec_attention(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  if (!tp_dtype_is_float(in[0].dtype)) return bad_dtype(m, op, in[0].dtype, d);
  const TpTensor *Q = &in[0], *K = &in[1], *V = &in[2];
  bool has_mask = present_in(m, op, 3), has_past = present_in(m, op, 4) && present_in(m, op, 5);
  TpAttention p;
  int rc = tp_attention_params(m, op, Q, K, V, &p, d);
  if (rc) return rc;
  p.past_len = has_past ? in[4].dims[2] : 0;
  p.qk_mode = (int)tp_attr_int(m, op, "qk_matmul_output_mode", 0);

  TpTensor mask = {0};
  if (has_mask) {
    const TpTensor *mt = &in[3];
    bool is_bool = mt->dtype == TP_BOOL;
    mask = is_bool ? *mt : f32_view(mt, true);
    tp_attention_set_mask(&p, mask.data, is_bool, mt->dims, mt->rank);
  }

  TpTensor q = f32_view(Q, true), k = f32_view(K, true), v = f32_view(V, true);
  TpTensor pk = has_past ? f32_view(&in[4], true) : (TpTensor){0};
  TpTensor pv = has_past ? f32_view(&in[5], true) : (TpTensor){0};
  TpTensor res[4];
  for (int i = 0; i < 4; i++) res[i] = present_out(m, op, i) ? f32_view(&out[i], false) : (TpTensor){0};
  tp_attention_f32(&p, q.data, k.data, v.data, pk.data, pv.data, res[0].data, res[1].data,
                   res[2].data, res[3].data);
  for (int i = 0; i < 4; i++)
    if (present_out(m, op, i)) f32_commit(&out[i], &res[i]);
  f32_release(Q, &q);
  f32_release(K, &k);
  f32_release(V, &v);
  if (has_past) {
    f32_release(&in[4], &pk);
    f32_release(&in[5], &pv);
  }
  if (has_mask && !p.mask_is_bool) f32_release(&in[3], &mask);
  return TP_OK;
}

/* ---- SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss ---- */

int tp_exec_loss(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  if (!tp_dtype_is_float(in[0].dtype)) return bad_dtype(m, op, in[0].dtype, d);
  if (in[1].dtype != TP_I64 && in[1].dtype != TP_I32) return bad_dtype(m, op, in[1].dtype, d);
  bool sce = m->ops[op].kind == TP_OP_SoftmaxCrossEntropyLoss;
  const char *red = tp_attr_string(m, op, "reduction", "mean");
  TpLossOptions o = {0};
  o.reduction = strcmp(red, "none") == 0 ? TP_REDUCE_NONE
                : strcmp(red, "sum") == 0 ? TP_REDUCE_SUM
                                          : TP_REDUCE_MEAN;
  if (strcmp(red, "none") && strcmp(red, "sum") && strcmp(red, "mean"))
    return tp_error_op(d, m, op, "unknown reduction '%s'", red);
  o.has_ignore = tp_get_attr(m, op, "ignore_index") != NULL;
  o.ignore_index = tp_attr_int(m, op, "ignore_index", 0);

  const TpTensor *X = &in[0];
  int64_t N = X->dims[0], C = X->rank > 1 ? X->dims[1] : 1, D = numel_from(X, 2, X->rank);
  int64_t *target = malloc((size_t)(N * D + 1) * sizeof *target);
  TP_ASSERT(target);
  for (int64_t i = 0; i < N * D; i++)
    target[i] = in[1].dtype == TP_I64 ? ((const int64_t *)in[1].data)[i] : ((const int32_t *)in[1].data)[i];
  TpTensor x = f32_view(X, true), loss = f32_view(&out[0], false);
  TpTensor w = present_in(m, op, 2) ? f32_view(&in[2], true) : (TpTensor){0};
  o.weight = w.data;

  int64_t bad = 0;
  TpKernelStatus s;
  if (sce) {
    bool has_lp = present_out(m, op, 1);
    TpTensor lp = has_lp ? f32_view(&out[1], false) : (TpTensor){0};
    float *lpbuf = has_lp ? lp.data : malloc((size_t)(N * C * D + 1) * sizeof(float));
    TP_ASSERT(lpbuf);
    s = tp_softmax_cross_entropy_f32(x.data, target, N, C, D, &o, lpbuf, loss.data, &bad);
    if (has_lp) f32_commit(&out[1], &lp);
    else free(lpbuf);
  } else {
    s = tp_nll_loss_f32(x.data, target, N, C, D, &o, loss.data, &bad);
  }
  f32_commit(&out[0], &loss);
  f32_release(X, &x);
  if (w.data) f32_release(&in[2], &w);
  int64_t bad_class = s == TP_KERNEL_BAD_INDEX ? target[bad] : 0;
  free(target);
  if (s == TP_KERNEL_BAD_INDEX)
    return tp_error_op(d, m, op, "target %lld at flat index %lld is not a class in [0, %lld)",
                       (long long)bad_class, (long long)bad, (long long)C);
  return TP_OK;
}
