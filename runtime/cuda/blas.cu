/* Matrix products through cuBLASLt (blas.h); the emulated build runs the same column-major
 * products through OpenBLAS. Each TpCudaBlas caches its cuBLASLt plans (the matmul
 * descriptor, the matrix layouts and the algorithm the heuristic chose), keyed by all they
 * depend on, so a step that repeats its products queries the heuristic only the first time;
 * the emulated build keeps the same cache without the cuBLASLt objects, so that its tests
 * count the queries. A Linear's bias is the product's epilogue, and so is a tanh-approximate
 * Gelu after it (GELU_AUX_BIAS: the pre-activation written beside the result) and the
 * Gelu's gradient after a Linear backward's dX product (DGELU); a MatMul's batch is
 * strided-batched products where the batch steps each operand at one stride. The zero fill
 * of empty or summed products is a kernel of this file and the bias gradient colsum.cu's
 * column sums, so they run through the emulation for real. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/element.h" /* the Gelu epilogues' element functions */
#include "blas.h"
#include "common.cuh"

extern "C" {
#include "../../base/diag.h" /* TP_ASSERT: a C header */
}

#ifdef TOKPIPE_CUDA_EMULATE
#include <cblas.h>
#endif

/* What follows the products in the call (cuBLASLt's epilogue): nothing, the bias, the
 * tanh-approximate Gelu keeping its operand in aux (with or without the bias), or the
 * product times the Gelu's gradient at aux. */
enum Epilogue { EPILOGUE_NONE, EPILOGUE_BIAS, EPILOGUE_GELU_AUX, EPILOGUE_DGELU };

/* What a plan depends on: one cuBLASLt call, column-major D = C_i (m, n) = op(A_i) (m, k)
 * op(B_i) (k, n) + beta C_i (+ a bias of m on every column) for i < batch, then its
 * epilogue, as its descriptors and the heuristic see it (beta is passed per call). All
 * int64_t, so no padding: keys compare as bytes. */
struct GemmKey {
  int64_t m, n, k, trans_a, trans_b;
  int64_t bf16; /* A and B bf16, else f32; C and D f32 */
  int64_t lda, ldb, ldc;
  int64_t align_a, align_b, align_c, align_bias; /* bytes, 256 at most (0: no bias) */
  int64_t batch, stride_a, stride_b, stride_c;   /* elements; all 0 when batch is 1 */
  int64_t epilogue, align_aux;                   /* Epilogue; aux's alignment (0: no aux) */
};

struct GemmPlan {
  GemmKey key;
  uint64_t last_use; /* the cache's clock at its last use; 0: a free slot */
  /* a Gelu epilogue for which the heuristic found no algorithm: the plan is the product
   * alone (with its bias), and the Gelu (or its gradient) runs as a kernel after it */
  bool gelu_apart;
#ifndef TOKPIPE_CUDA_EMULATE
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t layout_a, layout_b, layout_c; /* C's serves D too */
  cublasLtMatmulAlgo_t algo;
#endif
};

struct TpCudaBlas {
#ifndef TOKPIPE_CUDA_EMULATE
  cublasLtHandle_t lt;
  void *workspace;
  size_t workspace_size;
#endif
  uint64_t clock;                     /* products run: the eviction's order of use */
  GemmPlan plans[TP_CUDA_BLAS_PLANS]; /* used slots first, free ones after */
  /* the bias gradient's column runs: scratch of its own, apart from the stream's
   * (tp_cuda_scratch), which the caller's bf16 operands may occupy */
  void *column_runs;
  size_t column_runs_bytes;
};

/* cuBLASLt's recommended workspace for Hopper (Ampere needs less). */
enum { BLAS_WORKSPACE_BYTES = 32 << 20 };

/* The cuBLASLt objects of a plan (none in the emulated build). */
static void release_plan(GemmPlan *plan) {
#ifndef TOKPIPE_CUDA_EMULATE
  TP_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan->layout_c));
  TP_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan->layout_b));
  TP_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan->layout_a));
  TP_CUBLAS_CHECK(cublasLtMatmulDescDestroy(plan->op));
#else
  (void)plan;
#endif
}

