#include "lockstep/ops/loss.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "lockstep/core/parallel.h"
#include "lockstep/ops/elementwise.h"
#include "lockstep/ops/reduce.h"
#include "testing/errors.h"
#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::error_of;
using testing::expect_all_close;
using testing::expect_gradients_match;
using testing::random_f64;

// Softmax (or log-softmax) of a [outer, n, inner] view along the middle axis, in long double
// straight from the definition (no max subtraction: the test inputs are moderate).
std::vector<double> naive_softmax(const Tensor& x, int64_t axis, bool log) {
  const auto v = x.to_vector<double>();
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i < axis) outer *= x.size(i);
    if (i > axis) inner *= x.size(i);
  }
  const int64_t n = x.size(axis);
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      long double total = 0;
      for (int64_t k = 0; k < n; ++k) total += std::exp(static_cast<long double>(v[(o * n + k) * inner + j]));
      for (int64_t k = 0; k < n; ++k) {
        const size_t at = static_cast<size_t>((o * n + k) * inner + j);
        out[at] = log ? static_cast<double>(v[at] - std::log(total))
                      : static_cast<double>(std::exp(static_cast<long double>(v[at])) / total);
      }
    }
  return out;
}

TEST(Softmax, MatchesTheDefinitionOnEveryAxis) {
  const Tensor x = random_f64({3, 4, 5}, 1, -3, 3);
  for (int64_t axis : {0, 1, 2}) {
    for (DType dtype : {DType::f32, DType::f64}) {
      SCOPED_TRACE(std::to_string(axis) + " " + dtype_name(dtype));
      const double rtol = dtype == DType::f32 ? 1e-6 : 1e-14;
      expect_all_close(softmax(x.to(dtype), axis), naive_softmax(x, axis, false), rtol, 1e-7);
      expect_all_close(log_softmax(x.to(dtype), axis), naive_softmax(x, axis, true), rtol, 1e-6);
    }
  }
  expect_all_close(softmax(x), naive_softmax(x, 2, false), 1e-14);  // default: last axis
}

TEST(Softmax, LongRowsAndStridedInputs) {
  const Tensor wide = random_f64({2, 40000}, 2, -5, 5);  // rows longer than a parallel chunk
  expect_all_close(log_softmax(wide.to(DType::f32)), naive_softmax(wide, 1, true), 1e-6, 1e-5);
  const Tensor base = random_f64({6, 4}, 3);
  const Tensor view = base.as_strided({4, 3}, {1, 8}, 0);  // base[::2].T
  expect_all_close(softmax(view, 0), naive_softmax(view, 0, false), 1e-14);
  expect_all_close(softmax(view, 1), naive_softmax(view, 1, false), 1e-14);
}

TEST(Softmax, StableForLargeLogits) {
  const Tensor x = Tensor::from_vector<float>({1000, 1001, 1002, -1000, 0, 1000}, {2, 3});
  const double e1 = std::exp(-1.0), e2 = std::exp(-2.0);
  const double z = 1 + e1 + e2;
  expect_all_close(softmax(x), {e2 / z, e1 / z, 1 / z, 0, 0, 1}, 1e-6, 1e-7);
  expect_all_close(log_softmax(x), {-2 - std::log(z), -1 - std::log(z), -std::log(z), -2000, -1000, 0}, 1e-6, 1e-5);
  // -inf entries (masked positions) get probability 0.
  const float inf = std::numeric_limits<float>::infinity();
  expect_all_close(softmax(Tensor::from_vector<float>({-inf, 0, 0, 1}, {1, 4})),
                   {0, 1 / (2 + std::exp(1.0)), 1 / (2 + std::exp(1.0)), std::exp(1.0) / (2 + std::exp(1.0))}, 1e-6, 0);
}

TEST(Softmax, Gradients) {
  for (int64_t axis : {-1, 1, 0}) {
    SCOPED_TRACE(axis);
    Tensor x = random_f64({2, 3, 4}, 4, -2, 2).set_requires_grad(true);
    expect_gradients_match([axis](const std::vector<Tensor>& in) { return softmax(in[0], axis); }, {x});
    expect_gradients_match([axis](const std::vector<Tensor>& in) { return log_softmax(in[0], axis); }, {x});
  }
}

TEST(Softmax, BadAxis) {
  EXPECT_THROW(softmax(Tensor::zeros({2, 3}), 2), Error);
  EXPECT_THROW(log_softmax(Tensor::zeros({2, 3}), -3), Error);
  EXPECT_THROW(softmax(Tensor::zeros({2}, DType::i32)), Error);
}

// Per-row losses log(sum_j e^x_ij) - x_i,label_i, in long double.
std::vector<double> naive_losses(const Tensor& logits, const std::vector<int64_t>& labels) {
  const auto v = logits.to_vector<double>();
  const int64_t n = logits.size(0), c = logits.size(1);
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i) {
    long double total = 0;
    for (int64_t j = 0; j < c; ++j) total += std::exp(static_cast<long double>(v[i * c + j]));
    out.push_back(static_cast<double>(std::log(total) - v[i * c + labels[i]]));
  }
  return out;
}

