// Mixed precision: the autocast setting itself, and GPU products under it against float64
// products of the rounded operands.
#include "lockstep/core/autocast.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "lockstep/ops/ops.h"
#include "testing/devices.h"

namespace lockstep {
namespace {

TEST(Autocast, NestsPerThreadAndRejectsOtherTypes) {
  EXPECT_EQ(autocast_dtype(), DType::f32);
  {
    const AutocastGuard outer(DType::bf16);
    EXPECT_EQ(autocast_dtype(), DType::bf16);
    {
      const AutocastGuard inner(DType::f16);
      EXPECT_EQ(autocast_dtype(), DType::f16);
      std::thread([] { EXPECT_EQ(autocast_dtype(), DType::f32); }).join();  // another thread: off
    }
    EXPECT_EQ(autocast_dtype(), DType::bf16);
  }
  EXPECT_EQ(autocast_dtype(), DType::f32);
  EXPECT_THROW(AutocastGuard{DType::f64}, Error);  // braces: an expression, not a declaration
  EXPECT_THROW(AutocastGuard{DType::i32}, Error);
}

Tensor random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = dist(gen);
  return Tensor::from_vector(values, {rows, cols});
}

// [m, k] x [k, n] (or transposed views) in float64 from the operands rounded to `dtype`.
std::vector<double> reference(const Tensor& a, const Tensor& b, DType dtype) {
  const Tensor ra = a.to(dtype).to(DType::f64), rb = b.to(dtype).to(DType::f64);
  return matmul(ra, rb).to_vector<double>();
}

TEST(CudaAutocast, ProductsReadRoundedOperandsAndAccumulateInF32) {
  const Device cuda(DeviceType::cuda, 0);
  LOCKSTEP_SKIP_UNLESS_DEVICE(cuda);
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const bool transposed : {false, true}) {
      const int64_t m = 37, k = 301, n = 19;
      const Tensor a = transposed ? random_matrix(k, m, 1).as_strided({m, k}, {1, m}, 0) : random_matrix(m, k, 1);
      const Tensor b = random_matrix(k, n, 2);
      const std::vector<double> expected = reference(a, b, dtype);
      std::vector<float> got;
      {
        const AutocastGuard autocast(dtype);
        const Tensor out = matmul(a.to(cuda), b.to(cuda));
        EXPECT_EQ(out.dtype(), DType::f32);
        got = out.to_vector<float>();
      }
      // The rounded operands' products are exact in f32; only the f32 sums round.
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], expected[i], 1e-5 * std::sqrt(static_cast<double>(k)) * (1 + std::fabs(expected[i])))
            << dtype_name(dtype) << " transposed " << transposed << " [" << i << "]";
      // Off again: the f32 product differs from the rounded one.
      const std::vector<float> plain = matmul(a.to(cuda), b.to(cuda)).to_vector<float>();
      EXPECT_NE(plain, got) << dtype_name(dtype);
    }
  }
}

TEST(CudaAutocast, LinearGradientsRunUnderItToo) {
  const Device cuda(DeviceType::cuda, 0);
  LOCKSTEP_SKIP_UNLESS_DEVICE(cuda);
  const Tensor x = random_matrix(16, 64, 3).to(cuda);
  const Tensor w = random_matrix(8, 64, 4).to(cuda).set_requires_grad(true);
  {
    const AutocastGuard autocast(DType::bf16);
    sum(linear(x, w)).backward();
  }
  // d sum(x wᵀ) / dw = column sums of x broadcast over the rows of w, from bf16-rounded x.
  const std::vector<double> xs = x.to(Device::cpu()).to(DType::bf16).to(DType::f64).to_vector<double>();
  const std::vector<float> grad = w.grad().to_vector<float>();
  for (int64_t o = 0; o < 8; ++o) {
    for (int64_t j = 0; j < 64; ++j) {
      double column = 0;
      for (int64_t r = 0; r < 16; ++r) column += xs[static_cast<size_t>(r * 64 + j)];
      ASSERT_NEAR(grad[static_cast<size_t>(o * 64 + j)], column, 1e-4) << o << ", " << j;
    }
  }
}

}  // namespace
}  // namespace lockstep
