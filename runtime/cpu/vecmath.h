/* Float exp, tanh and erf written so that `omp simd` loops vectorise them (glibc's expf,
 * tanhf, erff are opaque calls, one element at a time). Internal to runtime/cpu. */
#ifndef TOKPIPE_CPU_VECMATH_H
#define TOKPIPE_CPU_VECMATH_H

#include <stdint.h>
#include <string.h>

/* e^x within 1 ulp for -87 <= x <= 88 (Cephes' polynomial after the reduction
 * x = n ln2 + r); 0 below, e^88 above (callers pass x <= 0, or want saturation). */
static inline float tp_vexpf(float x) {
  x = x < -88.0f ? -88.0f : x > 88.0f ? 88.0f : x;
  const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
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
static inline float tp_vtanhf(float x) { return 1.0f - 2.0f / (tp_vexpf(2.0f * x) + 1.0f); }

/* erf(x) within about 2e-7 absolute (Abramowitz and Stegun 7.1.26). */
static inline float tp_verff(float x) {
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

#endif
