// The reductions on every test device against naive loops. Sums run over small integers, so
// every order of addition gives the exact sum and results are compared bit for bit: a term
// lost or added twice shows. Shapes reach each kernel path: short rows (one warp each), long
// rows (one block each), rows cut into parts, column sums with and without parts, several
// reduced groups, size-1 and empty axes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "lockstep/core/philox.h"
#include "lockstep/ops/reduce.h"
#include "testing/device_tensors.h"
#include "testing/devices.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::leaf_on;
using testing::random_f64;

class CudaReduce : public testing::DeviceTest {};

// Integers in [-range, range] (f64 on the CPU).
Tensor small_integers(const Shape& shape, uint64_t seed, int64_t range) {
  Tensor t = Tensor::empty(shape, DType::f64);
  Philox rng(seed, 7);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<double>(static_cast<int64_t>(rng.next_below(2 * static_cast<uint64_t>(range) + 1)) - range);
  return t;
}

// For each element of x (row-major), the row-major index of the output element it reduces
// into, with the axes in `reduce` removed; and the output's element count.
std::vector<int64_t> output_index_of(const Shape& shape, const std::vector<bool>& reduce, int64_t* out_count) {
  std::vector<int64_t> index(static_cast<size_t>(numel(shape)));
  *out_count = 1;
  for (size_t k = 0; k < shape.size(); ++k)
    if (!reduce[k]) *out_count *= shape[k];
  for (int64_t flat = 0; flat < numel(shape); ++flat) {
    int64_t rest = flat, o = 0, stride = 1;
    for (size_t k = shape.size(); k-- > 0;) {
      const int64_t coord = rest % shape[k];
      rest /= shape[k];
      if (reduce[k]) continue;
      o += coord * stride;
      stride *= shape[k];
    }
    index[static_cast<size_t>(flat)] = o;
  }
  return index;
}

struct AxesCase {
  Shape shape;
  std::vector<int64_t> axes;
};

const std::vector<AxesCase> kAxesCases = {
    {{3, 5000}, {1}},       // long rows: a block per row
    {{3, 5000}, {0}},       // columns, few rows
    {{2, 20000}, {1}},      // rows cut into parts
    {{100003}, {0}},        // one long row in parts
    {{70000, 3}, {0}},      // few long columns: cut into row parts
    {{3, 70000}, {0}},      // many columns: one pass
    {{1000, 100}, {1}},     // short rows: a warp per row
    {{129, 257}, {1}},      // just past the warp rows
    {{4, 300, 5}, {0}},     // leading axis
    {{4, 300, 5}, {1}},     // middle axis
    {{4, 300, 5}, {2}},     // trailing axis
    {{4, 300, 5}, {0, 2}},  // two groups: two passes
    {{4, 300, 5}, {2, 1}},  // trailing axes merged
    {{4, 300, 5}, {0, 1, 2}},
    {{2, 3, 4, 5}, {0, 2}},  // kept axes that touch once a group is gone
    {{2, 3, 4, 5}, {1, 3}},
    {{6, 1, 7}, {1}},  // a size-1 axis: a copy
    {{5, 0}, {1}},     // an empty reduced axis: zeros
    {{0, 4}, {0}},
    {{0, 4}, {1}},  // an empty output
    {{3, 4}, {}},   // nothing reduced
};

