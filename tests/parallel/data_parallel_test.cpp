// Single-process data parallelism: the same bits for every number of devices and every
// split between devices and micro-batches of one (seed, global batch, micro-batch); the
// same step as one device's plain full-batch step up to rounding; a clear error for
// layouts the tree cannot take.
#include "lockstep/parallel/data_parallel.h"

#include <gtest/gtest.h>

#include "lockstep/core/parallel.h"
#include "lockstep/nn/models.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/adamw.h"
#include "lockstep/optim/sgd.h"
#include "parallel/step_testing.h"

namespace lockstep::parallel {
namespace {

using namespace step_testing;

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& name, std::vector<Tensor> params) {
  if (name == "adamw") return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = 1e-3});
  return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

void run_steps(DataParallel& dp, int64_t batch, int first_step, int steps, std::vector<double>* losses = nullptr) {
  for (int s = first_step; s < first_step + steps; ++s) {
    const Data data = synthetic(batch, static_cast<uint64_t>(s));
    const StepResult result = train_step(dp, data, s * batch, static_cast<uint64_t>(s));
    if (losses) losses->push_back(result.loss);
  }
}

// Trains `steps` steps of a global batch on `devices` devices and returns device 0's weights.
std::vector<std::vector<float>> train(const std::string& model_name, int devices, int64_t batch, int64_t micro,
                                      int steps, std::vector<double>* losses = nullptr, int threads_per_device = 1,
                                      const std::string& optimizer = "sgd") {
  DataParallel dp(
      {.loss = classification(), .devices = devices, .micro_batch = micro, .threads_per_device = threads_per_device},
      [&](int) { return nn::make_model(model_name, kSeed); },
      [&](std::vector<Tensor> params) { return make_optimizer(optimizer, std::move(params)); });
  for (int s = 0; s < steps; ++s) {
    const Data data = synthetic(batch, static_cast<uint64_t>(s));
    const StepResult result = train_step(dp, data, s * batch, static_cast<uint64_t>(s));
    if (losses) losses->push_back(result.loss);
  }
  const auto first = weights(dp.replica(0));
  for (int d = 1; d < devices; ++d) EXPECT_EQ(weights(dp.replica(d)), first) << "replica " << d << " drifted";
  return first;
}

TEST(DataParallel, SameBitsOnOneTwoFourAndEightDevices) {
  std::vector<double> one_losses;
  const auto one = train("mlp", 1, 32, 4, 3, &one_losses);
  for (int devices : {2, 4, 8}) {
    std::vector<double> losses;
    EXPECT_TRUE(same_bits(train("mlp", devices, 32, 4, 3, &losses), one)) << devices << " devices";
    EXPECT_EQ(losses, one_losses) << devices << " devices";
  }
}

TEST(DataParallel, SameBitsWithAnyNumberOfThreadsPerDevice) {
  // One device with 2 or 3 threads against 2 devices with one each: the products are cut
  // by shape, never by team size (a batch of 4 once split by team size, with other bits).
  const auto two_devices = train("mlp", 2, 8, 4, 2);
  EXPECT_TRUE(same_bits(train("mlp", 1, 8, 4, 2, nullptr, 2), two_devices));
  EXPECT_TRUE(same_bits(train("mlp", 1, 8, 4, 2, nullptr, 3), two_devices));
  EXPECT_TRUE(same_bits(train("cnn", 1, 16, 8, 1, nullptr, 2), train("cnn", 2, 16, 8, 1)));
}

// Each CPU device steps its share of every parameter (the MLP's biases of 10 fall to
// device 0 whole): the weights are the bits of one device's run, for SGD with momentum and
// for AdamW (whose step counts are per parameter), on 2 and 4 devices.
TEST(DataParallel, ElementwiseOptimizersGiveTheSameBitsFromShares) {
  for (const std::string optimizer : {"sgd", "adamw"}) {
    const auto one = train("mlp", 1, 32, 4, 3, nullptr, 1, optimizer);
    EXPECT_TRUE(same_bits(train("mlp", 2, 32, 4, 3, nullptr, 1, optimizer), one)) << optimizer;
    EXPECT_TRUE(same_bits(train("mlp", 4, 32, 4, 3, nullptr, 1, optimizer), one)) << optimizer;
  }
}

