// layer_norm on each test device, forward and every gradient, against the CPU op run in
// float64 on the same values: rows shorter and longer than the GPU's warp-per-row limit
// (1024), widths that are no multiple of a warp, several normalized axes, with and without
// weight and bias, batches whose rows split unevenly into the weight gradient's row chunks,
// empty batches, and bit-identical reruns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/ops/norm.h"
#include "testing/devices.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::random_f64;

// Every element of actual within atol + rtol · |expected|; reports the count and the worst.
void expect_close(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  ASSERT_EQ(actual.shape(), expected.shape());
  const auto a = actual.to_vector<double>();
  const auto e = expected.to_vector<double>();
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double excess = std::abs(a[i] - e[i]) - (atol + rtol * std::abs(e[i]));
    if (excess > 0 || std::isnan(a[i]) != std::isnan(e[i])) {
      ++bad;
      if (worst < 0 || excess > worst_excess) {
        worst = static_cast<int64_t>(i);
        worst_excess = excess;
      }
    }
  }
  EXPECT_EQ(bad, 0) << bad << " of " << a.size() << " elements differ; worst at " << worst << ": "
                    << (worst >= 0 ? a[static_cast<size_t>(worst)] : 0.0) << " vs "
                    << (worst >= 0 ? e[static_cast<size_t>(worst)] : 0.0);
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

// A new leaf with t's values on device (never t itself, which .to() returns when t is
// already there), requiring grad when asked.
Tensor leaf_on(const Tensor& t, Device device, bool requires_grad = true) {
  Tensor out = t.to(device).detach();
  out.set_requires_grad(requires_grad);
  return out;
}

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

class CudaLayerNorm : public ::testing::TestWithParam<Device> {};

TEST_P(CudaLayerNorm, MatchesFloat64ForwardAndBackward) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(GetParam());
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
      const double rtol = dtype == DType::f32 ? 1e-5 : 1e-12;
      expect_close(actual.y, expected.y, rtol, rtol * max_abs(expected.y));
      expect_close(actual.dx, expected.dx, rtol, rtol * max_abs(expected.dx));
      if (c.weight) expect_close(actual.dw, expected.dw, rtol, rtol * max_abs(expected.dw));
      if (c.bias) expect_close(actual.db, expected.db, rtol, rtol * max_abs(expected.db));
    }
  }
}

TEST_P(CudaLayerNorm, OnlyTheParametersNeedGradients) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(GetParam());
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
  LOCKSTEP_SKIP_UNLESS_DEVICE(GetParam());
  const Device device = GetParam();
  // Variance 0: rstd = 1/sqrt(eps), and x - mean is exactly 0, so y is the bias.
  const Tensor x = Tensor::full({3, 1100}, 2.5, DType::f32, device);
  const Tensor w = Tensor::full({1100}, 3.0, DType::f32, device);
  const Tensor b = Tensor::full({1100}, -0.25, DType::f32, device);
  for (double v : layer_norm(x, {1100}, w, b).to_vector<double>()) ASSERT_EQ(v, -0.25);
}

TEST_P(CudaLayerNorm, RunsAreBitIdentical) {
  LOCKSTEP_SKIP_UNLESS_DEVICE(GetParam());
  const Device device = GetParam();
  const NormCase c{{4099, 200}, {200}, true, true, 1e-5};
  const Tensor x = random_f64(c.input, 51, -3, 3).to(DType::f32);
  const Tensor w = random_f64(c.normalized, 52).to(DType::f32), b = random_f64(c.normalized, 53).to(DType::f32);
  const Tensor dy = random_f64(c.input, 54).to(DType::f32);
  const NormResult first = run_layer_norm(c, x, w, b, dy, device, DType::f32, true);
  const NormResult second = run_layer_norm(c, x, w, b, dy, device, DType::f32, true);
  const std::vector<std::pair<Tensor, Tensor>> pairs = {
      {first.y, second.y}, {first.dx, second.dx}, {first.dw, second.dw}, {first.db, second.db}};
  for (const auto& [one, other] : pairs) {
    const auto u = one.to_vector<double>(), v = other.to_vector<double>();
    ASSERT_EQ(u.size(), v.size());
    int64_t differ = 0;
    for (size_t i = 0; i < u.size(); ++i) differ += u[i] != v[i];
    EXPECT_EQ(differ, 0) << differ << " of " << u.size() << " elements differ between two identical runs";
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaLayerNorm, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep
