#include "matmul.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <string.h>

/* Products smaller than this many multiply-adds are one OpenBLAS call. */
#define PARALLEL_MIN_MACS (1 << 19)
/* Larger ones are cut into pieces of rows (or columns) that depend on the shape alone: up to
 * MAX_PIECES, each a multiple of PIECE_ALIGN (OpenBLAS's kernels work in blocks of up to 16)
 * and at least PIECE_MIN. Threads take pieces as they come free, so a thread the system
 * preempts holds up little. Each piece packs the other operand again, about 1/PIECE_MIN of
 * its work, hence no smaller pieces. */
#define MAX_PIECES 16
#define PIECE_ALIGN 16
#define PIECE_MIN 256

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_threaded(void) { openblas_set_num_threads(1); }

static void sgemm_piece(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
              (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

/* One thread pool: the product is split over OpenMP's threads into row (or column) pieces,
 * each a single-threaded OpenBLAS call. OpenBLAS's own threads would sit beside OpenMP's,
 * each pool spinning while the other works, and fight over the cores.
 * The bits of C do not depend on the thread count: the pieces are cut from the shape alone
 * and one thread runs them all the same way. (OpenBLAS computes an element differently in
 * calls of different shapes on some CPUs and core types, e.g. AMD Zen with the Haswell
 * kernels, so pieces cut per thread count would not give the same bits.) */
void tp_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
              const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  pthread_once(&blas_once, blas_single_threaded);
  if (M * N * K < PARALLEL_MIN_MACS) {
    sgemm_piece(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  bool by_rows = M >= N; /* split the longer side */
  int64_t len = by_rows ? M : N;
  int64_t piece = (len + MAX_PIECES - 1) / MAX_PIECES;
  piece = (piece + PIECE_ALIGN - 1) / PIECE_ALIGN * PIECE_ALIGN;
  if (piece < PIECE_MIN) piece = PIECE_MIN;
  int pieces = (int)((len + piece - 1) / piece);
  int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic) num_threads(pieces < threads ? pieces : threads)
  for (int t = 0; t < pieces; t++) {
    int64_t lo = t * piece, n = len - lo < piece ? len - lo : piece;
    if (by_rows)
      sgemm_piece(trans_a, trans_b, n, N, K, alpha, trans_a ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc,
                  ldc);
    else
      sgemm_piece(trans_a, trans_b, M, n, K, alpha, A, lda, trans_b ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
  }
}

/* Integer elements are read and written through int64 (uint64 wraps the same way). */
static int64_t load_int(const void *p, TpDType t, int64_t i) {
  switch (t) {
  case TP_I32: return ((const int32_t *)p)[i];
  case TP_U32: return ((const uint32_t *)p)[i];
  case TP_I64: return ((const int64_t *)p)[i];
  case TP_U64: return (int64_t)((const uint64_t *)p)[i];
  default: return 0;
  }
}

static void store_int(void *p, TpDType t, int64_t i, int64_t v) {
  switch (t) {
  case TP_I32: ((int32_t *)p)[i] = (int32_t)v; break;
  case TP_U32: ((uint32_t *)p)[i] = (uint32_t)v; break;
  case TP_I64: ((int64_t *)p)[i] = v; break;
  case TP_U64: ((uint64_t *)p)[i] = (uint64_t)v; break;
  default: break;
  }
}

static bool gemm_dtype_ok(TpDType t) {
  return t == TP_F32 || t == TP_F64 || t == TP_I32 || t == TP_I64 || t == TP_U32 || t == TP_U64;
}

/* One matrix product of any supported dtype; element offsets a0, b0, c0 into the buffers. */
static void gemm_any(TpDType t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                     int64_t a0, int64_t lda, const void *B, int64_t b0, int64_t ldb, double beta, void *C,
                     int64_t c0, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (t == TP_F32) {
    tp_sgemm(ta, tb, M, N, K, (float)alpha, (const float *)A + a0, lda, (const float *)B + b0, ldb, (float)beta,
             (float *)C + c0, ldc);
  } else if (t == TP_F64) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M,
                (blasint)N, (blasint)K, alpha, (const double *)A + a0, (blasint)lda, (const double *)B + b0,
                (blasint)ldb, beta, (double *)C + c0, (blasint)ldc);
  } else {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        int64_t acc = 0;
        for (int64_t k = 0; k < K; k++) {
          int64_t ai = ta ? k * lda + i : i * lda + k, bi = tb ? j * ldb + k : k * ldb + j;
          acc += load_int(A, t, a0 + ai) * load_int(B, t, b0 + bi);
        }
        int64_t ci = c0 + i * ldc + j;
        double v = alpha * (double)acc + (beta != 0 ? beta * (double)load_int(C, t, ci) : 0);
        store_int(C, t, ci, alpha == 1 && beta == 0 ? acc : (int64_t)v);
      }
  }
}

