// conv2d forward and backward on every test device (im2col + cuBLAS on CUDA devices)
// against float64 loops: strides, padding, odd and non-square shapes, a batch cut into
// several chunks, non-contiguous inputs, a skipped input gradient, an empty batch, and the
// same bits on a second run.
#include <gtest/gtest.h>

#include <vector>

#include "lockstep/ops/conv.h"
#include "testing/device_tensors.h"
#include "testing/devices.h"
#include "testing/gradcheck.h"
#include "testing/naive_conv.h"

namespace lockstep {
namespace {

using testing::ConvCase;
using testing::expect_all_close;
using testing::leaf_on;
using testing::naive_conv;
using testing::NaiveConv;
using testing::random_f64;

class CudaConv : public testing::DeviceTest {};

struct Leaves {
  Tensor x, w, b;
};

// Copies of the CPU tensors on `device`, each a leaf that requires grad (b may be undefined).
Leaves leaves_on(Device device, const Tensor& x, const Tensor& w, const Tensor& b, bool x_grad = true) {
  return {leaf_on(x, device, x_grad), leaf_on(w, device), b.defined() ? leaf_on(b, device) : Tensor()};
}

// Runs conv2d forward and backward on `device` and checks output and gradients against the
// loops. Tolerances: f32 to its rounding of sums of `terms` products, f64 near exact.
void check_case(Device device, const ConvCase& c, DType dtype, bool with_bias, uint64_t seed) {
  const Tensor x = random_f64(c.x, seed).to(dtype), w = random_f64(c.w, seed + 1).to(dtype);
  const Tensor b = with_bias ? random_f64({c.w[0]}, seed + 2).to(dtype) : Tensor();
  const Leaves l = leaves_on(device, x, w, b);
  const Tensor out = conv2d(l.x, l.w, l.b, c.stride, c.padding);
  ASSERT_EQ(out.device(), device);
  const Tensor dy = random_f64(out.shape(), seed + 3).to(dtype);
  out.backward(dy.to(device));
  const NaiveConv ref = naive_conv(x, w, b, dy, c.stride, c.padding);
  const double rtol = testing::reference_rtol(dtype);
  const int64_t reduced = c.w[1] * c.w[2] * c.w[3], pixels = out.numel() / c.w[0];
  auto atol = [&](int64_t terms) { return testing::sum_atol(dtype, terms); };
  SCOPED_TRACE("x " + shape_str(c.x) + " w " + shape_str(c.w) + " stride (" + std::to_string(c.stride[0]) + ", " +
               std::to_string(c.stride[1]) + ") padding (" + std::to_string(c.padding[0]) + ", " +
               std::to_string(c.padding[1]) + ") " + dtype_name(dtype) + (with_bias ? " with bias" : ""));
  expect_all_close(out.to(Device::cpu()), ref.out, rtol, atol(reduced));
  expect_all_close(l.x.grad().to(Device::cpu()), ref.dx, rtol, atol(c.w[0] * c.w[2] * c.w[3]));
  expect_all_close(l.w.grad().to(Device::cpu()), ref.dw, rtol, atol(pixels));
  if (with_bias) expect_all_close(l.b.grad().to(Device::cpu()), ref.db, rtol, atol(pixels));
}

TEST_P(CudaConv, MatchesFloat64LoopsWithStrideAndPadding) {
  const std::vector<ConvCase> cases = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, {0, 0}},
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {2, 2}, {1, 1}},
      {{1, 2, 5, 8}, {3, 2, 2, 3}, {2, 1}, {1, 0}},
      {{3, 1, 4, 4}, {2, 1, 1, 1}, {1, 1}, {0, 0}},  // 1x1
      {{1, 2, 3, 3}, {2, 2, 3, 3}, {1, 3}, {2, 2}},  // windows of padding only
      {{3, 5, 11, 13}, {7, 5, 5, 3}, {3, 2}, {2, 1}},
      {{2, 3, 33, 35}, {5, 3, 3, 3}, {1, 1}, {1, 1}},  // planes past 1024 pixels
      {{4, 1, 9, 9}, {3, 1, 4, 4}, {4, 4}, {0, 0}},    // stride = kernel: every pixel read once
      {{1, 2, 10, 7}, {2, 2, 2, 2}, {3, 3}, {0, 0}},   // stride > kernel: pixels nobody reads
  };
  uint64_t seed = 1;
  for (const ConvCase& c : cases) {
    for (DType dtype : {DType::f32, DType::f64}) {
      check_case(GetParam(), c, dtype, true, seed += 4);
      check_case(GetParam(), c, dtype, false, seed += 4);
    }
  }
}

