#include "interp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Each IR op's one implementation. */
static const TpExecFn exec_table[TP_OP_COUNT] = {
    [TP_OP_Add] = tp_exec_binary,
    [TP_OP_Sub] = tp_exec_binary,
    [TP_OP_Mul] = tp_exec_binary,
    [TP_OP_Div] = tp_exec_binary,
    [TP_OP_Pow] = tp_exec_binary,
    [TP_OP_Max] = tp_exec_binary,
    [TP_OP_Min] = tp_exec_binary,
    [TP_OP_And] = tp_exec_binary,
    [TP_OP_Equal] = tp_exec_binary,
    [TP_OP_Less] = tp_exec_binary,
    [TP_OP_LessOrEqual] = tp_exec_binary,
    [TP_OP_Greater] = tp_exec_binary,
    [TP_OP_GreaterOrEqual] = tp_exec_binary,
    [TP_OP_Sqrt] = tp_exec_unary,
    [TP_OP_Neg] = tp_exec_unary,
    [TP_OP_Reciprocal] = tp_exec_unary,
    [TP_OP_Exp] = tp_exec_unary,
    [TP_OP_Log] = tp_exec_unary,
    [TP_OP_Erf] = tp_exec_unary,
    [TP_OP_Tanh] = tp_exec_unary,
    [TP_OP_Relu] = tp_exec_unary,
    [TP_OP_Sigmoid] = tp_exec_unary,
    [TP_OP_Sin] = tp_exec_unary,
    [TP_OP_Cos] = tp_exec_unary,
    [TP_OP_Not] = tp_exec_unary,
    [TP_OP_Gelu] = tp_exec_unary,
    [TP_OP_Where] = tp_exec_where,
    [TP_OP_Cast] = tp_exec_cast,
    [TP_OP_MatMul] = tp_exec_matmul,
    [TP_OP_Gemm] = tp_exec_gemm,
    [TP_OP_Gather] = tp_exec_gather,
    [TP_OP_GatherElements] = tp_exec_gather,
    [TP_OP_Tile] = tp_exec_tile,
    [TP_OP_CumSum] = tp_exec_cumsum,
    [TP_OP_Reshape] = tp_exec_reshape,
    [TP_OP_Expand] = tp_exec_expand,
    [TP_OP_Transpose] = tp_exec_transpose,
    [TP_OP_Split] = tp_exec_split,
    [TP_OP_Slice] = tp_exec_slice,
    [TP_OP_Concat] = tp_exec_concat,
    [TP_OP_Trilu] = tp_exec_trilu,
    [TP_OP_Softmax] = tp_exec_softmax,
    [TP_OP_LogSoftmax] = tp_exec_softmax,
    [TP_OP_ReduceMean] = tp_exec_reduce,
    [TP_OP_ReduceSum] = tp_exec_reduce,
    [TP_OP_LayerNorm] = tp_exec_layernorm,
    [TP_OP_Attention] = tp_exec_attention,
    [TP_OP_SoftmaxCrossEntropyLoss] = tp_exec_loss,
    [TP_OP_NegativeLogLikelihoodLoss] = tp_exec_loss,
    [TP_OP_Linear] = tp_exec_linear,
    [TP_OP_Embedding] = tp_exec_embedding,
    [TP_OP_CrossEntropy] = tp_exec_cross_entropy,
    [TP_OP_LinearBackward] = tp_exec_linear_backward,
    [TP_OP_MatMulBackward] = tp_exec_matmul_backward,
    [TP_OP_GatherBackward] = tp_exec_gather_backward,
    [TP_OP_GatherElementsBackward] = tp_exec_gather_backward,
    [TP_OP_SliceBackward] = tp_exec_slice_backward,
    [TP_OP_LayerNormBackward] = tp_exec_layernorm_backward,
    [TP_OP_GeluBackward] = tp_exec_gelu_backward,
    [TP_OP_SoftmaxBackward] = tp_exec_softmax_backward,
    [TP_OP_LogSoftmaxBackward] = tp_exec_softmax_backward,
    [TP_OP_AttentionBackward] = tp_exec_attention_backward,
    [TP_OP_CrossEntropyBackward] = tp_exec_cross_entropy_backward,
    [TP_OP_RMSNorm] = tp_exec_rmsnorm,
    [TP_OP_RMSNormBackward] = tp_exec_rmsnorm_backward,
    [TP_OP_Rotary] = tp_exec_rotary,
    [TP_OP_RotaryBackward] = tp_exec_rotary,
    [TP_OP_SwiGLU] = tp_exec_swiglu,
    [TP_OP_SwiGLUBackward] = tp_exec_swiglu_backward,
};