template <typename T>
void expect_sums_exact(Device device) {
  uint64_t seed = 1;
  for (const AxesCase& c : kAxesCases) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(shape_str(c.shape) + " axes " + shape_str(c.axes) + (keepdim ? " keepdim " : " ") +
                   dtype_name(dtype_of<T>()));
      const Tensor x64 = small_integers(c.shape, seed++, 8);
      const Tensor x = x64.to(dtype_of<T>());
      std::vector<bool> reduce(c.shape.size(), false);
      for (int64_t a : c.axes) reduce[static_cast<size_t>(a)] = true;
      int64_t out_count = 0, count = 1;
      const auto target = output_index_of(c.shape, reduce, &out_count);
      for (size_t k = 0; k < c.shape.size(); ++k)
        if (reduce[k]) count *= c.shape[k];
      std::vector<double> expected(static_cast<size_t>(out_count), 0.0);
      const auto values = x64.to_vector<double>();
      for (size_t i = 0; i < values.size(); ++i) expected[static_cast<size_t>(target[i])] += values[i];

      Shape out_shape;
      for (size_t k = 0; k < c.shape.size(); ++k) {
        if (!reduce[k]) {
          out_shape.push_back(c.shape[k]);
        } else if (keepdim) {
          out_shape.push_back(1);
        }
      }
      const Tensor xs = leaf_on(x, device), xm = leaf_on(x, device);
      const Tensor s = sum(xs, c.axes, keepdim);
      const Tensor m = mean(xm, c.axes, keepdim);
      ASSERT_EQ(s.device(), device);
      ASSERT_EQ(s.shape(), out_shape);
      ASSERT_EQ(m.shape(), out_shape);
      const auto got_sum = s.to_vector<T>(), got_mean = m.to_vector<T>();
      ASSERT_EQ(got_sum.size(), expected.size());
      for (size_t k = 0; k < expected.size(); ++k) {
        ASSERT_EQ(got_sum[k], static_cast<T>(expected[k])) << "output " << k;
        const T expected_mean = static_cast<T>(expected[k]) / static_cast<T>(count);
        if (std::isnan(expected_mean)) {
          EXPECT_TRUE(std::isnan(got_mean[k])) << "output " << k;  // the mean of nothing
        } else {
          ASSERT_EQ(got_mean[k], expected_mean) << "output " << k;
        }
      }
      // Backward: every input element gets its output's gradient (times 1/count for the mean).
      const Tensor g = random_f64(out_shape, seed++).to(dtype_of<T>());
      const auto vg = g.to_vector<T>();
      s.backward(g.to(device));
      m.backward(g.to(device));
      const auto grad_sum = xs.grad().to_vector<T>(), grad_mean = xm.grad().to_vector<T>();
      const T scale = static_cast<T>(1.0 / static_cast<double>(count));
      ASSERT_EQ(grad_sum.size(), values.size());
      ASSERT_EQ(grad_mean.size(), values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        const T gi = vg[static_cast<size_t>(target[i])];
        ASSERT_EQ(grad_sum[i], gi) << "input " << i;
        ASSERT_EQ(grad_mean[i], gi * scale) << "input " << i;
      }
    }
  }
}

TEST_P(CudaReduce, SumAndMeanOverAxesAreExactAndSoAreTheirGradients) {
  expect_sums_exact<float>(GetParam());
  expect_sums_exact<double>(GetParam());
}

TEST_P(CudaReduce, WholeTensorSumsAndSumTo) {
  const Device device = GetParam();
  for (const Shape& shape : {Shape{}, Shape{1}, Shape{7}, Shape{300, 5}, Shape{2, 50001}}) {
    SCOPED_TRACE(shape_str(shape));
    const Tensor x = small_integers(shape, 11, 8);
    double total = 0;
    for (double v : x.to_vector<double>()) total += v;
    for (DType dtype : {DType::f32, DType::f64}) {
      const Tensor xd = x.to(dtype).to(device);
      EXPECT_EQ(sum(xd).item(), total);
      EXPECT_EQ(sum(xd).shape(), Shape{});
      EXPECT_EQ(mean(xd).item(), dtype == DType::f32
                                     ? static_cast<double>(static_cast<float>(total) /
                                                           static_cast<float>(std::max<int64_t>(x.numel(), 1)))
                                     : total / static_cast<double>(x.numel()));
    }
  }
  // sum_to: the gradient of a broadcast, down to each shape that broadcasts to [4, 3, 5].
  const Tensor x = small_integers({4, 3, 5}, 12, 8);
  const auto v = x.to_vector<double>();
  for (const Shape& target : {Shape{3, 1}, Shape{1, 5}, Shape{5}, Shape{4, 1, 1}, Shape{}, Shape{4, 3, 5}}) {
    SCOPED_TRACE("sum_to " + shape_str(target));
    const Tensor s = sum_to(x.to(device), target);
    ASSERT_EQ(s.shape(), target);
    std::vector<double> expected(static_cast<size_t>(numel(target)), 0.0);
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 3; ++j)
        for (int64_t k = 0; k < 5; ++k) {
          const int64_t coord[3] = {i, j, k};
          int64_t o = 0;
          for (size_t d = 0; d < target.size(); ++d) {
            const int64_t axis = 3 - static_cast<int64_t>(target.size()) + static_cast<int64_t>(d);
            o = o * target[d] + (target[d] == 1 ? 0 : coord[axis]);
          }
          expected[static_cast<size_t>(o)] += v[static_cast<size_t>((i * 3 + j) * 5 + k)];
        }
    EXPECT_EQ(s.to_vector<double>(), expected);
  }
}