// CPU devices keep one copy of the weights, on device 0: the other replicas' parameters
// are views of its bytes, on their own devices.
TEST(DataParallel, CpuReplicasShareOneCopyOfTheWeights) {
  DataParallel dp(
      {.loss = classification(), .devices = 3, .micro_batch = 4}, [](int) { return nn::make_model("cnn", kSeed); },
      [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = 0.1}); });
  const auto first = dp.replica(0).named_parameters();
  for (int d = 1; d < 3; ++d) {
    const auto params = dp.replica(d).named_parameters();
    ASSERT_EQ(params.size(), first.size());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].second.raw_data(), first[i].second.raw_data()) << d << " " << params[i].first;
      EXPECT_EQ(params[i].second.device(), dp.device(d)) << params[i].first;
    }
  }
}

// Each of 4 devices holds a quarter of the optimizer state, and the state gathered for a
// checkpoint is the one-device optimizer's, bit for bit; loaded into 2 devices it
// continues as the one-device run does.
TEST(DataParallel, EachDeviceHoldsAQuarterOfTheStateAndCheckpointsItWhole) {
  auto make = [](int devices) {
    return std::make_unique<DataParallel>(
        DataParallelOptions{.loss = classification(), .devices = devices, .micro_batch = 4},
        [](int) { return nn::make_model("mlp", kSeed); },
        [](std::vector<Tensor> params) { return make_optimizer("adamw", std::move(params)); });
  };
  auto plain = make(1);
  auto sharded = make(4);
  run_steps(*plain, 16, 0, 2);
  run_steps(*sharded, 16, 0, 2);
  const int64_t whole = plain->optimizer_state_bytes(0);
  // Two f32 moments per parameter, and a step count per tensor.
  EXPECT_NEAR(whole, 2 * 4 * nn::make_model("mlp", kSeed)->num_parameters(), 64);
  int64_t sum = 0;
  for (int d = 0; d < 4; ++d) {
    EXPECT_NEAR(sharded->optimizer_state_bytes(d), whole / 4.0, 128.0) << d;
    sum += sharded->optimizer_state_bytes(d);
  }
  EXPECT_NEAR(sum, whole, 3 * 6 * 8) << "each device counts its own steps";

  const NamedTensors want = plain->optimizer_state();
  const NamedTensors got = sharded->optimizer_state();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(got[i].second.shape(), want[i].second.shape()) << want[i].first;
    EXPECT_EQ(got[i].second.to_vector<double>(), want[i].second.to_vector<double>()) << want[i].first;
  }

  auto resumed = make(2);
  resumed->replica(0).load_state_dict(plain->replica(0).state_dict());
  resumed->load_optimizer_state(want);
  run_steps(*plain, 16, 2, 2);
  run_steps(*resumed, 16, 2, 2);
  EXPECT_TRUE(same_bits(weights(resumed->replica(1)), weights(plain->replica(0))));
}

// A state that does not fit the model is refused as the unsharded optimizer refuses it,
// naming the checkpoint's key, and no device's state changes.
TEST(DataParallel, AStateOfAnotherModelIsRefusedByItsOwnKeys) {
  DataParallel dp(
      {.loss = classification(), .devices = 2, .micro_batch = 4}, [](int) { return nn::make_model("mlp", kSeed); },
      [](std::vector<Tensor> params) { return make_optimizer("sgd", std::move(params)); });
  run_steps(dp, 8, 0, 1);
  const NamedTensors before = dp.optimizer_state();
  NamedTensors bad = before;
  for (auto& [key, tensor] : bad)
    if (key == "state.2.momentum_buffer") tensor = Tensor::zeros({3, 4});
  try {
    dp.load_optimizer_state(bad);
    FAIL() << "a mis-shaped momentum buffer was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("state.2.momentum_buffer: shape [3, 4]"), std::string::npos)
        << error.what();
  }
  const NamedTensors after = dp.optimizer_state();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_EQ(after[i].second.to_vector<double>(), before[i].second.to_vector<double>()) << after[i].first;
}

TEST(DataParallel, OddDeviceCountsWithPowerOfTwoShares) {
  // 12 micro-batches: 3 devices x 4, 6 x 2, 12 x 1 are all the same tree as 1 x 12.
  const auto one = train("mlp", 1, 48, 4, 2);
  for (int devices : {3, 6, 12}) EXPECT_TRUE(same_bits(train("mlp", devices, 48, 4, 2), one)) << devices;
}

TEST(DataParallel, TheMicroBatchIsPartOfTheAnswer) {
  // Different leaves make a different (equally valid) sum: the bits may differ, the values
  // hardly. This is why the micro-batch is part of what defines a run.
  const auto m4 = train("mlp", 1, 32, 4, 2);
  const auto m8 = train("mlp", 1, 32, 8, 2);
  for (size_t i = 0; i < m4.size(); ++i) {
    for (size_t j = 0; j < m4[i].size(); ++j) ASSERT_NEAR(m4[i][j], m8[i][j], 1e-4);
  }
}