TpCudaBlas *tp_cuda_blas_create(void) {
  TpCudaBlas *blas = static_cast<TpCudaBlas *>(calloc(1, sizeof *blas));
  if (!blas) return NULL;
#ifndef TOKPIPE_CUDA_EMULATE
  TP_CUBLAS_CHECK(cublasLtCreate(&blas->lt));
  blas->workspace_size = BLAS_WORKSPACE_BYTES;
  TP_CUDA_ALLOC(cudaMalloc(&blas->workspace, blas->workspace_size));
#endif
  return blas;
}

void tp_cuda_blas_destroy(TpCudaBlas *blas) {
  if (!blas) return;
  for (int i = 0; i < TP_CUDA_BLAS_PLANS && blas->plans[i].last_use; i++) release_plan(&blas->plans[i]);
  if (blas->column_runs) TP_CUDA_CHECK(cudaFree(blas->column_runs));
#ifndef TOKPIPE_CUDA_EMULATE
  TP_CUDA_CHECK(cudaFree(blas->workspace));
  TP_CUBLAS_CHECK(cublasLtDestroy(blas->lt));
#endif
  free(blas);
}

/* One cuBLASLt call: for i < batch, column-major C_i (m, n) = op(A_i) (m, k) @ op(B_i) (k, n)
 * + beta C_i, X_i = X + i * stride_x elements (a stride of 0 shares A or B), k > 0; A and B
 * f32, or bf16 when bf16 (C f32 either way). With a bias (m), batch is 1 and beta 0: C =
 * op(A) op(B) + the bias on every column. The Gelu epilogues (batch 1, beta 0) have an aux
 * matrix of C's layout: GELU_AUX writes the sum (bias included) to aux and gelu_tanh of it
 * to C; DGELU writes the product times gelu_tanh'(aux) to C. */
struct Gemm {
  Epilogue epilogue; /* EPILOGUE_NONE or EPILOGUE_BIAS: by bias alone */
  float *aux;        /* GELU_AUX: written; DGELU: read */
  bool bf16, trans_a, trans_b;
  int64_t m, n, k, batch;
  const void *A;
  int64_t lda, stride_a;
  const void *B;
  int64_t ldb, stride_b;
  const float *bias;
  float beta;
  float *C;
  int64_t ldc, stride_c;
};

/* The largest power of two up to 256 dividing p's address and stride_bytes (the distance
 * between batch elements, 0 if none): cuBLASLt's heuristic assumes 256-byte aligned
 * operands unless told less (a batch element of a MatMul starts anywhere). */
static int64_t alignment_bytes(const void *p, int64_t stride_bytes) {
  uintptr_t address = reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(stride_bytes);
  int64_t bytes = 256;
  while (bytes > 1 && address % (uintptr_t)bytes) bytes /= 2;
  return bytes;
}

static GemmKey key_of(const Gemm *g) {
  bool batched = g->batch > 1;
  int64_t size = g->bf16 ? 2 : 4;
  GemmKey key = {};
  key.m = g->m, key.n = g->n, key.k = g->k, key.trans_a = g->trans_a, key.trans_b = g->trans_b, key.bf16 = g->bf16;
  key.lda = g->lda, key.ldb = g->ldb, key.ldc = g->ldc;
  key.align_a = alignment_bytes(g->A, batched ? g->stride_a * size : 0);
  key.align_b = alignment_bytes(g->B, batched ? g->stride_b * size : 0);
  key.align_c = alignment_bytes(g->C, batched ? g->stride_c * 4 : 0);
  key.align_bias = g->bias ? alignment_bytes(g->bias, 0) : 0;
  key.batch = g->batch;
  key.stride_a = batched ? g->stride_a : 0, key.stride_b = batched ? g->stride_b : 0;
  key.stride_c = batched ? g->stride_c : 0;
  key.epilogue = g->epilogue;
  key.align_aux = g->aux ? alignment_bytes(g->aux, 0) : 0;
  return key;
}

#ifndef TOKPIPE_CUDA_EMULATE
/* A stored matrix (rows, columns, leading dim) of `batch` at `stride` elements apart. */
static cublasLtMatrixLayout_t matrix_layout(cudaDataType_t type, int64_t rows, int64_t columns, int64_t ld,
                                            int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t layout;
  TP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, (uint64_t)rows, (uint64_t)columns, ld));
  if (batch > 1) {
    int32_t count = (int32_t)batch;
    TP_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    TP_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                     sizeof stride));
  }
  return layout;
}