TpKernelStatus tp_matmul(const TpTensor *a, const TpTensor *b, TpTensor *y) {
  if (a->dtype != b->dtype || a->dtype != y->dtype || !gemm_dtype_ok(a->dtype)) return TP_KERNEL_BAD_DTYPE;
  TpMatmulLayout l;
  TpKernelStatus s = tp_check_matmul_shape(a, b, y, &l);
  if (s != TP_KERNEL_OK) return s;
  int64_t M = l.M, K = l.K, N = l.N;
  if (K == 0 || l.nbatch == 0) { /* empty sum, or nothing to compute */
    memset(y->data, 0, tp_tensor_bytes(y));
    return TP_KERNEL_OK;
  }

  TpDType t = a->dtype;
  if (l.nb == 1 && l.na == l.nbatch) { /* one shared right operand: fold the batch into M */
    gemm_any(t, false, false, l.nbatch * M, N, K, 1, a->data, 0, K, b->data, 0, N, 0, y->data, 0, N);
    return TP_KERNEL_OK;
  }
  for (int64_t n = 0; n < l.nbatch; n++) {
    int64_t oa, ob;
    tp_matmul_operands(&l, n, &oa, &ob);
    gemm_any(t, false, false, M, N, K, 1, a->data, oa * M * K, K, b->data, ob * K * N, N, 0, y->data, n * M * N, N);
  }
  return TP_KERNEL_OK;
}

TpKernelStatus tp_gemm(const TpTensor *a, const TpTensor *b, const TpTensor *c, bool trans_a, bool trans_b,
                       double alpha, double beta, TpTensor *y) {
  TpDType t = a->dtype;
  if (b->dtype != t || y->dtype != t || (c && c->dtype != t) || !gemm_dtype_ok(t)) return TP_KERNEL_BAD_DTYPE;
  TpGemmShape g;
  TpKernelStatus s = tp_check_gemm_shape(a, b, c, trans_a, trans_b, beta, y, &g);
  if (s != TP_KERNEL_OK) return s;
  int64_t M = g.M, K = g.K, N = g.N, cm = g.cm, cn = g.cn;

  size_t es = tp_dtype_size(t);
  if (g.with_c) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        int64_t ci = (cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j);
        memcpy((char *)y->data + (size_t)(i * N + j) * es, (const char *)c->data + (size_t)ci * es, es);
      }
  } else {
    memset(y->data, 0, tp_tensor_bytes(y));
    beta = 0;
  }
  if (K == 0) { /* empty sum: y = beta * c */
    for (int64_t i = 0; i < M * N; i++) {
      if (t == TP_F32) ((float *)y->data)[i] *= (float)beta;
      else if (t == TP_F64) ((double *)y->data)[i] *= beta;
      else store_int(y->data, t, i, (int64_t)(beta * (double)load_int(y->data, t, i)));
    }
    return TP_KERNEL_OK;
  }
  gemm_any(t, trans_a, trans_b, M, N, K, alpha, a->data, 0, a->dims[1], b->data, 0, b->dims[1], beta, y->data, 0, N);
  return TP_KERNEL_OK;
}
