// SGD against an independent float64 transcription of torch.optim.SGD's update rule.
#include "lockstep/optim/sgd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lockstep/core/parallel.h"
#include "testing/gradcheck.h"
#include "testing/reference_optimizers.h"

namespace lockstep::optim {
namespace {

using testing::random_f64;
using testing::ReferenceSGD;

// Runs `steps` SGD steps with fixed random gradients on an f32 or f64 parameter and on the
// reference, and compares.
void expect_matches_reference(const SGDOptions& options, DType dtype, double tolerance, int steps = 6) {
  const Shape shape{37, 5};
  Tensor param = random_f64(shape, 1).to(dtype);
  param.set_requires_grad(true);
  std::vector<double> expected = param.to_vector<double>();
  SGD sgd({param}, options);
  ReferenceSGD reference(options);
  for (int s = 0; s < steps; ++s) {
    const Tensor grad = random_f64(shape, 100 + static_cast<uint64_t>(s)).to(dtype);
    param.set_grad(grad);
    sgd.step();
    reference.step(expected, grad.to_vector<double>());
  }
  EXPECT_EQ(sgd.step_count(), steps);
  testing::expect_all_close(param, expected, tolerance, tolerance);
}

TEST(SGD, PlainStepMatchesReference) {
  expect_matches_reference({.lr = 0.1}, DType::f32, 1e-6);
  expect_matches_reference({.lr = 0.1}, DType::f64, 1e-14);
}

TEST(SGD, MomentumMatchesReference) {
  expect_matches_reference({.lr = 0.05, .momentum = 0.9}, DType::f32, 1e-5);
  expect_matches_reference({.lr = 0.05, .momentum = 0.9}, DType::f64, 1e-13);
}

TEST(SGD, DampeningAndWeightDecayMatchReference) {
  const SGDOptions options{.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.01};
  expect_matches_reference(options, DType::f32, 1e-5);
  expect_matches_reference(options, DType::f64, 1e-13);
}

TEST(SGD, NesterovMatchesReference) {
  const SGDOptions options{.lr = 0.02, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true};
  expect_matches_reference(options, DType::f32, 1e-5);
  expect_matches_reference(options, DType::f64, 1e-13);
}

TEST(SGD, FirstMomentumStepUsesTheGradientItself) {
  // torch: the buffer starts as the gradient, not momentum * 0 + (1 - dampening) * g.
  Tensor p = Tensor::from_vector<double>({1.0}, {1}).set_requires_grad(true);
  SGD sgd({p}, {.lr = 0.5, .momentum = 0.9, .dampening = 0.5});
  p.set_grad(Tensor::from_vector<double>({2.0}, {1}));
  sgd.step();
  EXPECT_DOUBLE_EQ(p.item(), 1.0 - 0.5 * 2.0);
  EXPECT_DOUBLE_EQ(sgd.state(0, 0).item(), 2.0);
  sgd.step();  // buf = 0.9 * 2 + 0.5 * 2 = 2.8
  EXPECT_DOUBLE_EQ(sgd.state(0, 0).item(), 2.8);
  EXPECT_DOUBLE_EQ(p.item(), 0.0 - 0.5 * 2.8);
}

TEST(SGD, SkipsParametersWithoutGradient) {
  Tensor a = Tensor::from_vector<float>({1, 2}, {2}).set_requires_grad(true);
  Tensor b = Tensor::from_vector<float>({3, 4}, {2}).set_requires_grad(true);
  SGD sgd({a, b}, {.lr = 1.0, .momentum = 0.9});
  a.set_grad(Tensor::from_vector<float>({1, 1}, {2}));
  sgd.step();
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 1}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{3, 4}));
  EXPECT_FALSE(sgd.state(1, 0).defined());  // no momentum buffer for b
  sgd.zero_grad();
  EXPECT_FALSE(a.grad().defined());
}

TEST(SGD, LargeTensorIsIndependentOfThreadCount) {
  const Shape shape{300000};
  const Tensor start = random_f64(shape, 7).to(DType::f32);
  const Tensor grad = random_f64(shape, 8).to(DType::f32);
  std::vector<std::vector<float>> results;
  const int saved = num_threads();
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    Tensor p = start.clone().set_requires_grad(true);
    SGD sgd({p}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
    for (int s = 0; s < 2; ++s) {
      p.set_grad(grad);
      sgd.step();
    }
    results.push_back(p.to_vector<float>());
  }
  set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
}

TEST(SGD, RejectsBadOptionsAndParameters) {
  Tensor p = Tensor::zeros({2}).set_requires_grad(true);
  EXPECT_THROW(SGD({p}, {.lr = 0.1, .nesterov = true}), Error);  // nesterov without momentum
  EXPECT_THROW(SGD({p}, {.lr = -1}), Error);
  EXPECT_THROW(SGD({p, p}, {.lr = 0.1}), Error);                // duplicate
  EXPECT_THROW(SGD({Tensor::zeros({2})}, {.lr = 0.1}), Error);  // no requires_grad
  SGD sgd({p}, {.lr = 0.1});
  p.set_grad(Tensor::zeros({3}));
  EXPECT_THROW(sgd.step(), Error);  // gradient shape differs
}

}  // namespace
}  // namespace lockstep::optim