TEST(CrossEntropy, MatchesTheDefinitionForEveryReduction) {
  const Tensor logits = random_f64({6, 5}, 5, -4, 4);
  const std::vector<int64_t> labels = {0, 4, 2, 2, 1, 3};
  const auto losses = naive_losses(logits, labels);
  double total = 0;
  for (double l : losses) total += l;
  for (DType dtype : {DType::f32, DType::f64}) {
    for (DType label_dtype : {DType::i64, DType::i32}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + dtype_name(label_dtype));
      const double rtol = dtype == DType::f32 ? 1e-6 : 1e-14;
      const Tensor x = logits.to(dtype);
      const Tensor y = Tensor::from_vector(labels, {6}).to(label_dtype);
      expect_all_close(cross_entropy(x, y, Reduction::none), losses, rtol, 1e-6);
      const Tensor s = cross_entropy(x, y, Reduction::sum);
      EXPECT_EQ(s.shape(), Shape{});
      expect_all_close(s, {total}, rtol, 1e-6);
      expect_all_close(cross_entropy(x, y), {total / 6}, rtol, 1e-6);
    }
  }
}

TEST(CrossEntropy, StridedLogitsAndLabels) {
  const Tensor base = random_f64({5, 8}, 6);
  const Tensor logits = base.as_strided({4, 5}, {2, 8}, 1);  // base[:, 1::2].T
  const Tensor label_base = Tensor::from_vector<int64_t>({3, 9, 0, 9, 4, 9, 1}, {7});
  const Tensor labels = label_base.as_strided({4}, {2}, 0);  // {3, 0, 4, 1}
  expect_all_close(cross_entropy(logits, labels, Reduction::none), naive_losses(logits, {3, 0, 4, 1}), 1e-14);
}

TEST(CrossEntropy, GradientIsSoftmaxMinusOneHot) {
  const Tensor logits = random_f64({4, 3}, 7, -2, 2);
  const std::vector<int64_t> labels = {2, 0, 0, 1};
  const auto p = naive_softmax(logits, 1, false);
  std::vector<double> expected;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j) expected.push_back((p[i * 3 + j] - (labels[i] == j ? 1.0 : 0.0)) / 4);
  Tensor x = logits.to(DType::f32).set_requires_grad(true);
  cross_entropy(x, Tensor::from_vector(labels, {4})).backward();
  expect_all_close(x.grad(), expected, 1e-6, 1e-7);
}

TEST(CrossEntropy, Gradients) {
  const Tensor labels = Tensor::from_vector<int32_t>({1, 0, 3, 3, 2}, {5});
  for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
    SCOPED_TRACE(static_cast<int>(reduction));
    Tensor x = random_f64({5, 4}, 8, -3, 3).set_requires_grad(true);
    expect_gradients_match(
        [&labels, reduction](const std::vector<Tensor>& in) { return cross_entropy(in[0], labels, reduction); }, {x});
  }
  // Through a composition, with the loss scaled.
  Tensor x = random_f64({5, 4}, 10).set_requires_grad(true);
  Tensor w = random_f64({4}, 11).set_requires_grad(true);
  expect_gradients_match(
      [&labels](const std::vector<Tensor>& in) { return cross_entropy(tanh(in[0]) * in[1], labels) * 3.0; }, {x, w});
}

TEST(CrossEntropy, IndependentOfThreadCount) {
  const Tensor logits = random_f64({4096, 100}, 12, -5, 5).to(DType::f32);
  std::vector<int64_t> label_values;
  for (int64_t i = 0; i < 4096; ++i) label_values.push_back((i * 37) % 100);
  const Tensor labels = Tensor::from_vector(label_values, {4096});
  auto run = [&](int threads) {
    set_num_threads(threads);
    Tensor x = logits.detach().set_requires_grad(true);
    Tensor loss = cross_entropy(x, labels);
    loss.backward();
    return std::make_pair(loss, x.grad());
  };
  const int previous = num_threads();
  const auto [loss1, grad1] = run(1);
  const auto [loss3, grad3] = run(3);
  set_num_threads(previous);
  EXPECT_EQ(loss1.item(), loss3.item());
  EXPECT_EQ(std::memcmp(grad1.raw_data(), grad3.raw_data(), grad1.nbytes()), 0);
  double total = 0;
  for (double l : naive_losses(logits, label_values)) total += l;
  EXPECT_NEAR(loss1.item(), total / 4096, 1e-5);
}

TEST(CrossEntropy, ErrorsNameTheProblem) {
  const Tensor logits = Tensor::zeros({4, 5});
  const std::string bad = error_of([&] { cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1, 7, 2}, {4})); });
  EXPECT_NE(bad.find("label 7"), std::string::npos) << bad;
  EXPECT_NE(bad.find("position 2"), std::string::npos) << bad;
  EXPECT_NE(bad.find("5 classes"), std::string::npos) << bad;
  const std::string negative = error_of([&] {
    cross_entropy(logits, Tensor::from_vector<int32_t>({0, -1, 0, 0}, {4}));
  });
  EXPECT_NE(negative.find("label -1 at position 1"), std::string::npos) << negative;
  const std::string shape = error_of([&] { cross_entropy(logits, Tensor::zeros({3}, DType::i64)); });
  EXPECT_NE(shape.find("[4]"), std::string::npos) << shape;
  EXPECT_NE(shape.find("[3]"), std::string::npos) << shape;
  EXPECT_THROW(cross_entropy(Tensor::zeros({5}), Tensor::zeros({5}, DType::i64)), Error);
  EXPECT_THROW(cross_entropy(logits, Tensor::zeros({4})), Error);  // float labels
  EXPECT_THROW(cross_entropy(logits, Tensor::zeros({4, 1}, DType::i64)), Error);
  EXPECT_THROW(cross_entropy(logits.to(DType::i32), Tensor::zeros({4}, DType::i64)), Error);
}

}  // namespace
}  // namespace lockstep
