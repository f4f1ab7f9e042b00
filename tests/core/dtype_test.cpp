#include "lockstep/core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "lockstep/core/error.h"
#include "lockstep/core/tensor.h"

namespace lockstep {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3·2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6: rounds up to even.
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, F16MatchesIeeeValues) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);               // largest finite
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);               // rounds to infinity
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // halfway to it: ties to even (zero)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -24)), 0x0002);  // 1.5 ulp: ties to even (2)
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, F16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    if ((bits & 0x7c00) == 0x7c00) continue;  // inf / NaN
    EXPECT_EQ(f32_to_f16(f16_to_f32(bits)), bits) << std::hex << h;
  }
}

TEST(DType, ParseNamesAndRejectsUnknown) {
  EXPECT_EQ(parse_dtype("F32"), DType::f32);
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("I64"), DType::i64);
  EXPECT_THROW(parse_dtype("float8"), Error);
}

// An empty tensor may own no bytes at all; converting none of them must not touch them
// (memcpy with a null pointer is undefined even for zero bytes: UBSan catches it).
// Floats become integers truncated toward zero, saturated at the bounds, NaN as 0: what the
// GPU's conversion gives, so both devices agree (a plain cast is undefined past the bounds).
TEST(ConvertElements, FloatsToIntegersTruncateAndSaturate) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> values = {-3.7, 3.7, std::nan(""), inf, -inf, 3e9, -3e9, 1e19, -1e19, 300.5, -1.0, 255.9};
  const auto converted = [&](DType from, DType to) {
    const Tensor source = Tensor::from_vector<double>(values, {static_cast<int64_t>(values.size())}).to(from);
    return source.to(to).to_vector<int64_t>();
  };
  for (DType from : {DType::f64, DType::f32}) {
    EXPECT_EQ(converted(from, DType::i32), (std::vector<int64_t>{-3, 3, 0, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN,
                                                                 INT32_MAX, INT32_MIN, 300, -1, 255}))
        << dtype_name(from);
    EXPECT_EQ(converted(from, DType::i64), (std::vector<int64_t>{-3, 3, 0, INT64_MAX, INT64_MIN, 3000000000,
                                                                 -3000000000, INT64_MAX, INT64_MIN, 300, -1, 255}))
        << dtype_name(from);
    EXPECT_EQ(converted(from, DType::u8), (std::vector<int64_t>{0, 3, 0, 255, 0, 255, 0, 255, 0, 255, 0, 255}))
        << dtype_name(from);
  }
  // The largest float below 2^31 still converts as itself.
  EXPECT_EQ(Tensor::from_vector<float>({2147483520.0f}, {1}).to(DType::i32).to_vector<int64_t>()[0], 2147483520);
}

TEST(ConvertElements, NothingToConvertFromOrToNull) {
  convert_elements(nullptr, DType::f32, nullptr, DType::f32, 0);
  convert_elements(nullptr, DType::bf16, nullptr, DType::f64, 0);
}

}  // namespace
}  // namespace lockstep
