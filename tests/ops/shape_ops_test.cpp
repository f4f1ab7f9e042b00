#include "lockstep/ops/shape_ops.h"

#include <gtest/gtest.h>

#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::expect_all_close;
using testing::expect_gradients_match;
using testing::random_f64;

Tensor iota(const Shape& shape) {
  std::vector<double> values(static_cast<size_t>(numel(shape)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i);
  return Tensor::from_vector<double>(values, shape);
}

Tensor param(const Shape& shape, uint64_t seed) {
  Tensor t = random_f64(shape, seed);
  t.set_requires_grad(true);
  return t;
}

TEST(Reshape, InfersOneAxisAndViewsContiguousInput) {
  const Tensor x = iota({2, 3, 4});
  const Tensor y = reshape(x, {4, -1});
  EXPECT_EQ(y.shape(), (Shape{4, 6}));
  EXPECT_EQ(y.storage(), x.storage());
  EXPECT_EQ(x.reshape({-1}).shape(), (Shape{24}));
  expect_all_close(y, x.to_vector<double>(), 0, 0);
  EXPECT_EQ(reshape(Tensor::scalar(3.0), {1, 1}).shape(), (Shape{1, 1}));
}

TEST(Reshape, CopiesStridedInput) {
  const Tensor t = transpose(iota({2, 3}), 0, 1);  // [[0, 3], [1, 4], [2, 5]]
  const Tensor y = reshape(t, {6});
  EXPECT_NE(y.storage(), t.storage());
  expect_all_close(y, std::vector<double>{0, 3, 1, 4, 2, 5}, 0, 0);
}

TEST(Reshape, ErrorNamesBothShapes) {
  try {
    reshape(Tensor::zeros({2, 3}), {4, 2});
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("[2, 3]"), std::string::npos) << message;
    EXPECT_NE(message.find("[4, 2]"), std::string::npos) << message;
  }
  EXPECT_THROW(reshape(Tensor::zeros({2, 3}), {-1, -1}), Error);
  EXPECT_THROW(reshape(Tensor::zeros({2, 3}), {4, -1}), Error);
  EXPECT_THROW(reshape(Tensor::zeros({2, 3}), {-2, -3}), Error);
}

TEST(Flatten, MergesTheGivenAxes) {
  const Tensor x = iota({2, 3, 4, 5});
  EXPECT_EQ(flatten(x).shape(), (Shape{2, 60}));
  EXPECT_EQ(flatten(x, 0).shape(), (Shape{120}));
  EXPECT_EQ(flatten(x, 1, 2).shape(), (Shape{2, 12, 5}));
  EXPECT_EQ(flatten(x, -2, -1).shape(), (Shape{2, 3, 20}));
  EXPECT_THROW(flatten(x, 2, 1), Error);
}