static void set_alignment(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
                          int64_t bytes) {
  uint32_t value = (uint32_t)bytes;
  TP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof value));
}

/* g's descriptors, layouts and algorithm into plan (its key set). */
static void make_plan(TpCudaBlas *blas, GemmPlan *plan, const Gemm *g) {
  const GemmKey *key = &plan->key;
  cudaDataType_t operand_type = g->bf16 ? CUDA_R_16BF : CUDA_R_32F;
  /* CUBLAS_COMPUTE_32F keeps the products in fp32: cuBLASLt uses TF32 only when asked
   * for by a *_FAST_TF32 compute type (it does not read cuBLAS's math mode). bf16
   * operands accumulate in fp32 under it too. */
  TP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t op_a = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  TP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  TP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  bool gelu = !plan->gelu_apart && (g->epilogue == EPILOGUE_GELU_AUX || g->epilogue == EPILOGUE_DGELU);
  cublasLtEpilogue_t epilogue = g->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (gelu && g->epilogue == EPILOGUE_GELU_AUX)
    epilogue = g->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if (gelu && g->epilogue == EPILOGUE_DGELU) epilogue = CUBLASLT_EPILOGUE_DGELU;
  TP_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  if (g->bias) /* the bias's type is D's (f32); the heuristic reads its pointer's alignment */
    TP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
  if (gelu) { /* aux: D's type (f32) and layout */
    int64_t aux_ld = g->ldc;
    TP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux, sizeof g->aux));
    TP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
  }
  plan->layout_a = matrix_layout(operand_type, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda,
                                 key->batch, key->stride_a);
  plan->layout_b = matrix_layout(operand_type, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb,
                                 key->batch, key->stride_b);
  plan->layout_c = matrix_layout(CUDA_R_32F, g->m, g->n, g->ldc, key->batch, key->stride_c);
  cublasLtMatmulPreference_t preference;
  TP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  uint64_t workspace_size = blas->workspace_size;
  TP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace_size, sizeof workspace_size));
  set_alignment(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key->align_a);
  set_alignment(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key->align_b);
  set_alignment(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key->align_c);
  set_alignment(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key->align_c);
  cublasLtMatmulHeuristicResult_t heuristic;
  int found = 0;
  TP_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(blas->lt, plan->op, plan->layout_a, plan->layout_b, plan->layout_c,
                                                 plan->layout_c, preference, 1, &heuristic, &found));
  TP_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
  if (found == 0 && gelu) { /* the product alone, the Gelu as a kernel after it */
    release_plan(plan);
    plan->gelu_apart = true;
    make_plan(blas, plan, g);
    return;
  }
  if (found == 0) {
    char what[192];
    snprintf(what, sizeof what, "no algorithm for the product m=%lld n=%lld k=%lld batch=%lld%s%s", (long long)g->m,
             (long long)g->n, (long long)g->k, (long long)key->batch, g->bf16 ? " bf16" : "",
             g->bias ? " with the bias epilogue" : "");
    tp_cuda_fail(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", what);
  }
  plan->algo = heuristic.algo;
}
#endif

static bool is_gelu(const Gemm *g) { return g->epilogue == EPILOGUE_GELU_AUX || g->epilogue == EPILOGUE_DGELU; }

/* Can cuBLASLt take g's aux matrix? Its leading dim must be a multiple of 8; 16-byte
 * alignment keeps its vector loads. */
static bool gelu_fits(const Gemm *g) { return g->ldc % 8 == 0 && alignment_bytes(g->aux, 0) >= 16; }

/* g's plan: the cached one, or a new one (a heuristic query, counted) in the first free
 * slot, or else in the least recently used one's. */
static GemmPlan *plan_for(TpCudaBlas *blas, const Gemm *g) {
  GemmKey key = key_of(g);
  GemmPlan *slot = &blas->plans[0];
  for (GemmPlan *p = blas->plans; p < blas->plans + TP_CUDA_BLAS_PLANS; p++) {
    if (!p->last_use) { /* free, and so are all after it */
      slot = p;
      break;
    }
    if (memcmp(&p->key, &key, sizeof key) == 0) {
      p->last_use = ++blas->clock;
      return p;
    }
    if (p->last_use < slot->last_use) slot = p;
  }
  if (slot->last_use) release_plan(slot);
  slot->key = key;
  slot->gelu_apart = is_gelu(g) && !gelu_fits(g);
#ifndef TOKPIPE_CUDA_EMULATE
  make_plan(blas, slot, g);
#endif
  TP_CUDA_COUNT(queries, 1);
  slot->last_use = ++blas->clock;
  return slot;
}

