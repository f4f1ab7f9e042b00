// Float -> integer conversion, one definition for the CPU and the GPU kernels (nvcc compiles
// it for both), so a tensor converted on either device holds the same integers: truncated
// toward zero, saturated at the integer type's bounds, NaN to 0. That is what the GPU's
// cvt.rzi.sat gives; on the CPU a plain static_cast of an out-of-range value is undefined
// (x86 wraps it to INT_MIN). C++17, for nvcc.
#pragma once

#include <cstdint>

#include "lockstep/core/half_bits.h"  // LOCKSTEP_HOST_DEVICE

namespace lockstep {

template <typename Int>
struct IntegerBounds;
template <>
struct IntegerBounds<uint8_t> {
  static constexpr uint8_t lowest = 0, highest = 255;
};
template <>
struct IntegerBounds<int32_t> {
  static constexpr int32_t lowest = -2147483647 - 1, highest = 2147483647;
};
template <>
struct IntegerBounds<int64_t> {
  static constexpr int64_t lowest = -9223372036854775807LL - 1, highest = 9223372036854775807LL;
};

// The bounds as Float round up in magnitude where Float cannot hold them (2^31 - 1 as a
// float is 2^31), so `>=` and `<=` against them decide saturation exactly.
template <typename Int, typename Float>
LOCKSTEP_HOST_DEVICE inline Int float_to_integer(Float value) {
  if (value != value) return 0;
  if (value <= static_cast<Float>(IntegerBounds<Int>::lowest)) return IntegerBounds<Int>::lowest;
  if (value >= static_cast<Float>(IntegerBounds<Int>::highest)) return IntegerBounds<Int>::highest;
  return static_cast<Int>(value);
}

}  // namespace lockstep
