#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "lockstep/ops/conv.h"
#include "testing/gradcheck.h"
#include "testing/naive_pool.h"

namespace lockstep {
namespace {

using testing::expect_all_close;
using testing::expect_gradients_match;
using testing::naive_pool;
using testing::NaivePool;
using testing::PoolCase;
using testing::random_f64;

const std::vector<PoolCase> kCases = {
    {{2, 3, 8, 8}, {2, 2}, {0, 0}, {0, 0}},  // the 2x2 fast path
    {{1, 2, 7, 5}, {2, 2}, {2, 2}, {0, 0}},  // odd sizes drop the last row and column
    {{2, 2, 7, 7}, {3, 3}, {2, 2}, {1, 1}},
    {{1, 3, 6, 9}, {2, 3}, {1, 2}, {1, 1}},
    {{1, 1, 5, 5}, {3, 1}, {1, 1}, {0, 0}},
    {{1, 2, 5, 37}, {2, 2}, {0, 0}, {0, 0}},  // the fast path, 18 windows a row: two vectors
};

TEST(MaxPool2d, MatchesNaiveLoopsForwardAndBackward) {
  for (const PoolCase& c : kCases) {
    for (DType dtype : {DType::f64, DType::f32}) {
      Tensor x = random_f64(c.x, 1).to(dtype);
      x.set_requires_grad(true);
      const Tensor out = max_pool2d(x, c.kernel, c.stride, c.padding);
      const Pair stride = c.stride[0] == 0 ? c.kernel : c.stride;
      const Tensor dy = random_f64(out.shape(), 2).to(dtype);
      const NaivePool ref = naive_pool(x, dy, c.kernel, stride, c.padding);
      expect_all_close(out, ref.max, 0, 0);
      out.backward(dy);
      expect_all_close(x.grad(), ref.max_grad, 1e-6, 1e-6);
    }
  }
}

TEST(AvgPool2d, MatchesNaiveLoopsForwardAndBackward) {
  for (const PoolCase& c : kCases) {
    for (DType dtype : {DType::f64, DType::f32}) {
      Tensor x = random_f64(c.x, 3).to(dtype);
      x.set_requires_grad(true);
      const Tensor out = avg_pool2d(x, c.kernel, c.stride, c.padding);
      const Pair stride = c.stride[0] == 0 ? c.kernel : c.stride;
      const Tensor dy = random_f64(out.shape(), 4).to(dtype);
      const NaivePool ref = naive_pool(x, dy, c.kernel, stride, c.padding);
      expect_all_close(out, ref.avg, 1e-6, 1e-6);
      out.backward(dy);
      expect_all_close(x.grad(), ref.avg_grad, 1e-6, 1e-6);
    }
  }
}

TEST(AvgPool2d, CountsPaddingInTheDivisor) {
  // A 3x3 window at the corner of a 2x2 ones image with padding 1 sees 4 ones out of 9.
  const Tensor out = avg_pool2d(Tensor::ones({1, 1, 2, 2}), {3, 3}, {1, 1}, {1, 1});
  expect_all_close(out, std::vector<double>(4, 4.0 / 9.0));
}

TEST(MaxPool2d, TiesGoToTheFirstMaximumAndNaNWins) {
  Tensor x = Tensor::ones({1, 1, 2, 4});
  x.set_requires_grad(true);
  const Tensor out = max_pool2d(x, {2, 2});
  EXPECT_EQ(out.shape(), (Shape{1, 1, 1, 2}));
  out.backward(Tensor::ones({1, 1, 1, 2}));
  expect_all_close(x.grad(), std::vector<double>{1, 0, 1, 0, 0, 0, 0, 0});

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor with_nan = Tensor::from_vector<float>({1, nan, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  const auto values = max_pool2d(with_nan, {2, 2}, {1, 1}).to_vector<float>();
  EXPECT_TRUE(std::isnan(values[0]));
  EXPECT_TRUE(std::isnan(values[1]));
  EXPECT_EQ(values[2], 8.0f);
  EXPECT_EQ(values[3], 9.0f);
  // The 2x2 stride-2 path, with the NaN last in its window.
  const auto fast = max_pool2d(Tensor::from_vector<float>({1, 2, 5, 6, 3, 4, 7, nan}, {1, 1, 2, 4}), {2, 2});
  EXPECT_EQ(fast.to_vector<float>()[0], 4.0f);
  EXPECT_TRUE(std::isnan(fast.to_vector<float>()[1]));
  // A row of 20 windows (two vectors' worth): window w < 4 holds a NaN in place w of its
  // four (top-left, top-right, bottom-left, bottom-right) and a 9 last where the NaN is not;
  // the other windows are ties of ones. The NaN wins wherever it is and takes the
  // gradient; a tie goes to the top-left value.
  constexpr int kWindows = 20, kWidth = 2 * kWindows;
  std::vector<float> grid(2 * kWidth, 1.0f);
  const auto place = [&](int w, int p) { return static_cast<size_t>((p / 2) * kWidth + 2 * w + p % 2); };
  for (int w = 0; w < 4; ++w) {
    if (w != 3) grid[place(w, 3)] = 9.0f;
    grid[place(w, w)] = nan;
  }
  Tensor row = Tensor::from_vector<float>(grid, {1, 1, 2, kWidth});
  row.set_requires_grad(true);
  const Tensor pooled = max_pool2d(row, {2, 2});
  pooled.backward(Tensor::ones({1, 1, 1, kWindows}));
  const std::vector<float> got = pooled.to_vector<float>(), grad = row.grad().to_vector<float>();
  for (int w = 0; w < kWindows; ++w) {
    const size_t winner = place(w, w < 4 ? w : 0);
    if (w < 4) {
      EXPECT_TRUE(std::isnan(got[static_cast<size_t>(w)])) << "window " << w;
    } else {
      EXPECT_EQ(got[static_cast<size_t>(w)], 1.0f) << "window " << w;
    }
    EXPECT_EQ(grad[winner], 1.0f) << "window " << w;
  }
}

TEST(Pool2d, GradientsMatchFiniteDifferences) {
  for (const PoolCase& c : kCases) {
    Tensor x = random_f64({1, 2, c.x[2], c.x[3]}, 5);
    x.set_requires_grad(true);
    expect_gradients_match(
        [&](const std::vector<Tensor>& in) { return max_pool2d(in[0], c.kernel, c.stride, c.padding); }, {x});
    expect_gradients_match(
        [&](const std::vector<Tensor>& in) { return avg_pool2d(in[0], c.kernel, c.stride, c.padding); }, {x});
  }
}

TEST(Pool2d, AcceptsThreeDimensionalInput) {
  const Tensor x = random_f64({3, 4, 4}, 6);
  const Tensor out = max_pool2d(x, {2, 2});
  EXPECT_EQ(out.shape(), (Shape{3, 2, 2}));
  expect_all_close(out, max_pool2d(x.reshape({1, 3, 4, 4}), {2, 2}).reshape({3, 2, 2}), 0, 0);
}

TEST(Pool2d, RejectsBadArguments) {
  const Tensor x = Tensor::zeros({1, 1, 4, 4});
  EXPECT_THROW(max_pool2d(x, {5, 5}), Error);                  // kernel larger than input
  EXPECT_NO_THROW(max_pool2d(x, {5, 5}, {1, 1}, {1, 1}));      // ... but not than padded input
  EXPECT_THROW(max_pool2d(x, {2, 2}, {1, 1}, {2, 0}), Error);  // padding over half the kernel
  EXPECT_THROW(avg_pool2d(x, {0, 2}), Error);
  EXPECT_THROW(avg_pool2d(Tensor::zeros({4, 4}), {2, 2}), Error);
  EXPECT_THROW(max_pool2d(Tensor::zeros({1, 1, 4, 4}, DType::i32), {2, 2}), Error);
}

}  // namespace
}  // namespace lockstep
