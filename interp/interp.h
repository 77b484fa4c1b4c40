/* The reference interpreter: executes an IR module forward on the CPU with the runtime's
 * kernels (runtime/cpu), one kernel per op. Also used by constant folding. */
#ifndef TOKPIPE_INTERP_H
#define TOKPIPE_INTERP_H

#include "../ir/ir.h"
#include "../runtime/cpu/nn.h"

/* Runs op `op` of m. in[i] views operand i (data NULL when absent); out[i] views result i
 * with its data already allocated from the result type (data NULL when absent). Returns
 * TP_OK, or reports an error at the op's origin (e.g. an index out of range). */
int tp_exec_op(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);

/* Runs the whole module. inputs[i] holds graph input i (dtype and shape must match its
 * type). outputs[i] receives graph output i in a malloc'ed buffer the caller frees. */
int tp_interp_run(const TpModule *m, const TpTensor *inputs, TpTensor *outputs, TpDiag *d);

/* One exec function per group of ops; the table in interp.c maps each op to one.
 * interp/exec_basic.c: */
typedef int (*TpExecFn)(const TpModule *m, int op, const TpTensor *in, TpTensor *out,
                        TpDiag *d);
int tp_exec_unary(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_binary(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_where(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_cast(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_gather(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_tile(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_cumsum(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_reshape(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_expand(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_transpose(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_split(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_slice(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_concat(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_trilu(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_reduce(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
/* interp/exec_nn.c: */
int tp_exec_matmul(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_gemm(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_softmax(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_layernorm(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_attention(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
/* The kernel parameters of an Attention or AttentionBackward op over Q, K and V (heads,
 * lengths, head sizes, causality, scale, softcap; no mask or past), shapes checked. */
int tp_attention_params(const TpModule *m, int op, const TpTensor *Q, const TpTensor *K,
                        const TpTensor *V, TpAttention *p, TpDiag *d);
int tp_exec_loss(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
/* interp/exec_train.c (raised forward ops and backward ops): */
int tp_exec_linear(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_embedding(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_cross_entropy(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_linear_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_matmul_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_gather_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_slice_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_layernorm_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out,
                               TpDiag *d);
int tp_exec_gelu_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_softmax_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_attention_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out,
                               TpDiag *d);
int tp_exec_cross_entropy_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out,
                                   TpDiag *d);
int tp_exec_rmsnorm(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_rmsnorm_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_rotary(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d); /* and RotaryBackward */
int tp_exec_swiglu(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);
int tp_exec_swiglu_backward(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);

#endif
