#include "lockstep/core/dtype.h"

#include <algorithm>
#include <type_traits>

#include "lockstep/core/error.h"
#include "lockstep/core/float_to_integer.h"

namespace lockstep {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
  }
  return "?";
}

const char* dtype_safetensors_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
    if (name == dtype_name(d) || name == dtype_safetensors_name(d)) return d;
  }
  if (name == "float32" || name == "float") return DType::f32;
  if (name == "float64" || name == "double") return DType::f64;
  if (name == "bfloat16") return DType::bf16;
  if (name == "float16" || name == "half") return DType::f16;
  LOCKSTEP_FAIL() << "unknown dtype '" << name << "': expected one of f32, f64, bf16, f16, i32, i64, u8";
  return DType::f32;
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16;
}

}  // namespace lockstep

namespace lockstep {
namespace {

// A floating value as Dst holds it: integers truncate and saturate (float_to_integer.h).
template <typename Dst, typename Float>
Dst from_floating(Float value) {
  if constexpr (std::is_integral_v<Dst>) {
    return float_to_integer<Dst>(value);
  } else {
    return static_cast<Dst>(value);
  }
}

template <typename Dst>
void convert_to(const void* src, DType src_dtype, Dst* dst, int64_t n) {
  switch (src_dtype) {
    case DType::f32: {
      auto* s = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = from_floating<Dst>(s[i]);
      break;
    }
    case DType::f64: {
      auto* s = static_cast<const double*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = from_floating<Dst>(s[i]);
      break;
    }
    case DType::bf16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = from_floating<Dst>(bf16_to_f32(s[i]));
      break;
    }
    case DType::f16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = from_floating<Dst>(f16_to_f32(s[i]));
      break;
    }
    case DType::i32: {
      auto* s = static_cast<const int32_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<Dst>(s[i]);
      break;
    }
    case DType::i64: {
      auto* s = static_cast<const int64_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<Dst>(s[i]);
      break;
    }
    case DType::u8: {
      auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<Dst>(s[i]);
      break;
    }
  }
}

}  // namespace

void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  if (n <= 0) return;  // empty tensors may have no bytes at all (nullptr), which memcpy must not see
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(src_dtype));
    return;
  }
  switch (dst_dtype) {
    case DType::f32:
      convert_to(src, src_dtype, static_cast<float*>(dst), n);
      break;
    case DType::f64:
      convert_to(src, src_dtype, static_cast<double*>(dst), n);
      break;
    case DType::i32:
      convert_to(src, src_dtype, static_cast<int32_t*>(dst), n);
      break;
    case DType::i64:
      convert_to(src, src_dtype, static_cast<int64_t*>(dst), n);
      break;
    case DType::u8:
      convert_to(src, src_dtype, static_cast<uint8_t*>(dst), n);
      break;
    case DType::bf16:
    case DType::f16: {
      // Through f32: exact for every source the 16-bit formats can hold.
      const bool bf = dst_dtype == DType::bf16;
      auto* d = static_cast<uint16_t*>(dst);
      constexpr int64_t kChunk = 1024;
      float buffer[kChunk];
      for (int64_t start = 0; start < n; start += kChunk) {
        const int64_t count = std::min(kChunk, n - start);
        convert_to(static_cast<const char*>(src) + start * static_cast<int64_t>(dtype_size(src_dtype)), src_dtype,
                   buffer, count);
        for (int64_t i = 0; i < count; ++i) d[start + i] = bf ? f32_to_bf16(buffer[i]) : f32_to_f16(buffer[i]);
      }
      break;
    }
  }
}

}  // namespace lockstep