TEST_P(CudaReduce, LongSumsOfRealsAreCloseAndTheSameEveryRun) {
  const Device device = GetParam();
  const Tensor x = random_f64({3, 400001}, 21);
  const auto v = x.to_vector<double>();
  std::vector<double> expected(3, 0.0), magnitude(3, 0.0);
  for (size_t i = 0; i < v.size(); ++i) {
    expected[i / 400001] += v[i];
    magnitude[i / 400001] += std::abs(v[i]);
  }
  const Tensor x32 = x.to(DType::f32).to(device);
  const auto first = sum(x32, {1}).to_vector<float>();
  const auto again = sum(x32, {1}).to_vector<float>();
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(std::bit_cast<uint32_t>(first[r]), std::bit_cast<uint32_t>(again[r])) << "row " << r;
    // The input was rounded to f32 (relative 6e-8 per term) and the sum adds f32 rounding.
    EXPECT_NEAR(first[r], expected[r], 1e-6 * magnitude[r]) << "row " << r;
  }
  const auto exact = sum(x.to(device), {1}).to_vector<double>();
  for (size_t r = 0; r < 3; ++r) EXPECT_NEAR(exact[r], expected[r], 1e-14 * magnitude[r]) << "row " << r;
}

// The first position of the largest value (a nan beats every number, the first nan wins).
struct NaiveMax {
  std::vector<double> values;
  std::vector<int64_t> indices;
};

NaiveMax naive_max(const std::vector<double>& x, int64_t outer, int64_t n, int64_t inner) {
  NaiveMax m;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      int64_t best = 0;
      for (int64_t r = 1; r < n; ++r) {
        const double v = x[static_cast<size_t>((o * n + r) * inner + j)];
        const double b = x[static_cast<size_t>((o * n + best) * inner + j)];
        if (v > b || (std::isnan(v) && !std::isnan(b))) best = r;
      }
      m.values.push_back(x[static_cast<size_t>((o * n + best) * inner + j)]);
      m.indices.push_back(best);
    }
  return m;
}

struct MaxCase {
  Shape shape;
  int64_t axis;
};

