// max_pool2d and avg_pool2d forward and backward on every test device against float64 loops:
// overlapping windows (several windows per pixel in backward), padding, odd shapes, planes
// past 1024 pixels, ties (the first maximum wins, as on the CPU), NaN, 3-D inputs, and the
// same bits on a second run.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "lockstep/ops/conv.h"
#include "testing/device_tensors.h"
#include "testing/devices.h"
#include "testing/gradcheck.h"
#include "testing/naive_pool.h"

namespace lockstep {
namespace {

using testing::expect_all_close;
using testing::leaf_on;
using testing::naive_pool;
using testing::NaivePool;
using testing::PoolCase;
using testing::random_f64;

class CudaPool : public testing::DeviceTest {};

const std::vector<PoolCase> kCases = {
    {{2, 3, 8, 8}, {2, 2}, {0, 0}, {0, 0}},  // the CPU's 2x2 fast path
    {{1, 2, 7, 5}, {2, 2}, {2, 2}, {0, 0}},  // odd sizes drop the last row and column
    {{2, 2, 7, 7}, {3, 3}, {2, 2}, {1, 1}},  // overlapping windows with padding
    {{1, 3, 6, 9}, {2, 3}, {1, 2}, {1, 1}},   {{1, 1, 5, 5}, {3, 1}, {1, 1}, {0, 0}},
    {{2, 3, 9, 10}, {3, 3}, {1, 1}, {1, 1}},   // up to nine windows over a pixel
    {{1, 3, 37, 41}, {4, 2}, {3, 1}, {2, 1}},  // planes past 1024 pixels
    {{5, 4, 3}, {3, 2}, {1, 1}, {1, 0}},       // [C, H, W]
};

// Forward and backward of both pools on `device` for `x` (values on the CPU), checked
// against the loops: max exactly, means and gradients to the dtype's rounding.
void check_pools(Device device, const PoolCase& c, const Tensor& x, uint64_t seed) {
  const DType dtype = x.dtype();
  const Pair stride = c.stride[0] == 0 ? c.kernel : c.stride;
  const double tolerance = dtype == DType::f32 ? 1e-6 : 1e-13;
  SCOPED_TRACE("x " + shape_str(c.x) + " kernel (" + std::to_string(c.kernel[0]) + ", " + std::to_string(c.kernel[1]) +
               ") stride (" + std::to_string(stride[0]) + ", " + std::to_string(stride[1]) + ") padding (" +
               std::to_string(c.padding[0]) + ", " + std::to_string(c.padding[1]) + ") " + dtype_name(dtype));
  const Tensor x_max = leaf_on(x, device), x_avg = leaf_on(x, device);
  const Tensor max_out = max_pool2d(x_max, c.kernel, c.stride, c.padding);
  const Tensor avg_out = avg_pool2d(x_avg, c.kernel, c.stride, c.padding);
  ASSERT_EQ(max_out.device(), device);
  const Tensor dy = random_f64(max_out.shape(), seed).to(dtype);
  const NaivePool ref = naive_pool(x, dy, c.kernel, stride, c.padding);
  expect_all_close(max_out.to(Device::cpu()), ref.max, 0, 0);
  expect_all_close(avg_out.to(Device::cpu()), ref.avg, tolerance, tolerance);
  max_out.backward(dy.to(device));
  avg_out.backward(dy.to(device));
  expect_all_close(x_max.grad().to(Device::cpu()), ref.max_grad, tolerance, tolerance);
  expect_all_close(x_avg.grad().to(Device::cpu()), ref.avg_grad, tolerance, tolerance);
}

TEST_P(CudaPool, MatchesFloat64LoopsForwardAndBackward) {
  uint64_t seed = 1;
  for (const PoolCase& c : kCases) {
    for (DType dtype : {DType::f32, DType::f64}) {
      ++seed;
      check_pools(GetParam(), c, random_f64(c.x, seed).to(dtype), seed + 1000);
    }
  }
}

// Values from {0, 1, 2}: most windows hold ties, and the first maximum in row-major window
// order must win (so its pixel gets the gradient), as on the CPU.
TEST_P(CudaPool, TiesGoToTheFirstMaximum) {
  uint64_t seed = 50;
  for (const PoolCase& c : kCases) {
    Tensor x = random_f64(c.x, ++seed, 0.0, 3.0);
    double* p = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) p[i] = std::floor(p[i]);
    check_pools(GetParam(), c, x.to(DType::f32), seed + 1000);
  }
}

TEST_P(CudaPool, NaNWinsItsWindow) {
  const Device device = GetParam();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor with_nan = Tensor::from_vector<float>({1, nan, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3}, device);
  const auto values = max_pool2d(with_nan, {2, 2}, {1, 1}).to_vector<float>();
  EXPECT_TRUE(std::isnan(values[0]));
  EXPECT_TRUE(std::isnan(values[1]));
  EXPECT_EQ(values[2], 8.0f);
  EXPECT_EQ(values[3], 9.0f);
  // A NaN last in its window, and the gradient goes to it.
  Tensor x = Tensor::from_vector<float>({1, 2, 5, 6, 3, 4, 7, nan}, {1, 1, 2, 4}, device);
  x.set_requires_grad(true);
  const Tensor out = max_pool2d(x, {2, 2});
  const auto pooled = out.to_vector<float>();
  EXPECT_EQ(pooled[0], 4.0f);
  EXPECT_TRUE(std::isnan(pooled[1]));
  out.backward(Tensor::from_vector<float>({10, 20}, {1, 1, 1, 2}, device));
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{0, 0, 0, 0, 0, 10, 0, 20}));
}

TEST_P(CudaPool, RepeatsBitForBit) {
  const Device device = GetParam();
  auto run = [&] {
    const Tensor x = testing::random_f32({8, 16, 33, 33}, 70);
    const Tensor x_max = leaf_on(x, device), x_avg = leaf_on(x, device);
    const Tensor max_out = max_pool2d(x_max, {3, 3}, {2, 2}, {1, 1});
    const Tensor avg_out = avg_pool2d(x_avg, {3, 3}, {2, 2}, {1, 1});
    const Tensor dy = testing::random_f32(max_out.shape(), 71).to(device);
    max_out.backward(dy);
    avg_out.backward(dy);
    return std::vector<std::vector<float>>{max_out.to_vector<float>(), avg_out.to_vector<float>(),
                                           x_max.grad().to_vector<float>(), x_avg.grad().to_vector<float>()};
  };
  const auto first = run();
  EXPECT_EQ(run(), first);
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaPool, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep
