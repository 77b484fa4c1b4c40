/* Element functions: the formulas of the activations and unary ops on one element, written
 * once for both targets. The CPU kernels (C) call them in their loops, the CUDA kernels
 * (nvcc, or the emulated build's host C++) in their threads; each is inlined, so a loop
 * over one op keeps its vectorisation.
 *
 * The float forms compute on the target's float math (TP_EXPF, TP_ERFF, TP_ERFCF,
 * TP_TANHF): runtime/cpu/vecmath.h's vectorisable functions on the CPU, libm's expf, erff,
 * erfcf and tanhf on CUDA (each within a few ulp of the other). The double forms (f64, and
 * f16 and bf16, which compute in double) use libm's double functions on both. AdamW's
 * element is float arithmetic (and a square root) rounded step by step (TP_FMUL_RN below),
 * the same bits on both. */
#ifndef TOKPIPE_KERNELS_ELEMENT_H
#define TOKPIPE_KERNELS_ELEMENT_H

#include <math.h>
#include <stdint.h>

#include "../../base/host_device.h"
#include "args.h" /* TpUnaryOp */

#ifdef __cplusplus /* the CUDA kernels */
#define TP_ELEMENT TP_HOST_DEVICE static inline
#define TP_EXPF expf
#define TP_ERFF erff
#define TP_ERFCF erfcf
#define TP_TANHF tanhf
#else
#include "../cpu/vecmath.h"
/* always_inline: inlined before a TP_VECTOR_CLONES loop is cloned (vecmath.h says why) */
#define TP_ELEMENT TP_VECTOR_INLINE
#define TP_EXPF tp_vexpf
#define TP_ERFF tp_verff
#define TP_ERFCF tp_verfcf
#define TP_TANHF tp_vtanhf
#endif

/* ---- Gelu: x Phi(x), and its tanh approximation x (1 + tanh u) / 2 with
 * u = sqrt(2/pi) (x + 0.044715 x^3) ---- */
#define TP_GELU_SQRT1_2 0.70710678118654752440    /* 1 / sqrt 2 */
#define TP_GELU_SQRT_2_OVER_PI 0.7978845608028654 /* sqrt(2 / pi) */
#define TP_GELU_INV_SQRT_2PI 0.3989422804014327   /* 1 / sqrt(2 pi) */
#define TP_GELU_KAPPA 0.044715

/* The plain forms, in double. */
TP_ELEMENT double tp_gelu_f64(double x) { return 0.5 * x * (1 + erf(x * TP_GELU_SQRT1_2)); }
TP_ELEMENT double tp_gelu_tanh_f64(double x) {
  return 0.5 * x * (1 + tanh(TP_GELU_SQRT_2_OVER_PI * (x + TP_GELU_KAPPA * x * x * x)));
}

/* The float forms, without cancellation for negative x: x Phi(x) = x erfc(-x / sqrt 2) / 2
 * and x (1 + tanh u) / 2 = x / (1 + e^-2u). */
TP_ELEMENT float tp_gelu_f32(float x) { return 0.5f * x * TP_ERFCF(x * -(float)TP_GELU_SQRT1_2); }
TP_ELEMENT float tp_gelu_tanh_f32(float x) {
  float u = (float)TP_GELU_SQRT_2_OVER_PI * (x + (float)TP_GELU_KAPPA * x * x * x);
  return x / (1.0f + TP_EXPF(-2.0f * u));
}

/* d gelu / dx = Phi(x) + x phi(x) */
TP_ELEMENT float tp_gelu_grad_f32(float x) {
  float cdf = 0.5f * (1 + TP_ERFF(x * (float)TP_GELU_SQRT1_2));
  float pdf = (float)TP_GELU_INV_SQRT_2PI * TP_EXPF(-0.5f * x * x);
  return cdf + x * pdf;
}
/* d gelu_tanh / dx = (1 + t) / 2 + x (1 - t^2) u' / 2, t = tanh u */
TP_ELEMENT float tp_gelu_tanh_grad_f32(float x) {
  const float c = (float)TP_GELU_SQRT_2_OVER_PI, k = (float)TP_GELU_KAPPA;
  float x2 = x * x;
  float t = TP_TANHF(c * (x + k * x2 * x));
  return 0.5f * (1 + t) + 0.5f * x * (1 - t * t) * c * (1 + 3 * k * x2);
}

/* ---- SwiGLU: silu(gate) * up = gate * sigmoid(gate) * up ---- */
TP_ELEMENT float tp_logistic_f32(float x) { return 1.0f / (1.0f + TP_EXPF(-x)); }
TP_ELEMENT float tp_swiglu_elem_f32(float gate, float up) { return gate * tp_logistic_f32(gate) * up; }
/* the gradients given s = tp_logistic_f32(gate) */
TP_ELEMENT float tp_swiglu_dgate_f32(float dy, float gate, float up, float s) {
  return dy * up * s * (1 + gate * (1 - s));
}
TP_ELEMENT float tp_swiglu_dup_f32(float dy, float gate, float s) { return dy * gate * s; }

/* ---- float operations rounded one at a time ----
 * nvcc fuses a product and the sum that reads it into one FMA, rounded once (-fmad=true,
 * its default), where the CPU build rounds both (runtime/cpu/optim.c is compiled without
 * contraction). A formula that must give the CPU's bits on a GPU spells its operations with
 * these: on the device the intrinsics nvcc never fuses (and which stay IEEE-rounded under
 * -use_fast_math); in host C++ (the emulated build, contracted as nvcc does) a product
 * hidden from the optimiser behind an empty asm, so that it is rounded before a sum reads
 * it; in C the operators. */