TEST(DataParallel, CnnWithDropoutKeyedBySampleIsTheSameOnTwoDevices) {
  const auto one = train("cnn", 1, 16, 4, 2);
  EXPECT_TRUE(same_bits(train("cnn", 2, 16, 4, 2), one));
  EXPECT_TRUE(same_bits(train("cnn", 4, 16, 4, 2), one));
}

TEST(DataParallel, MatchesAPlainFullBatchStep) {
  // One device, one micro-batch of the whole batch: the ordinary mean-loss step, on one
  // thread like DataParallel's devices (and so no OpenMP team, which ThreadSanitizer cannot
  // see into).
  const int threads = num_threads();
  set_num_threads(1);
  auto model = nn::make_model("mlp", kSeed);
  optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  const Data data = synthetic(32, 0);
  model->set_forward_context({.seed = kSeed, .step = 0, .first_sample = 0});
  cross_entropy((*model)(data.images), data.labels).backward();
  sgd.step();
  set_num_threads(threads);
  const auto reference = weights(*model);
  const auto ours = train("mlp", 4, 32, 8, 1);
  for (size_t i = 0; i < ours.size(); ++i) {
    for (size_t j = 0; j < ours[i].size(); ++j) ASSERT_NEAR(ours[i][j], reference[i][j], 1e-6) << i << "/" << j;
  }
}

// The unused parameter's zero gradient goes through the tree (two micro-batches per
// device) and the all-reduce like any other: it stays as it was, the used one trains, and
// both devices agree.
TEST(DataParallel, UnusedParametersCountAsZero) {
  DataParallel dp(
      {.loss = classification(), .devices = 2, .micro_batch = 2},
      [](int) { return std::make_shared<WithUnusedParameter>(); },
      [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = 0.1}); });
  auto& model = dynamic_cast<WithUnusedParameter&>(dp.replica(0));
  const Weights unused = weights(*model.unused), used = weights(*model.used);
  run_steps(dp, 8, 0, 2);
  EXPECT_EQ(weights(*model.unused), unused);
  EXPECT_NE(weights(*model.used), used);
  EXPECT_EQ(weights(dp.replica(1)), weights(model));
}

TEST(DataParallel, ReportsWhereEachDevicesTimeWent) {
  DataParallel dp(
      {.loss = classification(), .devices = 2, .micro_batch = 4}, [](int) { return nn::make_model("mlp", kSeed); },
      [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = 0.1}); });
  const Data data = synthetic(16, 0);
  const StepResult result = train_step(dp, data, 0, 0);
  ASSERT_EQ(result.devices.size(), 2u);
  for (const DeviceTimes& t : result.devices) {
    EXPECT_GT(t.compute, 0);
    EXPECT_GE(t.wait, 0);
    EXPECT_GT(t.communicate, 0);
    EXPECT_GT(t.optimizer, 0);
  }
  EXPECT_GT(result.loss, 0);
}

TEST(DataParallel, AFailingDeviceNamesItsOwnErrorAndStopsTheOthers) {
  DataParallel dp(
      {.loss = classification(), .devices = 2, .micro_batch = 4}, [](int) { return nn::make_model("mlp", kSeed); },
      [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = 0.1}); });
  Data data = synthetic(8, 0);
  data.labels.data<int64_t>()[6] = 10;  // device 1's micro-batch: no class 10
  try {
    train_step(dp, data, 0, 0);
    FAIL() << "a bad label was accepted";
  } catch (const Error& error) {
    // The cause, not the abort it caused on device 0.
    EXPECT_NE(std::string(error.what()).find("10"), std::string::npos) << error.what();
    EXPECT_EQ(std::string(error.what()).find("abort"), std::string::npos) << error.what();
  }
}

TEST(DataParallel, LayoutsTheTreeCannotTakeAreExplained) {
  DataParallel dp(
      {.loss = classification(), .devices = 4, .micro_batch = 4}, [](int) { return nn::make_model("mlp", kSeed); },
      [](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = 0.1}); });
  const Data bad_share = synthetic(48, 0);  // 12 micro-batches: 3 per device, not a power of two
  try {
    train_step(dp, bad_share, 0, 0);
    FAIL() << "an uneven layout was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("12 micro-batches, which 4 devices cannot share"), std::string::npos)
        << error.what();
  }
  const Data ragged = synthetic(30, 0);
  EXPECT_THROW(train_step(dp, ragged, 0, 0), Error);
}

}  // namespace
}  // namespace lockstep::parallel
