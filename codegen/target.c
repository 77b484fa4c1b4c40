/* The targets' kernel tables (target.h). cpu: the kernels of runtime/cpu, called on host
 * pointers with the generated function's TpTensor views; cuda: runtime/cuda/ops.h's, the
 * same calls on device pointers, queued on the unit's stream. What is per kernel (its
 * function, header and arguments) is in runtime/kernels/kernels.def; what is per target is here. */
#include "target.h"

#include <stdio.h>
#include <string.h>

#include "../base/diag.h" /* TP_ASSERT */

enum { H_ELEMENTWISE, H_LAYOUT, H_REDUCE, H_MATMUL, H_NN, H_LOSS, H_TRANSFORMER, H_NN_BACKWARD, H_LAYOUT_BACKWARD };
static const char *const cpu_headers[] = {
    [H_ELEMENTWISE] = "cpu/elementwise.h",
    [H_LAYOUT] = "cpu/layout.h",
    [H_REDUCE] = "cpu/reduce.h",
    [H_MATMUL] = "cpu/matmul.h",
    [H_NN] = "cpu/nn.h",
    [H_LOSS] = "cpu/loss.h",
    [H_TRANSFORMER] = "cpu/transformer.h",
    [H_NN_BACKWARD] = "cpu/nn_backward.h",
    [H_LAYOUT_BACKWARD] = "cpu/layout_backward.h",
};

/* The cpu table, built once from runtime/kernels/kernels.def's rows: each row's function and header,
 * and its argument macros as TpArgSpellings of the fields of the row's struct (Args, a
 * typedef per row) in TpBound. A field whose type is not the argument kind's is a compile
 * error, so the interpreter's call (bind/call.c) and the printed one agree by construction.
 * The cuda tables are derived from it (device_kernels), so a kernel has one argument list
 * for every target. */
