/* Float exp, tanh, erf and erfc written so that `omp simd` loops vectorise them (glibc's
 * expf, tanhf, erff are opaque calls, one element at a time). Internal to runtime/cpu. */
#ifndef TOKPIPE_CPU_VECMATH_H
#define TOKPIPE_CPU_VECMATH_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* On x86-64 Linux a loop function marked TP_VECTOR_CLONES is compiled twice, for the
 * baseline (SSE2, 4 floats a step) and for AVX2 + FMA (x86-64-v3, 8 floats), and the CPU
 * picks one at load time (an ifunc). The exp-heavy kernels run about twice as fast on the
 * second; the build itself stays portable. Mark a function that loops over rows; what it
 * calls is inlined into both copies only if inlined before the copying (after, the
 * targets differ): hence the helpers here, and any in the loop, are always_inline.
 * -DTP_VECTOR_CLONES= builds the baseline copy alone (to test it on an AVX2 machine). */
#ifndef TP_VECTOR_CLONES
#if defined(__x86_64__) && defined(__linux__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define TP_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
#endif
#endif
#ifndef TP_VECTOR_CLONES
#define TP_VECTOR_CLONES
#endif
#define TP_VECTOR_INLINE __attribute__((always_inline)) static inline

/* The largest of x[0], x[stride], ... x[(n-1)*stride], -inf when n is 0 or every element
 * is -inf (a fully masked row). The vector reduction's lanes start at the type's lowest
 * value, which clang takes as -FLT_MAX (GCC as -inf): a row of -inf would give -FLT_MAX,
 * so that one result is checked again element by element. */
TP_VECTOR_INLINE float tp_row_max(const float *x, int64_t n, int64_t stride) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; j++) mx = x[j * stride] > mx ? x[j * stride] : mx;
  if (mx == -FLT_MAX) {
    mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) mx = x[j * stride] > mx ? x[j * stride] : mx;
  }
  return mx;
}

/* e^x within 1 ulp for -87 <= x <= 88 (Cephes' polynomial after the reduction
 * x = n ln2 + r); 0 below -88, +inf above 88.37 (expf overflows above 88.72). The upper
 * bound matters: GCC computes a vector loop's code for each clamped constant in every
 * lane, and a subnormal result there (x / (1 + e^88), say) costs a microcode assist per
 * lane, many times the whole loop body; x / (1 + inf) is a plain 0. */
TP_VECTOR_INLINE float tp_vexpf(float x) {
  x = x < -88.0f ? -88.0f : x > 89.0f ? 89.0f : x; /* n = 128 above 88.37: 2^n is +inf */
  const float shifter = 12582912.0f;               /* 1.5 * 2^23: adding it rounds to an integer */
  float n = (x * 1.44269504088896341f + shifter) - shifter;
  float r = x - n * 0.693359375f; /* ln2 in two parts: the first is exact times n */
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * (r * r) + r + 1.0f;
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* 2^n; n = -127 gives 0 */
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

/* tanh(x) = 1 - 2 / (e^2x + 1), within about 1e-7 absolute. */
TP_VECTOR_INLINE float tp_vtanhf(float x) { return 1.0f - 2.0f / (tp_vexpf(2.0f * x) + 1.0f); }

/* erf(x) within about 2e-7 absolute (Abramowitz and Stegun 7.1.26). */
TP_VECTOR_INLINE float tp_verff(float x) {
  float a = x < 0 ? -x : x;
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  float e = 1.0f - p * t * tp_vexpf(-a * a);
  return x < 0 ? -e : e;
}

/* erfc(x) within 2e-6 relative up to x = 4.5 and 1e-5 beyond (the Chebyshev fit of
 * Numerical Recipes' erfcc, 1.2e-7, evaluated in float: the rounding of z^2 grows in the
 * tail). No cancellation where 1 - erf(x) loses every digit. */
TP_VECTOR_INLINE float tp_verfcf(float x) {
  float z = x < 0 ? -x : x;
  float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  float r = t * tp_vexpf(p - z * z);
  return x < 0 ? 2.0f - r : r;
}

#endif
