// bf16 and f16 <-> f32 conversions as bit manipulations, one definition for the CPU and the
// GPU kernels (nvcc compiles them for both), so a tensor converted on either device has the
// same bits: round to nearest even, subnormals, infinities, and NaNs that keep their sign
// and payload (CUDA's own __float2half_rn and __half2float make every NaN canonical).
// C++17, for nvcc.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LOCKSTEP_HOST_DEVICE __host__ __device__
#else
#define LOCKSTEP_HOST_DEVICE
#endif

namespace lockstep::half_bits {

LOCKSTEP_HOST_DEVICE inline uint32_t of_float(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
#endif
}

LOCKSTEP_HOST_DEVICE inline float to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
#endif
}

// bf16: the top 16 bits of an f32, rounded to nearest even (a NaN stays a quiet NaN).
LOCKSTEP_HOST_DEVICE inline uint16_t f32_to_bf16(float value) {
  uint32_t bits = of_float(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

LOCKSTEP_HOST_DEVICE inline float bf16_to_f32(uint16_t value) { return to_float(static_cast<uint32_t>(value) << 16); }

// IEEE 754 binary16.
LOCKSTEP_HOST_DEVICE inline uint16_t f32_to_f16(float value) {
  const uint32_t bits = of_float(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf (incl. rounding up)
  if (abs < 0x38800000u) {
    // Subnormal or zero in f16: shift the full mantissa into place, round to nearest even.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // keeps a 10-bit result
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits.
  uint32_t rounded = abs - 0x38000000u;
  rounded += 0xfffu + ((rounded >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

LOCKSTEP_HOST_DEVICE inline float f16_to_f32(uint16_t value) {
  const uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  const uint32_t exponent = (value >> 10) & 0x1fu;
  uint32_t mantissa = value & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    // Subnormal: normalize.
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((mantissa & 0x3ffu) << 13);
  }
  return to_float(bits);
}

}  // namespace lockstep::half_bits