#ifdef TOKPIPE_CUDA_EMULATE
/* n bf16 values widened to f32 (exact), in a new array. */
static float *widen_bf16(const void *bits, int64_t n) {
  float *wide = static_cast<float *>(malloc((size_t)(n ? n : 1) * sizeof *wide));
  if (!wide) {
    fprintf(stderr, "tokpipe: error: out of memory widening a bf16 operand\n");
    exit(1);
  }
  for (int64_t i = 0; i < n; i++) wide[i] = tp_bf16_to_f32(static_cast<const uint16_t *>(bits)[i]);
  return wide;
}

/* g's products one by one through OpenBLAS. A bias is the CPU Linear's arithmetic: C
 * filled with it, the product summed onto it (beta 1), so the results are its bits. */
static void emulated_gemm(const Gemm *g) {
  int64_t size = g->bf16 ? 2 : 4;
  for (int64_t i = 0; i < g->batch; i++) {
    const void *A = static_cast<const char *>(g->A) + i * g->stride_a * size;
    const void *B = static_cast<const char *>(g->B) + i * g->stride_b * size;
    float *C = g->C + i * g->stride_c, beta = g->beta;
    if (g->bias) {
      for (int64_t j = 0; j < g->n; j++) memcpy(C + j * g->ldc, g->bias, (size_t)g->m * sizeof *C);
      beta = 1;
    }
    /* OpenBLAS's sbgemm is missing from some builds: bf16 operands are widened first (the
     * products are then the same as bf16 products accumulated in f32) */
    float *wide_a = g->bf16 ? widen_bf16(A, g->lda * (g->trans_a ? g->m : g->k)) : NULL;
    float *wide_b = g->bf16 ? widen_bf16(B, g->ldb * (g->trans_b ? g->k : g->n)) : NULL;
    cblas_sgemm(CblasColMajor, g->trans_a ? CblasTrans : CblasNoTrans, g->trans_b ? CblasTrans : CblasNoTrans,
                (int)g->m, (int)g->n, (int)g->k, 1.0f, g->bf16 ? wide_a : static_cast<const float *>(A), (int)g->lda,
                g->bf16 ? wide_b : static_cast<const float *>(B), (int)g->ldb, beta, C, (int)g->ldc);
    free(wide_a), free(wide_b);
  }
}
#endif

/* The Gelu epilogues' element i of column-major (m, n) matrices of leading dim ld: GELU_AUX:
 * c = gelu_tanh(aux), aux holding the product; DGELU: c = c gelu_tanh'(aux), c holding it.
 * The formulas (element.h) of the unfused Gelu and GeluBackward kernels, so their bits. */
TP_HOST_DEVICE static inline void gelu_epilogue(bool grad, const float *aux, int64_t m, int64_t ld, int64_t e,
                                                float *c) {
  int64_t i = (e / m) * ld + e % m;
  c[i] = grad ? c[i] * tp_gelu_tanh_grad_f32(aux[i]) : tp_gelu_tanh_f32(aux[i]);
}

__global__ void gelu_epilogue_kernel(bool grad, const float *aux, int64_t m, int64_t n, int64_t ld, float *c) {
  TP_GRID_STRIDE_LOOP(e, m * n) gelu_epilogue(grad, aux, m, ld, e, c);
}

