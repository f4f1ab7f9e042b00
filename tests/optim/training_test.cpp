// The pieces together: layers, initialize, cross-entropy, clipping, a schedule and each
// optimizer fit a small fixed batch (memorization), the smallest end-to-end check that the
// updates point downhill.
#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/nn/nn.h"
#include "lockstep/ops/loss.h"
#include "lockstep/optim/optim.h"
#include "testing/gradcheck.h"

namespace lockstep::optim {
namespace {

template <typename Opt, typename Options>
void expect_fits_batch(const Options& options) {
  const auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(64, 32), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(32, 10)});
  nn::initialize(*model, 3);
  const Tensor x = testing::random_f32({32, 1, 8, 8}, 21);
  std::vector<int64_t> labels(32);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 7) % 10);
  const Tensor y = Tensor::from_vector(labels, {32});
  Opt optimizer(model->parameters(), options);
  const Schedule schedule = parse_schedule("cosine:warmup=5,total=40");
  const double base_lr = optimizer.lr();
  double first = 0, last = 0;
  for (int64_t step = 0; step < 40; ++step) {
    optimizer.set_lr(schedule.lr_at(base_lr, step));
    optimizer.zero_grad();
    const Tensor loss = cross_entropy((*model)(x), y);
    loss.backward();
    clip_grad_norm(model->parameters(), 5.0);
    optimizer.step();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_NEAR(first, std::log(10.0), 0.5);  // a fresh model guesses uniformly
  EXPECT_LT(last, 0.2 * first);
}

TEST(Training, SGDFitsASmallBatch) { expect_fits_batch<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9}); }

TEST(Training, AdamWFitsASmallBatch) { expect_fits_batch<AdamW>(AdamWOptions{.lr = 2e-2}); }

}  // namespace
}  // namespace lockstep::optim