template <typename T>
void expect_max_exact(Device device) {
  const std::vector<MaxCase> cases = {
      {{6, 100}, 1},     {{6, 1000}, 1}, {{6, 1000}, 0}, {{50, 7, 3}, 1},
      {{5, 300, 2}, -2}, {{1, 5000}, 1}, {{4}, 0},       {{3, 70000}, 1},
  };
  uint64_t seed = 40;
  for (const MaxCase& c : cases) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(shape_str(c.shape) + " axis " + std::to_string(c.axis) + (keepdim ? " keepdim " : " ") +
                   dtype_name(dtype_of<T>()));
      // Values in [-3, 3]: most rows hold their largest value several times.
      const Tensor x = small_integers(c.shape, seed++, 3).to(dtype_of<T>());
      const int64_t axis = c.axis < 0 ? c.axis + static_cast<int64_t>(c.shape.size()) : c.axis;
      int64_t outer = 1, inner = 1;
      for (int64_t k = 0; k < static_cast<int64_t>(c.shape.size()); ++k) {
        if (k < axis) outer *= c.shape[static_cast<size_t>(k)];
        if (k > axis) inner *= c.shape[static_cast<size_t>(k)];
      }
      const int64_t n = c.shape[static_cast<size_t>(axis)];
      const NaiveMax expected = naive_max(x.to_vector<double>(), outer, n, inner);
      const Tensor xd = leaf_on(x, device);
      const Tensor values = max(xd, c.axis, keepdim);
      const Tensor indices = argmax(xd, c.axis, keepdim);
      ASSERT_EQ(indices.dtype(), DType::i64);
      ASSERT_EQ(values.shape(), indices.shape());
      ASSERT_EQ(values.numel(), outer * inner);
      EXPECT_EQ(values.to_vector<double>(), expected.values);
      EXPECT_EQ(indices.to_vector<int64_t>(), expected.indices);
      // The gradient goes to the first largest position only.
      const Tensor g = random_f64(values.shape(), seed++).to(dtype_of<T>());
      const auto vg = g.to_vector<T>();
      values.backward(g.to(device));
      const auto grad = xd.grad().to_vector<T>();
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t r = 0; r < n; ++r)
          for (int64_t j = 0; j < inner; ++j) {
            const auto k = static_cast<size_t>(o * inner + j);
            const T want = expected.indices[k] == r ? vg[k] : T(0);
            ASSERT_EQ(grad[static_cast<size_t>((o * n + r) * inner + j)], want) << o << ", " << r << ", " << j;
          }
    }
  }
}

TEST_P(CudaReduce, MaxAndArgmaxPickTheFirstLargestValue) {
  expect_max_exact<float>(GetParam());
  expect_max_exact<double>(GetParam());
}

TEST_P(CudaReduce, MaxTreatsNanAsLargestAndHandlesInfinities) {
  const Device device = GetParam();
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  // Rows long enough for the block kernel and short enough for the warp kernel.
  for (int64_t n : {40, 3000}) {
    SCOPED_TRACE("row length " + std::to_string(n));
    std::vector<double> x(static_cast<size_t>(4 * n), 1.0);
    x[static_cast<size_t>(0 * n + n - 1)] = 5.0;  // row 0: the largest value last
    x[static_cast<size_t>(1 * n + 3)] = inf;      // row 1: inf, then a nan, then another nan
    x[static_cast<size_t>(1 * n + n / 2)] = nan;
    x[static_cast<size_t>(1 * n + n - 2)] = nan;
    for (int64_t j = 0; j < n; ++j) x[static_cast<size_t>(2 * n + j)] = -inf;  // row 2: all -inf
    x[static_cast<size_t>(3 * n + 7)] = 2.0;                                   // row 3: ties at 7 and 9
    x[static_cast<size_t>(3 * n + 9)] = 2.0;
    const Tensor t = Tensor::from_vector(x, {4, n}).to(DType::f32).to(device);
    const auto indices = argmax(t, 1).to_vector<int64_t>();
    EXPECT_EQ(indices, (std::vector<int64_t>{n - 1, n / 2, 0, 7}));
    const auto values = max(t, 1).to_vector<float>();
    EXPECT_EQ(values[0], 5.0f);
    EXPECT_TRUE(std::isnan(values[1]));
    EXPECT_EQ(values[2], -std::numeric_limits<float>::infinity());
    EXPECT_EQ(values[3], 2.0f);
    // The same along a leading axis (the column kernel).
    const auto column_indices = argmax(t, 0).to_vector<int64_t>();
    EXPECT_EQ(column_indices[static_cast<size_t>(n / 2)], 1);  // the nan in row 1
    EXPECT_EQ(column_indices[static_cast<size_t>(n - 1)], 0);  // 5 in row 0
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, CudaReduce, LOCKSTEP_TEST_DEVICES);

}  // namespace
}  // namespace lockstep
