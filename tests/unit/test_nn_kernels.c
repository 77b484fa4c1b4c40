/* Unit tests of the nn kernels (runtime/cpu/{matmul,nn,loss}) against hand-computed values. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runtime/cpu/loss.h"
#include "runtime/cpu/matmul.h"
#include "runtime/cpu/nn.h"

static int failures;

/* Compares n floats; reports the first mismatch with its index and size. */
static void check_close(const char *what, const float *got, const float *want, int n, float tol) {
  for (int i = 0; i < n; i++) {
    bool same = (isnan(got[i]) && isnan(want[i])) || got[i] == want[i] || fabsf(got[i] - want[i]) <= tol;
    if (!same) {
      fprintf(stderr, "FAIL %s: [%d] got %.7g want %.7g (err %.3g)\n", what, i, got[i], want[i],
              fabsf(got[i] - want[i]));
      failures++;
      return;
    }
  }
}

/* A tensor view over `data` with the given dims. */
static TpTensor tensor(TpDType t, void *data, int rank, ...) {
  TpTensor x = {.dtype = t, .rank = rank, .data = data};
  va_list ap;
  va_start(ap, rank);
  for (int i = 0; i < rank; i++) x.dims[i] = va_arg(ap, int);
  va_end(ap);
  return x;
}

static void test_matmul(void) {
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12}, y[4];
  TpTensor A = tensor(TP_F32, a, 2, 2, 3), B = tensor(TP_F32, b, 2, 3, 2), Y = tensor(TP_F32, y, 2, 2, 2);
  if (tp_matmul(&A, &B, &Y) != TP_KERNEL_OK) failures++, fprintf(stderr, "FAIL matmul 2d refused\n");
  check_close("matmul 2d", y, (float[]){58, 64, 139, 154}, 4, 0);

  /* 1-D @ 2-D: [3] @ [3,2] -> [2] */
  TpTensor V = tensor(TP_F32, a, 1, 3), Y1 = tensor(TP_F32, y, 1, 2);
  tp_matmul(&V, &B, &Y1);
  check_close("matmul 1d-2d", y, (float[]){58, 64}, 2, 0);
  /* 2-D @ 1-D: [2,3] @ [3] -> [2] */
  TpTensor W = tensor(TP_F32, b, 1, 3);
  tp_matmul(&A, &W, &Y1);
  check_close("matmul 2d-1d", y, (float[]){1 * 7 + 2 * 8 + 3 * 9, 4 * 7 + 5 * 8 + 6 * 9}, 2, 0);

  /* Batch broadcast: [2,1,1,2] @ [3,2,1] -> [2,3,1,1]; y[i,j] = a_i . b_j */
  float ab[4] = {1, 2, 3, 4}, bb[6] = {1, 0, 0, 1, 1, 1}, yb[6];
  TpTensor AB = tensor(TP_F32, ab, 4, 2, 1, 1, 2), BB = tensor(TP_F32, bb, 3, 3, 2, 1);
  TpTensor YB = tensor(TP_F32, yb, 4, 2, 3, 1, 1);
  tp_matmul(&AB, &BB, &YB);
  check_close("matmul broadcast", yb, (float[]){1, 2, 3, 3, 4, 7}, 6, 0);

  /* Shared right operand folded into one product: [2,2,3] @ [3,2] */
  float a3[12] = {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6}, y3[8];
  TpTensor A3 = tensor(TP_F32, a3, 3, 2, 2, 3), Y3 = tensor(TP_F32, y3, 3, 2, 2, 2);
  tp_matmul(&A3, &B, &Y3);
  check_close("matmul batch fold", y3, (float[]){58, 64, 139, 154, 58, 64, 139, 154}, 8, 0);

  double ad[2] = {1.5, 2}, bd[2] = {2, 4}, yd[1];
  TpTensor AD = tensor(TP_F64, ad, 2, 1, 2), BD = tensor(TP_F64, bd, 2, 2, 1), YD = tensor(TP_F64, yd, 2, 1, 1);
  tp_matmul(&AD, &BD, &YD);
  if (yd[0] != 11) failures++, fprintf(stderr, "FAIL matmul f64: %g\n", yd[0]);

  int64_t ai[4] = {1, 2, 3, 4}, yi[4];
  TpTensor AI = tensor(TP_I64, ai, 2, 2, 2), YI = tensor(TP_I64, yi, 2, 2, 2);
  tp_matmul(&AI, &AI, &YI);
  if (yi[0] != 7 || yi[1] != 10 || yi[2] != 15 || yi[3] != 22)
    failures++, fprintf(stderr, "FAIL matmul i64: %lld %lld %lld %lld\n", (long long)yi[0], (long long)yi[1],
                        (long long)yi[2], (long long)yi[3]);

  TpTensor bad = tensor(TP_F32, b, 2, 2, 3);
  if (tp_matmul(&A, &bad, &Y) != TP_KERNEL_BAD_SHAPE)
    failures++, fprintf(stderr, "FAIL matmul accepted K mismatch\n");
}

