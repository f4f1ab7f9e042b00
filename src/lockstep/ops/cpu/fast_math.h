// Branch-free float exp, tanh and normal CDF that the compiler turns into SIMD loops (glibc's
// scalar expf/tanhf/erfcf would keep the activation and softmax kernels scalar). Accurate to
// a few ulp over the whole float range, with inf/nan behaving like libm. Double precision
// uses libm: it is the reference and gradient-check type, not the fast path.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace lockstep::cpu {

// e^(hi + lo) with |lo| < 1. hi + lo = n·ln2 + r with |r| <= ln2/2, where lo joins r only
// after hi's reduction, so its digits survive however large hi is. e^r by its degree-7
// Taylor polynomial (truncation error 5e-9 relative); 2^n applied as two factors so results
// down to the subnormals and up to overflow come out right. Within 1 ulp of libm's expf.
inline float exp_sum_f32(float hi, float lo) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // 16 significant bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = 1.428606765330187e-6f;
  // Only v is clamped (so the integer conversion below is always defined): above the range
  // the polynomial only grows and the product overflows to inf as it should; below it, and
  // for nan, the select at the end answers. Few selects keep GCC's vector code short.
  const float sum = hi + lo;
  float v = sum * kLog2e;
  v = v > -151.0f ? v : -151.0f;
  v = v < 130.0f ? v : 130.0f;
  // Round to nearest by adding and removing 1.5·2^23 (std::floor does not vectorize unless
  // -fno-trapping-math); exact for |v| < 2^22.
  constexpr float kRound = 12582912.0f;
  const float n = (v + kRound) - kRound;
  const float r = ((hi - n * kLn2Hi) + lo) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t k = static_cast<int32_t>(n);
  const int32_t k1 = k >> 1, k2 = k - k1;  // each in [-76, 65]
  const float s1 = std::bit_cast<float>((k1 + 127) << 23);
  const float s2 = std::bit_cast<float>((k2 + 127) << 23);
  const float result = p * s1 * s2;
  // e^-104 is below half the smallest subnormal: 0.
  return sum >= -104.0f ? result : (sum != sum ? sum : 0.0f);
}

inline float exp_f32(float x) { return exp_sum_f32(x, 0.0f); }

// e^(extra - a²/2) for finite a >= 0, with a² split exactly into hi + lo, so the rounding of
// a² (an absolute error of up to 1e-6 in the exponent near a = 6) does not reach the result.
// |extra| < 1.
inline float exp_neg_half_square_finite(float a, float extra) {
  const float hi = a * a;
#if defined(__FMA__)
  const float lo = std::fma(a, a, -hi);
#else
  const float split = 4097.0f * a;  // Veltkamp: a = ah + al with 12-bit halves
  const float ah = split - (split - a), al = a - ah;
  const float lo = ((ah * ah - hi) + 2.0f * ah * al) + al * al;
#endif
  return exp_sum_f32(-0.5f * hi, extra - 0.5f * lo);
}

// e^(-x²/2).
inline float exp_neg_half_square_f32(float x) {
  const float ax = std::fabs(x);
  const float a = ax < 15.0f ? ax : 15.0f;  // e^-112.5 is 0 in float; also maps nan to 15
  const float result = exp_neg_half_square_finite(a, 0.0f);
  return x != x ? x : result;
}

// tanh: odd Taylor series to x^13 below |x| = 0.4 (error < 5e-9 relative), else
// 1 - 2 / (e^{2|x|} + 1), which is exact in its subtraction there.
inline float tanh_f32(float x) {
  const float ax = std::fabs(x);
  const float z = x * x;
  float p = -929569.0f / 638512875.0f;
  p = p * z + 21844.0f / 6081075.0f;
  p = p * z - 1382.0f / 155925.0f;
  p = p * z + 62.0f / 2835.0f;
  p = p * z - 17.0f / 315.0f;
  p = p * z + 2.0f / 15.0f;
  p = p * z - 1.0f / 3.0f;
  const float small = x + x * z * p;
  const float large = 1.0f - 2.0f / (exp_f32(2.0f * ax) + 1.0f);
  const float signed_large = x < 0.0f ? -large : large;
  return ax < 0.4f ? small : signed_large;
}

// Phi(x) = P(N(0,1) <= x). For |x| < 1, 1/2 + x·P(x²) with P the Taylor series of
// erf(x/√2)/(2x) to x^16 (truncation 1e-10). Beyond, through erfc(z), z = |x|/√2, written
// as t · e^(-z²) · e^q(t) with t = 1 / (1 + z/2) (the substitution of Numerical Recipes'
// erfcc); q is a degree-10 Chebyshev interpolant of log(erfc(z)/t) + z² on t in [1/6, 1]
// (z in [0, 10]; the clamp's 10.25 only ever gives 0), in powers of u = 2.4t - 1.4, fitted
// in double: relative error 1e-8, so the lower tail keeps its relative accuracy (x·Phi(x)
// does not round to 0 near x = -5). x·Phi(x), measured against libm over the floats in
// [-13, 10]: within 6 ulp.
inline float normal_cdf_f32(float x) {
  const float s = x * x;
  float c = 2.273529824e-09f;
  c = c * s - 4.122667415e-08f;
  c = c * s + 6.659693516e-07f;
  c = c * s - 9.444656260e-06f;
  c = c * s + 1.154346876e-04f;
  c = c * s - 1.187328215e-03f;
  c = c * s + 9.973557010e-03f;
  c = c * s - 6.649038007e-02f;
  c = c * s + 3.989422804e-01f;
  const float near_zero = 0.5f + x * c;

  constexpr float kRsqrt2 = 0.707106781186547524f;
  const float ax = std::fabs(x);
  // Past |x| = 14.5 the exponent is below -104 and the tail is exactly 0; also maps nan there.
  const float a = ax < 14.5f ? ax : 14.5f;
  const float z = a * kRsqrt2;
  const float t = 1.0f / (1.0f + 0.5f * z);
  const float u = 2.4f * t - 1.4f;
  float q = -2.413217420e-05f;
  q = q * u + 5.488488707e-05f;
  q = q * u + 1.330719282e-04f;
  q = q * u - 5.343771746e-04f;
  q = q * u - 2.787787610e-04f;
  q = q * u + 3.707520304e-03f;
  q = q * u - 1.044538672e-03f;
  q = q * u - 2.947034941e-02f;
  q = q * u + 1.574494621e-02f;
  q = q * u + 5.703071040e-01f;
  q = q * u - 5.585953511e-01f;
  const float half_erfc = 0.5f * t * exp_neg_half_square_finite(a, q);
  const float tail = x > 0.0f ? 1.0f - half_erfc : half_erfc;
  return ax < 1.0f ? near_zero : tail;
}

// The same functions for float (fast, above) and double (libm).
template <typename T>
inline T exp_fast(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return exp_f32(x);
  } else {
    return std::exp(x);
  }
}

// e^(-x²/2), the unnormalized standard normal density.
template <typename T>
inline T gauss_fast(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return exp_neg_half_square_f32(x);
  } else {
    return std::exp(-0.5 * x * x);
  }
}

template <typename T>
inline T tanh_fast(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return tanh_f32(x);
  } else {
    return std::tanh(x);
  }
}

template <typename T>
inline T normal_cdf(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return normal_cdf_f32(x);
  } else {
    return 0.5 * std::erfc(-x * 0.707106781186547524);
  }
}

}  // namespace lockstep::cpu