static void launch_gelu_epilogue(const Gemm *g, TpCudaStream stream) {
  if (g->m * g->n == 0) return;
  TP_LAUNCH(gelu_epilogue_kernel, tp_elementwise_grid(g->m * g->n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream,
            g->epilogue == EPILOGUE_DGELU, g->aux, g->m, g->n, g->ldc, g->C);
}

/* g as one cuBLASLt call (one launch); a Gelu epilogue cuBLASLt cannot take (gelu_apart)
 * is a kernel after it. The bias epilogue adds the bias to the finished f32
 * sum of the products, y = fl(sum + bias), where the CPU Linear sums the products onto the
 * bias (its first partial sum is fl(bias + p_1)): the same terms in another order, within
 * the products' tolerance. The emulated build keeps the CPU's order and so its bits, and
 * runs a fused Gelu epilogue in the call with the unfused kernels' formulas. */
static void run_gemm(TpCudaBlas *blas, const Gemm *g, TpCudaStream stream) {
  TP_ASSERT(g->k > 0 && g->batch >= 1 && g->batch <= INT32_MAX);
  TP_ASSERT(!g->bias || (g->batch == 1 && g->beta == 0));
  TP_ASSERT(is_gelu(g) == (g->aux != NULL) && (!g->aux || (g->batch == 1 && g->beta == 0)));
  GemmPlan *plan = plan_for(blas, g);
  TP_CUDA_COUNT(launches, 1);
  TP_CUDA_COUNT(flops[g->bf16 ? TP_FLOPS_BF16 : TP_FLOPS_F32],
                2.0 * (double)g->m * (double)g->n * (double)g->k * (double)g->batch);
  Gemm product = *g; /* where the products go: the Gelu's operand goes to aux */
  if (g->epilogue == EPILOGUE_GELU_AUX) product.C = g->aux;
#ifdef TOKPIPE_CUDA_EMULATE
  tp_emu_stream_ready(stream); /* after the stream's all-reduces, as on a GPU */
  emulated_gemm(&product);
  if (is_gelu(g) && !plan->gelu_apart)
    for (int64_t e = 0; e < g->m * g->n; e++)
      gelu_epilogue(g->epilogue == EPILOGUE_DGELU, g->aux, g->m, g->ldc, e, g->C);
#else
  if (g->bias) /* this call's bias, of the alignment the plan was chosen for */
    TP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
  if (is_gelu(g) && !plan->gelu_apart) {
    product.C = g->C;
    TP_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux, sizeof g->aux));
  }
  const float alpha = 1;
  TP_CUBLAS_CHECK(cublasLtMatmul(blas->lt, plan->op, &alpha, g->A, plan->layout_a, g->B, plan->layout_b, &g->beta,
                                 product.C, plan->layout_c, product.C, plan->layout_c, &plan->algo, blas->workspace,
                                 blas->workspace_size, static_cast<cudaStream_t>(stream)));
#endif
  if (is_gelu(g) && plan->gelu_apart) launch_gelu_epilogue(g, stream);
}

/* y (rows, n): every row = bias, or zeros when bias is NULL. */
__global__ void fill_rows_kernel(const float *bias, int64_t rows, int64_t n, float *y) {
  TP_GRID_STRIDE_LOOP(i, rows * n) y[i] = bias ? bias[i % n] : 0.0f;
}