static void test_gemm(void) {
  /* y = 2 * A^T B^T + 0.5 * c, A^T = [[1,2,3],[4,5,6]], B^T = [[7,9,11],[8,10,12]]^T */
  float at[6] = {1, 4, 2, 5, 3, 6}, bt[6] = {7, 9, 11, 8, 10, 12}, c[2] = {10, 20}, y[4];
  TpTensor A = tensor(TP_F32, at, 2, 3, 2), B = tensor(TP_F32, bt, 2, 2, 3), C = tensor(TP_F32, c, 1, 2);
  TpTensor Y = tensor(TP_F32, y, 2, 2, 2);
  tp_gemm(&A, &B, &C, true, true, 2.0, 0.5, &Y);
  check_close("gemm trans + row bias", y, (float[]){2 * 58 + 5, 2 * 64 + 10, 2 * 139 + 5, 2 * 154 + 10}, 4, 0);
  /* c [2,1] broadcast along columns, no transposes */
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12};
  TpTensor A2 = tensor(TP_F32, a, 2, 2, 3), B2 = tensor(TP_F32, b, 2, 3, 2), C2 = tensor(TP_F32, c, 2, 2, 1);
  tp_gemm(&A2, &B2, &C2, false, false, 1.0, 1.0, &Y);
  check_close("gemm column bias", y, (float[]){68, 74, 159, 174}, 4, 0);
  tp_gemm(&A2, &B2, NULL, false, false, 1.0, 1.0, &Y);
  check_close("gemm no bias", y, (float[]){58, 64, 139, 154}, 4, 0);
}

static void test_softmax(void) {
  float x[3] = {1, 2, 3}, y[3];
  double s = exp(1) + exp(2) + exp(3);
  tp_softmax_f32(x, y, 1, 3, 1, false);
  check_close("softmax", y, (float[]){exp(1) / s, exp(2) / s, exp(3) / s}, 3, 1e-6f);
  tp_softmax_f32(x, y, 1, 3, 1, true);
  check_close("logsoftmax", y, (float[]){1 - log(s), 2 - log(s), 3 - log(s)}, 3, 1e-6f);
  /* large values do not overflow */
  float big[2] = {1000, 1000};
  tp_softmax_f32(big, y, 1, 2, 1, false);
  check_close("softmax large", y, (float[]){0.5f, 0.5f}, 2, 0);
  /* a fully masked row gives zeros, a partly masked one ignores the -inf */
  float masked[4] = {-INFINITY, -INFINITY, 0, -INFINITY}, ym[4];
  tp_softmax_f32(masked, ym, 2, 2, 1, false);
  check_close("softmax -inf rows", ym, (float[]){0, 0, 1, 0}, 4, 0);
  tp_softmax_f32(masked, ym, 2, 2, 1, true);
  check_close("logsoftmax -inf rows", ym, (float[]){-INFINITY, -INFINITY, 0, -INFINITY}, 4, 0);
  /* axis 0 of [2,2]: columns */
  float c[4] = {0, 1, 0, 3}, yc[4];
  tp_softmax_f32(c, yc, 1, 2, 2, false);
  check_close("softmax strided", yc, (float[]){0.5f, 1 / (1 + exp(2)), 0.5f, exp(2) / (1 + exp(2))}, 4, 1e-6f);
}

static void test_layernorm(void) {
  float x[8] = {1, 2, 3, 4, 2, 2, 2, 2}, scale[4] = {1, 2, 1, 1}, bias[4] = {0, 0, 0, 10}, y[8], mean[2], inv[2];
  float eps = 1e-5f, r = 1 / sqrtf(1.25f + eps), r0 = 1 / sqrtf(eps);
  tp_layernorm_f32(x, scale, bias, 2, 4, eps, y, mean, inv);
  check_close("layernorm y", y, (float[]){-1.5f * r, -1.0f * r, 0.5f * r, 1.5f * r + 10, 0, 0, 0, 10}, 8, 1e-5f);
  check_close("layernorm mean", mean, (float[]){2.5f, 2}, 2, 0);
  check_close("layernorm inv_std", inv, (float[]){r, r0}, 2, 1e-2f);
  tp_layernorm_f32(x, scale, NULL, 1, 4, eps, y, NULL, NULL);
  check_close("layernorm no bias", y, (float[]){-1.5f * r, -1.0f * r, 0.5f * r, 1.5f * r}, 4, 1e-5f);
}

