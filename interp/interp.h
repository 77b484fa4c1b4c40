/* The reference interpreter: executes an IR module forward on the CPU with the runtime's
 * kernels (runtime/cpu), one kernel per op, its arguments bound by bind/bind.c (the same
 * binders codegen prints). Also used by constant folding. */
#ifndef TOKPIPE_INTERP_H
#define TOKPIPE_INTERP_H

#include "../ir/ir.h"

/* Runs op `op` of m. in[i] views operand i (data NULL when absent); out[i] views result i
 * with its data already allocated from the result type (data NULL when absent). Returns
 * TP_OK, or reports an error at the op's origin (e.g. an index out of range). */
int tp_exec_op(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d);

/* Runs the whole module. inputs[i] holds graph input i (dtype and shape must match its
 * type). outputs[i] receives graph output i in a malloc'ed buffer the caller frees. */
int tp_interp_run(const TpModule *m, const TpTensor *inputs, TpTensor *outputs, TpDiag *d);

#endif
