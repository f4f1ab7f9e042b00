// layer_norm on each test device, forward and every gradient, against the CPU op run in
// float64 on the same values: rows shorter and longer than the GPU's warp-per-row limit
// (1024), widths that are no multiple of a warp, several normalized axes, with and without
// weight and bias, batches whose rows split unevenly into the weight gradient's row chunks,
// empty batches, and bit-identical reruns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/ops/norm.h"
#include "testing/device_tensors.h"
#include "testing/devices.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::expect_close;
using testing::expect_identical;
using testing::leaf_on;
using testing::max_abs;
using testing::random_f64;
using testing::reference_rtol;

struct NormCase {
  Shape input;
  Shape normalized;
  bool weight, bias;
  double eps;
};

// What one layer_norm call and its backward give: the output and the gradients of x, weight
// and bias (undefined where not asked for), all copied to the CPU.
struct NormResult {
  Tensor y, dx, dw, db;
};

NormResult run_layer_norm(const NormCase& c, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy,
                          Device device, DType dtype, bool need_x) {
  Tensor xd = leaf_on(x.to(dtype), device, need_x);
  Tensor wd = c.weight ? leaf_on(w.to(dtype), device) : Tensor();
  Tensor bd = c.bias ? leaf_on(b.to(dtype), device) : Tensor();
  const Tensor y = layer_norm(xd, c.normalized, wd, bd, c.eps);
  EXPECT_EQ(y.device(), device);
  EXPECT_EQ(y.dtype(), dtype);
  NormResult r;
  r.y = y.to(Device::cpu());
  if (!y.requires_grad()) return r;
  y.backward(dy.to(dtype).to(device));
  if (need_x) r.dx = xd.grad().to(Device::cpu());
  if (c.weight) r.dw = wd.grad().to(Device::cpu());
  if (c.bias) r.db = bd.grad().to(Device::cpu());
  return r;
}

class CudaLayerNorm : public testing::DeviceTest {};

TEST_P(CudaLayerNorm, MatchesFloat64ForwardAndBackward) {
  const Device device = GetParam();
  const std::vector<NormCase> cases = {
      {{5, 7}, {7}, true, true, 1e-5},         // a warp per row, short rows
      {{3, 4, 5}, {4, 5}, true, false, 0.1},   // two normalized axes
      {{6, 1024}, {1024}, false, true, 1e-5},  // the longest warp-per-row rows
      {{3, 1500}, {1500}, true, true, 1e-5},   // a block per row, not a multiple of it
      {{1000, 37}, {37}, true, true, 1e-5},    // 16 row chunks for the parameter sums, the last short
      {{40000, 3}, {3}, true, true, 1e-5},     // hundreds of uneven chunks
      {{2, 2, 768}, {768}, true, true, 1e-5},  // GPT-2's width
      {{4, 9}, {9}, false, false, 0.0},        // no affine parameters, eps 0
      {{0, 5}, {5}, true, true, 1e-5},         // no rows: parameter gradients are 0
  };
  uint64_t seed = 1;
  for (const NormCase& c : cases) {
    for (DType dtype : {DType::f32, DType::f64}) {
      SCOPED_TRACE(shape_str(c.input) + " over " + shape_str(c.normalized) + " " + dtype_name(dtype) +
                   (c.weight ? " weight" : "") + (c.bias ? " bias" : ""));
      // Rows with an offset and a spread, as activations have.
      const Tensor x = random_f64(c.input, ++seed, -3, 5).to(dtype);
      const Tensor w = random_f64(c.normalized, ++seed, 0.5, 1.5).to(dtype);
      const Tensor b = random_f64(c.normalized, ++seed).to(dtype);
      const Tensor dy = random_f64(c.input, ++seed).to(dtype);
      // The reference: the CPU op in f64 on the same (already rounded) values.
      const NormResult expected = run_layer_norm(c, x, w, b, dy, Device::cpu(), DType::f64, true);
      const NormResult actual = run_layer_norm(c, x, w, b, dy, device, dtype, true);
      const double rtol = reference_rtol(dtype);
      expect_close(actual.y, expected.y, rtol, rtol * max_abs(expected.y));
      expect_close(actual.dx, expected.dx, rtol, rtol * max_abs(expected.dx));
      if (c.weight) expect_close(actual.dw, expected.dw, rtol, rtol * max_abs(expected.dw));
      if (c.bias) expect_close(actual.db, expected.db, rtol, rtol * max_abs(expected.db));
    }
  }
}

TEST_P(CudaLayerNorm, OnlyTheParametersNeedGradients) {
  const Device device = GetParam();
  const NormCase c{{70, 33}, {33}, true, true, 1e-5};
  const Tensor x = random_f64(c.input, 41, -2, 2), w = random_f64(c.normalized, 42), b = random_f64(c.normalized, 43);
  const Tensor dy = random_f64(c.input, 44);
  const NormResult expected = run_layer_norm(c, x, w, b, dy, Device::cpu(), DType::f64, false);
  const NormResult actual = run_layer_norm(c, x, w, b, dy, device, DType::f64, false);
  EXPECT_FALSE(actual.dx.defined());
  expect_close(actual.dw, expected.dw, 1e-12, 1e-12);
  expect_close(actual.db, expected.db, 1e-12, 1e-12);
}

TEST_P(CudaLayerNorm, ConstantRowsNormalizeToTheBias) {
  const Device device = GetParam();
  // Variance 0: rstd = 1/sqrt(eps), and x - mean is exactly 0, so y is the bias.
  const Tensor x = Tensor::full({3, 1100}, 2.5, DType::f32, device);
  const Tensor w = Tensor::full({1100}, 3.0, DType::f32, device);
  const Tensor b = Tensor::full({1100}, -0.25, DType::f32, device);
  for (double v : layer_norm(x, {1100}, w, b).to_vector<double>()) ASSERT_EQ(v, -0.25);
}

TEST_P(CudaLayerNorm, RunsAreBitIdentical) {
  const Device device = GetParam();
  const NormCase c{{4099, 200}, {200}, true, true, 1e-5};
  const Tensor x = random_f64(c.input, 51, -3, 3).to(DType::f32);
  const Tensor w = random_f64(c.normalized, 52).to(DType::f32), b = random_f64(c.normalized, 53).to(DType::f32);
  const Tensor dy = random_f64(c.input, 54).to(DType::f32);
  const NormResult first = run_layer_norm(c, x, w, b, dy, device, DType::f32, true);
  const NormResult second = run_layer_norm(c, x, w, b, dy, device, DType::f32, true);
  expect_identical(first.y, second.y);
  expect_identical(first.dx, second.dx);
  expect_identical(first.dw, second.dw);
  expect_identical(first.db, second.db);
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaLayerNorm, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep
