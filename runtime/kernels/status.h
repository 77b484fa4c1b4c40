/* What every kernel the interpreter and the generated plans call returns: OK or one specific
 * failure; a kernel that reads data-dependent indices also reports the offending one through
 * its `bad` argument. The caller (the interpreter's one check, a plan's CHECK) turns a
 * failure into a diagnostic. */
#ifndef TOKPIPE_KERNELS_STATUS_H
#define TOKPIPE_KERNELS_STATUS_H

typedef enum {
  TP_KERNEL_OK = 0,
  TP_KERNEL_BAD_DTYPE, /* dtype (combination) the kernel does not implement */
  TP_KERNEL_BAD_SHAPE, /* operand shapes do not fit the output */
  TP_KERNEL_BAD_INDEX, /* a data-dependent index is out of range */
} TpKernelStatus;

#endif
