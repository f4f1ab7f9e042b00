#include "lockstep/ops/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "lockstep/core/parallel.h"
#include "lockstep/ops/elementwise.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::expect_all_close;
using testing::expect_gradients_match;
using testing::random_f64;

// Coordinates of every element of `shape`, in row-major order.
std::vector<std::vector<int64_t>> all_coords(const Shape& shape) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> c(shape.size(), 0);
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  for (int64_t i = 0; i < total; ++i) {
    out.push_back(c);
    for (size_t k = c.size(); k-- > 0;) {
      if (++c[k] < shape[k]) break;
      c[k] = 0;
    }
  }
  return out;
}

// Sum over the axes in `reduce` by accumulating every input element (in double) into the
// output element its kept coordinates name.
std::vector<double> naive_sum(const Tensor& x, const std::vector<bool>& reduce, bool mean) {
  const auto values = x.to_vector<double>();
  Shape kept;
  int64_t count = 1;
  for (size_t i = 0; i < reduce.size(); ++i) {
    if (reduce[i]) {
      count *= x.shape()[i];
    } else {
      kept.push_back(x.shape()[i]);
    }
  }
  int64_t out_n = 1;
  for (int64_t d : kept) out_n *= d;
  std::vector<double> out(static_cast<size_t>(out_n), 0.0);
  std::vector<int64_t> coord(reduce.size(), 0);
  for (double value : values) {
    int64_t o = 0;
    for (size_t i = 0; i < reduce.size(); ++i)
      if (!reduce[i]) o = o * x.shape()[i] + coord[i];
    out[static_cast<size_t>(o)] += value;
    for (size_t k = coord.size(); k-- > 0;) {
      if (++coord[k] < x.shape()[k]) break;
      coord[k] = 0;
    }
  }
  if (mean)
    for (double& v : out) v /= static_cast<double>(count);
  return out;
}

TEST(Reduce, SumAndMeanOverAxesMatchNaive) {
  const Tensor x64 = random_f64({3, 4, 5}, 1);
  const std::vector<std::vector<int64_t>> axes_list = {{0}, {1}, {2}, {-1}, {0, 2}, {2, 0}, {0, 1}, {1, 2}, {0, 1, 2}};
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor x = x64.to(dtype);
    const double rtol = dtype == DType::f32 ? 1e-6 : 1e-14;
    for (const auto& axes : axes_list) {
      SCOPED_TRACE(shape_str(axes) + " " + dtype_name(dtype));
      std::vector<bool> mask(3, false);
      Shape kept, keepdim;
      for (int64_t a : axes) mask[static_cast<size_t>(a < 0 ? a + 3 : a)] = true;
      for (size_t i = 0; i < 3; ++i) {
        if (!mask[i]) kept.push_back(x.shape()[i]);
        keepdim.push_back(mask[i] ? 1 : x.shape()[i]);
      }
      const Tensor s = sum(x, axes);
      EXPECT_EQ(s.shape(), kept);
      expect_all_close(s, naive_sum(x, mask, false), rtol, 1e-6);
      const Tensor m = mean(x, axes, /*keepdim=*/true);
      EXPECT_EQ(m.shape(), keepdim);
      expect_all_close(m, naive_sum(x, mask, true), rtol, 1e-7);
    }
    const Tensor all = sum(x);
    EXPECT_EQ(all.shape(), Shape{});
    expect_all_close(all, naive_sum(x, {true, true, true}, false), rtol, 1e-6);
    expect_all_close(mean(x), naive_sum(x, {true, true, true}, true), rtol, 1e-7);
    // No axes: nothing is reduced (NumPy's axis=()).
    expect_all_close(sum(x, {}), x.to_vector<double>(), 0, 0);
  }
}

TEST(Reduce, SizeOneAndEmptyAxes) {
  const Tensor x = random_f64({2, 1, 3, 1}, 2);
  expect_all_close(sum(x, {1, 3}), naive_sum(x, {false, true, false, true}, false), 1e-15);
  expect_all_close(sum(x, {0, 2}), naive_sum(x, {true, false, true, false}, false), 1e-15);
  const Tensor empty = Tensor::empty({3, 0});  // no elements to fill
  expect_all_close(sum(empty, {1}), {0, 0, 0});
  EXPECT_EQ(sum(empty, {0}).shape(), (Shape{0}));
  EXPECT_TRUE(std::isnan(mean(empty).item()));  // 0/0, as PyTorch
}