// (C·KH·KW + O)·OH·OW per image is over a third of a GPU chunk's 2^25 elements: three images
// are cut into chunks of two and one, so the weight gradient sums over chunks and the input
// gradient and output are written chunk by chunk.
TEST_P(CudaConv, BatchCutIntoChunksMatchesFloat64Loops) {
  check_case(GetParam(), {{3, 4, 544, 544}, {2, 4, 3, 3}, {1, 1}, {1, 1}}, DType::f64, true, 100);
}

TEST_P(CudaConv, NonContiguousInputs) {
  const Device device = GetParam();
  const Strides swap_hw = {90, 30, 1, 5}, swap_kernel = {27, 9, 1, 3};
  const Tensor x_storage = random_f64({2, 3, 6, 5}, 200), w_storage = random_f64({2, 3, 3, 3}, 201);
  const Tensor x = x_storage.as_strided({2, 3, 5, 6}, swap_hw, 0);
  const Tensor w = w_storage.as_strided({2, 3, 3, 3}, swap_kernel, 0);
  const Tensor x_device = x_storage.to(device).as_strided({2, 3, 5, 6}, swap_hw, 0);
  const Tensor w_device = w_storage.to(device).as_strided({2, 3, 3, 3}, swap_kernel, 0);
  const Tensor dy = Tensor::zeros({2, 2, 5, 6}, DType::f64);
  expect_all_close(conv2d(x_device, w_device, Tensor(), {1, 1}, {1, 1}).to(Device::cpu()),
                   naive_conv(x, w, Tensor(), dy, {1, 1}, {1, 1}).out, 1e-12, 1e-13);
}

TEST_P(CudaConv, SkipsInputGradientWhenInputNeedsNone) {
  const Tensor x = random_f64({2, 1, 6, 6}, 300), w = random_f64({3, 1, 3, 3}, 301);
  const Leaves l = leaves_on(GetParam(), x, w, Tensor(), false);
  const Tensor out = conv2d(l.x, l.w);
  const Tensor dy = random_f64(out.shape(), 302);
  out.backward(dy.to(GetParam()));
  EXPECT_FALSE(l.x.grad().defined());
  expect_all_close(l.w.grad().to(Device::cpu()), naive_conv(x, w, Tensor(), dy, {1, 1}, {0, 0}).dw, 1e-12, 1e-13);
}

TEST_P(CudaConv, EmptyBatchGivesZeroWeightAndBiasGradients) {
  const Tensor x = Tensor::zeros({0, 2, 5, 5}, DType::f32), w = random_f64({3, 2, 3, 3}, 400).to(DType::f32);
  const Tensor b = random_f64({3}, 401).to(DType::f32);
  const Leaves l = leaves_on(GetParam(), x, w, b);
  const Tensor out = conv2d(l.x, l.w, l.b, {1, 1}, {1, 1});
  EXPECT_EQ(out.shape(), (Shape{0, 3, 5, 5}));
  out.backward(Tensor::zeros(out.shape(), DType::f32, GetParam()));
  EXPECT_EQ(l.w.grad().to_vector<double>(), std::vector<double>(54, 0.0));
  EXPECT_EQ(l.b.grad().to_vector<double>(), std::vector<double>(3, 0.0));
}

// Same inputs, same bits: every sum on the device has an order fixed by the shapes.
TEST_P(CudaConv, RepeatsBitForBit) {
  auto run = [&] {
    const Leaves l = leaves_on(GetParam(), testing::random_f32({8, 16, 20, 20}, 500),
                               testing::random_f32({12, 16, 3, 3}, 501), testing::random_f32({12}, 502));
    const Tensor out = conv2d(l.x, l.w, l.b, {1, 1}, {1, 1});
    out.backward(testing::random_f32(out.shape(), 503).to(GetParam()));
    return std::vector<std::vector<float>>{out.to_vector<float>(), l.x.grad().to_vector<float>(),
                                           l.w.grad().to_vector<float>(), l.b.grad().to_vector<float>()};
  };
  const auto first = run();
  EXPECT_EQ(run(), first);
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaConv, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep
