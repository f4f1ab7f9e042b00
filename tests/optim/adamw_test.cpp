// AdamW against an independent float64 transcription of torch.optim.AdamW's algorithm and
// against the closed form of its first step.
#include "lockstep/optim/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "testing/gradcheck.h"
#include "testing/reference_optimizers.h"

namespace lockstep::optim {
namespace {

using testing::random_f64;
using testing::ReferenceAdamW;

void expect_matches_reference(const AdamWOptions& options, DType dtype, double tolerance, int steps = 8) {
  const Shape shape{23, 7};
  Tensor param = random_f64(shape, 3).to(dtype);
  param.set_requires_grad(true);
  std::vector<double> expected = param.to_vector<double>();
  AdamW adamw({param}, options);
  ReferenceAdamW reference(options);
  for (int s = 0; s < steps; ++s) {
    const Tensor grad = random_f64(shape, 200 + static_cast<uint64_t>(s), -2.0, 2.0).to(dtype);
    param.set_grad(grad);
    adamw.step();
    reference.step(expected, grad.to_vector<double>());
  }
  testing::expect_all_close(param, expected, tolerance, tolerance);
}

TEST(AdamW, DefaultsMatchReference) {
  expect_matches_reference({}, DType::f32, 2e-6);
  expect_matches_reference({}, DType::f64, 1e-12);
}

TEST(AdamW, LargeLrAndWeightDecayMatchReference) {
  const AdamWOptions options{.lr = 0.05, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1};
  expect_matches_reference(options, DType::f32, 1e-5);
  expect_matches_reference(options, DType::f64, 1e-12);
}

TEST(AdamW, SmallBeta1TakesTheOtherLerpBranchAndStillMatches) {
  // 1 - beta1 >= 0.5 switches ATen's lerp to end - (end - start) * (1 - w).
  const AdamWOptions options{.lr = 0.01, .beta1 = 0.3, .beta2 = 0.9, .weight_decay = 0.0};
  expect_matches_reference(options, DType::f32, 2e-6);
  expect_matches_reference(options, DType::f64, 1e-12);
}

TEST(AdamW, FirstStepIsSignTimesLrAfterDecay) {
  // After one step m_hat = g and v_hat = g^2: p = p (1 - lr wd) - lr g / (|g| + eps).
  Tensor p = Tensor::from_vector<double>({1.0, -2.0, 0.5}, {3}).set_requires_grad(true);
  AdamW adamw({p}, {.lr = 0.1, .eps = 1e-8, .weight_decay = 0.5});
  p.set_grad(Tensor::from_vector<double>({3.0, -0.25, 0.0}, {3}));
  adamw.step();
  const auto v = p.to_vector<double>();
  EXPECT_NEAR(v[0], 1.0 * 0.95 - 0.1 * 3.0 / (3.0 + 1e-8), 1e-12);
  EXPECT_NEAR(v[1], -2.0 * 0.95 + 0.1 * 0.25 / (0.25 + 1e-8), 1e-12);
  EXPECT_NEAR(v[2], 0.5 * 0.95, 1e-12);
}

TEST(AdamW, StepCountIsPerParameter) {
  // b has a gradient only from the second optimizer step on: its bias correction starts
  // at step 1 then, as PyTorch's per-parameter state["step"].
  const AdamWOptions options{.lr = 0.01, .weight_decay = 0.0};
  Tensor a = random_f64({4}, 1).set_requires_grad(true);
  Tensor b = random_f64({4}, 2).set_requires_grad(true);
  std::vector<double> expected_b = b.to_vector<double>();
  AdamW adamw({a, b}, options);
  ReferenceAdamW reference(options);
  a.set_grad(random_f64({4}, 10));
  adamw.step();
  EXPECT_FALSE(adamw.state(1, 0).defined());
  for (int s = 0; s < 3; ++s) {
    const Tensor g = random_f64({4}, 20 + static_cast<uint64_t>(s));
    a.set_grad(g);
    b.set_grad(g);
    adamw.step();
    reference.step(expected_b, g.to_vector<double>());
  }
  EXPECT_EQ(adamw.state(0, 0).item(), 4);
  EXPECT_EQ(adamw.state(1, 0).item(), 3);
  EXPECT_EQ(adamw.step_count(), 4);
  testing::expect_all_close(b, expected_b, 1e-12, 1e-12);
}

TEST(AdamW, RejectsBadBetas) {
  Tensor p = Tensor::zeros({2}).set_requires_grad(true);
  EXPECT_THROW(AdamW({p}, {.beta1 = 1.0}), Error);
  EXPECT_THROW(AdamW({p}, {.beta2 = -0.1}), Error);
  EXPECT_THROW(AdamW({p}, {.eps = -1}), Error);
}

}  // namespace
}  // namespace lockstep::optim
