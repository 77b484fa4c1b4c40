/* The kernels a CUDA plan calls (tokpipec --target cuda): for every row of
 * runtime/kernels/kernels.def, whose CPU function is tp_X, the function tp_cuda_X with the
 * CPU function's parameters (the row's SIG) and one more, the unit's stream (io->stream, runtime/cuda/stream.h). Each computes what
 * tp_X computes, on the device, queued on the stream (it returns before the work is done):
 *   - pointers (a DATA argument, a view's data, p->mask, o->weight) are device pointers;
 *     a view's dims, int64 lists (perm, starts, axes) and the structs themselves are host
 *     memory, as the generated code writes them;
 *   - the one exception to "the same parameters": a SCALAR argument (the loss gradient
 *     of tp_cross_entropy_backward_f32) is a device pointer to the float, not its value;
 *   - an index out of range is reported through stream->bad (checked when the host next
 *     synchronizes) by its flat position in the ids, targets or indices (the smallest
 *     one), not through `bad`, which is the host's and is not written;
 *   - the status is the CPU function's for what can be checked on the host (dtypes,
 *     shapes; runtime/kernels/check.h's checks, which both targets run), and
 *     TP_KERNEL_BAD_DTYPE for a case the CPU kernel takes and these do not.
 * With --precision bf16 the plans call tp_cuda_bf16_X for the matrix products (GEMM,
 * MATMUL, LINEAR and their backwards, and attention; kernels.def's BF16_SIG rows): the
 * multiplied operands of a matrix product are views, each f32 (rounded to bf16 in scratch,
 * counted as converted bytes) or bf16 (read as it is: a weight's 16-bit working copy, a
 * stored activation or gradient); products accumulated in fp32 (cuBLASLt; attention on the
 * tensor cores, attention.cu, rounding its f32 operands as it loads them), results fp32;
 * and a kernel whose result only such products read may write it in bf16 (kernels.def's
 * BF16_RESULT_SIG rows, e.g. tp_cuda_cross_entropy_backward_bf16), the bits the products
 * would have rounded it to.
 *
 * Each entry point is defined in the file of its kernels, beside their __global__
 * functions (activation.cu: the activations and gated MLPs; norm.cu, rotary.cu, softmax.cu,
 * loss.cu, embedding.cu, attention.cu, anydtype.cu: the ops of any dtype, products.cu: the
 * matrix products). kernels.h and blas.h declare the launchers that several entry points,
 * the compute backend or the tests share. tests/cuda checks them against the CPU kernels,
 * through the emulation of the CUDA execution model. */
#ifndef TOKPIPE_CUDA_OPS_H
#define TOKPIPE_CUDA_OPS_H

#include <math.h> /* before extern "C": C++ declares templates in it */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* the C headers below, included first here, declare C functions */
extern "C" {
#endif
#include "../kernels/args.h"
#include "../train/plan.h"
#include "stream.h"

/* The device of a CUDA plan (TpPlan.device): backend.cu's compute backend, the NCCL
 * transport (comm_nccl.cu). */
extern const TpPlanDevice tp_plan_device_cuda;

/* Queues a copy of `bytes` from the device to the host on s (a unit's loss into
 * io->loss): the host reads it after it synchronizes with s. */
TpKernelStatus tp_cuda_copy_to_host(void *host, const void *device, size_t bytes, TpStream *stream);

/* Queues storing `value` at the device's *dst on s (a unit's TensorRank: io->tensor_rank). */
TpKernelStatus tp_cuda_fill_i64(int64_t *dst, int64_t value, TpStream *stream);

/* The entry points, one per row of runtime/kernels/kernels.def (its SIG row's parameters,
 * then the stream), and the bf16 products (its BF16_SIG rows). */
#define SIG(stem, ...) TpKernelStatus tp_cuda_##stem(__VA_ARGS__, TpStream *stream);
#define BF16_SIG(stem, ...) TpKernelStatus tp_cuda_bf16_##stem(__VA_ARGS__, TpStream *stream);
#define BF16_RESULT_SIG(stem, ...) TpKernelStatus tp_cuda_##stem(__VA_ARGS__, TpStream *stream);
#define SCALAR_PARAM(name) const float *name
#include "../kernels/kernels.def"
#undef SIG
#undef BF16_SIG
#undef BF16_RESULT_SIG
#undef SCALAR_PARAM

#ifdef __cplusplus
}
#endif

#endif
