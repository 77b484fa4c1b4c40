/* Binding (bind.h): an op's binder, the IR attributes and the operand dims turned into the
 * kernel's argument struct with the checks that the shapes fit the kernel, is its rule
 * set's `bind` (ops/, TpOpRules.bind, beside the op's other hooks). Compiler-side: the
 * interpreter and codegen both call them through tp_bind_op, so each op's
 * attribute-to-argument logic is in one place. */
#include "bind.h"

#include "../ops/bind.h"

#include <string.h>

const TpOpBinding *tp_op_binding(TpOpKind kind) {
  static const TpOpBinding none = {0};
  const TpOpBinding *b = tp_op_rules[kind]->bind;
  return b ? b : &none;
}

int tp_bind_op(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d) {
  TpBindFn fn = tp_op_binding(m->ops[op].kind)->bind;
  if (!fn) return tp_internal(d, "no kernel runs op %s", tp_op_info[m->ops[op].kind].name);
  memset(b, 0, sizeof *b);
  return fn(m, op, in, out, b, d);
}

int tp_bound_failed(const TpModule *m, int op, const TpBound *b, const TpTensor *in, const TpTensor *out,
                    TpKernelStatus s, TpDiag *d) {
  long long bad = (long long)b->bad;
  if (s == TP_KERNEL_BAD_INDEX) switch (b->kernel) {
    case TP_K_GATHER:
    case TP_K_GATHER_ELEMENTS:
    case TP_K_GATHER_BACKWARD:
    case TP_K_GATHER_ELEMENTS_BACKWARD: {
      const TpGatherArgs *a = &b->a.gather;
      const TpTensor *data = b->kernel == TP_K_GATHER || b->kernel == TP_K_GATHER_ELEMENTS ? a->data : a->y;
      return tp_error_op(d, m, op, "index %lld is out of range for axis %d of size %lld", bad, a->axis,
                         (long long)data->dims[a->axis]);
    }
    case TP_K_EMBEDDING: {
      const TpEmbeddingArgs *a = &b->a.embedding;
      return tp_error_op(d, m, op, "id %lld at position %lld is out of range for %lld embedding rows",
                         (long long)((const int64_t *)a->ids->data)[bad], bad, (long long)a->V);
    }
    case TP_K_EMBEDDING_PART:
    case TP_K_EMBEDDING_PART_BACKWARD:
    case TP_K_CROSS_ENTROPY_STATS:
    case TP_K_CROSS_ENTROPY_PARTS_BACKWARD: {
      const TpVocabArgs *a = &b->a.embedding_part;
      return tp_error_op(d, m, op, "%s %lld at position %lld is not a class in [0, %lld)",
                         b->kernel == TP_K_EMBEDDING_PART || b->kernel == TP_K_EMBEDDING_PART_BACKWARD ? "id"
                                                                                                       : "target",
                         (long long)((const int64_t *)a->ids->data)[bad], bad, (long long)(a->V * a->parts));
    }
    case TP_K_CROSS_ENTROPY:
    case TP_K_CROSS_ENTROPY_BACKWARD:
    case TP_K_CROSS_ENTROPY_PAD:
    case TP_K_CROSS_ENTROPY_BACKWARD_PAD: {
      const TpCrossEntropyArgs *a = &b->a.cross_entropy;
      return tp_error_op(d, m, op, "target %lld at position %lld is not a class in [0, %lld)",
                         (long long)((const int64_t *)a->targets->data)[bad], bad, (long long)(a->V - a->pad));
    }
    case TP_K_NLL_LOSS:
    case TP_K_SOFTMAX_CROSS_ENTROPY: {
      const TpLossArgs *a = &b->a.nll_loss;
      return tp_error_op(d, m, op, "target %lld at flat index %lld is not a class in [0, %lld)",
                         (long long)((const int64_t *)a->target->data)[bad], bad, (long long)a->C);
    }
    default: break;
    }
  const TpOp *o = &m->ops[op];
  char buf[160];
  int len = 0;
  for (int i = 0; i < o->ninputs && len < (int)sizeof buf - 16; i++)
    len += snprintf(buf + len, sizeof buf - (size_t)len, "%s%s", i ? ", " : "",
                    o->inputs[i] >= 0 ? dtype_name(in[i].dtype) : "-");
  return tp_error_op(d, m, op, "CPU kernel: %s (operands %s -> %s)",
                     s == TP_KERNEL_BAD_DTYPE ? "unsupported element types" : "mismatched shapes", buf,
                     o->noutputs && o->outputs[0] >= 0 ? dtype_name(out[0].dtype) : "-");
}
