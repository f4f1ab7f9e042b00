// Gradient clipping against a naive norm, including strided gradients and thread counts.
#include "lockstep/optim/clip_grad_norm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/core/parallel.h"
#include "testing/gradcheck.h"

namespace lockstep::optim {
namespace {

using testing::random_f64;

double naive_norm(const std::vector<Tensor>& params) {
  double total = 0;
  for (const Tensor& p : params) {
    if (!p.grad().defined()) continue;
    for (double v : p.grad().to_vector<double>()) total += v * v;
  }
  return std::sqrt(total);
}

std::vector<Tensor> params_with_grads(double scale) {
  std::vector<Tensor> params;
  for (int i = 0; i < 3; ++i) {
    params.push_back(Tensor::zeros({10, 7 + i}).set_requires_grad(true));
    params.back().set_grad(random_f64({10, 7 + i}, 50 + static_cast<uint64_t>(i), -scale, scale).to(DType::f32));
  }
  params.push_back(Tensor::zeros({4}).set_requires_grad(true));  // no gradient
  return params;
}

TEST(ClipGradNorm, BelowTheLimitLeavesGradientsAlone) {
  const auto params = params_with_grads(0.01);
  const auto before = params[0].grad().to_vector<float>();
  const double expected = naive_norm(params);
  EXPECT_NEAR(clip_grad_norm(params, 100.0), expected, 1e-12 * expected);
  EXPECT_EQ(params[0].grad().to_vector<float>(), before);
}

TEST(ClipGradNorm, AboveTheLimitScalesToMaxNorm) {
  const auto params = params_with_grads(1.0);
  const double norm = naive_norm(params);
  ASSERT_GT(norm, 2.0);
  const auto before = params[1].grad().to_vector<double>();
  EXPECT_NEAR(clip_grad_norm(params, 2.0), norm, 1e-12 * norm);
  EXPECT_NEAR(naive_norm(params), 2.0 * norm / (norm + 1e-6), 1e-5);
  const auto after = params[1].grad().to_vector<double>();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_NEAR(after[i], before[i] * 2.0 / (norm + 1e-6), 1e-6);
  EXPECT_FALSE(params[3].grad().defined());
}

TEST(ClipGradNorm, ScalesStridedGradientsInPlace) {
  Tensor p = Tensor::zeros({3, 4}, DType::f64).set_requires_grad(true);
  const Tensor storage = Tensor::full({4, 3}, 2.0, DType::f64);
  p.set_grad(storage.as_strided({3, 4}, {1, 3}, 0));  // a transposed view
  const double norm = clip_grad_norm({p}, 1.0);
  EXPECT_DOUBLE_EQ(norm, std::sqrt(12 * 4.0));
  for (double v : storage.to_vector<double>()) EXPECT_NEAR(v, 2.0 / (norm + 1e-6), 1e-15);
}

TEST(ClipGradNorm, NonFiniteNormIsAnErrorWhenAsked) {
  Tensor p = Tensor::zeros({2}).set_requires_grad(true);
  p.set_grad(Tensor::from_vector<float>({1.0f, NAN}, {2}));
  EXPECT_THROW(clip_grad_norm({p}, 1.0, true), Error);
  EXPECT_TRUE(std::isnan(clip_grad_norm({p}, 1.0)));
}

TEST(ClipGradNorm, NormIsIndependentOfThreadCount) {
  Tensor p = Tensor::zeros({500000}).set_requires_grad(true);
  p.set_grad(random_f64({500000}, 9).to(DType::f32));
  const int saved = num_threads();
  set_num_threads(1);
  const double one = grad_norm({p});
  set_num_threads(4);
  const double four = grad_norm({p});
  set_num_threads(saved);
  EXPECT_EQ(one, four);
  EXPECT_NEAR(one, naive_norm({p}), 1e-10 * one);
}

}  // namespace
}  // namespace lockstep::optim
