#include "lockstep/ops/norm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "testing/gradcheck.h"

namespace lockstep {
namespace {

using testing::expect_all_close;
using testing::expect_gradients_match;
using testing::random_f64;

// Row by row in f64: (x - mean) / sqrt(biased var + eps) · w + b.
std::vector<double> naive_layer_norm(const Tensor& x, int64_t dim, const Tensor& w, const Tensor& b, double eps) {
  const auto xv = x.to_vector<double>();
  const auto wv = w.defined() ? w.to_vector<double>() : std::vector<double>(static_cast<size_t>(dim), 1.0);
  const auto bv = b.defined() ? b.to_vector<double>() : std::vector<double>(static_cast<size_t>(dim), 0.0);
  std::vector<double> out(xv.size());
  for (size_t r = 0; r < xv.size() / static_cast<size_t>(dim); ++r) {
    const size_t base = r * static_cast<size_t>(dim);
    double mean = 0, var = 0;
    for (size_t j = 0; j < static_cast<size_t>(dim); ++j) mean += xv[base + j] / static_cast<double>(dim);
    for (size_t j = 0; j < static_cast<size_t>(dim); ++j)
      var += (xv[base + j] - mean) * (xv[base + j] - mean) / static_cast<double>(dim);
    for (size_t j = 0; j < static_cast<size_t>(dim); ++j)
      out[base + j] = (xv[base + j] - mean) / std::sqrt(var + eps) * wv[j] + bv[j];
  }
  return out;
}

TEST(LayerNorm, MatchesNaiveLoops) {
  const Tensor x = random_f64({3, 4, 5}, 1, -2, 3);
  const Tensor w = random_f64({5}, 2), b = random_f64({5}, 3);
  expect_all_close(layer_norm(x, {5}, w, b), naive_layer_norm(x, 5, w, b, 1e-5), 1e-12, 1e-12);
  expect_all_close(layer_norm(x, {5}), naive_layer_norm(x, 5, Tensor(), Tensor(), 1e-5), 1e-12, 1e-12);
  const Tensor w2 = random_f64({4, 5}, 4);
  expect_all_close(layer_norm(x, {4, 5}, w2, Tensor(), 0.1), naive_layer_norm(x, 20, w2, Tensor(), 0.1), 1e-12, 1e-12);
  const Tensor out32 = layer_norm(x.to(DType::f32), {5}, w.to(DType::f32), b.to(DType::f32));
  EXPECT_EQ(out32.dtype(), DType::f32);
  expect_all_close(out32, naive_layer_norm(x.to(DType::f32), 5, w.to(DType::f32), b.to(DType::f32), 1e-5), 1e-5, 1e-5);
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  Tensor x = random_f64({3, 2, 4}, 5), w = random_f64({4}, 6), b = random_f64({4}, 7);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  expect_gradients_match([](const std::vector<Tensor>& in) { return layer_norm(in[0], {4}, in[1], in[2]); }, {x, w, b});
  expect_gradients_match([](const std::vector<Tensor>& in) { return layer_norm(in[0], {4}); }, {x});
  Tensor w2 = random_f64({2, 4}, 8);
  w2.set_requires_grad(true);
  expect_gradients_match([](const std::vector<Tensor>& in) { return layer_norm(in[0], {2, 4}, in[1]); }, {x, w2});
  // Only the parameters need gradients.
  const Tensor constant_x = random_f64({2, 3}, 9);
  Tensor w3 = random_f64({3}, 10), b3 = random_f64({3}, 11);
  w3.set_requires_grad(true);
  b3.set_requires_grad(true);
  expect_gradients_match([&](const std::vector<Tensor>& in) { return layer_norm(constant_x, {3}, in[0], in[1]); },
                         {w3, b3});
}

TEST(LayerNorm, RejectsMismatchedShapes) {
  const Tensor x = Tensor::zeros({2, 3});
  EXPECT_THROW(layer_norm(x, {2}), Error);
  EXPECT_THROW(layer_norm(x, {}), Error);
  EXPECT_THROW(layer_norm(x, {1, 2, 3}), Error);
  EXPECT_THROW(layer_norm(x, {3}, Tensor::ones({4})), Error);
  EXPECT_THROW(layer_norm(x, {3}, Tensor(), Tensor::ones({3}, DType::f64)), Error);
  EXPECT_THROW(layer_norm(x, {3}, Tensor(), Tensor(), -1.0), Error);
}

}  // namespace
}  // namespace lockstep