/* Kernels read elements through typed pointers, but weights referenced in place sit at any
 * byte offset of the model file: such operands are copied to aligned memory first. */
int tp_exec_op(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  const TpOp *o = &m->ops[op];
  TpExecFn fn = exec_table[o->kind];
  if (!fn) return tp_internal(d, "no CPU implementation of op %s", tp_op_info[o->kind].name);
  TpTensor aligned[64];
  TP_ASSERT(o->ninputs <= 64);
  for (int i = 0; i < o->ninputs; i++) {
    aligned[i] = in[i];
    size_t size = tp_dtype_size(in[i].dtype);
    if (in[i].data && size && (uintptr_t)in[i].data % size) {
      aligned[i].data = malloc(tp_tensor_bytes(&in[i]));
      TP_ASSERT(aligned[i].data);
      memcpy(aligned[i].data, in[i].data, tp_tensor_bytes(&in[i]));
    }
  }
  int rc = fn(m, op, aligned, out, d);
  for (int i = 0; i < o->ninputs; i++)
    if (aligned[i].data != in[i].data) free(aligned[i].data);
  return rc;
}

/* A buffer per value, allocated when its op runs and freed after its last use. */
int tp_interp_run(const TpModule *m, const TpTensor *inputs, TpTensor *outputs, TpDiag *d) {
  int rc = TP_OK;
  TpTensor *vals = calloc((size_t)m->nvalues, sizeof *vals);
  bool *owned = calloc((size_t)m->nvalues, sizeof *owned);
  int *last_use = malloc((size_t)m->nvalues * sizeof *last_use);
  TP_ASSERT(vals && owned && last_use);
  for (int v = 0; v < m->nvalues; v++) {
    vals[v] = tp_value_tensor(m, v);
    last_use[v] = -1;
  }
  for (int o = 0; o < m->nops; o++)
    for (int i = 0; i < m->ops[o].ninputs; i++)
      if (m->ops[o].inputs[i] >= 0) last_use[m->ops[o].inputs[i]] = o;
  for (int i = 0; i < m->noutputs; i++) last_use[m->outputs[i]] = m->nops; /* kept to the end */

  for (int i = 0; i < m->ninputs; i++) {
    const TpValue *v = &m->values[m->inputs[i]];
    const TpTensor *t = &inputs[i];
    bool same = t->dtype == v->type.dtype && t->rank == v->type.rank &&
                memcmp(t->dims, v->type.dims, (size_t)t->rank * sizeof t->dims[0]) == 0;
    if (!same) {
      char want[256];
      rc = tp_error(d, "input '%s': expected %s", v->name, tp_type_str(&v->type, want, sizeof want));
      goto done;
    }
    vals[m->inputs[i]].data = t->data;
  }

  for (int o = 0; o < m->nops && rc == TP_OK; o++) {
    const TpOp *op = &m->ops[o];
    TpTensor in[64], out[64];
    TP_ASSERT(op->ninputs <= 64 && op->noutputs <= 64);
    for (int i = 0; i < op->ninputs; i++)
      in[i] = op->inputs[i] >= 0 ? vals[op->inputs[i]] : (TpTensor){0};
    for (int i = 0; i < op->noutputs; i++) {
      int r = op->outputs[i];
      if (r < 0) {
        out[i] = (TpTensor){0};
        continue;
      }
      size_t bytes = tp_tensor_bytes(&vals[r]);
      vals[r].data = malloc(bytes ? bytes : 1);
      TP_ASSERT(vals[r].data);
      owned[r] = true;
      out[i] = vals[r];
    }
    rc = tp_exec_op(m, o, in, out, d);
    for (int i = 0; i < op->ninputs; i++) {
      int v = op->inputs[i];
      if (v >= 0 && owned[v] && last_use[v] == o) {
        free(vals[v].data);
        owned[v] = false;
      }
    }
  }
  if (rc != TP_OK) goto done;

  for (int i = 0; i < m->noutputs; i++) {
    int v = m->outputs[i];
    outputs[i] = vals[v];
    size_t bytes = tp_tensor_bytes(&vals[v]);
    outputs[i].data = malloc(bytes ? bytes : 1);
    TP_ASSERT(outputs[i].data);
    if (bytes) memcpy(outputs[i].data, vals[v].data, bytes);
  }
done:
  for (int v = 0; v < m->nvalues; v++)
    if (owned[v]) free(vals[v].data);
  free(vals);
  free(owned);
  free(last_use);
  return rc;
}