#define FIELD(f, ...) (offsetof(TpBound, a) + offsetof(Args, f) + 0 * _Generic(((Args *)0)->f, __VA_ARGS__ : 0))
#define VIEW_FIELD(f) FIELD(f, const TpTensor * : 0, TpTensor *)
#define ARG(kind, f, ...)                                                                                           \
  { TP_ARG_##kind, FIELD(f, __VA_ARGS__), 0 }
#define ARG2(kind, f, T, g, U)                                                                                      \
  { TP_ARG_##kind, FIELD(f, T), FIELD(g, U) }
#define VIEW(f)                                                                                                     \
  { TP_ARG_VIEW, VIEW_FIELD(f), 0 }
#define DATA(f)                                                                                                     \
  { TP_ARG_DATA, VIEW_FIELD(f), 0 }
#define SCALAR(f)                                                                                                   \
  { TP_ARG_SCALAR, VIEW_FIELD(f), 0 }
#define SCRATCH(f, like)                                                                                            \
  { TP_ARG_SCRATCH, VIEW_FIELD(f), VIEW_FIELD(like) }
#define RANK(f)                                                                                                     \
  { TP_ARG_RANK, VIEW_FIELD(f), 0 }
#define DIMS(f)                                                                                                     \
  { TP_ARG_DIMS, VIEW_FIELD(f), 0 }
#define I64(f) ARG(I64, f, int64_t)
#define INT(f) ARG(INT, f, int)
#define BOOL(f) ARG(BOOL, f, bool)
#define F32(f) ARG(F32, f, float)
#define F64(f) ARG(F64, f, double)
#define I64S(f, n) ARG2(I64S, f, const int64_t *, n, int)
#define VIEWS_IN(f, n) ARG2(VIEWS_IN, f, const TpTensor *, n, int)
#define VIEWS_OUT(f, n) ARG2(VIEWS_OUT, f, TpTensor *, n, int)
#define UNARY_OP(f) ARG(UNARY_OP, f, TpUnaryOp)
#define BINARY_OP(f) ARG(BINARY_OP, f, TpBinaryOp)
#define ATTENTION(p, mask)                                                                                          \
  { TP_ARG_ATTENTION, FIELD(p, TpAttention), VIEW_FIELD(mask) }
#define LOSS(o, weight)                                                                                             \
  { TP_ARG_LOSS, FIELD(o, TpLossOptions), VIEW_FIELD(weight) }
#define BAD(f) ARG(BAD, f, int64_t *)

static TpKernelSpelling cpu_kernels[TP_K_COUNT];

static void build_cpu_kernels(void) {
#define K(id, member, Args_, fn, header_, ...)                                                                      \
  {                                                                                                                 \
    typedef Args_ Args;                                                                                             \
    const TpArgSpelling args[] = {__VA_ARGS__};                                                                     \
    /* one more for a device target's stream */                                                                     \
    _Static_assert(sizeof args / sizeof *args < TP_MAX_KERNEL_ARGS, #fn ": too many arguments");                    \
    TpKernelSpelling *k = &cpu_kernels[TP_K_##id];                                                                  \
    *k = (TpKernelSpelling){.name = #fn, .header = H_##header_, .nargs = sizeof args / sizeof *args};               \
    memcpy(k->args, args, sizeof args);                                                                             \
  }
#include "../runtime/kernels/kernels.def"
#undef K
}

/* A device table from the cpu one: row function tp_X becomes <prefix>X (the matrix
 * products <product_prefix>X), declared in the target's one header (index 0); a SCALAR
 * argument is passed as its device pointer (DATA), since the host cannot read it; and the
 * unit's stream follows the row's arguments. */
static void device_kernels(TpKernelSpelling *table, const char *prefix, const char *product_prefix) {
  static const TpKernelId products[] = {TP_K_GEMM,
                                        TP_K_MATMUL,
                                        TP_K_LINEAR,
                                        TP_K_LINEAR_BACKWARD,
                                        TP_K_MATMUL_BACKWARD,
                                        TP_K_ATTENTION,
                                        TP_K_ATTENTION_BACKWARD};
  for (int id = 0; id < TP_K_COUNT; id++) {
    const TpKernelSpelling *cpu = &cpu_kernels[id];
    TpKernelSpelling *k = &table[id];
    *k = *cpu;
    const char *to = prefix;
    for (size_t i = 0; i < sizeof products / sizeof *products; i++)
      if (products[i] == (TpKernelId)id) to = product_prefix;
    TP_ASSERT(strncmp(cpu->name, "tp_", 3) == 0);
    int n = snprintf(k->name, sizeof k->name, "%s%s", to, cpu->name + 3);
    TP_ASSERT(n > 0 && (size_t)n < sizeof k->name);
    k->header = 0;
    for (int i = 0; i < k->nargs; i++)
      if (k->args[i].kind == TP_ARG_SCALAR) k->args[i].kind = TP_ARG_DATA;
    k->args[k->nargs++] = (TpArgSpelling){TP_ARG_STREAM, 0, 0};
  }
}

static const char *const cuda_headers[] = {"cuda/ops.h"};
static TpKernelSpelling cuda_kernels[TP_K_COUNT], cuda_bf16_kernels[TP_K_COUNT];

#define CPU_BUILD "cc plan.c $(pkg-config --cflags --libs tokpipe) -o trainer"
#define CUDA_BUILD "cc plan.c $(pkg-config --cflags --libs tokpipe-cuda) -o trainer"
#define CUDA_DEVICE                                                                                                 \
  .device = "tp_plan_device_cuda", .device_header = 0, .constant = "tp_cuda_constant",                              \
  .copy_to_host = "tp_cuda_copy_to_host", .fill_i64 = "tp_cuda_fill_i64"
static const TpTarget targets[] = {
    {.name = "cpu",
     .headers = cpu_headers,
     .nheaders = (int)(sizeof cpu_headers / sizeof *cpu_headers),
     .kernels = cpu_kernels,
     .build = CPU_BUILD},
    {.name = "cuda",
     .precision = "fp32",
     .headers = cuda_headers,
     .nheaders = 1,
     .kernels = cuda_kernels,
     .build = CUDA_BUILD,
     CUDA_DEVICE},
    {.name = "cuda",
     .precision = "bf16",
     .headers = cuda_headers,
     .nheaders = 1,
     .kernels = cuda_bf16_kernels,
     .build = CUDA_BUILD,
     CUDA_DEVICE},
    /* fp16 storage; the products' operands stay f32 (no fp16 products) */
    {.name = "cuda",
     .precision = "fp16",
     .headers = cuda_headers,
     .nheaders = 1,
     .kernels = cuda_kernels,
     .build = CUDA_BUILD,
     CUDA_DEVICE},
};
enum { NTARGETS = sizeof targets / sizeof *targets };

const TpTarget *tp_target_find(const char *name, const char *precision) {
  if (!cpu_kernels[0].name[0]) {
    build_cpu_kernels();
    device_kernels(cuda_kernels, "tp_cuda_", "tp_cuda_");
    device_kernels(cuda_bf16_kernels, "tp_cuda_", "tp_cuda_bf16_");
  }
  for (int i = 0; i < NTARGETS; i++)
    if (strcmp(targets[i].name, name) == 0 &&
        (!precision || (targets[i].precision && strcmp(targets[i].precision, precision) == 0)))
      return &targets[i];
  return NULL;
}

/* Into buf, ", "-separated: the targets' names (name NULL), or target `name`'s precisions. */
static const char *list(char *buf, size_t size, const char *name) {
  buf[0] = 0;
  for (int i = 0; i < NTARGETS; i++) {
    const char *item = name ? targets[i].precision : targets[i].name;
    if (!item || (name && strcmp(targets[i].name, name) != 0) || (!name && i && !strcmp(targets[i - 1].name, item)))
      continue;
    size_t len = strlen(buf);
    snprintf(buf + len, size - len, "%s%s", len ? ", " : "", item);
  }
  return buf;
}

const char *tp_target_names(void) {
  static char names[256];
  return list(names, sizeof names, NULL);
}

const char *tp_target_precisions(const char *name) {
  static char precisions[256];
  return list(precisions, sizeof precisions, name);
}