TEST(Reduce, StridedInputs) {
  const Tensor base = random_f64({6, 5}, 3);
  const Tensor view = base.as_strided({5, 3}, {1, 10}, 0);  // base[::2, :] transposed
  ASSERT_FALSE(view.is_contiguous());
  expect_all_close(sum(view, {0}), naive_sum(view, {true, false}, false), 1e-14);
  expect_all_close(sum(view, {1}), naive_sum(view, {false, true}, false), 1e-14);
  expect_all_close(mean(view.to(DType::f32)), naive_sum(view, {true, true}, true), 1e-6);
}

// Runs f under 1 and 3 threads and checks the results are bit-identical.
void expect_same_bits_across_thread_counts(const std::function<Tensor()>& f) {
  const int previous = num_threads();
  set_num_threads(1);
  const Tensor one = f();
  set_num_threads(3);
  const Tensor three = f();
  set_num_threads(previous);
  ASSERT_EQ(one.shape(), three.shape());
  EXPECT_EQ(std::memcmp(one.raw_data(), three.raw_data(), one.nbytes()), 0);
}

TEST(Reduce, LargeSumsAreAccurateAndIndependentOfThreadCount) {
  const Tensor flat = random_f64({1 << 20}, 4).to(DType::f32);
  const Tensor tall = random_f64({50000, 3}, 5).to(DType::f32);  // the blocked few-outputs path
  const Tensor wide = random_f64({3, 70001}, 6).to(DType::f32);
  expect_same_bits_across_thread_counts([&] { return sum(flat); });
  expect_same_bits_across_thread_counts([&] { return sum(tall, {0}); });
  expect_same_bits_across_thread_counts([&] { return sum(wide, {1}); });
  expect_same_bits_across_thread_counts([&] { return sum(wide, {0}); });
  expect_all_close(sum(flat), naive_sum(flat, {true}, false), 1e-5, 1e-3);
  expect_all_close(sum(tall, {0}), naive_sum(tall, {true, false}, false), 1e-5, 1e-3);
  expect_all_close(sum(wide, {1}), naive_sum(wide, {false, true}, false), 1e-5, 1e-3);
  expect_all_close(sum(wide, {0}), naive_sum(wide, {true, false}, false), 1e-6, 1e-6);
}

TEST(Reduce, MaxAndArgmaxTakeTheFirstLargest) {
  const Tensor x = Tensor::from_vector<float>({1, 3, 3, 2, /**/ 5, -1, 5, 0, /**/ -2, -2, -3, -2}, {3, 4});
  const Tensor m1 = max(x, 1);
  EXPECT_EQ(m1.shape(), (Shape{3}));
  expect_all_close(m1, {3, 5, -2}, 0, 0);
  const Tensor a1 = argmax(x, -1, /*keepdim=*/true);
  EXPECT_EQ(a1.dtype(), DType::i64);
  EXPECT_EQ(a1.shape(), (Shape{3, 1}));
  EXPECT_EQ(a1.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0}));
  expect_all_close(max(x, 0), {5, 3, 5, 2}, 0, 0);
  EXPECT_EQ(argmax(x, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1, 0}));
  // nan wins, as in PyTorch.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor with_nan = Tensor::from_vector<float>({1, nan, 7, nan}, {4});
  EXPECT_TRUE(std::isnan(max(with_nan, 0).item()));
  EXPECT_EQ(argmax(with_nan, 0).item(), 1);
  // Rows longer than the kernel's 32 lanes: ties and nans resolved to the first position.
  std::vector<double> long_row(70);
  for (size_t i = 0; i < long_row.size(); ++i) long_row[i] = std::sin(static_cast<double>(i));
  long_row[40] = long_row[65] = 2;
  const Tensor ties = Tensor::from_vector(long_row, {70});
  EXPECT_EQ(argmax(ties, 0).item(), 40);
  EXPECT_EQ(argmax(ties.to(DType::f32), 0).item(), 40);
  long_row[50] = long_row[60] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(argmax(Tensor::from_vector(long_row, {70}), 0).item(), 50);
}