static void fill_rows(const float *bias, int64_t rows, int64_t n, float *y, TpCudaStream stream) {
  if (rows * n == 0) return;
  TP_LAUNCH(fill_rows_kernel, tp_elementwise_grid(rows * n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, bias, rows,
            n, y);
}

/* For i < batch, row-major contiguous C_i (M, N) = op(A_i) (M, K) @ op(B_i) (K, N) + beta
 * C_i (tp_sgemm's convention), C_i = C + i M N, A_i = A + i stride_a elements (0: shared),
 * B_i likewise; A and B f32, or bf16 when bf16. With a bias (N; batch 1, beta 0) every
 * row of C adds it. Row-major C is column-major C^T = op(B)^T op(A)^T, and a row-major
 * matrix read as column-major is its transpose: so the column-major call takes B first, A
 * second, with the same transposition flags and no copies (the bias: one per row of C^T). */
static void gemm_row_major_epilogue(TpCudaBlas *blas, bool bf16, bool trans_a, bool trans_b, int64_t M, int64_t N,
                                    int64_t K, const void *A, int64_t stride_a, const void *B, int64_t stride_b,
                                    const float *bias, Epilogue epilogue, float *aux, float beta, float *C,
                                    int64_t batch, TpCudaStream stream) {
  if (M == 0 || N == 0 || batch == 0) return;
  Gemm g = {};
  g.epilogue = epilogue, g.aux = aux;
  g.bf16 = bf16, g.trans_a = trans_b, g.trans_b = trans_a, g.m = N, g.n = M, g.k = K, g.batch = batch;
  g.A = B, g.lda = trans_b ? K : N, g.stride_a = stride_b;
  g.B = A, g.ldb = trans_a ? M : K, g.stride_b = stride_a;
  g.bias = bias, g.beta = beta, g.C = C, g.ldc = N, g.stride_c = M * N;
  if (K == 0) { /* an empty sum; cuBLASLt takes no k of 0 */
    if (beta == 0) fill_rows(bias, batch * M, N, epilogue == EPILOGUE_GELU_AUX ? aux : C, stream);
    if (is_gelu(&g)) launch_gelu_epilogue(&g, stream);
    return;
  }
  run_gemm(blas, &g, stream);
}

static void gemm_row_major(TpCudaBlas *blas, bool bf16, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                           const void *A, int64_t stride_a, const void *B, int64_t stride_b, const float *bias,
                           float beta, float *C, int64_t batch, TpCudaStream stream) {
  gemm_row_major_epilogue(blas, bf16, trans_a, trans_b, M, N, K, A, stride_a, B, stride_b, bias,
                          bias ? EPILOGUE_BIAS : EPILOGUE_NONE, NULL, beta, C, batch, stream);
}

/* the element `index` of an operand array of f32, or of bf16 when `bf16` */
static const void *element(const void *p, bool bf16, int64_t index) {
  return static_cast<const char *>(p) + index * (bf16 ? 2 : 4);
}

/* y = x @ w (+ bias) on f32 or bf16 operands, the bias in the product's epilogue. */
static void linear(TpCudaBlas *blas, bool bf16, const void *x, const void *w, const float *bias, int64_t M,
                   int64_t K, int64_t N, bool transpose_w, float *y, TpCudaStream stream) {
  gemm_row_major(blas, bf16, false, transpose_w, M, N, K, x, 0, w, 0, bias, 0, y, 1, stream);
}

void tp_cuda_launch_linear_gelu(TpCudaBlas *blas, bool bf16, const void *x, const void *w, const float *bias,
                                int64_t M, int64_t K, int64_t N, bool transpose_w, float *pre, float *y,
                                TpCudaStream stream) {
  gemm_row_major_epilogue(blas, bf16, false, transpose_w, M, N, K, x, 0, w, 0, bias, EPILOGUE_GELU_AUX, pre, 0, y, 1,
                          stream);
}

void tp_cuda_launch_linear_f32(TpCudaBlas *blas, const float *x, const float *w, const float *bias, int64_t M,
                               int64_t K, int64_t N, bool transpose_w, float *y, TpCudaStream stream) {
  linear(blas, false, x, w, bias, M, K, N, transpose_w, y, stream);
}

void tp_cuda_launch_linear_bf16(TpCudaBlas *blas, const uint16_t *x, const uint16_t *w, const float *bias, int64_t M,
                                int64_t K, int64_t N, bool transpose_w, float *y, TpCudaStream stream) {
  linear(blas, true, x, w, bias, M, K, N, transpose_w, y, stream);
}

/* The bias gradient: dy's column sums (the CPU's bits). The runs' scratch grows in the
 * stream's order, as tp_cuda_scratch does: after the kernels queued before, no device-wide wait. */
static void column_sums(TpCudaBlas *blas, const float *dy, int64_t M, int64_t N, float *dbias, TpCudaStream stream) {
  size_t bytes = tp_cuda_column_sums_scratch(M, N, 1);
  if (bytes > blas->column_runs_bytes) {
    size_t grown = blas->column_runs_bytes * 2 > bytes ? blas->column_runs_bytes * 2 : bytes;
    if (blas->column_runs) TP_CUDA_CHECK(cudaFreeAsync(blas->column_runs, static_cast<cudaStream_t>(stream)));
    blas->column_runs = NULL;
    TP_CUDA_ALLOC(cudaMallocAsync(&blas->column_runs, grown, static_cast<cudaStream_t>(stream)));
    blas->column_runs_bytes = grown;
  }
  tp_cuda_launch_column_sums_f32(dy, NULL, NULL, NULL, M, N, NULL, dbias, blas->column_runs, stream);
}

/* The two products of tp_linear_backward_f32 on f32 or bf16 operands; with pre, dx is
 * times gelu_tanh'(pre) (the DGELU epilogue). */
static void linear_backward(TpCudaBlas *blas, bool bf16, const void *dy, const void *x, const void *w,
                            const float *pre, int64_t M, int64_t K, int64_t N, bool transpose_w, float *dx,
                            float *dw, TpCudaStream stream) {
  /* dx = dy w^T; dw = x^T dy, or dy^T x when transpose_w */
  if (dx)
    gemm_row_major_epilogue(blas, bf16, false, !transpose_w, M, K, N, dy, 0, w, 0, NULL,
                            pre ? EPILOGUE_DGELU : EPILOGUE_NONE, const_cast<float *>(pre), 0, dx, 1, stream);
  if (!dw) return;
  if (transpose_w) gemm_row_major(blas, bf16, true, false, N, K, M, dy, 0, x, 0, NULL, 0, dw, 1, stream);
  else gemm_row_major(blas, bf16, true, false, K, N, M, x, 0, dy, 0, NULL, 0, dw, 1, stream);
}

void tp_cuda_launch_linear_backward_f32(TpCudaBlas *blas, const float *dy, const float *x, const float *w, int64_t M,
                                        int64_t K, int64_t N, bool transpose_w, float *dx, float *dw, float *dbias,
                                        TpCudaStream stream) {
  linear_backward(blas, false, dy, x, w, NULL, M, K, N, transpose_w, dx, dw, stream);
  if (dbias) column_sums(blas, dy, M, N, dbias, stream);
}

void tp_cuda_launch_linear_backward_bf16(TpCudaBlas *blas, const uint16_t *dy, const uint16_t *x, const uint16_t *w,
                                         const float *dy_f32, int64_t M, int64_t K, int64_t N, bool transpose_w,
                                         float *dx, float *dw, float *dbias, TpCudaStream stream) {
  linear_backward(blas, true, dy, x, w, NULL, M, K, N, transpose_w, dx, dw, stream);
  if (dbias) column_sums(blas, dy_f32, M, N, dbias, stream);
}

void tp_cuda_launch_linear_backward_dgelu(TpCudaBlas *blas, bool bf16, const void *dy, const void *x, const void *w,
                                          const float *dy_f32, const float *pre, int64_t M, int64_t K, int64_t N,
                                          bool transpose_w, float *dx, float *dw, float *dbias,
                                          TpCudaStream stream) {
  /* dw and dbias first: dx may share x's bytes (kernels.def) */
  linear_backward(blas, bf16, dy, x, w, NULL, M, K, N, transpose_w, NULL, dw, stream);
  if (dbias) column_sums(blas, dy_f32, M, N, dbias, stream);
  linear_backward(blas, bf16, dy, x, w, pre, M, K, N, transpose_w, dx, NULL, stream);
}

/* A MatMul's batch as `outer` cuBLASLt calls of `inner` products each: the trailing batch
 * dims over which each operand steps through its matrices one by one (step) or stays on one
 * (broadcast: a stride of 0) are the inner ones, taken as far as that holds; the leading
 * dims are looped over. An operand written by the products (a gradient: a_written,
 * b_written) must step, or the products of one call would write one matrix at once. */
typedef struct {
  int64_t outer, inner;
  bool step_a, step_b;
} BatchSplit;

static BatchSplit split_batch(const TpMatmulLayout *l, bool a_written, bool b_written) {
  int state_a = -1, state_b = -1; /* -1: undecided (dims of 1 so far), else steps */
  int64_t inner = 1;
  for (int i = l->rank - 1; i >= 0; i--) {
    if (l->dims[i] == 1) continue;
    int steps_a = l->sa[i] != 0, steps_b = l->sb[i] != 0;
    if ((state_a >= 0 && steps_a != state_a) || (state_b >= 0 && steps_b != state_b)) break;
    if ((a_written && !steps_a) || (b_written && !steps_b)) break;
    state_a = steps_a, state_b = steps_b;
    inner *= l->dims[i];
  }
  BatchSplit s = {inner ? l->nbatch / inner : 0, inner, state_a == 1, state_b == 1};
  return s;
}

/* tp_matmul's product on f32 or bf16 operands */
static void matmul(TpCudaBlas *blas, bool bf16, const TpMatmulLayout *l, const void *a, const void *b, float *y,
                   TpCudaStream stream) {
  int64_t M = l->M, K = l->K, N = l->N;
  if (l->nb == 1 && l->na == l->nbatch) { /* one shared right operand: fold the batch into M */
    gemm_row_major(blas, bf16, false, false, l->nbatch * M, N, K, a, 0, b, 0, NULL, 0, y, 1, stream);
    return;
  }
  BatchSplit s = split_batch(l, false, false);
  for (int64_t o = 0; o < s.outer; o++) {
    int64_t oa, ob;
    tp_matmul_operands(l, o * s.inner, &oa, &ob);
    gemm_row_major(blas, bf16, false, false, M, N, K, element(a, bf16, oa * M * K), s.step_a ? M * K : 0,
                   element(b, bf16, ob * K * N), s.step_b ? K * N : 0, NULL, 0, y + o * s.inner * M * N, s.inner,
                   stream);
  }
}

/* tp_matmul_backward_f32's products on f32 or bf16 operands */
static void matmul_backward(TpCudaBlas *blas, bool bf16, const TpMatmulLayout *l, const void *dy, const void *a,
                            const void *b, float *da, float *db, TpCudaStream stream) {
  int64_t M = l->M, K = l->K, N = l->N, nbatch = l->nbatch;
  if (l->nb == 1 && l->na == nbatch) { /* one shared b: the batch folds into the rows */
    if (da) gemm_row_major(blas, bf16, false, true, nbatch * M, K, N, dy, 0, b, 0, NULL, 0, da, 1, stream);
    if (db) gemm_row_major(blas, bf16, true, false, K, N, nbatch * M, a, 0, dy, 0, NULL, 0, db, 1, stream);
    return;
  }
  /* An operand broadcast along a batch dim collects the sum of its products, in the order
   * of the batch as on the CPU: one call's products write distinct matrices, and the calls
   * run in the batch's order. */
  bool sum_a = l->na != nbatch, sum_b = l->nb != nbatch;
  if (da) {
    if (sum_a) fill_rows(NULL, l->na * M, K, da, stream);
    BatchSplit s = split_batch(l, true, false);
    for (int64_t o = 0; o < s.outer; o++) { /* da_n = dy_n @ b_n^T */
      int64_t oa, ob;
      tp_matmul_operands(l, o * s.inner, &oa, &ob);
      gemm_row_major(blas, bf16, false, true, M, K, N, element(dy, bf16, o * s.inner * M * N), M * N,
                     element(b, bf16, ob * K * N), s.step_b ? K * N : 0, NULL, sum_a ? 1.0f : 0.0f, da + oa * M * K,
                     s.inner, stream);
    }
  }
  if (db) {
    if (sum_b) fill_rows(NULL, l->nb * K, N, db, stream);
    BatchSplit s = split_batch(l, false, true);
    for (int64_t o = 0; o < s.outer; o++) { /* db_n = a_n^T @ dy_n */
      int64_t oa, ob;
      tp_matmul_operands(l, o * s.inner, &oa, &ob);
      gemm_row_major(blas, bf16, true, false, K, N, M, element(a, bf16, oa * M * K), s.step_a ? M * K : 0,
                     element(dy, bf16, o * s.inner * M * N), M * N, NULL, sum_b ? 1.0f : 0.0f, db + ob * K * N,
                     s.inner, stream);
    }
  }
}

void tp_cuda_launch_matmul_f32(TpCudaBlas *blas, const TpMatmulLayout *l, const float *a, const float *b, float *y,
                               TpCudaStream stream) {
  matmul(blas, false, l, a, b, y, stream);
}

void tp_cuda_launch_matmul_bf16(TpCudaBlas *blas, const TpMatmulLayout *l, const uint16_t *a, const uint16_t *b,
                                float *y, TpCudaStream stream) {
  matmul(blas, true, l, a, b, y, stream);
}

void tp_cuda_launch_matmul_backward_f32(TpCudaBlas *blas, const TpMatmulLayout *l, const float *dy, const float *a,
                                        const float *b, float *da, float *db, TpCudaStream stream) {
  matmul_backward(blas, false, l, dy, a, b, da, db, stream);
}

void tp_cuda_launch_matmul_backward_bf16(TpCudaBlas *blas, const TpMatmulLayout *l, const uint16_t *dy,
                                         const uint16_t *a, const uint16_t *b, float *da, float *db,
                                         TpCudaStream stream) {
  matmul_backward(blas, true, l, dy, a, b, da, db, stream);
}
