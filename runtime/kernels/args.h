/* The target-neutral kernel interface: the ops' enums and options, and one argument struct
 * per kernel. The interpreter and the generated plans bind these once per op (bind/bind.c)
 * and pass them to the CPU kernels (runtime/cpu) or the CUDA ones (runtime/cuda); each
 * kernel's row of kernels.def says how each field is passed. Tensors are views (the f32
 * kernels read their data). */
#ifndef TOKPIPE_KERNELS_ARGS_H
#define TOKPIPE_KERNELS_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus /* the CUDA kernels: C declarations */
extern "C" {
#endif
#include "../../base/tensor.h"
#include "attention.h"
#include "status.h"

/* ---- ops and options ---- */
typedef enum {
  TP_UNARY_SQRT,
  TP_UNARY_NEG,
  TP_UNARY_RECIPROCAL,
  TP_UNARY_EXP,
  TP_UNARY_LOG,
  TP_UNARY_ERF,
  TP_UNARY_TANH,
  TP_UNARY_RELU,
  TP_UNARY_SIGMOID,
  TP_UNARY_SIN,
  TP_UNARY_COS,
  TP_UNARY_NOT,       /* bool only */
  TP_UNARY_GELU,      /* x * Phi(x) */
  TP_UNARY_GELU_TANH, /* tanh approximation */
} TpUnaryOp;

typedef enum {
  TP_BINARY_ADD,
  TP_BINARY_SUB,
  TP_BINARY_MUL,
  TP_BINARY_DIV, /* integers truncate toward zero; x/0 gives 0 */
  TP_BINARY_POW, /* result dtype = base dtype; exponent any numeric dtype */
  TP_BINARY_MAX, /* NaN propagates */
  TP_BINARY_MIN,
  TP_BINARY_AND, /* bool */
  TP_BINARY_EQUAL,
  TP_BINARY_LESS,
  TP_BINARY_LESS_EQUAL,
  TP_BINARY_GREATER,
  TP_BINARY_GREATER_EQUAL,
} TpBinaryOp;

typedef enum { TP_REDUCE_NONE, TP_REDUCE_SUM, TP_REDUCE_MEAN } TpReduction;

/* How targets are weighted: weight[C] (NULL: all 1) and an optional ignored class. */
typedef struct {
  const float *weight;
  bool has_ignore;
  int64_t ignore_index;
  TpReduction reduction;
} TpLossOptions;

/* ---- elementwise ---- */
typedef struct {
  TpUnaryOp op;
  const TpTensor *x;
  TpTensor *y;
} TpUnaryArgs;

typedef struct {
  TpBinaryOp op;
  const TpTensor *a, *b;
  TpTensor *y;
} TpBinaryArgs;

typedef struct {
  const TpTensor *cond, *a, *b;
  TpTensor *y;
} TpWhereArgs;

/* One operand, one result, nothing else: Cast, Reshape, Expand and Tile. */
typedef struct {
  const TpTensor *x;
  TpTensor *y;
} TpCopyArgs;

/* ---- layout ---- */
/* Gather, GatherElements and their backward ops (data is dy, y ddata). */
typedef struct {
  const TpTensor *data, *indices;
  int axis;
  int64_t padding_idx; /* GatherBackward: the index that adds nothing (-1: none) */
  TpTensor *y;
  int64_t *bad;
} TpGatherArgs;

typedef struct {
  const TpTensor *x;
  const int64_t *perm;
  int nperm; /* printed, not passed: perm's length */
  TpTensor *y;
} TpTransposeArgs;

typedef struct {
  const TpTensor *x;
  int axis;
  TpTensor *ys;
  int n;
} TpSplitArgs;

/* Slice and its backward (x is dy, y dx). */
typedef struct {
  const TpTensor *x;
  const int64_t *starts, *steps;
  int rank; /* printed, not passed: the length of starts and steps */
  TpTensor *y;
} TpSliceArgs;

typedef struct {
  const TpTensor *xs;
  int n, axis;
  TpTensor *y;
} TpConcatArgs;

typedef struct {
  const TpTensor *x;
  int axis;
  int64_t at, rows;
  TpTensor *buffer; /* its data */
} TpContextAppendArgs;

typedef struct {
  const TpTensor *x;
  bool upper;
  int64_t k;
  TpTensor *y;
} TpTriluArgs;

/* ---- reduce ---- */
typedef struct {
  const TpTensor *x;
  const int64_t *axes;
  int naxes;
  bool mean;
  TpTensor *y;
} TpReduceArgs;

typedef struct {
  const TpTensor *x;
  int axis;
  bool exclusive, reverse;
  TpTensor *y;
} TpCumsumArgs;

typedef struct {
  const TpTensor *x;
  int axis;
  TpTensor *y;
} TpTopkArgs;

/* ---- matmul ---- */
typedef struct {
  const TpTensor *a, *b;
  TpTensor *y;
} TpMatmulArgs;

typedef struct {
  const TpTensor *a, *b, *c;
  bool trans_a, trans_b;
  double alpha, beta;
  TpTensor *y;
} TpGemmArgs;

/* ---- nn ---- */
/* Softmax and LogSoftmax, and their backward (x is dy, dy is y, y is dx). */
typedef struct {
  const TpTensor *x, *dy;
  TpTensor *y;
  int64_t outer, n, inner;
  bool log;
} TpSoftmaxArgs;

typedef struct {
  const TpTensor *x, *scale, *bias;
  int64_t outer, n;
  float eps;
  TpTensor *y, *mean, *inv_std;
} TpLayerNormArgs;

/* Attention and its backward (dy, then q, k, v, and the forward's saved_y and saved_lse;
 * dq, dk, dv as y, present_k, present_v). p.mask is mask's data (p describes its shape). */
typedef struct {
  TpAttention p;
  const TpTensor *dy, *q, *k, *v, *mask, *past_k, *past_v, *saved_y, *saved_lse;
  TpTensor *y, *present_k, *present_v, *qk_out, *lse;
} TpAttentionArgs;

/* ---- loss ---- */
/* NegativeLogLikelihoodLoss (x the log-probabilities) and SoftmaxCrossEntropyLoss (x the
 * scores; log_prob where the log-probabilities go, NULL: a scratch of the kernel's). o.weight
 * is the data of `weight`. */
typedef struct {
  const TpTensor *x, *target; /* target i64 */
  int64_t N, C, D;
  TpLossOptions o;
  const TpTensor *weight;
  TpTensor *log_prob, *loss;
  int64_t *bad;
} TpLossArgs;

/* ---- transformer ---- */
/* Linear, and its backward (dy first; dx, dw, dbias as y, dw, dbias). pre: the Gelu's
 * operand where a device plan runs Linear and the Gelu after it as one product (written
 * by LINEAR_GELU, read by LINEAR_BACKWARD_DGELU); NULL otherwise. */
typedef struct {
  const TpTensor *dy, *x, *w, *bias;
  int64_t M, K, N;
  bool transpose_w;
  TpTensor *y, *dw, *dbias, *pre;
} TpLinearArgs;

typedef struct {
  const TpTensor *table, *ids; /* ids i64 */
  int64_t n, V, C;
  TpTensor *y;
  int64_t *bad;
} TpEmbeddingArgs;

/* CrossEntropy, and its backward (dloss the scalar gradient, y dlogits); pad the padded
 * classes at the end of each row (ir/ops.def's vocab_pad; 0: none). */
typedef struct {
  const TpTensor *dloss, *logits, *targets; /* targets i64 */
  int64_t R, V, pad;
  float denominator;
  TpTensor *y;
  int64_t *bad;
} TpCrossEntropyArgs;

/* The vocabulary-parallel kernels: x the table, dY or logits; ids the ids or targets (i64);
 * n the ids' or rows' count; V the range's classes; pad the padded classes at the end of
 * the last range (ir/ops.def's vocab_pad); y the result. */
typedef struct {
  const TpTensor *dloss, *x, *ids, *stats, *part;
  int64_t n, V, parts, C, pad;
  float denominator;
  TpTensor *y;
  int64_t *bad;
} TpVocabArgs;

/* RMSNorm and its backward (dy first; dx and dscale as y and dscale). */
typedef struct {
  const TpTensor *dy, *x, *scale;
  int64_t rows, n;
  float eps;
  TpTensor *y, *dscale;
} TpRMSNormArgs;

/* Rotary and its backward (x is dy, y dx). */
typedef struct {
  const TpTensor *x, *cos, *sin;
  int64_t rotary_dim;
  bool interleaved;
  TpTensor *y;
} TpRotaryArgs;

/* SwiGLU and its backward (dy first; dgate and dup as y and dup). */
typedef struct {
  const TpTensor *dy, *gate, *up;
  int64_t n;
  TpTensor *y, *dup;
} TpSwiGLUArgs;

/* GeGLU and its backward (dy first; dgate and dup as y and dup). */
typedef struct {
  const TpTensor *dy, *gate, *up;
  int64_t n;
  bool tanh_approx;
  TpTensor *y, *dup;
} TpGeGLUArgs;

/* ---- nn_backward ---- */
/* dy, then a, b; da, db (either may be NULL). */
typedef struct {
  const TpTensor *dy, *a, *b;
  TpTensor *da, *db;
} TpMatmulBackwardArgs;

typedef struct {
  const TpTensor *dy, *x, *scale, *mean, *inv_std;
  int64_t rows, n;
  TpTensor *dx, *dscale, *dbias;
} TpLayerNormBackwardArgs;

typedef struct {
  const TpTensor *dy, *x;
  int64_t n;
  bool tanh_approx;
  TpTensor *dx;
} TpGeluBackwardArgs;

#ifdef __cplusplus
}
#endif

#endif
