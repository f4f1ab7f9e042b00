// Element types. f32 and f64 are computed on every device; bf16 and f16 are storage types
// converted to f32 for compute on CPU; i32/i64/u8 hold labels, indices and masks.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/core/half_bits.h"

namespace lockstep {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "f32", ...
// The safetensors spelling ("F32", "BF16", "I64", ...).
const char* dtype_safetensors_name(DType dtype);
// Accepts our names and the safetensors ones; throws Error naming the accepted values.
DType parse_dtype(const std::string& name);
bool is_floating(DType dtype);

// bf16 (the top 16 bits of an f32, rounded to nearest even) and IEEE 754 binary16, with
// subnormals, infinities and NaN payloads: core/half_bits.h, shared with the GPU kernels.
inline uint16_t f32_to_bf16(float value) { return half_bits::f32_to_bf16(value); }
inline float bf16_to_f32(uint16_t value) { return half_bits::bf16_to_f32(value); }
inline uint16_t f32_to_f16(float value) { return half_bits::f32_to_f16(value); }
inline float f16_to_f32(uint16_t value) { return half_bits::f16_to_f32(value); }

}  // namespace lockstep

namespace lockstep {

// The DType of a C++ element type (for typed access and factories).
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}

// Converts n contiguous elements between any two dtypes (via double for integers,
// f32 for the 16-bit floats).
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);

}  // namespace lockstep
