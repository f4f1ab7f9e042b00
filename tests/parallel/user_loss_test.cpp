// Layouts train a user's own model and loss: a two-input regression model with an MSE loss
// (float targets), a contrastive-style loss written by hand, and a model with an unused
// parameter give the same bits on 1, 2 and 4 devices under DataParallel, DDP and ZeRO-1;
// the MSE step matches a plain full-batch step; a loss that returns a mean instead of one
// loss per sample is refused with an error that says what to return.
#include <gtest/gtest.h>

#include <mutex>

#include "lockstep/nn/init.h"
#include "lockstep/nn/linear.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/distributed_data_parallel.h"
#include "parallel/rank_threads.h"
#include "parallel/step_testing.h"

namespace lockstep::parallel {
namespace {

using namespace step_testing;
using rank_threads::run_ranks;

// y = head(relu(a(x1) + b(x2))): two inputs of different widths, two outputs.
class TwoInputRegression : public nn::Module {
 public:
  explicit TwoInputRegression(uint64_t seed) : nn::Module("TwoInputRegression") {
    a = register_module("a", std::make_shared<nn::Linear>(6, 16));
    b = register_module("b", std::make_shared<nn::Linear>(3, 16));
    head = register_module("head", std::make_shared<nn::Linear>(16, 2));
    unused = register_module("unused", std::make_shared<nn::Linear>(2, 2));
    nn::initialize(*this, seed);
  }
  Tensor predict(const Tensor& x1, const Tensor& x2) { return (*head)(relu((*a)(x1) + (*b)(x2))); }
  std::shared_ptr<nn::Linear> a, b, head, unused;
};

TensorBatch regression_batch(int64_t n, uint64_t step) { return two_input_batch(n, 2000 + step); }

// The user's loss: squared error per element, [n, 2], as mse_loss would give it.
Tensor regression_loss(nn::Module& model, const TensorBatch& batch, const StepContext&) {
  const Tensor prediction = static_cast<TwoInputRegression&>(model).predict(batch["x1"], batch["x2"]);
  return square(prediction - batch["y"]);
}

// A loss of another shape: each sample's squared error plus a hinge pulling its two outputs
// apart (an auxiliary term per sample), [n].
Tensor contrastive_loss(nn::Module& model, const TensorBatch& batch, const StepContext&) {
  const Tensor prediction = static_cast<TwoInputRegression&>(model).predict(batch["x1"], batch["x2"]);
  const Tensor error = sum(square(prediction - batch["y"]), {1});
  const Tensor gap = slice(prediction, 1, 0, 1) - slice(prediction, 1, 1, 2);
  return error + 0.1 * relu(-reshape(square(gap), {batch.size()}) + 1.0);
}

std::unique_ptr<optim::Optimizer> adamw(std::vector<Tensor> params) {
  return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
}

constexpr int64_t kBatch = 16, kMicro = 2;
constexpr int kSteps = 3;

Weights train_dp(int devices, const LossFunction& loss) {
  DataParallel dp(
      {.loss = loss, .devices = devices, .micro_batch = kMicro},
      [](int) { return std::make_shared<TwoInputRegression>(kSeed); }, adamw);
  for (int s = 0; s < kSteps; ++s)
    dp.step(regression_batch(kBatch, static_cast<uint64_t>(s)),
            {.seed = kSeed, .step = static_cast<uint64_t>(s), .first_sample = s * kBatch});
  return weights(dp.model());
}

std::vector<Weights> train_ddp(int ranks, const LossFunction& loss, int zero_stage) {
  std::vector<Weights> out(static_cast<size_t>(ranks));
  const auto errors = run_ranks(ranks, [&](int rank, std::shared_ptr<comm::Communicator> comm) {
    auto model = std::make_shared<TwoInputRegression>(kSeed + static_cast<uint64_t>(rank));
    DistributedDataParallel ddp(model, adamw, comm, {.loss = loss, .micro_batch = kMicro, .zero_stage = zero_stage});
    for (int s = 0; s < kSteps; ++s)
      ddp.step(regression_batch(kBatch, static_cast<uint64_t>(s)),
               {.seed = kSeed, .step = static_cast<uint64_t>(s), .first_sample = s * kBatch});
    out[static_cast<size_t>(rank)] = weights(*model);
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  return out;
}

TEST(DataParallelUserLoss, TwoInputMseModelHasTheSameBitsOnEveryLayout) {
  for (const auto& [name, loss] : {std::pair<const char*, LossFunction>{"mse", regression_loss},
                                   std::pair<const char*, LossFunction>{"contrastive", contrastive_loss}}) {
    const Weights one = train_dp(1, loss);
    TwoInputRegression initial(kSeed);
    const Weights start = weights(initial);
    EXPECT_FALSE(same_bits(one, start)) << name << ": training changed nothing";
    for (int devices : {2, 4}) EXPECT_TRUE(same_bits(train_dp(devices, loss), one)) << name << ", dp " << devices;
    for (int ranks : {1, 2, 4}) {
      for (int zero_stage : {0, 1, 2}) {
        const std::vector<Weights> ranks_weights = train_ddp(ranks, loss, zero_stage);
        for (int r = 0; r < ranks; ++r)
          EXPECT_TRUE(same_bits(ranks_weights[static_cast<size_t>(r)], one))
              << name << ", zero stage " << zero_stage << ", " << ranks << " ranks, rank " << r;
      }
    }
  }
}

TEST(DataParallelUserLoss, UnusedParameterStaysAsItWasOnEveryLayout) {
  const Weights start = weights(*TwoInputRegression(kSeed).unused);
  DataParallel dp(
      {.loss = regression_loss, .devices = 2, .micro_batch = kMicro},
      [](int) { return std::make_shared<TwoInputRegression>(kSeed); },
      [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = 0.1}); });
  dp.step(regression_batch(kBatch, 0), {.seed = kSeed, .step = 0, .first_sample = 0});
  EXPECT_EQ(weights(*static_cast<TwoInputRegression&>(dp.model()).unused), start);
}

// The library's mse_loss on one device in micro-batches is the plain step on the mean
// squared error of the whole batch (torch.nn.MSELoss's mean), up to rounding.
TEST(DataParallelUserLoss, MseLossStepMatchesAPlainFullBatchStep) {
  const int threads = num_threads();
  set_num_threads(1);
  auto plain = std::make_shared<nn::Linear>(6, 2);
  nn::initialize(*plain, kSeed);
  optim::SGD sgd(plain->parameters(), {.lr = 0.1});
  const TensorBatch batch = regression_batch(kBatch, 0);
  const Tensor loss = mean(square((*plain)(batch["x1"]) - batch["y"]));
  loss.backward();
  sgd.step();
  set_num_threads(threads);

  DataParallel dp(
      {.loss = mse_loss("x1", "y"), .devices = 2, .micro_batch = 4},
      [](int) {
        auto model = std::make_shared<nn::Linear>(6, 2);
        nn::initialize(*model, kSeed);
        return model;
      },
      [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = 0.1}); });
  const StepResult result = dp.step(batch, {.seed = kSeed, .step = 0, .first_sample = 0});
  EXPECT_NEAR(result.loss, loss.item(), 1e-6);
  const Weights reference = weights(*plain), ours = weights(dp.model());
  ASSERT_EQ(ours.size(), reference.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    for (size_t j = 0; j < ours[i].size(); ++j) ASSERT_NEAR(ours[i][j], reference[i][j], 1e-6) << i << "/" << j;
  }
}