static void test_attention(void) {
  /* B=1, 1 head, D=1: q = [1, 2], k = [0, 1], v = [10, 20], scale 1. */
  float q[2] = {1, 2}, k[2] = {0, 1}, v[2] = {10, 20}, y[2], qk[4];
  TpAttention p = {.batch = 1,
                   .q_heads = 1,
                   .kv_heads = 1,
                   .q_len = 2,
                   .kv_len = 2,
                   .head_size = 1,
                   .v_head_size = 1,
                   .scale = 1,
                   .qk_mode = 0};
  tp_attention_f32(&p, q, k, v, NULL, NULL, y, NULL, NULL, qk, NULL);
  float p0 = 1 / (1 + expf(1)), p1 = 1 / (1 + expf(2)); /* weight of key 0 per query */
  check_close("attention", y, (float[]){10 * p0 + 20 * (1 - p0), 10 * p1 + 20 * (1 - p1)}, 2, 1e-5f);
  check_close("attention qk mode 0", qk, (float[]){0, 1, 0, 2}, 4, 0);

  p.is_causal = true; /* query 0 sees key 0 only */
  p.qk_mode = 3;
  tp_attention_f32(&p, q, k, v, NULL, NULL, y, NULL, NULL, qk, NULL);
  check_close("attention causal", y, (float[]){10, 10 * p1 + 20 * (1 - p1)}, 2, 1e-5f);
  check_close("attention qk mode 3", qk, (float[]){1, 0, p1, 1 - p1}, 4, 1e-6f);

  /* bool mask [2,2] (true = attend) and softcap 1: s = tanh(q k) */
  unsigned char mask[4] = {0, 1, 1, 1};
  TpAttention pm = p;
  pm.is_causal = false;
  pm.softcap = 1;
  pm.mask = mask;
  pm.mask_is_bool = true;
  pm.mask_strides[2] = 2, pm.mask_strides[3] = 1, pm.mask_len = 2;
  pm.qk_mode = 2;
  tp_attention_f32(&pm, q, k, v, NULL, NULL, y, NULL, NULL, qk, NULL);
  float t2 = 1 / (1 + expf(tanhf(2)));
  check_close("attention bool mask + softcap", y, (float[]){20, 10 * t2 + 20 * (1 - t2)}, 2, 1e-5f);
  check_close("attention qk mode 2", qk, (float[]){-INFINITY, tanhf(1), 0, tanhf(2)}, 4, 1e-6f);

  /* float mask [1,2] broadcast over queries; mask_len 1 < total masks key 1 out */
  float fmask[1] = {5};
  TpAttention pf = p;
  pf.is_causal = false, pf.qk_mode = 0;
  pf.mask = fmask, pf.mask_strides[3] = 1, pf.mask_len = 1;
  tp_attention_f32(&pf, q, k, v, NULL, NULL, y, NULL, NULL, NULL, NULL);
  check_close("attention short float mask", y, (float[]){10, 10}, 2, 0);

  /* past: one cached key/value, one new query with causal: sees both */
  float pk[1] = {1}, pv[1] = {30}, kk[1] = {0}, vv[1] = {40}, qq[1] = {1}, pres_k[2], pres_v[2];
  TpAttention pp = {.batch = 1,
                    .q_heads = 1,
                    .kv_heads = 1,
                    .q_len = 1,
                    .kv_len = 1,
                    .past_len = 1,
                    .head_size = 1,
                    .v_head_size = 1,
                    .scale = 1,
                    .is_causal = true};
  tp_attention_f32(&pp, qq, kk, vv, pk, pv, y, pres_k, pres_v, NULL, NULL);
  float w = 1 / (1 + expf(-1)); /* weight of the past key (score 1 vs 0) */
  check_close("attention past", y, (float[]){30 * w + 40 * (1 - w)}, 1, 1e-5f);
  check_close("attention present_k", pres_k, (float[]){1, 0}, 2, 0);
  check_close("attention present_v", pres_v, (float[]){30, 40}, 2, 0);

  /* GQA in the packed layout: 4 q heads share 2 kv heads (heads 0,1 -> kv 0; 2,3 -> kv 1).
   * One key per head, so each output is that kv head's value. */
  float q4[4] = {1, 1, 1, 1}, k2[2] = {1, 1}, v2[2] = {7, 9}, y4[4];
  TpAttention pg = {.batch = 1,
                    .q_heads = 4,
                    .kv_heads = 2,
                    .q_len = 1,
                    .kv_len = 1,
                    .head_size = 1,
                    .v_head_size = 1,
                    .scale = 1,
                    .packed = true};
  tp_attention_f32(&pg, q4, k2, v2, NULL, NULL, y4, NULL, NULL, NULL, NULL);
  check_close("attention gqa", y4, (float[]){7, 7, 9, 9}, 4, 0);

  /* Packed [B,S,H*D] equals 4-D [B,H,S,D] after transposing: H=2, S=2, D=2, kv S=3. */
  float q3[8], k3[12], v3[12], q4d[8], k4d[12], v4d[12], ya[8], yb[8];
  for (int i = 0; i < 12; i++) k3[i] = sinf((float)i), v3[i] = cosf((float)i * 0.7f);
  for (int i = 0; i < 8; i++) q3[i] = 0.3f * (float)i - 1;
  for (int s = 0; s < 3; s++)
    for (int h = 0; h < 2; h++)
      for (int d = 0; d < 2; d++) {
        k4d[(h * 3 + s) * 2 + d] = k3[(s * 2 + h) * 2 + d];
        v4d[(h * 3 + s) * 2 + d] = v3[(s * 2 + h) * 2 + d];
        if (s < 2) q4d[(h * 2 + s) * 2 + d] = q3[(s * 2 + h) * 2 + d];
      }
  TpAttention pa = {.batch = 1,
                    .q_heads = 2,
                    .kv_heads = 2,
                    .q_len = 2,
                    .kv_len = 3,
                    .head_size = 2,
                    .v_head_size = 2,
                    .scale = 0.5f,
                    .packed = true};
  tp_attention_f32(&pa, q3, k3, v3, NULL, NULL, ya, NULL, NULL, NULL, NULL);
  pa.packed = false;
  tp_attention_f32(&pa, q4d, k4d, v4d, NULL, NULL, yb, NULL, NULL, NULL, NULL);
  float yt[8];
  for (int s = 0; s < 2; s++)
    for (int h = 0; h < 2; h++)
      for (int d = 0; d < 2; d++) yt[(s * 2 + h) * 2 + d] = yb[(h * 2 + s) * 2 + d];
  check_close("attention packed == 4-D", ya, yt, 8, 1e-6f);
}