#if defined(__CUDA_ARCH__)
#define TP_FMUL_RN(a, b) __fmul_rn(a, b)
#define TP_FADD_RN(a, b) __fadd_rn(a, b)
#define TP_FDIV_RN(a, b) __fdiv_rn(a, b)
#define TP_FSQRT_RN(a) __fsqrt_rn(a)
#else
#ifdef __cplusplus
TP_ELEMENT float tp_rounded_f32(float x) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__("" : "+x"(x));
#elif defined(__aarch64__)
  __asm__("" : "+w"(x));
#else
  volatile float opaque = x;
  x = opaque;
#endif
  return x;
}
#define TP_FMUL_RN(a, b) tp_rounded_f32((a) * (b))
#else
#define TP_FMUL_RN(a, b) ((a) * (b))
#endif
#define TP_FADD_RN(a, b) ((a) + (b))
#define TP_FDIV_RN(a, b) ((a) / (b))
#define TP_FSQRT_RN(a) sqrtf(a)
#endif

/* ---- AdamW (tp_adamw_step, runtime/cpu/optim.h) ---- */

/* tp_adamw_step's scalar factors, computed in double and rounded to float once. */
typedef struct {
  float decay, b1, a1, b2, a2, neg_step_size, bc2_sqrt, eps;
} TpAdamWFactors;
static inline TpAdamWFactors tp_adamw_factors(double lr, double beta1, double beta2, double eps, double weight_decay,
                                              int64_t step) {
  TpAdamWFactors f; /* assigned, not designated: C++ (runtime/cuda) reads this too */
  f.decay = (float)(1 - lr * weight_decay);
  f.b1 = (float)beta1;
  f.a1 = (float)(1 - beta1);
  f.b2 = (float)beta2;
  f.a2 = (float)(1 - beta2);
  f.neg_step_size = (float)-(lr / (1 - pow(beta1, (double)step)));
  f.bc2_sqrt = (float)sqrt(1 - pow(beta2, (double)step));
  f.eps = (float)eps;
  return f;
}

/* tp_adamw_step's per-element float work on element i, in its order of operations, each
 * operation rounded (nothing fused into an FMA), the same bits on the host and the device:
 *   w = w decay + neg_step_size m / (sqrt(v) / bc2_sqrt + eps)
 *   m = m b1 + a1 g,  v = v b2 + (a2 g) g  (the new m and v) */
TP_ELEMENT void tp_adamw_element(float *w, const float *g, float *m, float *v, int64_t i, TpAdamWFactors f) {
  float wi = TP_FMUL_RN(w[i], f.decay), gi = g[i];
  float mi = TP_FADD_RN(TP_FMUL_RN(m[i], f.b1), TP_FMUL_RN(f.a1, gi));
  float vi = TP_FADD_RN(TP_FMUL_RN(v[i], f.b2), TP_FMUL_RN(TP_FMUL_RN(f.a2, gi), gi));
  float denom = TP_FADD_RN(TP_FDIV_RN(TP_FSQRT_RN(vi), f.bc2_sqrt), f.eps);
  w[i] = TP_FADD_RN(wi, TP_FDIV_RN(TP_FMUL_RN(f.neg_step_size, mi), denom));
  m[i] = mi;
  v[i] = vi;
}

/* ---- the unary ops of tp_unary on one float or double (not Not, which is bool) ----
 * TP_UNARY_ELEMENT(T, suffix, M) defines tp_unary_<suffix>(op, x), M(f) naming T's libm
 * function f (sqrtf or sqrt). Gelu is the float or double form above. Called with a
 * constant op (the CPU's loop per op), the switch folds away. */
#define TP_UNARY_ELEMENT(T, suffix, M)                                                                              \
  TP_ELEMENT T tp_unary_##suffix(TpUnaryOp op, T x) {                                                               \
    const T one = 1;                                                                                                \
    switch (op) {                                                                                                   \
    case TP_UNARY_SQRT: return M(sqrt)(x);                                                                          \
    case TP_UNARY_NEG: return -x;                                                                                   \
    case TP_UNARY_RECIPROCAL: return one / x;                                                                       \
    case TP_UNARY_EXP: return M(exp)(x);                                                                            \
    case TP_UNARY_LOG: return M(log)(x);                                                                            \
    case TP_UNARY_ERF: return M(erf)(x);                                                                            \
    case TP_UNARY_TANH: return M(tanh)(x);                                                                          \
    case TP_UNARY_SIN: return M(sin)(x);                                                                            \
    case TP_UNARY_COS: return M(cos)(x);                                                                            \
    case TP_UNARY_RELU: return x < 0 ? 0 : x; /* keeps NaN */                                                       \
    case TP_UNARY_SIGMOID: {                  /* exp of a non-positive argument only: no overflow */                \
      T e = M(exp)(-M(fabs)(x));                                                                                    \
      return x >= 0 ? one / (one + e) : e / (one + e);                                                              \
    }                                                                                                               \
    case TP_UNARY_GELU: return tp_gelu_##suffix(x);                                                                 \
    case TP_UNARY_GELU_TANH: return tp_gelu_tanh_##suffix(x);                                                       \
    default: return x; /* Not: bool only */                                                                         \
    }                                                                                                               \
  }
#define TP_MATH_F32(fn) fn##f
#define TP_MATH_F64(fn) fn
TP_UNARY_ELEMENT(float, f32, TP_MATH_F32)
TP_UNARY_ELEMENT(double, f64, TP_MATH_F64)
#undef TP_UNARY_ELEMENT

#endif