// The loss function sees the micro-batch's context: the step, the seed, and the global index
// of its first sample, whichever device runs it.
TEST(DataParallelUserLoss, TheLossFunctionGetsEachMicroBatchsGlobalFirstSample) {
  std::mutex mutex;
  std::vector<int64_t> firsts;
  const LossFunction recording = [&](nn::Module& model, const TensorBatch& batch, const StepContext& context) {
    {
      const std::lock_guard lock(mutex);
      EXPECT_EQ(context.step, 5u);
      EXPECT_EQ(context.seed, kSeed);
      EXPECT_EQ(batch.size(), kMicro);
      firsts.push_back(context.first_sample);
    }
    return regression_loss(model, batch, context);
  };
  DataParallel dp(
      {.loss = recording, .devices = 4, .micro_batch = kMicro},
      [](int) { return std::make_shared<TwoInputRegression>(kSeed); }, adamw);
  dp.step(regression_batch(kBatch, 0), {.seed = kSeed, .step = 5, .first_sample = 100});
  std::sort(firsts.begin(), firsts.end());
  EXPECT_EQ(firsts, (std::vector<int64_t>{100, 102, 104, 106, 108, 110, 112, 114}));
}

std::string step_error(const LossFunction& loss) {
  try {
    DataParallel dp(
        {.loss = loss, .devices = 1, .micro_batch = kMicro},
        [](int) { return std::make_shared<TwoInputRegression>(kSeed); }, adamw);
    dp.step(regression_batch(4, 0), {.seed = kSeed, .step = 0, .first_sample = 0});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DataParallelUserLoss, AMeanOrSumInsteadOfPerSampleLossesIsRefused) {
  const std::string mean_error = step_error(
      [](nn::Module& m, const TensorBatch& b, const StepContext& c) { return mean(regression_loss(m, b, c)); });
  EXPECT_NE(mean_error.find("shape [] for a micro-batch of 2 samples"), std::string::npos) << mean_error;
  EXPECT_NE(mean_error.find("one loss per sample"), std::string::npos) << mean_error;
  const std::string rows_error = step_error([](nn::Module& m, const TensorBatch& b, const StepContext& c) {
    return reshape(regression_loss(m, b, c), {4});  // [2, 2] flattened: not one row per sample
  });
  EXPECT_NE(rows_error.find("shape [4] for a micro-batch of 2"), std::string::npos) << rows_error;
  const std::string detached_error = step_error(
      [](nn::Module& m, const TensorBatch& b, const StepContext& c) { return regression_loss(m, b, c).detach(); });
  EXPECT_NE(detached_error.find("do not depend on the model's parameters"), std::string::npos) << detached_error;
  const std::string no_loss = step_error(nullptr);
  EXPECT_NE(no_loss.find("DataParallel has no loss function"), std::string::npos) << no_loss;
}

TEST(DataParallelUserLoss, ShippedLossesCheckTheirShapes) {
  auto model = std::make_shared<nn::Linear>(6, 3);
  const TensorBatch batch = regression_batch(4, 0);
  const StepContext context;
  try {
    mse_loss("x1", "y")(*model, batch, context);  // [4, 3] predictions for [4, 2] targets
    ADD_FAILURE() << "mse_loss took mismatched shapes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mse_loss: the model gave [4, 3] for targets 'y' [4, 2]"), std::string::npos)
        << e.what();
  }
  try {
    classification_loss("x1", "missing")(*model, batch, context);
    ADD_FAILURE() << "classification_loss found a field that is not there";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no field 'missing'; its fields: 'x1', 'x2', 'y'"), std::string::npos)
        << e.what();
  }
  // Per target: classification [n], next token [n, T].
  const Tensor labels = Tensor::from_vector(std::vector<int64_t>{0, 2, 1, 1}, {4});
  const Tensor per_sample =
      classification_loss("x1", "label")(*model, {{"x1", batch["x1"]}, {"label", labels}}, context);
  EXPECT_EQ(per_sample.shape(), (Shape{4}));
  const Tensor expected = cross_entropy((*model)(batch["x1"]), labels, Reduction::none);
  EXPECT_EQ(per_sample.to_vector<float>(), expected.to_vector<float>());
}

}  // namespace
}  // namespace lockstep::parallel