static void test_loss(void) {
  /* N=2, C=3: log-probabilities; targets 0 and 2; weights 1,2,3. */
  float logp[6] = {-0.5f, -1, -2, -3, -0.25f, -0.75f}, loss[2];
  int64_t target[2] = {0, 2};
  float weight[3] = {1, 2, 3};
  int64_t at = -1; /* where a kernel reports a bad target */
  TpLossOptions o = {.reduction = TP_REDUCE_NONE};
  tp_nll_loss_f32(logp, target, 2, 3, 1, &o, loss, &at);
  check_close("nll none", loss, (float[]){0.5f, 0.75f}, 2, 0);
  o.reduction = TP_REDUCE_MEAN;
  o.weight = weight;
  tp_nll_loss_f32(logp, target, 2, 3, 1, &o, loss, &at);
  check_close("nll weighted mean", loss, (float[]){(0.5f + 3 * 0.75f) / 4}, 1, 1e-6f);
  o.has_ignore = true, o.ignore_index = 2; /* the ignored target leaves the denominator too */
  tp_nll_loss_f32(logp, target, 2, 3, 1, &o, loss, &at);
  check_close("nll ignore mean", loss, (float[]){0.5f}, 1, 0);
  o.reduction = TP_REDUCE_SUM, o.weight = NULL, o.has_ignore = false;
  tp_nll_loss_f32(logp, target, 2, 3, 1, &o, loss, &at);
  check_close("nll sum", loss, (float[]){1.25f}, 1, 0);
  int64_t bad[2] = {0, 3};
  if (tp_nll_loss_f32(logp, bad, 2, 3, 1, &o, loss, &at) != TP_KERNEL_BAD_INDEX || at != 1)
    failures++, fprintf(stderr, "FAIL nll bad target\n");

  /* SCE over [N=1, C=4, D=2] of zeros: log_prob = -log 4 everywhere, mean loss log 4. */
  float scores[8] = {0}, lp[8], l1[1];
  int64_t t2[2] = {1, 3};
  TpLossOptions so = {.reduction = TP_REDUCE_MEAN};
  tp_softmax_cross_entropy_f32(scores, t2, 1, 4, 2, &so, lp, l1, &at);
  float lq = -logf(4);
  check_close("sce log_prob", lp, (float[]){lq, lq, lq, lq, lq, lq, lq, lq}, 8, 1e-6f);
  check_close("sce mean", l1, (float[]){logf(4)}, 1, 1e-6f);
}

int main(void) {
  test_matmul();
  test_gemm();
  test_softmax();
  test_layernorm();
  test_attention();
  test_loss();
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("nn kernels: all checks passed\n");
  return 0;
}
