/* The targets' kernel tables (target.h). cpu: the kernels of runtime/cpu, called on host
 * pointers with the generated function's TpTensor views. */
#include "target.h"

#include <stdio.h>
#include <string.h>

enum { H_ELEMENTWISE, H_LAYOUT, H_REDUCE, H_MATMUL, H_NN, H_LOSS, H_TRANSFORMER, H_NN_BACKWARD, H_LAYOUT_BACKWARD };
static const char *const cpu_headers[] = {
    [H_ELEMENTWISE] = "cpu/elementwise.h", [H_LAYOUT] = "cpu/layout.h",
    [H_REDUCE] = "cpu/reduce.h",           [H_MATMUL] = "cpu/matmul.h",
    [H_NN] = "cpu/nn.h",                   [H_LOSS] = "cpu/loss.h",
    [H_TRANSFORMER] = "cpu/transformer.h", [H_NN_BACKWARD] = "cpu/nn_backward.h",
    [H_LAYOUT_BACKWARD] = "cpu/layout_backward.h",
};

/* An argument printed from field f of union member u (of TpBound.a). */
#define A(kind, u, f) {TP_ARG_##kind, offsetof(TpBound, a.u.f), 0}
#define A2(kind, u, f, g) {TP_ARG_##kind, offsetof(TpBound, a.u.f), offsetof(TpBound, a.u.g)}
#define BAD {TP_ARG_BAD, 0, 0}
#define N(...) (int)(sizeof((TpArgSpelling[]){__VA_ARGS__}) / sizeof(TpArgSpelling)), {__VA_ARGS__}