TEST(Reduce, MaxMatchesNaiveOnEveryAxis) {
  const Tensor x = random_f64({4, 5, 6}, 7);
  const auto values = x.to_vector<double>();
  const Shape& s = x.shape();
  for (int64_t axis = 0; axis < 3; ++axis) {
    SCOPED_TRACE(axis);
    std::vector<double> best;
    std::vector<int64_t> where;
    Shape kept;
    for (int64_t i = 0; i < 3; ++i)
      if (i != axis) kept.push_back(s[static_cast<size_t>(i)]);
    for (const auto& c : all_coords(kept)) {
      double b = -std::numeric_limits<double>::infinity();
      int64_t w = -1;
      for (int64_t k = 0; k < s[static_cast<size_t>(axis)]; ++k) {
        std::vector<int64_t> full = c;
        full.insert(full.begin() + axis, k);
        const double v = values[static_cast<size_t>((full[0] * s[1] + full[1]) * s[2] + full[2])];
        if (v > b) {
          b = v;
          w = k;
        }
      }
      best.push_back(b);
      where.push_back(w);
    }
    expect_all_close(max(x, axis), best, 0, 0);
    expect_all_close(max(x.to(DType::f32), axis), best, 1e-7, 0);
    EXPECT_EQ(argmax(x, axis).to_vector<int64_t>(), where);
  }
}

TEST(Reduce, MaxGradientGoesToTheFirstMaximum) {
  Tensor x = Tensor::from_vector<double>({1, 3, 3, 2, 4, 4}, {2, 3}).set_requires_grad(true);
  sum(max(x, 1) * Tensor::from_vector<double>({10, 20}, {2})).backward();
  expect_all_close(x.grad(), {0, 10, 0, 0, 20, 0}, 0, 0);
}

TEST(Reduce, SumToReducesBroadcastAxes) {
  const Tensor x = random_f64({2, 3, 4}, 8);
  struct Case {
    Shape target;
    std::vector<bool> reduce;
  };
  const std::vector<Case> cases = {{{3, 1}, {true, false, true}},    {{4}, {true, true, false}},
                                   {{1, 1, 4}, {true, true, false}}, {{}, {true, true, true}},
                                   {{2, 1, 1}, {false, true, true}}, {{1, 3, 4}, {true, false, false}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(shape_str(c.target));
    const Tensor out = sum_to(x, c.target);
    EXPECT_EQ(out.shape(), c.target);
    expect_all_close(out, naive_sum(x, c.reduce, false), 1e-14);
  }
  EXPECT_TRUE(sum_to(x, {2, 3, 4}).is_same(x));
  EXPECT_THROW(sum_to(x, {3}), Error);
  EXPECT_THROW(sum_to(x, {1, 2, 3, 4}), Error);
  EXPECT_THROW(sum_to(x, {2, 1, 3}), Error);
}

TEST(Reduce, Gradients) {
  Tensor x = random_f64({2, 3, 4}, 9).set_requires_grad(true);
  const std::vector<std::function<Tensor(const Tensor&)>> fns = {
      [](const Tensor& t) { return sum(t); },
      [](const Tensor& t) { return mean(t); },
      [](const Tensor& t) {
        return sum(t, {0, 2});
      },
      [](const Tensor& t) { return sum(t, {1}, true); },
      [](const Tensor& t) { return mean(t, {-1}); },
      [](const Tensor& t) {
        return mean(t, {0, 1}, true);
      },
      [](const Tensor& t) { return max(t, 1); },
      [](const Tensor& t) { return max(t, 2, true); },
      [](const Tensor& t) {
        return sum_to(t, {3, 1});
      },
      [](const Tensor& t) { return sum_to(t, {4}); },
  };
  for (size_t i = 0; i < fns.size(); ++i) {
    SCOPED_TRACE(i);
    auto f = fns[i];
    expect_gradients_match([f](const std::vector<Tensor>& in) { return f(in[0]); }, {x});
  }
}

TEST(Reduce, ErrorsNameTheProblem) {
  const Tensor x = Tensor::zeros({2, 3});
  try {
    sum(x, {2});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("sum: axis 2"), std::string::npos) << message;
    EXPECT_NE(message.find("[2, 3]"), std::string::npos) << message;
  }
  EXPECT_THROW(sum(x, {-3}), Error);
  EXPECT_THROW(mean(x, {1, -1}), Error);  // the same axis twice
  EXPECT_THROW(max(x, 2), Error);
  EXPECT_THROW(argmax(x, -3), Error);
  EXPECT_THROW(max(Tensor::empty({2, 0}), 1), Error);
  EXPECT_THROW(sum(Tensor::zeros({2}, DType::i64)), Error);
  EXPECT_THROW(sum(Tensor::scalar(1.0), {0}), Error);
}

}  // namespace
}  // namespace lockstep
