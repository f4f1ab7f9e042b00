// Label smoothing in the shipped cross-entropy losses, against a float64 loop of PyTorch's
// definition (CrossEntropyLoss(label_smoothing=ε)): each sample's loss and its gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lockstep/nn/flatten.h"
#include "lockstep/ops/ops.h"
#include "lockstep/parallel/loss_function.h"

namespace lockstep::parallel {
namespace {

constexpr int64_t kSamples = 5, kClasses = 4;

std::vector<float> logit_values() {
  std::vector<float> x(kSamples * kClasses);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(1.7 * static_cast<double>(i) + 0.3) * 3.0);
  return x;
}

const std::vector<int64_t> kLabels = {2, 0, 3, 3, 1};

struct Reference {
  std::vector<double> loss;  // per sample
  std::vector<double> grad;  // of the sum of the losses, per logit
};

// loss_i = -(1 - ε) log p_i,y - (ε / C) Σ_c log p_i,c; d/dx_ic = p_ic - (1 - ε) [c = y] - ε / C.
Reference reference(const std::vector<float>& x, double eps) {
  Reference r;
  for (int64_t i = 0; i < kSamples; ++i) {
    double top = -INFINITY, total = 0;
    for (int64_t c = 0; c < kClasses; ++c) top = std::max(top, static_cast<double>(x[i * kClasses + c]));
    for (int64_t c = 0; c < kClasses; ++c) total += std::exp(x[i * kClasses + c] - top);
    const double log_total = top + std::log(total);
    double loss = 0;
    for (int64_t c = 0; c < kClasses; ++c) {
      const double log_p = x[i * kClasses + c] - log_total;
      const double wanted = (c == kLabels[i] ? 1.0 - eps : 0.0) + eps / kClasses;
      loss -= wanted * log_p;
      r.grad.push_back(std::exp(log_p) - wanted);
    }
    r.loss.push_back(loss);
  }
  return r;
}

void expect_matches(const LossFunction& loss_of, double eps) {
  const std::vector<float> values = logit_values();
  Tensor logits = Tensor::from_vector(values, {kSamples, kClasses});
  logits.set_requires_grad(true);
  const TensorBatch batch{{"input", logits}, {"target", Tensor::from_vector(kLabels, {kSamples})}};
  nn::Flatten identity;  // [n, C] passes through: the "model" returns the logits
  const Tensor losses = loss_of(identity, batch, StepContext{});
  ASSERT_EQ(losses.shape(), (Shape{kSamples}));
  sum(losses).backward();
  const Reference want = reference(values, eps);
  for (int64_t i = 0; i < kSamples; ++i) EXPECT_NEAR(losses.data<float>()[i], want.loss[i], 2e-6) << "sample " << i;
  for (size_t k = 0; k < want.grad.size(); ++k) EXPECT_NEAR(logits.grad().data<float>()[k], want.grad[k], 2e-6) << k;
}

TEST(LabelSmoothing, ClassificationLossIsPyTorchs) {
  for (const double eps : {0.0, 0.1, 0.35, 1.0}) {
    SCOPED_TRACE(eps);
    expect_matches(classification_loss("input", "target", eps), eps);
  }
}

TEST(LabelSmoothing, ThePipelinesOutputLossToo) {
  const OutputLoss output_loss = cross_entropy_loss_of("target", 0.1);
  expect_matches([&](nn::Module& model, const TensorBatch& batch,
                     const StepContext& context) { return output_loss(model(batch.at("input")), batch, context); },
                 0.1);
}

TEST(LabelSmoothing, OutsideZeroToOneIsRefusedByName) {
  for (const double eps : {-0.1, 1.5, std::nan("")}) {
    try {
      classification_loss("input", "target", eps);
      ADD_FAILURE() << eps << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("label_smoothing must lie in [0, 1]"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace lockstep::parallel