TEST(Permute, MovesAxesWithoutCopying) {
  const Tensor x = iota({2, 3, 4});
  const Tensor y = permute(x, {2, 0, 1});
  EXPECT_EQ(y.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(y.storage(), x.storage());
  const auto v = y.to_vector<double>();
  for (int64_t k = 0; k < 4; ++k)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(v[static_cast<size_t>((k * 2 + i) * 3 + j)], (i * 3 + j) * 4 + k);
  EXPECT_EQ(transpose(x, -1, 0).shape(), (Shape{4, 3, 2}));
  EXPECT_THROW(permute(x, {0, 1}), Error);
  EXPECT_THROW(permute(x, {0, 1, 1}), Error);
  EXPECT_THROW(permute(x, {0, 1, 3}), Error);
}

TEST(Slice, ClampsLikePythonAndSharesStorage) {
  const Tensor x = iota({10});
  auto values = [&](int64_t start, int64_t end, int64_t step) {
    return slice(x, 0, start, end, step).to_vector<double>();
  };
  EXPECT_EQ(values(2, 5, 1), (std::vector<double>{2, 3, 4}));
  EXPECT_EQ(values(-3, 100, 1), (std::vector<double>{7, 8, 9}));
  EXPECT_EQ(values(-100, 2, 1), (std::vector<double>{0, 1}));
  EXPECT_EQ(values(1, 8, 3), (std::vector<double>{1, 4, 7}));
  EXPECT_EQ(values(0, -1, 4), (std::vector<double>{0, 4, 8}));
  EXPECT_TRUE(values(5, 2, 1).empty());
  EXPECT_TRUE(values(10, 20, 1).empty());
  EXPECT_THROW(slice(x, 0, 0, 5, 0), Error);
  EXPECT_THROW(slice(x, 1, 0, 5), Error);

  // A view: writing through the base shows in the slice, and nothing was allocated.
  const Tensor m = iota({4, 5});
  const Tensor rows = slice(m, 0, 1, 3);
  const Tensor cols = slice(m, 1, 1, 5, 2);
  EXPECT_EQ(rows.storage(), m.storage());
  EXPECT_EQ(cols.storage(), m.storage());
  m.data<double>()[6] = -1;
  EXPECT_EQ(rows.to_vector<double>()[1], -1);
  EXPECT_EQ(cols.shape(), (Shape{4, 2}));
  EXPECT_EQ(cols.to_vector<double>(), (std::vector<double>{1, 3, -1, 8, 11, 13, 16, 18}));
}

TEST(Concat, JoinsAlongAnAxis) {
  const Tensor a = iota({2, 2}), b = reshape(iota({2, 3}), {2, 3});
  const Tensor c = concat({a, b}, 1);
  EXPECT_EQ(c.shape(), (Shape{2, 5}));
  expect_all_close(c, std::vector<double>{0, 1, 0, 1, 2, 2, 3, 3, 4, 5}, 0, 0);
  const Tensor d = concat({iota({1, 2}), transpose(iota({2, 2}), 0, 1)}, 0);
  expect_all_close(d, std::vector<double>{0, 1, 0, 2, 1, 3}, 0, 0);
}

TEST(Concat, ErrorNamesTheOffendingTensor) {
  try {
    concat({Tensor::zeros({2, 3}), Tensor::zeros({2, 4}), Tensor::zeros({3, 4})}, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("tensor 2"), std::string::npos) << message;
    EXPECT_NE(message.find("[3, 4]"), std::string::npos) << message;
  }
  EXPECT_THROW(concat({}), Error);
  EXPECT_THROW(concat({Tensor::zeros({2}), Tensor::zeros({2}, DType::f64)}), Error);
  EXPECT_THROW(concat({Tensor::zeros({2}), Tensor::zeros({2, 1})}), Error);
}

TEST(Squeeze, AddsAndRemovesUnitAxes) {
  const Tensor x = iota({2, 3});
  EXPECT_EQ(unsqueeze(x, 0).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(unsqueeze(x, 1).shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(unsqueeze(x, -1).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(unsqueeze(x, 1).storage(), x.storage());
  expect_all_close(unsqueeze(x, 2), x.to_vector<double>(), 0, 0);
  EXPECT_EQ(squeeze(unsqueeze(x, 1), 1).shape(), (Shape{2, 3}));
  EXPECT_EQ(squeeze(Tensor::zeros({1}), 0).shape(), (Shape{}));
  EXPECT_THROW(squeeze(x, 0), Error);
  EXPECT_THROW(unsqueeze(x, 4), Error);
}

TEST(ShapeOps, GradientsMatchFiniteDifferences) {
  const Tensor a = param({2, 3, 4}, 1), b = param({2, 2, 4}, 2);
  using Inputs = std::vector<Tensor>;
  expect_gradients_match([](const Inputs& in) { return reshape(in[0], {4, -1}); }, {a});
  expect_gradients_match([](const Inputs& in) { return reshape(transpose(in[0], 0, 2), {-1}); }, {a});
  expect_gradients_match([](const Inputs& in) { return flatten(in[0]); }, {a});
  expect_gradients_match([](const Inputs& in) { return transpose(in[0], 1, 2); }, {a});
  expect_gradients_match([](const Inputs& in) { return permute(in[0], {2, 0, 1}); }, {a});
  expect_gradients_match([](const Inputs& in) { return slice(in[0], 2, -3, 4, 2); }, {a});
  expect_gradients_match([](const Inputs& in) { return slice(permute(in[0], {1, 2, 0}), 0, 1, 3); }, {a});
  expect_gradients_match([](const Inputs& in) { return concat({in[0], in[1], in[0]}, 1); }, {a, b});
  expect_gradients_match(
      [](const Inputs& in) {
        return concat({transpose(in[0], 1, 2), in[0]}, 0);
      },
      {param({2, 3, 3}, 3)});
  expect_gradients_match([](const Inputs& in) { return squeeze(unsqueeze(in[0], 1), 1); }, {a});
  expect_gradients_match([](const Inputs& in) { return unsqueeze(transpose(in[0], 0, 1), 3); }, {a});
}

TEST(ShapeOps, ViewGradientsAccumulateIntoOneLeaf) {
  Tensor x = Tensor::zeros({4}, DType::f64);
  x.set_requires_grad(true);
  const Tensor y = concat({slice(x, 0, 0, 2), slice(x, 0, 1, 4)}, 0);  // x0, x1, x1, x2, x3
  y.backward(Tensor::ones({5}, DType::f64));
  expect_all_close(x.grad(), std::vector<double>{1, 2, 1, 1}, 0, 0);
}

}  // namespace
}  // namespace lockstep