static const TpKernelSpelling cpu_kernels[TP_K_COUNT] = {
    [TP_K_UNARY] = {"tp_unary", H_ELEMENTWISE, N(A(UNARY_OP, unary, op), A(VIEW, unary, x), A(VIEW, unary, y))},
    [TP_K_BINARY] = {"tp_binary", H_ELEMENTWISE,
                     N(A(BINARY_OP, binary, op), A(VIEW, binary, a), A(VIEW, binary, b), A(VIEW, binary, y))},
    [TP_K_WHERE] = {"tp_where", H_ELEMENTWISE,
                    N(A(VIEW, where, cond), A(VIEW, where, a), A(VIEW, where, b), A(VIEW, where, y))},
    [TP_K_CAST] = {"tp_cast", H_ELEMENTWISE, N(A(VIEW, cast, x), A(VIEW, cast, y))},
    [TP_K_MATMUL] = {"tp_matmul", H_MATMUL, N(A(VIEW, matmul, a), A(VIEW, matmul, b), A(VIEW, matmul, y))},
    [TP_K_GEMM] = {"tp_gemm", H_MATMUL,
                   N(A(VIEW, gemm, a), A(VIEW, gemm, b), A(VIEW, gemm, c), A(BOOL, gemm, trans_a),
                     A(BOOL, gemm, trans_b), A(F64, gemm, alpha), A(F64, gemm, beta), A(VIEW, gemm, y))},
    [TP_K_GATHER] = {"tp_gather", H_LAYOUT,
                     N(A(VIEW, gather, data), A(VIEW, gather, indices), A(INT, gather, axis), A(VIEW, gather, y), BAD)},
    [TP_K_GATHER_ELEMENTS] = {"tp_gather_elements", H_LAYOUT,
                              N(A(VIEW, gather_elements, data), A(VIEW, gather_elements, indices),
                                A(INT, gather_elements, axis), A(VIEW, gather_elements, y), BAD)},
    [TP_K_TILE] = {"tp_tile", H_LAYOUT, N(A(VIEW, tile, x), A(VIEW, tile, y))},
    [TP_K_CUMSUM] = {"tp_cumsum", H_REDUCE,
                     N(A(VIEW, cumsum, x), A(INT, cumsum, axis), A(BOOL, cumsum, exclusive), A(BOOL, cumsum, reverse),
                       A(VIEW, cumsum, y))},
    [TP_K_RESHAPE] = {"tp_reshape", H_LAYOUT, N(A(VIEW, reshape, x), A(VIEW, reshape, y))},
    [TP_K_EXPAND] = {"tp_expand", H_LAYOUT, N(A(VIEW, expand, x), A(VIEW, expand, y))},
    [TP_K_TRANSPOSE] = {"tp_transpose", H_LAYOUT,
                        N(A(VIEW, transpose, x), A2(I64S, transpose, perm, nperm), A(VIEW, transpose, y))},
    [TP_K_SPLIT] = {"tp_split", H_LAYOUT,
                    N(A(VIEW, split, x), A(INT, split, axis), A2(VIEWS_OUT, split, ys, n), A(INT, split, n))},
    [TP_K_SLICE] = {"tp_slice", H_LAYOUT,
                    N(A(VIEW, slice, x), A2(I64S, slice, starts, rank), A2(I64S, slice, steps, rank),
                      A(VIEW, slice, y))},
    [TP_K_CONCAT] = {"tp_concat", H_LAYOUT,
                     N(A2(VIEWS_IN, concat, xs, n), A(INT, concat, n), A(INT, concat, axis), A(VIEW, concat, y))},
    [TP_K_CONTEXT_APPEND] = {"tp_context_append", H_LAYOUT,
                             N(A(VIEW, context_append, x), A(INT, context_append, axis), A(I64, context_append, at),
                               A(I64, context_append, rows), A(DATA, context_append, buffer))},
    [TP_K_TRILU] = {"tp_trilu", H_LAYOUT,
                    N(A(VIEW, trilu, x), A(BOOL, trilu, upper), A(I64, trilu, k), A(VIEW, trilu, y))},
    [TP_K_REDUCE_SUM] = {"tp_reduce_sum", H_REDUCE,
                         N(A(VIEW, reduce_sum, x), A2(I64S, reduce_sum, axes, naxes), A(INT, reduce_sum, naxes),
                           A(BOOL, reduce_sum, mean), A(VIEW, reduce_sum, y))},
    [TP_K_SOFTMAX] = {"tp_softmax_f32", H_NN,
                      N(A(DATA, softmax, x), A(DATA, softmax, y), A(I64, softmax, outer), A(I64, softmax, n),
                        A(I64, softmax, inner), A(BOOL, softmax, log))},
    [TP_K_LAYERNORM] = {"tp_layernorm_f32", H_NN,
                        N(A(DATA, layernorm, x), A(DATA, layernorm, scale), A(DATA, layernorm, bias),
                          A(I64, layernorm, outer), A(I64, layernorm, n), A(F32, layernorm, eps), A(DATA, layernorm, y),
                          A(DATA, layernorm, mean), A(DATA, layernorm, inv_std))},
    [TP_K_ATTENTION] = {"tp_attention_f32", H_NN,
                        N(A2(ATTENTION, attention, p, mask), A(DATA, attention, q), A(DATA, attention, k),
                          A(DATA, attention, v), A(DATA, attention, past_k), A(DATA, attention, past_v),
                          A(DATA, attention, y), A(DATA, attention, present_k), A(DATA, attention, present_v),
                          A(DATA, attention, qk_out))},
    [TP_K_NLL_LOSS] = {"tp_nll_loss_f32", H_LOSS,
                       N(A(DATA, nll_loss, x), A(DATA, nll_loss, target), A(I64, nll_loss, N), A(I64, nll_loss, C),
                         A(I64, nll_loss, D), A2(LOSS, nll_loss, o, weight), A(DATA, nll_loss, loss), BAD)},
    [TP_K_SOFTMAX_CROSS_ENTROPY] = {"tp_softmax_cross_entropy_f32", H_LOSS,
                                    N(A(DATA, nll_loss, x), A(DATA, nll_loss, target), A(I64, nll_loss, N),
                                      A(I64, nll_loss, C), A(I64, nll_loss, D), A2(LOSS, nll_loss, o, weight),
                                      A(SCRATCH, nll_loss, log_prob), A(DATA, nll_loss, loss), BAD)},
    [TP_K_LINEAR] = {"tp_linear_f32", H_TRANSFORMER,
                     N(A(DATA, linear, x), A(DATA, linear, w), A(DATA, linear, bias), A(I64, linear, M),
                       A(I64, linear, K), A(I64, linear, N), A(BOOL, linear, transpose_w), A(DATA, linear, y))},
    [TP_K_EMBEDDING] = {"tp_embedding_f32", H_TRANSFORMER,
                        N(A(DATA, embedding, table), A(DATA, embedding, ids), A(I64, embedding, n),
                          A(I64, embedding, V), A(I64, embedding, C), A(DATA, embedding, y), BAD)},
    [TP_K_CROSS_ENTROPY] = {"tp_cross_entropy_f32", H_TRANSFORMER,
                            N(A(DATA, cross_entropy, logits), A(DATA, cross_entropy, targets),
                              A(I64, cross_entropy, R), A(I64, cross_entropy, V), A(F32, cross_entropy, denominator),
                              A(DATA, cross_entropy, y), BAD)},
    [TP_K_RMSNORM] = {"tp_rmsnorm_f32", H_TRANSFORMER,
                      N(A(DATA, rmsnorm, x), A(DATA, rmsnorm, scale), A(I64, rmsnorm, rows), A(I64, rmsnorm, n),
                        A(F32, rmsnorm, eps), A(DATA, rmsnorm, y))},
    [TP_K_ROTARY] = {"tp_rotary_f32", H_TRANSFORMER,
                     N(A(DATA, rotary, x), A(DATA, rotary, cos), A(DATA, rotary, sin), A(RANK, rotary, x),
                       A(DIMS, rotary, x), A(DIMS, rotary, cos), A(I64, rotary, rotary_dim),
                       A(BOOL, rotary, interleaved), A(DATA, rotary, y))},
    [TP_K_SWIGLU] = {"tp_swiglu_f32", H_TRANSFORMER,
                     N(A(DATA, swiglu, gate), A(DATA, swiglu, up), A(I64, swiglu, n), A(DATA, swiglu, y))},
    [TP_K_LINEAR_BACKWARD] = {"tp_linear_backward_f32", H_NN_BACKWARD,
                              N(A(DATA, linear, dy), A(DATA, linear, x), A(DATA, linear, w), A(I64, linear, M),
                                A(I64, linear, K), A(I64, linear, N), A(BOOL, linear, transpose_w),
                                A(DATA, linear, y), A(DATA, linear, dw), A(DATA, linear, dbias))},
    [TP_K_MATMUL_BACKWARD] = {"tp_matmul_backward_f32", H_NN_BACKWARD,
                              N(A(VIEW, matmul_backward, dy), A(VIEW, matmul_backward, a),
                                A(VIEW, matmul_backward, b), A(VIEW, matmul_backward, da),
                                A(VIEW, matmul_backward, db))},
    [TP_K_GATHER_BACKWARD] = {"tp_gather_backward", H_LAYOUT_BACKWARD,
                              N(A(VIEW, gather, data), A(VIEW, gather, indices), A(INT, gather, axis),
                                A(VIEW, gather, y), BAD)},
    [TP_K_GATHER_ELEMENTS_BACKWARD] = {"tp_gather_elements_backward", H_LAYOUT_BACKWARD,
                                       N(A(VIEW, gather, data), A(VIEW, gather, indices), A(INT, gather, axis),
                                         A(VIEW, gather, y), BAD)},
    [TP_K_SLICE_BACKWARD] = {"tp_slice_backward", H_LAYOUT_BACKWARD,
                             N(A(VIEW, slice, x), A2(I64S, slice, starts, rank), A2(I64S, slice, steps, rank),
                               A(VIEW, slice, y))},
    [TP_K_LAYERNORM_BACKWARD] = {"tp_layernorm_backward_f32", H_NN_BACKWARD,
                                 N(A(DATA, layernorm_backward, dy), A(DATA, layernorm_backward, x),
                                   A(DATA, layernorm_backward, scale), A(DATA, layernorm_backward, mean),
                                   A(DATA, layernorm_backward, inv_std), A(I64, layernorm_backward, rows),
                                   A(I64, layernorm_backward, n), A(DATA, layernorm_backward, dx),
                                   A(DATA, layernorm_backward, dscale), A(DATA, layernorm_backward, dbias))},
    [TP_K_GELU_BACKWARD] = {"tp_gelu_backward_f32", H_NN_BACKWARD,
                            N(A(DATA, gelu_backward, dy), A(DATA, gelu_backward, x), A(I64, gelu_backward, n),
                              A(BOOL, gelu_backward, tanh_approx), A(DATA, gelu_backward, dx))},
    [TP_K_SOFTMAX_BACKWARD] = {"tp_softmax_backward_f32", H_NN_BACKWARD,
                               N(A(DATA, softmax, x), A(DATA, softmax, dy), A(I64, softmax, outer), A(I64, softmax, n),
                                 A(I64, softmax, inner), A(BOOL, softmax, log), A(DATA, softmax, y))},
    [TP_K_ATTENTION_BACKWARD] = {"tp_attention_backward_f32", H_NN_BACKWARD,
                                 N(A2(ATTENTION, attention, p, mask), A(DATA, attention, dy), A(DATA, attention, q),
                                   A(DATA, attention, k), A(DATA, attention, v), A(DATA, attention, y),
                                   A(DATA, attention, present_k), A(DATA, attention, present_v))},
    [TP_K_CROSS_ENTROPY_BACKWARD] = {"tp_cross_entropy_backward_f32", H_NN_BACKWARD,
                                     N(A(SCALAR, cross_entropy, dloss), A(DATA, cross_entropy, logits),
                                       A(DATA, cross_entropy, targets), A(I64, cross_entropy, R),
                                       A(I64, cross_entropy, V), A(F32, cross_entropy, denominator),
                                       A(DATA, cross_entropy, y), BAD)},
    [TP_K_RMSNORM_BACKWARD] = {"tp_rmsnorm_backward_f32", H_TRANSFORMER,
                               N(A(DATA, rmsnorm, dy), A(DATA, rmsnorm, x), A(DATA, rmsnorm, scale),
                                 A(I64, rmsnorm, rows), A(I64, rmsnorm, n), A(F32, rmsnorm, eps), A(DATA, rmsnorm, y),
                                 A(DATA, rmsnorm, dscale))},
    [TP_K_ROTARY_BACKWARD] = {"tp_rotary_backward_f32", H_TRANSFORMER,
                              N(A(DATA, rotary, x), A(DATA, rotary, cos), A(DATA, rotary, sin), A(RANK, rotary, x),
                                A(DIMS, rotary, x), A(DIMS, rotary, cos), A(I64, rotary, rotary_dim),
                                A(BOOL, rotary, interleaved), A(DATA, rotary, y))},
    [TP_K_SWIGLU_BACKWARD] = {"tp_swiglu_backward_f32", H_TRANSFORMER,
                              N(A(DATA, swiglu, dy), A(DATA, swiglu, gate), A(DATA, swiglu, up), A(I64, swiglu, n),
                                A(DATA, swiglu, y), A(DATA, swiglu, dup))},
};

static const TpTarget targets[] = {
    {"cpu", cpu_headers, (int)(sizeof cpu_headers / sizeof *cpu_headers), cpu_kernels},
};

const TpTarget *tp_target_find(const char *name) {
  for (size_t i = 0; i < sizeof targets / sizeof *targets; i++)
    if (strcmp(targets[i].name, name) == 0) return &targets[i];
  return NULL;
}

const char *tp_target_names(void) {
  static char names[256];
  if (!names[0])
    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++)
      snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", targets[i].name);
  return names;
}
